//! The Helm chart (deploy/helm/tollgate), linted and rendered by Helm itself: PyPI's
//! `helm-python-sdk` carries Helm v4 as a library (no helm binary), driven by
//! tests/helm/chart.py. The suite provisions it where the machine's Python lacks it
//! (tests/common/tools.rs: once, from PyPI, into a cache under target/); where it cannot be
//! had (no python3, no registry), these tests say SKIPPED and why, and fail with `CI=true`.
//!
//! - `helm lint --strict` is clean, for Kubernetes 1.29 (the chart's floor) too.
//! - The chart and the kustomize overlays do not drift: for the same settings they install
//!   the same objects, every field compared (the chart's defaults against
//!   deploy/overlays/self-managed; cert-manager with the background audit against
//!   deploy/overlays/audit; the monitoring objects against deploy/monitoring). Only the two
//!   labels Helm charts carry and kustomize has no reason to, `helm.sh/chart` and
//!   `app.kubernetes.io/managed-by`, are taken out before comparing; nothing else is
//!   normalised.
//! - Every object rendered, by the chart and by the overlays, holds to the Kubernetes API's
//!   schemas (tests/support/k8s_schema.rs).
//! - values.schema.json refuses a wrong value at install, naming it.
//! - Installed into the real kube-apiserver (tests/common/envtest.rs) by the SDK's
//!   `install` (tests/helm/install.py), its objects are stored, its CRDs (TollgatePolicy,
//!   TollgateProfile) served, and tollgate run with its ServiceAccount's token puts a
//!   TollgateProfile in force and finds its RBAC sufficient and no wider than the code needs.

use crate::common;
use crate::k8s_schema;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::Stdio;
use std::sync::OnceLock;

use serde_json::{json, Value};

pub(crate) const CHART: &str = "deploy/helm/tollgate";
const NAMESPACE: &str = "tollgate-system";

/// The cases rendered, by name, with their values.
fn cases() -> Vec<(&'static str, Value)> {
    let monitoring = json!({"serviceMonitor": {"enabled": true},
        "prometheusRule": {"enabled": true}, "dashboard": {"enabled": true}});
    vec![
        ("defaults", json!({})),
        ("self-managed", json!({"namespace": {"create": true}})),
        (
            "audit",
            json!({"namespace": {"create": true}, "certificates": {"mode": "cert-manager"},
                "audit": {"enabled": true, "installCRD": true}}),
        ),
        ("monitoring", json!({"monitoring": monitoring})),
        (
            "everything",
            json!({"namespace": {"create": true}, "audit": {"enabled": true},
                "monitoring": monitoring, "replicas": 3,
                "webhooks": {"failurePolicy": {"validate": "Ignore"},
                    "excludedNamespaces": ["kube-system", "gpu-operator"]},
                "certificates": {"selfManaged": {"caOverlap": "2h"}},
                "policy": {"validation": {"mode": "warn"}}}),
        ),
        ("wrong-replicas", json!({"replicas": "two"})),
        ("wrong-mode", json!({"certificates": {"mode": "vault"}})),
        (
            "wrong-failure-policy",
            json!({"webhooks": {"failurePolicy": {"mutate": "Open"}}}),
        ),
        ("misspelt", json!({"image": {"tgs": "1.0"}})),
        (
            "wrong-duration",
            json!({"certificates": {"selfManaged": {"certValidity": "a year"}}}),
        ),
    ]
}

/// Runs one of tests/helm/'s scripts with helm-python-sdk, `request` on its standard
/// input: its answer (None, said on stderr, where helm-python-sdk cannot be had).
fn run_py(script: &str, request: &Value) -> Option<Value> {
    let mut python = common::tools::python_with_helm()?;
    let mut child = python
        .arg(common::root().join(script))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{script} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        answer.get("missing").is_none(),
        "helm_python did not import: {}",
        answer["missing"]
    );
    Some(answer)
}

/// What tests/helm/chart.py answered, once per test binary; None: no helm-python-sdk to
/// be had (said on stderr).
fn helm() -> Option<&'static Value> {
    static ANSWER: OnceLock<Option<Value>> = OnceLock::new();
    let answer = ANSWER
        .get_or_init(|| {
            let request = json!({
                "chart": common::root().join(CHART),
                "lint": [{"namespace": NAMESPACE},
                    {"namespace": NAMESPACE, "kube_version": "v1.29.0"}],
                "cases": cases().into_iter().map(|(name, values)|
                    json!({"name": name, "values": values, "namespace": NAMESPACE}))
                    .collect::<Vec<_>>(),
            });
            run_py("tests/helm/chart.py", &request)
        })
        .as_ref();
    if answer.is_none() {
        // Each test that needs the chart says it was skipped (the first one already has).
        let _ = common::tools::python_with_helm();
    }
    answer
}

/// The chart's crds/ (the TollgatePolicy and TollgateProfile CRDs): Helm installs them as
/// they are, untemplated, before the templates, so they are read here, not rendered.
fn chart_crds() -> Vec<Value> {
    let dir = common::root().join(CHART).join("crds");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            serde_saphyr::from_multiple::<Value>(&text).unwrap()
        })
        .filter(|d| !d.is_null())
        .collect()
}

/// The objects a case installs: its rendered templates (NOTES aside) and the chart's
/// crds/; or its error.
fn rendered(case: &str) -> Result<Vec<Value>, String> {
    let answer = &helm().unwrap()["cases"][case];
    if let Some(e) = answer["error"].as_str() {
        return Err(e.to_owned());
    }
    let mut docs = vec![];
    let manifests: BTreeMap<String, String> =
        serde_json::from_value(answer["manifests"].clone()).unwrap();
    for (template, text) in manifests {
        if template.ends_with("NOTES.txt") {
            continue;
        }
        let parsed: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{template} is not YAML: {e}\n{text}"));
        docs.extend(parsed.into_iter().filter(|d| !d.is_null()));
    }
    docs.extend(chart_crds());
    Ok(docs)
}

fn notes(case: &str) -> String {
    helm().unwrap()["cases"][case]["manifests"]["tollgate/templates/NOTES.txt"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The objects by kind and name, with the two labels of Helm charts taken out.
fn by_key(docs: Vec<Value>) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for mut d in docs {
        // get_mut, not indexing: `d["metadata"]["labels"]` would add a null where none is.
        let labels = d
            .get_mut("metadata")
            .and_then(|m| m.get_mut("labels"))
            .and_then(Value::as_object_mut);
        if let Some(labels) = labels {
            labels.remove("helm.sh/chart");
            labels.remove("app.kubernetes.io/managed-by");
            if labels.is_empty() {
                d["metadata"].as_object_mut().unwrap().remove("labels");
            }
        }
        let key = format!(
            "{}/{}",
            d["kind"].as_str().unwrap(),
            d["metadata"]["name"].as_str().unwrap()
        );
        assert!(out.insert(key.clone(), d).is_none(), "{key} twice");
    }
    out
}

fn kustomize(dir: &str) -> Option<Vec<Value>> {
    common::rbac::render_if_kubectl(dir)
}

/// Every object alike, field for field; on a difference, the paths that differ.
fn assert_same(chart: BTreeMap<String, Value>, kustomize: BTreeMap<String, Value>, what: &str) {
    let c: Vec<&String> = chart.keys().collect();
    let k: Vec<&String> = kustomize.keys().collect();
    assert_eq!(
        c, k,
        "{what}: the chart and kustomize install other objects"
    );
    for (key, want) in &kustomize {
        let got = &chart[key];
        if got != want {
            let mut diffs = vec![];
            diff(want, got, key, &mut diffs);
            panic!(
                "{what}: {key} differs (kustomize, then the chart):\n{}",
                diffs.join("\n")
            );
        }
    }
}

fn diff(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                match (x.get(k), y.get(k)) {
                    (Some(v), Some(w)) => diff(v, w, &format!("{path}.{k}"), out),
                    (v, w) => out.push(format!("  {path}.{k}: {v:?} / {w:?}")),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                diff(v, w, &format!("{path}[{i}]"), out);
            }
        }
        _ if a == b => {}
        _ => out.push(format!("  {path}: {a} / {b}")),
    }
}

#[test]
fn the_chart_lints_clean() {
    let Some(answer) = helm() else { return };
    let lints = answer["lint"].as_array().unwrap();
    assert_eq!(lints.len(), 2);
    for lint in lints {
        assert_eq!(lint["total_charts_linted"], 1);
        assert_eq!(lint["errors"], json!([]), "{lint:#}");
        assert_eq!(lint["messages"], json!([]), "not even an info: {lint:#}");
    }
    assert_eq!(answer["metadata"]["kubeVersion"], ">=1.29.0-0");
    assert_eq!(answer["metadata"]["apiVersion"], "v2");
    eprintln!("tests/helm.rs: helm-python-sdk {}", answer["sdk"]);
}

#[test]
fn the_charts_defaults_install_what_the_self_managed_overlay_installs() {
    let Some(_) = helm() else { return };
    let Some(k) = kustomize("deploy/overlays/self-managed") else {
        return;
    };
    assert_same(
        by_key(rendered("self-managed").unwrap()),
        by_key(k),
        "defaults (with namespace.create)",
    );
    // Without namespace.create, the same less the Namespace (`helm install
    // --create-namespace`; the NOTES say how to label it).
    let defaults = by_key(rendered("defaults").unwrap());
    let mut with = by_key(rendered("self-managed").unwrap());
    with.remove("Namespace/tollgate-system");
    assert_eq!(defaults, with);
    let notes = notes("defaults");
    assert!(
        notes.contains("kubectl label namespace NAMESPACE tollgate.dev/enforce=enabled"),
        "{notes}"
    );
    assert!(
        notes.contains(
            "kubectl label namespace tollgate-system pod-security.kubernetes.io/enforce=restricted"
        ),
        "{notes}"
    );
}

#[test]
fn cert_manager_with_the_audit_installs_what_the_audit_overlay_installs() {
    let Some(_) = helm() else { return };
    let Some(k) = kustomize("deploy/overlays/audit") else {
        return;
    };
    assert_same(
        by_key(rendered("audit").unwrap()),
        by_key(k),
        "cert-manager and the audit",
    );
    assert!(notes("audit").contains("kubectl get policyreports -A"));
}

#[test]
fn the_monitoring_objects_are_deploy_monitorings() {
    let Some(_) = helm() else { return };
    let Some(k) = kustomize("deploy/monitoring") else {
        return;
    };
    let chart: BTreeMap<String, Value> = by_key(rendered("monitoring").unwrap())
        .into_iter()
        .filter(|(key, _)| {
            key.starts_with("ServiceMonitor/")
                || key.starts_with("PrometheusRule/")
                || key == "ConfigMap/tollgate-dashboard"
        })
        .collect();
    assert_same(chart, by_key(k), "monitoring");
}

#[test]
fn values_change_what_they_name_and_nothing_else() {
    let Some(_) = helm() else { return };
    let base = by_key(rendered("self-managed").unwrap());
    let all = by_key(rendered("everything").unwrap());
    assert_eq!(all["Deployment/tollgate"]["spec"]["replicas"], 3);
    let args: Vec<&str> = all["Deployment/tollgate"]["spec"]["template"]["spec"]["containers"][0]
        ["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let tail = args.join(" ");
    assert!(
        tail.contains("--certs self-managed --ca-overlap 2h"),
        "{tail}"
    );
    assert!(
        tail.contains("--audit-interval 10m --audit-exclude-namespace kube-system --audit-exclude-namespace gpu-operator --audit-exclude-namespace tollgate-system"),
        "{tail}"
    );
    let v = &all["ValidatingWebhookConfiguration/tollgate"]["webhooks"][0];
    assert_eq!(v["failurePolicy"], "Ignore");
    assert_eq!(
        v["namespaceSelector"]["matchExpressions"][0]["values"],
        json!(["kube-system", "gpu-operator", "tollgate-system"])
    );
    assert_eq!(
        all["MutatingWebhookConfiguration/tollgate"]["webhooks"][0]["failurePolicy"],
        "Fail"
    );
    // The inline policy is the ConfigMap's file, and one tollgate loads.
    let text = all["ConfigMap/tollgate-policy"]["data"]["default.yaml"]
        .as_str()
        .unwrap();
    let policy = tollgate_core::Policy::from_text("values.policy", text).unwrap();
    assert_eq!(
        format!("{:?}", policy.validation.mode).to_lowercase(),
        "warn"
    );
    // The webhooks' rules are the base's whatever the values.
    assert_eq!(
        v["rules"],
        base["ValidatingWebhookConfiguration/tollgate"]["webhooks"][0]["rules"]
    );
}

#[test]
fn a_wrong_value_fails_at_install_with_its_name() {
    let Some(_) = helm() else { return };
    for (case, names) in [
        ("wrong-replicas", "/replicas"),
        ("wrong-mode", "/certificates/mode"),
        ("wrong-failure-policy", "/webhooks/failurePolicy/mutate"),
        ("misspelt", "tgs"),
        ("wrong-duration", "/certificates/selfManaged/certValidity"),
    ] {
        let e = rendered(case).expect_err(case);
        assert!(e.contains(names), "{case}: {e}");
    }
}

/// Every object of the chart (all its cases) and of the overlays holds to the Kubernetes
/// API's schemas; only cert-manager's and the Prometheus Operator's kinds go unchecked.
#[test]
fn every_rendered_object_holds_to_the_kubernetes_schemas() {
    let schemas = k8s_schema::Schemas::load();
    let mut sets: Vec<(String, Vec<Value>)> = vec![];
    if helm().is_some() {
        for (case, _) in cases() {
            if let Ok(docs) = rendered(case) {
                sets.push((format!("chart {case}"), docs));
            }
        }
    }
    for dir in [
        "deploy/overlays/self-managed",
        "deploy/overlays/cert-manager",
        "deploy/overlays/audit",
        "deploy/overlays/native-validation",
        "deploy/overlays/two-teams",
        "deploy/monitoring",
    ] {
        if let Some(docs) = kustomize(dir) {
            sets.push((dir.to_owned(), docs));
        }
    }
    let mut unchecked = std::collections::BTreeSet::new();
    let mut checked = 0;
    for (what, docs) in &sets {
        for d in docs {
            match schemas.check(d) {
                Ok(k8s_schema::Checked::Unchecked(kind)) => {
                    unchecked.insert(kind);
                }
                Ok(_) => checked += 1,
                Err(errors) => panic!(
                    "{what}: {} {} breaks the schema:\n{}",
                    d["kind"],
                    d["metadata"]["name"],
                    errors.join("\n")
                ),
            }
        }
    }
    for kind in &unchecked {
        assert!(
            kind.starts_with("cert-manager.io/") || kind.starts_with("monitoring.coreos.com/"),
            "no schema checks {kind}"
        );
    }
    if !sets.is_empty() {
        assert!(checked > 50, "{checked} objects checked");
    }
}

/// The checks themselves: they catch what the apiserver would refuse.
#[test]
fn the_schema_checks_refuse_what_the_apiserver_refuses() {
    let schemas = k8s_schema::Schemas::load();
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"a": "b"}},
            "template": {"spec": {"containers": [{"name": "c", "image": "i",
                "ports": [{"containerPort": 8443}]}]}}}});
    assert_eq!(schemas.check(&deployment), Ok(k8s_schema::Checked::OpenApi));
    let mut typo = deployment.clone();
    typo["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = json!("Always");
    let e = schemas.check(&typo).unwrap_err();
    assert!(e[0].contains("imagePullPolcy: unknown field"), "{e:?}");
    let mut wrong = deployment.clone();
    wrong["spec"]["replicas"] = json!("2");
    assert!(schemas.check(&wrong).is_err());
    let mut missing = deployment.clone();
    missing["spec"].as_object_mut().unwrap().remove("selector");
    assert!(schemas.check(&missing).unwrap_err()[0].contains("selector: required"));
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "r"}, "rules": [{"apiGroups": [""], "resources": ["secrets"],
        "verbs": ["get"], "resourceName": ["x"]}]});
    assert!(schemas.check(&role).unwrap_err()[0].contains("resourceName: unknown field"));
}

#[test]
fn the_charts_copies_are_the_originals() {
    // No Helm needed. A chart reads no file outside its directory, so these are copies;
    // this keeps them honest.
    for (copy, original) in [
        ("files/policy.yaml", "policies/default.yaml"),
        (
            "files/prometheusrule.yaml",
            "deploy/monitoring/prometheusrule.yaml",
        ),
        (
            "files/dashboard.json",
            "deploy/monitoring/dashboards/tollgate.json",
        ),
        (
            "files/policyreports-crd.yaml",
            "deploy/components/policy-reports/crd/wgpolicyk8s.io_policyreports.yaml",
        ),
    ] {
        let a = std::fs::read(common::root().join(CHART).join(copy)).unwrap();
        let b = std::fs::read(common::root().join(original)).unwrap();
        assert!(
            a == b,
            "{CHART}/{copy} differs from {original}; run\n  cp {original} {CHART}/{copy}"
        );
    }
}

/// A rendered container's arguments, the value after each of `flags` replaced (the
/// policy's path, the addresses: what a test runs the Deployment's command with).
pub(crate) fn container_args<const N: usize>(
    container: &Value,
    flags: [(&str, String); N],
) -> Vec<String> {
    let mut args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    for (flag, value) in flags {
        let i = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("{flag} in {args:?}"));
        args[i + 1] = value;
    }
    args
}

/// Runs tests/helm/install.py with `request`: its answer.
pub(crate) fn install_py(request: Value) -> Option<Value> {
    run_py("tests/helm/install.py", &request)
}

/// What the chart's ServiceAccount may do with the audit on and self-managed
/// certificates: the audit's and the cluster context's (deploy.rs's list), and the
/// certificates' Secret and Lease by name in its own namespace (`create` unnamed: the
/// object does not exist yet), the two webhook configurations by name.
fn chart_needs(home: bool) -> std::collections::BTreeSet<String> {
    let mut out = crate::deploy::audit_needs(home);
    for v in ["get", "list", "watch", "update"] {
        for kind in [
            "mutatingwebhookconfigurations",
            "validatingwebhookconfigurations",
        ] {
            out.insert(format!("{v} admissionregistration.k8s.io/{kind}/tollgate"));
        }
        if home {
            out.insert(format!("{v} /secrets/tollgate-tls"));
        }
    }
    if home {
        out.extend(
            [
                "create /secrets",
                "get coordination.k8s.io/leases/tollgate-certs",
                "update coordination.k8s.io/leases/tollgate-certs",
            ]
            .map(str::to_owned),
        );
    }
    out
}

/// Waits (up to a minute) until no object has a cluster-wide name the chart gives its own.
async fn taken_names_gone(admin: &kube::Client) {
    use k8s_openapi::api::admissionregistration::v1 as adm;
    use k8s_openapi::api::rbac::v1 as rbac;
    let started = std::time::Instant::now();
    loop {
        let mut taken = vec![];
        let c = admin.clone();
        if kube::Api::<adm::MutatingWebhookConfiguration>::all(c.clone())
            .get_opt("tollgate")
            .await
            .unwrap()
            .is_some()
        {
            taken.push("MutatingWebhookConfiguration tollgate".to_owned());
        }
        if kube::Api::<adm::ValidatingWebhookConfiguration>::all(c.clone())
            .get_opt("tollgate")
            .await
            .unwrap()
            .is_some()
        {
            taken.push("ValidatingWebhookConfiguration tollgate".to_owned());
        }
        for name in [
            "tollgate-cluster-context",
            "tollgate-certs",
            "tollgate-audit",
            "tollgate-policy-objects",
            "tollgate-profile-editor",
            "tollgate-policy-viewer",
        ] {
            if kube::Api::<rbac::ClusterRole>::all(c.clone())
                .get_opt(name)
                .await
                .unwrap()
                .is_some()
            {
                taken.push(format!("ClusterRole {name}"));
            }
            if kube::Api::<rbac::ClusterRoleBinding>::all(c.clone())
                .get_opt(name)
                .await
                .unwrap()
                .is_some()
            {
                taken.push(format!("ClusterRoleBinding {name}"));
            }
        }
        // In kube-system, the Role for the Cluster Autoscaler's status ConfigMap.
        let status = "tollgate-cluster-autoscaler-status";
        if kube::Api::<rbac::Role>::namespaced(c.clone(), "kube-system")
            .get_opt(status)
            .await
            .unwrap()
            .is_some()
        {
            taken.push(format!("Role kube-system/{status}"));
        }
        if kube::Api::<rbac::RoleBinding>::namespaced(c.clone(), "kube-system")
            .get_opt(status)
            .await
            .unwrap()
            .is_some()
        {
            taken.push(format!("RoleBinding kube-system/{status}"));
        }
        if taken.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "another test keeps the chart's cluster-wide names: {taken:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The chart installed into the real apiserver by helm-python-sdk's `install`
/// (`Config.install`, Helm v4), its webhooks scoped to a namespace label no namespace has
/// and failing open (the apiserver is shared with every other test, and nothing serves
/// the chart's Service here), the background audit on and self-managed certificates (the
/// defaults). Helm stores every object it rendered; `tollgate serve`, run with the
/// installed Deployment's own arguments and policy and a token of the installed
/// ServiceAccount (TokenRequest), makes its certificate Secret, sets both webhook
/// configurations' caBundle and writes a PolicyReport with no request forbidden; and the
/// apiserver grants that account exactly [`chart_needs`], no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installed_runs_tollgate_with_its_rbac_sufficient_and_no_wider() {
    use common::identity;
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    if common::tools::python_with_helm().is_none() {
        return;
    }
    let _names = identity::shipped_names().await;
    let _audit = identity::background_audit().await;
    if identity::crds(
        cp,
        "deploy/components/policy-reports/crd/wgpolicyk8s.io_policyreports.yaml",
    )
    .await
    .is_none()
    {
        return;
    }
    let admin = cp.client("admin").await;
    // The chart's cluster-wide objects have fixed names, one each per apiserver: another
    // test's objects of those names (a registration of deploy/base's webhook
    // configurations, say) are waited out, not taken over.
    taken_names_gone(&admin).await;
    let ns = cp.namespace("helm-install", &[]).await;
    let ml = cp.namespace("helm-install-ml", &[]).await;
    identity::create(
        &admin,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nb", "namespace": ml},
            "spec": {"containers": [{"name": "j", "image": "j"}]}}),
    )
    .await;
    // The other tests' namespaces, as they are now: the audit's account may read and
    // write them all, so the chart's own value leaves them out.
    let others = identity::other_namespaces(&admin, &[&ns, &ml]).await;
    let enforce = format!("chart-test.tollgate.dev/enforce-{}", std::process::id());
    let values = json!({
        "replicas": 1,
        "audit": {"enabled": true, "interval": "1s", "excludeNamespaces": others},
        "webhooks": {"enforceLabel": {"key": enforce, "value": "only-in-this-test"},
                     "failurePolicy": {"mutate": "Ignore", "validate": "Ignore"}},
    });
    let release = "tollgate";
    let request = |action: &str| {
        json!({"action": action, "chart": common::root().join(CHART),
            "kubeconfig": cp.kubeconfig("admin"), "release": release,
            "namespace": ns, "values": values})
    };
    let answer = {
        let r = request("install");
        tokio::task::spawn_blocking(move || install_py(r))
            .await
            .unwrap()
            .unwrap()
    };
    assert!(
        answer.get("error").is_none(),
        "helm install: {}",
        answer["error"]
    );
    // The chart's crds/: installed by Helm before the templates (or there already, from
    // an earlier install on this apiserver: Helm leaves those be), and served.
    for crd in chart_crds() {
        identity::established(cp, crd["metadata"]["name"].as_str().unwrap()).await;
    }
    let manifest: Vec<Value> =
        serde_saphyr::from_multiple(answer["manifest"].as_str().unwrap()).unwrap();
    let manifest: Vec<Value> = manifest.into_iter().filter(|d| !d.is_null()).collect();
    assert!(manifest.len() >= 10, "{manifest:#?}");

    // Stored, every object; the webhooks as scoped.
    let mut stored = BTreeMap::new();
    for d in &manifest {
        let (group, version) = match d["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", d["apiVersion"].as_str().unwrap()),
        };
        let gvk = kube::api::GroupVersionKind::gvk(group, version, d["kind"].as_str().unwrap());
        let (ar, caps) = kube::discovery::pinned_kind(&admin, &gvk).await.unwrap();
        let api: kube::Api<kube::api::DynamicObject> = match caps.scope {
            // The release's namespace, or the object's own (kube-system's Role).
            kube::discovery::Scope::Namespaced => kube::Api::namespaced_with(
                admin.clone(),
                d["metadata"]["namespace"].as_str().unwrap_or(&ns),
                &ar,
            ),
            kube::discovery::Scope::Cluster => kube::Api::all_with(admin.clone(), &ar),
        };
        let name = d["metadata"]["name"].as_str().unwrap();
        let got = api
            .get_opt(name)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{} {name} was not stored", d["kind"]));
        stored.insert(
            format!("{}/{name}", d["kind"].as_str().unwrap()),
            serde_json::to_value(got).unwrap(),
        );
    }
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let w = &stored[&format!("{kind}/tollgate")]["webhooks"][0];
        assert_eq!(
            w["namespaceSelector"]["matchLabels"],
            json!({enforce.clone(): "only-in-this-test"}),
            "{kind}"
        );
        assert_eq!(w["failurePolicy"], "Ignore", "{kind}");
    }

    // tollgate serve as the Deployment runs it, with the account's token.
    let kubeconfig = identity::service_account(cp, &ns, "tollgate").await;
    let nobody = identity::service_account(cp, &ns, "bound-to-nothing").await;
    let deployment = &stored["Deployment/tollgate"]["spec"]["template"]["spec"];
    let container = &deployment["containers"][0];
    let dir = tempfile::tempdir().unwrap();
    let policy_map = deployment["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| v["configMap"]["name"].as_str())
        .expect("the policy's ConfigMap");
    let policy = &stored[&format!("ConfigMap/{policy_map}")]["data"];
    let policy_file = dir.path().join("default.yaml");
    std::fs::write(&policy_file, policy["default.yaml"].as_str().unwrap()).unwrap();
    let mut args = container_args(
        container,
        [
            ("--policy", policy_file.display().to_string()),
            ("--listen", "127.0.0.1:0".to_owned()),
            ("--metrics-listen", "127.0.0.1:0".to_owned()),
        ],
    );
    args.extend(["--kubeconfig".to_owned(), kubeconfig.display().to_string()]);
    // A TollgateProfile for the installed tollgate to put in force, and its status Ready
    // (written by whichever server holds its namespace's status Lease first: other tests'
    // servers on this apiserver watch the kind too; that the account may write it is the
    // RBAC comparison below).
    let profile = json!({"apiVersion": "tollgate.dev/v1alpha1", "kind": "TollgateProfile",
        "metadata": {"name": "default", "namespace": ml},
        "spec": {"mutation": {"defaultResources": {"perGpu": {"memory": "96Gi"}}}}});
    identity::create(&admin, profile).await;
    let profiles = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        admin.clone(),
        &ml,
        &kube::api::ApiResource {
            group: "tollgate.dev".into(),
            version: "v1alpha1".into(),
            api_version: "tollgate.dev/v1alpha1".into(),
            kind: "TollgateProfile".into(),
            plural: "tollgateprofiles".into(),
        },
    );
    let log = dir.path().join("serve.log");
    let mut child = common::bin::command()
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let ar = |group: &str, version: &str, kind: &str, plural: &str| kube::api::ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    };
    let reports = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        admin.clone(),
        &ml,
        &ar(
            "wgpolicyk8s.io",
            "v1alpha2",
            "PolicyReport",
            "policyreports",
        ),
    );
    let secrets = kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), &ns);
    let webhooks = kube::Api::<
        k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
    >::all(admin.clone());
    let started = std::time::Instant::now();
    loop {
        let report = reports.get_opt("tollgate").await.unwrap().is_some();
        let secret = secrets.get_opt("tollgate-tls").await.unwrap().is_some();
        let bundle = webhooks.get("tollgate").await.unwrap().webhooks.unwrap()[0]
            .client_config
            .ca_bundle
            .is_some();
        let in_force = profiles.get("default").await.unwrap().data["status"]["conditions"]
            .as_array()
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        if report && secret && bundle && in_force {
            break;
        }
        if started.elapsed() > std::time::Duration::from_secs(30) {
            let _ = child.kill();
            panic!(
                "report {report}, Secret {secret}, caBundle {bundle}, profile in force {in_force}:\n{}",
                std::fs::read_to_string(&log).unwrap()
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    let forbidden = identity::refusals(&text);
    assert!(forbidden.is_empty(), "{forbidden:#?}");

    assert_eq!(
        identity::granted(cp, &kubeconfig, &nobody, &ns).await,
        chart_needs(true)
    );
    assert_eq!(
        identity::granted(cp, &kubeconfig, &nobody, &ml).await,
        chart_needs(false)
    );

    let r = request("uninstall");
    let answer = tokio::task::spawn_blocking(move || install_py(r))
        .await
        .unwrap()
        .unwrap();
    assert!(
        answer.get("error").is_none(),
        "helm uninstall: {}",
        answer["error"]
    );
}

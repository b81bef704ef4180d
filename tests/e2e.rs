//! End to end: `tollgate serve` (the binary) registered with the real kube-apiserver
//! (tests/common/envtest.rs) through deploy/base's own webhook configurations, and the
//! goldens' pods and workloads applied with `kubectl`, as their users: what the apiserver
//! stores, the warnings kubectl prints and the refusals it reports are what
//! `tollgate review` predicts for the same file.
//!
//! - **The registration as shipped**: `kubectl kustomize deploy/base`'s
//!   MutatingWebhookConfiguration and ValidatingWebhookConfiguration, each webhook's
//!   `clientConfig.service` replaced by `url: https://127.0.0.1:PORT/<its path>` with the
//!   test CA as its caBundle, renamed per server, and its namespaceSelector narrowed by one
//!   more label to the namespaces of this test (the apiserver is shared by every test of
//!   the binary; the policy objects' webhook, which has none, by an objectSelector);
//!   everything else (rules, failurePolicy, reinvocation, timeouts) as shipped.
//! - **One server per policy of the goldens** (the shipped one and each case's
//!   `policy.yaml`), all started at once, with the cluster context on. Its identity may
//!   read what the shipped ClusterRole grants but the cluster-wide objects other tests
//!   create in the shared apiserver (Nodes, DeviceClasses, Kueue's ClusterQueues): the
//!   apiserver's RBAC keeps them out of its sight (feasibility then says nothing of them,
//!   as `tollgate review` says nothing of what its input lacks).
//! - **Each case in a namespace of its own** (named after the golden's, so that namespace
//!   globs still match; with the labels of its `context.yaml` Namespace), with its claims
//!   and claim templates applied first, then its object by `kubectl apply` (`create` for a
//!   `generateName` pod) as the case's user (impersonated, with its groups).
//! - **Compared with the prediction**: `tollgate review FILE --namespace NS --user U
//!   --group G... --namespace-labels ...` on the same file (with its context). Allowed or
//!   refused alike; the warnings, line by line; a refusal's message inside kubectl's error;
//!   and the object stored equal to the object the review says tollgate makes, as the
//!   apiserver stores that (created with `dryRun=All` in a namespace no webhook sees, so
//!   that both get the apiserver's own defaulting), but for what the apiserver makes
//!   anew per object (uid, name of a generateName object, timestamps, managedFields), and
//!   the order of tolerations (the apiserver's own come before tollgate's when the webhook
//!   runs, after them when the prediction is admitted). A validating webhook sees the name
//!   the apiserver generated, which the review writes `NAME-*`: put back so in kubectl's
//!   output before comparing.
//! - **Known not creatable**: goldens whose object the apiserver refuses whatever the
//!   webhooks say ([`NOT_CREATABLE`]): only their warnings are compared.
//! - **The operators' kinds** (PyTorchJob, JAXJob, PaddleJob, MPIJob, RayService, and an Argo
//!   Workflow that the shipped registration does not send to tollgate) on CRDs installed by
//!   the test that check nothing ([`CUSTOM`]).
//! - **ResourceQuotas** of a case's context are created with the status the quota
//!   controller (which does not run here) would give them, so that the apiserver's own
//!   quota admission judges the same pods as tollgate's feasibility; a case with one is
//!   applied once server dry runs show both have seen it (tollgate never GETs a quota).
//!
//! - **UPDATEs** of workloads: the golden's old object applied before the namespace is
//!   labelled for the webhooks (as one that predates tollgate), then the new one as the
//!   case's user; predicted by `tollgate review` of the AdmissionReview the apiserver will
//!   send (the golden's, with the object stored and the user's identity).
//!
//! Not here: UPDATEs of pods (the shipped rules send tollgate only their creates), cases whose context is Nodes,
//! DeviceClasses or Kueue's queues (cluster-wide objects of a shared apiserver), and
//! Kubeflow Trainer's TrainJobs (see [`CUSTOM`]).

use crate::common;
use crate::common::apiserver;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{Patch, PatchParams};
use serde_json::{json, Value};

/// What the apiserver serves without an operator's CRD.
const BUILT_IN: &[&str] = &["v1", "batch/v1", "apps/v1"];
/// The operators' kinds of the goldens, served here by CRDs that check nothing (a
/// structural schema that keeps every field): the apiserver stores them as sent, the
/// webhooks judge them. (apiVersion, kind, plural.) Not Kubeflow Trainer's TrainJob and
/// runtimes, nor Kueue's queues: whether the shared apiserver serves those is what other
/// tests of the cluster context try (tests/trainjob_context.rs), and a CRD is cluster-wide.
const CUSTOM: &[(&str, &str, &str)] = &[
    ("kubeflow.org/v1", "PyTorchJob", "pytorchjobs"),
    ("kubeflow.org/v1", "JAXJob", "jaxjobs"),
    ("kubeflow.org/v1", "PaddleJob", "paddlejobs"),
    ("kubeflow.org/v2beta1", "MPIJob", "mpijobs"),
    ("ray.io/v1", "RayService", "rayservices"),
    ("argoproj.io/v1alpha1", "Workflow", "workflows"),
];
/// The context a case may have here: namespaced objects, or the namespace's own labels.
const CONTEXT_KINDS: &[&str] = &[
    "ResourceClaim",
    "ResourceClaimTemplate",
    "Namespace",
    "ResourceQuota",
];

/// Goldens whose object no apiserver creates, whatever the webhooks say: what it refuses
/// them for. Their warnings are still compared (the mutating webhook runs before the
/// apiserver validates); the rest cannot be. (tests/accepted.rs passes them over too:
/// tollgate's output is refused for the same cause as its input.)
const NOT_CREATABLE: &[(&str, &str)] = &[
    (
        "mutate-json-pointer-escaping",
        "metadata.annotations: Invalid value: \"example.com/a~b\"",
    ),
    (
        "validate-ephemeral-containers-excluded",
        "spec.ephemeralContainers: Forbidden: cannot be set on create",
    ),
];

struct Case {
    name: String,
    /// The object as the case sends it (a review's object, or the pod or workload file).
    object: Value,
    /// Claims and claim templates, and the Namespaces whose labels the case relies on.
    context: Vec<Value>,
    /// Index into the policies.
    policy: usize,
    user: String,
    groups: Vec<String>,
    /// The golden's namespace, the prefix of ours.
    namespace: String,
    /// For an UPDATE: the review the golden holds (its `oldObject` is what is there
    /// before).
    update: Option<Value>,
}

/// The goldens this test can apply (see the module's docs), and the distinct policies
/// they use (None: the shipped one).
fn cases() -> (Vec<Case>, Vec<Option<PathBuf>>) {
    let mut policies: Vec<Option<PathBuf>> = vec![None];
    let mut texts: Vec<String> = vec![String::new()];
    let mut cases = vec![];
    for case in common::golden::cases() {
        let update = match case.request() {
            // Pods are only reviewed on CREATE (the shipped rules).
            Some(r) if r["operation"] == "UPDATE" && r["kind"]["kind"] != "Pod" => Some(r.clone()),
            Some(r) if r["operation"] != "CREATE" => continue,
            _ => None,
        };
        let object = case.object().clone();
        if !BUILT_IN.contains(&object["apiVersion"].as_str().unwrap_or(""))
            && custom(&object).is_none()
        {
            continue;
        }
        let context = case.context();
        if context
            .iter()
            .any(|d| !CONTEXT_KINDS.contains(&d["kind"].as_str().unwrap_or("")))
        {
            continue;
        }
        let policy_text = case
            .policy
            .as_ref()
            .map(|p| std::fs::read_to_string(p).unwrap())
            .unwrap_or_default();
        let policy = match texts.iter().position(|t| *t == policy_text) {
            Some(i) => i,
            None => {
                texts.push(policy_text);
                policies.push(case.policy.clone());
                policies.len() - 1
            }
        };
        let (user, groups) = case.requester();
        cases.push(Case {
            namespace: case.namespace(),
            name: case.name,
            object,
            context,
            policy,
            user,
            groups,
            update,
        });
    }
    (cases, policies)
}

/// The operator's kind of [`CUSTOM`] an object is, if it is one.
fn custom(obj: &Value) -> Option<&'static (&'static str, &'static str, &'static str)> {
    CUSTOM
        .iter()
        .find(|(api, kind, _)| obj["apiVersion"] == *api && obj["kind"] == *kind)
}

/// A CRD for one of [`CUSTOM`]: namespaced, one version, every field kept unchecked.
pub(crate) fn crd(api: &str, kind: &str, plural: &str) -> Value {
    let (group, version) = api.split_once('/').unwrap();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_ascii_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{"name": version, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        }
    })
}

/// Installs the CRDs of the cases' custom kinds (one installed already, by an earlier run
/// of this test in the same apiserver, is kept) and waits until each serves.
async fn install_crds(admin: &kube::Client, cases: &[Case], namespace: &str) {
    let mut wanted: Vec<_> = cases.iter().filter_map(|c| custom(&c.object)).collect();
    wanted.sort();
    wanted.dedup();
    for (api, kind, plural) in &wanted {
        if let Err(e) = apiserver::create(admin, &crd(api, kind, plural), false).await {
            assert_eq!(e.code, 409, "installing the CRD of {kind}: {}", e.message);
        }
    }
    for (api, kind, _) in wanted {
        let probe = json!({"apiVersion": api, "kind": kind,
            "metadata": {"name": "probe", "namespace": namespace}});
        common::net::until(&format!("the CRD of {kind} to serve"), async || {
            apiserver::create(admin, &probe, true).await.is_ok()
        })
        .await;
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// What the server's identity may read: the shipped ClusterRole's grants but the
/// cluster-wide objects of feasibility, which other tests create in the shared apiserver.
fn server_role(name: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["namespaces", "resourcequotas"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainingruntimes", "clustertrainingruntimes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues"], "verbs": ["get", "list", "watch"]},
        ]
    })
}

/// `obj` in `namespace`, as a file names it.
fn in_namespace(obj: &Value, namespace: &str) -> Value {
    apiserver::for_create(obj, namespace)
}

/// What the apiserver made anew of an object, and kubectl's own annotation, taken out,
/// so that an object stored and one admitted elsewhere compare on the rest.
fn comparable(obj: &Value) -> Value {
    let mut obj = obj.clone();
    let uid = obj["metadata"]["uid"].as_str().unwrap_or("").to_owned();
    let generated = obj["metadata"]["generateName"].is_string();
    if let Some(Value::Object(m)) = obj.get_mut("metadata") {
        for k in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "generation",
            "managedFields",
            "namespace",
        ] {
            m.remove(k);
        }
        if generated {
            m.remove("name");
        }
        if let Some(Value::Object(a)) = m.get_mut("annotations") {
            a.remove("kubectl.kubernetes.io/last-applied-configuration");
            if a.is_empty() {
                m.remove("annotations");
            }
        }
    }
    // A Job's selector and its pods' labels name the Job's uid.
    fn scrub(v: &mut Value, uid: &str) {
        match v {
            Value::String(s) if !uid.is_empty() && s == uid => *s = "UID".into(),
            Value::Array(a) => a.iter_mut().for_each(|v| scrub(v, uid)),
            Value::Object(m) => m.values_mut().for_each(|v| scrub(v, uid)),
            _ => {}
        }
    }
    scrub(&mut obj, &uid);
    // Tolerations are a set to the scheduler, and their order is the order of admission:
    // the apiserver's DefaultTolerationSeconds adds its two before the webhooks run (when
    // tollgate's follow them) and after, to an object admitted without webhooks.
    for path in ["/spec/tolerations", "/spec/template/spec/tolerations"] {
        if let Some(Value::Array(t)) = obj.pointer_mut(path) {
            t.sort_by_key(|v| v.to_string());
        }
    }
    obj
}

/// kubectl's output with a generated name put back as `tollgate review` writes it (`NAME-*`
/// for `generateName: NAME-`): the validating webhooks see the name the apiserver made,
/// five random characters no prediction can know.
fn generated_name_as_predicted(text: &str, object: &Value) -> String {
    match object["metadata"]["generateName"].as_str() {
        Some(prefix) if !object["metadata"]["name"].is_string() => {
            let re =
                regex::Regex::new(&format!("\"{}[a-z0-9]{{5}}\"", regex::escape(prefix))).unwrap();
            re.replace_all(text, format!("\"{prefix}*\"").as_str())
                .into_owned()
        }
        _ => text.to_owned(),
    }
}

/// The lines kubectl printed as warnings: the webhooks', not the apiserver's own Pod
/// Security warnings of a workload in a labelled namespace (`would violate PodSecurity`),
/// which no webhook answers for.
fn warnings_of(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("Warning: "))
        .filter(|l| !l.starts_with("would violate PodSecurity "))
        .map(str::to_owned)
        .collect()
}

struct Outcome {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn run(mut cmd: Command) -> Outcome {
    let out = cmd.output().expect("runs");
    Outcome {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn blocking(cmd: Command) -> Outcome {
    tokio::task::spawn_blocking(move || run(cmd)).await.unwrap()
}

#[tokio::test]
async fn the_apiserver_does_what_tollgate_review_predicts() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let Some(rendered) = common::rbac::render_if_kubectl("deploy/base") else {
        return;
    };
    let kubectl = common::tools::kubectl().unwrap();
    let admin = cp.client("admin").await;
    let (cases, policies) = cases();
    assert!(cases.len() > 60, "the goldens applied: {}", cases.len());
    let run_id = format!("e2e-{}", std::process::id());

    // The servers' identity, and its grants.
    let role = format!("{run_id}-server");
    apiserver::create(&admin, &server_role(&role), false)
        .await
        .unwrap_or_else(|e| panic!("{}", e.message));
    apiserver::create(
        &admin,
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": role}],
        }),
        false,
    )
    .await
    .unwrap_or_else(|e| panic!("{}", e.message));
    let server_kubeconfig = cp.kubeconfig_as(&role, &[]);

    // One server per policy, all at once.
    let started: Vec<common::process::Served> = {
        let handles: Vec<_> = policies
            .iter()
            .cloned()
            .map(|policy| {
                let kubeconfig = server_kubeconfig.clone();
                tokio::task::spawn_blocking(move || {
                    let (dir, ca) = common::process::workdir();
                    let kubeconfig = kubeconfig.to_string_lossy().into_owned();
                    common::process::serve(
                        dir,
                        ca,
                        policy.as_deref(),
                        "json",
                        &["--cluster-context", "on", "--kubeconfig", &kubeconfig],
                    )
                })
            })
            .collect();
        let mut v = vec![];
        for h in handles {
            v.push(h.await.unwrap());
        }
        v
    };
    for s in &started {
        let (addr, ca) = (s.addr, s.ca_pem.clone());
        common::net::until("a server's cluster context to be ready", async || {
            let mut c = common::net::Client::connect(addr, &ca, false).await;
            common::net::ready(&mut c).await.0 == 200
        })
        .await;
    }

    // Their registrations, and a namespace per server to see each one is in force.
    let mut probes = vec![];
    for (i, s) in started.iter().enumerate() {
        let selector = format!("{run_id}-{i}");
        for c in common::admission::registration(&rendered, &selector, s.addr.port(), &s.ca_pem) {
            apiserver::create(&admin, &c, false)
                .await
                .unwrap_or_else(|e| panic!("registering {selector}: {}", e.message));
        }
        let ns = cp
            .namespace(
                "e2e-probe",
                &[
                    ("tollgate.dev/enforce", "enabled"),
                    (common::admission::REGISTERED, &selector),
                ],
            )
            .await;
        probes.push(ns);
    }
    for (s, ns) in started.iter().zip(&probes) {
        common::admission::until_reviewed(&admin, s, ns).await;
    }

    // Where the object the review predicts is admitted, for the apiserver's own defaulting.
    let reference = cp.namespace("e2e-reference", &[]).await;
    install_crds(&admin, &cases, &reference).await;
    let work = tempfile::tempdir().unwrap();

    let results = apiserver::each(cases.into_iter().enumerate().collect(), |(n, case)| {
        let admin = admin.clone();
        let (kubectl, work, reference, run_id) = (&kubectl, work.path(), &reference, &run_id);
        let (policies, servers) = (&policies, &started);
        async move {
            one(
                cp, &admin, kubectl, work, reference, run_id, policies, servers, n, case,
            )
            .await
        }
    })
    .await;
    let failures: Vec<String> = results.into_iter().flatten().collect();

    for i in 0..started.len() {
        common::admission::deregister(&admin, &format!("{run_id}-{i}")).await;
    }
    assert!(
        failures.is_empty(),
        "{} of the goldens applied differ from what `tollgate review` predicts:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// Applies one case and compares; the differences found.
#[allow(clippy::too_many_arguments)]
async fn one(
    cp: &common::envtest::ControlPlane,
    admin: &kube::Client,
    kubectl: &Path,
    work: &Path,
    reference: &str,
    run_id: &str,
    policies: &[Option<PathBuf>],
    servers: &[common::process::Served],
    n: usize,
    case: Case,
) -> Vec<String> {
    let name = &case.name;
    let mut failures = vec![];
    let selector = format!("{run_id}-{}", case.policy);
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    for d in case.context.iter().filter(|d| d["kind"] == "Namespace") {
        for (k, v) in d["metadata"]["labels"].as_object().into_iter().flatten() {
            labels.insert(k.clone(), v.as_str().unwrap_or("").to_owned());
        }
    }
    labels.insert("tollgate.dev/enforce".into(), "enabled".into());
    // An UPDATE's object is there before tollgate is: made in the namespace before the
    // label that brings it under the webhooks, as in a cluster that adopts tollgate.
    if case.update.is_none() {
        labels.insert(common::admission::REGISTERED.into(), selector.clone());
    }
    let pairs: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let ns = cp.namespace(&case.namespace, &pairs).await;
    labels.insert("kubernetes.io/metadata.name".into(), ns.clone());
    let mut old_stored = None;
    if let Some(request) = &case.update {
        let old = in_namespace(&request["oldObject"], &ns);
        let old_file = work.join(format!("{n}-{name}.old.json"));
        std::fs::write(&old_file, serde_json::to_vec_pretty(&old).unwrap()).unwrap();
        let mut apply = Command::new(kubectl);
        apply
            .arg("--kubeconfig")
            .arg(cp.kubeconfig("admin"))
            .args(["apply", "-o", "json", "-f"])
            .arg(&old_file);
        let before = blocking(apply).await;
        if !before.ok {
            return vec![format!(
                "{name}: applying its old object: {}",
                before.stderr
            )];
        }
        old_stored = Some(serde_json::from_str::<Value>(&before.stdout).unwrap());
        labels.insert(common::admission::REGISTERED.into(), selector.clone());
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(admin.clone());
        let patch = json!({"metadata": {"labels": {(common::admission::REGISTERED): selector}}});
        namespaces
            .patch(&ns, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        // Until the apiserver sends this namespace's objects to the server.
        let server = &servers[case.policy];
        let probe = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe", "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "probe"}]}});
        common::net::until("the webhooks to reach a namespace labelled", async || {
            let _ = apiserver::create(admin, &probe, true).await;
            server
                .lines()
                .iter()
                .any(|l| l.contains(&format!("\"{ns}\"")) && l.contains("\"validate\""))
        })
        .await;
    }

    // The case's user may create what it applies there.
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "e2e-user", "namespace": ns},
        // Not `admin`: its rules are aggregated by the controller-manager, which does not run.
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": case.user}],
    });
    if let Err(e) = apiserver::create(admin, &binding, false).await {
        return vec![format!("{name}: binding its user: {}", e.message)];
    }
    let mut claims: Vec<Value> = case
        .context
        .iter()
        .filter(|d| d["kind"] != "Namespace")
        .map(|d| in_namespace(d, &ns))
        .collect();
    for c in &mut claims {
        if let Err(e) = apiserver::create(admin, c, false).await {
            return vec![format!("{name}: creating its context: {}", e.message)];
        }
        if c["kind"] == "ResourceQuota" {
            // What the controller-manager's quota controller would write of a namespace
            // with nothing in it yet; without it, the apiserver's quota admission refuses
            // every pod there ("status unknown for quota").
            let hard = c["spec"]["hard"].clone();
            let used: serde_json::Map<String, Value> = hard
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, _)| (k.clone(), json!("0")))
                .collect();
            c["status"] = json!({"hard": hard, "used": used});
            let quotas: kube::Api<ResourceQuota> = kube::Api::namespaced(admin.clone(), &ns);
            let status = json!({"status": c["status"]});
            let qname = c["metadata"]["name"].as_str().unwrap_or("");
            if let Err(e) = quotas
                .patch_status(qname, &PatchParams::default(), &Patch::Merge(&status))
                .await
            {
                return vec![format!("{name}: the status of its quota: {e}")];
            }
        }
    }
    // tollgate reads quotas from its watch alone, never by a GET: one made a moment ago
    // may not be in its cache yet (nor in the apiserver's own quota admission's).
    let cached_only = claims.iter().any(|c| c["kind"] == "ResourceQuota");

    let object = in_namespace(&case.object, &ns);
    let file = work.join(format!("{n}-{name}.json"));
    std::fs::write(&file, serde_json::to_vec_pretty(&object).unwrap()).unwrap();
    // The review reads the object beside its context, as a user's file holds them.
    let review_file = work.join(format!("{n}-{name}.review.yaml"));
    let mut docs = vec![object.clone()];
    docs.extend(claims.iter().cloned());
    let text: Vec<String> = docs
        .iter()
        .map(|d| serde_saphyr::to_string(d).unwrap())
        .collect();
    std::fs::write(&review_file, text.join("---\n")).unwrap();

    // The groups the apiserver will send: the user's, and those it adds to one
    // impersonated (system:authenticated; a service account's own two).
    let service_account = case
        .user
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
        .map(|(ns, _)| ns.to_owned());
    let sa_groups: Vec<String> = service_account
        .iter()
        .flat_map(|sa_ns| {
            [
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{sa_ns}"),
            ]
        })
        .collect();
    let impersonated: Vec<&str> = case
        .groups
        .iter()
        .filter(|g| *g != "system:authenticated" && !sa_groups.contains(g))
        .map(String::as_str)
        .collect();
    let mut groups: Vec<String> = impersonated.iter().map(|g| g.to_string()).collect();
    groups.extend(sa_groups);
    groups.push("system:authenticated".into());

    let mut review = common::bin::command();
    review.arg("review");
    if let (Some(request), Some(old)) = (&case.update, &old_stored) {
        // The review the apiserver will send: the golden's, with the object there now, the
        // update applied and the user (the review command builds only creates).
        let mut request = request.clone();
        request["namespace"] = json!(ns);
        request["oldObject"] = old.clone();
        request["object"] = object.clone();
        request["object"]["metadata"]["uid"] = old["metadata"]["uid"].clone();
        request["userInfo"] = json!({"username": case.user, "groups": groups});
        let file = work.join(format!("{n}-{name}.review.json"));
        let review_json = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request});
        std::fs::write(&file, serde_json::to_vec_pretty(&review_json).unwrap()).unwrap();
        review.arg(&file).args(["--output", "json"]);
    } else {
        review.arg(&review_file).args([
            "--output",
            "json",
            "--namespace",
            &ns,
            "--user",
            &case.user,
        ]);
        for g in &groups {
            review.args(["--group", g]);
        }
    }
    let ns_labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    review.args(["--namespace-labels", &ns_labels.join(",")]);
    if let Some(p) = &policies[case.policy] {
        review.arg("--policy").arg(p);
    }
    let predicted = blocking(review).await;
    // One object, so one result in the list review prints.
    let Ok([predicted]) = serde_json::from_str::<[Value; 1]>(&predicted.stdout) else {
        return vec![format!(
            "{name}: tollgate review printed no list of one result: {}{}",
            predicted.stdout, predicted.stderr
        )];
    };

    let mut apply = Command::new(kubectl);
    apply
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_as(&case.user, &impersonated));
    // kubectl apply needs a name; a generateName pod is created.
    let verb = if object["metadata"]["name"].is_string() {
        "apply"
    } else {
        "create"
    };
    apply.args([verb, "-o", "json", "-f"]).arg(&file);
    let allowed = predicted["allowed"].as_bool().unwrap_or(false);
    let predicted_warnings = strings(&predicted["warnings"]);
    if cached_only {
        // Until both have seen the quota, as far as a dry run can tell (bounded: a case
        // that never agrees is then reported by the real apply below).
        let start = std::time::Instant::now();
        loop {
            let mut dry = Command::new(kubectl);
            dry.arg("--kubeconfig")
                .arg(cp.kubeconfig_as(&case.user, &impersonated))
                .args([verb, "--dry-run=server", "-o", "json", "-f"])
                .arg(&file);
            let tried = blocking(dry).await;
            // tollgate has seen it once it warns as predicted (every case with a quota
            // here is warned or refused by it); the quota admission, once it no longer
            // says it has no status to judge by.
            let seen = (tried.ok == allowed && warnings_of(&tried.stderr) == predicted_warnings)
                || (warnings_of(&tried.stderr) == predicted_warnings
                    && !predicted_warnings.is_empty()
                    && !tried.stderr.contains("status unknown for quota"));
            if seen || start.elapsed() > std::time::Duration::from_secs(10) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    let mut applied = blocking(apply).await;
    applied.stderr = generated_name_as_predicted(&applied.stderr, &object);

    let warned = warnings_of(&applied.stderr);
    if warned != predicted_warnings {
        failures.push(format!(
            "{name}: kubectl's warnings differ from the review's:\n  kubectl: {warned:?}\n  review:  {predicted_warnings:?}"
        ));
    }
    if let Some((_, why)) = NOT_CREATABLE.iter().find(|(n, _)| n == name) {
        if applied.ok || !applied.stderr.contains(why) {
            failures.push(format!(
                "{name}: expected the apiserver to refuse it with {why:?} (NOT_CREATABLE); kubectl: {}",
                applied.stderr.trim()
            ));
        }
        return failures;
    }
    let said = || {
        format!(
            "\n  kubectl {verb}: {}\n  tollgate review: {}",
            applied.stderr.trim(),
            serde_json::to_string(&json!({
                "allowed": predicted["allowed"],
                "message": predicted["message"],
                "warnings": predicted["warnings"],
            }))
            .unwrap()
        )
    };
    if applied.ok != allowed {
        failures.push(format!(
            "{name}: the apiserver {} it, the review predicts it {}{}",
            if applied.ok { "admitted" } else { "refused" },
            if allowed { "admitted" } else { "refused" },
            said()
        ));
        return failures;
    }
    if !allowed {
        let message = predicted["message"].as_str().unwrap_or("");
        if message.is_empty() || !applied.stderr.contains(message) {
            failures.push(format!(
                "{name}: kubectl's error does not hold the review's message{}",
                said()
            ));
        }
        return failures;
    }

    // What the apiserver stored, beside what it makes of the object the review predicts.
    let stored: Value = match serde_json::from_str(&applied.stdout) {
        Ok(v) => v,
        Err(e) => {
            failures.push(format!("{name}: kubectl printed no object: {e}"));
            return failures;
        }
    };
    let made = ["mutatedPod", "mutatedObject"]
        .iter()
        .map(|k| &predicted[*k])
        .find(|v| v.is_object())
        .cloned()
        .unwrap_or_else(|| object.clone());
    let expected = match apiserver::create(admin, &in_namespace(&made, reference), true).await {
        Ok(v) => v,
        Err(e) => {
            failures.push(format!(
                "{name}: the apiserver refuses the object the review predicts: {}",
                e.message
            ));
            return failures;
        }
    };
    let (stored, expected) = (comparable(&stored), comparable(&expected));
    if stored != expected {
        let diff = json_patch::diff(&expected, &stored);
        let fields: Vec<String> = diff
            .0
            .iter()
            .map(|op| {
                let path = op.path().to_string();
                let at = |v: &Value| v.pointer(&path).map_or("absent".into(), Value::to_string);
                format!(
                    "{path}: predicted {}, stored {}",
                    at(&expected),
                    at(&stored)
                )
            })
            .collect();
        failures.push(format!(
            "{name}: the apiserver stored another object than the review predicts:\n  {}",
            fields.join("\n  ")
        ));
    }
    failures
}

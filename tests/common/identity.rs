//! Identities and shared objects in the real apiserver of [`super::envtest`]: the shipped
//! RBAC applied for a ServiceAccount of a test's own namespace, that account's token from
//! the TokenRequest API in a kubeconfig (so that tollgate runs as the manifests make it
//! run, held to their RBAC by the apiserver itself), what RBAC grants an identity
//! (SelfSubjectRulesReview), objects applied with `kubectl apply --server-side`, and
//! cluster-wide CRDs installed once for every test that shares the apiserver.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::authorization::v1::SelfSubjectRulesReview;
use k8s_openapi::api::core::v1::ServiceAccount;
use serde_json::{json, Value};

use super::envtest::ControlPlane;

/// Held by every test that creates objects under the cluster-wide names the manifests
/// give them (`tollgate-*` ClusterRoles and ClusterRoleBindings, the `tollgate` webhook
/// configurations), as the chart's install must (tests/helm.rs): one of each per
/// apiserver, so such tests take turns. Tests that may rename them do
/// ([`own_names`]) and need not.
pub async fn shipped_names() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// Creates one object of any kind the apiserver serves (found by discovery), as `client`.
pub async fn create(client: &kube::Client, object: Value) -> Value {
    let what = object["metadata"].to_string();
    try_create(client, object)
        .await
        .unwrap_or_else(|e| panic!("creating {what}: {e}"))
}

/// [`create`], the apiserver's refusal returned.
pub async fn try_create(client: &kube::Client, object: Value) -> Result<Value, kube::Error> {
    let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, v)) => (g.to_owned(), v.to_owned()),
        None => (
            String::new(),
            object["apiVersion"].as_str().unwrap().to_owned(),
        ),
    };
    let gvk = kube::api::GroupVersionKind::gvk(&group, &version, object["kind"].as_str().unwrap());
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("{gvk:?} is not served: {e}"));
    let api: kube::Api<kube::api::DynamicObject> =
        match (caps.scope, object["metadata"]["namespace"].as_str()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                kube::Api::namespaced_with(client.clone(), ns, &resource)
            }
            _ => kube::Api::all_with(client.clone(), &resource),
        };
    let o: kube::api::DynamicObject = serde_json::from_value(object).unwrap();
    let stored = api.create(&Default::default(), &o).await?;
    Ok(serde_json::to_value(stored).unwrap())
}

/// Held (exclusively) by every test that runs a background audit with a ServiceAccount
/// bound cluster-wide by the shipped RBAC: it judges, and keeps or removes the reports of,
/// every namespace it does not exclude, and removes tollgate's reports in those it does
/// (as stale), so it runs alone. Tests whose audit RBAC keeps to their own namespaces, and
/// tests that keep PolicyReports of their own, share it ([`contained_audit`]).
pub async fn background_audit() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    AUDITS.write().await
}

/// Held (shared) by a test whose background audit may write only in its own namespaces,
/// or that keeps PolicyReports of its own: see [`background_audit`].
pub async fn contained_audit() -> tokio::sync::RwLockReadGuard<'static, ()> {
    AUDITS.read().await
}

static AUDITS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A kubeconfig (a file that lives as long as the control plane) that authenticates with
/// `token` to the control plane, `namespace` its context's namespace.
pub fn kubeconfig_with_token(cp: &ControlPlane, token: &str, namespace: &str) -> PathBuf {
    use base64::Engine as _;
    static N: AtomicU32 = AtomicU32::new(0);
    let ca = base64::engine::general_purpose::STANDARD.encode(&cp.ca_pem);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster:\n    \
         server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: sa\n  user:\n    \
         token: {token}\ncontexts:\n- name: envtest\n  context:\n    cluster: envtest\n    \
         user: sa\n    namespace: {namespace}\ncurrent-context: envtest\n",
        cp.url
    );
    // Beside the harness's own kubeconfigs: removed with the control plane's files.
    let path = cp.kubeconfig("admin").with_file_name(format!(
        "sa-{}.kubeconfig",
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, text).unwrap();
    path
}

/// The ServiceAccount `name` of `namespace` (created if absent; there is no ServiceAccount
/// controller here) and a kubeconfig with a token of it from the TokenRequest API.
pub async fn service_account(cp: &ControlPlane, namespace: &str, name: &str) -> PathBuf {
    let api: kube::Api<ServiceAccount> = kube::Api::namespaced(cp.client("admin").await, namespace);
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": namespace}}))
            .unwrap();
    match api.create(&Default::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating ServiceAccount {namespace}/{name}: {e}"),
    }
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))
            .unwrap();
    let token: TokenRequest = api
        .create_subresource("token", name, &Default::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for {namespace}/{name}: {e}"));
    let token = token
        .status
        .and_then(|s| s.token)
        .expect("a TokenRequest's token");
    kubeconfig_with_token(cp, &token, namespace)
}

/// `kubectl apply --server-side --force-conflicts` of `docs` as the admin (one kubectl for
/// them all); None where no kubectl can be had (said on stderr).
pub fn apply(cp: &ControlPlane, docs: &[Value]) -> Option<()> {
    kubectl_stdin(
        cp,
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        docs,
    )
}

/// `kubectl delete --ignore-not-found --wait=false` of `docs` as the admin.
pub fn delete(cp: &ControlPlane, docs: &[Value]) -> Option<()> {
    kubectl_stdin(
        cp,
        &["delete", "--ignore-not-found", "--wait=false", "-f", "-"],
        docs,
    )
}

fn kubectl_stdin(cp: &ControlPlane, args: &[&str], docs: &[Value]) -> Option<()> {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": docs});
    let (ok, _, err) = super::policy::kubectl(&cp.kubeconfig("admin"), args, Some(&list))?;
    assert!(ok, "kubectl {}: {err}", args.join(" "));
    Some(())
}

/// The CRDs of `file` (YAML, relative to the repository) installed and Established, once
/// per test binary whichever test asks first (they are cluster-wide: every test sees
/// them). None where no kubectl can be had.
pub async fn crds(cp: &ControlPlane, file: &str) -> Option<()> {
    static DONE: std::sync::Mutex<BTreeSet<String>> = std::sync::Mutex::new(BTreeSet::new());
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = LOCK.lock().await;
    // Per plane: a test binary may start more than one (tests/common/envtest.rs).
    let key = format!("{} {file}", cp.url);
    if DONE.lock().unwrap().contains(&key) {
        return Some(());
    }
    let text = std::fs::read_to_string(super::root().join(file)).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    // Applied (not created): another test binary's run, or another helper's copy of the
    // same CRD, may have made it already.
    apply(cp, &docs)?;
    for d in &docs {
        established(cp, d["metadata"]["name"].as_str().unwrap()).await;
    }
    DONE.lock().unwrap().insert(key);
    Some(())
}

/// Waits until the CRD `name` is Established (its resource is served).
pub async fn established(cp: &ControlPlane, name: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: kube::Api<CustomResourceDefinition> = kube::Api::all(cp.client("admin").await);
    let start = Instant::now();
    loop {
        let crd = api.get(name).await.unwrap();
        let ok = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if ok {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "CRD {name} not Established"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What RBAC lets the identity of `kubeconfig` do in `namespace` (its cluster-wide grants
/// included), as SelfSubjectRulesReview tells that identity: `verb group/resource` or
/// `verb group/resource/name`, one entry per verb, resource and name.
pub async fn rules(cp: &ControlPlane, kubeconfig: &Path, namespace: &str) -> BTreeSet<String> {
    let client = cp.client_of(kubeconfig).await;
    let review: SelfSubjectRulesReview =
        serde_json::from_value(json!({"spec": {"namespace": namespace}})).unwrap();
    let review = kube::Api::<SelfSubjectRulesReview>::all(client)
        .create(&Default::default(), &review)
        .await
        .expect("a SelfSubjectRulesReview");
    let status = review.status.expect("its status");
    let mut out = BTreeSet::new();
    for r in status.resource_rules {
        let names = match r.resource_names {
            Some(n) if !n.is_empty() => n.into_iter().map(Some).collect(),
            _ => vec![None],
        };
        for g in r.api_groups.unwrap_or_default() {
            for res in r.resources.clone().unwrap_or_default() {
                for v in &r.verbs {
                    for n in &names {
                        out.insert(match n {
                            Some(n) => format!("{v} {g}/{res}/{n}"),
                            None => format!("{v} {g}/{res}"),
                        });
                    }
                }
            }
        }
    }
    out
}

/// What RBAC grants the identity of `kubeconfig` in `namespace` beyond what every
/// authenticated identity may do by Kubernetes' defaults (the `system:basic-user` and
/// discovery roles: the rules of a ServiceAccount bound to nothing, `baseline`). What
/// tollgate's own manifests grant every authenticated user (the TollgatePolicy's read,
/// `tollgate-policy-viewer`) is not taken for a default: once a test on the plane has
/// applied them, the baseline has it too, and the identity's own grant of it would vanish
/// from the difference depending on which test ran first.
pub async fn granted(
    cp: &ControlPlane,
    kubeconfig: &Path,
    baseline: &Path,
    namespace: &str,
) -> BTreeSet<String> {
    let all = rules(cp, kubeconfig, namespace).await;
    let mut base = rules(cp, baseline, namespace).await;
    for verb in ["get", "list", "watch"] {
        base.remove(&format!("{verb} tollgate.dev/tollgatepolicies"));
    }
    all.difference(&base).cloned().collect()
}

/// The shipped manifests' ServiceAccount `tollgate` of `tollgate-system` moved into
/// `namespace`: each object's namespace and each binding's subjects (names, rules and
/// roleRefs as shipped).
pub fn moved(docs: &[Value], namespace: &str) -> Vec<Value> {
    docs.iter()
        .map(|d| {
            let mut d = d.clone();
            if d["metadata"]["namespace"] == "tollgate-system" {
                d["metadata"]["namespace"] = json!(namespace);
            }
            if let Some(subjects) = d.get_mut("subjects").and_then(Value::as_array_mut) {
                for s in subjects {
                    if s["namespace"] == "tollgate-system" {
                        s["namespace"] = json!(namespace);
                    }
                }
            }
            d
        })
        .collect()
}

/// `docs` with their cluster-scoped RBAC objects (ClusterRoles, ClusterRoleBindings), and
/// the Roles and RoleBindings of a namespace other than `suffix` (kube-system's), named
/// `NAME-suffix`, and every binding's reference to such a role with them: the
/// shipped names are one per apiserver, shared by every test (rules, subjects and
/// namespaced objects as they were).
pub fn own_names(docs: &[Value], suffix: &str) -> Vec<Value> {
    let renamed = |name: &Value| json!(format!("{}-{suffix}", name.as_str().unwrap()));
    docs.iter()
        .map(|d| {
            let mut d = d.clone();
            // A Role and its binding in a namespace of the cluster's own (kube-system's,
            // for one ConfigMap there) are shared by every test too.
            let elsewhere = d["metadata"]["namespace"]
                .as_str()
                .is_some_and(|n| n != suffix);
            let kind = d["kind"].as_str().unwrap_or("");
            if matches!(kind, "ClusterRole" | "ClusterRoleBinding")
                || (elsewhere && matches!(kind, "Role" | "RoleBinding"))
            {
                d["metadata"]["name"] = renamed(&d["metadata"]["name"]);
            }
            if d.get("roleRef").is_some()
                && (d["roleRef"]["kind"] == "ClusterRole"
                    || (elsewhere && d["roleRef"]["kind"] == "Role"))
            {
                d["roleRef"]["name"] = renamed(&d["roleRef"]["name"]);
            }
            d
        })
        .collect()
}

/// The RBAC objects and ServiceAccounts of `docs`.
pub fn rbac_of(docs: &[Value]) -> Vec<Value> {
    docs.iter()
        .filter(|d| {
            [
                "ServiceAccount",
                "Role",
                "ClusterRole",
                "RoleBinding",
                "ClusterRoleBinding",
            ]
            .contains(&d["kind"].as_str().unwrap_or(""))
        })
        .cloned()
        .collect()
}

/// The shared apiserver's namespaces but `mine`, as they are now: the other tests', which a
/// test whose account may read and write every namespace leaves out.
pub async fn other_namespaces(admin: &kube::Client, mine: &[&str]) -> Vec<String> {
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .filter(|n| !mine.contains(&n.as_str()))
        .collect()
}

/// The lines of a server's log that say the apiserver refused it something: "forbidden",
/// or 403 as a number of its own (not three digits of a longer one, such as the Unix time
/// in a certificate's name).
pub fn refusals(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            l.contains("forbidden") || l.split(|c: char| !c.is_ascii_digit()).any(|n| n == "403")
        })
        .collect()
}

#[test]
fn a_403_is_a_refusal_and_digits_of_a_longer_number_are_not() {
    let log = "a\n{\"ca\":\"CN=tollgate CA 1796304372\"}\nlist: 403 Forbidden\n{\"code\":403}\nis forbidden: x\n";
    assert_eq!(
        refusals(log),
        ["list: 403 Forbidden", "{\"code\":403}", "is forbidden: x"]
    );
}

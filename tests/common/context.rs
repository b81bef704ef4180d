//! Support for the tests of `tollgate serve`'s cluster context against the real apiserver
//! (tests/cluster_context.rs, feasibility_context.rs, trainjob_context.rs): objects written
//! with the admin's client, the CRDs of Kueue and Kubeflow Trainer installed
//! (tests/data/crds/), an identity held to the RBAC tollgate ships (deploy/base/rbac.yaml),
//! and a server whose cluster context watches the apiserver as that identity.
//!
//! The apiserver is shared by the tests of the binary, run in parallel: each test keeps to
//! namespaces of its own; cluster-scoped objects get names of their own (see [`unique`]).

use std::path::PathBuf;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};

use super::envtest::ControlPlane;
use super::net::{self, TestServer};

/// A name no other test of this process has: `PREFIX-N`.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// The API of `object`'s kind (its `apiVersion` and `kind`; the plural is the kind's
/// lowercase with an `s`, which holds for every kind these tests write), in its namespace.
fn api_of(client: &Client, object: &Value) -> Api<DynamicObject> {
    let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", object["apiVersion"].as_str().unwrap()),
    };
    let kind = object["kind"].as_str().unwrap();
    let plural = match kind {
        "DeviceClass" => "deviceclasses".to_owned(),
        k => format!("{}s", k.to_lowercase()),
    };
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural);
    match object["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

fn name_of(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap()
}

/// Creates `object`, then writes its `status` if it has one (a create drops it: the
/// status subresource is where it is written).
pub async fn create(client: &Client, object: &Value) {
    let api = api_of(client, object);
    let obj: DynamicObject = serde_json::from_value(object.clone()).unwrap();
    api.create(&Default::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {}: {e}", name_of(object)));
    if let Some(status) = object.get("status") {
        patch_status(client, object, json!({ "status": status })).await;
    }
}

/// [`create`] of a cluster-wide object other tests of the plane may create alike (a
/// DeviceClass of the name the shipped policy knows): an AlreadyExists is one of them
/// having done it.
pub async fn create_shared(client: &Client, object: &Value) {
    let obj: DynamicObject = serde_json::from_value(object.clone()).unwrap();
    match api_of(client, object)
        .create(&Default::default(), &obj)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating {}: {e}", name_of(object)),
    }
}

/// A merge patch of `object` (found by its apiVersion, kind, namespace and name).
pub async fn patch(client: &Client, object: &Value, patch: Value) {
    api_of(client, object)
        .patch(
            name_of(object),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .unwrap_or_else(|e| panic!("patching {}: {e}", name_of(object)));
}

/// A merge patch of `object`'s status subresource.
pub async fn patch_status(client: &Client, object: &Value, patch: Value) {
    api_of(client, object)
        .patch_status(
            name_of(object),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .unwrap_or_else(|e| panic!("patching the status of {}: {e}", name_of(object)));
}

/// Installs the CRDs of `FILE` (relative to the repository: tests/data/crds/kueue.yaml,
/// tests/data/crds/trainer.yaml, the PolicyReport CRD deploy/ ships) and waits until each
/// is Established. Idempotent: the tests of the binary install them in parallel, and an
/// AlreadyExists is one of them having done it.
pub async fn install_crds(client: &Client, file: &str) {
    let docs = yaml_docs(file);
    let crds = Api::<DynamicObject>::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    for doc in &docs {
        let crd: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
        match crds.create(&Default::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("creating CRD {}: {e}", name_of(doc)),
        }
    }
    for doc in &docs {
        let name = name_of(doc);
        net::until(&format!("CRD {name} established"), async || {
            let crd = crds.get(name).await.unwrap();
            crd.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        })
        .await;
        // Established is not yet served in discovery everywhere; tollgate asks discovery
        // once at start (and again only minutes later) which versions a group serves.
        let group = doc["spec"]["group"].as_str().unwrap();
        let plural = doc["spec"]["names"]["plural"].as_str().unwrap();
        for v in doc["spec"]["versions"].as_array().unwrap() {
            let gv = format!("{group}/{}", v["name"].as_str().unwrap());
            net::until(&format!("{plural} in the discovery of {gv}"), async || {
                let listed = client.list_api_groups().await.is_ok_and(|gs| {
                    gs.groups
                        .iter()
                        .any(|g| g.versions.iter().any(|x| x.group_version == gv))
                });
                listed
                    && client
                        .list_api_group_resources(&gv)
                        .await
                        .is_ok_and(|rs| rs.resources.iter().any(|r| r.name == plural))
            })
            .await;
        }
    }
}

/// The YAML documents of `file` (relative to the repository) that are objects.
fn yaml_docs(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(super::root().join(file)).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter()
        .filter(|d| d.get("kind").is_some())
        .collect()
}

/// The rules of the Role or ClusterRole `kind`/`name` of `file` (relative to the
/// repository), as tollgate ships it.
pub fn rules_of(file: &str, kind: &str, name: &str) -> Vec<Value> {
    let role = yaml_docs(file)
        .into_iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{file} has no {kind} {name}"));
    role["rules"].as_array().unwrap().clone()
}

/// The rules of the ClusterRole deploy/base/rbac.yaml grants tollgate's ServiceAccount for
/// its cluster context.
pub fn shipped_rules() -> Vec<Value> {
    rules_of(
        "deploy/base/rbac.yaml",
        "ClusterRole",
        "tollgate-cluster-context",
    )
}

/// Binds the cluster context's RBAC as deploy/base ships it to the ServiceAccount `sa` of
/// `namespace`: the ClusterRole's rules, and the Role of kube-system for the one ConfigMap
/// it reads there (whether the Cluster Autoscaler runs).
pub async fn bind_shipped(cp: &ControlPlane, namespace: &str, sa: &str) {
    bind(cp, namespace, sa, &shipped_rules()).await;
    bind_elsewhere(
        cp,
        "kube-system",
        namespace,
        sa,
        &shipped_autoscaler_status_rules(),
    )
    .await;
}

/// The rules of the Role deploy/base/rbac.yaml grants in kube-system: the Cluster
/// Autoscaler's status ConfigMap, that one alone.
pub fn shipped_autoscaler_status_rules() -> Vec<Value> {
    rules_of(
        "deploy/base/rbac.yaml",
        "Role",
        "tollgate-cluster-autoscaler-status",
    )
}

/// Binds a ClusterRole of `rules` (created under a name of its own) to the ServiceAccount
/// `sa` of `namespace`.
pub async fn bind(cp: &ControlPlane, namespace: &str, sa: &str, rules: &[Value]) {
    let admin = cp.client("admin").await;
    let role = unique(&format!("{sa}-{namespace}"));
    create(
        &admin,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": role}, "rules": rules}),
    )
    .await;
    create(
        &admin,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]}),
    )
    .await;
}

/// Binds a Role of `rules` in `namespace` to its ServiceAccount `sa`.
pub async fn bind_in(cp: &ControlPlane, namespace: &str, sa: &str, rules: &[Value]) {
    bind_elsewhere(cp, namespace, namespace, sa, rules).await;
}

/// Binds a Role of `rules` in `role_namespace` to the ServiceAccount `sa` of `namespace`.
pub async fn bind_elsewhere(
    cp: &ControlPlane,
    role_namespace: &str,
    namespace: &str,
    sa: &str,
    rules: &[Value],
) {
    let admin = cp.client("admin").await;
    let role = unique(&format!("{sa}-{namespace}"));
    create(
        &admin,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": role, "namespace": role_namespace}, "rules": rules}),
    )
    .await;
    create(
        &admin,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": role, "namespace": role_namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]}),
    )
    .await;
}

/// A kubeconfig acting as the ServiceAccount `sa` of `namespace` (the admin impersonating
/// it, so that no token controller is needed: RBAC judges the ServiceAccount's user name
/// and groups, as it would its token's).
pub fn sa_kubeconfig(cp: &ControlPlane, namespace: &str, sa: &str) -> PathBuf {
    cp.kubeconfig_as(
        &format!("system:serviceaccount:{namespace}:{sa}"),
        &[
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{namespace}"),
        ],
    )
}

/// Until `kubeconfig` may list `resource` of the core group cluster-wide: its binding in
/// force in the apiserver's authorizer, so that a server's first lists are not refused.
pub async fn until_may_list(cp: &ControlPlane, kubeconfig: &std::path::Path, resource: &str) {
    let client = cp.client_of(kubeconfig).await;
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", ""), resource);
    let api = Api::<DynamicObject>::all_with(client, &ar);
    net::until(&format!("the binding in force ({resource})"), async || {
        api.list(&kube::api::ListParams::default().limit(1))
            .await
            .is_ok()
    })
    .await;
}

/// The ServiceAccount `tollgate` of `namespace`, bound to the ClusterRole tollgate ships,
/// once the apiserver's authorizer has the binding (so that the server's first lists are
/// not refused): its kubeconfig.
pub async fn shipped_identity(cp: &ControlPlane, namespace: &str) -> PathBuf {
    bind_shipped(cp, namespace, "tollgate").await;
    let kubeconfig = sa_kubeconfig(cp, namespace, "tollgate");
    until_may_list(cp, &kubeconfig, "nodes").await;
    kubeconfig
}

/// A server whose cluster context watches the apiserver with `kubeconfig`.
pub async fn serve(
    kubeconfig: PathBuf,
    tweak: impl FnOnce(&mut tollgate::server::ServeOptions),
) -> TestServer {
    net::start(|o| {
        o.cluster = Some(tollgate::server::ClusterOptions {
            kubeconfig: Some(kubeconfig),
            context: None,
            fetch_timeout: Duration::from_millis(800),
        });
        tweak(o);
    })
    .await
}

/// A pool of nodes of one test's own on a shared control plane: its nodes carry the label
/// `tollgate.test/pool: NAME` and the taint `tollgate.test/pool=NAME:NoSchedule`, and the
/// test's pods select and tolerate them ([`Pool::confine`]). So a pod's verdict depends on
/// this pool's nodes alone, whatever nodes other tests add, and no other test's pod may
/// use these.
pub struct Pool {
    pub name: String,
}

impl Pool {
    pub fn new(prefix: &str) -> Pool {
        Pool {
            name: unique(prefix),
        }
    }

    /// A node of the pool: `gpus` A100s (tainted for GPU pods too), ready, with `labels`
    /// besides its hostname and the pool's.
    pub fn node(&self, name: &str, gpus: &str, labels: Value) -> Value {
        let name = format!("{}-{name}", self.name);
        let mut l = json!({"tollgate.test/pool": self.name,
            "nvidia.com/gpu.product": "A100-SXM4-80GB"});
        l.as_object_mut()
            .unwrap()
            .extend(labels.as_object().unwrap().clone());
        super::scheduling::node(
            &name,
            l,
            json!([
                {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                {"key": "tollgate.test/pool", "value": self.name, "effect": "NoSchedule"}
            ]),
            json!({"cpu": "94", "memory": "1000Gi", "nvidia.com/gpu": gpus}),
        )
    }

    /// `spec` (a pod's) made to select the pool's nodes and tolerate their pool taint.
    pub fn confine(&self, spec: &mut Value) {
        spec["nodeSelector"]["tollgate.test/pool"] = json!(self.name);
        let toleration = json!({"key": "tollgate.test/pool", "operator": "Equal",
            "value": self.name, "effect": "NoSchedule"});
        match spec["tolerations"].as_array_mut() {
            Some(t) => t.push(toleration),
            None => spec["tolerations"] = json!([toleration]),
        }
    }
}

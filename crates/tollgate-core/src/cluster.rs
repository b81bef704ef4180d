//! What a review may know about other objects in the cluster: the ResourceClaims and
//! ResourceClaimTemplates a pod's GPUs come through, the Namespaces policy profiles
//! match on, what the cluster offers pods (its nodes by shape, its ResourceQuotas, its
//! DeviceClasses), which feasibility compares them with, and the TrainingRuntimes and
//! ClusterTrainingRuntimes a Kubeflow TrainJob's pods are made from (as JSON: tollgate
//! reads only their JobSet template).
//!
//! The engine never reads the cluster itself. It asks a [`Cluster`], which the shell backs
//! with caches fed by watches (`tollgate serve`), with the objects of an input file
//! (`tollgate review`), or with nothing (`--cluster-context off`). An answer is one of
//! three: the object, "it does not exist", or "not known": a cache that may simply not have
//! seen an object created a moment ago answers [`Lookup::Unknown`], and the review names
//! it in [`Reviewed::unresolved`](crate::review::Reviewed::unresolved) so that the shell can
//! fetch it once and review again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, ResourceQuota};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use serde_json::{Map, Value};

use crate::capacity::Nodes;

/// One answer of a [`Cluster`].
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup<T> {
    Found(T),
    /// Known not to exist.
    Absent,
    /// Not in what the caller holds; it may exist.
    Unknown,
}

impl<T> Lookup<T> {
    pub fn found(self) -> Option<T> {
        match self {
            Lookup::Found(t) => Some(t),
            _ => None,
        }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Lookup<U> {
        match self {
            Lookup::Found(t) => Lookup::Found(f(t)),
            Lookup::Absent => Lookup::Absent,
            Lookup::Unknown => Lookup::Unknown,
        }
    }
}

/// The kinds of object a review can ask about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ContextKind {
    ResourceClaim,
    ResourceClaimTemplate,
    Namespace,
    /// `trainer.kubeflow.org/v1alpha1`, namespaced.
    TrainingRuntime,
    /// `trainer.kubeflow.org/v1alpha1`, cluster-scoped.
    ClusterTrainingRuntime,
}

impl ContextKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ContextKind::ResourceClaim => "ResourceClaim",
            ContextKind::ResourceClaimTemplate => "ResourceClaimTemplate",
            ContextKind::Namespace => "Namespace",
            ContextKind::TrainingRuntime => "TrainingRuntime",
            ContextKind::ClusterTrainingRuntime => "ClusterTrainingRuntime",
        }
    }
}

/// An object a review asked about and could not be told of.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub kind: ContextKind,
    /// Empty for a Namespace and a ClusterTrainingRuntime.
    pub namespace: String,
    pub name: String,
}

/// What a review may ask of the cluster. Every method answers at once, from memory.
///
/// No method has a default answer: every implementation says, for each source of cluster
/// knowledge, where its answer comes from (or that it has none), so that a new source
/// does not compile until each of them does. The sources, and where each is kept current:
/// docs/architecture.md, "Where new work goes".
pub trait Cluster {
    fn resource_claim(&self, namespace: &str, name: &str) -> Lookup<Arc<ResourceClaim>>;
    fn resource_claim_template(
        &self,
        namespace: &str,
        name: &str,
    ) -> Lookup<Arc<ResourceClaimTemplate>>;
    fn namespace(&self, name: &str) -> Lookup<Arc<Namespace>>;

    /// A Kubeflow Trainer TrainingRuntime, as its JSON.
    fn training_runtime(&self, namespace: &str, name: &str) -> Lookup<Arc<Value>>;

    /// A Kubeflow Trainer ClusterTrainingRuntime, as its JSON.
    fn cluster_training_runtime(&self, name: &str) -> Lookup<Arc<Value>>;

    /// True when there is no cluster context at all (`--cluster-context off`): messages
    /// then say so rather than blame the object.
    fn is_offline(&self) -> bool;

    /// The schedulable nodes, by shape. None: this context does not hold nodes at all
    /// (none given to `tollgate review`, no cluster context): feasibility says nothing of
    /// them. `Some(Unknown)`: it should and does not yet (a cache not synced): said once.
    fn nodes(&self) -> Option<Lookup<Arc<Nodes>>>;

    /// The ResourceQuotas of a namespace (none: an empty list). None and `Some(Unknown)`
    /// as for [`Cluster::nodes`].
    fn resource_quotas(&self, namespace: &str) -> Option<Lookup<Arc<[Arc<ResourceQuota>]>>>;

    /// The names of the DeviceClasses. None and `Some(Unknown)` as for [`Cluster::nodes`].
    fn device_classes(&self) -> Option<Lookup<Arc<BTreeSet<String>>>>;

    /// A Kueue LocalQueue (`kueue.x-k8s.io`, as JSON). None and `Some(Unknown)` as for
    /// [`Cluster::nodes`].
    fn kueue_local_queue(&self, namespace: &str, name: &str) -> Option<Lookup<Arc<Value>>>;

    /// A Kueue ClusterQueue (as JSON). None and `Some(Unknown)` as for [`Cluster::nodes`].
    fn kueue_cluster_queue(&self, name: &str) -> Option<Lookup<Arc<Value>>>;

    /// What may add nodes: the Cluster Autoscaler, Karpenter's NodePools. None: this
    /// context does not hold it (feasibility then takes the nodes there are as all there
    /// will be, as with no autoscaler); `Some(Unknown)`: not known yet.
    fn autoscaling(&self) -> Option<Lookup<Arc<Autoscaling>>>;
}

/// What may add a node to the cluster, for feasibility: a pod that no node offers what it
/// asks for may still run where an autoscaler adds one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Autoscaling {
    /// The Cluster Autoscaler's status ConfigMap ([`CLUSTER_AUTOSCALER_STATUS`]) exists,
    /// in whatever format (text before CA 1.30, YAML since): it may add a node of a group
    /// tollgate cannot see.
    pub cluster_autoscaler: bool,
    /// Karpenter's NodePools (`karpenter.sh/v1`), as JSON.
    pub node_pools: Vec<Arc<Value>>,
}

/// The namespace and name of the ConfigMap the Cluster Autoscaler writes its status to.
pub const CLUSTER_AUTOSCALER_STATUS: (&str, &str) = ("kube-system", "cluster-autoscaler-status");

/// The API version of Karpenter's NodePools that feasibility reads.
pub const KARPENTER_NODEPOOL_API_VERSION: &str = "karpenter.sh/v1";

/// No cluster context at all: every object is unknown, and nothing of what the cluster
/// offers pods is held.
#[derive(Debug, Clone, Copy, Default)]
pub struct Offline;

impl Cluster for Offline {
    fn resource_claim(&self, _: &str, _: &str) -> Lookup<Arc<ResourceClaim>> {
        Lookup::Unknown
    }
    fn resource_claim_template(&self, _: &str, _: &str) -> Lookup<Arc<ResourceClaimTemplate>> {
        Lookup::Unknown
    }
    fn namespace(&self, _: &str) -> Lookup<Arc<Namespace>> {
        Lookup::Unknown
    }
    fn training_runtime(&self, _: &str, _: &str) -> Lookup<Arc<Value>> {
        Lookup::Unknown
    }
    fn cluster_training_runtime(&self, _: &str) -> Lookup<Arc<Value>> {
        Lookup::Unknown
    }
    fn is_offline(&self) -> bool {
        true
    }
    fn nodes(&self) -> Option<Lookup<Arc<Nodes>>> {
        None
    }
    fn resource_quotas(&self, _: &str) -> Option<Lookup<Arc<[Arc<ResourceQuota>]>>> {
        None
    }
    fn device_classes(&self) -> Option<Lookup<Arc<BTreeSet<String>>>> {
        None
    }
    fn kueue_local_queue(&self, _: &str, _: &str) -> Option<Lookup<Arc<Value>>> {
        None
    }
    fn kueue_cluster_queue(&self, _: &str) -> Option<Lookup<Arc<Value>>> {
        None
    }
    fn autoscaling(&self) -> Option<Lookup<Arc<Autoscaling>>> {
        None
    }
}

/// A fixed set of objects: those of an input file, or a test's. What is not here is
/// [`Lookup::Absent`] when the set is `complete` (a file is all there is), else
/// [`Lookup::Unknown`].
#[derive(Debug, Clone, Default)]
pub struct Objects {
    pub claims: BTreeMap<(String, String), Arc<ResourceClaim>>,
    pub templates: BTreeMap<(String, String), Arc<ResourceClaimTemplate>>,
    pub namespaces: BTreeMap<String, Arc<Namespace>>,
    /// TrainingRuntimes by namespace and name.
    pub training_runtimes: BTreeMap<(String, String), Arc<Value>>,
    /// ClusterTrainingRuntimes by name.
    pub cluster_training_runtimes: BTreeMap<String, Arc<Value>>,
    /// Objects known not to exist (a GET answered 404).
    pub absent: BTreeSet<ObjectKey>,
    pub complete: bool,
    /// The nodes, when the set holds them (None: it says nothing of nodes).
    pub nodes: Option<Arc<Nodes>>,
    /// The ResourceQuotas by namespace, when the set holds them.
    pub quotas: Option<BTreeMap<String, Arc<[Arc<ResourceQuota>]>>>,
    /// The DeviceClasses' names, when the set holds them.
    pub device_classes: Option<Arc<BTreeSet<String>>>,
    /// The Node objects `nodes` was built from (a file's).
    pub node_objects: Vec<Node>,
    /// Kueue's LocalQueues by namespace and name, when the set holds them (then it knows
    /// them all).
    pub local_queues: Option<BTreeMap<(String, String), Arc<Value>>>,
    /// Kueue's ClusterQueues by name, when the set holds them (shared: an audit lists
    /// them once for every namespace).
    pub cluster_queues: Option<Arc<BTreeMap<String, Arc<Value>>>>,
    /// What may add nodes, when the set holds it (a file that gives the Cluster
    /// Autoscaler's status ConfigMap or a NodePool, an audit that listed them).
    pub autoscaling: Option<Arc<Autoscaling>>,
}

impl Objects {
    /// An empty set that knows it is all there is.
    pub fn complete() -> Objects {
        Objects {
            complete: true,
            ..Default::default()
        }
    }

    fn miss<T>(&self, kind: ContextKind, namespace: &str, name: &str) -> Lookup<T> {
        let key = ObjectKey {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        if self.complete || self.absent.contains(&key) {
            Lookup::Absent
        } else {
            Lookup::Unknown
        }
    }

    pub fn add_claim(&mut self, c: ResourceClaim) {
        let key = namespaced_key(&c.metadata);
        self.claims.insert(key, Arc::new(c));
    }

    pub fn add_template(&mut self, t: ResourceClaimTemplate) {
        let key = namespaced_key(&t.metadata);
        self.templates.insert(key, Arc::new(t));
    }

    pub fn add_namespace(&mut self, n: Namespace) {
        let name = n.metadata.name.clone().unwrap_or_default();
        self.namespaces.insert(name, Arc::new(n));
    }

    /// Adds a ResourceQuota: from now on the set knows every namespace's quotas (those it
    /// holds, none elsewhere).
    pub fn add_quota(&mut self, q: ResourceQuota) {
        let ns = q.metadata.namespace.clone().unwrap_or_default();
        let quotas = self.quotas.get_or_insert_with(BTreeMap::new);
        let mut list: Vec<Arc<ResourceQuota>> =
            quotas.get(&ns).map(|l| l.to_vec()).unwrap_or_default();
        list.push(Arc::new(q));
        quotas.insert(ns, list.into());
    }

    /// Says the set knows every quota there is (none, unless added).
    pub fn know_quotas(&mut self) {
        self.quotas.get_or_insert_with(BTreeMap::new);
    }

    /// The nodes: from now on the set knows them all.
    pub fn set_nodes(&mut self, nodes: Nodes) {
        self.nodes = Some(Arc::new(nodes));
    }

    /// Adds a Node (a file's): from now on the set knows every node (those it holds).
    pub fn add_node(&mut self, node: Node) {
        self.node_objects.push(node);
        self.nodes = Some(Arc::new(Nodes::of(&self.node_objects)));
    }

    /// Adds a Kueue LocalQueue or ClusterQueue (by its `kind`), as JSON: from now on the set
    /// knows them all, of both kinds (a file holds what there is). False for anything else.
    pub fn add_kueue_queue(&mut self, queue: Value) -> bool {
        let (namespace, name) = namespace_and_name(&queue);
        let kind = queue.get("kind").and_then(Value::as_str).unwrap_or("");
        if !matches!(kind, "LocalQueue" | "ClusterQueue") {
            return false;
        }
        let locals = self.local_queues.get_or_insert_with(BTreeMap::new);
        let clusters = self.cluster_queues.get_or_insert_with(Default::default);
        if kind == "LocalQueue" {
            locals.insert((namespace, name), Arc::new(queue));
        } else {
            Arc::make_mut(clusters).insert(name, Arc::new(queue));
        }
        true
    }

    /// Adds what says an autoscaler may add nodes, as JSON: the Cluster Autoscaler's status
    /// ConfigMap ([`CLUSTER_AUTOSCALER_STATUS`]) or a Karpenter NodePool
    /// ([`KARPENTER_NODEPOOL_API_VERSION`]); from now on the set knows the cluster's
    /// autoscaling. False for anything else (another ConfigMap, say).
    pub fn add_autoscaling(&mut self, object: Value) -> bool {
        let api = object.get("apiVersion").and_then(Value::as_str);
        let kind = object.get("kind").and_then(Value::as_str);
        let (namespace, name) = namespace_and_name(&object);
        let status = (namespace.as_str(), name.as_str()) == CLUSTER_AUTOSCALER_STATUS;
        let pool = match (api, kind) {
            (Some("v1"), Some("ConfigMap")) if status => false,
            (Some(KARPENTER_NODEPOOL_API_VERSION), Some("NodePool")) => true,
            _ => return false,
        };
        let a = Arc::make_mut(self.autoscaling.get_or_insert_with(Default::default));
        if pool {
            a.node_pools.push(Arc::new(object));
        } else {
            a.cluster_autoscaler = true;
        }
        true
    }

    /// Says the set knows the cluster's autoscaling: none, unless added.
    pub fn know_autoscaling(&mut self) {
        self.autoscaling.get_or_insert_with(Default::default);
    }

    /// Adds a DeviceClass's name: from now on the set knows them all.
    pub fn add_device_class(&mut self, name: String) {
        let mut all: BTreeSet<String> = self.device_classes.as_deref().cloned().unwrap_or_default();
        all.insert(name);
        self.device_classes = Some(Arc::new(all));
    }

    /// A TrainingRuntime or ClusterTrainingRuntime (by its `kind`), as JSON; false for
    /// anything else.
    pub fn add_training_runtime(&mut self, runtime: Value) -> bool {
        let (namespace, name) = namespace_and_name(&runtime);
        match runtime.get("kind").and_then(Value::as_str) {
            Some("TrainingRuntime") => {
                self.training_runtimes
                    .insert((namespace, name), Arc::new(runtime));
            }
            Some("ClusterTrainingRuntime") => {
                self.cluster_training_runtimes
                    .insert(name, Arc::new(runtime));
            }
            _ => return false,
        }
        true
    }

    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
            && self.templates.is_empty()
            && self.namespaces.is_empty()
            && self.training_runtimes.is_empty()
            && self.cluster_training_runtimes.is_empty()
            && self.absent.is_empty()
    }
}

fn namespaced_key(
    m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> (String, String) {
    (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

/// An object's `metadata.namespace` (empty for a cluster-scoped one) and `metadata.name`,
/// as JSON holds them.
pub fn namespace_and_name(object: &Value) -> (String, String) {
    let meta = |k: &str| {
        object
            .get("metadata")
            .and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    (meta("namespace"), meta("name"))
}

impl Cluster for Objects {
    fn resource_claim(&self, namespace: &str, name: &str) -> Lookup<Arc<ResourceClaim>> {
        match self.claims.get(&(namespace.to_owned(), name.to_owned())) {
            Some(c) => Lookup::Found(c.clone()),
            None => self.miss(ContextKind::ResourceClaim, namespace, name),
        }
    }
    fn resource_claim_template(
        &self,
        namespace: &str,
        name: &str,
    ) -> Lookup<Arc<ResourceClaimTemplate>> {
        match self.templates.get(&(namespace.to_owned(), name.to_owned())) {
            Some(t) => Lookup::Found(t.clone()),
            None => self.miss(ContextKind::ResourceClaimTemplate, namespace, name),
        }
    }
    fn namespace(&self, name: &str) -> Lookup<Arc<Namespace>> {
        match self.namespaces.get(name) {
            Some(n) => Lookup::Found(n.clone()),
            None => self.miss(ContextKind::Namespace, "", name),
        }
    }
    fn nodes(&self) -> Option<Lookup<Arc<Nodes>>> {
        self.nodes.clone().map(Lookup::Found)
    }
    fn resource_quotas(&self, namespace: &str) -> Option<Lookup<Arc<[Arc<ResourceQuota>]>>> {
        let quotas = self.quotas.as_ref()?;
        Some(Lookup::Found(
            quotas
                .get(namespace)
                .cloned()
                .unwrap_or_else(|| Arc::new([])),
        ))
    }
    fn device_classes(&self) -> Option<Lookup<Arc<BTreeSet<String>>>> {
        self.device_classes.clone().map(Lookup::Found)
    }
    fn kueue_local_queue(&self, namespace: &str, name: &str) -> Option<Lookup<Arc<Value>>> {
        let queues = self.local_queues.as_ref()?;
        Some(
            queues
                .get(&(namespace.to_owned(), name.to_owned()))
                .map_or(Lookup::Absent, |q| Lookup::Found(q.clone())),
        )
    }
    fn kueue_cluster_queue(&self, name: &str) -> Option<Lookup<Arc<Value>>> {
        let queues = self.cluster_queues.as_ref()?;
        Some(
            queues
                .get(name)
                .map_or(Lookup::Absent, |q| Lookup::Found(q.clone())),
        )
    }
    fn autoscaling(&self) -> Option<Lookup<Arc<Autoscaling>>> {
        self.autoscaling.clone().map(Lookup::Found)
    }
    fn is_offline(&self) -> bool {
        false
    }
    fn training_runtime(&self, namespace: &str, name: &str) -> Lookup<Arc<Value>> {
        match self
            .training_runtimes
            .get(&(namespace.to_owned(), name.to_owned()))
        {
            Some(r) => Lookup::Found(r.clone()),
            None => self.miss(ContextKind::TrainingRuntime, namespace, name),
        }
    }
    fn cluster_training_runtime(&self, name: &str) -> Lookup<Arc<Value>> {
        match self.cluster_training_runtimes.get(name) {
            Some(r) => Lookup::Found(r.clone()),
            None => self.miss(ContextKind::ClusterTrainingRuntime, "", name),
        }
    }
}

/// A [`Cluster`] in front of another: what `first` knows (found or absent) it answers,
/// and asks `then` for the rest: the objects fetched for one review in front of the
/// caches, or the Trainer runtime being judged (in no cache yet at its creation) in front
/// of the review's context. Every source is asked the same way, so a source `first` holds
/// is never hidden behind one `then` holds.
pub struct Layered<'a> {
    pub first: &'a Objects,
    pub then: &'a dyn Cluster,
}

/// `first`'s answer where it knows one, else `then`'s.
fn known_or<T>(first: Lookup<T>, then: impl FnOnce() -> Lookup<T>) -> Lookup<T> {
    match first {
        Lookup::Unknown => then(),
        known => known,
    }
}

/// [`known_or`] for what a context may not hold at all (None): `first`'s answer where it
/// knows one, else `then`'s, else `first`'s "not known yet".
fn held_or<T>(
    first: Option<Lookup<T>>,
    then: impl FnOnce() -> Option<Lookup<T>>,
) -> Option<Lookup<T>> {
    match first {
        Some(Lookup::Unknown) => then().or(Some(Lookup::Unknown)),
        None => then(),
        known => known,
    }
}

impl Cluster for Layered<'_> {
    fn resource_claim(&self, namespace: &str, name: &str) -> Lookup<Arc<ResourceClaim>> {
        known_or(self.first.resource_claim(namespace, name), || {
            self.then.resource_claim(namespace, name)
        })
    }
    fn resource_claim_template(
        &self,
        namespace: &str,
        name: &str,
    ) -> Lookup<Arc<ResourceClaimTemplate>> {
        known_or(self.first.resource_claim_template(namespace, name), || {
            self.then.resource_claim_template(namespace, name)
        })
    }
    fn namespace(&self, name: &str) -> Lookup<Arc<Namespace>> {
        known_or(self.first.namespace(name), || self.then.namespace(name))
    }
    fn training_runtime(&self, namespace: &str, name: &str) -> Lookup<Arc<Value>> {
        known_or(self.first.training_runtime(namespace, name), || {
            self.then.training_runtime(namespace, name)
        })
    }
    fn cluster_training_runtime(&self, name: &str) -> Lookup<Arc<Value>> {
        known_or(self.first.cluster_training_runtime(name), || {
            self.then.cluster_training_runtime(name)
        })
    }
    /// A set of objects is never the absence of a context: `then` says whether there is one.
    fn is_offline(&self) -> bool {
        self.then.is_offline()
    }
    fn nodes(&self) -> Option<Lookup<Arc<Nodes>>> {
        held_or(self.first.nodes(), || self.then.nodes())
    }
    fn resource_quotas(&self, namespace: &str) -> Option<Lookup<Arc<[Arc<ResourceQuota>]>>> {
        held_or(self.first.resource_quotas(namespace), || {
            self.then.resource_quotas(namespace)
        })
    }
    fn device_classes(&self) -> Option<Lookup<Arc<BTreeSet<String>>>> {
        held_or(self.first.device_classes(), || self.then.device_classes())
    }
    fn kueue_local_queue(&self, namespace: &str, name: &str) -> Option<Lookup<Arc<Value>>> {
        held_or(self.first.kueue_local_queue(namespace, name), || {
            self.then.kueue_local_queue(namespace, name)
        })
    }
    fn kueue_cluster_queue(&self, name: &str) -> Option<Lookup<Arc<Value>>> {
        held_or(self.first.kueue_cluster_queue(name), || {
            self.then.kueue_cluster_queue(name)
        })
    }
    fn autoscaling(&self) -> Option<Lookup<Arc<Autoscaling>>> {
        held_or(self.first.autoscaling(), || self.then.autoscaling())
    }
}

/// The `kueue.x-k8s.io` versions whose LocalQueues and ClusterQueues feasibility reads:
/// the fields it reads (`spec.clusterQueue`, `spec.resourceGroups`) are the same in each,
/// and the cohort is `spec.cohort` or `spec.cohortName` (v1beta2).
pub const KUEUE_API_VERSIONS: [&str; 3] = [
    "kueue.x-k8s.io/v1",
    "kueue.x-k8s.io/v1beta2",
    "kueue.x-k8s.io/v1beta1",
];

/// The `resource.k8s.io` versions a 1.33-1.37 apiserver serves ResourceClaims and
/// ResourceClaimTemplates in, newest first; each is read as v1.
pub const DRA_API_VERSIONS: [&str; 3] = [
    "resource.k8s.io/v1",
    "resource.k8s.io/v1beta2",
    "resource.k8s.io/v1beta1",
];

/// A ResourceClaim written in any served version, as v1.
pub fn claim_from(object: &Value) -> Result<ResourceClaim, String> {
    serde_json::from_value(as_v1(object, "/spec/devices/requests")?).map_err(|e| e.to_string())
}

/// A ResourceClaimTemplate written in any served version, as v1.
pub fn claim_template_from(object: &Value) -> Result<ResourceClaimTemplate, String> {
    serde_json::from_value(as_v1(object, "/spec/spec/devices/requests")?).map_err(|e| e.to_string())
}

/// The fields of a v1beta1 device request that v1beta2 and v1 keep under `exactly`.
const EXACT_FIELDS: [&str; 7] = [
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
];

/// `object` in `resource.k8s.io/v1`, as the apiserver converts it
/// (`pkg/apis/resource/v1beta1/conversion.go`): v1beta2 has v1's shape; a v1beta1 device
/// request keeps its class, selectors, count and the rest on the request itself, which v1
/// moves under `exactly` when any is set (`firstAvailable` stays as it is). `requests`
/// points at the device requests.
fn as_v1(object: &Value, requests: &str) -> Result<Value, String> {
    let api = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !DRA_API_VERSIONS.contains(&api) {
        return Err(format!(
            "apiVersion {api:?} is not one of {}",
            DRA_API_VERSIONS.join(", ")
        ));
    }
    let mut v = object.clone();
    v["apiVersion"] = Value::from(DRA_API_VERSIONS[0]);
    if api == "resource.k8s.io/v1beta1" {
        for r in v
            .pointer_mut(requests)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let Value::Object(r) = r else { continue };
            let exact: Map<String, Value> = EXACT_FIELDS
                .iter()
                .filter_map(|k| r.remove(*k).map(|v| ((*k).to_owned(), v)))
                .collect();
            if !exact.is_empty() {
                r.insert("exactly".into(), Value::Object(exact));
            }
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_of_every_served_version_are_read_as_v1() {
        let v1beta1 = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "two-gpus"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpus", "deviceClassName": "gpu.nvidia.com", "count": 2},
                {"name": "any", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.nvidia.com"}]}
            ]}}}
        });
        let t = claim_template_from(&v1beta1).unwrap();
        let requests = t.spec.spec.devices.unwrap().requests.unwrap();
        let exactly = requests[0].exactly.as_ref().unwrap();
        assert_eq!(exactly.device_class_name, "gpu.nvidia.com");
        assert_eq!(exactly.count, Some(2));
        assert!(requests[1].exactly.is_none());
        assert_eq!(requests[1].first_available.as_ref().unwrap()[0].name, "big");

        let mut v1beta2 = v1beta1.clone();
        v1beta2["apiVersion"] = "resource.k8s.io/v1beta2".into();
        v1beta2["spec"]["spec"]["devices"]["requests"] = serde_json::json!([
            {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}
        ]);
        let t = claim_template_from(&v1beta2).unwrap();
        let requests = t.spec.spec.devices.unwrap().requests.unwrap();
        assert_eq!(requests[0].exactly.as_ref().unwrap().count, Some(2));

        let claim = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "g", "deviceClassName": "mig.nvidia.com"}]}}
        });
        let c = claim_from(&claim).unwrap();
        let requests = c.spec.devices.unwrap().requests.unwrap();
        assert_eq!(
            requests[0].exactly.as_ref().unwrap().device_class_name,
            "mig.nvidia.com"
        );

        let mut other = v1beta1;
        other["apiVersion"] = "resource.k8s.io/v1alpha3".into();
        assert!(claim_template_from(&other)
            .unwrap_err()
            .contains("v1alpha3"));
    }
}

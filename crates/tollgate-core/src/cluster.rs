//! What a review may know about other objects in the cluster: the ResourceClaims and
//! ResourceClaimTemplates a pod's GPUs come through, the Namespaces policy profiles
//! match on, and the TrainingRuntimes and ClusterTrainingRuntimes a Kubeflow TrainJob's
//! pods are made from (as JSON: tollgate reads only their JobSet template).
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

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use serde_json::Value;

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
pub enum Kind {
    ResourceClaim,
    ResourceClaimTemplate,
    Namespace,
    /// `trainer.kubeflow.org/v1alpha1`, namespaced.
    TrainingRuntime,
    /// `trainer.kubeflow.org/v1alpha1`, cluster-scoped.
    ClusterTrainingRuntime,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::ResourceClaim => "ResourceClaim",
            Kind::ResourceClaimTemplate => "ResourceClaimTemplate",
            Kind::Namespace => "Namespace",
            Kind::TrainingRuntime => "TrainingRuntime",
            Kind::ClusterTrainingRuntime => "ClusterTrainingRuntime",
        }
    }
}

/// An object a review asked about and could not be told of.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub kind: Kind,
    /// Empty for a Namespace and a ClusterTrainingRuntime.
    pub namespace: String,
    pub name: String,
}

/// What a review may ask of the cluster. Every method answers at once, from memory.
pub trait Cluster {
    fn resource_claim(&self, namespace: &str, name: &str) -> Lookup<Arc<ResourceClaim>>;
    fn resource_claim_template(
        &self,
        namespace: &str,
        name: &str,
    ) -> Lookup<Arc<ResourceClaimTemplate>>;
    fn namespace(&self, name: &str) -> Lookup<Arc<Namespace>>;

    /// A Kubeflow Trainer TrainingRuntime, as its JSON. Not known, unless the context
    /// holds runtimes.
    fn training_runtime(&self, namespace: &str, name: &str) -> Lookup<Arc<Value>> {
        let _ = (namespace, name);
        Lookup::Unknown
    }

    /// A Kubeflow Trainer ClusterTrainingRuntime, as its JSON.
    fn cluster_training_runtime(&self, name: &str) -> Lookup<Arc<Value>> {
        let _ = name;
        Lookup::Unknown
    }

    /// True when there is no cluster context at all (`--cluster-context off`): messages
    /// then say so rather than blame the object.
    fn is_offline(&self) -> bool {
        false
    }
}

/// No cluster context at all: every object is unknown.
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
    fn is_offline(&self) -> bool {
        true
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
}

impl Objects {
    /// An empty set that knows it is all there is.
    pub fn complete() -> Objects {
        Objects {
            complete: true,
            ..Default::default()
        }
    }

    fn miss<T>(&self, kind: Kind, namespace: &str, name: &str) -> Lookup<T> {
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

    /// A TrainingRuntime or ClusterTrainingRuntime (by its `kind`), as JSON; false for
    /// anything else.
    pub fn add_training_runtime(&mut self, runtime: Value) -> bool {
        let meta = |k: &str| {
            runtime
                .pointer(&format!("/metadata/{k}"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (namespace, name) = (meta("namespace"), meta("name"));
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

impl Cluster for Objects {
    fn resource_claim(&self, namespace: &str, name: &str) -> Lookup<Arc<ResourceClaim>> {
        match self.claims.get(&(namespace.to_owned(), name.to_owned())) {
            Some(c) => Lookup::Found(c.clone()),
            None => self.miss(Kind::ResourceClaim, namespace, name),
        }
    }
    fn resource_claim_template(
        &self,
        namespace: &str,
        name: &str,
    ) -> Lookup<Arc<ResourceClaimTemplate>> {
        match self.templates.get(&(namespace.to_owned(), name.to_owned())) {
            Some(t) => Lookup::Found(t.clone()),
            None => self.miss(Kind::ResourceClaimTemplate, namespace, name),
        }
    }
    fn namespace(&self, name: &str) -> Lookup<Arc<Namespace>> {
        match self.namespaces.get(name) {
            Some(n) => Lookup::Found(n.clone()),
            None => self.miss(Kind::Namespace, "", name),
        }
    }
    fn training_runtime(&self, namespace: &str, name: &str) -> Lookup<Arc<Value>> {
        match self
            .training_runtimes
            .get(&(namespace.to_owned(), name.to_owned()))
        {
            Some(r) => Lookup::Found(r.clone()),
            None => self.miss(Kind::TrainingRuntime, namespace, name),
        }
    }
    fn cluster_training_runtime(&self, name: &str) -> Lookup<Arc<Value>> {
        match self.cluster_training_runtimes.get(name) {
            Some(r) => Lookup::Found(r.clone()),
            None => self.miss(Kind::ClusterTrainingRuntime, "", name),
        }
    }
}

/// A [`Cluster`] in front of another: what `first` knows (found or absent) it answers,
/// and asks `then` for the rest: the objects fetched for one review, in front of the
/// caches.
pub struct Layered<'a> {
    pub first: &'a Objects,
    pub then: &'a dyn Cluster,
}

impl Cluster for Layered<'_> {
    fn resource_claim(&self, namespace: &str, name: &str) -> Lookup<Arc<ResourceClaim>> {
        match self.first.resource_claim(namespace, name) {
            Lookup::Unknown => self.then.resource_claim(namespace, name),
            known => known,
        }
    }
    fn resource_claim_template(
        &self,
        namespace: &str,
        name: &str,
    ) -> Lookup<Arc<ResourceClaimTemplate>> {
        match self.first.resource_claim_template(namespace, name) {
            Lookup::Unknown => self.then.resource_claim_template(namespace, name),
            known => known,
        }
    }
    fn namespace(&self, name: &str) -> Lookup<Arc<Namespace>> {
        match self.first.namespace(name) {
            Lookup::Unknown => self.then.namespace(name),
            known => known,
        }
    }
    fn training_runtime(&self, namespace: &str, name: &str) -> Lookup<Arc<Value>> {
        match self.first.training_runtime(namespace, name) {
            Lookup::Unknown => self.then.training_runtime(namespace, name),
            known => known,
        }
    }
    fn cluster_training_runtime(&self, name: &str) -> Lookup<Arc<Value>> {
        match self.first.cluster_training_runtime(name) {
            Lookup::Unknown => self.then.cluster_training_runtime(name),
            known => known,
        }
    }
}

//! The cluster context fed by watches: ResourceClaims, ResourceClaimTemplates and
//! DeviceClasses (`dra.rs`: in the version the cluster serves), Namespaces, Nodes (by shape:
//! `nodes.rs`), ResourceQuotas (by namespace: `quotas.rs`), Kubeflow Trainer's
//! TrainingRuntimes and ClusterTrainingRuntimes, Kueue's LocalQueues and ClusterQueues
//! (`kueue.rs`: in the version the cluster serves), and what may add nodes (the Cluster
//! Autoscaler's status ConfigMap, by name, and Karpenter's NodePools where served), each fed
//! by a kube watcher through `cache::drive`.
//!
//! - Reviews read the caches and never wait on them. A claim, template, namespace or
//!   runtime that a cache has not synced yet, or does not hold, answers "unknown", and the
//!   review's handler calls [`ClusterContext::fetch`]: one GET per object, all at once,
//!   bounded by `--cluster-fetch-timeout-ms`. What a GET found is kept for a minute (the
//!   watch catches up meanwhile), what it found absent for five seconds, so that 64 pods of
//!   one Job do not fetch one template 64 times. Nodes, quotas, DeviceClasses and Kueue's
//!   queues are never fetched: until their caches sync, feasibility says it could not check
//!   them.
//! - A broken watch keeps the last state: kube's watcher retries with backoff (and relists
//!   after a 410), and a cache is only replaced once a relist is complete. Each failure is
//!   logged and counted; [`ResourceStatus`] says how far behind the cluster each cache may
//!   be.
//! - Stored objects are trimmed to what reviews read: no managedFields, no claim status,
//!   a node's shape only, a quota's spec and `status.used`, a DeviceClass's name.
//! - What the cluster does not serve (404: no DRA at all, no Kubeflow Trainer, no Kueue) is "not
//!   served": logged once, no metric series, not waited for; the watch (or discovery, for
//!   DRA) keeps retrying so that it is picked up once it is. What the RBAC forbids (403)
//!   keeps its series and its warnings (the stale alert fires), and readiness stops
//!   waiting for it where tollgate can do without it: nodes, quotas, DeviceClasses and
//!   Kueue's queues (feasibility then says nothing of them), not claims, templates or namespaces, which
//!   decide what a pod is given. Readiness never waits for the runtimes: before their
//!   caches sync, a TrainJob's runtime is fetched like any object the caches do not hold,
//!   and one tollgate cannot know is a warning, never a refusal.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ResourceQuota};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use tokio::task::JoinHandle;
use tracing::warn;

use super::cache::{
    drive, Health, Readiness, Reflected, Sink, FETCH_ABSENT, FETCH_FAILED, FETCH_FOUND, PAGE_SIZE,
};
use super::dra::{self, ClassSink, Discovery, Raw};
use super::kueue::{self, QueueSink, Queues, KUEUE_API_VERSIONS};
use super::nodes::{NodeSink, NodeView};
use super::objects::PolicyObjects;
use super::pages;
use super::quotas::{self, QuotaSink};
use super::{BoxFuture, ClusterContext, ResourceStatus};
use tollgate_core::{
    claim_from, claim_template_from, Autoscaling, Cluster, ContextKind, Lookup, Nodes, ObjectKey,
    Objects, CLUSTER_AUTOSCALER_STATUS, KARPENTER_NODEPOOL_API_VERSION,
};

/// How long an object a GET found is used before the watch must have it.
const FOUND_TTL: Duration = Duration::from_secs(60);
/// How long "a GET found nothing" holds: a claim applied a moment later must still be seen.
const ABSENT_TTL: Duration = Duration::from_secs(5);

/// Tuning of the watched context.
#[derive(Debug, Clone)]
pub struct Options {
    /// Bound of one review's fetch of the objects the caches did not hold.
    pub fetch_timeout: Duration,
}

/// What reviews said when a DRA resource is not served.
const NO_DRA: &str = "the cluster serves no resource.k8s.io version tollgate reads (v1, v1beta2, v1beta1): no pod there claims devices, and discovery is asked again every 5 minutes";
const NO_TRAINER: &str = "Kubeflow Trainer is not installed; TrainJobs naming a runtime are allowed with a warning until it is";
const NO_FEASIBILITY: &str = "feasibility says nothing of it until it does";
const NO_POLICY_OBJECTS: &str = "the tollgate.dev CRDs (TollgatePolicy, TollgateProfile) are not installed: the policy file (or the built-in policy) is in force alone, and the watch keeps retrying";
const NO_KUEUE: &str = "the cluster serves no kueue.x-k8s.io version tollgate reads (v1, v1beta2, v1beta1): workloads are held to their namespace's ResourceQuotas, and discovery is asked again every 5 minutes";
const NO_AUTOSCALER_STATUS: &str = "whether the Cluster Autoscaler runs is not known: a pod no node can run now is a warning, not a refusal, until it is";
const NO_KARPENTER: &str = "the cluster serves no karpenter.sh/v1 NodePools: no Karpenter adds nodes, and discovery is asked again every 5 minutes";

/// The caches' health, one per watch.
struct Healths {
    claims: Arc<Health>,
    templates: Arc<Health>,
    namespaces: Arc<Health>,
    nodes: Arc<Health>,
    quotas: Arc<Health>,
    classes: Arc<Health>,
    runtimes: Arc<Health>,
    cluster_runtimes: Arc<Health>,
    local_queues: Arc<Health>,
    cluster_queues: Arc<Health>,
    policies: Arc<Health>,
    profiles: Arc<Health>,
    autoscaler_status: Arc<Health>,
    node_pools: Arc<Health>,
}

impl Healths {
    fn new() -> Healths {
        let [claims, templates, namespaces, nodes, quotas, classes, runtimes, cluster_runtimes, local_queues, cluster_queues, policies, profiles, autoscaler_status, node_pools] =
            super::RESOURCES;
        let h = |r, readiness, note| Arc::new(Health::new(r, readiness, note));
        Healths {
            claims: h(claims, Readiness::UnlessNotServed, NO_DRA),
            templates: h(templates, Readiness::UnlessNotServed, NO_DRA),
            namespaces: h(namespaces, Readiness::Always, ""),
            nodes: h(nodes, Readiness::UnlessUnavailable, NO_FEASIBILITY),
            quotas: h(quotas, Readiness::UnlessUnavailable, NO_FEASIBILITY),
            classes: h(classes, Readiness::UnlessUnavailable, NO_DRA),
            runtimes: h(runtimes, Readiness::Never, NO_TRAINER),
            cluster_runtimes: h(cluster_runtimes, Readiness::Never, NO_TRAINER),
            local_queues: h(local_queues, Readiness::UnlessUnavailable, NO_KUEUE),
            cluster_queues: h(cluster_queues, Readiness::UnlessUnavailable, NO_KUEUE),
            policies: h(policies, Readiness::UnlessUnavailable, NO_POLICY_OBJECTS),
            profiles: h(profiles, Readiness::UnlessUnavailable, NO_POLICY_OBJECTS),
            autoscaler_status: h(
                autoscaler_status,
                Readiness::UnlessUnavailable,
                NO_AUTOSCALER_STATUS,
            ),
            node_pools: h(node_pools, Readiness::UnlessUnavailable, NO_KARPENTER),
        }
    }

    /// In the order of [`super::RESOURCES`].
    fn all(&self) -> [&Arc<Health>; 14] {
        [
            &self.claims,
            &self.templates,
            &self.namespaces,
            &self.nodes,
            &self.quotas,
            &self.classes,
            &self.runtimes,
            &self.cluster_runtimes,
            &self.local_queues,
            &self.cluster_queues,
            &self.policies,
            &self.profiles,
            &self.autoscaler_status,
            &self.node_pools,
        ]
    }

    fn of(&self, kind: ContextKind) -> &Health {
        match kind {
            ContextKind::ResourceClaim => &self.claims,
            ContextKind::ResourceClaimTemplate => &self.templates,
            ContextKind::Namespace => &self.namespaces,
            ContextKind::TrainingRuntime => &self.runtimes,
            ContextKind::ClusterTrainingRuntime => &self.cluster_runtimes,
        }
    }
}

/// The caches and what serves them.
pub struct Watched {
    client: Client,
    claims: Store<ResourceClaim>,
    templates: Store<ResourceClaimTemplate>,
    namespaces: Store<Namespace>,
    training_runtimes: Store<Runtime<Namespaced>>,
    cluster_training_runtimes: Store<Runtime<ClusterScoped>>,
    nodes: Arc<ArcSwap<Nodes>>,
    quotas: Arc<RwLock<quotas::ByNamespace>>,
    device_classes: Arc<ArcSwap<BTreeSet<String>>>,
    local_queues: Arc<ArcSwap<Queues>>,
    cluster_queues: Arc<ArcSwap<Queues>>,
    /// The Cluster Autoscaler's status ConfigMap, its metadata only (the store holds it or
    /// nothing).
    autoscaler_status: Store<PartialObjectMeta<ConfigMap>>,
    /// Karpenter's NodePools, without status.
    node_pools: Arc<ArcSwap<Queues>>,
    /// The DRA version the cluster serves, for the fetches.
    dra: Arc<Discovery>,
    health: Healths,
    /// The TollgatePolicy and TollgateProfiles, for the server's composer.
    policy_objects: Arc<PolicyObjects>,
    recent: Mutex<Recent>,
    options: Options,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Objects fetched by GET, until the watch has them.
#[derive(Default)]
struct Recent {
    found: HashMap<ObjectKey, (Instant, Fetched)>,
    absent: HashMap<ObjectKey, Instant>,
}

#[derive(Clone)]
enum Fetched {
    Claim(Arc<ResourceClaim>),
    Template(Arc<ResourceClaimTemplate>),
    Namespace(Arc<Namespace>),
    Runtime(Arc<Value>),
}

/// A claim as the cache keeps it: v1, without its status (allocations, reservations).
fn claim(v: &Value) -> Result<ResourceClaim, String> {
    claim_from(v).map(|mut c| {
        c.status = None;
        c
    })
}

/// A watch of `api` into `sink`, each object changed by `trim` first, on its own task.
fn spawn_watch<K, S>(
    api: Api<K>,
    health: &Arc<Health>,
    mut sink: S,
    trim: fn(&mut K),
) -> JoinHandle<()>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    S: Sink<K> + 'static,
{
    let health = health.clone();
    tokio::spawn(async move {
        let stream = watcher(api.clone(), watcher::Config::default().page_size(PAGE_SIZE))
            .default_backoff()
            .modify(move |o: &mut K| {
                o.managed_fields_mut().clear();
                trim(o);
            });
        drive(stream, &health, &mut sink, &api, false).await;
    })
}

/// A reflector's store of `api`, fed on its own task.
fn reflect<K>(api: Api<K>, health: &Arc<Health>, trim: fn(&mut K)) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let sink = Reflected::new();
    let store = sink.store();
    (store, spawn_watch(api, health, sink, trim))
}

/// A reflector's store of a DRA resource, fed on its own task in the served version.
fn reflect_dra<K>(
    client: &Client,
    discovery: &Arc<Discovery>,
    what: dra::Watch<K>,
    health: &Arc<Health>,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let sink = Reflected::new();
    let store = sink.store();
    let task = tokio::spawn(dra::run(
        client.clone(),
        discovery.clone(),
        what,
        health.clone(),
        sink,
    ));
    (store, task)
}

/// A Kubeflow Trainer runtime as the caches keep it: its metadata for the store, and its
/// JSON (without managedFields) for the engine, which reads only its JobSet template.
#[derive(Clone, Debug)]
pub struct Runtime<S> {
    metadata: ObjectMeta,
    json: Arc<Value>,
    scope: PhantomData<S>,
}

/// Which of the two runtime resources.
pub trait RuntimeScope: Clone + Debug + Send + Sync + 'static {
    const KIND: &'static str;
    const PLURAL: &'static str;
    type Scope;
}

/// `TrainingRuntime`, namespaced.
#[derive(Clone, Debug)]
pub struct Namespaced;

/// `ClusterTrainingRuntime`.
#[derive(Clone, Debug)]
pub struct ClusterScoped;

impl RuntimeScope for Namespaced {
    const KIND: &'static str = "TrainingRuntime";
    const PLURAL: &'static str = "trainingruntimes";
    type Scope = kube::core::NamespaceResourceScope;
}

impl RuntimeScope for ClusterScoped {
    const KIND: &'static str = "ClusterTrainingRuntime";
    const PLURAL: &'static str = "clustertrainingruntimes";
    type Scope = kube::core::ClusterResourceScope;
}

impl<S: RuntimeScope> Resource for Runtime<S> {
    type DynamicType = ();
    type Scope = S::Scope;
    fn kind(_: &()) -> Cow<'_, str> {
        S::KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        tollgate_core::TRAINER_GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1alpha1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        S::PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<'de, S: RuntimeScope> Deserialize<'de> for Runtime<S> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut json = Value::deserialize(d)?;
        if let Some(o) = json.as_object_mut() {
            // List items may come without their kind; the engine tells the two by it.
            o.insert("kind".into(), S::KIND.into());
            if let Some(Value::Object(m)) = o.get_mut("metadata") {
                m.remove("managedFields");
            }
        }
        let metadata = match json.get("metadata") {
            Some(m) => ObjectMeta::deserialize(m).map_err(serde::de::Error::custom)?,
            None => ObjectMeta::default(),
        };
        Ok(Runtime {
            metadata,
            json: Arc::new(json),
            scope: PhantomData,
        })
    }
}

impl Watched {
    /// Starts the watches (they run until the context is dropped). Must be called inside
    /// a Tokio runtime.
    pub fn start(client: Client, options: Options) -> Watched {
        let health = Healths::new();
        let discovery = Arc::new(Discovery::new(client.clone()));
        let (claims, t1) = reflect_dra(
            &client,
            &discovery,
            dra::Watch {
                kind: "ResourceClaim",
                plural: "resourceclaims",
                convert: claim,
            },
            &health.claims,
        );
        let (templates, t2) = reflect_dra(
            &client,
            &discovery,
            dra::Watch {
                kind: "ResourceClaimTemplate",
                plural: "resourceclaimtemplates",
                convert: claim_template_from,
            },
            &health.templates,
        );
        let (namespaces, t3) = reflect(
            Api::<Namespace>::all(client.clone()),
            &health.namespaces,
            |n: &mut Namespace| n.status = None,
        );
        let nodes = Arc::new(ArcSwap::from_pointee(Nodes::default()));
        // Its list read node by node as it arrives (`pages::watch`), never a page whole: a
        // page of nodes is 25 KB of JSON a node, and what a review needs of one is a few
        // hundred bytes.
        let t4 = {
            let api = Api::<NodeView>::all(client.clone());
            let health = health.nodes.clone();
            let mut sink = NodeSink::new(nodes.clone());
            tokio::spawn(async move {
                let stream = pages::watch(api.clone(), PAGE_SIZE).default_backoff();
                drive(stream, &health, &mut sink, &api, false).await;
            })
        };
        let quotas = Arc::new(RwLock::new(quotas::ByNamespace::new()));
        let t5 = spawn_watch(
            Api::<ResourceQuota>::all(client.clone()),
            &health.quotas,
            QuotaSink::new(quotas.clone()),
            quotas::trim,
        );
        let device_classes = Arc::new(ArcSwap::from_pointee(BTreeSet::new()));
        let t6 = tokio::spawn(dra::run(
            client.clone(),
            discovery.clone(),
            dra::Watch {
                kind: "DeviceClass",
                plural: "deviceclasses",
                convert: dra::class_name,
            },
            health.classes.clone(),
            ClassSink::new(device_classes.clone()),
        ));
        let (training_runtimes, t7) = reflect(
            Api::<Runtime<Namespaced>>::all(client.clone()),
            &health.runtimes,
            |_: &mut Runtime<Namespaced>| {},
        );
        let (cluster_training_runtimes, t8) = reflect(
            Api::<Runtime<ClusterScoped>>::all(client.clone()),
            &health.cluster_runtimes,
            |_: &mut Runtime<ClusterScoped>| {},
        );
        let kueue_versions = Arc::new(Discovery::of(client.clone(), &KUEUE_API_VERSIONS));
        let queues = |kind, plural, health: &Arc<Health>| {
            let published = Arc::new(ArcSwap::from_pointee(Queues::new()));
            let task = tokio::spawn(dra::run(
                client.clone(),
                kueue_versions.clone(),
                dra::Watch {
                    kind,
                    plural,
                    convert: kueue::queue,
                },
                health.clone(),
                QueueSink::new(published.clone()),
            ));
            (published, task)
        };
        let (local_queues, t9) = queues("LocalQueue", "localqueues", &health.local_queues);
        let (cluster_queues, t10) = queues("ClusterQueue", "clusterqueues", &health.cluster_queues);
        let policy_objects = Arc::new(PolicyObjects::new([
            health.policies.clone(),
            health.profiles.clone(),
        ]));
        // The Cluster Autoscaler's status ConfigMap, by name (the RBAC grants that one
        // ConfigMap of kube-system, no other), its metadata only: that it exists is all
        // feasibility reads, whatever its format.
        let (autoscaler_status, t11) = {
            let (namespace, name) = CLUSTER_AUTOSCALER_STATUS;
            let api = Api::<PartialObjectMeta<ConfigMap>>::namespaced(client.clone(), namespace);
            let sink = Reflected::new();
            let store = sink.store();
            let health = health.autoscaler_status.clone();
            let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
            let task = tokio::spawn(async move {
                let mut sink = sink;
                let stream = watcher(api.clone(), config)
                    .default_backoff()
                    .modify(|o: &mut PartialObjectMeta<ConfigMap>| o.managed_fields_mut().clear());
                drive(stream, &health, &mut sink, &api, false).await;
            });
            (store, task)
        };
        let karpenter = Arc::new(Discovery::of(
            client.clone(),
            &[KARPENTER_NODEPOOL_API_VERSION],
        ));
        let node_pools = Arc::new(ArcSwap::from_pointee(Queues::new()));
        let t12 = tokio::spawn(dra::run(
            client.clone(),
            karpenter,
            dra::Watch {
                kind: "NodePool",
                plural: "nodepools",
                convert: kueue::queue,
            },
            health.node_pools.clone(),
            QueueSink::new(node_pools.clone()),
        ));
        let mut tasks = vec![t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12];
        tasks.extend(policy_objects.start(&client));
        Watched {
            client,
            claims,
            templates,
            namespaces,
            training_runtimes,
            cluster_training_runtimes,
            nodes,
            quotas,
            device_classes,
            local_queues,
            cluster_queues,
            autoscaler_status,
            node_pools,
            dra: discovery,
            health,
            policy_objects,
            recent: Mutex::new(Recent::default()),
            options,
            tasks,
        }
    }

    /// A runtime from its store, else what a recent GET learnt, else unknown.
    fn lookup_runtime<S: RuntimeScope>(
        &self,
        store: &Store<Runtime<S>>,
        kind: ContextKind,
        namespace: &str,
        name: &str,
    ) -> Lookup<Arc<Value>> {
        match self.lookup(store, kind, namespace, name, |_| None) {
            Lookup::Found(r) => Lookup::Found(r.json.clone()),
            Lookup::Absent => Lookup::Absent,
            Lookup::Unknown => {
                let key = ObjectKey {
                    kind,
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                };
                match self.recent_found(&key) {
                    Some(Fetched::Runtime(r)) => Lookup::Found(r),
                    _ => Lookup::Unknown,
                }
            }
        }
    }

    fn recent_found(&self, key: &ObjectKey) -> Option<Fetched> {
        let recent = self.recent.lock().ok()?;
        let (at, f) = recent.found.get(key)?;
        (at.elapsed() < FOUND_TTL).then(|| f.clone())
    }

    fn recent_absent(&self, key: &ObjectKey) -> bool {
        self.recent.lock().is_ok_and(|r| {
            r.absent
                .get(key)
                .is_some_and(|at| at.elapsed() < ABSENT_TTL)
        })
    }

    /// A store's answer, else what a recent GET learnt, else unknown.
    fn lookup<K>(
        &self,
        store: &Store<K>,
        kind: ContextKind,
        namespace: &str,
        name: &str,
        from_fetched: impl Fn(Fetched) -> Option<Arc<K>>,
    ) -> Lookup<Arc<K>>
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let mut r = ObjectRef::<K>::new(name);
        if !namespace.is_empty() {
            r = r.within(namespace);
        }
        if let Some(o) = store.get(&r) {
            return Lookup::Found(o);
        }
        let key = ObjectKey {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        if let Some(o) = self.recent_found(&key).and_then(from_fetched) {
            return Lookup::Found(o);
        }
        if self.recent_absent(&key) {
            return Lookup::Absent;
        }
        Lookup::Unknown
    }

    /// A DRA object by GET, in the version the cluster serves: none where it serves no
    /// version (then nothing of it can exist).
    async fn fetch_dra<K>(
        &self,
        kind: &str,
        plural: &str,
        namespace: &str,
        name: &str,
        convert: fn(&Value) -> Result<K, String>,
    ) -> Result<Option<K>, String> {
        let version = match self.dra.known() {
            Some(Some(v)) => v,
            Some(None) => return Ok(None),
            None => {
                return Err(format!(
                    "the cluster's {} version is not known yet",
                    dra::GROUP
                ))
            }
        };
        let ar = dra::resource(version, kind, plural);
        let found = Api::<Raw>::namespaced_with(self.client.clone(), namespace, &ar)
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())?;
        found.map(|r| r.read(version, convert)).transpose()
    }

    async fn fetch_one(&self, key: &ObjectKey) -> Result<Option<Fetched>, String> {
        let (ns, name) = (key.namespace.as_str(), key.name.as_str());
        let kube = |e: kube::Error| e.to_string();
        match key.kind {
            ContextKind::ResourceClaim => self
                .fetch_dra("ResourceClaim", "resourceclaims", ns, name, claim)
                .await
                .map(|o| o.map(|o| Fetched::Claim(Arc::new(o)))),
            ContextKind::ResourceClaimTemplate => self
                .fetch_dra(
                    "ResourceClaimTemplate",
                    "resourceclaimtemplates",
                    ns,
                    name,
                    claim_template_from,
                )
                .await
                .map(|o| o.map(|o| Fetched::Template(Arc::new(o)))),
            ContextKind::Namespace => Api::<Namespace>::all(self.client.clone())
                .get_opt(name)
                .await
                .map(|o| o.map(|o| Fetched::Namespace(Arc::new(o))))
                .map_err(kube),
            ContextKind::TrainingRuntime => {
                Api::<Runtime<Namespaced>>::namespaced(self.client.clone(), ns)
                    .get_opt(name)
                    .await
                    .map(|o| o.map(|o| Fetched::Runtime(o.json)))
                    .map_err(kube)
            }
            ContextKind::ClusterTrainingRuntime => {
                Api::<Runtime<ClusterScoped>>::all(self.client.clone())
                    .get_opt(name)
                    .await
                    .map(|o| o.map(|o| Fetched::Runtime(o.json)))
                    .map_err(kube)
            }
        }
    }
}

impl Cluster for Watched {
    fn resource_claim(&self, namespace: &str, name: &str) -> Lookup<Arc<ResourceClaim>> {
        self.lookup(
            &self.claims,
            ContextKind::ResourceClaim,
            namespace,
            name,
            |f| match f {
                Fetched::Claim(c) => Some(c),
                _ => None,
            },
        )
    }

    fn resource_claim_template(
        &self,
        namespace: &str,
        name: &str,
    ) -> Lookup<Arc<ResourceClaimTemplate>> {
        self.lookup(
            &self.templates,
            ContextKind::ResourceClaimTemplate,
            namespace,
            name,
            |f| match f {
                Fetched::Template(t) => Some(t),
                _ => None,
            },
        )
    }

    fn namespace(&self, name: &str) -> Lookup<Arc<Namespace>> {
        self.lookup(
            &self.namespaces,
            ContextKind::Namespace,
            "",
            name,
            |f| match f {
                Fetched::Namespace(n) => Some(n),
                _ => None,
            },
        )
    }

    fn training_runtime(&self, namespace: &str, name: &str) -> Lookup<Arc<Value>> {
        self.lookup_runtime(
            &self.training_runtimes,
            ContextKind::TrainingRuntime,
            namespace,
            name,
        )
    }

    fn cluster_training_runtime(&self, name: &str) -> Lookup<Arc<Value>> {
        self.lookup_runtime(
            &self.cluster_training_runtimes,
            ContextKind::ClusterTrainingRuntime,
            "",
            name,
        )
    }

    fn nodes(&self) -> Option<Lookup<Arc<Nodes>>> {
        self.health.nodes.known(|| self.nodes.load_full())
    }

    fn resource_quotas(&self, namespace: &str) -> Option<Lookup<Arc<[Arc<ResourceQuota>]>>> {
        self.health.quotas.known(|| {
            self.quotas
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(namespace)
                .cloned()
                .unwrap_or_else(|| Arc::new([]))
        })
    }

    fn device_classes(&self) -> Option<Lookup<Arc<BTreeSet<String>>>> {
        self.health
            .classes
            .known(|| self.device_classes.load_full())
    }

    fn kueue_local_queue(&self, namespace: &str, name: &str) -> Option<Lookup<Arc<Value>>> {
        queue(
            &self.health.local_queues,
            &self.local_queues,
            namespace,
            name,
        )
    }

    fn kueue_cluster_queue(&self, name: &str) -> Option<Lookup<Arc<Value>>> {
        queue(&self.health.cluster_queues, &self.cluster_queues, "", name)
    }

    /// Unknown while either source has not synced, or the RBAC forbids reading it: a pod no
    /// node can run now is not refused for what tollgate cannot see. A cluster that serves
    /// no NodePools has no Karpenter.
    fn autoscaling(&self) -> Option<Lookup<Arc<Autoscaling>>> {
        let (ca, pools) = (&self.health.autoscaler_status, &self.health.node_pools);
        let forbidden = |h: &Health| h.is_served() && h.is_forbidden();
        if forbidden(ca) || forbidden(pools) {
            return Some(Lookup::Unknown);
        }
        let status = ca.known(|| !self.autoscaler_status.is_empty());
        let pools = pools.known(|| self.node_pools.load_full());
        let mut out = Autoscaling::default();
        match status {
            Some(Lookup::Found(present)) => out.cluster_autoscaler = present,
            Some(_) => return Some(Lookup::Unknown),
            None => {}
        }
        match pools {
            Some(Lookup::Found(p)) => out.node_pools = p.values().cloned().collect(),
            Some(_) => return Some(Lookup::Unknown),
            None => {}
        }
        Some(Lookup::Found(Arc::new(out)))
    }

    fn is_offline(&self) -> bool {
        false
    }
}

/// A queue from its cache: None while the cluster serves no Kueue (or the RBAC forbids
/// reading it), unknown before the cache has synced, else found or absent.
fn queue(
    health: &Health,
    queues: &ArcSwap<Queues>,
    namespace: &str,
    name: &str,
) -> Option<Lookup<Arc<Value>>> {
    let key = (namespace.to_owned(), name.to_owned());
    Some(match health.known(|| queues.load().get(&key).cloned())? {
        Lookup::Found(Some(q)) => Lookup::Found(q),
        Lookup::Found(None) | Lookup::Absent => Lookup::Absent,
        Lookup::Unknown => Lookup::Unknown,
    })
}

impl ClusterContext for Watched {
    fn fetch<'a>(&'a self, keys: &'a [ObjectKey]) -> BoxFuture<'a, Objects> {
        Box::pin(async move {
            let mut wanted: Vec<&ObjectKey> = keys.iter().collect();
            wanted.sort();
            wanted.dedup();
            let all = futures::future::join_all(wanted.iter().map(|k| self.fetch_one(k)));
            let results = match tokio::time::timeout(self.options.fetch_timeout, all).await {
                Ok(r) => r,
                Err(_) => {
                    for k in &wanted {
                        self.health.of(k.kind).fetched[FETCH_FAILED]
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    warn!(
                        objects = wanted.len(),
                        timeout = ?self.options.fetch_timeout,
                        "fetching objects the cluster cache did not hold timed out; reviewed without them"
                    );
                    return Objects::default();
                }
            };
            let mut out = Objects::default();
            let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            recent.found.retain(|_, (at, _)| at.elapsed() < FOUND_TTL);
            recent.absent.retain(|_, at| at.elapsed() < ABSENT_TTL);
            for (key, result) in wanted.into_iter().zip(results) {
                let counters = &self.health.of(key.kind).fetched;
                match result {
                    Ok(Some(f)) => {
                        counters[FETCH_FOUND].fetch_add(1, Ordering::Relaxed);
                        match &f {
                            Fetched::Claim(c) => out.add_claim((**c).clone()),
                            Fetched::Template(t) => out.add_template((**t).clone()),
                            Fetched::Namespace(n) => out.add_namespace((**n).clone()),
                            Fetched::Runtime(r) => {
                                out.add_training_runtime((**r).clone());
                            }
                        }
                        recent.found.insert(key.clone(), (now, f));
                    }
                    Ok(None) => {
                        counters[FETCH_ABSENT].fetch_add(1, Ordering::Relaxed);
                        out.absent.insert(key.clone());
                        recent.absent.insert(key.clone(), now);
                    }
                    Err(e) => {
                        counters[FETCH_FAILED].fetch_add(1, Ordering::Relaxed);
                        warn!(kind = key.kind.as_str(), namespace = %key.namespace, name = %key.name,
                            error = %e, "fetching an object the cluster cache did not hold failed");
                    }
                }
            }
            out
        })
    }

    fn synced(&self) -> bool {
        self.health.all().iter().all(|h| h.ready())
    }

    fn policy_objects(&self) -> Option<Arc<PolicyObjects>> {
        Some(self.policy_objects.clone())
    }

    /// A resource the cluster does not serve has no series.
    fn status(&self) -> Vec<ResourceStatus> {
        self.health
            .all()
            .iter()
            .filter(|h| h.is_served())
            .map(|h| h.status())
            .collect()
    }
}

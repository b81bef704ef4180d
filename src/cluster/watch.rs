//! The cluster context fed by watches: ResourceClaims, ResourceClaimTemplates and
//! Namespaces, and Kubeflow Trainer's TrainingRuntimes and ClusterTrainingRuntimes, each
//! kept in a kube `runtime` reflector's store.
//!
//! - Reviews read the stores and never wait on them. A store that has not synced yet, or an
//!   object it does not hold, answers "unknown", and the review's handler calls
//!   [`ClusterContext::fetch`]: one GET per object, all at once, bounded by
//!   `--cluster-fetch-timeout-ms`. What a GET found is kept for a minute (the watch catches
//!   up meanwhile), what it found absent for five seconds, so that 64 pods of one Job do
//!   not fetch one template 64 times.
//! - A broken watch keeps the last state: kube's watcher retries with backoff (and relists
//!   after a 410), and the store is only replaced once a relist is complete. Each failure is
//!   logged and counted; [`ResourceStatus`] says how far behind the cluster each store may be.
//! - Stored objects are trimmed to what reviews read: no managedFields, no claim status.
//! - The runtimes are a CRD's, which a cluster without Kubeflow Trainer does not serve: a
//!   list answered 404 marks the resource "not served" (logged once, no metric series, no
//!   probe), and the watcher keeps retrying with its backoff so that a Trainer installed
//!   later is picked up. Readiness does not wait for the runtimes: before their caches
//!   sync, a TrainJob's runtime is fetched like any object the caches do not hold, and one
//!   tollgate cannot know is a warning, never a refusal.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ListParams;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::{BoxFuture, ClusterContext, ResourceStatus};
use tollgate_core::cluster::{Cluster, Kind, Lookup, ObjectKey, Objects};

/// How long an object a GET found is used before the watch must have it.
const FOUND_TTL: Duration = Duration::from_secs(60);
/// How long "a GET found nothing" holds: a claim applied a moment later must still be seen.
const ABSENT_TTL: Duration = Duration::from_secs(5);
/// While a watch is failing, how often its resource is listed (one object) to learn that
/// the apiserver answers again: the watcher's own recovery is silent until the next event.
const PROBE_INTERVAL: Duration = Duration::from_secs(10);

/// Tuning of the watched context.
#[derive(Debug, Clone)]
pub struct Options {
    /// Bound of one review's fetch of the objects the caches did not hold.
    pub fetch_timeout: Duration,
}

/// The caches and what serves them.
pub struct Watched {
    client: Client,
    claims: Store<ResourceClaim>,
    templates: Store<ResourceClaimTemplate>,
    namespaces: Store<Namespace>,
    training_runtimes: Store<Runtime<Namespaced>>,
    cluster_training_runtimes: Store<Runtime<ClusterScoped>>,
    /// One per store, in the order of [`Kind`]'s use below; the first [`REQUIRED`] are the
    /// caches readiness waits for.
    health: [Arc<Health>; 5],
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

/// The caches readiness waits for: those of core resources every cluster serves.
const REQUIRED: usize = 3;

/// What one watch has been through, for readiness, metrics and logs.
#[derive(Debug, Default)]
struct Health {
    resource: &'static str,
    /// A CRD's resource, which a cluster may not serve.
    optional: bool,
    /// Its last list answered 404: the cluster does not serve it (only an optional one).
    not_served: AtomicBool,
    synced: AtomicBool,
    /// Unix seconds of the last complete list, 0 before the first.
    last_sync: AtomicI64,
    /// Unix seconds since when the watch has been failing; 0 while it is not.
    failing_since: AtomicI64,
    restarts: AtomicU64,
    objects: AtomicU64,
    fetched: [AtomicU64; 3],
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
        tollgate_core::trainjob::GROUP.into()
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

const FETCH_FOUND: usize = 0;
const FETCH_ABSENT: usize = 1;
const FETCH_FAILED: usize = 2;

impl Watched {
    /// Starts the watches (they run until the context is dropped). Must be called inside
    /// a Tokio runtime.
    pub fn start(client: Client, options: Options) -> Watched {
        let health = [
            Arc::new(Health::named("resourceclaims")),
            Arc::new(Health::named("resourceclaimtemplates")),
            Arc::new(Health::named("namespaces")),
            Arc::new(Health::optional(super::OPTIONAL_RESOURCES[0])),
            Arc::new(Health::optional(super::OPTIONAL_RESOURCES[1])),
        ];
        let (claims, t1) = watch(
            Api::<ResourceClaim>::all(client.clone()),
            health[0].clone(),
            |c: &mut ResourceClaim| c.status = None,
        );
        let (templates, t2) = watch(
            Api::<ResourceClaimTemplate>::all(client.clone()),
            health[1].clone(),
            |_: &mut ResourceClaimTemplate| {},
        );
        let (namespaces, t3) = watch(
            Api::<Namespace>::all(client.clone()),
            health[2].clone(),
            |n: &mut Namespace| n.status = None,
        );
        let (training_runtimes, t4) = watch(
            Api::<Runtime<Namespaced>>::all(client.clone()),
            health[3].clone(),
            |_: &mut Runtime<Namespaced>| {},
        );
        let (cluster_training_runtimes, t5) = watch(
            Api::<Runtime<ClusterScoped>>::all(client.clone()),
            health[4].clone(),
            |_: &mut Runtime<ClusterScoped>| {},
        );
        Watched {
            client,
            claims,
            templates,
            namespaces,
            training_runtimes,
            cluster_training_runtimes,
            health,
            recent: Mutex::new(Recent::default()),
            options,
            tasks: vec![t1, t2, t3, t4, t5],
        }
    }

    /// A runtime from its store, else what a recent GET learnt, else unknown.
    fn lookup_runtime<S: RuntimeScope>(
        &self,
        store: &Store<Runtime<S>>,
        kind: Kind,
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
        kind: Kind,
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

    async fn fetch_one(&self, key: &ObjectKey) -> Result<Option<Fetched>, kube::Error> {
        let (ns, name) = (key.namespace.as_str(), key.name.as_str());
        match key.kind {
            Kind::ResourceClaim => Api::<ResourceClaim>::namespaced(self.client.clone(), ns)
                .get_opt(name)
                .await
                .map(|o| o.map(|o| Fetched::Claim(Arc::new(o)))),
            Kind::ResourceClaimTemplate => {
                Api::<ResourceClaimTemplate>::namespaced(self.client.clone(), ns)
                    .get_opt(name)
                    .await
                    .map(|o| o.map(|o| Fetched::Template(Arc::new(o))))
            }
            Kind::Namespace => Api::<Namespace>::all(self.client.clone())
                .get_opt(name)
                .await
                .map(|o| o.map(|o| Fetched::Namespace(Arc::new(o)))),
            Kind::TrainingRuntime => {
                Api::<Runtime<Namespaced>>::namespaced(self.client.clone(), ns)
                    .get_opt(name)
                    .await
                    .map(|o| o.map(|o| Fetched::Runtime(o.json)))
            }
            Kind::ClusterTrainingRuntime => Api::<Runtime<ClusterScoped>>::all(self.client.clone())
                .get_opt(name)
                .await
                .map(|o| o.map(|o| Fetched::Runtime(o.json))),
        }
    }

    fn health_of(&self, kind: Kind) -> &Health {
        match kind {
            Kind::ResourceClaim => &self.health[0],
            Kind::ResourceClaimTemplate => &self.health[1],
            Kind::Namespace => &self.health[2],
            Kind::TrainingRuntime => &self.health[3],
            Kind::ClusterTrainingRuntime => &self.health[4],
        }
    }
}

impl Health {
    fn named(resource: &'static str) -> Health {
        Health {
            resource,
            // Not synced yet counts as failing since start: nothing is known.
            failing_since: AtomicI64::new(unix_now()),
            ..Default::default()
        }
    }

    fn status(&self) -> ResourceStatus {
        let since = self.failing_since.load(Ordering::Relaxed);
        ResourceStatus {
            resource: self.resource,
            synced: self.synced.load(Ordering::Relaxed),
            age_seconds: if since == 0 {
                0
            } else {
                (unix_now() - since).max(0)
            },
            last_sync: self.last_sync.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
            objects: self.objects.load(Ordering::Relaxed),
            fetched_found: self.fetched[FETCH_FOUND].load(Ordering::Relaxed),
            fetched_absent: self.fetched[FETCH_ABSENT].load(Ordering::Relaxed),
            fetched_failed: self.fetched[FETCH_FAILED].load(Ordering::Relaxed),
        }
    }

    fn optional(resource: &'static str) -> Health {
        Health {
            optional: true,
            ..Health::named(resource)
        }
    }

    /// A list answered 404 for a resource the cluster may not serve: said once, and not
    /// a failure to alert on.
    fn not_served(&self) {
        if !self.not_served.swap(true, Ordering::Relaxed) {
            info!(
                resource = self.resource,
                "the cluster does not serve this resource (Kubeflow Trainer is not installed); TrainJobs naming a runtime are allowed with a warning until it does"
            );
        }
    }

    fn current(&self) {
        if self.failing_since.swap(0, Ordering::Relaxed) != 0 && self.synced.load(Ordering::Relaxed)
        {
            info!(resource = self.resource, "cluster watch recovered");
        }
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A reflector over `api`, trimmed by `trim`, driven on its own task.
fn watch<K>(api: Api<K>, health: Arc<Health>, trim: fn(&mut K)) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let store = reader.clone();
    let stream = watcher(api.clone(), watcher::Config::default().page_size(500))
        .default_backoff()
        .modify(move |o: &mut K| {
            o.managed_fields_mut().clear();
            trim(o);
        })
        .reflect(writer);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut probe: Option<JoinHandle<()>> = None;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    health.not_served.store(false, Ordering::Relaxed);
                    let first = !health.synced.swap(true, Ordering::Relaxed);
                    health.last_sync.store(unix_now(), Ordering::Relaxed);
                    health.objects.store(reader.len() as u64, Ordering::Relaxed);
                    health.current();
                    if first {
                        info!(
                            resource = health.resource,
                            objects = reader.len(),
                            "cluster cache synced"
                        );
                    }
                }
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Ok(_) => {
                    health.objects.store(reader.len() as u64, Ordering::Relaxed);
                    health.current();
                }
                Err(e) if health.optional && is_not_found(&e) => health.not_served(),
                Err(e) => {
                    health.restarts.fetch_add(1, Ordering::Relaxed);
                    let was = health.failing_since.compare_exchange(
                        0,
                        unix_now(),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    warn!(
                        resource = health.resource,
                        error = %e,
                        objects = reader.len(),
                        "cluster watch failed; reviews use the last state while it retries"
                    );
                    if was.is_ok() || probe.as_ref().is_none_or(|p| p.is_finished()) {
                        probe = Some(tokio::spawn(probe_until_current(
                            api.clone(),
                            health.clone(),
                        )));
                    }
                }
            }
        }
    });
    (store, task)
}

/// Whether a watch failed because the resource is not served.
fn is_not_found(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 404,
        watcher::Error::WatchError(s) => s.code == 404,
        _ => false,
    }
}

/// While the watch is failing, lists one object now and then: once the apiserver answers
/// again the watcher's retry succeeds too, but says nothing until the next event.
async fn probe_until_current<K>(api: Api<K>, health: Arc<Health>)
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        if health.failing_since.load(Ordering::Relaxed) == 0 {
            return;
        }
        if api
            .list_metadata(&ListParams::default().limit(1))
            .await
            .is_ok()
        {
            health.current();
            return;
        }
    }
}

impl Cluster for Watched {
    fn resource_claim(&self, namespace: &str, name: &str) -> Lookup<Arc<ResourceClaim>> {
        self.lookup(
            &self.claims,
            Kind::ResourceClaim,
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
            Kind::ResourceClaimTemplate,
            namespace,
            name,
            |f| match f {
                Fetched::Template(t) => Some(t),
                _ => None,
            },
        )
    }

    fn namespace(&self, name: &str) -> Lookup<Arc<Namespace>> {
        self.lookup(&self.namespaces, Kind::Namespace, "", name, |f| match f {
            Fetched::Namespace(n) => Some(n),
            _ => None,
        })
    }

    fn training_runtime(&self, namespace: &str, name: &str) -> Lookup<Arc<Value>> {
        self.lookup_runtime(
            &self.training_runtimes,
            Kind::TrainingRuntime,
            namespace,
            name,
        )
    }

    fn cluster_training_runtime(&self, name: &str) -> Lookup<Arc<Value>> {
        self.lookup_runtime(
            &self.cluster_training_runtimes,
            Kind::ClusterTrainingRuntime,
            "",
            name,
        )
    }
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
                        self.health_of(k.kind).fetched[FETCH_FAILED]
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
                let counters = &self.health_of(key.kind).fetched;
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
        self.health[..REQUIRED]
            .iter()
            .all(|h| h.synced.load(Ordering::Relaxed))
    }

    /// A resource the cluster does not serve has no series.
    fn status(&self) -> Vec<ResourceStatus> {
        self.health
            .iter()
            .filter(|h| !h.not_served.load(Ordering::Relaxed))
            .map(|h| h.status())
            .collect()
    }
}

//! What every cache of the cluster context shares: its [`Health`] (for readiness, metrics
//! and logs), and [`drive`], the loop that feeds a kube watcher's events into a [`Sink`]
//! (a reflector's store, or an index of the cache's own, such as the nodes by shape).
//!
//! A watch that breaks keeps the last state: kube's watcher retries with backoff (and
//! relists after a 410), and a sink replaces what it holds only once a relist is complete
//! (`InitDone`). Each failure is logged and counted.

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt as _};
use kube::api::ListParams;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::ResourceStatus;
use tollgate_core::Lookup;

/// Objects per list request: the page size kube's reflectors and kubectl use.
pub const PAGE_SIZE: u32 = 500;

/// While a watch is failing, how often its resource is listed (one object) to learn that
/// the apiserver answers again: the watcher's own recovery is silent until the next event.
const PROBE_INTERVAL: Duration = Duration::from_secs(10);

/// What `/readyz` waits for of a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Its first complete list, whatever happens (namespaces).
    Always,
    /// Its first complete list, unless the cluster does not serve the resource (the DRA
    /// claims: a cluster without `resource.k8s.io` has none).
    UnlessNotServed,
    /// Its first complete list, unless the cluster does not serve the resource or the
    /// RBAC forbids reading it (nodes, quotas, DeviceClasses: feasibility then says nothing
    /// of them, and the cache keeps trying).
    UnlessUnavailable,
    /// Never (the Kubeflow Trainer runtimes: one not cached is fetched).
    Never,
}

/// What one watch has been through, for readiness, metrics and logs.
#[derive(Debug)]
pub struct Health {
    pub resource: &'static str,
    readiness: Readiness,
    /// Said once when a list answers 404: why the cluster may not serve it, and what
    /// follows for reviews.
    not_served_note: &'static str,
    /// Its last list answered 404, or discovery found no version of it: the cluster does
    /// not serve it.
    not_served: AtomicBool,
    /// A list answered 403 since the last complete list.
    forbidden: AtomicBool,
    synced: AtomicBool,
    /// Unix seconds of the last complete list, 0 before the first.
    last_sync: AtomicI64,
    /// Unix seconds since when the watch has been failing; 0 while it is not.
    failing_since: AtomicI64,
    restarts: AtomicU64,
    objects: AtomicU64,
    pub fetched: [AtomicU64; 3],
}

pub const FETCH_FOUND: usize = 0;
pub const FETCH_ABSENT: usize = 1;
pub const FETCH_FAILED: usize = 2;

impl Health {
    pub fn new(
        resource: &'static str,
        readiness: Readiness,
        not_served_note: &'static str,
    ) -> Health {
        Health {
            resource,
            readiness,
            not_served_note,
            not_served: AtomicBool::new(false),
            forbidden: AtomicBool::new(false),
            synced: AtomicBool::new(false),
            last_sync: AtomicI64::new(0),
            // Not synced yet counts as failing since start: nothing is known.
            failing_since: AtomicI64::new(unix_now()),
            restarts: AtomicU64::new(0),
            objects: AtomicU64::new(0),
            fetched: Default::default(),
        }
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    pub fn is_served(&self) -> bool {
        !self.not_served.load(Ordering::Relaxed)
    }

    /// Whether `/readyz` may answer 200 as far as this cache goes.
    pub fn ready(&self) -> bool {
        let not_served = self.not_served.load(Ordering::Relaxed);
        self.is_synced()
            || match self.readiness {
                Readiness::Always => false,
                Readiness::UnlessNotServed => not_served,
                Readiness::UnlessUnavailable => {
                    not_served || self.forbidden.load(Ordering::Relaxed)
                }
                Readiness::Never => true,
            }
    }

    /// What a cache of a kind the engine asks with `Option<Lookup>` answers: None where the
    /// cluster does not serve it or the RBAC forbids it (nothing is said of it), the
    /// cache's state once listed (the last one, while the watch fails), else unknown.
    pub fn known<T>(&self, state: impl FnOnce() -> T) -> Option<Lookup<T>> {
        if !self.is_served() {
            None
        } else if self.is_synced() {
            Some(Lookup::Found(state()))
        } else if self.forbidden.load(Ordering::Relaxed) {
            None
        } else {
            Some(Lookup::Unknown)
        }
    }

    /// Whether the RBAC forbade its last list or watch.
    pub fn is_forbidden(&self) -> bool {
        self.forbidden.load(Ordering::Relaxed)
    }

    pub fn status(&self) -> ResourceStatus {
        let since = self.failing_since.load(Ordering::Relaxed);
        ResourceStatus {
            resource: self.resource,
            synced: self.is_synced(),
            ready: self.ready(),
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

    /// The cluster does not serve the resource: said once, and not a failure to alert on
    /// (no metric series while it lasts).
    pub fn not_served(&self) {
        if !self.not_served.swap(true, Ordering::Relaxed) {
            info!(
                resource = self.resource,
                "the cluster does not serve this resource; {}", self.not_served_note
            );
        }
    }

    /// The cluster serves the resource (again).
    pub fn served(&self) {
        self.not_served.store(false, Ordering::Relaxed);
    }

    /// A complete list: the cache holds `objects`.
    fn listed(&self, objects: usize) {
        self.served();
        self.forbidden.store(false, Ordering::Relaxed);
        let first = !self.synced.swap(true, Ordering::Relaxed);
        self.last_sync.store(unix_now(), Ordering::Relaxed);
        self.objects.store(objects as u64, Ordering::Relaxed);
        let was_failing = self.failing_since.swap(0, Ordering::Relaxed) != 0;
        if was_failing {
            crate::kubeconfig::reached();
        }
        if first {
            info!(resource = self.resource, objects, "cluster cache synced");
        } else if was_failing {
            info!(resource = self.resource, "cluster watch recovered");
        }
    }

    fn current(&self) {
        if self.failing_since.swap(0, Ordering::Relaxed) != 0 && self.is_synced() {
            info!(resource = self.resource, "cluster watch recovered");
        }
    }

    /// A failure of the watch (or of what it needs, such as discovery): counted, logged,
    /// and the cache keeps its last state. Whether it started failing just now.
    /// One that never reached the API server (`unreachable`) is said for every cache at
    /// once, with the URL, and then once a minute (`kubeconfig::unreachable`): each cache
    /// retrying on its own would otherwise log a line a retry.
    pub fn failed(&self, error: &dyn std::fmt::Display, unreachable: bool, objects: usize) -> bool {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        let was = self.failing_since.compare_exchange(
            0,
            unix_now(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        if unreachable {
            if let Some(line) = crate::kubeconfig::unreachable(&error.to_string()) {
                warn!("{line}");
            }
        } else {
            warn!(
                resource = self.resource,
                error = %error,
                objects,
                "cluster watch failed; reviews use the last state while it retries"
            );
        }
        was.is_ok()
    }
}

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Where a watch's events go: the watcher's `Init`, `InitApply` and `InitDone` as a
/// reflector takes them (what `InitApply` brings replaces what is held at `InitDone`).
pub trait Sink<K>: Send {
    fn event(&mut self, event: watcher::Event<K>);
    /// Objects held.
    fn len(&self) -> usize;
    /// When a change held back is due to be published (None: none is).
    fn due(&self) -> Option<tokio::time::Instant> {
        None
    }
    /// Publishes the changes held back.
    fn publish(&mut self) {}
}

/// A kube reflector's store, fed by hand (so that one store outlives the watches that
/// feed it, as a change of the served version needs).
pub struct Reflected<K: Resource<DynamicType = ()> + Clone + 'static> {
    writer: Writer<K>,
    reader: Store<K>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Reflected<K> {
    pub fn new() -> Reflected<K> {
        let writer = Writer::default();
        let reader = writer.as_reader();
        Reflected { writer, reader }
    }

    pub fn store(&self) -> Store<K> {
        self.reader.clone()
    }
}

impl<K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static> Sink<K> for Reflected<K> {
    fn event(&mut self, event: watcher::Event<K>) {
        self.writer.apply_watcher_event(&event);
    }
    fn len(&self) -> usize {
        self.reader.len()
    }
}

/// The HTTP status of the apiserver's answer a watch failed with, if it answered.
pub fn status_code(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.code),
        watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
    }
}

/// How [`drive`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The resource answered 404 and the caller asked to be told (to look for another
    /// version of it).
    NotFound,
    /// The stream ended (it does not, short of the runtime's end).
    Closed,
}

/// Feeds `stream`'s events into `sink` and keeps `health` up to date, until the stream
/// ends, or until a 404 when `return_on_404`. A 404 otherwise marks the resource not
/// served (the watcher retries with its backoff, so that it is picked up once it is); a
/// 403 marks it forbidden. While the watch fails, `probe` lists one object now and then
/// to learn that the apiserver answers again.
pub async fn drive<K, P>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    health: &Arc<Health>,
    sink: &mut impl Sink<K>,
    probe: &Api<P>,
    return_on_404: bool,
) -> Ended
where
    P: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let mut stream = std::pin::pin!(stream);
    let mut prober: Option<JoinHandle<()>> = None;
    let ended = loop {
        let next = match sink.due() {
            Some(due) => tokio::select! {
                e = stream.next() => e,
                () = tokio::time::sleep_until(due) => {
                    sink.publish();
                    continue;
                }
            },
            None => stream.next().await,
        };
        let Some(event) = next else {
            break Ended::Closed;
        };
        match event {
            Ok(watcher::Event::InitDone) => {
                sink.event(watcher::Event::InitDone);
                health.listed(sink.len());
            }
            Ok(e @ (watcher::Event::Init | watcher::Event::InitApply(_))) => sink.event(e),
            Ok(e) => {
                sink.event(e);
                health.objects.store(sink.len() as u64, Ordering::Relaxed);
                health.current();
            }
            Err(e) if status_code(&e) == Some(404) => {
                if return_on_404 {
                    break Ended::NotFound;
                }
                health.not_served();
            }
            Err(e) => {
                if status_code(&e) == Some(403) {
                    health.forbidden.store(true, Ordering::Relaxed);
                }
                let (said, unreachable) = crate::kubeconfig::watch_words(&e);
                let started = health.failed(&said, unreachable, sink.len());
                if started || prober.as_ref().is_none_or(|p| p.is_finished()) {
                    prober = Some(tokio::spawn(probe_until_current(
                        probe.clone(),
                        health.clone(),
                    )));
                }
            }
        }
    };
    if let Some(p) = prober {
        p.abort();
    }
    ended
}

/// While the watch is failing, lists one object now and then: once the apiserver answers
/// again the watcher's retry succeeds too, but says nothing until the next event.
async fn probe_until_current<K>(api: Api<K>, health: Arc<Health>)
where
    K: Resource + Clone + Debug + DeserializeOwned,
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

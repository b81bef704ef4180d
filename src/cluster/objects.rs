//! The policy as Kubernetes objects, watched: the cluster's TollgatePolicy and the
//! namespaces' TollgateProfiles (`tollgate.dev/v1alpha1`, read as JSON: tollgate's own
//! types are the engine's, `tollgate_core::objects`), each fed by a kube watcher through
//! `cache::drive` as the other caches are.
//!
//! - What the watches hold is not read by reviews: the server's composer
//!   (`server::objects`) is told of every change and composes the file with them into the
//!   policy in force, so that a review reads one policy as before.
//! - A cluster without the CRDs (404) is "not served", as for Kubeflow Trainer: logged once,
//!   `tollgate_policy_objects_served` 0, not waited for, and the watcher keeps retrying
//!   with its backoff, so that CRDs installed later are picked up. One the RBAC forbids
//!   (403) is not waited for either: the file stays in force and the stale alert fires. So
//!   these watches are never the reason tollgate is not ready.
//! - A watch that breaks keeps the last objects: tollgate keeps the policy it composed. So
//!   does a 404 once the kind was served: a CRD deleted deletes its objects first (their
//!   deletions reach the watch), while an apiserver can answer 404 for a custom resource
//!   for a moment (restarting, before its CRDs are read), and dropping the objects then
//!   would swing every namespace's policy for no change in the cluster.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client, ResourceExt as _};
use serde_json::Value;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::cache::{drive, Health, Sink, PAGE_SIZE};
use tollgate_core::{
    Stored, POLICY_GROUP, POLICY_KIND, POLICY_PLURAL, POLICY_VERSION, PROFILE_KIND, PROFILE_PLURAL,
};

/// Which of the two kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    Policy,
    Profile,
}

impl ObjectKind {
    pub const ALL: [ObjectKind; 2] = [ObjectKind::Policy, ObjectKind::Profile];

    pub fn kind(self) -> &'static str {
        match self {
            ObjectKind::Policy => POLICY_KIND,
            ObjectKind::Profile => PROFILE_KIND,
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            ObjectKind::Policy => POLICY_PLURAL,
            ObjectKind::Profile => PROFILE_PLURAL,
        }
    }

    /// The API resource, for watches and status writes.
    pub fn api_resource(self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(POLICY_GROUP, POLICY_VERSION, self.kind()),
            self.plural(),
        )
    }
}

/// One object as watched: what the composer reads (`stored`) and its status as stored, so
/// that a status is written only where it differs.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchedObject {
    pub kind: ObjectKind,
    pub stored: Stored,
    pub status: Value,
}

impl WatchedObject {
    fn of(kind: ObjectKind, o: &DynamicObject) -> Option<WatchedObject> {
        let v = serde_json::to_value(o).ok()?;
        Some(WatchedObject {
            kind,
            stored: Stored::from_object(&v),
            status: v.get("status").cloned().unwrap_or(Value::Null),
        })
    }

    /// `NAMESPACE/NAME`, or `NAME` for the cluster-scoped TollgatePolicy.
    pub fn key(&self) -> String {
        key(&self.stored.namespace, &self.stored.name)
    }
}

pub fn key(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        name.to_owned()
    } else {
        format!("{namespace}/{name}")
    }
}

/// What one kind's watch holds.
#[derive(Debug, Default)]
struct Held {
    objects: BTreeMap<String, WatchedObject>,
    /// What a relist brings, until it is complete.
    relist: Option<BTreeMap<String, WatchedObject>>,
    /// Listed completely at least once.
    synced: bool,
}

/// One kind: its objects, its health, and whether the composer has put its first complete
/// list in force.
struct KindState {
    held: Mutex<Held>,
    health: Arc<Health>,
    composed: AtomicBool,
}

/// Both kinds' watches, and the composer's signal.
pub struct PolicyObjects {
    kinds: [KindState; 2],
    changed: Notify,
}

/// What the composer reads: every object of both kinds, and which kinds were listed.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub objects: Vec<WatchedObject>,
    /// By [`ObjectKind::ALL`]: listed completely at least once.
    pub synced: [bool; 2],
}

impl PolicyObjects {
    /// `healths`: the TollgatePolicies', then the TollgateProfiles'.
    pub fn new(healths: [Arc<Health>; 2]) -> PolicyObjects {
        let [p, q] = healths;
        let state = |health| KindState {
            held: Mutex::new(Held::default()),
            health,
            composed: AtomicBool::new(false),
        };
        PolicyObjects {
            kinds: [state(p), state(q)],
            changed: Notify::new(),
        }
    }

    fn state(&self, kind: ObjectKind) -> &KindState {
        &self.kinds[kind as usize]
    }

    /// Resolves at the next change (or at once if one came since the last call).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Every object held, in a stable order.
    pub fn snapshot(&self) -> Snapshot {
        let mut out = Snapshot::default();
        for k in ObjectKind::ALL {
            let held = self.state(k).held.lock().unwrap_or_else(|p| p.into_inner());
            out.synced[k as usize] = held.synced;
            out.objects.extend(held.objects.values().cloned());
        }
        out
    }

    /// The composer has put `snapshot` in force.
    pub fn composed(&self, snapshot: &Snapshot) {
        for k in ObjectKind::ALL {
            if snapshot.synced[k as usize] {
                self.state(k).composed.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Whether `/readyz` may answer 200 as far as these go: each kind's first complete list
    /// is in force, or the kind is not to be waited for (not served, forbidden).
    pub fn ready(&self) -> bool {
        self.kinds.iter().all(|k| {
            k.composed.load(Ordering::Relaxed) || (k.health.ready() && !k.health.is_synced())
        })
    }

    /// Whether the cluster serves `kind` (its CRD is installed), as far as its watch knows.
    pub fn served(&self, kind: ObjectKind) -> bool {
        self.state(kind).health.is_served()
    }

    /// Starts both watches (they run until the tasks are aborted).
    pub fn start(self: &Arc<Self>, client: &Client) -> Vec<JoinHandle<()>> {
        ObjectKind::ALL
            .into_iter()
            .map(|kind| {
                let api = Api::<DynamicObject>::all_with(client.clone(), &kind.api_resource());
                let objects = self.clone();
                tokio::spawn(async move {
                    let health = objects.state(kind).health.clone();
                    let stream =
                        watcher(api.clone(), watcher::Config::default().page_size(PAGE_SIZE))
                            .default_backoff()
                            .modify(|o: &mut DynamicObject| o.managed_fields_mut().clear());
                    let mut sink = ObjectSink { kind, objects };
                    drive(stream, &health, &mut sink, &api, false).await;
                })
            })
            .collect()
    }
}

/// Feeds one kind's watch into [`PolicyObjects`], and tells the composer.
struct ObjectSink {
    kind: ObjectKind,
    objects: Arc<PolicyObjects>,
}

impl Sink<DynamicObject> for ObjectSink {
    fn event(&mut self, event: watcher::Event<DynamicObject>) {
        let state = self.objects.state(self.kind);
        let mut held = state.held.lock().unwrap_or_else(|p| p.into_inner());
        let changed = match event {
            watcher::Event::Init => {
                held.relist = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(o) => {
                if let (Some(w), Some(r)) = (WatchedObject::of(self.kind, &o), held.relist.as_mut())
                {
                    r.insert(w.key(), w);
                }
                false
            }
            watcher::Event::InitDone => {
                let listed = held.relist.take().unwrap_or_default();
                held.objects = listed;
                held.synced = true;
                true
            }
            watcher::Event::Apply(o) => match WatchedObject::of(self.kind, &o) {
                Some(w) => held.objects.insert(w.key(), w.clone()).as_ref() != Some(&w),
                None => false,
            },
            watcher::Event::Delete(o) => {
                let k = key(o.namespace().as_deref().unwrap_or(""), &o.name_any());
                held.objects.remove(&k).is_some()
            }
        };
        drop(held);
        if changed {
            self.objects.changed.notify_one();
        }
    }

    fn len(&self) -> usize {
        self.objects
            .state(self.kind)
            .held
            .lock()
            .map_or(0, |h| h.objects.len())
    }
}

//! The policy in force, composed: the file layer (`--policy`, reloaded; or the built-in
//! policy) with the cluster's TollgatePolicy and the namespaces' TollgateProfiles as the
//! cluster context watches them (`cluster::objects`), by the engine's
//! [`compose_policy`], then swapped into [`AppState`].
//!
//! - One composer, behind one lock: a file reload and a watch event both recompose, from
//!   the file as last loaded and the objects as last watched, so that neither undoes the
//!   other.
//! - Each object's last good spec is kept across compositions (by the object's name), so
//!   that an object stored while tollgate's webhook was not there to refuse it leaves the
//!   spec before it in force, and says so in its status. An object deleted takes its last
//!   good spec with it.
//! - What became of each object is logged when it changes (info when it comes in force,
//!   a warning naming the object, the field and the reason when it does not), counted in
//!   metrics, and written to its `status` by one replica: the holder of the Lease
//!   `tollgate-policy-status` ([`status_loop`]), only where the stored status differs, so
//!   that its own write (a new resourceVersion, not a new generation) writes nothing more.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{json, Value};
use tokio::sync::watch;
use tracing::{info, warn};

use super::shutdown::stopped;
use super::{ActivePolicy, AppState};
use crate::cluster::objects::{ObjectKind, PolicyObjects, Snapshot, WatchedObject};
use crate::lease::{self, Elector, LeaseOptions, Purpose};
use crate::metrics::{ObjectStateLabels, RejectionLabels, ResultLabels, OBJECT_STATES};
use tollgate_core::{
    compose_policy, Candidate, InForce, ObjectStatus, PolicyError, Stored, Written, POLICY_NAME,
};

/// The Lease whose holder writes the objects' status.
pub const STATUS_LEASE: &str = "tollgate-policy-status";

/// What the status writer is told of one object: what its status should say, and what it
/// says now.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub kind: ObjectKind,
    pub status: ObjectStatus,
    /// The object's `status` as last watched.
    pub stored: Value,
}

/// The composer and what it composes from.
pub struct Composition {
    composer: Mutex<Composer>,
    /// The watched objects; None without the cluster context (the file alone).
    source: Option<Arc<PolicyObjects>>,
    reports: watch::Sender<Arc<Vec<Report>>>,
}

struct Composer {
    /// None: the built-in policy.
    file: Option<Written>,
    /// The file's bytes (or the built-in text), which the policy's hash is of.
    file_bytes: Vec<u8>,
    /// Each object's spec last in force, by the object's name (`TollgateProfile ns/default`).
    last_good: HashMap<String, Value>,
    /// What was last said of each object (its generation, reason and which spec is in
    /// force), so that each change is logged and counted once.
    said: BTreeMap<String, (Option<i64>, &'static str, InForce)>,
}

impl Composition {
    /// The file layer as loaded (None: the built-in policy) and its bytes (the file's, or
    /// the built-in text), and the objects the cluster context watches, if it does.
    pub fn new(
        file: Option<Written>,
        file_bytes: Vec<u8>,
        source: Option<Arc<PolicyObjects>>,
    ) -> Composition {
        Composition {
            composer: Mutex::new(Composer {
                file,
                file_bytes,
                last_good: HashMap::new(),
                said: BTreeMap::new(),
            }),
            source,
            reports: watch::channel(Arc::new(Vec::new())).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Composer> {
        self.composer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The policy file changed (and loads: the reload loaded it, `layer` as written):
    /// recompose with it.
    pub fn file_changed(&self, layer: Written, bytes: &[u8], state: &AppState) {
        {
            let mut c = self.lock();
            c.file = Some(layer);
            c.file_bytes = bytes.to_vec();
        }
        self.recompose(state);
    }

    /// Composes the file with the objects as watched now, and puts the result in force if
    /// it differs from the policy in force.
    pub fn recompose(&self, state: &AppState) {
        let snapshot = self
            .source
            .as_ref()
            .map(|s| s.snapshot())
            .unwrap_or_default();
        let mut c = self.lock();
        let (active, reports) = match c.compose(&snapshot, state) {
            Ok(r) => r,
            Err(e) => {
                // The file was checked when it was loaded: not expected; said, not fatal.
                warn!(error = %e, "policy not composed; the previous policy stays in force");
                return;
            }
        };
        let previous = state.policy.load();
        if previous.hash != active.hash {
            info!(policy = %active.hash, previous = %previous.hash,
                objects = reports.iter().filter(|r| r.status.in_force != InForce::Nothing).count(),
                "policy in force composed");
            state.metrics.set_policy_hash(&active.hash);
            state.metrics.set_profiles_of(&active.policy);
            state.policy.store(Arc::new(active));
        }
        drop(c);
        if let Some(s) = &self.source {
            s.composed(&snapshot);
        }
        self.reports.send_if_modified(|r| {
            if **r == reports {
                return false;
            }
            *r = Arc::new(reports);
            true
        });
    }

    /// What the status writer reads: each object's report, as last composed.
    pub fn reports(&self) -> watch::Receiver<Arc<Vec<Report>>> {
        self.reports.subscribe()
    }
}

impl Composer {
    fn compose(
        &mut self,
        snapshot: &Snapshot,
        state: &AppState,
    ) -> Result<(ActivePolicy, Vec<Report>), PolicyError> {
        let of = |kind| snapshot.objects.iter().filter(move |o| o.kind == kind);
        let last_good = &self.last_good;
        let policies: Vec<&WatchedObject> = of(ObjectKind::Policy).collect();
        let profiles: Vec<&WatchedObject> = of(ObjectKind::Profile).collect();
        let cluster = policies.iter().find(|o| o.stored.name == POLICY_NAME);
        let profile_candidates: Vec<Candidate<'_>> =
            profiles.iter().map(|o| candidate(last_good, o)).collect();
        let composed = compose_policy(
            self.file.as_ref(),
            cluster.map(|o| candidate(last_good, o)),
            &profile_candidates,
        )?;
        let mut statuses = composed.statuses;
        // A TollgatePolicy not named `default` is never applied; its status says so.
        for o in policies.iter().filter(|o| o.stored.name != POLICY_NAME) {
            if let Ok(other) =
                compose_policy(self.file.as_ref(), Some(candidate(last_good, o)), &[])
            {
                statuses.extend(other.statuses);
            }
        }
        let by_key: HashMap<(ObjectKind, String), &WatchedObject> = snapshot
            .objects
            .iter()
            .map(|o| ((o.kind, o.key()), o))
            .collect();
        let mut reports = Vec::with_capacity(statuses.len());
        // The hash names the composition: the file's bytes alone when no object is in
        // force (as before objects were), else with each spec in force after them.
        let mut hashed = self.file_bytes.clone();
        let mut counts: BTreeMap<(&'static str, &'static str), i64> = BTreeMap::new();
        let mut seen = HashSet::with_capacity(statuses.len());
        for s in statuses {
            let kind = if s.namespace.is_empty() {
                ObjectKind::Policy
            } else {
                ObjectKind::Profile
            };
            let key = crate::cluster::objects::key(&s.namespace, &s.name);
            let Some(o) = by_key.get(&(kind, key)).copied() else {
                continue;
            };
            let source = o.stored.source();
            let in_force = match s.in_force {
                InForce::Current => {
                    self.last_good.insert(source.clone(), o.stored.spec.clone());
                    Some(&o.stored.spec)
                }
                InForce::LastGood => self.last_good.get(&source),
                InForce::Nothing => None,
            };
            if let Some(spec) = in_force {
                hashed.push(0);
                hashed.extend_from_slice(source.as_bytes());
                hashed.push(0);
                hashed.extend_from_slice(spec.to_string().as_bytes());
            }
            let state_label = match s.in_force {
                InForce::Current => "in_force",
                InForce::LastGood => "last_good",
                InForce::Nothing => "invalid",
            };
            *counts.entry((kind.kind(), state_label)).or_default() += 1;
            self.said_of(&source, &o.stored, &s, kind, state);
            seen.insert(source);
            reports.push(Report {
                kind,
                status: s,
                stored: o.status.clone(),
            });
        }
        // Objects deleted: their last good spec goes, and the log says so once.
        self.last_good.retain(|k, _| seen.contains(k));
        let gone: Vec<String> = self
            .said
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            self.said.remove(&k);
            info!(object = %k, "policy object deleted; it is no longer in force");
        }
        for kind in ObjectKind::ALL {
            for label in OBJECT_STATES {
                state
                    .metrics
                    .policy_objects
                    .get_or_create(&ObjectStateLabels {
                        kind: kind.kind(),
                        state: label,
                    })
                    .set(counts.get(&(kind.kind(), label)).copied().unwrap_or(0));
            }
        }
        Ok((ActivePolicy::new(composed.policy, &hashed), reports))
    }

    /// Logs and counts what became of an object, when it changed.
    fn said_of(
        &mut self,
        source: &str,
        stored: &Stored,
        s: &ObjectStatus,
        kind: ObjectKind,
        state: &AppState,
    ) {
        let now = (s.generation, s.reason, s.in_force.clone());
        if self.said.get(source) == Some(&now) {
            return;
        }
        self.said.insert(source.to_owned(), now);
        if s.ready {
            info!(object = %source, generation = stored.generation, "policy object in force");
        } else {
            warn!(object = %source, generation = stored.generation, reason = s.reason,
                error = %s.message, "policy object not applied");
            state
                .metrics
                .policy_object_rejections
                .get_or_create(&RejectionLabels {
                    kind: kind.kind(),
                    reason: s.reason,
                })
                .inc();
        }
    }
}

/// An object to compose, with its last good spec.
fn candidate<'a>(last_good: &'a HashMap<String, Value>, o: &'a WatchedObject) -> Candidate<'a> {
    Candidate {
        stored: &o.stored,
        last_good: last_good.get(&o.stored.source()),
    }
}

/// Recomposes at every change of the watched objects, until `stop`.
pub async fn objects_loop(
    composition: Arc<Composition>,
    source: Arc<PolicyObjects>,
    state: Arc<AppState>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = source.changed() => {}
            _ = stopped(&mut stop) => return,
        }
        composition.recompose(&state);
    }
}

/// Where the status writer writes, and as whom.
pub struct StatusWriter {
    pub client: kube::Client,
    /// tollgate's namespace: where the Lease is.
    pub namespace: String,
}

/// While this replica holds the Lease [`STATUS_LEASE`], writes each object's status where
/// it differs from what the composition says; releases the Lease on `stop`.
pub async fn status_loop(
    writer: StatusWriter,
    mut reports: watch::Receiver<Arc<Vec<Report>>>,
    state: Arc<AppState>,
    mut stop: watch::Receiver<bool>,
) {
    let (leader_tx, mut leader) = watch::channel(false);
    let opts = LeaseOptions {
        name: STATUS_LEASE.into(),
        purpose: Purpose::PolicyStatus,
        identity: lease::identity(),
        ..LeaseOptions::new(&writer.namespace)
    };
    let elector =
        tokio::spawn(Elector::new(writer.client.clone(), opts, leader_tx).run(stop.clone()));
    // The last failure said of each object, so that a write refused on every try (RBAC
    // without the status subresource) is said once.
    let mut failures: HashMap<String, String> = HashMap::new();
    loop {
        let mut retry = false;
        if *leader.borrow_and_update() {
            let now = reports.borrow_and_update().clone();
            for r in now.iter() {
                retry |= !write_status(&writer.client, r, &mut failures, &state).await;
            }
        }
        let pause = if retry {
            Duration::from_secs(10)
        } else {
            Duration::from_secs(3600)
        };
        tokio::select! {
            r = reports.changed() => if r.is_err() { break },
            r = leader.changed() => if r.is_err() { break },
            () = tokio::time::sleep(pause) => {}
            _ = stopped(&mut stop) => break,
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(3), elector).await;
}

/// Writes one object's status if it differs. Whether it is done (false: retry later).
async fn write_status(
    client: &kube::Client,
    r: &Report,
    failures: &mut HashMap<String, String>,
    state: &AppState,
) -> bool {
    let Some(patch) = status_patch(r, &now()) else {
        return true;
    };
    let ar = r.kind.api_resource();
    let api: Api<DynamicObject> = if r.status.namespace.is_empty() {
        Api::all_with(client.clone(), &ar)
    } else {
        Api::namespaced_with(client.clone(), &r.status.namespace, &ar)
    };
    let name = r.status.source();
    let result = api
        .patch_status(
            &r.status.name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await;
    let counted = |result| {
        state
            .metrics
            .policy_status_writes
            .get_or_create(&ResultLabels { result })
            .inc();
    };
    match result {
        Ok(_) => {
            counted("success");
            failures.remove(&name);
            true
        }
        // Deleted meanwhile: the next composition has no report of it.
        Err(kube::Error::Api(s)) if s.code == 404 => true,
        Err(e) => {
            counted("failure");
            let e = crate::kubeconfig::words(&e);
            if failures.get(&name) != Some(&e) {
                warn!(object = %name, error = %e, "could not write the policy object's status; retrying");
                failures.insert(name, e);
            }
            false
        }
    }
}

fn now() -> Value {
    serde_json::to_value(Time(Timestamp::now())).unwrap_or(Value::Null)
}

/// The merge patch of the status subresource that makes `r.stored` say what `r.status`
/// says, or None where it does already. The `Ready` condition's `lastTransitionTime`
/// changes only when its status flips; other conditions are kept.
fn status_patch(r: &Report, now: &Value) -> Option<Value> {
    let s = &r.status;
    let want = if s.ready { "True" } else { "False" };
    let conditions = r.stored.get("conditions").and_then(Value::as_array);
    let ready = conditions
        .into_iter()
        .flatten()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"));
    let generation = s.generation.map_or(Value::Null, Value::from);
    let field = |c: Option<&Value>, k: &str| c.and_then(|c| c.get(k)).cloned();
    let same = field(ready, "status").as_ref().and_then(Value::as_str) == Some(want)
        && field(ready, "reason").as_ref().and_then(Value::as_str) == Some(s.reason)
        && field(ready, "message").as_ref().and_then(Value::as_str) == Some(s.message.as_str())
        && field(ready, "observedGeneration").unwrap_or(Value::Null) == generation
        && r.stored
            .get("observedGeneration")
            .cloned()
            .unwrap_or(Value::Null)
            == generation;
    if same {
        return None;
    }
    let transition = match field(ready, "status").as_ref().and_then(Value::as_str) {
        Some(was) if was == want => field(ready, "lastTransitionTime").unwrap_or(now.clone()),
        _ => now.clone(),
    };
    let mut condition = json!({
        "type": "Ready",
        "status": want,
        "reason": s.reason,
        "message": s.message,
        "lastTransitionTime": transition,
    });
    if !generation.is_null() {
        condition["observedGeneration"] = generation.clone();
    }
    let mut all: Vec<Value> = conditions
        .into_iter()
        .flatten()
        .filter(|c| c.get("type").and_then(Value::as_str) != Some("Ready"))
        .cloned()
        .collect();
    all.push(condition);
    let mut status = json!({ "conditions": all });
    if !generation.is_null() {
        status["observedGeneration"] = generation;
    }
    Some(json!({ "status": status }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(ready: bool, generation: i64, stored: Value) -> Report {
        Report {
            kind: ObjectKind::Profile,
            status: ObjectStatus {
                namespace: "ml".into(),
                name: "default".into(),
                generation: Some(generation),
                ready,
                reason: if ready { "InForce" } else { "Invalid" },
                message: if ready { "in force" } else { "bad" }.into(),
                in_force: if ready {
                    InForce::Current
                } else {
                    InForce::LastGood
                },
            },
            stored,
        }
    }

    #[test]
    fn a_status_is_written_only_where_it_differs_and_its_transition_time_kept_unless_it_flips() {
        let t0 = json!("2026-01-01T00:00:00Z");
        let t1 = json!("2026-01-02T00:00:00Z");
        let first = status_patch(&report(true, 1, Value::Null), &t0).unwrap();
        let c = &first["status"]["conditions"][0];
        assert_eq!(c["status"], "True");
        assert_eq!(c["observedGeneration"], 1);
        assert_eq!(c["lastTransitionTime"], t0);
        assert_eq!(first["status"]["observedGeneration"], 1);
        // Stored as written: nothing to write (the write's own event writes nothing more).
        let stored = first["status"].clone();
        assert_eq!(status_patch(&report(true, 1, stored.clone()), &t1), None);
        // A new generation, still ready: written, the transition time kept.
        let second = status_patch(&report(true, 2, stored.clone()), &t1).unwrap();
        assert_eq!(second["status"]["conditions"][0]["lastTransitionTime"], t0);
        assert_eq!(second["status"]["observedGeneration"], 2);
        // Flipped to False: a new transition time.
        let third = status_patch(&report(false, 2, second["status"].clone()), &t1).unwrap();
        assert_eq!(third["status"]["conditions"][0]["status"], "False");
        assert_eq!(third["status"]["conditions"][0]["lastTransitionTime"], t1);
        // Another condition, someone else's, is kept.
        let mut theirs = stored;
        theirs["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "Other", "status": "True"}));
        let kept = status_patch(&report(false, 1, theirs), &t1).unwrap();
        assert_eq!(kept["status"]["conditions"][0]["type"], "Other");
        assert_eq!(kept["status"]["conditions"].as_array().unwrap().len(), 2);
    }
}

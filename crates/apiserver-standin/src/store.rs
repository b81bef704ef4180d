//! The store: the resources a test registers, their objects as JSON text under one global,
//! strictly increasing resourceVersion (etcd's revision), the history of changes a watch
//! resumes from, and the snapshots a paged list reads from.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::ser::SerializeMap as _;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::faults::{Fault, RequestRecord};
use crate::http::ApiError;

/// One kind of object the stand-in serves: what a CRD or a built-in's storage registers.
#[derive(Clone, Debug)]
pub struct ResourceType {
    /// `""` for the core group.
    pub group: String,
    pub version: String,
    /// The plural resource name of the paths, e.g. `pods`.
    pub plural: String,
    pub kind: String,
    pub namespaced: bool,
    /// Field selector labels besides `metadata.name` and `metadata.namespace`; any other
    /// field is refused with 400, as the real server does.
    pub field_labels: Vec<String>,
}

impl ResourceType {
    pub fn new(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Self {
        ResourceType {
            group: group.to_owned(),
            version: version.to_owned(),
            plural: plural.to_owned(),
            kind: kind.to_owned(),
            namespaced,
            field_labels: Vec::new(),
        }
    }

    pub fn with_fields(mut self, fields: &[&str]) -> Self {
        self.field_labels = fields.iter().map(|f| (*f).to_owned()).collect();
        self
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods` or `leases.coordination.k8s.io`: how the real server names a resource in
    /// its messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn pods() -> Self {
        // The fields of pkg/registry/core/pod's PodToSelectableFields.
        ResourceType::new("", "v1", "pods", "Pod", true).with_fields(&[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ])
    }
    pub fn namespaces() -> Self {
        ResourceType::new("", "v1", "namespaces", "Namespace", false).with_fields(&["status.phase"])
    }
    pub fn secrets() -> Self {
        // pkg/registry/core/secret's SelectableFields: `type` besides the metadata.
        ResourceType::new("", "v1", "secrets", "Secret", true).with_fields(&["type"])
    }
    pub fn mutating_webhook_configurations() -> Self {
        ResourceType::new(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            false,
        )
    }
    pub fn validating_webhook_configurations() -> Self {
        ResourceType::new(
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            false,
        )
    }
    pub fn leases() -> Self {
        ResourceType::new("coordination.k8s.io", "v1", "leases", "Lease", true)
    }
    pub fn resource_claims() -> Self {
        ResourceType::new(
            "resource.k8s.io",
            "v1",
            "resourceclaims",
            "ResourceClaim",
            true,
        )
    }
    pub fn resource_claim_templates() -> Self {
        ResourceType::new(
            "resource.k8s.io",
            "v1",
            "resourceclaimtemplates",
            "ResourceClaimTemplate",
            true,
        )
    }
    pub fn nodes() -> Self {
        // pkg/registry/core/node's NodeToSelectableFields.
        ResourceType::new("", "v1", "nodes", "Node", false).with_fields(&["spec.unschedulable"])
    }
    pub fn resource_quotas() -> Self {
        ResourceType::new("", "v1", "resourcequotas", "ResourceQuota", true)
    }
    pub fn device_classes() -> Self {
        ResourceType::new(
            "resource.k8s.io",
            "v1",
            "deviceclasses",
            "DeviceClass",
            false,
        )
    }
    pub fn policy_reports() -> Self {
        ResourceType::new(
            "wgpolicyk8s.io",
            "v1alpha2",
            "policyreports",
            "PolicyReport",
            true,
        )
    }

    /// Everything above: what `ApiServer::start` registers.
    pub fn defaults() -> Vec<Self> {
        vec![
            Self::pods(),
            Self::namespaces(),
            Self::secrets(),
            Self::leases(),
            Self::resource_claims(),
            Self::resource_claim_templates(),
            Self::device_classes(),
            Self::nodes(),
            Self::resource_quotas(),
            Self::policy_reports(),
            Self::mutating_webhook_configurations(),
            Self::validating_webhook_configurations(),
        ]
    }

    /// [`ResourceType::defaults`] with DRA served in `version` alone, as a 1.33 cluster
    /// serves it (`v1beta1`).
    pub fn defaults_with_dra(version: &str) -> Vec<Self> {
        Self::defaults()
            .into_iter()
            .filter(|r| r.group != "resource.k8s.io")
            .chain(Self::dra(version))
            .collect()
    }

    /// DRA's three resources in `version` (`v1beta1`): a cluster of another Kubernetes
    /// version, in place of the defaults' v1 ones.
    pub fn dra(version: &str) -> Vec<Self> {
        [
            ("resourceclaims", "ResourceClaim", true),
            ("resourceclaimtemplates", "ResourceClaimTemplate", true),
            ("deviceclasses", "DeviceClass", false),
        ]
        .into_iter()
        .map(|(plural, kind, namespaced)| {
            ResourceType::new("resource.k8s.io", version, plural, kind, namespaced)
        })
        .collect()
    }
}

/// A stored object. It is kept as its JSON text (as etcd keeps bytes), not as a
/// `serde_json::Value`: a Value tree costs several kilobytes a pod, which 50,000 pods turn
/// into hundreds of megabytes, and lists become copies of text.
pub(crate) struct Obj {
    /// `namespace/name` or `name`, the order etcd's keys sort in.
    pub(crate) key: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    labels: Vec<(String, String)>,
    /// `{"apiVersion":...,"kind":...`, shared by every object of the resource.
    type_prefix: Arc<str>,
    /// The object without `apiVersion` and `kind`: what a list item is.
    pub(crate) untyped: Box<str>,
}

impl Obj {
    pub(crate) fn new(value: &Value, type_prefix: Arc<str>) -> Obj {
        let (namespace, name) = ns_name(value);
        let labels = value["metadata"]["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        Obj {
            key: key_of(&namespace, &name),
            namespace,
            name,
            labels,
            type_prefix,
            untyped: serde_json::to_string(&Untyped(value)).unwrap().into(),
        }
    }

    pub(crate) fn write_typed(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.type_prefix.as_bytes());
        if self.untyped.len() > 2 {
            out.push(b',');
            out.extend_from_slice(&self.untyped.as_bytes()[1..]);
        } else {
            out.push(b'}');
        }
    }

    pub(crate) fn typed(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.type_prefix.len() + self.untyped.len() + 1);
        self.write_typed(&mut out);
        out
    }

    pub(crate) fn value(&self) -> Value {
        serde_json::from_slice(&self.typed()).expect("stored JSON")
    }

    pub(crate) fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) kind: ChangeKind,
    /// For a deletion, the object as deleted, carrying the deletion's resourceVersion.
    pub(crate) obj: Arc<Obj>,
    pub(crate) prev: Option<Arc<Obj>>,
}

/// What a resource's watchers are sent: a change, a compaction, or a test's break.
pub(crate) enum WatchItem {
    Change(Arc<Change>),
    /// A compaction took revisions up to this one away.
    Compacted(u64),
    Abort,
}

/// The objects of one resource as they were for every revision in `from..until`: what a
/// paged list reads all its pages from, as etcd's MVCC serves them.
struct Snap {
    from: u64,
    until: Option<u64>,
    items: Arc<Vec<Arc<Obj>>>,
}

/// One registered resource: its objects, recent changes, watchers and snapshots.
pub(crate) struct Res {
    pub(crate) ty: ResourceType,
    pub(crate) type_prefix: Arc<str>,
    pub(crate) objects: BTreeMap<String, Arc<Obj>>,
    /// The revision of the last write to this resource.
    last_write: u64,
    pub(crate) history: VecDeque<Arc<Change>>,
    /// Every change after this revision is in `history`.
    pub(crate) floor: u64,
    pub(crate) watchers: Vec<mpsc::UnboundedSender<WatchItem>>,
    snaps: VecDeque<Snap>,
}

/// Everything the stand-in holds, under one lock.
pub(crate) struct State {
    pub(crate) rv: u64,
    /// Continue tokens of lists before this revision are expired (compaction).
    pub(crate) token_floor: u64,
    pub(crate) resources: Vec<Res>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) log: Vec<RequestRecord>,
    history_size: usize,
    snapshot_retention: usize,
    uid_counter: u64,
}

/// What every connection shares: the state, and the settings the server started with.
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) bookmark_interval: Duration,
    pub(crate) token: Option<String>,
    pub(crate) uid_seed: u64,
    pub(crate) open_watches: AtomicUsize,
    pub(crate) addr: SocketAddr,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Res {
    fn new(ty: ResourceType) -> Res {
        Res {
            type_prefix: format!(
                "{{\"apiVersion\":{},\"kind\":{}",
                json!(ty.api_version()),
                json!(ty.kind)
            )
            .into(),
            ty,
            objects: BTreeMap::new(),
            last_write: 0,
            history: VecDeque::new(),
            floor: 0,
            watchers: Vec::new(),
            snaps: VecDeque::new(),
        }
    }
}

impl State {
    /// An empty store of these resources at resourceVersion 0.
    pub(crate) fn new(
        resources: Vec<ResourceType>,
        history_size: usize,
        snapshot_retention: usize,
    ) -> State {
        State {
            rv: 0,
            token_floor: 0,
            resources: resources.into_iter().map(Res::new).collect(),
            faults: Vec::new(),
            log: Vec::new(),
            history_size,
            snapshot_retention,
            uid_counter: 0,
        }
    }

    pub(crate) fn resolve(&self, resource: &str) -> Option<usize> {
        self.resources
            .iter()
            .position(|r| r.ty.qualified() == resource)
            .or_else(|| self.resources.iter().position(|r| r.ty.plural == resource))
    }

    /// `resolve` for a test's own calls, where an unregistered resource is the test's bug.
    pub(crate) fn index(&self, resource: &str) -> usize {
        self.resolve(resource)
            .unwrap_or_else(|| panic!("resource {resource} is not registered"))
    }

    /// Unique and random-looking; nothing depends on it being unpredictable.
    fn next_random(&mut self, seed: u64) -> u64 {
        self.uid_counter += 1;
        splitmix64(seed ^ self.uid_counter.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    fn next_uid(&mut self, seed: u64) -> String {
        let hex = format!(
            "{:016x}{:016x}",
            self.next_random(seed),
            self.next_random(seed)
        );
        // The shape of a version-4 UUID, as the real server's uuid.NewUUID gives.
        format!(
            "{}-{}-4{}-a{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[13..16],
            &hex[17..20],
            &hex[20..32]
        )
    }

    /// Writes one change at a new revision: the store, the history, the watchers.
    pub(crate) fn commit(&mut self, ri: usize, kind: ChangeKind, mut value: Value) -> Value {
        self.rv += 1;
        let rv = self.rv;
        value["metadata"]["resourceVersion"] = json!(rv.to_string());
        let res = &mut self.resources[ri];
        let obj = Arc::new(Obj::new(&value, res.type_prefix.clone()));
        let key = obj.key.clone();
        let prev = match kind {
            ChangeKind::Deleted => res.objects.remove(&key),
            _ => res.objects.insert(key, obj.clone()),
        };
        res.last_write = rv;
        if let Some(s) = res.snaps.back_mut() {
            if s.until.is_none() {
                s.until = Some(rv);
            }
        }
        let change = Arc::new(Change {
            rv,
            kind,
            obj: obj.clone(),
            prev,
        });
        res.history.push_back(change.clone());
        while res.history.len() > self.history_size {
            if let Some(old) = res.history.pop_front() {
                res.floor = old.rv;
            }
        }
        res.watchers
            .retain(|tx| tx.send(WatchItem::Change(change.clone())).is_ok());
        value
    }

    /// The snapshot of a resource's current objects, shared by every list until it is
    /// next written.
    pub(crate) fn current_snapshot(&mut self, ri: usize) -> Arc<Vec<Arc<Obj>>> {
        let cap = self.snapshot_retention.max(1);
        let res = &mut self.resources[ri];
        if let Some(s) = res.snaps.back() {
            if s.until.is_none() {
                return s.items.clone();
            }
        }
        let items: Arc<Vec<Arc<Obj>>> = Arc::new(res.objects.values().cloned().collect());
        res.snaps.push_back(Snap {
            from: res.last_write,
            until: None,
            items: items.clone(),
        });
        while res.snaps.len() > cap {
            res.snaps.pop_front();
        }
        items
    }

    pub(crate) fn snapshot_at(&self, ri: usize, rv: u64) -> Option<Arc<Vec<Arc<Obj>>>> {
        self.resources[ri]
            .snaps
            .iter()
            .rev()
            .find(|s| s.from <= rv && s.until.is_none_or(|u| rv < u))
            .map(|s| s.items.clone())
    }

    /// A create: the object as the real server stores it, or why not.
    pub(crate) fn prepare_create(
        &mut self,
        ri: usize,
        path_ns: Option<&str>,
        mut body: Value,
        seed: u64,
        from_test: bool,
    ) -> Result<Value, ApiError> {
        let ty = self.resources[ri].ty.clone();
        normalize(&ty, &mut body, path_ns)?;
        let meta = body["metadata"].as_object_mut().unwrap();
        if !from_test && meta.get("resourceVersion").is_some_and(|v| v != "") {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        meta.remove("resourceVersion");
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let (namespace, _) = ns_name(&body);
        if name.is_empty() {
            let prefix = body["metadata"]["generateName"].as_str().unwrap_or("");
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    &ty,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
            // The real server's generator: five characters of this alphabet, without
            // vowels and look-alikes.
            const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            loop {
                let mut r = self.next_random(seed);
                let suffix: String = (0..5)
                    .map(|_| {
                        let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
                        r /= ALPHABET.len() as u64;
                        c
                    })
                    .collect();
                name = format!("{prefix}{suffix}");
                if !self.resources[ri]
                    .objects
                    .contains_key(&key_of(&namespace, &name))
                {
                    break;
                }
            }
            body["metadata"]["name"] = json!(name);
        }
        if let Some(why) = invalid_name(&name) {
            return Err(ApiError::invalid(
                &ty,
                &name,
                &format!("metadata.name: Invalid value: \"{name}\": {why}"),
            ));
        }
        if self.resources[ri]
            .objects
            .contains_key(&key_of(&namespace, &name))
        {
            return Err(ApiError::already_exists(&ty, &name));
        }
        let uid = self.next_uid(seed);
        let meta = body["metadata"].as_object_mut().unwrap();
        meta.insert("uid".into(), json!(uid));
        meta.insert(
            "creationTimestamp".into(),
            json!(rfc3339(SystemTime::now())),
        );
        meta.insert("generation".into(), json!(1));
        meta.remove("deletionTimestamp");
        meta.remove("deletionGracePeriodSeconds");
        Ok(body)
    }

    /// An update: the object to store, `None` for a no-op (which the real server answers
    /// with the stored object, without a new revision or an event), or why not.
    pub(crate) fn prepare_update(
        &self,
        ri: usize,
        path_ns: Option<&str>,
        name: &str,
        mut body: Value,
        unconditional: bool,
    ) -> Result<(Option<Value>, Value), ApiError> {
        let ty = &self.resources[ri].ty;
        normalize(ty, &mut body, path_ns)?;
        let body_name = body["metadata"]["name"].as_str().unwrap_or("").to_owned();
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let (namespace, _) = ns_name(&body);
        let Some(old) = self.resources[ri]
            .objects
            .get(&key_of(&namespace, name))
            .cloned()
        else {
            return Err(ApiError::not_found(ty, name));
        };
        let old_value = old.value();
        let old_rv = old_value["metadata"]["resourceVersion"].clone();
        let meta = body["metadata"].as_object_mut().unwrap();
        let given = meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !unconditional && !given.is_empty() && Some(given) != old_rv.as_str() {
            return Err(ApiError::stale(ty, name));
        }
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            match old_value["metadata"].get(field) {
                Some(v) => meta.insert(field.into(), v.clone()),
                None => meta.remove(field),
            };
        }
        meta.insert("resourceVersion".into(), old_rv);
        let old_generation = old_value["metadata"]["generation"].as_i64().unwrap_or(1);
        meta.insert("generation".into(), json!(old_generation));
        if body == old_value {
            return Ok((None, old_value));
        }
        if without_meta_status(&body) != without_meta_status(&old_value) {
            body["metadata"]["generation"] = json!(old_generation + 1);
        }
        Ok((Some(body), old_value))
    }

    /// Stores an update, or finishes a deletion that finalizers held once they are gone.
    pub(crate) fn commit_update(&mut self, ri: usize, value: Value) -> Value {
        let deleting = value["metadata"].get("deletionTimestamp").is_some();
        let finalizers = value["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if deleting && !finalizers {
            self.commit(ri, ChangeKind::Deleted, value)
        } else {
            self.commit(ri, ChangeKind::Modified, value)
        }
    }

    /// A test's write without HTTP: a create, or an unconditional update of what is there.
    pub(crate) fn upsert(&mut self, ri: usize, mut obj: Value, seed: u64) -> Value {
        let ty = self.resources[ri].ty.clone();
        normalize(&ty, &mut obj, None).expect("an object of this resource");
        let (ns, name) = ns_name(&obj);
        if self.resources[ri].objects.contains_key(&key_of(&ns, &name)) {
            let ns = ty.namespaced.then_some(ns.as_str());
            let (new, old) = self
                .prepare_update(ri, ns, &name, obj, true)
                .expect("a valid update");
            match new {
                Some(v) => self.commit_update(ri, v),
                None => old,
            }
        } else {
            let v = self
                .prepare_create(ri, None, obj, seed, true)
                .expect("a valid object");
            self.commit(ri, ChangeKind::Added, v)
        }
    }

    /// A delete: the answer's object, having written what it changes.
    pub(crate) fn delete(
        &mut self,
        ri: usize,
        namespace: &str,
        name: &str,
        options: &Value,
        dry_run: bool,
        force: bool,
    ) -> Result<Value, ApiError> {
        let ty = self.resources[ri].ty.clone();
        let Some(old) = self.resources[ri]
            .objects
            .get(&key_of(namespace, name))
            .cloned()
        else {
            return Err(ApiError::not_found(&ty, name));
        };
        let old = old.value();
        let pre = &options["preconditions"];
        if let Some(uid) = pre["uid"].as_str() {
            let have = old["metadata"]["uid"].as_str().unwrap_or("");
            if uid != have {
                return Err(ApiError::conflict(
                    &ty,
                    name,
                    &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"),
                ));
            }
        }
        if let Some(rv) = pre["resourceVersion"].as_str() {
            let have = old["metadata"]["resourceVersion"].as_str().unwrap_or("");
            if rv != have {
                return Err(ApiError::conflict(
                    &ty,
                    name,
                    &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {have}"),
                ));
            }
        }
        if dry_run {
            return Ok(old);
        }
        let finalizers = old["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if finalizers && !force {
            if old["metadata"].get("deletionTimestamp").is_some() {
                return Ok(old);
            }
            let mut v = old;
            v["metadata"]["deletionTimestamp"] = json!(rfc3339(SystemTime::now()));
            v["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            return Ok(self.commit(ri, ChangeKind::Modified, v));
        }
        self.commit(ri, ChangeKind::Deleted, old.clone());
        Ok(old)
    }

    /// Compaction (see `ApiServer::compact`), at a revision of its own.
    pub(crate) fn compact(&mut self) {
        let before = self.rv;
        self.rv += 1;
        let rv = self.rv;
        self.token_floor = rv;
        for res in &mut self.resources {
            res.history.clear();
            res.floor = rv;
            res.snaps.clear();
            res.watchers
                .retain(|tx| tx.send(WatchItem::Compacted(before)).is_ok());
        }
    }

    /// Aborts every open watch; how many were open.
    pub(crate) fn break_watches(&mut self) -> usize {
        let mut n = 0;
        for res in &mut self.resources {
            for tx in res.watchers.drain(..) {
                if tx.send(WatchItem::Abort).is_ok() {
                    n += 1;
                }
            }
        }
        n
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub(crate) fn key_of(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        name.to_owned()
    } else {
        format!("{namespace}/{name}")
    }
}

fn ns_name(v: &Value) -> (String, String) {
    let m = &v["metadata"];
    (
        m["namespace"].as_str().unwrap_or("").to_owned(),
        m["name"].as_str().unwrap_or("").to_owned(),
    )
}

fn invalid_name(name: &str) -> Option<&'static str> {
    if name.len() > 253 {
        Some("must be no more than 253 characters")
    } else if name == "." || name == ".." {
        Some("may not be '.' or '..'")
    } else if name.contains('/') || name.contains('%') {
        Some("may not contain '/' or '%'")
    } else {
        None
    }
}

fn without_meta_status(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

/// Type and namespace as the path and the resource say, or the real server's 400.
fn normalize(ty: &ResourceType, body: &mut Value, path_ns: Option<&str>) -> Result<(), ApiError> {
    let Some(obj) = body.as_object_mut() else {
        return Err(ApiError::bad_request("the object is not a JSON object"));
    };
    let api_version = ty.api_version();
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str) {
        if !av.is_empty() && av != api_version {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({api_version})"
            )));
        }
    }
    if let Some(k) = obj.get("kind").and_then(Value::as_str) {
        if !k.is_empty() && k != ty.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                ty.kind
            )));
        }
    }
    obj.insert("apiVersion".into(), json!(api_version));
    obj.insert("kind".into(), json!(ty.kind));
    let meta = obj.entry("metadata").or_insert_with(|| json!({}));
    let Some(meta) = meta.as_object_mut() else {
        return Err(ApiError::bad_request("metadata is not an object"));
    };
    if ty.namespaced {
        let given = meta
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let ns = match path_ns {
            Some(p) => {
                if !given.is_empty() && given != p {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                p.to_owned()
            }
            None if given.is_empty() => "default".to_owned(),
            None => given,
        };
        meta.insert("namespace".into(), json!(ns));
    } else {
        meta.remove("namespace");
    }
    Ok(())
}

/// A list item as the real server writes it: the object without `apiVersion` and `kind`.
struct Untyped<'a>(&'a Value);

impl serde::Serialize for Untyped<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.as_object() {
            Some(m) => {
                let mut map = s.serialize_map(None)?;
                for (k, v) in m {
                    if k != "apiVersion" && k != "kind" {
                        map.serialize_entry(k, v)?;
                    }
                }
                map.end()
            }
            None => s.serialize_some(self.0),
        }
    }
}

/// A timestamp as metadata carries one: RFC 3339, UTC, whole seconds.
fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

//! An in-process stand-in for the kube-apiserver's REST protocol, for tests.
//!
//! No real kube-apiserver (nor etcd) can run where these tests run, yet the shell's
//! cluster-reading features (reflector caches, `audit`'s paged lists, PolicyReports, the
//! leader Lease) must be tested against something that answers the way the real server
//! does: kube-rs's own `Client`, `Api` and `runtime::watcher` run against it unchanged, so
//! the code under test is the code that runs against a cluster. The crate's own test,
//! `tests/conformance.rs`, holds it to that with kube-rs itself.
//!
//! What it is: HTTPS (rustls, a throwaway CA) on 127.0.0.1, the resource paths of the
//! resources a test registers, objects as JSON in one store with one global, strictly
//! increasing resourceVersion (etcd's revision), paged lists from consistent snapshots,
//! watches from a bounded history with bookmarks and 410s (and `sendInitialEvents`, kube's
//! streaming lists), create, update, patch and delete with the real status codes and
//! `Status` bodies. What it knowingly leaves out is listed in `KNOWN_GAPS`.
//!
//! A test takes it as a dev-dependency (the root package's integration tests do, as
//! `use tollgate_apiserver_standin as apiserver;`), starts one with [`ApiServer::start`] or
//! [`ApiServer::builder`], and points kube at it with [`ApiServer::client`], or a command
//! with [`ApiServer::write_kubeconfig`].
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use bytes::Bytes;
use futures::TryStreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde::ser::SerializeMap as _;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// What the stand-in knowingly does differently from a real kube-apiserver.
pub const KNOWN_GAPS: &[&str] = &[
    "JSON only: no protobuf, no CBOR, no Table output, no gzip",
    "no server-side apply (apply patches get 415); strategic merge patches are merge patches",
    "no admission, no validation of object contents, no defaulting (a pod gets no status.phase)",
    "deletion is immediate (as for an unscheduled pod or gracePeriodSeconds=0) unless finalizers hold it",
    "namespaces are not enforced: objects may be created in a namespace that does not exist, and deleting a namespace deletes nothing else",
    "no subresources (status, scale, eviction, log): they answer 404",
    "a watch or list at a resourceVersion newer than the store gets its 504 at once instead of after waiting up to 3 s for it",
    "HTTP/2 is served (ALPN h2) but kube-rs speaks HTTP/1.1, so only that is exercised",
    "continue tokens expire when their snapshot falls out of the retained window, not only at compaction",
    "bookmarks come at a fixed interval instead of about once a minute",
    "no field managers (managedFields), no ownerReference garbage collection",
    "no RBAC: one bearer token may do everything; 403s come only from injected faults",
    "no deprecated /api/v1/watch/... paths; messages of selector parse errors are close to, not the same as, the real ones",
];

// ---------------------------------------------------------------------------------------
// Resource types

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
    pub fn config_maps() -> Self {
        ResourceType::new("", "v1", "configmaps", "ConfigMap", true)
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
    pub fn policy_reports() -> Self {
        ResourceType::new(
            "wgpolicyk8s.io",
            "v1alpha2",
            "policyreports",
            "PolicyReport",
            true,
        )
    }
    pub fn cluster_policy_reports() -> Self {
        ResourceType::new(
            "wgpolicyk8s.io",
            "v1alpha2",
            "clusterpolicyreports",
            "ClusterPolicyReport",
            false,
        )
    }

    /// Everything above: what `ApiServer::start` registers.
    pub fn defaults() -> Vec<Self> {
        vec![
            Self::pods(),
            Self::namespaces(),
            Self::config_maps(),
            Self::leases(),
            Self::resource_claims(),
            Self::resource_claim_templates(),
            Self::policy_reports(),
            Self::cluster_policy_reports(),
        ]
    }
}

// ---------------------------------------------------------------------------------------
// Verbs, faults and the request log

/// The Kubernetes verb a request is, as RBAC and audit logs name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    /// Discovery, `/version`, unknown paths.
    Other,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::Other => "other",
        }
    }
}

/// A fault to inject: a `Status` error answer and/or a delay before answering, on requests
/// matching a resource and a verb, for a bounded count or until cleared.
#[derive(Clone, Debug)]
pub struct Fault {
    resource: Option<String>,
    verb: Option<Verb>,
    code: Option<u16>,
    message: Option<String>,
    retry_after: Option<u64>,
    delay: Option<Duration>,
    remaining: Option<usize>,
}

impl Fault {
    /// Answer with a `Status` of this HTTP code (403, 404, 409, 429, 500, 503, ...), with
    /// the reason and message the real server gives for it.
    pub fn status(code: u16) -> Self {
        Fault {
            resource: None,
            verb: None,
            code: Some(code),
            message: None,
            retry_after: None,
            delay: None,
            remaining: None,
        }
    }
    /// Wait this long before answering normally.
    pub fn delay(delay: Duration) -> Self {
        Fault {
            delay: Some(delay),
            code: None,
            ..Fault::status(0)
        }
    }
    /// Only requests for this resource (`pods`, or `leases.coordination.k8s.io`) and verb.
    pub fn on(self, resource: &str, verb: Verb) -> Self {
        self.resource(resource).verb(verb)
    }
    pub fn resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.to_owned());
        self
    }
    pub fn verb(mut self, verb: Verb) -> Self {
        self.verb = Some(verb);
        self
    }
    /// Only the next `n` matching requests; without it, until `clear_faults`.
    pub fn times(mut self, n: usize) -> Self {
        self.remaining = Some(n);
        self
    }
    pub fn message(mut self, message: &str) -> Self {
        self.message = Some(message.to_owned());
        self
    }
    /// A `Retry-After` header and `details.retryAfterSeconds`, as with 429 and 503.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }
    /// Also answer with a status after the delay.
    pub fn then_status(mut self, code: u16) -> Self {
        self.code = Some(code);
        self
    }
}

/// One request the stand-in answered.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    pub method: String,
    pub verb: Verb,
    pub path: String,
    /// The raw query string.
    pub query: String,
    /// The plural resource name, when the path named a registered resource.
    pub resource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The HTTP status of the answer (200 for a watch that started streaming).
    pub status: u16,
    /// The bearer token the request carried: which client it was, where several share a
    /// stand-in (see `Builder::no_auth` and `write_kubeconfig_for`).
    pub token: Option<String>,
}

impl RequestRecord {
    /// A query parameter, decoded.
    pub fn param(&self, key: &str) -> Option<String> {
        parse_query(&self.query)
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
}

// ---------------------------------------------------------------------------------------
// The store

/// The bearer token the kubeconfig carries and the server checks by default.
pub const TOKEN: &str = "standin-token";

/// A stored object. It is kept as its JSON text (as etcd keeps bytes), not as a
/// `serde_json::Value`: a Value tree costs several kilobytes a pod, which 50,000 pods turn
/// into hundreds of megabytes, and lists become copies of text.
struct Obj {
    /// `namespace/name` or `name`, the order etcd's keys sort in.
    key: String,
    namespace: String,
    name: String,
    labels: Vec<(String, String)>,
    /// `{"apiVersion":...,"kind":...`, shared by every object of the resource.
    type_prefix: Arc<str>,
    /// The object without `apiVersion` and `kind`: what a list item is.
    untyped: Box<str>,
}

impl Obj {
    fn new(value: &Value, type_prefix: Arc<str>) -> Obj {
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

    fn write_typed(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.type_prefix.as_bytes());
        if self.untyped.len() > 2 {
            out.push(b',');
            out.extend_from_slice(&self.untyped.as_bytes()[1..]);
        } else {
            out.push(b'}');
        }
    }

    fn typed(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.type_prefix.len() + self.untyped.len() + 1);
        self.write_typed(&mut out);
        out
    }

    fn value(&self) -> Value {
        serde_json::from_slice(&self.typed()).expect("stored JSON")
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

struct Change {
    rv: u64,
    kind: ChangeKind,
    /// For a deletion, the object as deleted, carrying the deletion's resourceVersion.
    obj: Arc<Obj>,
    prev: Option<Arc<Obj>>,
}

enum WatchItem {
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

struct Res {
    ty: ResourceType,
    type_prefix: Arc<str>,
    objects: BTreeMap<String, Arc<Obj>>,
    /// The revision of the last write to this resource.
    last_write: u64,
    history: VecDeque<Arc<Change>>,
    /// Every change after this revision is in `history`.
    floor: u64,
    watchers: Vec<mpsc::UnboundedSender<WatchItem>>,
    snaps: VecDeque<Snap>,
}

struct State {
    rv: u64,
    /// Continue tokens of lists before this revision are expired (compaction).
    token_floor: u64,
    resources: Vec<Res>,
    faults: Vec<Fault>,
    log: Vec<RequestRecord>,
    history_size: usize,
    snapshot_retention: usize,
    uid_counter: u64,
}

struct Shared {
    state: Mutex<State>,
    bookmark_interval: Duration,
    token: Option<String>,
    uid_seed: u64,
    open_watches: AtomicUsize,
    addr: SocketAddr,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An error answer: a `Status` object.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    details: Option<Box<Value>>,
    continue_token: Option<String>,
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.to_owned(),
            message: message.into(),
            details: None,
            continue_token: None,
            retry_after: None,
        }
    }
    fn details(mut self, details: Value) -> Self {
        self.details = Some(Box::new(details));
        self
    }
    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    fn not_found_path() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .details(json!({}))
    }
    fn not_found(ty: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", ty.qualified()),
        )
        .details(name_details(ty, name))
    }
    fn conflict(ty: &ResourceType, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                ty.qualified()
            ),
        )
        .details(name_details(ty, name))
    }
    fn stale(ty: &ResourceType, name: &str) -> Self {
        Self::conflict(
            ty,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    fn invalid(ty: &ResourceType, name: &str, message: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {message}", ty.kind),
        )
        .details(json!({"name": name, "group": ty.group, "kind": ty.kind}))
    }
    fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .details(json!({}))
    }
    fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    fn to_value(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = (**d).clone();
        }
        if let Some(secs) = self.retry_after {
            if v.get("details").is_none() {
                v["details"] = json!({});
            }
            v["details"]["retryAfterSeconds"] = json!(secs);
        }
        if let Some(c) = &self.continue_token {
            v["metadata"]["continue"] = json!(c);
        }
        if self.reason.is_empty() {
            v.as_object_mut().unwrap().remove("reason");
        }
        v
    }
}

fn name_details(ty: &ResourceType, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": ty.plural});
    if !ty.group.is_empty() {
        d["group"] = json!(ty.group);
    }
    d
}

/// The reason and message the real server gives with a code, for injected faults.
fn fault_error(
    fault: &Fault,
    code: u16,
    ty: Option<&ResourceType>,
    verb: Verb,
    ns: Option<&str>,
) -> ApiError {
    let resource = ty.map(|t| t.plural.as_str()).unwrap_or("");
    let group = ty.map(|t| t.group.as_str()).unwrap_or("");
    let (reason, default_message) = match code {
        400 => ("BadRequest", "the server rejected our request for an unknown reason".to_owned()),
        401 => ("Unauthorized", "Unauthorized".to_owned()),
        403 => {
            let scope = match ns {
                Some(ns) => format!("in the namespace \"{ns}\""),
                None => "at the cluster scope".to_owned(),
            };
            (
                "Forbidden",
                format!(
                    "{resource} is forbidden: User \"system:serviceaccount:tollgate:tollgate\" cannot {} resource \"{resource}\" in API group \"{group}\" {scope}",
                    verb.as_str()
                ),
            )
        }
        404 => ("NotFound", "the server could not find the requested resource".to_owned()),
        409 => ("Conflict", "the object has been modified; please apply your changes to the latest version and try again".to_owned()),
        410 => ("Expired", "too old resource version".to_owned()),
        429 => ("TooManyRequests", "the server has received too many requests and has asked us to try again later".to_owned()),
        500 => ("InternalError", "Internal error occurred: injected fault".to_owned()),
        503 => ("ServiceUnavailable", "the server is currently unable to handle the request".to_owned()),
        504 => ("Timeout", "the server was unable to return a response in the time allotted, but may still be processing the request".to_owned()),
        _ => ("", format!("injected fault {code}")),
    };
    let mut e = ApiError::new(
        code,
        reason,
        fault.message.clone().unwrap_or(default_message),
    );
    if let Some(ty) = ty {
        e = e.details(json!({"group": ty.group, "kind": ty.plural}));
    }
    e.retry_after = fault.retry_after;
    e
}

impl State {
    fn resolve(&self, resource: &str) -> Option<usize> {
        self.resources
            .iter()
            .position(|r| r.ty.qualified() == resource)
            .or_else(|| self.resources.iter().position(|r| r.ty.plural == resource))
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
    fn commit(&mut self, ri: usize, kind: ChangeKind, mut value: Value) -> Value {
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
    fn current_snapshot(&mut self, ri: usize) -> Arc<Vec<Arc<Obj>>> {
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

    fn snapshot_at(&self, ri: usize, rv: u64) -> Option<Arc<Vec<Arc<Obj>>>> {
        self.resources[ri]
            .snaps
            .iter()
            .rev()
            .find(|s| s.from <= rv && s.until.is_none_or(|u| rv < u))
            .map(|s| s.items.clone())
    }

    /// A create: the object as the real server stores it, or why not.
    fn prepare_create(
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
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", ty.qualified()),
            )
            .details(name_details(&ty, &name)));
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
    fn prepare_update(
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
    fn commit_update(&mut self, ri: usize, value: Value) -> Value {
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

    /// A delete: the answer's object, having written what it changes.
    fn delete(
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
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn key_of(namespace: &str, name: &str) -> String {
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

// ---------------------------------------------------------------------------------------
// Selectors

#[derive(Debug, Clone)]
enum LabelOp {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, Default)]
struct Filter {
    namespace: Option<String>,
    labels: Vec<(String, LabelOp)>,
    fields: Vec<(String, String, bool)>,
}

impl Filter {
    fn has_selectors(&self) -> bool {
        !self.labels.is_empty() || !self.fields.is_empty()
    }

    fn matches(&self, obj: &Obj) -> bool {
        if let Some(ns) = &self.namespace {
            if &obj.namespace != ns {
                return false;
            }
        }
        let ok = self.labels.iter().all(|(key, op)| {
            let have = obj.label(key);
            match (op, have) {
                (LabelOp::Eq(v), Some(h)) => h == v,
                (LabelOp::Eq(_), None) => false,
                (LabelOp::NotEq(v), Some(h)) => h != v,
                (LabelOp::NotEq(_), None) => true,
                (LabelOp::In(vs), Some(h)) => vs.iter().any(|v| v == h),
                (LabelOp::In(_), None) => false,
                (LabelOp::NotIn(vs), Some(h)) => !vs.iter().any(|v| v == h),
                (LabelOp::NotIn(_), None) => true,
                (LabelOp::Exists, h) => h.is_some(),
                (LabelOp::NotExists, h) => h.is_none(),
                (LabelOp::Gt(n), Some(h)) => h.parse::<i64>().is_ok_and(|h| h > *n),
                (LabelOp::Lt(n), Some(h)) => h.parse::<i64>().is_ok_and(|h| h < *n),
                (LabelOp::Gt(_) | LabelOp::Lt(_), None) => false,
            }
        });
        if !ok {
            return false;
        }
        // Other fields than the name and namespace are rare: read the text only for them.
        let mut parsed = None;
        self.fields.iter().all(|(field, want, negated)| {
            let have = match field.as_str() {
                "metadata.name" => obj.name.clone(),
                "metadata.namespace" => obj.namespace.clone(),
                _ => field_value(parsed.get_or_insert_with(|| obj.value()), field),
            };
            (have == *want) != *negated
        })
    }
}

fn field_value(v: &Value, path: &str) -> String {
    let mut cur = v;
    for part in path.split('.') {
        cur = &cur[part];
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn valid_label_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_label_selector(s: &str) -> Result<Vec<(String, LabelOp)>, ApiError> {
    let bad = |why: String| ApiError::bad_request(format!("unable to parse requirement: {why}"));
    let mut reqs = Vec::new();
    if s.trim().is_empty() {
        return Ok(reqs);
    }
    for part in split_top_level(s) {
        let p = part.trim();
        if p.is_empty() {
            return Err(bad(format!("found '', expected: identifier in \"{s}\"")));
        }
        let check_value = |v: &str| -> Result<String, ApiError> {
            let v = v.trim();
            if valid_label_value(v) {
                Ok(v.to_owned())
            } else {
                Err(bad(format!("invalid label value: \"{v}\"")))
            }
        };
        let (key, op) = if let Some(k) = p.strip_prefix('!') {
            (k.trim().to_owned(), LabelOp::NotExists)
        } else if let Some(open) = p.find('(') {
            let Some(inner) = p[open + 1..].strip_suffix(')') else {
                return Err(bad(format!("found '{p}', expected: ')'")));
            };
            let mut words = p[..open].split_whitespace();
            let (Some(key), Some(word), None) = (words.next(), words.next(), words.next()) else {
                return Err(bad(format!("found '{p}', expected: in, notin")));
            };
            let values = inner
                .split(',')
                .map(check_value)
                .collect::<Result<Vec<_>, _>>()?;
            let op = match word {
                "in" => LabelOp::In(values),
                "notin" => LabelOp::NotIn(values),
                other => return Err(bad(format!("found '{other}', expected: in, notin"))),
            };
            (key.to_owned(), op)
        } else if let Some((k, v)) = p.split_once("!=") {
            (k.trim().to_owned(), LabelOp::NotEq(check_value(v)?))
        } else if let Some((k, v)) = p.split_once("==") {
            (k.trim().to_owned(), LabelOp::Eq(check_value(v)?))
        } else if let Some((k, v)) = p.split_once('=') {
            (k.trim().to_owned(), LabelOp::Eq(check_value(v)?))
        } else if let Some((k, v)) = p.split_once('>') {
            let n = v.trim().parse().map_err(|_| {
                bad(format!(
                    "for 'Gt', 'Lt' operators, the value must be an integer: \"{v}\""
                ))
            })?;
            (k.trim().to_owned(), LabelOp::Gt(n))
        } else if let Some((k, v)) = p.split_once('<') {
            let n = v.trim().parse().map_err(|_| {
                bad(format!(
                    "for 'Gt', 'Lt' operators, the value must be an integer: \"{v}\""
                ))
            })?;
            (k.trim().to_owned(), LabelOp::Lt(n))
        } else {
            (p.to_owned(), LabelOp::Exists)
        };
        if !valid_label_key(&key) {
            return Err(bad(format!("invalid label key \"{key}\"")));
        }
        reqs.push((key, op));
    }
    Ok(reqs)
}

fn parse_field_selector(
    s: &str,
    ty: &ResourceType,
) -> Result<Vec<(String, String, bool)>, ApiError> {
    let mut reqs = Vec::new();
    if s.trim().is_empty() {
        return Ok(reqs);
    }
    // Split on commas that are not escaped; values may escape `\,`, `\=` and `\\`.
    let mut parts = vec![String::new()];
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                parts.last_mut().unwrap().push('\\');
                if let Some(n) = chars.next() {
                    parts.last_mut().unwrap().push(n);
                }
            }
            ',' => parts.push(String::new()),
            c => parts.last_mut().unwrap().push(c),
        }
    }
    for p in parts {
        let (field, value, negated) = if let Some((f, v)) = p.split_once("!=") {
            (f, v, true)
        } else if let Some((f, v)) = p.split_once("==") {
            (f, v, false)
        } else if let Some((f, v)) = p.split_once('=') {
            (f, v, false)
        } else {
            return Err(ApiError::bad_request(format!(
                "invalid selector: '{s}'; can't understand '{p}'"
            )));
        };
        let field = field.trim();
        let known = field == "metadata.name"
            || field == "metadata.namespace"
            || ty.field_labels.iter().any(|f| f == field);
        if !known {
            return Err(ApiError::bad_request(format!(
                "field label not supported: {field}"
            )));
        }
        let mut unescaped = String::new();
        let mut it = value.chars();
        while let Some(c) = it.next() {
            if c == '\\' {
                if let Some(n) = it.next() {
                    unescaped.push(n);
                }
            } else {
                unescaped.push(c);
            }
        }
        reqs.push((field.to_owned(), unescaped, negated));
    }
    Ok(reqs)
}

// ---------------------------------------------------------------------------------------
// Queries, paths, bodies

fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

struct Query(Vec<(String, String)>);

impl Query {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

/// A continue token as the real server writes one: base64 of
/// `{"v":"meta.k8s.io/v1","rv":N,"start":"KEY\u0000"}`, where rv -1 means "the latest".
fn encode_continue(rv: i64, start: &str) -> String {
    let text = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

fn decode_continue(token: &str) -> Result<(i64, String), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token}"));
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    if v["v"] != "meta.k8s.io/v1" {
        return Err(bad());
    }
    let rv = v["rv"].as_i64().ok_or_else(bad)?;
    let start = v["start"].as_str().ok_or_else(bad)?.to_owned();
    if rv == 0 || start.is_empty() {
        return Err(bad());
    }
    Ok((rv, start))
}

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

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

/// A response body: whole, or a watch's stream of chunks (an error in which cuts the
/// connection).
type Body = UnsyncBoxBody<Bytes, std::io::Error>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn json_response(code: u16, body: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(CONTENT_TYPE, "application/json")
        .body(full(body))
        .unwrap()
}

fn value_response(code: u16, v: &Value) -> Response<Body> {
    json_response(code, serde_json::to_vec(v).unwrap())
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = value_response(e.code, &e.to_value());
    if let Some(secs) = e.retry_after {
        r.headers_mut().insert(
            RETRY_AFTER,
            HeaderValue::from_str(&secs.to_string()).unwrap(),
        );
    }
    r
}

enum Route {
    Version,
    Health,
    CoreVersions,
    Groups,
    Resources {
        group: String,
        version: String,
    },
    Collection {
        ri: usize,
        ns: Option<String>,
    },
    Object {
        ri: usize,
        ns: Option<String>,
        name: String,
    },
}

fn route(state: &State, path: &str) -> Result<Route, ApiError> {
    let segs: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| percent_decode(s, false))
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Ok(Route::Version),
        ["healthz" | "readyz" | "livez"] => return Ok(Route::Health),
        ["api"] => return Ok(Route::CoreVersions),
        ["apis"] => return Ok(Route::Groups),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::not_found_path()),
    };
    let find = |plural: &str| {
        state
            .resources
            .iter()
            .position(|r| r.ty.group == group && r.ty.version == version && r.ty.plural == plural)
    };
    let namespaced_at = |plural: &str| find(plural).filter(|&ri| state.resources[ri].ty.namespaced);
    match rest {
        [] => {
            if state
                .resources
                .iter()
                .any(|r| r.ty.group == group && r.ty.version == version)
            {
                Ok(Route::Resources {
                    group: group.to_owned(),
                    version: version.to_owned(),
                })
            } else {
                Err(ApiError::not_found_path())
            }
        }
        ["namespaces", ns, plural, tail @ ..] if namespaced_at(plural).is_some() => {
            let ri = namespaced_at(plural).unwrap();
            match tail {
                [] => Ok(Route::Collection {
                    ri,
                    ns: Some((*ns).to_owned()),
                }),
                [name] => Ok(Route::Object {
                    ri,
                    ns: Some((*ns).to_owned()),
                    name: (*name).to_owned(),
                }),
                _ => Err(ApiError::not_found_path()),
            }
        }
        [plural, tail @ ..] => {
            let ri = find(plural).ok_or_else(ApiError::not_found_path)?;
            match tail {
                [] => Ok(Route::Collection { ri, ns: None }),
                [name] if !state.resources[ri].ty.namespaced => Ok(Route::Object {
                    ri,
                    ns: None,
                    name: (*name).to_owned(),
                }),
                _ => Err(ApiError::not_found_path()),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Handling requests

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let mut record = RequestRecord {
        method: method.to_string(),
        verb: Verb::Other,
        path: path.clone(),
        query: query.clone(),
        resource: None,
        namespace: None,
        name: None,
        status: 0,
        token: req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned),
    };
    let response = respond(&shared, req, &mut record)
        .await
        .unwrap_or_else(|e| error_response(&e));
    record.status = response.status().as_u16();
    shared.lock().log.push(record);
    Ok(response)
}

async fn respond(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    record: &mut RequestRecord,
) -> Result<Response<Body>, ApiError> {
    let route = route(&shared.lock(), &record.path)?;
    match route {
        Route::Version => return Ok(value_response(200, &version_info())),
        Route::Health => {
            return Ok(Response::builder()
                .status(200)
                .header(CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(full("ok"))
                .unwrap())
        }
        _ => {}
    }
    if let Some(token) = &shared.token {
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(token.as_str()) {
            return Err(ApiError::new(401, "Unauthorized", "Unauthorized"));
        }
    }
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_owned();
    let method = req.method().clone();
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?
        .to_bytes();
    // The real server's limit on a request body.
    if body.len() > 3 * 1024 * 1024 {
        return Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728",
        ));
    }
    let q = Query(parse_query(&record.query));
    let (ri, ns, name) = match route {
        Route::CoreVersions => {
            return Ok(value_response(
                200,
                &json!({
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}],
                }),
            ))
        }
        Route::Groups => return Ok(value_response(200, &group_list(&shared.lock()))),
        Route::Resources { group, version } => {
            return Ok(value_response(
                200,
                &resource_list(&shared.lock(), &group, &version),
            ))
        }
        Route::Collection { ri, ns } => (ri, ns, None),
        Route::Object { ri, ns, name } => (ri, ns, Some(name)),
        Route::Version | Route::Health => unreachable!(),
    };
    let ty = shared.lock().resources[ri].ty.clone();
    let is_watch = q.flag("watch");
    let verb = match (&method, name.is_some()) {
        (&Method::GET, _) if is_watch => Verb::Watch,
        (&Method::GET, false) => Verb::List,
        (&Method::GET, true) => Verb::Get,
        (&Method::POST, false) => Verb::Create,
        (&Method::PUT, true) => Verb::Update,
        (&Method::PATCH, true) => Verb::Patch,
        (&Method::DELETE, true) => Verb::Delete,
        (&Method::DELETE, false) => Verb::DeleteCollection,
        _ => return Err(ApiError::method_not_allowed()),
    };
    record.verb = verb;
    record.resource = Some(ty.plural.clone());
    record.namespace = ns.clone();
    record.name = name.clone();
    if verb == Verb::Create && ty.namespaced && ns.is_none() {
        return Err(ApiError::method_not_allowed());
    }

    // Faults: the first that matches, counted down.
    let fault = {
        let mut st = shared.lock();
        let found = st.faults.iter().position(|f| {
            f.verb.is_none_or(|v| v == verb)
                && f.resource
                    .as_deref()
                    .is_none_or(|r| r == ty.plural || r == ty.qualified())
        });
        found.map(|i| {
            let f = st.faults[i].clone();
            if let Some(n) = &mut st.faults[i].remaining {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    st.faults.remove(i);
                }
            }
            f
        })
    };
    if let Some(f) = fault {
        if let Some(d) = f.delay {
            tokio::time::sleep(d).await;
        }
        if let Some(code) = f.code {
            return Err(fault_error(&f, code, Some(&ty), verb, ns.as_deref()));
        }
    }

    let dry_run = q.get("dryRun") == Some("All");
    match verb {
        Verb::Get => {
            let st = shared.lock();
            let name = name.unwrap();
            let key = key_of(ns.as_deref().unwrap_or(""), &name);
            match st.resources[ri].objects.get(&key) {
                Some(o) => Ok(json_response(200, o.typed())),
                None => Err(ApiError::not_found(&ty, &name)),
            }
        }
        Verb::List => {
            let filter = filter_of(&q, &ty, ns, None)?;
            list(shared, ri, &filter, &q)
        }
        Verb::Watch => {
            let filter = filter_of(&q, &ty, ns, name.as_deref())?;
            watch(shared, ri, filter, &q)
        }
        Verb::Create => {
            let body = parse_body(&content_type, &body)?;
            let mut st = shared.lock();
            let value = st.prepare_create(ri, ns.as_deref(), body, shared.uid_seed, false)?;
            if dry_run {
                return Ok(value_response(201, &value));
            }
            let value = st.commit(ri, ChangeKind::Added, value);
            Ok(value_response(201, &value))
        }
        Verb::Update => {
            let body = parse_body(&content_type, &body)?;
            let name = name.unwrap();
            let mut st = shared.lock();
            let (new, old) = st.prepare_update(ri, ns.as_deref(), &name, body, false)?;
            match new {
                None => Ok(value_response(200, &old)),
                Some(v) if dry_run => Ok(value_response(200, &v)),
                Some(v) => Ok(value_response(200, &st.commit_update(ri, v))),
            }
        }
        Verb::Patch => {
            let name = name.unwrap();
            let mut st = shared.lock();
            let key = key_of(ns.as_deref().unwrap_or(""), &name);
            let Some(old) = st.resources[ri].objects.get(&key).cloned() else {
                return Err(ApiError::not_found(&ty, &name));
            };
            let patched = apply_patch(&content_type, &old.value(), &body)?;
            let (new, old) = st.prepare_update(ri, ns.as_deref(), &name, patched, false)?;
            match new {
                None => Ok(value_response(200, &old)),
                Some(v) if dry_run => Ok(value_response(200, &v)),
                Some(v) => Ok(value_response(200, &st.commit_update(ri, v))),
            }
        }
        Verb::Delete => {
            let options = if body.is_empty() {
                json!({})
            } else {
                serde_json::from_slice(&body)
                    .map_err(|e| ApiError::bad_request(format!("decoding DeleteOptions: {e}")))?
            };
            let name = name.unwrap();
            let mut st = shared.lock();
            let v = st.delete(
                ri,
                ns.as_deref().unwrap_or(""),
                &name,
                &options,
                dry_run,
                false,
            )?;
            Ok(value_response(200, &v))
        }
        Verb::DeleteCollection => {
            let filter = filter_of(&q, &ty, ns, None)?;
            let mut st = shared.lock();
            let targets: Vec<Arc<Obj>> = st.resources[ri]
                .objects
                .values()
                .filter(|o| filter.matches(o))
                .cloned()
                .collect();
            let prefix = st.resources[ri].type_prefix.clone();
            let mut items = Vec::new();
            for o in targets {
                if let Ok(v) = st.delete(ri, &o.namespace, &o.name, &json!({}), dry_run, false) {
                    items.push(Obj::new(&v, prefix.clone()));
                }
            }
            let rv = st.rv;
            drop(st);
            let mut out = Vec::new();
            write_list(&mut out, &ty, rv, None, None, items.iter());
            Ok(json_response(200, out))
        }
        Verb::Other => unreachable!(),
    }
}

fn parse_body(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    if !content_type.is_empty() && content_type != "application/json" && content_type != "*/*" {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json (got {content_type})"),
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the object provided is unrecognized: {e}")))
}

fn apply_patch(content_type: &str, old: &Value, body: &[u8]) -> Result<Value, ApiError> {
    let decode = |e: serde_json::Error| ApiError::bad_request(format!("error decoding patch: {e}"));
    let mut doc = old.clone();
    match content_type {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            let p: Value = serde_json::from_slice(body).map_err(decode)?;
            if !p.is_object() {
                return Err(ApiError::bad_request("patch is not a JSON object"));
            }
            json_patch::merge(&mut doc, &p);
        }
        "application/json-patch+json" => {
            let p: json_patch::Patch = serde_json::from_slice(body).map_err(decode)?;
            json_patch::patch(&mut doc, &p)
                .map_err(|e| ApiError::new(422, "Invalid", format!("the server rejected our request due to an error in our request: {e}")))?;
        }
        _ => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (server-side apply is not supported by the stand-in; got {content_type})"),
            ))
        }
    }
    Ok(doc)
}

fn filter_of(
    q: &Query,
    ty: &ResourceType,
    namespace: Option<String>,
    name: Option<&str>,
) -> Result<Filter, ApiError> {
    let mut f = Filter {
        namespace,
        labels: parse_label_selector(q.get("labelSelector").unwrap_or(""))?,
        fields: parse_field_selector(q.get("fieldSelector").unwrap_or(""), ty)?,
    };
    if let Some(name) = name {
        f.fields
            .push(("metadata.name".into(), name.to_owned(), false));
    }
    Ok(f)
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))
}

fn list(
    shared: &Arc<Shared>,
    ri: usize,
    filter: &Filter,
    q: &Query,
) -> Result<Response<Body>, ApiError> {
    let limit = match q.get("limit") {
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?,
        None => 0,
    };
    let rv_param = q.get("resourceVersion").filter(|s| !s.is_empty());
    let rv_match = q.get("resourceVersionMatch").filter(|s| !s.is_empty());
    let continue_param = q.get("continue").filter(|s| !s.is_empty());

    let (items, list_rv, start) = {
        let mut st = shared.lock();
        match continue_param {
            Some(token) => {
                if rv_param.is_some() || rv_match.is_some() {
                    return Err(ApiError::bad_request(
                        "specifying resource version is not allowed when using continue",
                    ));
                }
                let (rv, start) = decode_continue(token)?;
                if rv == -1 {
                    let items = st.current_snapshot(ri);
                    (items, st.rv, Some(start))
                } else {
                    let rv = rv as u64;
                    let snap = if rv < st.token_floor {
                        None
                    } else {
                        st.snapshot_at(ri, rv)
                    };
                    match snap {
                        Some(items) => (items, rv, Some(start)),
                        None => {
                            let mut e = ApiError::expired(CONTINUE_EXPIRED);
                            e.continue_token = Some(encode_continue(-1, &start));
                            return Err(e);
                        }
                    }
                }
            }
            None => {
                let wanted = rv_param.map(parse_rv).transpose()?.unwrap_or(0);
                match rv_match {
                    Some("Exact") => {
                        if wanted == 0 {
                            return Err(ApiError::bad_request(
                                "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                            ));
                        }
                        if wanted > st.rv {
                            return Err(too_large(wanted, st.rv));
                        }
                        let snap = if wanted == st.rv {
                            Some(st.current_snapshot(ri))
                        } else if wanted < st.token_floor {
                            None
                        } else {
                            st.snapshot_at(ri, wanted)
                        };
                        match snap {
                            Some(items) => (items, wanted, None),
                            None => {
                                return Err(ApiError::expired(format!(
                                    "too old resource version: {wanted} ({})",
                                    st.token_floor
                                )))
                            }
                        }
                    }
                    None | Some("NotOlderThan") => {
                        if wanted > st.rv {
                            return Err(too_large(wanted, st.rv));
                        }
                        let items = st.current_snapshot(ri);
                        (items, st.rv, None)
                    }
                    Some(other) => {
                        return Err(ApiError::bad_request(format!(
                            "resourceVersionMatch: Unsupported value: \"{other}\": supported values: \"Exact\", \"NotOlderThan\""
                        )))
                    }
                }
            }
        }
    };

    // The keys of this list: one namespace's, or all.
    let (lo, hi) = match &filter.namespace {
        Some(ns) => {
            let prefix = format!("{ns}/");
            let lo = items.partition_point(|o| o.key.as_str() < prefix.as_str());
            let hi = lo + items[lo..].partition_point(|o| o.key.starts_with(&prefix));
            (lo, hi)
        }
        None => (0, items.len()),
    };
    let from = match &start {
        Some(s) => lo + items[lo..hi].partition_point(|o| o.key.as_str() < s.as_str()),
        None => lo,
    };
    let mut selected: Vec<&Obj> = Vec::new();
    let mut next = hi;
    for (i, o) in items[from..hi].iter().enumerate() {
        if limit > 0 && selected.len() == limit {
            next = from + i;
            break;
        }
        if filter.matches(o) {
            selected.push(&**o);
        }
    }
    let (token, remaining) = if next < hi {
        let last = &items[next - 1].key;
        let remaining = (!filter.has_selectors()).then_some(hi - next);
        (
            Some(encode_continue(list_rv as i64, &format!("{last}\u{0}"))),
            remaining,
        )
    } else {
        (None, None)
    };
    let ty = shared.lock().resources[ri].ty.clone();
    let mut out = Vec::with_capacity(selected.len() * 512 + 256);
    write_list(
        &mut out,
        &ty,
        list_rv,
        token.as_deref(),
        remaining,
        selected.into_iter(),
    );
    Ok(json_response(200, out))
}

fn too_large(wanted: u64, current: u64) -> ApiError {
    ApiError::new(
        504,
        "Timeout",
        format!("Too large resource version: {wanted}, current: {current}"),
    )
    .details(json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}))
}

fn write_list<'a>(
    out: &mut Vec<u8>,
    ty: &ResourceType,
    rv: u64,
    token: Option<&str>,
    remaining: Option<usize>,
    items: impl Iterator<Item = &'a Obj>,
) {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(t) = token {
        meta["continue"] = json!(t);
    }
    if let Some(r) = remaining {
        meta["remainingItemCount"] = json!(r);
    }
    out.extend_from_slice(b"{\"kind\":");
    serde_json::to_writer(&mut *out, &format!("{}List", ty.kind)).unwrap();
    out.extend_from_slice(b",\"apiVersion\":");
    serde_json::to_writer(&mut *out, &ty.api_version()).unwrap();
    out.extend_from_slice(b",\"metadata\":");
    serde_json::to_writer(&mut *out, &meta).unwrap();
    out.extend_from_slice(b",\"items\":[");
    for (i, v) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(v.untyped.as_bytes());
    }
    out.extend_from_slice(b"]}");
}

// ---------------------------------------------------------------------------------------
// Watches

enum Pending {
    Change(Arc<Change>),
    Added(Arc<Obj>),
    Bookmark { rv: u64, initial_end: bool },
    Compacted(u64),
    Error(Value),
}

struct WatchStream {
    shared: Arc<Shared>,
    ty: ResourceType,
    filter: Filter,
    pending: VecDeque<Pending>,
    rx: Option<mpsc::UnboundedReceiver<WatchItem>>,
    deadline: tokio::time::Instant,
    bookmarks: Option<tokio::time::Interval>,
    start_rv: u64,
    /// After a compaction, bookmarks claim no revision past it until a change after it
    /// passes: the revision the compaction took is not one this watcher would resume
    /// from after a real compaction, and a test that compacts then breaks watches must
    /// get its 410.
    bookmark_cap: Option<u64>,
    end_after_pending: bool,
    done: bool,
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.shared.open_watches.fetch_sub(1, Ordering::SeqCst);
    }
}

fn event_line(out: &mut Vec<u8>, kind: &str, obj: &Obj) {
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    obj.write_typed(out);
    out.extend_from_slice(b"}\n");
}

fn event_line_value(out: &mut Vec<u8>, kind: &str, obj: &Value) {
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    serde_json::to_writer(&mut *out, obj).unwrap();
    out.extend_from_slice(b"}\n");
}

impl WatchStream {
    fn render(&mut self, p: Pending, out: &mut Vec<u8>) {
        match p {
            Pending::Added(o) => {
                if self.filter.matches(&o) {
                    event_line(out, "ADDED", &o);
                }
            }
            Pending::Change(c) => {
                if self.bookmark_cap.is_some_and(|cap| c.rv > cap) {
                    self.bookmark_cap = None;
                }
                let cur = self.filter.matches(&c.obj);
                let old = c.prev.as_ref().is_some_and(|p| self.filter.matches(p));
                match c.kind {
                    ChangeKind::Added if cur => event_line(out, "ADDED", &c.obj),
                    ChangeKind::Deleted if cur => event_line(out, "DELETED", &c.obj),
                    ChangeKind::Modified => match (cur, old) {
                        (true, true) => event_line(out, "MODIFIED", &c.obj),
                        (true, false) => event_line(out, "ADDED", &c.obj),
                        // Leaving the selection is a deletion for this watcher, as the
                        // watch cache tells it: the old object at the new revision.
                        (false, true) => {
                            let mut prev = c.prev.as_ref().unwrap().value();
                            prev["metadata"]["resourceVersion"] = json!(c.rv.to_string());
                            event_line_value(out, "DELETED", &prev);
                        }
                        (false, false) => {}
                    },
                    _ => {}
                }
            }
            Pending::Compacted(rv) => self.bookmark_cap = Some(rv),
            Pending::Bookmark { rv, initial_end } => {
                let rv = self.bookmark_cap.map_or(rv, |cap| cap.min(rv));
                let mut meta = json!({"resourceVersion": rv.max(self.start_rv).to_string()});
                if initial_end {
                    meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                }
                event_line_value(
                    out,
                    "BOOKMARK",
                    &json!({"kind": self.ty.kind, "apiVersion": self.ty.api_version(), "metadata": meta}),
                );
            }
            Pending::Error(status) => event_line_value(out, "ERROR", &status),
        }
    }

    async fn next_chunk(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        loop {
            if self.done {
                return None;
            }
            let mut buf = Vec::new();
            while buf.len() < 64 * 1024 {
                let Some(p) = self.pending.pop_front() else {
                    break;
                };
                self.render(p, &mut buf);
            }
            if !buf.is_empty() {
                return Some(Ok(Bytes::from(buf)));
            }
            if !self.pending.is_empty() {
                continue;
            }
            if self.end_after_pending {
                self.done = true;
                return None;
            }
            let rx = self.rx.as_mut()?;
            tokio::select! {
                _ = tokio::time::sleep_until(self.deadline) => {
                    // timeoutSeconds: a clean end of the response, as the real server's.
                    self.done = true;
                    return None;
                }
                _ = async { self.bookmarks.as_mut().unwrap().tick().await }, if self.bookmarks.is_some() => {
                    // Under the lock every change up to the current revision is already in
                    // the channel, so a bookmark after them never claims a revision this
                    // watcher has not been sent.
                    let mut aborted = false;
                    {
                        let st = self.shared.lock();
                        let rx = self.rx.as_mut().unwrap();
                        while let Ok(item) = rx.try_recv() {
                            match item {
                                WatchItem::Change(c) => self.pending.push_back(Pending::Change(c)),
                                WatchItem::Compacted(rv) => self.pending.push_back(Pending::Compacted(rv)),
                                WatchItem::Abort => aborted = true,
                            }
                        }
                        self.pending.push_back(Pending::Bookmark { rv: st.rv, initial_end: false });
                    }
                    if aborted {
                        return self.abort();
                    }
                }
                item = rx.recv() => match item {
                    Some(WatchItem::Change(c)) => self.pending.push_back(Pending::Change(c)),
                    Some(WatchItem::Compacted(rv)) => self.pending.push_back(Pending::Compacted(rv)),
                    Some(WatchItem::Abort) | None => return self.abort(),
                }
            }
        }
    }

    fn abort(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        self.done = true;
        // An error from the body makes hyper drop the connection mid-response: what a
        // client sees when the apiserver or a load balancer goes away.
        Some(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "watch broken by the test",
        )))
    }
}

fn watch(
    shared: &Arc<Shared>,
    ri: usize,
    filter: Filter,
    q: &Query,
) -> Result<Response<Body>, ApiError> {
    let rv_param = q.get("resourceVersion").filter(|s| !s.is_empty());
    let start_rv = rv_param.map(parse_rv).transpose()?.unwrap_or(0);
    let send_initial = q.flag("sendInitialEvents");
    let bookmarks_allowed = q.flag("allowWatchBookmarks");
    if send_initial && (q.get("resourceVersionMatch") != Some("NotOlderThan") || !bookmarks_allowed)
    {
        return Err(ApiError::new(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan and allowWatchBookmarks to true",
        ));
    }
    // Without timeoutSeconds the real server picks one between its --min-request-timeout
    // (1800 s) and twice that.
    let timeout = match q.get("timeoutSeconds") {
        Some(t) => t
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {t}")))?,
        None => 1800,
    };

    let mut st = shared.lock();
    if !send_initial && start_rv > st.rv {
        return Err(too_large(start_rv, st.rv));
    }
    let ty = st.resources[ri].ty.clone();
    let mut pending = VecDeque::new();
    let mut rx = None;
    let mut end_after_pending = false;
    if send_initial || start_rv == 0 {
        // "Get state and start at most recent": synthetic ADDED events for what is there.
        for o in st.resources[ri].objects.values() {
            pending.push_back(Pending::Added(o.clone()));
        }
        if send_initial {
            pending.push_back(Pending::Bookmark {
                rv: st.rv,
                initial_end: true,
            });
        }
    } else if start_rv < st.resources[ri].floor {
        let floor = st.resources[ri].floor;
        pending.push_back(Pending::Error(
            ApiError::expired(format!("too old resource version: {start_rv} ({floor})")).to_value(),
        ));
        end_after_pending = true;
    } else {
        let res = &st.resources[ri];
        let first = res.history.partition_point(|c| c.rv <= start_rv);
        for c in res.history.range(first..) {
            pending.push_back(Pending::Change(c.clone()));
        }
    }
    if !end_after_pending {
        let (tx, r) = mpsc::unbounded_channel();
        st.resources[ri].watchers.push(tx);
        rx = Some(r);
    }
    let current = st.rv;
    drop(st);

    shared.open_watches.fetch_add(1, Ordering::SeqCst);
    let period = shared.bookmark_interval;
    let stream = WatchStream {
        shared: shared.clone(),
        ty,
        filter,
        pending,
        rx,
        deadline: tokio::time::Instant::now() + Duration::from_secs(timeout),
        bookmarks: bookmarks_allowed
            .then(|| tokio::time::interval_at(tokio::time::Instant::now() + period, period)),
        start_rv: if send_initial {
            0
        } else {
            start_rv.min(current)
        },
        bookmark_cap: None,
        end_after_pending,
        done: false,
    };
    let body = futures::stream::unfold(stream, |mut s| async move {
        s.next_chunk().await.map(|chunk| (chunk, s))
    });
    Ok(Response::builder()
        .status(200)
        .header(CONTENT_TYPE, "application/json")
        .body(StreamBody::new(body.map_ok(Frame::data)).boxed_unsync())
        .unwrap())
}

// ---------------------------------------------------------------------------------------
// Discovery

fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "36",
        "emulationMajor": "1",
        "emulationMinor": "36",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "35",
        "gitVersion": "v1.36.0-standin",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn group_list(st: &State) -> Value {
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in st.resources.iter().filter(|r| !r.ty.group.is_empty()) {
        let versions = groups.entry(&r.ty.group).or_default();
        if !versions.contains(&r.ty.version.as_str()) {
            versions.push(&r.ty.version);
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, vs)| {
            let versions: Vec<Value> = vs
                .iter()
                .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                .collect();
            json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(st: &State, group: &str, version: &str) -> Value {
    let resources: Vec<Value> = st
        .resources
        .iter()
        .filter(|r| r.ty.group == group && r.ty.version == version)
        .map(|r| {
            json!({
                "name": r.ty.plural,
                "singularName": r.ty.kind.to_lowercase(),
                "namespaced": r.ty.namespaced,
                "kind": r.ty.kind,
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            })
        })
        .collect();
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

// ---------------------------------------------------------------------------------------
// Time

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

// ---------------------------------------------------------------------------------------
// The handle

/// How to start a stand-in: which resources, how much history, how often bookmarks come.
pub struct Builder {
    resources: Vec<ResourceType>,
    history_size: usize,
    snapshot_retention: usize,
    bookmark_interval: Duration,
    token: Option<String>,
}

impl Builder {
    pub fn resource(mut self, ty: ResourceType) -> Self {
        self.resources.push(ty);
        self
    }
    pub fn resources(mut self, tys: impl IntoIterator<Item = ResourceType>) -> Self {
        self.resources.extend(tys);
        self
    }
    /// Changes kept per resource for watches to resume from (the watch cache's capacity);
    /// a watch from before the oldest kept gets 410. Default 10,000.
    pub fn history_size(mut self, n: usize) -> Self {
        self.history_size = n;
        self
    }
    /// Past states kept per resource for continue tokens (etcd keeps them until
    /// compaction). Default 64.
    pub fn snapshot_retention(mut self, n: usize) -> Self {
        self.snapshot_retention = n;
        self
    }
    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK. Default 1 s.
    pub fn bookmark_interval(mut self, d: Duration) -> Self {
        self.bookmark_interval = d;
        self
    }
    /// Accept requests without a bearer token (and with any).
    pub fn no_auth(mut self) -> Self {
        self.token = None;
        self
    }

    pub async fn start(self) -> ApiServer {
        let certs = Certificates::generate();
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(vec![certs.cert_der], certs.key_der)
        .expect("TLS config");
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ u64::from(addr.port());
        let resources = self
            .resources
            .into_iter()
            .map(|ty| Res {
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
            })
            .collect();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                rv: 0,
                token_floor: 0,
                resources,
                faults: Vec::new(),
                log: Vec::new(),
                history_size: self.history_size,
                snapshot_retention: self.snapshot_retention,
                uid_counter: 0,
            }),
            bookmark_interval: self.bookmark_interval,
            token: self.token.clone(),
            uid_seed: seed,
            open_watches: AtomicUsize::new(0),
            addr,
        });
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(serve(listener, acceptor, shared.clone(), stop_rx));
        ApiServer {
            shared,
            addr,
            ca_pem: certs.ca_pem,
            ca_der: certs.ca_der.to_vec(),
            token: self.token,
            stop: Mutex::new(Some(stop_tx)),
            task: Mutex::new(Some(task)),
        }
    }
}

/// A throwaway CA and the serving certificate it signs for 127.0.0.1 and localhost, as
/// `tollgate certs` makes them (ECDSA P-256), valid from 1975 to 4096 (rcgen's defaults).
struct Certificates {
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    cert_der: CertificateDer<'static>,
    key_der: PrivateKeyDer<'static>,
}

impl Certificates {
    fn generate() -> Self {
        let dn = |cn: &str| {
            let mut d = DistinguishedName::new();
            d.push(DnType::CommonName, cn);
            d.push(DnType::OrganizationName, "tollgate");
            d
        };
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.distinguished_name = dn("apiserver stand-in CA");
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca, ca_key);

        let key = KeyPair::generate().expect("serving key");
        let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("serving parameters");
        leaf.distinguished_name = dn("127.0.0.1");
        leaf.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = leaf.signed_by(&key, &issuer).expect("serving certificate");
        Certificates {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().clone(),
            cert_der: cert.der().clone(),
            key_der: PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        }
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
) {
    // Dropping the set when the loop ends aborts every connection, watches included.
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let shared = shared.clone();
                conns.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// A running stand-in. Dropping it stops the server.
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    ca_pem: String,
    ca_der: Vec<u8>,
    token: Option<String>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
    }
}

impl ApiServer {
    /// A builder with no resources registered, a bearer token required, history 10,000,
    /// bookmarks every second.
    pub fn builder() -> Builder {
        Builder {
            resources: Vec::new(),
            history_size: 10_000,
            snapshot_retention: 64,
            bookmark_interval: Duration::from_secs(1),
            token: Some(TOKEN.to_owned()),
        }
    }

    /// A stand-in serving `ResourceType::defaults()` with the builder's defaults.
    pub async fn start() -> ApiServer {
        Self::builder()
            .resources(ResourceType::defaults())
            .start()
            .await
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// A kube client configuration for this server: its CA, its token, namespace `default`.
    pub fn kubeconfig(&self) -> kube::Config {
        let mut config = kube::Config::new(self.url().parse().expect("URL"));
        config.root_cert = Some(vec![self.ca_der.clone()]);
        if let Some(t) = &self.token {
            config.auth_info = serde_json::from_value(json!({ "token": t })).expect("AuthInfo");
        }
        config
    }

    /// A kube client for this server; call inside a tokio runtime.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.kubeconfig()).expect("kube client")
    }

    /// A kubeconfig file's text: cluster, user and context all named `standin`.
    pub fn kubeconfig_yaml(&self) -> String {
        self.kubeconfig_yaml_with(self.token.as_deref())
    }

    /// `kubeconfig_yaml` with this bearer token (or none): a stand-in started with
    /// `no_auth` accepts any, and the request log tells the clients apart by it.
    pub fn kubeconfig_yaml_with(&self, token: Option<&str>) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let user = match token {
            Some(t) => format!("    token: {t}\n"),
            None => "    {}\n".to_owned(),
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: standin\n  user:\n{user}contexts:\n- name: standin\n  context:\n    cluster: standin\n    user: standin\n    namespace: default\ncurrent-context: standin\n",
            self.url()
        )
    }

    /// Writes `kubeconfig_yaml()` to `path`, for a command run with `--kubeconfig FILE`.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    /// `write_kubeconfig` with a token of the test's choosing (see `kubeconfig_yaml_with`).
    pub fn write_kubeconfig_for(&self, path: &Path, token: &str) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml_with(Some(token)))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    fn index(st: &State, resource: &str) -> usize {
        st.resolve(resource)
            .unwrap_or_else(|| panic!("resource {resource} is not registered"))
    }

    /// Creates or replaces an object without HTTP: the store assigns uid (kept on a
    /// replace), creationTimestamp and a new resourceVersion, and watchers see ADDED or
    /// MODIFIED. The namespace comes from the object (`default` if it has none).
    pub fn insert(&self, resource: &str, obj: Value) -> Value {
        let mut st = self.state();
        let ri = Self::index(&st, resource);
        Self::upsert(&mut st, ri, obj, self.shared.uid_seed)
    }

    /// `insert` for many objects under one lock: for seeding tens of thousands quickly.
    /// Returns the resourceVersion after the last.
    pub fn insert_many(&self, resource: &str, objs: impl IntoIterator<Item = Value>) -> u64 {
        let mut st = self.state();
        let ri = Self::index(&st, resource);
        for obj in objs {
            Self::upsert(&mut st, ri, obj, self.shared.uid_seed);
        }
        st.rv
    }

    fn upsert(st: &mut State, ri: usize, mut obj: Value, seed: u64) -> Value {
        let ty = st.resources[ri].ty.clone();
        normalize(&ty, &mut obj, None).expect("an object of this resource");
        let (ns, name) = ns_name(&obj);
        if st.resources[ri].objects.contains_key(&key_of(&ns, &name)) {
            let ns = ty.namespaced.then_some(ns.as_str());
            let (new, old) = st
                .prepare_update(ri, ns, &name, obj, true)
                .expect("a valid update");
            match new {
                Some(v) => st.commit_update(ri, v),
                None => old,
            }
        } else {
            let v = st
                .prepare_create(ri, None, obj, seed, true)
                .expect("a valid object");
            st.commit(ri, ChangeKind::Added, v)
        }
    }

    /// Changes a stored object in place (a new resourceVersion, a MODIFIED event); `None`
    /// if it is absent.
    pub fn modify(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        let mut st = self.state();
        let ri = Self::index(&st, resource);
        let mut v = st.resources[ri]
            .objects
            .get(&key_of(namespace.unwrap_or(""), name))?
            .value();
        f(&mut v);
        Some(Self::upsert(&mut st, ri, v, self.shared.uid_seed))
    }

    /// Deletes an object at once, finalizers or not (a DELETED event); `None` if absent.
    pub fn remove(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let mut st = self.state();
        let ri = Self::index(&st, resource);
        st.delete(ri, namespace.unwrap_or(""), name, &json!({}), false, true)
            .ok()
    }

    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let st = self.state();
        let ri = Self::index(&st, resource);
        st.resources[ri]
            .objects
            .get(&key_of(namespace.unwrap_or(""), name))
            .map(|o| o.value())
    }

    /// Every stored object of a resource, in key order.
    pub fn objects(&self, resource: &str) -> Vec<Value> {
        let st = self.state();
        let ri = Self::index(&st, resource);
        st.resources[ri]
            .objects
            .values()
            .map(|o| o.value())
            .collect()
    }

    pub fn len(&self, resource: &str) -> usize {
        let st = self.state();
        let ri = Self::index(&st, resource);
        st.resources[ri].objects.len()
    }

    /// The current (last written) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state().rv
    }

    /// Compaction: forgets every change so far and expires every continue token. A watch
    /// from any resourceVersion handed out before gets 410 Expired; new lists and watches
    /// work. Like the real compactor's write, it takes a revision of its own. Open watches
    /// go on (compaction does not end them); one broken after it resumes into a 410.
    pub fn compact(&self) {
        let mut st = self.state();
        let before = st.rv;
        st.rv += 1;
        let rv = st.rv;
        st.token_floor = rv;
        for res in &mut st.resources {
            res.history.clear();
            res.floor = rv;
            res.snaps.clear();
            res.watchers
                .retain(|tx| tx.send(WatchItem::Compacted(before)).is_ok());
        }
    }

    /// Aborts every open watch mid-stream, as a lost connection does; returns how many.
    pub fn break_watches(&self) -> usize {
        let mut st = self.state();
        let mut n = 0;
        for res in &mut st.resources {
            for tx in res.watchers.drain(..) {
                if tx.send(WatchItem::Abort).is_ok() {
                    n += 1;
                }
            }
        }
        n
    }

    /// Watches being served now.
    pub fn open_watches(&self) -> usize {
        self.shared.open_watches.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` watches are open, or `timeout` passes; whether they are.
    pub async fn wait_for_watches(&self, n: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.open_watches() < n {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Injects a fault; faults are tried in the order given, the first that matches wins.
    pub fn inject(&self, fault: Fault) {
        self.state().faults.push(fault);
    }

    pub fn clear_faults(&self) {
        self.state().faults.clear();
    }

    /// Every request answered so far, in the order the answers were given.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.state().log.clone()
    }

    pub fn clear_requests(&self) {
        self.state().log.clear();
    }

    /// How many requests of this verb on this resource (`pods` or `leases.coordination.k8s.io`).
    pub fn count(&self, verb: Verb, resource: &str) -> usize {
        self.requests_for(verb, resource).len()
    }

    pub fn requests_for(&self, verb: Verb, resource: &str) -> Vec<RequestRecord> {
        let st = self.state();
        let Some(ri) = st.resolve(resource) else {
            return Vec::new();
        };
        let plural = st.resources[ri].ty.plural.clone();
        st.log
            .iter()
            .filter(|r| r.verb == verb && r.resource.as_deref() == Some(plural.as_str()))
            .cloned()
            .collect()
    }

    /// Stops accepting, ends every connection (watches included), and waits for that.
    pub async fn shutdown(&self) {
        let stop = self.stop.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(stop) = stop {
            let _ = stop.send(());
        }
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

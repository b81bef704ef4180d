//! An in-process stand-in for the kube-apiserver's REST protocol, for the tests of what a
//! real kube-apiserver cannot be made to do on cue.
//!
//! The tests run against a real kube-apiserver and etcd wherever they can
//! (tests/common/envtest.rs: envtest's binaries, started once per test binary, and on
//! demand planes of other shapes: one serving DRA only as v1beta1, one serving no DRA and
//! no CRDs, one with the real scheduler and controllers): what the apiserver decides (what
//! it decodes, validates, defaults, stores and authorizes, the CRDs of Kueue and Kubeflow
//! Trainer, RBAC's 403s) and what a cluster of another shape serves are held to the
//! apiserver itself. This crate is left for what a real apiserver cannot be made to do on
//! cue. Its users, all of them:
//!
//! - a list that fails (500, 503) until the test says otherwise: `/readyz` waiting for the
//!   first sync (tests/cluster_context.rs `readyz_waits_for_the_first_sync`;
//!   tests/feasibility_context.rs `nodes_not_listed_yet_leave_the_pod_unchecked`);
//! - a watch held back ([`Fault::delay`] on `Verb::Watch` after [`ApiServer::break_watches`]),
//!   so that only a GET can know an object just written, and the GETs counted
//!   ([`ApiServer::count`]): cluster_context `a_template_missing_from_the_cache_is_fetched_once`
//!   and `a_namespace_the_watch_has_not_delivered_is_fetched_once`, trainjob_context
//!   `a_runtime_the_watch_has_not_delivered_is_fetched_once`, feasibility_context
//!   `a_template_the_watch_holds_back_is_fetched_in_the_version_served` (DRA served as
//!   `v1beta1` only, the GET's path read from the request log);
//! - a GET that does not answer in time: cluster_context `a_slow_fetch_is_cut_short`;
//! - a watch broken mid-stream with its history compacted (410 Gone) while lists fail:
//!   cluster_context `a_broken_watch_keeps_the_last_state_and_recovers`;
//! - a continue token expired mid-list by a compaction on cue ([`ApiServer::compact`]):
//!   tests/audit.rs `an_expired_continue_token_resumes_with_the_one_the_410_carries`;
//! - Secret creates that fail (500) twice, then succeed late: tests/self_managed_certs.rs
//!   `failed_secret_creates_are_retried_with_the_same_ca`;
//! - the requests themselves as the claim, read from the request log
//!   ([`ApiServer::requests_for`]): audit `pods_are_listed_in_pages_namespace_by_namespace`
//!   (the pages of a list), `audit_reports_what_can_never_run` (a cluster per golden case of feasibility or nodes,
//!   nodes and classes each listed once);
//! - tens of thousands of pods put in place at once ([`ApiServer::insert_many`]), for
//!   measurements: audit `memory_stays_flat_from_5000_to_20000_pods` (and the ignored
//!   `..._to_50000_pods`), tests/audit_server.rs
//!   `review_latency_with_and_without_a_background_audit` (ignored).
//!
//! It no longer imitates what only the moved tests needed: ConfigMaps and
//! ClusterPolicyReports are not registered (tollgate reads neither), and a fault's message
//! and a status after a delay are gone (no test asked for them). What it knowingly does
//! differently from a real kube-apiserver is listed in [`KNOWN_GAPS`]: a test that needs one
//! of those belongs on the real apiserver.
//!
//! What it is: HTTPS (rustls, a throwaway CA) on 127.0.0.1, the resource paths of the
//! resources a test registers, objects as JSON in one store with one global, strictly
//! increasing resourceVersion (etcd's revision), paged lists from consistent snapshots,
//! watches from a bounded history with bookmarks and 410s (and `sendInitialEvents`, kube's
//! streaming lists), create, update, patch and delete with the real status codes and
//! `Status` bodies. kube-rs's own `Client`, `Api` and `runtime::watcher` run against it
//! unchanged, so the code under test is the code that runs against a cluster; the crate's
//! own test, `tests/conformance.rs`, holds it to that with kube-rs itself.
//!
//! A test takes it as a dev-dependency (the root package's integration tests do, as
//! `use tollgate_apiserver_standin as apiserver;`), starts one with [`ApiServer::start`] or
//! [`ApiServer::builder`], and points kube at it with [`ApiServer::client`], or a command
//! with [`ApiServer::write_kubeconfig`].
//!
//! The modules, one concern each (this file is the handle a test holds: [`Builder`] and
//! [`ApiServer`]):
//!
//! - `store`: the registered resources ([`ResourceType`]), the objects, the global
//!   resourceVersion, each resource's history of changes and its snapshots.
//! - `selectors`: label and field selectors, parsed as the real server parses them, and
//!   the filter they make.
//! - `lists`: query strings, continue tokens, and paged lists read from one snapshot.
//! - `watches`: watch streams from the history, bookmarks, 410s and `sendInitialEvents`.
//! - `http`: routing and the verbs, discovery, TLS and the connections, `Status` bodies
//!   ([`ApiError`]).
//! - `faults`: injected [`Fault`]s, and the request log ([`RequestRecord`], [`Verb`]).
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

mod faults;
mod http;
mod lists;
mod selectors;
mod store;
mod watches;

pub use faults::{Fault, RequestRecord, Verb};
pub use http::ApiError;
pub use store::ResourceType;
use store::{key_of, Shared, State};

/// What the stand-in knowingly does differently from a real kube-apiserver.
pub const KNOWN_GAPS: &[&str] = &[
    "not a reference for what the apiserver decides: no admission, no validation of object contents, no defaulting (a pod gets no status.phase), no CRDs; those tests run against the real kube-apiserver (tests/common/envtest.rs)",
    "no RBAC: one bearer token may do everything; 403s come only from injected faults (RBAC's own are tested against the real apiserver)",
    "only the resources a test registers; by default those tollgate reads (pods, namespaces, secrets, leases, nodes, resourcequotas, DRA's three in v1, policyreports, the webhook configurations), not ConfigMaps nor ClusterPolicyReports",
    "JSON only: no protobuf, no CBOR, no Table output, no gzip",
    "no server-side apply (apply patches get 415); strategic merge patches are merge patches",
    "deletion is immediate (as for an unscheduled pod or gracePeriodSeconds=0) unless finalizers hold it",
    "namespaces are not enforced: objects may be created in a namespace that does not exist, and deleting a namespace deletes nothing else",
    "no subresources (status, scale, eviction, log): they answer 404",
    "a watch or list at a resourceVersion newer than the store gets its 504 at once instead of after waiting up to 3 s for it",
    "HTTP/2 is served (ALPN h2) but kube-rs speaks HTTP/1.1, so only that is exercised",
    "continue tokens expire when their snapshot falls out of the retained window, not only at compaction",
    "bookmarks come at a fixed interval instead of about once a minute",
    "no field managers (managedFields), no ownerReference garbage collection",
    "no deprecated /api/v1/watch/... paths; messages of selector parse errors are close to, not the same as, the real ones",
];

/// The bearer token the kubeconfig carries and the server checks by default.
pub const TOKEN: &str = "standin-token";

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
        let tls = http::tls::ServerTls::generate();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ u64::from(addr.port());
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(
                self.resources,
                self.history_size,
                self.snapshot_retention,
            )),
            bookmark_interval: self.bookmark_interval,
            token: self.token.clone(),
            uid_seed: seed,
            open_watches: AtomicUsize::new(0),
            addr,
        });
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(http::serve(listener, tls.acceptor, shared.clone(), stop_rx));
        ApiServer {
            shared,
            addr,
            ca_pem: tls.ca_pem,
            ca_der: tls.ca_der,
            token: self.token,
            stop: Mutex::new(Some(stop_tx)),
            task: Mutex::new(Some(task)),
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
        let token = self.token.as_deref();
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

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    /// Creates or replaces an object without HTTP: the store assigns uid (kept on a
    /// replace), creationTimestamp and a new resourceVersion, and watchers see ADDED or
    /// MODIFIED. The namespace comes from the object (`default` if it has none).
    pub fn insert(&self, resource: &str, obj: Value) -> Value {
        let mut st = self.state();
        let ri = st.index(resource);
        st.upsert(ri, obj, self.shared.uid_seed)
    }

    /// `insert` for many objects under one lock: for seeding tens of thousands quickly.
    /// Returns the resourceVersion after the last.
    pub fn insert_many(&self, resource: &str, objs: impl IntoIterator<Item = Value>) -> u64 {
        let mut st = self.state();
        let ri = st.index(resource);
        for obj in objs {
            st.upsert(ri, obj, self.shared.uid_seed);
        }
        st.rv
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
        let ri = st.index(resource);
        let mut v = st.resources[ri]
            .objects
            .get(&key_of(namespace.unwrap_or(""), name))?
            .value();
        f(&mut v);
        Some(st.upsert(ri, v, self.shared.uid_seed))
    }

    /// Deletes an object at once, finalizers or not (a DELETED event); `None` if absent.
    pub fn remove(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let mut st = self.state();
        let ri = st.index(resource);
        st.delete(ri, namespace.unwrap_or(""), name, &json!({}), false, true)
            .ok()
    }

    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let st = self.state();
        let ri = st.index(resource);
        st.resources[ri]
            .objects
            .get(&key_of(namespace.unwrap_or(""), name))
            .map(|o| o.value())
    }

    /// Every stored object of a resource, in key order.
    pub fn objects(&self, resource: &str) -> Vec<Value> {
        let st = self.state();
        let ri = st.index(resource);
        st.resources[ri]
            .objects
            .values()
            .map(|o| o.value())
            .collect()
    }

    pub fn len(&self, resource: &str) -> usize {
        let st = self.state();
        let ri = st.index(resource);
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
        self.state().compact();
    }

    /// Aborts every open watch mid-stream, as a lost connection does; returns how many.
    pub fn break_watches(&self) -> usize {
        self.state().break_watches()
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

//! The HTTP shell: routes, limits, TLS serving, reloads and graceful shutdown.
//!
//! Everything here is thin: the decision is [`tollgate_core::review::review_bytes`], the same call
//! the `review` command makes.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, MethodRouter};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::metrics::{Metrics, ResultLabels};
use crate::tls::CertStore;
use tollgate_core::optout::OptOut;
use tollgate_core::policy::Policy;
use tollgate_core::review::{review_bytes, Endpoint, Reviewed};

/// The policy in force and the hash that identifies it in metrics and logs.
#[derive(Debug)]
pub struct ActivePolicy {
    pub policy: Policy,
    pub hash: String,
}

impl ActivePolicy {
    pub fn new(policy: Policy, text: &[u8]) -> Self {
        ActivePolicy {
            policy,
            hash: hex(&Sha256::digest(text)[..8]),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Limits that protect the server from misbehaving clients. Every one is a flag.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest review body accepted. An UPDATE review carries the object and the old object,
    /// each up to the apiserver's 3 MiB limit, plus the envelope.
    pub max_body_bytes: usize,
    /// Deadline for reading a request body and answering it, kept below the webhooks'
    /// timeouts so that a slow client cannot hold a review past the apiserver's patience.
    pub review_deadline: Duration,
    /// Time a client may take to finish the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time an HTTP/1.1 client may take to send its request headers.
    pub header_timeout: Duration,
    /// Open connections at once; more wait in the kernel's accept queue.
    pub max_connections: usize,
    /// HTTP/2 streams per connection.
    pub max_streams: u32,
    /// A connection with no request in flight for this long is closed (gracefully: a GOAWAY
    /// for HTTP/2), so that idle clients cannot hold connection slots for ever. It also
    /// bounds a client that completes the TLS handshake and then sends nothing.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 7 * 1024 * 1024,
            review_deadline: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(5),
            max_connections: 1024,
            max_streams: 256,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// What every request handler shares.
pub struct AppState {
    pub policy: ArcSwap<ActivePolicy>,
    pub metrics: Metrics,
    pub limits: Limits,
    /// False until the certificate is loaded, and again once shutdown starts.
    pub ready: AtomicBool,
}

impl AppState {
    pub fn new(policy: ActivePolicy, limits: Limits) -> Arc<AppState> {
        let metrics = Metrics::new();
        metrics.set_policy_hash(&policy.hash);
        Arc::new(AppState {
            policy: ArcSwap::from_pointee(policy),
            metrics,
            limits,
            ready: AtomicBool::new(true),
        })
    }
}

/// The webhook's routes. Used by the TLS server and, without a socket, by tests.
pub fn router(state: Arc<AppState>) -> Router {
    routes(state, any(mutate), any(validate))
}

/// The route table, with the two review handlers given: the webhook's and the floor's.
fn routes(
    state: Arc<AppState>,
    mutate: MethodRouter<Arc<AppState>>,
    validate: MethodRouter<Arc<AppState>>,
) -> Router {
    Router::new()
        .route("/mutate", mutate)
        .route("/validate", validate)
        .route("/healthz", any(healthz))
        .route("/readyz", any(readyz))
        .fallback(not_found)
        .with_state(state)
}

/// The metrics port's routes (plain HTTP, separate from the webhook's TLS port).
pub fn metrics_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(
            "/metrics",
            any(
                |State(s): State<Arc<AppState>>, method: Method| async move {
                    if method != Method::GET {
                        return wrong_method(&method, "GET").into_response();
                    }
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        s.metrics.encode(),
                    )
                        .into_response()
                },
            ),
        )
        .fallback(|| async {
            text(
                StatusCode::NOT_FOUND,
                "not found: metrics are at GET /metrics\n",
            )
        })
        .with_state(state)
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

fn wrong_method(method: &Method, allowed: &'static str) -> Response {
    let mut r = text(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {method} not allowed here; use {allowed}\n"),
    );
    r.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allowed));
    r
}

async fn not_found(req: Request) -> Response {
    text(
        StatusCode::NOT_FOUND,
        format!(
            "no route for {}; tollgate serves POST /mutate, POST /validate, GET /healthz and GET /readyz\n",
            req.uri().path()
        ),
    )
}

async fn healthz(method: Method) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return wrong_method(&method, "GET");
    }
    text(StatusCode::OK, "ok\n")
}

async fn readyz(State(s): State<Arc<AppState>>, method: Method) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return wrong_method(&method, "GET");
    }
    if s.ready.load(Ordering::Relaxed) {
        text(
            StatusCode::OK,
            format!("ready: policy {}\n", s.policy.load().hash),
        )
    } else {
        text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn mutate(State(s): State<Arc<AppState>>, req: Request) -> Response {
    handle(s, Endpoint::Mutate, req).await
}

async fn validate(State(s): State<Arc<AppState>>, req: Request) -> Response {
    handle(s, Endpoint::Validate, req).await
}

/// Decrements the in-flight gauge however the handler ends (including a dropped future).
struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

async fn handle(s: Arc<AppState>, endpoint: Endpoint, req: Request) -> Response {
    let start = Instant::now();
    s.metrics.in_flight.inc();
    let _guard = InFlight(&s.metrics);
    if req.method() != Method::POST {
        return wrong_method(req.method(), "POST");
    }
    let body = match read_body(&s.limits, req).await {
        Ok(b) => b,
        Err(resp) => {
            let elapsed = start.elapsed();
            s.metrics
                .observe_rejected(endpoint.as_str(), elapsed.as_secs_f64());
            // Every request to a review endpoint leaves a line, the ones never read too.
            warn!(
                endpoint = %endpoint.as_str(),
                status = resp.status().as_u16(),
                duration_us = elapsed.as_micros() as u64,
                "review body not read"
            );
            return resp;
        }
    };
    let active = s.policy.load();
    match review_bytes(endpoint, &active.policy, &body) {
        Ok(reviewed) => {
            let out = reviewed.to_json();
            let elapsed = start.elapsed();
            s.metrics.observe(&reviewed, elapsed.as_secs_f64());
            log_review(&reviewed, elapsed, &active.hash);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                out,
            )
                .into_response()
        }
        Err(e) => {
            let elapsed = start.elapsed();
            s.metrics
                .observe_rejected(endpoint.as_str(), elapsed.as_secs_f64());
            warn!(
                endpoint = %endpoint.as_str(),
                status = 400,
                duration_us = elapsed.as_micros() as u64,
                error = %e,
                "rejected a request that is not a usable AdmissionReview"
            );
            text(StatusCode::BAD_REQUEST, format!("{e}\n"))
        }
    }
}

async fn read_body(limits: &Limits, req: Request) -> Result<Bytes, Response> {
    let too_large = || {
        text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "request body larger than {} bytes (--max-body-bytes)\n",
                limits.max_body_bytes
            ),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body_bytes as u64) {
        return Err(too_large());
    }
    let read = axum::body::to_bytes(req.into_body(), limits.max_body_bytes);
    match tokio::time::timeout(limits.review_deadline, read).await {
        Err(_) => Err(text(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "request body not received within {:?} (--review-deadline)\n",
                limits.review_deadline
            ),
        )),
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => {
            let is_limit = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                || e.to_string().contains("length limit");
            if is_limit {
                Err(too_large())
            } else {
                Err(text(
                    StatusCode::BAD_REQUEST,
                    format!("could not read the request body: {e}\n"),
                ))
            }
        }
    }
}

fn log_review(r: &Reviewed, elapsed: Duration, policy_hash: &str) {
    let steps = r
        .steps
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",");
    info!(
        uid = %r.uid,
        endpoint = %r.endpoint.as_str(),
        namespace = %r.namespace,
        name = %r.name,
        operation = %r.operation,
        dry_run = r.dry_run,
        decision = %r.result.as_str(),
        verdict = r.verdict.map(|v| tracing::field::display(v.as_str())),
        steps = %steps,
        duration_us = elapsed.as_micros() as u64,
        policy = %policy_hash,
        "review"
    );
    match &r.opt_out {
        Some(OptOut::Honoured) => info!(
            uid = %r.uid, endpoint = %r.endpoint.as_str(), user = %r.username,
            namespace = %r.namespace, name = %r.name, "opt-out honoured"
        ),
        Some(OptOut::Refused(why)) => info!(
            uid = %r.uid, endpoint = %r.endpoint.as_str(), user = %r.username,
            namespace = %r.namespace, name = %r.name, reason = %why, "opt-out refused"
        ),
        _ => {}
    }
}

/// Everything `serve` needs, from the command line.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub policy_path: PathBuf,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    pub client_ca: Option<PathBuf>,
    pub limits: Limits,
    /// How often the policy and certificate files are checked for changes.
    pub reload_interval: Duration,
    /// After SIGTERM, how long to keep accepting while endpoints are updated.
    pub shutdown_delay: Duration,
    /// After that, how long in-flight requests get before the server exits anyway.
    pub drain_timeout: Duration,
}

/// Loads a policy file, for start-up and reloads.
pub fn load_policy(path: &Path) -> Result<ActivePolicy, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    policy_from_bytes(path, &bytes)
}

fn policy_from_bytes(path: &Path, bytes: &[u8]) -> Result<ActivePolicy, String> {
    let text = String::from_utf8_lossy(bytes);
    let policy =
        Policy::from_text(&path.display().to_string(), &text).map_err(|e| e.to_string())?;
    Ok(ActivePolicy::new(policy, bytes))
}

/// What one look at the policy file found.
#[derive(Debug)]
enum PolicyPoll {
    /// The file holds the policy in force (or a rejected file already reported).
    Unchanged,
    Reloaded(Arc<ActivePolicy>),
    /// A new problem: log it and count it once.
    Rejected(String),
}

/// Decides what a read of the policy file means. Kept apart from the loop so that the
/// sequences that matter (bad, then the good file back, then the bad one again) are tested
/// without sockets or sleeps.
#[derive(Debug)]
struct PolicyWatch {
    /// The bytes of the policy in force. Changes are judged against what was last loaded
    /// successfully, not against the last read: after a rejected file, the good one coming
    /// back is no change at all.
    in_force: Vec<u8>,
    /// The content last rejected, so that a bad file left in place is reported once.
    rejected: Option<Vec<u8>>,
    /// The read error last reported (a missing file, say), for the same reason.
    unreadable: Option<String>,
}

impl PolicyWatch {
    fn new(in_force: Vec<u8>) -> Self {
        PolicyWatch {
            in_force,
            rejected: None,
            unreadable: None,
        }
    }

    fn poll(&mut self, path: &Path, read: std::io::Result<Vec<u8>>) -> PolicyPoll {
        let bytes = match read {
            Ok(b) => b,
            Err(e) => {
                let e = format!("{}: {e}", path.display());
                self.rejected = None;
                if self.unreadable.as_deref() == Some(e.as_str()) {
                    return PolicyPoll::Unchanged;
                }
                self.unreadable = Some(e.clone());
                return PolicyPoll::Rejected(e);
            }
        };
        self.unreadable = None;
        if bytes == self.in_force {
            self.rejected = None;
            return PolicyPoll::Unchanged;
        }
        if self.rejected.as_deref() == Some(bytes.as_slice()) {
            return PolicyPoll::Unchanged;
        }
        match policy_from_bytes(path, &bytes) {
            Ok(p) => {
                self.in_force = bytes;
                self.rejected = None;
                PolicyPoll::Reloaded(Arc::new(p))
            }
            Err(e) => {
                self.rejected = Some(bytes);
                PolicyPoll::Rejected(e)
            }
        }
    }
}

/// A running server: its addresses and a handle to stop it.
pub struct Running {
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub state: Arc<AppState>,
    pub certs: Arc<CertStore>,
    stop: watch::Sender<bool>,
    done: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Starts graceful shutdown and waits for it to finish.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.done.await;
    }

    /// Waits for the server to stop after `signal` resolves.
    pub async fn run_until(self, signal: impl Future<Output = ()>) {
        signal.await;
        self.shutdown().await;
    }
}

/// Binds the sockets and starts serving in the background.
pub async fn start(opts: ServeOptions) -> anyhow::Result<Running> {
    start_with(opts, router).await
}

/// The benchmarks' floor: the same TLS, HTTP and connection handling as [`start`], but the
/// review routes read the body and answer a constant allowed review without parsing it.
/// What tollgate costs beyond this is its own doing (`tollgate serve --floor`, hidden).
pub async fn start_floor(opts: ServeOptions) -> anyhow::Result<Running> {
    start_with(opts, floor_router).await
}

/// The floor's routes: [`router`] with the review handler replaced by a constant answer.
pub fn floor_router(state: Arc<AppState>) -> Router {
    async fn constant(State(s): State<Arc<AppState>>, req: Request) -> Response {
        if req.method() != Method::POST {
            return wrong_method(req.method(), "POST");
        }
        match read_body(&s.limits, req).await {
            Ok(_) => (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                &br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":true}}"#[..],
            )
                .into_response(),
            Err(resp) => resp,
        }
    }
    routes(state, any(constant), any(constant))
}

/// Binds the sockets and serves `app(state)` behind TLS in the background.
async fn start_with(
    opts: ServeOptions,
    app: fn(Arc<AppState>) -> Router,
) -> anyhow::Result<Running> {
    let policy_bytes = std::fs::read(&opts.policy_path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", opts.policy_path.display()))?;
    let active = policy_from_bytes(&opts.policy_path, &policy_bytes).map_err(anyhow::Error::msg)?;
    let certs = Arc::new(CertStore::open(&opts.cert_path, &opts.key_path)?);
    let tls = crate::tls::server_config(certs.clone(), opts.client_ca.as_deref())?;
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let state = AppState::new(active, opts.limits.clone());
    state.metrics.cert_expiry.set(certs.not_after());

    let listener = TcpListener::bind(opts.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", opts.listen))?;
    let addr = listener.local_addr()?;
    let metrics_listener = match opts.metrics_listen {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {a} for metrics: {e}"))?,
        ),
        None => None,
    };
    let metrics_addr = metrics_listener
        .as_ref()
        .map(|l| l.local_addr())
        .transpose()?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let done = tokio::spawn(run(
        opts,
        policy_bytes,
        app(state.clone()),
        listener,
        metrics_listener,
        acceptor,
        state.clone(),
        certs.clone(),
        stop_rx,
    ));
    let metrics_shown = metrics_addr.map_or_else(|| "off".to_owned(), |a| a.to_string());
    info!(%addr, metrics = %metrics_shown, policy = %state.policy.load().hash, "tollgate serving");
    Ok(Running {
        addr,
        metrics_addr,
        state,
        certs,
        stop: stop_tx,
        done,
    })
}

#[allow(clippy::too_many_arguments)]
async fn run(
    opts: ServeOptions,
    policy_bytes: Vec<u8>,
    app: Router,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    acceptor: TlsAcceptor,
    state: Arc<AppState>,
    certs: Arc<CertStore>,
    mut stop: watch::Receiver<bool>,
) {
    let reloader = tokio::spawn(reload_loop(
        opts.clone(),
        PolicyWatch::new(policy_bytes),
        state.clone(),
        certs,
        stop.clone(),
    ));
    let metrics_task = metrics_listener.map(|l| {
        let app = metrics_router(state.clone());
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(l, app)
                .with_graceful_shutdown(async move { stopped(&mut stop).await })
                .await;
        })
    });

    // Connections are counted by the slots they hold: draining waits for every slot back.
    let max_connections = opts.limits.max_connections.clamp(1, u32::MAX as usize >> 3);
    let slots = Arc::new(Semaphore::new(max_connections));
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(opts.limits.header_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(opts.limits.max_streams)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    let builder = Arc::new(builder);
    let mut draining = false;
    let delay = tokio::time::sleep(Duration::MAX / 4);
    tokio::pin!(delay);

    loop {
        let next = async {
            let permit = slots.clone().acquire_owned().await;
            (permit, listener.accept().await)
        };
        let (permit, accepted) = tokio::select! {
            x = next => x,
            _ = stopped(&mut stop), if !draining => {
                // Readiness first, so endpoints drop this pod, then keep serving for the delay.
                state.ready.store(false, Ordering::Relaxed);
                info!(delay = ?opts.shutdown_delay, "shutdown requested: not ready, still serving");
                draining = true;
                delay.as_mut().reset(tokio::time::Instant::now() + opts.shutdown_delay);
                continue;
            }
            _ = &mut delay, if draining => break,
        };
        let Ok(permit) = permit else { break };
        let (tcp, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Without it, small HTTP/2 frames wait on delayed ACKs: tens of milliseconds of tail.
        let _ = tcp.set_nodelay(true);
        tokio::spawn(serve_connection(
            tcp,
            peer,
            acceptor.clone(),
            builder.clone(),
            app.clone(),
            opts.limits.clone(),
            drain_rx.clone(),
            permit,
        ));
    }
    drop(listener);
    info!(timeout = ?opts.drain_timeout, "no longer accepting; draining in-flight requests");
    let _ = drain_tx.send(true);
    let all_back = slots.acquire_many(max_connections as u32);
    if tokio::time::timeout(opts.drain_timeout, all_back)
        .await
        .is_err()
    {
        warn!("drain timeout reached; exiting with requests still open");
    }
    reloader.abort();
    if let Some(t) = metrics_task {
        let _ = tokio::time::timeout(Duration::from_secs(1), t).await;
    }
    info!("tollgate stopped");
}

/// What a connection is doing, for the idle timeout.
struct Activity {
    in_flight: AtomicUsize,
    last: Mutex<Instant>,
}

impl Activity {
    fn touch(&self) {
        if let Ok(mut t) = self.last.lock() {
            *t = Instant::now();
        }
    }

    /// How long the connection has had no request in flight (zero while one is).
    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        self.last.lock().map(|t| t.elapsed()).unwrap_or_default()
    }
}

/// A request in flight on a connection; the connection is active until it is dropped.
struct Busy(Arc<Activity>);

impl Busy {
    fn new(a: Arc<Activity>) -> Busy {
        a.in_flight.fetch_add(1, Ordering::AcqRel);
        a.touch();
        Busy(a)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One accepted connection: the TLS handshake (bounded), then HTTP/1.1 or HTTP/2 until the
/// client leaves, the connection idles past the idle timeout, or the server drains. The
/// permit is the connection's slot under `--max-connections`, held until it is closed.
#[allow(clippy::too_many_arguments)]
async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    builder: Arc<auto::Builder<TokioExecutor>>,
    app: Router,
    limits: Limits,
    mut drain: watch::Receiver<bool>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let _permit = permit;
    let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let activity = Arc::new(Activity {
        in_flight: AtomicUsize::new(0),
        last: Mutex::new(Instant::now()),
    });
    let tracked = activity.clone();
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let busy = Busy::new(tracked.clone());
        let call = tower::ServiceExt::oneshot(app.clone(), req);
        async move {
            let resp = call.await;
            drop(busy);
            resp
        }
    });
    let conn = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    let check = (limits.idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut tick = tokio::time::interval(check);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut closing = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stopped(&mut drain), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = tick.tick(), if !closing => {
                if activity.idle_for() >= limits.idle_timeout {
                    debug!(%peer, "closing an idle connection");
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

/// Polls the policy and certificate files. Polling, not inotify: Kubernetes swaps a
/// `..data` symlink for ConfigMap and Secret volumes, which file watches miss easily, and a
/// read every few seconds costs nothing.
async fn reload_loop(
    opts: ServeOptions,
    mut policy: PolicyWatch,
    state: Arc<AppState>,
    certs: Arc<CertStore>,
    mut stop: watch::Receiver<bool>,
) {
    // A certificate error seen on the previous poll, and the one last reported. A writer
    // other than the kubelet (which swaps both files at once) may replace tls.crt and tls.key
    // one after the other; only an error seen on two polls in a row is worth a warning.
    let mut cert_seen: Option<String> = None;
    let mut cert_reported: Option<String> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(opts.reload_interval) => {}
            _ = stopped(&mut stop) => return,
        }
        // Read by path every time: the path resolves through the ..data symlink to whatever
        // directory the kubelet swapped in last.
        let read = std::fs::read(&opts.policy_path);
        match policy.poll(&opts.policy_path, read) {
            PolicyPoll::Unchanged => {}
            PolicyPoll::Reloaded(p) => {
                info!(policy = %p.hash, previous = %state.policy.load().hash,
                    path = %opts.policy_path.display(), "policy reloaded");
                state.metrics.set_policy_hash(&p.hash);
                state.policy.store(p);
                state
                    .metrics
                    .policy_reloads
                    .get_or_create(&ResultLabels { result: "success" })
                    .inc();
            }
            PolicyPoll::Rejected(e) => {
                warn!(error = %e, policy = %state.policy.load().hash,
                    "policy reload rejected; the previous policy stays in force");
                state
                    .metrics
                    .policy_reloads
                    .get_or_create(&ResultLabels { result: "failure" })
                    .inc();
            }
        }
        // A level, not an event: it stays up for as long as the bad file stays, which the
        // once-per-content failure counter cannot show.
        let rejected = policy.rejected.is_some() || policy.unreadable.is_some();
        state.metrics.policy_rejected.set(i64::from(rejected));
        match certs.reload() {
            Ok(changed) => {
                cert_seen = None;
                cert_reported = None;
                if changed {
                    let (c, _) = certs.paths();
                    info!(path = %c.display(), not_after = certs.not_after(), "serving certificate reloaded");
                    state.metrics.cert_expiry.set(certs.not_after());
                    state
                        .metrics
                        .cert_reloads
                        .get_or_create(&ResultLabels { result: "success" })
                        .inc();
                }
            }
            Err(e) => {
                let e = e.to_string();
                if cert_seen.as_deref() == Some(e.as_str())
                    && cert_reported.as_deref() != Some(e.as_str())
                {
                    warn!(error = %e, "new certificate files rejected; the previous certificate stays in use");
                    state
                        .metrics
                        .cert_reloads
                        .get_or_create(&ResultLabels { result: "failure" })
                        .inc();
                    cert_reported = Some(e.clone());
                }
                cert_seen = Some(e);
            }
        }
    }
}

/// Resolves once shutdown is requested (or the handle that requests it is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Resolves on SIGTERM or SIGINT.
///
/// The handlers are installed when this is called, not when the future is first polled:
/// until then a SIGTERM would kill the process outright, skipping the drain. Call it before
/// [`start`]. Must be called inside a Tokio runtime.
#[cfg(unix)]
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => info!("SIGINT received"),
            _ = term.recv() => info!("SIGTERM received"),
        }
    })
}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
        info!("Ctrl-C received");
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &[u8] = b"validation: {mode: enforce}\n";
    const WARN: &[u8] = b"validation: {mode: warn}\n";
    const BAD: &[u8] = b"validation: {mode: sometimes}\n";

    fn poll(w: &mut PolicyWatch, bytes: &[u8]) -> PolicyPoll {
        w.poll(Path::new("policy.yaml"), Ok(bytes.to_vec()))
    }

    #[test]
    fn policy_watch_reports_each_bad_file_once_and_keeps_the_good_one() {
        let mut w = PolicyWatch::new(GOOD.to_vec());
        assert!(matches!(poll(&mut w, GOOD), PolicyPoll::Unchanged));
        assert!(matches!(poll(&mut w, BAD), PolicyPoll::Rejected(_)));
        // Left in place: not reported again on every poll.
        assert!(matches!(poll(&mut w, BAD), PolicyPoll::Unchanged));
        // The good file back: it is the policy in force, nothing to reload.
        assert!(matches!(poll(&mut w, GOOD), PolicyPoll::Unchanged));
        // The same bad file again is a new event.
        assert!(matches!(poll(&mut w, BAD), PolicyPoll::Rejected(_)));
        assert!(matches!(poll(&mut w, WARN), PolicyPoll::Reloaded(_)));
        assert_eq!(w.in_force, WARN);
        // Back to the first policy: a change from the one in force, so a reload.
        assert!(matches!(poll(&mut w, GOOD), PolicyPoll::Reloaded(_)));
    }

    #[test]
    fn policy_watch_reports_a_missing_file_once() {
        let mut w = PolicyWatch::new(GOOD.to_vec());
        let gone = || Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        let p = Path::new("policy.yaml");
        assert!(matches!(w.poll(p, gone()), PolicyPoll::Rejected(e) if e.contains("policy.yaml")));
        assert!(matches!(w.poll(p, gone()), PolicyPoll::Unchanged));
        assert!(matches!(poll(&mut w, GOOD), PolicyPoll::Unchanged));
        assert!(matches!(w.poll(p, gone()), PolicyPoll::Rejected(_)));
    }
}

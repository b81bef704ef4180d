//! The webhook server: what it shares between requests, and starting and stopping it.
//!
//! Everything here is thin: the decision is [`tollgate_core::review_bytes`], the
//! same call the `review` command makes. A reader finds
//! - the routes and their handlers in [`routes`],
//! - connection serving (TCP accept, TLS, HTTP/1.1 and HTTP/2, limits) in [`conn`],
//! - the policy and certificate reloads in [`reload`],
//! - the policy in force composed of the file and the TollgatePolicy and TollgateProfiles
//!   the cluster context watches, and their status, in [`objects`],
//! - graceful shutdown in [`shutdown`].

mod conn;
pub mod objects;
mod reload;
mod routes;
mod shutdown;

pub use reload::load_policy;
pub use routes::{floor_router, metrics_router, router};
pub use shutdown::shutdown_signal;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::Router;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

pub use crate::audit::background::AuditOptions;
use crate::audit::background::{self, Background};
use crate::cluster::{ClusterContext, Options as WatchOptions, Watched};
use crate::kubeconfig::{load_client_config, KubeconfigSources};
use crate::metrics::Metrics;
use crate::selfmanaged;
use crate::tls::CertStore;
use conn::Connections;
use tollgate_core::{Offline, Policy};

/// The policy in force and the hash that identifies it in metrics and logs.
#[derive(Debug)]
pub struct ActivePolicy {
    pub policy: Policy,
    pub hash: String,
}

/// What the background audit reads the policy in force through.
impl AsRef<Policy> for ActivePolicy {
    fn as_ref(&self) -> &Policy {
        &self.policy
    }
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
    /// What reviews know of other objects (`--cluster-context`).
    pub cluster: Arc<dyn ClusterContext>,
    pub metrics: Metrics,
    pub limits: Limits,
    /// False once shutdown starts.
    pub ready: AtomicBool,
    /// The serving certificate, once the server has one: `/readyz` waits until a real one
    /// is loaded (the self-managed certificates come from a Secret after start-up). Unset
    /// for a router without a server (tests): ready.
    pub certs: OnceLock<Arc<CertStore>>,
}

impl AppState {
    pub fn new(policy: ActivePolicy, limits: Limits) -> Arc<AppState> {
        AppState::with_cluster(policy, limits, Arc::new(Offline))
    }

    /// [`AppState::new`] with a cluster context.
    pub fn with_cluster(
        policy: ActivePolicy,
        limits: Limits,
        cluster: Arc<dyn ClusterContext>,
    ) -> Arc<AppState> {
        let metrics = Metrics::new();
        metrics.set_policy_hash(&policy.hash);
        metrics.set_profiles_of(&policy.policy);
        Arc::new(AppState {
            policy: ArcSwap::from_pointee(policy),
            cluster,
            metrics,
            limits,
            ready: AtomicBool::new(true),
            certs: OnceLock::new(),
        })
    }
}

/// Everything `serve` needs, from the command line.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    /// The policy file, watched for changes; None: the built-in policy.
    pub policy_path: Option<PathBuf>,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    /// `--certs self-managed`: the certificate comes from a Secret tollgate keeps itself
    /// (`cert_path` and `key_path` are not read).
    pub self_managed: Option<selfmanaged::Options>,
    pub client_ca: Option<PathBuf>,
    pub limits: Limits,
    /// How often the policy and certificate files are checked for changes.
    pub reload_interval: Duration,
    /// After SIGTERM, how long to keep accepting while endpoints are updated.
    pub shutdown_delay: Duration,
    /// After that, how long in-flight requests get before the server exits anyway.
    pub drain_timeout: Duration,
    /// The cluster context (`--cluster-context on`); None: off.
    pub cluster: Option<ClusterOptions>,
    /// The background audit (`--audit-interval`); None: off.
    pub audit: Option<AuditOptions>,
}

/// Where the cluster context watches, and how long a review may wait for what it lacks.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub fetch_timeout: Duration,
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

/// What `--cluster-context off` gets to do without: say what to do instead.
const NO_CLUSTER: &str = "the cluster context needs the API server: run in a cluster, set \
                          KUBECONFIG or pass --kubeconfig, or pass --cluster-context off";

/// A client for the API server of a kubeconfig (or the in-cluster configuration), its URL
/// and its default namespace.
async fn client_for(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
    hint: &str,
) -> anyhow::Result<(kube::Client, String, String)> {
    let sources = KubeconfigSources::from_process_env(kubeconfig.map(Into::into));
    let config = load_client_config(&sources, context, hint).await?;
    let url = config.cluster_url.to_string();
    crate::kubeconfig::set_api_server(&url);
    let namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config)
        .map_err(|e| anyhow::anyhow!("creating a client for the API server at {url}: {e}"))?;
    Ok((client, url, namespace))
}

/// The cluster context: watches of the API server, or nothing; and where the policy
/// objects' status is written from (its client, and tollgate's namespace for the Lease).
async fn cluster_context(
    opts: Option<&ClusterOptions>,
) -> anyhow::Result<(Arc<dyn ClusterContext>, Option<objects::StatusWriter>)> {
    let Some(o) = opts else {
        return Ok((Arc::new(Offline), None));
    };
    let (client, url, namespace) =
        client_for(o.kubeconfig.as_deref(), o.context.as_deref(), NO_CLUSTER).await?;
    info!(apiserver = %url, "cluster context: watching resourceclaims, resourceclaimtemplates, namespaces, and the TollgatePolicy and TollgateProfiles");
    let watched = Watched::start(
        client.clone(),
        WatchOptions {
            fetch_timeout: o.fetch_timeout,
        },
    );
    Ok((
        Arc::new(watched),
        Some(objects::StatusWriter { client, namespace }),
    ))
}

/// What `--audit-interval` needs without a cluster.
const NO_CLUSTER_AUDIT: &str = "the background audit needs the API server: run in a cluster, \
                                set KUBECONFIG or pass --kubeconfig, or leave --audit-interval off";

/// The background audit, if asked for: in the server's cluster context when that is on.
async fn start_audit(
    opts: &ServeOptions,
    state: &Arc<AppState>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Option<Background>> {
    let Some(a) = &opts.audit else {
        return Ok(None);
    };
    let (client, url, namespace) = client_for(
        a.kubeconfig.as_deref(),
        a.context.as_deref(),
        NO_CLUSTER_AUDIT,
    )
    .await?;
    let source = state.clone();
    let policy: background::PolicySource =
        Arc::new(move || -> Arc<dyn AsRef<Policy> + Send + Sync> { source.policy.load_full() });
    let cluster = opts.cluster.is_some().then(|| state.cluster.clone());
    Ok(Some(background::start(
        background::ApiServer {
            client,
            url,
            namespace,
        },
        a.clone(),
        policy,
        cluster,
        state.metrics.audit.clone(),
        stop,
    )))
}

/// What `--certs self-managed` needs without a cluster.
const NO_CLUSTER_CERTS: &str = "the self-managed certificates need the API server: run in a \
                                cluster, set KUBECONFIG or pass --kubeconfig, or pass \
                                --tls-cert and --tls-key";

/// The self-managed certificates, if asked for: the Secret's watch, the Lease, the leader.
async fn start_self_managed(
    opts: &ServeOptions,
    state: &Arc<AppState>,
    certs: &Arc<CertStore>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Option<selfmanaged::Running>> {
    let Some(o) = &opts.self_managed else {
        return Ok(None);
    };
    let (client, url, namespace) = client_for(
        o.kubeconfig.as_deref(),
        o.context.as_deref(),
        NO_CLUSTER_CERTS,
    )
    .await?;
    info!(apiserver = %url, "self-managed certificates: the serving certificate comes from a Secret");
    Ok(Some(selfmanaged::start(
        client,
        &namespace,
        o.clone(),
        certs.clone(),
        state.metrics.certs.clone(),
        stop,
    )))
}

/// Binds the sockets and serves `app(state)` behind TLS in the background.
async fn start_with(
    opts: ServeOptions,
    app: fn(Arc<AppState>) -> Router,
) -> anyhow::Result<Running> {
    let context_on = opts.cluster.is_some();
    let (active, policy_bytes) = reload::initial_policy(opts.policy_path.as_deref(), context_on)
        .map_err(anyhow::Error::msg)?;
    let certs = Arc::new(match &opts.self_managed {
        None => CertStore::open(&opts.cert_path, &opts.key_path)?,
        Some(_) => CertStore::waiting()?,
    });
    let tls = crate::tls::server_config(certs.clone(), opts.client_ca.as_deref())?;
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let (cluster, status_writer) = cluster_context(opts.cluster.as_ref()).await?;
    // The file as loaded (above) is the policy in force until the watches list the
    // objects, which are then composed with it.
    let composition = Arc::new(objects::Composition::new(
        active.policy.layers.file.clone(),
        policy_bytes.clone(),
        cluster.policy_objects(),
    ));
    let state = AppState::with_cluster(active, opts.limits.clone(), cluster);
    state.metrics.cert_expiry.set(certs.not_after());
    let _ = state.certs.set(certs.clone());

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
    let audit = start_audit(&opts, &state, stop_rx.clone()).await?;
    let managed = start_self_managed(&opts, &state, &certs, stop_rx.clone()).await?;
    let composing = start_composing(&composition, &state, status_writer, &stop_rx);
    let done = tokio::spawn(run(
        opts,
        audit,
        managed,
        composing,
        composition,
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

/// The tasks that keep the composed policy and the objects' status: a recomposition at
/// every change of the watched objects, and the status writer (with the cluster context).
fn start_composing(
    composition: &Arc<objects::Composition>,
    state: &Arc<AppState>,
    writer: Option<objects::StatusWriter>,
    stop: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    if let Some(source) = state.cluster.policy_objects() {
        tasks.push(tokio::spawn(objects::objects_loop(
            composition.clone(),
            source,
            state.clone(),
            stop.clone(),
        )));
    }
    if let Some(w) = writer {
        tasks.push(tokio::spawn(objects::status_loop(
            w,
            composition.reports(),
            state.clone(),
            stop.clone(),
        )));
    }
    tasks
}

#[allow(clippy::too_many_arguments)]
async fn run(
    opts: ServeOptions,
    audit: Option<Background>,
    managed: Option<selfmanaged::Running>,
    composing: Vec<tokio::task::JoinHandle<()>>,
    composition: Arc<objects::Composition>,
    policy_bytes: Vec<u8>,
    app: Router,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    acceptor: TlsAcceptor,
    state: Arc<AppState>,
    certs: Arc<CertStore>,
    mut stop: watch::Receiver<bool>,
) {
    let reloader = tokio::spawn(reload::reload_loop(
        opts.clone(),
        opts.policy_path.is_some().then(|| {
            reload::PolicyWatch::new(policy_bytes).with_cluster_context(opts.cluster.is_some())
        }),
        composition,
        state.clone(),
        certs,
        stop.clone(),
    ));
    let metrics_task = metrics_listener.map(|l| {
        let app = metrics_router(state.clone());
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(l, app)
                .with_graceful_shutdown(async move { shutdown::stopped(&mut stop).await })
                .await;
        })
    });
    let connections = Connections::new(acceptor, app, opts.limits.clone());
    let until = shutdown::requested_then_delay(&mut stop, &state, opts.shutdown_delay);
    connections.accept_until(&listener, until).await;
    drop(listener);
    info!(timeout = ?opts.drain_timeout, "no longer accepting; draining in-flight requests");
    if !connections.drain(opts.drain_timeout).await {
        warn!("drain timeout reached; exiting with requests still open");
    }
    reloader.abort();
    if let Some(a) = audit {
        // It stopped with the signal, releasing its Lease; this waits for the release.
        if tokio::time::timeout(Duration::from_secs(3), a.task)
            .await
            .is_err()
        {
            warn!("the background audit did not stop within 3 s");
        }
    }
    if let Some(m) = managed {
        // It stopped with the signal; the Lease's holder releases it.
        if tokio::time::timeout(Duration::from_secs(3), m.task)
            .await
            .is_err()
        {
            warn!("the self-managed certificates did not stop within 3 s");
        }
    }
    // They stopped with the signal; the status writer releases its Lease.
    for t in composing {
        if tokio::time::timeout(Duration::from_secs(3), t)
            .await
            .is_err()
        {
            warn!("the policy objects' composer or status writer did not stop within 3 s");
        }
    }
    if let Some(t) = metrics_task {
        let _ = tokio::time::timeout(Duration::from_secs(1), t).await;
    }
    info!("tollgate stopped");
}

//! Finding the cluster: the kubeconfig as `kubectl` reads it, else the in-cluster
//! configuration, chosen by kubectl's `--kubeconfig` and `--context` ([`ClusterFlags`]).
//! `register`, the server's cluster context and the commands share it; and the words a
//! client error is said in ([`words`]), connection failures said once with the API
//! server's URL and then at most once a minute ([`unreachable`]).

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

/// `--kubeconfig` and `--context`: which cluster, as kubectl finds it; every command that
/// reads a cluster flattens it (`#[command(flatten)]`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClusterFlags {
    /// Kubeconfig [default: $KUBECONFIG, ~/.kube/config, else the in-cluster
    /// configuration].
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context [default: its current context].
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl ClusterFlags {
    /// Whether there is a cluster to read, as kubectl would find one: `--kubeconfig`, a
    /// file of `$KUBECONFIG` or `~/.kube/config` that exists, or a pod's in-cluster
    /// configuration. The commands that may work offline (`policy`) read files alone
    /// without one.
    pub fn found(&self) -> bool {
        let sources = KubeconfigSources::from_process_env(self.kubeconfig.clone());
        if sources.explicit.is_some() || self.context.is_some() || sources.in_cluster {
            return true;
        }
        match sources.env.as_ref().filter(|v| !v.is_empty()) {
            Some(list) => std::env::split_paths(list).any(|p| p.is_file()),
            None => sources
                .home
                .is_some_and(|h| h.join(".kube").join("config").is_file()),
        }
    }

    /// The client configuration, as kubectl finds it; `hint` says what to do without one.
    pub async fn config(&self, hint: &str) -> Result<kube::Config> {
        let sources = KubeconfigSources::from_process_env(self.kubeconfig.clone());
        load_client_config(&sources, self.context.as_deref(), hint).await
    }
}

/// A client error in words, never a Debug dump: what the API server said of an API error
/// (its status's message: `pods is forbidden: User "alice" cannot list ...`), else the
/// innermost cause (`Connection refused (os error 111)`), not the layers of client
/// machinery around it.
pub fn words(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        kube::Error::Api(s) => format!("{} {}", s.code, s.reason),
        other => innermost(other),
    }
}

/// A watch's error in words (what the API server said, or the innermost cause), and
/// whether it never reached the API server.
pub fn watch_words(e: &kube::runtime::watcher::Error) -> (String, bool) {
    match e {
        kube::runtime::watcher::Error::InitialListFailed(k) => {
            (format!("listing: {}", words(k)), is_unreachable(k))
        }
        kube::runtime::watcher::Error::WatchStartFailed(k)
        | kube::runtime::watcher::Error::WatchFailed(k) => {
            (format!("watching: {}", words(k)), is_unreachable(k))
        }
        kube::runtime::watcher::Error::WatchError(s) => (format!("watching: {}", s.message), false),
        other => (other.to_string(), false),
    }
}

/// The deepest cause of an error.
pub fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Whether the request never reached the API server (no connection, TLS failed): what
/// [`unreachable`] says once for every watch and poll at once.
pub fn is_unreachable(e: &kube::Error) -> bool {
    matches!(e, kube::Error::HyperError(_) | kube::Error::Service(_))
}

/// The API server this process's cluster context and Leases talk to, for the messages of
/// [`unreachable`].
static API_SERVER: OnceLock<String> = OnceLock::new();

/// Connection failures since the last said, and when that was.
static UNREACHABLE: Mutex<Option<(Instant, u64)>> = Mutex::new(None);

/// How often a server still unable to reach the API server says so.
pub const UNREACHABLE_EVERY: Duration = Duration::from_secs(60);

/// Names the API server the server talks to (its first client's URL).
pub fn set_api_server(url: &str) {
    let _ = API_SERVER.set(url.to_owned());
}

/// A connection failure (`detail`, in words) of any watch, poll or write to the API
/// server: the line to log, or None while it was said less than a minute ago. Every cache
/// retries on its own; a server that cannot reach the API server says so once with the URL,
/// then once a minute with how many requests failed since, rather than once a request.
pub fn unreachable(detail: &str) -> Option<String> {
    let mut last = UNREACHABLE.lock().unwrap_or_else(|p| p.into_inner());
    let url = API_SERVER.get().map_or("(unknown)", String::as_str);
    match &mut *last {
        Some((at, count)) if at.elapsed() < UNREACHABLE_EVERY => {
            *count += 1;
            None
        }
        Some((at, count)) => {
            let line = format!(
                "still cannot reach the API server at {url}: {detail} ({} failed requests in the last {} s); retrying",
                *count + 1,
                at.elapsed().as_secs()
            );
            *last = Some((Instant::now(), 0));
            Some(line)
        }
        None => {
            *last = Some((Instant::now(), 0));
            Some(format!(
                "cannot reach the API server at {url}: {detail}; every watch retries, and this is said again at most once a minute"
            ))
        }
    }
}

/// The API server answered again: the next failure is said at once.
pub fn reached() {
    if let Ok(mut last) = UNREACHABLE.try_lock() {
        *last = None;
    }
}

/// Where the kubeconfig may come from, gathered from the process's environment by
/// [`KubeconfigSources::from_process_env`] (or built by hand in tests).
#[derive(Debug, Clone, Default)]
pub struct KubeconfigSources {
    /// `--kubeconfig`.
    pub explicit: Option<PathBuf>,
    /// `$KUBECONFIG`: a list of files, as `kubectl` reads it.
    pub env: Option<OsString>,
    /// `$HOME`, for `~/.kube/config`.
    pub home: Option<PathBuf>,
    /// Whether this runs in a pod (`$KUBERNETES_SERVICE_HOST` is set).
    pub in_cluster: bool,
}

impl KubeconfigSources {
    pub fn from_process_env(explicit: Option<PathBuf>) -> Self {
        KubeconfigSources {
            explicit,
            env: std::env::var_os("KUBECONFIG"),
            home: std::env::var_os("HOME").map(PathBuf::from),
            in_cluster: std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
        }
    }
}

/// Loads the client configuration as `kubectl` would: `--kubeconfig`, else the files in
/// `$KUBECONFIG` that exist (merged), else `~/.kube/config`, else the in-cluster config.
/// `hint` says what to do when there is none.
pub async fn load_client_config(
    sources: &KubeconfigSources,
    context: Option<&str>,
    hint: &str,
) -> Result<kube::Config> {
    use kube::config::{KubeConfigOptions, Kubeconfig};

    let mut candidates: Vec<PathBuf> = Vec::new();
    let files = if let Some(path) = &sources.explicit {
        if !path.is_file() {
            bail!(
                "no kubeconfig found: {} (from --kubeconfig) does not exist",
                path.display()
            );
        }
        vec![path.clone()]
    } else if let Some(list) = sources.env.as_ref().filter(|v| !v.is_empty()) {
        candidates.extend(std::env::split_paths(list).filter(|p| !p.as_os_str().is_empty()));
        candidates.iter().filter(|p| p.is_file()).cloned().collect()
    } else {
        if let Some(home) = &sources.home {
            candidates.push(home.join(".kube").join("config"));
        }
        candidates.iter().filter(|p| p.is_file()).cloned().collect()
    };

    if files.is_empty() {
        if sources.in_cluster {
            return kube::Config::incluster()
                .context("loading the in-cluster configuration (no kubeconfig found)");
        }
        let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
        if looked.is_empty() {
            bail!("no kubeconfig found: {hint}");
        }
        bail!(
            "no kubeconfig found (looked at {}): {hint}",
            looked.join(", ")
        );
    }

    let mut merged = Kubeconfig::default();
    for file in &files {
        let next = Kubeconfig::read_from(file)
            .with_context(|| format!("reading kubeconfig {}", file.display()))?;
        merged = merged
            .merge(next)
            .with_context(|| format!("merging kubeconfig {}", file.display()))?;
    }
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let shown: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    kube::Config::from_custom_kubeconfig(merged, &options)
        .await
        .with_context(|| format!("using kubeconfig {}", shown.join(", ")))
}

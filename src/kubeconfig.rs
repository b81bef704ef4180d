//! Finding the cluster: the kubeconfig as `kubectl` reads it, else the in-cluster
//! configuration. `register`, the server's cluster context and `audit` share it.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};

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

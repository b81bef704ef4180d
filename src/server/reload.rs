//! Reloads: the policy and certificate files are polled, and a change takes effect without
//! a restart. A file that does not load is refused, reported once, and the previous policy
//! or certificate stays in force.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;
use tracing::{info, warn};

use super::objects::Composition;
use super::shutdown::stopped;
use super::{ActivePolicy, AppState, ServeOptions};
use crate::metrics::ResultLabels;
use crate::tls::CertStore;
use tollgate_core::{Policy, BUILTIN_SOURCE, BUILTIN_TEXT};

/// Loads a policy file, for start-up and reloads.
pub fn load_policy(path: &Path) -> Result<ActivePolicy, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    policy_from_bytes(path, &bytes)
}

/// The policy to start with: the file given, or the built-in policy, and the bytes to
/// judge the file's changes against.
pub(super) fn initial_policy(
    path: Option<&Path>,
    context_on: bool,
) -> Result<(ActivePolicy, Vec<u8>), String> {
    match path {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let active = policy_from_bytes(path, &bytes)?;
            fits_context(path, &active.policy, context_on)?;
            Ok((active, bytes))
        }
        None => {
            let text = BUILTIN_TEXT;
            let policy = Policy::from_text(BUILTIN_SOURCE, text).map_err(|e| e.to_string())?;
            Ok((
                ActivePolicy::new(policy, text.as_bytes()),
                text.as_bytes().to_vec(),
            ))
        }
    }
}

/// A policy whose profiles match on namespace labels needs the cluster context, the only
/// place those labels come from: refused at load rather than never matching.
fn fits_context(path: &Path, policy: &Policy, context_on: bool) -> Result<(), String> {
    match policy.needs_namespace_labels() {
        Some(profile) if !context_on => Err(format!(
            "{}: profile {profile:?} matches on namespace labels (match.namespaceSelector), which tollgate only knows with its cluster context; drop --cluster-context off, or match on namespaces by name",
            path.display()
        )),
        _ => Ok(()),
    }
}

pub(super) fn policy_from_bytes(path: &Path, bytes: &[u8]) -> Result<ActivePolicy, String> {
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
pub(super) struct PolicyWatch {
    /// The bytes of the policy in force. Changes are judged against what was last loaded
    /// successfully, not against the last read: after a rejected file, the good one coming
    /// back is no change at all.
    in_force: Vec<u8>,
    /// The content last rejected, so that a bad file left in place is reported once.
    rejected: Option<Vec<u8>>,
    /// The read error last reported (a missing file, say), for the same reason.
    unreadable: Option<String>,
    /// Whether the server runs with its cluster context (see [`fits_context`]).
    context_on: bool,
}

impl PolicyWatch {
    pub(super) fn new(in_force: Vec<u8>) -> Self {
        PolicyWatch {
            in_force,
            rejected: None,
            unreadable: None,
            context_on: true,
        }
    }

    /// The same watch, for a server with its cluster context on or off.
    pub(super) fn with_cluster_context(mut self, on: bool) -> Self {
        self.context_on = on;
        self
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
        let loaded = policy_from_bytes(path, &bytes)
            .and_then(|p| fits_context(path, &p.policy, self.context_on).map(|()| p));
        match loaded {
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

/// Polls the policy file (when the policy came from one: the built-in policy has none to
/// watch) and the certificate files. Polling, not inotify: Kubernetes swaps a
/// `..data` symlink for ConfigMap and Secret volumes, which file watches miss easily, and a
/// read every few seconds costs nothing.
///
/// Each poll runs on tokio's blocking pool (`spawn_blocking`), not on a worker: a read of a
/// file can stall on a slow volume, and a changed policy is then parsed, checked and
/// composed, milliseconds of CPU; on a worker both would hold up the reviews queued behind
/// it. `tokio::fs` would move only the reads (each one a blocking task of its own): the
/// parse would still run on the worker. The loop waits for its poll, so polls never
/// overlap.
pub(super) async fn reload_loop(
    opts: ServeOptions,
    mut policy: Option<PolicyWatch>,
    composition: Arc<Composition>,
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
        let poll = {
            let (path, mut watch) = (opts.policy_path.clone(), policy.take());
            let (composition, state, certs) = (composition.clone(), state.clone(), certs.clone());
            tokio::task::spawn_blocking(move || {
                if let (Some(path), Some(watch)) = (&path, watch.as_mut()) {
                    poll_policy(path, watch, &composition, &state);
                }
                (watch, certs.reload())
            })
        };
        let reloaded = match poll.await {
            Ok((watch, reloaded)) => {
                policy = watch;
                reloaded
            }
            // A panic in the poll is a bug: it stays one, as it would have on the worker.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: the runtime is shutting down.
            Err(_) => return,
        };
        match reloaded {
            Ok(changed) => {
                cert_seen = None;
                cert_reported = None;
                if changed {
                    let path = certs
                        .paths()
                        .map(|(c, _)| c.display().to_string())
                        .unwrap_or_default();
                    info!(path = %path, not_after = certs.not_after(), "serving certificate reloaded");
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

/// One look at the policy file: a new policy goes into force, a bad one is reported once.
fn poll_policy(path: &Path, watch: &mut PolicyWatch, composition: &Composition, state: &AppState) {
    // Read by path every time: the path resolves through the ..data symlink to whatever
    // directory the kubelet swapped in last.
    let read = std::fs::read(path);
    match watch.poll(path, read) {
        PolicyPoll::Unchanged => {}
        PolicyPoll::Reloaded(p) => {
            info!(policy = %p.hash, previous = %state.policy.load().hash,
                path = %path.display(), "policy reloaded");
            // Composed with the TollgatePolicy and TollgateProfiles in force, if any: the
            // composer puts the result in force (the file's hash alone without them).
            if let Some(layer) = &p.policy.layers.file {
                composition.file_changed(layer.clone(), &watch.in_force, state);
            }
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
    let rejected = watch.rejected.is_some() || watch.unreadable.is_some();
    state.metrics.policy_rejected.set(i64::from(rejected));
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

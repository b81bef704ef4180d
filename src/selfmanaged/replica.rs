//! What every replica does: watch the one Secret (by name) and serve its certificate.
//!
//! A new certificate is checked (its key must be its own) before it replaces the one in
//! use; a bad one is reported once and the previous one stays. A broken watch keeps the
//! last certificate: kube's watcher retries with backoff and relists after a 410, and
//! `tollgate_certificate_secret_age_seconds` says for how long it has been failing. The
//! Secret deleted: the last certificate stays until the leader writes a new one.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::Api;
use tokio::sync::Notify;
use tracing::{info, warn};

use super::plan::{self, Stored, Timing};
use crate::certs::{self, CertInfo};
use crate::metrics::{CertMetrics, ResultLabels};
use crate::tls::CertStore;

/// Reads the Secret's data and annotations the leader plans from.
pub(super) fn stored(s: &Secret) -> Stored {
    let data = |k: &str| s.data.as_ref().and_then(|d| d.get(k)).map(|b| b.0.clone());
    let at = |k: &str| {
        s.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .and_then(|v| v.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(|t| t.as_millisecond())
    };
    Stored {
        ca_crt: data("ca.crt"),
        ca_key: data("ca.key"),
        tls_crt: data("tls.crt"),
        tls_key: data("tls.key"),
        ca_added_at: at(plan::CA_ADDED_AT),
        serving_issued_at: at(plan::SERVING_ISSUED_AT),
    }
}

/// Watches the Secret until the task is aborted, putting its certificate in `store`.
pub(super) async fn run(
    api: Api<Secret>,
    name: String,
    store: Arc<CertStore>,
    cm: CertMetrics,
    timing: Timing,
    // Woken on every event of the Secret: the leader plans again.
    changed: Arc<Notify>,
) {
    let what = format!("Secret {}/{}", api.namespace().unwrap_or_default(), name);
    let failing_since = Arc::new(AtomicI64::new(0));
    cm.secret_age.set(0);
    let stream = watcher(
        api,
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .default_backoff();
    let mut stream = std::pin::pin!(stream);
    // During a (re)list: whether the Secret was in it.
    let mut listed = false;
    let mut reported: Option<String> = None;
    let mut announced_absent = false;
    while let Some(event) = stream.next().await {
        let secret = match event {
            Ok(watcher::Event::Init) => {
                listed = false;
                current(&failing_since, &cm, &what);
                continue;
            }
            Ok(watcher::Event::InitApply(s)) => {
                listed = true;
                Some(s)
            }
            Ok(watcher::Event::InitDone) => {
                current(&failing_since, &cm, &what);
                if listed {
                    continue;
                }
                if !announced_absent {
                    info!(secret = %what, "self-managed certificates: no Secret yet; waiting for the certificate lease's holder to create it");
                    announced_absent = true;
                }
                changed.notify_one();
                continue;
            }
            Ok(watcher::Event::Apply(s)) => {
                current(&failing_since, &cm, &what);
                Some(s)
            }
            Ok(watcher::Event::Delete(_)) => {
                current(&failing_since, &cm, &what);
                warn!(secret = %what, "self-managed certificates: the Secret was deleted; serving the last certificate until it is written again");
                None
            }
            Err(e) => {
                let _ = failing_since.compare_exchange(
                    0,
                    unix_now(),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                cm.secret_age
                    .set((unix_now() - failing_since.load(Ordering::Relaxed)).max(0));
                cm.errors.inc();
                let (e, _) = crate::kubeconfig::watch_words(&e);
                warn!(secret = %what, error = %e, "self-managed certificates: the watch of the Secret failed; serving the last certificate while it retries");
                continue;
            }
        };
        if let Some(s) = &secret {
            announced_absent = false;
            serve(&what, s, &store, &cm, &timing, &mut reported);
        }
        changed.notify_one();
    }
}

/// The watch answers again.
fn current(failing_since: &AtomicI64, cm: &CertMetrics, what: &str) {
    if failing_since.swap(0, Ordering::Relaxed) != 0 {
        info!(secret = %what, "self-managed certificates: the watch of the Secret recovered");
    }
    cm.secret_age.set(0);
}

/// Puts the Secret's certificate in use if it is new and good.
fn serve(
    what: &str,
    s: &Secret,
    store: &CertStore,
    metrics: &CertMetrics,
    timing: &Timing,
    reported: &mut Option<String>,
) {
    let st = stored(s);
    if let Some(due) = plan::renewal_due(&st, timing) {
        metrics.renewal.set(due.div_euclid(1000));
    }
    let (Some(crt), Some(key)) = (&st.tls_crt, &st.tls_key) else {
        // The leader is writing a first certificate into a Secret made by hand.
        return;
    };
    match store.load_pem(what, crt, key) {
        Ok(false) => {}
        Ok(true) => {
            *reported = None;
            metrics.expiry.set(store.not_after());
            let ca = ca_of(&st, crt);
            if let Some(ca) = &ca {
                metrics.ca_expiry.set(ca.not_after);
            }
            metrics
                .reloads
                .get_or_create(&ResultLabels { result: "success" })
                .inc();
            info!(secret = %what, not_after = store.not_after(),
                ca = %ca.map(|c| c.subject).unwrap_or_default(),
                "serving certificate loaded from the Secret");
        }
        Err(e) => {
            let e = e.to_string();
            if reported.as_deref() != Some(e.as_str()) {
                warn!(secret = %what, error = %e, "the Secret's certificate was rejected; the previous certificate stays in use");
                metrics
                    .reloads
                    .get_or_create(&ResultLabels { result: "failure" })
                    .inc();
                *reported = Some(e);
            }
        }
    }
}

/// The CA of the bundle that signed the serving certificate.
fn ca_of(st: &Stored, crt: &[u8]) -> Option<CertInfo> {
    let leaf = CertInfo::parse_pem(std::str::from_utf8(crt).ok()?).ok()?;
    let bundle = CertInfo::parse_all(std::str::from_utf8(st.ca_crt.as_deref()?).ok()?).ok()?;
    bundle
        .into_iter()
        .find(|ca| certs::signed_by(&leaf.der, &ca.der))
}

pub(super) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

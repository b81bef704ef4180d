//! What the holder of the certificate Lease does: keep the Secret's certificates current
//! ([`super::plan`] decides what to write) and both webhook configurations' caBundle equal
//! to the Secret's CA bundle.
//!
//! Each round reads the Secret and the two webhook configurations (GET), puts the bundle
//! right where a configuration differs (a `kubectl apply` or `helm upgrade` that dropped
//! it, an install that never had it), then takes the plan's step: create or replace the
//! Secret at the resourceVersion read (a 409 means someone else wrote first: read again),
//! or wait. It waits for the plan's next due time or a change, whichever comes first: the
//! Secret's watch (the replica's) and a watch of each webhook configuration wake it. A
//! failed round is retried with a backoff doubling from half a second to 30 s.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::Api;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::plan::{self, Contents, Step, Timing, Trusted, Why};
use super::replica;
use crate::certs::{CertError, CertInfo};
use crate::metrics::{CertMetrics, ConfigurationLabels, IssuedLabels};

#[derive(Debug, thiserror::Error)]
pub(super) enum LeaderError {
    #[error("{}", crate::kubeconfig::words(.0))]
    Api(#[from] kube::Error),
    #[error("{0}")]
    Cert(#[from] CertError),
}

/// The leader's handles and settings.
pub(super) struct Leader {
    pub(super) secrets: Api<Secret>,
    pub(super) mutating: Api<MutatingWebhookConfiguration>,
    pub(super) validating: Api<ValidatingWebhookConfiguration>,
    pub(super) secret: String,
    pub(super) webhooks: String,
    /// The serving certificate's names: the Service's.
    pub(super) names: Vec<String>,
    pub(super) timing: Timing,
    pub(super) metrics: CertMetrics,
    /// Woken by the Secret's watch and the webhook configurations' watches.
    pub(super) changed: Arc<Notify>,
    /// A first Secret whose CA went into the webhooks but whose create failed: made again
    /// as it was, or each failed round would add one more CA to the caBundle (which keeps
    /// the CAs it already trusts when the Secret is made).
    pub(super) pending: std::sync::Mutex<Option<Contents>>,
}

/// What a round did.
enum Round {
    /// Wrote something: plan again at once, from what is there now.
    Wrote,
    /// Nothing to do before this time (Unix milliseconds).
    Idle(i64),
}

/// Longest sleep between rounds: a clock that jumped, or a change no watch reported,
/// is noticed within it.
const MAX_IDLE: Duration = Duration::from_secs(600);
/// Writes in a row before the leader backs off anyway: the plan converges in at most
/// three, so more means something else writes too.
const MAX_WRITES_IN_A_ROW: u32 = 8;

impl Leader {
    /// Acts while `leader` holds, until `stop`.
    pub(super) async fn run(
        self,
        mut leader: watch::Receiver<bool>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                r = leader.wait_for(|l| *l) => if r.is_err() { return },
                _ = stop.wait_for(|s| *s) => return,
            }
            let watches = self.watch_webhooks();
            let mut backoff = Backoff::default();
            let mut writes = 0u32;
            loop {
                if !*leader.borrow() || *stop.borrow() {
                    break;
                }
                let until = match self.round().await {
                    Ok(Round::Wrote) if writes < MAX_WRITES_IN_A_ROW => {
                        writes += 1;
                        continue;
                    }
                    Ok(Round::Wrote) => {
                        warn!("self-managed certificates: writing again and again (another writer?); backing off");
                        writes = 0;
                        backoff.next()
                    }
                    Ok(Round::Idle(at)) => {
                        writes = 0;
                        backoff = Backoff::default();
                        let ms = (at - now_ms()).max(0) as u64;
                        Duration::from_millis(ms).min(MAX_IDLE)
                    }
                    Err(e) => {
                        self.metrics.errors.inc();
                        let wait = backoff.next();
                        warn!(error = %e, retry_in = ?wait, "self-managed certificates: could not read or write the Secret or a webhook configuration");
                        wait
                    }
                };
                tokio::select! {
                    _ = tokio::time::sleep(until) => {}
                    _ = self.changed.notified() => {}
                    r = leader.changed() => if r.is_err() { break },
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
            for w in watches {
                w.abort();
            }
            if *stop.borrow() {
                return;
            }
        }
    }

    /// A watch of each webhook configuration (by name), waking the leader on each change.
    fn watch_webhooks(&self) -> Vec<JoinHandle<()>> {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.webhooks));
        let m = watcher(self.mutating.clone(), config.clone()).default_backoff();
        let v = watcher(self.validating.clone(), config).default_backoff();
        let wake = |stream: futures::stream::BoxStream<'static, Result<(), watcher::Error>>,
                    changed: Arc<Notify>,
                    which: &'static str| {
            tokio::spawn(async move {
                let mut stream = stream;
                while let Some(e) = stream.next().await {
                    match e {
                        Ok(()) => changed.notify_one(),
                        Err(e) => warn!(configuration = which, error = %e,
                            "self-managed certificates: the watch of a webhook configuration failed; retrying"),
                    }
                }
            })
        };
        vec![
            wake(
                m.map(|e| e.map(|_| ())).boxed(),
                self.changed.clone(),
                "mutating",
            ),
            wake(
                v.map(|e| e.map(|_| ())).boxed(),
                self.changed.clone(),
                "validating",
            ),
        ]
    }

    async fn round(&self) -> Result<Round, LeaderError> {
        let secret = self.secrets.get_opt(&self.secret).await?;
        let mut mutating = self.mutating.get_opt(&self.webhooks).await?;
        let mut validating = self.validating.get_opt(&self.webhooks).await?;
        let bundle = secret
            .as_ref()
            .and_then(|s| s.data.as_ref()?.get("ca.crt").cloned())
            .filter(|b| {
                std::str::from_utf8(&b.0)
                    .ok()
                    .and_then(|t| CertInfo::parse_all(t).ok())
                    .is_some_and(|c| !c.is_empty())
            });
        if let Some(bundle) = &bundle {
            if self
                .repair(&mut mutating, &mut validating, &bundle.0)
                .await?
            {
                return Ok(Round::Wrote);
            }
        }
        let mut trusted = Trusted::default();
        for hooks in [
            mutating
                .as_ref()
                .map(|m| bundles(m.webhooks.iter().flatten().map(|w| &w.client_config))),
            validating
                .as_ref()
                .map(|v| bundles(v.webhooks.iter().flatten().map(|w| &w.client_config))),
        ]
        .into_iter()
        .flatten()
        {
            trusted.bundles.extend(hooks);
        }
        let stored = secret.as_ref().map(replica::stored);
        let step = plan::next(
            now_ms(),
            stored.as_ref(),
            &trusted,
            &self.timing,
            &self.names,
        )?;
        match step {
            Step::Wait(at) => Ok(Round::Idle(at)),
            Step::Create(planned) => {
                let c = self
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(planned)
                    .clone();
                // The webhooks trust the new CA before any replica can serve a certificate
                // of it.
                self.repair(&mut mutating, &mut validating, c.ca_crt.as_bytes())
                    .await?;
                let mut s = Secret {
                    metadata: ObjectMeta {
                        name: Some(self.secret.clone()),
                        namespace: self.secrets.namespace().map(str::to_owned),
                        ..ObjectMeta::default()
                    },
                    type_: Some("kubernetes.io/tls".into()),
                    ..Secret::default()
                };
                fill(&mut s, &c);
                let created = self.secrets.create(&PostParams::default(), &s).await;
                let settled = match &created {
                    Ok(_) => true,
                    Err(kube::Error::Api(s)) => s.code == 409,
                    Err(_) => false,
                };
                if settled {
                    *self.pending.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
                match created {
                    Ok(_) => self.issued(Why::Created, &c),
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
                Ok(Round::Wrote)
            }
            Step::Update(c, why) => {
                let Some(mut s) = secret else {
                    return Ok(Round::Wrote);
                };
                fill(&mut s, &c);
                match self
                    .secrets
                    .replace(&self.secret, &PostParams::default(), &s)
                    .await
                {
                    Ok(_) => self.issued(why, &c),
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
                Ok(Round::Wrote)
            }
        }
    }

    fn issued(&self, why: Why, c: &Contents) {
        let (ca, serving) = why.issues();
        if ca {
            self.metrics
                .rotations
                .get_or_create(&IssuedLabels { kind: "ca" })
                .inc();
        }
        if serving {
            self.metrics
                .rotations
                .get_or_create(&IssuedLabels { kind: "serving" })
                .inc();
        }
        let cas = CertInfo::parse_all(&c.ca_crt).map_or(0, |b| b.len());
        info!(secret = %self.secret, step = why.as_str(), cas_trusted = cas,
            "self-managed certificates: Secret written");
    }

    /// Sets every webhook's caBundle of both configurations (those that exist) to
    /// `bundle`; whether it wrote anything.
    async fn repair(
        &self,
        mutating: &mut Option<MutatingWebhookConfiguration>,
        validating: &mut Option<ValidatingWebhookConfiguration>,
        bundle: &[u8],
    ) -> Result<bool, LeaderError> {
        let mut wrote = false;
        if let Some(m) = mutating {
            let hooks = m
                .webhooks
                .iter_mut()
                .flatten()
                .map(|w| &mut w.client_config);
            if set_bundles(hooks, bundle) {
                let name = self.webhooks.as_str();
                match self.mutating.replace(name, &PostParams::default(), m).await {
                    Ok(new) => {
                        *m = new;
                        self.bundle_written("mutating");
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
                wrote = true;
            }
        }
        if let Some(v) = validating {
            let hooks = v
                .webhooks
                .iter_mut()
                .flatten()
                .map(|w| &mut w.client_config);
            if set_bundles(hooks, bundle) {
                let name = self.webhooks.as_str();
                match self
                    .validating
                    .replace(name, &PostParams::default(), v)
                    .await
                {
                    Ok(new) => {
                        *v = new;
                        self.bundle_written("validating");
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
                wrote = true;
            }
        }
        Ok(wrote)
    }

    fn bundle_written(&self, configuration: &'static str) {
        self.metrics
            .ca_bundle_writes
            .get_or_create(&ConfigurationLabels { configuration })
            .inc();
        info!(configuration, name = %self.webhooks,
            "self-managed certificates: webhook configuration's caBundle set to the Secret's CA bundle");
    }
}

/// The caBundle of each webhook (empty where unset).
fn bundles<'a>(
    configs: impl Iterator<Item = &'a k8s_openapi::api::admissionregistration::v1::WebhookClientConfig>,
) -> Vec<Vec<u8>> {
    configs
        .map(|c| {
            c.ca_bundle
                .as_ref()
                .map(|b| b.0.clone())
                .unwrap_or_default()
        })
        .collect()
}

/// Sets each caBundle that differs; whether any did.
fn set_bundles<'a>(
    configs: impl Iterator<
        Item = &'a mut k8s_openapi::api::admissionregistration::v1::WebhookClientConfig,
    >,
    bundle: &[u8],
) -> bool {
    let mut changed = false;
    for c in configs {
        if c.ca_bundle.as_ref().map(|b| b.0.as_slice()) != Some(bundle) {
            c.ca_bundle = Some(ByteString(bundle.to_vec()));
            changed = true;
        }
    }
    changed
}

/// Writes the contents into the Secret: its four keys (others are left alone), the two
/// times, and tollgate's label.
fn fill(s: &mut Secret, c: &Contents) {
    let data = s.data.get_or_insert_with(Default::default);
    for (k, v) in [
        ("ca.crt", c.ca_crt.as_bytes()),
        ("ca.key", c.ca_key.as_bytes()),
        ("tls.crt", c.tls_crt.as_slice()),
        ("tls.key", c.tls_key.as_slice()),
    ] {
        data.insert(k.to_owned(), ByteString(v.to_vec()));
    }
    let time = |ms: i64| {
        k8s_openapi::jiff::Timestamp::from_millisecond(ms)
            .map(|t| t.to_string())
            .unwrap_or_default()
    };
    let annotations = s.metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert(plan::CA_ADDED_AT.to_owned(), time(c.ca_added_at));
    annotations.insert(
        plan::SERVING_ISSUED_AT.to_owned(),
        time(c.serving_issued_at),
    );
    s.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("app.kubernetes.io/managed-by".into(), "tollgate".into());
}

/// Exponential backoff: half a second, doubling, at most 30 s.
#[derive(Default)]
struct Backoff {
    tries: u32,
}

impl Backoff {
    fn next(&mut self) -> Duration {
        let d = Duration::from_millis(500) * 2u32.saturating_pow(self.tries.min(6));
        self.tries += 1;
        d.min(Duration::from_secs(30))
    }
}

pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

//! One replica at a time does a cluster-wide duty (the background audit, the self-managed
//! certificates, the status of the TollgatePolicy and TollgateProfiles): the holder of a `coordination.k8s.io/v1` Lease, taken and renewed the
//! way client-go's leader election does it, with get and create or replace at the
//! resourceVersion read (a 409 means another replica wrote first: this one is not the
//! holder).
//!
//! - A Lease held by another replica is taken over once it has not changed for its
//!   `leaseDurationSeconds`, measured on this replica's clock from when this replica saw it
//!   change (not from the `renewTime` written in it, so that clocks need not agree).
//! - The holder renews every `renew_every`; if it cannot renew for a whole lease duration
//!   it stops counting itself the holder, before anyone else can take the Lease.
//! - On shutdown the holder releases the Lease (no holder, a one-second duration), so the
//!   other replica takes over at its next try rather than a lease duration later.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use tokio::sync::watch;
use tracing::{info, warn};

/// Where the Lease is and how it is held.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    pub name: String,
    pub namespace: String,
    /// This replica: its pod's name (or host name) and a random suffix, so that a
    /// restarted pod of the same name is a new holder.
    pub identity: String,
    pub duration: Duration,
    pub renew_every: Duration,
    /// What the Lease is for, in log lines: `audit` gives `audit lease: acquired; this
    /// replica audits`.
    pub purpose: Purpose,
}

/// The duty a Lease elects a replica for, as the log lines name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Audit,
    Certificates,
    /// The status of the TollgatePolicy and TollgateProfiles.
    PolicyStatus,
}

impl Purpose {
    fn name(self) -> &'static str {
        match self {
            Purpose::Audit => "audit lease",
            Purpose::Certificates => "certificate lease",
            Purpose::PolicyStatus => "policy status lease",
        }
    }

    fn duty(self) -> &'static str {
        match self {
            Purpose::Audit => "this replica audits",
            Purpose::Certificates => "this replica manages the certificates",
            Purpose::PolicyStatus => "this replica writes the policy objects' status",
        }
    }

    fn elsewhere(self) -> &'static str {
        match self {
            Purpose::Audit => "another replica audits",
            Purpose::Certificates => "another replica manages the certificates",
            Purpose::PolicyStatus => "another replica writes the policy objects' status",
        }
    }
}

impl LeaseOptions {
    /// The server's: `tollgate-audit`, 30 s, renewed every 10 s.
    pub fn new(namespace: &str) -> LeaseOptions {
        LeaseOptions {
            name: "tollgate-audit".into(),
            namespace: namespace.to_owned(),
            identity: identity(),
            duration: Duration::from_secs(30),
            renew_every: Duration::from_secs(10),
            purpose: Purpose::Audit,
        }
    }
}

/// `$POD_NAME`, else the host name (a pod's name), else `tollgate`; then `_` and 8 random
/// hex digits.
pub fn identity() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let host = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "tollgate".into());
    // RandomState's keys are random per process: enough to tell two holders apart.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{host}_{:08x}", random as u32)
}

/// Keeps trying for the Lease and says, through `leader`, whether this replica holds it.
pub struct Elector {
    api: Api<Lease>,
    opts: LeaseOptions,
    /// Another holder's record as last seen: its resourceVersion and when it was seen.
    observed: Option<(String, Instant)>,
    /// When this replica last renewed successfully.
    renewed: Option<Instant>,
    leader: watch::Sender<bool>,
}

impl Elector {
    pub fn new(client: kube::Client, opts: LeaseOptions, leader: watch::Sender<bool>) -> Self {
        Elector {
            api: Api::namespaced(client, &opts.namespace),
            opts,
            observed: None,
            renewed: None,
            leader,
        }
    }

    /// Tries every `renew_every` until `stop` is set, then releases the Lease if held.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        loop {
            let holds = match self.try_once().await {
                Ok(holds) => holds,
                Err(e) if crate::kubeconfig::is_unreachable(&e) => {
                    // Said once for every watch and Lease, with the URL.
                    let said = crate::kubeconfig::words(&e);
                    if let Some(line) = crate::kubeconfig::unreachable(&said) {
                        warn!("{line}");
                    }
                    self.renewed
                        .is_some_and(|t| t.elapsed() < self.opts.duration)
                }
                Err(e) => {
                    let e = crate::kubeconfig::words(&e);
                    warn!(lease = %self.opts.name, error = %e, "{}: could not read or write the Lease", self.opts.purpose.name());
                    // Still the holder until the lease could have passed to someone else.
                    self.renewed
                        .is_some_and(|t| t.elapsed() < self.opts.duration)
                }
            };
            self.set(holds);
            tokio::select! {
                _ = tokio::time::sleep(self.opts.renew_every) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        self.release().await;
    }

    fn set(&mut self, holds: bool) {
        if !holds {
            self.renewed = None;
        }
        let was = self.leader.send_replace(holds);
        if was != holds {
            info!(lease = %self.opts.name, identity = %self.opts.identity, leader = holds,
                "{}: {}", self.opts.purpose.name(),
                if holds { format!("acquired; {}", self.opts.purpose.duty()) } else { format!("not held; {}", self.opts.purpose.elsewhere()) });
        }
    }

    fn record(&self, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.opts.identity.clone()),
            lease_duration_seconds: Some(self.opts.duration.as_secs().max(1) as i32),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One round: create, renew or take over the Lease. Whether this replica holds it.
    pub async fn try_once(&mut self) -> Result<bool, kube::Error> {
        let pp = PostParams::default();
        let Some(lease) = self.api.get_opt(&self.opts.name).await? else {
            let new = Lease {
                metadata: ObjectMeta {
                    name: Some(self.opts.name.clone()),
                    namespace: Some(self.opts.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.record(0, None)),
            };
            return self.written(self.api.create(&pp, &new).await);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let transitions = spec.lease_transitions.unwrap_or(0);
        if holder == self.opts.identity {
            let mut renewed = lease.clone();
            renewed.spec = Some(self.record(transitions, spec.acquire_time.clone()));
            return self.written(self.api.replace(&self.opts.name, &pp, &renewed).await);
        }
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        let seen = match &self.observed {
            Some((r, at)) if *r == rv => *at,
            _ => {
                let now = Instant::now();
                self.observed = Some((rv, now));
                now
            }
        };
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
        if !holder.is_empty() && seen.elapsed() < duration {
            return Ok(false);
        }
        let mut taken = lease.clone();
        taken.spec = Some(self.record(transitions + 1, None));
        self.written(self.api.replace(&self.opts.name, &pp, &taken).await)
    }

    fn written(&mut self, result: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
        match result {
            Ok(_) => {
                self.renewed = Some(Instant::now());
                Ok(true)
            }
            // Someone else wrote first: not the holder, for now.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up, if held: no holder and a one-second duration, as client-go's
    /// `ReleaseOnCancel` does.
    async fn release(&mut self) {
        let held = *self.leader.borrow();
        self.set(false);
        if !held {
            return;
        }
        let Ok(Some(mut lease)) = self.api.get_opt(&self.opts.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.opts.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.opts.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => info!(lease = %self.opts.name, "{} released", self.opts.purpose.name()),
            Err(e) => {
                let e = crate::kubeconfig::words(&e);
                warn!(lease = %self.opts.name, error = %e, "{}: could not release", self.opts.purpose.name())
            }
        }
    }
}

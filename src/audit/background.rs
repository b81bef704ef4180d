//! The server's background audit (`serve --audit-interval`): the same audit as the
//! command, on a timer, by the one replica that holds the Lease, writing one PolicyReport
//! per namespace with findings and deleting those of namespaces that have none left.
//!
//! It must never delay a review. It runs on its own task; between two objects it yields,
//! and it judges at most `rate` objects per second, sleeping off the rest, so its CPU is
//! bounded by `rate` times the cost of one object (about a hundred microseconds in a
//! release build) whatever the cluster's size. The time it spends judging is counted in
//! `tollgate_audit_busy_seconds_total`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::report::{self, ReportBuilder, Written};
use super::{AuditError, Auditor, Context, Namespaces, Pace, Totals};
use crate::cluster::ClusterContext;
use crate::lease::{self, Elector, LeaseOptions, Purpose};
use crate::metrics::{AuditMetrics, FindingLabels, ReportLabels, ResultLabels};
use tollgate_core::{Policy, Rule};

/// How the server audits: `--audit-interval`, `--audit-rate`, and the Lease.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// From the end of one run to the start of the next.
    pub interval: Duration,
    /// Most objects judged per second; 0: as fast as it goes (tests).
    pub rate: u32,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// The Lease's name, duration and renewal; its namespace None: the client's default
    /// namespace (in a pod, the pod's own).
    pub lease_name: String,
    pub lease_namespace: Option<String>,
    pub lease_duration: Duration,
    pub renew_every: Duration,
    /// Objects per list request.
    pub page_size: u32,
    /// Namespaces (names or globs) not audited: those the webhooks never act in.
    pub exclude: Vec<String>,
}

impl AuditOptions {
    pub fn new(interval: Duration) -> AuditOptions {
        let lease = LeaseOptions::new("");
        AuditOptions {
            interval,
            rate: 200,
            kubeconfig: None,
            context: None,
            lease_name: lease.name,
            lease_namespace: None,
            lease_duration: lease.duration,
            renew_every: lease.renew_every,
            page_size: super::list::PAGE_SIZE,
            exclude: vec![],
        }
    }
}

/// What the audit reads the policy in force from (the server's, reloaded as it changes).
pub type PolicySource = Arc<dyn Fn() -> Arc<dyn AsRef<Policy> + Send + Sync> + Send + Sync>;

/// The running background audit: stop it with the server's stop signal and await this.
pub struct Background {
    pub task: JoinHandle<()>,
}

/// The API server the audit reads and writes: a client, its URL (for messages) and its
/// default namespace (the Lease's, unless the options name another).
pub struct ApiServer {
    pub client: kube::Client,
    pub url: String,
    pub namespace: String,
}

/// Starts the Lease and the audit loop; they end when `stop` becomes true (the holder
/// then releases the Lease).
pub fn start(
    api: ApiServer,
    opts: AuditOptions,
    policy: PolicySource,
    cluster: Option<Arc<dyn ClusterContext>>,
    metrics: AuditMetrics,
    stop: watch::Receiver<bool>,
) -> Background {
    let ApiServer {
        client,
        url,
        namespace: default_namespace,
    } = api;
    let (leader_tx, leader_rx) = watch::channel(false);
    let lease = LeaseOptions {
        name: opts.lease_name.clone(),
        namespace: opts
            .lease_namespace
            .clone()
            .unwrap_or_else(|| default_namespace.clone()),
        identity: lease::identity(),
        duration: opts.lease_duration,
        renew_every: opts.renew_every,
        purpose: Purpose::Audit,
    };
    info!(lease = %lease.name, namespace = %lease.namespace, identity = %lease.identity,
        interval = ?opts.interval, rate = opts.rate, "background audit: waiting for the audit lease");
    let elector = tokio::spawn(Elector::new(client.clone(), lease, leader_tx).run(stop.clone()));
    let gauge = {
        let mut leader = leader_rx.clone();
        let m = metrics.clone();
        tokio::spawn(async move {
            while leader.changed().await.is_ok() {
                m.leader.set(i64::from(*leader.borrow()));
            }
        })
    };
    let mut auditor = Auditor::new(client.clone(), url);
    auditor.page_size = opts.page_size;
    auditor.exclude = opts
        .exclude
        .iter()
        .map(|g| tollgate_core::Glob::new(g))
        .collect();
    let waits_for_sync = cluster.clone();
    if let Some(c) = cluster {
        auditor.context = Context::Shared(c);
    }
    let mut looped = Loop {
        client,
        auditor,
        opts,
        policy,
        metrics,
        leader: leader_rx,
        stop,
        waits_for_sync,
        series: BTreeSet::new(),
    };
    let task = tokio::spawn(async move {
        looped.run().await;
        let _ = elector.await;
        gauge.abort();
    });
    Background { task }
}

struct Loop {
    client: kube::Client,
    auditor: Auditor,
    opts: AuditOptions,
    policy: PolicySource,
    metrics: AuditMetrics,
    leader: watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
    waits_for_sync: Option<Arc<dyn ClusterContext>>,
    /// The findings series set by the last run, so that those of namespaces that no longer
    /// have findings are removed.
    series: BTreeSet<FindingLabels>,
}

impl Loop {
    async fn run(&mut self) {
        loop {
            let mut leader = self.leader.clone();
            let mut stop = self.stop.clone();
            tokio::select! {
                _ = leader.wait_for(|l| *l) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if !self.synced().await {
                continue;
            }
            let started = Instant::now();
            match self.run_once().await {
                Ok(totals) => {
                    let seconds = started.elapsed().as_secs_f64();
                    self.metrics
                        .runs
                        .get_or_create(&ResultLabels { result: "success" })
                        .inc();
                    self.metrics.last_run.set(unix_now());
                    self.metrics.last_duration.set(seconds);
                    self.metrics
                        .last_objects
                        .set(i64::try_from(totals.seen()).unwrap_or(i64::MAX));
                    info!(
                        duration_s = seconds,
                        namespaces = totals.namespaces,
                        objects = totals.seen(),
                        refused = totals.refused,
                        mutated = totals.mutated,
                        "background audit: {}",
                        totals.summary()
                    );
                    for (kind, why) in self.auditor.forbidden_kinds() {
                        self.metrics.errors.inc();
                        warn!(kind = %kind, error = %why, "background audit: a workload kind was not audited (its pods were)");
                    }
                    for (what, why) in self.auditor.unread() {
                        warn!(needs = %what, error = %why, "background audit: forbidden; feasibility said nothing of what it could not read");
                    }
                }
                Err(AuditError::Stopped) => {
                    info!("background audit: run stopped (shutting down, or the lease passed to another replica)");
                    continue;
                }
                Err(e) => {
                    self.metrics
                        .runs
                        .get_or_create(&ResultLabels { result: "failure" })
                        .inc();
                    self.metrics.errors.inc();
                    warn!(error = %e, "background audit: run failed; retrying at the next interval");
                }
            }
            let mut stop = self.stop.clone();
            tokio::select! {
                _ = tokio::time::sleep(self.opts.interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Waits for the cluster context's first sync (an audit before it would find every
    /// claim and namespace unknown); false if stopped or no longer the holder meanwhile.
    async fn synced(&self) -> bool {
        let Some(c) = &self.waits_for_sync else {
            return true;
        };
        if !c.synced() {
            info!("background audit: waiting for the cluster context's first sync");
        }
        while !c.synced() {
            if self.interrupted() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        true
    }

    fn interrupted(&self) -> bool {
        *self.stop.borrow() || !*self.leader.borrow()
    }

    async fn run_once(&mut self) -> Result<Totals, AuditError> {
        let policy = (self.policy)();
        let policy: &Policy = (*policy).as_ref();
        let seconds = unix_now();
        self.auditor.start_run();
        let namespaces = self.auditor.namespaces(&Namespaces::All, policy).await?;
        // Which namespaces hold a report of tollgate's: only those are deleted from, so a
        // clean namespace costs no request. If they cannot be listed, every clean
        // namespace's report is deleted blindly.
        let with_reports: Option<BTreeSet<String>> = match report::namespaces_with_reports(
            &self.client,
        )
        .await
        {
            Ok(v) => Some(v.into_iter().collect()),
            Err(e) => {
                self.metrics.errors.inc();
                warn!(error = %e, "background audit: could not list PolicyReports; deleting blindly");
                None
            }
        };
        let mut totals = Totals::default();
        // Namespaces whose report stays: those with findings, and those that could not be
        // audited this time (their last report is the best there is).
        let mut kept = BTreeSet::new();
        let mut series = BTreeSet::new();
        let mut pace = Paced::new(self.opts.rate, self.metrics.clone());
        for ns in &namespaces {
            if self.interrupted() {
                return Err(AuditError::Stopped);
            }
            let mut builder = ReportBuilder::new(&ns.name, seconds);
            let (stop, leader) = (self.stop.clone(), self.leader.clone());
            let result = self
                .auditor
                .audit_namespace(policy, ns, &mut pace, |a| {
                    if *stop.borrow() || !*leader.borrow() {
                        return Err(AuditError::Stopped);
                    }
                    builder.add(a);
                    Ok(())
                })
                .await;
            let t = match result {
                Ok(t) => t,
                Err(AuditError::Stopped) => return Err(AuditError::Stopped),
                Err(e) => {
                    self.metrics.errors.inc();
                    warn!(namespace = %ns.name, error = %e, "background audit: namespace not audited; its report stays as it was");
                    kept.insert(ns.name.clone());
                    series.extend(
                        self.series
                            .iter()
                            .filter(|l| l.namespace == ns.name)
                            .cloned(),
                    );
                    continue;
                }
            };
            totals.merge(&t);
            if self.interrupted() {
                return Err(AuditError::Stopped);
            }
            let written = if builder.has_findings() {
                kept.insert(ns.name.clone());
                report::write(&self.client, builder.build()).await
            } else if with_reports.as_ref().is_none_or(|w| w.contains(&ns.name)) {
                report::delete(&self.client, &ns.name).await
            } else {
                Ok(Written::Absent)
            };
            match written {
                Ok(w) => self.count(w),
                Err(e) => {
                    self.metrics.errors.inc();
                    warn!(namespace = %ns.name, error = %e, "background audit: could not write the namespace's PolicyReport");
                }
            }
            for rule in Rule::ALL {
                let labels = FindingLabels {
                    namespace: ns.name.clone(),
                    rule: rule.as_str(),
                };
                match builder.by_rule.get(rule.as_str()) {
                    Some(&n) => {
                        self.metrics
                            .findings
                            .get_or_create(&labels)
                            .set(i64::try_from(n).unwrap_or(i64::MAX));
                        series.insert(labels);
                    }
                    None => {
                        self.metrics.findings.remove(&labels);
                    }
                }
            }
        }
        // Reports of namespaces gone since the list.
        let audited: BTreeSet<&str> = namespaces.iter().map(|n| n.name.as_str()).collect();
        for ns in with_reports.iter().flatten() {
            if audited.contains(ns.as_str()) || kept.contains(ns) {
                continue;
            }
            if self.interrupted() {
                return Err(AuditError::Stopped);
            }
            match report::delete(&self.client, ns).await {
                Ok(w) => self.count(w),
                Err(e) => {
                    self.metrics.errors.inc();
                    warn!(namespace = %ns, error = %e, "background audit: could not delete a stale PolicyReport");
                }
            }
        }
        for gone in self.series.difference(&series) {
            self.metrics.findings.remove(gone);
        }
        self.series = series;
        totals.namespaces = namespaces.len() as u64;
        Ok(totals)
    }

    fn count(&self, w: Written) {
        let action = match w {
            Written::Created | Written::Updated | Written::Deleted => w.as_str(),
            Written::Unchanged | Written::Absent => return,
        };
        self.metrics
            .reports
            .get_or_create(&ReportLabels { action })
            .inc();
    }
}

/// At most `rate` objects a second, yielding between any two.
struct Paced {
    rate: u32,
    since: Instant,
    n: u64,
    metrics: AuditMetrics,
}

impl Paced {
    fn new(rate: u32, metrics: AuditMetrics) -> Paced {
        Paced {
            rate,
            since: Instant::now(),
            n: 0,
            metrics,
        }
    }
}

impl Pace for Paced {
    async fn after_object(&mut self, busy: Duration) {
        self.metrics.busy.inc_by(busy.as_secs_f64());
        self.metrics.objects.inc();
        if self.rate > 0 {
            self.n += 1;
            let due = self.since + Duration::from_secs_f64(self.n as f64 / f64::from(self.rate));
            let now = Instant::now();
            if due > now {
                tokio::time::sleep(due - now).await;
                return;
            }
            // Behind (a slow list): start counting afresh rather than burst to catch up.
            if now - due > Duration::from_secs(1) {
                self.since = now;
                self.n = 0;
            }
        }
        tokio::task::yield_now().await;
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

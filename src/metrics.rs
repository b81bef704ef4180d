//! Prometheus metrics, served on their own plain-HTTP port.

use std::sync::atomic::{AtomicI64, AtomicU64};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::cluster::ResourceStatus;
use tollgate_core::{
    OptOut, Outcome, Policy, Reviewed, Stage, Step, Verdict, BASE_PROFILE, POLICY_KIND,
    PROFILE_KIND,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    pub endpoint: &'static str,
    pub operation: String,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    pub step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OptOutLabels {
    pub endpoint: &'static str,
    /// "honoured" or "refused": lower case like every other label value (a derived
    /// EncodeLabelValue would print the variant names, "Honoured").
    pub decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HashLabels {
    pub hash: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FetchLabels {
    pub resource: &'static str,
    /// found, absent or failed.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProfileLabels {
    pub endpoint: &'static str,
    /// A profile of the policy file, or "base", each with `+ns` where a namespace's
    /// TollgateProfile applied over it ([`profile_label`]): twice as many values as the
    /// file has profiles at most.
    pub profile: String,
}

/// The values of [`ObjectStateLabels::state`].
pub const OBJECT_STATES: [&str; 3] = ["in_force", "last_good", "invalid"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectStateLabels {
    /// TollgatePolicy or TollgateProfile.
    pub kind: &'static str,
    /// in_force (this generation's spec), last_good (the spec before it, over one that does
    /// not load) or invalid (none: it does not load and none before it did).
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    pub kind: &'static str,
    /// Invalid, OutOfBounds or NotDefault: the `Ready` condition's reason.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct FindingLabels {
    /// A namespace with findings: as many values as namespaces have findings.
    pub namespace: String,
    /// One of the audit's rules (`requests`, a mutation step, `opt-out`, `review`).
    pub rule: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReportLabels {
    /// created, updated or deleted.
    pub action: &'static str,
}

/// The background audit's series (`serve --audit-interval`). Clones share the series: the
/// audit's task holds one.
#[derive(Clone, Default)]
pub struct AuditMetrics {
    /// Findings of the last run, by namespace and rule; a namespace with none has no
    /// series. Bounded by namespaces x 7 rules.
    pub findings: Family<FindingLabels, Gauge>,
    /// 1 while this replica holds the audit Lease.
    pub leader: Gauge,
    pub runs: Family<ResultLabels, Counter>,
    pub last_run: Gauge<i64, AtomicI64>,
    pub last_duration: Gauge<f64, AtomicU64>,
    pub last_objects: Gauge,
    pub objects: Counter,
    pub errors: Counter,
    /// Time spent judging objects (CPU-bound work; lists and pacing waits excluded).
    pub busy: Counter<f64, AtomicU64>,
    pub reports: Family<ReportLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IssuedLabels {
    /// serving or ca.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigurationLabels {
    /// mutating or validating.
    pub configuration: &'static str,
}

/// The serving certificate's series, and those of the self-managed certificates
/// (`serve --certs self-managed`). Clones share the series.
#[derive(Clone, Default)]
pub struct CertMetrics {
    /// `tollgate_certificate_expiry_timestamp_seconds` (the same series as
    /// [`Metrics::cert_expiry`]).
    pub expiry: Gauge<i64, AtomicI64>,
    /// `tollgate_certificate_reloads_total` (the same as [`Metrics::cert_reloads`]).
    pub reloads: Family<ResultLabels, Counter>,
    /// Expiry of the CA that signed the certificate in use.
    pub ca_expiry: Gauge<i64, AtomicI64>,
    /// When the Secret's certificates are due for renewal (the serving certificate's or the
    /// CA's, whichever first), as every replica reads it.
    pub renewal: Gauge<i64, AtomicI64>,
    /// Certificates the leader issued, by kind.
    pub rotations: Family<IssuedLabels, Counter>,
    /// Writes of a webhook configuration's caBundle, by configuration.
    pub ca_bundle_writes: Family<ConfigurationLabels, Counter>,
    /// 1 while this replica holds the certificate Lease.
    pub leader: Gauge,
    /// 0 while the watch of the Secret is current, else seconds since it failed.
    pub secret_age: Gauge,
    /// Failed reads and writes of the Secret and the webhook configurations.
    pub errors: Counter,
}

/// Every metric tollgate exports. Cheap to update: atomics behind a lock-free map lookup.
pub struct Metrics {
    pub registry: Registry,
    pub reviews: Family<ReviewLabels, Counter>,
    /// Reviews answered, by the policy profile the object got.
    pub profile_reviews: Family<ProfileLabels, Counter>,
    pub duration: Family<EndpointLabels, Histogram>,
    pub steps: Family<StepLabels, Counter>,
    pub denials: Family<ReasonLabels, Counter>,
    pub opt_outs: Family<OptOutLabels, Counter>,
    pub policy_reloads: Family<ResultLabels, Counter>,
    /// 1 while the policy file on disk is rejected (or unreadable) and an older one is in force.
    pub policy_rejected: Gauge,
    pub cert_reloads: Family<ResultLabels, Counter>,
    pub policy_info: Family<HashLabels, Gauge>,
    /// The TollgatePolicy and TollgateProfiles, by kind and which spec of each is in force.
    pub policy_objects: Family<ObjectStateLabels, Gauge>,
    /// Objects found not to load (each generation and reason counted once).
    pub policy_object_rejections: Family<RejectionLabels, Counter>,
    /// 1 while the cluster serves the kind (its CRD is installed); cluster context only.
    pub policy_objects_served: Family<KindLabels, Gauge>,
    /// Writes of the objects' status by the holder of the status Lease.
    pub policy_status_writes: Family<ResultLabels, Counter>,
    pub cert_expiry: Gauge<i64, AtomicI64>,
    pub in_flight: Gauge,
    /// Log lines dropped because stderr could not keep up (kept by the log writer, brought
    /// up to date when metrics are read).
    pub log_lines_dropped: Counter,
    /// The cluster context's caches, brought up to date when metrics are read.
    pub cluster_synced: Family<ResourceLabels, Gauge>,
    pub cluster_age: Family<ResourceLabels, Gauge>,
    pub cluster_objects: Family<ResourceLabels, Gauge>,
    pub cluster_last_sync: Family<ResourceLabels, Gauge>,
    pub cluster_restarts: Family<ResourceLabels, Counter>,
    pub cluster_fetches: Family<FetchLabels, Counter>,
    pub audit: AuditMetrics,
    pub certs: CertMetrics,
}

/// Review latency buckets: 50 microseconds (a review's own cost) to 10 seconds (the
/// apiserver's longest webhook timeout).
const BUCKETS: [f64; 17] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// `tollgate_denials_total`'s reason for a TollgatePolicy or TollgateProfile the
/// validating webhook refused (out of bounds, or not loadable).
pub const POLICY_OBJECT_DENIED: &str = "invalid_policy_object";

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tollgate");
        let reviews = Family::<ReviewLabels, Counter>::default();
        let profile_reviews = Family::<ProfileLabels, Counter>::default();
        let duration =
            Family::<EndpointLabels, Histogram>::new_with_constructor(|| Histogram::new(BUCKETS));
        let steps = Family::<StepLabels, Counter>::default();
        let denials = Family::<ReasonLabels, Counter>::default();
        let opt_outs = Family::<OptOutLabels, Counter>::default();
        let policy_reloads = Family::<ResultLabels, Counter>::default();
        let policy_rejected = Gauge::default();
        let cert_reloads = Family::<ResultLabels, Counter>::default();
        let policy_info = Family::<HashLabels, Gauge>::default();
        let policy_objects = Family::<ObjectStateLabels, Gauge>::default();
        let policy_object_rejections = Family::<RejectionLabels, Counter>::default();
        let policy_objects_served = Family::<KindLabels, Gauge>::default();
        let policy_status_writes = Family::<ResultLabels, Counter>::default();
        let cert_expiry = Gauge::<i64, AtomicI64>::default();
        let in_flight = Gauge::default();
        let log_lines_dropped = Counter::default();
        let cluster_synced = Family::<ResourceLabels, Gauge>::default();
        let cluster_age = Family::<ResourceLabels, Gauge>::default();
        let cluster_objects = Family::<ResourceLabels, Gauge>::default();
        let cluster_last_sync = Family::<ResourceLabels, Gauge>::default();
        let cluster_restarts = Family::<ResourceLabels, Counter>::default();
        let cluster_fetches = Family::<FetchLabels, Counter>::default();
        registry.register(
            "reviews",
            "Admission reviews answered, by endpoint, operation and result (allowed, patched, denied, error)",
            reviews.clone(),
        );
        registry.register(
            "profile_reviews",
            "Admission reviews answered, by endpoint and the policy profile applied (base: none)",
            profile_reviews.clone(),
        );
        registry.register(
            "review_duration_seconds",
            "Time to answer a review, from the request's arrival to the response",
            duration.clone(),
        );
        registry.register(
            "mutation_steps",
            "Mutation steps that changed a pod, by step",
            steps.clone(),
        );
        registry.register("denials", "Reviews denied, by reason", denials.clone());
        registry.register(
            "opt_outs",
            "Opt-out annotations honoured or refused",
            opt_outs.clone(),
        );
        registry.register(
            "policy_reloads",
            "Policy reloads, by result (success, failure)",
            policy_reloads.clone(),
        );
        registry.register(
            "policy_file_rejected",
            "1 while the policy file on disk is rejected or unreadable and the previous policy stays in force",
            policy_rejected.clone(),
        );
        registry.register(
            "certificate_reloads",
            "Serving certificate reloads, by result (success, failure)",
            cert_reloads.clone(),
        );
        registry.register(
            "policy_info",
            "The policy in force: 1 for the SHA-256 of its file",
            policy_info.clone(),
        );
        registry.register(
            "policy_objects",
            "The TollgatePolicy and TollgateProfiles, by kind and state (in_force: this generation's spec; last_good: the last good spec, over one that does not load; invalid: none)",
            policy_objects.clone(),
        );
        registry.register(
            "policy_object_rejections",
            "TollgatePolicies and TollgateProfiles found not to load, by kind and reason (each generation counted once)",
            policy_object_rejections.clone(),
        );
        registry.register(
            "policy_objects_served",
            "1 while the cluster serves the kind (its CRD is installed), 0 while it does not; with the cluster context only",
            policy_objects_served.clone(),
        );
        registry.register(
            "policy_status_writes",
            "Writes of the TollgatePolicy's and TollgateProfiles' status by the holder of the Lease tollgate-policy-status, by result (success, failure)",
            policy_status_writes.clone(),
        );
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "Expiry of the serving certificate in use, seconds since the Unix epoch",
            cert_expiry.clone(),
        );
        registry.register(
            "requests_in_flight",
            "HTTP requests being answered",
            in_flight.clone(),
        );
        registry.register(
            "log_lines_dropped",
            "Log lines dropped because standard error could not keep up with them",
            log_lines_dropped.clone(),
        );
        registry.register(
            "cluster_cache_synced",
            "1 once the cluster context's cache of the resource has been listed completely",
            cluster_synced.clone(),
        );
        registry.register(
            "cluster_cache_age_seconds",
            "How far behind the cluster the cache may be: 0 while its watch is current, else seconds since it failed",
            cluster_age.clone(),
        );
        registry.register(
            "cluster_cache_objects",
            "Objects in the cluster context's cache",
            cluster_objects.clone(),
        );
        registry.register(
            "cluster_cache_last_sync_timestamp_seconds",
            "When the cache was last listed completely, seconds since the Unix epoch",
            cluster_last_sync.clone(),
        );
        registry.register(
            "cluster_watch_restarts",
            "Failures of the cluster context's watches, each retried with backoff",
            cluster_restarts.clone(),
        );
        registry.register(
            "cluster_fetches",
            "GETs of objects the cache did not hold, by result (found, absent, failed)",
            cluster_fetches.clone(),
        );
        let audit = AuditMetrics::default();
        registry.register(
            "audit_findings",
            "Findings of the last background audit, by namespace and rule",
            audit.findings.clone(),
        );
        registry.register(
            "audit_leader",
            "1 while this replica holds the audit Lease and runs the background audit",
            audit.leader.clone(),
        );
        registry.register(
            "audit_runs",
            "Background audit runs, by result (success, failure)",
            audit.runs.clone(),
        );
        registry.register(
            "audit_last_run_timestamp_seconds",
            "When the last complete background audit run ended, seconds since the Unix epoch",
            audit.last_run.clone(),
        );
        registry.register(
            "audit_last_run_duration_seconds",
            "How long the last complete background audit run took",
            audit.last_duration.clone(),
        );
        registry.register(
            "audit_last_run_objects",
            "Objects judged by the last complete background audit run",
            audit.last_objects.clone(),
        );
        registry.register(
            "audit_objects",
            "Objects judged by the background audit",
            audit.objects.clone(),
        );
        registry.register(
            "audit_errors",
            "Lists and report writes of the background audit that failed",
            audit.errors.clone(),
        );
        registry.register(
            "audit_busy_seconds",
            "Time the background audit spent judging objects (its CPU-bound work)",
            audit.busy.clone(),
        );
        registry.register(
            "audit_reports",
            "PolicyReports written by the background audit, by action (created, updated, deleted)",
            audit.reports.clone(),
        );
        let certs = CertMetrics {
            expiry: cert_expiry.clone(),
            reloads: cert_reloads.clone(),
            ..CertMetrics::default()
        };
        registry.register(
            "certificate_ca_expiry_timestamp_seconds",
            "Expiry of the CA that signed the serving certificate in use (self-managed certificates), seconds since the Unix epoch",
            certs.ca_expiry.clone(),
        );
        registry.register(
            "certificate_renewal_timestamp_seconds",
            "When the self-managed certificates are due for renewal (the serving certificate's or the CA's, whichever first), seconds since the Unix epoch",
            certs.renewal.clone(),
        );
        registry.register(
            "certificate_rotations",
            "Certificates issued by the holder of the certificate Lease, by kind (serving, ca)",
            certs.rotations.clone(),
        );
        registry.register(
            "certificate_ca_bundle_writes",
            "Writes of a webhook configuration's caBundle by the holder of the certificate Lease, by configuration (mutating, validating)",
            certs.ca_bundle_writes.clone(),
        );
        registry.register(
            "certificate_leader",
            "1 while this replica holds the certificate Lease and manages the self-managed certificates",
            certs.leader.clone(),
        );
        registry.register(
            "certificate_secret_age_seconds",
            "How far behind the certificate's Secret this replica may be: 0 while its watch is current, else seconds since it failed",
            certs.secret_age.clone(),
        );
        registry.register(
            "certificate_errors",
            "Failed reads and writes of the certificate's Secret, Lease and webhook configurations",
            certs.errors.clone(),
        );
        let metrics = Metrics {
            registry,
            reviews,
            profile_reviews,
            duration,
            steps,
            denials,
            opt_outs,
            policy_reloads,
            policy_rejected,
            cert_reloads,
            policy_info,
            policy_objects,
            policy_object_rejections,
            policy_objects_served,
            policy_status_writes,
            cert_expiry,
            in_flight,
            log_lines_dropped,
            cluster_synced,
            cluster_age,
            cluster_objects,
            cluster_last_sync,
            cluster_restarts,
            cluster_fetches,
            audit,
            certs,
        };
        metrics.initialise_series();
        metrics
    }

    /// Creates at zero the series that alerts and dashboards read. A counter that first
    /// appears already at 1 has no earlier sample, so `increase()` and `rate()` miss that
    /// first event: a single policy reload failure would never fire its alert.
    fn initialise_series(&self) {
        for kind in [POLICY_KIND, PROFILE_KIND] {
            for state in OBJECT_STATES {
                let _ = self
                    .policy_objects
                    .get_or_create(&ObjectStateLabels { kind, state });
            }
            for reason in ["Invalid", "OutOfBounds", "NotDefault"] {
                let _ = self
                    .policy_object_rejections
                    .get_or_create(&RejectionLabels { kind, reason });
            }
        }
        for result in ["success", "failure"] {
            let _ = self
                .policy_status_writes
                .get_or_create(&ResultLabels { result });
            let _ = self.policy_reloads.get_or_create(&ResultLabels { result });
            let _ = self.cert_reloads.get_or_create(&ResultLabels { result });
        }
        for e in Stage::WEBHOOKS {
            // Only the results each endpoint can give: mutation never denies, validation
            // never patches.
            let results = match e {
                Stage::Mutate => [Outcome::Allowed, Outcome::Patched, Outcome::Error],
                Stage::Validate => [Outcome::Allowed, Outcome::Denied, Outcome::Error],
                // No endpoint answers for both: `tollgate review` runs them, never the server.
                Stage::All => continue,
            };
            let endpoint = e.as_str();
            let _ = self.duration.get_or_create(&EndpointLabels { endpoint });
            let _ = self.reviews.get_or_create(&ReviewLabels {
                endpoint,
                operation: "unknown".into(),
                result: Outcome::Error.as_str(),
            });
            for result in results {
                let _ = self.reviews.get_or_create(&ReviewLabels {
                    endpoint,
                    operation: "CREATE".into(),
                    result: result.as_str(),
                });
            }
            for decision in ["honoured", "refused"] {
                let _ = self
                    .opt_outs
                    .get_or_create(&OptOutLabels { endpoint, decision });
            }
        }
        for step in Step::ALL {
            let _ = self.steps.get_or_create(&StepLabels {
                step: step.as_str(),
            });
        }
        for reason in [
            Verdict::MissingRequests,
            Verdict::ForgedApproval,
            Verdict::Infeasible,
        ] {
            let _ = self.denials.get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            });
        }
        for result in ["success", "failure"] {
            let _ = self.audit.runs.get_or_create(&ResultLabels { result });
        }
        for action in ["created", "updated", "deleted"] {
            let _ = self.audit.reports.get_or_create(&ReportLabels { action });
        }
        for kind in ["serving", "ca"] {
            let _ = self.certs.rotations.get_or_create(&IssuedLabels { kind });
        }
        for configuration in ["mutating", "validating"] {
            let _ = self
                .certs
                .ca_bundle_writes
                .get_or_create(&ConfigurationLabels { configuration });
        }
    }

    /// Counts a review the engine answered.
    pub fn observe(&self, r: &Reviewed, seconds: f64) {
        let endpoint = r.endpoint.as_str();
        self.reviews
            .get_or_create(&ReviewLabels {
                endpoint,
                operation: r.operation.clone(),
                result: r.outcome.as_str(),
            })
            .inc();
        self.duration
            .get_or_create(&EndpointLabels { endpoint })
            .observe(seconds);
        self.profile_reviews
            .get_or_create(&ProfileLabels {
                endpoint,
                profile: profile_label(r.profile.as_deref()),
            })
            .inc();
        for s in r.steps() {
            self.steps
                .get_or_create(&StepLabels { step: s.as_str() })
                .inc();
        }
        if r.outcome == Outcome::Denied {
            // Pods and workloads are denied by validation's verdict; a TollgatePolicy or
            // TollgateProfile (the one kind denied without one) by its bounds or its load.
            let reason = r.verdict().map_or(POLICY_OBJECT_DENIED, |v| v.as_str());
            self.denials.get_or_create(&ReasonLabels { reason }).inc();
        }
        let decision = match r.opt_out() {
            Some(OptOut::Honoured) => Some("honoured"),
            Some(OptOut::Refused(_)) => Some("refused"),
            _ => None,
        };
        if let Some(decision) = decision {
            self.opt_outs
                .get_or_create(&OptOutLabels { endpoint, decision })
                .inc();
        }
    }

    /// Counts a body that was not a usable review (answered with a 4xx).
    pub fn observe_rejected(&self, endpoint: &'static str, seconds: f64) {
        self.reviews
            .get_or_create(&ReviewLabels {
                endpoint,
                operation: "unknown".into(),
                result: "error",
            })
            .inc();
        self.duration
            .get_or_create(&EndpointLabels { endpoint })
            .observe(seconds);
    }

    /// Brings the cluster context's series up to date with its caches.
    pub fn observe_cluster(&self, status: &[ResourceStatus]) {
        // A resource the cluster does not serve (no DRA, no Kubeflow Trainer) has no
        // series, and keeps none from before its first list answered 404.
        for gone in crate::cluster::RESOURCES
            .into_iter()
            .filter(|g| !status.iter().any(|r| r.resource == *g))
        {
            let l = ResourceLabels { resource: gone };
            self.cluster_synced.remove(&l);
            self.cluster_age.remove(&l);
            self.cluster_objects.remove(&l);
            self.cluster_last_sync.remove(&l);
            self.cluster_restarts.remove(&l);
            for result in ["found", "absent", "failed"] {
                self.cluster_fetches.remove(&FetchLabels {
                    resource: gone,
                    result,
                });
            }
        }
        for r in status {
            let l = ResourceLabels {
                resource: r.resource,
            };
            self.cluster_synced
                .get_or_create(&l)
                .set(i64::from(r.synced));
            self.cluster_age.get_or_create(&l).set(r.age_seconds);
            self.cluster_objects
                .get_or_create(&l)
                .set(i64::try_from(r.objects).unwrap_or(i64::MAX));
            self.cluster_last_sync.get_or_create(&l).set(r.last_sync);
            catch_up(&self.cluster_restarts.get_or_create(&l), r.restarts);
            for (result, n) in [
                ("found", r.fetched_found),
                ("absent", r.fetched_absent),
                ("failed", r.fetched_failed),
            ] {
                let l = FetchLabels {
                    resource: r.resource,
                    result,
                };
                catch_up(&self.cluster_fetches.get_or_create(&l), n);
            }
        }
    }

    /// The profiles of the policy in force, at zero: the label's values are the file's
    /// profile names and "base", each followed by `+ns` too where a namespace's
    /// TollgateProfile is in force, and nothing of an earlier policy lingers.
    pub fn set_profiles_of(&self, policy: &Policy) {
        let ns = !policy.layers.namespaces.is_empty();
        let names = policy.profiles.iter().map(|p| p.name.as_str());
        self.profile_reviews.clear();
        let names: Vec<String> = std::iter::once(BASE_PROFILE)
            .chain(names)
            .flat_map(|n| {
                let with_ns = ns.then(|| format!("{n}{NAMESPACE_SUFFIX}"));
                std::iter::once(n.to_owned()).chain(with_ns)
            })
            .collect();
        for endpoint in [Stage::Mutate.as_str(), Stage::Validate.as_str()] {
            for profile in &names {
                let _ = self.profile_reviews.get_or_create(&ProfileLabels {
                    endpoint,
                    profile: profile.clone(),
                });
            }
        }
    }

    /// Whether the cluster serves `kind` (a TollgatePolicy's or TollgateProfile's CRD).
    pub fn set_objects_served(&self, kind: &'static str, served: bool) {
        self.policy_objects_served
            .get_or_create(&KindLabels { kind })
            .set(i64::from(served));
    }

    pub fn set_policy_hash(&self, hash: &str) {
        self.policy_info.clear();
        self.policy_info
            .get_or_create(&HashLabels {
                hash: hash.to_owned(),
            })
            .set(1);
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        catch_up(&self.log_lines_dropped, crate::telemetry::dropped_lines());
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// What the `profile` label says of a namespace's TollgateProfile: `+ns` after what the
/// cluster gave the pod (`base+ns`, `gpu+ns`), not the namespace, so that the label has
/// twice the file's profiles at most, however many namespaces have one.
const NAMESPACE_SUFFIX: &str = "+ns";

/// The `profile` label of a review: the engine names a namespace's profile `NS/NAME` over
/// the base and `PROFILE+NS/NAME` over a cluster profile (profile names have neither `/`
/// nor `+`: they are DNS labels).
pub fn profile_label(profile: Option<&str>) -> String {
    match profile {
        None => BASE_PROFILE.to_owned(),
        Some(p) if p.contains('/') => {
            let over = p.split_once('+').map_or(BASE_PROFILE, |(c, _)| c);
            format!("{over}{NAMESPACE_SUFFIX}")
        }
        Some(p) => p.to_owned(),
    }
}

/// Moves a counter up to a total kept elsewhere (counters only go up).
fn catch_up(counter: &Counter, total: u64) {
    let counted = counter.get();
    if total > counted {
        counter.inc_by(total - counted);
    }
}

//! The cluster context of the server: what a review may know of other objects (DRA claims
//! and claim templates, namespaces, Kubeflow Trainer runtimes) and what the cluster offers
//! pods (its nodes by shape, its ResourceQuotas, its DeviceClasses), held in memory so that
//! no review waits on the network.
//!
//! [`ClusterContext`] is what the handlers see: the engine's [`Cluster`] (answers from
//! memory) plus one bounded fetch for objects the memory does not hold yet, such as a
//! claim template applied in the same `kubectl apply` as the Job whose pods use it.
//!
//! It also watches the policy as Kubernetes objects (`objects.rs`: the TollgatePolicy and
//! the TollgateProfiles), which reviews never read: the server composes them into the
//! policy in force.

mod cache;
pub mod dra;
pub mod kueue;
pub mod nodes;
pub mod objects;
pub mod pages;
mod quotas;
mod watch;

pub use quotas::trim as trim_quota;
pub use watch::{Options, Watched};

/// The resources the context watches, one cache each. A cluster may not serve some (DRA's
/// before 1.34 or without DRA, Kubeflow Trainer's runtimes, Kueue's queues): while it does not, they have
/// no metric series and readiness does not wait for them.
pub const RESOURCES: [&str; 14] = [
    "resourceclaims",
    "resourceclaimtemplates",
    "namespaces",
    "nodes",
    "resourcequotas",
    "deviceclasses",
    "trainingruntimes",
    "clustertrainingruntimes",
    "localqueues",
    "clusterqueues",
    tollgate_core::POLICY_PLURAL,
    tollgate_core::PROFILE_PLURAL,
    "configmaps",
    "nodepools",
];

use std::future::Future;
use std::pin::Pin;

use tollgate_core::{Cluster, ObjectKey, Objects, Offline};

/// A future the context returns; boxed so that the trait can be used as `dyn`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The cluster context the server reviews in.
pub trait ClusterContext: Cluster + Send + Sync {
    /// Fetches objects a review found unknown, each at most once and within a bound well
    /// below the webhook's timeout. What is found or known absent comes back; what could
    /// not be fetched in time is left out (the review then warns).
    fn fetch<'a>(&'a self, keys: &'a [ObjectKey]) -> BoxFuture<'a, Objects> {
        let _ = keys;
        Box::pin(async { Objects::default() })
    }

    /// Whether the context has synced once (for `/readyz`).
    fn synced(&self) -> bool {
        true
    }

    /// Each cache's state, for metrics (none without watches).
    fn status(&self) -> Vec<ResourceStatus> {
        vec![]
    }

    /// The watched TollgatePolicy and TollgateProfiles (None without watches): the
    /// server composes them with the file into the policy in force.
    fn policy_objects(&self) -> Option<std::sync::Arc<objects::PolicyObjects>> {
        None
    }
}

/// How one cache of the context is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceStatus {
    /// The plural resource, e.g. `resourceclaims`.
    pub resource: &'static str,
    /// Listed completely at least once.
    pub synced: bool,
    /// `/readyz` need not wait for it: synced, or not needed to be (a resource the
    /// cluster does not serve, or nodes the RBAC forbids reading).
    pub ready: bool,
    /// How far behind the cluster the cache may be: 0 while its watch is current, else the
    /// seconds since it started failing (or since start, before the first sync).
    pub age_seconds: i64,
    /// Unix seconds of the last complete list (0: none yet).
    pub last_sync: i64,
    /// Watch failures, each followed by a retry with backoff.
    pub restarts: u64,
    pub objects: u64,
    /// GETs of objects the cache did not hold: found, absent (404), failed or timed out.
    pub fetched_found: u64,
    pub fetched_absent: u64,
    pub fetched_failed: u64,
}

/// `--cluster-context off`: nothing known, nothing fetched.
impl ClusterContext for Offline {}

/// A fixed set of objects (tests, and the golden cases' `context.yaml`).
impl ClusterContext for Objects {}

//! The cluster context of the server: what a review may know of other objects (DRA claims
//! and claim templates, namespaces), held in memory so that no review waits on the network.
//!
//! [`ClusterContext`] is what the handlers see: the engine's [`Cluster`] (answers from
//! memory) plus one bounded fetch for objects the memory does not hold yet, such as a
//! claim template applied in the same `kubectl apply` as the Job whose pods use it.

use std::future::Future;
use std::pin::Pin;

use tollgate_core::cluster::{Cluster, ObjectKey, Objects, Offline};

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
}

/// `--cluster-context off`: nothing known, nothing fetched.
impl ClusterContext for Offline {}

/// A fixed set of objects (tests, and the golden cases' `context.yaml`).
impl ClusterContext for Objects {}

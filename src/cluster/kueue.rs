//! Kueue's LocalQueues and ClusterQueues (`kueue.x-k8s.io`), for feasibility: a workload
//! labelled `kueue.x-k8s.io/queue-name` is admitted by Kueue only within its LocalQueue's
//! ClusterQueue, so it is held to that quota instead of the namespace's ResourceQuotas
//! (the engine's `feasible::kueue`).
//!
//! Kueue serves `v1beta1`, `v1beta2` and, in its newer releases, `v1`: the queues are
//! watched in the newest the cluster serves ([`KUEUE_API_VERSIONS`], asked of discovery as
//! DRA's versions are, `dra::Discovery`), and kept as JSON without status, which the engine
//! reads in any of them. A cluster without Kueue serves none: nothing is waited for, and
//! its workloads are held to the ResourceQuotas.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use kube::runtime::watcher;
use serde_json::Value;

use super::cache::Sink;
pub use tollgate_core::KUEUE_API_VERSIONS;

/// Queues by namespace ("" for a ClusterQueue) and name.
pub type Queues = HashMap<(String, String), Arc<Value>>;

/// A queue as the cache keeps it: its JSON without status (usage and conditions change all
/// the time; the engine reads the spec). Karpenter's NodePools are kept so too (the watch
/// and the audit's list): the engine reads their spec alone.
pub fn queue(v: &Value) -> Result<Arc<Value>, String> {
    let mut v = v.clone();
    let o = v
        .as_object_mut()
        .ok_or_else(|| "a queue that is not an object".to_owned())?;
    o.remove("status");
    if o.get("metadata").and_then(|m| m.get("name")).is_none() {
        return Err("a queue without a name".into());
    }
    Ok(Arc::new(v))
}

/// One kind of queue's watch, published for reviews as it changes (queues are few: the
/// map is copied whole).
pub struct QueueSink {
    queues: Queues,
    relist: Option<Queues>,
    published: Arc<ArcSwap<Queues>>,
}

impl QueueSink {
    pub fn new(published: Arc<ArcSwap<Queues>>) -> QueueSink {
        QueueSink {
            queues: Queues::new(),
            relist: None,
            published,
        }
    }
}

impl Sink<Arc<Value>> for QueueSink {
    fn event(&mut self, event: watcher::Event<Arc<Value>>) {
        let changed = match event {
            watcher::Event::Init => {
                self.relist = Some(Queues::new());
                false
            }
            watcher::Event::InitApply(q) => {
                self.relist
                    .get_or_insert_with(Queues::new)
                    .insert(tollgate_core::namespace_and_name(&q), q);
                false
            }
            watcher::Event::InitDone => {
                self.queues = self.relist.take().unwrap_or_default();
                true
            }
            watcher::Event::Apply(q) => {
                self.queues.insert(tollgate_core::namespace_and_name(&q), q);
                true
            }
            watcher::Event::Delete(q) => self
                .queues
                .remove(&tollgate_core::namespace_and_name(&q))
                .is_some(),
        };
        if changed {
            self.published.store(Arc::new(self.queues.clone()));
        }
    }

    fn len(&self) -> usize {
        self.queues.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_queue_is_kept_without_status_and_by_namespace_and_name() {
        let published = Arc::new(ArcSwap::from_pointee(Queues::new()));
        let mut sink = QueueSink::new(published.clone());
        let lq = json!({"metadata": {"name": "q", "namespace": "ml"},
            "spec": {"clusterQueue": "cq"}, "status": {"pendingWorkloads": 3}});
        sink.event(watcher::Event::Init);
        sink.event(watcher::Event::InitApply(queue(&lq).unwrap()));
        assert!(
            published.load().is_empty(),
            "published before the list is complete"
        );
        sink.event(watcher::Event::InitDone);
        let got = published.load_full();
        let q = &got[&("ml".to_owned(), "q".to_owned())];
        assert_eq!(q["spec"]["clusterQueue"], "cq");
        assert!(q.get("status").is_none());
        sink.event(watcher::Event::Delete(queue(&lq).unwrap()));
        assert!(published.load().is_empty());
        assert!(queue(&json!({"spec": {}})).is_err());
    }
}

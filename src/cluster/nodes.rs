//! The cluster's nodes, kept by shape: what feasibility compares a pod with.
//!
//! Clusters have thousands of nodes that look alike, and nodes change all the time
//! (their status is rewritten every few seconds: conditions, heartbeats, images), while
//! what feasibility reads of them (allocatable, labels, taints, unschedulable) rarely does.
//! So:
//!
//! - A Node is parsed as a [`NodeView`]: those fields and the resourceVersion the watcher
//!   resumes from; the rest of the object is skipped while parsing, never held.
//! - [`ShapeIndex`] (the engine's `capacity::Index`) keeps each node in its shape, the
//!   labels of a pool once, interned, and each node's own labels (its hostname, and the
//!   keys of a value per node, such as GPU Feature Discovery's timestamp) beside its name:
//!   a few hundred bytes a node. A node whose shape did not change costs one comparison and
//!   changes nothing; one that changed moves between two shapes (a cordon takes it out).
//! - Reviews read an `Arc<capacity::Nodes>` snapshot, swapped whole ([`NodeSink`]).
//!   Rebuilding it is copy-on-write per shape: the shapes no node entered or left keep
//!   their `Arc<Shape>`, so a rebuild costs the number of shapes plus the hosts of the
//!   shapes that changed. Changes are published at most every [`PUBLISH_EVERY`]: a burst
//!   (a pool cordoned for an upgrade, a relabelled rack) costs one rebuild, not one per
//!   node.
//! - The nodes are listed item by item as each page arrives (`pages::watch`), never a
//!   page whole: as the apiserver sends them a node is 25 KB of JSON, and a page of 500
//!   held (twice, as kube's client reads it) would be 25 MB for a moment.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;
use kube::Resource;
use serde::{Deserialize, Deserializer};
use tokio::time::Instant;

use super::cache::Sink;
use tollgate_core::Nodes;

/// The most often the snapshot reviews read is rebuilt: a change is seen by reviews within
/// this, and a burst of changes costs one rebuild.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(200);

/// A Node as the cache reads it: only what a node's shape is made of, and the
/// resourceVersion the watcher resumes from.
#[derive(Clone, Debug, Default)]
pub struct NodeView(pub Node);

impl Resource for NodeView {
    type DynamicType = ();
    type Scope = kube::core::ClusterResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "Node".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "nodes".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

impl<'de> Deserialize<'de> for NodeView {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Raw {
            #[serde(default)]
            metadata: Meta,
            #[serde(default)]
            spec: Option<Spec>,
            #[serde(default)]
            status: Option<Status>,
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct Meta {
            name: Option<String>,
            resource_version: Option<String>,
            labels: Option<BTreeMap<String, String>>,
        }
        #[derive(Deserialize)]
        struct Spec {
            unschedulable: Option<bool>,
            taints: Option<Vec<Taint>>,
        }
        #[derive(Deserialize)]
        struct Status {
            allocatable: Option<BTreeMap<String, Quantity>>,
        }
        let raw = Raw::deserialize(d)?;
        Ok(NodeView(Node {
            metadata: ObjectMeta {
                name: raw.metadata.name,
                resource_version: raw.metadata.resource_version,
                labels: raw.metadata.labels,
                ..ObjectMeta::default()
            },
            spec: raw.spec.map(|s| NodeSpec {
                unschedulable: s.unschedulable,
                taints: s.taints,
                ..NodeSpec::default()
            }),
            status: raw.status.map(|s| NodeStatus {
                allocatable: s.allocatable,
                ..NodeStatus::default()
            }),
        }))
    }
}

/// The nodes by shape, kept one node at a time: the engine's index (interned labels, a
/// pool's nodes one shape, copy-on-write snapshots).
pub use tollgate_core::NodeIndex as ShapeIndex;

/// The nodes' watch into a [`ShapeIndex`], published to `published` for reviews.
pub struct NodeSink {
    index: ShapeIndex,
    /// What a relist has brought so far; it replaces `index` once complete.
    relist: Option<ShapeIndex>,
    published: Arc<ArcSwap<Nodes>>,
    /// A change not published yet.
    pending: bool,
    last_publish: Instant,
}

impl NodeSink {
    pub fn new(published: Arc<ArcSwap<Nodes>>) -> NodeSink {
        NodeSink {
            index: ShapeIndex::default(),
            relist: None,
            published,
            pending: false,
            last_publish: Instant::now(),
        }
    }
}

impl Sink<NodeView> for NodeSink {
    fn event(&mut self, event: watcher::Event<NodeView>) {
        let changed = match event {
            watcher::Event::Init => {
                self.relist = Some(ShapeIndex::default());
                false
            }
            watcher::Event::InitApply(n) => {
                self.relist
                    .get_or_insert_with(ShapeIndex::default)
                    .apply(&n.0);
                false
            }
            watcher::Event::InitDone => {
                if let Some(listed) = self.relist.take() {
                    self.index = listed;
                }
                // A complete list is seen at once: readiness follows it.
                self.publish();
                false
            }
            watcher::Event::Apply(n) => self.index.apply(&n.0),
            watcher::Event::Delete(n) => self
                .index
                .delete(n.0.metadata.name.as_deref().unwrap_or("")),
        };
        self.pending |= changed;
    }

    fn len(&self) -> usize {
        self.index.len()
    }

    fn due(&self) -> Option<Instant> {
        self.pending.then(|| self.last_publish + PUBLISH_EVERY)
    }

    fn publish(&mut self) {
        self.published.store(Arc::new(self.index.snapshot()));
        self.pending = false;
        self.last_publish = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn node(name: &str, pool: &str, gpus: &str) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": "7", "uid": "u",
                "labels": {"kubernetes.io/hostname": name, "pool": pool},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                "managedFields": [{"manager": "kubelet"}]},
            "spec": {"podCIDR": "10.0.0.0/24", "providerID": "x",
                "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {"cpu": "94", "memory": "1000Gi", "nvidia.com/gpu": gpus, "pods": "110"},
                "capacity": {"cpu": "96"},
                "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}],
                "images": [{"names": ["registry.example.com/a:1"], "sizeBytes": 1}],
                "nodeInfo": {"kubeletVersion": "v1.36.0"}
            }
        })
    }

    fn view(v: Value) -> Node {
        serde_json::from_value::<NodeView>(v).unwrap().0
    }

    #[test]
    fn a_view_keeps_what_a_shape_is_made_of_and_nothing_else() {
        let full: Node = serde_json::from_value(node("gpu-1", "a100", "8")).unwrap();
        let v = view(node("gpu-1", "a100", "8"));
        assert_eq!(Nodes::of([&v]), Nodes::of([&full]));
        assert_eq!(v.metadata.resource_version.as_deref(), Some("7"));
        assert!(v.metadata.annotations.is_none() && v.metadata.managed_fields.is_none());
        let status = v.status.unwrap();
        assert!(status.conditions.is_none() && status.images.is_none());
        assert!(v.spec.unwrap().pod_cidr.is_none());
    }

    /// The sink builds a relist beside what it serves, swaps at its end, and publishes
    /// what changed at most every `PUBLISH_EVERY`.
    #[test]
    fn the_sink_swaps_a_complete_list_and_holds_back_changes() {
        let published = Arc::new(ArcSwap::from_pointee(Nodes::default()));
        let mut sink = NodeSink::new(published.clone());
        let apply = |v: Value| NodeView(view(v));
        sink.event(watcher::Event::Init);
        sink.event(watcher::Event::InitApply(apply(node("a", "a100", "8"))));
        sink.event(watcher::Event::InitApply(apply(node("b", "l4", "4"))));
        assert_eq!(
            published.load().count(),
            0,
            "nothing before the list is complete"
        );
        sink.event(watcher::Event::InitDone);
        assert_eq!(published.load().count(), 2);
        sink.event(watcher::Event::Apply(apply(node("c", "l4", "4"))));
        assert_eq!(published.load().count(), 2, "held back");
        assert!(sink.due().is_some());
        sink.publish();
        assert_eq!(published.load().count(), 3);
        assert_eq!(published.load().shapes.len(), 2);
        // A heartbeat changes nothing to publish.
        sink.event(watcher::Event::Apply(apply(node("c", "l4", "4"))));
        assert!(sink.due().is_none());
        sink.event(watcher::Event::Delete(apply(node("a", "a100", "8"))));
        sink.publish();
        assert_eq!(published.load().shapes.len(), 1);
        assert_eq!(sink.len(), 2);
    }
}

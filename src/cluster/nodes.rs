//! The cluster's nodes, kept by shape: what feasibility compares a pod with.
//!
//! Clusters have thousands of nodes that look alike, and nodes change all the time
//! (their status is rewritten every few seconds: conditions, heartbeats, images), while
//! what feasibility reads of them (`shape_of`: allocatable, labels, taints,
//! unschedulable) rarely does. So:
//!
//! - A Node is parsed as a [`NodeView`]: those fields and the resourceVersion the watcher
//!   resumes from; the rest of the object is skipped while parsing, never held.
//! - [`ShapeIndex`] keeps each node's shape (shared by the nodes of one shape) and each
//!   shape's hosts. A node whose shape did not change costs one comparison and changes
//!   nothing; one that changed moves between two shapes (a cordon takes it out).
//! - Reviews read an `Arc<Nodes>` snapshot, swapped whole ([`NodeSink`]).
//!   Rebuilding it is copy-on-write per shape: the shapes no node entered or left keep
//!   their `Arc<Shape>`, so a rebuild costs the number of shapes plus the hosts of the
//!   shapes that changed. Changes are published at most every [`PUBLISH_EVERY`]: a burst
//!   (a pool cordoned for an upgrade, a relabelled rack) costs one rebuild, not one per
//!   node.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
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
use tollgate_core::{shape_of, Host, Nodes, Shape, ShapeKey};

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

/// The nodes of one shape, and the snapshot of them reviews read (None: to be rebuilt).
#[derive(Default)]
struct Slot {
    /// Node name to its hostname label.
    hosts: BTreeMap<String, Option<String>>,
    published: Option<Arc<Shape>>,
}

/// The nodes by shape, kept up to date one node at a time.
#[derive(Default)]
pub struct ShapeIndex {
    /// Each node's shape (None: cordoned), shared with the nodes of that shape.
    nodes: HashMap<String, Option<Arc<ShapeKey>>>,
    shapes: BTreeMap<Arc<ShapeKey>, Slot>,
    cordoned: usize,
}

impl ShapeIndex {
    /// Takes in a node added or changed; whether the snapshot changes.
    pub fn apply(&mut self, node: &Node) -> bool {
        let name = node.metadata.name.as_deref().unwrap_or("");
        let new = shape_of(node);
        match (self.nodes.get(name), &new) {
            // Still cordoned.
            (Some(None), None) => return false,
            // Of the same shape: only its hostname label may have changed.
            (Some(Some(old)), Some((key, host))) if **old == *key => {
                let old = old.clone();
                let Some(slot) = self.shapes.get_mut(&old) else {
                    return false;
                };
                if slot.hosts.get(name) == Some(&host.hostname) {
                    return false;
                }
                slot.hosts.insert(name.to_owned(), host.hostname.clone());
                slot.published = None;
                return true;
            }
            _ => {}
        }
        self.remove(name);
        match new {
            None => {
                self.cordoned += 1;
                self.nodes.insert(name.to_owned(), None);
            }
            Some((key, host)) => {
                let key = match self.shapes.get_key_value(&key) {
                    Some((k, _)) => k.clone(),
                    None => Arc::new(key),
                };
                let slot = self.shapes.entry(key.clone()).or_default();
                slot.hosts.insert(host.name, host.hostname);
                slot.published = None;
                self.nodes.insert(name.to_owned(), Some(key));
            }
        }
        true
    }

    /// Takes out a deleted node; whether the snapshot changes.
    pub fn delete(&mut self, name: &str) -> bool {
        self.remove(name)
    }

    fn remove(&mut self, name: &str) -> bool {
        match self.nodes.remove(name) {
            None => false,
            Some(None) => {
                self.cordoned -= 1;
                true
            }
            Some(Some(key)) => {
                if let Some(slot) = self.shapes.get_mut(&key) {
                    slot.hosts.remove(name);
                    slot.published = None;
                    if slot.hosts.is_empty() {
                        self.shapes.remove(&key);
                    }
                }
                true
            }
        }
    }

    /// Every node, cordoned or not.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// What reviews read: the shapes in order, each rebuilt only if a node entered or left
    /// it since the last snapshot.
    pub fn snapshot(&mut self) -> Nodes {
        Nodes {
            shapes: self
                .shapes
                .iter_mut()
                .map(|(key, slot)| {
                    slot.published
                        .get_or_insert_with(|| {
                            Arc::new(Shape {
                                key: (**key).clone(),
                                hosts: slot
                                    .hosts
                                    .iter()
                                    .map(|(name, hostname)| Host {
                                        name: name.clone(),
                                        hostname: hostname.clone(),
                                    })
                                    .collect(),
                            })
                        })
                        .clone()
                })
                .collect(),
            cordoned: self.cordoned,
        }
    }
}

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
        assert_eq!(shape_of(&v), shape_of(&full));
        assert_eq!(v.metadata.resource_version.as_deref(), Some("7"));
        assert!(v.metadata.annotations.is_none() && v.metadata.managed_fields.is_none());
        let status = v.status.unwrap();
        assert!(status.conditions.is_none() && status.images.is_none());
        assert!(v.spec.unwrap().pod_cidr.is_none());
    }

    /// The index, changed one node at a time, always equals `Nodes::of` the nodes as they
    /// are; a node whose shape did not change changes nothing; shapes nobody entered or
    /// left keep their snapshot.
    #[test]
    fn the_index_follows_the_nodes_one_change_at_a_time() {
        let mut index = ShapeIndex::default();
        let mut now: BTreeMap<String, Node> = BTreeMap::new();
        let check = |index: &mut ShapeIndex, now: &BTreeMap<String, Node>| {
            assert_eq!(index.snapshot(), Nodes::of(now.values()));
            assert_eq!(index.len(), now.len());
        };
        for i in 0..40 {
            let pool = ["a100", "l4", "cpu"][i % 3];
            let n = view(node(
                &format!("n-{i:02}"),
                pool,
                if pool == "a100" { "8" } else { "4" },
            ));
            assert!(index.apply(&n));
            now.insert(format!("n-{i:02}"), n);
        }
        check(&mut index, &now);
        assert_eq!(index.snapshot().shapes.len(), 3);

        // A heartbeat: the same shape, nothing to do.
        let before = index.snapshot();
        let mut beat = node("n-00", "a100", "8");
        beat["status"]["conditions"][0]["lastHeartbeatTime"] = json!("2026-01-01T00:00:10Z");
        assert!(!index.apply(&view(beat)));
        let after = index.snapshot();
        assert!(before
            .shapes
            .iter()
            .zip(&after.shapes)
            .all(|(a, b)| Arc::ptr_eq(a, b)));

        // Relabelled: it moves to a shape of its own; the l4 shape keeps its snapshot.
        let mut relabelled = node("n-00", "a100", "8");
        relabelled["metadata"]["labels"]["nvidia.com/gpu.product"] = json!("H100");
        let n = view(relabelled);
        assert!(index.apply(&n));
        now.insert("n-00".into(), n);
        let moved = index.snapshot();
        check(&mut index, &now);
        assert_eq!(moved.shapes.len(), 4);
        let l4 = |n: &Nodes| {
            n.shapes
                .iter()
                .find(|s| s.key.labels["pool"] == "l4")
                .unwrap()
                .clone()
        };
        assert!(Arc::ptr_eq(&l4(&after), &l4(&moved)));

        // Cordoned, then deleted; a shape left empty goes.
        let mut cordoned = node("n-00", "a100", "8");
        cordoned["spec"]["unschedulable"] = json!(true);
        let n = view(cordoned);
        assert!(index.apply(&n));
        assert!(!index.apply(&n));
        now.insert("n-00".into(), n);
        check(&mut index, &now);
        assert_eq!(index.snapshot().cordoned, 1);
        assert_eq!(index.snapshot().shapes.len(), 3);
        assert!(index.delete("n-00"));
        assert!(!index.delete("n-00"));
        now.remove("n-00");
        check(&mut index, &now);

        // A new hostname label on a node of the same shape.
        let mut renamed = node("n-01", "l4", "4");
        renamed["metadata"]["labels"]["kubernetes.io/hostname"] = json!("host-01");
        let n = view(renamed);
        assert!(index.apply(&n));
        now.insert("n-01".into(), n);
        check(&mut index, &now);
        // An allocatable change (a device plugin restarting) moves it too.
        let n = view(node("n-03", "a100", "0"));
        assert!(index.apply(&n));
        now.insert("n-03".into(), n);
        check(&mut index, &now);
    }
}

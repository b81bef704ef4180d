//! What the cluster's nodes offer a pod, kept by shape.
//!
//! Clusters have thousands of nodes that look alike: a pool of GPU nodes of one product,
//! labels and taints. A review compares a pod with each *shape* (allocatable, the labels
//! selectors may read, the taints a pod must tolerate) once, not with each node, so its
//! cost does not grow with the node count. A node's name and `kubernetes.io/hostname` (the
//! labels that differ on every node) are kept beside the shape, for the selectors that name
//! nodes.
//!
//! Kept as feasibility needs it: cordoned nodes (`spec.unschedulable`) run no new pod and
//! are left out; `PreferNoSchedule` taints rule nothing out; the node lifecycle's own taints
//! (`node.kubernetes.io/not-ready`, `unreachable`, `memory-pressure`, ...,
//! `node.cloudprovider.kubernetes.io/uninitialized`) are passing states, not a node's
//! purpose, and rule nothing out either.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use crate::quantity;

/// The label that names a node, which every node has its own value of.
pub(crate) const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Taint keys under these prefixes are the node lifecycle's: they come and go.
const LIFECYCLE_TAINTS: [&str; 2] = ["node.kubernetes.io/", "node.cloudprovider.kubernetes.io/"];

/// A taint a pod must tolerate to be scheduled on a node (`NoSchedule` or `NoExecute`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: String,
}

impl std::fmt::Display for Taint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{}", self.key, self.effect)
        } else {
            write!(f, "{}={}:{}", self.key, self.value, self.effect)
        }
    }
}

/// What a node offers a pod, its identity aside: equal for the nodes of one pool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShapeKey {
    /// Allocatable quantities in nano-units (`quantity::parse`); unreadable ones left out.
    pub allocatable: BTreeMap<String, i128>,
    /// Labels, but the hostname's.
    pub labels: BTreeMap<String, String>,
    /// The taints that keep pods off, sorted.
    pub taints: Vec<Taint>,
}

/// A node's name and hostname label.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Host {
    pub name: String,
    pub hostname: Option<String>,
}

/// The nodes of one shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub key: ShapeKey,
    pub hosts: Vec<Host>,
}

/// The schedulable nodes, by shape: what a review compares pods with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nodes {
    pub shapes: Vec<Arc<Shape>>,
    /// Cordoned nodes, left out of the shapes.
    pub cordoned: usize,
}

impl Nodes {
    /// The nodes, grouped by shape (in the order of their shapes).
    pub fn of<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Nodes {
        let mut shapes: BTreeMap<ShapeKey, Vec<Host>> = BTreeMap::new();
        let mut cordoned = 0;
        for n in nodes {
            match shape_of(n) {
                Some((key, host)) => shapes.entry(key).or_default().push(host),
                None => cordoned += 1,
            }
        }
        Nodes {
            shapes: shapes
                .into_iter()
                .map(|(key, mut hosts)| {
                    hosts.sort();
                    Arc::new(Shape { key, hosts })
                })
                .collect(),
            cordoned,
        }
    }

    /// How many schedulable nodes there are.
    pub fn count(&self) -> usize {
        self.shapes.iter().map(|s| s.hosts.len()).sum()
    }
}

/// A node's shape and identity; None for a cordoned node.
pub fn shape_of(node: &Node) -> Option<(ShapeKey, Host)> {
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return None;
    }
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|(k, q)| Some((k.clone(), quantity::parse(&q.0).ok()?)))
        .collect();
    let mut labels = node.metadata.labels.clone().unwrap_or_default();
    let hostname = labels.remove(HOSTNAME_LABEL);
    let mut taints: Vec<Taint> = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
        .filter(|t| !LIFECYCLE_TAINTS.iter().any(|p| t.key.starts_with(p)))
        .map(|t| Taint {
            key: t.key.clone(),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.clone(),
        })
        .collect();
    taints.sort();
    taints.dedup();
    let host = Host {
        name: node.metadata.name.clone().unwrap_or_default(),
        hostname,
    };
    Some((
        ShapeKey {
            allocatable,
            labels,
            taints,
        },
        host,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, gpus: &str, extra: serde_json::Value) -> Node {
        let mut v = json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "pool": "a100"}},
            "spec": {"taints": [
                {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
                {"key": "spot", "effect": "PreferNoSchedule"}
            ]},
            "status": {"allocatable": {"cpu": "95", "memory": "1Ti", "nvidia.com/gpu": gpus, "pods": "110"}}
        });
        json_merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn json_merge(v: &mut serde_json::Value, extra: serde_json::Value) {
        if let (Some(m), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
            for (k, x) in e {
                match m.get_mut(&k) {
                    Some(slot @ serde_json::Value::Object(_)) if x.is_object() => {
                        json_merge(slot, x)
                    }
                    _ => {
                        m.insert(k, x);
                    }
                }
            }
        }
    }

    #[test]
    fn alike_nodes_are_one_shape_and_cordoned_ones_none() {
        let nodes = [
            node("gpu-1", "8", json!({})),
            node("gpu-2", "8", json!({})),
            node("gpu-3", "4", json!({})),
            node("gpu-4", "8", json!({"spec": {"unschedulable": true}})),
        ];
        let n = Nodes::of(&nodes);
        assert_eq!(n.shapes.len(), 2);
        assert_eq!(n.count(), 3);
        assert_eq!(n.cordoned, 1);
        let eight = n
            .shapes
            .iter()
            .find(|s| s.key.allocatable["nvidia.com/gpu"] == 8_000_000_000)
            .unwrap();
        assert_eq!(eight.hosts.len(), 2);
        assert_eq!(eight.hosts[0].hostname.as_deref(), Some("gpu-1"));
        assert!(!eight.key.labels.contains_key(HOSTNAME_LABEL));
        // The GPU taint keeps pods off; the lifecycle's and PreferNoSchedule do not.
        assert_eq!(
            eight.key.taints,
            [Taint {
                key: "nvidia.com/gpu".into(),
                value: String::new(),
                effect: "NoSchedule".into()
            }]
        );
    }
}

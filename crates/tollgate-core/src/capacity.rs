//! What the cluster's nodes offer a pod, kept by shape.
//!
//! Clusters have thousands of nodes that look alike: a pool of GPU nodes of one product,
//! labels and taints. A review compares a pod with each *shape* (allocatable, the labels
//! selectors may read, the taints a pod must tolerate) once, not with each node, so its
//! cost does not grow with the node count.
//!
//! Some labels differ on every node of a pool: `kubernetes.io/hostname`, and others that
//! agents set per node, such as GPU Feature Discovery's `nvidia.com/gfd.timestamp` (the
//! GPU Operator's default) or an instance id. Grouping by them would make every node a
//! shape of its own (thousands of copies of the same sixty labels, and a review that walks
//! them all). So a node's labels are split in two: those of its shape ([`ShapeKey`]'s),
//! and its own ([`Host`]'s), the labels of the *host keys* ([`Nodes::host_keys`]): the
//! hostname, and every key with more than [`HOST_KEY_VALUES`] values among the nodes. Every
//! label stays readable (a selector or an affinity may name any: [`Shape::label`]); a pod
//! whose selection reads a host key is judged host by host, any other once per shape.
//!
//! Memory is what the nodes share, once: label keys and the values shapes hold are
//! interned ([`Sym`]: one allocation each, however many nodes carry them), a shape's labels
//! are one shared slice, and a node costs its name, its own labels and its place among its
//! shape's hosts, a few hundred bytes whatever it is labelled with ([`Index`], which keeps
//! the summaries up to date one node at a time).
//!
//! Kept as feasibility needs it: cordoned nodes (`spec.unschedulable`) run no new pod and
//! are left out; `PreferNoSchedule` taints rule nothing out; the node lifecycle's own taints
//! (`node.kubernetes.io/not-ready`, `unreachable`, `memory-pressure`, ...,
//! `node.cloudprovider.kubernetes.io/uninitialized`) are passing states, not a node's
//! purpose, and rule nothing out either.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use crate::quantity;

/// The label that names a node, which every node has its own value of.
pub(crate) const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// A label key with more distinct values than this among the schedulable nodes is a host
/// key: kept per node, not in shapes. Zones, instance types, GPU products and driver
/// versions have a handful each; a per-node timestamp or id has one per node. Below it, the
/// shapes stay few however a pool is labelled; above it, a key no longer splits shapes.
pub(crate) const HOST_KEY_VALUES: usize = 64;

/// Taint keys under these prefixes are the node lifecycle's: they come and go.
const LIFECYCLE_TAINTS: [&str; 2] = ["node.kubernetes.io/", "node.cloudprovider.kubernetes.io/"];

/// A string shared by whatever holds it: label keys and the values shapes hold are
/// interned by [`Index`], one allocation each for every node and shape that carries them.
pub(crate) type Sym = Arc<str>;

/// Labels: `(key, value)` pairs sorted by key, in one shared allocation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Labels(Arc<[(Sym, Sym)]>);

impl Default for Labels {
    fn default() -> Labels {
        Labels(Arc::new([]))
    }
}

impl Labels {
    /// From pairs sorted by key, each key once.
    fn sorted(pairs: Vec<(Sym, Sym)>) -> Labels {
        Labels(pairs.into())
    }

    /// The value of label `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The labels in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

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
    /// Labels, but those of the host keys ([`Nodes::host_keys`]), which each host keeps.
    pub labels: Labels,
    /// The taints that keep pods off, sorted.
    pub taints: Vec<Taint>,
}

/// A node of a shape: its name and its labels of the host keys (its hostname's among
/// them).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Host {
    pub name: Sym,
    pub labels: Labels,
}

/// The nodes of one shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub key: ShapeKey,
    pub hosts: Vec<Host>,
}

impl Shape {
    /// The value of label `key` on `host`, one of this shape's hosts.
    pub fn label<'a>(&'a self, host: &'a Host, key: &str) -> Option<&'a str> {
        host.labels.get(key).or_else(|| self.key.labels.get(key))
    }
}

/// The schedulable nodes, by shape: what a review compares pods with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nodes {
    pub shapes: Vec<Arc<Shape>>,
    /// Cordoned nodes, left out of the shapes.
    pub cordoned: usize,
    /// The label keys each host keeps itself, sorted (besides the hostname, which always
    /// is one): the keys of more than [`HOST_KEY_VALUES`] values among the nodes.
    pub host_keys: Arc<[Sym]>,
}

impl Nodes {
    /// The nodes, grouped by shape (shapes in key order, hosts in name order).
    pub fn of<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Nodes {
        let mut index = Index::default();
        for n in nodes {
            index.apply(n);
        }
        let mut out = index.snapshot();
        drop(index);
        for s in &mut out.shapes {
            Arc::make_mut(s).hosts.sort();
        }
        out
    }

    /// How many schedulable nodes there are.
    pub fn count(&self) -> usize {
        self.shapes.iter().map(|s| s.hosts.len()).sum()
    }

    /// Whether the nodes of one shape may differ in label `key`: a pod whose selection reads
    /// it is judged host by host.
    pub fn is_host_key(&self, key: &str) -> bool {
        key == HOSTNAME_LABEL || self.host_keys.binary_search_by(|k| (**k).cmp(key)).is_ok()
    }
}

/// A node's allocatable quantities and the taints that keep pods off it.
fn offers(node: &Node) -> (BTreeMap<String, i128>, Vec<Taint>) {
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|(k, q)| Some((k.clone(), quantity::parse(&q.0).ok()?)))
        .collect();
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
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
    (allocatable, taints)
}

/// Where a node is in an [`Index`]: its shape's slot and its place among the shape's hosts.
#[derive(Debug, Clone, Copy)]
struct Entry {
    slot: u32,
    at: u32,
}

/// The slot of a cordoned node: in no shape.
const CORDONED: u32 = u32::MAX;

/// The nodes by shape, kept up to date one node at a time (a watch's events), and the
/// [`Nodes`] reviews read ([`Index::snapshot`]).
///
/// A shape is shared with the snapshots taken of it and copied only when a node enters or
/// leaves it after one was taken: a snapshot costs the number of shapes, and a burst of
/// changes (a pool cordoned for an upgrade) one copy of each shape it touched. A label key
/// that comes to have more than [`HOST_KEY_VALUES`] values becomes a host key, and the
/// nodes are regrouped once; a host key stays one until the index is built anew (the
/// watch's next complete list).
#[derive(Debug)]
pub struct Index {
    /// Label keys and the values shapes hold.
    strings: HashSet<Sym>,
    /// `strings` is purged of what nothing holds any more once it grows to this.
    purge_at: usize,
    host_keys: BTreeSet<Sym>,
    /// Of each label key shapes hold: its values, and how many nodes carry each.
    values: HashMap<Sym, HashMap<Sym, u32>>,
    /// Each shape's slot.
    shapes: HashMap<ShapeKey, u32>,
    slots: Vec<Option<Arc<Shape>>>,
    free: Vec<u32>,
    nodes: HashMap<Sym, Entry>,
    cordoned: usize,
}

impl Default for Index {
    fn default() -> Index {
        let hostname: Sym = Arc::from(HOSTNAME_LABEL);
        Index {
            strings: HashSet::from([hostname.clone()]),
            purge_at: 1024,
            host_keys: BTreeSet::from([hostname]),
            values: HashMap::new(),
            shapes: HashMap::new(),
            slots: vec![],
            free: vec![],
            nodes: HashMap::new(),
            cordoned: 0,
        }
    }
}

impl Index {
    /// Takes in a node added or changed; whether what reviews read changes.
    pub fn apply(&mut self, node: &Node) -> bool {
        let name = node.metadata.name.as_deref().unwrap_or("");
        let cordoned = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        let known = self.nodes.get_key_value(name).map(|(k, e)| (k.clone(), *e));
        if cordoned {
            if known.is_some_and(|(_, e)| e.slot == CORDONED) {
                return false;
            }
            let name = self.remove(name).unwrap_or_else(|| Sym::from(name));
            self.nodes.insert(
                name,
                Entry {
                    slot: CORDONED,
                    at: 0,
                },
            );
            self.cordoned += 1;
            return true;
        }
        let name = known
            .as_ref()
            .map_or_else(|| Sym::from(name), |(k, _)| k.clone());
        let (allocatable, taints) = offers(node);
        let labels = node.metadata.labels.iter().flatten();
        let (shared, own) = self.split(&name, labels.map(|(k, v)| (k.as_str(), v.as_str())));
        let key = ShapeKey {
            allocatable,
            labels: shared,
            taints,
        };
        if let Some((_, e)) = known {
            if let Some(shape) = self.slots.get(e.slot as usize).and_then(Option::as_ref) {
                let host = shape.hosts.get(e.at as usize);
                if shape.key == key && host.is_some_and(|h| h.labels == own) {
                    return false;
                }
            }
        }
        self.remove(&name);
        self.insert(name, key, own);
        self.split_keys_of_many_values();
        self.purge_if_grown();
        true
    }

    /// Takes out a deleted node; whether what reviews read changes.
    pub fn delete(&mut self, name: &str) -> bool {
        self.remove(name).is_some()
    }

    /// Every node, cordoned or not.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// What reviews read: the shapes in key order (shared with the index until a node
    /// enters or leaves them).
    pub fn snapshot(&mut self) -> Nodes {
        let mut shapes: Vec<Arc<Shape>> = self
            .slots
            .iter_mut()
            .flatten()
            .map(|s| {
                // Built one push at a time, a shape's hosts may hold twice the room they
                // need; a snapshot keeps them, so they are trimmed first.
                if s.hosts.capacity() > s.hosts.len() + s.hosts.len() / 8 + 4 {
                    Arc::make_mut(s).hosts.shrink_to_fit();
                }
                s.clone()
            })
            .collect();
        shapes.sort_by(|a, b| a.key.cmp(&b.key));
        Nodes {
            shapes,
            cordoned: self.cordoned,
            host_keys: self
                .host_keys
                .iter()
                .filter(|k| &***k != HOSTNAME_LABEL)
                .cloned()
                .collect(),
        }
    }

    /// `s`, interned.
    fn intern(&mut self, s: &str) -> Sym {
        match self.strings.get(s) {
            Some(sym) => sym.clone(),
            None => {
                let sym: Sym = Arc::from(s);
                self.strings.insert(sym.clone());
                sym
            }
        }
    }

    /// A node's labels (in key order) split into its shape's (interned) and its own, the
    /// host keys'. A hostname equal to the node's name shares its allocation; other values
    /// of host keys are the node's alone, so they are not interned.
    fn split<'a>(
        &mut self,
        name: &Sym,
        labels: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> (Labels, Labels) {
        let (mut shared, mut own) = (vec![], vec![]);
        for (k, v) in labels {
            let key = self.intern(k);
            if self.host_keys.contains(k) {
                let value = if v == &**name {
                    name.clone()
                } else {
                    Sym::from(v)
                };
                own.push((key, value));
            } else {
                shared.push((key, self.intern(v)));
            }
        }
        (Labels::sorted(shared), Labels::sorted(own))
    }

    /// Adds a node not in the index.
    fn insert(&mut self, name: Sym, key: ShapeKey, own: Labels) {
        for (k, v) in key.labels.0.iter() {
            *self
                .values
                .entry(k.clone())
                .or_default()
                .entry(v.clone())
                .or_default() += 1;
        }
        let slot = match self.shapes.get(&key) {
            Some(&slot) => slot,
            None => {
                let shape = Some(Arc::new(Shape {
                    key: key.clone(),
                    hosts: vec![],
                }));
                let slot = match self.free.pop() {
                    Some(slot) => {
                        self.slots[slot as usize] = shape;
                        slot
                    }
                    None => {
                        self.slots.push(shape);
                        (self.slots.len() - 1) as u32
                    }
                };
                self.shapes.insert(key, slot);
                slot
            }
        };
        let Some(shape) = self.slots[slot as usize].as_mut() else {
            return;
        };
        let hosts = &mut Arc::make_mut(shape).hosts;
        let at = hosts.len() as u32;
        hosts.push(Host {
            name: name.clone(),
            labels: own,
        });
        self.nodes.insert(name, Entry { slot, at });
    }

    /// Takes a node out; its name, if it was in.
    fn remove(&mut self, name: &str) -> Option<Sym> {
        let (name, e) = self.nodes.remove_entry(name)?;
        if e.slot == CORDONED {
            self.cordoned -= 1;
            return Some(name);
        }
        let Some(shape) = self.slots.get_mut(e.slot as usize).and_then(Option::as_mut) else {
            return Some(name);
        };
        let shape = Arc::make_mut(shape);
        let at = e.at as usize;
        if at < shape.hosts.len() {
            shape.hosts.swap_remove(at);
            if let Some(moved) = shape.hosts.get(at) {
                if let Some(m) = self.nodes.get_mut(&moved.name) {
                    m.at = e.at;
                }
            }
        }
        for (k, v) in shape.key.labels.0.iter() {
            if let Some(values) = self.values.get_mut(k) {
                if let Some(n) = values.get_mut(v) {
                    *n -= 1;
                    if *n == 0 {
                        values.remove(v);
                    }
                }
                if values.is_empty() {
                    self.values.remove(k);
                }
            }
        }
        if shape.hosts.is_empty() {
            self.shapes.remove(&shape.key);
            self.slots[e.slot as usize] = None;
            self.free.push(e.slot);
        }
        Some(name)
    }

    /// Makes host keys of the label keys that have come to have too many values, and
    /// regroups the nodes if there are any.
    fn split_keys_of_many_values(&mut self) {
        let many: Vec<Sym> = self
            .values
            .iter()
            .filter(|(_, values)| values.len() > HOST_KEY_VALUES)
            .map(|(k, _)| k.clone())
            .collect();
        if many.is_empty() {
            return;
        }
        self.host_keys.extend(many);
        let nodes = std::mem::take(&mut self.nodes);
        let slots = std::mem::take(&mut self.slots);
        self.shapes.clear();
        self.values.clear();
        self.free.clear();
        for (name, e) in nodes {
            let Some(shape) = slots.get(e.slot as usize).and_then(Option::as_ref) else {
                // Cordoned: in no shape, nothing to regroup.
                self.nodes.insert(name, e);
                continue;
            };
            let Some(host) = shape.hosts.get(e.at as usize) else {
                continue;
            };
            // Its labels, whole, in key order, then split anew.
            let mut all: Vec<(&str, &str)> =
                shape.key.labels.iter().chain(host.labels.iter()).collect();
            all.sort_unstable_by(|a, b| a.0.cmp(b.0));
            let (shared, own) = self.split(&name, all.into_iter());
            let key = ShapeKey {
                allocatable: shape.key.allocatable.clone(),
                labels: shared,
                taints: shape.key.taints.clone(),
            };
            self.insert(name, key, own);
        }
        self.purge();
    }

    fn purge_if_grown(&mut self) {
        if self.strings.len() >= self.purge_at {
            self.purge();
        }
    }

    /// Forgets the strings nothing holds any more (values of nodes gone or relabelled).
    fn purge(&mut self) {
        // The host keys are held by `host_keys` too, so they stay.
        self.strings.retain(|s| Arc::strong_count(s) > 1);
        self.strings.shrink_to_fit();
        self.purge_at = (self.strings.len() * 2).max(1024);
    }
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

    /// Every schedulable node as feasibility sees it: name to labels, allocatable, taints.
    type Seen = BTreeMap<String, (BTreeMap<String, String>, BTreeMap<String, i128>, Vec<Taint>)>;

    fn seen(nodes: &Nodes) -> Seen {
        let mut out = Seen::new();
        for s in &nodes.shapes {
            for h in &s.hosts {
                let labels = s
                    .key
                    .labels
                    .iter()
                    .chain(h.labels.iter())
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                out.insert(
                    h.name.to_string(),
                    (labels, s.key.allocatable.clone(), s.key.taints.clone()),
                );
            }
        }
        out
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
        assert_eq!(eight.hosts[0].labels.get(HOSTNAME_LABEL), Some("gpu-1"));
        assert_eq!(eight.label(&eight.hosts[1], "pool"), Some("a100"));
        assert!(!eight.key.labels.contains_key(HOSTNAME_LABEL));
        assert!(n.is_host_key(HOSTNAME_LABEL) && !n.is_host_key("pool"));
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

    /// A label of a value per node (GFD's timestamp) makes a host key once it has more than
    /// `HOST_KEY_VALUES` values: the pool is one shape again, every label still read.
    #[test]
    fn a_label_of_a_value_per_node_is_kept_per_host() {
        let count = HOST_KEY_VALUES + 40;
        let nodes: Vec<Node> = (0..count)
            .map(|i| {
                node(
                    &format!("gpu-{i:03}"),
                    "8",
                    json!({"metadata": {"labels": {
                        "nvidia.com/gfd.timestamp": (1_767_225_600 + i).to_string(),
                        "topology.kubernetes.io/zone": format!("zone-{}", i % 4)}}}),
                )
            })
            .collect();
        let mut index = Index::default();
        let mut shapes_seen = 0;
        for (i, n) in nodes.iter().enumerate() {
            assert!(index.apply(n));
            assert!(!index.apply(n), "the same node twice changes nothing");
            shapes_seen = shapes_seen.max(index.snapshot().shapes.len());
            if i == HOST_KEY_VALUES {
                // The key of its 65th value turned a host key: one shape per zone.
                assert_eq!(index.snapshot().shapes.len(), 4);
            }
        }
        assert_eq!(shapes_seen, HOST_KEY_VALUES);
        let snap = index.snapshot();
        assert_eq!(snap.shapes.len(), 4);
        assert_eq!(&*snap.host_keys, [Sym::from("nvidia.com/gfd.timestamp")]);
        assert!(snap.is_host_key("nvidia.com/gfd.timestamp"));
        assert_eq!(seen(&snap), seen(&Nodes::of(&nodes)));
        let s = &snap.shapes[0];
        let h = &s.hosts[0];
        assert!(s.label(h, "nvidia.com/gfd.timestamp").is_some());
        assert!(s.label(h, "topology.kubernetes.io/zone").is_some());
        // The name and the hostname label are one allocation.
        assert!(Arc::ptr_eq(
            &h.name,
            &h.labels
                .0
                .iter()
                .find(|(k, _)| &**k == HOSTNAME_LABEL)
                .unwrap()
                .1
        ));
        // Shapes share their label values: one allocation however many shapes hold one.
        let product = |s: &Shape| {
            s.key
                .labels
                .0
                .iter()
                .find(|(k, _)| &**k == "pool")
                .unwrap()
                .1
                .clone()
        };
        assert!(Arc::ptr_eq(
            &product(&snap.shapes[0]),
            &product(&snap.shapes[3])
        ));
    }

    /// The index, changed one node at a time, always shows what `Nodes::of` the nodes as
    /// they are shows; a shape nobody entered or left keeps its snapshot.
    #[test]
    fn the_index_follows_the_nodes_one_change_at_a_time() {
        let mut index = Index::default();
        let mut now: BTreeMap<String, Node> = BTreeMap::new();
        let check = |index: &mut Index, now: &BTreeMap<String, Node>| {
            let snap = index.snapshot();
            assert_eq!(seen(&snap), seen(&Nodes::of(now.values())));
            assert_eq!(index.len(), now.len());
            assert_eq!(
                snap.cordoned,
                now.values()
                    .filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true))
                    .count()
            );
        };
        for i in 0..40 {
            let pool = ["a100", "l4", "cpu"][i % 3];
            let n = node(
                &format!("n-{i:02}"),
                if pool == "a100" { "8" } else { "4" },
                json!({"metadata": {"labels": {"pool": pool}}}),
            );
            assert!(index.apply(&n));
            now.insert(format!("n-{i:02}"), n);
        }
        check(&mut index, &now);
        let before = index.snapshot();
        assert_eq!(before.shapes.len(), 3);

        // Relabelled: it moves to a shape of its own; the l4 shape keeps its snapshot.
        let relabelled = node(
            "n-00",
            "8",
            json!({"metadata": {"labels": {"nvidia.com/gpu.product": "H100"}}}),
        );
        assert!(index.apply(&relabelled));
        now.insert("n-00".into(), relabelled);
        let moved = index.snapshot();
        check(&mut index, &now);
        assert_eq!(moved.shapes.len(), 4);
        let l4 = |n: &Nodes| {
            n.shapes
                .iter()
                .find(|s| s.key.labels.get("pool") == Some("l4"))
                .unwrap()
                .clone()
        };
        assert!(Arc::ptr_eq(&l4(&before), &l4(&moved)));

        // Cordoned, then deleted; a shape left empty goes.
        let cordoned = node("n-00", "8", json!({"spec": {"unschedulable": true}}));
        assert!(index.apply(&cordoned));
        assert!(!index.apply(&cordoned));
        now.insert("n-00".into(), cordoned);
        check(&mut index, &now);
        assert_eq!(index.snapshot().shapes.len(), 3);
        assert!(index.delete("n-00"));
        assert!(!index.delete("n-00"));
        now.remove("n-00");
        check(&mut index, &now);

        // A new hostname label on a node of the same shape.
        let mut renamed = node("n-01", "4", json!({"metadata": {"labels": {"pool": "l4"}}}));
        renamed
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(HOSTNAME_LABEL.into(), "host-01".into());
        assert!(index.apply(&renamed));
        now.insert("n-01".into(), renamed);
        check(&mut index, &now);
        // An allocatable change (a device plugin restarting) moves it too.
        let n = node("n-03", "0", json!({}));
        assert!(index.apply(&n));
        now.insert("n-03".into(), n);
        check(&mut index, &now);
        // Every node deleted: nothing is left, and nothing of them is held.
        drop((before, moved));
        for name in now.keys() {
            assert!(index.delete(name));
        }
        now.clear();
        check(&mut index, &now);
        assert!(index.values.is_empty() && index.shapes.is_empty());
        index.purge();
        assert_eq!(index.strings.len(), 1, "{:?}", index.strings);
    }
}

//! The nodes a pod may be scheduled on, and whether one of them offers what it asks for:
//! its labels pass the pod's `nodeSelector` and required node affinity, the pod tolerates
//! its `NoSchedule` and `NoExecute` taints (`capacity` leaves out cordoned nodes and the
//! lifecycle's taints), and its allocatable covers every resource the pod requests. What
//! is decided ([`reach`], [`shortfall`]) is data; the messages are written from it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Pod};

use super::autoscaling::{scale_up, ScaleUp};
use super::placement::{required_terms, tolerated};
use super::{Obstacle, Outlook};
use crate::capacity::{Nodes, Shape, Taint};
use crate::cluster::Cluster;
use crate::pod::Amounts;
use crate::policy::Policy;
use crate::quantity;

/// What a pod's node selection and tolerations leave it of the nodes, by shape.
struct Reach<'n> {
    /// The shapes it may be scheduled on, each with how many of its hosts.
    allowed: Vec<(&'n Shape, usize)>,
    /// How many nodes its selectors rule out.
    by_selector: usize,
    /// How many nodes each taint it does not tolerate keeps it off (the first such taint
    /// of a node counts).
    untolerated: BTreeMap<&'n Taint, usize>,
}

/// One resource a pod asks for that no node it may use offers enough of.
struct Short<'a> {
    resource: &'a str,
    asked: i128,
    /// The most one of those nodes offers (0: none offers it).
    best: i128,
}

/// Whether a node the pod may use offers what it asks for; where none does, whether an
/// autoscaler may add one (`autoscaling`, asked only then): a warning that names it, else
/// "can never run".
pub(super) fn check_nodes(
    policy: &Policy,
    pod: &Pod,
    nodes: &Nodes,
    cluster: &dyn Cluster,
    out: &mut Outlook,
) {
    let Some(reach) = reach(pod, nodes) else {
        return;
    };
    let shared = shared(policy, pod, &out.usage.requests);
    let requests = shared.as_ref().unwrap_or(&out.usage.requests);
    let (lead, (why, fix)) = if reach.allowed.is_empty() {
        ("no node may run it", no_node_may_run(pod, nodes, &reach))
    } else {
        let Some(short) = shortfall(requests, &reach.allowed) else {
            return;
        };
        (
            "no node can run it",
            no_node_can_run(&short, &reach.allowed),
        )
    };
    let (never, message) = match scale_up(policy, pod, requests, cluster) {
        ScaleUp::May(who) => (
            false,
            format!(
                "no node offers what it asks for now: {why}. {} may add one; until then it stays Pending",
                capitalized(&or_list(&who))
            ),
        ),
        ScaleUp::Unknown => (
            false,
            format!(
                "no node offers what it asks for now: {why}. Whether an autoscaler may add one is not known yet"
            ),
        ),
        ScaleUp::Cannot(pools) if pools.is_empty() => (true, format!("{lead}: {why}. {fix}")),
        ScaleUp::Cannot(pools) => (
            true,
            format!(
                "{lead}: {why}, and no NodePool may add one ({}). {fix}",
                pools.join("; ")
            ),
        ),
    };
    out.findings.push(Obstacle {
        never,
        in_turns: false,
        message,
    });
}

/// `a`, `a or b`, `a, b or c`.
fn or_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// The shapes `pod` may be scheduled on by its node selection and tolerations, each with
/// how many of its hosts (none: it has no spec): what the GPU driver's decision reads.
pub(crate) fn may_use<'n>(pod: &Pod, nodes: &'n Nodes) -> Vec<(&'n Shape, usize)> {
    reach(pod, nodes).map(|r| r.allowed).unwrap_or_default()
}

/// The nodes `pod` may be scheduled on, by shape (None: it has no spec). Only a pod that
/// names nodes (`nodeName`, the hostname label, `metadata.name`) tells the hosts of one
/// shape apart; for any other, one look per shape answers for all its hosts, so the cost
/// does not grow with the node count.
fn reach<'n>(pod: &Pod, nodes: &'n Nodes) -> Option<Reach<'n>> {
    let spec = pod.spec.as_ref()?;
    let mut out = Reach {
        allowed: vec![],
        by_selector: 0,
        untolerated: BTreeMap::new(),
    };
    let per_host = names_nodes(pod, nodes);
    for shape in &nodes.shapes {
        let hosts = if per_host {
            shape
                .hosts
                .iter()
                .filter(|h| {
                    spec.node_name.as_deref().is_none_or(|n| n == &*h.name)
                        && selected(pod, |k| shape.label(h, k), &h.name)
                })
                .count()
        } else if selected(pod, |k| shape.key.labels.get(k), "") {
            shape.hosts.len()
        } else {
            0
        };
        if hosts == 0 {
            out.by_selector += shape.hosts.len();
            continue;
        }
        match shape.key.taints.iter().find(|t| !tolerated(pod, t)) {
            Some(t) => *out.untolerated.entry(t).or_default() += hosts,
            None => out.allowed.push((shape, hosts)),
        }
    }
    Some(out)
}

/// A pod's requests as nodes must meet them where it asks for shares or fractions of a GPU
/// (HAMi's `nvidia.com/gpumem`, KAI Scheduler's `gpu-fraction`), which their scheduler
/// hands out and no node advertises: without the shares, and with one GPU of the class's
/// `sharedFrom` at least. None: the pod asks for neither (nearly every pod: no copy).
fn shared(policy: &Policy, pod: &Pod, requests: &Amounts) -> Option<Amounts> {
    let annotations = pod.metadata.annotations.as_ref();
    let scheduler = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())
        .unwrap_or("default-scheduler");
    let mut out: Option<Amounts> = None;
    for class in policy.gpu.classes.values() {
        let shares = requests.keys().any(|k| class.is_share(k));
        let fraction = class.fractions.as_ref().is_some_and(|f| {
            f.scheduler_names.iter().any(|s| s == scheduler)
                && f.annotations
                    .iter()
                    .any(|a| annotations.is_some_and(|m| m.contains_key(a)))
        });
        if !shares && !fraction {
            continue;
        }
        let r = out.get_or_insert_with(|| requests.clone());
        r.retain(|k, _| !class.is_share(k));
        if let Some(from) = &class.shared_from {
            let one = r.entry(from.clone()).or_default();
            *one = (*one).max(1_000_000_000);
        }
    }
    out
}

/// What one pod's `requests` are short of on every node of `allowed`: None when one of
/// them offers all of it (and room for a pod); else each resource none offers enough of
/// (empty: each is offered somewhere, never all on one node).
fn shortfall<'a>(requests: &'a Amounts, allowed: &[(&Shape, usize)]) -> Option<Vec<Short<'a>>> {
    let asked: Vec<(&String, i128)> = requests
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| (k, *v))
        .collect();
    let fits = |s: &Shape| {
        asked
            .iter()
            .all(|(k, v)| s.key.allocatable.get(*k).is_some_and(|a| a >= v))
            && s.key
                .allocatable
                .get("pods")
                .is_none_or(|p| *p >= 1_000_000_000)
    };
    if allowed.iter().any(|(s, _)| fits(s)) {
        return None;
    }
    let mut short = vec![];
    for (k, v) in asked {
        let best = allowed
            .iter()
            .filter_map(|(s, _)| s.key.allocatable.get(k).copied())
            .max()
            .unwrap_or(0);
        if best < v {
            short.push(Short {
                resource: k,
                asked: v,
                best,
            });
        }
    }
    Some(short)
}

/// Why no node may run the pod (what its selectors and its tolerations rule out), and the
/// sentence that says what to change.
fn no_node_may_run(pod: &Pod, nodes: &Nodes, reach: &Reach<'_>) -> (String, String) {
    let total = nodes.count();
    let mut why = vec![];
    let mut fix = vec![];
    if reach.by_selector > 0 {
        let mut what = format!(
            "{} of {total} {} {} not match its {}",
            reach.by_selector,
            nodes_word(total),
            if reach.by_selector == 1 { "does" } else { "do" },
            selector_words(pod)
        );
        let found = selector_values(pod, nodes);
        if !found.is_empty() {
            what.push_str(&format!("; the nodes have {}", found.join("; ")));
        }
        why.push(what);
        fix.push(format!("change the {}", selector_words(pod)));
    }
    for (t, n) in &reach.untolerated {
        why.push(format!(
            "{n} {} tainted {t}, which it does not tolerate",
            if *n == 1 { "is" } else { "are" }
        ));
    }
    if !reach.untolerated.is_empty() {
        fix.push(
            "add a toleration of those taints if the nodes are meant for you (a pool tainted for another team is not)"
                .to_owned(),
        );
    }
    fix.push("ask your platform team which nodes are for you".into());
    (why.join("; "), format!("To fix it, {}", fix.join(", or ")))
}

/// Why no node the pod may use can run it (each resource it asks for more of than the
/// largest of them offers, and what they offer of the same vendor instead), and the
/// sentence that says what to change.
fn no_node_can_run(short: &[Short<'_>], allowed: &[(&Shape, usize)]) -> (String, String) {
    let may_use: usize = allowed.iter().map(|(_, n)| n).sum();
    let mut lines: Vec<String> = vec![];
    for s in short {
        let k = s.resource;
        let show = |n: i128| quantity::human(k, n);
        lines.push(if s.best <= 0 {
            // What its nodes offer of the same vendor (another MIG profile, say).
            let domain = k.split_once('/').map(|(d, _)| d);
            let mut offered: Vec<&str> = allowed
                .iter()
                .flat_map(|(s, _)| s.key.allocatable.keys())
                .filter(|r| domain.is_some() && r.split_once('/').map(|(d, _)| d) == domain)
                .map(String::as_str)
                .collect();
            offered.sort_unstable();
            offered.dedup();
            let instead = if offered.is_empty() {
                String::new()
            } else {
                format!(" (they offer {})", offered.join(", "))
            };
            format!(
                "it asks for {} {k}, which none of the {may_use} {} it may use offers{instead}",
                show(s.asked),
                nodes_word(may_use)
            )
        } else {
            format!(
                "it asks for {} {k}, and the largest of the {may_use} {} it may use offers {}",
                show(s.asked),
                nodes_word(may_use),
                show(s.best)
            )
        });
    }
    if lines.is_empty() {
        // Every resource is offered somewhere, never all on one node.
        lines.push("no node it may use offers all it asks for at once".into());
    }
    (
        lines.join("; "),
        "Ask for less per pod (more pods, fewer resources each), or ask your platform team for larger nodes".into(),
    )
}

fn nodes_word(n: usize) -> &'static str {
    if n == 1 {
        "node"
    } else {
        "nodes"
    }
}

/// The values the nodes have for the labels of the pod's nodeSelector that no node has as
/// asked: `nvidia.com/gpu.product: A100-SXM4-80GB (2 nodes)`.
fn selector_values(pod: &Pod, nodes: &Nodes) -> Vec<String> {
    let Some(selector) = pod.spec.as_ref().and_then(|s| s.node_selector.as_ref()) else {
        return vec![];
    };
    let mut out = vec![];
    for (k, v) in selector {
        // A value per node: not worth listing.
        if nodes.is_host_key(k) {
            continue;
        }
        let mut values: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &nodes.shapes {
            if let Some(have) = s.key.labels.get(k) {
                *values.entry(have).or_default() += s.hosts.len();
            }
        }
        if values.contains_key(v.as_str()) {
            continue;
        }
        let listed: Vec<String> = values
            .iter()
            .map(|(have, n)| format!("{k}: {have} ({n} {})", nodes_word(*n)))
            .collect();
        out.push(if listed.is_empty() {
            format!("no {k} label")
        } else {
            listed.join(", ")
        });
    }
    out
}

/// How a message names the pod's node selection.
fn selector_words(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    let mut words = vec![];
    if let Some(s) = spec.and_then(|s| s.node_selector.as_ref()) {
        let pairs: Vec<String> = s.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        if !pairs.is_empty() {
            words.push(format!("nodeSelector {}", pairs.join(", ")));
        }
    }
    if required_terms(pod).is_some() {
        words.push("required node affinity".into());
    }
    if spec.and_then(|s| s.node_name.as_deref()).is_some() {
        words.push("nodeName".into());
    }
    if words.is_empty() {
        "node selection".into()
    } else {
        words.join(" and ")
    }
}

/// Whether the pod's `nodeName`, `nodeSelector` or required node affinity read what differs
/// from node to node of one shape: its name, or a label of the host keys (the hostname's).
fn names_nodes(pod: &Pod, nodes: &Nodes) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.node_name.is_some()
        || spec
            .node_selector
            .as_ref()
            .is_some_and(|s| s.keys().any(|k| nodes.is_host_key(k)))
        || required_terms(pod).is_some_and(|terms| {
            terms.iter().any(|t| {
                t.match_fields.as_ref().is_some_and(|f| !f.is_empty())
                    || t.match_expressions
                        .iter()
                        .flatten()
                        .any(|r| nodes.is_host_key(&r.key))
            })
        })
}

/// Whether a node whose labels `label` reads, of this name, passes the pod's `nodeSelector`
/// and required node affinity (terms ORed, requirements ANDed).
fn selected<'a>(pod: &Pod, label: impl Fn(&str) -> Option<&'a str>, name: &str) -> bool {
    let spec = pod.spec.as_ref();
    if let Some(s) = spec.and_then(|s| s.node_selector.as_ref()) {
        if !s.iter().all(|(k, v)| label(k) == Some(v.as_str())) {
            return false;
        }
    }
    let Some(terms) = required_terms(pod) else {
        return true;
    };
    terms.iter().any(|t| {
        t.match_expressions
            .iter()
            .flatten()
            .all(|r| requirement(r, label(&r.key)))
            && t.match_fields
                .iter()
                .flatten()
                .all(|r| r.key == "metadata.name" && requirement(r, Some(name)))
    })
}

fn requirement(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => match (
            value.and_then(number),
            values.first().and_then(|v| number(v)),
        ) {
            (Some(v), Some(x)) => v > x,
            _ => false,
        },
        "Lt" => match (
            value.and_then(number),
            values.first().and_then(|v| number(v)),
        ) {
            (Some(v), Some(x)) => v < x,
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feasible::Usage;
    use serde_json::json;

    /// A pod that names a node (by `nodeName`, the hostname label or `metadata.name`) is
    /// judged host by host; any other once per shape, with the same answer.
    #[test]
    fn nodes_named_by_a_pod_are_told_apart_within_their_shape() {
        let nodes: Vec<k8s_openapi::api::core::v1::Node> = (0..3)
            .map(|i| {
                serde_json::from_value(json!({"metadata": {"name": format!("gpu-{i}"),
                    "labels": {"kubernetes.io/hostname": format!("host-{i}"), "pool": "a100"}},
                    "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "8", "pods": "110"}}}))
                .unwrap()
            })
            .collect();
        let nodes = Nodes::of(&nodes);
        assert_eq!(nodes.shapes.len(), 1);
        let judged = |spec: serde_json::Value| {
            let pod: Pod = serde_json::from_value(json!({"spec": spec})).unwrap();
            let mut out = Outlook {
                usage: Usage::of(&pod),
                ..Outlook::default()
            };
            check_nodes(
                &Policy::builtin(),
                &pod,
                &nodes,
                &crate::cluster::Offline,
                &mut out,
            );
            (names_nodes(&pod, &nodes), out.findings.len())
        };
        let c = json!([{"name": "c", "resources": {"requests": {"cpu": "1"}}}]);
        let term = |e: serde_json::Value| {
            json!({"containers": c, "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [e]}}}})
        };
        // Nothing names a node: the shape answers.
        assert_eq!(
            judged(json!({"containers": c, "nodeSelector": {"pool": "a100"}})),
            (false, 0)
        );
        assert_eq!(
            judged(json!({"containers": c, "nodeSelector": {"pool": "l4"}})),
            (false, 1)
        );
        // Named, by each of the four ways; a name no node has rules them all out.
        for (named, other) in [
            (
                json!({"containers": c, "nodeName": "gpu-1"}),
                json!({"containers": c, "nodeName": "gpu-9"}),
            ),
            (
                json!({"containers": c, "nodeSelector": {"kubernetes.io/hostname": "host-2"}}),
                json!({"containers": c, "nodeSelector": {"kubernetes.io/hostname": "gpu-2"}}),
            ),
            (
                term(
                    json!({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-0"]}]}),
                ),
                term(
                    json!({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-7"]}]}),
                ),
            ),
            (
                term(
                    json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-0"]}]}),
                ),
                term(
                    json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["host-0"]}]}),
                ),
            ),
        ] {
            assert_eq!(judged(named), (true, 0));
            assert_eq!(judged(other), (true, 1));
        }
    }
}

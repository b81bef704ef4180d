//! What may add a node where none offers what a pod asks for now (a GPU pool that scales
//! from zero has no Node until a pod asks): the Cluster Autoscaler, seen by its status
//! ConfigMap, which may add a node of a group tollgate cannot see, and Karpenter's
//! NodePools, each of which adds a node for a pod its template's labels and requirements
//! admit, whose taints the pod tolerates, within its `limits`. Decided into data
//! ([`scale_up`]); `nodes` words the finding from it.
//!
//! A NodePool's instance types are not read (they live in the cloud provider's node
//! classes): a NodePool that admits the pod is taken to offer what it asks for, unless its
//! limits say it may never hold that much.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Pod};
use serde_json::Value;

use crate::capacity::Taint;
use crate::cluster::{Cluster, Lookup};
use crate::pod::Amounts;
use crate::policy::{NodeAutoscaling, Policy};
use crate::quantity;

/// Whether a node may be added for a pod no node offers what it asks for now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ScaleUp {
    /// What may add one: `the Cluster Autoscaler`, `Karpenter's NodePool "gpu"`.
    May(Vec<String>),
    /// What may add nodes is not known yet (a cache not synced): nothing is refused for it.
    Unknown,
    /// Nothing may: no autoscaler, or each NodePool with why it adds none.
    Cannot(Vec<String>),
}

/// Whether a node may be added for `pod`, which asks for `requests`, by the policy's
/// `feasibility.autoscaling` and what the cluster context shows.
pub(super) fn scale_up(
    policy: &Policy,
    pod: &Pod,
    requests: &Amounts,
    cluster: &dyn Cluster,
) -> ScaleUp {
    match policy.feasibility.autoscaling {
        NodeAutoscaling::None => return ScaleUp::Cannot(vec![]),
        NodeAutoscaling::Present => {
            return ScaleUp::May(vec![
                "an autoscaler (the policy's feasibility.autoscaling: present)".into(),
            ])
        }
        NodeAutoscaling::Detect => {}
    }
    let a = match cluster.autoscaling() {
        None | Some(Lookup::Absent) => return ScaleUp::Cannot(vec![]),
        Some(Lookup::Unknown) => return ScaleUp::Unknown,
        Some(Lookup::Found(a)) => a,
    };
    let mut may = vec![];
    let mut cannot = vec![];
    if a.cluster_autoscaler {
        may.push("the Cluster Autoscaler".to_owned());
    }
    for p in &a.node_pools {
        let pool = NodePool::of(p);
        let who = format!("Karpenter's NodePool {:?}", pool.name);
        match pool.refuses(pod, requests) {
            None => may.push(who),
            Some(why) => cannot.push(format!("{who}: {why}")),
        }
    }
    if may.is_empty() {
        ScaleUp::Cannot(cannot)
    } else {
        ScaleUp::May(may)
    }
}

/// What a NodePool's nodes will be, as far as a pod's placement goes.
struct NodePool<'a> {
    name: &'a str,
    labels: Option<&'a serde_json::Map<String, Value>>,
    requirements: Vec<NodeSelectorRequirement>,
    taints: Vec<Taint>,
    limits: Option<&'a serde_json::Map<String, Value>>,
}

/// The values a label of a NodePool's nodes may take.
#[derive(Debug, PartialEq, Eq)]
enum Domain {
    /// One of these.
    Of(BTreeSet<String>),
    /// Any value but these.
    AnyBut(BTreeSet<String>),
    /// The nodes do not carry it.
    Absent,
}

/// Labels Karpenter sets on every node it makes, from the instance type it picks, without
/// a NodePool naming them (`karpenter.sh/v1`'s well-known labels, and the cloud
/// providers' own under their prefixes).
fn well_known(key: &str) -> bool {
    matches!(
        key,
        "topology.kubernetes.io/zone"
            | "topology.kubernetes.io/region"
            | "node.kubernetes.io/instance-type"
            | "kubernetes.io/arch"
            | "kubernetes.io/os"
            | "karpenter.sh/capacity-type"
            | "node.kubernetes.io/windows-build"
    ) || [
        "karpenter.k8s.aws/",
        "karpenter.azure.com/",
        "karpenter.k8s.gcp/",
    ]
    .iter()
    .any(|p| key.starts_with(p))
}

impl<'a> NodePool<'a> {
    fn of(v: &'a Value) -> NodePool<'a> {
        let template = &v["spec"]["template"];
        NodePool {
            name: v["metadata"]["name"].as_str().unwrap_or(""),
            labels: template["metadata"]["labels"].as_object(),
            requirements: template["spec"]["requirements"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| serde_json::from_value(r.clone()).ok())
                .collect(),
            taints: template["spec"]["taints"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| {
                    let s = |k: &str| t[k].as_str().unwrap_or("").to_owned();
                    let effect = s("effect");
                    matches!(effect.as_str(), "NoSchedule" | "NoExecute").then(|| Taint {
                        key: s("key"),
                        value: s("value"),
                        effect,
                    })
                })
                .collect(),
            limits: v["spec"]["limits"].as_object(),
        }
    }

    /// The values label `key` may take on this pool's nodes: its template's label, narrowed
    /// by its requirements; a well-known label any value; another label none.
    fn domain(&self, key: &str) -> Domain {
        let mut d = if key == "karpenter.sh/nodepool" {
            Domain::Of([self.name.to_owned()].into())
        } else if let Some(v) = self.labels.and_then(|l| l.get(key)).and_then(Value::as_str) {
            Domain::Of([v.to_owned()].into())
        } else if well_known(key) || self.requirements.iter().any(|r| r.key == key) {
            Domain::AnyBut(BTreeSet::new())
        } else {
            Domain::Absent
        };
        for r in self.requirements.iter().filter(|r| r.key == key) {
            let values: BTreeSet<String> = r.values.iter().flatten().cloned().collect();
            d = match (r.operator.as_str(), d) {
                (_, Domain::Absent) => Domain::Absent,
                ("In", Domain::Of(have)) => Domain::Of(&have & &values),
                ("In", Domain::AnyBut(not)) => Domain::Of(&values - &not),
                ("NotIn", Domain::Of(have)) => Domain::Of(&have - &values),
                ("NotIn", Domain::AnyBut(not)) => Domain::AnyBut(&not | &values),
                ("DoesNotExist", _) => Domain::Absent,
                // Exists, Gt, Lt: some value, which the pod's own terms are read against.
                (_, d) => d,
            };
        }
        d
    }

    /// Whether a node of this pool may meet one of the pod's terms on `r.key`.
    fn may_meet(&self, r: &NodeSelectorRequirement) -> bool {
        let values: BTreeSet<String> = r.values.iter().flatten().cloned().collect();
        let number = |s: &String| s.parse::<i64>().ok();
        let bound = values.iter().next().and_then(number);
        match (r.operator.as_str(), self.domain(&r.key)) {
            ("In", Domain::Of(have)) => !have.is_disjoint(&values),
            ("In", Domain::AnyBut(not)) => !values.is_subset(&not),
            ("NotIn", Domain::Of(have)) => !have.is_subset(&values),
            ("NotIn", _) => true,
            ("Exists", d) => d != Domain::Absent,
            ("DoesNotExist", d) => d == Domain::Absent,
            ("Gt" | "Lt", Domain::Of(have)) => have
                .iter()
                .filter_map(number)
                .any(|v| bound.is_some_and(|b| if r.operator == "Gt" { v > b } else { v < b })),
            ("Gt" | "Lt", Domain::AnyBut(_)) => bound.is_some(),
            _ => false,
        }
    }

    /// Why this pool adds no node for `pod`, which asks for `requests` (None: it may).
    fn refuses(&self, pod: &Pod, requests: &Amounts) -> Option<String> {
        let spec = pod.spec.as_ref()?;
        if spec.node_name.is_some() {
            return Some("the pod names its node (nodeName)".into());
        }
        for (k, v) in spec.node_selector.iter().flatten() {
            let r = NodeSelectorRequirement {
                key: k.clone(),
                operator: "In".into(),
                values: Some(vec![v.clone()]),
            };
            if !self.may_meet(&r) {
                return Some(format!(
                    "its nodes will not have the pod's nodeSelector {k}: {v}"
                ));
            }
        }
        if let Some(terms) = super::placement::required_terms(pod) {
            let any = terms.iter().any(|t| {
                t.match_fields.iter().flatten().next().is_none()
                    && t.match_expressions
                        .iter()
                        .flatten()
                        .all(|r| self.may_meet(r))
            });
            if !any {
                return Some("its nodes will not meet the pod's required node affinity".into());
            }
        }
        if let Some(t) = self
            .taints
            .iter()
            .find(|t| !super::placement::tolerated(pod, t))
        {
            return Some(format!(
                "its nodes are tainted {t}, which the pod does not tolerate"
            ));
        }
        for (r, limit) in self.limits.into_iter().flatten() {
            let limit = match limit {
                Value::String(s) => quantity::parse(s).ok(),
                Value::Number(n) => n.as_i64().map(|n| i128::from(n) * 1_000_000_000),
                _ => None,
            };
            let (Some(limit), Some(&asked)) = (limit, requests.get(r)) else {
                continue;
            };
            if asked > limit {
                return Some(format!(
                    "its limits allow {} {r} in all, and the pod asks for {}",
                    quantity::human(r, limit),
                    quantity::human(r, asked)
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Objects;
    use serde_json::json;

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn gpu_pod(extra: Value) -> (Pod, Amounts) {
        let mut spec = json!({"containers": [{"name": "c", "image": "i"}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        let requests: Amounts = [
            ("nvidia.com/gpu".to_owned(), 2_000_000_000),
            ("cpu".to_owned(), 8_000_000_000),
        ]
        .into();
        (pod(spec), requests)
    }

    fn pool(spec: Value) -> Value {
        json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "gpu"}, "spec": spec})
    }

    fn with(objects: &[Value]) -> Objects {
        let mut o = Objects::complete();
        o.know_autoscaling();
        for v in objects {
            assert!(o.add_autoscaling(v.clone()));
        }
        o
    }

    fn gpu_pool() -> Value {
        pool(json!({
            "template": {
                "metadata": {"labels": {"team": "ml"}},
                "spec": {
                    "requirements": [
                        {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["p4d", "p5"]},
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}
                    ],
                    "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
                }
            },
            "limits": {"nvidia.com/gpu": 16, "cpu": "1000"}
        }))
    }

    #[test]
    fn the_cluster_autoscaler_may_add_a_node_for_any_pod() {
        let (p, r) = gpu_pod(json!({}));
        let status = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cluster-autoscaler-status", "namespace": "kube-system"},
            "data": {"status": "time: 2026-12-01 10:00:00\nautoscalerStatus: Running\n"}});
        let c = with(&[status]);
        assert_eq!(
            scale_up(&Policy::builtin(), &p, &r, &c),
            ScaleUp::May(vec!["the Cluster Autoscaler".into()])
        );
        // Another ConfigMap says nothing.
        let mut o = Objects::complete();
        assert!(
            !o.add_autoscaling(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cluster-autoscaler-status", "namespace": "default"}}))
        );
        assert_eq!(o.autoscaling, None);
        assert_eq!(
            scale_up(&Policy::builtin(), &p, &r, &o),
            ScaleUp::Cannot(vec![])
        );
    }

    #[test]
    fn a_node_pool_adds_a_node_for_a_pod_it_admits() {
        let c = with(&[gpu_pool()]);
        let (p, r) = gpu_pod(
            json!({"nodeSelector": {"team": "ml", "karpenter.sh/capacity-type": "on-demand"}}),
        );
        assert_eq!(
            scale_up(&Policy::builtin(), &p, &r, &c),
            ScaleUp::May(vec!["Karpenter's NodePool \"gpu\"".into()])
        );
        // Affinity on a well-known label the pool narrows, and on the instance family.
        let (p, r) = gpu_pod(
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["p5"]},
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}
            ]}]}}}}),
        );
        assert!(matches!(
            scale_up(&Policy::builtin(), &p, &r, &c),
            ScaleUp::May(_)
        ));
    }

    #[test]
    fn a_node_pool_adds_none_where_its_nodes_could_not_run_the_pod() {
        let c = with(&[gpu_pool()]);
        let cannot = |extra: Value, requests: Option<Amounts>| {
            let (p, mut r) = gpu_pod(extra);
            if let Some(q) = requests {
                r = q;
            }
            match scale_up(&Policy::builtin(), &p, &r, &c) {
                ScaleUp::Cannot(why) => why.join("; "),
                other => panic!("{other:?}"),
            }
        };
        // A label the pool's nodes will not carry (GPU Feature Discovery's, set later).
        let w = cannot(
            json!({"nodeSelector": {"nvidia.com/gpu.product": "A100"}}),
            None,
        );
        assert!(w.contains("nvidia.com/gpu.product: A100"), "{w}");
        // A value the pool's requirements rule out.
        let w = cannot(
            json!({"nodeSelector": {"karpenter.sh/capacity-type": "spot"}}),
            None,
        );
        assert!(w.contains("capacity-type"), "{w}");
        // Its taint, untolerated.
        let (mut p, r) = gpu_pod(json!({}));
        p.spec.as_mut().unwrap().tolerations = None;
        let ScaleUp::Cannot(w) = scale_up(&Policy::builtin(), &p, &r, &c) else {
            panic!()
        };
        assert!(w[0].contains("tainted nvidia.com/gpu:NoSchedule"), "{w:?}");
        // More GPUs than its limits allow in all.
        let w = cannot(
            json!({}),
            Some([("nvidia.com/gpu".to_owned(), 32_000_000_000)].into()),
        );
        assert!(
            w.contains("its limits allow 16 nvidia.com/gpu in all, and the pod asks for 32"),
            "{w}"
        );
    }

    #[test]
    fn the_policy_may_state_the_clusters_autoscaling() {
        let (p, r) = gpu_pod(json!({}));
        let mut policy = Policy::builtin();
        policy.feasibility.autoscaling = NodeAutoscaling::Present;
        assert!(matches!(
            scale_up(&policy, &p, &r, &Objects::complete()),
            ScaleUp::May(_)
        ));
        policy.feasibility.autoscaling = NodeAutoscaling::None;
        let c = with(&[gpu_pool()]);
        assert_eq!(scale_up(&policy, &p, &r, &c), ScaleUp::Cannot(vec![]));
    }
}

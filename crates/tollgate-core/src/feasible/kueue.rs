//! Kueue: a workload labelled [`KUEUE_QUEUE_LABEL`] is admitted by Kueue only within its
//! LocalQueue's ClusterQueue, all its pods at once: what the ClusterQueue lets one workload
//! have ([`admits`]) is compared with what its pods ask for in all ([`lacks`]), and the
//! findings are worded from that.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::{Obstacle, Usage};
use crate::cluster::{Cluster, Lookup};
use crate::quantity;
use crate::words::quote;

/// The label with which a workload names the Kueue LocalQueue it is submitted to.
pub(crate) const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// Where a workload submitted to a LocalQueue is admitted: its ClusterQueue, or the queue
/// that does not exist (Kueue keeps the workload suspended until it does).
enum Route {
    Admitted {
        cluster_queue: String,
        spec: Arc<Value>,
    },
    NoLocalQueue,
    NoClusterQueue(String),
}

/// What a ClusterQueue lets one workload have.
struct Admits {
    /// In a cohort, it may borrow.
    cohort: bool,
    /// Per resource it covers, the most one workload can get (None: no limit to its
    /// borrowing).
    most: BTreeMap<String, Option<i128>>,
}

/// One resource a workload's pods ask for that its ClusterQueue does not give it.
enum Lack<'a> {
    /// Not covered: Kueue admits no workload asking for it, unless its configuration
    /// leaves the resource out (which tollgate cannot see).
    NotCovered(&'a str),
    /// More than one workload can get, even borrowing.
    OverLimit {
        resource: &'a str,
        limit: i128,
        want: i128,
    },
}

/// What a workload submitted to Kueue (`KUEUE_QUEUE_LABEL` = `queue`) can get: Kueue admits
/// it only within its ClusterQueue's quota (nominal, plus what it may borrow in its
/// cohort), and all its pods at once. `usage` is all its pods' (`pods` of them). Err: the
/// queues are not known (what to say of them); Ok: the findings.
pub(crate) fn kueue(
    queue: &str,
    namespace: &str,
    cluster: &dyn Cluster,
    usage: &Usage,
    pods: i128,
) -> Result<Vec<Obstacle>, String> {
    let (cq_name, spec) = match route(queue, namespace, cluster)? {
        Route::Admitted {
            cluster_queue,
            spec,
        } => (cluster_queue, spec),
        Route::NoLocalQueue => {
            return Ok(vec![suspended(format!(
                "its LocalQueue {} does not exist in namespace {}: Kueue keeps it suspended until it does",
                quote(queue),
                quote(namespace)
            ))]);
        }
        Route::NoClusterQueue(cq_name) => {
            return Ok(vec![suspended(format!(
                "the ClusterQueue {} of its LocalQueue {} does not exist: Kueue keeps it suspended until it does",
                quote(&cq_name),
                quote(queue)
            ))]);
        }
    };
    let admits = admits(&spec);
    let asked = asked(usage, pods);
    let subject = format!(
        "ClusterQueue {} (of its LocalQueue {})",
        quote(&cq_name),
        quote(queue)
    );
    Ok(lacks(&admits, &asked)
        .into_iter()
        .map(|lack| worded(&subject, &admits, pods, lack))
        .collect())
}

/// The ClusterQueue of LocalQueue `queue` of `namespace`. Err: the context does not know
/// the queues (what to say of them).
fn route(queue: &str, namespace: &str, cluster: &dyn Cluster) -> Result<Route, String> {
    let local = match cluster.kueue_local_queue(namespace, queue) {
        None | Some(Lookup::Unknown) => {
            return Err(format!("Kueue's LocalQueue {}", quote(queue)));
        }
        Some(Lookup::Absent) => return Ok(Route::NoLocalQueue),
        Some(Lookup::Found(l)) => l,
    };
    let cq_name = local
        .pointer("/spec/clusterQueue")
        .and_then(Value::as_str)
        .unwrap_or("");
    match cluster.kueue_cluster_queue(cq_name) {
        Some(Lookup::Found(cq)) => Ok(Route::Admitted {
            cluster_queue: cq_name.to_owned(),
            spec: cq,
        }),
        Some(Lookup::Absent) => Ok(Route::NoClusterQueue(cq_name.to_owned())),
        _ => Err(format!("Kueue's ClusterQueue {}", quote(cq_name))),
    }
}

/// What ClusterQueue `cq` lets one workload have: per resource, the nominal quotas of its
/// flavors summed (a workload's pod sets may land on different ones), plus each flavor's
/// borrowing limit in a cohort (none: no limit).
fn admits(cq: &Value) -> Admits {
    let spec = cq.get("spec");
    // v1beta2 names the cohort `cohortName`; v1beta1 and v1 `cohort`.
    let cohort = ["cohortName", "cohort"].iter().any(|k| {
        spec.and_then(|s| s.get(*k))
            .and_then(Value::as_str)
            .is_some_and(|c| !c.is_empty())
    });
    let mut most: BTreeMap<String, Option<i128>> = BTreeMap::new();
    let resources = spec
        .and_then(|s| s.get("resourceGroups"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|group| group.get("flavors").and_then(Value::as_array))
        .flatten()
        .flat_map(|flavor| flavor.get("resources").and_then(Value::as_array))
        .flatten();
    for r in resources {
        let Some(name) = r.get("name").and_then(Value::as_str) else {
            continue;
        };
        let amount = |k: &str| {
            r.get(k).and_then(|q| match q {
                Value::String(s) => quantity::parse(s).ok(),
                Value::Number(n) => quantity::parse(&n.to_string()).ok(),
                _ => None,
            })
        };
        let nominal = amount("nominalQuota").unwrap_or(0);
        let borrow = if cohort {
            amount("borrowingLimit")
        } else {
            Some(0)
        };
        let slot = most.entry(name.to_owned()).or_insert(Some(0));
        *slot = match (*slot, borrow) {
            (Some(m), Some(b)) => Some(m.saturating_add(nominal).saturating_add(b)),
            _ => None,
        };
    }
    Admits { cohort, most }
}

/// What a workload's `pods` pods ask for in all, `pods` among it (Kueue counts them).
fn asked(usage: &Usage, pods: i128) -> Vec<(String, i128)> {
    let mut asked: Vec<(String, i128)> = usage
        .requests
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    asked.push(("pods".into(), pods.saturating_mul(1_000_000_000)));
    asked
}

/// What of `asked` the ClusterQueue does not give one workload.
fn lacks<'a>(admits: &Admits, asked: &'a [(String, i128)]) -> Vec<Lack<'a>> {
    let mut out = vec![];
    for (resource, want) in asked {
        match admits.most.get(resource) {
            None if resource != "pods" => out.push(Lack::NotCovered(resource)),
            Some(Some(limit)) if want > limit => out.push(Lack::OverLimit {
                resource,
                limit: *limit,
                want: *want,
            }),
            _ => {}
        }
    }
    out
}

fn worded(subject: &str, admits: &Admits, pods: i128, lack: Lack<'_>) -> Obstacle {
    match lack {
        Lack::NotCovered(resource) => Obstacle {
            never: false,
            in_turns: false,
            message: format!(
                "{subject} covers no {resource}, which its pods ask for: Kueue does not admit it unless its configuration leaves {resource} out"
            ),
        },
        Lack::OverLimit {
            resource,
            limit,
            want,
        } => {
            let show = |n: i128| quantity::human(resource, n);
            Obstacle {
                never: true,
                in_turns: false,
                message: format!(
                    "{subject} lets one workload have at most {} {resource}{}, and its {pods} pods ask for {} in all: Kueue never admits it, and it stays suspended. Lower the replicas or what each pod asks for, or ask your platform team for more quota in the ClusterQueue",
                    show(limit),
                    if admits.cohort { " (nominal and borrowing)" } else { "" },
                    show(want)
                ),
            }
        }
    }
}

/// A finding of a queue that does not exist: the workload waits, suspended.
fn suspended(message: String) -> Obstacle {
    Obstacle {
        never: false,
        in_turns: false,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Objects;
    use serde_json::json;

    fn queues(cq_spec: serde_json::Value) -> Objects {
        let mut o = Objects::default();
        o.add_kueue_queue(
            json!({"kind": "LocalQueue", "metadata": {"name": "q", "namespace": "ml"},
            "spec": {"clusterQueue": "cq"}}),
        );
        o.add_kueue_queue(
            json!({"kind": "ClusterQueue", "metadata": {"name": "cq"}, "spec": cq_spec}),
        );
        o
    }

    fn gpus(n: i128) -> Usage {
        let mut u = Usage::default();
        u.requests
            .insert("nvidia.com/gpu".into(), n * 1_000_000_000);
        u
    }

    fn group(resource: &str, nominal: &str, borrowing: Option<&str>) -> serde_json::Value {
        let mut r = json!({"name": resource, "nominalQuota": nominal});
        if let Some(b) = borrowing {
            r["borrowingLimit"] = json!(b);
        }
        json!([{"coveredResources": [resource], "flavors": [{"name": "f", "resources": [r]}]}])
    }

    #[test]
    fn kueue_holds_a_workload_to_nominal_plus_borrowing() {
        // No cohort: nominal alone.
        let o = queues(json!({"resourceGroups": group("nvidia.com/gpu", "8", None)}));
        let f = kueue("q", "ml", &o, &gpus(16), 4).unwrap();
        assert!(f.len() == 1 && f[0].never, "{f:?}");
        assert!(kueue("q", "ml", &o, &gpus(8), 2).unwrap().is_empty());
        // A cohort with a borrowing limit: nominal and borrowing.
        let o = queues(
            json!({"cohortName": "c", "resourceGroups": group("nvidia.com/gpu", "8", Some("8"))}),
        );
        assert!(kueue("q", "ml", &o, &gpus(16), 4).unwrap().is_empty());
        assert!(kueue("q", "ml", &o, &gpus(17), 4).unwrap()[0].never);
        // A cohort (v1beta1's `cohort`) without one: no limit tollgate can know.
        let o =
            queues(json!({"cohort": "c", "resourceGroups": group("nvidia.com/gpu", "8", None)}));
        assert!(kueue("q", "ml", &o, &gpus(1000), 4).unwrap().is_empty());
        // Flavors of one group add up: a workload's pod sets may land on different ones.
        let two = json!([{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "a", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "8"}]},
            {"name": "b", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]);
        let o = queues(json!({"resourceGroups": two}));
        assert!(kueue("q", "ml", &o, &gpus(16), 4).unwrap().is_empty());
    }

    #[test]
    fn kueue_says_what_it_cannot_decide_and_never_refuses_for_it() {
        // A resource the ClusterQueue does not cover: a warning (Kueue's configuration may
        // leave it out).
        let o = queues(json!({"resourceGroups": group("cpu", "8", None)}));
        let f = kueue("q", "ml", &o, &gpus(1), 1).unwrap();
        assert!(f.len() == 1 && !f[0].never && f[0].message.contains("covers no nvidia.com/gpu"));
        // A missing LocalQueue or ClusterQueue: suspended until it exists, a warning.
        assert!(!kueue("other", "ml", &o, &gpus(1), 1).unwrap()[0].never);
        let mut lone = Objects::default();
        lone.add_kueue_queue(
            json!({"kind": "LocalQueue", "metadata": {"name": "q", "namespace": "ml"},
            "spec": {"clusterQueue": "gone"}}),
        );
        let f = kueue("q", "ml", &lone, &gpus(1), 1).unwrap();
        assert!(!f[0].never && f[0].message.contains("\"gone\""), "{f:?}");
        // Queues not known at all: unknown, said as such by the caller.
        let e = kueue("q", "ml", &Objects::default(), &gpus(1), 1).unwrap_err();
        assert!(e.contains("LocalQueue"));
    }
}

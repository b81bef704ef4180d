//! tollgate's node feasibility held to the real kube-scheduler's verdict (issue 37, 6):
//! generated pools of nodes (extended resources: full GPUs, MIG slices, time-sliced
//! `nvidia.com/gpu.shared`; `gpu.product` and zone labels; the GPU taint and another
//! team's, `NoSchedule` and `NoExecute`) and generated pods (requests of cpu, memory and
//! each of those resources, some over every node; pod-level resources; an init container
//! and a native sidecar; `nodeSelector` and required node affinity on the labels;
//! tolerations of some taints). For each pod, on an idle pool: tollgate says it "can never
//! run" exactly where the scheduler leaves it `Unschedulable`, and otherwise the scheduler
//! binds it.
//!
//! On `envtest::scheduling_plane` (kube-scheduler v1.36 beside the apiserver): each seed is
//! a [`Pool`] of its own (its pods select its nodes and tolerate its pool taint), so that
//! no other test's nodes or pods change the verdict, and its pods are judged one at a time,
//! each deleted before the next, so the pool is idle for every one. tollgate judges the pod
//! as sent, through the engine's validating stage with that pool's Nodes as its cluster
//! context (`feasibility.mode: enforce`, validation in audit mode so that only feasibility
//! refuses).

use crate::common;

use common::context::Pool;
use common::rng::Rng;
use common::scheduling::{self, Placement};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::{json, Value};
use tollgate_core::{review_bytes_with, synthetic_review, Objects, Policy, Stage};

/// Pools generated (each with its nodes and pods).
const SEEDS: u64 = 40;
/// Pods judged per pool.
const PODS: usize = 6;

const PRODUCTS: [&str; 3] = ["A100-SXM4-80GB", "H100-80GB-HBM3", "Tesla-T4-SHARED"];
const ZONES: [&str; 2] = ["zone-a", "zone-b"];

/// A node of `pool`: one kind of GPU (or none), a product and a zone, the pool's taint and
/// some of the GPU taint and another team's.
fn gen_node(rng: &mut Rng, pool: &Pool, i: usize) -> Value {
    let name = format!("{}-n{i}", pool.name);
    let mut allocatable = json!({
        "cpu": *rng.pick(&["4", "16", "94"]),
        "memory": *rng.pick(&["16Gi", "256Gi", "1000Gi"]),
    });
    match rng.below(5) {
        0 => {}
        1 => allocatable["nvidia.com/gpu"] = json!(*rng.pick(&["1", "4", "8"])),
        2 => allocatable["nvidia.com/gpu.shared"] = json!("4"),
        3 => allocatable["nvidia.com/mig-1g.10gb"] = json!("7"),
        _ => {
            allocatable["nvidia.com/gpu"] = json!("8");
            allocatable["nvidia.com/mig-1g.10gb"] = json!("0");
        }
    }
    let labels = json!({
        "tollgate.test/pool": pool.name,
        "nvidia.com/gpu.product": *rng.pick(&PRODUCTS),
        "topology.kubernetes.io/zone": *rng.pick(&ZONES),
    });
    let mut taints = vec![json!({"key": "tollgate.test/pool", "value": pool.name,
        "effect": "NoSchedule"})];
    if rng.chance(60) {
        taints.push(json!({"key": "nvidia.com/gpu", "effect": "NoSchedule"}));
    }
    if rng.chance(20) {
        taints.push(json!({"key": "team", "value": "b",
            "effect": *rng.pick(&["NoSchedule", "NoExecute"])}));
    }
    scheduling::node(&name, labels, json!(taints), allocatable)
}

/// A container of some cpu, memory and GPU resource (requests, and limits equal for the
/// extended resources, as the apiserver requires).
fn gen_resources(rng: &mut Rng) -> Value {
    let mut requests = json!({
        // Mostly what some node offers, now and then more than any.
        "cpu": *rng.pick(&["500m", "500m", "2", "2", "8", "32", "200"]),
        "memory": *rng.pick(&["1Gi", "1Gi", "8Gi", "64Gi", "512Gi", "2000Gi"]),
    });
    let mut limits = json!({});
    let gpu = match rng.below(7) {
        0..=2 => None,
        3 => Some(("nvidia.com/gpu", *rng.pick(&["1", "2", "8", "9"]))),
        4 => Some(("nvidia.com/gpu.shared", *rng.pick(&["1", "5"]))),
        5 => Some(("nvidia.com/mig-1g.10gb", *rng.pick(&["1", "8"]))),
        _ => Some(("example.com/fpga", "1")),
    };
    if let Some((r, n)) = gpu {
        requests[r] = json!(n);
        limits[r] = json!(n);
    }
    json!({"requests": requests, "limits": limits})
}

/// A pod confined to `pool`, with some of: a selector or required affinity on the nodes'
/// labels, tolerations, an init container, a native sidecar, pod-level resources.
fn gen_pod(rng: &mut Rng, pool: &Pool, namespace: &str, name: &str) -> Value {
    let mut spec = json!({
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "trainer", "image": "registry.example.com/trainer:1.0",
            "resources": gen_resources(rng)}],
    });
    if rng.chance(25) {
        let mut init = json!({"name": "fetch", "image": "busybox",
            "resources": gen_resources(rng)});
        if rng.chance(50) {
            init["restartPolicy"] = json!("Always");
        }
        spec["initContainers"] = json!([init]);
    }
    if rng.chance(15) {
        // Pod-level requests, at least what the containers ask for together (the
        // apiserver refuses less): the containers' cpu and memory made small.
        spec["resources"] = json!({"requests": {
            "cpu": *rng.pick(&["8", "64"]), "memory": *rng.pick(&["64Gi", "1500Gi"])}});
        for list in ["containers", "initContainers"] {
            for c in spec[list].as_array_mut().into_iter().flatten() {
                c["resources"]["requests"]["cpu"] = json!("500m");
                c["resources"]["requests"]["memory"] = json!("1Gi");
            }
        }
    }
    if rng.chance(25) {
        spec["nodeSelector"] = json!({"nvidia.com/gpu.product": *rng.pick(&PRODUCTS)});
    }
    if rng.chance(30) {
        let (key, values): (&str, &[&str]) = if rng.chance(50) {
            ("nvidia.com/gpu.product", &PRODUCTS)
        } else {
            ("topology.kubernetes.io/zone", &ZONES)
        };
        spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": key,
                "operator": *rng.pick(&["In", "NotIn"]),
                "values": rng.some(values, 50)}]}]}}});
        // An empty value list is invalid for In and NotIn.
        if spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
            .as_array()
            .is_some_and(Vec::is_empty)
        {
            spec["affinity"] = Value::Null;
            spec.as_object_mut().unwrap().remove("affinity");
        }
    }
    let mut tolerations = vec![];
    if rng.chance(75) {
        tolerations.push(json!({"key": "nvidia.com/gpu", "operator": "Exists",
            "effect": "NoSchedule"}));
    }
    if rng.chance(25) {
        tolerations.push(json!({"key": "team", "operator": "Equal", "value": "b"}));
    }
    if !tolerations.is_empty() {
        spec["tolerations"] = json!(tolerations);
    }
    pool.confine(&mut spec);
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace}, "spec": spec})
}

/// tollgate's verdict on `pod` with `nodes` as the cluster's: the reasons it can never run
/// (empty: it may).
fn tollgate_says(policy: &Policy, nodes: &[Value], pod: &Value) -> String {
    let mut cluster = Objects::complete();
    for n in nodes {
        cluster.add_node(serde_json::from_value(n.clone()).unwrap());
    }
    let review = synthetic_review(pod, None, "alice", &[]);
    let body = serde_json::to_vec(&review).unwrap();
    let reviewed = review_bytes_with(Stage::Validate, policy, &cluster, &body).unwrap();
    let response = serde_json::to_value(&reviewed.response).unwrap();
    if response["allowed"] == true {
        String::new()
    } else {
        response["status"]["message"]
            .as_str()
            .unwrap_or("refused")
            .to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn can_never_run_exactly_where_the_scheduler_leaves_a_pod_unschedulable() {
    let Some(cp) = common::envtest::scheduling_plane() else {
        return;
    };
    let admin = cp.client("admin").await;
    let ns = cp.namespace("sched-agree", &[]).await;
    let policy = Policy::from_text(
        "scheduler_agrees",
        "validation:\n  mode: audit\nfeasibility:\n  mode: enforce\n",
    )
    .unwrap();
    let policy = &policy;
    let results = common::apiserver::each((0..SEEDS).collect(), |seed| {
        let admin = admin.clone();
        let ns = ns.clone();
        async move {
            let mut rng = Rng::new(seed);
            let pool = Pool::new(&format!("sa{seed}"));
            let nodes: Vec<Value> = (0..1 + rng.below(4))
                .map(|i| gen_node(&mut rng, &pool, i))
                .collect();
            for n in &nodes {
                scheduling::create_node(&admin, n).await;
            }
            let pods = Api::<Pod>::namespaced(admin.clone(), &ns);
            let mut out = vec![];
            for i in 0..PODS {
                let name = format!("sa{seed}-p{i}");
                let pod = gen_pod(&mut rng, &pool, &ns, &name);
                let says = tollgate_says(policy, &nodes, &pod);
                common::apiserver::create(&admin, &pod, false)
                    .await
                    .unwrap_or_else(|e| panic!("seed {seed}: creating {name}: {}", e.message));
                let placed = scheduling::placement(cp, &admin, &ns, &name).await;
                pods.delete(&name, &DeleteParams::default().grace_period(0))
                    .await
                    .unwrap();
                // Gone before the next: the pool idle for every pod.
                common::net::until(&format!("{name} deleted"), async || {
                    pods.get_opt(&name).await.unwrap().is_none()
                })
                .await;
                out.push((seed, pod, nodes.clone(), says, placed));
            }
            out
        }
    })
    .await;
    let mut failures = vec![];
    let (mut never, mut bound) = (0, 0);
    for (seed, pod, nodes, says, placed) in results.into_iter().flatten() {
        let agree = match &placed {
            Placement::Bound(_) => says.is_empty(),
            Placement::Unschedulable(_) => says.contains("can never run"),
        };
        match placed {
            Placement::Bound(_) => bound += 1,
            Placement::Unschedulable(_) => never += 1,
        }
        if !agree {
            failures.push(format!(
                "seed {seed}: the scheduler: {placed:?}; tollgate: {:?}\n  pod: {}\n  nodes: {}",
                if says.is_empty() { "may run" } else { &says },
                pod["spec"],
                serde_json::to_string(
                    &nodes
                        .iter()
                        .map(|n| json!({"labels": n["metadata"]["labels"],
                            "taints": n["spec"]["taints"],
                            "allocatable": n["status"]["allocatable"]}))
                        .collect::<Vec<_>>()
                )
                .unwrap()
            ));
        }
    }
    eprintln!(
        "scheduler_agrees: {bound} bound, {never} unschedulable, {} disagreements",
        failures.len()
    );
    // Both verdicts seen often enough to mean something.
    assert!(
        bound >= 10 && never >= 10,
        "bound {bound}, unschedulable {never}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

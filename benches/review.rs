//! The review path, without HTTP: parse the AdmissionReview, decide, compute the patch and
//! write the response (`review_bytes_with(..)` + `to_json()`), for every shared apiserver fixture
//! and for a large training pod built here.
//!
//! ```text
//! cargo bench --bench review                    # every case
//! cargo bench --bench review -- worker          # cases whose name contains "worker"
//! ```
//!
//! For instruction counts (stable on a busy machine), run one case in a plain loop under
//! callgrind instead of criterion:
//!
//! ```text
//! TOLLGATE_BENCH_LOOP=large.mutate:1000 valgrind --tool=callgrind \
//!     $(ls -t $CARGO_TARGET_DIR/release/deps/review-* | grep -v '\.d$' | head -1)
//! ```
//!
//! See benches/README.md.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, Criterion};
use serde_json::{json, Value};

use tollgate_core::{
    compose_policy, file_layer, review_bytes_with, Candidate, Objects, Policy, Stage, Stored,
};

/// The allocator of the tollgate binary (src/main.rs), so that times are the server's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The shipped policy, or the file `TOLLGATE_BENCH_POLICY` names (relative to the
/// repository), e.g. `benches/ten-profiles.yaml` for the cost of choosing a profile.
fn policy() -> Policy {
    let file = std::env::var("TOLLGATE_BENCH_POLICY").unwrap_or("policies/default.yaml".into());
    let path = root().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = file_layer(&path.display().to_string(), &text).expect("the policy loads");
    // `TOLLGATE_BENCH_OBJECTS=FILE`: TollgatePolicy and TollgateProfile objects composed over
    // it, as the server composes what it watches (e.g. benches/namespace-profiles.yaml).
    let stored: Vec<Stored> = match std::env::var("TOLLGATE_BENCH_OBJECTS") {
        Ok(objects_file) => {
            let path = root().join(objects_file);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let docs: Vec<serde_json::Value> =
                serde_saphyr::from_multiple(&text).expect("the objects read as YAML");
            docs.iter().map(Stored::from_object).collect()
        }
        Err(_) => vec![],
    };
    let candidate = |s| Candidate {
        stored: s,
        last_good: None,
    };
    let cluster = stored
        .iter()
        .find(|s| s.namespace.is_empty())
        .map(candidate);
    let profiles: Vec<_> = stored
        .iter()
        .filter(|s| !s.namespace.is_empty())
        .map(candidate)
        .collect();
    let composed = compose_policy(Some(&file), cluster, &profiles).expect("the policy loads");
    if let Some(s) = composed.statuses.iter().find(|s| !s.ready) {
        panic!("{}", s.message);
    }
    composed.policy
}

/// One benchmark case: a name, the endpoint it goes to and the request body.
struct Case {
    name: String,
    endpoint: Stage,
    body: Vec<u8>,
}

/// The shared apiserver fixtures, each sent to the endpoint its name says: as the file is,
/// and compact (`NAME.wire`).
fn fixture_cases() -> Vec<Case> {
    let dir = root().join("tests/fixtures/apiserver-v1.36");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("fixtures")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|file| {
            let name = file.trim_end_matches(".json").to_owned();
            let endpoint = if name.ends_with(".mutate") {
                Stage::Mutate
            } else {
                Stage::Validate
            };
            let body = std::fs::read(dir.join(&file)).unwrap();
            // The file as it is (pretty-printed for reading), and as the apiserver sends it
            // on the wire: compact.
            let v: Value = serde_json::from_slice(&body).unwrap();
            [
                Case {
                    name: format!("{name}.wire"),
                    endpoint,
                    body: serde_json::to_vec(&v).unwrap(),
                },
                Case {
                    name,
                    endpoint,
                    body,
                },
            ]
        })
        .flat_map(|pair| pair.into_iter().rev())
        .collect()
}

/// A large training pod: 8 containers and 3 init containers with 40 environment variables
/// and 10 volume mounts each, every container asking for a GPU and none with limits or
/// tolerations, so that every mutation step has work to do.
pub fn large_pod() -> Value {
    let container = |prefix: &str, i: usize| {
        let env: Vec<Value> = (0..40)
            .map(|e| json!({"name": format!("VAR_{e}"), "value": format!("value-{i}-{e}")}))
            .collect();
        let mounts: Vec<Value> = (0..10)
            .map(|m| json!({"name": format!("data-{m}"), "mountPath": format!("/data/{m}")}))
            .collect();
        json!({
            "name": format!("{prefix}-{i}"),
            "image": "registry.example.com/ml/resnet50-train:2.4",
            "imagePullPolicy": "IfNotPresent",
            "command": ["python", "-m", "train", "--epochs", "90"],
            "env": env,
            "volumeMounts": mounts,
            "resources": {"requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"}},
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File"
        })
    };
    let volumes: Vec<Value> = (0..10)
        .map(|m| json!({"name": format!("data-{m}"), "emptyDir": {}}))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "large-worker-",
            "namespace": "ml",
            "labels": {"app": "large"},
            "annotations": {"example.com/owner": "ml-platform"}
        },
        "spec": {
            "initContainers": (0..3).map(|i| container("init", i)).collect::<Vec<_>>(),
            "containers": (0..8).map(|i| container("worker", i)).collect::<Vec<_>>(),
            "volumes": volumes,
            "restartPolicy": "OnFailure",
            "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 30
        }
    })
}

fn large_cases() -> Vec<Case> {
    let review = tollgate::cli::synthetic_review(&large_pod(), Some("ml"), "alice", &[]);
    let body = serde_json::to_vec(&review).unwrap();
    vec![
        Case {
            name: "large.mutate".into(),
            endpoint: Stage::Mutate,
            body: body.clone(),
        },
        Case {
            name: "large.validate".into(),
            endpoint: Stage::Validate,
            body,
        },
    ]
}

/// A TrainJob in the shape of Kubeflow Trainer's examples (torch-distributed, 4 nodes,
/// one GPU each by resourcesPerNode, an env var, a runtime patch), as the compact CREATE
/// review the apiserver sends; its runtime is in [`context`].
pub fn trainjob() -> Value {
    json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "llama-finetune", "namespace": "ml"},
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
                "name": "torch-distributed"
            },
            "trainer": {
                "numNodes": 4,
                "command": ["torchrun", "--no-python", "python3", "train.py"],
                "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                "resourcesPerNode": {
                    "requests": {"cpu": "8", "memory": "64Gi"},
                    "limits": {"nvidia.com/gpu": "1"}
                }
            },
            "runtimePatches": [{
                "manager": "example.io/platform-team",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                    "name": "node",
                    "template": {"spec": {"template": {"spec": {
                        "nodeSelector": {"node-type": "training"}
                    }}}}
                }]}}}
            }]
        }
    })
}

fn trainjob_cases() -> Vec<Case> {
    let review = tollgate::cli::synthetic_review(&trainjob(), Some("ml"), "alice", &[]);
    let body = serde_json::to_vec(&review).unwrap();
    vec![
        Case {
            name: "trainjob.mutate".into(),
            endpoint: Stage::Mutate,
            body: body.clone(),
        },
        Case {
            name: "trainjob.validate".into(),
            endpoint: Stage::Validate,
            body,
        },
    ]
}

fn cases() -> Vec<Case> {
    let mut v = fixture_cases();
    v.extend(large_cases());
    v.extend(trainjob_cases());
    v
}

/// The cluster context of the fixtures: the claim template `dra-trainer` names, the
/// fixtures' namespaces and the TrainJob's runtime (Trainer's shipped torch-distributed),
/// as the server's caches would hold them. Pods without claims, and
/// policies without namespace-label profiles, never look at it.
fn context() -> Objects {
    let mut o = Objects::default();
    for ns in ["ml", "ml-cap2-1796114155"] {
        o.add_namespace(
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "labels": {
                    "kubernetes.io/metadata.name": ns, "tollgate.dev/enforce": "enabled"
                }}
            }))
            .expect("a Namespace"),
        );
    }
    o.add_template(
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "two-gpus", "namespace": "ml-cap2-1796114155"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}
            ]}}}
        }))
        .expect("a ResourceClaimTemplate"),
    );
    o.add_training_runtime(json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch-distributed", "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {"replicatedJobs": [{
                "name": "node",
                "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                    "spec": {"template": {"spec": {"containers": [{
                        "name": "node",
                        "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
                    }]}}}
                }
            }]}}
        }
    }));
    if let Some(n) = std::env::var("TOLLGATE_BENCH_NODES")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    {
        feasibility_context(&mut o, n);
    }
    o
}

/// What feasibility compares pods with, for `TOLLGATE_BENCH_NODES=N`: N nodes in four
/// pools (8-GPU A100s tainted for GPUs, 4-GPU L4s, MIG-partitioned A100s, CPU nodes), each
/// node with its own name and hostname, and a ResourceQuota in every namespace of the
/// fixtures, with a use of it, so that every pod is held to a quota and the nodes.
fn feasibility_context(o: &mut Objects, n: usize) {
    let pools = [
        (
            "a100",
            json!({"cpu": "94", "memory": "1000Gi", "nvidia.com/gpu": "8", "pods": "110"}),
            json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
        ),
        (
            "l4",
            json!({"cpu": "46", "memory": "180Gi", "nvidia.com/gpu": "4", "pods": "110"}),
            json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
        ),
        (
            "mig",
            json!({"cpu": "94", "memory": "1000Gi", "nvidia.com/mig-1g.10gb": "56", "pods": "110"}),
            json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
        ),
        (
            "cpu",
            json!({"cpu": "62", "memory": "250Gi", "pods": "110"}),
            json!([]),
        ),
    ];
    let nodes: Vec<k8s_openapi::api::core::v1::Node> = (0..n)
        .map(|i| {
            let (pool, allocatable, taints) = &pools[i % pools.len()];
            let name = format!("{pool}-{i}");
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "pool": pool,
                    "topology.kubernetes.io/zone": "zone-a", "kubernetes.io/os": "linux"
                }},
                "spec": {"taints": taints},
                "status": {"allocatable": allocatable}
            }))
            .expect("a Node")
        })
        .collect();
    o.set_nodes(tollgate_core::Nodes::of(&nodes));
    for ns in ["ml", "ml-cap2-1796114155", "default"] {
        o.add_quota(
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "team-quota", "namespace": ns},
                "spec": {"hard": {"requests.cpu": "400", "requests.memory": "4Ti",
                    "requests.nvidia.com/gpu": "64", "pods": "500"}},
                "status": {"used": {"requests.cpu": "100", "requests.memory": "1Ti",
                    "requests.nvidia.com/gpu": "16", "pods": "40"}}
            }))
            .expect("a ResourceQuota"),
        );
    }
}

/// Everything the server does for one review between reading the body and writing it.
fn review_once(policy: &Policy, cluster: &Objects, case: &Case) -> Vec<u8> {
    let reviewed =
        review_bytes_with(case.endpoint, policy, cluster, black_box(&case.body)).expect("a review");
    reviewed.to_json()
}

fn bench_review(c: &mut Criterion) {
    let policy = policy();
    let cluster = context();
    let mut group = c.benchmark_group("review");
    for case in cases() {
        // The large mutate case must really run every step: its patch touches every part.
        if case.name == "large.mutate" {
            let r = review_bytes_with(case.endpoint, &policy, &cluster, &case.body).unwrap();
            assert_eq!(
                r.steps().len(),
                tollgate_core::Step::ALL.len(),
                "the large pod must go through every mutation step: {:?}",
                r.steps()
            );
        }
        // The DRA fixture must be read through its claim template, as the server would.
        if case.name.starts_with("dra-trainer.mutate") {
            let r = review_bytes_with(case.endpoint, &policy, &cluster, &case.body).unwrap();
            assert!(
                r.steps().contains(&tollgate_core::Step::Tolerations),
                "dra-trainer gets its GPU toleration through the template: {:?}",
                r.steps()
            );
        }
        // The TrainJob must be judged by its runtime's node step, known from the context.
        if case.name == "trainjob.validate" {
            let r = review_bytes_with(case.endpoint, &policy, &cluster, &case.body).unwrap();
            let judged: Vec<_> = r.templates().iter().map(|t| t.decision).collect();
            assert_eq!(judged, ["allowed"], "the TrainJob's node step is judged");
            assert!(r.unresolved.is_empty(), "its runtime is in the context");
        }
        group.bench_function(&case.name, |b| {
            b.iter(|| review_once(&policy, &cluster, &case))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = bench_review
}

/// `TOLLGATE_BENCH_LOOP=NAME:N` runs case NAME N times and exits, for callgrind or perf.
fn plain_loop(spec: &str) {
    let (name, n) = spec.split_once(':').unwrap_or((spec, "1000"));
    let n: u64 = n.parse().expect("TOLLGATE_BENCH_LOOP=NAME:COUNT");
    let policy = policy();
    let cluster = context();
    let all = cases();
    let case = all.iter().find(|c| c.name == name).unwrap_or_else(|| {
        let names: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
        panic!("no case {name:?}; cases: {names:?}")
    });
    let mut bytes = 0usize;
    for _ in 0..n {
        bytes += black_box(review_once(&policy, &cluster, case)).len();
    }
    println!("{name}: {n} reviews, {bytes} response bytes");
}

fn main() {
    if let Ok(spec) = std::env::var("TOLLGATE_BENCH_LOOP") {
        plain_loop(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

//! Feasibility from the server's cluster context, against the apiserver stand-in: nodes,
//! quotas and DeviceClasses arriving by watch change the answer of a review; a relabelled
//! node changes it; what the cluster does not serve (no DRA) or the RBAC forbids (403)
//! neither holds readiness nor refuses; a cluster serving DRA as `v1beta1` only has its
//! claims read as v1; the background audit reads the same caches.
//!
//! `memory_of_5000_nodes` (ignored) measures what the caches cost a real `tollgate serve`.

use crate::common;

use std::time::{Duration, Instant};

use apiserver::{ApiServer, Fault, ResourceType, Verb};
use common::net::{self, metric, ready, until, warnings, Client, TestServer};
use serde_json::{json, Value};
use tollgate::server::{AuditOptions, ClusterOptions};
use tollgate_apiserver_standin as apiserver;

const NS: &str = "ml";

const ENFORCE: &str = "feasibility:\n  mode: enforce\n";

fn kubeconfig(api: &ApiServer) -> std::path::PathBuf {
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    api.write_kubeconfig(kubeconfig.path()).unwrap();
    kubeconfig.into_temp_path().keep().unwrap()
}

/// A server watching `api`, under `policy`, once that policy is in force.
async fn server_against(
    api: &ApiServer,
    policy: &str,
    tweak: impl FnOnce(&mut tollgate::server::ServeOptions),
) -> TestServer {
    let path = kubeconfig(api);
    let server = net::start(|o| {
        o.cluster = Some(ClusterOptions {
            kubeconfig: Some(path),
            context: None,
            fetch_timeout: Duration::from_millis(800),
        });
        tweak(o);
    })
    .await;
    std::fs::write(server.policy_path(), policy).unwrap();
    until("the policy in force", async || {
        let reloads = [("result", "success")];
        metric(&server, "tollgate_policy_reloads_total", &reloads).await >= Some(1.0)
    })
    .await;
    server
}

async fn client(server: &TestServer) -> Client {
    Client::connect(server.addr(), &server.ca_pem, false).await
}

/// A node of `gpus` GPUs, tainted for GPU pods, with `labels` besides its hostname.
fn node(name: &str, gpus: &str, labels: Value) -> Value {
    let mut l = json!({"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "A100-SXM4-80GB"});
    l.as_object_mut()
        .unwrap()
        .extend(labels.as_object().unwrap().clone());
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": l},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "94", "memory": "1000Gi", "nvidia.com/gpu": gpus, "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True",
                "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]
        }
    })
}

/// A GPU pod asking for `gpus` GPUs (and tolerating the GPU taint), with `spec` merged in.
fn gpu_pod(name: &str, gpus: &str, spec: Value) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "trainer", "image": "registry.example.com/trainer:1.0",
                "resources": {
                    "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": gpus},
                    "limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": gpus}}}]
        }
    });
    p["spec"]
        .as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    p
}

/// `/validate` of a CREATE of `pod` by alice.
async fn validate(c: &mut Client, pod: &Value) -> Value {
    let review = tollgate_core::pipeline::synthetic_review(pod, None, "alice", &[]);
    let (status, bytes) = c
        .post("/validate", serde_json::to_vec(&review).unwrap())
        .await;
    assert_eq!(status, 200);
    let mut v: Value = serde_json::from_slice(&bytes).unwrap();
    v["response"].take()
}

fn refusal(response: &Value) -> &str {
    response["status"]["message"].as_str().unwrap_or("")
}

/// Before the nodes are listed, a 9-GPU pod is allowed with a warning; once nodes of 8 GPUs
/// arrive by the watch it is refused; a 16-GPU node arriving lets it in again. No review
/// lists or gets a node.
#[tokio::test]
async fn nodes_arriving_by_watch_change_the_answer() {
    let api = ApiServer::start().await;
    // The nodes cannot be listed for now: the server serves, not ready, and knows no node.
    api.inject(Fault::status(503).on("nodes", Verb::List));
    let server = server_against(&api, ENFORCE, |_| {}).await;
    let mut c = client(&server).await;
    let (status, text) = ready(&mut c).await;
    assert_eq!(status, 503);
    assert!(text.contains("nodes"), "{text}");
    let nine = gpu_pod("nine", "9", json!({}));
    let r = validate(&mut c, &nine).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(
        warnings(&r).contains("was not checked against the cluster's nodes"),
        "{r}"
    );

    api.clear_faults();
    until("the nodes listed", async || ready(&mut c).await.0 == 200).await;
    let lists = api.count(Verb::List, "nodes");
    for i in 0..3 {
        api.insert("nodes", node(&format!("gpu-{i}"), "8", json!({})));
    }
    until("the nodes by the watch", async || {
        validate(&mut c, &nine).await["allowed"] == false
    })
    .await;
    let r = validate(&mut c, &nine).await;
    assert!(
        refusal(&r).contains(
            "it asks for 9 nvidia.com/gpu, and the largest of the 3 nodes it may use offers 8"
        ),
        "{r}"
    );
    assert_eq!(
        metric(
            &server,
            "tollgate_cluster_cache_objects",
            &[("resource", "nodes")]
        )
        .await,
        Some(3.0)
    );

    api.insert("nodes", node("gpu-big", "16", json!({})));
    until("the big node by the watch", async || {
        validate(&mut c, &nine).await["allowed"] == true
    })
    .await;
    assert_eq!(api.count(Verb::List, "nodes"), lists, "no relist");
    assert_eq!(api.count(Verb::Get, "nodes"), 0);
    server.running.shutdown().await;
}

/// A pod whose nodeSelector asks for a GPU product no node has is refused, naming what the
/// nodes have; once a node is relabelled to that product, it is allowed. A cordon takes
/// the node out again.
#[tokio::test]
async fn a_relabelled_node_changes_the_answer() {
    let api = ApiServer::start().await;
    for i in 0..2 {
        api.insert("nodes", node(&format!("gpu-{i}"), "8", json!({})));
    }
    let server = server_against(&api, ENFORCE, |_| {}).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let h100 = gpu_pod(
        "h100",
        "8",
        json!({"nodeSelector": {"nvidia.com/gpu.product": "H100-SXM5-80GB"}}),
    );
    let r = validate(&mut c, &h100).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        refusal(&r).contains("the nodes have nvidia.com/gpu.product: A100-SXM4-80GB (2 nodes)"),
        "{r}"
    );

    // A heartbeat changes nothing.
    api.modify("nodes", None, "gpu-1", |n| {
        n["status"]["conditions"][0]["lastHeartbeatTime"] = json!("2026-01-01T00:00:10Z");
    })
    .unwrap();
    api.modify("nodes", None, "gpu-1", |n| {
        n["metadata"]["labels"]["nvidia.com/gpu.product"] = json!("H100-SXM5-80GB");
    })
    .unwrap();
    until("the relabelled node", async || {
        validate(&mut c, &h100).await["allowed"] == true
    })
    .await;

    api.modify("nodes", None, "gpu-1", |n| {
        n["spec"]["unschedulable"] = json!(true);
    })
    .unwrap();
    until("the cordon", async || {
        validate(&mut c, &h100).await["allowed"] == false
    })
    .await;
    server.running.shutdown().await;
}

/// A quota added to the namespace makes a pod over it refused; raised, it is allowed.
#[tokio::test]
async fn a_quota_added_makes_a_pod_refused() {
    let api = ApiServer::start().await;
    api.insert("nodes", node("gpu-0", "16", json!({})));
    let server = server_against(&api, ENFORCE, |_| {}).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let nine = gpu_pod("nine", "9", json!({}));
    assert_eq!(validate(&mut c, &nine).await["allowed"], true);

    let quota = |gpus: &str| {
        json!({"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "gpu-quota", "namespace": NS},
            "spec": {"hard": {"requests.nvidia.com/gpu": gpus}},
            "status": {"hard": {"requests.nvidia.com/gpu": gpus},
                "used": {"requests.nvidia.com/gpu": "0"}}})
    };
    api.insert("resourcequotas", quota("8"));
    until("the quota by the watch", async || {
        validate(&mut c, &nine).await["allowed"] == false
    })
    .await;
    let r = validate(&mut c, &nine).await;
    assert!(
        refusal(&r).contains(
            "quota \"gpu-quota\" of namespace \"ml\" allows requests.nvidia.com/gpu: 8, and the pod asks for 9"
        ),
        "{r}"
    );
    // Another namespace's pod is not held to it.
    let mut elsewhere = nine.clone();
    elsewhere["metadata"]["namespace"] = json!("other");
    assert_eq!(validate(&mut c, &elsewhere).await["allowed"], true);

    api.insert("resourcequotas", quota("16"));
    until("the raised quota", async || {
        validate(&mut c, &nine).await["allowed"] == true
    })
    .await;
    server.running.shutdown().await;
}

/// Kueue's queues, served as `kueue.x-k8s.io/v1beta2` (as Kueue 0.14 and later serve them).
fn kueue() -> Vec<ResourceType> {
    vec![
        ResourceType::new(
            "kueue.x-k8s.io",
            "v1beta2",
            "localqueues",
            "LocalQueue",
            true,
        ),
        ResourceType::new(
            "kueue.x-k8s.io",
            "v1beta2",
            "clusterqueues",
            "ClusterQueue",
            false,
        ),
    ]
}

/// A PyTorchJob of 4 workers with 4 GPUs each, submitted to LocalQueue `team-a`.
fn queued_job() -> Value {
    let worker = json!({"replicas": 4, "restartPolicy": "OnFailure", "template": {"spec": {
        "containers": [{"name": "pytorch", "image": "registry.example.com/llm:2.3",
            "resources": {
                "requests": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "4"},
                "limits": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "4"}}}]}}});
    json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "llm-pretrain", "namespace": NS,
            "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": worker}}})
}

/// Kueue's queues arrive by the watch, in the version the cluster serves: a workload
/// naming a LocalQueue not there yet is allowed with a warning; once its ClusterQueue of
/// 8 GPUs is there, the 16-GPU job is refused as a whole (not held to the namespace's
/// ResourceQuota, which would let it in); a cohort with room to borrow lets it in again.
/// A cluster without Kueue holds nothing up and says nothing of it.
#[tokio::test]
async fn kueue_queues_arriving_by_watch_hold_a_workload_to_its_cluster_queue() {
    let api = ApiServer::builder()
        .resources(ResourceType::defaults())
        .resources(kueue())
        .start()
        .await;
    api.insert(
        "resourcequotas",
        json!({"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "roomy", "namespace": NS},
            "spec": {"hard": {"requests.nvidia.com/gpu": "64"}}}),
    );
    let server = server_against(&api, ENFORCE, |_| {}).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let job = queued_job();
    let r = validate(&mut c, &job).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(warnings(&r).contains("team-a"), "{r}");

    let cq = |spec: Value| {
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": "team-a"}, "spec": spec,
            "status": {"pendingWorkloads": 2}})
    };
    let gpus = |nominal: &str, borrowing: Option<&str>| {
        let mut r = json!({"name": "nvidia.com/gpu", "nominalQuota": nominal});
        if let Some(b) = borrowing {
            r["borrowingLimit"] = json!(b);
        }
        json!([{"coveredResources": ["nvidia.com/gpu"],
            "flavors": [{"name": "a100", "resources": [r]}]}])
    };
    api.insert(
        "localqueues",
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "team-a", "namespace": NS},
            "spec": {"clusterQueue": "team-a"}}),
    );
    api.insert(
        "clusterqueues",
        cq(json!({"resourceGroups": gpus("8", None)})),
    );
    until("the queues by the watch", async || {
        validate(&mut c, &job).await["allowed"] == false
    })
    .await;
    let r = validate(&mut c, &job).await;
    assert!(refusal(&r).contains("team-a"), "{r}");
    assert!(refusal(&r).contains("16"), "{r}");

    api.insert(
        "clusterqueues",
        cq(json!({"cohortName": "research", "resourceGroups": gpus("8", Some("8"))})),
    );
    until("the cohort by the watch", async || {
        validate(&mut c, &job).await["allowed"] == true
    })
    .await;
    let metrics = [("resource", "clusterqueues")];
    assert!(metric(&server, "tollgate_cluster_cache_objects", &metrics).await >= Some(1.0));
    server.running.shutdown().await;

    // No Kueue: the namespace's quota decides, and no series is kept of the queues.
    let bare = ApiServer::start().await;
    let server = server_against(&bare, ENFORCE, |_| {}).await;
    let mut c = client(&server).await;
    until("ready without Kueue", async || ready(&mut c).await.0 == 200).await;
    let r = validate(&mut c, &job).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(!warnings(&r).contains("team-a"), "{r}");
    assert_eq!(
        metric(&server, "tollgate_cluster_cache_objects", &metrics).await,
        None
    );
    server.running.shutdown().await;
}

/// The dra-trainer fixture's pod, in `NS`, its claim naming template `two-gpus`.
fn dra_pod() -> Value {
    let v: Value = serde_json::from_slice(&common::fixture("dra-trainer.mutate.json")).unwrap();
    let mut pod = v["request"]["object"].clone();
    pod["metadata"]["namespace"] = json!(NS);
    pod
}

fn template(api_version: &str, class: &str) -> Value {
    let request = if api_version.ends_with("v1beta1") {
        json!({"name": "gpus", "deviceClassName": class, "count": 2})
    } else {
        json!({"name": "gpus", "exactly": {"deviceClassName": class, "count": 2}})
    };
    json!({"apiVersion": api_version, "kind": "ResourceClaimTemplate",
        "metadata": {"name": "two-gpus", "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [request]}}}})
}

fn device_class(api_version: &str, name: &str) -> Value {
    json!({"apiVersion": api_version, "kind": "DeviceClass", "metadata": {"name": name}})
}

/// A DRA pod whose claim names a DeviceClass the cluster lacks is refused; once the class
/// is created, it is allowed.
#[tokio::test]
async fn a_device_class_added_makes_a_dra_pod_allowed() {
    let api = ApiServer::start().await;
    api.insert(
        "resourceclaimtemplates",
        template("resource.k8s.io/v1", "gpu.nvidia.com"),
    );
    api.insert(
        "deviceclasses",
        device_class("resource.k8s.io/v1", "mig.nvidia.com"),
    );
    let server = server_against(&api, ENFORCE, |_| {}).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let pod = dra_pod();
    let r = validate(&mut c, &pod).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        refusal(&r)
            .contains("asks for DeviceClass \"gpu.nvidia.com\", which the cluster does not have"),
        "{r}"
    );
    api.insert(
        "deviceclasses",
        device_class("resource.k8s.io/v1", "gpu.nvidia.com"),
    );
    until("the class by the watch", async || {
        validate(&mut c, &pod).await["allowed"] == true
    })
    .await;
    server.running.shutdown().await;
}

/// A 1.33 cluster: DRA served as `resource.k8s.io/v1beta1` only. Discovery finds it, the
/// claim templates and DeviceClasses are watched in it and read as v1 (the pod gets its
/// GPU toleration), and a template the watch has not delivered is fetched in it.
#[tokio::test]
async fn a_cluster_serving_dra_v1beta1_only() {
    let api = ApiServer::builder()
        .resources(ResourceType::defaults_with_dra("v1beta1"))
        .start()
        .await;
    api.insert(
        "resourceclaimtemplates",
        template("resource.k8s.io/v1beta1", "gpu.nvidia.com"),
    );
    api.insert(
        "deviceclasses",
        device_class("resource.k8s.io/v1beta1", "gpu.nvidia.com"),
    );
    let server = server_against(&api, ENFORCE, |_| {}).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let review = |pod: &Value, uid: &str| {
        let mut r = tollgate_core::pipeline::synthetic_review(pod, None, "alice", &[]);
        r["request"]["uid"] = json!(uid);
        serde_json::to_vec(&r).unwrap()
    };
    let gets_toleration = async |c: &mut Client, pod: &Value, uid: &str| {
        let (status, bytes) = c.post("/mutate", review(pod, uid)).await;
        assert_eq!(status, 200);
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        use base64::Engine as _;
        let patch = base64::engine::general_purpose::STANDARD
            .decode(v["response"]["patch"].as_str().unwrap_or(""))
            .unwrap();
        String::from_utf8_lossy(&patch).contains("nvidia.com/gpu")
    };
    let pod = dra_pod();
    assert!(gets_toleration(&mut c, &pod, "a").await);
    assert_eq!(validate(&mut c, &pod).await["allowed"], true);
    assert_eq!(
        api.count(Verb::Get, "resourceclaimtemplates"),
        0,
        "from the cache"
    );
    assert!(api
        .requests_for(Verb::Watch, "resourceclaimtemplates")
        .iter()
        .all(|r| r.path.contains("/apis/resource.k8s.io/v1beta1/")));

    // One the watch has not delivered: fetched once, in v1beta1.
    api.inject(Fault::delay(Duration::from_secs(30)).on("resourceclaimtemplates", Verb::Watch));
    api.break_watches();
    let mut fresh = template("resource.k8s.io/v1beta1", "gpu.nvidia.com");
    fresh["metadata"]["name"] = json!("fresh");
    api.insert("resourceclaimtemplates", fresh);
    let mut pod = dra_pod();
    pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = json!("fresh");
    assert!(gets_toleration(&mut c, &pod, "b").await);
    assert_eq!(api.count(Verb::Get, "resourceclaimtemplates"), 1);
    api.clear_faults();
    server.running.shutdown().await;
}

/// What the cluster does not serve (no DRA at all) and what the RBAC forbids (nodes,
/// quotas) hold neither readiness nor a pod: feasibility says nothing of them. The
/// forbidden caches keep their series (synced 0, the stale alert's age growing); the
/// resources not served have none.
#[tokio::test]
async fn what_is_forbidden_or_not_served_holds_nothing_up() {
    let api = ApiServer::builder()
        .resources(
            ResourceType::defaults()
                .into_iter()
                .filter(|r| r.group != "resource.k8s.io"),
        )
        .start()
        .await;
    api.inject(Fault::status(403).on("nodes", Verb::List));
    api.inject(Fault::status(403).on("resourcequotas", Verb::List));
    let server = server_against(&api, ENFORCE, |_| {}).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let r = validate(&mut c, &gpu_pod("nine", "9", json!({}))).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert_eq!(warnings(&r), "", "nothing said of what is not known: {r}");
    let text = net::get_metrics(server.running.metrics_addr.unwrap()).await;
    let samples = common::scrape::parse(&text);
    let synced = |resource: &str| {
        common::scrape::value(
            &samples,
            "tollgate_cluster_cache_synced",
            &[("resource", resource)],
        )
    };
    assert_eq!(synced("nodes"), Some(0.0));
    assert_eq!(synced("resourcequotas"), Some(0.0));
    assert_eq!(synced("namespaces"), Some(1.0));
    for absent in ["resourceclaims", "resourceclaimtemplates", "deviceclasses"] {
        assert_eq!(synced(absent), None, "{absent} is not served");
    }
    // Granted later: picked up without a restart.
    api.clear_faults();
    api.insert("nodes", node("gpu-0", "8", json!({})));
    until("the nodes once allowed", async || {
        validate(&mut c, &gpu_pod("nine", "9", json!({}))).await["allowed"] == false
    })
    .await;
    server.running.shutdown().await;
}

/// The background audit judges in the server's caches: a Pending pod of 9 GPUs where the
/// nodes offer 8 fails the feasibility rule in its namespace's PolicyReport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_audit_reports_what_can_never_run() {
    let api = ApiServer::start().await;
    api.insert(
        "namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
    );
    for i in 0..2 {
        api.insert("nodes", node(&format!("gpu-{i}"), "8", json!({})));
    }
    let mut nine = gpu_pod("nine", "9", json!({}));
    nine["status"] = json!({"phase": "Pending"});
    api.insert("pods", nine);
    let path = kubeconfig(&api);
    let server = server_against(&api, "# the built-in policy\n", |o| {
        let mut a = AuditOptions::new(Duration::from_millis(100));
        a.rate = 0;
        a.kubeconfig = Some(path.clone());
        o.audit = Some(a);
    })
    .await;
    let mut found = None;
    until("the feasibility finding in the report", async || {
        found = api
            .get("policyreports", Some(NS), "tollgate")
            .and_then(|r| {
                r["results"]
                    .as_array()?
                    .iter()
                    .find(|x| x["rule"] == "feasibility")
                    .cloned()
            });
        found.is_some()
    })
    .await;
    let f = found.unwrap();
    assert_eq!(f["result"], "fail", "{f}");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .contains("can never run: no node can run it: it asks for 9 nvidia.com/gpu"),
        "{f}"
    );
    // From the caches: the audit listed no node itself, only the watch did, once.
    assert_eq!(api.count(Verb::List, "nodes"), 1);
    server.running.shutdown().await;
}

/// A node as a kubelet keeps it, about 6 KB of JSON: labels, taints, addresses, images,
/// conditions, managedFields. Its shape is one of 20: five pools in four zones.
fn realistic_node(i: usize) -> Value {
    let pools = [
        ("a100", "p4d.24xlarge", "NVIDIA-A100-SXM4-80GB", "8"),
        ("h100", "p5.48xlarge", "NVIDIA-H100-80GB-HBM3", "8"),
        ("l4", "g6.12xlarge", "NVIDIA-L4", "4"),
        ("t4", "g4dn.12xlarge", "Tesla-T4", "4"),
        ("cpu", "m7i.16xlarge", "", "0"),
    ];
    let (pool, instance, product, gpus) = pools[i % pools.len()];
    let zone = format!("us-east-1{}", ["a", "b", "c", "d"][(i / pools.len()) % 4]);
    let name = format!(
        "ip-10-{}-{}-{}.ec2.internal",
        i / 65536,
        (i / 256) % 256,
        i % 256
    );
    let mut labels = json!({
        "kubernetes.io/hostname": name, "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/instance-type": instance, "node.kubernetes.io/instance-type": instance,
        "topology.kubernetes.io/region": "us-east-1", "topology.kubernetes.io/zone": zone,
        "failure-domain.beta.kubernetes.io/region": "us-east-1",
        "failure-domain.beta.kubernetes.io/zone": zone,
        "eks.amazonaws.com/nodegroup": format!("{pool}-pool"),
        "eks.amazonaws.com/capacityType": "ON_DEMAND", "pool": pool,
    });
    let mut allocatable = json!({"cpu": "95690m", "memory": "1043000Mi",
        "ephemeral-storage": "1073741824k", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
        "pods": "110"});
    let mut taints = json!([]);
    if gpus != "0" {
        labels["nvidia.com/gpu.product"] = json!(product);
        labels["nvidia.com/gpu.count"] = json!(gpus);
        labels["nvidia.com/gpu.present"] = json!("true");
        allocatable["nvidia.com/gpu"] = json!(gpus);
        taints = json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]);
    }
    let images: Vec<Value> = (0..25)
        .map(|k| {
            json!({"names": [
                format!("602401143452.dkr.ecr.us-east-1.amazonaws.com/eks/image-{k}@sha256:{:064x}", k * 7919 + i),
                format!("602401143452.dkr.ecr.us-east-1.amazonaws.com/eks/image-{k}:v1.{k}.0-eksbuild.1")
            ], "sizeBytes": 100_000_000 + k})
        })
        .collect();
    let conditions: Vec<Value> = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        .iter()
        .map(|t| {
            json!({"type": t, "status": if *t == "Ready" { "True" } else { "False" },
                "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "reason": format!("Kubelet{t}"), "message": format!("kubelet reports {t}")})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels,
            "annotations": {"alpha.kubernetes.io/provided-node-ip": "10.0.0.1",
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}, "f:images": {}}}}]},
        "spec": {"providerID": format!("aws:///{zone}/i-{i:017x}"), "taints": taints},
        "status": {
            "capacity": allocatable.clone(), "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name}, {"type": "InternalDNS", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}"),
                "bootID": format!("{i:036x}"), "kernelVersion": "6.1.119-129.201.amzn2023.x86_64",
                "osImage": "Amazon Linux 2023.6.20241212", "containerRuntimeVersion": "containerd://1.7.23",
                "kubeletVersion": "v1.36.0-eks-0000000", "kubeProxyVersion": "v1.36.0-eks-0000000",
                "operatingSystem": "linux", "architecture": "amd64"},
            "images": images
        }
    })
}

/// A `tollgate serve` process, once ready, and its memory then.
struct Measured {
    served: common::process::Served,
    rss_kib: u64,
    hwm_kib: u64,
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Clock ticks of CPU the process has used (utime + stime).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Starts `tollgate serve` (`TOLLGATE_BIN`, else this build's), with the cluster context
/// on `api` or off, waits for it to be ready and for its memory to settle, and reads it.
async fn serve_measured(api: Option<&ApiServer>) -> Measured {
    let (dir, ca_pem) = common::process::workdir();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut extra = vec!["--cluster-context".to_owned()];
    match api {
        Some(api) => {
            api.write_kubeconfig(&kubeconfig).unwrap();
            extra.extend([
                "on".into(),
                "--kubeconfig".into(),
                kubeconfig.display().to_string(),
            ]);
        }
        None => extra.push("off".into()),
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let served = common::process::serve(dir, ca_pem, None, "json", &extra);
    let mut c = Client::connect(served.addr, &served.ca_pem, false).await;
    until("tollgate serve ready", async || {
        ready(&mut c).await.0 == 200
    })
    .await;
    drop(c);
    // Settled: the lists are dropped, the allocator has given back what it gives back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = served.pid();
    Measured {
        rss_kib: status_kib(pid, "VmRSS:"),
        hwm_kib: status_kib(pid, "VmHWM:"),
        served,
    }
}

/// Waits until the process has used no CPU for a second; the ticks it used till then.
async fn until_idle(pid: u32) -> u64 {
    let start = cpu_ticks(pid);
    let mut last = start;
    let mut quiet = 0;
    while quiet < 5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = cpu_ticks(pid);
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
    }
    last - start
}

/// The figures: `tollgate serve`'s RSS once ready, with the cluster context off,
/// on (against an empty cluster), and on with 5,000 nodes of 20 shapes (each node about
/// 9 KB of JSON, as a kubelet keeps it); then every node's heartbeat rewritten once (the
/// shapes unchanged), with the CPU that cost and the RSS after. The nodes must cost within
/// 10 MiB, at ready and after. A release build is what the figures in docs/operations.md
/// are of: `TOLLGATE_BIN=target/release/tollgate cargo test --test integration feasibility_context::memory --
/// --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn memory_of_5000_nodes() {
    let mib = |kib: u64| kib as f64 / 1024.0;
    let off = serve_measured(None).await;
    eprintln!(
        "cluster context off: VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        mib(off.rss_kib),
        mib(off.hwm_kib)
    );
    drop(off);
    let empty = ApiServer::start().await;
    let on = serve_measured(Some(&empty)).await;
    eprintln!(
        "cluster context on, no node: VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        mib(on.rss_kib),
        mib(on.hwm_kib)
    );
    let on_rss = on.rss_kib;
    drop(on);

    let api = ApiServer::start().await;
    let n = 5_000;
    api.insert_many("nodes", (0..n).map(realistic_node));
    let bytes: usize = serde_json::to_vec(&realistic_node(0)).unwrap().len();
    let with = serve_measured(Some(&api)).await;
    eprintln!(
        "cluster context on, {n} nodes of 20 shapes ({bytes} bytes of JSON each): VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        mib(with.rss_kib),
        mib(with.hwm_kib)
    );
    let pid = with.served.pid();
    until_idle(pid).await;
    let before = cpu_ticks(pid);
    let names: Vec<String> = api
        .objects("nodes")
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    let started = Instant::now();
    for name in &names {
        api.modify("nodes", None, name, |n| {
            n["status"]["conditions"][3]["lastHeartbeatTime"] = json!("2026-01-01T00:00:40Z");
        });
    }
    until_idle(pid).await;
    let ticks = cpu_ticks(pid) - before;
    let after = status_kib(pid, "VmRSS:");
    eprintln!(
        "{n} heartbeats ({:?} to write): {ticks} CPU ticks ({:.0} µs each); VmRSS after {:.1} MiB, VmHWM {:.1} MiB",
        started.elapsed(),
        ticks as f64 * 10_000.0 / n as f64,
        mib(after),
        mib(status_kib(pid, "VmHWM:"))
    );
    // Run as the image runs it (`MIMALLOC_PURGE_DELAY=0`, see the Dockerfile): without it,
    // the pages the first list passed through stay in the RSS of the worker threads that
    // freed them until those allocate again (56 MiB more at ready in a release build).
    assert!(
        with.rss_kib < on_rss + 10 * 1024 && after < on_rss + 10 * 1024,
        "5,000 nodes cost more than 10 MiB: {:.1} MiB at ready, {:.1} MiB after",
        mib(with.rss_kib.saturating_sub(on_rss)),
        mib(after.saturating_sub(on_rss))
    );
}

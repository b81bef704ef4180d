//! Feasibility from the server's cluster context: nodes, quotas, DeviceClasses and Kueue's
//! queues arriving by watch change the answer of a review; a relabelled or cordoned node
//! changes it; what the RBAC forbids neither holds readiness nor refuses; the background
//! audit reads the same caches, and `tollgate audit` lists the same kinds of object.
//!
//! Against the real apiserver: on `common::envtest::isolated_plane()`, a control plane of
//! these tests' own, because a node at all changes what feasibility says of every pod (one
//! test's nodes would turn another's "not checked" into "no node may run it"). Each test
//! keeps to a [`context::Pool`] of nodes of its own (a label its pods select, a taint only
//! they tolerate), so that its verdicts depend on its nodes alone, and to namespaces of its
//! own. The server runs as a ServiceAccount bound to the RBAC tollgate ships
//! (deploy/base/rbac.yaml; the audit's: deploy/components/policy-reports/rbac.yaml), so the
//! tests also prove that RBAC suffices.
//!
//! Clusters of other shapes are real apiservers too, started with another
//! `--runtime-config`: one serving DRA only as `v1beta1` (`envtest::dra_v1beta1_plane`:
//! its claims read as v1), and one serving no DRA and no CRDs (`envtest::bare_plane`: no
//! Kueue, what it does not serve holds nothing up). Their tests keep to pools of nodes of
//! their own there too.
//!
//! Against the in-process stand-in, only what a real apiserver cannot be made to show on
//! cue: nodes whose list fails (503) until told otherwise, and a claim template whose watch
//! is held back, fetched in the one DRA version served.
//!
//! `memory_of_5000_nodes` (ignored) measures what the caches cost a real `tollgate serve`
//! watching 5,000 nodes of the real apiserver.

use crate::common;

use std::time::{Duration, Instant};

use apiserver::{ApiServer, Fault, ResourceType, Verb};
use common::context::{self, Pool};
use common::envtest::ControlPlane;
use common::net::{metric, ready, until, warnings, Client, TestServer};
use serde_json::{json, Value};
use tollgate::server::AuditOptions;
use tollgate_apiserver_standin as apiserver;

const NS: &str = "ml";

const ENFORCE: &str = "feasibility:\n  mode: enforce\n";

fn kubeconfig(api: &ApiServer) -> std::path::PathBuf {
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    api.write_kubeconfig(kubeconfig.path()).unwrap();
    kubeconfig.into_temp_path().keep().unwrap()
}

/// A server watching the stand-in `api`, under `policy`, once that policy is in force.
async fn server_against(
    api: &ApiServer,
    policy: &str,
    tweak: impl FnOnce(&mut tollgate::server::ServeOptions),
) -> TestServer {
    in_force(context::serve(kubeconfig(api), tweak).await, policy).await
}

/// `server` once `policy` is in force.
/// `tollgate_cluster_cache_synced` of one resource, as the server says it now.
async fn synced(server: &TestServer, resource: &str) -> Option<f64> {
    metric(
        server,
        "tollgate_cluster_cache_synced",
        &[("resource", resource)],
    )
    .await
}

async fn in_force(server: TestServer, policy: &str) -> TestServer {
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

/// A node of `gpus` A100s (for the stand-in), tainted for GPU pods.
fn node(name: &str, gpus: &str) -> Value {
    common::scheduling::node(
        name,
        json!({"nvidia.com/gpu.product": "A100-SXM4-80GB"}),
        json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
        json!({"cpu": "94", "memory": "1000Gi", "nvidia.com/gpu": gpus}),
    )
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
    let review = tollgate_core::synthetic_review(pod, None, "alice", &[]);
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

/// One test on the isolated control plane: the admin's client, a namespace and a pool of
/// nodes of its own.
struct Isolated {
    cp: &'static ControlPlane,
    admin: kube::Client,
    ns: String,
    pool: Pool,
}

/// None (the test skipped, said so) where there is no apiserver.
async fn isolated(prefix: &str) -> Option<Isolated> {
    isolated_on(common::envtest::isolated_plane(), prefix).await
}

/// One test on the plane `cp` (another shape of cluster), as on the isolated one.
async fn isolated_on(cp: Option<&'static ControlPlane>, prefix: &str) -> Option<Isolated> {
    let cp = cp?;
    Some(Isolated {
        cp,
        admin: cp.client("admin").await,
        ns: cp.namespace(prefix, &[]).await,
        pool: Pool::new(prefix),
    })
}

impl Isolated {
    /// [`gpu_pod`] in the test's namespace, confined to its pool.
    fn pod(&self, name: &str, gpus: &str, spec: Value) -> Value {
        let mut p = gpu_pod(name, gpus, spec);
        p["metadata"]["namespace"] = json!(self.ns);
        self.pool.confine(&mut p["spec"]);
        p
    }

    /// Creates a node of the pool (its status written too); the object.
    async fn node(&self, name: &str, gpus: &str, labels: Value) -> Value {
        let n = self.pool.node(name, gpus, labels);
        context::create(&self.admin, &n).await;
        n
    }

    /// The ServiceAccount `audit` of the test's namespace, bound to the RBAC tollgate
    /// ships for the background audit (deploy/components/policy-reports/rbac.yaml, and the
    /// cluster context's rules, each as `adjust` leaves it): its kubeconfig.
    async fn audit_identity(&self, adjust: impl Fn(&mut Value)) -> std::path::PathBuf {
        let audit_rbac = "deploy/components/policy-reports/rbac.yaml";
        let mut rules = context::rules_of(audit_rbac, "ClusterRole", "tollgate-audit");
        rules.extend(context::shipped_rules().into_iter().map(|mut r| {
            adjust(&mut r);
            r
        }));
        context::bind(self.cp, &self.ns, "audit", &rules).await;
        let status = context::shipped_autoscaler_status_rules();
        context::bind_elsewhere(self.cp, "kube-system", &self.ns, "audit", &status).await;
        let lease = context::rules_of(audit_rbac, "Role", "tollgate-audit-lease");
        context::bind_in(self.cp, &self.ns, "audit", &lease).await;
        context::sa_kubeconfig(self.cp, &self.ns, "audit")
    }

    /// A server as the ServiceAccount bound to the shipped RBAC, the built-in policy in
    /// force, its background audit running unpaced every 100 ms as `audit` (a kubeconfig,
    /// [`Isolated::audit_identity`]), its Lease in the test's namespace.
    async fn serve_auditing(&self, audit: std::path::PathBuf) -> TestServer {
        let kubeconfig = context::shipped_identity(self.cp, &self.ns).await;
        let ns = self.ns.clone();
        let server = context::serve(kubeconfig, |o| {
            let mut a = AuditOptions::new(Duration::from_millis(100));
            a.rate = 0;
            a.kubeconfig = Some(audit);
            a.lease_namespace = Some(ns);
            o.audit = Some(a);
        })
        .await;
        in_force(server, "# the built-in policy\n").await
    }

    /// The PolicyReports of the test's namespace, as the admin reads them.
    fn policy_reports(&self) -> kube::Api<kube::api::DynamicObject> {
        kube::Api::namespaced_with(
            self.admin.clone(),
            &self.ns,
            &kube::api::ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk("wgpolicyk8s.io", "v1alpha2", "PolicyReport"),
                "policyreports",
            ),
        )
    }

    /// A server as the ServiceAccount bound to the shipped RBAC, `policy` in force.
    async fn serve(&self, policy: &str) -> TestServer {
        let kubeconfig = context::shipped_identity(self.cp, &self.ns).await;
        in_force(context::serve(kubeconfig, |_| {}).await, policy).await
    }
}

/// Once nodes of 8 GPUs arrive by the watch, a 9-GPU pod is refused; a 16-GPU node
/// arriving lets it in again. The watch alone brings them: no relist, no restart.
#[tokio::test]
async fn nodes_arriving_by_watch_change_the_answer() {
    let Some(t) = isolated("fz-arrive").await else {
        return;
    };
    let server = t.serve(ENFORCE).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let nodes = [("resource", "nodes")];
    let last_sync = metric(
        &server,
        "tollgate_cluster_cache_last_sync_timestamp_seconds",
        &nodes,
    )
    .await
    .unwrap();

    let nine = t.pod("nine", "9", json!({}));
    for i in 0..3 {
        t.node(&format!("gpu-{i}"), "8", json!({})).await;
    }
    until("the nodes by the watch", async || {
        refusal(&validate(&mut c, &nine).await).contains(
            "it asks for 9 nvidia.com/gpu, and the largest of the 3 nodes it may use offers 8",
        )
    })
    .await;

    t.node("gpu-big", "16", json!({})).await;
    until("the big node by the watch", async || {
        validate(&mut c, &nine).await["allowed"] == true
    })
    .await;
    assert_eq!(
        metric(&server, "tollgate_cluster_watch_restarts_total", &nodes).await,
        Some(0.0),
        "no watch restarted"
    );
    assert_eq!(
        metric(
            &server,
            "tollgate_cluster_cache_last_sync_timestamp_seconds",
            &nodes
        )
        .await,
        Some(last_sync),
        "no relist"
    );
    server.running.shutdown().await;
}

/// Before the nodes can be listed (the stand-in fails their list on cue), the server
/// serves, is not ready, and a 9-GPU pod is allowed with a warning; once they are listed,
/// it is refused. No review lists or gets a node.
#[tokio::test]
async fn nodes_not_listed_yet_leave_the_pod_unchecked() {
    let api = ApiServer::start().await;
    api.inject(Fault::status(503).on("nodes", Verb::List));
    for i in 0..3 {
        api.insert("nodes", node(&format!("gpu-{i}"), "8"));
    }
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
    assert_eq!(api.count(Verb::Get, "nodes"), 0);
    server.running.shutdown().await;
}

/// A pod whose nodeSelector asks for a GPU product no node has is refused, naming what the
/// nodes have; once a node is relabelled to that product, it is allowed. A heartbeat
/// changes nothing; a cordon takes the node out again.
#[tokio::test]
async fn a_relabelled_node_changes_the_answer() {
    let Some(t) = isolated("fz-relabel").await else {
        return;
    };
    // Products of this test's own: the refusal counts every node of the cluster by them.
    let (a100, h100) = (
        format!("A100-{}", t.pool.name),
        format!("H100-{}", t.pool.name),
    );
    let product = |p: &str| json!({"nvidia.com/gpu.product": p});
    t.node("gpu-0", "8", product(&a100)).await;
    let gpu1 = t.node("gpu-1", "8", product(&a100)).await;
    let server = t.serve(ENFORCE).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let h100_pod = t.pod(
        "h100",
        "8",
        json!({"nodeSelector": {"nvidia.com/gpu.product": h100}}),
    );
    // (The pool's selector is added to the nodeSelector above.)
    let r = validate(&mut c, &h100_pod).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        refusal(&r).contains(&format!("nvidia.com/gpu.product: {a100} (2 nodes)")),
        "{r}"
    );

    // A heartbeat changes nothing; the relabel does.
    context::patch_status(
        &t.admin,
        &gpu1,
        json!({"status": {"conditions": [{"type": "Ready", "status": "True",
            "reason": "KubeletReady", "message": "kubelet is posting ready status",
            "lastHeartbeatTime": "2026-01-01T00:00:10Z",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
    )
    .await;
    context::patch(
        &t.admin,
        &gpu1,
        json!({"metadata": {"labels": {"nvidia.com/gpu.product": h100}}}),
    )
    .await;
    until("the relabelled node", async || {
        validate(&mut c, &h100_pod).await["allowed"] == true
    })
    .await;

    context::patch(&t.admin, &gpu1, json!({"spec": {"unschedulable": true}})).await;
    until("the cordon", async || {
        validate(&mut c, &h100_pod).await["allowed"] == false
    })
    .await;
    server.running.shutdown().await;
}

/// A quota added to the namespace makes a pod over it refused; raised, it is allowed.
/// (No quota controller runs: the test writes the status one would.)
#[tokio::test]
async fn a_quota_added_makes_a_pod_refused() {
    let Some(t) = isolated("fz-quota").await else {
        return;
    };
    let other = t.cp.namespace("fz-quota-other", &[]).await;
    t.node("gpu-0", "16", json!({})).await;
    let server = t.serve(ENFORCE).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let nine = t.pod("nine", "9", json!({}));
    until("the node by the watch", async || {
        validate(&mut c, &nine).await["allowed"] == true
    })
    .await;

    let quota = |gpus: &str| {
        json!({"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "gpu-quota", "namespace": t.ns},
            "spec": {"hard": {"requests.nvidia.com/gpu": gpus}},
            "status": {"hard": {"requests.nvidia.com/gpu": gpus},
                "used": {"requests.nvidia.com/gpu": "0"}}})
    };
    context::create(&t.admin, &quota("8")).await;
    until("the quota by the watch", async || {
        validate(&mut c, &nine).await["allowed"] == false
    })
    .await;
    let r = validate(&mut c, &nine).await;
    assert!(
        refusal(&r).contains(&format!(
            "quota \"gpu-quota\" of namespace \"{}\" allows requests.nvidia.com/gpu: 8, and the pod asks for 9",
            t.ns
        )),
        "{r}"
    );
    // Another namespace's pod is not held to it.
    let mut elsewhere = nine.clone();
    elsewhere["metadata"]["namespace"] = json!(other);
    assert_eq!(validate(&mut c, &elsewhere).await["allowed"], true);

    let raised = quota("16");
    context::patch(&t.admin, &raised, json!({"spec": raised["spec"]})).await;
    context::patch_status(&t.admin, &raised, json!({"status": raised["status"]})).await;
    until("the raised quota", async || {
        validate(&mut c, &nine).await["allowed"] == true
    })
    .await;
    server.running.shutdown().await;
}

/// A PyTorchJob of 4 workers with 4 GPUs each, submitted to LocalQueue `team-a`, in
/// namespace `ns`, its pods with `pod_spec` merged in.
fn queued_job(ns: &str, pod_spec: Value) -> Value {
    let mut spec = json!({
        "containers": [{"name": "pytorch", "image": "registry.example.com/llm:2.3",
            "resources": {
                "requests": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "4"},
                "limits": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "4"}}}]});
    spec.as_object_mut()
        .unwrap()
        .extend(pod_spec.as_object().unwrap().clone());
    let worker = json!({"replicas": 4, "restartPolicy": "OnFailure", "template": {"spec": spec}});
    json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "llm-pretrain", "namespace": ns,
            "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": worker}}})
}

/// LocalQueue `team-a` of namespace `ns`, submitting to ClusterQueue `cluster_queue`.
fn local_queue(ns: &str, cluster_queue: &str) -> Value {
    json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "team-a", "namespace": ns},
        "spec": {"clusterQueue": cluster_queue}})
}

/// A ClusterQueue named `name` of `nominal` GPUs, borrowing up to `borrowing` from
/// `cohort`.
fn cluster_queue(name: &str, nominal: &str, cohort: Option<(&str, &str)>) -> Value {
    let mut gpus = json!({"name": "nvidia.com/gpu", "nominalQuota": nominal});
    let mut spec = json!({});
    if let Some((cohort, borrowing)) = cohort {
        gpus["borrowingLimit"] = json!(borrowing);
        spec["cohortName"] = json!(cohort);
    }
    spec["resourceGroups"] = json!([{"coveredResources": ["nvidia.com/gpu"],
        "flavors": [{"name": "a100", "resources": [gpus]}]}]);
    json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": name}, "spec": spec})
}

/// Kueue's queues arrive by the watch, in the version the cluster serves (`v1beta2`, as
/// Kueue 0.14 and later serve them): a workload naming a LocalQueue not there yet is
/// allowed with a warning; once its ClusterQueue of 8 GPUs is there, the 16-GPU job is
/// refused as a whole (not held to the namespace's ResourceQuota, which would let it in); a
/// cohort with room to borrow lets it in again.
#[tokio::test]
async fn kueue_queues_arriving_by_watch_hold_a_workload_to_its_cluster_queue() {
    let Some(t) = isolated("fz-kueue").await else {
        return;
    };
    context::install_crds(&t.admin, "tests/data/crds/kueue.yaml").await;
    t.node("gpu-0", "8", json!({})).await;
    context::create(
        &t.admin,
        &json!({"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "roomy", "namespace": t.ns},
            "spec": {"hard": {"requests.nvidia.com/gpu": "64"}},
            "status": {"hard": {"requests.nvidia.com/gpu": "64"},
                "used": {"requests.nvidia.com/gpu": "0"}}}),
    )
    .await;
    let server = t.serve(ENFORCE).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let mut pod_spec = json!({"tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]});
    t.pool.confine(&mut pod_spec);
    let job = queued_job(&t.ns, pod_spec);
    let r = validate(&mut c, &job).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(warnings(&r).contains("team-a"), "{r}");

    // ClusterQueues and cohorts are cluster-wide: names of this test's own.
    let cq = context::unique("team-a");
    let cohort = context::unique("research");
    context::create(&t.admin, &local_queue(&t.ns, &cq)).await;
    context::create(&t.admin, &cluster_queue(&cq, "8", None)).await;
    until("the queues by the watch", async || {
        validate(&mut c, &job).await["allowed"] == false
    })
    .await;
    let r = validate(&mut c, &job).await;
    assert!(refusal(&r).contains(&cq), "{r}");
    assert!(refusal(&r).contains("16"), "{r}");

    let borrowing = cluster_queue(&cq, "8", Some((&cohort, "8")));
    context::patch(&t.admin, &borrowing, json!({"spec": borrowing["spec"]})).await;
    until("the cohort by the watch", async || {
        validate(&mut c, &job).await["allowed"] == true
    })
    .await;
    let metrics = [("resource", "clusterqueues")];
    assert!(metric(&server, "tollgate_cluster_cache_objects", &metrics).await >= Some(1.0));
    for resource in ["localqueues", "clusterqueues"] {
        let r = [("resource", resource)];
        assert_eq!(
            metric(&server, "tollgate_cluster_cache_synced", &r).await,
            Some(1.0),
            "the shipped RBAC lets {resource} be listed"
        );
    }
    server.running.shutdown().await;
}

/// The findings of `text` that say it can never run: what follows `can never run: ` in
/// each of its lines (a webhook's warnings) or messages (an audit's findings).
fn never_runs<'a>(texts: impl IntoIterator<Item = &'a str>) -> std::collections::BTreeSet<String> {
    texts
        .into_iter()
        .flat_map(str::lines)
        .filter_map(|l| l.split_once("can never run: ").map(|(_, f)| f.to_owned()))
        .collect()
}

/// The webhook, `tollgate audit` and the background audit see the same Kueue queues: a
/// Job of 4 pods of 4 GPUs each, submitted to a LocalQueue whose ClusterQueue has 8 GPUs,
/// is warned at apply (the built-in policy: feasibility `warn`) that Kueue never admits
/// it, and each audit fails it on the feasibility rule in the same words. The server and
/// both audits run as the identities bound to the RBAC tollgate ships (the cluster
/// context's, and the audit's: deploy/components/policy-reports/rbac.yaml), so that RBAC
/// is shown to let the audits read the queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audits_see_the_kueue_queues_the_webhook_sees() {
    let Some(t) = isolated("fz-kaudit").await else {
        return;
    };
    context::install_crds(&t.admin, "tests/data/crds/kueue.yaml").await;
    context::install_crds(
        &t.admin,
        "deploy/components/policy-reports/crd/wgpolicyk8s.io_policyreports.yaml",
    )
    .await;
    // Room on the nodes for each pod: only the ClusterQueue stands in the way.
    t.node("gpu-0", "8", json!({})).await;
    let cq = context::unique("team-a");
    context::create(&t.admin, &local_queue(&t.ns, &cq)).await;
    context::create(&t.admin, &cluster_queue(&cq, "8", None)).await;
    let mut pod_spec = json!({
        "restartPolicy": "Never",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "sweep", "image": "registry.example.com/sweep:1.0",
            "resources": {
                "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"},
                "limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"}}}]});
    t.pool.confine(&mut pod_spec);
    // Suspended, as Kueue's own webhook leaves a Job until its queue admits it.
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "sweep", "namespace": t.ns,
            "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
        "spec": {"suspend": true, "parallelism": 4, "completions": 4,
            "template": {"spec": pod_spec}}});
    context::create(&t.admin, &job).await;

    let audit = t.audit_identity(|_| {}).await;
    context::until_may_list(t.cp, &audit, "nodes").await;
    let server = t.serve_auditing(audit.clone()).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;

    // The webhook, at apply.
    let mut r = Value::Null;
    until("the queues by the watch", async || {
        r = validate(&mut c, &job).await;
        warnings(&r).contains("Kueue never admits it")
    })
    .await;
    assert_eq!(r["allowed"], true, "warned, not refused: {r}");
    let webhook = never_runs([warnings(&r).as_str()]);
    assert_eq!(webhook.len(), 1, "{r}");
    let finding = webhook.iter().next().unwrap();
    assert!(
        finding.contains(&cq) && finding.contains("at most 8 nvidia.com/gpu"),
        "{finding}"
    );
    assert!(
        finding.contains("its 4 pods ask for 16 in all"),
        "{finding}"
    );

    // The background audit, in the server's caches.
    let reports = t.policy_reports();
    let mut reported = std::collections::BTreeSet::new();
    until("the Kueue finding in the report", async || {
        let report = reports.get_opt("tollgate").await.unwrap();
        let results = report
            .as_ref()
            .and_then(|r| r.data["results"].as_array().cloned())
            .unwrap_or_default();
        reported = never_runs(
            results
                .iter()
                .filter(|x| x["rule"] == "feasibility" && x["result"] == "fail")
                .filter_map(|x| x["message"].as_str()),
        );
        !reported.is_empty()
    })
    .await;
    assert_eq!(reported, webhook, "the background audit");
    server.running.shutdown().await;

    // `tollgate audit` of the namespace, listing what it judges in.
    let args = [
        "audit".to_owned(),
        "--kubeconfig".into(),
        audit.display().to_string(),
        "-n".into(),
        t.ns.clone(),
        "--output".into(),
        "json".into(),
    ];
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        !err.contains("queues"),
        "the shipped RBAC lets it read them: {err}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let audited = never_runs(
        lines
            .iter()
            .filter(|l| l["rule"] == "feasibility" && l["result"] == "fail")
            .filter_map(|l| l["message"].as_str()),
    );
    assert_eq!(audited, webhook, "tollgate audit: {lines:#?}");
}

/// A cluster without Kueue (`envtest::bare_plane`: no test installs a CRD there) holds
/// nothing up and says nothing of it: the namespace's quota decides, and no series is kept
/// of the queues.
#[tokio::test]
async fn without_kueue_the_quota_decides() {
    let Some(t) = isolated_on(common::envtest::bare_plane(), "fz-no-kueue").await else {
        return;
    };
    context::create(
        &t.admin,
        &json!({"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "roomy", "namespace": t.ns},
            "spec": {"hard": {"requests.nvidia.com/gpu": "64"}}}),
    )
    .await;
    t.node("gpu-0", "8", json!({})).await;
    let server = t.serve(ENFORCE).await;
    let mut c = client(&server).await;
    until("ready without Kueue", async || ready(&mut c).await.0 == 200).await;
    let mut spec = json!({"tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]});
    t.pool.confine(&mut spec);
    let r = validate(&mut c, &queued_job(&t.ns, spec)).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(!warnings(&r).contains("team-a"), "{r}");
    assert_eq!(
        metric(
            &server,
            "tollgate_cluster_cache_objects",
            &[("resource", "clusterqueues")]
        )
        .await,
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
    let Some(t) = isolated("fz-class").await else {
        return;
    };
    // DeviceClasses are cluster-wide: names of this test's own.
    let (wanted, other) = (
        format!("gpu.{}.example.com", t.pool.name),
        format!("mig.{}.example.com", t.pool.name),
    );
    let mut tpl = template("resource.k8s.io/v1", &wanted);
    tpl["metadata"]["namespace"] = json!(t.ns);
    context::create(&t.admin, &tpl).await;
    context::create(&t.admin, &device_class("resource.k8s.io/v1", &other)).await;
    t.node("gpu-0", "8", json!({})).await;
    let server = t.serve(ENFORCE).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let mut pod = dra_pod();
    pod["metadata"]["namespace"] = json!(t.ns);
    // The GPU toleration the mutation gives a pod of GPU claims: the pool's node is tainted
    // for GPU pods.
    pod["spec"]["tolerations"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}));
    t.pool.confine(&mut pod["spec"]);
    let r = validate(&mut c, &pod).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        refusal(&r).contains(&format!(
            "asks for DeviceClass \"{wanted}\", which the cluster does not have"
        )),
        "{r}"
    );
    context::create(&t.admin, &device_class("resource.k8s.io/v1", &wanted)).await;
    until("the class by the watch", async || {
        validate(&mut c, &pod).await["allowed"] == true
    })
    .await;
    server.running.shutdown().await;
}

/// A 1.33 cluster (`envtest::dra_v1beta1_plane`: DRA served as `resource.k8s.io/v1beta1`
/// only). Discovery finds it, the claim templates and DeviceClasses are watched in it and
/// read as v1: the pod gets its GPU toleration and is allowed, from the cache.
#[tokio::test]
async fn a_cluster_serving_dra_v1beta1_only() {
    let Some(t) = isolated_on(common::envtest::dra_v1beta1_plane(), "fz-v1beta1").await else {
        return;
    };
    let mut tpl = template("resource.k8s.io/v1beta1", "gpu.nvidia.com");
    tpl["metadata"]["namespace"] = json!(t.ns);
    context::create(&t.admin, &tpl).await;
    // Cluster-wide, and the class the shipped policy names: the plane's other tests may
    // have made it.
    context::create_shared(
        &t.admin,
        &device_class("resource.k8s.io/v1beta1", "gpu.nvidia.com"),
    )
    .await;
    let server = t.serve(ENFORCE).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    for resource in ["resourceclaimtemplates", "deviceclasses"] {
        assert_eq!(synced(&server, resource).await, Some(1.0), "{resource}");
    }
    let mut pod = dra_pod();
    pod["metadata"]["namespace"] = json!(t.ns);
    until("the template by the watch", async || {
        gets_toleration(&mut c, &pod, "a").await
    })
    .await;
    assert_eq!(validate(&mut c, &pod).await["allowed"], true);
    assert_eq!(
        metric(
            &server,
            "tollgate_cluster_fetches_total",
            &[("resource", "resourceclaimtemplates"), ("result", "found")]
        )
        .await
        .unwrap_or(0.0),
        0.0,
        "from the cache"
    );
    server.running.shutdown().await;
}

/// Whether `/mutate` of `pod` (review uid `uid`) gives it the NVIDIA GPU toleration.
async fn gets_toleration(c: &mut Client, pod: &Value, uid: &str) -> bool {
    let mut r = tollgate_core::synthetic_review(pod, None, "alice", &[]);
    r["request"]["uid"] = json!(uid);
    let (status, bytes) = c.post("/mutate", serde_json::to_vec(&r).unwrap()).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    use base64::Engine as _;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(v["response"]["patch"].as_str().unwrap_or(""))
        .unwrap();
    String::from_utf8_lossy(&patch).contains("nvidia.com/gpu")
}

/// A claim template the watch has not delivered (held back on cue, stand-in) on a cluster
/// serving DRA only as `v1beta1`: fetched once, in v1beta1, and read as v1.
#[tokio::test]
async fn a_template_the_watch_holds_back_is_fetched_in_the_version_served() {
    let api = ApiServer::builder()
        .resources(ResourceType::defaults_with_dra("v1beta1"))
        .start()
        .await;
    api.insert(
        "deviceclasses",
        device_class("resource.k8s.io/v1beta1", "gpu.nvidia.com"),
    );
    let server = server_against(&api, ENFORCE, |_| {}).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    api.inject(Fault::delay(Duration::from_secs(30)).on("resourceclaimtemplates", Verb::Watch));
    api.break_watches();
    let mut fresh = template("resource.k8s.io/v1beta1", "gpu.nvidia.com");
    fresh["metadata"]["name"] = json!("fresh");
    api.insert("resourceclaimtemplates", fresh);
    let mut pod = dra_pod();
    pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = json!("fresh");
    assert!(gets_toleration(&mut c, &pod, "b").await);
    assert_eq!(api.count(Verb::Get, "resourceclaimtemplates"), 1);
    assert!(api
        .requests_for(Verb::Get, "resourceclaimtemplates")
        .iter()
        .all(|r| r.path.contains("/apis/resource.k8s.io/v1beta1/")));
    api.clear_faults();
    server.running.shutdown().await;
}

/// What the RBAC forbids (nodes, quotas: the shipped rules less those) holds neither
/// readiness nor a pod: feasibility says nothing of them, and the forbidden caches keep
/// their series (synced 0, the stale alert's age growing). Granted later, they are picked
/// up without a restart.
#[tokio::test]
async fn what_the_rbac_forbids_holds_nothing_up() {
    let Some(t) = isolated("fz-forbidden").await else {
        return;
    };
    t.node("gpu-0", "8", json!({})).await;
    let rules: Vec<Value> = context::shipped_rules()
        .into_iter()
        .map(|mut r| {
            if let Some(resources) = r["resources"].as_array_mut() {
                resources.retain(|x| x != "nodes" && x != "resourcequotas");
            }
            r
        })
        .collect();
    context::bind(t.cp, &t.ns, "tollgate", &rules).await;
    let kubeconfig = context::sa_kubeconfig(t.cp, &t.ns, "tollgate");
    context::until_may_list(t.cp, &kubeconfig, "namespaces").await;
    let server = in_force(context::serve(kubeconfig, |_| {}).await, ENFORCE).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let nine = t.pod("nine", "9", json!({}));
    let r = validate(&mut c, &nine).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert_eq!(warnings(&r), "", "nothing said of what is not known: {r}");
    assert_eq!(synced(&server, "nodes").await, Some(0.0));
    assert_eq!(synced(&server, "resourcequotas").await, Some(0.0));
    assert_eq!(synced(&server, "namespaces").await, Some(1.0));

    // Granted later (the shipped rules bound too): picked up without a restart.
    context::bind_shipped(t.cp, &t.ns, "tollgate").await;
    until("the nodes once allowed", async || {
        refusal(&validate(&mut c, &nine).await).contains(
            "it asks for 9 nvidia.com/gpu, and the largest of the 1 node it may use offers 8",
        )
    })
    .await;
    server.running.shutdown().await;
}

/// What the cluster does not serve (no DRA at all: `envtest::bare_plane`) holds neither
/// readiness nor a pod, and has no series.
#[tokio::test]
async fn what_the_cluster_does_not_serve_holds_nothing_up() {
    let Some(t) = isolated_on(common::envtest::bare_plane(), "fz-unserved").await else {
        return;
    };
    t.node("gpu-0", "16", json!({})).await;
    let server = t.serve(ENFORCE).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let r = validate(&mut c, &t.pod("nine", "9", json!({}))).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert_eq!(warnings(&r), "", "nothing said of what is not served: {r}");
    assert_eq!(synced(&server, "nodes").await, Some(1.0));
    for absent in ["resourceclaims", "resourceclaimtemplates", "deviceclasses"] {
        assert_eq!(
            synced(&server, absent).await,
            None,
            "{absent} is not served"
        );
    }
    server.running.shutdown().await;
}

/// The background audit judges in the server's caches: a Pending pod of 9 GPUs where the
/// nodes offer 8 fails the feasibility rule in its namespace's PolicyReport. The audit
/// runs as an identity of its own, bound to the RBAC tollgate ships for it
/// (deploy/components/policy-reports/rbac.yaml, and the cluster context's less nodes): it
/// cannot list a node, so the finding can only come from the server's caches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_audit_reports_what_can_never_run() {
    let Some(t) = isolated("fz-audit").await else {
        return;
    };
    context::install_crds(
        &t.admin,
        "deploy/components/policy-reports/crd/wgpolicyk8s.io_policyreports.yaml",
    )
    .await;
    for i in 0..2 {
        t.node(&format!("gpu-{i}"), "8", json!({})).await;
    }
    // Pending for good: no scheduler runs.
    context::create(&t.admin, &t.pod("nine", "9", json!({}))).await;

    let audit = t
        .audit_identity(|r| {
            if let Some(resources) = r["resources"].as_array_mut() {
                resources.retain(|x| x != "nodes");
            }
        })
        .await;
    context::until_may_list(t.cp, &audit, "pods").await;
    let server = t.serve_auditing(audit).await;
    let reports = t.policy_reports();
    let mut found = None;
    until("the feasibility finding in the report", async || {
        found = reports.get_opt("tollgate").await.unwrap().and_then(|r| {
            r.data["results"]
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
    server.running.shutdown().await;
}

/// A node as a kubelet keeps it, about 6 KB of JSON: labels, taints, addresses, images,
/// conditions (the apiserver adds the managedFields). Its shape is one of 20: five pools in
/// four zones.
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
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
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
/// on (watching with `kubeconfig`) or off, waits for it to be ready and for its memory to
/// settle, and reads it.
async fn serve_measured(kubeconfig: Option<&std::path::Path>) -> Measured {
    let (dir, ca_pem) = common::process::workdir();
    let mut extra = vec!["--cluster-context".to_owned()];
    match kubeconfig {
        Some(kubeconfig) => {
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
/// on (against a cluster without nodes), and on with 5,000 nodes of 20 shapes (each node
/// about 9 KB of JSON, as a kubelet keeps it, written to the real apiserver); then every
/// node's heartbeat rewritten once (the shapes unchanged), with the CPU that cost and the
/// RSS after. The nodes must cost within 10 MiB, at ready and after. Run alone (the nodes
/// stay on the isolated control plane for the rest of the run), with a release build:
/// `TOLLGATE_BIN=target/release/tollgate cargo test --test integration
/// feasibility_context::memory -- --ignored --nocapture`. (The figures of docs/operations.md
/// are tests/scale.rs's, of GPU nodes as the GPU Operator labels them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn memory_of_5000_nodes() {
    use futures::StreamExt as _;
    let Some(t) = isolated("fz-memory").await else {
        return;
    };
    let mib = |kib: u64| kib as f64 / 1024.0;
    let off = serve_measured(None).await;
    eprintln!(
        "cluster context off: VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        mib(off.rss_kib),
        mib(off.hwm_kib)
    );
    drop(off);
    let kubeconfig = context::shipped_identity(t.cp, &t.ns).await;
    let on = serve_measured(Some(&kubeconfig)).await;
    eprintln!(
        "cluster context on, no node of its own: VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        mib(on.rss_kib),
        mib(on.hwm_kib)
    );
    let on_rss = on.rss_kib;
    drop(on);

    let n = 5_000;
    // Written as a kubelet writes them: the node, then its status (a create drops it).
    let started = Instant::now();
    futures::stream::iter((0..n).map(realistic_node))
        .for_each_concurrent(32, async |node| context::create(&t.admin, &node).await)
        .await;
    let bytes: usize = serde_json::to_vec(&realistic_node(0)).unwrap().len();
    eprintln!("{n} nodes written in {:?}", started.elapsed());
    let with = serve_measured(Some(&kubeconfig)).await;
    eprintln!(
        "cluster context on, {n} nodes of 20 shapes ({bytes} bytes of JSON each): VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        mib(with.rss_kib),
        mib(with.hwm_kib)
    );
    let pid = with.served.pid();
    until_idle(pid).await;
    let before = cpu_ticks(pid);
    let started = Instant::now();
    futures::stream::iter(0..n)
        .for_each_concurrent(32, async |i| {
            let mut node = realistic_node(i);
            let mut conditions = node["status"]["conditions"].take();
            conditions[3]["lastHeartbeatTime"] = json!("2026-01-01T00:00:40Z");
            context::patch_status(
                &t.admin,
                &node,
                json!({"status": {"conditions": conditions}}),
            )
            .await
        })
        .await;
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
    // The binary gives freed memory back at once (src/main.rs): without it, the pages the
    // first list passed through stay in the RSS of the worker threads that freed them until
    // those allocate again (56 MiB more at ready in a release build).
    assert!(
        with.rss_kib < on_rss + 10 * 1024 && after < on_rss + 10 * 1024,
        "5,000 nodes cost more than 10 MiB: {:.1} MiB at ready, {:.1} MiB after",
        mib(with.rss_kib.saturating_sub(on_rss)),
        mib(after.saturating_sub(on_rss))
    );
}

/// What may add a node, as the server's cluster context watches it on a plane of its own
/// (`envtest::autoscaling_plane`): with only a node offering no GPU, a pod of 8 GPUs can
/// never run (refused under enforce); a Karpenter NodePool for the pod's pool whose limits
/// allow 4 GPUs in all leaves it so, named with why; its limits raised, the pod is allowed
/// with a warning naming the NodePool that may add a node; the NodePool gone and the
/// Cluster Autoscaler's status ConfigMap there, the warning names the Cluster Autoscaler;
/// that gone too, refused again. Each by the watch alone, as the shipped ServiceAccount
/// (its Role in kube-system for that one ConfigMap, its ClusterRole for NodePools).
#[tokio::test]
async fn what_may_add_a_node_by_watch_changes_the_answer() {
    let Some(t) = isolated_on(common::envtest::autoscaling_plane(), "fz-scale").await else {
        return;
    };
    context::install_crds(&t.admin, "tests/data/crds/karpenter.yaml").await;
    t.node("cpu-0", "0", json!({})).await;
    let server = t.serve(ENFORCE).await;
    let mut c = client(&server).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let eight = t.pod("eight", "8", json!({}));
    let none_offers = "it asks for 8 nvidia.com/gpu, which none of the 1 node it may use offers";
    let r = validate(&mut c, &eight).await;
    assert!(refusal(&r).contains(none_offers), "{r}");
    assert!(!refusal(&r).contains("NodePool"), "{r}");

    let pools = kube::Api::<kube::api::DynamicObject>::all_with(
        t.admin.clone(),
        &kube::api::ApiResource {
            group: "karpenter.sh".into(),
            version: "v1".into(),
            api_version: "karpenter.sh/v1".into(),
            kind: "NodePool".into(),
            plural: "nodepools".into(),
        },
    );
    let pool_name = format!("{}-gpu", t.pool.name);
    let pool = |limit: &str| {
        json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": pool_name},
        "spec": {
            "template": {
                "metadata": {"labels": {"tollgate.test/pool": t.pool.name}},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
                    "requirements": [{"key": "karpenter.k8s.aws/instance-family",
                        "operator": "In", "values": ["p5"]}],
                    "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                        {"key": "tollgate.test/pool", "value": t.pool.name, "effect": "NoSchedule"}]
                }
            },
            "limits": {"nvidia.com/gpu": limit}
        }})
    };
    context::create(&t.admin, &pool("4")).await;
    let limits = format!(
        "Karpenter's NodePool \"{pool_name}\": its limits allow 4 nvidia.com/gpu in all, and the pod asks for 8"
    );
    until("the NodePool's limits named", async || {
        refusal(&validate(&mut c, &eight).await).contains(&limits)
    })
    .await;

    let mut raised: kube::api::DynamicObject = pools.get(&pool_name).await.unwrap();
    raised.data["spec"]["limits"]["nvidia.com/gpu"] = json!("64");
    pools
        .replace(&pool_name, &Default::default(), &raised)
        .await
        .unwrap();
    let may_add = format!("Karpenter's NodePool \"{pool_name}\" may add one");
    until("allowed, the NodePool named", async || {
        let r = validate(&mut c, &eight).await;
        r["allowed"] == true && warnings(&r).contains(&may_add)
    })
    .await;
    let r = validate(&mut c, &eight).await;
    let w = warnings(&r);
    assert!(
        w.contains("cannot run now: no node offers what it asks for now"),
        "{w}"
    );
    assert!(
        !w.contains("can never run") && !w.contains("no node can run it"),
        "{w}"
    );

    pools.delete(&pool_name, &Default::default()).await.unwrap();
    let maps = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
        t.admin.clone(),
        "kube-system",
    );
    let status = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cluster-autoscaler-status", "namespace": "kube-system"},
        "data": {"status": "Cluster-autoscaler status at 2026-12-05 10:00:00 +0000 UTC:\nCluster-wide:\n  Health: Healthy\n"}});
    context::create(&t.admin, &status).await;
    until("allowed, the Cluster Autoscaler named", async || {
        let r = validate(&mut c, &eight).await;
        r["allowed"] == true && warnings(&r).contains("The Cluster Autoscaler may add one")
    })
    .await;
    assert_eq!(synced(&server, "configmaps").await, Some(1.0));
    assert_eq!(synced(&server, "nodepools").await, Some(1.0));

    maps.delete("cluster-autoscaler-status", &Default::default())
        .await
        .unwrap();
    until("refused again", async || {
        refusal(&validate(&mut c, &eight).await).contains(none_offers)
    })
    .await;
}

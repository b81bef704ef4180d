//! A TrainJob's runtime from the server's cluster context.
//!
//! Against the real apiserver (`common::envtest`, Kubeflow Trainer's CRDs installed from
//! tests/data/crds/trainer.yaml, the server as the ServiceAccount bound to deploy/base's
//! RBAC): a ClusterTrainingRuntime listed at start and one that arrives by the watch judge
//! the TrainJob from the cache; one that does not exist is fetched, found absent, and said
//! so.
//!
//! A cluster without Kubeflow Trainer is a real apiserver too (`envtest::bare_plane`, where
//! no test installs a CRD). Against the in-process stand-in, only a runtime fetched because
//! its watch was held back (on cue, which the real one cannot be made to do).

use crate::common;

use std::time::Duration;

use apiserver::{ApiServer, Fault, ResourceType, Verb};
use common::context;
use common::net::{self, until, warnings, Client, TestServer};
use serde_json::{json, Value};
use tollgate_apiserver_standin as apiserver;

const NS: &str = "ml-research";

/// The stand-in with the default resources and Kubeflow Trainer's runtimes.
async fn with_trainer() -> ApiServer {
    ApiServer::builder()
        .resources(ResourceType::defaults())
        .resource(ResourceType::new(
            "trainer.kubeflow.org",
            "v1alpha1",
            "clustertrainingruntimes",
            "ClusterTrainingRuntime",
            false,
        ))
        .resource(ResourceType::new(
            "trainer.kubeflow.org",
            "v1alpha1",
            "trainingruntimes",
            "TrainingRuntime",
            true,
        ))
        .start()
        .await
}

/// kubeflow/trainer's torch-distributed runtime under `name`, its node container with
/// `resources`.
fn runtime(name: &str, resources: Value) -> Value {
    json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {"replicatedJobs": [{
                "name": "node",
                "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                    "spec": {"template": {"spec": {"containers": [{
                        "name": "node",
                        "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
                        "resources": resources
                    }]}}}
                }
            }]}}
        }
    })
}

/// The CREATE review of a TrainJob on the ClusterTrainingRuntime `runtime`, asking for no
/// resources of its own.
fn trainjob_review(runtime: &str, uid: &str) -> Vec<u8> {
    trainjob_review_in(NS, runtime, uid)
}

fn trainjob_review_in(ns: &str, runtime: &str, uid: &str) -> Vec<u8> {
    let job = json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "train", "namespace": ns},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {"numNodes": 2, "command": ["torchrun", "train.py"]}
        }
    });
    let mut review = tollgate_core::synthetic_review(&job, None, "alice", &[]);
    review["request"]["uid"] = json!(uid);
    serde_json::to_vec(&review).unwrap()
}

async fn server_against(api: &ApiServer) -> TestServer {
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    api.write_kubeconfig(kubeconfig.path()).unwrap();
    let path = kubeconfig.into_temp_path().keep().unwrap();
    without_default_limits(context::serve(path, |_| {}).await)
}

fn without_default_limits(server: TestServer) -> TestServer {
    // Tollgate adds no default limits: what the runtime requests decides.
    std::fs::write(
        server.policy_path(),
        "mutation:\n  defaultResources:\n    enabled: false\n",
    )
    .unwrap();
    server
}

async fn validate(c: &mut Client, body: Vec<u8>) -> Value {
    let (status, bytes) = c.post("/validate", body).await;
    assert_eq!(status, 200);
    let mut v: Value = serde_json::from_slice(&bytes).unwrap();
    v["response"].take()
}

async fn ready(c: &mut Client) -> bool {
    c.request("GET", "/readyz", vec![]).await.unwrap().0 == 200
}

/// Until the policy without default limits is in force (the refusal of a TrainJob on the
/// runtime `bare`, without requests).
async fn policy_in_force(c: &mut Client) {
    policy_in_force_in(c, NS, "bare").await
}

async fn policy_in_force_in(c: &mut Client, ns: &str, bare: &str) {
    until("the policy in force", async || {
        validate(c, trainjob_review_in(ns, bare, "p")).await["allowed"] == false
    })
    .await;
}

/// GETs of ClusterTrainingRuntimes that ended with `result`.
async fn fetches(server: &TestServer, result: &str) -> f64 {
    net::metric(
        server,
        "tollgate_cluster_fetches_total",
        &[("resource", "clustertrainingruntimes"), ("result", result)],
    )
    .await
    .unwrap_or(0.0)
}

/// Runtimes the server's cache holds, by its metric.
async fn cached(server: &TestServer) -> f64 {
    let text = net::get_metrics(server.running.metrics_addr.unwrap()).await;
    common::scrape::value(
        &common::scrape::parse(&text),
        "tollgate_cluster_cache_objects",
        &[("resource", "clustertrainingruntimes")],
    )
    .unwrap_or(0.0)
}

#[tokio::test]
async fn a_runtime_that_arrives_by_the_watch_judges_the_trainjob() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let admin = cp.client("admin").await;
    context::install_crds(&admin, "tests/data/crds/trainer.yaml").await;
    let ns = cp.namespace("trainjob", &[]).await;
    // ClusterTrainingRuntimes are cluster-scoped: names of this test's own.
    let (bare, sized) = (
        context::unique("ctx-bare"),
        context::unique("ctx-torch-sized"),
    );
    // Listed when the server starts.
    context::create(&admin, &runtime(&bare, json!({}))).await;
    let server = without_default_limits(
        context::serve(context::shipped_identity(cp, &ns).await, |_| {}).await,
    );
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    until("the first sync", async || ready(&mut c).await).await;
    policy_in_force_in(&mut c, &ns, &bare).await;

    // Created after the server started: it reaches the cache by the watch. Other tests may
    // add runtimes meanwhile: the cache is caught up once it holds as many as the
    // apiserver lists at that moment.
    context::create(
        &admin,
        &runtime(&sized, json!({"requests": {"cpu": "8", "memory": "32Gi"}})),
    )
    .await;
    let runtimes = kube::Api::<kube::api::DynamicObject>::all_with(
        admin.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(
                "trainer.kubeflow.org",
                "v1alpha1",
                "ClusterTrainingRuntime",
            ),
            "clustertrainingruntimes",
        ),
    );
    until("the runtime from the watch", async || {
        let listed = runtimes
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len();
        cached(&server).await == listed as f64
    })
    .await;
    let r = validate(&mut c, trainjob_review_in(&ns, &sized, "a")).await;
    assert_eq!(r["allowed"], true, "{r}");
    // The runtime without requests: refused, naming the TrainJob and its step.
    let r = validate(&mut c, trainjob_review_in(&ns, &bare, "b")).await;
    assert_eq!(r["allowed"], false, "{r}");
    let message = r["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("trainjob \"train\" must request"),
        "{message}"
    );
    assert!(
        message
            .contains("replicated job node: container \"node\" has no request for cpu and memory"),
        "{message}"
    );
    // All from the cache: no GET was needed.
    for result in ["found", "absent", "failed"] {
        assert_eq!(fetches(&server, result).await, 0.0, "{result}");
    }
    for resource in ["trainingruntimes", "clustertrainingruntimes"] {
        let r = [("resource", resource)];
        assert_eq!(
            net::metric(&server, "tollgate_cluster_cache_synced", &r).await,
            Some(1.0),
            "the shipped RBAC lets {resource} be listed"
        );
    }

    // One that does not exist: fetched, found absent, allowed with a warning that says so.
    let nowhere = context::unique("ctx-nowhere");
    let r = validate(&mut c, trainjob_review_in(&ns, &nowhere, "d")).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(
        warnings(&r).contains(&format!(
            "its runtime ClusterTrainingRuntime \"{nowhere}\" was not found; it was allowed"
        )),
        "{r}"
    );
    assert_eq!(fetches(&server, "absent").await, 1.0);
    server.running.shutdown().await;
}

/// (Stand-in: the runtimes' watch is held back, so that only a GET can know the new one.)
#[tokio::test]
async fn a_runtime_the_watch_has_not_delivered_is_fetched_once() {
    let api = with_trainer().await;
    let server = server_against(&api).await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, true).await;
    until("the first sync", async || ready(&mut c).await).await;
    api.insert("clustertrainingruntimes", runtime("bare", json!({})));
    policy_in_force(&mut c).await;
    // Hold the runtimes' watch back, so that only a GET can know the new runtime.
    let gets = api.count(Verb::Get, "clustertrainingruntimes");
    api.inject(Fault::delay(Duration::from_secs(30)).on("clustertrainingruntimes", Verb::Watch));
    api.break_watches();
    api.insert(
        "clustertrainingruntimes",
        runtime("fresh", json!({"requests": {"cpu": "4"}})),
    );
    for uid in ["c1", "c2"] {
        let r = validate(&mut c, trainjob_review("fresh", uid)).await;
        assert_eq!(r["allowed"], false, "{r}");
        let message = r["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("container \"node\" has no request for memory"),
            "judged by the fetched runtime: {message}"
        );
    }
    assert_eq!(
        api.count(Verb::Get, "clustertrainingruntimes"),
        gets + 1,
        "fetched once"
    );

    api.clear_faults();
    server.running.shutdown().await;
}

/// A cluster without Kubeflow Trainer (`envtest::bare_plane`): the server is ready, a
/// TrainJob (which such a cluster could not hold anyway) is allowed with a warning, and the
/// runtimes have no metric series.
#[tokio::test]
async fn without_trainer_the_server_is_ready_and_allows_with_a_warning() {
    let Some(cp) = common::envtest::bare_plane() else {
        return;
    };
    let ns = cp.namespace("no-trainer", &[]).await;
    let kubeconfig = context::shipped_identity(cp, &ns).await;
    let server = without_default_limits(context::serve(kubeconfig, |_| {}).await);
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    until("the first sync", async || ready(&mut c).await).await;
    // Once their lists answered 404, the runtimes have no metric series.
    until("the runtimes found not served", async || {
        let text = net::get_metrics(server.running.metrics_addr.unwrap()).await;
        text.contains("tollgate_cluster_cache_synced") && !text.contains("trainingruntimes")
    })
    .await;
    let r = validate(&mut c, trainjob_review_in(&ns, "torch-distributed", "e")).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(
        warnings(&r).contains("ClusterTrainingRuntime \"torch-distributed\""),
        "{r}"
    );
    server.running.shutdown().await;
}

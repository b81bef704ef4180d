//! The server's cluster context: the same code a cluster runs (kube's client, watcher and
//! reflector; real TLS to the webhook).
//!
//! Against the real apiserver (`common::envtest`), as the ServiceAccount bound to the RBAC
//! tollgate ships (deploy/base/rbac.yaml), so that the tests also prove it suffices: claim
//! templates and namespace labels read from the watched caches, and a template that does
//! not exist fetched once and said so.
//!
//! Against the in-process stand-in (crates/apiserver-standin), what the real one cannot be
//! made to do on cue: a list failing (503) until told otherwise, a watch held back so that
//! only a GET knows a new object, a GET that does not answer in time, a watch broken
//! mid-stream with its history compacted (410).

use crate::common;

use std::time::Duration;

use apiserver::{ApiServer, Fault, Verb};
use common::context;
use common::net::{self, metric, ready, until, Client, TestServer};
use serde_json::{json, Value};
use tollgate::server::ClusterOptions;
use tollgate_apiserver_standin as apiserver;

const NS: &str = "ml-cap2-1796114155";

fn template(name: &str, device_class: &str, count: u32) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": device_class, "count": count}}
        ]}}}
    })
}

/// The dra-trainer pod (its claim names the template `two-gpus`), with another template.
fn dra_review(template_name: &str, uid: &str) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&common::fixture("dra-trainer.mutate.json")).unwrap();
    v["request"]["uid"] = json!(uid);
    v["request"]["object"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] =
        json!(template_name);
    serde_json::to_vec(&v).unwrap()
}

async fn server_against(
    api: &ApiServer,
    tweak: impl FnOnce(&mut tollgate::server::ServeOptions),
) -> TestServer {
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    api.write_kubeconfig(kubeconfig.path()).unwrap();
    let path = kubeconfig.into_temp_path().keep().unwrap();
    net::start(|o| {
        o.cluster = Some(ClusterOptions {
            kubeconfig: Some(path),
            context: None,
            fetch_timeout: Duration::from_millis(800),
        });
        tweak(o);
    })
    .await
}

/// The review's response, with the patch decoded.
async fn mutate(c: &mut Client, body: Vec<u8>) -> Value {
    let (status, bytes) = c.post("/mutate", body).await;
    assert_eq!(status, 200);
    let mut v: Value = serde_json::from_slice(&bytes).unwrap();
    if let Some(p) = v["response"]["patch"].as_str() {
        use base64::Engine as _;
        let ops = base64::engine::general_purpose::STANDARD.decode(p).unwrap();
        v["response"]["patch"] = serde_json::from_slice(&ops).unwrap();
    }
    v["response"].take()
}

/// The count of fetches of claim templates that ended with `result`.
async fn template_fetches(server: &TestServer, result: &str) -> Option<f64> {
    metric(
        server,
        "tollgate_cluster_fetches_total",
        &[("resource", "resourceclaimtemplates"), ("result", result)],
    )
    .await
}

fn adds_gpu_toleration(response: &Value) -> bool {
    response["patch"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|op| {
            op["path"]
                .as_str()
                .unwrap()
                .starts_with("/spec/tolerations")
                && op["value"].to_string().contains("nvidia.com/gpu")
        })
}

fn warnings(response: &Value) -> String {
    response["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The dra-trainer pod in namespace `ns` (its claim names the template `template_name`).
fn dra_review_in(ns: &str, template_name: &str, uid: &str) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&dra_review(template_name, uid)).unwrap();
    v["request"]["namespace"] = json!(ns);
    v["request"]["object"]["metadata"]["namespace"] = json!(ns);
    serde_json::to_vec(&v).unwrap()
}

/// The claim template arrives by the list and serves reviews from the cache (no GET); one
/// that does not exist is fetched once, found absent, and said so.
#[tokio::test]
async fn reviews_read_claim_templates_from_the_watched_cache() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let admin = cp.client("admin").await;
    let ns = cp.namespace("ctx-templates", &[]).await;
    let mut t = template("two-gpus", "gpu.nvidia.com", 2);
    t["metadata"]["namespace"] = json!(ns);
    context::create(&admin, &t).await;
    let server = context::serve(context::shipped_identity(cp, &ns).await, |_| {}).await;
    for h2 in [false, true] {
        let mut c = Client::connect(server.addr(), &server.ca_pem, h2).await;
        until("the first sync", async || ready(&mut c).await.0 == 200).await;
        let r = mutate(&mut c, dra_review_in(&ns, "two-gpus", &format!("a{h2}"))).await;
        assert!(adds_gpu_toleration(&r), "{r}");
    }
    // From the cache: no GET was needed.
    for result in ["found", "absent", "failed"] {
        assert_eq!(
            template_fetches(&server, result).await,
            Some(0.0),
            "{result}"
        );
    }
    // The shipped RBAC lets every cache of what this apiserver serves list and watch.
    for resource in [
        "resourceclaims",
        "resourceclaimtemplates",
        "namespaces",
        "nodes",
        "resourcequotas",
        "deviceclasses",
    ] {
        let r = [("resource", resource)];
        assert_eq!(
            metric(&server, "tollgate_cluster_cache_synced", &r).await,
            Some(1.0),
            "{resource}"
        );
    }

    // One that does not exist: fetched, found absent, said so; not fetched again at once.
    let mut c = Client::connect(server.addr(), &server.ca_pem, true).await;
    for uid in ["d1", "d2"] {
        let r = mutate(&mut c, dra_review_in(&ns, "nowhere", uid)).await;
        assert!(!adds_gpu_toleration(&r), "{r}");
        assert!(warnings(&r).contains("(it does not exist)"), "{r}");
    }
    assert_eq!(template_fetches(&server, "absent").await, Some(1.0));
    assert_eq!(template_fetches(&server, "found").await, Some(0.0));
    server.running.shutdown().await;
}

#[tokio::test]
async fn readyz_waits_for_the_first_sync() {
    let api = ApiServer::start().await;
    // Listing namespaces fails for a while: the server serves, but is not ready.
    api.inject(Fault::status(503).on("namespaces", Verb::List));
    let server = server_against(&api, |_| {}).await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    until("a failed list", async || {
        api.count(Verb::List, "namespaces") > 0
    })
    .await;
    let (status, text) = ready(&mut c).await;
    assert_eq!(status, 503);
    assert!(text.contains("namespaces"), "{text}");
    // Reviews are still answered meanwhile.
    let r = mutate(&mut c, dra_review("two-gpus", "b")).await;
    assert_eq!(r["allowed"], true);
    api.clear_faults();
    until("the sync", async || ready(&mut c).await.0 == 200).await;
    server.running.shutdown().await;
}

/// A template applied with its Job may not have reached the watch yet: it is fetched once,
/// and what the fetch found serves the pods that follow. (Stand-in: the watch is held back
/// so that only a GET can know it.)
#[tokio::test]
async fn a_template_missing_from_the_cache_is_fetched_once() {
    let api = ApiServer::start().await;
    let server = server_against(&api, |_| {}).await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, true).await;
    until("the first sync", async || ready(&mut c).await.0 == 200).await;
    // Hold the template watch back, so that only a GET can know the new template.
    api.inject(Fault::delay(Duration::from_secs(30)).on("resourceclaimtemplates", Verb::Watch));
    api.break_watches();
    api.insert(
        "resourceclaimtemplates",
        template("fresh", "gpu.nvidia.com", 1),
    );
    for uid in ["c1", "c2", "c3"] {
        let r = mutate(&mut c, dra_review("fresh", uid)).await;
        assert!(adds_gpu_toleration(&r), "{r}");
    }
    assert_eq!(
        api.count(Verb::Get, "resourceclaimtemplates"),
        1,
        "fetched once"
    );
    assert_eq!(template_fetches(&server, "found").await, Some(1.0));
    api.clear_faults();
    server.running.shutdown().await;
}

/// The GET is bounded: an apiserver that does not answer in time leaves the review to what
/// the pod alone shows, with a warning, and the review is still answered.
#[tokio::test]
async fn a_slow_fetch_is_cut_short() {
    let api = ApiServer::start().await;
    let server = server_against(&api, |_| {}).await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    until("the first sync", async || ready(&mut c).await.0 == 200).await;
    api.inject(Fault::delay(Duration::from_secs(30)).on("resourceclaimtemplates", Verb::Get));
    let r = mutate(&mut c, dra_review("slow", "e")).await;
    assert_eq!(r["allowed"], true);
    assert!(!adds_gpu_toleration(&r));
    assert!(
        warnings(&r).contains("could not read ResourceClaimTemplate \"slow\""),
        "{r}"
    );
    assert_eq!(template_fetches(&server, "failed").await, Some(1.0));
    api.clear_faults();
    server.running.shutdown().await;
}

/// A watch that breaks keeps the last state, is retried, and shows in the metrics; after
/// a 410 the cache relists and converges (a template deleted meanwhile is gone).
#[tokio::test]
async fn a_broken_watch_keeps_the_last_state_and_recovers() {
    let api = ApiServer::start().await;
    api.insert(
        "resourceclaimtemplates",
        template("two-gpus", "gpu.nvidia.com", 2),
    );
    api.insert(
        "resourceclaimtemplates",
        template("doomed", "gpu.nvidia.com", 1),
    );
    let server = server_against(&api, |_| {}).await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, true).await;
    until("the first sync", async || ready(&mut c).await.0 == 200).await;
    let templates = [("resource", "resourceclaimtemplates")];
    let restarts = async || {
        metric(&server, "tollgate_cluster_watch_restarts_total", &templates)
            .await
            .unwrap_or(0.0)
    };
    assert_eq!(restarts().await, 0.0);

    // The apiserver fails every watch and list of templates.
    api.inject(Fault::status(500).on("resourceclaimtemplates", Verb::Watch));
    api.inject(Fault::status(500).on("resourceclaimtemplates", Verb::List));
    api.compact();
    api.break_watches();
    until("a counted watch failure", async || restarts().await >= 1.0).await;
    // The last state still serves reviews, without a GET.
    let r = mutate(&mut c, dra_review("two-gpus", "f")).await;
    assert!(adds_gpu_toleration(&r), "{r}");
    assert_eq!(api.count(Verb::Get, "resourceclaimtemplates"), 0);
    assert_eq!(
        metric(&server, "tollgate_cluster_cache_synced", &templates).await,
        Some(1.0),
        "still synced once: the last state stands"
    );

    // Meanwhile a template goes away; once the apiserver answers, the 410 forces a relist.
    api.remove("resourceclaimtemplates", Some(NS), "doomed");
    api.clear_faults();
    let lists = api.count(Verb::List, "resourceclaimtemplates");
    until("a relist", async || {
        api.count(Verb::List, "resourceclaimtemplates") > lists
    })
    .await;
    until("the deleted template gone from the cache", async || {
        let r = mutate(&mut c, dra_review("doomed", "g")).await;
        !adds_gpu_toleration(&r)
    })
    .await;
    server.running.shutdown().await;
}

const RESEARCH: &str = "profiles:\n  - name: research\n    match:\n      namespaceSelector:\n        matchLabels: {team: research}\n    validation:\n      mode: warn\n";

/// The notebook-helper fixture's validation review, in namespace `ns`.
fn notebook(ns: &str, uid: &str) -> Vec<u8> {
    let mut v: Value =
        serde_json::from_slice(&common::fixture("notebook-helper.validate.json")).unwrap();
    v["request"]["namespace"] = json!(ns);
    v["request"]["object"]["metadata"]["namespace"] = json!(ns);
    v["request"]["uid"] = json!(uid);
    serde_json::to_vec(&v).unwrap()
}

async fn allowed(c: &mut Client, body: Vec<u8>) -> Value {
    let (_, body) = c.post("/validate", body).await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    v["response"]["allowed"].clone()
}

/// Profiles that match on namespace labels read them from the cluster context: a
/// namespace labelled `team: research` gets the profile's warn mode, and one created after
/// the server started too (by the watch); elsewhere the base policy enforces.
#[tokio::test]
async fn profiles_match_namespace_labels_from_the_cluster_context() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let research = cp.namespace("ctx-research", &[("team", "research")]).await;
    let elsewhere = cp.namespace("ctx-elsewhere", &[]).await;
    let server = context::serve(context::shipped_identity(cp, &research).await, |_| {}).await;
    std::fs::write(server.policy_path(), RESEARCH).unwrap();
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    until("the first sync", async || ready(&mut c).await.0 == 200).await;
    until("the profile policy in force", async || {
        allowed(&mut c, notebook(&research, "h")).await == true
    })
    .await;
    assert_eq!(allowed(&mut c, notebook(&elsewhere, "j")).await, false);

    // A namespace created now reaches the cache by the watch (or, if a review comes first,
    // one GET): the profile applies there as well.
    let later = cp
        .namespace("ctx-research-later", &[("team", "research")])
        .await;
    until("the new namespace's profile", async || {
        allowed(&mut c, notebook(&later, "i")).await == true
    })
    .await;
    let research = [("endpoint", "validate"), ("profile", "research")];
    let reviews = metric(&server, "tollgate_profile_reviews_total", &research).await;
    assert!(reviews.unwrap() >= 2.0);
    server.running.shutdown().await;
}

/// A namespace created a moment ago and not yet in the cache is fetched once (stand-in:
/// the namespaces' watch is held back so that only a GET can know it).
#[tokio::test]
async fn a_namespace_the_watch_has_not_delivered_is_fetched_once() {
    let api = ApiServer::start().await;
    api.insert(
        "namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": NS, "labels": {"team": "research"}}}),
    );
    let server = server_against(&api, |_| {}).await;
    std::fs::write(server.policy_path(), RESEARCH).unwrap();
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    until("the first sync", async || ready(&mut c).await.0 == 200).await;
    until("the profile policy in force", async || {
        allowed(&mut c, notebook(NS, "h")).await == true
    })
    .await;

    api.inject(Fault::delay(Duration::from_secs(30)).on("namespaces", Verb::Watch));
    api.break_watches();
    api.insert(
        "namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "research-new", "labels": {"team": "research"}}}),
    );
    for uid in ["i1", "i2"] {
        assert_eq!(allowed(&mut c, notebook("research-new", uid)).await, true);
    }
    assert_eq!(api.count(Verb::Get, "namespaces"), 1);
    api.clear_faults();
    server.running.shutdown().await;
}

/// Without the cluster context, namespace labels are unknown: a policy matching on them is
/// refused at start and on reload, saying why.
#[tokio::test]
async fn namespace_label_profiles_need_the_cluster_context() {
    let policy = "profiles:\n  - name: research\n    match:\n      namespaceSelector:\n        matchLabels: {team: research}\n";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.yaml"), policy).unwrap();
    let bundle = tollgate::certs::generate(&["127.0.0.1".into()], 1).unwrap();
    tollgate::certs::write(dir.path(), &bundle).unwrap();
    let err = match tollgate::server::start(net::options(dir.path())).await {
        Ok(_) => panic!("started with a policy it cannot apply"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("profile \"research\" matches on namespace labels"),
        "{err}"
    );
    assert!(err.contains("--cluster-context off"), "{err}");

    // A running server without the context refuses the same policy on reload.
    let server = net::start(|_| {}).await;
    std::fs::write(server.policy_path(), policy).unwrap();
    until("the reload refused", async || {
        metric(&server, "tollgate_policy_file_rejected", &[]).await == Some(1.0)
    })
    .await;
    server.running.shutdown().await;
}

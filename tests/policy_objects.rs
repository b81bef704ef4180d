//! The policy as Kubernetes objects, against the real apiserver: the server watches the
//! cluster's TollgatePolicy and the namespaces' TollgateProfiles and puts them in force
//! within seconds, without a restart, says what became of each in its status, and is
//! never stopped by one: an object stored that does not load (no webhook was there to
//! refuse it) leaves the last good spec in force, and says why.
//!
//! On a control plane of these tests' own (`envtest::policy_objects_plane`): every server
//! with its cluster context watches the cluster's one TollgatePolicy. The tests share it
//! one at a time ([`serial`]), as they share the Lease `tollgate-policy-status`, and
//! delete what they create.
//!
//! What a plane without the CRDs does (the file in force, ready anyway) is shown against
//! the in-process stand-in, which serves no tollgate.dev.

use crate::common;

use std::time::Duration;

use common::envtest::ControlPlane;
use common::net::{self, metric, ready, until, Client, TestServer};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{json, Value};
use tollgate::cluster::objects::ObjectKind;
use tollgate::server::ClusterOptions;

/// One test at a time: the TollgatePolicy is cluster-wide, and so is the status Lease
/// (the turn tests/policy_crds.rs takes too, on the same plane).
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    common::policy::cluster_policy_turn().await
}

/// The plane with the CRDs installed as deploy/ ships them.
async fn plane() -> Option<&'static ControlPlane> {
    let cp = common::envtest::policy_objects_plane()?;
    common::policy::install_crds(cp).await?;
    Some(cp)
}

fn api(client: &kube::Client, kind: ObjectKind, namespace: Option<&str>) -> Api<DynamicObject> {
    let ar = kind.api_resource();
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// Creates or replaces the spec of the TollgatePolicy `default` (None) or the
/// TollgateProfile `default` of a namespace.
async fn apply(client: &kube::Client, namespace: Option<&str>, spec: Value) {
    let kind = if namespace.is_some() {
        ObjectKind::Profile
    } else {
        ObjectKind::Policy
    };
    let mut object = json!({
        "apiVersion": "tollgate.dev/v1alpha1",
        "kind": kind.kind(),
        "metadata": {"name": "default"},
        "spec": spec,
    });
    if let Some(ns) = namespace {
        object["metadata"]["namespace"] = json!(ns);
    }
    let api = api(client, kind, namespace);
    let params = PatchParams::apply("policy-objects-test").force();
    api.patch("default", &params, &Patch::Apply(&object))
        .await
        .unwrap_or_else(|e| panic!("applying {} default: {e}", kind.kind()));
}

async fn delete(client: &kube::Client, namespace: Option<&str>) {
    let kind = if namespace.is_some() {
        ObjectKind::Profile
    } else {
        ObjectKind::Policy
    };
    let api = api(client, kind, namespace);
    match api.delete("default", &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("deleting {} default: {e}", kind.kind()),
    }
    until("the object gone", async || {
        api.get_opt("default").await.unwrap().is_none()
    })
    .await;
}

/// The object's generation and `status`.
async fn status(client: &kube::Client, namespace: Option<&str>) -> (i64, Value) {
    let kind = if namespace.is_some() {
        ObjectKind::Profile
    } else {
        ObjectKind::Policy
    };
    let o = api(client, kind, namespace).get("default").await.unwrap();
    (
        o.metadata.generation.unwrap(),
        o.data.get("status").cloned().unwrap_or(Value::Null),
    )
}

/// The `Ready` condition of the object's status, once its status says the generation
/// stored was observed.
async fn ready_condition(client: &kube::Client, namespace: Option<&str>) -> Value {
    let mut found = Value::Null;
    until("the status of the generation stored", async || {
        let (generation, s) = status(client, namespace).await;
        let c = s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready")
            .cloned();
        match c {
            Some(c)
                if s["observedGeneration"] == generation
                    && c["observedGeneration"] == generation =>
            {
                found = c;
                true
            }
            _ => false,
        }
    })
    .await;
    found
}

/// A server watching the plane as its admin (the ServiceAccount's RBAC for these kinds is
/// deploy/'s, tested there). Its namespace, for the Lease, is the kubeconfig's: default.
async fn serve(cp: &ControlPlane) -> TestServer {
    common::context::serve(cp.kubeconfig("admin"), |_| {}).await
}

/// The MIG trainer pod (one GPU) in `ns`, as the apiserver sends it.
fn review_in(ns: &str, uid: &str) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&common::fixture("mig-trainer.mutate.json")).unwrap();
    v["request"]["uid"] = json!(uid);
    v["request"]["namespace"] = json!(ns);
    v["request"]["object"]["metadata"]["namespace"] = json!(ns);
    serde_json::to_vec(&v).unwrap()
}

/// The memory limit the review's patch gives the trainer (None: none).
async fn memory_limit(c: &mut Client, ns: &str) -> Option<String> {
    use base64::Engine as _;
    let (status, bytes) = c.post("/mutate", review_in(ns, "u")).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    let patch = v["response"]["patch"].as_str()?;
    let ops: Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(patch)
            .unwrap(),
    )
    .unwrap();
    ops.as_array().unwrap().iter().find_map(|op| {
        let path = op["path"].as_str().unwrap();
        if path.ends_with("/resources/limits/memory") {
            return op["value"].as_str().map(str::to_owned);
        }
        if path.ends_with("/resources/limits") {
            return op["value"]["memory"].as_str().map(str::to_owned);
        }
        None
    })
}

fn per_gpu_memory(m: &str) -> Value {
    json!({"mutation": {"defaultResources": {"perGpu": {"memory": m}}}})
}

async fn objects_metric(server: &TestServer, kind: &str, state: &str) -> Option<f64> {
    metric(
        server,
        "tollgate_policy_objects",
        &[("kind", kind), ("state", state)],
    )
    .await
}

/// A TollgatePolicy and a TollgateProfile each come in force within seconds, and their
/// status says so; the profile only for its namespace; one that does not load (an
/// unparseable quantity, a bound crossed) keeps the last good spec and says why, in its
/// status and metrics; the TollgatePolicy deleted, the file is in force again.
#[tokio::test]
async fn objects_come_in_force_keep_the_last_good_spec_and_say_so() {
    let Some(cp) = plane().await else { return };
    let _serial = serial().await;
    let admin = cp.client("admin").await;
    let ns_a = cp.namespace("objects-a", &[]).await;
    let ns_b = cp.namespace("objects-b", &[]).await;
    let server = serve(cp).await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, true).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let file_limit = memory_limit(&mut c, &ns_b).await;
    assert_ne!(file_limit.as_deref(), Some("48Gi"));

    // The cluster's policy: in force for every namespace, Ready True.
    apply(&admin, None, per_gpu_memory("48Gi")).await;
    until("the TollgatePolicy in force", async || {
        memory_limit(&mut c, &ns_b).await.as_deref() == Some("48Gi")
    })
    .await;
    let cond = ready_condition(&admin, None).await;
    assert_eq!(cond["status"], "True", "{cond}");
    assert_eq!(cond["reason"], "InForce", "{cond}");
    assert_eq!(
        objects_metric(&server, "TollgatePolicy", "in_force").await,
        Some(1.0)
    );

    // A namespace's profile: in force there, not in the other namespace.
    apply(&admin, Some(&ns_a), per_gpu_memory("40Gi")).await;
    until("the TollgateProfile in force", async || {
        memory_limit(&mut c, &ns_a).await.as_deref() == Some("40Gi")
    })
    .await;
    assert_eq!(memory_limit(&mut c, &ns_b).await.as_deref(), Some("48Gi"));
    let cond = ready_condition(&admin, Some(&ns_a)).await;
    assert_eq!(cond["status"], "True", "{cond}");
    let in_force_since = cond["lastTransitionTime"].clone();
    assert_eq!(
        objects_metric(&server, "TollgateProfile", "in_force").await,
        Some(1.0)
    );
    // The profile label: the cluster's profile (none: base) and +ns, not the namespace.
    assert!(
        metric(
            &server,
            "tollgate_profile_reviews_total",
            &[("endpoint", "mutate"), ("profile", "base+ns")]
        )
        .await
        .unwrap_or(0.0)
            >= 1.0
    );

    // A quantity that does not parse, stored (no webhook refused it): the last good spec
    // stays in force; Ready False, the field and the reason in the status and metrics.
    // (A second later, so that the flip shows in lastTransitionTime, which has seconds.)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    apply(&admin, Some(&ns_a), per_gpu_memory("lots")).await;
    let cond = ready_condition(&admin, Some(&ns_a)).await;
    assert_eq!(cond["status"], "False", "{cond}");
    assert_eq!(cond["reason"], "Invalid", "{cond}");
    let message = cond["message"].as_str().unwrap();
    assert!(
        message.contains("spec.mutation.defaultResources.perGpu"),
        "{message}"
    );
    assert!(
        message.contains("last good spec stays in force"),
        "{message}"
    );
    assert_ne!(cond["lastTransitionTime"], in_force_since, "it flipped");
    assert_eq!(memory_limit(&mut c, &ns_a).await.as_deref(), Some("40Gi"));
    assert_eq!(
        objects_metric(&server, "TollgateProfile", "last_good").await,
        Some(1.0)
    );
    assert_eq!(
        metric(
            &server,
            "tollgate_policy_object_rejections_total",
            &[("kind", "TollgateProfile"), ("reason", "Invalid")]
        )
        .await,
        Some(1.0)
    );

    // A bound crossed (validation loosened, which mayLoosen does not allow): the same.
    apply(
        &admin,
        Some(&ns_a),
        json!({"validation": {"mode": "warn"}, "mutation": {"defaultResources": {"perGpu": {"memory": "44Gi"}}}}),
    )
    .await;
    let cond = ready_condition(&admin, Some(&ns_a)).await;
    assert_eq!(cond["status"], "False", "{cond}");
    assert_eq!(cond["reason"], "OutOfBounds", "{cond}");
    let message = cond["message"].as_str().unwrap();
    assert!(message.contains("spec.validation.mode"), "{message}");
    assert!(message.contains("mayLoosen"), "{message}");
    assert_eq!(memory_limit(&mut c, &ns_a).await.as_deref(), Some("40Gi"));

    // The status written once: the writer's own write (a new resourceVersion, the same
    // generation) writes nothing more.
    let writes = metric(
        &server,
        "tollgate_policy_status_writes_total",
        &[("result", "success")],
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        metric(
            &server,
            "tollgate_policy_status_writes_total",
            &[("result", "success")]
        )
        .await,
        writes
    );

    // The TollgatePolicy deleted: the file's policy again, where no profile is.
    delete(&admin, None).await;
    until("the file in force again", async || {
        memory_limit(&mut c, &ns_b).await == file_limit
    })
    .await;
    delete(&admin, Some(&ns_a)).await;
    until("the profile gone", async || {
        memory_limit(&mut c, &ns_a).await == file_limit
    })
    .await;
    server.running.shutdown().await;
}

/// A restart with objects stored: ready with them in force, not the file first.
#[tokio::test]
async fn a_restart_with_objects_stored_is_ready_with_them_in_force() {
    let Some(cp) = plane().await else { return };
    let _serial = serial().await;
    let admin = cp.client("admin").await;
    let ns = cp.namespace("objects-restart", &[]).await;
    apply(&admin, None, per_gpu_memory("48Gi")).await;
    apply(&admin, Some(&ns), per_gpu_memory("40Gi")).await;
    let other = cp.namespace("objects-restart-other", &[]).await;
    let server = serve(cp).await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    // At the first 200, both are in force.
    assert_eq!(memory_limit(&mut c, &ns).await.as_deref(), Some("40Gi"));
    assert_eq!(memory_limit(&mut c, &other).await.as_deref(), Some("48Gi"));
    server.running.shutdown().await;
    delete(&admin, Some(&ns)).await;
    delete(&admin, None).await;
}

/// A cluster without the CRDs (the stand-in serves no tollgate.dev): ready on the file,
/// the metrics say the kinds are not served, reviews as ever.
#[tokio::test]
async fn without_the_crds_the_file_is_in_force_and_the_server_ready() {
    let api = tollgate_apiserver_standin::ApiServer::start().await;
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    api.write_kubeconfig(kubeconfig.path()).unwrap();
    let path = kubeconfig.into_temp_path().keep().unwrap();
    let server = net::start(|o| {
        o.cluster = Some(ClusterOptions {
            kubeconfig: Some(path),
            context: None,
            fetch_timeout: Duration::from_millis(800),
        });
    })
    .await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    until("the kinds said not served", async || {
        metric(
            &server,
            "tollgate_policy_objects_served",
            &[("kind", "TollgatePolicy")],
        )
        .await
            == Some(0.0)
            && metric(
                &server,
                "tollgate_policy_objects_served",
                &[("kind", "TollgateProfile")],
            )
            .await
                == Some(0.0)
    })
    .await;
    assert!(memory_limit(&mut c, "ml").await.is_some());
    server.running.shutdown().await;
}

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
//! What a cluster without the CRDs does (the file in force, ready anyway) is shown on
//! `envtest::bare_plane`, where no test installs them.

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

/// A cluster without the CRDs (`envtest::bare_plane`, which serves no tollgate.dev): ready
/// on the file, the metrics say the kinds are not served, reviews as ever.
#[tokio::test]
async fn without_the_crds_the_file_is_in_force_and_the_server_ready() {
    let Some(cp) = common::envtest::bare_plane() else {
        return;
    };
    let path = cp.kubeconfig("admin");
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

/// deploy/base's webhook for the two kinds (`policies.tollgate.dev`, rules, failurePolicy
/// and all, as shipped), pointed at `server` and narrowed by the objects' label
/// `tollgate-bounds=<selector>` to this test's objects (other tests on the plane apply
/// TollgateProfiles and dry-run TollgatePolicies of their own).
fn objects_webhook(server: &TestServer, selector: &str) -> Value {
    use base64::Engine as _;
    let text = std::fs::read_to_string(
        common::root().join("deploy/base/validatingwebhookconfiguration.yaml"),
    )
    .unwrap();
    let mut c: Value = serde_saphyr::from_str(&text).unwrap();
    let mut w = c["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "policies.tollgate.dev")
        .expect("deploy/base registers policies.tollgate.dev")
        .clone();
    let path = w["clientConfig"]["service"]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    w["clientConfig"] = json!({
        "url": format!("https://127.0.0.1:{}{path}", server.addr().port()),
        "caBundle": base64::engine::general_purpose::STANDARD.encode(&server.ca_pem),
    });
    w["objectSelector"] = json!({"matchLabels": {"tollgate-bounds": selector}});
    c["metadata"] = json!({"name": format!("tollgate-bounds-{selector}")});
    c["webhooks"] = json!([w]);
    c
}

/// kubectl, off the test's runtime: the apiserver it waits on calls the test's server,
/// which that runtime serves.
async fn kubectl(
    kubeconfig: &std::path::Path,
    args: &[&str],
    stdin: Option<&Value>,
) -> (bool, String, String) {
    let kubeconfig = kubeconfig.to_owned();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let stdin = stdin.cloned();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::policy::kubectl(&kubeconfig, &args, stdin.as_ref()).expect("kubectl")
    })
    .await
    .unwrap()
}

/// A TollgatePolicy (`namespace` None) or TollgateProfile `default` with `spec`, labelled
/// for the test's webhook.
fn object(namespace: Option<&str>, selector: &str, spec: &Value) -> Value {
    let mut o = json!({
        "apiVersion": "tollgate.dev/v1alpha1",
        "kind": if namespace.is_some() { "TollgateProfile" } else { "TollgatePolicy" },
        "metadata": {"name": "default", "labels": {"tollgate-bounds": selector}},
        "spec": spec,
    });
    if let Some(ns) = namespace {
        o["metadata"]["namespace"] = json!(ns);
    }
    o
}

/// Each bound a TollgateProfile is held to, refused at `kubectl apply` by tollgate's own
/// webhook as deploy/base registers it, in the words a namespace's admin reads (the field,
/// the bound, the `mayLoosen` that would allow it); and each allowed, stored and in force
/// once the cluster's TollgatePolicy lists its section in `namespaceProfiles.mayLoosen`.
/// A TollgatePolicy is refused for what its schema cannot see (a quantity, a validation
/// refusing its own mutation), and admitted with a warning when it tightens `mayLoosen`
/// under a profile stored, which its status then says is out of bounds.
#[tokio::test]
async fn each_bound_is_refused_at_apply_and_allowed_once_may_loosen_names_it() {
    let Some(cp) = plane().await else { return };
    let _turn = serial().await;
    let admin = cp.client("admin").await;
    let kubeconfig = cp.kubeconfig("admin");
    let server = serve(cp).await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let ns = cp.namespace("bounds", &[]).await;
    let registration = objects_webhook(&server, &ns);
    let (ok, _, err) = kubectl(&kubeconfig, &["apply", "-f", "-"], Some(&registration)).await;
    assert!(ok, "registering the webhook: {err}");

    // One case per section, each crossing the bound the built-in policy sets there.
    let cases = [
        (
            json!({"validation": {"mode": "warn"}}),
            "validation",
            "spec.validation.mode",
        ),
        (
            json!({"validation": {"requiredRequests": ["cpu"]}}),
            "validation",
            "spec.validation.requiredRequests",
        ),
        (
            json!({"optOut": {"groups": ["*"]}}),
            "optOut",
            "spec.optOut.groups",
        ),
        (
            json!({"mutation": {"gpuTolerations": {"enabled": false}}}),
            "mutation",
            "spec.mutation.gpuTolerations.enabled",
        ),
        (
            json!({"gpu": {"classes": {"nvidia": {"tolerations": []}}}}),
            "gpu",
            "spec.gpu.classes.nvidia.tolerations",
        ),
        (
            json!({"feasibility": {"mode": "off"}}),
            "feasibility",
            "spec.feasibility.mode",
        ),
        (
            json!({"workloads": {"enabled": false}}),
            "workloads",
            "spec.workloads.enabled",
        ),
    ];
    let apply = async |o: &Value, dry: bool| {
        let mut args = vec!["apply", "-f", "-"];
        if dry {
            args.push("--dry-run=server");
        }
        kubectl(&kubeconfig, &args, Some(o)).await
    };
    // The apiserver reads new webhook configurations a moment after they are stored.
    let first = object(Some(&ns), &ns, &cases[0].0);
    until("the webhook in effect", async || {
        !apply(&first, true).await.0
    })
    .await;
    for (spec, section, field) in &cases {
        let (ok, _, err) = apply(&object(Some(&ns), &ns, spec), false).await;
        assert!(!ok, "{spec}: stored");
        assert!(err.contains(&format!("field `{field}`")), "{spec}: {err}");
        assert!(
            err.contains(&format!("mayLoosen: [{section}]")),
            "{spec}: {err}"
        );
        assert!(
            api(&admin, ObjectKind::Profile, Some(&ns))
                .get_opt("default")
                .await
                .unwrap()
                .is_none(),
            "{spec}: stored"
        );
    }

    // What the schema cannot see of a TollgatePolicy, refused alike: a quantity that does
    // not parse, and a policy whose validation would refuse what its own mutation adds
    // (the metrics sidecar requests no ephemeral-storage).
    for (spec, words) in [
        (
            json!({"mutation": {"defaultResources": {"perGpu": {"memory": "lots"}}}}),
            "mutation.defaultResources.perGpu.memory",
        ),
        (
            json!({"validation": {"requiredRequests": ["cpu", "memory", "ephemeral-storage"]}}),
            "ephemeral-storage",
        ),
    ] {
        let (ok, _, err) = apply(&object(None, &ns, &spec), false).await;
        assert!(!ok, "{spec}: stored");
        assert!(err.contains("denied the request"), "{spec}: {err}");
        assert!(err.contains(words), "{spec}: {err}");
    }

    // The cluster lets namespaces loosen every section the cases cross.
    let sections: Vec<&str> = cases.iter().map(|c| c.1).collect();
    let policy = object(
        None,
        &ns,
        &json!({"namespaceProfiles": {"mayLoosen": sections}}),
    );
    let (ok, _, err) = apply(&policy, false).await;
    assert!(ok, "the TollgatePolicy: {err}");
    assert_eq!(ready_condition(&admin, None).await["status"], "True");
    for (spec, _, _) in &cases {
        let (ok, _, err) = apply(&object(Some(&ns), &ns, spec), false).await;
        assert!(ok, "{spec}: {err}");
        let cond = ready_condition(&admin, Some(&ns)).await;
        assert_eq!(cond["status"], "True", "{spec}: {cond}");
        delete(&admin, Some(&ns)).await;
    }

    // Tightening mayLoosen again does not refuse the TollgatePolicy for the profiles
    // stored under it: kubectl prints a warning naming each that will no longer be
    // applied, and its status says so.
    let (ok, _, err) = apply(&object(Some(&ns), &ns, &cases[0].0), false).await;
    assert!(ok, "{err}");
    assert_eq!(ready_condition(&admin, Some(&ns)).await["status"], "True");
    let (ok, _, err) = apply(&object(None, &ns, &json!({})), false).await;
    assert!(ok, "the TollgatePolicy tightened: {err}");
    assert!(
        err.contains("Warning:")
            && err.contains(&format!(
                "TollgateProfile {ns}/default would no longer be applied"
            )),
        "{err}"
    );
    until("the profile said out of bounds", async || {
        let (_, st) = status(&admin, Some(&ns)).await;
        st["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "False" && c["reason"] == "OutOfBounds")
    })
    .await;
    delete(&admin, Some(&ns)).await;

    delete(&admin, None).await;
    let (ok, _, err) = common::policy::kubectl(
        &kubeconfig,
        &[
            "delete",
            "validatingwebhookconfiguration",
            &format!("tollgate-bounds-{ns}"),
        ],
        None,
    )
    .unwrap();
    assert!(ok, "{err}");
    server.running.shutdown().await;
}

/// deploy/base's pod webhooks (mutating and validating, as shipped) pointed at `server`,
/// their namespaceSelectors narrowed to the namespaces labelled `tollgate-profile-pods=
/// <selector>`; the policy objects' webhook left out (not what this registration tests).
fn pod_webhooks(server: &TestServer, selector: &str) -> Vec<Value> {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(&server.ca_pem);
    let mut out = vec![];
    for file in [
        "deploy/base/mutatingwebhookconfiguration.yaml",
        "deploy/base/validatingwebhookconfiguration.yaml",
    ] {
        let text = std::fs::read_to_string(common::root().join(file)).unwrap();
        let mut c: Value = serde_saphyr::from_str(&text).unwrap();
        c["metadata"] = json!({"name": format!("tollgate-profile-pods-{selector}")});
        let webhooks: Vec<Value> = c["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w.get("namespaceSelector").is_some())
            .map(|w| {
                let mut w = w.clone();
                let path = w["clientConfig"]["service"]["path"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                w["clientConfig"] = json!({
                    "url": format!("https://127.0.0.1:{}{path}", server.addr().port()),
                    "caBundle": ca,
                });
                w["namespaceSelector"]["matchLabels"]["tollgate-profile-pods"] = json!(selector);
                w
            })
            .collect();
        assert!(!webhooks.is_empty(), "{file}");
        c["webhooks"] = json!(webhooks);
        out.push(c);
    }
    out
}

/// Through the real apiserver, as a pod is made: with deploy/base's pod webhooks pointed at
/// the server, a GPU pod created in a namespace whose TollgateProfile sets its per-GPU
/// memory is stored with that limit, and the applied annotation names the profile; the
/// same pod in another namespace gets the cluster's default (what a review of it there
/// answers).
#[tokio::test]
async fn a_pod_created_through_the_apiserver_gets_its_namespaces_profile() {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::PostParams;

    let Some(cp) = plane().await else { return };
    let _turn = serial().await;
    let admin = cp.client("admin").await;
    let server = serve(cp).await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    until("ready", async || ready(&mut c).await.0 == 200).await;
    let selector = format!("pp{}", std::process::id());
    let labels = [
        ("tollgate-profile-pods", selector.as_str()),
        ("tollgate.dev/enforce", "enabled"),
    ];
    let ns_a = cp.namespace("profile-pods-a", &labels).await;
    let ns_b = cp.namespace("profile-pods-b", &labels).await;
    for r in pod_webhooks(&server, &selector) {
        common::context::create(&admin, &r).await;
    }

    apply(&admin, Some(&ns_a), per_gpu_memory("40Gi")).await;
    assert_eq!(ready_condition(&admin, Some(&ns_a)).await["status"], "True");

    let fixture: Value =
        serde_json::from_slice(&common::fixture("mig-trainer.mutate.json")).unwrap();
    let pod_in = |ns: &str| -> Pod {
        let mut o = common::apiserver::for_create(&fixture["request"]["object"], ns);
        o["metadata"]["namespace"] = json!(ns);
        if let Some(Value::Object(a)) = o["metadata"].get_mut("annotations") {
            a.retain(|k, _| !k.starts_with("tollgate.dev/"));
        }
        serde_json::from_value(o).unwrap()
    };
    let memory = |p: &Pod| {
        p.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("memory"))
            .map(|q| q.0.clone())
    };
    let applied = |p: &Pod| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("tollgate.dev/applied"))
            .cloned()
            .unwrap_or_default()
    };
    // The apiserver reads new webhook configurations a moment after they are stored.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let pods_b: Api<Pod> = Api::namespaced(admin.clone(), &ns_b);
    until("the webhooks in effect", async || {
        pods_b
            .create(&dry, &pod_in(&ns_b))
            .await
            .is_ok_and(|p| !applied(&p).is_empty())
    })
    .await;

    let a = Api::<Pod>::namespaced(admin.clone(), &ns_a)
        .create(&PostParams::default(), &pod_in(&ns_a))
        .await
        .expect("the pod in the profile's namespace");
    let b = pods_b
        .create(&PostParams::default(), &pod_in(&ns_b))
        .await
        .expect("the pod in the other namespace");
    assert_eq!(memory(&a).as_deref(), Some("40Gi"), "{}", applied(&a));
    // The cluster's default there, as the server answers a review of the same pod.
    let cluster_default = memory_limit(&mut c, &ns_b).await;
    assert_ne!(cluster_default.as_deref(), Some("40Gi"));
    assert_eq!(memory(&b), cluster_default, "{}", applied(&b));
    assert!(applied(&a).contains(&ns_a), "{}", applied(&a));
    assert!(!applied(&b).contains(&ns_a), "{}", applied(&b));

    let name = format!("tollgate-profile-pods-{selector}");
    Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(admin.clone())
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    delete(&admin, Some(&ns_a)).await;
    server.running.shutdown().await;
}

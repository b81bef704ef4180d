//! The real control plane of the tests (tests/common/envtest.rs) itself: it serves, it
//! authenticates the roster's tokens, RBAC holds the named users to what they are granted,
//! impersonation and `kubectl` work, and each test's namespace is its own. The planes of
//! other shapes serve what their `--runtime-config` says; the scheduling plane's real
//! kube-scheduler binds pods to the Nodes a test makes (or says why not), and its job
//! controller makes a Job's pods as its own ServiceAccount, through the webhooks and Pod
//! Security.

use crate::common;

use common::context::Pool;
use common::scheduling::{self, Placement};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

#[tokio::test]
async fn the_control_plane_serves_v1_36_with_rbac_on() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let admin = cp.client("admin").await;
    let version = admin.apiserver_version().await.unwrap();
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "36")
    );

    let ns = cp.namespace("envtest", &[("team", "a")]).await;
    let got = Api::<Namespace>::all(admin.clone()).get(&ns).await.unwrap();
    assert_eq!(got.metadata.labels.unwrap()["team"], "a");

    // A named user with no grant may not read the namespace's ConfigMaps...
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"k": "v"}})).unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let alice = cp.client("alice").await;
    let err = Api::<ConfigMap>::namespaced(alice, &ns)
        .get("c")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "alice read a ConfigMap without a grant: {err}"
    );
    // ... and neither may the same user impersonated, until a RoleBinding grants her group.
    let as_alice = cp.kubeconfig_as("alice", &["ml-researchers"]);
    let denied = cp.kubectl("admin").map(|mut k| {
        k.args(["--kubeconfig"]).arg(&as_alice);
        k.args(["-n", &ns, "get", "configmap", "c"])
            .output()
            .unwrap()
    });
    if let Some(out) = denied {
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("forbidden"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The DRA versions a plane's discovery lists.
async fn dra_versions(cp: &common::envtest::ControlPlane) -> Vec<String> {
    let groups = cp.client("admin").await.list_api_groups().await.unwrap();
    groups
        .groups
        .iter()
        .filter(|g| g.name == "resource.k8s.io")
        .flat_map(|g| g.versions.iter().map(|v| v.version.clone()))
        .collect()
}

/// Each plane serves the DRA versions its `--runtime-config` names: all three on the
/// shared one, v1beta1 alone on the one of an older cluster, none on the bare one.
#[tokio::test]
async fn each_plane_serves_the_dra_its_runtime_config_names() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let mut served = dra_versions(cp).await;
    served.sort();
    assert_eq!(served, ["v1", "v1beta1", "v1beta2"]);
    let Some(cp) = common::envtest::dra_v1beta1_plane() else {
        return;
    };
    assert_eq!(dra_versions(cp).await, ["v1beta1"]);
    let Some(cp) = common::envtest::bare_plane() else {
        return;
    };
    assert_eq!(dra_versions(cp).await, Vec::<String>::new());
}

/// A pod of `gpus` `nvidia.com/gpu` in `namespace`, confined to `pool`, tolerating the GPU
/// taint or not.
fn gpu_pod(pool: &Pool, namespace: &str, name: &str, gpus: &str, tolerates: bool) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "trainer", "image": "registry.example.com/trainer:1.0",
            "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    });
    if tolerates {
        pod["spec"]["tolerations"] =
            json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]);
    }
    pool.confine(&mut pod["spec"]);
    pod
}

/// The real scheduler on a Node made through the API: a pod asking for `nvidia.com/gpu: 1`
/// that tolerates the GPU taint binds onto the tainted GPU node; without the toleration, or
/// asking for more GPUs than the node has, it stays Unschedulable, and the scheduler says
/// why in its condition.
#[tokio::test]
async fn the_scheduler_binds_a_gpu_pod_that_tolerates_the_taint_and_says_why_not() {
    let Some(cp) = common::envtest::scheduling_plane() else {
        return;
    };
    let admin = cp.client("admin").await;
    let ns = cp.namespace("scheduled", &[]).await;
    let pool = Pool::new("scheduled");
    let node = pool.node("gpu-0", "8", json!({}));
    scheduling::create_node(&admin, &node).await;
    let node_name = node["metadata"]["name"].as_str().unwrap();

    for (name, gpus, tolerates) in [
        ("tolerates", "1", true),
        ("untolerated", "1", false),
        ("nine", "9", true),
    ] {
        common::context::create(&admin, &gpu_pod(&pool, &ns, name, gpus, tolerates)).await;
    }
    assert_eq!(
        scheduling::placement(cp, &admin, &ns, "tolerates").await,
        Placement::Bound(node_name.to_owned())
    );
    let Placement::Unschedulable(why) = scheduling::placement(cp, &admin, &ns, "untolerated").await
    else {
        panic!("a pod without the GPU toleration was bound");
    };
    assert!(
        why.starts_with("0/") && why.contains("1 node(s) had untolerated taint(s)"),
        "{why}"
    );
    let Placement::Unschedulable(why) = scheduling::placement(cp, &admin, &ns, "nine").await else {
        panic!("a pod of 9 GPUs was bound to a node of 8");
    };
    assert!(why.contains("1 Insufficient nvidia.com/gpu"), "{why}");
}

/// A Job applied through the apiserver gets its pods from the real job controller, acting
/// as its own ServiceAccount: tollgate's webhooks, registered as deploy/base registers
/// them, see the pod's create from `system:serviceaccount:kube-system:job-controller`,
/// and honour the opt-out the Job's template carried with tollgate's approval (the
/// opt-out's `controllers`).
#[tokio::test]
async fn a_jobs_pods_are_made_by_the_job_controller_as_its_service_account() {
    let Some(cp) = common::envtest::scheduling_plane() else {
        return;
    };
    let Some(rendered) = common::rbac::render_if_kubectl("deploy/base") else {
        return;
    };
    let admin = cp.client("admin").await;
    let served = tokio::task::spawn_blocking(|| {
        let (dir, ca) = common::process::workdir();
        common::process::serve(dir, ca, None, "json", &[])
    })
    .await
    .unwrap();
    let name = common::context::unique("jobs");
    let registration =
        common::admission::registration(&rendered, &name, served.addr.port(), &served.ca_pem);
    for c in &registration {
        common::apiserver::create(&admin, c, false)
            .await
            .unwrap_or_else(|e| panic!("registering {name}: {}", e.message));
    }
    let ns = cp
        .namespace(
            "jobs",
            &[
                ("tollgate.dev/enforce", "enabled"),
                (common::admission::REGISTERED, &name),
            ],
        )
        .await;
    common::admission::until_reviewed(&admin, &served, &ns).await;

    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "sweep", "namespace": ns},
        "spec": {"template": {
            "metadata": {"annotations": {"tollgate.dev/opt-out": "true"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "trial",
                "image": "registry.example.com/ml/sweep:1",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}
    });
    common::apiserver::create(&admin, &job, false)
        .await
        .unwrap_or_else(|e| panic!("creating the Job: {}", e.message));
    let pods = scheduling::pods_of_job(cp, &admin, &ns, "sweep").await;
    let annotations = pods[0].metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("tollgate.dev/opt-out-approved-by")
            .map(String::as_str),
        Some("admin"),
        "the approval tollgate gave the Job's template: {annotations:?}"
    );
    // The pod's line (the Job's own says its requester, the admin, may opt out).
    let line = served
        .wait_for_line(|l| {
            serde_json::from_str::<Value>(l).is_ok_and(|l| {
                l["message"] == "opt-out honoured"
                    && l["namespace"] == ns.as_str()
                    && l["name"] == "sweep-*"
            })
        })
        .await;
    let line: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        line["user"], "system:serviceaccount:kube-system:job-controller",
        "the pod's create came from another requester: {line}"
    );

    common::admission::deregister(&admin, &name).await;
}

/// A Job whose pod template the namespace's Pod Security level refuses is created, and
/// its pods never are: the job controller's FailedCreate events say why, in Pod Security's
/// words.
#[tokio::test]
async fn a_job_pod_security_refuses_gets_failed_create_events() {
    let Some(cp) = common::envtest::scheduling_plane() else {
        return;
    };
    let admin = cp.client("admin").await;
    let ns = cp
        .namespace(
            "baseline",
            &[("pod-security.kubernetes.io/enforce", "baseline")],
        )
        .await;
    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "admin-caps", "namespace": ns},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "trainer", "image": "registry.example.com/trainer:1.0",
                "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}}}
    });
    common::apiserver::create(&admin, &job, false)
        .await
        .unwrap_or_else(|e| panic!("creating the Job: {}", e.message));
    let events = scheduling::failed_creates(cp, &admin, &ns, "admin-caps").await;
    assert!(
        events.iter().all(|e| e.contains(
            "violates PodSecurity \"baseline:latest\": non-default capabilities \
             (container \"trainer\" must not include \"SYS_ADMIN\" in \
             securityContext.capabilities.add)"
        )),
        "{events:#?}"
    );
}

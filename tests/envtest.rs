//! The real control plane of the tests (tests/common/envtest.rs) itself: it serves, it
//! authenticates the roster's tokens, RBAC holds the named users to what they are granted,
//! impersonation and `kubectl` work, and each test's namespace is its own.

use crate::common;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams};
use serde_json::json;

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

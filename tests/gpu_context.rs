//! The GPU driver and shared GPUs through the real apiserver and kube-scheduler
//! (`scheduling_plane`): `tollgate serve` as the ServiceAccount the shipped RBAC binds, its
//! cluster context watching the Nodes, registered as deploy/base registers it.
//!
//! - `driver: auto` (the shipped nvidia class): no hostPath volume where the nodes that
//!   could run the pod carry the GPU Operator's container-toolkit label, the hostPath mount
//!   where they carry none; both pods bound onto their tainted GPU node by the scheduler.
//! - GPU sharing: a time-sliced pod (`nvidia.com/gpu.shared`) tolerated and bound onto a
//!   tainted time-sliced node; a KAI Scheduler fraction (`gpu-fraction`, for
//!   `kai-scheduler`) and a HAMi share (`nvidia.com/gpumem`) stored with the GPU toleration.
//!   No KAI or HAMi scheduler runs here: the KAI pod's placement (its tolerations and
//!   node selection as stored) is shown to bind with the real scheduler's taint filter,
//!   which KAI's applies alike; a HAMi pod is bound by HAMi's scheduler extender alone (the
//!   default scheduler finds no node advertising `nvidia.com/gpumem`), so its binding is
//!   not tested here.

use crate::common;

use common::context::Pool;
use common::scheduling::{self, Placement};
use serde_json::{json, Value};

/// A pod of `resources` (limits) named `name`, confined to `pool`, with no toleration of
/// the GPU taint of its own: tollgate's is the one it gets.
fn pod(pool: &Pool, namespace: &str, name: &str, resources: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "trainer",
            "image": "registry.example.com/trainer:1.0",
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": resources}}]}
    });
    pool.confine(&mut pod["spec"]);
    pod
}

fn has_gpu_toleration(pod: &Value) -> bool {
    pod["spec"]["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["key"] == "nvidia.com/gpu" && t["operator"] == "Exists")
}

fn host_paths(pod: &Value) -> Vec<String> {
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["hostPath"]["path"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn the_driver_where_no_runtime_injects_it_and_shared_gpus_bound() {
    let Some(cp) = common::envtest::scheduling_plane() else {
        return;
    };
    let Some(rendered) = common::rbac::render_if_kubectl("deploy/base") else {
        return;
    };
    let admin = cp.client("admin").await;
    let home = cp.namespace("gpu-home", &[]).await;
    let kubeconfig = common::context::shipped_identity(cp, &home).await;

    let toolkit = Pool::new("toolkit");
    let plain = Pool::new("hostdriver");
    let sliced = Pool::new("timesliced");
    let toolkit_node = toolkit.node(
        "gpu-0",
        "8",
        json!({"nvidia.com/gpu.deploy.container-toolkit": "true"}),
    );
    let plain_node = plain.node("gpu-0", "8", json!({}));
    // A time-sliced T4: the device plugin's sharing with renameByDefault advertises
    // nvidia.com/gpu.shared, not nvidia.com/gpu.
    let sliced_name = format!("{}-t4-0", sliced.name);
    let sliced_node = scheduling::node(
        &sliced_name,
        json!({"tollgate.test/pool": sliced.name, "nvidia.com/gpu.product": "Tesla-T4-SHARED",
            "nvidia.com/gpu.deploy.container-toolkit": "true"}),
        json!([
            {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
            {"key": "tollgate.test/pool", "value": sliced.name, "effect": "NoSchedule"}
        ]),
        json!({"cpu": "16", "memory": "64Gi", "nvidia.com/gpu.shared": "4"}),
    );
    for n in [&toolkit_node, &plain_node, &sliced_node] {
        scheduling::create_node(&admin, n).await;
    }

    // Started after the nodes exist: ready once its cluster context has listed them.
    let served = tokio::task::spawn_blocking(move || {
        let (dir, ca) = common::process::workdir();
        let kubeconfig = kubeconfig.to_string_lossy().into_owned();
        common::process::serve(
            dir,
            ca,
            None,
            "json",
            &["--cluster-context", "on", "--kubeconfig", &kubeconfig],
        )
    })
    .await
    .unwrap();
    // The nodes listed: what the driver's decision reads.
    served
        .wait_for_line(|l| {
            serde_json::from_str::<Value>(l)
                .is_ok_and(|l| l["message"] == "cluster cache synced" && l["resource"] == "nodes")
        })
        .await;
    let name = common::context::unique("gpu");
    let registration =
        common::admission::registration(&rendered, &name, served.addr.port(), &served.ca_pem);
    for c in &registration {
        common::apiserver::create(&admin, c, false)
            .await
            .unwrap_or_else(|e| panic!("registering {name}: {}", e.message));
    }
    let ns = cp
        .namespace(
            "gpu",
            &[
                ("tollgate.dev/enforce", "enabled"),
                (common::admission::REGISTERED, &name),
            ],
        )
        .await;
    common::admission::until_reviewed(&admin, &served, &ns).await;

    let gpu = json!({"nvidia.com/gpu": "1"});
    let mut kai = pod(&toolkit, &ns, "kai", json!({}));
    kai["metadata"]["annotations"] = json!({"gpu-fraction": "0.5"});
    kai["spec"]["schedulerName"] = json!("kai-scheduler");
    let hami = pod(
        &toolkit,
        &ns,
        "hami",
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}),
    );
    let pods = [
        pod(&toolkit, &ns, "on-toolkit", gpu.clone()),
        pod(&plain, &ns, "on-host-driver", gpu),
        pod(
            &sliced,
            &ns,
            "time-sliced",
            json!({"nvidia.com/gpu.shared": "1"}),
        ),
        kai,
        hami,
    ];
    let mut stored = vec![];
    for p in &pods {
        let s = common::apiserver::create(&admin, p, false)
            .await
            .unwrap_or_else(|e| panic!("creating {}: {}", p["metadata"]["name"], e.message));
        stored.push(s);
    }
    for s in &stored {
        assert!(
            has_gpu_toleration(s),
            "{}: no GPU toleration: {}",
            s["metadata"]["name"],
            s["spec"]
        );
        assert!(
            s["spec"]["initContainers"][0]["name"] == "tollgate-metrics",
            "{}: no sidecar",
            s["metadata"]["name"]
        );
    }
    let by_name = |n: &str| stored.iter().find(|s| s["metadata"]["name"] == n).unwrap();
    // The toolkit injects the driver: nothing mounted. Nothing does on the other pool.
    assert_eq!(host_paths(by_name("on-toolkit")), Vec::<String>::new());
    assert_eq!(host_paths(by_name("on-host-driver")), ["/usr/local/nvidia"]);
    assert_eq!(host_paths(by_name("kai")), Vec::<String>::new());
    assert_eq!(host_paths(by_name("hami")), Vec::<String>::new());

    for (pod, node) in [
        ("on-toolkit", &toolkit_node),
        ("on-host-driver", &plain_node),
        ("time-sliced", &sliced_node),
    ] {
        assert_eq!(
            scheduling::placement(cp, &admin, &ns, pod).await,
            Placement::Bound(node["metadata"]["name"].as_str().unwrap().to_owned()),
            "{pod}"
        );
    }
    // The KAI pod's placement as stored (its tolerations and node selection), for the
    // default scheduler: bound onto the tainted GPU node.
    let k = by_name("kai");
    let placed = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "kai-placement", "namespace": ns},
        "spec": {"restartPolicy": "Never",
            "nodeSelector": k["spec"]["nodeSelector"], "tolerations": k["spec"]["tolerations"],
            "containers": [{"name": "c", "image": "registry.example.com/trainer:1.0",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}
    });
    common::apiserver::create(&admin, &placed, false)
        .await
        .unwrap_or_else(|e| panic!("creating kai-placement: {}", e.message));
    assert_eq!(
        scheduling::placement(cp, &admin, &ns, "kai-placement").await,
        Placement::Bound(
            toolkit_node["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_owned()
        )
    );

    common::admission::deregister(&admin, &name).await;
}

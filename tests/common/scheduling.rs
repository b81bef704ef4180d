//! What the real kube-scheduler and controllers make of what the tests create, on
//! [`super::envtest::scheduling_plane`]: Nodes the scheduler binds to (no kubelet runs
//! them), where a pod went or why it could not, and the events a Job's controller wrote.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};

use super::envtest::ControlPlane;

/// How long a test waits for the scheduler or a controller to act: a safety bound (they
/// act within a second), not a measurement.
const BOUND: Duration = Duration::from_secs(60);

/// A Node as a kubelet would have registered it: `labels` (besides its hostname),
/// `taints`, `allocatable` (and as much capacity; 110 pods unless it says) and a `Ready`
/// condition. [`create_node`] makes it schedulable.
pub fn node(name: &str, labels: Value, taints: Value, allocatable: Value) -> Value {
    let mut l = json!({"kubernetes.io/hostname": name});
    l.as_object_mut()
        .unwrap()
        .extend(labels.as_object().unwrap().clone());
    let mut resources = json!({"pods": "110"});
    resources
        .as_object_mut()
        .unwrap()
        .extend(allocatable.as_object().unwrap().clone());
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": l},
        "spec": {"taints": taints},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        }
    })
}

/// Creates `node` (from [`node`], or [`super::context::Pool::node`]) so that the scheduler
/// may bind to it: its status written through the `status` subresource (a create drops
/// it), and its taints written again after the create. The apiserver's admission
/// (TaintNodesByCondition) gives every new Node `node.kubernetes.io/not-ready:NoSchedule`,
/// which the node lifecycle controller takes off once the Node is Ready; that controller
/// does not run here (it would find no kubelet and mark the Node unreachable).
pub async fn create_node(client: &Client, node: &Value) {
    super::context::create(client, node).await;
    let name = node["metadata"]["name"].as_str().unwrap();
    let nodes = Api::<Node>::all(client.clone());
    let taints = node["spec"]["taints"].clone();
    let taints = if taints.is_null() { json!([]) } else { taints };
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": taints}})),
        )
        .await
        .unwrap_or_else(|e| panic!("writing the taints of node {name}: {e}"));
}

/// What the scheduler did with a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Bound to this node.
    Bound(String),
    /// `PodScheduled=False`, reason `Unschedulable`: the scheduler's message
    /// ("0/3 nodes are available: ...").
    Unschedulable(String),
}

/// Polls `f` until it has an answer; fails the test after [`BOUND`], naming `what` and
/// quoting the end of the plane's `log` (the component that should have acted).
async fn answered<T>(
    cp: &ControlPlane,
    log: &str,
    what: &str,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(answer) = f().await {
            return answer;
        }
        assert!(
            start.elapsed() < BOUND,
            "{what}: nothing within {BOUND:?}\n-- {log} --\n{}",
            cp.log_tail(log)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (bounded) until the scheduler has decided on the pod `namespace/name`: bound, or
/// left Unschedulable and said why.
pub async fn placement(
    cp: &ControlPlane,
    client: &Client,
    namespace: &str,
    name: &str,
) -> Placement {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let what = format!("the scheduler's decision on pod {namespace}/{name}");
    answered(cp, "scheduler.log", &what, async || {
        let pod = pods
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("reading pod {namespace}/{name}: {e}"));
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            return Some(Placement::Bound(node));
        }
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
            .map(|c| Placement::Unschedulable(c.message.clone().unwrap_or_default()))
    })
    .await
}

/// The messages of the `FailedCreate` events the Job `namespace/job` has, once it has one
/// (bounded): the job controller's "Error creating: ..." for each pod the apiserver
/// refused it.
pub async fn failed_creates(
    cp: &ControlPlane,
    client: &Client,
    namespace: &str,
    job: &str,
) -> Vec<String> {
    let events = Api::<Event>::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields(&format!(
        "involvedObject.kind=Job,involvedObject.name={job},reason=FailedCreate"
    ));
    let what = format!("a FailedCreate event of job {namespace}/{job}");
    answered(cp, "controller-manager.log", &what, async || {
        let found: Vec<String> = events
            .list(&params)
            .await
            .unwrap_or_else(|e| panic!("listing the events of job {namespace}/{job}: {e}"))
            .items
            .into_iter()
            .filter_map(|e| e.message)
            .collect();
        Some(found).filter(|f| !f.is_empty())
    })
    .await
}

/// The pods the Job `namespace/job` has made (found by the label the job controller puts
/// on them), once it has made one (bounded).
pub async fn pods_of_job(
    cp: &ControlPlane,
    client: &Client,
    namespace: &str,
    job: &str,
) -> Vec<Pod> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}"));
    let what = format!("a pod of job {namespace}/{job}");
    answered(cp, "controller-manager.log", &what, async || {
        let found = pods
            .list(&params)
            .await
            .unwrap_or_else(|e| panic!("listing the pods of job {namespace}/{job}: {e}"))
            .items;
        Some(found).filter(|f| !f.is_empty())
    })
    .await
}

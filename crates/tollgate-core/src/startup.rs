//! Why a pod the apiserver stored does not start on its node, in the kubelet's own words,
//! and which of it is tollgate's: `tollgate why` and the audit (rule `start`) both read it.
//!
//! What tollgate adds is what a node judges: a hostPath volume of type `Directory` that
//! the kubelet cannot mount where the node lacks the path, a sidecar whose image the node
//! may not have or whose securityContext its image may not meet. tollgate cannot know a
//! node's directories, the images it holds or the user an image runs as, so it makes such
//! pods and says so when the node refuses them (docs/troubleshooting.md): the kubelet
//! writes its refusal to the pod's container statuses (`waiting.reason`, as
//! `ErrImageNeverPull` or `CreateContainerConfigError`) or, for volumes, only to events
//! (`FailedMount`, the pod staying `Pending` with its containers `PodInitializing`). Each
//! [`StartFailure`] keeps the kubelet's reason and message verbatim and adds, where the
//! volume or the container is tollgate's own, which part of the policy wrote it and the
//! ways out.

use serde_json::Value;

use crate::policy::{Driver, Policy};

/// A Warning event about a pod, as the kubelet (or another component) wrote it.
#[derive(Debug, Clone, Copy)]
pub struct PodEvent<'a> {
    pub reason: &'a str,
    pub message: &'a str,
}

/// One reason a pod does not start on its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartFailure {
    /// The kubelet's reason: `FailedMount`, `ErrImageNeverPull`, `ImagePullBackOff`,
    /// `CreateContainerConfigError`, `CrashLoopBackOff`, ...
    pub reason: String,
    /// The kubelet's message, verbatim.
    pub message: String,
    /// The container it is about, where it is one's.
    pub container: Option<String>,
    /// The volume it is about, where it is one's.
    pub volume: Option<String>,
    /// What of tollgate's it is (`tollgate's driver mount of GPU class nvidia ...`), where
    /// it is tollgate's.
    pub ours: Option<String>,
    /// What makes it start, where tollgate knows.
    pub ways_out: Vec<String>,
}

impl StartFailure {
    /// The failure in one line: the kubelet's reason and words, then tollgate's part.
    pub fn sentence(&self) -> String {
        let about = match (&self.container, &self.volume) {
            (Some(c), _) => format!("container {c}: "),
            (None, Some(v)) => format!("volume {v}: "),
            (None, None) => String::new(),
        };
        let mut s = format!("{about}{}: {}", self.reason, self.message);
        if let Some(o) = &self.ours {
            s.push_str(&format!("; this is {o}"));
        }
        if !self.ways_out.is_empty() {
            s.push_str(&format!("; ways out: {}", self.ways_out.join("; or ")));
        }
        s
    }
}

/// Waiting reasons that are a container on its way, not a refusal.
const ON_ITS_WAY: [&str; 2] = ["ContainerCreating", "PodInitializing"];

/// Event reasons that say the pod's sandbox or volumes cannot be set up: only events carry
/// them (the containers wait as `PodInitializing` meanwhile).
const SETUP_REASONS: [&str; 5] = [
    "FailedMount",
    "FailedMapVolume",
    "FailedAttachVolume",
    "FailedCreatePodSandBox",
    "FailedPodSandBoxStatus",
];

/// Whether a pod may be stuck where only events say why: bound to a node and not yet
/// running, so that a caller lists the namespace's events only for such pods.
pub fn waits_on_its_node(pod: &Value) -> bool {
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    let bound = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    bound && matches!(phase, None | Some("Pending"))
}

/// Why `pod` (as read from the cluster, with its status) does not start, from its
/// container statuses and its Warning `events`; empty where nothing says it cannot.
pub fn failures(policy: &Policy, pod: &Value, events: &[PodEvent<'_>]) -> Vec<StartFailure> {
    let mut out: Vec<StartFailure> = vec![];
    let sidecar = sidecar_name(policy, pod);
    for statuses in ["initContainerStatuses", "containerStatuses"] {
        let Some(list) = pod
            .pointer(&format!("/status/{statuses}"))
            .and_then(Value::as_array)
        else {
            continue;
        };
        for s in list {
            let name = s["name"].as_str().unwrap_or_default();
            let waiting = &s["state"]["waiting"];
            let Some(reason) = waiting["reason"].as_str() else {
                continue;
            };
            if ON_ITS_WAY.contains(&reason) {
                continue;
            }
            let message = waiting["message"].as_str().unwrap_or_default();
            let mut f = StartFailure {
                reason: reason.to_owned(),
                message: message.to_owned(),
                container: Some(name.to_owned()),
                volume: None,
                ours: None,
                ways_out: vec![],
            };
            if sidecar == Some(name) {
                ours_sidecar(pod, &mut f);
            }
            out.push(f);
        }
    }
    // Only where no container says more: a volume or the sandbox, one failure per volume
    // (the newest event of each: the caller gives them oldest first).
    for e in events.iter().rev() {
        if !SETUP_REASONS.contains(&e.reason) {
            continue;
        }
        let volume = quoted_after(e.message, "for volume ");
        if out
            .iter()
            .any(|f| f.reason == e.reason && f.volume.as_deref() == volume)
        {
            continue;
        }
        let mut f = StartFailure {
            reason: e.reason.to_owned(),
            message: e.message.to_owned(),
            container: None,
            volume: volume.map(str::to_owned),
            ours: None,
            ways_out: vec![],
        };
        if let Some(v) = volume {
            ours_volume(policy, pod, v, &mut f);
        }
        out.push(f);
    }
    out
}

/// The metrics sidecar's container name, where the pod has tollgate's sidecar (its
/// applied annotation names the step).
fn sidecar_name<'p>(policy: &'p Policy, pod: &Value) -> Option<&'p str> {
    let applied = pod
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(policy.mutation.applied_annotation.as_str()))
        .and_then(Value::as_str)?;
    applied
        .split(',')
        .any(|s| s.trim() == crate::policy::Step::MetricsSidecar.as_str())
        .then_some(policy.mutation.metrics_sidecar.container.name.as_str())
}

/// What a failure of tollgate's sidecar container is, and the policy's fields that fix it.
fn ours_sidecar(pod: &Value, f: &mut StartFailure) {
    let name = f.container.clone().unwrap_or_default();
    let image = container_of(pod, &name)
        .and_then(|c| c["image"].as_str())
        .unwrap_or_default()
        .to_owned();
    f.ours = Some(format!(
        "tollgate's metrics sidecar (mutation.metricsSidecar.container, image {image})"
    ));
    let off = "turn the sidecar off for these pods (mutation.metricsSidecar.enabled: false in \
               the policy or the namespace's TollgateProfile)"
        .to_owned();
    match f.reason.as_str() {
        "ErrImageNeverPull"
        | "ErrImagePull"
        | "ImagePullBackOff"
        | "InvalidImageName"
        | "ImageInspectError"
        | "RegistryUnavailable" => {
            f.ways_out = vec![
                format!(
                    "make {image} available to the nodes (a registry they pull from, or the \
                     image loaded on them)"
                ),
                "set mutation.metricsSidecar.container.image (and imagePullPolicy) to an \
                 image the nodes have"
                    .into(),
                off,
            ];
        }
        // The kubelet's verifyRunAsNonRoot: "container's runAsUser breaks non-root
        // policy", "container has runAsNonRoot and image will run as root", "... image has
        // non-numeric user".
        "CreateContainerConfigError"
            if f.message.contains("runAsNonRoot") || f.message.contains("non-root") =>
        {
            f.ways_out = vec![
                "set mutation.metricsSidecar.container.securityContext.runAsUser to a non-root \
                 uid (the shipped policy's is 65534): runAsNonRoot refuses a container that \
                 runs as root, or as a user its image names by name"
                    .into(),
                off,
            ];
        }
        // The kubelet's makeEnvironmentVariables: `secret "x" not found`, `configmap "x"
        // not found`, `couldn't find key k in Secret ns/x`.
        "CreateContainerConfigError"
            if ["secret", "configmap", "Secret", "ConfigMap"]
                .iter()
                .any(|w| f.message.contains(w)) =>
        {
            f.ways_out = vec![
                "create what the message names in each namespace the sidecar goes to, or take \
                 it out of mutation.metricsSidecar.container.env (and envFrom)"
                    .into(),
                off,
            ];
        }
        "CreateContainerConfigError" | "CreateContainerError" | "RunContainerError" => {
            f.ways_out = vec![
                "change mutation.metricsSidecar.container (its securityContext, command, env) \
                 as the message says"
                    .into(),
                off,
            ];
        }
        "CrashLoopBackOff" => {
            let pod_name = pod
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            f.ways_out = vec![
                format!("its log says why it exits: kubectl logs {pod_name} -c {name}"),
                off,
            ];
        }
        _ => f.ways_out = vec![off],
    }
}

/// What a failure of one of tollgate's driver volumes is: the GPU class whose mount it is,
/// and the ways out of the class's `driver`.
fn ours_volume(policy: &Policy, pod: &Value, volume: &str, f: &mut StartFailure) {
    let host_path = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|v| v["name"] == volume)
        .and_then(|v| v.pointer("/hostPath/path"))
        .and_then(Value::as_str);
    let Some(host_path) = host_path else {
        return;
    };
    let class = policy
        .gpu
        .classes
        .iter()
        .find(|(_, c)| c.mounts.iter().any(|m| m.name == volume));
    let prefix = &policy.mutation.driver_mounts.volume_prefix;
    let Some((name, class)) = class else {
        if !prefix.is_empty() && volume.starts_with(prefix.as_str()) {
            f.ours = Some(format!(
                "tollgate's driver mount (hostPath {host_path}, a volume named \
                 {prefix}*)"
            ));
        }
        return;
    };
    f.ours = Some(format!(
        "tollgate's driver mount of GPU class {name} (hostPath {host_path}, \
         gpu.classes.{name}.mounts), which the node does not have"
    ));
    let mut ways = vec![];
    if class.driver == Driver::Auto {
        let labels = if class.runtime_node_labels.is_empty() {
            "a label the class's runtimeNodeLabels names".to_owned()
        } else {
            class.runtime_node_labels.join(" or ")
        };
        ways.push(format!(
            "if the node's runtime injects the driver (the GPU Operator's container toolkit, \
             CDI), label the GPU nodes {labels} (gpu.classes.{name}.runtimeNodeLabels) and \
             `driver: auto` leaves the driver to it"
        ));
    }
    ways.push(format!(
        "set `driver: runtime` (with `mounts: []` and `env: []`) for gpu.classes.{name} in \
         the policy (a TollgatePolicy or the policy file) where the runtime provides the \
         driver"
    ));
    ways.push(format!(
        "install the driver at {host_path} on the node, or point \
         gpu.classes.{name}.mounts at where it is"
    ));
    f.ways_out = ways;
}

/// The container (or init container) of `pod` named `name`.
fn container_of<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    ["/spec/initContainers", "/spec/containers"]
        .iter()
        .filter_map(|p| pod.pointer(p).and_then(Value::as_array))
        .flatten()
        .find(|c| c["name"] == name)
}

/// The text in double quotes after `after` in `message`: the volume of a kubelet's
/// `MountVolume.SetUp failed for volume "NAME" : ...`.
fn quoted_after<'a>(message: &'a str, after: &str) -> Option<&'a str> {
    let rest = &message[message.find(after)? + after.len()..];
    let rest = rest.strip_prefix('"')?;
    Some(&rest[..rest.find('"')?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gpu_pod() -> Value {
        json!({"metadata": {"name": "dist-0", "annotations": {
                "tollgate.dev/applied": "tolerations,driver-mounts,metrics-sidecar,default-resources,gpu=nvidia"}},
            "spec": {"nodeName": "n1",
                "volumes": [{"name": "tollgate-nvidia-driver",
                    "hostPath": {"path": "/usr/local/nvidia", "type": "Directory"}}],
                "initContainers": [{"name": "tollgate-metrics", "image": "quay.io/prometheus/statsd-exporter:v0.28.0"}],
                "containers": [{"name": "trainer", "image": "t"}]},
            "status": {"phase": "Pending",
                "initContainerStatuses": [{"name": "tollgate-metrics",
                    "state": {"waiting": {"reason": "PodInitializing"}}}]}})
    }

    #[test]
    fn a_driver_mount_the_node_lacks_is_the_class_s_with_its_ways_out() {
        let policy = Policy::builtin();
        let message = "MountVolume.SetUp failed for volume \"tollgate-nvidia-driver\" : \
                       hostPath type check failed: /usr/local/nvidia is not a directory";
        let events = [
            PodEvent {
                reason: "Scheduled",
                message: "x",
            },
            PodEvent {
                reason: "FailedMount",
                message,
            },
            PodEvent {
                reason: "FailedMount",
                message,
            },
        ];
        let f = failures(&policy, &gpu_pod(), &events);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].volume.as_deref(), Some("tollgate-nvidia-driver"));
        let s = f[0].sentence();
        for said in [
            "FailedMount: MountVolume.SetUp failed",
            "tollgate's driver mount of GPU class nvidia",
            "nvidia.com/gpu.deploy.container-toolkit=true",
            "driver: runtime",
            "install the driver at /usr/local/nvidia",
        ] {
            assert!(s.contains(said), "{said:?} in {s}");
        }
        assert!(waits_on_its_node(&gpu_pod()));
    }

    #[test]
    fn the_sidecar_s_refusals_name_the_policy_s_fields() {
        let policy = Policy::builtin();
        let mut pod = gpu_pod();
        pod["status"]["initContainerStatuses"][0]["state"] = json!({"waiting": {
            "reason": "ErrImageNeverPull",
            "message": "Container image \"x\" is not present with pull policy of Never"}});
        let f = failures(&policy, &pod, &[]);
        assert_eq!(f[0].container.as_deref(), Some("tollgate-metrics"));
        assert!(
            f[0].sentence().contains("tollgate's metrics sidecar"),
            "{f:?}"
        );
        assert!(f[0]
            .sentence()
            .contains("mutation.metricsSidecar.container.image"));
        pod["status"]["initContainerStatuses"][0]["state"] = json!({"waiting": {
            "reason": "CreateContainerConfigError",
            "message": "container has runAsNonRoot and image will run as root"}});
        let s = failures(&policy, &pod, &[])[0].sentence();
        assert!(s.contains("securityContext.runAsUser"), "{s}");
        pod["status"]["initContainerStatuses"][0]["state"] = json!({"waiting": {
            "reason": "CreateContainerConfigError", "message": "secret \"metrics-token\" not found"}});
        let s = failures(&policy, &pod, &[])[0].sentence();
        assert!(s.contains("mutation.metricsSidecar.container.env"), "{s}");
        // Without tollgate's annotation, a container of that name is the user's.
        pod["metadata"]["annotations"] = json!({});
        let f = failures(&policy, &pod, &[]);
        assert_eq!(f[0].ours, None);
    }

    #[test]
    fn a_user_s_container_is_said_plainly_and_a_volume_of_theirs_not_as_ours() {
        let policy = Policy::builtin();
        let mut pod = gpu_pod();
        pod["status"]["containerStatuses"] = json!([{"name": "trainer",
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"t\""}}}]);
        pod["spec"]["volumes"] = json!([{"name": "data", "hostPath": {"path": "/data"}}]);
        let events = [PodEvent {
            reason: "FailedMount",
            message: "MountVolume.SetUp failed for volume \"data\" : hostPath type check failed",
        }];
        let f = failures(&policy, &pod, &events);
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(
            f.iter().all(|f| f.ours.is_none() && f.ways_out.is_empty()),
            "{f:?}"
        );
        assert!(f[0]
            .sentence()
            .starts_with("container trainer: ImagePullBackOff"));
        // No message, no quote: nothing panics.
        assert_eq!(quoted_after("for volume ", "for volume "), None);
        assert_eq!(quoted_after("for volume \"x", "for volume "), None);
    }
}

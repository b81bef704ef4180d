//! Small read helpers over a typed Pod, shared by the mutation steps and validation.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Where a container sits in the pod spec; the words are those a user sees in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    Init,
    /// An init container with `restartPolicy: Always` (Kubernetes native sidecar).
    Sidecar,
    Regular,
}

/// The restartPolicy that makes an init container a native sidecar.
pub const SIDECAR_RESTART_POLICY: &str = "Always";

impl ContainerKind {
    pub fn of_init(c: &Container) -> Self {
        if c.restart_policy.as_deref() == Some(SIDECAR_RESTART_POLICY) {
            ContainerKind::Sidecar
        } else {
            ContainerKind::Init
        }
    }

    pub fn noun(self) -> &'static str {
        match self {
            ContainerKind::Init => "init container",
            ContainerKind::Sidecar => "sidecar container",
            ContainerKind::Regular => "container",
        }
    }
}

/// Init containers (in order) then regular containers; never ephemeral ones, which may not
/// carry resources or mounts.
pub fn containers(spec: &PodSpec) -> impl Iterator<Item = (ContainerKind, &Container)> {
    spec.init_containers
        .iter()
        .flatten()
        .map(|c| (ContainerKind::of_init(c), c))
        .chain(spec.containers.iter().map(|c| (ContainerKind::Regular, c)))
}

/// Mutable twin of [`containers`], over the two lists rather than the whole spec, so that a
/// step can hold other fields of the spec (volumes, pod-level resources) at the same time.
pub fn containers_mut<'a>(
    init_containers: &'a mut Option<Vec<Container>>,
    containers: &'a mut [Container],
) -> impl Iterator<Item = (ContainerKind, &'a mut Container)> {
    init_containers
        .iter_mut()
        .flatten()
        .map(|c| (ContainerKind::of_init(c), c))
        .chain(containers.iter_mut().map(|c| (ContainerKind::Regular, c)))
}

/// The quantity a container asks for: its request, or its limit (the apiserver copies a
/// limit into a missing request).
pub fn asked<'a>(c: &'a Container, resource: &str) -> Option<&'a Quantity> {
    let r = c.resources.as_ref()?;
    r.requests
        .as_ref()
        .and_then(|m| m.get(resource))
        .or_else(|| r.limits.as_ref().and_then(|m| m.get(resource)))
}

/// What [`display_name`] puts after a generateName prefix, and what it says for a pod
/// with neither (the export writes the same rule in CEL).
pub const GENERATED_SUFFIX: &str = "*";
pub const UNNAMED: &str = "(unnamed)";

/// A name a user recognises: the pod's name, or its generateName prefix for controller pods.
pub fn display_name(pod: &Pod) -> String {
    match (&pod.metadata.name, &pod.metadata.generate_name) {
        (Some(n), _) if !n.is_empty() => n.clone(),
        (_, Some(g)) if !g.is_empty() => format!("{g}{GENERATED_SUFFIX}"),
        _ => UNNAMED.to_owned(),
    }
}

/// The value that turns an annotation on, read trimmed and in any ASCII case.
pub const TRUE_VALUE: &str = "true";

/// Whether an annotation is present with the value "true".
pub fn annotation_is_true(pod: &Pod, key: &str) -> bool {
    is_true(pod.metadata.annotations.as_ref(), key)
}

/// Whether `key` is in these annotations (a pod's or a pod template's) with the value
/// "true".
pub fn is_true(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    key: &str,
) -> bool {
    annotations
        .and_then(|a| a.get(key))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(TRUE_VALUE))
}

/// [`default_requests_from_limits`] on a typed pod: what the judgement applies between
/// mutation and validation, without a trip through JSON.
pub fn default_requests(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    fn copy(r: &mut k8s_openapi::api::core::v1::ResourceRequirements) {
        let Some(limits) = r.limits.as_ref() else {
            return;
        };
        let requests = r.requests.get_or_insert_with(Default::default);
        for (k, v) in limits {
            requests.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    if let Some(r) = spec.resources.as_mut() {
        copy(r);
    }
    let PodSpec {
        init_containers,
        containers,
        ..
    } = spec;
    for (_, c) in containers_mut(init_containers, containers) {
        if let Some(r) = c.resources.as_mut() {
            copy(r);
        }
    }
}

/// The apiserver's defaulting between the mutating and the validating webhooks, for the
/// parts validation looks at: a container limit with no request becomes the request, and
/// so does a pod-level limit (`spec.resources`, where the apiserver sets a pod-level request
/// for every resource with a pod-level limit).
pub fn default_requests_from_limits(pod: &mut serde_json::Value) {
    use serde_json::Value;
    if let Some(Value::Object(res)) = pod.pointer_mut("/spec/resources") {
        copy_limits_to_requests(res);
    }
    for list in ["initContainers", "containers"] {
        let Some(Value::Array(cs)) = pod.pointer_mut(&format!("/spec/{list}")) else {
            continue;
        };
        for c in cs {
            if let Some(Value::Object(res)) = c.get_mut("resources") {
                copy_limits_to_requests(res);
            }
        }
    }
}

/// In one `resources` object (a container's or the pod's): every limit without a request
/// becomes the request.
fn copy_limits_to_requests(res: &mut serde_json::Map<String, serde_json::Value>) {
    use serde_json::Value;
    let Some(Value::Object(limits)) = res.get("limits").cloned() else {
        return;
    };
    let requests = res
        .entry("requests")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Value::Object(requests) = requests {
        for (k, v) in limits {
            requests.entry(k).or_insert(v);
        }
    }
}

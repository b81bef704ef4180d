//! Small read helpers over a typed Pod, shared by the mutation steps and validation.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

/// Where a container sits in the pod spec; the words are those a user sees in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ContainerKind {
    Init,
    /// An init container with `restartPolicy: Always` (Kubernetes native sidecar).
    Sidecar,
    Regular,
}

/// The restartPolicy that makes an init container a native sidecar.
pub(crate) const SIDECAR_RESTART_POLICY: &str = "Always";

impl ContainerKind {
    pub(crate) fn of_init(c: &Container) -> Self {
        if c.restart_policy.as_deref() == Some(SIDECAR_RESTART_POLICY) {
            ContainerKind::Sidecar
        } else {
            ContainerKind::Init
        }
    }

    pub(crate) fn noun(self) -> &'static str {
        match self {
            ContainerKind::Init => "init container",
            ContainerKind::Sidecar => "sidecar container",
            ContainerKind::Regular => "container",
        }
    }
}

/// Init containers (in order) then regular containers; never ephemeral ones, which may not
/// carry resources or mounts.
pub(crate) fn containers(spec: &PodSpec) -> impl Iterator<Item = (ContainerKind, &Container)> {
    spec.init_containers
        .iter()
        .flatten()
        .map(|c| (ContainerKind::of_init(c), c))
        .chain(spec.containers.iter().map(|c| (ContainerKind::Regular, c)))
}

/// Mutable twin of [`containers`], over the two lists rather than the whole spec, so that a
/// step can hold other fields of the spec (volumes, pod-level resources) at the same time.
pub(crate) fn containers_mut<'a>(
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
pub(crate) fn asked<'a>(c: &'a Container, resource: &str) -> Option<&'a Quantity> {
    let r = c.resources.as_ref()?;
    r.requests
        .as_ref()
        .and_then(|m| m.get(resource))
        .or_else(|| r.limits.as_ref().and_then(|m| m.get(resource)))
}

/// What [`display_name`] puts after a generateName prefix, and what it says for a pod
/// with neither (the export writes the same rule in CEL).
pub(crate) const GENERATED_SUFFIX: &str = "*";
pub(crate) const UNNAMED: &str = "(unnamed)";

/// A name a user recognises: the pod's name, or its generateName prefix for controller pods.
pub(crate) fn display_name(pod: &Pod) -> String {
    match (&pod.metadata.name, &pod.metadata.generate_name) {
        (Some(n), _) if !n.is_empty() => n.clone(),
        (_, Some(g)) if !g.is_empty() => format!("{g}{GENERATED_SUFFIX}"),
        _ => UNNAMED.to_owned(),
    }
}

/// The value that turns an annotation on, read trimmed and in any ASCII case.
pub(crate) const TRUE_VALUE: &str = "true";

/// Whether an annotation is present with the value "true".
pub(crate) fn annotation_is_true(pod: &Pod, key: &str) -> bool {
    is_true(pod.metadata.annotations.as_ref(), key)
}

/// Whether `key` is in these annotations (a pod's or a pod template's) with the value
/// "true".
pub(crate) fn is_true(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    key: &str,
) -> bool {
    annotations
        .and_then(|a| a.get(key))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(TRUE_VALUE))
}

/// [`default_requests_from_limits`] on a typed pod: what the judgement applies between
/// mutation and validation, without a trip through JSON.
pub(crate) fn default_requests(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    fn copy(r: &mut ResourceRequirements) {
        let Some(limits) = r.limits.as_ref() else {
            return;
        };
        let requests = r.requests.get_or_insert_with(Default::default);
        for (k, v) in limits {
            requests.entry(k.clone()).or_insert_with(|| v.clone());
        }
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
    default_pod_level_requests(spec);
}

/// The apiserver's defaulting of pod-level requests (KEP-2837), as it runs whenever it
/// decodes a pod (before the webhooks see it, and on what they return): a resource with a
/// pod-level limit and no pod-level request gets as its request what the containers
/// request of it together (a container's limit standing in for its missing request), where
/// any container asks for it, else the limit. Checked against a 1.36 apiserver: limits of
/// 4 cpu and 4Gi over containers requesting 1 and 500m cpu default to requests of 1500m
/// cpu and 4Gi.
pub(crate) fn default_pod_level_requests(spec: &mut PodSpec) {
    let Some(wanted) = pod_level_defaults(spec) else {
        return;
    };
    if let Some(r) = spec.resources.as_mut() {
        r.requests
            .get_or_insert_with(Default::default)
            .extend(wanted);
    }
}

/// What [`default_pod_level_requests`] would set, if anything.
fn pod_level_defaults(spec: &PodSpec) -> Option<BTreeMap<String, Quantity>> {
    let res = spec.resources.as_ref()?;
    let limits = res.limits.as_ref()?;
    let unset: Vec<(&String, &Quantity)> = limits
        .iter()
        .filter(|(k, _)| !res.requests.as_ref().is_some_and(|r| r.contains_key(*k)))
        .collect();
    if unset.is_empty() {
        return None;
    }
    // The containers' effective requests: a limit stands in for a missing request.
    let mut effective = spec.clone();
    for c in effective
        .containers
        .iter_mut()
        .chain(effective.init_containers.iter_mut().flatten())
    {
        if let Some(r) = c.resources.as_mut() {
            if let Some(l) = r.limits.clone() {
                let req = r.requests.get_or_insert_with(Default::default);
                for (k, v) in l {
                    req.entry(k).or_insert(v);
                }
            }
        }
    }
    let asked = |r: &str| {
        containers(&effective).any(|(_, c)| {
            c.resources
                .as_ref()
                .and_then(|x| x.requests.as_ref())
                .is_some_and(|m| m.contains_key(r))
        })
    };
    let aggregate = containers_aggregate(&effective, false);
    Some(
        unset
            .into_iter()
            .map(|(k, limit)| {
                let value = match aggregate.get(k.as_str()) {
                    Some(n) if asked(k) => Quantity(quantity::format_for(k, *n)),
                    _ => limit.clone(),
                };
                (k.clone(), value)
            })
            .collect(),
    )
}

/// The apiserver's defaulting between the mutating and the validating webhooks, for the
/// parts validation looks at: a container limit with no request becomes the request, and a
/// pod-level limit with no pod-level request gets one as [`default_pod_level_requests`]
/// says.
pub fn default_requests_from_limits(pod: &mut serde_json::Value) {
    use serde_json::Value;
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
    default_pod_level_requests_json(pod);
}

/// [`default_pod_level_requests`] on a pod as JSON (the object of a review tollgate makes
/// up for `tollgate review`: the apiserver has defaulted it before any webhook sees it).
pub(crate) fn default_pod_level_requests_json(pod: &mut serde_json::Value) {
    use serde_json::Value;
    if pod.pointer("/spec/resources/limits").is_none() {
        return;
    }
    let wanted = pod
        .get("spec")
        .and_then(|s| serde_json::from_value::<PodSpec>(s.clone()).ok())
        .and_then(|s| pod_level_defaults(&s));
    if let (Some(wanted), Some(Value::Object(res))) = (wanted, pod.pointer_mut("/spec/resources")) {
        let requests = res
            .entry("requests")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Value::Object(requests) = requests {
            for (k, v) in wanted {
                requests.entry(k).or_insert(Value::String(v.0));
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

/// Quantities by resource name, in nano-units.
pub(crate) type Amounts = BTreeMap<String, i128>;

/// The containers' requests (or limits) together, as `resourcehelper`'s
/// `AggregateContainerRequests` adds them up: regular containers and native sidecars
/// summed, each init container on top of the sidecars before it, the larger of the two.
/// No overhead and no pod-level resources: what the apiserver holds a pod's own
/// `spec.resources` to.
pub(crate) fn containers_aggregate(spec: &PodSpec, limits: bool) -> Amounts {
    let of = |c: &Container| amounts(c.resources.as_ref().and_then(|r| pick(r, limits)));
    let mut total = Amounts::new();
    for c in &spec.containers {
        add_list(
            &mut total,
            c.resources.as_ref().and_then(|r| pick(r, limits)),
        );
    }
    let mut sidecars = Amounts::new();
    let mut init = Amounts::new();
    for c in spec.init_containers.iter().flatten() {
        let own = of(c);
        let running = if c.restart_policy.as_deref() == Some(SIDECAR_RESTART_POLICY) {
            add(&mut total, &own);
            add(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut t = own;
            add(&mut t, &sidecars);
            t
        };
        max(&mut init, &running);
    }
    max(&mut total, &init);
    total
}

/// A `resources` object's requests, or its limits.
pub(crate) fn pick(r: &ResourceRequirements, limits: bool) -> Option<&BTreeMap<String, Quantity>> {
    if limits {
        r.limits.as_ref()
    } else {
        r.requests.as_ref()
    }
}

pub(crate) fn amounts(list: Option<&BTreeMap<String, Quantity>>) -> Amounts {
    list.into_iter()
        .flatten()
        .filter_map(|(k, q)| Some((k.clone(), quantity::parse(&q.0).ok()?)))
        .collect()
}

/// Adds a container's list to `to` as it is read: no map of its own, and a resource's
/// name copied only the first time it is seen (what every pod review with known nodes or
/// quotas measures).
fn add_list(to: &mut Amounts, list: Option<&BTreeMap<String, Quantity>>) {
    for (k, q) in list.into_iter().flatten() {
        if let Ok(v) = quantity::parse(&q.0) {
            add_one(to, k, v);
        }
    }
}

fn add_one(to: &mut Amounts, k: &str, v: i128) {
    match to.get_mut(k) {
        Some(t) => *t = t.saturating_add(v),
        None => {
            to.insert(k.to_owned(), v);
        }
    }
}

pub(crate) fn add(to: &mut Amounts, from: &Amounts) {
    for (k, v) in from {
        add_one(to, k, *v);
    }
}

fn max(to: &mut Amounts, from: &Amounts) {
    for (k, v) in from {
        match to.get_mut(k) {
            Some(t) => *t = (*t).max(*v),
            None => {
                to.insert(k.clone(), 0.max(*v));
            }
        }
    }
}

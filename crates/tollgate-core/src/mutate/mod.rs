//! Mutation: the four idempotent "ensure" steps applied to training pods.
//!
//! Each step looks at the typed pod, changes only what is missing, and reports what it
//! added ([`Added`]) and what the user should read (warnings). Running the steps again on
//! their own output changes nothing, which is what makes `reinvocationPolicy: IfNeeded`
//! and the empty second patch work. The report is the one account of a mutation: the
//! webhook's warnings, `tollgate review` and the audit's findings are all drawn from it.

pub(crate) mod default_resources;
pub(crate) mod driver_mounts;
pub(crate) mod heed;
pub(crate) mod metrics_sidecar;
pub(crate) mod tolerations;

use k8s_openapi::api::core::v1::{Pod, Toleration};
use serde_json::{json, Value};

use crate::cluster::Cluster;
use crate::gpu::Gpus;
use crate::pod::annotation_is_true;
use crate::policy::Policy;
pub(crate) use crate::policy::Step;
pub(crate) use heed::Heed;

/// What mutation did to a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Steps that changed the pod in this pass, in order.
    pub applied: Vec<Step>,
    /// What each step added, in the order it added it.
    pub added: Vec<(Step, Added)>,
    /// Messages for the user (kubectl prints them).
    pub warnings: Vec<String>,
}

impl Report {
    /// What `step` added.
    pub fn added_by(&self, step: Step) -> impl Iterator<Item = &Added> {
        self.added
            .iter()
            .filter(move |(s, _)| *s == step)
            .map(|(_, a)| a)
    }
}

/// One thing a mutation step added to a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Added {
    /// A toleration, as the pod spec writes it.
    Toleration(Value),
    Volume(String),
    VolumeMount {
        container: String,
        name: String,
        mount_path: String,
    },
    /// A variable the container did not set (one it set may be extended; that is not an
    /// addition).
    Env {
        container: String,
        name: String,
    },
    /// A container the pod did not have; `native`: as an init container with
    /// `restartPolicy: Always`.
    Container {
        name: String,
        native: bool,
    },
    Limit {
        container: String,
        resource: String,
        value: String,
    },
}

impl Added {
    /// A toleration added, as JSON.
    pub fn toleration(t: &Toleration) -> Added {
        // A typed toleration always serialises.
        Added::Toleration(serde_json::to_value(t).unwrap_or(Value::Null))
    }

    /// As the audit's JSON output writes it.
    pub fn to_json(&self) -> Value {
        match self {
            Added::Toleration(v) => json!({"kind": "toleration", "value": v}),
            Added::Volume(n) => json!({"kind": "volume", "name": n}),
            Added::VolumeMount {
                container,
                name,
                mount_path,
            } => {
                json!({"kind": "volumeMount", "container": container, "name": name, "mountPath": mount_path})
            }
            Added::Env { container, name } => {
                json!({"kind": "env", "container": container, "name": name})
            }
            Added::Container { name, native } => json!({
                "kind": "container",
                "name": name,
                "as": if *native { "nativeSidecar" } else { "container" },
            }),
            Added::Limit {
                container,
                resource,
                value,
            } => {
                json!({"kind": "limit", "container": container, "resource": resource, "value": value})
            }
        }
    }

    /// In words, for a person: `toleration nvidia.com/gpu (Exists, NoSchedule)`.
    pub fn describe(&self) -> String {
        match self {
            Added::Toleration(v) => {
                let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
                let mut t = format!("toleration {}", s("key"));
                if !s("value").is_empty() {
                    t.push_str(&format!("={}", s("value")));
                }
                let effect = if s("effect").is_empty() {
                    "any effect"
                } else {
                    s("effect")
                };
                t.push_str(&format!(" ({}, {effect})", s("operator")));
                t
            }
            Added::Volume(n) => format!("volume {n:?}"),
            Added::VolumeMount {
                container,
                name,
                mount_path,
            } => format!("mount of {name:?} at {mount_path} in container {container:?}"),
            Added::Env { container, name } => format!("env {name} in container {container:?}"),
            Added::Container { name, native } => {
                if *native {
                    format!("sidecar {name:?} (native sidecar)")
                } else {
                    format!("container {name:?}")
                }
            }
            Added::Limit {
                container,
                resource,
                value,
            } => format!("limit {resource}: {value} on container {container:?}"),
        }
    }
}

/// Whether the policy treats this pod, with these GPUs, as a training pod.
pub fn is_training_pod(policy: &Policy, pod: &Pod, gpus: &Gpus<'_>) -> bool {
    let sel = &policy.selection;
    let labelled = pod
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| sel.workload_labels.iter().any(|k| l.contains_key(k)));
    labelled || annotation_is_true(pod, &sel.training_annotation) || (sel.gpu_pods && gpus.any())
}

/// Applies every enabled step to a training pod with these GPUs (read before the steps, by
/// [`Gpus::of`]). The caller decides whether the pod is one and whether it opted out.
///
/// `profile` is the policy profile that chose `policy` (None: the base), recorded in the
/// applied annotation with the steps.
///
/// `cluster`: what the steps read of the cluster (the nodes a `driver: auto` class decides
/// from). The namespace's Pod Security is not heeded here: [`mutate_heeding`] is the
/// judgement's.
pub fn mutate(
    policy: &Policy,
    pod: &mut Pod,
    gpus: &Gpus<'_>,
    profile: Option<&str>,
    cluster: &dyn Cluster,
) -> Report {
    mutate_heeding(policy, pod, gpus, profile, cluster, &Heed::default())
}

/// [`mutate`], heeding the namespace's Pod Security (`heed`): nothing its levels forbid is
/// added, whatever decided it, and the applied annotation says what was left out.
pub(crate) fn mutate_heeding(
    policy: &Policy,
    pod: &mut Pod,
    gpus: &Gpus<'_>,
    profile: Option<&str>,
    cluster: &dyn Cluster,
    heed: &Heed<'_>,
) -> Report {
    let m = &policy.mutation;
    let mut out = Report::default();
    let mut added = Vec::new();
    // In the steps' order: the sidecar goes in before defaults so that it is covered by
    // them like any container.
    for step in Step::ALL {
        if !m.enabled(step) {
            continue;
        }
        let apply: StepFn = match step {
            Step::Tolerations => |policy, gpus, cluster, pod, added, warnings, _| {
                tolerations::apply(policy, gpus, cluster, pod, added, warnings)
            },
            Step::DriverMounts => driver_mounts::apply,
            Step::MetricsSidecar => |policy, _, _, pod, added, warnings, heed| {
                metrics_sidecar::apply(policy, pod, added, warnings, heed)
            },
            Step::DefaultResources => |policy, gpus, cluster, pod, added, warnings, _| {
                default_resources::apply(policy, gpus, cluster, pod, added, warnings)
            },
        };
        if apply(
            policy,
            gpus,
            cluster,
            pod,
            &mut added,
            &mut out.warnings,
            heed,
        ) {
            out.applied.push(step);
        }
        out.added.extend(added.drain(..).map(|a| (step, a)));
    }
    let classes: Vec<&str> = gpus.classes.iter().map(|c| c.name).collect();
    // A driver Pod Security kept out is said beside the steps, as the warning says it.
    let left = if m.enabled(Step::DriverMounts) {
        driver_mounts::left_to_runtime(gpus, pod, cluster, heed).map(|v| v.applied())
    } else {
        None
    };
    record_applied(
        policy,
        pod,
        &out.applied,
        &classes,
        left.as_deref(),
        profile,
    );
    out
}

/// A step as [`mutate`] runs it, with the pod's GPUs, the cluster and the namespace's Pod
/// Security: it records what it added and warns, and says whether it changed the pod.
type StepFn = fn(
    &Policy,
    &Gpus<'_>,
    &dyn Cluster,
    &mut Pod,
    &mut Vec<Added>,
    &mut Vec<String>,
    &Heed<'_>,
) -> bool;

/// A step on its own: it reads the pod's GPUs itself, without a cluster context or a Pod
/// Security label, and keeps only its warnings (the steps' own tests).
#[cfg(test)]
pub(crate) fn alone(
    apply: StepFn,
    policy: &Policy,
    pod: &mut Pod,
    warnings: &mut Vec<String>,
) -> bool {
    let gpus = Gpus::of(policy, pod, "", &crate::cluster::Offline);
    apply(
        policy,
        &gpus,
        &crate::cluster::Offline,
        pod,
        &mut Vec::new(),
        warnings,
        &Heed::default(),
    )
}

/// One item of the applied annotation: a step, the GPU class it recognised
/// (`gpu=nvidia`), a driver the namespace's Pod Security kept out
/// (`driver=runtime(pod-security:baseline)`), or the profile of the policy it applied
/// (`profile=team-a`). Steps come first, in their order, then the classes by name, the
/// driver, then the profile.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Applied {
    Step(Step),
    Gpu(String),
    /// A driver not mounted, and why: `driver=runtime(pod-security:baseline)`.
    Driver(String),
    Profile(String),
}

impl Applied {
    fn parse(s: &str) -> Option<Applied> {
        if let Some(class) = s.strip_prefix("gpu=") {
            return (!class.is_empty()).then(|| Applied::Gpu(class.to_owned()));
        }
        if let Some(driver) = s.strip_prefix("driver=") {
            return (!driver.is_empty()).then(|| Applied::Driver(driver.to_owned()));
        }
        if let Some(profile) = s.strip_prefix("profile=") {
            return (!profile.is_empty()).then(|| Applied::Profile(profile.to_owned()));
        }
        Step::from_name(s).map(Applied::Step)
    }

    fn write(&self, out: &mut String) {
        match self {
            Applied::Step(s) => out.push_str(s.as_str()),
            Applied::Gpu(c) => {
                out.push_str("gpu=");
                out.push_str(c);
            }
            Applied::Driver(d) => {
                out.push_str("driver=");
                out.push_str(d);
            }
            Applied::Profile(p) => {
                out.push_str("profile=");
                out.push_str(p);
            }
        }
    }
}

/// Records the steps applied to this pod, the GPU classes they served and the profile,
/// across passes: the union of what the annotation already says and what this pass did, so
/// that a second pass leaves it unchanged. A pass that applied nothing records nothing.
fn record_applied(
    policy: &Policy,
    pod: &mut Pod,
    applied: &[Step],
    classes: &[&str],
    driver: Option<&str>,
    profile: Option<&str>,
) {
    let key = &policy.mutation.applied_annotation;
    let annotations = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    let mut items: Vec<Applied> = annotations
        .get(key)
        .map(|v| {
            v.split(',')
                .filter_map(|s| Applied::parse(s.trim()))
                .collect()
        })
        .unwrap_or_default();
    let context = classes
        .iter()
        .map(|c| Applied::Gpu((*c).to_owned()))
        .chain(driver.map(|d| Applied::Driver(d.to_owned())))
        .chain(profile.map(|p| Applied::Profile(p.to_owned())))
        .filter(|_| !applied.is_empty());
    let new = applied.iter().map(|s| Applied::Step(*s)).chain(context);
    let before = items.len();
    for item in new {
        if !items.contains(&item) {
            items.push(item);
        }
    }
    if items.len() == before {
        if annotations.is_empty() {
            pod.metadata.annotations = None;
        }
        return;
    }
    items.sort();
    let mut value = String::new();
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            value.push(',');
        }
        item.write(&mut value);
    }
    annotations.insert(key.clone(), value);
}

/// What every step's unit tests need: pods from JSON, and a step run twice.
#[cfg(test)]
pub(crate) mod testing {
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::Value;

    use crate::policy::Policy;

    /// A step as its own tests call it: `ensure(policy, pod, warnings)`.
    pub(crate) type EnsureFn = fn(&Policy, &mut Pod, &mut Vec<String>) -> bool;

    pub(crate) fn pod(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    pub(crate) fn to_json(p: &Pod) -> Value {
        serde_json::to_value(p).unwrap()
    }

    /// Runs `step`, then again on its output, asserting the second pass changes nothing.
    /// Returns whether the first pass changed the pod, its warnings and the second's.
    pub(crate) fn twice(
        step: EnsureFn,
        policy: &Policy,
        p: &mut Pod,
    ) -> (bool, Vec<String>, Vec<String>) {
        let mut warnings = vec![];
        let changed = step(policy, p, &mut warnings);
        let after = to_json(p);
        let mut again = vec![];
        assert!(!step(policy, p, &mut again), "second pass changed the pod");
        assert_eq!(to_json(p), after, "second pass changed the pod");
        (changed, warnings, again)
    }
}

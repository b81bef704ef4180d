//! Mutation: the four idempotent "ensure" steps applied to training pods.
//!
//! Each step looks at the typed pod, changes only what is missing, and reports whether it
//! changed anything. Running the steps again on their own output changes nothing, which is
//! what makes `reinvocationPolicy: IfNeeded` and the empty second patch work.

pub mod default_resources;
pub mod driver_mounts;
pub mod metrics_sidecar;
pub mod tolerations;

use k8s_openapi::api::core::v1::Pod;

use crate::pod::{annotation_is_true, asks_for_gpu};
use crate::policy::Policy;

/// One mutation step, named as in the applied annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Step {
    Tolerations,
    DriverMounts,
    MetricsSidecar,
    DefaultResources,
}

impl Step {
    pub const ALL: [Step; 4] = [
        Step::Tolerations,
        Step::DriverMounts,
        Step::MetricsSidecar,
        Step::DefaultResources,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Step::Tolerations => "tolerations",
            Step::DriverMounts => "driver-mounts",
            Step::MetricsSidecar => "metrics-sidecar",
            Step::DefaultResources => "default-resources",
        }
    }

    fn from_str(s: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

/// What mutation did to a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Steps that changed the pod in this pass, in order.
    pub applied: Vec<Step>,
    /// Messages for the user (kubectl prints them).
    pub warnings: Vec<String>,
}

/// Whether the policy treats this pod as a training pod.
pub fn is_training_pod(policy: &Policy, pod: &Pod) -> bool {
    let sel = &policy.selection;
    let labelled = pod
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| sel.workload_labels.iter().any(|k| l.contains_key(k)));
    labelled
        || annotation_is_true(pod, &sel.training_annotation)
        || (sel.gpu_pods && asks_for_gpu(policy, pod))
}

/// Applies every enabled step to a training pod. The caller decides whether the pod is one
/// and whether it opted out.
pub fn mutate(policy: &Policy, pod: &mut Pod) -> Outcome {
    let m = &policy.mutation;
    let mut out = Outcome::default();
    // The sidecar goes in before defaults so that it is covered by them like any container.
    let steps: [(Step, bool, StepFn); 4] = [
        (
            Step::Tolerations,
            m.gpu_tolerations.enabled,
            tolerations::ensure,
        ),
        (
            Step::DriverMounts,
            m.driver_mounts.enabled,
            driver_mounts::ensure,
        ),
        (
            Step::MetricsSidecar,
            m.metrics_sidecar.enabled,
            metrics_sidecar::ensure,
        ),
        (
            Step::DefaultResources,
            m.default_resources.enabled,
            default_resources::ensure,
        ),
    ];
    for (step, enabled, ensure) in steps {
        if enabled && ensure(policy, pod, &mut out.warnings) {
            out.applied.push(step);
        }
    }
    record_applied(policy, pod, &out.applied);
    out
}

type StepFn = fn(&Policy, &mut Pod, &mut Vec<String>) -> bool;

/// Records the steps applied to this pod, across passes: the union of what the annotation
/// already says and what this pass did, so that a second pass leaves it unchanged.
fn record_applied(policy: &Policy, pod: &mut Pod, applied: &[Step]) {
    let key = &policy.mutation.applied_annotation;
    let annotations = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    let mut steps: Vec<Step> = annotations
        .get(key)
        .map(|v| {
            v.split(',')
                .filter_map(|s| Step::from_str(s.trim()))
                .collect()
        })
        .unwrap_or_default();
    if applied.iter().all(|s| steps.contains(s)) {
        if annotations.is_empty() {
            pod.metadata.annotations = None;
        }
        return;
    }
    steps.extend_from_slice(applied);
    steps.sort();
    steps.dedup();
    let value = steps
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",");
    annotations.insert(key.clone(), value);
}

/// What every step's unit tests need: pods from JSON, and a step run twice.
#[cfg(test)]
pub(crate) mod testing {
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::Value;

    use super::StepFn;
    use crate::policy::Policy;

    pub fn pod(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    pub fn to_json(p: &Pod) -> Value {
        serde_json::to_value(p).unwrap()
    }

    /// Runs `step`, then again on its output, asserting the second pass changes nothing.
    /// Returns whether the first pass changed the pod, its warnings and the second's.
    pub fn twice(step: StepFn, policy: &Policy, p: &mut Pod) -> (bool, Vec<String>, Vec<String>) {
        let mut warnings = vec![];
        let changed = step(policy, p, &mut warnings);
        let after = to_json(p);
        let mut again = vec![];
        assert!(!step(policy, p, &mut again), "second pass changed the pod");
        assert_eq!(to_json(p), after, "second pass changed the pod");
        (changed, warnings, again)
    }
}

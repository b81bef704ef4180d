//! A pod's placement as the scheduler reads it, for what decides where it may go (the
//! nodes there are, `nodes`; the nodes an autoscaler may add, `autoscaling`): its required
//! node affinity, and whether it tolerates a taint.

use k8s_openapi::api::core::v1::{NodeSelectorTerm, Pod};

use crate::capacity::Taint;

/// The terms of the pod's required node affinity, of which a node must meet one.
pub(super) fn required_terms(pod: &Pod) -> Option<&Vec<NodeSelectorTerm>> {
    pod.spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .map(|s| &s.node_selector_terms)
}

/// Whether one of the pod's tolerations tolerates taint `t` (`v1.Toleration.ToleratesTaint`).
pub(super) fn tolerated(pod: &Pod, t: &Taint) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .into_iter()
        .flatten()
        .any(|tol| {
            let effect = tol.effect.as_deref().unwrap_or("");
            if !effect.is_empty() && effect != t.effect {
                return false;
            }
            let key = tol.key.as_deref().unwrap_or("");
            let operator = tol.operator.as_deref().unwrap_or("Equal");
            if key.is_empty() {
                return operator == "Exists";
            }
            key == t.key
                && match operator {
                    "Exists" => true,
                    "Equal" | "" => tol.value.as_deref().unwrap_or("") == t.value,
                    _ => false,
                }
        })
}

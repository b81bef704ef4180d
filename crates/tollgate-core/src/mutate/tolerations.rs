//! GPU tolerations, as the built-in ExtendedResourceToleration plugin adds them.
//!
//! Nodes with GPUs are commonly tainted `<resource>:NoSchedule` so that only pods asking for
//! the GPU land there; a pod asking for it needs the matching toleration. Tolerations already
//! on the pod (the apiserver's not-ready/unreachable ones among them) are kept as they are.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Pod, Toleration};

use crate::pod::{containers, gpus_of};
use crate::policy::Policy;

pub fn ensure(policy: &Policy, pod: &mut Pod, _warnings: &mut Vec<String>) -> bool {
    let Some(spec) = pod.spec.as_mut() else {
        return false;
    };
    let effect = &policy.mutation.gpu_tolerations.effect;
    // Sorted, so that the order of the tolerations added does not depend on container order.
    let wanted: BTreeSet<String> = containers(spec)
        .flat_map(|(_, c)| gpus_of(policy, c).into_iter().map(|(name, _)| name))
        .collect();
    let mut changed = false;
    for resource in wanted {
        let existing = spec.tolerations.as_deref().unwrap_or_default();
        if existing.iter().any(|t| tolerates(t, &resource, effect)) {
            continue;
        }
        spec.tolerations
            .get_or_insert_with(Vec::new)
            .push(Toleration {
                key: Some(resource),
                operator: Some("Exists".into()),
                effect: (!effect.is_empty()).then(|| effect.clone()),
                ..Default::default()
            });
        changed = true;
    }
    changed
}

/// Whether an existing toleration already tolerates the taint `<resource>:<effect>` with any
/// value: same key or an empty key, operator Exists, and the same effect or none.
fn tolerates(t: &Toleration, resource: &str, effect: &str) -> bool {
    let key = t.key.as_deref().unwrap_or("");
    let exists = t.operator.as_deref() == Some("Exists");
    let effect_ok = match t.effect.as_deref() {
        None | Some("") => true,
        Some(e) => e == effect,
    };
    exists && (key.is_empty() || key == resource) && effect_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::testing::pod;
    use serde_json::json;

    fn gpu_pod(tolerations: serde_json::Value) -> Pod {
        pod(json!({"spec": {
            "containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "tolerations": tolerations,
        }}))
    }

    #[test]
    fn adds_one_toleration_per_gpu_resource_and_keeps_existing() {
        let mut p = pod(json!({"spec": {
            "initContainers": [{"name": "i", "resources": {"requests": {"amd.com/gpu": "1"}, "limits": {"amd.com/gpu": "1"}}}],
            "containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
        }}));
        assert!(ensure(&Policy::default(), &mut p, &mut vec![]));
        let keys: Vec<_> = p
            .spec
            .as_ref()
            .unwrap()
            .tolerations
            .as_ref()
            .unwrap()
            .iter()
            .map(|t| t.key.clone().unwrap())
            .collect();
        assert_eq!(
            keys,
            [
                "node.kubernetes.io/not-ready",
                "amd.com/gpu",
                "nvidia.com/gpu"
            ]
        );
        assert!(
            !ensure(&Policy::default(), &mut p, &mut vec![]),
            "idempotent"
        );
    }

    #[test]
    fn already_tolerated_by_key_or_wildcard() {
        for t in [
            json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]),
            json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]),
            json!([{"operator": "Exists"}]),
        ] {
            let mut p = gpu_pod(t.clone());
            assert!(!ensure(&Policy::default(), &mut p, &mut vec![]), "{t}");
        }
        // An Equal toleration for one value, or another effect, does not cover every GPU node.
        for t in [
            json!([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}]),
            json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}]),
        ] {
            let mut p = gpu_pod(t.clone());
            assert!(ensure(&Policy::default(), &mut p, &mut vec![]), "{t}");
        }
    }

    #[test]
    fn all_extended_resources_switch() {
        let mut p = pod(
            json!({"spec": {"containers": [{"name": "t", "resources": {"limits": {"example.com/fpga": "1"}}}]}}),
        );
        assert!(!ensure(&Policy::default(), &mut p, &mut vec![]));
        let mut policy = Policy::default();
        policy.gpu.all_extended_resources = true;
        assert!(ensure(&policy, &mut p, &mut vec![]));
    }
}

//! GPU tolerations: what the built-in ExtendedResourceToleration plugin adds, for every way
//! a pod gets a GPU and every way a pool is tainted.
//!
//! GPU nodes are tainted so that only pods that need them land there: with the resource's
//! own name (`nvidia.com/gpu:NoSchedule`, what the plugin assumes), or with a pool's key
//! (`sku=gpu:NoSchedule` on AKS, `pool=a100`). A MIG slice or a DRA claim lands on the same
//! `nvidia.com/gpu` nodes, which the plugin does not know. Each GPU class of the policy
//! says what its pods tolerate. Tolerations already on the pod (the apiserver's
//! not-ready/unreachable ones among them) are kept as they are, and one that already covers
//! a taint means there is nothing to add for it.

use k8s_openapi::api::core::v1::{Pod, Toleration};

use super::Added;
use crate::gpu::Gpus;
use crate::policy::Policy;

/// [`apply`] with the pod's GPUs read from the pod alone.
#[cfg(test)]
pub(crate) fn ensure(policy: &Policy, pod: &mut Pod, warnings: &mut Vec<String>) -> bool {
    super::alone(
        |policy, gpus, cluster, pod, added, warnings, _| {
            apply(policy, gpus, cluster, pod, added, warnings)
        },
        policy,
        pod,
        warnings,
    )
}

pub(crate) fn apply(
    _: &Policy,
    gpus: &Gpus<'_>,
    _: &dyn crate::cluster::Cluster,
    pod: &mut Pod,
    added: &mut Vec<Added>,
    warnings: &mut Vec<String>,
) -> bool {
    let Some(spec) = pod.spec.as_mut() else {
        return false;
    };
    let mut changed = false;
    for wanted in gpus.wanted_tolerations() {
        let existing = spec.tolerations.as_deref().unwrap_or_default();
        if existing.iter().any(|t| covers(t, &wanted.toleration)) {
            continue;
        }
        warnings.push(format!(
            "tollgate: added the toleration {} for GPU class {:?} ({})",
            describe(&wanted.toleration),
            wanted.class.name,
            wanted.because
        ));
        added.push(Added::toleration(&wanted.toleration));
        spec.tolerations
            .get_or_insert_with(Vec::new)
            .push(wanted.toleration);
        changed = true;
    }
    changed
}

/// Whether toleration `t` tolerates every taint that `wanted` tolerates: an empty key with
/// Exists tolerates every taint; otherwise the same key, with Exists (any value) or the same
/// value as an Equal `wanted`, and no effect (every effect) or the same one.
fn covers(t: &Toleration, wanted: &Toleration) -> bool {
    let key = t.key.as_deref().unwrap_or("");
    // The apiserver defaults an unset operator to Equal.
    let exists = t.operator.as_deref() == Some("Exists");
    let wanted_key = wanted.key.as_deref().unwrap_or("");
    let wanted_exists = wanted.operator.as_deref() == Some("Exists");
    let key_ok = if key.is_empty() {
        exists
    } else {
        key == wanted_key
    };
    let value_ok = exists
        || (!wanted_exists
            && t.value.as_deref().unwrap_or("") == wanted.value.as_deref().unwrap_or(""));
    let effect_ok = match t.effect.as_deref() {
        None | Some("") => true,
        Some(e) => wanted.effect.as_deref() == Some(e),
    };
    key_ok && value_ok && effect_ok
}

/// A toleration as a user reads it: `key:Effect`, `key=value:Effect`, or `every taint`.
fn describe(t: &Toleration) -> String {
    let key = t.key.as_deref().unwrap_or("");
    let mut out = if key.is_empty() {
        "of every taint".to_owned()
    } else if t.operator.as_deref() == Some("Exists") {
        key.to_owned()
    } else {
        format!("{key}={}", t.value.as_deref().unwrap_or(""))
    };
    match t.effect.as_deref() {
        None | Some("") => {}
        Some(e) => {
            out.push(':');
            out.push_str(e);
        }
    }
    out
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
        assert!(ensure(&Policy::builtin(), &mut p, &mut vec![]));
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
            !ensure(&Policy::builtin(), &mut p, &mut vec![]),
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
            assert!(!ensure(&Policy::builtin(), &mut p, &mut vec![]), "{t}");
        }
        // An Equal toleration for one value, or another effect, does not cover every GPU node.
        for t in [
            json!([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}]),
            json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}]),
        ] {
            let mut p = gpu_pod(t.clone());
            assert!(ensure(&Policy::builtin(), &mut p, &mut vec![]), "{t}");
        }
    }

    #[test]
    fn all_extended_resources_switch() {
        let mut p = pod(
            json!({"spec": {"containers": [{"name": "t", "resources": {"limits": {"example.com/fpga": "1"}}}]}}),
        );
        assert!(!ensure(&Policy::builtin(), &mut p, &mut vec![]));
        let mut policy = Policy::builtin();
        policy.gpu.all_extended_resources = true;
        assert!(ensure(&policy, &mut p, &mut vec![]));
    }
}

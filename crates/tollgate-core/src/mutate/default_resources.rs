//! Default limits, so that one runaway trainer cannot starve a node it shares.
//!
//! Unlike a LimitRange, a default is never put below what the container requests: LimitRanger
//! does exactly that and the apiserver then rejects the pod it defaulted itself
//! (kubernetes/kubernetes#51430). The request becomes the limit instead, and the user is told.
//!
//! Extended resources (GPUs) and hugepages cannot be overcommitted: the apiserver rejects a
//! request without an equal limit, so the limit is filled in from the request.
//!
//! Nothing the user wrote is changed, and a resource the pod sets at pod level
//! (`spec.resources`) is left to that pod-level budget. Quantities tollgate cannot read are left
//! for the apiserver to judge.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::Added;
use crate::gpu::{Gpus, Use};
use crate::pod::ContainerKind;
use crate::policy::{DefaultResources, Policy};
use crate::quantity;

const NANO: i128 = 1_000_000_000;

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
    policy: &Policy,
    gpus: &Gpus<'_>,
    _: &dyn crate::cluster::Cluster,
    pod: &mut Pod,
    added: &mut Vec<Added>,
    warnings: &mut Vec<String>,
) -> bool {
    let Some(spec) = pod.spec.as_mut() else {
        return false;
    };
    let PodSpec {
        init_containers,
        containers,
        resources: pod_level,
        ..
    } = spec;
    let pod_level = pod_level.as_ref();
    let all = crate::pod::containers_mut(init_containers, containers);
    let mut changed = false;
    for (kind, c) in all {
        let set = fill(policy, gpus.of_container(&c.name), pod_level, c);
        if !set.is_empty() {
            warnings.push(message(kind, &c.name, &set));
            added.extend(set.into_iter().map(|s| Added::Limit {
                container: c.name.clone(),
                resource: s.resource,
                value: s.value,
            }));
            changed = true;
        }
    }
    changed
}

/// A limit tollgate set, and why it has that value.
struct Set {
    resource: String,
    value: String,
    why: Why,
}

enum Why {
    Default,
    /// The per-GPU default times the container's GPUs (how, in words).
    PerGpu(String),
    /// The request, which is above the default (given).
    Request(String),
    /// A non-overcommittable resource: the limit must equal the request.
    NotOvercommittable,
}

/// Sets the missing limits of one container, which uses the GPUs `gpus`, returning what it
/// set (empty: nothing, and no allocation).
fn fill(
    policy: &Policy,
    gpus: &[Use<'_>],
    pod_level: Option<&ResourceRequirements>,
    c: &mut Container,
) -> Vec<Set> {
    let dr = &policy.mutation.default_resources;
    let mut set = Vec::new();
    // A resource with a per-GPU default but none in `limits` has a default only for GPU
    // containers.
    let mut names: Vec<&String> = dr.limits.keys().collect();
    if !gpus.is_empty() {
        let per_gpu = dr
            .per_gpu
            .keys()
            .chain(gpus.iter().flat_map(|u| u.class.spec.per_gpu.keys()));
        for k in per_gpu {
            if !names.contains(&k) {
                names.push(k);
            }
        }
    }
    for resource in names {
        if pod_sets(pod_level, resource) || has_limit(c, resource) {
            continue;
        }
        let Some((default, why)) = default_for(dr, gpus, resource) else {
            continue;
        };
        let (value, why) = match requested(c, resource) {
            None => (Quantity(quantity::format_for(resource, default)), why),
            Some(request) => match quantity::parse(&request.0) {
                Err(_) => continue,
                Ok(r) if r > default => (
                    request.clone(),
                    Why::Request(quantity::format_for(resource, default)),
                ),
                Ok(_) => (Quantity(quantity::format_for(resource, default)), why),
            },
        };
        set.push(Set {
            resource: resource.clone(),
            value: value.0.clone(),
            why,
        });
        limits_mut(c).insert(resource.clone(), value);
    }
    let extended_without_limit = c.resources.as_ref().is_some_and(|r| {
        r.requests.iter().flatten().any(|(name, q)| {
            quantity::is_non_overcommittable(name)
                && !r.limits.as_ref().is_some_and(|l| l.contains_key(name))
                && quantity::parse(&q.0).is_ok()
        })
    });
    if extended_without_limit {
        if let Some(ResourceRequirements {
            requests: Some(requests),
            limits,
            ..
        }) = c.resources.as_mut()
        {
            let limits = limits.get_or_insert_with(BTreeMap::new);
            for (name, q) in requests.iter() {
                if quantity::is_non_overcommittable(name)
                    && !limits.contains_key(name)
                    && quantity::parse(&q.0).is_ok()
                {
                    limits.insert(name.clone(), q.clone());
                    set.push(Set {
                        resource: name.clone(),
                        value: q.0.clone(),
                        why: Why::NotOvercommittable,
                    });
                }
            }
        }
    }
    set
}

/// The default limit for a container with GPUs `gpus` and a resource, in nano-units, or
/// None when there is none or it cannot be computed (an unreadable GPU count, an absurd
/// product). With GPUs of a class that has a per-GPU default for the resource (its own, or
/// `mutation.defaultResources.perGpu`), the default is the sum over the container's GPUs.
fn default_for(dr: &DefaultResources, gpus: &[Use<'_>], resource: &str) -> Option<(i128, Why)> {
    let mut total: i128 = 0;
    let mut per_gpu: Option<&str> = None;
    let mut mixed = false;
    for u in gpus {
        let Some(per) = u
            .class
            .spec
            .per_gpu
            .get(resource)
            .or(dr.per_gpu.get(resource))
        else {
            continue;
        };
        let per_nano = quantity::parse(&per.0).ok()?;
        // Both are in nano-units; fractional GPUs (which the apiserver refuses) round up.
        total = total.checked_add(per_nano.checked_mul(u.count?.max(0))?)?;
        match per_gpu {
            Some(p) if p != per.0 => mixed = true,
            _ => per_gpu = Some(&per.0),
        }
    }
    if let Some(per) = per_gpu {
        if total > 0 {
            let value = total / NANO + i128::from(total % NANO > 0);
            let why = if mixed {
                Why::PerGpu("the per-GPU defaults of its classes".into())
            } else {
                Why::PerGpu(format!("{per} per GPU"))
            };
            return Some((value, why));
        }
    }
    let flat = dr.limits.get(resource)?;
    Some((quantity::parse(&flat.0).ok()?, Why::Default))
}

fn pod_sets(pod_level: Option<&ResourceRequirements>, resource: &str) -> bool {
    pod_level.is_some_and(|r| {
        [r.requests.as_ref(), r.limits.as_ref()]
            .into_iter()
            .flatten()
            .any(|m| m.contains_key(resource))
    })
}

fn has_limit(c: &Container, resource: &str) -> bool {
    c.resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .is_some_and(|m| m.contains_key(resource))
}

fn requested<'a>(c: &'a Container, resource: &str) -> Option<&'a Quantity> {
    c.resources.as_ref()?.requests.as_ref()?.get(resource)
}

fn limits_mut(c: &mut Container) -> &mut BTreeMap<String, Quantity> {
    c.resources
        .get_or_insert_with(Default::default)
        .limits
        .get_or_insert_with(BTreeMap::new)
}

/// One line per container, for someone reading `kubectl apply` output: what was missing,
/// what it is now, and where each value comes from when it is not the plain default.
fn message(kind: ContainerKind, name: &str, set: &[Set]) -> String {
    let mut m = format!("tollgate: {} {name:?} had no ", kind.noun());
    for (i, s) in set.iter().enumerate() {
        if i > 0 {
            m.push('/');
        }
        m.push_str(&s.resource);
    }
    m.push_str(" limit; set ");
    for (i, s) in set.iter().enumerate() {
        if i > 0 {
            m.push_str(", ");
        }
        // Writing to a String cannot fail.
        let _ = write!(m, "{}={}", s.resource, s.value);
        let _ = match &s.why {
            Why::Default => Ok(()),
            Why::PerGpu(per) => write!(m, " ({per})"),
            Why::Request(default) => write!(m, " (its request, above the {default} default)"),
            Why::NotOvercommittable => write!(m, " (its request)"),
        };
    }
    if set.iter().all(|s| matches!(s.why, Why::Default)) {
        m.push_str(" (cluster defaults)");
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::testing::{pod, to_json, twice};
    use serde_json::{json, Value};

    /// Runs the step, then checks a second pass changes nothing and says nothing.
    fn run(policy: &Policy, p: &mut Pod) -> (bool, Vec<String>) {
        let (changed, warnings, again) = twice(ensure, policy, p);
        assert!(again.is_empty(), "{again:?}");
        assert_eq!(changed, !warnings.is_empty());
        for w in &warnings {
            assert!(w.starts_with("tollgate: "), "{w}");
        }
        (changed, warnings)
    }

    fn one(c: Value) -> Pod {
        pod(json!({"spec": {"containers": [c]}}))
    }

    fn resources(p: &Pod, i: usize) -> Value {
        to_json(p)["spec"]["containers"][i]["resources"].clone()
    }

    fn per_gpu() -> Policy {
        let mut p = Policy::builtin();
        let d = &mut p.mutation.default_resources.per_gpu;
        d.insert("cpu".into(), Quantity("8".into()));
        d.insert("memory".into(), Quantity("64Gi".into()));
        p
    }

    #[test]
    fn container_without_limits_gets_the_defaults() {
        let mut p = one(
            json!({"name": "pytorch", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}),
        );
        let (changed, warnings) = run(&Policy::builtin(), &mut p);
        assert!(changed);
        assert_eq!(
            warnings,
            ["tollgate: container \"pytorch\" had no cpu/memory limit; set cpu=2, memory=4Gi (cluster defaults)"]
        );
        assert_eq!(
            resources(&p, 0),
            json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}})
        );
    }

    #[test]
    fn no_resources_at_all() {
        let mut p = one(json!({"name": "t"}));
        run(&Policy::builtin(), &mut p);
        assert_eq!(
            resources(&p, 0),
            json!({"limits": {"cpu": "2", "memory": "4Gi"}})
        );
    }

    #[test]
    fn user_limits_are_never_changed() {
        let mut p = one(json!({"name": "t", "resources": {"limits": {"cpu": "500m"}}}));
        let (_, warnings) = run(&Policy::builtin(), &mut p);
        assert_eq!(
            resources(&p, 0)["limits"],
            json!({"cpu": "500m", "memory": "4Gi"})
        );
        assert_eq!(
            warnings,
            ["tollgate: container \"t\" had no memory limit; set memory=4Gi (cluster defaults)"]
        );
        // Even a limit below the request, which the apiserver will refuse: the user's to fix.
        let mut p = one(
            json!({"name": "t", "resources": {"requests": {"cpu": "3"}, "limits": {"cpu": "1", "memory": "bogus"}}}),
        );
        assert!(!run(&Policy::builtin(), &mut p).0);
    }

    #[test]
    fn request_above_the_default_becomes_the_limit() {
        let mut p = one(
            json!({"name": "pytorch", "resources": {"requests": {"cpu": "1500m", "memory": "6144Mi"}}}),
        );
        let (_, warnings) = run(&Policy::builtin(), &mut p);
        assert_eq!(
            resources(&p, 0)["limits"],
            json!({"cpu": "2", "memory": "6144Mi"})
        );
        assert_eq!(
            warnings,
            ["tollgate: container \"pytorch\" had no cpu/memory limit; set cpu=2, memory=6144Mi (its request, above the 4Gi default)"]
        );
        // Equal to the default: the default.
        let mut p = one(json!({"name": "t", "resources": {"requests": {"cpu": "2000m"}}}));
        run(&Policy::builtin(), &mut p);
        assert_eq!(resources(&p, 0)["limits"]["cpu"], "2");
    }

    #[test]
    fn per_gpu_defaults_scale_with_every_gpu_kind() {
        let mut policy = per_gpu();
        policy
            .mutation
            .default_resources
            .per_gpu
            .insert("ephemeral-storage".into(), Quantity("100Gi".into()));
        let mut p = pod(json!({"spec": {"containers": [
            {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "3", "amd.com/gpu": "1"}}},
            {"name": "logger"},
        ]}}));
        let (_, warnings) = run(&policy, &mut p);
        assert_eq!(
            resources(&p, 0)["limits"],
            json!({"nvidia.com/gpu": "3", "amd.com/gpu": "1", "cpu": "32", "memory": "256Gi", "ephemeral-storage": "400Gi"})
        );
        assert_eq!(
            warnings[0],
            "tollgate: container \"trainer\" had no cpu/memory/ephemeral-storage limit; set cpu=32 (8 per GPU), memory=256Gi (64Gi per GPU), ephemeral-storage=400Gi (100Gi per GPU)"
        );
        // No GPU: the flat defaults, and no per-GPU-only resource.
        assert_eq!(
            resources(&p, 1)["limits"],
            json!({"cpu": "2", "memory": "4Gi"})
        );
    }

    #[test]
    fn per_gpu_below_a_request_uses_the_request() {
        let mut p = one(
            json!({"name": "t", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "12"}, "limits": {"nvidia.com/gpu": "1"}}}),
        );
        let (_, warnings) = run(&per_gpu(), &mut p);
        assert_eq!(resources(&p, 0)["limits"]["cpu"], "12");
        assert!(
            warnings[0].contains("cpu=12 (its request, above the 8 default)"),
            "{}",
            warnings[0]
        );
    }

    #[test]
    fn per_gpu_with_fractional_cpu() {
        let mut policy = per_gpu();
        policy
            .mutation
            .default_resources
            .per_gpu
            .insert("cpu".into(), Quantity("1500m".into()));
        let mut p = one(json!({"name": "t", "resources": {"limits": {"nvidia.com/gpu": "3"}}}));
        run(&policy, &mut p);
        assert_eq!(resources(&p, 0)["limits"]["cpu"], "4500m");
    }

    #[test]
    fn gpu_request_without_limit_gets_an_equal_limit() {
        let mut p = one(json!({"name": "t", "resources": {
            "requests": {"nvidia.com/gpu": "2", "hugepages-2Mi": "1Gi", "example.com/fpga": "1", "cpu": "1"},
            "limits": {"cpu": "1", "memory": "1Gi"},
        }}));
        let (_, warnings) = run(&Policy::builtin(), &mut p);
        assert_eq!(
            resources(&p, 0)["limits"],
            json!({"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "2", "hugepages-2Mi": "1Gi", "example.com/fpga": "1"})
        );
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("nvidia.com/gpu=2 (its request)"),
            "{}",
            warnings[0]
        );
        // Both set and different: the apiserver's to refuse, not ours to rewrite.
        let mut p = one(json!({"name": "t", "resources": {
            "requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2", "cpu": "1", "memory": "1Gi"},
        }}));
        assert!(!run(&Policy::builtin(), &mut p).0);
    }

    #[test]
    fn pod_level_resources_are_respected() {
        let mut p = pod(json!({"spec": {
            "resources": {"requests": {"cpu": "4"}},
            "containers": [{"name": "a"}, {"name": "b", "resources": {"requests": {"memory": "8Gi"}}}],
        }}));
        let (_, warnings) = run(&Policy::builtin(), &mut p);
        assert_eq!(resources(&p, 0)["limits"], json!({"memory": "4Gi"}));
        assert_eq!(resources(&p, 1)["limits"], json!({"memory": "8Gi"}));
        assert_eq!(warnings.len(), 2);
        let mut p = pod(json!({"spec": {
            "resources": {"limits": {"cpu": "4", "memory": "16Gi"}},
            "containers": [{"name": "a"}],
        }}));
        assert!(!run(&Policy::builtin(), &mut p).0);
    }

    #[test]
    fn unreadable_quantities_are_left_alone() {
        let mut p = one(
            json!({"name": "t", "resources": {"requests": {"cpu": "lots", "nvidia.com/gpu": "many"}}}),
        );
        let (_, warnings) = run(&Policy::builtin(), &mut p);
        assert_eq!(resources(&p, 0)["limits"], json!({"memory": "4Gi"}));
        assert_eq!(warnings.len(), 1);
        // An unreadable GPU count leaves the per-GPU resources alone rather than guess.
        let mut p = one(json!({"name": "t", "resources": {"limits": {"nvidia.com/gpu": "x"}}}));
        assert!(!run(&per_gpu(), &mut p).0);
        // Absurd products do not overflow.
        let mut policy = per_gpu();
        policy
            .mutation
            .default_resources
            .per_gpu
            .insert("memory".into(), Quantity("1000Ei".into()));
        let mut p = one(
            json!({"name": "t", "resources": {"limits": {"nvidia.com/gpu": "999999999999999999"}}}),
        );
        ensure(&policy, &mut p, &mut vec![]);
        assert!(resources(&p, 0)["limits"].get("memory").is_none());
    }

    #[test]
    fn every_kind_of_container_but_ephemeral() {
        let mut p = pod(json!({"spec": {
            "initContainers": [{"name": "fetch"}, {"name": "proxy", "restartPolicy": "Always"}],
            "containers": [{"name": "t"}],
            "ephemeralContainers": [{"name": "debug"}],
        }}));
        let (_, warnings) = run(&Policy::builtin(), &mut p);
        let v = to_json(&p);
        for c in [
            &v["spec"]["initContainers"][0],
            &v["spec"]["initContainers"][1],
            &v["spec"]["containers"][0],
        ] {
            assert_eq!(
                c["resources"]["limits"],
                json!({"cpu": "2", "memory": "4Gi"}),
                "{c}"
            );
        }
        assert_eq!(
            v["spec"]["ephemeralContainers"][0],
            json!({"name": "debug"})
        );
        assert!(warnings[0].starts_with("tollgate: init container \"fetch\""));
        assert!(warnings[1].starts_with("tollgate: sidecar container \"proxy\""));
    }

    #[test]
    fn ephemeral_storage_default() {
        let mut policy = Policy::builtin();
        policy
            .mutation
            .default_resources
            .limits
            .insert("ephemeral-storage".into(), Quantity("10Gi".into()));
        let mut p =
            one(json!({"name": "t", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}));
        run(&policy, &mut p);
        assert_eq!(resources(&p, 0)["limits"]["ephemeral-storage"], "10Gi");
    }

    #[test]
    fn pod_without_spec_is_untouched() {
        let mut p = pod(json!({"metadata": {"name": "x"}}));
        assert!(!ensure(&Policy::builtin(), &mut p, &mut vec![]));
    }

    #[test]
    fn apiserver_fixtures_round_trip_idempotently() {
        for text in [
            include_str!(
                "../../../../tests/fixtures/apiserver-v1.36/resnet50-master-0.mutate.json"
            ),
            include_str!("../../../../tests/fixtures/apiserver-v1.36/notebook-helper.mutate.json"),
        ] {
            let review: Value = serde_json::from_str(text).unwrap();
            let mut p = pod(review["request"]["object"].clone());
            assert!(run(&per_gpu(), &mut p).0);
            let mut again = pod(to_json(&p));
            assert!(!ensure(&per_gpu(), &mut again, &mut vec![]));
        }
    }
}

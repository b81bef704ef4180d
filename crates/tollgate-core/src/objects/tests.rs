use serde_json::{json, Value};

use super::*;
use crate::cluster::Offline;
use crate::policy::{FeasibilityMode, Mode};
use crate::profile::{self, PodLabels};

/// A TollgateProfile (or, with no namespace, the TollgatePolicy) `default`, generation 1.
pub(crate) fn stored(namespace: &str, spec: Value) -> Stored {
    Stored {
        namespace: namespace.into(),
        name: NAME.into(),
        generation: Some(1),
        spec,
    }
}

fn candidate(s: &Stored) -> Candidate<'_> {
    Candidate {
        stored: s,
        last_good: None,
    }
}

fn compose_with(cluster: Option<Value>, profiles: &[(&str, Value)]) -> Composed {
    let c = cluster.map(|v| stored("", v));
    let ps: Vec<Stored> = profiles
        .iter()
        .map(|(ns, v)| stored(ns, v.clone()))
        .collect();
    let cs: Vec<Candidate<'_>> = ps.iter().map(candidate).collect();
    compose(None, c.as_ref().map(candidate), &cs).unwrap()
}

fn for_namespace<'p>(p: &'p Policy, ns: &str) -> profile::Selected<'p> {
    profile::select(p, ns, PodLabels::Parsed(None), &Offline)
}

#[test]
fn without_objects_the_policy_is_the_file_or_built_in() {
    let c = compose_with(None, &[]);
    assert_eq!(c.policy, Policy::builtin());
    assert!(c.statuses.is_empty());
}

#[test]
fn a_tollgate_policy_is_merged_over_the_file() {
    let file = file_layer(
        "p.yaml",
        "validation:\n  requiredRequests: [cpu]\nfeasibility:\n  mode: enforce\n",
    )
    .unwrap();
    let s = stored(
        "",
        json!({"validation": {"mode": "warn"}, "feasibility": {"mode": null}}),
    );
    let c = compose(Some(&file), Some(candidate(&s)), &[]).unwrap();
    assert_eq!(c.policy.validation.mode, Mode::Warn);
    assert_eq!(
        c.policy.validation.required_requests,
        vec!["cpu".to_owned()]
    );
    assert_eq!(
        c.policy.feasibility.mode,
        Policy::builtin().feasibility.mode,
        "null puts the built-in value back"
    );
    assert!(c.statuses[0].ready, "{:?}", c.statuses);
    assert_eq!(
        c.policy.layers.cluster.as_ref().unwrap().source,
        "TollgatePolicy default"
    );
}

#[test]
fn a_profile_within_bounds_is_in_force_for_its_namespace_only() {
    let c = compose_with(
        None,
        &[(
            "team-a",
            json!({"mutation": {"defaultResources": {"perGpu": {"memory": "128Gi"},
                                                      "limits": {"ephemeral-storage": "1Gi"}}},
                   "validation": {"requiredRequests": ["cpu", "memory", "ephemeral-storage"]}}),
        )],
    );
    assert!(c.statuses[0].ready, "{:?}", c.statuses);
    let s = for_namespace(&c.policy, "team-a");
    assert_eq!(s.profile, Some("team-a/default"));
    assert_eq!(
        s.policy.mutation.default_resources.per_gpu["memory"].0,
        "128Gi"
    );
    let other = for_namespace(&c.policy, "team-b");
    assert_eq!(other.profile, None);
    assert!(std::ptr::eq(other.policy, &c.policy));
}

#[test]
fn each_bound_is_refused_naming_the_field_and_allowed_once_may_loosen_names_it() {
    let cases = [
        (
            json!({"validation": {"mode": "warn"}}),
            "validation",
            "spec.validation.mode",
        ),
        (
            json!({"validation": {"enabled": false}}),
            "validation",
            "spec.validation.enabled",
        ),
        (
            json!({"validation": {"requiredRequests": ["cpu"]}}),
            "validation",
            "spec.validation.requiredRequests",
        ),
        (
            json!({"feasibility": {"mode": "off"}}),
            "feasibility",
            "spec.feasibility.mode",
        ),
        (
            json!({"optOut": {"groups": ["*"]}}),
            "optOut",
            "spec.optOut.groups",
        ),
        (
            json!({"optOut": {"groups": []}}),
            "optOut",
            "spec.optOut.users",
        ),
        (
            json!({"mutation": {"gpuTolerations": {"enabled": false}}}),
            "mutation",
            "spec.mutation.gpuTolerations.enabled",
        ),
        (
            json!({"mutation": {"metricsSidecar": {"container": {"image": "mine:1"}}}}),
            "mutation",
            "spec.mutation.metricsSidecar.container",
        ),
        (
            json!({"gpu": {"classes": {"nvidia": {"tolerations": []}}}}),
            "gpu",
            "spec.gpu.classes.nvidia.tolerations",
        ),
        (
            json!({"gpu": {"classes": {"mine": {"resources": ["example.com/gpu"]}}}}),
            "gpu",
            "spec.gpu.classes.mine",
        ),
        (
            json!({"mutation": {"defaultResources": {"enabled": false}}}),
            "mutation",
            "spec.mutation.defaultResources.enabled",
        ),
        (
            json!({"workloads": {"enabled": false}}),
            "workloads",
            "spec.workloads.enabled",
        ),
    ];
    for (spec, section, field) in cases {
        let c = compose_with(None, &[("team-a", spec.clone())]);
        let st = &c.statuses[0];
        assert!(!st.ready, "{spec}");
        assert_eq!(st.reason, "OutOfBounds", "{spec}: {}", st.message);
        assert!(
            st.message.contains(&format!("field `{field}`")),
            "{spec}: {}",
            st.message
        );
        assert!(
            st.message.contains(&format!("mayLoosen: [{section}]")),
            "{}",
            st.message
        );
        assert_eq!(for_namespace(&c.policy, "team-a").profile, None);
        // The webhook refuses it, in the same words.
        let object = json!({"metadata": {"name": "default", "namespace": "team-a"}, "spec": spec});
        let v = review(&c.policy, PROFILE_KIND, &object);
        assert_eq!(
            v.refusal.as_deref(),
            Some(st.message.split("; the namespace").next().unwrap())
        );
        // Allowed once the TollgatePolicy lets namespaces loosen the section.
        let c = compose_with(
            Some(json!({"namespaceProfiles": {"mayLoosen": [section]}})),
            &[("team-a", spec.clone())],
        );
        assert!(
            c.statuses.iter().all(|s| s.ready),
            "{spec}: {:?}",
            c.statuses
        );
        assert_eq!(
            for_namespace(&c.policy, "team-a").profile,
            Some("team-a/default")
        );
        assert!(review(&c.policy, PROFILE_KIND, &object).refusal.is_none());
    }
}

#[test]
fn stricter_is_always_allowed() {
    let c = compose_with(
        Some(json!({"validation": {"mode": "warn"}})),
        &[(
            "team-a",
            json!({"validation": {"mode": "enforce"}, "feasibility": {"mode": "enforce"},
                   "optOut": {"namespaces": []}}),
        )],
    );
    assert!(c.statuses.iter().all(|s| s.ready), "{:?}", c.statuses);
    let s = for_namespace(&c.policy, "team-a");
    assert_eq!(s.policy.validation.mode, Mode::Enforce);
    assert_eq!(s.policy.feasibility.mode, FeasibilityMode::Enforce);
}

#[test]
fn a_profile_over_a_cluster_profile_is_held_to_that_profile() {
    let cluster = json!({"profiles": [
        {"name": "gpu-pool", "match": {"namespaces": ["team-*"]}, "validation": {"mode": "warn"}}
    ]});
    // warn over the profile's warn: within bounds; over the base's enforce it would not be.
    let c = compose_with(
        Some(cluster.clone()),
        &[("team-a", json!({"feasibility": {"mode": "enforce"}}))],
    );
    assert!(c.statuses.iter().all(|s| s.ready), "{:?}", c.statuses);
    let s = for_namespace(&c.policy, "team-a");
    assert_eq!(s.profile, Some("gpu-pool+team-a/default"));
    assert_eq!(s.policy.validation.mode, Mode::Warn);
    assert_eq!(s.policy.feasibility.mode, FeasibilityMode::Enforce);
    // A profile that cannot match the namespace is not resolved over.
    let c = compose_with(
        Some(cluster),
        &[("prod", json!({"validation": {"mode": "enforce"}}))],
    );
    let n = &c.policy.layers.namespaces["prod"];
    assert!(n.over_profiles[0].is_none());
}

#[test]
fn an_invalid_stored_object_leaves_the_last_good_spec_in_force() {
    let good = json!({"validation": {"mode": "warn"}});
    let bad = stored("", json!({"validation": {"mode": "block"}}));
    let c = compose(
        None,
        Some(Candidate {
            stored: &bad,
            last_good: Some(&good),
        }),
        &[],
    )
    .unwrap();
    let st = &c.statuses[0];
    assert!(!st.ready);
    assert_eq!(st.reason, "Invalid");
    assert_eq!(st.in_force, InForce::LastGood);
    assert!(
        st.message.contains("spec.validation.mode"),
        "{}",
        st.message
    );
    assert!(
        st.message.contains("last good spec stays in force"),
        "{}",
        st.message
    );
    assert_eq!(c.policy.validation.mode, Mode::Warn);
    // Without a last good spec: the file (here the built-in policy).
    let c = compose(None, Some(candidate(&bad)), &[]).unwrap();
    assert_eq!(c.statuses[0].in_force, InForce::Nothing);
    assert_eq!(c.policy, Policy::builtin());
}

#[test]
fn only_the_name_default_is_applied() {
    let mut s = stored("team-a", json!({"validation": {"mode": "enforce"}}));
    s.name = "strict".into();
    let c = compose(None, None, &[candidate(&s)]).unwrap();
    assert_eq!(c.statuses[0].reason, "NotDefault");
    assert!(c.policy.layers.namespaces.is_empty());
    let v = review(
        &Policy::builtin(),
        POLICY_KIND,
        &json!({"metadata": {"name": "main"}, "spec": {}}),
    );
    assert!(v
        .refusal
        .unwrap()
        .contains("the cluster has one TollgatePolicy, named \"default\""),);
}

#[test]
fn a_profile_holds_only_sections() {
    let c = compose_with(None, &[("team-a", json!({"profiles": []}))]);
    assert!(
        c.statuses[0].message.contains("field `spec.profiles`"),
        "{:?}",
        c.statuses
    );
}

#[test]
fn a_profile_whose_validation_refuses_its_own_sidecar_is_refused() {
    let c = compose_with(
        None,
        &[(
            "team-a",
            json!({"validation": {"requiredRequests": ["cpu", "memory", "ephemeral-storage"]}}),
        )],
    );
    let st = &c.statuses[0];
    assert_eq!(st.reason, "Invalid", "{}", st.message);
    assert!(
        st.message.starts_with("TollgateProfile team-a/default: field `spec.mutation.metricsSidecar.container.resources.requests`"),
        "{}",
        st.message
    );
}

#[test]
fn a_tollgate_policy_that_tightens_bounds_warns_of_the_profiles_it_drops() {
    let c = compose_with(
        Some(json!({"namespaceProfiles": {"mayLoosen": ["validation"]}})),
        &[("team-a", json!({"validation": {"mode": "warn"}}))],
    );
    assert!(c.statuses.iter().all(|s| s.ready));
    let v = review(
        &c.policy,
        POLICY_KIND,
        &json!({"metadata": {"name": "default"}, "spec": {}}),
    );
    assert!(v.refusal.is_none());
    assert_eq!(v.warnings.len(), 1, "{v:?}");
    assert!(
        v.warnings[0].contains("TollgateProfile team-a/default"),
        "{v:?}"
    );
    let v = review(
        &c.policy,
        POLICY_KIND,
        &json!({"metadata": {"name": "default"}, "spec": {"validation": {"mode": "block"}}}),
    );
    assert!(v
        .refusal
        .unwrap()
        .starts_with("TollgatePolicy default: field `spec.validation.mode`"),);
}

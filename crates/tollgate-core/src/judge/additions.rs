//! Tollgate never makes a pod it would refuse: a policy whose own additions (the metrics
//! sidecar, the default limits) its validation would refuse is refused at load.
//!
//! With `validation.requiredRequests: [cpu, memory, ephemeral-storage]` and a sidecar that
//! requests no ephemeral-storage, every training pod would be refused for a container its
//! author never wrote. Whether a policy is such a one is not read off its fields: a probe
//! training pod, whose own container requests everything required, is judged by the real
//! steps, defaulting and validation (the one judgement), for the base policy and each
//! profile; any container it is then refused for is one tollgate added.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{Stage, Subject};
use crate::cluster::Objects;
use crate::policy::{Operation, Policy, PolicyError, BUILTIN_SOURCE, BUILTIN_TEXT};
use crate::requester::Requester;

impl Policy {
    /// Loads a policy: its text merged over the built-in policy, checked, its profiles
    /// resolved, and each (base and profiles) refused if its validation would refuse what
    /// its own mutation adds. `source` names the text in errors (usually the file path).
    pub fn from_text(source: &str, text: &str) -> Result<Policy, PolicyError> {
        Policy::from_written(source, &Policy::written(source, text)?)
    }

    /// [`Policy::from_text`] of a policy already read as JSON (as written, not merged).
    pub fn from_written(source: &str, written: &serde_json::Value) -> Result<Policy, PolicyError> {
        let mut policy = Policy::parse_written(source, written)?;
        check_additions(&policy, source, "")?;
        check_pod_security(&policy, source, "")?;
        if source != BUILTIN_SOURCE {
            policy.layers.file = Some(crate::policy::Written {
                source: source.to_owned(),
                value: written.clone(),
            });
        }
        for p in &policy.profiles {
            if let Some(resolved) = p.policy() {
                let at = format!("profiles[{}].", p.name);
                check_additions(resolved, source, &at)?;
                check_pod_security(resolved, source, &at)?;
            }
        }
        Ok(policy)
    }

    /// The policy for the pods a profile fits, `layers` merged over `base` (see
    /// `Policy::resolve_sections`), refused if its validation would refuse what its
    /// mutation adds.
    pub(crate) fn resolve_checked(
        source: &str,
        base: &serde_json::Value,
        layers: &[&serde_json::Value],
    ) -> Result<Policy, PolicyError> {
        let policy = Policy::resolve_sections(source, base, layers)?;
        check_additions(&policy, source, "")?;
        check_pod_security(&policy, source, "")?;
        Ok(policy)
    }

    /// The built-in policy ([`BUILTIN_TEXT`]).
    pub fn builtin() -> Policy {
        // The text is compiled in, and a test loads it: a built-in policy that did not
        // load would fail the build's tests, never reach a user.
        Policy::from_text(BUILTIN_SOURCE, BUILTIN_TEXT)
            .unwrap_or_else(|e| unreachable!("the built-in policy loads: {e}"))
    }
}

/// The probe's own container: a name no policy gives its sidecar.
const PROBE: &str = "tollgate-probe-trainer";

/// Refuses `policy` (the base, or a profile's whole policy: `at` is `profiles[NAME].`)
/// when a training pod whose own container requests everything would be refused for a
/// container or resource tollgate added.
fn check_additions(policy: &Policy, source: &str, at: &str) -> Result<(), PolicyError> {
    let v = &policy.validation;
    if !v.enabled || v.required_requests.is_empty() {
        return Ok(());
    }
    let one: BTreeMap<String, Quantity> = v
        .required_requests
        .iter()
        .map(|r| (r.clone(), Quantity("1".into())))
        .collect();
    let mut probe = Pod::default();
    probe.metadata.name = Some("probe".into());
    probe.metadata.namespace = Some("probe".into());
    // A training pod whatever the selection: the training annotation.
    probe.metadata.annotations = Some(BTreeMap::from([(
        policy.selection.training_annotation.clone(),
        "true".into(),
    )]));
    probe.spec = Some(PodSpec {
        containers: vec![Container {
            name: PROBE.into(),
            image: Some("probe".into()),
            resources: Some(ResourceRequirements {
                requests: Some(one.clone()),
                limits: Some(one),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    let groups = vec![crate::requester::AUTHENTICATED.to_owned()];
    let subject = Subject {
        policy,
        profile: None,
        who: Requester::new("probe", "probe", &groups),
        operation: Operation::Create,
        // Its requests are judged, whatever the opt-out rules say.
        opt_out: Some(crate::optout::OptOut::NotRequested),
        template: false,
        queued: false,
        placement: None,
    };
    let j = super::pod(
        &subject,
        &Objects::complete(),
        &mut probe,
        Stage::All,
        false,
    );
    let Some(d) = &j.validation else {
        return Ok(());
    };
    let Some(m) = d.missing.iter().find(|m| m.container != PROBE) else {
        return Ok(());
    };
    let sidecar = &policy.mutation.metrics_sidecar;
    let field = if m.container == sidecar.container.name {
        format!("{at}mutation.metricsSidecar.container.resources.requests")
    } else {
        format!("{at}validation.requiredRequests")
    };
    Err(PolicyError::field(
        source,
        field,
        format!(
            "the {} {:?} that tollgate adds to training pods would have no request for {}, which validation.requiredRequests requires: every training pod would be refused for it. Give it a request (or a limit) for {} in mutation.metricsSidecar.container.resources, or a default limit in mutation.defaultResources.limits",
            m.noun,
            m.container,
            crate::words::join_words(&m.resources),
            if m.resources.len() == 1 { "it" } else { "each" },
        ),
    ))
}

/// Refuses `policy` when its metrics sidecar could never run where Pod Security is
/// restricted, even as tollgate gives it what restricted requires (`mutate::heed`): it sets
/// what restricted forbids (privileged, `runAsUser: 0`, `runAsNonRoot: false`, a
/// capability added, ...). Such a sidecar would make every training pod of a restricted
/// namespace one Pod Security refuses. A probe training pod that meets restricted itself
/// is mutated in a namespace labelled `enforce: restricted`; whatever restricted then finds
/// is tollgate's.
fn check_pod_security(policy: &Policy, source: &str, at: &str) -> Result<(), PolicyError> {
    let sidecar = &policy.mutation.metrics_sidecar;
    if !policy.mutation.enabled(crate::policy::Step::MetricsSidecar) {
        return Ok(());
    }
    let mut probe: Pod = match serde_json::from_value(serde_json::json!({
        "metadata": {"name": "probe", "namespace": "probe",
            "annotations": {(policy.selection.training_annotation.clone()): "true"}},
        "spec": {"containers": [{"name": PROBE, "image": "probe", "securityContext": {
            "allowPrivilegeEscalation": false, "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}
        }}]}
    })) {
        Ok(p) => p,
        Err(_) => return Ok(()),
    };
    let mut context = Objects::complete();
    if let Ok(ns) = serde_json::from_value(serde_json::json!({"metadata": {"name": "probe",
        "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))
    {
        context.add_namespace(ns);
    }
    let groups = vec![crate::requester::AUTHENTICATED.to_owned()];
    let subject = Subject {
        policy,
        profile: None,
        who: Requester::new("probe", "probe", &groups),
        operation: Operation::Create,
        opt_out: Some(crate::optout::OptOut::NotRequested),
        template: false,
        queued: false,
        placement: None,
    };
    super::pod(&subject, &context, &mut probe, Stage::Mutate, false);
    let Some(spec) = probe.spec.as_ref() else {
        return Ok(());
    };
    let found = crate::podsecurity::pod_security_violations(
        crate::podsecurity::RESTRICTED_LATEST,
        &probe.metadata,
        spec,
    );
    if found.is_empty() {
        return Ok(());
    }
    Err(PolicyError::field(
        source,
        format!("{at}mutation.metricsSidecar.container.securityContext"),
        format!(
            "the metrics sidecar {:?} could never run in a namespace whose Pod Security is restricted, even with what tollgate gives it there (a RuntimeDefault seccomp profile, runAsNonRoot, no privilege escalation, every capability dropped): violates PodSecurity \"restricted:latest\": {}. Set its securityContext as restricted allows, or turn the sidecar off",
            sidecar.container.name,
            crate::podsecurity::pod_security_detail(&found),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_policy_adds_nothing_it_would_refuse() {
        let p = Policy::builtin();
        assert!(check_additions(&p, "x", "").is_ok());
    }

    /// The defect this check exists for: ephemeral-storage required, and the sidecar
    /// requests none.
    #[test]
    fn a_sidecar_without_a_required_request_refuses_the_policy() {
        let e = Policy::from_text(
            "p.yaml",
            "validation:\n  requiredRequests: [cpu, memory, ephemeral-storage]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("p.yaml: field `mutation.metricsSidecar.container.resources.requests`"),
            "{e}"
        );
        assert!(e.contains("\"tollgate-metrics\""), "{e}");
        assert!(e.contains("no request for ephemeral-storage"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    /// What fixes it: a request on the sidecar, a default limit (which the apiserver turns
    /// into the request), or no sidecar at all.
    #[test]
    fn a_request_a_default_limit_or_no_sidecar_each_fix_it() {
        for fix in [
            "mutation:\n  metricsSidecar:\n    container:\n      resources:\n        requests: {ephemeral-storage: 64Mi}\n",
            "mutation:\n  defaultResources:\n    limits: {ephemeral-storage: 1Gi}\n",
            "mutation:\n  metricsSidecar:\n    enabled: false\n",
        ] {
            let text = format!("validation:\n  requiredRequests: [cpu, memory, ephemeral-storage]\n{fix}");
            assert!(Policy::from_text("p.yaml", &text).is_ok(), "{fix}");
        }
        // In warn mode too: a warning about a container nobody wrote helps nobody.
        let e = Policy::from_text(
            "p.yaml",
            "validation:\n  mode: warn\n  requiredRequests: [cpu, ephemeral-storage]\n",
        );
        assert!(e.is_err());
    }

    #[test]
    fn a_sidecar_restricted_can_never_admit_refuses_the_policy() {
        for (set, words) in [
            ("runAsUser: 0", "runAsUser=0 (container \"tollgate-metrics\" must not set runAsUser=0)"),
            ("privileged: true", "privileged (container \"tollgate-metrics\" must not set securityContext.privileged=true)"),
            ("runAsNonRoot: false", "runAsNonRoot != true"),
            ("capabilities: {add: [NET_ADMIN]}", "must not include \"NET_ADMIN\""),
        ] {
            let text = format!(
                "mutation:\n  metricsSidecar:\n    container:\n      securityContext: {{{set}}}\n"
            );
            let e = Policy::from_text("p.yaml", &text).unwrap_err().to_string();
            assert!(
                e.starts_with("p.yaml: field `mutation.metricsSidecar.container.securityContext`"),
                "{e}"
            );
            assert!(e.contains(words), "{set}: {e}");
        }
        // What tollgate gives it at restricted is not asked of the policy.
        let bare = "mutation:\n  metricsSidecar:\n    container:\n      securityContext: null\n";
        assert!(Policy::from_text("p.yaml", bare).is_ok());
        let off = "mutation:\n  metricsSidecar:\n    enabled: false\n    container:\n      securityContext: {runAsUser: 0}\n";
        assert!(Policy::from_text("p.yaml", off).is_ok());
    }

    #[test]
    fn a_profile_is_named() {
        let e = Policy::from_text(
            "p.yaml",
            "profiles:\n  - name: team-a\n    validation:\n      requiredRequests: [cpu, ephemeral-storage]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(
                "p.yaml: field `profiles[team-a].mutation.metricsSidecar.container.resources.requests`"
            ),
            "{e}"
        );
    }
}

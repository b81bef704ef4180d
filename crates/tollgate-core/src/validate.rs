//! Validation: every container must request the resources the policy lists.
//!
//! The validating webhook runs after the apiserver's defaulting, so a container that got a
//! limit (from the user or from tollgate's mutation) already has the same request; this
//! module judges the pod exactly as it was sent.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Pod;

use crate::optout::{self, OptOut};
use crate::pod::{containers, display_name};
use crate::policy::{Mode, Operation, Policy};
use crate::requester::Requester;

/// What the validation decided, with everything the response and the logs need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The denial message (only when not allowed).
    pub message: Option<String>,
    pub warnings: Vec<String>,
    pub audit_annotations: BTreeMap<String, String>,
    pub verdict: Verdict,
    /// The opt-out decision, when the pod was judged (for the logs and metrics).
    pub opt_out: Option<OptOut>,
    /// What is missing, whatever the mode: `tollgate audit` reports it as data even where
    /// the policy only warns.
    pub missing: Vec<Missing>,
}

/// The one-word outcome, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not judged: validation off, or an operation the policy does not judge.
    Skipped,
    /// Every container requests what it must.
    Passed,
    /// Requests are missing: denied (enforce) or allowed with warnings (warn, audit).
    MissingRequests,
    /// The pod opted out and the policy honoured it.
    OptedOut,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Skipped => "skipped",
            Verdict::Passed => "passed",
            Verdict::MissingRequests => "missing_requests",
            Verdict::OptedOut => "opted_out",
        }
    }
}

impl Decision {
    fn allow(verdict: Verdict) -> Self {
        Decision {
            allowed: true,
            message: None,
            warnings: vec![],
            audit_annotations: BTreeMap::new(),
            verdict,
            opt_out: None,
            missing: vec![],
        }
    }
}

/// A container and the required resources it does not request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    pub noun: &'static str,
    pub container: String,
    pub resources: Vec<String>,
}

/// Containers (init and sidecar included, ephemeral excluded) lacking required requests.
/// Pod-level requests satisfy the rule for the resources they name.
pub fn missing_requests(policy: &Policy, pod: &Pod) -> Vec<Missing> {
    let Some(spec) = pod.spec.as_ref() else {
        return vec![];
    };
    let pod_level = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    let required: Vec<&String> = policy
        .validation
        .required_requests
        .iter()
        .filter(|r| !pod_level.is_some_and(|p| p.contains_key(*r)))
        .collect();
    containers(spec)
        .filter_map(|(kind, c)| {
            let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
            let lacking: Vec<String> = required
                .iter()
                .filter(|r| !requests.is_some_and(|m| m.contains_key(**r)))
                .map(|r| (*r).clone())
                .collect();
            (!lacking.is_empty()).then(|| Missing {
                noun: kind.noun(),
                container: c.name.clone(),
                resources: lacking,
            })
        })
        .collect()
}

pub fn validate(policy: &Policy, pod: &Pod, operation: Operation, who: &Requester<'_>) -> Decision {
    let rule = &policy.validation;
    if !rule.enabled || !rule.operations.contains(&operation) {
        return Decision::allow(Verdict::Skipped);
    }
    let name = display_name(pod);
    let opt_out = optout::decide(policy, pod, who);
    if opt_out == OptOut::Honoured {
        let mut d = Decision::allow(Verdict::OptedOut);
        d.warnings.push(format!(
            "tollgate: pod {name:?} opted out ({}); its resource requests were not checked",
            policy.opt_out.annotation
        ));
        d.audit_annotations
            .insert("opt-out".into(), optout::audit_note(who));
        d.opt_out = Some(opt_out);
        return d;
    }
    let missing = missing_requests(policy, pod);
    if missing.is_empty() {
        let mut d = Decision::allow(Verdict::Passed);
        d.opt_out = Some(opt_out);
        return d;
    }
    let summary = missing
        .iter()
        .map(|m| format!("{} {}: {}", m.noun, m.container, m.resources.join(",")))
        .collect::<Vec<_>>()
        .join("; ");
    let mut d = match rule.mode {
        Mode::Enforce => Decision {
            allowed: false,
            message: Some(denial_message(policy, &name, &missing, &opt_out, who)),
            warnings: vec![],
            audit_annotations: BTreeMap::new(),
            verdict: Verdict::MissingRequests,
            opt_out: None,
            missing: vec![],
        },
        Mode::Warn => {
            let mut d = Decision::allow(Verdict::MissingRequests);
            d.warnings = missing
                .iter()
                .map(|m| {
                    format!(
                        "tollgate: {} {:?} has no {} request; such pods will be refused once enforcement starts",
                        m.noun,
                        m.container,
                        m.resources.join(" or ")
                    )
                })
                .collect();
            d.warnings.push(format!(
                "tollgate: add resources.requests ({}) to each container listed",
                rule.required_requests.join(", ")
            ));
            d.audit_annotations
                .insert("missing-requests".into(), summary);
            d
        }
        Mode::Audit => {
            let mut d = Decision::allow(Verdict::MissingRequests);
            d.audit_annotations
                .insert("missing-requests".into(), summary);
            d
        }
    };
    d.opt_out = Some(opt_out);
    d.missing = missing;
    d
}

/// The text kubectl prints after "denied the request: ", for a data scientist to act on.
fn denial_message(
    policy: &Policy,
    name: &str,
    missing: &[Missing],
    opt_out: &OptOut,
    who: &Requester<'_>,
) -> String {
    let required = &policy.validation.required_requests;
    let mut m = format!(
        "pod {name:?} must request {} for every container, and some do not:\n",
        join_words(required)
    );
    for x in missing {
        let _ = writeln!(
            m,
            "  - {} {:?} has no request for {}",
            x.noun,
            x.container,
            join_words(&x.resources)
        );
    }
    m.push_str(
        "Fix: add requests sized for your workload to each container listed, for example:\n",
    );
    m.push_str("    resources:\n      requests:\n");
    // Only what is missing somewhere, in the policy's order: the lines a user has to add.
    for r in required
        .iter()
        .filter(|r| missing.iter().any(|x| x.resources.contains(r)))
    {
        let _ = writeln!(m, "        {r}: {}", example_amount(r));
    }
    let annotation = &policy.opt_out.annotation;
    match opt_out {
        OptOut::Refused(why) => {
            let _ = write!(
                m,
                "This pod asks to opt out, but {why}; ask your platform team."
            );
        }
        // Offered only where it would be honoured: pointing at a door that is locked for
        // this user helps nobody.
        _ if optout::permitted(policy, who).is_ok() => {
            let _ = write!(
                m,
                "Or, to skip this check for this pod, add the annotation {annotation}: \"true\"."
            );
        }
        _ => {}
    }
    while m.ends_with('\n') {
        m.pop();
    }
    m
}

fn example_amount(resource: &str) -> &'static str {
    match resource {
        "cpu" => "\"1\"",
        "memory" => "2Gi",
        "ephemeral-storage" => "1Gi",
        _ => "\"1\"",
    }
}

fn join_words(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

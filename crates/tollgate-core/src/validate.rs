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
    /// What is missing, when requests are (a workload words its own message from it).
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
    /// A workload's template carries an opt-out approval tollgate did not give: refused
    /// whatever the mode.
    ForgedApproval,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Skipped => "skipped",
            Verdict::Passed => "passed",
            Verdict::MissingRequests => "missing_requests",
            Verdict::OptedOut => "opted_out",
            Verdict::ForgedApproval => "forged_approval",
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
    if !judges(policy, operation) {
        return Decision::allow(Verdict::Skipped);
    }
    let opt_out = optout::decide(policy, pod, who);
    judge(policy, pod, who, opt_out)
}

/// Whether validation judges this operation at all.
pub fn judges(policy: &Policy, operation: Operation) -> bool {
    let rule = &policy.validation;
    rule.enabled && rule.operations.contains(&operation)
}

/// Validation of a pod with its opt-out already decided: by [`validate`], or by a
/// workload for the pods its template will make (whose requester is not the workload's).
pub fn judge(policy: &Policy, pod: &Pod, who: &Requester<'_>, opt_out: OptOut) -> Decision {
    let rule = &policy.validation;
    let name = display_name(pod);
    if opt_out == OptOut::Honoured {
        let mut d = Decision::allow(Verdict::OptedOut);
        d.warnings.push(format!(
            "tollgate: pod {name:?} opted out ({}); its resource requests were not checked",
            policy.opt_out.annotation
        ));
        d.audit_annotations.insert(
            "opt-out".into(),
            optout::audit_note_for(policy, pod.metadata.annotations.as_ref(), who),
        );
        d.opt_out = Some(opt_out);
        return d;
    }
    let missing = missing_requests(policy, pod);
    if missing.is_empty() {
        let mut d = Decision::allow(Verdict::Passed);
        d.opt_out = Some(opt_out);
        return d;
    }
    let summary = summary(&missing);
    let mut d = match rule.mode {
        Mode::Enforce => Decision {
            allowed: false,
            message: Some(denial_message(
                policy,
                &format!("pod {name:?}"),
                false,
                &[Part {
                    template: None,
                    missing: &missing,
                    opt_out: &opt_out,
                }],
                who,
            )),
            warnings: vec![],
            audit_annotations: BTreeMap::new(),
            verdict: Verdict::MissingRequests,
            opt_out: None,
            missing: vec![],
        },
        Mode::Warn => {
            let mut d = Decision::allow(Verdict::MissingRequests);
            d.warnings = warn_findings(policy, &missing);
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

/// The audit annotation's value for missing requests: `container a: cpu,memory; ...`.
pub fn summary(missing: &[Missing]) -> String {
    missing
        .iter()
        .map(|m| format!("{} {}: {}", m.noun, m.container, m.resources.join(",")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The findings as `warn` mode reports them.
fn warn_findings(policy: &Policy, missing: &[Missing]) -> Vec<String> {
    let mut out: Vec<String> = missing
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
    out.push(format!(
        "tollgate: add resources.requests ({}) to each container listed",
        policy.validation.required_requests.join(", ")
    ));
    out
}

/// One part of a denial: the containers of a pod, or of one pod template of a workload.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    /// How the message names the template (`replica Worker`); None for a pod, or for a
    /// workload's only template.
    pub template: Option<&'a str>,
    pub missing: &'a [Missing],
    pub opt_out: &'a OptOut,
}

/// The text kubectl prints after "denied the request: ", for a data scientist to act on.
/// `subject` is what was refused: `pod "notebook"`, or a `workload` (`job "train"`),
/// whose parts are its templates.
pub fn denial_message(
    policy: &Policy,
    subject: &str,
    workload: bool,
    parts: &[Part<'_>],
    who: &Requester<'_>,
) -> String {
    let required = &policy.validation.required_requests;
    let mut m = format!(
        "{subject} must request {} for every container{}, and some do not:\n",
        join_words(required),
        if workload { " of its pods" } else { "" }
    );
    for part in parts {
        let lead = part.template.map(|t| format!("{t}: ")).unwrap_or_default();
        for x in part.missing {
            let _ = writeln!(
                m,
                "  - {lead}{} {:?} has no request for {}",
                x.noun,
                x.container,
                join_words(&x.resources)
            );
        }
    }
    m.push_str(
        "Fix: add requests sized for your workload to each container listed, for example:\n",
    );
    m.push_str("    resources:\n      requests:\n");
    // Only what is missing somewhere, in the policy's order: the lines a user has to add.
    for r in required.iter().filter(|r| {
        parts
            .iter()
            .any(|p| p.missing.iter().any(|x| x.resources.contains(r)))
    }) {
        let _ = writeln!(m, "        {r}: {}", example_amount(r));
    }
    let annotation = &policy.opt_out.annotation;
    let mut offered = false;
    for part in parts {
        match part.opt_out {
            OptOut::Refused(why) if workload => {
                let which = match part.template {
                    Some(t) => format!("The pod template of {t}"),
                    None => "The pod template".to_owned(),
                };
                let _ = writeln!(
                    m,
                    "{which} asks to opt out, but {why}; ask your platform team."
                );
            }
            OptOut::Refused(why) => {
                let _ = write!(
                    m,
                    "This pod asks to opt out, but {why}; ask your platform team."
                );
            }
            // Offered only where it would be honoured: pointing at a door that is locked
            // for this user helps nobody.
            _ if !offered && optout::permitted(policy, who).is_ok() => {
                offered = true;
                if workload {
                    let _ = writeln!(
                        m,
                        "Or, to skip this check for these pods, add the annotation {annotation}: \"true\" to the pod template's metadata.annotations."
                    );
                } else {
                    let _ = write!(
                        m,
                        "Or, to skip this check for this pod, add the annotation {annotation}: \"true\"."
                    );
                }
            }
            _ => {}
        }
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

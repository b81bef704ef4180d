//! Validation: every container must request the resources the policy lists.
//!
//! The validating webhook runs after the apiserver's defaulting, so a container that got a
//! limit (from the user or from tollgate's mutation) already has the same request; this
//! module judges the pod exactly as it was sent.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::optout::{self, OptOut};
use crate::pod::{containers, display_name};
use crate::policy::{Mode, Operation, Policy};
use crate::requester::Requester;
use crate::words::{join_words, quote, Template};

// The words of every message validation writes. `export` fills the same templates with
// CEL, so that a ValidatingAdmissionPolicy says exactly what the webhook says.

/// The denial's first line.
pub(crate) const HEADLINE: Template =
    Template("pod {pod} must request {required} for every container, and some do not:");
/// One line per container that lacks requests.
pub(crate) const CONTAINER_LINE: Template =
    Template("  - {noun} {container} has no request for {resources}");
/// The fix-it lines after the containers, before the example amounts.
pub(crate) const FIX_LINES: [&str; 3] = [
    "Fix: add requests sized for your workload to each container listed, for example:",
    "    resources:",
    "      requests:",
];
/// One example amount, for each required resource that is missing somewhere.
pub(crate) const EXAMPLE_LINE: Template = Template("        {resource}: {amount}");
/// The last line when the pod asked to opt out and may not.
pub(crate) const REFUSED_LINE: Template =
    Template("This pod asks to opt out, but {why}; ask your platform team.");
/// The last line when the pod did not ask and could.
pub(crate) const OFFER_LINE: Template =
    Template("Or, to skip this check for this pod, add the annotation {annotation}: \"true\".");
/// Warn mode: one warning per container, then [`WARN_FIX`].
pub(crate) const WARN_CONTAINER: Template = Template(
    "tollgate: {noun} {container} has no {resources} request; such pods will be refused once enforcement starts",
);
/// Between the resources of one container in a warning.
pub(crate) const WARN_OR: &str = " or ";
pub(crate) const WARN_FIX: Template =
    Template("tollgate: add resources.requests ({required}) to each container listed");
/// Between the required resources in [`WARN_FIX`].
pub(crate) const WARN_FIX_SEPARATOR: &str = ", ";
/// The audit annotation of an honoured opt-out, and of missing requests in warn and audit mode.
pub(crate) const OPT_OUT_AUDIT_KEY: &str = "opt-out";
pub(crate) const MISSING_AUDIT_KEY: &str = "missing-requests";
/// One container in the missing-requests audit annotation.
pub(crate) const SUMMARY_ENTRY: Template = Template("{noun} {container}: {resources}");
/// Between the resources of one container, and between containers, in that annotation.
pub(crate) const SUMMARY_RESOURCE_SEPARATOR: &str = ",";
pub(crate) const SUMMARY_SEPARATOR: &str = "; ";
/// The warning of an honoured opt-out.
pub(crate) const OPTED_OUT_WARNING: Template = Template(
    "tollgate: pod {pod} opted out ({annotation}); its resource requests were not checked",
);
/// After a denial, for each claim of the pod tollgate could not read: why the pod did not
/// get what a GPU pod gets (its requests may be missing for that reason alone).
pub(crate) const UNREAD_CLAIM_LINE: Template = Template(
    "tollgate could not read the {claim}, so it did not treat this pod as a GPU pod: it got no GPU toleration, driver or default limits. Apply the claim's ResourceClaim or ResourceClaimTemplate (resource.k8s.io v1, v1beta2 or v1beta1) in the pod's namespace first.",
);
/// Feasibility's words: the first line of a refusal, one line per finding, and the warning
/// of what was not known (a finding's own is `feasible::Obstacle::warning`).
pub(crate) const INFEASIBLE_HEADLINE: Template =
    Template("{subject} can never run in this cluster:");
pub(crate) const INFEASIBLE_LINE: Template = Template("  - {finding}");
pub(crate) const UNKNOWN_WARNING: Template = Template(
    "tollgate: whether {subject} can run was not checked against {what}: tollgate does not know them yet",
);
/// A workload's denial: the first line, a container line led by its template, the
/// opt-out lines (for the pod template rather than for this pod).
pub(crate) const WORKLOAD_HEADLINE: Template = Template(
    "{workload} must request {required} for every container of its pods, and some do not:",
);
pub(crate) const TEMPLATE_CONTAINER_LINE: Template =
    Template("  - {template}: {noun} {container} has no request for {resources}");
pub(crate) const TEMPLATE_REFUSED_LINE: Template =
    Template("The pod template{of} asks to opt out, but {why}; ask your platform team.");
pub(crate) const TEMPLATE_OFFER_LINE: Template = Template(
    "Or, to skip this check for these pods, add the annotation {annotation}: \"true\" to the pod template's metadata.annotations.",
);

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
    /// the policy only warns, and a workload words its own message from it.
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
    /// It can never run here (a quota, the nodes, a DeviceClass): refused under
    /// `feasibility.mode: enforce`.
    Infeasible,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Skipped => "skipped",
            Verdict::Passed => "passed",
            Verdict::MissingRequests => "missing_requests",
            Verdict::OptedOut => "opted_out",
            Verdict::ForgedApproval => "forged_approval",
            Verdict::Infeasible => "infeasible",
        }
    }
}

impl Decision {
    /// Not judged: validation off, or an operation the policy does not judge.
    pub fn skipped() -> Self {
        Decision::allow(Verdict::Skipped)
    }

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
pub(crate) fn judges(policy: &Policy, operation: Operation) -> bool {
    let rule = &policy.validation;
    rule.enabled && rule.operations.contains(&operation)
}

/// Validation of a pod with its opt-out already decided: by [`validate`], or by a
/// workload for the pods its template will make (whose requester is not the workload's).
pub(crate) fn judge(policy: &Policy, pod: &Pod, who: &Requester<'_>, opt_out: OptOut) -> Decision {
    let rule = &policy.validation;
    let name = display_name(pod);
    if opt_out == OptOut::Honoured {
        let mut d = Decision::allow(Verdict::OptedOut);
        d.warnings.push(OPTED_OUT_WARNING.fill(&[
            ("pod", &quote(&name)),
            ("annotation", &policy.opt_out.annotation),
        ]));
        d.audit_annotations.insert(
            OPT_OUT_AUDIT_KEY.into(),
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
    let mut d = match rule.mode {
        Mode::Enforce => Decision {
            allowed: false,
            message: Some(denial_message(
                policy,
                &quote(&name),
                None,
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
            d.warnings = missing
                .iter()
                .map(|m| {
                    WARN_CONTAINER.fill(&[
                        ("noun", m.noun),
                        ("container", &quote(&m.container)),
                        ("resources", &m.resources.join(WARN_OR)),
                    ])
                })
                .collect();
            d.warnings.push(
                WARN_FIX.fill(&[("required", &rule.required_requests.join(WARN_FIX_SEPARATOR))]),
            );
            d.audit_annotations
                .insert(MISSING_AUDIT_KEY.into(), summary(&missing));
            d
        }
        Mode::Audit => {
            let mut d = Decision::allow(Verdict::MissingRequests);
            d.audit_annotations
                .insert(MISSING_AUDIT_KEY.into(), summary(&missing));
            d
        }
    };
    d.opt_out = Some(opt_out);
    d.missing = missing;
    d
}

/// The missing-requests audit annotation's value: `container a: cpu,memory; ...`.
pub(crate) fn summary(missing: &[Missing]) -> String {
    missing
        .iter()
        .map(|m| {
            SUMMARY_ENTRY.fill(&[
                ("noun", m.noun),
                ("container", &m.container),
                ("resources", &m.resources.join(SUMMARY_RESOURCE_SEPARATOR)),
            ])
        })
        .collect::<Vec<_>>()
        .join(SUMMARY_SEPARATOR)
}

/// One part of a denial: the containers of a pod, or of one pod template of a workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Part<'a> {
    /// How the message names the template (`replica Worker`); None for a pod, or for a
    /// workload's only template.
    pub template: Option<&'a str>,
    pub missing: &'a [Missing],
    pub opt_out: &'a OptOut,
}

/// The text kubectl prints after "denied the request: ", for a data scientist to act on.
/// For a pod, `name` is its quoted name and `workload` None; for a workload (`job
/// "train"`) the parts are its templates.
pub(crate) fn denial_message(
    policy: &Policy,
    name: &str,
    workload: Option<&str>,
    parts: &[Part<'_>],
    who: &Requester<'_>,
) -> String {
    let required = &policy.validation.required_requests;
    // One string, each line appended in place (no line of its own, no join).
    let mut m = String::with_capacity(512);
    let all = join_words(required);
    match workload {
        None => HEADLINE.fill_into(&mut m, &[("pod", name), ("required", &all)]),
        Some(w) => WORKLOAD_HEADLINE.fill_into(&mut m, &[("workload", w), ("required", &all)]),
    }
    for part in parts {
        for x in part.missing {
            let resources = join_words(&x.resources);
            let container = quote(&x.container);
            m.push('\n');
            match part.template {
                Some(t) => TEMPLATE_CONTAINER_LINE.fill_into(
                    &mut m,
                    &[
                        ("noun", x.noun),
                        ("container", &container),
                        ("resources", &resources),
                        ("template", t),
                    ],
                ),
                None => CONTAINER_LINE.fill_into(
                    &mut m,
                    &[
                        ("noun", x.noun),
                        ("container", &container),
                        ("resources", &resources),
                    ],
                ),
            }
        }
    }
    for l in FIX_LINES {
        m.push('\n');
        m.push_str(l);
    }
    // Only what is missing somewhere, in the policy's order: the lines a user has to add.
    for r in required.iter().filter(|r| {
        parts
            .iter()
            .any(|p| p.missing.iter().any(|x| x.resources.contains(r)))
    }) {
        m.push('\n');
        EXAMPLE_LINE.fill_into(&mut m, &[("resource", r), ("amount", example_amount(r))]);
    }
    let annotation = &policy.opt_out.annotation;
    let mut offered = false;
    for part in parts {
        match part.opt_out {
            OptOut::Refused(why) if workload.is_some() => {
                let of = part
                    .template
                    .map(|t| format!(" of {t}"))
                    .unwrap_or_default();
                m.push('\n');
                TEMPLATE_REFUSED_LINE.fill_into(&mut m, &[("of", &of), ("why", why)]);
            }
            OptOut::Refused(why) => {
                m.push('\n');
                REFUSED_LINE.fill_into(&mut m, &[("why", why)]);
            }
            // Offered only where it would be honoured: pointing at a door that is locked
            // for this user helps nobody.
            _ if !offered && optout::permitted(policy, who).is_ok() => {
                offered = true;
                let offer = match workload {
                    None => OFFER_LINE,
                    Some(_) => TEMPLATE_OFFER_LINE,
                };
                m.push('\n');
                offer.fill_into(&mut m, &[("annotation", annotation)]);
            }
            _ => {}
        }
    }
    m
}

/// The amount the fix-it lines suggest for a resource.
pub(crate) fn example_amount(resource: &str) -> &'static str {
    match resource {
        "cpu" => "\"1\"",
        "memory" => "2Gi",
        "ephemeral-storage" => "1Gi",
        _ => "\"1\"",
    }
}

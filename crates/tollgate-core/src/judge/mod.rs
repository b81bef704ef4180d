//! One judgement: a pod decided the way a cluster with both webhooks decides it.
//!
//! The mutating webhook (the opt-out, the pod's GPUs, the steps for a training pod, the
//! patch), the apiserver's defaulting between the two webhooks, and the validating
//! webhook (the opt-out again, the required requests), in that order, on one typed pod,
//! with the opt-out decided once for both. Every route that judges a pod comes here: the
//! `/mutate` and `/validate` endpoints ask for one webhook each, a workload's templates,
//! `tollgate review --stage all` and the audit for both. What each route shows (an
//! AdmissionReview, a workload's message, an audit finding) is drawn from the one
//! [`Judgement`]: what each mutation step added, the decision and its reasons, the opt-out
//! as decided, the profile.
//!
//! Pure and synchronous, like the rest of the engine: what the cluster holds comes in
//! through [`Cluster`], already in memory.

pub(crate) mod additions;

use k8s_openapi::api::core::v1::Pod;

use crate::cluster::{Cluster, ObjectKey};
use crate::feasible::{self, Outlook};
use crate::gpu::Gpus;
use crate::mutate::{self, Report};
use crate::optout::{self, OptOut};
use crate::parse::Placement;
use crate::policy::{FeasibilityMode, Mode, Operation, Policy};
use crate::requester::Requester;
use crate::stage::Stage;
use crate::validate::{self, Decision, Verdict};
use crate::words::quote;
use crate::{diff, pod};

/// What is judged besides the pod: the policy in force for it, who asks, and how.
#[derive(Debug, Clone)]
pub(crate) struct Subject<'a, 'p> {
    /// The policy for this pod: its profile's, or the base.
    pub policy: &'p Policy,
    /// The profile that chose `policy` (None: the base).
    pub profile: Option<&'p str>,
    pub who: Requester<'a>,
    pub operation: Operation,
    /// The opt-out, when whoever asks decided it (a workload, for the pods its template
    /// makes, whose requester is not the pod's); None: decided here, for `who`.
    pub opt_out: Option<OptOut>,
    /// A workload's template: whether its pods can run is found here, and worded by the
    /// workload for all its pods (how many, whether together); a pod's is decided here.
    pub template: bool,
    /// A template of a workload held to a Kueue queue the context knows: what its pods ask
    /// for is measured for the queue's ClusterQueue, whatever else the context knows.
    pub queued: bool,
    /// Where the pod may run, still text (a validating review's fast parse): read into the
    /// pod only when feasibility is judged against known nodes or quotas, so that a pod
    /// whose opt-out is honoured, or a policy with feasibility off, never pays for it.
    pub placement: Option<Placement<'a>>,
}

/// What the mutating webhook made of the pod.
#[derive(Debug, Clone, Default)]
pub(crate) struct MutationPass {
    /// The steps that changed the pod and what each added (nothing for a pod that is not
    /// a training pod, or whose opt-out was honoured).
    pub report: Report,
    /// The JSON patch, as text, when one was asked for and the pod changed.
    pub patch: Option<Vec<u8>>,
    /// For the user, in order: the pod's GPUs (a claim not found, ...), then the steps.
    pub warnings: Vec<String>,
    /// An honoured opt-out: the audit annotation's value (the pod was left alone).
    pub opted_out: Option<String>,
}

/// Everything one pod's judgement found.
#[derive(Debug, Clone)]
pub(crate) struct Judgement {
    /// The profile applied (None: the base policy).
    pub profile: Option<String>,
    /// The opt-out as decided (None: neither webhook asked).
    pub opt_out: Option<OptOut>,
    /// None when the mutating webhook did not run (not asked, or an operation the policy
    /// does not mutate).
    pub mutation: Option<MutationPass>,
    /// None when the validating webhook did not run.
    pub validation: Option<Decision>,
    /// Objects the cluster context did not know (a claim created a moment ago): the shell
    /// may fetch them and judge again.
    pub unresolved: Vec<ObjectKey>,
    /// The pod's claims that could not be read (`gpu::Gpus::unread`): a refused pod's
    /// message says so, since the pod was not treated as a GPU pod.
    pub unread_claims: Vec<String>,
    /// Whether the pod can ever run here, as the context knows it (None: not judged:
    /// `feasibility.mode: off`, an honoured opt-out, or no validation).
    pub feasibility: Option<Outlook>,
}

/// Judges `pod` through `stages`: mutated in place (and, with both stages, defaulted as the
/// apiserver would before validation). `patch`: whether to compute the JSON patch (the
/// mutating webhook's answer; the other routes read what each step added).
pub(crate) fn pod(
    s: &Subject<'_, '_>,
    cluster: &dyn Cluster,
    pod: &mut Pod,
    stages: Stage,
    patch: bool,
) -> Judgement {
    let policy = s.policy;
    let mut j = Judgement {
        profile: s.profile.map(str::to_owned),
        opt_out: None,
        mutation: None,
        validation: None,
        unresolved: vec![],
        unread_claims: vec![],
        feasibility: None,
    };
    let decide = |pod: &Pod| {
        s.opt_out
            .clone()
            .unwrap_or_else(|| optout::decide(policy, pod, &s.who))
    };
    if stages.mutates() && policy.mutation.operations.contains(&s.operation) {
        let opt_out = decide(pod);
        let m = mutation(s, cluster, pod, &opt_out, patch, &mut j);
        j.mutation = Some(m);
        j.opt_out = Some(opt_out);
    }
    if stages.validates() {
        if stages == Stage::All {
            // The apiserver's defaulting between the two webhooks: a limit without a
            // request becomes the request.
            pod::default_requests(pod);
        }
        j.validation = Some(if validate::judges(policy, s.operation) {
            let opt_out = j.opt_out.take().unwrap_or_else(|| decide(pod));
            let mut d = validate::judge(policy, pod, &s.who, opt_out.clone());
            if policy.feasibility.mode != FeasibilityMode::Off && opt_out != OptOut::Honoured {
                let known =
                    feasible::Known::of(cluster, s.who.namespace, s.template, &mut j.unresolved);
                if let (Some(placement), Some(spec)) = (s.placement, pod.spec.as_mut()) {
                    if known.reads_placement() {
                        placement.fill(spec);
                    }
                }
                // Missing requests the decision says (to kubectl, or in a workload's
                // message) are not repeated by a quota's "must specify"; in audit mode
                // nothing says them to the user, so the quota's finding stays.
                let said: &[validate::Missing] = if policy.validation.mode == Mode::Audit {
                    &[]
                } else {
                    &d.missing
                };
                let told = |container: &str, resource: &str| {
                    said.iter().any(|m| {
                        m.container == container && m.resources.iter().any(|r| r == resource)
                    })
                };
                let f = feasible::pod(
                    policy,
                    pod,
                    s.who.namespace,
                    cluster,
                    known,
                    s.queued,
                    &told,
                );
                if !s.template {
                    decide_feasibility(policy, pod, &f, &mut d);
                }
                j.feasibility = Some(f);
            }
            j.opt_out = Some(opt_out);
            if !d.allowed {
                explain_unread_claims(s, cluster, pod, &mut j, &mut d);
            }
            d
        } else {
            Decision::skipped()
        });
    }
    j
}

/// What feasibility found of a pod, in its decision: under `enforce` a pod that can never
/// run is refused (its lines after any other reason), under `warn` it is told; a quota in
/// use now, and what tollgate did not know, are warnings either way.
fn decide_feasibility(policy: &Policy, pod: &Pod, f: &Outlook, d: &mut Decision) {
    // Nearly every pod: nothing to say, and no name to format for it.
    if f.findings.is_empty() && f.unknown.is_empty() {
        return;
    }
    let subject = format!("pod {}", quote(&crate::pod::display_name(pod)));
    let enforce = policy.feasibility.mode == FeasibilityMode::Enforce;
    let mut lines = String::new();
    for finding in &f.findings {
        if finding.never && enforce {
            lines.push('\n');
            validate::INFEASIBLE_LINE.fill_into(&mut lines, &[("finding", &finding.message)]);
        } else {
            d.warnings.push(finding.warning(&subject));
        }
    }
    if !f.unknown.is_empty() {
        d.warnings.push(validate::UNKNOWN_WARNING.fill(&[
            ("subject", &subject),
            ("what", &crate::words::join_words(&f.unknown)),
        ]));
    }
    if lines.is_empty() {
        return;
    }
    let mut message = d.message.take().map(|m| m + "\n\n").unwrap_or_default();
    validate::INFEASIBLE_HEADLINE.fill_into(&mut message, &[("subject", &subject)]);
    message.push_str(&lines);
    d.message = Some(message);
    if d.allowed {
        d.allowed = false;
        d.verdict = Verdict::Infeasible;
    }
}

/// A refused pod whose claims could not be read was not treated as a GPU pod: its message
/// says so, since that alone may be why it lacks requests. Only a refusal pays for the
/// look (the validating webhook alone has not read the claims yet).
fn explain_unread_claims(
    s: &Subject<'_, '_>,
    cluster: &dyn Cluster,
    pod: &Pod,
    j: &mut Judgement,
    d: &mut Decision,
) {
    let has_claims = pod
        .spec
        .as_ref()
        .is_some_and(|p| p.resource_claims.as_ref().is_some_and(|c| !c.is_empty()));
    if !has_claims {
        return;
    }
    if j.mutation.is_none() {
        let gpus = Gpus::of(s.policy, pod, s.who.namespace, cluster);
        j.unresolved.extend(gpus.unresolved.iter().cloned());
        j.unread_claims.extend(gpus.unread.iter().cloned());
    }
    if let Some(message) = d.message.as_mut() {
        for claim in &j.unread_claims {
            message.push('\n');
            validate::UNREAD_CLAIM_LINE.fill_into(message, &[("claim", claim)]);
        }
    }
}

/// The mutating webhook on a pod whose opt-out is decided.
fn mutation(
    s: &Subject<'_, '_>,
    cluster: &dyn Cluster,
    pod: &mut Pod,
    opt_out: &OptOut,
    patch: bool,
    j: &mut Judgement,
) -> MutationPass {
    let policy = s.policy;
    let mut m = MutationPass::default();
    if *opt_out == OptOut::Honoured {
        m.opted_out = Some(optout::audit_note_for(
            policy,
            pod.metadata.annotations.as_ref(),
            &s.who,
        ));
        return m;
    }
    let gpus = Gpus::of(policy, pod, s.who.namespace, cluster);
    m.warnings.extend(gpus.warnings.iter().cloned());
    j.unresolved.extend(gpus.unresolved.iter().cloned());
    j.unread_claims.extend(gpus.unread.iter().cloned());
    if !mutate::is_training_pod(policy, pod, &gpus) {
        return m;
    }
    let before = patch.then(|| diff::Snapshot::of(pod));
    // What the namespace's Pod Security forbids is not added (mutate::heed).
    let security = feasible::pod_security(cluster, s.who.namespace, &mut j.unresolved);
    let heed = mutate::Heed::of(s.who.namespace, security);
    m.report = mutate::mutate_heeding(policy, pod, &gpus, s.profile, cluster, &heed);
    m.warnings.append(&mut m.report.warnings);
    let Some(before) = before else {
        return m;
    };
    match before.and_then(|b| diff::patch_text(&b, &diff::Snapshot::of(pod)?)) {
        Ok(p) => m.patch = p,
        // Writing a typed pod as JSON does not fail; if it ever did, the pod goes in as it
        // came rather than being refused over tollgate's own trouble.
        Err(e) => {
            m.warnings.push(format!(
                "tollgate: could not compute its changes ({e}); the pod was allowed unchanged"
            ));
            m.report = Report::default();
        }
    }
    m
}

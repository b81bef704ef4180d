//! A pod's review: one judgement (`judge::pod`), and each webhook's answer drawn from it.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use kube_core::admission::AdmissionRequest;
use serde_json::value::RawValue;

use super::{
    policy_operation, refuse, requester, same, skeleton, warn, About, Outcome, PodReview, Reviewed,
    Staged,
};
use crate::cluster::Cluster;
use crate::diff;
use crate::judge::{self, Judgement, Subject};
use crate::optout::OptOut;
use crate::parse;
use crate::policy::Policy;
use crate::profile::{self, PodLabels};
use crate::stage::Stage;

/// What the parse left of a pod as text.
#[derive(Default)]
pub(super) struct Unread<'a> {
    /// Its labels (else they are the object's own).
    pub(super) labels: Option<&'a RawValue>,
    /// Where it may run (else that is in the object's spec).
    pub(super) placement: Option<parse::Placement<'a>>,
}

/// A pod's review.
pub(super) fn review_pod(
    stages: Stage,
    policy: &Policy,
    cluster: &dyn Cluster,
    mut req: AdmissionRequest<Pod>,
    unread: Unread<'_>,
    body: &[u8],
) -> Staged {
    let mut reviewed = skeleton(stages.first(), &req, req.object.as_ref());
    let Some(mut pod) = req.object.take() else {
        return same(stages, reviewed);
    };
    // Subresources (status, binding, ephemeralcontainers from `kubectl debug`) are not the
    // pod its author wrote: never in tollgate's way.
    if req.sub_resource.as_deref().is_some_and(|s| !s.is_empty()) {
        return same(stages, reviewed);
    }
    let Some(operation) = policy_operation(&req.operation) else {
        return same(stages, reviewed);
    };
    // Along every path a mutation patches, the typed model tells an absent or null field
    // from an empty one, except for the two it requires: `metadata` and `spec.containers`.
    // Only when one of them reads as empty can the patch name a parent the sent object
    // lacks, so only then is the body read a second time.
    let ambiguous = pod.metadata == Default::default()
        || pod.spec.as_ref().is_some_and(|s| s.containers.is_empty());
    let who = requester(&req);
    let labels = match unread.labels {
        Some(raw) => PodLabels::Raw(Some(raw)),
        None => PodLabels::Parsed(pod.metadata.labels.as_ref()),
    };
    let selected = profile::select(policy, who.namespace, labels, cluster);
    reviewed.profile = selected.profile.map(str::to_owned);
    reviewed.unresolved.extend(selected.unresolved);
    let subject = Subject {
        policy: selected.policy,
        profile: selected.profile,
        who,
        operation,
        opt_out: None,
        template: false,
        queued: false,
        placement: unread.placement,
    };
    let mut j = judge::pod(
        &subject,
        cluster,
        &mut pod,
        stages,
        stages != Stage::Validate,
    );
    reviewed.unresolved.extend(j.unresolved.iter().cloned());
    let warning = selected.warning;
    match stages {
        Stage::Mutate => {
            mutation_answer(&mut reviewed, &j, warning, ambiguous, body);
            Staged {
                mutate: Some(reviewed),
                validate: None,
            }
        }
        Stage::Validate => {
            validation_answer(&mut reviewed, &mut j, warning);
            Staged {
                mutate: None,
                validate: Some(reviewed),
            }
        }
        Stage::All => {
            let mut validated = reviewed.as_endpoint(Stage::Validate);
            mutation_answer(&mut reviewed, &j, warning.clone(), ambiguous, body);
            validation_answer(&mut validated, &mut j, warning);
            Staged {
                mutate: Some(reviewed),
                validate: Some(validated),
            }
        }
    }
}

/// The mutating webhook's answer for a pod, from its judgement.
fn mutation_answer(
    out: &mut Reviewed,
    j: &Judgement,
    profile_warning: Option<String>,
    ambiguous: bool,
    body: &[u8],
) {
    let mut warnings: Vec<String> = profile_warning.into_iter().collect();
    let mut review = PodReview::default();
    if let Some(m) = &j.mutation {
        review.opt_out.clone_from(&j.opt_out);
        if let Some(note) = &m.opted_out {
            out.response.audit_annotations = HashMap::from([("opt-out".to_owned(), note.clone())]);
        } else {
            if let Some(why) = j.opt_out.as_ref().and_then(OptOut::why) {
                warnings.push(format!("tollgate: {why}; the pod was handled as usual"));
            }
            warnings.extend(m.warnings.iter().cloned());
            review.steps.clone_from(&m.report.applied);
            if let Some(patch) = &m.patch {
                out.outcome = Outcome::Patched;
                out.response.patch = Some(patch.clone());
            }
        }
    }
    if !warnings.is_empty() {
        out.response.warnings = Some(warnings);
    }
    out.about = About::Pod(review);
    if ambiguous {
        if let Some(fixed) = out
            .response
            .patch
            .as_deref()
            .and_then(|p| diff::to_sent_object(body, p))
        {
            out.response.patch = Some(fixed);
        }
    }
}

/// The validating webhook's answer for a pod, from its judgement.
/// Takes the decision out of `j` (the mutating webhook's answer, when there is one, is
/// drawn first).
fn validation_answer(out: &mut Reviewed, j: &mut Judgement, profile_warning: Option<String>) {
    let mut review = PodReview {
        quota_refusal: j.feasibility.as_mut().and_then(|f| f.admission.take()),
        ..PodReview::default()
    };
    let mut warnings = vec![];
    if let Some(d) = j.validation.take() {
        review.verdict = Some(d.verdict);
        review.opt_out = d.opt_out;
        review.missing = d.missing;
        if !d.allowed {
            let message = d.message.as_deref().unwrap_or("denied");
            refuse(out, Outcome::Denied, message, "Forbidden", 403);
        }
        warnings = d.warnings;
        out.response.audit_annotations = d.audit_annotations.into_iter().collect();
    }
    warn(out, profile_warning, warnings);
    out.about = About::Pod(review);
}

//! A workload's review (a Job, a PyTorchJob, ...: its pod templates judged as the pods they
//! will make), a Kubeflow Trainer runtime's, and a TollgatePolicy's or TollgateProfile's.

use kube_core::admission::AdmissionRequest;
use kube_core::DynamicObject;
use serde_json::Value;

use super::{
    per_stage, policy_operation, refuse, requester, same, skeleton, warn, About, Outcome, Reviewed,
    Staged, WorkloadReview,
};
use crate::cluster::Cluster;
use crate::objects;
use crate::optout::OptOut;
use crate::policy::Policy;
use crate::profile::{self, PodLabels};
use crate::requester::Requester;
use crate::stage::Stage;
use crate::trainjob;
use crate::validate::Verdict;
use crate::workload::{self, TemplateVerdict, Workload};

/// Reviews a workload (a kind other than Pod): its pod templates, if the policy lists the
/// kind; anything else is allowed unchanged, with a warning. With both stages, the
/// validating webhook judges the workload as the mutating webhook's patch left it.
pub(super) fn review_workload(
    stages: Stage,
    policy: &Policy,
    cluster: &dyn Cluster,
    req: &AdmissionRequest<DynamicObject>,
    object: Value,
    old: Option<&Value>,
) -> Staged {
    let mut reviewed = skeleton(stages.first(), req, None);
    reviewed.about = About::Workload(WorkloadReview {
        kind: req.kind.kind.clone(),
        templates: vec![],
        verdict: None,
        opt_out: None,
    });
    if reviewed.name.is_empty() {
        if let Some(g) = object
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
        {
            reviewed.name = format!("{g}*");
        }
    }
    if req.sub_resource.as_deref().is_some_and(|s| !s.is_empty()) {
        return same(stages, reviewed);
    }
    let Some(operation) = policy_operation(&req.operation) else {
        return same(stages, reviewed);
    };
    if req.kind.group == objects::GROUP {
        return review_policy_object(stages, policy, reviewed, &req.kind.kind, &object);
    }
    let who = requester(req);
    let labels = workload::labels_of(&object);
    let selected = profile::select(
        policy,
        who.namespace,
        PodLabels::Parsed(Some(&labels)),
        cluster,
    );
    reviewed.profile = selected.profile.map(str::to_owned);
    reviewed.unresolved.extend(selected.unresolved);
    let gvk = &req.kind;
    if gvk.group == trainjob::GROUP
        && matches!(
            gvk.kind.as_str(),
            "TrainingRuntime" | "ClusterTrainingRuntime"
        )
    {
        return review_runtime(
            stages,
            selected.policy,
            cluster,
            reviewed,
            &object,
            who,
            selected.warning,
        );
    }
    let Some(kind) = selected
        .policy
        .workloads
        .kind(&gvk.group, &gvk.version, &gvk.kind)
    else {
        // Registered for more than tollgate knows, by mistake or ahead of the policy:
        // tollgate has no opinion, so it stays out of the way.
        let api = if gvk.group.is_empty() {
            gvk.version.clone()
        } else {
            format!("{}/{}", gvk.group, gvk.version)
        };
        reviewed.response.warnings = Some(vec![format!(
            "tollgate only reviews pods and the workloads its policy lists (workloads.kinds); this {} ({api}) was allowed unchanged",
            gvk.kind
        )]);
        return same(stages, reviewed);
    };
    if !selected.policy.workloads.enabled {
        return same(stages, reviewed);
    }
    let warning = selected.warning;
    let w = Workload {
        kind,
        object: &object,
        old,
        operation,
        who,
    };
    per_stage(
        stages,
        &reviewed,
        |mut out| {
            let m = workload::mutate(policy, cluster, &w);
            out.response.audit_annotations = m.audit_annotations.into_iter().collect();
            out.unresolved.extend(m.unresolved);
            set_workload(&mut out, m.templates, None, m.opt_out);
            // With both webhooks, the validating one judges the object as patched.
            let patched = m
                .patch
                .as_ref()
                .filter(|_| stages == Stage::All)
                .and_then(|p| {
                    let patch: json_patch::Patch = serde_json::from_slice(p).ok()?;
                    let mut doc = object.clone();
                    json_patch::patch(&mut doc, &patch).ok()?;
                    Some(doc)
                });
            if let Some(patch) = m.patch {
                out.outcome = Outcome::Patched;
                out.response.patch = Some(patch);
            }
            warn(&mut out, warning.clone(), m.warnings);
            (out, patched)
        },
        |mut out, patched| {
            let patched = patched.flatten();
            let w = Workload {
                object: patched.as_ref().unwrap_or(&object),
                ..w
            };
            let v = workload::validate(policy, cluster, &w);
            out.response.audit_annotations = v.audit_annotations.into_iter().collect();
            out.unresolved.extend(v.unresolved);
            set_workload(&mut out, v.templates, v.verdict, v.opt_out);
            if !v.allowed {
                refuse(
                    &mut out,
                    Outcome::Denied,
                    v.message.as_deref().unwrap_or("denied"),
                    "Forbidden",
                    403,
                );
            }
            warn(&mut out, warning.clone(), v.warnings);
            out
        },
    )
}

/// A Kubeflow Trainer runtime: nothing to mutate; validated by the pods a TrainJob on it
/// would make (`workload::validate_runtime`), and always admitted, what no TrainJob can
/// supply said in warnings.
fn review_runtime(
    stages: Stage,
    policy: &Policy,
    cluster: &dyn Cluster,
    reviewed: Reviewed,
    object: &Value,
    who: Requester<'_>,
    profile_warning: Option<String>,
) -> Staged {
    validated_only(stages, &reviewed, |mut out| {
        let mut warnings = vec![];
        if policy.workloads.enabled {
            if let Some(v) = workload::validate_runtime(policy, cluster, object, who) {
                warnings = v.warnings;
                out.unresolved.extend(v.unresolved);
                set_workload(&mut out, v.templates, v.verdict, None);
            }
        }
        warn(&mut out, profile_warning, warnings);
        out
    })
}

/// A TollgatePolicy or TollgateProfile: nothing to mutate; refused by the validating
/// webhook if it would not be applied (`objects::review`), which the CRD's schema cannot
/// see: the bounds, quantities, the merged result, a validation refusing its own mutation.
fn review_policy_object(
    stages: Stage,
    policy: &Policy,
    reviewed: Reviewed,
    kind: &str,
    object: &Value,
) -> Staged {
    validated_only(stages, &reviewed, |mut out| {
        let v = objects::review(policy, kind, object);
        if let Some(why) = v.refusal {
            refuse(&mut out, Outcome::Denied, &why, "Invalid", 422);
        }
        if !v.warnings.is_empty() {
            out.response.warnings = Some(v.warnings);
        }
        out
    })
}

/// What the mutating webhook leaves unchanged: its answer the skeleton's, the validating
/// webhook's written by `validate`.
fn validated_only(
    stages: Stage,
    reviewed: &Reviewed,
    validate: impl FnOnce(Reviewed) -> Reviewed,
) -> Staged {
    per_stage(stages, reviewed, |out| (out, ()), |out, _| validate(out))
}

fn set_workload(
    out: &mut Reviewed,
    templates: Vec<TemplateVerdict>,
    verdict: Option<Verdict>,
    opt_out: Option<OptOut>,
) {
    if let About::Workload(w) = &mut out.about {
        w.templates = templates;
        w.verdict = verdict;
        w.opt_out = opt_out;
    }
}

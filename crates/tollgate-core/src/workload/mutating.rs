//! The mutating webhook for a workload: tollgate's approval of the opt-out in each new or
//! changed template, and the limits the apiserver requires of a template that its pods
//! would get from tollgate anyway (`fix`); nothing else (the pods are mutated when they
//! are created).

use serde_json::Value;

use super::approval::{approval_of, carry_approvals, set_approval};
use super::built::{build, Source};
use super::fix;
use super::judging::{judging, Judging};
use super::messages::with_template;
use super::template::{pod_of, subject, workload_name};
use super::{Mutated, TemplateVerdict, Workload};
use crate::cluster::Cluster;
use crate::judge;
use crate::mutate::Report;
use crate::optout::{self, OptOut};
use crate::policy::{Operation, Policy};
use crate::stage::Stage;
use crate::{apivalidation, diff, pod};

/// The mutating webhook for a workload: tollgate's approval of the opt-out in each new or
/// changed template, and the limits its pods would get that the apiserver requires of
/// the template.
pub(crate) fn mutate(policy: &Policy, cluster: &dyn Cluster, w: &Workload<'_>) -> Mutated {
    let mut out = Mutated::default();
    // What a controller made came from a template judged at its parent: it keeps the
    // approval it arrived with. It still gets the limits the apiserver requires where the
    // apiserver validates its templates (a JobSet's Jobs: the JobSet's were not).
    let controller = optout::is_controller(policy, w.who.username);
    let fixes = fix::validated_by_apiserver(w.kind);
    if controller && !fixes {
        return out;
    }
    let subject = subject(w.kind, w.object);
    let name = workload_name(w.object);
    let built = match build(cluster, w, name) {
        Ok(b) => b,
        // The validating webhook warns; the shell fetches the runtime and reviews again.
        Err(m) => {
            out.unresolved.extend(m.unresolved);
            return out;
        }
    };
    let src = Source::of(w, built.as_ref());
    let mut after: Option<Value> = None;
    let mut approved = vec![];
    // For a kind with `from`: every template's approval (by its name), written into the
    // workload at the end if any changes.
    let mut carried: Vec<(String, Option<String>)> = vec![];
    let mut carry = false;
    // Why the pods of a template tollgate left refused get no limit: said with the YAML.
    let mut because: Option<&str> = None;
    for j in judging(policy, cluster, w, src, name) {
        let p = j.policy;
        let key = &p.opt_out.approval_annotation;
        let here = with_template(&subject, &j.t);
        let current = approval_of(p, j.t.value);
        let annotations = j.t.annotations();
        let asked = pod::is_true(annotations.as_ref(), &p.opt_out.annotation);
        if controller {
            // Its opt-out by the approval it carries, as at its pods.
            if j.changed {
                let opt_out = optout::decide_for(p, annotations.as_ref(), &w.who);
                give_limits(
                    cluster,
                    w,
                    name,
                    &j,
                    opt_out,
                    &here,
                    &mut after,
                    &mut out,
                    &mut because,
                );
            }
            continue;
        }
        let wanted: Option<&str> = if !j.changed {
            j.old.and_then(|o| approval_of(p, o))
        } else if asked {
            match optout::permitted(p, &w.who) {
                Ok(()) => Some(w.who.username),
                Err(why) => {
                    out.warnings.push(format!(
                        "tollgate: {here}: {why}; its pods will be handled as usual"
                    ));
                    out.opt_out = Some(OptOut::Refused(why));
                    None
                }
            }
        } else {
            None
        };
        if wanted.is_some() && j.changed {
            approved.push(j.t.lead(&format!(
                "for user {:?} in namespace {:?}",
                w.who.username, w.who.namespace
            )));
            out.opt_out = Some(OptOut::Honoured);
        }
        let refused = asked && j.changed && wanted.is_none();
        let decision = match (j.changed, current == wanted) {
            (true, _) if wanted.is_some() => "approved",
            (true, _) if refused => "not-approved",
            (true, true) => "none",
            (true, false) => "approval-removed",
            (false, true) => "unchanged",
            (false, false) => "approval-restored",
        };
        out.templates.push(TemplateVerdict {
            template: j.t.display().to_owned(),
            pointer: j.t.pointer.clone(),
            decision,
        });
        if let Some(by) = wanted.filter(|_| j.changed) {
            out.warnings.push(format!(
                "tollgate: {here}: the opt-out of its pods is approved for {by:?} ({key} on the pod template); they will skip tollgate's mutation and validation"
            ));
        }
        if built.is_some() {
            carried.push((j.t.name.clone(), wanted.map(str::to_owned)));
        }
        if fixes && j.changed {
            // The pods' opt-out as the approval written here decides it.
            let opt_out = match wanted {
                Some(_) => OptOut::Honoured,
                None if asked => OptOut::Refused(String::new()),
                None => OptOut::NotRequested,
            };
            give_limits(
                cluster,
                w,
                name,
                &j,
                opt_out,
                &here,
                &mut after,
                &mut out,
                &mut because,
            );
        }
        if current == wanted {
            continue;
        }
        if built.is_some() {
            carry = true;
        } else {
            let doc = after.get_or_insert_with(|| w.object.clone());
            let Some(template) = doc.pointer_mut(&j.t.pointer) else {
                continue;
            };
            set_approval(template, key, wanted);
        }
        match (wanted, j.changed) {
            (Some(_), true) => {}
            (None, true) => out.warnings.push(format!(
                "tollgate: {here}: removed {key} from the pod template: only tollgate sets it, for a requester who may opt out there"
            )),
            (_, false) => out.warnings.push(format!(
                "tollgate: {here}: {key} on the pod template was put back as it was: the template did not change"
            )),
        }
    }
    if carry {
        let doc = after.get_or_insert_with(|| w.object.clone());
        carry_approvals(doc, &policy.opt_out.approval_annotation, &carried);
    }
    if fixes {
        refused_by_apiserver(w, after.as_ref().unwrap_or(w.object), because, &mut out);
    }

    if !approved.is_empty() {
        out.audit_annotations
            .insert("opt-out-approved".into(), approved.join("; "));
    }
    if let Some(after) = after {
        let patch = diff::Snapshot::of(w.object)
            .and_then(|b| diff::patch_text(&b, &diff::Snapshot::of(&after)?));
        match patch {
            Ok(p) => out.patch = p,
            Err(e) => out.warnings.push(format!(
                "tollgate: {subject}: could not compute its changes ({e}); it was allowed unchanged"
            )),
        }
    }
    out
}

/// Gives template `j` (in `after`, the workload as it will be, made on the first change)
/// the limits the apiserver
/// requires that its pods get from tollgate's mutation (their opt-out `opt_out`), and says
/// so; where they would get none, `because` says why.
#[allow(clippy::too_many_arguments)]
fn give_limits(
    cluster: &dyn Cluster,
    w: &Workload<'_>,
    name: &str,
    j: &Judging<'_, '_>,
    opt_out: OptOut,
    here: &str,
    after: &mut Option<Value>,
    out: &mut Mutated,
    because: &mut Option<&str>,
) {
    // Nearly every template: nothing the apiserver needs, and no pod to make for it.
    if fix::missing_limits(j.t.value).is_empty() && !hugepages_alone(j.t.value) {
        return;
    }
    let report = if opt_out == OptOut::Honoured {
        *because = Some(
            "its pods opt out of tollgate's mutation, so tollgate does not give them the limit",
        );
        Report::default()
    } else {
        match pod_of(w.kind, &j.t, name, w.who.namespace) {
            Ok(mut pod) => {
                // Created by the controller, with the opt-out decided here.
                let judgement = judge::pod(
                    &judge::Subject {
                        policy: j.policy,
                        profile: j.profile,
                        who: w.who,
                        operation: Operation::Create,
                        opt_out: Some(opt_out),
                        template: true,
                        queued: false,
                        placement: None,
                    },
                    cluster,
                    &mut pod,
                    Stage::Mutate,
                    false,
                );
                judgement.mutation.map(|m| m.report).unwrap_or_default()
            }
            Err(_) => Report::default(),
        }
    };
    let given = fix::limits_to_give(j.t.value, &report);
    if given.is_empty() {
        because.get_or_insert("tollgate's mutation gives its pods no such limit (they are not training pods, or mutation.defaultResources is off)");
        return;
    }
    let doc = after.get_or_insert_with(|| w.object.clone());
    if let Some(template) = doc.pointer_mut(&j.t.pointer) {
        fix::give(template, &given);
        out.warnings.push(fix::warning(here, &given));
    }
}

/// Whether a container of `template` has hugepages but neither cpu nor memory.
fn hugepages_alone(template: &Value) -> bool {
    ["initContainers", "containers"].iter().any(|list| {
        template
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| {
                let names: Vec<&str> = ["requests", "limits"]
                    .iter()
                    .filter_map(|k| c.pointer(&format!("/resources/{k}")))
                    .filter_map(Value::as_object)
                    .flat_map(|m| m.keys().map(String::as_str))
                    .collect();
                names.iter().any(|n| n.starts_with("hugepages-"))
                    && !names.iter().any(|n| *n == "cpu" || *n == "memory")
            })
    })
}

/// Warns, in the apiserver's words, of what it will refuse in `object` (the workload as
/// the mutation leaves it), with the YAML of the limits tollgate did not give and why.
fn refused_by_apiserver(
    w: &Workload<'_>,
    object: &Value,
    because: Option<&str>,
    out: &mut Mutated,
) {
    let errors = super::apiserver_errors(w.kind, object);
    if errors.is_empty() {
        return;
    }
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let refusal = apivalidation::refusal(&w.kind.group, &w.kind.kind, name, &errors);
    let missing: Vec<_> = super::template::templates(w.kind, object)
        .iter()
        .flat_map(|t| fix::missing_limits(t.value))
        .collect();
    let because = because.unwrap_or("tollgate does not give its pods that limit");
    out.warnings.push(fix::refused_warning(
        &subject(w.kind, object),
        &refusal,
        &missing,
        because,
    ));
}

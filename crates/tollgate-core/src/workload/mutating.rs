//! The mutating webhook for a workload: tollgate's approval of the opt-out in each new or
//! changed template, and nothing else (the pods are mutated when they are created).

use serde_json::Value;

use super::approval::{approval_of, carry_approvals, set_approval};
use super::built::{build, Source};
use super::judging::judging;
use super::messages::with_template;
use super::template::{subject, workload_name};
use super::{Mutated, TemplateVerdict, Workload};
use crate::cluster::Cluster;
use crate::optout::{self, OptOut};
use crate::policy::Policy;
use crate::{diff, pod};

/// The mutating webhook for a workload: tollgate's approval of the opt-out in each new or
/// changed template, and nothing else.
pub(crate) fn mutate(policy: &Policy, cluster: &dyn Cluster, w: &Workload<'_>) -> Mutated {
    let mut out = Mutated::default();
    // What a controller made came from a template judged at its parent: it keeps what it
    // arrived with.
    if optout::is_controller(policy, w.who.username) {
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
    for j in judging(policy, cluster, w, src, name) {
        let p = j.policy;
        let key = &p.opt_out.approval_annotation;
        let here = with_template(&subject, &j.t);
        let current = approval_of(p, j.t.value);
        let annotations = j.t.annotations();
        let asked = pod::is_true(annotations.as_ref(), &p.opt_out.annotation);
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

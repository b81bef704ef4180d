//! The validating webhook for a workload: each new or changed template judged as the pods
//! it will make ([`judge_template`], data), approvals the mutating webhook would not have
//! left refused, whether its pods can run in all (`feasibility`); then what is said of it
//! (the warnings as each template is recorded, the refusal's message from [`Refusal`]).

use std::collections::BTreeMap;

use super::approval::approval_of;
use super::built::{build, Source};
use super::feasibility::{feasibility, kueue_queue};
use super::judging::{judging, Judging};
use super::messages::{missing_warning, no_template_warning, prefixed, with_template};
use super::template::{pod_count, pod_of, subject, workload_name, PodTemplate};
use super::{TemplateJudged, TemplateVerdict, Validated, Workload};
use crate::cluster::Cluster;
use crate::judge::{self, Judgement};
use crate::optout::{self, OptOut};
use crate::pod;
use crate::policy::{FeasibilityMode, Operation, Policy};
use crate::requester::Requester;
use crate::stage::Stage;
use crate::validate::{self, Decision, Missing, Part, Verdict};

/// What the validating webhook concluded of one template.
enum Judged {
    /// It carries an approval of the opt-out (this one) that tollgate did not give.
    Forged(String),
    /// An UPDATE left it as it was: not judged again.
    Unchanged,
    /// Its pods opt out, honoured: neither mutated nor checked.
    OptedOut,
    /// It could not be read as a pod spec (why), with the opt-out its pods would get.
    Unreadable(OptOut, String),
    /// The pods it makes, judged as a cluster with both webhooks judges a pod, with the
    /// opt-out decided here.
    Pods(OptOut, Box<Judgement>),
}

/// What every template of one workload is judged with.
struct Judge<'a, 'v> {
    cluster: &'a dyn Cluster,
    w: &'a Workload<'v>,
    /// The object its templates are read in (the workload, or what was built from it).
    object: &'a serde_json::Value,
    /// How messages name the workload.
    subject: &'a str,
    /// The workload's name, as its controller names its pods.
    name: &'a str,
    /// Its pods are held to a Kueue queue the context knows.
    queued: bool,
    /// The requester is a controller: its approvals came from a template judged at its
    /// parent.
    controller: bool,
    /// An audit's workload, whose creator nothing records: no approval can be held to them.
    unknown: bool,
}

/// A template whose pods lack required requests: what the refusal says of it.
struct Lacking<'v> {
    t: PodTemplate<'v>,
    missing: Vec<Missing>,
    opt_out: OptOut,
    /// Claims of its pods that could not be read.
    unread: Vec<String>,
}

/// What the workload's verdict, refusal and audit annotations are drawn from, template by
/// template.
#[derive(Default)]
struct Drawn<'v, 'p> {
    refusal: Refusal<'v, 'p>,
    verdicts: Vec<Verdict>,
    audit: BTreeMap<String, Vec<String>>,
}

/// Why the workload is refused, before it is worded.
#[derive(Default)]
struct Refusal<'v, 'p> {
    /// The approvals it carries that tollgate did not give: the template (as messages name
    /// it), the annotation and its value.
    forged: Vec<(String, &'p str, String)>,
    /// The templates whose pods lack required requests, each with its pods' policy.
    lacking: Vec<(Lacking<'v>, &'p Policy)>,
}

/// The validating webhook for a workload: each new or changed template judged as the
/// pods it will make, and approvals the mutating webhook would not have left refused.
pub(crate) fn validate(policy: &Policy, cluster: &dyn Cluster, w: &Workload<'_>) -> Validated {
    let mut out = Validated {
        allowed: true,
        ..Default::default()
    };
    let subject = subject(w.kind, w.object);
    let name = workload_name(w.object);
    let built = match build(cluster, w, name) {
        Ok(b) => b,
        // What tollgate does not know never refuses: allowed, and said so.
        Err(m) => {
            out.warnings.push(missing_warning(&subject, &m));
            out.unresolved.extend(m.unresolved);
            return out;
        }
    };
    let src = Source::of(w, built.as_ref());
    let all = judging(policy, cluster, w, src, name);
    if all.is_empty() {
        out.warnings.push(no_template_warning(w, &subject));
        return out;
    }
    let queue = kueue_queue(w, cluster);
    let judge = Judge {
        cluster,
        w,
        object: src.object,
        subject: &subject,
        name,
        queued: queue.is_some(),
        controller: optout::is_controller(policy, w.who.username),
        unknown: w.who.is_unknown(),
    };
    let mut drawn = Drawn::default();
    for j in all {
        let approval = approval_of(j.policy, j.t.value);
        let judged = judge.template(&j, approval);
        judge.record(j, approval, judged, &mut out, &mut drawn);
    }
    let Drawn {
        refusal,
        mut verdicts,
        audit,
    } = drawn;
    if !refusal.forged.is_empty() {
        verdicts.push(Verdict::ForgedApproval);
    }
    let never = feasibility(w, cluster, &subject, queue.as_deref(), &mut out);
    if !never.is_empty() {
        verdicts.push(Verdict::Infeasible);
    }
    out.verdict = overall(&verdicts);
    out.audit_annotations = audit.into_iter().map(|(k, v)| (k, v.join("; "))).collect();
    if let Some(message) = refusal.message(policy, &subject, &never, &w.who) {
        out.allowed = false;
        out.message = Some(message);
    }
    out
}

impl Judge<'_, '_> {
    /// What becomes of template `j`'s pods; `approval`: whom tollgate's approval in it
    /// names, if it carries one.
    fn template(&self, j: &Judging<'_, '_>, approval: Option<&str>) -> Judged {
        let p = j.policy;
        let w = self.w;
        let annotations = j.t.annotations();
        let asked = pod::is_true(annotations.as_ref(), &p.opt_out.annotation);
        if !self.controller && !self.unknown {
            let expected = if !j.changed {
                j.old.and_then(|o| approval_of(p, o))
            } else if asked && optout::permitted(p, &w.who).is_ok() {
                Some(w.who.username)
            } else {
                None
            };
            if let Some(v) = approval.filter(|v| Some(*v) != expected) {
                return Judged::Forged(v.to_owned());
            }
        }
        if !j.changed {
            return Judged::Unchanged;
        }
        // The opt-out the pods will get: a controller's by the approval it carries; a
        // person's by who they are, once the mutating webhook has approved it; an unknown
        // requester's as far as it can be told.
        let opt_out = if self.controller || self.unknown || !asked {
            optout::decide_for(p, annotations.as_ref(), &w.who)
        } else {
            match optout::permitted(p, &w.who) {
                Err(why) => OptOut::Refused(why),
                Ok(()) if approval == Some(w.who.username) => OptOut::Honoured,
                Ok(()) => OptOut::Refused(format!(
                    "the pod template carries no {} (tollgate's mutating webhook approves the opt-out there), so its pods could not opt out",
                    p.opt_out.approval_annotation
                )),
            }
        };
        if opt_out == OptOut::Honoured {
            return Judged::OptedOut;
        }
        let mut pod = match pod_of(w.kind, &j.t, self.name, w.who.namespace) {
            Ok(p) => p,
            Err(e) => return Judged::Unreadable(opt_out, e),
        };
        // Created by the controller, with the opt-out decided here.
        let judgement = judge::pod(
            &judge::Subject {
                policy: p,
                profile: j.profile,
                who: w.who,
                operation: Operation::Create,
                opt_out: Some(opt_out.clone()),
                template: true,
                queued: self.queued,
                placement: None,
            },
            self.cluster,
            &mut pod,
            Stage::All,
            false,
        );
        Judged::Pods(opt_out, Box::new(judgement))
    }

    /// Records what became of template `j` in `out` (its verdict, its judgement, what the
    /// user reads of it) and in what the workload's verdict, refusal and audit annotations
    /// are drawn from.
    fn record<'v, 'p>(
        &self,
        j: Judging<'v, 'p>,
        approval: Option<&str>,
        judged: Judged,
        out: &mut Validated,
        drawn: &mut Drawn<'v, 'p>,
    ) {
        let p = j.policy;
        let here = with_template(self.subject, &j.t);
        out.unresolved.extend(j.unresolved.clone());
        if let Some(warning) = &j.warning {
            out.warnings.push(prefixed(&here, warning));
        }
        let mut record = TemplateJudged {
            verdict: TemplateVerdict {
                template: String::new(),
                pointer: String::new(),
                decision: "",
            },
            label: j.t.label.clone(),
            profile: j.profile.map(str::to_owned),
            opt_out: None,
            approved_for: approval.map(str::to_owned),
            judgement: None,
            unreadable: None,
            pods: pod_count(&j.t, self.object),
            enforce: p.feasibility.mode == FeasibilityMode::Enforce,
        };
        let mut lacking = None;
        let decided = match judged {
            Judged::Forged(value) => {
                drawn.refusal.forged.push((
                    j.t.display().to_owned(),
                    &p.opt_out.approval_annotation,
                    value,
                ));
                "denied"
            }
            Judged::Unchanged => "unchanged",
            Judged::OptedOut => {
                out.warnings.push(format!(
                    "tollgate: {here}: its pods opt out ({}); their resource requests will not be checked",
                    p.opt_out.annotation
                ));
                drawn
                    .audit
                    .entry("opt-out".into())
                    .or_default()
                    .push(j.t.lead(&optout::audit_note(&self.w.who)));
                out.opt_out = Some(OptOut::Honoured);
                drawn.verdicts.push(Verdict::OptedOut);
                record.opt_out = Some(OptOut::Honoured);
                "opted-out"
            }
            Judged::Unreadable(opt_out, e) => {
                out.warnings.push(format!(
                    "tollgate: {here}: could not read the pod template ({e}); its pods will be judged when they are created"
                ));
                record.opt_out = Some(opt_out);
                record.unreadable = Some(e);
                "unreadable"
            }
            Judged::Pods(opt_out, judgement) => {
                let decision = judgement
                    .validation
                    .clone()
                    .unwrap_or_else(Decision::skipped);
                out.unresolved.extend(judgement.unresolved.iter().cloned());
                if let Some(m) = &judgement.mutation {
                    out.warnings
                        .extend(m.warnings.iter().map(|m| prefixed(&here, m)));
                }
                out.warnings
                    .extend(decision.warnings.iter().map(|m| prefixed(&here, m)));
                for (k, v) in &decision.audit_annotations {
                    drawn.audit.entry(k.clone()).or_default().push(j.t.lead(v));
                }
                if let OptOut::Refused(why) = &opt_out {
                    if out.opt_out.is_none() {
                        out.opt_out = Some(OptOut::Refused(why.clone()));
                    }
                }
                drawn.verdicts.push(decision.verdict);
                record.opt_out = Some(opt_out.clone());
                let unread = judgement.unread_claims.clone();
                record.judgement = Some(*judgement);
                if decision.allowed {
                    "allowed"
                } else {
                    lacking = Some((decision.missing, opt_out, unread));
                    "denied"
                }
            }
        };
        let verdict = TemplateVerdict {
            template: j.t.display().to_owned(),
            pointer: j.t.pointer.clone(),
            decision: decided,
        };
        out.templates.push(verdict.clone());
        record.verdict = verdict;
        out.judged.push(record);
        if let Some((missing, opt_out, unread)) = lacking {
            drawn.refusal.lacking.push((
                Lacking {
                    t: j.t,
                    missing,
                    opt_out,
                    unread,
                },
                p,
            ));
        }
    }
}

/// The workload's verdict: its templates' worst.
fn overall(verdicts: &[Verdict]) -> Option<Verdict> {
    [
        Verdict::ForgedApproval,
        Verdict::MissingRequests,
        Verdict::Infeasible,
        Verdict::Passed,
        Verdict::OptedOut,
    ]
    .into_iter()
    .find(|v| verdicts.contains(v))
    .or((!verdicts.is_empty()).then_some(Verdict::Skipped))
}

impl Refusal<'_, '_> {
    /// The refusal a user reads, a paragraph per cause (None: allowed): the approvals
    /// tollgate did not give, the requests its templates' pods lack, and `never`, what can
    /// never run under `feasibility.mode: enforce`.
    fn message(
        &self,
        policy: &Policy,
        subject: &str,
        never: &[String],
        who: &Requester<'_>,
    ) -> Option<String> {
        let mut message = vec![];
        if !self.forged.is_empty() {
            let lines: Vec<String> = self
                .forged
                .iter()
                .map(|(template, key, value)| {
                    format!(
                        "  - {template}: {key}: {value:?}, an approval only tollgate's mutating webhook gives, to a requester who may opt out there"
                    )
                })
                .collect();
            let key = &policy.opt_out.approval_annotation;
            message.push(format!(
                "{subject} carries tollgate's opt-out approval where tollgate did not give it:\n{}\nRemove {key} from the pod template: tollgate sets it itself when the opt-out is permitted.",
                lines.join("\n")
            ));
        }
        if let Some((_, p)) = self.lacking.first() {
            let single = self.lacking.len() == 1 && self.lacking[0].0.t.label.is_none();
            let parts: Vec<Part<'_>> = self
                .lacking
                .iter()
                .map(|(f, _)| Part {
                    template: if single { None } else { Some(f.t.display()) },
                    missing: &f.missing,
                    opt_out: &f.opt_out,
                })
                .collect();
            let mut m = validate::denial_message(p, "", Some(subject), &parts, who);
            for (f, _) in &self.lacking {
                for claim in &f.unread {
                    m.push('\n');
                    m.push_str(&f.t.lead(&validate::UNREAD_CLAIM_LINE.fill(&[("claim", claim)])));
                }
            }
            message.push(m);
        }
        if !never.is_empty() {
            let mut m = String::new();
            validate::INFEASIBLE_HEADLINE.fill_into(&mut m, &[("subject", subject)]);
            for line in never {
                m.push('\n');
                validate::INFEASIBLE_LINE.fill_into(&mut m, &[("finding", line)]);
            }
            message.push(m);
        }
        (!message.is_empty()).then(|| message.join("\n\n"))
    }
}

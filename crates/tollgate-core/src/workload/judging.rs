//! Which policy a template's pods get (their profile, by the labels the controller gives
//! them) and whether the review judges it at all (an UPDATE that left it as it was is not
//! judged again): what both webhooks start from.

use serde_json::Value;

use super::approval::same_template;
use super::built::{old_template, Source};
use super::template::{pod_labels, templates, PodTemplate};
use super::Workload;
use crate::cluster::{Cluster, ObjectKey};
use crate::policy::{Operation, Policy};
use crate::profile;

/// A template, and the policy its pods get (their profile).
pub(super) struct Judging<'v, 'p> {
    pub(super) t: PodTemplate<'v>,
    pub(super) policy: &'p Policy,
    pub(super) profile: Option<&'p str>,
    /// On CREATE, or an UPDATE that changed it.
    pub(super) changed: bool,
    pub(super) old: Option<&'v Value>,
    pub(super) unresolved: Option<ObjectKey>,
    pub(super) warning: Option<String>,
}

pub(super) fn judging<'v, 'p>(
    policy: &'p Policy,
    cluster: &dyn Cluster,
    w: &Workload<'v>,
    src: Source<'v>,
    name: &str,
) -> Vec<Judging<'v, 'p>> {
    templates(w.kind, src.object)
        .into_iter()
        .map(|t| {
            let labels = pod_labels(w.kind, &t, name);
            let selected = profile::select(
                policy,
                w.who.namespace,
                profile::PodLabels::Parsed(Some(&labels)),
                cluster,
            );
            let old = old_template(src, &t);
            let approval = &selected.policy.opt_out.approval_annotation;
            let changed = w.operation == Operation::Create
                || old.is_none_or(|o| !same_template(approval, o, t.value));
            Judging {
                t,
                policy: selected.policy,
                profile: selected.profile,
                changed,
                old,
                unresolved: selected.unresolved,
                warning: selected.warning,
            }
        })
        .collect()
}

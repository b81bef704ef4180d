//! Who may opt a pod out of tollgate, and where.
//!
//! The opt-out annotation is a request, not a right: the policy names the namespaces and the
//! requesting users or groups for which it is honoured. Mutation and validation both follow
//! this one decision so that they never disagree about a pod.
//!
//! A pod made by a controller (a Job's, a PyTorchJob's) is requested by the controller's
//! service account, which says nothing of the person behind the workload. Its opt-out is
//! judged at the workload instead (`workload`), where the requester is that person, and
//! the verdict travels in the pod template as tollgate's approval annotation. So for a
//! requester in `optOut.controllers` the opt-out is honoured only with that approval; for
//! anyone else the approval means nothing and the requester is judged as always.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::glob;
use crate::pod::is_true;
use crate::policy::Policy;
use crate::requester::Requester;
use crate::words::{quote, Template};

/// Why an opt-out is refused, in the user's words (`export` writes the same in CEL).
pub(crate) const NOT_IN_NAMESPACE: Template =
    Template("opting out with {annotation} is not permitted in namespace {namespace}");
pub(crate) const NOT_FOR_USER: Template =
    Template("opting out with {annotation} is not permitted for {user} in namespace {namespace}");
/// A controller's pod whose template tollgate did not approve.
pub(crate) const NOT_APPROVED: Template = Template(
    "opting out with {annotation} is not permitted for a pod that {controller} makes from a template tollgate did not approve (it carries no {approval})",
);
/// A controller asking for itself: its pods' opt-out is its workload's.
pub(crate) const AT_THE_WORKLOAD: Template = Template(
    "opting out with {annotation} is judged at the workload for pods that {controller} makes",
);
/// The audit annotation's value for an honoured opt-out.
pub(crate) const AUDIT_NOTE: Template =
    Template("honoured for user {user} in namespace {namespace}");
/// What a controller's pod's audit annotation adds: whom the opt-out was approved for.
pub(crate) const APPROVED_FOR: Template =
    Template("{note}, approved at the workload for user {by}");

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptOut {
    /// The pod does not carry the opt-out annotation.
    NotRequested,
    /// The pod asked and the policy allows it here.
    Honoured,
    /// The pod asked but the policy does not allow it; the text says why, for the user.
    Refused(String),
    /// The pod asked, the policy allows it here only for some requesters, and who asks is
    /// not known ([`Requester::unknown`]: an object already stored): judged as not
    /// honoured. The text names who may.
    Unverified(String),
}

impl OptOut {
    /// The word the logs, metrics and the audit use.
    pub fn as_str(&self) -> &'static str {
        match self {
            OptOut::NotRequested => "none",
            OptOut::Honoured => "honoured",
            OptOut::Refused(_) => "refused",
            OptOut::Unverified(_) => "unverified",
        }
    }

    /// Why it is not honoured, for a refused or unverified one.
    pub fn why(&self) -> Option<&str> {
        match self {
            OptOut::Refused(w) | OptOut::Unverified(w) => Some(w),
            OptOut::NotRequested | OptOut::Honoured => None,
        }
    }
}

/// Why an opt-out is not known to be honoured, for a requester nobody knows.
pub(crate) const UNVERIFIED: Template = Template(
    "{annotation} is honoured here only when {who} creates the pod, and who created this one is not known",
);

pub fn decide(policy: &Policy, pod: &Pod, who: &Requester<'_>) -> OptOut {
    decide_for(policy, pod.metadata.annotations.as_ref(), who)
}

/// [`decide`] for a pod with these annotations (a pod's, or the template a pod is made
/// from).
pub(crate) fn decide_for(
    policy: &Policy,
    annotations: Option<&BTreeMap<String, String>>,
    who: &Requester<'_>,
) -> OptOut {
    let rule = &policy.opt_out;
    if !is_true(annotations, &rule.annotation) {
        return OptOut::NotRequested;
    }
    if is_controller(policy, who.username) {
        // The namespace first, as for anyone: the place rules before the approval.
        if let Err(why) = in_namespace(policy, who) {
            return OptOut::Refused(why);
        }
        return match approval(policy, annotations) {
            Some(_) => OptOut::Honoured,
            None => OptOut::Refused(NOT_APPROVED.fill(&[
                ("annotation", &rule.annotation),
                ("controller", who.username),
                ("approval", &rule.approval_annotation),
            ])),
        };
    }
    match permitted(policy, who) {
        Ok(()) => OptOut::Honoured,
        // Allowed here, but only for some: who asked decides, and nobody knows.
        Err(_) if who.is_unknown() && in_namespace(policy, who).is_ok() => {
            let mut may: Vec<String> = rule
                .users
                .iter()
                .map(|u| format!("user {}", u.as_str()))
                .collect();
            may.extend(rule.groups.iter().map(|g| format!("group {}", g.as_str())));
            OptOut::Unverified(UNVERIFIED.fill(&[
                ("annotation", &rule.annotation),
                ("who", &crate::words::join_or(&may)),
            ]))
        }
        Err(why) => OptOut::Refused(why),
    }
}

/// Whether `username` is one of the controllers whose objects come from a workload's
/// template.
pub(crate) fn is_controller(policy: &Policy, username: &str) -> bool {
    glob::any(&policy.opt_out.controllers, username)
}

/// Who tollgate approved the opt-out of these annotations for, at the workload: the value
/// of the approval annotation, when it has one.
pub(crate) fn approval<'a>(
    policy: &Policy,
    annotations: Option<&'a BTreeMap<String, String>>,
) -> Option<&'a str> {
    annotations?
        .get(&policy.opt_out.approval_annotation)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// The audit annotation's value for an honoured opt-out: who, and where.
pub(crate) fn audit_note(who: &Requester<'_>) -> String {
    AUDIT_NOTE.fill(&[
        ("user", &quote(who.username)),
        ("namespace", &quote(who.namespace)),
    ])
}

/// [`audit_note`] for a pod with these annotations: a controller's pod also names whom
/// the opt-out was approved for at the workload.
pub(crate) fn audit_note_for(
    policy: &Policy,
    annotations: Option<&BTreeMap<String, String>>,
    who: &Requester<'_>,
) -> String {
    match approval(policy, annotations).filter(|_| is_controller(policy, who.username)) {
        Some(by) => APPROVED_FOR.fill(&[("note", &audit_note(who)), ("by", &quote(by))]),
        None => audit_note(who),
    }
}

fn in_namespace(policy: &Policy, who: &Requester<'_>) -> Result<(), String> {
    let rule = &policy.opt_out;
    if glob::any(&rule.namespaces, who.namespace) {
        Ok(())
    } else {
        Err(NOT_IN_NAMESPACE.fill(&[
            ("annotation", &rule.annotation),
            ("namespace", &quote(who.namespace)),
        ]))
    }
}

/// Whether this requester may opt out in this namespace; if not, why, in the user's words.
/// A controller never may on its own: only a template tollgate approved can (see
/// [`decide_for`]).
pub(crate) fn permitted(policy: &Policy, who: &Requester<'_>) -> Result<(), String> {
    let rule = &policy.opt_out;
    in_namespace(policy, who)?;
    if is_controller(policy, who.username) {
        return Err(AT_THE_WORKLOAD.fill(&[
            ("annotation", &rule.annotation),
            ("controller", who.username),
        ]));
    }
    let anyone = rule.users.is_empty() && rule.groups.is_empty();
    let by_user = glob::any(&rule.users, who.username);
    let by_group = who.groups.iter().any(|g| glob::any(&rule.groups, g));
    if anyone || by_user || by_group {
        Ok(())
    } else {
        Err(NOT_FOR_USER.fill(&[
            ("annotation", &rule.annotation),
            ("user", &quote(who.username)),
            ("namespace", &quote(who.namespace)),
        ]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    fn pod(annotated: bool) -> Pod {
        let mut p = Pod::default();
        if annotated {
            p.metadata.annotations =
                Some([("tollgate.dev/opt-out".to_owned(), "true".to_owned())].into());
        }
        p
    }

    fn who<'a>(ns: &'a str, user: &'a str, groups: &'a [String]) -> Requester<'a> {
        Requester::new(ns, user, groups)
    }

    #[test]
    fn honoured_refused_and_not_requested() {
        let mut policy = Policy::builtin();
        policy.opt_out.namespaces = vec!["ml-*".into()];
        policy.opt_out.groups = vec!["platform".into()];
        policy.opt_out.users = vec!["system:serviceaccount:ml-*:runner".into()];
        let platform = vec!["platform".to_owned()];
        let none: Vec<String> = vec![];
        assert_eq!(
            decide(&policy, &pod(false), &who("ml-a", "x", &none)),
            OptOut::NotRequested
        );
        assert_eq!(
            decide(&policy, &pod(true), &who("ml-a", "x", &platform)),
            OptOut::Honoured
        );
        assert_eq!(
            decide(
                &policy,
                &pod(true),
                &who("ml-a", "system:serviceaccount:ml-a:runner", &none)
            ),
            OptOut::Honoured
        );
        assert!(matches!(
            decide(&policy, &pod(true), &who("ml-a", "x", &none)),
            OptOut::Refused(_)
        ));
        assert!(matches!(
            decide(&policy, &pod(true), &who("prod", "x", &platform)),
            OptOut::Refused(m) if m.contains("namespace \"prod\"")
        ));
        policy.opt_out.groups.clear();
        policy.opt_out.users.clear();
        assert_eq!(
            decide(&policy, &pod(true), &who("ml-a", "x", &none)),
            OptOut::Honoured
        );
    }
}

//! Who may opt a pod out of tollgate, and where.
//!
//! The opt-out annotation is a request, not a right: the policy names the namespaces and the
//! requesting users or groups for which it is honoured. Mutation and validation both follow
//! this one decision so that they never disagree about a pod.

use k8s_openapi::api::core::v1::Pod;

use crate::glob;
use crate::pod::annotation_is_true;
use crate::policy::Policy;
use crate::requester::Requester;
use crate::words::{quote, Template};

/// Why an opt-out is refused, in the user's words (`export` writes the same in CEL).
pub const NOT_IN_NAMESPACE: Template =
    Template("opting out with {annotation} is not permitted in namespace {namespace}");
pub const NOT_FOR_USER: Template =
    Template("opting out with {annotation} is not permitted for {user} in namespace {namespace}");
/// The audit annotation's value for an honoured opt-out.
pub const AUDIT_NOTE: Template = Template("honoured for user {user} in namespace {namespace}");

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptOut {
    /// The pod does not carry the opt-out annotation.
    NotRequested,
    /// The pod asked and the policy allows it here.
    Honoured,
    /// The pod asked but the policy does not allow it; the text says why, for the user.
    Refused(String),
}

pub fn decide(policy: &Policy, pod: &Pod, who: &Requester<'_>) -> OptOut {
    if !annotation_is_true(pod, &policy.opt_out.annotation) {
        return OptOut::NotRequested;
    }
    match permitted(policy, who) {
        Ok(()) => OptOut::Honoured,
        Err(why) => OptOut::Refused(why),
    }
}

/// The audit annotation's value for an honoured opt-out: who, and where.
pub fn audit_note(who: &Requester<'_>) -> String {
    AUDIT_NOTE.fill(&[
        ("user", &quote(who.username)),
        ("namespace", &quote(who.namespace)),
    ])
}

/// Whether this requester may opt out in this namespace; if not, why, in the user's words.
pub fn permitted(policy: &Policy, who: &Requester<'_>) -> Result<(), String> {
    let rule = &policy.opt_out;
    if !glob::any(&rule.namespaces, who.namespace) {
        return Err(NOT_IN_NAMESPACE.fill(&[
            ("annotation", &rule.annotation),
            ("namespace", &quote(who.namespace)),
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
        Requester {
            namespace: ns,
            username: user,
            groups,
        }
    }

    #[test]
    fn honoured_refused_and_not_requested() {
        let mut policy = Policy::default();
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

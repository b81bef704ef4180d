//! Who asks, and where: what the opt-out governance looks at.
//!
//! A leaf of its own so that both the opt-out decision and the review that builds it from
//! an AdmissionRequest can take it from below.

use std::sync::OnceLock;

/// The requesting user, their groups, and the namespace of the object.
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    pub namespace: &'a str,
    pub username: &'a str,
    pub groups: &'a [String],
    /// False for [`Requester::unknown`]: nothing records who asked.
    pub known: bool,
}

/// The group the apiserver adds to every authenticated user.
pub(crate) const AUTHENTICATED: &str = "system:authenticated";

impl<'a> Requester<'a> {
    /// A requester a review names.
    pub fn new(namespace: &'a str, username: &'a str, groups: &'a [String]) -> Requester<'a> {
        Requester {
            namespace,
            username,
            groups,
            known: true,
        }
    }

    /// The requester of an object already stored, whom nothing records (an audit): an
    /// empty username, which no user glob but `*` names, in the one group every requester
    /// of a pod has.
    pub fn unknown(namespace: &'a str) -> Requester<'a> {
        static GROUPS: OnceLock<[String; 1]> = OnceLock::new();
        Requester {
            namespace,
            username: "",
            groups: GROUPS.get_or_init(|| [AUTHENTICATED.to_owned()]),
            known: false,
        }
    }

    /// Whether this is [`Requester::unknown`]: a decision that depends on who asks cannot
    /// be made for it.
    pub fn is_unknown(&self) -> bool {
        !self.known
    }
}

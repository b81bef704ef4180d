//! Who asks, and where: what the opt-out governance looks at.
//!
//! A leaf of its own so that both the opt-out decision and the review that builds it from
//! an AdmissionRequest can take it from below.

/// The requesting user, their groups, and the namespace of the object.
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    pub namespace: &'a str,
    pub username: &'a str,
    pub groups: &'a [String],
}

//! Which pods each exported policy covers: the base policy and one per profile, each with
//! a guard that selects its pods as the webhook's profile selection does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::literal::{any_glob, lit};
use super::NAME;
use crate::policy::{OptOutRules, Policy, ProfileMatch, Validation};

/// One ValidatingAdmissionPolicy and its binding: the base policy, or one profile. Each
/// profile has its own, with a guard selecting its pods as the webhook does (the first
/// profile whose match fits: namespace names and globs through `request.namespace`,
/// namespace labels through `namespaceObject`, pod labels through `object`) and its own
/// mode: validation actions belong to a binding, so scopes with different modes cannot
/// share one. The base's guard is that no profile fits.
pub(super) struct Scope<'a> {
    pub(super) name: String,
    pub(super) validation: &'a Validation,
    pub(super) opt_out: &'a OptOutRules,
    /// A CEL condition on the request: pods it is false for are not this scope's.
    pub(super) guard: Option<String>,
}

pub(super) fn scopes(policy: &Policy) -> Vec<Scope<'_>> {
    let fits: Vec<String> = policy
        .profiles
        .iter()
        .map(|p| profile_fits(&p.matches))
        .collect();
    let none_before = |i: usize| fits[..i].iter().map(|f| format!("!({f})"));
    let base_guard: Vec<String> = none_before(fits.len()).collect();
    let mut out = vec![Scope {
        name: NAME.to_owned(),
        validation: &policy.validation,
        opt_out: &policy.opt_out,
        guard: (!base_guard.is_empty()).then(|| base_guard.join(" && ")),
    }];
    for (i, p) in policy.profiles.iter().enumerate() {
        let Some(resolved) = p.policy() else { continue };
        let guard: Vec<String> = std::iter::once(format!("({})", fits[i]))
            .chain(none_before(i))
            .collect();
        out.push(Scope {
            name: format!("{}.{NAME}", p.name),
            validation: &resolved.validation,
            opt_out: &resolved.opt_out,
            guard: Some(guard.join(" && ")),
        });
    }
    out
}

/// Whether a profile's `match` fits the request, in CEL: every criterion it gives.
pub(super) fn profile_fits(m: &ProfileMatch) -> String {
    let mut all = vec![];
    if !m.namespaces.is_empty() {
        all.push(format!(
            "({})",
            any_glob(
                &m.namespaces,
                "(has(request.namespace) ? request.namespace : '')"
            )
        ));
    }
    if let Some(s) = &m.namespace_selector {
        all.push(selector_cel(s, "namespaceObject.metadata"));
    }
    if let Some(s) = &m.pod_selector {
        all.push(selector_cel(s, "object.metadata"));
    }
    if all.is_empty() {
        return "true".into();
    }
    all.join(" && ")
}

/// A label selector on the labels of `meta` (an ObjectMeta in CEL), as Kubernetes reads it
/// (`profile::selects`): every pair and requirement hold; an empty selector selects all.
fn selector_cel(s: &LabelSelector, meta: &str) -> String {
    let has = |k: &str| format!("(has({meta}.labels) && {} in {meta}.labels)", lit(k));
    let value = |k: &str| format!("{meta}.labels[{}]", lit(k));
    let values = |vs: &[String]| {
        format!(
            "[{}]",
            vs.iter().map(|v| lit(v)).collect::<Vec<_>>().join(", ")
        )
    };
    let mut all = vec![];
    for (k, v) in s.match_labels.iter().flatten() {
        all.push(format!("({} && {} == {})", has(k), value(k), lit(v)));
    }
    for r in s.match_expressions.iter().flatten() {
        let vs = r.values.as_deref().unwrap_or_default();
        let k = r.key.as_str();
        all.push(match r.operator.as_str() {
            "In" => format!("({} && {} in {})", has(k), value(k), values(vs)),
            "NotIn" => format!("!({} && {} in {})", has(k), value(k), values(vs)),
            "Exists" => has(k),
            "DoesNotExist" => format!("!{}", has(k)),
            // The policy refuses any other operator at load.
            _ => "false".to_owned(),
        });
    }
    if all.is_empty() {
        return "true".into();
    }
    format!("({})", all.join(" && "))
}

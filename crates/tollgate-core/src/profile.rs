//! Which profile of the policy a pod gets: the first whose `match` fits, else the base.
//!
//! A profile matches on the pod's namespace (names and globs), the namespace's labels (from
//! the cluster context) and the pod's labels; every criterion it gives must hold. The
//! namespace is looked up only for a profile whose other criteria already hold, so a policy
//! that never matches on namespace labels never asks for one.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::cluster::{Cluster, Kind, Lookup, ObjectKey};
use crate::glob;
use crate::policy::{Policy, Profile};

/// The policy a pod gets, and what the choice ran into.
#[derive(Debug)]
pub struct Selected<'p> {
    pub policy: &'p Policy,
    /// The profile's name; None for the base policy.
    pub profile: Option<&'p str>,
    /// For the user: a profile skipped because the namespace's labels were not known.
    pub warning: Option<String>,
    /// The namespace, when the cluster context did not know it (the shell may fetch it).
    pub unresolved: Option<ObjectKey>,
}

/// The profile for a pod in `namespace` with `labels`.
pub fn select<'p>(
    policy: &'p Policy,
    namespace: &str,
    labels: Option<&BTreeMap<String, String>>,
    cluster: &dyn Cluster,
) -> Selected<'p> {
    let mut out = Selected {
        policy,
        profile: None,
        warning: None,
        unresolved: None,
    };
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    // Looked up at most once, and only if a profile needs it.
    let mut namespace_labels: Option<Lookup<Arc<Namespace>>> = None;
    for p in &policy.profiles {
        let Some(resolved) = p.policy() else { continue };
        match fits(p, namespace, labels, &mut namespace_labels, cluster) {
            Fit::Yes => {
                out.policy = resolved;
                out.profile = Some(&p.name);
                return out;
            }
            Fit::No => {}
            Fit::NamespaceUnknown => {
                if out.warning.is_none() {
                    out.warning = Some(format!(
                        "tollgate: the labels of namespace {namespace:?} are not known, so profile {:?} (which matches on them) was not applied",
                        p.name
                    ));
                    if !cluster.is_offline() {
                        out.unresolved = Some(ObjectKey {
                            kind: Kind::Namespace,
                            namespace: String::new(),
                            name: namespace.to_owned(),
                        });
                    }
                }
            }
        }
    }
    out
}

enum Fit {
    Yes,
    No,
    NamespaceUnknown,
}

fn fits(
    p: &Profile,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    namespace_labels: &mut Option<Lookup<Arc<Namespace>>>,
    cluster: &dyn Cluster,
) -> Fit {
    let m = &p.matches;
    if !m.namespaces.is_empty() && !glob::any(&m.namespaces, namespace) {
        return Fit::No;
    }
    if let Some(s) = &m.pod_selector {
        if !selects(s, labels) {
            return Fit::No;
        }
    }
    let Some(s) = &m.namespace_selector else {
        return Fit::Yes;
    };
    let looked_up = namespace_labels.get_or_insert_with(|| cluster.namespace(namespace));
    match looked_up {
        Lookup::Found(n) if selects(s, n.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())) => {
            Fit::Yes
        }
        Lookup::Found(_) => Fit::No,
        // A namespace that does not exist has no labels; only "does not exist" selectors
        // could hold, and a pod cannot be created there anyway.
        Lookup::Absent => Fit::No,
        Lookup::Unknown => Fit::NamespaceUnknown,
    }
}

/// Whether a Kubernetes label selector selects `labels`: every `matchLabels` pair and every
/// requirement hold. An empty selector selects everything.
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let pairs = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    pairs
        && selector.match_expressions.iter().flatten().all(|r| {
            let values = r.values.as_deref().unwrap_or_default();
            let value = labels.get(&r.key);
            match r.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                // The policy refuses any other operator at load.
                _ => false,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Objects;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn selector(v: serde_json::Value) -> LabelSelector {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn label_selectors_as_kubernetes_reads_them() {
        let l = labels(&[("team", "a"), ("tier", "gpu")]);
        assert!(selects(&selector(serde_json::json!({})), &l));
        assert!(selects(
            &selector(serde_json::json!({"matchLabels": {"team": "a"}})),
            &l
        ));
        assert!(!selects(
            &selector(serde_json::json!({"matchLabels": {"team": "b"}})),
            &l
        ));
        for (op, values, want) in [
            ("In", vec!["a", "b"], true),
            ("In", vec!["b"], false),
            ("NotIn", vec!["b"], true),
            ("NotIn", vec!["a"], false),
            ("Exists", vec![], true),
            ("DoesNotExist", vec![], false),
        ] {
            let s = selector(serde_json::json!({"matchExpressions": [
                {"key": "team", "operator": op, "values": values}
            ]}));
            assert_eq!(selects(&s, &l), want, "{op} {values:?}");
        }
        let missing = selector(serde_json::json!({"matchExpressions": [
            {"key": "owner", "operator": "NotIn", "values": ["x"]},
            {"key": "owner", "operator": "DoesNotExist"}
        ]}));
        assert!(
            selects(&missing, &l),
            "NotIn and DoesNotExist hold for an absent key"
        );
    }

    fn policy() -> Policy {
        Policy::from_text(
            "p.yaml",
            "profiles:
  - name: by-label
    match:
      namespaceSelector: {matchLabels: {team: a}}
    validation: {mode: warn}
  - name: by-name
    match:
      namespaces: [\"sandbox-*\"]
    validation: {mode: audit}
",
        )
        .unwrap()
    }

    #[test]
    fn first_match_wins_and_namespaces_are_looked_up_once() {
        let p = policy();
        let mut cluster = Objects::complete();
        let mut ns: Namespace = Default::default();
        ns.metadata.name = Some("sandbox-1".into());
        ns.metadata.labels = Some(labels(&[("team", "a")]));
        cluster.add_namespace(ns);
        let s = select(&p, "sandbox-1", None, &cluster);
        assert_eq!(s.profile, Some("by-label"));
        let s = select(&p, "sandbox-2", None, &cluster);
        assert_eq!(s.profile, Some("by-name"));
        let s = select(&p, "prod", None, &cluster);
        assert_eq!(s.profile, None);
        assert!(std::ptr::eq(s.policy, &p));
    }

    #[test]
    fn unknown_namespace_labels_skip_the_profile_and_say_so() {
        let p = policy();
        let s = select(&p, "sandbox-1", None, &Objects::default());
        assert_eq!(s.profile, Some("by-name"));
        assert!(s.warning.unwrap().contains("\"sandbox-1\""));
        assert_eq!(s.unresolved.unwrap().kind, Kind::Namespace);
    }
}

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
use serde_json::value::RawValue;

use crate::cluster::{Cluster, ContextKind, Lookup, ObjectKey};
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

/// A pod's labels: parsed, or as the JSON text they arrived in (the validation parse leaves
/// them so), parsed only if a profile selects pods.
#[derive(Debug, Clone, Copy)]
pub enum PodLabels<'a> {
    Parsed(Option<&'a BTreeMap<String, String>>),
    Raw(Option<&'a RawValue>),
}

/// Labels to select on: parsed ones, or their JSON text, read (once) only when a
/// selector asks for a key the text spells.
enum Readable<'a> {
    Parsed(Option<&'a BTreeMap<String, String>>),
    Text {
        text: &'a str,
        /// Whether the text holds an escape (then a key may be spelled otherwise).
        escaped: bool,
        read: std::cell::OnceCell<Read<'a>>,
    },
}

/// Labels read from text: borrowing it when no label needs unescaping.
enum Read<'a> {
    Borrowed(Pairs<'a>),
    Owned(BTreeMap<String, String>),
}

/// Labels borrowed from their JSON text, in their order: a handful of pairs searched in
/// place costs less than building a map of them.
struct Pairs<'a>(Vec<(&'a str, &'a str)>);

impl<'de> serde::Deserialize<'de> for Pairs<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Pairs<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of labels")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Pairs<'de>, A::Error> {
                let mut out = Vec::with_capacity(m.size_hint().unwrap_or(8));
                while let Some(pair) = m.next_entry::<&'de str, &'de str>()? {
                    out.push(pair);
                }
                Ok(Pairs(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

impl Pairs<'_> {
    /// The value of `key`; the last one, as a map would keep it, if the text repeats it.
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
    }
}

impl<'a> Readable<'a> {
    fn of(labels: PodLabels<'a>) -> Readable<'a> {
        match labels {
            PodLabels::Parsed(l) => Readable::Parsed(l),
            PodLabels::Raw(None) => Readable::Parsed(None),
            PodLabels::Raw(Some(raw)) => Readable::Text {
                text: raw.get(),
                escaped: raw.get().as_bytes().contains(&b'\\'),
                read: std::cell::OnceCell::new(),
            },
        }
    }
}

impl<'a> Read<'a> {
    fn of(text: &'a str) -> Read<'a> {
        match serde_json::from_str(text) {
            Ok(pairs) => Read::Borrowed(pairs),
            // A key or value with an escape cannot be borrowed.
            Err(_) => Read::Owned(serde_json::from_str(text).unwrap_or_default()),
        }
    }
}

/// What a label selector reads of a set of labels.
trait Labels {
    fn value(&self, key: &str) -> Option<&str>;
}

impl Labels for BTreeMap<String, String> {
    fn value(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl Labels for Readable<'_> {
    fn value(&self, key: &str) -> Option<&str> {
        match self {
            Readable::Parsed(l) => l.and_then(|l| l.get(key)).map(String::as_str),
            Readable::Text {
                text,
                escaped,
                read,
            } => {
                // Without an escape in the text, a key it does not spell is not one of the
                // labels: most pods lack the keys a profile selects on, and are not read.
                if !escaped && !text.contains(key) {
                    return None;
                }
                match read.get_or_init(|| Read::of(text)) {
                    Read::Borrowed(l) => l.get(key),
                    Read::Owned(l) => l.get(key).map(String::as_str),
                }
            }
        }
    }
}

/// The profile for a pod in `namespace` with `labels`.
pub fn select<'p>(
    policy: &'p Policy,
    namespace: &str,
    labels: PodLabels<'_>,
    cluster: &dyn Cluster,
) -> Selected<'p> {
    let mut out = Selected {
        policy,
        profile: None,
        warning: None,
        unresolved: None,
    };
    // Each read at most once, and only if a profile needs it.
    let mut pod_labels: Option<Readable<'_>> = None;
    let mut namespace_labels: Option<Lookup<Arc<Namespace>>> = None;
    for (i, p) in policy.profiles.iter().enumerate() {
        let Some(resolved) = p.policy() else { continue };
        let found = Found {
            pod: &mut pod_labels,
            namespace: &mut namespace_labels,
        };
        match fits(p, namespace, labels, found, cluster) {
            Fit::Yes => {
                out.policy = resolved;
                out.profile = Some(&p.name);
                in_namespace(policy, namespace, Some(i), &mut out);
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
                            kind: ContextKind::Namespace,
                            namespace: String::new(),
                            name: namespace.to_owned(),
                        });
                    }
                }
            }
        }
    }
    in_namespace(policy, namespace, None, &mut out);
    out
}

/// The namespace's TollgateProfile over what the cluster gives the pod (`profile`: the
/// index of the cluster profile chosen, None for the base), where the namespace has one.
fn in_namespace<'p>(
    policy: &'p Policy,
    namespace: &str,
    profile: Option<usize>,
    out: &mut Selected<'p>,
) {
    // Most clusters have no TollgateProfile: one look at an empty map.
    let namespaces = &policy.layers.namespaces;
    if namespaces.is_empty() {
        return;
    }
    let Some(n) = namespaces.get(namespace) else {
        return;
    };
    let resolved = match profile {
        None => Some(&n.over_base),
        Some(i) => n.over_profiles.get(i).and_then(Option::as_ref),
    };
    if let Some(r) = resolved {
        out.policy = &r.policy;
        out.profile = Some(&r.name);
    }
}

enum Fit {
    Yes,
    No,
    NamespaceUnknown,
}

/// What the profiles read so far, kept for the next.
struct Found<'s, 'a> {
    pod: &'s mut Option<Readable<'a>>,
    namespace: &'s mut Option<Lookup<Arc<Namespace>>>,
}

fn fits<'a>(
    p: &Profile,
    namespace: &str,
    labels: PodLabels<'a>,
    found: Found<'_, 'a>,
    cluster: &dyn Cluster,
) -> Fit {
    let m = &p.matches;
    if !m.namespaces.is_empty() && !glob::any(&m.namespaces, namespace) {
        return Fit::No;
    }
    if let Some(s) = &m.pod_selector {
        let readable = found.pod.get_or_insert_with(|| Readable::of(labels));
        if !selects_labels(s, readable) {
            return Fit::No;
        }
    }
    let Some(s) = &m.namespace_selector else {
        return Fit::Yes;
    };
    let looked_up = found
        .namespace
        .get_or_insert_with(|| cluster.namespace(namespace));
    let empty = BTreeMap::new();
    match looked_up {
        Lookup::Found(n) if selects(s, n.metadata.labels.as_ref().unwrap_or(&empty)) => Fit::Yes,
        Lookup::Found(_) => Fit::No,
        // A namespace that does not exist has no labels; only "does not exist" selectors
        // could hold, and a pod cannot be created there anyway.
        Lookup::Absent => Fit::No,
        Lookup::Unknown => Fit::NamespaceUnknown,
    }
}

/// Whether a Kubernetes label selector selects `labels`: every `matchLabels` pair and every
/// requirement hold. An empty selector selects everything.
pub(crate) fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    selects_labels(selector, labels)
}

fn selects_labels(selector: &LabelSelector, labels: &impl Labels) -> bool {
    let pairs = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.value(k) == Some(v.as_str()));
    pairs
        && selector.match_expressions.iter().flatten().all(|r| {
            let values = r.values.as_deref().unwrap_or_default();
            let value = labels.value(&r.key);
            match r.operator.as_str() {
                "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
                "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
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
    fn labels_read_from_text_are_the_labels_parsed() {
        let text = r#"{"app":"web","team":"a","app":"svc","esc\u0061ped":"x\"y","empty":""}"#;
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        let parsed: BTreeMap<String, String> = serde_json::from_str(text).unwrap();
        let read = Readable::of(PodLabels::Raw(Some(raw)));
        for key in ["app", "team", "escaped", "empty", "absent"] {
            assert_eq!(
                read.value(key),
                parsed.get(key).map(String::as_str),
                "{key}"
            );
        }
        let plain: &RawValue = serde_json::from_str(r#"{"app":"web","app":"svc"}"#).unwrap();
        let read = Readable::of(PodLabels::Raw(Some(plain)));
        assert_eq!(read.value("team"), None);
        assert!(
            matches!(&read, Readable::Text { read, .. } if read.get().is_none()),
            "a key the text does not spell is absent, without reading the labels"
        );
        assert_eq!(read.value("app"), Some("svc"), "the last of a repeated key");
        assert!(
            matches!(&read, Readable::Text { read, .. } if matches!(read.get(), Some(Read::Borrowed(_))))
        );
    }

    #[test]
    fn first_match_wins_and_namespaces_are_looked_up_once() {
        let p = policy();
        let mut cluster = Objects::complete();
        let mut ns: Namespace = Default::default();
        ns.metadata.name = Some("sandbox-1".into());
        ns.metadata.labels = Some(labels(&[("team", "a")]));
        cluster.add_namespace(ns);
        let s = select(&p, "sandbox-1", PodLabels::Parsed(None), &cluster);
        assert_eq!(s.profile, Some("by-label"));
        let s = select(&p, "sandbox-2", PodLabels::Parsed(None), &cluster);
        assert_eq!(s.profile, Some("by-name"));
        let s = select(&p, "prod", PodLabels::Parsed(None), &cluster);
        assert_eq!(s.profile, None);
        assert!(std::ptr::eq(s.policy, &p));
    }

    #[test]
    fn unknown_namespace_labels_skip_the_profile_and_say_so() {
        let p = policy();
        let s = select(
            &p,
            "sandbox-1",
            PodLabels::Parsed(None),
            &Objects::default(),
        );
        assert_eq!(s.profile, Some("by-name"));
        assert!(s.warning.unwrap().contains("\"sandbox-1\""));
        assert_eq!(s.unresolved.unwrap().kind, ContextKind::Namespace);
    }
}

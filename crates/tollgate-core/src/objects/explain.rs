//! Where each value of a policy in force came from: `tollgate policy`.
//!
//! A composed policy keeps its layers as written (`policy::Layers`): the file, the
//! TollgatePolicy's spec, each namespace's TollgateProfile. The layers a namespace's pods
//! get, from the bottom: the built-in policy, the file, the TollgatePolicy, then (for the
//! pods a cluster profile fits) that profile's sections, then the namespace's
//! TollgateProfile. Every layer is merged by one rule (a map merges key by key, anything
//! else replaces, `null` puts the built-in value back), so the layer that set a leaf last
//! is the last one that writes it or a map above it as something other than a map, or
//! writes the leaf itself; a `null` there gives it back to the built-in policy.
//!
//! The values shown are the policy in force's own (the resolved policy, serialised), not
//! the layers' text: what is explained is what judges the pods.

use serde_json::{Map, Value};

use super::PROFILE_KIND;
use crate::policy::{self, Policy};

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The built-in policy (`policies/default.yaml`).
    Builtin,
    /// The policy file: its path.
    File(String),
    /// The cluster's TollgatePolicy (`TollgatePolicy default`).
    Cluster(String),
    /// A profile of the cluster's policy: its name, and the layer that wrote the profiles
    /// (the file, or the TollgatePolicy).
    Profile { name: String, written_in: String },
    /// A namespace's TollgateProfile: `NAMESPACE/NAME`.
    Namespace(String),
}

impl Source {
    /// One word for the machine form: `builtin`, `file`, `tollgatePolicy`, `profile`,
    /// `tollgateProfile`.
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Builtin => "builtin",
            Source::File(_) => "file",
            Source::Cluster(_) => "tollgatePolicy",
            Source::Profile { .. } => "profile",
            Source::Namespace(_) => "tollgateProfile",
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Builtin => f.write_str("built-in"),
            Source::File(path) => write!(f, "file {path}"),
            Source::Cluster(name) => f.write_str(name),
            Source::Profile { name, written_in } => {
                write!(f, "profile {name} (in {written_in})")
            }
            Source::Namespace(object) => write!(f, "{PROFILE_KIND} {object}"),
        }
    }
}

/// One value of the policy in force, where it is and who set it.
#[derive(Debug, Clone, PartialEq)]
pub struct Leaf {
    /// The keys from the top (`["validation", "mode"]`).
    pub path: Vec<String>,
    /// A scalar, a list (a list is written whole), or an empty map.
    pub value: Value,
    pub source: Source,
}

impl Leaf {
    /// The path as the policy's errors write a field: `validation.mode`.
    pub fn dotted(&self) -> String {
        self.path.join(".")
    }
}

/// The policy in force for some pods, value by value.
#[derive(Debug, Clone, PartialEq)]
pub struct Explained {
    /// The name logs and `tollgate review` give the policy chosen (`base`, a cluster
    /// profile's name, `NAMESPACE/default`, `PROFILE+NAMESPACE/default`).
    pub name: String,
    /// The layers applied, from the bottom (the built-in policy first).
    pub layers: Vec<Source>,
    /// Every value, by key (a map's keys in order) under the keys above it.
    pub leaves: Vec<Leaf>,
}

/// Why a policy cannot be explained as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExplainError {
    #[error("the policy has no profile {name:?} (its profiles: {known})")]
    NoSuchProfile { name: String, known: String },
    #[error(
        "profile {profile:?} cannot match a pod of namespace {namespace:?} (its match.namespaces)"
    )]
    NotForNamespace { profile: String, namespace: String },
}

/// The policy the pods of `namespace` (None: a namespace without a TollgateProfile) get
/// under `profile` (a cluster profile's name; None: the base), and where each of its values
/// came from.
pub fn explain(
    policy: &Policy,
    namespace: Option<&str>,
    profile: Option<&str>,
) -> Result<Explained, ExplainError> {
    let layers = &policy.layers;
    let mut stack: Vec<(Source, Value)> = vec![];
    if let Some(f) = &layers.file {
        stack.push((Source::File(f.source.clone()), f.value.clone()));
    }
    if let Some(c) = &layers.cluster {
        stack.push((Source::Cluster(c.source.clone()), c.value.clone()));
    }
    let mut chosen: &Policy = policy;
    let mut name = policy::BASE_PROFILE.to_owned();
    let mut index = None;
    if let Some(wanted) = profile {
        let Some(i) = policy.profiles.iter().position(|p| p.name == wanted) else {
            return Err(ExplainError::NoSuchProfile {
                name: wanted.to_owned(),
                known: profile_names(policy),
            });
        };
        let p = &policy.profiles[i];
        if let Some(ns) = namespace {
            let names = &p.matches.namespaces;
            if !names.is_empty() && !crate::glob::any(names, ns) {
                return Err(ExplainError::NotForNamespace {
                    profile: wanted.to_owned(),
                    namespace: ns.to_owned(),
                });
            }
        }
        // The profiles are a list: the last layer that writes `profiles` wrote them all.
        let written_in = stack
            .iter()
            .rev()
            .find(|(_, v)| v.get("profiles").is_some())
            .map_or_else(|| Source::Builtin.to_string(), |(s, _)| s.to_string());
        let sections = stack
            .iter()
            .rev()
            .find_map(|(_, v)| v.pointer(&format!("/profiles/{i}")))
            .map_or_else(|| Value::Object(Map::new()), sections_of);
        stack.push((
            Source::Profile {
                name: p.name.clone(),
                written_in,
            },
            sections,
        ));
        if let Some(resolved) = p.policy() {
            chosen = resolved;
        }
        name.clone_from(&p.name);
        index = Some(i);
    }
    if let Some(n) = namespace.and_then(|ns| layers.namespaces.get(ns)) {
        let resolved = match index {
            None => Some(&n.over_base),
            Some(i) => n.over_profiles.get(i).and_then(Option::as_ref),
        };
        // Resolved over every profile that may match the namespace (checked above).
        if let Some(r) = resolved {
            stack.push((Source::Namespace(n.object.clone()), n.spec.clone()));
            chosen = &r.policy;
            name.clone_from(&r.name);
        }
    }
    let mut effective = serde_json::to_value(chosen).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut effective {
        // What a profile chooses among, not a value the pods get: the profiles are
        // explained one at a time (`profile`).
        m.remove("profiles");
    }
    let mut leaves = vec![];
    walk(&effective, &mut vec![], &stack, &mut leaves);
    let mut applied = vec![Source::Builtin];
    applied.extend(stack.into_iter().map(|(s, _)| s));
    Ok(Explained {
        name,
        layers: applied,
        leaves,
    })
}

fn profile_names(policy: &Policy) -> String {
    if policy.profiles.is_empty() {
        return "none".into();
    }
    policy
        .profiles
        .iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A profile as written, without what chooses its pods: its sections.
fn sections_of(profile: &Value) -> Value {
    let mut v = profile.clone();
    if let Value::Object(m) = &mut v {
        m.remove("name");
        m.remove("match");
    }
    v
}

fn walk(value: &Value, path: &mut Vec<String>, stack: &[(Source, Value)], out: &mut Vec<Leaf>) {
    match value {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                path.push(k.clone());
                walk(v, path, stack, out);
                path.pop();
            }
        }
        leaf => out.push(Leaf {
            path: path.clone(),
            value: leaf.clone(),
            source: source_of(path, stack),
        }),
    }
}

/// The last layer of `stack` that set `path`: wrote it, or a value other than a map above
/// it (which replaces all below); a `null` gives it back to the built-in policy.
fn source_of(path: &[String], stack: &[(Source, Value)]) -> Source {
    let mut found = Source::Builtin;
    for (source, written) in stack {
        let mut at = written;
        let mut set = None;
        for (depth, key) in path.iter().enumerate() {
            match at.get(key) {
                None => break,
                Some(Value::Null) => {
                    set = Some(Source::Builtin);
                    break;
                }
                Some(v) if depth + 1 == path.len() || !v.is_object() => {
                    set = Some(source.clone());
                    break;
                }
                Some(v) => at = v,
            }
        }
        if let Some(s) = set {
            found = s;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::objects::tests::stored;
    use crate::objects::{compose, file_layer, Candidate, Stored};

    fn composed(file: Option<&str>, cluster: Option<Value>, profiles: &[(&str, Value)]) -> Policy {
        let file = file.map(|t| file_layer("p.yaml", t).unwrap());
        let c = cluster.map(|v| stored("", v));
        let ps: Vec<Stored> = profiles
            .iter()
            .map(|(ns, v)| stored(ns, v.clone()))
            .collect();
        let cs: Vec<Candidate<'_>> = ps
            .iter()
            .map(|s| Candidate {
                stored: s,
                last_good: None,
            })
            .collect();
        let out = compose(
            file.as_ref(),
            c.as_ref().map(|s| Candidate {
                stored: s,
                last_good: None,
            }),
            &cs,
        )
        .unwrap();
        assert!(out.statuses.iter().all(|s| s.ready), "{:?}", out.statuses);
        out.policy
    }

    fn at<'e>(e: &'e Explained, dotted: &str) -> &'e Leaf {
        e.leaves
            .iter()
            .find(|l| l.dotted() == dotted)
            .unwrap_or_else(|| panic!("no leaf {dotted}"))
    }

    #[test]
    fn the_built_in_policy_is_all_built_in() {
        let e = explain(&Policy::builtin(), None, None).unwrap();
        assert_eq!(e.name, "base");
        assert_eq!(e.layers, vec![Source::Builtin]);
        assert!(e.leaves.len() > 20, "{}", e.leaves.len());
        assert!(e.leaves.iter().all(|l| l.source == Source::Builtin));
        assert_eq!(at(&e, "validation.mode").value, json!("enforce"));
        assert!(
            e.leaves.iter().all(|l| l.path[0] != "profiles"),
            "the profiles are chosen among, not explained as values"
        );
    }

    #[test]
    fn each_value_names_the_layer_that_set_it_last() {
        let p = composed(
            Some("validation:\n  requiredRequests: [cpu]\nfeasibility:\n  mode: enforce\n"),
            Some(
                json!({"validation": {"mode": "warn"}, "feasibility": {"mode": null},
                        "namespaceProfiles": {"mayLoosen": ["validation"]}}),
            ),
            &[(
                "team-a",
                json!({"validation": {"mode": "audit"},
                       "mutation": {"defaultResources": {"perGpu": {"memory": "128Gi"}}}}),
            )],
        );
        let base = explain(&p, None, None).unwrap();
        let cluster = Source::Cluster("TollgatePolicy default".into());
        assert_eq!(
            base.layers,
            vec![
                Source::Builtin,
                Source::File("p.yaml".into()),
                cluster.clone()
            ]
        );
        assert_eq!(at(&base, "validation.mode").source, cluster);
        assert_eq!(at(&base, "validation.mode").value, json!("warn"));
        assert_eq!(
            at(&base, "validation.requiredRequests").source,
            Source::File("p.yaml".into())
        );
        assert_eq!(
            at(&base, "feasibility.mode").source,
            Source::Builtin,
            "null gives it back to the built-in policy"
        );
        assert_eq!(at(&base, "namespaceProfiles.mayLoosen").source, cluster);
        assert_eq!(at(&base, "optOut.annotation").source, Source::Builtin);

        let ns = explain(&p, Some("team-a"), None).unwrap();
        let theirs = Source::Namespace("team-a/default".into());
        assert_eq!(ns.name, "team-a/default");
        assert_eq!(ns.layers.last(), Some(&theirs));
        assert_eq!(at(&ns, "validation.mode").source, theirs);
        assert_eq!(at(&ns, "validation.mode").value, json!("audit"));
        assert_eq!(
            at(&ns, "mutation.defaultResources.perGpu.memory").source,
            theirs
        );
        assert_eq!(
            at(&ns, "validation.requiredRequests").source,
            Source::File("p.yaml".into())
        );
        // Another namespace gets the cluster's policy.
        let other = explain(&p, Some("team-b"), None).unwrap();
        assert_eq!(other.name, "base");
        assert_eq!(at(&other, "validation.mode").source, cluster);
    }

    #[test]
    fn a_list_or_scalar_over_a_map_replaces_what_is_below() {
        let p = composed(
            Some("gpu:\n  classes:\n    amd: null\n"),
            Some(json!({"mutation": {"metricsSidecar": {"container": {"args": ["--x"]}}}})),
            &[],
        );
        let e = explain(&p, None, None).unwrap();
        assert_eq!(
            at(&e, "mutation.metricsSidecar.container.args").source,
            Source::Cluster("TollgatePolicy default".into())
        );
        assert_eq!(
            at(&e, "mutation.metricsSidecar.container.name").source,
            Source::Builtin
        );
        let amd: Vec<&Leaf> = e
            .leaves
            .iter()
            .filter(|l| l.dotted().starts_with("gpu.classes.amd."))
            .collect();
        assert!(!amd.is_empty());
        assert!(
            amd.iter().all(|l| l.source == Source::Builtin),
            "a null in the file is the built-in value: {amd:?}"
        );
    }

    #[test]
    fn a_cluster_profile_and_a_namespace_profile_over_it() {
        let p = composed(
            None,
            Some(json!({"profiles": [
                {"name": "gpu-pool", "match": {"namespaces": ["team-*"]},
                 "validation": {"mode": "warn"}, "feasibility": {"mode": "warn"}}
            ]})),
            &[("team-a", json!({"feasibility": {"mode": "enforce"}}))],
        );
        let profile = Source::Profile {
            name: "gpu-pool".into(),
            written_in: "TollgatePolicy default".into(),
        };
        let e = explain(&p, None, Some("gpu-pool")).unwrap();
        assert_eq!(e.name, "gpu-pool");
        assert_eq!(at(&e, "validation.mode").source, profile);
        let e = explain(&p, Some("team-a"), Some("gpu-pool")).unwrap();
        assert_eq!(e.name, "gpu-pool+team-a/default");
        assert_eq!(at(&e, "validation.mode").source, profile);
        assert_eq!(at(&e, "validation.mode").value, json!("warn"));
        assert_eq!(
            at(&e, "feasibility.mode").source,
            Source::Namespace("team-a/default".into())
        );
        assert_eq!(
            e.layers.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "built-in",
                "TollgatePolicy default",
                "profile gpu-pool (in TollgatePolicy default)",
                "TollgateProfile team-a/default"
            ]
        );
        assert_eq!(
            explain(&p, Some("prod"), Some("gpu-pool")),
            Err(ExplainError::NotForNamespace {
                profile: "gpu-pool".into(),
                namespace: "prod".into()
            })
        );
        assert!(matches!(
            explain(&p, None, Some("nope")),
            Err(ExplainError::NoSuchProfile { .. })
        ));
    }
}

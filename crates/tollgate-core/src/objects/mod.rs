//! The policy as Kubernetes objects: the cluster's TollgatePolicy and each namespace's
//! TollgateProfile (`tollgate.dev/v1alpha1`), composed with the policy file into the policy
//! in force.
//!
//! The layers, from the bottom: the built-in policy, the file (`--policy`), the
//! TollgatePolicy `default`'s spec (merged over the file by the rule the file follows over
//! the built-in policy), then for the pods of a namespace with a TollgateProfile `default`
//! its sections, over what the cluster gives those pods (the base, or the cluster profile
//! they match), within the bounds (`bounds`) the TollgatePolicy's
//! `namespaceProfiles.mayLoosen` widens.
//!
//! Composing never fails for an object: an object that does not load (stored while
//! tollgate's webhook was not there to refuse it) leaves its last good spec in force, or
//! none, and says why in its status ([`ObjectStatus`]); only a broken file fails, and the
//! shell has refused that already. The webhook's review of the objects ([`review`]) is the
//! same composition, refusing what the status would report.

pub(crate) mod bounds;
pub(crate) mod crd;
pub(crate) mod explain;

use std::collections::BTreeMap;

use serde_json::Value;

use crate::glob;
use crate::policy::{
    self, NamespaceProfile, Policy, PolicyError, Resolved, Written, BUILTIN_SOURCE,
};

pub const GROUP: &str = "tollgate.dev";
pub const VERSION: &str = "v1alpha1";
pub const POLICY_KIND: &str = "TollgatePolicy";
pub const PROFILE_KIND: &str = "TollgateProfile";
pub const POLICY_PLURAL: &str = "tollgatepolicies";
pub const PROFILE_PLURAL: &str = "tollgateprofiles";
/// The one name either kind may have: the cluster has one policy, a namespace one profile.
pub const NAME: &str = "default";

/// The keys a TollgateProfile's spec may hold: a profile's sections.
const PROFILE_SECTIONS: [&str; 7] = [
    "gpu",
    "selection",
    "optOut",
    "mutation",
    "validation",
    "workloads",
    "feasibility",
];

/// A TollgatePolicy or TollgateProfile as stored: where, which generation, its spec.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// Empty for the cluster-scoped TollgatePolicy.
    pub namespace: String,
    pub name: String,
    pub generation: Option<i64>,
    pub spec: Value,
}

impl Stored {
    /// The object as kubectl names it: `TollgatePolicy default`, `TollgateProfile ns/default`.
    pub fn source(&self) -> String {
        source(&self.namespace, &self.name)
    }

    /// An object read from the cluster (or a file): its metadata and spec, as JSON.
    pub fn from_object(object: &Value) -> Stored {
        let (namespace, name) = crate::cluster::namespace_and_name(object);
        Stored {
            namespace,
            name,
            generation: object
                .get("metadata")
                .and_then(|m| m.get("generation"))
                .and_then(Value::as_i64),
            spec: object
                .get("spec")
                .cloned()
                .unwrap_or_else(|| Value::Object(Default::default())),
        }
    }
}

/// An object as kubectl names it, by where it is: `TollgatePolicy default` (cluster-scoped,
/// no namespace), `TollgateProfile ns/default`.
pub(crate) fn source(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        format!("{POLICY_KIND} {name}")
    } else {
        format!("{PROFILE_KIND} {namespace}/{name}")
    }
}

/// An object to compose, and the spec last in force for it (kept by the shell across
/// compositions), which stays in force if this one does not load.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub stored: &'a Stored,
    pub last_good: Option<&'a Value>,
}

/// What became of an object: what its status says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectStatus {
    pub namespace: String,
    pub name: String,
    pub generation: Option<i64>,
    /// The `Ready` condition: True when this generation's spec is in force.
    pub ready: bool,
    /// `InForce`, `Invalid`, `OutOfBounds` or `NotDefault`.
    pub reason: &'static str,
    /// One line for `kubectl get` and the log.
    pub message: String,
    /// Which spec is in force for the object.
    pub in_force: InForce,
}

impl ObjectStatus {
    /// The object as kubectl names it: `TollgateProfile team-a/default`.
    pub fn source(&self) -> String {
        source(&self.namespace, &self.name)
    }
}

/// Which spec of an object a composition applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InForce {
    /// This generation's.
    Current,
    /// The last good one, over this generation's, which does not load.
    LastGood,
    /// None: the object does not load and none before it did.
    Nothing,
}

/// The policy in force, and what became of each object.
#[derive(Debug)]
pub struct Composed {
    pub policy: Policy,
    pub statuses: Vec<ObjectStatus>,
}

/// A file's text as a layer: its source (the path) and what it holds as written.
pub fn file_layer(source: &str, text: &str) -> Result<Written, PolicyError> {
    Ok(Written {
        source: source.to_owned(),
        value: Policy::written(source, text)?,
    })
}

/// The policy in force: the file (None: the built-in policy), the cluster's TollgatePolicy
/// and the namespaces' TollgateProfiles. Fails only if the file does not load.
pub fn compose(
    file: Option<&Written>,
    cluster: Option<Candidate<'_>>,
    profiles: &[Candidate<'_>],
) -> Result<Composed, PolicyError> {
    let file_value = file.map_or_else(|| Value::Object(Default::default()), |f| f.value.clone());
    let file_source = file.map_or(BUILTIN_SOURCE, |f| f.source.as_str());
    let mut policy = Policy::from_written(file_source, &file_value)?;
    let mut statuses = Vec::new();
    let mut written = file_value;
    let mut cluster_layer = None;
    if let Some(c) = cluster {
        let (status, loaded) = first_good(c, |spec| cluster_policy(&written, c.stored, spec));
        if let Some((p, w, spec)) = loaded {
            policy = p;
            written = w;
            cluster_layer = Some(Written {
                source: c.stored.source(),
                value: spec,
            });
        }
        statuses.push(status);
    }
    policy.layers.file = file.cloned();
    policy.layers.cluster = cluster_layer;
    let mut namespaces = BTreeMap::new();
    for c in profiles {
        let (status, loaded) = first_good(*c, |spec| {
            namespace_profile(&policy, &written, c.stored, spec)
        });
        if let Some(n) = loaded {
            namespaces.insert(c.stored.namespace.clone(), n);
        }
        statuses.push(status);
    }
    policy.layers.namespaces = namespaces;
    Ok(Composed { policy, statuses })
}

/// The object's spec if it loads, else its last good one: the status says which, and why.
fn first_good<T>(
    c: Candidate<'_>,
    load: impl Fn(&Value) -> Result<T, Refused>,
) -> (ObjectStatus, Option<T>) {
    let s = c.stored;
    let mut status = ObjectStatus {
        namespace: s.namespace.clone(),
        name: s.name.clone(),
        generation: s.generation,
        ready: true,
        reason: "InForce",
        message: String::new(),
        in_force: InForce::Current,
    };
    let why = match load(&s.spec) {
        Ok(t) => {
            status.message = if s.namespace.is_empty() {
                "in force: the cluster's policy".to_owned()
            } else {
                format!(
                    "in force for the pods and workloads of namespace {}",
                    s.namespace
                )
            };
            return (status, Some(t));
        }
        Err(why) => why,
    };
    status.ready = false;
    status.reason = why.reason;
    let (fallback, then) = match c.last_good.filter(|g| *g != &s.spec).map(&load) {
        Some(Ok(t)) => (Some(t), "the last good spec stays in force"),
        _ if s.namespace.is_empty() => {
            (None, "the policy file (or the built-in policy) is in force")
        }
        _ => (None, "the namespace gets the cluster's policy"),
    };
    status.in_force = if fallback.is_some() {
        InForce::LastGood
    } else {
        InForce::Nothing
    };
    status.message = format!("{}; {then}", why.message);
    (status, fallback)
}

/// Why an object does not load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub reason: &'static str,
    /// One line, naming the object and the field.
    pub message: String,
}

impl Refused {
    fn invalid(e: PolicyError) -> Refused {
        Refused {
            reason: "Invalid",
            message: e.to_string(),
        }
    }
}

fn name_is_default(s: &Stored) -> Result<(), Refused> {
    if s.name == NAME {
        return Ok(());
    }
    let what = if s.namespace.is_empty() {
        format!("the cluster has one {POLICY_KIND}, named {NAME:?}")
    } else {
        format!("a namespace has one {PROFILE_KIND}, named {NAME:?}")
    };
    Err(Refused {
        reason: "NotDefault",
        message: format!(
            "{}: {what}; this one is named {:?} and is not applied",
            s.source(),
            s.name
        ),
    })
}

/// An error of a layer merged over others, named as the object's: `spec.` before the field.
fn as_object_error(e: PolicyError, source: &str) -> PolicyError {
    match e {
        PolicyError::Field { field, message, .. } => PolicyError::Field {
            file: source.to_owned(),
            field: format!("spec.{field}"),
            message,
        },
        PolicyError::Syntax { message, .. } => PolicyError::Syntax {
            file: source.to_owned(),
            message,
        },
    }
}

/// The cluster's policy with the TollgatePolicy's `spec` over the file as written: the
/// policy, the layers as written together, and the spec.
fn cluster_policy(
    file: &Value,
    stored: &Stored,
    spec: &Value,
) -> Result<(Policy, Value, Value), Refused> {
    name_is_default(stored)?;
    let source = stored.source();
    if !spec.is_object() {
        return Err(Refused::invalid(PolicyError::Field {
            file: source,
            field: "spec".into(),
            message: "expected a map of the policy's sections".into(),
        }));
    }
    let written = policy::merge_written(file, spec);
    let p = Policy::from_written(&source, &written)
        .map_err(|e| Refused::invalid(as_object_error(e, &source)))?;
    Ok((p, written, spec.clone()))
}

/// A namespace's TollgateProfile resolved over the cluster's policy (`cluster`, with
/// `written`, its layers as written together): over the base and each cluster profile that
/// may match a pod of the namespace, each checked and held to the bounds.
fn namespace_profile(
    cluster: &Policy,
    written: &Value,
    stored: &Stored,
    spec: &Value,
) -> Result<NamespaceProfile, Refused> {
    name_is_default(stored)?;
    let source = stored.source();
    let object = format!("{}/{}", stored.namespace, stored.name);
    let Value::Object(sections) = spec else {
        return Err(Refused::invalid(PolicyError::Field {
            file: source,
            field: "spec".into(),
            message: "expected a map of a profile's sections".into(),
        }));
    };
    if let Some(k) = sections
        .keys()
        .find(|k| !PROFILE_SECTIONS.contains(&k.as_str()))
    {
        return Err(Refused::invalid(PolicyError::Field {
            file: source,
            field: format!("spec.{k}"),
            message: format!(
                "not a section a TollgateProfile holds (it holds {})",
                PROFILE_SECTIONS.join(", ")
            ),
        }));
    }
    let may_loosen = &cluster.namespace_profiles.may_loosen;
    let resolve = |layers: &[&Value], over: &Policy, over_name: &str, name: String| {
        let p = Policy::resolve_checked(&source, written, layers)
            .map_err(|e| Refused::invalid(as_object_error(e, &source)))?;
        bounds::check(over, &p, may_loosen).map_err(|c| out_of_bounds(&source, over_name, &c))?;
        Ok::<_, Refused>(Resolved {
            name,
            policy: Box::new(p),
        })
    };
    let over_base = resolve(&[spec], cluster, "the cluster's policy", object.clone())?;
    let mut over_profiles = Vec::with_capacity(cluster.profiles.len());
    for (i, p) in cluster.profiles.iter().enumerate() {
        let (Some(resolved), Some(theirs)) =
            (p.policy(), written.pointer(&format!("/profiles/{i}")))
        else {
            over_profiles.push(None);
            continue;
        };
        let names = &p.matches.namespaces;
        if !names.is_empty() && !glob::any(names, &stored.namespace) {
            over_profiles.push(None);
            continue;
        }
        let over_name = format!("the cluster's profile {:?}", p.name);
        over_profiles.push(Some(resolve(
            &[theirs, spec],
            resolved,
            &over_name,
            format!("{}+{object}", p.name),
        )?));
    }
    Ok(NamespaceProfile {
        object,
        spec: spec.clone(),
        over_base,
        over_profiles,
    })
}

fn out_of_bounds(source: &str, over: &str, c: &bounds::Crossed) -> Refused {
    Refused {
        reason: "OutOfBounds",
        message: format!(
            "{source}: field `spec.{}`: crosses a bound of {over}: {}. The {POLICY_KIND} may allow it: spec.namespaceProfiles.mayLoosen: [{}]",
            c.field,
            c.bound,
            c.section.key()
        ),
    }
}

/// The webhook's word on a TollgatePolicy or TollgateProfile being applied, under the
/// policy in force: refused (why), or allowed with warnings (a TollgatePolicy under whose
/// bounds a namespace's profile would no longer be applied).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ObjectVerdict {
    pub refusal: Option<String>,
    pub warnings: Vec<String>,
}

/// Judges `object` (a TollgatePolicy or TollgateProfile, as the review carries it) as it
/// would be composed with what `policy` (the policy in force) was made of.
pub(crate) fn review(policy: &Policy, kind: &str, object: &Value) -> ObjectVerdict {
    let stored = Stored::from_object(object);
    let mut verdict = ObjectVerdict::default();
    let layers = &policy.layers;
    let file_value = layers
        .file
        .as_ref()
        .map_or_else(|| Value::Object(Default::default()), |f| f.value.clone());
    match kind {
        POLICY_KIND => {
            let stored = Stored {
                namespace: String::new(),
                ..stored
            };
            let Ok((cluster, written, _)) = cluster_policy(&file_value, &stored, &stored.spec)
                .map_err(|r| {
                    verdict.refusal = Some(r.message);
                })
            else {
                return verdict;
            };
            for (ns, n) in &layers.namespaces {
                let theirs = Stored {
                    namespace: ns.clone(),
                    name: NAME.into(),
                    generation: None,
                    spec: n.spec.clone(),
                };
                if let Err(r) = namespace_profile(&cluster, &written, &theirs, &n.spec) {
                    verdict.warnings.push(format!(
                        "{PROFILE_KIND} {}/{NAME} would no longer be applied under this policy (its namespace gets the cluster's policy): {}",
                        ns, r.message
                    ));
                }
            }
        }
        PROFILE_KIND => {
            let mut written = file_value;
            if let Some(c) = &layers.cluster {
                written = policy::merge_written(&written, &c.value);
            }
            if let Err(r) = namespace_profile(policy, &written, &stored, &stored.spec) {
                verdict.refusal = Some(r.message);
            }
        }
        _ => {}
    }
    verdict
}

#[cfg(test)]
pub(crate) mod tests;

//! The policy as the commands read it outside the server: the file (`--policy`) and the
//! TollgatePolicy and TollgateProfiles (`tollgate.dev/v1alpha1`) found in their input,
//! composed by the engine (`compose_policy`) as the server composes the watched ones.
//!
//! A command has no last good spec of an object (the server keeps it, across its own
//! compositions): an object that does not load is not applied, and its status says so.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use tollgate_core::{
    compose_policy, Candidate, Composed, InForce, ObjectStatus, Stored, Written, POLICY_GROUP,
    POLICY_KIND, POLICY_VERSION, PROFILE_KIND,
};

/// Whether `doc` is a TollgatePolicy or TollgateProfile of the served version.
pub fn is_policy_object(doc: &Value) -> bool {
    let api = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
    api.split_once('/') == Some((POLICY_GROUP, POLICY_VERSION))
        && matches!(kind, POLICY_KIND | PROFILE_KIND)
}

/// The TollgatePolicy and TollgateProfiles of an input, each with where it was read; a
/// later one replaces an earlier one of the same name, as a later `kubectl apply` does.
#[derive(Debug, Default)]
pub struct PolicyObjects {
    pub cluster: Option<(String, Stored)>,
    /// By namespace and name.
    pub profiles: BTreeMap<(String, String), (String, Stored)>,
}

impl PolicyObjects {
    /// Takes `doc` if it is one of the two kinds; false otherwise.
    pub fn add(&mut self, origin: &str, doc: &Value) -> bool {
        if !is_policy_object(doc) {
            return false;
        }
        let mut stored = Stored::from_object(doc);
        if doc.get("kind").and_then(Value::as_str) == Some(POLICY_KIND) {
            // Cluster-scoped: a namespace written on it is not the object's.
            stored.namespace.clear();
            self.cluster = Some((origin.to_owned(), stored));
        } else {
            let key = (stored.namespace.clone(), stored.name.clone());
            self.profiles.insert(key, (origin.to_owned(), stored));
        }
        true
    }

    /// `other`'s objects over these: what an input says replaces what a saved cluster
    /// state (or the cluster) holds.
    pub fn overlay(&mut self, other: PolicyObjects) {
        if other.cluster.is_some() {
            self.cluster = other.cluster;
        }
        self.profiles.extend(other.profiles);
    }

    /// Where the object a status is about was read.
    pub fn origin(&self, status: &ObjectStatus) -> Option<&str> {
        if status.namespace.is_empty() {
            return self.cluster.as_ref().map(|(o, _)| o.as_str());
        }
        self.profiles
            .get(&(status.namespace.clone(), status.name.clone()))
            .map(|(o, _)| o.as_str())
    }
}

/// `--policy FILE` as a layer (None: the built-in policy); an error is the one line to show.
pub fn file_layer(path: Option<&Path>) -> Result<Option<Written>, String> {
    let Some(path) = path else { return Ok(None) };
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    tollgate_core::file_layer(&path.display().to_string(), &text)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The file and the objects composed into the policy in force, with each object's status.
pub fn compose(file: Option<&Written>, found: &PolicyObjects) -> Result<Composed, String> {
    fn candidate(s: &Stored) -> Candidate<'_> {
        Candidate {
            stored: s,
            last_good: None,
        }
    }
    let cluster = found.cluster.as_ref().map(|(_, s)| s);
    let profiles: Vec<Candidate<'_>> = found.profiles.values().map(|(_, s)| candidate(s)).collect();
    compose_policy(file, cluster.map(candidate), &profiles).map_err(|e| e.to_string())
}

/// A status in the machine form of the commands' JSON output.
pub fn status_json(s: &ObjectStatus) -> Value {
    serde_json::json!({
        "kind": if s.namespace.is_empty() { POLICY_KIND } else { PROFILE_KIND },
        "apiVersion": format!("{POLICY_GROUP}/{POLICY_VERSION}"),
        "namespace": s.namespace,
        "name": s.name,
        "ready": s.ready,
        "reason": s.reason,
        "message": s.message,
        "inForce": match s.in_force {
            InForce::Current => "current",
            InForce::LastGood => "lastGood",
            InForce::Nothing => "nothing",
        },
    })
}

/// The exit status of a command that could not read the policy in force (the cluster's
/// TollgatePolicy, forbidden to the user): neither a verdict (0, 1) nor unusable input
/// (2), so that a script tells "not judged" from "judged".
pub const UNREADABLE_POLICY: i32 = 3;

/// Where the TollgatePolicy and TollgateProfiles a command composed came from, as its
/// output says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectsFrom {
    /// The cluster at this URL (and the files given over it, if any).
    Cluster(String),
    /// The files given alone: `--local`, or no kubeconfig.
    Files,
}

impl std::fmt::Display for ObjectsFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ObjectsFrom::Cluster(url) => write!(f, "the cluster at {url}"),
            ObjectsFrom::Files => f.write_str("the files given (no cluster read)"),
        }
    }
}

/// The cluster's TollgatePolicy and the TollgateProfiles of `scope`, as the user may read
/// them: the objects, and the kinds forbidden to them ([`unreadable_policy`] says what a
/// command does then). Where the cluster does not serve the kinds, none.
pub async fn from_cluster(
    client: kube::Client,
    url: &str,
    scope: &crate::audit::Namespaces,
) -> Result<(PolicyObjects, Vec<crate::audit::list::Unread>), String> {
    let auditor = crate::audit::Auditor::new(client, url.to_owned());
    let (listed, unread) = crate::audit::list::policy_objects(&auditor, scope)
        .await
        .map_err(|e| e.to_string())?;
    let mut found = PolicyObjects::default();
    for object in &listed {
        found.add("the cluster", object);
    }
    Ok((found, unread))
}

/// The line to say where the cluster's TollgatePolicy may not be read and none was given
/// (`given`): its bounds are what every profile must meet and its values what every pod
/// gets, so a verdict without it would be one against the built-in policy, not the
/// cluster's. None where it was read (or given).
pub fn unreadable_policy(
    unread: &[crate::audit::list::Unread],
    given: &PolicyObjects,
    local_hint: bool,
) -> Option<String> {
    if given.cluster.is_some() {
        return None;
    }
    let why = unread.iter().find(|u| u.kind == POLICY_KIND)?;
    Some(format!(
        "could not read the cluster's TollgatePolicy: forbidden: {}; without it this would \
         judge by the built-in policy, not the cluster's, so it does not. Ask for the \
         ClusterRole tollgate-policy-viewer (deploy/base/rbac.yaml binds it to every \
         authenticated user) or give the policy with -f{}",
        why.why,
        if local_hint {
            ", or pass --local to use the files alone"
        } else {
            ""
        }
    ))
}

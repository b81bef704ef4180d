//! Discovery: `/version`, `/api`, `/apis` and each group version's resource list, for the
//! resources a test registers.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::store::State;

pub(crate) fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "36",
        "emulationMajor": "1",
        "emulationMinor": "36",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "35",
        "gitVersion": "v1.36.0-standin",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`: the core group's one version.
pub(crate) fn core_versions(addr: SocketAddr) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr.to_string()}],
    })
}

pub(crate) fn group_list(st: &State) -> Value {
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in st.resources.iter().filter(|r| !r.ty.group.is_empty()) {
        let versions = groups.entry(&r.ty.group).or_default();
        if !versions.contains(&r.ty.version.as_str()) {
            versions.push(&r.ty.version);
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, vs)| {
            let versions: Vec<Value> = vs
                .iter()
                .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                .collect();
            json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub(crate) fn resource_list(st: &State, group: &str, version: &str) -> Value {
    let resources: Vec<Value> = st
        .resources
        .iter()
        .filter(|r| r.ty.group == group && r.ty.version == version)
        .map(|r| {
            json!({
                "name": r.ty.plural,
                "singularName": r.ty.kind.to_lowercase(),
                "namespaced": r.ty.namespaced,
                "kind": r.ty.kind,
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            })
        })
        .collect();
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

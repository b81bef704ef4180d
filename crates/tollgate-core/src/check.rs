//! Checks that a pod is one the apiserver accepts, in the respects tollgate's mutations can
//! affect. Used by the tests, property tests and fuzzing on every mutated pod.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Pod;

use crate::pod::containers;
use crate::quantity;

/// Every problem found; empty means valid.
pub fn problems(pod: &Pod) -> Vec<String> {
    let mut out = vec![];
    let Some(spec) = pod.spec.as_ref() else {
        return out;
    };
    let mut names = HashSet::new();
    let volumes: HashSet<&str> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    let mut volume_names = HashSet::new();
    for v in spec.volumes.iter().flatten() {
        if !volume_names.insert(v.name.as_str()) {
            out.push(format!("volume {:?} appears twice", v.name));
        }
    }
    for (_, c) in containers(spec) {
        if !names.insert(c.name.as_str()) {
            out.push(format!("container name {:?} appears twice", c.name));
        }
        let mut ports = HashSet::new();
        for p in c.ports.iter().flatten() {
            if let Some(n) = &p.name {
                if !ports.insert(n.as_str()) {
                    out.push(format!(
                        "container {:?}: port name {n:?} appears twice",
                        c.name
                    ));
                }
            }
        }
        let mut paths = HashSet::new();
        for m in c.volume_mounts.iter().flatten() {
            if !volumes.contains(m.name.as_str()) {
                out.push(format!(
                    "container {:?} mounts unknown volume {:?}",
                    c.name, m.name
                ));
            }
            if !paths.insert(m.mount_path.as_str()) {
                out.push(format!(
                    "container {:?}: mount path {:?} appears twice",
                    c.name, m.mount_path
                ));
            }
        }
        let mut env = HashSet::new();
        for e in c.env.iter().flatten() {
            if !env.insert(e.name.as_str()) {
                out.push(format!(
                    "container {:?}: env {:?} appears twice",
                    c.name, e.name
                ));
            }
        }
        let Some(res) = c.resources.as_ref() else {
            continue;
        };
        let limits = res.limits.as_ref();
        for (k, req) in res.requests.iter().flatten() {
            let Some(lim) = limits.and_then(|l| l.get(k)) else {
                if quantity::is_non_overcommittable(k) {
                    out.push(format!(
                        "container {:?}: {k} requested without a limit",
                        c.name
                    ));
                }
                continue;
            };
            let (Ok(r), Ok(l)) = (quantity::parse(&req.0), quantity::parse(&lim.0)) else {
                continue;
            };
            if l < r {
                out.push(format!(
                    "container {:?}: {k} limit {} below request {}",
                    c.name, lim.0, req.0
                ));
            }
            if quantity::is_non_overcommittable(k) && l != r {
                out.push(format!(
                    "container {:?}: {k} request {} differs from limit {}",
                    c.name, req.0, lim.0
                ));
            }
        }
    }
    out
}

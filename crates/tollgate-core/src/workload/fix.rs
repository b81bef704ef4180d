//! The one fix a workload's template gets: the limits the apiserver requires of the
//! template itself that tollgate's pod mutation would give its pods anyway.
//!
//! The apiserver validates the pod template of a built-in workload (a Job, a CronJob's job
//! template, the apps kinds) as a pod, after the mutating webhooks and before any
//! validating one (`apivalidation`). A template that requests a non-overcommitable resource
//! (a GPU, hugepages) without a limit is refused there, although the pods it would make get
//! that limit from tollgate's default-resources step: so the mutating webhook writes into
//! the template exactly those limits (its pods' limit = their request), and, for a
//! container with hugepages but neither cpu nor memory (refused: "HugePages require cpu or
//! memory"), the cpu and memory limits its pods would get. Nothing else: every other step
//! stays at the pod, so that a GitOps tool sees as little drift as there can be
//! (docs/gitops.md). Written only where missing, so a second pass changes nothing.
//!
//! Kinds of CustomResourceDefinitions (a PyTorchJob, a JobSet, a LeaderWorkerSet) are not
//! validated as pods by the apiserver: their templates are left as written. The built-in
//! objects their controllers make (a JobSet's Jobs, a LeaderWorkerSet's StatefulSets) are
//! validated, and get the fix when they are created, whoever creates them.
//!
//! What the pods would not get (their opt-out is honoured, they are no training pods, the
//! step is off) is not written: the mutating webhook says, in the apiserver's words and
//! with the YAML to add, what the apiserver will refuse.

use serde_json::{json, Map, Value};

use crate::apivalidation::{self, FieldError};
use crate::mutate::{Added, Report};
use crate::policy::WorkloadKind;
use crate::quantity;

/// Whether the apiserver validates this kind's templates as pods: the kinds of its own
/// groups (core, batch, apps).
pub(super) fn validated_by_apiserver(kind: &WorkloadKind) -> bool {
    matches!(kind.group.as_str(), "" | "batch" | "apps")
}

/// A limit given to a container of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Given {
    /// `initContainers` or `containers`, and the index there.
    list: &'static str,
    index: usize,
    container: String,
    resource: String,
    value: String,
    /// Why: the limit its request needs (a non-overcommitable resource), or the cpu or
    /// memory its hugepages need.
    for_hugepages: bool,
}

/// The limits template `template` needs for the apiserver that its pods get from the
/// mutation `report` (what the pod mutation added to a pod made from it).
pub(super) fn limits_to_give(template: &Value, report: &Report) -> Vec<Given> {
    let mut out = vec![];
    let added = |container: &str, resource: &str| {
        report.added.iter().find_map(|(_, a)| match a {
            Added::Limit {
                container: c,
                resource: r,
                value,
            } if c == container && r == resource => Some(value.clone()),
            _ => None,
        })
    };
    for list in ["initContainers", "containers"] {
        let Some(containers) = template
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
        else {
            continue;
        };
        for (index, c) in containers.iter().enumerate() {
            let name = c.get("name").and_then(Value::as_str).unwrap_or("");
            let map = |k: &str| {
                c.pointer(&format!("/resources/{k}"))
                    .and_then(Value::as_object)
            };
            let (requests, limits) = (map("requests"), map("limits"));
            let has_limit = |r: &str| limits.is_some_and(|l| l.contains_key(r));
            let mut give = |resource: &str, for_hugepages: bool| {
                if let Some(value) = added(name, resource) {
                    out.push(Given {
                        list,
                        index,
                        container: name.to_owned(),
                        resource: resource.to_owned(),
                        value,
                        for_hugepages,
                    });
                }
            };
            for (resource, q) in requests.into_iter().flatten() {
                let readable = q.as_str().is_some_and(|q| quantity::parse(q).is_ok());
                if quantity::is_non_overcommittable(resource) && !has_limit(resource) && readable {
                    give(resource, false);
                }
            }
            let names = || {
                requests
                    .into_iter()
                    .chain(limits)
                    .flat_map(Map::keys)
                    .map(String::as_str)
            };
            if names().any(|n| n.starts_with("hugepages-"))
                && !names().any(|n| n == "cpu" || n == "memory")
            {
                give("cpu", true);
                give("memory", true);
            }
        }
    }
    out
}

/// Writes the limits `given` into `template`.
pub(super) fn give(template: &mut Value, given: &[Given]) {
    for g in given {
        let Some(c) = template
            .pointer_mut(&format!("/spec/{}/{}", g.list, g.index))
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        let resources = c.entry("resources").or_insert_with(|| json!({}));
        let Some(resources) = resources.as_object_mut() else {
            continue;
        };
        let limits = resources.entry("limits").or_insert_with(|| json!({}));
        if let Some(limits) = limits.as_object_mut() {
            limits
                .entry(g.resource.clone())
                .or_insert_with(|| Value::String(g.value.clone()));
        }
    }
}

/// What the user reads of the limits given to a template (`here`: the workload and the
/// template, as messages name them).
pub(super) fn warning(here: &str, given: &[Given]) -> String {
    let mut parts: Vec<String> = vec![];
    for g in given {
        let why = if g.for_hugepages {
            "for its hugepages"
        } else {
            "its request"
        };
        parts.push(format!(
            "{}: {} on container {:?} ({why})",
            g.resource, g.value, g.container
        ));
    }
    format!(
        "tollgate: {here}: set limits {} in the pod template: the apiserver refuses a pod template without them (a non-overcommitable resource needs a limit equal to its request; hugepages need cpu or memory), and its pods would get them from tollgate anyway",
        parts.join(", ")
    )
}

/// The apiserver's errors of the templates of `object` (a workload of `kind` the
/// apiserver validates), each at its field.
pub(super) fn errors_of(templates: &[(String, Option<&Value>)], root: &Value) -> Vec<FieldError> {
    templates
        .iter()
        .flat_map(|(pointer, spec)| {
            let at = format!("{}.spec", apivalidation::field_of(root, pointer));
            apivalidation::pod_spec(*spec, &at)
        })
        .collect()
}

/// The warning for a workload the apiserver will refuse, in its words (`refusal`), with
/// the YAML that mends a limit tollgate did not give (`missing`: the field of a
/// container's `resources.limits`, the container's name, the resources and their requests),
/// and why tollgate did not (`because`).
pub(super) fn refused_warning(
    subject: &str,
    refusal: &str,
    missing: &[(String, Vec<(String, String)>)],
    because: &str,
) -> String {
    let mut out = format!("tollgate: {subject}: the apiserver will refuse it: {refusal}");
    if !missing.is_empty() {
        out.push_str(&format!("; {because}; add "));
        let adds: Vec<String> = missing
            .iter()
            .map(|(container, limits)| {
                let items: Vec<String> = limits
                    .iter()
                    .map(|(r, q)| format!("{r}: {}", yaml_string(q)))
                    .collect();
                format!(
                    "to container {container:?}: resources: {{limits: {{{}}}}}",
                    items.join(", ")
                )
            })
            .collect();
        out.push_str(&adds.join("; "));
    }
    out
}

/// A quantity as YAML writes a string (`"1"`, so that it stays one).
fn yaml_string(q: &str) -> String {
    format!("{q:?}")
}

/// The limits each container of `template` still lacks for the apiserver: its
/// non-overcommitable requests without one, by container name, with the request.
pub(super) fn missing_limits(template: &Value) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = vec![];
    for list in ["initContainers", "containers"] {
        for c in template
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let requests = c.pointer("/resources/requests").and_then(Value::as_object);
            let limits = c.pointer("/resources/limits").and_then(Value::as_object);
            let lacking: Vec<(String, String)> = requests
                .into_iter()
                .flatten()
                .filter(|(r, _)| {
                    quantity::is_non_overcommittable(r)
                        && !limits.is_some_and(|l| l.contains_key(r.as_str()))
                })
                .filter_map(|(r, q)| Some((r.clone(), q.as_str()?.to_owned())))
                .collect();
            if !lacking.is_empty() {
                let name = c.get("name").and_then(Value::as_str).unwrap_or("");
                out.push((name.to_owned(), lacking));
            }
        }
    }
    out
}

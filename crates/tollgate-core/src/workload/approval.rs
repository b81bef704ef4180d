//! tollgate's approval of a workload's opt-out, in its pod templates: whether an UPDATE
//! changed a template but for it, the approval a template carries, and writing it (into the
//! template, or for a TrainJob, into an override of its own that Trainer merges into the
//! pod templates).

use serde_json::{Map, Value};

use crate::policy::Policy;

/// Whether an UPDATE left a template as it was, but for tollgate's approval (which the
/// review itself may have changed) and empty metadata maps (which read as absent).
pub(super) fn same_template(approval: &str, a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let keys = a.keys().chain(b.keys().filter(|k| !a.contains_key(*k)));
    for k in keys {
        let (x, y) = (a.get(k), b.get(k));
        let same = if k == "metadata" {
            same_map(x, y, |mk, mx, my| {
                if mk == "annotations" {
                    same_map(mx, my, |ak, ax, ay| ak == approval || ax == ay)
                } else {
                    mx == my
                }
            })
        } else {
            x == y
        };
        if !same {
            return false;
        }
    }
    true
}

/// Two maps compared member by member with `same`, an absent, null or empty map being
/// the same as an empty one.
fn same_map(
    a: Option<&Value>,
    b: Option<&Value>,
    same: impl Fn(&str, Option<&Value>, Option<&Value>) -> bool,
) -> bool {
    fn as_map<'a>(
        v: Option<&'a Value>,
        empty: &'a Map<String, Value>,
    ) -> Option<&'a Map<String, Value>> {
        match v {
            None | Some(Value::Null) => Some(empty),
            Some(Value::Object(m)) => Some(m),
            Some(_) => None,
        }
    }
    let empty = Map::new();
    let (Some(am), Some(bm)) = (as_map(a, &empty), as_map(b, &empty)) else {
        return a == b;
    };
    am.keys()
        .chain(bm.keys().filter(|k| !am.contains_key(*k)))
        .all(|k| same(k, am.get(k), bm.get(k)))
}

pub(super) fn approval_of<'v>(policy: &Policy, template: &'v Value) -> Option<&'v str> {
    template
        .pointer("/metadata/annotations")?
        .get(&policy.opt_out.approval_annotation)?
        .as_str()
}

/// Sets (or, with None, removes) the approval in a template's annotations.
pub(super) fn set_approval(template: &mut Value, key: &str, value: Option<&str>) {
    let Value::Object(t) = template else {
        return;
    };
    match value {
        Some(v) => {
            let meta = t
                .entry("metadata")
                .or_insert_with(|| Value::Object(Map::new()));
            if !meta.is_object() {
                *meta = Value::Object(Map::new());
            }
            let Value::Object(meta) = meta else { return };
            let annotations = meta
                .entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()));
            if !annotations.is_object() {
                *annotations = Value::Object(Map::new());
            }
            if let Value::Object(a) = annotations {
                a.insert(key.to_owned(), Value::String(v.to_owned()));
            }
        }
        None => {
            if let Some(Value::Object(a)) =
                t.get_mut("metadata").and_then(|m| m.get_mut("annotations"))
            {
                a.remove(key);
            }
        }
    }
}

/// Writes the approvals of a TrainJob's templates (by replicated job) into the TrainJob:
/// removed from every override of a pod template's annotations, then set in one entry of
/// tollgate's own, which the controller merges into the pod templates: a `runtimePatches`
/// entry whose manager is the approval annotation (Trainer v2.2 on), or, for a TrainJob
/// that uses `podTemplateOverrides` and no `runtimePatches` (v2.1), an override per user.
pub(super) fn carry_approvals(doc: &mut Value, key: &str, approvals: &[(String, Option<String>)]) {
    let Some(Value::Object(spec)) = doc.get_mut("spec") else {
        return;
    };
    let strip = |template_meta: Option<&mut Value>| {
        if let Some(Value::Object(a)) = template_meta.and_then(|m| m.get_mut("annotations")) {
            a.remove(key);
        }
    };
    let v21 = spec.contains_key("podTemplateOverrides") && !spec.contains_key("runtimePatches");
    if let Some(Value::Array(patches)) = spec.get_mut("runtimePatches") {
        patches.retain(|p| p.get("manager").and_then(Value::as_str) != Some(key));
        for p in patches.iter_mut() {
            let jobs = p
                .pointer_mut("/trainingRuntimeSpec/template/spec/replicatedJobs")
                .and_then(Value::as_array_mut);
            for j in jobs.into_iter().flatten() {
                strip(j.pointer_mut("/template/spec/template/metadata"));
            }
        }
    }
    if let Some(Value::Array(overrides)) = spec.get_mut("podTemplateOverrides") {
        for o in overrides.iter_mut() {
            strip(o.get_mut("metadata"));
        }
        // Tollgate's own: nothing left but its targets and empty metadata.
        overrides.retain(|o| {
            let empty = |k: &str| {
                o.pointer(&format!("/metadata/{k}"))
                    .and_then(Value::as_object)
                    .is_none_or(Map::is_empty)
            };
            let only = o
                .as_object()
                .is_some_and(|m| m.keys().all(|k| k == "targetJobs" || k == "metadata"));
            !(only && empty("annotations") && empty("labels"))
        });
    }
    let given: Vec<(&str, &str)> = approvals
        .iter()
        .filter_map(|(n, a)| Some((n.as_str(), a.as_deref()?)))
        .collect();
    if given.is_empty() {
        return;
    }
    let annotations = |user: &str| {
        let mut a = Map::new();
        a.insert(key.to_owned(), Value::String(user.to_owned()));
        let mut m = Map::new();
        m.insert("annotations".into(), Value::Object(a));
        Value::Object(m)
    };
    if v21 {
        let mut users: Vec<&str> = given.iter().map(|(_, u)| *u).collect();
        users.sort_unstable();
        users.dedup();
        let Some(Value::Array(overrides)) = spec.get_mut("podTemplateOverrides") else {
            return;
        };
        for user in users {
            let targets: Vec<Value> = given
                .iter()
                .filter(|(_, u)| *u == user)
                .map(|(n, _)| serde_json::json!({ "name": n }))
                .collect();
            overrides.push(serde_json::json!({
                "targetJobs": targets,
                "metadata": annotations(user),
            }));
        }
        return;
    }
    let jobs: Vec<Value> = given
        .iter()
        .map(|(n, u)| {
            serde_json::json!({
                "name": n,
                "template": {"spec": {"template": {"metadata": annotations(u)}}},
            })
        })
        .collect();
    let entry = serde_json::json!({
        "manager": key,
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": jobs}}},
    });
    match spec
        .entry("runtimePatches")
        .or_insert_with(|| Value::Array(vec![]))
    {
        Value::Array(p) => p.push(entry),
        other => *other = Value::Array(vec![entry]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_update_changes_a_template_unless_only_the_approval_differs() {
        let key = "tollgate.dev/opt-out-approved-by";
        let a = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": []}});
        let stamped = json!({"metadata": {"labels": {"app": "x"}, "annotations": {key: "alice"}}, "spec": {"containers": []}});
        let bare = json!({"spec": {"containers": []}, "metadata": {"labels": {"app": "x"}, "annotations": {}}});
        assert!(same_template(key, &a, &stamped));
        assert!(same_template(key, &stamped, &bare));
        let relabelled = json!({"metadata": {"labels": {"app": "y"}}, "spec": {"containers": []}});
        assert!(!same_template(key, &a, &relabelled));
        let annotated = json!({"metadata": {"labels": {"app": "x"}, "annotations": {"tollgate.dev/opt-out": "true"}}, "spec": {"containers": []}});
        assert!(!same_template(key, &a, &annotated));
        let respec = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{}]}});
        assert!(!same_template(key, &a, &respec));
    }
}

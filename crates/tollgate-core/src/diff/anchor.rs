//! Patch repair: the patch is computed on the typed pod, whose JSON can differ from the
//! object the apiserver sent, which is what the patch is applied to: an absent list
//! (`containers`, `initContainers`) or map reads as empty and comes back as `[]` or `{}`.
//! An operation under such a path would not apply, and the apiserver would refuse the pod
//! with an internal error. Each missing or non-container ancestor is created first, with
//! the typed pod's value for it, so the patch applies to the object as sent.

use serde_json::Value;

/// `patch` (a JSON patch, as text) made to apply to the object of the AdmissionReview
/// `body` as sent; None where it applies already (the usual case: nothing is cloned then),
/// or where either cannot be read (the patch then stays as it was).
pub(crate) fn to_sent_object(body: &[u8], patch: &[u8]) -> Option<Vec<u8>> {
    let patch: json_patch::Patch = serde_json::from_slice(patch).ok()?;
    let mut review: Value = serde_json::from_slice(body).ok()?;
    let sent = review.pointer_mut("/request/object").map(Value::take)?;
    let fixed = anchor(sent, &patch)?;
    // A JSON patch always serialises; were it ever not to, the patch stays as it was.
    serde_json::to_vec(&fixed).ok()
}

/// A patch equivalent to `patch` that applies to `sent`, or None if `patch` already does
/// (the usual case: nothing is cloned then).
fn anchor(sent: Value, patch: &json_patch::Patch) -> Option<json_patch::Patch> {
    let parents_exist = patch.0.iter().enumerate().all(|(i, op)| {
        let path = op.path().to_string();
        let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
        matches!(
            sent.pointer(parent),
            Some(Value::Object(_) | Value::Array(_))
        ) || patch.0[..i].iter().any(|o| {
            let earlier = o.path().to_string();
            parent == earlier || parent.starts_with(&format!("{earlier}/"))
        })
    });
    if parents_exist {
        return None;
    }
    let mut doc = sent;
    let mut out: Vec<json_patch::PatchOperation> = Vec::with_capacity(patch.0.len() + 1);
    for op in &patch.0 {
        let path = op.path().to_string();
        let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
        // Every ancestor, shallowest first: "/spec", "/spec/containers", ...
        let mut at = 0;
        while at < parent.len() {
            let end = parent[at + 1..]
                .find('/')
                .map_or(parent.len(), |i| at + 1 + i);
            let ancestor = &parent[..end];
            at = end;
            if matches!(
                doc.pointer(ancestor),
                Some(Value::Object(_) | Value::Array(_))
            ) {
                continue;
            }
            // The typed pod's value there: what an absent or null field reads as. For a
            // list index or a map key that is absent, that is an empty map.
            let empty = if path[end..].split('/').nth(1).is_some_and(|seg| {
                !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()) || seg == "-"
            }) {
                Value::Array(vec![])
            } else {
                Value::Object(Default::default())
            };
            let add: json_patch::PatchOperation = serde_json::from_value(serde_json::json!(
                {"op": "add", "path": ancestor, "value": empty}
            ))
            .ok()?;
            json_patch::patch(&mut doc, std::slice::from_ref(&add)).ok()?;
            out.push(add);
        }
        json_patch::patch(&mut doc, std::slice::from_ref(op)).ok()?;
        out.push(op.clone());
    }
    Some(json_patch::Patch(out))
}

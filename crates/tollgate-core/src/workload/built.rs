//! Where a workload's templates are read: the workload itself, or for a kind with `from`
//! (a Kubeflow TrainJob, and an OptimizationJob through the TrainJob its trials are made
//! of) the runtime it names as `trainjob` changes it for the workload; and on UPDATE, the
//! old object's template at the same place.

use std::borrow::Cow;

use serde_json::Value;

use super::template::{at, workload_name, PodTemplate};
use super::Workload;
use crate::cluster::Cluster;
use crate::trainjob;

/// Where a workload's templates are read: the workload itself, or for a kind with
/// `from`, what was built from it (and, on UPDATE, from the old object).
#[derive(Debug, Clone, Copy)]
pub(super) struct Source<'v> {
    pub(super) object: &'v Value,
    pub(super) old: Option<&'v Value>,
}

/// The objects built for a kind with `from`, owned for the review.
pub(super) struct Built {
    object: Value,
    old: Option<Value>,
}

/// What a kind with `from` reads its templates in, built from the workload; None for a
/// kind whose templates are in the workload itself; Err when they cannot be built (the
/// runtime not known).
pub(super) fn build(
    cluster: &dyn Cluster,
    w: &Workload<'_>,
    name: &str,
) -> Result<Option<Built>, trainjob::Unbuilt> {
    let Some(from) = w.kind.from.as_ref() else {
        return Ok(None);
    };
    let src = &from.training_runtime;
    let ns = w.who.namespace;
    let path = src.train_job_template.as_str();
    let trainjob = held_trainjob(path, w.object);
    let object = trainjob::build(src, trainjob.as_ref(), name, ns, cluster)?;
    Ok(Some(Built {
        object,
        // The old object's, where its runtime is known: else every template is new.
        old: w.old.and_then(|o| {
            trainjob::build(src, &held_trainjob(path, o), workload_name(o), ns, cluster).ok()
        }),
    }))
}

/// The TrainJob a workload makes: itself, or the one it holds at `path` (its `metadata` and
/// `spec`, as an OptimizationJob's trials are made of its `spec.trainJobTemplate`).
fn held_trainjob<'v>(path: &str, workload: &'v Value) -> Cow<'v, Value> {
    if path.is_empty() {
        return Cow::Borrowed(workload);
    }
    let held = at(workload, path);
    let mut metadata = held
        .and_then(|t| t.get("metadata"))
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    if let (Value::Object(m), Some(name)) = (&mut metadata, workload.pointer("/metadata/name")) {
        m.insert("name".into(), name.clone());
    }
    Cow::Owned(serde_json::json!({
        "apiVersion": workload.get("apiVersion"),
        "kind": "TrainJob",
        "metadata": metadata,
        "spec": held.and_then(|t| t.get("spec")).cloned().unwrap_or(Value::Null),
    }))
}

impl<'v> Source<'v> {
    pub(super) fn of(w: &Workload<'v>, built: Option<&'v Built>) -> Source<'v> {
        match built {
            Some(b) => Source {
                object: &b.object,
                old: b.old.as_ref(),
            },
            None => Source {
                object: w.object,
                old: w.old,
            },
        }
    }
}

/// The template at the same place in the old object, on UPDATE.
pub(super) fn old_template<'v>(src: Source<'v>, t: &PodTemplate<'_>) -> Option<&'v Value> {
    src.old?.pointer(&t.pointer).filter(|v| !v.is_null())
}

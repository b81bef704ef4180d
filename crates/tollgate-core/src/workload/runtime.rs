//! A Kubeflow Trainer runtime judged at apply, as a TrainJob on it would make its pods,
//! saying what no TrainJob can supply.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::validating::validate;
use super::{Validated, Workload};
use crate::cluster::{Cluster, Layered, Objects};
use crate::policy::{Operation, Policy};
use crate::requester::Requester;
use crate::trainjob;

/// A TrainingRuntime or ClusterTrainingRuntime judged at apply (and by `review`): as a
/// TrainJob on it would make its pods, through the policy's TrainJob kind (None where the
/// policy has none, or `runtime` is not a runtime). What no TrainJob can supply is said of
/// each step: the runtime is judged as the TrainJob whose `resourcesPerNode` requests every
/// resource the policy requires, so that what the TrainJob reaches (the trainer step's
/// `node` container) is never blamed on the runtime, and every container still lacking a
/// request is one each TrainJob on the runtime will be refused for. Never refused: runtimes
/// are installed cluster-wide, often by the Trainer's own manifests; a warning says it.
pub(crate) fn validate_runtime(
    policy: &Policy,
    cluster: &dyn Cluster,
    runtime: &Value,
    who: Requester<'_>,
) -> Option<Validated> {
    let kind = policy
        .workloads
        .kinds
        .iter()
        .find(|k| k.group == trainjob::GROUP && k.kind == "TrainJob" && k.from.is_some())?;
    let runtime_kind = runtime.get("kind").and_then(Value::as_str)?;
    if !matches!(runtime_kind, "TrainingRuntime" | "ClusterTrainingRuntime") {
        return None;
    }
    let name = runtime.pointer("/metadata/name").and_then(Value::as_str)?;
    let mut required: Vec<&str> = policy
        .validation
        .required_requests
        .iter()
        .map(String::as_str)
        .collect();
    for p in policy.profiles.iter().filter_map(|p| p.policy()) {
        required.extend(p.validation.required_requests.iter().map(String::as_str));
    }
    required.sort_unstable();
    required.dedup();
    let requests: Map<String, Value> = required
        .iter()
        .map(|r| ((*r).to_owned(), Value::from("1")))
        .collect();
    let trainjob = serde_json::json!({
        "apiVersion": format!("{}/v1alpha1", trainjob::GROUP),
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": who.namespace},
        "spec": {
            "runtimeRef": {"apiGroup": trainjob::GROUP, "kind": runtime_kind, "name": name},
            "trainer": {"resourcesPerNode": {"requests": requests}},
        },
    });
    // The runtime being judged, in front of what the review knows: at its creation it is
    // in no cache yet.
    let mut this_runtime = Objects::default();
    let runtime_arc = Arc::new(runtime.clone());
    if runtime_kind == "ClusterTrainingRuntime" {
        this_runtime
            .cluster_training_runtimes
            .insert(name.to_owned(), runtime_arc);
    } else {
        this_runtime
            .training_runtimes
            .insert((who.namespace.to_owned(), name.to_owned()), runtime_arc);
    }
    let known = Layered {
        first: &this_runtime,
        then: cluster,
    };
    let w = Workload {
        kind,
        object: &trainjob,
        old: None,
        operation: Operation::Create,
        who,
    };
    let judged = validate(policy, &known, &w);
    let subject = format!("{} {name:?}", runtime_kind.to_ascii_lowercase());
    let mut out = Validated {
        allowed: true,
        verdict: judged.verdict,
        templates: judged.templates,
        unresolved: judged.unresolved,
        ..Default::default()
    };
    for t in &judged.judged {
        let Some(d) = t.judgement.as_ref().and_then(|j| j.validation.as_ref()) else {
            continue;
        };
        let here = match &t.label {
            Some(l) => format!("{subject}, {l}"),
            None => subject.clone(),
        };
        for m in &d.missing {
            out.warnings.push(format!(
                "tollgate: {here}: {} {:?} has no request for {}, and no TrainJob can give it one (spec.trainer.resourcesPerNode reaches only the {:?} container of the trainer step): every TrainJob on this runtime is refused until the runtime sets it",
                m.noun,
                m.container,
                crate::words::join_words(&m.resources),
                trainjob::NODE
            ));
        }
    }
    out.judged = judged.judged;
    Some(out)
}

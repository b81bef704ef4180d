//! `tollgate review` offline: an AdmissionReview as JSON through the webhooks of a stage,
//! in a cluster's order (mutate, the apiserver's defaulting, validate), and the CREATE
//! review the apiserver would send for an object.
//!
//! The review is read once and judged once ([`review_stages`]: one [`judge::pod`] for a
//! pod, both of a workload's webhooks for a workload), so what a user checks offline is
//! what the cluster does.
//!
//! [`judge::pod`]: crate::judge::pod

use serde_json::{json, Value};

use crate::cluster::Cluster;
use crate::review::{review_stages, ReviewError, Reviewed};
use crate::stage::Stage;

/// Why a review could not be run at all.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PipelineError {
    #[error(transparent)]
    Review(#[from] ReviewError),
    /// Only a bug could cause it: the engine's own patch must apply to the object it was
    /// computed from.
    #[error("the patch does not apply: {0}")]
    Patch(String),
}

/// What the webhooks made of one AdmissionReview.
#[derive(Debug, Clone)]
pub struct Judged {
    /// The mutating webhook's review (stages `all` and `mutate`).
    pub mutate: Option<Reviewed>,
    /// The object with the mutation's patch applied, before the apiserver's defaulting;
    /// None when the review carries no object or the stage is `validate`.
    pub mutated: Option<Value>,
    /// The validating webhook's review: not run when the mutation already refused, or the
    /// apiserver's own validation (`invalid`) did.
    pub validate: Option<Reviewed>,
    /// Whether the apiserver would admit the object.
    pub allowed: bool,
    /// The refusal, as the user would read it.
    pub message: Option<String>,
    /// What the apiserver's own validation refuses in a built-in workload's pod templates
    /// as the mutating webhook left them (it runs between the two webhooks; stage `all`
    /// only): each error at its field; the message is then the apiserver's.
    pub invalid: Vec<crate::apivalidation::FieldError>,
}

impl Judged {
    /// Every warning of both reviews, mutation first.
    pub fn warnings(&self) -> impl Iterator<Item = &String> {
        self.mutate
            .iter()
            .chain(self.validate.iter())
            .flat_map(|r| r.response.warnings.iter().flatten())
    }

    /// The review that answered last: validation if it ran, else mutation.
    pub fn last(&self) -> Option<&Reviewed> {
        self.validate.as_ref().or(self.mutate.as_ref())
    }
}

/// Runs `review` (an AdmissionReview as JSON) through the webhooks of `stage`, knowing what
/// `cluster` knows.
pub fn run(
    policy: &crate::policy::Policy,
    cluster: &dyn Cluster,
    review: &Value,
    stage: Stage,
) -> Result<Judged, PipelineError> {
    // Writing a Value as JSON cannot fail.
    let bytes = serde_json::to_vec(review).unwrap_or_default();
    let staged = review_stages(stage, policy, cluster, &bytes)?;
    let mut judged = Judged {
        mutate: staged.mutate,
        mutated: None,
        validate: staged.validate,
        allowed: true,
        message: None,
        invalid: vec![],
    };
    if let (Some(m), Some(object)) = (&judged.mutate, review.pointer("/request/object")) {
        let mut doc = object.clone();
        if let Some(p) = &m.patch() {
            json_patch::patch(&mut doc, p).map_err(|e| PipelineError::Patch(e.to_string()))?;
        }
        judged.mutated = Some(doc);
    }
    // The apiserver validates a built-in workload's pod templates after the mutating
    // webhook and before the validating one: what it refuses there, the validating webhook
    // never sees. Only with both webhooks, as a cluster runs them: one alone is asked for
    // its own answer (and without the mutation, a template it mends would be refused).
    let mutation_allowed = judged.mutate.as_ref().is_none_or(|m| m.response.allowed);
    if stage == Stage::All && mutation_allowed {
        if let Some(object) = judged.mutated.as_ref() {
            judged.invalid = apiserver_errors(policy, review, object);
        }
    }
    if let Some(refused) = judged.mutate.as_ref().filter(|r| !r.response.allowed) {
        judged.allowed = false;
        judged.message = Some(refused.response.result.message.clone());
    } else if !judged.invalid.is_empty() {
        judged.allowed = false;
        judged.message = Some(invalid_message(review, &judged.invalid));
        // The apiserver never calls the validating webhook: nothing of it is said.
        judged.validate = None;
    } else if let Some(refused) = judged.validate.as_ref().filter(|r| !r.response.allowed) {
        judged.allowed = false;
        judged.message = Some(refused.response.result.message.clone());
    }
    // Admitted by the webhooks, a pod may still be refused by the apiserver's own quota
    // admission, which runs after them: kubectl prints its words.
    if let Some(v) = judged.validate.as_ref().filter(|_| judged.allowed) {
        if let crate::review::About::Pod(p) = &v.about {
            if let Some(refusal) = &p.quota_refusal {
                judged.allowed = false;
                judged.message = Some(format!("pods {:?} is forbidden: {refusal}", v.name));
            }
        }
    }
    Ok(judged)
}

/// What the apiserver's validation refuses in `object` and its pod templates, for a
/// workload of a kind the policy lists (the kind as `review` names it; where the templates
/// are, the policy says).
fn apiserver_errors(
    policy: &crate::policy::Policy,
    review: &Value,
    object: &Value,
) -> Vec<crate::apivalidation::FieldError> {
    let kind = |k: &str| {
        review
            .pointer(&format!("/request/kind/{k}"))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    match policy
        .workloads
        .kind(kind("group"), kind("version"), kind("kind"))
    {
        // Whether tollgate judges workloads or not (`workloads.enabled`): the apiserver
        // validates them all the same.
        Some(k) => crate::workload::apiserver_errors(k, object),
        None => vec![],
    }
}

/// The apiserver's refusal of the object of `review` for `errors`.
fn invalid_message(review: &Value, errors: &[crate::apivalidation::FieldError]) -> String {
    let at = |p: &str| review.pointer(p).and_then(Value::as_str).unwrap_or("");
    crate::apivalidation::refusal(
        at("/request/kind/group"),
        at("/request/kind/kind"),
        at("/request/object/metadata/name"),
        errors,
    )
}

/// The CREATE review the apiserver would send for `object` (a Pod, or any object of a kind
/// the policy knows), from `user` in `groups` (`system:authenticated` added, as the
/// apiserver adds it to every authenticated user), the object in the review's namespace.
pub fn synthetic_review(
    object: &Value,
    namespace: Option<&str>,
    user: &str,
    groups: &[String],
) -> Value {
    let namespace = namespace
        .or_else(|| {
            object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
        })
        .unwrap_or("default");
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("Pod");
    let (group, version) = match object.get("apiVersion").and_then(Value::as_str) {
        Some(api) => group_version(api),
        None => ("", "v1"),
    };
    // The plural the apiserver's discovery gives every kind tollgate reviews.
    let resource = format!("{}s", kind.to_ascii_lowercase());
    let mut groups = groups.to_vec();
    groups.push("system:authenticated".into());
    // The apiserver puts an object written without a namespace in the request's before
    // the webhooks see it.
    let mut object = object.clone();
    place_in_namespace(&mut object, namespace);
    // And a pod's pod-level requests defaulted, as it decodes every pod it is sent.
    if kind == "Pod" {
        crate::pod::default_pod_level_requests_json(&mut object);
    }
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-000000000000",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": user, "groups": groups},
            "object": object,
            "oldObject": null,
            "dryRun": true,
        }
    })
}

/// Puts an object whose metadata names no namespace in `namespace`, as the apiserver (and
/// `kubectl apply -n`) does; one that names its own keeps it.
pub fn place_in_namespace(object: &mut Value, namespace: &str) {
    if let Some(Value::Object(meta)) = object.get_mut("metadata") {
        if meta
            .get("namespace")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            meta.insert("namespace".into(), Value::from(namespace));
        }
    }
}

/// The group and version of an `apiVersion` (`batch/v1`; `v1` is the core group).
pub fn group_version(api: &str) -> (&str, &str) {
    api.split_once('/').unwrap_or(("", api))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Objects;
    use crate::policy::Policy;

    fn notebook(requests: Option<Value>) -> Value {
        let mut c = json!({"name": "jupyter", "image": "jupyter"});
        if let Some(r) = requests {
            c["resources"] = r;
        }
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "nb", "namespace": "ml"},
               "spec": {"containers": [c]}})
    }

    #[test]
    fn all_refuses_what_validation_refuses_and_mutate_alone_does_not() {
        let policy = Policy::builtin();
        let review = synthetic_review(&notebook(None), None, "alice", &[]);
        let all = run(&policy, &Objects::complete(), &review, Stage::All).unwrap();
        assert!(!all.allowed);
        assert!(all.message.as_deref().unwrap().contains("jupyter"));
        assert!(all.validate.is_some() && all.mutate.is_some());
        let mutate = run(&policy, &Objects::complete(), &review, Stage::Mutate).unwrap();
        assert!(mutate.allowed && mutate.validate.is_none());
        let validate = run(&policy, &Objects::complete(), &review, Stage::Validate).unwrap();
        assert!(!validate.allowed && validate.mutate.is_none() && validate.mutated.is_none());
    }

    #[test]
    fn defaulting_turns_limits_into_the_requests_validation_sees() {
        let policy = Policy::builtin();
        let pod = notebook(Some(json!({"limits": {"cpu": "1", "memory": "1Gi"}})));
        let review = synthetic_review(&pod, None, "alice", &[]);
        let all = run(&policy, &Objects::complete(), &review, Stage::All).unwrap();
        assert!(all.allowed, "{:?}", all.message);
        // The object after mutation is before defaulting: no requests yet.
        let mutated = all.mutated.unwrap();
        assert!(mutated
            .pointer("/spec/containers/0/resources/requests")
            .is_none());
    }

    #[test]
    fn a_training_pod_without_requests_gets_limits_and_passes() {
        let policy = Policy::builtin();
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w", "namespace": "ml"},
            "spec": {"containers": [{"name": "t", "image": "t",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
        let review = synthetic_review(&pod, None, "alice", &[]);
        let all = run(&policy, &Objects::complete(), &review, Stage::All).unwrap();
        assert!(all.allowed, "{:?}", all.message);
        assert!(!all.mutate.unwrap().steps().is_empty());
    }

    #[test]
    fn a_gpu_job_is_held_to_the_apiservers_validation_between_the_webhooks() {
        let policy = Policy::builtin();
        let job = |annotations: Value| {
            json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "train-gpu", "namespace": "ml"},
                "spec": {"template": {"metadata": {"annotations": annotations}, "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "t", "image": "t",
                        "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}}})
        };
        let masters = ["system:masters".to_owned()];
        let review = synthetic_review(&job(json!({})), None, "bob", &[]);
        let all = run(&policy, &Objects::complete(), &review, Stage::All).unwrap();
        assert!(all.allowed && all.invalid.is_empty(), "{:?}", all.message);
        // Opted out: its pods get no limit from tollgate, so neither does its template.
        let opted = job(json!({"tollgate.dev/opt-out": "true"}));
        let review = synthetic_review(&opted, None, "alice", &masters);
        let all = run(&policy, &Objects::complete(), &review, Stage::All).unwrap();
        assert!(!all.allowed);
        assert_eq!(
            all.message.as_deref(),
            Some("Job.batch \"train-gpu\" is invalid: spec.template.spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources")
        );
        assert_eq!(
            all.invalid[0].field,
            "spec.template.spec.containers[0].resources.limits"
        );
        let mutate = run(&policy, &Objects::complete(), &review, Stage::Mutate).unwrap();
        assert!(mutate.allowed && mutate.invalid.is_empty());
        // Workloads left to their pods: tollgate gives the template nothing, and the
        // apiserver refuses it all the same.
        let off = Policy::from_text("off", "workloads: {enabled: false}").unwrap();
        let review = synthetic_review(&job(json!({})), None, "bob", &[]);
        let all = run(&off, &Objects::complete(), &review, Stage::All).unwrap();
        assert!(!all.allowed);
        assert_eq!(all.invalid.len(), 1, "{:?}", all.message);
    }
}

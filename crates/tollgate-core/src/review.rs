//! The review pipeline: AdmissionReview bytes in, AdmissionReview out.
//!
//! Pure: no I/O and no clock. The HTTP routes and the `review` command both call
//! [`review_bytes`], so what a user sees offline is what the cluster gets.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use kube_core::admission::{self, AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube_core::{DynamicObject, Status};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::cluster::{Cluster, ObjectKey, Offline};
use crate::gpu::Gpus;
use crate::mutate::{self, Step};
use crate::optout::{self, OptOut};
use crate::policy::{Operation, Policy};
use crate::profile::{self, PodLabels};
use crate::requester::Requester;
use crate::validate::{self, Verdict};
use crate::workload::{self, TemplateVerdict, Workload};
use crate::{diff, parse};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Mutate,
    Validate,
}

impl Endpoint {
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Mutate => "mutate",
            Endpoint::Validate => "validate",
        }
    }
}

/// The one-word result of a review, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Result {
    Allowed,
    Patched,
    Denied,
    /// A well-formed review tollgate could not judge (answered with code 400).
    Error,
}

impl Result {
    pub fn as_str(self) -> &'static str {
        match self {
            Result::Allowed => "allowed",
            Result::Patched => "patched",
            Result::Denied => "denied",
            Result::Error => "error",
        }
    }
}

/// A body that is not a usable AdmissionReview: the server answers 400 with this text.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReviewError {
    #[error("empty body: expected an admission.k8s.io/v1 AdmissionReview")]
    Empty,
    #[error("body is not JSON: {0}")]
    NotJson(String),
    #[error("not an admission.k8s.io/v1 AdmissionReview: {0}")]
    NotAdmissionReview(String),
    #[error("AdmissionReview has no request")]
    NoRequest,
}

/// Everything a review produced: the response and what the shell logs and counts.
#[derive(Debug, Clone)]
pub struct Reviewed {
    pub endpoint: Endpoint,
    pub response: AdmissionResponse,
    pub result: Result,
    pub uid: String,
    pub namespace: String,
    /// The pod's name, or its generateName prefix followed by `*`.
    pub name: String,
    pub operation: String,
    pub dry_run: bool,
    pub username: String,
    /// Mutation steps that changed the pod.
    pub steps: Vec<Step>,
    /// What validation concluded, when it ran.
    pub verdict: Option<Verdict>,
    pub opt_out: Option<OptOut>,
    /// Objects the review needed and the cluster context did not know (a claim created a
    /// moment ago): the shell may fetch them and review again.
    pub unresolved: Vec<ObjectKey>,
    /// The policy profile the pod got; None for the base policy.
    pub profile: Option<String>,
    /// The kind of a workload reviewed (`Job`); None for a pod.
    pub kind: Option<String>,
    /// A workload's pod templates and what became of each.
    pub templates: Vec<TemplateVerdict>,
    /// On `/validate`: the containers lacking required requests, whatever the mode.
    pub missing: Vec<validate::Missing>,
}

impl Reviewed {
    /// The JSON patch of a mutation, if it has one.
    pub fn patch(&self) -> Option<json_patch::Patch> {
        serde_json::from_slice(self.response.patch.as_deref()?).ok()
    }

    /// The AdmissionReview to send back, as JSON.
    ///
    /// Written out by hand rather than through kube's `into_review`: the patch goes as a
    /// base64 string (what Go's `[]byte` expects, a third the size of a number array),
    /// encoded straight into the output; audit annotations in a stable order; and no empty
    /// status on an allowed review.
    pub fn to_json(&self) -> Vec<u8> {
        use base64::Engine as _;
        let r = &self.response;
        let patch_len = r.patch.as_ref().map_or(0, |p| p.len().div_ceil(3) * 4);
        let mut out = Vec::with_capacity(192 + patch_len);
        out.extend_from_slice(
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#,
        );
        // Writing strings, maps and a Status into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, &r.uid);
        out.extend_from_slice(if r.allowed {
            b",\"allowed\":true"
        } else {
            b",\"allowed\":false"
        });
        if !r.allowed {
            out.extend_from_slice(b",\"status\":");
            let _ = serde_json::to_writer(&mut out, &r.result);
        }
        if let Some(patch) = &r.patch {
            out.extend_from_slice(b",\"patch\":\"");
            let at = out.len();
            out.resize(at + patch_len, 0);
            let n = base64::engine::general_purpose::STANDARD
                .encode_slice(patch, &mut out[at..])
                .unwrap_or(0);
            out.truncate(at + n);
            out.extend_from_slice(b"\",\"patchType\":\"JSONPatch\"");
        }
        if !r.audit_annotations.is_empty() {
            let sorted: std::collections::BTreeMap<_, _> = r.audit_annotations.iter().collect();
            out.extend_from_slice(b",\"auditAnnotations\":");
            let _ = serde_json::to_writer(&mut out, &sorted);
        }
        if let Some(w) = r.warnings.as_deref().filter(|w| !w.is_empty()) {
            out.extend_from_slice(b",\"warnings\":");
            let _ = serde_json::to_writer(&mut out, w);
        }
        out.extend_from_slice(b"}}");
        out
    }
}

/// Parses a body and reviews it, with no cluster context. Errors are bodies that are not an
/// AdmissionReview at all.
pub fn review_bytes(
    endpoint: Endpoint,
    policy: &Policy,
    body: &[u8],
) -> std::result::Result<Reviewed, ReviewError> {
    review_bytes_with(endpoint, policy, &Offline, body)
}

/// [`review_bytes`], knowing what `cluster` knows of other objects.
pub fn review_bytes_with(
    endpoint: Endpoint,
    policy: &Policy,
    cluster: &dyn Cluster,
    body: &[u8],
) -> std::result::Result<Reviewed, ReviewError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ReviewError::Empty);
    }
    let shape = match endpoint {
        Endpoint::Mutate => parse::Shape::Full,
        Endpoint::Validate => parse::Shape::Validation,
    };
    if let Some(parsed) = parse::read_shape(body, shape) {
        return Ok(review_parsed(
            endpoint,
            policy,
            cluster,
            parsed.request,
            parsed.labels,
            body,
        ));
    }
    // The exact parse: slower, and what decides how a body that is not a review of a pod
    // is answered.
    match serde_json::from_slice::<AdmissionReview<Pod>>(body) {
        Ok(review) => {
            check_envelope(&review.types.api_version, &review.types.kind)?;
            let req: AdmissionRequest<Pod> =
                review.try_into().map_err(|_| ReviewError::NoRequest)?;
            Ok(review_parsed(endpoint, policy, cluster, req, None, body))
        }
        Err(typed_err) => match parse::workload(body) {
            // Not a pod: a workload, judged by the pods its templates will make.
            Some((req, object, old)) => Ok(review_workload(
                endpoint,
                policy,
                cluster,
                &req,
                &object,
                old.as_ref(),
            )),
            None => slow_path(endpoint, body, typed_err),
        },
    }
}

/// `raw_labels`: the pod's labels where the parse left them as text (else they are the
/// object's own).
fn review_parsed(
    endpoint: Endpoint,
    policy: &Policy,
    cluster: &dyn Cluster,
    req: AdmissionRequest<Pod>,
    raw_labels: Option<&RawValue>,
    body: &[u8],
) -> Reviewed {
    // Along every path a mutation patches, the typed model tells an absent or null field
    // from an empty one, except for the two it requires: `metadata` and `spec.containers`.
    // Only when one of them reads as empty can the patch name a parent the sent object
    // lacks, so only then is the body read a second time.
    let ambiguous = req.object.as_ref().is_some_and(|p| {
        p.metadata == Default::default() || p.spec.as_ref().is_some_and(|s| s.containers.is_empty())
    });
    let mut reviewed = review_request_labelled(endpoint, policy, cluster, req, raw_labels);
    if reviewed.response.patch.is_some() && ambiguous {
        anchor_to_sent_object(&mut reviewed, body);
    }
    reviewed
}

/// The patch is computed on the typed pod, whose JSON can differ from the object the
/// apiserver sent, which is what the patch is applied to: an absent list (`containers`,
/// `initContainers`) or map reads as empty and comes back as `[]` or `{}`. An operation
/// under such a path would not apply, and the apiserver would refuse the pod with an
/// internal error. Each missing or non-container ancestor is created first, with the typed
/// pod's value for it, so the patch applies to the object as sent.
fn anchor_to_sent_object(reviewed: &mut Reviewed, body: &[u8]) {
    let Some(patch) = reviewed.patch() else {
        return;
    };
    let Ok(mut sent) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let Some(sent) = sent.pointer_mut("/request/object").map(Value::take) else {
        return;
    };
    if let Some(fixed) = anchor(sent, &patch) {
        match reviewed.response.clone().with_patch(fixed) {
            Ok(r) => reviewed.response = r,
            Err(_) => unreachable!("a JSON patch always serialises"),
        }
    }
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

fn check_envelope(api_version: &str, kind: &str) -> std::result::Result<(), ReviewError> {
    if !parse::is_admission_review_v1(api_version, kind) {
        return Err(ReviewError::NotAdmissionReview(format!(
            "apiVersion {api_version:?} kind {kind:?}; register the webhook with admissionReviewVersions: [v1]"
        )));
    }
    Ok(())
}

/// The body did not parse as a review of a Pod: find out why, and answer accordingly.
fn slow_path(
    endpoint: Endpoint,
    body: &[u8],
    typed_err: serde_json::Error,
) -> std::result::Result<Reviewed, ReviewError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ReviewError::NotJson(e.to_string()))?;
    let Value::Object(map) = &value else {
        return Err(ReviewError::NotAdmissionReview(
            "the body is not a JSON object".into(),
        ));
    };
    let field = |k: &str| map.get(k).and_then(Value::as_str).unwrap_or("");
    check_envelope(field("apiVersion"), field("kind"))?;
    if map.get("request").is_none_or(Value::is_null) {
        return Err(ReviewError::NoRequest);
    }
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(value)
        .map_err(|e| ReviewError::NotAdmissionReview(e.to_string()))?;
    let req: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| ReviewError::NoRequest)?;
    let mut reviewed = skeleton(endpoint, &req, None);
    if req.kind.kind != "Pod" || !req.kind.group.is_empty() {
        // Registered for more than pods by mistake: tollgate has no opinion, so it stays out
        // of the way rather than blocking unrelated objects.
        reviewed.response.warnings = Some(vec![format!(
            "tollgate only reviews pods; this {} was allowed unchanged",
            req.kind.kind
        )]);
        return Ok(reviewed);
    }
    reviewed.result = Result::Error;
    reviewed.response.allowed = false;
    reviewed.response.result = Status::failure(
        &format!("tollgate could not read this pod: {typed_err}"),
        "BadRequest",
    )
    .with_code(400);
    Ok(reviewed)
}

/// Who asks, and where.
fn requester<T: kube_core::Resource>(req: &AdmissionRequest<T>) -> Requester<'_> {
    Requester {
        namespace: req.namespace.as_deref().unwrap_or_default(),
        username: req.user_info.username.as_deref().unwrap_or_default(),
        groups: req.user_info.groups.as_deref().unwrap_or_default(),
    }
}

fn skeleton<T: kube_core::Resource>(
    endpoint: Endpoint,
    req: &AdmissionRequest<T>,
    pod: Option<&Pod>,
) -> Reviewed {
    let name = match pod {
        Some(p) => crate::pod::display_name(p),
        None => req.name.clone(),
    };
    Reviewed {
        endpoint,
        response: AdmissionResponse::from(req),
        result: Result::Allowed,
        uid: req.uid.clone(),
        namespace: req.namespace.clone().unwrap_or_default(),
        name,
        operation: operation_str(&req.operation).to_owned(),
        dry_run: req.dry_run,
        username: req.user_info.username.clone().unwrap_or_default(),
        steps: vec![],
        verdict: None,
        opt_out: None,
        unresolved: vec![],
        profile: None,
        kind: None,
        templates: vec![],
        missing: vec![],
    }
}

fn operation_str(op: &admission::Operation) -> &'static str {
    match op {
        admission::Operation::Create => "CREATE",
        admission::Operation::Update => "UPDATE",
        admission::Operation::Delete => "DELETE",
        admission::Operation::Connect => "CONNECT",
    }
}

fn policy_operation(op: &admission::Operation) -> Option<Operation> {
    match op {
        admission::Operation::Create => Some(Operation::Create),
        admission::Operation::Update => Some(Operation::Update),
        _ => None,
    }
}

/// Reviews a parsed request. The pod is mutated in place: the request is consumed.
pub fn review_request(
    endpoint: Endpoint,
    policy: &Policy,
    cluster: &dyn Cluster,
    req: AdmissionRequest<Pod>,
) -> Reviewed {
    review_request_labelled(endpoint, policy, cluster, req, None)
}

/// [`review_request`], with the pod's labels as text when the parse left them so (None:
/// they are the object's own).
fn review_request_labelled(
    endpoint: Endpoint,
    policy: &Policy,
    cluster: &dyn Cluster,
    mut req: AdmissionRequest<Pod>,
    raw_labels: Option<&RawValue>,
) -> Reviewed {
    let mut reviewed = skeleton(endpoint, &req, req.object.as_ref());
    let Some(pod) = req.object.take() else {
        return reviewed;
    };
    // Subresources (status, binding, ephemeralcontainers from `kubectl debug`) are not the
    // pod its author wrote: never in tollgate's way.
    if req.sub_resource.as_deref().is_some_and(|s| !s.is_empty()) {
        return reviewed;
    }
    let Some(operation) = policy_operation(&req.operation) else {
        return reviewed;
    };
    let who = requester(&req);
    let namespace = who.namespace;
    let labels = match raw_labels {
        Some(raw) => PodLabels::Raw(Some(raw)),
        None => PodLabels::Parsed(pod.metadata.labels.as_ref()),
    };
    let selected = profile::select(policy, namespace, labels, cluster);
    let policy = selected.policy;
    reviewed.profile = selected.profile.map(str::to_owned);
    reviewed.unresolved.extend(selected.unresolved);
    match endpoint {
        Endpoint::Mutate => mutate_pod(policy, cluster, pod, operation, &who, &mut reviewed),
        Endpoint::Validate => validate_pod(policy, &pod, operation, &who, &mut reviewed),
    }
    if let Some(w) = selected.warning {
        reviewed
            .response
            .warnings
            .get_or_insert_with(Vec::new)
            .insert(0, w);
    }
    reviewed
}

fn mutate_pod(
    policy: &Policy,
    cluster: &dyn Cluster,
    mut pod: Pod,
    operation: Operation,
    who: &Requester<'_>,
    out: &mut Reviewed,
) {
    if !policy.mutation.operations.contains(&operation) {
        return;
    }
    let mut warnings = vec![];
    let opt_out = optout::decide(policy, &pod, who);
    match &opt_out {
        OptOut::Honoured => {
            out.response.audit_annotations = HashMap::from([(
                "opt-out".to_owned(),
                optout::audit_note_for(policy, pod.metadata.annotations.as_ref(), who),
            )]);
            out.opt_out = Some(opt_out);
            return;
        }
        OptOut::Refused(why) => {
            warnings.push(format!("tollgate: {why}; the pod was handled as usual"))
        }
        OptOut::NotRequested => {}
    }
    out.opt_out = Some(opt_out);
    let gpus = Gpus::of(policy, &pod, who.namespace, cluster);
    warnings.extend(gpus.warnings.iter().cloned());
    out.unresolved.extend(gpus.unresolved.iter().cloned());
    if mutate::is_training_pod(policy, &pod, &gpus) {
        let before = diff::Snapshot::of(&pod);
        let outcome = mutate::mutate(policy, &mut pod, &gpus, out.profile.as_deref());
        let patch = before.and_then(|b| diff::patch_text(&b, &diff::Snapshot::of(&pod)?));
        warnings.extend(outcome.warnings);
        out.steps = outcome.applied;
        let patch = match patch {
            Ok(p) => p,
            // Writing a typed pod as JSON does not fail; if it ever did, the pod goes in as
            // it came rather than being refused over tollgate's own trouble.
            Err(e) => {
                warnings.push(format!(
                    "tollgate: could not compute its changes ({e}); the pod was allowed unchanged"
                ));
                out.steps.clear();
                None
            }
        };
        if let Some(patch) = patch {
            out.result = Result::Patched;
            // AdmissionResponse::with_patch takes the response and the patch by value; rather
            // than copying the response, move it out and let it set the (private) patch type
            // with an empty patch, then put the patch's JSON in.
            let response = std::mem::replace(&mut out.response, AdmissionResponse::invalid(""));
            match response.with_patch(json_patch::Patch::default()) {
                Ok(r) => out.response = r,
                Err(_) => unreachable!("a JSON patch always serialises"),
            }
            out.response.patch = Some(patch);
        }
    }
    if !warnings.is_empty() {
        out.response.warnings = Some(warnings);
    }
}

/// Reviews a workload (a kind other than Pod): its pod templates, if the policy lists the
/// kind; anything else is allowed unchanged, with a warning.
fn review_workload(
    endpoint: Endpoint,
    policy: &Policy,
    cluster: &dyn Cluster,
    req: &AdmissionRequest<DynamicObject>,
    object: &Value,
    old: Option<&Value>,
) -> Reviewed {
    let mut reviewed = skeleton(endpoint, req, None);
    reviewed.kind = Some(req.kind.kind.clone());
    if reviewed.name.is_empty() {
        if let Some(g) = object
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
        {
            reviewed.name = format!("{g}*");
        }
    }
    if req.sub_resource.as_deref().is_some_and(|s| !s.is_empty()) {
        return reviewed;
    }
    let Some(operation) = policy_operation(&req.operation) else {
        return reviewed;
    };
    let who = requester(req);
    let namespace = who.namespace;
    let labels = workload::labels_of(object);
    let selected = profile::select(policy, namespace, PodLabels::Parsed(Some(&labels)), cluster);
    reviewed.profile = selected.profile.map(str::to_owned);
    reviewed.unresolved.extend(selected.unresolved);
    let gvk = &req.kind;
    let Some(kind) = selected
        .policy
        .workloads
        .kind(&gvk.group, &gvk.version, &gvk.kind)
    else {
        // Registered for more than tollgate knows, by mistake or ahead of the policy:
        // tollgate has no opinion, so it stays out of the way.
        let api = if gvk.group.is_empty() {
            gvk.version.clone()
        } else {
            format!("{}/{}", gvk.group, gvk.version)
        };
        reviewed.response.warnings = Some(vec![format!(
            "tollgate only reviews pods and the workloads its policy lists (workloads.kinds); this {} ({api}) was allowed unchanged",
            gvk.kind
        )]);
        return reviewed;
    };
    if !selected.policy.workloads.enabled {
        return reviewed;
    }
    let w = Workload {
        kind,
        object,
        old,
        operation,
        who,
    };
    let mut warnings = selected.warning.into_iter().collect::<Vec<_>>();
    match endpoint {
        Endpoint::Mutate => {
            let m = workload::mutate(policy, cluster, &w);
            warnings.extend(m.warnings);
            reviewed.response.audit_annotations = m.audit_annotations.into_iter().collect();
            reviewed.opt_out = m.opt_out;
            reviewed.templates = m.templates;
            if let Some(patch) = m.patch {
                reviewed.result = Result::Patched;
                let response =
                    std::mem::replace(&mut reviewed.response, AdmissionResponse::invalid(""));
                match response.with_patch(json_patch::Patch::default()) {
                    Ok(r) => reviewed.response = r,
                    Err(_) => unreachable!("a JSON patch always serialises"),
                }
                reviewed.response.patch = Some(patch);
            }
        }
        Endpoint::Validate => {
            let v = workload::validate(policy, cluster, &w);
            warnings.extend(v.warnings);
            reviewed.response.audit_annotations = v.audit_annotations.into_iter().collect();
            reviewed.verdict = v.verdict;
            reviewed.opt_out = v.opt_out;
            reviewed.templates = v.templates;
            reviewed.unresolved.extend(v.unresolved);
            if !v.allowed {
                reviewed.result = Result::Denied;
                reviewed.response.allowed = false;
                reviewed.response.result =
                    Status::failure(v.message.as_deref().unwrap_or("denied"), "Forbidden")
                        .with_code(403);
            }
        }
    }
    if !warnings.is_empty() {
        reviewed.response.warnings = Some(warnings);
    }
    reviewed
}

fn validate_pod(
    policy: &Policy,
    pod: &Pod,
    operation: Operation,
    who: &Requester<'_>,
    out: &mut Reviewed,
) {
    let d = validate::validate(policy, pod, operation, who);
    out.verdict = Some(d.verdict);
    out.opt_out = d.opt_out;
    out.missing = d.missing;
    if !d.allowed {
        out.result = Result::Denied;
        out.response.allowed = false;
        out.response.result =
            Status::failure(d.message.as_deref().unwrap_or("denied"), "Forbidden").with_code(403);
    }
    if !d.warnings.is_empty() {
        out.response.warnings = Some(d.warnings);
    }
    out.response.audit_annotations = d.audit_annotations.into_iter().collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The patch a review returns is the plain diff of the full documents, as the apiserver
    /// sent them (managed fields and all) and as mutated.
    #[test]
    fn patch_is_the_full_diff() {
        let root = crate::testdata::root();
        let text = std::fs::read_to_string(root.join("policies/default.yaml")).unwrap();
        let policy = Policy::from_text("default.yaml", &text).unwrap();
        let mut patched = 0;
        for entry in std::fs::read_dir(root.join("tests/fixtures/apiserver-v1.36")).unwrap() {
            let body = std::fs::read(entry.unwrap().path()).unwrap();
            if !crate::testdata::is_pod_review(&body) {
                // A workload's patch only ever carries the opt-out approval, and these
                // ask for none.
                let reviewed = review_bytes(Endpoint::Mutate, &policy, &body).unwrap();
                assert_eq!(reviewed.result, Result::Allowed);
                assert!(reviewed.patch().is_none());
                assert!(reviewed.kind.is_some());
                continue;
            }
            let v: Value = serde_json::from_slice(&body).unwrap();
            let pod: Pod = serde_json::from_value(v["request"]["object"].clone()).unwrap();
            assert!(pod.metadata.managed_fields.is_some());
            let mut mutated = pod.clone();
            let gpus = Gpus::of(&policy, &pod, "", &Offline);
            mutate::mutate(&policy, &mut mutated, &gpus, None);
            let expected = json_patch::diff(
                &serde_json::to_value(&pod).unwrap(),
                &serde_json::to_value(&mutated).unwrap(),
            );
            let reviewed = review_bytes(Endpoint::Mutate, &policy, &body).unwrap();
            if reviewed.result == Result::Patched {
                assert_eq!(reviewed.patch().unwrap(), expected);
                patched += 1;
            }
        }
        assert!(patched >= 3, "the fixtures exercise the patch: {patched}");
    }
}

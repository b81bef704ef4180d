//! The review: AdmissionReview bytes in, AdmissionReview out.
//!
//! Pure: no I/O and no clock. The HTTP routes and `tollgate review` both call
//! [`review_bytes_with`] (or [`review_stages`] for both webhooks at once), so what a user
//! sees offline is what the cluster gets. One look at `request.kind` chooses the one parse
//! of the body: a pod's (its typed fast path) or a workload's (its objects as JSON). A pod
//! is judged by [`judge::pod`], a workload by [`workload`]; this module turns what they
//! found into the AdmissionReview each webhook answers.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use kube_core::admission::{self, AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube_core::{DynamicObject, Status};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::cluster::{Cluster, ObjectKey, Offline};
use crate::judge::{self, Judgement, Stages, Subject};
use crate::mutate::Step;
use crate::objects;
use crate::optout::OptOut;
use crate::parse::{self, Peeked};
use crate::policy::{Operation, Policy};
use crate::profile::{self, PodLabels};
use crate::requester::Requester;
use crate::trainjob;
use crate::validate::{Missing, Verdict};
use crate::workload::{self, TemplateVerdict, Workload};

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

    fn stages(self) -> Stages {
        match self {
            Endpoint::Mutate => Stages::Mutate,
            Endpoint::Validate => Stages::Validate,
        }
    }
}

/// The one-word result of a review, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Patched,
    Denied,
    /// A well-formed review tollgate could not judge (answered with code 400).
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Patched => "patched",
            Outcome::Denied => "denied",
            Outcome::Error => "error",
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
    pub outcome: Outcome,
    pub uid: String,
    pub namespace: String,
    /// The object's name, or its generateName prefix followed by `*`.
    pub name: String,
    pub operation: String,
    pub dry_run: bool,
    pub username: String,
    /// Objects the review needed and the cluster context did not know (a claim created a
    /// moment ago): the shell may fetch them and review again.
    pub unresolved: Vec<ObjectKey>,
    /// The policy profile applied; None for the base policy.
    pub profile: Option<String>,
    /// What was reviewed (a pod, a workload, or nothing tollgate judges), and what became
    /// of it.
    pub about: About,
}

/// What a review was about.
#[derive(Debug, Clone, Default)]
pub enum About {
    /// Nothing tollgate judges (no object, a subresource, an operation it does not judge,
    /// another kind): allowed unchanged.
    #[default]
    Nothing,
    Pod(PodReview),
    Workload(WorkloadReview),
}

/// What became of a pod.
#[derive(Debug, Clone, Default)]
pub struct PodReview {
    /// Mutation steps that changed the pod.
    pub steps: Vec<Step>,
    /// What validation concluded, when it ran.
    pub verdict: Option<Verdict>,
    pub opt_out: Option<OptOut>,
    /// On `/validate`: the containers lacking required requests, whatever the mode.
    pub missing: Vec<Missing>,
    /// On `/validate`, what the apiserver's ResourceQuota admission answers the pod's
    /// create with after the webhooks, where it refuses it (`Feasibility::admission`).
    pub quota_refusal: Option<String>,
}

/// What became of a workload.
#[derive(Debug, Clone)]
pub struct WorkloadReview {
    /// Its kind (`Job`).
    pub kind: String,
    /// Its pod templates and what became of each.
    pub templates: Vec<TemplateVerdict>,
    /// What validation concluded of its templates, when any was judged.
    pub verdict: Option<Verdict>,
    pub opt_out: Option<OptOut>,
}

impl Reviewed {
    /// Mutation steps that changed a pod.
    pub fn steps(&self) -> &[Step] {
        match &self.about {
            About::Pod(p) => &p.steps,
            _ => &[],
        }
    }

    /// What validation concluded, when it ran.
    pub fn verdict(&self) -> Option<Verdict> {
        match &self.about {
            About::Pod(p) => p.verdict,
            About::Workload(w) => w.verdict,
            About::Nothing => None,
        }
    }

    /// The opt-out as decided, when one was.
    pub fn opt_out(&self) -> Option<&OptOut> {
        match &self.about {
            About::Pod(p) => p.opt_out.as_ref(),
            About::Workload(w) => w.opt_out.as_ref(),
            About::Nothing => None,
        }
    }

    /// The kind of a workload reviewed (`Job`); None for a pod.
    pub fn kind(&self) -> Option<&str> {
        match &self.about {
            About::Workload(w) => Some(&w.kind),
            _ => None,
        }
    }

    /// A workload's pod templates and what became of each.
    pub fn templates(&self) -> &[TemplateVerdict] {
        match &self.about {
            About::Workload(w) => &w.templates,
            _ => &[],
        }
    }

    /// On `/validate`, of a pod: the containers lacking required requests.
    pub fn missing(&self) -> &[Missing] {
        match &self.about {
            About::Pod(p) => &p.missing,
            _ => &[],
        }
    }

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

/// Both webhooks' answers to one review, in a cluster's order: the validating webhook's
/// is None when it did not run (not asked, or the mutating webhook refused).
#[derive(Debug, Clone, Default)]
pub struct Staged {
    pub mutate: Option<Reviewed>,
    pub validate: Option<Reviewed>,
}

/// Parses a body and reviews it, with no cluster context. Errors are bodies that are not an
/// AdmissionReview at all.
pub fn review_bytes(
    endpoint: Endpoint,
    policy: &Policy,
    body: &[u8],
) -> Result<Reviewed, ReviewError> {
    review_bytes_with(endpoint, policy, &Offline, body)
}

/// [`review_bytes`], knowing what `cluster` knows of other objects.
pub fn review_bytes_with(
    endpoint: Endpoint,
    policy: &Policy,
    cluster: &dyn Cluster,
    body: &[u8],
) -> Result<Reviewed, ReviewError> {
    let staged = review_stages(endpoint.stages(), policy, cluster, body)?;
    let one = match endpoint {
        Endpoint::Mutate => staged.mutate,
        Endpoint::Validate => staged.validate,
    };
    // Each stage asked for answers: the asked one is always there.
    Ok(one.unwrap_or_else(|| empty(endpoint)))
}

/// A body reviewed by the webhooks of `stages`: with both, as a cluster runs them (the
/// validating webhook sees the object as the mutating webhook's patch and the apiserver's
/// defaulting left it).
pub fn review_stages(
    stages: Stages,
    policy: &Policy,
    cluster: &dyn Cluster,
    body: &[u8],
) -> Result<Staged, ReviewError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ReviewError::Empty);
    }
    let shape = match stages {
        Stages::Validate => parse::Shape::Validation,
        Stages::Mutate | Stages::Both => parse::Shape::Full,
    };
    // Pods first: nearly every review is one, and the pod shape stops at `request.kind`
    // when it is not.
    if let Some(parsed) = parse::read_shape(body, shape) {
        return Ok(review_pod(
            stages,
            policy,
            cluster,
            parsed.request,
            Unread {
                labels: parsed.labels,
                placement: parsed.placement,
            },
            body,
        ));
    }
    match parse::peek(body) {
        // The exact parse: slower, and what decides how a body the fast path cannot read
        // is answered.
        Peeked::Pod => match serde_json::from_slice::<AdmissionReview<Pod>>(body) {
            Ok(review) => {
                check_envelope(&review.types.api_version, &review.types.kind)?;
                let req: AdmissionRequest<Pod> =
                    review.try_into().map_err(|_| ReviewError::NoRequest)?;
                Ok(review_pod(
                    stages,
                    policy,
                    cluster,
                    req,
                    Unread::default(),
                    body,
                ))
            }
            Err(e) => slow_path(stages, body, Some(e)),
        },
        Peeked::Other => match parse::workload(body) {
            // Not a pod: a workload, judged by the pods its templates will make.
            Some((req, object, old)) => Ok(review_workload(
                stages,
                policy,
                cluster,
                &req,
                object,
                old.as_ref(),
            )),
            None => slow_path(stages, body, None),
        },
    }
}

/// An answer for a stage that had nothing to answer (never, in practice): allowed.
fn empty(endpoint: Endpoint) -> Reviewed {
    Reviewed {
        endpoint,
        response: AdmissionResponse::invalid(""),
        outcome: Outcome::Allowed,
        uid: String::new(),
        namespace: String::new(),
        name: String::new(),
        operation: String::new(),
        dry_run: false,
        username: String::new(),
        unresolved: vec![],
        profile: None,
        about: About::Nothing,
    }
    .allowed()
}

impl Reviewed {
    fn allowed(mut self) -> Self {
        self.response.allowed = true;
        self.response.result = Status::success();
        self
    }

    /// The same answer from the other webhook: what both say of what neither judges.
    fn as_endpoint(&self, endpoint: Endpoint) -> Reviewed {
        let mut r = self.clone();
        r.endpoint = endpoint;
        r
    }
}

/// The answers of `stages` when each webhook says the same (nothing judged, or a body
/// tollgate cannot read: then the validating webhook never runs).
fn same(stages: Stages, r: Reviewed) -> Staged {
    match stages {
        Stages::Mutate => Staged {
            mutate: Some(r),
            validate: None,
        },
        Stages::Validate => Staged {
            mutate: None,
            validate: Some(r.as_endpoint(Endpoint::Validate)),
        },
        Stages::Both => {
            let validate = r
                .response
                .allowed
                .then(|| r.as_endpoint(Endpoint::Validate));
            Staged {
                mutate: Some(r),
                validate,
            }
        }
    }
}

/// What the parse left of a pod as text.
#[derive(Default)]
struct Unread<'a> {
    /// Its labels (else they are the object's own).
    labels: Option<&'a RawValue>,
    /// Where it may run (else that is in the object's spec).
    placement: Option<parse::Placement<'a>>,
}

/// A pod's review.
fn review_pod(
    stages: Stages,
    policy: &Policy,
    cluster: &dyn Cluster,
    mut req: AdmissionRequest<Pod>,
    unread: Unread<'_>,
    body: &[u8],
) -> Staged {
    let first = match stages {
        Stages::Validate => Endpoint::Validate,
        Stages::Mutate | Stages::Both => Endpoint::Mutate,
    };
    let mut reviewed = skeleton(first, &req, req.object.as_ref());
    let Some(mut pod) = req.object.take() else {
        return same(stages, reviewed);
    };
    // Subresources (status, binding, ephemeralcontainers from `kubectl debug`) are not the
    // pod its author wrote: never in tollgate's way.
    if req.sub_resource.as_deref().is_some_and(|s| !s.is_empty()) {
        return same(stages, reviewed);
    }
    let Some(operation) = policy_operation(&req.operation) else {
        return same(stages, reviewed);
    };
    // Along every path a mutation patches, the typed model tells an absent or null field
    // from an empty one, except for the two it requires: `metadata` and `spec.containers`.
    // Only when one of them reads as empty can the patch name a parent the sent object
    // lacks, so only then is the body read a second time.
    let ambiguous = pod.metadata == Default::default()
        || pod.spec.as_ref().is_some_and(|s| s.containers.is_empty());
    let who = requester(&req);
    let labels = match unread.labels {
        Some(raw) => PodLabels::Raw(Some(raw)),
        None => PodLabels::Parsed(pod.metadata.labels.as_ref()),
    };
    let selected = profile::select(policy, who.namespace, labels, cluster);
    reviewed.profile = selected.profile.map(str::to_owned);
    reviewed.unresolved.extend(selected.unresolved);
    let subject = Subject {
        policy: selected.policy,
        profile: selected.profile,
        who,
        operation,
        opt_out: None,
        template: false,
        queued: false,
        placement: unread.placement,
    };
    let mut j = judge::pod(
        &subject,
        cluster,
        &mut pod,
        stages,
        stages != Stages::Validate,
    );
    reviewed.unresolved.extend(j.unresolved.iter().cloned());
    let warning = selected.warning;
    match stages {
        Stages::Mutate => {
            mutation_answer(&mut reviewed, &j, warning, ambiguous, body);
            Staged {
                mutate: Some(reviewed),
                validate: None,
            }
        }
        Stages::Validate => {
            validation_answer(&mut reviewed, &mut j, warning);
            Staged {
                mutate: None,
                validate: Some(reviewed),
            }
        }
        Stages::Both => {
            let mut validated = reviewed.as_endpoint(Endpoint::Validate);
            mutation_answer(&mut reviewed, &j, warning.clone(), ambiguous, body);
            validation_answer(&mut validated, &mut j, warning);
            Staged {
                mutate: Some(reviewed),
                validate: Some(validated),
            }
        }
    }
}

/// The mutating webhook's answer for a pod, from its judgement.
fn mutation_answer(
    out: &mut Reviewed,
    j: &Judgement,
    profile_warning: Option<String>,
    ambiguous: bool,
    body: &[u8],
) {
    let mut warnings: Vec<String> = profile_warning.into_iter().collect();
    let mut review = PodReview::default();
    if let Some(m) = &j.mutation {
        review.opt_out.clone_from(&j.opt_out);
        if let Some(note) = &m.opted_out {
            out.response.audit_annotations = HashMap::from([("opt-out".to_owned(), note.clone())]);
        } else {
            if let Some(why) = j.opt_out.as_ref().and_then(OptOut::why) {
                warnings.push(format!("tollgate: {why}; the pod was handled as usual"));
            }
            warnings.extend(m.warnings.iter().cloned());
            review.steps.clone_from(&m.outcome.applied);
            if let Some(patch) = &m.patch {
                out.outcome = Outcome::Patched;
                out.response.patch = Some(patch.clone());
            }
        }
    }
    if !warnings.is_empty() {
        out.response.warnings = Some(warnings);
    }
    out.about = About::Pod(review);
    if out.response.patch.is_some() && ambiguous {
        anchor_to_sent_object(out, body);
    }
}

/// The validating webhook's answer for a pod, from its judgement.
/// Takes the decision out of `j` (the mutating webhook's answer, when there is one, is
/// drawn first).
fn validation_answer(out: &mut Reviewed, j: &mut Judgement, profile_warning: Option<String>) {
    let mut review = PodReview {
        quota_refusal: j.feasibility.as_mut().and_then(|f| f.admission.take()),
        ..PodReview::default()
    };
    let mut warnings: Vec<String> = profile_warning.into_iter().collect();
    if let Some(d) = j.validation.take() {
        review.verdict = Some(d.verdict);
        review.opt_out = d.opt_out;
        review.missing = d.missing;
        if !d.allowed {
            out.outcome = Outcome::Denied;
            out.response.allowed = false;
            out.response.result =
                Status::failure(d.message.as_deref().unwrap_or("denied"), "Forbidden")
                    .with_code(403);
        }
        if warnings.is_empty() {
            warnings = d.warnings;
        } else {
            warnings.extend(d.warnings);
        }
        out.response.audit_annotations = d.audit_annotations.into_iter().collect();
    }
    if !warnings.is_empty() {
        out.response.warnings = Some(warnings);
    }
    out.about = About::Pod(review);
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
        // A JSON patch always serialises; were it ever not to, the patch stays as it was.
        if let Ok(text) = serde_json::to_vec(&fixed) {
            reviewed.response.patch = Some(text);
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

fn check_envelope(api_version: &str, kind: &str) -> Result<(), ReviewError> {
    if !parse::is_admission_review_v1(api_version, kind) {
        return Err(ReviewError::NotAdmissionReview(format!(
            "apiVersion {api_version:?} kind {kind:?}; register the webhook with admissionReviewVersions: [v1]"
        )));
    }
    Ok(())
}

/// The body could not be read as the review its kind says it is: find out why, and
/// answer accordingly. `typed_err`: the pod parse's error, when it was tried.
fn slow_path(
    stages: Stages,
    body: &[u8],
    typed_err: Option<serde_json::Error>,
) -> Result<Staged, ReviewError> {
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
    let first = match stages {
        Stages::Validate => Endpoint::Validate,
        Stages::Mutate | Stages::Both => Endpoint::Mutate,
    };
    let mut reviewed = skeleton(first, &req, None);
    if req.kind.kind != "Pod" || !req.kind.group.is_empty() {
        // Registered for more than pods by mistake: tollgate has no opinion, so it stays out
        // of the way rather than blocking unrelated objects.
        reviewed.response.warnings = Some(vec![format!(
            "tollgate only reviews pods; this {} was allowed unchanged",
            req.kind.kind
        )]);
        return Ok(same(stages, reviewed));
    }
    // Why the pod did not parse, in the typed parse's words.
    let why = match typed_err {
        Some(e) => e.to_string(),
        None => serde_json::from_slice::<AdmissionReview<Pod>>(body)
            .err()
            .map_or_else(|| "unreadable".to_owned(), |e| e.to_string()),
    };
    reviewed.outcome = Outcome::Error;
    reviewed.response.allowed = false;
    reviewed.response.result = Status::failure(
        &format!("tollgate could not read this pod: {why}"),
        "BadRequest",
    )
    .with_code(400);
    Ok(same(stages, reviewed))
}

/// Who asks, and where.
fn requester<T: kube_core::Resource>(req: &AdmissionRequest<T>) -> Requester<'_> {
    Requester::new(
        req.namespace.as_deref().unwrap_or_default(),
        req.user_info.username.as_deref().unwrap_or_default(),
        req.user_info.groups.as_deref().unwrap_or_default(),
    )
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
        outcome: Outcome::Allowed,
        uid: req.uid.clone(),
        namespace: req.namespace.clone().unwrap_or_default(),
        name,
        operation: operation_str(&req.operation).to_owned(),
        dry_run: req.dry_run,
        username: req.user_info.username.clone().unwrap_or_default(),
        unresolved: vec![],
        profile: None,
        about: About::Nothing,
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

/// Reviews a workload (a kind other than Pod): its pod templates, if the policy lists the
/// kind; anything else is allowed unchanged, with a warning. With both stages, the
/// validating webhook judges the workload as the mutating webhook's patch left it.
fn review_workload(
    stages: Stages,
    policy: &Policy,
    cluster: &dyn Cluster,
    req: &AdmissionRequest<DynamicObject>,
    object: Value,
    old: Option<&Value>,
) -> Staged {
    let first = match stages {
        Stages::Validate => Endpoint::Validate,
        Stages::Mutate | Stages::Both => Endpoint::Mutate,
    };
    let mut reviewed = skeleton(first, req, None);
    reviewed.about = About::Workload(WorkloadReview {
        kind: req.kind.kind.clone(),
        templates: vec![],
        verdict: None,
        opt_out: None,
    });
    if reviewed.name.is_empty() {
        if let Some(g) = object
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
        {
            reviewed.name = format!("{g}*");
        }
    }
    if req.sub_resource.as_deref().is_some_and(|s| !s.is_empty()) {
        return same(stages, reviewed);
    }
    let Some(operation) = policy_operation(&req.operation) else {
        return same(stages, reviewed);
    };
    if req.kind.group == objects::GROUP {
        return review_policy_object(stages, policy, reviewed, &req.kind.kind, &object);
    }
    let who = requester(req);
    let labels = workload::labels_of(&object);
    let selected = profile::select(
        policy,
        who.namespace,
        PodLabels::Parsed(Some(&labels)),
        cluster,
    );
    reviewed.profile = selected.profile.map(str::to_owned);
    reviewed.unresolved.extend(selected.unresolved);
    let gvk = &req.kind;
    if gvk.group == trainjob::GROUP
        && matches!(
            gvk.kind.as_str(),
            "TrainingRuntime" | "ClusterTrainingRuntime"
        )
    {
        return review_runtime(
            stages,
            selected.policy,
            cluster,
            reviewed,
            &object,
            who,
            selected.warning,
        );
    }
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
        return same(stages, reviewed);
    };
    if !selected.policy.workloads.enabled {
        return same(stages, reviewed);
    }
    let warning = selected.warning;
    let mut staged = Staged::default();
    let mut object = object;
    if stages != Stages::Validate {
        let w = Workload {
            kind,
            object: &object,
            old,
            operation,
            who,
        };
        let mut out = reviewed.as_endpoint(Endpoint::Mutate);
        let m = workload::mutate(policy, cluster, &w);
        let mut warnings: Vec<String> = warning.clone().into_iter().collect();
        warnings.extend(m.warnings);
        out.response.audit_annotations = m.audit_annotations.into_iter().collect();
        out.unresolved.extend(m.unresolved);
        set_workload(&mut out, m.templates, None, m.opt_out);
        // With both webhooks, the validating one judges the object as patched.
        let patched = m
            .patch
            .as_ref()
            .filter(|_| stages == Stages::Both)
            .and_then(|p| {
                let patch: json_patch::Patch = serde_json::from_slice(p).ok()?;
                let mut doc = object.clone();
                json_patch::patch(&mut doc, &patch).ok()?;
                Some(doc)
            });
        if let Some(patch) = m.patch {
            out.outcome = Outcome::Patched;
            out.response.patch = Some(patch);
        }
        if !warnings.is_empty() {
            out.response.warnings = Some(warnings);
        }
        staged.mutate = Some(out);
        if let Some(p) = patched {
            object = p;
        }
    }
    if stages != Stages::Mutate {
        let w = Workload {
            kind,
            object: &object,
            old,
            operation,
            who,
        };
        let mut out = reviewed.as_endpoint(Endpoint::Validate);
        let v = workload::validate(policy, cluster, &w);
        let mut warnings: Vec<String> = warning.into_iter().collect();
        warnings.extend(v.warnings);
        out.response.audit_annotations = v.audit_annotations.into_iter().collect();
        out.unresolved.extend(v.unresolved);
        set_workload(&mut out, v.templates, v.verdict, v.opt_out);
        if !v.allowed {
            out.outcome = Outcome::Denied;
            out.response.allowed = false;
            out.response.result =
                Status::failure(v.message.as_deref().unwrap_or("denied"), "Forbidden")
                    .with_code(403);
        }
        if !warnings.is_empty() {
            out.response.warnings = Some(warnings);
        }
        staged.validate = Some(out);
    }
    staged
}

/// A Kubeflow Trainer runtime: nothing to mutate; validated by the pods a TrainJob on it
/// would make (`workload::validate_runtime`), and always admitted, what no TrainJob can
/// supply said in warnings.
fn review_runtime(
    stages: Stages,
    policy: &Policy,
    cluster: &dyn Cluster,
    reviewed: Reviewed,
    object: &Value,
    who: Requester<'_>,
    profile_warning: Option<String>,
) -> Staged {
    let mut staged = Staged::default();
    if stages != Stages::Validate {
        staged.mutate = Some(reviewed.as_endpoint(Endpoint::Mutate));
    }
    if stages != Stages::Mutate {
        let mut out = reviewed.as_endpoint(Endpoint::Validate);
        let mut warnings: Vec<String> = profile_warning.into_iter().collect();
        if policy.workloads.enabled {
            if let Some(v) = workload::validate_runtime(policy, cluster, object, who) {
                warnings.extend(v.warnings);
                out.unresolved.extend(v.unresolved);
                set_workload(&mut out, v.templates, v.verdict, None);
            }
        }
        if !warnings.is_empty() {
            out.response.warnings = Some(warnings);
        }
        staged.validate = Some(out);
    }
    staged
}

/// A TollgatePolicy or TollgateProfile: nothing to mutate; refused by the validating
/// webhook if it would not be applied (`objects::review`), which the CRD's schema cannot
/// see: the bounds, quantities, the merged result, a validation refusing its own mutation.
fn review_policy_object(
    stages: Stages,
    policy: &Policy,
    reviewed: Reviewed,
    kind: &str,
    object: &Value,
) -> Staged {
    let mut staged = Staged::default();
    if stages != Stages::Validate {
        staged.mutate = Some(reviewed.as_endpoint(Endpoint::Mutate));
    }
    if stages != Stages::Mutate {
        let mut out = reviewed.as_endpoint(Endpoint::Validate);
        let v = objects::review(policy, kind, object);
        if let Some(why) = v.refusal {
            out.outcome = Outcome::Denied;
            out.response.allowed = false;
            out.response.result = Status::failure(&why, "Invalid").with_code(422);
        }
        if !v.warnings.is_empty() {
            out.response.warnings = Some(v.warnings);
        }
        staged.validate = Some(out);
    }
    staged
}

fn set_workload(
    out: &mut Reviewed,
    templates: Vec<TemplateVerdict>,
    verdict: Option<Verdict>,
    opt_out: Option<OptOut>,
) {
    if let About::Workload(w) = &mut out.about {
        w.templates = templates;
        w.verdict = verdict;
        w.opt_out = opt_out;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::Gpus;
    use crate::mutate;

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
                assert_eq!(reviewed.outcome, Outcome::Allowed);
                assert!(reviewed.patch().is_none());
                assert!(reviewed.kind().is_some());
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
            if reviewed.outcome == Outcome::Patched {
                assert_eq!(reviewed.patch().unwrap(), expected);
                patched += 1;
            }
        }
        assert!(patched >= 3, "the fixtures exercise the patch: {patched}");
    }
}

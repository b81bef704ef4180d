//! The review: AdmissionReview bytes in, AdmissionReview out.
//!
//! Pure: no I/O and no clock. The HTTP routes and `tollgate review` both call
//! [`review_bytes_with`] (or [`review_stages`] for both webhooks at once), so what a user
//! sees offline is what the cluster gets. One look at `request.kind` chooses the one parse
//! of the body: a pod's (its typed fast path) or a workload's (its objects as JSON). A pod
//! is judged by [`judge::pod`], a workload by [`workload`]; this module turns what they
//! found into the AdmissionReview each webhook answers.
//!
//! Its rooms: `pods` (a pod's review and the two answers drawn from its judgement),
//! `workloads` (a workload's, a Trainer runtime's and a policy object's), `unreadable`
//! (what a body that is not the review its kind says is answered with), `wire` (the
//! AdmissionReview written back). What every kind shares is here: the answer's skeleton
//! and [`per_stage`], which runs each webhook a stage asks for.

mod pods;
mod unreadable;
mod wire;
mod workloads;

use k8s_openapi::api::core::v1::Pod;
use kube_core::admission::{self, AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube_core::Status;

use crate::cluster::{Cluster, ObjectKey, Offline};
use crate::mutate::Step;
use crate::optout::OptOut;
use crate::parse::{self, Peeked};
use crate::policy::{Operation, Policy};
use crate::requester::Requester;
use crate::stage::Stage;
use crate::validate::{Missing, Verdict};
use crate::workload::TemplateVerdict;

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
    pub endpoint: Stage,
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
    /// create with after the webhooks, where it refuses it (`feasible::Outlook::admission`).
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
}

/// Both webhooks' answers to one review, in a cluster's order: the validating webhook's
/// is None when it did not run (not asked, or the mutating webhook refused).
#[derive(Debug, Clone, Default)]
pub(crate) struct Staged {
    pub mutate: Option<Reviewed>,
    pub validate: Option<Reviewed>,
}

/// Parses a body and reviews it, with no cluster context. Errors are bodies that are not an
/// AdmissionReview at all.
pub fn review_bytes(stage: Stage, policy: &Policy, body: &[u8]) -> Result<Reviewed, ReviewError> {
    review_bytes_with(stage, policy, &Offline, body)
}

/// [`review_bytes`], knowing what `cluster` knows of other objects: the answer of the last
/// webhook of `stage` that ran (the one a review posted to it gets, for `Mutate` or
/// `Validate`; for `All`, the validating webhook's, unless the mutating one refused).
pub fn review_bytes_with(
    stage: Stage,
    policy: &Policy,
    cluster: &dyn Cluster,
    body: &[u8],
) -> Result<Reviewed, ReviewError> {
    let staged = review_stages(stage, policy, cluster, body)?;
    // Each stage asked for answers: the first one is always there.
    Ok(staged
        .validate
        .or(staged.mutate)
        .unwrap_or_else(|| empty(stage.first())))
}

/// A body reviewed by the webhooks of `stages`: with both, as a cluster runs them (the
/// validating webhook sees the object as the mutating webhook's patch and the apiserver's
/// defaulting left it).
pub(crate) fn review_stages(
    stages: Stage,
    policy: &Policy,
    cluster: &dyn Cluster,
    body: &[u8],
) -> Result<Staged, ReviewError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ReviewError::Empty);
    }
    // Pods first: nearly every review is one, and the pod shape stops at `request.kind`
    // when it is not.
    if let Some(parsed) = parse::read_shape(body, stages) {
        return Ok(pods::review_pod(
            stages,
            policy,
            cluster,
            parsed.request,
            pods::Unread {
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
                unreadable::check_envelope(&review.types.api_version, &review.types.kind)?;
                let req: AdmissionRequest<Pod> =
                    review.try_into().map_err(|_| ReviewError::NoRequest)?;
                Ok(pods::review_pod(
                    stages,
                    policy,
                    cluster,
                    req,
                    pods::Unread::default(),
                    body,
                ))
            }
            Err(e) => unreadable::slow_path(stages, body, Some(e)),
        },
        Peeked::Other => match parse::workload(body) {
            // Not a pod: a workload, judged by the pods its templates will make.
            Some((req, object, old)) => Ok(workloads::review_workload(
                stages,
                policy,
                cluster,
                &req,
                object,
                old.as_ref(),
            )),
            None => unreadable::slow_path(stages, body, None),
        },
    }
}

/// An answer for a stage that had nothing to answer (never, in practice): allowed.
fn empty(endpoint: Stage) -> Reviewed {
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
    fn as_endpoint(&self, endpoint: Stage) -> Reviewed {
        let mut r = self.clone();
        r.endpoint = endpoint;
        r
    }
}

/// The answers of `stages` when each webhook says the same (nothing judged, or a body
/// tollgate cannot read: then the validating webhook never runs).
fn same(stages: Stage, r: Reviewed) -> Staged {
    match stages {
        Stage::Mutate => Staged {
            mutate: Some(r),
            validate: None,
        },
        Stage::Validate => Staged {
            mutate: None,
            validate: Some(r.as_endpoint(Stage::Validate)),
        },
        Stage::All => {
            let validate = r.response.allowed.then(|| r.as_endpoint(Stage::Validate));
            Staged {
                mutate: Some(r),
                validate,
            }
        }
    }
}

/// Each webhook's answer where `stages` runs it, each from a copy of `reviewed` as its own:
/// `mutate` writes the mutating webhook's and hands on what the validating webhook judges
/// after it (a workload as patched); `validate` writes the validating webhook's from that
/// (None: the mutating webhook did not run).
fn per_stage<T>(
    stages: Stage,
    reviewed: &Reviewed,
    mutate: impl FnOnce(Reviewed) -> (Reviewed, T),
    validate: impl FnOnce(Reviewed, Option<T>) -> Reviewed,
) -> Staged {
    let mut staged = Staged::default();
    let mut handed = None;
    if stages != Stage::Validate {
        let (answer, on) = mutate(reviewed.as_endpoint(Stage::Mutate));
        staged.mutate = Some(answer);
        handed = Some(on);
    }
    if stages != Stage::Mutate {
        staged.validate = Some(validate(reviewed.as_endpoint(Stage::Validate), handed));
    }
    staged
}

/// The warnings kubectl prints of `out`: the profile's (one that was skipped) first, then
/// the webhook's; none, none.
fn warn(out: &mut Reviewed, profile: Option<String>, webhook: Vec<String>) {
    let warnings = match profile {
        None => webhook,
        Some(p) => {
            let mut all = Vec::with_capacity(webhook.len() + 1);
            all.push(p);
            all.extend(webhook);
            all
        }
    };
    if !warnings.is_empty() {
        out.response.warnings = Some(warnings);
    }
}

/// `out` made a refusal (`Denied`, or `Error` for a review tollgate could not judge):
/// `message` for the user, the status's `reason` and `code`.
fn refuse(out: &mut Reviewed, outcome: Outcome, message: &str, reason: &str, code: u16) {
    out.outcome = outcome;
    out.response.allowed = false;
    out.response.result = Status::failure(message, reason).with_code(code);
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
    endpoint: Stage,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::Gpus;
    use crate::mutate;
    use serde_json::Value;

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
                let reviewed = review_bytes(Stage::Mutate, &policy, &body).unwrap();
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
            mutate::mutate(&policy, &mut mutated, &gpus, None, &Offline);
            let expected = json_patch::diff(
                &serde_json::to_value(&pod).unwrap(),
                &serde_json::to_value(&mutated).unwrap(),
            );
            let reviewed = review_bytes(Stage::Mutate, &policy, &body).unwrap();
            if reviewed.outcome == Outcome::Patched {
                assert_eq!(reviewed.patch().unwrap(), expected);
                patched += 1;
            }
        }
        assert!(patched >= 3, "the fixtures exercise the patch: {patched}");
    }
}

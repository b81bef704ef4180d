//! A body that could not be read as the review its kind says it is: why, and what it is
//! answered with (a 400, or "allowed: not a pod").

use k8s_openapi::api::core::v1::Pod;
use kube_core::admission::{AdmissionRequest, AdmissionReview};
use kube_core::DynamicObject;
use serde_json::Value;

use super::{refuse, same, skeleton, Outcome, ReviewError, Staged};
use crate::parse;
use crate::stage::Stage;

pub(super) fn check_envelope(api_version: &str, kind: &str) -> Result<(), ReviewError> {
    if !parse::is_admission_review_v1(api_version, kind) {
        return Err(ReviewError::NotAdmissionReview(format!(
            "apiVersion {api_version:?} kind {kind:?}; register the webhook with admissionReviewVersions: [v1]"
        )));
    }
    Ok(())
}

/// The body could not be read as the review its kind says it is: find out why, and
/// answer accordingly. `typed_err`: the pod parse's error, when it was tried.
pub(super) fn slow_path(
    stages: Stage,
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
    let mut reviewed = skeleton(stages.first(), &req, None);
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
    refuse(
        &mut reviewed,
        Outcome::Error,
        &format!("tollgate could not read this pod: {why}"),
        "BadRequest",
        400,
    );
    Ok(same(stages, reviewed))
}

//! The routes and their handlers: `POST /mutate` and `POST /validate` (each a call to
//! [`review_bytes_with`], the same call the `review` command makes), the probes, the metrics
//! port, and the floor the load benchmark measures against.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, MethodRouter};
use axum::Router;
use tracing::{info, warn};

use super::{AppState, Limits};
use crate::cluster::objects::ObjectKind;
use crate::metrics::Metrics;
use tollgate_core::{
    review_bytes_with, Layered, OptOut, Policy, ReviewError, Reviewed, Stage, BASE_PROFILE,
};

/// The webhook's routes. Used by the TLS server and, without a socket, by tests.
pub fn router(state: Arc<AppState>) -> Router {
    routes(state, any(mutate), any(validate))
}

/// The route table, with the two review handlers given: the webhook's and the floor's.
fn routes(
    state: Arc<AppState>,
    mutate: MethodRouter<Arc<AppState>>,
    validate: MethodRouter<Arc<AppState>>,
) -> Router {
    Router::new()
        .route("/mutate", mutate)
        .route("/validate", validate)
        .route("/healthz", any(healthz))
        .route("/readyz", any(readyz))
        .fallback(not_found)
        .with_state(state)
}

/// The metrics port's routes (plain HTTP, separate from the webhook's TLS port).
pub fn metrics_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(
            "/metrics",
            any(
                |State(s): State<Arc<AppState>>, method: Method| async move {
                    if method != Method::GET {
                        return wrong_method(&method, "GET").into_response();
                    }
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        {
                            s.metrics.observe_cluster(&s.cluster.status());
                            if let Some(o) = s.cluster.policy_objects() {
                                for kind in ObjectKind::ALL {
                                    s.metrics.set_objects_served(kind.kind(), o.served(kind));
                                }
                            }
                            s.metrics.encode()
                        },
                    )
                        .into_response()
                },
            ),
        )
        .fallback(|| async {
            text(
                StatusCode::NOT_FOUND,
                "not found: metrics are at GET /metrics\n",
            )
        })
        .with_state(state)
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

fn wrong_method(method: &Method, allowed: &'static str) -> Response {
    let mut r = text(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {method} not allowed here; use {allowed}\n"),
    );
    r.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allowed));
    r
}

async fn not_found(req: Request) -> Response {
    text(
        StatusCode::NOT_FOUND,
        format!(
            "no route for {}; tollgate serves POST /mutate, POST /validate, GET /healthz and GET /readyz\n",
            req.uri().path()
        ),
    )
}

async fn healthz(method: Method) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return wrong_method(&method, "GET");
    }
    text(StatusCode::OK, "ok\n")
}

async fn readyz(State(s): State<Arc<AppState>>, method: Method) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return wrong_method(&method, "GET");
    }
    if !s.ready.load(Ordering::Relaxed) {
        return text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n");
    }
    if s.certs.get().is_some_and(|c| !c.is_loaded()) {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting for the serving certificate (self-managed: its Secret)\n",
        );
    }
    if !s.cluster.synced() {
        let waiting: Vec<&str> = s
            .cluster
            .status()
            .iter()
            .filter(|r| !r.ready)
            .map(|r| r.resource)
            .collect();
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: the cluster context has not listed {} yet\n",
                waiting.join(", ")
            ),
        );
    }
    // A restart with objects stored is ready with them in force, not the file alone.
    if s.cluster.policy_objects().is_some_and(|o| !o.ready()) {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the TollgatePolicy and TollgateProfiles listed are not in force yet\n",
        );
    }
    text(
        StatusCode::OK,
        format!("ready: policy {}\n", s.policy.load().hash),
    )
}

async fn mutate(State(s): State<Arc<AppState>>, req: Request) -> Response {
    handle(s, Stage::Mutate, req).await
}

async fn validate(State(s): State<Arc<AppState>>, req: Request) -> Response {
    handle(s, Stage::Validate, req).await
}

/// Decrements the in-flight gauge however the handler ends (including a dropped future).
struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

async fn handle(s: Arc<AppState>, endpoint: Stage, req: Request) -> Response {
    let start = Instant::now();
    s.metrics.in_flight.inc();
    let _guard = InFlight(&s.metrics);
    if req.method() != Method::POST {
        return wrong_method(req.method(), "POST");
    }
    let body = match read_body(&s.limits, req).await {
        Ok(b) => b,
        Err(resp) => {
            let elapsed = start.elapsed();
            s.metrics
                .observe_rejected(endpoint.as_str(), elapsed.as_secs_f64());
            // Every request to a review endpoint leaves a line, the ones never read too.
            warn!(
                endpoint = %endpoint.as_str(),
                status = resp.status().as_u16(),
                duration_us = elapsed.as_micros() as u64,
                "review body not read"
            );
            return resp;
        }
    };
    let active = s.policy.load();
    match review(&s, endpoint, &active.policy, &body).await {
        Ok(reviewed) => {
            let out = reviewed.to_json();
            let elapsed = start.elapsed();
            s.metrics.observe(&reviewed, elapsed.as_secs_f64());
            log_review(&reviewed, elapsed, &active.hash);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                out,
            )
                .into_response()
        }
        Err(e) => {
            let elapsed = start.elapsed();
            s.metrics
                .observe_rejected(endpoint.as_str(), elapsed.as_secs_f64());
            warn!(
                endpoint = %endpoint.as_str(),
                status = 400,
                duration_us = elapsed.as_micros() as u64,
                error = %e,
                "rejected a request that is not a usable AdmissionReview"
            );
            text(StatusCode::BAD_REQUEST, format!("{e}\n"))
        }
    }
}

/// Reviews in the cluster context; objects it did not know (a claim created a moment ago)
/// are fetched once, bounded, and the review run again with them.
async fn review(
    s: &AppState,
    endpoint: Stage,
    policy: &Policy,
    body: &[u8],
) -> Result<Reviewed, ReviewError> {
    let context = &*s.cluster;
    let reviewed = review_bytes_with(endpoint, policy, context, body)?;
    if reviewed.unresolved.is_empty() {
        return Ok(reviewed);
    }
    let fetched = context.fetch(&reviewed.unresolved).await;
    if fetched.is_empty() {
        return Ok(reviewed);
    }
    let layered = Layered {
        first: &fetched,
        then: context,
    };
    review_bytes_with(endpoint, policy, &layered, body)
}

async fn read_body(limits: &Limits, req: Request) -> Result<Bytes, Response> {
    let too_large = || {
        text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "request body larger than {} bytes (--max-body-bytes)\n",
                limits.max_body_bytes
            ),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body_bytes as u64) {
        return Err(too_large());
    }
    let read = axum::body::to_bytes(req.into_body(), limits.max_body_bytes);
    match tokio::time::timeout(limits.review_deadline, read).await {
        Err(_) => Err(text(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "request body not received within {:?} (--review-deadline)\n",
                limits.review_deadline
            ),
        )),
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => {
            // By its type, anywhere in the chain: axum wraps http-body-util's error, and
            // a body of another kind may wrap it deeper.
            let is_limit =
                std::iter::successors(Some(&e as &(dyn std::error::Error + 'static)), |e| {
                    e.source()
                })
                .any(|e| e.is::<http_body_util::LengthLimitError>());
            if is_limit {
                Err(too_large())
            } else {
                Err(text(
                    StatusCode::BAD_REQUEST,
                    format!("could not read the request body: {e}\n"),
                ))
            }
        }
    }
}

fn log_review(r: &Reviewed, elapsed: Duration, policy_hash: &str) {
    let steps = r
        .steps()
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",");
    // A workload's line names its kind and what became of each template; a pod's has
    // neither field.
    let templates = r.kind().map(|_| {
        r.templates()
            .iter()
            .map(|t| format!("{}={}", t.template, t.decision))
            .collect::<Vec<_>>()
            .join(",")
    });
    info!(
        uid = %r.uid,
        endpoint = %r.endpoint.as_str(),
        kind = r.kind(),
        namespace = %r.namespace,
        name = %r.name,
        templates = templates.as_deref(),
        operation = %r.operation,
        dry_run = r.dry_run,
        decision = %r.outcome.as_str(),
        verdict = r.verdict().map(|v| tracing::field::display(v.as_str())),
        steps = %steps,
        profile = %shown_profile(r.profile.as_deref()),
        duration_us = elapsed.as_micros() as u64,
        policy = %policy_hash,
        "review"
    );
    match r.opt_out() {
        Some(OptOut::Honoured) => info!(
            uid = %r.uid, endpoint = %r.endpoint.as_str(), user = %r.username,
            kind = r.kind(), namespace = %r.namespace, name = %r.name,
            "opt-out honoured"
        ),
        Some(OptOut::Refused(why)) => info!(
            uid = %r.uid, endpoint = %r.endpoint.as_str(), user = %r.username,
            kind = r.kind(), namespace = %r.namespace, name = %r.name,
            reason = %why, "opt-out refused"
        ),
        _ => {}
    }
}

/// The profile a review's line names: a namespace's TollgateProfile as kubectl names the
/// object (`TollgateProfile ml/default`, or `gpu+TollgateProfile ml/default` over the
/// cluster's profile `gpu`); the engine calls it `ml/default` (`gpu+ml/default`).
fn shown_profile(profile: Option<&str>) -> std::borrow::Cow<'_, str> {
    use tollgate_core::PROFILE_KIND;
    match profile {
        None => BASE_PROFILE.into(),
        Some(p) if p.contains('/') => match p.split_once('+') {
            Some((over, object)) => format!("{over}+{PROFILE_KIND} {object}").into(),
            None => format!("{PROFILE_KIND} {p}").into(),
        },
        Some(p) => p.into(),
    }
}

/// The floor's routes: [`router`] with the review handler replaced by a constant answer.
pub fn floor_router(state: Arc<AppState>) -> Router {
    async fn constant(State(s): State<Arc<AppState>>, req: Request) -> Response {
        if req.method() != Method::POST {
            return wrong_method(req.method(), "POST");
        }
        match read_body(&s.limits, req).await {
            Ok(_) => (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                &br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":true}}"#[..],
            )
                .into_response(),
            Err(resp) => resp,
        }
    }
    routes(state, any(constant), any(constant))
}

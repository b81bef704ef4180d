//! The HTTP surface through `router()`, without a socket: routes, methods, bad bodies.

use crate::common;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt as _;
use serde_json::Value;
use tower::ServiceExt as _;

async fn call(method: Method, path: &str, body: Vec<u8>) -> (StatusCode, String) {
    let app = tollgate::router(common::default_state());
    call_on(app, method, path, body).await
}

async fn call_on(
    app: axum::Router,
    method: Method,
    path: &str,
    body: Vec<u8>,
) -> (StatusCode, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn every_fixture_is_answered_with_its_uid() {
    for name in common::fixture_names() {
        let body = common::fixture(&name);
        let sent: Value = serde_json::from_slice(&body).unwrap();
        let endpoint = if name.contains("mutate") {
            "/mutate"
        } else {
            "/validate"
        };
        // The apiserver appends ?timeout=...: query strings are ignored.
        let (status, text) = call(Method::POST, &format!("{endpoint}?timeout=5s"), body).await;
        assert_eq!(status, StatusCode::OK, "{name}: {text}");
        let got: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(got["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(got["kind"], "AdmissionReview");
        assert_eq!(got["response"]["uid"], sent["request"]["uid"], "{name}");
    }
}

#[tokio::test]
async fn health_and_readiness() {
    let (s, t) = call(Method::GET, "/healthz", vec![]).await;
    assert_eq!((s, t.as_str()), (StatusCode::OK, "ok\n"));
    let (s, t) = call(Method::GET, "/readyz", vec![]).await;
    assert_eq!(s, StatusCode::OK);
    assert!(t.starts_with("ready"), "{t}");

    let state = common::default_state();
    state
        .ready
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let (s, _) = call_on(tollgate::router(state), Method::GET, "/readyz", vec![]).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
}

/// Each bad request gets a clear 4xx with a message, and the next valid review is answered.
#[tokio::test]
async fn bad_requests_get_clear_errors_and_the_server_keeps_serving() {
    let state = common::default_state();
    let valid = common::fixture("resnet50-master-0.mutate.json");
    let mut review: Value = serde_json::from_slice(&valid).unwrap();
    // Neither a pod nor a workload the policy lists (a Deployment now is one).
    let not_a_pod = {
        let mut r = review.clone();
        r["request"]["kind"] =
            serde_json::json!({"group": "", "version": "v1", "kind": "ConfigMap"});
        r["request"]["object"] =
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d"}});
        r
    };
    let broken_pod = {
        let mut r = review.clone();
        r["request"]["object"]["spec"]["containers"] = serde_json::json!("not a list");
        r
    };
    let v1beta1 = {
        let mut r = review.clone();
        r["apiVersion"] = "admission.k8s.io/v1beta1".into();
        r
    };
    review["request"] = Value::Null;
    let no_request = review;
    // (what, method, path, body, expected status, expected text)
    type Case<'a> = (&'a str, Method, &'a str, Vec<u8>, StatusCode, &'a str);
    let cases: Vec<Case> = vec![
        (
            "empty body",
            Method::POST,
            "/mutate",
            vec![],
            StatusCode::BAD_REQUEST,
            "empty body",
        ),
        (
            "not JSON",
            Method::POST,
            "/mutate",
            b"hello".to_vec(),
            StatusCode::BAD_REQUEST,
            "not JSON",
        ),
        (
            "JSON array",
            Method::POST,
            "/validate",
            b"[1,2]".to_vec(),
            StatusCode::BAD_REQUEST,
            "not an admission.k8s.io/v1 AdmissionReview",
        ),
        (
            "other JSON",
            Method::POST,
            "/mutate",
            br#"{"kind":"Pod"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "AdmissionReview",
        ),
        (
            "v1beta1",
            Method::POST,
            "/mutate",
            serde_json::to_vec(&v1beta1).unwrap(),
            StatusCode::BAD_REQUEST,
            "admissionReviewVersions",
        ),
        (
            "no request",
            Method::POST,
            "/validate",
            serde_json::to_vec(&no_request).unwrap(),
            StatusCode::BAD_REQUEST,
            "no request",
        ),
        (
            "wrong method",
            Method::GET,
            "/mutate",
            vec![],
            StatusCode::METHOD_NOT_ALLOWED,
            "use POST",
        ),
        (
            "wrong method on health",
            Method::POST,
            "/healthz",
            vec![],
            StatusCode::METHOD_NOT_ALLOWED,
            "use GET",
        ),
        (
            "wrong path",
            Method::POST,
            "/admit",
            vec![],
            StatusCode::NOT_FOUND,
            "POST /mutate",
        ),
        (
            "too large",
            Method::POST,
            "/mutate",
            vec![b' '; 8 * 1024 * 1024],
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger than",
        ),
    ];
    for (what, method, path, body, status, needle) in cases {
        let (s, text) = call_on(tollgate::router(state.clone()), method, path, body).await;
        assert_eq!(s, status, "{what}: {text}");
        assert!(text.contains(needle), "{what}: {text:?} lacks {needle:?}");
        let (s, text) = call_on(
            tollgate::router(state.clone()),
            Method::POST,
            "/mutate",
            valid.clone(),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "after {what}: {text}");
    }

    // A well-formed review of something other than a pod or a workload: allowed, unchanged,
    // with a warning.
    let (s, text) = call_on(
        tollgate::router(state.clone()),
        Method::POST,
        "/mutate",
        serde_json::to_vec(&not_a_pod).unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["response"]["allowed"], true);
    assert!(v["response"].get("patch").is_none());
    assert!(v["response"]["warnings"][0]
        .as_str()
        .unwrap()
        .contains("only reviews pods"));

    // A review whose pod cannot be read: refused with code 400 and the reason, uid kept.
    let (s, text) = call_on(
        tollgate::router(state.clone()),
        Method::POST,
        "/validate",
        serde_json::to_vec(&broken_pod).unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["response"]["allowed"], false);
    assert_eq!(v["response"]["status"]["code"], 400);
    assert_eq!(v["response"]["uid"], "2610fad8-08ba-48f2-a959-168d18614d77");
    assert!(v["response"]["status"]["message"]
        .as_str()
        .unwrap()
        .contains("could not read this pod"));
}

#[tokio::test]
async fn metrics_count_reviews() {
    let state = common::default_state();
    for name in [
        "resnet50-master-0.mutate.json",
        "notebook-helper.validate.json",
        "notebook-helper.mutate.json",
    ] {
        let endpoint = if name.contains("mutate") {
            "/mutate"
        } else {
            "/validate"
        };
        let (s, _) = call_on(
            tollgate::router(state.clone()),
            Method::POST,
            endpoint,
            common::fixture(name),
        )
        .await;
        assert_eq!(s, StatusCode::OK);
    }
    let _ = call_on(
        tollgate::router(state.clone()),
        Method::POST,
        "/mutate",
        b"nope".to_vec(),
    )
    .await;
    let text = state.metrics.encode();
    for line in [
        r#"tollgate_reviews_total{endpoint="mutate",operation="CREATE",result="patched"} 1"#,
        r#"tollgate_reviews_total{endpoint="mutate",operation="CREATE",result="allowed"} 1"#,
        r#"tollgate_reviews_total{endpoint="validate",operation="CREATE",result="denied"} 1"#,
        r#"tollgate_reviews_total{endpoint="mutate",operation="unknown",result="error"} 1"#,
        r#"tollgate_denials_total{reason="missing_requests"} 1"#,
        r#"tollgate_mutation_steps_total{step="tolerations"} 1"#,
        r#"tollgate_review_duration_seconds_count{endpoint="mutate"} 3"#,
        "tollgate_requests_in_flight 0",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

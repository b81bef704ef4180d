//! Every metric end to end: real reviews over TLS, then a scrape of the real metrics port.

use crate::common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::net::{self, Client};
use common::scrape::{self, Sample};
use serde_json::Value;

async fn scrape(server: &net::TestServer) -> Vec<Sample> {
    scrape::parse(&net::get_metrics(server.running.metrics_addr.unwrap()).await)
}

/// The debug-shell review with its requester changed to someone the default policy does not
/// let opt out (only system:masters may).
fn refused_opt_out(name: &str) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&common::fixture(name)).unwrap();
    v["request"]["uid"] = Value::String(format!("refused-{name}"));
    v["request"]["userInfo"] = serde_json::json!({
        "username": "alice@example.com",
        "groups": ["ml-researchers", "system:authenticated"],
    });
    serde_json::to_vec(&v).unwrap()
}

/// A pod review whose pod cannot be read (containers is not a list): answered 200 with a
/// 400 status inside, counted as an error of its operation.
fn unreadable_pod() -> Vec<u8> {
    let mut v: Value =
        serde_json::from_slice(&common::fixture("resnet50-master-0.mutate.json")).unwrap();
    v["request"]["object"]["spec"]["containers"] = Value::String("nope".into());
    serde_json::to_vec(&v).unwrap()
}

#[tokio::test]
async fn reviews_are_counted_by_endpoint_operation_result_step_reason_and_opt_out() {
    let server = net::start(|_| {}).await;
    let before = scrape(&server).await;
    // Series that alerts and dashboards read exist at zero before anything happened.
    for (name, labels) in [
        ("tollgate_policy_reloads_total", vec![("result", "failure")]),
        (
            "tollgate_certificate_reloads_total",
            vec![("result", "failure")],
        ),
        (
            "tollgate_reviews_total",
            vec![
                ("endpoint", "validate"),
                ("operation", "CREATE"),
                ("result", "denied"),
            ],
        ),
        (
            "tollgate_opt_outs_total",
            vec![("endpoint", "mutate"), ("decision", "honoured")],
        ),
        (
            "tollgate_denials_total",
            vec![("reason", "missing_requests")],
        ),
        (
            "tollgate_mutation_steps_total",
            vec![("step", "tolerations")],
        ),
    ] {
        assert_eq!(
            scrape::value(&before, name, &labels),
            Some(0.0),
            "{name}{labels:?} at start"
        );
    }

    let mut h1 = Client::connect(server.addr(), &server.ca_pem, false).await;
    let mut h2 = Client::connect(server.addr(), &server.ca_pem, true).await;
    let mutate = [
        "resnet50-master-0.mutate.json",            // patched: 4 steps
        "resnet50-worker-generatename.mutate.json", // patched: 4 steps
        "preprocess-abcde.mutate.json",             // patched: metrics-sidecar, default-resources
        "notebook-helper.mutate.json",              // allowed: not a training pod
        "debug-shell.mutate.json",                  // allowed: opt-out honoured
    ];
    let validate = [
        "resnet50-master-0.validate.json", // denied: missing requests
        "notebook-helper.validate.json",   // denied: missing requests
        "resnet50-worker-generatename.validate.json", // allowed
        "preprocess-abcde.update.validate.json", // allowed, UPDATE
        "debug-shell.validate.json",       // allowed: opt-out honoured
    ];
    for (i, name) in mutate.iter().enumerate() {
        let c = if i % 2 == 0 { &mut h1 } else { &mut h2 };
        assert_eq!(
            c.post("/mutate", common::fixture(name)).await.0,
            200,
            "{name}"
        );
    }
    for (i, name) in validate.iter().enumerate() {
        let c = if i % 2 == 0 { &mut h1 } else { &mut h2 };
        assert_eq!(
            c.post("/validate", common::fixture(name)).await.0,
            200,
            "{name}"
        );
    }
    // Refused opt-outs: mutation handles the pod as usual, validation judges it.
    let (s, body) = h1
        .post("/mutate", refused_opt_out("debug-shell.mutate.json"))
        .await;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        v["response"]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("not permitted"),
        "{v}"
    );
    let (s, body) = h2
        .post("/validate", refused_opt_out("debug-shell.validate.json"))
        .await;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["allowed"], false, "{v}");
    // Errors: a pod that cannot be read, and bodies that are no review at all.
    let (s, body) = h1.post("/mutate", unreadable_pod()).await;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["status"]["code"], 400, "{v}");
    assert_eq!(h1.post("/validate", b"{}".to_vec()).await.0, 400);
    assert_eq!(h2.post("/mutate", b"not json".to_vec()).await.0, 400);

    let m = scrape(&server).await;
    let reviews = |endpoint: &str, operation: &str, result: &str| {
        scrape::value(
            &m,
            "tollgate_reviews_total",
            &[
                ("endpoint", endpoint),
                ("operation", operation),
                ("result", result),
            ],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(reviews("mutate", "CREATE", "patched"), 3.0);
    assert_eq!(reviews("mutate", "CREATE", "allowed"), 3.0);
    assert_eq!(reviews("mutate", "CREATE", "error"), 1.0);
    assert_eq!(reviews("mutate", "unknown", "error"), 1.0);
    assert_eq!(reviews("validate", "CREATE", "denied"), 3.0);
    assert_eq!(reviews("validate", "CREATE", "allowed"), 2.0);
    assert_eq!(reviews("validate", "UPDATE", "allowed"), 1.0);
    assert_eq!(reviews("validate", "unknown", "error"), 1.0);
    assert_eq!(scrape::sum(&m, "tollgate_reviews_total", &[]), 15.0);

    let step =
        |s: &str| scrape::value(&m, "tollgate_mutation_steps_total", &[("step", s)]).unwrap_or(0.0);
    assert_eq!(step("tolerations"), 2.0);
    assert_eq!(step("driver-mounts"), 2.0);
    assert_eq!(step("metrics-sidecar"), 3.0);
    assert_eq!(step("default-resources"), 3.0);

    assert_eq!(
        scrape::value(
            &m,
            "tollgate_denials_total",
            &[("reason", "missing_requests")]
        ),
        Some(3.0)
    );
    assert_eq!(scrape::sum(&m, "tollgate_denials_total", &[]), 3.0);

    let opt = |endpoint: &str, decision: &str| {
        scrape::value(
            &m,
            "tollgate_opt_outs_total",
            &[("endpoint", endpoint), ("decision", decision)],
        )
    };
    assert_eq!(opt("mutate", "honoured"), Some(1.0));
    assert_eq!(opt("validate", "honoured"), Some(1.0));
    assert_eq!(opt("mutate", "refused"), Some(1.0));
    assert_eq!(opt("validate", "refused"), Some(1.0));

    // The histogram: the documented buckets, cumulative, one observation per review.
    let buckets: Vec<&Sample> = m
        .iter()
        .filter(|s| {
            s.name == "tollgate_review_duration_seconds_bucket"
                && s.labels.get("endpoint").map(String::as_str) == Some("mutate")
        })
        .collect();
    let bounds: Vec<f64> = buckets
        .iter()
        .map(|s| {
            let le = &s.labels["le"];
            if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap()
            }
        })
        .collect();
    assert_eq!(
        bounds,
        vec![
            0.00005,
            0.0001,
            0.00025,
            0.0005,
            0.001,
            0.0025,
            0.005,
            0.01,
            0.025,
            0.05,
            0.1,
            0.25,
            0.5,
            1.0,
            2.5,
            5.0,
            10.0,
            f64::INFINITY
        ]
    );
    assert!(buckets.windows(2).all(|w| w[0].value <= w[1].value));
    let count = |endpoint: &str| {
        scrape::value(
            &m,
            "tollgate_review_duration_seconds_count",
            &[("endpoint", endpoint)],
        )
        .unwrap()
    };
    assert_eq!(count("mutate"), 8.0);
    assert_eq!(count("validate"), 7.0);
    assert_eq!(buckets.last().unwrap().value, 8.0);
    let sum = scrape::value(
        &m,
        "tollgate_review_duration_seconds_sum",
        &[("endpoint", "mutate")],
    )
    .unwrap();
    assert!(sum > 0.0 && sum < 8.0 * 10.0, "{sum}");

    assert_eq!(
        scrape::value(&m, "tollgate_requests_in_flight", &[]),
        Some(0.0)
    );
    server.running.shutdown().await;
}

/// A TollgateProfile the validating webhook refuses (a quantity that does not parse) is
/// counted with a reason of its own, never `unknown`.
#[tokio::test]
async fn a_refused_policy_object_is_counted_with_its_reason() {
    let server = net::start(|_| {}).await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "profile-1",
            "kind": {"group": "tollgate.dev", "version": "v1alpha1", "kind": "TollgateProfile"},
            "resource": {"group": "tollgate.dev", "version": "v1alpha1", "resource": "tollgateprofiles"},
            "namespace": "team-a",
            "name": "default",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": {
                "apiVersion": "tollgate.dev/v1alpha1",
                "kind": "TollgateProfile",
                "metadata": {"name": "default", "namespace": "team-a"},
                "spec": {"mutation": {"defaultResources": {"perGpu": {"memory": "lots"}}}}
            }
        }
    });
    let (s, body) = c
        .post("/validate", serde_json::to_vec(&review).unwrap())
        .await;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["allowed"], false, "{v}");
    let m = scrape(&server).await;
    assert_eq!(
        scrape::value(
            &m,
            "tollgate_denials_total",
            &[("reason", "invalid_policy_object")]
        ),
        Some(1.0)
    );
    assert_eq!(
        scrape::value(&m, "tollgate_denials_total", &[("reason", "unknown")]),
        None
    );
}

#[tokio::test]
async fn in_flight_counts_a_review_whose_body_is_still_arriving() {
    let server = net::start(|o| o.limits.review_deadline = Duration::from_secs(30)).await;
    let body = common::fixture("resnet50-master-0.mutate.json");
    let mut slow = common::slow::start(server.addr(), &server.ca_pem, "/mutate", &body).await;
    let mut seen = None;
    for _ in 0..500 {
        seen = scrape::value(&scrape(&server).await, "tollgate_requests_in_flight", &[]);
        if seen == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen, Some(1.0), "one review in flight");
    let (status, _, _) = slow.finish().await;
    assert_eq!(status, 200);
    assert_eq!(
        scrape::value(&scrape(&server).await, "tollgate_requests_in_flight", &[]),
        Some(0.0)
    );
    server.running.shutdown().await;
}

#[tokio::test]
async fn certificate_expiry_is_the_served_certificates_not_after() {
    let server = net::start(|_| {}).await;
    let pem = std::fs::read(server.cert_path()).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    let cert = pem.parse_x509().unwrap();
    let not_after = cert.validity().not_after.timestamp();
    let m = scrape(&server).await;
    let got = scrape::value(&m, "tollgate_certificate_expiry_timestamp_seconds", &[]).unwrap();
    assert_eq!(got, not_after as f64);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as f64;
    assert!(got > now, "a fresh certificate expires in the future");
    server.running.shutdown().await;
}

#[tokio::test]
async fn policy_info_carries_the_hash_of_the_policy_in_force() {
    let server = net::start(|_| {}).await;
    let m = scrape(&server).await;
    let info: Vec<&Sample> = m
        .iter()
        .filter(|s| s.name == "tollgate_policy_info")
        .collect();
    assert_eq!(info.len(), 1, "exactly one policy in force");
    assert_eq!(info[0].value, 1.0);
    let hash = &info[0].labels["hash"];
    assert_eq!(hash, &server.running.state.policy.load().hash);
    assert_eq!(hash.len(), 16);
    server.running.shutdown().await;
}

//! Golden cases: one folder per case under `tests/golden/`, found automatically.
//!
//! A case folder holds:
//! - `case.yaml`: `endpoint: mutate|validate`, for a `pod.yaml` or `workload.yaml` input
//!   optionally `namespace`, `user`, `groups`, and for a real apiserver's review `fixture:`;
//! - the input, one of: `fixture: NAME` (an AdmissionReview of `tests/fixtures/apiserver-v1.36/`,
//!   read from there: no copy), `review.json` (an AdmissionReview of the case's own: an
//!   UPDATE with its `oldObject`, a kind no fixture has), `pod.yaml` (a Pod) or
//!   `workload.yaml` (a Job, Deployment, PyTorchJob, ...), the last two sent as the CREATE
//!   review the apiserver would send (tests/common/golden.rs reads them, for every test
//!   that walks the goldens);
//! - `policy.yaml` (optional; the shipped `policies/default.yaml` otherwise);
//! - `context.yaml` (optional): ResourceClaims, ResourceClaimTemplates, Namespaces,
//!   Kubeflow Trainer runtimes (TrainingRuntimes, ClusterTrainingRuntimes), Nodes,
//!   ResourceQuotas, DeviceClasses and Kueue's LocalQueues and ClusterQueues: the
//!   cluster context of the review (the engine and the HTTP router get them as the
//!   server's context; `tollgate review` gets them as `--cluster-state`);
//! - the expected output: `response.json` (the AdmissionReview returned, with the patch
//!   decoded for reading) and, for mutate cases, `mutated.yaml` (the input pod or workload
//!   with the patch applied).
//!
//! Every case runs through the engine, the HTTP router and the `tollgate review` command;
//! all three must agree with the goldens. Mutate cases also check that the patch applies to
//! the object as sent, that the result is a valid pod (for a workload: that the patch
//! touches nothing but tollgate's opt-out approval in its templates and the limits the
//! apiserver requires of a built-in kind's template, each its request), and that a
//! second pass over the mutated object yields no patch.
//!
//! Goldens are only rewritten with `TOLLGATE_BLESS=1 cargo test --test integration golden::`. A missing or
//! outdated golden file, or one the case does not produce, fails the test.

use crate::common;
use crate::common::golden;

use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::Request;
use base64::Engine as _;
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use tollgate_core::{review_bytes_with, Objects, Policy, Stage};
use tower::ServiceExt as _;

/// A case as the runner uses it: the case (common::golden) with its policy loaded and its
/// context as the engine and the router get it.
struct Case {
    dir: PathBuf,
    case: golden::Case,
    endpoint: Stage,
    review: Value,
    policy_path: PathBuf,
    policy: Policy,
    /// `context.yaml`'s objects.
    context: Objects,
}

fn bless() -> bool {
    std::env::var("TOLLGATE_BLESS").is_ok_and(|v| v == "1")
}

fn load_case(dir: &Path) -> Result<Case, String> {
    let case = golden::Case::load(dir)?;
    let endpoint = match case.spec.endpoint.as_str() {
        "mutate" => Stage::Mutate,
        "validate" => Stage::Validate,
        e => {
            return Err(format!(
                "case.yaml: endpoint {e:?} is neither mutate nor validate"
            ))
        }
    };
    let policy_path = case.policy_path();
    let policy = common::load_policy(&policy_path);
    let context = match &case.context_text {
        Some(text) => {
            // As `tollgate review` reads the same objects from its input.
            let namespace = case.spec.namespace.as_deref().unwrap_or("default");
            let docs =
                tollgate::cli::read(text, namespace).map_err(|e| format!("context.yaml: {e}"))?;
            let mut objects = Objects::complete();
            for d in docs {
                let added = tollgate::cli::add_context(&mut objects, &d)
                    .map_err(|e| format!("context.yaml: {e}"))?;
                if !added {
                    return Err(format!("context.yaml: a {:?} is not context", d["kind"]));
                }
            }
            objects
        }
        None => Objects::complete(),
    };
    Ok(Case {
        dir: dir.to_owned(),
        review: case.review(),
        case,
        endpoint,
        policy_path,
        policy,
        context,
    })
}

/// The response with the base64 patch decoded, so goldens read as what they do.
fn readable(response_json: &[u8]) -> Value {
    let mut v: Value = serde_json::from_slice(response_json).expect("response is JSON");
    if let Some(p) = v.pointer_mut("/response/patch") {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(p.as_str().expect("patch is a base64 string"))
            .expect("patch is base64");
        *p = serde_json::from_slice(&bytes).expect("patch is JSON");
    }
    v
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap();
    s.push('\n');
    s
}

/// Compares `actual` with the golden file, or rewrites it when blessing.
fn golden(path: &Path, actual: &str, failures: &mut Vec<String>) {
    if bless() {
        std::fs::write(path, actual).unwrap();
        return;
    }
    match std::fs::read_to_string(path) {
        Err(_) => failures.push(format!("{} is missing (TOLLGATE_BLESS=1 writes it)", path.display())),
        Ok(expected) if expected != actual => failures.push(format!(
            "{} is out of date (TOLLGATE_BLESS=1 rewrites it)\n--- expected\n{expected}\n--- actual\n{actual}",
            path.display()
        )),
        Ok(_) => {}
    }
}

fn stale(path: &Path, failures: &mut Vec<String>) {
    if path.exists() {
        if bless() {
            std::fs::remove_file(path).unwrap();
        } else {
            failures.push(format!(
                "{} is stale: this case does not produce it",
                path.display()
            ));
        }
    }
}

async fn via_http(case: &Case, body: Vec<u8>) -> Vec<u8> {
    let state = tollgate::server::AppState::with_cluster(
        tollgate::server::ActivePolicy::new(case.policy.clone(), b"test"),
        tollgate::server::Limits::default(),
        std::sync::Arc::new(case.context.clone()),
    );
    let app = tollgate::router(state);
    let path = format!("/{}?timeout=10s", case.endpoint.as_str());
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 200, "{}: HTTP status", case.dir.display());
    resp.into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec()
}

fn via_cli(case: &Case) -> Value {
    // With a context, it goes in as the saved picture of the cluster (`--cluster-state`):
    // in the input itself, a runtime would be reviewed too (tests/cli.rs has the input as
    // its own context).
    let input_path = case.case.input_path.clone();
    let mut cmd = common::bin::command();
    if case.case.context_text.is_some() {
        cmd.arg("review")
            .arg("--cluster-state")
            .arg(case.dir.join("context.yaml"));
    } else {
        cmd.arg("review");
    }
    cmd.args([
        "--output",
        "json",
        "--stage",
        case.endpoint.as_str(),
        "--policy",
    ])
    .arg(&case.policy_path)
    .arg(&input_path);
    if !case.case.is_review() {
        let spec = &case.case.spec;
        if let Some(ns) = &spec.namespace {
            cmd.args(["--namespace", ns]);
        }
        cmd.args(["--user", &spec.user]);
        for g in &spec.groups {
            cmd.args(["--group", g]);
        }
    }
    let out = cmd.output().expect("runs tollgate review");
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{}: tollgate review exited {:?}: {}",
        case.dir.display(),
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Value =
        serde_json::from_slice(&out.stdout).expect("review --output json prints JSON");
    // A list of results, whatever their number: this case's one object.
    match results {
        Value::Array(mut one) if one.len() == 1 => one.remove(0),
        other => panic!("{}: one result expected: {other:#}", case.dir.display()),
    }
}

/// Whether the container that the op at `path` changes differs between `original` and
/// `mutated` only by limits the apiserver requires: a non-overcommitable resource's, equal
/// to its request, or cpu and memory for a container with hugepages and neither.
fn required_limits_only(original: &Value, mutated: &Value, path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    let Some(at) = parts
        .iter()
        .position(|p| *p == "containers" || *p == "initContainers")
    else {
        return false;
    };
    let container = parts[..at + 2].join("/");
    let (Some(before), Some(after)) = (original.pointer(&container), mutated.pointer(&container))
    else {
        return false;
    };
    let mut rest = after.clone();
    let limits = rest
        .pointer_mut("/resources")
        .and_then(Value::as_object_mut)
        .and_then(|r| r.remove("limits"))
        .unwrap_or(Value::Null);
    let old_limits = before.pointer("/resources/limits").cloned();
    let mut before_rest = before.clone();
    if let Some(r) = before_rest
        .pointer_mut("/resources")
        .and_then(Value::as_object_mut)
    {
        r.remove("limits");
        if r.is_empty() {
            before_rest.as_object_mut().unwrap().remove("resources");
        }
    }
    if let Some(r) = rest
        .pointer_mut("/resources")
        .and_then(Value::as_object_mut)
    {
        if r.is_empty() {
            rest.as_object_mut().unwrap().remove("resources");
        }
    }
    if rest != before_rest {
        return false;
    }
    let requests = before.pointer("/resources/requests");
    let names: Vec<&str> = [requests, old_limits.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        .flat_map(|m| m.keys().map(String::as_str))
        .collect();
    let hugepages_alone = names.iter().any(|n| n.starts_with("hugepages-"))
        && !names.iter().any(|n| *n == "cpu" || *n == "memory");
    limits.as_object().is_some_and(|l| {
        l.iter().all(|(k, v)| {
            let kept = old_limits.as_ref().and_then(|o| o.get(k)) == Some(v);
            let equal_request = tollgate_core::is_non_overcommittable(k)
                && requests.and_then(|r| r.get(k)) == Some(v);
            let for_hugepages = hugepages_alone && (k == "cpu" || k == "memory");
            kept || equal_request || for_hugepages
        })
    })
}

/// Whether every leaf of `v` is the approval (as an annotation, or as the manager of a
/// runtime patch) or a name that says where it goes.
fn only_the_approval(v: &Value, approval: &str) -> bool {
    fn leaves(v: &Value, key: &str, approval: &str) -> bool {
        match v {
            Value::Object(m) => m.iter().all(|(k, v)| leaves(v, k, approval)),
            Value::Array(a) => a.iter().all(|v| leaves(v, key, approval)),
            Value::String(s) => {
                key == approval || key == "name" || (key == "manager" && s == approval)
            }
            _ => false,
        }
    }
    leaves(v, "", approval)
}

fn check_mutation(case: &Case, response: &Value, failures: &mut Vec<String>) {
    let name = case.dir.display();
    let mut pod = case
        .review
        .pointer("/request/object")
        .cloned()
        .unwrap_or(Value::Null);
    let original = pod.clone();
    if let Some(ops) = response.pointer("/response/patch") {
        let patch: json_patch::Patch = serde_json::from_value(ops.clone()).unwrap();
        if let Err(e) = json_patch::patch(&mut pod, &patch) {
            failures.push(format!(
                "{name}: the patch does not apply to the object as sent: {e}"
            ));
            return;
        }
        // What the apiserver and other webhooks put there must still be there.
        for keep in [
            "/metadata/managedFields",
            "/spec/tolerations/0",
            "/spec/dnsPolicy",
            "/spec/schedulerName",
        ] {
            if original.pointer(keep).is_some() && original.pointer(keep) != pod.pointer(keep) {
                failures.push(format!("{name}: the patch changed {keep}"));
            }
        }
    }
    golden(
        &case.dir.join("mutated.yaml"),
        &serde_saphyr::to_string(&pod).unwrap(),
        failures,
    );
    if case.case.is_workload() {
        // The mutating webhook only ever sets or removes the approval in a template, and
        // gives a built-in kind's template the limits the apiserver requires that its pods
        // get anyway: the pods are mutated when they are created.
        let approval = &case.policy.opt_out.approval_annotation;
        for op in response
            .pointer("/response/patch")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let path = op["path"].as_str().unwrap_or("");
            let key = format!("/metadata/annotations/{}", approval.replace('/', "~1"));
            let only_approval = path.ends_with(&key)
                || (path.ends_with("/metadata/annotations")
                    && op["value"]
                        .as_object()
                        .is_some_and(|m| m.len() == 1 && m.contains_key(approval.as_str())))
                || (path.ends_with("/metadata")
                    && op["value"].as_object().is_some_and(|m| {
                        m.len() == 1
                            && m.get("annotations")
                                .and_then(Value::as_object)
                                .is_some_and(|a| a.len() == 1 && a.contains_key(approval.as_str()))
                    }));
            let in_a_template = path.to_ascii_lowercase().contains("template");
            // A TrainJob's approval goes into an override of its runtime's pod templates
            // (an entry of runtimePatches or podTemplateOverrides of tollgate's own).
            let in_an_override = path.starts_with("/spec/runtimePatches")
                || path.starts_with("/spec/podTemplateOverrides");
            let only_approval = only_approval
                || (in_an_override
                    && (op["op"] == "remove" || only_the_approval(&op["value"], approval)));
            // Or a limit the apiserver requires of a built-in kind's template, that its
            // pods get anyway (a GPU's limit = its request).
            let a_required_limit = in_a_template
                && path.contains("/resources")
                && required_limits_only(&original, &pod, path);
            if !(only_approval || a_required_limit) || !(in_a_template || in_an_override) {
                failures.push(format!(
                    "{name}: the patch of a workload changes more than the approval: {op}"
                ));
            }
        }
    } else {
        let typed: Pod = match serde_json::from_value(pod.clone()) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{name}: the mutated object is not a Pod: {e}"));
                return;
            }
        };
        for p in tollgate_core::pod_problems(&typed) {
            failures.push(format!("{name}: the mutated pod is invalid: {p}"));
        }
    }
    // Idempotency: the mutated pod, sent again (as reinvocation does), gets no patch.
    let mut again = case.review.clone();
    *again.pointer_mut("/request/object").unwrap() = pod;
    let second = review_bytes_with(
        Stage::Mutate,
        &case.policy,
        &case.context,
        &serde_json::to_vec(&again).unwrap(),
    )
    .unwrap();
    if let Some(p) = &second.patch() {
        failures.push(format!(
            "{name}: not idempotent: a second pass patches {}",
            serde_json::to_string(p).unwrap()
        ));
    }
}

#[tokio::test]
async fn golden_cases() {
    let dirs = golden::dirs();
    assert!(!dirs.is_empty(), "no golden cases found");
    let mut failures = vec![];
    for dir in &dirs {
        let case = match load_case(dir) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("{}: {e}", dir.display()));
                continue;
            }
        };
        let body = serde_json::to_vec(&case.review).unwrap();
        let engine = review_bytes_with(case.endpoint, &case.policy, &case.context, &body)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let response = readable(&engine.to_json());

        let http = readable(&via_http(&case, body).await);
        if http != response {
            failures.push(format!(
                "{}: the HTTP path answers differently from the engine",
                dir.display()
            ));
        }
        let cli = via_cli(&case);
        let key = format!("{}Response", case.endpoint.as_str());
        let cli_response = cli.get(&key).cloned().unwrap_or(Value::Null);
        let cli_response = readable(&serde_json::to_vec(&cli_response).unwrap());
        if cli_response != response {
            failures.push(format!(
                "{}: `tollgate review` answers differently from the engine:\n{}",
                dir.display(),
                pretty(&cli_response)
            ));
        }

        golden(
            &case.dir.join("response.json"),
            &pretty(&response),
            &mut failures,
        );
        match case.endpoint {
            Stage::Mutate => {
                check_mutation(&case, &response, &mut failures);
                let mutated = if case.case.is_workload() {
                    "mutatedObject"
                } else {
                    "mutatedPod"
                };
                let cli_pod = cli.get(mutated).cloned().unwrap_or(Value::Null);
                if !bless() {
                    let expected: Value = std::fs::read_to_string(case.dir.join("mutated.yaml"))
                        .ok()
                        .and_then(|t| serde_saphyr::from_str(&t).ok())
                        .unwrap_or(Value::Null);
                    if cli_pod != expected {
                        failures.push(format!(
                            "{}: `tollgate review` prints another mutated pod",
                            dir.display()
                        ));
                    }
                }
            }
            // A case is a review posted to one webhook (case.yaml's endpoint).
            Stage::Validate | Stage::All => stale(&case.dir.join("mutated.yaml"), &mut failures),
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden failure(s) in {} cases:\n\n{}",
        failures.len(),
        dirs.len(),
        failures.join("\n\n")
    );
}

/// The harness itself must fail on a stale golden: a case whose expectation is wrong.
#[test]
fn a_wrong_golden_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("response.json");
    std::fs::write(&path, "{}\n").unwrap();
    let mut failures = vec![];
    if !bless() {
        golden(&path, "{\"x\":1}\n", &mut failures);
        assert_eq!(failures.len(), 1);
        golden(&dir.path().join("missing.json"), "{}\n", &mut failures);
        assert_eq!(failures.len(), 2);
    }
}

/// A case that replays what the apiserver sent names the fixture (`fixture:` in its
/// case.yaml) rather than holding a copy: no file of a golden folder is a fixture, byte for
/// byte or as the same JSON.
#[test]
fn no_golden_file_is_a_copy_of_a_fixture() {
    let fixtures: Vec<(String, Vec<u8>, Value)> = common::fixture_names()
        .into_iter()
        .map(|n| {
            let bytes = common::fixture(&n);
            let json = serde_json::from_slice(&bytes).unwrap();
            (n, bytes, json)
        })
        .collect();
    let mut copies = vec![];
    for dir in golden::dirs() {
        for file in std::fs::read_dir(&dir).unwrap() {
            let path = file.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let json: Option<Value> = serde_json::from_slice(&bytes).ok();
            for (name, fb, fj) in &fixtures {
                if bytes == *fb || json.as_ref() == Some(fj) {
                    copies.push(format!("{} is {name}", path.display()));
                }
            }
        }
    }
    assert!(
        copies.is_empty(),
        "name the fixture instead:\n{}",
        copies.join("\n")
    );
}

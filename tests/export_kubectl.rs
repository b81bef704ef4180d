//! `tollgate export validating-admission-policy | kubectl apply --dry-run=client
//! --validate=strict -f -` is accepted, for the shipped policy and every policy under
//! `tests/`.
//!
//! kubectl needs a server even for a client-side dry run: discovery (to map the kinds to
//! resources), the OpenAPI it validates with, and a GET of each object (to choose between
//! create and patch). This test serves exactly those from memory, on 127.0.0.1, with the
//! real schema of `admissionregistration.k8s.io/v1` (tests/data/openapi/, from the
//! Kubernetes repository). A server that supports field validation would make kubectl
//! leave validation to it, and a client-side dry run would then check nothing; this one
//! publishes no paths, so kubectl validates every field, type and required field itself
//! against the schema (it fetches `/openapi/v2` for that, which the test checks it did).
//! Without kubectl on PATH the test prints SKIPPED and passes, as tests/deploy.rs does.

use crate::common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

const GROUP: &str = "admissionregistration.k8s.io";

/// kubectl, the machine's or the suite's own (tests/common/tools.rs); where none can be
/// had, a SKIPPED line names the test.
fn kubectl_available() -> bool {
    common::tools::kubectl().is_some()
}

/// The committed schemas: `components.schemas` of the group's OpenAPI v3 document.
fn schemas() -> Value {
    let path = common::root().join("tests/data/openapi/admissionregistration.k8s.io-v1.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

// ---------------------------------------------------------------------------------------
// OpenAPI v2 as kubectl's validator reads it: gnostic's `openapi.v2.Document` protobuf
// (github.com/google/gnostic, openapiv2/OpenAPIv2.proto), derived from the v3 schemas the
// way the apiserver publishes both from one model: `#/components/schemas/X` becomes
// `#/definitions/X`, and v3's `allOf: [{$ref}]` wrapper (there to carry a default) the
// plain `$ref` v2 writes. Defaults are left out; validation does not read them.

fn varint(mut n: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A length-delimited field: a string, bytes or an embedded message.
fn field(number: u64, payload: &[u8], out: &mut Vec<u8>) {
    varint((number << 3) | 2, out);
    varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

fn named(name: &str, value: &[u8]) -> Vec<u8> {
    let mut m = vec![];
    field(1, name.as_bytes(), &mut m);
    field(2, value, &mut m);
    m
}

/// `openapi.v2.Schema` (field numbers from OpenAPIv2.proto).
fn schema(v: &Value) -> Vec<u8> {
    let mut out = vec![];
    let reference = v["$ref"].as_str().or_else(|| match v["allOf"].as_array() {
        Some(all) if all.len() == 1 => all[0]["$ref"].as_str(),
        _ => None,
    });
    if let Some(r) = reference {
        let name = r.strip_prefix("#/components/schemas/").unwrap();
        field(1, format!("#/definitions/{name}").as_bytes(), &mut out);
        return out;
    }
    if let Some(f) = v["format"].as_str() {
        field(2, f.as_bytes(), &mut out);
    }
    for r in v["required"].as_array().into_iter().flatten() {
        field(19, r.as_str().unwrap().as_bytes(), &mut out);
    }
    if v.get("additionalProperties").is_some() {
        let mut item = vec![];
        field(1, &schema(&v["additionalProperties"]), &mut item);
        field(21, &item, &mut out);
    }
    if let Some(t) = v["type"].as_str() {
        let mut type_item = vec![];
        field(1, t.as_bytes(), &mut type_item);
        field(22, &type_item, &mut out);
    }
    if v.get("items").is_some() {
        let mut items = vec![];
        field(1, &schema(&v["items"]), &mut items);
        field(23, &items, &mut out);
    }
    if let Some(props) = v["properties"].as_object() {
        let mut properties = vec![];
        for (k, p) in props {
            field(1, &named(k, &schema(p)), &mut properties);
        }
        field(25, &properties, &mut out);
    }
    for (k, x) in v.as_object().into_iter().flatten() {
        if k.starts_with("x-") {
            // `Any.yaml`: JSON is YAML.
            let mut any = vec![];
            field(2, x.to_string().as_bytes(), &mut any);
            field(31, &named(k, &any), &mut out);
        }
    }
    out
}

/// `openapi.v2.Document`: swagger, info and the definitions; no paths.
fn openapi_v2(schemas: &Value) -> Vec<u8> {
    let mut definitions = vec![];
    for (name, s) in schemas["components"]["schemas"].as_object().unwrap() {
        field(1, &named(name, &schema(s)), &mut definitions);
    }
    let mut info = vec![];
    field(1, b"Kubernetes", &mut info);
    field(2, b"v1.33.0", &mut info);
    let mut doc = vec![];
    field(1, b"2.0", &mut doc);
    field(2, &info, &mut doc);
    field(9, &definitions, &mut doc);
    doc
}

// ---------------------------------------------------------------------------------------
// The server.

#[derive(Clone)]
struct Api {
    v3: Arc<Value>,
    v2: Arc<Vec<u8>>,
    seen: Arc<Mutex<Vec<String>>>,
}

fn json_response(status: StatusCode, v: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn resource(name: &str, kind: &str) -> Value {
    json!({
        "name": name,
        "singularName": name.trim_end_matches('s').trim_end_matches("ie").to_owned(),
        "namespaced": false,
        "kind": kind,
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    })
}

async fn serve(State(api): State<Api>, uri: Uri) -> Response {
    let path = uri.path().to_owned();
    api.seen.lock().unwrap().push(path.clone());
    let ok = |v: Value| json_response(StatusCode::OK, v);
    match path.as_str() {
        "/version" => ok(json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0"})),
        "/api" => ok(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        })),
        "/api/v1" => ok(json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": []})),
        "/apis" => ok(json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [{
                "name": GROUP,
                "versions": [{"groupVersion": format!("{GROUP}/v1"), "version": "v1"}],
                "preferredVersion": {"groupVersion": format!("{GROUP}/v1"), "version": "v1"},
            }],
        })),
        "/apis/admissionregistration.k8s.io/v1" => ok(json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": format!("{GROUP}/v1"),
            "resources": [
                resource("validatingadmissionpolicies", "ValidatingAdmissionPolicy"),
                resource("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding"),
            ],
        })),
        "/openapi/v3" => ok(json!({"paths": {
            "apis/admissionregistration.k8s.io/v1": {
                "serverRelativeURL": "/openapi/v3/apis/admissionregistration.k8s.io/v1?hash=0"
            }
        }})),
        "/openapi/v3/apis/admissionregistration.k8s.io/v1" => {
            let mut doc = (*api.v3).clone();
            doc["openapi"] = json!("3.0.0");
            doc["info"] = json!({"title": "Kubernetes", "version": "v1.33.0"});
            doc["paths"] = json!({});
            ok(doc)
        }
        "/openapi/v2" => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/octet-stream")],
            Body::from((*api.v2).clone()),
        )
            .into_response(),
        _ => json_response(
            StatusCode::NOT_FOUND,
            json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "NotFound", "code": 404, "message": format!("{path} not found"),
            }),
        ),
    }
}

/// The server on 127.0.0.1 (in a thread of its own for the test's life) and what it was
/// asked for.
fn start() -> (String, Arc<Mutex<Vec<String>>>) {
    let v3 = schemas();
    let api = Api {
        v2: Arc::new(openapi_v2(&v3)),
        v3: Arc::new(v3),
        seen: Arc::default(),
    };
    let seen = api.seen.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let app = axum::Router::new().fallback(serve).with_state(api);
            axum::serve(listener, app).await.unwrap();
        });
    });
    let addr = rx.recv().unwrap();
    (format!("http://{addr}"), seen)
}

struct Kubectl {
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    fn new(server: &str) -> Kubectl {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\n\
                 clusters: [{{name: fake, cluster: {{server: \"{server}\"}}}}]\n\
                 users: [{{name: u, user: {{}}}}]\n\
                 contexts: [{{name: fake, context: {{cluster: fake, user: u}}}}]\n\
                 current-context: fake\n"
            ),
        )
        .unwrap();
        let cache = dir.path().join("cache");
        Kubectl {
            _dir: dir,
            kubeconfig,
            cache,
        }
    }

    /// `kubectl apply --dry-run=client --validate=strict -f -` on `yaml`.
    fn dry_run(&self, yaml: &[u8]) -> std::process::Output {
        let mut child = Command::new(common::tools::kubectl().unwrap())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(["apply", "--dry-run=client", "--validate=strict", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(yaml).unwrap();
        child.wait_with_output().unwrap()
    }
}

fn export(policy: Option<&Path>) -> Vec<u8> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.args(["export", "validating-admission-policy"]);
    if let Some(p) = policy {
        cmd.arg("--policy").arg(p);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "export of {policy:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn policies_under_tests() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.file_name().is_some_and(|n| n == "policy.yaml") {
                out.push(p);
            }
        }
    }
    let mut out = vec![];
    walk(&common::root().join("tests"), &mut out);
    out.sort();
    out
}

#[test]
fn kubectl_accepts_the_export_of_every_policy() {
    if !kubectl_available() {
        return;
    }
    let (server, seen) = start();
    let kubectl = Kubectl::new(&server);
    let mut inputs: Vec<(String, Option<PathBuf>)> = vec![("the shipped policy".into(), None)];
    for p in policies_under_tests() {
        inputs.push((p.display().to_string(), Some(p)));
    }
    assert!(inputs.len() > 10, "{} policies", inputs.len());
    for (name, path) in &inputs {
        let out = kubectl.dry_run(&export(path.as_deref()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "kubectl refused the export of {name}:\n{}{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        for object in [
            "validatingadmissionpolicy.admissionregistration.k8s.io/validate.tollgate.dev created (dry run)",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/validate.tollgate.dev created (dry run)",
        ] {
            assert!(stdout.contains(object), "{name}: {stdout}");
        }
    }
    let seen = seen.lock().unwrap();
    assert!(
        seen.iter().any(|p| p == "/openapi/v2"),
        "kubectl validated against the schema: {seen:?}"
    );
}

/// The check can fail: kubectl refuses what the schema does not allow.
#[test]
fn kubectl_refuses_what_the_schema_does_not_allow() {
    if !kubectl_available() {
        return;
    }
    let (server, _) = start();
    let kubectl = Kubectl::new(&server);
    let good = String::from_utf8(export(None)).unwrap();
    for (bad, says) in [
        (
            good.replacen(
                "  failurePolicy: Fail",
                "  failurePolicy: Fail\n  failurPolicy: Fail",
                1,
            ),
            "unknown field \"failurPolicy\"",
        ),
        (
            good.replacen(
                "validationActions:\n    - Deny",
                "validationActions: Deny",
                1,
            ),
            "expected \"array\"",
        ),
        (
            good.replacen("    - key: opt-out", "    - kee: opt-out", 1),
            "missing required field \"key\"",
        ),
    ] {
        assert_ne!(bad, good);
        let out = kubectl.dry_run(bad.as_bytes());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "kubectl took:\n{bad}");
        assert!(err.contains(says), "{err}");
    }
}

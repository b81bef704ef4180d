//! Admission through the real apiserver (tests/common/envtest.rs): pods created with
//! `dryRun=All` as any requester, what the apiserver answered (allowed or denied, its
//! message, its warnings), the objects of an exported ValidatingAdmissionPolicy created,
//! and the wait until the apiserver enforces what was created.
//!
//! The requester is impersonated by the admin with `Impersonate-User` and
//! `Impersonate-Group` headers built from bytes (a header carries UTF-8 past ASCII, but no
//! control character other than a tab: such names cannot be sent, [`sendable`]).

use std::time::{Duration, Instant};

use axum::http::{HeaderValue, Method, Request};
use http_body_util::BodyExt as _;
use kube::Client;
use serde_json::{json, Value};

/// What the apiserver answered to a pod CREATE.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub code: u16,
    /// The pod as the apiserver would store it (after mutation and defaulting), when
    /// allowed.
    pub object: Option<Value>,
    /// The Status's message, when refused.
    pub message: Option<String>,
    /// The Status's reason, when refused (`Forbidden`, `Invalid`...).
    pub reason: Option<String>,
    /// The `Warning` headers' texts, unquoted.
    pub warnings: Vec<String>,
}

impl Answer {
    pub fn allowed(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// Whether an HTTP header can carry `s` as the apiserver reads it (Go's net/http refuses
/// control characters but a tab; leading and trailing blanks are trimmed).
pub fn sendable(s: &str) -> bool {
    !s.is_empty()
        && s.trim_matches([' ', '\t']) == s
        && !s.chars().any(|c| c != '\t' && (c < ' ' || c == '\u{7f}'))
}

fn header(s: &str) -> HeaderValue {
    HeaderValue::from_bytes(s.as_bytes()).unwrap_or_else(|e| panic!("{s:?} as a header: {e}"))
}

/// A request of `method` to `path` with a JSON `body`, as `as_user` in `groups` (the
/// client's own identity where None).
async fn send(
    client: &Client,
    method: Method,
    path: &str,
    body: Option<&Value>,
    as_user: Option<(&str, &[String])>,
) -> (u16, Value, Vec<String>) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some((user, groups)) = as_user {
        req = req.header("Impersonate-User", header(user));
        for g in groups {
            req = req.header("Impersonate-Group", header(g));
        }
    }
    let bytes = body
        .map(|b| serde_json::to_vec(b).unwrap())
        .unwrap_or_default();
    let req = req
        .header("Content-Type", "application/json")
        .body(kube::client::Body::from(bytes))
        .unwrap();
    let res = client
        .send(req)
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let code = res.status().as_u16();
    let warnings = res
        .headers()
        .get_all("warning")
        .iter()
        .map(|h| unquote_warning(&String::from_utf8_lossy(h.as_bytes())))
        .collect();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (code, value, warnings)
}

/// `299 - "text"` (RFC 7234, as the apiserver writes it) to `text`.
fn unquote_warning(h: &str) -> String {
    let Some(q) = h.find('"') else {
        return h.to_owned();
    };
    let inner = h[q + 1..].strip_suffix('"').unwrap_or(&h[q + 1..]);
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `pod` created in `namespace` with `dryRun=All` as `user` in `groups` (impersonated: the
/// apiserver adds `system:authenticated`), or as the client's own identity where None.
pub async fn dry_run_pod(
    client: &Client,
    namespace: &str,
    pod: &Value,
    as_user: Option<(&str, &[String])>,
) -> Answer {
    let path = format!("/api/v1/namespaces/{namespace}/pods?dryRun=All");
    let (code, body, warnings) = send(client, Method::POST, &path, Some(pod), as_user).await;
    let allowed = (200..300).contains(&code);
    Answer {
        code,
        object: allowed.then(|| body.clone()),
        message: (!allowed).then(|| body["message"].as_str().unwrap_or_default().to_owned()),
        reason: (!allowed).then(|| body["reason"].as_str().unwrap_or_default().to_owned()),
        warnings,
    }
}

/// Who the apiserver takes `user` in `groups` for when the admin impersonates them: the
/// user info a policy and a webhook are given (a SelfSubjectReview).
pub async fn user_info(client: &Client, user: &str, groups: &[String]) -> Value {
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let (code, body, _) = send(
        client,
        Method::POST,
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        Some(&review),
        Some((user, groups)),
    )
    .await;
    assert_eq!(code, 201, "SelfSubjectReview as {user:?}: {body}");
    body["status"]["userInfo"].clone()
}

const ADMISSION: &str = "/apis/admissionregistration.k8s.io/v1";

/// The path of an admission policy's or binding's collection (validating or mutating).
fn collection(kind: &str) -> String {
    match kind {
        "MutatingAdmissionPolicy" => format!("{ADMISSION}/mutatingadmissionpolicies"),
        "MutatingAdmissionPolicyBinding" => {
            format!("{ADMISSION}/mutatingadmissionpolicybindings")
        }
        "ValidatingAdmissionPolicy" => format!("{ADMISSION}/validatingadmissionpolicies"),
        "ValidatingAdmissionPolicyBinding" => {
            format!("{ADMISSION}/validatingadmissionpolicybindings")
        }
        k => panic!("not an admission policy kind: {k}"),
    }
}

/// Creates `object` (a ValidatingAdmissionPolicy or binding), with `dryRun=All` if asked;
/// Err is the apiserver's refusal, `code: message`.
pub async fn create(client: &Client, object: &Value, dry_run: bool) -> Result<Value, String> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let mut path = format!("{}?fieldValidation=Strict", collection(kind));
    if dry_run {
        path.push_str("&dryRun=All");
    }
    let (code, body, _) = send(client, Method::POST, &path, Some(object), None).await;
    if code == 201 {
        Ok(body)
    } else {
        Err(format!(
            "{code}: {}",
            body["message"]
                .as_str()
                .map_or(body.to_string(), str::to_owned)
        ))
    }
}

/// Reads back a created ValidatingAdmissionPolicy or binding.
pub async fn get(client: &Client, kind: &str, name: &str) -> Value {
    let path = format!("{}/{name}", collection(kind));
    let (code, body, _) = send(client, Method::GET, &path, None, None).await;
    assert_eq!(code, 200, "{kind} {name}: {body}");
    body
}

/// Waits until the apiserver enforces the ValidatingAdmissionPolicies and bindings created
/// before this call: it creates a last policy and binding that deny the pods labelled
/// with `tag`, and sends one such pod to `namespace` until it is denied. The apiserver
/// reads policies and bindings from two informers, each in the order they were created,
/// and refreshes its compiled set from both at once: once the last pair is in force, so is
/// everything created before it.
pub async fn await_enforcement(client: &Client, namespace: &str, tag: &str) -> Duration {
    let started = Instant::now();
    let name = format!("sentinel.{tag}");
    let label = "admission-test.tollgate.dev/sentinel";
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["pods"]}],
                "objectSelector": {"matchLabels": {label: tag}},
            },
            "validations": [{"expression": "false", "message": "sentinel"}],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    });
    create(client, &policy, false).await.unwrap();
    create(client, &binding, false).await.unwrap();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sentinel", "labels": {label: tag}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    });
    loop {
        let answer = dry_run_pod(client, namespace, &pod, None).await;
        if !answer.allowed() && answer.message.as_deref().unwrap_or("").contains("sentinel") {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the apiserver did not enforce a new ValidatingAdmissionPolicy within 30 s: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `ValidatingAdmissionPolicy 'P' with binding 'B' denied request: MESSAGE`, split: the
/// policy's name and its message (None for another kind of refusal).
pub fn denial(message: &str) -> Option<(String, String)> {
    let start = message.find("ValidatingAdmissionPolicy '")?;
    let rest = &message[start + "ValidatingAdmissionPolicy '".len()..];
    let (policy, rest) = rest.split_once('\'')?;
    let (_, said) = rest.split_once(" denied request: ")?;
    Some((policy.to_owned(), said.to_owned()))
}

/// `Validation failed for ValidatingAdmissionPolicy 'P' with binding 'B': MESSAGE`, split.
pub fn warning(text: &str) -> Option<(String, String)> {
    let rest = text.strip_prefix("Validation failed for ValidatingAdmissionPolicy '")?;
    let (policy, rest) = rest.split_once('\'')?;
    let (_, said) = rest.split_once("': ")?;
    Some((policy.to_owned(), said.to_owned()))
}

/// Lets every authenticated requester (each impersonated one is) create pods in
/// `namespace`, and nowhere else: a RoleBinding of the group there to a ClusterRole of
/// that one verb.
pub async fn let_anyone_create_pods(client: &Client, namespace: &str) {
    const ROLE: &str = "tollgate-test-pod-creator";
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": ROLE},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}],
    });
    let (code, body, _) = send(
        client,
        Method::POST,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        Some(&role),
        None,
    )
    .await;
    assert!(code == 201 || code == 409, "ClusterRole {ROLE}: {body}");
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": ROLE, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
            "name": "system:authenticated"}],
    });
    let path = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings");
    let (code, body, _) = send(client, Method::POST, &path, Some(&binding), None).await;
    assert!(
        code == 201 || code == 409,
        "RoleBinding in {namespace}: {body}"
    );
}

/// Deletes ValidatingAdmissionPolicies and bindings a test created (its pods are decided,
/// and every pod the suite creates after would still be matched against them).
pub async fn delete_all(client: &Client, objects: &[Value]) {
    use futures::StreamExt as _;
    futures::stream::iter(objects)
        .for_each_concurrent(8, |o| async move {
            let kind = o["kind"].as_str().unwrap_or_default();
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            let path = format!("{}/{name}", collection(kind));
            let (code, body, _) = send(client, Method::DELETE, &path, None, None).await;
            assert!(
                code == 200 || code == 202 || code == 404,
                "deleting {kind} {name}: {body}"
            );
        })
        .await;
}

/// The policy of `path` (the built-in one where None), every namespace name and glob it
/// gives (the opt-out's, each profile's match and opt-out) under `prefix`: a glob and a
/// name keep their match with the prefix on both.
pub fn policy_under(path: Option<&std::path::Path>, prefix: &str) -> tollgate_core::Policy {
    let mut v: Value = match path {
        Some(p) => serde_saphyr::from_str(&std::fs::read_to_string(p).unwrap()).unwrap(),
        None => serde_json::to_value(tollgate_core::Policy::builtin()).unwrap(),
    };
    let under = |list: &mut Value| {
        for g in list.as_array_mut().into_iter().flatten() {
            *g = json!(format!("{prefix}{}", g.as_str().unwrap()));
        }
    };
    under(&mut v["optOut"]["namespaces"]);
    for p in v["profiles"].as_array_mut().into_iter().flatten() {
        under(&mut p["match"]["namespaces"]);
        if p["optOut"].is_object() {
            under(&mut p["optOut"]["namespaces"]);
        }
    }
    // (Indexing made `null`s where there was nothing: gone again.)
    fn no_nulls(v: &mut Value) {
        if let Some(o) = v.as_object_mut() {
            o.retain(|_, x| !x.is_null());
            o.values_mut().for_each(no_nulls);
        } else if let Some(a) = v.as_array_mut() {
            a.iter_mut().for_each(no_nulls);
        }
    }
    no_nulls(&mut v);
    tollgate_core::Policy::from_text("prefixed", &v.to_string()).expect("the prefixed policy loads")
}

/// The label that narrows a [`registration`] to the namespaces (or, for the policy
/// objects' webhook, the objects) of one test's server: `tollgate-e2e=<name>`.
pub const REGISTERED: &str = "tollgate-e2e";

/// deploy/base's webhook configurations (`rendered`: `kubectl kustomize deploy/base`) for
/// a server at `https://127.0.0.1:port` with the CA `ca_pem`, named `name`, and narrowed
/// to the namespaces labelled [`REGISTERED`]`=name`: each webhook's `clientConfig.service`
/// replaced by the `url` (no kube-proxy runs to reach a Service), its namespaceSelector
/// given that one label more; everything else (rules, failurePolicy, reinvocation,
/// timeouts) as shipped.
pub fn registration(rendered: &[Value], name: &str, port: u16, ca_pem: &str) -> Vec<Value> {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let mut out = vec![];
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let mut c = rendered
            .iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("deploy/base renders no {kind}"))
            .clone();
        c["metadata"]["name"] = json!(name);
        for w in c["webhooks"].as_array_mut().unwrap() {
            let path = w["clientConfig"]["service"]["path"]
                .as_str()
                .expect("a webhook's service path")
                .to_owned();
            w["clientConfig"] =
                json!({"url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca});
            if w.get("namespaceSelector").is_some() {
                w["namespaceSelector"]["matchLabels"][REGISTERED] = json!(name);
            } else {
                // The policy objects' webhook selects every namespace, and no
                // namespaceSelector narrows the cluster-scoped TollgatePolicy: narrowed by
                // the objects' own label instead, so that no other test's reaches it.
                w["objectSelector"]["matchLabels"][REGISTERED] = json!(name);
            }
        }
        out.push(c);
    }
    out
}

/// Waits (bounded) until the apiserver calls `server`'s webhooks for pods of `namespace`
/// (one labelled for its [`registration`]): a pod created there with `dryRun=All`, again,
/// until the server has logged a review of it by each.
pub async fn until_reviewed(client: &Client, server: &super::process::Served, namespace: &str) {
    let probe = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "probe"}]}});
    let seen = |endpoint: &str| {
        server
            .lines()
            .iter()
            .any(|l| l.contains(namespace) && l.contains(&format!("\"{endpoint}\"")))
    };
    super::net::until("the webhooks to be in force", async || {
        let _ = super::apiserver::create(client, &probe, true).await;
        seen("mutate") && seen("validate")
    })
    .await;
}

/// Takes a [`registration`] down. Its configurations are cluster-wide: a later namespace
/// of its label must not reach a server that is gone.
pub async fn deregister(client: &Client, name: &str) {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let gone = kube::api::DeleteParams::default();
    let mutating = kube::Api::<MutatingWebhookConfiguration>::all(client.clone());
    let validating = kube::Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let _ = mutating.delete(name, &gone).await;
    let _ = validating.delete(name, &gone).await;
}

//! The exported ValidatingAdmissionPolicy decides as the validating webhook does.
//!
//! - **Through the real apiserver** (tests/common/envtest.rs): generated policies, and each
//!   golden case's policy, are installed as ValidatingAdmissionPolicies and bindings, each
//!   selecting namespaces of its own (its namespace names and globs under a prefix of its
//!   own, so that all are in force at once), and the generated and golden pods are created
//!   there with `dryRun=All` as their requesters (the admin impersonating the user and
//!   groups): the apiserver's answer (allowed or denied, the denial's message, the warning
//!   of a policy in warn mode) is compared with the webhook's on the same pod as the
//!   apiserver admitted it (defaulted: as it came back, or, if refused, as it comes back
//!   from a namespace no policy selects). A requester whose name no HTTP header can carry
//!   (empty, or with control characters but tabs) cannot be impersonated, and the audit
//!   annotations are in no answer (the test apiserver keeps no audit log): those stay with
//!   the interpreter below.
//! - **Through a CEL interpreter**, for the bulk of cases: the CEL is evaluated as the
//!   apiserver would (variables, the validation, the message with the apiserver's
//!   fallbacks, the audit annotations, the binding's action) with the `cel` crate and
//!   kube-cel's port of the strings extension Kubernetes enables, over every golden case
//!   (and every mutated golden pod after the apiserver's defaulting) and over generated
//!   policies, requesters and pods: the same allow or deny, the same missing-requests
//!   verdict, the same containers named, the same message (on one line, as a policy's
//!   must be) and the same audit annotations.
//!
//! The generator is the deterministic PRNG of tests/mutation_props.rs; the first
//! disagreement is printed with its seed, policy, requester and pod.

use crate::common;
use crate::common::rng::Rng;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube_cel::cel::extractors::This;
use kube_cel::cel::objects::{Key, Map};
use kube_cel::cel::{Context, Program, Value as Cel};
use kube_cel::KubeCelExt as _;
use serde_json::{json, Value};

use tollgate_core::{
    cel_literal, glob_to_re2, missing_requests, one_line, review_bytes_with, select_profile,
    validating_admission_policy, ExportOptions, Glob, Mode, Objects, Operation, PodLabels, Policy,
    Stage, Verdict, EXPORT_NAME,
};

/// How the line of a claim tollgate could not read starts (`validate::UNREAD_CLAIM_LINE`).
const CLAIM_NOT_READ: &str = "tollgate could not read the ";

/// Generated policies, and requests (a pod and who creates it where) per policy.
const POLICIES: u64 = 150;
const REQUESTS_PER_POLICY: u64 = 70;

/// The apiserver's limit on a CEL message (`celconfig.MaxEvaluatedMessageExpressionSizeBytes`).
const MAX_MESSAGE_BYTES: usize = 5 * 1024;

// ---------------------------------------------------------------------------------------
// The policy as the apiserver runs it.

struct Vap {
    name: String,
    binding: String,
    action: String,
    variables: Vec<(String, Program)>,
    validation: Program,
    message: Program,
    fallback: String,
    audit: Vec<(String, Program)>,
    /// Not part of the export: the containers the policy found lacking, read from its own
    /// variables, to compare with the engine's list.
    named: Program,
    /// The expressions, for the report of a disagreement.
    source: String,
}

fn compile(expr: &str, what: &str) -> Program {
    Program::compile(&bind_variables(expr))
        .unwrap_or_else(|e| panic!("{what} does not parse: {e:?}\n{expr}"))
}

/// `variables.NAME` as the identifier `variables__NAME`, outside string literals.
///
/// The apiserver binds the policy's variables as one lazily evaluated map; this
/// interpreter copies a map value in full each time it is bound, so binding the growing map
/// once per variable made the test quadratic. Each variable is bound once under its own
/// name instead; the values, and so the decisions, are the same.
fn bind_variables(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut chars = expr.char_indices().peekable();
    let mut quote: Option<char> = None;
    while let Some((i, c)) = chars.next() {
        match quote {
            Some(q) => {
                out.push(c);
                if c == '\\' {
                    if let Some((_, n)) = chars.next() {
                        out.push(n);
                    }
                } else if c == q {
                    quote = None;
                }
            }
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                out.push(c);
            }
            None => {
                let rest = &expr[i..];
                let standalone = !out
                    .chars()
                    .last()
                    .is_some_and(|p| p.is_alphanumeric() || p == '_' || p == '.');
                if standalone && rest.starts_with("variables.") {
                    out.push_str("variables__");
                    for _ in 0.."variables".len() {
                        chars.next();
                    }
                } else {
                    out.push(c);
                }
            }
        }
    }
    out
}

impl Vap {
    /// Every policy and binding of an export: the base's, then one per profile.
    fn all_from_yaml(yaml: &str) -> Vec<Vap> {
        let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("the export parses");
        assert!(
            !docs.is_empty() && docs.len().is_multiple_of(2),
            "policies and bindings:\n{yaml}"
        );
        docs.chunks(2)
            .map(|pair| Vap::from_pair(&pair[0], &pair[1], yaml))
            .collect()
    }

    fn from_pair(policy: &Value, binding: &Value, yaml: &str) -> Vap {
        assert_eq!(policy["kind"], "ValidatingAdmissionPolicy");
        assert_eq!(binding["kind"], "ValidatingAdmissionPolicyBinding");
        assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
        let spec = &policy["spec"];
        let str_of = |v: &Value| v.as_str().unwrap().to_owned();
        let variables = spec["variables"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| {
                let name = str_of(&v["name"]);
                let program = compile(v["expression"].as_str().unwrap(), &name);
                (name, program)
            })
            .collect();
        let validations = spec["validations"].as_array().unwrap();
        assert_eq!(validations.len(), 1);
        let v = &validations[0];
        let message = v["messageExpression"].as_str().unwrap_or("''");
        let audit = spec["auditAnnotations"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let key = str_of(&a["key"]);
                let expr = a["valueExpression"].as_str().unwrap();
                assert!(
                    expr.len() <= 5 * 1024,
                    "the apiserver refuses a valueExpression over 5 KiB"
                );
                let program = compile(expr, &key);
                (key, program)
            })
            .collect();
        let actions = binding["spec"]["validationActions"].as_array().unwrap();
        assert_eq!(actions.len(), 1);
        let has_vars = spec["variables"].is_array();
        Vap {
            name: str_of(&policy["metadata"]["name"]),
            binding: str_of(&binding["metadata"]["name"]),
            action: str_of(&actions[0]),
            variables,
            validation: compile(v["expression"].as_str().unwrap(), "validation"),
            message: compile(message, "messageExpression"),
            fallback: v["message"].as_str().unwrap_or("").to_owned(),
            audit,
            named: compile(
                if has_vars {
                    "(variables.initMissing + variables.regularMissing).map(c, c.name)"
                } else {
                    "[]"
                },
                "named",
            ),
            source: yaml.to_owned(),
        }
    }
}

/// What the apiserver does with the request, as far as the webhook's answer goes.
#[derive(Debug, Clone, PartialEq)]
struct Decision {
    allowed: bool,
    /// The validation failed (the webhook's verdict "missing requests").
    failed: bool,
    /// The message of a failed validation: a denial's, a warning's or an audit record's.
    message: Option<String>,
    audit_annotations: BTreeMap<String, String>,
    named: Vec<String>,
}

fn to_cel(v: &Value) -> Cel {
    match v {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Cel::Int(i),
            None => Cel::Float(n.as_f64().unwrap()),
        },
        Value::String(s) => Cel::String(Arc::new(s.clone())),
        Value::Array(a) => Cel::List(Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(o) => Cel::Map(Map {
            map: Arc::new(
                o.iter()
                    .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                    .collect(),
            ),
        }),
    }
}

fn run(program: &Program, ctx: &Context, what: &str) -> Result<Cel, String> {
    program
        .execute(ctx)
        .map_err(|e| format!("{what} failed to evaluate: {e:?}"))
}

fn as_string(v: Cel, what: &str) -> Result<String, String> {
    match v {
        Cel::String(s) => Ok(s.to_string()),
        other => Err(format!("{what} is not a string: {other:?}")),
    }
}

/// The policy's decision on `object` created by `request`, as the apiserver's
/// `validator.Validate` and dispatcher reach it. Every evaluation error is reported: the
/// webhook never errs on a pod, so the policy must not either.
fn decide(
    vap: &Vap,
    base: &Context,
    object: &Value,
    request: &Value,
    namespace: &Value,
) -> Result<Decision, String> {
    let mut ctx = base.new_inner_scope();
    ctx.add_variable_from_value("object", to_cel(object));
    ctx.add_variable_from_value("request", to_cel(request));
    ctx.add_variable_from_value("namespaceObject", to_cel(namespace));
    // In the order written: each may use those before it, as the apiserver allows.
    for (name, program) in &vap.variables {
        let value = run(program, &ctx, &format!("variable {name}"))?;
        ctx.add_variable_from_value(format!("variables__{name}"), value);
    }
    let passed = match run(&vap.validation, &ctx, "the validation")? {
        Cel::Bool(b) => b,
        other => return Err(format!("the validation is not a bool: {other:?}")),
    };
    // The apiserver evaluates the message whatever the outcome; it only uses it on a
    // failure, trimmed, and not when it is empty, has a line break or is over 5 KiB.
    let raw = as_string(
        run(&vap.message, &ctx, "the messageExpression")?,
        "the message",
    )?;
    let message = (!passed).then(|| {
        let m = raw.trim();
        if m.is_empty() || m.contains('\n') || m.len() > MAX_MESSAGE_BYTES {
            vap.fallback.trim().to_owned()
        } else {
            m.to_owned()
        }
    });
    let mut audit_annotations = BTreeMap::new();
    for (key, program) in &vap.audit {
        let value = run(program, &ctx, &format!("audit annotation {key}"))?;
        let value = match value {
            Cel::Null => continue,
            v => as_string(v, key)?,
        };
        let value = value.trim();
        if !value.is_empty() {
            audit_annotations.insert(key.clone(), value.chars().take(10 * 1024).collect());
        }
    }
    // Named only when the pod fails: an honoured opt-out names nobody.
    let named = match run(&vap.named, &ctx, "the names")? {
        _ if passed => vec![],
        Cel::List(l) => l
            .iter()
            .map(|v| as_string(v.clone(), "a name"))
            .collect::<Result<_, _>>()?,
        other => return Err(format!("the names are not a list: {other:?}")),
    };
    Ok(Decision {
        allowed: passed || vap.action != "Deny",
        failed: !passed,
        message,
        audit_annotations,
        named,
    })
}

// ---------------------------------------------------------------------------------------
// The webhook's decision on the same request.

fn webhook(policy: &Policy, review: &Value, namespace: &Value) -> Decision {
    let body = serde_json::to_vec(review).unwrap();
    // The cluster as the apiserver knows it: the pod's namespace exists, with its labels.
    let mut cluster = Objects::complete();
    cluster.add_namespace(serde_json::from_value(namespace.clone()).unwrap());
    let review_with = |p: &Policy| {
        review_bytes_with(Stage::Validate, p, &cluster, &body).expect("a review of a pod")
    };
    let r = review_with(policy);
    // The policy that decided: the profile's, if one fit.
    let pod = pod_of(review);
    let labels = pod.as_ref().and_then(|p| p.metadata.labels.as_ref());
    let ns = review["request"]["namespace"].as_str().unwrap_or("");
    let policy = select_profile(policy, ns, PodLabels::Parsed(labels), &cluster).policy;
    let failed = r.verdict() == Some(Verdict::MissingRequests);
    let response = &r.response;
    let message = if !failed {
        None
    } else {
        match policy.validation.mode {
            // What the webhook adds from the cluster context (a claim it could not read)
            // the exported policy cannot know: a difference its notes name.
            Mode::Enforce => Some(one_line(
                response
                    .result
                    .message
                    .split('\n')
                    .filter(|l| !l.starts_with(CLAIM_NOT_READ)),
            )),
            Mode::Warn => Some(one_line(
                response.warnings.iter().flatten().map(String::as_str),
            )),
            // No message in audit mode: the policy records the one enforce would give.
            Mode::Audit => {
                let mut enforcing = policy.clone();
                enforcing.validation.mode = Mode::Enforce;
                enforcing.profiles.clear();
                let r = review_with(&enforcing);
                Some(one_line(r.response.result.message.split('\n')))
            }
        }
    };
    let named = match (&r.verdict(), pod) {
        (Some(Verdict::MissingRequests), Some(pod)) => missing_requests(policy, &pod)
            .into_iter()
            .map(|m| m.container)
            .collect(),
        _ => vec![],
    };
    Decision {
        allowed: response.allowed,
        failed,
        message,
        audit_annotations: response.audit_annotations.clone().into_iter().collect(),
        named,
    }
}

fn pod_of(review: &Value) -> Option<Pod> {
    serde_json::from_value(review["request"]["object"].clone()).ok()
}

/// Whether the policy's matchConstraints take the request: a pod CREATE, no subresource
/// (the namespace selection is the webhook's, and tests/deploy.rs holds it so).
fn matched(review: &Value) -> bool {
    let r = &review["request"];
    r["operation"] == "CREATE"
        && r["resource"]["resource"] == "pods"
        && r["resource"]["group"] == ""
        && r["subResource"].as_str().unwrap_or("").is_empty()
}

/// `request` as CEL sees it: the AdmissionRequest without the objects.
fn request_var(review: &Value) -> Value {
    let mut r = review["request"].clone();
    if let Some(o) = r.as_object_mut() {
        o.remove("object");
        o.remove("oldObject");
    }
    r
}

fn options() -> ExportOptions {
    ExportOptions {
        namespace_selector: tollgate::register::validating_namespace_selector("tollgate-system")
            .unwrap(),
        source: "test".into(),
        ..Default::default()
    }
}

fn base_context() -> Context<'static> {
    let mut ctx = Context::default().with_all();
    ctx.add_function("matches", matches);
    ctx
}

thread_local! {
    static PATTERNS: std::cell::RefCell<HashMap<String, regex::Regex>> = Default::default();
}

/// The crate's own `matches` (the `regex` crate, which agrees with RE2 on the escaped
/// literals, `.`, `.*`, `^`, `$` and `(?s)` the export writes), with each pattern compiled
/// once rather than at every call: the test makes hundreds of thousands.
fn matches(
    ftx: &kube_cel::cel::FunctionContext,
    This(subject): This<Arc<String>>,
    pattern: Arc<String>,
) -> Result<bool, kube_cel::cel::ExecutionError> {
    PATTERNS.with(|cache| {
        let mut cache = cache.borrow_mut();
        if !cache.contains_key(pattern.as_str()) {
            let re = regex::Regex::new(&pattern)
                .map_err(|e| ftx.error(format!("'{pattern}' not a valid regex: {e}")))?;
            cache.insert(pattern.to_string(), re);
        }
        Ok(cache[pattern.as_str()].is_match(&subject))
    })
}

/// The Namespace object of the request's namespace, as the apiserver hands it to a policy
/// (`namespaceObject`): with `labels` and the name label every namespace carries.
fn namespace_object(review: &Value, labels: &Value) -> Value {
    let name = review["request"]["namespace"].as_str().unwrap_or("default");
    let mut labels = labels.as_object().cloned().unwrap_or_default();
    labels.insert("kubernetes.io/metadata.name".into(), json!(name));
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

/// Both decisions of one request in a namespace with these labels, or why they disagree.
/// The policies' guards leave one of them in scope; the others pass the pod, say nothing
/// and record nothing, which `decide`'s results are checked for too.
fn compare(
    policy: &Policy,
    vaps: &[Vap],
    base: &Context,
    review: &Value,
    namespace_labels: &Value,
) -> Result<Decision, String> {
    let namespace = namespace_object(review, namespace_labels);
    let hook = webhook(policy, review, &namespace);
    let mut decision = Decision {
        allowed: true,
        failed: false,
        message: None,
        audit_annotations: BTreeMap::new(),
        named: vec![],
    };
    let mut actions = vec![];
    if matched(review) {
        let object = &review["request"]["object"];
        for vap in vaps {
            let d = decide(vap, base, object, &request_var(review), &namespace)?;
            if d.failed || !d.audit_annotations.is_empty() {
                actions.push(format!("{} ({})", vap.name, vap.action));
            }
            decision.allowed &= d.allowed;
            decision.failed |= d.failed;
            decision.message = decision.message.or(d.message);
            decision.audit_annotations.extend(d.audit_annotations);
            decision.named.extend(d.named);
        }
    }
    if actions.len() > 1 {
        return Err(format!("more than one policy decided: {actions:?}"));
    }
    if hook != decision {
        return Err(format!(
            "webhook: {hook:#?}\npolicies: {decision:#?}\nthe policies that decided: {actions:?}"
        ));
    }
    Ok(hook)
}

// ---------------------------------------------------------------------------------------
// Every golden case.

/// Each golden case: its name, policy, review, and the labels of its namespace (from its
/// context.yaml, as the webhook's cluster context holds them).
fn golden_cases() -> Vec<(String, Policy, Value, Value)> {
    golden_cases_with_paths()
        .into_iter()
        .map(|(n, p, r, l, _)| (n, p, r, l))
        .collect()
}

/// [`golden_cases`], each with the path of its policy file.
fn golden_cases_with_paths() -> Vec<(String, Policy, Value, Value, std::path::PathBuf)> {
    let mut out = vec![];
    for case in common::golden::cases() {
        let name = case.name.clone();
        let policy_path = case.policy_path();
        // The exported policy judges pods; workloads (their templates judged as the pods
        // they will make) are the webhook's alone.
        if case.dir.join("workload.yaml").exists() {
            continue;
        }
        let policy = common::load_policy(&policy_path);
        let review = case.review();
        if review["request"]["kind"]["kind"] != "Pod" {
            continue;
        }
        let ns = review["request"]["namespace"].clone();
        let labels = case
            .context()
            .into_iter()
            .find(|d| d["kind"] == "Namespace" && d["metadata"]["name"] == ns)
            .map_or(json!({}), |d| d["metadata"]["labels"].clone());
        out.push((
            name.clone(),
            policy.clone(),
            review.clone(),
            labels.clone(),
            policy_path.clone(),
        ));
        // What the validating webhook (or the policy) sees of a mutated pod: the golden
        // result of the mutation, after the apiserver's defaulting.
        if let Some(mut mutated) = case.mutated() {
            tollgate_core::default_requests_from_limits(&mut mutated);
            let mut after = review.clone();
            after["request"]["object"] = mutated;
            out.push((
                format!("{name} (mutated, defaulted)"),
                policy,
                after,
                labels,
                policy_path,
            ));
        }
    }
    out
}

#[test]
fn every_golden_case_is_decided_alike() {
    let base = base_context();
    let mut exports: HashMap<String, Vec<Vap>> = HashMap::new();
    let cases = golden_cases();
    assert!(cases.len() > 60, "{} golden cases", cases.len());
    let mut judged = 0;
    for (name, policy, review, labels) in &cases {
        let key = serde_json::to_string(policy).unwrap();
        let vaps = exports.entry(key).or_insert_with(|| {
            Vap::all_from_yaml(&validating_admission_policy(policy, &options()).yaml)
        });
        judged += usize::from(matched(review));
        if let Err(why) = compare(policy, vaps, &base, review, labels) {
            panic!(
                "golden case {name}: the policy and the webhook disagree\n{why}\n\
                 request: {}\n--- the exported policy\n{}",
                serde_json::to_string_pretty(&review["request"]).unwrap(),
                vaps[0].source
            );
        }
    }
    assert!(judged > 50, "{judged} golden requests reached the policy");
}

/// Every golden case's pod (and mutated pod) through the real apiserver: each case its own
/// world (its policy with its namespace names and globs under a prefix of the case's own,
/// its namespace so named, with the labels of its context.yaml).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_golden_case_is_decided_alike_by_the_apiserver() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let started = std::time::Instant::now();
    let mut worlds = vec![];
    let mut cases = vec![];
    let mut unsendable = vec![];
    for (i, (name, _, review, labels, path)) in golden_cases_with_paths().into_iter().enumerate() {
        let prefix = format!("gold{i}-");
        let policy = crate::common::admission::policy_under(Some(&path), &prefix);
        let yaml = validating_admission_policy(&policy, &options()).yaml;
        let mut review = review;
        let ns = format!(
            "{prefix}{}",
            review["request"]["namespace"].as_str().unwrap()
        );
        review["request"]["namespace"] = json!(ns);
        let labels = if labels.is_object() {
            labels
        } else {
            json!({})
        };
        match case_of(&review, worlds.len(), false) {
            Some(mut c) => {
                c.what = format!("golden case {name}");
                cases.push(c);
            }
            None => unsendable.push(name.clone()),
        }
        worlds.push(World {
            tag: format!("gold{i}"),
            policy,
            yaml,
            namespaces: BTreeMap::from([(ns, labels)]),
        });
    }
    let t = through_the_apiserver(cp, &worlds, &cases, "export-golden").await;
    eprintln!(
        "golden cases through the apiserver: {} compared ({} denied, {} warned), not sent \
         (a user name no HTTP header carries): {unsendable:?}, refused before admission: \
         {:?}, in {:.1?}",
        t.compared,
        t.denied,
        t.warned,
        t.inadmissible,
        started.elapsed()
    );
    assert!(
        t.disagreements.is_empty(),
        "{} of {} disagree:\n{}",
        t.disagreements.len(),
        t.compared,
        t.disagreements.join("\n\n")
    );
    assert!(
        t.compared > 60,
        "{} golden cases through the apiserver",
        t.compared
    );
    // The golden pods a real apiserver refuses before admission: a pod the mutation makes
    // one it takes (validation, the webhook's or the policy's, sees only that), and two
    // the apiserver never lets any webhook see.
    const NEVER_ADMITTED: &[(&str, &str)] = &[
        (
            "mutate-json-pointer-escaping",
            "an annotation key that is not a qualified name",
        ),
        (
            "validate-ephemeral-containers-excluded",
            "ephemeral containers at create (they come by the subresource)",
        ),
    ];
    let refused = |what: &str| {
        t.inadmissible
            .iter()
            .any(|r| r.starts_with(&format!("{what}:")))
    };
    for r in &t.inadmissible {
        let what = r.split(':').next().unwrap();
        let case = what
            .trim_start_matches("golden case ")
            .trim_end_matches(" (mutated, defaulted)");
        let mutated = format!("golden case {case} (mutated, defaulted)");
        let made_admissible =
            what != mutated && cases.iter().any(|c| c.what == mutated) && !refused(&mutated);
        assert!(
            made_admissible || NEVER_ADMITTED.iter().any(|(n, _)| *n == case),
            "the apiserver refuses a golden pod: {r}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Generated policies, requesters and pods.

const RESOURCES: &[&str] = &[
    "cpu",
    "memory",
    "ephemeral-storage",
    "nvidia.com/gpu",
    "example.com/größe",
];
const ANNOTATIONS: &[&str] = &["tollgate.dev/opt-out", "example.com/skip-checks"];
const NAMESPACE_GLOBS: &[&str] = &["*", "ml-*", "ml", "team-?", "*-x?", "prod", "r*h*", "**"];
const USER_GLOBS: &[&str] = &[
    "alice",
    "system:serviceaccount:*:runner",
    "*admin*",
    "b?b",
    "weird\"user\\x",
    "dél*",
    "a.b+c(d)[e]{f}|g^h$",
];
const CONTROLLER_GLOBS: &[&str] = &[
    "system:serviceaccount:kube-system:job-controller",
    "system:serviceaccount:*:runner",
    "system:serviceaccount:kube-system:*",
];
const APPROVALS: &[&str] = &["tollgate.dev/opt-out-approved-by", "example.com/approved"];
/// What a pod's approval says: whom its template was approved for (the engine only asks
/// that there is one).
const APPROVAL_VALUES: &[&str] = &["alice", "", "weird\"user\\x", "日本 in ml"];
const GROUP_GLOBS: &[&str] = &[
    "system:masters",
    "platform",
    "system:serviceaccounts:*",
    "oidc:*",
];
const NAMESPACES: &[&str] = &[
    "ml",
    "ml-team-a",
    "prod",
    "default",
    "team-b",
    "research-x1",
];
const USERS: &[&str] = &[
    "alice",
    "bob",
    "system:serviceaccount:ml:runner",
    "system:serviceaccount:kube-system:job-controller",
    "kubernetes-admin",
    "",
    "weird\"user\\x",
    "tab\tuser",
    "ctl\u{1}x\u{7f}",
    "dél\u{e9}",
    "日本",
    "new\nline",
    "a.b+c(d)[e]{f}|g^h$",
];
const GROUPS: &[&str] = &[
    "system:masters",
    "system:authenticated",
    "platform",
    "data-science",
    "system:serviceaccounts:ml",
    "oidc:ops",
];
/// How a pod asks to opt out: the engine reads "true" trimmed and in any ASCII case.
const OPT_OUT_VALUES: &[&str] = &[
    "true",
    "TRUE",
    " True ",
    "true\n",
    "\ttrue",
    "false",
    "yes",
    "",
    "truee",
    "\u{a0}true",
    "\u{200b}true",
    "tRuE\u{3000}",
];

fn gen_policy(rng: &mut Rng) -> Policy {
    gen_policy_in(rng, "")
}

/// A policy whose namespace globs are all under `prefix` (the namespaces of its cases are
/// too, [`gen_review_in`]): a glob and a name keep their match with the prefix on both.
fn gen_policy_in(rng: &mut Rng, prefix: &str) -> Policy {
    let mut p = common::builtin_policy();
    let v = &mut p.validation;
    v.enabled = !rng.chance(8);
    v.mode = *rng.pick(&[Mode::Enforce, Mode::Enforce, Mode::Warn, Mode::Audit]);
    v.operations = match rng.below(12) {
        0 => vec![Operation::Update],
        1 => vec![],
        2 => vec![Operation::Create, Operation::Update],
        _ => vec![Operation::Create],
    };
    let mut required: Vec<String> = rng
        .some(RESOURCES, 45)
        .into_iter()
        .map(str::to_owned)
        .collect();
    if rng.chance(10) && !required.is_empty() {
        required.push(required[0].clone());
    }
    if required.is_empty() && rng.chance(70) {
        required = vec!["cpu".into(), "memory".into()];
    }
    v.required_requests = required;
    // A policy is refused at load when its validation would refuse the sidecar its mutation
    // adds (tollgate never makes a pod it would refuse): this one requests every resource
    // a generated policy or profile may require. Validation of pods alone is compared here.
    let sidecar = p
        .mutation
        .metrics_sidecar
        .container
        .resources
        .get_or_insert_with(Default::default);
    let requests = sidecar.requests.get_or_insert_with(Default::default);
    for r in RESOURCES {
        requests
            .entry((*r).to_owned())
            .or_insert_with(|| Quantity("1".into()));
    }
    let o = &mut p.opt_out;
    o.annotation = (*rng.pick(ANNOTATIONS)).to_owned();
    let globs = |rng: &mut Rng, from: &[&str], percent| -> Vec<Glob> {
        rng.some(from, percent)
            .into_iter()
            .map(Glob::from)
            .collect()
    };
    o.namespaces = globs(rng, NAMESPACE_GLOBS, 25)
        .into_iter()
        .map(|g| Glob::from(format!("{prefix}{}", g.as_str()).as_str()))
        .collect();
    o.users = globs(rng, USER_GLOBS, 20);
    o.groups = globs(rng, GROUP_GLOBS, 25);
    // The controllers: the shipped list, some of these globs (one overlapping the users'),
    // or none; a controller's pod opts out only with the approval its template gave it.
    if rng.chance(50) {
        o.controllers = globs(rng, CONTROLLER_GLOBS, 40);
    }
    o.approval_annotation = (*rng.pick(APPROVALS)).to_owned();
    // Half the policies have profiles: matched on namespaces, namespace labels or pod
    // labels, each changing the mode, the requests or the opt-out rules.
    let profiles: Vec<Value> = (0..rng.below(4) * usize::from(rng.chance(50)))
        .map(|i| gen_profile(rng, i, prefix))
        .collect();
    if profiles.is_empty() {
        return p;
    }
    let mut text = serde_json::to_value(&p).unwrap();
    text["profiles"] = Value::Array(profiles);
    Policy::from_text("generated", &text.to_string()).expect("a generated policy loads")
}

const LABEL_KEYS: &[&str] = &["team", "tier"];
const LABEL_VALUES: &[&str] = &["a", "b", "gpu"];

fn gen_selector(rng: &mut Rng) -> Value {
    let mut s = json!({});
    if rng.chance(50) {
        s["matchLabels"] = json!({*rng.pick(LABEL_KEYS): *rng.pick(LABEL_VALUES)});
    }
    if rng.chance(60) {
        let exprs: Vec<Value> = (0..1 + rng.below(2))
            .map(|_| {
                let key = *rng.pick(LABEL_KEYS);
                match rng.below(4) {
                    0 => json!({"key": key, "operator": "In", "values": rng.some(LABEL_VALUES, 60)}),
                    1 => json!({"key": key, "operator": "NotIn", "values": rng.some(LABEL_VALUES, 60)}),
                    2 => json!({"key": key, "operator": "Exists"}),
                    _ => json!({"key": key, "operator": "DoesNotExist"}),
                }
            })
            .filter(|e| e["values"].as_array().is_none_or(|v| !v.is_empty()))
            .collect();
        s["matchExpressions"] = json!(exprs);
    }
    s
}

fn gen_profile(rng: &mut Rng, i: usize, prefix: &str) -> Value {
    let mut m = json!({});
    if rng.chance(50) {
        let globs: Vec<String> = rng
            .some(NAMESPACE_GLOBS, 30)
            .into_iter()
            .map(|g| format!("{prefix}{g}"))
            .collect();
        m["namespaces"] = json!(globs);
    }
    if rng.chance(40) {
        m["namespaceSelector"] = gen_selector(rng);
    }
    if rng.chance(40) {
        m["podSelector"] = gen_selector(rng);
    }
    let mut profile = json!({"name": format!("p{i}"), "match": m});
    let mut validation = json!({});
    if rng.chance(60) {
        validation["mode"] = json!(*rng.pick(&["enforce", "warn", "audit"]));
    }
    if rng.chance(40) {
        validation["requiredRequests"] =
            json!(rng.some(&["cpu", "memory", "ephemeral-storage"], 50));
    }
    if rng.chance(10) {
        validation["enabled"] = json!(false);
    }
    profile["validation"] = validation;
    if rng.chance(30) {
        profile["optOut"] = json!({"groups": rng.some(GROUP_GLOBS, 30), "users": []});
    }
    profile
}

/// Labels for a pod or a namespace, from the profiles' vocabulary.
fn gen_labels(rng: &mut Rng) -> Value {
    let mut labels = serde_json::Map::new();
    for key in LABEL_KEYS {
        if rng.chance(50) {
            labels.insert((*key).into(), json!(*rng.pick(LABEL_VALUES)));
        }
    }
    Value::Object(labels)
}

/// A container's resources: absent, empty, or some requests and limits.
fn resources(rng: &mut Rng) -> Option<Value> {
    match rng.below(6) {
        0 => None,
        1 => Some(json!({})),
        2 => Some(json!({"requests": {}})),
        _ => {
            let mut out = serde_json::Map::new();
            let requests: serde_json::Map<String, Value> = rng
                .some(RESOURCES, 55)
                .into_iter()
                .map(|r| (r.to_owned(), json!("1")))
                .collect();
            if !requests.is_empty() || rng.chance(30) {
                out.insert("requests".into(), Value::Object(requests));
            }
            // Limits are not requests: the webhook judges the pod after defaulting, and so
            // does the policy.
            let limits: serde_json::Map<String, Value> = rng
                .some(RESOURCES, 30)
                .into_iter()
                .map(|r| (r.to_owned(), json!("2")))
                .collect();
            if !limits.is_empty() {
                out.insert("limits".into(), Value::Object(limits));
            }
            Some(Value::Object(out))
        }
    }
}

fn container(rng: &mut Rng, name: String, init: bool) -> Value {
    let mut c = json!({"name": name, "image": "busybox"});
    if let Some(r) = resources(rng) {
        c["resources"] = r;
    }
    if init && rng.chance(40) {
        c["restartPolicy"] = json!("Always");
    }
    c
}

fn gen_pod(rng: &mut Rng, annotation: &str, approval: &str) -> Value {
    let mut metadata = serde_json::Map::new();
    match rng.below(10) {
        0 => {}
        1 | 2 => {
            metadata.insert("generateName".into(), json!("trainer-"));
        }
        3 => {
            metadata.insert("name".into(), json!(""));
            metadata.insert("generateName".into(), json!("worker-"));
        }
        _ => {
            metadata.insert("name".into(), json!(format!("pod-{}", rng.below(100))));
        }
    }
    let mut annotations = serde_json::Map::new();
    if rng.chance(55) {
        annotations.insert(annotation.into(), json!(*rng.pick(OPT_OUT_VALUES)));
    }
    if rng.chance(20) {
        annotations.insert("tollgate.dev/opt-out-not".into(), json!("true"));
    }
    if rng.chance(30) {
        annotations.insert(approval.into(), json!(*rng.pick(APPROVAL_VALUES)));
    }
    if !annotations.is_empty() || rng.chance(20) {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }
    let mut spec = json!({
        "containers": (0..1 + rng.below(3))
            .map(|i| container(rng, format!("main-{i}"), false))
            .collect::<Vec<_>>(),
    });
    let inits = rng.below(4);
    if inits > 0 || rng.chance(10) {
        spec["initContainers"] = json!((0..inits)
            .map(|i| container(rng, format!("init-{i}"), true))
            .collect::<Vec<_>>());
    }
    if rng.chance(15) {
        spec["ephemeralContainers"] = json!([{"name": "debugger", "image": "busybox"}]);
    }
    if rng.chance(25) {
        spec["resources"] = resources(rng).unwrap_or(json!({}));
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

/// What the apiserver's conversion leaves out: `omitempty` drops empty strings, maps and
/// lists. The policy must decide the same whether a field is empty or absent.
fn omit_empty(v: &mut Value) {
    match v {
        Value::Object(o) => {
            for x in o.values_mut() {
                omit_empty(x);
            }
            o.retain(|_, x| match x {
                Value::String(s) => !s.is_empty(),
                Value::Object(m) => !m.is_empty(),
                Value::Array(a) => !a.is_empty(),
                Value::Null => false,
                _ => true,
            });
        }
        Value::Array(a) => a.iter_mut().for_each(omit_empty),
        _ => {}
    }
}

fn gen_review(rng: &mut Rng, policy: &Policy) -> Value {
    gen_review_in(rng, policy, "")
}

/// A request in a namespace under `prefix`.
fn gen_review_in(rng: &mut Rng, policy: &Policy, prefix: &str) -> Value {
    let mut pod = gen_pod(
        rng,
        &policy.opt_out.annotation,
        &policy.opt_out.approval_annotation,
    );
    if rng.chance(70) {
        pod["metadata"]["labels"] = gen_labels(rng);
    }
    let namespace = format!("{prefix}{}", rng.pick(NAMESPACES));
    // Validation runs after the apiserver has set these: metadata is never empty there.
    pod["metadata"]["namespace"] = json!(namespace);
    pod["metadata"]["uid"] = json!("00000000-0000-0000-0000-000000000001");
    // Now and then a name holding every ASCII character: all of them are quoted alike.
    let all_ascii: String = (0u8..=127).map(char::from).collect();
    let user = if rng.chance(3) {
        all_ascii.as_str()
    } else {
        *rng.pick(USERS)
    };
    let groups: Vec<&str> = rng.some(GROUPS, 25);
    let mut review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-000000000000",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": user, "groups": groups},
            "object": pod,
        }
    });
    if rng.chance(50) {
        omit_empty(&mut review["request"]["object"]);
        omit_empty(&mut review["request"]["userInfo"]);
    }
    review
}

// Two halves, which the test harness runs side by side.
#[test]
fn generated_policies_requesters_and_pods_are_decided_alike_first_half() {
    generated(0..POLICIES / 2);
}

#[test]
fn generated_policies_requesters_and_pods_are_decided_alike_second_half() {
    generated(POLICIES / 2..POLICIES);
}

fn generated(policy_seeds: std::ops::Range<u64>) {
    let started = std::time::Instant::now();
    let base = base_context();
    let mut cases = 0u64;
    let mut failed = 0u64;
    let mut honoured = 0u64;
    let mut with_profiles = 0u64;
    for policy_seed in policy_seeds {
        let mut rng = Rng::new(policy_seed);
        let policy = gen_policy(&mut rng);
        let vaps = Vap::all_from_yaml(&validating_admission_policy(&policy, &options()).yaml);
        assert_eq!(
            vaps.len(),
            1 + policy.profiles.len(),
            "one policy per scope"
        );
        with_profiles += u64::from(vaps.len() > 1);
        for request_seed in 0..REQUESTS_PER_POLICY {
            let seed = policy_seed * 1_000_000 + request_seed;
            let mut rng = Rng::new(seed);
            let review = gen_review(&mut rng, &policy);
            let namespace_labels = gen_labels(&mut rng);
            let hook =
                compare(&policy, &vaps, &base, &review, &namespace_labels).unwrap_or_else(|why| {
                    panic!(
                    "seed {seed} (policy seed {policy_seed}): the policy and the webhook disagree\n\
                     {why}\npolicy: {}\nrequester: {}\npod: {}\n--- the exported policy\n{}",
                    serde_json::to_string(&json!({
                        "validation": policy.validation,
                        "optOut": policy.opt_out,
                        "profiles": policy.profiles,
                    }))
                    .unwrap(),
                    serde_json::to_string(&json!({
                        "namespace": review["request"]["namespace"],
                        "namespaceLabels": namespace_labels,
                        "userInfo": review["request"]["userInfo"],
                    }))
                    .unwrap(),
                    serde_json::to_string_pretty(&review["request"]["object"]).unwrap(),
                    vaps[0].source
                )
                });
            failed += u64::from(hook.failed);
            honoured += u64::from(hook.audit_annotations.contains_key("opt-out"));
            cases += 1;
        }
    }
    // The generator must reach both outcomes often, or the agreement proves little.
    assert!(cases * 2 >= 10_000, "{cases} cases in this half");
    assert!(
        failed > cases / 10,
        "{failed} of {cases} cases lack requests"
    );
    assert!(
        honoured > cases / 50,
        "{honoured} of {cases} opt-outs honoured"
    );
    assert!(
        with_profiles >= 15,
        "{with_profiles} policies with profiles"
    );
    eprintln!(
        "export equivalence: {cases} generated cases ({failed} lacking requests, {honoured} \
         opt-outs honoured) in {:.1?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// The glob translation, against the engine's matcher.

#[test]
fn globs_become_anchored_patterns_that_match_the_same_names() {
    let base = base_context();
    let alphabet = ['a', 'b', '-', '.', '*', '?', '\n', 'é', '(', '\\', '$'];
    let mut rng = Rng::new(7);
    let mut checked = 0;
    for _ in 0..300 {
        let pattern: String = (0..rng.below(6)).map(|_| *rng.pick(&alphabet)).collect();
        if pattern.is_empty() {
            continue;
        }
        let glob = Glob::new(&pattern);
        let program = compile(
            &format!("subject.matches({})", cel_literal(&glob_to_re2(&pattern))),
            &pattern,
        );
        for _ in 0..20 {
            let subject: String = (0..rng.below(7))
                .map(|_| *rng.pick(&['a', 'b', '-', '.', '\n', 'é', '(', '\\', '$']))
                .collect();
            let mut ctx = base.new_inner_scope();
            ctx.add_variable_from_value("subject", Cel::String(Arc::new(subject.clone())));
            let got = program.execute(&ctx).unwrap();
            assert_eq!(
                got,
                Cel::Bool(glob.matches(&subject)),
                "glob {pattern:?} as {:?} on {subject:?}",
                glob_to_re2(&pattern)
            );
            checked += 1;
        }
    }
    assert!(checked > 4000);
}

#[test]
fn the_message_is_the_webhooks_on_one_line() {
    // One case spelled out, so that what "the same words" means can be read here.
    let policy = Policy::builtin();
    let vaps = Vap::all_from_yaml(&validating_admission_policy(&policy, &options()).yaml);
    let [vap] = &vaps[..] else {
        panic!("one policy without profiles")
    };
    let ns = namespace_object(&json!({"request": {"namespace": "ml"}}), &json!({}));
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "notebook", "annotations": {"tollgate.dev/opt-out": "true"}},
        "spec": {"containers": [{"name": "jupyter", "image": "jupyter"}]},
    });
    let review = tollgate::cli::synthetic_review(&pod, Some("ml"), "alice", &[]);
    let d = decide(vap, &base_context(), &pod, &request_var(&review), &ns).unwrap();
    assert!(!d.allowed);
    assert_eq!(
        d.message.unwrap(),
        "pod \"notebook\" must request cpu and memory for every container, and some do not: \
         - container \"jupyter\" has no request for cpu and memory \
         Fix: add requests sized for your workload to each container listed, for example: \
         resources: requests: cpu: \"1\" memory: 2Gi \
         This pod asks to opt out, but opting out with tollgate.dev/opt-out is not permitted \
         for \"alice\" in namespace \"ml\"; ask your platform team."
    );
    assert_eq!(vap.name, "validate.tollgate.dev");
    assert_eq!(vap.binding, vap.name);
    compare(&policy, &vaps, &base_context(), &review, &json!({})).unwrap();
}

/// The one way a message may differ, as deploy/README.md says: outside ASCII, what Rust's
/// `{:?}` escapes (not printable, or combining) the policy writes as it is.
#[test]
fn user_names_escaped_only_by_rust_are_the_documented_difference() {
    let mut policy = Policy::builtin();
    policy.opt_out.groups = vec!["platform".into()];
    let vaps = Vap::all_from_yaml(&validating_admission_policy(&policy, &options()).yaml);
    let vap = &vaps[0];
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "notebook", "annotations": {"tollgate.dev/opt-out": "true"}},
        "spec": {"containers": [{"name": "jupyter", "image": "jupyter"}]},
    });
    let review = tollgate::cli::synthetic_review(&pod, Some("ml"), "zw\u{200b}sp", &[]);
    let ns = namespace_object(&review, &json!({}));
    let hook = webhook(&policy, &review, &ns);
    let d = decide(vap, &base_context(), &pod, &request_var(&review), &ns).unwrap();
    assert!(!hook.allowed && !d.allowed);
    let (h, v) = (hook.message.unwrap(), d.message.unwrap());
    assert!(h.contains(r#"for "zw\u{200b}sp" in"#), "{h}");
    assert!(v.contains("for \"zw\u{200b}sp\" in"), "{v}");
    assert_eq!(h.replace(r"\u{200b}", "\u{200b}"), v);
}

// ---------------------------------------------------------------------------------------
// Generated cases decided by the real apiserver.

/// Generated policies installed in the real apiserver, and requests per policy: the
/// apiserver's answer to each pod created with `dryRun=All` by the generated requester is
/// compared with the webhook's. Fewer than the interpreter's cases above (each is two
/// requests to an apiserver on a shared machine), from the same generator.
const APISERVER_POLICIES: u64 = 40;
const APISERVER_REQUESTS_PER_POLICY: u64 = 50;

/// The label of a generated policy's namespaces, which its policies select.
const WORLD_LABEL: &str = "export-equivalence.tollgate.dev/world";

/// What the apiserver takes in: a generated pod it would refuse before admission (an
/// ephemeral container at create, no name at all, a resource name that is not a
/// qualified name, an extended resource without an equal limit, pod-level resources other
/// than cpu and memory, or less than its containers ask) made one it takes. The webhook
/// judges the same pod.
fn admissible(pod: &mut Value) {
    let spec = pod["spec"].as_object_mut().unwrap();
    spec.remove("ephemeralContainers");
    for list in ["containers", "initContainers"] {
        for c in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let Some(r) = c.get_mut("resources").and_then(Value::as_object_mut) else {
                continue;
            };
            let gpu = ["requests", "limits"]
                .iter()
                .any(|k| r.get(*k).is_some_and(|m| m.get("nvidia.com/gpu").is_some()));
            for k in ["requests", "limits"] {
                if let Some(m) = r.get_mut(k).and_then(Value::as_object_mut) {
                    m.remove("example.com/größe");
                    m.remove("nvidia.com/gpu");
                }
            }
            if gpu {
                for k in ["requests", "limits"] {
                    let m = r.entry(k).or_insert_with(|| json!({}));
                    m["nvidia.com/gpu"] = json!("1");
                }
            }
        }
    }
    if let Some(r) = spec.get_mut("resources").and_then(Value::as_object_mut) {
        for m in r.values_mut().filter_map(Value::as_object_mut) {
            m.retain(|k, _| k == "cpu" || k == "memory");
            for v in m.values_mut() {
                *v = json!("64");
            }
        }
    }
    let meta = &mut pod["metadata"];
    let named = |k: &str| meta[k].as_str().is_some_and(|n| !n.is_empty());
    if !named("name") && !named("generateName") {
        meta["generateName"] = json!("pod-");
    }
}

/// The groups the apiserver gives an impersonated user (its impersonation filter): those
/// asked for, else a service account's own; and `system:authenticated`.
fn impersonated_groups(user: &str, groups: &[String]) -> Vec<String> {
    let mut out = groups.to_vec();
    if out.is_empty() {
        if let Some(ns) = user
            .strip_prefix("system:serviceaccount:")
            .and_then(|r| r.split_once(':'))
            .map(|(ns, _)| ns)
        {
            out = vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
            ];
        }
    }
    if !out
        .iter()
        .any(|g| g == "system:authenticated" || g == "system:unauthenticated")
    {
        out.push("system:authenticated".into());
    }
    out
}

/// The mode of the policy that decides `review` (the profile's, if one fits).
fn deciding_mode(policy: &Policy, review: &Value, namespace: &Value) -> Mode {
    let mut cluster = Objects::complete();
    cluster.add_namespace(serde_json::from_value(namespace.clone()).unwrap());
    let pod = pod_of(review);
    let labels = pod.as_ref().and_then(|p| p.metadata.labels.as_ref());
    let ns = review["request"]["namespace"].as_str().unwrap_or("");
    select_profile(policy, ns, PodLabels::Parsed(labels), &cluster)
        .policy
        .validation
        .mode
}

/// A message with generated pod names (`PREFIX` and five characters) made alike: the
/// apiserver names a pod anew at each create.
fn generated_names_alike(message: &str, prefixes: &[&str]) -> String {
    let mut out = message.to_owned();
    for p in prefixes {
        let quoted = format!("\"{p}");
        let mut from = 0;
        while let Some(i) = out[from..].find(&quoted).map(|i| i + from) {
            let start = i + quoted.len();
            let end = start + 5;
            if out.len() > end
                && out.as_bytes()[end] == b'"'
                && out[start..end]
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            {
                out.replace_range(start..end, "*****");
            }
            from = start;
        }
    }
    out
}

/// A policy installed for the apiserver to judge: its export, each policy renamed
/// `NAME.TAG` and selecting the namespaces labelled `WORLD_LABEL: TAG`, and those
/// namespaces, by name, with their labels.
struct World {
    tag: String,
    policy: Policy,
    yaml: String,
    namespaces: BTreeMap<String, Value>,
}

/// One case to send: the pod (made admissible), where (a namespace of its world), and by
/// whom.
struct Case {
    what: String,
    world: usize,
    namespace: String,
    pod: Value,
    user: String,
    groups: Vec<String>,
}

/// What the apiserver and the webhook made of the cases.
#[derive(Default)]
struct Tally {
    compared: u64,
    denied: u64,
    warned: u64,
    inadmissible: Vec<String>,
    disagreements: Vec<String>,
    waited: std::time::Duration,
}

/// The worlds installed, each case sent, and the answers held to the webhook's; the
/// policies are deleted once all are decided. `tag` names the wait's own policy.
async fn through_the_apiserver(
    cp: &common::envtest::ControlPlane,
    worlds: &[World],
    cases: &[Case],
    tag: &str,
) -> Tally {
    use crate::common::admission;
    use futures::StreamExt as _;

    let client = cp.client("admin").await;
    let admin = &client;
    // Where a refused pod is created again, no policy there: the pod as the apiserver
    // admits it, defaulted, is what the webhook judges.
    let plain = cp.namespace(&format!("{tag}-plain"), &[]).await;
    let plain = &plain;

    let mut objects = vec![];
    for w in worlds {
        let docs: Vec<Value> = serde_saphyr::from_multiple(&w.yaml).unwrap();
        for pair in docs.chunks(2) {
            let (mut vap, mut binding) = (pair[0].clone(), pair[1].clone());
            let name = format!("{}.{}", vap["metadata"]["name"].as_str().unwrap(), w.tag);
            vap["metadata"]["name"] = json!(name);
            // This world's namespaces alone (the webhook's namespace selection is
            // tests/deploy.rs's to hold).
            vap["spec"]["matchConstraints"]["namespaceSelector"] =
                json!({"matchLabels": {WORLD_LABEL: w.tag}});
            binding["metadata"]["name"] = json!(name);
            binding["spec"]["policyName"] = json!(name);
            objects.push(vap);
            objects.push(binding);
        }
    }
    let namespaces: Vec<(&String, Value)> = worlds
        .iter()
        .flat_map(|w| {
            w.namespaces.iter().map(|(n, l)| {
                let mut l = l.clone();
                l[WORLD_LABEL] = json!(w.tag);
                (n, l)
            })
        })
        .collect();
    futures::stream::iter(namespaces.iter())
        .for_each_concurrent(8, |(name, labels)| async move {
            let ns: k8s_openapi::api::core::v1::Namespace =
                serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                    .unwrap();
            kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
                .create(&Default::default(), &ns)
                .await
                .unwrap_or_else(|e| panic!("namespace {name}: {e}"));
            admission::let_anyone_create_pods(admin, name).await;
        })
        .await;
    let created: Vec<Result<Value, String>> = futures::stream::iter(objects.iter())
        .map(|o| admission::create(admin, o, false))
        .buffered(8)
        .collect()
        .await;
    for (o, c) in objects.iter().zip(created) {
        if let Err(e) = c {
            panic!(
                "the apiserver refused {}: {e}\n{o:#}",
                o["metadata"]["name"]
            );
        }
    }
    let mut tally = Tally {
        waited: admission::await_enforcement(admin, plain, tag).await,
        ..Tally::default()
    };

    // (the pod as admitted, or why it was not; the apiserver's answer where the policies
    // are). An allowed pod comes back as the policies saw it; a refused one is created
    // again where no policy applies, to see it so (its generated name aside).
    let answers: Vec<(admission::Answer, admission::Answer)> = futures::stream::iter(cases.iter())
        .map(|c| async move {
            let after =
                admission::dry_run_pod(admin, &c.namespace, &c.pod, Some((&c.user, &c.groups)))
                    .await;
            if after.allowed() {
                return (after.clone(), after);
            }
            let before = admission::dry_run_pod(admin, plain, &c.pod, None).await;
            (before, after)
        })
        .buffered(16)
        .collect()
        .await;
    admission::delete_all(admin, &objects).await;

    for (c, (before, after)) in cases.iter().zip(&answers) {
        let w = &worlds[c.world];
        let Some(admitted) = &before.object else {
            tally
                .inadmissible
                .push(format!("{}: {:?}", c.what, before.message));
            continue;
        };
        tally.compared += 1;
        // The pod as the webhook sees it: defaulted, in its namespace.
        let mut object = admitted.clone();
        object["metadata"]["namespace"] = json!(c.namespace);
        let groups = impersonated_groups(&c.user, &c.groups);
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "00000000-0000-0000-0000-000000000000",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": c.namespace,
                "operation": "CREATE",
                "userInfo": {"username": c.user, "groups": groups},
                "object": object,
                "dryRun": true,
            }
        });
        let labels = &w.namespaces[&c.namespace];
        let mut with_world = labels.clone();
        with_world[WORLD_LABEL] = json!(w.tag);
        let namespace = namespace_object(&review, &with_world);
        let hook = webhook(&w.policy, &review, &namespace);
        let mode = deciding_mode(&w.policy, &review, &namespace);
        let generated: Vec<&str> = c.pod["metadata"]["generateName"]
            .as_str()
            .into_iter()
            .collect();
        let alike = |m: &str| generated_names_alike(m, &generated);
        let ours = |(p, _): &(String, String)| p.ends_with(&format!(".{}", w.tag));
        let warnings: Vec<(String, String)> = after
            .warnings
            .iter()
            .filter_map(|w| admission::warning(w))
            .filter(ours)
            .collect();
        let denial = after.message.as_deref().and_then(admission::denial);
        let mut why = vec![];
        if after.allowed() != hook.allowed {
            why.push(format!(
                "the apiserver {} it, the webhook {}",
                if after.allowed() {
                    "allowed"
                } else {
                    "refused"
                },
                if hook.allowed { "allowed" } else { "refused" }
            ));
        }
        match (&denial, after.allowed()) {
            (Some(d), false) if ours(d) => {
                tally.denied += 1;
                if hook.message.as_deref().map(alike) != Some(alike(&d.1)) {
                    why.push(format!(
                        "denied with\n  {}\nthe webhook's\n  {:?}",
                        d.1, hook.message
                    ));
                }
            }
            (_, false) => why.push(format!("refused, not by its policy: {after:?}")),
            _ => {}
        }
        let want_warning =
            (hook.failed && mode == Mode::Warn).then(|| hook.message.clone().unwrap_or_default());
        match (&want_warning, &warnings[..]) {
            (None, []) => {}
            (Some(m), [(_, w)]) if alike(m) == alike(w) => tally.warned += 1,
            _ => why.push(format!(
                "warnings {warnings:?}, the webhook's {want_warning:?}"
            )),
        }
        if !why.is_empty() {
            tally.disagreements.push(format!(
                "{}: the apiserver and the webhook disagree: {}\n\
                 requester: {:?} in {:?}, namespace {} {}\npod as admitted: {}\n\
                 --- the exported policy\n{}",
                c.what,
                why.join("; "),
                c.user,
                groups,
                c.namespace,
                labels,
                serde_json::to_string(admitted).unwrap(),
                w.yaml,
            ));
        }
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_cases_are_decided_alike_by_the_apiserver() {
    use crate::common::admission;

    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let started = std::time::Instant::now();
    let mut worlds = vec![];
    let mut cases = vec![];
    let mut unsendable = 0u64;
    for policy_seed in 0..APISERVER_POLICIES {
        let prefix = format!("eq{policy_seed}-");
        let mut rng = Rng::new(policy_seed);
        let policy = gen_policy_in(&mut rng, &prefix);
        let yaml = validating_admission_policy(&policy, &options()).yaml;
        // The namespaces, each with labels of its own from the profiles' vocabulary.
        let mut world_rng = Rng::new(policy_seed ^ 0x0005_eed0_fa11);
        let namespaces = NAMESPACES
            .iter()
            .map(|base| (format!("{prefix}{base}"), gen_labels(&mut world_rng)))
            .collect();
        for request_seed in 0..APISERVER_REQUESTS_PER_POLICY {
            let seed = policy_seed * 1_000_000 + request_seed;
            let mut rng = Rng::new(seed);
            let review = gen_review_in(&mut rng, &policy, &prefix);
            match case_of(&review, worlds.len(), true) {
                Some(mut c) => {
                    c.what = format!("seed {seed} (policy seed {policy_seed})");
                    cases.push(c);
                }
                None => unsendable += 1,
            }
        }
        worlds.push(World {
            tag: format!("eq{policy_seed}"),
            policy,
            yaml,
            namespaces,
        });
    }

    // The impersonated identities are as [`impersonated_groups`] predicts.
    let client = cp.client("admin").await;
    for user in USERS.iter().filter(|u| admission::sendable(u)) {
        for groups in [vec![], vec!["platform".to_owned()]] {
            let info = admission::user_info(&client, user, &groups).await;
            assert_eq!(info["username"], *user);
            assert_eq!(
                info["groups"],
                json!(impersonated_groups(user, &groups)),
                "{user:?} in {groups:?}"
            );
        }
    }

    let t = through_the_apiserver(cp, &worlds, &cases, "export-equivalence").await;
    eprintln!(
        "export equivalence through the apiserver: {} policies, {} cases compared \
         ({} denied, {} warned), {unsendable} not sent (a user name no HTTP header \
         carries), {} refused before admission, in {:.1?} (enforced after {:.1?})",
        APISERVER_POLICIES,
        t.compared,
        t.denied,
        t.warned,
        t.inadmissible.len(),
        started.elapsed(),
        t.waited
    );
    assert!(
        t.disagreements.is_empty(),
        "{} of {} disagree; the first:\n{}",
        t.disagreements.len(),
        t.compared,
        t.disagreements[0]
    );
    assert!(
        t.inadmissible.len() * 20 < cases.len(),
        "{} of {} generated pods refused before admission: {:#?}",
        t.inadmissible.len(),
        cases.len(),
        t.inadmissible
    );
    assert!(
        t.compared >= 1400,
        "{} cases through the apiserver",
        t.compared
    );
    assert!(
        t.denied > t.compared / 20,
        "{} of {} denied",
        t.denied,
        t.compared
    );
    assert!(t.warned > 0, "no case warned");
}

/// A review's pod and requester as a case of `world` (its pod made admissible if asked,
/// its namespace and uid left to the apiserver), or None if no HTTP header carries the
/// user.
fn case_of(review: &Value, world: usize, make_admissible: bool) -> Option<Case> {
    let r = &review["request"];
    let user = r["userInfo"]["username"].as_str().unwrap_or("").to_owned();
    if !crate::common::admission::sendable(&user) {
        return None;
    }
    let groups: Vec<String> = r["userInfo"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| g.as_str().unwrap().to_owned())
        .collect();
    let mut pod = r["object"].clone();
    if make_admissible {
        admissible(&mut pod);
    }
    pod["metadata"]
        .as_object_mut()
        .unwrap()
        .retain(|k, _| k != "namespace" && k != "uid");
    Some(Case {
        what: String::new(),
        world,
        namespace: r["namespace"].as_str().unwrap().to_owned(),
        pod,
        user,
        groups,
    })
}

/// The documented difference, in the real apiserver: a user name Rust's `{:?}` escapes
/// outside ASCII (a zero-width space) is written as it is in the policy's message, which
/// is otherwise the webhook's.
#[tokio::test]
async fn the_documented_difference_is_the_apiservers_too() {
    use crate::common::admission;

    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let client = cp.client("admin").await;
    let ns = cp.namespace("export-eq-zw", &[(WORLD_LABEL, "zw")]).await;
    admission::let_anyone_create_pods(&client, &ns).await;
    let mut policy = Policy::builtin();
    policy.opt_out.groups = vec!["platform".into()];
    let yaml = validating_admission_policy(&policy, &options()).yaml;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
    let [vap, binding] = &docs[..] else {
        panic!("one policy and binding")
    };
    let (mut vap, mut binding) = (vap.clone(), binding.clone());
    let name = format!("{}.zw", EXPORT_NAME);
    vap["metadata"]["name"] = json!(name);
    vap["spec"]["matchConstraints"]["namespaceSelector"] =
        json!({"matchLabels": {WORLD_LABEL: "zw"}});
    binding["metadata"]["name"] = json!(name);
    binding["spec"]["policyName"] = json!(name);
    let objects = [vap, binding];
    for o in &objects {
        admission::create(&client, o, false).await.unwrap();
    }
    admission::await_enforcement(&client, &ns, "export-eq-zw").await;

    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "notebook", "annotations": {"tollgate.dev/opt-out": "true"}},
        "spec": {"containers": [{"name": "jupyter", "image": "jupyter"}]},
    });
    let user = "zw\u{200b}sp";
    let answer = admission::dry_run_pod(&client, &ns, &pod, Some((user, &[]))).await;
    admission::delete_all(&client, &objects).await;
    let (by, said) = answer
        .message
        .as_deref()
        .and_then(admission::denial)
        .unwrap_or_else(|| panic!("not denied by the policy: {answer:?}"));
    assert_eq!(by, name);

    // (`system:authenticated`, as the apiserver gave the impersonated user.)
    let review = tollgate::cli::synthetic_review(&pod, Some(&ns), user, &[]);
    let hook = webhook(
        &policy,
        &review,
        &namespace_object(&review, &json!({WORLD_LABEL: "zw"})),
    );
    let h = hook.message.unwrap();
    assert!(h.contains(r#"for "zw\u{200b}sp" in"#), "{h}");
    assert!(said.contains("for \"zw\u{200b}sp\" in"), "{said}");
    assert_eq!(h.replace(r"\u{200b}", "\u{200b}"), said);
}

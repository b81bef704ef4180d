//! Every exported ValidatingAdmissionPolicy is one the real kube-apiserver (v1.36,
//! tests/common/envtest.rs) creates, and stays within what it lets one evaluation spend.
//!
//! tests/export_kubectl.rs holds the export to `kubectl --validate=strict`; creating a
//! policy in the apiserver also compiles and type-checks every CEL expression in the
//! admission environment and estimates its cost against the apiserver's limits (it refused
//! an export whose variable was named `namespace`, a reserved word). The policy and its
//! binding are created as exported (renamed only: policies are cluster-scoped, and the
//! suite's tests share the apiserver) with `dryRun=All`. The apiserver writes
//! `status.typeChecking` (the check against the pod's schema) only from the controller
//! manager's status controller, which envtest does not run: what is held here is what the
//! apiserver refuses at create, and, where a status is written, that it warns of nothing.
//!
//! The exports: the built-in policy (a copy of policies/default.yaml), every policy file
//! of the repository (policies/, deploy/ (the two-teams overlay's among them), every
//! `policy.yaml` under tests/, the benches' ten profiles), and the committed
//! native-validation overlay itself.
//!
//! The runtime cost: each distinct export is installed (its namespace names and globs
//! under a prefix of its own, so that its pods go to namespaces of this test's alone; its
//! policies selecting the pods labelled for it, and bound with `Deny` whatever the mode,
//! so that an evaluation error shows as the denial's message), and pods built to be the
//! worst a cluster would realistically send are created with `dryRun=All` as the
//! requesters (impersonated): 64 containers and 16 init containers (half of them
//! sidecars) with 63-character names, each lacking every required request, or requesting
//! them all, or all but eight; a 253-character pod name; 64 annotations and 64 long labels;
//! a 512-character user name full of characters the messages escape (but no control
//! character: no HTTP header carries one), with 100 groups; the requests placed in each
//! profile's namespaces and labels so that every policy is judged in scope. A runtime cost
//! over the apiserver's limits (one expression's, or a policy's whole budget, which its
//! messages share) is the denial's message, as
//! `a_policy_over_the_cost_limit_is_told_apart` shows; every policy must have refused a
//! pod with its own message (the apiserver drops a failed or over-5-KiB one for the
//! policy's `message`).
//!
//! Not held any more: the environment of the oldest apiserver the export is documented
//! for (1.30; a 1.36 apiserver emulates no older than 1.33), and the types cel-go infers
//! for the variables (only the status controller reports on those).

use crate::common;
use crate::common::admission::{self, Answer};

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{json, Value};

use tollgate_core::{
    validating_admission_policy, ExportOptions, OptOutRules, Policy, ProfileMatch, EXPORT_NAME,
    FALLBACK_MESSAGE,
};

/// The export, as text.
fn export(policy: Option<&Path>) -> String {
    String::from_utf8(common::bin::export(policy)).unwrap()
}

/// Every policy file in the repository, by what it says it is: YAML with a top-level
/// `validation:`, `profiles:` or `optOut:`.
fn policy_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    walk(&p, out);
                }
            } else if name.ends_with(".yaml") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                if text.lines().any(|l| {
                    l.starts_with("validation:")
                        || l.starts_with("profiles:")
                        || l.starts_with("optOut:")
                }) {
                    out.push(p);
                }
            }
        }
    }
    let root = common::root();
    let mut out = vec![];
    // (fuzz/seeds/ holds fuzzer inputs, some of them policies of a past format.)
    for dir in ["policies", "deploy", "tests", "benches"] {
        walk(&root.join(dir), &mut out);
    }
    out.sort();
    out
}

/// What was exported, the policy if from a file, and the exported YAML.
type Export = (String, Option<PathBuf>, String);

/// Every export, made once for the tests.
fn exports() -> &'static [Export] {
    static EXPORTS: OnceLock<Vec<Export>> = OnceLock::new();
    EXPORTS.get_or_init(|| {
        let mut out = vec![("the built-in policy".to_owned(), None, export(None))];
        for p in policy_files() {
            let yaml = export(Some(&p));
            let name = p
                .strip_prefix(common::root())
                .unwrap()
                .display()
                .to_string();
            out.push((name, Some(p), yaml));
        }
        out
    })
}

/// The exports that differ in what they export (many golden cases share a policy): the
/// first of each, and how many it stands for.
fn distinct_exports() -> Vec<(&'static Export, usize)> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out: Vec<(&Export, usize)> = vec![];
    for e in exports() {
        // Past the header, which names the source.
        let body: String = e.2.lines().skip_while(|l| l.starts_with('#')).collect();
        match seen.get(&body) {
            Some(&i) => out[i].1 += 1,
            None => {
                seen.insert(body, out.len());
                out.push((e, 1));
            }
        }
    }
    out
}

/// The policy and binding documents of an export, in pairs.
fn pairs(yaml: &str) -> Vec<(Value, Value)> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("the export parses");
    assert!(!docs.is_empty() && docs.len().is_multiple_of(2), "{yaml}");
    docs.chunks(2)
        .map(|d| {
            assert_eq!(d[0]["kind"], "ValidatingAdmissionPolicy");
            assert_eq!(d[1]["kind"], "ValidatingAdmissionPolicyBinding");
            assert_eq!(d[1]["spec"]["policyName"], d[0]["metadata"]["name"]);
            (d[0].clone(), d[1].clone())
        })
        .collect()
}

/// The pair renamed `NAME.SUFFIX` (cluster-scoped names are shared by the suite's tests),
/// the binding naming the renamed policy; nothing else changed.
fn renamed(pair: &(Value, Value), suffix: &str) -> (Value, Value) {
    let (mut vap, mut binding) = pair.clone();
    let name = format!("{}.{suffix}", vap["metadata"]["name"].as_str().unwrap());
    vap["metadata"]["name"] = json!(name);
    binding["metadata"]["name"] = json!(name);
    binding["spec"]["policyName"] = json!(name);
    (vap, binding)
}

/// What the apiserver refuses of an export's objects, created with `dryRun=All`, one line
/// each.
async fn refusals(client: &kube::Client, yaml: &str, suffix: &str) -> Vec<String> {
    let mut out = vec![];
    for pair in pairs(yaml) {
        let name = pair.0["metadata"]["name"].as_str().unwrap().to_owned();
        let (vap, binding) = renamed(&pair, suffix);
        for (kind, object) in [
            ("ValidatingAdmissionPolicy", vap),
            ("ValidatingAdmissionPolicyBinding", binding),
        ] {
            if let Err(e) = admission::create(client, &object, true).await {
                out.push(format!("{kind} {name}: {e}"));
            }
        }
    }
    out
}

#[tokio::test]
async fn the_apiserver_takes_every_export() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let client = cp.client("admin").await;
    let exports = exports();
    assert!(exports.len() > 20, "{} policies", exports.len());
    for expected in [
        "policies/default.yaml",
        "deploy/overlays/two-teams/policy.yaml",
        "benches/ten-profiles.yaml",
        "tests/golden/profile-namespace-labels/policy.yaml",
    ] {
        assert!(
            exports.iter().any(|(n, _, _)| n == expected),
            "{expected} is checked"
        );
    }
    let mut policies = 0;
    let mut inputs: Vec<(String, String)> = vec![];
    for (name, _, yaml) in exports {
        policies += pairs(yaml).len();
        inputs.push((name.clone(), yaml.clone()));
    }
    // The overlay applies this file, not a fresh export (tests/deploy.rs holds it equal to
    // one).
    let overlay =
        common::root().join("deploy/overlays/native-validation/validating-admission-policy.yaml");
    inputs.push((
        "deploy/overlays/native-validation".into(),
        std::fs::read_to_string(overlay).unwrap(),
    ));
    let client = &client;
    let refused: Vec<String> = futures::stream::iter(inputs.iter().enumerate())
        .map(|(i, (name, yaml))| async move {
            refusals(client, yaml, &format!("takes-{i}"))
                .await
                .into_iter()
                .map(|r| format!("{name}: {r}"))
                .collect::<Vec<_>>()
        })
        .buffer_unordered(4)
        .concat()
        .await;
    assert!(
        refused.is_empty(),
        "the apiserver refused:\n{}",
        refused.join("\n")
    );
    assert!(
        policies > exports.len(),
        "profiles make policies of their own"
    );
}

/// What a 1.36 apiserver refused before the rename, it refuses still (the check can fail).
#[tokio::test]
async fn the_export_with_its_old_variable_name_is_refused() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let client = cp.client("admin").await;
    let yaml = export(None).replace("requestNamespace", "namespace");
    let refused = refusals(&client, &yaml, "old-name").await;
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert!(
        refused[0].starts_with("ValidatingAdmissionPolicy validate.tollgate.dev: 422: "),
        "{}",
        refused[0]
    );
    assert!(
        refused[0].contains(
            "spec.variables[1].name: Invalid value: \"namespace\": must be a valid CEL \
             identifier"
        ),
        "{}",
        refused[0]
    );
}

// ---------------------------------------------------------------------------------------
// The worst requests.

/// `prefix`, then `fill` up to `len` characters.
fn padded(prefix: &str, fill: char, len: usize) -> String {
    let have = prefix.chars().count();
    prefix.to_owned() + &fill.to_string().repeat(len.saturating_sub(have))
}

/// A name a glob matches, as long as `len` where the glob allows it.
fn matching(glob: &str, len: usize) -> String {
    matching_with(glob, len, "")
}

/// A name a glob matches, as long as `len` where the glob allows it, its first star
/// stretched with `token` first (so that the names of different scopes differ).
fn matching_with(glob: &str, len: usize, token: &str) -> String {
    let fixed = glob.chars().filter(|c| *c != '*').count();
    let mut out = String::new();
    let mut stretched = false;
    for c in glob.chars() {
        match c {
            '*' if !stretched => {
                let n = len.saturating_sub(fixed);
                if token.len() <= n {
                    out.push_str(&padded(token, 'x', n));
                } else {
                    out.extend(std::iter::repeat_n('x', n));
                }
                stretched = true;
            }
            '*' => {}
            '?' => out.push('x'),
            c => out.push(c),
        }
    }
    out
}

/// `labels` changed so that `selector` selects them.
fn satisfy(selector: &LabelSelector, labels: &mut BTreeMap<String, String>) {
    for (k, v) in selector.match_labels.iter().flatten() {
        labels.insert(k.clone(), v.clone());
    }
    for r in selector.match_expressions.iter().flatten() {
        let values = r.values.as_deref().unwrap_or_default();
        match r.operator.as_str() {
            "In" => {
                labels.insert(r.key.clone(), values[0].clone());
            }
            "Exists" => {
                labels.insert(r.key.clone(), "x".into());
            }
            _ => {
                labels.remove(&r.key);
            }
        }
    }
}

/// 64 labels, each as long as a label may be: a 63-character name under a prefix, and a
/// 63-character value.
fn many_labels(prefix: &str) -> BTreeMap<String, String> {
    (0..64)
        .map(|i| {
            (
                format!(
                    "{prefix}.example.com/{}",
                    padded(&format!("label-{i:02}-"), 'k', 63)
                ),
                padded(&format!("v{i:02}"), 'v', 63),
            )
        })
        .collect()
}

/// Where a scope's pods are: a namespace its match selects and labels its selectors
/// select (or, for the base, ones no profile's match names). Namespaces are the
/// apiserver's, shared by every scope of every export: a name is made the scope's own
/// (`token`) where the match leaves it free.
struct Place {
    namespace: String,
    namespace_labels: BTreeMap<String, String>,
    pod_labels: BTreeMap<String, String>,
}

fn place(m: Option<&ProfileMatch>, token: &str) -> Place {
    let mut p = Place {
        namespace: padded(&format!("worst-case-{token}-"), 'n', 63),
        namespace_labels: many_labels("ns"),
        pod_labels: many_labels("pod"),
    };
    if let Some(m) = m {
        if let Some(g) = m.namespaces.first() {
            p.namespace = matching_with(g.as_str(), 63, token);
        }
        if let Some(s) = &m.namespace_selector {
            satisfy(s, &mut p.namespace_labels);
        }
        if let Some(s) = &m.pod_selector {
            satisfy(s, &mut p.pod_labels);
        }
    }
    p
}

/// Who creates the pod: a person with a long name to escape and many groups, a person the
/// opt-out permits (its first user or group), and a controller. (The long name has no
/// control character but tabs: an HTTP header, which impersonation takes it in, cannot
/// carry one.)
fn requesters(o: &OptOutRules) -> Vec<(String, Vec<String>)> {
    let long_name = padded("user\"name\\with\ttabs\t\\\"", 'u', 512);
    let groups: Vec<String> = (0..100)
        .map(|i| padded(&format!("group-{i:03}-"), 'g', 63))
        .chain(["system:authenticated".to_owned()])
        .collect();
    let mut out = vec![(long_name.clone(), groups.clone())];
    let user = o
        .users
        .first()
        .map(|u| matching(u.as_str(), 64))
        .unwrap_or(long_name);
    let mut permitted_groups = groups.clone();
    if let Some(g) = o.groups.first() {
        permitted_groups.push(matching(g.as_str(), 63));
    }
    out.push((user, permitted_groups));
    if let Some(c) = o.controllers.first() {
        out.push((matching(c.as_str(), 63), vec![]));
    }
    out
}

fn container(i: usize, prefix: &str, required: &[String], requests_all: bool) -> Value {
    let mut requests: BTreeMap<String, String> = (0..8)
        .map(|j| (format!("example.com/device-{j}"), "1".to_owned()))
        .collect();
    if requests_all {
        for r in required {
            requests.insert(r.clone(), "1".into());
        }
    }
    json!({
        "name": padded(&format!("{prefix}-{i:02}-"), 'c', 63),
        "image": "registry.example.com/trainer:latest",
        "resources": {"requests": requests, "limits": requests},
    })
}

/// A pod's spec: 64 containers and 16 init containers, half of them sidecars, every one
/// lacking every required request, or requesting them all, or (`lacking`) all but that
/// many of the containers requesting them all.
fn spec(required: &[String], requests_all: bool, lacking: Option<usize>) -> Value {
    let containers: Vec<Value> = (0..64)
        .map(|i| {
            let all = lacking.map_or(requests_all, |n| i >= n);
            container(i, "trainer", required, all)
        })
        .collect();
    let init: Vec<Value> = (0..16)
        .map(|i| {
            let mut c = container(i, "init", required, requests_all || lacking.is_some());
            if i % 2 == 0 {
                c["restartPolicy"] = json!("Always");
            }
            c
        })
        .collect();
    json!({"containers": containers, "initContainers": init})
}

const POD_NAME_LENGTH: usize = 253;

/// The label that puts a pod before one export's policies alone.
const CASE_LABEL: &str = "export-apiserver.tollgate.dev/case";
/// The label of this test's namespaces, which its policies select.
const NAMESPACE_LABEL: &str = "export-apiserver.tollgate.dev/cost";

/// A pod with `spec` in `place`, asking to opt out (with a long approval to escape) or
/// not, labelled for the export `case`.
fn pod(place: &Place, o: &OptOutRules, spec: &Value, opt_out: bool, case: &str) -> Value {
    // (Looked up by key, never iterated, by the policies: their values cost the
    // apiserver's decoding, not the CEL, and are kept short.)
    let mut annotations: BTreeMap<String, String> = (0..64)
        .map(|i| {
            (
                padded(&format!("example.com/annotation-{i:02}-"), 'a', 63 + 12),
                padded("value ", 'v', 63),
            )
        })
        .collect();
    if opt_out {
        annotations.insert(o.annotation.clone(), " True ".into());
        annotations.insert(
            o.approval_annotation.clone(),
            padded("approver\"with\\quotes\n", 'p', 1024),
        );
    }
    let mut labels = place.pod_labels.clone();
    labels.insert(CASE_LABEL.into(), case.into());
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": padded("worst-case-pod-", 'p', POD_NAME_LENGTH),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    })
}

/// One pod to create: where, what, by whom, and for which scope's policy it was built.
struct Request {
    namespace: String,
    pod: Value,
    user: String,
    groups: Vec<String>,
    /// The policy whose scope the pod was placed in, and whether it must refuse it (it
    /// lacks requests and does not ask to opt out).
    scope: String,
    refused: bool,
}

/// The requests for the scope with this match and opt-out: each requester with each pod.
/// `specs`: every container lacking every request, every one requesting them all, and
/// eight lacking them.
fn worst_requests(
    scope: &str,
    place: &Place,
    o: &OptOutRules,
    specs: &(Value, Value, Value),
    case: &str,
) -> Vec<Request> {
    // (the pod, whether it must be refused, whether every requester sends it or only the
    // first, whose long name costs the most to quote)
    let pods = [
        // The longest message: every container named, and why the opt-out is refused.
        (pod(place, o, &specs.0, true, case), false, true),
        // Refused where the opt-out would have been honoured.
        (pod(place, o, &specs.0, false, case), true, false),
        // Every `all` over the requests runs to its end.
        (pod(place, o, &specs.1, false, case), false, false),
        // Messages short enough for the apiserver to use (it drops one over 5 KiB for the
        // policy's `message`, and so it does one whose expression failed to evaluate).
        (pod(place, o, &specs.2, false, case), true, false),
        (pod(place, o, &specs.2, true, case), false, false),
    ];
    let mut out = vec![];
    for (n, (user, groups)) in requesters(o).into_iter().enumerate() {
        for (pod, refused, _) in pods.iter().filter(|p| n == 0 || p.2) {
            out.push(Request {
                namespace: place.namespace.clone(),
                pod: pod.clone(),
                user: user.clone(),
                groups: groups.clone(),
                scope: scope.to_owned(),
                refused: *refused,
            });
        }
    }
    out
}

/// What of an answer is wrong: an evaluation error or a dropped message where a denial's
/// message should be, or a refusal by anything but a ValidatingAdmissionPolicy.
fn answer_problem(answer: &Answer) -> Option<String> {
    if answer.allowed() {
        return None;
    }
    let message = answer.message.as_deref().unwrap_or_default();
    let Some((_, said)) = admission::denial(message) else {
        return Some(format!("refused, not by a policy: {message}"));
    };
    // (The apiserver's words for a runtime cost over its limits, an expression that
    // failed, and a failed validation without a message.)
    for sign in [
        "cost limit",
        "cost budget",
        "resulted in error",
        "failed expression",
        "failed messageExpression",
        "Internal error",
        "no such key",
    ] {
        if said.contains(sign) {
            return Some(format!("evaluation failed ({sign:?}): {said}"));
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_export_stays_within_the_apiservers_cost_limits() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let started = std::time::Instant::now();
    let client = cp.client("admin").await;
    let mut problems = vec![];
    // Each distinct export's policies, installed for its pods alone, and its requests.
    let mut objects = vec![];
    let mut requests = vec![];
    let mut namespaces: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut validating = BTreeSet::new();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut specs_of: BTreeMap<String, String> = BTreeMap::new();
    let mut tried = BTreeSet::new();
    let distinct = distinct_exports();
    for (i, ((name, path, _), _)) in distinct.iter().enumerate() {
        let case = format!("cost-{i}");
        // The policy with its namespace names and globs under a prefix of this export's
        // own: the namespaces its pods go to are then this test's alone (the suite's other
        // tests create namespaces named as the golden cases', some registering webhooks
        // for them), and no two exports share one.
        let policy = admission::policy_under(path.as_deref(), &format!("x{i}-"));
        let yaml = &validating_admission_policy(&policy, &export_options()).yaml;
        for pair in pairs(yaml) {
            let (mut vap, mut binding) = renamed(&pair, &case);
            // This test's namespaces and this export's pods only; Deny whatever the mode.
            let constraints = &mut vap["spec"]["matchConstraints"];
            constraints["namespaceSelector"] = json!({"matchLabels": {NAMESPACE_LABEL: "yes"}});
            constraints["objectSelector"] = json!({"matchLabels": {CASE_LABEL: case}});
            binding["spec"]["validationActions"] = json!(["Deny"]);
            let vap_name = vap["metadata"]["name"].as_str().unwrap().to_owned();
            if vap["spec"]["validations"][0]["messageExpression"].is_string() {
                validating.insert(vap_name.clone());
            }
            specs_of.insert(
                vap_name.clone(),
                vap["spec"]["validations"].to_string()
                    + &vap["spec"]["variables"].to_string()
                    + &vap["spec"]["auditAnnotations"].to_string(),
            );
            names.insert(vap_name, name.clone());
            objects.push(vap);
            objects.push(binding);
        }
        // Every resource any scope requires, so that "requests them all" holds in each.
        let mut required: Vec<String> = policy.validation.required_requests.clone();
        for p in &policy.profiles {
            if let Some(r) = p.policy() {
                required.extend(r.validation.required_requests.iter().cloned());
            }
        }
        // The base scope's requests, and each profile's placed where it applies.
        let specs = (
            spec(&required, false, None),
            spec(&required, true, None),
            spec(&required, false, Some(8)),
        );
        let mut scopes = vec![(
            format!("{}.{case}", EXPORT_NAME),
            place(None, &format!("c{i}s0")),
            &policy.opt_out,
        )];
        for (j, p) in policy.profiles.iter().enumerate() {
            // (A profile without a policy of its own exports none: scope::scopes.)
            let Some(r) = p.policy() else { continue };
            let o = &r.opt_out;
            scopes.push((
                format!("{}.{}.{case}", p.name, EXPORT_NAME),
                place(Some(&p.matches), &format!("c{i}s{}", j + 1)),
                o,
            ));
        }
        for (scope, place, o) in &scopes {
            // A scope exported alike by another policy (with the same requests to ask
            // for) is tried once.
            if !tried.insert((specs_of[scope].clone(), required.clone())) {
                validating.remove(scope);
                continue;
            }
            let labels = namespaces.entry(place.namespace.clone()).or_default();
            for (k, v) in &place.namespace_labels {
                if let Some(old) = labels.insert(k.clone(), v.clone()) {
                    assert_eq!(
                        &old, v,
                        "two scopes need namespace {} labelled {k} differently",
                        place.namespace
                    );
                }
            }
            requests.extend(worst_requests(scope, place, o, &specs, &case));
        }
    }

    // The namespaces (some named by the policies, so shared by exports), then the
    // policies, then the wait until the apiserver enforces them.
    let admin = &client;
    futures::stream::iter(namespaces.iter())
        .for_each_concurrent(8, |(ns, labels)| async move {
            let mut labels = labels.clone();
            labels.insert(NAMESPACE_LABEL.into(), "yes".into());
            ensure_namespace(admin, ns, &labels).await;
            admission::let_anyone_create_pods(admin, ns).await;
        })
        .await;
    let created: Vec<Result<Value, String>> = futures::stream::iter(objects.iter())
        .map(|o| admission::create(admin, o, false))
        .buffered(8)
        .collect()
        .await;
    for (o, c) in objects.iter().zip(&created) {
        if let Err(e) = c {
            problems.push(format!(
                "{}: {} {}: {e}",
                names
                    .get(o["metadata"]["name"].as_str().unwrap())
                    .map_or("?", |s| s),
                o["kind"],
                o["metadata"]["name"]
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let sentinel_ns = namespaces.keys().next().unwrap().clone();
    let waited = admission::await_enforcement(admin, &sentinel_ns, "export-cost").await;
    // The status controller's type check, where it ran (not in envtest): no warning.
    for o in objects
        .iter()
        .filter(|o| o["kind"] == "ValidatingAdmissionPolicy")
    {
        let name = o["metadata"]["name"].as_str().unwrap();
        let read = admission::get(admin, "ValidatingAdmissionPolicy", name).await;
        let warnings = &read["status"]["typeChecking"]["expressionWarnings"];
        if warnings.as_array().is_some_and(|w| !w.is_empty()) {
            problems.push(format!(
                "{}: {name}: type checking: {warnings}",
                names[name]
            ));
        }
    }

    let installed = started.elapsed();
    let answers: Vec<Answer> = futures::stream::iter(requests.iter())
        .map(|r| {
            assert!(admission::sendable(&r.user), "{:?}", r.user);
            admission::dry_run_pod(admin, &r.namespace, &r.pod, Some((&r.user, &r.groups)))
        })
        .buffered(4)
        .collect()
        .await;
    admission::delete_all(admin, &objects).await;
    let mut refused_by: BTreeMap<String, usize> = BTreeMap::new();
    let mut own_message: BTreeSet<String> = BTreeSet::new();
    let mut longest: BTreeMap<String, usize> = BTreeMap::new();
    for (r, a) in requests.iter().zip(&answers) {
        let export = &names[&r.scope];
        if let Some(p) = answer_problem(a) {
            problems.push(format!("{export}: {}: {p}", r.scope));
            continue;
        }
        if let Some((by, said)) = a.message.as_deref().and_then(admission::denial) {
            if by == r.scope {
                if said != FALLBACK_MESSAGE {
                    own_message.insert(by.clone());
                }
                *refused_by.entry(by).or_default() += 1;
            }
            let l = longest.entry(export.clone()).or_default();
            *l = (*l).max(said.len());
        } else if r.refused && validating.contains(&r.scope) {
            problems.push(format!(
                "{export}: {}: a pod lacking requests was allowed: {a:?}",
                r.scope
            ));
        }
    }
    for scope in &validating {
        if !refused_by.contains_key(scope) {
            problems.push(format!(
                "{}: {scope}: no request in its scope was refused by it: its worst case is \
                 untested",
                names[scope]
            ));
        } else if !own_message.contains(scope) {
            problems.push(format!(
                "{}: {scope}: it never refused with its own message: its message's cost is \
                 untested",
                names[scope]
            ));
        }
    }
    for (export, bytes) in &longest {
        eprintln!("{export}: longest message {bytes} bytes");
    }
    eprintln!(
        "export cost: {} distinct exports ({} policies), {} worst-case pods, in {:.1?} \
         (installed and enforced after {installed:.1?}, of which waiting {waited:.1?})",
        distinct.len(),
        objects.len() / 2,
        requests.len(),
        started.elapsed()
    );
    assert!(problems.is_empty(), "{}", shortened(&problems));
}

/// The problems, each cut to a readable length (the requests' names are long).
fn shortened(problems: &[String]) -> String {
    problems
        .iter()
        .map(|p| match p.char_indices().nth(1200) {
            Some((i, _)) => format!("{}...", &p[..i]),
            None => p.clone(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The export's options as `tollgate export` has them by default.
fn export_options() -> ExportOptions {
    ExportOptions {
        namespace_selector: tollgate::register::validating_namespace_selector("tollgate-system")
            .unwrap(),
        source: "test".into(),
        ..Default::default()
    }
}

/// The namespace, with these labels among its own: created, or, where a policy names it
/// and another test made it first, labelled.
async fn ensure_namespace(client: &kube::Client, name: &str, labels: &BTreeMap<String, String>) {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let api = Api::<Namespace>::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let patch = json!({"metadata": {"labels": labels}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap_or_else(|e| panic!("labelling namespace {name}: {e}"));
        }
        Err(e) => panic!("creating namespace {name}: {e}"),
    }
}

/// The check can fail: a policy that spends more than the apiserver lets one expression
/// spend, on a pod of the worst cases, is refused with the words the check looks for.
#[tokio::test]
async fn a_policy_over_the_cost_limit_is_told_apart() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let client = cp.client("admin").await;
    let ns = cp
        .namespace("export-costly", &[(NAMESPACE_LABEL, "costly")])
        .await;
    admission::let_anyone_create_pods(&client, &ns).await;
    let name = "costly.export-apiserver.tollgate.dev";
    // Three nested loops over 64 annotations: some 260,000 steps, over the limit of one
    // expression's run (1,000,000 cost units) several times.
    let expression = "object.metadata.annotations.all(k, object.metadata.annotations.all(j, \
                      object.metadata.annotations.all(l, k != j || j != l || l != '')))";
    let vap = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["pods"]}],
                "namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: "costly"}},
            },
            "validations": [{"expression": expression, "message": "costly"}],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    });
    let objects = [vap, binding];
    for o in &objects {
        admission::create(&client, o, false).await.unwrap();
    }
    admission::await_enforcement(&client, &ns, "export-costly").await;
    let policy = Policy::builtin();
    let place = place(None, "costly");
    let spec = spec(&policy.validation.required_requests, true, None);
    let pod = pod(&place, &policy.opt_out, &spec, false, "costly");
    let answer = admission::dry_run_pod(&client, &ns, &pod, None).await;
    admission::delete_all(&client, &objects).await;
    let problem = answer_problem(&answer);
    assert!(
        problem.as_deref().is_some_and(|p| p.contains("cost")),
        "{problem:?}: {answer:?}"
    );
}

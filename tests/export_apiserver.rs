//! Every exported ValidatingAdmissionPolicy passes what a kube-apiserver checks when the
//! policy and its binding are created, and stays within what it lets one evaluation spend.
//!
//! tests/export_kubectl.rs holds the export to the OpenAPI schema, as `kubectl
//! --validate=strict` does; a real apiserver also compiles and type-checks every CEL
//! expression in the admission environment, and refused an export whose variable was
//! named `namespace` (a reserved word). crates/vap-check is that stand-in: the
//! validation of `pkg/apis/admissionregistration/validation/validation.go`, a port of
//! cel-go's type checker with the Kubernetes environment's declarations and functions, and
//! a runtime cost count after cel-go's cost model. Its own tests
//! (crates/vap-check/tests/rules.rs) show it refusing what it claims to refuse.
//!
//! The exports checked: the built-in policy (a copy of policies/default.yaml), every
//! policy file of the repository (policies/, deploy/ (the two-teams overlay's among them),
//! every `policy.yaml` under tests/, the benches' ten profiles), and the
//! committed native-validation overlay itself. Each is checked against the environment of
//! a 1.36 apiserver and of the oldest one the export is documented for (1.30, whose new
//! expressions are compiled in its 1.29 compatibility environment).
//!
//! The cost count runs each policy, and each profile's, on requests built to be the worst
//! a cluster would realistically send: 64 containers and 16 init containers (half of them
//! sidecars) with 63-character names, each lacking every required request or requesting
//! them all; a 253-character pod name; 64 long annotations and labels; a 512-character
//! user name full of characters the messages escape, with 100 groups; the requests
//! placed in each profile's namespaces and labels so that every policy is judged in scope.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{json, Value};
use tollgate_core::export;
use tollgate_core::policy::{OptOut, Policy, ProfileMatch};

use tollgate_vap_check as vap_check;
use vap_check::{Evaluable, Input, Library, Val};

/// The apiserver whose checks are the bar (the issue's), and the oldest the export claims
/// (src/cli/export.rs: "Kubernetes 1.30+"; a 1.30 apiserver compiles new expressions in
/// its compatibility version, 1.29).
const MINORS: [u32; 2] = [36, 29];

fn export(policy: Option<&Path>) -> String {
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
    String::from_utf8(out.stdout).unwrap()
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

/// (what, the policy if from a file, the exported YAML): made once for both tests.
fn exports() -> &'static [(String, Option<PathBuf>, String)] {
    static EXPORTS: OnceLock<Vec<(String, Option<PathBuf>, String)>> = OnceLock::new();
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

/// The policy and binding documents of an export, in pairs.
fn pairs(yaml: &str) -> Vec<(Value, Value)> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("the export parses");
    assert!(!docs.is_empty() && docs.len().is_multiple_of(2), "{yaml}");
    docs.chunks(2)
        .map(|d| {
            assert_eq!(d[0]["kind"], "ValidatingAdmissionPolicy");
            assert_eq!(d[1]["kind"], "ValidatingAdmissionPolicyBinding");
            (d[0].clone(), d[1].clone())
        })
        .collect()
}

/// What the apiserver would refuse in an export, one line each.
fn refusals(yaml: &str) -> Vec<String> {
    let mut out = vec![];
    for (policy, binding) in pairs(yaml) {
        let name = policy["metadata"]["name"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        for minor in MINORS {
            let check = vap_check::check_policy(&policy, &Library::kubernetes(minor));
            for e in check.errors {
                out.push(format!("1.{minor} ValidatingAdmissionPolicy {name}: {e}"));
            }
        }
        for e in vap_check::check_binding(&binding) {
            out.push(format!("ValidatingAdmissionPolicyBinding {name}: {e}"));
        }
    }
    out
}

#[test]
fn the_apiserver_takes_every_export() {
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
    let mut refused = vec![];
    let mut policies = 0;
    for (name, _, yaml) in exports {
        policies += pairs(yaml).len();
        for r in refusals(yaml) {
            refused.push(format!("{name}: {r}"));
        }
    }
    // The overlay applies this file, not a fresh export (tests/deploy.rs holds it equal to
    // one).
    let overlay =
        common::root().join("deploy/overlays/native-validation/validating-admission-policy.yaml");
    for r in refusals(&std::fs::read_to_string(overlay).unwrap()) {
        refused.push(format!("deploy/overlays/native-validation: {r}"));
    }
    assert!(
        refused.is_empty(),
        "the apiserver would refuse:\n{}",
        refused.join("\n")
    );
    assert!(
        policies > exports.len(),
        "profiles make policies of their own"
    );
}

/// The checker did check the shipped export, not wave it through: each variable has the
/// type cel-go infers for it (`approvedBy` is dyn: `cond ? object... : ''` unifies dyn and
/// string as the more general dyn; filtering the dyn container lists gives list(dyn)).
#[test]
fn the_shipped_exports_variables_have_the_types_cel_go_gives_them() {
    let (policy, _) = &pairs(&export(None))[0];
    let check = vap_check::check_policy(policy, &Library::kubernetes(36));
    assert!(check.errors.is_empty(), "{:?}", check.errors);
    let types: Vec<String> = check
        .variables
        .iter()
        .map(|(n, t)| format!("{n}: {t}"))
        .collect();
    assert_eq!(
        types,
        [
            "optOutAsked: bool",
            "requestNamespace: string",
            "user: string",
            "userQuoted: string",
            "optOutNamespace: bool",
            "controller: bool",
            "approvedBy: dyn",
            "optOutPermitted: bool",
            "optOutHonoured: bool",
            "needed: list(string)",
            "initMissing: list(dyn)",
            "regularMissing: list(dyn)",
            "ok: bool",
        ]
    );
}

/// What a 1.36 apiserver refused before the rename, the checker refuses in its words.
#[test]
fn the_export_with_its_old_variable_name_is_refused() {
    let yaml = export(None).replace("requestNamespace", "namespace");
    assert_eq!(
        refusals(&yaml),
        [
            "1.36 ValidatingAdmissionPolicy validate.tollgate.dev: spec.variables[1].name: \
             Invalid value: \"namespace\": name is not a valid CEL identifier",
            "1.29 ValidatingAdmissionPolicy validate.tollgate.dev: spec.variables[1].name: \
             Invalid value: \"namespace\": name is not a valid CEL identifier",
        ]
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
    let fixed = glob.chars().filter(|c| *c != '*').count();
    let mut out = String::new();
    let mut stretched = false;
    for c in glob.chars() {
        match c {
            '*' if !stretched => {
                out.extend(std::iter::repeat_n('x', len.saturating_sub(fixed)));
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

fn many_labels(prefix: &str) -> BTreeMap<String, String> {
    (0..64)
        .map(|i| {
            (
                padded(&format!("{prefix}.example.com/label-{i:02}-"), 'k', 63 + 20),
                padded(&format!("v{i:02}"), 'v', 63),
            )
        })
        .collect()
}

/// Where a scope's pods are: a namespace its match selects and labels its selectors
/// select (or, for the base, ones no profile's match names).
struct Place {
    namespace: String,
    namespace_labels: BTreeMap<String, String>,
    pod_labels: BTreeMap<String, String>,
}

fn place(m: Option<&ProfileMatch>) -> Place {
    let mut p = Place {
        namespace: padded("worst-case-", 'n', 63),
        namespace_labels: many_labels("ns"),
        pod_labels: many_labels("pod"),
    };
    if let Some(m) = m {
        if let Some(g) = m.namespaces.first() {
            p.namespace = matching(g.as_str(), 63);
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
/// opt-out permits (its first user or group), and a controller.
fn requesters(o: &OptOut) -> Vec<(String, Vec<String>)> {
    let long_name = padded("user\"name\\with\ttabs\u{1}", 'u', 512);
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
/// lacking every required request, or requesting them all.
fn spec(required: &[String], requests_all: bool) -> Val {
    let containers: Vec<Value> = (0..64)
        .map(|i| container(i, "trainer", required, requests_all))
        .collect();
    let init: Vec<Value> = (0..16)
        .map(|i| {
            let mut c = container(i, "init", required, requests_all);
            if i % 2 == 0 {
                c["restartPolicy"] = json!("Always");
            }
            c
        })
        .collect();
    Val::from_json(&json!({"containers": containers, "initContainers": init}))
}

const POD_NAME_LENGTH: usize = 253;

/// A pod with `spec` in `place`, asking to opt out (with a long approval to escape) or
/// not. Built as a value around the shared spec: the specs are the bulk of it.
fn pod(place: &Place, o: &OptOut, spec: &Val, opt_out: bool) -> Val {
    let mut annotations: BTreeMap<String, String> = (0..64)
        .map(|i| {
            (
                padded(&format!("example.com/annotation-{i:02}-"), 'a', 63 + 12),
                padded("value ", 'v', 1024),
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
    let metadata = json!({
        "name": padded("worst-case-pod-", 'p', POD_NAME_LENGTH),
        "namespace": place.namespace,
        "labels": place.pod_labels,
        "annotations": annotations,
    });
    let Val::Map(pod) = Val::from_json(&json!({"apiVersion": "v1", "kind": "Pod"})) else {
        unreachable!("an object")
    };
    let mut pod = (*pod).clone();
    pod.insert("metadata".into(), Val::from_json(&metadata));
    pod.insert("spec".into(), spec.clone());
    Val::Map(pod.into())
}

fn input(place: &Place, object: &Val, user: &str, groups: &[String]) -> Input {
    let mut input = Input::new(
        &Value::Null,
        &json!({
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": padded("worst-case-pod-", 'p', POD_NAME_LENGTH),
            "namespace": place.namespace,
            "operation": "CREATE",
            "userInfo": {
                "username": user,
                "uid": "00000000-0000-0000-0000-000000000000",
                "groups": groups,
                "extra": {"authentication.kubernetes.io/credential-id": ["X509SHA256=00"]},
            },
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        }),
        &json!({
            "metadata": {"name": place.namespace, "labels": place.namespace_labels},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }),
    );
    input.object = object.clone();
    input
}

/// The requests for the scope with this match and opt-out: each requester with each pod.
/// `specs`: every container lacking every request, and every one requesting them all.
fn worst_requests(m: Option<&ProfileMatch>, o: &OptOut, specs: &(Val, Val)) -> Vec<Input> {
    let place = place(m);
    let pods = [
        // The longest message: every container named, and why the opt-out is refused.
        pod(&place, o, &specs.0, true),
        // Refused where the opt-out would have been honoured.
        pod(&place, o, &specs.0, false),
        // Every `all` over the requests runs to its end.
        pod(&place, o, &specs.1, false),
    ];
    let mut out = vec![];
    for (user, groups) in requesters(o) {
        for object in &pods {
            out.push(input(&place, object, &user, &groups));
        }
    }
    out
}

#[test]
fn every_export_stays_within_the_apiservers_cost_limits() {
    let lib = Library::kubernetes(36);
    let mut problems = vec![];
    for (name, path, yaml) in exports() {
        let policy = match path {
            Some(p) => common::load_policy(p),
            None => Policy::builtin(),
        };
        // Every resource any scope requires, so that "requests them all" holds in each.
        let mut required: Vec<String> = policy.validation.required_requests.clone();
        for p in &policy.profiles {
            if let Some(r) = p.policy() {
                required.extend(r.validation.required_requests.iter().cloned());
            }
        }
        // The base scope's requests, and each profile's placed where it applies, by the
        // name of the policy the export makes for the scope.
        let specs = (spec(&required, false), spec(&required, true));
        let base = worst_requests(None, &policy.opt_out, &specs);
        let mut scopes = BTreeMap::new();
        for p in &policy.profiles {
            let o = p.policy().map_or(&policy.opt_out, |r| &r.opt_out);
            let requests = worst_requests(Some(&p.matches), o, &specs);
            scopes.insert(format!("{}.{}", p.name, export::NAME), requests);
        }
        let mut summary = (0, String::new(), 0, 0, 0, 0);
        for (vap, _) in pairs(yaml) {
            let vap_name = vap["metadata"]["name"].as_str().unwrap().to_owned();
            let evaluable = Evaluable::new(&vap).unwrap();
            // This scope's requests; for a profile's, one of the base's too (out of scope).
            let (own, others) = match scopes.get(&vap_name) {
                Some(own) => (own, &base[..1]),
                None => (&base, &[][..]),
            };
            let mut in_scope = false;
            let mut refused_with_message = false;
            for input in own.iter().chain(others) {
                let run = evaluable
                    .run(&lib, input)
                    .unwrap_or_else(|e| panic!("{name}: {vap_name}: {e}"));
                for v in vap_check::limit_violations(&run) {
                    problems.push(format!("{name}: {vap_name}: {v}"));
                }
                for e in &run.errors {
                    problems.push(format!("{name}: {vap_name}: evaluation error: {e}"));
                }
                in_scope |= !matches!(run.variables.get("inScope"), Some(Val::Bool(false)));
                refused_with_message |= !run.allowed && run.message_bytes.iter().any(|b| *b > 0);
                for bytes in &run.message_bytes {
                    let fallback = vap["spec"]["validations"][0]["message"]
                        .as_str()
                        .unwrap_or_default();
                    if *bytes > vap_check::MAX_EVALUATED_MESSAGE_BYTES && fallback.trim().is_empty()
                    {
                        problems.push(format!(
                            "{name}: {vap_name}: a {bytes}-byte message is dropped and there \
                             is no `message` to fall back on"
                        ));
                    }
                }
                let (worst, worst_path) = run
                    .costs
                    .iter()
                    .map(|(p, c)| (*c, p.clone()))
                    .max()
                    .unwrap_or_default();
                if worst > summary.0 {
                    summary.0 = worst;
                    summary.1 = format!("{vap_name} {worst_path}");
                }
                summary.2 = summary.2.max(run.validations);
                summary.3 = summary.3.max(run.messages);
                summary.4 = summary.4.max(run.audit);
                summary.5 = summary
                    .5
                    .max(run.message_bytes.iter().copied().max().unwrap_or(0));
            }
            if !in_scope {
                problems.push(format!(
                    "{name}: {vap_name}: no request was in its scope: its worst case is untested"
                ));
            }
            let validates = vap["spec"]["validations"][0]["messageExpression"].is_string();
            if validates && !refused_with_message {
                problems.push(format!(
                    "{name}: {vap_name}: no request was refused: its message's cost is untested"
                ));
            }
        }
        eprintln!(
            "{name}: largest expression cost {} ({}); filters: validations {}, messages {}, \
             audit {}; longest message {} bytes",
            summary.0, summary.1, summary.2, summary.3, summary.4, summary.5
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

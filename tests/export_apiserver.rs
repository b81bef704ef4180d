//! Every exported ValidatingAdmissionPolicy passes what a kube-apiserver checks when the
//! policy and its binding are created.
//!
//! tests/export_kubectl.rs holds the export to the OpenAPI schema, as `kubectl
//! --validate=strict` does; a real apiserver also compiles and type-checks every CEL
//! expression in the admission environment, and refused an export whose variable was
//! named `namespace` (a reserved word). tests/support/vap_check.rs is that stand-in: the
//! validation of `pkg/apis/admissionregistration/validation/validation.go` and a port of
//! cel-go's type checker with the Kubernetes environment's declarations and functions. Its
//! own unit tests show it refusing what it claims to refuse.
//!
//! The exports checked: the built-in policy (a copy of policies/default.yaml), every
//! policy file of the repository (policies/, deploy/ (the two-teams overlay's among them),
//! every `policy.yaml` under tests/, the benches' ten profiles), and the
//! committed native-validation overlay itself. Each is checked against the environment of
//! a 1.36 apiserver and of the oldest one the export is documented for (1.30, whose new
//! expressions are compiled in its 1.29 compatibility environment).

mod common;
#[path = "support/vap_check.rs"]
mod vap_check;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use vap_check::Library;

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

/// (what, the policy if from a file, the exported YAML): made once for the tests.
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

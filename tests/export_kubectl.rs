//! `tollgate export validating-admission-policy | kubectl apply --dry-run=server
//! --validate=strict -f -` is accepted by the real kube-apiserver (tests/common/envtest.rs),
//! for the shipped policy and every policy under `tests/`, and what the schema does not
//! allow is refused.
//!
//! `--validate=strict` asks the apiserver for strict field validation (an unknown or
//! duplicated field is an error, not a warning), and a server-side dry run runs all of
//! create but the write: decoding against the real schema, defaulting and the
//! ValidatingAdmissionPolicy's own validation. (tests/export_apiserver.rs holds the CEL to
//! what the apiserver compiles.) Without an apiserver or kubectl the tests print SKIPPED
//! and pass.

use crate::common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// `kubectl apply --dry-run=server --validate=strict -f -` on `yaml`, as the admin; None
/// (with a SKIPPED line) without an apiserver or kubectl.
fn dry_run(cp: &common::envtest::ControlPlane, yaml: &[u8]) -> Option<std::process::Output> {
    let mut child = cp
        .kubectl("admin")?
        .args(["apply", "--dry-run=server", "--validate=strict", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(yaml).unwrap();
    Some(child.wait_with_output().unwrap())
}

use common::bin::export;

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
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let mut inputs: Vec<(String, Option<PathBuf>)> = vec![("the shipped policy".into(), None)];
    for p in policies_under_tests() {
        inputs.push((p.display().to_string(), Some(p)));
    }
    assert!(inputs.len() > 10, "{} policies", inputs.len());
    // Side by side: each is one kubectl, mostly waiting on the apiserver.
    let outputs: Vec<Option<std::process::Output>> = std::thread::scope(|s| {
        let handles: Vec<_> = inputs
            .chunks(inputs.len().div_ceil(4))
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|(_, path)| dry_run(cp, &export(path.as_deref())))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    for ((name, _), out) in inputs.iter().zip(outputs) {
        let Some(out) = out else { return };
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "kubectl refused the export of {name}:\n{}{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        for object in [
            "validatingadmissionpolicy.admissionregistration.k8s.io/validate.tollgate.dev",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/validate.tollgate.dev",
        ] {
            // Created, or (another test applied it for real) configured or unchanged.
            assert!(
                stdout
                    .lines()
                    .any(|l| l.starts_with(&format!("{object} "))
                        && l.ends_with(" (server dry run)")),
                "{name}: {stdout}"
            );
        }
        assert!(
            out.stderr.is_empty(),
            "{name}: kubectl warned: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The check can fail: the apiserver refuses what the schema does not allow.
#[test]
fn kubectl_refuses_what_the_schema_does_not_allow() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let good = String::from_utf8(export(None)).unwrap();
    for (bad, says) in [
        (
            good.replacen(
                "  failurePolicy: Fail",
                "  failurePolicy: Fail\n  failurPolicy: Fail",
                1,
            ),
            "unknown field \"spec.failurPolicy\"",
        ),
        (
            good.replacen(
                "validationActions:\n    - Deny",
                "validationActions: Deny",
                1,
            ),
            "cannot unmarshal string into Go struct field \
             ValidatingAdmissionPolicyBindingSpec.spec.validationActions",
        ),
        (
            good.replacen("    - key: opt-out", "    - kee: opt-out", 1),
            "unknown field \"spec.auditAnnotations[0].kee\"",
        ),
        (
            good.replacen(
                "    - key: opt-out\n      valueExpression",
                "    - valueExpression",
                1,
            ),
            // (The apiserver qualifies the key with the policy's name.)
            "spec.auditAnnotations[0].key: Invalid value: \"validate.tollgate.dev/\": name \
             part must be non-empty",
        ),
    ] {
        assert_ne!(bad, good);
        let Some(out) = dry_run(cp, bad.as_bytes()) else {
            return;
        };
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "kubectl took:\n{bad}");
        assert!(err.contains(says), "{err}");
    }
}

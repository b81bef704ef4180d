//! The README is part of the product: its set-up commands and CLI reference must stay true.

use crate::common;

fn readme() -> String {
    std::fs::read_to_string(common::root().join("README.md")).unwrap()
}

#[test]
fn opens_with_the_two_setup_commands() {
    let text = readme();
    let block: Vec<&str> = text
        .split("```sh\n")
        .nth(1)
        .expect("a sh block")
        .split("```")
        .next()
        .unwrap()
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .collect();
    assert_eq!(block, ["cargo run -- serve --dev", "cargo test"]);
    let ci = std::fs::read_to_string(common::root().join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l.trim() == "cargo test"),
        ".ci/run runs the README's test command"
    );
}

#[test]
fn cli_reference_names_every_flag_of_every_command() {
    let text = readme();
    for cmd in [
        "serve",
        "review",
        "audit",
        "certs",
        "register",
        "export validating-admission-policy",
        "policy",
    ] {
        assert!(
            text.contains(&format!("### `tollgate {cmd}")),
            "README documents {cmd}"
        );
        let out = common::bin::command()
            .args(cmd.split(' ').chain(["--help"]))
            .output()
            .unwrap();
        let help = String::from_utf8(out.stdout).unwrap();
        for word in help.split_whitespace() {
            let flag = word.trim_matches(|c: char| c == ',' || c == '[' || c == ']');
            if flag.starts_with("--") && flag.len() > 2 && flag != "--help" {
                let flag = flag.split(['=', '<']).next().unwrap();
                assert!(
                    text.contains(flag),
                    "README lacks {flag} of `tollgate {cmd}`"
                );
            }
        }
    }
}

#[test]
fn the_curl_example_posts_a_fixture_that_exists() {
    let text = readme();
    let path = text
        .split("--data @")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("a curl --data @FILE example");
    assert!(common::root().join(path).exists(), "{path}");
}

#[test]
fn serve_without_certificates_names_the_missing_flag() {
    let out = common::bin::command()
        .args(["serve", "--metrics-listen", "off"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--tls-cert") && err.contains("--dev"), "{err}");
}

/// The policy section's TollgatePolicy and TollgateProfile are in force together, and
/// `tollgate policy`'s example prints what the command prints for them.
#[test]
fn the_policy_objects_example_is_what_tollgate_policy_prints() {
    let text = readme();
    let objects = text
        .split("```yaml\napiVersion: tollgate.dev/v1alpha1\nkind: TollgatePolicy\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .map(|s| format!("apiVersion: tollgate.dev/v1alpha1\nkind: TollgatePolicy\n{s}"))
        .expect("the policy section's example objects");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("objects.yaml");
    std::fs::write(&path, &objects).unwrap();
    let example = text
        .split("$ tollgate policy -f objects.yaml --namespace team-a -o table | grep -v ' built-in$'\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the console example of tollgate policy");
    let out = common::bin::command()
        .args(["policy", "-f", path.to_str().unwrap()])
        .args(["--namespace", "team-a", "-o", "table"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: String = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.ends_with(" built-in"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(printed, example);
}

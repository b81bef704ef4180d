//! The README is part of the product: its set-up commands and CLI reference must stay true.

use crate::common;

use std::process::Command;

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
    ] {
        assert!(
            text.contains(&format!("### `tollgate {cmd}")),
            "README documents {cmd}"
        );
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
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
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--metrics-listen", "off"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--tls-cert") && err.contains("--dev"), "{err}");
}

//! The README and the guide are part of the product: the README's set-up commands, and the
//! command-line reference, the concepts' examples and the audit's JSON finding in docs/,
//! must stay true. (Links, the other references and the run blocks: tests/docs.rs.)

use crate::common;

fn readme() -> String {
    doc("README.md")
}

fn doc(path: &str) -> String {
    std::fs::read_to_string(common::root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// docs/reference/cli.md: the command-line reference, a `## ` section per command.
fn cli() -> String {
    doc("docs/reference/cli.md")
}

/// The section of the command-line reference for `tollgate CMD`, to the next command's.
fn cli_section(text: &str, cmd: &str) -> String {
    let start = text
        .find(&format!("\n## `tollgate {cmd}"))
        .unwrap_or_else(|| panic!("docs/reference/cli.md documents {cmd}"));
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    rest[..end].to_owned()
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

/// Each command's section names every flag of its `--help` (the mutating export shares the
/// validating one's options, as its section says).
#[test]
fn cli_reference_names_every_flag_of_every_command() {
    let text = cli();
    for cmd in [
        "serve",
        "review",
        "audit",
        "certs",
        "register",
        "export validating-admission-policy",
        "export mutating-admission-policy",
        "policy",
        "why",
        "completion",
    ] {
        let section = match cmd {
            "export mutating-admission-policy" => {
                let own = cli_section(&text, cmd);
                assert!(own.contains("Same options as `validating-admission-policy`"));
                own + &cli_section(&text, "export validating-admission-policy")
            }
            _ => cli_section(&text, cmd),
        };
        let out = common::bin::command()
            .args(cmd.split(' ').chain(["--help"]))
            .output()
            .unwrap();
        let help = String::from_utf8(out.stdout).unwrap();
        let mut flags = std::collections::BTreeSet::new();
        for word in help.split_whitespace() {
            let flag = word.trim_matches(|c: char| c == ',' || c == '[' || c == ']');
            if flag.starts_with("--") && flag.len() > 2 && flag != "--help" {
                let flag = flag.split(['=', '<']).next().unwrap();
                flags.insert(flag.to_owned());
                assert!(
                    section.contains(&format!("`{flag}")) || section.contains(&format!(" {flag}")),
                    "docs/reference/cli.md lacks {flag} in its section for `tollgate {cmd}`"
                );
            }
        }
        // And no option row names a flag the command no longer has.
        for row in section.lines().filter(|l| l.starts_with("| `-")) {
            let option = row.split(" | ").next().unwrap();
            for word in option.split(['`', ' ', ',', ';']) {
                if word.starts_with("--") {
                    assert!(
                        flags.contains(word),
                        "docs/reference/cli.md's `tollgate {cmd}` lists {word}, which its --help has not"
                    );
                }
            }
        }
    }
}

#[test]
fn the_curl_example_posts_a_fixture_that_exists() {
    let text = doc("docs/getting-started.md");
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

/// The concepts' TollgatePolicy and TollgateProfile are in force together, and the
/// command-line reference's example of `tollgate policy` prints what the command prints
/// for them.
#[test]
fn the_policy_objects_example_is_what_tollgate_policy_prints() {
    let objects = doc("docs/concepts.md")
        .split("```yaml\napiVersion: tollgate.dev/v1alpha1\nkind: TollgatePolicy\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .map(|s| format!("apiVersion: tollgate.dev/v1alpha1\nkind: TollgatePolicy\n{s}"))
        .expect("the policy section's example objects");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("objects.yaml");
    std::fs::write(&path, &objects).unwrap();
    let reference = cli();
    let example = reference
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

/// The command list at the top of the CLI reference names every command `tollgate --help`
/// lists, and each has its section.
#[test]
fn the_command_list_names_every_command() {
    let text = cli();
    let list = text
        .split("`tollgate <")
        .nth(1)
        .and_then(|s| s.split('>').next())
        .expect("the command list");
    let listed: Vec<&str> = list.split('|').collect();
    let out = common::bin::command().arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let commands: Vec<&str> = help
        .split("Commands:\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    let mut sorted = commands.clone();
    sorted.sort_unstable();
    let mut in_readme = listed.clone();
    in_readme.sort_unstable();
    assert_eq!(
        in_readme, sorted,
        "docs/reference/cli.md's list: {listed:?}"
    );
    for c in commands {
        assert!(
            text.contains(&format!("\n## `tollgate {c}")),
            "no section for {c}"
        );
    }
}

/// The concepts' refused Deployment is refused by `tollgate review` with the message the
/// page shows (up to its `...`).
#[test]
fn the_workload_refusal_example_is_what_review_says() {
    let text = doc("docs/concepts.md");
    let section = text
        .split("### Workloads (`POST /validate` and `POST /mutate`)")
        .nth(1)
        .expect("the workloads section");
    let manifest = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the example Deployment");
    let shown = section
        .split("```\nError from server (Forbidden): admission webhook \"validate.tollgate.dev\" denied the request:\n")
        .nth(1)
        .and_then(|s| s.split("...\n```").next())
        .expect("the example refusal");
    let out = common::bin::run(&["review", "-o", "json", "-"], Some(manifest.as_bytes()));
    assert_eq!(
        out.status.code(),
        Some(1),
        "refused as docs/concepts.md says"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let message = v[0]["message"].as_str().unwrap();
    assert!(
        message.starts_with(shown),
        "docs/concepts.md:\n{shown}\nreview:\n{message}"
    );
}

/// Every reason of `tollgate_denials_total` and every verdict of the review log is in
/// docs/operations.md, and every rule and category of the audit's JSON finding in the
/// command-line reference: a new one does not compile here until it is listed.
#[test]
fn every_metric_reason_verdict_and_audit_category_is_documented() {
    use tollgate_core::Rule;
    use tollgate_core::Verdict;
    let operations = std::fs::read_to_string(common::root().join("docs/operations.md")).unwrap();
    let row = |name: &str| {
        operations
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}`")))
            .unwrap_or_else(|| panic!("docs/operations.md has no row for {name}"))
            .to_owned()
    };
    let verdicts = [
        Verdict::Skipped,
        Verdict::Passed,
        Verdict::MissingRequests,
        Verdict::OptedOut,
        Verdict::ForgedApproval,
        Verdict::Infeasible,
    ];
    // Exhaustive: a new verdict is a compile error until the list above has it.
    match verdicts[0] {
        Verdict::Skipped
        | Verdict::Passed
        | Verdict::MissingRequests
        | Verdict::OptedOut
        | Verdict::ForgedApproval
        | Verdict::Infeasible => {}
    }
    let (denials, verdict_row) = (row("tollgate_denials_total"), row("verdict"));
    for v in verdicts {
        assert!(
            verdict_row.contains(&format!("`{}`", v.as_str())),
            "log verdict {}",
            v.as_str()
        );
    }
    // What denies: validation's verdicts that refuse, and a policy object.
    for reason in [
        Verdict::MissingRequests.as_str(),
        Verdict::ForgedApproval.as_str(),
        Verdict::Infeasible.as_str(),
        tollgate::metrics::POLICY_OBJECT_DENIED,
    ] {
        assert!(
            denials.contains(&format!("`{reason}`")),
            "denial reason {reason}"
        );
    }
    let text = cli();
    let table = text
        .split("### The JSON finding")
        .nth(1)
        .expect("the JSON finding's table");
    let line = |field: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("| `{field}`")))
            .unwrap_or_else(|| panic!("no row for {field}"))
            .to_owned()
    };
    let (rules, categories) = (line("rule"), line("category"));
    for r in Rule::ALL {
        assert!(
            rules.contains(&format!("`{}`", r.as_str())),
            "rule {}",
            r.as_str()
        );
        assert!(
            categories.contains(&format!("`{}`", r.category())),
            "category {}",
            r.category()
        );
    }
}

/// The README is a front page (issue 48): at most 250 lines, with the Helm install and
/// its kustomize alternative within the first 120, and the manual in docs/.
#[test]
fn the_readme_is_a_front_page() {
    let text = readme();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() <= 250, "README.md has {} lines", lines.len());
    for install in [
        "helm install tollgate deploy/helm/tollgate",
        "kubectl apply -k deploy/overlays/",
    ] {
        let at = lines
            .iter()
            .position(|l| l.contains(install))
            .unwrap_or_else(|| panic!("README.md has no `{install}`"));
        assert!(at < 120, "`{install}` is on line {}", at + 1);
    }
    assert!(text.contains("```mermaid\nflowchart"), "the picture");
    assert!(
        text.contains("(docs/README.md)"),
        "the link to the guide's index"
    );
}

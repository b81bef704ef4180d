//! The guide in `docs/` is part of the product, as the README is (tests/readme.rs): every
//! relative link resolves, to a file and to a heading by GitHub's anchor; every page is
//! reachable from the index; the policy reference names every field of the schema and the
//! annotations page every `tollgate.dev/` name the code uses; the README's before/after is
//! the golden's; and the command blocks of getting started and troubleshooting that are
//! marked to be run (docs/development.md, "The documentation") print what they show.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// README.md and every Markdown file under docs/, relative to the root.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut out = vec![common::root().join("README.md")];
    walk(&common::root().join("docs"), &mut out);
    out.sort();
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rel(path: &Path) -> String {
    path.strip_prefix(common::root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The lines of a page outside its fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// `line` without its inline code spans, so that a `[x](y)` shown as code is no link.
/// Each backtick opens or closes a span: the pages' code spans are single-backtick ones
/// (or quadruple, around a fence shown as code, which hold no link).
fn without_code(line: &str) -> String {
    line.split('`').step_by(2).collect()
}

/// The targets of the inline links `[text](target)` of a page's prose.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let line = without_code(line);
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchors of a page's headings: lowercased, every character but letters,
/// digits, `-`, `_` and spaces dropped, spaces as `-`; a repeated one gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// Where a relative link of `page` points: the file, and the anchor if any; None for a
/// link that leaves the repository (a URL).
fn resolve(page: &Path, target: &str) -> Option<(PathBuf, Option<String>)> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a.to_owned())),
        None => (target, None),
    };
    let path = if file.is_empty() {
        page.to_path_buf()
    } else {
        page.parent().unwrap().join(file)
    };
    Some((path, anchor))
}

#[test]
fn every_relative_link_resolves_to_a_file_and_a_heading() {
    let mut broken = Vec::new();
    for page in pages() {
        for target in links(&read(&page)) {
            let Some((path, anchor)) = resolve(&page, &target) else {
                continue;
            };
            let Ok(path) = path.canonicalize() else {
                broken.push(format!("{}: {target}: no such file", rel(&page)));
                continue;
            };
            if !path.starts_with(common::root()) {
                broken.push(format!("{}: {target}: outside the repository", rel(&page)));
                continue;
            }
            if let Some(anchor) = anchor {
                if path.extension().is_none_or(|x| x != "md") {
                    broken.push(format!("{}: {target}: an anchor into no page", rel(&page)));
                } else if !anchors(&read(&path)).contains(&anchor) {
                    broken.push(format!("{}: {target}: no heading #{anchor}", rel(&page)));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_anchor_rules_are_githubs() {
    let page = "# tollgate\n## `tollgate review [OPTIONS] [FILE|DIR|-]...`\n\
                ## Rollout: audit, warn, fix, enforce\n## Kueue and ResourceQuota\n\
                ```sh\n# not a heading\n```\n## Rollout: audit, warn, fix, enforce\n";
    let got = anchors(page);
    let want = [
        "tollgate",
        "tollgate-review-options-filedir-",
        "rollout-audit-warn-fix-enforce",
        "rollout-audit-warn-fix-enforce-1",
        "kueue-and-resourcequota",
    ];
    assert_eq!(got, want.iter().map(|s| s.to_string()).collect());
}

/// Every page under docs/ is reached from docs/README.md by following links between
/// pages (and is listed there: the index links each).
#[test]
fn every_page_is_reachable_from_the_index() {
    let index = common::root()
        .join("docs/README.md")
        .canonicalize()
        .unwrap();
    let listed: BTreeSet<PathBuf> = links(&read(&index))
        .iter()
        .filter_map(|t| resolve(&index, t))
        .filter_map(|(p, _)| p.canonicalize().ok())
        .collect();
    let mut reached = BTreeSet::from([index.clone()]);
    let mut todo = vec![index];
    while let Some(page) = todo.pop() {
        for target in links(&read(&page)) {
            let Some((path, _)) = resolve(&page, &target) else {
                continue;
            };
            let Ok(path) = path.canonicalize() else {
                continue;
            };
            if path.extension().is_some_and(|x| x == "md") && reached.insert(path.clone()) {
                todo.push(path);
            }
        }
    }
    for page in pages() {
        let page = page.canonicalize().unwrap();
        if !page.starts_with(common::root().join("docs")) {
            continue;
        }
        assert!(reached.contains(&page), "{} is not reachable", rel(&page));
        assert!(
            listed.contains(&page) || page.ends_with("docs/README.md"),
            "docs/README.md does not list {}",
            rel(&page)
        );
    }
}

/// The fields of a CRD's `spec` schema, as the policy reference writes them: `a.b`, `*` for
/// a map's key, `[]` for a list's items; not into the Kubernetes types a field takes as
/// they are (tolerations, the sidecar's Container, label selectors), nor into a cluster
/// profile's sections, which are the top level's again (checked apart).
fn schema_fields(schema: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(props) = schema["properties"].as_object() {
        for (k, v) in props {
            if path == "profiles[]" && k != "name" && k != "match" {
                continue;
            }
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            out.push(p.clone());
            let kubernetes_type = p == "mutation.metricsSidecar.container"
                || k == "tolerations"
                || k.ends_with("Selector");
            if !kubernetes_type {
                schema_fields(v, &p, out);
            }
        }
    }
    if schema["items"].is_object() {
        schema_fields(&schema["items"], &format!("{path}[]"), out);
    }
    if schema["additionalProperties"].is_object() {
        schema_fields(&schema["additionalProperties"], &format!("{path}.*"), out);
    }
}

fn crd_spec(file: &str) -> Value {
    let text = read(&common::root().join("deploy/base/crds").join(file));
    let crd: Value = serde_saphyr::from_str(&text).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
}

/// docs/reference/policy.md has a row for every field of the TollgatePolicy's schema (the
/// policy file's: one type), and none for a field the schema does not have; a cluster
/// profile holds the top level's sections, and a TollgateProfile a part of them.
#[test]
fn the_policy_reference_names_every_field_of_the_schema() {
    let policy = crd_spec("tollgatepolicies.tollgate.dev.yaml");
    let mut fields = Vec::new();
    schema_fields(&policy, "", &mut fields);
    let page = read(&common::root().join("docs/reference/policy.md"));
    let rows: BTreeSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect();
    let fields: BTreeSet<String> = fields.into_iter().collect();
    let missing: Vec<_> = fields.difference(&rows).collect();
    let stale: Vec<_> = rows.difference(&fields).collect();
    assert!(missing.is_empty(), "no row for {missing:?}");
    assert!(
        stale.is_empty(),
        "rows for no field of the schema: {stale:?}"
    );
    assert!(fields.len() > 80, "{fields:?}");

    let keys = |v: &Value| -> BTreeSet<String> {
        v["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    let top = keys(&policy);
    let mut in_profile = keys(&policy["properties"]["profiles"]["items"]);
    in_profile.remove("name");
    in_profile.remove("match");
    // A section's fields, wherever it stands (its descriptions and bounds may differ).
    let section = |v: &Value| {
        let mut out = Vec::new();
        schema_fields(v, "", &mut out);
        out
    };
    for s in &in_profile {
        assert!(
            top.contains(s),
            "profiles[].{s} is no section of the policy"
        );
        assert_eq!(
            section(&policy["properties"]["profiles"]["items"]["properties"][s]),
            section(&policy["properties"][s]),
            "profiles[].{s} is not the top level's {s}"
        );
        assert!(page.contains(&format!("`{s}`")), "{s}");
    }
    let profile = crd_spec("tollgateprofiles.tollgate.dev.yaml");
    for s in keys(&profile) {
        assert!(
            top.contains(&s),
            "TollgateProfile's {s} is no section of the policy"
        );
        assert_eq!(
            section(&profile["properties"][&s]),
            section(&policy["properties"][&s]),
            "TollgateProfile's {s}"
        );
        assert!(page.contains(&format!("`{s}`")), "TollgateProfile's {s}");
    }
}

/// Every `tollgate.dev/NAME` the code and the shipped files use (the API group's versions
/// aside) has its row in docs/reference/annotations.md.
#[test]
fn every_tollgate_annotation_is_documented() {
    fn scan(dir: &Path, names: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                scan(&p, names);
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&p) else {
                continue;
            };
            for (i, _) in text.match_indices("tollgate.dev/") {
                // A domain of its own (`validate.tollgate.dev/...`) is not tollgate.dev's.
                if text[..i].ends_with('.') {
                    continue;
                }
                let name: String = text[i + "tollgate.dev/".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
                    .collect();
                // A sentence's full stop, or kubectl's `label NS tollgate.dev/enforce-` (a
                // removal of the label).
                let name = name.trim_end_matches(['.', '-']);
                if !name.is_empty() && !name.starts_with("v1") {
                    names.insert(format!("tollgate.dev/{name}"));
                }
            }
        }
    }
    let mut names = BTreeSet::new();
    for dir in ["src", "crates/tollgate-core/src", "policies", "deploy"] {
        scan(&common::root().join(dir), &mut names);
    }
    let page = read(&common::root().join("docs/reference/annotations.md"));
    for name in &names {
        assert!(
            page.lines().any(|l| l.starts_with(&format!("| `{name}`"))),
            "docs/reference/annotations.md has no row for {name}"
        );
    }
    assert!(names.contains("tollgate.dev/opt-out"), "{names:?}");
}

/// The lines of an excerpt (`...` for lines left out) found in order in `lines`.
fn excerpt_of(excerpt: &[&str], lines: &[&str]) -> Result<(), String> {
    let mut at = 0;
    for want in excerpt.iter().filter(|l| l.trim() != "...") {
        match lines[at..].iter().position(|l| l == want) {
            Some(i) => at += i + 1,
            None => return Err(format!("{want:?} (after line {at})")),
        }
    }
    Ok(())
}

/// The README's before/after of a training pod is the golden's: the lines it keeps are the
/// fixture's pod in order, and with the added ones, the golden's mutated pod in order.
#[test]
fn the_readmes_before_and_after_is_the_goldens() {
    let text = read(&common::root().join("README.md"));
    let diff = text
        .split("```diff\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the README's before/after");
    let review: Value = serde_json::from_str(&read(
        &common::root().join("tests/fixtures/apiserver-v1.36/resnet50-master-0.mutate.json"),
    ))
    .unwrap();
    let before = serde_saphyr::to_string(&review["request"]["object"]).unwrap();
    let after =
        read(&common::root().join("tests/golden/fixture-resnet50-master-0.mutate/mutated.yaml"));
    let (mut kept, mut all) = (Vec::new(), Vec::new());
    for line in diff.lines() {
        let (mark, rest) = line.split_at(1);
        match mark {
            " " => {
                kept.push(rest);
                all.push(rest);
            }
            "+" => all.push(rest),
            _ => panic!("a line neither kept nor added: {line:?}"),
        }
    }
    let before: Vec<&str> = before.lines().collect();
    let after: Vec<&str> = after.lines().collect();
    excerpt_of(&kept, &before).unwrap_or_else(|e| panic!("not in the fixture's pod: {e}"));
    excerpt_of(&all, &after).unwrap_or_else(|e| panic!("not in the mutated pod: {e}"));
}

/// A page's blocks marked ```` ```yaml file=NAME ```` (written to NAME) and
/// ```` ```console run ```` (each `$ ` line run, its output below it).
enum Block {
    File(String, String),
    Run(Vec<(String, Vec<String>)>),
}

/// The text of a page's ```` ```yaml file=NAME ```` block, for a test that runs the file
/// against the real components (tests/node.rs runs getting started's Job on its node).
pub(crate) fn page_file(page: &str, name: &str) -> String {
    let text = read(&common::root().join(page));
    blocks(&text)
        .into_iter()
        .find_map(|b| match b {
            Block::File(n, body) if n == name => Some(body),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{page} has no file {name}"))
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else {
            continue;
        };
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        let words: Vec<&str> = info.split_whitespace().collect();
        if let Some(name) = words.iter().find_map(|w| w.strip_prefix("file=")) {
            out.push(Block::File(name.to_owned(), body.join("\n") + "\n"));
        } else if words.get(1) == Some(&"run") {
            let mut runs: Vec<(String, Vec<String>)> = Vec::new();
            for l in body {
                if let Some(cmd) = l.strip_prefix("$ ") {
                    runs.push((cmd.to_owned(), Vec::new()));
                } else {
                    runs.last_mut()
                        .expect("a run block starts with a command")
                        .1
                        .push(l.to_owned());
                }
            }
            out.push(Block::Run(runs));
        }
    }
    out
}

/// Each shown output against what the command printed: line for line; a line that is
/// `...` stands for any lines (none or more), and `...` within a line for any text there
/// (a generated name, the scheduler's count of nodes).
fn matches_shown(shown: &[String], printed: &str) -> bool {
    fn line(shown: &str, printed: &str) -> bool {
        let parts: Vec<&str> = shown.split("...").collect();
        let (first, last) = (parts[0], parts[parts.len() - 1]);
        if parts.len() == 1 {
            return shown == printed;
        }
        let Some(mut rest) = printed.strip_prefix(first) else {
            return false;
        };
        for middle in &parts[1..parts.len() - 1] {
            match rest.find(middle) {
                Some(i) => rest = &rest[i + middle.len()..],
                None => return false,
            }
        }
        rest.ends_with(last)
    }
    fn go(shown: &[String], printed: &[&str]) -> bool {
        match shown.split_first() {
            None => printed.is_empty(),
            Some((first, rest)) if first.trim() == "..." => {
                (0..=printed.len()).any(|i| go(rest, &printed[i..]))
            }
            Some((first, rest)) => {
                printed.first().is_some_and(|p| line(first, p)) && go(rest, &printed[1..])
            }
        }
    }
    let printed: Vec<&str> = printed.lines().collect();
    go(shown, &printed)
}

/// The output `page` shows for `$ COMMAND` in a ```` ```console cluster ```` block (run
/// against a cluster, so not by [`run_page`]), held to what a test that ran it against the
/// real control plane printed (tests/why.rs): `names` are the test's (its namespace, its
/// node), put back as the page writes them.
pub(crate) fn holds_example(page: &str, command: &str, printed: &str, names: &[(&str, &str)]) {
    let text = read(&common::root().join(page));
    let mut shown: Option<Vec<String>> = None;
    let mut in_block = false;
    for l in text.lines() {
        if l == "```console cluster" {
            in_block = true;
        } else if in_block && l == "```" {
            in_block = false;
            if shown.is_some() {
                break;
            }
        } else if in_block {
            match (&mut shown, l.strip_prefix("$ ")) {
                (None, Some(cmd)) if cmd == command => shown = Some(Vec::new()),
                (Some(_), Some(_)) => break,
                (Some(lines), None) => lines.push(l.to_owned()),
                _ => {}
            }
        }
    }
    let shown = shown.unwrap_or_else(|| panic!("{page} shows no `$ {command}`"));
    let mut printed = printed.to_owned();
    for (from, to) in names {
        printed = printed.replace(from, to);
    }
    assert!(
        matches_shown(&shown, &printed),
        "{page}: `{command}` shows\n{}\nbut printed\n{printed}",
        shown.join("\n")
    );
}

/// Runs a page's marked blocks in a scratch directory: files written, commands run by
/// `sh` with this build's `tollgate` first on PATH and no kubeconfig.
fn run_page(page: &str) -> usize {
    let text = read(&common::root().join(page));
    let dir = tempfile::tempdir().unwrap();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_tollgate"));
    let mut path = std::ffi::OsString::from(bin.parent().unwrap());
    if let Some(p) = std::env::var_os("PATH") {
        path.push(":");
        path.push(p);
    }
    let mut ran = 0;
    for block in blocks(&text) {
        match block {
            Block::File(name, body) => {
                let file = dir.path().join(name);
                std::fs::create_dir_all(file.parent().unwrap()).unwrap();
                std::fs::write(file, body).unwrap();
            }
            Block::Run(runs) => {
                for (cmd, shown) in runs {
                    let out = std::process::Command::new("sh")
                        .args(["-c", &cmd])
                        .current_dir(dir.path())
                        .env("PATH", &path)
                        .env("KUBECONFIG", common::bin::NO_KUBECONFIG)
                        .output()
                        .unwrap();
                    let printed = String::from_utf8_lossy(&out.stdout);
                    assert!(
                        matches_shown(&shown, &printed),
                        "{page}: `{cmd}` shows\n{}\nbut prints\n{printed}{}",
                        shown.join("\n"),
                        String::from_utf8_lossy(&out.stderr)
                    );
                    ran += 1;
                }
            }
        }
    }
    ran
}

#[test]
fn the_getting_started_commands_print_what_the_page_shows() {
    let ran = run_page("docs/getting-started.md");
    assert!(ran >= 4, "{ran} commands run");
}

#[test]
fn the_how_to_commands_print_what_the_pages_show() {
    for (page, at_least) in [
        ("docs/howto/pod-security.md", 2),
        ("docs/howto/ci-with-review.md", 1),
        ("docs/howto/gpu-sharing.md", 2),
        ("docs/howto/admission-policy-export.md", 2),
        ("docs/howto/kueue-and-quota.md", 2),
    ] {
        let ran = run_page(page);
        assert!(ran >= at_least, "{page}: {ran} commands run");
    }
}

#[test]
fn the_excerpt_rules() {
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(matches_shown(&s(&["a", "...", "d"]), "a\nb\nc\nd\n"));
    assert!(matches_shown(&s(&["a", "...", "b"]), "a\nb\n"));
    assert!(!matches_shown(&s(&["a", "b"]), "a\nb\nc\n"));
    assert!(!matches_shown(&s(&["a", "...", "x"]), "a\nb\n"));
    assert!(matches_shown(
        &s(&["  ...", "pods \"x-...\" is ... here"]),
        "a\npods \"x-1b\" is not here\n"
    ));
    assert!(!matches_shown(
        &s(&["pods \"x-...\" is"]),
        "pods \"y-1\" is\n"
    ));
}

/// The lines of the first ```` ```console run ```` block whose command is `command`.
fn shown_for(text: &str, command: &str) -> Vec<String> {
    blocks(text)
        .into_iter()
        .find_map(|b| match b {
            Block::Run(runs) => runs.into_iter().find(|(c, _)| c == command).map(|r| r.1),
            Block::File(..) => None,
        })
        .unwrap_or_else(|| panic!("no `$ {command}`"))
}

/// Getting started's cluster steps on the real apiserver: `tollgate serve` registered with
/// deploy/base's webhook configurations (narrowed to a namespace of this test, the
/// apiserver being shared), the namespace labelled as the page labels team-a, and the
/// page's `kubectl apply -f` of its files: the Job admitted with the warnings its `tollgate
/// review` shows (kubectl prints each after `Warning: `), the notebook refused with the
/// message its review shows, in kubectl's `Error from server (Forbidden)` words.
#[tokio::test]
async fn the_getting_started_cluster_steps_do_what_the_page_shows() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let Some(rendered) = common::rbac::render_if_kubectl("deploy/base") else {
        return;
    };
    let text = read(&common::root().join("docs/getting-started.md"));
    let admin = cp.client("admin").await;
    let (dir, ca) = common::process::workdir();
    let served = tokio::task::spawn_blocking(move || common::process::serve_builtin(dir, ca, &[]))
        .await
        .unwrap();
    let name = format!("docs-{}", std::process::id());
    for c in common::admission::registration(&rendered, &name, served.addr.port(), &served.ca_pem) {
        common::apiserver::create(&admin, &c, false)
            .await
            .unwrap_or_else(|e| panic!("registering: {}", e.message));
    }
    let ns = cp
        .namespace(
            "getting-started",
            &[
                ("tollgate.dev/enforce", "enabled"),
                (common::admission::REGISTERED, &name),
            ],
        )
        .await;
    common::admission::until_reviewed(&admin, &served, &ns).await;

    // The page's files, in the test's namespace instead of team-a.
    let work = tempfile::tempdir().unwrap();
    for b in blocks(&text) {
        if let Block::File(file, body) = b {
            let body = body.replace("namespace: team-a", &format!("namespace: {ns}"));
            std::fs::write(work.path().join(file), body).unwrap();
        }
    }
    let applies: Vec<String> = text
        .split("```sh cluster\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .flat_map(str::lines)
        .map(|l| l.split('#').next().unwrap().trim().to_owned())
        .filter(|l| l.starts_with("kubectl apply -f "))
        .collect();
    assert_eq!(
        applies,
        [
            "kubectl apply -f train.yaml",
            "kubectl apply -f notebook.yaml"
        ]
    );
    let apply = |line: &str| {
        let mut cmd = cp
            .kubectl("admin")
            .expect("kubectl, as deploy/base was rendered");
        cmd.args(line.split_whitespace().skip(1))
            .current_dir(work.path());
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The page's console block of what the two print: the Job's, to its `created` line;
    // then the notebook's.
    let block: Vec<String> = text
        .split("```console\nWarning: ")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .map(|b| format!("Warning: {b}"))
        .expect("the page's block of kubectl's output")
        .lines()
        .map(str::to_owned)
        .collect();
    let created = block
        .iter()
        .position(|l| l.ends_with(" created"))
        .expect("the Job's created line");

    let (code, stdout, stderr) = apply(&applies[0]);
    assert!(
        matches_shown(&block[..=created], &format!("{stderr}{stdout}")),
        "{:#?}\nkubectl:\n{stderr}{stdout}",
        &block[..=created]
    );
    assert_eq!(code, Some(0), "{stderr}");
    let shown: Vec<String> = shown_for(&text, "tollgate review --local train.yaml")
        .iter()
        .filter_map(|l| l.strip_prefix("  - "))
        .map(|w| format!("Warning: {w}"))
        .collect();
    let printed: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("Warning: "))
        .collect();
    assert!(!shown.is_empty());
    assert_eq!(printed, shown, "kubectl's warnings: {stderr}");

    let (code, _, stderr) = apply(&applies[1]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        matches_shown(&block[created + 1..], &stderr),
        "{:#?}\nkubectl:\n{stderr}",
        &block[created + 1..]
    );
    let shown = shown_for(
        &text,
        "tollgate review --local notebook.yaml; echo \"exit status $?\"",
    );
    let message: Vec<&str> = shown
        .iter()
        .map(String::as_str)
        .skip_while(|l| !l.is_empty())
        .skip(1)
        .take_while(|l| !l.starts_with("exit status"))
        .collect();
    let refused = format!(
        "Error from server (Forbidden): error when creating \"notebook.yaml\": admission webhook \"validate.tollgate.dev\" denied the request: {}",
        message[0]
    );
    assert!(stderr.contains(&refused), "{refused}\nkubectl:\n{stderr}");
    for line in &message[1..] {
        assert!(
            stderr.lines().any(|l| l == *line),
            "{line:?}\nkubectl:\n{stderr}"
        );
    }
    common::admission::deregister(&admin, &name).await;
}

/// Every path of the repository the front page and the guide name (in prose or in a
/// command) exists, and every Helm value they `--set` is one of the chart's values.
#[test]
fn the_paths_and_chart_values_the_pages_name_exist() {
    let values: Value = serde_saphyr::from_str(&read(
        &common::root().join("deploy/helm/tollgate/values.yaml"),
    ))
    .unwrap();
    let mut missing = Vec::new();
    for page in pages() {
        let text = read(&page);
        for top in [
            "deploy/",
            "tests/",
            "policies/",
            "crates/",
            "src/",
            "benches/",
            "certs/",
        ] {
            for (i, _) in text.match_indices(top) {
                // A path starts the word: not `../deploy/` (a link, checked apart) nor
                // `kube-system/...`.
                if text[..i].ends_with(|c: char| c.is_alphanumeric() || "./-_".contains(c)) {
                    continue;
                }
                let path: String = text[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || "/._-*".contains(*c))
                    .collect();
                let path = path.trim_end_matches(['.', '-']);
                // A glob names goldens by their prefix; `certs/dev/` is what `serve --dev`
                // writes; `deploy/tollgate` is kubectl's name of the Deployment.
                let generated = path.starts_with("certs/dev") || path == "deploy/tollgate";
                if path.contains('*') || generated {
                    continue;
                }
                if !common::root().join(path).exists() {
                    missing.push(format!("{}: {path}", rel(&page)));
                }
            }
        }
        for (i, _) in text.match_indices("--set ") {
            let key: String = text[i + "--set ".len()..]
                .chars()
                .take_while(|c| *c != '=' && !c.is_whitespace())
                .collect();
            let found = key.split('.').try_fold(&values, |v, k| v.get(k)).is_some();
            if !found {
                missing.push(format!("{}: --set {key}: no such value", rel(&page)));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

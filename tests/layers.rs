//! The architecture, checked: the engine crate pulls in no I/O crate, and in both crates
//! every module imports only from the layers below it, as the tables in
//! docs/architecture.md say. A new module must be placed in a table before it builds green.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Crates the engine must never depend on, directly or through another crate: async
/// runtimes, HTTP, TLS, the kube client.
const IO_CRATES: &[&str] = &[
    "tokio",
    "mio",
    "socket2",
    "axum",
    "hyper",
    "hyper-util",
    "h2",
    "tower",
    "rustls",
    "tokio-rustls",
    "ring",
    "kube",
    "kube-client",
    "kube-runtime",
    "reqwest",
];

#[test]
fn the_engine_depends_on_no_io_crate() {
    let lock: toml_like::Lock = toml_like::read(&common::root().join("Cargo.lock"));
    let mut seen = BTreeSet::new();
    let mut todo = vec!["tollgate-core".to_owned()];
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        for dep in lock.get(&name).into_iter().flatten() {
            todo.push(dep.clone());
        }
    }
    assert!(seen.len() > 5, "tollgate-core is in Cargo.lock: {seen:?}");
    let bad: Vec<&&str> = IO_CRATES.iter().filter(|c| seen.contains(**c)).collect();
    assert!(
        bad.is_empty(),
        "tollgate-core pulls in {bad:?} (see `cargo tree -p tollgate-core -i <crate>`)"
    );
}

#[test]
fn engine_modules_import_only_downward() {
    check_layers("crates/tollgate-core/src", "tollgate-core");
}

#[test]
fn shell_modules_import_only_downward() {
    check_layers("src", "tollgate");
}

/// Every top-level module of the crate at `dir` is in the doc's table for `krate`, and
/// each `crate::` path in it names a module of a lower layer (or itself).
fn check_layers(dir: &str, krate: &str) {
    let layers = table(krate);
    let root = common::root().join(dir);
    let mut problems = vec![];
    let mut modules = BTreeSet::new();
    for file in rust_files(&root) {
        let rel = file.strip_prefix(&root).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        modules.insert(module.clone());
        let Some(&own) = layers.get(&module) else {
            problems.push(format!(
                "{dir}/{}: module `{module}` is not in docs/architecture.md's table for {krate}",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for used in crate_paths(&text) {
            if used == module {
                continue;
            }
            match layers.get(&used) {
                Some(&l) if l < own => {}
                Some(&l) => problems.push(format!(
                    "{dir}/{}: `{module}` (layer {own}) imports `{used}` (layer {l}): only lower layers",
                    rel.display()
                )),
                None => problems.push(format!(
                    "{dir}/{}: imports `crate::{used}`, which is not in the table for {krate}",
                    rel.display()
                )),
            }
        }
    }
    for m in layers.keys() {
        if !modules.contains(m) {
            problems.push(format!(
                "docs/architecture.md lists `{m}` for {krate}, which has no such module"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The table in docs/architecture.md headed `| layer | <krate> module |`: module -> layer.
fn table(krate: &str) -> BTreeMap<String, u32> {
    let doc = std::fs::read_to_string(common::root().join("docs/architecture.md")).unwrap();
    let header = format!("| layer | `{krate}` module |");
    let start = doc
        .find(&header)
        .unwrap_or_else(|| panic!("docs/architecture.md has a table headed {header:?}"));
    let mut out = BTreeMap::new();
    for line in doc[start..].lines().skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let layer: u32 = cells[1].parse().expect("a layer number");
        for m in cells[2].split(',') {
            out.insert(m.trim().trim_matches('`').to_owned(), layer);
        }
    }
    assert!(!out.is_empty(), "the table for {krate} has rows");
    out
}

/// The first segment of every `crate::` path outside comments, grouped imports included.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap();
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    out.insert(ident(item.trim()));
                }
            } else {
                out.insert(ident(rest));
            }
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Just enough of Cargo.lock: each package's name and the names it depends on.
mod toml_like {
    use std::collections::BTreeMap;
    use std::path::Path;

    pub type Lock = BTreeMap<String, Vec<String>>;

    pub fn read(path: &Path) -> Lock {
        let text = std::fs::read_to_string(path).unwrap();
        let mut out = Lock::new();
        for block in text.split("[[package]]").skip(1) {
            let name = block
                .lines()
                .find_map(|l| l.strip_prefix("name = "))
                .map(|n| n.trim_matches('"').to_owned())
                .unwrap_or_default();
            let deps: Vec<String> = block
                .split("dependencies = [")
                .nth(1)
                .map(|d| {
                    d.split(']')
                        .next()
                        .unwrap_or("")
                        .split(',')
                        // "name" or "name version": the name is the first word.
                        .filter_map(|e| e.trim().trim_matches('"').split(' ').next())
                        .filter(|n| !n.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            out.entry(name).or_default().extend(deps);
        }
        out
    }
}

//! The architecture, checked: the engine crate pulls in no I/O crate, and in both crates
//! every module imports only from the layers below it, as the tables in
//! docs/architecture.md say. A new module must be placed in a table before it builds green.
//! Inside a module (a directory), the children import each other one way only: no circles.
//! The test-only stand-in's crate docs list every test that still uses it.

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

#[test]
fn modules_inside_a_module_import_each_other_one_way() {
    for dir in ["crates/tollgate-core/src", "src"] {
        let root = common::root().join(dir);
        let mut problems = vec![];
        for module in module_dirs(&root) {
            problems.extend(sibling_circles(&root, &module));
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}

/// Every directory under `dir` that is a module (has a `mod.rs`), nested ones too.
fn module_dirs(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if p.join("mod.rs").is_file() {
                out.push(p.clone());
            }
            out.extend(module_dirs(&p));
        }
    }
    out.sort();
    out
}

/// The rule inside a module: its `mod.rs` is the module's face, which may use its
/// children, and whose own items its children may use; between the children (siblings),
/// imports go one way only, so that they too stack in layers. A child's import of a
/// sibling is a `super::NAME` or `crate::PATH::NAME` path naming the sibling, or an item
/// that `mod.rs` re-exports from it (`pub use sibling::{..}` or `pub use sibling::*`).
/// Returns each circle found, as `a -> b -> a`.
fn sibling_circles(root: &Path, module: &Path) -> Vec<String> {
    let rel = module.strip_prefix(root).unwrap();
    let path: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let crate_prefix = format!("crate::{}::", path.join("::"));
    let mut children: BTreeMap<String, String> = BTreeMap::new();
    for e in std::fs::read_dir(module).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let text = if p.is_dir() && p.join("mod.rs").is_file() {
            std::fs::read_to_string(p.join("mod.rs")).unwrap()
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem == "mod" {
                continue;
            }
            std::fs::read_to_string(&p).unwrap()
        } else {
            continue;
        };
        children.insert(name.trim_end_matches(".rs").to_owned(), text);
    }
    let face = std::fs::read_to_string(module.join("mod.rs")).unwrap();
    // Items the face re-exports: by name, and the children it re-exports whole.
    let mut reexported: BTreeMap<String, String> = BTreeMap::new();
    let mut globbed = vec![];
    for line in face.lines().map(|l| l.split("//").next().unwrap().trim()) {
        let Some(rest) = line
            .strip_prefix("pub use ")
            .or_else(|| line.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let rest = rest.trim_start_matches("self::").trim_end_matches(';');
        let Some((child, items)) = rest.split_once("::") else {
            continue;
        };
        if !children.contains_key(child) {
            continue;
        }
        if items == "*" {
            globbed.push(child.to_owned());
        } else {
            for item in items.trim_matches(|c| c == '{' || c == '}').split(',') {
                let item = item.split(" as ").last().unwrap().trim();
                // A `pub use child::{` whose items go on over the next lines names
                // nothing on this one (and `use super::*` must not match it).
                if !item.is_empty() {
                    reexported.insert(item.to_owned(), child.to_owned());
                }
            }
        }
    }
    let defines = |text: &str, item: &str| {
        text.lines().any(|l| {
            let l = l
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            [
                "fn ", "struct ", "enum ", "const ", "static ", "type ", "trait ",
            ]
            .iter()
            .any(|k| l.strip_prefix(k).is_some_and(|r| ident(r) == item))
        })
    };
    let mut edges: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (child, text) in &children {
        let mut used = BTreeSet::new();
        for line in text.lines() {
            let code = line.split("//").next().unwrap();
            for prefix in ["super::", crate_prefix.as_str()] {
                let mut rest = code;
                while let Some(i) = rest.find(prefix) {
                    rest = &rest[i + prefix.len()..];
                    if let Some(group) = rest.strip_prefix('{') {
                        let end = group.find('}').unwrap_or(group.len());
                        used.extend(group[..end].split(',').map(|i| ident(i.trim())));
                    } else {
                        used.insert(ident(rest));
                    }
                }
            }
        }
        for item in used {
            let target = if children.contains_key(&item) {
                Some(item)
            } else if let Some(c) = reexported.get(&item) {
                Some(c.clone())
            } else {
                globbed
                    .iter()
                    .find(|c| defines(&children[*c], &item))
                    .cloned()
            };
            if let Some(t) = target.filter(|t| t != child) {
                edges.entry(child.as_str()).or_default().insert(t);
            }
        }
    }
    // A circle is a path back to where it started.
    let shown = |names: &[&str]| {
        names
            .iter()
            .map(|n| format!("{}/{n}", rel.display()))
            .collect::<Vec<_>>()
            .join(" -> ")
    };
    let mut circles = vec![];
    for start in children.keys() {
        let mut stack = vec![vec![start.as_str()]];
        let mut seen = BTreeSet::new();
        while let Some(trail) = stack.pop() {
            let last = *trail.last().unwrap();
            for next in edges.get(last).into_iter().flatten() {
                // Each circle once: from its first module by name.
                if next == start && trail.iter().all(|n| *n >= start.as_str()) {
                    let mut all = trail.clone();
                    all.push(start);
                    circles.push(format!(
                        "{}: siblings import each other in a circle ({}): move what both need \
                         into a module below them",
                        rel.display(),
                        shown(&all)
                    ));
                } else if next != start && seen.insert(next.as_str()) {
                    let mut more = trail.clone();
                    more.push(next);
                    stack.push(more);
                }
            }
        }
    }
    circles.sort();
    circles.dedup();
    circles
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
        // The crate roots, and src/bin's binaries (`kubectl-tollgate`: src/main.rs again),
        // which are no modules of the library.
        if module == "lib" || module == "main" || module == "bin" {
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

/// The stand-in's crate docs list its users, all of them: every test file that uses it is
/// named there, and every test the list names is a test of such a file. A test moved onto
/// a real apiserver leaves the list; a new user joins it, saying what fault it needs.
#[test]
fn the_stand_ins_docs_list_its_users() {
    let root = common::root();
    let lib = std::fs::read_to_string(root.join("crates/apiserver-standin/src/lib.rs")).unwrap();
    let docs: String = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let list = docs
        .split_once("Its users, all of them:")
        .and_then(|(_, rest)| rest.split_once("It no longer imitates"))
        .map(|(list, _)| list)
        .expect("the crate docs' list of its users");
    let users: Vec<(String, String)> = std::fs::read_dir(root.join("tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| {
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            (stem, std::fs::read_to_string(&p).unwrap())
        })
        .filter(|(_, text)| {
            // The crate's name put together, so that this file does not name it itself.
            let krate = ["tollgate", "apiserver", "standin"].join("_");
            text.lines().map(str::trim_start).any(|l| {
                l.starts_with(&format!("use {krate}")) || l.contains(&format!("{krate}::"))
            })
        })
        .collect();
    for (stem, _) in &users {
        assert!(
            list.contains(stem.as_str()),
            "tests/{stem}.rs uses the stand-in: list it"
        );
    }
    let named = list.split('`').skip(1).step_by(2).filter(|n| {
        n.contains('_')
            && n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    });
    for name in named {
        assert!(
            users
                .iter()
                .any(|(_, text)| text.contains(&format!("fn {name}("))),
            "the stand-in's docs name {name}, which no test of a file that uses it is"
        );
    }
}

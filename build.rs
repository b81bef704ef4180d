//! The version `tollgate --version` prints: the package's, with the commit it was built
//! from as git describes it (`0.1.0 (v0.1.0-12-gabc1234-dirty)`), so that a binary found on
//! a machine says what it is. Without git, or outside a repository (a source tarball, the
//! Docker build, whose context leaves `.git` out), the package's version alone.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}

fn main() {
    let version = env!("CARGO_PKG_VERSION");
    let described = git(&["describe", "--tags", "--always", "--dirty"]);
    let full = match &described {
        Some(d) => format!("{version} ({d})"),
        None => version.to_owned(),
    };
    println!("cargo:rustc-env=TOLLGATE_VERSION={full}");
    println!("cargo:rerun-if-changed=build.rs");
    // Again when the commit or the branch moves (only files that exist: cargo would take a
    // missing one for a change on every build).
    if described.is_some() {
        let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])];
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.push(git(&["rev-parse", "--git-path", &branch]));
        }
        watched.push(git(&["rev-parse", "--git-path", "index"]));
        for path in watched.into_iter().flatten() {
            if Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
}

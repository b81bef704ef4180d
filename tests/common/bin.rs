//! The `tollgate` binary, run as a user runs it: the one way the tests start a command of
//! it (a server: [`super::process`]).

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The binary under test: this build's, or `TOLLGATE_BIN` (a measurement's release build,
/// tests/scale.rs); with a `KUBECONFIG` that names no file, so that a command reaches only
/// the cluster its arguments name, never the developer's (`$KUBECONFIG` or
/// `~/.kube/config`: the commands that read a cluster when a kubeconfig is found, `policy`
/// and `why`, would read it). A test's own `.env("KUBECONFIG", ...)` replaces it.
pub fn command() -> Command {
    let mut cmd = Command::new(
        std::env::var_os("TOLLGATE_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_tollgate").into()),
    );
    cmd.env("KUBECONFIG", NO_KUBECONFIG);
    cmd
}

/// A kubeconfig path no file is at.
pub const NO_KUBECONFIG: &str = "/nonexistent/tollgate-tests/kubeconfig";

/// Runs `tollgate ARGS` from the repository's root, with `stdin` on its standard input
/// (none: closed at once), and without the developer's kubeconfig ([`command`]).
pub fn run(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = command()
        .args(args)
        .current_dir(super::root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

/// [`run`] on a blocking thread, for a test whose runtime must go on meanwhile (an
/// in-process apiserver answering the command on it).
pub async fn run_blocking(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args, None)
    })
    .await
    .unwrap()
}

/// `tollgate export validating-admission-policy` of `policy` (None: the built-in one):
/// what it prints, which must be a success.
pub fn export(policy: Option<&Path>) -> Vec<u8> {
    let mut args = vec!["export", "validating-admission-policy"];
    let policy_arg = policy.map(|p| p.display().to_string());
    if let Some(p) = &policy_arg {
        args.extend(["--policy", p.as_str()]);
    }
    let out = run(&args, None);
    assert!(
        out.status.success(),
        "export of {policy:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

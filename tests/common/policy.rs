//! The policy as Kubernetes objects in the real apiserver: the TollgatePolicy and
//! TollgateProfile CRDs (deploy/base/crds), installed once per test binary.

use super::envtest::ControlPlane;

/// The two CRDs' files, as deploy/base ships them (generated: `objects::crd`).
pub const CRD_FILES: [&str; 2] = [
    "deploy/base/crds/tollgatepolicies.tollgate.dev.yaml",
    "deploy/base/crds/tollgateprofiles.tollgate.dev.yaml",
];

/// Both CRDs installed and Established, once per test binary whichever test asks first
/// (they are cluster-wide; applying again is harmless: another binary's run, or the Helm
/// chart's install, may have made them already). None where no kubectl can be had.
pub async fn install_crds(cp: &ControlPlane) -> Option<()> {
    for file in CRD_FILES {
        super::identity::crds(cp, file).await?;
    }
    Some(())
}

/// The cluster's one TollgatePolicy `default` is every test's: a test that creates, changes
/// or deletes it, or dry-runs a create of it (refused while one exists), holds this
/// meanwhile, and leaves no `default` behind when it lets go.
pub async fn cluster_policy_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}

/// `kubectl` as the identity of `kubeconfig` with `args`, `stdin` (JSON) on its standard
/// input: whether it succeeded, and its standard output and error. None where no kubectl
/// can be had.
pub fn kubectl(
    kubeconfig: &std::path::Path,
    args: &[&str],
    stdin: Option<&serde_json::Value>,
) -> Option<(bool, String, String)> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new(super::tools::kubectl()?)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    let mut input = child.stdin.take().unwrap();
    if let Some(v) = stdin {
        input.write_all(v.to_string().as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    Some((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

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

//! Where the unit tests find the shipped policy and the apiserver's fixtures (tests only).

use std::path::PathBuf;

/// The workspace root, where `policies/` and `tests/fixtures/` live.
pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub(crate) fn fixtures_dir() -> PathBuf {
    root().join("tests/fixtures/apiserver-v1.36")
}

/// Whether a fixture is the review of a pod (the others are of workloads).
pub(crate) fn is_pod_review(body: &[u8]) -> bool {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    v["request"]["kind"]["kind"] == "Pod" && v["request"]["kind"]["group"] == ""
}

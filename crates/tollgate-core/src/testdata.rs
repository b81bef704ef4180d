//! Where the unit tests find the shipped policy and the apiserver's fixtures (tests only).

use std::path::PathBuf;

/// The workspace root, where `policies/` and `tests/fixtures/` live.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixtures_dir() -> PathBuf {
    root().join("tests/fixtures/apiserver-v1.36")
}

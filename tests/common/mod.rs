//! Shared test support: the shipped policy and the apiserver's fixtures.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tollgate::policy::Policy;
use tollgate::server::{ActivePolicy, AppState, Limits};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn default_policy_path() -> PathBuf {
    root().join("policies/default.yaml")
}

pub fn load_policy(path: &Path) -> Policy {
    let text = std::fs::read_to_string(path).unwrap();
    Policy::from_text(&path.display().to_string(), &text).unwrap()
}

pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(root().join("tests/fixtures/apiserver-v1.36").join(name)).unwrap()
}

pub fn fixture_names() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("tests/fixtures/apiserver-v1.36"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    v.sort();
    v
}

pub fn state_with(policy: Policy) -> Arc<AppState> {
    AppState::new(ActivePolicy::new(policy, b"test"), Limits::default())
}

pub fn default_state() -> Arc<AppState> {
    state_with(load_policy(&default_policy_path()))
}

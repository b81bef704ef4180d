//! The built-in policy: without `--policy`, `serve` and `review` run `policies/default.yaml`
//! as compiled into the binary, from any directory; `--policy FILE` still wins.

use crate::common;

use common::net::Client;
use common::process;
use sha2::{Digest, Sha256};

use common::NOTEBOOK;

/// `tollgate review` run from an empty directory, with `args` and a file holding `pod`.
fn review_elsewhere(args: &[&str], pod: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pod.yaml"), pod).unwrap();
    let out = common::bin::command()
        .arg("review")
        .args(args)
        .arg("pod.yaml")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[test]
fn review_runs_the_built_in_policy_from_any_directory() {
    let (code, text) = review_elsewhere(&[], NOTEBOOK);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("container \"jupyter\" has no request for cpu and memory"),
        "{text}"
    );
}

#[test]
fn a_policy_file_wins_over_the_built_in_one() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("warn.yaml");
    std::fs::write(&policy, "validation:\n  mode: warn\n").unwrap();
    let (code, text) = review_elsewhere(&["--policy", policy.to_str().unwrap()], NOTEBOOK);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("will be refused once enforcement starts"),
        "{text}"
    );
}

#[test]
fn the_built_in_policy_is_the_shipped_file() {
    let shipped = std::fs::read_to_string(common::default_policy_path()).unwrap();
    assert_eq!(tollgate_core::BUILTIN_TEXT, shipped);
}

#[tokio::test]
async fn serve_runs_the_built_in_policy_without_a_policy_file() {
    let (dir, ca) = process::workdir();
    std::fs::remove_file(dir.path().join("policy.yaml")).unwrap();
    let served = process::serve_builtin(dir, ca, &[]);
    let mut c = Client::connect(served.addr, &served.ca_pem, false).await;
    let (status, body) = c.request("GET", "/readyz", vec![]).await.unwrap();
    assert_eq!(status, 200);
    let hash: String = Sha256::digest(tollgate_core::BUILTIN_TEXT.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        String::from_utf8_lossy(&body),
        format!("ready: policy {hash}\n")
    );
    let (status, body) = c
        .post(
            "/mutate",
            common::fixture("resnet50-worker-generatename.mutate.json"),
        )
        .await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(v["response"]["patch"].is_string(), "{v}");
}

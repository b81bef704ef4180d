//! Policy hot reload through a ConfigMap-style mount: the file is a symlink into a `..data`
//! symlink that the kubelet points at a new timestamped directory on every update.
#![cfg(unix)]

use crate::common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::net::{self, Client};
use common::scrape;
use serde_json::Value;

/// A directory laid out as the kubelet lays out a ConfigMap volume.
struct ConfigMapDir {
    dir: tempfile::TempDir,
    generation: u32,
}

impl ConfigMapDir {
    fn new(text: &str) -> Self {
        let mut cm = ConfigMapDir {
            dir: tempfile::tempdir().unwrap(),
            generation: 0,
        };
        cm.update(text);
        symlink("..data/policy.yaml", cm.policy_path()).unwrap();
        cm
    }

    fn policy_path(&self) -> PathBuf {
        self.dir.path().join("policy.yaml")
    }

    /// What the kubelet's atomic writer does: write a new timestamped directory, point a new
    /// symlink at it, rename that over `..data` (atomic), then remove the old directory.
    fn update(&mut self, text: &str) {
        let root = self.dir.path();
        self.generation += 1;
        let name = format!("..2026_11_30_03_00_00.{:09}", self.generation);
        std::fs::create_dir(root.join(&name)).unwrap();
        std::fs::write(root.join(&name).join("policy.yaml"), text).unwrap();
        let old = std::fs::read_link(root.join("..data")).ok();
        symlink(&name, root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(root.join(old)).unwrap();
        }
    }
}

fn default_policy() -> String {
    std::fs::read_to_string(common::default_policy_path()).unwrap()
}

fn warn_policy() -> String {
    let text = default_policy();
    assert!(text.contains("\n  mode: enforce\n"));
    text.replace("\n  mode: enforce\n", "\n  mode: warn\n")
}

fn broken_policy() -> String {
    format!("{}\nnotAField: true\n", warn_policy())
}

async fn metrics(server: &net::TestServer) -> Vec<scrape::Sample> {
    scrape::parse(&net::get_metrics(server.running.metrics_addr.unwrap()).await)
}

async fn reloads(server: &net::TestServer, result: &str) -> f64 {
    scrape::value(
        &metrics(server).await,
        "tollgate_policy_reloads_total",
        &[("result", result)],
    )
    .unwrap()
}

/// Waits (bounded) for the "policy file rejected" gauge to read `want`.
async fn assert_rejected(server: &net::TestServer, want: f64) {
    let mut got = None;
    for _ in 0..100 {
        got = scrape::value(&metrics(server).await, "tollgate_policy_file_rejected", &[]);
        if got == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("tollgate_policy_file_rejected is {got:?}, expected {want}");
}

async fn policy_hashes(server: &net::TestServer) -> Vec<String> {
    metrics(server)
        .await
        .iter()
        .filter(|s| s.name == "tollgate_policy_info" && s.value == 1.0)
        .map(|s| s.labels["hash"].clone())
        .collect()
}

/// Waits (bounded) until the counter reaches `want`.
async fn wait_reloads(server: &net::TestServer, result: &str, want: f64) {
    for _ in 0..1000 {
        if reloads(server, result).await >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(reloads(server, result).await, want, "{result} reloads");
}

/// The pod that validation denies under the default policy (its containers request nothing).
async fn validate(c: &mut Client) -> Value {
    let (status, body) = c
        .post(
            "/validate",
            common::fixture("resnet50-master-0.validate.json"),
        )
        .await;
    assert_eq!(status, 200);
    serde_json::from_slice::<Value>(&body).unwrap()["response"].clone()
}

async fn ready(c: &mut Client) -> u16 {
    c.request("GET", "/readyz", vec![]).await.unwrap().0
}

fn interval_margin() -> Duration {
    // Twenty reload intervals of the test server: enough for several polls.
    Duration::from_millis(20 * 50)
}

#[tokio::test]
async fn configmap_symlink_swaps_reload_good_policies_and_reject_bad_ones() {
    let mut cm = ConfigMapDir::new(&default_policy());
    let path: PathBuf = cm.policy_path();
    let server = net::start(|o| o.policy_path = Some(path)).await;
    assert!(Path::new(&cm.policy_path()).is_symlink());
    let mut c = Client::connect(server.addr(), &server.ca_pem, true).await;

    let r = validate(&mut c).await;
    assert_eq!(r["allowed"], false, "denied under enforce: {r}");
    let enforce_hash = policy_hashes(&server).await;
    assert_eq!(enforce_hash.len(), 1);
    assert_rejected(&server, 0.0).await;

    // A valid new policy: the next review sees it.
    cm.update(&warn_policy());
    wait_reloads(&server, "success", 1.0).await;
    let r = validate(&mut c).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(
        r["warnings"][0].as_str().unwrap().contains("cpu"),
        "the denial's text, as a warning: {r}"
    );
    let warn_hash = policy_hashes(&server).await;
    assert_eq!(warn_hash.len(), 1, "one policy_info series at a time");
    assert_ne!(warn_hash, enforce_hash);

    // An invalid one: rejected, counted, the warn policy stays, still ready.
    cm.update(&broken_policy());
    wait_reloads(&server, "failure", 1.0).await;
    assert_eq!(validate(&mut c).await["allowed"], true);
    assert_eq!(ready(&mut c).await, 200);
    assert_eq!(policy_hashes(&server).await, warn_hash);
    assert_eq!(reloads(&server, "success").await, 1.0);
    // Counted once, but flagged for as long as the bad file stays.
    tokio::time::sleep(interval_margin()).await;
    assert_eq!(reloads(&server, "failure").await, 1.0);
    assert_rejected(&server, 1.0).await;

    // The good file back is the policy in force: nothing to reload, nothing to count.
    cm.update(&warn_policy());
    tokio::time::sleep(interval_margin()).await;
    assert_eq!(reloads(&server, "success").await, 1.0);
    assert_eq!(reloads(&server, "failure").await, 1.0);
    assert_eq!(policy_hashes(&server).await, warn_hash);
    assert_rejected(&server, 0.0).await;

    // The same bad file again is a new failure, reported again.
    cm.update(&broken_policy());
    wait_reloads(&server, "failure", 2.0).await;
    assert_eq!(ready(&mut c).await, 200);

    // And back to the first policy.
    cm.update(&default_policy());
    wait_reloads(&server, "success", 2.0).await;
    assert_eq!(policy_hashes(&server).await, enforce_hash);
    assert_eq!(validate(&mut c).await["allowed"], false);
    server.running.shutdown().await;
}

#[tokio::test]
async fn a_policy_file_that_disappears_is_a_failure_and_the_policy_stays() {
    let cm = ConfigMapDir::new(&default_policy());
    let path = cm.policy_path();
    let server = net::start(|o| o.policy_path = Some(path)).await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    std::fs::remove_file(cm.dir.path().join("..data")).unwrap();
    wait_reloads(&server, "failure", 1.0).await;
    assert_rejected(&server, 1.0).await;
    assert_eq!(ready(&mut c).await, 200);
    assert_eq!(validate(&mut c).await["allowed"], false);
    server.running.shutdown().await;
}

/// A policy file whose read stalls (a FIFO no one writes, as a hung network volume would
/// stall) holds up no review: the polls read on tokio's blocking pool, not on the worker
/// that serves. The test's runtime has one thread; were the read on it, no review could
/// be answered until the watchdog below let the read finish.
#[tokio::test]
async fn a_policy_read_that_stalls_holds_up_no_review() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let (good, stall, path) = (
        dir.path().join("good.yaml"),
        dir.path().join("stall"),
        dir.path().join("policy.yaml"),
    );
    std::fs::write(&good, default_policy()).unwrap();
    symlink(&good, &path).unwrap();
    let point_at = move |target: &Path, path: &Path| {
        let tmp = path.with_extension("tmp");
        symlink(target, &tmp).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    };
    let server = net::start(|o| o.policy_path = Some(path.clone())).await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    assert_eq!(validate(&mut c).await["allowed"], false);

    let made = std::process::Command::new("mkfifo")
        .arg(&stall)
        .status()
        .unwrap();
    assert!(made.success());
    // Lets the stuck read finish (the good policy's bytes, so nothing changes) once a
    // review is answered, or after 15 s without one: then the test fails rather than
    // hangs. The link goes back to the file first, so that no later poll stalls again.
    let answered = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (answered, good, path, stall) =
            (answered.clone(), good.clone(), path.clone(), stall.clone());
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while !answered.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(15) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let stalled = !answered.load(Ordering::Acquire);
            point_at(&good, &path);
            std::fs::write(&stall, default_policy()).unwrap();
            stalled
        })
    };
    point_at(&stall, &path);
    // Polls every 50 ms: the next one is stuck opening the FIFO, and stays so. (Were the
    // read on the test's one thread, even this sleep would last until the watchdog.)
    tokio::time::sleep(interval_margin()).await;
    let r = validate(&mut c).await;
    answered.store(true, Ordering::Release);
    let stalled = watchdog.join().unwrap();
    assert!(
        !stalled,
        "the review waited for the policy file's read: it runs on the worker"
    );
    assert_eq!(r["allowed"], false, "{r}");
    assert_eq!(ready(&mut c).await, 200);
    server.running.shutdown().await;
}

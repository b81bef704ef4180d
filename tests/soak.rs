//! Soak: the real `tollgate` binary as a child process on 127.0.0.1, under sustained valid
//! reviews over HTTP/1.1 and HTTP/2 with garbage connections, half handshakes and slow
//! clients mixed in, while its certificate is rotated and its policy reloaded. Every valid
//! review must get the right answer, and the process's memory must come back down.
//!
//! A few seconds by default; `TOLLGATE_SOAK_SECS=300 cargo test --test integration soak:: -- --nocapture`
//! for a long run. Bounded in time and in requests, and it stops by itself.

use crate::common;

use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::net::{self, Client};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tollgate_core::{review_bytes, Stage};

/// Most valid reviews one run sends, whatever its duration.
const MAX_REVIEWS: u64 = 2_000_000;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    fn rss_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap();
        status
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc status"))
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[derive(Default)]
struct Counts {
    reviews: AtomicU64,
    failures: AtomicU64,
    garbage: AtomicU64,
    slow: AtomicU64,
    reconnects: AtomicU64,
    connect_errors: AtomicU64,
}

/// The fixtures with the answer tollgate must give each (`allowed`, patched or not).
fn cases() -> Vec<(&'static str, Vec<u8>, String, bool, bool)> {
    let policy = common::load_policy(&common::default_policy_path());
    common::fixture_names()
        .into_iter()
        .map(|name| {
            let body = common::fixture(&name);
            let endpoint = if name.contains("mutate") {
                Stage::Mutate
            } else {
                Stage::Validate
            };
            let r = review_bytes(endpoint, &policy, &body).unwrap();
            let path = if endpoint == Stage::Mutate {
                "/mutate"
            } else {
                "/validate"
            };
            (
                path,
                body,
                r.uid.clone(),
                r.response.allowed,
                r.patch().is_some(),
            )
        })
        .collect()
}

async fn valid_load(
    addr: SocketAddr,
    ca: Arc<String>,
    h2: bool,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) {
    let cases = cases();
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        // A connection carries fifty reviews, then a new one: new handshakes see
        // the rotated certificate.
        let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
        let mut client = match Client::connect_with(addr, net::client_config(&ca, alpn, None)).await
        {
            Ok(c) => c,
            Err(e) => {
                // Not a review: counted and reported, retried.
                eprintln!("connect failed: {e}");
                counts.connect_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        counts.reconnects.fetch_add(1, Ordering::Relaxed);
        for _ in 0..50 {
            if stop.load(Ordering::Relaxed) || counts.reviews.load(Ordering::Relaxed) >= MAX_REVIEWS
            {
                stop.store(true, Ordering::Relaxed);
                return;
            }
            let (path, body, uid, allowed, patched) = &cases[i % cases.len()];
            i += 1;
            let ok = match client.request("POST", path, body.clone()).await {
                Ok((200, resp)) => {
                    let v: Value = serde_json::from_slice(&resp).unwrap_or(Value::Null);
                    v["response"]["uid"] == uid.as_str()
                        && v["response"]["allowed"] == *allowed
                        && v["response"].get("patch").is_some() == *patched
                }
                Ok((status, resp)) => {
                    eprintln!("{path}: {status} {}", String::from_utf8_lossy(&resp));
                    false
                }
                Err(e) => {
                    eprintln!("{path}: {e}");
                    false
                }
            };
            counts.reviews.fetch_add(1, Ordering::Relaxed);
            if !ok {
                counts.failures.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
    }
}

/// Connections that are not clients: random bytes, half handshakes, slow headers.
async fn misbehave(addr: SocketAddr, ca: Arc<String>, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    while !stop.load(Ordering::Relaxed) {
        match next() % 3 {
            0 => {
                let Ok(mut tcp) = TcpStream::connect(addr).await else {
                    continue;
                };
                let junk: Vec<u8> = (0..1 + next() % 2048).map(|_| next() as u8).collect();
                let _ = tcp.write_all(&junk).await;
                let mut buf = [0u8; 64];
                let _ = tokio::time::timeout(Duration::from_millis(200), tcp.read(&mut buf)).await;
                counts.garbage.fetch_add(1, Ordering::Relaxed);
            }
            1 => {
                let Ok(mut tcp) = TcpStream::connect(addr).await else {
                    continue;
                };
                // The first bytes of a ClientHello, then silence, then gone.
                let _ = tcp
                    .write_all(&[0x16, 0x03, 0x01, 0x01, 0x00, 0x01, 0x00, 0x00, 0xfc, 0x03])
                    .await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                counts.garbage.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                let cfg = net::client_config(&ca, &[b"http/1.1"], None);
                let Ok(mut tls) = net::tls_connect(addr, cfg).await else {
                    continue;
                };
                let _ = tls
                    .write_all(
                        b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 900\r\n\r\n{",
                    )
                    .await;
                tokio::time::sleep(Duration::from_millis(150)).await;
                counts.slow.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak() {
    let secs: u64 = std::env::var("TOLLGATE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        common::default_policy_path(),
        dir.path().join("policy.yaml"),
    )
    .unwrap();
    // Every certificate the run will rotate through, made up front; clients trust all CAs.
    let names = ["localhost".to_owned(), "127.0.0.1".to_owned()];
    let bundles: Vec<_> = (0..4)
        .map(|_| tollgate::certs::generate(&names, 1).unwrap())
        .collect();
    let ca: Arc<String> = Arc::new(bundles.iter().map(|b| b.ca_pem.clone()).collect());
    tollgate::certs::write(dir.path(), &bundles[0]).unwrap();

    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let server = Server(
        common::bin::command()
            .args([
                "serve",
                "--listen",
                &addr.to_string(),
                "--metrics-listen",
                "off",
                // No API server runs here.
                "--cluster-context",
                "off",
            ])
            .arg("--policy")
            .arg(dir.path().join("policy.yaml"))
            .arg("--tls-cert")
            .arg(dir.path().join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.path().join("tls.key"))
            .args([
                "--reload-interval-ms",
                "100",
                "--handshake-timeout-ms",
                "2000",
                "--header-timeout-ms",
                "1000",
                "--review-deadline-ms",
                "1000",
                "--log-format",
                "json",
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    loop {
        if let Ok(mut c) = Client::connect_with(addr, net::client_config(&ca, &[b"h2"], None)).await
        {
            if c.request("GET", "/healthz", vec![]).await.is_ok() {
                break;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "server did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Warm up (allocator arenas, TLS session caches), then take the baseline.
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    {
        let warm_stop = Arc::new(AtomicBool::new(false));
        let w: Vec<_> = [false, true]
            .into_iter()
            .map(|h2| {
                tokio::spawn(valid_load(
                    addr,
                    ca.clone(),
                    h2,
                    warm_stop.clone(),
                    counts.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
        warm_stop.store(true, Ordering::Relaxed);
        for t in w {
            t.await.unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let baseline = server.rss_kib("VmRSS:");
    let warm_reviews = counts.reviews.load(Ordering::Relaxed);

    let mut tasks = vec![];
    for h2 in [false, true, false, true] {
        tasks.push(tokio::spawn(valid_load(
            addr,
            ca.clone(),
            h2,
            stop.clone(),
            counts.clone(),
        )));
    }
    for _ in 0..2 {
        tasks.push(tokio::spawn(misbehave(
            addr,
            ca.clone(),
            stop.clone(),
            counts.clone(),
        )));
    }

    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut rotations = 0usize;
    let mut reloads = 0usize;
    let mut peak = baseline;
    let policy_text = std::fs::read_to_string(dir.path().join("policy.yaml")).unwrap();
    let step = Duration::from_millis((secs * 1000 / 6).clamp(300, 10_000));
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(step.min(deadline.saturating_duration_since(Instant::now()))).await;
        peak = peak.max(server.rss_kib("VmRSS:"));
        // Rotate: a new key pair and certificate, the way a Secret update lands.
        rotations += 1;
        tollgate::certs::write(dir.path(), &bundles[rotations % bundles.len()]).unwrap();
        // Reload: a policy that answers the fixtures the same way.
        reloads += 1;
        let tmp = dir.path().join(".policy.yaml.new");
        std::fs::write(&tmp, format!("{policy_text}\n# reload {reloads}\n")).unwrap();
        std::fs::rename(&tmp, dir.path().join("policy.yaml")).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("load tasks stop")
            .unwrap();
    }
    // Idle: connections closed, buffers freed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = server.rss_kib("VmRSS:");
    let hwm = server.rss_kib("VmHWM:");
    // Still serving after all that, with the last certificate.
    let mut c = Client::connect_with(addr, net::client_config(&ca, &[b"h2"], None))
        .await
        .unwrap();
    let (path, body, uid, _, _) = &cases()[0];
    let (status, resp) = c.request("POST", path, body.clone()).await.unwrap();
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&resp).contains(uid.as_str()));

    let reviews = counts.reviews.load(Ordering::Relaxed) - warm_reviews;
    let failures = counts.failures.load(Ordering::Relaxed);
    println!(
        "soak {secs}s: {reviews} valid reviews ({} connections, {} connect errors), {failures} failures, {} garbage \
         connections, {} slow clients, {rotations} certificate rotations, {reloads} policy \
         reloads; RSS baseline {baseline} KiB, peak sampled {peak} KiB, high-water {hwm} KiB, \
         after {after} KiB",
        counts.reconnects.load(Ordering::Relaxed),
        counts.connect_errors.load(Ordering::Relaxed),
        counts.garbage.load(Ordering::Relaxed),
        counts.slow.load(Ordering::Relaxed),
    );
    assert_eq!(failures, 0, "every valid review gets its right answer");
    assert!(reviews > 0);
    // Memory comes back: allocators keep some of what they got, so the bound is loose
    // (baseline plus 64 MiB), but a leak per review or per connection would cross it.
    assert!(
        after <= baseline + 64 * 1024,
        "RSS {after} KiB after the run, {baseline} KiB before"
    );
}

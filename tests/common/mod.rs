//! Shared test support: the shipped policy and the apiserver's fixtures.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tollgate::server::{ActivePolicy, AppState, Limits};
use tollgate_core::Policy;

pub mod admission;
pub mod apiserver;
pub mod bin;
pub mod context;
pub mod envtest;
pub mod golden;
pub mod identity;
pub mod node;
pub mod policy;
pub mod rng;
pub mod scheduling;
pub mod tools;

/// A pod with no resources at all, which validation refuses.
pub const NOTEBOOK: &str = "apiVersion: v1
kind: Pod
metadata:
  name: notebook
spec:
  containers:
    - name: jupyter
      image: jupyter
";

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

/// `Policy::builtin()`, loaded once: a load checks each profile's additions against its
/// validation, which the generated cases (thousands of policies) need not repeat.
pub fn builtin_policy() -> Policy {
    static BUILTIN: std::sync::OnceLock<Policy> = std::sync::OnceLock::new();
    BUILTIN.get_or_init(Policy::builtin).clone()
}

/// Where a fixture of `tests/fixtures/apiserver-v1.36/` is.
pub fn fixture_path(name: &str) -> PathBuf {
    root().join("tests/fixtures/apiserver-v1.36").join(name)
}

pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixture_path(name)).unwrap()
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

/// A real server on 127.0.0.1 with throwaway certificates, and clients that speak to it.
pub mod net {

    /// Polls `f` every 25 ms until it holds; fails the test after 20 s, naming `what`.
    pub async fn until(what: &str, mut f: impl AsyncFnMut() -> bool) {
        let start = std::time::Instant::now();
        while !f().await {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(20),
                "timed out waiting for {what}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
    }

    /// `/readyz`: its status and body.
    pub async fn ready(c: &mut Client) -> (u16, String) {
        let (status, body) = c.request("GET", "/readyz", vec![]).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// One series of the server's metrics, scraped now.
    pub async fn metric(server: &TestServer, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let text = get_metrics(server.running.metrics_addr.unwrap()).await;
        super::scrape::value(&super::scrape::parse(&text), name, labels)
    }

    /// A review response's warnings, one per line.
    pub fn warnings(response: &serde_json::Value) -> String {
        response["warnings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    }
    use std::net::SocketAddr;
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::Duration;

    use axum::body::Bytes;
    use http_body_util::{BodyExt as _, Full};
    use hyper::client::conn::{http1, http2};
    use hyper::Request;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tempfile::TempDir;
    use tokio::net::TcpStream;
    use tokio_rustls::client::TlsStream;
    use tokio_rustls::TlsConnector;
    use tollgate::server::{Limits, Running, ServeOptions};

    pub struct TestServer {
        pub running: Running,
        pub dir: TempDir,
        pub ca_pem: String,
    }

    impl TestServer {
        pub fn addr(&self) -> SocketAddr {
            self.running.addr
        }
        pub fn cert_path(&self) -> PathBuf {
            self.dir.path().join("tls.crt")
        }
        pub fn key_path(&self) -> PathBuf {
            self.dir.path().join("tls.key")
        }
        pub fn policy_path(&self) -> PathBuf {
            self.dir.path().join("policy.yaml")
        }
    }

    /// Options for a test server: everything on loopback, fast reloads, no shutdown delay.
    pub fn options(dir: &std::path::Path) -> ServeOptions {
        ServeOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
            policy_path: Some(dir.join("policy.yaml")),
            cert_path: dir.join("tls.crt"),
            key_path: dir.join("tls.key"),
            self_managed: None,
            client_ca: None,
            cluster: None,
            audit: None,
            limits: Limits::default(),
            reload_interval: Duration::from_millis(50),
            shutdown_delay: Duration::ZERO,
            drain_timeout: Duration::from_secs(5),
        }
    }

    /// Starts a server with the shipped policy; `tweak` may change the options.
    pub async fn start(tweak: impl FnOnce(&mut ServeOptions)) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(super::default_policy_path(), dir.path().join("policy.yaml")).unwrap();
        let bundle =
            tollgate::certs::generate(&["localhost".into(), "127.0.0.1".into()], 1).unwrap();
        tollgate::certs::write(dir.path(), &bundle).unwrap();
        let mut opts = options(dir.path());
        tweak(&mut opts);
        let running = tollgate::server::start(opts).await.unwrap();
        TestServer {
            running,
            dir,
            ca_pem: bundle.ca_pem,
        }
    }

    pub fn client_config(
        ca_pem: &str,
        alpn: &[&[u8]],
        identity: Option<(&str, &str)>,
    ) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(tollgate::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let mut cfg = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(|c| c.unwrap())
                    .collect();
                let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
        };
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        cfg
    }

    pub async fn tls_connect(
        addr: SocketAddr,
        cfg: rustls::ClientConfig,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        tls_connect_to(addr, cfg, "localhost").await
    }

    /// [`tls_connect`] to a server whose certificate is for `name`.
    pub async fn tls_connect_to(
        addr: SocketAddr,
        cfg: rustls::ClientConfig,
        name: &str,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        TlsConnector::from(Arc::new(cfg))
            .connect(ServerName::try_from(name.to_owned()).unwrap(), tcp)
            .await
    }

    /// An HTTP client over one TLS connection, HTTP/1.1 or HTTP/2 as negotiated by ALPN.
    pub enum Client {
        H1(http1::SendRequest<Full<Bytes>>),
        H2(http2::SendRequest<Full<Bytes>>),
    }

    impl Client {
        pub async fn connect(addr: SocketAddr, ca_pem: &str, h2: bool) -> Client {
            let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
            Self::connect_with(addr, client_config(ca_pem, alpn, None))
                .await
                .unwrap()
        }

        pub async fn connect_with(
            addr: SocketAddr,
            cfg: rustls::ClientConfig,
        ) -> std::io::Result<Client> {
            Self::connect_to(addr, cfg, "localhost").await
        }

        /// [`Client::connect_with`] a server whose certificate is for `name` (a
        /// Service's, say).
        pub async fn connect_to(
            addr: SocketAddr,
            cfg: rustls::ClientConfig,
            name: &str,
        ) -> std::io::Result<Client> {
            let tls = tls_connect_to(addr, cfg, name).await?;
            let negotiated = tls.get_ref().1.alpn_protocol().map(|p| p.to_vec());
            let io = TokioIo::new(tls);
            if negotiated.as_deref() == Some(b"h2") {
                let (send, conn) = http2::handshake(TokioExecutor::new(), io)
                    .await
                    .map_err(std::io::Error::other)?;
                tokio::spawn(conn);
                Ok(Client::H2(send))
            } else {
                let (send, conn) = http1::handshake(io).await.map_err(std::io::Error::other)?;
                tokio::spawn(conn);
                Ok(Client::H1(send))
            }
        }

        pub fn is_h2(&self) -> bool {
            matches!(self, Client::H2(_))
        }

        pub async fn request(
            &mut self,
            method: &str,
            path: &str,
            body: Vec<u8>,
        ) -> hyper::Result<(u16, Vec<u8>)> {
            let mut req = Request::builder()
                .method(method)
                .uri(format!("https://localhost{path}"))
                .header("content-type", "application/json");
            if let Client::H1(_) = self {
                req = req.header("host", "localhost");
            }
            let req = req.body(Full::new(Bytes::from(body))).unwrap();
            let resp = match self {
                Client::H1(s) => {
                    s.ready().await?;
                    s.send_request(req).await?
                }
                Client::H2(s) => {
                    s.ready().await?;
                    s.send_request(req).await?
                }
            };
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await?.to_bytes().to_vec();
            Ok((status, body))
        }

        pub async fn post(&mut self, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
            self.request("POST", path, body).await.unwrap()
        }
    }

    /// GET on the plain-HTTP metrics port.
    pub async fn get_metrics(addr: SocketAddr) -> String {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) = http1::handshake(TokioIo::new(tcp)).await.unwrap();
        tokio::spawn(conn);
        let req = Request::get("/metrics")
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        String::from_utf8(
            resp.into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec(),
        )
        .unwrap()
    }
}

/// Reading the text exposition format: each sample as a name, its labels and its value.
pub mod scrape {
    use std::collections::BTreeMap;

    #[derive(Debug, Clone, PartialEq)]
    pub struct Sample {
        pub name: String,
        pub labels: BTreeMap<String, String>,
        pub value: f64,
    }

    /// Parses the samples, skipping comments. Label values here never hold `"`, `,` or `}`
    /// escaped, which keeps this small; a line it cannot read fails the test.
    pub fn parse(text: &str) -> Vec<Sample> {
        text.lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|line| {
                let (series, value) = line
                    .rsplit_once(' ')
                    .unwrap_or_else(|| panic!("no value: {line}"));
                let value: f64 = value
                    .parse()
                    .unwrap_or_else(|_| panic!("bad value: {line}"));
                let (name, labels) = match series.split_once('{') {
                    None => (series.to_owned(), BTreeMap::new()),
                    Some((name, rest)) => {
                        let inner = rest
                            .strip_suffix('}')
                            .unwrap_or_else(|| panic!("unclosed labels: {line}"));
                        let labels = inner
                            .split(',')
                            .filter(|kv| !kv.is_empty())
                            .map(|kv| {
                                let (k, v) = kv
                                    .split_once('=')
                                    .unwrap_or_else(|| panic!("bad label: {line}"));
                                (k.to_owned(), v.trim_matches('"').to_owned())
                            })
                            .collect();
                        (name.to_owned(), labels)
                    }
                };
                Sample {
                    name,
                    labels,
                    value,
                }
            })
            .collect()
    }

    /// The value of the one series with exactly these labels.
    pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }

    /// The sum over every series of `name` whose labels include these.
    pub fn sum(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
        samples
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    }

    pub fn names(samples: &[Sample]) -> std::collections::BTreeSet<String> {
        samples.iter().map(|s| s.name.clone()).collect()
    }
}

/// The real binary as a child process, with its log lines collected as they come.
pub mod process {
    use std::io::BufRead as _;
    use std::net::SocketAddr;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, ExitStatus, Stdio};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use tempfile::TempDir;

    pub struct Served {
        pub child: Child,
        pub dir: TempDir,
        pub ca_pem: String,
        pub addr: SocketAddr,
        /// None with `--metrics-listen off`.
        pub metrics_addr: Option<SocketAddr>,
        lines: Arc<Mutex<Vec<String>>>,
        reader: Option<std::thread::JoinHandle<()>>,
    }

    /// A directory with throwaway certificates and the shipped policy, as the server wants.
    pub fn workdir() -> (TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(super::default_policy_path(), dir.path().join("policy.yaml")).unwrap();
        let bundle =
            tollgate::certs::generate(&["localhost".into(), "127.0.0.1".into()], 1).unwrap();
        tollgate::certs::write(dir.path(), &bundle).unwrap();
        (dir, bundle.ca_pem)
    }

    /// `tollgate serve` on 127.0.0.1 (port 0, read back from the start-up log line) with the
    /// files in `dir`, the policy at `policy` (default: dir/policy.yaml), and `extra` flags.
    pub fn serve(
        dir: TempDir,
        ca_pem: String,
        policy: Option<&Path>,
        log_format: &str,
        extra: &[&str],
    ) -> Served {
        let policy: PathBuf = policy.map_or_else(|| dir.path().join("policy.yaml"), Path::to_owned);
        let mut cmd = super::bin::command();
        cmd.arg("serve").arg("--policy").arg(&policy);
        spawn(cmd, dir, ca_pem, log_format, extra)
    }

    /// [`serve`] without `--policy`, run from `dir`: the built-in policy, and no
    /// `policies/` directory anywhere the server could find one.
    pub fn serve_builtin(dir: TempDir, ca_pem: String, extra: &[&str]) -> Served {
        let mut cmd = super::bin::command();
        cmd.arg("serve").current_dir(dir.path());
        spawn(cmd, dir, ca_pem, "json", extra)
    }

    fn spawn(
        mut cmd: Command,
        dir: TempDir,
        ca_pem: String,
        log_format: &str,
        extra: &[&str],
    ) -> Served {
        cmd.arg("--tls-cert")
            .arg(dir.path().join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.path().join("tls.key"))
            .args(["--listen", "127.0.0.1:0", "--log-format", log_format])
            .args(extra)
            .env_remove("RUST_LOG")
            // As the image and the chart run it: the allocator's options are the binary's
            // own (src/main.rs), never the environment's.
            .env_remove("MIMALLOC_PURGE_DELAY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if !extra.contains(&"--metrics-listen") {
            cmd.args(["--metrics-listen", "off"]);
        }
        // No API server runs here; tests that want the cluster context pass their own.
        if !extra.contains(&"--cluster-context") {
            cmd.args(["--cluster-context", "off"]);
        }
        let mut child = cmd.spawn().expect("starting tollgate serve");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        let mut served = Served {
            child,
            dir,
            ca_pem,
            addr: "127.0.0.1:0".parse().unwrap(),
            metrics_addr: None,
            lines,
            reader: Some(reader),
        };
        let start = Instant::now();
        let line = loop {
            if let Some(l) = served
                .lines()
                .into_iter()
                .find(|l| l.contains("tollgate serving"))
            {
                break l;
            }
            if let Ok(Some(status)) = served.child.try_wait() {
                panic!("tollgate exited with {status}: {:#?}", served.lines());
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "tollgate did not start: {:#?}",
                served.lines()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        served.addr = field_addr(&line, "addr").expect("serving address in the log");
        served.metrics_addr = field_addr(&line, "metrics");
        served
    }

    /// `key=127.0.0.1:PORT` (text) or `"key":"127.0.0.1:PORT"` (JSON).
    fn field_addr(line: &str, key: &str) -> Option<SocketAddr> {
        for pat in [format!("{key}="), format!("\"{key}\":\"")] {
            if let Some(i) = line.find(&pat) {
                let rest = &line[i + pat.len()..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
                    .unwrap_or(rest.len());
                return rest[..end].parse().ok();
            }
        }
        None
    }

    impl Served {
        pub fn pid(&self) -> u32 {
            self.child.id()
        }

        pub fn lines(&self) -> Vec<String> {
            self.lines.lock().unwrap().clone()
        }

        /// The log lines that parse as JSON.
        pub fn json_lines(&self) -> Vec<serde_json::Value> {
            self.lines()
                .iter()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        }

        /// Waits (bounded) until a log line satisfies `pred`, and returns it.
        pub async fn wait_for_line(&self, pred: impl Fn(&str) -> bool) -> String {
            let start = Instant::now();
            loop {
                if let Some(l) = self.lines().into_iter().find(|l| pred(l)) {
                    return l;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "no such log line in: {:#?}",
                    self.lines()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }

        /// Sends a signal with kill(1): no unsafe code for libc::kill.
        pub fn signal(&self, name: &str) {
            let status = Command::new("kill")
                .arg(format!("-{name}"))
                .arg(self.pid().to_string())
                .status()
                .expect("running kill");
            assert!(status.success(), "kill -{name} failed");
        }

        /// Waits (bounded by `limit`) for the process to exit, and for its last log lines.
        pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
            let start = Instant::now();
            while start.elapsed() < limit {
                if let Some(s) = self.child.try_wait().unwrap() {
                    // The pipe is at EOF once the process is gone: the reader ends at once.
                    if let Some(r) = self.reader.take() {
                        let _ = r.join();
                    }
                    return Some(s);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            None
        }
    }

    impl Drop for Served {
        fn drop(&mut self) {
            // Only our own child, by its handle; a failed test must not leave it running.
            if let Ok(None) = self.child.try_wait() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

/// A review sent by hand over HTTP/1.1: headers and half the body now, the rest later, so
/// that a test can act while the server holds a review in flight.
pub mod slow {
    use std::net::SocketAddr;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;
    use tokio_rustls::client::TlsStream;

    pub struct SlowReview {
        tls: TlsStream<TcpStream>,
        rest: Vec<u8>,
    }

    pub async fn start(addr: SocketAddr, ca_pem: &str, path: &str, body: &[u8]) -> SlowReview {
        let cfg = super::net::client_config(ca_pem, &[b"http/1.1"], None);
        let mut tls = super::net::tls_connect(addr, cfg).await.unwrap();
        let half = body.len() / 2;
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.write_all(&body[..half]).await.unwrap();
        tls.flush().await.unwrap();
        SlowReview {
            tls,
            rest: body[half..].to_vec(),
        }
    }

    impl SlowReview {
        /// Sends the rest of the body and reads the response: status, whether the server
        /// said it will close the connection, and the body.
        pub async fn finish(&mut self) -> (u16, bool, Vec<u8>) {
            let rest = std::mem::take(&mut self.rest);
            self.tls.write_all(&rest).await.unwrap();
            self.tls.flush().await.unwrap();
            let read = async {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let status: u16 = head[9..12].parse().unwrap();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map(|v| v.trim().parse().unwrap())
                            .unwrap_or(0);
                        let close = head.lines().any(|l| l == "connection: close");
                        if buf.len() >= end + 4 + len {
                            return (status, close, buf[end + 4..end + 4 + len].to_vec());
                        }
                    }
                    let n = self.tls.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "connection closed before a full response: {buf:?}");
                    buf.extend_from_slice(&chunk[..n]);
                }
            };
            tokio::time::timeout(Duration::from_secs(20), read)
                .await
                .expect("a response within the safety bound")
        }

        /// After the response: true once the server has closed the connection.
        pub async fn closed_by_server(&mut self) -> bool {
            let mut b = [0u8; 1];
            matches!(
                tokio::time::timeout(Duration::from_secs(10), self.tls.read(&mut b)).await,
                Ok(Ok(0)) | Ok(Err(_))
            )
        }
    }
}

/// RBAC as rendered: the grants of the Roles and ClusterRoles bound to a service account,
/// to compare with what the real apiserver grants (SelfSubjectRulesReview) and what the
/// code needs.
pub mod rbac {

    use std::process::Command;

    use serde_json::Value;

    /// (the namespace a Role's grant holds in, None for a ClusterRole's; apiGroup/resource;
    /// verb; the resourceName it is limited to, None for any).
    pub type Grant = (Option<String>, String, String, Option<String>);

    /// `kubectl kustomize DIR` (relative to the repository), or None with a line on stderr
    /// when no kubectl can be had.
    pub fn render_if_kubectl(dir: &str) -> Option<Vec<Value>> {
        let out = Command::new(super::tools::kubectl()?)
            .arg("kustomize")
            .arg(super::root().join(dir))
            .output()
            .expect("running kubectl kustomize");
        assert!(
            out.status.success(),
            "kubectl kustomize {dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap())
    }

    /// The grants of every Role and ClusterRole bound to `sa` of `namespace`.
    pub fn grants(docs: &[Value], sa: &str, namespace: &str) -> Vec<Grant> {
        let bound = |kind: &str, name: &str, ns: Option<&str>| {
            docs.iter().any(|b| {
                b["kind"]
                    == if kind == "Role" {
                        "RoleBinding"
                    } else {
                        "ClusterRoleBinding"
                    }
                    && b["roleRef"]["kind"] == kind
                    && b["roleRef"]["name"] == name
                    && ns.is_none_or(|n| b["metadata"]["namespace"] == n)
                    && b["subjects"].as_array().into_iter().flatten().any(|s| {
                        s["kind"] == "ServiceAccount"
                            && s["name"] == sa
                            && s["namespace"] == namespace
                    })
            })
        };
        let mut out = vec![];
        for role in docs
            .iter()
            .filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole")
        {
            let kind = role["kind"].as_str().unwrap();
            let name = role["metadata"]["name"].as_str().unwrap();
            let ns = role["metadata"]["namespace"].as_str();
            if !bound(kind, name, ns) {
                continue;
            }
            for rule in role["rules"].as_array().into_iter().flatten() {
                let names: Vec<Option<String>> = match rule["resourceNames"].as_array() {
                    Some(n) => n
                        .iter()
                        .map(|x| Some(x.as_str().unwrap().to_owned()))
                        .collect(),
                    None => vec![None],
                };
                for g in rule["apiGroups"].as_array().into_iter().flatten() {
                    for r in rule["resources"].as_array().into_iter().flatten() {
                        for v in rule["verbs"].as_array().into_iter().flatten() {
                            for n in &names {
                                out.push((
                                    ns.map(str::to_owned),
                                    format!("{}/{}", g.as_str().unwrap(), r.as_str().unwrap()),
                                    v.as_str().unwrap().to_owned(),
                                    n.clone(),
                                ));
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

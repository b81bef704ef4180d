//! Load benchmark: the real `tollgate serve` (release build, TLS on loopback, the shipped
//! policy) as a child process, driven by N concurrent clients for T seconds over HTTP/1.1
//! and HTTP/2, against a floor: the same binary with the hidden `--floor` flag, which
//! serves through the very same TLS, accept loop and hyper-util builder but answers every
//! review with a constant "allowed" without parsing it.
//!
//! ```text
//! cargo bench --bench load -- --concurrency 16 --seconds 10
//! ```
//!
//! Options (all optional): `--concurrency N` (16), `--seconds T` (10), `--warmup S` (1),
//! `--streams K` HTTP/2 requests in flight per connection (1), `--protocols h1,h2`,
//! `--servers tollgate,floor`, `--rounds R` (1; with more, servers alternate and medians
//! are reported), `--client-threads N` (2), `--fixture FILE` (under
//! tests/fixtures/apiserver-v1.36/, default resnet50-worker-generatename.mutate.json),
//! `--max-requests N` per run (5,000,000), `--baseline PATH` another tollgate binary to run
//! alongside (e.g. a build of an older commit), `--as-is` to post the fixture file byte for
//! byte (it is pretty-printed; by default it goes as compact JSON, as the apiserver sends it). Set `TOKIO_WORKER_THREADS` to change the
//! server's worker count. Traffic goes to 127.0.0.1 only; every run stops by itself.
//!
//! See benches/README.md.

use std::io::{BufRead as _, BufReader, Read as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::{http1, http2};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

#[derive(Debug, Clone)]
struct Opts {
    concurrency: usize,
    seconds: f64,
    warmup: f64,
    streams: usize,
    protocols: Vec<Proto>,
    servers: Vec<Server>,
    rounds: usize,
    client_threads: usize,
    fixture: String,
    max_requests: u64,
    baseline: Option<PathBuf>,
    /// Post the fixture file byte for byte (pretty-printed) rather than as compact JSON.
    as_is: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    H1,
    H2,
}

impl Proto {
    fn as_str(self) -> &'static str {
        match self {
            Proto::H1 => "h1",
            Proto::H2 => "h2",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    Tollgate,
    Floor,
    /// Another build of tollgate (`--baseline PATH`), to compare before and after.
    Baseline,
}

impl Server {
    fn as_str(self) -> &'static str {
        match self {
            Server::Tollgate => "tollgate",
            Server::Floor => "floor",
            Server::Baseline => "baseline",
        }
    }
}

fn usage(msg: &str) -> ! {
    eprintln!("load: {msg}\nsee the header of benches/load.rs or benches/README.md");
    std::process::exit(2)
}

fn parse_args() -> Opts {
    let mut o = Opts {
        concurrency: 16,
        seconds: 10.0,
        warmup: 1.0,
        streams: 1,
        protocols: vec![Proto::H1, Proto::H2],
        servers: vec![Server::Floor, Server::Tollgate],
        rounds: 1,
        client_threads: 2,
        fixture: "resnet50-worker-generatename.mutate.json".into(),
        max_requests: 5_000_000,
        baseline: None,
        as_is: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        let num = |v: String| -> f64 {
            v.parse()
                .unwrap_or_else(|_| usage(&format!("{a}: {v:?} is not a number")))
        };
        match a.as_str() {
            "--concurrency" | "-c" => o.concurrency = num(value()) as usize,
            "--seconds" | "-t" => o.seconds = num(value()),
            "--warmup" => o.warmup = num(value()),
            "--streams" => o.streams = num(value()) as usize,
            "--rounds" => o.rounds = num(value()) as usize,
            "--client-threads" => o.client_threads = num(value()) as usize,
            "--max-requests" => o.max_requests = num(value()) as u64,
            "--fixture" => o.fixture = value(),
            "--baseline" => o.baseline = Some(PathBuf::from(value())),
            "--as-is" => o.as_is = true,
            "--protocols" => {
                o.protocols = value()
                    .split(',')
                    .map(|p| match p {
                        "h1" => Proto::H1,
                        "h2" => Proto::H2,
                        _ => usage(&format!("unknown protocol {p:?} (h1, h2)")),
                    })
                    .collect()
            }
            "--servers" => {
                o.servers = value()
                    .split(',')
                    .map(|p| match p {
                        "tollgate" => Server::Tollgate,
                        "floor" => Server::Floor,
                        "baseline" => Server::Baseline,
                        _ => usage(&format!("unknown server {p:?} (tollgate, floor, baseline)")),
                    })
                    .collect()
            }
            // What `cargo bench` passes to every bench target.
            "--bench" => {}
            _ => usage(&format!("unknown argument {a:?}")),
        }
    }
    if o.baseline.is_some() && !o.servers.contains(&Server::Baseline) {
        o.servers.push(Server::Baseline);
    }
    if o.concurrency == 0 || o.streams == 0 || o.rounds == 0 || o.client_threads == 0 {
        usage("counts must be at least 1");
    }
    if !(o.seconds > 0.0 && o.seconds <= 600.0) {
        usage("--seconds must be in (0, 600]");
    }
    o
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A `tollgate serve` child process on 127.0.0.1.
struct ServerProcess {
    child: Child,
    addr: SocketAddr,
    log_bytes: Arc<AtomicU64>,
}

impl ServerProcess {
    fn start(kind: Server, dir: &Path, baseline: Option<&Path>) -> ServerProcess {
        // A free port: bind, note it and let it go (the server binds it right after).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let bin = match (kind, baseline) {
            (Server::Baseline, Some(b)) => b.to_owned(),
            (Server::Baseline, None) => usage("--servers baseline needs --baseline PATH"),
            _ => PathBuf::from(env!("CARGO_BIN_EXE_tollgate")),
        };
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--policy")
            .arg(root().join("policies/default.yaml"))
            .arg("--tls-cert")
            .arg(dir.join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.join("tls.key"))
            .args(["--listen", &addr.to_string(), "--metrics-listen", "off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if kind == Server::Floor {
            cmd.arg("--floor");
        }
        // No API server here: builds that watch one by default are told not to (a baseline
        // from before the cluster context does not know the flag).
        if knows_flag(cmd.get_program(), "--cluster-context") {
            cmd.args(["--cluster-context", "off"]);
        }
        let mut child = cmd.spawn().expect("starts tollgate serve");
        // The JSON logs go to a pipe that is read and thrown away, as a log collector would.
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                let _ = child.kill();
                panic!("tollgate serve exited before serving");
            }
            if line.contains("tollgate serving") {
                break;
            }
        }
        let log_bytes = Arc::new(AtomicU64::new(0));
        let counter = log_bytes.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                counter.fetch_add(n as u64, Ordering::Relaxed);
            }
        });
        ServerProcess {
            child,
            addr,
            log_bytes,
        }
    }

    fn status_kib(&self, field: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// User plus system CPU time of the server so far.
    fn cpu_seconds(&self) -> f64 {
        let text =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
        let after = text.rsplit_once(')').map(|x| x.1).unwrap_or("");
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        // Linux reports in USER_HZ, 100 on every mainstream configuration.
        (ticks(11) + ticks(12)) / 100.0
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client_config(ca_pem: &str, proto: Proto) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(tollgate::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![match proto {
        Proto::H1 => b"http/1.1".to_vec(),
        Proto::H2 => b"h2".to_vec(),
    }];
    Arc::new(cfg)
}

enum Conn {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

async fn connect(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>, proto: Proto) -> Conn {
    let tcp = TcpStream::connect(addr).await.expect("connects");
    tcp.set_nodelay(true).unwrap();
    let tls = TlsConnector::from(cfg)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake");
    let io = TokioIo::new(tls);
    match proto {
        Proto::H1 => {
            let (send, conn) = http1::handshake(io).await.expect("HTTP/1.1 handshake");
            tokio::spawn(conn);
            Conn::H1(send)
        }
        Proto::H2 => {
            let (send, conn) = http2::handshake(TokioExecutor::new(), io)
                .await
                .expect("HTTP/2 handshake");
            tokio::spawn(conn);
            Conn::H2(send)
        }
    }
}

/// What the apiserver sends: `POST /mutate?timeout=10s` with a JSON body.
fn request(path: &str, body: &Bytes, proto: Proto) -> Request<Full<Bytes>> {
    let mut r = Request::post(format!("https://localhost{path}?timeout=10s"))
        .header("content-type", "application/json")
        .header("accept", "application/json, */*")
        .header("user-agent", "kube-apiserver-admission");
    if proto == Proto::H1 {
        r = r.header("host", "localhost");
    }
    r.body(Full::new(body.clone())).unwrap()
}

async fn send(conn: &mut Conn, req: Request<Full<Bytes>>) -> Result<(u16, Bytes), String> {
    let resp = match conn {
        Conn::H1(s) => {
            s.ready().await.map_err(|e| e.to_string())?;
            s.send_request(req).await
        }
        Conn::H2(s) => {
            s.ready().await.map_err(|e| e.to_string())?;
            s.send_request(req).await
        }
    }
    .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body))
}

struct Shared {
    /// Set once the warm-up is over: from then on latencies are recorded.
    measuring: AtomicBool,
    stop: AtomicBool,
    started: AtomicU64,
    errors: AtomicU64,
    max_requests: u64,
}

/// One client's loop: requests back to back, latencies in microseconds.
async fn worker(
    mut conn: Conn,
    path: String,
    body: Bytes,
    proto: Proto,
    shared: Arc<Shared>,
) -> Vec<u32> {
    let mut lat = Vec::with_capacity(1 << 16);
    while !shared.stop.load(Ordering::Relaxed) {
        let measuring = shared.measuring.load(Ordering::Relaxed);
        if measuring && shared.started.fetch_add(1, Ordering::Relaxed) >= shared.max_requests {
            break;
        }
        let t = Instant::now();
        let ok = matches!(
            send(&mut conn, request(&path, &body, proto)).await,
            Ok((200, _))
        );
        let us = t.elapsed().as_micros().min(u32::MAX as u128) as u32;
        if measuring {
            if ok {
                lat.push(us);
            } else {
                shared.errors.fetch_add(1, Ordering::Relaxed);
            }
        } else if !ok {
            // Warm-up errors are as fatal as later ones: count them too.
            shared.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
    lat
}

#[derive(Debug, Clone, Default)]
struct RunResult {
    rps: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
    requests: u64,
    errors: u64,
    hwm_kib: u64,
    cpu_us_per_req: f64,
    log_bytes_per_req: f64,
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64
}

fn run_one(
    o: &Opts,
    kind: Server,
    proto: Proto,
    dir: &Path,
    ca_pem: &str,
    body: &Bytes,
    path: &str,
) -> RunResult {
    let server = ServerProcess::start(kind, dir, o.baseline.as_deref());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(o.client_threads)
        .enable_all()
        .build()
        .unwrap();
    let cfg = client_config(ca_pem, proto);
    let addr = server.addr;

    // Check the answer once, fully, before loading the server.
    let first = rt.block_on(async {
        let mut c = connect(addr, cfg.clone(), proto).await;
        send(&mut c, request(path, body, proto)).await
    });
    match &first {
        Ok((200, b)) => {
            let v: serde_json::Value = serde_json::from_slice(b).expect("a JSON answer");
            assert_eq!(
                v.pointer("/response/allowed"),
                Some(&serde_json::Value::Bool(true)),
                "{}: {v}",
                kind.as_str()
            );
            if kind != Server::Floor && path == "/mutate" {
                assert!(
                    v.pointer("/response/patch").is_some(),
                    "tollgate must patch the fixture: {v}"
                );
            }
        }
        other => panic!("{} answered {other:?}", kind.as_str()),
    }

    let shared = Arc::new(Shared {
        measuring: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        started: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        max_requests: o.max_requests,
    });
    let (lat, elapsed, cpu) = rt.block_on(async {
        let mut tasks = vec![];
        for _ in 0..o.concurrency {
            let conn = connect(addr, cfg.clone(), proto).await;
            // HTTP/2: several streams share the connection (clones of one SendRequest).
            let per_conn = if proto == Proto::H2 { o.streams } else { 1 };
            let mut conns = vec![conn];
            for _ in 1..per_conn {
                if let Conn::H2(s) = &conns[0] {
                    let s = s.clone();
                    conns.push(Conn::H2(s));
                }
            }
            for conn in conns {
                tasks.push(tokio::spawn(worker(
                    conn,
                    path.to_owned(),
                    body.clone(),
                    proto,
                    shared.clone(),
                )));
            }
        }
        tokio::time::sleep(Duration::from_secs_f64(o.warmup)).await;
        let cpu0 = server.cpu_seconds();
        shared.measuring.store(true, Ordering::Relaxed);
        let t0 = Instant::now();
        // Ends at the deadline, or earlier once the request cap is reached.
        let deadline = t0 + Duration::from_secs_f64(o.seconds);
        while Instant::now() < deadline && shared.started.load(Ordering::Relaxed) < o.max_requests {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shared.stop.store(true, Ordering::Relaxed);
        let elapsed = t0.elapsed();
        let cpu = server.cpu_seconds() - cpu0;
        let mut all = vec![];
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        (all, elapsed, cpu)
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    let mut lat = lat;
    lat.sort_unstable();
    let n = lat.len() as u64;
    let hwm = server.status_kib("VmHWM:");
    let logs = server.log_bytes.load(Ordering::Relaxed);
    RunResult {
        rps: n as f64 / elapsed.as_secs_f64(),
        p50: percentile(&lat, 50.0),
        p99: percentile(&lat, 99.0),
        p999: percentile(&lat, 99.9),
        max: lat.last().copied().unwrap_or(0) as f64,
        requests: n,
        errors: shared.errors.load(Ordering::Relaxed),
        hwm_kib: hwm,
        cpu_us_per_req: cpu * 1e6 / n.max(1) as f64,
        log_bytes_per_req: logs as f64 / n.max(1) as f64,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn combine(runs: &[RunResult]) -> RunResult {
    let m = |f: fn(&RunResult) -> f64| median(runs.iter().map(f).collect());
    RunResult {
        rps: m(|r| r.rps),
        p50: m(|r| r.p50),
        p99: m(|r| r.p99),
        p999: m(|r| r.p999),
        max: m(|r| r.max),
        requests: runs.iter().map(|r| r.requests).sum(),
        errors: runs.iter().map(|r| r.errors).sum(),
        hwm_kib: runs.iter().map(|r| r.hwm_kib).max().unwrap_or(0),
        cpu_us_per_req: m(|r| r.cpu_us_per_req),
        log_bytes_per_req: m(|r| r.log_bytes_per_req),
    }
}

fn main() {
    let o = parse_args();
    let fixture_path = root()
        .join("tests/fixtures/apiserver-v1.36")
        .join(&o.fixture);
    let file = std::fs::read(&fixture_path)
        .unwrap_or_else(|e| usage(&format!("{}: {e}", fixture_path.display())));
    // The fixtures are pretty-printed for reading; the apiserver sends compact JSON.
    let body = Bytes::from(if o.as_is {
        file
    } else {
        let v: serde_json::Value = serde_json::from_slice(&file)
            .unwrap_or_else(|e| usage(&format!("{}: {e}", fixture_path.display())));
        serde_json::to_vec(&v).unwrap()
    });
    let path = if o.fixture.contains(".validate") {
        "/validate"
    } else {
        "/mutate"
    };
    let dir = tempfile::tempdir().unwrap();
    let bundle = tollgate::certs::generate(&["localhost".into(), "127.0.0.1".into()], 1).unwrap();
    tollgate::certs::write(dir.path(), &bundle).unwrap();

    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load: {} {} ({} bytes) x{} clients{}, {}s (+{}s warm-up), {} round(s); \
         {cores} CPUs ({cpu}), loadavg {}; client threads {}, server workers {}",
        path,
        o.fixture,
        body.len(),
        o.concurrency,
        if o.streams > 1 {
            format!(" x{} h2 streams", o.streams)
        } else {
            String::new()
        },
        o.seconds,
        o.warmup,
        o.rounds,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        o.client_threads,
        std::env::var("TOKIO_WORKER_THREADS").unwrap_or_else(|_| "default".into()),
    );
    println!(
        "{:<6} {:<9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>9} {:>8} {:>7}",
        "proto",
        "server",
        "req/s",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "requests",
        "errors",
        "peak RSS",
        "cpu us/r",
        "log B/r"
    );
    let mut failed = false;
    for &proto in &o.protocols {
        let mut results: Vec<(Server, Vec<RunResult>)> =
            o.servers.iter().map(|&s| (s, vec![])).collect();
        for round in 0..o.rounds {
            // Alternate the order between rounds, so that drift on a busy machine is shared.
            let mut order: Vec<usize> = (0..results.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let kind = results[i].0;
                let r = run_one(&o, kind, proto, dir.path(), &bundle.ca_pem, &body, path);
                if o.rounds > 1 {
                    eprintln!(
                        "  round {} {} {}: {:.0} req/s, p99 {:.0} us",
                        round + 1,
                        proto.as_str(),
                        kind.as_str(),
                        r.rps,
                        r.p99
                    );
                }
                results[i].1.push(r);
            }
        }
        let mut combined = vec![];
        for (kind, runs) in &results {
            let r = combine(runs);
            println!(
                "{:<6} {:<9} {:>9.0} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>9} {:>7} {:>5.1} MiB {:>8.1} {:>7.0}",
                proto.as_str(),
                kind.as_str(),
                r.rps,
                r.p50,
                r.p99,
                r.p999,
                r.max,
                r.requests,
                r.errors,
                r.hwm_kib as f64 / 1024.0,
                r.cpu_us_per_req,
                r.log_bytes_per_req,
            );
            failed |= r.errors > 0;
            combined.push((*kind, r));
        }
        let get = |k: Server| combined.iter().find(|(s, _)| *s == k).map(|x| &x.1);
        for kind in [Server::Baseline, Server::Tollgate] {
            if let (Some(t), Some(f)) = (get(kind), get(Server::Floor)) {
                println!(
                    "{:<6} {}/floor: throughput {:.2} (target >= 0.80), p99 {:.2} (target <= 1.25), server CPU per request {:.2}",
                    proto.as_str(),
                    kind.as_str(),
                    t.rps / f.rps,
                    t.p99 / f.p99,
                    t.cpu_us_per_req / f.cpu_us_per_req,
                );
            }
        }
    }
    if failed {
        eprintln!("load: some requests failed");
        std::process::exit(1);
    }
}

/// Whether `tollgate serve --help` of the binary `bin` lists `flag`.
fn knows_flag(bin: &std::ffi::OsStr, flag: &str) -> bool {
    Command::new(bin)
        .args(["serve", "--help"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
}

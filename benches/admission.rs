//! A pod create through the real kube-apiserver (envtest's v1.36, as the tests find it:
//! `KUBEBUILDER_ASSETS`, else `../shared/envtest/bin`; without it the bench says SKIPPED
//! and ends), side by side:
//!
//! - `none`: no admission of tollgate's (the floor: decoding, defaulting, the apiserver's
//!   own plugins, a dry-run write);
//! - `policies`: the exported MutatingAdmissionPolicies and ValidatingAdmissionPolicies of
//!   the shipped policy (`tollgate export ... | kubectl apply`), no webhook;
//! - `webhook`: `tollgate serve` (this build, with dev certificates) registered as shipped
//!   (`tollgate register --url`), no policies.
//!
//! Each sends the same GPU training pod (tests/fixtures/apiserver-v1.36/
//! resnet50-master-0.mutate.json's) `--requests N` times (300) with `dryRun=All`, one at a
//! time and then `--concurrency C` (8) at once, and prints the latency's median, p95 and
//! mean and the rate. Traffic stays on 127.0.0.1.
//!
//! ```text
//! cargo bench --bench admission -- --requests 300 --concurrency 8
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn assets() -> Option<PathBuf> {
    let dir = std::env::var_os("KUBEBUILDER_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/envtest/bin"));
    (dir.join("kube-apiserver").exists() && dir.join("etcd").exists()).then_some(dir)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let Some(bin) = assets() else {
        eprintln!("SKIPPED admission bench: no kube-apiserver and etcd (set KUBEBUILDER_ASSETS)");
        return;
    };
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("SKIPPED admission bench: openssl is needed for the ServiceAccount key");
        return;
    }
    let requests = arg("--requests", 300);
    let concurrency = arg("--concurrency", 8);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = |cmd: &mut Command| assert!(cmd.status().unwrap().success(), "{cmd:?}");
    run(Command::new("openssl")
        .args(["genrsa", "-out"])
        .arg(d.join("sa.key"))
        .arg("2048")
        .stderr(Stdio::null()));
    run(Command::new("openssl")
        .args(["rsa", "-pubout", "-in"])
        .arg(d.join("sa.key"))
        .arg("-out")
        .arg(d.join("sa.pub"))
        .stderr(Stdio::null()));
    std::fs::write(d.join("tokens.csv"), "bench,admin,1,\"system:masters\"\n").unwrap();
    let (etcd_port, peer_port, api_port, hook_port) =
        (free_port(), free_port(), free_port(), free_port());
    let log = |name: &str| std::fs::File::create(d.join(name)).unwrap();
    let mut procs = Procs(vec![]);
    procs.0.push(
        Command::new(bin.join("etcd"))
            .arg("--data-dir")
            .arg(d.join("etcd"))
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{etcd_port}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{etcd_port}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-cluster",
                &format!("default=http://127.0.0.1:{peer_port}"),
            ])
            .stdout(log("etcd.log"))
            .stderr(log("etcd.err"))
            .spawn()
            .unwrap(),
    );
    procs.0.push(
        Command::new(bin.join("kube-apiserver"))
            .args([
                "--etcd-servers",
                &format!("http://127.0.0.1:{etcd_port}"),
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
                "--secure-port",
                &api_port.to_string(),
                "--service-cluster-ip-range",
                "10.0.0.0/24",
                "--service-account-issuer",
                "https://kubernetes.default.svc",
                "--authorization-mode",
                "RBAC",
                "--endpoint-reconciler-type",
                "none",
                "--disable-admission-plugins",
                "ServiceAccount",
            ])
            .arg("--cert-dir")
            .arg(d.join("certs"))
            .arg("--service-account-key-file")
            .arg(d.join("sa.pub"))
            .arg("--service-account-signing-key-file")
            .arg(d.join("sa.key"))
            .arg("--token-auth-file")
            .arg(d.join("tokens.csv"))
            .stdout(log("apiserver.log"))
            .stderr(log("apiserver.err"))
            .spawn()
            .unwrap(),
    );
    let kubeconfig = d.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"https://127.0.0.1:{api_port}\", insecure-skip-tls-verify: true}}}}]\n\
             users: [{{name: u, user: {{token: bench}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let started = Instant::now();
        while client.apiserver_version().await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the apiserver did not start"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
        for ns in ["bench", "default"] {
            let n = serde_json::from_value(json!({"metadata": {"name": ns,
                "labels": {"tollgate.dev/enforce": "enabled"}}}))
            .unwrap();
            let _ = namespaces.create(&PostParams::default(), &n).await;
        }
        let review: Value = serde_json::from_str(include_str!(
            "../tests/fixtures/apiserver-v1.36/resnet50-master-0.mutate.json"
        ))
        .unwrap();
        let mut pod = review["request"]["object"].clone();
        pod["metadata"] = json!({"name": "resnet50-master-0", "namespace": "bench",
            "labels": pod["metadata"]["labels"].clone()});
        let pod: Pod = serde_json::from_value(pod).unwrap();
        let pods = Api::<Pod>::namespaced(client.clone(), "bench");
        let tollgate = env!("CARGO_BIN_EXE_tollgate");
        let kubectl = |args: &[&str], input: Option<Vec<u8>>| {
            let mut c = Command::new("kubectl");
            c.arg("--kubeconfig").arg(&kubeconfig).args(args);
            c.stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut child = c.spawn().expect("kubectl");
            if let Some(i) = input {
                use std::io::Write as _;
                child.stdin.take().unwrap().write_all(&i).unwrap();
            }
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "kubectl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let mut rows = vec![];
        rows.push((
            "none",
            measure(&pods, &pod, requests, concurrency, None).await,
        ));
        // The exported policies, no webhook.
        let mut yaml = vec![];
        for what in ["mutating-admission-policy", "validating-admission-policy"] {
            let out = Command::new(tollgate)
                .args(["export", what])
                .output()
                .unwrap();
            assert!(out.status.success());
            yaml.extend(out.stdout);
            yaml.extend(b"\n---\n");
        }
        kubectl(&["apply", "-f", "-"], Some(yaml.clone()));
        rows.push((
            "policies",
            measure(
                &pods,
                &pod,
                requests,
                concurrency,
                Some("tollgate.dev/applied"),
            )
            .await,
        ));
        kubectl(&["delete", "-f", "-"], Some(yaml));
        // The webhook, as registered by `tollgate register --url`, no policies.
        let certs = d.join("webhook");
        std::fs::create_dir_all(&certs).unwrap();
        let mut serve = Command::new(tollgate);
        serve
            .current_dir(&certs)
            .args([
                "serve",
                "--dev",
                "--listen",
                &format!("127.0.0.1:{hook_port}"),
            ])
            .args(["--metrics-listen", "off", "--log-format", "json"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        procs.0.push(serve.spawn().unwrap());
        let ca = certs.join("certs/dev/ca.crt");
        let waited = Instant::now();
        while !ca.exists() {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "tollgate serve --dev made no CA"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let out = Command::new(tollgate)
            .args([
                "register",
                "--url",
                &format!("https://127.0.0.1:{hook_port}"),
            ])
            .arg("--ca-file")
            .arg(&ca)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "register: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        rows.push((
            "webhook",
            measure(
                &pods,
                &pod,
                requests,
                concurrency,
                Some("tollgate.dev/applied"),
            )
            .await,
        ));
        println!(
            "pod create (dryRun=All) through kube-apiserver v1.36, {requests} requests per row"
        );
        println!("| admission | one at a time: p50 | p95 | mean | {concurrency} at once: pods/s |");
        println!("|---|---|---|---|---|");
        for (name, m) in rows {
            println!(
                "| {name} | {:.2} ms | {:.2} ms | {:.2} ms | {:.0} |",
                m.p50, m.p95, m.mean, m.rate
            );
        }
    });
    drop(procs);
}

struct Measured {
    p50: f64,
    p95: f64,
    mean: f64,
    rate: f64,
}

/// The pod created `n` times one at a time, then `n` times `concurrency` at once, once
/// `mark` (an annotation) comes back on it (the admission in force).
async fn measure(
    pods: &Api<Pod>,
    pod: &Pod,
    n: usize,
    concurrency: usize,
    mark: Option<&str>,
) -> Measured {
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    if let Some(mark) = mark {
        let started = Instant::now();
        loop {
            let got = pods.create(&dry, pod).await;
            if got.as_ref().is_ok_and(|p| {
                p.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(mark))
            }) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "admission not in force within 60 s: {got:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    for _ in 0..20 {
        pods.create(&dry, pod).await.unwrap();
    }
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        pods.create(&dry, pod).await.unwrap();
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..concurrency {
        let (pods, pod, dry) = (pods.clone(), pod.clone(), dry.clone());
        let count = n / concurrency + usize::from(w < n % concurrency);
        set.spawn(async move {
            for _ in 0..count {
                pods.create(&dry, &pod).await.unwrap();
            }
        });
    }
    while set.join_next().await.is_some() {}
    Measured {
        p50: ms[ms.len() / 2],
        p95: ms[ms.len() * 95 / 100],
        mean: ms.iter().sum::<f64>() / ms.len() as f64,
        rate: n as f64 / started.elapsed().as_secs_f64(),
    }
}

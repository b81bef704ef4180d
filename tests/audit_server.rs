//! `serve --audit-interval`: the background audit against the in-process apiserver
//! stand-in. PolicyReports created, updated and removed as the cluster changes; the
//! `tollgate_audit_*` metrics; one writer at a time under the Lease, with two servers on
//! one stand-in told apart by their bearer tokens in its request log; the pacing.

use crate::common;

use std::time::{Duration, Instant};

use apiserver::{ApiServer, RequestRecord, Verb};
use common::net::{self, TestServer};
use serde_json::{json, Value};
use tollgate::server::{AuditOptions, ClusterOptions};
use tollgate_apiserver_standin as apiserver;

fn pod(ns: &str, name: &str, containers: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"nodeName": "node-1", "containers": containers},
        "status": {"phase": "Running"}})
}

fn notebook(ns: &str, name: &str) -> Value {
    pod(ns, name, json!([{"name": "jupyter", "image": "j"}]))
}

fn sized(ns: &str, name: &str) -> Value {
    pod(
        ns,
        name,
        json!([{"name": "app", "image": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]),
    )
}

fn trainer(ns: &str, name: &str) -> Value {
    let mut p = pod(
        ns,
        name,
        json!([{"name": "pytorch", "image": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
    );
    p["metadata"]["labels"] = json!({"training.kubeflow.org/job-name": "r"});
    p
}

fn namespace(api: &ApiServer, name: &str) {
    api.insert(
        "namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    );
}

/// Fast enough for a test: runs back to back, unpaced, a two-second Lease.
fn fast(kubeconfig: &std::path::Path) -> AuditOptions {
    let mut o = AuditOptions::new(Duration::from_millis(100));
    o.rate = 0;
    o.kubeconfig = Some(kubeconfig.to_owned());
    o.lease_duration = Duration::from_secs(2);
    o.renew_every = Duration::from_millis(200);
    o
}

async fn server(
    api: &ApiServer,
    token: Option<&str>,
    tweak: impl FnOnce(&mut AuditOptions),
) -> TestServer {
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    match token {
        Some(t) => api.write_kubeconfig_for(kubeconfig.path(), t).unwrap(),
        None => api.write_kubeconfig(kubeconfig.path()).unwrap(),
    }
    let path = kubeconfig.into_temp_path().keep().unwrap();
    let mut audit = fast(&path);
    tweak(&mut audit);
    net::start(|o| {
        o.cluster = Some(ClusterOptions {
            kubeconfig: Some(path.clone()),
            context: None,
            fetch_timeout: Duration::from_millis(500),
        });
        o.audit = Some(audit);
    })
    .await
}

async fn until(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn report(api: &ApiServer, ns: &str) -> Option<Value> {
    api.get("policyreports", Some(ns), "tollgate")
}

async fn metrics(s: &TestServer) -> Vec<common::scrape::Sample> {
    common::scrape::parse(&net::get_metrics(s.running.metrics_addr.unwrap()).await)
}

fn writes(api: &ApiServer) -> Vec<RequestRecord> {
    api.requests()
        .into_iter()
        .filter(|r| r.resource.as_deref() == Some("policyreports"))
        .filter(|r| matches!(r.verb, Verb::Create | Verb::Update | Verb::Delete))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_are_created_updated_and_removed_as_findings_change() {
    let api = ApiServer::start().await;
    for ns in ["refused", "mutated", "clean", "kube-system"] {
        namespace(&api, ns);
    }
    // Never enforced, so never audited (`--audit-exclude-namespace`).
    api.insert("pods", notebook("kube-system", "coredns"));
    api.insert("pods", notebook("refused", "nb"));
    api.insert("pods", sized("refused", "fine"));
    api.insert("pods", trainer("mutated", "worker-0"));
    api.insert("pods", sized("clean", "fine"));
    // A report of tollgate's in a namespace that no longer exists.
    api.insert(
        "policyreports",
        json!({"apiVersion": "wgpolicyk8s.io/v1alpha2", "kind": "PolicyReport",
            "metadata": {"name": "tollgate", "namespace": "gone",
                "labels": {"app.kubernetes.io/managed-by": "tollgate"}},
            "results": [], "summary": {}}),
    );
    let s = server(&api, None, |o| o.exclude = vec!["kube-*".into()]).await;
    let limit = Duration::from_secs(20);
    until("both reports", limit, async || {
        report(&api, "refused").is_some() && report(&api, "mutated").is_some()
    })
    .await;
    until("the stale report removed", limit, async || {
        report(&api, "gone").is_none()
    })
    .await;
    assert!(report(&api, "clean").is_none(), "no findings, no report");
    assert!(report(&api, "kube-system").is_none(), "excluded");
    assert!(api
        .requests_for(Verb::List, "pods")
        .iter()
        .all(|r| r.namespace.as_deref() != Some("kube-system")));

    let r = report(&api, "refused").unwrap();
    assert_eq!(
        r["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "tollgate"
    );
    assert_eq!(
        r["summary"],
        json!({"pass": 1, "fail": 1, "warn": 0, "error": 0, "skip": 0})
    );
    assert_eq!(r["results"][0]["rule"], "requests");
    assert_eq!(r["results"][0]["resources"][0]["name"], "nb");
    let m = report(&api, "mutated").unwrap();
    assert_eq!(m["summary"]["warn"], 4);

    let lease = api
        .get("leases", Some("default"), "tollgate-audit")
        .expect("the Lease, in the kubeconfig's namespace");
    assert!(!lease["spec"]["holderIdentity"].as_str().unwrap().is_empty());

    // Steady state: the same findings are not written again.
    let samples = metrics(&s).await;
    assert_eq!(
        common::scrape::value(&samples, "tollgate_audit_leader", &[]),
        Some(1.0)
    );
    let runs = common::scrape::value(
        &samples,
        "tollgate_audit_runs_total",
        &[("result", "success")],
    )
    .unwrap();
    let before = writes(&api).len();
    until("two more runs", limit, async || {
        let m = net::get_metrics(s.running.metrics_addr.unwrap()).await;
        common::scrape::value(
            &common::scrape::parse(&m),
            "tollgate_audit_runs_total",
            &[("result", "success")],
        )
        .unwrap_or(0.0)
            >= runs + 2.0
    })
    .await;
    assert_eq!(writes(&api).len(), before, "{:#?}", writes(&api));
    assert_eq!(
        common::scrape::value(
            &samples,
            "tollgate_audit_findings",
            &[("namespace", "mutated"), ("rule", "tolerations")]
        ),
        Some(1.0)
    );
    assert_eq!(
        common::scrape::value(
            &samples,
            "tollgate_audit_findings",
            &[("namespace", "refused"), ("rule", "requests")]
        ),
        Some(1.0)
    );

    // Fixed: the report goes. Broken: one appears. More found: the report is replaced.
    api.modify("pods", Some("refused"), "nb", |p| {
        p["spec"]["containers"][0]["resources"] =
            json!({"requests": {"cpu": "1", "memory": "1Gi"}});
    });
    api.insert("pods", notebook("clean", "nb"));
    api.insert("pods", trainer("mutated", "worker-1"));
    until("the fixed namespace's report removed", limit, async || {
        report(&api, "refused").is_none()
    })
    .await;
    until("a report for the new finding", limit, async || {
        report(&api, "clean").is_some()
    })
    .await;
    until("the grown report replaced", limit, async || {
        report(&api, "mutated").is_some_and(|r| r["summary"]["warn"] == 8)
    })
    .await;
    let updates = api.requests_for(Verb::Update, "policyreports");
    assert!(
        updates
            .iter()
            .any(|u| u.namespace.as_deref() == Some("mutated") && u.status == 200),
        "{updates:#?}"
    );
    let grown = report(&api, "mutated").unwrap();
    let first_seen = grown["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resources"][0]["name"] == "worker-0")
        .unwrap()["timestamp"]
        .clone();
    assert_eq!(
        first_seen, m["results"][0]["timestamp"],
        "an unchanged finding keeps its time"
    );

    until("the fixed namespace's series gone", limit, async || {
        let m = net::get_metrics(s.running.metrics_addr.unwrap()).await;
        let samples = common::scrape::parse(&m);
        common::scrape::value(
            &samples,
            "tollgate_audit_findings",
            &[("namespace", "refused"), ("rule", "requests")],
        )
        .is_none()
            && common::scrape::value(
                &samples,
                "tollgate_audit_findings",
                &[("namespace", "mutated"), ("rule", "tolerations")],
            ) == Some(2.0)
    })
    .await;
    let samples = metrics(&s).await;
    for name in [
        "tollgate_audit_last_run_timestamp_seconds",
        "tollgate_audit_last_run_duration_seconds",
        "tollgate_audit_objects_total",
        "tollgate_audit_busy_seconds_total",
    ] {
        assert!(
            common::scrape::value(&samples, name, &[]).unwrap() > 0.0,
            "{name}"
        );
    }
    assert!(
        common::scrape::value(
            &samples,
            "tollgate_audit_reports_total",
            &[("action", "deleted")]
        )
        .unwrap()
            >= 2.0
    );
    s.running.shutdown().await;
}

fn by(api: &ApiServer, token: &str) -> Vec<RequestRecord> {
    api.requests()
        .into_iter()
        .filter(|r| r.token.as_deref() == Some(token))
        .collect()
}

fn holder(api: &ApiServer) -> String {
    api.get("leases", Some("default"), "tollgate-audit")
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Two replicas, one stand-in: only the holder of the Lease lists pods and writes reports;
/// when it shuts down it releases the Lease and the other takes over at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_share_one_lease_and_only_the_holder_writes() {
    let api = ApiServer::builder()
        .resources(apiserver::ResourceType::defaults())
        .no_auth()
        .start()
        .await;
    namespace(&api, "ml");
    api.insert("pods", notebook("ml", "nb"));
    let limit = Duration::from_secs(20);
    let a = server(&api, Some("server-a"), |_| {}).await;
    until("a's report", limit, async || report(&api, "ml").is_some()).await;
    let first = holder(&api);
    let b = server(&api, Some("server-b"), |_| {}).await;
    // B is up (its caches listed) and tries for the Lease while A holds it.
    until("b trying for the lease", limit, async || {
        by(&api, "server-b")
            .iter()
            .filter(|r| r.resource.as_deref() == Some("leases"))
            .count()
            >= 3
    })
    .await;
    api.insert("pods", notebook("ml", "nb-2"));
    until("the report with both pods", limit, async || {
        report(&api, "ml").is_some_and(|r| r["summary"]["fail"] == 2)
    })
    .await;
    assert_eq!(holder(&api), first);
    let b_did: Vec<RequestRecord> = by(&api, "server-b");
    assert!(
        b_did
            .iter()
            .all(|r| r.resource.as_deref() != Some("policyreports")),
        "{b_did:#?}"
    );
    assert!(
        b_did
            .iter()
            .all(|r| !(r.resource.as_deref() == Some("pods") && r.verb == Verb::List)),
        "b does not audit while a holds the lease"
    );
    assert!(b_did
        .iter()
        .filter(|r| r.resource.as_deref() == Some("leases"))
        .all(|r| r.verb == Verb::Get));
    let b_metrics = metrics(&b).await;
    assert_eq!(
        common::scrape::value(&b_metrics, "tollgate_audit_leader", &[]),
        Some(0.0)
    );

    // A goes: it releases the Lease, and B takes over well before the lease would expire.
    let handover = Instant::now();
    a.running.shutdown().await;
    let a_requests = by(&api, "server-a").len();
    until("b holding the lease", limit, async || {
        let h = holder(&api);
        !h.is_empty() && h != first
    })
    .await;
    assert!(
        handover.elapsed() < Duration::from_secs(2),
        "{:?}",
        handover.elapsed()
    );
    api.insert("pods", notebook("ml", "nb-3"));
    until("b's update of the report", limit, async || {
        report(&api, "ml").is_some_and(|r| r["summary"]["fail"] == 3)
    })
    .await;
    let report_writers: Vec<(Option<String>, Verb)> = writes(&api)
        .into_iter()
        .map(|r| (r.token, r.verb))
        .collect();
    let last = report_writers.last().unwrap();
    assert_eq!(last.0.as_deref(), Some("server-b"), "{report_writers:?}");
    // One writer at a time: A's writes, then B's, never interleaved.
    let switch = report_writers
        .iter()
        .position(|w| w.0.as_deref() == Some("server-b"))
        .unwrap();
    assert!(report_writers[..switch]
        .iter()
        .all(|w| w.0.as_deref() == Some("server-a")));
    assert!(report_writers[switch..]
        .iter()
        .all(|w| w.0.as_deref() == Some("server-b")));
    assert_eq!(
        by(&api, "server-a").len(),
        a_requests,
        "a is silent once stopped"
    );
    assert_eq!(
        common::scrape::value(&metrics(&b).await, "tollgate_audit_leader", &[]),
        Some(1.0)
    );
    b.running.shutdown().await;
    assert!(holder(&api).is_empty(), "released on shutdown");
}

/// A holder that stops renewing without releasing (a replica killed) is replaced once its
/// lease has not changed for its duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_not_renewed_is_taken_over_after_its_duration() {
    let api = ApiServer::start().await;
    namespace(&api, "ml");
    api.insert("pods", notebook("ml", "nb"));
    api.insert(
        "leases",
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "tollgate-audit", "namespace": "default"},
            "spec": {"holderIdentity": "killed_0000", "leaseDurationSeconds": 1,
                     "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 4}}),
    );
    let started = Instant::now();
    let s = server(&api, None, |_| {}).await;
    until("the takeover", Duration::from_secs(20), async || {
        holder(&api) != "killed_0000"
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "not before the lease ran out"
    );
    let lease = api
        .get("leases", Some("default"), "tollgate-audit")
        .unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], 5);
    until("the report", Duration::from_secs(20), async || {
        report(&api, "ml").is_some()
    })
    .await;
    s.running.shutdown().await;
}

/// `--audit-rate`: 40 pods at 20 a second take two seconds, whatever the machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_keeps_to_its_rate() {
    let api = ApiServer::start().await;
    namespace(&api, "ml");
    api.insert_many("pods", (0..40).map(|i| sized("ml", &format!("p-{i:02}"))));
    api.insert("pods", notebook("ml", "nb"));
    let s = server(&api, None, |o| {
        o.rate = 20;
        o.interval = Duration::from_secs(3600);
    })
    .await;
    let limit = Duration::from_secs(30);
    // The run's end, not its report: the report is written before the run's metrics are.
    until("the first run", limit, async || {
        common::scrape::value(
            &metrics(&s).await,
            "tollgate_audit_runs_total",
            &[("result", "success")],
        )
        .unwrap_or(0.0)
            >= 1.0
    })
    .await;
    assert!(report(&api, "ml").is_some());
    let samples = metrics(&s).await;
    let took =
        common::scrape::value(&samples, "tollgate_audit_last_run_duration_seconds", &[]).unwrap();
    assert!(took >= 1.9, "41 objects at 20/s took {took} s");
    let busy = common::scrape::value(&samples, "tollgate_audit_busy_seconds_total", &[]).unwrap();
    assert!(
        busy < took / 2.0,
        "judging is a small part of a paced run: {busy} of {took} s"
    );
    assert_eq!(
        common::scrape::value(&samples, "tollgate_audit_last_run_objects", &[]),
        Some(41.0)
    );
    s.running.shutdown().await;
}

/// CPU time (user + system) of a process so far, from /proc/PID/stat, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// The pacing, measured: `tollgate serve` (set `TOLLGATE_BIN` to a release build) against
/// a stand-in holding 20,000 pods, answering 3,000 reviews one after another over one
/// HTTP/2 connection with no audit, with the audit at its default rate and with it
/// unpaced. Prints latencies, the server's CPU and the audit's cost per object. Run with
/// `cargo test --test integration audit_server:: -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn review_latency_with_and_without_a_background_audit() {
    let api = ApiServer::start().await;
    for ns in 0..10 {
        namespace(&api, &format!("ns-{ns}"));
    }
    api.insert_many(
        "pods",
        (0..20_000).map(|i| {
            let ns = format!("ns-{}", i % 10);
            match i % 10 {
                0 => notebook(&ns, &format!("p-{i:05}")),
                1 => trainer(&ns, &format!("p-{i:05}")),
                _ => sized(&ns, &format!("p-{i:05}")),
            }
        }),
    );
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    api.write_kubeconfig(kubeconfig.path()).unwrap();
    let kc = kubeconfig.path().display().to_string();
    let body = common::fixture("resnet50-master-0.mutate.json");
    for (label, extra) in [
        ("no audit", vec![]),
        (
            "audit at --audit-rate 200",
            vec!["--audit-interval", "1s", "--audit-rate", "200"],
        ),
        (
            "audit unpaced",
            vec!["--audit-interval", "1s", "--audit-rate", "1000000"],
        ),
    ] {
        let (dir, ca) = common::process::workdir();
        let mut args: Vec<String> = [
            "--cluster-context",
            "on",
            "--kubeconfig",
            &kc,
            "--metrics-listen",
            "127.0.0.1:0",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let served = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            common::process::serve(dir, ca, None, "json", &args)
        })
        .await
        .unwrap();
        let metrics_addr = served.metrics_addr.unwrap();
        let mut c = net::Client::connect(served.addr, &served.ca_pem, true).await;
        until("ready", Duration::from_secs(30), async || {
            c.request("GET", "/readyz", vec![]).await.unwrap().0 == 200
        })
        .await;
        if !extra.is_empty() {
            until("the audit under way", Duration::from_secs(30), async || {
                let m = common::scrape::parse(&net::get_metrics(metrics_addr).await);
                common::scrape::value(&m, "tollgate_audit_objects_total", &[]).unwrap_or(0.0) > 0.0
                    || common::scrape::value(&m, "tollgate_audit_busy_seconds_total", &[])
                        .unwrap_or(0.0)
                        > 0.0
            })
            .await;
        }
        for _ in 0..200 {
            c.post("/mutate", body.clone()).await;
        }
        let before = common::scrape::parse(&net::get_metrics(metrics_addr).await);
        let cpu = cpu_seconds(served.pid());
        let started = Instant::now();
        let mut latencies = Vec::with_capacity(3000);
        for _ in 0..3000 {
            let t = Instant::now();
            let (status, _) = c.post("/mutate", body.clone()).await;
            latencies.push(t.elapsed());
            assert_eq!(status, 200);
        }
        let wall = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds(served.pid()) - cpu;
        let after = common::scrape::parse(&net::get_metrics(metrics_addr).await);
        latencies.sort();
        let q = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p) as usize];
        let d = |name: &str| {
            common::scrape::value(&after, name, &[]).unwrap_or(0.0)
                - common::scrape::value(&before, name, &[]).unwrap_or(0.0)
        };
        let (objects, busy) = (
            d("tollgate_audit_objects_total"),
            d("tollgate_audit_busy_seconds_total"),
        );
        eprintln!(
            "{label}: 3000 reviews in {wall:.2} s; latency p50 {:?} p90 {:?} p99 {:?} max {:?}; server CPU {:.0}% of one core; audit: {objects} objects, {busy:.3} s judging ({:.1} us per object)",
            q(0.5),
            q(0.9),
            q(0.99),
            latencies.last().unwrap(),
            100.0 * cpu / wall,
            if objects > 0.0 { 1e6 * busy / objects } else { 0.0 },
        );
        drop(served);
    }
}

//! `serve --audit-interval`: the background audit against the real kube-apiserver
//! (tests/common/envtest.rs), with the PolicyReport CRD of
//! deploy/components/policy-reports installed. PolicyReports created, updated and removed
//! as the cluster changes; the `tollgate_audit_*` metrics; one writer at a time under a
//! coordination.k8s.io Lease, taken over when released or when it runs out; the pacing.
//!
//! The apiserver is shared with every other test: each test's server runs as a
//! ServiceAccount of its own, bound by the shipped RBAC's rules in the test's own
//! namespaces only (and the cluster context's reads cluster-wide), and leaves out the
//! namespaces that were there before it started. A namespace another test makes meanwhile
//! is one this account may not list the pods of: not audited, no report written there.
//!
//! On the stand-in still: the review latency with a background audit over 20,000 pods (a
//! measurement, ignored by default: too many pods to create for a test).

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use apiserver::ApiServer;
use common::identity;
use common::net::{self, TestServer};
use serde_json::{json, Value};
use tollgate::server::{AuditOptions, ClusterOptions};
use tollgate_apiserver_standin as apiserver;

const CRD: &str = "deploy/components/policy-reports/crd/wgpolicyk8s.io_policyreports.yaml";

fn pod(ns: &str, name: &str, containers: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": containers}})
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

/// One test's corner of the real apiserver: its namespaces (the first, `home`, holds the
/// ServiceAccount and the Lease), the account's kubeconfig, and the namespaces of other
/// tests as they were when it began (left out of the audit).
struct Cluster {
    admin: kube::Client,
    home: String,
    namespaces: BTreeMap<String, String>,
    kubeconfig: PathBuf,
    others: Vec<String>,
    _turn: tokio::sync::RwLockReadGuard<'static, ()>,
}

/// The rules of the shipped ClusterRole or Role `name` (deploy/overlays/audit).
fn shipped_rules(docs: &[Value], kind: &str, name: &str) -> Vec<Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name}"))["rules"]
        .as_array()
        .unwrap()
        .clone()
}

impl Cluster {
    /// Namespaces `prefix-NAME-N` for each of `names`, a ServiceAccount in the first bound
    /// (under names of the test's own) by: the cluster context's rules and `list
    /// policyreports` cluster-wide, the audit's rules in each of these namespaces, the
    /// Lease's Role in the first.
    async fn new(prefix: &str, names: &[&str]) -> Option<Cluster> {
        let cp = common::envtest::plane()?;
        let docs = common::rbac::render_if_kubectl("deploy/overlays/audit")?;
        identity::crds(cp, CRD).await?;
        let turn = identity::contained_audit().await;
        let admin = cp.client("admin").await;
        let mut namespaces = BTreeMap::new();
        for n in names {
            namespaces.insert(
                (*n).to_owned(),
                cp.namespace(&format!("{prefix}-{n}"), &[]).await,
            );
        }
        let home = namespaces[names[0]].clone();
        let sa = json!([{"kind": "ServiceAccount", "name": "tollgate", "namespace": home}]);
        let rbac = |kind: &str, name: &str, ns: Option<&str>, rules: Vec<Value>| {
            let mut m = json!({"name": name});
            if let Some(ns) = ns {
                m["namespace"] = json!(ns);
            }
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                "metadata": m, "rules": rules})
        };
        let binding = |kind: &str, name: &str, ns: Option<&str>, role_kind: &str, role: &str| {
            let mut m = json!({"name": name});
            if let Some(ns) = ns {
                m["namespace"] = json!(ns);
            }
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                "metadata": m, "subjects": sa,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role}})
        };
        let mut read = shipped_rules(&docs, "ClusterRole", "tollgate-cluster-context");
        read.push(json!({"apiGroups": ["wgpolicyk8s.io"], "resources": ["policyreports"], "verbs": ["list"]}));
        let (read_name, audit_name) = (format!("{home}-read"), format!("{home}-audit"));
        let mut objects = vec![
            rbac("ClusterRole", &read_name, None, read),
            binding(
                "ClusterRoleBinding",
                &read_name,
                None,
                "ClusterRole",
                &read_name,
            ),
            rbac(
                "ClusterRole",
                &audit_name,
                None,
                shipped_rules(&docs, "ClusterRole", "tollgate-audit"),
            ),
            rbac(
                "Role",
                "tollgate-audit-lease",
                Some(&home),
                shipped_rules(&docs, "Role", "tollgate-audit-lease"),
            ),
            binding(
                "RoleBinding",
                "tollgate-audit-lease",
                Some(&home),
                "Role",
                "tollgate-audit-lease",
            ),
        ];
        for ns in namespaces.values() {
            objects.push(binding(
                "RoleBinding",
                "tollgate-audit",
                Some(ns),
                "ClusterRole",
                &audit_name,
            ));
        }
        identity::apply(cp, &objects)?;
        let kubeconfig = identity::service_account(cp, &home, "tollgate").await;
        let mine: Vec<&str> = namespaces.values().map(String::as_str).collect();
        let others = identity::other_namespaces(&admin, &mine).await;
        Some(Cluster {
            admin,
            home,
            namespaces,
            kubeconfig,
            others,
            _turn: turn,
        })
    }

    fn ns(&self, name: &str) -> &str {
        &self.namespaces[name]
    }

    async fn create(&self, objects: Vec<Value>) {
        for o in objects {
            identity::create(&self.admin, o).await;
        }
    }

    async fn delete_pod(&self, ns: &str, name: &str) {
        let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(self.admin.clone(), ns);
        // No kubelet to finish a graceful deletion.
        let dp = kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        api.delete(name, &dp).await.unwrap();
    }

    fn reports(&self, ns: &str) -> kube::Api<kube::api::DynamicObject> {
        let ar = kube::api::ApiResource {
            group: "wgpolicyk8s.io".into(),
            version: "v1alpha2".into(),
            api_version: "wgpolicyk8s.io/v1alpha2".into(),
            kind: "PolicyReport".into(),
            plural: "policyreports".into(),
        };
        kube::Api::namespaced_with(self.admin.clone(), ns, &ar)
    }

    async fn report(&self, ns: &str) -> Option<Value> {
        self.reports(ns)
            .get_opt("tollgate")
            .await
            .unwrap()
            .map(|r| serde_json::to_value(r).unwrap())
    }

    fn leases(&self) -> kube::Api<k8s_openapi::api::coordination::v1::Lease> {
        kube::Api::namespaced(self.admin.clone(), &self.home)
    }

    async fn holder(&self) -> String {
        self.leases()
            .get_opt("tollgate-audit")
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity)
            .unwrap_or_default()
    }

    /// A server with the cluster context and the background audit, as the account.
    async fn server(&self, tweak: impl FnOnce(&mut AuditOptions)) -> TestServer {
        let mut audit = fast(&self.kubeconfig);
        audit.exclude = self.others.clone();
        tweak(&mut audit);
        let path = self.kubeconfig.clone();
        net::start(|o| {
            o.cluster = Some(ClusterOptions {
                kubeconfig: Some(path),
                context: None,
                fetch_timeout: Duration::from_millis(500),
            });
            o.audit = Some(audit);
        })
        .await
    }
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

async fn until(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn metrics(s: &TestServer) -> Vec<common::scrape::Sample> {
    common::scrape::parse(&net::get_metrics(s.running.metrics_addr.unwrap()).await)
}

async fn metric(s: &TestServer, name: &str, labels: &[(&str, &str)]) -> f64 {
    common::scrape::value(&metrics(s).await, name, labels).unwrap_or(0.0)
}

/// The reports written (created, updated, deleted) so far, by the server's counters.
async fn writes(s: &TestServer) -> f64 {
    let samples = metrics(s).await;
    ["created", "updated", "deleted"]
        .iter()
        .map(|a| {
            common::scrape::value(&samples, "tollgate_audit_reports_total", &[("action", a)])
                .unwrap_or(0.0)
        })
        .sum()
}

fn version(r: &Value) -> (String, String) {
    (
        r["metadata"]["uid"].as_str().unwrap().to_owned(),
        r["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_are_created_updated_and_removed_as_findings_change() {
    let Some(c) = Cluster::new(
        "audit-bg",
        &["home", "refused", "mutated", "clean", "kube-like"],
    )
    .await
    else {
        return;
    };
    let (refused, mutated, clean, excluded) = (
        c.ns("refused").to_owned(),
        c.ns("mutated").to_owned(),
        c.ns("clean").to_owned(),
        c.ns("kube-like").to_owned(),
    );
    c.create(vec![
        // Never enforced, so never audited (`--audit-exclude-namespace`).
        notebook(&excluded, "coredns"),
        notebook(&refused, "nb"),
        sized(&refused, "fine"),
        trainer(&mutated, "worker-0"),
        sized(&clean, "fine"),
        // A report of tollgate's in a namespace no longer audited (excluded): stale.
        json!({"apiVersion": "wgpolicyk8s.io/v1alpha2", "kind": "PolicyReport",
            "metadata": {"name": "tollgate", "namespace": excluded,
                "labels": {"app.kubernetes.io/managed-by": "tollgate"}},
            "results": [], "summary": {}}),
    ])
    .await;
    let s = c.server(|o| o.exclude.push(excluded.clone())).await;
    let limit = Duration::from_secs(20);
    until("both reports", limit, async || {
        c.report(&refused).await.is_some() && c.report(&mutated).await.is_some()
    })
    .await;
    until("the stale report removed", limit, async || {
        c.report(&excluded).await.is_none()
    })
    .await;
    assert!(c.report(&clean).await.is_none(), "no findings, no report");

    let r = c.report(&refused).await.unwrap();
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
    let m = c.report(&mutated).await.unwrap();
    assert_eq!(m["summary"]["warn"], 4);

    let lease = c
        .leases()
        .get("tollgate-audit")
        .await
        .expect("the Lease, in the kubeconfig's namespace");
    assert!(!lease.spec.unwrap().holder_identity.unwrap().is_empty());

    // Steady state: the same findings are not written again (the server's counters, and
    // the reports' resourceVersions, hold still over two more runs).
    assert_eq!(metric(&s, "tollgate_audit_leader", &[]).await, 1.0);
    let runs = metric(&s, "tollgate_audit_runs_total", &[("result", "success")]).await;
    let before = writes(&s).await;
    until("two more runs", limit, async || {
        metric(&s, "tollgate_audit_runs_total", &[("result", "success")]).await >= runs + 2.0
    })
    .await;
    assert_eq!(writes(&s).await, before);
    assert_eq!(version(&c.report(&refused).await.unwrap()), version(&r));
    assert_eq!(version(&c.report(&mutated).await.unwrap()), version(&m));
    assert!(
        c.report(&excluded).await.is_none(),
        "excluded: never written"
    );
    let samples = metrics(&s).await;
    assert_eq!(
        common::scrape::value(
            &samples,
            "tollgate_audit_findings",
            &[("namespace", &mutated), ("rule", "tolerations")]
        ),
        Some(1.0)
    );
    assert_eq!(
        common::scrape::value(
            &samples,
            "tollgate_audit_findings",
            &[("namespace", &refused), ("rule", "requests")]
        ),
        Some(1.0)
    );

    // Fixed: the report goes. Broken: one appears. More found: the report is replaced.
    // (A pod's resources are immutable: the fixed pod is a new one.)
    c.delete_pod(&refused, "nb").await;
    c.create(vec![
        sized(&refused, "nb-fixed"),
        notebook(&clean, "nb"),
        trainer(&mutated, "worker-1"),
    ])
    .await;
    until("the fixed namespace's report removed", limit, async || {
        c.report(&refused).await.is_none()
    })
    .await;
    until("a report for the new finding", limit, async || {
        c.report(&clean).await.is_some()
    })
    .await;
    until("the grown report replaced", limit, async || {
        c.report(&mutated)
            .await
            .is_some_and(|r| r["summary"]["warn"] == 8)
    })
    .await;
    let grown = c.report(&mutated).await.unwrap();
    assert_eq!(
        grown["metadata"]["uid"], m["metadata"]["uid"],
        "updated in place, not made anew"
    );
    assert!(metric(&s, "tollgate_audit_reports_total", &[("action", "updated")]).await >= 1.0);
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
        let samples = metrics(&s).await;
        common::scrape::value(
            &samples,
            "tollgate_audit_findings",
            &[("namespace", &refused), ("rule", "requests")],
        )
        .is_none()
            && common::scrape::value(
                &samples,
                "tollgate_audit_findings",
                &[("namespace", &mutated), ("rule", "tolerations")],
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

/// Two replicas, one apiserver: only the holder of the Lease audits and writes reports
/// (the other's counters stay at nothing); when it shuts down it releases the Lease and
/// the other takes over at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_share_one_lease_and_only_the_holder_writes() {
    let Some(c) = Cluster::new("audit-two", &["ml"]).await else {
        return;
    };
    let ml = c.ns("ml").to_owned();
    c.create(vec![notebook(&ml, "nb")]).await;
    let limit = Duration::from_secs(20);
    let a = c.server(|_| {}).await;
    until("a's report", limit, async || c.report(&ml).await.is_some()).await;
    let first = c.holder().await;
    let b = c.server(|_| {}).await;
    // B is up and tries for the Lease while A holds it: a few of its renewal periods.
    tokio::time::sleep(Duration::from_millis(800)).await;
    c.create(vec![notebook(&ml, "nb-2")]).await;
    until("the report with both pods", limit, async || {
        c.report(&ml)
            .await
            .is_some_and(|r| r["summary"]["fail"] == 2)
    })
    .await;
    assert_eq!(c.holder().await, first);
    assert_eq!(writes(&b).await, 0.0, "b writes no report");
    assert_eq!(
        metric(&b, "tollgate_audit_runs_total", &[("result", "success")]).await,
        0.0,
        "b does not audit while a holds the lease"
    );
    assert_eq!(metric(&b, "tollgate_audit_objects_total", &[]).await, 0.0);
    assert_eq!(metric(&b, "tollgate_audit_leader", &[]).await, 0.0);
    let a_writes = writes(&a).await;
    assert!(a_writes >= 2.0, "{a_writes}");

    // A goes: it releases the Lease, and B takes over well before the lease would expire.
    let handover = Instant::now();
    a.running.shutdown().await;
    until("b holding the lease", limit, async || {
        let h = c.holder().await;
        !h.is_empty() && h != first
    })
    .await;
    assert!(
        handover.elapsed() < Duration::from_secs(2),
        "{:?}",
        handover.elapsed()
    );
    c.create(vec![notebook(&ml, "nb-3")]).await;
    until("b's update of the report", limit, async || {
        c.report(&ml)
            .await
            .is_some_and(|r| r["summary"]["fail"] == 3)
    })
    .await;
    assert!(metric(&b, "tollgate_audit_reports_total", &[("action", "updated")]).await >= 1.0);
    assert_eq!(metric(&b, "tollgate_audit_leader", &[]).await, 1.0);
    b.running.shutdown().await;
    assert!(c.holder().await.is_empty(), "released on shutdown");
}

/// A holder that stops renewing without releasing (a replica killed) is replaced once its
/// lease has not changed for its duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_not_renewed_is_taken_over_after_its_duration() {
    let Some(c) = Cluster::new("audit-lease", &["ml"]).await else {
        return;
    };
    let ml = c.ns("ml").to_owned();
    c.create(vec![
        notebook(&ml, "nb"),
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "tollgate-audit", "namespace": c.home},
            "spec": {"holderIdentity": "killed_0000", "leaseDurationSeconds": 1,
                     "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 4}}),
    ])
    .await;
    let started = Instant::now();
    let s = c.server(|_| {}).await;
    until("the takeover", Duration::from_secs(20), async || {
        c.holder().await != "killed_0000"
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "not before the lease ran out"
    );
    let lease = c.leases().get("tollgate-audit").await.unwrap();
    assert_eq!(lease.spec.unwrap().lease_transitions, Some(5));
    until("the report", Duration::from_secs(20), async || {
        c.report(&ml).await.is_some()
    })
    .await;
    s.running.shutdown().await;
}

/// `--audit-rate`: 40 pods at 20 a second take two seconds, whatever the machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_keeps_to_its_rate() {
    let Some(c) = Cluster::new("audit-rate", &["ml"]).await else {
        return;
    };
    let ml = c.ns("ml").to_owned();
    let mut pods: Vec<Value> = (0..40).map(|i| sized(&ml, &format!("p-{i:02}"))).collect();
    pods.push(notebook(&ml, "nb"));
    c.create(pods).await;
    let s = c
        .server(|o| {
            o.rate = 20;
            o.interval = Duration::from_secs(3600);
        })
        .await;
    let limit = Duration::from_secs(30);
    // The run's end, not its report: the report is written before the run's metrics are.
    until("the first run", limit, async || {
        metric(&s, "tollgate_audit_runs_total", &[("result", "success")]).await >= 1.0
    })
    .await;
    assert!(c.report(&ml).await.is_some());
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

fn namespace(api: &ApiServer, name: &str) {
    api.insert(
        "namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    );
}

fn stand_in_pod(ns: &str, name: &str, containers: Value) -> Value {
    let mut p = pod(ns, name, containers);
    p["spec"]["nodeName"] = json!("node-1");
    p["status"] = json!({"phase": "Running"});
    p
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
                0 => stand_in_pod(
                    &ns,
                    &format!("p-{i:05}"),
                    notebook(&ns, "")["spec"]["containers"].clone(),
                ),
                1 => {
                    let mut p = stand_in_pod(
                        &ns,
                        &format!("p-{i:05}"),
                        trainer(&ns, "")["spec"]["containers"].clone(),
                    );
                    p["metadata"]["labels"] = json!({"training.kubeflow.org/job-name": "r"});
                    p
                }
                _ => stand_in_pod(
                    &ns,
                    &format!("p-{i:05}"),
                    sized(&ns, "")["spec"]["containers"].clone(),
                ),
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

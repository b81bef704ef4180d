//! The pods tollgate makes, started by a real node (`common::node`: Debian's containerd and
//! the kubelet v1.36, registered with a control plane of its own): applied through the real
//! apiserver with tollgate's webhooks registered, bound by the real scheduler, made by the
//! real job and statefulset controllers, their volumes mounted, their containers started
//! and their cgroups limited by the kubelet and runc.
//!
//! - The seeds' workloads run: a GPU training Job, a parallel indexed Job, a CPU-only Job, a
//!   GPU StatefulSet, a pod without requests that opts out; each Job completes while the
//!   native metrics sidecar runs beside the trainer, whose `/metrics` the trainer reads on
//!   the pod's loopback; inside the containers the driver mount is read-only and only in
//!   the GPU containers, `LD_LIBRARY_PATH` only there, and each container's cgroup limits
//!   are the limits tollgate wrote.
//! - At Pod Security `baseline` and `restricted` a compliant GPU Job completes: nothing
//!   tollgate adds is what stops it.
//! - What the node cannot start is said in the kubelet's words: the driver directory
//!   missing under the built-in policy's hostPath `Directory`, the sidecar's image absent
//!   from the node, the sidecar refused under the pod's securityContext.
//! - A property over generated pods: each runs, or `tollgate why` gives the kubelet's reason.
//!
//! One node per machine: its tests share it (and its control plane), each in namespaces
//! and with a tollgate of its own.

use crate::common;

use std::time::{Duration, Instant};

use common::node::{Node, BUSYBOX};
use common::process::Served;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{json, Value};

/// How long a test waits for a pod or a Job of its own on the node: a safety bound, never
/// a measure (the node's pods start in seconds).
const BOUND: Duration = Duration::from_secs(240);

/// A tollgate server for the node's plane, registered as deploy/base registers it, for the
/// namespaces labelled with its name.
struct Tollgate {
    served: Served,
    name: String,
    /// The namespaces made for it, removed (their pods at once) by [`Tollgate::deregister`].
    namespaces: std::sync::Mutex<Vec<String>>,
}

/// `tollgate serve` with `policy` (None: the built-in policy) and the cluster context on
/// the node's plane, registered; waits until it is ready.
async fn tollgate(node: &'static Node, policy: Option<String>, prefix: &str) -> Tollgate {
    tollgate_with(node, policy, prefix, &[]).await
}

/// [`tollgate`] with more `serve` flags.
async fn tollgate_with(
    node: &'static Node,
    policy: Option<String>,
    prefix: &str,
    extra: &[&str],
) -> Tollgate {
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    let Some(rendered) = common::rbac::render_if_kubectl("deploy/base") else {
        panic!("no kubectl to render deploy/base (the node's tests need it)");
    };
    let cp = node.cp;
    let kubeconfig = cp.kubeconfig("admin").to_string_lossy().into_owned();
    let served = tokio::task::spawn_blocking(move || {
        let (dir, ca) = common::process::workdir();
        let mut args = vec!["--cluster-context", "on", "--kubeconfig", &kubeconfig];
        args.extend(extra.iter().map(String::as_str));
        match policy {
            Some(text) => {
                let path = dir.path().join("node-policy.yaml");
                std::fs::write(&path, text).unwrap();
                common::process::serve(dir, ca, Some(&path), "json", &args)
            }
            None => common::process::serve_builtin(dir, ca, &args),
        }
    })
    .await
    .unwrap();
    let (addr, ca) = (served.addr, served.ca_pem.clone());
    common::net::until("the server's cluster context to be ready", async || {
        let mut c = common::net::Client::connect(addr, &ca, false).await;
        common::net::ready(&mut c).await.0 == 200
    })
    .await;
    let name = common::context::unique(prefix);
    let admin = cp.client("admin").await;
    for c in &common::admission::registration(&rendered, &name, addr.port(), &served.ca_pem) {
        common::apiserver::create(&admin, c, false)
            .await
            .unwrap_or_else(|e| panic!("registering {name}: {}", e.message));
    }
    Tollgate {
        served,
        name,
        namespaces: Default::default(),
    }
}

impl Tollgate {
    /// A namespace of the test's own that this server's webhooks are in force for.
    async fn namespace(
        &self,
        cp: &common::envtest::ControlPlane,
        labels: &[(&str, &str)],
    ) -> String {
        let mut all = labels.to_vec();
        all.push(("tollgate.dev/enforce", "enabled"));
        all.push((common::admission::REGISTERED, &self.name));
        let ns = cp.namespace("node", &all).await;
        self.namespaces.lock().unwrap().push(ns.clone());
        let admin = cp.client("admin").await;
        // A probe that every Pod Security level admits, so the wait holds at every level.
        let probe = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe", "namespace": ns},
            "spec": {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "c", "image": "probe",
                "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}},
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}});
        let served = &self.served;
        let seen = |endpoint: &str| {
            served
                .lines()
                .iter()
                .any(|l| l.contains(&ns) && l.contains(&format!("\"{endpoint}\"")))
        };
        common::net::until("the webhooks to be in force", async || {
            let _ = common::apiserver::create(&admin, &probe, true).await;
            seen("mutate") && seen("validate")
        })
        .await;
        ns
    }

    /// Its webhooks removed, and its namespaces with their pods: their GPUs and CPU freed
    /// at once for the node's next test (a pod's `sleep` as PID 1 would wait out the grace
    /// period).
    async fn deregister(&self, cp: &common::envtest::ControlPlane) {
        let admin = cp.client("admin").await;
        common::admission::deregister(&admin, &self.name).await;
        let namespaces = self.namespaces.lock().unwrap().clone();
        let now = kube::api::DeleteParams::default().grace_period(0);
        for ns in namespaces {
            let pods = Api::<Pod>::namespaced(admin.clone(), &ns);
            let _ = pods.delete_collection(&now, &ListParams::default()).await;
            let all = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone());
            let _ = all.delete(&ns, &kube::api::DeleteParams::default()).await;
        }
    }
}

/// A policy over the built-in one whose `nvidia` class mounts the node's driver directory
/// (as a platform whose nodes keep the driver at a path of their own writes it).
fn driver_policy(node: &Node) -> String {
    format!(
        "gpu:\n  classes:\n    nvidia:\n      mounts:\n        - name: tollgate-nvidia-driver\n          \
         hostPath: {}\n          type: Directory\n          mountPath: /usr/local/nvidia\n",
        node.driver_dir.display()
    )
}

/// What a trainer prints, for the test to read back from its log: the sidecar's metrics on
/// the pod's loopback (retried while the sidecar starts), the driver mount's line of
/// /proc/mounts, LD_LIBRARY_PATH, its uid and its cgroup's limits (v1, else v2).
const PROBE: &str = r#"
for i in $(seq 100); do wget -qO- http://127.0.0.1:9102/metrics >/tmp/m 2>/dev/null && break; sleep 0.1; done
grep -q '^tollgate_test_up 1' /tmp/m && echo "metrics=ok" || echo "metrics=none"
echo "mount=$(grep ' /usr/local/nvidia ' /proc/mounts | cut -d' ' -f4 | cut -d, -f1)"
echo "driver=$(cat /usr/local/nvidia/version 2>/dev/null)"
echo "ld=${LD_LIBRARY_PATH:-}"
echo "uid=$(id -u)"
if [ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
  echo "memory=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"
  echo "cpu=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)/$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)"
else
  echo "memory=$(cat /sys/fs/cgroup/memory.max)"
  echo "cpu=$(tr ' ' / </sys/fs/cgroup/cpu.max)"
fi
"#;

/// A container of the tests' image running [`PROBE`], then `then`.
fn container(name: &str, resources: Value, then: &str) -> Value {
    json!({"name": name, "image": BUSYBOX, "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", format!("{PROBE}\n{then}")],
        "resources": resources})
}

/// Small requests: the node has two CPUs for every test's pods.
fn small(gpus: u32) -> Value {
    let mut r = json!({"requests": {"cpu": "100m", "memory": "64Mi"}});
    if gpus > 0 {
        r["requests"]["nvidia.com/gpu"] = json!(gpus.to_string());
        // A GPU request without a limit is the apiserver's to refuse in a template
        // (issue 47's); these pods give both.
        r["limits"] = json!({"nvidia.com/gpu": gpus.to_string()});
    }
    r
}

/// The node is a GPU pool's, tainted `nvidia.com/gpu`; the only node here, so a pod without
/// GPUs (which tollgate gives no toleration) tolerates it itself, as it would go to a CPU
/// node in a real cluster.
fn on_the_only_node(mut spec: Value) -> Value {
    spec["tolerations"] = json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]);
    spec
}

/// The key=value lines a container printed.
fn printed(log: &str) -> std::collections::BTreeMap<String, String> {
    log.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// `kubectl ARGS` as the admin on the node's plane (logs and exec reach the kubelet on
/// 127.0.0.1): its standard output, or the failure with both streams.
fn kubectl(node: &Node, args: &[&str]) -> Result<String, String> {
    let mut cmd = node.cp.kubectl("admin").expect("kubectl");
    let out = cmd.args(args).output().expect("running kubectl");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "kubectl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `tollgate why OBJECT -n NS` as the admin: its output (exit code aside).
fn why(node: &Node, ns: &str, object: &str, extra: &[&str]) -> String {
    let kubeconfig = node.cp.kubeconfig("admin");
    let mut args = vec!["why", object, "-n", ns, "--kubeconfig"];
    let k = kubeconfig.to_string_lossy().into_owned();
    args.push(&k);
    args.extend(extra);
    let out = common::bin::run(&args, None);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// What a failed wait shows: the pods of the namespace with their statuses, its events, and
/// the node's kubelet log's tail.
async fn story(node: &Node, ns: &str) -> String {
    let events = kubectl(node, &["get", "events", "-n", ns, "-o", "wide"]).unwrap_or_else(|e| e);
    let pods = kubectl(node, &["get", "pods", "-n", ns, "-o", "yaml"]).unwrap_or_else(|e| e);
    let log = std::fs::read_to_string(node.dir.join("kubelet.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    format!(
        "-- events --\n{events}\n-- pods --\n{pods}\n-- kubelet.log (last lines, newest first) --\n{}",
        tail.join("\n")
    )
}

/// Waits (bounded) until `f` gives a value; fails with the namespace's story.
async fn until<T>(node: &Node, ns: &str, what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if start.elapsed() > BOUND {
            panic!("timed out waiting for {what}\n{}", story(node, ns).await);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until Job `name` is Complete (a Failed one fails the test).
async fn completes(node: &Node, ns: &str, name: &str) {
    let client = node.cp.client("admin").await;
    let jobs = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(client, ns);
    until(
        node,
        ns,
        &format!("job {ns}/{name} to complete"),
        async || {
            let job = jobs.get(name).await.ok()?;
            let conditions = job.status?.conditions.unwrap_or_default();
            if let Some(c) = conditions
                .iter()
                .find(|c| c.type_ == "Failed" && c.status == "True")
            {
                panic!(
                    "job {ns}/{name} failed: {:?}\n{}",
                    c.message,
                    story(node, ns).await
                );
            }
            conditions
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True")
                .then_some(())
        },
    )
    .await
}

/// The pods of `ns` whose labels match `selector`, once there are `n` of them in a phase
/// of `phases`.
async fn pods_in(node: &Node, ns: &str, selector: &str, n: usize, phases: &[&str]) -> Vec<Pod> {
    let client = node.cp.client("admin").await;
    let api = Api::<Pod>::namespaced(client, ns);
    let params = ListParams::default().labels(selector);
    until(
        node,
        ns,
        &format!("{n} pods {selector} {phases:?}"),
        async || {
            let pods = api.list(&params).await.ok()?.items;
            let phase = |p: &Pod| {
                p.status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default()
            };
            (pods
                .iter()
                .filter(|p| phases.contains(&phase(p).as_str()))
                .count()
                >= n)
                .then_some(pods)
        },
    )
    .await
}

fn pod_json(p: &Pod) -> Value {
    serde_json::to_value(p).unwrap()
}

/// A quantity as the apiserver stores a limit (`4Gi`, `128Mi`, `200m`, `2`), in
/// thousandths: bytes x 1000 for memory, millicores for CPU.
fn milli(q: &str) -> u64 {
    let (digits, scale) = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
    ]
    .iter()
    .find_map(|(s, f)| q.strip_suffix(s).map(|d| (d, f * 1000)))
    .or_else(|| q.strip_suffix('m').map(|d| (d, 1)))
    .unwrap_or((q, 1000));
    digits
        .parse::<u64>()
        .unwrap_or_else(|_| panic!("a quantity: {q}"))
        * scale
}

/// Bytes of a memory limit.
fn bytes(q: &str) -> u64 {
    milli(q) / 1000
}

/// The cgroup v1 `quota/period` (or v2 `max period`) of a CPU limit.
fn cpu_quota(q: &str) -> String {
    format!("{}/100000", milli(q) * 100)
}

/// The container (or init container) `name` of a pod as stored.
fn container_in<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .chain(pod["spec"]["initContainers"].as_array())
        .flatten()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}: {pod}"))
}

/// A container's limits as stored (after tollgate's mutation) and as its cgroup holds
/// them, the same.
fn assert_limited(
    pod: &Value,
    container: &str,
    printed: &std::collections::BTreeMap<String, String>,
) {
    let c = container_in(pod, container);
    let limits = &c["resources"]["limits"];
    let memory = limits["memory"]
        .as_str()
        .expect("a memory limit tollgate wrote");
    let cpu = limits["cpu"].as_str().expect("a cpu limit tollgate wrote");
    assert_eq!(
        printed.get("memory").map(String::as_str),
        Some(bytes(memory).to_string().as_str()),
        "{container}: the memory cgroup's limit is the limit ({memory}): {printed:?}"
    );
    assert_eq!(
        printed.get("cpu").map(String::as_str),
        Some(cpu_quota(cpu).as_str()),
        "{container}: the cpu cgroup's quota is the limit ({cpu}): {printed:?}"
    );
}

/// A container's cgroup as its stored limits make it: limited as [`assert_limited`] where
/// the pod (after tollgate's mutation) gives it limits, unlimited where it gives none.
fn assert_as_stored(
    pod: &Value,
    container: &str,
    printed: &std::collections::BTreeMap<String, String>,
) {
    let c = container_in(pod, container);
    let limits = &c["resources"]["limits"];
    if limits["memory"].is_string() && limits["cpu"].is_string() {
        return assert_limited(pod, container, printed);
    }
    assert!(
        limits["memory"].is_null() && limits["cpu"].is_null(),
        "{container}: limits on one of cpu and memory only: {limits}"
    );
    let memory = printed
        .get("memory")
        .map(String::as_str)
        .unwrap_or_default();
    let cpu = printed.get("cpu").map(String::as_str).unwrap_or_default();
    // cgroup v1's unlimited memory is the largest page-aligned value; v2 says `max`.
    let unlimited_memory = memory == "max" || memory.parse::<u64>().is_ok_and(|m| m > 1 << 60);
    assert!(
        unlimited_memory && (cpu.starts_with("-1/") || cpu.starts_with("max/")),
        "{container}: no limits stored, none in its cgroup: {printed:?}"
    );
}

/// The log of one container of a pod.
fn logs(node: &Node, ns: &str, pod: &str, container: &str) -> String {
    kubectl(node, &["logs", "-n", ns, pod, "-c", container]).unwrap_or_else(|e| panic!("{e}"))
}

/// The seeds' workloads, with a policy that mounts the node's driver directory: each runs
/// as tollgate made it.
#[tokio::test]
async fn training_workloads_run_on_the_node_as_tollgate_made_them() {
    let Some(node) = common::node::node() else {
        return;
    };
    let _turn = node.turn().await;
    let cp = node.cp;
    let tg = tollgate(node, Some(driver_policy(node)), "node-runs").await;
    let ns = tg.namespace(cp, &[]).await;
    let admin = cp.client("admin").await;
    let create = async |obj: Value| {
        let mut obj = obj;
        obj["metadata"]["namespace"] = json!(ns);
        common::apiserver::create(&admin, &obj, false)
            .await
            .unwrap_or_else(|e| panic!("creating {}: {}", obj["metadata"]["name"], e.message))
    };

    // A GPU pod on its own first: how long from its create to Running.
    let started = Instant::now();
    create(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-pod",
        "labels": {"app": "gpu-pod"}},
        "spec": {"containers": [container("trainer", small(1), "sleep 3600")]}}),
    )
    .await;
    pods_in(node, &ns, "app=gpu-pod", 1, &["Running"]).await;
    eprintln!(
        "node: a GPU training pod from create to Running (webhooks, scheduler, kubelet, \
         sidecar and trainer started) in {:.2} s",
        started.elapsed().as_secs_f64()
    );

    // The GPU Job: a trainer with a GPU and a logger without.
    create(
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
            "containers": [container("trainer", small(1), "echo trained"),
                           container("logger", small(0), "echo logged")]}}}}),
    )
    .await;
    // A parallel indexed Job of two GPU workers, a CPU-only Job.
    create(
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "sweep"},
        "spec": {"backoffLimit": 0, "completions": 2, "parallelism": 2,
            "completionMode": "Indexed", "template": {"spec": {"restartPolicy": "Never",
            "containers": [container("trainer", small(1), "echo index=$JOB_COMPLETION_INDEX")]}}}}),
    )
    .await;
    create(
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "prep"},
        "spec": {"backoffLimit": 0, "template": {"spec": on_the_only_node(json!({
            "restartPolicy": "Never",
            "containers": [container("prep", small(0), "echo prepared")]}))}}}),
    )
    .await;
    // Distributed training: a GPU StatefulSet of two ranks that stay up.
    create(
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "dist"},
        "spec": {"replicas": 2, "serviceName": "dist", "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "dist"}},
            "template": {"metadata": {"labels": {"app": "dist"}}, "spec": {
                "containers": [container("trainer", small(1), "sleep 3600")]}}}}),
    )
    .await;
    // A pod without requests that opts out (the admin's opt-out is honoured).
    create(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "scratch",
        "annotations": {"tollgate.dev/opt-out": "true"}},
        "spec": on_the_only_node(json!({"restartPolicy": "Never",
            "containers": [{"name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "echo untouched"]}]}))}),
    )
    .await;

    for job in ["train", "sweep", "prep"] {
        completes(node, &ns, job).await;
    }
    let train = pods_in(
        node,
        &ns,
        "batch.kubernetes.io/job-name=train",
        1,
        &["Succeeded"],
    )
    .await;
    let train = pod_json(&train[0]);
    let name = train["metadata"]["name"].as_str().unwrap();
    let trainer = printed(&logs(node, &ns, name, "trainer"));
    let logger = printed(&logs(node, &ns, name, "logger"));
    let p = |m: &std::collections::BTreeMap<String, String>, k: &str| {
        m.get(k).cloned().unwrap_or_default()
    };
    assert_eq!(
        p(&trainer, "metrics"),
        "ok",
        "the sidecar answered the trainer: {trainer:?}"
    );
    assert_eq!(
        p(&trainer, "mount"),
        "ro",
        "the driver mount, read-only: {trainer:?}"
    );
    assert_eq!(
        p(&trainer, "driver"),
        "tollgate-test-driver 1.0",
        "{trainer:?}"
    );
    assert_eq!(p(&trainer, "ld"), "/usr/local/nvidia/lib64", "{trainer:?}");
    assert_eq!(
        p(&logger, "mount"),
        "",
        "no driver where no GPU is used: {logger:?}"
    );
    assert_eq!(
        p(&logger, "ld"),
        "",
        "no LD_LIBRARY_PATH where no GPU is used: {logger:?}"
    );
    assert_limited(&train, "trainer", &trainer);
    assert_limited(&train, "logger", &logger);
    // The native sidecar ran beside the trainer and was stopped after it: the pod
    // Succeeded with the sidecar's container terminated, not waited for.
    let sidecar = train["status"]["initContainerStatuses"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "tollgate-metrics"))
        .unwrap_or_else(|| panic!("no sidecar status: {train}"));
    assert!(
        sidecar["state"].get("terminated").is_some()
            || sidecar["lastState"].get("terminated").is_some(),
        "the sidecar, stopped once the trainer was done: {sidecar}"
    );

    let sweep = pods_in(
        node,
        &ns,
        "batch.kubernetes.io/job-name=sweep",
        2,
        &["Succeeded"],
    )
    .await;
    let mut indices = vec![];
    for pod in &sweep {
        let pod = pod_json(pod);
        let name = pod["metadata"]["name"].as_str().unwrap();
        let out = printed(&logs(node, &ns, name, "trainer"));
        assert_eq!(p(&out, "metrics"), "ok", "{name}: {out:?}");
        assert_eq!(p(&out, "mount"), "ro", "{name}: {out:?}");
        assert_limited(&pod, "trainer", &out);
        indices.push(p(&out, "index"));
    }
    indices.sort();
    assert_eq!(indices, ["0", "1"], "each index ran once");

    let prep = pods_in(
        node,
        &ns,
        "batch.kubernetes.io/job-name=prep",
        1,
        &["Succeeded"],
    )
    .await;
    let prep = pod_json(&prep[0]);
    let name = prep["metadata"]["name"].as_str().unwrap();
    let out = printed(&logs(node, &ns, name, "prep"));
    assert_eq!(
        p(&out, "metrics"),
        "ok",
        "a CPU training pod has the sidecar too: {out:?}"
    );
    assert_eq!(p(&out, "mount"), "", "and no driver: {out:?}");
    assert_limited(&prep, "prep", &out);

    // The StatefulSet's ranks run; the sidecar, as tollgate wrote it, is uid 65534 on a
    // read-only root filesystem within its own limits.
    let dist = pods_in(node, &ns, "app=dist", 2, &["Running"]).await;
    for pod in &dist {
        let pod = pod_json(pod);
        let name = pod["metadata"]["name"].as_str().unwrap();
        let out = until(
            node,
            &ns,
            &format!("{name}'s trainer's probe"),
            async || {
                let log = kubectl(node, &["logs", "-n", &ns, name, "-c", "trainer"]).ok()?;
                Some(printed(&log)).filter(|m| m.contains_key("cpu"))
            },
        )
        .await;
        assert_eq!(p(&out, "metrics"), "ok", "{name}: {out:?}");
        assert_eq!(p(&out, "mount"), "ro", "{name}: {out:?}");
        assert_limited(&pod, "trainer", &out);
        let exec = |cmd: &str| {
            kubectl(
                node,
                &[
                    "exec",
                    "-n",
                    &ns,
                    name,
                    "-c",
                    "tollgate-metrics",
                    "--",
                    "/bin/sh",
                    "-c",
                    cmd,
                ],
            )
        };
        let sidecar = printed(
            &exec(&PROBE.replace("wget", "true || wget")).unwrap_or_else(|e| panic!("{e}")),
        );
        assert_eq!(p(&sidecar, "uid"), "65534", "{name}'s sidecar: {sidecar:?}");
        assert_eq!(
            p(&sidecar, "mount"),
            "",
            "{name}'s sidecar has no driver: {sidecar:?}"
        );
        assert_limited(&pod, "tollgate-metrics", &sidecar);
        let write = exec("touch /written && echo wrote");
        assert!(
            write
                .as_ref()
                .is_err_and(|e| e.contains("Read-only file system")),
            "{name}'s sidecar's root filesystem is read-only: {write:?}"
        );
        // And it answers /metrics for a scrape from the pod's own loopback.
        let scraped = kubectl(
            node,
            &[
                "exec",
                "-n",
                &ns,
                name,
                "-c",
                "trainer",
                "--",
                "wget",
                "-qO-",
                "http://127.0.0.1:9102/metrics",
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(scraped.contains("tollgate_test_up 1"), "{name}: {scraped}");
    }

    // The opt-out: untouched (no sidecar, no limits), and run.
    let scratch = pods_in(node, &ns, "!app", 1, &["Succeeded"]).await;
    let scratch = scratch
        .iter()
        .map(pod_json)
        .find(|p| p["metadata"]["name"] == "scratch")
        .expect("the opted-out pod");
    assert!(scratch["spec"]["initContainers"].is_null(), "{scratch}");
    assert!(
        scratch["spec"]["containers"][0]["resources"]["limits"].is_null(),
        "{scratch}"
    );
    assert_eq!(logs(node, &ns, "scratch", "c").trim(), "untouched");
    tg.deregister(cp).await;
}

/// Getting started's GPU Job (docs/getting-started.md's train.yaml, with the tests' image
/// and a trainer's command in place of its own) on the node, under the built-in policy
/// where the node's runtime provides the driver (the toolkit's label, as the GPU Operator
/// sets it): it completes, and the page shows what kubectl and `tollgate why` print then.
#[tokio::test]
async fn the_getting_started_job_runs_on_the_node() {
    let Some(node) = common::node::node() else {
        return;
    };
    let _turn = node.turn().await;
    let cp = node.cp;
    // As the way out `why` gives for a missing driver directory says to write it.
    let policy =
        "gpu:\n  classes:\n    nvidia:\n      driver: runtime\n      mounts: []\n      env: []\n"
            .to_owned();
    let tg = tollgate(node, Some(policy), "node-page").await;
    let ns = tg.namespace(cp, &[]).await;
    let mut job: Value = serde_saphyr::from_str(&crate::docs::page_file(
        "docs/getting-started.md",
        "train.yaml",
    ))
    .expect("the page's train.yaml");
    job["metadata"]["namespace"] = json!(ns);
    let trainer = &mut job["spec"]["template"]["spec"]["containers"][0];
    trainer["image"] = json!(BUSYBOX);
    trainer["imagePullPolicy"] = json!("Never");
    trainer["command"] = json!(["/bin/sh", "-c", "echo training; sleep 1; echo done"]);
    let admin = cp.client("admin").await;
    common::apiserver::create(&admin, &job, false)
        .await
        .unwrap_or_else(|e| panic!("{}", e.message));
    completes(node, &ns, "train").await;
    let pods = kubectl(
        node,
        &[
            "get",
            "pods",
            "-n",
            &ns,
            "-l",
            "batch.kubernetes.io/job-name=train",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let names = [(ns.as_str(), "team-a"), (common::node::NAME, "gpu-0")];
    crate::docs::holds_example(
        "docs/getting-started.md",
        "kubectl get pods -n team-a -l batch.kubernetes.io/job-name=train",
        &pods,
        &names,
    );
    let said = why(node, &ns, "job/train", &[]);
    crate::docs::holds_example(
        "docs/getting-started.md",
        "kubectl tollgate why job/train -n team-a",
        &said,
        &names,
    );
    tg.deregister(cp).await;
}

/// Issue 47's Job: a GPU requested without a limit, as many training manifests are
/// written. The apiserver validates the template before any validating webhook, so
/// tollgate's mutating webhook gives the template the limit it would give the pod (limit =
/// request), and the Job is created, its pod run and the Job complete.
#[tokio::test]
async fn a_gpu_job_without_limits_is_created_and_completes() {
    let Some(node) = common::node::node() else {
        return;
    };
    let _turn = node.turn().await;
    let cp = node.cp;
    let tg = tollgate(node, Some(driver_policy(node)), "node-nolimit").await;
    let ns = tg.namespace(cp, &[]).await;
    let admin = cp.client("admin").await;
    let trainer = container(
        "trainer",
        json!({"requests": {"cpu": "100m",
        "memory": "64Mi", "nvidia.com/gpu": "1"}}),
        "echo trained",
    );
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train-gpu", "namespace": ns},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
            "containers": [trainer]}}}});
    let stored = common::apiserver::create(&admin, &job, false)
        .await
        .unwrap_or_else(|e| panic!("the GPU Job without limits, refused: {}", e.message));
    assert_eq!(
        stored.pointer("/spec/template/spec/containers/0/resources/limits/nvidia.com~1gpu"),
        Some(&json!("1")),
        "the template's limit, as the pod's would be: {stored}"
    );
    completes(node, &ns, "train-gpu").await;
    let pods = pods_in(
        node,
        &ns,
        "batch.kubernetes.io/job-name=train-gpu",
        1,
        &["Succeeded"],
    )
    .await;
    let pod = pod_json(&pods[0]);
    let name = pod["metadata"]["name"].as_str().unwrap();
    let out = printed(&logs(node, &ns, name, "trainer"));
    assert_eq!(out.get("mount").map(String::as_str), Some("ro"), "{out:?}");
    assert_limited(&pod, "trainer", &out);
    tg.deregister(cp).await;
}

/// A compliant GPU Job at Pod Security `baseline` and `restricted`, with the policy that
/// mounts the driver: tollgate gives it no hostPath there (the levels forbid one) and a
/// sidecar the level admits, and it completes.
#[tokio::test]
async fn a_compliant_gpu_job_completes_at_baseline_and_restricted() {
    let Some(node) = common::node::node() else {
        return;
    };
    let _turn = node.turn().await;
    let cp = node.cp;
    let tg = tollgate(node, Some(driver_policy(node)), "node-psa").await;
    let admin = cp.client("admin").await;
    for level in ["baseline", "restricted"] {
        let ns = tg
            .namespace(cp, &[("pod-security.kubernetes.io/enforce", level)])
            .await;
        let mut trainer = container("trainer", small(1), "echo trained");
        trainer["securityContext"] = json!({"runAsNonRoot": true, "runAsUser": 1000,
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}});
        let job = json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": ns},
            "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
                "containers": [trainer]}}}});
        common::apiserver::create(&admin, &job, false)
            .await
            .unwrap_or_else(|e| panic!("{level}: {}", e.message));
        completes(node, &ns, "train").await;
        let pods = pods_in(
            node,
            &ns,
            "batch.kubernetes.io/job-name=train",
            1,
            &["Succeeded"],
        )
        .await;
        let pod = pod_json(&pods[0]);
        let name = pod["metadata"]["name"].as_str().unwrap();
        let out = printed(&logs(node, &ns, name, "trainer"));
        assert_eq!(
            out.get("metrics").map(String::as_str),
            Some("ok"),
            "{level}: {out:?}"
        );
        assert_eq!(
            out.get("mount").map(String::as_str),
            Some(""),
            "{level}: no hostPath: {out:?}"
        );
        assert_eq!(
            out.get("uid").map(String::as_str),
            Some("1000"),
            "{level}: {out:?}"
        );
        assert_limited(&pod, "trainer", &out);
    }
    tg.deregister(cp).await;
}

/// `tollgate why OBJECT`, once it says `reason` (the kubelet's event comes a moment before
/// the pod's status, which tollgate reads too) and what tollgate adds to it, `ours`.
async fn until_said(node: &Node, ns: &str, object: &str, reason: &str, ours: &str) -> String {
    let mut last = String::new();
    until(
        node,
        ns,
        &format!("tollgate why {object} to say {reason}"),
        async || {
            last = why(node, ns, object, &[]);
            last.contains(reason).then_some(())
        },
    )
    .await;
    // Said by the event: the status follows within the kubelet's next sync.
    let start = Instant::now();
    while !last.contains(ours) && start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        last = why(node, ns, object, &[]);
    }
    last
}

/// The built-in policy on a GPU node without `/usr/local/nvidia` and without the toolkit's
/// label: `driver: auto` mounts the hostPath, and the kubelet cannot. tollgate says so in
/// the kubelet's words and names its own volume and the ways out.
#[tokio::test]
async fn a_missing_driver_directory_is_said_in_the_kubelets_words() {
    let Some(node) = common::node::node() else {
        return;
    };
    let _turn = node.turn().await;
    let cp = node.cp;
    // With the background audit, whose metric counts the pod's start finding.
    let tg = tollgate_with(
        node,
        None,
        "node-nodriver",
        &["--audit-interval", "1s", "--metrics-listen", "127.0.0.1:0"],
    )
    .await;
    let ns = tg.namespace(cp, &[]).await;
    let admin = cp.client("admin").await;
    let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "dist", "namespace": ns},
        "spec": {"replicas": 1, "serviceName": "dist",
            "selector": {"matchLabels": {"app": "dist"}},
            "template": {"metadata": {"labels": {"app": "dist"}}, "spec": {
                "containers": [container("trainer", small(1), "sleep 3600")]}}}});
    common::apiserver::create(&admin, &sts, false)
        .await
        .unwrap_or_else(|e| panic!("{}", e.message));
    let pod = until_said(
        node,
        &ns,
        "pod/dist-0",
        "FailedMount",
        "tollgate's driver mount",
    )
    .await;
    for said in [
        "hostPath type check failed",
        "tollgate-nvidia-driver",
        "tollgate's driver mount",
        "nvidia.com/gpu.deploy.container-toolkit=true",
        "driver: runtime",
        "/usr/local/nvidia",
    ] {
        assert!(pod.contains(said), "why pod/dist-0 says {said:?}:\n{pod}");
    }
    let set = why(node, &ns, "statefulset/dist", &[]);
    // docs/troubleshooting.md shows this run.
    crate::docs::holds_example(
        "docs/troubleshooting.md",
        "kubectl tollgate why statefulset/dist -n ml",
        &set,
        &[(&ns, "ml"), (common::node::NAME, "gpu-0")],
    );
    assert!(!set.contains("no pods yet"), "its pod is there:\n{set}");
    for said in ["pod dist-0", "FailedMount", "tollgate's driver mount"] {
        assert!(
            set.contains(said),
            "why statefulset/dist says {said:?}:\n{set}"
        );
    }
    audited(node, &ns, "dist-0", "FailedMount").await;
    let metrics = tg.served.metrics_addr.expect("the server's metrics");
    until(
        node,
        &ns,
        "tollgate_audit_findings{rule=\"start\"} to count the pod",
        async || {
            let samples = common::scrape::parse(&common::net::get_metrics(metrics).await);
            let n = common::scrape::value(
                &samples,
                "tollgate_audit_findings",
                &[("namespace", &ns), ("rule", "start")],
            );
            (n == Some(1.0)).then_some(())
        },
    )
    .await;
    tg.deregister(cp).await;
}

/// `tollgate audit -n NS -o json` reports the pod's start failure (rule `start`, the
/// kubelet's reason in its message).
async fn audited(node: &Node, ns: &str, pod: &str, reason: &str) {
    let kubeconfig = node.cp.kubeconfig("admin").to_string_lossy().into_owned();
    let out = common::bin::run(
        &["audit", "-n", ns, "-o", "json", "--kubeconfig", &kubeconfig],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let found = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|f| {
            f["object"]["name"] == pod
                && f["rule"] == "start"
                && f["message"].as_str().is_some_and(|m| m.contains(reason))
        });
    assert!(
        found,
        "audit reports {pod}'s {reason}:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A policy's sidecar whose image the node does not have (pulled never), and one whose
/// securityContext asks for a non-root user its image does not name: each said by `why`
/// in the kubelet's words, and by the audit.
#[tokio::test]
async fn a_sidecar_the_node_cannot_start_is_said_in_the_kubelets_words() {
    let Some(node) = common::node::node() else {
        return;
    };
    let _turn = node.turn().await;
    let cp = node.cp;
    let admin = cp.client("admin").await;
    let cases = [
        (
            "image: tollgate.test/absent-exporter:1\n      imagePullPolicy: Never\n",
            "ErrImageNeverPull",
            "tollgate's metrics sidecar",
        ),
        (
            // A sidecar whose environment reads a Secret the pod's namespace lacks: the
            // kubelet does not create it. (One that would run as root under the shipped
            // runAsNonRoot, the refusal the kubelet gives an image's root user, tollgate
            // never makes: the shipped sidecar names uid 65534, a policy cannot take it
            // away (`null` keeps the built-in value) and one that sets uid 0 is refused
            // at load, as restricted would refuse it.)
            "image: tollgate.test/busybox:1\n      imagePullPolicy: Never\n      \
             env: [{name: TOKEN, valueFrom: {secretKeyRef: {name: metrics-token, key: token}}}]\n",
            "CreateContainerConfigError",
            "mutation.metricsSidecar.container.env",
        ),
    ];
    for (sidecar, reason, said) in cases {
        let policy = format!(
            "mutation:\n  metricsSidecar:\n    container:\n      name: tollgate-metrics\n      \
             {sidecar}      command: [/bin/sh, -c, 'sleep 3600']\n      resources:\n        \
             requests: {{cpu: 50m, memory: 64Mi}}\n        limits: {{cpu: 200m, memory: 128Mi}}\n{}",
            driver_policy(node)
        );
        let tg = tollgate(node, Some(policy), "node-sidecar").await;
        let ns = tg.namespace(cp, &[]).await;
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer", "namespace": ns},
            "spec": {"restartPolicy": "Never",
                "containers": [container("trainer", small(1), "sleep 3600")]}});
        common::apiserver::create(&admin, &pod, false)
            .await
            .unwrap_or_else(|e| panic!("{reason}: {}", e.message));
        let out = until_said(node, &ns, "pod/trainer", reason, said).await;
        assert!(out.contains(said), "{reason}: why says {said:?}:\n{out}");
        assert!(
            out.contains("tollgate-metrics"),
            "{reason}: names the container:\n{out}"
        );
        audited(node, &ns, "trainer", reason).await;
        tg.deregister(cp).await;
    }
}

/// How many generated pods [`generated_pods_run_or_why_says_the_kubelets_reason`] makes.
const GENERATED: u64 = 54;

/// The Pod Security levels of the property's namespaces.
const LEVELS: [Option<&str>; 3] = [None, Some("baseline"), Some("restricted")];

/// One generated pod: its object, the level of the namespace it goes to, the containers
/// that use GPUs, and the kubelet's reason it cannot start where it was made so.
struct Generated {
    pod: Value,
    level: usize,
    gpu_containers: Vec<String>,
    cpu_containers: Vec<String>,
    cannot: Option<(&'static str, String)>,
}

/// Requests small enough that a batch of generated pods fits the node's two CPUs at once
/// (tollgate's sidecar asks 50m of its own).
fn tiny(gpus: u32) -> Value {
    let mut r = small(gpus);
    r["requests"]["cpu"] = json!("20m");
    r["requests"]["memory"] = json!("32Mi");
    r
}

/// A container's log through the apiserver and the kubelet, as `kubectl logs` reads it.
async fn api_logs(api: &Api<Pod>, pod: &str, container: &str) -> String {
    let params = kube::api::LogParams {
        container: Some(container.to_owned()),
        ..Default::default()
    };
    api.logs(pod, &params)
        .await
        .unwrap_or_else(|e| panic!("the log of {pod}/{container}: {e}"))
}

/// A pod over the shapes tollgate mutates: GPUs in some containers, one to three of them,
/// init containers (one a native sidecar of the user's own), securityContexts of the
/// user's (as the level allows), volumes of its own, and now and then an image the node
/// does not have (pulled never), whose reason `why` must give.
fn generated(seed: u64) -> Generated {
    let mut rng = common::rng::Rng::new(seed);
    let level = rng.below(LEVELS.len());
    let restricted = LEVELS[level] == Some("restricted");
    let mut gpu_containers = vec![];
    let mut cpu_containers = vec![];
    let secured = |rng: &mut common::rng::Rng| -> Option<Value> {
        if restricted {
            // What restricted requires of every container (busybox runs as root: name a uid).
            Some(
                json!({"runAsNonRoot": true, "runAsUser": 1000 + rng.below(1000),
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"}}),
            )
        } else {
            match rng.below(4) {
                0 => Some(json!({"runAsUser": 1000 + rng.below(1000)})),
                1 => Some(json!({"readOnlyRootFilesystem": true})),
                2 => Some(json!({"allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}})),
                _ => None,
            }
        }
    };
    let n = 1 + rng.below(3);
    let mut containers = vec![];
    for i in 0..n {
        let gpus = u32::from(rng.chance(50));
        let name = format!("c{i}");
        let mut c = container(&name, tiny(gpus), "echo done");
        if let Some(s) = secured(&mut rng) {
            c["securityContext"] = s;
        }
        if rng.chance(30) {
            c["volumeMounts"] = json!([{"name": "scratch", "mountPath": "/scratch"}]);
        }
        if gpus > 0 {
            gpu_containers.push(name);
        } else {
            cpu_containers.push(name);
        }
        containers.push(c);
    }
    let mut init = vec![];
    if rng.chance(40) {
        let mut c = json!({"name": "fetch", "image": BUSYBOX, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", "echo fetched"], "resources": tiny(0)});
        if let Some(s) = secured(&mut rng) {
            c["securityContext"] = s;
        }
        init.push(c);
    }
    if rng.chance(30) {
        // The user's own native sidecar, beside tollgate's.
        let mut c = json!({"name": "logs", "image": BUSYBOX, "imagePullPolicy": "Never",
            "restartPolicy": "Always", "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
            "resources": tiny(0)});
        if let Some(s) = secured(&mut rng) {
            c["securityContext"] = s;
        }
        init.push(c);
    }
    let mut cannot = None;
    if rng.chance(10) {
        let i = rng.below(containers.len());
        containers[i]["image"] = json!("tollgate.test/absent:1");
        let name = containers[i]["name"].as_str().unwrap().to_owned();
        cannot = Some(("ErrImageNeverPull", name));
    }
    let mut spec = json!({"restartPolicy": "Never", "containers": containers,
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "terminationGracePeriodSeconds": 2});
    if !init.is_empty() {
        spec["initContainers"] = json!(init);
    }
    if rng.chance(40) {
        spec["securityContext"] = json!({"fsGroup": 2000});
    }
    if restricted {
        spec["securityContext"]["seccompProfile"] = json!({"type": "RuntimeDefault"});
    }
    if gpu_containers.is_empty() {
        spec = on_the_only_node(spec);
    }
    Generated {
        pod: json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("gen-{seed}"), "labels": {"gen": "true"}},
            "spec": spec}),
        level,
        gpu_containers,
        cpu_containers,
        cannot,
    }
}

/// The property: pods generated over the shapes tollgate mutates, at each Pod Security
/// level, made through the apiserver and the webhooks: each Succeeds on the node (the
/// driver mounted read-only in its GPU containers only, its cgroups as tollgate limited
/// them), or, made so that it cannot start, `tollgate why` gives the kubelet's reason and
/// names the container. Seeded: `TOLLGATE_NODE_SEED` moves the seeds; a failure names its.
#[tokio::test]
async fn generated_pods_run_or_why_says_the_kubelets_reason() {
    let Some(node) = common::node::node() else {
        return;
    };
    let _turn = node.turn().await;
    let cp = node.cp;
    let base: u64 = std::env::var("TOLLGATE_NODE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let tg = tollgate(node, Some(driver_policy(node)), "node-gen").await;
    let mut namespaces = vec![];
    for level in LEVELS {
        let labels: Vec<(&str, &str)> = level
            .map(|l| vec![("pod-security.kubernetes.io/enforce", l)])
            .unwrap_or_default();
        namespaces.push(tg.namespace(cp, &labels).await);
    }
    let admin = cp.client("admin").await;
    let started = Instant::now();
    let mut made = vec![];
    for seed in base..base + GENERATED {
        let g = generated(seed);
        let ns = namespaces[g.level].clone();
        let mut pod = g.pod.clone();
        pod["metadata"]["namespace"] = json!(ns);
        common::apiserver::create(&admin, &pod, false)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: created in {ns}: {}\n{pod}", e.message));
        made.push((seed, ns, g));
    }
    // Judged as each is done, in whatever order the node gets to them (a pod that cannot
    // start holds its GPUs until it is judged and deleted, which lets the others in).
    let (mut ran, mut said) = (0, 0);
    let mut waiting: Vec<(u64, String, Generated)> = made;
    while !waiting.is_empty() {
        if started.elapsed() > BOUND * 3 {
            let left: Vec<String> = waiting
                .iter()
                .map(|(s, ns, _)| format!("{ns}/gen-{s}"))
                .collect();
            panic!(
                "generated pods not done: {left:?}\n{}",
                story(node, &waiting[0].1).await
            );
        }
        let mut still = vec![];
        for (seed, ns, g) in waiting {
            let name = format!("gen-{seed}");
            let what = format!("seed {seed} (pod {ns}/{name})");
            let api = Api::<Pod>::namespaced(admin.clone(), &ns);
            let Ok(p) = api.get(&name).await else {
                still.push((seed, ns, g));
                continue;
            };
            let pod = pod_json(&p);
            let phase = pod["status"]["phase"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if let Some((reason, container)) = &g.cannot {
                let waits = |key: &str| {
                    pod["status"][key]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|s| {
                            s["name"] == container.as_str()
                                && s["state"]["waiting"]["reason"] == *reason
                        })
                };
                if !waits("containerStatuses") {
                    still.push((seed, ns, g));
                    continue;
                }
                let out = why(node, &ns, &format!("pod/{name}"), &[]);
                assert!(
                    out.contains(&format!("container {container}: {reason}")),
                    "{what}: why names the container and the kubelet's reason:\n{out}"
                );
                said += 1;
            } else {
                if phase == "Failed" {
                    panic!(
                        "{what} failed:\n{}\n{}",
                        why(node, &ns, &format!("pod/{name}"), &[]),
                        story(node, &ns).await
                    );
                }
                if phase != "Succeeded" {
                    still.push((seed, ns, g));
                    continue;
                }
                // The driver's mount in the GPU containers only, read-only, and only where
                // the level allows a hostPath.
                let driver = if LEVELS[g.level].is_none() { "ro" } else { "" };
                let gpu = g.gpu_containers.iter().map(|c| (c, driver));
                for (c, mount) in gpu.chain(g.cpu_containers.iter().map(|c| (c, ""))) {
                    let out = printed(&api_logs(&api, &name, c).await);
                    assert_eq!(
                        out.get("mount").map(String::as_str),
                        Some(mount),
                        "{what}: {c}: {out:?}"
                    );
                    assert_as_stored(&pod, c, &out);
                }
                ran += 1;
            }
            // Judged: out of the node's way.
            let _ = api
                .delete(&name, &kube::api::DeleteParams::default().grace_period(0))
                .await;
        }
        waiting = still;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "node: {GENERATED} generated pods (seeds {base}..{}): {ran} succeeded as tollgate made \
         them, {said} said in the kubelet's words, in {:.1} s",
        base + GENERATED,
        started.elapsed().as_secs_f64()
    );
    assert!(
        ran >= GENERATED as usize * 3 / 4 && said > 0,
        "{ran} ran, {said} said"
    );
    tg.deregister(cp).await;
}

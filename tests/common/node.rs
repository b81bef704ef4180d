//! A real node for the tests: Debian's containerd and the kubelet v1.36 of the envtest
//! binaries, registered with a control plane of its own ([`super::envtest`]'s node plane:
//! the real scheduler, the workload controllers and the node lifecycle controller), so that
//! the pods tollgate makes have their containers started, their volumes mounted and their
//! cgroups limited by the real kubelet and runc.
//!
//! What it is (../shared/envtest/NODE.md has what was learnt on this kind of machine):
//! - **One node, `localhost`**, Ready, registered as a GPU pool is: tainted
//!   `nvidia.com/gpu=present:NoSchedule`, labelled `nvidia.com/gpu.present=true` and
//!   `nvidia.com/gpu.product` (and not `nvidia.com/gpu.deploy.container-toolkit`: its runtime
//!   injects no driver, so the shipped policy's `driver: auto` mounts the hostPath), and
//!   offering [`GPUS`] `nvidia.com/gpu`, advertised through the Node's `status` as
//!   Kubernetes documents for extended resources; the kubelet admits a GPU pod there as on
//!   a GPU node. [`Node::driver_dir`] is a driver directory (with a file in it) that a
//!   policy may mount; `/usr/local/nvidia`, the shipped policy's, is absent.
//! - **Images made here**, never pulled: docker-archives of Debian's static busybox
//!   ([`images`]) for the sandbox (`pause`), the tests' trainers ([`BUSYBOX`]) and a
//!   stand-in for the policy's metrics sidecar that answers `GET /metrics` on its port and
//!   exits on SIGTERM as the real exporter does. Every registry resolves to a loopback port
//!   nothing listens on, so an absent image fails at once and nothing leaves the machine.
//! - **The network**: the CNI bridge `tgbr0` on 10.244.7.0/24 with no default route in the
//!   pods, and a FORWARD rule that drops whatever that subnet sends outside itself (no
//!   kube-proxy runs: the Service address leads nowhere). Tests reach a pod only through the
//!   kubelet on 127.0.0.1 (`kubectl logs`/`exec`) or from inside the pod itself.
//! - **One at a time per machine**: the bridge, the subnet and the kubelet's cgroups and
//!   iptables chains are the machine's, so the runner holds a lock ([`LOCK`]) from before
//!   it starts anything until it has removed everything; a second test process waits.
//! - **Removed completely** however the test process ends, as the control plane is: the
//!   runner waits for its standard input to close, then stops the kubelet, kills every
//!   container of its containerd, containerd and its shims (by the PIDs it wrote and by the
//!   shims' `-address`, its own socket), removes the network namespaces the CNI made, the
//!   mounts under its directory, the bridge, the iptables rules and chains, the CNI's
//!   cached results for its network and the `kubepods` cgroups, then its directory.
//!   `.ci/node-leftovers` checks, after the test process, that nothing is left.
//! - **Skipped, or failed under CI**: where the machine cannot run a node (not root, or
//!   without containerd, runc, the CNI plugins, a static busybox, iptables or the kubelet
//!   binary) the tests that need it print `SKIPPED <test>: <why>` and pass; with `CI=true`
//!   they fail. `.ci/run` installs the packages where it runs as root.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::envtest::ControlPlane;

/// The Node's name: the apiserver dials the kubelet by it (`--kubelet-preferred-address-types
/// Hostname`), so `kubectl logs` and `exec` stay on loopback.
pub const NAME: &str = "localhost";

/// The `nvidia.com/gpu` the node offers.
pub const GPUS: u32 = 8;

/// The image of the tests' own containers: Debian's static busybox, its applets on PATH.
pub const BUSYBOX: &str = "tollgate.test/busybox:1";

/// The pod network's subnet and bridge (the machine's: one node at a time).
const SUBNET: &str = "10.244.7.0/24";
const BRIDGE: &str = "tgbr0";

/// The machine-wide lock the node's runner holds while anything of a node is up.
const LOCK: &str = "/run/lock/tollgate-test-node.lock";

/// The CNI plugins' directories, Debian's first.
const CNI_DIRS: &[&str] = &["/usr/lib/cni", "/opt/cni/bin"];

/// How long a test waits for the node (another test process may hold it): a safety bound.
const BOUND: Duration = Duration::from_secs(600);

pub struct Node {
    pub cp: &'static ControlPlane,
    /// The node's scratch directory: containerd's root and state, the kubelet's root, the
    /// pods' logs, the images, the driver directory.
    pub dir: PathBuf,
    /// A driver directory on the node, with `lib64/libnvidia-ml.so.1` and `version` in it,
    /// for a policy whose GPU class mounts it.
    pub driver_dir: PathBuf,
    /// The metrics sidecar's image in the shipped policy, which the node has a stand-in of.
    pub sidecar_image: String,
    /// From the node's first process (containerd) to the Node Ready, untainted and offering
    /// its GPUs.
    pub start_to_ready: Duration,
    /// One test at a time has the node: its two CPUs and eight GPUs are then all the
    /// test's, so that what one test asserts (a pod scheduled, `why`'s words) is not
    /// another's contention. Tests of other planes run meanwhile.
    turn: tokio::sync::Mutex<()>,
}

impl Node {
    /// The node, for this test alone until the guard is dropped.
    pub async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.turn.lock().await
    }
}

static NODE: OnceLock<Result<Node, (bool, String)>> = OnceLock::new();

/// The node, started on first use; None (with a `SKIPPED` line) where this machine cannot
/// run one or no control plane binaries are found. Panics where it should start and does
/// not, and, with `CI=true`, where it cannot.
pub fn node() -> Option<&'static Node> {
    let cp = super::envtest::node_control_plane()?;
    match NODE.get_or_init(|| start(cp)) {
        Ok(n) => Some(n),
        Err((true, why)) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{why} (CI=true: the node's tests may not be skipped)");
            }
            super::envtest::skipped(why);
            None
        }
        Err((false, why)) => panic!("{why}"),
    }
}

/// What this machine lacks to run a node, if anything.
fn missing(cp: &ControlPlane) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        == Some("0");
    if !root {
        return Some("a node needs root (containerd and the kubelet)".into());
    }
    if !cp.assets.join("kubelet").is_file() {
        return Some(format!("no kubelet in {}", cp.assets.display()));
    }
    for cmd in ["containerd", "ctr", "runc", "iptables", "ip", "flock"] {
        if which(cmd).is_none() {
            return Some(format!(
                "no {cmd} on PATH (Debian: containerd, runc, iptables, iproute2, util-linux)"
            ));
        }
    }
    if cni_dir().is_none() {
        return Some(format!(
            "no CNI bridge, host-local and loopback plugins in {CNI_DIRS:?} \
             (Debian: containernetworking-plugins)"
        ));
    }
    match busybox() {
        Some(_) => None,
        None => Some("no statically linked busybox (Debian: busybox-static)".into()),
    }
}

fn which(cmd: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
}

fn cni_dir() -> Option<&'static str> {
    CNI_DIRS.iter().copied().find(|d| {
        ["bridge", "host-local", "loopback"]
            .iter()
            .all(|p| Path::new(d).join(p).is_file())
    })
}

/// A busybox that runs in an image of nothing else: statically linked (no `PT_INTERP`
/// program header: Debian's `busybox` package is dynamic, `busybox-static` is not).
fn busybox() -> Option<PathBuf> {
    let path = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .chain(which("busybox"))
        .find(|p| p.is_file())?;
    let elf = std::fs::read(&path).ok()?;
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 {
        return None;
    }
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().ok()?) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    let interp = (0..count).any(|i| {
        let at = phoff + i * size;
        elf.get(at..at + 4) == Some(&3u32.to_le_bytes()[..])
    });
    (!interp).then_some(path)
}

fn start(cp: &'static ControlPlane) -> Result<Node, (bool, String)> {
    if let Some(why) = missing(cp) {
        return Err((true, why));
    }
    let broken = |e: String| (false, e);
    let dir = tempfile::Builder::new()
        .prefix("tollgate-node-")
        .tempdir()
        .map_err(|e| broken(format!("node: a scratch directory: {e}")))?
        // The runner removes it once the node is gone.
        .keep();
    let sidecar_image = shipped_sidecar_image();
    prepare(cp, &dir, &sidecar_image).map_err(broken)?;
    let script = runner_script(&dir);
    let runner = super::envtest::run(&script, &dir, &cp.assets).map_err(broken)?;
    cp.hold(runner);
    let log = |name: &str| {
        let text = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    };
    let failed = |what: &str| {
        broken(format!(
            "node: {what}\n-- node.state --\n{}\n-- containerd.log --\n{}\n-- import.log --\n{}\
             \n-- kubelet.log --\n{}",
            log("node.state"),
            log("containerd.log"),
            log("import.log"),
            log("kubelet.log")
        ))
    };
    let state = || std::fs::read_to_string(dir.join("node.state")).unwrap_or_default();

    // Until the runner holds the machine's lock (another test process's node may hold it).
    let waited = Instant::now();
    while !state().contains("locked") {
        if waited.elapsed() > BOUND {
            return Err(failed("the machine's node lock was not had"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let started = Instant::now();
    let ready = std::thread::spawn({
        let dir = dir.clone();
        move || ready(cp, &dir)
    })
    .join()
    .map_err(|_| failed("the readiness wait panicked"))?;
    if let Err(e) = ready {
        return Err(failed(&e));
    }
    let start_to_ready = started.elapsed();
    let _ = writeln!(
        std::io::stderr(),
        "node {NAME}: containerd and kubelet start to Ready (tainted, labelled, {GPUS} GPUs) \
         in {:.1} s",
        start_to_ready.as_secs_f64()
    );
    Ok(Node {
        cp,
        driver_dir: dir.join("nvidia"),
        dir,
        sidecar_image,
        start_to_ready,
        turn: tokio::sync::Mutex::new(()),
    })
}

/// The metrics sidecar's image in policies/default.yaml (the stand-in is made under it).
fn shipped_sidecar_image() -> String {
    let policy = super::builtin_policy();
    let v = serde_json::to_value(&policy.mutation.metrics_sidecar.container)
        .expect("the sidecar container as JSON");
    v["image"]
        .as_str()
        .expect("the shipped sidecar has an image")
        .to_owned()
}

/// The node's files: containerd's and the kubelet's configurations, the registries that
/// refuse, the CNI network, the images, the driver directory.
fn prepare(cp: &ControlPlane, dir: &Path, sidecar_image: &str) -> Result<(), String> {
    let d = dir.display();
    for sub in [
        "ctd/root",
        "ctd/state",
        "ctd/runc",
        "ctd/opt",
        "cni/net.d",
        "cni/ipam",
        "kubelet/root",
        "kubelet/logs",
        "img",
        "nvidia/lib64",
    ] {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| format!("node: {sub}: {e}"))?;
    }
    let write = |name: &str, text: String| {
        std::fs::write(dir.join(name), text).map_err(|e| format!("node: {name}: {e}"))
    };
    write("nvidia/version", "tollgate-test-driver 1.0\n".into())?;
    write("nvidia/lib64/libnvidia-ml.so.1", "not a library\n".into())?;
    let runc = which("runc").unwrap();
    write(
        "ctd/config.toml",
        format!(
            r#"version = 2
root = "{d}/ctd/root"
state = "{d}/ctd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "{d}/ctd/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/ctd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # Root on these machines lacks CAP_SYS_RESOURCE: no process may lower its oom_score_adj,
  # which the CRI asks of every sandbox (-998); clamped to containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{d}/ctd/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}"
    conf_dir = "{d}/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{d}/ctd/hosts"
"#,
            runc = runc.display(),
            cni = cni_dir().unwrap(),
        ),
    )?;
    // Every registry (docker.io is named apart: containerd treats it specially) resolves
    // to a loopback port nothing listens on (the older registry.mirrors would fall back to
    // the registry's own host).
    for host in ["_default", "docker.io"] {
        std::fs::create_dir_all(dir.join("ctd/hosts").join(host)).map_err(|e| e.to_string())?;
        write(
            &format!("ctd/hosts/{host}/hosts.toml"),
            "server = \"http://127.0.0.1:9\"\n[host.\"http://127.0.0.1:9\"]\n  \
             capabilities = [\"pull\", \"resolve\"]\n"
                .into(),
        )?;
    }
    // A lookup inside a pod goes to its own loopback, and nowhere.
    write("resolv.conf", "nameserver 127.0.0.1\n".into())?;
    write(
        "cni/net.d/10-tollgate.conflist",
        json!({"cniVersion": "1.0.0", "name": "tgnet", "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": false,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET}]],
                      "dataDir": format!("{d}/cni/ipam")}},
            {"type": "loopback"}]})
        .to_string(),
    )?;
    let (port, healthz) = (super::envtest::free_port(), super::envtest::free_port());
    write(
        "kubelet/config.yaml",
        format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}
authorization: {{mode: AlwaysAllow}}
address: 127.0.0.1
port: {port}
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
readOnlyPort: 0
evictionHard: {{}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
containerRuntimeEndpoint: unix://{d}/ctd/containerd.sock
localStorageCapacityIsolation: false
podLogsDir: {d}/kubelet/logs
resolvConf: {d}/resolv.conf
# Pods' lookups go to their own loopback (nothing answers): no MissingClusterDNS warnings.
clusterDNS: [127.0.0.1]
clusterDomain: cluster.local
registerWithTaints: [{{key: nvidia.com/gpu, value: present, effect: NoSchedule}}]
"#
        ),
    )?;
    // The kubelet acts as the admin: what it may do is not what these tests are about.
    std::fs::copy(cp.kubeconfig("admin"), dir.join("kubelet/kubeconfig"))
        .map_err(|e| format!("node: the kubelet's kubeconfig: {e}"))?;
    images(&dir.join("img"), sidecar_image)
}

/// The runner: takes the machine's lock, starts containerd, imports the images, starts
/// the kubelet; once its standard input closes (this process has ended), removes all of it.
fn runner_script(dir: &Path) -> String {
    let d = dir.display();
    let labels = "nvidia.com/gpu.present=true,nvidia.com/gpu.product=Tollgate-Test-GPU";
    format!(
        r#"set -u
cd "$1"
D="{d}"
C="ctr -a $D/ctd/containerd.sock -n k8s.io"
exec 9>>{LOCK}
if ! flock -w {bound} 9; then echo "lock not had" >node.state; exit 1; fi
echo locked >node.state
ls /var/run/netns 2>/dev/null >netns.before || : >netns.before
iptables -I FORWARD -s {SUBNET} ! -d {SUBNET} -m comment --comment tollgate-test-node -j DROP
# The daemons do not hold the lock: only this shell does, until all is removed.
containerd --config ctd/config.toml >containerd.log 2>&1 </dev/null 9>&- &
echo $! >containerd.pid
for i in $(seq 200); do $C version >/dev/null 2>&1 && break; sleep 0.1; done
for f in img/*.tar; do $C images import "$f" >>import.log 2>&1 9>&- || echo "failed: $f" >>import.log; done
"$2/kubelet" --config kubelet/config.yaml --kubeconfig kubelet/kubeconfig --root-dir "$D/kubelet/root" \
  --hostname-override {NAME} --node-labels {labels} >kubelet.log 2>&1 </dev/null 9>&- &
echo $! >kubelet.pid
echo started >>node.state
# Until the test process lets go of our standard input: it has ended, one way or another.
cat >/dev/null
stop() {{
  [ -f "$1.pid" ] || return 0
  p=$(cat "$1.pid"); kill "$p" 2>/dev/null
  for i in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; rm -f "$1.pid"
}}
stop kubelet
# The pods' containers: every task and container of this containerd, then the daemon.
for t in $($C tasks ls -q 2>/dev/null); do $C tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
sleep 1
for c in $($C containers ls -q 2>/dev/null); do $C tasks delete -f "$c" >/dev/null 2>&1; $C containers delete "$c" >/dev/null 2>&1; done
stop containerd
# Shims outlive containerd: ours are those whose -address is our socket.
for p in $(grep -l -a -- "$D/ctd/containerd.sock" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do
  [ "$p" = "$$" ] || kill -9 "$p" 2>/dev/null
done
# The network namespaces the CNI made for our pods (not there before we started).
for n in $(ls /var/run/netns 2>/dev/null); do
  grep -qx "$n" netns.before || {{ umount "/var/run/netns/$n" 2>/dev/null; rm -f "/var/run/netns/$n"; }}
done
rm -f /var/lib/cni/results/tgnet-*
# Mounts under the scratch directory, deepest first.
for m in $(awk -v d="$D" 'index($2, d) == 1 {{print $2}}' /proc/mounts | sort -r); do umount -l "$m" 2>/dev/null; done
ip link del {BRIDGE} 2>/dev/null
while iptables -D FORWARD -s {SUBNET} ! -d {SUBNET} -m comment --comment tollgate-test-node -j DROP 2>/dev/null; do :; done
# The kubelet's iptables chains, in every table it used.
for ipt in iptables ip6tables; do
  for tb in filter nat mangle; do
    $ipt -t $tb -D INPUT -j KUBE-FIREWALL 2>/dev/null; $ipt -t $tb -D OUTPUT -j KUBE-FIREWALL 2>/dev/null
    for ch in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do $ipt -t $tb -F $ch 2>/dev/null; $ipt -t $tb -X $ch 2>/dev/null; done
  done
done
# The kubelet's cgroups (kubepods in every hierarchy), leaves first.
for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
  [ -d "$h/kubepods" ] && find "$h/kubepods" -depth -type d -exec rmdir {{}} + 2>/dev/null
done
rmdir /run/containerd/s /run/containerd/fifo /run/containerd 2>/dev/null
cd / && rm -rf "$D"
"#,
        bound = BOUND.as_secs(),
    )
}

/// Waits (bounded) for the Node: Ready, then its GPUs advertised through its status, and
/// the not-ready taint gone (the node lifecycle controller's work).
fn ready(cp: &ControlPlane, dir: &Path) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let nodes = Api::<NodeObject>::all(cp.client("admin").await);
        let exited = || {
            std::fs::read_to_string(dir.join("kubelet.pid"))
                .is_ok_and(|p| !Path::new(&format!("/proc/{}", p.trim())).exists())
        };
        let start = Instant::now();
        let limit = Duration::from_secs(120);
        let mut advertised = false;
        loop {
            if exited() {
                return Err("the kubelet exited".to_string());
            }
            if start.elapsed() > limit {
                return Err(format!("the node was not ready within {limit:?}"));
            }
            if let Ok(node) = nodes.get(NAME).await {
                let status = node.status.clone().unwrap_or_default();
                let is_ready = status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                let gpus = status
                    .allocatable
                    .as_ref()
                    .and_then(|a| a.get("nvidia.com/gpu"))
                    .map(|q| q.0.clone());
                let tainted = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/not-ready"));
                if is_ready && !advertised {
                    nodes
                        .patch_status(
                            NAME,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {"capacity":
                                {"nvidia.com/gpu": GPUS.to_string()}}})),
                        )
                        .await
                        .map_err(|e| format!("advertising the node's GPUs: {e}"))?;
                    advertised = true;
                }
                if is_ready && gpus.as_deref() == Some(&GPUS.to_string()) && !tainted {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// The node's images, as docker-archives in `dir`: one layer of Debian's static busybox
/// (its applets linked in /bin, `nobody` in /etc/passwd, a metrics page in /www), under
/// the sandbox's name, [`BUSYBOX`] and `sidecar_image`.
fn images(dir: &Path, sidecar_image: &str) -> Result<(), String> {
    let layer = layer()?;
    let sh = |s: &str| json!(["/bin/sh", "-c", s]);
    image(
        &dir.join("pause.tar"),
        "registry.k8s.io/pause:3.10",
        json!(null),
        // A sandbox's process: waits, and ends on SIGTERM (PID 1 has no default handler).
        sh("trap 'exit 0' TERM; while :; do sleep 3600 & wait; done"),
        &layer,
    )?;
    image(
        &dir.join("busybox.tar"),
        BUSYBOX,
        json!(null),
        json!(["/bin/sh"]),
        &layer,
    )?;
    // The exporter's stand-in: answers GET /metrics on :9102 whatever args it is given,
    // and exits on SIGTERM as the real one does (a shell that ignored it would hold a
    // Job's pod for its whole grace period).
    image(
        &dir.join("sidecar.tar"),
        sidecar_image,
        json!([
            "/bin/sh",
            "-c",
            "trap 'kill $!; exit 0' TERM; httpd -f -p 9102 -h /www & wait",
            "statsd-exporter"
        ]),
        json!(null),
        &layer,
    )
}

fn layer() -> Result<Vec<u8>, String> {
    let busybox = busybox().ok_or("no static busybox")?;
    let data = std::fs::read(&busybox).map_err(|e| e.to_string())?;
    let out = std::process::Command::new(&busybox)
        .arg("--list")
        .output()
        .map_err(|e| format!("busybox --list: {e}"))?;
    let mut t = Tar::default();
    for d in ["bin", "etc", "proc", "sys", "dev", "www"] {
        t.dir(d, 0o755);
    }
    t.dir("tmp", 0o1777);
    t.file("bin/busybox", 0o755, &data);
    for applet in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if applet != "busybox" {
            t.symlink(&format!("bin/{applet}"), "busybox");
        }
    }
    t.file(
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
    );
    t.file("etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n");
    t.file(
        "www/metrics",
        0o644,
        b"# TYPE tollgate_test_up gauge\ntollgate_test_up 1\n",
    );
    Ok(t.finish())
}

fn image(
    out: &Path,
    tag: &str,
    entrypoint: serde_json::Value,
    cmd: serde_json::Value,
    layer: &[u8],
) -> Result<(), String> {
    use sha2::Digest as _;
    let hex = |b: &[u8]| {
        sha2::Sha256::digest(b)
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    };
    let layer_sha = hex(layer);
    let config = json!({"architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_sha}")]}})
    .to_string();
    let config_sha = hex(config.as_bytes());
    let manifest = json!([{"Config": format!("{config_sha}.json"), "RepoTags": [tag],
        "Layers": [format!("{layer_sha}.tar")]}])
    .to_string();
    let mut t = Tar::default();
    t.file(&format!("{layer_sha}.tar"), 0o644, layer);
    t.file(&format!("{config_sha}.json"), 0o644, config.as_bytes());
    t.file("manifest.json", 0o644, manifest.as_bytes());
    std::fs::write(out, t.finish()).map_err(|e| format!("{}: {e}", out.display()))
}

/// A ustar archive, as much of one as an image needs: directories, files and symlinks,
/// each name under 100 bytes.
#[derive(Default)]
struct Tar(Vec<u8>);

impl Tar {
    fn entry(&mut self, name: &str, mode: u32, kind: u8, link: &str, data: &[u8]) {
        assert!(
            name.len() < 100 && link.len() < 100,
            "a tar name too long: {name}"
        );
        let mut h = [0u8; 512];
        let put = |h: &mut [u8; 512], at: usize, bytes: &[u8]| {
            h[at..at + bytes.len()].copy_from_slice(bytes)
        };
        put(&mut h, 0, name.as_bytes());
        put(&mut h, 100, format!("{mode:07o}\0").as_bytes());
        put(&mut h, 108, b"0000000\0");
        put(&mut h, 116, b"0000000\0");
        put(&mut h, 124, format!("{:011o}\0", data.len()).as_bytes());
        put(&mut h, 136, b"00000000000\0");
        put(&mut h, 148, b"        ");
        h[156] = kind;
        put(&mut h, 157, link.as_bytes());
        put(&mut h, 257, b"ustar\x0000");
        let sum: u32 = h.iter().map(|&b| b as u32).sum();
        put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
        self.0.extend_from_slice(&h);
        self.0.extend_from_slice(data);
        self.0
            .resize(self.0.len() + (512 - data.len() % 512) % 512, 0);
    }

    fn dir(&mut self, name: &str, mode: u32) {
        self.entry(&format!("{name}/"), mode, b'5', "", &[]);
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, mode, b'0', "", data);
    }

    fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o777, b'2', target, &[]);
    }

    fn finish(mut self) -> Vec<u8> {
        self.0.resize(self.0.len() + 1024, 0);
        self.0
    }
}

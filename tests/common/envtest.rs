//! A real control plane for the tests: etcd and kube-apiserver v1.36, the binaries of
//! controller-runtime's envtest, started once per test binary; on demand, the real
//! kube-scheduler and kube-controller-manager beside them.
//!
//! What the apiserver decides (what it decodes, defaults, accepts, stores, compiles and
//! authorizes) is tested here against the apiserver itself, not an imitation; the
//! in-process stand-in (crates/apiserver-standin) is left for the faults this one cannot
//! be made to show on cue.
//!
//! - **Found as envtest finds them**: the directory `KUBEBUILDER_ASSETS` names (what
//!   `setup-envtest use 1.36 -p path` prints), else `../shared/envtest/bin` beside the
//!   repository. Where neither holds a `kube-apiserver` and an `etcd` (and, for
//!   [`scheduling_plane`], a `kube-scheduler` and a `kube-controller-manager`), the plane's
//!   function writes one line, `SKIPPED <test>: ...`, straight to the process's stderr (so
//!   that `cargo test` shows it for a passing test too) and the test returns; with
//!   `CI=true` a missing binary fails the test instead, so that CI can never pass by
//!   skipping it.
//! - **Started once** per plane, on free loopback ports, with a throwaway PKI (a CA and the
//!   apiserver's serving certificate, a ServiceAccount signing key), token authentication
//!   for an admin (`system:masters`) and the named users of [`ROSTER`], and RBAC on. etcd
//!   keeps its data in /dev/shm where there is one (its fsyncs are most of a write).
//! - **Planes of several shapes**, each started only when a test asks for it: [`plane`],
//!   shared by most tests; [`isolated_plane`] and [`policy_objects_plane`] for tests whose
//!   cluster-wide objects would change other tests' answers; [`dra_v1beta1_plane`] and
//!   [`bare_plane`], apiservers started with another `--runtime-config`, for what tollgate
//!   does on a cluster that serves DRA only as v1beta1, or serves no DRA and no CRDs; and
//!   [`scheduling_plane`], with the real scheduler and controllers, for what happens to a
//!   pod after admission.
//! - **Stopped at the end**, however the process ends: every process runs under a shell
//!   that waits for its standard input to close, which happens when this process exits (a
//!   test binary never runs its statics' destructors, and a killed one runs nothing), then
//!   stops them and removes their files.
//! - Each test asks for namespaces of its own ([`ControlPlane::namespace`]), so that tests
//!   sharing a plane never see each other's objects.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The users with a token of their own, and their groups: `admin` may do anything; the
/// others are held to RBAC (and are authenticated, so `system:authenticated` is theirs
/// too). Any other name and groups: [`ControlPlane::kubeconfig_as`] (impersonation).
pub const ROSTER: &[(&str, &[&str])] = &[
    ("admin", &["system:masters"]),
    ("alice", &["ml-researchers"]),
    ("bob", &["ml-researchers"]),
    ("carol", &["platform-team"]),
    ("mallory", &[]),
    // A namespace's admin (tests/why.rs binds her there): a data scientist's rights.
    ("erin", &[]),
];

pub struct ControlPlane {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The CA of the apiserver's serving certificate.
    pub ca_pem: String,
    /// The binaries' directory.
    pub assets: PathBuf,
    dir: PathBuf,
    tokens: BTreeMap<String, String>,
    /// The shells that run etcd and the apiserver, and the scheduler and the controllers
    /// where the plane has them; their standard input is held open until this process
    /// ends.
    _runners: Mutex<Vec<Child>>,
}

/// Why a plane did not start: its binaries are missing (the test is skipped, or fails
/// with `CI=true`), or they are there and did not come up (the test fails).
#[derive(Debug)]
enum Unstarted {
    Missing(String),
    Broken(String),
}

impl From<String> for Unstarted {
    fn from(why: String) -> Self {
        Unstarted::Broken(why)
    }
}

static PLANE: OnceLock<Result<ControlPlane, Unstarted>> = OnceLock::new();

/// The control plane, started on first use; None (with a line on stderr) where no
/// apiserver binaries are found. Panics where they are found but do not start, and, with
/// `CI=true`, where they are not found.
pub fn plane() -> Option<&'static ControlPlane> {
    started(&PLANE, &Shape::SERVED)
}

/// What a control plane serves, and what runs beside its apiserver.
struct Shape {
    /// The apiserver's `--runtime-config`.
    runtime_config: &'static str,
    /// kube-scheduler, and kube-controller-manager running these `--controllers`; None:
    /// neither (pods stay Pending, a Job makes no pods).
    controllers: Option<&'static str>,
    /// The shipped policy's `tollgate export ... --static` bundle loaded at start
    /// (`ManifestBasedAdmissionControlConfig`, KEP-5793), as docs/operations.md's
    /// AdmissionConfiguration names it.
    static_admission: bool,
    /// A real kubelet registers here ([`super::node`]): the apiserver reaches it by its
    /// name (`localhost`), not its InternalIP, for `kubectl logs` and `exec` on loopback.
    kubelet: bool,
}

impl Shape {
    /// DRA in every version 1.36 has (v1 is on by default; v1beta1 and v1beta2, which
    /// older clusters serve, are off by default and turned on), so that the tests can send
    /// a claim of each.
    const SERVED: Shape = Shape {
        runtime_config: "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true",
        controllers: None,
        static_admission: false,
        kubelet: false,
    };
}

/// The control plane of `cell`, started on first use (see [`plane`]).
fn started(
    cell: &'static OnceLock<Result<ControlPlane, Unstarted>>,
    shape: &Shape,
) -> Option<&'static ControlPlane> {
    match cell.get_or_init(|| start(shape)) {
        Ok(p) => Some(p),
        Err(Unstarted::Missing(why)) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{why} (CI=true: the real-apiserver tests may not be skipped)");
            }
            skipped(why);
            None
        }
        Err(Unstarted::Broken(why)) => panic!("{why}"),
    }
}

/// One line, past the test harness's capture, naming the test: what was skipped and why.
pub fn skipped(why: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// The binaries an apiserver needs; and those a [`scheduling_plane`] needs besides.
const APISERVER: &[&str] = &["kube-apiserver", "etcd"];
const COMPONENT_BINARIES: &[&str] = &["kube-scheduler", "kube-controller-manager"];

/// The directory with `kube-apiserver` and `etcd`: `KUBEBUILDER_ASSETS`, else the shared
/// envtest binaries beside the repository.
pub fn assets() -> Result<PathBuf, String> {
    assets_with(APISERVER).map_err(|e| match e {
        Unstarted::Missing(why) | Unstarted::Broken(why) => why,
    })
}

/// The directory of [`assets`], where it holds every one of `binaries`.
fn assets_with(binaries: &[&str]) -> Result<PathBuf, Unstarted> {
    let has = |d: &Path| binaries.iter().all(|b| d.join(b).is_file());
    let names = binaries.join(", ");
    if let Some(d) = std::env::var_os("KUBEBUILDER_ASSETS").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        return if has(&d) {
            Ok(d)
        } else {
            Err(Unstarted::Missing(format!(
                "KUBEBUILDER_ASSETS={} lacks one of {names}",
                d.display()
            )))
        };
    }
    let shared = super::root().join("../shared/envtest/bin");
    if has(&shared) {
        return Ok(shared.canonicalize().unwrap_or(shared));
    }
    Err(Unstarted::Missing(format!(
        "no {names}: set KUBEBUILDER_ASSETS to a directory with them, of Kubernetes 1.36 \
         (setup-envtest use 1.36 -p path), or provide ../shared/envtest/bin"
    )))
}

pub(super) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A random hex token (RandomState's keys are random per process and per instance).
fn token() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    (0..2)
        .map(|_| {
            let h = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish();
            format!("{h:016x}")
        })
        .collect()
}

/// The identities of the scheduler and the controller manager, with tokens of their own:
/// the apiserver's bootstrap RBAC grants each what it needs, as in a real cluster.
const COMPONENTS: &[(&str, &[&str])] = &[
    ("system:kube-scheduler", &[]),
    ("system:kube-controller-manager", &[]),
];

fn start(shape: &Shape) -> Result<ControlPlane, Unstarted> {
    let assets = match shape.controllers {
        None => assets_with(APISERVER)?,
        Some(_) => assets_with(&[APISERVER, COMPONENT_BINARIES].concat())?,
    };
    let base = Path::new("/dev/shm");
    let dir = if base.is_dir() {
        tempfile::Builder::new()
            .prefix("tollgate-envtest-")
            .tempdir_in(base)
    } else {
        tempfile::Builder::new()
            .prefix("tollgate-envtest-")
            .tempdir()
    }
    .map_err(|e| format!("envtest: a data directory: {e}"))?
    // The runner removes it when it stops both.
    .keep();

    let pki = tollgate::certs::generate(&["127.0.0.1".into(), "localhost".into()], 2)
        .map_err(|e| e.to_string())?;
    tollgate::certs::write(&dir.join("pki"), &pki).map_err(|e| e.to_string())?;
    let sa_key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    std::fs::write(dir.join("pki/sa.key"), sa_key.serialize_pem()).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("pki/sa.pub"), sa_key.public_key_pem()).map_err(|e| e.to_string())?;

    let users = || ROSTER.iter().chain(COMPONENTS);
    let tokens: BTreeMap<String, String> = users().map(|(u, _)| (u.to_string(), token())).collect();
    let csv: String = users()
        .enumerate()
        .map(|(i, (user, groups))| {
            format!(
                "{},{user},uid-{i},\"{}\"\n",
                tokens[*user],
                groups.join(",")
            )
        })
        .collect();
    std::fs::write(dir.join("pki/tokens.csv"), csv).map_err(|e| e.to_string())?;

    let (etcd_port, peer_port, api_port) = (free_port(), free_port(), free_port());
    let runtime_config = shape.runtime_config;
    let admission = if shape.static_admission {
        static_bundle(&dir)?;
        "--feature-gates=ManifestBasedAdmissionControlConfig=true --admission-control-config-file admission-config.yaml"
    } else {
        ""
    };
    let kubelet = if shape.kubelet {
        "--kubelet-preferred-address-types Hostname"
    } else {
        ""
    };
    let script = format!(
        r#"set -u
cd "$1"
"$2/etcd" --data-dir etcd --name default \
  --listen-client-urls http://127.0.0.1:{etcd_port} --advertise-client-urls http://127.0.0.1:{etcd_port} \
  --listen-peer-urls http://127.0.0.1:{peer_port} --initial-advertise-peer-urls http://127.0.0.1:{peer_port} \
  --initial-cluster default=http://127.0.0.1:{peer_port} --log-level warn >etcd.log 2>&1 </dev/null &
etcd=$!
"$2/kube-apiserver" --etcd-servers http://127.0.0.1:{etcd_port} \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port {api_port} \
  --tls-cert-file pki/tls.crt --tls-private-key-file pki/tls.key \
  --service-cluster-ip-range 10.0.0.0/24 --service-account-issuer https://kubernetes.default.svc \
  --service-account-key-file pki/sa.pub --service-account-signing-key-file pki/sa.key \
  --token-auth-file pki/tokens.csv --authorization-mode RBAC --endpoint-reconciler-type none \
  --disable-admission-plugins ServiceAccount --runtime-config {runtime_config} \
  --allow-privileged=true {admission} {kubelet} \
  >apiserver.log 2>&1 </dev/null &
api=$!
echo $api >apiserver.pid
# Until the test process lets go of our standard input: it has ended, one way or another.
cat >/dev/null
kill $api 2>/dev/null; wait $api 2>/dev/null
kill $etcd 2>/dev/null; wait $etcd 2>/dev/null
cd / && rm -rf "$1"
"#
    );
    let runner = run(&script, &dir, &assets)?;
    let plane = ControlPlane {
        url: format!("https://127.0.0.1:{api_port}"),
        ca_pem: pki.ca_pem,
        assets,
        dir: dir.clone(),
        tokens,
        _runners: Mutex::new(vec![runner]),
    };
    for user in plane.tokens.keys() {
        plane.write_kubeconfig(&plane.kubeconfig_path(user), user, None);
    }
    plane
        .until_ok(
            plane.kubeconfig("admin"),
            "/readyz",
            &["apiserver.pid"],
            Duration::from_secs(90),
        )
        .map_err(|e| {
            format!(
                "envtest: kube-apiserver ({}) was not ready: {e}\n\
                 -- apiserver.log --\n{}\n-- etcd.log --\n{}",
                plane.assets.display(),
                plane.log_tail("apiserver.log"),
                plane.log_tail("etcd.log")
            )
        })?;
    if let Some(controllers) = shape.controllers {
        plane.start_scheduling(controllers)?;
    }
    Ok(plane)
}

/// The shipped policy's static admission bundle in `dir/admission` (both exports with
/// `--static`), and `dir/admission-config.yaml` pointing each plugin at its folder.
fn static_bundle(dir: &Path) -> Result<(), String> {
    let bundle = dir.join("admission");
    for what in ["validating-admission-policy", "mutating-admission-policy"] {
        let out = super::bin::command()
            .args(["export", what, "--local", "--static"])
            .arg(&bundle)
            .output()
            .map_err(|e| format!("envtest: tollgate export: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "envtest: tollgate export {what} --static: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    let plugin = |name: &str, folder: &str| {
        format!(
            "  - name: {name}\n    configuration:\n      apiVersion: apiserver.config.k8s.io/v1\n      \
             kind: {name}Configuration\n      staticManifestsDir: {}\n",
            bundle.join(folder).display()
        )
    };
    let config = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}",
        plugin("ValidatingAdmissionPolicy", "validating-admission-policies"),
        plugin("MutatingAdmissionPolicy", "mutating-admission-policies"),
    );
    std::fs::write(dir.join("admission-config.yaml"), config)
        .map_err(|e| format!("envtest: the AdmissionConfiguration: {e}"))
}

/// Runs `script` under `sh` with the data directory and the binaries' directory as `$1`
/// and `$2`, its standard input a pipe this process holds open until it ends.
pub(super) fn run(script: &str, dir: &Path, assets: &Path) -> Result<Child, String> {
    let mut runner = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("envtest")
        .arg(dir)
        .arg(assets)
        // Webhooks are reached on loopback: no proxy of the environment in between.
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("envtest: sh: {e}"))?;
    // Kept open: the runner's end of it closes with this process.
    std::mem::forget(runner.stdin.take());
    Ok(runner)
}

impl ControlPlane {
    /// The plane's data directory (removed when the plane stops).
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Keeps `runner` (from [`run`]) with the plane's own, so that its standard input stays
    /// open until this process ends.
    pub(super) fn hold(&self, runner: Child) {
        self._runners.lock().unwrap().push(runner);
    }

    /// The last lines of one of the plane's logs (`apiserver.log`, `etcd.log`,
    /// `scheduler.log`, `controller-manager.log`), for a failure's message.
    pub fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Waits until `GET path` through `kubeconfig` answers `ok`, or `limit` has passed, or
    /// a process of `pid_files` (in the plane's directory) has exited (it refused its
    /// flags, say: no use waiting out the limit).
    fn until_ok(
        &self,
        kubeconfig: PathBuf,
        path: &str,
        pid_files: &[&str],
        limit: Duration,
    ) -> Result<(), String> {
        let pid_files: Vec<PathBuf> = pid_files.iter().map(|f| self.dir.join(f)).collect();
        let exited = move || {
            pid_files.iter().any(|f| {
                std::fs::read_to_string(f)
                    .is_ok_and(|pid| !Path::new(&format!("/proc/{}", pid.trim())).exists())
            })
        };
        let path = path.to_owned();
        // On a thread of its own: the caller may be inside a test's runtime already.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let client = client_from(&kubeconfig).await;
                let start = Instant::now();
                loop {
                    let req = axum::http::Request::get(path.as_str())
                        .body(Vec::new())
                        .unwrap();
                    match client.request_text(req).await {
                        Ok(body) if body.trim() == "ok" => return Ok(start.elapsed()),
                        Ok(_) | Err(_) if exited() => return Err("it exited".into()),
                        Ok(_) | Err(_) if start.elapsed() < limit => {
                            tokio::time::sleep(Duration::from_millis(100)).await
                        }
                        Ok(body) => return Err(body),
                        Err(e) => return Err(e.to_string()),
                    }
                }
            })
        })
        .join()
        .map_err(|_| "envtest: the readiness probe panicked".to_string())?
        .map(|_| ())
        .map_err(|e: String| format!("not ready within {limit:?}: {e}"))
    }

    /// Starts kube-scheduler and kube-controller-manager (running `controllers`) beside the
    /// apiserver, once it is ready (the controller manager gives up on an apiserver that
    /// does not answer within seconds), under a runner of their own; waits until both say
    /// they are ready.
    ///
    /// Each acts as the identity its bootstrap RBAC is for (`system:kube-scheduler`,
    /// `system:kube-controller-manager`), and the controllers as their own ServiceAccounts
    /// (`--use-service-account-credentials`, their tokens from the TokenRequest API signed
    /// by the apiserver's key): a Job's pods are created by
    /// `system:serviceaccount:kube-system:job-controller`, as in a real cluster. No node
    /// lifecycle controller: it would mark every kubelet-less Node unreachable.
    fn start_scheduling(&self, controllers: &str) -> Result<(), String> {
        let (scheduler_port, kcm_port) = (free_port(), free_port());
        let scheduler = self.kubeconfig("system:kube-scheduler");
        let kcm = self.kubeconfig("system:kube-controller-manager");
        let (scheduler, kcm) = (scheduler.display(), kcm.display());
        let script = format!(
            r#"set -u
cd "$1"
"$2/kube-scheduler" --kubeconfig {scheduler} \
  --authentication-kubeconfig {scheduler} --authorization-kubeconfig {scheduler} \
  --leader-elect=false --bind-address 127.0.0.1 --secure-port {scheduler_port} \
  --tls-cert-file pki/tls.crt --tls-private-key-file pki/tls.key \
  >scheduler.log 2>&1 </dev/null &
scheduler=$!
echo $scheduler >scheduler.pid
"$2/kube-controller-manager" --kubeconfig {kcm} \
  --authentication-kubeconfig {kcm} --authorization-kubeconfig {kcm} \
  --leader-elect=false --controllers={controllers} --use-service-account-credentials=true \
  --service-account-private-key-file pki/sa.key --root-ca-file pki/ca.crt \
  --bind-address 127.0.0.1 --secure-port {kcm_port} \
  --tls-cert-file pki/tls.crt --tls-private-key-file pki/tls.key \
  >controller-manager.log 2>&1 </dev/null &
kcm=$!
echo $kcm >controller-manager.pid
cat >/dev/null
kill $scheduler $kcm 2>/dev/null; wait $scheduler $kcm 2>/dev/null
"#
        );
        let runner = run(&script, &self.dir, &self.assets)?;
        self._runners.lock().unwrap().push(runner);
        // Their serving certificates are the apiserver's (for 127.0.0.1, of the plane's
        // CA); /readyz and /healthz need no credentials.
        for (what, port, path, log) in [
            ("kube-scheduler", scheduler_port, "/readyz", "scheduler"),
            (
                "kube-controller-manager",
                kcm_port,
                "/healthz",
                "controller-manager",
            ),
        ] {
            let kubeconfig = self.dir.join(format!("{log}-probe.kubeconfig"));
            self.write_anonymous_kubeconfig(&kubeconfig, port);
            self.until_ok(
                kubeconfig,
                path,
                &[&format!("{log}.pid")],
                Duration::from_secs(60),
            )
            .map_err(|e| {
                format!(
                    "envtest: {what} was not ready: {e}\n-- {log}.log --\n{}",
                    self.log_tail(&format!("{log}.log"))
                )
            })?;
        }
        Ok(())
    }

    fn write_kubeconfig(&self, path: &Path, user: &str, impersonate: Option<(&str, &[&str])>) {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let token = &self.tokens[user];
        let mut auth = format!("    token: {token}\n");
        if let Some((name, groups)) = impersonate {
            auth.push_str(&format!("    as: {}\n", serde_json::json!(name)));
            if !groups.is_empty() {
                auth.push_str(&format!("    as-groups: {}\n", serde_json::json!(groups)));
            }
        }
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster:\n    \
             server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  \
             user:\n{auth}contexts:\n- name: envtest\n  context:\n    cluster: envtest\n    \
             user: {user}\n    namespace: default\ncurrent-context: envtest\n",
            self.url
        );
        std::fs::write(path, text).expect("writing a kubeconfig");
    }

    /// A kubeconfig for `https://127.0.0.1:PORT` (a component of the plane serving with
    /// the apiserver's certificate), with no credentials.
    fn write_anonymous_kubeconfig(&self, path: &Path, port: u16) {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    \
             server: https://127.0.0.1:{port}\n    certificate-authority-data: {ca}\n\
             users:\n- name: anonymous\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    \
             cluster: c\n    user: anonymous\ncurrent-context: c\n"
        );
        std::fs::write(path, text).expect("writing a kubeconfig");
    }

    fn kubeconfig_path(&self, user: &str) -> PathBuf {
        // A component's name has colons: not in a file name.
        self.dir
            .join(format!("{}.kubeconfig", user.replace(':', "_")))
    }

    /// The kubeconfig file of a user of [`ROSTER`] (for `kubectl --kubeconfig` or
    /// `tollgate --kubeconfig`).
    pub fn kubeconfig(&self, user: &str) -> PathBuf {
        assert!(
            self.tokens.contains_key(user),
            "{user} is not in the roster"
        );
        self.kubeconfig_path(user)
    }

    /// A kubeconfig that acts as `user` in `groups` (the admin impersonating them: RBAC
    /// judges the impersonated identity, and so do webhooks' `userInfo`).
    pub fn kubeconfig_as(&self, user: &str, groups: &[&str]) -> PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("as-{n}.kubeconfig"));
        self.write_kubeconfig(&path, "admin", Some((user, groups)));
        path
    }

    /// A kube client for a user of the roster. Made anew for each caller: a client belongs
    /// to the runtime it was made in, and each test has its own.
    pub async fn client(&self, user: &str) -> kube::Client {
        client_from(&self.kubeconfig(user)).await
    }

    /// A kube client from any kubeconfig of [`Self::kubeconfig_as`].
    pub async fn client_of(&self, kubeconfig: &Path) -> kube::Client {
        client_from(kubeconfig).await
    }

    /// `kubectl --kubeconfig` the user's, or None (with a SKIPPED line) where no kubectl
    /// can be had.
    pub fn kubectl(&self, user: &str) -> Option<Command> {
        let mut cmd = Command::new(super::tools::kubectl()?);
        cmd.arg("--kubeconfig").arg(self.kubeconfig(user));
        Some(cmd)
    }

    /// A namespace of the test's own, new: `PREFIX-N`, with `labels`.
    pub async fn namespace(&self, prefix: &str, labels: &[(&str, &str)]) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!("{prefix}-{}", N.fetch_add(1, Ordering::Relaxed));
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(
            serde_json::json!({"metadata": {"name": name, "labels": labels}}),
        )
        .unwrap();
        kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(self.client("admin").await)
            .create(&Default::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        name
    }
}

async fn client_from(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("a kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("a kube config");
    kube::Client::try_from(config).expect("a kube client")
}

static ISOLATED: OnceLock<Result<ControlPlane, Unstarted>> = OnceLock::new();

/// A second control plane, started on first use as [`plane`] is, for the tests whose
/// cluster-wide objects would change every other test's answers on a shared one: Nodes
/// (feasibility judges each pod against all of the cluster's schedulable nodes, and "no
/// node is listed" is an answer of its own, so one test's nodes would turn another's
/// "not checked" into "no node may run it"), and the background audit (it reports into
/// every namespace there is). Those tests share this one among themselves, each keeping to
/// objects of its own as on [`plane`].
pub fn isolated_plane() -> Option<&'static ControlPlane> {
    started(&ISOLATED, &Shape::SERVED)
}

static POLICY_OBJECTS: OnceLock<Result<ControlPlane, Unstarted>> = OnceLock::new();

/// A third control plane, started on first use as [`plane`] is, for the tests of the policy
/// as Kubernetes objects (tests/policy_objects.rs, tests/policy_crds.rs): every server with its cluster context
/// watches the cluster's TollgatePolicy `default`, so one stored on a shared plane would
/// change the answers of every other test's server there. Those tests share this one
/// among themselves, one at a time.
pub fn policy_objects_plane() -> Option<&'static ControlPlane> {
    started(&POLICY_OBJECTS, &Shape::SERVED)
}

static DRA_V1BETA1: OnceLock<Result<ControlPlane, Unstarted>> = OnceLock::new();

/// A control plane that serves DRA only as `resource.k8s.io/v1beta1`, DRA's first beta
/// (`--runtime-config` turns v1 and v1beta2 off), for what tollgate reads of such a
/// cluster. No test installs a CRD or makes a Node on it; its tests keep to namespaces of
/// their own, and share the DeviceClass the shipped policy names (whichever comes first
/// makes it).
pub fn dra_v1beta1_plane() -> Option<&'static ControlPlane> {
    started(
        &DRA_V1BETA1,
        &Shape {
            runtime_config: "resource.k8s.io/v1=false,resource.k8s.io/v1beta2=false,\
                             resource.k8s.io/v1beta1=true",
            controllers: None,
            static_admission: false,
            kubelet: false,
        },
    )
}

static BARE: OnceLock<Result<ControlPlane, Unstarted>> = OnceLock::new();

/// A control plane that serves what every cluster serves and nothing tollgate can do
/// without: no DRA (`--runtime-config` turns every version of `resource.k8s.io` off) and no
/// CRDs (no Kueue, no Kubeflow Trainer, no TollgatePolicy: no test installs one here). Its
/// tests confine their pods to pools of nodes of their own ([`super::context::Pool`]), as
/// on [`isolated_plane`].
pub fn bare_plane() -> Option<&'static ControlPlane> {
    started(
        &BARE,
        &Shape {
            runtime_config: "resource.k8s.io/v1=false,resource.k8s.io/v1beta2=false,\
                             resource.k8s.io/v1beta1=false",
            controllers: None,
            static_admission: false,
            kubelet: false,
        },
    )
}

static STATIC_ADMISSION: OnceLock<Result<ControlPlane, Unstarted>> = OnceLock::new();

/// A control plane whose apiserver loads the shipped policy's exported admission policies
/// from files at start (`tollgate export ... --static`, manifest-based admission,
/// KEP-5793, alpha in 1.36): they judge every namespace labelled for enforcement there,
/// so they have a plane of their own. No webhook is registered on it. It serves the
/// admission policies' `v1beta1` too.
pub fn static_admission_plane() -> Option<&'static ControlPlane> {
    started(
        &STATIC_ADMISSION,
        &Shape {
            // And the admission policies' v1beta1, which 1.34 and 1.35 serve
            // (`export --kubernetes-version 1.35`).
            runtime_config: "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true,\
                             admissionregistration.k8s.io/v1beta1=true",
            static_admission: true,
            ..Shape::SERVED
        },
    )
}

static AUTOSCALING: OnceLock<Result<ControlPlane, Unstarted>> = OnceLock::new();

/// A control plane for the tests of what may add nodes (the Cluster Autoscaler's status
/// ConfigMap in kube-system, Karpenter's NodePools): either turns every server's "no node
/// can run it" into a warning, so on a shared plane one test's would change every other
/// test's answers. Started only for the tests that ask for it; they keep to pools of nodes
/// and namespaces of their own.
pub fn autoscaling_plane() -> Option<&'static ControlPlane> {
    started(&AUTOSCALING, &Shape::SERVED)
}

static SCHEDULING: OnceLock<Result<ControlPlane, Unstarted>> = OnceLock::new();

/// A control plane with the real kube-scheduler and kube-controller-manager (the
/// workload controllers: Jobs, CronJobs, Deployments, ReplicaSets, StatefulSets) beside
/// its apiserver (see [`ControlPlane::start_scheduling`]; tests/common/scheduling.rs has
/// the Nodes they schedule onto, a pod's placement, a Job's events). Started only for the
/// tests that ask for it. A Node changes where every pod of the plane may go, so its
/// tests keep to pools of nodes of their own ([`super::context::Pool`]: a label their pods
/// select, a taint only they tolerate), and to namespaces of their own.
pub fn scheduling_plane() -> Option<&'static ControlPlane> {
    started(
        &SCHEDULING,
        &Shape {
            controllers: Some(
                "job-controller,cronjob-controller,replicaset-controller,\
                 deployment-controller,statefulset-controller",
            ),
            ..Shape::SERVED
        },
    )
}

static NODE_PLANE: OnceLock<Result<ControlPlane, Unstarted>> = OnceLock::new();

/// The control plane of the tests' real node ([`super::node::node`]): the scheduler and the
/// workload controllers as on [`scheduling_plane`], and the node lifecycle controller, which
/// takes the `node.kubernetes.io/not-ready` taint off the kubelet's Node once it is Ready
/// (with a kubelet posting its status it taints nothing wrongly); its apiserver reaches the
/// kubelet by the Node's name, `localhost`. Every pod bound there runs, so only the node's
/// tests use this plane.
pub(super) fn node_control_plane() -> Option<&'static ControlPlane> {
    started(
        &NODE_PLANE,
        &Shape {
            controllers: Some(
                "job-controller,cronjob-controller,replicaset-controller,\
                 deployment-controller,statefulset-controller,node-lifecycle-controller",
            ),
            kubelet: true,
            ..Shape::SERVED
        },
    )
}

//! A real control plane for the tests: etcd and kube-apiserver v1.36, the binaries of
//! controller-runtime's envtest, started once per test binary.
//!
//! What the apiserver decides (what it decodes, defaults, accepts, stores, compiles and
//! authorizes) is tested here against the apiserver itself, not an imitation; the
//! in-process stand-in (crates/apiserver-standin) is left for the faults this one cannot
//! be made to show on cue.
//!
//! - **Found as envtest finds them**: the directory `KUBEBUILDER_ASSETS` names (what
//!   `setup-envtest use 1.36 -p path` prints), else `../shared/envtest/bin` beside the
//!   repository. Where neither holds a `kube-apiserver` and an `etcd`, [`plane`] writes one
//!   line, `SKIPPED <test>: ...`, straight to the process's stderr (so that `cargo test`
//!   shows it for a passing test too) and the test returns; with `CI=true` a missing
//!   apiserver fails the test instead, so that CI can never pass by skipping it.
//! - **Started once**, on free loopback ports, with a throwaway PKI (a CA and the
//!   apiserver's serving certificate, a ServiceAccount signing key), token authentication
//!   for an admin (`system:masters`) and the named users of [`ROSTER`], and RBAC on. etcd
//!   keeps its data in /dev/shm where there is one (its fsyncs are most of a write).
//! - **Stopped at the end**, however the process ends: both run under a shell that waits
//!   for its standard input to close, which happens when this process exits (a test binary
//!   never runs its statics' destructors, and a killed one runs nothing), then stops them
//!   and removes their files.
//! - Each test asks for namespaces of its own ([`ControlPlane::namespace`]), so that tests
//!   sharing the one apiserver never see each other's objects.

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
    /// The shell that runs both; its standard input is held open until this process ends.
    _runner: Mutex<Child>,
}

static PLANE: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// The control plane, started on first use; None (with a line on stderr) where no
/// apiserver binaries are found. Panics where they are found but do not start, and, with
/// `CI=true`, where they are not found.
pub fn plane() -> Option<&'static ControlPlane> {
    started(&PLANE)
}

/// The control plane of `cell`, started on first use (see [`plane`]).
fn started(cell: &'static OnceLock<Result<ControlPlane, String>>) -> Option<&'static ControlPlane> {
    match cell.get_or_init(start) {
        Ok(p) => Some(p),
        Err(why) if why.starts_with(NOT_FOUND) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{why} (CI=true: the real-apiserver tests may not be skipped)");
            }
            skipped(why);
            None
        }
        Err(why) => panic!("{why}"),
    }
}

/// One line, past the test harness's capture, naming the test: what was skipped and why.
pub fn skipped(why: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

const NOT_FOUND: &str = "no kube-apiserver";

/// The directory with `kube-apiserver` and `etcd`: `KUBEBUILDER_ASSETS`, else the shared
/// envtest binaries beside the repository.
pub fn assets() -> Result<PathBuf, String> {
    let has = |d: &Path| d.join("kube-apiserver").is_file() && d.join("etcd").is_file();
    if let Some(d) = std::env::var_os("KUBEBUILDER_ASSETS").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        return if has(&d) {
            Ok(d)
        } else {
            Err(format!(
                "{NOT_FOUND}: KUBEBUILDER_ASSETS={} holds no kube-apiserver and etcd",
                d.display()
            ))
        };
    }
    let shared = super::root().join("../shared/envtest/bin");
    if has(&shared) {
        return Ok(shared.canonicalize().unwrap_or(shared));
    }
    Err(format!(
        "{NOT_FOUND}: set KUBEBUILDER_ASSETS to a directory with kube-apiserver 1.36 and etcd \
         (setup-envtest use 1.36 -p path), or provide ../shared/envtest/bin"
    ))
}

fn free_port() -> u16 {
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

fn start() -> Result<ControlPlane, String> {
    let assets = assets()?;
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

    let tokens: BTreeMap<String, String> = ROSTER
        .iter()
        .map(|(u, _)| (u.to_string(), token()))
        .collect();
    let csv: String = ROSTER
        .iter()
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
  --disable-admission-plugins ServiceAccount \
  --runtime-config resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true \
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
    let mut runner = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("envtest")
        .arg(&dir)
        .arg(&assets)
        // Webhooks are reached on loopback: no proxy of the environment in between.
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("envtest: sh: {e}"))?;

    let plane = ControlPlane {
        url: format!("https://127.0.0.1:{api_port}"),
        ca_pem: pki.ca_pem,
        assets,
        dir: dir.clone(),
        tokens,
        _runner: Mutex::new({
            // Kept open: the runner's end of it closes with this process.
            std::mem::forget(runner.stdin.take());
            runner
        }),
    };
    for user in plane.tokens.keys() {
        plane.write_kubeconfig(&plane.dir.join(format!("{user}.kubeconfig")), user, None);
    }
    plane.wait_ready(Duration::from_secs(90))?;
    Ok(plane)
}

impl ControlPlane {
    fn log(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn wait_ready(&self, limit: Duration) -> Result<(), String> {
        let kubeconfig = self.kubeconfig("admin");
        let pid_file = self.dir.join("apiserver.pid");
        // Gone (it refused its flags, say): no use waiting out the limit.
        let exited = move || {
            std::fs::read_to_string(&pid_file)
                .is_ok_and(|pid| !Path::new(&format!("/proc/{}", pid.trim())).exists())
        };
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
                    let req = axum::http::Request::get("/readyz")
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
        .map_err(|e| {
            format!(
                "envtest: kube-apiserver ({}) was not ready within {limit:?}: {e}\n\
                 -- apiserver.log --\n{}\n-- etcd.log --\n{}",
                self.assets.display(),
                self.log("apiserver.log"),
                self.log("etcd.log")
            )
        })
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

    /// The kubeconfig file of a user of [`ROSTER`] (for `kubectl --kubeconfig` or
    /// `tollgate --kubeconfig`).
    pub fn kubeconfig(&self, user: &str) -> PathBuf {
        assert!(
            self.tokens.contains_key(user),
            "{user} is not in the roster"
        );
        self.dir.join(format!("{user}.kubeconfig"))
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

static ISOLATED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// A second control plane, started on first use as [`plane`] is, for the tests whose
/// cluster-wide objects would change every other test's answers on a shared one: Nodes
/// (feasibility judges each pod against all of the cluster's schedulable nodes, and "no
/// node is listed" is an answer of its own, so one test's nodes would turn another's
/// "not checked" into "no node may run it"), and the background audit (it reports into
/// every namespace there is). Those tests share this one among themselves, each keeping to
/// objects of its own as on [`plane`].
pub fn isolated_plane() -> Option<&'static ControlPlane> {
    started(&ISOLATED)
}

static POLICY_OBJECTS: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// A third control plane, started on first use as [`plane`] is, for the tests of the policy
/// as Kubernetes objects (tests/policy_objects.rs, tests/policy_crds.rs): every server with its cluster context
/// watches the cluster's TollgatePolicy `default`, so one stored on a shared plane would
/// change the answers of every other test's server there. Those tests share this one
/// among themselves, one at a time.
pub fn policy_objects_plane() -> Option<&'static ControlPlane> {
    started(&POLICY_OBJECTS)
}

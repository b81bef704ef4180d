//! The command line: `serve`, `review`, `audit`, `certs`, `register`, `export`, `policy`
//! and `why`; as `kubectl tollgate` too ([`program_name`]).

mod audit;
mod export;
pub mod kubectl;
mod objects;
mod policy;
mod review;
mod why;

pub use audit::AuditArgs;
pub use export::{ExportArgs, ExportCommand, ExportFlags};
pub use policy::PolicyArgs;
pub use review::{
    add_context, documents, read, run_review, split, synthetic_review, CliResult, Entered, Entry,
    Input, Output, ReviewArgs, Skipped,
};
pub use why::WhyArgs;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use crate::server::{self, Limits, ServeOptions};
use crate::telemetry::{self, LogFormat};

#[derive(Parser, Debug)]
#[command(
    name = "tollgate",
    version = env!("TOLLGATE_VERSION"),
    about = "Admission webhook for machine-learning training pods"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the webhook server (HTTPS, HTTP/1.1 and HTTP/2).
    Serve(Box<ServeArgs>),
    /// Run the policy offline over what `kubectl apply -f` takes (files, directories): its
    /// Pods, workloads and AdmissionReviews, as a cluster with both webhooks would.
    Review(ReviewArgs),
    /// Judge the pods of a live cluster as a CREATE of each would be judged: what would be
    /// refused and why, what mutation would add, which opt-outs hold.
    Audit(AuditArgs),
    /// Write a CA and a serving certificate for the webhook's Service.
    Certs(CertsArgs),
    /// Create or update the webhook configurations in a cluster (without cert-manager).
    Register(crate::register::RegisterArgs),
    /// Write the policy in another form (its validation as a ValidatingAdmissionPolicy).
    Export(ExportArgs),
    /// Show the policy in force for a namespace's pods, and where each value came from:
    /// the built-in policy, the file, the TollgatePolicy, a cluster profile, the
    /// namespace's TollgateProfile.
    Policy(PolicyArgs),
    /// Say why a pod or job has not started, or what was done to it, from the live
    /// cluster: what tollgate changed and which policy layer set it, what it would refuse
    /// or warn of now and its feasibility verdict, what Pod Security, a quota or a webhook
    /// refused of its pods (the controller's FailedCreate events), Kueue's Workload
    /// conditions, and the scheduler's verdict on its pending pods.
    Why(WhyArgs),
    /// Print a shell's completion script: `source <(tollgate completion bash)`, or
    /// `tollgate completion zsh > "${fpath[1]}/_tollgate"`.
    Completion(CompletionArgs),
}

#[derive(Args, Debug)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Policy file (YAML); reloaded when it changes [default: the built-in policy, a copy
    /// of policies/default.yaml].
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Address for the webhook, as Kubernetes components take one: `HOST:PORT`, or `:PORT`
    /// for every interface [default: 0.0.0.0:8443, or 127.0.0.1:8443 with --dev].
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub listen: Option<SocketAddr>,
    /// Serving certificate (PEM); reloaded when it changes.
    #[arg(long, requires = "tls_key", conflicts_with = "dev")]
    pub tls_cert: Option<PathBuf>,
    /// Private key of the serving certificate (PEM).
    #[arg(long, requires = "tls_cert", conflicts_with = "dev")]
    pub tls_key: Option<PathBuf>,
    /// Only accept clients with a certificate signed by this CA (PEM): the apiserver.
    #[arg(long)]
    pub client_ca: Option<PathBuf>,
    /// Make a throwaway CA and certificate under certs/dev/ and listen on 127.0.0.1.
    #[arg(long)]
    pub dev: bool,
    /// Where the serving certificate comes from: `files`, the files of --tls-cert and
    /// --tls-key, or `self-managed`, a Secret tollgate creates, renews and puts the CA of
    /// in both webhook configurations, through the API server [default: files].
    #[arg(long, value_enum, conflicts_with_all = ["tls_cert", "dev"])]
    pub certs: Option<CertSource>,
    /// Self-managed certificates: the Secret holding them (in the server's namespace).
    #[arg(long, default_value = "tollgate-tls", value_name = "NAME")]
    pub certs_secret: String,
    /// Self-managed certificates: the namespace of the Secret, the Lease and the Service
    /// [default: the pod's own, from the in-cluster configuration or the kubeconfig].
    #[arg(long, value_name = "NS")]
    pub certs_namespace: Option<String>,
    /// Self-managed certificates: the Lease whose holder writes them.
    #[arg(long, default_value = "tollgate-certs", value_name = "NAME")]
    pub certs_lease: String,
    /// Self-managed certificates: the Service the apiserver calls (the certificate is for
    /// its DNS names).
    #[arg(long, default_value = "tollgate", value_name = "NAME")]
    pub service: String,
    /// Self-managed certificates: the name of the mutating and of the validating webhook
    /// configuration whose caBundle is kept equal to the CA.
    #[arg(long, default_value = "tollgate", value_name = "NAME")]
    pub webhook_configuration: String,
    /// Self-managed certificates: validity of the serving certificate (`8760h`, `365d`).
    #[arg(long, default_value = "365d", value_parser = parse_duration)]
    pub cert_validity: Duration,
    /// Self-managed certificates: renew the serving certificate this long before it
    /// expires [default: a third of --cert-validity].
    #[arg(long, value_parser = parse_duration)]
    pub cert_renew_before: Option<Duration>,
    /// Self-managed certificates: validity of the CA.
    #[arg(long, default_value = "3650d", value_parser = parse_duration)]
    pub ca_validity: Duration,
    /// Self-managed certificates: renew the CA this long before it expires [default: a
    /// third of --ca-validity].
    #[arg(long, value_parser = parse_duration)]
    pub ca_renew_before: Option<Duration>,
    /// Self-managed certificates: how long a new CA is trusted (both CAs in the caBundle)
    /// before the certificate it signs is served, and the old one after.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub ca_overlap: Duration,
    /// Address for Prometheus metrics (plain HTTP, GET /metrics): `HOST:PORT`, `:PORT`
    /// for every interface, or "off" [default: 0.0.0.0:9090, or 127.0.0.1:9090 with --dev].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Log format [default: json, or text with --dev].
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = Limits::default().max_body_bytes)]
    pub max_body_bytes: usize,
    /// Deadline to receive and answer one review, in milliseconds (below the webhook timeout).
    #[arg(long, default_value_t = 2000)]
    pub review_deadline_ms: u64,
    /// Deadline for a client's TLS handshake, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub handshake_timeout_ms: u64,
    /// Deadline for an HTTP/1.1 client's request headers, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub header_timeout_ms: u64,
    /// Most connections open at once.
    #[arg(long, default_value_t = Limits::default().max_connections)]
    pub max_connections: usize,
    /// Most concurrent HTTP/2 streams per connection.
    #[arg(long, default_value_t = Limits::default().max_streams)]
    pub max_streams: u32,
    /// Close a connection that has had no request in flight for this long, in milliseconds.
    #[arg(long, default_value_t = 60000)]
    pub idle_timeout_ms: u64,
    /// How often the policy and certificate files are checked for changes, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub reload_interval_ms: u64,
    /// After SIGTERM: how long to keep serving, not ready, while endpoints update (ms).
    #[arg(long, default_value_t = 2000)]
    pub shutdown_delay_ms: u64,
    /// Then: how long in-flight requests may take before the server exits anyway (ms).
    #[arg(long, default_value_t = 8000)]
    pub drain_timeout_ms: u64,
    /// Know what reviews need of other objects (DRA claims and claim templates,
    /// namespaces) from watches of the API server [default: on, or off with --dev].
    #[arg(long, value_enum)]
    pub cluster_context: Option<OnOff>,
    /// Kubeconfig for the cluster context [default: $KUBECONFIG, ~/.kube/config, else the
    /// in-cluster configuration].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context for the cluster context.
    #[arg(long)]
    pub context: Option<String>,
    /// How long one review may wait for objects the cluster cache does not hold yet, in
    /// milliseconds (one GET each, all at once).
    #[arg(long, default_value_t = 500)]
    pub cluster_fetch_timeout_ms: u64,
    /// Audit the cluster in the background this often (`30s`, `10m`, `1h`): one
    /// PolicyReport per namespace with findings, by the one replica holding the audit
    /// Lease [default: off].
    #[arg(long, value_parser = parse_duration)]
    pub audit_interval: Option<Duration>,
    /// Most objects the background audit judges per second, so that it never competes
    /// with reviews for the CPU.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub audit_rate: u32,
    /// A namespace (name or glob) the background audit leaves out, as the webhooks' own
    /// namespaceSelector does (repeatable).
    #[arg(long = "audit-exclude-namespace")]
    pub audit_exclude_namespaces: Vec<String>,
    /// Benchmarks only: answer every review with a constant "allowed" without reading it,
    /// over the same TLS and HTTP stack (the floor of benches/load.rs).
    #[arg(long, hide = true)]
    pub floor: bool,
}

/// Where `serve` gets its serving certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CertSource {
    /// `--tls-cert` and `--tls-key`, re-read when they change.
    Files,
    /// A Secret tollgate creates and renews itself through the API server, its CA kept in
    /// both webhook configurations.
    SelfManaged,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Args, Debug)]
pub struct CertsArgs {
    /// The webhook's Service name.
    #[arg(long)]
    pub service: String,
    /// The Service's namespace.
    #[arg(long)]
    pub namespace: String,
    /// Directory to write ca.crt, tls.crt and tls.key into.
    #[arg(long)]
    pub out: PathBuf,
    /// Validity in days.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
}

/// The name the program goes by in help, usage and completion: `kubectl tollgate` when
/// run as `kubectl-tollgate` (kubectl runs its plugins by their path, so argv[0] ends so),
/// else `tollgate`.
pub fn program_name(argv0: Option<&std::ffi::OsStr>) -> &'static str {
    let file = argv0
        .map(Path::new)
        .and_then(Path::file_stem)
        .and_then(|f| f.to_str())
        .unwrap_or("");
    if file == "kubectl-tollgate" {
        "kubectl tollgate"
    } else {
        "tollgate"
    }
}

/// The command line, parsed under the name the program was run as ([`program_name`]).
fn parse() -> (Cli, &'static str) {
    let name = program_name(std::env::args_os().next().as_deref());
    let matches = Cli::command().bin_name(name).get_matches();
    match Cli::from_arg_matches(&matches) {
        Ok(cli) => (cli, name),
        Err(e) => e.exit(),
    }
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let (cli, name) = parse();
    match cli.command {
        Command::Serve(a) => match serve(*a) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("tollgate: {e:#}");
                1
            }
        },
        Command::Review(a) => review::run(&a),
        Command::Completion(a) => {
            let mut script = Vec::new();
            // As the plugin, the script completes `kubectl-tollgate` (kubectl completes
            // its plugins' arguments through `kubectl_complete-tollgate`, not this).
            let bin = name.replace(' ', "-");
            clap_complete::generate(a.shell, &mut Cli::command(), bin, &mut script);
            if kubectl::print(&String::from_utf8_lossy(&script)) {
                0
            } else {
                1
            }
        }
        Command::Audit(a) => audit::run(&a),
        Command::Export(a) => export::run(&a),
        Command::Policy(a) => policy::run(&a),
        Command::Why(a) => why::run(&a),
        Command::Register(a) => {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(crate::register::run(&a)));
            match result {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("tollgate: {e:#}");
                    1
                }
            }
        }
        Command::Certs(a) => {
            let names = crate::certs::service_names(&a.service, &a.namespace);
            match crate::certs::generate(&names, a.days)
                .and_then(|b| crate::certs::write(&a.out, &b))
            {
                Ok(()) => {
                    println!(
                        "wrote {0}/ca.crt, {0}/tls.crt and {0}/tls.key (for {1})",
                        a.out.display(),
                        names.join(", ")
                    );
                    0
                }
                Err(e) => {
                    eprintln!("tollgate: {e}");
                    1
                }
            }
        }
    }
}

fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let self_managed = a.certs == Some(CertSource::SelfManaged);
    let (cert, key) = match (&a.tls_cert, &a.tls_key, a.dev) {
        (Some(c), Some(k), _) => (c.clone(), k.clone()),
        (_, _, true) => dev_certs()?,
        _ if self_managed => (PathBuf::new(), PathBuf::new()),
        _ => anyhow::bail!("no serving certificate: pass --tls-cert FILE --tls-key FILE, --certs self-managed, or --dev for a throwaway one"),
    };
    let local = if a.dev { "127.0.0.1" } else { "0.0.0.0" };
    let listen = a
        .listen
        .unwrap_or_else(|| SocketAddr::new(local.parse().expect("literal address"), 8443));
    let metrics_listen = match a.metrics_listen.as_deref() {
        Some("off") => None,
        Some(s) => Some(parse_listen(s).map_err(|e| anyhow::anyhow!("--metrics-listen {e}"))?),
        None => Some(SocketAddr::new(
            local.parse().expect("literal address"),
            9090,
        )),
    };
    let default_format = if a.dev {
        LogFormat::Text
    } else {
        LogFormat::Json
    };
    telemetry::init(a.log_format.unwrap_or(default_format));
    let opts = ServeOptions {
        listen,
        metrics_listen,
        policy_path: a.policy.clone(),
        cert_path: cert,
        key_path: key,
        self_managed: self_managed.then(|| self_managed_options(&a)),
        client_ca: a.client_ca.clone(),
        limits: Limits {
            max_body_bytes: a.max_body_bytes,
            review_deadline: Duration::from_millis(a.review_deadline_ms),
            handshake_timeout: Duration::from_millis(a.handshake_timeout_ms),
            header_timeout: Duration::from_millis(a.header_timeout_ms),
            max_connections: a.max_connections,
            max_streams: a.max_streams,
            idle_timeout: Duration::from_millis(a.idle_timeout_ms.max(1)),
        },
        reload_interval: Duration::from_millis(a.reload_interval_ms.max(10)),
        shutdown_delay: Duration::from_millis(a.shutdown_delay_ms),
        cluster: match a.cluster_context {
            Some(OnOff::On) => true,
            Some(OnOff::Off) => false,
            None => !a.dev,
        }
        .then(|| server::ClusterOptions {
            kubeconfig: a.kubeconfig.clone(),
            context: a.context.clone(),
            fetch_timeout: Duration::from_millis(a.cluster_fetch_timeout_ms.max(1)),
        }),
        drain_timeout: Duration::from_millis(a.drain_timeout_ms),
        audit: a.audit_interval.map(|interval| {
            let mut o = server::AuditOptions::new(interval);
            o.rate = a.audit_rate;
            o.exclude.clone_from(&a.audit_exclude_namespaces);
            o.kubeconfig.clone_from(&a.kubeconfig);
            o.context.clone_from(&a.context);
            o
        }),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let signal = server::shutdown_signal()?;
        let running = if a.floor {
            server::start_floor(opts).await?
        } else {
            server::start(opts).await?
        };
        if a.dev {
            let port = running.addr.port();
            eprintln!(
                "tollgate is serving https://127.0.0.1:{port} with a throwaway certificate.\n\
                 CA: certs/dev/ca.crt\n\
                 Try:\n  curl --cacert certs/dev/ca.crt -H 'Content-Type: application/json' \
                 --data @tests/fixtures/apiserver-v1.36/resnet50-master-0.mutate.json https://127.0.0.1:{port}/mutate"
            );
        }
        running.run_until(signal).await;
        Ok(())
    })
}

/// What `--certs self-managed` and its options ask for.
fn self_managed_options(a: &ServeArgs) -> crate::selfmanaged::Options {
    let mut timing = crate::selfmanaged::Timing::new(a.cert_validity, a.ca_validity, a.ca_overlap);
    if let Some(d) = a.cert_renew_before {
        timing.cert_renew_before = d;
    }
    if let Some(d) = a.ca_renew_before {
        timing.ca_renew_before = d;
    }
    crate::selfmanaged::Options {
        secret: a.certs_secret.clone(),
        namespace: a.certs_namespace.clone(),
        service: a.service.clone(),
        webhook_configuration: a.webhook_configuration.clone(),
        lease_name: a.certs_lease.clone(),
        timing,
        kubeconfig: a.kubeconfig.clone(),
        context: a.context.clone(),
        ..crate::selfmanaged::Options::default()
    }
}

/// A listening address as Kubernetes components take one (Go's `net.Listen`): `HOST:PORT`
/// (`127.0.0.1:8443`, `[::1]:8443`), or `:PORT` for every interface.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let bad = |why: String| format!("{text:?}: {why}; expected HOST:PORT or :PORT");
    if let Some(port) = text.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|e| bad(format!("port: {e}")))?;
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    text.parse().map_err(|e| bad(format!("{e}")))
}

/// `500ms`, `30s`, `10m`, `1h30m`, `365d`: a number and a unit, repeated.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration such as 30s, 10m or 1h30m");
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let one = match &rest[..unit] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n * 60),
            "h" => Duration::from_secs(n * 3600),
            "d" => Duration::from_secs(n * 24 * 3600),
            _ => return Err(bad()),
        };
        total += one;
        rest = &rest[unit..];
    }
    if total.is_zero() {
        return Err(format!("{text:?}: the interval must be longer than zero"));
    }
    Ok(total)
}

fn dev_certs() -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = Path::new("certs/dev");
    let bundle = crate::certs::generate(&["localhost".to_owned(), "127.0.0.1".to_owned()], 30)?;
    crate::certs::write(dir, &bundle)?;
    Ok((dir.join("tls.crt"), dir.join("tls.key")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_read_as_kubernetes_components_take_them() {
        assert_eq!(
            parse_listen(":8443"),
            Ok(SocketAddr::from(([0, 0, 0, 0], 8443)))
        );
        assert_eq!(
            parse_listen("127.0.0.1:9090"),
            Ok(SocketAddr::from(([127, 0, 0, 1], 9090)))
        );
        assert!(parse_listen("[::1]:8443").is_ok());
        for bad in ["8443", ":", ":http", "localhost"] {
            let e = parse_listen(bad).unwrap_err();
            assert!(e.contains("HOST:PORT or :PORT"), "{e}");
        }
    }

    #[test]
    fn durations_read_as_kubectl_writes_them() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("365d"), Ok(Duration::from_secs(365 * 86400)));
        for bad in ["", "10", "m", "10x", "1.5h", "0s", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}

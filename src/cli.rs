//! The command line: `serve`, `review`, `certs` and `register`.

use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};

use crate::server::{self, Limits, ServeOptions};
use crate::telemetry::{self, LogFormat};
use tollgate_core::policy::Policy;
use tollgate_core::review::{review_bytes, Endpoint, Reviewed};

#[derive(Parser, Debug)]
#[command(
    name = "tollgate",
    version,
    about = "Admission webhook for machine-learning training pods"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the webhook server (HTTPS, HTTP/1.1 and HTTP/2).
    Serve(ServeArgs),
    /// Run the policy over a Pod or an AdmissionReview offline, as the server would.
    Review(ReviewArgs),
    /// Write a CA and a serving certificate for the webhook's Service.
    Certs(CertsArgs),
    /// Create or update the webhook configurations in a cluster (without cert-manager).
    Register(crate::register::RegisterArgs),
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Policy file (YAML); reloaded when it changes [default: the built-in policy, a copy
    /// of policies/default.yaml].
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Address for the webhook [default: 0.0.0.0:8443, or 127.0.0.1:8443 with --dev].
    #[arg(long)]
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
    /// Address for Prometheus metrics (plain HTTP, GET /metrics); "off" disables
    /// [default: 0.0.0.0:9090, or 127.0.0.1:9090 with --dev].
    #[arg(long)]
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
    /// Benchmarks only: answer every review with a constant "allowed" without reading it,
    /// over the same TLS and HTTP stack (the floor of benches/load.rs).
    #[arg(long, hide = true)]
    pub floor: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Stage {
    /// Mutate, then validate the mutated pod (after the apiserver's defaulting), as a
    /// cluster with both webhooks would.
    All,
    /// Only the mutating webhook.
    Mutate,
    /// Only the validating webhook.
    Validate,
}

#[derive(Args, Debug)]
pub struct ReviewArgs {
    /// A Pod (YAML or JSON) or an AdmissionReview (JSON); "-" reads standard input.
    pub file: String,
    /// Policy file (YAML) [default: the built-in policy, a copy of policies/default.yaml].
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Which webhook(s) to run.
    #[arg(long, value_enum, default_value_t = Stage::All)]
    pub stage: Stage,
    /// For a Pod input: the namespace [default: the pod's, or "default"].
    #[arg(long)]
    pub namespace: Option<String>,
    /// For a Pod input: the requesting user (opt-out governance looks at it).
    #[arg(long, default_value = "tollgate-review")]
    pub user: String,
    /// For a Pod input: a group of the requesting user (repeatable).
    #[arg(long = "group")]
    pub groups: Vec<String>,
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

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(a) => match serve(a) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("tollgate: {e:#}");
                1
            }
        },
        Command::Review(a) => review(&a),
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
    let (cert, key) = match (&a.tls_cert, &a.tls_key, a.dev) {
        (Some(c), Some(k), _) => (c.clone(), k.clone()),
        (_, _, true) => dev_certs()?,
        _ => anyhow::bail!("no serving certificate: pass --tls-cert FILE --tls-key FILE, or --dev for a throwaway one"),
    };
    let local = if a.dev { "127.0.0.1" } else { "0.0.0.0" };
    let listen = a
        .listen
        .unwrap_or_else(|| SocketAddr::new(local.parse().expect("literal address"), 8443));
    let metrics_listen = match a.metrics_listen.as_deref() {
        Some("off") => None,
        Some(s) => Some(
            s.parse()
                .map_err(|e| anyhow::anyhow!("--metrics-listen {s:?}: {e}"))?,
        ),
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
        drain_timeout: Duration::from_millis(a.drain_timeout_ms),
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

fn dev_certs() -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = Path::new("certs/dev");
    let bundle = crate::certs::generate(&["localhost".to_owned(), "127.0.0.1".to_owned()], 30)?;
    crate::certs::write(dir, &bundle)?;
    Ok((dir.join("tls.crt"), dir.join("tls.key")))
}

/// An input the review command cannot use: exit status 2.
#[derive(Debug)]
struct Unusable(String);

fn review(a: &ReviewArgs) -> i32 {
    match review_inner(a) {
        Ok((text, allowed)) => {
            print!("{text}");
            if allowed {
                0
            } else {
                1
            }
        }
        Err(Unusable(msg)) => {
            eprintln!("tollgate: {msg}");
            2
        }
    }
}

fn review_inner(a: &ReviewArgs) -> Result<(String, bool), Unusable> {
    let policy = match &a.policy {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Unusable(format!("{}: {e}", path.display())))?;
            Policy::from_text(&path.display().to_string(), &text)
                .map_err(|e| Unusable(e.to_string()))?
        }
        None => Policy::builtin(),
    };
    let input = if a.file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| Unusable(format!("standard input: {e}")))?;
        s
    } else {
        std::fs::read_to_string(&a.file).map_err(|e| Unusable(format!("{}: {e}", a.file)))?
    };
    let value = parse_input(&input).map_err(|e| Unusable(format!("{}: {e}", a.file)))?;
    let result =
        run_review(&policy, &value, a).map_err(|e| Unusable(format!("{}: {e}", a.file)))?;
    let allowed = result.allowed;
    let text = match a.output {
        Output::Json => {
            let mut s = serde_json::to_string_pretty(&result.to_json()).unwrap_or_default();
            s.push('\n');
            s
        }
        Output::Text => result.to_text(),
    };
    Ok((text, allowed))
}

fn parse_input(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Err("empty input: expected a Pod or an AdmissionReview".into());
    }
    // JSON first: it is exact for what the apiserver sends; YAML covers the rest.
    serde_json::from_str(text).or_else(|_| {
        serde_saphyr::from_str::<Value>(text).map_err(|e| format!("neither JSON nor YAML: {e}"))
    })
}

/// What the review command found, for both output formats.
pub struct CliResult {
    pub allowed: bool,
    pub message: Option<String>,
    pub warnings: Vec<String>,
    pub patch: Option<json_patch::Patch>,
    pub mutated: Option<Value>,
    pub mutate_response: Option<Value>,
    pub validate_response: Option<Value>,
    pub namespace: String,
    pub name: String,
    pub steps: Vec<&'static str>,
}

impl CliResult {
    fn to_json(&self) -> Value {
        json!({
            "decision": if self.allowed { "allowed" } else { "denied" },
            "allowed": self.allowed,
            "message": self.message,
            "warnings": self.warnings,
            "steps": self.steps,
            "patch": self.patch,
            "mutatedPod": self.mutated,
            "mutateResponse": self.mutate_response,
            "validateResponse": self.validate_response,
        })
    }

    fn to_text(&self) -> String {
        let mut out = format!(
            "pod {}/{}: {}",
            self.namespace,
            self.name,
            if self.allowed { "allowed" } else { "denied" }
        );
        if !self.steps.is_empty() {
            out.push_str(&format!(" (mutated: {})", self.steps.join(", ")));
        }
        out.push('\n');
        if let Some(m) = &self.message {
            out.push('\n');
            out.push_str(m);
            out.push('\n');
        }
        if !self.warnings.is_empty() {
            out.push_str("\nwarnings:\n");
            for w in &self.warnings {
                out.push_str(&format!("  - {w}\n"));
            }
        }
        if let Some(p) = &self.patch {
            out.push_str("\npatch (JSONPatch):\n");
            for op in &p.0 {
                out.push_str(&format!(
                    "  {}\n",
                    serde_json::to_string(op).unwrap_or_default()
                ));
            }
        }
        if let Some(m) = &self.mutated {
            out.push_str("\nmutated pod:\n");
            out.push_str(&serde_saphyr::to_string(m).unwrap_or_default());
        }
        out
    }
}

/// Builds the review(s) the apiserver would send for `value` and runs them.
pub fn run_review(policy: &Policy, value: &Value, a: &ReviewArgs) -> Result<CliResult, String> {
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    let review = match kind {
        "AdmissionReview" => value.clone(),
        "Pod" => synthetic_review(value, a.namespace.as_deref(), &a.user, &a.groups),
        "" => return Err("no kind: expected a Pod or an AdmissionReview".into()),
        k => return Err(format!("a {k}: expected a Pod or an AdmissionReview")),
    };
    let mut result = CliResult {
        allowed: true,
        message: None,
        warnings: vec![],
        patch: None,
        mutated: None,
        mutate_response: None,
        validate_response: None,
        namespace: String::new(),
        name: String::new(),
        steps: vec![],
    };
    let object = review.pointer("/request/object").cloned();
    let mut to_validate = review.clone();
    if a.stage != Stage::Validate {
        let r = run(policy, Endpoint::Mutate, &review)?;
        absorb(&mut result, &r);
        let mut pod = object.clone().unwrap_or(Value::Null);
        if let Some(p) = &r.patch() {
            json_patch::patch(&mut pod, p).map_err(|e| format!("the patch does not apply: {e}"))?;
        }
        result.patch = r.patch();
        result.steps = r.steps.iter().map(|s| s.as_str()).collect();
        result.mutate_response = Some(response_value(&r));
        if object.is_some() {
            // What the apiserver does between the two webhooks.
            let mut defaulted = pod.clone();
            tollgate_core::pod::default_requests_from_limits(&mut defaulted);
            if let Some(o) = to_validate.pointer_mut("/request/object") {
                *o = defaulted;
            }
            result.mutated = Some(pod);
        }
        result.allowed = r.response.allowed;
        if !r.response.allowed {
            result.message = Some(r.response.result.message.clone());
        }
    }
    if a.stage != Stage::Mutate && result.allowed {
        let r = run(policy, Endpoint::Validate, &to_validate)?;
        absorb(&mut result, &r);
        result.validate_response = Some(response_value(&r));
        result.allowed = r.response.allowed;
        if !r.response.allowed {
            result.message = Some(r.response.result.message.clone());
        }
    }
    Ok(result)
}

fn run(policy: &Policy, endpoint: Endpoint, review: &Value) -> Result<Reviewed, String> {
    let bytes = serde_json::to_vec(review).map_err(|e| e.to_string())?;
    review_bytes(endpoint, policy, &bytes).map_err(|e| e.to_string())
}

fn absorb(result: &mut CliResult, r: &Reviewed) {
    result.namespace = r.namespace.clone();
    result.name = r.name.clone();
    result
        .warnings
        .extend(r.response.warnings.iter().flatten().cloned());
}

fn response_value(r: &Reviewed) -> Value {
    serde_json::from_slice(&r.to_json()).unwrap_or(Value::Null)
}

/// The CREATE review the apiserver would send for `pod`, from `user` in `groups`.
pub fn synthetic_review(
    pod: &Value,
    namespace: Option<&str>,
    user: &str,
    groups: &[String],
) -> Value {
    let namespace = namespace
        .or_else(|| pod.pointer("/metadata/namespace").and_then(Value::as_str))
        .unwrap_or("default");
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut groups = groups.to_vec();
    groups.push("system:authenticated".into());
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-000000000000",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": user, "groups": groups},
            "object": pod,
            "oldObject": null,
            "dryRun": true,
        }
    })
}

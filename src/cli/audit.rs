//! `tollgate audit`: the pods of a live cluster, each judged as a CREATE of it would be.

use std::io::{BufWriter, IsTerminal as _};
use std::path::PathBuf;

use clap::Args;

use crate::audit::output::{Format, Progress, Writer};
use crate::audit::{AuditError, Auditor, Namespaces, Totals, Unpaced};
use crate::kubeconfig::{load_client_config, KubeconfigSources};

#[derive(Args, Debug)]
pub struct AuditArgs {
    /// Kubeconfig [default: $KUBECONFIG, ~/.kube/config, else the in-cluster
    /// configuration].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context [default: its current context].
    #[arg(long)]
    pub context: Option<String>,
    /// Audit this namespace [default: the kubeconfig context's namespace, else "default"].
    #[arg(short = 'n', long, conflicts_with = "all_namespaces")]
    pub namespace: Option<String>,
    /// Audit every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Only objects whose labels match this selector (`app=train,tier!=cpu`).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Policy file (YAML) [default: the built-in policy, a copy of policies/default.yaml].
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// What to do when no cluster is found.
const NO_CLUSTER: &str = "tollgate audit reads a cluster: set KUBECONFIG or pass --kubeconfig";

/// Runs `tollgate audit`; the exit status: 0 nothing would be refused, 1 something would,
/// 2 unusable input (the policy, the kubeconfig, the cluster unreachable or forbidding).
pub fn run(a: &AuditArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tollgate: {e}");
            return 2;
        }
    };
    match runtime.block_on(audit(a)) {
        Ok(totals) if totals.refused > 0 => 1,
        Ok(_) => 0,
        Err(message) => {
            eprintln!("tollgate: {message}");
            2
        }
    }
}

async fn audit(a: &AuditArgs) -> Result<Totals, String> {
    let policy = super::review::load_policy(a.policy.as_deref())?;
    let sources = KubeconfigSources::from_process_env(a.kubeconfig.clone());
    let config = load_client_config(&sources, a.context.as_deref(), NO_CLUSTER)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let url = config.cluster_url.to_string();
    let scope = match (&a.namespace, a.all_namespaces) {
        (_, true) => Namespaces::All,
        (Some(ns), false) => Namespaces::One(ns.clone()),
        (None, false) => Namespaces::One(config.default_namespace.clone()),
    };
    let client = kube::Client::try_from(config)
        .map_err(|e| format!("creating a client for the API server at {url}: {e}"))?;
    let mut auditor = Auditor::new(client, url);
    auditor.selector.clone_from(&a.selector);
    let progress = Progress::new(std::io::stderr().is_terminal());
    let stdout = std::io::stdout();
    let terminal = stdout.is_terminal();
    let mut writer = Writer::new(BufWriter::new(stdout.lock()), a.output, terminal, progress);
    let result = run_audit(&auditor, &policy, &scope, &mut writer).await;
    writer.progress.clear();
    for (kind, why) in auditor.forbidden_kinds() {
        eprintln!("tollgate: {kind} not audited (their pods were): {why}");
    }
    for (what, why) in auditor.unread() {
        eprintln!("tollgate: whether pods can run was judged without what needs {what}: {why}");
    }
    let totals = result.map_err(|e| e.to_string())?;
    writer.finish(&totals).map_err(|e| e.to_string())?;
    Ok(totals)
}

async fn run_audit<W: std::io::Write>(
    auditor: &Auditor,
    policy: &tollgate_core::policy::Policy,
    scope: &Namespaces,
    writer: &mut Writer<W>,
) -> Result<Totals, AuditError> {
    let namespaces = auditor.namespaces(scope, policy).await?;
    writer.progress.set_total(namespaces.len() as u64);
    let mut totals = Totals::default();
    for ns in &namespaces {
        writer.namespace_started(ns);
        let t = auditor
            .audit_namespace(policy, ns, &mut Unpaced, |found| {
                writer.object(ns, found).map_err(AuditError::from)
            })
            .await?;
        writer.namespace_done()?;
        totals.merge(&t);
    }
    Ok(totals)
}

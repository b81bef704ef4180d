//! `tollgate audit`: the pods of a live cluster, each judged as a CREATE of it would be,
//! with the policy the server would have in force: the file, the cluster's TollgatePolicy
//! and each namespace's TollgateProfile (or those given with `-f`), composed.

use std::io::{BufWriter, IsTerminal as _};
use std::path::PathBuf;

use clap::Args;

use super::kubectl::{self, ClusterFlags, Manifests, NamespaceFlags};
use super::objects::PolicyObjects;
use crate::audit::output::{Format, Progress, Writer};
use crate::audit::{AuditError, Auditor, Namespaces, Totals, Unpaced};

#[derive(Args, Debug)]
pub struct AuditArgs {
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// -n: audit this namespace (`get` on it, for the labels policy profiles match on);
    /// -A: every namespace (`list` on namespaces).
    #[command(flatten)]
    pub namespaces: NamespaceFlags,
    /// Only objects whose labels match this selector (`app=train,tier!=cpu`).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Policy file (YAML) [default: the built-in policy, a copy of policies/default.yaml].
    /// The cluster's TollgatePolicy and TollgateProfiles, where it serves them, are
    /// composed with it, as the server composes them.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// A TollgatePolicy and TollgateProfiles to audit with as if they were applied (-f,
    /// -k): each replaces the cluster's object of the same name. Other objects in them are
    /// left out.
    #[command(flatten)]
    pub manifests: Manifests,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// What to do when no cluster is found.
const NO_CLUSTER: &str = "tollgate audit reads a cluster: set KUBECONFIG or pass --kubeconfig";

/// Runs `tollgate audit`; the exit status: 0 nothing would be refused, 1 something would
/// (an object, or a TollgatePolicy or TollgateProfile that does not load), 2 unusable
/// input (the policy, the kubeconfig, the cluster unreachable or forbidding), 3 the
/// cluster's TollgatePolicy may not be read and none was given with -f.
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
        Ok((totals, objects_ok)) if totals.refused > 0 || !objects_ok => 1,
        Ok(_) => 0,
        // Its reader went away (`| head`): nobody is left to tell, as with kubectl.
        Err(Ended::Closed) => 0,
        Err(Ended::Because(message)) => {
            eprintln!("tollgate: {message}");
            2
        }
        Err(Ended::Unreadable(message)) => {
            eprintln!("tollgate: {message}");
            super::objects::UNREADABLE_POLICY
        }
    }
}

/// Why an audit ended before its summary.
enum Ended {
    /// Standard output was closed.
    Closed,
    /// The one line to show.
    Because(String),
    /// The cluster's TollgatePolicy may not be read, and none was given: the one line.
    Unreadable(String),
}

impl From<String> for Ended {
    fn from(s: String) -> Ended {
        Ended::Because(s)
    }
}

impl From<AuditError> for Ended {
    fn from(e: AuditError) -> Ended {
        match e {
            AuditError::Output(e) if kubectl::closed(&e) => Ended::Closed,
            e => Ended::Because(e.to_string()),
        }
    }
}

async fn audit(a: &AuditArgs) -> Result<(Totals, bool), Ended> {
    let file = super::objects::file_layer(a.policy.as_deref())?;
    // A file that does not load is unusable before the cluster is asked anything.
    super::objects::compose(file.as_ref(), &PolicyObjects::default())?;
    let namespace = a.namespaces.namespace.as_ref();
    let given = super::policy::read_objects(&a.manifests, namespace.map(String::as_str))?;
    let config = a
        .cluster
        .config(NO_CLUSTER)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let url = config.cluster_url.to_string();
    let scope = match (namespace, a.namespaces.all_namespaces) {
        (_, true) => Namespaces::All,
        (Some(ns), false) => Namespaces::One(ns.clone()),
        (None, false) => Namespaces::One(config.default_namespace.clone()),
    };
    let client = kube::Client::try_from(config)
        .map_err(|e| format!("creating a client for the API server at {url}: {e}"))?;
    let mut auditor = Auditor::new(client, url);
    auditor.selector.clone_from(&a.selector);
    // The policy in force: the file, with the cluster's TollgatePolicy and TollgateProfiles
    // (those given replacing them), so that each namespace is judged with its profile.
    let (listed, unread) = crate::audit::list::policy_objects(&auditor, &scope).await?;
    if let Some(line) = super::objects::unreadable_policy(&unread, &given, false) {
        return Err(Ended::Unreadable(line));
    }
    for u in unread
        .iter()
        .filter(|u| given.cluster.is_some() || u.kind != tollgate_core::POLICY_KIND)
    {
        eprintln!(
            "tollgate: audited without the cluster's objects of a kind it may not read: {}",
            u.why
        );
    }
    let mut found = PolicyObjects::default();
    for object in &listed {
        found.add("the cluster", object);
    }
    found.overlay(given);
    let composed = super::objects::compose(file.as_ref(), &found)?;
    let objects_ok = composed.statuses.iter().all(|s| s.ready);
    for s in composed.statuses.iter().filter(|s| !s.ready) {
        let origin = found.origin(s).unwrap_or("the cluster");
        eprintln!("tollgate: {origin}: {}", s.message);
    }
    let policy = composed.policy;
    let progress = Progress::new(std::io::stderr().is_terminal());
    let stdout = std::io::stdout();
    let terminal = stdout.is_terminal();
    let mut writer = Writer::new(BufWriter::new(stdout.lock()), a.output, terminal, progress);
    let result = run_audit(&auditor, &policy, &scope, &mut writer).await;
    writer.progress.clear();
    for (kind, why) in auditor.forbidden_kinds() {
        eprintln!("tollgate: {kind} not audited (their pods were): {why}");
    }
    if let Some(why) = auditor.events_unread() {
        eprintln!(
            "tollgate: whether pods start on their nodes was judged from their statuses alone \
             (a volume the node cannot mount is said only in events): {why}"
        );
    }
    for (what, why) in auditor.unread() {
        eprintln!("tollgate: whether pods can run was judged without what needs {what}: {why}");
    }
    let totals = result?;
    writer.finish(&totals).map_err(AuditError::from)?;
    Ok((totals, objects_ok))
}

async fn run_audit<W: std::io::Write>(
    auditor: &Auditor,
    policy: &tollgate_core::Policy,
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

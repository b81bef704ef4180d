//! `tollgate export`: the policy as the apiserver's own admission policies, for it to
//! evaluate itself: `validating-admission-policy` (the validation half) and
//! `mutating-admission-policy` (the mutation half); as objects to apply, or with
//! `--static DIR` as a manifest-based admission bundle (KEP-5793) the apiserver loads from
//! files at start.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use super::kubectl::{ClusterFlags, Manifests};
use super::objects::PolicyObjects;
use tollgate_core::{
    mutating_admission_policy, validating_admission_policy, Export, ExportOptions, NoteKind,
    Policy, BUILTIN_SOURCE,
};

#[derive(Args, Debug)]
pub struct ExportArgs {
    #[command(subcommand)]
    pub what: ExportCommand,
}

#[derive(Subcommand, Debug)]
pub enum ExportCommand {
    /// Print the policy's validation as ValidatingAdmissionPolicies and their bindings (YAML).
    ///
    /// admissionregistration.k8s.io/v1, Kubernetes 1.30+: the apiserver evaluates them in
    /// process. What they leave out is said on standard error; deploy/README.md
    /// ("Native validation") lists how they differ from the validating webhook.
    ValidatingAdmissionPolicy(ExportFlags),
    /// Print the policy's mutation as MutatingAdmissionPolicies and their bindings (YAML).
    ///
    /// admissionregistration.k8s.io/v1 (Kubernetes 1.36; v1beta1 with --kubernetes-version
    /// 1.34 or 1.35): JSONPatch in CEL that makes what the mutating webhook makes (the GPU
    /// classes' tolerations, the hostPath driver mounts in GPU containers, the metrics
    /// sidecar, default limits, the applied annotation), guarded so that the apiserver's
    /// reinvocation adds nothing twice. What it leaves to the webhook (pods with DRA
    /// claims, pods with pod-level resources) is said on standard error and in the YAML.
    MutatingAdmissionPolicy(ExportFlags),
}

#[derive(Args, Debug)]
pub struct ExportFlags {
    /// Policy file (YAML) [default: the built-in policy, a copy of policies/default.yaml].
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// A TollgatePolicy and TollgateProfiles to compose with the file, as the server
    /// composes them (-f, -k): such as the output of `kubectl get
    /// tollgatepolicies,tollgateprofiles -A -o yaml`. Each profile of the policy gets its
    /// own policy and binding; a namespace whose TollgateProfile changes what is exported
    /// is left out of the bindings (left to the webhook) and named.
    #[command(flatten)]
    pub manifests: Manifests,
    /// Read the cluster's TollgatePolicy and TollgateProfiles even where no kubeconfig is
    /// found (in-cluster, say), failing without a cluster; by default they are read where a
    /// kubeconfig is found, as `policy`, `review` and `audit` read them. Objects given with
    /// -f replace the cluster's of the same name.
    #[arg(long, conflicts_with = "local")]
    pub from_cluster: bool,
    /// Export the files alone (the policy file, -f, -k), without the cluster's
    /// TollgatePolicy and TollgateProfiles.
    #[arg(long)]
    pub local: bool,
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// tollgate's namespace, never selected (like kube-system), as with `tollgate register`.
    /// Not kubectl's -n: the namespace tollgate itself runs in, not one to read.
    #[arg(long, value_name = "NS", default_value = "tollgate-system")]
    pub namespace: String,
    /// The Kubernetes version of the apiserver (1.34, 1.35, 1.36): MutatingAdmissionPolicies
    /// are v1beta1 in 1.34 and 1.35 (behind the MutatingAdmissionPolicy feature gate and
    /// the admissionregistration.k8s.io/v1beta1 API), v1 from 1.36.
    #[arg(long, value_name = "VERSION", default_value = "1.36")]
    pub kubernetes_version: String,
    /// Write a manifest-based admission bundle (KEP-5793) instead of printing: the policies
    /// and bindings named `*.static.k8s.io`, one file per policy with its binding, in
    /// DIR/validating-admission-policies/ or DIR/mutating-admission-policies/ (one folder
    /// per admission plugin, as the apiserver's AdmissionConfiguration names them in
    /// `staticManifestsDir`). Other manifests already in that folder are removed. v1
    /// objects only (Kubernetes 1.36+).
    #[arg(long = "static", value_name = "DIR")]
    pub static_dir: Option<PathBuf>,
    /// Exit with status 1, writing no YAML, if the policy asks for something the export
    /// leaves out.
    #[arg(long)]
    pub strict: bool,
}

/// The folder of each plugin's manifests in a `--static` bundle.
pub const VALIDATING_FOLDER: &str = "validating-admission-policies";
pub const MUTATING_FOLDER: &str = "mutating-admission-policies";

/// Runs `tollgate export`; returns the exit status: 0 written, 1 refused by --strict,
/// 2 unusable policy, option or cluster, 3 the cluster's TollgatePolicy or TollgateProfiles
/// may not be read ([`super::objects::UNREADABLE_POLICY`]).
pub fn run(a: &ExportArgs) -> i32 {
    let (flags, mutating) = match &a.what {
        ExportCommand::ValidatingAdmissionPolicy(f) => (f, false),
        ExportCommand::MutatingAdmissionPolicy(f) => (f, true),
    };
    match export(flags, mutating) {
        Ok(status) => status,
        Err(Unexported::Input(e)) => {
            eprintln!("tollgate: {e}");
            2
        }
        Err(Unexported::Unreadable(e)) => {
            eprintln!("tollgate: {e}");
            super::objects::UNREADABLE_POLICY
        }
    }
}

/// Why nothing was exported.
enum Unexported {
    /// A policy, an option or a cluster that cannot be used.
    Input(String),
    /// The cluster's policy objects may not be read: an export without them would cover
    /// what they change.
    Unreadable(String),
}

impl From<String> for Unexported {
    fn from(e: String) -> Unexported {
        Unexported::Input(e)
    }
}

fn export(a: &ExportFlags, mutating: bool) -> Result<i32, Unexported> {
    let minor = kubernetes_minor(&a.kubernetes_version)?;
    if a.static_dir.is_some() && minor < 36 {
        return Err(Unexported::Input(format!(
            "--static with --kubernetes-version {}: manifest-based admission takes v1 objects \
             only, from Kubernetes 1.36 (behind the ManifestBasedAdmissionControlConfig gate)",
            a.kubernetes_version
        )));
    }
    let (policy, source) = composed(a)?;
    let namespace_selector = crate::register::validating_namespace_selector(&a.namespace)
        .map_err(|e| format!("{e:#}"))?;
    let options = ExportOptions {
        namespace_selector,
        source,
        kubernetes_minor: minor,
        static_names: a.static_dir.is_some(),
    };
    let (out, kind) = if mutating {
        (
            mutating_admission_policy(&policy, &options),
            "MutatingAdmissionPolicy",
        )
    } else {
        (
            validating_admission_policy(&policy, &options),
            "ValidatingAdmissionPolicy",
        )
    };
    for note in &out.notes {
        let tag = match note.kind {
            NoteKind::StaysWithWebhook => "note",
            NoteKind::Differs => "differs",
            NoteKind::Unexported => "not exported",
        };
        eprintln!("tollgate export: {tag} ({}): {}", note.field, note.text);
    }
    let refused = out.unexported().count();
    if a.strict && refused > 0 {
        eprintln!(
            "tollgate export: --strict: the policy asks for {refused} thing(s) the \
             {kind} would not do; nothing written"
        );
        return Ok(1);
    }
    if !mutating {
        eprintln!(
            "tollgate export: how the policy and the webhook differ: deploy/README.md, \
             \"Native validation\""
        );
    }
    if let Some(dir) = &a.static_dir {
        let folder = dir.join(if mutating {
            MUTATING_FOLDER
        } else {
            VALIDATING_FOLDER
        });
        write_bundle(&folder, &out)?;
        eprintln!(
            "tollgate export: wrote {} object(s) to {} (docs/operations.md, \
             \"Manifest-based admission\")",
            out.objects.len(),
            folder.display()
        );
        return Ok(0);
    }
    Ok(if super::kubectl::print(&out.yaml) {
        0
    } else {
        2
    })
}

/// `1.34`, `v1.35.2`: the minor version, one of those the export knows.
fn kubernetes_minor(v: &str) -> Result<u32, String> {
    let t = v.trim().trim_start_matches('v');
    let mut parts = t.split('.');
    let (major, minor) = (parts.next(), parts.next());
    match (major, minor.and_then(|m| m.parse::<u32>().ok())) {
        (Some("1"), Some(m)) if (34..=36).contains(&m) => Ok(m),
        (Some("1"), Some(m)) if m > 36 => Ok(36),
        _ => Err(format!(
            "--kubernetes-version {v:?}: 1.34, 1.35 or 1.36 (MutatingAdmissionPolicy is \
             v1beta1 in 1.34 and 1.35, v1 from 1.36)"
        )),
    }
}

/// Each policy with its binding in a file of its own (`NAME.yaml`: loaded and reloaded
/// together), in `folder`, which holds nothing else the apiserver would load.
fn write_bundle(folder: &Path, out: &Export) -> Result<(), String> {
    let err = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    std::fs::create_dir_all(folder).map_err(|e| err("creating", folder, e))?;
    let entries = std::fs::read_dir(folder).map_err(|e| err("reading", folder, e))?;
    for entry in entries.flatten() {
        let p = entry.path();
        let manifest = p
            .extension()
            .is_some_and(|x| x == "yaml" || x == "yml" || x == "json");
        if manifest && p.is_file() {
            std::fs::remove_file(&p).map_err(|e| err("removing", &p, e))?;
        }
    }
    let mut files: Vec<(String, String)> = vec![];
    for o in &out.objects {
        let file = format!("{}.yaml", o.name);
        match files.iter_mut().find(|(f, _)| *f == file) {
            Some((_, text)) => {
                text.push_str("---\n");
                text.push_str(&o.yaml);
            }
            None => files.push((file, format!("---\n{}", o.yaml))),
        }
    }
    for (file, text) in files {
        let p = folder.join(&file);
        std::fs::write(&p, text).map_err(|e| err("writing", &p, e))?;
    }
    Ok(())
}

/// The file (or the built-in policy), the cluster's objects (where a kubeconfig is found,
/// or with --from-cluster; not with --local) and the objects given, composed; and how the
/// header names it. An object that does not load is not applied, as the server would not
/// apply it, and said so.
fn composed(a: &ExportFlags) -> Result<(Policy, String), Unexported> {
    let file = super::objects::file_layer(a.policy.as_deref())?;
    let given = super::policy::read_objects(&a.manifests, None)?;
    let found = if a.from_cluster || (!a.local && a.cluster.found()) {
        let (mut found, url) = cluster_objects(&a.cluster, &given)?;
        eprintln!(
            "tollgate export: composed with the TollgatePolicy and TollgateProfiles of the cluster at {url} (--local: the files alone)"
        );
        found.overlay(given);
        found
    } else {
        given
    };
    let composed = super::objects::compose(file.as_ref(), &found)?;
    for s in composed.statuses.iter().filter(|s| !s.ready) {
        eprintln!("tollgate export: not applied: {}", s.message);
    }
    let mut source = a
        .policy
        .as_ref()
        .map_or_else(|| BUILTIN_SOURCE.to_owned(), |p| p.display().to_string());
    if let Some(c) = &composed.policy.layers.cluster {
        let origin = found.cluster.as_ref().map_or("", |(o, _)| o.as_str());
        source = format!("{source} with {} ({origin})", c.source);
    }
    if !composed.policy.layers.namespaces.is_empty() {
        source = format!(
            "{source} and {} namespace TollgateProfile(s)",
            composed.policy.layers.namespaces.len()
        );
    }
    Ok((composed.policy, source))
}

/// The cluster's TollgatePolicy and every namespace's TollgateProfile, as the audit reads
/// them, and the cluster's URL. Either kind the user may not read ends the export (exit 3):
/// without the TollgatePolicy it would export the built-in policy as the cluster's, and
/// without a profile its bindings would cover a namespace whose profile changes what they
/// carry.
fn cluster_objects(
    cluster: &ClusterFlags,
    given: &PolicyObjects,
) -> Result<(PolicyObjects, String), Unexported> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let config = cluster
            .config("pass --local to export the files alone")
            .await
            .map_err(|e| format!("{e:#}"))?;
        let url = config.cluster_url.to_string();
        let client = kube::Client::try_from(config)
            .map_err(|e| format!("creating a client for the API server at {url}: {e}"))?;
        let (found, unread) =
            super::objects::from_cluster(client, &url, &crate::audit::Namespaces::All).await?;
        if let Some(line) = super::objects::unreadable_policy(&unread, given, true) {
            return Err(Unexported::Unreadable(line));
        }
        if let Some(u) = unread.iter().find(|u| u.kind != tollgate_core::POLICY_KIND) {
            return Err(Unexported::Unreadable(format!(
                "could not read the namespaces' TollgateProfiles: forbidden: {}; without them \
                 the bindings would cover namespaces whose profiles change what they carry, \
                 so nothing is exported. Ask for list on tollgateprofiles.tollgate.dev in \
                 every namespace, or pass --local to export the files alone",
                u.why
            )));
        }
        Ok((found, url))
    })
}

//! `tollgate export validating-admission-policy`: the validation half of the policy as a
//! ValidatingAdmissionPolicy and its binding, for the apiserver to evaluate itself.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::kubectl::Manifests;
use tollgate_core::{validating_admission_policy, ExportOptions, NoteKind, Policy, BUILTIN_SOURCE};

#[derive(Args, Debug)]
pub struct ExportArgs {
    #[command(subcommand)]
    pub what: ExportCommand,
}

#[derive(Subcommand, Debug)]
pub enum ExportCommand {
    /// Print the policy's validation as a ValidatingAdmissionPolicy and its binding (YAML).
    ///
    /// admissionregistration.k8s.io/v1, Kubernetes 1.30+: the apiserver evaluates it in
    /// process. What it leaves out is said on standard error; deploy/README.md
    /// ("Native validation") lists how it differs from the validating webhook.
    ValidatingAdmissionPolicy(VapArgs),
}

#[derive(Args, Debug)]
pub struct VapArgs {
    /// Policy file (YAML) [default: the built-in policy, a copy of policies/default.yaml].
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// A TollgatePolicy and TollgateProfiles to compose with the file, as the server
    /// composes them (-f, -k): such as the output of `kubectl get
    /// tollgatepolicies,tollgateprofiles -A -o yaml`. The export covers the cluster's
    /// policy; the TollgateProfiles it does not cover are named.
    #[command(flatten)]
    pub manifests: Manifests,
    /// tollgate's namespace, never selected (like kube-system), as with `tollgate register`.
    /// Not kubectl's -n: the namespace tollgate itself runs in, not one to read.
    #[arg(long, value_name = "NS", default_value = "tollgate-system")]
    pub namespace: String,
    /// Exit with status 1, printing no YAML, if the policy asks for something the export
    /// leaves out.
    #[arg(long)]
    pub strict: bool,
}

/// Runs `tollgate export`; returns the exit status: 0 written, 1 refused by --strict,
/// 2 unusable policy or option.
pub fn run(a: &ExportArgs) -> i32 {
    match &a.what {
        ExportCommand::ValidatingAdmissionPolicy(v) => run_vap(v),
    }
}

fn run_vap(a: &VapArgs) -> i32 {
    let (policy, source) = match composed(a) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("tollgate: {e}");
            return 2;
        }
    };
    let namespace_selector = match crate::register::validating_namespace_selector(&a.namespace) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tollgate: {e:#}");
            return 2;
        }
    };
    let out = validating_admission_policy(
        &policy,
        &ExportOptions {
            namespace_selector,
            source,
        },
    );
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
             ValidatingAdmissionPolicy would not do; nothing written"
        );
        return 1;
    }
    eprintln!(
        "tollgate export: how the policy and the webhook differ: deploy/README.md, \
         \"Native validation\""
    );
    if super::kubectl::print(&out.yaml) {
        0
    } else {
        2
    }
}

/// The file (or the built-in policy) and the objects given, composed; and how the
/// header names it. An object that does not load is not applied, as the server would not
/// apply it, and said so.
fn composed(a: &VapArgs) -> Result<(Policy, String), String> {
    let file = super::objects::file_layer(a.policy.as_deref())?;
    let found = super::policy::read_objects(&a.manifests, None)?;
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
    Ok((composed.policy, source))
}

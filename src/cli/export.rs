//! `tollgate export validating-admission-policy`: the validation half of the policy as a
//! ValidatingAdmissionPolicy and its binding, for the apiserver to evaluate itself.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use tollgate_core::export::{self, NoteKind, Options};
use tollgate_core::policy::{Policy, BUILTIN_SOURCE};

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
    /// tollgate's namespace, never selected (like kube-system), as with `tollgate register`.
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
    let (policy, source) = match &a.policy {
        Some(path) => {
            let loaded = std::fs::read_to_string(path)
                .map_err(|e| format!("{}: {e}", path.display()))
                .and_then(|text| {
                    Policy::from_text(&path.display().to_string(), &text).map_err(|e| e.to_string())
                });
            match loaded {
                Ok(p) => (p, path.display().to_string()),
                Err(e) => {
                    eprintln!("tollgate: {e}");
                    return 2;
                }
            }
        }
        None => (Policy::builtin(), BUILTIN_SOURCE.to_owned()),
    };
    let namespace_selector = match crate::register::validating_namespace_selector(&a.namespace) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tollgate: {e:#}");
            return 2;
        }
    };
    let out = export::validating_admission_policy(
        &policy,
        &Options {
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
    print!("{}", out.yaml);
    0
}

//! `tollgate review`: the engine offline, on the objects of a file, as a cluster with both
//! webhooks would judge them.
//!
//! The input is one JSON document or any number of YAML documents (`---`), a `kind: List`
//! among them expanded. Pods, workloads (the kinds of the policy's `workloads.kinds`: Jobs,
//! Deployments, PyTorchJobs, ...) and AdmissionReviews are what is reviewed, in file order;
//! ResourceClaims, ResourceClaimTemplates and Namespaces are the cluster context they are
//! reviewed in (a DRA Job's file checked as it is, its claim template beside it). What the
//! file does not hold does not exist, as far as the review knows.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Namespace;

use clap::{Args, ValueEnum};
use serde_json::{json, Value};

use tollgate_core::cluster::{Cluster, Objects};
pub use tollgate_core::pipeline::synthetic_review;
use tollgate_core::pipeline::{self, group_version};
use tollgate_core::policy::Policy;
use tollgate_core::review::Reviewed;
use tollgate_core::workload::TemplateVerdict;

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
    /// Pods and workloads (YAML or JSON) or AdmissionReviews (JSON), with the
    /// ResourceClaims, ResourceClaimTemplates and Namespaces they refer to; "-" reads
    /// standard input.
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
    /// For a Pod or workload input: the namespace [default: the object's, or "default"].
    #[arg(long)]
    pub namespace: Option<String>,
    /// For a Pod or workload input: the requesting user (opt-out governance looks at it).
    #[arg(long, default_value = "tollgate-review")]
    pub user: String,
    /// For a Pod or workload input: a group of the requesting user (repeatable).
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// The labels of the namespace the objects are reviewed in, for policy profiles that
    /// match on them: `k=v,k2=v2` [default: those of a Namespace object in the input, if
    /// any; `kubernetes.io/metadata.name` is always set, as the apiserver does].
    #[arg(long, value_parser = parse_labels)]
    pub namespace_labels: Option<BTreeMap<String, String>>,
}

fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not key=value"))?;
        out.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(out)
}

#[derive(Debug)]
struct Unusable(String);

/// Runs `tollgate review`; returns the exit status: 0 every object allowed, 1 one denied,
/// 2 unusable input or policy.
pub fn run(a: &ReviewArgs) -> i32 {
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

/// `--policy FILE`, or the built-in policy; an error is the one line to show.
pub fn load_policy(path: Option<&std::path::Path>) -> Result<Policy, String> {
    match path {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            Policy::from_text(&path.display().to_string(), &text).map_err(|e| e.to_string())
        }
        None => Ok(Policy::builtin()),
    }
}

fn review_inner(a: &ReviewArgs) -> Result<(String, bool), Unusable> {
    let policy = load_policy(a.policy.as_deref()).map_err(Unusable)?;
    let input = if a.file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| Unusable(format!("standard input: {e}")))?;
        s
    } else {
        std::fs::read_to_string(&a.file).map_err(|e| Unusable(format!("{}: {e}", a.file)))?
    };
    let unusable = |e: String| Unusable(format!("{}: {e}", a.file));
    let input = split(documents(&input).map_err(unusable)?, &policy).map_err(unusable)?;
    let mut results = Vec::with_capacity(input.subjects.len());
    for subject in &input.subjects {
        let mut context = input.context.clone();
        if let Some(labels) = &a.namespace_labels {
            context.add_namespace(namespace_object(&namespace_of(subject, a), labels));
        }
        results.push(run_review(&policy, subject, a, &context).map_err(unusable)?);
    }
    let allowed = results.iter().all(|r| r.allowed);
    let text = match a.output {
        Output::Json => {
            // One object: the result itself, as it always was; several: an array of them.
            let value = match results.as_slice() {
                [one] => one.to_json(),
                many => Value::Array(many.iter().map(CliResult::to_json).collect()),
            };
            let mut s = serde_json::to_string_pretty(&value).unwrap_or_default();
            s.push('\n');
            s
        }
        Output::Text => results
            .iter()
            .map(CliResult::to_text)
            .collect::<Vec<_>>()
            .join("\n"),
    };
    Ok((text, allowed))
}

/// The documents of an input: one JSON value, or YAML documents; a `kind: List` stands for
/// its items.
pub fn documents(text: &str) -> Result<Vec<Value>, String> {
    if text.trim().is_empty() {
        return Err("empty input: expected a Pod, a workload or an AdmissionReview".into());
    }
    // JSON first: it is exact for what the apiserver sends; YAML covers the rest.
    let docs = match serde_json::from_str::<Value>(text) {
        Ok(v) => vec![v],
        Err(_) => serde_saphyr::from_multiple::<Value>(text)
            .map_err(|e| format!("neither JSON nor YAML: {e}"))?,
    };
    let mut out = Vec::with_capacity(docs.len());
    for d in docs {
        match d {
            Value::Null => {}
            Value::Object(ref m) if m.get("kind").and_then(Value::as_str) == Some("List") => {
                let items = m.get("items").and_then(Value::as_array).cloned();
                out.extend(items.into_iter().flatten());
            }
            d => out.push(d),
        }
    }
    Ok(out)
}

/// The namespace a subject is reviewed in: `--namespace`, else its own, else `default`.
fn namespace_of(subject: &Value, a: &ReviewArgs) -> String {
    let own = subject
        .pointer("/request/namespace")
        .or_else(|| subject.pointer("/metadata/namespace"))
        .and_then(Value::as_str);
    a.namespace
        .as_deref()
        .or(own)
        .unwrap_or("default")
        .to_owned()
}

/// A Namespace with `labels` and the name label the apiserver sets on every namespace.
fn namespace_object(name: &str, labels: &BTreeMap<String, String>) -> Namespace {
    let mut labels = labels.clone();
    labels.insert(NAME_LABEL.into(), name.to_owned());
    let mut ns = Namespace::default();
    ns.metadata.name = Some(name.to_owned());
    ns.metadata.labels = Some(labels);
    ns
}

/// Adds `doc` to `context` if it is a context object (a ResourceClaim, ResourceClaimTemplate
/// or Namespace); false if it is another kind. A Namespace gets the name label the
/// apiserver sets on every namespace.
pub fn add_context(context: &mut Objects, doc: &Value) -> Result<bool, serde_json::Error> {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
    let api = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    match (kind, api) {
        ("ResourceClaim", "resource.k8s.io/v1") => {
            context.add_claim(serde_json::from_value(doc.clone())?)
        }
        ("ResourceClaimTemplate", "resource.k8s.io/v1") => {
            context.add_template(serde_json::from_value(doc.clone())?)
        }
        ("Namespace", "v1") => {
            let mut ns: Namespace = serde_json::from_value(doc.clone())?;
            let name = ns.metadata.name.clone().unwrap_or_default();
            ns.metadata
                .labels
                .get_or_insert_with(Default::default)
                .entry(NAME_LABEL.into())
                .or_insert(name);
            context.add_namespace(ns)
        }
        // What a TrainJob's pods are made from, read as JSON.
        ("TrainingRuntime" | "ClusterTrainingRuntime", "trainer.kubeflow.org/v1alpha1") => {
            return Ok(context.add_training_runtime(doc.clone()));
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// Set by the apiserver on every namespace: selectors may rely on it.
const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// An input's documents: what is reviewed, and the cluster context it is reviewed in.
pub struct Input {
    pub subjects: Vec<Value>,
    pub context: Objects,
}

/// Sorts documents into subjects (Pods, the workloads `policy` lists, AdmissionReviews) and
/// context (claims, claim templates, namespaces). Another kind of object is an error naming
/// it.
pub fn split(docs: Vec<Value>, policy: &Policy) -> Result<Input, String> {
    let mut input = Input {
        subjects: vec![],
        context: Objects::complete(),
    };
    for (i, d) in docs.into_iter().enumerate() {
        let kind = d
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let api = d.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let bad = |e: serde_json::Error| format!("document {}: a {kind}: {e}", i + 1);
        match (kind.as_str(), api) {
            ("Pod" | "AdmissionReview", _) => input.subjects.push(d),
            _ if add_context(&mut input.context, &d).map_err(bad)? => {}
            ("", _) => {
                return Err(format!(
                    "document {}: no kind: expected a Pod, a workload or an AdmissionReview",
                    i + 1
                ))
            }
            (k, api) if is_workload(policy, api, k) => input.subjects.push(d),
            (k, _) => {
                return Err(format!(
                    "a {k} ({api}): expected a Pod, a workload the policy lists (workloads.kinds) or an AdmissionReview, with the ResourceClaims (resource.k8s.io/v1), ResourceClaimTemplates and Namespaces they use"
                ))
            }
        }
    }
    if input.subjects.is_empty() {
        return Err("no Pod, workload or AdmissionReview to review".into());
    }
    Ok(input)
}

fn is_workload(policy: &Policy, api: &str, kind: &str) -> bool {
    let (group, version) = group_version(api);
    policy.workloads.kind(group, version, kind).is_some()
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
    /// The policy profile applied; None: the base policy.
    pub profile: Option<String>,
    /// For a workload: its kind (`Job`), and what became of each of its pod templates.
    pub workload: Option<String>,
    pub templates: Vec<TemplateVerdict>,
}

impl CliResult {
    pub fn to_json(&self) -> Value {
        let Some(kind) = &self.workload else {
            return json!({
                "decision": if self.allowed { "allowed" } else { "denied" },
                "allowed": self.allowed,
                "message": self.message,
                "warnings": self.warnings,
                "steps": self.steps,
                "profile": self.profile,
                "patch": self.patch,
                "mutatedPod": self.mutated,
                "mutateResponse": self.mutate_response,
                "validateResponse": self.validate_response,
            });
        };
        let templates: Vec<Value> = self
            .templates
            .iter()
            .map(|t| json!({"template": t.template, "path": t.pointer, "decision": t.decision}))
            .collect();
        json!({
            "decision": if self.allowed { "allowed" } else { "denied" },
            "allowed": self.allowed,
            "kind": kind,
            "namespace": self.namespace,
            "name": self.name,
            "templates": templates,
            "message": self.message,
            "warnings": self.warnings,
            "profile": self.profile,
            "patch": self.patch,
            "mutatedObject": self.mutated,
            "mutateResponse": self.mutate_response,
            "validateResponse": self.validate_response,
        })
    }

    pub fn to_text(&self) -> String {
        let noun = self
            .workload
            .as_deref()
            .map_or("pod".to_owned(), str::to_ascii_lowercase);
        let mut out = format!(
            "{noun} {}/{}: {}",
            self.namespace,
            self.name,
            if self.allowed { "allowed" } else { "denied" }
        );
        let mut notes = vec![];
        if let Some(p) = &self.profile {
            notes.push(format!("profile {p}"));
        }
        if !self.steps.is_empty() {
            notes.push(format!("mutated: {}", self.steps.join(", ")));
        }
        if !notes.is_empty() {
            out.push_str(&format!(" ({})", notes.join("; ")));
        }
        out.push('\n');
        for t in &self.templates {
            out.push_str(&format!(
                "  {} ({}): {}\n",
                t.template, t.pointer, t.decision
            ));
        }
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
        // A workload is only ever changed in its opt-out approval: shown when it was.
        let changed = self.workload.is_none() || self.patch.is_some();
        if let Some(m) = self.mutated.as_ref().filter(|_| changed) {
            out.push_str(&format!("\nmutated {noun}:\n"));
            out.push_str(&serde_saphyr::to_string(m).unwrap_or_default());
        }
        out
    }
}

/// Builds the review(s) the apiserver would send for `value` and runs them, knowing what
/// `cluster` knows.
pub fn run_review(
    policy: &Policy,
    value: &Value,
    a: &ReviewArgs,
    cluster: &dyn Cluster,
) -> Result<CliResult, String> {
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    let api = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let review = match kind {
        "AdmissionReview" => value.clone(),
        "Pod" => synthetic_review(value, a.namespace.as_deref(), &a.user, &a.groups),
        k if is_workload(policy, api, k) => {
            synthetic_review(value, a.namespace.as_deref(), &a.user, &a.groups)
        }
        "" => return Err("no kind: expected a Pod, a workload or an AdmissionReview".into()),
        k => {
            return Err(format!(
                "a {k}: expected a Pod, a workload or an AdmissionReview"
            ))
        }
    };
    let stage = match a.stage {
        Stage::All => pipeline::Stage::All,
        Stage::Mutate => pipeline::Stage::Mutate,
        Stage::Validate => pipeline::Stage::Validate,
    };
    let judged = pipeline::run(policy, cluster, &review, stage).map_err(|e| e.to_string())?;
    Ok(CliResult::of(judged))
}

impl CliResult {
    /// What the command shows of the pipeline's judgement.
    fn of(mut judged: pipeline::Judged) -> CliResult {
        let mut result = CliResult {
            allowed: judged.allowed,
            message: judged.message.clone(),
            warnings: judged.warnings().cloned().collect(),
            patch: None,
            mutated: judged.mutated.take(),
            mutate_response: None,
            validate_response: None,
            namespace: String::new(),
            name: String::new(),
            steps: vec![],
            profile: None,
            workload: None,
            templates: vec![],
        };
        if let Some(r) = &judged.mutate {
            result.patch = r.patch();
            result.steps = r.steps().iter().map(|s| s.as_str()).collect();
            result.mutate_response = Some(response_value(r));
        }
        if let Some(r) = &judged.validate {
            result.validate_response = Some(response_value(r));
        }
        if let Some(r) = judged.last() {
            result.namespace = r.namespace.clone();
            result.name = r.name.clone();
            result.profile.clone_from(&r.profile);
            result.workload = r.kind().map(str::to_owned);
            result.templates = r.templates().to_vec();
        }
        result
    }
}

fn response_value(r: &Reviewed) -> Value {
    serde_json::from_slice(&r.to_json()).unwrap_or(Value::Null)
}

//! `tollgate review`: the engine offline, on the objects of files, directories and
//! kustomizations, as a cluster with both webhooks would judge them.
//!
//! The input is taken as `kubectl apply` takes it (`cli::kubectl::Manifests`: files named
//! or given with `-f`, `-k DIR` built by `kubectl kustomize`): a file of one JSON document
//! or any number of YAML documents (`---`), numbered in their file, a `kind: List` among
//! them expanded, or a directory of such files (`.yaml`, `.yml`, `.json`; `-R` goes into
//! subdirectories). What is not a Kubernetes object (a kustomization.yaml, a Helm values
//! file, a directory's file that is no YAML) is listed as skipped, never fatal. Pods, workloads
//! (the kinds of the policy's `workloads.kinds`: Jobs, Deployments, PyTorchJobs, ...) and
//! AdmissionReviews are what is reviewed, in input order; ResourceClaims and
//! ResourceClaimTemplates (`resource.k8s.io` v1, v1beta2 or v1beta1, read as v1) and
//! Namespaces are the cluster context they are reviewed in (a DRA Job's file checked as it
//! is, its claim template beside it); an object written without a namespace lands in
//! `--namespace`, else `default`, as kubectl puts it. A TollgatePolicy and TollgateProfiles
//! (`tollgate.dev/v1alpha1`), in the input or in `--cluster-state`, are the policy: composed
//! with the file (or the built-in policy) as the server composes them (`cli::objects`)
//! before anything else is reviewed, so that a namespace's pods are judged with its
//! profile; each is listed as in force, or denied (exit 1) naming the field and the bound
//! when the webhook would refuse it, and the pods of its namespace are then judged by the
//! cluster's policy, as the server would judge them. Any other object (a Service, a
//! ConfigMap) is listed as not reviewed, and changes nothing about the exit status. What the
//! input does not hold does not exist, as far as the review knows.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Namespace;

use clap::{Args, ValueEnum};
use serde_json::{json, Value};

use super::kubectl::{kind_noun, Document, Manifests};
use super::objects::{self, PolicyObjects};
pub use tollgate_core::synthetic_review;
use tollgate_core::{
    claim_from, claim_template_from, group_version, place_in_namespace, run_pipeline, Cluster,
    FieldError, Judged, ObjectStatus, Objects, Policy, Reviewed, Stage, TemplateVerdict,
    DRA_API_VERSIONS, KARPENTER_NODEPOOL_API_VERSION, KUEUE_API_VERSIONS,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// `--stage`: the engine's [`Stage`], each value with the help `--help` shows.
fn stage_parser() -> impl clap::builder::TypedValueParser<Value = Stage> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new([
        PossibleValue::new(Stage::All.as_str()).help(
            "Mutate, then validate the mutated pod (after the apiserver's defaulting), as a cluster with both webhooks would",
        ),
        PossibleValue::new(Stage::Mutate.as_str()).help("Only the mutating webhook"),
        PossibleValue::new(Stage::Validate.as_str()).help("Only the validating webhook"),
    ])
    // Only those three reach here, and each parses.
    .map(|s| s.parse().unwrap_or(Stage::All))
}

#[derive(Args, Debug)]
pub struct ReviewArgs {
    /// Pods and workloads (YAML or JSON) or AdmissionReviews (JSON), with the
    /// ResourceClaims, ResourceClaimTemplates and Namespaces they refer to, and the
    /// TollgatePolicy and TollgateProfiles to judge them with: files, directories of
    /// .yaml, .yml and .json files (as `kubectl apply -f DIR`), or "-" for standard input,
    /// as many as -f takes. Other objects are listed as not reviewed; documents that are
    /// not Kubernetes objects (a kustomization.yaml, a Helm values file) as skipped.
    #[arg(value_name = "FILE")]
    pub files: Vec<String>,
    #[command(flatten)]
    pub manifests: Manifests,
    /// A saved picture of the cluster to review against: its Nodes, ResourceQuotas and
    /// DeviceClasses (and claims, namespaces and Kueue's LocalQueues and ClusterQueues),
    /// such as the output of `kubectl get nodes,resourcequotas,deviceclasses -A -o yaml`;
    /// its TollgatePolicy and TollgateProfiles are composed with the policy (those of the
    /// input replace them). Other objects in it are left out.
    #[arg(long, value_name = "FILE")]
    pub cluster_state: Option<PathBuf>,
    /// Policy file (YAML) [default: the built-in policy, a copy of policies/default.yaml].
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Output format: `json` is a list of results, one for each object, each with its
    /// kind and name.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Which webhook(s) to run.
    #[arg(long, value_parser = stage_parser(), default_value = "all")]
    pub stage: Stage,
    /// For a Pod or workload input: the namespace [default: the object's, or "default"];
    /// for an object written without one, its namespace [default: "default"], as
    /// `kubectl apply -n` places it.
    #[arg(short = 'n', long, value_name = "NS")]
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
    /// The cluster whose TollgatePolicy and the TollgateProfiles of the input's namespaces
    /// to judge with, read when a kubeconfig is found and no --cluster-state is given
    /// (those of the input replace them by name).
    #[command(flatten)]
    pub cluster: super::kubectl::ClusterFlags,
    /// Read no cluster: the policy file and the input alone (as without a kubeconfig).
    #[arg(long)]
    pub local: bool,
}

pub(super) fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
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

/// The marker of an [`Unusable`] that is the cluster's TollgatePolicy unread (exit 3).
const UNREADABLE: &str = "could not read the cluster's TollgatePolicy";

/// Runs `tollgate review`; returns the exit status: 0 every object allowed, 1 one denied,
/// 2 unusable input or policy, 3 the cluster's TollgatePolicy may not be read.
pub fn run(a: &ReviewArgs) -> i32 {
    match review_inner(a) {
        Ok((text, allowed)) => {
            if !super::kubectl::print(&text) {
                return 2;
            }
            if allowed {
                0
            } else {
                1
            }
        }
        Err(Unusable(msg)) => {
            eprintln!("tollgate: {msg}");
            if msg.starts_with(UNREADABLE) {
                objects::UNREADABLE_POLICY
            } else {
                2
            }
        }
    }
}

/// The cluster's TollgatePolicy and the TollgateProfiles of `namespaces`, as the user may
/// read them (`objects::from_cluster`), with `given` (the input's) over them; an unread
/// TollgatePolicy none of `given` replaces is an error ([`UNREADABLE`]).
fn live_objects(
    cluster: &super::kubectl::ClusterFlags,
    namespaces: &std::collections::BTreeSet<String>,
    given: &PolicyObjects,
) -> Result<(PolicyObjects, String), Unusable> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Unusable(e.to_string()))?;
    runtime.block_on(async {
        let config = cluster
            .config("pass --local to review with the files alone")
            .await
            .map_err(|e| Unusable(format!("{e:#}")))?;
        let url = config.cluster_url.to_string();
        let client = kube::Client::try_from(config).map_err(|e| {
            Unusable(format!("creating a client for the API server at {url}: {e}"))
        })?;
        let mut found = PolicyObjects::default();
        for ns in namespaces {
            let scope = crate::audit::Namespaces::One(ns.clone());
            let (objects, unread) = objects::from_cluster(client.clone(), &url, &scope)
                .await
                .map_err(Unusable)?;
            if let Some(line) = objects::unreadable_policy(&unread, given, true) {
                return Err(Unusable(line));
            }
            for u in unread
                .iter()
                .filter(|u| u.kind != tollgate_core::POLICY_KIND)
            {
                eprintln!(
                    "tollgate: reviewed without the TollgateProfile of namespace {ns}, which you may not read: {}",
                    u.why
                );
            }
            found.overlay(objects);
        }
        Ok((found, url))
    })
}

fn review_inner(a: &ReviewArgs) -> Result<(String, bool), Unusable> {
    let file = objects::file_layer(a.policy.as_deref()).map_err(Unusable)?;
    if a.manifests.is_empty(&a.files) {
        return Err(Unusable(
            "nothing to review: name files or directories, -f FILE, -k DIR, or - for standard input".into(),
        ));
    }
    let texts = a.manifests.texts(&a.files).map_err(Unusable)?;
    let many = texts.len() > 1 || texts.iter().any(|t| t.in_directory);
    let default_ns = a.namespace.as_deref().unwrap_or("default");
    let mut docs = vec![];
    // What is not a Kubernetes object (a kustomization.yaml, a Helm values file, a file of
    // a directory that is not YAML at all) is listed and left out, never fatal: a GitOps
    // folder holds them beside its manifests.
    let mut not_objects = vec![];
    for t in &texts {
        match numbered(&t.name, &t.text, default_ns) {
            Ok(found) => {
                for d in found {
                    match d.not_an_object() {
                        Some(why) => not_objects.push(Entered::skipped(&d, why)),
                        None => docs.push(d),
                    }
                }
            }
            Err(e) if t.in_directory => not_objects.push(Entered {
                file: t.name.clone(),
                document: None,
                what: Entry::Skipped(Skipped::unnamed(format!("not a manifest: {e}"))),
            }),
            Err(e) => return Err(Unusable(format!("{}: {e}", t.name))),
        }
    }
    // The policy objects are context for everything else: taken out and composed first,
    // those of the input over those of the saved cluster state.
    let mut found = PolicyObjects::default();
    let mut state = vec![];
    if let Some(path) = &a.cluster_state {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Unusable(format!("{name}: {e}")))?;
        let docs = read(&text, default_ns).map_err(|e| Unusable(format!("{name}: {e}")))?;
        for (i, d) in docs.into_iter().enumerate() {
            if !found.add(&name, &d) {
                state.push((i, d));
            }
        }
    }
    let mut in_input = PolicyObjects::default();
    docs.retain(|d| !in_input.add(&d.file, &d.value));
    // The live cluster's, where a kubeconfig is found (and no saved state stands for it).
    if a.cluster_state.is_none() && !a.local && a.cluster.found() {
        let namespaces: std::collections::BTreeSet<String> = docs
            .iter()
            .filter_map(|d| {
                d.value
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
            })
            .chain(std::iter::once(default_ns))
            .map(str::to_owned)
            .collect();
        let (live, url) = live_objects(&a.cluster, &namespaces, &in_input)?;
        eprintln!(
            "tollgate: reviewed with the TollgatePolicy and TollgateProfiles of the cluster at {url} (--local: the files alone)"
        );
        found.overlay(live);
    }
    found.overlay(in_input);
    let composed = objects::compose(file.as_ref(), &found).map_err(Unusable)?;
    let policy = composed.policy;
    let mut input = split(docs, &policy, default_ns).map_err(Unusable)?;
    if let Some(path) = &a.cluster_state {
        let name = path.display().to_string();
        for (i, d) in &state {
            add_context(&mut input.context, d)
                .map_err(|e| Unusable(format!("{name}: document {}: {e}", i + 1)))?;
        }
    }
    if input.entries.is_empty() && input.context_only.is_empty() && composed.statuses.is_empty() {
        let names: Vec<&str> = texts.iter().map(|t| t.name.as_str()).collect();
        // What was left out, and why: the likeliest mistake in such an input.
        let why: Vec<String> = not_objects
            .iter()
            .take(3)
            .filter_map(|e| match &e.what {
                Entry::Skipped(s) => Some(format!("{}: {}", e.place(), s.reason)),
                Entry::Subject(_) => None,
            })
            .collect();
        let left_out = match not_objects.len() {
            0 => String::new(),
            n => format!(
                " ({n} document(s) left out: {}{})",
                why.join("; "),
                if n > why.len() { "; ..." } else { "" }
            ),
        };
        return Err(Unusable(format!(
            "{}: nothing to review: no Pod, workload or AdmissionReview{left_out}",
            names.join(", ")
        )));
    }
    // Context alone (a repository of quotas, say): listed, nothing refused.
    let context_only = std::mem::take(&mut input.context_only);
    if input.entries.is_empty() {
        input.entries = context_only;
    }
    input.entries.extend(not_objects);
    // In input order: file by file as named, document by document.
    let order = |e: &Entered| {
        let file = texts.iter().position(|t| t.name == e.file);
        (file, e.document)
    };
    input.entries.sort_by_key(order);
    let mut results = Vec::with_capacity(composed.statuses.len() + input.entries.len());
    // The policy objects first: what the rest is judged with.
    for status in &composed.statuses {
        let mut result = CliResult::policy_object(status);
        if many || a.cluster_state.is_some() {
            result.file = found.origin(status).map(str::to_owned);
        }
        results.push(result);
    }
    for entry in &input.entries {
        let mut result = match &entry.what {
            Entry::Subject(subject) => {
                let mut context = input.context.clone();
                if let Some(labels) = &a.namespace_labels {
                    context.add_namespace(namespace_object(&namespace_of(subject, a), labels));
                }
                run_review(&policy, subject, a, &context)
                    .map_err(|e| Unusable(format!("{}: {e}", entry.place())))?
            }
            Entry::Skipped(s) => CliResult::skipped(s),
        };
        if many {
            result.file = Some(entry.file.clone());
            result.document = entry.document;
        }
        results.push(result);
    }
    let allowed = results.iter().all(|r| r.allowed);
    let text = match a.output {
        Output::Json => {
            // Always a list, one result for each object, whatever their number: a script
            // reads one shape.
            let value = Value::Array(results.iter().map(CliResult::to_json).collect());
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

/// The documents of an input's text ([`read`]), numbered within it from 1 as kubectl
/// numbers them (a `kind: List`'s items share its number).
fn numbered(file: &str, text: &str, namespace: &str) -> Result<Vec<Document>, String> {
    let mut out = vec![];
    for (number, mut value) in numbered_documents(text)? {
        place_namespace(&mut value, namespace);
        out.push(Document {
            file: file.to_owned(),
            number,
            value,
        });
    }
    Ok(out)
}

/// The documents of an input: one JSON value, or YAML documents; a `kind: List` stands for
/// its items. YAML is read as kubectl reads it (sigs.k8s.io/yaml, whose scalars are YAML
/// 1.1's): `0644` is the octal 420, `yes`/`no`/`on`/`off` are booleans, so that a file
/// means to `review` what it means to the apiserver `kubectl apply` sends it to.
pub fn documents(text: &str) -> Result<Vec<Value>, String> {
    Ok(numbered_documents(text)?
        .into_iter()
        .map(|(_, d)| d)
        .collect())
}

/// [`documents`], each with its number in the text, from 1; the items of a `kind: List`
/// share its number, and an empty document has none.
fn numbered_documents(text: &str) -> Result<Vec<(usize, Value)>, String> {
    if text.trim().is_empty() {
        return Err("empty input: expected a Pod, a workload or an AdmissionReview".into());
    }
    // JSON first: it is exact for what the apiserver sends; YAML covers the rest.
    let docs = match serde_json::from_str::<Value>(text) {
        Ok(v) => vec![v],
        Err(_) => {
            let options = serde_saphyr::options! {
                legacy_octal_numbers: true,
                strict_booleans: false,
            };
            serde_saphyr::from_multiple_with_options::<Value>(text, options)
                .map_err(|e| format!("neither JSON nor YAML: {e}"))?
        }
    };
    let mut out = Vec::with_capacity(docs.len());
    for (i, d) in docs.into_iter().filter(|d| !d.is_null()).enumerate() {
        match d {
            Value::Object(ref m) if m.get("kind").and_then(Value::as_str) == Some("List") => {
                let items = m.get("items").and_then(Value::as_array).cloned();
                out.extend(items.into_iter().flatten().map(|item| (i + 1, item)));
            }
            d => out.push((i + 1, d)),
        }
    }
    Ok(out)
}

/// [`documents`], each namespaced object written without a namespace placed in
/// `namespace`, whatever its kind, as `kubectl apply -n` places it: the one reader of every
/// input (the files reviewed, `--cluster-state`), so that a TrainingRuntime and the
/// TrainJob beside it, or a claim template and its pod, meet in one namespace.
pub fn read(text: &str, namespace: &str) -> Result<Vec<Value>, String> {
    let mut docs = documents(text)?;
    for d in &mut docs {
        place_namespace(d, namespace);
    }
    Ok(docs)
}

/// The kinds whose objects have no namespace (those a cluster serves that a review may
/// meet; any other kind is namespaced, as a custom resource usually is).
const CLUSTER_SCOPED: &[&str] = &[
    "APIService",
    "CSIDriver",
    "CSINode",
    "ClusterQueue",
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterTrainingRuntime",
    "Cohort",
    "CustomResourceDefinition",
    "DeviceClass",
    "IngressClass",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "MutatingWebhookConfiguration",
    "Namespace",
    "Node",
    "PersistentVolume",
    "PriorityClass",
    "ResourceFlavor",
    "ResourceSlice",
    "RuntimeClass",
    "StorageClass",
    "TollgatePolicy",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration",
    "VolumeAttachment",
    "WorkloadPriorityClass",
];

/// Puts a namespaced object written without a namespace in `namespace`.
fn place_namespace(doc: &mut Value, namespace: &str) {
    let Some(kind) = doc.get("kind").and_then(Value::as_str) else {
        return;
    };
    if kind == "AdmissionReview" || CLUSTER_SCOPED.contains(&kind) {
        return;
    }
    place_in_namespace(doc, namespace);
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

/// Adds `doc` to `context` if it is a context object (a ResourceClaim or
/// ResourceClaimTemplate of any served `resource.k8s.io` version, read as v1, a Namespace,
/// a Node, a ResourceQuota, a DeviceClass, a Trainer runtime, a Kueue LocalQueue or
/// ClusterQueue, the Cluster Autoscaler's status ConfigMap or a Karpenter NodePool); false
/// if it is another kind. An object is taken in the namespace it has
/// ([`read`] placed those written without one); a Namespace gets the name label the
/// apiserver sets on every namespace. With one Node,
/// quota or DeviceClass, the context knows them all: those it holds, none elsewhere.
pub fn add_context(context: &mut Objects, doc: &Value) -> Result<bool, String> {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
    let api = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let dra = DRA_API_VERSIONS.contains(&api);
    let device_class = matches!(
        api,
        "resource.k8s.io/v1" | "resource.k8s.io/v1beta2" | "resource.k8s.io/v1beta1"
    );
    match (kind, api) {
        ("ResourceClaim", _) if dra => context.add_claim(claim_from(doc)?),
        ("Node", "v1") => {
            context.add_node(serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?)
        }
        ("ResourceQuota", "v1") => {
            context.add_quota(serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?)
        }
        ("DeviceClass", _) if device_class => context.add_device_class(
            doc.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        ),
        ("ResourceClaimTemplate", _) if dra => context.add_template(claim_template_from(doc)?),
        ("Namespace", "v1") => {
            let mut ns: Namespace =
                serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
            let name = ns.metadata.name.clone().unwrap_or_default();
            ns.metadata
                .labels
                .get_or_insert_with(Default::default)
                .entry(NAME_LABEL.into())
                .or_insert(name);
            context.add_namespace(ns)
        }
        // The queues a workload labelled for Kueue is admitted through, read as JSON.
        ("LocalQueue", _) if KUEUE_API_VERSIONS.contains(&api) => {
            return Ok(context.add_kueue_queue(doc.clone()));
        }
        ("ClusterQueue", _) if KUEUE_API_VERSIONS.contains(&api) => {
            return Ok(context.add_kueue_queue(doc.clone()));
        }
        // What may add nodes: the Cluster Autoscaler's status ConfigMap (another ConfigMap is
        // not context) and Karpenter's NodePools, read as JSON.
        ("ConfigMap", "v1") | ("NodePool", KARPENTER_NODEPOOL_API_VERSION) => {
            return Ok(context.add_autoscaling(doc.clone()));
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
pub(super) const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// An input's documents: what is reviewed (and what is not), and the cluster context it
/// is reviewed in.
pub struct Input {
    /// Every object that is not context (and the Trainer runtimes, which are both), in
    /// input order.
    pub entries: Vec<Entered>,
    pub context: Objects,
    /// The context objects (the runtimes aside): what an input of context alone lists.
    pub context_only: Vec<Entered>,
}

impl Skipped {
    /// `doc`, not reviewed for `reason`; in `namespace` where it names none.
    fn of(doc: &Value, reason: String, namespace: &str) -> Skipped {
        let field = |p: &str| doc.pointer(p).and_then(Value::as_str);
        Skipped {
            reason,
            kind: field("/kind").unwrap_or("").to_owned(),
            api_version: field("/apiVersion").unwrap_or("").to_owned(),
            namespace: field("/metadata/namespace").unwrap_or(namespace).to_owned(),
            name: field("/metadata/name").unwrap_or("").to_owned(),
        }
    }

    /// What is not an object at all (a values file), left out for `reason`.
    fn unnamed(reason: String) -> Skipped {
        Skipped {
            kind: String::new(),
            api_version: String::new(),
            namespace: String::new(),
            name: String::new(),
            reason,
        }
    }
}

/// A Kubeflow Trainer TrainingRuntime or ClusterTrainingRuntime.
fn is_runtime(api: &str, kind: &str) -> bool {
    api.starts_with("trainer.kubeflow.org/")
        && matches!(kind, "TrainingRuntime" | "ClusterTrainingRuntime")
}

/// One object of the input and where it came from.
pub struct Entered {
    /// The file it was read from (`standard input` for `-`, `kustomize DIR` for `-k`).
    pub file: String,
    /// Its number in the file, from 1 (None: the whole file, which could not be read).
    pub document: Option<usize>,
    pub what: Entry,
}

impl Entered {
    /// A document left out for `why`: not a Kubernetes object.
    fn skipped(d: &Document, why: String) -> Entered {
        Entered {
            file: d.file.clone(),
            document: Some(d.number),
            what: Entry::Skipped(Skipped::unnamed(why)),
        }
    }

    /// `a.yaml: document 3`, or the file.
    fn place(&self) -> String {
        match self.document {
            Some(n) => format!("{}: document {n}", self.file),
            None => self.file.clone(),
        }
    }
}

/// An object to review, or one tollgate does not review.
pub enum Entry {
    Subject(Value),
    Skipped(Skipped),
}

/// An object that is neither reviewed nor context: what it is, and why it is not reviewed.
#[derive(Debug, Clone)]
pub struct Skipped {
    pub kind: String,
    pub api_version: String,
    pub namespace: String,
    pub name: String,
    pub reason: String,
}

/// Sorts documents (each numbered in the file it came from) into subjects (Pods, the
/// workloads `policy` lists, AdmissionReviews), context (claims, claim templates,
/// namespaces; a claim without a namespace in `namespace`) and objects not reviewed. A
/// context object that cannot be read, or a Pod or built-in workload the apiserver could
/// not decode, is an error naming its file and document.
pub fn split(docs: Vec<Document>, policy: &Policy, namespace: &str) -> Result<Input, String> {
    let mut input = Input {
        entries: vec![],
        context: Objects::complete(),
        context_only: vec![],
    };
    for doc in docs {
        let place = doc.place();
        let Document {
            file,
            number,
            value: d,
        } = doc;
        let kind = d
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let api = d
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let what = match kind.as_str() {
            "Pod" | "AdmissionReview" => {
                decodes(&d, &api, &kind).map_err(|e| format!("{place}: {e}"))?;
                Entry::Subject(d)
            }
            _ if add_context(&mut input.context, &d)
                .map_err(|e| format!("{place}: a {kind} ({api}): {e}"))? =>
            {
                // A Trainer runtime is context for the TrainJobs beside it, and judged
                // itself: what no TrainJob on it can supply.
                if is_runtime(&api, &kind) {
                    Entry::Subject(d)
                } else {
                    input.context_only.push(Entered {
                        file,
                        document: Some(number),
                        what: Entry::Skipped(Skipped::of(
                            &d,
                            "cluster context: what the objects reviewed beside it are judged against".into(),
                            "",
                        )),
                    });
                    continue;
                }
            }
            k if is_workload(policy, &api, k, &d) => {
                decodes(&d, &api, k).map_err(|e| format!("{place}: {e}"))?;
                Entry::Subject(d)
            }
            k => Entry::Skipped(Skipped::of(&d, not_reviewed(policy, &api, k), namespace)),
        };
        input.entries.push(Entered {
            file,
            document: Some(number),
            what,
        });
    }
    Ok(input)
}

/// Why tollgate does not review an object of this kind, in the user's words.
fn not_reviewed(policy: &Policy, api: &str, kind: &str) -> String {
    let listed: Vec<String> = policy
        .workloads
        .kinds
        .iter()
        .filter(|k| k.kind == kind)
        .map(|k| {
            if k.group.is_empty() {
                k.version.clone()
            } else {
                format!("{}/{}", k.group, k.version)
            }
        })
        .collect();
    if listed.is_empty() {
        "tollgate reviews Pods, AdmissionReviews and the workloads its policy lists (workloads.kinds)".into()
    } else {
        format!(
            "its policy lists {kind} as {}, not {api}",
            listed.join(" and ")
        )
    }
}

/// Whether the apiserver could decode `doc` as its kind, for the kinds whose types it has
/// built in (a Pod and the `batch` and `apps` workloads): where it could not, kubectl
/// applies nothing of it and prints the apiserver's kind of error, naming the field; so
/// does `review`, as unusable input, rather than judge what the apiserver would never see.
fn decodes(doc: &Value, api: &str, kind: &str) -> Result<(), String> {
    use k8s_openapi::api::{apps::v1 as apps, batch::v1 as batch, core::v1 as core};
    fn typed<T: serde::de::DeserializeOwned>(doc: &Value) -> Result<(), String> {
        serde_path_to_error::deserialize::<_, T>(doc.clone())
            .map(drop)
            .map_err(|e| format!("{}: {}", e.path(), e.inner()))
    }
    let checked = match (api, kind) {
        ("v1", "Pod") => typed::<core::Pod>(doc),
        ("batch/v1", "Job") => typed::<batch::Job>(doc),
        ("batch/v1", "CronJob") => typed::<batch::CronJob>(doc),
        ("apps/v1", "Deployment") => typed::<apps::Deployment>(doc),
        ("apps/v1", "StatefulSet") => typed::<apps::StatefulSet>(doc),
        ("apps/v1", "ReplicaSet") => typed::<apps::ReplicaSet>(doc),
        ("apps/v1", "DaemonSet") => typed::<apps::DaemonSet>(doc),
        _ => Ok(()),
    };
    checked.map_err(|e| {
        let name = doc
            .pointer("/metadata/name")
            .or_else(|| doc.pointer("/metadata/generateName"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let (_, version) = group_version(api);
        format!("{kind} {name:?} in version {version:?} cannot be handled as a {kind}: {e}")
    })
}

/// Whether tollgate judges `doc` as a workload: a kind the policy lists, or one its
/// namespace's TollgateProfile adds (a profile may judge more kinds, over the base or over
/// a cluster profile its pods may get).
fn is_workload(policy: &Policy, api: &str, kind: &str, doc: &Value) -> bool {
    let (group, version) = group_version(api);
    let lists = |p: &Policy| p.workloads.kind(group, version, kind).is_some();
    if lists(policy) {
        return true;
    }
    let namespace = doc
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    policy
        .layers
        .namespaces
        .get(namespace)
        .is_some_and(|n| n.policies().any(lists))
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
    /// The object's kind and apiVersion (for an AdmissionReview, its request's).
    pub kind: String,
    pub api_version: String,
    pub namespace: String,
    pub name: String,
    /// Why the validating webhook decided as it did (`missing_requests`, `infeasible`,
    /// ...), as the metrics name it; None where it did not judge.
    pub verdict: Option<&'static str>,
    pub steps: Vec<&'static str>,
    /// The policy profile applied; None: the base policy.
    pub profile: Option<String>,
    /// For a workload: its kind (`Job`), and what became of each of its pod templates.
    pub workload: Option<String>,
    pub templates: Vec<TemplateVerdict>,
    /// The file it came from and its document there, when the input was several files or
    /// a directory.
    pub file: Option<String>,
    pub document: Option<usize>,
    /// An object not reviewed, and why.
    pub skipped: Option<Skipped>,
    /// A TollgatePolicy or TollgateProfile: what became of it (in force, or why not).
    pub policy_object: Option<ObjectStatus>,
    /// For a built-in workload: what the apiserver's own validation refuses in its pod
    /// templates as mutated, each at the field the apiserver names.
    pub invalid: Vec<FieldError>,
}

impl CliResult {
    /// The result of an object tollgate does not review: it changes nothing about the exit
    /// status.
    pub fn skipped(s: &Skipped) -> CliResult {
        CliResult {
            allowed: true,
            message: None,
            warnings: vec![],
            patch: None,
            mutated: None,
            mutate_response: None,
            validate_response: None,
            kind: s.kind.clone(),
            api_version: s.api_version.clone(),
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            verdict: None,
            steps: vec![],
            profile: None,
            workload: None,
            templates: vec![],
            file: None,
            document: None,
            skipped: Some(s.clone()),
            policy_object: None,
            invalid: vec![],
        }
    }

    /// A TollgatePolicy or TollgateProfile composed with the policy: allowed when it is in
    /// force, denied (as the validating webhook would deny it) when it is not, in its
    /// status's words (the object, the field, the bound).
    pub fn policy_object(s: &ObjectStatus) -> CliResult {
        let mut r = CliResult::skipped(&Skipped {
            kind: String::new(),
            api_version: String::new(),
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            reason: String::new(),
        });
        r.skipped = None;
        r.allowed = s.ready;
        r.message = (!s.ready).then(|| s.message.clone());
        r.policy_object = Some(s.clone());
        r
    }

    pub fn to_json(&self) -> Value {
        let mut v = self.json();
        if let (Some(file), Value::Object(m)) = (&self.file, &mut v) {
            m.insert("file".into(), Value::from(file.as_str()));
            if let Some(n) = self.document {
                m.insert("document".into(), Value::from(n));
            }
        }
        v
    }

    fn json(&self) -> Value {
        if let Some(s) = &self.policy_object {
            let mut v = objects::status_json(s);
            if let Value::Object(m) = &mut v {
                m.insert(
                    "decision".into(),
                    Value::from(if s.ready { "allowed" } else { "denied" }),
                );
                m.insert("allowed".into(), Value::from(s.ready));
            }
            return v;
        }
        if let Some(s) = &self.skipped {
            return json!({
                "decision": "skipped",
                "allowed": true,
                "kind": s.kind,
                "apiVersion": s.api_version,
                "namespace": s.namespace,
                "name": s.name,
                "reason": s.reason,
            });
        }
        let Some(kind) = &self.workload else {
            return json!({
                "decision": if self.allowed { "allowed" } else { "denied" },
                "allowed": self.allowed,
                "kind": self.kind,
                "apiVersion": self.api_version,
                "namespace": self.namespace,
                "name": self.name,
                "verdict": self.verdict,
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
        let invalid: Vec<Value> = self
            .invalid
            .iter()
            .map(|e| json!({"field": e.field, "detail": e.detail}))
            .collect();
        json!({
            "decision": if self.allowed { "allowed" } else { "denied" },
            "allowed": self.allowed,
            "kind": kind,
            "apiVersion": self.api_version,
            "namespace": self.namespace,
            "name": self.name,
            "verdict": self.verdict,
            "templates": templates,
            "invalid": invalid,
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
        let from = self
            .file
            .as_deref()
            .map(|f| format!("{f}: "))
            .unwrap_or_default();
        if let Some(s) = &self.policy_object {
            let object = s.source().to_ascii_lowercase();
            if s.ready {
                return format!("{from}{object}: {}\n", s.message);
            }
            return format!("{from}{object}: denied\n\n{}\n", s.message);
        }
        if let Some(s) = &self.skipped {
            if s.kind.is_empty() {
                // Not an object: only its place names it.
                let document = self
                    .document
                    .map(|n| format!("document {n}: "))
                    .unwrap_or_default();
                return format!("{from}{document}skipped: {}\n", s.reason);
            }
            return format!(
                "{from}{} {}/{} ({}): not reviewed: {}\n",
                kind_noun(&s.api_version, &s.kind),
                s.namespace,
                s.name,
                s.api_version,
                s.reason
            );
        }
        let noun = kind_noun(&self.api_version, &self.kind);
        // A workload refused though each of its templates is allowed was refused by
        // feasibility (its pods can never run here), not by what its templates lack: said so
        // where the decision is.
        let decision = match (self.allowed, self.verdict) {
            (true, _) => "allowed",
            (false, Some("infeasible")) => "denied by feasibility: its pods could never run here",
            (false, _) => "denied",
        };
        let mut out = format!("{from}{noun} {}/{}: {decision}", self.namespace, self.name);
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
        // Shown only when the mutating webhook changed it (a workload is only ever changed
        // in its opt-out approval).
        let changed = self.patch.as_ref().is_some_and(|p| !p.0.is_empty());
        if let Some(m) = self.mutated.as_ref().filter(|_| changed) {
            out.push_str(&format!("\n{noun} as mutated:\n"));
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
        k if is_workload(policy, api, k, value) || is_runtime(api, k) => {
            synthetic_review(value, a.namespace.as_deref(), &a.user, &a.groups)
        }
        "" => return Err("no kind: expected a Pod, a workload or an AdmissionReview".into()),
        k => {
            return Err(format!(
                "a {k}: expected a Pod, a workload or an AdmissionReview"
            ))
        }
    };
    let judged = run_pipeline(policy, cluster, &review, a.stage).map_err(|e| e.to_string())?;
    let mut result = CliResult::of(judged);
    // What the object is: its own kind, or the kind the AdmissionReview's request names.
    let (kind, api_version) = match value.pointer("/request/kind") {
        Some(k) if kind == "AdmissionReview" => {
            let field = |f: &str| k.get(f).and_then(Value::as_str).unwrap_or("");
            let version = match field("group") {
                "" => field("version").to_owned(),
                g => format!("{g}/{}", field("version")),
            };
            (field("kind").to_owned(), version)
        }
        _ => (kind.to_owned(), api.to_owned()),
    };
    result.kind = kind;
    result.api_version = api_version;
    Ok(result)
}

impl CliResult {
    /// What the command shows of the pipeline's judgement.
    fn of(mut judged: Judged) -> CliResult {
        let mut result = CliResult {
            allowed: judged.allowed,
            message: judged.message.clone(),
            warnings: judged.warnings().cloned().collect(),
            patch: None,
            mutated: judged.mutated.take(),
            mutate_response: None,
            validate_response: None,
            kind: String::new(),
            api_version: String::new(),
            namespace: String::new(),
            name: String::new(),
            verdict: None,
            steps: vec![],
            profile: None,
            workload: None,
            templates: vec![],
            file: None,
            document: None,
            skipped: None,
            policy_object: None,
            invalid: std::mem::take(&mut judged.invalid),
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
            result.verdict = r.verdict().map(|v| v.as_str());
            result.templates = r.templates().to_vec();
        }
        result
    }
}

fn response_value(r: &Reviewed) -> Value {
    serde_json::from_slice(&r.to_json()).unwrap_or(Value::Null)
}

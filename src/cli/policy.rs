//! `tollgate policy`: the policy in force for a namespace's pods, value by value, and where
//! each value came from (the built-in policy, the file, the TollgatePolicy, a cluster
//! profile, the namespace's TollgateProfile). The engine says where (`objects::explain`);
//! this reads the files and prints.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde_json::{json, Value};

use super::kubectl::{ClusterFlags, Manifests};
use super::objects::{self, ObjectsFrom, PolicyObjects};
use tollgate_core::{
    explain_policy, select_profile, Explained, Leaf, Objects, PodLabels, Policy, ValueSource,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The policy as YAML, each value with a `# from:` comment.
    Yaml,
    /// One line a value: path, value, source.
    Table,
    /// One JSON object: the layers, each value with its source, the objects' statuses.
    Json,
}

#[derive(Args, Debug)]
pub struct PolicyArgs {
    /// Policy file (YAML) [default: the built-in policy, a copy of policies/default.yaml].
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// The TollgatePolicy and TollgateProfiles to compose with it (-f, -k): such as the
    /// output of `kubectl get tollgatepolicies,tollgateprofiles -A -o yaml` (a later object
    /// replaces an earlier one of the same name). Other objects in them are left out.
    #[command(flatten)]
    pub manifests: Manifests,
    /// The namespace whose pods' policy to show, with its TollgateProfile, if any
    /// [default: the cluster's policy, as a namespace without a TollgateProfile gets it].
    /// A TollgateProfile written without a namespace is in this one, else in "default".
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// The cluster profile (the policy's `profiles`) to show the policy of [default: the
    /// one the pods of --namespace with --pod-labels and --namespace-labels get, else the
    /// base].
    #[arg(long, conflicts_with_all = ["pod_labels", "namespace_labels"])]
    pub profile: Option<String>,
    /// The labels of the pods, for the cluster profiles that match on them: `k=v,k2=v2`.
    #[arg(long, value_parser = super::review::parse_labels, value_name = "LABELS")]
    pub pod_labels: Option<BTreeMap<String, String>>,
    /// The labels of --namespace, for the cluster profiles that match on them (its name
    /// label is always set, as the apiserver sets it).
    #[arg(long, value_parser = super::review::parse_labels, value_name = "LABELS", requires = "namespace")]
    pub namespace_labels: Option<BTreeMap<String, String>>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Yaml)]
    pub output: Format,
    /// The cluster whose TollgatePolicy and TollgateProfiles to show the policy with (read
    /// when a kubeconfig is found; those given with -f replace them by name).
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// Read no cluster: the file and the objects given with -f alone (as without a
    /// kubeconfig).
    #[arg(long)]
    pub local: bool,
}

/// Why `policy` showed nothing.
enum Unshown {
    /// The one line to show; exit 2.
    Input(String),
    /// The cluster's TollgatePolicy may not be read; exit 3.
    Unreadable(String),
}

impl From<String> for Unshown {
    fn from(s: String) -> Unshown {
        Unshown::Input(s)
    }
}

/// Runs `tollgate policy`; the exit status: 0 shown, 1 shown but an object given does not
/// load (it is not applied, as the server would not apply it; its status is on standard
/// error), 2 unusable input (the file, an object file, a profile that does not exist, the
/// cluster unreachable), 3 the cluster's TollgatePolicy may not be read
/// ([`objects::UNREADABLE_POLICY`]).
pub fn run(a: &PolicyArgs) -> i32 {
    match show(a) {
        Ok((text, statuses_ok)) => {
            if !super::kubectl::print(&text) {
                return 2;
            }
            if statuses_ok {
                0
            } else {
                1
            }
        }
        Err(Unshown::Input(e)) => {
            eprintln!("tollgate: {e}");
            2
        }
        Err(Unshown::Unreadable(e)) => {
            eprintln!("tollgate: {e}");
            objects::UNREADABLE_POLICY
        }
    }
}

/// What the cluster says the user can read: the TollgatePolicy and the TollgateProfile
/// of `namespace` (with -n), under `given`'s (the files given replace them by name).
fn live_objects(a: &PolicyArgs, given: PolicyObjects) -> Result<(PolicyObjects, String), Unshown> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let config = a
            .cluster
            .config("pass --local to show the policy of the files alone")
            .await
            .map_err(|e| format!("{e:#}"))?;
        let url = config.cluster_url.to_string();
        let client = kube::Client::try_from(config)
            .map_err(|e| format!("creating a client for the API server at {url}: {e}"))?;
        // Without -n: the cluster's policy, as a namespace without a profile gets it (the
        // profiles listed are left out).
        let scope = match &a.namespace {
            Some(ns) => crate::audit::Namespaces::One(ns.clone()),
            None => crate::audit::Namespaces::All,
        };
        let (mut found, unread) = objects::from_cluster(client, &url, &scope).await?;
        if let Some(line) = objects::unreadable_policy(&unread, &given, true) {
            return Err(Unshown::Unreadable(line));
        }
        if a.namespace.is_none() {
            found.profiles.clear();
        } else {
            for u in unread.iter().filter(|u| u.kind != tollgate_core::POLICY_KIND) {
                eprintln!(
                    "tollgate: shown without the namespace's TollgateProfile, which you may not read: {}",
                    u.why
                );
            }
        }
        found.overlay(given);
        Ok((found, url))
    })
}

fn show(a: &PolicyArgs) -> Result<(String, bool), Unshown> {
    let file = objects::file_layer(a.policy.as_deref())?;
    let given = read_objects(&a.manifests, a.namespace.as_deref())?;
    let (found, from) = if a.local || !a.cluster.found() {
        (given, ObjectsFrom::Files)
    } else {
        let (found, url) = live_objects(a, given)?;
        (found, ObjectsFrom::Cluster(url))
    };
    let composed = objects::compose(file.as_ref(), &found)?;
    for s in composed.statuses.iter().filter(|s| !s.ready) {
        let origin = found.origin(s).unwrap_or("the cluster");
        eprintln!("tollgate: {origin}: {}", s.message);
    }
    let all_ready = composed.statuses.iter().all(|s| s.ready);
    let policy = &composed.policy;
    let chosen = match &a.profile {
        Some(p) => Some(p.clone()),
        None => a
            .namespace
            .as_deref()
            .and_then(|ns| cluster_profile(policy, ns, a)),
    };
    let explained = explain_policy(policy, a.namespace.as_deref(), chosen.as_deref())
        .map_err(|e| e.to_string())?;
    let text = match a.output {
        Format::Json => {
            let mut s =
                serde_json::to_string_pretty(&to_json(&explained, a, &composed.statuses, &from))
                    .unwrap_or_default();
            s.push('\n');
            s
        }
        Format::Yaml => header(&explained, a, &from) + &tree(&explained.leaves),
        Format::Table => header(&explained, a, &from) + &table(&explained.leaves),
    };
    Ok((text, all_ready))
}

/// The TollgatePolicy and TollgateProfiles of `files` (each a file or a directory), a
/// profile without a namespace in `namespace`, else `default`; what else they hold is
/// left out, and said so on standard error.
pub(super) fn read_objects(
    manifests: &Manifests,
    namespace: Option<&str>,
) -> Result<PolicyObjects, String> {
    let default_ns = namespace.unwrap_or("default");
    let mut found = PolicyObjects::default();
    let mut left_out = 0;
    for t in manifests.texts(&[])? {
        let docs = super::review::read(&t.text, default_ns).map_err(|e| format!("{}: {e}", t.name));
        for d in docs? {
            if !found.add(&t.name, &d) {
                left_out += 1;
            }
        }
    }
    if left_out > 0 {
        eprintln!(
            "tollgate: {left_out} object(s) that are neither a TollgatePolicy nor a TollgateProfile (tollgate.dev/v1alpha1) left out"
        );
    }
    Ok(found)
}

/// The cluster profile the pods of `namespace` with the labels given get, as the webhook
/// chooses it (`select_profile`), over the policy without the namespaces' profiles (whose
/// names would say which layer, not which cluster profile).
fn cluster_profile(policy: &Policy, namespace: &str, a: &PolicyArgs) -> Option<String> {
    let mut bare = policy.clone();
    bare.layers.namespaces.clear();
    let mut labels = a.namespace_labels.clone().unwrap_or_default();
    labels.insert(super::review::NAME_LABEL.into(), namespace.to_owned());
    let mut ns = k8s_openapi::api::core::v1::Namespace::default();
    ns.metadata.name = Some(namespace.to_owned());
    ns.metadata.labels = Some(labels);
    let mut cluster = Objects::complete();
    cluster.add_namespace(ns);
    let selected = select_profile(
        &bare,
        namespace,
        PodLabels::Parsed(a.pod_labels.as_ref()),
        &cluster,
    );
    selected.profile.map(str::to_owned)
}

/// What the text forms open with: which pods, which policy, its layers, and the cluster
/// its objects were read from, when one was.
fn header(e: &Explained, a: &PolicyArgs, from: &ObjectsFrom) -> String {
    let pods = match &a.namespace {
        Some(ns) => format!("the pods of namespace {ns}"),
        None => "the pods of a namespace without a TollgateProfile".to_owned(),
    };
    let layers: Vec<String> = e.layers.iter().map(ToString::to_string).collect();
    let mut out = format!(
        "# The policy in force for {pods}: {}.\n# Layers, each over the one before: {}.\n",
        e.name,
        layers.join(", ")
    );
    if let ObjectsFrom::Cluster(url) = from {
        let given = if a.manifests.is_empty(&[]) {
            ""
        } else {
            " (those given with -f in their place)"
        };
        out.push_str(&format!(
            "# The TollgatePolicy and TollgateProfiles as the cluster at {url} holds them{given}.\n"
        ));
    }
    out
}

/// A value on one line where it fits (a scalar, a list of scalars, an empty map), as JSON,
/// which YAML reads too.
fn inline(v: &Value) -> Option<String> {
    let flat = match v {
        Value::Array(items) => items.iter().all(|i| !i.is_object() && !i.is_array()),
        Value::Object(m) => m.is_empty(),
        _ => true,
    };
    flat.then(|| serde_json::to_string(v).unwrap_or_default())
}

/// A key as YAML writes it: plain where it can be, else quoted.
fn key(k: &str) -> String {
    let plain = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '/' | '-' | '_'));
    if plain {
        k.to_owned()
    } else {
        serde_json::to_string(k).unwrap_or_default()
    }
}

/// The policy as YAML, each value followed by where it came from.
fn tree(leaves: &[Leaf]) -> String {
    let mut out = String::new();
    let mut open: Vec<String> = vec![];
    for leaf in leaves {
        let (last, parent) = leaf.path.split_last().expect("a value has a key");
        let common = open.iter().zip(parent).take_while(|(x, y)| x == y).count();
        for (depth, k) in parent.iter().enumerate().skip(common) {
            out.push_str(&format!("{}{}:\n", "  ".repeat(depth), key(k)));
        }
        open = parent.to_vec();
        let indent = "  ".repeat(parent.len());
        let from = format!("# from: {}", leaf.source);
        match inline(&leaf.value) {
            Some(v) => out.push_str(&format!("{indent}{}: {v}  {from}\n", key(last))),
            None => {
                out.push_str(&format!("{indent}{}:  {from}\n", key(last)));
                let yaml = serde_saphyr::to_string(&leaf.value).unwrap_or_default();
                for line in yaml.lines() {
                    out.push_str(&format!("{indent}  {line}\n"));
                }
            }
        }
    }
    out
}

/// `path  value  source`, one line a value.
fn table(leaves: &[Leaf]) -> String {
    let rows: Vec<(String, String, String)> = leaves
        .iter()
        .map(|l| {
            (
                l.dotted(),
                serde_json::to_string(&l.value).unwrap_or_default(),
                l.source.to_string(),
            )
        })
        .collect();
    let width = |f: fn(&(String, String, String)) -> usize, cap: usize| {
        rows.iter().map(f).max().unwrap_or(0).clamp(5, cap)
    };
    let (pw, vw) = (width(|r| r.0.len(), 60), width(|r| r.1.len(), 40));
    let mut out = format!("{:pw$}  {:vw$}  SOURCE\n", "PATH", "VALUE");
    for (p, v, s) in rows {
        out.push_str(&format!("{p:pw$}  {v:vw$}  {s}\n"));
    }
    out
}

fn to_json(
    e: &Explained,
    a: &PolicyArgs,
    statuses: &[tollgate_core::ObjectStatus],
    from: &ObjectsFrom,
) -> Value {
    let source = |s: &ValueSource| json!({"kind": s.kind(), "name": s.to_string()});
    json!({
        "namespace": a.namespace,
        "objectsFrom": match from {
            ObjectsFrom::Cluster(url) => json!({"cluster": url}),
            ObjectsFrom::Files => json!({"cluster": null}),
        },
        "policy": e.name,
        "layers": e.layers.iter().map(source).collect::<Vec<_>>(),
        "values": e.leaves.iter().map(|l| json!({
            "path": l.dotted(),
            "keys": l.path,
            "value": l.value,
            "source": source(&l.source),
        })).collect::<Vec<_>>(),
        "objects": statuses.iter().map(objects::status_json).collect::<Vec<_>>(),
    })
}

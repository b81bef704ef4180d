//! `tollgate why KIND/NAME`: why a pod or job has not started (or what was done to it), in
//! one answer from the live cluster, for the person who made it. What it joins, each from
//! where the component that decided wrote it:
//!
//! - what tollgate changed (its applied annotation on the pods) and which layer of the
//!   policy in force sets each step's values (the built-in policy, the file, the
//!   TollgatePolicy, a cluster profile, the namespace's TollgateProfile: `explain_policy`);
//! - what tollgate would refuse or warn of it now, and its feasibility verdict: the object
//!   re-judged as a CREATE through the engine's front door (`audit_object`), with the
//!   cluster's policy objects and the cluster context the audit reads;
//! - the events of the object and of its pods and Jobs: the controller's `FailedCreate`
//!   (Pod Security, a ResourceQuota or a webhook refusing the pods it would make, in their
//!   words), the scheduler's `FailedScheduling`;
//! - Kueue's Workloads owned by it (or by its Jobs): their conditions (QuotaReserved,
//!   Admitted, Evicted) with reasons;
//! - the scheduler's verdict on each pod not yet bound (`PodScheduled`).
//!
//! Everything is read as the user: what they may not read is said ("could not read X:
//! forbidden") and the rest answered; only the object itself is needed.

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::Api;
use serde_json::{json, Value};

use super::kubectl::ClusterFlags;
use super::objects::{self, PolicyObjects};
use crate::audit::{Auditor, Namespaces};
use tollgate_core::{
    explain_policy, start_failures, Audited, FindingStatus, PodEvent, Policy, Rule, Step,
    KUEUE_API_VERSIONS, POLICY_KIND,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Sentences for a person.
    Text,
    /// One JSON object: the object, tollgate's part, events, Kueue's Workloads, pods.
    Json,
    /// The JSON object as YAML.
    Yaml,
}

#[derive(Args, Debug)]
pub struct WhyArgs {
    /// The object, as kubectl names one: `KIND/NAME` or `KIND NAME` (pod, po, job,
    /// pytorchjob, job.batch.volcano.sh, ...: pods and the workload kinds the policy
    /// judges).
    #[arg(value_name = "KIND/NAME", num_args = 1..=2, required = true)]
    pub object: Vec<String>,
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// The object's namespace [default: the kubeconfig context's namespace].
    #[arg(short = 'n', long, value_name = "NS")]
    pub namespace: Option<String>,
    /// The policy file the server runs with [default: the built-in policy]; the cluster's
    /// TollgatePolicy and the namespace's TollgateProfile are composed over it.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

/// Runs `tollgate why`; the exit status: 0 answered, 1 the object could not be read (not
/// found, forbidden), 2 unusable input (the kind, the policy file, no kubeconfig, the API
/// server unreachable).
pub fn run(a: &WhyArgs) -> i32 {
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
    match runtime.block_on(why(a)) {
        Ok(answer) => {
            let text = match a.output {
                Format::Text => text(&answer),
                Format::Json => {
                    let mut s = serde_json::to_string_pretty(&answer).unwrap_or_default();
                    s.push('\n');
                    s
                }
                Format::Yaml => serde_saphyr::to_string(&answer).unwrap_or_default(),
            };
            if super::kubectl::print(&text) {
                0
            } else {
                2
            }
        }
        Err(Unanswered::Object(e)) => {
            eprintln!("tollgate: {e}");
            1
        }
        Err(Unanswered::Input(e)) => {
            eprintln!("tollgate: {e}");
            2
        }
    }
}

/// Why there is no answer.
enum Unanswered {
    /// The object could not be read: the one line.
    Object(String),
    /// Unusable input, or no cluster: the one line.
    Input(String),
}

impl From<String> for Unanswered {
    fn from(s: String) -> Unanswered {
        Unanswered::Input(s)
    }
}

/// `KIND/NAME` or `KIND NAME`, split.
fn kind_and_name(words: &[String]) -> Result<(String, String), String> {
    match words {
        [one] => match one.split_once('/') {
            Some((k, n)) if !k.is_empty() && !n.is_empty() && !n.contains('/') => {
                Ok((k.to_owned(), n.to_owned()))
            }
            _ => Err(format!(
                "{one:?}: name the object as KIND/NAME or KIND NAME (pod/train-0, job train)"
            )),
        },
        [k, n] if !k.contains('/') && !n.contains('/') => Ok((k.clone(), n.clone())),
        _ => Err("name the object as KIND/NAME or KIND NAME (pod/train-0, job train)".into()),
    }
}

/// kubectl's short names of the built-in kinds the policy may list.
const SHORT_NAMES: &[(&str, &str)] = &[
    ("Pod", "po"),
    ("Deployment", "deploy"),
    ("StatefulSet", "sts"),
    ("ReplicaSet", "rs"),
    ("DaemonSet", "ds"),
    ("CronJob", "cj"),
];

/// The resource `kind` names among `kinds` (pods and the policy's workload kinds), as
/// kubectl resolves a name: its kind, plural or short name, lower-cased, optionally with its
/// group after a dot (`job.batch.volcano.sh`, `pytorchjob.kubeflow.org`); where two
/// share a name, the first (the built-in kinds come first, as kubectl prefers them).
pub fn resolve(kind: &str, kinds: &[ApiResource]) -> Option<ApiResource> {
    let lower = kind.to_ascii_lowercase();
    let (name, group) = match lower.split_once('.') {
        Some((n, g)) => (n.to_owned(), Some(g.to_owned())),
        None => (lower.clone(), None),
    };
    kinds
        .iter()
        .find(|r| {
            let k = r.kind.to_ascii_lowercase();
            let short = SHORT_NAMES
                .iter()
                .find(|(kind, _)| *kind == r.kind && r.group_is_builtin())
                .map(|(_, s)| *s);
            let named = name == k || name == r.plural || Some(name.as_str()) == short;
            let grouped = match &group {
                None => true,
                Some(g) => {
                    *g == r.group
                        || (r.group.is_empty() && g.is_empty())
                        || format!("{}.{}", r.version, r.group) == *g
                }
            };
            named && grouped
        })
        .cloned()
}

/// Whether a resource is one of Kubernetes' own (core, apps, batch): kubectl's short names
/// are theirs.
trait Builtin {
    fn group_is_builtin(&self) -> bool;
}

impl Builtin for ApiResource {
    fn group_is_builtin(&self) -> bool {
        matches!(self.group.as_str(), "" | "apps" | "batch")
    }
}

/// What the user could not read, said where the answer would have had it.
#[derive(Default)]
struct Unread(Vec<String>);

impl Unread {
    /// Notes a failed read of `what`; Err for what ends the command (unreachable).
    fn note(&mut self, what: &str, e: kube::Error) -> Result<(), String> {
        match &e {
            kube::Error::Api(s) if s.code == 403 => {
                self.0.push(format!("could not read {what}: forbidden"));
                Ok(())
            }
            kube::Error::Api(s) if s.code == 404 => Ok(()),
            kube::Error::Api(_) => {
                self.0.push(format!(
                    "could not read {what}: {}",
                    crate::kubeconfig::words(&e)
                ));
                Ok(())
            }
            _ => Err(format!("reading {what}: {}", crate::kubeconfig::words(&e))),
        }
    }
}

async fn why(a: &WhyArgs) -> Result<Value, Unanswered> {
    let (kind, name) = kind_and_name(&a.object)?;
    let file = objects::file_layer(a.policy.as_deref())?;
    // A file that does not load is unusable before the cluster is asked anything.
    objects::compose(file.as_ref(), &PolicyObjects::default())?;
    let config = a
        .cluster
        .config("tollgate why reads a cluster: set KUBECONFIG or pass --kubeconfig")
        .await
        .map_err(|e| format!("{e:#}"))?;
    let url = config.cluster_url.to_string();
    let namespace = a
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config)
        .map_err(|e| format!("creating a client for the API server at {url}: {e}"))?;
    let mut unread = Unread::default();

    // The policy in force for the namespace, as the server composes it; without the
    // TollgatePolicy, no verdict of tollgate's (it would be the built-in policy's).
    let (found, forbidden) =
        objects::from_cluster(client.clone(), &url, &Namespaces::One(namespace.clone())).await?;
    let policy_unread = objects::unreadable_policy(&forbidden, &PolicyObjects::default(), false);
    for u in forbidden.iter().filter(|u| u.kind != POLICY_KIND) {
        unread.0.push(format!(
            "could not read the namespace's TollgateProfile: forbidden ({})",
            u.why
        ));
    }
    let composed = objects::compose(file.as_ref(), &found)?;
    let policy = composed.policy;

    let kinds = crate::audit::list::kinds(&policy, &namespace);
    let resource = resolve(&kind, &kinds).ok_or_else(|| {
        let known: Vec<String> = kinds.iter().map(|r| r.kind.to_ascii_lowercase()).collect();
        format!(
            "{kind:?}: not a kind tollgate judges here (pods and the policy's workload kinds: {})",
            known.join(", ")
        )
    })?;
    let noun = super::kubectl::kind_noun(&resource.api_version, &resource.kind);
    let shown = format!("{noun} {namespace}/{name}");
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, &resource);
    let object = match api.get(&name).await {
        Ok(o) => serde_json::to_value(o).unwrap_or_default(),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            return Err(Unanswered::Object(format!(
                "{shown}: not found (the kubeconfig's cluster at {url})"
            )))
        }
        Err(kube::Error::Api(s)) if s.code == 403 => {
            return Err(Unanswered::Object(format!(
                "could not read {shown}: forbidden: {}",
                s.message
            )))
        }
        Err(e) => {
            return Err(Unanswered::Input(format!(
                "reading {shown}: {}",
                crate::kubeconfig::words(&e)
            )))
        }
    };
    let uid = str_at(&object, "/metadata/uid");
    let is_pod = resource.kind == "Pod" && resource.group.is_empty();

    // Its Jobs (a CronJob's, a JobSet's) and its pods, by ownerReference.
    let mut owners = BTreeSet::from([uid.clone()]);
    let mut jobs = vec![];
    let is_job = resource.kind == "Job" && resource.group == "batch";
    if !is_pod && !is_job {
        let jobs_api = Api::<DynamicObject>::namespaced_with(
            client.clone(),
            &namespace,
            &ApiResource::erase::<k8s_openapi::api::batch::v1::Job>(&()),
        );
        match jobs_api.list(&ListParams::default()).await {
            Ok(list) => {
                for j in list.items {
                    let j = serde_json::to_value(j).unwrap_or_default();
                    if owned_by(&j, &owners) {
                        owners.insert(str_at(&j, "/metadata/uid"));
                        jobs.push(j);
                    }
                }
            }
            Err(e) => unread.note(&format!("the Jobs of namespace {namespace}"), e)?,
        }
    }
    // A Deployment's pods are its ReplicaSets': they own the pods in between.
    if resource.kind == "Deployment" && resource.group == "apps" {
        let rs_api = Api::<DynamicObject>::namespaced_with(
            client.clone(),
            &namespace,
            &ApiResource::erase::<k8s_openapi::api::apps::v1::ReplicaSet>(&()),
        );
        match rs_api.list(&ListParams::default()).await {
            Ok(list) => {
                for r in list.items {
                    let r = serde_json::to_value(r).unwrap_or_default();
                    if owned_by(&r, &owners) {
                        owners.insert(str_at(&r, "/metadata/uid"));
                    }
                }
            }
            Err(e) => unread.note(&format!("the ReplicaSets of namespace {namespace}"), e)?,
        }
    }
    let mut pods = vec![];
    if is_pod {
        pods.push(object.clone());
    } else {
        let pods_api =
            Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &namespace);
        match pods_api.list(&ListParams::default()).await {
            Ok(list) => {
                for p in list.items {
                    let p = serde_json::to_value(p).unwrap_or_default();
                    if owned_by(&p, &owners) {
                        pods.push(p);
                    }
                }
            }
            Err(e) => unread.note(&format!("the pods of namespace {namespace}"), e)?,
        }
    }

    // Tollgate's part: what it changed (the pods' applied annotation, each step with the
    // layers its values come from) and its verdict now.
    let changed = changed(&policy, &namespace, &pods);
    let verdict = match &policy_unread {
        Some(line) => json!({"judged": false, "why": line}),
        None => {
            let auditor = Auditor::new(client.clone(), url.clone());
            match auditor.judge_one(&policy, &namespace, object.clone()).await {
                Ok(audited) => {
                    let mut v = verdict_json(&audited);
                    let cannot: Vec<String> = auditor
                        .unread()
                        .into_iter()
                        .map(|(what, _)| {
                            format!("could not read what feasibility needs: forbidden: {what}")
                        })
                        .collect();
                    v["unread"] = json!(cannot);
                    v
                }
                Err(e) => json!({"judged": false, "why": e.to_string()}),
            }
        }
    };

    // Events: the object's, its Jobs' and its pods'.
    let events_api =
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), &namespace);
    let mut events = vec![];
    let mut raw_events: Vec<Value> = vec![];
    match events_api.list(&ListParams::default()).await {
        Ok(list) => {
            let mut all: Vec<Value> = list
                .items
                .into_iter()
                .map(|e| serde_json::to_value(e).unwrap_or_default())
                .filter(|e| {
                    let about = str_at(e, "/involvedObject/uid");
                    owners.contains(&about)
                        || pods.iter().any(|p| str_at(p, "/metadata/uid") == about)
                })
                .collect();
            all.sort_by_key(last_seen);
            events = all.iter().map(event_json).collect();
            raw_events = all;
        }
        Err(e) => unread.note(&format!("the events of namespace {namespace}"), e)?,
    }

    // Kueue's Workloads owned by it or its Jobs.
    let mut workloads = vec![];
    match crate::cluster::dra::newest_served(&client, &KUEUE_API_VERSIONS).await {
        Ok(Some(version)) => {
            let r = crate::cluster::dra::resource(version, "Workload", "workloads");
            let wl_api = Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, &r);
            match wl_api.list(&ListParams::default()).await {
                Ok(list) => {
                    for w in list.items {
                        let w = serde_json::to_value(w).unwrap_or_default();
                        if owned_by(&w, &owners) {
                            workloads.push(workload_json(&w));
                        }
                    }
                }
                Err(e) => unread.note(&format!("Kueue's Workloads in namespace {namespace}"), e)?,
            }
        }
        Ok(None) => {}
        Err(e) => unread.note("the API discovery (is Kueue installed?)", e)?,
    }

    let pods_json: Vec<Value> = pods
        .iter()
        .map(|p| {
            let mut j = pod_json(p);
            j["startFailures"] = start_failures_json(&policy, p, &raw_events);
            j
        })
        .collect();
    Ok(json!({
        "object": {
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "namespace": namespace,
            "name": name,
            "uid": uid,
        },
        "noun": noun,
        "state": state(&object, is_pod, pods.len()),
        "tollgate": {
            "policy": composed_name(&policy, &namespace),
            "changed": changed,
            "verdict": verdict,
        },
        "jobs": jobs.iter().map(|j| json!({"name": str_at(j, "/metadata/name"), "state": state(j, false, 0)})).collect::<Vec<_>>(),
        "pods": pods_json,
        "events": events,
        "kueue": workloads,
        "couldNotRead": unread.0,
    }))
}

fn str_at(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

/// Whether one of `v`'s ownerReferences is one of `uids`.
fn owned_by(v: &Value, uids: &BTreeSet<String>) -> bool {
    v.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|r| r["uid"].as_str().is_some_and(|u| uids.contains(u)))
}

/// When an event was last seen, for ordering: its series', its lastTimestamp, its
/// eventTime (RFC 3339 strings order as times).
fn last_seen(e: &Value) -> String {
    for p in ["/series/lastObservedTime", "/lastTimestamp", "/eventTime"] {
        let s = str_at(e, p);
        if !s.is_empty() {
            return s;
        }
    }
    String::new()
}

/// Who refused what an event says was refused, by its words: Pod Security admission,
/// the ResourceQuota admission, tollgate's webhook, another webhook; else its source.
fn decided_by(message: &str) -> &'static str {
    if message.contains("violates PodSecurity") {
        "Pod Security"
    } else if message.contains("exceeded quota") || message.contains("must specify limits") {
        "ResourceQuota"
    } else if message.contains("admission webhook") && message.contains("tollgate") {
        "tollgate"
    } else if message.contains("admission webhook") {
        "another admission webhook"
    } else {
        ""
    }
}

fn event_json(e: &Value) -> Value {
    let message = str_at(e, "/message");
    let count = e
        .pointer("/series/count")
        .or_else(|| e.pointer("/count"))
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let source = {
        let c = str_at(e, "/source/component");
        if c.is_empty() {
            str_at(e, "/reportingComponent")
        } else {
            c
        }
    };
    json!({
        "object": format!("{}/{}", str_at(e, "/involvedObject/kind").to_ascii_lowercase(), str_at(e, "/involvedObject/name")),
        "type": str_at(e, "/type"),
        "reason": str_at(e, "/reason"),
        "message": message,
        "count": count,
        "lastSeen": last_seen(e),
        "source": source,
        "decidedBy": decided_by(&message),
    })
}

/// A pod's state and the scheduler's verdict on it.
fn pod_json(p: &Value) -> Value {
    let scheduled = p
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "PodScheduled")
        .map(|c| {
            json!({
                "status": c["status"],
                "reason": c.get("reason").cloned().unwrap_or(Value::Null),
                "message": c.get("message").cloned().unwrap_or(Value::Null),
            })
        });
    json!({
        "name": str_at(p, "/metadata/name"),
        "phase": str_at(p, "/status/phase"),
        "node": str_at(p, "/spec/nodeName"),
        "scheduled": scheduled,
    })
}

/// Why a pod does not start on its node, in the kubelet's words, and what of it is
/// tollgate's (the engine's `start_failures`), from its statuses and its Warning events.
fn start_failures_json(policy: &Policy, pod: &Value, events: &[Value]) -> Value {
    let uid = pod.pointer("/metadata/uid").and_then(Value::as_str);
    let events: Vec<PodEvent<'_>> = events
        .iter()
        .filter(|e| e.pointer("/involvedObject/uid").and_then(Value::as_str) == uid)
        .filter(|e| e.pointer("/type").and_then(Value::as_str) == Some("Warning"))
        .map(|e| PodEvent {
            reason: e.pointer("/reason").and_then(Value::as_str).unwrap_or(""),
            message: e.pointer("/message").and_then(Value::as_str).unwrap_or(""),
        })
        .collect();
    start_failures(policy, pod, &events)
        .iter()
        .map(|f| {
            json!({
                "reason": f.reason,
                "message": f.message,
                "container": f.container,
                "volume": f.volume,
                "tollgates": f.ours,
                "waysOut": f.ways_out,
            })
        })
        .collect()
}

fn workload_json(w: &Value) -> Value {
    let conditions: Vec<Value> = w
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            json!({
                "type": c["type"],
                "status": c["status"],
                "reason": c.get("reason").cloned().unwrap_or(Value::Null),
                "message": c.get("message").cloned().unwrap_or(Value::Null),
            })
        })
        .collect();
    json!({
        "name": str_at(w, "/metadata/name"),
        "queue": str_at(w, "/spec/queueName"),
        "conditions": conditions,
    })
}

/// A line on the object's state: a pod's phase (and its node, bound but not started), a
/// Job's counts and conditions, a set's replicas; `pods` of its pods were found.
fn state(v: &Value, is_pod: bool, pods: usize) -> String {
    if is_pod {
        let phase = str_at(v, "/status/phase");
        let node = str_at(v, "/spec/nodeName");
        return match (phase.as_str(), node.is_empty()) {
            ("", _) => "Unknown".into(),
            ("Pending", false) => format!("Pending (bound to node {node}, not started there yet)"),
            _ => phase,
        };
    }
    let s = &v["status"];
    let mut parts = vec![];
    for k in ["active", "ready", "succeeded", "failed"] {
        if let Some(n) = s[k].as_u64().filter(|n| *n > 0) {
            parts.push(format!("{n} {k}"));
        }
    }
    // A StatefulSet's, Deployment's or ReplicaSet's replicas (a DaemonSet's desired), and
    // how many are ready: the apiserver leaves a count of 0 out.
    let wanted = s["replicas"]
        .as_u64()
        .map(|n| format!("{n} replica{}", if n == 1 { "" } else { "s" }))
        .or_else(|| {
            s["desiredNumberScheduled"]
                .as_u64()
                .map(|n| format!("{n} desired"))
        });
    if let Some(w) = wanted {
        parts.push(w);
        let ready = s["readyReplicas"]
            .as_u64()
            .or_else(|| s["numberReady"].as_u64())
            .unwrap_or(0);
        parts.push(format!("{ready} ready"));
    }
    if v.pointer("/spec/suspend") == Some(&Value::Bool(true)) {
        parts.push("suspended".into());
    }
    parts.extend(
        s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["status"] == "True" && c["type"] != "Suspended")
            .filter_map(|c| c["type"].as_str().map(str::to_owned)),
    );
    if parts.is_empty() && pods == 0 {
        "no pods yet".into()
    } else if parts.is_empty() {
        format!("{pods} pod{}", if pods == 1 { "" } else { "s" })
    } else {
        parts.join(", ")
    }
}

/// The name the policy in force goes by for the namespace's pods (`base`, `ml/default`).
fn composed_name(policy: &Policy, namespace: &str) -> String {
    explain_policy(policy, Some(namespace), None)
        .map(|e| e.name)
        .unwrap_or_default()
}

/// What tollgate changed in the pods, from their applied annotation: each step (as the
/// policy names it) with the layers that set its values now, the GPU classes and the
/// cluster profile, and the pods that carry it.
fn changed(policy: &Policy, namespace: &str, pods: &[Value]) -> Vec<Value> {
    let key = &policy.mutation.applied_annotation;
    let mut seen: Vec<(String, Vec<String>)> = vec![];
    for p in pods {
        let Some(value) = p
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(key.as_str()))
            .and_then(Value::as_str)
        else {
            continue;
        };
        let name = str_at(p, "/metadata/name");
        match seen.iter_mut().find(|(v, _)| v == value) {
            Some((_, names)) => names.push(name),
            None => seen.push((value.to_owned(), vec![name])),
        }
    }
    seen.into_iter()
        .map(|(value, names)| {
            let items: Vec<&str> = value.split(',').map(str::trim).collect();
            let classes: Vec<&str> = items.iter().filter_map(|i| i.strip_prefix("gpu=")).collect();
            let profile = items.iter().find_map(|i| i.strip_prefix("profile="));
            // The profile as the webhook names it: `CLUSTER+NS/default`, `NS/default` (the
            // namespace's TollgateProfile alone) or `CLUSTER`; the cluster profile is what
            // the explanation chooses, the namespace's it finds itself.
            let cluster_profile = profile.and_then(|p| match p.split_once('+') {
                Some((c, _)) => Some(c),
                None => (!p.contains('/')).then_some(p),
            });
            let explained = explain_policy(policy, Some(namespace), cluster_profile).ok();
            let steps: Vec<Value> = items
                .iter()
                .filter_map(|i| Step::from_name(i))
                .map(|step| {
                    let mut prefixes = vec![vec!["mutation".to_owned(), step.field().to_owned()]];
                    if matches!(step, Step::Tolerations | Step::DriverMounts) {
                        for c in &classes {
                            prefixes.push(vec!["gpu".into(), "classes".into(), (*c).to_owned()]);
                        }
                    }
                    let mut layers: Vec<String> = vec![];
                    if let Some(e) = &explained {
                        for l in &e.leaves {
                            if prefixes.iter().any(|p| l.path.starts_with(p)) {
                                let s = l.source.to_string();
                                if !layers.contains(&s) {
                                    layers.push(s);
                                }
                            }
                        }
                        // In the order the layers apply, the last the one on top.
                        let order: Vec<String> =
                            e.layers.iter().map(ToString::to_string).collect();
                        layers.sort_by_key(|s| order.iter().position(|o| o == s));
                    }
                    json!({"step": step.as_str(), "field": format!("mutation.{}", step.field()), "layers": layers})
                })
                .collect();
            json!({
                "annotation": format!("{key}={value}"),
                "pods": names,
                "steps": steps,
                "gpuClasses": classes,
                "profile": profile,
            })
        })
        .collect()
}

/// Tollgate's verdict on the object as a CREATE of it now, from the audit's findings.
fn verdict_json(a: &Audited) -> Value {
    let findings: Vec<Value> = a
        .findings
        .iter()
        .map(|f| {
            json!({
                "rule": f.rule.as_str(),
                "result": f.status.as_str(),
                "message": f.message,
            })
        })
        .collect();
    let feasibility = a
        .findings
        .iter()
        .find(|f| f.rule == Rule::Feasibility)
        .map(|f| {
            json!({
                "result": if f.status == FindingStatus::Fail { "never" } else { "notNow" },
                "message": f.message,
            })
        });
    json!({
        "judged": true,
        "refused": a.refused(),
        "mode": a.mode.as_str(),
        "profile": a.profile,
        "optOut": a.opt_out.as_str(),
        "findings": findings,
        "feasibility": feasibility,
        "warnings": a.warnings,
    })
}

/// The answer in sentences.
fn text(v: &Value) -> String {
    let s = |p: &str| str_at(v, p);
    let mut out = format!(
        "{} {}/{}: {}\n",
        s("/noun"),
        s("/object/namespace"),
        s("/object/name"),
        s("/state")
    );
    for j in v["jobs"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  job {}: {}\n",
            str_at(j, "/name"),
            str_at(j, "/state")
        ));
    }

    out.push_str(&format!("\ntollgate (policy {}):\n", s("/tollgate/policy")));
    let verdict = &v["tollgate"]["verdict"];
    if verdict["judged"] == true {
        let refused: Vec<&Value> = verdict["findings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| {
                f["rule"] != "feasibility" && matches!(f["result"].as_str(), Some("fail" | "error"))
            })
            .collect();
        if refused.is_empty() {
            out.push_str("  would admit it as it is now\n");
        }
        for f in refused {
            out.push_str(&format!(
                "  would refuse it ({} mode {}): {}\n",
                f["rule"].as_str().unwrap_or(""),
                verdict["mode"].as_str().unwrap_or(""),
                f["message"].as_str().unwrap_or("")
            ));
        }
        match verdict["feasibility"].as_object() {
            Some(f) => out.push_str(&format!(
                "  feasibility: {}: {}\n",
                if f["result"] == "never" {
                    "its pods could never run here"
                } else {
                    "its pods cannot run now"
                },
                f["message"].as_str().unwrap_or("")
            )),
            None => out.push_str("  feasibility: nothing found against its running here\n"),
        }
        for u in verdict["unread"].as_array().into_iter().flatten() {
            out.push_str(&format!("    ({})\n", u.as_str().unwrap_or("")));
        }
        for w in verdict["warnings"].as_array().into_iter().flatten() {
            out.push_str(&format!("  warning: {}\n", w.as_str().unwrap_or("")));
        }
    } else {
        out.push_str(&format!(
            "  not judged: {}\n",
            verdict["why"].as_str().unwrap_or("")
        ));
    }
    let changed = v["tollgate"]["changed"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if changed.is_empty() && !v["pods"].as_array().is_none_or(Vec::is_empty) {
        out.push_str("  changed nothing in its pods\n");
    }
    for c in &changed {
        let pods: Vec<&str> = c["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        out.push_str(&format!(
            "  changed pod {} ({}):\n",
            pods.join(", "),
            str_at(c, "/annotation")
        ));
        for step in c["steps"].as_array().into_iter().flatten() {
            // The layer on top first: "TollgateProfile ml/default over built-in".
            let mut layers: Vec<&str> = step["layers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            layers.reverse();
            out.push_str(&format!(
                "    {}: {} set by {}\n",
                str_at(step, "/step"),
                str_at(step, "/field"),
                if layers.is_empty() {
                    "the policy".to_owned()
                } else {
                    layers.join(" over ")
                }
            ));
        }
        if let Some(p) = c["profile"].as_str() {
            out.push_str(&format!("    profile: {p}\n"));
        }
    }

    let events = v["events"].as_array().cloned().unwrap_or_default();
    let refusals: Vec<&Value> = events
        .iter()
        .filter(|e| e["reason"] == "FailedCreate")
        .collect();
    if !refusals.is_empty() {
        out.push_str("\npods never made (the controller's FailedCreate events):\n");
        for e in refusals {
            let by = e["decidedBy"].as_str().unwrap_or("");
            let by = if by.is_empty() {
                String::new()
            } else {
                format!("{by} refused: ")
            };
            out.push_str(&format!(
                "  {} ({}x): {by}{}\n",
                str_at(e, "/object"),
                e["count"],
                str_at(e, "/message")
            ));
        }
    }

    for w in v["kueue"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\nkueue: workload {} (queue {}):\n",
            str_at(w, "/name"),
            str_at(w, "/queue")
        ));
        let conditions = w["conditions"].as_array().cloned().unwrap_or_default();
        if conditions.is_empty() {
            out.push_str("  no conditions yet: not yet considered by Kueue\n");
        }
        for c in conditions {
            out.push_str(&format!(
                "  {}={} ({}): {}\n",
                str_at(&c, "/type"),
                str_at(&c, "/status"),
                str_at(&c, "/reason"),
                str_at(&c, "/message")
            ));
        }
    }

    let pods = v["pods"].as_array().cloned().unwrap_or_default();
    for p in &pods {
        let name = str_at(p, "/name");
        let node = str_at(p, "/node");
        let line = if !node.is_empty() {
            format!("scheduled on node {node}")
        } else {
            match p["scheduled"].as_object() {
                Some(c) if c["status"] == "False" => format!(
                    "not scheduled ({}): {}",
                    c["reason"].as_str().unwrap_or(""),
                    c["message"].as_str().unwrap_or("")
                ),
                _ => "not yet considered by the scheduler".to_owned(),
            }
        };
        out.push_str(&format!("\npod {name} ({}): {line}\n", str_at(p, "/phase")));
        let failures = p["startFailures"].as_array().cloned().unwrap_or_default();
        if !failures.is_empty() {
            out.push_str(&format!(
                "  does not start on node {node} (the kubelet's words):\n"
            ));
        }
        for f in &failures {
            let about = match (f["container"].as_str(), f["volume"].as_str()) {
                (Some(c), _) => format!("container {c}: "),
                (None, Some(v)) => format!("volume {v}: "),
                _ => String::new(),
            };
            out.push_str(&format!(
                "    {about}{}: {}\n",
                str_at(f, "/reason"),
                str_at(f, "/message")
            ));
            if let Some(o) = f["tollgates"].as_str() {
                out.push_str(&format!("      this is {o}\n"));
            }
            let ways: Vec<&str> = f["waysOut"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if !ways.is_empty() {
                out.push_str("      ways out:\n");
                for w in ways {
                    out.push_str(&format!("        - {w}\n"));
                }
            }
        }
        for e in events.iter().filter(|e| {
            str_at(e, "/object") == format!("pod/{name}")
                && e["type"] == "Warning"
                && !failures.iter().any(|f| f["reason"] == e["reason"])
                // A pod bound to a node was scheduled: the scheduler's earlier refusals
                // (a node full until another pod ended) are history.
                && (e["reason"] != "FailedScheduling" || node.is_empty())
        }) {
            out.push_str(&format!(
                "  {} ({}x, {}): {}\n",
                str_at(e, "/reason"),
                e["count"],
                str_at(e, "/source"),
                str_at(e, "/message")
            ));
        }
    }
    let other: Vec<&Value> = events
        .iter()
        .filter(|e| {
            e["type"] == "Warning"
                && e["reason"] != "FailedCreate"
                && !str_at(e, "/object").starts_with("pod/")
        })
        .collect();
    if !other.is_empty() {
        out.push_str("\nwarnings:\n");
        for e in other {
            out.push_str(&format!(
                "  {} {} ({}x): {}\n",
                str_at(e, "/object"),
                str_at(e, "/reason"),
                e["count"],
                str_at(e, "/message")
            ));
        }
    }
    let unread = v["couldNotRead"].as_array().cloned().unwrap_or_default();
    if !unread.is_empty() {
        out.push('\n');
        for u in unread {
            out.push_str(&format!("{}\n", u.as_str().unwrap_or("")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds() -> Vec<ApiResource> {
        let policy = Policy::builtin();
        crate::audit::list::kinds(&policy, "ml")
    }

    #[test]
    fn names_as_kubectl_takes_them() {
        let k = kinds();
        for (given, kind, group) in [
            ("pod", "Pod", ""),
            ("po", "Pod", ""),
            ("pods", "Pod", ""),
            ("job", "Job", "batch"),
            ("jobs.batch", "Job", "batch"),
            ("job.batch.volcano.sh", "Job", "batch.volcano.sh"),
            ("pytorchjob", "PyTorchJob", "kubeflow.org"),
            ("PyTorchJobs", "PyTorchJob", "kubeflow.org"),
            ("deploy", "Deployment", "apps"),
        ] {
            let r = resolve(given, &k).unwrap_or_else(|| panic!("{given}"));
            assert_eq!(
                (r.kind.as_str(), r.group.as_str()),
                (kind, group),
                "{given}"
            );
        }
        assert!(resolve("service", &k).is_none());
    }

    #[test]
    fn the_object_as_kind_slash_name_or_two_words() {
        let w = |v: &[&str]| kind_and_name(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(w(&["pod/x"]).unwrap(), ("pod".into(), "x".into()));
        assert_eq!(
            w(&["job", "train"]).unwrap(),
            ("job".into(), "train".into())
        );
        assert!(w(&["x"]).is_err());
        assert!(w(&["pod/x", "y"]).is_err());
    }
}

//! Workloads: a Job, a Deployment, a PyTorchJob judged by the pods its templates will make.
//!
//! Nobody reads the events of a Job whose pods are refused; `kubectl apply` of the Job
//! itself is where a data scientist looks. So for each pod template of a workload (found
//! by the policy's paths for its kind) this builds the pod its controller would create,
//! with the labels the controller adds, and runs on it what a cluster runs on a pod:
//! tollgate's mutation, the apiserver's defaulting and tollgate's validation (the pipeline
//! of `tollgate review --stage all`). The workload is refused when its pods would be.
//!
//! The opt-out is judged here too, because here the requester is the person who made the
//! workload, where at the pod it is only a controller's service account. The verdict goes
//! to the pods in the template itself, as tollgate's approval annotation: the mutating
//! webhook sets it on a new or changed template whose requester may opt out, and removes
//! it from any other; an unchanged template keeps what it had; an object a controller made
//! keeps what it came with (only an approved parent template can have given it one). The
//! validating webhook refuses an approval the mutating webhook would not have left there.
//! At the pod, `optout` honours a controller's pod only with the approval.
//!
//! The mutating webhook changes nothing else in a template: the pods are mutated when
//! they are created.
//!
//! A kind whose templates are not in the workload itself (`from` in its policy entry: a
//! Kubeflow TrainJob, whose pods come from the runtime it names) is judged the same way
//! on the object `trainjob` builds: the runtime as the controller changes it for the
//! workload. Its approval cannot go into that runtime (many TrainJobs share it): the
//! mutating webhook writes it into the TrainJob's own overrides of the pod templates, one
//! `runtimePatches` entry whose manager is the approval annotation (Trainer v2.2 on), or
//! for a TrainJob written with `podTemplateOverrides` (v2.1) an entry there, and removes it
//! from every other entry. A workload whose runtime tollgate does not know is allowed,
//! with a warning that says so.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use serde_json::{Map, Value};

use crate::cluster::{Cluster, Layered, ObjectKey, Objects};
use crate::feasible::{self, Usage};
use crate::judge::{self, Judgement, Stages};
use crate::optout::{self, OptOut};
use crate::policy::{FeasibilityMode, Operation, Policy, TemplateSpec, WorkloadKind};
use crate::requester::Requester;
use crate::template_path::Path;
use crate::validate::{self, Missing, Part, Verdict};
use crate::{diff, pod, profile, trainjob};

/// A workload as a review sees it.
#[derive(Debug, Clone, Copy)]
pub struct Workload<'a> {
    pub kind: &'a WorkloadKind,
    pub object: &'a Value,
    /// On UPDATE, the object as it was.
    pub old: Option<&'a Value>,
    pub operation: Operation,
    pub who: Requester<'a>,
}

/// One pod template of a workload.
#[derive(Debug, Clone)]
pub struct Template<'v> {
    /// Where it is in the workload, as a JSON pointer.
    pub pointer: String,
    /// How messages name it (`replica Worker`); None for a kind's only, unnamed template.
    pub label: Option<String>,
    /// Its name as the controller's labels use it (`Worker`, `head`); empty if none.
    pub name: String,
    pub value: &'v Value,
    spec: &'v TemplateSpec,
}

/// What the review of one template concluded, for `tollgate review` and the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateVerdict {
    /// How messages name the template (`replica Worker`, or `pod template`).
    pub template: String,
    pub pointer: String,
    /// At `/validate`: `allowed`, `denied`, `opted-out`, `unchanged` (an UPDATE that left
    /// it as it was: not judged), `unreadable`. At `/mutate`: `approved` (the opt-out),
    /// `not-approved` (asked for and refused), `approval-removed`, `approval-restored` (an
    /// unchanged template's, as it was), `unchanged`, `none` (nothing to do).
    pub decision: &'static str,
}

/// One template as the validating webhook judged it: what the audit draws its findings
/// from.
#[derive(Debug, Clone)]
pub struct TemplateJudged {
    pub verdict: TemplateVerdict,
    /// How findings are led (`replica Worker`); None for a kind's only, unnamed template.
    pub label: Option<String>,
    /// The profile its pods get (None: the base policy).
    pub profile: Option<String>,
    /// The opt-out its pods get; None when it was not judged.
    pub opt_out: Option<OptOut>,
    /// Whom tollgate's approval in the template names, if it carries one.
    pub approved_for: Option<String>,
    /// The judgement of the pod it makes; None when none was made (opted out, unchanged,
    /// unreadable, a forged approval).
    pub judgement: Option<Judgement>,
    /// Why the template could not be read as a pod spec.
    pub unreadable: Option<String>,
    /// How many pods it makes (its spec's `count`).
    pub pods: i128,
    /// Whether its policy refuses a workload that can never run (`feasibility.mode:
    /// enforce`), rather than warning.
    pub enforce: bool,
}

/// What the validating webhook answers for a workload.
#[derive(Debug, Clone, Default)]
pub struct Validated {
    pub allowed: bool,
    pub message: Option<String>,
    pub warnings: Vec<String>,
    pub audit_annotations: BTreeMap<String, String>,
    /// None when no template was judged.
    pub verdict: Option<Verdict>,
    pub opt_out: Option<OptOut>,
    pub templates: Vec<TemplateVerdict>,
    pub unresolved: Vec<ObjectKey>,
    /// Each template as judged, in order.
    pub judged: Vec<TemplateJudged>,
    /// Whether its pods can run: each template's findings (led by its name) and the
    /// quotas held to its pods in all.
    pub feasibility: Vec<feasible::Finding>,
}

/// What the mutating webhook answers for a workload: at most the approval's changes.
#[derive(Debug, Clone, Default)]
pub struct Mutated {
    /// The JSON patch, as text.
    pub patch: Option<Vec<u8>>,
    pub warnings: Vec<String>,
    pub audit_annotations: BTreeMap<String, String>,
    pub opt_out: Option<OptOut>,
    pub templates: Vec<TemplateVerdict>,
    /// Objects the templates are read in that the cluster context did not know.
    pub unresolved: Vec<ObjectKey>,
}

/// The workload's name as messages show it: `job "train"` (or `job "train-*"` for a
/// generateName).
pub fn subject(kind: &WorkloadKind, object: &Value) -> String {
    let meta = object.get("metadata");
    let field = |k: &str| {
        meta.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let name = match (field("name"), field("generateName")) {
        (Some(n), _) => n.to_owned(),
        (None, Some(g)) => format!("{g}*"),
        (None, None) => "(unnamed)".to_owned(),
    };
    format!("{} {name:?}", kind.noun())
}

/// The pod templates of `object`, in the order of the kind's paths.
pub fn templates<'v>(kind: &'v WorkloadKind, object: &'v Value) -> Vec<Template<'v>> {
    let mut out = vec![];
    for spec in &kind.templates {
        // The policy checked every path when it loaded.
        let Ok(path) = Path::parse(&spec.path) else {
            continue;
        };
        for found in path.find(object) {
            let fanned = found.names.join("/");
            let name = if fanned.is_empty() {
                spec.name.clone()
            } else {
                fanned.clone()
            };
            let label = match (spec.noun.as_str(), fanned.as_str()) {
                ("", "") if spec.name.is_empty() => None,
                ("", "") => Some(spec.name.clone()),
                ("", f) => Some(f.to_owned()),
                (noun, "") => Some(format!("{noun} {}", spec.name).trim_end().to_owned()),
                (noun, f) => Some(format!("{noun} {f}")),
            };
            out.push(Template {
                pointer: found.pointer,
                label,
                name,
                value: found.value,
                spec,
            });
        }
    }
    out
}

impl Template<'_> {
    fn annotations(&self) -> Option<BTreeMap<String, String>> {
        let a = self.value.pointer("/metadata/annotations")?;
        a.is_object().then(|| string_map(Some(a)))
    }

    fn display(&self) -> &str {
        self.label.as_deref().unwrap_or("pod template")
    }

    /// `text`, led by the template's name when it has one (`replica Worker: ...`).
    pub fn lead(&self, text: &str) -> String {
        match &self.label {
            Some(l) => format!("{l}: {text}"),
            None => text.to_owned(),
        }
    }
}

/// The labels the pods of `t` get: the template's, then the controller's (which win, as
/// the controllers set them).
pub fn pod_labels(
    kind: &WorkloadKind,
    t: &Template<'_>,
    workload: &str,
) -> BTreeMap<String, String> {
    let mut labels = labels_of(t.value);
    let lower = t.name.to_ascii_lowercase();
    for (k, v) in kind.labels.iter().chain(&t.spec.labels) {
        let v = v
            .replace("{template-lower}", &lower)
            .replace("{template}", &t.name)
            .replace("{name}", workload);
        labels.insert(k.clone(), v);
    }
    labels
}

/// The pod the controller would create from `t`: the template's metadata and spec, the
/// controller's labels, the workload's namespace, and a generateName after the workload.
pub fn pod_of(
    kind: &WorkloadKind,
    t: &Template<'_>,
    workload: &str,
    namespace: &str,
) -> Result<Pod, String> {
    let mut meta = match t.value.get("metadata") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    let labels = pod_labels(kind, t, workload);
    if !labels.is_empty() {
        meta.insert(
            "labels".into(),
            Value::Object(
                labels
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect(),
            ),
        );
    }
    meta.remove("name");
    meta.insert("namespace".into(), Value::String(namespace.to_owned()));
    meta.insert("generateName".into(), Value::String(format!("{workload}-")));
    let mut pod = Map::new();
    pod.insert("apiVersion".into(), "v1".into());
    pod.insert("kind".into(), "Pod".into());
    pod.insert("metadata".into(), Value::Object(meta));
    pod.insert(
        "spec".into(),
        t.value.get("spec").cloned().unwrap_or(Value::Null),
    );
    let mut pod: Pod = serde_json::from_value(Value::Object(pod)).map_err(|e| e.to_string())?;
    // The apiserver defaults the pod the controller creates before any webhook sees it.
    if let Some(spec) = pod.spec.as_mut() {
        pod::default_pod_level_requests(spec);
    }
    Ok(pod)
}

/// How many pods template `t` of `object` makes: the product of the numbers its spec's
/// `count` paths find (each 1 where absent or not a number), less `countMinus`, never
/// below zero.
pub fn pod_count(t: &Template<'_>, object: &Value) -> i128 {
    let mut n: i128 = 1;
    for count in &t.spec.count {
        let mut at: Vec<&str> = t.pointer.split('/').skip(1).collect();
        let mut keys = vec![];
        for seg in count.split('/') {
            if seg == ".." {
                at.pop();
            } else {
                keys.push(seg);
            }
        }
        let pointer: String = at.iter().chain(&keys).map(|s| format!("/{s}")).collect();
        let factor = object
            .pointer(&pointer)
            .and_then(Value::as_i64)
            .map_or(1, i128::from);
        n = n.saturating_mul(factor.max(0));
    }
    (n - i128::from(t.spec.count_minus)).max(0)
}

/// The workload's name for the controller's labels and the pods' generateName.
pub fn workload_name(object: &Value) -> &str {
    let meta = object.get("metadata");
    ["name", "generateName"]
        .iter()
        .find_map(|k| {
            meta.and_then(|m| m.get(k))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        })
        .map_or("", |s| s.trim_end_matches('-'))
}

/// Where a workload's templates are read: the workload itself, or for a kind with
/// `from`, what was built from it (and, on UPDATE, from the old object).
#[derive(Debug, Clone, Copy)]
struct Source<'v> {
    object: &'v Value,
    old: Option<&'v Value>,
}

/// The objects built for a kind with `from`, owned for the review.
struct Built {
    object: Value,
    old: Option<Value>,
}

/// What a kind with `from` reads its templates in, built from the workload; None for a
/// kind whose templates are in the workload itself.
fn build(
    cluster: &dyn Cluster,
    w: &Workload<'_>,
    name: &str,
) -> Option<Result<Built, trainjob::Missing>> {
    let from = w.kind.from.as_ref()?;
    let src = &from.training_runtime;
    let ns = w.who.namespace;
    let path = src.train_job_template.as_str();
    let trainjob = held_trainjob(path, w.object);
    Some(
        trainjob::build(src, trainjob.as_ref(), name, ns, cluster).map(|object| Built {
            object,
            // The old object's, where its runtime is known: else every template is new.
            old: w.old.and_then(|o| {
                trainjob::build(src, &held_trainjob(path, o), workload_name(o), ns, cluster).ok()
            }),
        }),
    )
}

/// The value at a policy's dotted path (`spec.parallelTrials`) in `object`, key by key.
fn at<'v>(object: &'v Value, dotted: &str) -> Option<&'v Value> {
    dotted.split('.').try_fold(object, |v, key| v.get(key))
}

/// The TrainJob a workload makes: itself, or the one it holds at `path` (its `metadata` and
/// `spec`, as an OptimizationJob's trials are made of its `spec.trainJobTemplate`).
fn held_trainjob<'v>(path: &str, workload: &'v Value) -> std::borrow::Cow<'v, Value> {
    if path.is_empty() {
        return std::borrow::Cow::Borrowed(workload);
    }
    let held = at(workload, path);
    let mut metadata = held
        .and_then(|t| t.get("metadata"))
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    if let (Value::Object(m), Some(name)) = (&mut metadata, workload.pointer("/metadata/name")) {
        m.insert("name".into(), name.clone());
    }
    std::borrow::Cow::Owned(serde_json::json!({
        "apiVersion": workload.get("apiVersion"),
        "kind": "TrainJob",
        "metadata": metadata,
        "spec": held.and_then(|t| t.get("spec")).cloned().unwrap_or(Value::Null),
    }))
}

impl<'v> Source<'v> {
    fn of(w: &Workload<'v>, built: Option<&'v Built>) -> Source<'v> {
        match built {
            Some(b) => Source {
                object: &b.object,
                old: b.old.as_ref(),
            },
            None => Source {
                object: w.object,
                old: w.old,
            },
        }
    }
}

/// The template at the same place in the old object, on UPDATE.
fn old_template<'v>(src: Source<'v>, t: &Template<'_>) -> Option<&'v Value> {
    src.old?.pointer(&t.pointer).filter(|v| !v.is_null())
}

/// Whether an UPDATE left a template as it was, but for tollgate's approval (which the
/// review itself may have changed) and empty metadata maps (which read as absent).
fn same_template(approval: &str, a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let keys = a.keys().chain(b.keys().filter(|k| !a.contains_key(*k)));
    for k in keys {
        let (x, y) = (a.get(k), b.get(k));
        let same = if k == "metadata" {
            same_map(x, y, |mk, mx, my| {
                if mk == "annotations" {
                    same_map(mx, my, |ak, ax, ay| ak == approval || ax == ay)
                } else {
                    mx == my
                }
            })
        } else {
            x == y
        };
        if !same {
            return false;
        }
    }
    true
}

/// Two maps compared member by member with `same`, an absent, null or empty map being
/// the same as an empty one.
fn same_map(
    a: Option<&Value>,
    b: Option<&Value>,
    same: impl Fn(&str, Option<&Value>, Option<&Value>) -> bool,
) -> bool {
    fn as_map<'a>(
        v: Option<&'a Value>,
        empty: &'a Map<String, Value>,
    ) -> Option<&'a Map<String, Value>> {
        match v {
            None | Some(Value::Null) => Some(empty),
            Some(Value::Object(m)) => Some(m),
            Some(_) => None,
        }
    }
    let empty = Map::new();
    let (Some(am), Some(bm)) = (as_map(a, &empty), as_map(b, &empty)) else {
        return a == b;
    };
    am.keys()
        .chain(bm.keys().filter(|k| !am.contains_key(*k)))
        .all(|k| same(k, am.get(k), bm.get(k)))
}

fn approval_of<'v>(policy: &Policy, template: &'v Value) -> Option<&'v str> {
    template
        .pointer("/metadata/annotations")?
        .get(&policy.opt_out.approval_annotation)?
        .as_str()
}

/// A template, and the policy its pods get (their profile).
struct Judging<'v, 'p> {
    t: Template<'v>,
    policy: &'p Policy,
    profile: Option<&'p str>,
    /// On CREATE, or an UPDATE that changed it.
    changed: bool,
    old: Option<&'v Value>,
    unresolved: Option<ObjectKey>,
    warning: Option<String>,
}

fn judging<'v, 'p>(
    policy: &'p Policy,
    cluster: &dyn Cluster,
    w: &Workload<'v>,
    src: Source<'v>,
    name: &str,
) -> Vec<Judging<'v, 'p>> {
    templates(w.kind, src.object)
        .into_iter()
        .map(|t| {
            let labels = pod_labels(w.kind, &t, name);
            let selected = profile::select(
                policy,
                w.who.namespace,
                profile::PodLabels::Parsed(Some(&labels)),
                cluster,
            );
            let old = old_template(src, &t);
            let approval = &selected.policy.opt_out.approval_annotation;
            let changed = w.operation == Operation::Create
                || old.is_none_or(|o| !same_template(approval, o, t.value));
            Judging {
                t,
                policy: selected.policy,
                profile: selected.profile,
                changed,
                old,
                unresolved: selected.unresolved,
                warning: selected.warning,
            }
        })
        .collect()
}

/// `tollgate: <subject>: <rest>` from a message that starts `tollgate: <rest>`.
fn prefixed(subject: &str, message: &str) -> String {
    let rest = message.strip_prefix("tollgate: ").unwrap_or(message);
    format!("tollgate: {subject}: {rest}")
}

fn with_template(subject: &str, t: &Template<'_>) -> String {
    match &t.label {
        Some(l) => format!("{subject}, {l}"),
        None => subject.to_owned(),
    }
}

fn no_template_warning(w: &Workload<'_>, subject: &str) -> String {
    let paths: Vec<&str> = w.kind.templates.iter().map(|t| t.path.as_str()).collect();
    let within = if w.kind.from.is_some() {
        " of its runtime"
    } else {
        ""
    };
    format!(
        "tollgate: {subject}: no pod template at {}{within}; it was allowed, and its pods will be judged when they are created",
        paths.join(", ")
    )
}

/// The warning for a workload whose templates could not be built.
fn missing_warning(subject: &str, m: &trainjob::Missing) -> String {
    format!(
        "tollgate: {subject}: {}; it was allowed, and its pods will be judged when they are created",
        m.why
    )
}

/// The mutating webhook for a workload: tollgate's approval of the opt-out in each new or
/// changed template, and nothing else.
pub fn mutate(policy: &Policy, cluster: &dyn Cluster, w: &Workload<'_>) -> Mutated {
    let mut out = Mutated::default();
    // What a controller made came from a template judged at its parent: it keeps what it
    // arrived with.
    if optout::is_controller(policy, w.who.username) {
        return out;
    }
    let subject = subject(w.kind, w.object);
    let name = workload_name(w.object);
    let built = match build(cluster, w, name) {
        None => None,
        Some(Ok(b)) => Some(b),
        // The validating webhook warns; the shell fetches the runtime and reviews again.
        Some(Err(m)) => {
            out.unresolved.extend(m.unresolved);
            return out;
        }
    };
    let src = Source::of(w, built.as_ref());
    let mut after: Option<Value> = None;
    let mut approved = vec![];
    // For a kind with `from`: every template's approval (by its name), written into the
    // workload at the end if any changes.
    let mut carried: Vec<(String, Option<String>)> = vec![];
    let mut carry = false;
    for j in judging(policy, cluster, w, src, name) {
        let p = j.policy;
        let key = &p.opt_out.approval_annotation;
        let here = with_template(&subject, &j.t);
        let current = approval_of(p, j.t.value);
        let annotations = j.t.annotations();
        let asked = pod::is_true(annotations.as_ref(), &p.opt_out.annotation);
        let wanted: Option<&str> = if !j.changed {
            j.old.and_then(|o| approval_of(p, o))
        } else if asked {
            match optout::permitted(p, &w.who) {
                Ok(()) => Some(w.who.username),
                Err(why) => {
                    out.warnings.push(format!(
                        "tollgate: {here}: {why}; its pods will be handled as usual"
                    ));
                    out.opt_out = Some(OptOut::Refused(why));
                    None
                }
            }
        } else {
            None
        };
        if wanted.is_some() && j.changed {
            approved.push(j.t.lead(&format!(
                "for user {:?} in namespace {:?}",
                w.who.username, w.who.namespace
            )));
            out.opt_out = Some(OptOut::Honoured);
        }
        let refused = asked && j.changed && wanted.is_none();
        let decision = match (j.changed, current == wanted) {
            (true, _) if wanted.is_some() => "approved",
            (true, _) if refused => "not-approved",
            (true, true) => "none",
            (true, false) => "approval-removed",
            (false, true) => "unchanged",
            (false, false) => "approval-restored",
        };
        out.templates.push(TemplateVerdict {
            template: j.t.display().to_owned(),
            pointer: j.t.pointer.clone(),
            decision,
        });
        if let Some(by) = wanted.filter(|_| j.changed) {
            out.warnings.push(format!(
                "tollgate: {here}: the opt-out of its pods is approved for {by:?} ({key} on the pod template); they will skip tollgate's mutation and validation"
            ));
        }
        if built.is_some() {
            carried.push((j.t.name.clone(), wanted.map(str::to_owned)));
        }
        if current == wanted {
            continue;
        }
        if built.is_some() {
            carry = true;
        } else {
            let doc = after.get_or_insert_with(|| w.object.clone());
            let Some(template) = doc.pointer_mut(&j.t.pointer) else {
                continue;
            };
            set_approval(template, key, wanted);
        }
        match (wanted, j.changed) {
            (Some(_), true) => {}
            (None, true) => out.warnings.push(format!(
                "tollgate: {here}: removed {key} from the pod template: only tollgate sets it, for a requester who may opt out there"
            )),
            (_, false) => out.warnings.push(format!(
                "tollgate: {here}: {key} on the pod template was put back as it was: the template did not change"
            )),
        }
    }
    if carry {
        let doc = after.get_or_insert_with(|| w.object.clone());
        carry_approvals(doc, &policy.opt_out.approval_annotation, &carried);
    }
    if !approved.is_empty() {
        out.audit_annotations
            .insert("opt-out-approved".into(), approved.join("; "));
    }
    if let Some(after) = after {
        let patch = diff::Snapshot::of(w.object)
            .and_then(|b| diff::patch_text(&b, &diff::Snapshot::of(&after)?));
        match patch {
            Ok(p) => out.patch = p,
            Err(e) => out.warnings.push(format!(
                "tollgate: {subject}: could not compute its changes ({e}); it was allowed unchanged"
            )),
        }
    }
    out
}

/// Sets (or, with None, removes) the approval in a template's annotations.
fn set_approval(template: &mut Value, key: &str, value: Option<&str>) {
    let Value::Object(t) = template else {
        return;
    };
    match value {
        Some(v) => {
            let meta = t
                .entry("metadata")
                .or_insert_with(|| Value::Object(Map::new()));
            if !meta.is_object() {
                *meta = Value::Object(Map::new());
            }
            let Value::Object(meta) = meta else { return };
            let annotations = meta
                .entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()));
            if !annotations.is_object() {
                *annotations = Value::Object(Map::new());
            }
            if let Value::Object(a) = annotations {
                a.insert(key.to_owned(), Value::String(v.to_owned()));
            }
        }
        None => {
            if let Some(Value::Object(a)) =
                t.get_mut("metadata").and_then(|m| m.get_mut("annotations"))
            {
                a.remove(key);
            }
        }
    }
}

/// Writes the approvals of a TrainJob's templates (by replicated job) into the TrainJob:
/// removed from every override of a pod template's annotations, then set in one entry of
/// tollgate's own, which the controller merges into the pod templates: a `runtimePatches`
/// entry whose manager is the approval annotation (Trainer v2.2 on), or, for a TrainJob
/// that uses `podTemplateOverrides` and no `runtimePatches` (v2.1), an override per user.
fn carry_approvals(doc: &mut Value, key: &str, approvals: &[(String, Option<String>)]) {
    let Some(Value::Object(spec)) = doc.get_mut("spec") else {
        return;
    };
    let strip = |template_meta: Option<&mut Value>| {
        if let Some(Value::Object(a)) = template_meta.and_then(|m| m.get_mut("annotations")) {
            a.remove(key);
        }
    };
    let v21 = spec.contains_key("podTemplateOverrides") && !spec.contains_key("runtimePatches");
    if let Some(Value::Array(patches)) = spec.get_mut("runtimePatches") {
        patches.retain(|p| p.get("manager").and_then(Value::as_str) != Some(key));
        for p in patches.iter_mut() {
            let jobs = p
                .pointer_mut("/trainingRuntimeSpec/template/spec/replicatedJobs")
                .and_then(Value::as_array_mut);
            for j in jobs.into_iter().flatten() {
                strip(j.pointer_mut("/template/spec/template/metadata"));
            }
        }
    }
    if let Some(Value::Array(overrides)) = spec.get_mut("podTemplateOverrides") {
        for o in overrides.iter_mut() {
            strip(o.get_mut("metadata"));
        }
        // Tollgate's own: nothing left but its targets and empty metadata.
        overrides.retain(|o| {
            let empty = |k: &str| {
                o.pointer(&format!("/metadata/{k}"))
                    .and_then(Value::as_object)
                    .is_none_or(Map::is_empty)
            };
            let only = o
                .as_object()
                .is_some_and(|m| m.keys().all(|k| k == "targetJobs" || k == "metadata"));
            !(only && empty("annotations") && empty("labels"))
        });
    }
    let given: Vec<(&str, &str)> = approvals
        .iter()
        .filter_map(|(n, a)| Some((n.as_str(), a.as_deref()?)))
        .collect();
    if given.is_empty() {
        return;
    }
    let annotations = |user: &str| {
        let mut a = Map::new();
        a.insert(key.to_owned(), Value::String(user.to_owned()));
        let mut m = Map::new();
        m.insert("annotations".into(), Value::Object(a));
        Value::Object(m)
    };
    if v21 {
        let mut users: Vec<&str> = given.iter().map(|(_, u)| *u).collect();
        users.sort_unstable();
        users.dedup();
        let Some(Value::Array(overrides)) = spec.get_mut("podTemplateOverrides") else {
            return;
        };
        for user in users {
            let targets: Vec<Value> = given
                .iter()
                .filter(|(_, u)| *u == user)
                .map(|(n, _)| serde_json::json!({ "name": n }))
                .collect();
            overrides.push(serde_json::json!({
                "targetJobs": targets,
                "metadata": annotations(user),
            }));
        }
        return;
    }
    let jobs: Vec<Value> = given
        .iter()
        .map(|(n, u)| {
            serde_json::json!({
                "name": n,
                "template": {"spec": {"template": {"metadata": annotations(u)}}},
            })
        })
        .collect();
    let entry = serde_json::json!({
        "manager": key,
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": jobs}}},
    });
    match spec
        .entry("runtimePatches")
        .or_insert_with(|| Value::Array(vec![]))
    {
        Value::Array(p) => p.push(entry),
        other => *other = Value::Array(vec![entry]),
    }
}

/// One judged template, kept for the message.
struct Finding<'v> {
    t: Template<'v>,
    missing: Vec<Missing>,
    opt_out: OptOut,
    /// Claims of its pods that could not be read.
    unread: Vec<String>,
}

/// The validating webhook for a workload: each new or changed template judged as the
/// pods it will make, and approvals the mutating webhook would not have left refused.
pub fn validate(policy: &Policy, cluster: &dyn Cluster, w: &Workload<'_>) -> Validated {
    let mut out = Validated {
        allowed: true,
        ..Default::default()
    };
    let subject = subject(w.kind, w.object);
    let name = workload_name(w.object);
    let controller = optout::is_controller(policy, w.who.username);
    // An audit's workload, whose creator nothing records: no approval can be held to them.
    let unknown = w.who.is_unknown();
    let built = match build(cluster, w, name) {
        None => None,
        Some(Ok(b)) => Some(b),
        // What tollgate does not know never refuses: allowed, and said so.
        Some(Err(m)) => {
            out.warnings.push(missing_warning(&subject, &m));
            out.unresolved.extend(m.unresolved);
            return out;
        }
    };
    let src = Source::of(w, built.as_ref());
    let all = judging(policy, cluster, w, src, name);
    if all.is_empty() {
        out.warnings.push(no_template_warning(w, &subject));
        return out;
    }
    let queue = kueue_queue(w, cluster);
    let queued = queue.is_some();
    let mut forged = vec![];
    let mut findings: Vec<(Finding<'_>, &Policy)> = vec![];
    let mut verdicts: Vec<Verdict> = vec![];
    let mut audit: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for j in all {
        let p = j.policy;
        let here = with_template(&subject, &j.t);
        out.unresolved.extend(j.unresolved.clone());
        if let Some(warning) = &j.warning {
            out.warnings.push(prefixed(&here, warning));
        }
        let key = &p.opt_out.approval_annotation;
        let annotations = j.t.annotations();
        let asked = pod::is_true(annotations.as_ref(), &p.opt_out.annotation);
        let approval = approval_of(p, j.t.value);
        let verdict = |decision| TemplateVerdict {
            template: j.t.display().to_owned(),
            pointer: j.t.pointer.clone(),
            decision,
        };
        let mut judged = TemplateJudged {
            verdict: verdict("unchanged"),
            label: j.t.label.clone(),
            profile: j.profile.map(str::to_owned),
            opt_out: None,
            approved_for: approval.map(str::to_owned),
            judgement: None,
            unreadable: None,
            pods: pod_count(&j.t, src.object),
            enforce: p.feasibility.mode == FeasibilityMode::Enforce,
        };
        if !controller && !unknown {
            let expected = if !j.changed {
                j.old.and_then(|o| approval_of(p, o))
            } else if asked && optout::permitted(p, &w.who).is_ok() {
                Some(w.who.username)
            } else {
                None
            };
            if let Some(v) = approval.filter(|v| Some(*v) != expected) {
                forged.push(format!(
                    "  - {}: {key}: {v:?}, an approval only tollgate's mutating webhook gives, to a requester who may opt out there",
                    j.t.display()
                ));
                out.templates.push(verdict("denied"));
                judged.verdict = verdict("denied");
                out.judged.push(judged);
                continue;
            }
        }
        if !j.changed {
            out.templates.push(verdict("unchanged"));
            out.judged.push(judged);
            continue;
        }
        // The opt-out the pods will get: a controller's by the approval it carries; a
        // person's by who they are, once the mutating webhook has approved it; an unknown
        // requester's as far as it can be told.
        let opt_out = if controller || unknown || !asked {
            optout::decide_for(p, annotations.as_ref(), &w.who)
        } else {
            match optout::permitted(p, &w.who) {
                Err(why) => OptOut::Refused(why),
                Ok(()) if approval == Some(w.who.username) => OptOut::Honoured,
                Ok(()) => OptOut::Refused(format!(
                    "the pod template carries no {key} (tollgate's mutating webhook approves the opt-out there), so its pods could not opt out"
                )),
            }
        };
        judged.opt_out = Some(opt_out.clone());
        if opt_out == OptOut::Honoured {
            out.warnings.push(format!(
                "tollgate: {here}: its pods opt out ({}); their resource requests will not be checked",
                p.opt_out.annotation
            ));
            audit
                .entry("opt-out".into())
                .or_default()
                .push(j.t.lead(&optout::audit_note(&w.who)));
            out.opt_out = Some(OptOut::Honoured);
            verdicts.push(Verdict::OptedOut);
            out.templates.push(verdict("opted-out"));
            judged.verdict = verdict("opted-out");
            out.judged.push(judged);
            continue;
        }
        let mut pod = match pod_of(w.kind, &j.t, name, w.who.namespace) {
            Ok(p) => p,
            Err(e) => {
                out.warnings.push(format!(
                    "tollgate: {here}: could not read the pod template ({e}); its pods will be judged when they are created"
                ));
                out.templates.push(verdict("unreadable"));
                judged.verdict = verdict("unreadable");
                judged.unreadable = Some(e);
                out.judged.push(judged);
                continue;
            }
        };
        // The pods it will make, judged as a cluster with both webhooks judges a pod:
        // created by the controller, with the opt-out decided here.
        let judgement = judge::pod(
            &judge::Subject {
                policy: p,
                profile: j.profile,
                who: w.who,
                operation: Operation::Create,
                opt_out: Some(opt_out.clone()),
                template: true,
                queued,
                placement: None,
            },
            cluster,
            &mut pod,
            Stages::Both,
            false,
        );
        let decision = judgement
            .validation
            .clone()
            .unwrap_or_else(validate::Decision::skipped);
        out.unresolved.extend(judgement.unresolved.iter().cloned());
        if let Some(m) = &judgement.mutation {
            out.warnings
                .extend(m.warnings.iter().map(|m| prefixed(&here, m)));
        }
        out.warnings
            .extend(decision.warnings.iter().map(|m| prefixed(&here, m)));
        for (k, v) in &decision.audit_annotations {
            audit.entry(k.clone()).or_default().push(j.t.lead(v));
        }
        if let OptOut::Refused(why) = &opt_out {
            if out.opt_out.is_none() {
                out.opt_out = Some(OptOut::Refused(why.clone()));
            }
        }
        verdicts.push(decision.verdict);
        let decided = if decision.allowed {
            "allowed"
        } else {
            "denied"
        };
        out.templates.push(verdict(decided));
        judged.verdict = verdict(decided);
        let unread = judgement.unread_claims.clone();
        judged.judgement = Some(judgement);
        out.judged.push(judged);
        if !decision.allowed {
            findings.push((
                Finding {
                    t: j.t,
                    missing: decision.missing,
                    opt_out,
                    unread,
                },
                p,
            ));
        }
    }
    if !forged.is_empty() {
        verdicts.push(Verdict::ForgedApproval);
    }
    let never = feasibility(w, cluster, &subject, queue.as_deref(), &mut out);
    if !never.is_empty() {
        verdicts.push(Verdict::Infeasible);
    }
    out.verdict = [
        Verdict::ForgedApproval,
        Verdict::MissingRequests,
        Verdict::Infeasible,
        Verdict::Passed,
        Verdict::OptedOut,
    ]
    .into_iter()
    .find(|v| verdicts.contains(v))
    .or((!verdicts.is_empty()).then_some(Verdict::Skipped));
    out.audit_annotations = audit.into_iter().map(|(k, v)| (k, v.join("; "))).collect();
    let mut message = vec![];
    if !forged.is_empty() {
        let key = &policy.opt_out.approval_annotation;
        message.push(format!(
            "{subject} carries tollgate's opt-out approval where tollgate did not give it:\n{}\nRemove {key} from the pod template: tollgate sets it itself when the opt-out is permitted.",
            forged.join("\n")
        ));
    }
    if let Some((_, p)) = findings.first() {
        let single = findings.len() == 1 && findings[0].0.t.label.is_none();
        let parts: Vec<Part<'_>> = findings
            .iter()
            .map(|(f, _)| Part {
                template: if single { None } else { Some(f.t.display()) },
                missing: &f.missing,
                opt_out: &f.opt_out,
            })
            .collect();
        let mut m = validate::denial_message(p, "", Some(&subject), &parts, &w.who);
        for (f, _) in &findings {
            for claim in &f.unread {
                m.push('\n');
                m.push_str(&f.t.lead(&validate::UNREAD_CLAIM_LINE.fill(&[("claim", claim)])));
            }
        }
        message.push(m);
    }
    if !never.is_empty() {
        let mut m = String::new();
        validate::INFEASIBLE_HEADLINE.fill_into(&mut m, &[("subject", &subject)]);
        for line in &never {
            m.push('\n');
            validate::INFEASIBLE_LINE.fill_into(&mut m, &[("finding", line)]);
        }
        message.push(m);
    }
    if !message.is_empty() {
        out.allowed = false;
        out.message = Some(message.join("\n\n"));
    }
    out
}

/// Whether the workload's pods can run, from what each template's judgement found: what
/// rules out one pod of a template, and the quotas held to its pods in all (at once for a
/// kind whose pods must run together; otherwise they run in turns, which is only said).
/// The Kueue queue a workload is submitted to (`kueue.x-k8s.io/queue-name`), where the
/// context tracks Kueue's queues. Kueue admits a workload whole, within its LocalQueue's
/// ClusterQueue: that, rather than the namespace's ResourceQuotas, is what its pods in all
/// are held to. Without the queues (Kueue not installed, or not watched) the namespace's
/// quotas are what tollgate can judge.
fn kueue_queue(w: &Workload<'_>, cluster: &dyn Cluster) -> Option<String> {
    labels_of(w.object)
        .remove(feasible::KUEUE_QUEUE_LABEL)
        .filter(|q| !q.is_empty())
        .filter(|q| cluster.kueue_local_queue(w.who.namespace, q).is_some())
}

/// Every finding goes to `out.feasibility`, and its warnings to `out.warnings`; what
/// refuses the workload (a finding of `never` under `enforce`) is returned, a line each.
fn feasibility(
    w: &Workload<'_>,
    cluster: &dyn Cluster,
    subject: &str,
    queue: Option<&str>,
    out: &mut Validated,
) -> Vec<String> {
    if let Some(manager) = managed_elsewhere(w.object) {
        // MultiKueue (or another controller) runs it: this cluster's quotas, nodes and
        // queues say nothing of where its pods will run.
        out.warnings.push(format!(
            "tollgate: {subject} is managed by {}: its pods run where that controller puts them (for MultiKueue, on a worker cluster), so this cluster's quotas and nodes were not held to it",
            crate::words::quote(&manager)
        ));
        return vec![];
    }
    // Kueue's partial admission: a Job whose pods Kueue may admit fewer of, down to this.
    let partial = partial_admission(w);
    let mut kueue_min_total = Usage::default();
    let mut kueue_min_pods: i128 = 0;
    let mut found: Vec<(feasible::Finding, bool)> = vec![];
    let mut unknown: Vec<String> = vec![];
    // The quotas its pods are held to together: what they ask in all, how many they are,
    // and whether any of their policies enforces.
    let mut together: Vec<(Arc<ResourceQuota>, Usage, i128, bool)> = vec![];
    let mut kueue_total = Usage::default();
    let mut kueue_pods: i128 = 0;
    let mut kueue_enforce = false;
    for t in &out.judged {
        let Some(f) = t.judgement.as_ref().and_then(|j| j.feasibility.as_ref()) else {
            continue;
        };
        let lead = |m: &str| match &t.label {
            Some(l) => format!("{l}: {m}"),
            None => m.to_owned(),
        };
        for finding in &f.findings {
            found.push((
                feasible::Finding {
                    never: finding.never,
                    in_turns: finding.in_turns,
                    message: lead(&finding.message),
                },
                t.enforce,
            ));
        }
        for u in &f.unknown {
            if !unknown.contains(u) {
                unknown.push(u.clone());
            }
        }
        let all = f.usage.times(t.pods);
        if queue.is_some() {
            kueue_total.add(&all);
            kueue_pods += t.pods;
            kueue_enforce |= t.enforce;
            let least = partial.map_or(t.pods, |min| min.min(t.pods));
            kueue_min_total.add(&f.usage.times(least));
            kueue_min_pods += least;
            continue;
        }
        if t.pods <= 1 && !w.kind.together {
            continue;
        }
        for q in &f.quotas {
            if w.kind.together {
                match together.iter_mut().find(|(x, ..)| x.metadata == q.metadata) {
                    Some((_, usage, pods, enforce)) => {
                        usage.add(&all);
                        *pods += t.pods;
                        *enforce |= t.enforce;
                    }
                    None => together.push((q.clone(), all.clone(), t.pods, t.enforce)),
                }
                continue;
            }
            // Pods that need not run together: over the quota in all, they run in turns.
            for o in feasible::over(q, &all, t.pods) {
                let message = match &o.in_use {
                    _ if o.never => format!(
                        "{} allows {}: {}, and its {} pods ask for {} in all: they will run in turns, not all at once",
                        feasible::quota_subject(q),
                        o.key,
                        o.limit,
                        t.pods,
                        o.asked
                    ),
                    in_use => format!(
                        "{}: {} of {} {} are in use now, and its {} pods ask for {}: some wait until enough is freed",
                        feasible::quota_subject(q),
                        in_use.as_deref().unwrap_or("?"),
                        o.limit,
                        o.key,
                        t.pods,
                        o.asked
                    ),
                };
                found.push((
                    feasible::Finding {
                        never: false,
                        in_turns: o.never,
                        message: lead(&message),
                    },
                    false,
                ));
            }
        }
    }
    if let Some(queue) = &queue {
        let ns = w.who.namespace;
        match feasible::kueue(queue, ns, cluster, &kueue_total, kueue_pods) {
            // Partially admissible: what must fit is the least Kueue admits it with.
            Ok(findings) if kueue_min_pods < kueue_pods && findings.iter().any(|f| f.never) => {
                match feasible::kueue(queue, ns, cluster, &kueue_min_total, kueue_min_pods) {
                    Ok(least) if least.iter().any(|f| f.never) => found.extend(least.into_iter().map(|mut f| {
                        f.message = format!(
                            "even at the {kueue_min_pods} pods of its {PARTIAL_ADMISSION} annotation, {}",
                            f.message
                        );
                        (f, kueue_enforce)
                    })),
                    Ok(least) => {
                        found.extend(least.into_iter().map(|f| (f, kueue_enforce)));
                        found.push((
                            feasible::Finding {
                                never: false,
                                in_turns: true,
                                message: format!(
                                    "its {kueue_pods} pods do not fit its Kueue ClusterQueue all at once, but its {PARTIAL_ADMISSION} annotation lets Kueue admit it with fewer (at least {kueue_min_pods}): it runs with fewer pods at a time"
                                ),
                            },
                            false,
                        ));
                    }
                    Err(what) => unknown.push(what),
                }
            }
            Ok(findings) => found.extend(findings.into_iter().map(|f| (f, kueue_enforce))),
            Err(what) => unknown.push(what),
        }
    }
    let copies = copies_of(w);
    for (q, usage, pods, enforce) in &together {
        let one = feasible::over(q, usage, *pods);
        // Copies that each fit, but not all at once: fewer run at a time.
        if copies > 1 && one.is_empty() {
            for o in feasible::over(q, &usage.times(copies), pods.saturating_mul(copies)) {
                found.push((
                    feasible::Finding {
                        never: false,
                        in_turns: o.never,
                        message: format!(
                            "{} allows {}: {}, and {copies} at once ({}: {copies}) of its {pods} pods that run together ask for {} in all: fewer than {copies} run at a time",
                            feasible::quota_subject(q),
                            o.key,
                            o.limit,
                            w.kind.copies,
                            o.asked
                        ),
                    },
                    false,
                ));
            }
        }
        for o in one {
            let message = if o.never {
                format!(
                    "{} allows {}: {}, and its {pods} pods, which must run together, ask for {} in all: it can never run. Lower the replicas or what each pod asks for, or ask your platform team to raise the quota",
                    feasible::quota_subject(q),
                    o.key,
                    o.limit,
                    o.asked
                )
            } else {
                format!(
                    "{}: {} of {} {} are in use now, and its {pods} pods, which must run together, ask for {}: it waits until enough is freed",
                    feasible::quota_subject(q),
                    o.in_use.as_deref().unwrap_or("?"),
                    o.limit,
                    o.key,
                    o.asked
                )
            };
            found.push((
                feasible::Finding {
                    never: o.never,
                    in_turns: false,
                    message,
                },
                *enforce,
            ));
        }
    }
    let mut never = vec![];
    for (f, enforce) in &found {
        if f.never && *enforce {
            never.push(f.message.clone());
            continue;
        }
        out.warnings.push(f.warning(subject));
    }
    if !unknown.is_empty() {
        out.warnings.push(validate::UNKNOWN_WARNING.fill(&[
            ("subject", subject),
            ("what", &crate::words::join_words(&unknown)),
        ]));
    }
    out.feasibility = found.into_iter().map(|(f, _)| f).collect();
    never
}

/// A TrainingRuntime or ClusterTrainingRuntime judged at apply (and by `review`): as a
/// TrainJob on it would make its pods, through the policy's TrainJob kind (None where the
/// policy has none, or `runtime` is not a runtime). What no TrainJob can supply is said of
/// each step: the runtime is judged as the TrainJob whose `resourcesPerNode` requests every
/// resource the policy requires, so that what the TrainJob reaches (the trainer step's
/// `node` container) is never blamed on the runtime, and every container still lacking a
/// request is one each TrainJob on the runtime will be refused for. Never refused: runtimes
/// are installed cluster-wide, often by the Trainer's own manifests; a warning says it.
pub fn validate_runtime(
    policy: &Policy,
    cluster: &dyn Cluster,
    runtime: &Value,
    who: Requester<'_>,
) -> Option<Validated> {
    let kind = policy
        .workloads
        .kinds
        .iter()
        .find(|k| k.group == trainjob::GROUP && k.kind == "TrainJob" && k.from.is_some())?;
    let runtime_kind = runtime.get("kind").and_then(Value::as_str)?;
    if !matches!(runtime_kind, "TrainingRuntime" | "ClusterTrainingRuntime") {
        return None;
    }
    let name = runtime.pointer("/metadata/name").and_then(Value::as_str)?;
    let mut required: Vec<&str> = policy
        .validation
        .required_requests
        .iter()
        .map(String::as_str)
        .collect();
    for p in policy.profiles.iter().filter_map(|p| p.policy()) {
        required.extend(p.validation.required_requests.iter().map(String::as_str));
    }
    required.sort_unstable();
    required.dedup();
    let requests: Map<String, Value> = required
        .iter()
        .map(|r| ((*r).to_owned(), Value::from("1")))
        .collect();
    let trainjob = serde_json::json!({
        "apiVersion": format!("{}/v1alpha1", trainjob::GROUP),
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": who.namespace},
        "spec": {
            "runtimeRef": {"apiGroup": trainjob::GROUP, "kind": runtime_kind, "name": name},
            "trainer": {"resourcesPerNode": {"requests": requests}},
        },
    });
    // The runtime being judged, in front of what the review knows: at its creation it is
    // in no cache yet.
    let mut this_runtime = Objects::default();
    let runtime_arc = Arc::new(runtime.clone());
    if runtime_kind == "ClusterTrainingRuntime" {
        this_runtime
            .cluster_training_runtimes
            .insert(name.to_owned(), runtime_arc);
    } else {
        this_runtime
            .training_runtimes
            .insert((who.namespace.to_owned(), name.to_owned()), runtime_arc);
    }
    let known = Layered {
        first: &this_runtime,
        then: cluster,
    };
    let w = Workload {
        kind,
        object: &trainjob,
        old: None,
        operation: Operation::Create,
        who,
    };
    let judged = validate(policy, &known, &w);
    let subject = format!("{} {name:?}", runtime_kind.to_ascii_lowercase());
    let mut out = Validated {
        allowed: true,
        verdict: judged.verdict,
        templates: judged.templates,
        unresolved: judged.unresolved,
        ..Default::default()
    };
    for t in &judged.judged {
        let Some(d) = t.judgement.as_ref().and_then(|j| j.validation.as_ref()) else {
            continue;
        };
        let here = match &t.label {
            Some(l) => format!("{subject}, {l}"),
            None => subject.clone(),
        };
        for m in &d.missing {
            out.warnings.push(format!(
                "tollgate: {here}: {} {:?} has no request for {}, and no TrainJob can give it one (spec.trainer.resourcesPerNode reaches only the {:?} container of the trainer step): every TrainJob on this runtime is refused until the runtime sets it",
                m.noun,
                m.container,
                crate::words::join_words(&m.resources),
                trainjob::NODE
            ));
        }
    }
    out.judged = judged.judged;
    Some(out)
}

/// How many copies of its pods a workload runs at once (its kind's `copies`; 1 where the
/// kind has none, or the path is absent or not a positive number).
fn copies_of(w: &Workload<'_>) -> i128 {
    if w.kind.copies.is_empty() {
        return 1;
    }
    at(w.object, &w.kind.copies)
        .and_then(Value::as_i64)
        .filter(|n| *n >= 1)
        .map_or(1, i128::from)
}

/// Kueue's partial admission of a batch/v1 Job: with this annotation Kueue may admit it
/// with its parallelism lowered down to the annotation's value (which Kueue's webhook holds
/// between 1 and the parallelism less one).
pub const PARTIAL_ADMISSION: &str = "kueue.x-k8s.io/job-min-parallelism";

/// The least parallelism Kueue may admit a Job with, where it allows partial admission.
fn partial_admission(w: &Workload<'_>) -> Option<i128> {
    if (w.kind.group.as_str(), w.kind.kind.as_str()) != ("batch", "Job") {
        return None;
    }
    w.object
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(PARTIAL_ADMISSION))
        .and_then(Value::as_str)
        .and_then(|v| v.trim().parse::<i128>().ok())
        .filter(|n| *n >= 1)
}

/// Where a workload says another controller runs it (`spec.managedBy`, or a Kubeflow
/// job's `spec.runPolicy.managedBy`): MultiKueue's `kueue.x-k8s.io/multikueue`, or any
/// value but the kind's own controller's. None: this cluster's controller runs it.
fn managed_elsewhere(object: &Value) -> Option<String> {
    const OWN: &[&str] = &[
        "kubernetes.io/job-controller",
        "jobset.sigs.k8s.io/jobset-controller",
        "trainer.kubeflow.org/trainjob-controller",
        "kubeflow.org/training-operator",
        "kubeflow.org/mpi-operator",
        "ray.io/kuberay-operator",
    ];
    // `get` rather than `pointer`, which unescapes (allocates) every token: this runs on
    // every workload's review.
    let spec = object.get("spec")?;
    [
        spec.get("managedBy"),
        spec.get("runPolicy").and_then(|r| r.get("managedBy")),
    ]
    .into_iter()
    .flatten()
    .find_map(Value::as_str)
    .filter(|m| !m.is_empty() && !OWN.contains(m))
    .map(str::to_owned)
}

/// An object's labels (`metadata.labels`, string values only, as the apiserver allows).
pub fn labels_of(object: &Value) -> BTreeMap<String, String> {
    string_map(object.pointer("/metadata/labels"))
}

/// A JSON object of strings (labels, annotations) as a map; other values are left out.
pub fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Objects, Offline};
    use serde_json::json;

    fn fixture(name: &str) -> Value {
        let body = std::fs::read(crate::testdata::fixtures_dir().join(name)).unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    fn who<'a>(user: &'a str, groups: &'a [String]) -> Requester<'a> {
        Requester::new("ml", user, groups)
    }

    #[test]
    fn templates_are_named_from_their_paths_and_get_the_controllers_labels() {
        let policy = Policy::builtin();
        let review = fixture("bert-finetune-pytorchjob.validate.json");
        let object = &review["request"]["object"];
        let kind = policy
            .workloads
            .kind("kubeflow.org", "v1", "PyTorchJob")
            .unwrap();
        let found = templates(kind, object);
        let labels: Vec<_> = found.iter().map(|t| t.label.clone().unwrap()).collect();
        assert_eq!(labels, ["replica Master", "replica Worker"]);
        assert_eq!(
            found[1].pointer,
            "/spec/pytorchReplicaSpecs/Worker/template"
        );
        let pod = pod_of(kind, &found[1], "bert-finetune", "ml").unwrap();
        let l = pod.metadata.labels.unwrap();
        assert_eq!(l["training.kubeflow.org/job-name"], "bert-finetune");
        assert_eq!(l["training.kubeflow.org/replica-type"], "worker");
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ml"));
        assert_eq!(
            pod.metadata.generate_name.as_deref(),
            Some("bert-finetune-")
        );
        assert_eq!(
            pod.spec.unwrap().init_containers.unwrap()[0].name,
            "fetch-shards"
        );

        let job = policy.workloads.kind("batch", "v1", "Job").unwrap();
        let review = fixture("hparam-trial-job.mutate.json");
        let found = templates(job, &review["request"]["object"]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].label, None, "a Job's one template needs no name");
    }

    #[test]
    fn an_update_changes_a_template_unless_only_the_approval_differs() {
        let key = "tollgate.dev/opt-out-approved-by";
        let a = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": []}});
        let stamped = json!({"metadata": {"labels": {"app": "x"}, "annotations": {key: "alice"}}, "spec": {"containers": []}});
        let bare = json!({"spec": {"containers": []}, "metadata": {"labels": {"app": "x"}, "annotations": {}}});
        assert!(same_template(key, &a, &stamped));
        assert!(same_template(key, &stamped, &bare));
        let relabelled = json!({"metadata": {"labels": {"app": "y"}}, "spec": {"containers": []}});
        assert!(!same_template(key, &a, &relabelled));
        let annotated = json!({"metadata": {"labels": {"app": "x"}, "annotations": {"tollgate.dev/opt-out": "true"}}, "spec": {"containers": []}});
        assert!(!same_template(key, &a, &annotated));
        let respec = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{}]}});
        assert!(!same_template(key, &a, &respec));
    }

    fn opting_out_job() -> Value {
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"template": {
                "metadata": {"annotations": {"tollgate.dev/opt-out": "true"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "t", "image": "i"}]}
            }}
        })
    }

    fn apply(object: &Value, patch: &[u8]) -> Value {
        let patch: json_patch::Patch = serde_json::from_slice(patch).unwrap();
        let mut doc = object.clone();
        json_patch::patch(&mut doc, &patch).unwrap();
        doc
    }

    #[test]
    fn the_approval_is_given_to_who_may_opt_out_once_and_refused_to_others() {
        let policy = Policy::builtin();
        let kind = policy.workloads.kind("batch", "v1", "Job").unwrap();
        let masters = vec!["system:masters".to_owned()];
        let none: Vec<String> = vec![];
        let job = opting_out_job();
        let w = Workload {
            kind,
            object: &job,
            old: None,
            operation: Operation::Create,
            who: who("alice", &masters),
        };
        let m = mutate(&policy, &Offline, &w);
        let stamped = apply(&job, m.patch.as_deref().unwrap());
        assert_eq!(
            stamped
                .pointer("/spec/template/metadata/annotations/tollgate.dev~1opt-out-approved-by"),
            Some(&json!("alice"))
        );
        let again = Workload {
            object: &stamped,
            ..w
        };
        assert!(
            mutate(&policy, &Offline, &again).patch.is_none(),
            "idempotent"
        );
        let v = validate(&policy, &Offline, &again);
        assert!(v.allowed, "{:?}", v.message);
        assert_eq!(v.opt_out, Some(OptOut::Honoured));

        // Bob may not: the approval Alice's Job carries is removed, or refused.
        let bob = Workload {
            object: &stamped,
            who: who("bob", &none),
            ..w
        };
        let m = mutate(&policy, &Offline, &bob);
        let cleaned = apply(&stamped, m.patch.as_deref().unwrap());
        assert_eq!(
            cleaned.pointer("/spec/template/metadata/annotations"),
            Some(&json!({"tollgate.dev/opt-out": "true"}))
        );
        let v = validate(&policy, &Offline, &bob);
        assert!(!v.allowed);
        assert!(v
            .message
            .unwrap()
            .contains("tollgate.dev/opt-out-approved-by: \"alice\""));

        // A controller keeps what it came with, and is judged by it.
        let controller = Workload {
            object: &stamped,
            who: who(
                "system:serviceaccount:kube-system:cronjob-controller",
                &none,
            ),
            ..w
        };
        assert!(mutate(&policy, &Offline, &controller).patch.is_none());
        let v = validate(&policy, &Offline, &controller);
        assert!(v.allowed);
        assert_eq!(v.opt_out, Some(OptOut::Honoured));
    }

    fn torch_runtime() -> Objects {
        let mut o = Objects::complete();
        o.add_training_runtime(json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "ClusterTrainingRuntime",
            "metadata": {"name": "torch-distributed"},
            "spec": {"template": {"spec": {"replicatedJobs": [{
                "name": "node",
                "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                    "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "i"}]}}}
                }
            }]}}}
        }));
        o
    }

    #[test]
    fn a_trainjobs_approval_goes_into_an_override_of_its_own() {
        let policy = Policy::builtin();
        let kind = policy
            .workloads
            .kind("trainer.kubeflow.org", "v1alpha1", "TrainJob")
            .unwrap();
        let cluster = torch_runtime();
        let masters = vec!["system:masters".to_owned()];
        let none: Vec<String> = vec![];
        let key = "tollgate.dev/opt-out-approved-by";
        // Trainer v2.2 on: asked in a runtime patch that also carries a forged approval.
        let job = json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "t", "namespace": "ml"},
            "spec": {
                "runtimeRef": {"name": "torch-distributed"},
                "runtimePatches": [{
                    "manager": "example.io/team",
                    "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                        "name": "node",
                        "template": {"spec": {"template": {"metadata": {"annotations": {
                            "tollgate.dev/opt-out": "true", key: "mallory"
                        }}}}}
                    }]}}}
                }]
            }
        });
        let w = Workload {
            kind,
            object: &job,
            old: None,
            operation: Operation::Create,
            who: who("alice", &masters),
        };
        let m = mutate(&policy, &cluster, &w);
        assert_eq!(m.templates[0].decision, "approved");
        let stamped = apply(&job, m.patch.as_deref().unwrap());
        let patches = stamped["spec"]["runtimePatches"].as_array().unwrap();
        assert_eq!(patches.len(), 2);
        let annotations = |p: &Value| {
            p.pointer("/trainingRuntimeSpec/template/spec/replicatedJobs/0/template/spec/template/metadata/annotations")
                .cloned()
        };
        assert_eq!(
            annotations(&patches[0]),
            Some(json!({"tollgate.dev/opt-out": "true"}))
        );
        assert_eq!(patches[1]["manager"], key);
        assert_eq!(annotations(&patches[1]), Some(json!({key: "alice"})));
        let again = Workload {
            object: &stamped,
            ..w
        };
        assert!(
            mutate(&policy, &cluster, &again).patch.is_none(),
            "idempotent"
        );
        let v = validate(&policy, &cluster, &again);
        assert!(v.allowed, "{:?}", v.message);
        assert_eq!(v.opt_out, Some(OptOut::Honoured));
        // Bob may not: the approval is removed, or refused.
        let bob = Workload {
            object: &stamped,
            who: who("bob", &none),
            ..w
        };
        let cleaned = apply(
            &stamped,
            mutate(&policy, &cluster, &bob).patch.as_deref().unwrap(),
        );
        assert_eq!(
            cleaned["spec"]["runtimePatches"].as_array().unwrap().len(),
            1
        );
        assert!(!validate(&policy, &cluster, &bob).allowed);

        // Trainer v2.1: asked in podTemplateOverrides, approved in an override of its own.
        let job = json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "t", "namespace": "ml"},
            "spec": {
                "runtimeRef": {"name": "torch-distributed"},
                "podTemplateOverrides": [{
                    "targetJobs": [{"name": "node"}],
                    "metadata": {"annotations": {"tollgate.dev/opt-out": "true"}}
                }]
            }
        });
        let w = Workload { object: &job, ..w };
        let stamped = apply(
            &job,
            mutate(&policy, &cluster, &w).patch.as_deref().unwrap(),
        );
        assert_eq!(
            stamped["spec"]["podTemplateOverrides"][1],
            json!({"targetJobs": [{"name": "node"}], "metadata": {"annotations": {key: "alice"}}})
        );
        assert!(stamped["spec"].get("runtimePatches").is_none());
        let again = Workload {
            object: &stamped,
            ..w
        };
        assert!(
            mutate(&policy, &cluster, &again).patch.is_none(),
            "idempotent"
        );
        assert_eq!(
            validate(&policy, &cluster, &again).opt_out,
            Some(OptOut::Honoured)
        );
    }

    #[test]
    fn a_trainjob_whose_runtime_is_not_known_is_allowed_and_named() {
        let policy = Policy::builtin();
        let kind = policy
            .workloads
            .kind("trainer.kubeflow.org", "v1alpha1", "TrainJob")
            .unwrap();
        let none: Vec<String> = vec![];
        let job = json!({"metadata": {"name": "t"}, "spec": {"runtimeRef": {"name": "torch-distributed"}}});
        let w = Workload {
            kind,
            object: &job,
            old: None,
            operation: Operation::Create,
            who: who("bob", &none),
        };
        let v = validate(&policy, &Objects::default(), &w);
        assert!(v.allowed);
        assert_eq!(v.unresolved.len(), 1);
        assert!(
            v.warnings[0]
                .contains("does not know its runtime ClusterTrainingRuntime \"torch-distributed\""),
            "{:?}",
            v.warnings
        );
        let m = mutate(&policy, &Objects::default(), &w);
        assert!(m.patch.is_none());
        assert_eq!(
            m.unresolved, v.unresolved,
            "the shell fetches it for either webhook"
        );
    }

    #[test]
    fn an_unchanged_template_keeps_its_approval_as_it_was() {
        let policy = Policy::builtin();
        let kind = policy.workloads.kind("batch", "v1", "Job").unwrap();
        let none: Vec<String> = vec![];
        let old = opting_out_job();
        // Bob adds only the approval to a template he did not otherwise change.
        let mut forged = old.clone();
        forged["spec"]["template"]["metadata"]["annotations"]["tollgate.dev/opt-out-approved-by"] =
            json!("bob");
        let w = Workload {
            kind,
            object: &forged,
            old: Some(&old),
            operation: Operation::Update,
            who: who("bob", &none),
        };
        let m = mutate(&policy, &Offline, &w);
        assert_eq!(apply(&forged, m.patch.as_deref().unwrap()), old);
        assert_eq!(m.templates[0].decision, "approval-restored");
        assert!(!validate(&policy, &Offline, &w).allowed);
        // Scaling leaves it alone, unjudged.
        let mut scaled = old.clone();
        scaled["spec"]["parallelism"] = json!(3);
        let w = Workload {
            object: &scaled,
            ..w
        };
        assert!(mutate(&policy, &Offline, &w).patch.is_none());
        let v = validate(&policy, &Offline, &w);
        assert!(v.allowed);
        assert_eq!(v.verdict, None);
        assert_eq!(v.templates[0].decision, "unchanged");
    }
}

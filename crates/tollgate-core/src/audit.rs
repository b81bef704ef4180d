//! What an object already in the cluster breaks or lacks, judged as a CREATE of it would be
//! judged today: the findings of `tollgate audit` and of the server's background audit.
//!
//! An object read from the cluster is not the object its author sent: the apiserver, the
//! scheduler and the kubelet have written to it since. [`as_created`] takes back what they
//! add after creation, so that [`judge`] runs the [`pipeline`] on the pod the webhooks
//! would have seen, and [`findings`] turns what the webhooks said into data: refused and
//! why, what each mutation step would add, and what became of an opt-out.
//!
//! Who created an existing object is not recorded anywhere an audit can read. The review
//! is made by [`UNKNOWN_USER`], an authenticated user no policy names, and an opt-out the
//! policy would honour only for some requesters is reported as
//! [`OptOutState::Unverified`] and judged as not honoured (see [`opt_out_state`]). A pod
//! a controller made, and the pods a workload's templates will make, are reviewed as the
//! controller's requests ([`controller_user`]): tollgate's approval in them decides.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use crate::cluster::Cluster;
use crate::mutate::Step;
use crate::optout::OptOut;
use crate::pipeline::{self, Judged, PipelineError, Stage};
use crate::policy::{Mode, Policy, WorkloadKind};
use crate::requester::Requester;
use crate::validate::Missing;
use crate::{glob, optout, workload};

/// The requester of an audited object's review: nobody in particular. Empty, so that no
/// user glob but `*` names it; its one group is `system:authenticated`, which every real
/// requester of a pod has too.
pub const UNKNOWN_USER: &str = "";

/// Fields the apiserver, the scheduler and the kubelet write after an object was created,
/// which the mutating webhook never saw: taken back out before the object is reviewed.
const SET_AFTER_CREATION: [&str; 8] = [
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

/// The object as its CREATE reached the mutating webhook: no uid, resourceVersion,
/// timestamps or managedFields; a pod also loses its status (the scheduler's and the
/// kubelet's), `spec.nodeName` (set by the binding) and `spec.ephemeralContainers` (added
/// by `kubectl debug` through a subresource). What users and controllers changed since
/// (labels, annotations, resources resized in place) stays: the audit judges the object as
/// it is now.
pub fn as_created(object: &mut Value) {
    let is_pod = object.get("kind").and_then(Value::as_str) == Some("Pod");
    let Some(o) = object.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(m)) = o.get_mut("metadata") {
        for k in SET_AFTER_CREATION {
            m.remove(k);
        }
    }
    if is_pod {
        // A pod CREATE carries an empty status, as the apiserver's fixtures show.
        o.insert("status".into(), json!({}));
        if let Some(Value::Object(spec)) = o.get_mut("spec") {
            spec.remove("nodeName");
            spec.remove("ephemeralContainers");
        }
    } else {
        o.remove("status");
    }
}

/// The object an audit finding is about, as a PolicyReport's `resources[]` names it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl ObjectRef {
    pub fn of(object: &Value) -> ObjectRef {
        let s = |p: &str| {
            object
                .pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        ObjectRef {
            api_version: s("/apiVersion"),
            kind: s("/kind"),
            namespace: s("/metadata/namespace"),
            name: s("/metadata/name"),
            uid: s("/metadata/uid"),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
        })
    }
}

/// What a finding is about. The names are the `rule` of the JSON output and of the
/// PolicyReports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// The object could not be read as what it claims to be: the webhook would refuse it.
    Review,
    /// Validation: required resource requests.
    Requests,
    /// A mutation step that would change the object.
    Step(Step),
    /// The object asks to opt out.
    OptOut,
}

impl Rule {
    /// Every rule, in the order findings of one object are listed.
    pub const ALL: [Rule; 7] = [
        Rule::Review,
        Rule::Requests,
        Rule::Step(Step::Tolerations),
        Rule::Step(Step::DriverMounts),
        Rule::Step(Step::MetricsSidecar),
        Rule::Step(Step::DefaultResources),
        Rule::OptOut,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Review => "review",
            Rule::Requests => "requests",
            Rule::Step(s) => s.as_str(),
            Rule::OptOut => "opt-out",
        }
    }

    /// `refused`, `mutation` or `opt-out`: which question of the audit it answers.
    pub fn category(self) -> &'static str {
        match self {
            Rule::Review | Rule::Requests => "refused",
            Rule::Step(_) => "mutation",
            Rule::OptOut => "opt-out",
        }
    }
}

/// A finding's result, in the words of a PolicyReport result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    /// Would be refused (under `enforce`, whatever the policy's mode is now).
    Fail,
    /// Lacks what mutation would add, or an opt-out that is not (or not surely) honoured.
    Warn,
    /// Opted out, honoured: neither mutated nor checked.
    Skip,
    /// Could not be judged.
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Fail => "fail",
            Status::Warn => "warn",
            Status::Skip => "skip",
            Status::Error => "error",
        }
    }
}

/// What became of an object's opt-out annotation, for a requester the audit cannot know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptOutState {
    /// No opt-out asked.
    None,
    /// The policy honours it here for anyone: the object would be left alone.
    Honoured,
    /// The policy honours it for nobody here; the text says why.
    Refused(String),
    /// The policy honours it only for some requesters, and who created the object is not
    /// known: judged as not honoured (the text names who may).
    Unverified(String),
}

impl OptOutState {
    pub fn as_str(&self) -> &'static str {
        match self {
            OptOutState::None => "none",
            OptOutState::Honoured => "honoured",
            OptOutState::Refused(_) => "refused",
            OptOutState::Unverified(_) => "unverified",
        }
    }
}

/// One thing a mutation step would add to an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Added {
    Toleration(Value),
    Volume(String),
    VolumeMount {
        container: String,
        name: String,
        mount_path: String,
    },
    Env {
        container: String,
        name: String,
    },
    /// A container the object did not have; `native`: as an init container with
    /// `restartPolicy: Always`.
    Container {
        name: String,
        native: bool,
    },
    Limit {
        container: String,
        resource: String,
        value: String,
    },
    Request {
        container: String,
        resource: String,
        value: String,
    },
}

impl Added {
    pub fn to_json(&self) -> Value {
        match self {
            Added::Toleration(v) => json!({"kind": "toleration", "value": v}),
            Added::Volume(n) => json!({"kind": "volume", "name": n}),
            Added::VolumeMount {
                container,
                name,
                mount_path,
            } => {
                json!({"kind": "volumeMount", "container": container, "name": name, "mountPath": mount_path})
            }
            Added::Env { container, name } => {
                json!({"kind": "env", "container": container, "name": name})
            }
            Added::Container { name, native } => json!({
                "kind": "container",
                "name": name,
                "as": if *native { "nativeSidecar" } else { "container" },
            }),
            Added::Limit {
                container,
                resource,
                value,
            } => {
                json!({"kind": "limit", "container": container, "resource": resource, "value": value})
            }
            Added::Request {
                container,
                resource,
                value,
            } => {
                json!({"kind": "request", "container": container, "resource": resource, "value": value})
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Added::Toleration(v) => {
                let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
                let mut t = format!("toleration {}", s("key"));
                if !s("value").is_empty() {
                    t.push_str(&format!("={}", s("value")));
                }
                let effect = if s("effect").is_empty() {
                    "any effect"
                } else {
                    s("effect")
                };
                t.push_str(&format!(" ({}, {effect})", s("operator")));
                t
            }
            Added::Volume(n) => format!("volume {n:?}"),
            Added::VolumeMount {
                container,
                name,
                mount_path,
            } => format!("mount of {name:?} at {mount_path} in container {container:?}"),
            Added::Env { container, name } => format!("env {name} in container {container:?}"),
            Added::Container { name, native } => {
                if *native {
                    format!("sidecar {name:?} (native sidecar)")
                } else {
                    format!("container {name:?}")
                }
            }
            Added::Limit {
                container,
                resource,
                value,
            } => format!("limit {resource}: {value} on container {container:?}"),
            Added::Request {
                container,
                resource,
                value,
            } => format!("request {resource}: {value} on container {container:?}"),
        }
    }
}

/// One finding: an object, a rule, a result and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub rule: Rule,
    pub status: Status,
    /// One line for a person.
    pub message: String,
    /// For [`Rule::Requests`]: the containers and what they lack.
    pub missing: Vec<Missing>,
    /// For a mutation step: what it would add.
    pub adds: Vec<Added>,
}

/// An audited object: who it is, how the policy applies to it, and its findings (none: it
/// passes and lacks nothing).
#[derive(Debug, Clone)]
pub struct Audited {
    pub object: ObjectRef,
    /// The policy profile applied; None for the base policy.
    pub profile: Option<String>,
    /// The validation mode the policy applies to it today.
    pub mode: Mode,
    pub opt_out: OptOutState,
    /// In the order of [`Rule::ALL`].
    pub findings: Vec<Finding>,
    /// The webhooks' warnings (a claim that does not exist, a profile skipped, ...).
    pub warnings: Vec<String>,
}

impl Audited {
    /// Whether a CREATE of the object would be refused under `enforce`.
    pub fn refused(&self) -> bool {
        self.findings.iter().any(|f| f.status == Status::Fail)
    }

    /// Whether mutation would change the object.
    pub fn mutated(&self) -> bool {
        self.findings
            .iter()
            .any(|f| matches!(f.rule, Rule::Step(_)))
    }

    /// The JSON object of one finding of this object: the output of `tollgate audit
    /// --output json`, one line each (the fields are documented in the README).
    pub fn finding_json(&self, f: &Finding) -> Value {
        let mut v = json!({
            "object": self.object.to_json(),
            "rule": f.rule.as_str(),
            "category": f.rule.category(),
            "result": f.status.as_str(),
            "message": f.message,
            "optOut": self.opt_out.as_str(),
            "profile": self.profile.as_deref().unwrap_or(crate::policy::BASE_PROFILE),
            "mode": mode_str(self.mode),
        });
        if f.rule == Rule::Requests {
            v["missing"] = f
                .missing
                .iter()
                .map(|m| {
                    json!({"container": m.container, "containerType": m.noun, "resources": m.resources})
                })
                .collect();
        }
        if matches!(f.rule, Rule::Step(_)) {
            v["adds"] = f.adds.iter().map(Added::to_json).collect();
        }
        v
    }
}

pub fn mode_str(mode: Mode) -> &'static str {
    match mode {
        Mode::Enforce => "enforce",
        Mode::Warn => "warn",
        Mode::Audit => "audit",
    }
}

/// The review an audit runs for `object` (as [`as_created`] left it): a CREATE in its
/// namespace by [`UNKNOWN_USER`].
pub fn review_of(object: Value) -> Value {
    review_by(object, UNKNOWN_USER)
}

/// [`review_of`], requested by `user`.
fn review_by(object: Value, user: &str) -> Value {
    let mut review = pipeline::synthetic_review(&Value::Null, None, user, &[]);
    let namespace = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_owned();
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if let Some(r) = review.get_mut("request") {
        r["namespace"] = json!(namespace);
        r["name"] = json!(name);
        r["object"] = object;
    }
    review
}

/// Judges an object read from the cluster: as created, reviewed by the unknown requester
/// through the whole pipeline, its findings drawn.
pub fn judge(
    policy: &Policy,
    cluster: &dyn Cluster,
    mut object: Value,
) -> Result<Audited, PipelineError> {
    let who = ObjectRef::of(&object);
    as_created(&mut object);
    let (group, version) = pipeline::group_version(&who.api_version);
    if let Some(kind) = policy.workloads.kind(group, version, &who.kind) {
        return judge_workload(policy, cluster, who.clone(), &object, kind);
    }
    let by_controller = controlled(&object);
    judge_as_created(policy, cluster, who, object, by_controller)
}

/// Whether an object was made by a controller (an ownerReference with `controller: true`):
/// a Deployment's ReplicaSet, a Job's pod.
pub fn controlled(object: &Value) -> bool {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| {
            refs.iter()
                .any(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        })
}

/// The requester an audit reviews a controller's object as: a name the policy's first
/// `optOut.controllers` pattern matches (its `*` and `?` filled in), so that the object is
/// judged as its controller's request is, by the approval its template carries. None when
/// the policy names no controller.
pub fn controller_user(policy: &Policy) -> Option<String> {
    let first = policy.opt_out.controllers.first()?;
    Some(first.as_str().replace(['*', '?'], "x"))
}

fn judge_as_created(
    policy: &Policy,
    cluster: &dyn Cluster,
    who: ObjectRef,
    object: Value,
    by_controller: bool,
) -> Result<Audited, PipelineError> {
    let user = by_controller
        .then(|| controller_user(policy))
        .flatten()
        .unwrap_or_else(|| UNKNOWN_USER.to_owned());
    let review = review_by(object, &user);
    let judged = pipeline::run(policy, cluster, &review, Stage::All)?;
    Ok(findings(policy, who, &review, &judged))
}

/// A workload judged by the pods its templates will make: each as its controller would
/// create it (`workload::pod_of`), judged as a controller's pod is (its opt-out by the
/// approval the template carries), its findings led by the template's name
/// (`replica Worker: ...`). The workload's profile, mode and opt-out are its first
/// template's that has one.
fn judge_workload(
    policy: &Policy,
    cluster: &dyn Cluster,
    who: ObjectRef,
    object: &Value,
    kind: &WorkloadKind,
) -> Result<Audited, PipelineError> {
    let name = workload::workload_name(object);
    let mut out = Audited {
        object: who,
        profile: None,
        mode: policy.validation.mode,
        opt_out: OptOutState::None,
        findings: vec![],
        warnings: vec![],
    };
    let mut first = true;
    for t in workload::templates(kind, object) {
        let pod = workload::pod_of(kind, &t, name, &out.object.namespace)
            .and_then(|p| serde_json::to_value(p).map_err(|e| e.to_string()));
        let pod = match pod {
            Ok(p) => p,
            Err(e) => {
                out.findings.push(Finding {
                    rule: Rule::Review,
                    status: Status::Error,
                    message: t.lead(&format!("the template is not a pod spec: {e}")),
                    missing: vec![],
                    adds: vec![],
                });
                continue;
            }
        };
        let a = judge_as_created(policy, cluster, ObjectRef::default(), pod, true)?;
        if first {
            out.profile = a.profile;
            out.mode = a.mode;
            first = false;
        }
        if out.opt_out == OptOutState::None {
            out.opt_out = a.opt_out;
        }
        out.findings.extend(a.findings.into_iter().map(|mut f| {
            f.message = t.lead(&f.message);
            f
        }));
        out.warnings.extend(a.warnings);
    }
    // By rule, then in template order (a stable sort).
    out.findings
        .sort_by_key(|f| Rule::ALL.iter().position(|r| *r == f.rule));
    Ok(out)
}

/// The policy a profile stands for (the base policy for None or a name it lacks).
fn effective<'p>(policy: &'p Policy, profile: Option<&str>) -> &'p Policy {
    profile
        .and_then(|name| policy.profiles.iter().find(|p| p.name == name))
        .and_then(|p| p.policy())
        .unwrap_or(policy)
}

/// Whether an opt-out is honoured for an object reviewed as `requester`'s.
///
/// Made by a controller (`requester` one of `optOut.controllers`): honoured with the
/// approval tollgate stamped on its template, refused without, as at the pod.
/// Otherwise its creator is unknown: honoured if the policy honours it here for any
/// requester, refused if for none, unverified otherwise.
pub fn opt_out_state(
    policy: &Policy,
    object: &Value,
    namespace: &str,
    requester: &str,
) -> OptOutState {
    let rule = &policy.opt_out;
    let asked = object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(&rule.annotation))
        .and_then(Value::as_str)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    if !asked {
        return OptOutState::None;
    }
    if optout::is_controller(policy, requester) {
        // A controller's pod: honoured only with the approval its template gave it, as
        // the webhooks decide it at the pod.
        let annotations = workload::string_map(object.pointer("/metadata/annotations"));
        let authenticated = ["system:authenticated".to_owned()];
        let controller = Requester {
            namespace,
            username: requester,
            groups: &authenticated,
        };
        return match optout::decide_for(policy, Some(&annotations), &controller) {
            OptOut::Honoured => OptOutState::Honoured,
            OptOut::Refused(why) => OptOutState::Refused(why),
            OptOut::NotRequested => OptOutState::None,
        };
    }
    let authenticated = ["system:authenticated".to_owned()];
    let unknown = Requester {
        namespace,
        username: UNKNOWN_USER,
        groups: &authenticated,
    };
    match optout::permitted(policy, &unknown) {
        Ok(()) => OptOutState::Honoured,
        Err(why) if !glob::any(&rule.namespaces, namespace) => OptOutState::Refused(why),
        Err(_) => {
            let mut who: Vec<String> = rule
                .users
                .iter()
                .map(|u| format!("user {}", u.as_str()))
                .collect();
            who.extend(rule.groups.iter().map(|g| format!("group {}", g.as_str())));
            OptOutState::Unverified(format!(
                "{} is honoured here only when {} creates the pod, and who created this one is not known",
                rule.annotation,
                join_or(&who)
            ))
        }
    }
}

fn join_or(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// Turns what the webhooks said of `review` into findings. Pure: the object, its review and
/// the pipeline's judgement in, data out.
pub fn findings(policy: &Policy, object: ObjectRef, review: &Value, judged: &Judged) -> Audited {
    let profile = judged.last().and_then(|r| r.profile.clone());
    let policy = effective(policy, profile.as_deref());
    let sent = review.pointer("/request/object").unwrap_or(&Value::Null);
    let namespace = review
        .pointer("/request/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let requester = review
        .pointer("/request/userInfo/username")
        .and_then(Value::as_str)
        .unwrap_or(UNKNOWN_USER);
    let opt_out = opt_out_state(policy, sent, namespace, requester);
    let mut out = Audited {
        object,
        profile,
        mode: policy.validation.mode,
        opt_out,
        findings: vec![],
        warnings: judged.warnings().cloned().collect(),
    };
    let unverified = matches!(out.opt_out, OptOutState::Unverified(_));
    if let Some(m) = &judged.mutate {
        if !m.response.allowed {
            out.findings.push(Finding {
                rule: Rule::Review,
                status: Status::Error,
                message: m.response.result.message.clone(),
                missing: vec![],
                adds: vec![],
            });
        }
    }
    if let Some(v) = &judged.validate {
        if !v.missing.is_empty() {
            let lacking: Vec<String> = v
                .missing
                .iter()
                .map(|m| {
                    format!(
                        "{} {:?} has no request for {}",
                        m.noun,
                        m.container,
                        join_and(&m.resources)
                    )
                })
                .collect();
            let when = match out.mode {
                Mode::Enforce => "would be refused",
                Mode::Warn | Mode::Audit => "would be refused once enforced",
            };
            let mut message = format!("{when}: {}", lacking.join("; "));
            if unverified {
                message.push_str(" (unless whoever creates it may opt out)");
            }
            out.findings.push(Finding {
                rule: Rule::Requests,
                status: Status::Fail,
                message,
                missing: v.missing.clone(),
                adds: vec![],
            });
        }
    }
    if let (Some(m), Some(after)) = (&judged.mutate, &judged.mutated) {
        for step in &m.steps {
            let adds = added(*step, sent, after);
            let message = if adds.is_empty() {
                format!("would be changed by {}", step.as_str())
            } else {
                let items: Vec<String> = adds.iter().map(Added::describe).collect();
                format!("would get {}", items.join(", "))
            };
            out.findings.push(Finding {
                rule: Rule::Step(*step),
                status: Status::Warn,
                message,
                missing: vec![],
                adds,
            });
        }
    }
    let annotation = &policy.opt_out.annotation;
    let opt_out = match &out.opt_out {
        OptOutState::None => None,
        OptOutState::Honoured => Some((
            Status::Skip,
            match sent
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(&policy.opt_out.approval_annotation))
                .and_then(Value::as_str)
                .filter(|_| optout::is_controller(policy, requester))
            {
                Some(by) => format!(
                    "opted out with {annotation}, approved at the workload for user {by:?}: neither mutated nor checked"
                ),
                None => format!(
                    "opted out with {annotation}, honoured here for anyone: neither mutated nor checked"
                ),
            },
        )),
        OptOutState::Refused(why) => Some((Status::Warn, format!("{why}; handled as usual"))),
        OptOutState::Unverified(why) => Some((
            Status::Warn,
            format!("opt-out unverified: {why}; judged as not honoured"),
        )),
    };
    if let Some((status, message)) = opt_out {
        out.findings.push(Finding {
            rule: Rule::OptOut,
            status,
            message,
            missing: vec![],
            adds: vec![],
        });
    }
    out.findings
        .sort_by_key(|f| Rule::ALL.iter().position(|r| *r == f.rule));
    out
}

fn join_and(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// What `step` added to `before` to make `after`, read from the two objects by name (not
/// from the patch, whose shape depends on where in a list things went).
fn added(step: Step, before: &Value, after: &Value) -> Vec<Added> {
    let mut out = vec![];
    let old = containers(before);
    let new = containers(after);
    match step {
        Step::Tolerations => {
            let had = list(before, "/spec/tolerations");
            for t in list(after, "/spec/tolerations") {
                if !had.contains(t) {
                    out.push(Added::Toleration(t.clone()));
                }
            }
        }
        Step::MetricsSidecar => {
            for (name, (init, c)) in &new {
                if !old.contains_key(name) {
                    let native =
                        *init && c.get("restartPolicy").and_then(Value::as_str) == Some("Always");
                    out.push(Added::Container {
                        name: name.clone(),
                        native,
                    });
                }
            }
        }
        Step::DriverMounts => {
            let had: BTreeSet<&str> = list(before, "/spec/volumes")
                .iter()
                .filter_map(|v| v.get("name").and_then(Value::as_str))
                .collect();
            for v in list(after, "/spec/volumes") {
                if let Some(n) = v.get("name").and_then(Value::as_str) {
                    if !had.contains(n) {
                        out.push(Added::Volume(n.to_owned()));
                    }
                }
            }
            for (name, (_, c)) in &new {
                let Some((_, was)) = old.get(name) else {
                    continue;
                };
                let mounts = |c: &Value| -> BTreeSet<(String, String)> {
                    list(c, "/volumeMounts")
                        .iter()
                        .map(|m| (field(m, "name"), field(m, "mountPath")))
                        .collect()
                };
                let had = mounts(was);
                for (n, p) in mounts(c) {
                    if !had.contains(&(n.clone(), p.clone())) {
                        out.push(Added::VolumeMount {
                            container: name.clone(),
                            name: n,
                            mount_path: p,
                        });
                    }
                }
                let envs = |c: &Value| -> BTreeSet<String> {
                    list(c, "/env").iter().map(|e| field(e, "name")).collect()
                };
                let had = envs(was);
                for n in envs(c) {
                    if !had.contains(&n) {
                        out.push(Added::Env {
                            container: name.clone(),
                            name: n,
                        });
                    }
                }
            }
        }
        Step::DefaultResources => {
            for (name, (_, c)) in &new {
                let Some((_, was)) = old.get(name) else {
                    continue;
                };
                for (key, limit) in [("limits", true), ("requests", false)] {
                    let path = format!("/resources/{key}");
                    let had = quantities(was, &path);
                    for (resource, value) in quantities(c, &path) {
                        if had.get(&resource) != Some(&value) {
                            let (container, resource) = (name.clone(), resource);
                            out.push(if limit {
                                Added::Limit {
                                    container,
                                    resource,
                                    value,
                                }
                            } else {
                                Added::Request {
                                    container,
                                    resource,
                                    value,
                                }
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

fn list<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn field(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_owned()
}

/// Containers and init containers by name: whether each is an init container, and it.
fn containers(pod: &Value) -> BTreeMap<String, (bool, &Value)> {
    let mut out = BTreeMap::new();
    for (path, init) in [("/spec/initContainers", true), ("/spec/containers", false)] {
        for c in list(pod, path) {
            out.insert(field(c, "name"), (init, c));
        }
    }
    out
}

fn quantities(c: &Value, pointer: &str) -> BTreeMap<String, String> {
    c.pointer(pointer)
        .and_then(Value::as_object)
        .map(|m: &Map<String, Value>| {
            m.iter()
                .map(|(k, v)| {
                    let text = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    (k.clone(), text)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Objects;

    fn pod(meta: Value, spec: Value) -> Value {
        let mut m = json!({"name": "p", "namespace": "ml", "uid": "u-1",
            "resourceVersion": "42", "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl"}]});
        for (k, v) in meta.as_object().unwrap() {
            m[k] = v.clone();
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": m, "spec": spec,
               "status": {"phase": "Running", "podIP": "10.0.0.1"}})
    }

    fn gpu_trainer() -> Value {
        pod(
            json!({"labels": {"training.kubeflow.org/job-name": "r"}}),
            json!({"nodeName": "gpu-1", "containers": [{"name": "pytorch", "image": "t",
                "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]}),
        )
    }

    fn rules(a: &Audited) -> Vec<(&'static str, &'static str)> {
        a.findings
            .iter()
            .map(|f| (f.rule.as_str(), f.status.as_str()))
            .collect()
    }

    #[test]
    fn as_created_takes_back_what_came_after_creation() {
        let mut p = gpu_trainer();
        p["spec"]["ephemeralContainers"] = json!([{"name": "debugger", "image": "busybox"}]);
        as_created(&mut p);
        for k in SET_AFTER_CREATION {
            assert!(p["metadata"].get(k).is_none(), "{k}");
        }
        assert_eq!(p["status"], json!({}));
        assert!(p["spec"].get("nodeName").is_none());
        assert!(p["spec"].get("ephemeralContainers").is_none());
        assert_eq!(
            p["metadata"]["labels"]["training.kubeflow.org/job-name"],
            "r"
        );
    }

    #[test]
    fn a_training_pod_never_mutated_lacks_each_step_and_a_mutated_one_nothing() {
        let policy = Policy::builtin();
        let a = judge(&policy, &Objects::complete(), gpu_trainer()).unwrap();
        assert_eq!(a.object.uid, "u-1");
        assert_eq!(
            rules(&a),
            [
                ("tolerations", "warn"),
                ("driver-mounts", "warn"),
                ("metrics-sidecar", "warn"),
                ("default-resources", "warn")
            ]
        );
        assert!(a.mutated() && !a.refused());
        let tol = &a.findings[0];
        assert!(matches!(&tol.adds[0], Added::Toleration(t) if t["key"] == "nvidia.com/gpu"));
        assert!(tol.message.contains("nvidia.com/gpu"), "{}", tol.message);
        let limits = &a.findings[3].adds;
        assert!(limits.iter().any(|x| matches!(x,
            Added::Limit { container, resource, .. } if container == "pytorch" && resource == "cpu")));
        assert!(matches!(
            &a.findings[2].adds[..],
            [Added::Container { native: true, .. }]
        ));

        // The same pod as tollgate mutated it (then defaulted, then stored): nothing left.
        let review = review_of({
            let mut p = gpu_trainer();
            as_created(&mut p);
            p
        });
        let judged = pipeline::run(&policy, &Objects::complete(), &review, Stage::All).unwrap();
        let mut stored = judged.mutated.unwrap();
        crate::pod::default_requests_from_limits(&mut stored);
        let again = judge(&policy, &Objects::complete(), stored).unwrap();
        assert!(again.findings.is_empty(), "{:?}", again.findings);
    }

    #[test]
    fn a_pod_without_requests_is_refused_with_what_it_lacks_in_every_mode() {
        let mut policy = Policy::builtin();
        let p = pod(
            json!({}),
            json!({"containers": [{"name": "jupyter", "image": "j"}]}),
        );
        let a = judge(&policy, &Objects::complete(), p.clone()).unwrap();
        assert_eq!(rules(&a), [("requests", "fail")]);
        assert!(a.refused());
        assert_eq!(a.findings[0].missing[0].container, "jupyter");
        assert!(a.findings[0]
            .message
            .starts_with("would be refused: container \"jupyter\""));
        let j = a.finding_json(&a.findings[0]);
        assert_eq!(j["missing"][0]["resources"], json!(["cpu", "memory"]));
        assert_eq!(j["object"]["name"], "p");
        assert_eq!(
            (j["mode"].as_str(), j["optOut"].as_str()),
            (Some("enforce"), Some("none"))
        );

        policy.validation.mode = Mode::Warn;
        let a = judge(&policy, &Objects::complete(), p).unwrap();
        assert_eq!(rules(&a), [("requests", "fail")]);
        assert!(a.findings[0].message.contains("once enforced"));
        assert_eq!(a.mode, Mode::Warn);
    }

    #[test]
    fn a_controllers_pod_opts_out_by_the_approval_its_template_gave_it() {
        let policy = Policy::builtin();
        let made = |annotations: Value| {
            pod(
                json!({"annotations": annotations, "ownerReferences": [{"apiVersion": "batch/v1",
                    "kind": "Job", "name": "train", "uid": "j-1", "controller": true}]}),
                json!({"containers": [{"name": "jupyter", "image": "j"}]}),
            )
        };
        let a = judge(
            &policy,
            &Objects::complete(),
            made(json!({"tollgate.dev/opt-out": "true",
                        "tollgate.dev/opt-out-approved-by": "alice"})),
        )
        .unwrap();
        assert_eq!(a.opt_out, OptOutState::Honoured);
        assert_eq!(rules(&a), [("opt-out", "skip")]);
        assert!(
            a.findings[0].message.contains("\"alice\""),
            "{}",
            a.findings[0].message
        );

        // No approval (a workload made before tollgate, or by someone who may not): the
        // pods its controller makes get no opt-out.
        let a = judge(
            &policy,
            &Objects::complete(),
            made(json!({"tollgate.dev/opt-out": "true"})),
        )
        .unwrap();
        assert!(
            matches!(&a.opt_out, OptOutState::Refused(w) if w.contains("tollgate.dev/opt-out-approved-by")),
            "{:?}",
            a.opt_out
        );
        assert_eq!(rules(&a), [("requests", "fail"), ("opt-out", "warn")]);
    }

    fn job(template_meta: Value, containers: Value) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "ml", "uid": "j-1", "resourceVersion": "7"},
            "spec": {"template": {"metadata": template_meta,
                "spec": {"restartPolicy": "Never", "containers": containers}}},
            "status": {"active": 1}})
    }

    #[test]
    fn a_workload_is_judged_by_the_pods_of_its_templates() {
        let policy = Policy::builtin();
        // Without default limits, a Job's pods keep their lack of requests.
        let mut bare = policy.clone();
        bare.mutation.default_resources.enabled = false;
        let a = judge(
            &bare,
            &Objects::complete(),
            job(json!({}), json!([{"name": "jupyter", "image": "j"}])),
        )
        .unwrap();
        assert_eq!(a.object.kind, "Job");
        assert_eq!(a.object.uid, "j-1");
        assert_eq!(
            rules(&a),
            [("requests", "fail"), ("metrics-sidecar", "warn")]
        );
        assert!(a.refused());
        assert_eq!(a.findings[0].missing[0].container, "jupyter");

        // The shipped policy: mutation gives the Job's (training) pods limits, the
        // apiserver's defaulting turns them into requests, and they would pass.
        let a = judge(
            &policy,
            &Objects::complete(),
            job(
                json!({}),
                json!([{"name": "t", "image": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
            ),
        )
        .unwrap();
        assert!(!a.refused() && a.mutated(), "{:?}", rules(&a));

        // An approved opt-out in the template: honoured for its pods.
        let a = judge(
            &policy,
            &Objects::complete(),
            job(
                json!({"annotations": {"tollgate.dev/opt-out": "true",
                    "tollgate.dev/opt-out-approved-by": "alice"}}),
                json!([{"name": "jupyter", "image": "j"}]),
            ),
        )
        .unwrap();
        assert_eq!(a.opt_out, OptOutState::Honoured);
        assert!(!a.refused());
    }

    #[test]
    fn each_finding_of_a_workload_names_its_template() {
        let sized = json!([{"name": "pytorch", "image": "p",
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]);
        let bare = json!([{"name": "pytorch", "image": "p"}]);
        let replica = |containers: &Value| json!({"replicas": 1, "template": {"spec": {"containers": containers}}});
        let job = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "bert", "namespace": "ml"},
            "spec": {"pytorchReplicaSpecs": {"Master": replica(&sized), "Worker": replica(&bare)}}});
        let mut bare = Policy::builtin();
        bare.mutation.default_resources.enabled = false;
        let a = judge(&bare, &Objects::complete(), job).unwrap();
        let fails: Vec<&str> = a
            .findings
            .iter()
            .filter(|f| f.status == Status::Fail)
            .map(|f| f.message.as_str())
            .collect();
        assert_eq!(fails.len(), 1, "{fails:?}");
        assert!(fails[0].starts_with("replica Worker: "), "{}", fails[0]);
    }

    #[test]
    fn opt_outs_are_honoured_refused_or_unverified_for_an_unknown_creator() {
        let opted = || {
            pod(
                json!({"annotations": {"tollgate.dev/opt-out": "true"}}),
                json!({"containers": [{"name": "jupyter", "image": "j"}]}),
            )
        };
        // The shipped policy: only system:masters may opt out, anywhere.
        let mut policy = Policy::builtin();
        let a = judge(&policy, &Objects::complete(), opted()).unwrap();
        assert!(
            matches!(&a.opt_out, OptOutState::Unverified(w) if w.contains("group system:masters"))
        );
        assert_eq!(rules(&a), [("requests", "fail"), ("opt-out", "warn")]);
        assert!(a.findings[0]
            .message
            .contains("unless whoever creates it may opt out"));

        policy.opt_out.namespaces = vec!["sandbox-*".into()];
        let a = judge(&policy, &Objects::complete(), opted()).unwrap();
        assert!(matches!(&a.opt_out, OptOutState::Refused(w) if w.contains("namespace \"ml\"")));
        assert_eq!(rules(&a), [("requests", "fail"), ("opt-out", "warn")]);

        policy.opt_out.namespaces = vec!["ml".into()];
        policy.opt_out.groups = vec![];
        let a = judge(&policy, &Objects::complete(), opted()).unwrap();
        assert_eq!(a.opt_out, OptOutState::Honoured);
        assert_eq!(rules(&a), [("opt-out", "skip")]);
        assert!(!a.refused());

        // Every real requester is authenticated: a policy that names the group honours all.
        policy.opt_out.groups = vec!["system:authenticated".into()];
        let a = judge(&policy, &Objects::complete(), opted()).unwrap();
        assert_eq!(a.opt_out, OptOutState::Honoured);
    }
}

//! What an object already in the cluster breaks or lacks, judged as a CREATE of it would be
//! judged today: the findings of `tollgate audit` and of the server's background audit.
//!
//! An object read from the cluster is not the object its author sent: the apiserver, the
//! scheduler and the kubelet have written to it since. [`as_created`] takes back what they
//! add after creation, so that [`judge()`] judges the pod the webhooks would have seen, by
//! the webhooks' own judgement (`judge::pod`, or `workload::validate` for a workload's
//! templates), and draws its findings from what that judgement found: refused and why,
//! whether it can ever run, what each mutation step would add (the steps' own report),
//! what became of an opt-out.
//!
//! Who created an existing object is not recorded anywhere an audit can read. It is judged
//! for `Requester::unknown`, an authenticated user no policy names, and an opt-out the
//! policy would honour only for some requesters is decided `OptOut::Unverified` (by
//! `optout`, as every opt-out) and judged as not honoured. A pod a controller made, and the
//! pods a workload's templates will make, are judged as the controller's requests
//! ([`controller_user`]): tollgate's approval in them decides.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use crate::cluster::Cluster;
pub(crate) use crate::mutate::Added;
use crate::mutate::Step;
use crate::optout::{self, OptOut};
use crate::pipeline;
use crate::policy::{Mode, Operation, Policy, WorkloadKind};
use crate::requester::{Requester, AUTHENTICATED};
use crate::stage::Stage;
use crate::validate::Missing;
use crate::words::join_words;
use crate::{judge, profile, workload};

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
pub(crate) fn as_created(object: &mut Value) {
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

    /// Its kind as a person reads it: `pod`, `job`, `job.batch.volcano.sh` where a built-in
    /// kind has the same name.
    pub fn noun(&self) -> String {
        let group = self.api_version.rsplit_once('/').map_or("", |(g, _)| g);
        crate::names::kind_noun(group, &self.kind)
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
    /// It can never run here (a quota, the nodes, a DeviceClass), or not now.
    Feasibility,
    /// A mutation step that would change the object.
    Step(Step),
    /// The object asks to opt out.
    OptOut,
    /// A pod stored and bound that its node does not start (a volume it cannot mount, an
    /// image it cannot get, a container it will not create), in the kubelet's words.
    Start,
}

impl Rule {
    /// Every rule, in the order findings of one object are listed: the mutation steps in
    /// their own order ([`Step::ALL`]), so that a new step is a rule without a line here.
    pub const ALL: [Rule; 5 + Step::ALL.len()] = {
        let mut all = [Rule::Review; 5 + Step::ALL.len()];
        all[1] = Rule::Requests;
        all[2] = Rule::Feasibility;
        let mut i = 0;
        while i < Step::ALL.len() {
            all[3 + i] = Rule::Step(Step::ALL[i]);
            i += 1;
        }
        all[3 + Step::ALL.len()] = Rule::OptOut;
        all[4 + Step::ALL.len()] = Rule::Start;
        all
    };

    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Review => "review",
            Rule::Requests => "requests",
            Rule::Feasibility => "feasibility",
            Rule::Step(s) => s.as_str(),
            Rule::OptOut => "opt-out",
            Rule::Start => "start",
        }
    }

    /// `refused`, `feasibility`, `mutation`, `opt-out` or `node`: which question of the
    /// audit it answers.
    pub fn category(self) -> &'static str {
        match self {
            Rule::Review | Rule::Requests => "refused",
            Rule::Feasibility => "feasibility",
            Rule::Step(_) => "mutation",
            Rule::OptOut => "opt-out",
            Rule::Start => "node",
        }
    }
}

/// A finding's result, in the words of a PolicyReport result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FindingStatus {
    /// Would be refused (under `enforce`, whatever the policy's mode is now).
    Fail,
    /// Lacks what mutation would add, an opt-out that is not (or not surely) honoured, a
    /// pod that cannot run now, or one its node does not start.
    Warn,
    /// Opted out, honoured: neither mutated nor checked.
    Skip,
    /// Could not be judged.
    Error,
}

impl FindingStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            FindingStatus::Fail => "fail",
            FindingStatus::Warn => "warn",
            FindingStatus::Skip => "skip",
            FindingStatus::Error => "error",
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

/// One finding: an object, a rule, a result and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub rule: Rule,
    pub status: FindingStatus,
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
        self.findings
            .iter()
            .any(|f| f.status == FindingStatus::Fail)
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
            "mode": self.mode.as_str(),
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

/// The namespace an object is judged in (a CREATE without one lands in `default`).
fn namespace_of(object: &Value) -> &str {
    object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default")
}

/// The `start` findings of a pod read from the cluster (with its status) and its Warning
/// `events`: each reason its node does not start it ([`crate::startup::failures`]), a
/// `warn` (the pod is stored; it waits), appended after the findings of [`judge()`].
pub fn start_findings(
    policy: &Policy,
    pod: &Value,
    events: &[crate::startup::PodEvent<'_>],
) -> Vec<Finding> {
    let node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or_default();
    crate::startup::failures(policy, pod, events)
        .into_iter()
        .map(|f| Finding {
            rule: Rule::Start,
            status: FindingStatus::Warn,
            message: format!("does not start on node {node}: {}", f.sentence()),
            missing: vec![],
            adds: vec![],
        })
        .collect()
}

/// Judges an object read from the cluster: as created, by the one judgement the webhooks
/// use (a pod's, or each pod a workload's templates will make), its findings drawn from
/// what that judgement found.
pub fn judge(policy: &Policy, cluster: &dyn Cluster, mut object: Value) -> Audited {
    let who = ObjectRef::of(&object);
    as_created(&mut object);
    let (group, version) = pipeline::group_version(&who.api_version);
    if let Some(kind) = policy.workloads.kind(group, version, &who.kind) {
        return judge_workload(policy, cluster, who, &object, kind);
    }
    let mut out = Audited {
        object: who,
        profile: None,
        mode: policy.validation.mode,
        opt_out: OptOutState::None,
        findings: vec![],
        warnings: vec![],
    };
    if out.object.kind != "Pod" || out.object.api_version != "v1" {
        // Neither a pod nor a workload the policy lists: nothing tollgate judges.
        return out;
    }
    let namespace = namespace_of(&object).to_owned();
    let user = controlled(&object)
        .then(|| controller_user(policy))
        .flatten();
    let authenticated = [AUTHENTICATED.to_owned()];
    let requester = requester(&namespace, user.as_deref(), &authenticated);
    let mut pod: Pod = match serde_json::from_value(object) {
        Ok(p) => p,
        Err(e) => {
            out.findings.push(Finding {
                rule: Rule::Review,
                status: FindingStatus::Error,
                message: format!("tollgate could not read this pod: {e}"),
                missing: vec![],
                adds: vec![],
            });
            return out;
        }
    };
    let selected = profile::select(
        policy,
        &namespace,
        profile::PodLabels::Parsed(pod.metadata.labels.as_ref()),
        cluster,
    );
    let approved_for =
        optout::approval(selected.policy, pod.metadata.annotations.as_ref()).map(str::to_owned);
    let subject = judge::Subject {
        policy: selected.policy,
        profile: selected.profile,
        who: requester,
        operation: Operation::Create,
        opt_out: None,
        template: false,
        queued: false,
        placement: None,
    };
    // Decided here only when neither webhook would (nothing mutated, nothing validated):
    // the opt-out is still reported.
    let opt_out = optout::decide(selected.policy, &pod, &requester);
    let j = judge::pod(&subject, cluster, &mut pod, Stage::All, false);
    out.warnings.extend(selected.warning);
    out.profile.clone_from(&j.profile);
    out.mode = selected.policy.validation.mode;
    let drawn = Drawn::of(
        selected.policy,
        &j,
        j.opt_out.as_ref().unwrap_or(&opt_out),
        approved_for.as_deref().filter(|_| user.is_some()),
        true,
    );
    out.opt_out = drawn.opt_out;
    out.findings = drawn.findings;
    out.warnings.extend(drawn.warnings);
    out.findings
        .sort_by_key(|f| Rule::ALL.iter().position(|r| *r == f.rule));
    out
}

/// Whom an audited object is judged for: its controller's account, or nobody known.
fn requester<'a>(
    namespace: &'a str,
    controller: Option<&'a str>,
    authenticated: &'a [String],
) -> Requester<'a> {
    match controller {
        Some(u) => Requester::new(namespace, u, authenticated),
        None => Requester::unknown(namespace),
    }
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
pub(crate) fn controller_user(policy: &Policy) -> Option<String> {
    let first = policy.opt_out.controllers.first()?;
    Some(first.as_str().replace(['*', '?'], "x"))
}

/// A workload judged by the pods its templates will make: by the validating webhook's own
/// judgement of it ([`workload::validate`]), as its controller's request (so that
/// tollgate's approval in a template decides its pods' opt-out), each finding led by its
/// template's name (`replica Worker: ...`). The workload's profile, mode and opt-out are
/// its first judged template's that has one.
fn judge_workload(
    policy: &Policy,
    cluster: &dyn Cluster,
    who: ObjectRef,
    object: &Value,
    kind: &WorkloadKind,
) -> Audited {
    let mut out = Audited {
        object: who,
        profile: None,
        mode: policy.validation.mode,
        opt_out: OptOutState::None,
        findings: vec![],
        warnings: vec![],
    };
    let namespace = namespace_of(object).to_owned();
    let user = controller_user(policy);
    let authenticated = [AUTHENTICATED.to_owned()];
    let requester = requester(&namespace, user.as_deref(), &authenticated);
    let w = workload::Workload {
        kind,
        object,
        old: None,
        operation: Operation::Create,
        who: requester,
    };
    let v = workload::validate(policy, cluster, &w);
    out.warnings = v.warnings;
    let mut first = true;
    for t in v.judged {
        let lead = |m: &str| match &t.label {
            Some(l) => format!("{l}: {m}"),
            None => m.to_owned(),
        };
        if let Some(e) = &t.unreadable {
            out.findings.push(Finding {
                rule: Rule::Review,
                status: FindingStatus::Error,
                message: lead(&format!("the template is not a pod spec: {e}")),
                missing: vec![],
                adds: vec![],
            });
            continue;
        }
        let Some(opt_out) = &t.opt_out else {
            continue;
        };
        let p = effective(policy, t.profile.as_deref());
        if first {
            out.profile.clone_from(&t.profile);
            out.mode = p.validation.mode;
            first = false;
        }
        let drawn = match &t.judgement {
            // Feasibility is the workload's: its pods in all, below.
            Some(j) => Drawn::of(
                p,
                j,
                opt_out,
                t.approved_for.as_deref().filter(|_| user.is_some()),
                false,
            ),
            // Opted out: neither mutated nor checked.
            None => Drawn::opted_out(
                p,
                opt_out,
                t.approved_for.as_deref().filter(|_| user.is_some()),
            ),
        };
        if out.opt_out == OptOutState::None {
            out.opt_out = drawn.opt_out;
        }
        out.findings.extend(drawn.findings.into_iter().map(|mut f| {
            f.message = lead(&f.message);
            f
        }));
    }
    out.findings.extend(feasibility_findings(&v.feasibility));
    // By rule, then in template order (a stable sort).
    out.findings
        .sort_by_key(|f| Rule::ALL.iter().position(|r| *r == f.rule));
    out
}

/// Feasibility's findings as the audit's: what can never run fails (it would be refused
/// under `feasibility.mode: enforce`, and never runs in any mode), what cannot run now
/// warns.
fn feasibility_findings(found: &[crate::feasible::Obstacle]) -> impl Iterator<Item = Finding> + '_ {
    found.iter().map(|f| Finding {
        rule: Rule::Feasibility,
        status: if f.never {
            FindingStatus::Fail
        } else {
            FindingStatus::Warn
        },
        message: if f.never {
            format!("can never run: {}", f.message)
        } else if f.in_turns {
            format!("runs in turns: {}", f.message)
        } else {
            format!("cannot run now: {}", f.message)
        },
        missing: vec![],
        adds: vec![],
    })
}

/// The policy a profile stands for (the base policy for None or a name it lacks).
fn effective<'p>(policy: &'p Policy, profile: Option<&str>) -> &'p Policy {
    profile
        .and_then(|name| policy.profiles.iter().find(|p| p.name == name))
        .and_then(|p| p.policy())
        .unwrap_or(policy)
}

/// What one pod's judgement says, as the audit words it.
struct Drawn {
    opt_out: OptOutState,
    findings: Vec<Finding>,
    warnings: Vec<String>,
}

impl Drawn {
    /// The findings of a judged pod: refused and why, what each mutation step added, what
    /// became of its opt-out. `approved_for`: whom tollgate's approval names, for a
    /// controller's pod.
    fn of(
        policy: &Policy,
        j: &judge::Judgement,
        opt_out: &OptOut,
        approved_for: Option<&str>,
        feasibility: bool,
    ) -> Drawn {
        let mut out = Drawn::opted_out(policy, opt_out, approved_for);
        let unverified = matches!(out.opt_out, OptOutState::Unverified(_));
        if let Some(m) = &j.mutation {
            out.warnings.extend(m.warnings.iter().cloned());
        }
        if let Some(v) = &j.validation {
            out.warnings.extend(v.warnings.iter().cloned());
            if !v.missing.is_empty() {
                let lacking: Vec<String> = v
                    .missing
                    .iter()
                    .map(|m| {
                        format!(
                            "{} {:?} has no request for {}",
                            m.noun,
                            m.container,
                            join_words(&m.resources)
                        )
                    })
                    .collect();
                let when = match policy.validation.mode {
                    Mode::Enforce => "would be refused",
                    Mode::Warn | Mode::Audit => "would be refused once enforced",
                };
                let mut message = format!("{when}: {}", lacking.join("; "));
                if unverified {
                    message.push_str(" (unless whoever creates it may opt out)");
                }
                out.findings.push(Finding {
                    rule: Rule::Requests,
                    status: FindingStatus::Fail,
                    message,
                    missing: v.missing.clone(),
                    adds: vec![],
                });
            }
        }
        if let Some(f) = j.feasibility.as_ref().filter(|_| feasibility) {
            out.findings.extend(feasibility_findings(&f.findings));
        }
        if let Some(m) = &j.mutation {
            for step in &m.report.applied {
                let adds = in_order(*step, m.report.added_by(*step).cloned().collect());
                let message = if adds.is_empty() {
                    format!("would be changed by {}", step.as_str())
                } else {
                    let items: Vec<String> = adds.iter().map(Added::describe).collect();
                    format!("would get {}", items.join(", "))
                };
                out.findings.push(Finding {
                    rule: Rule::Step(*step),
                    status: FindingStatus::Warn,
                    message,
                    missing: vec![],
                    adds,
                });
            }
        }
        out
    }

    /// The opt-out's state and finding alone: all there is of a pod that opted out.
    fn opted_out(policy: &Policy, opt_out: &OptOut, approved_for: Option<&str>) -> Drawn {
        let annotation = &policy.opt_out.annotation;
        let (state, finding) = match opt_out {
            OptOut::NotRequested => (OptOutState::None, None),
            OptOut::Honoured => (
                OptOutState::Honoured,
                Some((
                    FindingStatus::Skip,
                    match approved_for {
                        Some(by) => format!(
                            "opted out with {annotation}, approved at the workload for user {by:?}: neither mutated nor checked"
                        ),
                        None => format!(
                            "opted out with {annotation}, honoured here for anyone: neither mutated nor checked"
                        ),
                    },
                )),
            ),
            OptOut::Refused(why) => (
                OptOutState::Refused(why.clone()),
                Some((FindingStatus::Warn, format!("{why}; handled as usual"))),
            ),
            OptOut::Unverified(why) => (
                OptOutState::Unverified(why.clone()),
                Some((
                    FindingStatus::Warn,
                    format!("opt-out unverified: {why}; judged as not honoured"),
                )),
            ),
        };
        Drawn {
            opt_out: state,
            findings: finding
                .map(|(status, message)| Finding {
                    rule: Rule::OptOut,
                    status,
                    message,
                    missing: vec![],
                    adds: vec![],
                })
                .into_iter()
                .collect(),
            warnings: vec![],
        }
    }
}

/// What a step added, in the order findings list it: volumes first (as added), then by
/// container name, each container's mounts by name and path, its variables by name, its
/// limits by resource.
fn in_order(step: Step, mut adds: Vec<Added>) -> Vec<Added> {
    match step {
        Step::DriverMounts | Step::DefaultResources => {
            adds.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
        }
        // Added in the one order that makes sense of them: the classes' tolerations, the
        // one sidecar.
        Step::Tolerations | Step::MetricsSidecar => {}
    }
    adds
}

fn order_key(a: &Added) -> (u8, &str, u8, &str, &str) {
    match a {
        Added::Volume(_) => (0, "", 0, "", ""),
        Added::VolumeMount {
            container,
            name,
            mount_path,
        } => (1, container, 0, name, mount_path),
        Added::Env { container, name } => (1, container, 1, name, ""),
        Added::Limit {
            container,
            resource,
            ..
        } => (1, container, 2, resource, ""),
        Added::Toleration(_) | Added::Container { .. } => (2, "", 0, "", ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Objects;
    use crate::stage::Stage;

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
        let a = judge(&policy, &Objects::complete(), gpu_trainer());
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
        let mut created = gpu_trainer();
        as_created(&mut created);
        // Created by nobody in particular, as the audit judges it.
        let review = pipeline::synthetic_review(&created, None, "", &[]);
        let judged = pipeline::run(&policy, &Objects::complete(), &review, Stage::All).unwrap();
        let mut stored = judged.mutated.unwrap();
        crate::pod::default_requests_from_limits(&mut stored);
        let again = judge(&policy, &Objects::complete(), stored);
        assert!(again.findings.is_empty(), "{:?}", again.findings);
    }

    #[test]
    fn a_pod_without_requests_is_refused_with_what_it_lacks_in_every_mode() {
        let mut policy = Policy::builtin();
        let p = pod(
            json!({}),
            json!({"containers": [{"name": "jupyter", "image": "j"}]}),
        );
        let a = judge(&policy, &Objects::complete(), p.clone());
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
        let a = judge(&policy, &Objects::complete(), p);
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
        );
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
        );
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
        );
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
        );
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
        );
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
        let a = judge(&bare, &Objects::complete(), job);
        let fails: Vec<&str> = a
            .findings
            .iter()
            .filter(|f| f.status == FindingStatus::Fail)
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
        let a = judge(&policy, &Objects::complete(), opted());
        assert!(
            matches!(&a.opt_out, OptOutState::Unverified(w) if w.contains("group system:masters"))
        );
        assert_eq!(rules(&a), [("requests", "fail"), ("opt-out", "warn")]);
        assert!(a.findings[0]
            .message
            .contains("unless whoever creates it may opt out"));

        policy.opt_out.namespaces = vec!["sandbox-*".into()];
        let a = judge(&policy, &Objects::complete(), opted());
        assert!(matches!(&a.opt_out, OptOutState::Refused(w) if w.contains("namespace \"ml\"")));
        assert_eq!(rules(&a), [("requests", "fail"), ("opt-out", "warn")]);

        policy.opt_out.namespaces = vec!["ml".into()];
        policy.opt_out.groups = vec![];
        let a = judge(&policy, &Objects::complete(), opted());
        assert_eq!(a.opt_out, OptOutState::Honoured);
        assert_eq!(rules(&a), [("opt-out", "skip")]);
        assert!(!a.refused());

        // Every real requester is authenticated: a policy that names the group honours all.
        policy.opt_out.groups = vec!["system:authenticated".into()];
        let a = judge(&policy, &Objects::complete(), opted());
        assert_eq!(a.opt_out, OptOutState::Honoured);
    }
}

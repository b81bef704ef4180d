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
//! The mutating webhook changes one thing more in a template, where the apiserver
//! validates templates as pods (the built-in kinds): the limits the apiserver requires of
//! the template that its pods would get from tollgate's mutation anyway (a GPU requested
//! without a limit gets limit = request, `fix`). Nothing else: the pods are mutated when
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
//!
//! One concern per file: `template` (the templates and the pods they make), `built` (where
//! a kind with `from` reads them), `judging` (the policy each template's pods get, and
//! whether it is judged), `approval` (tollgate's approval of the opt-out, in a template or
//! a TrainJob's override), `mutating` and `validating` (the two webhooks), `feasibility`
//! (what the pods ask for in all, against quotas and Kueue), `runtime` (a Trainer runtime
//! judged itself), `messages` (the words both webhooks share). This face holds the
//! answers and re-exports what the rest of the engine calls. `fix`: the limits a built-in
//! kind's template gets for the apiserver, and what is said where it gets none.

mod approval;
mod built;
mod feasibility;
mod fix;
mod judging;
mod messages;
mod mutating;
mod runtime;
mod template;
mod validating;

use std::collections::BTreeMap;

use serde_json::Value;

use crate::cluster::ObjectKey;
use crate::feasible;
use crate::judge::Judgement;
use crate::optout::OptOut;
use crate::policy::{Operation, WorkloadKind};
use crate::requester::Requester;
use crate::validate::Verdict;

pub(crate) use mutating::mutate;

/// What the apiserver's own validation refuses in `object`, a workload of `kind`: its
/// name, and its pod templates (not for a kind it does not validate as pods: a CRD's): what
/// `tollgate review` holds the mutated workload to, where the apiserver does.
pub(crate) fn apiserver_errors(
    kind: &WorkloadKind,
    object: &Value,
) -> Vec<crate::apivalidation::FieldError> {
    // Every object's name, a CustomResource's too.
    let mut errors =
        crate::apivalidation::object_name(&kind.group, &kind.kind, object.get("metadata"));
    if !fix::validated_by_apiserver(kind) {
        return errors;
    }
    let found: Vec<(String, Option<&Value>)> = template::templates(kind, object)
        .into_iter()
        .map(|t| (t.pointer, t.value.get("spec")))
        .collect();
    errors.extend(fix::errors_of(&found, object));
    errors
}

pub(crate) use runtime::validate_runtime;
pub(crate) use template::labels_of;
pub(crate) use validating::validate;

/// A workload as a review sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Workload<'a> {
    pub kind: &'a WorkloadKind,
    pub object: &'a Value,
    /// On UPDATE, the object as it was.
    pub old: Option<&'a Value>,
    pub operation: Operation,
    pub who: Requester<'a>,
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
pub(crate) struct TemplateJudged {
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
pub(crate) struct Validated {
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
    pub feasibility: Vec<feasible::Obstacle>,
}

/// What the mutating webhook answers for a workload: at most the approval's changes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Mutated {
    /// The JSON patch, as text.
    pub patch: Option<Vec<u8>>,
    pub warnings: Vec<String>,
    pub audit_annotations: BTreeMap<String, String>,
    pub opt_out: Option<OptOut>,
    pub templates: Vec<TemplateVerdict>,
    /// Objects the templates are read in that the cluster context did not know.
    pub unresolved: Vec<ObjectKey>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Objects, Offline};
    use crate::policy::Policy;
    use serde_json::json;

    fn who<'a>(user: &'a str, groups: &'a [String]) -> Requester<'a> {
        Requester::new("ml", user, groups)
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

    fn gpu_job(annotations: Value) -> Value {
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train-gpu", "namespace": "ml"},
            "spec": {"template": {
                "metadata": {"annotations": annotations},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "train", "image": "i",
                    "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}
            }}
        })
    }

    #[test]
    fn a_gpu_jobs_template_gets_the_limit_its_pods_would_get_once() {
        let policy = Policy::builtin();
        let kind = policy.workloads.kind("batch", "v1", "Job").unwrap();
        let none: Vec<String> = vec![];
        let job = gpu_job(json!({}));
        let w = Workload {
            kind,
            object: &job,
            old: None,
            operation: Operation::Create,
            who: who("bob", &none),
        };
        let m = mutate(&policy, &Offline, &w);
        let fixed = apply(&job, m.patch.as_deref().unwrap());
        assert_eq!(
            fixed.pointer("/spec/template/spec/containers/0/resources"),
            Some(&json!({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}})),
            "only the limit the apiserver requires: cpu and memory are left to the pods"
        );
        assert!(
            m.warnings[0]
                .contains("set limits nvidia.com/gpu: 1 on container \"train\" (its request)"),
            "{:?}",
            m.warnings
        );
        assert!(super::apiserver_errors(kind, &fixed).is_empty());
        let again = Workload {
            object: &fixed,
            ..w
        };
        let m = mutate(&policy, &Offline, &again);
        assert!(m.patch.is_none(), "idempotent");
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        // A controller's Job (a JobSet's) gets it too.
        let jobset = Workload {
            who: who(
                "system:serviceaccount:jobset-system:jobset-controller-manager",
                &none,
            ),
            ..w
        };
        let m = mutate(&policy, &Offline, &jobset);
        assert_eq!(apply(&job, m.patch.as_deref().unwrap()), fixed);
    }

    #[test]
    fn an_opted_out_gpu_job_is_told_what_the_apiserver_will_refuse() {
        let policy = Policy::builtin();
        let kind = policy.workloads.kind("batch", "v1", "Job").unwrap();
        let masters = vec!["system:masters".to_owned()];
        let job = gpu_job(json!({"tollgate.dev/opt-out": "true"}));
        let w = Workload {
            kind,
            object: &job,
            old: None,
            operation: Operation::Create,
            who: who("alice", &masters),
        };
        let m = mutate(&policy, &Offline, &w);
        let stamped = apply(&job, m.patch.as_deref().unwrap());
        assert!(stamped
            .pointer("/spec/template/spec/containers/0/resources/limits")
            .is_none());
        let said = m
            .warnings
            .iter()
            .find(|w| w.contains("the apiserver will refuse it"))
            .unwrap();
        assert!(said.contains("Job.batch \"train-gpu\" is invalid: spec.template.spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources"), "{said}");
        assert!(
            said.contains(
                "add to container \"train\": resources: {limits: {nvidia.com/gpu: \"1\"}}"
            ),
            "{said}"
        );
    }

    #[test]
    fn hugepages_alone_get_the_cpu_and_memory_their_pods_would_get() {
        let policy = Policy::builtin();
        let kind = policy.workloads.kind("apps", "v1", "Deployment").unwrap();
        let none: Vec<String> = vec![];
        let gpu_and_pages = json!({"nvidia.com/gpu": "1", "hugepages-2Mi": "4Mi"});
        let d = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "serve", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "serve"}}, "template": {
                "metadata": {"labels": {"app": "serve"}},
                "spec": {"containers": [{"name": "s", "image": "i",
                    "resources": {"requests": gpu_and_pages, "limits": gpu_and_pages}}]}
            }}
        });
        assert_eq!(
            super::apiserver_errors(kind, &d)[0].detail,
            "Forbidden: HugePages require cpu or memory"
        );
        let w = Workload {
            kind,
            object: &d,
            old: None,
            operation: Operation::Create,
            who: who("bob", &none),
        };
        let fixed = apply(&d, mutate(&policy, &Offline, &w).patch.as_deref().unwrap());
        assert_eq!(
            fixed.pointer("/spec/template/spec/containers/0/resources/limits"),
            Some(
                &json!({"nvidia.com/gpu": "1", "hugepages-2Mi": "4Mi", "cpu": "2", "memory": "4Gi"})
            )
        );
        assert!(super::apiserver_errors(kind, &fixed).is_empty());
        let again = Workload {
            object: &fixed,
            ..w
        };
        assert!(
            mutate(&policy, &Offline, &again).patch.is_none(),
            "idempotent"
        );
    }
}

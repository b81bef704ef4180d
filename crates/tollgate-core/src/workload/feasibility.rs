//! Whether a workload's pods can run, in all: what rules out one pod of a template (each
//! template's judgement), and what its pods ask for together held to the namespace's
//! ResourceQuotas (at once for a kind whose pods must run together; otherwise they run in
//! turns, which is only said) or, for a workload submitted to Kueue, to its ClusterQueue.
//! The sums are taken first ([`tally`]); the findings are worded from them.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ResourceQuota;
use serde_json::Value;

use super::template::{at, labels_of};
use super::{TemplateJudged, Validated, Workload};
use crate::cluster::Cluster;
use crate::feasible::{self, Obstacle, Over, Usage};
use crate::validate;
use crate::words::{join_words, quote};

/// Kueue's partial admission of a batch/v1 Job: with this annotation Kueue may admit it
/// with its parallelism lowered down to the annotation's value (which Kueue's webhook holds
/// between 1 and the parallelism less one).
pub(super) const PARTIAL_ADMISSION: &str = "kueue.x-k8s.io/job-min-parallelism";

/// What stands between a workload's pods and running, in template order, before it is
/// worded.
enum Stands<'a> {
    /// What rules out one pod of a template (its finding, led by the template's name), and
    /// whether the template's policy enforces.
    Pod(Obstacle, bool),
    /// Pods of a template that need not run together, over quota `q` in all.
    InTurns {
        label: Option<&'a str>,
        quota: &'a ResourceQuota,
        over: Over,
        pods: i128,
    },
}

/// One quota held to pods that must run together: what they ask in all, how many they
/// are, and whether any of their policies enforces.
struct Together {
    quota: Arc<ResourceQuota>,
    usage: Usage,
    pods: i128,
    enforce: bool,
}

/// What a workload submitted to Kueue asks of its ClusterQueue, all its pods together,
/// and at the least Kueue may admit it with.
#[derive(Default)]
struct Queued {
    usage: Usage,
    pods: i128,
    least: Usage,
    least_pods: i128,
    enforce: bool,
}

/// The sums of a workload's templates' judgements.
#[derive(Default)]
struct Tally<'a> {
    stands: Vec<Stands<'a>>,
    /// What could not be checked, once each.
    unknown: Vec<String>,
    together: Vec<Together>,
    /// Held to a Kueue queue: its pods in all.
    queued: Option<Queued>,
}

/// The Kueue queue a workload is submitted to (`kueue.x-k8s.io/queue-name`), where the
/// context tracks Kueue's queues. Kueue admits a workload whole, within its LocalQueue's
/// ClusterQueue: that, rather than the namespace's ResourceQuotas, is what its pods in all
/// are held to. Without the queues (Kueue not installed, or not watched) the namespace's
/// quotas are what tollgate can judge.
pub(super) fn kueue_queue(w: &Workload<'_>, cluster: &dyn Cluster) -> Option<String> {
    labels_of(w.object)
        .remove(feasible::KUEUE_QUEUE_LABEL)
        .filter(|q| !q.is_empty())
        .filter(|q| cluster.kueue_local_queue(w.who.namespace, q).is_some())
}

/// Whether the workload's pods can run, from what each template's judgement found. Every
/// finding goes to `out.feasibility`, and its warnings to `out.warnings`; what refuses the
/// workload (a finding of `never` under `enforce`) is returned, a line each.
pub(super) fn feasibility(
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
            quote(&manager)
        ));
        return vec![];
    }
    let tally = tally(w, queue.is_some(), &out.judged);
    let mut found: Vec<(Obstacle, bool)> = tally
        .stands
        .into_iter()
        .map(|s| match s {
            Stands::Pod(f, enforce) => (f, enforce),
            Stands::InTurns {
                label,
                quota,
                over,
                pods,
            } => (in_turns(label, quota, &over, pods), false),
        })
        .collect();
    let mut unknown = tally.unknown;
    if let (Some(queue), Some(q)) = (queue, &tally.queued) {
        match kueue(queue, w.who.namespace, cluster, q) {
            Ok(findings) => found.extend(findings),
            Err(what) => unknown.push(what),
        }
    }
    let copies = copies_of(w);
    for t in &tally.together {
        let one = feasible::over(&t.quota, &t.usage, t.pods);
        // Copies that each fit, but not all at once: fewer run at a time.
        if copies > 1 && one.is_empty() {
            let all = feasible::over(
                &t.quota,
                &t.usage.times(copies),
                t.pods.saturating_mul(copies),
            );
            for o in all {
                found.push((copies_in_turns(w, t, &o, copies), false));
            }
        }
        for o in one {
            found.push((together(t, &o), t.enforce));
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
        out.warnings.push(
            validate::UNKNOWN_WARNING
                .fill(&[("subject", subject), ("what", &join_words(&unknown))]),
        );
    }
    out.feasibility = found.into_iter().map(|(f, _)| f).collect();
    never
}

/// The sums of `judged`'s feasibility: each template's findings, what its pods ask for in
/// all against each quota it is held to (or, `queued`, the Kueue queue's).
fn tally<'a>(w: &Workload<'_>, queued: bool, judged: &'a [TemplateJudged]) -> Tally<'a> {
    let mut out = Tally::default();
    // Kueue's partial admission: a Job whose pods Kueue may admit fewer of, down to this.
    let partial = partial_admission(w);
    if queued {
        out.queued = Some(Queued::default());
    }
    for t in judged {
        let Some(f) = t.judgement.as_ref().and_then(|j| j.feasibility.as_ref()) else {
            continue;
        };
        for finding in &f.findings {
            out.stands.push(Stands::Pod(
                Obstacle {
                    never: finding.never,
                    in_turns: finding.in_turns,
                    message: lead(t.label.as_deref(), &finding.message),
                },
                t.enforce,
            ));
        }
        for u in &f.unknown {
            if !out.unknown.contains(u) {
                out.unknown.push(u.clone());
            }
        }
        let all = f.usage.times(t.pods);
        if let Some(q) = out.queued.as_mut() {
            q.usage.add(&all);
            q.pods += t.pods;
            q.enforce |= t.enforce;
            let least = partial.map_or(t.pods, |min| min.min(t.pods));
            q.least.add(&f.usage.times(least));
            q.least_pods += least;
            continue;
        }
        if t.pods <= 1 && !w.kind.together {
            continue;
        }
        for q in &f.quotas {
            if w.kind.together {
                match out
                    .together
                    .iter_mut()
                    .find(|x| x.quota.metadata == q.metadata)
                {
                    Some(x) => {
                        x.usage.add(&all);
                        x.pods += t.pods;
                        x.enforce |= t.enforce;
                    }
                    None => out.together.push(Together {
                        quota: q.clone(),
                        usage: all.clone(),
                        pods: t.pods,
                        enforce: t.enforce,
                    }),
                }
                continue;
            }
            // Pods that need not run together: over the quota in all, they run in turns.
            for over in feasible::over(q, &all, t.pods) {
                out.stands.push(Stands::InTurns {
                    label: t.label.as_deref(),
                    quota: q,
                    over,
                    pods: t.pods,
                });
            }
        }
    }
    out
}

/// The findings of a workload's pods held to Kueue `queue`, with whether they refuse it;
/// Err: the queues are not known (what to say of them). Partially admissible (fewer pods
/// than it asks for), what must fit is the least Kueue admits it with.
fn kueue(
    queue: &str,
    namespace: &str,
    cluster: &dyn Cluster,
    q: &Queued,
) -> Result<Vec<(Obstacle, bool)>, String> {
    let findings = feasible::kueue(queue, namespace, cluster, &q.usage, q.pods)?;
    if q.least_pods >= q.pods || !findings.iter().any(|f| f.never) {
        return Ok(findings.into_iter().map(|f| (f, q.enforce)).collect());
    }
    let least = feasible::kueue(queue, namespace, cluster, &q.least, q.least_pods)?;
    if least.iter().any(|f| f.never) {
        return Ok(least
            .into_iter()
            .map(|mut f| {
                f.message = format!(
                    "even at the {} pods of its {PARTIAL_ADMISSION} annotation, {}",
                    q.least_pods, f.message
                );
                (f, q.enforce)
            })
            .collect());
    }
    let mut out: Vec<(Obstacle, bool)> = least.into_iter().map(|f| (f, q.enforce)).collect();
    out.push((
        Obstacle {
            never: false,
            in_turns: true,
            message: format!(
                "its {} pods do not fit its Kueue ClusterQueue all at once, but its {PARTIAL_ADMISSION} annotation lets Kueue admit it with fewer (at least {}): it runs with fewer pods at a time",
                q.pods, q.least_pods
            ),
        },
        false,
    ));
    Ok(out)
}

/// `message`, led by a template's name when it has one (`replica Worker: ...`).
fn lead(label: Option<&str>, message: &str) -> String {
    match label {
        Some(l) => format!("{l}: {message}"),
        None => message.to_owned(),
    }
}

/// What `pods` pods (`whose`: how they run) ask of quota `q` beyond `o`: over what it
/// allows at all (`then_never` follows), or over what is left of it now (`then_now`).
fn over_quota(
    q: &ResourceQuota,
    o: &Over,
    pods: i128,
    whose: &str,
    then_never: &str,
    then_now: &str,
) -> String {
    if o.never {
        format!(
            "{} allows {}: {}, and its {pods} pods{whose} ask for {} in all: {then_never}",
            feasible::quota_subject(q),
            o.key,
            o.limit,
            o.asked
        )
    } else {
        format!(
            "{}: {} of {} {} are in use now, and its {pods} pods{whose} ask for {}: {then_now}",
            feasible::quota_subject(q),
            o.in_use.as_deref().unwrap_or("?"),
            o.limit,
            o.key,
            o.asked
        )
    }
}

/// Pods of a template that need not run together, over a quota in all: they run in turns
/// (over what it allows at all), or some wait (over what is left of it now).
fn in_turns(label: Option<&str>, q: &ResourceQuota, o: &Over, pods: i128) -> Obstacle {
    let message = over_quota(
        q,
        o,
        pods,
        "",
        "they will run in turns, not all at once",
        "some wait until enough is freed",
    );
    Obstacle {
        never: false,
        in_turns: o.never,
        message: lead(label, &message),
    }
}

/// Pods that must run together, over a quota in all: never (over what it allows), or it
/// waits (over what is left of it now).
fn together(t: &Together, o: &Over) -> Obstacle {
    Obstacle {
        never: o.never,
        in_turns: false,
        message: over_quota(
            &t.quota,
            o,
            t.pods,
            ", which must run together,",
            "it can never run. Lower the replicas or what each pod asks for, or ask your platform team to raise the quota",
            "it waits until enough is freed",
        ),
    }
}

/// Copies of pods that must run together, each within a quota but not all at once: fewer
/// run at a time.
fn copies_in_turns(w: &Workload<'_>, t: &Together, o: &Over, copies: i128) -> Obstacle {
    Obstacle {
        never: false,
        in_turns: o.never,
        message: format!(
            "{} allows {}: {}, and {copies} at once ({}: {copies}) of its {} pods that run together ask for {} in all: fewer than {copies} run at a time",
            feasible::quota_subject(&t.quota),
            o.key,
            o.limit,
            w.kind.copies,
            t.pods,
            o.asked
        ),
    }
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

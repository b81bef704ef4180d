//! Whether a pod can ever run here: the namespace's ResourceQuotas, the nodes it may be
//! scheduled on, the DeviceClasses its claims name.
//!
//! The most common way a training job fails on a shared cluster is not a missing request
//! but a job admitted that never runs: its pods exceed the quota (the controller's pod
//! creations are forbidden) or every node (they stay Pending). This module compares the pod
//! tollgate would admit (mutated, defaulted) with what the cluster context knows, and says,
//! with numbers, what can never be met (`never`) and what cannot be met now (a quota in use).
//!
//! It follows the apiserver and the scheduler where they decide:
//! - the pod's usage is `resourcehelper.PodRequests`/`PodLimits` (regular containers and
//!   native sidecars summed, each init container on top of the sidecars before it, the
//!   larger of the two; overhead added; pod-level resources where the pod sets them);
//! - a quota counts what the pod evaluator counts (`pkg/quota/v1/evaluator/core/pods.go`:
//!   `pods`, `count/pods`, cpu, memory, ephemeral-storage as requests and limits, hugepages,
//!   `requests.<extended resource>`), only where its scopes match the pod, and for cpu and
//!   memory requires every container to set what it tracks ("must specify");
//! - a node is one the pod may be scheduled on when its labels pass the pod's
//!   `nodeSelector` and required node affinity and the pod tolerates its `NoSchedule` and
//!   `NoExecute` taints (`capacity` leaves out cordoned nodes and the lifecycle's taints), and
//!   it fits when its allocatable covers every resource the pod requests.
//!
//! What the context does not know (a cache not synced, a quota scope it cannot decide)
//! refuses nothing: it is named in [`Feasibility::unknown`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Pod, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::capacity::{Nodes, Shape, Taint, HOSTNAME_LABEL};
use crate::cluster::{Cluster, Lookup};
use crate::quantity;
use crate::words::quote;

pub use crate::pod::Amounts;
use crate::pod::{add, amounts, containers_aggregate, pick};

/// What a pod counts for: its effective requests and limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub requests: Amounts,
    pub limits: Amounts,
}

impl Usage {
    /// The pod's effective requests and limits, as the scheduler and the quota count them.
    pub fn of(pod: &Pod) -> Usage {
        Usage::measure(pod, true)
    }

    /// [`Usage::of`], the limits left empty unless `limits`: only a quota on `limits.*`
    /// reads them (nodes and Kueue count requests), and measuring them was half of what
    /// judging a GPU pod's feasibility cost.
    pub fn measure(pod: &Pod, limits: bool) -> Usage {
        let Some(spec) = pod.spec.as_ref() else {
            return Usage::default();
        };
        let mut usage = Usage::default();
        let halves: &[bool] = if limits { &[false, true] } else { &[false] };
        for &limits in halves {
            let mut total = containers_aggregate(spec, limits);
            if let Some(overhead) = spec.overhead.as_ref() {
                let overhead = amounts(Some(overhead));
                if limits {
                    // A limit is raised by the overhead only where the pod has one.
                    for (k, v) in overhead {
                        if let Some(t) = total.get_mut(&k) {
                            *t += v;
                        }
                    }
                } else {
                    add(&mut total, &overhead);
                }
            }
            // Pod-level resources, where the pod sets them, are what it counts for.
            if let Some(pod_level) = spec.resources.as_ref().and_then(|r| pick(r, limits)) {
                total.extend(amounts(Some(pod_level)));
            }
            if limits {
                usage.limits = total;
            } else {
                usage.requests = total;
            }
        }
        usage
    }

    /// This usage `n` times over.
    pub fn times(&self, n: i128) -> Usage {
        let scale = |m: &Amounts| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.saturating_mul(n)))
                .collect()
        };
        Usage {
            requests: scale(&self.requests),
            limits: scale(&self.limits),
        }
    }

    /// Adds `other` to this usage.
    pub fn add(&mut self, other: &Usage) {
        add(&mut self.requests, &other.requests);
        add(&mut self.limits, &other.limits);
    }
}

/// One thing that stands between a pod and running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// True: it can never run as written. False: not now (a quota in use), or not all at
    /// once (`in_turns`).
    pub never: bool,
    /// Pods that need not run together and do not fit the quota all at once: they run a
    /// part at a time.
    pub in_turns: bool,
    /// For a person: what rules it out, the numbers, and what to change.
    pub message: String,
}

/// What the context says of one pod.
#[derive(Debug, Clone, Default)]
pub struct Feasibility {
    pub usage: Usage,
    pub findings: Vec<Finding>,
    /// What could not be checked, for one warning: "the cluster's nodes (not known yet)".
    pub unknown: Vec<String>,
    /// The quotas of the pod's namespace that apply to it: a workload's pods together are
    /// held to them too.
    pub quotas: Vec<Arc<ResourceQuota>>,
    /// Where the apiserver's own ResourceQuota admission refuses the pod's create (after
    /// the webhooks, whatever they said), its answer in its words (a 1.36 apiserver's):
    /// the first quota whose "must specify" or usage fails. Only quotas the quota
    /// controller has written a status for count, as for the apiserver.
    pub admission: Option<String>,
}

impl Finding {
    /// The warning a user reads of it: `{subject} can never run: ...`, `cannot run now`,
    /// or, for pods that run in turns, the finding alone.
    pub fn warning(&self, subject: &str) -> String {
        let t = if self.never {
            crate::words::Template("tollgate: {subject} can never run: {finding}")
        } else if self.in_turns {
            crate::words::Template("tollgate: {subject}: {finding}")
        } else {
            crate::words::Template("tollgate: {subject} cannot run now: {finding}")
        };
        t.fill(&[("subject", subject), ("finding", &self.message)])
    }
}

impl Feasibility {
    /// Whether something rules the pod out for good.
    pub fn never(&self) -> bool {
        self.findings.iter().any(|f| f.never)
    }
}

/// What the cluster context holds that a pod is judged against, asked once per pod (None:
/// the context keeps no such cache).
pub struct Known {
    quotas: Option<Lookup<Arc<[Arc<ResourceQuota>]>>>,
    nodes: Option<Lookup<Arc<Nodes>>>,
    classes: Option<Lookup<Arc<BTreeSet<String>>>>,
}

impl Known {
    pub fn of(cluster: &dyn Cluster, namespace: &str) -> Known {
        Known {
            quotas: cluster.resource_quotas(namespace),
            nodes: cluster.nodes(),
            classes: cluster.device_classes(),
        }
    }

    /// Whether a pod's placement (node selector, affinity, tolerations) is read: by the
    /// nodes, and by a quota's scope.
    pub fn reads_placement(&self) -> bool {
        self.nodes.is_some() || self.quotas.is_some()
    }
}

/// Whether the person who applied the pod is already told that a container (by name)
/// requests no `resource`: validation's missing requests, in a mode that says them.
pub type Told<'a> = &'a dyn Fn(&str, &str) -> bool;

/// Judges one pod (as it will be admitted: mutated and defaulted) in `namespace`. `queued`:
/// the pod is of a workload held to a Kueue queue the context knows, so its usage is
/// measured whatever else the context knows (`kueue` judges the workload's pods in all).
/// `told`: the missing requests the user already reads of, which a quota's "must specify"
/// does not say a second time.
pub fn pod(
    pod: &Pod,
    namespace: &str,
    cluster: &dyn Cluster,
    known: Known,
    queued: bool,
    told: Told<'_>,
) -> Feasibility {
    let mut out = Feasibility::default();
    let Known {
        quotas,
        nodes,
        classes,
    } = known;
    // Nothing to judge it against: measuring what it asks for would be wasted.
    if !queued && quotas.is_none() && nodes.is_none() && classes.is_none() {
        return out;
    }
    let limits = matches!(&quotas, Some(Lookup::Found(q)) if q.iter().any(|q| tracks_limits(q)));
    out.usage = Usage::measure(pod, limits);
    match quotas {
        None => {}
        Some(Lookup::Found(q)) => check_quotas(pod, &q, told, &mut out),
        Some(_) => out.unknown.push(format!(
            "the ResourceQuotas of namespace {}",
            quote(namespace)
        )),
    }
    match nodes {
        None => {}
        Some(Lookup::Found(n)) if n.count() == 0 => out
            .unknown
            .push("the nodes (none is listed as schedulable)".into()),
        Some(Lookup::Found(n)) => check_nodes(pod, &n, &mut out),
        Some(_) => out.unknown.push("the cluster's nodes".into()),
    }
    match classes {
        None => {}
        Some(Lookup::Found(c)) => check_device_classes(pod, namespace, cluster, &c, &mut out),
        Some(_) => out.unknown.push("the cluster's DeviceClasses".into()),
    }
    out
}

// ------------------------------------------------------------------------------------
// Quotas.

/// The quota resources a pod counts for, and where its usage of each is read.
enum Tracked<'a> {
    /// `pods`, `count/pods`: one.
    Pods,
    Requests(&'a str),
    Limits(&'a str),
}

/// What quota resource `key` counts of a pod; None for one the pod evaluator does not
/// track (`services`, `requests.storage`, `count/jobs.batch`, ...).
fn tracked(key: &str) -> Option<Tracked<'_>> {
    match key {
        "pods" | "count/pods" => Some(Tracked::Pods),
        "cpu" | "memory" | "ephemeral-storage" => Some(Tracked::Requests(key)),
        _ if key.starts_with("hugepages-") => Some(Tracked::Requests(key)),
        _ => {
            if let Some(r) = key.strip_prefix("limits.") {
                return matches!(r, "cpu" | "memory" | "ephemeral-storage")
                    .then_some(Tracked::Limits(r));
            }
            let r = key.strip_prefix("requests.")?;
            let native =
                matches!(r, "cpu" | "memory" | "ephemeral-storage") || r.starts_with("hugepages-");
            (native || quantity::is_extended_resource(r)).then_some(Tracked::Requests(r))
        }
    }
}

/// Whether quota `q` counts a pod's limits (`limits.cpu`, ...).
fn tracks_limits(q: &ResourceQuota) -> bool {
    q.spec
        .as_ref()
        .and_then(|s| s.hard.as_ref())
        .is_some_and(|h| {
            h.keys()
                .any(|k| matches!(tracked(k), Some(Tracked::Limits(_))))
        })
}

/// The quota resources that require each container to set what they track: cpu and
/// memory only ("a mistake", as the evaluator says, not repeated for other resources).
const MUST_SPECIFY: [&str; 6] = [
    "cpu",
    "memory",
    "requests.cpu",
    "requests.memory",
    "limits.cpu",
    "limits.memory",
];

/// Whether quota `q` applies to `pod`: Some(true/false), or None when a scope of it cannot
/// be decided from the pod (its name, for the message).
fn applies(q: &ResourceQuota, pod: &Pod) -> Result<bool, String> {
    let Some(spec) = q.spec.as_ref() else {
        return Ok(true);
    };
    let p = pod.spec.as_ref();
    let terminating = p
        .and_then(|s| s.active_deadline_seconds)
        .is_some_and(|d| d >= 0);
    let best_effort = p.is_some_and(|s| {
        crate::pod::containers(s).all(|(_, c)| {
            c.resources.as_ref().is_none_or(|r| {
                ["cpu", "memory"].iter().all(|k| {
                    !r.requests.as_ref().is_some_and(|m| m.contains_key(*k))
                        && !r.limits.as_ref().is_some_and(|m| m.contains_key(*k))
                })
            })
        })
    });
    let priority = p
        .and_then(|s| s.priority_class_name.as_deref())
        .unwrap_or("");
    let cross_namespace = p.and_then(|s| s.affinity.as_ref()).is_some_and(|a| {
        let terms = |t: Option<&k8s_openapi::api::core::v1::PodAffinity>| {
            t.is_some_and(|t| {
                t.required_during_scheduling_ignored_during_execution
                    .iter()
                    .flatten()
                    .chain(
                        t.preferred_during_scheduling_ignored_during_execution
                            .iter()
                            .flatten()
                            .map(|w| &w.pod_affinity_term),
                    )
                    .any(|t| {
                        t.namespaces.as_ref().is_some_and(|n| !n.is_empty())
                            || t.namespace_selector.is_some()
                    })
            })
        };
        let anti = a
            .pod_anti_affinity
            .as_ref()
            .map(|x| k8s_openapi::api::core::v1::PodAffinity {
                required_during_scheduling_ignored_during_execution: x
                    .required_during_scheduling_ignored_during_execution
                    .clone(),
                preferred_during_scheduling_ignored_during_execution: x
                    .preferred_during_scheduling_ignored_during_execution
                    .clone(),
            });
        terms(a.pod_affinity.as_ref()) || terms(anti.as_ref())
    });
    let scope = |name: &str| -> Result<bool, String> {
        Ok(match name {
            "Terminating" => terminating,
            "NotTerminating" => !terminating,
            "BestEffort" => best_effort,
            "NotBestEffort" => !best_effort,
            "PriorityClass" => !priority.is_empty(),
            "CrossNamespacePodAffinity" => cross_namespace,
            other => return Err(other.to_owned()),
        })
    };
    for s in spec.scopes.iter().flatten() {
        if !scope(s)? {
            return Ok(false);
        }
    }
    for r in spec
        .scope_selector
        .iter()
        .flat_map(|s| s.match_expressions.iter().flatten())
    {
        let holds = match (r.scope_name.as_str(), r.operator.as_str()) {
            ("PriorityClass", "In") => r.values.iter().flatten().any(|v| v == priority),
            ("PriorityClass", "NotIn") => !r.values.iter().flatten().any(|v| v == priority),
            ("PriorityClass", "Exists") => !priority.is_empty(),
            ("PriorityClass", "DoesNotExist") => priority.is_empty(),
            (name, "Exists") => scope(name)?,
            (name, "DoesNotExist") => !scope(name)?,
            (name, _) => return Err(name.to_owned()),
        };
        if !holds {
            return Ok(false);
        }
    }
    Ok(true)
}

fn check_quotas(pod: &Pod, quotas: &[Arc<ResourceQuota>], told: Told<'_>, out: &mut Feasibility) {
    for q in quotas {
        let name = q.metadata.name.as_deref().unwrap_or("");
        match applies(q, pod) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(scope) => {
                out.unknown.push(format!(
                    "quota {} (its scope {scope} cannot be told from a pod)",
                    quote(name)
                ));
                continue;
            }
        }
        out.quotas.push(q.clone());
        must_specify(pod, q, told, out);
        let over = over(q, &out.usage, 1);
        if out.admission.is_none() && !over.is_empty() && has_status(q) {
            let list = |f: &dyn Fn(&Over) -> &str| {
                over.iter()
                    .map(|o| format!("{}={}", o.key, f(o)))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            out.admission = Some(format!(
                "exceeded quota: {name}, requested: {}, used: {}, limited: {}",
                list(&|o| &o.asked),
                list(&|o| o.in_use.as_deref().unwrap_or("0")),
                list(&|o| &o.limit)
            ));
        }
        let found = exceeded(q, over);
        out.findings.extend(found);
    }
}

/// A quota that tracks cpu or memory refuses a pod one of whose containers does not set
/// what it tracks, with "must specify", unless the pod sets it at pod level. A missing
/// request the user is already told of (`told`) is not said again: the fix is the same.
fn must_specify(pod: &Pod, q: &ResourceQuota, told: Told<'_>, out: &mut Feasibility) {
    let Some(spec) = pod.spec.as_ref() else {
        return;
    };
    let hard = q.spec.as_ref().and_then(|s| s.hard.as_ref());
    // What the quota admission says, where it refuses: each key it tracks (in order) with
    // the containers that set none.
    let mut admission: Vec<(&str, Vec<&str>)> = vec![];
    for key in MUST_SPECIFY
        .iter()
        .filter(|k| hard.is_some_and(|h| h.contains_key(**k)))
    {
        let (limits, resource) = match key.split_once('.') {
            Some(("limits", r)) => (true, r),
            Some((_, r)) => (false, r),
            None => (false, *key),
        };
        // A pod that sets the resource for the whole pod (KEP-2837; a pod-level limit
        // stands in for a missing pod-level request) is counted by it, and the quota
        // admits it whatever its containers set (as a 1.36 apiserver does).
        let pod_level = spec.resources.as_ref().is_some_and(|r| {
            let has = |m: Option<&BTreeMap<String, Quantity>>| {
                m.is_some_and(|m| m.contains_key(resource))
            };
            has(r.limits.as_ref()) || (!limits && has(r.requests.as_ref()))
        });
        if pod_level {
            continue;
        }
        let sets_none = |c: &&k8s_openapi::api::core::v1::Container| {
            let r = c.resources.as_ref();
            let m = if limits {
                r.and_then(|r| r.limits.as_ref())
            } else {
                r.and_then(|r| r.requests.as_ref())
            };
            !m.is_some_and(|m| m.contains_key(resource))
        };
        let none: Vec<_> = crate::pod::containers(spec)
            .filter(|(_, c)| sets_none(c))
            .collect();
        if none.is_empty() {
            continue;
        }
        admission.push((key, none.iter().map(|(_, c)| c.name.as_str()).collect()));
        let missing: Vec<String> = none
            .iter()
            .filter(|(_, c)| limits || !told(&c.name, resource))
            .map(|(kind, c)| format!("{} {}", kind.noun(), quote(&c.name)))
            .collect();
        if missing.is_empty() {
            continue;
        }
        let what = if limits { "limit" } else { "request" };
        let subject = quota_subject(q);
        out.findings.push(Finding {
            never: true,
            in_turns: false,
            message: format!(
                "{subject} tracks {key}, so the apiserver refuses a pod any container of which sets no {resource} {what} (\"must specify {key}\"): {} {} none. Set a {resource} {what} on {}",
                crate::words::join_words(&missing),
                if missing.len() == 1 { "sets" } else { "set" },
                if missing.len() == 1 { "it" } else { "each" },
            ),
        });
    }
    if out.admission.is_none() && !admission.is_empty() && has_status(q) {
        admission.sort_by_key(|(k, _)| *k);
        let list: Vec<String> = admission
            .iter()
            .map(|(k, cs)| format!("{k} for: {}", cs.join(",")))
            .collect();
        out.admission = Some(format!(
            "failed quota: {}: must specify {}",
            q.metadata.name.as_deref().unwrap_or(""),
            list.join("; ")
        ));
    }
}

/// Whether the quota controller has written what quota `q` allows: the apiserver's quota
/// admission holds a pod only to such a quota.
fn has_status(q: &ResourceQuota) -> bool {
    q.status
        .as_ref()
        .and_then(|s| s.hard.as_ref())
        .is_some_and(|h| !h.is_empty())
}

/// One quota resource a usage does not fit in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Over {
    /// The quota resource (`requests.nvidia.com/gpu`).
    pub key: String,
    /// What the quota allows, what is asked and, when known, what is in use now, as
    /// quantities of the resource.
    pub limit: String,
    pub asked: String,
    pub in_use: Option<String>,
    /// True: over what the quota allows at all; false: over what is left of it now.
    pub never: bool,
}

/// What of quota `q` `usage` (of `pods` pods) does not fit in: what it allows at all, or
/// what is left of it now.
pub fn over(q: &ResourceQuota, usage: &Usage, pods: i128) -> Vec<Over> {
    let mut out = vec![];
    let Some(hard) = q.spec.as_ref().and_then(|s| s.hard.as_ref()) else {
        return out;
    };
    let used = q.status.as_ref().and_then(|s| s.used.as_ref());
    for (key, limit) in hard {
        let Some(t) = tracked(key) else { continue };
        let (asked, resource) = match t {
            Tracked::Pods => (pods.saturating_mul(1_000_000_000), "pods"),
            Tracked::Requests(r) => (usage.requests.get(r).copied().unwrap_or(0), r),
            Tracked::Limits(r) => (usage.limits.get(r).copied().unwrap_or(0), r),
        };
        // What the pod does not ask for cannot exceed the quota: its limit is not read.
        if asked <= 0 {
            continue;
        }
        let Ok(limit) = quantity::parse(&limit.0) else {
            continue;
        };
        let show = |n: i128| quantity::format_for(resource, n);
        let in_use = used
            .and_then(|u| u.get(key))
            .and_then(|q| quantity::parse(&q.0).ok());
        let never = asked > limit;
        if never || in_use.is_some_and(|u| u.saturating_add(asked) > limit) {
            out.push(Over {
                key: key.clone(),
                limit: show(limit),
                asked: show(asked),
                in_use: in_use.map(show),
                never,
            });
        }
    }
    out
}

/// How a quota names itself in a message: `quota "gpu" of namespace "ml"`.
pub fn quota_subject(q: &ResourceQuota) -> String {
    format!(
        "quota {} of namespace {}",
        quote(q.metadata.name.as_deref().unwrap_or("")),
        quote(q.metadata.namespace.as_deref().unwrap_or(""))
    )
}

/// What of quota `q` one pod's usage exceeds, worded for the pod.
fn exceeded(q: &ResourceQuota, over: Vec<Over>) -> Vec<Finding> {
    // Nearly every pod fits: no name to format then.
    if over.is_empty() {
        return vec![];
    }
    let subject = quota_subject(q);
    over.into_iter()
        .map(|o| Finding {
            never: o.never,
            in_turns: false,
            message: {
                // In words: what a person writes (`1Ti + 64Mi`), where the apiserver's own
                // refusal quotes the exact quantities.
                let resource = o.key.rsplit_once('.').map_or(o.key.as_str(), |(_, r)| r);
                let said = |q: &str| {
                    quantity::parse(q).map_or_else(|_| q.to_owned(), |n| quantity::human(resource, n))
                };
                let (limit, asked) = (said(&o.limit), said(&o.asked));
                if o.never {
                    format!(
                        "{subject} allows {}: {limit}, and the pod asks for {asked}: it can never be admitted. Ask for at most {limit}, or ask your platform team to raise the quota",
                        o.key
                    )
                } else {
                    format!(
                        "{subject}: {} of {limit} {} are in use now, and the pod asks for {asked}: it waits until enough is freed",
                        o.in_use.as_deref().map_or_else(|| "?".to_owned(), said),
                        o.key,
                    )
                }
            },
        })
        .collect()
}

// ------------------------------------------------------------------------------------
// Nodes.

fn check_nodes(pod: &Pod, nodes: &Nodes, out: &mut Feasibility) {
    let Some(spec) = pod.spec.as_ref() else {
        return;
    };
    // The nodes its selectors allow, then those whose taints it tolerates.
    let mut allowed: Vec<(&Shape, usize)> = vec![];
    let mut by_selector = 0usize;
    let mut untolerated: BTreeMap<&Taint, usize> = BTreeMap::new();
    // Only a pod that names nodes (`nodeName`, the hostname label, `metadata.name`) tells
    // the hosts of one shape apart; for any other, one look per shape answers for all its
    // hosts, so the cost does not grow with the node count.
    let per_host = names_nodes(pod);
    for shape in &nodes.shapes {
        let hosts = if per_host {
            shape
                .hosts
                .iter()
                .filter(|h| {
                    spec.node_name.as_deref().is_none_or(|n| n == h.name)
                        && selected(pod, &shape.key.labels, &h.name, h.hostname.as_deref())
                })
                .count()
        } else if selected(pod, &shape.key.labels, "", None) {
            shape.hosts.len()
        } else {
            0
        };
        if hosts == 0 {
            by_selector += shape.hosts.len();
            continue;
        }
        match shape.key.taints.iter().find(|t| !tolerated(pod, t)) {
            Some(t) => *untolerated.entry(t).or_default() += hosts,
            None => allowed.push((shape, hosts)),
        }
    }
    if allowed.is_empty() {
        let total = nodes.count();
        let mut why = vec![];
        let mut fix = vec![];
        if by_selector > 0 {
            let mut what = format!(
                "{} of {total} {} {} not match its {}",
                by_selector,
                nodes_word(total),
                if by_selector == 1 { "does" } else { "do" },
                selector_words(pod)
            );
            let found = selector_values(pod, nodes);
            if !found.is_empty() {
                what.push_str(&format!("; the nodes have {}", found.join("; ")));
            }
            why.push(what);
            fix.push(format!("change the {}", selector_words(pod)));
        }
        for (t, n) in &untolerated {
            why.push(format!(
                "{n} {} tainted {t}, which it does not tolerate",
                if *n == 1 { "is" } else { "are" }
            ));
        }
        if !untolerated.is_empty() {
            fix.push(
                "add a toleration of those taints if the nodes are meant for you (a pool tainted for another team is not)"
                    .to_owned(),
            );
        }
        fix.push("ask your platform team which nodes are for you".into());
        out.findings.push(Finding {
            never: true,
            in_turns: false,
            message: format!(
                "no node may run it: {}. To fix it, {}",
                why.join("; "),
                fix.join(", or ")
            ),
        });
        return;
    }
    // Nodes it may use exist: does one offer what one pod asks for?
    let asked: Vec<(&String, i128)> = out
        .usage
        .requests
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| (k, *v))
        .collect();
    let fits = |s: &Shape| {
        asked
            .iter()
            .all(|(k, v)| s.key.allocatable.get(*k).is_some_and(|a| a >= v))
            && s.key
                .allocatable
                .get("pods")
                .is_none_or(|p| *p >= 1_000_000_000)
    };
    if allowed.iter().any(|(s, _)| fits(s)) {
        return;
    }
    let may_use: usize = allowed.iter().map(|(_, n)| n).sum();
    let mut short: Vec<String> = vec![];
    for (k, v) in &asked {
        let best = allowed
            .iter()
            .filter_map(|(s, _)| s.key.allocatable.get(*k).copied())
            .max()
            .unwrap_or(0);
        if best >= *v {
            continue;
        }
        let show = |n: i128| quantity::human(k, n);
        short.push(if best <= 0 {
            // What its nodes offer of the same vendor (another MIG profile, say).
            let domain = k.split_once('/').map(|(d, _)| d);
            let mut offered: Vec<&str> = allowed
                .iter()
                .flat_map(|(s, _)| s.key.allocatable.keys())
                .filter(|r| domain.is_some() && r.split_once('/').map(|(d, _)| d) == domain)
                .map(String::as_str)
                .collect();
            offered.sort_unstable();
            offered.dedup();
            let instead = if offered.is_empty() {
                String::new()
            } else {
                format!(" (they offer {})", offered.join(", "))
            };
            format!(
                "it asks for {} {k}, which none of the {may_use} {} it may use offers{instead}",
                show(*v),
                nodes_word(may_use)
            )
        } else {
            format!(
                "it asks for {} {k}, and the largest of the {may_use} {} it may use offers {}",
                show(*v),
                nodes_word(may_use),
                show(best)
            )
        });
    }
    if short.is_empty() {
        // Every resource is offered somewhere, never all on one node.
        short.push("no node it may use offers all it asks for at once".into());
    }
    out.findings.push(Finding {
        never: true,
        in_turns: false,
        message: format!(
            "no node can run it: {}. Ask for less per pod (more pods, fewer resources each), or ask your platform team for larger nodes",
            short.join("; ")
        ),
    });
}

fn nodes_word(n: usize) -> &'static str {
    if n == 1 {
        "node"
    } else {
        "nodes"
    }
}

/// The values the nodes have for the labels of the pod's nodeSelector that no node has as
/// asked: `nvidia.com/gpu.product: A100-SXM4-80GB (2 nodes)`.
fn selector_values(pod: &Pod, nodes: &Nodes) -> Vec<String> {
    let Some(selector) = pod.spec.as_ref().and_then(|s| s.node_selector.as_ref()) else {
        return vec![];
    };
    let mut out = vec![];
    for (k, v) in selector {
        if k == HOSTNAME_LABEL {
            continue;
        }
        let mut values: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &nodes.shapes {
            if let Some(have) = s.key.labels.get(k) {
                *values.entry(have).or_default() += s.hosts.len();
            }
        }
        if values.contains_key(v.as_str()) {
            continue;
        }
        let listed: Vec<String> = values
            .iter()
            .map(|(have, n)| format!("{k}: {have} ({n} {})", nodes_word(*n)))
            .collect();
        out.push(if listed.is_empty() {
            format!("no {k} label")
        } else {
            listed.join(", ")
        });
    }
    out
}

/// How a message names the pod's node selection.
fn selector_words(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    let mut words = vec![];
    if let Some(s) = spec.and_then(|s| s.node_selector.as_ref()) {
        let pairs: Vec<String> = s.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        if !pairs.is_empty() {
            words.push(format!("nodeSelector {}", pairs.join(", ")));
        }
    }
    if required_terms(pod).is_some() {
        words.push("required node affinity".into());
    }
    if spec.and_then(|s| s.node_name.as_deref()).is_some() {
        words.push("nodeName".into());
    }
    if words.is_empty() {
        "node selection".into()
    } else {
        words.join(" and ")
    }
}

fn required_terms(pod: &Pod) -> Option<&Vec<k8s_openapi::api::core::v1::NodeSelectorTerm>> {
    pod.spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .map(|s| &s.node_selector_terms)
}

/// Whether the pod's `nodeName`, `nodeSelector` or required node affinity read what differs
/// from node to node of one shape: its name or its hostname label.
fn names_nodes(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.node_name.is_some()
        || spec
            .node_selector
            .as_ref()
            .is_some_and(|s| s.contains_key(HOSTNAME_LABEL))
        || required_terms(pod).is_some_and(|terms| {
            terms.iter().any(|t| {
                t.match_fields.as_ref().is_some_and(|f| !f.is_empty())
                    || t.match_expressions
                        .iter()
                        .flatten()
                        .any(|r| r.key == HOSTNAME_LABEL)
            })
        })
}

/// Whether a node of these labels (its hostname aside) and name passes the pod's
/// `nodeSelector` and required node affinity (terms ORed, requirements ANDed).
fn selected(
    pod: &Pod,
    labels: &BTreeMap<String, String>,
    name: &str,
    hostname: Option<&str>,
) -> bool {
    let label = |k: &str| {
        if k == HOSTNAME_LABEL {
            hostname
        } else {
            labels.get(k).map(String::as_str)
        }
    };
    let spec = pod.spec.as_ref();
    if let Some(s) = spec.and_then(|s| s.node_selector.as_ref()) {
        if !s.iter().all(|(k, v)| label(k) == Some(v.as_str())) {
            return false;
        }
    }
    let Some(terms) = required_terms(pod) else {
        return true;
    };
    terms.iter().any(|t| {
        t.match_expressions
            .iter()
            .flatten()
            .all(|r| requirement(r, label(&r.key)))
            && t.match_fields
                .iter()
                .flatten()
                .all(|r| r.key == "metadata.name" && requirement(r, Some(name)))
    })
}

fn requirement(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => match (
            value.and_then(number),
            values.first().and_then(|v| number(v)),
        ) {
            (Some(v), Some(x)) => v > x,
            _ => false,
        },
        "Lt" => match (
            value.and_then(number),
            values.first().and_then(|v| number(v)),
        ) {
            (Some(v), Some(x)) => v < x,
            _ => false,
        },
        _ => false,
    }
}

/// Whether one of the pod's tolerations tolerates taint `t` (`v1.Toleration.ToleratesTaint`).
fn tolerated(pod: &Pod, t: &Taint) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .into_iter()
        .flatten()
        .any(|tol| {
            let effect = tol.effect.as_deref().unwrap_or("");
            if !effect.is_empty() && effect != t.effect {
                return false;
            }
            let key = tol.key.as_deref().unwrap_or("");
            let operator = tol.operator.as_deref().unwrap_or("Equal");
            if key.is_empty() {
                return operator == "Exists";
            }
            key == t.key
                && match operator {
                    "Exists" => true,
                    "Equal" | "" => tol.value.as_deref().unwrap_or("") == t.value,
                    _ => false,
                }
        })
}

// ------------------------------------------------------------------------------------
// DeviceClasses.

fn check_device_classes(
    pod: &Pod,
    namespace: &str,
    cluster: &dyn Cluster,
    classes: &BTreeSet<String>,
    out: &mut Feasibility,
) {
    for claim in pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
    {
        let spec = if let Some(n) = &claim.resource_claim_name {
            cluster
                .resource_claim(namespace, n)
                .found()
                .and_then(|c| c.spec.devices.clone())
        } else if let Some(n) = &claim.resource_claim_template_name {
            cluster
                .resource_claim_template(namespace, n)
                .found()
                .and_then(|t| t.spec.spec.devices.clone())
        } else {
            None
        };
        // A claim tollgate could not read was said so already; nothing to check here.
        let Some(devices) = spec else { continue };
        for r in devices.requests.iter().flatten() {
            let wanted: Vec<&str> = match (&r.exactly, &r.first_available) {
                (Some(e), _) => vec![e.device_class_name.as_str()],
                (None, Some(alts)) => alts.iter().map(|a| a.device_class_name.as_str()).collect(),
                (None, None) => vec![],
            };
            if wanted.is_empty() || wanted.iter().any(|c| classes.contains(*c)) {
                continue;
            }
            let known: Vec<&str> = classes.iter().map(String::as_str).collect();
            out.findings.push(Finding {
                never: true,
                in_turns: false,
                message: format!(
                    "claim {} asks for DeviceClass {}, which the cluster does not have: it can never be allocated. Use one of the cluster's classes ({})",
                    quote(&claim.name),
                    wanted
                        .iter()
                        .map(|c| quote(c))
                        .collect::<Vec<_>>()
                        .join(" or "),
                    if known.is_empty() {
                        "it has none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            });
        }
    }
}

// ------------------------------------------------------------------------------------
// Kueue.

/// The label with which a workload names the Kueue LocalQueue it is submitted to.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// What a workload submitted to Kueue (`KUEUE_QUEUE_LABEL` = `queue`) can get: Kueue admits
/// it only within its ClusterQueue's quota (nominal, plus what it may borrow in its
/// cohort), and all its pods at once. `usage` is all its pods' (`pods` of them). Err: the
/// queues are not known (what to say of them); Ok: the findings.
pub fn kueue(
    queue: &str,
    namespace: &str,
    cluster: &dyn Cluster,
    usage: &Usage,
    pods: i128,
) -> Result<Vec<Finding>, String> {
    let local = match cluster.kueue_local_queue(namespace, queue) {
        None | Some(Lookup::Unknown) => {
            return Err(format!("Kueue's LocalQueue {}", quote(queue)));
        }
        Some(Lookup::Absent) => {
            return Ok(vec![Finding {
                never: false,
                in_turns: false,
                message: format!(
                    "its LocalQueue {} does not exist in namespace {}: Kueue keeps it suspended until it does",
                    quote(queue),
                    quote(namespace)
                ),
            }]);
        }
        Some(Lookup::Found(l)) => l,
    };
    let cq_name = local
        .pointer("/spec/clusterQueue")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    let cq = match cluster.kueue_cluster_queue(cq_name) {
        Some(Lookup::Found(cq)) => cq,
        Some(Lookup::Absent) => {
            return Ok(vec![Finding {
                never: false,
                in_turns: false,
                message: format!(
                    "the ClusterQueue {} of its LocalQueue {} does not exist: Kueue keeps it suspended until it does",
                    quote(cq_name),
                    quote(queue)
                ),
            }]);
        }
        _ => return Err(format!("Kueue's ClusterQueue {}", quote(cq_name))),
    };
    let spec = cq.get("spec");
    // v1beta2 names the cohort `cohortName`; v1beta1 and v1 `cohort`.
    let cohort = ["cohortName", "cohort"].iter().any(|k| {
        spec.and_then(|s| s.get(*k))
            .and_then(serde_json::Value::as_str)
            .is_some_and(|c| !c.is_empty())
    });
    // Per resource: the most one workload can get (None: no limit to its borrowing).
    let mut most: BTreeMap<String, Option<i128>> = BTreeMap::new();
    for group in spec
        .and_then(|s| s.get("resourceGroups"))
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
    {
        for flavor in group
            .get("flavors")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
        {
            for r in flavor
                .get("resources")
                .and_then(serde_json::Value::as_array)
                .into_iter()
                .flatten()
            {
                let Some(name) = r.get("name").and_then(serde_json::Value::as_str) else {
                    continue;
                };
                let amount = |k: &str| {
                    r.get(k).and_then(|q| match q {
                        serde_json::Value::String(s) => quantity::parse(s).ok(),
                        serde_json::Value::Number(n) => quantity::parse(&n.to_string()).ok(),
                        _ => None,
                    })
                };
                let nominal = amount("nominalQuota").unwrap_or(0);
                let borrow = if cohort {
                    amount("borrowingLimit")
                } else {
                    Some(0)
                };
                let slot = most.entry(name.to_owned()).or_insert(Some(0));
                *slot = match (*slot, borrow) {
                    (Some(m), Some(b)) => Some(m.saturating_add(nominal).saturating_add(b)),
                    _ => None,
                };
            }
        }
    }
    let subject = format!(
        "ClusterQueue {} (of its LocalQueue {})",
        quote(cq_name),
        quote(queue)
    );
    let mut out = vec![];
    let mut asked: Vec<(String, i128)> = usage
        .requests
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    asked.push(("pods".into(), pods.saturating_mul(1_000_000_000)));
    for (resource, want) in asked {
        let show = |n: i128| quantity::human(&resource, n);
        match most.get(&resource) {
            // Not covered: Kueue admits no workload asking for it, unless its
            // configuration leaves the resource out (which tollgate cannot see).
            None if resource != "pods" => out.push(Finding {
                never: false,
                in_turns: false,
                message: format!(
                    "{subject} covers no {resource}, which its pods ask for: Kueue does not admit it unless its configuration leaves {resource} out"
                ),
            }),
            Some(Some(limit)) if want > *limit => out.push(Finding {
                never: true,
                in_turns: false,
                message: format!(
                    "{subject} lets one workload have at most {} {resource}{}, and its {pods} pods ask for {} in all: Kueue never admits it, and it stays suspended. Lower the replicas or what each pod asks for, or ask your platform team for more quota in the ClusterQueue",
                    show(*limit),
                    if cohort { " (nominal and borrowing)" } else { "" },
                    show(want)
                ),
            }),
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Objects;
    use serde_json::json;

    fn queues(cq_spec: serde_json::Value) -> Objects {
        let mut o = Objects::default();
        o.add_kueue_queue(
            json!({"kind": "LocalQueue", "metadata": {"name": "q", "namespace": "ml"},
            "spec": {"clusterQueue": "cq"}}),
        );
        o.add_kueue_queue(
            json!({"kind": "ClusterQueue", "metadata": {"name": "cq"}, "spec": cq_spec}),
        );
        o
    }

    fn gpus(n: i128) -> Usage {
        let mut u = Usage::default();
        u.requests
            .insert("nvidia.com/gpu".into(), n * 1_000_000_000);
        u
    }

    fn group(resource: &str, nominal: &str, borrowing: Option<&str>) -> serde_json::Value {
        let mut r = json!({"name": resource, "nominalQuota": nominal});
        if let Some(b) = borrowing {
            r["borrowingLimit"] = json!(b);
        }
        json!([{"coveredResources": [resource], "flavors": [{"name": "f", "resources": [r]}]}])
    }

    /// A pod that names a node (by `nodeName`, the hostname label or `metadata.name`) is
    /// judged host by host; any other once per shape, with the same answer.
    #[test]
    fn nodes_named_by_a_pod_are_told_apart_within_their_shape() {
        let nodes: Vec<k8s_openapi::api::core::v1::Node> = (0..3)
            .map(|i| {
                serde_json::from_value(json!({"metadata": {"name": format!("gpu-{i}"),
                    "labels": {"kubernetes.io/hostname": format!("host-{i}"), "pool": "a100"}},
                    "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "8", "pods": "110"}}}))
                .unwrap()
            })
            .collect();
        let nodes = Nodes::of(&nodes);
        assert_eq!(nodes.shapes.len(), 1);
        let judged = |spec: serde_json::Value| {
            let pod: Pod = serde_json::from_value(json!({"spec": spec})).unwrap();
            let mut out = Feasibility {
                usage: Usage::of(&pod),
                ..Feasibility::default()
            };
            check_nodes(&pod, &nodes, &mut out);
            (names_nodes(&pod), out.findings.len())
        };
        let c = json!([{"name": "c", "resources": {"requests": {"cpu": "1"}}}]);
        let term = |e: serde_json::Value| {
            json!({"containers": c, "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [e]}}}})
        };
        // Nothing names a node: the shape answers.
        assert_eq!(
            judged(json!({"containers": c, "nodeSelector": {"pool": "a100"}})),
            (false, 0)
        );
        assert_eq!(
            judged(json!({"containers": c, "nodeSelector": {"pool": "l4"}})),
            (false, 1)
        );
        // Named, by each of the four ways; a name no node has rules them all out.
        for (named, other) in [
            (
                json!({"containers": c, "nodeName": "gpu-1"}),
                json!({"containers": c, "nodeName": "gpu-9"}),
            ),
            (
                json!({"containers": c, "nodeSelector": {"kubernetes.io/hostname": "host-2"}}),
                json!({"containers": c, "nodeSelector": {"kubernetes.io/hostname": "gpu-2"}}),
            ),
            (
                term(
                    json!({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-0"]}]}),
                ),
                term(
                    json!({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-7"]}]}),
                ),
            ),
            (
                term(
                    json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-0"]}]}),
                ),
                term(
                    json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["host-0"]}]}),
                ),
            ),
        ] {
            assert_eq!(judged(named), (true, 0));
            assert_eq!(judged(other), (true, 1));
        }
    }

    #[test]
    fn kueue_holds_a_workload_to_nominal_plus_borrowing() {
        // No cohort: nominal alone.
        let o = queues(json!({"resourceGroups": group("nvidia.com/gpu", "8", None)}));
        let f = kueue("q", "ml", &o, &gpus(16), 4).unwrap();
        assert!(f.len() == 1 && f[0].never, "{f:?}");
        assert!(kueue("q", "ml", &o, &gpus(8), 2).unwrap().is_empty());
        // A cohort with a borrowing limit: nominal and borrowing.
        let o = queues(
            json!({"cohortName": "c", "resourceGroups": group("nvidia.com/gpu", "8", Some("8"))}),
        );
        assert!(kueue("q", "ml", &o, &gpus(16), 4).unwrap().is_empty());
        assert!(kueue("q", "ml", &o, &gpus(17), 4).unwrap()[0].never);
        // A cohort (v1beta1's `cohort`) without one: no limit tollgate can know.
        let o =
            queues(json!({"cohort": "c", "resourceGroups": group("nvidia.com/gpu", "8", None)}));
        assert!(kueue("q", "ml", &o, &gpus(1000), 4).unwrap().is_empty());
        // Flavors of one group add up: a workload's pod sets may land on different ones.
        let two = json!([{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "a", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "8"}]},
            {"name": "b", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]);
        let o = queues(json!({"resourceGroups": two}));
        assert!(kueue("q", "ml", &o, &gpus(16), 4).unwrap().is_empty());
    }

    #[test]
    fn kueue_says_what_it_cannot_decide_and_never_refuses_for_it() {
        // A resource the ClusterQueue does not cover: a warning (Kueue's configuration may
        // leave it out).
        let o = queues(json!({"resourceGroups": group("cpu", "8", None)}));
        let f = kueue("q", "ml", &o, &gpus(1), 1).unwrap();
        assert!(f.len() == 1 && !f[0].never && f[0].message.contains("covers no nvidia.com/gpu"));
        // A missing LocalQueue or ClusterQueue: suspended until it exists, a warning.
        assert!(!kueue("other", "ml", &o, &gpus(1), 1).unwrap()[0].never);
        let mut lone = Objects::default();
        lone.add_kueue_queue(
            json!({"kind": "LocalQueue", "metadata": {"name": "q", "namespace": "ml"},
            "spec": {"clusterQueue": "gone"}}),
        );
        let f = kueue("q", "ml", &lone, &gpus(1), 1).unwrap();
        assert!(!f[0].never && f[0].message.contains("\"gone\""), "{f:?}");
        // Queues not known at all: unknown, said as such by the caller.
        let e = kueue("q", "ml", &Objects::default(), &gpus(1), 1).unwrap_err();
        assert!(e.contains("LocalQueue"));
    }

    #[test]
    fn limits_are_measured_only_for_a_quota_that_counts_them() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": {
                "requests": {"cpu": "1", "memory": "1Gi"},
                "limits": {"cpu": "2", "memory": "8Gi"}
            }}]}
        }))
        .unwrap();
        let quota = |hard: serde_json::Value| {
            let mut o = Objects::default();
            o.add_quota(
                serde_json::from_value(json!({
                    "metadata": {"name": "q", "namespace": "ml"}, "spec": {"hard": hard}
                }))
                .unwrap(),
            );
            o
        };
        let none = |_: &str, _: &str| false;
        // Requests only: the limits are not read.
        let cluster = quota(json!({"requests.memory": "4Gi"}));
        let known = Known::of(&cluster, "ml");
        let f = super::pod(&pod, "ml", &cluster, known, false, &none);
        assert!(f.usage.limits.is_empty());
        assert!(f.findings.is_empty(), "{:?}", f.findings);
        // A quota on limits.memory reads them, and finds the pod's 8Gi over its 4Gi.
        let cluster = quota(json!({"limits.memory": "4Gi"}));
        let known = Known::of(&cluster, "ml");
        let f = super::pod(&pod, "ml", &cluster, known, false, &none);
        assert_eq!(f.usage.limits["memory"], 8 * (1 << 30) * 1_000_000_000);
        assert_eq!(f.findings.len(), 1);
        assert!(f.findings[0].never);
        assert!(
            f.findings[0].message.contains("allows limits.memory: 4Gi")
                && f.findings[0].message.contains("asks for 8Gi"),
            "{}",
            f.findings[0].message
        );
    }

    #[test]
    fn usage_counts_sidecars_init_containers_and_overhead_as_the_scheduler() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {"cpu": "2"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "2"}}}
                ],
                "initContainers": [
                    {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                    {"name": "i", "resources": {"requests": {"cpu": "5", "nvidia.com/gpu": "1"}}}
                ],
                "overhead": {"cpu": "250m"}
            }
        }))
        .unwrap();
        let g = 1_000_000_000i128;
        let u = Usage::of(&pod);
        // Regular containers and the sidecar: 4 cpu; the init container runs beside the
        // sidecar before it: 6; the larger, plus the overhead.
        assert_eq!(u.requests["cpu"], 6 * g + g / 4);
        assert_eq!(u.requests["memory"], (1 << 30) * g);
        assert_eq!(u.requests["nvidia.com/gpu"], g);
        // A limit is raised by the overhead where the pod has one.
        assert_eq!(u.limits["cpu"], 2 * g + g / 4);
        assert!(!u.limits.contains_key("memory"));
        assert_eq!(Usage::measure(&pod, false).requests, u.requests);
    }
}

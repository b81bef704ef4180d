//! The namespace's ResourceQuotas, as the apiserver's quota admission holds a pod to them
//! (`pkg/quota/v1/evaluator/core/pods.go`): `pods`, `count/pods`, cpu, memory,
//! ephemeral-storage as requests and limits, hugepages, `requests.<extended resource>`,
//! only where its scopes match the pod, and for cpu and memory every container required
//! to set what it tracks ("must specify"). What a usage does not fit in is data ([`Over`]);
//! the findings are worded from it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{Obstacle, Outlook, Told, Usage};
use crate::quantity;
use crate::words::quote;

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
pub(super) fn tracks_limits(q: &ResourceQuota) -> bool {
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

pub(super) fn check_quotas(
    pod: &Pod,
    quotas: &[Arc<ResourceQuota>],
    told: Told<'_>,
    out: &mut Outlook,
) {
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
fn must_specify(pod: &Pod, q: &ResourceQuota, told: Told<'_>, out: &mut Outlook) {
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
        out.findings.push(Obstacle {
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
pub(crate) struct Over {
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
pub(crate) fn over(q: &ResourceQuota, usage: &Usage, pods: i128) -> Vec<Over> {
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
pub(crate) fn quota_subject(q: &ResourceQuota) -> String {
    format!(
        "quota {} of namespace {}",
        quote(q.metadata.name.as_deref().unwrap_or("")),
        quote(q.metadata.namespace.as_deref().unwrap_or(""))
    )
}

/// What of quota `q` one pod's usage exceeds, worded for the pod.
fn exceeded(q: &ResourceQuota, over: Vec<Over>) -> Vec<Obstacle> {
    // Nearly every pod fits: no name to format then.
    if over.is_empty() {
        return vec![];
    }
    let subject = quota_subject(q);
    over.into_iter()
        .map(|o| Obstacle {
            never: o.never,
            in_turns: false,
            message: {
                // In words: what a person writes (`1Ti + 64Mi`), where the apiserver's own
                // refusal quotes the exact quantities.
                let resource = o.key.rsplit_once('.').map_or(o.key.as_str(), |(_, r)| r);
                let said = |q: &str| {
                    quantity::parse(q)
                        .map_or_else(|_| q.to_owned(), |n| quantity::human(resource, n))
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

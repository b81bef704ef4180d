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
//! refuses nothing: it is named in [`Outlook::unknown`].
//!
//! One source of what the cluster offers per file, each deciding into data first and
//! wording its [`Obstacle`]s from that: `usage` (what a pod counts for), `quotas`, `nodes`,
//! `classes` (DeviceClasses), `kueue` (a workload's ClusterQueue, which `workload` asks
//! with all its pods), `autoscaling` (what may add a node where none offers what a pod asks
//! for: the Cluster Autoscaler, Karpenter's NodePools; asked by `nodes` only then). This
//! face runs them for one pod ([`pod`]). A new source is a file here, a [`Cluster`] method it reads through
//! (docs/architecture.md, "Where new work goes"), and a line in [`pod`] or, for what a
//! workload's pods ask in all, in `workload`'s feasibility.

mod autoscaling;
mod classes;
mod kueue;
mod nodes;
mod placement;
mod quotas;
mod usage;

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};

use crate::capacity::Nodes;
use crate::cluster::{Cluster, ContextKind, Lookup, ObjectKey};
use crate::podsecurity::{pod_security_refusal, PodSecurity};
use crate::policy::Policy;
use crate::words::quote;

pub(crate) use kueue::{kueue, KUEUE_QUEUE_LABEL};
pub(crate) use nodes::may_use;
pub(crate) use quotas::{over, quota_subject, Over};
pub(crate) use usage::Usage;

/// One thing that stands between a pod and running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Obstacle {
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
pub(crate) struct Outlook {
    pub usage: Usage,
    pub findings: Vec<Obstacle>,
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

impl Obstacle {
    /// The warning a user reads of it: `{subject} can never run: ...`, `cannot run now`,
    /// or, for pods that run in turns, the finding alone.
    pub(crate) fn warning(&self, subject: &str) -> String {
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

/// What the cluster context holds that a pod is judged against, asked once per pod (None:
/// the context keeps no such cache).
pub(crate) struct Known {
    quotas: Option<Lookup<Arc<[Arc<ResourceQuota>]>>>,
    nodes: Option<Lookup<Arc<Nodes>>>,
    classes: Option<Lookup<Arc<BTreeSet<String>>>>,
    /// The namespace's Pod Security (None: no label, or the namespace is not known).
    security: Option<PodSecurity>,
}

impl Known {
    /// What the context holds for a pod of `namespace`; a namespace it does not know yet
    /// goes to `unresolved`, for the shell to fetch. `template`: the pod is a workload's
    /// template, held to the namespace's Pod Security here. A pod itself is not: the
    /// apiserver's own PodSecurity admission refuses it before the validating webhook sees
    /// it, and the webhook's fast parse of a pod does not read what Pod Security checks.
    pub(crate) fn of(
        cluster: &dyn Cluster,
        namespace: &str,
        template: bool,
        unresolved: &mut Vec<ObjectKey>,
    ) -> Known {
        Known {
            quotas: cluster.resource_quotas(namespace),
            nodes: cluster.nodes(),
            classes: cluster.device_classes(),
            security: if template {
                pod_security(cluster, namespace, unresolved)
            } else {
                None
            },
        }
    }

    /// Whether a pod's placement (node selector, affinity, tolerations) is read: by the
    /// nodes, and by a quota's scope.
    pub(crate) fn reads_placement(&self) -> bool {
        self.nodes.is_some() || self.quotas.is_some()
    }
}

/// The Pod Security of `namespace`, from its labels (None: it has none, or does not
/// exist). A namespace the context does not know yet (a cache that has not seen it) is put
/// in `unresolved`, so that the shell fetches it and judges again; until then nothing is
/// said of it.
pub(crate) fn pod_security(
    cluster: &dyn Cluster,
    namespace: &str,
    unresolved: &mut Vec<ObjectKey>,
) -> Option<PodSecurity> {
    match cluster.namespace(namespace) {
        Lookup::Found(n) => n.metadata.labels.as_ref().and_then(PodSecurity::of_labels),
        Lookup::Absent => None,
        Lookup::Unknown => {
            let key = ObjectKey {
                kind: ContextKind::Namespace,
                namespace: String::new(),
                name: namespace.to_owned(),
            };
            if !cluster.is_offline() && !namespace.is_empty() && !unresolved.contains(&key) {
                unresolved.push(key);
            }
            None
        }
    }
}

/// Whether the person who applied the pod is already told that a container (by name)
/// requests no `resource`: validation's missing requests, in a mode that says them.
pub(crate) type Told<'a> = &'a dyn Fn(&str, &str) -> bool;

/// Judges one pod (as it will be admitted: mutated and defaulted) in `namespace`. `queued`:
/// the pod is of a workload held to a Kueue queue the context knows, so its usage is
/// measured whatever else the context knows (`kueue` judges the workload's pods in all).
/// `told`: the missing requests the user already reads of, which a quota's "must specify"
/// does not say a second time.
pub(crate) fn pod(
    policy: &Policy,
    pod: &Pod,
    namespace: &str,
    cluster: &dyn Cluster,
    known: Known,
    queued: bool,
    told: Told<'_>,
) -> Outlook {
    let mut out = Outlook::default();
    let Known {
        quotas,
        nodes,
        classes,
        security,
    } = known;
    // Pod Security's enforce level refuses the pods' creation (a workload's, by its
    // controller), whatever else holds: in its own words, as the apiserver's refusal reads.
    if let (Some(security), Some(spec)) = (security, pod.spec.as_ref()) {
        if let Some(words) = pod_security_refusal(&security, &pod.metadata, spec) {
            out.findings.push(Obstacle {
                never: true,
                in_turns: false,
                message: format!(
                    "namespace {} enforces Pod Security, which refuses it: {words}",
                    quote(namespace)
                ),
            });
        }
    }
    // Nothing to judge it against: measuring what it asks for would be wasted.
    if !queued && quotas.is_none() && nodes.is_none() && classes.is_none() {
        return out;
    }
    let limits =
        matches!(&quotas, Some(Lookup::Found(q)) if q.iter().any(|q| quotas::tracks_limits(q)));
    out.usage = Usage::measure(pod, limits);
    match quotas {
        None => {}
        Some(Lookup::Found(q)) => quotas::check_quotas(pod, &q, told, &mut out),
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
        Some(Lookup::Found(n)) => nodes::check_nodes(policy, pod, &n, cluster, &mut out),
        Some(_) => out.unknown.push("the cluster's nodes".into()),
    }
    match classes {
        None => {}
        Some(Lookup::Found(c)) => {
            classes::check_device_classes(pod, namespace, cluster, &c, &mut out)
        }
        Some(_) => out.unknown.push("the cluster's DeviceClasses".into()),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Objects;
    use serde_json::json;

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
        let known = Known::of(&cluster, "ml", false, &mut vec![]);
        let f = super::pod(
            &Policy::builtin(),
            &pod,
            "ml",
            &cluster,
            known,
            false,
            &none,
        );
        assert!(f.usage.limits.is_empty());
        assert!(f.findings.is_empty(), "{:?}", f.findings);
        // A quota on limits.memory reads them, and finds the pod's 8Gi over its 4Gi.
        let cluster = quota(json!({"limits.memory": "4Gi"}));
        let known = Known::of(&cluster, "ml", false, &mut vec![]);
        let f = super::pod(
            &Policy::builtin(),
            &pod,
            "ml",
            &cluster,
            known,
            false,
            &none,
        );
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
}

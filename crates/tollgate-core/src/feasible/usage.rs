//! What a pod counts for: its effective requests and limits, as the scheduler and the
//! quota count them (`resourcehelper.PodRequests`/`PodLimits`: regular containers and
//! native sidecars summed, each init container on top of the sidecars before it, the larger
//! of the two; overhead added; pod-level resources where the pod sets them).

use k8s_openapi::api::core::v1::Pod;

use crate::pod::{add, amounts, containers_aggregate, pick, Amounts};

/// What a pod counts for: its effective requests and limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub requests: Amounts,
    pub limits: Amounts,
}

impl Usage {
    /// The pod's effective requests and limits, as the scheduler and the quota count them.
    #[cfg(test)]
    pub(crate) fn of(pod: &Pod) -> Usage {
        Usage::measure(pod, true)
    }

    /// [`Usage::of`], the limits left empty unless `limits`: only a quota on `limits.*`
    /// reads them (nodes and Kueue count requests), and measuring them was half of what
    /// judging a GPU pod's feasibility cost.
    pub(crate) fn measure(pod: &Pod, limits: bool) -> Usage {
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
    pub(crate) fn times(&self, n: i128) -> Usage {
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
    pub(crate) fn add(&mut self, other: &Usage) {
        add(&mut self.requests, &other.requests);
        add(&mut self.limits, &other.limits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

//! Which GPUs a pod asks for, of which class, in which containers.
//!
//! A pod gets GPUs three ways on a 1.33+ cluster, and tollgate reads all of them once per
//! review, before the mutation steps:
//! - an extended resource in a container's requests or limits: a full GPU
//!   (`nvidia.com/gpu`), a MIG slice of the device plugin's mixed strategy
//!   (`nvidia.com/mig-1g.10gb`), or a DRA-backed name (KEP-5004,
//!   `deviceclass.resource.kubernetes.io/gpu.nvidia.com`). Each unit counts as one GPU;
//! - a DRA claim: `spec.resourceClaims` names a ResourceClaim or ResourceClaimTemplate
//!   whose device requests name a DeviceClass of a GPU class, and the containers that list
//!   the claim in `resources.claims` are the ones that hold the devices. A plain `exactly`
//!   request counts its `count` (1 by default); `allocationMode: All` cannot be counted
//!   before allocation and counts as one GPU (with a warning); a `firstAvailable` request is
//!   tolerated for every alternative that is a GPU and counted as its first GPU alternative,
//!   the one the scheduler tries first.
//!
//! The pod as a whole tolerates the classes of every claim it has, whether or not a
//! container lists it: the scheduler places the pod by its claims.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Container, Pod, PodResourceClaim, Toleration};
use k8s_openapi::api::resource::v1::{DeviceRequest, ResourceClaimSpec};

use crate::cluster::{Cluster, ContextKind, Lookup, ObjectKey};
use crate::pod::{asked, containers};
use crate::policy::{Driver, GpuClass, Policy};
use crate::quantity;

const NANO: i128 = 1_000_000_000;

/// A class of the policy, with its name.
#[derive(Debug, Clone, Copy)]
pub struct Class<'p> {
    pub name: &'p str,
    pub spec: &'p GpuClass,
}

impl PartialEq for Class<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// The class of an extended resource that no class lists, under `allExtendedResources`.
static EXTENDED: GpuClass = GpuClass {
    resources: Vec::new(),
    device_classes: Vec::new(),
    tolerations: None,
    driver: Driver::Runtime,
    runtime_node_labels: Vec::new(),
    driver_fallback: None,
    shares: Vec::new(),
    shared_from: None,
    fractions: None,
    mounts: Vec::new(),
    env: Vec::new(),
    per_gpu: std::collections::BTreeMap::new(),
};

/// What a container asks for a GPU through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// An extended resource, by name.
    Resource(String),
    /// A fraction of a GPU, asked for by this pod annotation (KAI Scheduler's
    /// `gpu-fraction`), which its scheduler hands out.
    Fraction(String),
    /// A request of one of the pod's claims.
    Claim {
        claim: String,
        request: String,
        device_class: String,
    },
}

/// GPUs of one class a container asks for.
#[derive(Debug, Clone)]
pub struct Use<'p> {
    pub class: Class<'p>,
    pub source: Via,
    /// How many, in nano-units (a quantity of 2 is `2 * 10^9`); None when it cannot be
    /// read (the apiserver will judge it).
    pub count: Option<i128>,
}

/// A container that asks for GPUs.
#[derive(Debug, Clone)]
pub struct ContainerGpus<'p> {
    pub name: String,
    pub uses: Vec<Use<'p>>,
}

/// A toleration a pod needs, and why.
#[derive(Debug, Clone)]
pub struct Wanted<'p> {
    pub toleration: Toleration,
    pub class: Class<'p>,
    /// What of the pod asked for it: resource names or claims, for messages.
    pub because: String,
}

/// Everything the mutation steps need to know about a pod's GPUs.
#[derive(Debug, Clone, Default)]
pub struct Gpus<'p> {
    /// Containers with at least one GPU, in the pod's order (init containers first).
    pub containers: Vec<ContainerGpus<'p>>,
    /// The classes of the pod's claims' devices and of its containers' resources, by name.
    pub classes: Vec<Class<'p>>,
    /// The claims' GPU device classes by class, for tolerations: (class, "claim \"c\"").
    claim_classes: Vec<(Class<'p>, String)>,
    /// For the user: claims that could not be read, requests counted as one GPU.
    pub warnings: Vec<String>,
    /// The claims that could not be read, as a message names them:
    /// `ResourceClaimTemplate "two-gpus" of claim "gpus" (it does not exist)`.
    pub unread: Vec<String>,
    /// Objects the cluster context did not know; the shell may fetch them and review again.
    pub unresolved: Vec<ObjectKey>,
}

impl<'p> Gpus<'p> {
    /// Reads the pod's GPUs. `namespace` is the review's (a pod's claims live beside it).
    pub fn of(policy: &'p Policy, pod: &Pod, namespace: &str, cluster: &dyn Cluster) -> Gpus<'p> {
        let mut out = Gpus::default();
        let Some(spec) = pod.spec.as_ref() else {
            return out;
        };
        // Claims are only resolved for pods that have them: nothing to look up otherwise.
        let claims: Vec<(&str, Option<Vec<Request<'p>>>)> = spec
            .resource_claims
            .iter()
            .flatten()
            .map(|c| (c.name.as_str(), out.resolve(policy, c, namespace, cluster)))
            .collect();
        for (claim, requests) in &claims {
            // Per class, the claim's device classes of it: "claim \"c\": a or b".
            let mut by_class: Vec<(Class<'p>, Vec<&str>)> = Vec::new();
            for alt in requests.iter().flatten().flat_map(|r| &r.alternatives) {
                let Some(class) = alt.class else { continue };
                out.add_class(class);
                match by_class.iter_mut().find(|(c, _)| *c == class) {
                    Some((_, dcs)) if dcs.contains(&alt.device_class.as_str()) => {}
                    Some((_, dcs)) => dcs.push(&alt.device_class),
                    None => by_class.push((class, vec![&alt.device_class])),
                }
            }
            for (class, dcs) in by_class {
                out.claim_classes
                    .push((class, format!("claim {claim:?}: {}", dcs.join(" or "))));
            }
        }
        for (_, c) in containers(spec) {
            let mut uses = resource_uses(policy, c);
            for cref in c.resources.iter().flat_map(|r| r.claims.iter().flatten()) {
                let Some((_, Some(requests))) = claims.iter().find(|(n, _)| *n == cref.name) else {
                    continue;
                };
                claim_uses(&cref.name, cref.request.as_deref(), requests, &mut uses);
            }
            if !uses.is_empty() {
                for u in &uses {
                    out.add_class(u.class);
                }
                out.containers.push(ContainerGpus {
                    name: c.name.clone(),
                    uses,
                });
            }
        }
        out.fractions(policy, pod);
        out.classes.sort_by_key(|c| c.name);
        out
    }

    /// A fraction of a GPU asked for by annotation, for a scheduler that hands fractions
    /// out (KAI Scheduler): a GPU of the class (of `gpu-fraction-num-devices` GPUs) for
    /// the container the pod names, else its first container.
    fn fractions(&mut self, policy: &'p Policy, pod: &Pod) {
        let (Some(spec), Some(annotations)) =
            (pod.spec.as_ref(), pod.metadata.annotations.as_ref())
        else {
            return;
        };
        let scheduler = spec
            .scheduler_name
            .as_deref()
            .unwrap_or("default-scheduler");
        for (name, class) in &policy.gpu.classes {
            let Some(f) = class.fractions.as_ref() else {
                continue;
            };
            if !f.scheduler_names.iter().any(|s| s == scheduler) {
                continue;
            }
            let Some(annotation) = f.annotations.iter().find(|a| annotations.contains_key(*a))
            else {
                continue;
            };
            let named = annotations.get(&f.container_annotation).map(String::as_str);
            let Some(container) = spec
                .containers
                .iter()
                .find(|c| named.is_none_or(|n| c.name == n))
            else {
                continue;
            };
            let devices = annotations
                .get(&f.devices_annotation)
                .and_then(|n| n.trim().parse::<i128>().ok())
                .filter(|n| *n > 0)
                .unwrap_or(1);
            let class = Class { name, spec: class };
            let u = Use {
                class,
                source: Via::Fraction(annotation.clone()),
                count: Some(devices * NANO),
            };
            match self
                .containers
                .iter_mut()
                .find(|c| c.name == container.name)
            {
                Some(c) => c.uses.push(u),
                None => self.containers.push(ContainerGpus {
                    name: container.name.clone(),
                    uses: vec![u],
                }),
            }
            self.add_class(class);
        }
    }

    /// Whether the pod asks for any GPU the policy knows.
    pub fn any(&self) -> bool {
        !self.classes.is_empty()
    }

    /// The GPUs of the container named `name`.
    pub fn of_container(&self, name: &str) -> &[Use<'p>] {
        self.containers
            .iter()
            .find(|c| c.name == name)
            .map_or(&[], |c| c.uses.as_slice())
    }

    /// The tolerations the pod's classes call for, sorted and without repeats: a class's
    /// own list, or `{key: <resource>, operator: Exists, effect: NoSchedule}` for each
    /// resource of a class that names none.
    pub fn wanted_tolerations(&self) -> Vec<Wanted<'p>> {
        let mut out: Vec<Wanted<'p>> = Vec::new();
        let mut push = |toleration: Toleration, class: Class<'p>, because: String| match out
            .iter_mut()
            .find(|w| w.toleration == toleration)
        {
            Some(w) if !w.because.contains(&because) => {
                let _ = write!(w.because, ", {because}");
            }
            Some(_) => {}
            None => out.push(Wanted {
                toleration,
                class,
                because,
            }),
        };
        let mut resources: Vec<(Class<'p>, &str)> = self
            .containers
            .iter()
            .flat_map(|c| &c.uses)
            .filter_map(|u| match &u.source {
                Via::Resource(r) => Some((u.class, r.as_str())),
                Via::Fraction(_) | Via::Claim { .. } => None,
            })
            .collect();
        resources.sort_by_key(|(c, r)| (c.name, *r));
        resources.dedup_by_key(|(c, r)| (c.name, *r));
        // A fraction asked for by annotation: named in the reason, with no toleration of
        // its own where the class lists none (the annotation is no taint key).
        let fractions: Vec<(Class<'p>, String)> = self
            .containers
            .iter()
            .flat_map(|c| &c.uses)
            .filter_map(|u| match &u.source {
                Via::Fraction(a) => Some((u.class, format!("annotation {a}"))),
                _ => None,
            })
            .collect();
        for &class in &self.classes {
            match &class.spec.tolerations {
                Some(list) => {
                    let mut because: Vec<String> = resources
                        .iter()
                        .filter(|(c, _)| c.name == class.name)
                        .map(|(_, r)| (*r).to_owned())
                        .collect();
                    because.extend(
                        fractions
                            .iter()
                            .filter(|(c, _)| c.name == class.name)
                            .map(|(_, why)| why.clone()),
                    );
                    because.extend(
                        self.claim_classes
                            .iter()
                            .filter(|(c, _)| c.name == class.name)
                            .map(|(_, why)| why.clone()),
                    );
                    because.dedup();
                    for t in list {
                        push(t.clone(), class, because.join(", "));
                    }
                }
                None => {
                    for (_, r) in resources.iter().filter(|(c, _)| c.name == class.name) {
                        let t = Toleration {
                            key: Some((*r).to_owned()),
                            operator: Some("Exists".into()),
                            effect: Some("NoSchedule".into()),
                            ..Default::default()
                        };
                        push(t, class, (*r).to_owned());
                    }
                }
            }
        }
        out.sort_by(|a, b| toleration_order(&a.toleration).cmp(&toleration_order(&b.toleration)));
        out
    }

    fn add_class(&mut self, class: Class<'p>) {
        if !self.classes.contains(&class) {
            self.classes.push(class);
        }
    }

    /// The device requests of one of the pod's claims, or None (with a warning, and the
    /// object named in `unresolved` when it may exist) when it cannot be read.
    fn resolve(
        &mut self,
        policy: &'p Policy,
        claim: &PodResourceClaim,
        namespace: &str,
        cluster: &dyn Cluster,
    ) -> Option<Vec<Request<'p>>> {
        let (kind, name, found) = if let Some(n) = &claim.resource_claim_name {
            let found = cluster
                .resource_claim(namespace, n)
                .map(|c| requests(policy, &c.spec));
            (ContextKind::ResourceClaim, n, found)
        } else if let Some(n) = &claim.resource_claim_template_name {
            let found = cluster
                .resource_claim_template(namespace, n)
                .map(|t| requests(policy, &t.spec.spec));
            (ContextKind::ResourceClaimTemplate, n, found)
        } else {
            return None;
        };
        let why = match found {
            Lookup::Found(r) => {
                self.note_all_allocation(&claim.name, &r);
                return Some(r);
            }
            Lookup::Absent => " (it does not exist)",
            Lookup::Unknown if cluster.is_offline() => " (tollgate runs without a cluster context)",
            Lookup::Unknown => {
                self.unresolved.push(ObjectKey {
                    kind,
                    namespace: namespace.to_owned(),
                    name: name.clone(),
                });
                ""
            }
        };
        let what = format!("{} {name:?} of claim {:?}{why}", kind.as_str(), claim.name);
        self.warnings.push(format!(
            "tollgate: could not read {what}; GPUs it may hold got no toleration, driver or per-GPU default"
        ));
        self.unread.push(what);
        None
    }

    fn note_all_allocation(&mut self, claim: &str, requests: &[Request<'p>]) {
        for r in requests {
            for alt in r.alternatives.iter().filter(|a| a.all && a.class.is_some()) {
                self.warnings.push(format!(
                    "tollgate: claim {claim:?} request {:?} asks for all devices of class {}; per-GPU defaults count it as one GPU",
                    r.name, alt.device_class
                ));
            }
        }
    }
}

/// One device request of a claim, with its alternatives (one for `exactly`).
#[derive(Debug, Clone)]
struct Request<'p> {
    name: String,
    alternatives: Vec<Alternative<'p>>,
}

#[derive(Debug, Clone)]
struct Alternative<'p> {
    /// The sub-request's name (empty for `exactly`).
    name: String,
    device_class: String,
    class: Option<Class<'p>>,
    count: i64,
    all: bool,
}

fn requests<'p>(policy: &'p Policy, spec: &ResourceClaimSpec) -> Vec<Request<'p>> {
    let list = spec.devices.as_ref().and_then(|d| d.requests.as_ref());
    list.into_iter()
        .flatten()
        .map(|r| request(policy, r))
        .collect()
}

fn request<'p>(policy: &'p Policy, r: &DeviceRequest) -> Request<'p> {
    let alt = |name: &str, class: &str, mode: Option<&str>, count: Option<i64>| Alternative {
        name: name.to_owned(),
        device_class: class.to_owned(),
        class: class_of_device_class(policy, class),
        count: count.unwrap_or(1).max(0),
        all: mode == Some("All"),
    };
    let mut alternatives = vec![];
    if let Some(e) = &r.exactly {
        alternatives.push(alt(
            "",
            &e.device_class_name,
            e.allocation_mode.as_deref(),
            e.count,
        ));
    }
    for s in r.first_available.iter().flatten() {
        alternatives.push(alt(
            &s.name,
            &s.device_class_name,
            s.allocation_mode.as_deref(),
            s.count,
        ));
    }
    Request {
        name: r.name.clone(),
        alternatives,
    }
}

/// The GPUs a container gets from a claim it lists: every request of the claim, or the one
/// it names (`request`, or `request/sub-request`).
fn claim_uses<'p>(
    claim: &str,
    only: Option<&str>,
    requests: &[Request<'p>],
    uses: &mut Vec<Use<'p>>,
) {
    let (only_request, only_sub) = match only.filter(|s| !s.is_empty()) {
        Some(s) => match s.split_once('/') {
            Some((r, sub)) => (Some(r), Some(sub)),
            None => (Some(s), None),
        },
        None => (None, None),
    };
    for r in requests {
        if only_request.is_some_and(|o| o != r.name) {
            continue;
        }
        let chosen = r
            .alternatives
            .iter()
            .filter(|a| only_sub.is_none_or(|s| s == a.name))
            .find(|a| a.class.is_some());
        if let Some(a) = chosen {
            uses.push(Use {
                class: a.class.expect("found by its class"),
                source: Via::Claim {
                    claim: claim.to_owned(),
                    request: r.name.clone(),
                    device_class: a.device_class.clone(),
                },
                count: Some(i128::from(if a.all { 1 } else { a.count }) * NANO),
            });
        }
    }
}

/// The extended resources of a container that are GPUs, with their amounts. Unreadable
/// amounts count as asking (the apiserver will judge them), of an unknown count.
fn resource_uses<'p>(policy: &'p Policy, c: &Container) -> Vec<Use<'p>> {
    let mut out: Vec<Use<'p>> = Vec::new();
    let Some(r) = c.resources.as_ref() else {
        return out;
    };
    let names = [r.requests.as_ref(), r.limits.as_ref()]
        .into_iter()
        .flatten()
        .flat_map(|m| m.keys());
    for name in names {
        // cpu, memory, ephemeral-storage, hugepages-*: not GPUs, and most of what is here.
        if !name.contains('/') {
            continue;
        }
        let Some(class) = class_of_resource(policy, name) else {
            continue;
        };
        if out
            .iter()
            .any(|u| matches!(&u.source, Via::Resource(n) if n == name))
        {
            continue;
        }
        let count = asked(c, name).map(|q| quantity::parse(&q.0).ok());
        let count = count.flatten();
        // A zero request is no GPU; an unreadable one may be.
        if count.is_some_and(|n| n <= 0) {
            continue;
        }
        out.push(Use {
            class,
            source: Via::Resource(name.clone()),
            count,
        });
    }
    // A share (HAMi's nvidia.com/gpumem) is part of a GPU the container asks for otherwise;
    // alone, it is the one GPU its scheduler's webhook gives it.
    let mut shared: Vec<&str> = vec![];
    for i in 0..out.len() {
        let Via::Resource(name) = &out[i].source else {
            continue;
        };
        if !out[i].class.spec.is_share(name) {
            continue;
        }
        let class = out[i].class;
        let alone = !shared.contains(&class.name)
            && !out.iter().any(|u| {
                u.class == class && matches!(&u.source, Via::Resource(n) if !class.spec.is_share(n))
            });
        out[i].count = Some(if alone { NANO } else { 0 });
        shared.push(class.name);
    }
    out
}

/// The class an extended resource belongs to: the first class (by name) that covers it,
/// else, with `allExtendedResources`, a class of its own.
pub(crate) fn class_of_resource<'p>(policy: &'p Policy, name: &str) -> Option<Class<'p>> {
    let gpu = &policy.gpu;
    gpu.classes
        .iter()
        .find(|(_, c)| c.covers_resource(name))
        .map(|(n, c)| Class { name: n, spec: c })
        .or_else(|| {
            (gpu.all_extended_resources && quantity::is_extended_resource(name)).then_some(Class {
                name: "extended",
                spec: &EXTENDED,
            })
        })
}

fn class_of_device_class<'p>(policy: &'p Policy, device_class: &str) -> Option<Class<'p>> {
    policy
        .gpu
        .classes
        .iter()
        .find(|(_, c)| c.covers_device_class(device_class))
        .map(|(n, c)| Class { name: n, spec: c })
}

fn toleration_order(t: &Toleration) -> (&str, &str, &str, &str) {
    (
        t.key.as_deref().unwrap_or(""),
        t.operator.as_deref().unwrap_or(""),
        t.value.as_deref().unwrap_or(""),
        t.effect.as_deref().unwrap_or(""),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Objects, Offline};
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn claim_pod(request: Option<&str>) -> Pod {
        let mut r = json!({"name": "accel"});
        if let Some(req) = request {
            r["request"] = json!(req);
        }
        pod(json!({"spec": {
            "resourceClaims": [{"name": "accel", "resourceClaimTemplateName": "t"}],
            "containers": [{"name": "a", "resources": {"claims": [r]}}, {"name": "b"}]
        }}))
    }

    fn context() -> Objects {
        let mut o = Objects::complete();
        o.add_template(
            serde_json::from_value(json!({
                "metadata": {"name": "t", "namespace": "ml"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 3}},
                    {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}
                ]}}}
            }))
            .unwrap(),
        );
        o
    }

    #[test]
    fn extended_resources_by_class_mig_and_implicit_dra_names() {
        let p = Policy::builtin();
        for (resource, class) in [
            ("nvidia.com/gpu", Some("nvidia")),
            ("nvidia.com/mig-1g.10gb", Some("nvidia")),
            ("nvidia.com/mig-3g.40gb", Some("nvidia")),
            (
                "deviceclass.resource.kubernetes.io/gpu.nvidia.com",
                Some("nvidia-dra"),
            ),
            (
                "deviceclass.resource.kubernetes.io/mig.nvidia.com",
                Some("nvidia-dra"),
            ),
            ("amd.com/gpu", Some("amd")),
            ("gpu.intel.com/xe", Some("intel")),
            ("example.com/fpga", None),
            ("deviceclass.resource.kubernetes.io/nic.example.com", None),
        ] {
            assert_eq!(
                class_of_resource(&p, resource).map(|c| c.name),
                class,
                "{resource}"
            );
        }
    }

    #[test]
    fn a_claim_counts_for_the_containers_that_list_it() {
        let p = Policy::builtin();
        let g = Gpus::of(&p, &claim_pod(None), "ml", &context());
        assert_eq!(
            g.classes.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["nvidia-dra"]
        );
        let uses = g.of_container("a");
        assert_eq!(uses.len(), 1, "the NIC request is no GPU");
        assert_eq!(uses[0].count, Some(3 * NANO));
        assert!(g.of_container("b").is_empty());
        // A container that names only the NIC request holds no GPU, but the pod still
        // lands on GPU nodes.
        let g = Gpus::of(&p, &claim_pod(Some("nic")), "ml", &context());
        assert!(g.of_container("a").is_empty());
        assert!(g.any());
    }

    #[test]
    fn without_a_cluster_context_the_warning_says_so() {
        let p = Policy::builtin();
        let g = Gpus::of(&p, &claim_pod(None), "ml", &Offline);
        assert!(!g.any());
        assert!(
            g.unresolved.is_empty(),
            "nothing to fetch without a context"
        );
        assert!(
            g.warnings[0].contains("tollgate runs without a cluster context"),
            "{:?}",
            g.warnings
        );
        // A context that may simply not have it yet: named for a fetch.
        let g = Gpus::of(&p, &claim_pod(None), "ml", &Objects::default());
        assert_eq!(g.unresolved.len(), 1);
        assert_eq!(g.unresolved[0].kind, ContextKind::ResourceClaimTemplate);
    }
}

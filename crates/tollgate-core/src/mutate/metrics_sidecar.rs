//! The metrics sidecar: one exporter per pod that training code can push statsd metrics to.
//!
//! A container already named like ours is never replaced: with our image it is ours from an
//! earlier pass (or an earlier webhook invocation); with another image it is the user's, and
//! both cannot exist under one name. The sidecar is also left out when its ports would clash
//! with the pod's: a second listener on a port fails at runtime, and a duplicated port name
//! makes Services pick either. A pod without the sidecar works; an invalid pod does not.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{Added, Heed};
use crate::pod::containers;
use crate::policy::{Policy, SidecarMode};
use crate::quantity;
use crate::words::join_words;

/// [`apply`], keeping only the warnings (the step's own tests).
#[cfg(test)]
pub(crate) fn ensure(policy: &Policy, pod: &mut Pod, warnings: &mut Vec<String>) -> bool {
    apply(policy, pod, &mut Vec::new(), warnings, &Heed::default())
}

/// Adds the sidecar, as the namespace's Pod Security requires it (`heed`).
pub(crate) fn apply(
    policy: &Policy,
    pod: &mut Pod,
    added: &mut Vec<Added>,
    warnings: &mut Vec<String>,
    heed: &Heed<'_>,
) -> bool {
    let sidecar = &policy.mutation.metrics_sidecar;
    let template = &sidecar.container;
    let Some(spec) = pod.spec.as_mut() else {
        return false;
    };
    let mut changed = false;
    match obstacle(spec, template) {
        None => {
            added.push(Added::Container {
                name: template.name.clone(),
                native: sidecar.mode == SidecarMode::Native,
            });
            let mut c = ours(template, sidecar.mode);
            heed.sidecar(spec, &mut c);
            if let Some(w) = fit_pod_level(spec, &mut c, sidecar.mode) {
                warnings.push(w);
            }
            match sidecar.mode {
                SidecarMode::Native => spec.init_containers.get_or_insert_with(Vec::new).push(c),
                SidecarMode::Classic => spec.containers.push(c),
            }
            changed = true;
        }
        Some(Obstacle::Ours) => {
            // A second pass says again what the first did with the pod's budget (what it
            // would have done without the sidecar already there).
            if spec.resources.is_some() {
                let mut without = spec.clone();
                without.containers.retain(|c| c.name != template.name);
                if let Some(init) = without.init_containers.as_mut() {
                    init.retain(|c| c.name != template.name);
                }
                if let Some(w) =
                    fit_pod_level(&without, &mut ours(template, sidecar.mode), sidecar.mode)
                {
                    warnings.push(w);
                }
            }
        }
        Some(Obstacle::NameTaken(noun)) => {
            warnings.push(format!(
                "tollgate: the pod has its own {noun} named {:?}; the metrics sidecar was not added",
                template.name
            ));
            return false;
        }
        Some(Obstacle::PortTaken { noun, name, why }) => {
            warnings.push(format!(
                "tollgate: {noun} {name:?} already uses {why}; the metrics sidecar was not added"
            ));
            return false;
        }
    }
    // Only with the sidecar in the pod: scrape annotations pointing at a port nothing serves
    // would turn into failing scrapes and alerts.
    changed |= add_annotations(pod, &sidecar.annotations);
    changed
}

/// The sidecar as the policy gives it, a native one with its restart policy.
fn ours(template: &Container, mode: SidecarMode) -> Container {
    let mut c = template.clone();
    if mode == SidecarMode::Native {
        c.restart_policy = Some("Always".into());
    }
    c
}

/// Where the pod sets a resource for the whole pod (`spec.resources`, KEP-2837), the
/// apiserver holds its containers to it: their requests together (a limit standing in for
/// a missing request, as defaulting does) at most the pod's request (its limit where it
/// sets no request), and no container's limit above the pod's. The sidecar keeps its own
/// request and limit of such a resource only where the pod stays within that; otherwise
/// it goes without them and shares the pod's budget, as a container that asks nothing
/// does, and the warning says so with the numbers. Resources the pod does not set at pod
/// level are the sidecar's as the policy gives them.
fn fit_pod_level(spec: &PodSpec, c: &mut Container, mode: SidecarMode) -> Option<String> {
    let pod_level = spec.resources.as_ref()?;
    let pod_request = |r: &str| {
        pod_level
            .requests
            .as_ref()
            .and_then(|m| m.get(r))
            .or_else(|| pod_level.limits.as_ref().and_then(|m| m.get(r)))
    };
    let ours = c.resources.as_ref()?;
    let mut set: Vec<&String> = [ours.requests.as_ref(), ours.limits.as_ref()]
        .into_iter()
        .flatten()
        .flat_map(|m| m.keys())
        .filter(|r| pod_request(r).is_some())
        .collect();
    if set.is_empty() {
        return None;
    }
    set.sort();
    set.dedup();
    // The pod as the apiserver will judge it: the sidecar in place, requests defaulted.
    let mut trial = Pod {
        spec: Some(spec.clone()),
        ..Pod::default()
    };
    if let Some(s) = trial.spec.as_mut() {
        match mode {
            SidecarMode::Native => s
                .init_containers
                .get_or_insert_with(Vec::new)
                .push(c.clone()),
            SidecarMode::Classic => s.containers.push(c.clone()),
        }
    }
    crate::pod::default_requests(&mut trial);
    let aggregate = trial
        .spec
        .as_ref()
        .map(|s| crate::pod::containers_aggregate(s, false))
        .unwrap_or_default();
    let read = |q: Option<&Quantity>| q.and_then(|q| quantity::parse(&q.0).ok());
    let mut over = vec![];
    for r in set {
        let budget = pod_request(r);
        let asked = aggregate.get(r.as_str()).copied();
        let within_request = matches!((read(budget), asked), (Some(b), Some(a)) if a <= b);
        let own_limit = ours.limits.as_ref().and_then(|m| m.get(r));
        let pod_limit = pod_level.limits.as_ref().and_then(|m| m.get(r));
        let within_limit = match (own_limit, pod_limit) {
            (Some(own), Some(pod)) => {
                matches!((read(Some(own)), read(Some(pod))), (Some(o), Some(p)) if o <= p)
            }
            _ => true,
        };
        if !(within_request && within_limit) {
            let budget = budget.map(|q| q.0.as_str()).unwrap_or_default();
            let numbers = match asked {
                Some(a) if !within_request => format!("{} > {budget}", quantity::format_for(r, a)),
                _ => format!(
                    "limit {} > {}",
                    own_limit.map(|q| q.0.as_str()).unwrap_or_default(),
                    pod_limit.map(|q| q.0.as_str()).unwrap_or_default()
                ),
            };
            over.push((r.clone(), numbers));
        }
    }
    if over.is_empty() {
        return None;
    }
    let (names, numbers): (Vec<String>, Vec<String>) = over.into_iter().unzip();
    if let Some(res) = c.resources.as_mut() {
        for r in &names {
            for m in [res.requests.as_mut(), res.limits.as_mut()]
                .into_iter()
                .flatten()
            {
                m.remove(r);
            }
        }
        res.requests = res.requests.take().filter(|m| !m.is_empty());
        res.limits = res.limits.take().filter(|m| !m.is_empty());
        if res.requests.is_none() && res.limits.is_none() && res.claims.is_none() {
            c.resources = None;
        }
    }
    Some(format!(
        "tollgate: the metrics sidecar shares the pod's {}; its own would exceed {} ({})",
        join_words(&names),
        if names.len() == 1 { "it" } else { "them" },
        numbers.join(", ")
    ))
}
enum Obstacle<'a> {
    /// Our sidecar is already in the pod.
    Ours,
    /// A container of the user's has our name.
    NameTaken(&'static str),
    /// A container of the user's uses one of our ports.
    PortTaken {
        noun: &'static str,
        name: &'a str,
        why: String,
    },
}

fn obstacle<'a>(spec: &'a PodSpec, template: &Container) -> Option<Obstacle<'a>> {
    for (kind, c) in containers(spec) {
        if c.name == template.name {
            return Some(if c.image == template.image {
                Obstacle::Ours
            } else {
                Obstacle::NameTaken(kind.noun())
            });
        }
    }
    // Names are unique across every kind of container, ephemeral ones included.
    if spec
        .ephemeral_containers
        .iter()
        .flatten()
        .any(|c| c.name == template.name)
    {
        return Some(Obstacle::NameTaken("ephemeral container"));
    }
    for (kind, c) in containers(spec) {
        for theirs in c.ports.iter().flatten() {
            for ours in template.ports.iter().flatten() {
                if let Some(why) = port_clash(theirs, ours) {
                    return Some(Obstacle::PortTaken {
                        noun: kind.noun(),
                        name: &c.name,
                        why,
                    });
                }
            }
        }
    }
    None
}

/// What makes two ports clash, if they do. Containers of a pod share one network namespace,
/// so the same number and protocol in two of them is one socket bound twice.
fn port_clash(theirs: &ContainerPort, ours: &ContainerPort) -> Option<String> {
    if let Some(name) = ours.name.as_deref().filter(|n| !n.is_empty()) {
        if theirs.name.as_deref() == Some(name) {
            return Some(format!("the port name {name:?}"));
        }
    }
    let proto = protocol(ours);
    if proto != protocol(theirs) {
        return None;
    }
    if theirs.container_port == ours.container_port {
        return Some(format!("port {}/{proto}", ours.container_port));
    }
    match ours.host_port {
        Some(h) if h != 0 && theirs.host_port == Some(h) => Some(format!("host port {h}/{proto}")),
        _ => None,
    }
}

/// The apiserver defaults an unset protocol to TCP.
fn protocol(p: &ContainerPort) -> &str {
    p.protocol.as_deref().unwrap_or("TCP")
}

/// Adds the policy's annotations the pod does not have; a value the pod has is the user's.
fn add_annotations(pod: &mut Pod, wanted: &BTreeMap<String, String>) -> bool {
    let missing = |k: &String| {
        pod.metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key(k))
    };
    if !wanted.keys().any(missing) {
        return false;
    }
    let annotations = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    for (k, v) in wanted {
        annotations.entry(k.clone()).or_insert_with(|| v.clone());
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::testing::{pod, to_json, twice};
    use serde_json::{json, Value};

    /// Runs the step, then checks a second pass changes nothing and warns the same.
    fn run(policy: &Policy, p: &mut Pod) -> (bool, Vec<String>) {
        let (changed, warnings, again) = twice(ensure, policy, p);
        assert_eq!(again, warnings, "second pass warns the same");
        for w in &warnings {
            assert!(w.starts_with("tollgate: ") && w.len() < 120, "{w}");
        }
        (changed, warnings)
    }

    fn trainer() -> Value {
        json!({"name": "pytorch", "image": "train:1", "ports": [{"name": "dist", "containerPort": 23456, "protocol": "TCP"}]})
    }

    fn classic() -> Policy {
        let mut p = Policy::builtin();
        p.mutation.metrics_sidecar.mode = SidecarMode::Classic;
        p
    }

    fn names(v: &Value) -> Vec<&str> {
        v.as_array()
            .map(|a| a.iter().map(|c| c["name"].as_str().unwrap()).collect())
            .unwrap_or_default()
    }

    /// The sidecar's resources, and the pod as the apiserver's pod-level rules judge it.
    fn sidecar_resources(v: &Value) -> Value {
        v["spec"]["initContainers"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == "tollgate-metrics"))
            .map(|c| c["resources"].clone())
            .unwrap_or(Value::Null)
    }

    #[test]
    fn a_sidecar_past_the_pods_own_budget_shares_it() {
        // The pod: 100m/100Mi for the pod, 60m/50Mi for its one container; the
        // sidecar's 50m/64Mi would make 110m/114Mi, which the apiserver refuses.
        let mut p = pod(json!({"spec": {
            "resources": {"requests": {"cpu": "100m", "memory": "100Mi"}},
            "containers": [{"name": "train", "image": "t",
                "resources": {"requests": {"cpu": "60m", "memory": "50Mi"},
                    "limits": {"nvidia.com/gpu": "1"}}}],
        }}));
        let (changed, warnings) = run(&Policy::builtin(), &mut p);
        assert!(changed);
        assert_eq!(
            warnings,
            [
                "tollgate: the metrics sidecar shares the pod's cpu and memory; its own would \
              exceed them (110m > 100m, 114Mi > 100Mi)"
            ]
        );
        assert_eq!(sidecar_resources(&to_json(&p)), Value::Null);
    }

    #[test]
    fn a_sidecar_within_the_pods_budget_keeps_its_own() {
        let mut p = pod(json!({"spec": {
            "resources": {"limits": {"cpu": "16", "memory": "64Gi"}},
            "containers": [{"name": "train", "image": "t",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        }}));
        let (_, warnings) = run(&Policy::builtin(), &mut p);
        assert!(warnings.is_empty(), "{warnings:?}");
        let own = &Policy::builtin()
            .mutation
            .metrics_sidecar
            .container
            .resources;
        assert_eq!(
            sidecar_resources(&to_json(&p)),
            serde_json::to_value(own).unwrap()
        );
    }

    #[test]
    fn a_sidecar_limit_above_the_pods_limit_is_left_out_for_that_resource_only() {
        // cpu: the pod's limit (and so its request) is 100m, the sidecar's limit 200m.
        // memory is not set at pod level: the sidecar keeps its own.
        let mut p = pod(json!({"spec": {
            "resources": {"limits": {"cpu": "100m"}},
            "containers": [{"name": "train", "image": "t"}],
        }}));
        let (_, warnings) = run(&Policy::builtin(), &mut p);
        assert_eq!(
            warnings,
            [
                "tollgate: the metrics sidecar shares the pod's cpu; its own would exceed it \
              (limit 200m > 100m)"
            ]
        );
        assert_eq!(
            sidecar_resources(&to_json(&p)),
            json!({"requests": {"memory": "64Mi"}, "limits": {"memory": "128Mi"}})
        );
    }

    #[test]
    fn native_sidecar_is_the_last_init_container() {
        let mut p = pod(json!({"spec": {
            "initContainers": [{"name": "fetch", "image": "busybox"}],
            "containers": [trainer()],
        }}));
        let (changed, warnings) = run(&Policy::builtin(), &mut p);
        assert!(changed);
        assert!(warnings.is_empty());
        let v = to_json(&p);
        assert_eq!(
            names(&v["spec"]["initContainers"]),
            ["fetch", "tollgate-metrics"]
        );
        assert_eq!(names(&v["spec"]["containers"]), ["pytorch"]);
        let mut expected =
            serde_json::to_value(&Policy::builtin().mutation.metrics_sidecar.container).unwrap();
        expected["restartPolicy"] = json!("Always");
        assert_eq!(v["spec"]["initContainers"][1], expected);
        assert_eq!(
            v["metadata"]["annotations"],
            json!({"prometheus.io/port": "9102", "prometheus.io/scrape": "true"})
        );
    }

    #[test]
    fn classic_sidecar_is_the_last_container() {
        let mut p = pod(json!({"spec": {"containers": [trainer()]}}));
        assert!(run(&classic(), &mut p).0);
        let v = to_json(&p);
        assert_eq!(
            names(&v["spec"]["containers"]),
            ["pytorch", "tollgate-metrics"]
        );
        assert!(v["spec"].get("initContainers").is_none());
        assert!(v["spec"]["containers"][1].get("restartPolicy").is_none());
    }

    #[test]
    fn ours_in_either_place_is_not_added_again() {
        let template =
            serde_json::to_value(&Policy::builtin().mutation.metrics_sidecar.container).unwrap();
        // Injected by a classic-mode policy, now reviewed under native mode, and vice versa.
        for (policy, spec) in [
            (
                Policy::builtin(),
                json!({"containers": [trainer(), template.clone()]}),
            ),
            (
                classic(),
                json!({"initContainers": [template.clone()], "containers": [trainer()]}),
            ),
        ] {
            let mut p = pod(
                json!({"metadata": {"annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9102"}}, "spec": spec}),
            );
            let before = to_json(&p);
            let (changed, warnings) = run(&policy, &mut p);
            assert!(!changed);
            assert!(warnings.is_empty());
            assert_eq!(to_json(&p), before);
        }
    }

    #[test]
    fn users_container_with_our_name_is_kept_with_a_warning() {
        for spec in [
            json!({"containers": [trainer(), {"name": "tollgate-metrics", "image": "my/exporter"}]}),
            json!({"initContainers": [{"name": "tollgate-metrics", "image": "my/exporter"}], "containers": [trainer()]}),
            json!({"containers": [trainer()], "ephemeralContainers": [{"name": "tollgate-metrics", "image": "busybox"}]}),
        ] {
            let mut p = pod(json!({"spec": spec}));
            let before = to_json(&p);
            let (changed, warnings) = run(&Policy::builtin(), &mut p);
            assert!(!changed, "{spec}");
            assert_eq!(warnings.len(), 1, "{spec}");
            assert!(
                warnings[0].contains("\"tollgate-metrics\""),
                "{}",
                warnings[0]
            );
            assert_eq!(
                to_json(&p),
                before,
                "no scrape annotations without the sidecar"
            );
        }
    }

    #[test]
    fn clashing_ports_keep_the_sidecar_out() {
        for (port, expected) in [
            (
                json!({"name": "tg-metrics", "containerPort": 8080}),
                "the port name \"tg-metrics\"",
            ),
            (json!({"containerPort": 9102}), "port 9102/TCP"),
            (
                json!({"containerPort": 9125, "protocol": "UDP"}),
                "port 9125/UDP",
            ),
        ] {
            let mut c = trainer();
            c["ports"].as_array_mut().unwrap().push(port.clone());
            let mut p = pod(json!({"spec": {"containers": [c]}}));
            let before = to_json(&p);
            let (changed, warnings) = run(&Policy::builtin(), &mut p);
            assert!(!changed, "{port}");
            assert_eq!(
                warnings,
                [format!("tollgate: container \"pytorch\" already uses {expected}; the metrics sidecar was not added")]
            );
            assert_eq!(to_json(&p), before);
        }
    }

    #[test]
    fn same_number_other_protocol_is_no_clash() {
        let mut c = trainer();
        c["ports"] = json!([{"containerPort": 9102, "protocol": "UDP"}, {"containerPort": 9125}]);
        let mut p = pod(json!({"spec": {"containers": [c]}}));
        assert!(run(&Policy::builtin(), &mut p).0);
    }

    #[test]
    fn host_port_clash() {
        let mut policy = Policy::builtin();
        policy
            .mutation
            .metrics_sidecar
            .container
            .ports
            .as_mut()
            .unwrap()[0]
            .host_port = Some(9999);
        let mut c = trainer();
        c["ports"] = json!([{"containerPort": 80, "hostPort": 9999}]);
        let mut p = pod(json!({"spec": {"containers": [c]}}));
        let (changed, warnings) = run(&policy, &mut p);
        assert!(!changed);
        assert!(
            warnings[0].contains("host port 9999/TCP"),
            "{}",
            warnings[0]
        );
    }

    #[test]
    fn existing_annotations_are_kept() {
        let mut p = pod(json!({
            "metadata": {"annotations": {"prometheus.io/port": "8000", "team": "vision"}},
            "spec": {"containers": [trainer()]},
        }));
        assert!(run(&Policy::builtin(), &mut p).0);
        assert_eq!(
            to_json(&p)["metadata"]["annotations"],
            json!({"prometheus.io/port": "8000", "prometheus.io/scrape": "true", "team": "vision"})
        );
    }

    #[test]
    fn only_annotations_missing_still_counts_as_a_change() {
        let template =
            serde_json::to_value(&Policy::builtin().mutation.metrics_sidecar.container).unwrap();
        let mut p = pod(json!({"spec": {"containers": [trainer(), template]}}));
        assert!(run(&Policy::builtin(), &mut p).0);
        assert_eq!(
            to_json(&p)["metadata"]["annotations"]["prometheus.io/scrape"],
            "true"
        );
    }

    #[test]
    fn no_annotations_in_policy_adds_no_empty_map() {
        let mut policy = Policy::builtin();
        policy.mutation.metrics_sidecar.annotations.clear();
        let mut p = pod(json!({"spec": {"containers": [trainer()]}}));
        assert!(run(&policy, &mut p).0);
        assert!(to_json(&p)["metadata"].get("annotations").is_none());
    }

    #[test]
    fn pod_without_spec_is_untouched() {
        let mut p = pod(json!({"metadata": {"name": "x"}}));
        assert!(!ensure(&Policy::builtin(), &mut p, &mut vec![]));
        assert!(p.metadata.annotations.is_none());
    }

    #[test]
    fn apiserver_fixture_round_trips_idempotently() {
        let review: Value = serde_json::from_str(include_str!(
            "../../../../tests/fixtures/apiserver-v1.36/resnet50-master-0.mutate.json"
        ))
        .unwrap();
        let mut p = pod(review["request"]["object"].clone());
        assert!(run(&Policy::builtin(), &mut p).0);
        let mut again = pod(to_json(&p));
        assert!(!ensure(&Policy::builtin(), &mut again, &mut vec![]));
    }
}

//! GPU driver mounts: the node's driver directory, mounted read-only into each container that
//! asks for the GPU, with the environment that lets the framework find the libraries.
//!
//! Without CDI, a device plugin hands the container the device nodes but not the user-space
//! driver, and images cannot bake in a driver matching every node. Only containers asking for
//! the GPU get the mount: hostPath is a privilege a CPU-only helper has no use for.
//!
//! A volume name or mount path a user already uses is never overwritten. The user may mount a
//! different driver on purpose, and replacing their volume would silently change what their
//! code runs against; skipping with a warning leaves the pod exactly as they meant it.

use k8s_openapi::api::core::v1::{
    Container, EnvVar, HostPathVolumeSource, Pod, PodSpec, Volume, VolumeMount,
};

use super::heed::Veto;
use super::{Added, Heed};
use crate::capacity::{Nodes, Shape};
use crate::cluster::{Cluster, Lookup};
use crate::gpu::{Class, Gpus, Via};
use crate::policy::{Driver, EnvEntry, HostMount, IfPresent, Policy};

/// [`apply`] with the pod's GPUs read from the pod alone.
#[cfg(test)]
pub(crate) fn ensure(policy: &Policy, pod: &mut Pod, warnings: &mut Vec<String>) -> bool {
    super::alone(apply, policy, pod, warnings)
}

/// Whether a GPU class's driver is mounted into a pod, and why: decided in one place
/// ([`decide`]), so that what may veto a mount (Pod Security) is laid over this answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DriverDecision {
    /// True: the class's hostPath mounts and env go in.
    pub mount: bool,
    pub why: DriverWhy,
}

/// Why a class's driver is, or is not, mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DriverWhy {
    /// The class says so outright (`driver: hostPath` or `runtime`).
    Policy,
    /// `driver: auto`, by the nodes that could run the pod: `runtime` of the `of` nodes
    /// show a driver-injecting runtime.
    Nodes { runtime: usize, of: usize },
    /// `driver: auto` with no node known that could run the pod (no cluster context, no
    /// nodes, none of them offering the pod's GPUs): the class's `driverFallback`.
    Fallback,
}

/// Where the driver of `class` comes from for `pod` (with its GPUs): the class's `driver`,
/// and for `auto` the nodes that could run the pod (its node selection and tolerations,
/// offering its GPUs of the class): the runtime's where every one of them carries one of
/// the class's `runtimeNodeLabels`, a mount where one does not, and the class's
/// `driverFallback` where the context knows no such node.
pub(crate) fn decide(
    class: Class<'_>,
    gpus: &Gpus<'_>,
    pod: &Pod,
    cluster: &dyn Cluster,
) -> DriverDecision {
    let c = class.spec;
    let outright = |mount| DriverDecision {
        mount,
        why: DriverWhy::Policy,
    };
    match c.driver {
        Driver::HostPath => return outright(true),
        Driver::Runtime => return outright(false),
        Driver::Auto => {}
    }
    let fallback = DriverDecision {
        mount: c.driver_fallback != Some(Driver::Runtime),
        why: DriverWhy::Fallback,
    };
    let Some(Lookup::Found(nodes)) = cluster.nodes() else {
        return fallback;
    };
    let (runtime, of) = runtime_nodes(class, gpus, pod, &nodes);
    if of == 0 {
        return fallback;
    }
    DriverDecision {
        mount: runtime < of,
        why: DriverWhy::Nodes { runtime, of },
    }
}

/// Of the nodes that could run `pod` with its GPUs of `class`: how many show a
/// driver-injecting runtime, and how many there are.
fn runtime_nodes(class: Class<'_>, gpus: &Gpus<'_>, pod: &Pod, nodes: &Nodes) -> (usize, usize) {
    let c = class.spec;
    let uses = || {
        gpus.containers
            .iter()
            .flat_map(|g| &g.uses)
            .filter(|u| u.class == class)
    };
    // The GPUs of the class a node must offer: the resources asked for; for a share or a
    // fraction, any GPU of the class; for a DRA claim, none a node advertises.
    let asked: Vec<&str> = uses()
        .filter_map(|u| match &u.source {
            Via::Resource(r) if !c.is_share(r) => Some(r.as_str()),
            _ => None,
        })
        .collect();
    let claims = uses().any(|u| matches!(u.source, Via::Claim { .. }));
    let offers = |s: &Shape| {
        let a = &s.key.allocatable;
        let some = |r: &str| a.get(r).is_some_and(|n| *n > 0);
        if !asked.is_empty() {
            asked.iter().all(|r| some(r))
        } else if claims {
            true
        } else {
            c.shared_from.as_deref().is_none_or(some)
        }
    };
    let labels: Vec<(&str, Option<&str>)> = c
        .runtime_node_labels
        .iter()
        .map(|l| match l.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (l.as_str(), None),
        })
        .collect();
    let mut runtime = 0;
    let mut of = 0;
    for (shape, hosts) in crate::feasible::may_use(pod, nodes) {
        if !offers(shape) {
            continue;
        }
        of += hosts;
        fn has<'a>(
            labels: &[(&str, Option<&str>)],
            label: impl Fn(&str) -> Option<&'a str>,
        ) -> bool {
            labels
                .iter()
                .any(|(k, v)| label(k).is_some_and(|have| v.is_none_or(|v| v == have)))
        }
        // A label of the host keys differs from node to node of a shape; any other is the
        // shape's.
        runtime += if labels.iter().any(|(k, _)| nodes.is_host_key(k)) {
            let with = shape
                .hosts
                .iter()
                .filter(|h| has(&labels, |k| shape.label(h, k)))
                .count();
            with.min(hosts)
        } else if has(&labels, |k| shape.key.labels.get(k)) {
            hosts
        } else {
            0
        };
    }
    (runtime, of)
}

/// Mounts the driver of each class whose driver [`decide`] says to mount into the
/// containers that use a GPU of it. Classes whose driver the runtime injects (`runtime`:
/// device plugins with CDI, DRA drivers; `auto` on nodes that show such a runtime) get
/// nothing: a redundant hostPath only makes Pod Security refuse the pod. Where the
/// namespace's Pod Security forbids hostPath volumes (`heed`), a mount decided is left to
/// the runtime too, with a warning once per class: Pod Security wins over the decision.
pub(crate) fn apply(
    _: &Policy,
    gpus: &Gpus<'_>,
    cluster: &dyn Cluster,
    pod: &mut Pod,
    added: &mut Vec<Added>,
    warnings: &mut Vec<String>,
    heed: &Heed<'_>,
) -> bool {
    // Decided once per class, before the pod is changed; Pod Security laid over it.
    let mut mounted: Vec<Class<'_>> = vec![];
    for &class in &gpus.classes {
        if class.spec.driver == Driver::Runtime {
            continue;
        }
        let d = decide(class, gpus, pod, cluster);
        if !d.mount {
            continue;
        }
        if let (_, Some(veto)) = heed.driver(Driver::HostPath) {
            let volumes: Vec<&str> = class.spec.mounts.iter().map(|m| m.name.as_str()).collect();
            if !volumes.is_empty() {
                warnings.push(veto.warning(heed, class.name, &volumes));
            }
            continue;
        }
        if let DriverWhy::Nodes { runtime, of } = d.why {
            if runtime > 0 {
                warnings.push(format!(
                    "tollgate: {runtime} of the {of} nodes that could run the pod inject the {} GPU driver and {} not; the driver was mounted (hostPath), which the others need",
                    class.name,
                    of - runtime
                ));
            }
        }
        mounted.push(class);
    }
    if mounted.is_empty() {
        return false;
    }
    let Some(spec) = pod.spec.as_mut() else {
        return false;
    };
    // Split borrows: containers are changed while the pod's volumes are looked up.
    let PodSpec {
        init_containers,
        containers,
        volumes,
        ..
    } = spec;
    let all = crate::pod::containers_mut(init_containers, containers);
    let mut changed = false;
    // Our volume names the pod already uses for its own volume: warned about once per pod,
    // not once per container, since the user made one decision.
    let mut foreign: Vec<&str> = Vec::new();
    for (kind, c) in all {
        for class in mounted_classes(gpus, &c.name, &mounted) {
            let wanted = class.spec;
            for m in &wanted.mounts {
                if find_volume(volumes, &m.name).is_some_and(|v| !is_ours(v, m)) {
                    if !foreign.contains(&m.name.as_str()) {
                        foreign.push(&m.name);
                        warnings.push(format!(
                            "tollgate: the pod has its own volume {:?}; the GPU driver was not mounted at {}",
                            m.name, m.mount_path
                        ));
                    }
                    continue;
                }
                match mount_state(c, m) {
                    MountState::Present => {}
                    MountState::Absent => {
                        added.push(Added::VolumeMount {
                            container: c.name.clone(),
                            name: m.name.clone(),
                            mount_path: m.mount_path.clone(),
                        });
                        c.volume_mounts
                            .get_or_insert_with(Vec::new)
                            .push(VolumeMount {
                                name: m.name.clone(),
                                mount_path: m.mount_path.clone(),
                                read_only: Some(true),
                                ..Default::default()
                            });
                        changed = true;
                    }
                    MountState::PathTaken => {
                        warnings.push(format!(
                            "tollgate: {} {:?} already mounts something at {}; the GPU driver was not mounted there",
                            kind.noun(),
                            c.name,
                            m.mount_path
                        ));
                        continue;
                    }
                    MountState::VolumeElsewhere(at) => {
                        warnings.push(format!(
                            "tollgate: {} {:?} already mounts {:?} at {at:?}; the GPU driver was not mounted at {}",
                            kind.noun(),
                            c.name,
                            m.name,
                            m.mount_path
                        ));
                        continue;
                    }
                }
                // Added only once some container mounts it: an unused hostPath volume would
                // still trip Pod Security for nothing.
                if find_volume(volumes, &m.name).is_none() {
                    added.push(Added::Volume(m.name.clone()));
                    volumes.get_or_insert_with(Vec::new).push(volume(m));
                    changed = true;
                }
            }
            for e in &wanted.env {
                match ensure_env(c, e) {
                    Env::Unchanged => {}
                    Env::Extended => changed = true,
                    Env::New => {
                        added.push(Added::Env {
                            container: c.name.clone(),
                            name: e.name.clone(),
                        });
                        changed = true;
                    }
                }
            }
        }
    }
    changed
}

/// Why a driver [`decide`] would mount was left to the runtime, where the namespace's Pod
/// Security forbids hostPath volumes (`heed`): for the applied annotation. None where no
/// mode forbids them (without deciding anything) or no class's driver would be mounted.
pub(crate) fn left_to_runtime(
    gpus: &Gpus<'_>,
    pod: &Pod,
    cluster: &dyn Cluster,
    heed: &Heed<'_>,
) -> Option<Veto> {
    let (_, veto) = heed.driver(Driver::HostPath);
    let veto = veto?;
    gpus.classes
        .iter()
        .any(|&class| {
            class.spec.driver != Driver::Runtime && decide(class, gpus, pod, cluster).mount
        })
        .then_some(veto)
}

/// The classes whose driver is mounted that a container uses a GPU of, each once, by name.
fn mounted_classes<'p>(gpus: &Gpus<'p>, container: &str, mounted: &[Class<'_>]) -> Vec<Class<'p>> {
    let mut out: Vec<Class<'p>> = Vec::new();
    for u in gpus.of_container(container) {
        if mounted.contains(&u.class) && !out.contains(&u.class) {
            out.push(u.class);
        }
    }
    out.sort_by_key(|c| c.name);
    out
}

fn find_volume<'a>(volumes: &'a Option<Vec<Volume>>, name: &str) -> Option<&'a Volume> {
    volumes.as_deref()?.iter().find(|v| v.name == name)
}

/// Whether a pod volume is the one tollgate adds. Only the hostPath source is compared: a
/// volume with a second source is invalid and the apiserver rejects the pod anyway. An unset
/// type and "" are the same (the apiserver defaults one to the other).
fn is_ours(v: &Volume, m: &HostMount) -> bool {
    v.host_path
        .as_ref()
        .is_some_and(|h| h.path == m.host_path && h.type_.as_deref().unwrap_or("") == m.r#type)
}

fn volume(m: &HostMount) -> Volume {
    Volume {
        name: m.name.clone(),
        host_path: Some(HostPathVolumeSource {
            path: m.host_path.clone(),
            type_: (!m.r#type.is_empty()).then(|| m.r#type.clone()),
        }),
        ..Default::default()
    }
}

enum MountState<'a> {
    /// Our volume at our path (mounted by an earlier pass, or by the user the same way; a
    /// user's read-write choice is theirs to keep).
    Present,
    Absent,
    /// Another volume is mounted at our path.
    PathTaken,
    /// Our volume is mounted at another path.
    VolumeElsewhere(&'a str),
}

fn mount_state<'a>(c: &'a Container, m: &HostMount) -> MountState<'a> {
    let mut state = MountState::Absent;
    for vm in c.volume_mounts.iter().flatten() {
        let same_path = same_path(&vm.mount_path, &m.mount_path);
        if same_path && vm.name == m.name {
            return MountState::Present;
        }
        if matches!(state, MountState::Absent) {
            if same_path {
                state = MountState::PathTaken;
            } else if vm.name == m.name {
                state = MountState::VolumeElsewhere(&vm.mount_path);
            }
        }
    }
    state
}

/// `/usr/local/nvidia/` and `/usr/local/nvidia` are the same directory in the container.
fn same_path(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// What [`ensure_env`] did to a container's variable.
enum Env {
    Unchanged,
    /// Its value got ours as a component.
    Extended,
    /// The container did not set it: it has ours now.
    New,
}

fn ensure_env(c: &mut Container, e: &EnvEntry) -> Env {
    // The last definition of a name is the one the container sees.
    let existing = c
        .env
        .as_mut()
        .and_then(|env| env.iter_mut().rev().find(|v| v.name == e.name));
    let Some(var) = existing else {
        c.env.get_or_insert_with(Vec::new).push(EnvVar {
            name: e.name.clone(),
            value: Some(e.value.clone()),
            value_from: None,
        });
        return Env::New;
    };
    // A value from a secret or the downward API cannot be combined with ours here.
    if var.value_from.is_some() || e.value.is_empty() {
        return Env::Unchanged;
    }
    let current = var.value.as_deref().unwrap_or("");
    if has_component(current, &e.value, &e.separator) {
        return Env::Unchanged;
    }
    let joined = match e.if_present {
        IfPresent::Keep => return Env::Unchanged,
        // An empty component in a search path means the working directory: never create one.
        _ if current.is_empty() => e.value.clone(),
        IfPresent::Append => format!("{current}{}{}", e.separator, e.value),
        IfPresent::Prepend => format!("{}{}{current}", e.value, e.separator),
    };
    var.value = Some(joined);
    Env::Extended
}

/// Whether `item` is already one of the `sep`-separated components of `list`, or a run of
/// them when `item` itself contains the separator. No allocation: this runs on every pass.
fn has_component(list: &str, item: &str, sep: &str) -> bool {
    if sep.is_empty() {
        return list.contains(item);
    }
    std::iter::once(0)
        .chain(list.match_indices(sep).map(|(i, _)| i + sep.len()))
        .any(|start| {
            list[start..]
                .strip_prefix(item)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(sep))
        })
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
        (changed, warnings)
    }

    fn gpu(name: &str) -> Value {
        json!({"name": name, "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    }

    fn ours_volume() -> Value {
        json!({"name": "tollgate-nvidia-driver", "hostPath": {"path": "/usr/local/nvidia", "type": "Directory"}})
    }

    fn ours_mount() -> Value {
        json!({"name": "tollgate-nvidia-driver", "mountPath": "/usr/local/nvidia", "readOnly": true})
    }

    fn spec(p: &Pod) -> Value {
        to_json(p)["spec"].clone()
    }

    #[test]
    fn mounts_driver_only_into_gpu_containers() {
        let mut p = pod(json!({"spec": {
            "initContainers": [
                {"name": "fetch"},
                {"name": "nccl-proxy", "restartPolicy": "Always", "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}},
            ],
            "containers": [gpu("pytorch"), {"name": "logger"}],
            "ephemeralContainers": [{"name": "debug"}],
        }}));
        let (changed, warnings) = run(&Policy::builtin(), &mut p);
        assert!(changed);
        assert!(warnings.is_empty(), "{warnings:?}");
        let s = spec(&p);
        assert_eq!(s["volumes"], json!([ours_volume()]));
        assert_eq!(s["initContainers"][0], json!({"name": "fetch"}));
        assert_eq!(
            s["initContainers"][1]["volumeMounts"],
            json!([ours_mount()])
        );
        assert_eq!(s["containers"][0]["volumeMounts"], json!([ours_mount()]));
        assert_eq!(
            s["containers"][0]["env"],
            json!([{"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"}])
        );
        assert_eq!(s["containers"][1], json!({"name": "logger"}));
        assert_eq!(s["ephemeralContainers"], json!([{"name": "debug"}]));
    }

    #[test]
    fn pods_without_gpus_or_spec_are_untouched() {
        let mut p = pod(
            json!({"spec": {"containers": [{"name": "cpu", "resources": {"limits": {"cpu": "1"}}}]}}),
        );
        let before = to_json(&p);
        assert!(!ensure(&Policy::builtin(), &mut p, &mut vec![]));
        assert_eq!(to_json(&p), before);
        let mut p = pod(json!({"metadata": {"name": "x"}}));
        assert!(!ensure(&Policy::builtin(), &mut p, &mut vec![]));
        // Zero GPUs is not asking for one.
        let mut p = pod(
            json!({"spec": {"containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "0"}}}]}}),
        );
        assert!(!ensure(&Policy::builtin(), &mut p, &mut vec![]));
    }

    #[test]
    fn gpu_without_driver_entry_gets_nothing() {
        let mut p = pod(json!({"spec": {"containers": [
            {"name": "t", "resources": {"limits": {"amd.com/gpu": "1"}}}
        ]}}));
        assert!(!ensure(&Policy::builtin(), &mut p, &mut vec![]));
    }

    #[test]
    fn env_keep_append_prepend_and_value_from() {
        let cases = [
            (
                IfPresent::Append,
                json!("/opt/lib"),
                json!("/opt/lib:/usr/local/nvidia/lib64"),
            ),
            (
                IfPresent::Prepend,
                json!("/opt/lib"),
                json!("/usr/local/nvidia/lib64:/opt/lib"),
            ),
            (IfPresent::Keep, json!("/opt/lib"), json!("/opt/lib")),
            // Already one of the components: nothing to add, wherever it is.
            (
                IfPresent::Append,
                json!("/usr/local/nvidia/lib64:/opt"),
                json!("/usr/local/nvidia/lib64:/opt"),
            ),
            (
                IfPresent::Prepend,
                json!("/a:/usr/local/nvidia/lib64"),
                json!("/a:/usr/local/nvidia/lib64"),
            ),
            // A prefix of a component is not the component.
            (
                IfPresent::Append,
                json!("/usr/local/nvidia/lib64x"),
                json!("/usr/local/nvidia/lib64x:/usr/local/nvidia/lib64"),
            ),
            // No empty component (the working directory) is created.
            (
                IfPresent::Append,
                json!(""),
                json!("/usr/local/nvidia/lib64"),
            ),
            (
                IfPresent::Prepend,
                Value::Null,
                json!("/usr/local/nvidia/lib64"),
            ),
        ];
        for (mode, user, expected) in cases {
            let mut policy = Policy::builtin();
            let res = policy.gpu.classes.get_mut("nvidia").unwrap();
            res.env[0].if_present = mode;
            let mut var = json!({"name": "LD_LIBRARY_PATH"});
            if !user.is_null() {
                var["value"] = user.clone();
            }
            let mut c = gpu("t");
            c["env"] = json!([{"name": "A", "value": "1"}, var]);
            let mut p = pod(json!({"spec": {"containers": [c]}}));
            run(&policy, &mut p);
            let env = &spec(&p)["containers"][0]["env"];
            assert_eq!(env[1]["value"], expected, "{mode:?} {user}");
            assert_eq!(env.as_array().unwrap().len(), 2, "{mode:?} {user}");
        }
    }

    #[test]
    fn env_from_value_from_is_kept() {
        let mut c = gpu("t");
        c["env"] = json!([{"name": "LD_LIBRARY_PATH", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]);
        let mut p = pod(json!({"spec": {"containers": [c.clone()]}}));
        run(&Policy::builtin(), &mut p);
        assert_eq!(spec(&p)["containers"][0]["env"], c["env"]);
    }

    #[test]
    fn new_env_goes_last_and_multi_component_values_are_idempotent() {
        let mut policy = Policy::builtin();
        let res = policy.gpu.classes.get_mut("nvidia").unwrap();
        res.env = vec![
            EnvEntry {
                name: "PATH".into(),
                value: "/usr/local/nvidia/bin:/usr/local/nvidia/sbin".into(),
                if_present: IfPresent::Append,
                separator: ":".into(),
            },
            EnvEntry {
                name: "NVIDIA_VISIBLE".into(),
                value: "all".into(),
                if_present: IfPresent::Keep,
                separator: ",".into(),
            },
        ];
        let mut c = gpu("t");
        c["env"] = json!([{"name": "PATH", "value": "/bin"}, {"name": "Z", "value": "z"}]);
        let mut p = pod(json!({"spec": {"containers": [c]}}));
        assert!(run(&policy, &mut p).0);
        assert_eq!(
            spec(&p)["containers"][0]["env"],
            json!([
                {"name": "PATH", "value": "/bin:/usr/local/nvidia/bin:/usr/local/nvidia/sbin"},
                {"name": "Z", "value": "z"},
                {"name": "NVIDIA_VISIBLE", "value": "all"},
            ])
        );
    }

    #[test]
    fn last_duplicate_env_is_the_one_extended() {
        let mut c = gpu("t");
        c["env"] = json!([{"name": "LD_LIBRARY_PATH", "value": "/a"}, {"name": "LD_LIBRARY_PATH", "value": "/b"}]);
        let mut p = pod(json!({"spec": {"containers": [c]}}));
        run(&Policy::builtin(), &mut p);
        let env = &spec(&p)["containers"][0]["env"];
        assert_eq!(env[0]["value"], "/a");
        assert_eq!(env[1]["value"], "/b:/usr/local/nvidia/lib64");
    }

    #[test]
    fn users_volume_with_our_name_is_kept_with_one_warning() {
        let theirs = json!({"name": "tollgate-nvidia-driver", "hostPath": {"path": "/opt/nvidia"}});
        let mut p = pod(json!({"spec": {
            "containers": [gpu("a"), gpu("b")],
            "volumes": [theirs.clone()],
        }}));
        let (changed, warnings) = run(&Policy::builtin(), &mut p);
        assert!(changed, "env is still set");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].starts_with("tollgate: "));
        assert!(
            warnings[0].contains("\"tollgate-nvidia-driver\""),
            "{}",
            warnings[0]
        );
        assert!(warnings[0].len() < 120, "{}", warnings[0]);
        let s = spec(&p);
        assert_eq!(s["volumes"], json!([theirs]));
        assert!(s["containers"][0].get("volumeMounts").is_none());
        assert!(s["containers"][1].get("volumeMounts").is_none());
    }

    #[test]
    fn identical_volume_is_ours_whatever_wrote_it() {
        // An earlier tollgate version or the user wrote exactly our volume, with or without
        // the apiserver's defaulted empty type.
        let mut policy = Policy::builtin();
        policy.gpu.classes.get_mut("nvidia").unwrap().mounts[0].r#type = String::new();
        let v = json!({"name": "tollgate-nvidia-driver", "hostPath": {"path": "/usr/local/nvidia", "type": ""}});
        let mut p = pod(json!({"spec": {"containers": [gpu("a")], "volumes": [v.clone()]}}));
        let (changed, warnings) = run(&policy, &mut p);
        assert!(changed);
        assert!(warnings.is_empty());
        assert_eq!(spec(&p)["volumes"], json!([v]));
        assert_eq!(
            spec(&p)["containers"][0]["volumeMounts"],
            json!([ours_mount()])
        );
    }

    #[test]
    fn mount_path_taken_is_skipped_for_that_container_only() {
        let mut a = gpu("pytorch");
        a["volumeMounts"] = json!([{"name": "drv", "mountPath": "/usr/local/nvidia/"}]);
        let mut p = pod(json!({"spec": {"containers": [a.clone(), gpu("b")]}}));
        let (changed, warnings) = run(&Policy::builtin(), &mut p);
        assert!(changed);
        assert_eq!(
            warnings,
            ["tollgate: container \"pytorch\" already mounts something at /usr/local/nvidia; the GPU driver was not mounted there"]
        );
        let s = spec(&p);
        assert_eq!(s["containers"][0]["volumeMounts"], a["volumeMounts"]);
        assert_eq!(s["containers"][1]["volumeMounts"], json!([ours_mount()]));
        assert_eq!(s["volumes"], json!([ours_volume()]));
    }

    #[test]
    fn our_volume_mounted_elsewhere_is_not_mounted_twice() {
        let mut a = gpu("pytorch");
        a["volumeMounts"] = json!([{"name": "tollgate-nvidia-driver", "mountPath": "/opt/nv"}]);
        let mut p = pod(json!({"spec": {"containers": [a.clone()], "volumes": [ours_volume()]}}));
        let (changed, warnings) = run(&Policy::builtin(), &mut p);
        assert!(changed, "env");
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("\"/opt/nv\""), "{}", warnings[0]);
        assert_eq!(spec(&p)["containers"][0]["volumeMounts"], a["volumeMounts"]);
    }

    #[test]
    fn our_mount_without_our_volume_gets_the_volume() {
        let mut a = gpu("pytorch");
        a["volumeMounts"] =
            json!([{"name": "tollgate-nvidia-driver", "mountPath": "/usr/local/nvidia"}]);
        a["env"] = json!([{"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"}]);
        let mut p = pod(json!({"spec": {"containers": [a.clone()]}}));
        assert!(run(&Policy::builtin(), &mut p).0);
        let s = spec(&p);
        assert_eq!(s["volumes"], json!([ours_volume()]));
        assert_eq!(s["containers"][0], a, "a user's read-write mount is theirs");
    }

    #[test]
    fn shared_volume_between_resources_is_added_once() {
        let mut policy = Policy::builtin();
        let mut example = policy.gpu.classes["nvidia"].clone();
        example.resources = vec!["example.com/gpu".into()];
        policy.gpu.classes.insert("example".into(), example);
        let mut p = pod(json!({"spec": {"containers": [
            {"name": "both", "resources": {"limits": {"nvidia.com/gpu": "1", "example.com/gpu": "1"}}},
            {"name": "other", "resources": {"limits": {"example.com/gpu": "2"}}},
        ]}}));
        let (_, warnings) = run(&policy, &mut p);
        assert!(warnings.is_empty(), "{warnings:?}");
        let s = spec(&p);
        assert_eq!(s["volumes"], json!([ours_volume()]));
        assert_eq!(s["containers"][0]["volumeMounts"], json!([ours_mount()]));
        assert_eq!(s["containers"][1]["volumeMounts"], json!([ours_mount()]));
        assert_eq!(s["containers"][0]["env"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn apiserver_fixture_round_trips_idempotently() {
        let review: Value = serde_json::from_str(include_str!(
            "../../../../tests/fixtures/apiserver-v1.36/resnet50-master-0.mutate.json"
        ))
        .unwrap();
        let mut p = pod(review["request"]["object"].clone());
        assert!(run(&Policy::builtin(), &mut p).0);
        // What the apiserver sends on reinvocation is our output, re-read.
        let mut again = pod(to_json(&p));
        assert!(!ensure(&Policy::builtin(), &mut again, &mut vec![]));
        let s = spec(&p);
        assert_eq!(
            s["containers"][0]["volumeMounts"],
            json!([{"name": "dshm", "mountPath": "/dev/shm"}, ours_mount()])
        );
        assert_eq!(s["volumes"][1], ours_volume());
    }

    /// `driver: auto` (the shipped class) decided from the nodes that could run the pod:
    /// the runtime's where they all carry a runtime label, a mount where one does not, the
    /// fallback where none is known; and a toleration the pod lacks rules a node out.
    #[test]
    fn auto_decides_from_the_nodes_that_could_run_the_pod() {
        use crate::cluster::Objects;
        let policy = Policy::builtin();
        let node = |name: &str,
                    labels: Value,
                    taint: bool,
                    gpus: &str|
         -> k8s_openapi::api::core::v1::Node {
            let mut n = json!({"metadata": {"name": name, "labels": labels},
                "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": gpus, "pods": "110"}}});
            if taint {
                n["spec"] = json!({"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]});
            }
            serde_json::from_value(n).unwrap()
        };
        let toolkit = json!({"nvidia.com/gpu.deploy.container-toolkit": "true"});
        let gke = json!({"cloud.google.com/gke-accelerator": "nvidia-l4"});
        let decided = |nodes: Vec<k8s_openapi::api::core::v1::Node>, tolerates: bool| {
            let mut o = Objects::default();
            for n in nodes {
                o.add_node(n);
            }
            let mut spec = json!({"containers": [gpu("t")]});
            if tolerates {
                spec["tolerations"] = json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]);
            }
            let p = pod(json!({"spec": spec}));
            let gpus = Gpus::of(&policy, &p, "", &o);
            decide(gpus.classes[0], &gpus, &p, &o)
        };
        let d = decided(
            vec![
                node("a", toolkit.clone(), true, "8"),
                node("b", gke, true, "1"),
            ],
            true,
        );
        assert_eq!(
            (d.mount, d.why),
            (false, DriverWhy::Nodes { runtime: 2, of: 2 })
        );
        let d = decided(
            vec![
                node("a", toolkit.clone(), true, "8"),
                node("b", json!({}), true, "8"),
            ],
            true,
        );
        assert_eq!(
            (d.mount, d.why),
            (true, DriverWhy::Nodes { runtime: 1, of: 2 })
        );
        // A node offering no GPU, or tainted for a pod without the toleration, is not one
        // that could run it: the fallback (hostPath) decides.
        let d = decided(vec![node("a", toolkit.clone(), false, "0")], true);
        assert_eq!((d.mount, d.why), (true, DriverWhy::Fallback));
        let d = decided(vec![node("a", toolkit, true, "8")], false);
        assert_eq!((d.mount, d.why), (true, DriverWhy::Fallback));
        // No cluster context at all: the fallback, as a pod judged offline is mutated.
        let p = pod(json!({"spec": {"containers": [gpu("t")]}}));
        let gpus = Gpus::of(&policy, &p, "", &crate::cluster::Offline);
        let d = decide(gpus.classes[0], &gpus, &p, &crate::cluster::Offline);
        assert_eq!((d.mount, d.why), (true, DriverWhy::Fallback));
    }

    #[test]
    fn component_search() {
        assert!(has_component("a:b:c", "b", ":"));
        assert!(has_component("a:b:c", "b:c", ":"));
        assert!(has_component("b", "b", ":"));
        assert!(!has_component("ab:c", "b", ":"));
        assert!(!has_component("a:bc", "b", ":"));
        assert!(!has_component("", "b", ":"));
        assert!(has_component("a::b", "b", "::"));
        assert!(has_component("xay", "a", ""));
        assert!(has_component("é:b", "b", ":"));
    }
}

//! A Kubeflow Trainer TrainJob's pods, as its controller builds them from its runtime.
//!
//! A TrainJob (`trainer.kubeflow.org/v1alpha1`) carries no pod template. Its
//! `spec.runtimeRef` names a TrainingRuntime (in the TrainJob's namespace) or a
//! ClusterTrainingRuntime, whose `spec.template` is the JobSet the controller creates, one
//! replicated job per step; the TrainJob changes it. This module builds that runtime as
//! the controller would change it for one TrainJob, following kubeflow/trainer v2.3
//! (`pkg/runtime/core/trainingruntime.go` newRuntimeInfo and mergeRuntimePatches,
//! `pkg/runtime/framework/plugins/jobset/builder.go` Trainer and PodLabels, the MPI and
//! gang-scheduling plugins), so that the policy's template paths find its pod templates
//! in it and `workload` judges them as any workload's:
//!
//! - the overrides first: `spec.podTemplateOverrides` (Trainer v2.1: metadata and spec
//!   merged into the pod templates of their `targetJobs`), then `spec.runtimePatches`
//!   (v2.2 on: each patch's `trainingRuntimeSpec.template.spec` merged into the JobSet
//!   spec), each a strategic merge (lists of containers, env, volumes, ... merged by name);
//! - then `spec.trainer` on the steps labelled `trainer.kubeflow.org/trainjob-ancestor-step:
//!   trainer`: its `image`, `command` and `args` replace the `node` container's, its `env`
//!   is merged into it by name, its `resourcesPerNode` merged into (v2.3) or replacing
//!   (before) the `node` container's resources, its `numNodes` (else the runtime's
//!   `mlPolicy.numNodes`) the Job's parallelism; with MPI's `runLauncherAsNode`, the `node`
//!   step gets the env and resources too;
//! - the labels and annotations the gang-scheduling plugins add to every pod
//!   (coscheduling's `scheduling.x-k8s.io/pod-group`, Volcano's
//!   `scheduling.k8s.io/group-name`). The JobSet's own labels are the policy's.
//!
//! What the plugins add that no judgement reads (PET_* env, ports, the MPI hostfile and
//! SSH volumes, the initializers' env) is left out; so is Flux's `flux-installer` init
//! container, whose runtime Trainer does not ship.

use serde_json::{Map, Value};

use crate::cluster::{Cluster, ContextKind, Lookup, ObjectKey};
use crate::policy::{ResourcesPerNode, TrainingRuntimeSource};

/// The API group of TrainJobs and their runtimes.
pub const GROUP: &str = "trainer.kubeflow.org";
/// The label on a replicated job's Job template naming its step.
pub(crate) const ANCESTOR: &str = "trainer.kubeflow.org/trainjob-ancestor-step";
/// The step the trainer fields change.
pub(crate) const TRAINER: &str = "trainer";
/// The trainer's container, and the MPI runtimes' node step.
pub(crate) const NODE: &str = "node";
const COSCHEDULING_LABEL: &str = "scheduling.x-k8s.io/pod-group";
const VOLCANO_ANNOTATION: &str = "scheduling.k8s.io/group-name";

/// The runtime a TrainJob names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuntimeRef {
    /// [`ContextKind::TrainingRuntime`] or [`ContextKind::ClusterTrainingRuntime`].
    pub kind: ContextKind,
    /// The TrainJob's, for a TrainingRuntime; empty for a ClusterTrainingRuntime.
    pub namespace: String,
    pub name: String,
}

impl RuntimeRef {
    /// `spec.runtimeRef` of `trainjob` in `namespace`: the kind defaults to
    /// ClusterTrainingRuntime and the group to trainer.kubeflow.org, as the CRD's defaults.
    /// An error says what else it names.
    pub(crate) fn of(trainjob: &Value, namespace: &str) -> Result<RuntimeRef, String> {
        let r = trainjob.pointer("/spec/runtimeRef");
        let field = |k: &str| r.and_then(|r| r.get(k)).and_then(Value::as_str);
        let group = field("apiGroup").unwrap_or(GROUP);
        let kind = field("kind").unwrap_or("ClusterTrainingRuntime");
        let name = field("name").unwrap_or_default();
        if name.is_empty() {
            return Err("its spec.runtimeRef names no runtime".into());
        }
        let kind = match (group, kind) {
            (GROUP, "TrainingRuntime") => ContextKind::TrainingRuntime,
            (GROUP, "ClusterTrainingRuntime") => ContextKind::ClusterTrainingRuntime,
            _ => {
                return Err(format!(
                    "its spec.runtimeRef names a {kind} ({group}) {name:?}, not a TrainingRuntime or ClusterTrainingRuntime of {GROUP}"
                ))
            }
        };
        let namespace = match kind {
            ContextKind::TrainingRuntime => namespace.to_owned(),
            _ => String::new(),
        };
        Ok(RuntimeRef {
            kind,
            namespace,
            name: name.to_owned(),
        })
    }

    /// The key the shell fetches it by.
    pub(crate) fn key(&self) -> ObjectKey {
        ObjectKey {
            kind: self.kind,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    /// `ClusterTrainingRuntime "torch-distributed"`, as messages name it.
    pub(crate) fn describe(&self) -> String {
        format!("{} {:?}", self.kind.as_str(), self.name)
    }

    fn lookup(&self, cluster: &dyn Cluster) -> Lookup<std::sync::Arc<Value>> {
        match self.kind {
            ContextKind::TrainingRuntime => cluster.training_runtime(&self.namespace, &self.name),
            _ => cluster.cluster_training_runtime(&self.name),
        }
    }
}

/// Why a TrainJob's pod templates could not be built, and what to fetch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Unbuilt {
    /// What the warning says after the TrainJob's name.
    pub why: String,
    /// The runtime the cluster context did not know: the shell fetches it and reviews again.
    pub unresolved: Option<ObjectKey>,
}

/// The runtime `trainjob` names, as the controller changes it for `trainjob`: the object
/// the policy's template paths are read in. `name` is the TrainJob's (the JobSet's).
pub(crate) fn build(
    source: &TrainingRuntimeSource,
    trainjob: &Value,
    name: &str,
    namespace: &str,
    cluster: &dyn Cluster,
) -> Result<Value, Unbuilt> {
    let runtime_ref = RuntimeRef::of(trainjob, namespace).map_err(|why| Unbuilt {
        why,
        unresolved: None,
    })?;
    let runtime = match runtime_ref.lookup(cluster) {
        Lookup::Found(r) => r,
        Lookup::Absent => {
            return Err(Unbuilt {
                why: format!("its runtime {} was not found", runtime_ref.describe()),
                unresolved: None,
            })
        }
        Lookup::Unknown => {
            let why = if cluster.is_offline() {
                format!(
                    "tollgate has no cluster context, so it does not know its runtime {}",
                    runtime_ref.describe()
                )
            } else {
                format!(
                    "tollgate does not know its runtime {}",
                    runtime_ref.describe()
                )
            };
            return Err(Unbuilt {
                why,
                unresolved: Some(runtime_ref.key()),
            });
        }
    };
    Ok(apply(source, trainjob, name, &runtime))
}

/// [`build`] once the runtime is known: its JobSet template with the TrainJob's overrides
/// and patches merged in, then each replicated job as the plugins change it ([`Plan`]).
pub(crate) fn apply(
    source: &TrainingRuntimeSource,
    trainjob: &Value,
    name: &str,
    runtime: &Value,
) -> Value {
    let mut spec = match runtime.pointer("/spec/template/spec") {
        Some(Value::Object(s)) => Value::Object(s.clone()),
        _ => Value::Object(Map::new()),
    };
    let job = trainjob.get("spec");
    apply_overrides(&mut spec, job);
    apply_patches(&mut spec, job);
    let plan = Plan::of(runtime, job);
    for rjob in replicated_jobs(&mut spec) {
        plan.apply(source, name, rjob);
    }
    runtime_with(runtime, spec)
}

/// Trainer v2.1: the pod template overrides of their target jobs, in order.
fn apply_overrides(spec: &mut Value, job: Option<&Value>) {
    for o in list(job, "podTemplateOverrides") {
        let mut patch = Map::new();
        if let Some(Value::Object(m)) = o.get("metadata") {
            let meta: Map<String, Value> = ["labels", "annotations"]
                .iter()
                .filter_map(|k| Some(((*k).to_owned(), m.get(*k)?.clone())))
                .collect();
            if !meta.is_empty() {
                patch.insert("metadata".into(), Value::Object(meta));
            }
        }
        if let Some(s) = o.get("spec").filter(|s| s.is_object()) {
            patch.insert("spec".into(), s.clone());
        }
        let patch = Value::Object(patch);
        let targets: Vec<&str> = list(Some(o), "targetJobs")
            .iter()
            .filter_map(|t| t.get("name")?.as_str())
            .collect();
        for rjob in replicated_jobs(spec) {
            let named = rjob.get("name").and_then(Value::as_str);
            if named.is_some_and(|n| targets.contains(&n)) {
                merge(pod_template(rjob), &patch, "");
            }
        }
    }
}

/// Trainer v2.2 on: the runtime patches, in order.
fn apply_patches(spec: &mut Value, job: Option<&Value>) {
    for p in list(job, "runtimePatches") {
        if let Some(patch) = p
            .pointer("/trainingRuntimeSpec/template/spec")
            .filter(|s| s.is_object())
        {
            merge(spec, patch, "");
        }
    }
}

/// What the runtime's plugins decide for one TrainJob, before any replicated job is
/// changed: the trainer fields, the node count, MPI's launcher, the gang scheduler.
struct Plan<'a> {
    /// The TrainJob's `spec.trainer`.
    trainer: Option<&'a Value>,
    /// The runtime's `mlPolicy.mpi`: its `node` step makes the nodes.
    mpi: bool,
    /// MPI's `runLauncherAsNode`: the launcher is one of the nodes, and the `node` step
    /// gets the trainer's env and resources too.
    launcher_as_node: bool,
    /// The TrainJob's `trainer.numNodes`, else the runtime's `mlPolicy.numNodes`, else 1.
    nodes: i64,
    coscheduling: bool,
    volcano: bool,
}

impl<'a> Plan<'a> {
    fn of(runtime: &'a Value, job: Option<&'a Value>) -> Plan<'a> {
        let trainer = job.and_then(|j| j.get("trainer"));
        let ml = runtime.pointer("/spec/mlPolicy");
        let mpi = ml.and_then(|m| m.get("mpi")).filter(|m| m.is_object());
        let group = runtime.pointer("/spec/podGroupPolicy");
        Plan {
            trainer,
            mpi: mpi.is_some(),
            launcher_as_node: mpi
                .and_then(|m| m.get("runLauncherAsNode"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
            nodes: trainer
                .and_then(|t| t.get("numNodes"))
                .or_else(|| ml.and_then(|m| m.get("numNodes")))
                .and_then(Value::as_i64)
                .unwrap_or(1),
            coscheduling: group.and_then(|g| g.get("coscheduling")).is_some(),
            volcano: group.and_then(|g| g.get("volcano")).is_some(),
        }
    }

    /// How many pods a replicated job runs (its Job's parallelism and completions), where
    /// the plan sets it: MPI's `node` step (less the launcher where it is one of the
    /// nodes), or the trainer step.
    fn count(&self, trainer_step: bool, node_step: bool) -> Option<i64> {
        match (self.mpi, node_step) {
            (true, true) if self.launcher_as_node => Some((self.nodes - 1).max(1)),
            (true, true) => Some(self.nodes),
            (true, false) => None,
            (false, _) => trainer_step.then_some(self.nodes),
        }
    }

    /// Replicated job `rjob` of TrainJob `name` as the plugins change it.
    fn apply(&self, source: &TrainingRuntimeSource, name: &str, rjob: &mut Value) {
        let step = rjob
            .pointer(&format!(
                "/template/metadata/labels/{}",
                ANCESTOR.replace('/', "~1")
            ))
            .and_then(Value::as_str)
            == Some(TRAINER);
        let is_node = rjob.get("name").and_then(Value::as_str) == Some(NODE);
        if let (Some(n), Some(r)) = (self.count(step, is_node), rjob.as_object_mut()) {
            if let Some(Value::Object(t)) = r.get_mut("template") {
                if let Value::Object(js) =
                    t.entry("spec").or_insert_with(|| Value::Object(Map::new()))
                {
                    js.insert("parallelism".into(), n.into());
                    js.insert("completions".into(), n.into());
                }
            }
        }
        if step {
            if let Value::Object(r) = rjob {
                r.insert("replicas".into(), 1.into());
            }
        }
        // A step without a pod template makes no pod tollgate could judge.
        if rjob.pointer("/template/spec/template").is_none() {
            return;
        }
        let template = pod_template(rjob);
        if self.coscheduling {
            set_string(template, "labels", COSCHEDULING_LABEL, name);
        }
        if self.volcano {
            set_string(template, "annotations", VOLCANO_ANNOTATION, name);
        }
        let Some(trainer) = self
            .trainer
            .filter(|_| step || (self.launcher_as_node && is_node))
        else {
            return;
        };
        let Some(node) = node_container(template) else {
            return;
        };
        if step {
            for k in ["image", "command", "args"] {
                if let Some(v) = trainer.get(k).filter(|v| !v.is_null()) {
                    node.insert(k.into(), v.clone());
                }
            }
        }
        if let Some(Value::Array(env)) = trainer.get("env") {
            upsert_env(node, env);
        }
        if let Some(res) = trainer.get("resourcesPerNode").filter(|r| r.is_object()) {
            match source.resources_per_node {
                ResourcesPerNode::Merge => {
                    let base = node
                        .entry("resources")
                        .or_insert_with(|| Value::Object(Map::new()));
                    merge(base, res, "resources");
                }
                ResourcesPerNode::Replace => {
                    node.insert("resources".into(), res.clone());
                }
            }
        }
    }
}

/// The runtime as the policy's template paths read it: its apiVersion, kind, name and
/// namespace, and `spec` as its JobSet template's spec.
fn runtime_with(runtime: &Value, spec: Value) -> Value {
    let mut meta = Map::new();
    for k in ["name", "namespace"] {
        if let Some(v) = runtime.pointer(&format!("/metadata/{k}")) {
            meta.insert(k.into(), v.clone());
        }
    }
    let mut out = Map::new();
    for k in ["apiVersion", "kind"] {
        if let Some(v) = runtime.get(k) {
            out.insert(k.into(), v.clone());
        }
    }
    out.insert("metadata".into(), Value::Object(meta));
    let mut template = Map::new();
    template.insert("spec".into(), spec);
    let mut rspec = Map::new();
    rspec.insert("template".into(), Value::Object(template));
    out.insert("spec".into(), Value::Object(rspec));
    Value::Object(out)
}

fn list<'v>(v: Option<&'v Value>, key: &str) -> &'v [Value] {
    v.and_then(|v| v.get(key))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn replicated_jobs(spec: &mut Value) -> impl Iterator<Item = &mut Value> {
    spec.get_mut("replicatedJobs")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter(|r| r.is_object())
}

/// A replicated job's pod template (`template.spec.template`), made an object if it is
/// missing.
fn pod_template(rjob: &mut Value) -> &mut Value {
    let mut at = rjob;
    for k in ["template", "spec", "template"] {
        at = child(at, k);
    }
    if !at.is_object() {
        *at = Value::Object(Map::new());
    }
    at
}

/// The member `key` of `v`, made an object (and `v` too) if it is missing.
fn child<'a>(v: &'a mut Value, key: &str) -> &'a mut Value {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    match v {
        Value::Object(m) => m.entry(key).or_insert_with(|| Value::Object(Map::new())),
        other => other,
    }
}

fn node_container(template: &mut Value) -> Option<&mut Map<String, Value>> {
    template
        .pointer_mut("/spec/containers")?
        .as_array_mut()?
        .iter_mut()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(NODE))?
        .as_object_mut()
}

/// Sets `metadata.<map>.<key>` of a pod template.
fn set_string(template: &mut Value, map: &str, key: &str, value: &str) {
    let Value::Object(t) = template else { return };
    let meta = t
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(meta) = meta else { return };
    let m = meta.entry(map).or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(m) = m {
        m.insert(key.into(), value.into());
    }
}

/// `apply.UpsertEnvVars`: each variable replaces the one of its name, or is appended.
fn upsert_env(container: &mut Map<String, Value>, env: &[Value]) {
    let list = container
        .entry("env")
        .or_insert_with(|| Value::Array(vec![]));
    if !list.is_array() {
        *list = Value::Array(vec![]);
    }
    let Value::Array(list) = list else { return };
    for e in env {
        let name = e.get("name");
        match list.iter_mut().find(|x| x.get("name") == name) {
            Some(x) => *x = e.clone(),
            None => list.push(e.clone()),
        }
    }
}

/// The key by which a strategic merge patch merges the elements of a list field of the
/// Kubernetes types a runtime patch reaches (JobSet, Job and Pod specs); lists of other
/// fields are replaced whole.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "replicatedJobs"
        | "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "schedulingGates"
        | "resourceClaims"
        | "claims" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => "containerPort",
        _ => return None,
    })
}

/// A strategic merge patch of `patch` into `base` (`field` is the key `base` is under):
/// maps merged key by key, a null removes, lists of the fields [`merge_key`] knows merged
/// element by element, anything else replaced.
fn merge(base: &mut Value, patch: &Value, field: &str) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, pv) in p {
                if pv.is_null() {
                    b.remove(k);
                    continue;
                }
                match b.get_mut(k) {
                    Some(bv) => merge(bv, pv, k),
                    None => {
                        b.insert(k.clone(), pv.clone());
                    }
                }
            }
        }
        (Value::Array(b), Value::Array(p)) if merge_key(field).is_some() => {
            let key = merge_key(field).unwrap_or("name");
            for pe in p {
                let id = pe.get(key);
                match b.iter_mut().find(|be| id.is_some() && be.get(key) == id) {
                    Some(be) => merge(be, pe, ""),
                    None => b.push(pe.clone()),
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Objects;
    use serde_json::json;

    fn torch_distributed() -> Value {
        json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "ClusterTrainingRuntime",
            "metadata": {"name": "torch-distributed"},
            "spec": {
                "mlPolicy": {"numNodes": 1, "torch": {}},
                "template": {"spec": {"replicatedJobs": [{
                    "name": "node",
                    "template": {
                        "metadata": {"labels": {ANCESTOR: "trainer"}},
                        "spec": {"template": {"spec": {"containers": [{
                            "name": "node",
                            "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
                            "resources": {"requests": {"cpu": "2"}},
                            "env": [{"name": "A", "value": "runtime"}]
                        }]}}}
                    }
                }]}}
            }
        })
    }

    fn node(built: &Value) -> &Value {
        &built["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
            ["spec"]["containers"][0]
    }

    #[test]
    fn the_trainer_changes_the_node_container_of_the_trainer_step() {
        let job = json!({"spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "image": "train:1", "command": ["torchrun"], "numNodes": 4,
                "env": [{"name": "A", "value": "job"}, {"name": "B", "value": "b"}],
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": "1"}}
            }
        }});
        let source = TrainingRuntimeSource::default();
        let built = apply(&source, &job, "t", &torch_distributed());
        let n = node(&built);
        assert_eq!(n["image"], "train:1");
        assert_eq!(n["command"], json!(["torchrun"]));
        assert_eq!(
            n["env"],
            json!([{"name": "A", "value": "job"}, {"name": "B", "value": "b"}])
        );
        assert_eq!(
            n["resources"],
            json!({"requests": {"cpu": "2"}, "limits": {"nvidia.com/gpu": "1"}})
        );
        let rjob = &built["spec"]["template"]["spec"]["replicatedJobs"][0];
        assert_eq!(rjob["template"]["spec"]["parallelism"], 4);
        assert_eq!(rjob["replicas"], 1);
        // Before Trainer v2.3 resourcesPerNode replaced the runtime's.
        let source = TrainingRuntimeSource {
            resources_per_node: ResourcesPerNode::Replace,
            ..TrainingRuntimeSource::default()
        };
        let built = apply(&source, &job, "t", &torch_distributed());
        assert_eq!(
            node(&built)["resources"],
            json!({"limits": {"nvidia.com/gpu": "1"}})
        );
    }

    #[test]
    fn overrides_of_both_versions_reach_the_pod_template_they_target() {
        let job = json!({"spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "podTemplateOverrides": [{
                "targetJobs": [{"name": "node"}],
                "metadata": {"annotations": {"a": "v2.1"}},
                "spec": {"containers": [{"name": "node", "env": [{"name": "C", "value": "c"}]}]}
            }],
            "runtimePatches": [{
                "manager": "example.io/platform",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                    "name": "node",
                    "template": {"spec": {"template": {
                        "metadata": {"labels": {"team": "ml"}},
                        "spec": {"nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "k"}]}
                    }}}
                }]}}}
            }]
        }});
        let built = apply(
            &TrainingRuntimeSource::default(),
            &job,
            "t",
            &torch_distributed(),
        );
        let t =
            &built["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"];
        assert_eq!(t["metadata"]["annotations"]["a"], "v2.1");
        assert_eq!(t["metadata"]["labels"]["team"], "ml");
        assert_eq!(t["spec"]["nodeSelector"]["pool"], "gpu");
        assert_eq!(t["spec"]["tolerations"], json!([{"key": "k"}]));
        let c = &t["spec"]["containers"][0];
        assert_eq!(c["image"], "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime");
        assert_eq!(
            c["env"],
            json!([{"name": "A", "value": "runtime"}, {"name": "C", "value": "c"}])
        );
    }

    #[test]
    fn the_runtime_comes_from_the_cluster_or_is_missing() {
        let job = json!({"spec": {"runtimeRef": {"name": "torch-distributed"}}});
        let source = TrainingRuntimeSource::default();
        let mut known = Objects::complete();
        assert!(known.add_training_runtime(torch_distributed()));
        assert!(build(&source, &job, "t", "ml", &known).is_ok());
        let m = build(&source, &job, "t", "ml", &Objects::complete()).unwrap_err();
        assert_eq!(m.unresolved, None);
        assert!(m.why.contains("was not found"), "{}", m.why);
        let m = build(&source, &job, "t", "ml", &Objects::default()).unwrap_err();
        assert_eq!(
            m.unresolved,
            Some(ObjectKey {
                kind: ContextKind::ClusterTrainingRuntime,
                namespace: String::new(),
                name: "torch-distributed".into()
            })
        );
        let local = json!({"spec": {"runtimeRef": {"name": "mine", "kind": "TrainingRuntime"}}});
        let m = build(&source, &local, "t", "ml", &Objects::default()).unwrap_err();
        assert_eq!(m.unresolved.unwrap().namespace, "ml");
        let other = json!({"spec": {"runtimeRef": {"name": "x", "apiGroup": "example.io", "kind": "Runtime"}}});
        let m = build(&source, &other, "t", "ml", &Objects::default()).unwrap_err();
        assert_eq!(m.unresolved, None);
    }

    #[test]
    fn mpi_runs_the_trainer_on_the_node_step_when_the_launcher_is_a_node() {
        let runtime = json!({
            "kind": "ClusterTrainingRuntime",
            "metadata": {"name": "deepspeed-distributed"},
            "spec": {
                "mlPolicy": {"numNodes": 1, "mpi": {"runLauncherAsNode": true}},
                "podGroupPolicy": {"coscheduling": {}},
                "template": {"spec": {"replicatedJobs": [
                    {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [{"name": "node"}]}}}}},
                    {"name": "launcher", "template": {
                        "metadata": {"labels": {ANCESTOR: "trainer"}},
                        "spec": {"template": {"spec": {"containers": [{"name": "node"}]}}}
                    }}
                ]}}
            }
        });
        let job = json!({"spec": {"trainer": {"numNodes": 3, "image": "ds:1",
            "resourcesPerNode": {"requests": {"cpu": "1"}}}}});
        let built = apply(&TrainingRuntimeSource::default(), &job, "t", &runtime);
        let jobs = &built["spec"]["template"]["spec"]["replicatedJobs"];
        assert_eq!(jobs[0]["template"]["spec"]["parallelism"], 2);
        let node = &jobs[0]["template"]["spec"]["template"];
        assert_eq!(
            node["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "1"
        );
        assert_eq!(node["spec"]["containers"][0].get("image"), None);
        assert_eq!(node["metadata"]["labels"][COSCHEDULING_LABEL], "t");
        let launcher = &jobs[1]["template"]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(launcher["image"], "ds:1");
    }
}

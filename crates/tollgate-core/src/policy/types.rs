//! The policy's types: its schema, as serde reads it.
//!
//! No defaults live here: every section's values come from the built-in text
//! (`policies/default.yaml`), which a user's file is merged over (see `load`). What a
//! section may leave out is only what is empty when left out (a class's mounts, a
//! profile's sections), and, for an item of a list (which a file writes whole), the
//! item's documented default (a mount's `type`, an env entry's `separator`).
//!
//! The same types give the TollgatePolicy's and TollgateProfile's schemas (`objects::crd`,
//! through `JsonSchema`): each field's doc comment is what `kubectl explain` prints for it,
//! so it is written for the reader of a policy, not of this code.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::glob::Glob;
use crate::quantity;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    /// Which extended resources count as GPUs.
    pub gpu: GpuPolicy,
    /// Which pods are training pods (the ones that get mutated).
    pub selection: Selection,
    /// The opt-out annotation and where it is honoured.
    pub opt_out: OptOutRules,
    /// What the mutating webhook adds to a training pod: each step, whether it is on, and
    /// what it adds.
    pub mutation: Mutation,
    /// What the validating webhook requires of a training pod, and what it does when a pod
    /// falls short.
    pub validation: Validation,
    /// Whether a pod can ever run here.
    pub feasibility: Feasibility,
    /// The workloads whose pod templates are judged before their pods exist.
    pub workloads: Workloads,
    /// What a namespace's TollgateProfile may change beyond making the policy stricter.
    pub namespace_profiles: NamespaceProfiles,
    /// Named profiles, in order: the first whose `match` fits a pod is applied over the
    /// rest of the policy for that pod. None when left out.
    #[serde(default)]
    pub profiles: Vec<Profile>,
    /// What this policy was made of, and the namespaces' TollgateProfiles resolved over it:
    /// not written in a policy, set where the policy is composed (`objects`).
    #[serde(skip)]
    pub layers: Layers,
}

/// The bounds of the namespaces' TollgateProfiles.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceProfiles {
    /// The sections in which a TollgateProfile may also loosen the policy (turn validation
    /// off or to warn, remove a required request, widen the opt-out, turn a mutation step or
    /// a GPU class off or change what it injects); in the others it may only make the
    /// policy stricter or change defaults.
    pub may_loosen: Vec<Section>,
}

/// A section of the policy, as a profile writes it: `gpu`, `selection`, `optOut`,
/// `mutation`, `validation`, `workloads` or `feasibility`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Section {
    Gpu,
    Selection,
    OptOut,
    Mutation,
    Validation,
    Workloads,
    Feasibility,
}

impl Section {
    pub const ALL: [Section; 7] = [
        Section::Gpu,
        Section::Selection,
        Section::OptOut,
        Section::Mutation,
        Section::Validation,
        Section::Workloads,
        Section::Feasibility,
    ];

    /// The section's key, as the policy writes it.
    pub fn key(self) -> &'static str {
        match self {
            Section::Gpu => "gpu",
            Section::Selection => "selection",
            Section::OptOut => "optOut",
            Section::Mutation => "mutation",
            Section::Validation => "validation",
            Section::Workloads => "workloads",
            Section::Feasibility => "feasibility",
        }
    }
}

/// Where a policy in force came from, beyond the built-in text: the layers as written
/// (JSON), kept so that a TollgateProfile can be resolved over them and `tollgate policy`
/// can say where each value came from; and the namespaces' TollgateProfiles, resolved.
#[derive(Debug, Clone, Default)]
pub struct Layers {
    /// The policy file (`--policy`), as written; None: the built-in policy alone.
    pub file: Option<Written>,
    /// The cluster's TollgatePolicy `default`, its spec as written.
    pub cluster: Option<Written>,
    /// The TollgateProfile in force in each namespace, by namespace.
    pub namespaces: BTreeMap<String, NamespaceProfile>,
}

/// Two policies are equal when they judge alike: the namespaces' profiles count, where the
/// rest came from (which file, which TollgatePolicy wrote a value) does not.
impl PartialEq for Layers {
    fn eq(&self, other: &Layers) -> bool {
        self.namespaces == other.namespaces
    }
}

/// One layer as written: what errors and `tollgate policy` call it, and its JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub source: String,
    pub value: Value,
}

/// A namespace's TollgateProfile, resolved over each policy its pods may get.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceProfile {
    /// `NAMESPACE/NAME`, as kubectl names the object.
    pub object: String,
    /// Its spec as written.
    pub spec: Value,
    /// Over the base policy: named `NAMESPACE/NAME` in logs, metrics and annotations.
    pub over_base: Resolved,
    /// Over each of the cluster's profiles, by index (None: the profile cannot match a pod
    /// of this namespace); named `PROFILE+NAMESPACE/NAME`.
    pub over_profiles: Vec<Option<Resolved>>,
}

impl NamespaceProfile {
    /// Each policy the namespace's pods may get with it: over the base, then over each
    /// cluster profile that may match them.
    pub fn policies(&self) -> impl Iterator<Item = &Policy> {
        std::iter::once(self.over_base.policy.as_ref()).chain(
            self.over_profiles
                .iter()
                .flatten()
                .map(|r| r.policy.as_ref()),
        )
    }
}

/// A policy with the name logs, metrics and the applied annotation give it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub name: String,
    pub policy: Box<Policy>,
}

/// A part of the policy that applies "here, differently": for the pods its `match` fits,
/// the policy is this profile's sections merged over the base policy (every field of it,
/// defaults included). The merge rule: a map merges key by key, anything else (a list, a
/// string, a number, a boolean) replaces, and `null` puts the built-in default back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Profile {
    /// Named in logs, metrics, the applied annotation and `tollgate review`.
    pub name: String,
    /// Which pods the profile is for. Every criterion given must hold.
    #[serde(rename = "match", default)]
    pub matches: ProfileMatch,
    // The sections below are merged over the policy's (a map key by key, `null` puts the
    // built-in value back), unlike the list item they are in, which is written whole:
    // `x-tollgate-merged` tells `objects::crd` so (every field of theirs may be left out
    // or null). Their schema is the section's own type; serde keeps them as written.
    /// For the pods this profile fits: the policy's `gpu`, with what is written here
    /// merged over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<GpuPolicy>", extend("x-tollgate-merged" = true))]
    pub gpu: Option<Value>,
    /// For the pods this profile fits: the policy's `selection`, with what is written here
    /// merged over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Selection>", extend("x-tollgate-merged" = true))]
    pub selection: Option<Value>,
    /// For the pods this profile fits: the policy's `optOut`, with what is written here
    /// merged over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<OptOutRules>", extend("x-tollgate-merged" = true))]
    pub opt_out: Option<Value>,
    /// For the pods this profile fits: the policy's `mutation`, with what is written here
    /// merged over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Mutation>", extend("x-tollgate-merged" = true))]
    pub mutation: Option<Value>,
    /// For the pods this profile fits: the policy's `validation`, with what is written here
    /// merged over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Validation>", extend("x-tollgate-merged" = true))]
    pub validation: Option<Value>,
    /// For the pods this profile fits: the policy's `workloads`, with what is written here
    /// merged over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Workloads>", extend("x-tollgate-merged" = true))]
    pub workloads: Option<Value>,
    /// For the pods this profile fits: the policy's `feasibility`, with what is written here
    /// merged over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Feasibility>", extend("x-tollgate-merged" = true))]
    pub feasibility: Option<Value>,
    /// The whole policy for the pods this profile fits, merged and checked at load.
    #[serde(skip)]
    pub resolved: Option<Box<Policy>>,
}

impl Profile {
    /// The policy for the pods this profile fits (resolved when the policy was loaded).
    pub fn policy(&self) -> Option<&Policy> {
        self.resolved.as_deref()
    }
}

/// Which pods a profile is for: namespaces by name or glob, namespace labels and pod labels
/// (label selectors as Kubernetes writes them). An absent criterion holds for every pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ProfileMatch {
    /// Namespace names or globs (`*`, `?`); the profile fits a pod in any of them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<Glob>,
    /// The labels of the pod's namespace, from the cluster context.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// The pod's labels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

/// The name the metrics, logs and annotations give the policy without a profile.
pub const BASE_PROFILE: &str = "base";

/// What counts as a GPU, and what a pod that asks for one gets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuPolicy {
    /// The GPU classes, by name: what a pod of each asks for, and what it gets.
    pub classes: BTreeMap<String, GpuClass>,
    /// Treat every other extended resource (a name with a domain outside kubernetes.io) as
    /// a GPU of its own, as the built-in ExtendedResourceToleration admission plugin does:
    /// the toleration `{key: <resource>, operator: Exists, effect: NoSchedule}`, no driver.
    pub all_extended_resources: bool,
    /// Replaced by `classes`; a policy that sets it is refused with a message saying so.
    /// Not in the CRDs' schema: the apiserver refuses it as an unknown field.
    #[serde(default, skip_serializing)]
    #[schemars(skip)]
    pub resources: Option<Value>,
}

/// A kind of GPU: how a pod asks for it, and what tollgate gives a pod that does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GpuClass {
    /// Extended resources of this class: names (`nvidia.com/gpu`) or patterns
    /// (`nvidia.com/mig-*`). The implicit names `deviceclass.resource.kubernetes.io/<class>`
    /// of `deviceClasses` belong to the class too.
    pub resources: Vec<Glob>,
    /// DRA device classes (`resource.k8s.io/v1`) whose devices are GPUs of this class.
    pub device_classes: Vec<String>,
    /// The tolerations a pod of this class gets. Absent: for each resource it asks for,
    /// `{key: <resource>, operator: Exists, effect: NoSchedule}` (and none for DRA claims).
    pub tolerations: Option<Vec<Toleration>>,
    /// How the driver reaches the container: `runtime` (the device plugin, DRA driver or
    /// CDI injects it), `hostPath` (tollgate mounts `mounts` and sets `env`), or `auto`
    /// (hostPath only where the nodes that could run the pod show no driver-injecting
    /// runtime: none of `runtimeNodeLabels`; `driverFallback` where no such node is known).
    pub driver: Driver,
    /// With `driver: auto`: node labels that say the node's runtime injects the driver,
    /// each `key` (any value) or `key=value`.
    pub runtime_node_labels: Vec<String>,
    /// With `driver: auto`: `hostPath` or `runtime`, where no node that could run the pod
    /// is known (no cluster context, no nodes yet).
    pub driver_fallback: Option<Driver>,
    /// Resources of this class that are a share of a GPU handed out by a scheduler (HAMi's
    /// `nvidia.com/gpumem`), which no node advertises: they make a container one of this
    /// class, count as no GPU of their own (one where the container asks for no other GPU
    /// of the class), and feasibility asks for a node offering a GPU of the class instead.
    pub shares: Vec<Glob>,
    /// The resource whose GPUs `shares` and `fractions` are parts of (`nvidia.com/gpu`):
    /// feasibility asks for a node offering one, and `driver: auto` reads such nodes.
    pub shared_from: Option<String>,
    /// Pods asking for a fraction of a GPU of this class by annotation (KAI Scheduler's
    /// `gpu-fraction`), which its scheduler hands out.
    pub fractions: Option<Fractions>,
    /// With `driver: hostPath`: the node's directories, mounted read-only into each
    /// container that uses a GPU of this class.
    pub mounts: Vec<HostMount>,
    /// With `driver: hostPath`: environment for those containers.
    pub env: Vec<EnvEntry>,
    /// Default limits per GPU of this class, over `mutation.defaultResources.perGpu` key by
    /// key. A MIG slice counts as one GPU; a DRA request as its device count.
    pub per_gpu: BTreeMap<String, Quantity>,
}

impl GpuClass {
    /// Whether this class covers the extended resource `name`.
    pub fn covers_resource(&self, name: &str) -> bool {
        self.resources.iter().any(|g| g.matches(name))
            || self.is_share(name)
            || name
                .strip_prefix(quantity::IMPLICIT_DRA_PREFIX)
                .is_some_and(|dc| self.device_classes.iter().any(|c| c == dc))
    }

    /// Whether `name` is a share of a GPU of this class (`shares`), not a GPU of its own.
    pub fn is_share(&self, name: &str) -> bool {
        self.shares.iter().any(|g| g.matches(name))
    }

    /// Whether this class covers the DRA device class `name`.
    pub fn covers_device_class(&self, name: &str) -> bool {
        self.device_classes.iter().any(|c| c == name)
    }
}

/// How the GPU driver reaches a container: `runtime`, `hostPath` or `auto`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Driver {
    /// The runtime puts the driver in the container: nothing to mount.
    #[default]
    Runtime,
    /// tollgate mounts the node's driver directories (hostPath volumes).
    HostPath,
    /// Decided per pod from the nodes that could run it: `hostPath` unless they all show a
    /// driver-injecting runtime (`runtimeNodeLabels`), `driverFallback` where none is known.
    Auto,
}

impl Driver {
    /// As the policy file writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Driver::Runtime => "runtime",
            Driver::HostPath => "hostPath",
            Driver::Auto => "auto",
        }
    }
}

/// A fraction of a GPU asked for by annotation, for a scheduler that hands fractions out
/// (KAI Scheduler: `pkg/common/constants`'s `gpu-fraction`, `gpu-memory`,
/// `gpu-fraction-num-devices`, `gpu-fraction-container-name`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Fractions {
    /// The pod's `spec.schedulerName` must be one of these.
    pub scheduler_names: Vec<String>,
    /// A pod annotation of these (any value) asks for a fraction.
    pub annotations: Vec<String>,
    /// The annotation naming the container that gets the fraction (else the first
    /// container).
    pub container_annotation: String,
    /// The annotation with the number of devices the fraction is of (else one).
    pub devices_annotation: String,
}

/// Which pods are training pods: any one criterion makes a pod one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Selection {
    /// A pod carrying any of these label keys (any value) is a training pod.
    pub workload_labels: Vec<String>,
    /// A pod with this annotation set to "true" is a training pod.
    pub training_annotation: String,
    /// A pod that requests any GPU resource is a training pod.
    pub gpu_pods: bool,
}

/// The opt-out: a pod annotation that asks tollgate to leave a pod alone, honoured only
/// where and for whom this section says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OptOutRules {
    /// The pod annotation that asks to skip tollgate (value "true").
    pub annotation: String,
    /// Namespaces (names or globs with `*` and `?`) where the opt-out is honoured.
    pub namespaces: Vec<Glob>,
    /// Requesting users (globs) whose opt-out is honoured. With `groups`, empty means anyone.
    pub users: Vec<Glob>,
    /// Requesting groups (globs) whose opt-out is honoured. With `users`, empty means anyone.
    pub groups: Vec<Glob>,
    /// The controllers' service accounts (globs over the requesting user): an object they
    /// request was made from a template of a workload, so its opt-out was judged there. It
    /// is honoured only when the template carried tollgate's approval, `users` and
    /// `groups` notwithstanding.
    pub controllers: Vec<Glob>,
    /// The annotation with which the mutating webhook approves the opt-out of a workload's
    /// pod template: its value is the user whose opt-out was honoured. Only tollgate sets
    /// it; what a user writes there is removed, or refused.
    pub approval_annotation: String,
}

/// Workloads: the objects whose pod templates controllers turn into pods. Their templates
/// are judged when the workload is created or its templates change, as the pods they
/// will make would be.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Workloads {
    /// false: workloads are allowed unchanged, and only their pods are judged.
    pub enabled: bool,
    /// The kinds, with where their pod templates are and the labels their controllers add
    /// to the pods. Writing `kinds` replaces the whole list (a list replaces).
    pub kinds: Vec<WorkloadKind>,
}

/// One kind of workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadKind {
    /// The API group (`""` is core), version and kind, as the review's `request.kind`.
    #[serde(default)]
    pub group: String,
    /// The API version (`v1`, `v1alpha1`).
    pub version: String,
    /// The kind (`Job`, `PyTorchJob`).
    pub kind: String,
    /// Where the pod templates are.
    pub templates: Vec<TemplateSpec>,
    /// What the template paths are read in: absent, the workload itself; else an object
    /// the workload names, as the workload changes it (a TrainJob's runtime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<TemplatesFrom>,
    /// Labels the controller adds to every pod (values may use `{name}`, the workload's
    /// name, `{template}` and `{template-lower}`, the template's name as found and in
    /// lower case).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Whether its pods must run together (a gang: a PyTorchJob's replicas), so that the
    /// quota must hold them all at once; otherwise they may run in turns (a Job's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub together: bool,
    /// How many copies of its pods run at once, each on its own, as a path in the workload
    /// (an OptimizationJob's `spec.parallelTrials`; 1 where absent): the quota must hold one
    /// copy (together, if `together`); more copies than it holds at once run fewer at a
    /// time, which is only said.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub copies: String,
}

/// Where one kind of template is, and how messages name it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateSpec {
    /// A path (see `template_path`): keys, `*` for every member of a map, `key[*]` for
    /// every element of a list.
    pub path: String,
    /// How a message names the template: this word, then the name the path's `*` or `[*]`
    /// found (`replica Worker`), or `name` for a path without one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub noun: String,
    /// The template's name where the path does not fan out (`leader`, `head`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Labels the controller adds to the pods of this template only, over the kind's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// How many pods the template makes: the product of these numbers, each a path from
    /// the template (`..` its parent: `../replicas`), 1 where absent. None: one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub count: Vec<String>,
    /// Taken off that product (a LeaderWorkerSet's `size` counts its leader too).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub count_minus: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Whether a pod can ever run here (the quota, the nodes, the DeviceClasses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Feasibility {
    /// `warn` (the user reads it at `kubectl apply`), `enforce` (refused) or `off`.
    pub mode: FeasibilityMode,
    /// Whether nodes may be added where none offers what a pod asks for (a GPU pool that
    /// scales from zero has no Node until a pod asks): `detect` (from the cluster: the
    /// Cluster Autoscaler's status ConfigMap, Karpenter's NodePools), `none` (the nodes
    /// there are are all there will be) or `present` (an autoscaler tollgate cannot see
    /// may add any node). The cluster's fact: a TollgateProfile may not change it.
    #[serde(default)]
    pub autoscaling: NodeAutoscaling,
}

/// Whether the cluster may add nodes, as feasibility takes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum NodeAutoscaling {
    /// As the cluster context shows it: the Cluster Autoscaler's status ConfigMap, or a
    /// Karpenter NodePool the pod could land on.
    #[default]
    Detect,
    /// No autoscaler: no node offering what a pod asks for is "can never run".
    None,
    /// An autoscaler tollgate cannot see may add any node: no node offering it now is a
    /// warning, never a refusal.
    Present,
}

impl NodeAutoscaling {
    /// As the policy file writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeAutoscaling::Detect => "detect",
            NodeAutoscaling::None => "none",
            NodeAutoscaling::Present => "present",
        }
    }
}

/// What a pod that can never run here gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FeasibilityMode {
    /// Allowed, with a warning that says why it cannot run.
    Warn,
    /// Refused, saying why.
    Enforce,
    /// Not checked.
    Off,
}

impl FeasibilityMode {
    /// As the policy file writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            FeasibilityMode::Warn => "warn",
            FeasibilityMode::Enforce => "enforce",
            FeasibilityMode::Off => "off",
        }
    }
}

/// Where a workload kind's templates are read, when not in the workload itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplatesFrom {
    /// A Kubeflow Trainer TrainJob: the TrainingRuntime or ClusterTrainingRuntime its
    /// `spec.runtimeRef` names, with the TrainJob's trainer and overrides applied as the
    /// Trainer controller applies them (see `trainjob`).
    pub training_runtime: TrainingRuntimeSource,
}

/// How a TrainJob changes its runtime's pods, where Trainer versions differ.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrainingRuntimeSource {
    /// What the TrainJob's `spec.trainer.resourcesPerNode` does to the runtime's `node`
    /// container: `merge` (Trainer v2.3 on) or `replace` (v2.0 to v2.2).
    #[serde(default)]
    pub resources_per_node: ResourcesPerNode,
    /// Where the workload holds the TrainJob it makes, as a path to an object with the
    /// TrainJob's `metadata` and `spec` (an OptimizationJob's `spec.trainJobTemplate`, each
    /// trial one TrainJob); empty: the workload is the TrainJob.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub train_job_template: String,
}

/// What `spec.trainer.resourcesPerNode` does to the runtime's `node` container.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ResourcesPerNode {
    /// Merged into the runtime's requests and limits, key by key (Trainer v2.3 on).
    #[default]
    Merge,
    /// Replaces the runtime's resources (Trainer v2.0 to v2.2).
    Replace,
}

impl WorkloadKind {
    /// The word messages use for the workload: its kind in lower case (`pytorchjob`), with
    /// its group where a built-in kind has the same name (`job.batch.volcano.sh`).
    pub fn noun(&self) -> String {
        crate::names::kind_noun(&self.group, &self.kind)
    }
}

impl Workloads {
    /// The kind a review's `request.kind` names, if the policy lists it.
    pub fn kind(&self, group: &str, version: &str, kind: &str) -> Option<&WorkloadKind> {
        self.kinds
            .iter()
            .find(|k| k.kind == kind && k.group == group && k.version == version)
    }
}

/// The mutating webhook's steps, each on or off, and what each adds to a training pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mutation {
    /// Which operations are mutated.
    pub operations: Vec<Operation>,
    /// Annotation recording the steps applied to a pod.
    pub applied_annotation: String,
    /// The step that gives a GPU pod the tolerations of its GPU classes.
    pub gpu_tolerations: GpuTolerations,
    /// The step that mounts the node's driver directories (GPU classes with
    /// `driver: hostPath`).
    pub driver_mounts: DriverMounts,
    /// The step that injects a metrics sidecar container.
    pub metrics_sidecar: MetricsSidecar,
    /// The step that gives containers without limits default ones.
    pub default_resources: DefaultResources,
}

/// The mutation steps, each named once: its variant, its name in the applied annotation
/// (and the audit's rule), and its section under `mutation` in the policy file. `ALL`
/// comes from the same list, so it cannot leave one out.
macro_rules! steps {
    ($($(#[$doc:meta])* $step:ident = $name:literal, $field:literal;)+) => {
        /// One mutation step. This is the steps' one list: the engine runs them in its
        /// order (`mutate`), and every other place that must answer each step (the
        /// TollgateProfile bounds, the export, the policy's checks, the policy's switch
        /// for it, [`Mutation::enabled`]) matches on it exhaustively, so a new step does
        /// not compile until each does.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Step {
            $($(#[$doc])* $step,)+
        }

        impl Step {
            /// Every step, in the order they run.
            pub const ALL: [Step; [$(Step::$step),+].len()] = [$(Step::$step),+];

            /// As the applied annotation and the audit name it (`driver-mounts`).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Step::$step => $name,)+
                }
            }

            /// Its section under `mutation` in the policy file (`driverMounts`).
            pub fn field(self) -> &'static str {
                match self {
                    $(Step::$step => $field,)+
                }
            }
        }
    };
}

steps! {
    /// The GPU classes' tolerations on a GPU pod.
    Tolerations = "tolerations", "gpuTolerations";
    /// The node's driver directories mounted into the containers that use a GPU.
    DriverMounts = "driver-mounts", "driverMounts";
    /// A metrics sidecar injected.
    MetricsSidecar = "metrics-sidecar", "metricsSidecar";
    /// Default limits (and what the apiserver defaults requests from) where none are set.
    DefaultResources = "default-resources", "defaultResources";
}

impl Step {
    /// The step named `name` in the applied annotation.
    pub fn from_name(name: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl Mutation {
    /// Whether the policy runs `step`.
    pub fn enabled(&self, step: Step) -> bool {
        match step {
            Step::Tolerations => self.gpu_tolerations.enabled,
            Step::DriverMounts => self.driver_mounts.enabled,
            Step::MetricsSidecar => self.metrics_sidecar.enabled,
            Step::DefaultResources => self.default_resources.enabled,
        }
    }
}

/// An admission operation: `CREATE` or `UPDATE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Operation {
    #[serde(rename = "CREATE")]
    Create,
    #[serde(rename = "UPDATE")]
    Update,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuTolerations {
    /// Whether GPU pods get their classes' tolerations.
    pub enabled: bool,
    /// Replaced by `gpu.classes.<class>.tolerations`; refused with a message saying so.
    /// Not in the CRDs' schema: the apiserver refuses it as an unknown field.
    #[serde(default, skip_serializing)]
    #[schemars(skip)]
    pub effect: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DriverMounts {
    /// Whether the driver directories are mounted.
    pub enabled: bool,
    /// Every volume tollgate adds has a name starting with this prefix.
    pub volume_prefix: String,
    /// Replaced by `gpu.classes.<class>.mounts` and `.env`; refused with a message.
    /// Not in the CRDs' schema: the apiserver refuses it as an unknown field.
    #[serde(default, skip_serializing)]
    #[schemars(skip)]
    pub resources: Option<Value>,
}

/// A directory of the node, mounted read-only into a GPU container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostMount {
    /// Volume name; must start with the volume prefix.
    pub name: String,
    /// Directory on the node.
    pub host_path: String,
    /// hostPath type, e.g. Directory or DirectoryOrCreate (default Directory).
    #[serde(default = "default_host_path_type")]
    pub r#type: String,
    /// Where it appears in the container (always read-only).
    pub mount_path: String,
}

fn default_host_path_type() -> String {
    "Directory".into()
}

/// An environment variable set in a GPU container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvEntry {
    /// The variable's name.
    pub name: String,
    /// Its value.
    pub value: String,
    /// What to do when the container already sets this variable (default keep).
    #[serde(default)]
    pub if_present: IfPresent,
    /// Separator for append and prepend (default `:`).
    #[serde(default = "default_separator")]
    pub separator: String,
}

fn default_separator() -> String {
    ":".into()
}

/// What to do with a variable the container already sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum IfPresent {
    /// Leave the user's value alone.
    #[default]
    Keep,
    /// Add ours after the user's value, separated by `separator`.
    Append,
    /// Add ours before the user's value, separated by `separator`.
    Prepend,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricsSidecar {
    /// Whether training pods get the sidecar.
    pub enabled: bool,
    /// `native`: an init container with restartPolicy Always (Kubernetes 1.29+), which lets
    /// a Job's pod complete. `classic`: a regular container, for older clusters.
    pub mode: SidecarMode,
    /// The container to inject (a core/v1 Container).
    pub container: Container,
    /// Pod annotations to add (existing values are kept).
    pub annotations: BTreeMap<String, String>,
}

/// How the sidecar is injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SidecarMode {
    /// An init container with restartPolicy Always (Kubernetes 1.29+).
    Native,
    /// A regular container.
    Classic,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefaultResources {
    /// Whether containers without limits get the defaults.
    pub enabled: bool,
    /// Default limits (cpu, memory) for containers that set none.
    pub limits: BTreeMap<String, Quantity>,
    /// Defaults per GPU requested by the container (cpu, memory), used instead of `limits`
    /// for GPU containers: 8 GPUs with `memory: 32Gi` gives a 256Gi limit.
    pub per_gpu: BTreeMap<String, Quantity>,
}

/// What the validating webhook requires of a training pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Validation {
    /// Whether training pods are validated at all.
    pub enabled: bool,
    /// enforce (deny), warn (allow with warnings) or audit (allow, audit annotation and log).
    pub mode: Mode,
    /// Operations judged; the others are allowed.
    pub operations: Vec<Operation>,
    /// Resources every container must request.
    pub required_requests: Vec<String>,
}

/// What the validating webhook does with a pod that falls short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Mode {
    /// Refused.
    Enforce,
    /// Allowed, with warnings the user reads at `kubectl apply`.
    Warn,
    /// Allowed, with an audit annotation and a log line.
    Audit,
}

impl Mode {
    /// As the policy file (and the audit's findings) write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Warn => "warn",
            Mode::Audit => "audit",
        }
    }
}

impl Policy {
    /// Whether a profile selects pods by their labels (which the validation parse then
    /// reads).
    pub fn selects_pods_by_labels(&self) -> bool {
        self.profiles
            .iter()
            .any(|p| p.matches.pod_selector.is_some())
    }

    /// The first profile that matches on namespace labels, which only a cluster context
    /// (or `tollgate review`'s input) knows.
    pub fn needs_namespace_labels(&self) -> Option<&str> {
        self.profiles
            .iter()
            .find(|p| p.matches.namespace_selector.is_some())
            .map(|p| p.name.as_str())
    }
}

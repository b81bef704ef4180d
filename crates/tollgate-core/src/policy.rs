//! The policy: what tollgate injects and enforces, as data.
//!
//! Loaded from YAML (or JSON) text; no I/O here. Every section has a default so that a
//! platform team can write only what differs, but unknown fields are errors: a typo in a
//! policy must never silently turn a rule off.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::glob::Glob;
use crate::quantity;

/// The shipped policy, `policies/default.yaml`, compiled in: what `serve` and `review` run
/// without `--policy`, so that the binary (and a container image) needs no file to start.
pub const BUILTIN_TEXT: &str = include_str!("../../../policies/default.yaml");

/// How errors and logs name the built-in policy.
pub const BUILTIN_SOURCE: &str = "built-in policy (policies/default.yaml)";

/// Why a policy could not be loaded: where, which field, and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{file}: not valid YAML: {message}")]
    Syntax { file: String, message: String },
    #[error("{file}: field `{field}`: {message}")]
    Field {
        file: String,
        field: String,
        message: String,
    },
}

impl PolicyError {
    /// The same error with `profiles[N]` in its field written `profiles[NAME]` when the
    /// profile has a name: what a reader looks for in the file.
    fn named(self, written: &Value) -> PolicyError {
        let PolicyError::Field {
            file,
            field,
            message,
        } = self
        else {
            return self;
        };
        let renamed = field.strip_prefix("profiles[").and_then(|rest| {
            let (index, tail) = rest.split_once(']')?;
            let i: usize = index.parse().ok()?;
            let name = written.pointer(&format!("/profiles/{i}/name"))?.as_str()?;
            Some(format!("profiles[{name}]{tail}"))
        });
        PolicyError::Field {
            file,
            field: renamed.unwrap_or(field),
            message,
        }
    }

    /// The same error, for a field inside `at` (a profile).
    fn within(self, at: &str) -> PolicyError {
        match self {
            PolicyError::Field {
                file,
                field,
                message,
            } => PolicyError::Field {
                file,
                field: format!("{at}.{field}"),
                message,
            },
            other => other,
        }
    }

    fn field(source: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        PolicyError::Field {
            file: source.to_owned(),
            field: field.into(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Policy {
    /// Which extended resources count as GPUs.
    pub gpu: GpuPolicy,
    /// Which pods are training pods (the ones that get mutated).
    pub selection: Selection,
    /// The opt-out annotation and where it is honoured.
    pub opt_out: OptOut,
    pub mutation: Mutation,
    pub validation: Validation,
    /// Named profiles, in order: the first whose `match` fits a pod is applied over the
    /// rest of the policy for that pod (see [`Profile`]).
    pub profiles: Vec<Profile>,
}

/// A part of the policy that applies "here, differently": for the pods its `match` fits,
/// the policy is this profile's sections merged over the base policy (every field of it,
/// defaults included). The merge rule: a map merges key by key, anything else (a list, a
/// string, a number, a boolean) replaces, and `null` puts the built-in default back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Profile {
    /// Named in logs, metrics, the applied annotation and `tollgate review`.
    pub name: String,
    /// Which pods the profile is for. Every criterion given must hold.
    #[serde(rename = "match", default)]
    pub matches: ProfileMatch,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opt_out: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutation: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<Value>,
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GpuPolicy {
    /// The GPU classes, by name: what a pod of each asks for, and what it gets.
    pub classes: BTreeMap<String, GpuClass>,
    /// Treat every other extended resource (a name with a domain outside kubernetes.io) as
    /// a GPU of its own, as the built-in ExtendedResourceToleration admission plugin does:
    /// the toleration `{key: <resource>, operator: Exists, effect: NoSchedule}`, no driver.
    pub all_extended_resources: bool,
    /// Replaced by `classes`; a policy that sets it is refused with a message saying so.
    #[serde(skip_serializing)]
    pub resources: Option<Value>,
}

impl Default for GpuPolicy {
    fn default() -> Self {
        let nvidia_toleration = || {
            vec![Toleration {
                key: Some("nvidia.com/gpu".into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }]
        };
        let mut classes = BTreeMap::new();
        classes.insert(
            "nvidia".to_owned(),
            GpuClass {
                resources: vec!["nvidia.com/gpu".into(), "nvidia.com/mig-*".into()],
                tolerations: Some(nvidia_toleration()),
                driver: Driver::HostPath,
                mounts: vec![HostMount {
                    name: "tollgate-nvidia-driver".into(),
                    host_path: "/usr/local/nvidia".into(),
                    r#type: "Directory".into(),
                    mount_path: "/usr/local/nvidia".into(),
                }],
                env: vec![EnvEntry {
                    name: "LD_LIBRARY_PATH".into(),
                    value: "/usr/local/nvidia/lib64".into(),
                    if_present: IfPresent::Append,
                    separator: ":".into(),
                }],
                ..Default::default()
            },
        );
        classes.insert(
            "nvidia-dra".to_owned(),
            GpuClass {
                device_classes: vec!["gpu.nvidia.com".into(), "mig.nvidia.com".into()],
                tolerations: Some(nvidia_toleration()),
                ..Default::default()
            },
        );
        classes.insert(
            "amd".to_owned(),
            GpuClass {
                resources: vec!["amd.com/gpu".into()],
                ..Default::default()
            },
        );
        classes.insert(
            "intel".to_owned(),
            GpuClass {
                resources: vec!["gpu.intel.com/i915".into(), "gpu.intel.com/xe".into()],
                ..Default::default()
            },
        );
        GpuPolicy {
            classes,
            all_extended_resources: false,
            resources: None,
        }
    }
}

/// A kind of GPU: how a pod asks for it, and what tollgate gives a pod that does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// CDI injects it) or `hostPath` (tollgate mounts `mounts` and sets `env`).
    pub driver: Driver,
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
            || name
                .strip_prefix(quantity::IMPLICIT_DRA_PREFIX)
                .is_some_and(|dc| self.device_classes.iter().any(|c| c == dc))
    }

    /// Whether this class covers the DRA device class `name`.
    pub fn covers_device_class(&self, name: &str) -> bool {
        self.device_classes.iter().any(|c| c == name)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Driver {
    /// The runtime puts the driver in the container: nothing to mount.
    #[default]
    Runtime,
    /// tollgate mounts the node's driver directories (hostPath volumes).
    HostPath,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Selection {
    /// A pod carrying any of these label keys (any value) is a training pod.
    pub workload_labels: Vec<String>,
    /// A pod with this annotation set to "true" is a training pod.
    pub training_annotation: String,
    /// A pod that requests any GPU resource is a training pod.
    pub gpu_pods: bool,
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            workload_labels: vec![
                "training.kubeflow.org/job-name".into(),
                "volcano.sh/job-name".into(),
                "jobset.sigs.k8s.io/jobset-name".into(),
                "batch.kubernetes.io/job-name".into(),
                "leaderworkerset.sigs.k8s.io/name".into(),
                "ray.io/node-type".into(),
            ],
            training_annotation: "tollgate.dev/training".into(),
            gpu_pods: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OptOut {
    /// The pod annotation that asks to skip tollgate (value "true").
    pub annotation: String,
    /// Namespaces (names or globs with `*` and `?`) where the opt-out is honoured.
    pub namespaces: Vec<Glob>,
    /// Requesting users (globs) whose opt-out is honoured. With `groups`, empty means anyone.
    pub users: Vec<Glob>,
    /// Requesting groups (globs) whose opt-out is honoured. With `users`, empty means anyone.
    pub groups: Vec<Glob>,
}

impl Default for OptOut {
    fn default() -> Self {
        OptOut {
            annotation: "tollgate.dev/opt-out".into(),
            namespaces: vec!["*".into()],
            users: vec![],
            groups: vec!["system:masters".into()],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Mutation {
    /// Which operations are mutated.
    pub operations: Vec<Operation>,
    /// Annotation recording the steps applied to a pod.
    pub applied_annotation: String,
    pub gpu_tolerations: GpuTolerations,
    pub driver_mounts: DriverMounts,
    pub metrics_sidecar: MetricsSidecar,
    pub default_resources: DefaultResources,
}

impl Default for Mutation {
    fn default() -> Self {
        Mutation {
            operations: vec![Operation::Create],
            applied_annotation: "tollgate.dev/applied".into(),
            gpu_tolerations: GpuTolerations::default(),
            driver_mounts: DriverMounts::default(),
            metrics_sidecar: MetricsSidecar::default(),
            default_resources: DefaultResources::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operation {
    #[serde(rename = "CREATE")]
    Create,
    #[serde(rename = "UPDATE")]
    Update,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GpuTolerations {
    pub enabled: bool,
    /// Replaced by `gpu.classes.<class>.tolerations`; refused with a message saying so.
    #[serde(skip_serializing)]
    pub effect: Option<Value>,
}

impl Default for GpuTolerations {
    fn default() -> Self {
        GpuTolerations {
            enabled: true,
            effect: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DriverMounts {
    pub enabled: bool,
    /// Every volume tollgate adds has a name starting with this prefix.
    pub volume_prefix: String,
    /// Replaced by `gpu.classes.<class>.mounts` and `.env`; refused with a message.
    #[serde(skip_serializing)]
    pub resources: Option<Value>,
}

impl Default for DriverMounts {
    fn default() -> Self {
        DriverMounts {
            enabled: true,
            volume_prefix: "tollgate-".into(),
            resources: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostMount {
    /// Volume name; must start with the volume prefix.
    pub name: String,
    /// Directory on the node.
    pub host_path: String,
    /// hostPath type, e.g. Directory or DirectoryOrCreate.
    #[serde(default = "default_host_path_type")]
    pub r#type: String,
    /// Where it appears in the container (always read-only).
    pub mount_path: String,
}

fn default_host_path_type() -> String {
    "Directory".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvEntry {
    pub name: String,
    pub value: String,
    /// What to do when the container already sets this variable.
    #[serde(default)]
    pub if_present: IfPresent,
    /// Separator for append and prepend.
    #[serde(default = "default_separator")]
    pub separator: String,
}

fn default_separator() -> String {
    ":".into()
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MetricsSidecar {
    pub enabled: bool,
    /// `native`: an init container with restartPolicy Always (Kubernetes 1.29+), which lets
    /// a Job's pod complete. `classic`: a regular container, for older clusters.
    pub mode: SidecarMode,
    /// The container to inject (a core/v1 Container).
    pub container: Container,
    /// Pod annotations to add (existing values are kept).
    pub annotations: BTreeMap<String, String>,
}

impl Default for MetricsSidecar {
    fn default() -> Self {
        let container: Container = serde_json::from_value(serde_json::json!({
            "name": "tollgate-metrics",
            "image": "quay.io/prometheus/statsd-exporter:v0.28.0",
            "args": ["--web.listen-address=:9102", "--statsd.listen-udp=:9125"],
            "ports": [
                {"name": "tg-metrics", "containerPort": 9102, "protocol": "TCP"},
                {"name": "tg-statsd", "containerPort": 9125, "protocol": "UDP"}
            ],
            "resources": {
                "requests": {"cpu": "50m", "memory": "64Mi"},
                "limits": {"cpu": "200m", "memory": "128Mi"}
            },
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "runAsNonRoot": true,
                "runAsUser": 65534,
                "capabilities": {"drop": ["ALL"]}
            }
        }))
        .expect("built-in sidecar template is a valid Container");
        let mut annotations = BTreeMap::new();
        annotations.insert("prometheus.io/scrape".into(), "true".into());
        annotations.insert("prometheus.io/port".into(), "9102".into());
        MetricsSidecar {
            enabled: true,
            mode: SidecarMode::Native,
            container,
            annotations,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SidecarMode {
    #[default]
    Native,
    Classic,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DefaultResources {
    pub enabled: bool,
    /// Default limits (cpu, memory) for containers that set none.
    pub limits: BTreeMap<String, Quantity>,
    /// Defaults per GPU requested by the container (cpu, memory), used instead of `limits`
    /// for GPU containers: 8 GPUs with `memory: 32Gi` gives a 256Gi limit.
    pub per_gpu: BTreeMap<String, Quantity>,
}

impl Default for DefaultResources {
    fn default() -> Self {
        let mut limits = BTreeMap::new();
        limits.insert("cpu".to_owned(), Quantity("2".into()));
        limits.insert("memory".to_owned(), Quantity("4Gi".into()));
        DefaultResources {
            enabled: true,
            limits,
            per_gpu: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Validation {
    pub enabled: bool,
    /// enforce (deny), warn (allow with warnings) or audit (allow, audit annotation and log).
    pub mode: Mode,
    /// Operations judged; the others are allowed.
    pub operations: Vec<Operation>,
    /// Resources every container must request.
    pub required_requests: Vec<String>,
}

impl Default for Validation {
    fn default() -> Self {
        Validation {
            enabled: true,
            mode: Mode::Enforce,
            operations: vec![Operation::Create],
            required_requests: vec!["cpu".into(), "memory".into()],
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Mode {
    #[default]
    Enforce,
    Warn,
    Audit,
}

impl Policy {
    /// The built-in policy ([`BUILTIN_TEXT`]).
    pub fn builtin() -> Policy {
        // A test loads the same text; a shipped policy that fails to load fails the build's
        // tests, never a user.
        Policy::from_text(BUILTIN_SOURCE, BUILTIN_TEXT).unwrap_or_default()
    }

    /// Parses and checks a policy. `source` names the text in errors (usually the file path).
    pub fn from_text(source: &str, text: &str) -> Result<Policy, PolicyError> {
        let value: Value = if text.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            serde_saphyr::from_str(text).map_err(|e| PolicyError::Syntax {
                file: source.to_owned(),
                message: e.to_string(),
            })?
        };
        let value = match value {
            Value::Null => Value::Object(Default::default()),
            v => v,
        };
        let mut policy = Policy::from_value(source, &value).map_err(|e| e.named(&value))?;
        policy.resolve_profiles(source, &value)?;
        Ok(policy)
    }

    /// A policy from its JSON form, checked; profiles as written, not yet resolved.
    fn from_value(source: &str, value: &Value) -> Result<Policy, PolicyError> {
        let policy: Policy = serde_path_to_error::deserialize(value).map_err(|e| {
            let field = e.path().to_string();
            PolicyError::field(source, field, e.into_inner().to_string())
        })?;
        check_written(source, value)?;
        policy.check(source)?;
        Ok(policy)
    }

    /// Merges each profile over the base and checks the result, so that a profile that
    /// makes anything invalid refuses the whole policy at load, never a review.
    fn resolve_profiles(&mut self, source: &str, written: &Value) -> Result<(), PolicyError> {
        if self.profiles.is_empty() {
            return Ok(());
        }
        let mut base = self.clone();
        base.profiles.clear();
        // Every field, defaults included: a profile's map merges into what is in force,
        // not into what the file happened to write.
        let base = serde_json::to_value(&base)
            .map_err(|e| PolicyError::field(source, "profiles", format!("cannot merge: {e}")))?;
        let mut names: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, p) in self.profiles.iter().enumerate() {
            let here = format!("profiles[{i}]");
            if let Err(m) = check_dns_label(&p.name) {
                return Err(PolicyError::field(source, format!("{here}.name"), m));
            }
            if p.name == BASE_PROFILE {
                return Err(PolicyError::field(
                    source,
                    format!("{here}.name"),
                    format!(
                        "{BASE_PROFILE:?} names the policy without a profile; choose another name"
                    ),
                ));
            }
            if let Some(j) = names.insert(&p.name, i) {
                return Err(PolicyError::field(
                    source,
                    format!("{here}.name"),
                    format!(
                        "profile {:?} is also profiles[{j}]: names must be unique",
                        p.name
                    ),
                ));
            }
            let at = format!("profiles[{}]", p.name);
            let written_match = written.pointer(&format!("/profiles/{i}/match"));
            check_match(source, &at, &p.matches, written_match)?;
        }
        for (i, p) in self.profiles.iter_mut().enumerate() {
            let at = format!("profiles[{}]", p.name);
            let mut merged = base.clone();
            if let Some(Value::Object(sections)) = written.pointer(&format!("/profiles/{i}")) {
                for (key, overrides) in sections {
                    if key != "name" && key != "match" {
                        merge_field(&mut merged, key, overrides);
                    }
                }
            }
            let resolved = Policy::from_value(source, &merged).map_err(|e| e.within(&at))?;
            p.resolved = Some(Box::new(resolved));
        }
        Ok(())
    }

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

    /// Semantic checks serde cannot express.
    fn check(&self, source: &str) -> Result<(), PolicyError> {
        let err = |field: &str, msg: String| Err(PolicyError::field(source, field, msg));
        self.check_replaced(source)?;
        for (name, field) in [
            (
                &self.selection.training_annotation,
                "selection.trainingAnnotation",
            ),
            (&self.opt_out.annotation, "optOut.annotation"),
            (
                &self.mutation.applied_annotation,
                "mutation.appliedAnnotation",
            ),
        ] {
            if let Err(m) = check_qualified_name(name) {
                return err(field, m);
            }
        }
        for (i, l) in self.selection.workload_labels.iter().enumerate() {
            if let Err(m) = check_qualified_name(l) {
                return err(&format!("selection.workloadLabels[{i}]"), m);
            }
        }
        for (list, field) in [
            (&self.opt_out.namespaces, "optOut.namespaces"),
            (&self.opt_out.users, "optOut.users"),
            (&self.opt_out.groups, "optOut.groups"),
        ] {
            for (i, p) in list.iter().enumerate() {
                if p.as_str().is_empty() {
                    return err(&format!("{field}[{i}]"), "empty pattern".into());
                }
            }
        }
        self.check_gpu_classes(source)?;
        self.check_sidecar(source)?;
        let dr = &self.mutation.default_resources;
        check_defaults(source, "mutation.defaultResources.limits", &dr.limits)?;
        check_defaults(source, "mutation.defaultResources.perGpu", &dr.per_gpu)?;
        for (i, r) in self.validation.required_requests.iter().enumerate() {
            if r.is_empty() || r.contains(char::is_whitespace) {
                return err(
                    &format!("validation.requiredRequests[{i}]"),
                    format!("{r:?} is not a resource name"),
                );
            }
        }
        Ok(())
    }

    /// Fields of earlier versions whose meaning moved into the GPU classes: refused with
    /// where it went, rather than silently ignored or half honoured.
    fn check_replaced(&self, source: &str) -> Result<(), PolicyError> {
        let replaced = [
            (
                self.gpu.resources.is_some(),
                "gpu.resources",
                "replaced by gpu.classes: list each resource under its class, e.g. \
                 gpu.classes.nvidia.resources (see policies/default.yaml)",
            ),
            (
                self.mutation.gpu_tolerations.effect.is_some(),
                "mutation.gpuTolerations.effect",
                "replaced by gpu.classes.<class>.tolerations, a list of {key, operator, \
                 value, effect} (see policies/default.yaml)",
            ),
            (
                self.mutation.driver_mounts.resources.is_some(),
                "mutation.driverMounts.resources",
                "replaced by gpu.classes.<class>.mounts and .env, with driver: hostPath \
                 (see policies/default.yaml)",
            ),
        ];
        match replaced.into_iter().find(|(set, _, _)| *set) {
            Some((_, field, msg)) => Err(PolicyError::field(source, field, msg)),
            None => Ok(()),
        }
    }

    fn check_gpu_classes(&self, source: &str) -> Result<(), PolicyError> {
        let dm = &self.mutation.driver_mounts;
        let err = |field: String, msg: String| Err(PolicyError::field(source, field, msg));
        if dm.enabled && dm.volume_prefix.is_empty() {
            return err(
                "mutation.driverMounts.volumePrefix".into(),
                "must not be empty: it is how tollgate tells its volumes from the user's".into(),
            );
        }
        let mut volumes: BTreeMap<&str, &HostMount> = BTreeMap::new();
        let mut resources: BTreeMap<&str, &str> = BTreeMap::new();
        let mut device_classes: BTreeMap<&str, &str> = BTreeMap::new();
        for (class, c) in &self.gpu.classes {
            let base = format!("gpu.classes.{class}");
            if let Err(msg) = check_dns_label(class) {
                return err(base, msg);
            }
            for (i, r) in c.resources.iter().enumerate() {
                // A pattern must still name a domain outside kubernetes.io.
                let as_name = r.as_str().replace(['*', '?'], "x");
                if !quantity::is_extended_resource(&as_name) {
                    return err(
                        format!("{base}.resources[{i}]"),
                        format!(
                            "{:?} is not an extended resource name or pattern (like nvidia.com/gpu or nvidia.com/mig-*)",
                            r.as_str()
                        ),
                    );
                }
                if let Some(other) = resources.insert(r.as_str(), class) {
                    return err(
                        format!("{base}.resources[{i}]"),
                        format!("{:?} is also in class {other:?}", r.as_str()),
                    );
                }
            }
            for (i, d) in c.device_classes.iter().enumerate() {
                if let Err(msg) = check_dns_subdomain(d) {
                    return err(format!("{base}.deviceClasses[{i}]"), msg);
                }
                if let Some(other) = device_classes.insert(d, class) {
                    return err(
                        format!("{base}.deviceClasses[{i}]"),
                        format!("{d:?} is also in class {other:?}"),
                    );
                }
            }
            for (i, t) in c.tolerations.iter().flatten().enumerate() {
                if let Err(msg) = check_toleration(t) {
                    return err(format!("{base}.tolerations[{i}]"), msg);
                }
            }
            if c.driver == Driver::Runtime && !(c.mounts.is_empty() && c.env.is_empty()) {
                let what = if c.mounts.is_empty() { "env" } else { "mounts" };
                return err(
                    format!("{base}.{what}"),
                    "only used with driver: hostPath (with driver: runtime the device plugin or DRA driver provides the driver)".into(),
                );
            }
            if c.driver == Driver::HostPath && c.mounts.is_empty() {
                return err(
                    format!("{base}.mounts"),
                    "driver: hostPath needs the directories to mount".into(),
                );
            }
            for (i, m) in c.mounts.iter().enumerate() {
                let f = format!("{base}.mounts[{i}]");
                if !m.name.starts_with(&dm.volume_prefix) {
                    return err(
                        format!("{f}.name"),
                        format!(
                            "{:?} must start with the volume prefix {:?} (mutation.driverMounts.volumePrefix)",
                            m.name, dm.volume_prefix
                        ),
                    );
                }
                if let Err(msg) = check_dns_label(&m.name) {
                    return err(format!("{f}.name"), msg);
                }
                if !m.host_path.starts_with('/') {
                    return err(format!("{f}.hostPath"), "must be an absolute path".into());
                }
                if !m.mount_path.starts_with('/') {
                    return err(format!("{f}.mountPath"), "must be an absolute path".into());
                }
                if !matches!(
                    m.r#type.as_str(),
                    "" | "Directory"
                        | "DirectoryOrCreate"
                        | "File"
                        | "FileOrCreate"
                        | "Socket"
                        | "CharDevice"
                        | "BlockDevice"
                ) {
                    return err(
                        format!("{f}.type"),
                        format!("{:?} is not a hostPath type", m.r#type),
                    );
                }
                if let Some(other) = volumes.insert(&m.name, m) {
                    if other.host_path != m.host_path || other.r#type != m.r#type {
                        return err(
                            format!("{f}.name"),
                            format!(
                                "volume {:?} is declared twice with different host paths",
                                m.name
                            ),
                        );
                    }
                }
            }
            for (i, e) in c.env.iter().enumerate() {
                if e.name.is_empty() || e.name.contains('=') {
                    return err(
                        format!("{base}.env[{i}].name"),
                        format!("{:?} is not an environment variable name", e.name),
                    );
                }
            }
            check_defaults(source, &format!("{base}.perGpu"), &c.per_gpu)?;
        }
        Ok(())
    }

    fn check_sidecar(&self, source: &str) -> Result<(), PolicyError> {
        let s = &self.mutation.metrics_sidecar;
        if !s.enabled {
            return Ok(());
        }
        let f = "mutation.metricsSidecar.container";
        if let Err(msg) = check_dns_label(&s.container.name) {
            return Err(PolicyError::field(source, format!("{f}.name"), msg));
        }
        // The mode decides where the sidecar goes; a restartPolicy in the template would
        // contradict it (a regular container may not carry one without a feature gate).
        if s.container.restart_policy.is_some() {
            return Err(PolicyError::field(
                source,
                format!("{f}.restartPolicy"),
                "set by tollgate from `mode` (native: Always in initContainers); remove it",
            ));
        }
        if s.container.image.as_deref().unwrap_or("").is_empty() {
            return Err(PolicyError::field(
                source,
                format!("{f}.image"),
                "an image is required",
            ));
        }
        if let Some(res) = &s.container.resources {
            let requests = res.requests.as_ref();
            for (k, q) in res.limits.iter().flatten() {
                let limit = quantity::parse(&q.0).map_err(|e| {
                    PolicyError::field(source, format!("{f}.resources.limits.{k}"), e.to_string())
                })?;
                if let Some(r) = requests.and_then(|r| r.get(k)) {
                    let req = quantity::parse(&r.0).map_err(|e| {
                        PolicyError::field(
                            source,
                            format!("{f}.resources.requests.{k}"),
                            e.to_string(),
                        )
                    })?;
                    if req > limit {
                        return Err(PolicyError::field(
                            source,
                            format!("{f}.resources.requests.{k}"),
                            "request is above the limit",
                        ));
                    }
                }
            }
            for (k, q) in requests.into_iter().flatten() {
                quantity::parse(&q.0).map_err(|e| {
                    PolicyError::field(source, format!("{f}.resources.requests.{k}"), e.to_string())
                })?;
            }
        }
        for k in s.annotations.keys() {
            if let Err(m) = check_qualified_name(k) {
                return Err(PolicyError::field(
                    source,
                    format!("mutation.metricsSidecar.annotations.{k}"),
                    m,
                ));
            }
        }
        Ok(())
    }
}

/// k8s-openapi's types ignore unknown fields; the policy must not, so compare what the typed
/// model keeps with what was written.
fn check_no_unknown_fields<T: serde::de::DeserializeOwned + Serialize>(
    source: &str,
    base: &str,
    written: &Value,
) -> Result<(), PolicyError> {
    let typed: T = serde_json::from_value(written.clone())
        .map_err(|e| PolicyError::field(source, base, e.to_string()))?;
    let kept = serde_json::to_value(&typed).unwrap_or(Value::Null);
    if let Some(path) = first_unknown(written, &kept, base.to_owned()) {
        return Err(PolicyError::field(source, path, "unknown field"));
    }
    Ok(())
}

fn first_unknown(written: &Value, kept: &Value, path: String) -> Option<String> {
    match (written, kept) {
        (Value::Object(w), Value::Object(k)) => w.iter().find_map(|(key, wv)| match k.get(key) {
            None if !wv.is_null() => Some(format!("{path}.{key}")),
            None => None,
            Some(kv) => first_unknown(wv, kv, format!("{path}.{key}")),
        }),
        (Value::Array(w), Value::Array(k)) => w
            .iter()
            .zip(k)
            .enumerate()
            .find_map(|(i, (wv, kv))| first_unknown(wv, kv, format!("{path}[{i}]"))),
        _ => None,
    }
}

/// Checks of the policy as written that its typed form cannot make: k8s-openapi's types
/// (the sidecar's Container, the classes' tolerations) ignore unknown fields.
fn check_written(source: &str, value: &Value) -> Result<(), PolicyError> {
    if let Some(container) = value.pointer("/mutation/metricsSidecar/container") {
        check_no_unknown_fields::<Container>(
            source,
            "mutation.metricsSidecar.container",
            container,
        )?;
    }
    for (class, c) in value
        .pointer("/gpu/classes")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        for (i, t) in c
            .get("tolerations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let field = format!("gpu.classes.{class}.tolerations[{i}]");
            check_no_unknown_fields::<Toleration>(source, &field, t)?;
        }
    }
    Ok(())
}

/// RFC 7386 merge of `overrides` into the field `key` of `doc`: a map merges key by key,
/// anything else replaces, and `null` removes the field (its default comes back).
fn merge_field(doc: &mut Value, key: &str, overrides: &Value) {
    let Value::Object(map) = doc else {
        return;
    };
    match overrides {
        Value::Null => {
            map.remove(key);
        }
        Value::Object(o) => {
            let slot = map
                .entry(key.to_owned())
                .or_insert_with(|| Value::Object(Default::default()));
            if !slot.is_object() {
                *slot = Value::Object(Default::default());
            }
            for (k, v) in o {
                merge_field(slot, k, v);
            }
        }
        other => {
            map.insert(key.to_owned(), other.clone());
        }
    }
}

/// A profile's `match`: label selectors as the apiserver would accept them, no unknown
/// fields (k8s-openapi's LabelSelector ignores them), and globs that are not empty.
fn check_match(
    source: &str,
    at: &str,
    m: &ProfileMatch,
    written: Option<&Value>,
) -> Result<(), PolicyError> {
    let err = |field: String, msg: String| Err(PolicyError::field(source, field, msg));
    for (i, g) in m.namespaces.iter().enumerate() {
        if g.as_str().is_empty() {
            return err(
                format!("{at}.match.namespaces[{i}]"),
                "empty pattern".into(),
            );
        }
    }
    for (name, selector) in [
        ("namespaceSelector", &m.namespace_selector),
        ("podSelector", &m.pod_selector),
    ] {
        let Some(selector) = selector else { continue };
        let field = format!("{at}.match.{name}");
        if let Some(w) = written.and_then(|w| w.get(name)) {
            check_no_unknown_fields::<LabelSelector>(source, &field, w)?;
        }
        for (k, v) in selector.match_labels.iter().flatten() {
            if let Err(msg) = check_qualified_name(k) {
                return err(format!("{field}.matchLabels.{k}"), msg);
            }
            if let Err(msg) = check_label_value(v) {
                return err(format!("{field}.matchLabels.{k}"), msg);
            }
        }
        for (i, r) in selector.match_expressions.iter().flatten().enumerate() {
            let f = format!("{field}.matchExpressions[{i}]");
            if let Err(msg) = check_qualified_name(&r.key) {
                return err(format!("{f}.key"), msg);
            }
            let values = r.values.as_deref().unwrap_or_default();
            match r.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return err(
                        format!("{f}.values"),
                        format!("operator {} needs at least one value", r.operator),
                    )
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return err(
                        format!("{f}.values"),
                        format!("operator {} takes no values", r.operator),
                    )
                }
                "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
                other => {
                    return err(
                        format!("{f}.operator"),
                        format!("{other:?} is not an operator (In, NotIn, Exists, DoesNotExist)"),
                    )
                }
            }
            for v in values {
                if let Err(msg) = check_label_value(v) {
                    return err(format!("{f}.values"), msg);
                }
            }
        }
    }
    Ok(())
}

/// A label value: at most 63 characters, alphanumerics with `-`, `_`, `.` inside.
fn check_label_value(v: &str) -> Result<(), String> {
    let ok = v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && v.as_bytes()[0].is_ascii_alphanumeric()
            && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!("{v:?} is not a valid label value"))
    }
}

/// Default limits: only for cpu, memory and ephemeral-storage, and above zero.
fn check_defaults(
    source: &str,
    section: &str,
    map: &BTreeMap<String, Quantity>,
) -> Result<(), PolicyError> {
    for (res, q) in map {
        let field = format!("{section}.{res}");
        let fail = |msg: String| Err(PolicyError::field(source, field.clone(), msg));
        if res != "cpu" && res != "memory" && res != "ephemeral-storage" {
            return fail("only cpu, memory and ephemeral-storage can have defaults".into());
        }
        match quantity::parse(&q.0) {
            Ok(v) if v > 0 => {}
            Ok(_) => return fail("must be greater than zero".into()),
            Err(e) => return fail(e.to_string()),
        }
    }
    Ok(())
}

/// A toleration the apiserver accepts (core/v1 validation of `tolerations`).
fn check_toleration(t: &Toleration) -> Result<(), String> {
    let key = t.key.as_deref().unwrap_or("");
    let value = t.value.as_deref().unwrap_or("");
    let operator = t.operator.as_deref().unwrap_or("Equal");
    if !key.is_empty() {
        check_qualified_name(key)?;
    }
    match operator {
        "Exists" if !value.is_empty() => {
            return Err("operator Exists takes no value".into());
        }
        "Exists" => {}
        "Equal" if key.is_empty() => {
            return Err("an empty key needs operator Exists".into());
        }
        "Equal" => {}
        other => return Err(format!("{other:?} is not an operator (Exists, Equal)")),
    }
    let effect = t.effect.as_deref().unwrap_or("");
    if !matches!(effect, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(format!(
            "{effect:?} is not a taint effect (NoSchedule, PreferNoSchedule, NoExecute)"
        ));
    }
    if t.toleration_seconds.is_some() && effect != "NoExecute" {
        return Err("tolerationSeconds only goes with effect NoExecute".into());
    }
    Ok(())
}

/// A DNS subdomain (RFC 1123), as DeviceClass names are.
fn check_dns_subdomain(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| check_dns_label(l).is_ok());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid DeviceClass name (a DNS subdomain)"
        ))
    }
}

fn check_dns_label(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid name (lower-case letters, digits and '-', at most 63)"
        ))
    }
}

/// A label or annotation key: optional DNS prefix, '/', and a name of at most 63 characters.
fn check_qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.'))
    });
    if name_ok && prefix_ok {
        Ok(())
    } else {
        Err(format!("{key:?} is not a valid label or annotation key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_default_policy_loads_and_matches_builtin_defaults() {
        let text = include_str!("../../../policies/default.yaml");
        let p = Policy::from_text("policies/default.yaml", text).unwrap();
        assert_eq!(p, Policy::default());
        assert_eq!(Policy::from_text(BUILTIN_SOURCE, BUILTIN_TEXT).unwrap(), p);
    }

    #[test]
    fn empty_policy_is_the_default() {
        assert_eq!(Policy::from_text("x", "").unwrap(), Policy::default());
    }

    #[test]
    fn unknown_field_names_file_and_path() {
        let e = Policy::from_text(
            "p.yaml",
            "mutation:\n  gpuTolerations:\n    enabeld: true\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("p.yaml: field `mutation.gpuTolerations.enabeld`"),
            "{e}"
        );
        assert!(e.contains("unknown field"), "{e}");
    }

    #[test]
    fn unknown_field_in_sidecar_template_is_an_error() {
        let e = Policy::from_text(
            "p.yaml",
            "mutation:\n  metricsSidecar:\n    container:\n      name: m\n      image: i\n      imagePullPolicyy: Always\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("mutation.metricsSidecar.container.imagePullPolicyy"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_are_named() {
        for (text, field) in [
            ("validation:\n  mode: block\n", "validation.mode"),
            (
                "mutation:\n  defaultResources:\n    limits:\n      cpu: lots\n",
                "mutation.defaultResources.limits.cpu",
            ),
            (
                "gpu:\n  classes:\n    x:\n      resources: [gpu]\n",
                "gpu.classes.x.resources[0]",
            ),
            (
                "gpu:\n  classes:\n    x:\n      resources: [example.com/gpu]\n      tolerations: [{key: a, operator: Exists, value: b}]\n",
                "gpu.classes.x.tolerations[0]",
            ),
            (
                "gpu:\n  classes:\n    x:\n      resources: [example.com/gpu]\n      tolerations: [{key: a, operatr: Exists}]\n",
                "gpu.classes.x.tolerations[0].operatr",
            ),
            (
                "gpu:\n  classes:\n    a:\n      resources: [nvidia.com/gpu]\n    x:\n      resources: [nvidia.com/gpu]\n",
                "gpu.classes.x.resources[0]",
            ),
            (
                "gpu:\n  classes:\n    a:\n      deviceClasses: [gpu.nvidia.com]\n    x:\n      deviceClasses: [gpu.nvidia.com]\n",
                "gpu.classes.x.deviceClasses[0]",
            ),
            (
                "gpu:\n  classes:\n    x:\n      resources: [example.com/gpu]\n      driver: hostPath\n",
                "gpu.classes.x.mounts",
            ),
            (
                "gpu:\n  classes:\n    x:\n      resources: [example.com/gpu]\n      mounts: [{name: tollgate-x, hostPath: /x, mountPath: /x}]\n",
                "gpu.classes.x.mounts",
            ),
            (
                "gpu:\n  classes:\n    x:\n      resources: [example.com/gpu]\n      perGpu: {nvidia.com/gpu: 1}\n",
                "gpu.classes.x.perGpu.nvidia.com/gpu",
            ),
            (
                "mutation:\n  metricsSidecar:\n    mode: classic\n    container:\n      name: m\n      image: i\n      restartPolicy: Always\n",
                "mutation.metricsSidecar.container.restartPolicy",
            ),
            (
                "gpu:\n  classes:\n    x:\n      resources: [example.com/gpu]\n      tolerations: [{key: a, operator: Exists, effect: Never}]\n",
                "gpu.classes.x.tolerations[0]",
            ),
        ] {
            let e = Policy::from_text("p.yaml", text).unwrap_err().to_string();
            assert!(e.contains(&format!("field `{field}`")), "{text}: {e}");
        }
    }

    /// Fields whose meaning moved into the GPU classes are refused, saying where it went.
    #[test]
    fn replaced_fields_say_what_replaces_them() {
        for (text, field, replacement) in [
            (
                "gpu:\n  resources: [nvidia.com/gpu]\n",
                "gpu.resources",
                "gpu.classes",
            ),
            (
                "mutation:\n  gpuTolerations:\n    effect: NoSchedule\n",
                "mutation.gpuTolerations.effect",
                "gpu.classes.<class>.tolerations",
            ),
            (
                "mutation:\n  driverMounts:\n    resources: {}\n",
                "mutation.driverMounts.resources",
                "gpu.classes.<class>.mounts",
            ),
        ] {
            let e = Policy::from_text("p.yaml", text).unwrap_err().to_string();
            assert!(e.contains(&format!("field `{field}`")), "{text}: {e}");
            assert!(e.contains(replacement), "{text}: {e}");
        }
    }

    fn profile(text: &str) -> Policy {
        let p = Policy::from_text("p.yaml", text).unwrap();
        p.profiles[0].policy().unwrap().clone()
    }

    /// A map merges key by key: what the profile does not name stays the base's.
    #[test]
    fn profile_maps_merge_key_by_key() {
        let p = profile(
            "mutation:\n  defaultResources:\n    limits: {cpu: \"4\", memory: 8Gi}\nprofiles:\n  - name: a\n    mutation:\n      defaultResources:\n        limits: {cpu: \"8\"}\n        perGpu: {memory: 64Gi}\n      metricsSidecar:\n        container: {image: other:1}\n",
        );
        let dr = &p.mutation.default_resources;
        assert_eq!(dr.limits["cpu"].0, "8", "the profile's value");
        assert_eq!(
            dr.limits["memory"].0, "8Gi",
            "the base's value the profile did not name"
        );
        assert_eq!(dr.per_gpu["memory"].0, "64Gi");
        let sidecar = &p.mutation.metrics_sidecar.container;
        assert_eq!(sidecar.image.as_deref(), Some("other:1"));
        assert_eq!(
            sidecar.name, "tollgate-metrics",
            "the rest of the template stays"
        );
        assert_eq!(p.gpu.classes.len(), 4, "untouched sections are the base's");
    }

    /// A list replaces: the profile's list is the whole list.
    #[test]
    fn profile_lists_replace() {
        let p = profile(
            "optOut:\n  groups: [a, b]\nprofiles:\n  - name: a\n    optOut:\n      groups: [c]\n    validation:\n      requiredRequests: [cpu]\n",
        );
        assert_eq!(p.opt_out.groups, vec![Glob::from("c")]);
        assert_eq!(p.validation.required_requests, vec!["cpu".to_owned()]);
    }

    /// Scalars replace; null puts the built-in default back.
    #[test]
    fn profile_scalars_replace_and_null_restores_the_default() {
        let p = profile(
            "validation:\n  mode: warn\n  requiredRequests: [cpu]\nprofiles:\n  - name: a\n    validation:\n      mode: enforce\n      requiredRequests: null\n",
        );
        assert_eq!(p.validation.mode, Mode::Enforce);
        assert_eq!(p.validation.required_requests, ["cpu", "memory"]);
    }

    #[test]
    fn broken_profiles_are_refused_naming_file_profile_and_field() {
        for (text, field) in [
            (
                "profiles:\n  - name: team-a\n    mutatoin: {}\n",
                "profiles[team-a]",
            ),
            (
                "profiles:\n  - name: team-a\n    validation:\n      modes: warn\n",
                "profiles[team-a].validation.modes",
            ),
            (
                "profiles:\n  - name: team-a\n    mutation:\n      defaultResources:\n        perGpu: {cpu: \"0\"}\n",
                "profiles[team-a].mutation.defaultResources.perGpu.cpu",
            ),
            (
                "profiles:\n  - name: team-a\n    match:\n      podSelector:\n        matchExpressions: [{key: team, operator: Is, values: [a]}]\n",
                "profiles[team-a].match.podSelector.matchExpressions[0].operator",
            ),
            (
                "profiles:\n  - name: team-a\n    match:\n      namespaceSelector:\n        matchLabel: {team: a}\n",
                "profiles[team-a].match.namespaceSelector.matchLabel",
            ),
            (
                "profiles:\n  - name: team-a\n  - name: team-a\n",
                "profiles[1].name",
            ),
            ("profiles:\n  - name: base\n", "profiles[0].name"),
            (
                "profiles:\n  - name: team-a\n    mutation:\n      metricsSidecar:\n        container: {imagePullPolicyy: Always}\n",
                "profiles[team-a].mutation.metricsSidecar.container.imagePullPolicyy",
            ),
        ] {
            let e = Policy::from_text("p.yaml", text).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("p.yaml: field `{field}")),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn syntax_errors_name_the_file() {
        let e = Policy::from_text("p.yaml", "gpu: [\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.yaml: not valid YAML"), "{e}");
    }
}

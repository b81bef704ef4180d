//! The policy: what tollgate injects and enforces, as data.
//!
//! Loaded from YAML (or JSON) text; no I/O here. A platform team writes only what differs
//! from the built-in policy (`policies/default.yaml`, compiled in): their file is merged
//! over the built-in text by the rule profiles follow (a map merges key by key, a list or a
//! scalar replaces, `null` puts the built-in value back), so the defaults exist once, in
//! that file. Unknown fields are errors: a typo in a policy must never silently turn a
//! rule off.
//!
//! The rooms, each importing only those below it: `load` (merging, profiles), `check`
//! (what serde cannot check: names, paths, quantities, classes, selectors), `builtin`
//! (the built-in text as JSON), `types` (the schema), with
//! the Kubernetes name rules in the leaf module `names`. `Policy::from_text`, the load a
//! caller uses, is written beside the judgement (`judge::additions`): it also refuses a
//! policy whose own additions (the metrics sidecar, the default limits) its validation
//! would refuse, which only the mutation steps and validation can tell.

mod builtin;
mod check;
mod load;
mod types;

pub use types::*;

pub(crate) use load::merge_written;

/// The shipped policy, `policies/default.yaml`, compiled in: what `serve` and `review` run
/// without `--policy`, so that the binary (and a container image) needs no file to start,
/// and what every policy file is merged over.
pub const BUILTIN_TEXT: &str = include_str!("../../../../policies/default.yaml");

/// How errors and logs name the built-in policy.
pub const BUILTIN_SOURCE: &str = "built-in policy (policies/default.yaml)";

/// Why a policy could not be loaded: where, which field, and what is wrong. Its text is
/// one line: the command line prints it as it is.
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
    pub(crate) fn field(
        source: &str,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        PolicyError::Field {
            file: source.to_owned(),
            field: field.into(),
            message: one_line(message.into()),
        }
    }

    /// The same error with `profiles[N]` in its field written `profiles[NAME]` when the
    /// profile has a name: what a reader looks for in the file.
    fn named(self, written: &serde_json::Value) -> PolicyError {
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
    pub(crate) fn within(self, at: &str) -> PolicyError {
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
}

/// A message on one line: a parser's multi-line report (a snippet of the file under it)
/// keeps its first line, which says where and what.
fn one_line(message: String) -> String {
    match message.lines().find(|l| !l.trim().is_empty()) {
        Some(first) if message.contains('\n') => first.trim().to_owned(),
        _ => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::glob::Glob;

    #[test]
    fn shipped_default_policy_loads_and_matches_builtin_defaults() {
        let text = include_str!("../../../../policies/default.yaml");
        let p = Policy::from_text("policies/default.yaml", text).unwrap();
        assert_eq!(p, Policy::builtin());
        assert_eq!(Policy::from_text(BUILTIN_SOURCE, BUILTIN_TEXT).unwrap(), p);
    }

    #[test]
    fn empty_policy_is_the_default() {
        assert_eq!(Policy::from_text("x", "").unwrap(), Policy::builtin());
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
    fn bad_workloads_and_approvals_are_named() {
        let kind = |body: &str| format!("workloads:\n  kinds:\n    - {body}\n");
        for (text, field) in [
            (
                kind("{group: batch, version: v1, kind: Job, templates: [{path: \"spec..template\"}]}"),
                "workloads.kinds[0].templates[0].path",
            ),
            (
                kind("{group: batch, version: v1, kind: Job, templates: []}"),
                "workloads.kinds[0].templates",
            ),
            (
                kind("{group: batch, version: v1, kind: Job, templates: [{path: spec.template, nuon: x}]}"),
                "workloads.kinds[0].templates[0].nuon",
            ),
            (
                kind("{group: batch, version: v1, kind: Job, templates: [{path: spec.template}], labels: {\"job name\": x}}"),
                "workloads.kinds[0].labels.job name",
            ),
            (
                kind("{group: batch, version: v1, kind: Job, templates: [{path: spec.template, labels: {a: \"{job}\"}}]}"),
                "workloads.kinds[0].templates[0].labels.a",
            ),
            (
                kind("{group: \"\", version: v1, kind: Pod, templates: [{path: spec}]}"),
                "workloads.kinds[0].kind",
            ),
            (
                kind("{group: Batch_, version: v1, kind: Job, templates: [{path: spec.template}]}"),
                "workloads.kinds[0].group",
            ),
            (
                "workloads:\n  kinds:\n    - {group: batch, version: v1, kind: Job, templates: [{path: spec.template}]}\n    - {group: batch, version: v1, kind: Job, templates: [{path: spec.template}]}\n".to_owned(),
                "workloads.kinds[1].kind",
            ),
            (
                "optOut:\n  approvalAnnotation: tollgate.dev/opt-out\n".to_owned(),
                "optOut.approvalAnnotation",
            ),
            (
                "optOut:\n  approvalAnnotation: \"not a key\"\n".to_owned(),
                "optOut.approvalAnnotation",
            ),
            ("optOut:\n  controllers: [\"\"]\n".to_owned(), "optOut.controllers[0]"),
        ] {
            let e = Policy::from_text("p.yaml", &text).unwrap_err().to_string();
            assert!(e.contains(&format!("field `{field}`")), "{text}: {e}");
        }
    }

    /// The workloads section merges under profiles like any other.
    #[test]
    fn profiles_override_workloads_and_controllers() {
        let p = profile(
            "profiles:\n  - name: a\n    workloads: {enabled: false}\n    optOut:\n      controllers: [\"system:serviceaccount:ops:runner\"]\n",
        );
        assert!(!p.workloads.enabled);
        assert_eq!(
            p.workloads.kinds,
            Policy::builtin().workloads.kinds,
            "the kinds stay the base's"
        );
        assert_eq!(
            p.opt_out.controllers,
            vec![Glob::from("system:serviceaccount:ops:runner")]
        );
        assert_eq!(
            p.opt_out.approval_annotation,
            "tollgate.dev/opt-out-approved-by"
        );
    }

    #[test]
    fn syntax_errors_name_the_file() {
        let e = Policy::from_text("p.yaml", "gpu: [\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.yaml: not valid YAML"), "{e}");
    }
}

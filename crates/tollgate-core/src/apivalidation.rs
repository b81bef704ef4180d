//! What the kube-apiserver's own validation of a pod template refuses, in its words: the
//! field it names and what it says there (`spec.template.spec.containers[0].resources.limits:
//! Required value: Limit must be set for non overcommitable resources`).
//!
//! The apiserver validates the pod template of a built-in workload (a Job, a CronJob's job
//! template, a Deployment, ...) as it validates a pod, after the mutating webhooks and
//! before the validating ones: a workload it refuses never reaches tollgate's validating
//! webhook. `tollgate review` runs this check where the apiserver would (between the two
//! webhooks), so that what it promises is what the cluster does; the mutating webhook
//! runs it to say, with the YAML to add, what it could not mend. Kinds of CustomResource
//! Definitions have no such validation (only their schema), and are not checked here.
//!
//! The object's own name is validated for every kind, a CustomResource's too
//! (`ValidateObjectMeta`).
//!
//! Not all of the apiserver's validation, only the parts of `ValidatePodSpec`
//! (k8s.io/kubernetes pkg/apis/core/validation) a training manifest meets: the containers'
//! names and images, their resources (`ValidateContainerResourceRequirements`: a
//! resource's name, its quantity, a request above its limit, a non-overcommitable resource
//! whose request has no equal limit, hugepages without cpu or memory), the pod-level
//! resources, and containers missing altogether. What it names, the apiserver names too
//! (tests/template_agrees.rs holds it to the real one); what it does not know of it does not
//! refuse. A value it reports is the one the manifest wrote, where the apiserver writes the
//! quantity in its canonical form (the same for a quantity written canonically).

use serde_json::{Map, Value};

use crate::quantity;

/// One error the apiserver reports: the field, and what it says of it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FieldError {
    /// The field as the apiserver names it (`spec.template.spec.containers[0].image`).
    pub field: String,
    /// The rest of its line: `Required value`, `Invalid value: "-1": must be greater than
    /// or equal to 0`.
    pub detail: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

/// The message of the apiserver's refusal of object `name` of `kind` in `group` for
/// `errors`: `Job.batch "train" is invalid: <error>`, or `[<error>, <error>]` for more
/// than one (each said once, as its aggregate says them).
pub fn refusal(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> String {
    let qualified = if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    };
    let mut lines: Vec<String> = vec![];
    for e in errors {
        let line = e.to_string();
        if !lines.contains(&line) {
            lines.push(line);
        }
    }
    let body = match lines.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    format!("{qualified} {name:?} is invalid: {body}")
}

/// The apiserver's field path of a JSON pointer into `root`: keys joined by dots, an
/// index into a list in brackets (`/spec/template` is `spec.template`).
pub(crate) fn field_of(root: &Value, pointer: &str) -> String {
    let mut out = String::new();
    let mut at = Some(root);
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        match at {
            Some(Value::Array(a)) => {
                out.push_str(&format!("[{token}]"));
                at = token.parse::<usize>().ok().and_then(|i| a.get(i));
            }
            _ => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&token);
                at = at.and_then(|v| v.get(&token));
            }
        }
    }
    out
}

const RFC1123_SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// Whether `s` is a DNS-1123 subdomain (what most objects' names must be), its length
/// aside.
fn is_subdomain(s: &str) -> bool {
    s.split('.').all(is_label_text)
}

/// Every error the apiserver would report of the name in `meta` (an object's
/// `metadata`) for an object of `kind` in `group` (a StatefulSet's name must be a DNS
/// label, as its pods' hostnames are made of it; a CronJob's at most 52 characters, for
/// its Jobs' names; any other's, a CustomResource's too, a DNS subdomain). A generateName
/// is left to the apiserver.
pub(crate) fn object_name(group: &str, kind: &str, meta: Option<&Value>) -> Vec<FieldError> {
    let field = |k: &str| {
        meta.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let name = field("name");
    if name.is_empty() {
        if field("generateName").is_empty() {
            return vec![err(
                "metadata.name".into(),
                "Required value: name or generateName is required".into(),
            )];
        }
        return vec![];
    }
    let mut out = vec![];
    let invalid = |why: &str| {
        err(
            "metadata.name".into(),
            format!("Invalid value: {name:?}: {why}"),
        )
    };
    if (group, kind) == ("apps", "StatefulSet") {
        if name.len() > 63 {
            out.push(invalid("must be no more than 63 characters"));
        }
        if !is_label_text(name) {
            out.push(invalid(RFC1123_LABEL));
        }
    } else {
        if name.len() > 253 {
            out.push(invalid("must be no more than 253 characters"));
        }
        if !is_subdomain(name) {
            out.push(invalid(RFC1123_SUBDOMAIN));
        }
    }
    if (group, kind) == ("batch", "CronJob") && name.len() > 52 {
        out.push(invalid("must be no more than 52 characters"));
    }
    out
}

/// Every error the apiserver would report of the pod spec `spec` (the template's `spec`),
/// at `at` (its field path, `spec.template.spec`), in the parts this module knows.
pub(crate) fn pod_spec(spec: Option<&Value>, at: &str) -> Vec<FieldError> {
    let mut out = vec![];
    let empty = Map::new();
    let spec = spec.and_then(Value::as_object).unwrap_or(&empty);
    let list = |key: &str| -> &[Value] {
        spec.get(key)
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    };
    let (init, containers) = (list("initContainers"), list("containers"));
    if containers.is_empty() {
        out.push(err(format!("{at}.containers"), "Required value".into()));
    }
    // Init containers first, each name once across both lists (a regular container's
    // name taken by an init container is said at the init container's).
    let regular: Vec<&str> = containers.iter().map(name_of).collect();
    let mut seen: Vec<&str> = vec![];
    for (i, c) in init.iter().enumerate() {
        let p = format!("{at}.initContainers[{i}]");
        let name = name_of(c);
        container(c, &p, &mut out);
        if !name.is_empty() && (seen.contains(&name) || regular.contains(&name)) {
            out.push(err(
                format!("{p}.name"),
                format!("Duplicate value: {name:?}"),
            ));
        }
        seen.push(name);
    }
    let mut seen: Vec<&str> = vec![];
    for (i, c) in containers.iter().enumerate() {
        let p = format!("{at}.containers[{i}]");
        let name = name_of(c);
        container(c, &p, &mut out);
        if !name.is_empty() && seen.contains(&name) {
            out.push(err(
                format!("{p}.name"),
                format!("Duplicate value: {name:?}"),
            ));
        }
        seen.push(name);
    }
    if let Some(r) = spec.get("resources").filter(|r| r.is_object()) {
        resources(r, &format!("{at}.resources"), Level::Pod, &mut out);
    }
    out
}

fn err(field: String, detail: String) -> FieldError {
    FieldError { field, detail }
}

fn name_of(c: &Value) -> &str {
    c.get("name").and_then(Value::as_str).unwrap_or("")
}

const RFC1123_LABEL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// Whether `s` is a DNS-1123 label (what a container's name must be), its length aside.
fn is_label_text(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.iter().all(|c| inner(c) || *c == b'-')
        && b.first().is_some_and(inner)
        && b.last().is_some_and(inner)
}

fn container(c: &Value, p: &str, out: &mut Vec<FieldError>) {
    let name = name_of(c);
    if name.is_empty() {
        out.push(err(format!("{p}.name"), "Required value".into()));
    } else {
        if name.len() > 63 {
            out.push(err(
                format!("{p}.name"),
                format!("Invalid value: {name:?}: must be no more than 63 characters"),
            ));
        }
        if !is_label_text(name) {
            out.push(err(
                format!("{p}.name"),
                format!("Invalid value: {name:?}: {RFC1123_LABEL}"),
            ));
        }
    }
    if c.get("image")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        out.push(err(format!("{p}.image"), "Required value".into()));
    }
    if let Some(r) = c.get("resources").filter(|r| r.is_object()) {
        resources(r, &format!("{p}.resources"), Level::Container, out);
    }
}

/// Whose resources: a container's, or the pod's own (`spec.resources`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Container,
    Pod,
}

/// A map of resources, as strings (a quantity the JSON wrote as a number included).
fn quantities(r: &Value, key: &str) -> Vec<(String, String)> {
    r.get(key)
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            let q = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return None,
            };
            Some((k.clone(), q))
        })
        .collect()
}

/// Whether the apiserver allows `name` to be overcommitted (a request below its limit): a
/// native resource (no domain, or a kubernetes.io one) that is not hugepages.
fn overcommit_allowed(name: &str) -> bool {
    !quantity::is_non_overcommittable(name)
}

fn is_hugepages(name: &str) -> bool {
    name.starts_with("hugepages-")
}

/// `ValidateContainerResourceRequirements` (or the pod-level one) of `r` at `p`.
fn resources(r: &Value, p: &str, level: Level, out: &mut Vec<FieldError>) {
    let limits = quantities(r, "limits");
    let requests = quantities(r, "requests");
    let parsed = |q: &str| quantity::parse(q).ok();
    for (which, items) in [("limits", &limits), ("requests", &requests)] {
        for (name, q) in items.iter() {
            let at = format!("{p}.{which}[{name}]");
            resource_name(name, &at, level, out);
            if let Some(n) = parsed(q) {
                if n < 0 {
                    out.push(err(
                        at.clone(),
                        format!("Invalid value: {q:?}: must be greater than or equal to 0"),
                    ));
                }
                if quantity::is_extended_resource(name) && n % 1_000_000_000 != 0 {
                    out.push(err(at, format!("Invalid value: {q:?}: must be an integer")));
                }
            }
        }
    }
    for (name, q) in &requests {
        match limits.iter().find(|(l, _)| l == name) {
            Some((_, lq)) => {
                let (Some(req), Some(lim)) = (parsed(q), parsed(lq)) else {
                    continue;
                };
                if req != lim && !overcommit_allowed(name) {
                    out.push(err(
                        format!("{p}.requests"),
                        format!("Invalid value: {q:?}: must be equal to {name} limit of {lq}"),
                    ));
                } else if req > lim {
                    out.push(err(
                        format!("{p}.requests"),
                        format!(
                            "Invalid value: {q:?}: must be less than or equal to {name} limit of {lq}"
                        ),
                    ));
                }
            }
            None if !overcommit_allowed(name) => out.push(err(
                format!("{p}.limits"),
                "Required value: Limit must be set for non overcommitable resources".into(),
            )),
            None => {}
        }
    }
    if level == Level::Container {
        let all = || limits.iter().chain(&requests).map(|(n, _)| n.as_str());
        if all().any(is_hugepages) && !all().any(|n| n == "cpu" || n == "memory") {
            out.push(err(
                p.to_owned(),
                "Forbidden: HugePages require cpu or memory".into(),
            ));
        }
    }
}

/// The apiserver's standard resource names (`helper.IsStandardResourceName`): what a
/// name without a domain must be, for a container or a quota.
fn is_standard_resource(name: &str) -> bool {
    const STANDARD: &[&str] = &[
        "cpu",
        "memory",
        "ephemeral-storage",
        "requests.cpu",
        "requests.memory",
        "requests.ephemeral-storage",
        "limits.cpu",
        "limits.memory",
        "limits.ephemeral-storage",
        "pods",
        "services",
        "replicationcontrollers",
        "resourcequotas",
        "secrets",
        "configmaps",
        "persistentvolumeclaims",
        "storage",
        "requests.storage",
        "services.nodeports",
        "services.loadbalancers",
    ];
    STANDARD.contains(&name)
        || is_hugepages(name)
        || name.strip_prefix("requests.").is_some_and(is_hugepages)
}

/// Whether the apiserver takes `name` as a resource of a container (or of the pod).
fn resource_name(name: &str, at: &str, level: Level, out: &mut Vec<FieldError>) {
    if level == Level::Pod {
        if !(name == "cpu" || name == "memory" || is_hugepages(name)) {
            out.push(err(
                at.to_owned(),
                format!("Unsupported value: {name:?}: supported values: \"cpu\", \"memory\""),
            ));
        }
        return;
    }
    if !name.contains('/') {
        // `validateResourceName` first (any standard resource), then the containers' own.
        if !is_standard_resource(name) {
            out.push(err(
                at.to_owned(),
                format!(
                    "Invalid value: {name:?}: must be a standard resource type or fully qualified"
                ),
            ));
        }
        let standard = matches!(name, "cpu" | "memory" | "ephemeral-storage") || is_hugepages(name);
        if !standard {
            out.push(err(
                at.to_owned(),
                format!("Invalid value: {name:?}: must be a standard resource for containers"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(spec: Value) -> Vec<String> {
        pod_spec(Some(&spec), "spec.template.spec")
            .into_iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn a_gpu_requested_without_a_limit_is_refused_in_the_apiservers_words() {
        let spec = json!({"containers": [{"name": "t", "image": "i",
            "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "1"}}}]});
        assert_eq!(
            fields(spec),
            ["spec.template.spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources"]
        );
        let e = pod_spec(
            Some(&json!({"containers": [{"name": "t", "image": "i",
                "resources": {"requests": {"nvidia.com/gpu": "1"}}}]})),
            "spec.template.spec",
        );
        assert_eq!(
            refusal("batch", "Job", "train-gpu", &e),
            "Job.batch \"train-gpu\" is invalid: spec.template.spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources"
        );
    }

    #[test]
    fn what_a_valid_template_has_is_not_refused() {
        let spec = json!({"initContainers": [{"name": "fetch", "image": "i", "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}}],
            "containers": [{"name": "t", "image": "i",
                "resources": {"requests": {"nvidia.com/gpu": "2", "hugepages-2Mi": "4Mi", "memory": "1Gi"},
                              "limits": {"nvidia.com/gpu": "2", "hugepages-2Mi": "4Mi"}}}],
            "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "4"}}});
        assert!(fields(spec).is_empty());
    }

    #[test]
    fn names_values_and_limits() {
        let spec = json!({
            "initContainers": [{"name": "t", "image": "i"}],
            "containers": [
                {"name": "Trainer", "resources": {
                    "requests": {"cpu": "2", "gpu": "1", "nvidia.com/gpu": "1"},
                    "limits": {"cpu": "1", "nvidia.com/gpu": "2", "memory": "-1"}}},
                {"name": "t", "image": "i", "resources": {"limits": {"hugepages-2Mi": "2Mi", "example.com/dev": "500m"}}}
            ],
            "resources": {"requests": {"nvidia.com/gpu": "1"}}
        });
        let got = fields(spec);
        let want = [
            "spec.template.spec.initContainers[0].name: Duplicate value: \"t\"",
            "spec.template.spec.containers[0].name: Invalid value: \"Trainer\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            "spec.template.spec.containers[0].image: Required value",
            "spec.template.spec.containers[0].resources.limits[memory]: Invalid value: \"-1\": must be greater than or equal to 0",
            "spec.template.spec.containers[0].resources.requests[gpu]: Invalid value: \"gpu\": must be a standard resource type or fully qualified",
            "spec.template.spec.containers[0].resources.requests[gpu]: Invalid value: \"gpu\": must be a standard resource for containers",
            "spec.template.spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1",
            "spec.template.spec.containers[0].resources.requests: Invalid value: \"1\": must be equal to nvidia.com/gpu limit of 2",
            "spec.template.spec.containers[1].resources.limits[example.com/dev]: Invalid value: \"500m\": must be an integer",
            "spec.template.spec.containers[1].resources: Forbidden: HugePages require cpu or memory",
            "spec.template.spec.resources.requests[nvidia.com/gpu]: Unsupported value: \"nvidia.com/gpu\": supported values: \"cpu\", \"memory\"",
            "spec.template.spec.resources.limits: Required value: Limit must be set for non overcommitable resources",
        ];
        for w in want {
            assert!(got.contains(&w.to_owned()), "{w}\nnot in\n{got:#?}");
        }
        assert_eq!(got.len(), want.len(), "{got:#?}");
        assert_eq!(
            fields(json!({})),
            ["spec.template.spec.containers: Required value"]
        );
    }

    #[test]
    fn object_names_as_each_kind_needs_them() {
        let meta = |name: &str| json!({"name": name});
        assert!(object_name("batch", "Job", Some(&meta("train.v2"))).is_empty());
        let e = object_name("apps", "StatefulSet", Some(&meta("train.v2")));
        assert_eq!(e.len(), 1);
        assert!(e[0].detail.contains("RFC 1123 label"), "{e:?}");
        let e = object_name("apps", "Deployment", Some(&meta("Train_GPU")));
        assert!(e[0]
            .detail
            .starts_with("Invalid value: \"Train_GPU\": a lowercase RFC 1123 subdomain"));
        let long = "a".repeat(53);
        assert_eq!(object_name("batch", "CronJob", Some(&meta(&long))).len(), 1);
        assert!(object_name("batch", "Job", Some(&json!({"generateName": "train-"}))).is_empty());
        assert_eq!(
            object_name("batch", "Job", None)[0].to_string(),
            "metadata.name: Required value: name or generateName is required"
        );
    }

    #[test]
    fn pointers_become_the_apiservers_paths() {
        let v = json!({"spec": {"jobTemplate": {"spec": {"template": {}}}, "list": [{"a/b": {}}]}});
        assert_eq!(
            field_of(&v, "/spec/jobTemplate/spec/template"),
            "spec.jobTemplate.spec.template"
        );
        assert_eq!(field_of(&v, "/spec/list/0/a~1b"), "spec.list[0].a/b");
    }
}

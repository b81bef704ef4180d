//! The checks serde cannot make: names the apiserver would refuse, paths, quantities,
//! classes that claim one resource twice, selectors, what k8s-openapi's types would
//! silently drop. Each error names the file and the field.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Serialize;
use serde_json::Value;

use super::{Driver, HostMount, Policy, PolicyError, ProfileMatch, Step};
use crate::{names, quantity, template_path};

impl Policy {
    /// Semantic checks serde cannot express.
    pub(super) fn check(&self, source: &str) -> Result<(), PolicyError> {
        let err = |field: &str, msg: String| Err(PolicyError::field(source, field, msg));
        self.check_replaced(source)?;
        for (name, field) in [
            (
                &self.selection.training_annotation,
                "selection.trainingAnnotation",
            ),
            (&self.opt_out.annotation, "optOut.annotation"),
            (
                &self.opt_out.approval_annotation,
                "optOut.approvalAnnotation",
            ),
            (
                &self.mutation.applied_annotation,
                "mutation.appliedAnnotation",
            ),
        ] {
            if let Err(m) = names::qualified_name(name) {
                return err(field, m);
            }
        }
        for (i, l) in self.selection.workload_labels.iter().enumerate() {
            if let Err(m) = names::qualified_name(l) {
                return err(&format!("selection.workloadLabels[{i}]"), m);
            }
        }
        for (list, field) in [
            (&self.opt_out.namespaces, "optOut.namespaces"),
            (&self.opt_out.users, "optOut.users"),
            (&self.opt_out.groups, "optOut.groups"),
            (&self.opt_out.controllers, "optOut.controllers"),
        ] {
            for (i, p) in list.iter().enumerate() {
                if p.as_str().is_empty() {
                    return err(&format!("{field}[{i}]"), "empty pattern".into());
                }
            }
        }
        if self.opt_out.approval_annotation == self.opt_out.annotation {
            return err(
                "optOut.approvalAnnotation",
                "must differ from optOut.annotation: one is the user's request, the other tollgate's approval".into(),
            );
        }
        self.check_workloads(source)?;
        self.check_gpu_classes(source)?;
        for step in Step::ALL {
            self.check_step(source, step)?;
        }
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
        let gpu = (
            self.gpu.resources.is_some(),
            "gpu.resources",
            "replaced by gpu.classes: list each resource under its class, e.g. \
             gpu.classes.nvidia.resources (see policies/default.yaml)",
        );
        let steps = Step::ALL.into_iter().filter_map(|step| match step {
            Step::Tolerations => Some((
                self.mutation.gpu_tolerations.effect.is_some(),
                "mutation.gpuTolerations.effect",
                "replaced by gpu.classes.<class>.tolerations, a list of {key, operator, \
                 value, effect} (see policies/default.yaml)",
            )),
            Step::DriverMounts => Some((
                self.mutation.driver_mounts.resources.is_some(),
                "mutation.driverMounts.resources",
                "replaced by gpu.classes.<class>.mounts and .env, with driver: hostPath \
                 (see policies/default.yaml)",
            )),
            Step::MetricsSidecar | Step::DefaultResources => None,
        });
        match std::iter::once(gpu).chain(steps).find(|(set, _, _)| *set) {
            Some((_, field, msg)) => Err(PolicyError::field(source, field, msg)),
            None => Ok(()),
        }
    }

    /// What serde cannot check of a mutation step's section.
    fn check_step(&self, source: &str, step: Step) -> Result<(), PolicyError> {
        match step {
            // The tolerations are the GPU classes', checked with them.
            Step::Tolerations => Ok(()),
            // Its volume prefix is checked with the classes, whose mounts it names.
            Step::DriverMounts => Ok(()),
            Step::MetricsSidecar => self.check_sidecar(source),
            Step::DefaultResources => {
                let dr = &self.mutation.default_resources;
                check_defaults(source, "mutation.defaultResources.limits", &dr.limits)?;
                check_defaults(source, "mutation.defaultResources.perGpu", &dr.per_gpu)
            }
        }
    }

    fn check_workloads(&self, source: &str) -> Result<(), PolicyError> {
        let err = |field: String, msg: String| Err(PolicyError::field(source, field, msg));
        let mut seen: BTreeMap<(&str, &str, &str), usize> = BTreeMap::new();
        for (i, k) in self.workloads.kinds.iter().enumerate() {
            let at = format!("workloads.kinds[{i}]");
            if k.kind.is_empty() || !k.kind.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return err(format!("{at}.kind"), format!("{:?} is not a kind", k.kind));
            }
            if k.group.is_empty() && k.kind == "Pod" {
                return err(
                    format!("{at}.kind"),
                    "pods are judged as pods; list the kinds whose templates make them".into(),
                );
            }
            if !k.group.is_empty() {
                if let Err(m) = names::dns_subdomain(&k.group, "API group") {
                    return err(format!("{at}.group"), m);
                }
            }
            if k.version.is_empty() || !k.version.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return err(
                    format!("{at}.version"),
                    format!("{:?} is not an API version", k.version),
                );
            }
            if let Some(j) = seen.insert((&k.group, &k.version, &k.kind), i) {
                return err(
                    format!("{at}.kind"),
                    format!(
                        "{}/{} {} is also workloads.kinds[{j}]",
                        k.group, k.version, k.kind
                    ),
                );
            }
            if k.templates.is_empty() {
                return err(
                    format!("{at}.templates"),
                    "at least one template path".into(),
                );
            }
            check_template_labels(&k.labels)
                .map_err(|(f, m)| PolicyError::field(source, format!("{at}.labels.{f}"), m))?;
            for (j, t) in k.templates.iter().enumerate() {
                let at = format!("{at}.templates[{j}]");
                if let Err(m) = template_path::Path::parse(&t.path) {
                    return err(format!("{at}.path"), m);
                }
                check_template_labels(&t.labels)
                    .map_err(|(f, m)| PolicyError::field(source, format!("{at}.labels.{f}"), m))?;
                // A template's pointer has a segment per key and per list index.
                let depth = t.path.split('.').count() + t.path.matches("[*]").count();
                for (c, count) in t.count.iter().enumerate() {
                    let segments: Vec<&str> = count.split('/').collect();
                    let up = segments.iter().take_while(|s| **s == "..").count();
                    let bad = segments.iter().any(|s| s.is_empty())
                        || segments[up..].contains(&"..")
                        || up >= depth;
                    if bad {
                        return err(
                            format!("{at}.count[{c}]"),
                            format!(
                                "{count:?} is not a path from the template: `..` for its parent (at most {} of them), then keys separated by `/`, as in ../replicas",
                                depth - 1
                            ),
                        );
                    }
                }
                if t.count_minus < 0 {
                    return err(format!("{at}.countMinus"), "must not be negative".into());
                }
            }
        }
        Ok(())
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
        let mut resources: BTreeMap<&str, (&str, usize)> = BTreeMap::new();
        let mut device_classes: BTreeMap<&str, (&str, usize)> = BTreeMap::new();
        // The file's own classes first, then the built-in ones it kept: a resource two
        // classes claim is reported where the file wrote it.
        let builtin = super::builtin::builtin_class_names();
        let (own, kept): (Vec<_>, Vec<_>) = self
            .gpu
            .classes
            .iter()
            .partition(|(name, _)| !builtin.contains(name.as_str()));
        for (class, c) in own.into_iter().chain(kept) {
            let base = format!("gpu.classes.{class}");
            if let Err(msg) = names::dns_label(class) {
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
                if let Some((other, j)) = resources.insert(r.as_str(), (class, i)) {
                    return err(
                        claimed_twice(&builtin, "resources", (class, i), (other, j)),
                        format!(
                            "{:?} is also in class {}",
                            r.as_str(),
                            also_in(&builtin, class, other)
                        ),
                    );
                }
            }
            for (i, d) in c.device_classes.iter().enumerate() {
                if let Err(msg) = names::dns_subdomain(d, "DeviceClass name") {
                    return err(format!("{base}.deviceClasses[{i}]"), msg);
                }
                if let Some((other, j)) = device_classes.insert(d, (class, i)) {
                    return err(
                        claimed_twice(&builtin, "deviceClasses", (class, i), (other, j)),
                        format!("{d:?} is also in class {}", also_in(&builtin, class, other)),
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
            if c.driver != Driver::Runtime && c.mounts.is_empty() {
                return err(
                    format!("{base}.mounts"),
                    format!(
                        "driver: {} needs the directories to mount",
                        c.driver.as_str()
                    ),
                );
            }
            if c.driver == Driver::Auto {
                match c.driver_fallback {
                    None => {
                        return err(
                            format!("{base}.driverFallback"),
                            "driver: auto needs a fallback (hostPath or runtime) for pods judged where no node that could run them is known".into(),
                        )
                    }
                    Some(Driver::Auto) => {
                        return err(
                            format!("{base}.driverFallback"),
                            "is what decides where no node is known: hostPath or runtime, not auto".into(),
                        )
                    }
                    Some(_) => {}
                }
            }
            for (i, l) in c.runtime_node_labels.iter().enumerate() {
                let (key, value) = l.split_once('=').unwrap_or((l, ""));
                if let Err(msg) =
                    names::qualified_name(key).and_then(|()| names::label_value(value))
                {
                    return err(format!("{base}.runtimeNodeLabels[{i}]"), msg);
                }
            }
            for (i, share) in c.shares.iter().enumerate() {
                if c.resources.iter().any(|r| r.as_str() == share.as_str()) {
                    return err(
                        format!("{base}.shares[{i}]"),
                        format!(
                            "{:?} is also in resources: a share is not a GPU of its own",
                            share.as_str()
                        ),
                    );
                }
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
                if let Err(msg) = names::dns_label(&m.name) {
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
        if let Err(msg) = names::dns_label(&s.container.name) {
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
            if let Err(m) = names::qualified_name(k) {
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
/// Where a resource or device class two classes claim is reported: at the later class,
/// unless that one is built in and the earlier is the file's own (`own`, `i`).
fn claimed_twice(
    builtin: &std::collections::BTreeSet<&str>,
    list: &str,
    (class, i): (&str, usize),
    (other, j): (&str, usize),
) -> String {
    if builtin.contains(class) && !builtin.contains(other) {
        format!("gpu.classes.{other}.{list}[{j}]")
    } else {
        format!("gpu.classes.{class}.{list}[{i}]")
    }
}

/// The other class of a resource claimed twice, as the message names it: a built-in
/// class says how to leave it out.
fn also_in(builtin: &std::collections::BTreeSet<&str>, class: &str, other: &str) -> String {
    if builtin.contains(class) && !builtin.contains(other) {
        format!("{class:?} of the built-in policy (write `{class}: null` under gpu.classes to leave it out)")
    } else {
        format!("{other:?}")
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
pub(super) fn check_written(source: &str, value: &Value) -> Result<(), PolicyError> {
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

/// A profile's `match`: label selectors as the apiserver would accept them, no unknown
/// fields (k8s-openapi's LabelSelector ignores them), and globs that are not empty.
pub(super) fn check_match(
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
            if let Err(msg) = names::qualified_name(k) {
                return err(format!("{field}.matchLabels.{k}"), msg);
            }
            if let Err(msg) = names::label_value(v) {
                return err(format!("{field}.matchLabels.{k}"), msg);
            }
        }
        for (i, r) in selector.match_expressions.iter().flatten().enumerate() {
            let f = format!("{field}.matchExpressions[{i}]");
            if let Err(msg) = names::qualified_name(&r.key) {
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
                if let Err(msg) = names::label_value(v) {
                    return err(format!("{f}.values"), msg);
                }
            }
        }
    }
    Ok(())
}

/// The labels a controller adds: valid keys, and values that are valid once `{name}`,
/// `{template}` and `{template-lower}` are filled in with a valid name.
fn check_template_labels(labels: &BTreeMap<String, String>) -> Result<(), (String, String)> {
    for (k, v) in labels {
        names::qualified_name(k).map_err(|m| (k.clone(), m))?;
        let filled = v
            .replace("{template-lower}", "x")
            .replace("{template}", "x")
            .replace("{name}", "x");
        if filled.contains(['{', '}']) {
            return Err((
                k.clone(),
                format!("{v:?}: only {{name}}, {{template}} and {{template-lower}} are filled in"),
            ));
        }
        names::label_value(&filled)
            .map_err(|_| (k.clone(), format!("{v:?} is not a valid label value")))?;
    }
    Ok(())
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
        names::qualified_name(key)?;
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

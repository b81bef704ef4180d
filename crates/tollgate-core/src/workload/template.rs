//! A workload's pod templates, found by the policy's paths for its kind, and the pods its
//! controller would create from them: the labels the controller adds, the namespace, a
//! generateName after the workload, the apiserver's defaulting; how many pods each makes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Map, Value};

use crate::pod;
use crate::policy::{TemplateSpec, WorkloadKind};
use crate::template_path::Path;

/// One pod template of a workload.
#[derive(Debug, Clone)]
pub(super) struct PodTemplate<'v> {
    /// Where it is in the workload, as a JSON pointer.
    pub pointer: String,
    /// How messages name it (`replica Worker`); None for a kind's only, unnamed template.
    pub label: Option<String>,
    /// Its name as the controller's labels use it (`Worker`, `head`); empty if none.
    pub name: String,
    pub value: &'v Value,
    pub(super) spec: &'v TemplateSpec,
}

/// The workload's name as messages show it: `job "train"` (or `job "train-*"` for a
/// generateName).
pub(super) fn subject(kind: &WorkloadKind, object: &Value) -> String {
    let meta = object.get("metadata");
    let field = |k: &str| {
        meta.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let name = match (field("name"), field("generateName")) {
        (Some(n), _) => n.to_owned(),
        (None, Some(g)) => format!("{g}*"),
        (None, None) => "(unnamed)".to_owned(),
    };
    format!("{} {name:?}", kind.noun())
}

/// The pod templates of `object`, in the order of the kind's paths.
pub(super) fn templates<'v>(kind: &'v WorkloadKind, object: &'v Value) -> Vec<PodTemplate<'v>> {
    let mut out = vec![];
    for spec in &kind.templates {
        // The policy checked every path when it loaded.
        let Ok(path) = Path::parse(&spec.path) else {
            continue;
        };
        for found in path.find(object) {
            let fanned = found.names.join("/");
            let name = if fanned.is_empty() {
                spec.name.clone()
            } else {
                fanned.clone()
            };
            let label = match (spec.noun.as_str(), fanned.as_str()) {
                ("", "") if spec.name.is_empty() => None,
                ("", "") => Some(spec.name.clone()),
                ("", f) => Some(f.to_owned()),
                (noun, "") => Some(format!("{noun} {}", spec.name).trim_end().to_owned()),
                (noun, f) => Some(format!("{noun} {f}")),
            };
            out.push(PodTemplate {
                pointer: found.pointer,
                label,
                name,
                value: found.value,
                spec,
            });
        }
    }
    out
}

impl PodTemplate<'_> {
    pub(super) fn annotations(&self) -> Option<BTreeMap<String, String>> {
        let a = self.value.pointer("/metadata/annotations")?;
        a.is_object().then(|| string_map(Some(a)))
    }

    pub(super) fn display(&self) -> &str {
        self.label.as_deref().unwrap_or("pod template")
    }

    /// `text`, led by the template's name when it has one (`replica Worker: ...`).
    pub(super) fn lead(&self, text: &str) -> String {
        match &self.label {
            Some(l) => format!("{l}: {text}"),
            None => text.to_owned(),
        }
    }
}

/// The labels the pods of `t` get: the template's, then the controller's (which win, as
/// the controllers set them).
pub(super) fn pod_labels(
    kind: &WorkloadKind,
    t: &PodTemplate<'_>,
    workload: &str,
) -> BTreeMap<String, String> {
    let mut labels = labels_of(t.value);
    let lower = t.name.to_ascii_lowercase();
    for (k, v) in kind.labels.iter().chain(&t.spec.labels) {
        let v = v
            .replace("{template-lower}", &lower)
            .replace("{template}", &t.name)
            .replace("{name}", workload);
        labels.insert(k.clone(), v);
    }
    labels
}

/// The pod the controller would create from `t`: the template's metadata and spec, the
/// controller's labels, the workload's namespace, and a generateName after the workload.
pub(super) fn pod_of(
    kind: &WorkloadKind,
    t: &PodTemplate<'_>,
    workload: &str,
    namespace: &str,
) -> Result<Pod, String> {
    let mut meta = match t.value.get("metadata") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    let labels = pod_labels(kind, t, workload);
    if !labels.is_empty() {
        meta.insert(
            "labels".into(),
            Value::Object(
                labels
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect(),
            ),
        );
    }
    meta.remove("name");
    meta.insert("namespace".into(), Value::String(namespace.to_owned()));
    meta.insert("generateName".into(), Value::String(format!("{workload}-")));
    let mut pod = Map::new();
    pod.insert("apiVersion".into(), "v1".into());
    pod.insert("kind".into(), "Pod".into());
    pod.insert("metadata".into(), Value::Object(meta));
    pod.insert(
        "spec".into(),
        t.value.get("spec").cloned().unwrap_or(Value::Null),
    );
    let mut pod: Pod = serde_json::from_value(Value::Object(pod)).map_err(|e| e.to_string())?;
    // The apiserver defaults the pod the controller creates before any webhook sees it.
    if let Some(spec) = pod.spec.as_mut() {
        pod::default_pod_level_requests(spec);
    }
    Ok(pod)
}

/// How many pods template `t` of `object` makes: the product of the numbers its spec's
/// `count` paths find (each 1 where absent or not a number), less `countMinus`, never
/// below zero.
pub(super) fn pod_count(t: &PodTemplate<'_>, object: &Value) -> i128 {
    let mut n: i128 = 1;
    for count in &t.spec.count {
        let mut at: Vec<&str> = t.pointer.split('/').skip(1).collect();
        let mut keys = vec![];
        for seg in count.split('/') {
            if seg == ".." {
                at.pop();
            } else {
                keys.push(seg);
            }
        }
        let pointer: String = at.iter().chain(&keys).map(|s| format!("/{s}")).collect();
        let factor = object
            .pointer(&pointer)
            .and_then(Value::as_i64)
            .map_or(1, i128::from);
        n = n.saturating_mul(factor.max(0));
    }
    (n - i128::from(t.spec.count_minus)).max(0)
}

/// The workload's name for the controller's labels and the pods' generateName.
pub(super) fn workload_name(object: &Value) -> &str {
    let meta = object.get("metadata");
    ["name", "generateName"]
        .iter()
        .find_map(|k| {
            meta.and_then(|m| m.get(k))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        })
        .map_or("", |s| s.trim_end_matches('-'))
}

/// The value at a policy's dotted path (`spec.parallelTrials`) in `object`, key by key.
pub(super) fn at<'v>(object: &'v Value, dotted: &str) -> Option<&'v Value> {
    dotted.split('.').try_fold(object, |v, key| v.get(key))
}

/// An object's labels (`metadata.labels`, string values only, as the apiserver allows).
pub(crate) fn labels_of(object: &Value) -> BTreeMap<String, String> {
    string_map(object.pointer("/metadata/labels"))
}

/// A JSON object of strings (labels, annotations) as a map; other values are left out.
pub(super) fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    fn fixture(name: &str) -> Value {
        let body = std::fs::read(crate::testdata::fixtures_dir().join(name)).unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    #[test]
    fn templates_are_named_from_their_paths_and_get_the_controllers_labels() {
        let policy = Policy::builtin();
        let review = fixture("bert-finetune-pytorchjob.validate.json");
        let object = &review["request"]["object"];
        let kind = policy
            .workloads
            .kind("kubeflow.org", "v1", "PyTorchJob")
            .unwrap();
        let found = templates(kind, object);
        let labels: Vec<_> = found.iter().map(|t| t.label.clone().unwrap()).collect();
        assert_eq!(labels, ["replica Master", "replica Worker"]);
        assert_eq!(
            found[1].pointer,
            "/spec/pytorchReplicaSpecs/Worker/template"
        );
        let pod = pod_of(kind, &found[1], "bert-finetune", "ml").unwrap();
        let l = pod.metadata.labels.unwrap();
        assert_eq!(l["training.kubeflow.org/job-name"], "bert-finetune");
        assert_eq!(l["training.kubeflow.org/replica-type"], "worker");
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ml"));
        assert_eq!(
            pod.metadata.generate_name.as_deref(),
            Some("bert-finetune-")
        );
        assert_eq!(
            pod.spec.unwrap().init_containers.unwrap()[0].name,
            "fetch-shards"
        );

        let job = policy.workloads.kind("batch", "v1", "Job").unwrap();
        let review = fixture("hparam-trial-job.mutate.json");
        let found = templates(job, &review["request"]["object"]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].label, None, "a Job's one template needs no name");
    }
}

//! Shared pieces of the fuzz targets: generated policies, a structure-aware editor of
//! AdmissionReview JSON trees, and the invariants every review must keep.

use arbitrary::{Result, Unstructured};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{json, Value};
use tollgate_core::{review_bytes, Mode, Operation, Policy, SidecarMode, Stage};

pub const DEFAULT_POLICY: &str = include_str!("../../policies/default.yaml");

/// The apiserver fixtures (`tests/fixtures/apiserver-v1.36`), the structure-aware targets'
/// starting points.
pub const FIXTURES: &[&str] = &[
    include_str!("../../tests/fixtures/apiserver-v1.36/debug-shell.mutate.json"),
    include_str!("../../tests/fixtures/apiserver-v1.36/dryrun-helper.mutate.json"),
    include_str!("../../tests/fixtures/apiserver-v1.36/notebook-helper.mutate.json"),
    include_str!("../../tests/fixtures/apiserver-v1.36/preprocess-abcde.mutate.json"),
    include_str!("../../tests/fixtures/apiserver-v1.36/preprocess-abcde.update.validate.json"),
    include_str!("../../tests/fixtures/apiserver-v1.36/resnet50-master-0.mutate.json"),
    include_str!("../../tests/fixtures/apiserver-v1.36/resnet50-worker-generatename.mutate.json"),
];

pub fn default_policy() -> Policy {
    Policy::from_text("policies/default.yaml", DEFAULT_POLICY).expect("shipped policy loads")
}

const QUANTITIES: &[&str] = &[
    "0",
    "1",
    "2",
    "8",
    "-1",
    "100m",
    "500m",
    "1500m",
    "0.5",
    "1e3",
    "1E-3",
    "4Gi",
    "64Mi",
    "1000M",
    "1Ei",
    "8Ei",
    "999999999999999999999999999999",
    "1.000000000000000000001",
    "147573952589676412927Ei",
    "0.000000000000000000001Ei",
    "lots",
    "",
    "1n",
    "+1",
];
const RESOURCES: &[&str] = &[
    "cpu",
    "memory",
    "nvidia.com/gpu",
    "amd.com/gpu",
    "example.com/fpga",
    "hugepages-2Mi",
    "ephemeral-storage",
    "gpu.intel.com/i915",
    "kubernetes.io/x",
    "requests.nvidia.com/gpu",
];
const KEYS: &[&str] = &[
    "resources",
    "requests",
    "limits",
    "env",
    "name",
    "value",
    "valueFrom",
    "volumeMounts",
    "mountPath",
    "volumes",
    "hostPath",
    "path",
    "type",
    "ports",
    "containerPort",
    "protocol",
    "restartPolicy",
    "initContainers",
    "containers",
    "ephemeralContainers",
    "annotations",
    "labels",
    "tolerations",
    "key",
    "operator",
    "effect",
    "spec",
    "metadata",
    "name",
    "generateName",
    "image",
    "subResource",
    "operation",
    "userInfo",
    "groups",
    "username",
    "namespace",
    "dryRun",
    "object",
    "oldObject",
    "readOnly",
    "emptyDir",
    "fieldRef",
    "tollgate.dev/opt-out",
    "tollgate.dev/training",
    "tollgate.dev/applied",
    "batch.kubernetes.io/job-name",
    "prometheus.io/port",
    "prometheus.io/scrape",
];
const STRINGS: &[&str] = &[
    "",
    "true",
    "TRUE",
    "false",
    "Always",
    "Never",
    "TCP",
    "UDP",
    "tollgate-nvidia-driver",
    "tollgate-metrics",
    "tollgate-x",
    "/usr/local/nvidia",
    "/usr/local/nvidia/",
    "/data",
    "LD_LIBRARY_PATH",
    "/usr/local/nvidia/lib64",
    "NoSchedule",
    "NoExecute",
    "Exists",
    "Equal",
    "CREATE",
    "UPDATE",
    "DELETE",
    "CONNECT",
    "system:masters",
    "Pod",
    "Deployment",
    "a/b~c",
    "tolerations,default-resources",
    "driver-mounts",
    "metrics-sidecar",
    "ml",
    "kube-system",
    "quay.io/prometheus/statsd-exporter:v0.28.0",
    "9102",
    "ephemeralcontainers",
    "status",
    "admission.k8s.io/v1",
    "AdmissionReview",
    "v1",
    "tg-metrics",
    "tg-statsd",
];

fn leaf(u: &mut Unstructured<'_>) -> Result<Value> {
    Ok(match u.int_in_range(0..=12)? {
        0..=2 => json!(*u.choose(QUANTITIES)?),
        3..=5 => json!(*u.choose(STRINGS)?),
        6 => json!(*u.choose(RESOURCES)?),
        7 => json!(u.arbitrary::<String>()?),
        8 => json!(*u.choose(&[0i64, 1, -1, 9102, 9125, 65535, 65536, i64::MAX, i64::MIN])?),
        9 => json!(u.arbitrary::<f64>()?),
        10 => json!(u.arbitrary::<bool>()?),
        11 => Value::Null,
        _ => {
            if u.arbitrary()? {
                json!({})
            } else {
                json!([])
            }
        }
    })
}

/// A plausible piece of a pod: what tollgate reads and writes.
fn snippet(u: &mut Unstructured<'_>) -> Result<Value> {
    let mut resources = serde_json::Map::new();
    for part in ["requests", "limits"] {
        if u.arbitrary()? {
            let mut m = serde_json::Map::new();
            for _ in 0..u.int_in_range(0..=3)? {
                m.insert(
                    (*u.choose(RESOURCES)?).into(),
                    json!(*u.choose(QUANTITIES)?),
                );
            }
            resources.insert(part.into(), Value::Object(m));
        }
    }
    let name = if u.arbitrary()? {
        json!(*u.choose(STRINGS)?)
    } else {
        json!(format!("c{}", u.int_in_range(0..=3u8)?))
    };
    Ok(match u.int_in_range(0..=6)? {
        0 => json!({"name": name, "image": "x", "resources": resources}),
        1 => Value::Object(resources),
        2 => json!({"name": name, "mountPath": *u.choose(STRINGS)?}),
        3 => json!({"name": name, "hostPath": {"path": *u.choose(STRINGS)?}}),
        4 => json!({"name": *u.choose(&["LD_LIBRARY_PATH", "A"])?, "value": *u.choose(STRINGS)?}),
        5 => json!({"name": name, "containerPort": *u.choose(&[9102, 9125, 80])?,
                    "protocol": *u.choose(&["TCP", "UDP"])?}),
        _ => json!({"key": *u.choose(RESOURCES)?, "operator": *u.choose(STRINGS)?,
                    "effect": *u.choose(STRINGS)?}),
    })
}

fn paths(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                paths(c, p.clone(), out);
                out.push(p);
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                let p = format!("{at}/{i}");
                paths(c, p.clone(), out);
                out.push(p);
            }
        }
        _ => {}
    }
}

fn parent(p: &str) -> (&str, String) {
    let (a, b) = p.rsplit_once('/').unwrap_or(("", p));
    (a, b.replace("~1", "/").replace("~0", "~"))
}

/// Applies a few random edits to a JSON tree: replace, remove, insert, duplicate, graft.
pub fn edit(u: &mut Unstructured<'_>, root: &mut Value) -> Result<()> {
    let n = u.int_in_range(0..=8)?;
    for _ in 0..n {
        let mut all = vec![String::new()];
        paths(root, String::new(), &mut all);
        // Favour the pod: most of the envelope is uninteresting.
        let focus: Vec<&String> = all.iter().filter(|p| p.contains("/spec")).collect();
        let target = if !focus.is_empty() && u.ratio(3, 4)? {
            (*u.choose(&focus)?).clone()
        } else {
            u.choose(&all)?.clone()
        };
        match u.int_in_range(0..=5)? {
            0 => {
                let v = leaf(u)?;
                if let Some(t) = root.pointer_mut(&target) {
                    *t = v;
                }
            }
            1 => {
                let (par, key) = parent(&target);
                match root.pointer_mut(par) {
                    Some(Value::Object(m)) => {
                        m.remove(&key);
                    }
                    Some(Value::Array(a)) => {
                        if let Ok(i) = key.parse::<usize>() {
                            if i < a.len() {
                                a.remove(i);
                            }
                        }
                    }
                    _ => {}
                }
            }
            2 => {
                let key = if u.arbitrary()? {
                    (*u.choose(KEYS)?).to_owned()
                } else {
                    (*u.choose(RESOURCES)?).to_owned()
                };
                let v = if u.arbitrary()? {
                    snippet(u)?
                } else {
                    leaf(u)?
                };
                if let Some(Value::Object(m)) = root.pointer_mut(&target) {
                    m.insert(key, v);
                }
            }
            3 => {
                if let Some(Value::Array(a)) = root.pointer_mut(&target) {
                    if let Some(first) = a.first().cloned() {
                        a.push(first);
                    } else {
                        a.push(snippet(u)?);
                    }
                }
            }
            4 => {
                let v = snippet(u)?;
                match root.pointer_mut(&target) {
                    Some(Value::Array(a)) => a.push(v),
                    Some(t) => *t = v,
                    None => {}
                }
            }
            _ => {
                let from = u.choose(&all)?;
                if let Some(v) = root.pointer(from).cloned() {
                    if let Some(t) = root.pointer_mut(&target) {
                        if !target.starts_with(from.as_str()) {
                            *t = v;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// A policy with random toggles over the shipped one.
pub fn policy(u: &mut Unstructured<'_>) -> Result<Policy> {
    let mut p = default_policy();
    let m = &mut p.mutation;
    m.gpu_tolerations.enabled = u.ratio(4, 5)?;
    m.driver_mounts.enabled = u.ratio(4, 5)?;
    m.metrics_sidecar.enabled = u.ratio(4, 5)?;
    m.default_resources.enabled = u.ratio(4, 5)?;
    if u.arbitrary()? {
        m.metrics_sidecar.mode = SidecarMode::Classic;
    }
    if u.ratio(1, 4)? {
        m.operations.push(Operation::Update);
    }
    if u.arbitrary()? {
        for r in ["cpu", "memory", "ephemeral-storage"] {
            if u.arbitrary()? {
                let q = *u.choose(&["1", "500m", "8", "64Gi", "1Gi", "3"])?;
                m.default_resources
                    .per_gpu
                    .insert(r.into(), Quantity(q.into()));
            }
        }
    }
    if u.ratio(1, 4)? {
        m.default_resources.limits.remove("memory");
    }
    if u.ratio(1, 5)? {
        m.default_resources
            .limits
            .insert("ephemeral-storage".into(), Quantity("10Gi".into()));
    }
    p.gpu.all_extended_resources = u.arbitrary()?;
    p.validation.mode = *u.choose(&[Mode::Enforce, Mode::Warn, Mode::Audit])?;
    p.validation.required_requests.clear();
    for r in ["cpu", "memory", "ephemeral-storage", "nvidia.com/gpu"] {
        if u.ratio(2, 3)? {
            p.validation.required_requests.push(r.into());
        }
    }
    if u.ratio(1, 4)? {
        p.opt_out.groups.clear();
    }
    Ok(p)
}

/// The invariants of a mutating review of `review` (a JSON AdmissionReview): the patch
/// applies to the object sent; a valid pod stays valid; a second pass patches nothing.
pub fn check_mutation(policy: &Policy, review: &Value) {
    let body = serde_json::to_vec(review).expect("a Value serialises");
    let Ok(reviewed) = review_bytes(Stage::Mutate, policy, &body) else {
        return;
    };
    let _ = reviewed.to_json();
    let Some(patch) = reviewed.patch() else {
        return;
    };
    let patch = &patch;
    let object = review
        .pointer("/request/object")
        .cloned()
        .expect("a patch means there was an object");
    let mut patched = object.clone();
    if let Err(e) = json_patch::patch(&mut patched, patch) {
        panic!("patch does not apply: {e}\npatch: {patch:?}\nobject: {object}");
    }
    // The review reads past what it does not use (a malformed managedFields, say); such an
    // object is no typed Pod before or after, and has no validity to keep.
    if let Ok(before) = serde_json::from_value::<Pod>(object.clone()) {
        let after: Pod = match serde_json::from_value(patched.clone()) {
            Ok(p) => p,
            Err(e) => panic!("patched object is no longer a Pod: {e}\n{patched}"),
        };
        check_still_valid(&before, &after, &object);
    }
    let mut again = review.clone();
    again["request"]["object"] = patched.clone();
    let body = serde_json::to_vec(&again).unwrap();
    let second = review_bytes(Stage::Mutate, policy, &body).expect("second pass parses");
    assert!(
        second.patch().is_none(),
        "second pass patched again: {:?}\nfirst: {patch:?}\nobject: {object}",
        second.patch()
    );
}

fn check_still_valid(before: &Pod, after: &Pod, object: &Value) {
    if tollgate_core::pod_problems(before).is_empty() {
        let p = tollgate_core::pod_problems(after);
        assert!(
            p.is_empty(),
            "mutation made a valid pod invalid: {p:?}\n{object}"
        );
    }
}

/// Both endpoints on a review: no panic, and the mutation invariants.
pub fn check_review(policy: &Policy, review: &Value) {
    check_mutation(policy, review);
    let body = serde_json::to_vec(review).unwrap();
    if let Ok(r) = review_bytes(Stage::Validate, policy, &body) {
        let _ = r.to_json();
    }
}

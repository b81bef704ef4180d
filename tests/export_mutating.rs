//! The exported MutatingAdmissionPolicies make, in the real apiserver, what the mutating
//! webhook makes (tests/common/envtest.rs: kube-apiserver v1.36).
//!
//! Each policy of the goldens (the shipped one and every case's `policy.yaml`) is a world
//! of its own: its namespace names and globs under a prefix of its own
//! (`admission::policy_under`), its exported MutatingAdmissionPolicies and
//! ValidatingAdmissionPolicies (no webhook) installed with their namespaceSelector
//! narrowed to the world's label, so that all are in force at once in the shared
//! apiserver and touch no other test's pods. Every golden pod and a set of generated pods
//! (tests/mutation_props.rs's generator) are created with `dryRun=All` as their
//! requesters, in a namespace named after the case's (prefixed, with its context's
//! labels), and compared with the webhook's answer on the same request (the engine's
//! `/mutate` patch, applied as the apiserver applies it: the goldens hold the engine, the
//! HTTP server and the CLI to one answer, and tests/e2e.rs holds the real webhook to it):
//!
//! - created or refused alike: the pod as the policies leave it, against the pod as the
//!   webhook mutates it, both judged by the exported ValidatingAdmissionPolicies;
//! - stored alike, field by field: the pod the policies made against the webhook's pod
//!   as the apiserver stores it (created with `dryRun=All` in a namespace no policy
//!   selects), but for what the apiserver makes anew per object (uid, timestamps,
//!   managedFields, a generated name) and the order of tolerations (the apiserver's own
//!   come before tollgate's when admission adds them, after them when the webhook's
//!   result is created as it is);
//! - idempotent: the webhook's pod sent again through the policies comes back as it went
//!   in (`reinvocationPolicy: IfNeeded` runs them again whenever another plugin changes
//!   the pod);
//! - what the export leaves to the webhook (a pod with DRA claims, a pod with pod-level
//!   resources) is left alone: stored as sent.

use crate::common;
use crate::common::admission::{self, Answer};
use crate::common::rng::Rng;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use tollgate_core::{
    mutating_admission_policy, review_bytes_with, validating_admission_policy, ExportOptions,
    Objects, Policy, Stage,
};

/// The label that puts a namespace in one world.
const WORLD: &str = "tollgate-map-test";
/// Generated pods sent through the shipped policy's world.
const GENERATED: u64 = 60;

struct World {
    tag: String,
    prefix: String,
    policy: Policy,
}

struct Case {
    what: String,
    world: usize,
    namespace: String,
    labels: Value,
    pod: Value,
    user: Option<(String, Vec<String>)>,
}

/// The export's objects for a world: selecting only its namespaces, named after it.
fn world_objects(w: &World) -> Vec<Value> {
    let options = ExportOptions {
        namespace_selector: serde_json::from_value(json!({"matchLabels": {WORLD: w.tag}})).unwrap(),
        source: w.tag.clone(),
        ..Default::default()
    };
    let mut out = vec![];
    for e in [
        mutating_admission_policy(&w.policy, &options),
        validating_admission_policy(&w.policy, &options),
    ] {
        for o in e.objects {
            let mut v: Value = serde_saphyr::from_str(&o.yaml).unwrap();
            let name = format!("{}.{}", w.tag, v["metadata"]["name"].as_str().unwrap());
            v["metadata"]["name"] = json!(name);
            if v["spec"]["policyName"].is_string() {
                v["spec"]["policyName"] = json!(name);
            }
            out.push(v);
        }
    }
    out
}

/// What the apiserver makes anew per object gone, and tolerations in one order.
fn comparable(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v["metadata"].as_object_mut() {
        for k in [
            "uid",
            "creationTimestamp",
            "resourceVersion",
            "managedFields",
            "namespace",
            "generation",
        ] {
            m.remove(k);
        }
        if m.contains_key("generateName") {
            m.remove("name");
        }
    }
    if let Some(t) = v["spec"]["tolerations"].as_array_mut() {
        t.sort_by_key(|x| x.to_string());
    }
    v
}

/// The webhook's answer to the pod: the engine's `/mutate` patch applied to it.
fn webhook(policy: &Policy, case: &Case) -> Value {
    let mut cluster = Objects::complete();
    let mut labels: BTreeMap<String, String> =
        serde_json::from_value(case.labels.clone()).unwrap_or_default();
    labels.insert("kubernetes.io/metadata.name".into(), case.namespace.clone());
    cluster.add_namespace(
        serde_json::from_value(json!({"metadata": {"name": case.namespace, "labels": labels}}))
            .unwrap(),
    );
    let (user, groups) = case
        .user
        .clone()
        .unwrap_or_else(|| ("admin".into(), vec!["system:masters".into()]));
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": case.namespace,
            "operation": "CREATE",
            "userInfo": {"username": user, "groups": groups},
            "object": case.pod,
        }
    });
    let body = serde_json::to_vec(&review).unwrap();
    let reviewed = review_bytes_with(Stage::Mutate, policy, &cluster, &body).unwrap();
    let mut pod = case.pod.clone();
    if let Some(p) = reviewed.patch() {
        json_patch::patch(&mut pod, &p).unwrap();
    }
    pod
}

/// Whether the export leaves the pod to the webhook, as its notes say: DRA claims,
/// pod-level resources, a share or a fraction of a GPU (a class's `shares`, `fractions`),
/// and, where the policy mounts a driver or adds the sidecar, a namespace whose Pod
/// Security is baseline or restricted in any mode.
fn left_to_webhook(policy: &Policy, case: &Case) -> bool {
    let pod = &case.pod;
    if pod["spec"]["resourceClaims"]
        .as_array()
        .is_some_and(|c| !c.is_empty())
        || pod["spec"].get("resources").is_some()
    {
        return true;
    }
    let containers = ["initContainers", "containers"]
        .iter()
        .flat_map(|l| pod["spec"][l].as_array().into_iter().flatten());
    let asked: Vec<&str> = containers
        .flat_map(|c| {
            ["requests", "limits"]
                .iter()
                .flat_map(move |k| c["resources"][k].as_object().into_iter().flatten())
                .map(|(r, _)| r.as_str())
        })
        .collect();
    let scheduler = pod["spec"]["schedulerName"]
        .as_str()
        .unwrap_or("default-scheduler");
    for class in policy.gpu.classes.values() {
        if asked.iter().any(|r| class.is_share(r)) {
            return true;
        }
        if let Some(f) = &class.fractions {
            if f.scheduler_names.iter().any(|s| s == scheduler)
                && f.annotations
                    .iter()
                    .any(|a| pod["metadata"]["annotations"].get(a).is_some())
            {
                return true;
            }
        }
    }
    let m = &policy.mutation;
    let adds = m.metrics_sidecar.enabled
        || (m.driver_mounts.enabled
            && policy.gpu.classes.values().any(|c| {
                // hostPath, and auto by its fallback: what the export mounts.
                match c.driver.as_str() {
                    "hostPath" => true,
                    "auto" => c.driver_fallback.is_none_or(|f| f.as_str() != "runtime"),
                    _ => false,
                }
            }));
    let level = |mode: &str| case.labels[format!("pod-security.kubernetes.io/{mode}")].as_str();
    let strict = |l: Option<&str>| matches!(l, Some("baseline" | "restricted"));
    adds && (["enforce", "warn", "audit"]
        .iter()
        .any(|m| strict(level(m)))
        || level("enforce").is_some_and(|l| !matches!(l, "privileged" | "baseline" | "restricted")))
}

fn golden_worlds_and_cases() -> (Vec<World>, Vec<Case>) {
    let mut paths: Vec<PathBuf> = vec![];
    let mut worlds: Vec<World> = vec![];
    let mut cases = vec![];
    for case in common::golden::cases() {
        if case.dir.join("workload.yaml").exists() {
            continue;
        }
        let review = case.review();
        if review["request"]["kind"]["kind"] != "Pod" || review["request"]["operation"] != "CREATE"
        {
            continue;
        }
        let path = case.policy_path();
        let world = match paths.iter().position(|p| *p == path) {
            Some(i) => i,
            None => {
                let i = worlds.len();
                let prefix = format!("mapw{i}-");
                worlds.push(World {
                    tag: format!("mapw{i}"),
                    policy: admission::policy_under(Some(&path), &prefix),
                    prefix,
                });
                paths.push(path);
                i
            }
        };
        let ns = format!(
            "{}{}",
            worlds[world].prefix,
            review["request"]["namespace"].as_str().unwrap_or("default")
        );
        let labels = case
            .context()
            .into_iter()
            .find(|d| {
                d["kind"] == "Namespace" && d["metadata"]["name"] == review["request"]["namespace"]
            })
            .map_or(json!({}), |d| d["metadata"]["labels"].clone());
        let (user, groups) = case.requester();
        if !admission::sendable(&user) || groups.iter().any(|g| !admission::sendable(g)) {
            continue;
        }
        let mut pod = review["request"]["object"].clone();
        pod["metadata"]["namespace"] = json!(ns);
        cases.push(Case {
            what: format!("golden case {}", case.name),
            world,
            namespace: ns,
            labels: if labels.is_object() {
                labels
            } else {
                json!({})
            },
            pod,
            user: (!user.is_empty()).then_some((user, groups)),
        });
    }
    (worlds, cases)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apiserver_stores_pods_as_the_webhook_does() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let started = Instant::now();
    let (worlds, mut cases) = golden_worlds_and_cases();
    // Generated pods, under the shipped policy's world (the first golden's is the
    // shipped policy when no policy.yaml is given; found by its tag below).
    let shipped = worlds
        .iter()
        .position(|w| {
            w.policy.gpu == Policy::builtin().gpu && w.policy.mutation == Policy::builtin().mutation
        })
        .expect("a golden case under the shipped policy");
    for seed in 0..GENERATED {
        let mut pod = crate::mutation_props::gen_pod(&mut Rng::new(seed));
        let ns = format!("{}ml", worlds[shipped].prefix);
        pod["metadata"]["namespace"] = json!(ns);
        cases.push(Case {
            what: format!("generated pod, seed {seed}"),
            world: shipped,
            namespace: ns,
            labels: json!({}),
            pod,
            user: None,
        });
    }
    let admin = cp.client("admin").await;
    // The namespaces, exactly named (the policies match names and globs), and a plain
    // one no policy selects.
    let plain = cp.namespace("map-plain", &[]).await;
    let mut made: Vec<String> = vec![];
    let namespaces = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone());
    for c in &cases {
        if made.contains(&c.namespace) {
            continue;
        }
        let mut labels = c.labels.clone();
        labels[WORLD] = json!(worlds[c.world].tag);
        let ns =
            serde_json::from_value(json!({"metadata": {"name": c.namespace, "labels": labels}}))
                .unwrap();
        namespaces.create(&Default::default(), &ns).await.unwrap();
        admission::let_anyone_create_pods(&admin, &c.namespace).await;
        made.push(c.namespace.clone());
    }
    let mut installed = vec![];
    for w in &worlds {
        for o in world_objects(w) {
            admission::create(&admin, &o, false)
                .await
                .unwrap_or_else(|e| {
                    panic!("world {}: {} refused: {e}", w.tag, o["metadata"]["name"])
                });
            installed.push(o);
        }
    }
    // In force: a training pod of each world comes back with the applied annotation.
    for (i, w) in worlds.iter().enumerate() {
        let Some(c) = cases.iter().find(|c| c.world == i) else {
            continue;
        };
        let probe = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe", "annotations": {"tollgate.dev/training": "true"},
                "labels": {"batch.kubernetes.io/job-name": "probe"}},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}});
        let key = w.policy.mutation.applied_annotation.clone();
        loop {
            let a = admission::dry_run_pod(&admin, &c.namespace, &probe, None).await;
            if a.object
                .as_ref()
                .is_some_and(|o| o["metadata"]["annotations"].get(&key).is_some())
                || started.elapsed() > Duration::from_secs(60)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let worlds = &worlds;
    let plain = &plain;
    let results = common::apiserver::each(cases, |c| {
        let admin = admin.clone();
        async move {
            let policy = &worlds[c.world].policy;
            let expected = if left_to_webhook(policy, &c) {
                c.pod.clone()
            } else {
                webhook(policy, &c)
            };
            let as_user = c.user.as_ref().map(|(u, g)| (u.as_str(), g.as_slice()));
            let sent = admission::dry_run_pod(&admin, &c.namespace, &c.pod, as_user).await;
            let again = admission::dry_run_pod(&admin, &c.namespace, &expected, as_user).await;
            let mut stored_plain = expected.clone();
            stored_plain["metadata"]["namespace"] = json!(plain);
            let plain_answer = admission::dry_run_pod(&admin, plain, &stored_plain, None).await;
            (c, expected, sent, again, plain_answer)
        }
    })
    .await;
    let mut failures = vec![];
    let (mut compared, mut refused, mut left) = (0, 0, 0);
    for (c, expected, sent, again, plain_answer) in &results {
        let show = |a: &Answer| {
            a.object.as_ref().map_or_else(
                || format!("refused: {:?}", a.message),
                |o| serde_json::to_string(&comparable(o)).unwrap(),
            )
        };
        if sent.allowed() != again.allowed() {
            failures.push(format!(
                "{}: created or refused otherwise: through the policies {}, the webhook's pod {}",
                c.what,
                show(sent),
                show(again)
            ));
            continue;
        }
        if !sent.allowed() {
            refused += 1;
            continue;
        }
        let Some(webhooks) = plain_answer.object.as_ref() else {
            failures.push(format!(
                "{}: the webhook's pod is refused: {:?}",
                c.what, plain_answer.message
            ));
            continue;
        };
        let want = comparable(webhooks);
        let got = comparable(sent.object.as_ref().unwrap());
        if got != want {
            failures.push(format!(
                "{}: stored otherwise than with the webhook\n  diff (policies -> webhook): {}\n  sent: {}\n  webhook: {}",
                c.what,
                serde_json::to_string(&json_patch::diff(&got, &want)).unwrap(),
                c.pod,
                expected
            ));
            continue;
        }
        let again = comparable(again.object.as_ref().unwrap());
        if again != want {
            failures.push(format!(
                "{}: not idempotent: the webhook's pod sent through the policies changed: {}",
                c.what,
                serde_json::to_string(&json_patch::diff(&want, &again)).unwrap()
            ));
            continue;
        }
        compared += 1;
        if left_to_webhook(&worlds[c.world].policy, c) {
            left += 1;
        }
    }
    admission::delete_all(&admin, &installed).await;
    eprintln!(
        "mutating admission policies: {} worlds, {compared} pods stored as with the webhook \
         ({left} of them left to it as sent), {refused} refused alike, in {:.1?}",
        worlds.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of {} disagree:\n{}",
        failures.len(),
        results.len(),
        failures.join("\n\n")
    );
    assert!(compared > 60, "{compared} pods compared");
}

/// `--static DIR`: a manifest-based admission bundle (KEP-5793): one folder per admission
/// plugin and nothing else, each file a policy with its binding, every object v1 and named
/// `*.static.k8s.io`, without parameters; a stale manifest removed; refused below 1.36.
#[test]
fn the_static_bundle_is_one_folder_per_plugin_of_static_v1_objects() {
    let dir = std::env::temp_dir().join(format!("tollgate-static-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("mutating-admission-policies")).unwrap();
    std::fs::write(dir.join("mutating-admission-policies/stale.yaml"), "x: 1\n").unwrap();
    for (what, folder, kinds) in [
        (
            "validating-admission-policy",
            "validating-admission-policies",
            [
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
            ],
        ),
        (
            "mutating-admission-policy",
            "mutating-admission-policies",
            ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"],
        ),
    ] {
        let out = common::bin::command()
            .args(["export", what, "--static"])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout.is_empty());
        let files: Vec<PathBuf> = std::fs::read_dir(dir.join(folder))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(!files.is_empty());
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
            assert_eq!(docs.len(), 2, "{}: a policy and its binding", f.display());
            for d in &docs {
                assert_eq!(d["apiVersion"], "admissionregistration.k8s.io/v1");
                assert!(kinds.contains(&d["kind"].as_str().unwrap()), "{d}");
                let name = d["metadata"]["name"].as_str().unwrap();
                assert!(name.ends_with(".static.k8s.io"), "{name}");
                assert!(
                    d["spec"].get("paramKind").is_none() && d["spec"].get("paramRef").is_none()
                );
                assert_eq!(
                    f.file_name().unwrap().to_str().unwrap(),
                    format!("{name}.yaml")
                );
            }
            assert_eq!(docs[1]["spec"]["policyName"], docs[0]["metadata"]["name"]);
        }
    }
    let mut top: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(
        top,
        [
            "mutating-admission-policies",
            "validating-admission-policies"
        ]
    );
    assert!(!dir.join("mutating-admission-policies/stale.yaml").exists());
    let out = common::bin::command()
        .args([
            "export",
            "mutating-admission-policy",
            "--kubernetes-version",
            "1.35",
            "--static",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("v1 objects only"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The manifest-based bundle (`export ... --static`) in force in a real apiserver started
/// with `ManifestBasedAdmissionControlConfig` and docs/operations.md's
/// AdmissionConfiguration (`envtest::static_admission_plane`, no webhook registered): in a
/// namespace labelled for enforcement a pod without requests is refused in the validating
/// webhook's words, a GPU training pod is stored mutated as the webhook would (the shipped
/// policy: the GPU toleration, the driver by its fallback, the sidecar, the applied
/// annotation), and the names the bundle took are the apiserver's own, refused to the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_static_bundle_is_in_force_in_a_gated_apiserver() {
    let Some(cp) = common::envtest::static_admission_plane() else {
        return;
    };
    let admin = cp.client("admin").await;
    let ns = cp
        .namespace("static", &[("tollgate.dev/enforce", "enabled")])
        .await;
    let bare = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "nb", "namespace": ns},
        "spec": {"containers": [{"name": "nb", "image": "jupyter"}]}});
    let a = admission::dry_run_pod(&admin, &ns, &bare, None).await;
    let message = a.message.clone().unwrap_or_default();
    assert!(a.object.is_none(), "admitted: {:?}", a.object);
    assert!(
        message.contains("validate.tollgate.static.k8s.io")
            && message.contains("container \"nb\" has no request for cpu and memory"),
        "{message}"
    );
    let gpu = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "t", "namespace": ns,
            "labels": {"batch.kubernetes.io/job-name": "j"}},
        "spec": {"containers": [{"name": "trainer", "image": "registry.example.com/trainer:1.0",
            "resources": {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
                "limits": {"nvidia.com/gpu": "1"}}}]}});
    let a = admission::dry_run_pod(&admin, &ns, &gpu, None).await;
    let stored = a
        .object
        .unwrap_or_else(|| panic!("refused: {:?}", a.message));
    // What the webhook makes of it, with no node known (the driver by its fallback).
    let mut case_pod = gpu.clone();
    case_pod["metadata"]["namespace"] = json!(ns);
    let expected = webhook(
        &Policy::builtin(),
        &Case {
            what: "static".into(),
            world: 0,
            namespace: ns.clone(),
            labels: json!({"tollgate.dev/enforce": "enabled"}),
            pod: case_pod,
            user: None,
        },
    );
    // Stored alike: the webhook's pod as the apiserver stores it where no policy selects
    // it (defaulted the same way).
    let plain = cp.namespace("static-plain", &[]).await;
    let mut elsewhere = expected.clone();
    elsewhere["metadata"]["namespace"] = json!(plain);
    let want = admission::dry_run_pod(&admin, &plain, &elsewhere, None)
        .await
        .object
        .expect("the webhook's pod stored where no policy selects it");
    assert_eq!(comparable(&stored), comparable(&want));
    assert!(
        stored["spec"]["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["key"] == "nvidia.com/gpu"),
        "{stored}"
    );
    assert!(
        stored["metadata"]["annotations"]["tollgate.dev/applied"]
            .as_str()
            .is_some_and(|a| a.contains("metrics-sidecar")),
        "{stored}"
    );
    // The bundle's names are reserved: the API refuses an object that takes one.
    let vap = json!({"apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "validate.tollgate.static.k8s.io"},
        "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE"], "resources": ["pods"]}]},
            "validations": [{"expression": "true"}]}});
    let refused = common::apiserver::create(&admin, &vap, true)
        .await
        .expect_err("a .static.k8s.io name taken through the API");
    assert!(
        refused
            .message
            .contains("reserved for static manifest-based configurations"),
        "{}",
        refused.message
    );
}

/// `--kubernetes-version 1.35`: the v1beta1 MutatingAdmissionPolicies (and their bindings)
/// of 1.34 and 1.35, taken by a real apiserver that serves that version
/// (`admissionregistration.k8s.io/v1beta1` turned on in the static plane's 1.36: the API
/// version 1.34 and 1.35 serve, not their binaries), their CEL compiled on create. Each goes in with `dryRun`: nothing is
/// left in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_v1beta1_export_is_taken_by_an_apiserver_that_serves_it() {
    let Some(cp) = common::envtest::static_admission_plane() else {
        return;
    };
    let admin = cp.client("admin").await;
    let options = ExportOptions {
        kubernetes_minor: 35,
        ..Default::default()
    };
    let export = mutating_admission_policy(&Policy::builtin(), &options);
    assert!(!export.objects.is_empty());
    for o in &export.objects {
        let v: Value = serde_saphyr::from_str(&o.yaml).unwrap();
        assert_eq!(
            v["apiVersion"], "admissionregistration.k8s.io/v1beta1",
            "{v}"
        );
        let stored = common::apiserver::create(&admin, &v, true)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{} {} refused: {}",
                    v["kind"], v["metadata"]["name"], e.message
                )
            });
        assert_eq!(stored["kind"], v["kind"]);
    }
}

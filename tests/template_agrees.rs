//! `tollgate review` and the real kube-apiserver agree on every workload (issue 47): a
//! workload's pod template is validated by the apiserver as a pod, after tollgate's
//! mutating webhook and before its validating one, so what review promises must be what
//! the apiserver, with tollgate registered as deploy/base registers it, does.
//!
//! - A Job whose template asks for `nvidia.com/gpu` in `requests` and sets no limit (as many
//!   training manifests do) is created: the mutating webhook gives its template limit =
//!   request, the job controller makes its pod, which tollgate mutates and the scheduler
//!   binds to a GPU node (on [`common::envtest::scheduling_plane`]); `tollgate review` of the
//!   same file says allowed, with the same template. A Deployment alike, its ReplicaSet's
//!   pod bound to the GPU node too. Opted out, the Job's pods get nothing from
//!   tollgate, and the apiserver and review refuse it in the same words.
//! - Generated workloads (the built-in kinds: Jobs, CronJobs, Deployments, StatefulSets,
//!   ReplicaSets, DaemonSets; and PyTorchJobs, JobSets, LeaderWorkerSets and Volcano Jobs
//!   on CRDs that check nothing, as tests/e2e.rs installs them: the apiserver validates
//!   their names, never their templates, which tollgate leaves as written) with extended resources with and without limits,
//!   requests above limits, pod-level resources, invalid names (the workload's, a
//!   container's, a resource's) and values, missing images
//!   and containers, init containers and native sidecars, opted out or not: each created
//!   with `dryRun=All` through the apiserver, and all of them reviewed by one `tollgate
//!   review` (files of 500). The verdicts are the same; where the apiserver's validation
//!   refuses, review names the same fields and says the same of each (the apiserver's
//!   causes: field and message); where tollgate's validating webhook refuses, review says
//!   the webhook's message. Seeded (a failure names its seed), as tests/mutation_props.rs
//!   is: 600 a run (3 s on an idle machine; 25 s on a loaded one); 3,000 once, no
//!   disagreement.

use crate::common;
use crate::common::rng::Rng;

use std::collections::BTreeSet;

use serde_json::{json, Value};

/// How many workloads a run generates.
const CASES: u64 = 600;

/// The built-in kinds whose templates the apiserver validates, and kinds of CRDs (installed
/// here as tests/e2e.rs installs them, every field unchecked: the apiserver validates their
/// names, never their templates), each with its apiVersion and plural.
const KINDS: &[(&str, &str, &str)] = &[
    ("batch/v1", "Job", "jobs"),
    ("batch/v1", "CronJob", "cronjobs"),
    ("apps/v1", "Deployment", "deployments"),
    ("apps/v1", "StatefulSet", "statefulsets"),
    ("apps/v1", "ReplicaSet", "replicasets"),
    ("apps/v1", "DaemonSet", "daemonsets"),
    ("kubeflow.org/v1", "PyTorchJob", "pytorchjobs"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets"),
    (
        "leaderworkerset.x-k8s.io/v1",
        "LeaderWorkerSet",
        "leaderworkersets",
    ),
    ("batch.volcano.sh/v1alpha1", "Job", "jobs"),
];

/// The kinds of CRDs of [`KINDS`].
fn custom() -> impl Iterator<Item = &'static (&'static str, &'static str, &'static str)> {
    KINDS
        .iter()
        .filter(|(api, ..)| !matches!(*api, "batch/v1" | "apps/v1"))
}

/// Installs the CRDs of [`KINDS`] (one there already, of tests/e2e.rs or an earlier run,
/// is kept) and waits until each serves.
async fn install_crds(admin: &kube::Client, namespace: &str) {
    for (api, kind, plural) in custom() {
        if let Err(e) =
            common::apiserver::create(admin, &crate::e2e::crd(api, kind, plural), false).await
        {
            assert_eq!(e.code, 409, "installing the CRD of {kind}: {}", e.message);
        }
    }
    for (api, kind, _) in custom() {
        let probe = json!({"apiVersion": api, "kind": kind,
            "metadata": {"name": "probe", "namespace": namespace}});
        common::net::until(&format!("the CRD of {kind} to serve"), async || {
            common::apiserver::create(admin, &probe, true).await.is_ok()
        })
        .await;
    }
}

/// `spec` (a pod spec) as the template of a workload of `kind` (of `api`) named `name`,
/// with `annotations` on the template.
fn workload(api: &str, kind: &str, name: &str, annotations: Value, mut spec: Value) -> Value {
    let labels = json!({"app": name});
    let batch = matches!((api, kind), ("batch/v1", "Job" | "CronJob"))
        || matches!(kind, "PyTorchJob" | "JobSet")
        || api.starts_with("batch.volcano.sh");
    spec["restartPolicy"] = json!(if batch { "Never" } else { "Always" });
    let template =
        json!({"metadata": {"labels": labels, "annotations": annotations}, "spec": spec});
    let body = match (api, kind) {
        ("batch/v1", "Job") => json!({"template": template}),
        ("batch/v1", "CronJob") => {
            json!({"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": template}}})
        }
        ("apps/v1", "DaemonSet") => {
            json!({"selector": {"matchLabels": labels}, "template": template})
        }
        ("apps/v1", _) => {
            json!({"replicas": 1, "selector": {"matchLabels": labels}, "template": template})
        }
        (_, "PyTorchJob") => json!({"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": template},
            "Worker": {"replicas": 2, "template": template}}}),
        (_, "JobSet") => json!({"replicatedJobs": [{"name": "workers", "replicas": 1,
            "template": {"spec": {"parallelism": 2, "template": template}}}]}),
        (_, "LeaderWorkerSet") => json!({"replicas": 1,
            "leaderWorkerTemplate": {"size": 2, "workerTemplate": template}}),
        _ => {
            json!({"minAvailable": 1, "tasks": [{"name": "worker", "replicas": 2, "template": template}]})
        }
    };
    json!({"apiVersion": api, "kind": kind, "metadata": {"name": name}, "spec": body})
}

/// Resources of one container: cpu and memory (with or without limits, a request above
/// its limit at times), an extended resource (with its limit, without, or another one),
/// hugepages, and now and then a value or a name the apiserver refuses.
fn container_resources(rng: &mut Rng, sidecar_or_init: bool, pod_level: bool) -> Value {
    let mut requests = serde_json::Map::new();
    let mut limits = serde_json::Map::new();
    if pod_level {
        // Within the pod's budget (its requests are 4 cpu and 8Gi): what the apiserver
        // holds containers to there is not what this test is about.
        if rng.chance(70) {
            requests.insert("cpu".into(), json!(rng.pick(&["100m", "500m"])));
        }
        if rng.chance(70) {
            requests.insert("memory".into(), json!(rng.pick(&["128Mi", "1Gi"])));
        }
    } else {
        for (name, values) in [
            ("cpu", ["100m", "500m", "1", "2", "4"]),
            ("memory", ["128Mi", "512Mi", "1Gi", "4Gi", "8Gi"]),
        ] {
            let request = rng.below(4);
            if rng.chance(70) {
                requests.insert(name.into(), json!(values[request]));
            }
            if rng.chance(40) {
                // At or above the request, but now and then below it.
                let limit = if rng.chance(15) {
                    rng.below(request.max(1))
                } else {
                    request + rng.below(values.len() - request)
                };
                limits.insert(name.into(), json!(values[limit]));
            }
        }
    }
    if rng.chance(if sidecar_or_init { 15 } else { 45 }) {
        let r = *rng.pick(&[
            "nvidia.com/gpu",
            "nvidia.com/gpu",
            "amd.com/gpu",
            "example.com/fpga",
        ]);
        let n = *rng.pick(&["1", "2"]);
        match rng.below(100) {
            // With its limit, as the apiserver wants it.
            0..=39 => {
                requests.insert(r.into(), json!(n));
                limits.insert(r.into(), json!(n));
            }
            // Requested without a limit: what tollgate mends where its pods get it.
            40..=74 => {
                requests.insert(r.into(), json!(n));
            }
            // A limit alone (the apiserver defaults the pod's request to it).
            75..=89 => {
                limits.insert(r.into(), json!(n));
            }
            // A request other than its limit.
            _ => {
                requests.insert(r.into(), json!("1"));
                limits.insert(r.into(), json!("2"));
            }
        }
    }
    if rng.chance(8) {
        requests.insert("hugepages-2Mi".into(), json!("4Mi"));
        if rng.chance(70) {
            limits.insert("hugepages-2Mi".into(), json!("4Mi"));
        }
        if rng.chance(50) {
            requests.remove("cpu");
            requests.remove("memory");
            limits.remove("cpu");
            limits.remove("memory");
        }
    }
    // Values and names the apiserver refuses.
    if rng.chance(4) {
        requests.insert("memory".into(), json!("-1"));
    }
    if rng.chance(3) {
        requests.insert("gpu".into(), json!("1"));
    }
    if rng.chance(3) {
        limits.insert("example.com/fpga".into(), json!("500m"));
        requests.insert("example.com/fpga".into(), json!("500m"));
    }
    let mut r = serde_json::Map::new();
    if !requests.is_empty() {
        r.insert("requests".into(), Value::Object(requests));
    }
    if !limits.is_empty() {
        r.insert("limits".into(), Value::Object(limits));
    }
    Value::Object(r)
}

/// A container named `name`: sometimes without its image, or with a name the apiserver
/// refuses.
fn container(rng: &mut Rng, name: &str, sidecar_or_init: bool, pod_level: bool) -> Value {
    let name = if rng.chance(4) {
        (*rng.pick(&["Trainer", "my_box", "-x"])).to_owned()
    } else {
        name.to_owned()
    };
    let mut c = json!({"name": name, "image": "registry.example.com/ml/train:1"});
    if rng.chance(3) {
        c.as_object_mut().unwrap().remove("image");
    }
    let resources = container_resources(rng, sidecar_or_init, pod_level);
    if resources.as_object().is_some_and(|r| !r.is_empty()) {
        c["resources"] = resources;
    }
    c
}

/// The `i`th generated workload, drawn from `seed`.
fn generate(seed: u64) -> Value {
    let mut rng = Rng::new(seed);
    let (api, kind, _) = *rng.pick(KINDS);
    let pod_level = rng.chance(12);
    let mut spec = json!({});
    let mut containers = vec![];
    let names = ["train", "worker", "eval"];
    let n = if rng.chance(3) { 0 } else { 1 + rng.below(2) };
    for name in names.iter().take(n) {
        containers.push(container(&mut rng, name, false, pod_level));
    }
    spec["containers"] = json!(containers);
    let mut init = vec![];
    if rng.chance(30) {
        init.push(container(&mut rng, "fetch", true, pod_level));
    }
    if rng.chance(30) {
        let mut s = container(&mut rng, "log-agent", true, pod_level);
        s["restartPolicy"] = json!("Always");
        init.push(s);
    }
    if rng.chance(3) {
        // A name taken twice.
        init.push(json!({"name": "train", "image": "busybox"}));
    }
    if !init.is_empty() {
        spec["initContainers"] = json!(init);
    }
    if pod_level {
        let mut r = json!({"requests": {"cpu": "4", "memory": "8Gi"}});
        if rng.chance(60) {
            r["limits"] = json!({"cpu": rng.pick(&["8", "2"]), "memory": "16Gi"});
        }
        spec["resources"] = r;
    }
    let annotations = if rng.chance(12) {
        json!({"tollgate.dev/opt-out": "true"})
    } else {
        json!({})
    };
    // Now and then a name the apiserver refuses for any object.
    let name = if rng.chance(4) {
        format!("W_{seed}")
    } else {
        format!("w{seed}")
    };
    workload(api, kind, &name, annotations, spec)
}

/// What the apiserver said of one workload: accepted, refused by its own validation (each
/// field it named, with what it said there), or by a webhook (its message).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Said {
    Accepted,
    Invalid(BTreeSet<(String, String)>),
    Denied(String),
}

const DENIED: &str = "denied the request: ";

fn apiserver_said(answer: Result<Value, common::apiserver::Refusal>) -> Said {
    match answer {
        Ok(_) => Said::Accepted,
        Err(r) => match r.message.find(DENIED) {
            Some(at) if r.message.starts_with("admission webhook") => {
                Said::Denied(r.message[at + DENIED.len()..].to_owned())
            }
            _ => Said::Invalid(r.said),
        },
    }
}

/// What `tollgate review -o json` said of one workload, in the same terms.
fn review_said(result: &Value) -> Said {
    if result["allowed"] == true {
        return Said::Accepted;
    }
    let invalid: BTreeSet<(String, String)> = result["invalid"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["field"].as_str()?.to_owned(),
                e["detail"].as_str()?.to_owned(),
            ))
        })
        .collect();
    if invalid.is_empty() {
        Said::Denied(result["message"].as_str().unwrap_or("").to_owned())
    } else {
        Said::Invalid(invalid)
    }
}

/// A tollgate server registered for the namespaces labelled for it on `cp`, and one such
/// namespace, webhooks in force.
async fn registered(
    cp: &common::envtest::ControlPlane,
    prefix: &str,
) -> Option<(common::process::Served, String, String)> {
    let rendered = common::rbac::render_if_kubectl("deploy/base")?;
    let admin = cp.client("admin").await;
    let served = tokio::task::spawn_blocking(|| {
        let (dir, ca) = common::process::workdir();
        common::process::serve(dir, ca, None, "json", &[])
    })
    .await
    .unwrap();
    let name = common::context::unique(prefix);
    for c in common::admission::registration(&rendered, &name, served.addr.port(), &served.ca_pem) {
        common::apiserver::create(&admin, &c, false)
            .await
            .unwrap_or_else(|e| panic!("registering {name}: {}", e.message));
    }
    let ns = cp
        .namespace(
            prefix,
            &[
                ("tollgate.dev/enforce", "enabled"),
                (common::admission::REGISTERED, &name),
            ],
        )
        .await;
    common::admission::until_reviewed(&admin, &served, &ns).await;
    Some((served, name, ns))
}

/// `tollgate review -o json` of `objects` (one run) in `namespace`, as the admin
/// (`system:masters`) the apiserver's requests come from: one result per object, in order.
fn review(objects: &[Value], namespace: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    // Files of at most 500 documents (review's reader takes at most 1,024 a file), all
    // given to one run, in order.
    let mut files = vec![];
    for (i, chunk) in objects.chunks(500).enumerate() {
        let file = dir.path().join(format!("workloads-{i:03}.yaml"));
        let text: Vec<String> = chunk.iter().map(|o| o.to_string()).collect();
        std::fs::write(&file, text.join("\n---\n")).unwrap();
        files.push(file);
    }
    let out = common::bin::command()
        .args(["review", "-o", "json", "--local", "--policy"])
        .arg(common::default_policy_path())
        .args([
            "--user",
            "admin",
            "--group",
            "system:masters",
            "-n",
            namespace,
        ])
        .args(&files)
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "tollgate review exited {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).expect("a list of results");
    assert_eq!(results.len(), objects.len(), "one result per object");
    results
}

#[tokio::test]
async fn review_and_the_apiserver_agree_on_generated_workloads() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let Some((_served, name, ns)) = registered(cp, "templates").await else {
        return;
    };
    let admin = cp.client("admin").await;
    install_crds(&admin, &ns).await;
    let started = std::time::Instant::now();
    let objects: Vec<Value> = (0..CASES).map(generate).collect();
    let sent: Vec<Value> = objects
        .iter()
        .map(|o| common::apiserver::for_create(o, &ns))
        .collect();
    let answers = common::apiserver::each(sent.clone(), |o| {
        let admin = admin.clone();
        async move { apiserver_said(common::apiserver::create(&admin, &o, true).await) }
    })
    .await;
    let through_the_apiserver = started.elapsed();
    let reviewed = review(&sent, &ns);
    let mut disagree = vec![];
    // Workloads accepted only because tollgate gave their templates a GPU's limit.
    let mut mended = 0;
    let mut seen = std::collections::BTreeMap::<&str, usize>::new();
    for (seed, ((object, api), result)) in objects.iter().zip(&answers).zip(&reviewed).enumerate() {
        let said = review_said(result);
        *seen
            .entry(match api {
                Said::Accepted => "accepted",
                Said::Invalid(_) => "invalid",
                Said::Denied(_) => "denied",
            })
            .or_default() += 1;
        let agree = match (api, &said) {
            (Said::Denied(a), Said::Denied(r)) => a == r || a.contains(r.as_str()),
            (a, r) => a == r,
        };
        if *api == Said::Accepted && result["patch"].to_string().contains("/resources/limits") {
            mended += 1;
        }
        if !agree {
            disagree.push(format!(
                "seed {seed}: the apiserver: {api:?}\nreview: {said:?} ({})\n{object}",
                result["message"]
            ));
        }
    }
    eprintln!(
        "template_agrees: {CASES} workloads through the apiserver in {through_the_apiserver:?}, and review, in {:?}: {seen:?}, {mended} accepted for the limits tollgate gave",
        started.elapsed()
    );
    assert!(
        disagree.is_empty(),
        "{} of {CASES} disagree:\n\n{}",
        disagree.len(),
        disagree.join("\n\n")
    );
    // The generator reaches all three answers.
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(mended > 0, "no workload needed the limits tollgate gives");
    common::admission::deregister(&admin, &name).await;
}

/// The Job of issue 47: `nvidia.com/gpu: 1` in `requests`, no limits; on the pool's node.
fn gpu_job(name: &str, pool: &common::context::Pool, annotations: Value) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"annotations": annotations},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"tollgate.test/pool": pool.name},
                "tolerations": [{"key": "tollgate.test/pool", "operator": "Equal",
                    "value": pool.name, "effect": "NoSchedule"}],
                "containers": [{"name": "train", "image": "registry.example.com/ml/train:1",
                    "resources": {"requests": {"nvidia.com/gpu": "1"}}}]
            }
        }}
    })
}

#[tokio::test]
async fn a_gpu_job_and_deployment_without_limits_are_created_and_their_pods_reach_a_gpu_node() {
    use common::scheduling::{self, Placement};
    let Some(cp) = common::envtest::scheduling_plane() else {
        return;
    };
    let Some((_served, name, ns)) = registered(cp, "gpu-job").await else {
        return;
    };
    let admin = cp.client("admin").await;
    let pool = common::context::Pool::new("gpujob");
    let node = pool.node("a100", "8", json!({}));
    scheduling::create_node(&admin, &node).await;

    let job = common::apiserver::for_create(&gpu_job("train-gpu", &pool, json!({})), &ns);
    let stored = common::apiserver::create(&admin, &job, false)
        .await
        .unwrap_or_else(|e| panic!("the GPU Job without limits is refused: {}", e.message));
    let limits = stored
        .pointer("/spec/template/spec/containers/0/resources")
        .cloned();
    assert_eq!(
        limits,
        Some(json!({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}})),
        "the stored template: the limit the apiserver requires, nothing else"
    );
    // review of the same file: allowed, with the template the apiserver stored.
    let reviewed = review(std::slice::from_ref(&job), &ns).remove(0);
    assert_eq!(reviewed["allowed"], true, "{reviewed:#}");
    assert_eq!(
        reviewed
            .pointer("/mutatedObject/spec/template/spec/containers/0/resources")
            .cloned(),
        limits
    );
    // Its pod: made by the job controller, mutated by tollgate, bound to the GPU node.
    let pods = scheduling::pods_of_job(cp, &admin, &ns, "train-gpu").await;
    let pod_name = pods[0].metadata.name.clone().unwrap();
    let resources = pods[0].spec.as_ref().unwrap().containers[0]
        .resources
        .clone()
        .unwrap();
    let pod_limits: Vec<(String, String)> = resources
        .limits
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    assert_eq!(
        pod_limits,
        [
            ("cpu".to_owned(), "2".to_owned()),
            ("memory".to_owned(), "4Gi".to_owned()),
            ("nvidia.com/gpu".to_owned(), "1".to_owned())
        ],
        "the pod's limits"
    );
    assert_eq!(
        scheduling::placement(cp, &admin, &ns, &pod_name).await,
        Placement::Bound(node["metadata"]["name"].as_str().unwrap().to_owned())
    );

    // A Deployment alike: its template gets the limit, the deployment controller's
    // ReplicaSet keeps it, and the ReplicaSet's pod reaches the GPU node.
    let mut deployment = workload(
        "apps/v1",
        "Deployment",
        "serve-gpu",
        json!({}),
        job["spec"]["template"]["spec"].clone(),
    );
    deployment = common::apiserver::for_create(&deployment, &ns);
    let stored = common::apiserver::create(&admin, &deployment, false)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the GPU Deployment without limits is refused: {}",
                e.message
            )
        });
    assert_eq!(
        stored
            .pointer("/spec/template/spec/containers/0/resources/limits")
            .cloned(),
        Some(json!({"nvidia.com/gpu": "1"}))
    );
    let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), &ns);
    let mut pod_name = String::new();
    common::net::until("a pod of the GPU Deployment", async || {
        let found = pods
            .list(&kube::api::ListParams::default().labels("app=serve-gpu"))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        match found.first().and_then(|p| p.metadata.name.clone()) {
            Some(n) => {
                pod_name = n;
                true
            }
            None => false,
        }
    })
    .await;
    assert_eq!(
        scheduling::placement(cp, &admin, &ns, &pod_name).await,
        Placement::Bound(node["metadata"]["name"].as_str().unwrap().to_owned())
    );

    // Opted out, its pods get nothing from tollgate: the apiserver refuses the Job, and
    // review says so in the same words.
    let opted = common::apiserver::for_create(
        &gpu_job(
            "train-gpu-opted-out",
            &pool,
            json!({"tollgate.dev/opt-out": "true"}),
        ),
        &ns,
    );
    let refused = common::apiserver::create(&admin, &opted, true)
        .await
        .expect_err("an opted-out GPU Job without limits is refused");
    let reviewed = review(std::slice::from_ref(&opted), &ns).remove(0);
    assert_eq!(reviewed["allowed"], false, "{reviewed:#}");
    assert_eq!(
        reviewed["message"].as_str(),
        Some(refused.message.as_str()),
        "review says what the apiserver says"
    );
    assert!(
        refused.message.contains("spec.template.spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources"),
        "{}",
        refused.message
    );
    common::admission::deregister(&admin, &name).await;
}

/// GitOps re-applies what is in Git: a GPU Job and Deployment without limits, applied
/// server-side twice as a GitOps tool's field manager, are stored once. The first apply
/// stores the limit tollgate gave; the second drops it (the manifest no longer has a field
/// its manager owns), the mutating webhook gives it back in the same request, and the
/// object is left as it was: same resourceVersion, no new generation.
#[tokio::test]
async fn a_server_side_re_apply_changes_nothing() {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let Some((_served, name, ns)) = registered(cp, "reapply").await else {
        return;
    };
    let admin = cp.client("admin").await;
    let spec = json!({"containers": [{"name": "train", "image": "registry.example.com/ml/train:1",
        "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "1", "memory": "1Gi"}}}]});
    for kind in ["Job", "Deployment"] {
        let object = common::apiserver::for_create(
            &workload(
                if kind == "Job" { "batch/v1" } else { "apps/v1" },
                kind,
                "gitops",
                json!({}),
                spec.clone(),
            ),
            &ns,
        );
        let api: Api<DynamicObject> =
            Api::namespaced_with(admin.clone(), &ns, &common::apiserver::resource_of(&object));
        let params = PatchParams::apply("gitops-tool").force();
        let first = api
            .patch("gitops", &params, &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("the first apply of the {kind}: {e}"));
        let first = serde_json::to_value(first).unwrap();
        assert_eq!(
            first
                .pointer("/spec/template/spec/containers/0/resources/limits")
                .cloned(),
            Some(json!({"nvidia.com/gpu": "1"})),
            "{kind}: {first:#}"
        );
        let second = api
            .patch("gitops", &params, &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("the second apply of the {kind}: {e}"));
        let second = serde_json::to_value(second).unwrap();
        assert_eq!(
            second["metadata"]["resourceVersion"], first["metadata"]["resourceVersion"],
            "{kind}: the re-apply stored a change: {second:#}"
        );
        assert_eq!(second["spec"], first["spec"], "{kind}");
    }
    common::admission::deregister(&admin, &name).await;
}

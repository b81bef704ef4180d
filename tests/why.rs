//! `tollgate why` and `kubectl tollgate`, against the real apiserver, scheduler and job
//! controller (`envtest::scheduling_plane`): a pod the scheduler cannot place (its reason
//! beside tollgate's feasibility verdict), a pod tollgate mutated, running (what changed
//! and which layer of the policy set it), a Job whose pods Pod Security refused (in its
//! words, from the job controller's FailedCreate events), a queued Job's Kueue Workload
//! (its conditions, written by hand as Kueue writes them); all read as a namespace's admin
//! where it matters, who may not read nodes (said, never fatal). The plugin is run by the
//! real `kubectl`, found on PATH as `kubectl-tollgate`.
//!
//! And `policy` and `audit` with the cluster's TollgatePolicy (`envtest::policy_objects_plane`):
//! read as the namespace's admin once the shipped `tollgate-policy-viewer` ClusterRole is
//! hers, and said (exit 3), never judged against the built-in policy, while it is not.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::context::{self, Pool};
use common::envtest::ControlPlane;
use common::scheduling::{self, Placement};
use serde_json::{json, Value};

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `tollgate ARGS --kubeconfig KUBECONFIG`.
fn tollgate(args: &[&str], kubeconfig: &Path) -> Output {
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.push("--kubeconfig".into());
    all.push(kubeconfig.display().to_string());
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    common::bin::run(&all, None)
}

/// `kubectl tollgate ARGS` run by the real kubectl, with this build's `kubectl-tollgate`
/// first on PATH; None (SKIPPED) where no kubectl can be had.
fn kubectl_tollgate(args: &[&str], kubeconfig: &Path) -> Option<Output> {
    let kubectl = common::tools::kubectl()?;
    let plugin = PathBuf::from(env!("CARGO_BIN_EXE_kubectl-tollgate"));
    let mut path = std::ffi::OsString::from(plugin.parent().unwrap());
    if let Some(p) = std::env::var_os("PATH") {
        path.push(":");
        path.push(p);
    }
    Some(
        std::process::Command::new(kubectl)
            .arg("tollgate")
            .args(args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env("PATH", path)
            .env("KUBECONFIG", common::bin::NO_KUBECONFIG)
            .output()
            .unwrap(),
    )
}

/// A namespace of the test's own whose admin is erin: everything in it, nothing
/// cluster-wide, as the built-in `admin` ClusterRole granted by a RoleBinding gives a team
/// (here as a Role of its own: `admin`'s rules are aggregated by a controller the plane
/// does not run).
async fn erins_namespace(cp: &ControlPlane, prefix: &str, labels: &[(&str, &str)]) -> String {
    let admin = cp.client("admin").await;
    let ns = cp.namespace(prefix, labels).await;
    context::create(
        &admin,
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "namespace-admin", "namespace": ns},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
        }),
    )
    .await;
    context::create(
        &admin,
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "erin-admin", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "namespace-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "erin"}],
        }),
    )
    .await;
    let erin = cp.client("erin").await;
    let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(erin, &ns);
    common::net::until("erin's RoleBinding in force", async || {
        pods.list(&Default::default()).await.is_ok()
    })
    .await;
    ns
}

/// The scheduling plane as tollgate is installed there: the policy objects' CRDs and
/// every user's read of the TollgatePolicy (the ClusterRole and ClusterRoleBinding
/// `tollgate-policy-viewer`), as deploy/base ships them; None (SKIPPED) without kubectl.
async fn scheduling_plane() -> Option<&'static ControlPlane> {
    let cp = common::envtest::scheduling_plane()?;
    common::policy::install_crds(cp).await?;
    let rendered = common::rbac::render_if_kubectl("deploy/base")?;
    let admin = cp.client("admin").await;
    for d in rendered
        .iter()
        .filter(|d| d["metadata"]["name"] == "tollgate-policy-viewer")
    {
        context::create_shared(&admin, d).await;
    }
    Some(cp)
}

/// A GPU pod confined to `pool`, asking for `gpus`, with requests.
fn gpu_pod(pool: &Pool, ns: &str, name: &str, gpus: &str) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "trainer", "image": "registry.example.com/ml/train:1",
                "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": gpus},
                    "limits": {"nvidia.com/gpu": gpus}}}]}
    });
    pool.confine(&mut pod["spec"]);
    pod
}

/// A pod the scheduler cannot place (9 GPUs, its pool's node has 8): `why` says the
/// scheduler's reason in its words and tollgate's feasibility verdict beside it, as the
/// admin (who may read the nodes) and through `kubectl tollgate`; as the namespace's admin,
/// who may not list nodes, it answers all the same and says what it could not read.
#[tokio::test]
async fn a_pod_the_scheduler_cannot_place() {
    let Some(cp) = scheduling_plane().await else {
        return;
    };
    let admin = cp.client("admin").await;
    let ns = erins_namespace(cp, "why-unplaced", &[]).await;
    let pool = Pool::new("why-unplaced");
    scheduling::create_node(&admin, &pool.node("gpu-0", "8", json!({}))).await;
    context::create(&admin, &gpu_pod(&pool, &ns, "nine", "9")).await;
    let Placement::Unschedulable(said) = scheduling::placement(cp, &admin, &ns, "nine").await
    else {
        panic!("a pod of 9 GPUs was bound to a node of 8");
    };

    let out = tollgate(&["why", "pod/nine", "-n", &ns], &cp.kubeconfig("admin"));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    // docs/troubleshooting.md shows this run.
    crate::docs::holds_example(
        "docs/troubleshooting.md",
        "kubectl tollgate why pod/nine -n ml",
        &text,
        &[(&ns, "ml")],
    );
    assert!(
        text.starts_with(&format!("pod {ns}/nine: Pending\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("not scheduled (Unschedulable): {said}")),
        "the scheduler's words: {said}\n{text}"
    );
    assert!(text.contains("Insufficient nvidia.com/gpu"), "{text}");
    assert!(
        text.contains("feasibility: its pods could never run here"),
        "tollgate's verdict beside it:\n{text}"
    );
    assert!(text.contains("FailedScheduling"), "{text}");

    // The machine form.
    let out = tollgate(
        &["why", "po", "nine", "-n", &ns, "-o", "json"],
        &cp.kubeconfig("admin"),
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&out), stderr(&out)));
    assert_eq!(v["object"]["kind"], "Pod");
    assert_eq!(v["pods"][0]["scheduled"]["reason"], "Unschedulable");
    assert_eq!(v["tollgate"]["verdict"]["feasibility"]["result"], "never");

    // As the plugin, run by kubectl, with its flags after the command.
    if let Some(out) = kubectl_tollgate(&["why", "pod/nine", "-n", &ns], &cp.kubeconfig("admin")) {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(
            stdout(&out).contains("Insufficient nvidia.com/gpu"),
            "{}",
            stdout(&out)
        );
        let help = kubectl_tollgate(&["why", "--help"], &cp.kubeconfig("admin")).unwrap();
        assert!(
            stdout(&help).contains("Usage: kubectl tollgate why [OPTIONS] <KIND/NAME>"),
            "{}",
            stdout(&help)
        );
    }

    // As the namespace's admin: no nodes to read, said; the scheduler's verdict all the same.
    let out = tollgate(&["why", "pod/nine", "-n", &ns], &cp.kubeconfig("erin"));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(
        text.contains(&format!("not scheduled (Unschedulable): {said}")),
        "{text}"
    );
    assert!(
        text.contains("could not read what feasibility needs: forbidden: list on nodes"),
        "{text}"
    );
    // Another namespace's pod: not hers to read.
    let out = tollgate(
        &["why", "pod/nine", "-n", "default"],
        &cp.kubeconfig("erin"),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("could not read pod default/nine: forbidden"),
        "{}",
        stderr(&out)
    );
}

/// A pod tollgate mutated (by the engine, as the webhook would have: `tollgate review`
/// with the namespace's TollgateProfile), then bound by the scheduler: `why` names what
/// changed, from its applied annotation, and the layer each step's values come from (the
/// namespace's TollgateProfile over the built-in policy), and has nothing left to add.
#[tokio::test]
async fn a_mutated_running_pod() {
    let Some(cp) = scheduling_plane().await else {
        return;
    };
    let admin = cp.client("admin").await;
    let ns = erins_namespace(cp, "why-mutated", &[]).await;
    let pool = Pool::new("why-mutated");
    let node = pool.node("gpu-0", "8", json!({}));
    scheduling::create_node(&admin, &node).await;
    let profile = json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "TollgateProfile",
        "metadata": {"name": "default", "namespace": ns},
        "spec": {"mutation": {"defaultResources": {"perGpu": {"memory": "96Gi"}}}},
    });
    context::create(&admin, &profile).await;

    // The pod as the mutating webhook makes it, with the same profile.
    let mut pod = gpu_pod(&pool, &ns, "bert", "1");
    pod["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.yaml");
    std::fs::write(
        &file,
        format!(
            "{}\n---\n{}\n",
            serde_json::to_string(&profile).unwrap(),
            serde_json::to_string(&pod).unwrap()
        ),
    )
    .unwrap();
    let out = common::bin::run(
        &[
            "review",
            file.to_str().unwrap(),
            "-o",
            "json",
            "--stage",
            "mutate",
        ],
        None,
    );
    let results: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&out), stderr(&out)));
    let mutated = results
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "Pod")
        .and_then(|r| r.get("mutatedPod"))
        .unwrap_or_else(|| panic!("{results:#}"))
        .clone();
    let applied = mutated["metadata"]["annotations"]["tollgate.dev/applied"]
        .as_str()
        .unwrap_or_else(|| panic!("{mutated:#}"))
        .to_owned();
    assert!(applied.contains("default-resources"), "{applied}");
    context::create(&admin, &mutated).await;
    assert!(matches!(
        scheduling::placement(cp, &admin, &ns, "bert").await,
        Placement::Bound(_)
    ));

    let out = tollgate(&["why", "pod/bert", "-n", &ns], &cp.kubeconfig("erin"));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    crate::docs::holds_example(
        "docs/troubleshooting.md",
        "kubectl tollgate why pod/bert -n ml",
        &text,
        &[
            (node["metadata"]["name"].as_str().unwrap(), "gpu-0"),
            (&ns, "ml"),
        ],
    );
    assert!(
        text.contains(&format!(
            "changed pod bert (tollgate.dev/applied={applied}):"
        )),
        "{text}"
    );
    assert!(
        text.starts_with(&format!(
            "pod {ns}/bert: Pending (bound to node {}",
            node["metadata"]["name"].as_str().unwrap()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "default-resources: mutation.defaultResources set by TollgateProfile {ns}/default over built-in"
        )),
        "{text}"
    );
    assert!(text.contains("scheduled on node"), "{text}");
    assert!(text.contains("would admit it as it is now"), "{text}");
    let out = tollgate(
        &["why", "pod/bert", "-n", &ns, "-o", "yaml"],
        &cp.kubeconfig("erin"),
    );
    let v: Value = serde_saphyr::from_str(&stdout(&out)).unwrap();
    let steps = v["tollgate"]["changed"][0]["steps"].as_array().unwrap();
    assert!(
        steps.iter().any(|s| s["step"] == "default-resources"
            && s["layers"] == json!(["built-in", format!("TollgateProfile {ns}/default")])),
        "{steps:#?}"
    );
    // Nothing left to add: no mutation finding.
    assert!(
        !v["tollgate"]["verdict"]["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["rule"] == "default-resources"),
        "{v:#?}"
    );
}

/// A Job whose pods the namespace's Pod Security level refuses: `why job/NAME` says it in
/// Pod Security's words, from the job controller's FailedCreate events.
#[tokio::test]
async fn a_job_whose_pods_pod_security_refused() {
    let Some(cp) = scheduling_plane().await else {
        return;
    };
    let admin = cp.client("admin").await;
    let ns = erins_namespace(
        cp,
        "why-psa",
        &[("pod-security.kubernetes.io/enforce", "baseline")],
    )
    .await;
    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "admin-caps", "namespace": ns},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "trainer", "image": "registry.example.com/trainer:1.0",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}}}
    });
    context::create(&admin, &job).await;
    let events = scheduling::failed_creates(cp, &admin, &ns, "admin-caps").await;

    let out = tollgate(
        &["why", "job/admin-caps", "-n", &ns],
        &cp.kubeconfig("erin"),
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    crate::docs::holds_example(
        "docs/troubleshooting.md",
        "kubectl tollgate why job/admin-caps -n ml",
        &text,
        &[(&ns, "ml")],
    );
    assert!(
        text.contains("pods never made (the controller's FailedCreate events):"),
        "{text}"
    );
    assert!(
        text.contains("job/admin-caps ")
            && text.contains(&format!("Pod Security refused: {}", events[0])),
        "{text}"
    );
    assert!(
        text.contains("violates PodSecurity \"baseline:latest\": non-default capabilities"),
        "{text}"
    );
    let out = tollgate(
        &["why", "jobs.batch", "admin-caps", "-n", &ns, "-o", "json"],
        &cp.kubeconfig("erin"),
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["reason"] == "FailedCreate")
        .unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(e["decidedBy"], "Pod Security");
    assert_eq!(v["pods"], json!([]));
}

/// A queued Job's Kueue Workload (made by hand, owned by the Job, with the conditions
/// Kueue writes when it cannot reserve quota): `why` says its conditions and reasons.
#[tokio::test]
async fn a_queued_jobs_kueue_workload() {
    let Some(cp) = scheduling_plane().await else {
        return;
    };
    let admin = cp.client("admin").await;
    context::install_crds(&admin, "tests/data/crds/kueue.yaml").await;
    let ns = erins_namespace(cp, "why-kueue", &[]).await;
    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "queued", "namespace": ns,
            "labels": {"kueue.x-k8s.io/queue-name": "team"}},
        "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "trainer", "image": "registry.example.com/trainer:1.0",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}
    });
    let created = common::apiserver::create(&admin, &job, false)
        .await
        .unwrap_or_else(|e| panic!("creating the Job: {}", e.message));
    let message = "couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor default, 1 more needed";
    context::create(
        &admin,
        &json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "job-queued-1a2b3", "namespace": ns,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "queued",
                    "uid": created["metadata"]["uid"], "controller": true}]},
            "spec": {"queueName": "team", "podSets": [{"name": "main", "count": 1}]},
            "status": {"conditions": [{"type": "QuotaReserved", "status": "False",
                "reason": "Pending", "message": message,
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }),
    )
    .await;

    let out = tollgate(&["why", "job", "queued", "-n", &ns], &cp.kubeconfig("erin"));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    crate::docs::holds_example(
        "docs/troubleshooting.md",
        "kubectl tollgate why job queued -n ml",
        &text,
        &[(&ns, "ml")],
    );
    assert!(
        text.starts_with(&format!("job {ns}/queued: suspended")),
        "{text}"
    );
    assert!(
        text.contains("kueue: workload job-queued-1a2b3 (queue team):\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!("  QuotaReserved=False (Pending): {message}\n")),
        "{text}"
    );
}

/// `policy -n` with a kubeconfig reads the cluster's TollgatePolicy and the namespace's
/// TollgateProfile, and says so; as a namespace's admin, who may not read the
/// TollgatePolicy, `policy` and `audit` say so and exit 3 rather than judge her profile
/// against the built-in policy; with the shipped `tollgate-policy-viewer` ClusterRole hers,
/// they read it. `--local` reads the files alone.
#[tokio::test]
async fn policy_and_audit_read_the_live_policy_objects() {
    let Some(cp) = common::envtest::policy_objects_plane() else {
        return;
    };
    if common::policy::install_crds(cp).await.is_none() {
        return;
    }
    let Some(rendered) = common::rbac::render_if_kubectl("deploy/base") else {
        return;
    };
    let _turn = common::policy::cluster_policy_turn().await;
    let admin = cp.client("admin").await;
    let ns = erins_namespace(cp, "why-policy", &[]).await;
    let policy = json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "TollgatePolicy",
        "metadata": {"name": "default"},
        "spec": {"feasibility": {"mode": "enforce"}, "namespaceProfiles": {"mayLoosen": ["validation"]}},
    });
    common::apiserver::create(&admin, &policy, false)
        .await
        .unwrap_or_else(|e| panic!("creating the TollgatePolicy: {}", e.message));
    let profile = json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "TollgateProfile",
        "metadata": {"name": "default", "namespace": ns},
        "spec": {"validation": {"mode": "warn"}},
    });
    context::create(&admin, &profile).await;
    // The editor role, as deploy/base ships it (the admin role aggregates it).
    for d in rendered.iter().filter(|d| {
        d["kind"] == "ClusterRole" && d["metadata"]["name"] == "tollgate-profile-editor"
    }) {
        common::context::create_shared(&admin, d).await;
    }

    let run = |user: &str, args: &[&str]| tollgate(args, &cp.kubeconfig(user));
    let out = run("admin", &["policy", "-n", &ns, "-o", "table"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert_eq!(stderr(&out), "");
    assert!(
        text.contains(&format!(
            "# Layers, each over the one before: built-in, TollgatePolicy default, TollgateProfile {ns}/default.\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "# The TollgatePolicy and TollgateProfiles as the cluster at {}",
            cp.url
        )),
        "{text}"
    );
    let row = |text: &str, path: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{path} ")))
            .unwrap_or_else(|| panic!("{path} in {text}"))
            .to_owned()
    };
    assert!(
        row(&text, "feasibility.mode").contains("\"enforce\""),
        "{text}"
    );
    assert!(
        row(&text, "validation.mode").ends_with(&format!("TollgateProfile {ns}/default")),
        "{text}"
    );
    // --local: the files alone (none: the built-in policy).
    let out = run("admin", &["policy", "-n", &ns, "-o", "table", "--local"]);
    assert!(
        row(&stdout(&out), "feasibility.mode").ends_with("built-in"),
        "{}",
        stdout(&out)
    );

    // The export reads them too: the profile that makes validation warn leaves its
    // namespace out of the binding, by name; --local exports the files alone.
    let out = run("admin", &["export", "validating-admission-policy"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "composed with the TollgatePolicy and TollgateProfiles of the cluster at {}",
            cp.url
        )),
        "{}",
        stderr(&out)
    );
    assert!(text.contains(&ns), "{text}");
    let out = run(
        "admin",
        &["export", "validating-admission-policy", "--local"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stdout(&out).contains(&ns), "{}", stdout(&out));

    // The namespace's admin, without the viewer role: said, exit 3.
    let out = run("erin", &["export", "mutating-admission-policy"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("could not read the cluster's TollgatePolicy: forbidden"),
        "{}",
        stderr(&out)
    );
    let out = run("erin", &["policy", "-n", &ns]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("could not read the cluster's TollgatePolicy: forbidden"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), "");
    let out = run("erin", &["audit", "-n", &ns]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("could not read the cluster's TollgatePolicy"),
        "{}",
        stderr(&out)
    );
    // A pod without requests: the built-in policy refuses it, her profile only warns.
    let dir = tempfile::tempdir().unwrap();
    let pod = dir.path().join("pod.yaml");
    std::fs::write(
        &pod,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: nb}\nspec:\n  containers:\n  - {name: jupyter, image: jupyter/base:1}\n",
    )
    .unwrap();
    let pod = pod.to_str().unwrap();
    let out = run("erin", &["review", pod, "-n", &ns]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("could not read the cluster's TollgatePolicy"),
        "{}",
        stderr(&out)
    );

    // With the viewer role as deploy/base ships it (bound here to her alone, not to every
    // authenticated user as shipped, so that the plane's other tests keep their answers).
    let viewer = rendered
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "tollgate-policy-viewer")
        .expect("deploy/base ships the ClusterRole tollgate-policy-viewer");
    common::context::create_shared(&admin, viewer).await;
    let shipped = rendered
        .iter()
        .find(|d| {
            d["kind"] == "ClusterRoleBinding" && d["roleRef"]["name"] == "tollgate-policy-viewer"
        })
        .expect("deploy/base binds tollgate-policy-viewer");
    assert_eq!(
        shipped["subjects"],
        json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}])
    );
    let binding_name = context::unique("why-viewer");
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": binding_name},
        "roleRef": shipped["roleRef"],
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "erin"}],
    });
    context::create(&admin, &binding).await;
    let mut read = None;
    common::net::until("erin reads the TollgatePolicy", async || {
        let out = run("erin", &["policy", "-n", &ns, "-o", "table"]);
        let ok = out.status.code() == Some(0);
        read = Some(out);
        ok
    })
    .await;
    let text = stdout(read.as_ref().unwrap());
    assert!(
        row(&text, "feasibility.mode").ends_with("TollgatePolicy default"),
        "{text}"
    );
    assert!(row(&text, "validation.mode").contains("\"warn\""), "{text}");
    let out = run("erin", &["audit", "-n", &ns]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let out = run("erin", &["review", pod, "-n", &ns]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stderr(&out).contains(&format!(
            "reviewed with the TollgatePolicy and TollgateProfiles of the cluster at {}",
            cp.url
        )),
        "{}",
        stderr(&out)
    );
    let out = run("erin", &["review", pod, "-n", &ns, "--local"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the built-in policy refuses it: {}",
        stdout(&out)
    );

    for o in [&binding, viewer, &profile, &policy] {
        delete(&admin, o).await;
    }
}

async fn delete(client: &kube::Client, o: &Value) {
    let r = common::apiserver::resource_of(o);
    let api: kube::Api<kube::api::DynamicObject> = match o["metadata"]["namespace"].as_str() {
        Some(ns) => kube::Api::namespaced_with(client.clone(), ns, &r),
        None => kube::Api::all_with(client.clone(), &r),
    };
    let name = o["metadata"]["name"].as_str().unwrap();
    api.delete(name, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("deleting {name}: {e}"));
}

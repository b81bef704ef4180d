//! `tollgate review`, `tollgate certs` and `tollgate export` as users run them.

use crate::common;

use std::process::Output;

use common::bin::run as tollgate;

const TRAINING_POD: &str = "apiVersion: v1
kind: Pod
metadata:
  generateName: resnet50-worker-
  labels:
    training.kubeflow.org/job-name: resnet50
spec:
  containers:
    - name: pytorch
      image: trainer
      resources:
        limits:
          nvidia.com/gpu: 8
";

use common::NOTEBOOK;

#[test]
fn every_fixture_gives_a_sensible_result() {
    for name in common::fixture_names() {
        let path = format!("tests/fixtures/apiserver-v1.36/{name}");
        let out = tollgate(&["review", &path], None);
        let text = String::from_utf8_lossy(&out.stdout);
        // The pods without requests that are not training pods; bob may not opt out. The
        // Deployment's pods are not training pods either, and an UPDATE that changes its
        // template is judged again; the one that only scales is not. The Job, the CronJob
        // and the PyTorchJob make training pods, which get default limits.
        let expect_denied = [
            "notebook-helper",
            "dryrun-helper",
            "scratch-notebook-by-bob",
            "notebook-pod-by-replicaset-controller",
            "deployment-create",
            "deployment-update-image",
        ]
        .iter()
        .any(|p| name.starts_with(p));
        assert_eq!(
            out.status.code(),
            Some(if expect_denied { 1 } else { 0 }),
            "{name}: {text}"
        );
        let review: serde_json::Value = serde_json::from_slice(&common::fixture(&name)).unwrap();
        let namespace = review["request"]["namespace"].as_str().unwrap();
        let kind = review["request"]["kind"]["kind"].as_str().unwrap();
        let noun = kind.to_ascii_lowercase();
        assert!(
            text.starts_with(&format!("{noun} {namespace}/")),
            "{name}: {text}"
        );
        if kind != "Pod" {
            // A workload's decision is given per template.
            let templates = if kind == "PyTorchJob" { 2 } else { 1 };
            let lines = text
                .lines()
                .filter(|l| l.starts_with("  ") && l.contains("template") && l.contains("): "))
                .count();
            assert_eq!(lines, templates, "{name}: {text}");
            if name.starts_with("deployment-update-replicas") {
                assert!(
                    text.contains("(/spec/template): unchanged"),
                    "{name}: {text}"
                );
            }
        }
    }
}

#[test]
fn a_training_pod_from_yaml_is_mutated_then_allowed() {
    // What a cluster does: mutation adds default limits, defaulting copies them to requests,
    // validation passes.
    let out = tollgate(&["review", "-"], Some(TRAINING_POD.as_bytes()));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(
            "allowed (mutated: tolerations, driver-mounts, metrics-sidecar, default-resources)"
        ),
        "{text}"
    );
    assert!(text.contains("pod as mutated:"), "{text}");
    assert!(text.contains("key: nvidia.com/gpu"), "{text}");
}

#[test]
fn a_pod_without_requests_is_denied_with_exit_1_and_json_output() {
    let out = tollgate(
        &["review", "--output", "json", "-"],
        Some(NOTEBOOK.as_bytes()),
    );
    assert_eq!(out.status.code(), Some(1));
    let v = only_result(&out.stdout);
    assert_eq!(v["decision"], "denied");
    assert!(v["message"]
        .as_str()
        .unwrap()
        .contains("container \"jupyter\" has no request for cpu and memory"));
    assert_eq!(v["validateResponse"]["response"]["status"]["code"], 403);
}

#[test]
fn opt_out_governance_follows_the_requester() {
    let annotated = NOTEBOOK.replace(
        "  name: notebook\n",
        "  name: notebook\n  annotations:\n    tollgate.dev/opt-out: \"true\"\n",
    );
    let admin = tollgate(
        &[
            "review",
            "--user",
            "admin",
            "--group",
            "system:masters",
            "-",
        ],
        Some(annotated.as_bytes()),
    );
    assert_eq!(
        admin.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&admin.stdout)
    );
    let alice = tollgate(
        &["review", "--user", "alice", "-"],
        Some(annotated.as_bytes()),
    );
    assert_eq!(alice.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&alice.stdout).contains("not permitted for \"alice\""));
}

#[test]
fn a_workload_is_reviewed_per_template() {
    // Without a template there is nothing to judge: allowed, with a warning.
    let out = tollgate(
        &["review", "-"],
        Some(&b"kind: Deployment\napiVersion: apps/v1\nmetadata: {name: web}\n"[..]),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.starts_with("deployment default/web: allowed"),
        "{text}"
    );
    assert!(text.contains("no pod template at spec.template"), "{text}");

    // Several documents: each workload (and pod) gets its block, each template a line.
    let file = "apiVersion: batch/v1
kind: Job
metadata: {name: train, namespace: ml}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: t, image: i}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: ml}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: nginx, image: nginx}]
";
    let out = tollgate(&["review", "-"], Some(file.as_bytes()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the Deployment's pods lack requests: {text}"
    );
    assert!(text.starts_with("job ml/train: allowed"), "{text}");
    assert!(
        text.contains("\ndeployment ml/web: denied\n  pod template (/spec/template): denied\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "deployment \"web\" must request cpu and memory for every container of its pods"
        ),
        "{text}"
    );
    assert!(
        text.contains("  - container \"nginx\" has no request for cpu and memory"),
        "{text}"
    );

    let out = tollgate(&["review", "--output", "json", "-"], Some(file.as_bytes()));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["kind"], "Job");
    assert_eq!(v[0]["templates"][0]["decision"], "allowed");
    assert_eq!(v[1]["templates"][0]["path"], "/spec/template");
    assert_eq!(v[1]["decision"], "denied");
}

#[test]
fn unusable_input_exits_2_with_a_reason() {
    for (what, args, stdin, needle) in [
        ("empty", vec!["review", "-"], Some(&b""[..]), "empty input"),
        (
            "garbage",
            vec!["review", "-"],
            Some(&b"{{{"[..]),
            "neither JSON nor YAML",
        ),
        // A document that is no Kubernetes object at all. (An object of a kind tollgate
        // does not review, a ConfigMap, is listed as not reviewed: see
        // a_file_as_kubectl_takes_it_lists_what_is_not_reviewed.)
        (
            "no kind",
            vec!["review", "-"],
            Some(&b"apiVersion: v1\nmetadata: {name: x}\n"[..]),
            "no kind",
        ),
        (
            "missing file",
            vec!["review", "no/such/file.yaml"],
            None,
            "no/such/file.yaml",
        ),
        (
            "bad policy",
            vec!["review", "--policy", "Cargo.toml", "-"],
            Some(NOTEBOOK.as_bytes()),
            "Cargo.toml",
        ),
    ] {
        let out = tollgate(&args, stdin);
        assert_eq!(out.status.code(), Some(2), "{what}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{what}: {err}");
    }
}

#[test]
fn certs_writes_a_ca_and_a_serving_certificate_for_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out = tollgate(
        &[
            "certs",
            "--service",
            "tollgate",
            "--namespace",
            "tollgate-system",
            "--out",
            out_dir.to_str().unwrap(),
            "--days",
            "10",
        ],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cert = std::fs::read(out_dir.join("tls.crt")).unwrap();
    use rustls::pki_types::pem::PemObject as _;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(&cert).unwrap();
    let (_, parsed) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
    let sans: Vec<String> = parsed
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|n| n.to_string())
        .collect();
    for name in [
        "tollgate",
        "tollgate.tollgate-system",
        "tollgate.tollgate-system.svc",
        "tollgate.tollgate-system.svc.cluster.local",
    ] {
        assert!(
            sans.contains(&format!("DNSName({name})")),
            "{name} in {sans:?}"
        );
    }
    let days = (parsed.validity().not_after.timestamp() - parsed.validity().not_before.timestamp())
        / 86400;
    assert_eq!(days, 10);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(out_dir.join("tls.key"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
    }
    // The serving certificate is signed by the CA written beside it.
    let ca = std::fs::read_to_string(out_dir.join("ca.crt")).unwrap();
    let key = std::fs::read_to_string(out_dir.join("tls.key")).unwrap();
    let store = tollgate::tls::CertStore::open(&out_dir.join("tls.crt"), &out_dir.join("tls.key"));
    assert!(store.is_ok(), "the pair loads");
    assert!(ca.contains("BEGIN CERTIFICATE") && key.contains("PRIVATE KEY"));
}

/// A DRA Job's file as a user has it: the claim template beside the pod. The template is
/// the pod's cluster context; several pods give one result each, and the exit status is
/// 1 as soon as one is denied.
#[test]
fn a_multi_document_file_is_its_own_cluster_context() {
    let template = "apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: two-gpus
  namespace: ml
spec:
  spec:
    devices:
      requests:
        - name: gpus
          exactly:
            deviceClassName: gpu.nvidia.com
            count: 2
";
    let pod = "apiVersion: v1
kind: Pod
metadata:
  name: dra
  namespace: ml
spec:
  resourceClaims:
    - name: gpus
      resourceClaimTemplateName: two-gpus
  containers:
    - name: trainer
      image: trainer
      resources:
        requests: {cpu: \"1\", memory: 1Gi}
        claims:
          - name: gpus
";
    let file = format!("{pod}---\n{template}");
    let out = tollgate(&["review", "--output", "json", "-"], Some(file.as_bytes()));
    assert_eq!(out.status.code(), Some(0));
    let v = only_result(&out.stdout);
    let tolerations = &v["mutatedPod"]["spec"]["tolerations"];
    assert_eq!(tolerations[0]["key"], "nvidia.com/gpu", "{v}");
    assert!(
        v["mutatedPod"]["spec"]["volumes"].is_null(),
        "runtime driver: {v}"
    );

    // Without the template the claim is unknown: no toleration, a warning that says so.
    let out = tollgate(&["review", "--output", "json", "-"], Some(pod.as_bytes()));
    let v = only_result(&out.stdout);
    assert!(v["mutatedPod"]["spec"]["tolerations"].is_null(), "{v}");
    assert!(v["warnings"][0]
        .as_str()
        .unwrap()
        .contains("could not read ResourceClaimTemplate \"two-gpus\""));

    // Two pods: an array of two results, and exit 1 for the notebook without requests.
    let file = format!("{pod}---\n{template}---\n{NOTEBOOK}");
    let out = tollgate(&["review", "--output", "json", "-"], Some(file.as_bytes()));
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = v.as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["decision"], "allowed");
    assert_eq!(results[1]["decision"], "denied");
    let text = tollgate(&["review", "-"], Some(file.as_bytes()));
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.starts_with("pod ml/dra: allowed"), "{text}");
    assert!(text.contains("\npod default/notebook: denied"), "{text}");
}

/// Profiles in `tollgate review`: the namespace's labels from `--namespace-labels` or from a
/// Namespace in the file, and the profile named in the output.
#[test]
fn review_names_the_profile_and_takes_namespace_labels() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "profiles:\n  - name: research\n    match:\n      namespaceSelector:\n        matchLabels: {department: research}\n    validation: {mode: warn}\n  - name: by-name\n    match:\n      namespaceSelector:\n        matchLabels: {kubernetes.io/metadata.name: lab}\n    validation: {mode: audit}\n",
    )
    .unwrap();
    let policy = policy.to_str().unwrap();
    let with_flag = tollgate(
        &[
            "review",
            "--policy",
            policy,
            "--namespace",
            "ml",
            "--namespace-labels",
            "department=research,tier=gpu",
            "-",
        ],
        Some(NOTEBOOK.as_bytes()),
    );
    let text = String::from_utf8(with_flag.stdout).unwrap();
    assert_eq!(with_flag.status.code(), Some(0), "{text}");
    assert!(
        text.starts_with("pod ml/notebook: allowed (profile research)"),
        "{text}"
    );

    // The name label is there as the apiserver sets it, with no flag.
    let out = tollgate(
        &[
            "review",
            "--policy",
            policy,
            "--namespace",
            "lab",
            "--output",
            "json",
            "-",
        ],
        Some(
            format!("{NOTEBOOK}---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: lab\n")
                .as_bytes(),
        ),
    );
    let v = only_result(&out.stdout);
    assert_eq!(v["profile"], "by-name", "{v}");

    // No labels known: no profile, the base enforces.
    let out = tollgate(
        &["review", "--policy", policy, "--namespace", "ml", "-"],
        Some(NOTEBOOK.as_bytes()),
    );
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn export_prints_the_policy_and_binding_and_says_what_stays_with_the_webhook() {
    let out = tollgate(&["export", "validating-admission-policy"], None);
    assert_eq!(out.status.code(), Some(0));
    let yaml = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml).unwrap();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("mutation steps"), "{err}");
    assert!(err.contains("deploy/README.md"), "{err}");
    // The same as the built-in policy's file.
    let from_file = tollgate(
        &[
            "export",
            "validating-admission-policy",
            "--policy",
            "policies/default.yaml",
        ],
        None,
    );
    let text = String::from_utf8(from_file.stdout).unwrap();
    assert_eq!(
        text.lines().skip(1).collect::<Vec<_>>(),
        yaml.lines().skip(1).collect::<Vec<_>>(),
        "only the header's source differs"
    );
}

#[test]
fn export_excludes_the_namespace_it_is_told_tollgate_runs_in() {
    let out = tollgate(
        &[
            "export",
            "validating-admission-policy",
            "--namespace",
            "ml-platform",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0));
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    let values =
        &docs[0]["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]["values"];
    assert_eq!(values, &serde_json::json!(["kube-system", "ml-platform"]));
    let bad = tollgate(
        &[
            "export",
            "validating-admission-policy",
            "--namespace",
            "Bad_NS",
        ],
        None,
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(bad.stdout.is_empty());
}

#[test]
fn export_strict_refuses_a_policy_asking_for_what_the_export_leaves_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, "validation:\n  operations: [CREATE, UPDATE]\n").unwrap();
    let path = path.to_str().unwrap();
    // Without --strict: written, with the gap named on stderr.
    let lax = tollgate(
        &["export", "validating-admission-policy", "--policy", path],
        None,
    );
    assert_eq!(lax.status.code(), Some(0));
    assert!(!lax.stdout.is_empty());
    let err = String::from_utf8(lax.stderr).unwrap();
    assert!(
        err.contains("not exported (validation.operations)"),
        "{err}"
    );
    // With it: status 1 and nothing a pipe into kubectl could apply.
    let strict = tollgate(
        &[
            "export",
            "validating-admission-policy",
            "--strict",
            "--policy",
            path,
        ],
        None,
    );
    assert_eq!(strict.status.code(), Some(1));
    assert!(strict.stdout.is_empty());
    assert!(String::from_utf8(strict.stderr)
        .unwrap()
        .contains("--strict"));
    // The shipped policy asks for nothing the export leaves out.
    let shipped = tollgate(&["export", "validating-admission-policy", "--strict"], None);
    assert_eq!(shipped.status.code(), Some(0));
    // A policy that does not load is unusable input.
    std::fs::write(dir.path().join("bad.yaml"), "validation:\n  mode: block\n").unwrap();
    let bad = tollgate(
        &[
            "export",
            "validating-admission-policy",
            "--policy",
            dir.path().join("bad.yaml").to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8(bad.stderr)
        .unwrap()
        .contains("validation.mode"));
}

/// A workload's file as it is published: a Deployment beside a Service, a ConfigMap, a
/// DeviceClass and a CronJob of a version the policy does not list. Every object is
/// accounted for, in order; those tollgate does not review are listed as such and leave
/// the exit status to the Deployment.
#[test]
fn a_file_as_kubectl_takes_it_lists_what_is_not_reviewed() {
    let others = "apiVersion: v1
kind: Service
metadata: {name: trainer}
spec:
  ports: [{port: 29500}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: ml}
data: {epochs: \"3\"}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.example.com}
---
apiVersion: batch/v1beta1
kind: CronJob
metadata: {name: nightly}
";
    // A Deployment's pods are no training pods: without requests, nothing gives them any.
    let job = |requests: &str| {
        format!(
            "apiVersion: apps/v1
kind: Deployment
metadata: {{name: train}}
spec:
  selector: {{matchLabels: {{app: train}}}}
  template:
    metadata: {{labels: {{app: train}}}}
    spec:
      containers:
        - name: train
          image: train{requests}
"
        )
    };
    let sized = job("\n          resources: {requests: {cpu: \"1\", memory: 1Gi}}");
    for (job, code) in [(sized, 0), (job(""), 1)] {
        let file = format!("{others}---\n{job}");
        let out = tollgate(&["review", "-"], Some(file.as_bytes()));
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(code), "{text}");
        assert!(
            text.starts_with("service default/trainer (v1): not reviewed: "),
            "{text}"
        );
        assert!(
            text.contains("\nconfigmap ml/settings (v1): not reviewed"),
            "{text}"
        );
        assert!(
            text.contains("cronjob default/nightly (batch/v1beta1): not reviewed: its policy lists CronJob as batch/v1, not batch/v1beta1"),
            "{text}"
        );
        assert!(text.contains("\ndeployment default/train: "), "{text}");

        let out = tollgate(&["review", "--output", "json", "-"], Some(file.as_bytes()));
        assert_eq!(out.status.code(), Some(code));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let results = v.as_array().unwrap();
        // The DeviceClass is context (what the cluster has), not a result.
        assert_eq!(results.len(), 4, "{v}");
        let skipped: Vec<&str> = results
            .iter()
            .filter(|r| r["decision"] == "skipped")
            .map(|r| r["kind"].as_str().unwrap())
            .collect();
        assert_eq!(skipped, ["Service", "ConfigMap", "CronJob"]);
        assert!(results[0]["reason"]
            .as_str()
            .unwrap()
            .contains("workloads.kinds"));
        assert_eq!(results[3]["kind"], "Deployment");
    }
}

/// `tollgate review DIR` reads a directory's manifests as `kubectl apply -f DIR` does (its
/// .yaml, .yml and .json files, by name; `-R` for subdirectories), the claims of one file
/// the context of the pods of another, each result naming its file.
#[test]
fn a_directory_is_reviewed_file_by_file_as_one_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let template = "apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata: {name: one-gpu}
spec:
  spec:
    devices:
      requests:
        - name: gpu
          deviceClassName: gpu.nvidia.com
";
    let pod = "apiVersion: v1
kind: Pod
metadata: {name: dra}
spec:
  resourceClaims: [{name: gpu, resourceClaimTemplateName: one-gpu}]
  containers:
    - name: trainer
      image: trainer
      resources:
        requests: {cpu: \"1\", memory: 1Gi}
        claims: [{name: gpu}]
";
    std::fs::write(dir.path().join("a-pod.yaml"), pod).unwrap();
    std::fs::write(dir.path().join("b-claims.yml"), template).unwrap();
    std::fs::write(dir.path().join("README.md"), "not a manifest").unwrap();
    std::fs::create_dir(dir.path().join("more")).unwrap();
    std::fs::write(
        dir.path().join("more/notebook.json"),
        serde_json::to_string(&serde_saphyr::from_str::<serde_json::Value>(NOTEBOOK).unwrap())
            .unwrap(),
    )
    .unwrap();
    let path = dir.path().display().to_string();

    let out = tollgate(
        &["review", "--output", "json", &path, "--namespace", "ml"],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = only_result(&out.stdout);
    // One pod: the one result, naming its file; the v1beta1 template beside it, written
    // without a namespace, is in the pod's: the pod gets its GPU toleration.
    assert!(v["file"].as_str().unwrap().ends_with("a-pod.yaml"), "{v}");
    assert_eq!(
        v["mutatedPod"]["spec"]["tolerations"][0]["key"], "nvidia.com/gpu",
        "{v}"
    );

    let out = tollgate(&["review", "-R", &path, "--namespace", "ml"], None);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "the notebook lacks requests: {text}"
    );
    assert!(text.contains("a-pod.yaml: pod ml/dra: allowed"), "{text}");
    assert!(
        text.contains("notebook.json: pod ml/notebook: denied"),
        "{text}"
    );

    let empty = tempfile::tempdir().unwrap();
    let out = tollgate(&["review", &empty.path().display().to_string()], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no .yaml, .yml or .json file"));
}

/// A pod whose claim tollgate cannot read gets no GPU treatment; refused then, it is told
/// that this is why.
#[test]
fn a_pod_refused_because_its_claim_could_not_be_read_is_told_so() {
    let pod = "apiVersion: v1
kind: Pod
metadata: {name: dra, namespace: ml, labels: {app: x}}
spec:
  resourceClaims: [{name: gpu, resourceClaimTemplateName: missing}]
  containers:
    - name: trainer
      image: trainer
      resources: {claims: [{name: gpu}]}
";
    let out = tollgate(&["review", "--output", "json", "-"], Some(pod.as_bytes()));
    assert_eq!(out.status.code(), Some(1));
    let v = only_result(&out.stdout);
    let message = v["message"].as_str().unwrap();
    assert!(
        message.contains("has no request for cpu and memory"),
        "{message}"
    );
    assert!(
        message.contains("tollgate could not read the ResourceClaimTemplate \"missing\" of claim \"gpu\" (it does not exist), so it did not treat this pod as a GPU pod"),
        "{message}"
    );
}

/// The text output shows the pod as mutated only when the mutating webhook changed it.
#[test]
fn an_unchanged_pod_is_not_shown_as_mutated() {
    let out = tollgate(&["review", "-"], Some(NOTEBOOK.as_bytes()));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("as mutated"), "{text}");
    assert!(!text.contains("patch (JSONPatch)"), "{text}");
}

#[test]
fn yaml_is_read_as_kubectl_reads_it() {
    // `defaultMode: 0644` and `automountServiceAccountToken: no`, as kubectl sends them (420
    // and false): the template is read, and refused as the webhook refuses it.
    let out = tollgate(
        &[
            "review",
            "--output",
            "json",
            "tests/data/review/deployment-yaml-1.1-scalars.yaml",
        ],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v = only_result(&out.stdout);
    assert_eq!(v["allowed"], false, "{v:#}");
    let spec = &v["mutatedObject"]["spec"]["template"]["spec"];
    assert_eq!(spec["volumes"][0]["configMap"]["defaultMode"], 420, "{v:#}");
    assert_eq!(spec["automountServiceAccountToken"], false, "{v:#}");
}

#[test]
fn a_runtime_and_its_trainjob_without_a_namespace_meet_in_one() {
    // Trainer's examples apply a TrainingRuntime and the TrainJob using it, neither with a
    // namespace: kubectl puts both in one, and so does `review`.
    for ns in [None, Some("team-a")] {
        let mut args = vec![
            "review",
            "tests/data/review/trainjob-and-runtime-without-namespace.yaml",
        ];
        if let Some(ns) = ns {
            args.extend(["--namespace", ns]);
        }
        let out = tollgate(&args, None);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{text}");
        assert!(
            text.contains(&format!(
                "trainjob {}/two-steps: allowed",
                ns.unwrap_or("default")
            )),
            "{text}"
        );
        assert!(!text.contains("not found"), "{text}");
        for step in ["dataset-initializer", "node"] {
            assert!(
                text.contains(&format!("replicated job {step} (")),
                "{step}: {text}"
            );
        }
    }
}

#[test]
fn a_file_of_context_alone_is_listed_and_exits_0() {
    // A platform team's repository of quotas and namespaces: nothing to refuse, each listed
    // (issue 29; it was "nothing to review", exit 2).
    let out = tollgate(
        &["review", "-"],
        Some(
            &b"kind: Namespace\napiVersion: v1\nmetadata: {name: ml}\n---\napiVersion: v1\nkind: ResourceQuota\nmetadata: {name: q}\nspec: {hard: {requests.cpu: \"4\"}}\n"[..],
        ),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("namespace /ml (v1): not reviewed: cluster context"),
        "{text}"
    );
    assert!(
        text.contains("resourcequota default/q (v1): not reviewed: cluster context"),
        "{text}"
    );
}

#[test]
fn a_file_of_runtimes_alone_judges_each() {
    // A runtime whose dataset step's container no TrainJob can give requests to: admitted,
    // with a warning naming the step and the container; the trainer step's node container
    // (which resourcesPerNode reaches) is not blamed.
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "mutation:\n  defaultResources:\n    enabled: false\n",
    )
    .unwrap();
    let text = std::fs::read_to_string(
        common::root().join("tests/data/review/trainjob-and-runtime-without-namespace.yaml"),
    )
    .unwrap();
    let runtime_only = &text[..text.find("\n---").unwrap()];
    let out = tollgate(
        &["review", "--policy", policy.to_str().unwrap(), "-"],
        Some(runtime_only.as_bytes()),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("trainingruntime default/torch-with-data-step: allowed"),
        "{text}"
    );
    assert!(
        text.contains("replicated job dataset-initializer: container \"dataset-initializer\" has no request for cpu and memory, and no TrainJob can give it one"),
        "{text}"
    );
    assert!(
        !text.contains("container \"node\" has no request"),
        "{text}"
    );
}

#[test]
fn a_document_the_apiserver_could_not_decode_is_named_with_its_field() {
    // kubectl would get the apiserver's "cannot be handled as a Pod" for it, and apply
    // nothing of it: review says so, naming the document and the field, as unusable input.
    for (text, needle) in [
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: \"x\"\n",
            "standard input: document 1: Pod \"p\" in version \"v1\" cannot be handled as a Pod: spec.containers: invalid type",
        ),
        (
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: ml}\n---\napiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  parallelism: two\n  template: {spec: {containers: [{name: a, image: b}], restartPolicy: Never}}\n",
            "standard input: document 2: Job \"j\" in version \"v1\" cannot be handled as a Job: spec.parallelism: invalid type",
        ),
    ] {
        let out = tollgate(&["review", "-"], Some(text.as_bytes()));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(needle), "{err}");
    }
}

#[test]
fn a_raycluster_with_yaml_1_1_octal_has_every_template_judged() {
    let out = tollgate(
        &[
            "review",
            "--output",
            "json",
            "tests/data/review/raycluster-autoscaler-yaml-1.1.yaml",
        ],
        None,
    );
    let v = only_result(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{v:#}");
    let decisions: Vec<&str> = v["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["decision"].as_str().unwrap())
        .collect();
    assert_eq!(decisions, ["allowed", "allowed"], "{v:#}");
    assert_eq!(
        v["mutatedObject"]["spec"]["headGroupSpec"]["template"]["spec"]["volumes"][0]["configMap"]
            ["defaultMode"],
        511,
        "{v:#}"
    );
}

/// A TollgatePolicy letting namespaces loosen validation, and team-a's TollgateProfile
/// moving it to warn (and a default of its own).
const POLICY_OBJECTS: &str = "apiVersion: tollgate.dev/v1alpha1
kind: TollgatePolicy
metadata:
  name: default
spec:
  namespaceProfiles:
    mayLoosen: [validation]
---
apiVersion: tollgate.dev/v1alpha1
kind: TollgateProfile
metadata:
  name: default
  namespace: team-a
spec:
  validation:
    mode: warn
  mutation:
    defaultResources:
      perGpu: {memory: 128Gi}
";

/// team-a's TollgateProfile alone: warn crosses the bound of the built-in policy.
const OUT_OF_BOUNDS: &str = "apiVersion: tollgate.dev/v1alpha1
kind: TollgateProfile
metadata:
  name: default
  namespace: team-a
spec:
  validation:
    mode: warn
";

fn notebook_in(ns: &str) -> String {
    NOTEBOOK.replace(
        "  name: notebook\n",
        &format!("  name: notebook\n  namespace: {ns}\n"),
    )
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn review_judges_a_namespace_with_the_profile_in_its_input_and_no_other() {
    let input = format!(
        "{POLICY_OBJECTS}---\n{}---\n{}",
        notebook_in("team-a"),
        notebook_in("team-b")
    );
    let out = tollgate(&["review", "-"], Some(input.as_bytes()));
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "team-b's notebook is refused: {text}"
    );
    // The objects first, as what the rest is judged with.
    let first: Vec<&str> = text.lines().filter(|l| !l.is_empty()).take(2).collect();
    assert_eq!(
        first,
        [
            "tollgatepolicy default: in force: the cluster's policy",
            "tollgateprofile team-a/default: in force for the pods and workloads of namespace team-a"
        ],
        "{text}"
    );
    assert!(
        text.contains("pod team-a/notebook: allowed (profile team-a/default)"),
        "{text}"
    );
    assert!(text.contains("pod team-b/notebook: denied\n"), "{text}");
    // Without the objects, both are refused; with them as the saved cluster state, the
    // same verdicts.
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.yaml");
    std::fs::write(&state, POLICY_OBJECTS).unwrap();
    let pods = format!("{}---\n{}", notebook_in("team-a"), notebook_in("team-b"));
    let plain = tollgate(&["review", "-"], Some(pods.as_bytes()));
    assert!(
        stdout(&plain).contains("pod team-a/notebook: denied"),
        "{}",
        stdout(&plain)
    );
    let with_state = tollgate(
        &[
            "review",
            "-",
            "--cluster-state",
            state.to_str().unwrap(),
            "--output",
            "json",
        ],
        Some(pods.as_bytes()),
    );
    let results: serde_json::Value = serde_json::from_slice(&with_state.stdout).unwrap();
    let decisions: Vec<(&str, &str)> = results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["kind"].as_str().unwrap(), r["decision"].as_str().unwrap()))
        .collect();
    assert_eq!(
        decisions,
        [
            ("TollgatePolicy", "allowed"),
            ("TollgateProfile", "allowed"),
            ("Pod", "allowed"),
            ("Pod", "denied")
        ],
        "{results:#}"
    );
    assert_eq!(results[1]["file"], state.display().to_string());
    assert_eq!(results[2]["profile"], "team-a/default");
}

#[test]
fn review_fails_a_profile_out_of_bounds_naming_the_field_and_the_bound() {
    let input = format!("{OUT_OF_BOUNDS}---\n{}", notebook_in("team-a"));
    let out = tollgate(&["review", "-"], Some(input.as_bytes()));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.starts_with("tollgateprofile team-a/default: denied\n"),
        "{text}"
    );
    assert!(
        text.contains("TollgateProfile team-a/default: field `spec.validation.mode`: crosses a bound of the cluster's policy"),
        "{text}"
    );
    assert!(
        text.contains("spec.namespaceProfiles.mayLoosen: [validation]"),
        "{text}"
    );
    // Its namespace is judged by the cluster's policy, as the server would judge it.
    assert!(text.contains("pod team-a/notebook: denied\n"), "{text}");
    // Alone, the profile is what is reviewed: still a failure.
    let alone = tollgate(
        &["review", "-", "--output", "json"],
        Some(OUT_OF_BOUNDS.as_bytes()),
    );
    assert_eq!(alone.status.code(), Some(1), "{}", stderr(&alone));
    let v = only_result(&alone.stdout);
    assert_eq!(v["decision"], "denied");
    assert_eq!(v["reason"], "OutOfBounds");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("`spec.validation.mode`"),
        "{v}"
    );
}

#[test]
fn policy_shows_each_value_and_where_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("objects.yaml");
    std::fs::write(&objects, POLICY_OBJECTS).unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, "validation:\n  requiredRequests: [cpu]\n").unwrap();
    let (objects, file) = (objects.to_str().unwrap(), file.to_str().unwrap());
    let out = tollgate(
        &[
            "policy",
            "--policy",
            file,
            "-f",
            objects,
            "--namespace",
            "team-a",
        ],
        None,
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(
        text.starts_with(
            "# The policy in force for the pods of namespace team-a: team-a/default.\n"
        ),
        "{text}"
    );
    for line in [
        "  mode: \"warn\"  # from: TollgateProfile team-a/default",
        &format!("  requiredRequests: [\"cpu\"]  # from: file {file}"),
        "  mayLoosen: [\"validation\"]  # from: TollgatePolicy default",
        "  annotation: \"tollgate.dev/opt-out\"  # from: built-in",
        "      memory: \"128Gi\"  # from: TollgateProfile team-a/default",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in:\n{text}");
    }
    // The text is the policy as YAML, comments aside.
    let yaml: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(yaml["validation"]["mode"], "warn");
    // Another namespace gets the cluster's policy; the table says so too.
    let table = tollgate(
        &["policy", "-f", objects, "-n", "team-b", "-o", "table"],
        None,
    );
    let text = stdout(&table);
    let row = text
        .lines()
        .find(|l| l.starts_with("validation.mode "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(row.ends_with("  built-in"), "{row}");
    assert!(row.contains("\"enforce\""), "{row}");
    // The machine form.
    let json = tollgate(
        &["policy", "-f", objects, "-n", "team-a", "-o", "json"],
        None,
    );
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["policy"], "team-a/default");
    let mode = v["values"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["path"] == "validation.mode")
        .unwrap();
    assert_eq!(mode["value"], "warn");
    assert_eq!(
        mode["source"],
        serde_json::json!({"kind": "tollgateProfile", "name": "TollgateProfile team-a/default"})
    );
    assert_eq!(v["objects"][1]["ready"], true);
    // An object that does not load: shown without it, said, exit 1; usage errors exit 2.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, OUT_OF_BOUNDS).unwrap();
    let out = tollgate(
        &["policy", "-f", bad.to_str().unwrap(), "-n", "team-a"],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("field `spec.validation.mode`"),
        "{}",
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("the pods of namespace team-a: base."),
        "{}",
        stdout(&out)
    );
    let out = tollgate(&["policy", "--profile", "nope"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no profile \"nope\""),
        "{}",
        stderr(&out)
    );
    let out = tollgate(&["policy", "-f", "does/not/exist.yaml"], None);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn policy_chooses_the_cluster_profile_the_pods_get() {
    let objects = "apiVersion: tollgate.dev/v1alpha1
kind: TollgatePolicy
metadata:
  name: default
spec:
  profiles:
    - name: gpu-pool
      match:
        podSelector: {matchLabels: {pool: gpu}}
      feasibility: {mode: enforce}
";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("objects.yaml");
    std::fs::write(&path, objects).unwrap();
    let p = path.to_str().unwrap();
    let out = tollgate(
        &["policy", "-f", p, "-n", "ml", "--pod-labels", "pool=gpu"],
        None,
    );
    let text = stdout(&out);
    assert!(text.contains("namespace ml: gpu-pool."), "{text}");
    assert!(
        text.contains("  mode: \"enforce\"  # from: profile gpu-pool (in TollgatePolicy default)"),
        "{text}"
    );
    let out = tollgate(&["policy", "-f", p, "-n", "ml"], None);
    assert!(
        stdout(&out).contains("namespace ml: base."),
        "{}",
        stdout(&out)
    );
    let out = tollgate(
        &["policy", "-f", p, "--profile", "gpu-pool", "-o", "table"],
        None,
    );
    assert!(stdout(&out).contains("profile gpu-pool (in TollgatePolicy default)"));
}

#[test]
fn export_names_the_profiles_it_does_not_cover() {
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("objects.yaml");
    std::fs::write(&objects, POLICY_OBJECTS).unwrap();
    let o = objects.to_str().unwrap();
    let out = tollgate(&["export", "validating-admission-policy", "-f", o], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let yaml = stdout(&out);
    let header: Vec<&str> = yaml.lines().take_while(|l| l.starts_with('#')).collect();
    assert!(
        header[0].contains("with TollgatePolicy default"),
        "{header:#?}"
    );
    assert!(
        header
            .iter()
            .any(|l| l.starts_with("# Left to the validating webhook")
                && l.ends_with(": team-a (team-a/default).")),
        "{header:#?}"
    );
    let err = stderr(&out);
    assert!(
        err.contains(
            "not exported (namespaceProfiles): left to the validating webhook: namespace \
             team-a, whose TollgateProfile team-a/default"
        ),
        "{err}"
    );
    // Every binding leaves team-a out: its pods are never judged by the cluster's policy
    // over its own profile.
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml).unwrap();
    let bindings: Vec<&serde_json::Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .collect();
    assert!(!bindings.is_empty());
    for b in bindings {
        assert_eq!(
            b["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"],
            serde_json::json!([{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["team-a"]}]),
            "{b}"
        );
    }
    // It is what the policy asks for and the export leaves out.
    let strict = tollgate(
        &["export", "validating-admission-policy", "-f", o, "--strict"],
        None,
    );
    assert_eq!(strict.status.code(), Some(1));
    assert!(strict.stdout.is_empty());
}

/// A kind team-a's TollgateProfile judges as a workload (its `workloads.kinds`, which the
/// TollgatePolicy lets it replace): reviewed in team-a, as the server would judge it
/// there; not reviewed in team-b, where the policy lists no such kind.
#[test]
fn review_judges_a_kind_a_namespaces_profile_adds_in_that_namespace_only() {
    let objects = "apiVersion: tollgate.dev/v1alpha1
kind: TollgatePolicy
metadata:
  name: default
spec:
  namespaceProfiles:
    mayLoosen: [workloads]
---
apiVersion: tollgate.dev/v1alpha1
kind: TollgateProfile
metadata:
  name: default
  namespace: team-a
spec:
  workloads:
    kinds:
      - group: example.com
        version: v1
        kind: TrainThing
        templates:
          - path: spec.template
";
    let thing = |ns: &str| {
        format!(
            "apiVersion: example.com/v1
kind: TrainThing
metadata:
  name: thing
  namespace: {ns}
spec:
  template:
    spec:
      containers:
        - name: train
          image: train:1
"
        )
    };
    let input = format!("{objects}---\n{}---\n{}", thing("team-a"), thing("team-b"));
    let out = tollgate(&["review", "-"], Some(input.as_bytes()));
    let text = stdout(&out);
    let line = |ns: &str| {
        text.lines()
            .find(|l| l.contains(&format!("{ns}/thing")))
            .unwrap_or_else(|| panic!("no line for {ns}/thing: {text}"))
            .to_owned()
    };
    assert!(!line("team-a").contains("not reviewed"), "{text}");
    assert!(line("team-a").contains("denied"), "no requests: {text}");
    assert!(line("team-b").contains("not reviewed"), "{text}");
}

/// `review -o json`'s one result, for an input of one object: the output is a list
/// whatever the number of objects, each result with its kind and name.
fn only_result(stdout: &[u8]) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(stdout).unwrap();
    let results = v
        .as_array()
        .unwrap_or_else(|| panic!("a list of results: {v:#}"));
    assert_eq!(results.len(), 1, "{v:#}");
    let one = results[0].clone();
    assert!(
        one["kind"].is_string() && one["name"].is_string(),
        "{one:#}"
    );
    one
}

/// A GitOps folder as it is: manifests beside a kustomization.yaml, a Helm values file
/// and a Helm template that is no YAML at all.
fn gitops_folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    write(
        "kustomization.yaml",
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [job.yaml, notebook.yaml]\n",
    );
    write("values.yaml", "replicaCount: 2\nimage:\n  tag: v1\n");
    write(
        "job.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\n---\n\
         apiVersion: batch/v1\nkind: Job\nmetadata: {name: train}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: t\n          image: t\n          resources: {requests: {cpu: \"1\", memory: 1Gi}}\n",
    );
    write("notebook.yaml", NOTEBOOK);
    write(
        "chart-template.yaml",
        "{{- if .Values.enabled }}\nkind: {{ .Values.kind }\n",
    );
    dir
}

/// `tollgate review` as kubectl takes files: several, positional or with `-f` (repeated),
/// `-n` placing objects written without a namespace, `-o json` a list of results each with
/// its kind, name and where it came from, documents numbered in their own file.
#[test]
fn review_takes_files_as_kubectl_does() {
    let dir = gitops_folder();
    let file = |name: &str| dir.path().join(name).display().to_string();
    let (job, notebook) = (file("job.yaml"), file("notebook.yaml"));
    let flags = tollgate(
        &[
            "review", "-n", "ml", "-o", "json", "-f", &job, "-f", &notebook,
        ],
        None,
    );
    let positional = tollgate(
        &[
            "review",
            &job,
            &notebook,
            "--namespace",
            "ml",
            "--output",
            "json",
        ],
        None,
    );
    assert_eq!(flags.status.code(), Some(1), "{}", stderr(&flags));
    assert_eq!(flags.stdout, positional.stdout);
    let v: serde_json::Value = serde_json::from_slice(&flags.stdout).unwrap();
    let results: Vec<(&str, &str, &str, &str, u64, &str)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap(),
                r["namespace"].as_str().unwrap(),
                r["name"].as_str().unwrap(),
                r["file"].as_str().unwrap().rsplit('/').next().unwrap(),
                r["document"].as_u64().unwrap(),
                r["decision"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        results,
        [
            ("ConfigMap", "ml", "settings", "job.yaml", 1, "skipped"),
            ("Job", "ml", "train", "job.yaml", 2, "allowed"),
            ("Pod", "ml", "notebook", "notebook.yaml", 1, "denied"),
        ]
    );
    // One object: a list of one all the same.
    let one = tollgate(&["review", "-o", "json", &notebook], None);
    assert_eq!(only_result(&one.stdout)["kind"], "Pod");
    // A document the apiserver could not decode is named by its number in its own file.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        format!("{NOTEBOOK}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: b}}\nspec: {{containers: 7}}\n"),
    )
    .unwrap();
    let out = tollgate(&["review", &job, bad.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("bad.yaml: document 2: Pod \"b\""), "{err}");
}

/// A GitOps folder is reviewed whole: its kustomization.yaml, its values file and a file
/// that is no YAML at all are listed as skipped, never fatal; what it holds of Kubernetes
/// objects is judged.
#[test]
fn a_gitops_folder_is_reviewed_without_a_fatal_error() {
    let dir = gitops_folder();
    let out = tollgate(&["review", dir.path().to_str().unwrap()], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}{}", stderr(&out));
    for line in [
        "chart-template.yaml: skipped: not a manifest: neither JSON nor YAML",
        "kustomization.yaml: document 1: skipped: a kustomization, not an object: review what it builds with -k DIR",
        "values.yaml: document 1: skipped: not a Kubernetes object (no apiVersion and kind)",
        "job.yaml: job default/train: allowed",
        "notebook.yaml: pod default/notebook: denied",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
    let json = tollgate(
        &["review", "-o", "json", dir.path().to_str().unwrap()],
        None,
    );
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let skipped = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["decision"] == "skipped" && r["kind"] == "")
        .count();
    assert_eq!(skipped, 3, "{v:#}");
    // Nothing but what is no object: nothing to review, said with why.
    let values = dir.path().join("values.yaml");
    let out = tollgate(&["review", values.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("values.yaml: document 1: not a Kubernetes object"));
}

/// `-k DIR` reviews what `kubectl kustomize DIR` builds, as `kubectl apply -k` applies it
/// (the kustomization's namespace and name prefix on every object); without kubectl on
/// PATH it says what is missing.
#[test]
fn review_k_builds_the_kustomization_with_kubectl() {
    let Some(kubectl) = common::tools::kubectl() else {
        return;
    };
    let dir = gitops_folder();
    let k = dir.path().join("kustomization.yaml");
    std::fs::write(
        &k,
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: team-a\nnamePrefix: dev-\nresources: [job.yaml, notebook.yaml]\n",
    )
    .unwrap();
    let kubectl_dir = std::fs::canonicalize(&kubectl)
        .ok()
        .and_then(|p| p.parent().map(std::path::Path::to_path_buf));
    let path = std::env::join_paths(kubectl_dir.into_iter().chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let out = common::bin::command()
        .args(["review", "-o", "json", "-k", dir.path().to_str().unwrap()])
        .env("PATH", &path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} {}/{}: {}",
                r["kind"], r["namespace"], r["name"], r["decision"]
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            "\"ConfigMap\" \"team-a\"/\"dev-settings\": \"skipped\"",
            "\"Job\" \"team-a\"/\"dev-train\": \"allowed\"",
            "\"Pod\" \"team-a\"/\"dev-notebook\": \"denied\"",
        ]
    );

    let without = common::bin::command()
        .args(["review", "-k", dir.path().to_str().unwrap()])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(without.status.code(), Some(2));
    assert!(
        stderr(&without).contains("building a kustomization needs kubectl on PATH"),
        "{}",
        stderr(&without)
    );
}

/// Every command speaks kubectl's flags where they fit, spelled as kubectl spells them:
/// `-o`, `-n`/`-A`, `-f`/`-k`, `--kubeconfig`/`--context`.
#[test]
fn every_command_takes_kubectls_flags_where_they_fit() {
    let takes = |cmd: &[&str], flags: &[&str]| {
        let out = tollgate(&[cmd, &["--help"]].concat(), None);
        let help = String::from_utf8_lossy(&out.stdout);
        for flag in flags {
            assert!(
                help.contains(&format!("{flag},")) || help.contains(&format!("{flag} ")),
                "tollgate {} lacks {flag}:\n{help}",
                cmd.join(" ")
            );
        }
    };
    let files = ["-f", "--filename", "-k", "--kustomize", "-R"];
    takes(&["review"], &["-o", "--output", "-n", "--namespace"]);
    takes(&["review"], &files);
    takes(&["audit"], &["-o", "-n", "-A", "--kubeconfig", "--context"]);
    takes(&["audit"], &files);
    takes(&["policy"], &["-o", "-n"]);
    takes(&["policy"], &files);
    takes(&["export", "validating-admission-policy"], &files);
    takes(&["register"], &["--kubeconfig", "--context", "--url"]);
}

/// A reader that goes away (`tollgate review -o json | head`) ends the command quietly.
#[test]
fn a_closed_pipe_ends_quietly() {
    let many: String = (0..40)
        .map(|i| NOTEBOOK.replace("name: notebook", &format!("name: nb-{i}")) + "---\n")
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("many.yaml");
    std::fs::write(&file, many).unwrap();
    let mut child = common::bin::command()
        .args(["review", "-o", "json", file.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(err.is_empty(), "{err}");
    assert_eq!(out.status.code(), Some(1), "the review's own status");
}

/// `--version` names the commit, `completion` writes a shell's script, `--listen :PORT`
/// is taken as Kubernetes components take it.
#[test]
fn version_completion_and_listen() {
    let out = tollgate(&["--version"], None);
    let version = String::from_utf8_lossy(&out.stdout);
    let package = env!("CARGO_PKG_VERSION");
    assert!(
        version.starts_with(&format!("tollgate {package}")),
        "{version}"
    );
    if std::path::Path::new(".git").exists() || common::root().join(".git").exists() {
        assert!(version.contains(&format!("{package} (")), "{version}");
    }
    for shell in ["bash", "zsh", "fish"] {
        let out = tollgate(&["completion", shell], None);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("tollgate") && script.contains("review"),
            "{shell}"
        );
    }
    // `:PORT` is taken (the server then stops for want of a certificate, as any would).
    let out = tollgate(
        &["serve", "--listen", ":0", "--metrics-listen", "off"],
        None,
    );
    let err = stderr(&out);
    assert!(err.contains("no serving certificate"), "{err}");
    let out = tollgate(&["serve", "--listen", "8443"], None);
    assert!(
        stderr(&out).contains("HOST:PORT or :PORT"),
        "{}",
        stderr(&out)
    );
}

/// A workload refused by feasibility says so where the decision is, not "denied" beside
/// templates that are each allowed; the amounts are as a person writes them (`1Ti +
/// 64Mi`: the trainer's request and the metrics sidecar's, not `1048640Mi`).
#[test]
fn a_verdict_of_feasibility_is_shown_where_it_comes_from() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "feasibility:\n  mode: enforce\n").unwrap();
    let input = "apiVersion: v1
kind: Node
metadata: {name: n1}
status:
  allocatable: {cpu: \"64\", memory: 512Gi, pods: \"110\", nvidia.com/gpu: \"8\"}
---
apiVersion: batch/v1
kind: Job
metadata: {name: train, namespace: ml}
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: t
          image: t
          resources:
            requests: {cpu: \"8\", memory: 1Ti, nvidia.com/gpu: \"8\"}
            limits: {nvidia.com/gpu: \"8\"}
";
    let out = tollgate(
        &["review", "--policy", policy.to_str().unwrap(), "-"],
        Some(input.as_bytes()),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.starts_with(
            "job ml/train: denied by feasibility: its pods could never run here\n  pod template (/spec/template): allowed\n"
        ),
        "{text}"
    );
    assert!(text.contains("it asks for 1Ti + 64Mi memory"), "{text}");
    assert!(!text.contains("1048640Mi"), "{text}");
    let json = tollgate(
        &[
            "review",
            "--policy",
            policy.to_str().unwrap(),
            "-o",
            "json",
            "-",
        ],
        Some(input.as_bytes()),
    );
    assert_eq!(only_result(&json.stdout)["verdict"], "infeasible");
}

/// The program run as `kubectl-tollgate` (the second bin target, which kubectl runs as its
/// plugin) names itself `kubectl tollgate` in help and usage, every command and its
/// kubectl flags there; as `tollgate`, `tollgate`. The krew manifest installs exactly that
/// executable on each of its platforms (the run through the real kubectl: tests/why.rs).
#[test]
fn the_plugin_names_itself_kubectl_tollgate_and_krew_installs_it() {
    let plugin = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-tollgate"))
            .args(args)
            .env("KUBECONFIG", common::bin::NO_KUBECONFIG)
            .output()
            .unwrap()
    };
    let help = stdout(&plugin(&["--help"]));
    assert!(help.contains("Usage: kubectl tollgate <COMMAND>"), "{help}");
    assert!(help.contains("\n  why "), "{help}");
    let why = stdout(&plugin(&["why", "--help"]));
    assert!(
        why.contains("Usage: kubectl tollgate why [OPTIONS] <KIND/NAME>"),
        "{why}"
    );
    for flag in [
        "-n, --namespace",
        "--kubeconfig",
        "--context",
        "-o, --output",
    ] {
        assert!(why.contains(flag), "{flag} in {why}");
    }
    let audit = stdout(&plugin(&["audit", "--help"]));
    assert!(audit.contains("-A, --all-namespaces"), "{audit}");
    let err = plugin(&["why"]);
    assert_eq!(err.status.code(), Some(2));
    assert!(
        stderr(&err).contains("kubectl tollgate why"),
        "{}",
        stderr(&err)
    );
    let own = stdout(&tollgate(&["why", "--help"], None));
    assert!(
        own.contains("Usage: tollgate why [OPTIONS] <KIND/NAME>"),
        "{own}"
    );

    let text = std::fs::read_to_string(common::root().join("deploy/krew/tollgate.yaml")).unwrap();
    let m: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(
        m["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(m["kind"], "Plugin");
    assert_eq!(
        m["metadata"]["name"], "tollgate",
        "krew: named after the file"
    );
    for key in ["version", "shortDescription", "description"] {
        assert!(
            m["spec"][key].as_str().is_some_and(|s| !s.is_empty()),
            "{key}"
        );
    }
    let platforms = m["spec"]["platforms"].as_array().unwrap();
    assert!(!platforms.is_empty());
    for p in platforms {
        let labels = &p["selector"]["matchLabels"];
        assert!(
            labels["os"].is_string() && labels["arch"].is_string(),
            "{p}"
        );
        assert_eq!(p["bin"], "kubectl-tollgate", "{p}");
        assert!(p["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["from"] == "kubectl-tollgate"));
        assert!(p["uri"].as_str().unwrap().contains("VERSION"), "{p}");
        assert!(
            p["sha256"].as_str().unwrap().starts_with("SHA256_OF_"),
            "{p}"
        );
    }
}

/// `why` without a cluster: one line, exit 2; a kind tollgate does not judge is said with
/// the kinds it does.
#[test]
fn why_needs_a_cluster_and_a_kind_it_judges() {
    let out = tollgate(&["why", "pod/x"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no kubeconfig found"),
        "{}",
        stderr(&out)
    );
    let out = tollgate(&["why", "x"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("KIND/NAME or KIND NAME"),
        "{}",
        stderr(&out)
    );
}

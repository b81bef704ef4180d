//! The deployment manifests (deploy/) rendered with `kubectl kustomize`, checked against what
//! the server actually serves, against the Dockerfile, and against `tollgate register`.
//!
//! The RBAC of deploy/overlays/audit is held to the real kube-apiserver
//! (tests/common/envtest.rs): tollgate run as its ServiceAccount, and what the apiserver
//! says that account may do.
//!
//! Every test that renders needs `kubectl` on PATH; without it they print why and pass.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

const NAMESPACE: &str = "tollgate-system";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// kubectl, the machine's or the suite's own (tests/common/tools.rs); where none can be
/// had, a SKIPPED line names the test.
fn kubectl_available() -> bool {
    common::tools::kubectl().is_some()
}

/// `kubectl kustomize DIR`, parsed into one JSON value per document.
fn render(dir: &Path) -> Vec<Value> {
    let out = Command::new(common::tools::kubectl().unwrap())
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("running kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("kustomize output is UTF-8");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("kustomize output parses");
    assert!(!docs.is_empty(), "{} rendered nothing", dir.display());
    docs
}

fn base() -> &'static [Value] {
    static BASE: OnceLock<Vec<Value>> = OnceLock::new();
    BASE.get_or_init(|| render(&root().join("deploy/base")))
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "expected exactly one {kind}/{name}");
    found[0]
}

fn kinds(docs: &[Value]) -> Vec<String> {
    let mut kinds: Vec<String> = docs
        .iter()
        .map(|d| format!("{}/{}", d["kind"].as_str().unwrap(), d["metadata"]["name"]))
        .collect();
    kinds.sort();
    kinds
}

/// The pods' webhook of a configuration (`mutate.tollgate.dev`, `validate.tollgate.dev`,
/// each the first); the ValidatingWebhookConfiguration's second is the policy objects'
/// ([`objects_webhook`]), and there are no others.
fn webhook<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let config = find(docs, kind, "tollgate");
    let hooks = config["webhooks"].as_array().expect("webhooks is a list");
    let names: Vec<&str> = hooks.iter().map(|h| h["name"].as_str().unwrap()).collect();
    let want: &[&str] = if kind == "MutatingWebhookConfiguration" {
        &["mutate.tollgate.dev"]
    } else {
        &["validate.tollgate.dev", "policies.tollgate.dev"]
    };
    assert_eq!(names, want, "{kind}'s webhooks");
    &hooks[0]
}

/// The ValidatingWebhookConfiguration's webhook of the TollgatePolicy and TollgateProfiles.
fn objects_webhook(docs: &[Value]) -> &Value {
    webhook(docs, "ValidatingWebhookConfiguration");
    &find(docs, "ValidatingWebhookConfiguration", "tollgate")["webhooks"][1]
}

fn container(docs: &[Value]) -> &Value {
    let containers = find(docs, "Deployment", "tollgate")["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1);
    &containers[0]
}

fn pod_spec(docs: &[Value]) -> &Value {
    &find(docs, "Deployment", "tollgate")["spec"]["template"]["spec"]
}

/// The container port a Service's or probe's port (a name or a number) resolves to.
fn resolve_port(container: &Value, port: &Value) -> u64 {
    let ports = container["ports"].as_array().expect("container ports");
    let found = match port {
        Value::String(name) => ports.iter().find(|p| p["name"] == name.as_str()),
        Value::Number(_) => ports.iter().find(|p| p["containerPort"] == *port),
        other => panic!("port {other} is neither a name nor a number"),
    };
    found
        .unwrap_or_else(|| panic!("port {port} is not a port the container exposes"))
        .get("containerPort")
        .and_then(Value::as_u64)
        .unwrap()
}

/// The value following `flag` in the container's args.
fn arg<'a>(container: &'a Value, flag: &str) -> &'a str {
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let i = args
        .iter()
        .position(|a| *a == flag)
        .unwrap_or_else(|| panic!("{flag} missing from args {args:?}"));
    args[i + 1]
}

/// Evaluates a LabelSelector (matchLabels and matchExpressions) against labels.
fn selects(selector: &Value, labels: &[(&str, &str)]) -> bool {
    let get = |key: &str| labels.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    if let Some(match_labels) = selector["matchLabels"].as_object() {
        for (k, v) in match_labels {
            if get(k) != v.as_str() {
                return false;
            }
        }
    }
    for expr in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = expr["key"].as_str().unwrap();
        let values: Vec<&str> = expr["values"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| v.as_str().unwrap())
            .collect();
        let ok = match (expr["operator"].as_str().unwrap(), get(key)) {
            ("In", Some(v)) => values.contains(&v),
            ("In", None) => false,
            ("NotIn", Some(v)) => !values.contains(&v),
            ("NotIn", None) => true,
            ("Exists", v) => v.is_some(),
            ("DoesNotExist", v) => v.is_none(),
            (op, _) => panic!("unknown operator {op}"),
        };
        if !ok {
            return false;
        }
    }
    true
}

#[test]
fn base_renders_everything_an_install_needs() {
    if !kubectl_available() {
        return;
    }
    let docs = base();
    assert_eq!(
        kinds(docs),
        [
            "ClusterRole/\"tollgate-cluster-context\"",
            "ClusterRole/\"tollgate-policy-objects\"",
            "ClusterRole/\"tollgate-policy-viewer\"",
            "ClusterRole/\"tollgate-profile-editor\"",
            "ClusterRoleBinding/\"tollgate-cluster-context\"",
            "ClusterRoleBinding/\"tollgate-policy-objects\"",
            "ClusterRoleBinding/\"tollgate-policy-viewer\"",
            "ConfigMap/\"tollgate-policy\"",
            "CustomResourceDefinition/\"tollgatepolicies.tollgate.dev\"",
            "CustomResourceDefinition/\"tollgateprofiles.tollgate.dev\"",
            "Deployment/\"tollgate\"",
            "MutatingWebhookConfiguration/\"tollgate\"",
            "Namespace/\"tollgate-system\"",
            "PodDisruptionBudget/\"tollgate\"",
            "Role/\"tollgate-cluster-autoscaler-status\"",
            "Role/\"tollgate-policy-status\"",
            "RoleBinding/\"tollgate-cluster-autoscaler-status\"",
            "RoleBinding/\"tollgate-policy-status\"",
            "Service/\"tollgate\"",
            "ServiceAccount/\"tollgate\"",
            "ValidatingWebhookConfiguration/\"tollgate\"",
        ]
    );
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap();
        let namespaced = !matches!(
            kind,
            "Namespace"
                | "MutatingWebhookConfiguration"
                | "ValidatingWebhookConfiguration"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "CustomResourceDefinition"
        );
        // All in tollgate's namespace but the Role and RoleBinding for the Cluster
        // Autoscaler's status ConfigMap, which are kube-system's.
        let want = if doc["metadata"]["name"] == "tollgate-cluster-autoscaler-status" {
            "kube-system"
        } else {
            NAMESPACE
        };
        if namespaced {
            assert_eq!(doc["metadata"]["namespace"], want, "{kind}");
        }
    }
}

#[test]
fn webhooks_call_the_server_routes_through_the_service() {
    if !kubectl_available() {
        return;
    }
    let docs = base();
    let service = find(docs, "Service", "tollgate");
    for (kind, name, path) in [
        (
            "MutatingWebhookConfiguration",
            "mutate.tollgate.dev",
            "/mutate",
        ),
        (
            "ValidatingWebhookConfiguration",
            "validate.tollgate.dev",
            "/validate",
        ),
    ] {
        let hook = webhook(docs, kind);
        assert_eq!(hook["name"], name);
        let svc = &hook["clientConfig"]["service"];
        assert_eq!(
            svc["path"], path,
            "{kind} must call the server's {path} route"
        );
        assert_eq!(svc["name"], service["metadata"]["name"]);
        assert_eq!(svc["namespace"], service["metadata"]["namespace"]);
        assert_eq!(svc["port"], 443);
        assert!(
            hook["clientConfig"].get("caBundle").is_none(),
            "the base carries no caBundle; the overlays or `tollgate register` set it"
        );
        assert_eq!(hook["admissionReviewVersions"], serde_json::json!(["v1"]));
        assert_eq!(hook["sideEffects"], "None");
        let rules = hook["rules"].as_array().unwrap();
        assert_eq!(
            rules[0],
            serde_json::json!({
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            })
        );
        // Then exactly the workloads of the shipped policy, on CREATE and UPDATE, without
        // subresources.
        let mut registered = vec![];
        let mut runtimes = vec![];
        for rule in &rules[1..] {
            // Kubeflow Trainer's runtimes: the validating webhook's alone (never refused).
            if rule["resources"].as_array().unwrap().iter().any(|r| {
                matches!(
                    r.as_str(),
                    Some("trainingruntimes" | "clustertrainingruntimes")
                )
            }) {
                runtimes.push(rule.clone());
                continue;
            }
            assert_eq!(
                rule["operations"],
                serde_json::json!(["CREATE", "UPDATE"]),
                "{rule}"
            );
            assert_eq!(rule["scope"], "Namespaced", "{rule}");
            for g in rule["apiGroups"].as_array().unwrap() {
                for v in rule["apiVersions"].as_array().unwrap() {
                    for r in rule["resources"].as_array().unwrap() {
                        let r = r.as_str().unwrap();
                        assert!(!r.contains('/') && r != "*", "{kind}: {r}");
                        registered.push(format!(
                            "{}/{}/{r}",
                            g.as_str().unwrap(),
                            v.as_str().unwrap()
                        ));
                    }
                }
            }
        }
        registered.sort();
        let mut listed: Vec<String> = tollgate_core::Policy::builtin()
            .workloads
            .kinds
            .iter()
            .map(|k| format!("{}/{}/{}s", k.group, k.version, k.kind.to_ascii_lowercase()))
            .collect();
        listed.sort();
        assert_eq!(
            registered, listed,
            "{kind}: the workloads registered are the policy's"
        );
        let runtime_rule = |resource: &str, scope: &str| {
            serde_json::json!({
                "apiGroups": ["trainer.kubeflow.org"],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": [resource],
                "scope": scope,
            })
        };
        let expected_runtimes = if kind == "ValidatingWebhookConfiguration" {
            vec![
                runtime_rule("trainingruntimes", "Namespaced"),
                runtime_rule("clustertrainingruntimes", "Cluster"),
            ]
        } else {
            vec![]
        };
        assert_eq!(
            runtimes, expected_runtimes,
            "{kind}: the Trainer runtimes' rules"
        );
        assert_eq!(hook["failurePolicy"], "Fail", "{kind}");
        let timeout = hook["timeoutSeconds"].as_u64().expect("timeoutSeconds set");
        assert!((1..=10).contains(&timeout), "{kind} timeout {timeout}");
    }
    let mutate = webhook(docs, "MutatingWebhookConfiguration");
    assert_eq!(mutate["reinvocationPolicy"], "IfNeeded");
    // The worst case the API server waits on tollgate for one pod: mutation, its
    // reinvocation and validation, well inside the API server's request timeout.
    let validate = webhook(docs, "ValidatingWebhookConfiguration");
    let worst = 2 * mutate["timeoutSeconds"].as_u64().unwrap()
        + validate["timeoutSeconds"].as_u64().unwrap();
    assert!(worst <= 20, "worst-case admission wait {worst}s");
}

/// The policy objects' webhook: both kinds, created or updated, in every namespace, through
/// the route the pods' validating webhook takes (the review sends group tollgate.dev to the
/// objects' judgement), failing open (see the manifest's comment).
#[test]
fn the_policy_objects_webhook_reviews_both_kinds_everywhere_and_fails_open() {
    if !kubectl_available() {
        return;
    }
    let docs = base();
    let hook = objects_webhook(docs);
    let pods = webhook(docs, "ValidatingWebhookConfiguration");
    assert_eq!(hook["clientConfig"], pods["clientConfig"]);
    assert_eq!(hook["clientConfig"]["service"]["path"], "/validate");
    assert_eq!(
        hook["rules"],
        serde_json::json!([{
            "apiGroups": [tollgate_core::POLICY_GROUP],
            "apiVersions": [tollgate_core::POLICY_VERSION],
            "operations": ["CREATE", "UPDATE"],
            "resources": [
                tollgate_core::POLICY_PLURAL,
                tollgate_core::PROFILE_PLURAL,
            ],
            "scope": "*",
        }])
    );
    assert!(hook.get("namespaceSelector").is_none(), "every namespace");
    assert!(hook.get("objectSelector").is_none());
    assert_eq!(hook["failurePolicy"], "Ignore");
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["admissionReviewVersions"], serde_json::json!(["v1"]));
    assert_eq!(hook["matchPolicy"], "Equivalent");
    let timeout = hook["timeoutSeconds"].as_u64().expect("timeoutSeconds set");
    assert!((1..=10).contains(&timeout), "timeout {timeout}");
}

#[test]
fn enforcement_needs_the_label_and_never_reaches_system_namespaces() {
    if !kubectl_available() {
        return;
    }
    let docs = base();
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let selector = &webhook(docs, kind)["namespaceSelector"];
        let ns = |name: &'static str, enforce: Option<&'static str>| {
            let mut labels = vec![("kubernetes.io/metadata.name", name)];
            if let Some(value) = enforce {
                labels.push(("tollgate.dev/enforce", value));
            }
            labels
        };
        assert!(selects(selector, &ns("team-a", Some("enabled"))), "{kind}");
        assert!(!selects(selector, &ns("team-a", None)), "{kind}");
        assert!(
            !selects(selector, &ns("team-a", Some("disabled"))),
            "{kind}"
        );
        assert!(!selects(selector, &ns("default", None)), "{kind}");
        // Even a mistaken label never puts these behind the webhook.
        for system in ["kube-system", NAMESPACE] {
            assert!(
                !selects(selector, &ns(system, Some("enabled"))),
                "{kind} {system}"
            );
        }
        // The exclusion is by name (a label every namespace has), not by a label one could
        // forget to set.
        let exprs = selector["matchExpressions"].as_array().unwrap();
        assert!(exprs
            .iter()
            .any(|e| e["key"] == "kubernetes.io/metadata.name" && e["operator"] == "NotIn"));
    }
    // tollgate's own namespace exists in the base and is not labelled for enforcement.
    let namespace = find(docs, "Namespace", NAMESPACE);
    assert_ne!(
        namespace["metadata"]["labels"]["tollgate.dev/enforce"],
        "enabled"
    );
}

#[test]
fn service_probes_and_args_agree_with_the_container() {
    if !kubectl_available() {
        return;
    }
    let docs = base();
    let service = find(docs, "Service", "tollgate");
    let c = container(docs);
    let ports = service["spec"]["ports"].as_array().unwrap();
    let https = ports.iter().find(|p| p["port"] == 443).expect("port 443");
    assert_eq!(https["name"], "https");
    assert_eq!(resolve_port(c, &https["targetPort"]), 8443);
    let metrics = ports
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("metrics port");
    assert_eq!(resolve_port(c, &metrics["targetPort"]), 9090);

    // The Service, the PDB and the Deployment select the Deployment's pods.
    let deployment = find(docs, "Deployment", "tollgate");
    let pod_labels: Vec<(&str, &str)> = deployment["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
        .collect();
    let service_selector = serde_json::json!({ "matchLabels": service["spec"]["selector"] });
    assert!(selects(&service_selector, &pod_labels));
    assert!(selects(&deployment["spec"]["selector"], &pod_labels));
    let pdb = find(docs, "PodDisruptionBudget", "tollgate");
    assert!(selects(&pdb["spec"]["selector"], &pod_labels));
    assert_eq!(pdb["spec"]["minAvailable"], 1);

    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(get["scheme"], "HTTPS", "{probe}");
        assert_eq!(resolve_port(c, &get["port"]), 8443, "{probe}");
    }

    assert_eq!(arg(c, "--listen"), "0.0.0.0:8443");
    assert_eq!(arg(c, "--metrics-listen"), "0.0.0.0:9090");
    assert_eq!(arg(c, "--log-format"), "json");
    assert_eq!(c["args"][0], "serve");
}

#[test]
fn deployment_is_hardened_and_highly_available() {
    if !kubectl_available() {
        return;
    }
    let docs = base();
    let deployment = find(docs, "Deployment", "tollgate");
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(
        deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    let pod = pod_spec(docs);
    let spread = pod["topologySpreadConstraints"].as_array().unwrap();
    assert!(spread
        .iter()
        .any(|s| s["topologyKey"] == "kubernetes.io/hostname"));
    // The server drains within 10 s of SIGTERM; the kubelet must wait longer than that.
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(grace > 10, "terminationGracePeriodSeconds {grace}");
    // priorityClassName system-cluster-critical is refused outside kube-system on some
    // clusters.
    assert!(pod.get("priorityClassName").is_none());
    assert_eq!(pod["automountServiceAccountToken"], false);

    let psc = &pod["securityContext"];
    assert_eq!(psc["runAsNonRoot"], true);
    assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault");

    let c = container(docs);
    assert!(
        c["lifecycle"].is_null(),
        "no preStop hook: the server drains"
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(c["resources"]["requests"]["memory"].is_string());
    assert!(c["resources"]["limits"]["memory"].is_string());
}

#[test]
fn policy_and_certificate_are_mounted_where_the_args_point() {
    if !kubectl_available() {
        return;
    }
    let docs = base();
    let pod = pod_spec(docs);
    let c = container(docs);
    let mounts = c["volumeMounts"].as_array().unwrap();
    let volumes = pod["volumes"].as_array().unwrap();
    // The volume (by mount) holding `path`, and the file's name inside it.
    let volume_for = |path: &str| -> (&Value, String) {
        let (dir, file) = path.rsplit_once('/').unwrap();
        let mount = mounts
            .iter()
            .find(|m| m["mountPath"] == dir)
            .unwrap_or_else(|| panic!("nothing is mounted at {dir} for {path}"));
        assert!(
            mount.get("subPath").is_none(),
            "{dir}: a subPath mount never sees the kubelet's ..data swap (no hot reload)"
        );
        assert_eq!(mount["readOnly"], true);
        let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
        (volume, file.to_owned())
    };

    let (policy_volume, policy_file) = volume_for(arg(c, "--policy"));
    let config_map = find(
        docs,
        "ConfigMap",
        policy_volume["configMap"]["name"].as_str().unwrap(),
    );
    let rendered = config_map["data"][policy_file.as_str()]
        .as_str()
        .expect("the ConfigMap has the file --policy names");
    let policy = std::fs::read_to_string(root().join("policies/default.yaml")).unwrap();
    assert_eq!(
        rendered, policy,
        "the policy ConfigMap differs from policies/default.yaml"
    );

    for flag in ["--tls-cert", "--tls-key"] {
        let (volume, file) = volume_for(arg(c, flag));
        assert_eq!(volume["secret"]["secretName"], "tollgate-tls", "{flag}");
        assert!(["tls.crt", "tls.key"].contains(&file.as_str()), "{flag}");
    }
}

#[test]
fn policy_copy_in_deploy_base_is_identical() {
    // No kubectl needed. kustomize reads nothing outside deploy/base, so the policy is
    // copied there; this keeps the copy honest.
    let original = std::fs::read(root().join("policies/default.yaml")).unwrap();
    let copy = std::fs::read(root().join("deploy/base/policy/default.yaml")).unwrap();
    assert!(
        original == copy,
        "deploy/base/policy/default.yaml differs from policies/default.yaml; run\n  \
         cp policies/default.yaml deploy/base/policy/default.yaml"
    );
}

#[test]
fn dockerfile_defaults_match_the_deployment() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let json_line = |instruction: &str| -> Vec<String> {
        let line = dockerfile
            .lines()
            .find(|l| l.starts_with(instruction))
            .unwrap_or_else(|| panic!("no {instruction} in the Dockerfile"));
        serde_json::from_str(line[instruction.len()..].trim()).unwrap()
    };
    assert_eq!(json_line("ENTRYPOINT "), ["/tollgate"]);
    let cmd = json_line("CMD ");
    assert!(dockerfile.contains("\nUSER 65532"));
    // No environment of its own: the binary sets its allocator's options (src/main.rs),
    // so that the image behaves as the binary run by hand, which the memory figures of
    // docs/operations.md are measured with.
    assert!(
        !dockerfile.contains("\nENV "),
        "the Dockerfile sets an environment"
    );
    assert!(dockerfile.contains("FROM gcr.io/distroless/cc-debian12:nonroot"));
    assert!(dockerfile.contains("cargo build --release --locked"));
    if !kubectl_available() {
        return;
    }
    let docs = base();
    let c = container(docs);
    let flag_value = |flag: &str| {
        let i = cmd.iter().position(|a| a == flag).unwrap();
        cmd[i + 1].clone()
    };
    assert_eq!(cmd[0], "serve");
    for flag in ["--policy", "--tls-cert", "--tls-key"] {
        assert_eq!(flag_value(flag), arg(c, flag), "{flag}");
    }
    assert_eq!(pod_spec(docs)["securityContext"]["runAsUser"], 65532);
}

#[test]
fn cert_manager_overlay_injects_the_ca_of_the_serving_certificate() {
    if !kubectl_available() {
        return;
    }
    let docs = render(&root().join("deploy/overlays/cert-manager"));
    let serving: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "Certificate" && d["spec"]["secretName"] == "tollgate-tls")
        .collect();
    assert_eq!(
        serving.len(),
        1,
        "one Certificate writes Secret tollgate-tls"
    );
    let serving = serving[0];
    assert_eq!(serving["metadata"]["namespace"], NAMESPACE);
    let dns: Vec<&str> = serving["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert!(dns.contains(&"tollgate.tollgate-system.svc"), "{dns:?}");
    assert_ne!(serving["spec"]["isCA"], true);

    // The issuer chain: serving <- CA issuer <- CA certificate <- self-signed issuer.
    let issuer = find(
        &docs,
        "Issuer",
        serving["spec"]["issuerRef"]["name"].as_str().unwrap(),
    );
    let ca_secret = issuer["spec"]["ca"]["secretName"].as_str().unwrap();
    let ca_cert = docs
        .iter()
        .find(|d| d["kind"] == "Certificate" && d["spec"]["secretName"] == ca_secret)
        .expect("a Certificate writes the CA issuer's Secret");
    assert_eq!(ca_cert["spec"]["isCA"], true);
    let root_issuer = find(
        &docs,
        "Issuer",
        ca_cert["spec"]["issuerRef"]["name"].as_str().unwrap(),
    );
    assert!(root_issuer["spec"]["selfSigned"].is_object());

    let want = format!(
        "{NAMESPACE}/{}",
        serving["metadata"]["name"].as_str().unwrap()
    );
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let config = find(&docs, kind, "tollgate");
        assert_eq!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            want.as_str(),
            "{kind}"
        );
        // Otherwise the same webhooks as the base.
        assert_eq!(
            config["webhooks"],
            find(base(), kind, "tollgate")["webhooks"]
        );
    }
    // Everything in the base is in the overlay.
    for doc in base() {
        let kind = doc["kind"].as_str().unwrap();
        let name = doc["metadata"]["name"].as_str().unwrap();
        find(&docs, kind, name);
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A CA and a serving certificate for the Service, as `tollgate certs` writes them.
fn write_throwaway_certs(dir: &Path) -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "tollgate test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec![format!("tollgate.{NAMESPACE}.svc")]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();

    let (ca, crt, key) = (ca_cert.pem(), cert.pem(), key.serialize_pem());
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("ca.crt"), &ca).unwrap();
    std::fs::write(dir.join("tls.crt"), &crt).unwrap();
    std::fs::write(dir.join("tls.key"), &key).unwrap();
    (ca, crt, key)
}

/// A base64 value as Kubernetes reads it (line breaks ignored).
fn decode_base64(value: &Value) -> Vec<u8> {
    let compact: String = value
        .as_str()
        .unwrap()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    serde_json::from_value::<k8s_openapi::ByteString>(Value::String(compact))
        .unwrap()
        .0
}

#[test]
fn dev_overlay_turns_cert_files_into_the_secret_and_ca_bundle() {
    if !kubectl_available() {
        return;
    }
    // A throwaway copy of deploy/, so the real (git-ignored) certs directory is untouched.
    let tmp = tempfile::tempdir().unwrap();
    let deploy = tmp.path().join("deploy");
    copy_dir(&root().join("deploy"), &deploy);
    let certs = deploy.join("overlays/dev/certs");
    let _ = std::fs::remove_dir_all(&certs);
    let (ca, crt, key) = write_throwaway_certs(&certs);

    let docs = render(&deploy.join("overlays/dev"));
    let secret = find(&docs, "Secret", "tollgate-tls");
    assert_eq!(secret["metadata"]["namespace"], NAMESPACE);
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(decode_base64(&secret["data"]["ca.crt"]), ca.as_bytes());
    assert_eq!(decode_base64(&secret["data"]["tls.crt"]), crt.as_bytes());
    assert_eq!(decode_base64(&secret["data"]["tls.key"]), key.as_bytes());

    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        webhook(&docs, kind);
        let mut hooks = find(&docs, kind, "tollgate")["webhooks"].clone();
        for hook in hooks.as_array_mut().unwrap() {
            let name = hook["name"].clone();
            let bundle = hook["clientConfig"]
                .as_object_mut()
                .unwrap()
                .remove("caBundle")
                .unwrap_or_else(|| panic!("{kind} {name}: no caBundle"));
            assert_eq!(
                decode_base64(&bundle),
                ca.as_bytes(),
                "{kind} {name}: caBundle is the CA that signed the serving certificate"
            );
        }
        // Apart from the caBundle, the base's webhooks.
        assert_eq!(hooks, find(base(), kind, "tollgate")["webhooks"]);
    }
    // The Deployment mounts the Secret the overlay generates, under its stable name.
    let tls = pod_spec(&docs)["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"].is_object())
        .unwrap();
    assert_eq!(tls["secret"]["secretName"], "tollgate-tls");
}

#[tokio::test]
async fn register_dry_run_matches_the_base_webhooks() {
    if !kubectl_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (ca, _, _) = write_throwaway_certs(tmp.path());
    let mut args = tollgate::register::RegisterArgs::new(tmp.path().join("ca.crt"));
    args.dry_run = true;
    let yaml = tollgate::register::execute(&args).await.unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
    assert_eq!(docs.len(), 2);
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let mut registered = find(&docs, kind, "tollgate").clone();
        for hook in registered["webhooks"].as_array_mut().unwrap() {
            let client_config = hook["clientConfig"].as_object_mut().unwrap();
            let bundle = client_config.remove("caBundle").expect("caBundle set");
            assert_eq!(decode_base64(&bundle), ca.as_bytes());
        }
        assert_eq!(
            &registered,
            find(base(), kind, "tollgate"),
            "`tollgate register` and deploy/base disagree on the {kind}"
        );
    }
}

/// `tollgate register --url`, for tollgate outside the cluster, through a real apiserver:
/// both configurations stored with each webhook's `clientConfig.url` (the Service's path
/// after it, no Service) and the CA, the apiserver calling the server there for a pod of a
/// namespace it enforces; run again over the configurations it made, the same; an identity
/// without the rights told so in the apiserver's words, never a Debug dump.
///
/// On `bare_plane`, which serves no CRD (the policy objects' webhook never fires there) and
/// where no other test labels a namespace `tollgate.dev/enforce` (the pods' webhooks reach
/// only this test's): deploy/base's `tollgate` configurations are cluster-wide.
#[tokio::test]
async fn register_url_points_the_apiserver_at_a_server_outside_the_cluster() {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;

    let Some(cp) = common::envtest::bare_plane() else {
        return;
    };
    let served = tokio::task::spawn_blocking(|| {
        let (dir, ca) = common::process::workdir();
        common::process::serve(dir, ca, None, "json", &[])
    })
    .await
    .unwrap();
    let ca_file = served.dir.path().join("ca.crt");
    std::fs::write(&ca_file, &served.ca_pem).unwrap();
    let url = format!("https://127.0.0.1:{}", served.addr.port());
    let register = |user: &str| {
        let kubeconfig = cp.kubeconfig(user).display().to_string();
        let args: Vec<String> = ["register", "--ca-file", ca_file.to_str().unwrap()]
            .into_iter()
            .map(str::to_owned)
            .chain([
                "--url".into(),
                url.clone(),
                "--kubeconfig".into(),
                kubeconfig,
            ])
            .collect();
        common::bin::run_blocking(args)
    };
    let admin = cp.client("admin").await;

    let first = register("admin").await;
    let again = register("admin").await;
    let refused = register("mallory").await;
    let stored = kube::Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .get("tollgate")
        .await
        .unwrap();
    let ns = cp
        .namespace("register-url", &[("tollgate.dev/enforce", "enabled")])
        .await;
    let reviewed = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        common::admission::until_reviewed(&admin, &served, &ns),
    )
    .await;
    common::admission::deregister(&admin, "tollgate").await;

    for out in [&first, &again] {
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("validatingwebhookconfiguration.admissionregistration.k8s.io/tollgate serverside-applied"), "{said}");
    }
    let hook = &stored.webhooks.as_ref().unwrap()[0];
    assert_eq!(
        hook.client_config.url.as_deref(),
        Some(&*format!("{url}/mutate"))
    );
    assert!(hook.client_config.service.is_none());
    assert_eq!(
        hook.client_config.ca_bundle.as_ref().unwrap().0,
        served.ca_pem.as_bytes()
    );
    assert!(reviewed.is_ok(), "the apiserver never called {url}");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(err.starts_with("tollgate: forbidden: "), "{err}");
    assert!(err.contains("User \"mallory\" cannot"), "{err}");
    assert!(!err.contains("Status {") && !err.contains("Some("), "{err}");
}

/// The cluster context reads claims, claim templates and namespaces, and nothing else;
/// its token is mounted where in-cluster clients look for it, and nowhere by default.
#[test]
fn cluster_context_rbac_is_read_only_and_exact() {
    if !kubectl_available() {
        return;
    }
    let docs = base();
    let role = find(docs, "ClusterRole", "tollgate-cluster-context");
    let mut grants: Vec<String> = vec![];
    for rule in role["rules"].as_array().unwrap() {
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(verbs, ["get", "list", "watch"], "{rule}");
        for g in rule["apiGroups"].as_array().unwrap() {
            for r in rule["resources"].as_array().unwrap() {
                grants.push(format!("{}/{}", g.as_str().unwrap(), r.as_str().unwrap()));
            }
        }
    }
    grants.sort();
    assert_eq!(
        grants,
        [
            "/namespaces",
            "/nodes",
            "/resourcequotas",
            "karpenter.sh/nodepools",
            "kueue.x-k8s.io/clusterqueues",
            "kueue.x-k8s.io/localqueues",
            "resource.k8s.io/deviceclasses",
            "resource.k8s.io/resourceclaims",
            "resource.k8s.io/resourceclaimtemplates",
            "trainer.kubeflow.org/clustertrainingruntimes",
            "trainer.kubeflow.org/trainingruntimes"
        ]
    );
    // In kube-system, one ConfigMap by name, read only: whether the Cluster Autoscaler
    // runs.
    let status = find(docs, "Role", "tollgate-cluster-autoscaler-status");
    assert_eq!(status["metadata"]["namespace"], "kube-system");
    assert_eq!(
        status["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["configmaps"],
            "resourceNames": ["cluster-autoscaler-status"], "verbs": ["get", "list", "watch"]}])
    );
    let status_binding = find(docs, "RoleBinding", "tollgate-cluster-autoscaler-status");
    assert_eq!(status_binding["subjects"][0]["name"], "tollgate");
    assert_eq!(status_binding["subjects"][0]["namespace"], NAMESPACE);
    let binding = find(docs, "ClusterRoleBinding", "tollgate-cluster-context");
    assert_eq!(binding["roleRef"]["name"], "tollgate-cluster-context");
    assert_eq!(binding["subjects"][0]["kind"], "ServiceAccount");
    assert_eq!(binding["subjects"][0]["name"], "tollgate");
    assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);

    let c = container(docs);
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount")
        .expect("the token is mounted where in-cluster clients read it");
    let volume = pod_spec(docs)["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let sources = volume["projected"]["sources"].as_array().unwrap();
    assert!(sources
        .iter()
        .any(|s| s["serviceAccountToken"]["path"] == "token"));
    assert!(sources
        .iter()
        .any(|s| s["configMap"]["name"] == "kube-root-ca.crt"));
}

/// The two-teams example renders, replaces only the policy file, and that policy loads with
/// its three profiles (profiles on namespace labels: the Deployment's cluster context is on).
/// The policy objects' RBAC: tollgate's account reads both kinds and writes only their
/// status (and its Lease, by name); a namespace's admins get the TollgateProfile through
/// the built-in `admin` ClusterRole (aggregation), and nothing of the TollgatePolicy.
#[test]
fn policy_objects_rbac_is_exact() {
    if !kubectl_available() {
        return;
    }
    let docs = base();
    let mut mine: Vec<String> = grants(docs)
        .into_iter()
        .filter(|(_, r, _, n)| {
            r.starts_with("tollgate.dev/")
                || n.as_deref() == Some("tollgate-policy-status")
                || (r == "coordination.k8s.io/leases")
        })
        .map(|(ns, r, v, n)| {
            let n = n.map(|n| format!("/{n}")).unwrap_or_default();
            match ns {
                Some(ns) => format!("{ns}: {v} {r}{n}"),
                None => format!("{v} {r}{n}"),
            }
        })
        .collect();
    mine.sort();
    let mut want: Vec<String> = policy_objects_needs(false).into_iter().collect();
    want.extend(
        policy_objects_needs(true)
            .difference(&policy_objects_needs(false))
            .map(|g| format!("{NAMESPACE}: {g}")),
    );
    want.sort();
    assert_eq!(mine, want);

    let editor = find(docs, "ClusterRole", "tollgate-profile-editor");
    assert_eq!(
        editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"],
        "true"
    );
    assert_eq!(
        editor["rules"],
        serde_json::json!([{
            "apiGroups": ["tollgate.dev"],
            "resources": ["tollgateprofiles"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        }])
    );
    // Bound to no one: the admin role aggregates it, and a RoleBinding grants that.
    assert!(!docs
        .iter()
        .any(|d| d["roleRef"]["name"] == "tollgate-profile-editor"));
}

#[test]
fn two_teams_example_replaces_the_policy_with_profiles() {
    let text =
        std::fs::read_to_string(root().join("deploy/overlays/two-teams/policy.yaml")).unwrap();
    let policy = tollgate_core::Policy::from_text("two-teams/policy.yaml", &text).unwrap();
    let names: Vec<&str> = policy.profiles.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["team-a", "team-b", "sandbox"]);
    let a = policy.profiles[0].policy().unwrap();
    assert_eq!(a.mutation.default_resources.per_gpu["memory"].0, "64Gi");
    assert_eq!(
        a.gpu.classes["nvidia"].tolerations.as_ref().unwrap().len(),
        2
    );
    assert_eq!(
        a.gpu.classes["nvidia"].resources, policy.gpu.classes["nvidia"].resources,
        "the rest of the class is the shipped one"
    );
    if !kubectl_available() {
        return;
    }
    let docs = render(&root().join("deploy/overlays/two-teams"));
    let cm = find(&docs, "ConfigMap", "tollgate-policy");
    assert_eq!(cm["data"]["default.yaml"].as_str().unwrap(), text);
    assert_eq!(
        kinds(&docs).len(),
        render(&root().join("deploy/overlays/cert-manager")).len(),
        "nothing but the policy changes"
    );
    let c = container(&docs);
    assert!(
        !arg_present(c, "--cluster-context"),
        "the cluster context stays on"
    );
}

fn arg_present(container: &Value, flag: &str) -> bool {
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == flag)
}

/// What the manifests grant tollgate's service account (`common::rbac::Grant`s).
fn grants(docs: &[Value]) -> Vec<common::rbac::Grant> {
    common::rbac::grants(docs, "tollgate", NAMESPACE)
}

/// deploy/components/policy-reports turns the audit on with what it needs and nothing
/// else; its crd component is the PolicyReport CRD the server writes.
#[test]
fn the_audit_component_adds_its_flag_rbac_and_crd_and_nothing_else() {
    if !kubectl_available() {
        return;
    }
    let docs = render(&root().join("deploy/overlays/audit"));
    let plain = render(&root().join("deploy/overlays/cert-manager"));
    let mut added: Vec<String> = kinds(&docs);
    for k in kinds(&plain) {
        let i = added.iter().position(|a| *a == k).unwrap();
        added.remove(i);
    }
    assert_eq!(
        added,
        [
            "ClusterRole/\"tollgate-audit\"",
            "ClusterRoleBinding/\"tollgate-audit\"",
            "CustomResourceDefinition/\"policyreports.wgpolicyk8s.io\"",
            "Role/\"tollgate-audit-lease\"",
            "RoleBinding/\"tollgate-audit-lease\"",
        ]
    );
    let c = container(&docs);
    let interval = arg(c, "--audit-interval");
    assert_eq!(
        tollgate::cli::parse_duration(interval),
        Ok(std::time::Duration::from_secs(600))
    );
    let env = c["env"].as_array().unwrap();
    assert!(env
        .iter()
        .any(|e| e["name"] == "POD_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"));
    let mut plain_args = container(&plain)["args"].as_array().unwrap().clone();
    plain_args.extend([Value::from("--audit-interval"), Value::from(interval)]);
    // The namespaces the webhooks never act in are not audited either.
    let never = webhook(&docs, "ValidatingWebhookConfiguration")["namespaceSelector"]
        ["matchExpressions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == "kubernetes.io/metadata.name" && e["operator"] == "NotIn")
        .unwrap()["values"]
        .clone();
    for ns in never.as_array().unwrap() {
        plain_args.extend([Value::from("--audit-exclude-namespace"), ns.clone()]);
    }
    assert_eq!(
        c["args"].as_array().unwrap(),
        &plain_args,
        "only the audit's flags are added"
    );

    let lease_role = find(&docs, "Role", "tollgate-audit-lease");
    assert_eq!(lease_role["metadata"]["namespace"], NAMESPACE);
    // The grants the component adds to the cert-manager install's (the base's leases of
    // other duties are not the audit's).
    let mut added_grants = grants(&docs);
    for g in grants(&plain) {
        let i = added_grants.iter().position(|a| *a == g).unwrap();
        added_grants.remove(i);
    }
    let mut audit: Vec<String> = added_grants
        .into_iter()
        .filter(|(_, r, _, _)| {
            r.starts_with("/pods") || r.contains("policyreports") || r.contains("leases")
        })
        .map(|(ns, r, v, n)| {
            format!(
                "{}{r} {v}{}",
                ns.map(|n| format!("{n}:")).unwrap_or_default(),
                n.map(|n| format!(" {n}")).unwrap_or_default()
            )
        })
        .collect();
    audit.sort();
    // The workloads it judges: `list` on exactly the shipped policy's kinds.
    let mut workloads: Vec<String> = grants(&docs)
        .into_iter()
        .filter(|(ns, r, _, _)| {
            // The kinds' resources: the cluster context's runtimes share TrainJob's group.
            ns.is_none()
                && tollgate_core::Policy::builtin()
                    .workloads
                    .kinds
                    .iter()
                    .any(|k| *r == format!("{}/{}s", k.group, k.kind.to_ascii_lowercase()))
        })
        .map(|(_, r, v, _)| format!("{r} {v}"))
        .collect();
    workloads.sort();
    let mut listed: Vec<String> = tollgate_core::Policy::builtin()
        .workloads
        .kinds
        .iter()
        .map(|k| format!("{}/{}s list", k.group, k.kind.to_ascii_lowercase()))
        .collect();
    listed.sort();
    // RBAC has no versions: two versions of one kind (MPIJob v1 and v2beta1) are one grant.
    listed.dedup();
    assert_eq!(workloads, listed, "the audit lists the policy's workloads");
    assert_eq!(
        audit,
        [
            "/pods list",
            "tollgate-system:coordination.k8s.io/leases create",
            "tollgate-system:coordination.k8s.io/leases get tollgate-audit",
            "tollgate-system:coordination.k8s.io/leases update tollgate-audit",
            "wgpolicyk8s.io/policyreports create",
            "wgpolicyk8s.io/policyreports delete",
            "wgpolicyk8s.io/policyreports get",
            "wgpolicyk8s.io/policyreports list",
            "wgpolicyk8s.io/policyreports update",
        ]
    );

    let crd = find(
        &docs,
        "CustomResourceDefinition",
        "policyreports.wgpolicyk8s.io",
    );
    assert_eq!(crd["spec"]["group"], "wgpolicyk8s.io");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(crd["spec"]["names"]["kind"], tollgate::audit::report::KIND);
    let v = &crd["spec"]["versions"][0];
    assert_eq!(
        format!("wgpolicyk8s.io/{}", v["name"].as_str().unwrap()),
        tollgate::audit::report::API_VERSION
    );
    assert_eq!(
        (v["served"].as_bool(), v["storage"].as_bool()),
        (Some(true), Some(true))
    );
    let props = &v["schema"]["openAPIV3Schema"]["properties"];
    assert_eq!(
        props["results"]["items"]["properties"]["properties"]["additionalProperties"]["type"],
        "string"
    );
    // Without the crd component: the same, less the CRD (clusters with Kyverno have it).
    // Kustomize takes only relative paths: from the temporary directory up to `/`, then
    // down to this checkout.
    let dir = tempfile::tempdir().unwrap();
    let up = "../".repeat(dir.path().components().count() - 1);
    let here = format!(
        "{up}{}",
        root().display().to_string().trim_start_matches('/')
    );
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "resources:\n  - {here}/deploy/overlays/cert-manager\ncomponents:\n  - {here}/deploy/components/policy-reports\n"
        ),
    )
    .unwrap();
    let without = render(dir.path());
    assert_eq!(without.len(), docs.len() - 1);
    assert!(without
        .iter()
        .all(|d| d["metadata"]["name"] != "policyreports.wgpolicyk8s.io"));
}

/// What the background audit and the cluster context may do, as the shipped RBAC of the
/// base and the audit component grants it (`verb group/resource[/name]`): the reads of the
/// cluster context and the audit's lists, cluster-wide, and in the server's own namespace
/// its Lease, `create` unnamed (the object does not exist yet).
pub(crate) fn audit_needs(home: bool) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut add = |verbs: &[&str], group: &str, resources: &[&str]| {
        for v in verbs {
            for r in resources {
                out.insert(format!("{v} {group}/{r}"));
            }
        }
    };
    let read = ["get", "list", "watch"];
    // The cluster context: what a review needs of other objects, and feasibility's view.
    add(
        &read,
        "resource.k8s.io",
        &["resourceclaims", "resourceclaimtemplates", "deviceclasses"],
    );
    add(&read, "", &["namespaces", "nodes", "resourcequotas"]);
    add(
        &read,
        "trainer.kubeflow.org",
        &["trainingruntimes", "clustertrainingruntimes"],
    );
    add(&read, "kueue.x-k8s.io", &["localqueues", "clusterqueues"]);
    add(&read, "karpenter.sh", &["nodepools"]);
    // The audit: pods and the workloads of the shipped policy's kinds, listed.
    add(&["list"], "", &["pods"]);
    add(&["list"], "batch", &["jobs", "cronjobs"]);
    add(
        &["list"],
        "apps",
        &["deployments", "statefulsets", "replicasets", "daemonsets"],
    );
    add(
        &["list"],
        "kubeflow.org",
        &[
            "pytorchjobs",
            "tfjobs",
            "mpijobs",
            "xgboostjobs",
            "jaxjobs",
            "paddlejobs",
        ],
    );
    add(&["list"], "jobset.x-k8s.io", &["jobsets"]);
    add(
        &["list"],
        "trainer.kubeflow.org",
        &["trainjobs", "optimizationjobs"],
    );
    add(
        &["list"],
        "ray.io",
        &["rayjobs", "rayclusters", "rayservices"],
    );
    add(&["list"], "batch.volcano.sh", &["jobs"]);
    add(&["list"], "leaderworkerset.x-k8s.io", &["leaderworkersets"]);
    // The start rule: the Warning events of pods bound and not started.
    add(&["list"], "", &["events"]);
    // Its reports: written, replaced, removed when stale, listed to find the stale.
    add(
        &["get", "list", "create", "update", "delete"],
        "wgpolicyk8s.io",
        &["policyreports"],
    );
    if home {
        add(&["create"], "coordination.k8s.io", &["leases"]);
        add(
            &["get", "update"],
            "coordination.k8s.io",
            &["leases/tollgate-audit"],
        );
    }
    out.extend(policy_objects_needs(home));
    out
}

/// What the base grants for the policy as Kubernetes objects: the TollgatePolicy and the
/// TollgateProfiles read, their status written (never their specs), and in tollgate's own
/// namespace the Lease of the replica that writes the status.
pub(crate) fn policy_objects_needs(home: bool) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for v in ["get", "list", "watch"] {
        for r in ["tollgatepolicies", "tollgateprofiles"] {
            out.insert(format!("{v} tollgate.dev/{r}"));
        }
    }
    for v in ["update", "patch"] {
        for r in ["tollgatepolicies/status", "tollgateprofiles/status"] {
            out.insert(format!("{v} tollgate.dev/{r}"));
        }
    }
    if home {
        out.insert("create coordination.k8s.io/leases".to_owned());
        for v in ["get", "update"] {
            out.insert(format!(
                "{v} coordination.k8s.io/leases/tollgate-policy-status"
            ));
        }
    }
    out
}

/// deploy/overlays/audit's ServiceAccount, bound by its RBAC as shipped (moved into a
/// namespace of the test's own), runs `tollgate serve` with the cluster context and the
/// background audit, and `tollgate audit`, against the real apiserver with a token of its
/// own (TokenRequest): the RBAC is sufficient (the background audit writes a report and
/// removes a stale one, and nothing in either's output is forbidden) and no wider than the
/// code needs (what the apiserver says the account may do, beyond what every account may,
/// is exactly [`audit_needs`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_runs_as_the_shipped_service_account_which_may_do_no_more() {
    use common::identity;
    use serde_json::json;
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let Some(docs) = common::rbac::render_if_kubectl("deploy/overlays/audit") else {
        return;
    };
    let _audit = identity::background_audit().await;
    identity::crds(
        cp,
        "deploy/components/policy-reports/crd/wgpolicyk8s.io_policyreports.yaml",
    )
    .await
    .unwrap();
    let home = cp.namespace("deploy-audit-home", &[]).await;
    let ml = cp.namespace("deploy-audit-ml", &[]).await;
    let clean = cp.namespace("deploy-audit-clean", &[]).await;
    // As shipped, moved into the test's namespace, its cluster-wide objects under names of
    // the test's own.
    let rbac = identity::own_names(&identity::moved(&identity::rbac_of(&docs), &home), &home);
    identity::apply(cp, &rbac).unwrap();
    let kubeconfig = identity::service_account(cp, &home, "tollgate").await;
    let nobody = identity::service_account(cp, &home, "bound-to-nothing").await;

    let admin = cp.client("admin").await;
    for o in [
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nb", "namespace": ml},
            "spec": {"containers": [{"name": "j", "image": "j"}]}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ok", "namespace": clean},
            "spec": {"containers": [{"name": "j", "image": "j",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}),
        // A stale report, for the delete.
        json!({"apiVersion": "wgpolicyk8s.io/v1alpha2", "kind": "PolicyReport",
            "metadata": {"name": "tollgate", "namespace": clean,
                "labels": {"app.kubernetes.io/managed-by": "tollgate"}}}),
    ] {
        identity::create(&admin, o).await;
    }
    // The shared apiserver's other namespaces (other tests'), as they are now, are left
    // out: the account may read and write all of them.
    let others = identity::other_namespaces(&admin, &[&home, &ml, &clean]).await;
    let kc = kubeconfig.display().to_string();
    let mut args: Vec<String> = [
        "--cluster-context",
        "on",
        "--kubeconfig",
        &kc,
        "--audit-interval",
        "1s",
        "--audit-rate",
        "1000000",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for ns in &others {
        args.extend(["--audit-exclude-namespace".to_owned(), ns.clone()]);
    }
    let (dir, ca) = common::process::workdir();
    let served = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::process::serve(dir, ca, None, "json", &args)
    })
    .await
    .unwrap();
    let reports = |ns: &str| {
        let ar = kube::api::ApiResource {
            group: "wgpolicyk8s.io".into(),
            version: "v1alpha2".into(),
            api_version: "wgpolicyk8s.io/v1alpha2".into(),
            kind: "PolicyReport".into(),
            plural: "policyreports".into(),
        };
        kube::Api::<kube::api::DynamicObject>::namespaced_with(admin.clone(), ns, &ar)
    };
    let started = std::time::Instant::now();
    loop {
        let written = reports(&ml).get_opt("tollgate").await.unwrap().is_some();
        let stale = reports(&clean).get_opt("tollgate").await.unwrap().is_some();
        if written && !stale {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "no audit run: {:#?}",
            served.lines()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let lines = served.lines();
    drop(served);
    let text = lines.join("\n");
    let forbidden = common::identity::refusals(&text);
    assert!(forbidden.is_empty(), "{forbidden:#?}");

    let out = common::bin::command()
        .args(["audit", "--kubeconfig", &kc, "-n", &ml, "--output", "json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        !err.contains("forbidden") && !err.contains("not audited"),
        "{err}"
    );

    assert_eq!(
        identity::granted(cp, &kubeconfig, &nobody, &home).await,
        audit_needs(true)
    );
    assert_eq!(
        identity::granted(cp, &kubeconfig, &nobody, &ml).await,
        audit_needs(false)
    );
    let cluster_scoped: Vec<Value> = rbac
        .into_iter()
        .filter(|d| d["metadata"]["namespace"].is_null())
        .collect();
    identity::delete(cp, &cluster_scoped).unwrap();
}

const NATIVE_VALIDATION: &str = "deploy/overlays/native-validation";
const VAP_FILE: &str = "deploy/overlays/native-validation/validating-admission-policy.yaml";

#[test]
fn native_validation_policy_file_is_the_current_export() {
    // No kubectl needed: the committed file is what `tollgate export` prints for the
    // shipped policy, so a change to the policy or the export cannot leave it behind.
    let out = common::bin::command()
        .args(["export", "validating-admission-policy"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let committed = std::fs::read(root().join(VAP_FILE)).unwrap();
    assert!(
        committed == out.stdout,
        "{VAP_FILE} is not the current export; run\n  \
         cargo run -q -- export validating-admission-policy > {VAP_FILE}"
    );
}

#[test]
fn native_validation_overlay_swaps_the_validating_webhook_for_the_policy() {
    if !kubectl_available() {
        return;
    }
    let docs = render(&root().join(NATIVE_VALIDATION));
    let cert_manager = render(&root().join("deploy/overlays/cert-manager"));
    // The cert-manager install, less the pods' validating webhook, plus the policy and
    // binding.
    let mut want: Vec<String> = kinds(&cert_manager)
        .into_iter()
        .chain([
            "ValidatingAdmissionPolicy/\"validate.tollgate.dev\"".to_owned(),
            "ValidatingAdmissionPolicyBinding/\"validate.tollgate.dev\"".to_owned(),
        ])
        .collect();
    want.sort();
    assert_eq!(kinds(&docs), want);
    // The mutating webhook is the cert-manager overlay's, untouched.
    assert_eq!(
        find(&docs, "MutatingWebhookConfiguration", "tollgate"),
        find(&cert_manager, "MutatingWebhookConfiguration", "tollgate")
    );
    // The validating configuration keeps the policy objects' webhook alone (served by the
    // mutating webhook's pods), the CA still injected.
    let mut validating = find(&cert_manager, "ValidatingWebhookConfiguration", "tollgate").clone();
    validating["webhooks"] = serde_json::json!([objects_webhook(&cert_manager)]);
    assert_eq!(
        find(&docs, "ValidatingWebhookConfiguration", "tollgate"),
        &validating
    );

    let policy = find(&docs, "ValidatingAdmissionPolicy", "validate.tollgate.dev");
    let binding = find(
        &docs,
        "ValidatingAdmissionPolicyBinding",
        "validate.tollgate.dev",
    );
    assert!(
        policy["metadata"].get("namespace").is_none(),
        "cluster-scoped"
    );
    assert_eq!(binding["spec"]["policyName"], "validate.tollgate.dev");
    assert_eq!(
        binding["spec"]["validationActions"],
        serde_json::json!(["Deny"])
    );
    // kustomize rewrote the file's YAML; what it means is the export's.
    let exported: Vec<Value> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(root().join(VAP_FILE)).unwrap())
            .unwrap();
    assert_eq!(policy, &exported[0]);
    assert_eq!(binding, &exported[1]);

    // Pod CREATEs, in exactly the namespaces the validating webhook selects.
    let constraints = &policy["spec"]["matchConstraints"];
    let selector = &constraints["namespaceSelector"];
    assert_eq!(
        selector,
        &webhook(base(), "ValidatingWebhookConfiguration")["namespaceSelector"]
    );
    let ns = |name: &'static str, enforce: Option<&'static str>| {
        let mut labels = vec![("kubernetes.io/metadata.name", name)];
        if let Some(value) = enforce {
            labels.push(("tollgate.dev/enforce", value));
        }
        labels
    };
    assert!(selects(selector, &ns("team-a", Some("enabled"))));
    assert!(!selects(selector, &ns("team-a", None)));
    for system in ["kube-system", NAMESPACE] {
        assert!(!selects(selector, &ns(system, Some("enabled"))), "{system}");
    }
    // The pods' rule: the workloads' rules of the validating webhook are its own (the
    // export judges pods only).
    assert_eq!(
        constraints["resourceRules"],
        serde_json::json!([webhook(base(), "ValidatingWebhookConfiguration")["rules"][0]])
    );
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
}

//! Pod Security, held to the real apiserver's PodSecurity admission (kube-apiserver v1.36):
//!
//! - tollgate's checks (the engine's `podsecurity`, which feasibility, the workloads'
//!   `/validate`, `review` and `audit` all use) decide as the apiserver does: generated pods,
//!   random combinations of every baseline and restricted check's violating and compliant
//!   fields, created (`dryRun=All`) in namespaces whose enforce label is baseline or
//!   restricted, at `latest` and pinned to v1.24; tollgate's refusal is the apiserver's,
//!   word for word (`pods "x" is forbidden: violates PodSecurity "baseline:v1.24": ...`), and
//!   where the apiserver admits a pod tollgate finds nothing;
//! - a compliant GPU pod, and a GPU Job whose pods the job controller makes, are created at
//!   every level with tollgate's webhooks registered (`tollgate serve` watching the
//!   namespaces): tollgate adds nothing the namespace forbids (no hostPath driver at
//!   baseline or restricted, the sidecar as restricted requires it), and its other
//!   mutations still apply.

use std::collections::BTreeMap;

use crate::common;

use common::rng::Rng;
use serde_json::{json, Value};
use tollgate_core::{pod_security_refusal, PodSecurity};

/// The enforce levels the generated pods are held to: each level's latest, and v1.24
/// (before restricted's Windows exemptions of 1.25, after runAsUser's check of 1.23).
const ENFORCED: &[(&str, &str)] = &[
    ("baseline", "latest"),
    ("baseline", "v1.24"),
    ("restricted", "latest"),
    ("restricted", "v1.24"),
];

fn opt<'a>(rng: &mut Rng, items: &'a [Option<Value>]) -> Option<&'a Value> {
    rng.pick(items).as_ref()
}

/// A pod of random security-relevant fields, valid as the apiserver validates pods (so
/// that what refuses it is Pod Security, not validation): no `allowPrivilegeEscalation:
/// false` beside privileged or SYS_ADMIN, `procMount: Unmasked` only with `hostUsers:
/// false`, which goes without the host's namespaces, no probes on init containers.
fn generated(rng: &mut Rng, name: &str) -> Value {
    let user_namespace = rng.chance(10);
    let mut spec = json!({"restartPolicy": "Never", "containers": []});
    if user_namespace {
        spec["hostUsers"] = json!(false);
    } else {
        for field in ["hostNetwork", "hostPID", "hostIPC"] {
            if rng.chance(7) {
                spec[field] = json!(true);
            }
        }
    }
    let mut psc = serde_json::Map::new();
    if let Some(v) = opt(rng, &[None, None, Some(json!(true)), Some(json!(false))]) {
        psc.insert("runAsNonRoot".into(), v.clone());
    }
    if let Some(v) = opt(rng, &[None, None, Some(json!(0)), Some(json!(1000))]) {
        psc.insert("runAsUser".into(), v.clone());
    }
    if let Some(v) = opt(
        rng,
        &[
            None,
            None,
            Some(json!({"type": "RuntimeDefault"})),
            Some(json!({"type": "Unconfined"})),
            Some(json!({"type": "Localhost", "localhostProfile": "profiles/train.json"})),
        ],
    ) {
        psc.insert("seccompProfile".into(), v.clone());
    }
    if rng.chance(8) {
        let options = [
            json!({"type": "container_t"}),
            json!({"type": "spc_t"}),
            json!({"type": "container_engine_t"}),
            json!({"user": "system_u"}),
            json!({"role": "sysadm_r", "type": "unconfined_t"}),
        ];
        psc.insert("seLinuxOptions".into(), rng.pick(&options).clone());
    }
    if rng.chance(12) {
        let names = rng.some(
            &[
                "kernel.shm_rmid_forced",
                "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time",
                "net.ipv4.tcp_rmem",
                "kernel.msgmax",
                "net.core.somaxconn",
            ],
            35,
        );
        let values: Vec<Value> = names
            .iter()
            .map(|n| {
                let value = match *n {
                    "net.ipv4.tcp_rmem" => "4096 87380 6291456",
                    "net.ipv4.ip_local_reserved_ports" => "30000",
                    _ => "1",
                };
                json!({"name": n, "value": value})
            })
            .collect();
        if !values.is_empty() {
            psc.insert("sysctls".into(), json!(values));
        }
    }
    if rng.chance(8) {
        let t = rng.pick(&["RuntimeDefault", "Unconfined"]);
        psc.insert("appArmorProfile".into(), json!({"type": t}));
    }
    if !psc.is_empty() {
        spec["securityContext"] = Value::Object(psc);
    }
    let volumes = rng.some(
        &[
            json!({"name": "scratch", "emptyDir": {}}),
            json!({"name": "config", "configMap": {"name": "c"}}),
            json!({"name": "driver", "hostPath": {"path": "/usr/local/nvidia"}}),
            json!({"name": "data", "nfs": {"server": "nfs.example.com", "path": "/data"}}),
            json!({"name": "token", "secret": {"secretName": "s"}}),
            json!({"name": "claim", "persistentVolumeClaim": {"claimName": "c"}}),
            json!({"name": "ceph", "cephfs": {"monitors": ["10.0.0.9:6789"]}}),
        ],
        15,
    );
    if !volumes.is_empty() {
        spec["volumes"] = json!(volumes);
    }
    let mut names = vec![];
    if rng.chance(30) {
        names.push(("init", true));
    }
    names.push(("trainer", false));
    if rng.chance(40) {
        names.push(("helper", false));
    }
    for (i, (cname, init)) in names.into_iter().enumerate() {
        // Ports of their own: two containers on one port are invalid.
        let (port, plain) = (8080 + i, 9090 + i);
        let mut c = json!({"name": cname, "image": "registry.example.com/trainer:1.0"});
        if rng.chance(75) {
            c["securityContext"] = container_context(rng, user_namespace);
        }
        if rng.chance(10) {
            c["ports"] = json!([{"containerPort": port, "hostPort": port}]);
        } else if rng.chance(15) {
            // With the host's network, the apiserver makes this a hostPort.
            c["ports"] = json!([{"containerPort": plain}]);
        }
        if !init && rng.chance(6) {
            c["livenessProbe"] = json!({"httpGet": {"port": 8080, "host": "10.0.0.1"}});
        }
        if !init && rng.chance(4) {
            c["readinessProbe"] = json!({"tcpSocket": {"port": 8080, "host": "10.0.0.2"}});
        }
        if !init && rng.chance(3) {
            c["lifecycle"] = json!({"preStop": {"httpGet": {"port": 8080, "host": "10.0.0.3"}}});
        }
        let list = if init { "initContainers" } else { "containers" };
        if spec.get(list).is_none() {
            spec[list] = json!([]);
        }
        spec[list].as_array_mut().unwrap().push(c);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

fn container_context(rng: &mut Rng, user_namespace: bool) -> Value {
    let mut sc = serde_json::Map::new();
    let privileged = rng.chance(8);
    if privileged {
        sc.insert("privileged".into(), json!(true));
    } else if rng.chance(4) {
        sc.insert("privileged".into(), json!(false));
    }
    let mut sys_admin = false;
    if rng.chance(55) {
        let mut caps = serde_json::Map::new();
        let add = rng.some(&["SYS_ADMIN", "NET_RAW", "NET_BIND_SERVICE", "CHOWN"], 15);
        sys_admin = add.contains(&"SYS_ADMIN");
        if !add.is_empty() {
            caps.insert("add".into(), json!(add));
        }
        let drops = [
            json!(["ALL"]),
            json!(["ALL"]),
            json!(["NET_RAW"]),
            json!([]),
        ];
        caps.insert("drop".into(), rng.pick(&drops).clone());
        sc.insert("capabilities".into(), Value::Object(caps));
    }
    let escalation: &[Option<Value>] = if privileged || sys_admin {
        &[None, Some(json!(true))]
    } else {
        &[
            None,
            Some(json!(true)),
            Some(json!(false)),
            Some(json!(false)),
        ]
    };
    if let Some(v) = opt(rng, escalation) {
        sc.insert("allowPrivilegeEscalation".into(), v.clone());
    }
    if let Some(v) = opt(
        rng,
        &[
            None,
            Some(json!(true)),
            Some(json!(true)),
            Some(json!(false)),
        ],
    ) {
        sc.insert("runAsNonRoot".into(), v.clone());
    }
    if let Some(v) = opt(rng, &[None, None, Some(json!(0)), Some(json!(1000))]) {
        sc.insert("runAsUser".into(), v.clone());
    }
    if let Some(v) = opt(
        rng,
        &[
            None,
            None,
            Some(json!({"type": "RuntimeDefault"})),
            Some(json!({"type": "Unconfined"})),
        ],
    ) {
        sc.insert("seccompProfile".into(), v.clone());
    }
    if rng.chance(8) {
        let m = if user_namespace {
            "Unmasked"
        } else {
            "Default"
        };
        sc.insert("procMount".into(), json!(m));
    }
    if rng.chance(5) {
        sc.insert("appArmorProfile".into(), json!({"type": "Unconfined"}));
    }
    if rng.chance(5) {
        sc.insert("seLinuxOptions".into(), json!({"type": "spc_t"}));
    }
    Value::Object(sc)
}

/// tollgate's word on a pod in a namespace of these labels, as the apiserver's refusal
/// would end.
fn tollgates(labels: &BTreeMap<String, String>, pod: &Value) -> Option<String> {
    let security = PodSecurity::of_labels(labels)?;
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod.clone()).unwrap();
    pod_security_refusal(&security, &pod.metadata, pod.spec.as_ref().unwrap())
}

#[tokio::test]
async fn tollgates_pod_security_is_the_apiservers_on_generated_pods() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let admin = cp.client("admin").await;
    let seeds: u64 = std::env::var("TOLLGATE_PSA_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let mut spaces = vec![];
    for (level, version) in ENFORCED {
        let labels = [
            ("pod-security.kubernetes.io/enforce", *level),
            ("pod-security.kubernetes.io/enforce-version", *version),
        ];
        let ns = cp.namespace(&format!("psa-{level}"), &labels).await;
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        spaces.push((ns, labels));
    }
    let mut items = vec![];
    for seed in 0..seeds {
        let mut rng = Rng::new(seed + 1);
        let pod = generated(&mut rng, &format!("p-{seed}"));
        for (ns, labels) in &spaces {
            items.push((seed, ns.clone(), labels.clone(), pod.clone()));
        }
    }
    // A few at a time: the plane is shared, and other tests wait on its informers.
    use futures::StreamExt as _;
    let outcomes: Vec<_> = futures::stream::iter(items)
        .map(|(seed, ns, labels, pod)| {
            let admin = admin.clone();
            async move {
                let mut sent = pod.clone();
                sent["metadata"]["namespace"] = json!(ns);
                let answer = common::apiserver::create(&admin, &sent, true).await;
                (seed, labels, pod, answer)
            }
        })
        .buffered(4)
        .collect()
        .await;
    let (mut refused, mut admitted, mut invalid) = (0, 0, 0);
    // Every check of baseline and restricted (but Windows' hostProcess, which a Linux pod
    // cannot carry validly beside the others) is seen refusing some pod.
    let mut unseen: std::collections::BTreeSet<&str> = [
        "forbidden AppArmor profile",
        "non-default capabilities",
        "host namespaces",
        "hostPath volumes",
        "hostPort",
        "probe or lifecycle host",
        "privileged (",
        "procMount",
        "seLinuxOptions",
        "seccompProfile",
        "forbidden sysctls",
        "allowPrivilegeEscalation != false",
        "unrestricted capabilities",
        "restricted volume types",
        "runAsNonRoot != true",
        "runAsUser=0",
    ]
    .into_iter()
    .collect();
    let mut failures = vec![];
    for (seed, labels, pod, answer) in outcomes {
        let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
        let ours = tollgates(&labels, &pod);
        let level = format!(
            "{}:{}",
            labels["pod-security.kubernetes.io/enforce"],
            labels["pod-security.kubernetes.io/enforce-version"]
        );
        match answer {
            Ok(_) => {
                admitted += 1;
                if let Some(words) = ours {
                    failures.push(format!("seed {seed} at {level}: the apiserver admits it, tollgate says {words}\n  {pod}"));
                }
            }
            Err(r) if r.code == 403 && r.message.contains("violates PodSecurity") => {
                refused += 1;
                unseen.retain(|check| !r.message.contains(check));
                let expected = ours.map(|w| format!("pods \"{name}\" is forbidden: {w}"));
                if expected.as_deref() != Some(r.message.as_str()) {
                    failures.push(format!(
                        "seed {seed} at {level}:\n  apiserver: {}\n  tollgate:  {expected:?}\n  {pod}",
                        r.message
                    ));
                }
            }
            // Refused before admission (validation): Pod Security never saw it.
            Err(r) if r.code == 422 => {
                invalid += 1;
                if std::env::var("TOLLGATE_PSA_INVALID").is_ok() {
                    eprintln!("invalid: {}", r.message);
                }
            }
            Err(r) => failures.push(format!("seed {seed} at {level}: {} {}", r.code, r.message)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} differ:\n{}",
        failures.len(),
        refused + admitted + invalid,
        failures.join("\n")
    );
    eprintln!(
        "pod security: {refused} refused and {admitted} admitted alike, {invalid} invalid (not judged)"
    );
    assert!(
        unseen.is_empty(),
        "checks no generated pod failed: {unseen:?}"
    );
    let judged = refused + admitted;
    assert!(
        invalid * 5 < judged && refused > judged / 4 && admitted > judged / 20,
        "the generated pods should mostly be judged, both ways: {refused} refused, {admitted} admitted, {invalid} invalid"
    );
}

/// A namespace's labels, whether tollgate may mount the driver there, and whether the
/// sidecar is held to restricted.
type Level = (&'static [(&'static str, &'static str)], bool, bool);

/// A GPU trainer that meets restricted itself.
fn compliant_trainer() -> Value {
    json!({"name": "trainer", "image": "registry.example.com/trainer:1.0",
        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000,
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}},
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}}})
}

/// A compliant GPU pod and a GPU Job, at every level, with tollgate's webhooks registered:
/// both created through the real apiserver (the Job's pods by the real job controller),
/// with tollgate's other mutations and nothing the level forbids.
#[tokio::test]
async fn a_compliant_gpu_pod_and_job_are_created_at_every_level_through_tollgate() {
    let Some(cp) = common::envtest::scheduling_plane() else {
        return;
    };
    let Some(rendered) = common::rbac::render_if_kubectl("deploy/base") else {
        return;
    };
    let admin = cp.client("admin").await;
    let kubeconfig = cp.kubeconfig("admin").to_string_lossy().into_owned();
    let served = tokio::task::spawn_blocking(move || {
        let (dir, ca) = common::process::workdir();
        common::process::serve(
            dir,
            ca,
            None,
            "json",
            &["--cluster-context", "on", "--kubeconfig", &kubeconfig],
        )
    })
    .await
    .unwrap();
    let (addr, ca) = (served.addr, served.ca_pem.clone());
    common::net::until("the server's cluster context to be ready", async || {
        let mut c = common::net::Client::connect(addr, &ca, false).await;
        common::net::ready(&mut c).await.0 == 200
    })
    .await;
    let name = common::context::unique("psa");
    for c in &common::admission::registration(&rendered, &name, served.addr.port(), &served.ca_pem)
    {
        common::apiserver::create(&admin, c, false)
            .await
            .unwrap_or_else(|e| panic!("registering {name}: {}", e.message));
    }
    let levels: &[Level] = &[
        (&[], true, false),
        (
            &[("pod-security.kubernetes.io/enforce", "privileged")],
            true,
            false,
        ),
        (
            &[("pod-security.kubernetes.io/enforce", "baseline")],
            false,
            false,
        ),
        (
            &[
                ("pod-security.kubernetes.io/enforce", "baseline"),
                ("pod-security.kubernetes.io/enforce-version", "v1.24"),
            ],
            false,
            false,
        ),
        (
            &[("pod-security.kubernetes.io/enforce", "restricted")],
            false,
            true,
        ),
        (
            &[
                ("pod-security.kubernetes.io/enforce", "restricted"),
                ("pod-security.kubernetes.io/enforce-version", "v1.24"),
            ],
            false,
            true,
        ),
        (
            &[("pod-security.kubernetes.io/warn", "restricted")],
            false,
            true,
        ),
        (
            &[("pod-security.kubernetes.io/audit", "baseline")],
            false,
            false,
        ),
    ];
    for (labels, driver, hardened) in levels {
        let mut all: Vec<(&str, &str)> = labels.to_vec();
        all.push(("tollgate.dev/enforce", "enabled"));
        all.push((common::admission::REGISTERED, &name));
        let ns = cp.namespace("psa-gpu", &all).await;
        // The webhooks in force here: a probe Pod Security admits at every level (its own
        // refusal comes before the validating webhook's review).
        let probe = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe", "namespace": ns},
            "spec": {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "c", "image": "probe",
                "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}},
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}});
        let seen = |endpoint: &str| {
            served
                .lines()
                .iter()
                .any(|l| l.contains(&ns) && l.contains(&format!("\"{endpoint}\"")))
        };
        common::net::until("the webhooks to be in force", async || {
            let _ = common::apiserver::create(&admin, &probe, true).await;
            seen("mutate") && seen("validate")
        })
        .await;
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer", "namespace": ns},
            "spec": {"restartPolicy": "Never", "containers": [compliant_trainer()]}});
        let created = common::apiserver::create(&admin, &pod, true)
            .await
            .unwrap_or_else(|e| panic!("{labels:?}: the GPU pod: {}", e.message));
        check_mutated(labels, &created, *driver, *hardened);

        let job = json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": ns},
            "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
                "containers": [compliant_trainer()]}}}});
        common::apiserver::create(&admin, &job, false)
            .await
            .unwrap_or_else(|e| panic!("{labels:?}: the Job: {}", e.message));
        let pods = common::scheduling::pods_of_job(cp, &admin, &ns, "train").await;
        let made = serde_json::to_value(&pods[0]).unwrap();
        check_mutated(labels, &made, *driver, *hardened);
    }
    common::admission::deregister(&admin, &name).await;
}

/// The pod as stored: tollgate's tolerations and sidecar, the driver only where the level
/// allows it (and then said in the applied annotation), the sidecar as restricted requires.
fn check_mutated(labels: &[(&str, &str)], pod: &Value, driver: bool, hardened: bool) {
    let spec = &pod["spec"];
    let tolerated = spec["tolerations"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["key"] == "nvidia.com/gpu"));
    assert!(tolerated, "{labels:?}: no GPU toleration: {pod}");
    let sidecar = spec["initContainers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "tollgate-metrics"))
        .unwrap_or_else(|| panic!("{labels:?}: no sidecar: {pod}"));
    let host_path = spec["volumes"]
        .as_array()
        .is_some_and(|v| v.iter().any(|v| v.get("hostPath").is_some()));
    assert_eq!(
        host_path, driver,
        "{labels:?}: the driver's hostPath: {pod}"
    );
    let applied = pod["metadata"]["annotations"]["tollgate.dev/applied"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(
        applied.contains("driver=runtime(pod-security:"),
        !driver,
        "{labels:?}: the applied annotation: {applied}"
    );
    let seccomp = &sidecar["securityContext"]["seccompProfile"]["type"];
    assert_eq!(
        seccomp == "RuntimeDefault",
        hardened,
        "{labels:?}: the sidecar: {sidecar}"
    );
}

//! The real binary's log lines: one per review with the fields an operator searches by, no
//! pod spec, opt-out decisions with who and where, reload failures, and the text format.

use crate::common;

use common::net::Client;
use common::process;
use serde_json::Value;

fn review_with_user(name: &str, uid: &str, user: &str, groups: &[&str]) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&common::fixture(name)).unwrap();
    v["request"]["uid"] = Value::String(uid.into());
    v["request"]["userInfo"] = serde_json::json!({"username": user, "groups": groups});
    serde_json::to_vec(&v).unwrap()
}

fn uid_of(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap();
    v["request"]["uid"].as_str().unwrap().to_owned()
}

/// Strings from the pod's spec that must never reach an info line: images, commands,
/// container names, volumes.
fn spec_strings(body: &[u8]) -> Vec<String> {
    let v: Value = serde_json::from_slice(body).unwrap();
    let mut out = vec![];
    for c in v["request"]["object"]["spec"]["containers"]
        .as_array()
        .unwrap()
    {
        out.push(c["image"].as_str().unwrap().to_owned());
        out.push(format!("\"{}\"", c["name"].as_str().unwrap()));
    }
    out.push("containers".into());
    out.push("nodeSelector".into());
    out
}

#[tokio::test]
async fn json_logs_have_one_line_per_review_with_its_fields_and_no_spec() {
    let (dir, ca) = process::workdir();
    let served = process::serve(dir, ca, None, "json", &["--reload-interval-ms", "50"]);
    let mut c = Client::connect(served.addr, &served.ca_pem, true).await;

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("/mutate", common::fixture("resnet50-master-0.mutate.json")),
        (
            "/mutate",
            common::fixture("resnet50-worker-generatename.mutate.json"),
        ),
        (
            "/validate",
            common::fixture("resnet50-master-0.validate.json"),
        ),
        ("/mutate", common::fixture("debug-shell.mutate.json")),
        (
            "/validate",
            review_with_user(
                "debug-shell.validate.json",
                "refused-validate",
                "alice@example.com",
                &["system:authenticated"],
            ),
        ),
    ];
    for (path, body) in &cases {
        assert_eq!(c.post(path, body.clone()).await.0, 200);
    }
    let mut review_lines = vec![];
    for (path, body) in &cases {
        let uid = uid_of(body);
        let line = served
            .wait_for_line(|l| l.contains("\"review\"") && l.contains(&uid))
            .await;
        let v: Value = serde_json::from_str(&line).expect("a JSON line");
        let sent: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["message"], "review");
        assert_eq!(v["uid"], uid.as_str());
        assert_eq!(v["endpoint"], &path[1..]);
        assert_eq!(v["namespace"], sent["request"]["namespace"]);
        assert_eq!(v["operation"], "CREATE");
        assert!(v["duration_us"].is_u64(), "{v}");
        assert_eq!(v["policy"].as_str().unwrap().len(), 16, "{v}");
        for s in spec_strings(body) {
            assert!(!line.contains(&s), "{s} from the pod spec in {line}");
        }
        review_lines.push(v);
    }
    let [patched, generated, denied, honoured, refused] = &review_lines[..] else {
        unreachable!()
    };
    assert_eq!(patched["name"], "resnet50-master-0");
    assert_eq!(patched["decision"], "patched");
    assert_eq!(
        patched["steps"],
        "tolerations,driver-mounts,metrics-sidecar,default-resources"
    );
    // generateName: the prefix, marked as one.
    assert_eq!(generated["name"], "resnet50-worker-*");
    assert_eq!(denied["decision"], "denied");
    assert_eq!(denied["verdict"], "missing_requests");
    assert_eq!(denied["steps"], "");
    assert_eq!(honoured["decision"], "allowed");
    assert_eq!(refused["decision"], "denied");

    // Opt-out decisions say who asked, where.
    let uid = uid_of(&cases[3].1);
    let line = served
        .wait_for_line(|l| l.contains("opt-out honoured") && l.contains(&uid))
        .await;
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["user"], "kubernetes-admin");
    assert_eq!(v["namespace"], "ml");
    assert_eq!(v["name"], "debug-shell");
    let line = served
        .wait_for_line(|l| l.contains("opt-out refused") && l.contains("refused-validate"))
        .await;
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["user"], "alice@example.com");
    assert_eq!(v["namespace"], "ml");
    assert!(
        v["reason"].as_str().unwrap().contains("not permitted"),
        "{v}"
    );

    // A body that is no review leaves a warning line too.
    assert_eq!(c.post("/validate", b"[]".to_vec()).await.0, 400);
    let line = served
        .wait_for_line(|l| l.contains("not a usable AdmissionReview"))
        .await;
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["level"], "WARN");
    assert_eq!(v["endpoint"], "validate");
    assert_eq!(v["status"], 400);

    // A policy file that does not parse: logged with the reason, the old policy kept.
    std::fs::write(
        served.dir.path().join("policy.yaml"),
        "validation: {mode: sometimes}\n",
    )
    .unwrap();
    let line = served
        .wait_for_line(|l| l.contains("policy reload rejected"))
        .await;
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["level"], "WARN");
    assert!(v["error"].as_str().unwrap().contains("policy.yaml"), "{v}");
    assert_eq!(v["policy"], patched["policy"], "the previous policy stays");

    // Every line is JSON.
    let lines = served.lines();
    assert!(
        lines
            .iter()
            .all(|l| serde_json::from_str::<Value>(l).is_ok()),
        "{lines:#?}"
    );
}

#[tokio::test]
async fn text_logs_are_plain_lines_with_the_same_fields() {
    let (dir, ca) = process::workdir();
    let served = process::serve(dir, ca, None, "text", &[]);
    let mut c = Client::connect(served.addr, &served.ca_pem, false).await;
    let body = common::fixture("resnet50-master-0.mutate.json");
    assert_eq!(c.post("/mutate", body.clone()).await.0, 200);
    let uid = uid_of(&body);
    let line = served
        .wait_for_line(|l| l.contains(" review ") && l.contains(&uid))
        .await;
    assert!(serde_json::from_str::<Value>(&line).is_err(), "{line}");
    for field in [
        "namespace=",
        "name=resnet50-master-0",
        "operation=CREATE",
        "decision=patched",
        "steps=tolerations,driver-mounts,metrics-sidecar,default-resources",
        "duration_us=",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    // Not a terminal: no colour escape codes.
    assert!(served.lines().iter().all(|l| !l.contains('\u{1b}')));
}

/// With the API server unreachable, the log says so once, with its URL, for every watch
/// and Lease together, and not again within the minute: not a line a retry (177 lines in
/// 8 s before, 82 of them kube-client's `client error (Connect)` without the URL).
#[test]
fn an_unreachable_api_server_is_said_once_with_its_url() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (dir, ca) = process::workdir();
    let kubeconfig = dir.path().join("unreachable.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context: {{cluster: k, user: u, namespace: tollgate-system}}\nusers:\n- name: u\n  user: {{token: t}}\n"
        ),
    )
    .unwrap();
    let kubeconfig = kubeconfig.display().to_string();
    let served = process::serve(
        dir,
        ca,
        None,
        "json",
        &[
            "--cluster-context",
            "on",
            "--kubeconfig",
            &kubeconfig,
            "--audit-interval",
            "1m",
        ],
    );
    // Every watch and both Leases have failed a few times over by then.
    std::thread::sleep(std::time::Duration::from_secs(5));
    let lines = served.lines();
    let url = format!("https://127.0.0.1:{port}/");
    let said: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("cannot reach the API server"))
        .collect();
    assert_eq!(said.len(), 1, "{lines:#?}");
    assert!(said[0].contains(&url), "{}", said[0]);
    assert!(said[0].contains("Connection refused"), "{}", said[0]);
    assert!(
        lines.iter().all(|l| !l.contains("client error (Connect)")),
        "{lines:#?}"
    );
    let warnings = lines
        .iter()
        .filter(|l| l.contains("\"WARN\"") || l.contains("\"ERROR\""))
        .count();
    assert_eq!(warnings, 1, "{lines:#?}");
}

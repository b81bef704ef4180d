//! deploy/monitoring: it renders, its ServiceMonitor finds the Service's metrics port, and
//! every metric its alerts and dashboard read is one the server really exports (scraped from
//! a real server after real reviews, its cluster context on the real kube-apiserver), and
//! is documented in docs/operations.md.
//!
//! The rendering tests need `kubectl` on PATH; without it they print why and pass.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::net::{self, Client};
use serde_json::Value;

/// kubectl, the machine's or the suite's own (tests/common/tools.rs); where none can be
/// had, a SKIPPED line names the test.
fn kubectl_available() -> bool {
    common::tools::kubectl().is_some()
}

fn render(dir: &str) -> Vec<Value> {
    let out = Command::new(common::tools::kubectl().unwrap())
        .arg("kustomize")
        .arg(common::root().join(dir))
        .output()
        .expect("running kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {dir} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "exactly one {kind}/{name}");
    found[0]
}

/// The shipped files, read directly (no kubectl needed).
fn rules_file() -> Value {
    let text =
        std::fs::read_to_string(common::root().join("deploy/monitoring/prometheusrule.yaml"))
            .unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

fn dashboard_file() -> Value {
    let text =
        std::fs::read_to_string(common::root().join("deploy/monitoring/dashboards/tollgate.json"))
            .unwrap();
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

fn docs_text() -> String {
    std::fs::read_to_string(common::root().join("docs/operations.md")).unwrap()
}

fn alert_rules() -> Vec<Value> {
    rules_file()["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect()
}

fn dashboard_exprs() -> Vec<String> {
    dashboard_file()["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().clone())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect()
}

/// The metric names a PromQL expression reads: identifiers left once strings, label
/// matchers, ranges, grouping clauses, function calls, keywords and numbers are set aside.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Aggregations may be followed by `by (...)` rather than `(`: never metric names.
    const KEYWORDS: [&str; 23] = [
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
    ];
    const GROUPING: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let mut skip_next_parens = false;
    while i < chars.len() {
        let c = chars[i];
        let skip_to = |close: char, from: usize| {
            let mut j = from + 1;
            while j < chars.len() && chars[j] != close {
                j += 1;
            }
            j + 1
        };
        if c == '"' {
            i = skip_to('"', i);
        } else if c == '{' {
            i = skip_to('}', i);
        } else if c == '[' {
            i = skip_to(']', i);
        } else if c == '(' && skip_next_parens {
            skip_next_parens = false;
            i = skip_to(')', i);
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut k = i;
            while k < chars.len() && chars[k].is_whitespace() {
                k += 1;
            }
            let is_call = k < chars.len() && chars[k] == '(';
            if GROUPING.contains(&word.as_str()) {
                skip_next_parens = true;
            } else if !is_call && !KEYWORDS.contains(&word.as_str()) {
                names.insert(word);
            }
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Metrics from elsewhere that the alerts may read: Prometheus's own `up`, and
/// kube-state-metrics' view of the Deployment.
const EXTERNAL: [&str; 2] = ["up", "kube_deployment_status_replicas_available"];

/// The names a real server exports once it has answered every kind of review, with its
/// cluster context on (against the real apiserver, tests/common/envtest.rs), as in the
/// Deployment; None (with a SKIPPED line) where no apiserver can be had.
async fn exported_names() -> Option<BTreeSet<String>> {
    let cp = common::envtest::plane()?;
    let path = cp.kubeconfig("admin");
    let server = net::start(|o| {
        o.cluster = Some(tollgate::server::ClusterOptions {
            kubeconfig: Some(path),
            context: None,
            fetch_timeout: std::time::Duration::from_millis(500),
        })
    })
    .await;
    let mut c = Client::connect(server.addr(), &server.ca_pem, true).await;
    for name in common::fixture_names() {
        let path = if name.contains("mutate") {
            "/mutate"
        } else {
            "/validate"
        };
        c.post(path, common::fixture(&name)).await;
    }
    c.post("/mutate", b"{}".to_vec()).await;
    let text = net::get_metrics(server.running.metrics_addr.unwrap()).await;
    server.running.shutdown().await;
    Some(common::scrape::names(&common::scrape::parse(&text)))
}

#[test]
fn metric_names_are_found_in_promql() {
    let got = metric_names(
        r#"histogram_quantile(0.99, sum by (le, endpoint) (rate(a_bucket{job="x", l=~"y|z"}[5m]))) > 0.25
           and on (pod) b_total - time() < 14 * 24 * 3600 or absent(up{job="t"} == 1) + c offset 5m"#,
    );
    let want: BTreeSet<String> = ["a_bucket", "b_total", "up", "c"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn alerts_and_dashboard_read_only_metrics_the_server_exports() {
    let Some(exported) = exported_names().await else {
        return;
    };
    let mut exprs: Vec<(String, String)> = alert_rules()
        .iter()
        .map(|r| {
            (
                format!("alert {}", r["alert"].as_str().unwrap()),
                r["expr"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    exprs.extend(
        dashboard_exprs()
            .into_iter()
            .map(|e| ("dashboard".to_owned(), e)),
    );
    let mut used = BTreeSet::new();
    for (what, expr) in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{what} reads no metric: {expr}");
        for n in names {
            if n.starts_with("tollgate_") {
                assert!(
                    exported.contains(&n),
                    "{what} reads {n}, which the server does not export:\n{expr}\nexported: {exported:#?}"
                );
                used.insert(n);
            } else {
                assert!(
                    EXTERNAL.contains(&n.as_str()) && what.starts_with("alert"),
                    "{what} reads {n}, neither tollgate's nor an expected external metric:\n{expr}"
                );
            }
        }
    }
    // Everything the issue asks to watch is on the dashboard or in an alert.
    for family in [
        "tollgate_reviews_total",
        "tollgate_review_duration_seconds_bucket",
        "tollgate_denials_total",
        "tollgate_opt_outs_total",
        "tollgate_requests_in_flight",
        "tollgate_certificate_expiry_timestamp_seconds",
        "tollgate_policy_info",
        "tollgate_policy_reloads_total",
        "tollgate_mutation_steps_total",
        "tollgate_certificate_rotations_total",
        "tollgate_certificate_renewal_timestamp_seconds",
    ] {
        assert!(
            used.contains(family),
            "{family} is neither charted nor alerted on"
        );
    }
}

#[tokio::test]
async fn every_exported_metric_is_documented() {
    let docs = docs_text();
    let Some(exported) = exported_names().await else {
        return;
    };
    for name in exported {
        let family = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name);
        assert!(
            docs.contains(&format!("`{family}`")),
            "{family} is not in docs/operations.md"
        );
    }
}

#[test]
fn every_alert_is_complete_and_has_a_runbook_section() {
    let docs = docs_text();
    let rules = alert_rules();
    assert!(rules.len() >= 5);
    let names: BTreeSet<&str> = rules.iter().map(|r| r["alert"].as_str().unwrap()).collect();
    for wanted in [
        "TollgateNoReadyReplicas",
        "TollgateReviewErrors",
        "TollgateHighLatency",
        "TollgateCertificateExpiringSoon",
        "TollgatePolicyReloadFailed",
    ] {
        assert!(names.contains(wanted), "{wanted} missing");
    }
    for r in &rules {
        let alert = r["alert"].as_str().unwrap();
        assert!(
            ["warning", "critical"].contains(&r["labels"]["severity"].as_str().unwrap_or("")),
            "{alert}: severity"
        );
        assert!(r["annotations"]["summary"].is_string(), "{alert}: summary");
        let url = r["annotations"]["runbook_url"].as_str().unwrap();
        let anchor = url.strip_prefix("docs/operations.md#").unwrap();
        let heading = docs
            .lines()
            .filter_map(|l| l.strip_prefix("### "))
            .any(|h| h.trim().to_ascii_lowercase() == anchor);
        assert!(
            heading,
            "{alert}: no '### ' heading for #{anchor} in docs/operations.md"
        );
    }
    // The certificate alert looks 14 days ahead.
    assert!(rules
        .iter()
        .any(|r| r["alert"] == "TollgateCertificateExpiringSoon"
            && r["expr"].as_str().unwrap().contains("14 * 24 * 3600")));
}

#[test]
fn dashboard_is_valid_grafana_json() {
    let d = dashboard_file();
    assert_eq!(d["uid"], "tollgate");
    let panels = d["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "panel ids are unique"
        );
        assert!(p["title"].is_string());
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{}", p["title"]);
    }
    let vars = d["templating"]["list"].as_array().unwrap();
    assert!(vars
        .iter()
        .any(|v| v["name"] == "datasource" && v["type"] == "datasource"));
}

#[test]
fn monitoring_renders_and_selects_the_tollgate_service_metrics_port() {
    if !kubectl_available() {
        return;
    }
    let docs = render("deploy/monitoring");
    let sm = find(&docs, "ServiceMonitor", "tollgate");
    find(&docs, "PrometheusRule", "tollgate");
    let cm = find(&docs, "ConfigMap", "tollgate-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value = serde_json::from_str(cm["data"]["tollgate.json"].as_str().unwrap())
        .expect("the ConfigMap carries the dashboard JSON");
    assert_eq!(shipped, dashboard_file());
    for d in &docs {
        assert_eq!(d["metadata"]["namespace"], "tollgate-system");
    }

    let base = render("deploy/base");
    let service = find(&base, "Service", "tollgate");
    let selector = sm["spec"]["selector"]["matchLabels"].as_object().unwrap();
    for (k, v) in selector {
        assert_eq!(
            &service["metadata"]["labels"][k], v,
            "the ServiceMonitor selects the Service by {k}"
        );
    }
    assert_eq!(
        sm["spec"]["namespaceSelector"]["matchNames"][0],
        service["metadata"]["namespace"]
    );
    let port = sm["spec"]["endpoints"][0]["port"].as_str().unwrap();
    assert_eq!(port, "metrics");
    let svc_port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port)
        .expect("the Service has a port named metrics");
    assert_eq!(svc_port["port"], 9090);
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
    // The rules' job="tollgate" is the job a ServiceMonitor gives: the Service's name.
    assert!(sm["spec"]["jobLabel"].is_null());
    assert_eq!(service["metadata"]["name"], "tollgate");
    assert!(Path::new(&common::root().join("deploy/monitoring/kustomization.yaml")).exists());
}

//! PolicyReports: one per namespace, named `tollgate`, in `wgpolicyk8s.io/v1alpha2`.
//!
//! Why that group and not OpenReports (`openreports.io/v1alpha1`): it is what Kyverno
//! writes by default and installs the CRD of, and every version of Policy Reporter (and
//! its UI) reads it; OpenReports is alpha in Kyverno 1.15 and Policy Reporter reading
//! both kinds at once is still being settled. [`API_VERSION`] and [`KIND`] are the one
//! place to change when OpenReports becomes the common one (its `Report` has the same
//! results and summary).
//!
//! A report lists every finding that is not a pass (fail, warn, skip, error), each with
//! the object in `resources[]` and tollgate's own data in `properties`; `summary` counts
//! every finding by result, and `pass` the objects with none. A report is bounded to
//! [`MAX_RESULTS`] results and 1 MiB of them (an object in etcd may not exceed 1.5 MiB): past that, results
//! are counted in the summary and in the annotation `tollgate.dev/results-omitted` but not
//! listed. So a namespace's report costs the same memory however many pods it has.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::Api;
use serde_json::{json, Value};

use tollgate_core::{Audited, Finding, FindingStatus, Rule};

pub const API_VERSION: &str = "wgpolicyk8s.io/v1alpha2";
pub const KIND: &str = "PolicyReport";
/// Each namespace's report is named so.
pub const NAME: &str = "tollgate";
/// The label that marks tollgate's reports, for finding stale ones.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "tollgate");
pub const OMITTED_ANNOTATION: &str = "tollgate.dev/results-omitted";
/// Results listed in one report at most; a result is well under 1 KiB.
pub const MAX_RESULTS: usize = 1000;
/// And their JSON at most this many bytes, well below etcd's 1.5 MiB for the whole object.
const MAX_BYTES: usize = 1024 * 1024;
/// Messages are cut to this many characters in a report.
const MAX_MESSAGE: usize = 500;

pub fn api_resource() -> ApiResource {
    ApiResource {
        group: "wgpolicyk8s.io".into(),
        version: "v1alpha2".into(),
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        plural: "policyreports".into(),
    }
}

/// Counts by result, as a report's `summary`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    pub pass: u64,
    pub fail: u64,
    pub warn: u64,
    pub error: u64,
    pub skip: u64,
}

/// One namespace's report, filled object by object.
#[derive(Debug, Clone)]
pub struct ReportBuilder {
    pub namespace: String,
    results: Vec<Value>,
    bytes: usize,
    omitted: u64,
    pub summary: Summary,
    /// Findings by rule, for metrics.
    pub by_rule: BTreeMap<&'static str, u64>,
    /// When the findings were found: the start of the audit run.
    seconds: i64,
}

impl ReportBuilder {
    pub fn new(namespace: &str, seconds: i64) -> ReportBuilder {
        ReportBuilder {
            namespace: namespace.to_owned(),
            results: vec![],
            bytes: 0,
            omitted: 0,
            summary: Summary::default(),
            by_rule: BTreeMap::new(),
            seconds,
        }
    }

    pub fn add(&mut self, a: &Audited) {
        if a.findings.is_empty() {
            self.summary.pass += 1;
        }
        for f in &a.findings {
            let n = match f.status {
                FindingStatus::Fail => &mut self.summary.fail,
                FindingStatus::Warn => &mut self.summary.warn,
                FindingStatus::Skip => &mut self.summary.skip,
                FindingStatus::Error => &mut self.summary.error,
            };
            *n += 1;
            *self.by_rule.entry(f.rule.as_str()).or_default() += 1;
            if self.results.len() < MAX_RESULTS && self.bytes < MAX_BYTES {
                let r = result(a, f, self.seconds);
                self.bytes += r.to_string().len();
                self.results.push(r);
            } else {
                self.omitted += 1;
            }
        }
    }

    /// Whether the namespace has anything to report (a namespace with nothing has no
    /// report).
    pub fn has_findings(&self) -> bool {
        !self.by_rule.is_empty()
    }

    /// The PolicyReport object.
    pub fn build(&self) -> Value {
        let s = &self.summary;
        let mut annotations = serde_json::Map::new();
        if self.omitted > 0 {
            annotations.insert(OMITTED_ANNOTATION.into(), json!(self.omitted.to_string()));
        }
        json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": NAME,
                "namespace": self.namespace,
                "labels": {MANAGED_BY.0: MANAGED_BY.1},
                "annotations": annotations,
            },
            "summary": {"pass": s.pass, "fail": s.fail, "warn": s.warn, "error": s.error, "skip": s.skip},
            "results": self.results,
        })
    }
}

/// A finding as a PolicyReport result. `properties` are strings (the CRD says so).
fn result(a: &Audited, f: &Finding, seconds: i64) -> Value {
    let mut properties = serde_json::Map::new();
    properties.insert("category".into(), json!(f.rule.category()));
    properties.insert("optOut".into(), json!(a.opt_out.as_str()));
    properties.insert(
        "profile".into(),
        json!(a.profile.as_deref().unwrap_or(tollgate_core::BASE_PROFILE)),
    );
    properties.insert("mode".into(), json!(a.mode.as_str()));
    if f.rule == Rule::Requests {
        let missing: Vec<String> = f
            .missing
            .iter()
            .map(|m| format!("{} {}: {}", m.noun, m.container, m.resources.join(",")))
            .collect();
        properties.insert("missing".into(), json!(missing.join("; ")));
    }
    let mut message = f.message.clone();
    if message.chars().count() > MAX_MESSAGE {
        message = message.chars().take(MAX_MESSAGE - 1).collect();
        message.push('…');
    }
    let o = &a.object;
    json!({
        "policy": "tollgate",
        "rule": f.rule.as_str(),
        "category": f.rule.category(),
        "result": f.status.as_str(),
        "scored": true,
        "source": "tollgate",
        "message": message,
        "timestamp": {"seconds": seconds, "nanos": 0},
        "resources": [{
            "apiVersion": o.api_version,
            "kind": o.kind,
            "namespace": o.namespace,
            "name": o.name,
            "uid": o.uid,
        }],
        "properties": properties,
    })
}

/// A result's identity across runs: the same finding on the same object keeps the time it
/// was first found, so a report whose findings did not change is not rewritten.
fn key(r: &Value) -> (String, String, String, String) {
    let s = |p: &str| {
        r.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    (
        s("/rule"),
        s("/resources/0/uid"),
        s("/result"),
        s("/message"),
    )
}

/// Gives `new`'s results the timestamps of the same results in `old`.
fn carry_timestamps(new: &mut Value, old: &Value) {
    let found: BTreeMap<_, _> = old["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| (key(r), r["timestamp"].clone()))
        .collect();
    if let Some(results) = new["results"].as_array_mut() {
        for r in results {
            if let Some(t) = found.get(&key(r)) {
                r["timestamp"] = t.clone();
            }
        }
    }
}

/// Whether the cluster's report already says what `new` says.
fn same(new: &Value, old: &Value) -> bool {
    new["results"] == old["results"]
        && new["summary"] == old["summary"]
        && new["metadata"]["labels"][MANAGED_BY.0] == old["metadata"]["labels"][MANAGED_BY.0]
        && new["metadata"]["annotations"][OMITTED_ANNOTATION]
            == old["metadata"]["annotations"][OMITTED_ANNOTATION]
}

/// What writing a report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Created,
    Updated,
    Unchanged,
    Deleted,
    /// There was none to delete.
    Absent,
}

impl Written {
    pub fn as_str(self) -> &'static str {
        match self {
            Written::Created => "created",
            Written::Updated => "updated",
            Written::Unchanged => "unchanged",
            Written::Deleted => "deleted",
            Written::Absent => "absent",
        }
    }
}

/// Tries after a 409 (another writer, or a create racing a create) before giving up.
const ATTEMPTS: usize = 5;

/// Writes a namespace's report: created if absent, replaced (optimistically, with the
/// resourceVersion read) if it differs, left alone if it says the same.
pub async fn write(client: &kube::Client, report: Value) -> Result<Written, kube::Error> {
    let namespace = report["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &api_resource());
    let mut last = None;
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(50 * attempt as u64)).await;
        }
        let mut new = report.clone();
        let result = match api.get_opt(NAME).await? {
            None => {
                let obj: DynamicObject =
                    serde_json::from_value(new).map_err(kube::Error::SerdeError)?;
                api.create(&PostParams::default(), &obj)
                    .await
                    .map(|_| Written::Created)
            }
            Some(existing) => {
                let old = serde_json::to_value(&existing).map_err(kube::Error::SerdeError)?;
                carry_timestamps(&mut new, &old);
                if same(&new, &old) {
                    return Ok(Written::Unchanged);
                }
                // Labels and annotations others put on the report stay.
                let mut labels = existing.metadata.labels.clone().unwrap_or_default();
                labels.insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
                let mut annotations = existing.metadata.annotations.clone().unwrap_or_default();
                annotations.remove(OMITTED_ANNOTATION);
                if let Some(n) = new["metadata"]["annotations"][OMITTED_ANNOTATION].as_str() {
                    annotations.insert(OMITTED_ANNOTATION.into(), n.to_owned());
                }
                new["metadata"] = json!({
                    "name": NAME,
                    "namespace": namespace,
                    "resourceVersion": existing.metadata.resource_version,
                    "labels": labels,
                    "annotations": annotations,
                });
                let obj: DynamicObject =
                    serde_json::from_value(new).map_err(kube::Error::SerdeError)?;
                api.replace(NAME, &PostParams::default(), &obj)
                    .await
                    .map(|_| Written::Updated)
            }
        };
        match result {
            Err(kube::Error::Api(s)) if s.code == 409 => last = Some(kube::Error::Api(s)),
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| unreachable!("ATTEMPTS > 0")))
}

/// Deletes a namespace's report, if it has one.
pub async fn delete(client: &kube::Client, namespace: &str) -> Result<Written, kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &api_resource());
    match api.delete(NAME, &DeleteParams::default()).await {
        Ok(_) => Ok(Written::Deleted),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Written::Absent),
        Err(e) => Err(e),
    }
}

/// The namespaces that hold one of tollgate's reports (by its label), in pages.
pub async fn namespaces_with_reports(client: &kube::Client) -> Result<Vec<String>, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource());
    let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
    let mut lp = ListParams::default().labels(&selector).limit(500);
    let mut out = vec![];
    loop {
        let page = api.list(&lp).await?;
        out.extend(
            page.items
                .into_iter()
                .filter(|r| r.metadata.name.as_deref() == Some(NAME))
                .filter_map(|r| r.metadata.namespace),
        );
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::audit_object;
    use tollgate_core::Objects;
    use tollgate_core::Policy;

    fn notebook(i: usize) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("nb-{i}"), "namespace": "ml", "uid": format!("u-{i}")},
            "spec": {"containers": [{"name": "jupyter", "image": "j"}]}})
    }

    #[test]
    fn a_report_lists_findings_counts_passes_and_is_bounded() {
        let policy = Policy::builtin();
        let mut b = ReportBuilder::new("ml", 1_700_000_000);
        let fine = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "ok", "namespace": "ml", "uid": "u-ok"},
            "spec": {"containers": [{"name": "c", "image": "c",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}});
        b.add(&audit_object(&policy, &Objects::complete(), fine));
        assert!(!b.has_findings());
        for i in 0..MAX_RESULTS + 5 {
            b.add(&audit_object(&policy, &Objects::complete(), notebook(i)));
        }
        let r = b.build();
        assert_eq!(r["apiVersion"], API_VERSION);
        assert_eq!(r["metadata"]["name"], NAME);
        assert_eq!(r["results"].as_array().unwrap().len(), MAX_RESULTS);
        assert_eq!(r["metadata"]["annotations"][OMITTED_ANNOTATION], "5");
        assert_eq!(r["summary"]["fail"], (MAX_RESULTS + 5) as u64);
        assert_eq!(r["summary"]["pass"], 1);
        let first = &r["results"][0];
        assert_eq!(first["rule"], "requests");
        assert_eq!(first["result"], "fail");
        assert_eq!(first["resources"][0]["uid"], "u-0");
        assert_eq!(
            first["properties"]["missing"],
            "container jupyter: cpu,memory"
        );
        assert!(r.to_string().len() < 1024 * 1024, "{}", r.to_string().len());
    }

    #[test]
    fn unchanged_findings_keep_their_time_and_are_the_same_report() {
        let policy = Policy::builtin();
        let a = audit_object(&policy, &Objects::complete(), notebook(1));
        let mut first = ReportBuilder::new("ml", 100);
        first.add(&a);
        let mut second = ReportBuilder::new("ml", 200);
        second.add(&a);
        let old = first.build();
        let mut new = second.build();
        assert!(!same(&new, &old));
        carry_timestamps(&mut new, &old);
        assert!(same(&new, &old));
        assert_eq!(new["results"][0]["timestamp"]["seconds"], 100);
    }
}

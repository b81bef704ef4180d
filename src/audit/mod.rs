//! The audit of a live cluster: `tollgate audit` and the server's background audit.
//!
//! Each object is judged by the engine ([`tollgate_core::audit_object`]) as a CREATE of it
//! would be; this module only reads the cluster and hands the findings on:
//!
//! - [`list`]: the namespaces in scope, and per namespace the objects to judge and the
//!   cluster context they are judged in, each listed in pages (`limit` + `continue`) and
//!   each page dropped once judged, so that memory does not grow with the cluster;
//! - [`output`]: the command's writers (table, JSON lines, PolicyReport YAML);
//! - [`report`]: PolicyReports, one per namespace, built from the findings and written to
//!   the cluster (create, replace with resourceVersion, delete);
//! - [`crate::lease`]: the `coordination.k8s.io` Lease that lets one replica audit at a time;
//! - [`background`]: the server's timer, pacing and metrics.
//!
//! Namespace by namespace: the apiserver answers a list of one namespace in name order,
//! so findings come grouped without being held, a namespace's report can be written as
//! soon as it is done, and the per-namespace context (claim templates, standalone claims)
//! is all that is held besides one page.

pub mod background;
pub mod list;
pub mod output;
pub mod report;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Client;

use crate::cluster::ClusterContext;
use tollgate_core::{
    audit_object, controlled, start_findings, waits_on_its_node, Audited, Objects, OptOutState,
    PodEvent, Policy,
};

pub use list::NamespaceInfo;

/// Which namespaces an audit reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespaces {
    /// `-A`: every namespace (listed).
    All,
    /// `-n NS`, or the kubeconfig context's namespace.
    One(String),
}

/// Why an audit could not run, or stopped: one line each, for a person.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("cannot reach the API server at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("unauthorized: the API server at {url} did not accept the credentials ({detail})")]
    Unauthorized { url: String, detail: String },
    #[error("forbidden: tollgate audit needs {needs} ({detail})")]
    Forbidden { needs: String, detail: String },
    /// `status`: the HTTP status the API server answered with, where it answered; what
    /// callers decide on (a 404 on a list: the kind is not served), never the text.
    #[error("{what}: {detail}")]
    Api {
        what: String,
        status: Option<u16>,
        detail: String,
    },
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
    /// The audit was asked to stop (the server is shutting down, or lost the lease).
    #[error("stopped")]
    Stopped,
}

/// What one request needed, for the message of its failure: `list` on `pods` in `ml`.
#[derive(Debug, Clone, Copy)]
pub struct Needs<'a> {
    pub verb: &'a str,
    pub resource: &'a str,
    /// None: at the cluster scope.
    pub namespace: Option<&'a str>,
}

impl Needs<'_> {
    fn describe(&self) -> String {
        match self.namespace {
            Some(ns) => format!("{} on {} in namespace {ns:?}", self.verb, self.resource),
            None => format!("{} on {} at the cluster scope", self.verb, self.resource),
        }
    }
}

/// Turns a client error into the one line a person reads.
pub fn classify(url: &str, needs: Needs<'_>, e: kube::Error) -> AuditError {
    match e {
        kube::Error::Api(s) if s.code == 401 => AuditError::Unauthorized {
            url: url.to_owned(),
            detail: s.message,
        },
        kube::Error::Api(s) if s.code == 403 => AuditError::Forbidden {
            needs: needs.describe(),
            detail: s.message,
        },
        kube::Error::Api(s) => AuditError::Api {
            what: format!("{} {}", needs.verb, needs.resource),
            status: Some(s.code),
            detail: format!("{} {}: {}", s.code, s.reason, s.message),
        },
        other @ (kube::Error::HyperError(_) | kube::Error::Service(_)) => AuditError::Unreachable {
            url: url.to_owned(),
            detail: crate::kubeconfig::innermost(&other),
        },
        other => AuditError::Api {
            what: format!("{} {}", needs.verb, needs.resource),
            status: None,
            detail: crate::kubeconfig::innermost(&other),
        },
    }
}

/// Where the objects' cluster context (DRA claims and templates, namespace labels, Trainer
/// runtimes, nodes, quotas, DeviceClasses, Kueue's queues) comes from.
#[derive(Clone)]
pub enum Context {
    /// Listed per namespace, kept while the namespace is audited: what the command does.
    PerNamespace,
    /// The server's caches, already in memory.
    Shared(Arc<dyn ClusterContext>),
}

/// Counts of one namespace's (or a whole audit's) objects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    pub namespaces: u64,
    /// Objects judged, by kind as a person reads it (`pod`, `job.batch.volcano.sh`).
    pub objects: BTreeMap<String, u64>,
    pub refused: u64,
    pub mutated: u64,
    pub opted_out: u64,
    pub unverified: u64,
    pub opt_out_refused: u64,
    /// Findings by rule.
    pub findings: BTreeMap<&'static str, u64>,
}

impl Totals {
    pub fn add(&mut self, a: &Audited) {
        // By the kind's name with its group where two share a name: a Volcano Job is not
        // counted with batch's Jobs.
        *self.objects.entry(a.object.noun()).or_default() += 1;
        self.refused += u64::from(a.refused());
        self.mutated += u64::from(a.mutated());
        match a.opt_out {
            OptOutState::Honoured => self.opted_out += 1,
            OptOutState::Unverified(_) => self.unverified += 1,
            OptOutState::Refused(_) => self.opt_out_refused += 1,
            OptOutState::None => {}
        }
        for f in &a.findings {
            *self.findings.entry(f.rule.as_str()).or_default() += 1;
        }
    }

    pub fn merge(&mut self, other: &Totals) {
        self.namespaces += other.namespaces;
        for (k, n) in &other.objects {
            *self.objects.entry(k.clone()).or_default() += n;
        }
        self.refused += other.refused;
        self.mutated += other.mutated;
        self.opted_out += other.opted_out;
        self.unverified += other.unverified;
        self.opt_out_refused += other.opt_out_refused;
        for (k, n) in &other.findings {
            *self.findings.entry(k).or_default() += n;
        }
    }

    pub fn seen(&self) -> u64 {
        self.objects.values().sum()
    }

    /// `50000 pods in 40 namespaces: 1200 would be refused, ...`: the summary a person
    /// reads.
    pub fn summary(&self) -> String {
        let objects = if self.objects.is_empty() {
            "0 pods".to_owned()
        } else {
            self.objects
                .iter()
                .map(|(noun, n)| plural(*n, noun))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "audited {objects} in {}: {} would be refused, {} would be mutated, {} opted out ({} more unverified, {} refused)",
            plural(self.namespaces, "namespace"),
            self.refused,
            self.mutated,
            self.opted_out,
            self.unverified,
            self.opt_out_refused,
        )
    }
}

fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Between objects: how the background audit keeps to its share of the CPU. The command
/// runs unpaced.
pub trait Pace {
    /// Called after each object judged, with the time judging it took.
    fn after_object(&mut self, busy: Duration) -> impl std::future::Future<Output = ()> + Send;
}

/// No pacing: the command, which has the machine to itself.
pub struct Unpaced;

impl Pace for Unpaced {
    async fn after_object(&mut self, _: Duration) {}
}

/// Reads the cluster and judges what it lists.
pub struct Auditor {
    pub client: Client,
    /// The API server, for messages.
    pub url: String,
    pub context: Context,
    /// `-l`: a label selector for the objects listed.
    pub selector: Option<String>,
    /// Objects per list request.
    pub page_size: u32,
    /// Namespaces (names or globs) left out of an audit of all namespaces: those the
    /// webhooks never act in.
    pub exclude: Vec<tollgate_core::Glob>,
    /// The workload kinds not listed, and why: the cluster answered 404 (their CRD is not
    /// installed, `None`) or 403 (the identity may not list them). Not asked for again in
    /// the namespaces after, until [`Auditor::start_run`].
    absent: std::sync::Mutex<BTreeMap<String, Option<String>>>,
    /// What is read once per run (with [`Context::PerNamespace`]), once read.
    wide: std::sync::Mutex<Option<Arc<list::ClusterWide>>>,
    /// What feasibility would read and the identity may not: the request, and the
    /// apiserver's message.
    unread: std::sync::Mutex<BTreeMap<String, String>>,
    /// Why the pods' events could not be listed, where they could not: whether pods start
    /// on their nodes was then judged from their statuses alone.
    events_unread: std::sync::Mutex<Option<String>>,
}

impl Auditor {
    pub fn new(client: Client, url: String) -> Auditor {
        Auditor {
            client,
            url,
            context: Context::PerNamespace,
            selector: None,
            page_size: list::PAGE_SIZE,
            exclude: vec![],
            absent: Default::default(),
            wide: Default::default(),
            unread: Default::default(),
            events_unread: Default::default(),
        }
    }

    /// Forgets what the last run learnt: the kinds found absent, the nodes and
    /// DeviceClasses listed, what could not be read. At the start of each background run,
    /// since a CRD may have been installed, and nodes changed, since.
    pub fn start_run(&self) {
        self.absent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        *self.wide.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.unread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        *self.events_unread.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Why the pods' events could not be listed (in some namespace of the run), if so.
    pub fn events_unread(&self) -> Option<String> {
        self.events_unread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The Warning events about the pods of `namespace`, by the pod's uid, oldest first:
    /// what the `start` rule reads of a pod bound and not started (a volume the kubelet
    /// cannot mount is said only there). Listed once per namespace, at its first such pod;
    /// a list that fails leaves the statuses alone to judge by, and says so.
    async fn pod_events(&self, namespace: &str) -> PodEvents {
        let api = kube::Api::<k8s_openapi::api::core::v1::Event>::namespaced(
            self.client.clone(),
            namespace,
        );
        let mut params = kube::api::ListParams::default()
            .fields("type=Warning,involvedObject.kind=Pod")
            .limit(self.page_size);
        let mut by_uid: BTreeMap<String, Vec<OwnedEvent>> = BTreeMap::new();
        loop {
            let list = match api.list(&params).await {
                Ok(l) => l,
                Err(e) => {
                    let needs = Needs {
                        verb: "list",
                        resource: "events",
                        namespace: Some(namespace),
                    };
                    let why = classify(&self.url, needs, e).to_string();
                    *self.events_unread.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                    break;
                }
            };
            for e in list.items {
                let Some(uid) = e.involved_object.uid.clone() else {
                    continue;
                };
                let seen = e
                    .series
                    .as_ref()
                    .and_then(|s| s.last_observed_time.as_ref())
                    .map(|t| t.0.to_string())
                    .or_else(|| e.last_timestamp.as_ref().map(|t| t.0.to_string()))
                    .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
                    .unwrap_or_default();
                by_uid.entry(uid).or_default().push(OwnedEvent {
                    seen,
                    reason: e.reason.unwrap_or_default(),
                    message: e.message.unwrap_or_default(),
                });
            }
            match list.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => params = params.continue_token(&c),
                None => break,
            }
        }
        for events in by_uid.values_mut() {
            events.sort_by(|a, b| a.seen.cmp(&b.seen));
        }
        PodEvents(by_uid)
    }

    /// What the audit reads once per run, read at the first namespace.
    async fn cluster_wide(&self, policy: &Policy) -> Result<Arc<list::ClusterWide>, AuditError> {
        if let Some(w) = self.wide.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(w);
        }
        let w = Arc::new(list::cluster_wide(self, policy).await?);
        *self.wide.lock().unwrap_or_else(|e| e.into_inner()) = Some(w.clone());
        Ok(w)
    }

    fn note_unread(&self, what: String, why: String) {
        self.unread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(what, why);
    }

    /// What feasibility would have read and the identity may not (`list on nodes at the
    /// cluster scope`), with the apiserver's message: the pods were judged without it.
    pub fn unread(&self) -> Vec<(String, String)> {
        let unread = self.unread.lock().unwrap_or_else(|e| e.into_inner());
        unread.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    fn is_absent(&self, kind: &kube::api::ApiResource) -> bool {
        let absent = self.absent.lock().unwrap_or_else(|e| e.into_inner());
        absent.contains_key(&absent_key(kind))
    }

    fn skip(&self, kind: &kube::api::ApiResource, why: Option<String>) {
        let mut absent = self.absent.lock().unwrap_or_else(|e| e.into_inner());
        absent.insert(absent_key(kind), why);
    }

    /// The workload kinds the cluster served but the identity could not list, with the
    /// error: their workloads were not judged (their pods were).
    pub fn forbidden_kinds(&self) -> Vec<(String, String)> {
        let absent = self.absent.lock().unwrap_or_else(|e| e.into_inner());
        absent
            .iter()
            .filter_map(|(k, why)| Some((k.clone(), why.clone()?)))
            .collect()
    }

    /// The namespaces in scope, with their labels (policy profiles match on them).
    pub async fn namespaces(
        &self,
        scope: &Namespaces,
        policy: &Policy,
    ) -> Result<Vec<NamespaceInfo>, AuditError> {
        list::namespaces(self, scope, policy).await
    }

    /// Judges one object of `namespace` (`tollgate why`) as [`Auditor::audit_namespace`]
    /// judges each: with the namespace's labels where they may be read, and the cluster
    /// context the audit lists for it.
    pub async fn judge_one(
        &self,
        policy: &Policy,
        namespace: &str,
        object: serde_json::Value,
    ) -> Result<Audited, AuditError> {
        let scope = Namespaces::One(namespace.to_owned());
        let ns = self
            .namespaces(&scope, policy)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| AuditError::Api {
                what: format!("namespace {namespace}"),
                status: None,
                detail: "left out of the audit".into(),
            })?;
        let wide = self.cluster_wide(policy).await?;
        let local = list::context(self, &ns, policy, &wide).await?;
        Ok(audit_object(policy, &local, object))
    }

    /// Judges every object of `namespace` the policy reviews (pods, then the workloads of
    /// the policy's kinds that no controller made: [`list::kinds`]), calling `found` with
    /// each in list order; returns the namespace's totals.
    pub async fn audit_namespace(
        &self,
        policy: &Policy,
        namespace: &NamespaceInfo,
        pace: &mut impl Pace,
        mut found: impl FnMut(&Audited) -> Result<(), AuditError>,
    ) -> Result<Totals, AuditError> {
        let mut totals = Totals {
            namespaces: 1,
            ..Totals::default()
        };
        let local: Objects;
        // Either is a whole context (the server's caches, or what was listed for this
        // namespace), seen by the engine as its `Cluster` through trait upcasting.
        let cluster: &dyn ClusterContext = match &self.context {
            Context::Shared(c) => c.as_ref(),
            Context::PerNamespace => {
                let wide = self.cluster_wide(policy).await?;
                local = list::context(self, namespace, policy, &wide).await?;
                &local
            }
        };
        let mut events: Option<PodEvents> = None;
        for kind in list::kinds(policy, &namespace.name) {
            let is_pod = kind.kind == "Pod" && kind.group.is_empty();
            if !is_pod && self.is_absent(&kind) {
                continue;
            }
            let mut pager = list::Pager::new(self, &kind, &namespace.name);
            loop {
                let page = match pager.next().await {
                    Ok(Some(page)) => page,
                    Ok(None) => break,
                    // A workload kind the cluster does not serve (no Ray, no Volcano
                    // installed): nothing of it to judge.
                    Err(AuditError::Api {
                        status: Some(404), ..
                    }) if !is_pod => {
                        self.skip(&kind, None);
                        break;
                    }
                    // A workload kind the identity may not list: its pods are still judged,
                    // and the command and the server's log say what was left out.
                    Err(e @ AuditError::Forbidden { .. }) if !is_pod => {
                        self.skip(&kind, Some(e.to_string()));
                        break;
                    }
                    Err(e) => return Err(e),
                };
                for object in page.objects() {
                    let object = object?;
                    // A workload a controller made (a Deployment's ReplicaSet, a CronJob's
                    // Job) is its parent's template again: judged at the parent, and
                    // its pods are judged as pods.
                    if !is_pod && controlled(&object) {
                        continue;
                    }
                    let started = Instant::now();
                    // A pod bound and not started: why not, in the kubelet's words (its
                    // statuses, and the namespace's events, listed at the first such pod).
                    let mut start = vec![];
                    if is_pod {
                        let mut theirs = vec![];
                        if waits_on_its_node(&object) {
                            if events.is_none() {
                                events = Some(self.pod_events(&namespace.name).await);
                            }
                            let uid = object
                                .pointer("/metadata/uid")
                                .and_then(serde_json::Value::as_str)
                                .unwrap_or_default();
                            theirs = events.as_ref().map(|e| e.of(uid)).unwrap_or_default();
                        }
                        start = start_findings(policy, &object, &theirs);
                    }
                    let mut audited = audit_object(policy, cluster, object);
                    audited.findings.extend(start);
                    let busy = started.elapsed();
                    totals.add(&audited);
                    found(&audited)?;
                    pace.after_object(busy).await;
                }
            }
        }
        Ok(totals)
    }
}

/// A Warning event about a pod, as listed.
struct OwnedEvent {
    /// When last seen, RFC 3339 (orders as the times do).
    seen: String,
    reason: String,
    message: String,
}

/// A namespace's pods' Warning events, by the pod's uid.
struct PodEvents(BTreeMap<String, Vec<OwnedEvent>>);

impl PodEvents {
    fn of(&self, uid: &str) -> Vec<PodEvent<'_>> {
        self.0
            .get(uid)
            .into_iter()
            .flatten()
            .map(|e| PodEvent {
                reason: &e.reason,
                message: &e.message,
            })
            .collect()
    }
}

fn absent_key(kind: &kube::api::ApiResource) -> String {
    format!("{}/{}", kind.api_version, kind.plural)
}

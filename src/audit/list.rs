//! What an audit reads: the namespaces in scope, the objects of each (in pages), and the
//! cluster context they are judged in.
//!
//! Lists are raw JSON pages (`limit` + `continue`) rather than typed objects: the engine
//! reads JSON, and each page is judged and dropped before the next is asked for.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota};
use kube::api::{ApiResource, ListParams};
use kube::core::ListMeta;
use kube::Api;
use serde::Deserialize;
use serde_json::Value;

use super::{classify, AuditError, Auditor, Namespaces, Needs};
use crate::cluster::nodes::{NodeView, ShapeIndex};
use crate::cluster::pages;
use crate::cluster::{dra, kueue};
use tollgate_core::{
    claim_from, claim_template_from, namespace_and_name, Autoscaling, FeasibilityMode, Nodes,
    Objects, Policy, CLUSTER_AUTOSCALER_STATUS, KARPENTER_NODEPOOL_API_VERSION, KUEUE_API_VERSIONS,
};

/// Objects per list request: the page size kube's reflectors and kubectl use.
pub const PAGE_SIZE: u32 = 500;

/// Set by the apiserver on every namespace: selectors may rely on it.
const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A namespace in scope: its name and labels, all an audit keeps of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

impl NamespaceInfo {
    fn of(ns: Namespace) -> NamespaceInfo {
        let name = ns.metadata.name.unwrap_or_default();
        let mut labels = ns.metadata.labels.unwrap_or_default();
        labels
            .entry(NAME_LABEL.into())
            .or_insert_with(|| name.clone());
        NamespaceInfo { name, labels }
    }

    /// A namespace known only by name: the one label every namespace has.
    fn named(name: &str) -> NamespaceInfo {
        NamespaceInfo {
            name: name.to_owned(),
            labels: BTreeMap::from([(NAME_LABEL.to_owned(), name.to_owned())]),
        }
    }

    fn object(&self) -> Namespace {
        let mut ns = Namespace::default();
        ns.metadata.name = Some(self.name.clone());
        ns.metadata.labels = Some(self.labels.clone());
        ns
    }
}

/// The namespaces of `scope`, in name order, less the auditor's exclusions. Listing all of
/// them needs `list` on namespaces; one named namespace is read with `get`, and if that is forbidden it is
/// audited knowing only its name, unless a policy profile matches on namespace labels.
pub async fn namespaces(
    a: &Auditor,
    scope: &Namespaces,
    policy: &Policy,
) -> Result<Vec<NamespaceInfo>, AuditError> {
    let api: Api<Namespace> = Api::all(a.client.clone());
    match scope {
        Namespaces::One(name) => match api.get_opt(name).await {
            Ok(Some(ns)) => Ok(vec![NamespaceInfo::of(ns)]),
            // Not there: nothing in it to judge, and nothing to say about it.
            Ok(None) => Ok(vec![NamespaceInfo::named(name)]),
            Err(kube::Error::Api(s))
                if s.code == 403 && policy.needs_namespace_labels().is_none() =>
            {
                Ok(vec![NamespaceInfo::named(name)])
            }
            Err(e) => Err(classify(
                &a.url,
                Needs {
                    verb: "get",
                    resource: "namespaces",
                    namespace: None,
                },
                e,
            )),
        },
        Namespaces::All => {
            let mut out = vec![];
            let mut lp = ListParams::default().limit(a.page_size);
            loop {
                let page = api.list(&lp).await.map_err(|e| {
                    classify(
                        &a.url,
                        Needs {
                            verb: "list",
                            resource: "namespaces",
                            namespace: None,
                        },
                        e,
                    )
                })?;
                out.extend(page.items.into_iter().map(NamespaceInfo::of));
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(c) => lp = lp.continue_token(&c),
                    None => break,
                }
            }
            out.retain(|n| !tollgate_core::matches_any(&a.exclude, &n.name));
            out.sort_by(|x, y| x.name.cmp(&y.name));
            Ok(out)
        }
    }
}

/// What an audit reads once per run for every namespace: the DRA version the cluster
/// serves, and what feasibility compares pods with cluster-wide (its nodes by shape, its
/// DeviceClasses, Kueue's ClusterQueues and the version it serves them in; None: not read,
/// for the reason in [`Auditor::unread`], or not served).
#[derive(Debug, Default)]
pub struct ClusterWide {
    pub dra: Option<&'static str>,
    pub nodes: Option<Arc<Nodes>>,
    pub device_classes: Option<Arc<BTreeSet<String>>>,
    pub kueue: Option<&'static str>,
    pub cluster_queues: Option<Arc<BTreeMap<String, Arc<Value>>>>,
    /// What may add nodes: the Cluster Autoscaler's status ConfigMap, Karpenter's
    /// NodePools (None: not read, for the reason in [`Auditor::unread`]).
    pub autoscaling: Option<Arc<Autoscaling>>,
}

/// Whether the policy, one of its profiles, or a namespace's TollgateProfile over either,
/// judges feasibility.
pub fn judges_feasibility(policy: &Policy) -> bool {
    every_policy(policy).any(|p| p.feasibility.mode != FeasibilityMode::Off)
}

/// The base policy, its profiles' and the namespaces' TollgateProfiles', resolved.
fn every_policy(policy: &Policy) -> impl Iterator<Item = &Policy> {
    let profiles = policy.profiles.iter().filter_map(|p| p.policy());
    let namespaces = policy.layers.namespaces.values().flat_map(|n| n.policies());
    std::iter::once(policy).chain(profiles).chain(namespaces)
}

/// The policies the pods and workloads of `namespace` may get: the base, and its
/// TollgateProfile's over it, where it has one.
fn in_namespace<'p>(policy: &'p Policy, namespace: &str) -> Vec<&'p Policy> {
    let mut out = vec![policy];
    if let Some(n) = policy.layers.namespaces.get(namespace) {
        out.extend(n.policies());
    }
    out
}

/// The audit could not read the API discovery (what the cluster serves).
fn discovery_failed(a: &Auditor, e: kube::Error) -> AuditError {
    classify(
        &a.url,
        Needs {
            verb: "get",
            resource: "the API discovery (/apis)",
            namespace: None,
        },
        e,
    )
}

/// Reads what [`ClusterWide`] holds: discovery, then (when the policy judges feasibility)
/// the nodes, in pages, kept by shape, the DeviceClasses' names, and Kueue's ClusterQueues
/// in the newest version the cluster serves (found by discovery, as the server's cluster
/// context finds them). Nodes, classes or queues the identity may not list (403), or a
/// cluster without them (404, or Kueue not served), leave them out: the audit says so of
/// a 403 and feasibility says nothing of them.
pub async fn cluster_wide(a: &Auditor, policy: &Policy) -> Result<ClusterWide, AuditError> {
    let dra = dra::discover(&a.client)
        .await
        .map_err(|e| discovery_failed(a, e))?;
    let mut wide = ClusterWide {
        dra,
        ..ClusterWide::default()
    };
    if !judges_feasibility(policy) {
        return Ok(wide);
    }
    // Node by node as each page arrives (`pages`): a node is 25 KB of JSON, its summary a
    // few hundred bytes.
    let url = Api::<NodeView>::all(a.client.clone())
        .resource_url()
        .to_owned();
    let mut index = ShapeIndex::default();
    let listed = match pages::list_all(&a.client, &url, a.page_size, |n: NodeView| {
        index.apply(&n.0);
    })
    .await
    {
        Ok(_) => true,
        Err(e) => unreadable(a, "nodes", None, e)?,
    };
    if listed {
        wide.nodes = Some(Arc::new(index.snapshot()));
    }
    if let Some(version) = dra {
        let classes = dra::resource(version, "DeviceClass", "deviceclasses");
        let mut names = BTreeSet::new();
        let listed = match raw_pages(a, &classes, None, |c| {
            names.extend(dra::class_name(&c).ok());
        })
        .await
        {
            Ok(()) => true,
            Err(e) => unreadable(a, "deviceclasses.resource.k8s.io", None, e)?,
        };
        if listed {
            wide.device_classes = Some(Arc::new(names));
        }
    }
    wide.kueue = dra::newest_served(&a.client, &KUEUE_API_VERSIONS)
        .await
        .map_err(|e| discovery_failed(a, e))?;
    if let Some(version) = wide.kueue {
        let resource = dra::resource(version, "ClusterQueue", "clusterqueues");
        let mut queues = BTreeMap::new();
        let listed = match raw_pages(a, &resource, None, |q| {
            if let Ok(q) = kueue::queue(&q) {
                queues.insert(namespace_and_name(&q).1, q);
            }
        })
        .await
        {
            Ok(()) => true,
            Err(e) => unreadable(a, "clusterqueues.kueue.x-k8s.io", None, e)?,
        };
        if listed {
            wide.cluster_queues = Some(Arc::new(queues));
        }
    }
    wide.autoscaling = autoscaling(a).await?;
    Ok(wide)
}

/// A list of what feasibility reads that failed: 403 and 404 leave it out (noted in
/// [`Auditor::unread`] for a 403: Ok(false)); anything else ends the audit.
fn unreadable(
    a: &Auditor,
    resource: &str,
    namespace: Option<&str>,
    e: kube::Error,
) -> Result<bool, AuditError> {
    match e {
        kube::Error::Api(s) if s.code == 404 => Ok(false),
        kube::Error::Api(s) if s.code == 403 => {
            let needs = Needs {
                verb: "list",
                resource,
                namespace,
            };
            a.note_unread(needs.describe(), s.message);
            Ok(false)
        }
        e => Err(classify(
            &a.url,
            Needs {
                verb: "list",
                resource,
                namespace,
            },
            e,
        )),
    }
}

/// A namespace's cluster context: the namespace, its ResourceClaimTemplates and
/// standalone ResourceClaims (of the DRA version the cluster serves, read as v1), its
/// ResourceQuotas and Kueue LocalQueues and what `wide` holds (when the policy judges
/// feasibility), and the
/// Kubeflow Trainer runtimes its TrainJobs may name (its TrainingRuntimes and the
/// ClusterTrainingRuntimes), when the policy judges TrainJobs. Claims generated from a
/// template for one pod are left out: a pod names its template, which is what the engine
/// reads, and those claims are one per pod, so keeping them would grow with the namespace.
/// A cluster that serves no DRA version has no claims at all.
pub async fn context(
    a: &Auditor,
    ns: &NamespaceInfo,
    policy: &Policy,
    wide: &ClusterWide,
) -> Result<Objects, AuditError> {
    let mut objects = Objects::complete();
    objects.add_namespace(ns.object());
    if let Some(version) = wide.dra {
        let templates = dra::resource(version, "ResourceClaimTemplate", "resourceclaimtemplates");
        let mut unreadable = None;
        raw_pages(
            a,
            &templates,
            Some(&ns.name),
            |t| match claim_template_from(&t) {
                Ok(t) => objects.add_template(t),
                Err(e) => unreadable = Some(e),
            },
        )
        .await
        .or_else(|e| dra_list_failed(a, "resourceclaimtemplates.resource.k8s.io", &ns.name, e))?;
        let claims = dra::resource(version, "ResourceClaim", "resourceclaims");
        raw_pages(a, &claims, Some(&ns.name), |c| {
            let generated = c
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|o| o["kind"] == "Pod" && o["apiVersion"] == "v1");
            if generated {
                return;
            }
            match claim_from(&c) {
                Ok(mut c) => {
                    c.status = None;
                    objects.add_claim(c);
                }
                Err(e) => unreadable = Some(e),
            }
        })
        .await
        .or_else(|e| dra_list_failed(a, "resourceclaims.resource.k8s.io", &ns.name, e))?;
        if let Some(e) = unreadable {
            return Err(AuditError::Api {
                what: format!("reading the DRA objects of namespace {:?}", ns.name),
                status: None,
                detail: e,
            });
        }
    }
    if judges_feasibility(policy) {
        objects.nodes = wide.nodes.clone();
        objects.device_classes = wide.device_classes.clone();
        let quotas: Api<ResourceQuota> = Api::namespaced(a.client.clone(), &ns.name);
        let mut listed = vec![];
        let mut lp = ListParams::default().limit(a.page_size);
        let read = loop {
            match quotas.list(&lp).await {
                Ok(page) => {
                    listed.extend(page.items);
                    match page.metadata.continue_.filter(|c| !c.is_empty()) {
                        Some(c) => lp = lp.continue_token(&c),
                        None => break true,
                    }
                }
                Err(e) => break unreadable(a, "resourcequotas", Some(&ns.name), e)?,
            }
        };
        if read {
            objects.know_quotas();
            for mut q in listed {
                crate::cluster::trim_quota(&mut q);
                objects.add_quota(q);
            }
        }
        if let Some(version) = wide.kueue {
            let resource = dra::resource(version, "LocalQueue", "localqueues");
            let mut queues = BTreeMap::new();
            let listed = match raw_pages(a, &resource, Some(&ns.name), |q| {
                if let Ok(q) = kueue::queue(&q) {
                    queues.insert(namespace_and_name(&q), q);
                }
            })
            .await
            {
                Ok(()) => true,
                Err(e) => unreadable(a, "localqueues.kueue.x-k8s.io", Some(&ns.name), e)?,
            };
            if listed {
                objects.local_queues = Some(queues);
            }
            objects.cluster_queues = wide.cluster_queues.clone();
        }
        objects.autoscaling = wide.autoscaling.clone();
    }
    let trainjobs = in_namespace(policy, &ns.name)
        .iter()
        .any(|p| p.workloads.enabled && p.workloads.kinds.iter().any(|k| k.from.is_some()));
    if trainjobs {
        for (resource, namespace) in [
            (TRAINING_RUNTIMES, Some(ns.name.as_str())),
            (CLUSTER_TRAINING_RUNTIMES, None),
        ] {
            runtimes(a, resource, namespace, &mut objects).await?;
        }
    }
    Ok(objects)
}

/// What may add nodes, as the server's cluster context watches it: the Cluster
/// Autoscaler's status ConfigMap (absent: no Cluster Autoscaler) and Karpenter's NodePools
/// (not served: no Karpenter). None where the identity may not read one of them (the audit
/// says so): feasibility then takes the nodes there are as all there will be.
async fn autoscaling(a: &Auditor) -> Result<Option<Arc<Autoscaling>>, AuditError> {
    let mut out = Autoscaling::default();
    let (namespace, name) = CLUSTER_AUTOSCALER_STATUS;
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(a.client.clone(), namespace);
    match maps.get_metadata_opt(name).await {
        Ok(found) => out.cluster_autoscaler = found.is_some(),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            let needs = Needs {
                verb: "get",
                resource: "configmaps (cluster-autoscaler-status)",
                namespace: Some(namespace),
            };
            a.note_unread(needs.describe(), s.message);
            return Ok(None);
        }
        Err(e) => {
            return Err(classify(
                &a.url,
                Needs {
                    verb: "get",
                    resource: "configmaps (cluster-autoscaler-status)",
                    namespace: Some(namespace),
                },
                e,
            ))
        }
    }
    let served = dra::newest_served(&a.client, &[KARPENTER_NODEPOOL_API_VERSION])
        .await
        .map_err(|e| discovery_failed(a, e))?;
    if let Some(version) = served {
        let resource = dra::resource(version, "NodePool", "nodepools");
        let mut pools = vec![];
        let listed = match raw_pages(a, &resource, None, |p| {
            if let Ok(p) = kueue::queue(&p) {
                pools.push(p);
            }
        })
        .await
        {
            Ok(()) => true,
            Err(e) => unreadable(a, "nodepools.karpenter.sh", None, e)?,
        };
        if !listed {
            return Ok(None);
        }
        out.node_pools = pools;
    }
    Ok(Some(Arc::new(out)))
}

/// A list of claims or templates that failed: none on 404 (the version went away since
/// discovery), else the audit ends with the reason.
fn dra_list_failed(
    a: &Auditor,
    resource: &str,
    namespace: &str,
    e: kube::Error,
) -> Result<(), AuditError> {
    match e {
        kube::Error::Api(s) if s.code == 404 => Ok(()),
        e => Err(classify(
            &a.url,
            Needs {
                verb: "list",
                resource,
                namespace: Some(namespace),
            },
            e,
        )),
    }
}

const TRAINING_RUNTIMES: (&str, &str) = ("TrainingRuntime", "trainingruntimes");
const CLUSTER_TRAINING_RUNTIMES: (&str, &str) =
    ("ClusterTrainingRuntime", "clustertrainingruntimes");

/// The runtimes of one resource, in pages, as JSON; none where Trainer is not installed
/// (404) or the identity may not list them (403: a TrainJob on them is then allowed with
/// the warning that its runtime was not found).
async fn runtimes(
    a: &Auditor,
    (kind, plural): (&str, &str),
    namespace: Option<&str>,
    objects: &mut Objects,
) -> Result<(), AuditError> {
    let gvk = kube::api::GroupVersionKind::gvk("trainer.kubeflow.org", "v1alpha1", kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    match raw_pages(a, &resource, namespace, |item| {
        objects.add_training_runtime(item);
    })
    .await
    {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => Ok(()),
        Err(e) => Err(classify(
            &a.url,
            Needs {
                verb: "list",
                resource: plural,
                namespace,
            },
            e,
        )),
    }
}

/// The cluster's TollgatePolicy and the TollgateProfiles of `scope` (its namespace, or
/// all), as JSON, composed with the file into the policy the namespaces are audited with;
/// and, for each kind the identity may not list, why (the command says so: without the
/// TollgatePolicy it refuses to judge, `cli::objects::unreadable_policy`).
/// None where the cluster does not serve them (their CRDs not installed): asked of
/// discovery first, since the apiserver answers a list of a resource it does not serve
/// with 403, not 404, to an identity no rule lets list it.
pub async fn policy_objects(
    a: &Auditor,
    scope: &Namespaces,
) -> Result<(Vec<Value>, Vec<Unread>), AuditError> {
    use tollgate_core::{
        POLICY_GROUP, POLICY_KIND, POLICY_PLURAL, POLICY_VERSION, PROFILE_KIND, PROFILE_PLURAL,
    };
    // GROUP/VERSION, as discovery names it (a &'static str).
    const SERVED: &str = "tollgate.dev/v1alpha1";
    debug_assert_eq!(SERVED, format!("{POLICY_GROUP}/{POLICY_VERSION}"));
    let served = dra::newest_served(&a.client, &[SERVED])
        .await
        .map_err(|e| discovery_failed(a, e))?;
    if served.is_none() {
        return Ok((vec![], vec![]));
    }
    let namespace = match scope {
        Namespaces::All => None,
        Namespaces::One(ns) => Some(ns.as_str()),
    };
    let mut out = vec![];
    let mut unread = vec![];
    for (kind, plural, namespace) in [
        (POLICY_KIND, POLICY_PLURAL, None),
        (PROFILE_KIND, PROFILE_PLURAL, namespace),
    ] {
        let gvk = kube::api::GroupVersionKind::gvk(POLICY_GROUP, POLICY_VERSION, kind);
        let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
        let needs = Needs {
            verb: "list",
            resource: plural,
            namespace,
        };
        match raw_pages(a, &resource, namespace, |item| out.push(item)).await {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(kube::Error::Api(s)) if s.code == 403 => {
                unread.push(Unread {
                    kind,
                    why: format!("{} ({})", needs.describe(), s.message),
                });
            }
            Err(e) => return Err(classify(&a.url, needs, e)),
        }
    }
    Ok((out, unread))
}

/// A kind of the policy objects the identity may not list (403), and the request with the
/// apiserver's words: what a command says instead of judging as if it were absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unread {
    /// `TollgatePolicy` or `TollgateProfile`.
    pub kind: &'static str,
    pub why: String,
}

/// Each object of `resource` (in `namespace`, or all), a page at a time, as JSON with the
/// `apiVersion` and `kind` list items lack and without managedFields.
async fn raw_pages(
    a: &Auditor,
    resource: &ApiResource,
    namespace: Option<&str>,
    mut f: impl FnMut(Value),
) -> Result<(), kube::Error> {
    let path = <kube::api::DynamicObject as kube::Resource>::url_path(resource, namespace);
    let mut lp = ListParams::default().limit(a.page_size);
    loop {
        let request = kube::core::Request::new(path.clone())
            .list(&lp)
            .map_err(kube::Error::BuildRequest)?;
        let page: RawList = a.client.request(request).await?;
        for mut item in page.items {
            if let Some(o) = item.as_object_mut() {
                o.insert("apiVersion".into(), resource.api_version.clone().into());
                o.insert("kind".into(), resource.kind.clone().into());
                if let Some(Value::Object(m)) = o.get_mut("metadata") {
                    m.remove("managedFields");
                }
            }
            f(item);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(()),
        }
    }
}

/// The kinds an audit judges in `namespace` under `policy`: pods, then the workload kinds
/// it lists (Jobs, Deployments, PyTorchJobs, ...; `workloads.kinds`, when
/// `workloads.enabled`), and those the namespace's TollgateProfile adds, each judged by
/// the pods its templates will make. Their plural is the lower-cased kind and `s`, as for
/// every kind the policy ships and the webhooks register (`tests/deploy.rs`).
pub fn kinds(policy: &Policy, namespace: &str) -> Vec<ApiResource> {
    let mut out = vec![ApiResource::erase::<Pod>(&())];
    for p in in_namespace(policy, namespace) {
        if !p.workloads.enabled {
            continue;
        }
        for k in &p.workloads.kinds {
            let gvk = kube::api::GroupVersionKind::gvk(&k.group, &k.version, &k.kind);
            let plural = format!("{}s", k.kind.to_ascii_lowercase());
            let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
            if !out.contains(&resource) {
                out.push(resource);
            }
        }
    }
    out
}

/// One page of a list, as the apiserver sends it.
#[derive(Deserialize)]
struct RawList {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<Value>,
}

/// The objects of one kind in one namespace, a page at a time.
pub struct Pager<'a> {
    auditor: &'a Auditor,
    kind: &'a ApiResource,
    namespace: &'a str,
    params: Option<ListParams>,
}

/// One page of objects as the apiserver sent them: each object's JSON text, read into a
/// value only when it is judged ([`Page::objects`]). A pod as JSON text is a few KB, as a
/// `serde_json::Value` several times that: a page of 500 held as values was most of what an
/// audit held.
pub struct Page<'a> {
    kind: &'a ApiResource,
    items: Vec<Box<[u8]>>,
}

impl<'a> Page<'a> {
    /// The page's objects, in order, each with the `apiVersion` and `kind` list items
    /// lack, and without managedFields.
    pub fn objects(self) -> impl Iterator<Item = Result<Value, AuditError>> + 'a {
        let kind = self.kind;
        self.items.into_iter().map(move |raw| {
            let mut item: Value = serde_json::from_slice(&raw).map_err(|e| AuditError::Api {
                what: format!("list {}", kind.plural),
                status: None,
                detail: e.to_string(),
            })?;
            if let Some(o) = item.as_object_mut() {
                o.entry("apiVersion")
                    .or_insert_with(|| kind.api_version.clone().into());
                o.entry("kind").or_insert_with(|| kind.kind.clone().into());
                if let Some(Value::Object(m)) = o.get_mut("metadata") {
                    m.remove("managedFields");
                }
            }
            Ok(item)
        })
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl<'a> Pager<'a> {
    pub fn new(auditor: &'a Auditor, kind: &'a ApiResource, namespace: &'a str) -> Self {
        let mut params = ListParams::default().limit(auditor.page_size);
        if let Some(s) = &auditor.selector {
            params = params.labels(s);
        }
        Pager {
            auditor,
            kind,
            namespace,
            params: Some(params),
        }
    }

    /// The next page's objects, or None after the last. The page is read item by item as
    /// it arrives (`cluster::pages`), each item kept as its text.
    ///
    /// A continue token can expire while a slow (paced) audit works through a namespace
    /// (etcd compacts every five minutes); the apiserver's 410 then carries a token for the
    /// rest of the list at a newer resourceVersion, which is taken: an audit reports the
    /// cluster as it is, and a page seen slightly later is no less true.
    pub async fn next(&mut self) -> Result<Option<Page<'a>>, AuditError> {
        let Some(mut lp) = self.params.take() else {
            return Ok(None);
        };
        let path =
            <kube::api::DynamicObject as kube::Resource>::url_path(self.kind, Some(self.namespace));
        let needs = Needs {
            verb: "list",
            resource: &self.kind.plural,
            namespace: Some(self.namespace),
        };
        let read = |e| classify(&self.auditor.url, needs, e);
        let mut page = loop {
            match pages::PageReader::open_with(&self.auditor.client, &path, &lp, |item| {
                Ok(Box::from(item))
            })
            .await
            {
                Ok(page) => break page,
                Err(kube::Error::Api(s))
                    if s.code == 410
                        && lp.continue_token.is_some()
                        && fresh_token(&s).is_some() =>
                {
                    let c = fresh_token(&s).unwrap_or_default().to_owned();
                    lp = lp.continue_token(&c);
                }
                Err(e) => return Err(read(e)),
            }
        };
        let mut items = vec![];
        while let Some(item) = page.next().await.map_err(read)? {
            items.push(item);
        }
        let meta = page.finish().map_err(read)?;
        if let Some(c) = meta.continue_.filter(|c| !c.is_empty()) {
            self.params = Some(lp.continue_token(&c));
        }
        Ok(Some(Page {
            kind: self.kind,
            items,
        }))
    }
}

/// The continue token a 410 for an expired one carries, for the rest of the list.
fn fresh_token(s: &kube::core::Status) -> Option<&str> {
    s.metadata
        .as_ref()
        .and_then(|m| m.continue_.as_deref())
        .filter(|c| !c.is_empty())
}

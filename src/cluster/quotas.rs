//! The ResourceQuotas of every namespace, kept by namespace: a review asks for its own
//! namespace's, and gets them without a look at any other namespace's.
//!
//! A quota's status is rewritten whenever a pod of its namespace comes or goes; each change
//! rebuilds that namespace's list alone (a few quotas). Only what feasibility reads is
//! kept: the name and namespace, `spec` (hard, scopes, scopeSelector) and `status.used`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;

use super::cache::Sink;

/// Each namespace's quotas, in name order; a namespace without any is absent.
pub type ByNamespace = HashMap<String, Arc<[Arc<ResourceQuota>]>>;

/// A quota as the cache keeps it.
pub fn trim(q: &mut ResourceQuota) {
    q.metadata = ObjectMeta {
        name: q.metadata.name.take(),
        namespace: q.metadata.namespace.take(),
        ..ObjectMeta::default()
    };
    if let Some(s) = q.status.as_mut() {
        *s = ResourceQuotaStatus {
            used: s.used.take(),
            hard: None,
        };
    }
}

/// The quotas' watch into [`ByNamespace`], which reviews read.
pub struct QuotaSink {
    published: Arc<RwLock<ByNamespace>>,
    /// What a relist has brought so far; it replaces what is published once complete.
    relist: Option<ByNamespace>,
    count: usize,
}

impl QuotaSink {
    pub fn new(published: Arc<RwLock<ByNamespace>>) -> QuotaSink {
        QuotaSink {
            published,
            relist: None,
            count: 0,
        }
    }
}

fn key(q: &ResourceQuota) -> (&str, &str) {
    (
        q.metadata.namespace.as_deref().unwrap_or(""),
        q.metadata.name.as_deref().unwrap_or(""),
    )
}

/// `map` with quota `q` put in (`Some`) or taken out (`None` of that name); whether the
/// number of quotas changed and how.
fn change(map: &mut ByNamespace, namespace: &str, name: &str, q: Option<ResourceQuota>) -> isize {
    let mut list: Vec<Arc<ResourceQuota>> =
        map.get(namespace).map(|l| l.to_vec()).unwrap_or_default();
    let before = list.len();
    list.retain(|x| key(x).1 != name);
    if let Some(q) = q {
        list.push(Arc::new(q));
        list.sort_by(|a, b| key(a).1.cmp(key(b).1));
    }
    let delta = list.len() as isize - before as isize;
    if list.is_empty() {
        map.remove(namespace);
    } else {
        map.insert(namespace.to_owned(), list.into());
    }
    delta
}

impl Sink<ResourceQuota> for QuotaSink {
    fn event(&mut self, event: watcher::Event<ResourceQuota>) {
        match event {
            watcher::Event::Init => self.relist = Some(ByNamespace::new()),
            watcher::Event::InitApply(q) => {
                let (ns, name) = key(&q);
                let (ns, name) = (ns.to_owned(), name.to_owned());
                change(
                    self.relist.get_or_insert_with(ByNamespace::new),
                    &ns,
                    &name,
                    Some(q),
                );
            }
            watcher::Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                self.count = listed.values().map(|l| l.len()).sum();
                *self.published.write().unwrap_or_else(|p| p.into_inner()) = listed;
            }
            watcher::Event::Apply(q) => {
                let (ns, name) = key(&q);
                let (ns, name) = (ns.to_owned(), name.to_owned());
                let mut map = self.published.write().unwrap_or_else(|p| p.into_inner());
                self.count =
                    self.count
                        .saturating_add_signed(change(&mut map, &ns, &name, Some(q)));
            }
            watcher::Event::Delete(q) => {
                let (ns, name) = key(&q);
                let mut map = self.published.write().unwrap_or_else(|p| p.into_inner());
                self.count = self
                    .count
                    .saturating_add_signed(change(&mut map, ns, name, None));
            }
        }
    }

    fn len(&self) -> usize {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn quota(ns: &str, name: &str, used: &str) -> ResourceQuota {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "uid": "u", "resourceVersion": "3",
                "managedFields": [{"manager": "kube-controller-manager"}]},
            "spec": {"hard": {"requests.nvidia.com/gpu": "8"}},
            "status": {"hard": {"requests.nvidia.com/gpu": "8"}, "used": {"requests.nvidia.com/gpu": used}}
        }))
        .unwrap()
    }

    #[test]
    fn quotas_are_kept_by_namespace_trimmed() {
        let published = Arc::new(RwLock::new(ByNamespace::new()));
        let mut sink = QuotaSink::new(published.clone());
        let names = |ns: &str| -> Vec<String> {
            published.read().unwrap().get(ns).map_or(vec![], |l| {
                l.iter().map(|q| q.metadata.name.clone().unwrap()).collect()
            })
        };
        sink.event(watcher::Event::Init);
        for (ns, name) in [("ml", "gpu"), ("ml", "compute"), ("web", "pods")] {
            let mut q = quota(ns, name, "0");
            trim(&mut q);
            sink.event(watcher::Event::InitApply(q));
        }
        assert!(names("ml").is_empty(), "not before the list is complete");
        sink.event(watcher::Event::InitDone);
        assert_eq!(names("ml"), ["compute", "gpu"]);
        assert_eq!(sink.len(), 3);

        let mut q = quota("ml", "gpu", "4");
        trim(&mut q);
        assert!(q.metadata.uid.is_none() && q.metadata.managed_fields.is_none());
        assert!(q.status.as_ref().unwrap().hard.is_none());
        sink.event(watcher::Event::Apply(q));
        assert_eq!(sink.len(), 3);
        let used = published.read().unwrap()["ml"][1]
            .status
            .clone()
            .unwrap()
            .used
            .unwrap();
        assert_eq!(used["requests.nvidia.com/gpu"].0, "4");

        sink.event(watcher::Event::Delete(quota("web", "pods", "0")));
        assert_eq!(sink.len(), 2);
        assert!(!published.read().unwrap().contains_key("web"));
    }
}

//! DRA (`resource.k8s.io`) in whatever version the cluster serves: its ResourceClaims,
//! ResourceClaimTemplates and DeviceClasses.
//!
//! Kubernetes 1.34 and later serve `resource.k8s.io/v1`; 1.33 serves `v1beta1` and
//! `v1beta2` (when DRA is enabled), and a cluster without DRA serves none. The cluster
//! context asks discovery once at start which versions are served, watches the newest of
//! [`DRA_API_VERSIONS`], and asks again when a watch gets 404 (the version went away, as
//! in an upgrade that stops serving a beta). Claims and templates are read as v1, as the
//! apiserver converts them (`tollgate_core::claim_from`); of DeviceClasses only
//! the names are kept. A cluster that serves no version has no claims and no classes:
//! nothing to wait for or to say, and discovery is asked again now and then, so that DRA
//! enabled later is picked up.
//!
//! The same discovery and watch loop serve Kueue's queues, which come in versions too
//! (`kueue.rs`).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ApiResource;
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client, Resource};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use tokio::time::Instant;
use tracing::warn;

use super::cache::{drive, Ended, Health, Sink};
use tollgate_core::DRA_API_VERSIONS;

/// DRA's API group.
pub const GROUP: &str = "resource.k8s.io";

/// How often discovery is asked again while the cluster serves no DRA version, and the
/// longest pause between two failed attempts.
const REDISCOVER: Duration = Duration::from_secs(300);

/// The newest of [`DRA_API_VERSIONS`] the cluster serves (`resource.k8s.io/v1`), or None.
pub async fn discover(client: &Client) -> Result<Option<&'static str>, kube::Error> {
    newest_served(client, &DRA_API_VERSIONS).await
}

/// The first of `versions` (`group/version`, newest first, all of one group) the cluster
/// serves, or None.
pub async fn newest_served(
    client: &Client,
    versions: &[&'static str],
) -> Result<Option<&'static str>, kube::Error> {
    let name = group_of(versions);
    let groups = client.list_api_groups().await?;
    let Some(group) = groups.groups.iter().find(|g| g.name == name) else {
        return Ok(None);
    };
    Ok(versions
        .iter()
        .find(|v| group.versions.iter().any(|gv| gv.group_version == **v))
        .copied())
}

/// The API group of `versions` (`group/version`, all of one group).
fn group_of(versions: &[&'static str]) -> &'static str {
    versions
        .first()
        .and_then(|v| v.split_once('/'))
        .map_or("", |(g, _)| g)
}

/// A resource of `api_version` (`resource.k8s.io/v1beta1`, `kueue.x-k8s.io/v1beta2`).
pub fn resource(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or((GROUP, "v1"));
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// What discovery last said of one API group, shared by its watches and fetches.
pub struct Discovery {
    client: Client,
    /// The versions read, newest first (`group/version`).
    versions: &'static [&'static str],
    /// When it was last asked, and its answer.
    last: Mutex<Option<(Instant, Option<&'static str>)>>,
    asking: tokio::sync::Mutex<()>,
}

impl Discovery {
    /// DRA's: [`DRA_API_VERSIONS`].
    pub fn new(client: Client) -> Discovery {
        Discovery::of(client, &DRA_API_VERSIONS)
    }

    /// Of the group of `versions` (newest first).
    pub fn of(client: Client, versions: &'static [&'static str]) -> Discovery {
        Discovery {
            client,
            versions,
            last: Mutex::new(None),
            asking: tokio::sync::Mutex::new(()),
        }
    }

    /// The group asked about.
    pub fn group(&self) -> &'static str {
        group_of(self.versions)
    }

    /// The last answer: None before discovery has answered; Some(None): no version served.
    pub fn known(&self) -> Option<Option<&'static str>> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|(_, v)| v)
    }

    /// The served version: the last answer, unless `again` (then discovery is asked,
    /// unless another watch asked within the last second).
    pub async fn version(&self, again: bool) -> Result<Option<&'static str>, kube::Error> {
        let _one_at_a_time = self.asking.lock().await;
        let last = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, v)) = last {
            if !again || at.elapsed() < Duration::from_secs(1) {
                return Ok(v);
            }
        }
        let v = newest_served(&self.client, self.versions).await?;
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), v));
        Ok(v)
    }
}

/// A DRA object of any version, as JSON (without managedFields), with its metadata for
/// the watcher.
#[derive(Clone, Debug)]
pub struct Raw {
    metadata: ObjectMeta,
    pub json: Value,
}

impl Resource for Raw {
    type DynamicType = ApiResource;
    type Scope = kube::core::DynamicResourceScope;
    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }
    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }
    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }
    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }
    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut json = Value::deserialize(d)?;
        if let Some(Value::Object(m)) = json.get_mut("metadata") {
            m.remove("managedFields");
        }
        let metadata = match json.get("metadata") {
            Some(m) => ObjectMeta::deserialize(m).map_err(serde::de::Error::custom)?,
            None => ObjectMeta::default(),
        };
        Ok(Raw { metadata, json })
    }
}

impl Raw {
    /// The object as `convert` reads it, with the apiVersion list items lack.
    pub fn read<K>(
        self,
        api_version: &str,
        convert: fn(&Value) -> Result<K, String>,
    ) -> Result<K, String> {
        let mut json = self.json;
        if let Some(o) = json.as_object_mut() {
            o.insert("apiVersion".into(), api_version.into());
        }
        convert(&json)
    }
}

/// One DRA resource's watch: which, and how an object of it is kept.
pub struct Watch<K> {
    pub kind: &'static str,
    pub plural: &'static str,
    /// The object, of any served version, as the cache keeps it.
    pub convert: fn(&Value) -> Result<K, String>,
}

/// Runs a DRA resource's watch into `sink`, in the version discovery finds, until the
/// context is dropped.
pub async fn run<K: Send + 'static>(
    client: Client,
    discovery: Arc<Discovery>,
    what: Watch<K>,
    health: Arc<Health>,
    mut sink: impl Sink<K>,
) {
    let mut again = false;
    let mut pause = Duration::from_secs(1);
    loop {
        let version = match discovery.version(again).await {
            Ok(Some(v)) => v,
            Ok(None) => {
                health.not_served();
                again = true;
                tokio::time::sleep(REDISCOVER).await;
                continue;
            }
            Err(e) => {
                health.failed(
                    &format!(
                        "discovery of {}: {}",
                        discovery.group(),
                        crate::kubeconfig::words(&e)
                    ),
                    crate::kubeconfig::is_unreachable(&e),
                    sink.len(),
                );
                again = true;
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(REDISCOVER);
                continue;
            }
        };
        health.served();
        let ar = resource(version, what.kind, what.plural);
        let api = Api::<Raw>::all_with(client.clone(), &ar);
        let convert = what.convert;
        let kind = what.kind;
        let stream = watcher(api.clone(), watcher::Config::default().page_size(500))
            .default_backoff()
            .filter_map(move |event| {
                futures::future::ready(match event {
                    Ok(e) => read_event(e, version, kind, convert).map(Ok),
                    Err(e) => Some(Err(e)),
                })
            });
        let started = Instant::now();
        match drive(stream, &health, &mut sink, &api, true).await {
            // The version went away: ask discovery again, after a pause if this one had
            // only just been found (so that a resource missing from a served version does
            // not spin).
            Ended::NotFound => {
                again = true;
                if started.elapsed() > REDISCOVER {
                    pause = Duration::from_secs(1);
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(REDISCOVER);
            }
            Ended::Closed => return,
        }
    }
}

/// A watch event of a DRA object as the cache keeps it; None for an object that could not
/// be read (logged).
fn read_event<K>(
    event: watcher::Event<Raw>,
    api_version: &str,
    kind: &str,
    convert: fn(&Value) -> Result<K, String>,
) -> Option<watcher::Event<K>> {
    let read = |r: Raw| {
        let name = r.metadata.name.clone().unwrap_or_default();
        let namespace = r.metadata.namespace.clone().unwrap_or_default();
        r.read(api_version, convert)
            .map_err(|e| {
                warn!(kind, %namespace, %name, error = %e, "an object the cluster context cannot read; left out");
            })
            .ok()
    };
    Some(match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(r) => watcher::Event::InitApply(read(r)?),
        watcher::Event::Apply(r) => watcher::Event::Apply(read(r)?),
        watcher::Event::Delete(r) => watcher::Event::Delete(read(r)?),
    })
}

/// A DeviceClass as the cache keeps it: its name.
pub fn class_name(v: &Value) -> Result<String, String> {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| "a DeviceClass without a name".to_owned())
}

/// The DeviceClasses' names, published for reviews as they change.
pub struct ClassSink {
    names: BTreeSet<String>,
    relist: Option<BTreeSet<String>>,
    published: Arc<ArcSwap<BTreeSet<String>>>,
}

impl ClassSink {
    pub fn new(published: Arc<ArcSwap<BTreeSet<String>>>) -> ClassSink {
        ClassSink {
            names: BTreeSet::new(),
            relist: None,
            published,
        }
    }
}

impl Sink<String> for ClassSink {
    fn event(&mut self, event: watcher::Event<String>) {
        let changed = match event {
            watcher::Event::Init => {
                self.relist = Some(BTreeSet::new());
                false
            }
            watcher::Event::InitApply(name) => {
                self.relist.get_or_insert_with(BTreeSet::new).insert(name);
                false
            }
            watcher::Event::InitDone => {
                self.names = self.relist.take().unwrap_or_default();
                true
            }
            watcher::Event::Apply(name) => self.names.insert(name),
            watcher::Event::Delete(name) => self.names.remove(&name),
        };
        if changed {
            self.published.store(Arc::new(self.names.clone()));
        }
    }

    fn len(&self) -> usize {
        self.names.len()
    }
}

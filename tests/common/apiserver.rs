//! Objects sent to the real kube-apiserver of the tests (`super::envtest`): an object as
//! tollgate made it, readied for a create, created (or only admitted, `dryRun=All`), many at
//! once.

use std::collections::BTreeSet;
use std::future::Future;

use futures::stream::{self, StreamExt as _};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::Value;

/// How many requests the tests keep in flight to the one apiserver: enough to hide each
/// round trip, few enough not to starve the other tests sharing it on two cores.
pub const IN_FLIGHT: usize = 16;

/// `obj` as a client would send it to create it in `namespace`: without what the apiserver
/// sets itself (uid, resourceVersion, creationTimestamp, generation, managedFields, a
/// status, which it would refuse or reset on a create), in `namespace`. A `generateName`
/// object keeps its `generateName` and gets no name (the apiserver makes one). A Job sent
/// by an apiserver also loses the selector and the template labels naming its uid (the
/// apiserver makes them anew, and refuses them made by anyone else).
pub fn for_create(obj: &Value, namespace: &str) -> Value {
    let mut obj = obj.clone();
    if let Some(uid) = obj["metadata"]["uid"].as_str().map(str::to_owned) {
        let names_uid = |v: &Value| v.as_str() == Some(uid.as_str());
        if let Some(Value::Object(labels)) = obj.pointer_mut("/spec/template/metadata/labels") {
            labels.retain(|_, v| !names_uid(v));
        }
        let generated = obj
            .pointer("/spec/selector/matchLabels")
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty() && m.values().all(names_uid));
        if generated && obj.pointer("/spec/manualSelector") != Some(&Value::Bool(true)) {
            obj["spec"].as_object_mut().unwrap().remove("selector");
        }
    }
    if let Some(Value::Object(m)) = obj.get_mut("metadata") {
        for k in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "generation",
            "managedFields",
            "selfLink",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            m.remove(k);
        }
        if m.get("generateName")
            .is_some_and(|g| g.as_str() != Some(""))
        {
            m.remove("name");
        }
        m.insert("namespace".into(), Value::from(namespace));
    }
    if let Value::Object(m) = &mut obj {
        m.remove("status");
    }
    obj
}

/// The API resource of an object's apiVersion and kind (its plural guessed as kube does,
/// right for every kind tollgate reviews).
pub fn resource_of(obj: &Value) -> ApiResource {
    let api = obj["apiVersion"].as_str().unwrap_or("");
    let (group, version) = api.split_once('/').unwrap_or(("", api));
    let kind = obj["kind"].as_str().unwrap_or("");
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// What the apiserver said when it refused an object: its HTTP status, its message, and
/// the causes it named (reason and field, e.g. `FieldValueRequired`,
/// `spec.containers[0].resources.limits`).
#[derive(Debug, Clone)]
pub struct Refusal {
    pub code: u16,
    pub message: String,
    pub causes: BTreeSet<(String, String)>,
    /// Each cause as the apiserver words it: its field and its message
    /// (`Required value: Limit must be set for non overcommitable resources`).
    pub said: BTreeSet<(String, String)>,
}

/// Creates `obj` (in its metadata.namespace; without one, a cluster-scoped object) as
/// `client`; with `dry_run`,
/// only admitted (`dryRun=All`: decoded, defaulted, sent through admission and validated,
/// not stored). Ok: what the apiserver returned.
pub async fn create(client: &kube::Client, obj: &Value, dry_run: bool) -> Result<Value, Refusal> {
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource_of(obj)),
        None => Api::all_with(client.clone(), &resource_of(obj)),
    };
    let dynamic: DynamicObject = serde_json::from_value(obj.clone()).map_err(|e| Refusal {
        code: 0,
        message: format!("not an object: {e}"),
        causes: BTreeSet::new(),
        said: BTreeSet::new(),
    })?;
    let params = PostParams {
        dry_run,
        ..Default::default()
    };
    match api.create(&params, &dynamic).await {
        Ok(created) => Ok(serde_json::to_value(created).unwrap()),
        Err(kube::Error::Api(s)) => Err(Refusal {
            code: s.code,
            causes: s
                .details
                .iter()
                .flat_map(|d| &d.causes)
                .map(|c| (c.reason.clone(), c.field.clone()))
                .collect(),
            said: s
                .details
                .iter()
                .flat_map(|d| &d.causes)
                .map(|c| (c.field.clone(), c.message.clone()))
                .collect(),
            message: s.message,
        }),
        Err(e) => Err(Refusal {
            code: 0,
            message: e.to_string(),
            causes: BTreeSet::new(),
            said: BTreeSet::new(),
        }),
    }
}

/// What the apiserver makes of an object as tollgate mutated it, beside the object as sent.
#[derive(Debug)]
pub enum Verdict {
    /// It accepts it.
    Accepted,
    /// It refuses it for nothing but what it refuses the object as sent for: the user's
    /// mistake, which tollgate neither made nor had to mend.
    AsSent(String),
    /// It cannot even decode the object as sent (a quantity that is no quantity): no
    /// webhook would ever see it.
    Undecodable(String),
    /// It refuses it for something tollgate did: the message, and what it said of the
    /// object as sent.
    Refused(String),
}

/// Admits `mutated` (`dryRun=All`) and, where it is refused, `sent` too, to tell tollgate's
/// doing from the user's. Both are readied with [`for_create`] for `namespace`. The
/// mutating webhooks see an object before it is validated, so an object as sent may be
/// invalid (a GPU requested without its limit, which tollgate's defaults mend): what
/// counts is that tollgate adds no refusal of its own (a cause, by reason and field, the
/// object as sent does not have).
pub async fn admits(
    client: &kube::Client,
    namespace: &str,
    sent: &Value,
    mutated: &Value,
) -> Verdict {
    let mutated = for_create(mutated, namespace);
    let Err(refused) = create(client, &mutated, true).await else {
        return Verdict::Accepted;
    };
    match create(client, &for_create(sent, namespace), true).await {
        Ok(_) => Verdict::Refused(format!("{} (as sent: accepted)", refused.message)),
        Err(before) if before.code == 400 => Verdict::Undecodable(before.message),
        Err(before) if !refused.causes.is_empty() && refused.causes.is_subset(&before.causes) => {
            Verdict::AsSent(refused.message)
        }
        Err(before) => {
            Verdict::Refused(format!("{} (as sent: {})", refused.message, before.message))
        }
    }
}

/// Runs `f` on every item, [`IN_FLIGHT`] at a time; the results in the items' order.
pub async fn each<T, R, F, Fut>(items: Vec<T>, f: F) -> Vec<R>
where
    F: Fn(T) -> Fut,
    Fut: Future<Output = R>,
{
    let mut out: Vec<(usize, R)> = stream::iter(items.into_iter().enumerate())
        .map(|(i, item)| {
            let fut = f(item);
            async move { (i, fut.await) }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

//! Reading an AdmissionReview of a Pod for what a review uses, and no more.
//!
//! Parsing the body is most of what a review costs. kube's `AdmissionReview<Pod>` reads
//! every field: `metadata.managedFields` (the largest part of what the apiserver sends, as
//! a `serde_json::Value` tree nothing reads), `oldObject` (a second pod on UPDATE), and for
//! `/validate` the whole spec, of which validation judges the resources alone. The shapes
//! here read the same JSON into the same typed `Pod`, skipping those parts without
//! allocating.
//!
//! They are only ever a fast path: any body they cannot read (a malformed field, a
//! duplicate key, an escape where a plain string was expected, another kind of object) goes
//! through kube's full parse, so errors stay exactly what they were. The one difference
//! is in what they skip: a body that the full parse would refuse only for a malformed
//! `managedFields`, `oldObject` or `options` (or, on `/validate`, a malformed field outside
//! what validation reads) is reviewed rather than refused. The apiserver never sends one:
//! it decoded the object into its own types before calling.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::core::v1::{
    Container, Pod, PodResourceClaim, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube_core::admission::{AdmissionRequest, Operation};
use kube_core::{DynamicObject, GroupVersionKind, GroupVersionResource, TypeMeta};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::stage::Stage;

/// A request read by a shape, and what the shape left unparsed.
pub(crate) struct Parsed<'a> {
    pub request: AdmissionRequest<Pod>,
    /// The pod's labels as sent, for [`Stage::Validate`] (the object has none then).
    pub labels: Option<&'a RawValue>,
    /// Where the pod may run, as sent, for [`Stage::Validate`] (the spec has none of it
    /// then).
    pub placement: Option<Placement<'a>>,
}

/// What [`Stage::Validate`] leaves as text of where a pod may run: its tolerations, node
/// selector and affinity. Only feasibility reads them, and only when the cluster context
/// knows nodes or quotas; nearly every pod carries the apiserver's two default
/// tolerations, so reading them for nothing would be most of what the wider shape costs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Placement<'a> {
    tolerations: Option<&'a RawValue>,
    node_selector: Option<&'a RawValue>,
    affinity: Option<&'a RawValue>,
}

impl Placement<'_> {
    /// Reads them into `spec`. A field that does not read stays absent: the apiserver
    /// decoded the pod into its own types before calling, so it never sends one.
    pub(crate) fn fill(self, spec: &mut PodSpec) {
        fn read<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
            serde_json::from_str(raw?.get()).ok()
        }
        spec.tolerations = read(self.tolerations);
        spec.node_selector = read(self.node_selector);
        spec.affinity = read(self.affinity);
    }
}

/// The request of an `admission.k8s.io/v1` AdmissionReview of a Pod, read for what the
/// webhooks of `stage` use; None when the fast path cannot read it (the caller then takes
/// the full parse).
#[cfg(test)]
pub(crate) fn request(body: &[u8], stage: Stage) -> Option<AdmissionRequest<Pod>> {
    read_shape(body, stage).map(|p| p.request)
}

/// [`request`], with what the shape left unparsed. Where the mutating webhook runs, the
/// pod is read whole but for `metadata.managedFields` (and `oldObject`): what mutation
/// needs to compute a patch over the spec. The validating webhook alone reads, of the
/// metadata, the name, generateName, namespace and annotations; of the spec, the
/// containers' names, requests, limits and restart policies and the pod-level resources
/// (what validation and the opt-out read), and what feasibility reads: the node selector,
/// affinity, node name, tolerations, claims, overhead, priority class and active deadline.
/// Everything else stays at its default. The labels are kept as the JSON text they arrived
/// as ([`Parsed::labels`]): only a profile that selects pods reads them.
pub(crate) fn read_shape(body: &[u8], stage: Stage) -> Option<Parsed<'_>> {
    if stage.mutates() {
        read::<Meta, PodSpec, PodStatus>(body)
    } else {
        read::<ValidationMeta, ValidationSpec, Skipped>(body)
    }
}

/// An AdmissionReview of any other kind of object (a workload), its objects as JSON: the
/// request without them, the object and the old object. None when the body is not a
/// well-formed `admission.k8s.io/v1` review, or is one of a core Pod (pods take the paths
/// above).
pub(crate) fn workload(
    body: &[u8],
) -> Option<(AdmissionRequest<DynamicObject>, Value, Option<Value>)> {
    let review: Review<WorkloadRequest> = serde_json::from_slice(body).ok()?;
    if !is_admission_review_v1(&review.api_version, &review.kind) {
        return None;
    }
    let r = review.request?;
    if r.kind.group.is_empty() && r.kind.kind == "Pod" {
        return None;
    }
    let object = r.object.filter(|o| !o.is_null())?;
    let old = r.old_object.filter(|o| !o.is_null());
    let req = AdmissionRequest {
        types: TypeMeta {
            api_version: review.api_version,
            kind: review.kind,
        },
        uid: r.uid,
        kind: r.kind,
        resource: r.resource,
        sub_resource: r.sub_resource,
        request_kind: r.request_kind,
        request_resource: r.request_resource,
        request_sub_resource: r.request_sub_resource,
        name: r.name,
        namespace: r.namespace,
        operation: r.operation,
        user_info: r.user_info,
        object: None,
        old_object: None,
        dry_run: r.dry_run,
        options: None,
    };
    Some((req, object, old))
}

/// What one look at a review's `request.kind` says it is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peeked {
    /// A core v1 Pod, or a body the look could not tell (the pod parse then says why).
    Pod,
    /// Any other kind: a workload, read by [`workload`].
    Other,
}

/// Reads `request.kind` and stops there: what decides which one parse reads the body.
/// The apiserver writes `kind` right after `uid`, so the look costs a few dozen bytes;
/// in any other order the fields before it are passed over, not built.
pub(crate) fn peek(body: &[u8]) -> Peeked {
    use serde::de::{DeserializeSeed, Error as _, IgnoredAny, MapAccess, Visitor};
    use std::borrow::Cow;
    use std::fmt;

    /// The group and kind of a GroupVersionKind, borrowed where the text allows.
    #[derive(Deserialize)]
    struct Gk<'a> {
        #[serde(default, borrow)]
        group: Cow<'a, str>,
        #[serde(default, borrow)]
        kind: Cow<'a, str>,
    }

    /// The review: its `request` member.
    struct Review<'o>(&'o mut Option<bool>);
    /// The request: its `kind` member.
    struct Request<'o>(&'o mut Option<bool>);

    impl<'de> DeserializeSeed<'de> for Review<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Review<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an AdmissionReview")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                if key == "request" {
                    map.next_value_seed(Request(&mut *self.0))?;
                    if self.0.is_some() {
                        return Err(A::Error::custom("seen"));
                    }
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(())
        }
    }
    impl<'de> DeserializeSeed<'de> for Request<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Request<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an AdmissionRequest")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                if key == "kind" {
                    let gk: Gk<'de> = map.next_value()?;
                    *self.0 = Some(gk.group.is_empty() && gk.kind == "Pod");
                    // Stop: what follows is not needed to choose the parse.
                    return Err(A::Error::custom("seen"));
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }

    let mut is_pod = None;
    let mut de = serde_json::Deserializer::from_slice(body);
    let _ = Review(&mut is_pod).deserialize(&mut de);
    match is_pod {
        Some(false) => Peeked::Other,
        _ => Peeked::Pod,
    }
}

/// The one envelope tollgate answers: an `admission.k8s.io/v1` AdmissionReview.
pub(crate) fn is_admission_review_v1(api_version: &str, kind: &str) -> bool {
    api_version == "admission.k8s.io/v1" && kind == "AdmissionReview"
}

fn read<'a, M, S, T>(body: &'a [u8]) -> Option<Parsed<'a>>
where
    M: Deserialize<'a> + MetaShape<'a>,
    S: Deserialize<'a> + SpecShape<'a>,
    T: Deserialize<'a> + Into<Option<PodStatus>>,
{
    let review: Review<Request<M, S, T>> = serde_json::from_slice(body).ok()?;
    if !is_admission_review_v1(&review.api_version, &review.kind) {
        return None;
    }
    let r = review.request?;
    let (object, labels, placement) = match r.object.map(PodOf::into_parts) {
        Some((pod, labels, placement)) => (Some(pod), labels, placement),
        None => (None, None, None),
    };
    let request = AdmissionRequest {
        types: TypeMeta {
            api_version: review.api_version,
            kind: review.kind,
        },
        uid: r.uid,
        kind: r.kind,
        resource: r.resource,
        sub_resource: r.sub_resource,
        request_kind: r.request_kind,
        request_resource: r.request_resource,
        request_sub_resource: r.request_sub_resource,
        name: r.name,
        namespace: r.namespace,
        operation: r.operation,
        user_info: r.user_info,
        object,
        old_object: None,
        dry_run: r.dry_run,
        options: None,
    };
    Some(Parsed {
        request,
        labels,
        placement,
    })
}

/// What a shape reads of the metadata: the ObjectMeta, and the labels if it left them as
/// text.
trait MetaShape<'a> {
    fn into_parts(self) -> (ObjectMeta, Option<&'a RawValue>);
}

/// What a shape reads of the spec: the PodSpec, and where the pod may run if it left that
/// as text.
trait SpecShape<'a> {
    fn into_parts(self) -> (PodSpec, Option<Placement<'a>>);
}

impl SpecShape<'_> for PodSpec {
    fn into_parts(self) -> (PodSpec, Option<Placement<'static>>) {
        (self, None)
    }
}

// Field for field kube's AdmissionReview and AdmissionRequest (with the same defaults),
// without `response`, `oldObject` and `options`, which unknown-field skipping passes over.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review<R> {
    api_version: String,
    kind: String,
    request: Option<R>,
}

/// A workload's request: the objects as they are, `oldObject` too (an UPDATE is judged
/// by what it changes).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WorkloadRequest {
    uid: String,
    kind: GroupVersionKind,
    resource: GroupVersionResource,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    request_kind: Option<GroupVersionKind>,
    #[serde(default)]
    request_resource: Option<GroupVersionResource>,
    #[serde(default)]
    request_sub_resource: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    operation: Operation,
    user_info: UserInfo,
    #[serde(default)]
    object: Option<Value>,
    #[serde(default)]
    old_object: Option<Value>,
    #[serde(default)]
    dry_run: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request<M, S, T> {
    uid: String,
    // A review of anything but a core Pod stops here, a few dozen bytes in: the caller
    // then looks at the kind once more and reads the body as a workload.
    #[serde(deserialize_with = "core_pod")]
    kind: GroupVersionKind,
    resource: GroupVersionResource,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    request_kind: Option<GroupVersionKind>,
    #[serde(default)]
    request_resource: Option<GroupVersionResource>,
    #[serde(default)]
    request_sub_resource: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    operation: Operation,
    user_info: UserInfo,
    object: Option<PodOf<M, S, T>>,
    #[serde(default)]
    dry_run: bool,
}

/// k8s-openapi's Pod: `apiVersion` and `kind`, when present, must be `v1` and `Pod`.
#[derive(Deserialize)]
struct PodOf<M, S, T> {
    #[serde(default, rename = "apiVersion", deserialize_with = "expect_v1")]
    _api_version: (),
    #[serde(default, rename = "kind", deserialize_with = "expect_pod")]
    _kind: (),
    metadata: Option<M>,
    spec: Option<S>,
    status: Option<T>,
}

impl<'a, M: MetaShape<'a>, S: SpecShape<'a>, T: Into<Option<PodStatus>>> PodOf<M, S, T> {
    fn into_parts(self) -> (Pod, Option<&'a RawValue>, Option<Placement<'a>>) {
        let (metadata, labels) = self
            .metadata
            .map_or((ObjectMeta::default(), None), MetaShape::into_parts);
        let (spec, placement) = match self.spec.map(SpecShape::into_parts) {
            Some((spec, placement)) => (Some(spec), placement),
            None => (None, None),
        };
        let pod = Pod {
            metadata,
            spec,
            status: self.status.and_then(Into::into),
        };
        (pod, labels, placement)
    }
}

/// A part of the object that is passed over: it reads as absent.
struct Skipped;

impl<'de> Deserialize<'de> for Skipped {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| Skipped)
    }
}

impl From<Skipped> for Option<PodStatus> {
    fn from(_: Skipped) -> Self {
        None
    }
}

/// A request's `kind`, when it is a core Pod's.
fn core_pod<'de, D: Deserializer<'de>>(d: D) -> Result<GroupVersionKind, D::Error> {
    let gvk = GroupVersionKind::deserialize(d)?;
    if gvk.group.is_empty() && gvk.kind == "Pod" {
        Ok(gvk)
    } else {
        Err(serde::de::Error::custom("not a review of a pod"))
    }
}

fn expect_v1<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    expect(d, "v1")
}

fn expect_pod<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    expect(d, "Pod")
}

fn expect<'de, D: Deserializer<'de>>(d: D, want: &'static str) -> Result<(), D::Error> {
    let got = <&str>::deserialize(d)?;
    if got == want {
        Ok(())
    } else {
        Err(serde::de::Error::invalid_value(
            serde::de::Unexpected::Str(got),
            &want,
        ))
    }
}

/// ObjectMeta without `managedFields`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl MetaShape<'_> for Meta {
    fn into_parts(self) -> (ObjectMeta, Option<&'static RawValue>) {
        let m = self;
        // Without `..`: a field added to ObjectMeta is a compile error here until it is read.
        let meta = ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        };
        (meta, None)
    }
}

/// What validation reads of ObjectMeta: the opt-out annotation and the name it shows, and
/// the labels as text, which only a profile that selects pods reads (a pod's labels are
/// much of its metadata; left unparsed they cost only the scan).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ValidationMeta<'a> {
    annotations: Option<BTreeMap<String, String>>,
    generate_name: Option<String>,
    #[serde(borrow)]
    labels: Option<&'a RawValue>,
    name: Option<String>,
    namespace: Option<String>,
}

impl<'a> MetaShape<'a> for ValidationMeta<'a> {
    fn into_parts(self) -> (ObjectMeta, Option<&'a RawValue>) {
        let meta = ObjectMeta {
            annotations: self.annotations,
            generate_name: self.generate_name,
            name: self.name,
            namespace: self.namespace,
            ..Default::default()
        };
        (meta, self.labels)
    }
}

/// What validation reads of a PodSpec: the containers' requests, and what feasibility
/// reads (where the pod may be scheduled, its claims, what decides a quota's scope).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ValidationSpec<'a> {
    #[serde(default)]
    containers: Vec<ValidationContainer>,
    init_containers: Option<Vec<ValidationContainer>>,
    resources: Option<ResourceRequirements>,
    active_deadline_seconds: Option<i64>,
    #[serde(borrow)]
    affinity: Option<&'a RawValue>,
    node_name: Option<String>,
    #[serde(borrow)]
    node_selector: Option<&'a RawValue>,
    overhead: Option<BTreeMap<String, Quantity>>,
    priority_class_name: Option<String>,
    resource_claims: Option<Vec<PodResourceClaim>>,
    #[serde(borrow)]
    tolerations: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ValidationContainer {
    #[serde(default)]
    name: String,
    resources: Option<ResourceRequirements>,
    restart_policy: Option<String>,
}

impl From<ValidationContainer> for Container {
    fn from(c: ValidationContainer) -> Container {
        Container {
            name: c.name,
            resources: c.resources,
            restart_policy: c.restart_policy,
            ..Default::default()
        }
    }
}

impl<'a> SpecShape<'a> for ValidationSpec<'a> {
    fn into_parts(self) -> (PodSpec, Option<Placement<'a>>) {
        let spec = PodSpec {
            containers: self.containers.into_iter().map(Into::into).collect(),
            init_containers: self
                .init_containers
                .map(|l| l.into_iter().map(Into::into).collect()),
            resources: self.resources,
            active_deadline_seconds: self.active_deadline_seconds,
            node_name: self.node_name,
            overhead: self.overhead,
            priority_class_name: self.priority_class_name,
            resource_claims: self.resource_claims,
            ..Default::default()
        };
        let placement = Placement {
            tolerations: self.tolerations,
            node_selector: self.node_selector,
            affinity: self.affinity,
        };
        (spec, Some(placement))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_core::admission::AdmissionReview;

    fn all_fixtures() -> Vec<(String, Vec<u8>)> {
        let dir = crate::testdata::fixtures_dir();
        let mut out: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                (p.display().to_string(), std::fs::read(&p).unwrap())
            })
            .collect();
        out.sort();
        out
    }

    /// The reviews of pods: what the fast path is for.
    fn fixtures() -> Vec<(String, Vec<u8>)> {
        let out: Vec<_> = all_fixtures()
            .into_iter()
            .filter(|(_, b)| crate::testdata::is_pod_review(b))
            .collect();
        assert!(out.len() >= 12);
        out
    }

    /// The reviews of workloads: never read as pods, read whole as workloads, oldObject
    /// included; and no review of a pod is read as a workload.
    #[test]
    fn workloads_are_read_whole_and_pods_never_as_workloads() {
        let mut workloads = 0;
        for (name, body) in all_fixtures() {
            let v: Value = serde_json::from_slice(&body).unwrap();
            if crate::testdata::is_pod_review(&body) {
                assert!(workload(&body).is_none(), "{name}");
                continue;
            }
            workloads += 1;
            for shape in [Stage::Mutate, Stage::Validate] {
                assert!(request(&body, shape).is_none(), "{name}");
            }
            let (req, object, old) = workload(&body).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(object, v["request"]["object"], "{name}");
            assert_eq!(
                old.as_ref(),
                v["request"].get("oldObject").filter(|o| !o.is_null())
            );
            assert_eq!(req.uid, v["request"]["uid"].as_str().unwrap());
            assert_eq!(
                req.kind.kind,
                v["request"]["kind"]["kind"].as_str().unwrap()
            );
            assert_eq!(
                req.user_info.username.as_deref(),
                v["request"]["userInfo"]["username"].as_str()
            );
        }
        assert!(workloads >= 12, "{workloads}");
    }

    fn exact(body: &[u8]) -> AdmissionRequest<Pod> {
        let review: AdmissionReview<Pod> = serde_json::from_slice(body).unwrap();
        review.try_into().unwrap()
    }

    /// The full shape reads what kube's parse reads, but for what it leaves out on purpose.
    #[test]
    fn full_shape_is_kube_parse_without_managed_fields() {
        for (name, body) in fixtures() {
            let mut want = exact(&body);
            if let Some(p) = want.object.as_mut() {
                assert!(p.metadata.managed_fields.is_some(), "{name}");
                p.metadata.managed_fields = None;
            }
            want.old_object = None;
            want.options = None;
            let got = request(&body, Stage::Mutate).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(
                format!("{got:?}"),
                format!("{want:?}"),
                "{name}: the fast parse differs"
            );
        }
    }

    /// The validation shape keeps exactly the fields validation reads.
    #[test]
    fn validation_shape_keeps_what_validation_reads() {
        for (name, body) in fixtures() {
            let want = exact(&body);
            let got = request(&body, Stage::Validate).unwrap_or_else(|| panic!("{name}"));
            let (want, got) = (want.object.unwrap(), got.object.unwrap());
            assert_eq!(
                got.metadata.annotations, want.metadata.annotations,
                "{name}"
            );
            assert_eq!(got.metadata.name, want.metadata.name, "{name}");
            assert!(got.metadata.labels.is_none(), "{name}");
            let raw = read_shape(&body, Stage::Validate).unwrap().labels;
            let labels: Option<BTreeMap<String, String>> =
                raw.map(|r| serde_json::from_str(r.get()).unwrap());
            assert_eq!(labels, want.metadata.labels, "{name}");
            assert_eq!(got.metadata.generate_name, want.metadata.generate_name);
            let (ws, mut gs) = (want.spec.unwrap(), got.spec.unwrap());
            assert_eq!(gs.resources, ws.resources, "{name}");
            // Where the pod may run stays text until feasibility asks for it.
            assert!(
                gs.tolerations.is_none() && gs.node_selector.is_none() && gs.affinity.is_none()
            );
            let placement = read_shape(&body, Stage::Validate).unwrap().placement;
            placement.unwrap().fill(&mut gs);
            assert_eq!(gs.tolerations, ws.tolerations, "{name}");
            assert_eq!(gs.node_selector, ws.node_selector, "{name}");
            assert_eq!(gs.affinity, ws.affinity, "{name}");
            assert_eq!(gs.resource_claims, ws.resource_claims, "{name}");
            assert_eq!(gs.priority_class_name, ws.priority_class_name, "{name}");
            let names = |l: &[Container]| -> Vec<_> {
                l.iter()
                    .map(|c| {
                        (
                            c.name.clone(),
                            c.resources.clone(),
                            c.restart_policy.clone(),
                        )
                    })
                    .collect()
            };
            assert_eq!(names(&gs.containers), names(&ws.containers), "{name}");
            assert_eq!(
                gs.init_containers.as_deref().map(names),
                ws.init_containers.as_deref().map(names),
                "{name}"
            );
            assert!(got.status.is_none());
        }
    }

    /// What the fast path does not read the same way is left to the full parse.
    #[test]
    fn anything_unusual_falls_back() {
        let body = &fixtures()[0].1;
        let text = std::str::from_utf8(body).unwrap();
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let edits: Vec<(&str, serde_json::Value)> = vec![
            ("/request/object/apiVersion", "apps/v1".into()),
            ("/request/object/kind", "Deployment".into()),
            ("/request/object/kind", serde_json::Value::Null),
            ("/request/object/metadata/name", 7.into()),
            ("/request/object/spec/containers", "x".into()),
            ("/request/userInfo", serde_json::Value::Null),
            ("/request/operation", "PATCH".into()),
            ("/apiVersion", "admission.k8s.io/v1beta1".into()),
            ("/kind", "Review".into()),
            ("/request", serde_json::Value::Null),
        ];
        for (path, value) in edits {
            let mut doc = v.clone();
            *doc.pointer_mut(path).unwrap() = value.clone();
            let body = serde_json::to_vec(&doc).unwrap();
            for shape in [Stage::Mutate, Stage::Validate] {
                assert!(request(&body, shape).is_none(), "{path} = {value}");
            }
        }
        // A duplicate key: kube's parse keeps the last one, the fast path refuses it.
        let dup = text.replacen("\"uid\":", "\"uid\":\"x\",\"uid\":", 1);
        assert_ne!(dup, text);
        assert!(request(dup.as_bytes(), Stage::Mutate).is_none());
    }
}

//! tollgate's engine: everything a review decides, with no I/O.
//!
//! No sockets, files, clocks or async runtime: the crate's dependencies do not include
//! any, so the compiler keeps it so. The shell (the `tollgate` crate) reads the bytes, the
//! files and the cluster, and hands them here.
//!
//! This file is the front door: it names every item the shell, the tests, the benches and
//! the fuzz targets use, re-exported at the crate's root, grouped by what they are for. The
//! modules are private, so everything else is the engine's own, free to move: their map,
//! in layers, is docs/architecture.md (tests/layers.rs holds it to the code). Where an
//! item's own name needs its module to read (`audit::judge`, `quantity::parse`), it comes
//! out under one that says it (`audit_object`, `parse_quantity`).
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod apivalidation;
mod audit;
mod capacity;
mod check;
mod cluster;
mod diff;
mod export;
mod feasible;
mod glob;
mod gpu;
mod judge;
mod mutate;
mod names;
mod objects;
mod optout;
mod parse;
mod pipeline;
mod pod;
mod podsecurity;
mod policy;
mod profile;
mod quantity;
mod requester;
mod review;
mod stage;
mod startup;
mod template_path;
mod trainjob;
mod validate;
mod words;
mod workload;

#[cfg(test)]
mod testdata;

// The review: an AdmissionReview's bytes and a policy in, the AdmissionReview to answer
// out, by the webhooks of a stage.
pub use review::{review_bytes, review_bytes_with, Outcome, ReviewError, Reviewed};
pub use stage::Stage;
pub use validate::Verdict;
pub use workload::TemplateVerdict;
// What the apiserver's own validation refuses in a workload's pod template, in its words.
pub use apivalidation::{refusal as apiserver_refusal, FieldError};

// `tollgate review`: an object's CREATE review as the apiserver would send it, through the
// webhooks of a stage in a cluster's order.
pub use pipeline::{
    group_version, place_in_namespace, run as run_pipeline, synthetic_review, Judged,
};

// The policy, as a file and as its layers.
pub use policy::{
    FeasibilityMode, Mode, NodeAutoscaling, Operation, OptOutRules, Policy, PolicyError,
    ProfileMatch, SidecarMode, Step, Written, BASE_PROFILE, BUILTIN_SOURCE, BUILTIN_TEXT,
};

// The policy as Kubernetes objects: the TollgatePolicy and TollgateProfiles composed with
// the file, where each value came from, their CRDs.
pub use objects::crd::{crds, to_yaml as crd_yaml};
pub use objects::explain::{explain as explain_policy, Explained, Leaf, Source as ValueSource};
pub use objects::{
    compose as compose_policy, file_layer, Candidate, Composed, InForce, ObjectStatus, Stored,
    GROUP as POLICY_GROUP, NAME as POLICY_NAME, POLICY_KIND, POLICY_PLURAL, PROFILE_KIND,
    PROFILE_PLURAL, VERSION as POLICY_VERSION,
};

// What a review may know of the cluster, and the nodes by shape.
pub use capacity::{Host, Index as NodeIndex, Nodes, Shape, ShapeKey};
pub use cluster::{
    claim_from, claim_template_from, namespace_and_name, Autoscaling, Cluster, ContextKind,
    Layered, Lookup, ObjectKey, Objects, Offline, CLUSTER_AUTOSCALER_STATUS, DRA_API_VERSIONS,
    KARPENTER_NODEPOOL_API_VERSION, KUEUE_API_VERSIONS,
};
pub use trainjob::GROUP as TRAINER_GROUP;

// Pod Security admission as the apiserver decides it: a namespace's labels, the checks.
pub use podsecurity::{
    pod_security_detail, pod_security_refusal, pod_security_violations,
    LevelVersion as PodSecurityLevelVersion, PodSecurity, PodSecurityLevel, PodSecurityVersion,
    Violation as PodSecurityViolation,
};

// The audit: an object already in the cluster judged as its CREATE would be.
pub use audit::{
    controlled, judge as audit_object, start_findings, Audited, Finding, FindingStatus,
    OptOutState, Rule,
};

// Why a stored pod does not start on its node, in the kubelet's words, and what of it is
// tollgate's (`tollgate why`, the audit's `start` rule).
pub use startup::{failures as start_failures, waits_on_its_node, PodEvent, StartFailure};

// The export: the validation half as a ValidatingAdmissionPolicy.
pub use export::{
    glob_to_re2, lit as cel_literal, mutating_admission_policy, validating_admission_policy,
    Export, NoteKind, Object as ExportedObject, Options as ExportOptions, FALLBACK_MESSAGE,
    MAX_CONTAINERS as EXPORT_MAX_CONTAINERS, MUTATE_EXPORT_NAME, NAME as EXPORT_NAME,
};

// One pod's judgement, step by step, for the property tests and the fuzz targets.
pub use check::problems as pod_problems;
pub use gpu::Gpus;
pub use mutate::{is_training_pod, mutate, Report};
pub use optout::{decide as decide_opt_out, OptOut};
pub use pod::default_requests_from_limits;
pub use profile::{select as select_profile, PodLabels};
pub use requester::Requester;
pub use validate::{missing_requests, validate as validate_pod};

// The leaves the shell shares: globs, quantities, the message words, a kind's name.
pub use glob::{any as matches_any, Glob};
pub use names::kind_noun;
pub use quantity::{
    format as format_quantity, format_for as format_quantity_for, is_non_overcommittable,
    parse as parse_quantity,
};
pub use words::one_line;

//! The integration tests, one binary: each file of `tests/` is a module of it (a file per
//! concern, as before). One binary links once, and its tests share one pool of threads, so
//! that one waiting on a certificate rotation or a watch does not hold up the others (27
//! binaries, each linking the whole stack and run one after another, were most of
//! `.ci/run`'s time). `cargo test --test integration golden::` runs one file's tests.

mod common;
#[path = "support/k8s_schema.rs"]
mod k8s_schema;

mod accepted;
mod audit;
mod audit_server;
mod builtin_policy;
mod cli;
mod cluster_context;
mod deploy;
mod docs;
mod e2e;
mod envtest;
mod export_apiserver;
mod export_equivalence;
mod export_kubectl;
mod export_mutating;
mod feasibility_context;
mod golden;
mod gpu_context;
mod helm;
mod http;
mod layers;
mod limits;
mod logs;
mod metrics;
mod monitoring;
mod mutation_props;
mod node;
mod pod_security;
mod policy_crds;
mod policy_objects;
mod readme;
mod regressions;
mod reload;
mod scale;
mod scheduler_agrees;
mod self_managed_certs;
mod shutdown;
mod soak;
mod template_agrees;
mod tls;
mod trainjob_context;
mod why;

//! tollgate's engine: everything a review decides, with no I/O.
//!
//! No sockets, files, clocks or async runtime: the crate's dependencies do not include
//! any, so the compiler keeps it so. The shell (the `tollgate` crate) reads the bytes, the
//! files and the cluster, and hands them here.
//!
//! Modules import only from the layers below them (docs/architecture.md; tests/layers.rs
//! checks it):
//!
//! 0. `testdata`: the unit tests' fixtures.
//! 1. `glob`, `quantity`, `requester`, `diff`, `cluster`, `words`, `template_path`: leaves.
//! 2. `policy`: the policy's types and loading from text.
//! 3. `pod`: read helpers over a typed Pod.
//! 4. `gpu`, `optout`, `check`, `parse`, `profile`.
//! 5. `mutate` (one module per step), `validate`.
//! 6. `workload`: a workload's pod templates judged as the pods they will make. `export`:
//!    the validation half of a policy as a ValidatingAdmissionPolicy (YAML text).
//! 7. `review`: an AdmissionReview in, an AdmissionReview out.
//! 8. `pipeline`: the two webhooks in a cluster's order (mutate, defaulting, validate).
//! 9. `audit`: what an object already in the cluster breaks or lacks, as findings.
#![forbid(unsafe_code)]

pub mod audit;
pub mod capacity;
pub mod check;
pub mod cluster;
pub mod diff;
pub mod export;
pub mod feasible;
pub mod glob;
pub mod gpu;
pub mod judge;
pub mod mutate;
pub mod names;
pub mod objects;
pub mod optout;
pub mod parse;
pub mod pipeline;
pub mod pod;
pub mod policy;
pub mod profile;
pub mod quantity;
pub mod requester;
pub mod review;
pub mod template_path;
pub mod trainjob;
pub mod validate;
pub mod words;
pub mod workload;

#[cfg(test)]
pub(crate) mod testdata;

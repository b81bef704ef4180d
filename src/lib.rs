//! tollgate: a Kubernetes admission webhook for machine-learning training pods.
//!
//! The pure core (`policy`, `quantity`, `pod`, `mutate`, `validate`, `optout`, `review`)
//! does no I/O; the shell (`server`, `tls`, `cli`, `telemetry`) wires it to the world.
#![forbid(unsafe_code)]

pub mod glob;
pub mod mutate;
pub mod optout;
pub mod pod;
pub mod policy;
pub mod quantity;
pub mod register;
pub mod review;
pub mod validate;

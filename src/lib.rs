//! tollgate: a Kubernetes admission webhook for machine-learning training pods.
//!
//! The pure core (`policy`, `quantity`, `pod`, `mutate`, `validate`, `optout`, `review`)
//! does no I/O; the shell (`server`, `tls`, `cli`, `telemetry`) wires it to the world.
#![forbid(unsafe_code)]

pub mod certs;
pub mod check;
pub mod cli;
pub mod diff;
pub mod glob;
pub mod metrics;
pub mod mutate;
pub mod optout;
pub mod parse;
pub mod pod;
pub mod policy;
pub mod quantity;
pub mod register;
pub mod review;
pub mod server;
pub mod telemetry;
pub mod tls;
pub mod validate;

pub use server::router;

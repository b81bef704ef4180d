//! tollgate's shell: the server, TLS, the command line, the audit of a live cluster,
//! metrics, logs, certificates and registration. Every decision is the engine's,
//! [`tollgate_core`], which does no I/O; this crate reads the sockets, files and cluster
//! and hands it the bytes.
//! docs/architecture.md is the map.
#![forbid(unsafe_code)]

pub mod audit;
pub mod certs;
pub mod cli;
pub mod cluster;
pub mod kubeconfig;
pub mod lease;
pub mod metrics;
pub mod register;
pub mod selfmanaged;
pub mod server;
pub mod telemetry;
pub mod tls;

pub use server::router;

//! Certificates tollgate manages itself (`serve --certs self-managed`), as Gatekeeper's
//! cert-controller and Kyverno's renewer do: no cert-manager, no `tollgate certs` on a
//! laptop, nothing that expires unnoticed.
//!
//! - Every replica watches one Secret (by name, in its own namespace) and serves the
//!   certificate in it, swapped in without a restart ([`replica`]); `/readyz` waits for it.
//! - The replica holding the Lease (`tollgate-certs`, [`crate::lease`]) makes a CA and a
//!   serving certificate for the Service's names into that Secret if there is none, renews
//!   the certificate well before it expires and the CA before it does, and keeps both
//!   webhook configurations' caBundle equal to the Secret's CA bundle ([`leader`]), with
//!   the old and the new CA side by side while a CA rotation is under way ([`plan`]).
//!
//! It reads and writes the Secret, the Lease and the two webhook configurations only, each
//! by name: `deploy/components/self-managed-certs` and the Helm chart grant exactly that.

mod leader;
pub mod plan;
mod replica;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::info;

use crate::certs;
use crate::lease::{self, Elector, LeaseOptions, Purpose};
use crate::metrics::CertMetrics;
use crate::tls::CertStore;
pub use plan::Timing;

/// Where the certificates live and how they are kept (`serve --certs self-managed` and its
/// options).
#[derive(Debug, Clone)]
pub struct Options {
    /// The Secret (`--certs-secret`).
    pub secret: String,
    /// The namespace of the Secret, the Lease and the Service; None: the client's default
    /// (in a pod, the pod's own).
    pub namespace: Option<String>,
    /// The Service the apiserver calls: the serving certificate is for its DNS names.
    pub service: String,
    /// The name of both webhook configurations (`--webhook-configuration`).
    pub webhook_configuration: String,
    pub lease_name: String,
    pub lease_duration: Duration,
    pub renew_every: Duration,
    pub timing: Timing,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            secret: "tollgate-tls".into(),
            namespace: None,
            service: "tollgate".into(),
            webhook_configuration: "tollgate".into(),
            lease_name: "tollgate-certs".into(),
            lease_duration: Duration::from_secs(30),
            renew_every: Duration::from_secs(10),
            timing: Timing::new(
                Duration::from_secs(365 * 24 * 3600),
                Duration::from_secs(10 * 365 * 24 * 3600),
                Duration::from_secs(3600),
            ),
            kubeconfig: None,
            context: None,
        }
    }
}

/// The running certificate manager: stop it with the server's stop signal and await this
/// (the Lease's holder releases it).
pub struct Running {
    pub task: JoinHandle<()>,
}

/// Starts the Secret's watch, the Lease and the leader's loop in `default_namespace`
/// (unless the options name another). `store` gets the Secret's certificate.
pub fn start(
    client: kube::Client,
    default_namespace: &str,
    opts: Options,
    store: Arc<CertStore>,
    metrics: CertMetrics,
    stop: watch::Receiver<bool>,
) -> Running {
    let namespace = opts
        .namespace
        .clone()
        .unwrap_or_else(|| default_namespace.to_owned());
    let names = certs::service_names(&opts.service, &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let changed = Arc::new(Notify::new());
    let replica = tokio::spawn(replica::run(
        secrets.clone(),
        opts.secret.clone(),
        store,
        metrics.clone(),
        opts.timing.clone(),
        changed.clone(),
    ));
    let lease = LeaseOptions {
        name: opts.lease_name.clone(),
        namespace: namespace.clone(),
        identity: lease::identity(),
        duration: opts.lease_duration,
        renew_every: opts.renew_every,
        purpose: Purpose::Certificates,
    };
    info!(secret = %opts.secret, namespace = %namespace, service = %opts.service,
        webhook_configuration = %opts.webhook_configuration, lease = %lease.name,
        identity = %lease.identity, "self-managed certificates: watching the Secret");
    let (leader_tx, leader_rx) = watch::channel(false);
    let elector = tokio::spawn(Elector::new(client.clone(), lease, leader_tx).run(stop.clone()));
    let gauge = {
        let mut leader = leader_rx.clone();
        let m = metrics.clone();
        tokio::spawn(async move {
            while leader.changed().await.is_ok() {
                m.leader.set(i64::from(*leader.borrow()));
            }
        })
    };
    let leader = tokio::spawn(
        leader::Leader {
            secrets,
            mutating: Api::all(client.clone()),
            validating: Api::all(client),
            secret: opts.secret,
            webhooks: opts.webhook_configuration,
            names,
            timing: opts.timing,
            metrics,
            changed,
            pending: std::sync::Mutex::new(None),
        }
        .run(leader_rx, stop.clone()),
    );
    let mut stop = stop;
    let task = tokio::spawn(async move {
        let _ = stop.wait_for(|s| *s).await;
        let _ = leader.await;
        let _ = elector.await;
        replica.abort();
        gauge.abort();
    });
    Running { task }
}

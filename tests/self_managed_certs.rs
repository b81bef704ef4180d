//! `serve --certs self-managed` against the real kube-apiserver (tests/common/envtest.rs),
//! over real TLS, each server running as a ServiceAccount bound by the RBAC that
//! deploy/overlays/self-managed renders (moved into a namespace of the test's own, the
//! webhook configurations' name one of its own in the rules that name them: the
//! apiserver is shared by every test): ready from an empty namespace with nothing else
//! done, the Secret created and both webhook configurations' caBundle set and repaired, a
//! second replica that only reads, a CA rotation with both CAs trusted during the overlap,
//! and a rotation under load in which no review fails, the reviews sent as the apiserver
//! sends them (trusting exactly the caBundle the webhook configuration holds at that
//! moment). The account may do exactly what the code needs, no more
//! (SelfSubjectRulesReview).
//!
//! On the stand-in still: Secret creates that fail and one that is slow, on cue (the
//! replica seen waiting, the CA kept across the retries).

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::{ApiServer, Fault, Verb};
use common::envtest::ControlPlane;
use common::identity;
use common::net::{self, TestServer};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use tollgate::selfmanaged::{Options, Timing};
use tollgate_apiserver_standin as apiserver;

const KINDS: [&str; 2] = [
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
];

/// One test's part of the real apiserver: a namespace (the Secret's, the Lease's and the
/// ServiceAccount's), the webhook configurations of deploy/base under a name of the test's
/// own (no caBundle, as `kubectl apply -k` leaves them; their webhooks never called: they
/// select only namespaces with a label none has, and fail open), and the account's
/// kubeconfig.
struct Cluster {
    cp: &'static ControlPlane,
    admin: kube::Client,
    ns: String,
    /// Both webhook configurations' name.
    name: String,
    /// The Service's DNS name, as the apiserver calls it.
    service: String,
    kubeconfig: std::path::PathBuf,
}

impl Cluster {
    async fn new() -> Option<Cluster> {
        let cp = common::envtest::plane()?;
        let docs = common::rbac::render_if_kubectl("deploy/overlays/self-managed")?;
        let admin = cp.client("admin").await;
        let ns = cp.namespace("selfcerts", &[]).await;
        let name = format!("tollgate-{ns}");
        // The shipped RBAC in this namespace; its cluster-wide objects named for it, and
        // the webhook configurations it names named as here.
        let mut rbac = identity::own_names(&identity::moved(&identity::rbac_of(&docs), &ns), &ns);
        for d in &mut rbac {
            for rule in d
                .get_mut("rules")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                let webhooks = rule["resources"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|x| KINDS.contains(&x.as_str().unwrap_or(""))));
                if webhooks {
                    assert_eq!(rule["resourceNames"], json!(["tollgate"]), "{rule}");
                    rule["resourceNames"] = json!([name]);
                }
            }
        }
        identity::apply(cp, &rbac)?;
        let base = tollgate::register::base_configurations().unwrap();
        for mut config in [
            serde_json::to_value(&base.mutating).unwrap(),
            serde_json::to_value(&base.validating).unwrap(),
        ] {
            config["metadata"] = json!({"name": name});
            for w in config["webhooks"].as_array_mut().unwrap() {
                w["namespaceSelector"] =
                    json!({"matchLabels": {"selfcerts.tollgate.test/never": ns}});
                w["failurePolicy"] = json!("Ignore");
                w["clientConfig"]["service"]["namespace"] = json!(ns);
            }
            identity::create(&admin, config).await;
        }
        let kubeconfig = identity::service_account(cp, &ns, "tollgate").await;
        Some(Cluster {
            cp,
            service: format!("tollgate.{ns}.svc"),
            admin,
            ns,
            name,
            kubeconfig,
        })
    }

    /// A replica: the account's kubeconfig, the Secret and Lease in the test's namespace,
    /// the timing given.
    async fn replica(&self, timing: Option<Timing>) -> TestServer {
        let (ns, name, path) = (self.ns.clone(), self.name.clone(), self.kubeconfig.clone());
        net::start(|o| {
            let mut m = Options {
                namespace: Some(ns),
                kubeconfig: Some(path),
                webhook_configuration: name,
                lease_duration: Duration::from_secs(2),
                renew_every: Duration::from_millis(200),
                ..Options::default()
            };
            if let Some(t) = timing {
                m.timing = t;
            }
            o.self_managed = Some(m);
        })
        .await
    }

    fn secrets(&self) -> kube::Api<Secret> {
        kube::Api::namespaced(self.admin.clone(), &self.ns)
    }

    async fn secret(&self) -> Option<Secret> {
        self.secrets().get_opt("tollgate-tls").await.unwrap()
    }

    fn mutating(&self) -> kube::Api<MutatingWebhookConfiguration> {
        kube::Api::all(self.admin.clone())
    }

    fn validating(&self) -> kube::Api<ValidatingWebhookConfiguration> {
        kube::Api::all(self.admin.clone())
    }

    /// Both configurations as JSON (None: absent).
    async fn configs(&self) -> [Option<Value>; 2] {
        let m = self.mutating().get_opt(&self.name).await.unwrap();
        let v = self.validating().get_opt(&self.name).await.unwrap();
        [
            m.map(|c| serde_json::to_value(c).unwrap()),
            v.map(|c| serde_json::to_value(c).unwrap()),
        ]
    }

    /// The caBundle of each webhook configuration (None: unset or absent).
    async fn bundles(&self) -> Vec<Option<Vec<u8>>> {
        self.configs()
            .await
            .iter()
            .map(|c| {
                c.as_ref().and_then(|c| {
                    let b = &c["webhooks"][0]["clientConfig"]["caBundle"];
                    (!b.is_null()).then(|| b64(b))
                })
            })
            .collect()
    }

    /// Replaces configuration `i` (0: mutating) with what `f` makes of it.
    async fn modify(&self, i: usize, f: impl FnOnce(&mut Value)) {
        let mut c = self.configs().await[i].clone().unwrap();
        f(&mut c);
        let pp = Default::default();
        if i == 0 {
            let c: MutatingWebhookConfiguration = serde_json::from_value(c).unwrap();
            self.mutating().replace(&self.name, &pp, &c).await.unwrap();
        } else {
            let c: ValidatingWebhookConfiguration = serde_json::from_value(c).unwrap();
            self.validating()
                .replace(&self.name, &pp, &c)
                .await
                .unwrap();
        }
    }
}

fn data(s: &Secret, key: &str) -> Vec<u8> {
    s.data.as_ref().unwrap()[key].0.clone()
}

async fn until(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn b64(v: &Value) -> Vec<u8> {
    serde_json::from_value::<k8s_openapi::ByteString>(v.clone())
        .unwrap()
        .0
}

fn pem_certs(pem: &[u8]) -> Vec<Vec<u8>> {
    CertificateDer::pem_slice_iter(pem)
        .map(|c| c.unwrap().as_ref().to_vec())
        .collect()
}

/// A TLS client that trusts exactly `bundle` and checks the Service's name, as the
/// apiserver calling the webhook does.
fn apiserver_tls(bundle: &[u8]) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(bundle) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(tollgate::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    cfg
}

/// One review sent as the apiserver sends it: a new connection to `addr`, trusting the
/// mutating configuration's caBundle as it is now. The certificate served, or why not.
async fn review(c: &Cluster, addr: std::net::SocketAddr) -> Result<Vec<u8>, String> {
    let bundle = c.bundles().await[0].clone().ok_or("no caBundle")?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(apiserver_tls(&bundle)))
        .connect(ServerName::try_from(c.service.clone()).unwrap(), tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let served = tls.get_ref().1.peer_certificates().unwrap()[0]
        .as_ref()
        .to_vec();
    let io = hyper_util::rt::TokioIo::new(tls);
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = hyper::Request::post(format!("https://{}/mutate", c.service))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            common::fixture("resnet50-master-0.mutate.json"),
        )))
        .unwrap();
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    use http_body_util::BodyExt as _;
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let v: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    if status != 200 || v["response"]["allowed"] != true {
        return Err(format!("{status}: {v}"));
    }
    Ok(served)
}

/// `/readyz` over TLS without checking the certificate, as the kubelet's probe does.
async fn readyz(addr: std::net::SocketAddr) -> (u16, String) {
    #[derive(Debug)]
    struct Blind;
    impl rustls::client::danger::ServerCertVerifier for Blind {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            tollgate::tls::provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(tollgate::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Blind))
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut c = net::Client::connect_with(addr, cfg).await.unwrap();
    let (status, body) = c.request("GET", "/readyz", vec![]).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

async fn metric(s: &TestServer, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let text = net::get_metrics(s.running.metrics_addr.unwrap()).await;
    common::scrape::value(&common::scrape::parse(&text), name, labels)
}

/// The stand-in with the webhook configurations of deploy/base (no caBundle).
async fn stand_in() -> ApiServer {
    let api = ApiServer::builder()
        .resources(apiserver::ResourceType::defaults())
        .no_auth()
        .start()
        .await;
    let base = tollgate::register::base_configurations().unwrap();
    api.insert(KINDS[0], serde_json::to_value(&base.mutating).unwrap());
    api.insert(KINDS[1], serde_json::to_value(&base.validating).unwrap());
    api
}

/// Secret creates that fail, on cue: the first two fail (the CA already in the caBundle
/// stays the one retried, not one more each time), the third waits a second, so that the
/// replica is seen waiting; then it is ready with one CA in both caBundles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_secret_creates_are_retried_with_the_same_ca() {
    let api = stand_in().await;
    api.inject(Fault::status(500).on("secrets", Verb::Create).times(2));
    api.inject(
        Fault::delay(Duration::from_secs(1))
            .on("secrets", Verb::Create)
            .times(1),
    );
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    api.write_kubeconfig(kubeconfig.path()).unwrap();
    let path = kubeconfig.into_temp_path().keep().unwrap();
    let s = net::start(|o| {
        o.self_managed = Some(Options {
            namespace: Some("tollgate-system".into()),
            kubeconfig: Some(path),
            lease_duration: Duration::from_secs(2),
            renew_every: Duration::from_millis(200),
            ..Options::default()
        });
    })
    .await;
    let (status, body) = readyz(s.addr()).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("waiting for the serving certificate"),
        "{body}"
    );
    let limit = Duration::from_secs(20);
    until("ready", limit, async || readyz(s.addr()).await.0 == 200).await;
    let sec = api
        .get("secrets", Some("tollgate-system"), "tollgate-tls")
        .expect("the Secret was created");
    let ca = b64(&sec["data"]["ca.crt"]);
    assert_eq!(
        pem_certs(&ca).len(),
        1,
        "one CA, whatever the failed creates"
    );
    let bundle = |api: &ApiServer, kind: &str| {
        api.get(kind, None, "tollgate")
            .map(|c| c["webhooks"][0]["clientConfig"]["caBundle"].clone())
            .filter(|b| !b.is_null())
            .map(|b| b64(&b))
    };
    until("both caBundles set", limit, async || {
        KINDS.iter().all(|k| bundle(&api, k).as_ref() == Some(&ca))
    })
    .await;
    assert!(api.count(Verb::Create, "secrets") >= 3);
    s.running.shutdown().await;
}

/// What the account may do, beyond what every account may: the base's cluster context
/// reads, cluster-wide; the component's Secret and Lease by name in its namespace
/// (`create` unnamed: the object does not exist yet) and the two webhook configurations
/// by name.
fn certs_needs(c: &Cluster) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for v in ["get", "list", "watch"] {
        for r in [
            "resource.k8s.io/resourceclaims",
            "resource.k8s.io/resourceclaimtemplates",
            "resource.k8s.io/deviceclasses",
            "/namespaces",
            "/nodes",
            "/resourcequotas",
            "trainer.kubeflow.org/trainingruntimes",
            "trainer.kubeflow.org/clustertrainingruntimes",
            "kueue.x-k8s.io/localqueues",
            "kueue.x-k8s.io/clusterqueues",
            "karpenter.sh/nodepools",
        ] {
            out.insert(format!("{v} {r}"));
        }
    }
    for v in ["get", "list", "watch", "update"] {
        out.insert(format!("{v} /secrets/tollgate-tls"));
        for k in KINDS {
            out.insert(format!("{v} admissionregistration.k8s.io/{k}/{}", c.name));
        }
    }
    for r in [
        "create /secrets",
        "create coordination.k8s.io/leases",
        "get coordination.k8s.io/leases/tollgate-certs",
        "update coordination.k8s.io/leases/tollgate-certs",
    ] {
        out.insert(r.to_owned());
    }
    // The policy as Kubernetes objects, the base's.
    out.extend(crate::deploy::policy_objects_needs(true));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_from_an_empty_namespace_with_no_other_step() {
    let Some(c) = Cluster::new().await else {
        return;
    };
    let s = c.replica(None).await;
    let limit = Duration::from_secs(20);
    until("ready", limit, async || readyz(s.addr()).await.0 == 200).await;

    let sec = c.secret().await.expect("the Secret was created");
    assert_eq!(sec.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(
        sec.metadata.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
        "tollgate"
    );
    for key in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
        assert!(!data(&sec, key).is_empty(), "{key}");
    }
    let ca = data(&sec, "ca.crt");
    assert_eq!(pem_certs(&ca).len(), 1, "one CA");
    until("both caBundles set", limit, async || {
        c.bundles().await == vec![Some(ca.clone()), Some(ca.clone())]
    })
    .await;
    // The certificate served is the Secret's, for the Service's name, trusted through the
    // caBundle.
    let served = review(&c, s.addr()).await.unwrap();
    assert_eq!(served, pem_certs(&data(&sec, "tls.crt"))[0]);
    assert_eq!(
        metric(&s, "tollgate_certificate_leader", &[]).await,
        Some(1.0)
    );
    assert_eq!(
        metric(
            &s,
            "tollgate_certificate_rotations_total",
            &[("kind", "ca")]
        )
        .await,
        Some(1.0)
    );
    let expiry = metric(&s, "tollgate_certificate_expiry_timestamp_seconds", &[])
        .await
        .unwrap();
    let year = 365.0 * 86400.0;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((expiry - now - year).abs() < 120.0, "a year: {expiry}");
    let renewal = metric(&s, "tollgate_certificate_renewal_timestamp_seconds", &[])
        .await
        .unwrap();
    assert!((expiry - renewal - year / 3.0).abs() < 120.0, "{renewal}");

    // Repaired: a caBundle changed by hand, one removed, a configuration recreated.
    c.modify(0, |w| {
        w["webhooks"][0]["clientConfig"]["caBundle"] = json!("Z2FyYmFnZQ==");
    })
    .await;
    c.modify(1, |w| {
        w["webhooks"][0]["clientConfig"]
            .as_object_mut()
            .unwrap()
            .remove("caBundle");
    })
    .await;
    until("both repaired", limit, async || {
        c.bundles().await == vec![Some(ca.clone()), Some(ca.clone())]
    })
    .await;
    let recreated = c.configs().await[0].clone().unwrap();
    c.mutating()
        .delete(&c.name, &Default::default())
        .await
        .unwrap();
    let mut fresh = recreated;
    fresh["webhooks"][0]["clientConfig"]
        .as_object_mut()
        .unwrap()
        .remove("caBundle");
    fresh["metadata"] = json!({"name": c.name});
    identity::create(&c.admin, fresh).await;
    until("the recreated one set", limit, async || {
        c.bundles().await[0].as_ref() == Some(&ca)
    })
    .await;
    assert!(
        metric(
            &s,
            "tollgate_certificate_ca_bundle_writes_total",
            &[("configuration", "mutating")]
        )
        .await
        .unwrap()
            >= 3.0
    );
    // A Secret deleted is made again; the old CA stays trusted for the overlap.
    c.secrets()
        .delete("tollgate-tls", &Default::default())
        .await
        .unwrap();
    until("the Secret made again", limit, async || {
        c.secret().await.is_some()
    })
    .await;
    let again = data(&c.secret().await.unwrap(), "ca.crt");
    let cas = pem_certs(&again);
    assert_eq!(cas.len(), 2, "the old CA and the new one");
    assert_eq!(cas[0], pem_certs(&ca)[0]);
    s.running.shutdown().await;

    // Sufficient, all of the above; and no wider.
    let nobody = identity::service_account(c.cp, &c.ns, "bound-to-nothing").await;
    assert_eq!(
        identity::granted(c.cp, &c.kubeconfig, &nobody, &c.ns).await,
        certs_needs(&c)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_only_reads_and_serves_the_same_certificate() {
    let Some(c) = Cluster::new().await else {
        return;
    };
    let a = c.replica(None).await;
    let limit = Duration::from_secs(20);
    until("a ready", limit, async || readyz(a.addr()).await.0 == 200).await;
    let b = c.replica(None).await;
    until("b ready", limit, async || readyz(b.addr()).await.0 == 200).await;
    until("both caBundles", limit, async || {
        c.bundles().await.iter().all(Option::is_some)
    })
    .await;
    let from_a = review(&c, a.addr()).await.unwrap();
    let from_b = review(&c, b.addr()).await.unwrap();
    assert_eq!(from_a, from_b);
    assert_eq!(
        metric(&b, "tollgate_certificate_leader", &[]).await,
        Some(0.0)
    );
    // Let b run a while as a follower: it reads the Secret and tries the Lease, no more
    // (nothing it could write changes: the Secret and both configurations keep their
    // resourceVersions, and its counters of writes stay at nothing).
    let versions = async || {
        let s = c.secret().await.unwrap().metadata.resource_version;
        let [m, v] = c.configs().await;
        (
            s,
            m.unwrap()["metadata"]["resourceVersion"].clone(),
            v.unwrap()["metadata"]["resourceVersion"].clone(),
        )
    };
    let before = versions().await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(versions().await, before);
    for (name, labels) in [
        (
            "tollgate_certificate_ca_bundle_writes_total",
            &[("configuration", "mutating")][..],
        ),
        (
            "tollgate_certificate_ca_bundle_writes_total",
            &[("configuration", "validating")][..],
        ),
        (
            "tollgate_certificate_rotations_total",
            &[("kind", "ca")][..],
        ),
        (
            "tollgate_certificate_rotations_total",
            &[("kind", "serving")][..],
        ),
    ] {
        assert_eq!(
            metric(&b, name, labels).await.unwrap_or(0.0),
            0.0,
            "{name} {labels:?}"
        );
    }

    // a stops (and releases the Lease): b takes over and keeps the bundle repaired.
    a.running.shutdown().await;
    until("b leads", limit, async || {
        metric(&b, "tollgate_certificate_leader", &[]).await == Some(1.0)
    })
    .await;
    c.modify(1, |w| {
        w["webhooks"][0]["clientConfig"]["caBundle"] = json!("Z2FyYmFnZQ==");
    })
    .await;
    until("repaired by b", limit, async || {
        let b = c.bundles().await;
        b[0] == b[1]
    })
    .await;
    b.running.shutdown().await;
}

/// Seconds-long certificates: a serving certificate of 9 s (renewed 3 s before its end), a
/// CA of 24 s (renewed 8 s before its end, so at 16 s), 2 s of overlap.
fn fast() -> Timing {
    Timing::new(
        Duration::from_secs(9),
        Duration::from_secs(24),
        Duration::from_secs(2),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_under_load_fails_no_review_and_trusts_both_cas_during_the_overlap() {
    let Some(c) = Cluster::new().await else {
        return;
    };
    let a = c.replica(Some(fast())).await;
    let limit = Duration::from_secs(20);
    until("a ready", limit, async || readyz(a.addr()).await.0 == 200).await;
    let b = c.replica(Some(fast())).await;
    until("b ready", limit, async || readyz(b.addr()).await.0 == 200).await;
    until("caBundles", limit, async || {
        c.bundles().await.iter().all(Option::is_some)
    })
    .await;
    let first_ca = pem_certs(&c.bundles().await[0].clone().unwrap());
    assert_eq!(first_ca.len(), 1);

    // Reviews to both replicas, four at a time, each over a new connection trusting the
    // caBundle as it is at that moment, until the CA has been replaced and the old one
    // dropped.
    let c = Arc::new(c);
    let addrs = [a.addr(), b.addr()];
    let sent = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let served = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = vec![];
    for i in 0..4 {
        let (c, sent, failures, served, done) = (
            c.clone(),
            sent.clone(),
            failures.clone(),
            served.clone(),
            done.clone(),
        );
        load.push(tokio::spawn(async move {
            let mut n = i;
            while !done.load(Ordering::Relaxed) {
                let addr = addrs[n % 2];
                n += 1;
                match review(&c, addr).await {
                    Ok(cert) => {
                        served.lock().unwrap().insert(cert);
                    }
                    Err(e) => failures.lock().unwrap().push(e),
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Watch the bundle go [old] -> [old, new] -> [new], while the load runs.
    let mut seen_both = false;
    let started = Instant::now();
    loop {
        let b = c.bundles().await[0].clone().unwrap();
        let cas = pem_certs(&b);
        if cas.len() == 2 {
            assert_eq!(cas[0], first_ca[0], "the old CA first, the new one after");
            seen_both = true;
        }
        if seen_both && cas.len() == 1 {
            assert_ne!(cas[0], first_ca[0]);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no CA rotation within a minute"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A little longer on the new CA alone.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    done.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let failures = failures.lock().unwrap().clone();
    let sent = sent.load(Ordering::Relaxed);
    assert!(sent > 40, "only {sent} reviews sent");
    assert!(
        failures.is_empty(),
        "{} of {sent} reviews failed: {failures:#?}",
        failures.len()
    );
    let served = served.lock().unwrap().len();
    assert!(served >= 3, "the replicas served {served} certificates");
    let mut rotations = [0.0, 0.0];
    for s in [&a, &b] {
        for (i, kind) in ["ca", "serving"].into_iter().enumerate() {
            rotations[i] += metric(s, "tollgate_certificate_rotations_total", &[("kind", kind)])
                .await
                .unwrap_or(0.0);
        }
    }
    assert!(rotations[0] >= 2.0, "CAs issued: {}", rotations[0]);
    assert!(
        rotations[1] >= 3.0,
        "serving certificates issued: {}",
        rotations[1]
    );
    a.running.shutdown().await;
    b.running.shutdown().await;
}

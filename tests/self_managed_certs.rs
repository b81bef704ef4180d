//! `serve --certs self-managed` against the apiserver stand-in, over real TLS: ready from
//! an empty namespace with nothing else done, the Secret created and both webhook
//! configurations' caBundle set and repaired, a second replica that only reads, a CA
//! rotation with both CAs trusted during the overlap, and a rotation under load in which
//! no review fails, the reviews sent as the apiserver sends them (trusting exactly the
//! caBundle the webhook configuration holds at that moment). Every request the servers
//! made is held to the RBAC that deploy/overlays/self-managed renders.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::{ApiServer, Fault, RequestRecord, Verb};
use common::net::{self, TestServer};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use tollgate::selfmanaged::{Options, Timing};
use tollgate_apiserver_standin as apiserver;

const NAMESPACE: &str = "tollgate-system";
const SERVICE_NAME: &str = "tollgate.tollgate-system.svc";
const KINDS: [&str; 2] = [
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
];

/// The stand-in with the webhook configurations of deploy/base (no caBundle), as `kubectl
/// apply -k` or `helm install` leaves them.
async fn cluster() -> ApiServer {
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

/// A replica: its own bearer token (told apart in the request log), the Secret and Lease in
/// tollgate-system, the timing given.
async fn replica(api: &ApiServer, token: &str, timing: Option<Timing>) -> TestServer {
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    api.write_kubeconfig_for(kubeconfig.path(), token).unwrap();
    let path = kubeconfig.into_temp_path().keep().unwrap();
    net::start(|o| {
        let mut m = Options {
            namespace: Some(NAMESPACE.into()),
            kubeconfig: Some(path),
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

fn secret(api: &ApiServer) -> Option<Value> {
    api.get("secrets", Some(NAMESPACE), "tollgate-tls")
}

/// The caBundle of each webhook configuration (None: unset or absent).
fn bundles(api: &ApiServer) -> Vec<Option<Vec<u8>>> {
    KINDS
        .iter()
        .map(|k| {
            api.get(k, None, "tollgate").and_then(|c| {
                let b = &c["webhooks"][0]["clientConfig"]["caBundle"];
                (!b.is_null()).then(|| b64(b))
            })
        })
        .collect()
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
async fn review(api: &ApiServer, addr: std::net::SocketAddr) -> Result<Vec<u8>, String> {
    let bundle = bundles(api)[0].clone().ok_or("no caBundle")?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(apiserver_tls(&bundle)))
        .connect(ServerName::try_from(SERVICE_NAME).unwrap(), tcp)
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
    let req = hyper::Request::post(format!("https://{SERVICE_NAME}/mutate"))
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

fn by(token: &str, api: &ApiServer) -> Vec<RequestRecord> {
    api.requests()
        .into_iter()
        .filter(|r| r.token.as_deref() == Some(token))
        .collect()
}

fn writes(records: &[RequestRecord]) -> Vec<String> {
    records
        .iter()
        .filter(|r| {
            matches!(
                r.verb,
                Verb::Create | Verb::Update | Verb::Patch | Verb::Delete
            )
        })
        .filter(|r| r.resource.as_deref() != Some("leases"))
        .map(|r| {
            format!(
                "{} {}",
                r.verb.as_str(),
                r.resource.clone().unwrap_or_default()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_from_an_empty_namespace_with_no_other_step() {
    let api = cluster().await;
    // The first two creates of the Secret fail (the CA already in the caBundle stays the
    // one retried, not one more each time), the third waits a second, so that the replica
    // is seen waiting.
    api.inject(Fault::status(500).on("secrets", Verb::Create).times(2));
    api.inject(
        Fault::delay(Duration::from_secs(1))
            .on("secrets", Verb::Create)
            .times(1),
    );
    let s = replica(&api, "replica-a", None).await;
    let (status, body) = readyz(s.addr()).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("waiting for the serving certificate"),
        "{body}"
    );
    let limit = Duration::from_secs(20);
    until("ready", limit, async || readyz(s.addr()).await.0 == 200).await;

    let sec = secret(&api).expect("the Secret was created");
    assert_eq!(sec["type"], "kubernetes.io/tls");
    assert_eq!(
        sec["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "tollgate"
    );
    let data = &sec["data"];
    for key in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
        assert!(data[key].is_string(), "{key}");
    }
    let ca = b64(&data["ca.crt"]);
    assert_eq!(
        pem_certs(&ca).len(),
        1,
        "one CA, whatever the failed creates"
    );
    until("both caBundles set", limit, async || {
        bundles(&api) == vec![Some(ca.clone()), Some(ca.clone())]
    })
    .await;
    // The certificate served is the Secret's, for the Service's name, trusted through the
    // caBundle.
    let served = review(&api, s.addr()).await.unwrap();
    assert_eq!(served, pem_certs(&b64(&data["tls.crt"]))[0]);
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
    api.modify(KINDS[0], None, "tollgate", |c| {
        c["webhooks"][0]["clientConfig"]["caBundle"] = json!("Z2FyYmFnZQ==");
    });
    api.modify(KINDS[1], None, "tollgate", |c| {
        c["webhooks"][0]["clientConfig"]
            .as_object_mut()
            .unwrap()
            .remove("caBundle");
    });
    until("both repaired", limit, async || {
        bundles(&api) == vec![Some(ca.clone()), Some(ca.clone())]
    })
    .await;
    let recreated = api.remove(KINDS[0], None, "tollgate").unwrap();
    let mut fresh = recreated.clone();
    fresh["webhooks"][0]["clientConfig"]
        .as_object_mut()
        .unwrap()
        .remove("caBundle");
    fresh["metadata"] = json!({"name": "tollgate"});
    api.insert(KINDS[0], fresh);
    until("the recreated one set", limit, async || {
        bundles(&api)[0].as_ref() == Some(&ca)
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
    api.remove("secrets", Some(NAMESPACE), "tollgate-tls");
    until("the Secret made again", limit, async || {
        secret(&api).is_some()
    })
    .await;
    let again = b64(&secret(&api).unwrap()["data"]["ca.crt"]);
    let cas = pem_certs(&again);
    assert_eq!(cas.len(), 2, "the old CA and the new one");
    assert_eq!(cas[0], pem_certs(&ca)[0]);
    s.running.shutdown().await;
    assert_rbac(&api.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_only_reads_and_serves_the_same_certificate() {
    let api = cluster().await;
    let a = replica(&api, "replica-a", None).await;
    let limit = Duration::from_secs(20);
    until("a ready", limit, async || readyz(a.addr()).await.0 == 200).await;
    let b = replica(&api, "replica-b", None).await;
    until("b ready", limit, async || readyz(b.addr()).await.0 == 200).await;
    until("both caBundles", limit, async || {
        bundles(&api).iter().all(Option::is_some)
    })
    .await;
    let from_a = review(&api, a.addr()).await.unwrap();
    let from_b = review(&api, b.addr()).await.unwrap();
    assert_eq!(from_a, from_b);
    assert_eq!(
        metric(&b, "tollgate_certificate_leader", &[]).await,
        Some(0.0)
    );
    // Let b run a while as a follower: it reads the Secret and tries the Lease, no more.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let b_requests = by("replica-b", &api);
    assert_eq!(writes(&b_requests), Vec::<String>::new());
    assert!(b_requests
        .iter()
        .any(|r| r.verb == Verb::Watch && r.resource.as_deref() == Some("secrets")));
    assert!(b_requests
        .iter()
        .all(|r| !KINDS.contains(&r.resource.as_deref().unwrap_or(""))));
    assert!(!writes(&by("replica-a", &api)).is_empty());

    // a stops (and releases the Lease): b takes over and keeps the bundle repaired.
    a.running.shutdown().await;
    until("b leads", limit, async || {
        metric(&b, "tollgate_certificate_leader", &[]).await == Some(1.0)
    })
    .await;
    api.modify(KINDS[1], None, "tollgate", |c| {
        c["webhooks"][0]["clientConfig"]["caBundle"] = json!("Z2FyYmFnZQ==");
    });
    until("repaired by b", limit, async || {
        let b = bundles(&api);
        b[0] == b[1]
    })
    .await;
    b.running.shutdown().await;
    assert_rbac(&api.requests());
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
    let api = cluster().await;
    let a = replica(&api, "replica-a", Some(fast())).await;
    let limit = Duration::from_secs(20);
    until("a ready", limit, async || readyz(a.addr()).await.0 == 200).await;
    let b = replica(&api, "replica-b", Some(fast())).await;
    until("b ready", limit, async || readyz(b.addr()).await.0 == 200).await;
    until("caBundles", limit, async || {
        bundles(&api).iter().all(Option::is_some)
    })
    .await;
    let first_ca = pem_certs(&bundles(&api)[0].clone().unwrap());
    assert_eq!(first_ca.len(), 1);

    // Reviews to both replicas, four at a time, each over a new connection trusting the
    // caBundle as it is at that moment, until the CA has been replaced and the old one
    // dropped.
    let api = Arc::new(api);
    let addrs = [a.addr(), b.addr()];
    let sent = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let served = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = vec![];
    for i in 0..4 {
        let (api, sent, failures, served, done) = (
            api.clone(),
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
                match review(&api, addr).await {
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
        let b = bundles(&api)[0].clone().unwrap();
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
    assert_rbac(&api.requests());
}

/// Every request the servers made (but discovery) is granted by the RBAC of
/// deploy/overlays/self-managed (the base's cluster context and the component's rules),
/// with the name a rule names where the verb allows it: a get, update or delete names its
/// object; a list or watch names it through a `metadata.name` field selector.
fn assert_rbac(requests: &[RequestRecord]) {
    let Some(docs) = common::rbac::render_if_kubectl("deploy/overlays/self-managed") else {
        return;
    };
    let granted = common::rbac::grants(&docs, "tollgate", NAMESPACE);
    let mut exercised = std::collections::BTreeSet::new();
    for r in requests {
        if r.verb == Verb::Other {
            continue;
        }
        let Some(resource) = r.resource.clone() else {
            continue;
        };
        let group = match resource.as_str() {
            "secrets" | "namespaces" => "",
            "leases" => "coordination.k8s.io",
            "resourceclaims" | "resourceclaimtemplates" => "resource.k8s.io",
            "mutatingwebhookconfigurations" | "validatingwebhookconfigurations" => {
                "admissionregistration.k8s.io"
            }
            other => panic!("the server touched {other}"),
        };
        let name = r.name.clone().or_else(|| {
            r.param("fieldSelector")
                .and_then(|f| f.strip_prefix("metadata.name=").map(str::to_owned))
        });
        let key = format!("{group}/{resource}");
        let verb = r.verb.as_str();
        assert!(
            common::rbac::allows(
                &granted,
                &key,
                verb,
                r.namespace.as_deref(),
                name.as_deref()
            ),
            "{verb} {key} in {:?} named {name:?} is not granted by deploy/overlays/self-managed",
            r.namespace
        );
        exercised.insert(format!("{verb} {key}"));
    }
    for wanted in ["watch /secrets", "get /secrets", "create /secrets"] {
        assert!(exercised.contains(wanted), "{wanted}: {exercised:?}");
    }
    // The rules name their objects wherever the verb allows it.
    for (ns, res, verb, name) in &granted {
        let mine = res.ends_with("/secrets")
            || res.ends_with("/leases")
            || res.contains("webhookconfigurations");
        if mine && verb != "create" {
            assert!(
                name.is_some(),
                "{verb} {res} in {ns:?} is granted for every name"
            );
        }
        if mine && verb == "create" {
            assert_eq!(
                ns.as_deref(),
                Some(NAMESPACE),
                "create {res} only in tollgate's namespace"
            );
        }
    }
}

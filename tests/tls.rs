//! The real server over a socket: TLS, HTTP/1.1 and HTTP/2, certificate reload, client
//! certificates, and shutdown.

use crate::common;

use std::time::Duration;

use common::net::{self, Client};
use serde_json::Value;

#[tokio::test]
async fn answers_every_fixture_over_http1_and_http2() {
    let server = net::start(|_| {}).await;
    for h2 in [false, true] {
        let mut client = Client::connect(server.addr(), &server.ca_pem, h2).await;
        assert_eq!(client.is_h2(), h2, "ALPN negotiates the protocol asked for");
        for name in common::fixture_names() {
            let body = common::fixture(&name);
            let sent: Value = serde_json::from_slice(&body).unwrap();
            let path = if name.contains("mutate") {
                "/mutate?timeout=5s"
            } else {
                "/validate?timeout=5s"
            };
            let (status, resp) = client.post(path, body).await;
            assert_eq!(status, 200, "{name} over h2={h2}");
            let got: Value = serde_json::from_slice(&resp).unwrap();
            assert_eq!(got["response"]["uid"], sent["request"]["uid"]);
        }
        let (status, _) = client.request("GET", "/healthz", vec![]).await.unwrap();
        assert_eq!(status, 200);
    }
    server.running.shutdown().await;
}

#[tokio::test]
async fn concurrent_http2_streams_on_one_connection() {
    let server = net::start(|_| {}).await;
    let client = Client::connect(server.addr(), &server.ca_pem, true).await;
    let Client::H2(send) = client else {
        panic!("h2 expected")
    };
    let mut tasks = vec![];
    for _ in 0..32 {
        let mut c = Client::H2(send.clone());
        tasks.push(tokio::spawn(async move {
            c.post(
                "/mutate",
                common::fixture("resnet50-worker-generatename.mutate.json"),
            )
            .await
        }));
    }
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, 200);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["response"]["patchType"], "JSONPatch");
    }
    server.running.shutdown().await;
}

fn served_certificate(cfg_ca: &str) -> rustls::ClientConfig {
    net::client_config(cfg_ca, &[b"http/1.1"], None)
}

async fn peer_cert(server: &net::TestServer, ca: &str) -> std::io::Result<Vec<u8>> {
    let tls = net::tls_connect(server.addr(), served_certificate(ca)).await?;
    Ok(tls.get_ref().1.peer_certificates().unwrap()[0]
        .as_ref()
        .to_vec())
}

#[tokio::test]
async fn certificate_is_reloaded_without_restart_and_a_bad_pair_is_refused() {
    let server = net::start(|_| {}).await;
    let before = peer_cert(&server, &server.ca_pem).await.unwrap();
    // A connection opened before the swap keeps working.
    let mut old = Client::connect(server.addr(), &server.ca_pem, true).await;

    // Replace the files the way the kubelet does: new files, then an atomic rename.
    let next = tollgate::certs::generate(&["localhost".into(), "127.0.0.1".into()], 2).unwrap();
    let staging = server.dir.path().join("staging");
    tollgate::certs::write(&staging, &next).unwrap();
    std::fs::rename(staging.join("tls.key"), server.key_path()).unwrap();
    std::fs::rename(staging.join("tls.crt"), server.cert_path()).unwrap();

    let mut after = before.clone();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Ok(c) = peer_cert(&server, &next.ca_pem).await {
            after = c;
            break;
        }
    }
    assert_ne!(after, before, "new handshakes get the new certificate");
    let (status, _) = old
        .post("/mutate", common::fixture("resnet50-master-0.mutate.json"))
        .await;
    assert_eq!(status, 200, "an open connection survives the rotation");

    // A key that does not match the certificate: the old pair stays in use.
    let other = tollgate::certs::generate(&["localhost".into()], 1).unwrap();
    std::fs::write(server.key_path(), &other.key_pem).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(peer_cert(&server, &next.ca_pem).await.unwrap(), after);
    let metrics = net::get_metrics(server.running.metrics_addr.unwrap()).await;
    assert!(
        metrics.contains(r#"tollgate_certificate_reloads_total{result="success"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"tollgate_certificate_reloads_total{result="failure"} 1"#),
        "{metrics}"
    );
    server.running.shutdown().await;
}

/// Whether the server turns this client away: at the handshake, or (TLS 1.3 reports the
/// client's rejection after the handshake) on its first request.
async fn refused(server: &net::TestServer, cfg: rustls::ClientConfig) -> bool {
    match Client::connect_with(server.addr(), cfg).await {
        Err(_) => true,
        Ok(mut c) => c
            .request(
                "POST",
                "/validate",
                common::fixture("resnet50-master-0.validate.json"),
            )
            .await
            .is_err(),
    }
}

#[tokio::test]
async fn client_certificates_are_required_with_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    // A client CA and a client certificate it signed; and a stranger's.
    let apiserver = tollgate::certs::generate_client("kube-apiserver", 1).unwrap();
    let stranger = tollgate::certs::generate_client("stranger", 1).unwrap();
    std::fs::write(dir.path().join("client-ca.crt"), &apiserver.ca_pem).unwrap();
    let ca_path = dir.path().join("client-ca.crt");
    let server = net::start(|o| o.client_ca = Some(ca_path)).await;

    let good = net::client_config(
        &server.ca_pem,
        &[b"h2"],
        Some((&apiserver.cert_pem, &apiserver.key_pem)),
    );
    let mut c = Client::connect_with(server.addr(), good).await.unwrap();
    let (status, _) = c
        .post(
            "/validate",
            common::fixture("resnet50-master-0.validate.json"),
        )
        .await;
    assert_eq!(status, 200);

    for (what, cfg) in [
        (
            "no certificate",
            net::client_config(&server.ca_pem, &[b"h2"], None),
        ),
        (
            "a stranger's",
            net::client_config(
                &server.ca_pem,
                &[b"h2"],
                Some((&stranger.cert_pem, &stranger.key_pem)),
            ),
        ),
    ] {
        assert!(refused(&server, cfg).await, "{what} is refused");
    }
    server.running.shutdown().await;
}

#[tokio::test]
async fn tls_1_2_is_accepted_and_old_versions_are_not_offered() {
    let server = net::start(|_| {}).await;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(server.ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(tollgate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tls = net::tls_connect(server.addr(), cfg).await.unwrap();
    assert_eq!(
        tls.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    server.running.shutdown().await;
}

/// A hand-made TLS ClientHello: `legacy` record/hello version, the given cipher suites, and
/// the extensions an ECDHE handshake needs (no supported_versions: TLS 1.2 at most).
fn client_hello(version: [u8; 2], suites: &[u16]) -> Vec<u8> {
    fn ext(out: &mut Vec<u8>, kind: u16, body: &[u8]) {
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(body);
    }
    let mut exts = vec![];
    ext(&mut exts, 0x000a, &[0, 4, 0x00, 0x1d, 0x00, 0x17]); // x25519, secp256r1
    ext(&mut exts, 0x000b, &[1, 0]); // uncompressed points
    ext(
        &mut exts,
        0x000d,
        &[0, 8, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01, 0x08, 0x07],
    ); // ecdsa p256 sha256, rsa-pss sha256, rsa pkcs1 sha256, ed25519
    let mut hello = vec![];
    hello.extend_from_slice(&version);
    hello.extend_from_slice(&[7u8; 32]); // random
    hello.push(0); // no session id
    hello.extend_from_slice(&((suites.len() * 2) as u16).to_be_bytes());
    for s in suites {
        hello.extend_from_slice(&s.to_be_bytes());
    }
    hello.extend_from_slice(&[1, 0]); // null compression
    hello.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    hello.extend_from_slice(&exts);
    let mut hs = vec![1u8];
    hs.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&hello);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    record.extend_from_slice(&hs);
    record
}

/// Sends a ClientHello and returns the type of the first record the server answers with
/// (0x16 handshake: a ServerHello; 0x15: an alert), or None if it just closed.
async fn first_record_type(addr: std::net::SocketAddr, hello: &[u8]) -> Option<u8> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(hello).await.unwrap();
    let mut b = [0u8; 1];
    match tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut b)).await {
        Ok(Ok(1)) => Some(b[0]),
        Ok(_) => None,
        Err(_) => panic!("the server neither answered nor closed"),
    }
}

const ECDHE_AEAD: &[u16] = &[0xc02b, 0xc02f, 0xcca8, 0xcca9]; // AES-GCM and ChaCha20, ECDSA/RSA
const CBC_ONLY: &[u16] = &[0xc009, 0xc013, 0xc023, 0xc027, 0x002f, 0x0035, 0x003c];
const RSA_KX_GCM: &[u16] = &[0x009c, 0x009d]; // static RSA key exchange, no forward secrecy

#[tokio::test]
async fn only_ecdhe_aead_suites_and_tls_1_2_or_later_are_accepted() {
    let server = net::start(|_| {}).await;
    // The hand-made hello itself is fine: with modern suites the server answers ServerHello.
    assert_eq!(
        first_record_type(server.addr(), &client_hello([3, 3], ECDHE_AEAD)).await,
        Some(0x16)
    );
    for (what, version, suites) in [
        ("CBC suites only", [3, 3], CBC_ONLY),
        ("static RSA key exchange only", [3, 3], RSA_KX_GCM),
        ("TLS 1.1", [3, 2], ECDHE_AEAD),
        ("TLS 1.0", [3, 1], ECDHE_AEAD),
    ] {
        let answer = first_record_type(server.addr(), &client_hello(version, suites)).await;
        assert_ne!(
            answer,
            Some(0x16),
            "{what}: the server went on with the handshake"
        );
    }
    // Every suite the server offers: TLS 1.3, or TLS 1.2 with ECDHE and an AEAD.
    for s in &tollgate::tls::provider().cipher_suites {
        let name = format!("{:?}", s.suite());
        let tls13 = name.starts_with("TLS13_");
        let modern12 =
            name.contains("ECDHE") && (name.contains("GCM") || name.contains("CHACHA20_POLY1305"));
        assert!(tls13 || modern12, "{name} is offered");
        assert!(
            !name.contains("CBC") && !name.contains("SHA1") || tls13,
            "{name}"
        );
    }
    server.running.shutdown().await;
}

#[tokio::test]
async fn tls_1_3_clients_are_served() {
    let server = net::start(|_| {}).await;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(server.ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(tollgate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let mut c = Client::connect_with(server.addr(), cfg.clone())
        .await
        .unwrap();
    let (status, _) = c
        .post(
            "/validate",
            common::fixture("resnet50-master-0.validate.json"),
        )
        .await;
    assert_eq!(status, 200);
    let tls = net::tls_connect(server.addr(), cfg).await.unwrap();
    assert_eq!(
        tls.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    server.running.shutdown().await;
}

/// A client CA and a certificate it signed that expired yesterday.
fn expired_client() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let now = time::OffsetDateTime::now_utc();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    ca.not_before = now - time::Duration::days(30);
    ca.not_after = now + time::Duration::days(30);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["kube-apiserver".to_owned()]).unwrap();
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    leaf.not_before = now - time::Duration::days(10);
    leaf.not_after = now - time::Duration::days(1);
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

#[tokio::test]
async fn an_expired_client_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = expired_client();
    let ca_path = dir.path().join("client-ca.crt");
    std::fs::write(&ca_path, ca).unwrap();
    let server = net::start(|o| o.client_ca = Some(ca_path)).await;
    for alpn in [&b"h2"[..], &b"http/1.1"[..]] {
        let cfg = net::client_config(&server.ca_pem, &[alpn], Some((&cert, &key)));
        assert!(
            refused(&server, cfg).await,
            "an expired client certificate was accepted"
        );
    }
    server.running.shutdown().await;
}

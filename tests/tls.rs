//! The real server over a socket: TLS, HTTP/1.1 and HTTP/2, certificate reload, client
//! certificates, and shutdown.

mod common;

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
        let refused = match Client::connect_with(server.addr(), cfg).await {
            Err(_) => true,
            // TLS 1.3 reports the client's rejection after the handshake, on first use.
            Ok(mut c) => c
                .request(
                    "POST",
                    "/validate",
                    common::fixture("resnet50-master-0.validate.json"),
                )
                .await
                .is_err(),
        };
        assert!(refused, "{what} is refused");
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

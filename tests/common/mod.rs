//! Shared test support: the shipped policy and the apiserver's fixtures.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tollgate::policy::Policy;
use tollgate::server::{ActivePolicy, AppState, Limits};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn default_policy_path() -> PathBuf {
    root().join("policies/default.yaml")
}

pub fn load_policy(path: &Path) -> Policy {
    let text = std::fs::read_to_string(path).unwrap();
    Policy::from_text(&path.display().to_string(), &text).unwrap()
}

pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(root().join("tests/fixtures/apiserver-v1.36").join(name)).unwrap()
}

pub fn fixture_names() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("tests/fixtures/apiserver-v1.36"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    v.sort();
    v
}

pub fn state_with(policy: Policy) -> Arc<AppState> {
    AppState::new(ActivePolicy::new(policy, b"test"), Limits::default())
}

pub fn default_state() -> Arc<AppState> {
    state_with(load_policy(&default_policy_path()))
}

/// A real server on 127.0.0.1 with throwaway certificates, and clients that speak to it.
pub mod net {
    use std::net::SocketAddr;
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::Duration;

    use axum::body::Bytes;
    use http_body_util::{BodyExt as _, Full};
    use hyper::client::conn::{http1, http2};
    use hyper::Request;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tempfile::TempDir;
    use tokio::net::TcpStream;
    use tokio_rustls::client::TlsStream;
    use tokio_rustls::TlsConnector;
    use tollgate::server::{Limits, Running, ServeOptions};

    pub struct TestServer {
        pub running: Running,
        pub dir: TempDir,
        pub ca_pem: String,
    }

    impl TestServer {
        pub fn addr(&self) -> SocketAddr {
            self.running.addr
        }
        pub fn cert_path(&self) -> PathBuf {
            self.dir.path().join("tls.crt")
        }
        pub fn key_path(&self) -> PathBuf {
            self.dir.path().join("tls.key")
        }
        pub fn policy_path(&self) -> PathBuf {
            self.dir.path().join("policy.yaml")
        }
    }

    /// Options for a test server: everything on loopback, fast reloads, no shutdown delay.
    pub fn options(dir: &std::path::Path) -> ServeOptions {
        ServeOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
            policy_path: dir.join("policy.yaml"),
            cert_path: dir.join("tls.crt"),
            key_path: dir.join("tls.key"),
            client_ca: None,
            limits: Limits::default(),
            reload_interval: Duration::from_millis(50),
            shutdown_delay: Duration::ZERO,
            drain_timeout: Duration::from_secs(5),
        }
    }

    /// Starts a server with the shipped policy; `tweak` may change the options.
    pub async fn start(tweak: impl FnOnce(&mut ServeOptions)) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(super::default_policy_path(), dir.path().join("policy.yaml")).unwrap();
        let bundle =
            tollgate::certs::generate(&["localhost".into(), "127.0.0.1".into()], 1).unwrap();
        tollgate::certs::write(dir.path(), &bundle).unwrap();
        let mut opts = options(dir.path());
        tweak(&mut opts);
        let running = tollgate::server::start(opts).await.unwrap();
        TestServer {
            running,
            dir,
            ca_pem: bundle.ca_pem,
        }
    }

    pub fn client_config(
        ca_pem: &str,
        alpn: &[&[u8]],
        identity: Option<(&str, &str)>,
    ) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(tollgate::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let mut cfg = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(|c| c.unwrap())
                    .collect();
                let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
        };
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        cfg
    }

    pub async fn tls_connect(
        addr: SocketAddr,
        cfg: rustls::ClientConfig,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        TlsConnector::from(Arc::new(cfg))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
    }

    /// An HTTP client over one TLS connection, HTTP/1.1 or HTTP/2 as negotiated by ALPN.
    pub enum Client {
        H1(http1::SendRequest<Full<Bytes>>),
        H2(http2::SendRequest<Full<Bytes>>),
    }

    impl Client {
        pub async fn connect(addr: SocketAddr, ca_pem: &str, h2: bool) -> Client {
            let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
            Self::connect_with(addr, client_config(ca_pem, alpn, None))
                .await
                .unwrap()
        }

        pub async fn connect_with(
            addr: SocketAddr,
            cfg: rustls::ClientConfig,
        ) -> std::io::Result<Client> {
            let tls = tls_connect(addr, cfg).await?;
            let negotiated = tls.get_ref().1.alpn_protocol().map(|p| p.to_vec());
            let io = TokioIo::new(tls);
            if negotiated.as_deref() == Some(b"h2") {
                let (send, conn) = http2::handshake(TokioExecutor::new(), io)
                    .await
                    .map_err(std::io::Error::other)?;
                tokio::spawn(conn);
                Ok(Client::H2(send))
            } else {
                let (send, conn) = http1::handshake(io).await.map_err(std::io::Error::other)?;
                tokio::spawn(conn);
                Ok(Client::H1(send))
            }
        }

        pub fn is_h2(&self) -> bool {
            matches!(self, Client::H2(_))
        }

        pub async fn request(
            &mut self,
            method: &str,
            path: &str,
            body: Vec<u8>,
        ) -> hyper::Result<(u16, Vec<u8>)> {
            let mut req = Request::builder()
                .method(method)
                .uri(format!("https://localhost{path}"))
                .header("content-type", "application/json");
            if let Client::H1(_) = self {
                req = req.header("host", "localhost");
            }
            let req = req.body(Full::new(Bytes::from(body))).unwrap();
            let resp = match self {
                Client::H1(s) => {
                    s.ready().await?;
                    s.send_request(req).await?
                }
                Client::H2(s) => {
                    s.ready().await?;
                    s.send_request(req).await?
                }
            };
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await?.to_bytes().to_vec();
            Ok((status, body))
        }

        pub async fn post(&mut self, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
            self.request("POST", path, body).await.unwrap()
        }
    }

    /// GET on the plain-HTTP metrics port.
    pub async fn get_metrics(addr: SocketAddr) -> String {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) = http1::handshake(TokioIo::new(tcp)).await.unwrap();
        tokio::spawn(conn);
        let req = Request::get("/metrics")
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        String::from_utf8(
            resp.into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec(),
        )
        .unwrap()
    }
}

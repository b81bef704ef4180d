//! TLS for the webhook: rustls with the ring provider, TLS 1.2 and 1.3, ALPN h2 and
//! http/1.1, and a serving certificate that can be replaced on disk without a restart.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{cert} and {key} do not belong together: {message}")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        message: String,
    },
    #[error("TLS configuration: {0}")]
    Config(String),
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A loaded certificate, with what the metrics and logs say about it.
pub struct Loaded {
    pub key: Arc<CertifiedKey>,
    /// Expiry of the serving certificate, seconds since the Unix epoch.
    pub not_after: i64,
    /// The raw files, to tell whether they changed since.
    files: (Vec<u8>, Vec<u8>),
}

/// The serving certificate, swapped atomically when the files on disk change: handshakes
/// in progress keep the one they started with, new ones get the new one.
pub struct CertStore {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: ArcSwap<Loaded>,
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertStore")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish()
    }
}

impl CertStore {
    pub fn open(cert_path: &Path, key_path: &Path) -> Result<CertStore, TlsError> {
        let loaded = load(cert_path, key_path)?;
        Ok(CertStore {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            current: ArcSwap::from_pointee(loaded),
        })
    }

    /// Re-reads the files. `Ok(true)`: a new pair is in use; `Ok(false)`: unchanged; an
    /// error: the files are unusable and the previous pair stays in use.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let files = read_pair(&self.cert_path, &self.key_path)?;
        if files == self.current.load().files {
            return Ok(false);
        }
        let loaded = parse(&self.cert_path, &self.key_path, files)?;
        self.current.store(Arc::new(loaded));
        Ok(true)
    }

    pub fn not_after(&self) -> i64 {
        self.current.load().not_after
    }

    pub fn paths(&self) -> (&Path, &Path) {
        (&self.cert_path, &self.key_path)
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load().key.clone())
    }
}

fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|e| TlsError::File {
            path: p.to_owned(),
            message: e.to_string(),
        })
    };
    Ok((read(cert)?, read(key)?))
}

fn load(cert: &Path, key: &Path) -> Result<Loaded, TlsError> {
    let files = read_pair(cert, key)?;
    parse(cert, key, files)
}

fn parse(cert_path: &Path, key_path: &Path, files: (Vec<u8>, Vec<u8>)) -> Result<Loaded, TlsError> {
    let file_err = |p: &Path, m: String| TlsError::File {
        path: p.to_owned(),
        message: m,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&files.0)
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(cert_path, format!("not a PEM certificate: {e}")))?;
    if chain.is_empty() {
        return Err(file_err(
            cert_path,
            "no certificate found (expected PEM)".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&files.1)
        .map_err(|e| file_err(key_path, format!("not a PEM private key: {e}")))?;
    let not_after = not_after(&chain[0]).map_err(|m| file_err(cert_path, m))?;
    let certified =
        CertifiedKey::from_der(chain, key, &provider()).map_err(|e| TlsError::Mismatch {
            cert: cert_path.to_owned(),
            key: key_path.to_owned(),
            message: e.to_string(),
        })?;
    Ok(Loaded {
        key: Arc::new(certified),
        not_after,
        files,
    })
}

fn not_after(cert: &CertificateDer<'_>) -> Result<i64, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    Ok(parsed.validity().not_after.timestamp())
}

/// The server's TLS configuration. With `client_ca`, only clients presenting a certificate
/// signed by it (the apiserver, configured through its AdmissionConfiguration) get in.
pub fn server_config(
    certs: Arc<CertStore>,
    client_ca: Option<&Path>,
) -> Result<ServerConfig, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            let pem = std::fs::read(path).map_err(|e| TlsError::File {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| TlsError::File {
                    path: path.to_owned(),
                    message: format!("not a PEM certificate: {e}"),
                })?;
                roots.add(cert).map_err(|e| TlsError::File {
                    path: path.to_owned(),
                    message: e.to_string(),
                })?;
            }
            if roots.is_empty() {
                return Err(TlsError::File {
                    path: path.to_owned(),
                    message: "no CA certificate found".into(),
                });
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(certs);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

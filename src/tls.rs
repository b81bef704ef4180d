//! TLS for the webhook: rustls with the ring provider, TLS 1.2 and 1.3, ALPN h2 and
//! http/1.1, and a serving certificate that can be replaced without a restart: on disk
//! (`--tls-cert`, re-read by path) or handed over by the self-managed certificates (read
//! from a Secret through the API).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
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
        cert: String,
        key: String,
        message: String,
    },
    /// A certificate or key that did not come from a file (a Secret's key, say).
    #[error("{what}: {message}")]
    Pem { what: String, message: String },
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

/// The serving certificate, swapped atomically when it changes: handshakes in progress
/// keep the one they started with, new ones get the new one.
pub struct CertStore {
    /// The files it is re-read from; None: it is handed over ([`CertStore::load_pem`]).
    files: Option<(PathBuf, PathBuf)>,
    current: ArcSwap<Loaded>,
    /// False while only the placeholder of [`CertStore::waiting`] is there.
    loaded: AtomicBool,
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertStore")
            .field("files", &self.files)
            .field("loaded", &self.loaded)
            .finish()
    }
}

impl CertStore {
    pub fn open(cert_path: &Path, key_path: &Path) -> Result<CertStore, TlsError> {
        let loaded = load(cert_path, key_path)?;
        Ok(CertStore {
            files: Some((cert_path.to_owned(), key_path.to_owned())),
            current: ArcSwap::from_pointee(loaded),
            loaded: AtomicBool::new(true),
        })
    }

    /// A store whose certificate is yet to come (from a Secret): until then it serves a
    /// throwaway self-signed placeholder, which no client trusts, so that `/readyz` can
    /// still answer, and say that it waits, to whoever skips verification (the kubelet's
    /// probes, `curl -k`).
    pub fn waiting() -> Result<CertStore, TlsError> {
        let key = rcgen::KeyPair::generate().map_err(|e| TlsError::Config(e.to_string()))?;
        let params =
            rcgen::CertificateParams::new(vec!["tollgate-waiting-for-its-certificate".to_owned()])
                .map_err(|e| TlsError::Config(e.to_string()))?;
        let cert = params
            .self_signed(&key)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let files = (cert.pem().into_bytes(), key.serialize_pem().into_bytes());
        let placeholder = parse("placeholder certificate", "its key", files)?;
        Ok(CertStore {
            files: None,
            current: ArcSwap::from_pointee(placeholder),
            loaded: AtomicBool::new(false),
        })
    }

    /// Re-reads the files. `Ok(true)`: a new pair is in use; `Ok(false)`: unchanged (or
    /// the store has no files); an error: the files are unusable and the previous pair
    /// stays in use.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let Some((cert_path, key_path)) = &self.files else {
            return Ok(false);
        };
        let files = read_pair(cert_path, key_path)?;
        if files == self.current.load().files {
            return Ok(false);
        }
        let loaded = parse(
            &cert_path.display().to_string(),
            &key_path.display().to_string(),
            files,
        )?;
        self.current.store(Arc::new(loaded));
        Ok(true)
    }

    /// Puts a certificate chain and its key (PEM) in use, checked first (the key must be
    /// the certificate's); `what` names where they came from in errors. `Ok(true)`: a new
    /// pair is in use; `Ok(false)`: the same pair already was; an error: the previous pair
    /// stays in use.
    pub fn load_pem(&self, what: &str, cert: &[u8], key: &[u8]) -> Result<bool, TlsError> {
        let files = (cert.to_vec(), key.to_vec());
        if self.is_loaded() && files == self.current.load().files {
            return Ok(false);
        }
        let loaded = parse(
            &format!("{what} tls.crt"),
            &format!("{what} tls.key"),
            files,
        )?;
        self.current.store(Arc::new(loaded));
        self.loaded.store(true, Ordering::Release);
        Ok(true)
    }

    /// Whether a real certificate is in use (not the placeholder of [`CertStore::waiting`]).
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Expiry of the certificate in use, seconds since the Unix epoch; 0 while waiting.
    pub fn not_after(&self) -> i64 {
        if self.is_loaded() {
            self.current.load().not_after
        } else {
            0
        }
    }

    /// The certificate in use (its chain, DER), for tests and logs.
    pub fn chain(&self) -> Vec<Vec<u8>> {
        self.current
            .load()
            .key
            .cert
            .iter()
            .map(|c| c.as_ref().to_vec())
            .collect()
    }

    /// The files it is re-read from, if any.
    pub fn paths(&self) -> Option<(&Path, &Path)> {
        self.files.as_ref().map(|(c, k)| (c.as_path(), k.as_path()))
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
    parse(
        &cert.display().to_string(),
        &key.display().to_string(),
        files,
    )
}

/// Reads a certificate chain and key; `cert_path` and `key_path` name them in errors (a
/// file's path, or a Secret's key).
fn parse(cert_path: &str, key_path: &str, files: (Vec<u8>, Vec<u8>)) -> Result<Loaded, TlsError> {
    let file_err = |p: &str, m: String| TlsError::Pem {
        what: p.to_owned(),
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

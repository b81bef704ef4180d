//! TLS: a throwaway CA, the serving certificate it signs for 127.0.0.1 and localhost, and
//! the rustls config that serves it (HTTP/2 and HTTP/1.1 by ALPN).

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::PrivatePkcs8KeyDer;
use tokio_rustls::TlsAcceptor;

/// What serving HTTPS takes, and the CA a client must trust for it.
pub(crate) struct ServerTls {
    pub(crate) acceptor: TlsAcceptor,
    pub(crate) ca_pem: String,
    pub(crate) ca_der: Vec<u8>,
}

impl ServerTls {
    /// A new CA and serving certificate, as `tollgate certs` makes them (ECDSA P-256), valid
    /// from 1975 to 4096 (rcgen's defaults).
    pub(crate) fn generate() -> Self {
        let dn = |cn: &str| {
            let mut d = DistinguishedName::new();
            d.push(DnType::CommonName, cn);
            d.push(DnType::OrganizationName, "tollgate");
            d
        };
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.distinguished_name = dn("apiserver stand-in CA");
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca, ca_key);

        let key = KeyPair::generate().expect("serving key");
        let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("serving parameters");
        leaf.distinguished_name = dn("127.0.0.1");
        leaf.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = leaf.signed_by(&key, &issuer).expect("serving certificate");

        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        )
        .expect("TLS config");
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        ServerTls {
            acceptor: TlsAcceptor::from(Arc::new(tls)),
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().to_vec(),
        }
    }
}

//! Throwaway and cluster certificates: a CA and a serving certificate signed by it.
//!
//! For clusters without cert-manager (`tollgate certs`), for `serve --dev`, and for the
//! self-managed certificates of `serve --certs self-managed` ([`new_ca`], [`sign_serving`]
//! and the checks of what a Secret holds: [`CertInfo`], [`key_matches`], [`signed_by`]).
//! The CA's certificate is what the webhook configurations carry as `caBundle`.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("could not generate the certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{what}: {message}")]
    Invalid { what: String, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A CA certificate and a serving certificate with its key, all PEM.
pub struct Bundle {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// The DNS names the apiserver may use for a Service: NAME, NAME.NS, NAME.NS.svc and
/// NAME.NS.svc.cluster.local.
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// Generates a CA and a serving certificate for `names` (DNS names or IP addresses), valid
/// for `days` from now (backdated an hour for clock skew).
pub fn generate(names: &[String], days: u32) -> Result<Bundle, CertError> {
    issue(names, days, ExtendedKeyUsagePurpose::ServerAuth)
}

/// Generates a CA and a client certificate for `name`: what `--client-ca` checks, as the
/// apiserver presents one configured in its AdmissionConfiguration.
pub fn generate_client(name: &str, days: u32) -> Result<Bundle, CertError> {
    issue(
        &[name.to_owned()],
        days,
        ExtendedKeyUsagePurpose::ClientAuth,
    )
}

fn issue(names: &[String], days: u32, usage: ExtendedKeyUsagePurpose) -> Result<Bundle, CertError> {
    let now = OffsetDateTime::now_utc();
    let not_before = now - Duration::hours(1);
    let not_after = now + Duration::days(i64::from(days));

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.distinguished_name = dn("tollgate CA");
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(names.to_vec())?;
    leaf.distinguished_name = dn(names.first().map(String::as_str).unwrap_or("tollgate"));
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![usage];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let cert = leaf.signed_by(&key, &issuer)?;

    Ok(Bundle {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Writes `ca.crt`, `tls.crt` and `tls.key` (mode 0600) into `dir`, creating it.
pub fn write(dir: &Path, bundle: &Bundle) -> Result<(), CertError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| CertError::Io { path, source }
    };
    fs::create_dir_all(dir).map_err(io(dir))?;
    fs::write(dir.join("ca.crt"), &bundle.ca_pem).map_err(io(&dir.join("ca.crt")))?;
    fs::write(dir.join("tls.crt"), &bundle.cert_pem).map_err(io(&dir.join("tls.crt")))?;
    let key_path = dir.join("tls.key");
    // Written through a fresh file created with 0600 so the key is never readable by others,
    // not even for a moment.
    let _ = fs::remove_file(&key_path);
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&key_path).map_err(io(&key_path))?;
    f.write_all(bundle.key_pem.as_bytes())
        .map_err(io(&key_path))?;
    Ok(())
}

/// A CA's certificate and private key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Ca {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Ca {
    // Never the key, not even in a debug log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// How far back certificates are dated, for clocks that run behind this one's (the
/// apiserver checks `notBefore` against its own).
const BACKDATE: Duration = Duration::hours(1);

/// A new CA (ECDSA P-256), valid from `now` (backdated an hour) for `validity`. Its subject
/// names its creation time and a random number, so that two CAs side by side in a caBundle
/// are told apart.
pub fn new_ca(validity: std::time::Duration, now: OffsetDateTime) -> Result<Ca, CertError> {
    let key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    // RandomState's keys are random per process and per instance: enough to tell apart
    // two CAs made in the same second.
    let random = {
        use std::hash::{BuildHasher as _, Hasher as _};
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish() as u32
    };
    ca.distinguished_name = dn(&format!(
        "tollgate CA {} {random:08x}",
        now.unix_timestamp()
    ));
    ca.not_before = now - BACKDATE;
    ca.not_after = now + to_time(validity);
    let cert = ca.self_signed(&key)?;
    Ok(Ca {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A serving certificate for `names` (DNS names or IP addresses) signed by `ca`, valid from
/// `now` (backdated an hour) for `validity`, but never past the CA's own expiry (a chain is
/// only as good as its issuer). Returns the certificate and its new key, PEM.
pub fn sign_serving(
    ca: &Ca,
    names: &[String],
    validity: std::time::Duration,
    now: OffsetDateTime,
) -> Result<(String, String), CertError> {
    let invalid = |message: String| CertError::Invalid {
        what: "the CA".into(),
        message,
    };
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(|e| invalid(e.to_string()))?;
    let ca_info = CertInfo::parse_pem(&ca.cert_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)?;
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(names.to_vec())?;
    leaf.distinguished_name = dn(names.first().map(String::as_str).unwrap_or("tollgate"));
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = now - BACKDATE;
    let ca_end = OffsetDateTime::from_unix_timestamp(ca_info.not_after)
        .map_err(|e| invalid(e.to_string()))?;
    leaf.not_after = (now + to_time(validity)).min(ca_end);
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn to_time(d: std::time::Duration) -> Duration {
    Duration::try_from(d).unwrap_or(Duration::MAX)
}

/// What the self-managed certificates read of one certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// DER, to compare and to hand to rustls.
    pub der: Vec<u8>,
    /// Seconds since the Unix epoch.
    pub not_before: i64,
    pub not_after: i64,
    pub is_ca: bool,
    pub subject: String,
}

impl CertInfo {
    /// The first certificate of a PEM text.
    pub fn parse_pem(pem: &str) -> Result<CertInfo, CertError> {
        Self::parse_all(pem)?
            .into_iter()
            .next()
            .ok_or_else(|| CertError::Invalid {
                what: "PEM".into(),
                message: "no CERTIFICATE block".into(),
            })
    }

    /// Every certificate of a PEM text (a CA bundle), in order.
    pub fn parse_all(pem: &str) -> Result<Vec<CertInfo>, CertError> {
        let invalid = |message: String| CertError::Invalid {
            what: "PEM".into(),
            message,
        };
        let mut out = vec![];
        for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
            let block = block.map_err(|e| invalid(e.to_string()))?;
            if block.label != "CERTIFICATE" {
                continue;
            }
            let (_, cert) = x509_parser::parse_x509_certificate(&block.contents)
                .map_err(|e| invalid(format!("not X.509: {e}")))?;
            out.push(CertInfo {
                not_before: cert.validity().not_before.timestamp(),
                not_after: cert.validity().not_after.timestamp(),
                is_ca: cert.is_ca(),
                subject: cert.subject().to_string(),
                der: block.contents.clone(),
            });
        }
        Ok(out)
    }

    /// The certificate as PEM.
    pub fn pem(&self) -> String {
        pem_of(&self.der)
    }
}

/// A DER certificate as one PEM block.
pub fn pem_of(der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or(""));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// Whether the PEM private key `key_pem` is the key of the certificate `cert_der`.
pub fn key_matches(cert_der: &[u8], key_pem: &str) -> bool {
    let Ok(key) = KeyPair::from_pem(key_pem) else {
        return false;
    };
    x509_parser::parse_x509_certificate(cert_der).is_ok_and(|(_, c)| {
        use rcgen::PublicKeyData as _;
        c.tbs_certificate.subject_pki.raw == key.subject_public_key_info().as_slice()
    })
}

/// Whether the certificate `cert_der` carries a valid signature of the CA `ca_der`.
pub fn signed_by(cert_der: &[u8], ca_der: &[u8]) -> bool {
    let (Ok((_, cert)), Ok((_, ca))) = (
        x509_parser::parse_x509_certificate(cert_der),
        x509_parser::parse_x509_certificate(ca_der),
    ) else {
        return false;
    };
    cert.issuer() == ca.subject() && cert.verify_signature(Some(ca.public_key())).is_ok()
}

fn dn(cn: &str) -> DistinguishedName {
    let mut d = DistinguishedName::new();
    d.push(DnType::CommonName, cn);
    d.push(DnType::OrganizationName, "tollgate");
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serving_certificate_is_signed_by_its_ca_and_never_outlives_it() {
        let now = OffsetDateTime::now_utc();
        let ca = new_ca(std::time::Duration::from_secs(60), now).unwrap();
        let other = new_ca(std::time::Duration::from_secs(3600), now).unwrap();
        let names = service_names("tollgate", "tollgate-system");
        let (cert, key) =
            sign_serving(&ca, &names, std::time::Duration::from_secs(3600), now).unwrap();
        let leaf = CertInfo::parse_pem(&cert).unwrap();
        let ca_info = CertInfo::parse_pem(&ca.cert_pem).unwrap();
        assert!(ca_info.is_ca && !leaf.is_ca);
        assert_eq!(
            leaf.not_after, ca_info.not_after,
            "capped at the CA's expiry"
        );
        assert!(leaf.not_before <= now.unix_timestamp() - 3000, "backdated");
        assert!(key_matches(&leaf.der, &key));
        assert!(!key_matches(&leaf.der, &other.key_pem));
        assert!(key_matches(&ca_info.der, &ca.key_pem));
        assert!(signed_by(&leaf.der, &ca_info.der));
        let other_info = CertInfo::parse_pem(&other.cert_pem).unwrap();
        assert!(!signed_by(&leaf.der, &other_info.der));
        assert_ne!(
            ca_info.subject, other_info.subject,
            "two CAs of one second differ"
        );
        // A bundle of two, and PEM written back the same.
        let bundle = format!("{}{}", ca.cert_pem, other.cert_pem);
        let both = CertInfo::parse_all(&bundle).unwrap();
        assert_eq!(both.len(), 2);
        assert_eq!(
            CertInfo::parse_pem(&both[1].pem()).unwrap().der,
            other_info.der
        );
        assert!(format!("{ca:?}").find("PRIVATE").is_none());
    }
}

//! Throwaway and cluster certificates: a CA and a serving certificate signed by it.
//!
//! For clusters without cert-manager (`tollgate certs`) and for `serve --dev`. The CA's
//! certificate is what the webhook configurations carry as `caBundle`.

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

fn dn(cn: &str) -> DistinguishedName {
    let mut d = DistinguishedName::new();
    d.push(DnType::CommonName, cn);
    d.push(DnType::OrganizationName, "tollgate");
    d
}

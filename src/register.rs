//! `tollgate register`: registers the mutating and validating webhooks with a cluster.
//!
//! The webhook configurations are not written here: they are the manifests in
//! `deploy/base`, embedded at build time, so `tollgate register` and `kubectl apply -k`
//! register exactly the same webhooks. This module only fills in the caBundle (from a CA
//! file such as the `ca.crt` that `tollgate certs` writes), the Service's name and
//! namespace, and optional failure-policy overrides, then server-side-applies both objects
//! (idempotent: run it again after rotating the CA). `--dry-run` prints them as YAML instead
//! and needs no cluster.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use crate::kubeconfig::ClusterFlags;
#[cfg(test)]
use crate::kubeconfig::{load_client_config, KubeconfigSources};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::ByteString;

/// The base manifest of the mutating webhook (`deploy/base`), embedded.
pub const MUTATING_MANIFEST: &str =
    include_str!("../deploy/base/mutatingwebhookconfiguration.yaml");
/// The base manifest of the validating webhook (`deploy/base`), embedded.
pub const VALIDATING_MANIFEST: &str =
    include_str!("../deploy/base/validatingwebhookconfiguration.yaml");

/// The field manager of server-side apply: `kubectl get ... --show-managed-fields` names it.
pub const FIELD_MANAGER: &str = "tollgate-register";

/// The Service the base manifests point at.
const BASE_SERVICE: &str = "tollgate";
const BASE_NAMESPACE: &str = "tollgate-system";
/// The pods' validating webhook, which `--failure-policy-validate` overrides; the other
/// (`policies.tollgate.dev`, the TollgatePolicy and TollgateProfile objects) keeps its
/// `Ignore` (see deploy/base).
pub const VALIDATE_PODS: &str = "validate.tollgate.dev";
/// The label every namespace carries (Kubernetes 1.21+), used to exclude namespaces by name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// What the API server does when it cannot get an answer from the webhook in time.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Reject the request (fail closed).
    #[value(name = "Fail", alias = "fail")]
    Fail,
    /// Admit the request without the webhook (fail open).
    #[value(name = "Ignore", alias = "ignore")]
    Ignore,
}

impl FailurePolicy {
    fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Fail => "Fail",
            FailurePolicy::Ignore => "Ignore",
        }
    }
}

/// Arguments of `tollgate register`.
#[derive(clap::Args, Debug, Clone)]
pub struct RegisterArgs {
    /// PEM file of the CA that signed the serving certificate (the caBundle), e.g. the
    /// ca.crt written by `tollgate certs`.
    #[arg(long, value_name = "PATH")]
    pub ca_file: PathBuf,

    /// Name of the Service in front of tollgate.
    #[arg(long, value_name = "NAME", default_value = BASE_SERVICE)]
    pub service: String,

    /// tollgate outside the cluster (local development): the apiserver calls this HTTPS
    /// URL (`https://HOST:PORT`, with /mutate and /validate added) instead of a Service;
    /// the serving certificate must be for HOST and signed by --ca-file.
    #[arg(long, value_name = "URL", conflicts_with = "service")]
    pub url: Option<String>,

    /// tollgate's namespace, the Service's too: excluded from enforcement, like
    /// kube-system. Not kubectl's -n: the namespace tollgate runs in.
    #[arg(long, value_name = "NS", default_value = BASE_NAMESPACE)]
    pub namespace: String,

    /// Print the webhook configurations as YAML instead of applying them (no cluster needed).
    #[arg(long)]
    pub dry_run: bool,

    /// Override the mutating webhook's failurePolicy (default: as in deploy/base, Fail).
    #[arg(long, value_enum, value_name = "POLICY")]
    pub failure_policy_mutate: Option<FailurePolicy>,

    /// Override the pods' validating webhook's failurePolicy (default: as in deploy/base,
    /// Fail). The policy objects' webhook keeps Ignore.
    #[arg(long, value_enum, value_name = "POLICY")]
    pub failure_policy_validate: Option<FailurePolicy>,

    #[command(flatten)]
    pub cluster: ClusterFlags,
}

impl RegisterArgs {
    /// Arguments with the defaults `clap` gives, for a CA file.
    pub fn new(ca_file: impl Into<PathBuf>) -> Self {
        RegisterArgs {
            ca_file: ca_file.into(),
            service: BASE_SERVICE.to_owned(),
            namespace: BASE_NAMESPACE.to_owned(),
            dry_run: false,
            failure_policy_mutate: None,
            failure_policy_validate: None,
            url: None,
            cluster: ClusterFlags::default(),
        }
    }
}

/// The two webhook configurations tollgate registers.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookConfigurations {
    pub mutating: MutatingWebhookConfiguration,
    pub validating: ValidatingWebhookConfiguration,
}

/// The webhook configurations exactly as in `deploy/base` (no caBundle).
pub fn base_configurations() -> Result<WebhookConfigurations> {
    let mutating: MutatingWebhookConfiguration = serde_saphyr::from_str(MUTATING_MANIFEST)
        .context("parsing the embedded deploy/base/mutatingwebhookconfiguration.yaml")?;
    let validating: ValidatingWebhookConfiguration = serde_saphyr::from_str(VALIDATING_MANIFEST)
        .context("parsing the embedded deploy/base/validatingwebhookconfiguration.yaml")?;
    Ok(WebhookConfigurations {
        mutating,
        validating,
    })
}

/// The webhook configurations for `args`, trusting the PEM `ca_bundle`.
pub fn build(args: &RegisterArgs, ca_bundle: &[u8]) -> Result<WebhookConfigurations> {
    validate_dns_label(&args.service, "--service")?;
    validate_dns_label(&args.namespace, "--namespace")?;
    if let Some(url) = &args.url {
        check_url(url)?;
    }
    let mut configs = base_configurations()?;
    for webhook in configs.mutating.webhooks.iter_mut().flatten() {
        point_at(&mut webhook.client_config, args, ca_bundle);
        exclude_own_namespace(webhook.namespace_selector.as_mut(), &args.namespace);
        if let Some(policy) = args.failure_policy_mutate {
            webhook.failure_policy = Some(policy.as_str().to_owned());
        }
    }
    for webhook in configs.validating.webhooks.iter_mut().flatten() {
        point_at(&mut webhook.client_config, args, ca_bundle);
        exclude_own_namespace(webhook.namespace_selector.as_mut(), &args.namespace);
        if let Some(policy) = args
            .failure_policy_validate
            .filter(|_| webhook.name == VALIDATE_PODS)
        {
            webhook.failure_policy = Some(policy.as_str().to_owned());
        }
    }
    Ok(configs)
}

/// The namespaces the validating webhook selects, for a release in `namespace`: what
/// `tollgate export validating-admission-policy` gives the policy it writes.
pub fn validating_namespace_selector(namespace: &str) -> Result<LabelSelector> {
    validate_dns_label(namespace, "--namespace")?;
    let configs = base_configurations()?;
    let mut selector = configs
        .validating
        .webhooks
        .into_iter()
        .flatten()
        .next()
        .and_then(|w| w.namespace_selector)
        .context("deploy/base's validating webhook has no namespaceSelector")?;
    exclude_own_namespace(Some(&mut selector), namespace);
    Ok(selector)
}

fn point_at(client_config: &mut WebhookClientConfig, args: &RegisterArgs, ca_bundle: &[u8]) {
    client_config.ca_bundle = Some(ByteString(ca_bundle.to_vec()));
    if let Some(url) = &args.url {
        // The Service's path (/mutate, /validate) after the URL: the same routes.
        let path = client_config
            .service
            .take()
            .and_then(|s| s.path)
            .unwrap_or_default();
        client_config.url = Some(format!("{}{path}", url.trim_end_matches('/')));
        return;
    }
    if let Some(service) = client_config.service.as_mut() {
        service.name.clone_from(&args.service);
        service.namespace.clone_from(&args.namespace);
    }
}

/// A webhook URL the apiserver takes (admissionregistration's validation): `https`, a host,
/// no user, query or fragment.
fn check_url(url: &str) -> Result<()> {
    let bad = |why: &str| anyhow!("--url {url:?}: {why}");
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| bad("the API server calls webhooks over HTTPS only: https://HOST:PORT"))?;
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() {
        return Err(bad("no host"));
    }
    if host.contains('@') {
        return Err(bad("a webhook URL may not carry a user"));
    }
    if rest.contains(['?', '#']) {
        return Err(bad("a webhook URL may not carry a query or fragment"));
    }
    Ok(())
}

/// The base excludes `tollgate-system` by name; a release in another namespace excludes
/// that one instead, so tollgate never gates the creation of its own pods.
fn exclude_own_namespace(selector: Option<&mut LabelSelector>, namespace: &str) {
    let Some(selector) = selector else { return };
    for requirement in selector.match_expressions.iter_mut().flatten() {
        if requirement.key != NAMESPACE_NAME_LABEL || requirement.operator != "NotIn" {
            continue;
        }
        let values = requirement.values.get_or_insert_with(Vec::new);
        if namespace != BASE_NAMESPACE {
            values.retain(|v| v != BASE_NAMESPACE);
        }
        if !values.iter().any(|v| v == namespace) {
            values.push(namespace.to_owned());
        }
    }
}

fn validate_dns_label(value: &str, flag: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if !ok {
        bail!(
            "{flag} {value:?} is not a valid name (lowercase letters, digits and '-', at most 63)"
        );
    }
    Ok(())
}

/// Reads and checks a CA bundle: one or more PEM certificates, none of them expired.
pub fn read_ca_bundle(path: &Path) -> Result<Vec<u8>> {
    let pem =
        std::fs::read(path).with_context(|| format!("reading the CA file {}", path.display()))?;
    check_ca_bundle(&pem).with_context(|| format!("CA file {}", path.display()))?;
    Ok(pem)
}

/// Checks that `pem` holds at least one X.509 certificate and no expired one.
pub fn check_ca_bundle(pem: &[u8]) -> Result<()> {
    let mut certificates = 0;
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|e| anyhow!("not valid PEM: {e}"))?;
        if block.label.contains("PRIVATE KEY") {
            bail!("holds a private key; pass the CA certificate (ca.crt), never a key");
        }
        if block.label != "CERTIFICATE" {
            continue;
        }
        let cert = block
            .parse_x509()
            .map_err(|e| anyhow!("certificate {} is not valid X.509: {e}", certificates + 1))?;
        if cert.validity().time_to_expiration().is_none() {
            bail!(
                "certificate {:?} expired on {}",
                cert.subject().to_string(),
                cert.validity().not_after
            );
        }
        certificates += 1;
    }
    if certificates == 0 {
        bail!("holds no PEM CERTIFICATE block");
    }
    Ok(())
}

/// The configurations as a two-document YAML stream, ready for `kubectl apply -f -`.
pub fn to_yaml(configs: &WebhookConfigurations) -> Result<String> {
    let mutating = serde_saphyr::to_string(&configs.mutating)
        .context("serializing the MutatingWebhookConfiguration")?;
    let validating = serde_saphyr::to_string(&configs.validating)
        .context("serializing the ValidatingWebhookConfiguration")?;
    Ok(format!("---\n{mutating}---\n{validating}"))
}

/// What to do when no kubeconfig is found.
const HINT: &str = "set KUBECONFIG or pass --kubeconfig, or use --dry-run to print the \
                    webhook configurations without a cluster";

/// Runs `tollgate register`, printing the YAML (`--dry-run`) or what was applied.
pub async fn run(args: &RegisterArgs) -> Result<()> {
    let output = execute(args).await?;
    // A reader that went away (`| head`) took what it wanted.
    let mut out = std::io::stdout().lock();
    match out.write_all(output.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Does what [`run`] does and returns what it would print.
pub async fn execute(args: &RegisterArgs) -> Result<String> {
    let ca_bundle = read_ca_bundle(&args.ca_file)?;
    let configs = build(args, &ca_bundle)?;
    if args.dry_run {
        return to_yaml(&configs);
    }
    let config = args.cluster.config(HINT).await?;
    let cluster = config.cluster_url.to_string();
    let client = kube::Client::try_from(config)
        .with_context(|| format!("creating a client for the API server at {cluster}"))?;
    apply(client, &configs, &cluster).await
}

async fn apply(
    client: kube::Client,
    configs: &WebhookConfigurations,
    cluster: &str,
) -> Result<String> {
    use kube::api::{Api, Patch, PatchParams};

    // force: take over fields another manager (an earlier `kubectl apply`) set, such as
    // caBundle; the content is tollgate's own definition, so that is what we want.
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut out = String::new();

    let name = object_name(configs.mutating.metadata.name.as_deref())?;
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(name, &params, &Patch::Apply(&configs.mutating))
        .await
        .map_err(|e| explain(e, "mutatingwebhookconfigurations", name, cluster))?;
    let _ = writeln!(
        out,
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/{name} serverside-applied"
    );

    let name = object_name(configs.validating.metadata.name.as_deref())?;
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
    api.patch(name, &params, &Patch::Apply(&configs.validating))
        .await
        .map_err(|e| explain(e, "validatingwebhookconfigurations", name, cluster))?;
    let _ = writeln!(
        out,
        "validatingwebhookconfiguration.admissionregistration.k8s.io/{name} serverside-applied"
    );
    Ok(out)
}

fn object_name(name: Option<&str>) -> Result<&str> {
    name.ok_or_else(|| anyhow!("the embedded webhook manifest has no metadata.name"))
}

/// Turns a client error into one that says what to do about it.
pub fn explain(err: kube::Error, resource: &str, name: &str, cluster: &str) -> anyhow::Error {
    let applying = format!("applying {resource}.admissionregistration.k8s.io/{name} at {cluster}");
    let kube::Error::Api(status) = &err else {
        if crate::kubeconfig::is_unreachable(&err) {
            return anyhow!(
                "cannot reach the API server at {cluster}: {}",
                crate::kubeconfig::words(&err)
            );
        }
        return anyhow!("{applying}: {}", crate::kubeconfig::words(&err));
    };
    let said = &status.message;
    match status.code {
        401 => anyhow!(
            "the API server at {cluster} rejected the credentials (401 Unauthorized): log in \
             again or check the user of the kubeconfig context; it said: {said}"
        ),
        403 => anyhow!(
            "forbidden: registering the webhooks needs the cluster-scoped permissions get, \
             create and patch on {resource} (API group admissionregistration.k8s.io), which \
             the current user lacks; ask a cluster administrator, or check with \
             `kubectl auth can-i patch {resource}.admissionregistration.k8s.io`; the API \
             server said: {said}"
        ),
        // The API server's own words (`... is invalid: webhooks[0].clientConfig.url: ...`),
        // with its code and reason: never the client's Debug dump of the Status.
        code => anyhow!("{applying}: {code} {}: {said}", status.reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_ca() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn embedded_manifests_parse() {
        let base = base_configurations().unwrap();
        assert_eq!(base.mutating.metadata.name.as_deref(), Some("tollgate"));
        assert_eq!(base.validating.metadata.name.as_deref(), Some("tollgate"));
        let m = &base.mutating.webhooks.as_ref().unwrap()[0];
        let v = &base.validating.webhooks.as_ref().unwrap()[0];
        assert_eq!(m.name, "mutate.tollgate.dev");
        assert_eq!(v.name, VALIDATE_PODS);
        let names: Vec<&str> = base
            .validating
            .webhooks
            .iter()
            .flatten()
            .map(|w| w.name.as_str())
            .collect();
        assert_eq!(names, [VALIDATE_PODS, "policies.tollgate.dev"]);
        assert!(m.client_config.ca_bundle.is_none());
    }

    #[test]
    fn build_fills_ca_bundle_and_service() {
        let ca = test_ca();
        let mut args = RegisterArgs::new("unused");
        args.service = "gate".into();
        args.namespace = "ml-platform".into();
        args.failure_policy_validate = Some(FailurePolicy::Ignore);
        let configs = build(&args, ca.as_bytes()).unwrap();
        let m = &configs.mutating.webhooks.as_ref().unwrap()[0];
        let v = &configs.validating.webhooks.as_ref().unwrap()[0];
        let objects = &configs.validating.webhooks.as_ref().unwrap()[1];
        for cc in [&m.client_config, &v.client_config, &objects.client_config] {
            assert_eq!(cc.ca_bundle.as_ref().unwrap().0, ca.as_bytes());
            let svc = cc.service.as_ref().unwrap();
            assert_eq!(
                (svc.name.as_str(), svc.namespace.as_str()),
                ("gate", "ml-platform")
            );
            assert_eq!(svc.port, Some(443));
        }
        assert_eq!(m.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(v.failure_policy.as_deref(), Some("Ignore"));
        // The policy objects' webhook keeps its own (Ignore), whatever the pods' is.
        args.failure_policy_validate = Some(FailurePolicy::Fail);
        let configs = build(&args, ca.as_bytes()).unwrap();
        let hooks = configs.validating.webhooks.as_ref().unwrap();
        assert_eq!(hooks[0].failure_policy.as_deref(), Some("Fail"));
        assert_eq!(hooks[1].failure_policy.as_deref(), Some("Ignore"));
        assert!(hooks[1].namespace_selector.is_none(), "every namespace");
        for selector in [&m.namespace_selector, &v.namespace_selector] {
            let exprs = selector
                .as_ref()
                .unwrap()
                .match_expressions
                .as_ref()
                .unwrap();
            let not_in = exprs
                .iter()
                .find(|e| e.key == NAMESPACE_NAME_LABEL && e.operator == "NotIn")
                .unwrap();
            assert_eq!(
                not_in.values.as_deref().unwrap(),
                ["kube-system".to_owned(), "ml-platform".to_owned()]
            );
        }
    }

    #[test]
    fn a_url_replaces_the_service() {
        let ca = test_ca();
        let mut args = RegisterArgs::new("unused");
        args.url = Some("https://192.168.1.10:8443/".into());
        let configs = build(&args, ca.as_bytes()).unwrap();
        let urls: Vec<&str> = configs
            .mutating
            .webhooks
            .iter()
            .flatten()
            .map(|w| &w.client_config)
            .chain(
                configs
                    .validating
                    .webhooks
                    .iter()
                    .flatten()
                    .map(|w| &w.client_config),
            )
            .map(|c| {
                assert!(c.service.is_none());
                assert_eq!(c.ca_bundle.as_ref().unwrap().0, ca.as_bytes());
                c.url.as_deref().unwrap()
            })
            .collect();
        assert_eq!(
            urls,
            [
                "https://192.168.1.10:8443/mutate",
                "https://192.168.1.10:8443/validate",
                "https://192.168.1.10:8443/validate"
            ]
        );
        for bad in ["http://x:8443", "https://u@x", "https://x?a=b", "https://"] {
            args.url = Some(bad.into());
            let err = build(&args, ca.as_bytes()).unwrap_err().to_string();
            assert!(err.starts_with("--url"), "{err}");
        }
    }

    #[test]
    fn an_api_error_is_said_in_the_api_servers_words() {
        let status = kube::core::Status::failure(
            "ValidatingWebhookConfiguration.admissionregistration.k8s.io \"tollgate\" is invalid: webhooks[0].clientConfig.url: Invalid value",
            "Invalid",
        )
        .with_code(422);
        let msg = explain(
            kube::Error::Api(status.boxed()),
            "validatingwebhookconfigurations",
            "tollgate",
            "https://k8s:6443/",
        )
        .to_string();
        assert_eq!(
            msg,
            "applying validatingwebhookconfigurations.admissionregistration.k8s.io/tollgate at https://k8s:6443/: 422 Invalid: ValidatingWebhookConfiguration.admissionregistration.k8s.io \"tollgate\" is invalid: webhooks[0].clientConfig.url: Invalid value"
        );
        assert!(!msg.contains("Status {"), "{msg}");
    }

    #[test]
    fn bad_names_are_refused() {
        let mut args = RegisterArgs::new("unused");
        args.namespace = "Tollgate_System".into();
        let err = build(&args, b"").unwrap_err().to_string();
        assert!(err.contains("--namespace"), "{err}");
    }

    #[test]
    fn ca_bundle_checks() {
        assert!(check_ca_bundle(test_ca().as_bytes()).is_ok());
        let err = check_ca_bundle(b"hello").unwrap_err().to_string();
        assert!(err.contains("no PEM CERTIFICATE"), "{err}");
        let key = rcgen::KeyPair::generate().unwrap().serialize_pem();
        let err = check_ca_bundle(key.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("private key"), "{err}");
    }

    #[test]
    fn expired_ca_is_refused() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        let pem = params.self_signed(&key).unwrap().pem();
        let err = check_ca_bundle(pem.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("expired"), "{err}");
    }

    #[tokio::test]
    async fn dry_run_needs_no_cluster_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, test_ca()).unwrap();
        let mut args = RegisterArgs::new(&ca_file);
        args.dry_run = true;
        // A kubeconfig that does not exist must not matter for a dry run.
        args.cluster.kubeconfig = Some(dir.path().join("missing"));
        let yaml = execute(&args).await.unwrap();
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["kind"], "MutatingWebhookConfiguration");
        assert_eq!(docs[1]["kind"], "ValidatingWebhookConfiguration");
        let again = build(&args, test_ca().as_bytes()).unwrap();
        let m: MutatingWebhookConfiguration = serde_json::from_value(docs[0].clone()).unwrap();
        assert_eq!(
            m.webhooks.as_ref().unwrap().len(),
            again.mutating.webhooks.unwrap().len()
        );
        run(&args).await.unwrap();
    }

    #[tokio::test]
    async fn missing_kubeconfig_is_explained() {
        let dir = tempfile::tempdir().unwrap();
        let sources = KubeconfigSources {
            explicit: None,
            env: Some(dir.path().join("nope").into_os_string()),
            home: Some(dir.path().to_owned()),
            in_cluster: false,
        };
        let err = load_client_config(&sources, None, HINT).await.unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.starts_with("no kubeconfig found"), "{msg}");
        assert!(msg.contains("set KUBECONFIG"), "{msg}");
        assert!(msg.contains("nope"), "{msg}");

        let sources = KubeconfigSources {
            home: Some(dir.path().to_owned()),
            ..KubeconfigSources::default()
        };
        let msg = format!(
            "{:#}",
            load_client_config(&sources, None, HINT).await.unwrap_err()
        );
        assert!(msg.contains(".kube/config"), "{msg}");

        // Through `execute`, with --kubeconfig, without touching the environment.
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, test_ca()).unwrap();
        let mut args = RegisterArgs::new(&ca_file);
        args.cluster.kubeconfig = Some(dir.path().join("missing-kubeconfig"));
        let msg = format!("{:#}", execute(&args).await.unwrap_err());
        assert!(msg.starts_with("no kubeconfig found"), "{msg}");
        assert!(msg.contains("--kubeconfig"), "{msg}");
    }

    #[tokio::test]
    async fn kubeconfig_is_loaded_from_env_list() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        std::fs::write(
            &file,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\ncontexts:\n- name: c\n  context:\n    cluster: k\n    user: u\nusers:\n- name: u\n  user:\n    token: t\n",
        )
        .unwrap();
        let mut list = std::ffi::OsString::from(dir.path().join("missing"));
        list.push(":");
        list.push(&file);
        let sources = KubeconfigSources {
            env: Some(list),
            ..KubeconfigSources::default()
        };
        let config = load_client_config(&sources, None, HINT).await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
    }

    #[test]
    fn forbidden_names_the_permission() {
        let status = kube::core::Status::failure(
            "mutatingwebhookconfigurations.admissionregistration.k8s.io \"tollgate\" is forbidden",
            "Forbidden",
        )
        .with_code(403);
        let err = explain(
            kube::Error::Api(status.boxed()),
            "mutatingwebhookconfigurations",
            "tollgate",
            "https://k8s:6443/",
        );
        let msg = err.to_string();
        assert!(msg.starts_with("forbidden:"), "{msg}");
        assert!(msg.contains("get, create and patch on mutatingwebhookconfigurations"));
        assert!(msg.contains("kubectl auth can-i"), "{msg}");
    }
}

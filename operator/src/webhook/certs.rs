//! The webhook's certificates, in one of two modes.
//!
//! **Generated** (default): a self-signed CA and a serving certificate for
//! `<service>.<namespace>.svc` (and the other in-cluster forms, plus `--webhook-host` names),
//! made with rcgen and kept in a Secret so that every replica serves the same certificate: the
//! first replica to start creates the Secret, the others read it (create and update are
//! optimistic, so concurrent starts converge on one). The serving certificate (valid
//! [`CERT_VALIDITY`]) is renewed [`CERT_RENEW_BEFORE`] its expiry, signed by the same CA, so the
//! caBundle does not change; the CA (valid [`CA_VALIDITY`]) is renewed [`CA_RENEW_BEFORE`] its
//! expiry, and the caBundle then holds the new and the old CA until the old one expires. Each
//! replica re-reads the Secret every [`GENERATED_CHECK_INTERVAL`].
//!
//! **Files** (`--webhook-cert-dir`): `tls.crt` and `tls.key` (and optionally `ca.crt`) from a
//! mounted Secret, e.g. one cert-manager issues; re-read every [`FILES_CHECK_INTERVAL`] and
//! swapped in when they change, without a restart.
//!
//! In both modes the CA is patched into the `caBundle` of every webhook of the
//! ValidatingWebhookConfiguration named by `--webhook-config-name`, whenever it differs (checked
//! on every refresh and whenever the configuration changes, e.g. after a `helm upgrade`).

use std::{
    collections::BTreeSet,
    future::Future,
    net::IpAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures::StreamExt;
use k8s_openapi::{
    ByteString,
    api::{admissionregistration::v1::ValidatingWebhookConfiguration, core::v1::Secret},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SanType,
};
use serde_json::json;
use tracing::{info, warn};

use super::tls::{CertResolver, certified_key};
use crate::{FIELD_MANAGER, metrics::operator::OperatorMetrics};

/// Validity of a generated CA.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// A generated CA is replaced when it has less than this left.
pub const CA_RENEW_BEFORE: Duration = Duration::from_secs(365 * 24 * 3600);
/// Validity of a generated serving certificate.
pub const CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// A generated serving certificate is replaced when it has less than this left.
pub const CERT_RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
/// How often a replica re-reads the Secret of generated certificates.
pub const GENERATED_CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// How often certificate files are checked for changes.
pub const FILES_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// Retry delay after a failed refresh.
const RETRY: Duration = Duration::from_secs(10);
/// Backdating of `notBefore`, for clocks that lag.
const BACKDATE: Duration = Duration::from_secs(3600);

/// Secret (and file) keys.
const CA_CERT_KEY: &str = "ca.crt";
const CA_KEY_KEY: &str = "ca.key";
const CERT_KEY: &str = "tls.crt";
const KEY_KEY: &str = "tls.key";

/// Why certificates could not be produced or loaded.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen failed.
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// The material cannot be used by rustls.
    #[error(transparent)]
    Tls(#[from] super::tls::TlsError),
    /// An API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was attempted.
        action: String,
        /// The API error.
        source: kube::Error,
    },
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A validity bound is not a representable time.
    #[error("{0} is not a representable certificate time")]
    Time(i64),
    /// The Secret exists but was not made by this operator; it is never overwritten.
    #[error(
        "Secret {0} exists but is not labelled app.kubernetes.io/managed-by=planner-operator, so the operator does not overwrite it; to serve its certificate mount it and set --webhook-cert-dir, or name another --webhook-secret"
    )]
    NotOurs(String),
    /// Other replicas kept changing the Secret.
    #[error("Secret {0} kept changing while this replica tried to update it; retrying")]
    Contended(String),
}

/// Names the generated serving certificate is valid for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSettings {
    /// Name of the webhook's Service.
    pub service: String,
    /// Namespace of the Service.
    pub namespace: String,
    /// Extra DNS names or IP addresses (e.g. `127.0.0.1` when the API server calls a URL).
    pub extra_hosts: Vec<String>,
}

impl CertSettings {
    /// Every subject alternative name, in-cluster forms first, without duplicates.
    pub fn hosts(&self) -> Vec<String> {
        let Self {
            service,
            namespace,
            extra_hosts,
        } = self;
        let mut hosts = vec![
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
            format!("{service}.{namespace}"),
            service.clone(),
        ];
        for host in extra_hosts {
            if !host.is_empty() && !hosts.contains(host) {
                hosts.push(host.clone());
            }
        }
        hosts
    }
}

/// PEM material of generated certificates, as kept in the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertBundle {
    /// CA certificates the API server should trust: the current CA first, then the previous one
    /// while it is still valid.
    pub ca_cert: String,
    /// Private key of the current CA.
    pub ca_key: String,
    /// Serving certificate.
    pub cert: String,
    /// Its private key.
    pub key: String,
}

/// What a refresh must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// The stored certificates are good.
    Keep,
    /// New serving certificate, same CA (near expiry, or the names changed).
    Serving,
    /// New CA and serving certificate (none stored, unreadable, or the CA near expiry).
    All,
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn secs(duration: Duration) -> i64 {
    i64::try_from(duration.as_secs()).unwrap_or(i64::MAX)
}

/// Expiry (Unix seconds) and subject alternative names of the first certificate of a PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// `notAfter`, Unix seconds.
    pub not_after: i64,
    /// DNS names and IP addresses.
    pub hosts: BTreeSet<String>,
}

/// Reads the first certificate of a PEM; `None` when there is none or it cannot be parsed.
pub fn cert_info(pem: &str) -> Option<CertInfo> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let mut hosts = BTreeSet::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(dns) => {
                    hosts.insert((*dns).to_string());
                }
                x509_parser::extensions::GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                        _ => None,
                    };
                    if let Some(ip) = ip {
                        hosts.insert(ip.to_string());
                    }
                }
                _ => {}
            }
        }
    }
    Some(CertInfo {
        not_after: cert.validity().not_after.timestamp(),
        hosts,
    })
}

/// Decides what a refresh must do with the stored bundle at time `now` (Unix seconds).
pub fn plan(stored: Option<&CertBundle>, settings: &CertSettings, now: i64) -> Plan {
    let Some(stored) = stored else {
        return Plan::All;
    };
    let (Some(ca), Some(cert)) = (cert_info(&stored.ca_cert), cert_info(&stored.cert)) else {
        return Plan::All;
    };
    if KeyPair::from_pem(&stored.ca_key).is_err()
        || certified_key(stored.cert.as_bytes(), stored.key.as_bytes()).is_err()
    {
        return Plan::All;
    }
    if ca.not_after - now < secs(CA_RENEW_BEFORE) {
        return Plan::All;
    }
    let wanted: BTreeSet<String> = settings
        .hosts()
        .iter()
        .map(|h| {
            h.parse::<IpAddr>()
                .map_or_else(|_| h.clone(), |ip| ip.to_string())
        })
        .collect();
    if cert.not_after - now < secs(CERT_RENEW_BEFORE) || cert.hosts != wanted {
        return Plan::Serving;
    }
    Plan::Keep
}

fn offset(unix: i64) -> Result<time::OffsetDateTime, CertError> {
    time::OffsetDateTime::from_unix_timestamp(unix).map_err(|_| CertError::Time(unix))
}

/// The first `CERTIFICATE` block of a PEM bundle.
fn first_certificate(pem: &str) -> Option<&str> {
    const END: &str = "-----END CERTIFICATE-----";
    let start = pem.find("-----BEGIN CERTIFICATE-----")?;
    let end = pem[start..].find(END)? + start + END.len();
    pem.get(start..end)
}

fn serial() -> rcgen::SerialNumber {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // Positive, 16 bytes, unique per call in practice.
    let mut bytes = nanos.to_be_bytes();
    bytes[0] &= 0x7f;
    rcgen::SerialNumber::from_slice(&bytes)
}

/// Carries out `plan` (not [`Plan::Keep`]): a new CA when asked or when there is none, then a
/// serving certificate signed by it.
pub fn issue(
    plan: Plan,
    previous: Option<&CertBundle>,
    settings: &CertSettings,
    now: i64,
) -> Result<CertBundle, CertError> {
    let reuse_ca = match (plan, previous) {
        (Plan::Serving | Plan::Keep, Some(previous)) => Some(previous),
        _ => None,
    };
    let (ca_cert, ca_key) = match reuse_ca {
        Some(previous) => (previous.ca_cert.clone(), previous.ca_key.clone()),
        None => {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::default();
            let mut name = DistinguishedName::new();
            name.push(
                DnType::CommonName,
                format!("planner-operator webhook CA ({})", settings.namespace),
            );
            params.distinguished_name = name;
            params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            params.not_before = offset(now - secs(BACKDATE))?;
            params.not_after = offset(now + secs(CA_VALIDITY))?;
            params.serial_number = Some(serial());
            let cert = params.self_signed(&key)?;
            let mut bundle = cert.pem();
            // Keep trusting the previous CA while it is valid: replicas still serving a
            // certificate it signed keep working until they reload.
            if let Some(previous) = previous
                && let Some(info) = cert_info(&previous.ca_cert)
                && info.not_after > now
                && let Some(old) = first_certificate(&previous.ca_cert)
            {
                bundle.push_str(old);
                bundle.push('\n');
            }
            (bundle, key.serialize_pem())
        }
    };
    let issuer_key = KeyPair::from_pem(&ca_key)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_cert, issuer_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(
        DnType::CommonName,
        settings.hosts().first().cloned().unwrap_or_default(),
    );
    params.distinguished_name = name;
    params.subject_alt_names = settings
        .hosts()
        .into_iter()
        .map(|host| match host.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => host.try_into().map(SanType::DnsName),
        })
        .collect::<Result<_, _>>()?;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = offset(now - secs(BACKDATE))?;
    params.not_after = offset(now + secs(CERT_VALIDITY))?;
    params.serial_number = Some(serial());
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(CertBundle {
        ca_cert,
        ca_key,
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
const MANAGED_BY: &str = "planner-operator";

/// Whether this operator made the Secret (and may replace its contents).
fn is_ours(secret: &Secret) -> bool {
    secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGED_BY)
}

/// The bundle stored in a Secret, if it has every key.
pub fn bundle_from_secret(secret: &Secret) -> Option<CertBundle> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| data.get(key).and_then(|v| String::from_utf8(v.0.clone()).ok());
    Some(CertBundle {
        ca_cert: text(CA_CERT_KEY)?,
        ca_key: text(CA_KEY_KEY)?,
        cert: text(CERT_KEY)?,
        key: text(KEY_KEY)?,
    })
}

fn secret_data(bundle: &CertBundle) -> std::collections::BTreeMap<String, ByteString> {
    [
        (CA_CERT_KEY, &bundle.ca_cert),
        (CA_KEY_KEY, &bundle.ca_key),
        (CERT_KEY, &bundle.cert),
        (KEY_KEY, &bundle.key),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
    .collect()
}

/// Generated certificates kept in a Secret.
pub struct SecretCerts {
    api: Api<Secret>,
    name: String,
    settings: CertSettings,
}

impl SecretCerts {
    /// Certificates for `settings`, kept in Secret `name` of `settings.namespace`.
    pub fn new(client: Client, name: String, settings: CertSettings) -> Self {
        Self {
            api: Api::namespaced(client, &settings.namespace),
            name,
            settings,
        }
    }

    /// Reads the Secret, renewing what [`plan`] says, and returns the bundle to serve. Another
    /// replica's concurrent write wins, and its bundle is used.
    pub async fn ensure(&self) -> Result<CertBundle, CertError> {
        let kube = |action: String| move |source| CertError::Kube { action, source };
        for _ in 0..3 {
            let existing = self
                .api
                .get_opt(&self.name)
                .await
                .map_err(kube(format!("read Secret {}", self.name)))?;
            if let Some(secret) = &existing
                && !is_ours(secret)
            {
                return Err(CertError::NotOurs(self.name.clone()));
            }
            let stored = existing.as_ref().and_then(bundle_from_secret);
            let now = unix_now();
            let plan = plan(stored.as_ref(), &self.settings, now);
            if plan == Plan::Keep
                && let Some(stored) = stored
            {
                return Ok(stored);
            }
            let bundle = issue(plan, stored.as_ref(), &self.settings, now)?;
            let result = match existing {
                None => {
                    let secret = Secret {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            namespace: Some(self.settings.namespace.clone()),
                            labels: Some([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())].into()),
                            ..ObjectMeta::default()
                        },
                        data: Some(secret_data(&bundle)),
                        type_: Some("kubernetes.io/tls".into()),
                        ..Secret::default()
                    };
                    self.api.create(&PostParams::default(), &secret).await.map(|_| ())
                }
                Some(mut secret) => {
                    secret.data = Some(secret_data(&bundle));
                    secret.string_data = None;
                    // Carries the resourceVersion read above: a concurrent writer makes this fail.
                    self.api
                        .replace(&self.name, &PostParams::default(), &secret)
                        .await
                        .map(|_| ())
                }
            };
            match result {
                Ok(()) => {
                    info!(secret = %self.name, ?plan, "stored new webhook certificates");
                    return Ok(bundle);
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    // Another replica wrote first; use what it wrote.
                    continue;
                }
                Err(source) => {
                    return Err(CertError::Kube {
                        action: format!("write Secret {}", self.name),
                        source,
                    });
                }
            }
        }
        Err(CertError::Contended(self.name.clone()))
    }
}

/// Certificates read from files.
pub struct FileCerts {
    dir: PathBuf,
    check_interval: Duration,
}

/// What was read from the files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileBundle {
    /// `tls.crt`.
    pub cert: Vec<u8>,
    /// `tls.key`.
    pub key: Vec<u8>,
    /// `ca.crt`, when present.
    pub ca: Option<String>,
}

impl FileCerts {
    /// Reads `tls.crt`, `tls.key` and, when present, `ca.crt` from `dir`, every
    /// [`FILES_CHECK_INTERVAL`].
    pub fn new(dir: PathBuf) -> Self {
        Self::with_check_interval(dir, FILES_CHECK_INTERVAL)
    }

    /// The same, checking for changes every `check_interval`.
    pub fn with_check_interval(dir: PathBuf, check_interval: Duration) -> Self {
        Self { dir, check_interval }
    }

    /// Reads the files.
    pub async fn read(&self) -> Result<FileBundle, CertError> {
        let read = |name: &str| {
            let path = self.dir.join(name);
            async move {
                tokio::fs::read(&path)
                    .await
                    .map_err(|source| CertError::Read { path, source })
            }
        };
        let cert = read(CERT_KEY).await?;
        let key = read(KEY_KEY).await?;
        let ca = match read(CA_CERT_KEY).await {
            Ok(bytes) => String::from_utf8(bytes).ok(),
            Err(CertError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(error),
        };
        Ok(FileBundle { cert, key, ca })
    }
}

/// Where the serving certificate comes from.
pub enum CertSource {
    /// Generated and kept in a Secret.
    Generated(Box<SecretCerts>),
    /// Read from files.
    Files(FileCerts),
}

/// Result of [`patch_ca_bundle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaBundlePatch {
    /// No such ValidatingWebhookConfiguration (yet).
    Missing,
    /// Every webhook already has the bundle.
    Unchanged,
    /// This many webhooks were patched.
    Patched(usize),
}

/// Sets `caBundle` of every webhook of the ValidatingWebhookConfiguration `name` to `ca_pem`
/// where it differs.
pub async fn patch_ca_bundle(
    client: &Client,
    name: &str,
    ca_pem: &str,
) -> Result<CaBundlePatch, kube::Error> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let Some(config) = api.get_opt(name).await? else {
        return Ok(CaBundlePatch::Missing);
    };
    let wanted = ByteString(ca_pem.as_bytes().to_vec());
    let stale: Vec<String> = config
        .webhooks
        .iter()
        .flatten()
        .filter(|w| w.client_config.ca_bundle.as_ref() != Some(&wanted))
        .map(|w| w.name.clone())
        .collect();
    if stale.is_empty() {
        return Ok(CaBundlePatch::Unchanged);
    }
    // Strategic merge: `webhooks` merges by name, so only the bundles change.
    let patch = json!({
        "webhooks": stale
            .iter()
            .map(|name| json!({"name": name, "clientConfig": {"caBundle": wanted}}))
            .collect::<Vec<_>>()
    });
    api.patch(
        name,
        &PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        },
        &Patch::Strategic(patch),
    )
    .await?;
    Ok(CaBundlePatch::Patched(stale.len()))
}

/// Keeps `resolver` loaded with the current certificate and the caBundle of `config_name`
/// (when given) in sync, until `shutdown` resolves.
pub async fn maintain(
    source: CertSource,
    client: Client,
    config_name: Option<String>,
    resolver: Arc<CertResolver>,
    metrics: Arc<OperatorMetrics>,
    shutdown: impl Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    // Changes of the configuration (created later, or reset by an upgrade) trigger a refresh.
    let mut config_changes = match &config_name {
        Some(name) => watcher(
            Api::<ValidatingWebhookConfiguration>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
        )
        .default_backoff()
        .touched_objects()
        .boxed(),
        None => futures::stream::pending().boxed(),
    };
    let mut loaded: Option<(Vec<u8>, Vec<u8>)> = None;
    loop {
        let outcome = refresh(&source, &resolver, &mut loaded, &metrics).await;
        let wait = match outcome {
            Ok(ca) => {
                if let (Some(name), Some(ca)) = (&config_name, ca) {
                    match patch_ca_bundle(&client, name, &ca).await {
                        Ok(CaBundlePatch::Patched(n)) => {
                            info!(config = %name, webhooks = n, "patched the caBundle");
                        }
                        Ok(CaBundlePatch::Missing) => {
                            info!(config = %name, "ValidatingWebhookConfiguration not found; the caBundle is patched once it exists");
                        }
                        Ok(CaBundlePatch::Unchanged) => {}
                        Err(error) => warn!(config = %name, %error, "cannot patch the caBundle"),
                    }
                }
                match &source {
                    CertSource::Generated(_) => GENERATED_CHECK_INTERVAL,
                    CertSource::Files(files) => files.check_interval,
                }
            }
            Err(error) => {
                warn!(%error, "cannot load the webhook certificate; retrying");
                RETRY
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {},
            Some(_) = config_changes.next() => {},
            () = &mut shutdown => return,
        }
    }
}

/// Loads the certificate when it changed; returns the CA bundle to patch, if known.
async fn refresh(
    source: &CertSource,
    resolver: &CertResolver,
    loaded: &mut Option<(Vec<u8>, Vec<u8>)>,
    metrics: &OperatorMetrics,
) -> Result<Option<String>, CertError> {
    let (cert, key, ca) = match source {
        CertSource::Generated(secret) => {
            let bundle = secret.ensure().await?;
            (
                bundle.cert.into_bytes(),
                bundle.key.into_bytes(),
                Some(bundle.ca_cert),
            )
        }
        CertSource::Files(files) => {
            let bundle = files.read().await?;
            (bundle.cert, bundle.key, bundle.ca)
        }
    };
    if loaded.as_ref() != Some(&(cert.clone(), key.clone())) {
        let certified = certified_key(&cert, &key)?;
        resolver.set(certified);
        let not_after = std::str::from_utf8(&cert)
            .ok()
            .and_then(cert_info)
            .map(|i| i.not_after)
            .unwrap_or_default();
        metrics.set_webhook_certificate_expiry(not_after);
        info!(not_after, "loaded the webhook serving certificate");
        *loaded = Some((cert, key));
    }
    Ok(ca)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> CertSettings {
        CertSettings {
            service: "planner-operator-webhook".into(),
            namespace: "ops".into(),
            extra_hosts: vec!["127.0.0.1".into(), "localhost".into()],
        }
    }

    const NOW: i64 = 1_800_000_000;
    const DAY: i64 = 24 * 3600;

    #[test]
    fn names_cover_the_service_and_extra_hosts() {
        assert_eq!(
            settings().hosts(),
            [
                "planner-operator-webhook.ops.svc",
                "planner-operator-webhook.ops.svc.cluster.local",
                "planner-operator-webhook.ops",
                "planner-operator-webhook",
                "127.0.0.1",
                "localhost",
            ]
        );
    }

    #[test]
    fn a_fresh_bundle_is_valid_for_its_names_and_served_by_rustls() {
        let bundle = issue(Plan::All, None, &settings(), NOW).unwrap();
        let info = cert_info(&bundle.cert).unwrap();
        assert_eq!(info.not_after, NOW + secs(CERT_VALIDITY));
        assert!(info.hosts.contains("planner-operator-webhook.ops.svc"));
        assert!(info.hosts.contains("127.0.0.1"));
        assert_eq!(
            cert_info(&bundle.ca_cert).unwrap().not_after,
            NOW + secs(CA_VALIDITY)
        );
        certified_key(bundle.cert.as_bytes(), bundle.key.as_bytes()).unwrap();
        assert_eq!(plan(Some(&bundle), &settings(), NOW), Plan::Keep);
        assert_eq!(plan(Some(&bundle), &settings(), NOW + 300 * DAY), Plan::Keep);
    }

    #[test]
    fn serving_certificates_are_renewed_before_expiry_with_the_same_ca() {
        let bundle = issue(Plan::All, None, &settings(), NOW).unwrap();
        let near_expiry = NOW + 340 * DAY;
        assert_eq!(plan(Some(&bundle), &settings(), near_expiry), Plan::Serving);
        let renewed = issue(Plan::Serving, Some(&bundle), &settings(), near_expiry).unwrap();
        assert_eq!(renewed.ca_cert, bundle.ca_cert, "the caBundle does not change");
        assert_ne!(renewed.cert, bundle.cert);
        assert_eq!(plan(Some(&renewed), &settings(), near_expiry), Plan::Keep);
        // A changed name set also renews the serving certificate.
        let mut other = settings();
        other.extra_hosts.push("webhook.example.com".into());
        assert_eq!(plan(Some(&renewed), &other, near_expiry), Plan::Serving);
    }

    #[test]
    fn the_ca_is_renewed_before_expiry_and_the_old_one_kept_in_the_bundle() {
        let bundle = issue(Plan::All, None, &settings(), NOW).unwrap();
        let late = NOW + 9 * 365 * DAY + 10 * DAY;
        assert_eq!(plan(Some(&bundle), &settings(), late), Plan::All);
        let renewed = issue(Plan::All, Some(&bundle), &settings(), late).unwrap();
        assert_eq!(renewed.ca_cert.matches("BEGIN CERTIFICATE").count(), 2);
        let original = first_certificate(&bundle.ca_cert).unwrap();
        assert!(renewed.ca_cert.contains(original));
        assert_eq!(plan(Some(&renewed), &settings(), late), Plan::Keep);
        // At the next CA renewal the first CA, long expired, is dropped.
        let later = late + 9 * 365 * DAY + 10 * DAY;
        assert_eq!(plan(Some(&renewed), &settings(), later), Plan::All);
        let again = issue(Plan::All, Some(&renewed), &settings(), later).unwrap();
        assert_eq!(again.ca_cert.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(!again.ca_cert.contains(original));
    }

    #[test]
    fn unreadable_material_is_replaced() {
        let mut bundle = issue(Plan::All, None, &settings(), NOW).unwrap();
        assert_eq!(plan(None, &settings(), NOW), Plan::All);
        bundle.key = "garbage".into();
        assert_eq!(plan(Some(&bundle), &settings(), NOW), Plan::All);
        let mut other = issue(Plan::All, None, &settings(), NOW).unwrap();
        other.key = issue(Plan::All, None, &settings(), NOW).unwrap().key;
        assert_eq!(
            plan(Some(&other), &settings(), NOW),
            Plan::All,
            "key does not match"
        );
    }

    #[test]
    fn secrets_round_trip() {
        let bundle = issue(Plan::All, None, &settings(), NOW).unwrap();
        let secret = Secret {
            data: Some(secret_data(&bundle)),
            ..Secret::default()
        };
        assert_eq!(bundle_from_secret(&secret), Some(bundle));
        assert_eq!(bundle_from_secret(&Secret::default()), None);
        assert!(!is_ours(&secret), "a Secret without the label is someone else's");
    }
}

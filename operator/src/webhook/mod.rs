//! The validating admission webhook, served by `planner-operator run` on every replica (not only
//! the leader): HTTPS (rustls, ring) with axum routes for DynamoGraphDeployments and
//! PlannerPolicies. See [`admission`] for the rules and their leniency, [`certs`] for the two
//! certificate modes (generated and kept in a Secret, or read from files) and their rotation,
//! [`configuration`] for the ValidatingWebhookConfiguration.

pub mod admission;
pub mod certs;
pub mod configuration;
pub mod tls;

use std::{future::Future, net::SocketAddr, path::PathBuf, sync::Arc};

use futures::FutureExt;
use kube::Client;
use tokio::{net::TcpListener, task::JoinHandle};
use tracing::info;

pub use admission::{Admission, KubeLookups, Lookups, router};
use certs::{CertSettings, CertSource, FileCerts, SecretCerts};
use tls::CertResolver;

use crate::{lookup::ClusterTopologyApi, metrics::operator::OperatorMetrics};

/// How to run the webhook.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// Read `tls.crt`, `tls.key` (and `ca.crt`) from here instead of generating certificates.
    pub cert_dir: Option<PathBuf>,
    /// ValidatingWebhookConfiguration whose caBundle to keep current (`None`: leave it alone).
    pub config_name: Option<String>,
    /// Secret holding generated certificates (in `cert.namespace`).
    pub secret_name: String,
    /// Names for generated certificates.
    pub cert: CertSettings,
    /// What the cluster admin lets PlannerPolicies name.
    pub tenancy: crate::validation::Tenancy,
}

/// Why the webhook could not start.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// TLS cannot be configured.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// A running webhook.
pub struct Webhook {
    /// The serving certificate (ready once loaded).
    pub resolver: Arc<CertResolver>,
    /// The address it listens on.
    pub local_addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Webhook {
    /// Waits until the server and the certificate maintenance have stopped.
    pub async fn stopped(self) {
        let _ = self.task.await;
    }
}

/// Binds the listener (so that a bad address fails the start) and starts the server and the
/// certificate maintenance; both stop when `shutdown` resolves.
pub async fn start(
    settings: WebhookSettings,
    client: Client,
    cluster_topology_api: ClusterTopologyApi,
    metrics: Arc<OperatorMetrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Webhook, WebhookError> {
    let WebhookSettings {
        addr,
        cert_dir,
        config_name,
        secret_name,
        cert,
        tenancy,
    } = settings;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| WebhookError::Listen { addr, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| WebhookError::Listen { addr, source })?;
    let resolver = Arc::new(CertResolver::default());
    let config = tls::server_config(Arc::clone(&resolver))?;
    let admission = Arc::new(
        Admission::new(
            KubeLookups {
                client: client.clone(),
                cluster_topology_api,
            },
            Some(Arc::clone(&metrics)),
        )
        .with_tenancy(tenancy),
    );
    let source = match &cert_dir {
        Some(dir) => CertSource::Files(FileCerts::new(dir.clone())),
        None => CertSource::Generated(Box::new(SecretCerts::new(
            client.clone(),
            secret_name.clone(),
            cert.clone(),
        ))),
    };
    match &cert_dir {
        Some(dir) => {
            info!(%local_addr, dir = %dir.display(), "serving the admission webhook with certificates from files")
        }
        None => info!(
            %local_addr,
            secret = %format!("{}/{secret_name}", cert.namespace),
            hosts = ?cert.hosts(),
            "serving the admission webhook with generated certificates"
        ),
    }
    let shutdown = shutdown.shared();
    let maintain = certs::maintain(
        source,
        client,
        config_name,
        Arc::clone(&resolver),
        metrics,
        shutdown.clone(),
    );
    let serve = tls::serve(listener, config, router(admission), shutdown);
    let task = tokio::spawn(async move {
        futures::future::join(maintain, serve).await;
    });
    Ok(Webhook {
        resolver,
        local_addr,
        task,
    })
}

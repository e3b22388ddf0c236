//! Serving the admission webhook. Every replica serves it, leader or not; only the leader
//! reconciles.

use std::sync::Arc;

use kube::Client;
use tracing::info;

use super::{args::RunArgs, error::RunError};
use crate::{
    metrics::operator::OperatorMetrics,
    webhook::{self, Webhook, WebhookSettings, certs::CertSettings},
};

/// Starts the webhook as the flags say (`None` with --webhook-disabled); it stops when
/// `shutdown` resolves.
pub(super) async fn start(
    args: &RunArgs,
    client: &Client,
    lease_namespace: &str,
    metrics: &Arc<OperatorMetrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Option<Webhook>, RunError> {
    if args.webhook_disabled {
        info!("admission webhook disabled");
        return Ok(None);
    }
    let webhook = webhook::start(
        settings(args, lease_namespace),
        client.clone(),
        args.cluster_topology_api_version.clone(),
        Arc::clone(metrics),
        shutdown,
    )
    .await?;
    Ok(Some(webhook))
}

/// The webhook's settings from the flags; the Service and the certificate Secret default to
/// the Lease's namespace.
fn settings(args: &RunArgs, lease_namespace: &str) -> WebhookSettings {
    WebhookSettings {
        addr: args.webhook_addr,
        cert_dir: args.webhook_cert_dir.clone(),
        config_name: Some(args.webhook_config_name.clone()).filter(|n| !n.is_empty()),
        secret_name: args.webhook_secret.clone(),
        cert: CertSettings {
            service: args.webhook_service.clone(),
            namespace: args
                .webhook_namespace
                .clone()
                .unwrap_or_else(|| lease_namespace.to_string()),
            extra_hosts: args.webhook_hosts.clone(),
        },
        tenancy: args.tenancy(),
    }
}

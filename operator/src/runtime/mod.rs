//! `planner-operator run`: the long-running operator process. Wires the client, the health and
//! metrics server (`health`), the admission webhook (`webhook`), leader election
//! (`leader`, fenced by `fence`) and the controllers (`controllers`), and shuts down
//! cleanly on SIGTERM.

mod args;
mod controllers;
mod error;
mod fence;
mod health;
mod leader;
mod webhook;

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use kube::Client;
use tokio::sync::watch;
use tracing::{error, info};

pub use args::{DynamoNamespaceEntryError, RunArgs};
pub use error::RunError;
pub use fence::{FencedWrite, LeaseFence, fenced_client, lease_validity};
pub use health::Health;
pub use leader::step_down_recovery;

use crate::{metrics::operator::OperatorMetrics, telemetry};

/// Runs the operator until SIGTERM or Ctrl-C.
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    telemetry::init(args.log_format);
    let client = Client::try_default().await.map_err(RunError::Client)?;
    run_until(args, client, wait_for_signal()).await
}

/// Runs the operator with `client` until `stop` resolves (a signal in production; tests run the
/// operator in process and stop it themselves).
pub async fn run_until(
    args: RunArgs,
    client: Client,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let metrics = Arc::new(OperatorMetrics::new());
    let ready = Arc::new(AtomicBool::new(false));
    let health = Arc::new(Health::default());
    let (shutdown_tx, shutdown_rx) = shutdown_on(stop);

    let lease_namespace = args
        .lease_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    // Every replica serves the webhook; only the leader reconciles.
    let webhook = webhook::start(
        &args,
        &client,
        &lease_namespace,
        &metrics,
        shutdown_signal(shutdown_rx.clone()),
    )
    .await?;
    let server_state = health::ServerState {
        metrics: Arc::clone(&metrics),
        ready: Arc::clone(&ready),
        webhook: webhook.as_ref().map(|w| Arc::clone(&w.resolver)),
        health: Arc::clone(&health),
    };
    let server = health::start(
        args.metrics_addr,
        server_state,
        shutdown_signal(shutdown_rx.clone()),
    )
    .await?;
    // Not ready until the CRDs are served: `kubectl apply` of the CRDs returns before they are
    // Established, and a chart's pod may start first.
    if controllers::wait_for_crds(
        &client,
        args.namespace.as_deref(),
        args.dgd_controller,
        shutdown_rx.clone(),
    )
    .await
    {
        ready.store(true, Ordering::Relaxed);
    }

    let identity = args.identity.clone().unwrap_or_else(args::default_identity);
    let outcome = if *shutdown_rx.borrow() {
        // Stopped while waiting for the CRDs.
        Ok(())
    } else if args.leader_election {
        leader::lead(
            &client,
            &args,
            &identity,
            &lease_namespace,
            &metrics,
            &health,
            &shutdown_rx,
        )
        .await
    } else {
        run_without_election(&client, &args, &identity, &metrics, &health, &shutdown_rx).await
    };
    ready.store(false, Ordering::Relaxed);
    if let Some(webhook) = webhook {
        webhook.stopped().await;
    }
    if outcome.is_err() {
        // Stop the server and the webhook too: the process exits.
        shutdown_tx.send_replace(true);
    }
    let _ = server.await;
    info!("stopped");
    outcome
}

/// Without leader election this process is the leader: it runs the controllers until shutdown,
/// and fails when they stop on their own.
async fn run_without_election(
    client: &Client,
    args: &RunArgs,
    identity: &str,
    metrics: &Arc<OperatorMetrics>,
    health: &Health,
    shutdown_rx: &watch::Receiver<bool>,
) -> Result<(), RunError> {
    metrics.set_leader(true);
    controllers::run_controllers(
        client,
        args,
        identity,
        Arc::clone(metrics),
        shutdown_signal(shutdown_rx.clone()),
    )
    .await;
    if *shutdown_rx.borrow() {
        return Ok(());
    }
    error!("the controllers stopped on their own; exiting");
    health.controllers_stopped();
    Err(RunError::ControllersStopped)
}

/// The shutdown flag every task watches, raised once `stop` resolves (or by the process itself
/// when it exits on an error).
fn shutdown_on(
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (Arc<watch::Sender<bool>>, watch::Receiver<bool>) {
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shutdown_tx = Arc::new(shutdown_tx);
    {
        let shutdown_tx = Arc::clone(&shutdown_tx);
        tokio::spawn(async move {
            stop.await;
            info!("shutdown requested");
            shutdown_tx.send_replace(true);
        });
    }
    (shutdown_tx, shutdown_rx)
}

/// Resolves once the shutdown flag is raised.
async fn shutdown_signal(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Resolves on SIGTERM or Ctrl-C (Ctrl-C only where there is no SIGTERM).
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

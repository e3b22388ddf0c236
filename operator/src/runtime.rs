//! `planner-operator run`: the long-running operator process. Wires the client, the health and
//! metrics server, leader election and the controllers, and shuts down cleanly on SIGTERM.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client, ResourceExt,
    api::ListParams,
    runtime::{
        WatchStreamExt,
        events::{Recorder, Reporter},
        reflector, watcher,
    },
};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::{
    api::{DynamoGraphDeployment, PlannerPolicy},
    controller::{self, Context, dgd::render::LABEL_GRAPH},
    metrics::operator::OperatorMetrics,
    telemetry::{self, LogFormat},
};

/// Configuration of `planner-operator run`, from flags or the environment.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Address of the health (`/healthz`, `/readyz`) and metrics (`/metrics`) server.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Elect a leader through a Lease so that only one replica writes.
    #[arg(long, env = "LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Name of the leader-election Lease.
    #[arg(long, env = "LEASE_NAME", default_value = "planner-operator-leader")]
    pub lease_name: String,
    /// Namespace of the Lease (default: the pod's namespace, else the kubeconfig's).
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Seconds a leader's lease stays valid without renewal.
    #[arg(long, env = "LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// This process's identity in the Lease and in Events (default: the pod name, else host and pid).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Prometheus base URL used by PlannerPolicies that do not name one.
    #[arg(
        long,
        env = "PROMETHEUS_URL",
        default_value = "http://prometheus-operated.monitoring.svc:9090"
    )]
    pub prometheus_url: String,
}

/// Why the operator could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No usable kubeconfig or in-cluster config.
    #[error("cannot configure a Kubernetes client (set KUBECONFIG or run in a pod): {0}")]
    Client(#[source] kube::Error),
    /// The CRDs are not installed or not readable.
    #[error(
        "cannot list {kind}: {source}. Is the CRD installed? `planner-operator crd | kubectl apply --server-side -f -`"
    )]
    MissingCrd {
        /// The kind.
        kind: &'static str,
        /// The API error.
        source: kube::Error,
    },
    /// The health and metrics server could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// Leader election could not start.
    #[error("cannot start leader election on Lease {namespace}/{name}: {source}")]
    LeaderElection {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// The error.
        source: kube_lease_manager::LeaseManagerError,
    },
}

#[derive(Clone)]
struct ServerState {
    metrics: Arc<OperatorMetrics>,
    ready: Arc<AtomicBool>,
}

/// Runs the operator until SIGTERM or Ctrl-C.
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    telemetry::init(args.log_format);
    let client = Client::try_default().await.map_err(RunError::Client)?;
    preflight(&client, args.namespace.as_deref()).await?;

    let metrics = Arc::new(OperatorMetrics::new());
    let ready = Arc::new(AtomicBool::new(false));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        info!("shutdown requested");
        let _ = shutdown_tx.send(true);
    });

    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|source| RunError::Listen {
            addr: args.metrics_addr,
            source,
        })?;
    let server_state = ServerState {
        metrics: Arc::clone(&metrics),
        ready: Arc::clone(&ready),
    };
    let server_shutdown = shutdown_signal(shutdown_rx.clone());
    let server = tokio::spawn(async move {
        let router = Router::new()
            .route("/metrics", get(serve_metrics))
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(serve_ready))
            .with_state(server_state);
        if let Err(error) = axum::serve(listener, router)
            .with_graceful_shutdown(server_shutdown)
            .await
        {
            error!(%error, "health and metrics server failed");
        }
    });
    info!(addr = %args.metrics_addr, "serving /metrics, /healthz and /readyz");
    ready.store(true, Ordering::Relaxed);

    let identity = args.identity.clone().unwrap_or_else(default_identity);
    if args.leader_election {
        let lease_namespace = args
            .lease_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &args.lease_name)
            .with_namespace(&lease_namespace)
            .with_identity(&identity)
            .with_duration(args.lease_duration_seconds)
            .with_grace(args.lease_duration_seconds.div_ceil(3).max(2))
            .build()
            .await
            .map_err(|source| RunError::LeaderElection {
                namespace: lease_namespace.clone(),
                name: args.lease_name.clone(),
                source,
            })?;
        let (mut leading, lease_task) = manager.watch().await;
        info!(%identity, lease = %format!("{lease_namespace}/{}", args.lease_name), "waiting to become the leader");
        let mut shutdown = shutdown_rx.clone();
        loop {
            tokio::select! {
                changed = leading.changed() => if changed.is_err() { warn!("leader election stopped"); break; },
                _ = shutdown.changed() => break,
            }
            if !*leading.borrow() {
                continue;
            }
            info!(%identity, "became the leader; starting controllers");
            metrics.set_leader(true);
            let mut lost = leading.clone();
            let stop = {
                let mut shutdown = shutdown_rx.clone();
                async move {
                    tokio::select! {
                        _ = lost.wait_for(|leader| !*leader) => {},
                        _ = shutdown.wait_for(|stop| *stop) => {},
                    }
                }
            };
            run_controllers(&client, &args, &identity, Arc::clone(&metrics), stop).await;
            metrics.set_leader(false);
            if *shutdown_rx.borrow() {
                break;
            }
            warn!(%identity, "lost the leader lease; controllers stopped until it is regained");
        }
        // Dropping the receiver releases the lease, so a standby takes over at once.
        drop(leading);
        match tokio::time::timeout(Duration::from_secs(5), lease_task).await {
            Ok(Ok(Err(error))) => warn!(%error, "releasing the lease failed"),
            Err(_) => warn!("timed out releasing the lease"),
            _ => info!("released the leader lease"),
        }
    } else {
        metrics.set_leader(true);
        run_controllers(
            &client,
            &args,
            &identity,
            Arc::clone(&metrics),
            shutdown_signal(shutdown_rx.clone()),
        )
        .await;
    }
    ready.store(false, Ordering::Relaxed);
    let _ = server.await;
    info!("stopped");
    Ok(())
}

/// Runs every controller until `stop` resolves.
async fn run_controllers(
    client: &Client,
    args: &RunArgs,
    identity: &str,
    metrics: Arc<OperatorMetrics>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let deployments_api: Api<Deployment> = match &args.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    // Keep only what status needs, so 500 graphs fit in a few megabytes.
    let (store, writer) = reflector::store();
    let deployments = watcher(
        deployments_api,
        watcher::Config::default().labels(LABEL_GRAPH).any_semantic(),
    )
    .default_backoff()
    .modify(|d: &mut Deployment| {
        d.managed_fields_mut().clear();
        d.annotations_mut().clear();
        d.spec = None;
    })
    .reflect(writer)
    .touched_objects();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "planner-operator".into(),
            instance: Some(identity.to_string()),
        },
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        recorder,
        metrics,
        deployments: store,
    });
    let stop = stop.shared();
    let planner_ctx = Arc::new(controller::planner_policy::PlannerContext::new(
        Arc::clone(&ctx),
        args.prometheus_url.clone(),
    ));
    tokio::join!(
        controller::dgd::run(ctx, deployments, args.namespace.clone(), stop.clone()),
        controller::planner_policy::run(planner_ctx, args.namespace.clone(), stop),
    );
}

/// Fails early, with a hint, when the CRDs this operator needs are missing.
async fn preflight(client: &Client, namespace: Option<&str>) -> Result<(), RunError> {
    let params = ListParams::default().limit(1);
    let dgds: Api<DynamoGraphDeployment> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    dgds.list_metadata(&params)
        .await
        .map_err(|source| RunError::MissingCrd {
            kind: "DynamoGraphDeployments",
            source,
        })?;
    let policies: Api<PlannerPolicy> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    policies
        .list_metadata(&params)
        .await
        .map_err(|source| RunError::MissingCrd {
            kind: "PlannerPolicies",
            source,
        })?;
    Ok(())
}

async fn serve_metrics(State(state): State<ServerState>) -> impl IntoResponse {
    match state.metrics.encode() {
        Ok(text) => (
            StatusCode::OK,
            [(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        ),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain")],
            error.to_string(),
        ),
    }
}

async fn serve_ready(State(state): State<ServerState>) -> impl IntoResponse {
    if state.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn shutdown_signal(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

pub(crate) async fn wait_for_signal() {
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

fn default_identity() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "planner-operator".to_string()
    } else {
        host
    };
    format!("{host}-{}", std::process::id())
}

//! `planner-operator run`: the long-running operator process. Wires the client, the health and
//! metrics server, leader election and the controllers, and shuts down cleanly on SIGTERM.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Pod, PodSpec},
};
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

use planner_api::{DynamoGraphDeployment, PlannerPolicy};

use crate::{
    controller::{self, Context},
    lookup::{self, ClusterTopologyApi},
    metrics::operator::OperatorMetrics,
    telemetry::{self, LogFormat},
    webhook::{self, WebhookSettings, certs::CertSettings, tls::CertResolver},
};
use planner_api::labels::LABEL_GRAPH;

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
    /// Group and version Grove serves ClusterTopologies under.
    #[arg(
        long,
        env = "CLUSTER_TOPOLOGY_API_VERSION",
        default_value = "grove.io/v1alpha1"
    )]
    pub cluster_topology_api_version: ClusterTopologyApi,
    /// Do not serve the admission webhook (e.g. when another replica set serves it).
    #[arg(long, env = "WEBHOOK_DISABLED")]
    pub webhook_disabled: bool,
    /// Address of the admission webhook's HTTPS server (served on every replica).
    #[arg(long, env = "WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,
    /// Serve `tls.crt` and `tls.key` from this directory (a mounted Secret, e.g. from
    /// cert-manager), reloaded when they change; its `ca.crt`, if any, is patched into the
    /// caBundle. Without it, the operator generates a CA and serving certificate and keeps them
    /// in the Secret `--webhook-secret`.
    #[arg(long, env = "WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<PathBuf>,
    /// ValidatingWebhookConfiguration whose caBundle the operator keeps current; empty: leave
    /// the caBundle alone (cert-manager's CA injector, or a caBundle set at install).
    #[arg(long, env = "WEBHOOK_CONFIG_NAME", default_value = "planner-operator")]
    pub webhook_config_name: String,
    /// Service in front of the webhook; generated certificates are valid for
    /// `<service>.<namespace>.svc` and its other in-cluster names.
    #[arg(long, env = "WEBHOOK_SERVICE", default_value = "planner-operator-webhook")]
    pub webhook_service: String,
    /// Namespace of that Service and of the certificate Secret (default: the Lease namespace).
    #[arg(long, env = "WEBHOOK_NAMESPACE")]
    pub webhook_namespace: Option<String>,
    /// Secret that holds generated certificates, shared by every replica.
    #[arg(long, env = "WEBHOOK_SECRET", default_value = "planner-operator-webhook-cert")]
    pub webhook_secret: String,
    /// More DNS names or IP addresses for generated certificates (comma-separated or repeated),
    /// e.g. 127.0.0.1 when the API server calls the webhook by URL.
    #[arg(long = "webhook-host", env = "WEBHOOK_HOSTS", value_delimiter = ',')]
    pub webhook_hosts: Vec<String>,
}

/// Why the operator could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No usable kubeconfig or in-cluster config.
    #[error("cannot configure a Kubernetes client (set KUBECONFIG or run in a pod): {0}")]
    Client(#[source] kube::Error),
    /// The health and metrics server could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// The admission webhook could not start.
    #[error("cannot start the admission webhook: {0}")]
    Webhook(#[from] webhook::WebhookError),
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
    /// The webhook's certificate, when it serves: not ready until one is loaded.
    webhook: Option<Arc<CertResolver>>,
}

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
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    tokio::spawn(async move {
        stop.await;
        info!("shutdown requested");
        let _ = shutdown_tx.send(true);
    });

    let lease_namespace = args
        .lease_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    // Every replica serves the webhook; only the leader reconciles.
    let webhook = if args.webhook_disabled {
        info!("admission webhook disabled");
        None
    } else {
        let settings = WebhookSettings {
            addr: args.webhook_addr,
            cert_dir: args.webhook_cert_dir.clone(),
            config_name: Some(args.webhook_config_name.clone()).filter(|n| !n.is_empty()),
            secret_name: args.webhook_secret.clone(),
            cert: CertSettings {
                service: args.webhook_service.clone(),
                namespace: args
                    .webhook_namespace
                    .clone()
                    .unwrap_or_else(|| lease_namespace.clone()),
                extra_hosts: args.webhook_hosts.clone(),
            },
        };
        Some(
            webhook::start(
                settings,
                client.clone(),
                args.cluster_topology_api_version.clone(),
                Arc::clone(&metrics),
                shutdown_signal(shutdown_rx.clone()),
            )
            .await?,
        )
    };

    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|source| RunError::Listen {
            addr: args.metrics_addr,
            source,
        })?;
    let server_state = ServerState {
        metrics: Arc::clone(&metrics),
        ready: Arc::clone(&ready),
        webhook: webhook.as_ref().map(|w| Arc::clone(&w.resolver)),
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
    // Not ready until the CRDs are served: `kubectl apply` of the CRDs returns before they are
    // Established, and a chart's pod may start first.
    if wait_for_crds(&client, args.namespace.as_deref(), shutdown_rx.clone()).await {
        ready.store(true, Ordering::Relaxed);
    }

    let identity = args.identity.clone().unwrap_or_else(default_identity);
    if *shutdown_rx.borrow() {
        // Stopped while waiting for the CRDs.
    } else if args.leader_election {
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
    if let Some(webhook) = webhook {
        webhook.stopped().await;
    }
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
    // One pod watch for the topology label controller and the DGD reconciler's counts, trimmed
    // to what they read.
    let pods_api: Api<Pod> = match &args.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (pod_store, pod_writer) = reflector::store_shared(1024);
    let (Some(label_pods), Some(count_pods)) = (pod_writer.subscribe(), pod_writer.subscribe()) else {
        error!("cannot subscribe to the shared pod cache; controllers not started");
        return;
    };
    let pod_watch = watcher(
        pods_api,
        watcher::Config::default().labels(LABEL_GRAPH).any_semantic(),
    )
    .default_backoff()
    .modify(trim_pod)
    .reflect_shared(pod_writer)
    .for_each(|event| async move {
        if let Err(error) = event {
            warn!(%error, "pod watch failed; retrying");
        }
    });
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
        pods: pod_store.clone(),
        cluster_topology_api: args.cluster_topology_api_version.clone(),
    });
    // Watch ClusterTopologies only where they are served; without Grove the periodic resync
    // re-checks DGDs that name one.
    let topology_api = &args.cluster_topology_api_version;
    let cluster_topologies = match lookup::cluster_topologies_served(client, topology_api).await {
        Ok(true) => Some(topology_api.resource()),
        Ok(false) => {
            info!(api = %topology_api, "ClusterTopologies are not served (Grove not installed); not watching them");
            None
        }
        Err(error) => {
            warn!(%error, "cannot tell whether ClusterTopologies are served; not watching them");
            None
        }
    };
    let stop = stop.shared();
    let planner_ctx = Arc::new(controller::planner_policy::PlannerContext::new(
        Arc::clone(&ctx),
        args.prometheus_url.clone(),
    ));
    let controllers = futures::future::join3(
        controller::dgd::run(
            Arc::clone(&ctx),
            deployments,
            controller::topology_labels::label_changes(count_pods),
            cluster_topologies,
            args.namespace.clone(),
            stop.clone(),
        ),
        controller::topology_labels::run(ctx, label_pods, pod_store, stop.clone()),
        controller::planner_policy::run(planner_ctx, args.namespace.clone(), stop),
    );
    tokio::select! {
        _ = controllers => {},
        () = pod_watch => warn!("pod watch ended"),
    }
}

/// Keeps only what the topology label controller and the DGD status read of a pod.
fn trim_pod(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
    pod.annotations_mut()
        .retain(|key, _| key == crate::topology::LABELS_ANNOTATION);
    let node_name = pod.spec.as_mut().and_then(|s| s.node_name.take());
    pod.spec = Some(PodSpec {
        node_name,
        ..PodSpec::default()
    });
    pod.status = None;
}

/// First and longest wait between checks for the CRDs.
const CRD_RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));

/// Waits, with backoff, until the API server serves the CRDs this operator reads; `false` when
/// shutdown was requested first.
async fn wait_for_crds(
    client: &Client,
    namespace: Option<&str>,
    mut shutdown: watch::Receiver<bool>,
) -> bool {
    let mut delay = CRD_RETRY.0;
    loop {
        let missing = match crds_served(client, namespace).await {
            Ok(()) => return true,
            Err(missing) => missing,
        };
        warn!(
            crd = missing.0,
            error = %crate::controller::common::chain(&missing.1),
            retry_in = ?delay,
            "waiting for the CRD to be served (install the CRDs: `planner-operator crd | kubectl apply --server-side -f -`); not ready until then"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {},
            _ = shutdown.wait_for(|stop| *stop) => return false,
        }
        delay = (delay * 2).min(CRD_RETRY.1);
    }
}

/// Lists one object of each CRD the controllers watch; the error names the CRD that failed.
async fn crds_served(client: &Client, namespace: Option<&str>) -> Result<(), (&'static str, kube::Error)> {
    let params = ListParams::default().limit(1);
    let dgds: Api<DynamoGraphDeployment> = crate::controller::common::scoped_api(client.clone(), namespace);
    dgds.list_metadata(&params)
        .await
        .map_err(|e| ("dynamographdeployments.nvidia.com", e))?;
    let policies: Api<PlannerPolicy> = crate::controller::common::scoped_api(client.clone(), namespace);
    policies
        .list_metadata(&params)
        .await
        .map_err(|e| ("plannerpolicies.planner.dynamo.io", e))?;
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
    if !state.ready.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    } else if state.webhook.as_ref().is_some_and(|w| !w.is_ready()) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no webhook certificate yet",
        )
    } else {
        (StatusCode::OK, "ready")
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

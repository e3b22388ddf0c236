//! `planner-operator run`: the long-running operator process. Wires the client, the health and
//! metrics server, leader election and the controllers, and shuts down cleanly on SIGTERM.
//!
//! Leadership is fenced. The lease library keeps saying "leader" while it retries a failed
//! renewal, and a process frozen past its lease (SIGSTOP, a stalled node, a long GC-like pause)
//! wakes up still believing it leads. So this process reads its Lease itself every few seconds
//! and knows until when the lease is certainly its own: its `renewTime` plus its duration, less a
//! margin ([`lease_validity`]). Every write the controllers make goes through a client that
//! refuses it once that time has passed, whichever task notices first after a pause; and when it
//! passes while the controllers run, they are stopped (a step-down), to start again only when
//! the lease is confirmed ours again. `/healthz` fails when the controllers stopped on their own
//! while leading (the process then releases the lease and exits non-zero), and when a step-down
//! has not recovered (leading again, or standing by) within [`step_down_recovery`].

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    extract::State,
    http::{Method, StatusCode},
    response::IntoResponse,
    routing::get,
};
use futures::{FutureExt, StreamExt};
use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{Pod, PodSpec},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::ListParams,
    runtime::{WatchStreamExt, events::Reporter, reflector, watcher},
};
use tokio::{sync::watch, time::Instant};
use tracing::{debug, error, info, warn};

use planner_api::{DynamoGraphDeployment, PlannerPolicy};

use crate::{
    controller::{self, Context, selection::DgdSelection},
    lookup::{self, ClusterTopologyApi},
    metrics::operator::OperatorMetrics,
    telemetry::{self, LogFormat},
    topology::EnvContract,
    validation::{PrometheusUrlPolicy, Tenancy},
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
    /// Group and version Grove serves ClusterTopologyBindings (and, in earlier releases,
    /// ClusterTopologies) under.
    #[arg(
        long,
        env = "CLUSTER_TOPOLOGY_API_VERSION",
        default_value = "grove.io/v1alpha1"
    )]
    pub cluster_topology_api_version: ClusterTopologyApi,
    /// Run the DGD reconciler and the topology label controller (render DGDs into Deployments
    /// and Services, write their status, copy topology labels onto pods). Off: planner-only
    /// operation next to NVIDIA's Dynamo operator, which renders the DGDs; only PlannerPolicies
    /// are reconciled and a DGD is only ever written to scale its replicas.
    #[arg(long, env = "DGD_CONTROLLER", default_value_t = true, action = clap::ArgAction::Set)]
    pub dgd_controller: bool,
    /// Which DGDs the DGD reconciler renders: `unmarked` (every DGD not marked as another
    /// controller's) or `marked` (only those labelled planner.dynamo.io/dgd-controller=planner-operator).
    #[arg(long, env = "DGD_SELECTION", value_enum, default_value = "unmarked")]
    pub dgd_selection: DgdSelection,
    /// Environment contract of the topology injected into worker pods: `dynamo` (the released
    /// Dynamo runtime's DYN_KV_TRANSFER_DOMAIN, DYN_TOPOLOGY_MOUNT_PATH, files at
    /// /etc/dynamo/topology; what a stock Dynamo >= 1.2 worker reads) or `planner` (this
    /// operator's first names, DYN_ROUTER_KV_TRANSFER_*, files at /etc/podinfo/topology, for
    /// runtimes built to read them: a stock worker exits at start-up under it). A DGD's
    /// planner.dynamo.io/topology-env annotation overrides it.
    #[arg(long, env = "TOPOLOGY_ENV", value_enum, default_value_t = EnvContract::default())]
    pub topology_env: EnvContract,
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
    /// Dynamo namespaces PlannerPolicies may name besides their target graph's own
    /// (`<namespace>-<dgd>`), in spec.metrics.dynamoNamespace and the virtual connector's
    /// spec.connector.dynamoNamespace (comma-separated or repeated): `<namespace>/<dynamo
    /// namespace>` allows it to policies in that namespace, `*/<dynamo namespace>` to all, `*`
    /// allows any (single-tenant clusters).
    #[arg(long, env = "ALLOWED_DYNAMO_NAMESPACES", value_delimiter = ',', value_parser = dynamo_namespace_allowance)]
    pub allowed_dynamo_namespaces: Vec<String>,
    /// Which Prometheus URLs PlannerPolicies may name in spec.metrics.prometheus.url: `any`,
    /// `default-only` (only --prometheus-url) or `allow-list` (--prometheus-url and
    /// --allowed-prometheus-url).
    #[arg(long, env = "PROMETHEUS_URL_POLICY", value_enum, default_value = "any")]
    pub prometheus_url_policy: PrometheusUrlPolicy,
    /// Prometheus URLs allowed with --prometheus-url-policy=allow-list (comma-separated or
    /// repeated; compared whole, trailing slashes aside).
    #[arg(
        long = "allowed-prometheus-url",
        env = "ALLOWED_PROMETHEUS_URLS",
        value_delimiter = ','
    )]
    pub allowed_prometheus_urls: Vec<String>,
    /// etcd endpoints the virtual connector may write to (comma-separated or repeated; default:
    /// any).
    #[arg(
        long = "allowed-etcd-endpoint",
        env = "ALLOWED_ETCD_ENDPOINTS",
        value_delimiter = ','
    )]
    pub allowed_etcd_endpoints: Vec<String>,
    /// Let PlannerPolicies name a Secret in their namespace holding a bearer token for
    /// Prometheus (spec.metrics.prometheus.bearerTokenSecret); needs `get` on Secrets in the
    /// watched namespaces.
    #[arg(long, env = "PROMETHEUS_TOKEN_SECRETS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub prometheus_token_secrets: bool,
}

/// An entry of --allowed-dynamo-namespaces: `*`, `*/<name>` or `<namespace>/<name>`.
fn dynamo_namespace_allowance(entry: &str) -> Result<String, String> {
    let valid = entry == "*"
        || entry
            .split_once('/')
            .is_some_and(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'));
    if valid {
        Ok(entry.to_string())
    } else {
        Err(format!(
            "{entry:?}: allowed: * (any), */<dynamo namespace> (every policy) or <namespace>/<dynamo namespace>"
        ))
    }
}

impl RunArgs {
    /// What PlannerPolicies may name, from the tenancy flags.
    pub fn tenancy(&self) -> Tenancy {
        Tenancy {
            dynamo_namespaces: self.allowed_dynamo_namespaces.clone(),
            prometheus: self.prometheus_url_policy,
            default_prometheus_url: self.prometheus_url.clone(),
            prometheus_urls: self.allowed_prometheus_urls.clone(),
            etcd_endpoints: self.allowed_etcd_endpoints.clone(),
            token_secrets: self.prometheus_token_secrets,
        }
    }
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
    /// The controllers stopped while this process was the leader (and not asked to stop): the
    /// lease was released, and the process exits so that it is restarted.
    #[error("the controllers stopped while this process was the leader; lease released, exiting")]
    ControllersStopped,
}

#[derive(Clone)]
struct ServerState {
    metrics: Arc<OperatorMetrics>,
    ready: Arc<AtomicBool>,
    /// The webhook's certificate, when it serves: not ready until one is loaded.
    webhook: Option<Arc<CertResolver>>,
    health: Arc<Health>,
}

/// What `/healthz` reports on.
#[derive(Debug, Default)]
pub struct Health {
    /// The controllers stopped on their own while this process led.
    controllers_stopped: AtomicBool,
    /// When the last step-down happened, until it recovers; and how long it may take.
    stepped_down: Mutex<Option<(Instant, Duration)>>,
}

impl Health {
    /// Why the process is not healthy, if it is not.
    pub fn problem(&self) -> Option<String> {
        if self.controllers_stopped.load(Ordering::Relaxed) {
            return Some("the controllers stopped while this process was the leader".into());
        }
        let stepped_down = *self.stepped_down.lock().unwrap_or_else(PoisonError::into_inner);
        match stepped_down {
            Some((at, recovery)) if at.elapsed() > recovery => Some(format!(
                "stepped down {}s ago (the leader lease was not renewed in time) and neither leads nor stands by since",
                at.elapsed().as_secs()
            )),
            _ => None,
        }
    }

    fn stepped_down(&self, recovery: Duration) {
        *self.stepped_down.lock().unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), recovery));
    }

    fn recovered(&self) {
        *self.stepped_down.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// Until when this process may write as the leader: the expiry of its lease as last read from
/// the API server, less a margin; `None` when the lease is not (known to be) its own. Shared by
/// the lease reader, the fenced client and the step-down watchdog.
#[derive(Clone, Debug)]
pub struct LeaseFence {
    valid_until: Arc<watch::Sender<Option<Instant>>>,
}

impl Default for LeaseFence {
    fn default() -> Self {
        Self {
            valid_until: Arc::new(watch::Sender::new(None)),
        }
    }
}

impl LeaseFence {
    /// Whether a write may be sent now.
    pub fn allows_writes(&self) -> bool {
        self.valid_until
            .borrow()
            .is_some_and(|until| Instant::now() < until)
    }

    /// Records what the last read of the lease showed.
    pub fn set(&self, valid_until: Option<Instant>) {
        self.valid_until.send_replace(valid_until);
    }

    /// Resolves once the lease's validity has passed without being extended (at once when it
    /// is not known to be ours).
    pub async fn expired(&self) {
        let mut updates = self.valid_until.subscribe();
        loop {
            let until = *updates.borrow_and_update();
            let Some(until) = until.filter(|until| Instant::now() < *until) else {
                return;
            };
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                changed = updates.changed() => if changed.is_err() { return; },
            }
        }
    }

    /// Resolves once writes are allowed.
    async fn confirmed(&self) {
        let mut updates = self.valid_until.subscribe();
        loop {
            if self.allows_writes() {
                return;
            }
            if updates.changed().await.is_err() {
                return;
            }
        }
    }
}

/// Until when a lease read at `sent` (monotonic) / `wall` (wall clock, when the request was sent)
/// is certainly held by `identity`: its renewal time plus its duration, less `margin` (for the
/// request's own latency and other replicas' clocks), and never further than one duration from
/// `sent`. `None` when someone else (or nobody) holds it.
pub fn lease_validity(
    spec: &LeaseSpec,
    identity: &str,
    sent: Instant,
    wall: Timestamp,
    margin: Duration,
) -> Option<Instant> {
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    let duration = Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?);
    let since_renewal = wall.duration_since(renewed);
    // Time left before another replica may take the lease, by our clock (a renewal in our
    // future, from a faster clock, counts as now).
    let left = if since_renewal.is_negative() {
        duration
    } else {
        duration.saturating_sub(Duration::try_from(since_renewal).ok()?)
    };
    Some(sent + left.saturating_sub(margin))
}

/// How long after a step-down `/healthz` waits for the process to lead again or stand by.
pub fn step_down_recovery(lease_duration: Duration) -> Duration {
    lease_duration * 2 + Duration::from_secs(10)
}

/// Reads the lease every `period` and records in `fence` until when it is certainly ours.
async fn watch_lease(
    leases: Api<Lease>,
    name: String,
    identity: String,
    margin: Duration,
    period: Duration,
    fence: LeaseFence,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (sent, wall) = (Instant::now(), Timestamp::now());
        match leases.get_opt(&name).await {
            Ok(lease) => {
                let until = lease
                    .and_then(|l| l.spec)
                    .and_then(|spec| lease_validity(&spec, &identity, sent, wall, margin));
                fence.set(until);
            }
            // Keep what is known: it expires by itself.
            Err(error) => debug!(%error, "cannot read the leader lease"),
        }
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// Why the fenced client refused a request.
#[derive(Debug, thiserror::Error)]
#[error(
    "{method} {path} refused: this process's leader lease is not confirmed (not renewed before its deadline, or held by another replica)"
)]
pub struct FencedWrite {
    method: Method,
    path: String,
}

/// A client that sends reads as `client` does, and writes only while `fence` allows them.
pub fn fenced_client(client: Client, fence: LeaseFence) -> Client {
    let default_namespace = client.default_namespace().to_string();
    let service = tower::service_fn(move |request: axum::http::Request<kube::client::Body>| {
        let (client, fence) = (client.clone(), fence.clone());
        async move {
            let read = matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
            if !read && !fence.allows_writes() {
                let refused = FencedWrite {
                    method: request.method().clone(),
                    path: request.uri().path().to_string(),
                };
                warn!(%refused, "write refused");
                return Err::<_, Box<dyn std::error::Error + Send + Sync>>(Box::new(refused));
            }
            client.send(request).await.map_err(|e| Box::new(e) as _)
        }
    });
    Client::new(service, default_namespace)
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
    let health = Arc::new(Health::default());
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
            tenancy: args.tenancy(),
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
        health: Arc::clone(&health),
    };
    let server_shutdown = shutdown_signal(shutdown_rx.clone());
    let server = tokio::spawn(async move {
        let router = Router::new()
            .route("/metrics", get(serve_metrics))
            .route("/healthz", get(serve_health))
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
    if wait_for_crds(
        &client,
        args.namespace.as_deref(),
        args.dgd_controller,
        shutdown_rx.clone(),
    )
    .await
    {
        ready.store(true, Ordering::Relaxed);
    }

    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let mut outcome = Ok(());
    if *shutdown_rx.borrow() {
        // Stopped while waiting for the CRDs.
    } else if args.leader_election {
        outcome = lead(
            &client,
            &args,
            &identity,
            &lease_namespace,
            &metrics,
            &health,
            &shutdown_rx,
        )
        .await;
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
        if !*shutdown_rx.borrow() {
            error!("the controllers stopped on their own; exiting");
            health.controllers_stopped.store(true, Ordering::Relaxed);
            outcome = Err(RunError::ControllersStopped);
        }
    }
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

/// Why the controllers of one term as leader stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TermEnd {
    /// Shutdown was requested.
    Shutdown,
    /// The lease library reports another holder.
    Lost,
    /// The lease was not confirmed before its deadline: the controllers were stopped.
    SteppedDown,
}

/// Leader election: runs the controllers while this process holds the lease and it is
/// confirmed (see [`LeaseFence`]); returns when shutdown is requested, or with an error when
/// the controllers stopped on their own while leading.
async fn lead(
    client: &Client,
    args: &RunArgs,
    identity: &str,
    lease_namespace: &str,
    metrics: &Arc<OperatorMetrics>,
    health: &Arc<Health>,
    shutdown_rx: &watch::Receiver<bool>,
) -> Result<(), RunError> {
    let duration = args.lease_duration_seconds.max(2);
    let grace = duration.div_ceil(3).max(1).min(duration - 1);
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &args.lease_name)
        .with_namespace(lease_namespace)
        .with_identity(identity)
        .with_duration(duration)
        .with_grace(grace)
        .build()
        .await
        .map_err(|source| RunError::LeaderElection {
            namespace: lease_namespace.to_string(),
            name: args.lease_name.clone(),
            source,
        })?;
    // The lease is renewed `grace` seconds before it expires; writes stop half of that before.
    let margin = Duration::from_secs(grace) / 2;
    let fence = LeaseFence::default();
    let watcher = tokio::spawn(watch_lease(
        Api::namespaced(client.clone(), lease_namespace),
        args.lease_name.clone(),
        identity.to_string(),
        margin,
        (Duration::from_secs(grace) / 2).max(Duration::from_millis(500)),
        fence.clone(),
        shutdown_rx.clone(),
    ));
    let fenced = fenced_client(client.clone(), fence.clone());
    let recovery = step_down_recovery(Duration::from_secs(duration));
    let (mut leading, lease_task) = manager.watch().await;
    info!(%identity, lease = %format!("{lease_namespace}/{}", args.lease_name), "waiting to become the leader");
    let mut shutdown = shutdown_rx.clone();
    let mut outcome = Ok(());
    loop {
        let leader = *leading.borrow_and_update();
        if !leader {
            health.recovered();
        }
        if leader && fence.allows_writes() {
            info!(%identity, "became the leader; starting controllers");
            health.recovered();
            metrics.set_leader(true);
            let ended = Arc::new(Mutex::new(None));
            let stop = {
                let (mut lost, mut shutdown, fence, ended) = (
                    leading.clone(),
                    shutdown_rx.clone(),
                    fence.clone(),
                    Arc::clone(&ended),
                );
                async move {
                    let end = tokio::select! {
                        _ = shutdown.wait_for(|stop| *stop) => TermEnd::Shutdown,
                        _ = lost.wait_for(|leader| !*leader) => TermEnd::Lost,
                        () = fence.expired() => TermEnd::SteppedDown,
                    };
                    *ended.lock().unwrap_or_else(PoisonError::into_inner) = Some(end);
                }
            };
            run_controllers(&fenced, args, identity, Arc::clone(metrics), stop).await;
            metrics.set_leader(false);
            // `None`: the controllers returned before anything asked them to stop.
            let end = *ended.lock().unwrap_or_else(PoisonError::into_inner);
            if *shutdown_rx.borrow() {
                break;
            }
            match end {
                Some(TermEnd::Lost) => {
                    warn!(%identity, "lost the leader lease; controllers stopped until it is regained");
                }
                Some(TermEnd::SteppedDown) => {
                    warn!(
                        %identity,
                        "the leader lease was not renewed before its deadline; stepped down (controllers stopped, writes refused) until it is confirmed again"
                    );
                    health.stepped_down(recovery);
                }
                Some(TermEnd::Shutdown) | None => {
                    error!(%identity, "the controllers stopped on their own while leading; releasing the lease and exiting");
                    health.controllers_stopped.store(true, Ordering::Relaxed);
                    outcome = Err(RunError::ControllersStopped);
                    break;
                }
            }
            continue;
        }
        tokio::select! {
            changed = leading.changed() => if changed.is_err() { warn!("leader election stopped"); break; },
            () = fence.confirmed(), if leader => {}
            _ = shutdown.changed() => break,
        }
    }
    watcher.abort();
    // Dropping the receiver releases the lease, so a standby takes over at once.
    drop(leading);
    match tokio::time::timeout(Duration::from_secs(5), lease_task).await {
        Ok(Ok(Err(error))) => warn!(%error, "releasing the lease failed"),
        Err(_) => warn!("timed out releasing the lease"),
        _ => info!("released the leader lease"),
    }
    outcome
}

/// Runs every controller until `stop` resolves: the PlannerPolicy reconciler, and with
/// `--dgd-controller` the DGD reconciler and the topology label controller (and the Deployment
/// and pod caches they read).
async fn run_controllers(
    client: &Client,
    args: &RunArgs,
    identity: &str,
    metrics: Arc<OperatorMetrics>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let recorder = crate::controller::common::Events::new(
        client.clone(),
        Reporter {
            controller: "planner-operator".into(),
            instance: Some(identity.to_string()),
        },
    );
    let stop = stop.shared();
    if !args.dgd_controller {
        info!("DGD controller off (--dgd-controller=false): reconciling PlannerPolicies only");
        // Empty caches: nothing reads them without the DGD controller.
        let ctx = Arc::new(Context {
            client: client.clone(),
            recorder,
            metrics,
            deployments: reflector::store().0,
            pods: reflector::store().0,
            cluster_topology_api: args.cluster_topology_api_version.clone(),
            dgd_selection: args.dgd_selection,
            topology_env: args.topology_env,
        });
        let planner_ctx = Arc::new(
            controller::planner_policy::PlannerContext::new(ctx, args.prometheus_url.clone())
                .with_tenancy(args.tenancy()),
        );
        controller::planner_policy::run(planner_ctx, args.namespace.clone(), stop).await;
        return;
    }
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
    let ctx = Arc::new(Context {
        client: client.clone(),
        recorder,
        metrics,
        deployments: store,
        pods: pod_store.clone(),
        cluster_topology_api: args.cluster_topology_api_version.clone(),
        dgd_selection: args.dgd_selection,
        topology_env: args.topology_env,
    });
    // Watch ClusterTopologyBindings and ClusterTopologies only where they are served; without
    // Grove the periodic resync re-checks DGDs that name one.
    let topology_api = &args.cluster_topology_api_version;
    let cluster_topologies = match lookup::topology_kinds_served(client, topology_api).await {
        Ok(served) => {
            let resources = served.resources(topology_api);
            if resources.is_empty() {
                info!(api = %topology_api, "ClusterTopologyBindings and ClusterTopologies are not served (Grove not installed); not watching them");
            }
            resources
        }
        Err(error) => {
            warn!(%error, "cannot tell whether Grove's topology kinds are served; not watching them");
            Vec::new()
        }
    };
    let planner_ctx = Arc::new(
        controller::planner_policy::PlannerContext::new(Arc::clone(&ctx), args.prometheus_url.clone())
            .with_tenancy(args.tenancy()),
    );
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

/// Waits, with backoff, until the API server serves the CRDs this operator watches (the DGD's
/// only with `dgd_controller`); `false` when shutdown was requested first.
async fn wait_for_crds(
    client: &Client,
    namespace: Option<&str>,
    dgd_controller: bool,
    mut shutdown: watch::Receiver<bool>,
) -> bool {
    let mut delay = CRD_RETRY.0;
    loop {
        let missing = match crds_served(client, namespace, dgd_controller).await {
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

/// Lists one object of each CRD the controllers watch (DGDs only with the DGD controller: the
/// planner alone reads its targets by name, and NVIDIA's operator may install their CRD later;
/// PlannerPolicies and GpuBudgets always); the error names the CRD that failed.
async fn crds_served(
    client: &Client,
    namespace: Option<&str>,
    dgd_controller: bool,
) -> Result<(), (&'static str, kube::Error)> {
    let params = ListParams::default().limit(1);
    if dgd_controller {
        let dgds: Api<DynamoGraphDeployment> =
            crate::controller::common::scoped_api(client.clone(), namespace);
        dgds.list_metadata(&params)
            .await
            .map_err(|e| ("dynamographdeployments.nvidia.com", e))?;
    }
    let policies: Api<PlannerPolicy> = crate::controller::common::scoped_api(client.clone(), namespace);
    policies
        .list_metadata(&params)
        .await
        .map_err(|e| ("plannerpolicies.planner.dynamo.io", e))?;
    let budgets: Api<planner_api::GpuBudget> = Api::all(client.clone());
    budgets
        .list_metadata(&params)
        .await
        .map_err(|e| ("gpubudgets.planner.dynamo.io", e))?;
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

async fn serve_health(State(state): State<ServerState>) -> impl IntoResponse {
    match state.health.problem() {
        None => (StatusCode::OK, "ok".to_string()),
        Some(problem) => (StatusCode::SERVICE_UNAVAILABLE, problem),
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

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    fn lease(holder: &str, renewed: Timestamp, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(renewed)),
            lease_duration_seconds: Some(seconds),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_lease_is_ours_until_its_expiry_less_the_margin() {
        let sent = Instant::now();
        let wall = Timestamp::from_second(1_800_000_000).unwrap();
        let margin = Duration::from_secs(2);
        // Renewed 5 s ago for 15 s: 10 s left, 8 s once the margin is taken off.
        let renewed = wall - k8s_openapi::jiff::SignedDuration::from_secs(5);
        assert_eq!(
            lease_validity(&lease("me", renewed, 15), "me", sent, wall, margin),
            Some(sent + Duration::from_secs(8))
        );
        // Someone else's, or nobody's.
        assert_eq!(
            lease_validity(&lease("you", renewed, 15), "me", sent, wall, margin),
            None
        );
        assert_eq!(
            lease_validity(&LeaseSpec::default(), "me", sent, wall, margin),
            None
        );
        // Expired: valid until the past, so no write goes out.
        let old = wall - k8s_openapi::jiff::SignedDuration::from_secs(60);
        let until = lease_validity(&lease("me", old, 15), "me", sent, wall, margin).unwrap();
        assert!(until <= sent);
        // A renewal stamped in our future (a faster clock) counts as now, never beyond one
        // duration.
        let future = wall + k8s_openapi::jiff::SignedDuration::from_secs(100);
        assert_eq!(
            lease_validity(&lease("me", future, 15), "me", sent, wall, margin),
            Some(sent + Duration::from_secs(13))
        );
    }

    #[tokio::test]
    async fn the_fence_expires_unless_the_lease_is_confirmed_again() {
        let fence = LeaseFence::default();
        assert!(!fence.allows_writes(), "nothing confirmed yet");
        fence.set(Some(Instant::now() + Duration::from_secs(2)));
        assert!(fence.allows_writes());
        let expired = {
            let fence = fence.clone();
            tokio::spawn(async move { fence.expired().await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Renewed in time: the deadline moves.
        fence.set(Some(Instant::now() + Duration::from_secs(2)));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!expired.is_finished(), "expired although renewed");
        assert!(fence.allows_writes());
        // Not renewed: it expires, and writes stop.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(expired.is_finished());
        assert!(!fence.allows_writes());
        // Another holder: at once.
        fence.set(None);
        tokio::time::timeout(Duration::from_millis(100), fence.expired())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn the_fenced_client_refuses_writes_but_not_reads_without_a_confirmed_lease() {
        // An API server that answers every request with an empty list and counts them.
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let api_server = {
            let seen = Arc::clone(&seen);
            tower::service_fn(move |_request: axum::http::Request<kube::client::Body>| {
                seen.fetch_add(1, Ordering::SeqCst);
                async move {
                    let body = r#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{},"items":[]}"#;
                    Ok::<_, std::convert::Infallible>(
                        axum::http::Response::builder()
                            .header("content-type", "application/json")
                            .body(kube::client::Body::from(body.as_bytes().to_vec()))
                            .unwrap(),
                    )
                }
            })
        };
        let fence = LeaseFence::default();
        let client = fenced_client(Client::new(api_server, "default"), fence.clone());
        let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client, "default");
        config_maps.list(&Default::default()).await.unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 1, "reads pass");
        let error = config_maps.delete("x", &Default::default()).await.unwrap_err();
        assert!(
            crate::controller::common::chain(&error)
                .contains("DELETE /api/v1/namespaces/default/configmaps/x refused"),
            "{error}"
        );
        assert_eq!(seen.load(Ordering::SeqCst), 1, "the write never left the process");
        fence.set(Some(Instant::now() + Duration::from_secs(10)));
        let _ = config_maps.delete("x", &Default::default()).await;
        assert_eq!(seen.load(Ordering::SeqCst), 2, "a confirmed leader writes");
    }

    #[test]
    fn health_fails_after_an_unrecovered_step_down_or_stopped_controllers() {
        let health = Health::default();
        assert_eq!(health.problem(), None);
        health.stepped_down(Duration::from_secs(3600));
        assert_eq!(health.problem(), None, "still within the recovery time");
        health.stepped_down(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        assert!(health.problem().unwrap().contains("stepped down"));
        health.recovered();
        assert_eq!(health.problem(), None);
        health.controllers_stopped.store(true, Ordering::Relaxed);
        assert!(health.problem().unwrap().contains("controllers stopped"));
    }
}

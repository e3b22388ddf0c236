//! `planner-sim dynamo-bed`: NVIDIA Dynamo's real frontend and mocker engines as the test bed of
//! a DynamoGraphDeployment whose pods run on fake (kwok) nodes.
//!
//! For each Ready pod of the graph the bed runs the real process on this host: `python -m
//! dynamo.frontend` for a frontend pod, `python -m dynamo.mocker` in the pod's disaggregation
//! mode for a prefill or decode pod, timed by the profile the PlannerPolicy plans with (the
//! mocker-format NPZ of `planner-sim mocker-profile`, the KV cache sized from the profile) and
//! with a start-up time. A pod that goes has its process sent SIGTERM. The processes find each
//! other through Dynamo's file discovery (no etcd, no NATS). A load generator replays a request
//! trace against the frontend, and the bed writes the Prometheus targets and scrape
//! configuration with which Prometheus scrapes the processes as PodMonitors (NVIDIA's, or this
//! chart's) scrape the pods ([`scrape`]).
//!
//! Endpoints: `GET /status` (processes, engines, load, CPU and memory; JSON), `GET /healthz`,
//! `GET /control/rate-scale` and `POST /control/rate-scale/{k}` (a load step, as the synthetic
//! frontend's).
//!
//! Work directory: `discovery/` (Dynamo's file discovery), `logs/<pod>.log`, `profile.npz`,
//! `targets.json` (Prometheus `file_sd`) and, with `--prometheus-config`, the configuration.

pub mod load;
pub mod processes;
pub mod scrape;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use axum::{
    Json, Router,
    extract::{Path as UrlPath, State},
    http::StatusCode,
    response::IntoResponse,
    routing::{get, post},
};
use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::ListParams};
use planner_api::labels::{LABEL_COMPONENT_TYPE, LABEL_GRAPH};
use planner_core::profile::{Profile, builtin_names};
use planner_sim_engine::latency::EngineSpec;
use serde::Serialize;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    LoadArgs,
    frontend::pod_ready,
    signal::wait_for_signal,
    sim::trace::{self, Arrivals},
};

use self::{
    load::{LoadSettings, LoadStats, LoadStatus},
    processes::{Launcher, ProcessStatus, Replica, Role, Supervisor},
};

/// Arguments of `dynamo-bed`.
#[derive(Debug, Args)]
pub struct DynamoBedArgs {
    /// The DynamoGraphDeployment whose pods the bed plays (label
    /// `nvidia.com/dynamo-graph-deployment-name`).
    #[arg(long, value_name = "NAME")]
    dgd: String,
    /// Namespace of the DGD's pods (default: the kubeconfig's).
    #[arg(long)]
    namespace: Option<String>,
    /// Seconds between looks at the pods.
    #[arg(long, default_value_t = 1.0)]
    poll_interval_s: f64,
    /// Work directory (discovery, logs, targets); created if missing.
    #[arg(long, value_name = "DIR")]
    workdir: PathBuf,

    /// The Python of Dynamo's virtual environment (`make dynamo`; `dynamo_python` in
    /// tools/env.sh).
    #[arg(long, env = "DYNAMO_PYTHON", value_name = "FILE")]
    python: PathBuf,
    /// The model directory the engines serve (`dynamo_model_dir` in tools/env.sh).
    #[arg(long, env = "DYNAMO_MODEL_DIR", value_name = "DIR")]
    model_dir: PathBuf,
    /// The served model name (the PlannerPolicy's `spec.metrics.modelName`).
    #[arg(long)]
    model: String,
    /// Built-in profile that times the engines (the one the PlannerPolicy names).
    #[arg(long, value_name = "NAME", required_unless_present = "profile_dir",
          value_parser = clap::builder::PossibleValuesParser::new(builtin_names().collect::<Vec<_>>()))]
    profile: Option<String>,
    /// Upstream profile directory instead of a built-in profile.
    #[arg(long, value_name = "DIR", conflicts_with = "profile")]
    profile_dir: Option<PathBuf>,
    /// The engines' `--speedup-ratio`: 1 serves as fast as the profile, 0.5 twice as slow.
    #[arg(long, default_value_t = 1.0)]
    speedup_ratio: f64,
    /// KV-cache block size in tokens.
    #[arg(long, default_value_t = 16)]
    block_size: u32,
    /// Seconds from a prefill or decode pod being Ready to its engine starting (a real engine
    /// loads its weights meanwhile; kwok makes pods Ready at once). Not the mocker's own
    /// `--startup-time`, with which an engine registers at once and holds the requests routed
    /// to it until the time is up.
    #[arg(long, default_value_t = 5.0)]
    engine_startup_s: f64,
    /// Ports for the engines' system servers, `LOW-HIGH` (Dynamo needs them below 32768).
    #[arg(long, default_value = "30000-32767", value_parser = parse_port_range)]
    system_ports: (u16, u16),
    /// `DYN_LOG` of every process.
    #[arg(long, default_value = "warn")]
    dynamo_log: String,
    /// Seconds between SIGTERM and SIGKILL for a process whose pod went.
    #[arg(long, default_value_t = 30.0)]
    stop_grace_s: f64,

    /// Write a Prometheus configuration here that scrapes the processes as PodMonitors scrape
    /// the pods: those of `--pod-monitors`, else NVIDIA's.
    #[arg(long, value_name = "FILE")]
    prometheus_config: Option<PathBuf>,
    /// PodMonitor objects (YAML; e.g. `helm template` of this chart with
    /// `dynamoPodMonitors.enabled=true`) to scrape as, instead of NVIDIA's `dynamo-frontend` and
    /// `dynamo-worker`.
    #[arg(long, value_name = "FILE", requires = "prometheus_config")]
    pod_monitors: Option<PathBuf>,
    /// Scrape interval of that configuration (NVIDIA's PodMonitors: 5 s).
    #[arg(long, default_value_t = 5)]
    scrape_interval_s: u32,
    /// Another job of that configuration, `NAME=HOST:PORT` (repeatable), e.g. the operator.
    #[arg(long = "prometheus-job", value_name = "NAME=HOST:PORT", value_parser = parse_job)]
    prometheus_jobs: Vec<(String, String)>,

    /// Request trace to send (Azure 2023 CSV or Mooncake JSONL); none: no load.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    #[command(flatten)]
    load: LoadArgs,
    /// Most requests outstanding at once; later ones are dropped (and counted).
    #[arg(long, default_value_t = 2000)]
    max_in_flight: u64,
    /// Seconds after which an unfinished request is abandoned (and counted as failed).
    #[arg(long, default_value_t = 600.0)]
    request_timeout_s: f64,

    /// Address of the status and control endpoints.
    #[arg(long, default_value = "127.0.0.1:9400")]
    listen: SocketAddr,
}

fn parse_port_range(text: &str) -> Result<(u16, u16), String> {
    let error = || format!("expected LOW-HIGH with 1024 <= LOW <= HIGH <= 32767, got `{text}`");
    let (low, high) = text.split_once('-').ok_or_else(error)?;
    let (low, high): (u16, u16) = (
        low.trim().parse().map_err(|_| error())?,
        high.trim().parse().map_err(|_| error())?,
    );
    if (1024..=high).contains(&low) && high <= 32767 {
        Ok((low, high))
    } else {
        Err(error())
    }
}

fn parse_job(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, target)) if !name.is_empty() && target.contains(':') => {
            Ok((name.to_string(), target.to_string()))
        }
        _ => Err(format!("expected NAME=HOST:PORT, got `{text}`")),
    }
}

/// Why the bed stopped.
#[derive(Debug, thiserror::Error)]
pub enum BedError {
    /// Bad profile, trace or setting.
    #[error("{0}")]
    Input(String),
    /// The work directory or a file in it could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Kubernetes client could not be built.
    #[error("cannot create the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The control listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

fn write(path: &Path, contents: &str) -> Result<(), BedError> {
    // Written aside and renamed, so Prometheus never reads half a file.
    let aside = path.with_extension("tmp");
    std::fs::write(&aside, contents)
        .and_then(|()| std::fs::rename(&aside, path))
        .map_err(|source| BedError::Write {
            path: path.display().to_string(),
            source,
        })
}

/// The Ready, not deleting pods of the graph that the bed plays, by role.
pub fn replicas(pods: &[Pod]) -> Vec<Replica> {
    let mut list: Vec<Replica> = pods
        .iter()
        .filter(|pod| pod_ready(pod))
        .filter_map(|pod| {
            let labels = pod.metadata.labels.as_ref()?;
            Some(Replica {
                uid: pod.metadata.uid.clone()?,
                name: pod.metadata.name.clone()?,
                role: Role::of(labels.get(LABEL_COMPONENT_TYPE)?)?,
                pod: Box::new(pod.clone()),
            })
        })
        .collect();
    list.sort_by(|a, b| (a.role, &a.name).cmp(&(b.role, &b.name)));
    list
}

/// What `/status` answers.
#[derive(Clone, Debug, Serialize)]
pub struct BedStatus {
    /// Every process.
    pub processes: Vec<ProcessStatus>,
    /// Prefill engine processes running.
    pub prefill: usize,
    /// Decode engine processes running.
    pub decode: usize,
    /// Aggregated worker engine processes running.
    pub workers: usize,
    /// Engine processes alive now (prefill, decode and worker; running or stopping).
    pub engines: usize,
    /// Most engine processes alive at once so far.
    pub peak_engines: usize,
    /// CPU seconds all processes have used so far (sampled every poll).
    pub cpu_s: f64,
    /// Most resident memory all processes held at once (bytes).
    pub peak_rss_bytes: u64,
    /// The load generator.
    pub load: LoadStatus,
    /// The rate scale in force.
    pub rate_scale: f64,
}

#[derive(Clone)]
struct ServerState {
    status: Arc<Mutex<BedStatus>>,
    rate_scale: Arc<AtomicU64>,
    stats: Arc<LoadStats>,
}

async fn get_status(State(state): State<ServerState>) -> axum::response::Response {
    let status = state.status.lock().map(|s| s.clone());
    match status {
        Ok(mut status) => {
            status.load = state.stats.status();
            status.rate_scale = f64::from_bits(state.rate_scale.load(Ordering::Relaxed));
            Json(status).into_response()
        }
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "status unavailable\n").into_response(),
    }
}

async fn get_rate_scale(State(state): State<ServerState>) -> String {
    format!("{}\n", f64::from_bits(state.rate_scale.load(Ordering::Relaxed)))
}

async fn set_rate_scale(
    State(state): State<ServerState>,
    UrlPath(k): UrlPath<f64>,
) -> axum::response::Response {
    if !(k.is_finite() && k >= 0.0) {
        return (StatusCode::BAD_REQUEST, "the rate scale must be a number >= 0\n").into_response();
    }
    state.rate_scale.store(k.to_bits(), Ordering::Relaxed);
    info!(rate_scale = k, "rate scale changed");
    (StatusCode::OK, format!("{k}\n")).into_response()
}

fn router(state: ServerState) -> Router {
    Router::new()
        .route("/status", get(get_status))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/control/rate-scale", get(get_rate_scale))
        .route("/control/rate-scale/{k}", post(set_rate_scale))
        .with_state(state)
}

/// The profile, the mocker-format NPZ written from it, and an engine's KV blocks.
fn prepare_profile(args: &DynamoBedArgs, npz: &Path) -> Result<u64, BedError> {
    let profile = match (&args.profile_dir, &args.profile) {
        (Some(dir), _) => Profile::from_dir(dir),
        (None, Some(name)) => Profile::builtin(name),
        (None, None) => return Err(BedError::Input("give --profile or --profile-dir".into())),
    }
    .map_err(|e| BedError::Input(e.to_string()))?;
    crate::mocker_profile::write_profile(&profile, crate::mocker_profile::MAX_ISL, None, npz)
        .map_err(|e| BedError::Input(e.to_string()))?;
    if args.block_size == 0 {
        return Err(BedError::Input("--block-size must be at least 1 token".into()));
    }
    let kv_tokens = EngineSpec::from_profile(&profile).max_kv_tokens;
    Ok((kv_tokens / f64::from(args.block_size)).floor().max(1.0) as u64)
}

/// Runs the bed until SIGTERM or Ctrl-C, then stops every process it started. Its stages:
/// check the settings, prepare the work directory, serve the endpoints and start the load,
/// follow the pods until a signal, shut down.
pub async fn run(args: DynamoBedArgs) -> Result<(), BedError> {
    check_settings(&args)?;
    let prepared = prepare(&args)?;
    let pods = graph_pods(&args).await?;
    let endpoints = serve(&args).await?;
    let (frontends_tx, frontends_rx) = watch::channel(Vec::new());
    let load = start_load(&args, prepared.arrivals, &endpoints, frontends_rx);
    let mut supervisor = Supervisor::new(Launcher {
        python: args.python.clone(),
        model_dir: args.model_dir.clone(),
        model: args.model.clone(),
        profile_npz: prepared.npz,
        kv_blocks: prepared.kv_blocks,
        block_size: args.block_size,
        speedup_ratio: args.speedup_ratio,
        startup: Duration::from_secs_f64(args.engine_startup_s),
        discovery_dir: prepared.discovery_dir,
        log_dir: prepared.log_dir,
        dynamo_log: args.dynamo_log.clone(),
        system_ports: args.system_ports,
        stop_grace: Duration::from_secs_f64(args.stop_grace_s),
    });
    let mut follow = Follow {
        pods,
        selector: format!("{LABEL_GRAPH}={}", args.dgd),
        targets_file: &prepared.targets_file,
        frontends: frontends_tx,
        last_targets: String::new(),
        last_report: std::time::Instant::now(),
    };
    follow
        .until_signal(&mut supervisor, &endpoints, args.poll_interval_s)
        .await?;
    shutdown(endpoints, load, supervisor, &prepared.targets_file).await;
    Ok(())
}

/// Every number in range, and Dynamo's Python and model where they are expected.
fn check_settings(args: &DynamoBedArgs) -> Result<(), BedError> {
    for (flag, value) in [
        ("--speedup-ratio", args.speedup_ratio),
        ("--speedup", args.load.speedup),
        ("--poll-interval-s", args.poll_interval_s),
    ] {
        if !(value.is_finite() && value > 0.0) {
            return Err(BedError::Input(format!(
                "{flag} must be a number > 0, not {value}"
            )));
        }
    }
    for (flag, value) in [
        ("--engine-startup-s", args.engine_startup_s),
        ("--stop-grace-s", args.stop_grace_s),
        ("--request-timeout-s", args.request_timeout_s),
        ("--rate-scale", args.load.rate_scale),
    ] {
        if !(value.is_finite() && value >= 0.0) {
            return Err(BedError::Input(format!(
                "{flag} must be a number >= 0, not {value}"
            )));
        }
    }
    if !args.python.is_file() {
        return Err(BedError::Input(format!(
            "--python {} is not a file: install Dynamo with `make dynamo` and pass `dynamo_python` of tools/env.sh",
            args.python.display()
        )));
    }
    if !args.model_dir.join("tokenizer.json").is_file() {
        return Err(BedError::Input(format!(
            "--model-dir {} has no tokenizer.json: pass `dynamo_model_dir` of tools/env.sh (`make dynamo` writes it)",
            args.model_dir.display()
        )));
    }
    Ok(())
}

/// What the bed reads and writes before it starts anything.
struct Prepared {
    discovery_dir: PathBuf,
    log_dir: PathBuf,
    npz: PathBuf,
    kv_blocks: u64,
    arrivals: Option<Arrivals>,
    targets_file: PathBuf,
}

/// The work directory, the profile tables, the trace, an empty targets file and, when asked
/// for, the Prometheus configuration.
fn prepare(args: &DynamoBedArgs) -> Result<Prepared, BedError> {
    let discovery_dir = args.workdir.join("discovery");
    let log_dir = args.workdir.join("logs");
    for dir in [&discovery_dir, &log_dir] {
        std::fs::create_dir_all(dir).map_err(|source| BedError::Write {
            path: dir.display().to_string(),
            source,
        })?;
    }
    let npz = args.workdir.join("profile.npz");
    let kv_blocks = prepare_profile(args, &npz)?;
    let arrivals = match &args.trace {
        Some(path) => Some(Arrivals::new(
            trace::load(path).map_err(|e| BedError::Input(e.to_string()))?,
            args.load.jitter_s,
            args.load.looping,
        )),
        None => None,
    };
    let targets_file = args.workdir.join("targets.json");
    write(&targets_file, "[]\n")?;
    if let Some(path) = &args.prometheus_config {
        let monitors = match &args.pod_monitors {
            Some(file) => std::fs::read_to_string(file)
                .map_err(|e| e.to_string())
                .and_then(|text| scrape::pod_monitors_from_yaml(&text))
                .map_err(|e| BedError::Input(format!("--pod-monitors {}: {e}", file.display())))?,
            None => scrape::nvidia_pod_monitors(),
        };
        write(
            path,
            &scrape::prometheus_config(
                &monitors,
                &targets_file,
                args.scrape_interval_s.max(1),
                &args.prometheus_jobs,
            ),
        )?;
    }
    Ok(Prepared {
        discovery_dir,
        log_dir,
        npz,
        kv_blocks,
        arrivals,
        targets_file,
    })
}

/// The API of the graph's pods (the `--namespace`, else the kubeconfig's).
async fn graph_pods(args: &DynamoBedArgs) -> Result<Api<Pod>, BedError> {
    let client = Client::try_default().await.map_err(BedError::Client)?;
    Ok(match &args.namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::default_namespaced(client),
    })
}

/// The status and control endpoints, serving, and what they share with the bed.
struct Endpoints {
    status: Arc<Mutex<BedStatus>>,
    rate_scale: Arc<AtomicU64>,
    stats: Arc<LoadStats>,
    stop_tx: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Binds `--listen` and serves `/status`, `/healthz` and the rate-scale control until the
/// stop signal.
async fn serve(args: &DynamoBedArgs) -> Result<Endpoints, BedError> {
    let rate_scale = Arc::new(AtomicU64::new(args.load.rate_scale.to_bits()));
    let stats = Arc::new(LoadStats::new());
    let status = Arc::new(Mutex::new(BedStatus {
        processes: Vec::new(),
        prefill: 0,
        decode: 0,
        workers: 0,
        engines: 0,
        peak_engines: 0,
        cpu_s: 0.0,
        peak_rss_bytes: 0,
        load: stats.status(),
        rate_scale: args.load.rate_scale,
    }));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|source| BedError::Bind {
            addr: args.listen,
            source,
        })?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut server_stop = stop_rx.clone();
    let state = ServerState {
        status: status.clone(),
        rate_scale: rate_scale.clone(),
        stats: stats.clone(),
    };
    let server = tokio::spawn(async move {
        axum::serve(listener, router(state))
            .with_graceful_shutdown(async move {
                let _ = server_stop.wait_for(|s| *s).await;
            })
            .await
    });
    info!(addr = %args.listen, dgd = %args.dgd, workdir = %args.workdir.display(), "Dynamo test bed serving");
    Ok(Endpoints {
        status,
        rate_scale,
        stats,
        stop_tx,
        stop_rx,
        server,
    })
}

/// The load generator over the trace, sending to the frontends it is told of; none without a
/// trace.
fn start_load(
    args: &DynamoBedArgs,
    arrivals: Option<Arrivals>,
    endpoints: &Endpoints,
    frontends: watch::Receiver<Vec<SocketAddr>>,
) -> Option<tokio::task::JoinHandle<()>> {
    arrivals.map(|arrivals| {
        tokio::spawn(load::run(
            arrivals,
            LoadSettings {
                model: args.model.clone(),
                speedup: args.load.speedup,
                max_in_flight: args.max_in_flight.max(1),
                timeout: Duration::from_secs_f64(args.request_timeout_s.max(1.0)),
            },
            endpoints.rate_scale.clone(),
            frontends,
            endpoints.stats.clone(),
            endpoints.stop_rx.clone(),
        ))
    })
}

/// The processes following the pods: what each poll reads and writes.
struct Follow<'a> {
    pods: Api<Pod>,
    selector: String,
    targets_file: &'a Path,
    frontends: watch::Sender<Vec<SocketAddr>>,
    last_targets: String,
    last_report: std::time::Instant,
}

impl Follow<'_> {
    /// Polls every `poll_interval_s` until SIGTERM or Ctrl-C.
    async fn until_signal(
        &mut self,
        supervisor: &mut Supervisor,
        endpoints: &Endpoints,
        poll_interval_s: f64,
    ) -> Result<(), BedError> {
        let mut ticker = tokio::time::interval(Duration::from_secs_f64(poll_interval_s));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let signal = wait_for_signal();
        tokio::pin!(signal);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = &mut signal => return Ok(()),
            }
            self.poll(supervisor, endpoints).await?;
        }
    }

    /// One look at the pods: the processes reconciled with them, the load generator told of
    /// the frontends, the targets file rewritten when it changed, a log line every 10 s and
    /// the status updated.
    async fn poll(&mut self, supervisor: &mut Supervisor, endpoints: &Endpoints) -> Result<(), BedError> {
        match self
            .pods
            .list(&ListParams::default().labels(&self.selector))
            .await
        {
            Ok(list) => supervisor.reconcile(replicas(&list.items)),
            // An API blip stops nothing: the processes keep serving as the pods would.
            Err(error) => {
                warn!(%error, "cannot list the graph's pods; keeping the processes");
                supervisor.keep();
            }
        }
        self.frontends.send_if_modified(|current| {
            let next = supervisor.frontends();
            let changed = *current != next;
            *current = next;
            changed
        });
        let targets = serde_json::to_string_pretty(&supervisor.targets()).unwrap_or_else(|_| "[]".into());
        if targets != self.last_targets {
            write(self.targets_file, &targets)?;
            self.last_targets = targets;
        }
        if self.last_report.elapsed() >= Duration::from_secs(10) {
            self.last_report = std::time::Instant::now();
            let load = endpoints.stats.status();
            let (prefill, decode, workers) = supervisor.running_engines();
            info!(
                prefill,
                decode,
                workers,
                sent = load.sent,
                completed = load.completed,
                failed = load.failed,
                dropped = load.dropped,
                in_flight = load.in_flight,
                trace_s = load.trace_s,
                "running"
            );
        }
        if let Ok(mut status) = endpoints.status.lock() {
            let (cpu_s, peak_rss_bytes) = supervisor.cost();
            status.processes = supervisor.status();
            (status.prefill, status.decode, status.workers) = supervisor.running_engines();
            status.engines = supervisor.engines();
            status.peak_engines = supervisor.peak_engines();
            status.cpu_s = cpu_s;
            status.peak_rss_bytes = peak_rss_bytes;
        }
        Ok(())
    }
}

/// No more requests, then every process, then the endpoints; logs what the run cost.
async fn shutdown(
    endpoints: Endpoints,
    load: Option<tokio::task::JoinHandle<()>>,
    mut supervisor: Supervisor,
    targets_file: &Path,
) {
    info!("stopping");
    let _ = endpoints.stop_tx.send(true);
    if let Some(load) = load {
        let _ = load.await;
    }
    supervisor.shutdown().await;
    let (cpu_s, peak_rss_bytes) = supervisor.cost();
    let load = endpoints.stats.status();
    info!(
        sent = load.sent,
        completed = load.completed,
        failed = load.failed,
        dropped = load.dropped,
        peak_engines = supervisor.peak_engines(),
        cpu_s,
        peak_rss_mib = peak_rss_bytes / (1 << 20),
        "every process stopped"
    );
    let _ = write(targets_file, "[]\n");
    let _ = endpoints.server.await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn pod(name: &str, kind: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"),
                         "labels": {"nvidia.com/dynamo-component-type": kind}},
            "spec": {"containers": [{"name": "main"}]},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    #[test]
    fn each_ready_frontend_prefill_and_decode_pod_is_a_replica() {
        let pods = [
            pod("d-1", "decode", true),
            pod("p-1", "prefill", true),
            pod("p-2", "prefill", false),
            pod("f-1", "frontend", true),
            pod("x-1", "planner", true),
        ];
        let list = replicas(&pods);
        let names: Vec<(&str, Role)> = list.iter().map(|r| (r.name.as_str(), r.role)).collect();
        assert_eq!(
            names,
            [
                ("f-1", Role::Frontend),
                ("p-1", Role::Prefill),
                ("d-1", Role::Decode)
            ]
        );
        assert_eq!(list[1].uid, "uid-p-1");
    }

    #[test]
    fn settings_are_checked_by_name() {
        assert_eq!(parse_port_range("30000-30100"), Ok((30000, 30100)));
        assert!(parse_port_range("30000-40000").unwrap_err().contains("32767"));
        assert!(parse_port_range("9").is_err());
        assert_eq!(
            parse_job("op=127.0.0.1:1"),
            Ok(("op".into(), "127.0.0.1:1".into()))
        );
        assert!(parse_job("op").is_err());
    }
}

//! A synthetic Dynamo frontend for tests without GPUs: it replays a request
//! trace in real time (optionally faster, and at a rate scale that can be changed while it
//! runs), counts the prefill and decode pods that are Ready (or takes fixed counts), derives
//! TTFT and ITL from a profile and that capacity with the simulator's latency model
//! ([`planner_sim_engine::latency`]), and serves the `dynamo_frontend_*` metrics on `/metrics`.
//!
//! It is a subcommand of the operator binary (`planner-operator synthetic-frontend`) rather
//! than a separate binary: one more binary would be one more large link (kube, rustls,
//! Prophet's WebAssembly runtime) in every `cargo build` and `cargo test` on two cores, and the
//! operator's container image then carries the test frontend too, so an e2e harness needs no
//! second image.
//!
//! Endpoints: `GET /metrics` (the frontend's metrics, OpenMetrics text), `GET /engine/metrics`
//! (the decode engines'), `GET /healthz`, `GET /control/rate-scale` and
//! `POST /control/rate-scale/{k}` (a load step without a restart).
//!
//! Prometheus must add the `dynamo_namespace` label when it scrapes (upstream's PodMonitor does
//! it by relabelling): see `config/synthetic-frontend/prometheus.yml`.

pub mod metrics;
pub mod replay;

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::{Path, State},
    http::StatusCode,
    response::IntoResponse,
    routing::{get, post},
};
use clap::{ArgGroup, Args};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::ListParams};
use tokio::sync::watch;
use tracing::{info, warn};

use planner_api::labels::{LABEL_COMPONENT_TYPE, LABEL_GRAPH};
use planner_core::{
    aggregated::AggregatedEngine,
    interpolation::PerformanceModel,
    profile::{Profile, builtin_names},
};
use planner_sim_engine::latency::{EngineSpec, LatencyModel};

use crate::{LoadArgs, signal::wait_for_signal, sim::trace};

use self::{metrics::FrontendMetrics, replay::Replay};

/// Arguments of `synthetic-frontend`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("capacity").required(true).args(["prefill", "dgd"])))]
pub struct SyntheticFrontendArgs {
    /// Request trace: Azure 2023 CSV or Mooncake JSONL.
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,
    /// Built-in profile.
    #[arg(long, value_name = "NAME", required_unless_present = "profile_dir",
          value_parser = clap::builder::PossibleValuesParser::new(builtin_names().collect::<Vec<_>>()))]
    profile: Option<String>,
    /// Upstream profile directory instead of a built-in profile.
    #[arg(long, value_name = "DIR", conflicts_with = "profile")]
    profile_dir: Option<PathBuf>,
    /// Model name in the `model` label (as registered; the frontend keeps its case).
    #[arg(long, default_value = "synthetic-model")]
    model: String,
    #[command(flatten)]
    load: LoadArgs,
    /// Model step (trace seconds).
    #[arg(long, default_value_t = 1.0)]
    step_s: f64,
    /// Address to serve on (loopback by default; `0.0.0.0:8000` in a pod).
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Fixed prefill workers (instead of counting pods).
    #[arg(long, requires = "decode", conflicts_with = "dgd")]
    prefill: Option<u32>,
    /// Fixed decode workers (instead of counting pods).
    #[arg(long, requires = "prefill")]
    decode: Option<u32>,
    /// Count Ready pods of this DynamoGraphDeployment (labels
    /// `nvidia.com/dynamo-graph-deployment-name` and `nvidia.com/dynamo-component-type`).
    #[arg(long, value_name = "NAME")]
    dgd: Option<String>,
    /// Namespace of the DGD's pods (default: the kubeconfig's).
    #[arg(long)]
    namespace: Option<String>,
    /// Seconds between pod counts.
    #[arg(long, default_value_t = 2.0)]
    poll_interval_s: f64,
    /// KV-cache block size in tokens (for `model_total_kv_blocks` and the decode blocks gauge).
    #[arg(long, default_value_t = 16)]
    kv_block_size: u32,
    /// Aggregated workers (chunked prefill sharing steps with decode): with `--dgd`, the Ready
    /// pods of `nvidia.com/dynamo-component-type=worker` serve both; with fixed counts,
    /// `--decode`'s. Their gauges carry `worker_type="decode"`, as Dynamo's frontend labels
    /// aggregated workers.
    #[arg(long)]
    aggregated: bool,
}

/// Why the synthetic frontend stopped.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    /// Bad profile or trace.
    #[error("{0}")]
    Input(String),
    /// Kubernetes client could not be built.
    #[error("cannot create the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The server failed.
    #[error("server failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// Ready workers by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Workers {
    /// Prefill workers.
    pub prefill: Vec<String>,
    /// Decode workers.
    pub decode: Vec<String>,
}

impl Workers {
    /// `n` synthetic names per pool.
    pub fn fixed(prefill: u32, decode: u32) -> Self {
        Self {
            prefill: (0..prefill).map(|i| format!("prefill-{i}")).collect(),
            decode: (0..decode).map(|i| format!("decode-{i}")).collect(),
        }
    }
}

/// Whether a pod is Ready and not being deleted.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
}

/// The label selector of a DGD's pods of one component type.
pub fn selector(dgd: &str, component_type: &str) -> String {
    format!("{LABEL_GRAPH}={dgd},{LABEL_COMPONENT_TYPE}={component_type}")
}

async fn ready_pods(api: &Api<Pod>, dgd: &str, component_type: &str) -> Result<Vec<String>, kube::Error> {
    let pods = api
        .list(&ListParams::default().labels(&selector(dgd, component_type)))
        .await?;
    let mut names: Vec<String> = pods
        .items
        .iter()
        .filter(|p| pod_ready(p))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    Ok(names)
}

#[derive(Clone)]
struct ServerState {
    metrics: Arc<Mutex<FrontendMetrics>>,
    rate_scale: Arc<AtomicU64>,
}

async fn serve_metrics(State(state): State<ServerState>) -> axum::response::Response {
    let encoded = state.metrics.lock().ok().and_then(|m| m.encode().ok());
    exposition(encoded)
}

async fn serve_engine_metrics(State(state): State<ServerState>) -> axum::response::Response {
    let encoded = state.metrics.lock().ok().and_then(|m| m.encode_engines().ok());
    exposition(encoded)
}

/// An OpenMetrics exposition, or a 500 when the registry could not be encoded.
fn exposition(encoded: Option<String>) -> axum::response::Response {
    match encoded {
        Some(text) => (
            StatusCode::OK,
            [(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        None => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode the metrics").into_response(),
    }
}

async fn get_rate_scale(State(state): State<ServerState>) -> String {
    format!("{}\n", f64::from_bits(state.rate_scale.load(Ordering::Relaxed)))
}

async fn set_rate_scale(State(state): State<ServerState>, Path(k): Path<f64>) -> axum::response::Response {
    if !(k.is_finite() && k >= 0.0) {
        return (StatusCode::BAD_REQUEST, "the rate scale must be a number >= 0\n").into_response();
    }
    state.rate_scale.store(k.to_bits(), Ordering::Relaxed);
    info!(rate_scale = k, "rate scale changed");
    (StatusCode::OK, format!("{k}\n")).into_response()
}

fn router(state: ServerState) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/engine/metrics", get(serve_engine_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/control/rate-scale", get(get_rate_scale))
        .route("/control/rate-scale/{k}", post(set_rate_scale))
        .with_state(state)
}

/// Runs the frontend until SIGTERM or Ctrl-C.
pub async fn run(args: SyntheticFrontendArgs) -> Result<(), FrontendError> {
    let inputs = Inputs::load(&args)?;
    let metrics = Arc::new(Mutex::new(
        FrontendMetrics::new(&args.model, inputs.spec.max_kv_tokens, args.kv_block_size)
            .aggregated(args.aggregated),
    ));
    let rate_scale = Arc::new(AtomicU64::new(args.load.rate_scale.max(0.0).to_bits()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let (workers, poller) = capacity(&args, &stop_rx).await?;
    let state = ServerState {
        metrics: metrics.clone(),
        rate_scale: rate_scale.clone(),
    };
    let server = serve(args.listen, state, stop_rx).await?;
    info!(addr = %args.listen, trace = %args.trace.display(), requests = inputs.requests.len(), "synthetic frontend serving");

    replay_until_signal(&args, inputs, &workers, &rate_scale, &metrics).await;

    info!("stopping");
    let _ = stop_tx.send(true);
    if let Some(poller) = poller {
        let _ = poller.await;
    }
    match server.await {
        Ok(Ok(())) | Err(_) => Ok(()),
        Ok(Err(error)) => Err(FrontendError::Serve(error)),
    }
}

/// What the frontend replays, and the model it derives latencies from.
struct Inputs {
    curves: PerformanceModel,
    spec: EngineSpec,
    requests: Vec<trace::Request>,
}

impl Inputs {
    /// Reads the profile and the trace.
    fn load(args: &SyntheticFrontendArgs) -> Result<Self, FrontendError> {
        let profile = match (&args.profile_dir, &args.profile) {
            (Some(dir), _) => Profile::from_dir(dir),
            (None, Some(name)) => Profile::builtin(name),
            (None, None) => return Err(FrontendError::Input("give --profile or --profile-dir".into())),
        }
        .map_err(|e| FrontendError::Input(e.to_string()))?;
        let curves = PerformanceModel::new(&profile).map_err(|e| FrontendError::Input(e.to_string()))?;
        let spec = EngineSpec::from_profile(&profile);
        let requests = trace::load(&args.trace).map_err(|e| FrontendError::Input(e.to_string()))?;
        Ok(Self {
            curves,
            spec,
            requests,
        })
    }
}

/// Capacity: fixed counts, or Ready pods polled from the API server until `stop` (the task that
/// polls them is returned to be awaited).
async fn capacity(
    args: &SyntheticFrontendArgs,
    stop: &watch::Receiver<bool>,
) -> Result<(watch::Receiver<Workers>, Option<tokio::task::JoinHandle<()>>), FrontendError> {
    let (workers_tx, workers_rx) = watch::channel(Workers::default());
    let poller = match (&args.dgd, args.prefill, args.decode) {
        (Some(dgd), _, _) => {
            let client = Client::try_default().await.map_err(FrontendError::Client)?;
            let api: Api<Pod> = match &args.namespace {
                Some(ns) => Api::namespaced(client, ns),
                None => Api::default_namespaced(client),
            };
            let period = Duration::from_secs_f64(args.poll_interval_s.max(0.1));
            Some(tokio::spawn(poll_workers(
                api,
                dgd.clone(),
                args.aggregated,
                period,
                workers_tx,
                stop.clone(),
            )))
        }
        (None, Some(prefill), Some(decode)) => {
            let fixed = Workers::fixed(prefill, decode);
            let _ = workers_tx.send(if args.aggregated {
                Workers {
                    prefill: Vec::new(),
                    ..fixed
                }
            } else {
                fixed
            });
            None
        }
        _ => {
            return Err(FrontendError::Input(
                "give --prefill and --decode, or --dgd".into(),
            ));
        }
    };
    Ok((workers_rx, poller))
}

/// Counts the DGD's Ready workers every `period` until `stop`, and publishes them when they
/// change (aggregated: the `worker` pods serve both pools).
async fn poll_workers(
    api: Api<Pod>,
    dgd: String,
    aggregated: bool,
    period: Duration,
    workers_tx: watch::Sender<Workers>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let counts = if aggregated {
            ready_pods(&api, &dgd, "worker")
                .await
                .map(|workers| (Vec::new(), workers))
        } else {
            match (
                ready_pods(&api, &dgd, "prefill").await,
                ready_pods(&api, &dgd, "decode").await,
            ) {
                (Ok(prefill), Ok(decode)) => Ok((prefill, decode)),
                (Err(error), _) | (_, Err(error)) => Err(error),
            }
        };
        match counts {
            Ok((prefill, decode)) => {
                workers_tx.send_if_modified(|current| {
                    let next = Workers { prefill, decode };
                    if *current == next {
                        false
                    } else {
                        info!(
                            prefill = next.prefill.len(),
                            decode = next.decode.len(),
                            "ready workers"
                        );
                        *current = next;
                        true
                    }
                });
            }
            Err(error) => {
                warn!(%error, "cannot count the DGD's pods; keeping the last counts");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {},
            _ = stop.wait_for(|s| *s) => break,
        }
    }
}

/// Binds `listen` and serves the endpoints until `stop`.
async fn serve(
    listen: SocketAddr,
    state: ServerState,
    mut stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<std::io::Result<()>>, FrontendError> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| FrontendError::Bind { addr: listen, source })?;
    Ok(tokio::spawn(async move {
        axum::serve(listener, router(state))
            .with_graceful_shutdown(async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await
    }))
}

/// The replay until SIGTERM or Ctrl-C: one model step per tick, trace time = wall time *
/// speedup, at the Ready capacity and the rate scale of the moment.
async fn replay_until_signal(
    args: &SyntheticFrontendArgs,
    inputs: Inputs,
    workers: &watch::Receiver<Workers>,
    rate_scale: &AtomicU64,
    metrics: &Mutex<FrontendMetrics>,
) {
    let step = if args.step_s.is_finite() && args.step_s > 0.0 {
        args.step_s
    } else {
        1.0
    };
    let speedup = if args.load.speedup.is_finite() && args.load.speedup > 0.0 {
        args.load.speedup
    } else {
        1.0
    };
    let mut replay = Replay::new(inputs.requests, args.load.jitter_s, args.load.looping, step)
        .aggregated(args.aggregated.then(AggregatedEngine::default).as_ref());
    let latency = LatencyModel::new(&inputs.curves, inputs.spec);
    let mut ticker = tokio::time::interval(Duration::from_secs_f64((step / speedup).max(0.01)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let started = Instant::now();
    let mut announced_end = false;
    let signal = wait_for_signal();
    tokio::pin!(signal);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = &mut signal => break,
        }
        let workers = workers.borrow().clone();
        let k = f64::from_bits(rate_scale.load(Ordering::Relaxed));
        let t = started.elapsed().as_secs_f64() * speedup;
        let Ok(mut m) = metrics.lock() else { break };
        let decode = u32::try_from(workers.decode.len()).unwrap_or(u32::MAX);
        // Aggregated workers are both pools.
        let prefill = if args.aggregated {
            decode
        } else {
            u32::try_from(workers.prefill.len()).unwrap_or(u32::MAX)
        };
        replay.advance_to(t, k, prefill, decode, &latency, &mut *m);
        m.update(&replay.snapshot(), &workers.prefill, &workers.decode);
        drop(m);
        if !announced_end && replay.finished() {
            announced_end = true;
            info!(
                trace_time_s = replay.now_s(),
                "trace replayed; serving the final metrics until stopped"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

    fn pod(ready: &str, deleting: bool) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        if deleting {
            pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        }
        pod.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: ready.into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        pod
    }

    #[test]
    fn readiness_and_selectors() {
        assert!(pod_ready(&pod("True", false)));
        assert!(!pod_ready(&pod("False", false)));
        assert!(!pod_ready(&pod("True", true)));
        assert!(!pod_ready(&Pod::default()));
        assert_eq!(
            selector("llama", "prefill"),
            "nvidia.com/dynamo-graph-deployment-name=llama,nvidia.com/dynamo-component-type=prefill"
        );
        assert_eq!(Workers::fixed(2, 1).decode, vec!["decode-0".to_string()]);
    }

    #[tokio::test]
    async fn handlers_serve_metrics_and_change_the_rate_scale() {
        let state = ServerState {
            metrics: Arc::new(Mutex::new(FrontendMetrics::new("M", 1600.0, 16))),
            rate_scale: Arc::new(AtomicU64::new(1.0f64.to_bits())),
        };
        let response = serve_metrics(State(state.clone())).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/openmetrics-text")
        );
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        // Before its first request, a frontend exports the model's gauges only.
        assert!(
            text.contains("dynamo_frontend_model_ready{model=\"M\"} 1"),
            "{text}"
        );
        let response = serve_engine_metrics(State(state.clone())).await;
        assert_eq!(response.status(), StatusCode::OK);
        let response = set_rate_scale(State(state.clone()), Path(4.0)).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(get_rate_scale(State(state.clone())).await, "4\n");
        let response = set_rate_scale(State(state), Path(-1.0)).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
}

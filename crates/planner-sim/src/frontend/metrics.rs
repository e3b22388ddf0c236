//! The metrics of a Dynamo frontend in its default (round-robin) router mode and of its decode
//! engines, as Dynamo 1.6.1 exports them, fed by the latency model through [`Observer`]: the
//! names, types, label names, bucket bounds, series lifecycle and meaning of what the planner
//! reads (`e2e/tests/e2e/conformance.rs` compares them with the real frontend and mocker engines
//! under the same load).
//!
//! The frontend's (`/metrics`, prefix `dynamo_frontend_`):
//! - `model_total_kv_blocks`, `model_kv_cache_block_size`, `model_ready` `{model}`: set when a
//!   worker registers the model, so an idle frontend exports them and nothing else of the model;
//! - `requests_started_total{model, endpoint, request_type}`, counted when a request is accepted;
//!   `requests_total{model, endpoint, request_type, status, error_type}` when it ends;
//! - histograms `{model}` with upstream's bounds ([`crate::sim::metrics`]):
//!   `time_to_first_token_seconds` and `input_sequence_tokens` at a first token,
//!   `inter_token_latency_seconds` once per later token, `request_duration_seconds` and
//!   `output_sequence_tokens` when a request ends;
//! - `inflight_requests` and `active_requests` (accepted, not ended), `queued_requests` (no first
//!   token yet) `{model}`, and `stage_requests{stage, phase}`: requests sent to a prefill engine
//!   and not back (`dispatch`, `prefill`), and requests waiting for decode (`dispatch`, `decode`);
//!   all from the first request on;
//! - `output_tokens_total{model}`, and the per-worker `worker_last_time_to_first_token_seconds`,
//!   `worker_last_input_sequence_tokens`, `worker_last_inter_token_latency_seconds`
//!   `{worker_id, dp_rank, worker_type}`.
//!
//! Every series is created on first use, as the real frontend's are. The KV router's gauges
//! (`worker_active_decode_blocks`, `router_queue_*`) exist only with `--router-mode kv`, and
//! are not modelled.
//!
//! The decode engines' (`/engine/metrics`): vLLM's `vllm:kv_cache_usage_perc{engine,
//! model_name, worker_id}`, one series per decode worker from the first request it decodes (the
//! mocker's labels, plus the `worker_id` Dynamo's runtime adds on real engines, which tells the
//! workers of this one target apart).
//!
//! `dynamo_namespace` is on none of them: a PodMonitor adds it when Prometheus scrapes
//! (relabelling the pod label `nvidia.com/dynamo-namespace`), so a scrape of this frontend must
//! add it too (see `config/synthetic-frontend/`).

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Metric, Registry},
};

use planner_sim_engine::latency::{Job, Observer, Outcome, Snapshot};

use crate::sim::metrics::{DURATION_BOUNDS, ISL_BOUNDS, ITL_BOUNDS, OSL_BOUNDS, TTFT_BOUNDS};

/// Upstream's metric prefix.
pub const PREFIX: &str = "dynamo_frontend";

/// `{model}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// Served model name, as registered (the real frontend keeps its case).
    pub model: String,
}

/// `requests_total` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Served model name.
    pub model: String,
    /// `chat_completions` or `completions`.
    pub endpoint: String,
    /// `stream` or `unary`.
    pub request_type: String,
    /// `success` or `error`.
    pub status: String,
    /// Empty on success.
    pub error_type: String,
}

/// `requests_started_total` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StartedLabels {
    /// Served model name.
    pub model: String,
    /// `chat_completions` or `completions`.
    pub endpoint: String,
    /// `stream` or `unary`.
    pub request_type: String,
}

/// Per-worker gauge labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabels {
    /// Worker identifier (the pod name when counted from Kubernetes).
    pub worker_id: String,
    /// Data-parallel rank: `none` in round-robin mode.
    pub dp_rank: String,
    /// `prefill` or `decode`.
    pub worker_type: String,
}

/// `stage_requests` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    /// `preprocess`, `route` or `dispatch`.
    pub stage: String,
    /// `prefill`, `decode`, or empty (preprocess).
    pub phase: String,
}

/// A decode engine's `vllm:*` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineLabels {
    /// Engine index within the worker.
    pub engine: String,
    /// Served model name.
    pub model_name: String,
    /// The worker.
    pub worker_id: String,
}

type Histograms = Family<ModelLabels, Histogram, fn() -> Histogram>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// A histogram over upstream's finite bounds (the encoder adds +Inf).
fn histogram(bounds: &[f64]) -> Histogram {
    Histogram::new(bounds.iter().copied().filter(|b| b.is_finite()))
}
fn ttft_histogram() -> Histogram {
    histogram(&TTFT_BOUNDS)
}
fn itl_histogram() -> Histogram {
    histogram(&ITL_BOUNDS)
}
fn duration_histogram() -> Histogram {
    histogram(&DURATION_BOUNDS)
}
fn isl_histogram() -> Histogram {
    histogram(&ISL_BOUNDS)
}
fn osl_histogram() -> Histogram {
    histogram(&OSL_BOUNDS)
}

/// A histogram family: name, help and the constructor of one histogram over its bounds.
type HistogramFamily = (&'static str, &'static str, fn() -> Histogram);

/// The histograms `{model}`.
const HISTOGRAMS: [HistogramFamily; 5] = [
    (
        "time_to_first_token_seconds",
        "Time to first token in seconds",
        ttft_histogram,
    ),
    (
        "inter_token_latency_seconds",
        "Inter-token latency in seconds",
        itl_histogram,
    ),
    (
        "request_duration_seconds",
        "Duration of LLM requests",
        duration_histogram,
    ),
    (
        "input_sequence_tokens",
        "Input sequence length in tokens",
        isl_histogram,
    ),
    (
        "output_sequence_tokens",
        "Output sequence length in tokens",
        osl_histogram,
    ),
];

/// The request gauges `{model}`: name and help.
const REQUEST_GAUGES: [(&str, &str); 3] = [
    ("inflight_requests", "Number of inflight requests"),
    (
        "active_requests",
        "Number of requests currently being handled by the frontend, from HTTP handler entry to response completion",
    ),
    ("queued_requests", "Number of requests in HTTP processing queue"),
];

/// The gauges `{model}` a worker sets when it registers the model: name and help.
const MODEL_GAUGES: [(&str, &str); 3] = [
    (
        "model_total_kv_blocks",
        "Total KV cache blocks available for a worker serving the model",
    ),
    ("model_kv_cache_block_size", "KV cache block size in tokens"),
    (
        "model_ready",
        "Whether the frontend can route at least one inference request for the model (1 = ready, 0 = not ready)",
    ),
];

/// The per-worker gauges: name and help.
const WORKER_GAUGES: [(&str, &str); 3] = [
    (
        "worker_last_time_to_first_token_seconds",
        "Last time to first token of a worker",
    ),
    (
        "worker_last_input_sequence_tokens",
        "Last input sequence length of a worker",
    ),
    (
        "worker_last_inter_token_latency_seconds",
        "Last inter-token latency of a worker",
    ),
];

/// Registers `metric` as `name` and hands back a handle to it.
fn register<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// The frontend's and the decode engines' metrics and the registries that expose them.
#[derive(Debug)]
pub struct FrontendMetrics {
    registry: Registry,
    engines: Registry,
    model: ModelLabels,
    requests: Family<RequestLabels, Counter>,
    started: Family<StartedLabels, Counter>,
    ttft: Histograms,
    itl: Histograms,
    duration: Histograms,
    isl: Histograms,
    osl: Histograms,
    inflight: Family<ModelLabels, Gauge>,
    active: Family<ModelLabels, Gauge>,
    queued: Family<ModelLabels, Gauge>,
    stages: Family<StageLabels, Gauge>,
    output_tokens: Family<ModelLabels, Counter>,
    total_kv_blocks: Family<ModelLabels, Gauge>,
    block_size: Family<ModelLabels, Gauge>,
    last_ttft: Family<WorkerLabels, FloatGauge>,
    last_isl: Family<WorkerLabels, FloatGauge>,
    last_itl: Family<WorkerLabels, FloatGauge>,
    kv_usage: Family<EngineLabels, FloatGauge>,
    /// Tokens emitted but not yet observed in the ITL histogram (fractions within a step).
    pending_tokens: f64,
    last: LastValues,
    workers: (Vec<String>, Vec<String>),
    /// Serving aggregated workers: the stages' phase is `aggregated`, as Dynamo's frontend
    /// labels them for a graph of `type: worker` engines.
    aggregated: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct LastValues {
    /// A request arrived (the request gauges exist from then on).
    arrived: bool,
    /// A first token was given (prefill workers have their last-request gauges).
    first_token: bool,
    /// Tokens were decoded (decode workers have theirs, and their KV usage).
    decoded: bool,
    ttft_s: f64,
    isl: f64,
    itl_s: f64,
}

impl FrontendMetrics {
    /// Registers every metric for `model`. `max_kv_tokens` and `kv_block_size` give
    /// `model_total_kv_blocks` (per engine).
    pub fn new(model: &str, max_kv_tokens: f64, kv_block_size: u32) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let model = ModelLabels {
            model: model.to_string(),
        };
        // In the real frontend's order of registration, which is the exposition's.
        let requests = register(
            &mut registry,
            "requests",
            "Total number of LLM requests processed",
            Family::<RequestLabels, Counter>::default(),
        );
        let started = register(
            &mut registry,
            "requests_started",
            "Total number of LLM requests accepted by the frontend handler",
            Family::<StartedLabels, Counter>::default(),
        );
        let [ttft, itl, duration, isl, osl] = HISTOGRAMS.map(|(name, help, make)| {
            register(&mut registry, name, help, Histograms::new_with_constructor(make))
        });
        let [inflight, active, queued] =
            REQUEST_GAUGES.map(|(name, help)| register(&mut registry, name, help, Family::default()));
        let stages = register(
            &mut registry,
            "stage_requests",
            "Number of requests currently in the given pipeline stage",
            Family::<StageLabels, Gauge>::default(),
        );
        let [total_kv_blocks, block_size, ready] = MODEL_GAUGES
            .map(|(name, help)| register(&mut registry, name, help, Family::<ModelLabels, Gauge>::default()));
        let output_tokens = register(
            &mut registry,
            "output_tokens",
            "Total output tokens generated",
            Family::<ModelLabels, Counter>::default(),
        );
        let [last_ttft, last_isl, last_itl] =
            WORKER_GAUGES.map(|(name, help)| register(&mut registry, name, help, Family::default()));
        let mut engines = Registry::default();
        let kv_usage = register(
            &mut engines,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage as a fraction of available cache blocks.",
            Family::<EngineLabels, FloatGauge>::default(),
        );
        let blocks = if kv_block_size > 0 {
            (max_kv_tokens / f64::from(kv_block_size)).floor()
        } else {
            0.0
        };
        // A worker registered the model: its gauges exist before any request.
        total_kv_blocks.get_or_create(&model).set(blocks as i64);
        block_size.get_or_create(&model).set(i64::from(kv_block_size));
        ready.get_or_create(&model).set(1);
        Self {
            registry,
            engines,
            model,
            requests,
            started,
            ttft,
            itl,
            duration,
            isl,
            osl,
            inflight,
            active,
            queued,
            stages,
            output_tokens,
            total_kv_blocks,
            block_size,
            last_ttft,
            last_isl,
            last_itl,
            kv_usage,
            pending_tokens: 0.0,
            last: LastValues::default(),
            workers: (Vec::new(), Vec::new()),
            aggregated: false,
        }
    }

    /// The frontend's exposition (OpenMetrics text).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// The decode engines' exposition (OpenMetrics text).
    pub fn encode_engines(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        encode(&mut text, &self.engines)?;
        Ok(text)
    }

    fn worker_labels(id: &str, worker_type: &str) -> WorkerLabels {
        WorkerLabels {
            worker_id: id.to_string(),
            dp_rank: "none".into(),
            worker_type: worker_type.into(),
        }
    }

    fn engine_labels(&self, id: &str) -> EngineLabels {
        EngineLabels {
            engine: "0".into(),
            model_name: self.model.model.clone(),
            worker_id: id.to_string(),
        }
    }

    fn stage(&self, stage: &str, phase: &str) -> StageLabels {
        StageLabels {
            stage: stage.into(),
            phase: phase.into(),
        }
    }

    fn started_labels(&self) -> StartedLabels {
        StartedLabels {
            model: self.model.model.clone(),
            endpoint: "chat_completions".into(),
            request_type: "stream".into(),
        }
    }

    /// Updates the gauges from the model's state. `prefill` and `decode` name the workers
    /// serving (pods, or synthetic names); series of workers gone are removed.
    /// The stages of a frontend serving aggregated workers (phase `aggregated`) instead of
    /// prefill and decode pools.
    pub fn aggregated(mut self, aggregated: bool) -> Self {
        self.aggregated = aggregated;
        self
    }

    pub fn update(&mut self, snapshot: &Snapshot, prefill: &[String], decode: &[String]) {
        if self.last.arrived {
            let prefilling = snapshot
                .prefill_active_tokens
                .iter()
                .filter(|t| **t > 0.0)
                .count();
            let at_prefill = snapshot.prefill_queue + prefilling;
            let no_first_token = at_prefill + snapshot.decode_queue;
            let in_flight = no_first_token + snapshot.decoding;
            self.inflight.get_or_create(&self.model).set(in_flight as i64);
            self.active.get_or_create(&self.model).set(in_flight as i64);
            self.queued.get_or_create(&self.model).set(no_first_token as i64);
            // Round-robin: no router queue; a request waits in the prefill engine it was sent to.
            // Dynamo's frontend keeps an aggregated worker's request in `dispatch` until its
            // first token.
            let stages: &[(&str, &str, usize)] = if self.aggregated {
                &[
                    ("preprocess", "", 0),
                    ("route", "aggregated", 0),
                    ("dispatch", "aggregated", no_first_token),
                ]
            } else {
                &[
                    ("preprocess", "", 0),
                    ("route", "prefill", 0),
                    ("dispatch", "prefill", at_prefill),
                    ("route", "decode", 0),
                    ("dispatch", "decode", snapshot.decode_queue),
                ]
            };
            for &(stage, phase, count) in stages {
                self.stages
                    .get_or_create(&self.stage(stage, phase))
                    .set(count as i64);
            }
        }
        let (old_prefill, old_decode) = std::mem::take(&mut self.workers);
        for gone in old_prefill.iter().filter(|w| !prefill.contains(w)) {
            let labels = Self::worker_labels(gone, "prefill");
            for family in [&self.last_ttft, &self.last_isl] {
                family.remove(&labels);
            }
        }
        for gone in old_decode.iter().filter(|w| !decode.contains(w)) {
            self.last_itl.remove(&Self::worker_labels(gone, "decode"));
            self.kv_usage.remove(&self.engine_labels(gone));
        }
        if self.last.first_token {
            for id in prefill {
                let labels = Self::worker_labels(id, "prefill");
                self.last_ttft.get_or_create(&labels).set(self.last.ttft_s);
                self.last_isl.get_or_create(&labels).set(self.last.isl);
            }
        }
        if self.last.decoded {
            // The pool's usage, alike on every engine (the model does not place requests).
            for id in decode {
                self.last_itl
                    .get_or_create(&Self::worker_labels(id, "decode"))
                    .set(self.last.itl_s);
                self.kv_usage
                    .get_or_create(&self.engine_labels(id))
                    .set(snapshot.kv_usage.max(0.0));
            }
        }
        self.workers = (prefill.to_vec(), decode.to_vec());
    }

    /// `model_total_kv_blocks` as exposed.
    pub fn total_kv_blocks(&self) -> i64 {
        self.total_kv_blocks.get_or_create(&self.model).get()
    }

    /// `model_kv_cache_block_size` as exposed.
    pub fn block_size(&self) -> i64 {
        self.block_size.get_or_create(&self.model).get()
    }
}

impl Observer for FrontendMetrics {
    fn arrived(&mut self, _job: &Job) {
        self.started.get_or_create(&self.started_labels()).inc();
        self.last.arrived = true;
    }

    fn first_token(&mut self, job: &Job, _at_s: f64, ttft_s: f64) {
        self.ttft.get_or_create(&self.model).observe(ttft_s);
        self.isl.get_or_create(&self.model).observe(job.isl);
        self.output_tokens.get_or_create(&self.model).inc();
        self.last.ttft_s = ttft_s;
        self.last.isl = job.isl;
        self.last.first_token = true;
    }

    fn tokens(&mut self, _job: &Job, _at_s: f64, count: f64, itl_s: f64) {
        self.pending_tokens += count;
        let whole = self.pending_tokens.floor();
        if whole >= 1.0 {
            self.pending_tokens -= whole;
            let histogram = self.itl.get_or_create(&self.model);
            for _ in 0..(whole as u64) {
                histogram.observe(itl_s);
            }
            self.output_tokens.get_or_create(&self.model).inc_by(whole as u64);
        }
        self.last.itl_s = itl_s;
        self.last.decoded = true;
    }

    fn completed(&mut self, job: &Job, _at_s: f64, outcome: &Outcome) {
        let labels = RequestLabels {
            model: self.model.model.clone(),
            endpoint: "chat_completions".into(),
            request_type: "stream".into(),
            status: "success".into(),
            error_type: String::new(),
        };
        self.requests.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&self.model)
            .observe(outcome.duration_s);
        self.osl.get_or_create(&self.model).observe(job.osl);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn job() -> Job {
        Job {
            id: 0,
            arrival_s: 0.0,
            isl: 3000.0,
            osl: 151.0,
        }
    }

    /// The value of the sample line `name{labels} value`, labels given as written.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .map(|line| line[series.len()..].trim().parse().unwrap())
    }

    /// Family names of an exposition (`# TYPE` lines) with a series.
    fn with_series(text: &str) -> Vec<String> {
        let mut names: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
            .collect();
        names.dedup();
        names
    }

    #[test]
    fn exposes_upstream_names_labels_and_buckets() {
        let mut m = FrontendMetrics::new("Llama-3.3-70B", 224_133.0, 16);
        let started = "dynamo_frontend_requests_started_total{model=\"Llama-3.3-70B\",endpoint=\"chat_completions\",request_type=\"stream\"}";
        assert_eq!(sample(&m.encode().unwrap(), started), None);
        m.arrived(&job());
        // Counted when accepted, before any completion.
        assert_eq!(sample(&m.encode().unwrap(), started), Some(1.0));
        m.first_token(&job(), 0.2, 0.25);
        m.tokens(&job(), 1.0, 99.5, 0.02);
        m.tokens(&job(), 1.5, 50.5, 0.02);
        m.completed(
            &job(),
            3.25,
            &Outcome {
                ttft_s: 0.25,
                mean_itl_s: Some(0.02),
                duration_s: 3.25,
            },
        );
        let text = m.encode().unwrap();
        let value = |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"));
        let model = "{model=\"Llama-3.3-70B\"}";
        assert_eq!(
            value(
                "dynamo_frontend_requests_total{model=\"Llama-3.3-70B\",endpoint=\"chat_completions\",request_type=\"stream\",status=\"success\",error_type=\"\"}"
            ),
            1.0
        );
        assert_eq!(
            value(&format!("dynamo_frontend_time_to_first_token_seconds_sum{model}")),
            0.25
        );
        assert_eq!(
            value(&format!(
                "dynamo_frontend_time_to_first_token_seconds_count{model}"
            )),
            1.0
        );
        // One ITL observation per token after the first: 150 of them.
        assert_eq!(
            value(&format!(
                "dynamo_frontend_inter_token_latency_seconds_count{model}"
            )),
            150.0
        );
        assert!(
            (value(&format!("dynamo_frontend_inter_token_latency_seconds_sum{model}")) - 3.0).abs() < 1e-9
        );
        assert_eq!(
            value(&format!("dynamo_frontend_request_duration_seconds_sum{model}")),
            3.25
        );
        assert_eq!(
            value(&format!("dynamo_frontend_input_sequence_tokens_sum{model}")),
            3000.0
        );
        assert_eq!(
            value(&format!("dynamo_frontend_output_sequence_tokens_sum{model}")),
            151.0
        );
        assert_eq!(
            value(&format!("dynamo_frontend_output_tokens_total{model}")),
            151.0
        );
        assert_eq!(
            value(&format!("dynamo_frontend_model_total_kv_blocks{model}")),
            14_008.0
        );
        assert_eq!(m.total_kv_blocks(), 14_008);
        assert_eq!(m.block_size(), 16);
        // Upstream's bounds, 0 included, +Inf added.
        for (histogram, bounds) in [
            ("time_to_first_token_seconds", &TTFT_BOUNDS[..]),
            ("inter_token_latency_seconds", &ITL_BOUNDS[..]),
            ("request_duration_seconds", &DURATION_BOUNDS[..]),
            ("input_sequence_tokens", &ISL_BOUNDS[..]),
            ("output_sequence_tokens", &OSL_BOUNDS[..]),
        ] {
            let les: Vec<f64> = text
                .lines()
                .filter(|l| l.starts_with(&format!("dynamo_frontend_{histogram}_bucket")))
                .map(|l| {
                    let le = l.split("le=\"").nth(1).unwrap().split('"').next().unwrap();
                    if le == "+Inf" {
                        f64::INFINITY
                    } else {
                        le.parse().unwrap()
                    }
                })
                .collect();
            assert_eq!(les, bounds, "{histogram}");
        }
        assert!(text.contains("# TYPE dynamo_frontend_requests counter"));
        assert!(text.contains("# TYPE dynamo_frontend_time_to_first_token_seconds histogram"));
        assert!(
            !text.contains("dynamo_namespace"),
            "added by the scrape, not the frontend"
        );
        assert!(text.trim_end().ends_with("# EOF"));
    }

    #[test]
    fn an_idle_frontend_exports_only_its_model_gauges() {
        let mut m = FrontendMetrics::new("m", 1600.0, 16);
        let snapshot = Snapshot {
            prefill_queue: 0,
            prefill_queue_tokens: 0.0,
            prefill_active_tokens: vec![0.0],
            decode_queue: 0,
            decoding: 0,
            decode_engines: 1,
            kv_tokens: 0.0,
            kv_usage: 0.0,
            prefill_work_started_s: 0.0,
        };
        m.update(&snapshot, &["p-0".into()], &["d-0".into()]);
        // As the real frontend before its first request: only what the worker registered.
        assert_eq!(
            with_series(&m.encode().unwrap()),
            [
                "dynamo_frontend_model_total_kv_blocks",
                "dynamo_frontend_model_kv_cache_block_size",
                "dynamo_frontend_model_ready"
            ]
        );
        assert_eq!(with_series(&m.encode_engines().unwrap()), Vec::<String>::new());
        m.arrived(&job());
        m.update(&snapshot, &["p-0".into()], &["d-0".into()]);
        let text = m.encode().unwrap();
        for gauge in ["inflight_requests", "active_requests", "queued_requests"] {
            assert_eq!(
                sample(&text, &format!("dynamo_frontend_{gauge}{{model=\"m\"}}")),
                Some(0.0),
                "{gauge}"
            );
        }
        assert_eq!(
            sample(
                &text,
                "dynamo_frontend_requests_total{model=\"m\",endpoint=\"chat_completions\",request_type=\"stream\",status=\"success\",error_type=\"\"}"
            ),
            None
        );
    }

    /// Two decode engines holding 640 KV tokens (usage 0.2), nothing queued or running.
    fn two_engines() -> Snapshot {
        Snapshot {
            decode_engines: 2,
            kv_tokens: 640.0,
            kv_usage: 0.2,
            ..Snapshot::default()
        }
    }

    #[test]
    fn an_aggregated_frontend_labels_its_stages_as_dynamos_does() {
        // Dynamo 1.6.1's frontend before aggregated mocker workers: `route` and `dispatch`
        // with phase `aggregated`, a request in `dispatch` until its first token (there as many
        // as `queued_requests`), no prefill or decode phases.
        let mut m = FrontendMetrics::new("m", 1600.0, 16).aggregated(true);
        m.arrived(&job());
        let snapshot = Snapshot {
            prefill_queue: 5,
            prefill_queue_tokens: 5000.0,
            prefill_active_tokens: vec![1000.0, 0.0],
            decode_queue: 1,
            decoding: 4,
            ..two_engines()
        };
        m.update(&snapshot, &[], &["w-0".into(), "w-1".into()]);
        let text = m.encode().unwrap();
        let stage = |stage: &str, phase: &str| {
            sample(
                &text,
                &format!("dynamo_frontend_stage_requests{{stage=\"{stage}\",phase=\"{phase}\"}}"),
            )
        };
        assert_eq!(stage("dispatch", "aggregated"), Some(7.0), "{text}");
        assert_eq!(stage("route", "aggregated"), Some(0.0));
        assert_eq!(stage("preprocess", ""), Some(0.0));
        assert_eq!(
            sample(&text, "dynamo_frontend_queued_requests{model=\"m\"}"),
            Some(7.0)
        );
        for phase in ["prefill", "decode"] {
            assert!(!text.contains(&format!("phase=\"{phase}\"")), "{phase}: {text}");
        }
    }

    #[test]
    fn gauges_follow_the_model_and_its_workers() {
        let mut m = FrontendMetrics::new("m", 1600.0, 16);
        m.arrived(&job());
        m.first_token(&job(), 0.0, 0.5);
        m.tokens(&job(), 1.0, 3.0, 0.04);
        let snapshot = Snapshot {
            prefill_queue: 7,
            prefill_queue_tokens: 21_000.0,
            prefill_active_tokens: vec![3000.0, 0.0],
            decode_queue: 2,
            decoding: 3,
            ..two_engines()
        };
        let prefill = vec!["p-0".to_string(), "p-1".to_string()];
        let decode = vec!["d-0".to_string(), "d-1".to_string()];
        m.update(&snapshot, &prefill, &decode);
        let text = m.encode().unwrap();
        let value = |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"));
        let worker =
            |id: &str, kind: &str| format!("{{worker_id=\"{id}\",dp_rank=\"none\",worker_type=\"{kind}\"}}");
        assert_eq!(
            value(&format!(
                "dynamo_frontend_worker_last_time_to_first_token_seconds{}",
                worker("p-1", "prefill")
            )),
            0.5
        );
        assert_eq!(
            value(&format!(
                "dynamo_frontend_worker_last_input_sequence_tokens{}",
                worker("p-0", "prefill")
            )),
            3000.0
        );
        assert_eq!(
            value(&format!(
                "dynamo_frontend_worker_last_inter_token_latency_seconds{}",
                worker("d-0", "decode")
            )),
            0.04
        );
        // Seven wait for a prefill engine and one is prefilled: eight at prefill; two more wait
        // for decode without a first token; three decode.
        assert_eq!(
            value("dynamo_frontend_stage_requests{stage=\"dispatch\",phase=\"prefill\"}"),
            8.0
        );
        assert_eq!(
            value("dynamo_frontend_stage_requests{stage=\"dispatch\",phase=\"decode\"}"),
            2.0
        );
        assert_eq!(
            value("dynamo_frontend_stage_requests{stage=\"route\",phase=\"prefill\"}"),
            0.0
        );
        assert_eq!(value("dynamo_frontend_queued_requests{model=\"m\"}"), 10.0);
        assert_eq!(value("dynamo_frontend_inflight_requests{model=\"m\"}"), 13.0);
        assert_eq!(value("dynamo_frontend_active_requests{model=\"m\"}"), 13.0);
        assert!(
            !text.contains("worker_active_decode_blocks") && !text.contains("router_queue"),
            "{text}"
        );
        let engines = m.encode_engines().unwrap();
        assert_eq!(
            sample(
                &engines,
                "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\",worker_id=\"d-1\"}"
            ),
            Some(0.2),
            "{engines}"
        );
        assert!(
            engines.contains("# TYPE vllm:kv_cache_usage_perc gauge"),
            "{engines}"
        );
        // A worker that is gone loses its series.
        m.update(&snapshot, &prefill[..1], &decode[..1]);
        let text = m.encode().unwrap() + &m.encode_engines().unwrap();
        assert!(!text.contains("p-1") && !text.contains("d-1"), "{text}");
        assert!(text.contains("p-0") && text.contains("d-0"));
    }
}

//! The `dynamo_frontend_*` metrics of a Dynamo frontend, with the names, labels and buckets of Dynamo's
//! `lib/runtime/src/metrics/prometheus_names.rs`, fed by the
//! latency model through [`Observer`].
//!
//! Names, label names and histogram buckets are upstream's (`lib/llm/src/http/service/metrics.rs`;
//! log-spaced buckets with the default `DYN_METRICS_*` minimum, maximum and count):
//! - `requests_total{model, endpoint, request_type, status}` (incremented when a request ends,
//!   as upstream's in-flight guard does on drop), and `requests_started_total{model, endpoint,
//!   request_type}` (incremented when the frontend accepts a request),
//! - histograms `{model}`: `time_to_first_token_seconds`, `inter_token_latency_seconds` (one
//!   observation per token), `request_duration_seconds`, `input_sequence_tokens`,
//!   `output_sequence_tokens`,
//! - `inflight_requests{model}`, `queued_requests{model}`, `output_tokens_total{model}`,
//!   `model_total_kv_blocks{model}`, `model_kv_cache_block_size{model}`,
//! - the KV router's per-worker gauges `worker_active_decode_blocks`,
//!   `worker_active_prefill_tokens`, `worker_last_time_to_first_token_seconds`,
//!   `worker_last_input_sequence_tokens`, `worker_last_inter_token_latency_seconds`
//!   `{worker_id, dp_rank, worker_type}`, and `router_queue_pending_requests{worker_type}`,
//!   `router_queue_pending_isl_tokens{worker_type}`.
//!
//! `dynamo_namespace` is not among them: upstream's PodMonitor adds it when Prometheus scrapes
//! (relabelling the pod label `nvidia.com/dynamo-namespace`), so a scrape of this frontend
//! must add it too (see `config/synthetic-frontend/`).

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets_range},
    },
    registry::Registry,
};

use planner_core::latency::{Job, Observer, Outcome, Snapshot};

/// Upstream's metric prefix.
pub const PREFIX: &str = "dynamo_frontend";

/// `{model}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// Served model name, lower-cased.
    pub model: String,
}

/// `requests_total` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Served model name, lower-cased.
    pub model: String,
    /// `chat_completions` or `completions`.
    pub endpoint: String,
    /// `stream` or `unary`.
    pub request_type: String,
    /// `success` or `error`.
    pub status: String,
}

/// `requests_started_total` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StartedLabels {
    /// Served model name, lower-cased.
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
    /// Data-parallel rank.
    pub dp_rank: String,
    /// `prefill` or `decode`.
    pub worker_type: String,
}

/// `{worker_type}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerTypeLabels {
    /// `prefill` or `decode`.
    pub worker_type: String,
}

type Histograms = Family<ModelLabels, Histogram, fn() -> Histogram>;
type FloatGauge = Gauge<f64, AtomicU64>;

fn ttft_histogram() -> Histogram {
    Histogram::new(exponential_buckets_range(0.001, 480.0, 18))
}
fn itl_histogram() -> Histogram {
    Histogram::new(exponential_buckets_range(0.001, 2.0, 13))
}
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets_range(1.0, 256.0, 10))
}
fn isl_histogram() -> Histogram {
    Histogram::new(exponential_buckets_range(50.0, 128_000.0, 12))
}
fn osl_histogram() -> Histogram {
    Histogram::new(exponential_buckets_range(50.0, 32_000.0, 10))
}

/// The frontend's metrics and the registry that exposes them.
#[derive(Debug)]
pub struct FrontendMetrics {
    registry: Registry,
    model: ModelLabels,
    kv_block_size: f64,
    requests: Family<RequestLabels, Counter>,
    started: Family<StartedLabels, Counter>,
    ttft: Histograms,
    itl: Histograms,
    duration: Histograms,
    isl: Histograms,
    osl: Histograms,
    inflight: Family<ModelLabels, Gauge>,
    queued: Family<ModelLabels, Gauge>,
    output_tokens: Family<ModelLabels, Counter>,
    total_kv_blocks: Family<ModelLabels, Gauge>,
    block_size: Family<ModelLabels, Gauge>,
    active_decode_blocks: Family<WorkerLabels, FloatGauge>,
    active_prefill_tokens: Family<WorkerLabels, FloatGauge>,
    last_ttft: Family<WorkerLabels, FloatGauge>,
    last_isl: Family<WorkerLabels, FloatGauge>,
    last_itl: Family<WorkerLabels, FloatGauge>,
    queue_requests: Family<WorkerTypeLabels, Gauge>,
    queue_isl_tokens: Family<WorkerTypeLabels, FloatGauge>,
    /// Tokens emitted but not yet observed in the ITL histogram (fractions within a step).
    pending_tokens: f64,
    last: LastValues,
    workers: (Vec<String>, Vec<String>),
}

#[derive(Clone, Copy, Debug, Default)]
struct LastValues {
    ttft_s: f64,
    isl: f64,
    itl_s: f64,
}

impl FrontendMetrics {
    /// Registers every metric for `model` (lower-cased, as the frontend does). `max_kv_tokens`
    /// and `kv_block_size` give `model_total_kv_blocks` (per engine).
    pub fn new(model: &str, max_kv_tokens: f64, kv_block_size: u32) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let model = ModelLabels {
            model: model.to_lowercase(),
        };
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Total number of LLM requests processed",
            requests.clone(),
        );
        let started = Family::<StartedLabels, Counter>::default();
        registry.register(
            "requests_started",
            "Total number of LLM requests accepted by the frontend",
            started.clone(),
        );
        let histogram = |registry: &mut Registry, name: &str, help: &str, make: fn() -> Histogram| {
            let family: Histograms = Family::new_with_constructor(make);
            registry.register(name, help, family.clone());
            family
        };
        let ttft = histogram(
            &mut registry,
            "time_to_first_token_seconds",
            "Time to first token in seconds",
            ttft_histogram,
        );
        let itl = histogram(
            &mut registry,
            "inter_token_latency_seconds",
            "Inter-token latency in seconds",
            itl_histogram,
        );
        let duration = histogram(
            &mut registry,
            "request_duration_seconds",
            "Duration of LLM requests",
            duration_histogram,
        );
        let isl = histogram(
            &mut registry,
            "input_sequence_tokens",
            "Input sequence length in tokens",
            isl_histogram,
        );
        let osl = histogram(
            &mut registry,
            "output_sequence_tokens",
            "Output sequence length in tokens",
            osl_histogram,
        );
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let family = Family::<ModelLabels, Gauge>::default();
            registry.register(name, help, family.clone());
            family
        };
        let inflight = gauge(&mut registry, "inflight_requests", "Number of inflight requests");
        let queued = gauge(
            &mut registry,
            "queued_requests",
            "Number of requests in the HTTP processing queue",
        );
        let total_kv_blocks = gauge(
            &mut registry,
            "model_total_kv_blocks",
            "Total KV cache blocks of a worker",
        );
        let block_size = gauge(
            &mut registry,
            "model_kv_cache_block_size",
            "KV cache block size in tokens",
        );
        let output_tokens = Family::<ModelLabels, Counter>::default();
        registry.register(
            "output_tokens",
            "Total output tokens generated",
            output_tokens.clone(),
        );
        let worker = |registry: &mut Registry, name: &str, help: &str| {
            let family = Family::<WorkerLabels, FloatGauge>::default();
            registry.register(name, help, family.clone());
            family
        };
        let active_decode_blocks = worker(
            &mut registry,
            "worker_active_decode_blocks",
            "Active KV cache blocks of a decode worker",
        );
        let active_prefill_tokens = worker(
            &mut registry,
            "worker_active_prefill_tokens",
            "Prompt tokens being prefilled by a worker",
        );
        let last_ttft = worker(
            &mut registry,
            "worker_last_time_to_first_token_seconds",
            "Last time to first token of a worker",
        );
        let last_isl = worker(
            &mut registry,
            "worker_last_input_sequence_tokens",
            "Last input sequence length of a worker",
        );
        let last_itl = worker(
            &mut registry,
            "worker_last_inter_token_latency_seconds",
            "Last inter-token latency of a worker",
        );
        let queue_requests = Family::<WorkerTypeLabels, Gauge>::default();
        registry.register(
            "router_queue_pending_requests",
            "Requests waiting in the router queue",
            queue_requests.clone(),
        );
        let queue_isl_tokens = Family::<WorkerTypeLabels, FloatGauge>::default();
        registry.register(
            "router_queue_pending_isl_tokens",
            "Prompt tokens of the requests waiting in the router queue",
            queue_isl_tokens.clone(),
        );
        let blocks = if kv_block_size > 0 {
            (max_kv_tokens / f64::from(kv_block_size)).floor()
        } else {
            0.0
        };
        total_kv_blocks.get_or_create(&model).set(blocks as i64);
        block_size.get_or_create(&model).set(i64::from(kv_block_size));
        // Every family with the model label exists from the start, so Prometheus sees the series
        // (at zero) before the first request: an idle frontend is not a missing one.
        let success = RequestLabels {
            model: model.model.clone(),
            endpoint: "chat_completions".into(),
            request_type: "stream".into(),
            status: "success".into(),
        };
        let _ = requests.get_or_create(&success);
        for family in [&ttft, &itl, &duration, &isl, &osl] {
            let _ = family.get_or_create(&model);
        }
        let _ = started.get_or_create(&StartedLabels {
            model: model.model.clone(),
            endpoint: "chat_completions".into(),
            request_type: "stream".into(),
        });
        let _ = inflight.get_or_create(&model);
        let _ = queued.get_or_create(&model);
        let _ = output_tokens.get_or_create(&model);
        for worker_type in ["prefill", "decode"] {
            let labels = WorkerTypeLabels {
                worker_type: worker_type.into(),
            };
            let _ = queue_requests.get_or_create(&labels);
            let _ = queue_isl_tokens.get_or_create(&labels);
        }
        Self {
            registry,
            model,
            kv_block_size: f64::from(kv_block_size.max(1)),
            requests,
            started,
            ttft,
            itl,
            duration,
            isl,
            osl,
            inflight,
            queued,
            output_tokens,
            total_kv_blocks,
            block_size,
            active_decode_blocks,
            active_prefill_tokens,
            last_ttft,
            last_isl,
            last_itl,
            queue_requests,
            queue_isl_tokens,
            pending_tokens: 0.0,
            last: LastValues::default(),
            workers: (Vec::new(), Vec::new()),
        }
    }

    /// The exposition (OpenMetrics text).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        encode(&mut text, &self.registry)?;
        Ok(text)
    }

    fn worker_labels(id: &str, worker_type: &str) -> WorkerLabels {
        WorkerLabels {
            worker_id: id.to_string(),
            dp_rank: "0".into(),
            worker_type: worker_type.into(),
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
    pub fn update(&mut self, snapshot: &Snapshot, prefill: &[String], decode: &[String]) {
        let in_flight = snapshot.prefill_queue
            + snapshot
                .prefill_active_tokens
                .iter()
                .filter(|t| **t > 0.0)
                .count()
            + snapshot.decode_queue
            + snapshot.decoding;
        self.inflight.get_or_create(&self.model).set(in_flight as i64);
        self.queued
            .get_or_create(&self.model)
            .set(snapshot.prefill_queue as i64);
        for (worker_type, count, tokens) in [
            ("prefill", snapshot.prefill_queue, snapshot.prefill_queue_tokens),
            ("decode", snapshot.decode_queue, 0.0),
        ] {
            let labels = WorkerTypeLabels {
                worker_type: worker_type.into(),
            };
            self.queue_requests.get_or_create(&labels).set(count as i64);
            self.queue_isl_tokens.get_or_create(&labels).set(tokens);
        }
        let (old_prefill, old_decode) = std::mem::take(&mut self.workers);
        for gone in old_prefill.iter().filter(|w| !prefill.contains(w)) {
            let labels = Self::worker_labels(gone, "prefill");
            for family in [&self.active_prefill_tokens, &self.last_ttft, &self.last_isl] {
                family.remove(&labels);
            }
        }
        for gone in old_decode.iter().filter(|w| !decode.contains(w)) {
            let labels = Self::worker_labels(gone, "decode");
            for family in [&self.active_decode_blocks, &self.last_itl] {
                family.remove(&labels);
            }
        }
        for (i, id) in prefill.iter().enumerate() {
            let labels = Self::worker_labels(id, "prefill");
            let tokens = snapshot.prefill_active_tokens.get(i).copied().unwrap_or(0.0);
            self.active_prefill_tokens.get_or_create(&labels).set(tokens);
            self.last_ttft.get_or_create(&labels).set(self.last.ttft_s);
            self.last_isl.get_or_create(&labels).set(self.last.isl);
        }
        let per_decode_worker = if decode.is_empty() {
            0.0
        } else {
            snapshot.kv_tokens / decode.len() as f64 / self.kv_block_size
        };
        for id in decode {
            let labels = Self::worker_labels(id, "decode");
            self.active_decode_blocks
                .get_or_create(&labels)
                .set(per_decode_worker.ceil());
            self.last_itl.get_or_create(&labels).set(self.last.itl_s);
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
    }

    fn first_token(&mut self, job: &Job, _at_s: f64, ttft_s: f64) {
        self.ttft.get_or_create(&self.model).observe(ttft_s);
        self.isl.get_or_create(&self.model).observe(job.isl);
        self.output_tokens.get_or_create(&self.model).inc();
        self.last.ttft_s = ttft_s;
        self.last.isl = job.isl;
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
    }

    fn completed(&mut self, job: &Job, _at_s: f64, outcome: &Outcome) {
        let labels = RequestLabels {
            model: self.model.model.clone(),
            endpoint: "chat_completions".into(),
            request_type: "stream".into(),
            status: "success".into(),
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
    fn sample(text: &str, series: &str) -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("no `{series}` in\n{text}"));
        line[series.len()..].trim().parse().unwrap()
    }

    #[test]
    fn exposes_upstream_names_labels_and_buckets() {
        let mut m = FrontendMetrics::new("Llama-3.3-70B", 224_133.0, 16);
        let started = "dynamo_frontend_requests_started_total{model=\"llama-3.3-70b\",endpoint=\"chat_completions\",request_type=\"stream\"}";
        assert_eq!(sample(&m.encode().unwrap(), started), 0.0);
        m.arrived(&job());
        // Counted when accepted, before any completion.
        assert_eq!(sample(&m.encode().unwrap(), started), 1.0);
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
        let model = "{model=\"llama-3.3-70b\"}";
        assert_eq!(
            sample(
                &text,
                "dynamo_frontend_requests_total{model=\"llama-3.3-70b\",endpoint=\"chat_completions\",request_type=\"stream\",status=\"success\"}"
            ),
            1.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("dynamo_frontend_time_to_first_token_seconds_sum{model}")
            ),
            0.25
        );
        assert_eq!(
            sample(
                &text,
                &format!("dynamo_frontend_time_to_first_token_seconds_count{model}")
            ),
            1.0
        );
        // One ITL observation per token after the first: 150 of them.
        assert_eq!(
            sample(
                &text,
                &format!("dynamo_frontend_inter_token_latency_seconds_count{model}")
            ),
            150.0
        );
        assert!(
            (sample(
                &text,
                &format!("dynamo_frontend_inter_token_latency_seconds_sum{model}")
            ) - 3.0)
                .abs()
                < 1e-9
        );
        assert_eq!(
            sample(
                &text,
                &format!("dynamo_frontend_request_duration_seconds_sum{model}")
            ),
            3.25
        );
        assert_eq!(
            sample(
                &text,
                &format!("dynamo_frontend_input_sequence_tokens_sum{model}")
            ),
            3000.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("dynamo_frontend_output_sequence_tokens_sum{model}")
            ),
            151.0
        );
        assert_eq!(
            sample(&text, &format!("dynamo_frontend_output_tokens_total{model}")),
            151.0
        );
        assert_eq!(
            sample(&text, &format!("dynamo_frontend_model_total_kv_blocks{model}")),
            14_008.0
        );
        assert_eq!(m.total_kv_blocks(), 14_008);
        assert_eq!(m.block_size(), 16);
        // Upstream's default buckets: 18 log-spaced from 1 ms to 480 s (plus +Inf).
        let ttft_buckets = text
            .lines()
            .filter(|l| l.starts_with("dynamo_frontend_time_to_first_token_seconds_bucket"))
            .count();
        assert_eq!(ttft_buckets, 19);
        let itl_buckets = text
            .lines()
            .filter(|l| l.starts_with("dynamo_frontend_inter_token_latency_seconds_bucket"))
            .count();
        assert_eq!(itl_buckets, 14);
        assert!(text.contains("# TYPE dynamo_frontend_requests counter"));
        assert!(text.contains("# TYPE dynamo_frontend_time_to_first_token_seconds histogram"));
        assert!(
            !text.contains("dynamo_namespace"),
            "added by the scrape, not the frontend"
        );
        assert!(text.trim_end().ends_with("# EOF"));
    }

    #[test]
    fn idle_frontend_exposes_zero_series() {
        let m = FrontendMetrics::new("m", 1600.0, 16);
        let text = m.encode().unwrap();
        assert_eq!(
            sample(
                &text,
                "dynamo_frontend_requests_total{model=\"m\",endpoint=\"chat_completions\",request_type=\"stream\",status=\"success\"}"
            ),
            0.0
        );
        assert_eq!(
            sample(
                &text,
                "dynamo_frontend_time_to_first_token_seconds_count{model=\"m\"}"
            ),
            0.0
        );
        assert_eq!(
            sample(
                &text,
                "dynamo_frontend_router_queue_pending_requests{worker_type=\"prefill\"}"
            ),
            0.0
        );
        assert_eq!(
            sample(&text, "dynamo_frontend_model_total_kv_blocks{model=\"m\"}"),
            100.0
        );
    }

    #[test]
    fn worker_gauges_follow_the_workers() {
        let mut m = FrontendMetrics::new("m", 1600.0, 16);
        m.first_token(&job(), 0.0, 0.5);
        m.tokens(&job(), 1.0, 3.0, 0.04);
        let snapshot = Snapshot {
            prefill_queue: 7,
            prefill_queue_tokens: 21_000.0,
            prefill_active_tokens: vec![3000.0, 0.0],
            decode_queue: 2,
            decoding: 3,
            decode_engines: 2,
            kv_tokens: 640.0,
            kv_usage: 0.2,
            prefill_work_started_s: 0.0,
        };
        let prefill = vec!["p-0".to_string(), "p-1".to_string()];
        let decode = vec!["d-0".to_string(), "d-1".to_string()];
        m.update(&snapshot, &prefill, &decode);
        let text = m.encode().unwrap();
        let worker =
            |id: &str, kind: &str| format!("{{worker_id=\"{id}\",dp_rank=\"0\",worker_type=\"{kind}\"}}");
        assert_eq!(
            sample(
                &text,
                &format!(
                    "dynamo_frontend_worker_active_prefill_tokens{}",
                    worker("p-0", "prefill")
                )
            ),
            3000.0
        );
        assert_eq!(
            sample(
                &text,
                &format!(
                    "dynamo_frontend_worker_active_prefill_tokens{}",
                    worker("p-1", "prefill")
                )
            ),
            0.0
        );
        // 640 KV tokens over 2 workers of 16-token blocks: 20 blocks each.
        assert_eq!(
            sample(
                &text,
                &format!(
                    "dynamo_frontend_worker_active_decode_blocks{}",
                    worker("d-1", "decode")
                )
            ),
            20.0
        );
        assert_eq!(
            sample(
                &text,
                &format!(
                    "dynamo_frontend_worker_last_time_to_first_token_seconds{}",
                    worker("p-1", "prefill")
                )
            ),
            0.5
        );
        assert_eq!(
            sample(
                &text,
                &format!(
                    "dynamo_frontend_worker_last_input_sequence_tokens{}",
                    worker("p-0", "prefill")
                )
            ),
            3000.0
        );
        assert_eq!(
            sample(
                &text,
                &format!(
                    "dynamo_frontend_worker_last_inter_token_latency_seconds{}",
                    worker("d-0", "decode")
                )
            ),
            0.04
        );
        assert_eq!(
            sample(
                &text,
                "dynamo_frontend_router_queue_pending_requests{worker_type=\"prefill\"}"
            ),
            7.0
        );
        assert_eq!(
            sample(
                &text,
                "dynamo_frontend_router_queue_pending_requests{worker_type=\"decode\"}"
            ),
            2.0
        );
        assert_eq!(
            sample(
                &text,
                "dynamo_frontend_router_queue_pending_isl_tokens{worker_type=\"prefill\"}"
            ),
            21_000.0
        );
        assert_eq!(sample(&text, "dynamo_frontend_queued_requests{model=\"m\"}"), 7.0);
        assert_eq!(
            sample(&text, "dynamo_frontend_inflight_requests{model=\"m\"}"),
            13.0
        );
        // A worker that is gone loses its series.
        m.update(&snapshot, &prefill[..1], &decode[..1]);
        let text = m.encode().unwrap();
        assert!(!text.contains("p-1") && !text.contains("d-1"), "{text}");
        assert!(text.contains("p-0") && text.contains("d-0"));
    }
}

//! The frontend metrics the SLA planner reads from Prometheus: the queries of Dynamo's planner
//! (`prometheus.py`) over the frontend's `dynamo_frontend_*` metrics.
//!
//! Each quantity is one instant query over the adjustment interval. Unlike upstream, which
//! fetches every series and filters in Python, the Dynamo namespace is matched in PromQL (so a
//! thousand policies do not each download every frontend's series); the model is still
//! compared case-insensitively on the client, as upstream does. A graph served by several
//! frontends has one series per frontend (and per model): a mean is the sum of the increases of
//! every frontend's `_sum` over the sum of their `_count`s, weighted by the requests each
//! frontend served, as Dynamo 1.6's planner computes it (the mean of per-frontend ratios would
//! let an idle frontend count as much as a busy one); request counts and histogram buckets are
//! sums over the frontends too.

use std::time::Duration;

use serde::Deserialize;

pub use planner_api::KvUsageSource;
use planner_core::{sizing::LengthMoments, sla::Observation, state::FastSignals};

/// Metric name prefix of Dynamo frontends.
pub const FRONTEND_PREFIX: &str = "dynamo_frontend";

/// Which series of the frontend metrics belong to one graph and model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeriesFilter {
    /// Value of the `dynamo_namespace` label (added by the frontend PodMonitor).
    pub dynamo_namespace: String,
    /// Model name, compared case-insensitively with the `model` label.
    pub model: String,
}

/// The histogram means the planner reads, and how each is scaled.
const MEANS: [(&str, &str, f64); 5] = [
    ("ttft_ms", "time_to_first_token_seconds", 1000.0),
    ("itl_ms", "inter_token_latency_seconds", 1000.0),
    ("request_duration_s", "request_duration_seconds", 1.0),
    ("isl", "input_sequence_tokens", 1.0),
    ("osl", "output_sequence_tokens", 1.0),
];

/// A PromQL label matcher value: backslashes and quotes escaped.
fn quote(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The graph's series: `{dynamo_namespace="<ns>"}`.
fn graph(dynamo_namespace: &str) -> String {
    format!("dynamo_namespace={}", quote(dynamo_namespace))
}

/// The gauge of a Dynamo process's age (its distributed runtime's uptime): what tells a
/// frontend that started within the window from one Prometheus only just found.
pub const UPTIME_GAUGE: &str = "dynamo_component_uptime_seconds";

/// `increase(series[window])` per series, counting a series new to the frontend from zero: a
/// counter series that appeared within the window (the frontend creates a label set on its first
/// use, so a new graph's first requests, a first error, or a restarted frontend start one)
/// counts its last value, all of it counted since it started at zero, where `increase` would
/// miss what it held at its first sample.
///
/// A series is new to Prometheus, not to the frontend, when Prometheus only began scraping its
/// target within the window (a restart without storage, a PodMonitor added to a running graph)
/// and the series was there at every successful scrape since, while the frontend's
/// [`UPTIME_GAUGE`] says it started before the window: its last value is the frontend's
/// lifetime, so it counts what `increase` sees. The target is matched on `instance` and `job`,
/// which every series of a scrape shares; a frontend without the gauge, or a scrape that gives
/// `up` none of the series' labels, keeps counting from zero.
pub fn increase_query(series: &str, window_s: u64) -> String {
    let w = format!("[{window_s}s]");
    // The series' own label matchers, for the target's `up` and uptime (every target of a
    // graph's scrape carries the graph's Dynamo namespace; the fast read, over all graphs, takes
    // the targets that carry one).
    let selector = match series.find('{') {
        Some(at) => &series[at..],
        None => "{dynamo_namespace!=\"\"}",
    };
    let born = format!("(max_over_time({series}{w}) unless {series} offset {window_s}s)");
    let up = format!("up{selector}");
    let since_first_scrape =
        format!("(count_over_time({series}{w}) >= on (instance, job) group_left sum_over_time({up}{w}))");
    let target_new = format!("(max_over_time({up}{w}) unless {up} offset {window_s}s)");
    let frontend_older = format!("({UPTIME_GAUGE}{selector} > {window_s})");
    let found = format!(
        "({since_first_scrape} and on (instance, job) {target_new} and on (instance, job) {frontend_older})"
    );
    let new = format!("({born} unless {found})");
    format!("(increase({series}{w}) unless {new} or {new})")
}

/// The first 200 characters of a query, for messages (a condition's message is bounded, and
/// Prometheus's reason, which comes after the query, is what a reader needs).
fn shortened(query: &str) -> String {
    const KEEP: usize = 200;
    match query.char_indices().nth(KEEP) {
        Some((at, _)) => format!("{}…", &query[..at]),
        None => query.to_string(),
    }
}

/// The PromQL mean of a frontend histogram over the window, per model, over all the graph's
/// frontends: their summed increases of `_sum` over their summed increases of `_count`.
pub fn mean_query(histogram: &str, filter: &SeriesFilter, window_s: u64) -> String {
    let selector = format!("{{{}}}", graph(&filter.dynamo_namespace));
    format!(
        "sum by (model) ({}) / sum by (model) ({})",
        increase_query(&format!("{FRONTEND_PREFIX}_{histogram}_sum{selector}"), window_s),
        increase_query(
            &format!("{FRONTEND_PREFIX}_{histogram}_count{selector}"),
            window_s
        )
    )
}

/// The PromQL request count over the window, per series.
pub fn requests_query(filter: &SeriesFilter, window_s: u64) -> String {
    increase_query(
        &format!(
            "{FRONTEND_PREFIX}_requests_total{{{}}}",
            graph(&filter.dynamo_namespace)
        ),
        window_s,
    )
}

/// The PromQL count of requests the frontend accepted over the window, per series.
pub fn started_query(filter: &SeriesFilter, window_s: u64) -> String {
    increase_query(
        &format!(
            "{FRONTEND_PREFIX}_requests_started_total{{{}}}",
            graph(&filter.dynamo_namespace)
        ),
        window_s,
    )
}

/// The PromQL value of a frontend gauge now, per series.
pub fn gauge_query(gauge: &str, filter: &SeriesFilter) -> String {
    format!("{FRONTEND_PREFIX}_{gauge}{{{}}}", graph(&filter.dynamo_namespace))
}

/// The PromQL requests the frontend is handling now, per series: `active_requests`, or the
/// deprecated `inflight_requests` (the same count) on frontends without it.
pub fn in_flight_query(filter: &SeriesFilter) -> String {
    format!(
        "{} or {}",
        gauge_query("active_requests", filter),
        gauge_query("inflight_requests", filter)
    )
}

/// The frontend's pipeline stages before a first token: tokenising, routing to a prefill worker
/// and waiting on it (`stage_requests{stage, phase}`; requests past prefill, waiting for decode,
/// are in none of them). A frontend of an aggregated graph labels its route and dispatch stages
/// `phase="aggregated"`, its dispatch lasting until the first token as a prefill dispatch does.
const PREFILL_STAGES: &str = "stage=~\"preprocess|route|dispatch\",phase=~\"|prefill|aggregated\"";

/// The PromQL requests waiting for or in prefill now, over the graph's frontends (the stage
/// gauges carry no model label).
pub fn prefill_pending_query(dynamo_namespace: &str) -> String {
    format!(
        "sum({FRONTEND_PREFIX}_stage_requests{{{},{PREFILL_STAGES}}})",
        graph(dynamo_namespace)
    )
}

/// The PromQL requests waiting for a prefill engine now: those tokenised or routed, and those
/// dispatched beyond one per engine of the `prefill_engines` serving; none when the frontend
/// has no prefill dispatch series (then the router's queue is read instead).
pub fn prefill_waiting_query(dynamo_namespace: &str, prefill_engines: u32) -> String {
    let stage = |stages: &str| {
        format!(
            "sum({FRONTEND_PREFIX}_stage_requests{{{},{stages}}})",
            graph(dynamo_namespace)
        )
    };
    format!(
        "({} or vector(0)) + clamp_min({} - {prefill_engines}, 0)",
        stage("stage=~\"preprocess|route\",phase=~\"|prefill|aggregated\""),
        stage("stage=\"dispatch\",phase=~\"prefill|aggregated\"")
    )
}

/// The PromQL share of the `prefill_engines` serving that are busy: the requests the frontend
/// has dispatched to a prefill engine and not yet had a first token for, at most one per engine
/// (an engine holding several is busy once), over the engines; none when the frontend has no
/// prefill dispatch series.
pub fn prefill_busy_query(dynamo_namespace: &str, prefill_engines: u32) -> String {
    format!(
        "clamp_max(sum({FRONTEND_PREFIX}_stage_requests{{{},stage=\"dispatch\",phase=\"prefill\"}}) / {prefill_engines}, 1)",
        graph(dynamo_namespace)
    )
}

/// The PromQL prefill requests held in the KV router's queue now (only with router queueing on;
/// a frontend in round-robin mode has no such series).
pub fn router_queue_query(dynamo_namespace: &str) -> String {
    format!(
        "sum({FRONTEND_PREFIX}_router_queue_pending_requests{{{},worker_type=\"prefill\"}})",
        graph(dynamo_namespace)
    )
}

/// The PromQL models the frontend of a graph serves (the `model_*` gauges it sets when a
/// worker registers a model, before any request).
pub fn served_models_query(dynamo_namespace: &str) -> String {
    format!(
        "group by (model) ({{__name__=~\"{FRONTEND_PREFIX}_model_.+\",{}}})",
        graph(dynamo_namespace)
    )
}

/// The PromQL bucket counts of a frontend histogram over the window, per model and bound.
pub fn buckets_query(histogram: &str, filter: &SeriesFilter, window_s: u64) -> String {
    format!(
        "sum by (model, le) ({})",
        increase_query(
            &format!(
                "{FRONTEND_PREFIX}_{histogram}_bucket{{{}}}",
                graph(&filter.dynamo_namespace)
            ),
            window_s
        )
    )
}

/// The PromQL `quantile` (0..1) of a frontend histogram over the window, per model.
pub fn quantile_query(histogram: &str, quantile: f64, filter: &SeriesFilter, window_s: u64) -> String {
    format!(
        "histogram_quantile({quantile}, {})",
        buckets_query(histogram, filter, window_s)
    )
}

/// A regular expression matching every `dynamo_namespace` a graph's workers' series carry: the
/// graph's Dynamo namespace (as a scrape relabels it from the pod label, or a worker without a
/// generation suffix) or its worker namespace `<ns>-<8 hex digits>` (Dynamo's operator suffixes
/// workers with their spec hash), either as written (labels Dynamo's Python code injects) or
/// with every other character than letters, digits and `_` made `_` (Dynamo's Rust metrics).
pub fn worker_namespaces(dynamo_namespace: &str) -> String {
    let escape = |text: &str| {
        text.chars().fold(String::new(), |mut out, c| {
            if "\\.+*?()|[]{}^$".contains(c) {
                out.push('\\');
            }
            out.push(c);
            out
        })
    };
    let underscored: String = dynamo_namespace
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "{}(-[0-9a-f]{{8}})?|{}(_[0-9a-f]{{8}})?",
        escape(dynamo_namespace),
        escape(&underscored)
    )
}

/// The decode workers of a graph: their namespace, and not marked prefill (by the component
/// Dynamo's runtime registers, or the pod's component type a PodMonitor copies).
fn decode_workers(dynamo_namespace: &str) -> String {
    format!(
        "dynamo_namespace=~{},dynamo_component!=\"prefill\",dynamo_component_type!=\"prefill\"",
        quote(&worker_namespaces(dynamo_namespace))
    )
}

/// The PromQL KV-cache usage (0..1) of the decode engines now, averaged over them, as the
/// engines measure it: Dynamo's `dynamo_component_gpu_cache_usage_percent` (vLLM, SGLang,
/// TensorRT-LLM workers), else vLLM's own `vllm:kv_cache_usage_perc` (also the mocker's).
pub fn engine_kv_usage_query(dynamo_namespace: &str) -> String {
    let workers = decode_workers(dynamo_namespace);
    format!(
        "(avg(dynamo_component_gpu_cache_usage_percent{{{workers}}}) or avg(vllm:kv_cache_usage_perc{{{workers}}}))"
    )
}

/// The PromQL KV-cache usage the KV router estimates for the decode workers now (the blocks of
/// the prompts it routed, per worker, over one engine's blocks): no output blocks, and only
/// this frontend's requests, so a lower bound of the engines'. It exists only with
/// `--router-mode kv`.
pub fn router_kv_usage_query(dynamo_namespace: &str) -> String {
    let ns = graph(dynamo_namespace);
    format!(
        "avg({FRONTEND_PREFIX}_worker_active_decode_blocks{{{ns},worker_type=\"decode\"}}) / max({FRONTEND_PREFIX}_model_total_kv_blocks{{{ns}}})"
    )
}

/// Seconds between the points of the KV-usage subqueries: fine enough to see a cache that
/// filled for a few scrapes, whatever the scrape interval.
const KV_SUBQUERY_STEP_S: u64 = 5;

/// A KV-usage `expression` over the last `window_s` seconds through `over` (`avg_over_time`:
/// the interval's mean; `max_over_time`: its peak).
pub fn kv_usage_over_query(over: &str, expression: &str, window_s: u64) -> String {
    format!("{over}(({expression})[{window_s}s:{KV_SUBQUERY_STEP_S}s])")
}

/// The distribution's moments from a histogram's bucket samples for `model` (cumulative counts
/// by upper bound) and its mean; `None` without buckets or observations.
pub fn moments_of(samples: &[Sample], model: &str, mean: f64) -> Option<LengthMoments> {
    let model = model.to_lowercase();
    let mut buckets: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.model.as_deref().is_some_and(|m| m.to_lowercase() == model))
        .filter_map(|s| s.le.map(|le| (le, s.value)))
        .filter(|(_, count)| count.is_finite())
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let count = buckets.last().filter(|(le, _)| le.is_infinite())?.1;
    if !(count > 0.0 && mean.is_finite()) {
        return None;
    }
    let (bounds, cumulative): (Vec<f64>, Vec<f64>) =
        buckets.into_iter().filter(|(le, _)| le.is_finite()).unzip();
    LengthMoments::from_histogram(&bounds, &cumulative, mean * count, count)
}

/// Why metrics could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// Prometheus did not answer, or answered with an HTTP error.
    #[error("cannot query Prometheus at {url}: {reason}")]
    Http {
        /// The server.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// Prometheus answered with an error status or a document that is not a query result.
    #[error("Prometheus rejected the query `{}`: {reason}", shortened(query))]
    Query {
        /// The query.
        query: String,
        /// Prometheus's explanation.
        reason: String,
    },
    /// No frontend series carry the graph's `dynamo_namespace`: the frontend is not scraped, or
    /// scraped without the label.
    #[error(
        "no dynamo_frontend_* series with dynamo_namespace {dynamo_namespace:?}: the graph's frontend is not scraped, or scraped without that label (its pods need the labels nvidia.com/metrics-enabled: \"true\" and nvidia.com/dynamo-namespace, and a PodMonitor that copies the latter into dynamo_namespace: NVIDIA's dynamo-frontend, or this chart's podMonitors)"
    )]
    NoFrontend {
        /// The namespace filter.
        dynamo_namespace: String,
    },
    /// No series matched the graph and model.
    #[error("no {metric} series for dynamo_namespace {dynamo_namespace:?} and model {model:?}")]
    NoSeries {
        /// The metric.
        metric: String,
        /// The namespace filter.
        dynamo_namespace: String,
        /// The model filter.
        model: String,
    },
}

impl MetricsError {
    /// A bounded category for metrics: `http`, `query` or `no_series`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Http { .. } => "http",
            Self::Query { .. } => "query",
            Self::NoFrontend { .. } | Self::NoSeries { .. } => "no_series",
        }
    }
}

/// One sample of an instant-query result.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// `model` label, if any.
    pub model: Option<String>,
    /// `le` label (a histogram bucket's upper bound), if any.
    pub le: Option<f64>,
    /// `dynamo_namespace` label, if any.
    pub dynamo_namespace: Option<String>,
    /// The value (`NaN` when Prometheus says so).
    pub value: f64,
}

#[derive(Deserialize)]
struct Response {
    status: String,
    #[serde(default)]
    data: Option<ResponseData>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct ResponseData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<VectorSample>,
}

#[derive(Deserialize)]
struct RangeResponse {
    status: String,
    #[serde(default)]
    data: Option<RangeData>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct RangeData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<MatrixSeries>,
}

#[derive(Deserialize)]
struct MatrixSeries {
    #[serde(default)]
    metric: std::collections::BTreeMap<String, String>,
    values: Vec<(f64, String)>,
}

/// One series of a range query.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// `model` label, if any.
    pub model: Option<String>,
    /// `(unix seconds, value)` pairs, oldest first.
    pub points: Vec<(f64, f64)>,
}

/// Parses a range-query response body.
pub fn parse_matrix(query: &str, body: &str) -> Result<Vec<Series>, MetricsError> {
    let response: RangeResponse = serde_json::from_str(body).map_err(|e| MetricsError::Query {
        query: query.into(),
        reason: format!("unreadable response: {e}"),
    })?;
    if response.status != "success" {
        return Err(MetricsError::Query {
            query: query.into(),
            reason: shorten(
                &response
                    .error
                    .unwrap_or_else(|| format!("status {}", response.status)),
            ),
        });
    }
    let data = response.data.ok_or_else(|| MetricsError::Query {
        query: query.into(),
        reason: "no data in the response".into(),
    })?;
    if data.result_type != "matrix" {
        return Err(MetricsError::Query {
            query: query.into(),
            reason: format!("expected a matrix result, got {}", data.result_type),
        });
    }
    Ok(data
        .result
        .into_iter()
        .map(|series| Series {
            model: series.metric.get("model").cloned(),
            points: series
                .values
                .into_iter()
                .filter_map(|(t, v)| match v.as_str() {
                    "NaN" => Some((t, f64::NAN)),
                    other => other.parse::<f64>().ok().map(|v| (t, v)),
                })
                .collect(),
        })
        .collect())
}

/// Combines series point by point: `(timestamp, values of the series that have that timestamp)`,
/// for the series whose model matches (`None` matches every series).
fn by_timestamp(series: &[Series], model: Option<&str>) -> Vec<(f64, Vec<f64>)> {
    let model = model.map(str::to_lowercase);
    let mut points: std::collections::BTreeMap<i64, (f64, Vec<f64>)> = std::collections::BTreeMap::new();
    for s in series {
        if let Some(model) = &model
            && s.model.as_deref().map(str::to_lowercase).as_ref() != Some(model)
        {
            continue;
        }
        for &(t, v) in &s.points {
            points
                .entry((t * 1000.0).round() as i64)
                .or_insert_with(|| (t, Vec::new()))
                .1
                .push(v);
        }
    }
    points.into_values().collect()
}

#[derive(Deserialize)]
struct VectorSample {
    #[serde(default)]
    metric: std::collections::BTreeMap<String, String>,
    value: (f64, String),
}

/// Parses an instant-query response body into samples. Entries that are not numbers are
/// skipped, as upstream's validation skips them; `NaN` is kept.
pub fn parse_vector(query: &str, body: &str) -> Result<Vec<Sample>, MetricsError> {
    let response: Response = serde_json::from_str(body).map_err(|e| MetricsError::Query {
        query: query.into(),
        reason: format!("unreadable response: {e}"),
    })?;
    if response.status != "success" {
        return Err(MetricsError::Query {
            query: query.into(),
            reason: shorten(
                &response
                    .error
                    .unwrap_or_else(|| format!("status {}", response.status)),
            ),
        });
    }
    let data = response.data.ok_or_else(|| MetricsError::Query {
        query: query.into(),
        reason: "no data in the response".into(),
    })?;
    if data.result_type != "vector" {
        return Err(MetricsError::Query {
            query: query.into(),
            reason: format!("expected a vector result, got {}", data.result_type),
        });
    }
    Ok(data
        .result
        .into_iter()
        .filter_map(|sample| {
            let value = match sample.value.1.as_str() {
                "NaN" => f64::NAN,
                other => other.parse::<f64>().ok()?,
            };
            Some(Sample {
                model: sample.metric.get("model").cloned(),
                le: sample.metric.get("le").and_then(|le| match le.as_str() {
                    "+Inf" => Some(f64::INFINITY),
                    other => other.parse().ok(),
                }),
                dynamo_namespace: sample.metric.get("dynamo_namespace").cloned(),
                value,
            })
        })
        .collect())
}

/// Samples whose model matches (case-insensitively).
fn matching<'a>(samples: &'a [Sample], model: &str) -> impl Iterator<Item = f64> + 'a {
    let model = model.to_lowercase();
    samples
        .iter()
        .filter(move |s| s.model.as_deref().is_some_and(|m| m.to_lowercase() == model))
        .map(|s| s.value)
}

/// Mean over matching series (`NaN` propagates, as upstream's mean does); `None` when no series
/// matches. The mean queries already weight every frontend by its requests and give one series
/// per model; only model labels that differ in case alone are averaged here.
pub fn mean_of(samples: &[Sample], model: &str) -> Option<f64> {
    let values: Vec<f64> = matching(samples, model).collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Sum over matching series; `None` when no series matches.
pub fn sum_of(samples: &[Sample], model: &str) -> Option<f64> {
    let values: Vec<f64> = matching(samples, model).collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// An HTTP error with its causes (DNS, connection refused, timeout), without the query URL.
fn describe(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// Largest Prometheus response read. A query here returns a handful of series per graph (the
/// fast snapshot: four per graph); 16 MiB holds tens of thousands of graphs, and a larger reply
/// is refused rather than buffered.
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;
/// Longest Prometheus error text kept in a message.
const MAX_ERROR_TEXT: usize = 300;

/// At most [`MAX_ERROR_TEXT`] bytes of `text`, cut at a character boundary.
fn shorten(text: &str) -> String {
    if text.len() <= MAX_ERROR_TEXT {
        return text.to_string();
    }
    let mut end = MAX_ERROR_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `url` with any user information replaced by `***` (for messages, status and logs).
pub fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            match authority.rsplit_once('@') {
                Some((_, host)) => format!("{scheme}://***@{host}{path}"),
                None => url.to_string(),
            }
        }
        None => url.to_string(),
    }
}

/// The [`PrometheusClient::identity`] of a client for `base_url` sending `token`.
pub fn identity(base_url: &str, token: Option<&str>) -> String {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let base_url = base_url.trim_end_matches('/');
    match token.map(str::trim).filter(|t| !t.is_empty()) {
        Some(token) => format!(
            "{base_url}#{:016x}",
            BuildHasherDefault::<DefaultHasher>::default().hash_one(token)
        ),
        None => base_url.to_string(),
    }
}

/// Reads the frontend metrics of one interval.
#[derive(Clone, Debug)]
pub struct PrometheusClient {
    http: reqwest::Client,
    base_url: String,
    /// The base URL as shown in messages (credentials redacted).
    shown_url: String,
    /// Sent as `Authorization: Bearer`, when set.
    bearer_token: Option<String>,
}

impl PrometheusClient {
    /// A client for the Prometheus at `base_url`, with a per-request timeout. Redirects are not
    /// followed (a policy's URL must name Prometheus itself) and responses are capped at
    /// [`MAX_RESPONSE_BYTES`].
    pub fn new(base_url: &str, timeout: Duration) -> Result<Self, MetricsError> {
        let shown_url = redact(base_url.trim_end_matches('/'));
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| MetricsError::Http {
                url: shown_url.clone(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            http,
            base_url: base_url.trim_end_matches('/').to_string(),
            shown_url,
            bearer_token: None,
        })
    }

    /// The same client, authenticating with a bearer token.
    pub fn with_bearer_token(mut self, token: Option<String>) -> Self {
        self.bearer_token = token.map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
        self
    }

    /// What tells two clients' answers apart: the base URL and, when set, a hash of the token
    /// (two tenants' tokens may see different data, so nothing cached is shared between them).
    pub fn identity(&self) -> String {
        identity(&self.base_url, self.bearer_token.as_deref())
    }

    /// The base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The base URL as messages show it (credentials redacted).
    pub fn shown_url(&self) -> &str {
        &self.shown_url
    }

    /// GETs `path` with `params`; the body, read up to [`MAX_RESPONSE_BYTES`].
    async fn get(&self, path: &str, params: &[(&str, &str)]) -> Result<String, MetricsError> {
        let http_error = |reason: String| MetricsError::Http {
            url: self.shown_url.clone(),
            reason,
        };
        let mut request = self.http.get(format!("{}{path}", self.base_url)).query(params);
        if let Some(token) = &self.bearer_token {
            request = request.bearer_auth(token);
        }
        let mut response = request.send().await.map_err(|e| http_error(describe(e)))?;
        let status = response.status();
        if status.is_redirection() {
            return Err(http_error(format!(
                "HTTP {status}: redirects are not followed; name Prometheus's own URL"
            )));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_RESPONSE_BYTES as u64)
        {
            return Err(http_error(format!(
                "the response is larger than {MAX_RESPONSE_BYTES} bytes"
            )));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| http_error(describe(e)))? {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(http_error(format!(
                    "the response is larger than {MAX_RESPONSE_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        let body = String::from_utf8_lossy(&body).into_owned();
        if !status.is_success() && !body.contains("\"status\"") {
            return Err(http_error(format!("HTTP {status}")));
        }
        Ok(body)
    }

    /// Runs an instant query.
    pub async fn query(&self, query: &str) -> Result<Vec<Sample>, MetricsError> {
        let body = self.get("/api/v1/query", &[("query", query)]).await?;
        parse_vector(query, &body)
    }

    /// Runs a range query from `end - window` to `end` (unix seconds) at `step` seconds.
    pub async fn query_range(
        &self,
        query: &str,
        end: f64,
        window_s: f64,
        step_s: f64,
    ) -> Result<Vec<Series>, MetricsError> {
        let (start, end, step) = ((end - window_s).to_string(), end.to_string(), step_s.to_string());
        let body = self
            .get(
                "/api/v1/query_range",
                &[
                    ("query", query),
                    ("start", start.as_str()),
                    ("end", end.as_str()),
                    ("step", step.as_str()),
                ],
            )
            .await?;
        parse_matrix(query, &body)
    }

    /// Past intervals' observations (oldest first), to restore the predictors after a restart:
    /// one point per interval over the last `intervals` intervals, ending at `end`.
    pub async fn history(
        &self,
        filter: &SeriesFilter,
        window_s: u64,
        intervals: usize,
        end: f64,
    ) -> Result<Vec<Observation>, MetricsError> {
        let span = window_s as f64 * intervals.saturating_sub(1) as f64;
        let step = window_s as f64;
        let requests = self
            .query_range(&requests_query(filter, window_s), end, span, step)
            .await?;
        let totals: Vec<(f64, f64)> = by_timestamp(&requests, Some(&filter.model))
            .into_iter()
            .map(|(t, values)| (t, values.iter().sum()))
            .collect();
        let mut means: Vec<std::collections::BTreeMap<i64, f64>> = Vec::new();
        for (_, histogram, scale) in MEANS {
            let series = self
                .query_range(&mean_query(histogram, filter, window_s), end, span, step)
                .await?;
            means.push(
                by_timestamp(&series, Some(&filter.model))
                    .into_iter()
                    .map(|(t, values)| {
                        (
                            (t * 1000.0).round() as i64,
                            values.iter().sum::<f64>() / values.len() as f64 * scale,
                        )
                    })
                    .collect(),
            );
        }
        Ok(totals
            .into_iter()
            .map(|(t, num_req)| {
                let at = |i: usize| {
                    means[i]
                        .get(&((t * 1000.0).round() as i64))
                        .copied()
                        .unwrap_or(f64::NAN)
                };
                Observation::upstream(num_req, at(3), at(4), at(0), at(1), at(2))
            })
            .collect())
    }

    /// Samples of the load-based planner's metrics over the last `window_s` seconds, one every
    /// `step_s`: prefill requests waiting for an engine beyond the `prefill_engines` serving
    /// (summed over frontends; from the frontend's stage gauges, else the KV router's queue) and
    /// the decode engines' KV-cache usage (else the KV router's estimate, flagged as a lower
    /// bound).
    pub async fn load_samples(
        &self,
        dynamo_namespace: &str,
        window_s: f64,
        step_s: f64,
        end: f64,
        prefill_engines: u32,
    ) -> Result<planner_core::load::LoadSamples, MetricsError> {
        let flatten = |series: Vec<Series>| -> Vec<f64> {
            by_timestamp(&series, None)
                .into_iter()
                .map(|(_, values)| values.iter().sum())
                .collect()
        };
        let range =
            |query: String| async move { self.query_range(&query, end, window_s, step_s).await.map(flatten) };
        let mut prefill_queue = range(prefill_waiting_query(dynamo_namespace, prefill_engines)).await?;
        if prefill_queue.is_empty() {
            prefill_queue = range(router_queue_query(dynamo_namespace)).await?;
        }
        let prefill_busy = if prefill_engines > 0 {
            range(prefill_busy_query(dynamo_namespace, prefill_engines)).await?
        } else {
            Vec::new()
        };
        let mut decode_kv_usage = range(engine_kv_usage_query(dynamo_namespace)).await?;
        let decode_kv_lower_bound = decode_kv_usage.is_empty();
        if decode_kv_lower_bound {
            decode_kv_usage = range(router_kv_usage_query(dynamo_namespace)).await?;
        }
        Ok(planner_core::load::LoadSamples {
            prefill_queue,
            decode_kv_usage,
            decode_kv_lower_bound,
            prefill_busy,
        })
    }

    /// Whether the graph's frontend serves `model` (any model when `None`) and has never counted
    /// a request: a new graph before its first request, which has no request series yet.
    /// Without any frontend series of the graph, the frontend is not scraped: an error.
    pub async fn awaiting_traffic(
        &self,
        dynamo_namespace: &str,
        model: Option<&str>,
    ) -> Result<bool, MetricsError> {
        let served = self.query(&served_models_query(dynamo_namespace)).await?;
        if served.is_empty() {
            return Err(MetricsError::NoFrontend {
                dynamo_namespace: dynamo_namespace.to_string(),
            });
        }
        let counted = self
            .query(&format!(
                "group by (model) ({{__name__=~\"{FRONTEND_PREFIX}_requests(_started)?_total\",{}}})",
                graph(dynamo_namespace)
            ))
            .await?;
        Ok(match model {
            Some(model) => mean_of(&served, model).is_some() && mean_of(&counted, model).is_none(),
            None => counted.is_empty(),
        })
    }

    /// The interval's observation. A graph whose frontend serves the model but has counted no
    /// request is [`Reading::AwaitingTraffic`]; missing request series otherwise are an error
    /// (never read as zero load). Means of an interval without such observations are `NaN` (a
    /// histogram the frontend has not created yet, such as the ITL before a second token, has
    /// none). The demand signals (requests accepted, in flight, waiting for or in prefill, the
    /// length distributions, the TTFT `quantile`, the decode KV usage's mean and peak over the
    /// window) are `None` when their series are missing: an older frontend does not export
    /// them all.
    pub async fn observe(
        &self,
        filter: &SeriesFilter,
        window_s: u64,
        quantile: f64,
    ) -> Result<Reading, MetricsError> {
        let model = filter.model.as_str();
        let ns = filter.dynamo_namespace.as_str();
        let requests_samples = self.query(&requests_query(filter, window_s)).await?;
        let arrivals = sum_of(&self.query(&started_query(filter, window_s)).await?, model);
        // Requests accepted and none completed yet (the completion counter starts with the
        // first one): no completions.
        let Some(num_req) = sum_of(&requests_samples, model).or(arrivals.map(|_| 0.0)) else {
            return if self.awaiting_traffic(ns, Some(model)).await? {
                Ok(Reading::AwaitingTraffic)
            } else {
                Err(MetricsError::NoSeries {
                    metric: format!("{FRONTEND_PREFIX}_requests_total"),
                    dynamo_namespace: filter.dynamo_namespace.clone(),
                    model: filter.model.clone(),
                })
            };
        };
        let mut means = [0.0; MEANS.len()];
        for (slot, (_, histogram, scale)) in means.iter_mut().zip(MEANS) {
            let samples = self.query(&mean_query(histogram, filter, window_s)).await?;
            *slot = mean_of(&samples, model).unwrap_or(f64::NAN) * scale;
        }
        let [ttft_ms, itl_ms, request_duration_s, isl, osl] = means;
        let mut observation = Observation::upstream(num_req, isl, osl, ttft_ms, itl_ms, request_duration_s);
        observation.arrivals = arrivals;
        observation.inflight = sum_of(&self.query(&in_flight_query(filter)).await?, model);
        // The stage gauges carry no model label: the graph's frontends' requests of any model.
        observation.queued = match self.query(&prefill_pending_query(ns)).await?.first() {
            Some(pending) if pending.value.is_finite() => Some(pending.value),
            _ => sum_of(&self.query(&gauge_query("queued_requests", filter)).await?, model),
        };
        let second = |samples: &[Sample], mean: f64| moments_of(samples, model, mean).map(|m| m.second);
        observation.isl_second_moment = second(
            &self
                .query(&buckets_query("input_sequence_tokens", filter, window_s))
                .await?,
            isl,
        );
        observation.osl_second_moment = second(
            &self
                .query(&buckets_query("output_sequence_tokens", filter, window_s))
                .await?,
            osl,
        );
        observation.ttft_quantile_ms = mean_of(
            &self
                .query(&quantile_query(
                    "time_to_first_token_seconds",
                    quantile,
                    filter,
                    window_s,
                ))
                .await?,
            model,
        )
        .filter(|v| v.is_finite())
        .map(|seconds| (quantile, seconds * 1000.0));
        let kv = self.kv_usage(ns, window_s).await;
        // The planner learns and judges from the engines' usage only; the router's estimate
        // can show a full cache (its peak) but never a cache with room.
        match kv {
            Some(KvReading {
                source: KvUsageSource::Engines,
                mean,
                peak,
            }) => {
                observation.decode_kv_usage = mean;
                observation.decode_kv_usage_peak = peak;
            }
            Some(KvReading {
                source: KvUsageSource::Router,
                peak,
                ..
            }) => observation.decode_kv_usage_peak = peak,
            None => {}
        }
        Ok(Reading::Observed {
            observation: Box::new(observation),
            kv,
        })
    }

    /// The decode KV usage's mean and peak over the window, from the engines, else from the
    /// KV router's estimate; `None` when neither is exported.
    async fn kv_usage(&self, dynamo_namespace: &str, window_s: u64) -> Option<KvReading> {
        let over = |over: &'static str, expression: String| async move {
            self.query(&kv_usage_over_query(over, &expression, window_s))
                .await
                .ok()
                .and_then(|samples| samples.first().map(|s| s.value))
                .filter(|v| v.is_finite())
        };
        for (source, expression) in [
            (KvUsageSource::Engines, engine_kv_usage_query(dynamo_namespace)),
            (KvUsageSource::Router, router_kv_usage_query(dynamo_namespace)),
        ] {
            let mean = over("avg_over_time", expression.clone()).await;
            if mean.is_some() {
                return Some(KvReading {
                    source,
                    mean,
                    peak: over("max_over_time", expression).await,
                });
            }
        }
        None
    }

    /// What the fast path reads, for every graph this Prometheus holds at once (so the query
    /// rate does not grow with the number of policies): over the last `window_s` seconds, the
    /// requests accepted and completed and their mean prompt and output lengths (weighted over
    /// the graph's frontends), and now the requests in flight and those waiting for or in
    /// prefill.
    pub async fn fast_snapshot(&self, window_s: u64) -> Result<FastSnapshot, MetricsError> {
        let by_graph = |metric: String| format!("sum by (dynamo_namespace, model) ({metric})");
        let completions = self
            .query(&by_graph(increase_query(
                &format!("{FRONTEND_PREFIX}_requests_total"),
                window_s,
            )))
            .await?;
        let arrivals = self
            .query(&by_graph(increase_query(
                &format!("{FRONTEND_PREFIX}_requests_started_total"),
                window_s,
            )))
            .await?;
        let inflight = self
            .query(&by_graph(format!(
                "{FRONTEND_PREFIX}_active_requests or {FRONTEND_PREFIX}_inflight_requests"
            )))
            .await?;
        let prefill_pending = self
            .query(&format!(
                "sum by (dynamo_namespace) ({FRONTEND_PREFIX}_stage_requests{{{PREFILL_STAGES}}})"
            ))
            .await?;
        let queued = self
            .query(&by_graph(format!("{FRONTEND_PREFIX}_queued_requests")))
            .await?;
        let mean = |histogram: &str| {
            format!(
                "{} / {}",
                by_graph(increase_query(
                    &format!("{FRONTEND_PREFIX}_{histogram}_sum"),
                    window_s
                )),
                by_graph(increase_query(
                    &format!("{FRONTEND_PREFIX}_{histogram}_count"),
                    window_s
                ))
            )
        };
        let isl = self.query(&mean("input_sequence_tokens")).await?;
        let osl = self.query(&mean("output_sequence_tokens")).await?;
        Ok(FastSnapshot {
            window_s,
            completions,
            arrivals,
            inflight,
            prefill_pending,
            queued,
            isl,
            osl,
        })
    }
}

/// What one interval's reads found.
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    /// The graph's frontend serves the model but has counted no request yet.
    AwaitingTraffic,
    /// The interval's observation.
    Observed {
        /// What the planner reads (boxed: the other variant is empty).
        observation: Box<Observation>,
        /// The decode KV usage read, and where from.
        kv: Option<KvReading>,
    },
}

/// A decode KV-cache usage (0..1) over an interval, and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvReading {
    /// The engines, or the KV router's estimate.
    pub source: KvUsageSource,
    /// Mean over the interval.
    pub mean: Option<f64>,
    /// Peak over the interval.
    pub peak: Option<f64>,
}

/// The fast path's signals of every graph of one Prometheus at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FastSnapshot {
    /// Seconds the counts cover.
    pub window_s: u64,
    completions: Vec<Sample>,
    arrivals: Vec<Sample>,
    inflight: Vec<Sample>,
    /// Requests waiting for or in prefill, by graph (no model label).
    prefill_pending: Vec<Sample>,
    /// The deprecated `queued_requests`, for frontends without the stage gauges.
    queued: Vec<Sample>,
    /// Mean prompt length of the window's first tokens, and mean output length of its
    /// completions, by graph and model.
    isl: Vec<Sample>,
    /// See `isl`.
    osl: Vec<Sample>,
}

impl FastSnapshot {
    /// One graph's signals; `None` when the snapshot has no completions series for it (a graph
    /// without a frontend scraped yet).
    pub fn signals(&self, filter: &SeriesFilter) -> Option<FastSignals> {
        let in_graph = |s: &&Sample| s.dynamo_namespace.as_deref() == Some(filter.dynamo_namespace.as_str());
        let of = |samples: &[Sample]| {
            let graph: Vec<Sample> = samples.iter().filter(in_graph).cloned().collect();
            sum_of(&graph, &filter.model)
        };
        let of_mean = |samples: &[Sample]| {
            let graph: Vec<Sample> = samples.iter().filter(in_graph).cloned().collect();
            mean_of(&graph, &filter.model).filter(|v| v.is_finite())
        };
        let pending = self
            .prefill_pending
            .iter()
            .filter(in_graph)
            .map(|s| s.value)
            .find(|v| v.is_finite());
        Some(FastSignals {
            elapsed_s: 0.0,
            window_s: self.window_s as f64,
            arrivals: of(&self.arrivals),
            completions: of(&self.completions)?,
            inflight: of(&self.inflight),
            queued: pending.or_else(|| of(&self.queued)),
            prefill_engines: 0.0,
            decode_engines: None,
            isl: of_mean(&self.isl).unwrap_or(f64::NAN),
            isl_second_moment: None,
            osl: of_mean(&self.osl).unwrap_or(f64::NAN),
            osl_second_moment: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the first `{...}` selector of `query` selects a series with `labels`: each
    /// matcher (`=` or `=~`, anchored as PromQL anchors them) holds, a missing label being "".
    fn selects(query: &str, labels: &[(&str, &str)]) -> bool {
        let selector = &query[query.find('{').unwrap() + 1..query.find('}').unwrap()];
        let matcher = regex::Regex::new(r#"(\w+)(=~|=)"([^"]*)""#).unwrap();
        matcher.captures_iter(selector).all(|m| {
            let value = labels.iter().find(|(k, _)| *k == &m[1]).map_or("", |(_, v)| v);
            match &m[2] {
                "=" => value == &m[3],
                _ => regex::Regex::new(&format!("^(?:{})$", &m[3]))
                    .unwrap()
                    .is_match(value),
            }
        })
    }

    #[test]
    fn requests_waiting_for_a_first_token_are_read_in_disaggregated_and_aggregated_graphs() {
        // The stage series Dynamo 1.6.1's frontend exports: `phase` empty before routing,
        // `prefill`/`decode` in a disaggregated graph, `aggregated` in one of `type: worker`
        // engines (whose dispatch lasts until the first token).
        let ns = ("dynamo_namespace", "llm-llama-disagg");
        let series = |stage, phase| [ns, ("stage", stage), ("phase", phase)];
        let pending = prefill_pending_query("llm-llama-disagg");
        for (stage, phase) in [
            ("preprocess", ""),
            ("route", "prefill"),
            ("dispatch", "prefill"),
            ("route", "aggregated"),
            ("dispatch", "aggregated"),
        ] {
            assert!(
                selects(&pending, &series(stage, phase)),
                "{stage}/{phase}: {pending}"
            );
        }
        assert!(!selects(&pending, &series("dispatch", "decode")), "{pending}");
        assert!(!selects(
            &pending,
            &[
                ("dynamo_namespace", "other"),
                ("stage", "dispatch"),
                ("phase", "aggregated")
            ]
        ));
        // The waiting query's two sums: before dispatch, and dispatched beyond one per engine.
        let waiting = prefill_waiting_query("llm-llama-disagg", 2);
        let dispatched = &waiting[waiting.find("clamp_min").unwrap()..];
        assert!(selects(&waiting, &series("route", "aggregated")), "{waiting}");
        assert!(!selects(&waiting, &series("dispatch", "aggregated")), "{waiting}");
        assert!(
            selects(dispatched, &series("dispatch", "aggregated")),
            "{dispatched}"
        );
        assert!(
            selects(dispatched, &series("dispatch", "prefill")),
            "{dispatched}"
        );
        assert!(
            !selects(dispatched, &series("dispatch", "decode")),
            "{dispatched}"
        );
    }

    fn filter() -> SeriesFilter {
        SeriesFilter {
            dynamo_namespace: "llm-llama-disagg".into(),
            model: "Llama-3.1-8B".into(),
        }
    }

    #[test]
    fn queries_match_the_namespace_in_promql() {
        let sum = "dynamo_frontend_time_to_first_token_seconds_sum{dynamo_namespace=\"llm-llama-disagg\"}";
        assert_eq!(
            mean_query("time_to_first_token_seconds", &filter(), 180),
            format!(
                "sum by (model) ({}) / sum by (model) ({})",
                increase_query(sum, 180),
                increase_query(&sum.replace("_sum{", "_count{"), 180)
            )
        );
        assert_eq!(
            requests_query(&filter(), 60),
            increase_query(
                "dynamo_frontend_requests_total{dynamo_namespace=\"llm-llama-disagg\"}",
                60
            )
        );
        let tricky = SeriesFilter {
            dynamo_namespace: "a\"b\\c".into(),
            model: "m".into(),
        };
        assert!(requests_query(&tricky, 60).contains("dynamo_namespace=\"a\\\"b\\\\c\""));
        assert_eq!(
            kv_usage_over_query("max_over_time", &router_kv_usage_query("ns"), 60),
            "max_over_time((avg(dynamo_frontend_worker_active_decode_blocks{dynamo_namespace=\"ns\",worker_type=\"decode\"}) / max(dynamo_frontend_model_total_kv_blocks{dynamo_namespace=\"ns\"}))[60s:5s])"
        );
    }

    #[test]
    fn a_series_born_in_the_window_counts_from_zero_unless_only_prometheus_is_new() {
        // `increase` alone misses what a new label set held at its first sample; a series there
        // since the first scrape of a target new to Prometheus, of a frontend older than the
        // window, is the frontend's lifetime.
        let born = "(max_over_time(c{a=\"b\"}[60s]) unless c{a=\"b\"} offset 60s)";
        let found = "((count_over_time(c{a=\"b\"}[60s]) >= on (instance, job) group_left sum_over_time(up{a=\"b\"}[60s])) \
                     and on (instance, job) (max_over_time(up{a=\"b\"}[60s]) unless up{a=\"b\"} offset 60s) \
                     and on (instance, job) (dynamo_component_uptime_seconds{a=\"b\"} > 60))";
        let new = format!("({born} unless {found})");
        assert_eq!(
            increase_query("c{a=\"b\"}", 60),
            format!("(increase(c{{a=\"b\"}}[60s]) unless {new} or {new})")
        );
        // Over every graph: the targets that carry a Dynamo namespace.
        assert!(increase_query("c", 60).contains("up{dynamo_namespace!=\"\"}[60s]"));
    }

    #[test]
    fn worker_series_are_those_of_the_graph_in_every_form_dynamo_writes() {
        let pattern = worker_namespaces("llm-llama.v2");
        assert_eq!(
            pattern,
            "llm-llama\\.v2(-[0-9a-f]{8})?|llm_llama_v2(_[0-9a-f]{8})?"
        );
        // Prometheus anchors the regular expression (RE2; the regex crate reads it alike): the
        // graph's own namespace, its worker generations and their Rust-sanitised forms match,
        // another graph's do not.
        let anchored = regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
        for ns in [
            "llm-llama.v2",
            "llm-llama.v2-0a1b2c3d",
            "llm_llama_v2_0a1b2c3d",
            "llm_llama_v2",
        ] {
            assert!(anchored.is_match(ns), "{ns}");
        }
        for ns in [
            "llm-llama.v2-mistral",
            "llm-llama.v2-0a1b2c3d4",
            "llm-llama",
            "llm-llamaxv2",
            "dynamo",
        ] {
            assert!(!anchored.is_match(ns), "{ns}");
        }
        let engine = engine_kv_usage_query("ns-g");
        assert!(engine.contains("dynamo_component_gpu_cache_usage_percent{dynamo_namespace=~\"ns-g(-[0-9a-f]{8})?|ns_g(_[0-9a-f]{8})?\",dynamo_component!=\"prefill\",dynamo_component_type!=\"prefill\"}"), "{engine}");
        assert!(engine.contains(" or avg(vllm:kv_cache_usage_perc{"), "{engine}");
    }

    #[test]
    fn parses_nan_skips_garbage_and_keeps_partial_labels() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"model":"llama-3.1-8b","instance":"a"},"value":[1.0,"0.25"]},
            {"metric":{"model":"llama-3.1-8b"},"value":[1.0,"NaN"]},
            {"metric":{},"value":[1.0,"3"]},
            {"metric":{"model":"other"},"value":[1.0,"oops"]}
        ]}}"#;
        let samples = parse_vector("q", body).unwrap();
        assert_eq!(samples.len(), 3);
        assert!(samples[1].value.is_nan());
        assert_eq!(samples[2].model, None);
    }

    #[test]
    fn several_frontends_average_unweighted_and_requests_sum() {
        let samples = vec![
            Sample {
                model: Some("LLAMA-3.1-8B".into()),
                le: None,
                dynamo_namespace: None,
                value: 0.1,
            },
            Sample {
                model: Some("llama-3.1-8b".into()),
                le: None,
                dynamo_namespace: None,
                value: 0.3,
            },
            Sample {
                model: Some("other".into()),
                le: None,
                dynamo_namespace: None,
                value: 100.0,
            },
            Sample {
                model: None,
                le: None,
                dynamo_namespace: None,
                value: 100.0,
            },
        ];
        assert!((mean_of(&samples, "Llama-3.1-8B").unwrap() - 0.2).abs() < 1e-12);
        assert!((sum_of(&samples, "llama-3.1-8b").unwrap() - 0.4).abs() < 1e-12);
        assert_eq!(mean_of(&samples, "missing"), None);
        let with_nan = vec![
            Sample {
                model: Some("m".into()),
                le: None,
                dynamo_namespace: None,
                value: f64::NAN,
            },
            Sample {
                model: Some("m".into()),
                le: None,
                dynamo_namespace: None,
                value: 1.0,
            },
        ];
        assert!(mean_of(&with_nan, "m").unwrap().is_nan());
    }

    #[test]
    fn credentials_never_reach_messages() {
        assert_eq!(redact("http://user:secret@prom:9090/x"), "http://***@prom:9090/x");
        assert_eq!(
            redact("https://prom.monitoring:9090"),
            "https://prom.monitoring:9090"
        );
        assert_eq!(redact("http://a@b@prom"), "http://***@prom");
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client =
            PrometheusClient::new("http://admin:hunter2@127.0.0.1:9/", Duration::from_secs(1)).unwrap();
        assert_eq!(client.shown_url(), "http://***@127.0.0.1:9");
        let long = "x".repeat(10_000);
        let body = format!(r#"{{"status":"error","error":"{long}"}}"#);
        let error = parse_vector("q", &body).unwrap_err().to_string();
        assert!(error.len() < 1000, "{}", error.len());
    }

    #[test]
    fn one_fast_snapshot_serves_every_graph() {
        let vector = |rows: &[(&str, &str, f64)]| {
            let result: Vec<String> = rows
                .iter()
                .map(|(ns, model, v)| {
                    format!(
                        r#"{{"metric":{{"dynamo_namespace":"{ns}","model":"{model}"}},"value":[1.0,"{v}"]}}"#
                    )
                })
                .collect();
            parse_vector(
                "q",
                &format!(
                    r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
                    result.join(",")
                ),
            )
            .unwrap()
        };
        let snapshot = FastSnapshot {
            window_s: 20,
            completions: vector(&[
                ("llm-llama-disagg", "llama-3.1-8b", 40.0),
                ("other", "llama-3.1-8b", 7.0),
            ]),
            arrivals: vector(&[("llm-llama-disagg", "llama-3.1-8b", 90.0)]),
            inflight: vector(&[("llm-llama-disagg", "llama-3.1-8b", 55.0)]),
            prefill_pending: vec![],
            queued: vec![],
            isl: vector(&[
                ("llm-llama-disagg", "llama-3.1-8b", 3000.0),
                ("other", "llama-3.1-8b", 90.0),
            ]),
            osl: vec![],
        };
        let signals = snapshot.signals(&filter()).unwrap();
        assert_eq!(signals.completions, 40.0);
        // The window's lengths, where the graph has them.
        assert_eq!(signals.isl, 3000.0);
        assert!(signals.osl.is_nan());
        assert_eq!(signals.arrivals, Some(90.0));
        assert_eq!(signals.inflight, Some(55.0));
        assert_eq!(signals.queued, None);
        assert_eq!(signals.window_s, 20.0);
        let unknown = SeriesFilter {
            dynamo_namespace: "nobody".into(),
            model: "m".into(),
        };
        assert_eq!(snapshot.signals(&unknown), None);
    }

    #[test]
    fn demand_queries_and_histogram_moments() {
        assert_eq!(
            started_query(&filter(), 60),
            increase_query(
                "dynamo_frontend_requests_started_total{dynamo_namespace=\"llm-llama-disagg\"}",
                60
            )
        );
        assert_eq!(
            quantile_query("time_to_first_token_seconds", 0.9, &filter(), 60),
            format!(
                "histogram_quantile(0.9, sum by (model, le) ({}))",
                increase_query(
                    "dynamo_frontend_time_to_first_token_seconds_bucket{dynamo_namespace=\"llm-llama-disagg\"}",
                    60
                )
            )
        );
        // Ten prompts: four up to 1000 tokens, six between 1000 and 4000, mean 1900.
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"model":"llama-3.1-8b","le":"1000"},"value":[1.0,"4"]},
            {"metric":{"model":"llama-3.1-8b","le":"4000"},"value":[1.0,"10"]},
            {"metric":{"model":"llama-3.1-8b","le":"+Inf"},"value":[1.0,"10"]},
            {"metric":{"model":"other","le":"+Inf"},"value":[1.0,"99"]}]}}"#;
        let samples = parse_vector("q", body).unwrap();
        assert_eq!(samples[2].le, Some(f64::INFINITY));
        let moments = moments_of(&samples, "Llama-3.1-8B", 1900.0).unwrap();
        assert!((moments.mean - 1900.0).abs() < 1e-6, "{moments:?}");
        // The spread of two buckets: E[x²] above the squared mean, below the largest bound's square.
        assert!(
            moments.second > 1900.0 * 1900.0 && moments.second < 4000.0 * 4000.0,
            "{moments:?}"
        );
        assert_eq!(moments_of(&samples, "missing", 1900.0), None);
    }

    #[test]
    fn matrix_points_are_grouped_by_time_across_series() {
        let body = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"model":"m"},"values":[[100,"1"],[160,"2"]]},
            {"metric":{"model":"M"},"values":[[160,"3"],[220,"NaN"]]},
            {"metric":{"model":"x"},"values":[[100,"50"]]}
        ]}}"#;
        let series = parse_matrix("q", body).unwrap();
        assert_eq!(series.len(), 3);
        let grouped = by_timestamp(&series, Some("m"));
        assert_eq!(grouped.len(), 3);
        assert_eq!(grouped[1], (160.0, vec![2.0, 3.0]));
        assert!(grouped[2].1[0].is_nan());
        assert_eq!(by_timestamp(&series, None)[0].1, vec![1.0, 50.0]);
    }

    #[test]
    fn errors_say_what_prometheus_said() {
        let error = parse_vector(
            "bad(",
            r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "Prometheus rejected the query `bad(`: parse error"
        );
        // A long query is cut, so the reason after it survives a bounded message.
        let long = MetricsError::Query {
            query: "x".repeat(5000),
            reason: "bad data".into(),
        }
        .to_string();
        assert!(long.len() < 300 && long.ends_with("…`: bad data"), "{long}");
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(
            parse_vector("q", matrix)
                .unwrap_err()
                .to_string()
                .contains("expected a vector")
        );
        assert!(parse_vector("q", "<html>").is_err());
    }

    /// A Prometheus on loopback answering each query with the samples of the first rule whose
    /// needle the query contains (none otherwise): `(labels, value)` pairs, as a vector for an
    /// instant query and as two points per series for a range query. It records the queries.
    struct Fake {
        client: PrometheusClient,
        queries: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    }

    type Rules = Vec<(&'static str, Vec<(serde_json::Value, f64)>)>;

    /// `%XX` and `+` decoded (what reqwest's query encoding produces).
    fn decode(text: &str) -> String {
        let bytes = text.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
                    i += 2;
                }
                other => out.push(other),
            }
            i += 1;
        }
        String::from_utf8(out).unwrap()
    }

    async fn fake(rules: Rules) -> Fake {
        use axum::{extract::State, http::Uri, routing::get};
        type Shared = (
            std::sync::Arc<Rules>,
            std::sync::Arc<std::sync::Mutex<Vec<String>>>,
        );
        async fn answer(State((rules, seen)): State<Shared>, uri: Uri) -> String {
            let query = uri
                .query()
                .unwrap_or_default()
                .split('&')
                .find_map(|pair| pair.strip_prefix("query="))
                .map(decode)
                .unwrap_or_default();
            seen.lock().unwrap().push(query.clone());
            let range = uri.path().ends_with("query_range");
            let samples = rules
                .iter()
                .find(|(needle, _)| query.contains(needle))
                .map(|(_, samples)| samples.clone())
                .unwrap_or_default();
            let result: Vec<serde_json::Value> = samples
                .into_iter()
                .map(|(metric, value)| {
                    if range {
                        serde_json::json!({"metric": metric, "values": [[100.0, value.to_string()], [105.0, value.to_string()]]})
                    } else {
                        serde_json::json!({"metric": metric, "value": [100.0, value.to_string()]})
                    }
                })
                .collect();
            let kind = if range { "matrix" } else { "vector" };
            serde_json::json!({"status": "success", "data": {"resultType": kind, "result": result}})
                .to_string()
        }
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .fallback(get(answer))
            .with_state((std::sync::Arc::new(rules), std::sync::Arc::clone(&seen)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Fake {
            client: PrometheusClient::new(&url, Duration::from_secs(5)).unwrap(),
            queries: seen,
        }
    }

    fn model(value: f64) -> Vec<(serde_json::Value, f64)> {
        vec![(serde_json::json!({"model": "llama-3.1-8b"}), value)]
    }

    fn bare(value: f64) -> Vec<(serde_json::Value, f64)> {
        vec![(serde_json::json!({}), value)]
    }

    /// A busy graph's frontend: 10 requests, every mean, the stage gauges (7 requests waiting
    /// for or in prefill) and the deprecated queued gauge (30: 23 more wait for decode).
    fn busy() -> Rules {
        vec![
            ("increase(dynamo_frontend_requests_total", model(10.0)),
            ("increase(dynamo_frontend_requests_started_total", model(12.0)),
            ("time_to_first_token_seconds_sum", model(0.2)),
            ("inter_token_latency_seconds_sum", model(0.02)),
            ("request_duration_seconds_sum", model(3.0)),
            ("input_sequence_tokens_sum", model(1000.0)),
            ("output_sequence_tokens_sum", model(100.0)),
            ("active_requests", model(40.0)),
            ("stage_requests", bare(7.0)),
            ("queued_requests", model(30.0)),
        ]
    }

    fn with(mut rules: Rules, more: Rules) -> Rules {
        rules.splice(0..0, more);
        rules
    }

    #[tokio::test]
    async fn a_graph_before_its_first_request_awaits_traffic() {
        let served = ("dynamo_frontend_model_.+", model(1.0));
        let idle = fake(vec![served.clone()]).await;
        assert_eq!(
            idle.client.observe(&filter(), 60, 0.9).await.unwrap(),
            Reading::AwaitingTraffic
        );
        assert!(
            idle.client
                .awaiting_traffic("llm-llama-disagg", None)
                .await
                .unwrap()
        );
        // Another model served: this one's series are missing, which is an error.
        let other = fake(vec![(
            "dynamo_frontend_model_.+",
            vec![(serde_json::json!({"model": "mistral"}), 1.0)],
        )])
        .await;
        assert!(matches!(
            other.client.observe(&filter(), 60, 0.9).await,
            Err(MetricsError::NoSeries { .. })
        ));
        // Requests counted before, but none in the window (scrapes too sparse): an error, so
        // the read widens its window.
        let counted = fake(vec![
            (
                "group by (model) ({__name__=~\"dynamo_frontend_requests(_started)?_total\"",
                model(1.0),
            ),
            served,
        ])
        .await;
        assert!(matches!(
            counted.client.observe(&filter(), 60, 0.9).await,
            Err(MetricsError::NoSeries { .. })
        ));
        // Nothing of the graph's frontend: not scraped, or not labelled; the message says how.
        let nothing = fake(vec![]).await;
        let error = nothing.client.observe(&filter(), 60, 0.9).await.unwrap_err();
        assert!(matches!(error, MetricsError::NoFrontend { .. }), "{error}");
        assert!(
            error.to_string().contains("nvidia.com/dynamo-namespace"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn requests_accepted_and_none_completed_are_traffic() {
        // A burst of long requests: the completion counter does not exist before the first ends.
        let rules: Rules = busy()
            .into_iter()
            .filter(|(n, _)| *n != "increase(dynamo_frontend_requests_total")
            .collect();
        let burst = fake(rules).await;
        let Reading::Observed { observation, .. } = burst.client.observe(&filter(), 60, 0.9).await.unwrap()
        else {
            panic!("not observed");
        };
        assert_eq!((observation.num_req, observation.arrivals), (0.0, Some(12.0)));
    }

    #[tokio::test]
    async fn kv_usage_comes_from_the_engines_and_the_router_only_as_a_lower_bound() {
        let router = vec![
            (
                "avg_over_time((avg(dynamo_frontend_worker_active_decode_blocks",
                bare(0.1),
            ),
            (
                "max_over_time((avg(dynamo_frontend_worker_active_decode_blocks",
                bare(0.3),
            ),
        ];
        let engines = vec![
            (
                "avg_over_time(((avg(dynamo_component_gpu_cache_usage_percent",
                bare(0.4),
            ),
            (
                "max_over_time(((avg(dynamo_component_gpu_cache_usage_percent",
                bare(0.6),
            ),
        ];
        let both = fake(with(with(busy(), engines), router.clone())).await;
        let Reading::Observed { observation, kv } = both.client.observe(&filter(), 60, 0.9).await.unwrap()
        else {
            panic!("not observed");
        };
        assert_eq!(
            kv,
            Some(KvReading {
                source: KvUsageSource::Engines,
                mean: Some(0.4),
                peak: Some(0.6)
            })
        );
        assert_eq!(
            (observation.decode_kv_usage, observation.decode_kv_usage_peak),
            (Some(0.4), Some(0.6))
        );
        let queries = both.queries.lock().unwrap().clone();
        assert!(
            queries.iter().any(|q| q.contains(
                "dynamo_namespace=~\"llm-llama-disagg(-[0-9a-f]{8})?|llm_llama_disagg(_[0-9a-f]{8})?\""
            )),
            "{queries:#?}"
        );
        // Without an engine gauge, the router's estimate: said so, its peak can show a full
        // cache, its mean is not handed to the planner.
        let only_router = fake(with(busy(), router)).await;
        let Reading::Observed { observation, kv } =
            only_router.client.observe(&filter(), 60, 0.9).await.unwrap()
        else {
            panic!("not observed");
        };
        assert_eq!(kv.map(|kv| kv.source), Some(KvUsageSource::Router));
        assert_eq!(kv.and_then(|kv| kv.mean), Some(0.1));
        assert_eq!(
            (observation.decode_kv_usage, observation.decode_kv_usage_peak),
            (None, Some(0.3))
        );
        let neither = fake(busy()).await;
        let Reading::Observed { observation, kv } = neither.client.observe(&filter(), 60, 0.9).await.unwrap()
        else {
            panic!("not observed");
        };
        assert_eq!((kv, observation.decode_kv_usage_peak), (None, None));
    }

    #[tokio::test]
    async fn the_prefill_backlog_is_read_from_the_prefill_stages() {
        let fake_frontend = fake(busy()).await;
        let Reading::Observed { observation, .. } =
            fake_frontend.client.observe(&filter(), 60, 0.9).await.unwrap()
        else {
            panic!("not observed");
        };
        // Requests waiting for decode count in `queued_requests` (30), not in the prefill
        // stages (7).
        assert_eq!(observation.queued, Some(7.0));
        assert_eq!(observation.inflight, Some(40.0));
        assert_eq!((observation.num_req, observation.arrivals), (10.0, Some(12.0)));
        // A frontend without the stage gauges: the deprecated gauge.
        let older: Rules = busy()
            .into_iter()
            .filter(|(n, _)| *n != "stage_requests")
            .collect();
        let older = fake(older).await;
        let Reading::Observed { observation, .. } = older.client.observe(&filter(), 60, 0.9).await.unwrap()
        else {
            panic!("not observed");
        };
        assert_eq!(observation.queued, Some(30.0));
        // A histogram the frontend has not created yet (no second token: no ITL) is no
        // observation, not missing metrics.
        let no_itl: Rules = busy()
            .into_iter()
            .filter(|(n, _)| *n != "inter_token_latency_seconds_sum")
            .collect();
        let no_itl = fake(no_itl).await;
        let Reading::Observed { observation, .. } = no_itl.client.observe(&filter(), 60, 0.9).await.unwrap()
        else {
            panic!("not observed");
        };
        assert!(observation.itl_ms.is_nan() && observation.ttft_ms == 200.0);
    }

    #[tokio::test]
    async fn load_mode_reads_the_prefill_wait_of_a_default_frontend() {
        let stages = ("clamp_min(sum(dynamo_frontend_stage_requests", bare(5.0));
        let engines = ("dynamo_component_gpu_cache_usage_percent", bare(0.7));
        let router_queue = ("router_queue_pending_requests", bare(2.0));
        let router_kv = ("worker_active_decode_blocks", bare(0.2));
        let full = fake(vec![stages, engines, router_queue.clone(), router_kv.clone()]).await;
        let samples = full
            .client
            .load_samples("llm-llama-disagg", 60.0, 5.0, 105.0, 2)
            .await
            .unwrap();
        assert_eq!(samples.prefill_queue, vec![5.0, 5.0]);
        assert_eq!(samples.decode_kv_usage, vec![0.7, 0.7]);
        assert!(!samples.decode_kv_lower_bound);
        let queries = full.queries.lock().unwrap().clone();
        assert!(
            queries
                .iter()
                .any(|q| q.contains("stage=\"dispatch\",phase=~\"prefill|aggregated\"}) - 2, 0)")),
            "the prefill engines serving are not waiting: {queries:#?}"
        );
        // A frontend without stage gauges, with the KV router and no engine KV gauge.
        let router = fake(vec![router_queue, router_kv]).await;
        let samples = router
            .client
            .load_samples("llm-llama-disagg", 60.0, 5.0, 105.0, 2)
            .await
            .unwrap();
        assert_eq!(samples.prefill_queue, vec![2.0, 2.0]);
        assert_eq!(samples.decode_kv_usage, vec![0.2, 0.2]);
        assert!(samples.decode_kv_lower_bound);
    }

    #[test]
    fn the_fast_path_reads_the_prefill_stages_too() {
        let sample = |ns: &str, model: Option<&str>, value: f64| Sample {
            model: model.map(Into::into),
            le: None,
            dynamo_namespace: Some(ns.into()),
            value,
        };
        let mut snapshot = FastSnapshot {
            window_s: 20,
            completions: vec![sample("llm-llama-disagg", Some("llama-3.1-8b"), 4.0)],
            arrivals: vec![],
            inflight: vec![],
            prefill_pending: vec![sample("other", None, 99.0), sample("llm-llama-disagg", None, 3.0)],
            queued: vec![sample("llm-llama-disagg", Some("llama-3.1-8b"), 30.0)],
            isl: vec![],
            osl: vec![],
        };
        assert_eq!(snapshot.signals(&filter()).unwrap().queued, Some(3.0));
        snapshot.prefill_pending.clear();
        assert_eq!(snapshot.signals(&filter()).unwrap().queued, Some(30.0));
    }
}

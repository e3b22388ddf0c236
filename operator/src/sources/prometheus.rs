//! The frontend metrics the SLA planner reads from Prometheus: the queries of Dynamo's planner
//! (`prometheus.py`) over the frontend's `dynamo_frontend_*` metrics.
//!
//! Each quantity is one instant query over the adjustment interval. Unlike upstream, which
//! fetches every series and filters in Python, the Dynamo namespace is matched in PromQL (so a
//! thousand policies do not each download every frontend's series); the model is still
//! compared case-insensitively on the client, as upstream does. Means are unweighted means of
//! the per-series ratios, as upstream computes them; the request count is a sum.

use std::time::Duration;

use serde::Deserialize;

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

/// The PromQL mean of a frontend histogram over the window, per series.
pub fn mean_query(histogram: &str, filter: &SeriesFilter, window_s: u64) -> String {
    let selector = format!("{{dynamo_namespace={}}}", quote(&filter.dynamo_namespace));
    format!(
        "increase({FRONTEND_PREFIX}_{histogram}_sum{selector}[{window_s}s])/increase({FRONTEND_PREFIX}_{histogram}_count{selector}[{window_s}s])"
    )
}

/// The PromQL request count over the window, per series.
pub fn requests_query(filter: &SeriesFilter, window_s: u64) -> String {
    format!(
        "increase({FRONTEND_PREFIX}_requests_total{{dynamo_namespace={}}}[{window_s}s])",
        quote(&filter.dynamo_namespace)
    )
}

/// The PromQL count of requests the frontend accepted over the window, per series.
pub fn started_query(filter: &SeriesFilter, window_s: u64) -> String {
    format!(
        "increase({FRONTEND_PREFIX}_requests_started_total{{dynamo_namespace={}}}[{window_s}s])",
        quote(&filter.dynamo_namespace)
    )
}

/// The PromQL value of a frontend gauge now, per series.
pub fn gauge_query(gauge: &str, filter: &SeriesFilter) -> String {
    format!(
        "{FRONTEND_PREFIX}_{gauge}{{dynamo_namespace={}}}",
        quote(&filter.dynamo_namespace)
    )
}

/// The PromQL bucket counts of a frontend histogram over the window, per model and bound.
pub fn buckets_query(histogram: &str, filter: &SeriesFilter, window_s: u64) -> String {
    format!(
        "sum by (model, le) (increase({FRONTEND_PREFIX}_{histogram}_bucket{{dynamo_namespace={}}}[{window_s}s]))",
        quote(&filter.dynamo_namespace)
    )
}

/// The PromQL `quantile` (0..1) of a frontend histogram over the window, per model.
pub fn quantile_query(histogram: &str, quantile: f64, filter: &SeriesFilter, window_s: u64) -> String {
    format!(
        "histogram_quantile({quantile}, sum by (model, le) (increase({FRONTEND_PREFIX}_{histogram}_bucket{{dynamo_namespace={}}}[{window_s}s])))",
        quote(&filter.dynamo_namespace)
    )
}

/// The PromQL KV-cache usage of the decode workers now (active blocks per worker over one
/// engine's blocks), from the router's metrics.
pub fn kv_usage_query(dynamo_namespace: &str) -> String {
    let ns = quote(dynamo_namespace);
    format!(
        "avg({FRONTEND_PREFIX}_worker_active_decode_blocks{{dynamo_namespace={ns},worker_type=\"decode\"}}) / max({FRONTEND_PREFIX}_model_total_kv_blocks{{dynamo_namespace={ns}}})"
    )
}

/// Seconds between the points of the KV-usage subqueries: fine enough to see a cache that
/// filled for a few scrapes, whatever the scrape interval.
const KV_SUBQUERY_STEP_S: u64 = 5;

/// [`kv_usage_query`] over the last `window_s` seconds through `over` (`avg_over_time`: the
/// interval's mean; `max_over_time`: its peak).
pub fn kv_usage_over_query(over: &str, dynamo_namespace: &str, window_s: u64) -> String {
    format!(
        "{over}(({})[{window_s}s:{KV_SUBQUERY_STEP_S}s])",
        kv_usage_query(dynamo_namespace)
    )
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
    #[error("Prometheus rejected the query `{query}`: {reason}")]
    Query {
        /// The query.
        query: String,
        /// Prometheus's explanation.
        reason: String,
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
            Self::NoSeries { .. } => "no_series",
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

/// Unweighted mean over matching series (`NaN` propagates, as upstream's mean does); `None`
/// when no series matches.
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
    /// `step_s`: queued prefill requests (summed over frontends) and decode KV-cache usage
    /// (active decode blocks per worker over the KV blocks of one engine).
    pub async fn load_samples(
        &self,
        dynamo_namespace: &str,
        window_s: f64,
        step_s: f64,
        end: f64,
    ) -> Result<planner_core::load::LoadSamples, MetricsError> {
        let ns = quote(dynamo_namespace);
        let queue = format!(
            "sum({FRONTEND_PREFIX}_router_queue_pending_requests{{dynamo_namespace={ns},worker_type=\"prefill\"}})"
        );
        let kv = kv_usage_query(dynamo_namespace);
        let flatten = |series: Vec<Series>| -> Vec<f64> {
            by_timestamp(&series, None)
                .into_iter()
                .map(|(_, values)| values.iter().sum())
                .collect()
        };
        Ok(planner_core::load::LoadSamples {
            prefill_queue: flatten(self.query_range(&queue, end, window_s, step_s).await?),
            decode_kv_usage: flatten(self.query_range(&kv, end, window_s, step_s).await?),
        })
    }

    /// The interval's observation. Missing series of upstream's metrics are an error (never
    /// read as zero load); means of an interval without completed requests are `NaN`. The demand
    /// signals (requests accepted, the in-flight and queued gauges, the length distributions,
    /// the TTFT `quantile`, the decode KV usage's mean and peak over the window) are `None` when
    /// their series are missing: an older frontend does not export them all.
    pub async fn observe(
        &self,
        filter: &SeriesFilter,
        window_s: u64,
        quantile: f64,
    ) -> Result<Observation, MetricsError> {
        let no_series = |metric: &str| MetricsError::NoSeries {
            metric: format!("{FRONTEND_PREFIX}_{metric}"),
            dynamo_namespace: filter.dynamo_namespace.clone(),
            model: filter.model.clone(),
        };
        let requests_samples = self.query(&requests_query(filter, window_s)).await?;
        let num_req = sum_of(&requests_samples, &filter.model).ok_or_else(|| no_series("requests_total"))?;
        let mut means = [0.0; MEANS.len()];
        for (slot, (_, histogram, scale)) in means.iter_mut().zip(MEANS) {
            let samples = self.query(&mean_query(histogram, filter, window_s)).await?;
            *slot = mean_of(&samples, &filter.model).ok_or_else(|| no_series(histogram))? * scale;
        }
        let [ttft_ms, itl_ms, request_duration_s, isl, osl] = means;
        let mut observation = Observation::upstream(num_req, isl, osl, ttft_ms, itl_ms, request_duration_s);
        let model = filter.model.as_str();
        observation.arrivals = sum_of(&self.query(&started_query(filter, window_s)).await?, model);
        observation.inflight = sum_of(
            &self.query(&gauge_query("inflight_requests", filter)).await?,
            model,
        );
        observation.queued = sum_of(&self.query(&gauge_query("queued_requests", filter)).await?, model);
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
        // The router's KV metrics carry no model label: the graph's only.
        let kv_usage = |over: &'static str| async move {
            self.query(&kv_usage_over_query(over, &filter.dynamo_namespace, window_s))
                .await
                .ok()
                .and_then(|samples| samples.first().map(|s| s.value))
                .filter(|v| v.is_finite())
        };
        observation.decode_kv_usage = kv_usage("avg_over_time").await;
        observation.decode_kv_usage_peak = kv_usage("max_over_time").await;
        Ok(observation)
    }

    /// What the fast path reads, for every graph this Prometheus holds at once (so the query
    /// rate does not grow with the number of policies): over the last `window_s` seconds, the
    /// requests accepted and completed, and the in-flight and queued gauges now.
    pub async fn fast_snapshot(&self, window_s: u64) -> Result<FastSnapshot, MetricsError> {
        let by_graph = |metric: String| format!("sum by (dynamo_namespace, model) ({metric})");
        let completions = self
            .query(&by_graph(format!(
                "increase({FRONTEND_PREFIX}_requests_total[{window_s}s])"
            )))
            .await?;
        let arrivals = self
            .query(&by_graph(format!(
                "increase({FRONTEND_PREFIX}_requests_started_total[{window_s}s])"
            )))
            .await?;
        let inflight = self
            .query(&by_graph(format!("{FRONTEND_PREFIX}_inflight_requests")))
            .await?;
        let queued = self
            .query(&by_graph(format!("{FRONTEND_PREFIX}_queued_requests")))
            .await?;
        Ok(FastSnapshot {
            window_s,
            completions,
            arrivals,
            inflight,
            queued,
        })
    }
}

/// The fast path's signals of every graph of one Prometheus at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FastSnapshot {
    /// Seconds the counts cover.
    pub window_s: u64,
    completions: Vec<Sample>,
    arrivals: Vec<Sample>,
    inflight: Vec<Sample>,
    queued: Vec<Sample>,
}

impl FastSnapshot {
    /// One graph's signals; `None` when the snapshot has no completions series for it (a graph
    /// without a frontend scraped yet).
    pub fn signals(&self, filter: &SeriesFilter) -> Option<FastSignals> {
        let of = |samples: &[Sample]| {
            let graph: Vec<Sample> = samples
                .iter()
                .filter(|s| s.dynamo_namespace.as_deref() == Some(filter.dynamo_namespace.as_str()))
                .cloned()
                .collect();
            sum_of(&graph, &filter.model)
        };
        Some(FastSignals {
            elapsed_s: 0.0,
            window_s: self.window_s as f64,
            arrivals: of(&self.arrivals),
            completions: of(&self.completions)?,
            inflight: of(&self.inflight),
            queued: of(&self.queued),
            prefill_engines: 0.0,
            isl: f64::NAN,
            isl_second_moment: None,
            osl: f64::NAN,
            osl_second_moment: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter() -> SeriesFilter {
        SeriesFilter {
            dynamo_namespace: "llm-llama-disagg".into(),
            model: "Llama-3.1-8B".into(),
        }
    }

    #[test]
    fn queries_match_the_namespace_in_promql() {
        assert_eq!(
            mean_query("time_to_first_token_seconds", &filter(), 180),
            "increase(dynamo_frontend_time_to_first_token_seconds_sum{dynamo_namespace=\"llm-llama-disagg\"}[180s])/increase(dynamo_frontend_time_to_first_token_seconds_count{dynamo_namespace=\"llm-llama-disagg\"}[180s])"
        );
        assert_eq!(
            requests_query(&filter(), 60),
            "increase(dynamo_frontend_requests_total{dynamo_namespace=\"llm-llama-disagg\"}[60s])"
        );
        let tricky = SeriesFilter {
            dynamo_namespace: "a\"b\\c".into(),
            model: "m".into(),
        };
        assert!(requests_query(&tricky, 60).contains("dynamo_namespace=\"a\\\"b\\\\c\""));
        assert_eq!(
            kv_usage_over_query("max_over_time", "ns", 60),
            "max_over_time((avg(dynamo_frontend_worker_active_decode_blocks{dynamo_namespace=\"ns\",worker_type=\"decode\"}) / max(dynamo_frontend_model_total_kv_blocks{dynamo_namespace=\"ns\"}))[60s:5s])"
        );
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
            queued: vec![],
        };
        let signals = snapshot.signals(&filter()).unwrap();
        assert_eq!(signals.completions, 40.0);
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
            "increase(dynamo_frontend_requests_started_total{dynamo_namespace=\"llm-llama-disagg\"}[60s])"
        );
        assert_eq!(
            quantile_query("time_to_first_token_seconds", 0.9, &filter(), 60),
            "histogram_quantile(0.9, sum by (model, le) (increase(dynamo_frontend_time_to_first_token_seconds_bucket{dynamo_namespace=\"llm-llama-disagg\"}[60s])))"
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
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(
            parse_vector("q", matrix)
                .unwrap_err()
                .to_string()
                .contains("expected a vector")
        );
        assert!(parse_vector("q", "<html>").is_err());
    }
}

//! The observe step: read what the policy's planner needs from Prometheus. A failure becomes an
//! observation of missing metrics (which never scales anything), never an error of the
//! reconcile.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use planner_core::{
    policy::Observed,
    state::{FastSignals, IntervalMetrics},
};

use super::PrometheusClientError;
use crate::{
    metrics::policy::PolicyCounters,
    sources::prometheus::{FastSnapshot, KvReading, MetricsError, PrometheusClient, Reading, SeriesFilter},
};

/// Where and what to read.
pub struct MetricsQuery<'a> {
    /// The client for the policy's Prometheus, or why there is none.
    pub client: Result<&'a PrometheusClient, &'a PrometheusClientError>,
    /// The Dynamo namespace of the graph.
    pub dynamo_namespace: &'a str,
    /// The model (SLA planner).
    pub model: &'a str,
    /// The interval (the query window).
    pub interval: Duration,
    /// Sampling step of the load-based planner.
    pub pulling_interval: Duration,
    /// The end of the window, Unix seconds.
    pub now_unix_s: f64,
    /// The TTFT quantile (0..1) read from the histogram.
    pub ttft_quantile: f64,
    /// Prefill engines ready now (the target's available replicas): the load planner's queue
    /// per engine is counted beyond them.
    pub prefill_engines: u32,
}

/// Reads one interval's metrics for the policy's planner (load samples when `samples`, else the
/// frontend's metrics, with the decode KV usage read); failures are counted in `metrics`.
pub async fn observe(
    samples: bool,
    query: &MetricsQuery<'_>,
    metrics: PolicyCounters<'_>,
) -> (Observed, Option<KvReading>) {
    let window_s = query.interval.as_secs().max(1);
    let unavailable = |reason: String| {
        if samples {
            Observed::Samples(Err(reason))
        } else {
            Observed::Frontend(IntervalMetrics::Unavailable { reason })
        }
    };
    let client = match query.client {
        Ok(client) => client,
        Err(error) => {
            metrics.metrics_unavailable("client");
            return (unavailable(error.to_string()), None);
        }
    };
    let awaiting = |model: Option<&str>| {
        format!(
            "waiting for the first request: the frontend of {} serves {} and has counted none yet; planning starts with it",
            query.dynamo_namespace,
            model.unwrap_or("its model")
        )
    };
    if !samples {
        let filter = SeriesFilter {
            dynamo_namespace: query.dynamo_namespace.to_string(),
            model: query.model.to_string(),
        };
        return match observe_interval(client, &filter, window_s, query.ttft_quantile).await {
            Ok(Reading::Observed { observation, kv }) => {
                (Observed::Frontend(IntervalMetrics::Observed(*observation)), kv)
            }
            Ok(Reading::AwaitingTraffic) => (Observed::AwaitingTraffic(awaiting(Some(query.model))), None),
            Err(error) => {
                metrics.metrics_unavailable(error.kind());
                (unavailable(error.to_string()), None)
            }
        };
    }
    let read = client
        .load_samples(
            query.dynamo_namespace,
            window_s as f64,
            query.pulling_interval.as_secs_f64().max(1.0),
            query.now_unix_s,
            query.prefill_engines,
        )
        .await;
    let observed = match read {
        // Without any sample, a graph before its first request says so.
        Ok(samples) if samples.prefill_queue.is_empty() && samples.decode_kv_usage.is_empty() => {
            match client.awaiting_traffic(query.dynamo_namespace, None).await {
                Ok(true) => Observed::AwaitingTraffic(awaiting(None)),
                Ok(false) => Observed::Samples(Ok(samples)),
                Err(error) => {
                    metrics.metrics_unavailable(error.kind());
                    Observed::Samples(Err(error.to_string()))
                }
            }
        }
        Ok(samples) => Observed::Samples(Ok(samples)),
        Err(error) => {
            metrics.metrics_unavailable(error.kind());
            Observed::Samples(Err(error.to_string()))
        }
    };
    (observed, None)
}

/// The interval's observation over `window_s`; when the window holds too few scrapes for a
/// series (`increase` needs two samples in it, and a scrape interval of half the window leaves
/// exactly two, so one late scrape drops the series), the same observation over twice the
/// window, its counts scaled back to one window: a rate over a longer window rather than an
/// interval lost.
pub async fn observe_interval(
    client: &PrometheusClient,
    filter: &SeriesFilter,
    window_s: u64,
    quantile: f64,
) -> Result<Reading, MetricsError> {
    match client.observe(filter, window_s, quantile).await {
        Err(MetricsError::NoSeries { .. }) => {
            let wider = window_s.saturating_mul(2);
            let mut reading = client.observe(filter, wider, quantile).await?;
            tracing::debug!(
                dynamo_namespace = filter.dynamo_namespace,
                window_s,
                wider,
                "no series over the interval; read over twice the interval"
            );
            if let Reading::Observed { observation, .. } = &mut reading {
                let scale = window_s as f64 / wider as f64;
                observation.num_req *= scale;
                observation.arrivals = observation.arrivals.map(|arrivals| arrivals * scale);
            }
            Ok(reading)
        }
        other => other,
    }
}

/// Fast-path snapshots by Prometheus URL and window, shared by every policy: one set of
/// queries per Prometheus per check period, however many policies read it.
#[derive(Default)]
pub struct FastCache {
    #[allow(clippy::type_complexity)]
    entries: std::sync::Mutex<
        HashMap<(String, u64), Arc<tokio::sync::Mutex<Option<(Instant, Arc<FastSnapshot>)>>>>,
    >,
}

/// Snapshots unused this long are dropped.
const FAST_CACHE_IDLE: Duration = Duration::from_secs(600);

impl FastCache {
    /// A snapshot of `client`'s Prometheus over `window_s`, at most `max_age` old; concurrent
    /// callers wait for one query set.
    pub async fn snapshot(
        &self,
        client: &PrometheusClient,
        window_s: u64,
        max_age: Duration,
    ) -> Result<Arc<FastSnapshot>, MetricsError> {
        let slot = {
            let Ok(mut entries) = self.entries.lock() else {
                return client.fast_snapshot(window_s).await.map(Arc::new);
            };
            entries.retain(|_, slot| {
                slot.try_lock().map_or(true, |s| {
                    s.as_ref().is_none_or(|(at, _)| at.elapsed() < FAST_CACHE_IDLE)
                })
            });
            Arc::clone(entries.entry((client.identity(), window_s)).or_default())
        };
        let mut cached = slot.lock().await;
        if let Some((at, snapshot)) = cached.as_ref()
            && at.elapsed() < max_age
        {
            return Ok(Arc::clone(snapshot));
        }
        let snapshot = Arc::new(client.fast_snapshot(window_s).await?);
        *cached = Some((Instant::now(), Arc::clone(&snapshot)));
        Ok(snapshot)
    }
}

/// Reads the fast path's signals over the last `window` (from a snapshot at most half a
/// `period` old); `None` (counted in `metrics`) when Prometheus cannot tell: the fast path then
/// waits for the next check.
pub async fn fast_signals(
    query: &MetricsQuery<'_>,
    cache: &FastCache,
    window: Duration,
    period: Duration,
    metrics: PolicyCounters<'_>,
) -> Option<FastSignals> {
    let Ok(client) = query.client else {
        metrics.metrics_unavailable("client");
        return None;
    };
    let filter = SeriesFilter {
        dynamo_namespace: query.dynamo_namespace.to_string(),
        model: query.model.to_string(),
    };
    // A window needs two scrapes of a series: when the graph has none in it (a scrape interval
    // of half the window or more; the Prometheus Operator's default is 30 s), twice the window,
    // up to four times it or the adjustment interval. Snapshots are shared, so a wider one
    // costs one more set of queries per Prometheus, not per policy.
    let mut window_s = window.as_secs().max(1);
    let longest_s = query.interval.as_secs().max(window_s.saturating_mul(4));
    loop {
        let snapshot = match cache.snapshot(client, window_s, period / 2).await {
            Ok(snapshot) => snapshot,
            Err(error) => {
                metrics.metrics_unavailable(error.kind());
                return None;
            }
        };
        // The planning loop adds the engines serving and the time since the interval.
        if let Some(signals) = snapshot.signals(&filter) {
            return Some(signals);
        }
        if window_s >= longest_s {
            metrics.metrics_unavailable("no_series");
            return None;
        }
        window_s = window_s.saturating_mul(2).min(longest_s);
    }
}

//! The planner's reads against a real Prometheus that scrapes every 15 s (the Prometheus
//! Operator's default is 30 s), with the synthetic frontend as the target: a 20 s window then
//! holds one sample of a counter most of the time, and `increase` over it has no series. The
//! fast check and the interval's observation must still get their signals (from a wider
//! window), and no read may count as unavailable. Needs no cluster.

use std::time::Duration;

use e2e::{Result, poll_until};
use planner_operator::{
    controller::planner_policy::observe::{self, FastCache, MetricsQuery},
    metrics::operator::OperatorMetrics,
    sources::prometheus::{KvUsageSource, PrometheusClient, Reading, SeriesFilter},
};

use crate::{
    closed_loop::start_synthetic_frontend,
    prometheus::{Job, Prometheus},
};

const SCRAPE_S: u32 = 15;
const GRAPH: &str = "scrape-interval-llama";
/// The model the synthetic frontend serves.
const MODEL: &str = "llama-3.1-8b";

#[tokio::test]
async fn reads_hold_their_series_when_scrapes_are_sparser_than_the_window() -> Result<()> {
    let frontend = start_synthetic_frontend(&["--prefill", "2", "--decode", "2"])?;
    // The frontend, and its decode engines' KV usage (on its /engine/metrics), as PodMonitors
    // label them.
    let graph = ("dynamo_namespace".to_string(), GRAPH.to_string());
    let prometheus = Prometheus::start_jobs(
        &[
            Job {
                name: "dynamo-frontend".into(),
                targets: vec![frontend.control.clone()],
                path: "/metrics",
                labels: vec![graph.clone()],
            },
            Job {
                name: "dynamo-worker".into(),
                targets: vec![frontend.control.clone()],
                path: "/engine/metrics",
                labels: vec![graph, ("dynamo_component_type".into(), "decode".into())],
            },
        ],
        SCRAPE_S,
    )
    .await?;
    let client = PrometheusClient::new(&prometheus.url, Duration::from_secs(10))?;
    let filter = SeriesFilter {
        dynamo_namespace: GRAPH.into(),
        model: MODEL.into(),
    };

    // Three scrapes of the frontend's counters, so that a 40 s window holds at least two.
    let samples =
        format!("count_over_time(dynamo_frontend_requests_total{{dynamo_namespace=\"{GRAPH}\"}}[2m])");
    poll_until("three scrapes of the frontend", Duration::from_secs(120), || {
        let (client, samples) = (&client, &samples);
        async move {
            Ok(client
                .query(samples)
                .await
                .ok()
                .and_then(|s| s.iter().map(|s| s.value).reduce(f64::min))
                .is_some_and(|count| count >= 3.0))
        }
    })
    .await?;

    let metrics = OperatorMetrics::new();
    let query = MetricsQuery {
        client: Ok(&client),
        dynamo_namespace: GRAPH,
        model: MODEL,
        interval: Duration::from_secs(20),
        pulling_interval: Duration::from_secs(5),
        now_unix_s: 0.0,
        ttft_quantile: 0.9,
        prefill_engines: 2,
    };
    // Five reads 3 s apart span 12 s of the 15 s scrape cycle: a 20 s window holds two samples
    // for only 5 s of each cycle, so most of these reads find one.
    let (mut narrow_misses, mut widened) = (0, 0);
    for read in 0..5 {
        if read > 0 {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        if client.fast_snapshot(20).await?.signals(&filter).is_none() {
            narrow_misses += 1;
        }
        // A cache of its own each time: every read queries Prometheus.
        let signals = observe::fast_signals(
            &query,
            &FastCache::default(),
            Duration::from_secs(20),
            Duration::from_secs(10),
            metrics.policies.of("e2e", "scrape-interval"),
        )
        .await
        .ok_or(format!("read {read}: the fast check got no signals"))?;
        assert!(signals.window_s >= 20.0, "{}", signals.window_s);
        if signals.window_s > 20.0 {
            widened += 1;
        }
        assert!(signals.completions > 0.0, "read {read}: {signals:?}");

        let reading = observe::observe_interval(&client, &filter, 20, 0.9)
            .await
            .map_err(|e| format!("read {read}: the interval's observation failed: {e}"))?;
        let Reading::Observed { observation, kv } = reading else {
            return Err(format!("read {read}: {reading:?}").into());
        };
        assert!(
            observation.num_req > 0.0 && observation.isl > 0.0,
            "read {read}: {observation:?}"
        );
        // The decode engines' KV usage over the window: its mean never above its peak.
        assert_eq!(
            kv.map(|kv| kv.source),
            Some(KvUsageSource::Engines),
            "read {read}"
        );
        let (mean, peak) = (observation.decode_kv_usage, observation.decode_kv_usage_peak);
        assert!(
            matches!((mean, peak), (Some(mean), Some(peak)) if mean >= 0.0 && mean <= peak + 1e-9),
            "read {read}: KV usage {mean:?}, peak {peak:?}"
        );
    }
    println!("20 s windows without the series: {narrow_misses} of 5; fast reads widened: {widened}");
    // The case this test is about happened, and was covered.
    assert!(
        narrow_misses >= 1,
        "every 20 s window held two scrapes: the test did not exercise the gap"
    );
    assert!(widened >= 1);
    let text = metrics.encode()?;
    assert!(
        !text.contains("planner_operator_metrics_unavailable_total{"),
        "a read counted as unavailable:\n{text}"
    );
    Ok(())
}

//! The operator's reads on what NVIDIA Dynamo really exports: Dynamo 1.6.1's own frontend and
//! mocker engines (`make dynamo`), in the frontend's default router mode, scraped by a real
//! Prometheus with the relabelling of NVIDIA's PodMonitors and this chart's (`dynamo_namespace`
//! from the pod label; the engines' component type). Needs no cluster.
//!
//! Each assertion below failed on the operator's earlier reads: an idle graph was "metrics
//! unavailable", the first requests of a new series were not counted, the decode KV usage and
//! load mode's prefill queue were read from KV-router gauges a default frontend does not have,
//! and the prefill backlog counted the requests waiting for decode, or (aggregated engines)
//! none of the requests waiting for their first token.

use std::time::Duration;

use e2e::{
    Result,
    dynamo::{self, Bed, Engine, MODEL, Mode, Request},
    poll_until,
};
use planner_core::{
    load::{LoadConfig, LoadPlanner, LoadReason},
    sla::Observation,
};
use planner_operator::sources::prometheus::{
    KvUsageSource, PrometheusClient, Reading, SeriesFilter, served_models_query,
};

use crate::prometheus::{Job, Prometheus, unix_now};

/// What a PodMonitor adds to each target's series: the graph's namespace, and the engines'
/// component type.
fn jobs(bed: &Bed) -> Vec<Job> {
    let ns = ("dynamo_namespace".to_string(), bed.dynamo_namespace.clone());
    let mut jobs = vec![Job {
        name: "dynamo-frontend".into(),
        targets: vec![bed.frontend_addr.clone()],
        path: "/metrics",
        labels: vec![ns.clone()],
    }];
    for (i, (mode, target)) in bed.engine_targets().into_iter().enumerate() {
        jobs.push(Job {
            name: format!("dynamo-worker-{i}"),
            targets: vec![target],
            path: "/metrics",
            labels: vec![
                ns.clone(),
                ("dynamo_component_type".into(), mode.component_type().into()),
            ],
        });
    }
    jobs
}

fn filter(bed: &Bed) -> SeriesFilter {
    SeriesFilter {
        dynamo_namespace: bed.dynamo_namespace.clone(),
        model: MODEL.into(),
    }
}

/// `n` requests of `isl` prompt and `osl` output tokens, `every_s` apart.
fn load(n: usize, isl: u32, osl: u32, every_s: f64) -> Vec<Request> {
    (0..n)
        .map(|i| Request {
            at_s: i as f64 * every_s,
            isl,
            osl,
        })
        .collect()
}

/// The interval's observation, and where its decode KV usage came from.
async fn observed(
    client: &PrometheusClient,
    bed: &Bed,
    window_s: u64,
) -> Result<(Observation, Option<KvUsageSource>)> {
    match client.observe(&filter(bed), window_s, 0.9).await? {
        Reading::Observed { observation, kv } => Ok((*observation, kv.map(|kv| kv.source))),
        other => Err(format!("expected an observation, got {other:?}").into()),
    }
}

/// The value of an instant query's first sample, `None` when it returns none.
async fn value(client: &PrometheusClient, query: &str) -> Result<Option<f64>> {
    Ok(client.query(query).await?.first().map(|s| s.value))
}

/// The interval's observation over `window_s` once its decode KV usage comes from the engines
/// and `ready` holds of it. An engine's KV series begins with its first request: a read judged
/// before Prometheus has scraped it finds no KV usage.
async fn observed_from_engines(
    client: &PrometheusClient,
    bed: &Bed,
    window_s: u64,
    ready: impl Fn(&Observation) -> bool,
) -> Result<Observation> {
    let last = std::cell::Cell::new(None);
    poll_until(
        "an observation with the engines' KV usage",
        Duration::from_secs(30),
        || {
            let (last, ready) = (&last, &ready);
            async move {
                let (observation, kv_source) = observed(client, bed, window_s).await?;
                eprintln!(
                    "prefill pending {:?}, KV usage from {kv_source:?}",
                    observation.queued
                );
                let done = kv_source == Some(KvUsageSource::Engines) && ready(&observation);
                last.set(Some(observation));
                Ok(done)
            }
        },
    )
    .await?;
    last.into_inner().ok_or_else(|| "no observation".into())
}

/// Waits until Prometheus holds the frontend's model gauges (a scrape of the frontend).
async fn scraped(client: &PrometheusClient, bed: &Bed) -> Result<()> {
    poll_until(
        "the frontend's model gauges in Prometheus",
        Duration::from_secs(60),
        || {
            let query = served_models_query(&bed.dynamo_namespace);
            async move { Ok(!client.query(&query).await?.is_empty()) }
        },
    )
    .await
}

#[tokio::test]
async fn a_default_frontend_and_its_engines_give_every_signal_the_planners_read() -> Result<()> {
    // A prefill engine twenty times slower than its timing model, so requests queue for it.
    let bed = Bed::start(
        "e2e-real-default",
        &[],
        &[
            Engine {
                speedup: 0.05,
                ..Engine::new(Mode::Prefill)
            },
            Engine::new(Mode::Decode),
        ],
    )
    .await?;
    let prometheus = Prometheus::start_jobs(&jobs(&bed), 1).await?;
    let client = PrometheusClient::new(&prometheus.url, Duration::from_secs(10))?;

    // A new graph: the frontend serves the model, and has no request series yet.
    scraped(&client, &bed).await?;
    assert_eq!(
        client.observe(&filter(&bed), 30, 0.9).await?,
        Reading::AwaitingTraffic
    );
    let ns = &bed.dynamo_namespace;
    let old_requests =
        format!("sum(increase(dynamo_frontend_requests_total{{dynamo_namespace=\"{ns}\"}}[30s]))");
    assert_eq!(
        value(&client, &old_requests).await?,
        None,
        "the earlier read: no series"
    );
    assert!(client.awaiting_traffic(&bed.dynamo_namespace, None).await?);

    // Its first three requests: counted, though their series start with them. Prometheus is
    // frozen while they run, so that its first sample of the new series holds all three, as it
    // does whenever a graph's first requests start and finish between two scrapes (a scrape in
    // between, which a loaded machine makes likely, lets `increase` see part of them).
    prometheus.pause()?;
    let sent = dynamo::replay(&bed.frontend_addr, &load(3, 40, 8, 0.0)).await;
    prometheus.resume()?;
    assert_eq!(sent, 0, "requests failed");
    // Judged over a few scrapes of the finished counter, as an interval's read is.
    prometheus.scraped_since(jobs(&bed).len(), unix_now(), 4).await?;
    let (first, _) = observed(&client, &bed, 30).await?;
    assert_eq!(first.num_req, 3.0, "{first:?}");
    let missed = value(&client, &old_requests).await?.unwrap_or(0.0);
    assert!(
        missed < 3.0,
        "the earlier read counted {missed} of the first 3 requests"
    );
    assert_eq!(first.arrivals, Some(3.0), "{first:?}");
    assert_eq!((first.isl, first.osl), (40.0, 8.0), "{first:?}");
    assert!(first.ttft_ms > 0.0 && first.itl_ms > 0.0, "{first:?}");

    // Prefill overload: requests wait for the one slow prefill engine.
    let addr = bed.frontend_addr.clone();
    let overload = tokio::spawn(async move { dynamo::replay(&addr, &load(30, 1500, 16, 0.25)).await });
    tokio::time::sleep(Duration::from_secs(8)).await;
    let samples = client
        .load_samples(&bed.dynamo_namespace, 6.0, 1.0, unix_now(), 1)
        .await?;
    let waiting = samples.prefill_queue.iter().copied().fold(0.0, f64::max);
    assert!(waiting >= 2.0, "{samples:?}");
    assert!(
        !samples.decode_kv_lower_bound && !samples.decode_kv_usage.is_empty(),
        "{samples:?}"
    );
    // The earlier reads: the KV router's queue and active blocks, which a default frontend
    // (round-robin) does not export.
    for old in [
        format!(
            "sum(dynamo_frontend_router_queue_pending_requests{{dynamo_namespace=\"{ns}\",worker_type=\"prefill\"}})"
        ),
        format!(
            "avg(dynamo_frontend_worker_active_decode_blocks{{dynamo_namespace=\"{ns}\",worker_type=\"decode\"}})"
        ),
    ] {
        assert_eq!(value(&client, &old).await?, None, "{old}");
    }
    let decision = LoadPlanner::default().tick(&LoadConfig::default(), 1, 1, &samples);
    assert!(
        matches!(decision.prefill_reason, LoadReason::ScaleUp { .. }) && decision.prefill == 2,
        "{decision:?}"
    );
    let (busy, kv_source) = observed(&client, &bed, 10).await?;
    assert!(busy.queued.is_some_and(|q| q >= 3.0), "{busy:?}");
    // The decode KV usage comes from the decode engine (this frontend has no KV router).
    assert_eq!(kv_source, Some(KvUsageSource::Engines), "{busy:?}");
    assert!(busy.decode_kv_usage.is_some(), "{busy:?}");
    let snapshot = client.fast_snapshot(10).await?;
    let signals = snapshot.signals(&filter(&bed)).ok_or("no fast signals")?;
    assert!(signals.queued.is_some_and(|q| q >= 3.0), "{signals:?}");
    assert_eq!(overload.await?, 0, "requests failed");
    Ok(())
}

#[tokio::test]
async fn requests_waiting_for_decode_are_not_a_prefill_backlog() -> Result<()> {
    // A decode engine with room for two of these requests at a time, and a fast prefill engine:
    // requests done with prefill wait for decode, without a first token yet.
    let bed = Bed::start(
        "e2e-real-decode-bound",
        &[],
        &[
            Engine::new(Mode::Prefill),
            Engine {
                kv_blocks: 160,
                ..Engine::new(Mode::Decode)
            },
        ],
    )
    .await?;
    let prometheus = Prometheus::start_jobs(&jobs(&bed), 1).await?;
    let client = PrometheusClient::new(&prometheus.url, Duration::from_secs(10))?;
    scraped(&client, &bed).await?;
    let addr = bed.frontend_addr.clone();
    let load = tokio::spawn(async move { dynamo::replay(&addr, &load(16, 1000, 150, 0.3)).await });
    // While requests wait for decode, the frontend's deprecated queued gauge counts them (the
    // earlier read: requests without a first token); the prefill stages do not. Judged from
    // Prometheus, in one read of the gauge, the stages and the decode engine's KV usage, at a
    // moment when the decode cache is full and several requests wait for it: once the prompts
    // have all arrived the prefill engine has none left, whatever the machine's load. The
    // earlier read, which counted the queued gauge, never shows that moment.
    let last = std::cell::Cell::new(None);
    let waiting_for_decode = poll_until(
        "queued requests waiting for decode, none for prefill",
        Duration::from_secs(60),
        || {
            let (client, bed, last) = (&client, &bed, &last);
            async move {
                let (observation, kv_source) = observed(client, bed, 10).await?;
                let queued = value(
                    client,
                    &format!(
                        "sum(dynamo_frontend_queued_requests{{dynamo_namespace=\"{}\"}})",
                        bed.dynamo_namespace
                    ),
                )
                .await?;
                let reading = format!(
                    "queued_requests {queued:?}, prefill pending {:?}, KV peak {:?} from {kv_source:?}",
                    observation.queued, observation.decode_kv_usage_peak
                );
                eprintln!("{reading}");
                last.set(Some(reading));
                Ok(kv_source == Some(KvUsageSource::Engines)
                    && observation.decode_kv_usage_peak.is_some_and(|peak| peak >= 0.7)
                    && queued.is_some_and(|q| q >= 5.0)
                    && observation.queued.is_some_and(|pending| pending <= 1.0))
            }
        },
    )
    .await;
    if let Err(e) = waiting_for_decode {
        return Err(format!("{e}; last read: {}", last.take().unwrap_or_default()).into());
    }
    assert_eq!(load.await?, 0, "requests failed");
    Ok(())
}

#[tokio::test]
async fn requests_waiting_for_an_aggregated_engine_are_a_backlog() -> Result<()> {
    // One aggregated engine at a tenth of its timing model's speed: a burst of long prompts
    // waits for it. The frontend keeps them in its `dispatch` stage with phase `aggregated`.
    let bed = Bed::start(
        "e2e-real-agg",
        &[],
        &[Engine {
            speedup: 0.1,
            ..Engine::new(Mode::Aggregated)
        }],
    )
    .await?;
    let prometheus = Prometheus::start_jobs(&jobs(&bed), 1).await?;
    let client = PrometheusClient::new(&prometheus.url, Duration::from_secs(10))?;
    scraped(&client, &bed).await?;
    let addr = bed.frontend_addr.clone();
    let load = tokio::spawn(async move { dynamo::replay(&addr, &load(12, 4000, 20, 0.05)).await });
    poll_until(
        "requests waiting for their first token",
        Duration::from_secs(60),
        || {
            let bed = &bed;
            async move {
                let text = bed.frontend_metrics().await?;
                Ok(dynamo::sample(&text, "dynamo_frontend_queued_requests", &[]).is_some_and(|q| q >= 6.0))
            }
        },
    )
    .await?;
    let text = bed.frontend_metrics().await?;
    let dispatched = dynamo::sample(
        &text,
        "dynamo_frontend_stage_requests",
        &[("stage", "dispatch"), ("phase", "aggregated")],
    );
    assert!(dispatched.is_some_and(|d| d >= 4.0), "{dispatched:?}");
    // Read through Prometheus: the waiting requests are the backlog, and the engine's KV usage
    // is read from the engine, scraped as a `type: worker` pod (once its first scrapes are in).
    observed_from_engines(&client, &bed, 10, |o| o.queued.is_some_and(|q| q >= 4.0)).await?;
    // Load mode's queue: those beyond the one engine serving.
    let samples = client
        .load_samples(&bed.dynamo_namespace, 10.0, 1.0, unix_now(), 1)
        .await?;
    assert!(
        samples.prefill_queue.iter().copied().fold(0.0, f64::max) >= 3.0,
        "{samples:?}"
    );
    assert_eq!(load.await?, 0, "requests failed");
    Ok(())
}

#[tokio::test]
async fn a_prometheus_that_lost_its_storage_does_not_count_a_frontends_lifetime() -> Result<()> {
    let bed = Bed::start(
        "e2e-real-fresh-tsdb",
        &[],
        &[Engine::new(Mode::Prefill), Engine::new(Mode::Decode)],
    )
    .await?;
    // Longer than the new Prometheus takes to be judged in, so its first scrape is in the
    // window; the frontend must be older.
    let window_s = 30;
    let ns = bed.dynamo_namespace.clone();
    // The earlier read: a series first seen in the window counted from zero, whatever was new.
    let earlier = format!(
        "sum((increase(dynamo_frontend_requests_total{{dynamo_namespace=\"{ns}\"}}[{window_s}s]) \
         unless (max_over_time(dynamo_frontend_requests_total{{dynamo_namespace=\"{ns}\"}}[{window_s}s]) \
         unless dynamo_frontend_requests_total{{dynamo_namespace=\"{ns}\"}} offset {window_s}s)) \
         or (max_over_time(dynamo_frontend_requests_total{{dynamo_namespace=\"{ns}\"}}[{window_s}s]) \
         unless dynamo_frontend_requests_total{{dynamo_namespace=\"{ns}\"}} offset {window_s}s))"
    );
    {
        let first = Prometheus::start_jobs(&jobs(&bed), 1).await?;
        let client = PrometheusClient::new(&first.url, Duration::from_secs(10))?;
        scraped(&client, &bed).await?;
        let failed = dynamo::replay(&bed.frontend_addr, &load(40, 40, 8, 0.05)).await;
        assert_eq!(failed, 0, "requests failed");
        first.scraped_since(jobs(&bed).len(), unix_now(), 3).await?;
        let (seen, _) = observed(&client, &bed, 30).await?;
        assert_eq!(seen.num_req, 40.0, "{seen:?}");
        // Dropped: stopped, its storage removed.
    }
    // A Prometheus without that storage (a restart without a volume; a PodMonitor added to a
    // running graph is the same) finds the frontend, older than the window, at its lifetime
    // totals.
    let fresh = Prometheus::start_jobs(&jobs(&bed), 1).await?;
    let client = PrometheusClient::new(&fresh.url, Duration::from_secs(10))?;
    let uptime =
        format!("max(dynamo_component_uptime_seconds{{dynamo_namespace=\"{ns}\",job=\"dynamo-frontend\"}})");
    poll_until(
        "the frontend's uptime, beyond the window, in the new Prometheus",
        Duration::from_secs(60),
        || async {
            Ok(value(&client, &uptime)
                .await?
                .is_some_and(|u| u > window_s as f64 + 2.0))
        },
    )
    .await?;
    fresh.scraped_since(jobs(&bed).len(), unix_now(), 3).await?;
    let (found, _) = observed(&client, &bed, window_s).await?;
    assert_eq!(found.num_req, 0.0, "{found:?}");
    assert_eq!(found.arrivals, Some(0.0), "{found:?}");
    assert_eq!(
        value(&client, &earlier).await?,
        Some(40.0),
        "the earlier read counts the frontend's lifetime"
    );
    // What the frontend serves from then on counts, and so does a label set it creates.
    prometheus_sees_new_requests(&client, &fresh, &bed, window_s).await
}

/// Five requests after the new Prometheus found the frontend are the window's five.
async fn prometheus_sees_new_requests(
    client: &PrometheusClient,
    prometheus: &Prometheus,
    bed: &Bed,
    window_s: u64,
) -> Result<()> {
    let failed = dynamo::replay(&bed.frontend_addr, &load(5, 40, 8, 0.1)).await;
    assert_eq!(failed, 0, "requests failed");
    prometheus.scraped_since(jobs(bed).len(), unix_now(), 2).await?;
    let (after, _) = observed(client, bed, window_s).await?;
    // `increase` extrapolates its samples to the window: about five, far from 45.
    assert!(after.num_req > 4.5 && after.num_req < 7.0, "{after:?}");
    Ok(())
}

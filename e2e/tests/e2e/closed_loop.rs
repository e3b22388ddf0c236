//! The planner end to end on real Dynamo: a DGD on kwok nodes, the test bed running NVIDIA
//! Dynamo's real frontend and one real mocker engine per Ready prefill and decode pod (timed by
//! the profile the policy plans with), a load generator replaying a trace against the frontend,
//! a real Prometheus scraping them as NVIDIA's PodMonitors do, and the operator planning every
//! 10 s. A load step up raises the replicas and the engine processes with them, a step down
//! lowers them, while Prometheus is down nothing is scaled down, and an overload is scaled out
//! of. The synthetic frontend (`start_synthetic_frontend`) stays for tests that need no engines.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use e2e::{Result, in_namespace_exclusive, install_crds, poll_until, repo_root, sim_binary};
use k8s_openapi::api::events::v1::Event;
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use planner_api::{DynamoGraphDeployment, KvUsageSource, PlannerPolicy};
use serde_json::{Value, json};

use crate::{
    bed::{Bed, MODEL, PROFILE, RELEASE, finish, graph, start_with_prometheus, write_trace},
    dgd::replicas,
    faults::condition,
    operator::start,
};

const INTERVAL_S: u64 = 10;
const WAIT: Duration = Duration::from_secs(120);
const TTFT_TARGET_MS: f64 = 500.0;

/// The engine processes the bed runs (prefill, decode) and what it has sent.
async fn engines(bed: &Bed) -> Result<(i64, i64, Value)> {
    let status = bed.status().await?;
    Ok((
        status["prefill"].as_i64().unwrap_or(-1),
        status["decode"].as_i64().unwrap_or(-1),
        status["load"].clone(),
    ))
}

/// Waits until the bed runs one engine process per replica of the DGD.
async fn engines_follow(bed: &Bed, dgds: &Api<DynamoGraphDeployment>) -> Result<()> {
    poll_until(
        "one engine process per prefill and decode replica",
        Duration::from_secs(60),
        || async {
            let want = replicas(&dgds.get("llama").await?);
            let (prefill, decode, _) = engines(bed).await?;
            Ok((prefill, decode) == (i64::from(want.0), i64::from(want.1)))
        },
    )
    .await
}

/// A trace of one request per second for ten minutes (looped by the bed).
fn trace(dir: &std::path::Path) -> Result<std::path::PathBuf> {
    let path = dir.join("trace.jsonl");
    write_trace(&path, 1.0, 600.0)?;
    Ok(path)
}

/// The synthetic frontend, stopped on drop.
pub(crate) struct Frontend {
    child: Child,
    /// Its listen address (metrics and control endpoint), host:port.
    pub(crate) control: String,
}

impl Drop for Frontend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// POSTs to the synthetic frontend's control endpoint (plain HTTP/1.0 over loopback).
pub(crate) async fn post(addr: &str, path: &str) -> Result<()> {
    let (addr, request) = (
        addr.to_string(),
        format!("POST {path} HTTP/1.0\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
    );
    tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr)?;
        stream.write_all(request.as_bytes())?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    })
    .await?
    .map_err(|e| e.into())
    .and_then(|response: String| {
        if response.starts_with("HTTP/1.0 2") || response.starts_with("HTTP/1.1 2") {
            Ok(())
        } else {
            Err(format!(
                "control request failed: {}",
                response.lines().next().unwrap_or_default()
            )
            .into())
        }
    })
}

/// Starts the synthetic frontend replaying the Azure conversation trace four times faster, in
/// a loop, for model `llama-3.1-8b`, with its workers given by `capacity` (`--dgd` and
/// `--namespace`, or fixed `--prefill` and `--decode` counts).
pub(crate) fn start_synthetic_frontend(capacity: &[&str]) -> Result<Frontend> {
    let trace = repo_root().join("crates/planner-core/tests/fixtures/traces/azure2023_conv.csv");
    let listen = format!("127.0.0.1:{}", free_port());
    let child = Command::new(sim_binary())
        .args([
            "synthetic-frontend",
            "--trace",
            trace.to_str().ok_or("trace path")?,
            "--profile",
            "h200-llama3.1-8b-tp1",
            "--model",
            "llama-3.1-8b",
            "--listen",
            &listen,
            "--speedup",
            "4",
            "--loop",
            "--rate-scale",
            "1",
        ])
        .args(capacity)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the synthetic frontend (make e2e builds it): {e}"))?;
    Ok(Frontend {
        child,
        control: listen,
    })
}

fn policy(prometheus: &str) -> Result<PlannerPolicy> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "planner.dynamo.io/v1alpha1",
        "kind": "PlannerPolicy",
        "metadata": {"name": "llama-sla"},
        "spec": {
            "targetRef": {"name": "llama"},
            "adjustmentInterval": format!("{INTERVAL_S}s"),
            "sla": {"ttftMs": TTFT_TARGET_MS, "itlMs": 8},
            // Ten-second intervals: a stabilisation window of three intervals, not the default
            // five minutes.
            "behavior": {"scaleDownStabilization": "30s"},
            "bounds": {"minReplicas": 1, "maxReplicas": 12, "maxGpuBudget": -1},
            "predictor": {"type": "constant"},
            "profile": {"builtin": PROFILE},
            "metrics": {"prometheus": {"url": prometheus}, "modelName": MODEL}
        }
    }))?)
}

// Both tests run alone (`in_namespace_exclusive`): they measure the latency of real processes on
// two cores, and the engines they start at once would slow the tests beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_follow_the_load_and_missing_metrics_never_scale_down() -> Result<()> {
    in_namespace_exclusive("closed-loop", |ns| async move {
        install_crds(&ns.client).await?;
        let dgds: Api<DynamoGraphDeployment> = ns.api();
        let policies: Api<PlannerPolicy> = ns.api();
        ns.accepts(&graph("llama")?).await?;
        let dir = tempfile_dir(&ns.name)?;
        let trace_file = trace(&dir)?;
        // The operator first: it renders the pods the bed plays.
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let (operator, bed, mut prometheus) =
            start_with_prometheus(&ns, "llama", &trace_file, &[], operator).await?;
        let outcome = async {
            policies
                .create(&PostParams::default(), &policy(&prometheus.url)?)
                .await?;

            // Metrics flow: the policy observes the trace's requests, from the real frontend's
            // series, which get their dynamo_namespace from the PodMonitor's relabelling only,
            // and the decode KV usage from the engines (the mocker's gauge has no Dynamo labels:
            // the worker PodMonitor adds the graph's namespace from the pod label the operator
            // renders), not the KV router's estimate.
            poll_until("the policy to observe requests and the engines' KV usage", WAIT, || async {
                let policy = policies.get("llama-sla").await?;
                let observed = policy.status.as_ref().and_then(|s| s.observed.as_ref());
                Ok(observed.and_then(|o| o.requests).is_some_and(|r| r > 0.0)
                    && observed.and_then(|o| o.decode_kv_usage_source) == Some(KvUsageSource::Engines))
            })
            .await?;
            // The series as the chart's PodMonitors label them: the frontend's dynamo_namespace
            // from its pod's label, the engines' too (on the series that carry none of their own)
            // with their component type, and the pod of each.
            let namespace = format!("{}-llama", ns.name);
            let frontend = prometheus
                .query(&format!(
                    "dynamo_frontend_requests_total{{dynamo_namespace=\"{namespace}\"}}"
                ))
                .await?;
            let labels = &frontend
                .first()
                .ok_or("no frontend series with the dynamo_namespace")?["metric"];
            let job = |monitor: &str| format!("{}/{RELEASE}-planner-operator-dynamo-{monitor}", ns.name);
            assert_eq!(labels["job"], job("frontend").as_str(), "{labels}");
            assert_eq!(labels["namespace"], ns.name.as_str(), "{labels}");
            // honorLabels: the frontend's own `endpoint` label is kept over the scrape's.
            assert_eq!(labels["endpoint"], "chat_completions", "{labels}");
            assert!(
                labels["pod"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("llama-frontend-")),
                "{labels}"
            );
            let engines_seen = prometheus
                .query(&format!(
                    "count by (dynamo_component_type, job, dynamo_namespace) (vllm:kv_cache_usage_perc or dynamo_component_uptime_seconds{{job=\"{}\"}})",
                    job("worker")
                ))
                .await?;
            let mut types: Vec<(String, String, String)> = engines_seen
                .iter()
                .map(|s| {
                    let label = |name: &str| s["metric"][name].as_str().unwrap_or("").to_string();
                    (label("dynamo_component_type"), label("job"), label("dynamo_namespace"))
                })
                .collect();
            types.sort();
            types.dedup();
            assert_eq!(
                types,
                [
                    ("decode".to_string(), job("worker"), namespace.clone()),
                    ("prefill".to_string(), job("worker"), namespace.clone())
                ]
            );
            let before = replicas(&dgds.get("llama").await?);

            // Step up: eight times the traffic. Decode and prefill grow within a few intervals,
            // and the bed runs an engine process for each new replica.
            bed.rate_scale(8.0).await?;
            poll_until("both pools to scale up", WAIT, || async {
                let (prefill, decode) = replicas(&dgds.get("llama").await?);
                Ok(prefill > before.0 && decode > before.1)
            })
            .await?;
            let peak = replicas(&dgds.get("llama").await?);
            eprintln!("scaled up from {before:?} to {peak:?}");
            engines_follow(&bed, &dgds).await?;
            let events: Api<Event> = ns.api();
            let scaled = events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .any(|e| e.reason.as_deref() == Some("Scaled"));
            assert!(scaled, "no Scaled event");
            // The operator's own metrics of the policy: its targets, the intervals it counted
            // against them, the GPUs it decided and the decision counter.
            let policy_labels = [format!("namespace=\"{}\"", ns.name), "policy=\"llama-sla\"".to_string()];
            let matching: Vec<&str> = policy_labels.iter().map(String::as_str).collect();
            let served = metrics_text(operator.metrics_addr).await?;
            let value = |name: &str| metric(&served, name, &matching);
            assert!(
                (value("planner_operator_ttft_target_seconds") - TTFT_TARGET_MS / 1000.0).abs() < 1e-9,
                "{served}"
            );
            assert!(value("planner_operator_sla_intervals") >= 1.0, "{served}");
            assert!(value("planner_operator_desired_gpus") >= 2.0, "{served}");
            assert!(
                served.lines().any(|l| l.starts_with("planner_operator_observed_decode_kv_usage_ratio{")
                    && matching.iter().all(|m| l.contains(m))),
                "no decode KV usage series: {served}"
            );
            assert!(
                metric(&served, "planner_operator_scaling_decisions_total", &[matching[0], matching[1], "direction=\"up\""]) >= 1.0,
                "{served}"
            );

            // Prometheus down: no scale-down however idle the traffic, and the policy says why.
            bed.rate_scale(0.0).await?;
            prometheus.stop();
            poll_until(
                "MetricsAvailable=False while Prometheus is down",
                WAIT,
                || async {
                    let policy = policies.get("llama-sla").await?;
                    Ok(condition(&policy, "MetricsAvailable").is_some_and(|(status, _)| status == "False"))
                },
            )
            .await?;
            // Two more intervals planned (lastTickTime moves) without a scale-down: the planner
            // keeps ticking and holds.
            let tick = |policy: &PlannerPolicy| policy.status.as_ref().and_then(|s| s.last_tick_time.clone());
            let outage_tick = tick(&policies.get("llama-sla").await?);
            let ticks = std::sync::Mutex::new(Vec::new());
            poll_until("two intervals planned during the outage", WAIT, || async {
                let policy = policies.get("llama-sla").await?;
                let during_outage = replicas(&dgds.get("llama").await?);
                assert!(
                    during_outage.0 >= peak.0 && during_outage.1 >= peak.1,
                    "scaled down on missing metrics: {peak:?} -> {during_outage:?}"
                );
                let mut ticks = ticks.lock().map_err(|_| "lock")?;
                if let Some(now) = tick(&policy).filter(|t| Some(t) != outage_tick.as_ref())
                    && !ticks.contains(&now)
                {
                    ticks.push(now);
                }
                Ok(ticks.len() >= 2)
            })
            .await?;
            // The outage in the metrics: intervals in a row without metrics (what the chart's
            // PlannerPolicyMetricsUnavailable alert reads), and the failed reads by reason.
            let served = metrics_text(operator.metrics_addr).await?;
            assert!(
                metric(&served, "planner_operator_consecutive_intervals_metrics_unavailable", &matching) >= 2.0,
                "{served}"
            );
            assert!(
                metric(&served, "planner_operator_metrics_unavailable_total", &[matching[0], matching[1], "reason=\"http\""]) >= 2.0,
                "{served}"
            );

            // Back, at the original rate: the pools shrink again, and their engine processes
            // stop (SIGTERM, as a pod's containers get) without failing a request.
            bed.rate_scale(1.0).await?;
            prometheus.restart().await?;
            poll_until(
                "both pools to scale back down",
                Duration::from_secs(180),
                || async {
                    let (prefill, decode) = replicas(&dgds.get("llama").await?);
                    Ok(prefill < peak.0 || decode < peak.1)
                },
            )
            .await?;
            engines_follow(&bed, &dgds).await?;
            let policy = policies.get("llama-sla").await?;
            assert_eq!(condition(&policy, "Ready").map(|c| c.0).as_deref(), Some("True"));
            let (_, _, load) = engines(&bed).await?;
            eprintln!("load: {load}");
            assert!(load["completed"].as_u64().unwrap_or(0) > 100, "{load}");
            assert_eq!(load["failed"], 0, "requests failed: {load}");
            operator.check_running()
        }
        .await;
        finish(operator, bed, prometheus, &dir, outcome).await
    })
    .await
}

/// A scratch directory for the test's trace.
pub(crate) fn tempfile_dir(name: &str) -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("e2e-{name}-{}", free_port()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A process's own metrics text.
async fn metrics_text(addr: std::net::SocketAddr) -> Result<String> {
    Ok(e2e::http_get(addr, "/metrics").await?.1)
}

/// A sample of metrics text (`name{labels} value`), summed over its series whose labels contain
/// every one of `matching` (e.g. `worker_type="prefill"`; none: all).
fn metric(body: &str, name: &str, matching: &[&str]) -> f64 {
    body.lines()
        .filter(|l| {
            l.starts_with(name)
                && l[name.len()..].starts_with(['{', ' '])
                && matching.iter().all(|m| l.contains(m))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overload_is_scaled_out_of_and_no_pool_shrinks_while_a_backlog_remains() -> Result<()> {
    in_namespace_exclusive("overload", |ns| async move {
        install_crds(&ns.client).await?;
        let dgds: Api<DynamoGraphDeployment> = ns.api();
        let policies: Api<PlannerPolicy> = ns.api();
        ns.accepts(&graph("llama")?).await?;
        let dir = tempfile_dir(&ns.name)?;
        let trace_file = trace(&dir)?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        // Engines serve two seconds after their pod is Ready: the test is about how fast the
        // planner reacts, not how long an engine loads.
        let (operator, bed, prometheus) =
            start_with_prometheus(&ns, "llama", &trace_file, &["--engine-startup-s", "2"], operator).await?;
        let outcome = async {
            policies
                .create(&PostParams::default(), &policy(&prometheus.url)?)
                .await?;
            // Settled at the trace's own rate: two intervals observed.
            let observed = |policy: &PlannerPolicy| {
                policy
                    .status
                    .as_ref()
                    .and_then(|s| s.observed.as_ref())
                    .and_then(|o| Some((o.requests?, o.ttft_ms?)))
            };
            poll_until("the policy to observe the trace's load", WAIT, || async {
                Ok(observed(&policies.get("llama-sla").await?).is_some_and(|(r, _)| r > 0.0))
            })
            .await?;
            tokio::time::sleep(Duration::from_secs(2 * INTERVAL_S)).await;
            let policy = policies.get("llama-sla").await?;
            let (requests, ttft_ms) = observed(&policy).ok_or("no observation")?;
            let before = replicas(&dgds.get("llama").await?);
            // What the prefill pool serves: engines over the unqueued service time (the TTFT at
            // this light load); the step asks four times that (at most 30 requests/s, what the
            // real processes serve on two cores beside the rest of the suite).
            let capacity = f64::from(before.0) / (ttft_ms / 1000.0).max(1e-3);
            let rate = requests / INTERVAL_S as f64;
            let step = (4.0 * capacity / rate.max(1e-3)).clamp(4.0, 30.0 / rate.max(1e-3));
            eprintln!(
                "pool {before:?} serves ~{capacity:.1} req/s at {rate:.1} req/s; stepping the rate {step:.1}x"
            );
            bed.rate_scale(step).await?;
            let stepped = std::time::Instant::now();

            // Scaled out within two intervals.
            poll_until(
                "a scale-out within two intervals",
                Duration::from_secs(2 * INTERVAL_S + 5),
                || async { Ok(replicas(&dgds.get("llama").await?).0 > before.0) },
            )
            .await?;
            eprintln!("scaled out after {:?}", stepped.elapsed());

            // Back under the TTFT target within three intervals of the step (the mean TTFT of the
            // first tokens of each ten-second window, from the real frontend's histogram), and no
            // pool shrinks while more requests wait for a prefill engine (in the router's queue)
            // than there are engines left.
            let frontend = bed.frontend().await?;
            let ttft = || async move {
                let body = metrics_text(frontend).await?;
                Ok::<_, e2e::Error>((
                    metric(&body, "dynamo_frontend_time_to_first_token_seconds_sum", &[]),
                    metric(&body, "dynamo_frontend_time_to_first_token_seconds_count", &[]),
                ))
            };
            let mut most_queued = 0.0_f64;
            let mut last = replicas(&dgds.get("llama").await?);
            let mut recovered = None;
            let mut window_start = (std::time::Instant::now(), ttft().await?);
            let deadline = std::time::Instant::now() + Duration::from_secs(8 * INTERVAL_S);
            while std::time::Instant::now() < deadline {
                let now = replicas(&dgds.get("llama").await?);
                let body = metrics_text(frontend).await?;
                let queued = metric(
                    &body,
                    "dynamo_frontend_router_queue_pending_requests",
                    &["worker_type=\"prefill\""],
                );
                // The backlog the planner reads, the frontend's prefill stages (the router's
                // queue is its `route` stage), holds every request the router's queue does.
                let stages: f64 = ["preprocess", "route", "dispatch"]
                    .iter()
                    .map(|stage| {
                        let stage = format!("stage=\"{stage}\"");
                        metric(&body, "dynamo_frontend_stage_requests", &[&stage, "phase=\"prefill\""])
                            + metric(&body, "dynamo_frontend_stage_requests", &[&stage, "phase=\"\""])
                    })
                    .sum();
                assert!(
                    stages >= queued,
                    "the prefill stages show {stages} requests, the router's queue {queued}"
                );
                most_queued = most_queued.max(queued);
                if queued > f64::from(now.0) {
                    assert!(
                        now.0 >= last.0 && now.1 >= last.1,
                        "scaled down from {last:?} to {now:?} with {queued} requests waiting for a prefill engine"
                    );
                }
                last = now;
                if window_start.0.elapsed() >= Duration::from_secs(INTERVAL_S) {
                    let (sum, count) = ttft().await?;
                    let (before_sum, before_count) = window_start.1;
                    let mean_ms = if count > before_count {
                        (sum - before_sum) / (count - before_count) * 1000.0
                    } else {
                        f64::INFINITY
                    };
                    let (prefill, decode, _) = engines(&bed).await?;
                    eprintln!("{:>5.1?} after the step: window mean TTFT {mean_ms:.0} ms, replicas {now:?}, engines ({prefill}, {decode}), {queued} queued", stepped.elapsed());
                    // Recovered from the start of the first window whose first tokens met it.
                    if recovered.is_none() && mean_ms <= TTFT_TARGET_MS {
                        recovered = Some(window_start.0.duration_since(stepped));
                    }
                    window_start = (std::time::Instant::now(), (sum, count));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            assert!(most_queued > 0.0, "the step never queued a request in the router");
            let recovered = recovered.ok_or("TTFT never came back under the target after the step")?;
            eprintln!("TTFT back under the target {recovered:?} after the step; replicas {last:?}");
            assert!(
                recovered <= Duration::from_secs(3 * INTERVAL_S + 2),
                "TTFT back under the target only after {recovered:?}"
            );
            let events: Api<Event> = ns.api();
            let reasons: Vec<String> = events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("Scaled"))
                .filter_map(|e| e.note)
                .collect();
            assert!(!reasons.is_empty(), "no Scaled event");
            eprintln!("Scaled events: {reasons:#?}");
            operator.check_running()
        }
        .await;
        finish(operator, bed, prometheus, &dir, outcome).await
    })
    .await
}

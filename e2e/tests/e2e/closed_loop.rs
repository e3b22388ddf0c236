//! The planner end to end: a DGD on kwok nodes, the synthetic Dynamo frontend
//! replaying the Azure conversation trace against the DGD's Ready pods, a real Prometheus
//! scraping it, and the operator planning every 10 s. A load step up raises the replicas, a
//! step down lowers them, and while Prometheus is down nothing is scaled down.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use e2e::{Result, TestNamespace, in_namespace, install_crds, poll_until, repo_root, sim_binary};
use k8s_openapi::api::events::v1::Event;
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use planner_api::{DynamoGraphDeployment, PlannerPolicy};
use serde_json::{Value, json};

use crate::{faults::condition, operator::start, prometheus::Prometheus};

const INTERVAL_S: u64 = 10;
const WAIT: Duration = Duration::from_secs(120);

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

fn start_frontend(ns: &TestNamespace, dgd: &str) -> Result<Frontend> {
    start_synthetic_frontend(&["--dgd", dgd, "--namespace", &ns.name])
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

fn graph() -> Result<Value> {
    let mut value: Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join("config/samples/dgd-disagg.yaml"),
    )?)?;
    value["metadata"]["name"] = json!("llama");
    value["spec"]
        .as_object_mut()
        .ok_or("spec")?
        .remove("topologyConstraint");
    for component in value["spec"]["components"].as_array_mut().ok_or("components")? {
        component
            .as_object_mut()
            .ok_or("component")?
            .remove("kvCacheTransferTopology");
    }
    Ok(value)
}

fn policy(prometheus: &str) -> Result<PlannerPolicy> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "planner.dynamo.io/v1alpha1",
        "kind": "PlannerPolicy",
        "metadata": {"name": "llama-sla"},
        "spec": {
            "targetRef": {"name": "llama"},
            "adjustmentInterval": format!("{INTERVAL_S}s"),
            "sla": {"ttftMs": 200, "itlMs": 10},
            // Ten-second intervals: a stabilisation window of three intervals, not the default
            // five minutes.
            "behavior": {"scaleDownStabilization": "30s"},
            "bounds": {"minReplicas": 1, "maxReplicas": 12, "maxGpuBudget": -1},
            "predictor": {"type": "constant"},
            "profile": {"builtin": "h200-llama3.1-8b-tp1"},
            "metrics": {"prometheus": {"url": prometheus}, "modelName": "llama-3.1-8b"}
        }
    }))?)
}

fn replicas(dgd: &DynamoGraphDeployment) -> (i32, i32) {
    let of = |name: &str| {
        dgd.spec
            .components
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.replicas)
            .unwrap_or(1)
    };
    (of("prefill"), of("decode"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_follow_the_load_and_missing_metrics_never_scale_down() -> Result<()> {
    in_namespace("closed-loop", |ns| async move {
        install_crds(&ns.client).await?;
        let dgds: Api<DynamoGraphDeployment> = ns.api();
        let policies: Api<PlannerPolicy> = ns.api();
        ns.accepts(&graph()?).await?;
        let frontend = start_frontend(&ns, "llama")?;
        let mut prometheus = Prometheus::start(
            &frontend.control,
            &[("dynamo_namespace", &format!("{}-llama", ns.name))],
        )
        .await?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            policies
                .create(&PostParams::default(), &policy(&prometheus.url)?)
                .await?;

            // Metrics flow: the policy observes the trace's requests.
            poll_until("the policy to observe requests", WAIT, || async {
                let policy = policies.get("llama-sla").await?;
                Ok(policy
                    .status
                    .as_ref()
                    .and_then(|s| s.observed.as_ref())
                    .and_then(|o| o.requests)
                    .is_some_and(|r| r > 0.0))
            })
            .await?;
            let before = replicas(&dgds.get("llama").await?);

            // Step up: forty times the traffic. Decode and prefill grow within a few intervals.
            post(&frontend.control, "/control/rate-scale/40").await?;
            poll_until("both pools to scale up", WAIT, || async {
                let (prefill, decode) = replicas(&dgds.get("llama").await?);
                Ok(prefill > before.0 && decode > before.1)
            })
            .await?;
            let peak = replicas(&dgds.get("llama").await?);
            eprintln!("scaled up from {before:?} to {peak:?}");
            let events: Api<Event> = ns.api();
            let scaled = events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .any(|e| e.reason.as_deref() == Some("Scaled"));
            assert!(scaled, "no Scaled event");

            // Prometheus down: no scale-down however idle the traffic, and the policy says why.
            post(&frontend.control, "/control/rate-scale/0").await?;
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

            // Back, at the original rate: the pools shrink again.
            post(&frontend.control, "/control/rate-scale/1").await?;
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
            let policy = policies.get("llama-sla").await?;
            assert_eq!(condition(&policy, "Ready").map(|c| c.0).as_deref(), Some("True"));
            operator.check_running()
        }
        .await;
        let stopped = operator.stop().await;
        drop(frontend);
        outcome.and(stopped)
    })
    .await
}

/// A sample of the frontend's own metrics text (`name{labels} value`), summed over its series.
async fn frontend_metric(control: &str, name: &str) -> Result<f64> {
    let addr: std::net::SocketAddr = control.parse()?;
    let (_, body) = e2e::http_get(addr, "/metrics").await?;
    Ok(body
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overload_is_scaled_out_of_and_no_pool_shrinks_while_a_backlog_remains() -> Result<()> {
    in_namespace("overload", |ns| async move {
        install_crds(&ns.client).await?;
        let dgds: Api<DynamoGraphDeployment> = ns.api();
        let policies: Api<PlannerPolicy> = ns.api();
        ns.accepts(&graph()?).await?;
        let frontend = start_frontend(&ns, "llama")?;
        let prometheus = Prometheus::start(
            &frontend.control,
            &[("dynamo_namespace", &format!("{}-llama", ns.name))],
        )
        .await?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
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
            // this light load); the step asks four times that.
            let capacity = f64::from(before.0) / (ttft_ms / 1000.0).max(1e-3);
            let rate = requests / INTERVAL_S as f64;
            let step = (4.0 * capacity / rate.max(1e-3)).clamp(4.0, 200.0);
            eprintln!(
                "pool {before:?} serves ~{capacity:.0} req/s at {rate:.1} req/s; stepping the rate {step:.0}x"
            );
            post(&frontend.control, &format!("/control/rate-scale/{step:.0}")).await?;
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
            // first tokens of each ten-second window, from the frontend's histogram), and no
            // pool shrinks while requests wait beyond the engines serving.
            let control = frontend.control.as_str();
            let ttft = || async move {
                Ok::<_, e2e::Error>((
                    frontend_metric(control, "dynamo_frontend_time_to_first_token_seconds_sum").await?,
                    frontend_metric(control, "dynamo_frontend_time_to_first_token_seconds_count").await?,
                ))
            };
            let mut last = replicas(&dgds.get("llama").await?);
            let mut recovered = None;
            let mut window_start = (std::time::Instant::now(), ttft().await?);
            let deadline = std::time::Instant::now() + Duration::from_secs(8 * INTERVAL_S);
            while std::time::Instant::now() < deadline {
                let now = replicas(&dgds.get("llama").await?);
                let queued = frontend_metric(control, "dynamo_frontend_queued_requests").await?;
                if queued > f64::from(now.0) {
                    assert!(
                        now.0 >= last.0 && now.1 >= last.1,
                        "scaled down from {last:?} to {now:?} with {queued} requests queued"
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
                    eprintln!("{:>5.1?} after the step: window mean TTFT {mean_ms:.0} ms, replicas {now:?}, {queued} queued", stepped.elapsed());
                    // Recovered from the start of the first window whose first tokens met it.
                    if recovered.is_none() && mean_ms <= 200.0 {
                        recovered = Some(window_start.0.duration_since(stepped));
                    }
                    window_start = (std::time::Instant::now(), (sum, count));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
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
        let stopped = operator.stop().await;
        drop(frontend);
        outcome.and(stopped)
    })
    .await
}

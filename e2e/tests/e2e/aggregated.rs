//! An aggregated graph (one `type: worker` component that prefills and decodes) scaled up and
//! down by a PlannerPolicy, in both modes, in closed loop: the synthetic frontend replays the
//! Azure conversation trace on aggregated engines against the worker pods that are Ready, a
//! real Prometheus scrapes it, the operator plans every 10 s.
//!
//! - Full mode: the operator renders the graph; kwok makes its worker pods Ready.
//! - Planner only (`--dgd-controller=false`): the test plays NVIDIA's operator, keeping a
//!   Deployment of worker pods at the DGD's replicas and writing the DGD's status as NVIDIA's
//!   operator does (Ready, the component's replicas and ready replicas).
//! - Real engines: the test bed (`planner-sim dynamo-bed`) runs Dynamo's real frontend and a
//!   real mocker engine in aggregated mode (`--disaggregation-mode agg`) per Ready worker pod,
//!   scraped as the chart's PodMonitors scrape them.

use std::time::Duration;

use e2e::{Result, TestNamespace, in_namespace, in_namespace_exclusive, install_crds, poll_until, repo_root};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod, events::v1::Event};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use planner_api::{
    DynamoGraphDeployment, KvUsageSource, PlannerPolicy,
    labels::{LABEL_COMPONENT_TYPE, LABEL_GRAPH, LABEL_MANAGED_BY, MANAGED_BY},
};
use serde_json::{Value, json};

use crate::{
    bed::{Bed, finish, start_with_prometheus, write_trace},
    closed_loop::{post, start_synthetic_frontend, tempfile_dir},
    faults::condition,
    operator::start,
    prometheus::{Job, Prometheus},
};

const WAIT: Duration = Duration::from_secs(150);
const GRAPH: &str = "agg";

/// Prometheus scraping the synthetic frontend as the chart's PodMonitors scrape a graph's
/// pods: its frontend series, and its aggregated engines' (`type: worker`) KV gauges.
async fn scrape(ns: &TestNamespace, frontend: &str) -> Result<Prometheus> {
    let graph = ("dynamo_namespace".to_string(), format!("{}-{GRAPH}", ns.name));
    Prometheus::start_jobs(
        &[
            Job {
                name: "dynamo-frontend".into(),
                targets: vec![frontend.to_string()],
                path: "/metrics",
                labels: vec![graph.clone()],
            },
            Job {
                name: "dynamo-worker".into(),
                targets: vec![frontend.to_string()],
                path: "/engine/metrics",
                labels: vec![graph, ("dynamo_component_type".into(), "worker".into())],
            },
        ],
        1,
    )
    .await
}

fn graph() -> Result<Value> {
    graph_named(GRAPH)
}

/// The aggregated sample named `name`, as JSON.
pub(crate) fn graph_named(name: &str) -> Result<Value> {
    let mut value: Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join("config/samples/dgd-agg.yaml"),
    )?)?;
    value["metadata"]["name"] = json!(name);
    Ok(value)
}

fn policy(prometheus: &str) -> Result<PlannerPolicy> {
    policy_with(prometheus, 200.0)
}

fn policy_with(prometheus: &str, ttft_ms: f64) -> Result<PlannerPolicy> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "planner.dynamo.io/v1alpha1",
        "kind": "PlannerPolicy",
        "metadata": {"name": "agg-sla"},
        "spec": {
            "targetRef": {"name": GRAPH},
            "adjustmentInterval": "10s",
            "sla": {"ttftMs": ttft_ms, "itlMs": 15},
            // Ten-second intervals: a stabilisation window of three intervals.
            "behavior": {"scaleDownStabilization": "30s"},
            "bounds": {"minReplicas": 1, "maxReplicas": 12, "maxGpuBudget": -1},
            "predictor": {"type": "constant"},
            "profile": {"builtin": "h200-llama3.1-8b-tp1"},
            "metrics": {"prometheus": {"url": prometheus}, "modelName": "llama-3.1-8b"}
        }
    }))?)
}

fn workers(dgd: &DynamoGraphDeployment) -> i32 {
    dgd.spec
        .components
        .iter()
        .find(|c| c.name == "worker")
        .and_then(|c| c.replicas)
        .unwrap_or(1)
}

/// The scale-up, then the scale-down, of the aggregated pool, and what status and Events say.
async fn up_and_down(ns: &TestNamespace, frontend_control: &str) -> Result<()> {
    let dgds: Api<DynamoGraphDeployment> = ns.api();
    let policies: Api<PlannerPolicy> = ns.api();
    // The KV usage is read from the aggregated engines (component type `worker`), not
    // estimated.
    poll_until(
        "the policy to observe requests and the engines' KV usage",
        WAIT,
        || async {
            let policy = policies.get("agg-sla").await?;
            let observed = policy.status.as_ref().and_then(|s| s.observed.as_ref());
            Ok(observed.and_then(|o| o.requests).is_some_and(|r| r > 0.0)
                && observed.and_then(|o| o.decode_kv_usage_source) == Some(KvUsageSource::Engines))
        },
    )
    .await?;
    let policy = policies.get("agg-sla").await?;
    let resolved = condition(&policy, "TargetResolved").ok_or("no TargetResolved")?;
    assert!(
        resolved.0 == "True" && resolved.1.contains("aggregated worker component \"worker\""),
        "{resolved:?}"
    );
    let before = workers(&dgds.get(GRAPH).await?);

    // Forty times the traffic: the one pool grows.
    post(frontend_control, "/control/rate-scale/40").await?;
    poll_until("the aggregated pool to scale up", WAIT, || async {
        Ok(workers(&dgds.get(GRAPH).await?) > before)
    })
    .await?;
    let peak = workers(&dgds.get(GRAPH).await?);
    eprintln!("aggregated workers scaled up from {before} to {peak}");
    let status = policies.get("agg-sla").await?.status.ok_or("no status")?;
    let desired = status.desired.ok_or("no desired replicas")?;
    assert_eq!(desired.workers, Some(desired.decode), "{desired:?}");
    assert_eq!(desired.prefill, desired.decode, "{desired:?}");
    let events: Api<Event> = ns.api();
    let notes: Vec<String> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Scaled"))
        .filter_map(|e| e.note)
        .collect();
    assert!(
        notes.iter().any(|n| n.starts_with("workers ")),
        "no Scaled event for the workers: {notes:?}"
    );

    // Back to the original rate: the pool shrinks once the stabilisation window has passed.
    post(frontend_control, "/control/rate-scale/1").await?;
    poll_until(
        "the aggregated pool to scale back down",
        Duration::from_secs(180),
        || async { Ok(workers(&dgds.get(GRAPH).await?) < peak) },
    )
    .await?;
    let policy = policies.get("agg-sla").await?;
    assert_eq!(condition(&policy, "Ready").map(|c| c.0).as_deref(), Some("True"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregated_graph_is_scaled_up_and_down_in_full_mode() -> Result<()> {
    in_namespace("agg-full", |ns| async move {
        install_crds(&ns.client).await?;
        ns.accepts(&graph()?).await?;
        let frontend = start_synthetic_frontend(&["--dgd", GRAPH, "--namespace", &ns.name, "--aggregated"])?;
        let prometheus = scrape(&ns, &frontend.control).await?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            let policies: Api<PlannerPolicy> = ns.api();
            policies
                .create(&PostParams::default(), &policy(&prometheus.url)?)
                .await?;
            up_and_down(&ns, &frontend.control).await?;
            // The operator rendered the worker pods it scaled.
            let pods: Api<Pod> = ns.api();
            let selector = format!("{LABEL_GRAPH}={GRAPH},{LABEL_COMPONENT_TYPE}=worker");
            let rendered = pods.list(&ListParams::default().labels(&selector)).await?.items;
            assert!(!rendered.is_empty(), "no worker pods rendered");
            operator.check_running()
        }
        .await;
        let stopped = operator.stop().await;
        drop(prometheus);
        drop(frontend);
        outcome.and(stopped)
    })
    .await
}

/// The Deployment standing in for the worker pods NVIDIA's operator would run.
fn worker_deployment() -> Result<Deployment> {
    let labels = json!({LABEL_GRAPH: GRAPH, LABEL_COMPONENT_TYPE: "worker"});
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "agg-worker"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": "registry.invalid/worker:1"}]}
            }
        }
    }))?)
}

/// One pass of the stand-in for NVIDIA's operator: the worker Deployment at the DGD's
/// replicas, and the DGD's status from the pods that are Ready.
async fn play_nvidia(ns: &TestNamespace) -> Result<()> {
    let dgds: Api<DynamoGraphDeployment> = ns.api();
    let deployments: Api<Deployment> = ns.api();
    let pods: Api<Pod> = ns.api();
    let wanted = workers(&dgds.get(GRAPH).await?);
    let params = PatchParams::apply("dynamo-operator-e2e").force();
    deployments
        .patch(
            "agg-worker",
            &params,
            &Patch::Apply(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "agg-worker"}, "spec": {"replicas": wanted}
            })),
        )
        .await?;
    let selector = format!("{LABEL_GRAPH}={GRAPH},{LABEL_COMPONENT_TYPE}=worker");
    let ready = pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count();
    let all_ready = i32::try_from(ready).unwrap_or(i32::MAX) >= wanted;
    dgds.patch_status(
        GRAPH,
        &params,
        &Patch::Apply(json!({
            "apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
            "metadata": {"name": GRAPH},
            "status": {
                "conditions": [{
                    "type": "Ready", "status": if all_ready { "True" } else { "False" },
                    "reason": if all_ready { "all_resources_are_ready" } else { "some_resources_are_not_ready" },
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"
                }],
                "components": {"worker": {"replicas": wanted, "readyReplicas": ready, "availableReplicas": ready}}
            }
        })),
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregated_graph_is_scaled_up_and_down_beside_nvidias_operator() -> Result<()> {
    in_namespace("agg-planner-only", |ns| async move {
        install_crds(&ns.client).await?;
        ns.accepts(&graph()?).await?;
        let deployments: Api<Deployment> = ns.api();
        deployments
            .create(&PostParams::default(), &worker_deployment()?)
            .await?;
        let stand_in = {
            let ns = ns.clone();
            tokio::spawn(async move {
                loop {
                    if let Err(error) = play_nvidia(&ns).await {
                        eprintln!("stand-in for NVIDIA's operator: {error}");
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            })
        };
        let frontend = start_synthetic_frontend(&["--dgd", GRAPH, "--namespace", &ns.name, "--aggregated"])?;
        let prometheus = scrape(&ns, &frontend.control).await?;
        let operator = start(&ns, &["--webhook-disabled", "--dgd-controller=false"]).await?;
        let outcome = async {
            let policies: Api<PlannerPolicy> = ns.api();
            policies
                .create(&PostParams::default(), &policy(&prometheus.url)?)
                .await?;
            up_and_down(&ns, &frontend.control).await?;
            // Planner only: the operator rendered nothing of its own.
            let pods: Api<Pod> = ns.api();
            let own = pods
                .list(&ListParams::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}")))
                .await?
                .items;
            assert!(own.is_empty(), "planner-only mode rendered pods");
            operator.check_running()
        }
        .await;
        stand_in.abort();
        let stopped = operator.stop().await;
        drop(prometheus);
        drop(frontend);
        outcome.and(stopped)
    })
    .await
}

/// The aggregated engine processes the bed runs.
async fn running_workers(bed: &Bed) -> Result<i64> {
    Ok(bed.status().await?["workers"].as_i64().unwrap_or(-1))
}

/// Full mode on real engines: the bed's aggregated mockers serve a trace of long prompts, a
/// real Prometheus scrapes the real frontend and engines as the chart's PodMonitors do, and the
/// policy reads them (the backlog from the frontend's `phase="aggregated"` stages, the KV usage
/// from the engines), scales the pool up under eight times the load and down after it, while
/// the bed runs one engine process per worker replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregated_graph_of_real_engines_is_scaled_up_and_down() -> Result<()> {
    in_namespace_exclusive("agg-real", |ns| async move {
        install_crds(&ns.client).await?;
        let dgds: Api<DynamoGraphDeployment> = ns.api();
        let policies: Api<PlannerPolicy> = ns.api();
        ns.accepts(&graph()?).await?;
        let dir = tempfile_dir(&ns.name)?;
        let trace = dir.join("trace.jsonl");
        // Prompts of 8,000-16,000 tokens at one every two seconds: about a third of one
        // engine's time on the bench profile.
        write_trace(&trace, 0.5, 600.0)?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let (operator, bed, prometheus) =
            start_with_prometheus(&ns, GRAPH, &trace, &[], operator).await?;
        let outcome = async {
            policies
                .create(&PostParams::default(), &policy_with(&prometheus.url, 1000.0)?)
                .await?;
            poll_until("the policy to observe requests and the engines' KV usage", WAIT, || async {
                let policy = policies.get("agg-sla").await?;
                let observed = policy.status.as_ref().and_then(|s| s.observed.as_ref());
                Ok(observed.and_then(|o| o.requests).is_some_and(|r| r > 0.0)
                    && observed.and_then(|o| o.decode_kv_usage_source) == Some(KvUsageSource::Engines))
            })
            .await?;
            // The real engines are scraped as aggregated workers.
            let types = prometheus
                .query(&format!(
                    "count by (dynamo_component_type) (vllm:kv_cache_usage_perc{{dynamo_namespace=\"{}-{GRAPH}\"}})",
                    ns.name
                ))
                .await?;
            let types: Vec<&str> = types
                .iter()
                .filter_map(|s| s["metric"]["dynamo_component_type"].as_str())
                .collect();
            assert_eq!(types, ["worker"]);
            // A plan at the base load that the pool already runs: the scale-up below is the
            // step's.
            poll_until("the pool to run the base load's plan", WAIT, || async {
                let policy = policies.get("agg-sla").await?;
                let desired = policy.status.and_then(|s| s.desired).and_then(|d| d.workers);
                Ok(desired == Some(workers(&dgds.get(GRAPH).await?)))
            })
            .await?;
            let before = workers(&dgds.get(GRAPH).await?);

            bed.rate_scale(8.0).await?;
            poll_until("the aggregated pool to scale up", WAIT, || async {
                Ok(workers(&dgds.get(GRAPH).await?) > before)
            })
            .await?;
            let peak = workers(&dgds.get(GRAPH).await?);
            eprintln!("real aggregated engines scaled up from {before} to {peak}");
            poll_until("one engine process per worker replica", Duration::from_secs(60), || async {
                Ok(running_workers(&bed).await? == i64::from(workers(&dgds.get(GRAPH).await?)))
            })
            .await?;

            bed.rate_scale(1.0).await?;
            // Back to the base load's plan, not just below the peak: the planner may take a
            // worker off while the step's load still runs (once the backlog it was sized for has
            // drained), which says nothing of the load going.
            poll_until(
                "the aggregated pool to scale back down to the base load's plan",
                Duration::from_secs(180),
                || async { Ok(workers(&dgds.get(GRAPH).await?) <= before) },
            )
            .await?;
            poll_until("one engine process per worker replica", Duration::from_secs(60), || async {
                Ok(running_workers(&bed).await? == i64::from(workers(&dgds.get(GRAPH).await?)))
            })
            .await?;
            let load = bed.status().await?["load"].clone();
            eprintln!("load: {load}");
            assert!(load["completed"].as_u64().unwrap_or(0) > 50, "{load}");
            assert_eq!(load["failed"], 0, "requests failed: {load}");
            let policy = policies.get("agg-sla").await?;
            assert_eq!(condition(&policy, "Ready").map(|c| c.0).as_deref(), Some("True"));
            operator.check_running()
        }
        .await;
        finish(operator, bed, prometheus, &dir, outcome).await
    })
    .await
}

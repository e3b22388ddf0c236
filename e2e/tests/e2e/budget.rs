//! Two PlannerPolicies sharing one GpuBudget on the local cluster, with the synthetic Dynamo
//! frontend of each graph and a real Prometheus scraping both: the `steady` graph grows above
//! its floor; the `burst` graph (higher priority) bursts and the steady one yields down to its
//! floor; the burst ends and the steady one gets its GPUs back. Every half second the two graphs
//! together must ask for no more GPUs than the budget's total, and each grant is explained in
//! both statuses and by Events (`GrantCut`, `GrantRestored`).
//!
//! The burst graph is disaggregated; the steady one is disaggregated too, or aggregated (one
//! `type: worker` pool that prefills and decodes, charged to the budget once).
//!
//! - Full mode: this operator renders the DGDs; each frontend serves with the Ready pods of its
//!   graph.
//! - Planner only (`--dgd-controller=false`), beside NVIDIA's operator: the test plays NVIDIA's
//!   operator (it writes the graphs' `Ready` status; nothing renders pods), and each frontend
//!   serves with a fixed pool large enough that latency never holds the planner back, so each
//!   graph's request follows its arrivals.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use e2e::{Result, TestNamespace, in_namespace, install_crds, poll_until};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use planner_api::{DynamoGraphDeployment, GpuBudget, PlannerPolicy};
use serde_json::{Value, json};

use crate::{
    aggregated::graph_named as aggregated_graph,
    closed_loop::{Frontend, post, start_synthetic_frontend},
    dgd::{graph_value as graph, replicas},
    operator::start,
    prometheus::{Job, Prometheus},
};

const INTERVAL_S: u64 = 10;
/// GPUs shared, one per replica: the two floors (1 + 1 each, or 1 for an aggregated steady
/// graph) and the steady graph's most (3 + 3, or 3, its `maxReplicas`) fit; the burst's most
/// (8 + 8) does not.
const TOTAL_GPUS: i64 = 10;

/// The shape of the steady graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Steady {
    /// Prefill and decode pools (the disaggregated sample).
    Disaggregated,
    /// One aggregated worker pool (the aggregated sample), its one pool charged once.
    Aggregated,
}

impl Steady {
    fn graph(self) -> Result<Value> {
        match self {
            Self::Disaggregated => graph("steady"),
            Self::Aggregated => aggregated_graph("steady"),
        }
    }

    /// GPUs of its floor: `minReplicas` (1) of each pool, one GPU a replica.
    fn floor_gpus(self) -> i32 {
        match self {
            Self::Disaggregated => 2,
            Self::Aggregated => 1,
        }
    }
}

/// GPUs a graph asks for: each component's replicas (1 when unset) times the `nvidia.com/gpu`
/// limits of its pod (the frontend has none).
fn gpus(dgd: &DynamoGraphDeployment) -> i32 {
    dgd.spec
        .components
        .iter()
        .map(|component| {
            let per_replica: i32 = component
                .pod_template
                .as_ref()
                .and_then(|t| t.spec.as_ref())
                .map_or(0, |spec| {
                    spec.containers
                        .iter()
                        .filter_map(|c| {
                            c.resources
                                .as_ref()?
                                .limits
                                .as_ref()?
                                .get("nvidia.com/gpu")?
                                .0
                                .parse::<i32>()
                                .ok()
                        })
                        .sum()
                });
            component.replicas.unwrap_or(1) * per_replica
        })
        .sum()
}
const WAIT: Duration = Duration::from_secs(240);

fn budget(name: &str, namespace: &str) -> Result<GpuBudget> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "planner.dynamo.io/v1alpha1",
        "kind": "GpuBudget",
        "metadata": {"name": name},
        "spec": {
            "totalGpus": TOTAL_GPUS,
            "members": [
                {"namespace": namespace, "policy": "burst", "priority": 10},
                {"namespace": namespace, "policy": "steady", "priority": 0}
            ]
        }
    }))?)
}

fn policy(name: &str, max_replicas: i32, budget: &str, prometheus: &str) -> Result<PlannerPolicy> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "planner.dynamo.io/v1alpha1",
        "kind": "PlannerPolicy",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"name": name},
            "adjustmentInterval": format!("{INTERVAL_S}s"),
            "sla": {"ttftMs": 200, "itlMs": 10},
            "behavior": {"scaleDownStabilization": "30s"},
            "bounds": {"minReplicas": 1, "maxReplicas": max_replicas, "maxGpuBudget": -1},
            "predictor": {"type": "constant"},
            "profile": {"builtin": "h200-llama3.1-8b-tp1"},
            "metrics": {"prometheus": {"url": prometheus}, "modelName": "llama-3.1-8b"},
            "budgetRef": {"name": budget}
        }
    }))?)
}

fn grant(policy: &PlannerPolicy) -> Option<(String, i64, String)> {
    let b = policy.status.as_ref()?.budget.as_ref()?;
    Some((b.reason.clone(), b.granted_gpus, b.message.clone()))
}

/// Notes of the Events with `reason` about `object`.
async fn notes(ns: &TestNamespace, object: &str, reason: &str) -> Result<Vec<String>> {
    Ok(ns
        .events()
        .await?
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object))
        .filter_map(|e| e.note)
        .collect())
}

/// Writes a graph's `Ready` status as NVIDIA's operator would (planner-only mode).
async fn nvidia_ready(ns: &TestNamespace, name: &str) -> Result<()> {
    let dgds: Api<DynamoGraphDeployment> = ns.api();
    let status = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "AllComponentsReady", "message": "ready",
        "lastTransitionTime": "2026-01-01T00:00:00Z"
    }]}});
    let params = PatchParams {
        field_manager: Some("dynamo-operator-e2e".into()),
        ..PatchParams::default()
    };
    dgds.patch_status(name, &params, &Patch::Merge(&status)).await?;
    Ok(())
}

/// Samples both graphs' replicas every half second until stopped; records the most GPUs they
/// asked for together (one GPU per replica).
struct Watch {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    fn start(dgds: Api<DynamoGraphDeployment>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let task = {
            let (stop, peak) = (Arc::clone(&stop), Arc::clone(&peak));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    // One list: both graphs at the same resourceVersion.
                    if let Ok(list) = dgds.list(&ListParams::default()).await {
                        let gpus: i32 = list.items.iter().map(gpus).sum();
                        peak.fetch_max(u64::try_from(gpus).unwrap_or(0), Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            })
        };
        Self { stop, peak, task }
    }

    async fn peak(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.peak.load(Ordering::Relaxed)
    }
}

async fn scenario(ns: &TestNamespace, steady: Steady, planner_only: bool) -> Result<()> {
    install_crds(&ns.client).await?;
    let budgets: Api<GpuBudget> = Api::all(ns.client.clone());
    let budget_name = format!("{}-gpus", ns.name);
    budgets
        .create(&PostParams::default(), &budget(&budget_name, &ns.name)?)
        .await?;
    let outcome = run(ns, &budget_name, steady, planner_only).await;
    let _ = budgets.delete(&budget_name, &DeleteParams::default()).await;
    outcome
}

async fn run(ns: &TestNamespace, budget_name: &str, steady: Steady, planner_only: bool) -> Result<()> {
    let dgds: Api<DynamoGraphDeployment> = ns.api();
    let policies: Api<PlannerPolicy> = ns.api();
    let budgets: Api<GpuBudget> = Api::all(ns.client.clone());
    for (name, manifest) in [("burst", graph("burst")?), ("steady", steady.graph()?)] {
        ns.accepts(&manifest).await?;
        if planner_only {
            nvidia_ready(ns, name).await?;
        }
    }
    // Each graph's frontend: the burst one at the trace's rate, the steady one at four times it.
    let frontend = |name: &str, aggregated: bool| -> Result<Frontend> {
        let mut args: Vec<String> = if planner_only {
            ["--prefill", "8", "--decode", "8"].map(String::from).to_vec()
        } else {
            ["--dgd", name, "--namespace", &ns.name]
                .map(String::from)
                .to_vec()
        };
        if aggregated {
            args.push("--aggregated".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        start_synthetic_frontend(&args)
    };
    let burst_frontend = frontend("burst", false)?;
    let steady_frontend = frontend("steady", steady == Steady::Aggregated)?;
    let (burst_ns, steady_ns) = (format!("{}-burst", ns.name), format!("{}-steady", ns.name));
    let job = |name: &str, frontend: &Frontend, dynamo_namespace: &str| Job {
        name: format!("{name}-frontend"),
        targets: vec![frontend.control.clone()],
        path: "/metrics",
        labels: vec![("dynamo_namespace".into(), dynamo_namespace.into())],
    };
    let mut jobs = vec![
        job("burst", &burst_frontend, &burst_ns),
        job("steady", &steady_frontend, &steady_ns),
    ];
    if steady == Steady::Aggregated {
        // Its aggregated engines' KV gauges, as the chart's PodMonitors scrape `type: worker`
        // pods.
        jobs.push(Job {
            name: "steady-worker".into(),
            targets: vec![steady_frontend.control.clone()],
            path: "/engine/metrics",
            labels: vec![
                ("dynamo_namespace".into(), steady_ns.clone()),
                ("dynamo_component_type".into(), "worker".into()),
            ],
        });
    }
    let prometheus = Prometheus::start_jobs(&jobs, 1).await?;
    let floor = steady.floor_gpus();
    let mut flags = vec!["--webhook-disabled"];
    if planner_only {
        flags.push("--dgd-controller=false");
    }
    let operator = start(ns, &flags).await?;
    let watch = Watch::start(dgds.clone());
    poll_until("the steady frontend to serve", WAIT, || async {
        Ok(post(&steady_frontend.control, "/control/rate-scale/4")
            .await
            .is_ok())
    })
    .await?;
    let outcome = async {
        for (name, max) in [("burst", 8), ("steady", 3)] {
            policies
                .create(
                    &PostParams::default(),
                    &policy(name, max, budget_name, &prometheus.url)?,
                )
                .await?;
        }
        // 1. The steady graph grows above its floor, granted all it asks for.
        poll_until("the steady graph to grow above its floor", WAIT, || async {
            let grown = gpus(&dgds.get("steady").await?) > floor;
            let policy = policies.get("steady").await?;
            Ok(grown && grant(&policy).is_some_and(|(reason, _, _)| reason == "Full"))
        })
        .await?;
        eprintln!(
            "steady at {} GPUs, burst at {:?}",
            gpus(&dgds.get("steady").await?),
            replicas(&dgds.get("burst").await?)
        );
        // The budget charges the steady graph the GPUs its pools ask for (an aggregated graph's
        // one pool once), its floor included.
        poll_until(
            "the budget to charge the steady graph what it holds",
            WAIT,
            || async {
                let held = i64::from(gpus(&dgds.get("steady").await?));
                let status = budgets.get(budget_name).await?.status;
                let row = status.and_then(|s| s.members.into_iter().find(|m| m.name == "steady"));
                Ok(row.is_some_and(|r| r.held_gpus == held && r.floor_gpus == i64::from(floor)))
            },
        )
        .await?;

        // 2. The burst: forty times the traffic on the higher-priority graph. The steady graph
        // yields down to its floor and the burst takes the rest.
        post(&burst_frontend.control, "/control/rate-scale/40").await?;
        poll_until("the steady graph to yield to its floor", WAIT, || async {
            let steady = gpus(&dgds.get("steady").await?);
            let burst = replicas(&dgds.get("burst").await?);
            Ok(steady == floor && burst.0 + burst.1 > 2)
        })
        .await?;
        let peak_burst = replicas(&dgds.get("burst").await?);
        eprintln!("burst at {peak_burst:?}, steady at its floor");
        poll_until("the cut in the steady policy's status", WAIT, || async {
            Ok(grant(&policies.get("steady").await?).is_some_and(|(reason, _, _)| reason == "Cut"))
        })
        .await?;
        let (reason, granted, message) = grant(&policies.get("steady").await?).ok_or("no grant")?;
        eprintln!("steady: {reason}, {granted} GPUs: {message}");
        assert_eq!(granted, i64::from(floor), "the steady graph's floor, {steady:?}");
        let limited = policies.get("steady").await?;
        let limited = crate::faults::condition(&limited, "ScalingLimited").ok_or("no ScalingLimited")?;
        assert_eq!(limited.0, "True", "{limited:?}");
        assert!(
            message.contains(&format!("{}/burst (priority 10", ns.name)),
            "the cut names who took the GPUs: {message}"
        );
        let cuts = notes(ns, "steady", "GrantCut").await?;
        assert!(
            cuts.iter().any(|n| n.contains(&format!("budget {budget_name}:"))),
            "no GrantCut Event on the steady policy: {cuts:?}"
        );
        // The budget's side says the same.
        let status = budgets.get(budget_name).await?.status.ok_or("no budget status")?;
        eprintln!("budget: {status:?}");
        assert_eq!(status.member_count, 2);
        assert!(status.held_gpus <= TOTAL_GPUS, "{status:?}");
        let steady_row = status
            .members
            .iter()
            .find(|m| m.name == "steady")
            .ok_or("steady not in the budget's status")?;
        assert_eq!(steady_row.reason, "Cut");
        assert_eq!(status.members[0].name, "burst", "the higher priority first");

        // 3. The burst ends: the steady graph gets its GPUs back.
        post(&burst_frontend.control, "/control/rate-scale/0").await?;
        poll_until("the steady graph to get its GPUs back", WAIT, || async {
            let grown = gpus(&dgds.get("steady").await?) > floor;
            let policy = policies.get("steady").await?;
            Ok(grown && grant(&policy).is_some_and(|(reason, _, _)| reason == "Full"))
        })
        .await?;
        eprintln!(
            "steady back at {} GPUs, burst at {:?}",
            gpus(&dgds.get("steady").await?),
            replicas(&dgds.get("burst").await?)
        );
        let restored = notes(ns, "steady", "GrantRestored").await?;
        assert!(
            !restored.is_empty(),
            "no GrantRestored Event on the steady policy"
        );
        let scaled = notes(ns, "steady", "Scaled").await?;
        assert!(
            scaled
                .iter()
                .any(|n| n.contains(&format!("budget {budget_name}: granted"))),
            "no Scaled Event saying the budget cut it: {scaled:?}"
        );
        operator.check_running()
    }
    .await;
    let peak = watch.peak().await;
    let stopped = operator.stop().await;
    drop((burst_frontend, steady_frontend, prometheus));
    outcome?;
    stopped?;
    eprintln!("the two graphs asked for at most {peak} GPUs together");
    assert!(
        peak <= u64::try_from(TOTAL_GPUS).unwrap_or(0),
        "the graphs asked for {peak} GPUs, over the budget of {TOTAL_GPUS}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_takes_the_shared_budget_and_gives_it_back() -> Result<()> {
    in_namespace("budget", |ns| async move {
        scenario(&ns, Steady::Disaggregated, false).await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_takes_the_shared_budget_and_gives_it_back_beside_nvidias_operator() -> Result<()> {
    in_namespace("budget-planner-only", |ns| async move {
        scenario(&ns, Steady::Disaggregated, true).await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_takes_the_shared_budget_from_an_aggregated_graph_and_gives_it_back() -> Result<()> {
    in_namespace("budget-agg", |ns| async move {
        scenario(&ns, Steady::Aggregated, false).await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_takes_the_shared_budget_from_an_aggregated_graph_beside_nvidias_operator() -> Result<()> {
    in_namespace("budget-agg-planner-only", |ns| async move {
        scenario(&ns, Steady::Aggregated, true).await
    })
    .await
}

//! The planning loop driven by the operator and by the simulator must decide the same: one
//! load sequence, shown to the operator's driver through its real observe stage (its PromQL
//! against a Prometheus stubbed at the HTTP level) and its real actuate stage (its patch of the
//! DGD against an API server stubbed at the HTTP level), and to the simulator's driver through
//! the replay's frontend windows, gives the same decision at every wake. A guard, gate or
//! cadence rule added to one driver only makes them differ.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::float_cmp)] // test code

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::Uri,
    routing::{get, patch},
};
use serde_json::{Value, json};

use planner_api::PlannerPolicy;
use planner_core::{
    interpolation::PerformanceModel,
    policy::{Decision, MetricsState, PolicyLoop, Replicas},
    profile::Profile,
};
use planner_operator::{
    controller::planner_policy::{
        Reads, Woken, actuate,
        actuate::{KubernetesConnector, ScaleRequest, is_ready},
        config,
        observe::{FastCache, MetricsQuery},
        wake,
    },
    metrics::operator::OperatorMetrics,
    sources::prometheus::PrometheusClient,
    target::TargetGraph,
    validation::{self, Tenancy},
};
use planner_sim_engine::{
    latency::{Cluster, EngineSpec, LatencyModel},
    metrics::{Histogram, ISL_BOUNDS},
    observe::{Counts, Frontend, Gauges},
    policy::LoopPolicy,
    run::{Policy, SimConfig, View},
};

const NS: &str = "llm";
const GRAPH: &str = "llama";
const DYNAMO_NS: &str = "llm-llama";
const MODEL: &str = "llama-3.1-8b";
const SLOT_S: u64 = 10;
const DELAY: Duration = Duration::from_secs(60);

/// What the graph's frontend counted in one 10 s slot, and its gauges at the slot's end.
#[derive(Clone, Debug, Default)]
struct Slot {
    arrivals: f64,
    completed: f64,
    osl_sum: f64,
    /// Prompt lengths of the first tokens.
    isl: Vec<f64>,
    ttft_sum_s: f64,
    itl_count: f64,
    itl_sum_s: f64,
    inflight: f64,
    queued: f64,
}

/// A load that rises to an overload, stays, and falls back to a trickle: requests/s per minute.
const RATES: [f64; 14] = [
    2.0, 2.0, 10.0, 40.0, 40.0, 40.0, 40.0, 10.0, 10.0, 2.0, 0.5, 0.5, 2.0, 2.0,
];

fn slots() -> Vec<Slot> {
    let mut slots = Vec::new();
    for (minute, rate) in RATES.iter().enumerate() {
        for k in 0..(60 / SLOT_S) {
            let n = rate * SLOT_S as f64;
            let overloaded = *rate > 20.0;
            let first = (n.round() as usize).max(1);
            slots.push(Slot {
                arrivals: n,
                completed: if overloaded { n * 0.6 } else { n },
                osl_sum: n * 300.0,
                isl: (0..first)
                    .map(|i| 2000.0 + 500.0 * ((i + minute + k as usize) % 5) as f64)
                    .collect(),
                ttft_sum_s: first as f64 * if overloaded { 2.5 } else { 0.2 },
                itl_count: n * 299.0,
                itl_sum_s: n * 299.0 * 0.02,
                inflight: rate * 6.0,
                queued: if overloaded { rate * 4.0 } else { 0.0 },
            });
        }
    }
    slots
}

/// The stub Prometheus: the slots up to now, answered as Prometheus answers the operator's
/// queries (an increase over `[Ns]` sums the last N/10 slots; gauges are the last slot's).
#[derive(Default)]
struct Stub {
    slots: Vec<Slot>,
}

impl Stub {
    fn window(&self, query: &str) -> &[Slot] {
        let window = query
            .split('[')
            .nth(1)
            .and_then(|rest| rest.split("s]").next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(SLOT_S);
        let n = usize::try_from(window / SLOT_S).unwrap().max(1);
        &self.slots[self.slots.len().saturating_sub(n)..]
    }

    /// The samples answering `query`.
    fn answer(&self, query: &str) -> Vec<(Value, f64)> {
        let labels = json!({"dynamo_namespace": DYNAMO_NS, "model": MODEL});
        let one = |value: f64| vec![(labels.clone(), value)];
        let sum = |f: &dyn Fn(&Slot) -> f64| self.window(query).iter().map(f).sum::<f64>();
        let last = self.slots.last().cloned().unwrap_or_default();
        if query.contains("_model_.+") {
            // The frontend serves the model from the start.
            return one(1.0);
        }
        if self.slots.is_empty() {
            // No request series before the first request.
            return Vec::new();
        }
        if query.contains("histogram_quantile") {
            Vec::new()
        } else if query.contains("input_sequence_tokens_bucket") {
            let mut histogram = Histogram::new(&ISL_BOUNDS);
            for isl in self.window(query).iter().flat_map(|s| &s.isl) {
                histogram.observe(*isl);
            }
            ISL_BOUNDS
                .iter()
                .zip(histogram.cumulative())
                .map(|(le, count)| {
                    let le = if le.is_infinite() {
                        "+Inf".into()
                    } else {
                        format!("{le}")
                    };
                    (json!({"model": MODEL, "le": le}), count)
                })
                .collect()
        } else if query.contains("_bucket") || query.contains("request_duration_seconds") {
            Vec::new()
        } else if query.contains("time_to_first_token_seconds_sum") {
            one(sum(&|s| s.ttft_sum_s) / sum(&|s| s.isl.len() as f64))
        } else if query.contains("inter_token_latency_seconds_sum") {
            one(sum(&|s| s.itl_sum_s) / sum(&|s| s.itl_count))
        } else if query.contains("input_sequence_tokens_sum") {
            one(sum(&|s| s.isl.iter().sum()) / sum(&|s| s.isl.len() as f64))
        } else if query.contains("output_sequence_tokens_sum") {
            one(sum(&|s| s.osl_sum) / sum(&|s| s.completed))
        } else if query.contains("requests_started_total") {
            one(sum(&|s| s.arrivals))
        } else if query.contains("requests_total") {
            one(sum(&|s| s.completed))
        } else if query.contains("active_requests") {
            one(last.inflight)
        } else if query.contains("stage_requests") {
            one(last.queued)
        } else {
            // Queued requests of old frontends, KV usage: not exported by this graph.
            Vec::new()
        }
    }
}

async fn prometheus(State(stub): State<Arc<Mutex<Stub>>>, uri: Uri) -> String {
    let query = form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "query")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let result: Vec<Value> = stub
        .lock()
        .unwrap()
        .answer(&query)
        .into_iter()
        .map(|(metric, value)| json!({"metric": metric, "value": [0, format!("{value}")]}))
        .collect();
    json!({"status": "success", "data": {"resultType": "vector", "result": result}}).to_string()
}

/// The stub API server: records the patches of the DGD and answers with the object.
async fn api_server(State(patches): State<Arc<Mutex<Vec<Value>>>>, body: Bytes) -> String {
    patches
        .lock()
        .unwrap()
        .push(serde_json::from_slice(&body).unwrap());
    json!({
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": GRAPH, "namespace": NS}
    })
    .to_string()
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// The policy both drivers plan with: the default queueing model, a fast path, step limits.
fn policy() -> PlannerPolicy {
    serde_yaml::from_str(&format!(
        r"
apiVersion: planner.dynamo.io/v1alpha1
kind: PlannerPolicy
metadata: {{name: parity, namespace: {NS}}}
spec:
  targetRef: {{name: {GRAPH}}}
  adjustmentInterval: 60s
  sla: {{ttftMs: 500, itlMs: 50}}
  profile: {{builtin: h200-llama3.1-8b-tp1}}
  predictor: {{kind: arima}}
  bounds: {{minReplicas: 1, maxReplicas: 12, maxScaleUpStep: 2}}
  behavior: {{expectedScaleUpDelay: 60s, scaleDownStabilization: 120s}}
"
    ))
    .unwrap()
}

/// The target DGD as the operator reads it, `asked` replicas, `serving` of them available.
fn graph(asked: (u32, u32), serving: (u32, u32)) -> TargetGraph {
    let component = |name: &str, kind: &str, replicas: u32| {
        json!({
            "name": name, "type": kind, "replicas": replicas,
            "podTemplate": {"spec": {"containers": [{
                "name": "main", "image": "vllm",
                "args": ["--served-model-name", MODEL],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}
            }]}}
        })
    };
    let counts = |asked: u32, serving: u32| json!({"replicas": asked, "readyReplicas": serving, "availableReplicas": serving, "updatedReplicas": asked});
    let ready = serving.0 >= asked.0 && serving.1 >= asked.1;
    TargetGraph::from_value(&json!({
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": GRAPH, "namespace": NS, "generation": 1},
        "spec": {"components": [component("prefill", "prefill", asked.0), component("decode", "decode", asked.1)]},
        "status": {
            "observedGeneration": 1,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "components": {"prefill": counts(asked.0, serving.0), "decode": counts(asked.1, serving.1)}
        }
    }))
    .unwrap()
}

/// A graph's replicas: asked for, and scale-ups serving `DELAY` after they were asked for.
#[derive(Clone, Debug)]
struct World {
    asked: (u32, u32),
    /// (serving from, replicas asked then), per pool.
    pending: Vec<(Duration, (u32, u32))>,
    serving: (u32, u32),
}

impl World {
    fn new() -> Self {
        Self {
            asked: (1, 1),
            pending: Vec::new(),
            serving: (1, 1),
        }
    }

    fn at(&mut self, now: Duration) -> Replicas {
        let (due, later): (Vec<_>, Vec<_>) = self.pending.iter().partition(|(at, _)| *at <= now);
        for (_, asked) in due {
            self.serving = (self.serving.0.max(asked.0), self.serving.1.max(asked.1));
        }
        self.pending = later;
        self.serving = (self.serving.0.min(self.asked.0), self.serving.1.min(self.asked.1));
        Replicas {
            serving: self.serving,
            asked: self.asked,
        }
    }

    fn set(&mut self, now: Duration, to: (u32, u32)) {
        self.asked = to;
        self.pending.push((now + DELAY, to));
        self.serving = (self.serving.0.min(to.0), self.serving.1.min(to.1));
    }
}

/// The replicas a JSON patch of the DGD sets.
fn patched(patch: &Value, before: (u32, u32)) -> (u32, u32) {
    let mut replicas = before;
    for operation in patch.as_array().unwrap() {
        let path = operation["path"].as_str().unwrap();
        let value = operation["value"].as_u64();
        match (path, value) {
            ("/spec/components/0/replicas", Some(v)) => replicas.0 = u32::try_from(v).unwrap(),
            ("/spec/components/1/replicas", Some(v)) => replicas.1 = u32::try_from(v).unwrap(),
            _ => {}
        }
    }
    replicas
}

/// What both drivers' decisions must agree on: the check, what it decided and set, what limited
/// it, the state of the metrics and the message (except where the message quotes what the
/// driver's metrics source said of a graph before its first request).
type Essence = (
    &'static str,
    Option<(u32, u32)>,
    Option<(u32, u32)>,
    Option<&'static str>,
    Option<&'static str>,
    Option<String>,
);

fn essence(decision: &Decision) -> Essence {
    let awaiting = matches!(decision.metrics, Some(MetricsState::AwaitingTraffic { .. }));
    (
        decision.check.as_str(),
        decision.target,
        decision.scale_to,
        decision.limitation.as_ref().map(|l| l.reason.as_str()),
        decision.metrics.as_ref().map(MetricsState::reason),
        (!awaiting).then(|| decision.message.clone()),
    )
}

#[tokio::test]
async fn the_operators_driver_and_the_simulators_decide_the_same_at_every_wake() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let profile = Profile::builtin("h200-llama3.1-8b-tp1").unwrap();
    let curves = PerformanceModel::new(&profile).unwrap();
    let latency = LatencyModel::new(&curves, EngineSpec::from_profile(&profile));
    let policy = policy();
    let validated = validation::validate(
        &policy.spec,
        NS,
        Some(&graph((1, 1), (1, 1))),
        &Tenancy::default(),
    )
    .unwrap();
    let new_loop = || {
        PolicyLoop::new(
            planner_core::policy::Planner::sla(config::sla_config(&policy.spec, &validated)),
            config::loop_settings(&policy.spec, &validated, None),
        )
    };

    // The operator's side: its loop, its Prometheus and API server stubbed over HTTP.
    let stub = Arc::new(Mutex::new(Stub::default()));
    let prometheus_url = serve(
        Router::new()
            .fallback(get(prometheus))
            .with_state(Arc::clone(&stub)),
    )
    .await;
    let patches = Arc::new(Mutex::new(Vec::new()));
    let api_url = serve(
        Router::new()
            .route(
                &format!("/apis/nvidia.com/v1beta1/namespaces/{NS}/dynamographdeployments/{GRAPH}"),
                patch(api_server),
            )
            .with_state(Arc::clone(&patches)),
    )
    .await;
    let client = PrometheusClient::new(&prometheus_url, Duration::from_secs(5)).unwrap();
    let kube = kube::Client::try_from(kube::Config::new(api_url.parse().unwrap())).unwrap();
    let metrics = OperatorMetrics::new();
    let mut operator = new_loop();
    let mut operator_world = World::new();

    // The simulator's side: the replay's policy on the same loop, reading frontend windows.
    let mut simulator = LoopPolicy::new("parity", new_loop());
    let mut simulator_world = World::new();
    let mut frontend = Frontend::new(false);
    let sim = SimConfig::default();

    let slots = slots();
    let mut decided = 0;
    let mut scaled = 0;
    let mut limited = 0;
    for k in 0..=slots.len() {
        let now = Duration::from_secs(k as u64 * SLOT_S);
        if k > 0 {
            let slot = &slots[k - 1];
            stub.lock().unwrap().slots.push(slot.clone());
            frontend.add(&Counts {
                arrivals: slot.arrivals,
                arrival_isl: &slot.isl,
                completed: slot.completed,
                osl_sum: slot.osl_sum,
                ttft_count: slot.isl.len() as f64,
                ttft_sum_s: slot.ttft_sum_s,
                itl_count: slot.itl_count,
                itl_sum_s: slot.itl_sum_s,
            });
            frontend.mark(now.as_secs_f64());
        }
        let gauges = slots
            .get(k.wrapping_sub(1))
            .map_or(Gauges::default(), |s| Gauges {
                inflight: s.inflight,
                queued: s.queued,
            });

        // The operator's driver.
        let replicas = operator_world.at(now);
        let target = graph(replicas.asked, replicas.serving);
        let ready = Some(is_ready(&target, ("prefill", "decode"), &Default::default()));
        // Shared snapshots are reused for half a period of the process's clock: a cache of its
        // own each wake, as wakes 10 s apart would have.
        let fast = FastCache::default();
        let reads = Reads {
            query: MetricsQuery {
                client: Ok(&client),
                dynamo_namespace: DYNAMO_NS,
                model: MODEL,
                interval: validated.interval,
                pulling_interval: validated.pulling_interval,
                now_unix_s: now.as_secs_f64(),
                ttft_quantile: 0.9,
                prefill_engines: replicas.serving.0,
            },
            fast: &fast,
            fast_period: validated.fast_check_period,
            metrics: metrics.policies.of("llm", "parity"),
        };
        let woken = wake(
            &mut operator,
            Some(&curves),
            (now, replicas, ready),
            &reads,
            false,
            |_| None,
        )
        .await;
        let operator_decision = woken.map(|Woken { decision, .. }| decision);
        if let Some(to) = operator_decision.as_ref().and_then(|d| d.scale_to) {
            let request = ScaleRequest {
                target: to,
                components: ("prefill", "decode"),
                graph: &target,
            };
            let mut connector = KubernetesConnector {
                client: kube.clone(),
                adapters: Default::default(),
            };
            let actuated = actuate(&mut operator, &mut connector, &request, now, replicas.asked).await;
            assert_eq!(actuated.from, Some(replicas.asked), "at {now:?}: {actuated:?}");
            let patch = patches.lock().unwrap().last().cloned().unwrap();
            operator_world.set(now, patched(&patch, replicas.asked));
            scaled += 1;
        }

        // The simulator's driver.
        let replicas = simulator_world.at(now);
        let cluster = Cluster::new(now.as_secs_f64(), replicas.serving.0, replicas.serving.1);
        let mut view = View {
            now_s: now.as_secs_f64(),
            asked: replicas.asked,
            serving: replicas.serving,
            gauges,
            frontend: &mut frontend,
            upcoming: &[],
            first_upcoming: 0,
            cluster: &cluster,
            model: &latency,
            config: &sim,
        };
        let due = Policy::<PerformanceModel>::next_wake_s(&simulator) <= now.as_secs_f64() + 1e-6;
        let target = due.then(|| simulator.wake(&mut view)).flatten();
        let simulator_decision = (due && Policy::<PerformanceModel>::last_check(&simulator).is_some())
            .then(|| Policy::<PerformanceModel>::last_decision(&simulator).cloned())
            .flatten()
            .filter(|d| d.check.as_str() == "interval" || d.target.is_some());
        if let Some(to) = target.filter(|to| *to != replicas.asked) {
            Policy::<PerformanceModel>::applied(
                &mut simulator,
                now.as_secs_f64(),
                replicas.asked,
                to,
                replicas.serving,
            );
            simulator_world.set(now, to);
        }

        assert_eq!(
            operator_decision.as_ref().map(essence),
            simulator_decision.as_ref().map(essence),
            "the drivers decided differently at {now:?}"
        );
        if let Some(decision) = &operator_decision {
            decided += 1;
            limited += usize::from(decision.limitation.as_ref().is_some_and(|l| l.limited()));
        }
        assert_eq!(operator_world.asked, simulator_world.asked, "at {now:?}");
    }
    // The sequence exercised what it is meant to: intervals and fast checks that scaled, and a
    // guard that limited a decision.
    assert!(decided >= RATES.len(), "{decided} decisions");
    assert!(scaled >= 3, "{scaled} scalings");
    assert!(limited >= 1, "no decision was limited");
    assert!(operator_world.asked.0 > 1 || scaled > 0);
}

//! The PlannerPolicy reconciler: one operator process plans every policy in the cluster. Each
//! reconcile resolves the target DGD and its pools, loads the profile, and when an interval is
//! due reads the metrics, runs the planner core, carries the decision out through the
//! connector, and writes status, events and metrics; then it requeues for the next interval.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::{api::core::v1::ConfigMap, jiff::Timestamp};
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    core::DeserializeGuard,
    runtime::{
        Controller,
        controller::Action,
        events::{Event, EventType},
        watcher,
    },
};
use tracing::{Instrument, info, info_span, warn};

use super::{Context, FIELD_MANAGER, conditions::DesiredCondition};
use crate::{
    api::{
        ConnectorKind, CorrectionFactors, DynamoGraphDeployment, ObservedLoad, PlannerMode, PlannerPolicy,
        PlannerPolicyStatus, PoolReplicas, PredictedLoad,
    },
    connector::{kubernetes, virtual_etcd},
    controller::dgd::status::READY as DGD_READY,
    metrics::{
        policy::IntervalReport,
        prometheus::{PrometheusClient, SeriesFilter},
    },
    planner::{
        interpolation::PerformanceModel,
        load::{LoadDecision, LoadPlanner, LoadSkip},
        profile::Profile,
        state::{IntervalMetrics, SlaPlanner},
        trace,
    },
};

pub mod resolve;
pub mod status;

use status::{METRICS_AVAILABLE, Outcome, PROFILE_LOADED, TARGET_RESOLVED, finite};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "plannerpolicy";
/// Intervals of Prometheus history replayed into the predictors after a restart.
pub const HISTORY_INTERVALS: usize = 50;
/// Timeout of each Prometheus request.
const PROMETHEUS_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on one etcd exchange of the virtual connector.
const ETCD_TIMEOUT: Duration = Duration::from_secs(10);
/// Retry delay when the target or profile is not usable yet.
const RETRY: Duration = Duration::from_secs(30);
/// Planner states built at once (warm-up trace read and parsed, history restored). Each warm-up
/// holds its trace ConfigMap (up to 1 MiB) twice while it parses it: unbounded, a thousand
/// policies created together held hundreds of them at once, and the allocator kept the peak
/// (368 MiB resident afterwards, `e2e/bench/policies.sh`).
const STATE_BUILDS: usize = 4;

/// Why a reconcile failed (API errors only; problems with the spec or target are reported in
/// status and conditions, and retried on a schedule).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was attempted.
        action: String,
        /// The API error.
        source: kube::Error,
    },
}

impl Error {
    /// A bounded category for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "kube_api",
        }
    }
}

enum PlannerState {
    Sla(Box<SlaPlanner>),
    Load(LoadPlanner),
}

struct PolicyRuntime {
    fingerprint: String,
    planner: PlannerState,
    next_tick: Option<Instant>,
    virtual_connector: Option<virtual_etcd::VirtualConnector>,
}

/// Planner state of each policy, keyed by namespace and name; each behind its own lock so
/// policies plan concurrently.
type Runtimes = HashMap<(String, String), Arc<tokio::sync::Mutex<PolicyRuntime>>>;

/// State shared by every PlannerPolicy reconcile.
pub struct PlannerContext {
    /// Client, recorder and metrics.
    pub base: Arc<Context>,
    /// Prometheus used when a policy names none.
    pub default_prometheus_url: String,
    runtimes: Mutex<Runtimes>,
    models: Mutex<HashMap<String, Arc<PerformanceModel>>>,
    prometheus: Mutex<HashMap<String, PrometheusClient>>,
    state_builds: tokio::sync::Semaphore,
}

impl PlannerContext {
    /// A context with empty caches.
    pub fn new(base: Arc<Context>, default_prometheus_url: String) -> Self {
        Self {
            base,
            default_prometheus_url,
            runtimes: Mutex::default(),
            models: Mutex::default(),
            prometheus: Mutex::default(),
            state_builds: tokio::sync::Semaphore::new(STATE_BUILDS),
        }
    }

    fn prometheus(&self, url: &str) -> Result<PrometheusClient, String> {
        let mut clients = self
            .prometheus
            .lock()
            .map_err(|_| "internal lock poisoned".to_string())?;
        if let Some(client) = clients.get(url) {
            return Ok(client.clone());
        }
        let client = PrometheusClient::new(url, PROMETHEUS_TIMEOUT).map_err(|e| e.to_string())?;
        clients.insert(url.to_string(), client.clone());
        Ok(client)
    }

    /// Forgets a deleted policy: its planner state and its metric series.
    fn forget(&self, namespace: &str, name: &str) {
        if let Ok(mut runtimes) = self.runtimes.lock() {
            runtimes.remove(&(namespace.to_string(), name.to_string()));
        }
        self.base.metrics.policies.remove(namespace, name);
    }
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<PlannerContext>,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.base.client.clone();
    let policies: Api<DeserializeGuard<PlannerPolicy>> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let controller = Controller::new(policies, watcher::Config::default().any_semantic());
    let store = controller.store();
    // Remove the metric series and state of deleted policies.
    let pruner = {
        let ctx = Arc::clone(&ctx);
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            loop {
                tick.tick().await;
                let live: Vec<(String, String)> = store
                    .state()
                    .iter()
                    .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
                    .collect();
                let known: Vec<(String, String)> = ctx
                    .runtimes
                    .lock()
                    .map(|r| r.keys().cloned().collect())
                    .unwrap_or_default();
                for (namespace, name) in known.into_iter().filter(|k| !live.contains(k)) {
                    info!(%namespace, %name, "PlannerPolicy deleted; dropping its state and metrics");
                    ctx.forget(&namespace, &name);
                }
            }
        }
    };
    let controller = controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "plannerpolicy controller event");
            }
        });
    tokio::select! {
        () = controller => {},
        () = pruner => {},
    }
}

async fn reconcile(
    guard: Arc<DeserializeGuard<PlannerPolicy>>,
    ctx: Arc<PlannerContext>,
) -> Result<Action, Error> {
    let (namespace, name) = match &guard.0 {
        Ok(p) => (p.namespace().unwrap_or_default(), p.name_any()),
        Err(invalid) => (
            invalid.metadata.namespace.clone().unwrap_or_default(),
            invalid.metadata.name.clone().unwrap_or_default(),
        ),
    };
    let span = info_span!("reconcile", controller = CONTROLLER, namespace = %namespace, name = %name);
    async move {
        let _timer = ctx.base.metrics.reconcile_started(CONTROLLER);
        let policy = match &guard.0 {
            Ok(policy) => policy,
            Err(invalid) => {
                warn!(error = %invalid.error, "PlannerPolicy cannot be parsed; skipping it");
                ctx.base.metrics.invalid_object(CONTROLLER);
                return Ok(Action::await_change());
            }
        };
        let result = reconcile_policy(policy, &ctx).await;
        ctx.base
            .metrics
            .reconcile_finished(CONTROLLER, result.as_ref().err().map(Error::kind));
        result
    }
    .instrument(span)
    .await
}

fn error_policy(
    guard: Arc<DeserializeGuard<PlannerPolicy>>,
    error: &Error,
    _ctx: Arc<PlannerContext>,
) -> Action {
    let name = guard.0.as_ref().map(ResourceExt::name_any).unwrap_or_default();
    warn!(%name, %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(15))
}

/// What went wrong before an interval could run; reported in status, retried later.
struct Blocked {
    condition: DesiredCondition,
    event: Option<(&'static str, String)>,
}

async fn reconcile_policy(policy: &PlannerPolicy, ctx: &PlannerContext) -> Result<Action, Error> {
    let namespace = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let spec = &policy.spec;
    let client = ctx.base.client.clone();
    let dgds: Api<DynamoGraphDeployment> = Api::namespaced(client.clone(), &namespace);

    // Fetch and resolve the target.
    let dgd = match dgds.get_opt(&spec.target_ref.name).await {
        Ok(Some(dgd)) => dgd,
        Ok(None) => {
            let message = format!(
                "spec.targetRef.name: DynamoGraphDeployment {:?} does not exist in namespace {namespace}",
                spec.target_ref.name
            );
            let blocked = Blocked {
                condition: DesiredCondition::unmet(TARGET_RESOLVED, "TargetNotFound", &message),
                event: None,
            };
            return report_blocked(policy, ctx, blocked).await;
        }
        Err(source) => {
            return Err(Error::Kube {
                action: "get the target DynamoGraphDeployment".into(),
                source,
            });
        }
    };
    let resolved = resolve::pools(spec, &dgd).and_then(|pools| {
        let model = if spec.mode == PlannerMode::Load {
            String::new()
        } else {
            resolve::model_name(spec, &dgd, &pools)?
        };
        Ok((pools, model))
    });
    let (pools, model_name) = match resolved {
        Ok(resolved) => resolved,
        Err(error) => {
            let message = error.to_string();
            let blocked = Blocked {
                condition: DesiredCondition::unmet(TARGET_RESOLVED, "ComponentsUnresolved", &message),
                event: Some(("InvalidSpec", message)),
            };
            return report_blocked(policy, ctx, blocked).await;
        }
    };
    let mut outcome = Outcome::default();
    outcome.conditions.push(DesiredCondition::met(
        TARGET_RESOLVED,
        "Resolved",
        format!(
            "prefill component {:?}, decode component {:?}",
            pools.prefill, pools.decode
        ),
    ));

    // The profile (not needed by the load-based planner).
    let model = if spec.mode == PlannerMode::Load {
        None
    } else {
        match load_model(policy, ctx).await {
            Ok((model, source)) => {
                outcome.conditions.push(DesiredCondition::met(
                    PROFILE_LOADED,
                    "Loaded",
                    format!("profile {source}"),
                ));
                Some(model)
            }
            Err(message) => {
                let blocked = Blocked {
                    condition: DesiredCondition::unmet(PROFILE_LOADED, "ProfileInvalid", &message),
                    event: Some(("InvalidSpec", message)),
                };
                return report_blocked(policy, ctx, blocked).await;
            }
        }
    };

    let interval = match resolve::parse_duration("spec.adjustmentInterval", &spec.adjustment_interval) {
        Ok(interval) => interval,
        Err(error) => {
            let blocked = Blocked {
                condition: DesiredCondition::unmet(TARGET_RESOLVED, "InvalidSpec", error.to_string()),
                event: Some(("InvalidSpec", error.to_string())),
            };
            return report_blocked(policy, ctx, blocked).await;
        }
    };

    // The policy's planner state, created (and restored from Prometheus history) on first use.
    let runtime = runtime_for(policy, ctx, &pools, &model_name, interval).await;
    let mut runtime = runtime.lock().await;
    let now = Instant::now();
    if let Some(next) = runtime.next_tick
        && next > now
    {
        return Ok(Action::requeue(next - now));
    }
    if let Some(next) = runtime.next_tick {
        ctx.base.metrics.policies.lateness((now - next).as_secs_f64());
    }
    // Keep the cadence; after a long pause start over from now.
    runtime.next_tick = Some(match runtime.next_tick {
        Some(next) if now - next < interval => next + interval,
        _ => now + interval,
    });

    let current = current_replicas(&dgd, &pools);
    outcome.ticked = true;
    outcome.current = Some(PoolReplicas {
        prefill: to_i32(current.0),
        decode: to_i32(current.1),
    });
    let metrics_url = spec
        .metrics
        .prometheus
        .url
        .clone()
        .unwrap_or_else(|| ctx.default_prometheus_url.clone());
    let dynamo_namespace = resolve::metrics_namespace(policy, &dgd.name_any());
    let prometheus = ctx.prometheus(&metrics_url);
    let window_s = interval.as_secs().max(1);

    let target = match &mut runtime.planner {
        PlannerState::Sla(planner) => {
            let Ok(config) = resolve::sla_config(spec, &pools) else {
                return Ok(Action::requeue(RETRY));
            };
            let metrics = match &prometheus {
                Ok(client) => {
                    let filter = SeriesFilter {
                        dynamo_namespace: dynamo_namespace.clone(),
                        model: model_name.clone(),
                    };
                    match client.observe(&filter, window_s).await {
                        Ok(observation) => IntervalMetrics::Observed(observation),
                        Err(error) => {
                            ctx.base.metrics.policies.metrics_unavailable(error.kind());
                            IntervalMetrics::Unavailable {
                                reason: error.to_string(),
                            }
                        }
                    }
                }
                Err(error) => {
                    ctx.base.metrics.policies.metrics_unavailable("client");
                    IntervalMetrics::Unavailable {
                        reason: error.clone(),
                    }
                }
            };
            let Some(model) = &model else {
                return Ok(Action::requeue(RETRY));
            };
            let decision = planner.tick(&config, model.as_ref(), metrics, current);
            if let Some(hold) = &decision.hold {
                match hold {
                    crate::planner::state::Hold::MetricsUnavailable { reason } => {
                        outcome.conditions.push(DesiredCondition::unmet(
                            METRICS_AVAILABLE,
                            "MetricsUnavailable",
                            reason,
                        ));
                    }
                    crate::planner::state::Hold::NoTraffic => {
                        outcome.conditions.push(DesiredCondition::met(
                            METRICS_AVAILABLE,
                            "NoTraffic",
                            "no request completed in the last interval",
                        ));
                    }
                }
            } else {
                outcome.conditions.push(DesiredCondition::met(
                    METRICS_AVAILABLE,
                    "Observed",
                    format!("frontend metrics of {dynamo_namespace} from {metrics_url}"),
                ));
            }
            if let Some(observed) = &decision.observed {
                outcome.observed = Some(ObservedLoad {
                    requests: finite(observed.num_req),
                    isl: finite(observed.isl),
                    osl: finite(observed.osl),
                    ttft_ms: finite(observed.ttft_ms),
                    itl_ms: finite(observed.itl_ms),
                });
            }
            if let Some(load) = &decision.predicted {
                outcome.predicted = Some(PredictedLoad {
                    requests: finite(load.num_req),
                    isl: finite(load.isl),
                    osl: finite(load.osl),
                });
            }
            let corrections = decision.corrections;
            outcome.correction = Some(CorrectionFactors {
                prefill: finite(corrections.prefill),
                decode: finite(corrections.decode),
            });
            if decision.plan.is_some() {
                outcome
                    .conditions
                    .push(status::scaling_limited(decision.limits()));
            }
            outcome.message = decision.explanation();
            decision.target()
        }
        PlannerState::Load(planner) => {
            let config = resolve::load_config(spec, &pools);
            let pulling = resolve::parse_duration(
                "spec.load.metricPullingInterval",
                &spec.load.metric_pulling_interval,
            )
            .unwrap_or(Duration::from_secs(1));
            let samples = match &prometheus {
                Ok(client) => client
                    .load_samples(
                        &dynamo_namespace,
                        window_s as f64,
                        pulling.as_secs_f64().max(1.0),
                        unix_now(),
                    )
                    .await
                    .map_err(|e| {
                        ctx.base.metrics.policies.metrics_unavailable(e.kind());
                        e.to_string()
                    }),
                Err(error) => {
                    ctx.base.metrics.policies.metrics_unavailable("client");
                    Err(error.clone())
                }
            };
            match samples {
                Ok(samples) => {
                    let decision: LoadDecision = planner.tick(&config, current.0, current.1, &samples);
                    if decision.skipped == Some(LoadSkip::NoSamples) {
                        outcome.conditions.push(DesiredCondition::unmet(
                            METRICS_AVAILABLE,
                            "NoSamples",
                            format!(
                                "no queue or KV-cache samples for {dynamo_namespace} in the last interval"
                            ),
                        ));
                    } else {
                        outcome.conditions.push(DesiredCondition::met(
                            METRICS_AVAILABLE,
                            "Observed",
                            "load metrics sampled",
                        ));
                    }
                    outcome.message = format!(
                        "load mode: prefill {:?}, decode {:?}{}",
                        decision.prefill_reason,
                        decision.decode_reason,
                        decision
                            .skipped
                            .as_ref()
                            .map(|s| format!(" (skipped: {s:?})"))
                            .unwrap_or_default()
                    );
                    decision
                        .skipped
                        .is_none()
                        .then_some((decision.prefill, decision.decode))
                }
                Err(reason) => {
                    outcome.message = format!("keeping replicas: metrics unavailable ({reason})");
                    outcome.conditions.push(DesiredCondition::unmet(
                        METRICS_AVAILABLE,
                        "MetricsUnavailable",
                        reason,
                    ));
                    None
                }
            }
        }
    };

    // Carry the decision out.
    if let Some((prefill, decode)) = target {
        outcome.desired = Some(PoolReplicas {
            prefill: to_i32(prefill),
            decode: to_i32(decode),
        });
        let spec_replicas = (pools.prefill_replicas, pools.decode_replicas);
        if spec.mode == PlannerMode::Observe {
            outcome.message.push_str(" (observe mode: not applied)");
        } else if (prefill, decode) != spec_replicas {
            let applied = match spec.connector.kind {
                ConnectorKind::Kubernetes => {
                    if !is_ready(&dgd) {
                        outcome.message.push_str("; target not Ready, scaling deferred");
                        false
                    } else {
                        let targets = [(pools.prefill.as_str(), prefill), (pools.decode.as_str(), decode)];
                        match kubernetes::set_replicas(&dgds, &dgd, &targets).await {
                            Ok(changed) => changed,
                            Err(error) => {
                                warn!(%error, "cannot scale the target");
                                outcome.message.push_str(&format!("; scaling failed: {error}"));
                                false
                            }
                        }
                    }
                }
                ConnectorKind::Virtual => {
                    let connector = match runtime.virtual_connector.take() {
                        Some(connector) => Ok(connector),
                        // Bounded, so an unreachable etcd cannot hold the reconcile (or shutdown).
                        None => tokio::time::timeout(
                            ETCD_TIMEOUT,
                            virtual_etcd::VirtualConnector::connect(spec, &dynamo_namespace),
                        )
                        .await
                        .unwrap_or_else(|_| Err(virtual_etcd::VirtualError::Timeout(ETCD_TIMEOUT))),
                    };
                    match connector {
                        Ok(mut connector) => {
                            let published =
                                tokio::time::timeout(ETCD_TIMEOUT, connector.publish(prefill, decode))
                                    .await
                                    .unwrap_or_else(|_| {
                                        Err(virtual_etcd::VirtualError::Timeout(ETCD_TIMEOUT))
                                    });
                            let result = match published {
                                Ok(virtual_etcd::Published::Decision(id)) => {
                                    outcome.decision_id = Some(id);
                                    true
                                }
                                Ok(virtual_etcd::Published::Waiting { decision_id }) => {
                                    outcome.message.push_str(&format!(
                                        "; waiting for the orchestrator to acknowledge decision {decision_id}"
                                    ));
                                    false
                                }
                                Ok(virtual_etcd::Published::Unchanged) => false,
                                Err(error) => {
                                    outcome.message.push_str(&format!("; etcd: {error}"));
                                    false
                                }
                            };
                            runtime.virtual_connector = Some(connector);
                            result
                        }
                        Err(error) => {
                            outcome.message.push_str(&format!("; etcd: {error}"));
                            false
                        }
                    }
                }
            };
            if applied {
                outcome.scaled = true;
                let up = prefill + decode > spec_replicas.0 + spec_replicas.1;
                ctx.base.metrics.policies.decision(&namespace, &name, up);
                let note = format!(
                    "prefill {} -> {prefill}, decode {} -> {decode}: {}",
                    spec_replicas.0, spec_replicas.1, outcome.message
                );
                info!(%note, "scaled");
                publish(ctx, policy, EventType::Normal, "Scaled", &note).await;
            }
        }
    }
    if let Some(limited) = outcome
        .conditions
        .iter()
        .find(|c| c.type_ == status::SCALING_LIMITED && c.status == "True")
    {
        let was = policy
            .status
            .as_ref()
            .and_then(|s| crate::controller::conditions::find(&s.conditions, status::SCALING_LIMITED))
            .is_some_and(|c| c.status == "True" && c.message == limited.message);
        if !was {
            publish(
                ctx,
                policy,
                EventType::Warning,
                "ScalingLimited",
                &limited.message,
            )
            .await;
        }
    }
    if let Some(unavailable) = outcome
        .conditions
        .iter()
        .find(|c| c.type_ == METRICS_AVAILABLE && c.status == "False")
    {
        publish(
            ctx,
            policy,
            EventType::Warning,
            "MetricsUnavailable",
            &unavailable.message,
        )
        .await;
    }

    ctx.base.metrics.policies.record(
        &namespace,
        &name,
        &IntervalReport {
            desired: target,
            current: Some(current),
            observed: outcome.observed.as_ref().map(|o| {
                [
                    o.requests.unwrap_or(0.0),
                    o.isl.unwrap_or(0.0),
                    o.osl.unwrap_or(0.0),
                    o.ttft_ms.unwrap_or(0.0) / 1000.0,
                    o.itl_ms.unwrap_or(0.0) / 1000.0,
                ]
            }),
            predicted: outcome.predicted.as_ref().map(|p| {
                [
                    p.requests.unwrap_or(0.0),
                    p.isl.unwrap_or(0.0),
                    p.osl.unwrap_or(0.0),
                ]
            }),
            correction: outcome
                .correction
                .as_ref()
                .map(|c| (c.prefill.unwrap_or(1.0), c.decode.unwrap_or(1.0))),
        },
    );
    write_status(policy, ctx, &outcome).await?;
    let wait = runtime
        .next_tick
        .map_or(interval, |next| next.saturating_duration_since(Instant::now()));
    Ok(Action::requeue(wait.max(Duration::from_millis(100))))
}

/// Gets (or creates, restoring history) the planner state of a policy.
async fn runtime_for(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    pools: &resolve::Pools,
    model_name: &str,
    interval: Duration,
) -> Arc<tokio::sync::Mutex<PolicyRuntime>> {
    let key = (policy.namespace().unwrap_or_default(), policy.name_any());
    let spec = &policy.spec;
    let fingerprint = serde_json::to_string(&(
        spec.mode,
        &spec.adjustment_interval,
        &spec.predictor,
        &spec.target_ref,
        &spec.connector,
    ))
    .unwrap_or_default();
    let existing = ctx.runtimes.lock().ok().and_then(|r| r.get(&key).cloned());
    if let Some(existing) = existing {
        if existing.lock().await.fingerprint == fingerprint {
            return existing;
        }
        info!("planner settings changed; starting a new planner state");
    }
    let planner = match spec.mode {
        PlannerMode::Load => PlannerState::Load(LoadPlanner::default()),
        PlannerMode::Sla | PlannerMode::Observe => {
            let mut planner = match resolve::sla_config(spec, pools) {
                Ok(config) => SlaPlanner::new(&config),
                Err(_) => SlaPlanner::new(&default_sla_config(interval)),
            };
            // The semaphore is never closed; without a permit the build would only be unbounded.
            let _permit = ctx.state_builds.acquire().await.ok();
            warm_up(policy, ctx, &mut planner, interval).await;
            restore(policy, ctx, &mut planner, model_name, interval).await;
            PlannerState::Sla(Box::new(planner))
        }
    };
    let runtime = Arc::new(tokio::sync::Mutex::new(PolicyRuntime {
        fingerprint,
        planner,
        next_tick: None,
        virtual_connector: None,
    }));
    if let Ok(mut runtimes) = ctx.runtimes.lock() {
        runtimes.insert(key, Arc::clone(&runtime));
    }
    runtime
}

fn default_sla_config(interval: Duration) -> crate::planner::state::SlaPlannerConfig {
    crate::planner::state::SlaPlannerConfig {
        interval_s: interval.as_secs_f64(),
        sla: crate::planner::sla::SlaTargets::new(500.0, 50.0),
        limits: crate::planner::sla::Limits {
            min_replicas: 1,
            max_replicas: None,
            max_gpu_budget: None,
            prefill_gpus_per_engine: 1,
            decode_gpus_per_engine: 1,
        },
        correction: true,
        predictor: crate::planner::predictor::PredictorConfig::default(),
    }
}

/// Feeds the policy's warm-up trace, if any, to a new planner.
async fn warm_up(policy: &PlannerPolicy, ctx: &PlannerContext, planner: &mut SlaPlanner, interval: Duration) {
    let Some(warmup) = &policy.spec.predictor.warmup_trace else {
        return;
    };
    let namespace = policy.namespace().unwrap_or_default();
    let config_maps: Api<ConfigMap> = Api::namespaced(ctx.base.client.clone(), &namespace);
    let reference = &warmup.config_map_ref;
    let text = match config_maps.get_opt(&reference.name).await {
        Ok(Some(cm)) => cm.data.and_then(|mut d| d.remove(&reference.key)),
        Ok(None) => None,
        Err(error) => {
            warn!(%error, "cannot read the warm-up trace ConfigMap");
            None
        }
    };
    let Some(text) = text else {
        warn!(configmap = %reference.name, key = %reference.key, "warm-up trace not found; starting cold");
        return;
    };
    match trace::parse_mooncake_jsonl(&text) {
        Ok(records) => {
            let buckets = trace::bucketize(&records, interval.as_secs_f64());
            info!(
                intervals = buckets.len(),
                "warmed the predictors up from the trace"
            );
            planner.warm_up(&buckets);
        }
        Err(error) => warn!(%error, "the warm-up trace cannot be read; starting cold"),
    }
}

/// Replays recent intervals from Prometheus so a restart does not start the predictors cold.
async fn restore(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    planner: &mut SlaPlanner,
    model: &str,
    interval: Duration,
) {
    let spec = &policy.spec;
    let url = spec
        .metrics
        .prometheus
        .url
        .clone()
        .unwrap_or_else(|| ctx.default_prometheus_url.clone());
    let Ok(client) = ctx.prometheus(&url) else { return };
    let filter = SeriesFilter {
        dynamo_namespace: resolve::metrics_namespace(policy, &spec.target_ref.name),
        model: model.to_string(),
    };
    // End one interval ago: the current interval is observed by the first tick.
    let end = unix_now() - interval.as_secs_f64();
    match client
        .history(&filter, interval.as_secs().max(1), HISTORY_INTERVALS, end)
        .await
    {
        Ok(history) => {
            info!(
                intervals = history.len(),
                "restored predictor history from Prometheus"
            );
            planner.replay(&history);
        }
        Err(error) => info!(%error, "no Prometheus history to restore; starting cold"),
    }
}

/// Loads (or reuses) the performance model of the policy's profile; the error is a message.
async fn load_model(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
) -> Result<(Arc<PerformanceModel>, String), String> {
    let Some(profile) = &policy.spec.profile else {
        return Err("spec.profile is required in sla and observe modes".into());
    };
    if let Some(builtin) = profile.builtin {
        let key = format!("builtin:{}", builtin.name());
        return cached_model(ctx, &key, || {
            Profile::builtin(builtin.name()).map_err(|e| e.to_string())
        })
        .map(|m| (m, format!("builtin {}", builtin.name())));
    }
    let Some(reference) = &profile.config_map_ref else {
        return Err("spec.profile must set builtin or configMapRef".into());
    };
    let namespace = policy.namespace().unwrap_or_default();
    let config_maps: Api<ConfigMap> = Api::namespaced(ctx.base.client.clone(), &namespace);
    let cm = config_maps
        .get_opt(&reference.name)
        .await
        .map_err(|e| format!("cannot read ConfigMap {}: {e}", reference.name))?
        .ok_or_else(|| {
            format!(
                "spec.profile.configMapRef: ConfigMap {:?} does not exist",
                reference.name
            )
        })?;
    // Cached until the ConfigMap changes.
    let key = format!(
        "configmap:{namespace}/{}@{}",
        reference.name,
        cm.resource_version().unwrap_or_default()
    );
    let source = format!("ConfigMap {}", reference.name);
    cached_model(ctx, &key, || {
        Profile::from_config_map_entries(
            &format!("ConfigMap {}", reference.name),
            |k| cm.data.as_ref().and_then(|d| d.get(k).cloned()),
            |k| {
                cm.binary_data
                    .as_ref()
                    .and_then(|d| d.get(k).map(|b| b.0.clone()))
            },
        )
        .map_err(|e| e.to_string())
    })
    .map(|m| (m, source))
}

fn cached_model(
    ctx: &PlannerContext,
    key: &str,
    load: impl FnOnce() -> Result<Profile, String>,
) -> Result<Arc<PerformanceModel>, String> {
    if let Some(model) = ctx.models.lock().ok().and_then(|m| m.get(key).cloned()) {
        return Ok(model);
    }
    let profile = load()?;
    let model = Arc::new(PerformanceModel::new(&profile).map_err(|e| e.to_string())?);
    if let Ok(mut models) = ctx.models.lock() {
        // Drop older versions of the same ConfigMap.
        if let Some((prefix, _)) = key.split_once('@') {
            models.retain(|k, _| !k.starts_with(prefix));
        }
        models.insert(key.to_string(), Arc::clone(&model));
    }
    Ok(model)
}

/// Available replicas of both pools from the DGD status (ready when available is not
/// reported), else the spec's.
fn current_replicas(dgd: &DynamoGraphDeployment, pools: &resolve::Pools) -> (u32, u32) {
    let of = |component: &str, spec: u32| {
        dgd.status
            .as_ref()
            .and_then(|s| s.components.get(component))
            .map(|c| {
                if c.available_replicas > 0 {
                    c.available_replicas
                } else {
                    c.ready_replicas
                }
            })
            .map_or(spec, |n| u32::try_from(n).unwrap_or(0))
    };
    (
        of(&pools.prefill, pools.prefill_replicas),
        of(&pools.decode, pools.decode_replicas),
    )
}

fn is_ready(dgd: &DynamoGraphDeployment) -> bool {
    dgd.status
        .as_ref()
        .and_then(|s| crate::controller::conditions::find(&s.conditions, DGD_READY))
        .is_some_and(|c| c.status == "True")
}

fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn unix_now() -> f64 {
    Timestamp::now().as_millisecond() as f64 / 1000.0
}

async fn report_blocked(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    blocked: Blocked,
) -> Result<Action, Error> {
    let message = blocked.condition.message.clone();
    let outcome = Outcome {
        conditions: vec![blocked.condition],
        message,
        ..Outcome::default()
    };
    let changed = write_status(policy, ctx, &outcome).await?;
    if changed && let Some((reason, note)) = blocked.event {
        publish(ctx, policy, EventType::Warning, reason, &note).await;
    }
    Ok(Action::requeue(RETRY))
}

/// Writes status when it changed; returns whether it did.
async fn write_status(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    outcome: &Outcome,
) -> Result<bool, Error> {
    let next = status::next(
        policy.status.as_ref(),
        policy.metadata.generation,
        outcome,
        Timestamp::now(),
    );
    if !status::differs(policy.status.as_ref(), &next) {
        return Ok(false);
    }
    let api: Api<PlannerPolicy> =
        Api::namespaced(ctx.base.client.clone(), &policy.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": PlannerPolicy::api_version(&()),
        "kind": PlannerPolicy::kind(&()),
        "status": PlannerPolicyStatus { ..next },
    });
    api.patch_status(
        &policy.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|source| Error::Kube {
        action: "write PlannerPolicy status".into(),
        source,
    })?;
    Ok(true)
}

async fn publish(ctx: &PlannerContext, policy: &PlannerPolicy, type_: EventType, reason: &str, note: &str) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Plan".into(),
        secondary: None,
    };
    if let Err(error) = ctx.base.recorder.publish(&event, &policy.object_ref(&())).await {
        warn!(%error, "cannot publish event");
    }
}

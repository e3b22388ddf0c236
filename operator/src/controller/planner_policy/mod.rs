//! The PlannerPolicy reconciler: one operator process plans every policy in the cluster. A
//! reconcile runs these steps, in this order:
//!
//! 1. **dereference** ([`dereference`]): read the target DGD in the policy's namespace;
//! 2. **validate** ([`crate::validation::planner_policy::validate`]): the admission webhook's
//!    rules, so a policy the webhook would deny is reported the same way when the webhook is off;
//! 3. **profile**: the performance model of the profile (SLA planner only);
//! 4. **schedule**: the policy's planner state, and whether an interval is due;
//! 5. **observe** ([`observe`]): the interval's metrics from Prometheus;
//! 6. **decide** ([`decide`], pure): the planner's tick and what status should say; with a
//!    shared GPU budget ([`member`]), what the budget lets the decision be now;
//! 7. **actuate** ([`actuate`]): carry the decision out through the connector;
//! 8. **report**: status (written only when it changed), Events on transitions, metrics.
//!
//! Every path that decides something ends in the report step; problems with the spec or the
//! target are reported in status and retried on a schedule, and only API errors fail a
//! reconcile.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, ResourceExt,
    core::DeserializeGuard,
    runtime::{Controller, controller::Action, events::EventType, watcher},
};
use tracing::{info, warn};

use planner_api::{ConnectorKind, PlannerMode, PlannerPolicy, PoolReplicas};
use planner_core::{
    interpolation::PerformanceModel,
    load::LoadPlanner,
    startup::{StartupTracker, planned_delay},
    state::SlaPlanner,
};

use super::{
    Context,
    common::{self, KubeError},
    conditions::{self, DesiredCondition},
};
use crate::{
    connector::kubernetes::{self, Adapters, ScaleError},
    lookup::TargetLookup,
    metrics::policy::IntervalReport,
    sources::prometheus::{PrometheusClient, SeriesFilter},
    target::TargetGraph,
    validation::{self, PolicyError, PoolTarget, TargetPools, ValidatedPolicy},
};

pub mod actuate;
pub mod config;
pub mod decide;
pub mod dereference;
pub mod member;
pub mod observe;
pub mod status;

use actuate::{Actuation, Connector, EtcdConnector, Gate, KubernetesConnector, ScaleRequest};
use decide::{Decision, MetricsOrigin, PlannerState, Replicas};
use status::{
    BudgetOutcome, METRICS_AVAILABLE, Outcome, PROFILE_LOADED, READY, SCALING_LIMITED, TARGET_RESOLVED,
};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "plannerpolicy";
/// Timeout of each Prometheus request.
const PROMETHEUS_TIMEOUT: Duration = Duration::from_secs(10);
/// Prometheus clients kept (one per URL and token).
const MAX_PROMETHEUS_CLIENTS: usize = 1024;
/// Retry delay when the spec, the target or the profile is not usable yet.
const RETRY: Duration = Duration::from_secs(30);
/// Retry delay after an API error.
const ERROR_RETRY: Duration = Duration::from_secs(15);
/// How often the states and metric series of deleted policies are dropped.
const PRUNE_EVERY: Duration = Duration::from_secs(30);
/// Planner states built at once (warm-up trace read and parsed, history restored). Each warm-up
/// holds its trace ConfigMap (up to 1 MiB) twice while it parses it: unbounded, a thousand
/// policies created together held hundreds of them at once, and the allocator kept the peak
/// (368 MiB resident afterwards, `e2e/bench/policies.sh`).
const STATE_BUILDS: usize = 4;

/// Why a reconcile failed (API errors only; problems with the spec or target are reported in
/// status and conditions, and retried on a schedule).
pub use super::common::ApiError as Error;

/// One policy's planner between reconciles.
struct PolicyRuntime {
    /// The settings the state was built for; a change starts a new state.
    fingerprint: String,
    state: PlannerState,
    /// The virtual connector's etcd session (kept for its protocol state).
    etcd: Option<EtcdConnector>,
    next_tick: Option<Instant>,
    /// The next fast check between intervals (queueing model).
    next_fast: Option<Instant>,
    /// Scale-ups waiting for their replicas, to measure the scale-up delay.
    startup: Startup,
    /// The replicas the last decision wanted, before a shared budget cut them: what the policy
    /// asks its budget for between decisions.
    want: Option<(u32, u32)>,
    /// The SLA risk of the last interval observed (1 until one is).
    risk: f64,
}

/// The policy's scale-up delay, measured on the target by planner-core's tracker (the one the
/// simulator and the replay bridge use), on the process clock.
#[derive(Clone, Debug)]
struct Startup {
    /// The clock's origin for the tracker.
    origin: Instant,
    tracker: StartupTracker,
}

impl Default for Startup {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            tracker: StartupTracker::default(),
        }
    }
}

impl Startup {
    fn at(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.origin)
    }

    /// Records a change of the replicas asked for.
    fn scaled(&mut self, from: (u32, u32), to: (u32, u32), now: Instant) {
        let at = self.at(now);
        self.tracker.scaled(from, to, at);
    }

    /// Completes the measurement once the replicas serving reach those asked for.
    fn observe(&mut self, replicas: Replicas, now: Instant) {
        let at = self.at(now);
        self.tracker.observe(replicas.serving, at);
    }

    /// The measured delay, once there is one.
    fn delay(&self) -> Option<Duration> {
        self.tracker.delay()
    }

    /// Whether replicas asked for more than `limit` ago are still not serving.
    fn stuck(&self, now: Instant, limit: Duration) -> bool {
        self.tracker.stuck(self.at(now), limit)
    }
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
    /// What the cluster admin lets policies name.
    pub tenancy: validation::Tenancy,
    runtimes: Mutex<Runtimes>,
    models: dereference::ModelCache,
    prometheus: Mutex<HashMap<String, PrometheusClient>>,
    fast: observe::FastCache,
    state_builds: tokio::sync::Semaphore,
    /// The shared GPU budgets: their ledger, cache and wakes.
    pub budgets: super::gpu_budget::Budgets,
}

impl PlannerContext {
    /// A context with empty caches.
    pub fn new(base: Arc<Context>, default_prometheus_url: String) -> Self {
        Self {
            base,
            tenancy: validation::Tenancy {
                default_prometheus_url: default_prometheus_url.clone(),
                ..validation::Tenancy::default()
            },
            default_prometheus_url,
            runtimes: Mutex::default(),
            models: dereference::ModelCache::default(),
            prometheus: Mutex::default(),
            fast: observe::FastCache::default(),
            state_builds: tokio::sync::Semaphore::new(STATE_BUILDS),
            budgets: super::gpu_budget::Budgets::default(),
        }
    }

    /// The admin's rules for what policies may name (the default Prometheus URL is this
    /// context's).
    pub fn with_tenancy(mut self, tenancy: validation::Tenancy) -> Self {
        self.tenancy = validation::Tenancy {
            default_prometheus_url: self.default_prometheus_url.clone(),
            ..tenancy
        };
        self
    }

    /// The Prometheus URL of a policy.
    fn prometheus_url(&self, policy: &PlannerPolicy) -> String {
        policy
            .spec
            .metrics
            .prometheus
            .url
            .clone()
            .unwrap_or_else(|| self.default_prometheus_url.clone())
    }

    /// A (shared) client for `url` that sends `token`, or why there is none.
    fn prometheus(&self, url: &str, token: Option<String>) -> Result<PrometheusClient, String> {
        let key = crate::sources::prometheus::identity(url, token.as_deref());
        let mut clients = self
            .prometheus
            .lock()
            .map_err(|_| "internal lock poisoned".to_string())?;
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        let client = PrometheusClient::new(url, PROMETHEUS_TIMEOUT)
            .map_err(|e| e.to_string())?
            .with_bearer_token(token);
        // Rotated tokens leave old clients behind: start over rather than grow without bound.
        if clients.len() >= MAX_PROMETHEUS_CLIENTS {
            clients.clear();
        }
        clients.insert(key, client.clone());
        Ok(client)
    }

    /// The client a policy reads its metrics with: its Prometheus, with its bearer token.
    async fn policy_prometheus(&self, policy: &PlannerPolicy) -> Result<PrometheusClient, String> {
        let token = dereference::prometheus_token(&self.base.client, policy).await?;
        self.prometheus(&self.prometheus_url(policy), token)
    }

    /// Forgets a deleted policy: its planner state, its metric series and its place in a
    /// shared budget (its GPUs go to the other members at once).
    fn forget(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        if let Ok(mut runtimes) = self.runtimes.lock() {
            runtimes.remove(&key);
        }
        self.base.metrics.policies.remove(namespace, name);
        self.budgets.wake(self.budgets.broker.leave(&key, Instant::now()));
    }
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<PlannerContext>,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let policies: Api<DeserializeGuard<PlannerPolicy>> =
        common::scoped_api(ctx.base.client.clone(), namespace.as_deref());
    ctx.budgets.set_scope(namespace.clone());
    let mut controller = Controller::new(policies, watcher::Config::default().any_semantic());
    // A shared budget's round wakes the members whose grant it changed.
    if let Some(wakes) = ctx.budgets.take_policy_wakes() {
        controller = controller.reconcile_on(wakes);
    }
    let store = controller.store();
    let shutdown = futures::FutureExt::shared(shutdown);
    let budgets = {
        let (ctx, namespace, shutdown) = (Arc::clone(&ctx), namespace.clone(), shutdown.clone());
        // Ends with the others, at shutdown, whatever happens to it before.
        async move {
            super::gpu_budget::run(ctx, namespace, shutdown.clone()).await;
            shutdown.await;
        }
    };
    // Drop the metric series and state of deleted policies.
    let pruner = {
        let ctx = Arc::clone(&ctx);
        async move {
            let mut tick = tokio::time::interval(PRUNE_EVERY);
            loop {
                tick.tick().await;
                let live: HashSet<(String, String)> = store
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
        () = budgets => {},
    }
}

async fn reconcile(
    guard: Arc<DeserializeGuard<PlannerPolicy>>,
    ctx: Arc<PlannerContext>,
) -> Result<Action, Error> {
    common::guarded_reconcile(
        CONTROLLER,
        &ctx.base.metrics,
        &guard,
        async |policy| reconcile_policy(policy, &ctx).await,
        async |_, _| {},
    )
    .await
}

fn error_policy(
    guard: Arc<DeserializeGuard<PlannerPolicy>>,
    error: &Error,
    _ctx: Arc<PlannerContext>,
) -> Action {
    let name = guard.0.as_ref().map(ResourceExt::name_any).unwrap_or_default();
    warn!(%name, error = %common::chain(error), "reconcile failed; retrying");
    Action::requeue(ERROR_RETRY)
}

async fn reconcile_policy(policy: &PlannerPolicy, ctx: &PlannerContext) -> Result<Action, Error> {
    let namespace = policy.namespace().unwrap_or_default();
    let client = &ctx.base.client;

    // 1. Dereference the target (a DGD of either served version).
    let target = match dereference::target(client, policy).await {
        Ok(target) => target,
        Err(error) => return report_unavailable(policy, ctx, error).await,
    };
    let dgd = match &target {
        TargetLookup::Found(graph) => Some(graph.as_ref()),
        TargetLookup::NotFound => None,
        TargetLookup::Unreadable(error) => {
            let errors = validation::validate_unreadable(&policy.spec, &namespace, error, &ctx.tenancy);
            return report_invalid(policy, ctx, &errors, None).await;
        }
    };
    // Where the graph keeps its KV-cache transfers: reported, never rendered by the planner.
    let kv_transfer = dgd.map(|graph| graph.kv_transfer.clone());

    // 2. Validate, with the webhook's rules.
    let validated = match validation::validate(&policy.spec, &namespace, dgd, &ctx.tenancy) {
        Ok(validated) => validated,
        Err(errors) => return report_invalid(policy, ctx, &errors, kv_transfer).await,
    };
    let Some(dgd) = dgd else {
        // validate() reports a missing target; this is not reached.
        return Ok(Action::requeue(RETRY));
    };
    // The shared GPU budget it joins, with the webhook's rules.
    let membership = match member::membership(policy, ctx, &validated, Instant::now()).await {
        Ok(membership) => membership,
        Err(errors) => return report_invalid(policy, ctx, &errors, kv_transfer).await,
    };
    // The pools' scaling adapters, where NVIDIA's operator made them: they own those replicas.
    let adapters = if policy.spec.connector.kind == ConnectorKind::Kubernetes {
        let pools = [
            validated.target.prefill.component.as_str(),
            validated.target.decode.component.as_str(),
        ];
        match kubernetes::adapters(client, dgd, &pools).await {
            Ok(adapters) => adapters,
            Err(ScaleError::Api { action, source }) => {
                return report_unavailable(policy, ctx, common::KubeError { action, source }).await;
            }
            Err(other) => {
                warn!(error = %common::chain(&other), "cannot read the scaling adapters");
                Adapters::new()
            }
        }
    } else {
        Adapters::new()
    };
    let mut outcome = Outcome {
        aggregated: validated.target.aggregated,
        kv_transfer,
        ..Outcome::default()
    };
    if membership.is_none() && policy.status.as_ref().is_some_and(|s| s.budget.is_some()) {
        outcome.budget = BudgetOutcome::Clear;
    }
    outcome.conditions.push(DesiredCondition::met(
        TARGET_RESOLVED,
        "Resolved",
        if validated.target.aggregated {
            format!(
                "aggregated worker component {:?} (prefill and decode on the same engines)",
                validated.target.decode.component
            )
        } else {
            format!(
                "prefill component {:?}, decode component {:?}",
                validated.target.prefill.component, validated.target.decode.component
            )
        },
    ));

    // 3. The profile's performance model (the load-based planner needs none).
    let model = if policy.spec.mode == PlannerMode::Load {
        None
    } else {
        match ctx.models.model(client, policy).await {
            Ok((model, source)) => {
                outcome.conditions.push(DesiredCondition::met(
                    PROFILE_LOADED,
                    "Loaded",
                    format!("profile {source}"),
                ));
                Some(model)
            }
            Err(error) => {
                let message = common::chain(&error);
                let condition = DesiredCondition::unmet(PROFILE_LOADED, "ProfileInvalid", &message);
                return report_blocked(policy, ctx, condition).await;
            }
        }
    };

    // 4. The policy's planner state, and what is due: an interval, a fast check, or nothing.
    let runtime = runtime_for(policy, ctx, &validated, model).await;
    let mut runtime = runtime.lock().await;
    let now = Instant::now();
    let asked = (
        asked_replicas(&validated.target.prefill, &adapters),
        asked_replicas(&validated.target.decode, &adapters),
    );
    let current = Replicas {
        serving: current_replicas(dgd, &validated.target, asked),
        asked,
    };
    runtime.startup.observe(current, now);
    let measured_delay = runtime.startup.delay();
    refresh(&mut runtime.state, &policy.spec, &validated, None, measured_delay);
    let fast_period = fast_period(&runtime.state, &validated);
    let step = match due(&mut runtime.next_tick, validated.interval, now) {
        Some(lateness) => {
            if let Some(lateness) = lateness {
                ctx.base.metrics.policies.lateness(lateness.as_secs_f64());
            }
            runtime.next_fast = fast_period.map(|period| now + period);
            Step::Interval
        }
        None => match (fast_period, runtime.next_fast) {
            (Some(period), Some(next)) if next <= now => {
                runtime.next_fast = Some(now + period);
                Step::Fast(period)
            }
            // A budget member looks at its grant on every wake: a cut or a release applies now.
            _ if membership.is_some() => Step::Grant,
            // Between checks nothing is written: the status describes the last decision.
            _ => return Ok(next_wake(&runtime, validated.interval)),
        },
    };

    // 5. Observe.
    let url = ctx.prometheus_url(policy);
    let prometheus = ctx.policy_prometheus(policy).await;
    let query = observe::MetricsQuery {
        client: prometheus.as_ref().map_err(Clone::clone),
        dynamo_namespace: &validated.dynamo_namespace,
        model: validated.target.model_name.as_deref().unwrap_or_default(),
        interval: validated.interval,
        pulling_interval: validated.pulling_interval,
        now_unix_s: unix_now(),
        ttft_quantile: policy
            .spec
            .sla
            .ttft_percentile
            .map_or(DEFAULT_TTFT_QUANTILE, |p| p / 100.0),
        prefill_engines: current.serving.0,
        decode_engines: current.serving.1,
    };
    let origin = MetricsOrigin {
        dynamo_namespace: validated.dynamo_namespace.clone(),
        url: crate::sources::prometheus::redact(&url),
    };

    // 6. Decide.
    let interval = matches!(step, Step::Interval);
    let decision = match step {
        Step::Interval => {
            outcome.ticked = true;
            outcome.current = Some(replicas(current.serving, outcome.aggregated));
            let observed = observe::observe(&runtime.state, &query, &ctx.base.metrics.policies).await;
            decide::decide(&mut runtime.state, observed, current, &origin)
        }
        Step::Fast(period) => {
            let signals = observe::fast_signals(
                &query,
                &ctx.fast,
                fast_window(period),
                period,
                &ctx.base.metrics.policies,
            )
            .await;
            let fast = match signals {
                Some(mut signals) => {
                    signals.elapsed_s = runtime.next_tick.map_or(0.0, |next| {
                        (validated.interval.as_secs_f64() - next.saturating_duration_since(now).as_secs_f64())
                            .max(0.0)
                    });
                    decide::decide_fast(&mut runtime.state, &signals, current)
                }
                None => None,
            };
            match fast {
                Some(decision) => decision,
                // Nothing at risk: a member still looks at its grant.
                None if membership.is_some() => Decision::default(),
                None => return Ok(next_wake(&runtime, validated.interval)),
            }
        }
        Step::Grant => Decision::default(),
    };
    let decision = decide::guard(decision, current.asked, &config::guards(&policy.spec));
    // 6b. The shared budget: what the decision (else the replicas last wanted; at an interval
    // that holds, those asked for) may be now.
    let decision = match &membership {
        Some(membership) => {
            let want = match decision.target {
                Some(target) => target,
                None if interval => current.asked,
                None => runtime.want.unwrap_or(current.asked),
            };
            runtime.want = Some(want);
            if let Some(risk) = member::risk(&decision, &policy.spec) {
                runtime.risk = risk;
            }
            let ask = member::ask(membership, &policy.spec, &validated, want, runtime.risk);
            let key = (namespace.clone(), policy.name_any());
            let held = vec![current.asked.0, current.asked.1];
            match ctx
                .budgets
                .broker
                .ask(&membership.name, membership.total, &key, ask, held, now)
            {
                Some((answer, wakes)) => {
                    ctx.budgets.wake(wakes);
                    let floor = member::floor(&policy.spec);
                    let aggregated = validated.target.aggregated;
                    let (decision, grant) =
                        member::granted(decision, membership, &answer, current.asked, floor, aggregated);
                    outcome.budget = BudgetOutcome::Set(grant);
                    decision
                }
                None => decision,
            }
        }
        None => decision,
    };
    if matches!(step, Step::Grant | Step::Fast(_)) && decision.target.is_none() {
        // Nothing to carry out between decisions; the status describes the last one, unless the
        // grant changed.
        let grant_changed = match (
            &outcome.budget,
            policy.status.as_ref().and_then(|s| s.budget.as_ref()),
        ) {
            (BudgetOutcome::Set(now), previous) => previous != Some(now),
            _ => false,
        };
        if !grant_changed {
            return Ok(next_wake(&runtime, validated.interval));
        }
        outcome.message = policy
            .status
            .as_ref()
            .and_then(|s| s.message.clone())
            .unwrap_or_default();
        outcome.conditions.extend(decision.conditions);
        publish_grant_event(policy, ctx, &outcome).await;
        write_status(policy, ctx, &outcome).await?;
        return Ok(next_wake(&runtime, validated.interval));
    }
    let target = decision.target;
    absorb(&mut outcome, decision);

    // 7. Actuate.
    let mut scaled_from = None;
    if let Some(wanted) = target {
        outcome.desired = Some(replicas(wanted, outcome.aggregated));
        let asked = current.asked;
        if policy.spec.mode == PlannerMode::Observe {
            outcome.message.push_str(" (observe mode: not applied)");
        } else if wanted != asked {
            let request = ScaleRequest {
                target: wanted,
                components: (
                    &validated.target.prefill.component,
                    &validated.target.decode.component,
                ),
                graph: dgd,
            };
            let actuation = match policy.spec.connector.kind {
                ConnectorKind::Kubernetes => {
                    let ready = actuate::is_ready(dgd, request.components, &adapters);
                    let delay = planned_delay(
                        validated.scale_up_delay,
                        runtime.startup.delay(),
                        validated.expected_scale_up_delay,
                    )
                    .delay;
                    let gate = ready_gate(&policy.spec, ready, (&runtime.startup, delay), asked, wanted, now);
                    KubernetesConnector {
                        client: client.clone(),
                        adapters,
                        gate,
                    }
                    .scale(&request)
                    .await
                }
                ConnectorKind::Virtual => {
                    let etcd = runtime.etcd.get_or_insert_with(|| {
                        EtcdConnector::new(
                            policy
                                .spec
                                .connector
                                .etcd
                                .as_ref()
                                .map(|e| e.endpoints.clone())
                                .unwrap_or_default(),
                            policy
                                .spec
                                .connector
                                .dynamo_namespace
                                .clone()
                                .unwrap_or_else(|| validated.dynamo_namespace.clone()),
                            validated.decision_timeout,
                        )
                    });
                    etcd.scale(&request).await
                }
            };
            match actuation {
                Actuation::Scaled { decision_id } => {
                    outcome.scaled = true;
                    outcome.decision_id = decision_id;
                    scaled_from = Some(asked);
                    runtime.startup.scaled(asked, wanted, now);
                }
                Actuation::Unchanged => {}
                Actuation::Deferred(reason) | Actuation::Failed(reason) => {
                    outcome.message.push_str(&format!("; {reason}"));
                }
            }
        }
    }
    // What the pools ask for now, for the budget's ledger (a reservation not used is released).
    if let Some(membership) = &membership {
        let held = match (scaled_from, target) {
            (Some(_), Some(to)) => to,
            _ => current.asked,
        };
        let key = (namespace.clone(), policy.name_any());
        ctx.budgets.wake(ctx.budgets.broker.settle(
            &membership.name,
            &key,
            vec![held.0, held.1],
            Instant::now(),
        ));
    }

    // 8. Report.
    if let (Some(from), Some(to)) = (scaled_from, target) {
        let up = to.0 + to.1 > from.0 + from.1;
        ctx.base
            .metrics
            .policies
            .decision(&namespace, &policy.name_any(), up);
        let note = if outcome.aggregated {
            format!("workers {} -> {}: {}", from.1, to.1, outcome.message)
        } else {
            format!(
                "prefill {} -> {}, decode {} -> {}: {}",
                from.0, to.0, from.1, to.1, outcome.message
            )
        };
        info!(%note, "scaled");
        common::publish(
            &ctx.base.recorder,
            policy,
            EventType::Normal,
            "Scaled",
            "Plan",
            &note,
        )
        .await;
    }
    publish_warnings(policy, ctx, &outcome).await;
    publish_grant_event(policy, ctx, &outcome).await;
    if outcome.ticked {
        ctx.base.metrics.policies.record(
            &namespace,
            &policy.name_any(),
            &interval_report(&outcome, target, current.serving),
        );
    }
    write_status(policy, ctx, &outcome).await?;
    Ok(next_wake(&runtime, validated.interval))
}

/// The TTFT quantile read from the histogram when no percentile target is set (for status).
const DEFAULT_TTFT_QUANTILE: f64 = 0.9;
/// Shortest window the fast path reads rates over: Prometheus needs two scrapes in a window.
const MIN_FAST_WINDOW: Duration = Duration::from_secs(20);

/// What a reconcile does.
enum Step {
    /// An adjustment interval.
    Interval,
    /// A fast check between intervals, every this period.
    Fast(Duration),
    /// Between them, a shared budget's member carries out a changed grant.
    Grant,
}

/// The fast-check period of a policy: the queueing model's, unless turned off.
fn fast_period(state: &PlannerState, validated: &ValidatedPolicy) -> Option<Duration> {
    match state {
        PlannerState::Sla { config, .. } if config.model == planner_core::state::SlaModel::Queueing => {
            (!validated.fast_check_period.is_zero()).then_some(validated.fast_check_period)
        }
        _ => None,
    }
}

/// The window the fast path reads its rates over.
fn fast_window(period: Duration) -> Duration {
    period.max(MIN_FAST_WINDOW)
}

/// Requeue at the next interval or fast check, whichever comes first.
fn next_wake(runtime: &PolicyRuntime, interval: Duration) -> Action {
    let next = match (runtime.next_tick, runtime.next_fast) {
        (Some(tick), Some(fast)) => Some(tick.min(fast)),
        (tick, fast) => tick.or(fast),
    };
    requeue_at(next, interval)
}

/// Whether the connector may change replicas while the target is not Ready. Upstream's rule
/// holds every change until the target is Ready; here a scale-down always goes through (a
/// scale-up that can never schedule must not pin the replicas up), and with the queueing model,
/// which counts the replicas still starting, so does a scale-up, unless the last one has not
/// come up within twice the scale-up delay the planner plans with (`delay`: the one set, else
/// measured, else expected).
fn ready_gate(
    spec: &planner_api::PlannerPolicySpec,
    ready: bool,
    (startup, delay): (&Startup, Duration),
    asked: (u32, u32),
    wanted: (u32, u32),
    now: Instant,
) -> Gate {
    if ready || (wanted.0 <= asked.0 && wanted.1 <= asked.1) {
        return Gate::Open;
    }
    let queueing = spec.sla.model == planner_api::SlaModel::Queueing && spec.mode != PlannerMode::Load;
    if queueing && !startup.stuck(now, 2 * delay) {
        Gate::Open
    } else {
        Gate::Closed
    }
}

/// Whether an interval is due at `now`: `None` when not yet, else how late it is (`None` for the
/// first). Advances `next_tick`, keeping the cadence, or starting over after a long pause.
fn due(next_tick: &mut Option<Instant>, interval: Duration, now: Instant) -> Option<Option<Duration>> {
    match *next_tick {
        Some(next) if next > now => None,
        Some(next) => {
            let late = now - next;
            *next_tick = Some(if late < interval {
                next + interval
            } else {
                now + interval
            });
            Some(Some(late))
        }
        None => {
            *next_tick = Some(now + interval);
            Some(None)
        }
    }
}

/// Requeue at the next interval.
fn requeue_at(next_tick: Option<Instant>, interval: Duration) -> Action {
    let wait = next_tick.map_or(interval, |next| next.saturating_duration_since(Instant::now()));
    Action::requeue(wait.max(Duration::from_millis(100)))
}

/// Moves a decision's report into the outcome.
fn absorb(outcome: &mut Outcome, decision: Decision) {
    outcome.conditions.extend(decision.conditions);
    outcome.observed = decision.observed;
    outcome.predicted = decision.predicted;
    outcome.correction = decision.correction;
    outcome.message = decision.message;
}

/// Gets the policy's planner state, creating it (warmed up and restored from Prometheus history)
/// on first use or when its settings changed; its configuration and model are refreshed.
async fn runtime_for(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    validated: &ValidatedPolicy,
    model: Option<Arc<PerformanceModel>>,
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
        let mut runtime = existing.lock().await;
        if runtime.fingerprint == fingerprint {
            let measured = runtime.startup.delay();
            refresh(&mut runtime.state, spec, validated, model, measured);
            drop(runtime);
            return existing;
        }
        info!("planner settings changed; starting a new planner state");
    }
    let state = match model {
        Some(model) if spec.mode != PlannerMode::Load => {
            let config = config::sla_config(spec, validated, None);
            let mut planner = SlaPlanner::new(&config);
            // The semaphore is never closed; without a permit the build would only be unbounded.
            let _permit = ctx.state_builds.acquire().await.ok();
            dereference::warm_up(&ctx.base.client, policy, &mut planner, validated.interval).await;
            if let Ok(client) = ctx.policy_prometheus(policy).await {
                let filter = SeriesFilter {
                    dynamo_namespace: validated.dynamo_namespace.clone(),
                    model: validated.target.model_name.clone().unwrap_or_default(),
                };
                dereference::restore(&client, &filter, &mut planner, validated.interval, unix_now()).await;
            }
            PlannerState::Sla {
                planner: Box::new(planner),
                config: Box::new(config),
                model,
            }
        }
        _ => PlannerState::Load {
            planner: LoadPlanner::default(),
            config: config::load_config(spec, validated),
            aggregated: validated.target.aggregated,
        },
    };
    let runtime = Arc::new(tokio::sync::Mutex::new(PolicyRuntime {
        fingerprint,
        state,
        etcd: None,
        next_tick: None,
        next_fast: None,
        startup: Startup::default(),
        want: None,
        risk: 1.0,
    }));
    if let Ok(mut runtimes) = ctx.runtimes.lock() {
        runtimes.insert(key, Arc::clone(&runtime));
    }
    runtime
}

/// Applies settings that do not need a new state (targets, bounds, a new profile version, the
/// measured scale-up delay).
fn refresh(
    state: &mut PlannerState,
    spec: &planner_api::PlannerPolicySpec,
    validated: &ValidatedPolicy,
    new_model: Option<Arc<PerformanceModel>>,
    measured_delay: Option<Duration>,
) {
    match state {
        PlannerState::Sla { config, model, .. } => {
            **config = config::sla_config(spec, validated, measured_delay);
            if let Some(new_model) = new_model {
                *model = new_model;
            }
        }
        PlannerState::Load {
            config, aggregated, ..
        } => {
            *config = config::load_config(spec, validated);
            *aggregated = validated.target.aggregated;
        }
    }
}

/// Replicas asked for a pool: its scaling adapter's `spec.replicas` when it has one (the adapter
/// owns them), else the DGD's.
fn asked_replicas(pool: &PoolTarget, adapters: &Adapters) -> u32 {
    adapters
        .get(&pool.component)
        .map_or(pool.replicas, |a| a.spec_replicas)
}

/// Available replicas of both pools from the DGD status, NVIDIA's or this operator's (ready when
/// available is not reported), else those asked for.
fn current_replicas(dgd: &TargetGraph, target: &TargetPools, asked: (u32, u32)) -> (u32, u32) {
    (
        dgd.serving(&target.prefill.component).unwrap_or(asked.0),
        dgd.serving(&target.decode.component).unwrap_or(asked.1),
    )
}

/// Replicas for status; an aggregated pool's are its `workers` too (both pools are it).
fn replicas((prefill, decode): (u32, u32), aggregated: bool) -> PoolReplicas {
    let to_i32 = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    PoolReplicas {
        prefill: to_i32(prefill),
        decode: to_i32(decode),
        workers: aggregated.then(|| to_i32(decode)),
    }
}

fn interval_report(outcome: &Outcome, desired: Option<(u32, u32)>, current: (u32, u32)) -> IntervalReport {
    IntervalReport {
        desired,
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
    }
}

fn unix_now() -> f64 {
    Timestamp::now().as_millisecond() as f64 / 1000.0
}

/// Reports a policy that the webhook's rules reject: `TargetResolved` (for errors about the
/// target) or `Ready` (for the policy's own fields) with the webhook's message.
async fn report_invalid(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    errors: &[PolicyError],
    kv_transfer: Option<Option<planner_api::KvTransferStatus>>,
) -> Result<Action, Error> {
    let message = validation::describe(errors);
    let condition = match errors.iter().find(|e| e.is_about_target()) {
        Some(first) => DesiredCondition::unmet(TARGET_RESOLVED, first.reason(), &message),
        None => DesiredCondition::unmet(
            READY,
            errors.first().map_or("InvalidSpec", PolicyError::reason),
            &message,
        ),
    };
    report_with(policy, ctx, condition, kv_transfer).await
}

/// Reports that the target or its scaling adapters could not be read (the API server's error,
/// e.g. NVIDIA's conversion webhook down: never taken as "not found"): `TargetResolved` Unknown,
/// the replicas left as they are; the reconcile still fails, so it is retried with back-off.
async fn report_unavailable(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    error: KubeError,
) -> Result<Action, Error> {
    let message = format!(
        "{}; the replicas are left as they are until the target can be read again",
        common::chain(&error)
    );
    let outcome = Outcome {
        conditions: vec![DesiredCondition::unknown(
            TARGET_RESOLVED,
            "TargetUnavailable",
            &message,
        )],
        message,
        ..Outcome::default()
    };
    write_status(policy, ctx, &outcome).await?;
    Err(Error::Kube(error))
}

/// Reports what keeps the planner from running, with a Warning Event when the status changes.
async fn report_blocked(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    condition: DesiredCondition,
) -> Result<Action, Error> {
    report_with(policy, ctx, condition, None).await
}

/// [`report_blocked`], with the target's KV-transfer topology when it was read.
async fn report_with(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    condition: DesiredCondition,
    kv_transfer: Option<Option<planner_api::KvTransferStatus>>,
) -> Result<Action, Error> {
    let message = condition.message.clone();
    let outcome = Outcome {
        conditions: vec![condition],
        message: message.clone(),
        kv_transfer,
        ..Outcome::default()
    };
    if write_status(policy, ctx, &outcome).await? {
        common::publish(
            &ctx.base.recorder,
            policy,
            EventType::Warning,
            "InvalidSpec",
            "Plan",
            &message,
        )
        .await;
    }
    Ok(Action::requeue(RETRY))
}

/// Warning Events. Missing metrics are a fault: reported every interval they last, which the
/// Event recorder counts in one series (as the HPA reports `FailedGetResourceMetric`). A bound or
/// the budget limiting a decision is a state, mirrored by the `ScalingLimited` condition: reported
/// when it starts or changes.
async fn publish_warnings(policy: &PlannerPolicy, ctx: &PlannerContext, outcome: &Outcome) {
    let bad = |type_: &str, status: &str| {
        outcome
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
    };
    if let Some(unavailable) = bad(METRICS_AVAILABLE, "False") {
        let note = &unavailable.message;
        common::publish(
            &ctx.base.recorder,
            policy,
            EventType::Warning,
            "MetricsUnavailable",
            "Plan",
            note,
        )
        .await;
    }
    if let Some(limited) = bad(SCALING_LIMITED, "True") {
        let unchanged = policy
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, SCALING_LIMITED))
            .is_some_and(|c| c.status == "True" && c.message == limited.message);
        if !unchanged {
            let note = &limited.message;
            common::publish(
                &ctx.base.recorder,
                policy,
                EventType::Warning,
                "ScalingLimited",
                "Plan",
                note,
            )
            .await;
        }
    }
}

/// The member's Event for a changed grant of its shared budget: `GrantCut` (Warning) when the
/// grant is now short of what it asks for, `GrantRestored` (Normal) when it is whole again.
async fn publish_grant_event(policy: &PlannerPolicy, ctx: &PlannerContext, outcome: &Outcome) {
    let BudgetOutcome::Set(grant) = &outcome.budget else {
        return;
    };
    let previous = policy.status.as_ref().and_then(|s| s.budget.as_ref());
    if let Some((reason, warning)) = member::grant_event(previous, grant) {
        let note = format!("budget {}: {}", grant.name, grant.message);
        common::publish(
            &ctx.base.recorder,
            policy,
            if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason,
            "Plan",
            &note,
        )
        .await;
    }
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
    common::apply_status(&api, &policy.name_any(), &next).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_keep_their_cadence_and_restart_after_a_pause() {
        let interval = Duration::from_secs(60);
        let start = Instant::now();
        let mut next = None;
        assert_eq!(due(&mut next, interval, start), Some(None));
        assert_eq!(next, Some(start + interval));
        assert_eq!(due(&mut next, interval, start + Duration::from_secs(30)), None);
        // Two seconds late: the next one is still on the minute.
        assert_eq!(
            due(&mut next, interval, start + Duration::from_secs(62)),
            Some(Some(Duration::from_secs(2)))
        );
        assert_eq!(next, Some(start + 2 * interval));
        // A pause longer than an interval starts over from now.
        let later = start + Duration::from_secs(500);
        assert!(due(&mut next, interval, later).is_some());
        assert_eq!(next, Some(later + interval));
    }

    #[test]
    fn the_scale_up_delay_is_measured_on_the_process_clock() {
        let mut startup = Startup::default();
        let start = startup.origin + Duration::from_secs(5);
        startup.scaled((1, 1), (3, 1), start);
        let partly = Replicas {
            serving: (2, 1),
            asked: (3, 1),
        };
        startup.observe(partly, start + Duration::from_secs(50));
        assert_eq!(startup.delay(), None);
        assert!(startup.stuck(start + Duration::from_secs(130), Duration::from_secs(120)));
        let all = Replicas {
            serving: (3, 1),
            asked: (3, 1),
        };
        startup.observe(all, start + Duration::from_secs(80));
        assert_eq!(startup.delay(), Some(Duration::from_secs(80)));
    }

    #[test]
    fn a_scale_up_is_stuck_only_after_twice_the_delay_planned_with() {
        let spec: planner_api::PlannerPolicySpec =
            serde_yaml::from_str("targetRef: {name: llm}\nsla: {ttftMs: 500, itlMs: 50}\n").unwrap();
        let mut startup = Startup::default();
        let start = startup.origin + Duration::from_secs(5);
        startup.scaled((1, 1), (3, 1), start);
        let later = start + Duration::from_secs(200);
        // Expecting 5 minutes, a scale-up not up after 200 s is not stuck: more may be asked
        // for before the target is Ready.
        let gate = ready_gate(
            &spec,
            false,
            (&startup, Duration::from_secs(300)),
            (3, 1),
            (4, 1),
            later,
        );
        assert!(matches!(gate, Gate::Open));
        // With the 60 s default it is.
        let gate = ready_gate(
            &spec,
            false,
            (&startup, Duration::from_secs(60)),
            (3, 1),
            (4, 1),
            later,
        );
        assert!(matches!(gate, Gate::Closed));
    }
}

//! The PlannerPolicy reconciler: one operator process plans every policy in the cluster, each
//! through its planning loop ([`planner_core::policy::PolicyLoop`], which the simulator and the
//! replay bridge run too). The reconciler keeps the loop's I/O; a reconcile runs these steps, in
//! this order:
//!
//! 1. **fetch** ([`fetch`]): the target DGD in the policy's namespace;
//! 2. **validate** ([`validate`]): the admission webhook's rules, so a policy the webhook would
//!    deny is reported the same way when the webhook is off; the shared GPU budget it joins; the
//!    pools' scaling adapters;
//! 3. **profile** ([`profile`]): the performance model of the profile (SLA planner only);
//! 4. **wake**: the policy's loop ([`runtime`]) says what is due now;
//! 5. **observe** ([`observe_due`]): what is due reads from Prometheus;
//! 6. **decide**: the loop's planner, guards and budget request;
//! 7. **arbitrate** ([`arbitrate`]): a shared budget's round in the ledger;
//! 8. **settle**: the loop's decision with the grant and the ready gate;
//! 9. **actuate** ([`actuate_decision`]): carry it out through the connector;
//! 10. **report** ([`report`]): status (written only when it changed), Events on transitions,
//!     metrics.
//!
//! Problems with the spec or the target are reported in status and retried on a schedule
//! ([`Halt`]); only API errors fail a reconcile.

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
    runtime::{Controller, controller::Action, watcher},
};
use tracing::{info, warn};

use planner_api::{ConnectorKind, KvTransferStatus, PlannerMode, PlannerPolicy};
use planner_core::{
    interpolation::PerformanceModel,
    policy::{Answer, Decision, Due, Input, PolicyLoop, Proposal, Replicas},
};

use super::{
    Context,
    common::{self, KubeError},
    conditions::{self, DesiredCondition},
    gpu_budget::{BudgetContext, Budgets},
};
use crate::{
    connector::kubernetes::{self, Adapters, ScaleError},
    lookup::TargetLookup,
    metrics::policy::PolicyCounters,
    sources::prometheus::{KvReading, PrometheusClient},
    target::TargetGraph,
    validation::{self, PolicyError, PoolTarget, TargetPools, ValidatedPolicy},
};

pub mod actuate;
pub mod config;
pub mod dereference;
pub mod member;
pub mod observe;
pub mod render;
pub mod report;
pub mod runtime;
pub mod status;

use actuate::{Actuation, Connector, EtcdConnector, KubernetesConnector, ScaleRequest};
use member::Joined;
use render::MetricsOrigin;
pub use report::Actuated;
use report::{Planned, PlannerFacts};
use runtime::PolicyRuntime;
use status::{PROFILE_LOADED, TARGET_RESOLVED};

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
/// Planning loops built at once (warm-up trace read and parsed, history restored). Each warm-up
/// holds its trace ConfigMap (up to 1 MiB) twice while it parses it: unbounded, a thousand
/// policies created together held hundreds of them at once, and the allocator kept the peak
/// (368 MiB resident afterwards, `e2e/bench/policies.sh`).
const STATE_BUILDS: usize = 4;
/// The TTFT quantile read from the histogram when no percentile target is set (for status).
const DEFAULT_TTFT_QUANTILE: f64 = 0.9;

/// Why a reconcile failed (API errors only; problems with the spec or target are reported in
/// status and conditions, and retried on a schedule).
pub use super::common::ApiError as Error;

/// Planning loops, keyed by namespace and name; each behind its own lock so policies plan
/// concurrently.
type Runtimes = HashMap<(String, String), Arc<tokio::sync::Mutex<PolicyRuntime>>>;

/// Why a prometheus client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PrometheusClientError {
    /// The bearer token could not be read.
    #[error(transparent)]
    Token(#[from] dereference::TokenError),
    /// The URL is not one a client can use.
    #[error("{0}")]
    Url(String),
    /// A lock was poisoned by a panic elsewhere.
    #[error("internal lock poisoned")]
    Poisoned,
}

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
    /// The shared GPU budgets: their ledger, cache and wakes (the GpuBudget controller's too).
    pub budgets: Arc<Budgets>,
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
            budgets: Arc::new(Budgets::default()),
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

    /// The GpuBudget controller's context: the same budgets.
    pub fn budget_context(&self) -> Arc<BudgetContext> {
        Arc::new(BudgetContext {
            base: Arc::clone(&self.base),
            budgets: Arc::clone(&self.budgets),
        })
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
    fn prometheus(
        &self,
        url: &str,
        token: Option<String>,
    ) -> Result<PrometheusClient, PrometheusClientError> {
        let key = crate::sources::prometheus::identity(url, token.as_deref());
        let mut clients = self
            .prometheus
            .lock()
            .map_err(|_| PrometheusClientError::Poisoned)?;
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        let client = PrometheusClient::new(url, PROMETHEUS_TIMEOUT)
            .map_err(|e| PrometheusClientError::Url(e.to_string()))?
            .with_bearer_token(token);
        // Rotated tokens leave old clients behind: start over rather than grow without bound.
        if clients.len() >= MAX_PROMETHEUS_CLIENTS {
            clients.clear();
        }
        clients.insert(key, client.clone());
        Ok(client)
    }

    /// The client a policy reads its metrics with: its Prometheus, with its bearer token.
    async fn policy_prometheus(
        &self,
        policy: &PlannerPolicy,
    ) -> Result<PrometheusClient, PrometheusClientError> {
        let token = dereference::prometheus_token(&self.base.client, policy).await?;
        self.prometheus(&self.prometheus_url(policy), token)
    }

    /// Forgets a deleted policy: its planning loop, its metric series and its place in a shared
    /// budget (its GPUs go to the other members at once).
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

/// Why a reconcile stopped before its report step.
enum Halt {
    /// The target or its adapters could not be read.
    Unavailable(KubeError),
    /// The webhook's rules reject the policy, its target or its budget.
    Invalid {
        errors: Vec<PolicyError>,
        kv_transfer: Option<Option<KvTransferStatus>>,
    },
    /// The planner cannot run yet.
    Blocked(DesiredCondition),
    /// Nothing to do until this.
    Sleep(Action),
    /// An API error.
    Api(Error),
}

impl From<Error> for Halt {
    fn from(error: Error) -> Self {
        Self::Api(error)
    }
}

impl Halt {
    /// Reports why the reconcile stopped.
    async fn report(self, policy: &PlannerPolicy, ctx: &PlannerContext) -> Result<Action, Error> {
        match self {
            Self::Unavailable(error) => report::unavailable(policy, ctx, error).await,
            Self::Invalid { errors, kv_transfer } => report::invalid(policy, ctx, &errors, kv_transfer).await,
            Self::Blocked(condition) => report::blocked(policy, ctx, condition, None).await,
            Self::Sleep(action) => Ok(action),
            Self::Api(error) => Err(error),
        }
    }
}

async fn reconcile_policy(policy: &PlannerPolicy, ctx: &PlannerContext) -> Result<Action, Error> {
    match plan(policy, ctx).await {
        Ok(action) => Ok(action),
        Err(halt) => halt.report(policy, ctx).await,
    }
}

/// A reconcile's steps, in the order they run.
async fn plan(policy: &PlannerPolicy, ctx: &PlannerContext) -> Result<Action, Halt> {
    let target = fetch(policy, ctx).await?;
    let checked = validate(policy, ctx, target).await?;
    let (model, model_source) = profile(policy, ctx).await?;
    let runtime = runtime::runtime_for(policy, ctx, &checked.validated, checked.joined.as_ref(), model).await;
    let mut runtime = runtime.lock().await;
    let interval = checked.validated.interval;
    let replicas = checked.replicas();
    let prometheus = ctx.policy_prometheus(policy).await;
    let (namespace, name) = (policy.namespace().unwrap_or_default(), policy.name_any());
    let reads = Reads {
        query: checked.query(policy, prometheus.as_ref()),
        fast: &ctx.fast,
        fast_period: checked.validated.fast_check_period,
        metrics: ctx.base.metrics.policies.of(&namespace, &name),
    };
    let now = runtime.now();
    let model = runtime.model.clone();
    let member = checked.joined.is_some();
    let woken = wake(
        &mut runtime.policy,
        model.as_deref(),
        (now, replicas, checked.ready()),
        &reads,
        member,
        |proposal| arbitrate(policy, ctx, &checked, proposal, replicas),
    )
    .await;
    let Some(Woken { decision, kv }) = woken else {
        return Ok(runtime.next_wake(interval));
    };
    let actuated = actuate_decision(policy, ctx, &checked, &mut runtime, &decision, replicas).await;
    settle_ledger(policy, ctx, &checked, &actuated, &decision, replicas);
    let origin = MetricsOrigin {
        dynamo_namespace: checked.validated.dynamo_namespace.clone(),
        url: crate::sources::prometheus::redact(&ctx.prometheus_url(policy)),
    };
    let planned = Planned {
        rendered: render::render(&decision, &origin, kv.as_ref()),
        decision: &decision,
        actuated,
        conditions: checked.conditions(model_source),
        serving: replicas.serving,
        aggregated: checked.validated.target.aggregated,
        kv_transfer: checked.dgd.kv_transfer.clone(),
        left_budget: !member && policy.status.as_ref().is_some_and(|s| s.budget.is_some()),
        attainment: runtime.policy.attainment_counts(now),
        targets: (
            policy.spec.sla.ttft_ms,
            policy.spec.sla.itl_ms,
            policy.spec.sla.ttft_percentile,
        ),
        planner: PlannerFacts {
            interval,
            gpus_per_engine: (
                checked.validated.target.prefill.gpus,
                checked.validated.target.decode.gpus,
            ),
            sla: runtime.policy.sla_targets(),
            uses_corrections: runtime.policy.uses_corrections(),
        },
    };
    report::planned(policy, ctx, planned).await?;
    Ok(runtime.next_wake(interval))
}

/// What the operator reads for a policy's loop: its Prometheus, and the fast path's shared
/// snapshots.
pub struct Reads<'a> {
    /// The policy's Prometheus and what to ask it.
    pub query: observe::MetricsQuery<'a>,
    /// Fast-path snapshots shared by every policy.
    pub fast: &'a observe::FastCache,
    /// The fast path's period (snapshots are shared within half of it).
    pub fast_period: Duration,
    /// Where missing metrics and lateness are counted.
    pub metrics: PolicyCounters<'a>,
}

/// A wake that decided something.
pub struct Woken {
    /// The loop's decision.
    pub decision: Decision,
    /// The decode KV usage the interval read (for status).
    pub kv: Option<KvReading>,
}

/// Steps 4 to 8 (wake, observe, decide, arbitrate, settle): the policy's planning loop at `now`,
/// with the target's replicas and readiness, on what the operator reads; `None` when nothing is
/// due, or a check found nothing to do. Between checks a shared budget's `member` looks at its
/// grant; `arbitrate` runs the budget's round on the loop's request.
pub async fn wake(
    policy: &mut PolicyLoop,
    model: Option<&PerformanceModel>,
    (now, replicas, ready): (Duration, Replicas, Option<bool>),
    reads: &Reads<'_>,
    member: bool,
    arbitrate: impl FnOnce(&Proposal) -> Option<Answer>,
) -> Option<Woken> {
    let due = policy.due(now, replicas);
    let (input, kv) = observe_due(due, policy.reads_samples(), reads, member).await?;
    let proposal = policy.decide(now, input, replicas, model);
    if proposal.is_idle() {
        return None;
    }
    let answer = arbitrate(&proposal);
    let decision = policy.settle(now, proposal, answer.as_ref(), replicas, ready);
    Some(Woken { decision, kv })
}

/// Step 1, **fetch**: the target DGD (`None` when there is none), of either served version.
async fn fetch(policy: &PlannerPolicy, ctx: &PlannerContext) -> Result<Option<TargetGraph>, Halt> {
    match dereference::target(&ctx.base.client, policy).await {
        Ok(TargetLookup::Found(graph)) => Ok(Some(*graph)),
        Ok(TargetLookup::NotFound) => Ok(None),
        Ok(TargetLookup::Unreadable(error)) => {
            let namespace = policy.namespace().unwrap_or_default();
            Err(Halt::Invalid {
                errors: validation::validate_unreadable(&policy.spec, &namespace, &error, &ctx.tenancy),
                kv_transfer: None,
            })
        }
        Err(error) => Err(Halt::Unavailable(error)),
    }
}

/// A policy checked against its target: what the later steps plan with.
struct Checked {
    dgd: TargetGraph,
    validated: ValidatedPolicy,
    joined: Option<Joined>,
    adapters: Adapters,
    connector: ConnectorKind,
}

impl Checked {
    /// The pools' replicas: asked for (the scaling adapter's `spec.replicas` where it has one,
    /// the adapter owning them, else the DGD's) and serving (the DGD status's available, else
    /// ready, else those asked for).
    fn replicas(&self) -> Replicas {
        let target = &self.validated.target;
        let asked = |pool: &PoolTarget| {
            self.adapters
                .get(&pool.component)
                .map_or(pool.replicas, |a| a.spec_replicas)
        };
        let asked = (asked(&target.prefill), asked(&target.decode));
        Replicas {
            serving: serving(&self.dgd, target, asked),
            asked,
        }
    }

    /// Whether the target is Ready, for the ready gate (`None`: the virtual connector, which has
    /// no notion of it).
    fn ready(&self) -> Option<bool> {
        let target = &self.validated.target;
        (self.connector == ConnectorKind::Kubernetes).then(|| {
            actuate::is_ready(
                &self.dgd,
                (&target.prefill.component, &target.decode.component),
                &self.adapters,
            )
        })
    }

    /// What to ask the policy's Prometheus (`client`, or why there is none).
    fn query<'a>(
        &'a self,
        policy: &PlannerPolicy,
        client: Result<&'a PrometheusClient, &'a PrometheusClientError>,
    ) -> observe::MetricsQuery<'a> {
        let validated = &self.validated;
        observe::MetricsQuery {
            client,
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
            prefill_engines: self.replicas().serving.0,
        }
    }

    /// `TargetResolved`, and `ProfileLoaded` when a profile was loaded.
    fn conditions(&self, model_source: Option<String>) -> Vec<DesiredCondition> {
        let target = &self.validated.target;
        let mut conditions = vec![DesiredCondition::met(
            TARGET_RESOLVED,
            "Resolved",
            if target.aggregated {
                format!(
                    "aggregated worker component {:?} (prefill and decode on the same engines)",
                    target.decode.component
                )
            } else {
                format!(
                    "prefill component {:?}, decode component {:?}",
                    target.prefill.component, target.decode.component
                )
            },
        )];
        if let Some(source) = model_source {
            conditions.push(DesiredCondition::met(
                PROFILE_LOADED,
                "Loaded",
                format!("profile {source}"),
            ));
        }
        conditions
    }
}

/// Available replicas of both pools from the DGD status, NVIDIA's or this operator's (ready when
/// available is not reported), else those asked for.
fn serving(dgd: &TargetGraph, target: &TargetPools, asked: (u32, u32)) -> (u32, u32) {
    (
        dgd.serving(&target.prefill.component).unwrap_or(asked.0),
        dgd.serving(&target.decode.component).unwrap_or(asked.1),
    )
}

/// Step 2, **validate**: the webhook's rules on the policy and its target, the shared budget it
/// joins, the pools' scaling adapters.
async fn validate(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    dgd: Option<TargetGraph>,
) -> Result<Checked, Halt> {
    let namespace = policy.namespace().unwrap_or_default();
    let kv_transfer = dgd.as_ref().map(|graph| graph.kv_transfer.clone());
    let invalid = |errors| Halt::Invalid {
        errors,
        kv_transfer: kv_transfer.clone(),
    };
    let validated =
        validation::validate(&policy.spec, &namespace, dgd.as_ref(), &ctx.tenancy).map_err(invalid)?;
    // validate() reports a missing target.
    let Some(dgd) = dgd else {
        return Err(Halt::Sleep(Action::requeue(RETRY)));
    };
    let joined = member::membership(policy, &ctx.budgets, &validated, Instant::now())
        .await
        .map_err(invalid)?;
    // The pools' scaling adapters, where NVIDIA's operator made them: they own those replicas.
    let adapters = if policy.spec.connector.kind == ConnectorKind::Kubernetes {
        let pools = [
            validated.target.prefill.component.as_str(),
            validated.target.decode.component.as_str(),
        ];
        match kubernetes::adapters(&ctx.base.client, &dgd, &pools).await {
            Ok(adapters) => adapters,
            Err(ScaleError::Api { action, source }) => {
                return Err(Halt::Unavailable(KubeError { action, source }));
            }
            Err(other) => {
                warn!(error = %common::chain(&other), "cannot read the scaling adapters");
                Adapters::new()
            }
        }
    } else {
        Adapters::new()
    };
    Ok(Checked {
        dgd,
        validated,
        joined,
        adapters,
        connector: policy.spec.connector.kind,
    })
}

/// Step 3, **profile**: the performance model and where it came from (the load planner needs
/// none).
async fn profile(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
) -> Result<(Option<Arc<PerformanceModel>>, Option<String>), Halt> {
    if policy.spec.mode == PlannerMode::Load {
        return Ok((None, None));
    }
    match ctx.models.model(&ctx.base.client, policy).await {
        Ok((model, source)) => Ok((Some(model), Some(source))),
        Err(error) => {
            let message = common::chain(&error);
            Err(Halt::Blocked(DesiredCondition::unmet(
                PROFILE_LOADED,
                "ProfileInvalid",
                &message,
            )))
        }
    }
}

/// Step 5, **observe**: what the due check reads from Prometheus, with the decode KV usage read
/// (`samples`: the load planner's, else the frontend's metrics); between checks a budget
/// `member` looks at its grant, anyone else sleeps (`None`).
async fn observe_due(
    due: Due,
    samples: bool,
    reads: &Reads<'_>,
    member: bool,
) -> Option<(Input, Option<KvReading>)> {
    match due {
        Due::Interval { late, .. } => {
            if let Some(late) = late {
                reads.metrics.lateness(late.as_secs_f64());
            }
            let (observed, kv) = observe::observe(samples, &reads.query, reads.metrics).await;
            Some((Input::Interval(observed), kv))
        }
        Due::Fast { window } => {
            let signals =
                observe::fast_signals(&reads.query, reads.fast, window, reads.fast_period, reads.metrics)
                    .await;
            Some((Input::Fast(signals), None))
        }
        Due::Idle if member => Some((Input::Grant, None)),
        Due::Idle => None,
    }
}

/// Step 7, **arbitrate**: a member's request through the budget's ledger (a round over every
/// live member); the answer, and the members whose allowance the round changed are woken.
fn arbitrate(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    checked: &Checked,
    proposal: &Proposal,
    replicas: Replicas,
) -> Option<Answer> {
    let (joined, ask) = (checked.joined.as_ref()?, proposal.ask.clone()?);
    let key = (policy.namespace().unwrap_or_default(), policy.name_any());
    let ask = member::ledger_ask(ask, checked.validated.interval);
    let held = vec![replicas.asked.0, replicas.asked.1];
    let (answer, wakes) = ctx.budgets.broker.ask(
        &joined.membership.name,
        joined.total,
        &key,
        ask,
        held,
        Instant::now(),
    )?;
    ctx.budgets.wake(wakes);
    Some(answer)
}

/// Step 9, **actuate**: what the decision scales to, through the policy's connector.
async fn actuate_decision(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    checked: &Checked,
    runtime: &mut PolicyRuntime,
    decision: &Decision,
    replicas: Replicas,
) -> Actuated {
    let Some(to) = decision.scale_to else {
        return Actuated::default();
    };
    let target = &checked.validated.target;
    let request = ScaleRequest {
        target: to,
        components: (&target.prefill.component, &target.decode.component),
        graph: &checked.dgd,
    };
    let now = runtime.now();
    match policy.spec.connector.kind {
        ConnectorKind::Kubernetes => {
            let mut connector = KubernetesConnector {
                client: ctx.base.client.clone(),
                adapters: checked.adapters.clone(),
            };
            actuate(&mut runtime.policy, &mut connector, &request, now, replicas.asked).await
        }
        ConnectorKind::Virtual => {
            let spec = &policy.spec.connector;
            let etcd = runtime.etcd.get_or_insert_with(|| {
                EtcdConnector::new(
                    spec.etcd
                        .as_ref()
                        .map(|e| e.endpoints.clone())
                        .unwrap_or_default(),
                    spec.dynamo_namespace
                        .clone()
                        .unwrap_or_else(|| checked.validated.dynamo_namespace.clone()),
                    checked.validated.decision_timeout,
                )
            });
            actuate(&mut runtime.policy, etcd, &request, now, replicas.asked).await
        }
    }
}

/// Carries `request` out through `connector`; a change that went through is told to the loop
/// (for the scale-up delay it measures).
pub async fn actuate(
    policy: &mut PolicyLoop,
    connector: &mut impl Connector,
    request: &ScaleRequest<'_>,
    now: Duration,
    asked: (u32, u32),
) -> Actuated {
    match connector.scale(request).await {
        Actuation::Scaled { decision_id } => {
            policy.actuated(now, asked, request.target);
            Actuated {
                from: Some(asked),
                decision_id,
                note: None,
            }
        }
        Actuation::Unchanged => Actuated::default(),
        Actuation::Deferred(reason) | Actuation::Failed(reason) => Actuated {
            note: Some(reason),
            ..Actuated::default()
        },
    }
}

/// What the pools hold after acting, for the budget's ledger (a reservation not used is
/// released).
fn settle_ledger(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    checked: &Checked,
    actuated: &Actuated,
    decision: &Decision,
    replicas: Replicas,
) {
    let Some(joined) = &checked.joined else {
        return;
    };
    if decision.check != planner_core::policy::Check::Interval && decision.target.is_none() {
        // Nothing carried out between decisions: the ask stands.
        return;
    }
    let held = match (actuated.from, decision.scale_to) {
        (Some(_), Some(to)) => to,
        _ => replicas.asked,
    };
    let key = (policy.namespace().unwrap_or_default(), policy.name_any());
    ctx.budgets.wake(ctx.budgets.broker.settle(
        &joined.membership.name,
        &key,
        vec![held.0, held.1],
        Instant::now(),
    ));
}

fn unix_now() -> f64 {
    Timestamp::now().as_millisecond() as f64 / 1000.0
}

//! GpuBudgets: GPUs several PlannerPolicies share. Three pieces, one owner each:
//!
//! - the **ledger** ([`broker`]): every member's request, holdings and grant, in the leader's
//!   memory; PlannerPolicy reconciles ask it at each decision and settle what they did;
//! - the **member's side**: the PlannerPolicy reconciler turns its decision into a request, acts
//!   on what it may hold now, and writes its own status and Events (`status.budget`,
//!   `GrantCut`);
//! - the **budget's side** (this module's reconciler): the GpuBudget's status and its Events,
//!   written from the ledger, only when they change, with server-side apply and the operator's
//!   one field manager.
//!
//! Wakes keep it quick: when a round changes what another member may hold (a burst cuts it, a
//! release lets it grow), that member's reconcile is queued at once instead of waiting for its
//! interval, and the budget's status is rewritten.

pub mod broker;
pub mod status;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, ResourceExt,
    core::DeserializeGuard,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::EventType,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use planner_api::{GpuBudget, PlannerPolicy};

use super::{Context, common};

/// What the GpuBudget controller runs on: the operator's client, recorder and metrics, and the
/// budgets it shares with the PlannerPolicy controller.
pub struct BudgetContext {
    /// Client, recorder and metrics.
    pub base: Arc<Context>,
    /// The budgets' ledger, cache and wakes.
    pub budgets: Arc<Budgets>,
}

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "gpubudget";
/// How often a budget's status is refreshed without a change (members that stopped reporting
/// expire).
const RESYNC: Duration = Duration::from_secs(30);
/// Retry delay after an API error.
const ERROR_RETRY: Duration = Duration::from_secs(15);
/// Wakes queued at most; past it a wake is dropped and the member acts at its next interval or
/// fast check instead.
const WAKE_QUEUE: usize = 1024;
/// How long a reconcile waits for the budgets' cache at start.
const CACHE_WAIT: Duration = Duration::from_secs(10);

type PolicyRef = ObjectRef<DeserializeGuard<PlannerPolicy>>;
type BudgetRef = ObjectRef<DeserializeGuard<GpuBudget>>;

/// What the GpuBudget controller takes when it starts.
struct RunParts {
    writer: reflector::store::Writer<DeserializeGuard<GpuBudget>>,
    budget_wakes: mpsc::Receiver<BudgetRef>,
}

/// The budgets as every reconcile sees them: the ledger, the GpuBudgets' cache and the wakes.
pub struct Budgets {
    /// The ledger.
    pub broker: broker::Broker,
    store: Store<DeserializeGuard<GpuBudget>>,
    parts: Mutex<Option<RunParts>>,
    policy_wake_receiver: Mutex<Option<mpsc::Receiver<PolicyRef>>>,
    policy_wakes: mpsc::Sender<PolicyRef>,
    budget_wakes: mpsc::Sender<BudgetRef>,
    /// The namespace the operator watches (`None`: all), once the controllers run.
    scope: std::sync::OnceLock<Option<String>>,
}

impl Default for Budgets {
    fn default() -> Self {
        let (store, writer) = reflector::store();
        let (policy_tx, policy_rx) = mpsc::channel(WAKE_QUEUE);
        let (budget_tx, budget_rx) = mpsc::channel(WAKE_QUEUE);
        Self {
            broker: broker::Broker::default(),
            store,
            parts: Mutex::new(Some(RunParts {
                writer,
                budget_wakes: budget_rx,
            })),
            policy_wake_receiver: Mutex::new(Some(policy_rx)),
            policy_wakes: policy_tx,
            budget_wakes: budget_tx,
            scope: std::sync::OnceLock::new(),
        }
    }
}

/// A GpuBudget lookup.
pub enum Lookup {
    /// Found.
    Found(Arc<GpuBudget>),
    /// No budget of that name.
    NotFound,
    /// The cache is not ready, or the object cannot be parsed.
    Unreadable(String),
}

impl Budgets {
    /// Queues the reconciles a round asked for.
    pub fn wake(&self, wakes: broker::Wakes) {
        for (namespace, name) in wakes.members {
            let object = ObjectRef::new(&name).within(&namespace);
            if self.policy_wakes.try_send(object).is_err() {
                debug!(%namespace, %name, "wake queue full; the member acts at its next check");
            }
        }
        for name in wakes.budgets {
            let _ = self.budget_wakes.try_send(ObjectRef::new(&name));
        }
    }

    /// The GpuBudget `name` from the cache (waiting for it to fill at start).
    pub async fn get(&self, name: &str) -> Lookup {
        if tokio::time::timeout(CACHE_WAIT, self.store.wait_until_ready())
            .await
            .is_err()
        {
            return Lookup::Unreadable("the operator's GpuBudget cache is not filled yet".into());
        }
        match self.store.get(&ObjectRef::new(name)) {
            None => Lookup::NotFound,
            Some(guard) => match &guard.0 {
                Ok(budget) => Lookup::Found(Arc::new(budget.clone())),
                Err(invalid) => Lookup::Unreadable(invalid.error.to_string()),
            },
        }
    }

    /// The PlannerPolicy wakes, for the PlannerPolicy controller's `reconcile_on` (once).
    pub fn take_policy_wakes(&self) -> Option<impl futures::Stream<Item = PolicyRef> + Send + 'static> {
        let receiver = self.policy_wake_receiver.lock().ok()?.take()?;
        Some(futures::stream::unfold(receiver, |mut rx| async move {
            rx.recv().await.map(|object| (object, rx))
        }))
    }

    /// Records the namespace the operator watches (`None`: all), before the controllers run.
    pub fn set_scope(&self, namespace: Option<String>) {
        let _ = self.scope.set(namespace);
    }

    /// Starts `budget`'s ledger from its status when this process has none (a new leader), with
    /// the members of the watched namespace only.
    pub fn restore(&self, budget: &GpuBudget, now: Instant) {
        let Some(previous) = &budget.status else {
            return;
        };
        let mut mine = previous.clone();
        if let Some(Some(namespace)) = self.scope.get() {
            mine.members.retain(|m| &m.namespace == namespace);
        }
        let total = u64::try_from(budget.spec.total_gpus).unwrap_or(0);
        self.broker.restore(&budget.name_any(), total, &mine, now);
    }
}

/// Why a reconcile failed (API errors only).
pub use super::common::ApiError as Error;

/// Runs the GpuBudget controller until `shutdown` resolves. `namespace` is the operator's watch
/// scope: scoped to one namespace, it writes the status of budgets its policies joined and
/// publishes no Events about budgets (those live in the `default` namespace).
pub async fn run(
    ctx: Arc<BudgetContext>,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let Some(parts) = ctx.budgets.parts.lock().ok().and_then(|mut p| p.take()) else {
        warn!("the GpuBudget controller was started twice; not starting it again");
        return;
    };
    let RunParts {
        writer, budget_wakes, ..
    } = parts;
    let api: Api<DeserializeGuard<GpuBudget>> = Api::all(ctx.base.client.clone());
    let stream = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let wakes = futures::stream::unfold(budget_wakes, |mut rx| async move {
        rx.recv().await.map(|object| (object, rx))
    });
    ctx.budgets.set_scope(namespace.clone());
    let scoped = Arc::new(Scope { namespace });
    // Drop the metric series of deleted budgets.
    let pruner = {
        let (ctx, store) = (Arc::clone(&ctx), ctx.budgets.store.clone());
        async move {
            let mut tick = tokio::time::interval(RESYNC);
            loop {
                tick.tick().await;
                let live = store.state().iter().map(|b| b.name_any()).collect();
                ctx.base.metrics.budgets.retain(&live);
            }
        }
    };
    let controller = Controller::for_stream(stream, ctx.budgets.store.clone())
        .reconcile_on(wakes)
        .graceful_shutdown_on(shutdown)
        .run(
            move |guard, ctx| {
                let scope = Arc::clone(&scoped);
                async move { reconcile(guard, ctx, scope).await }
            },
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(error) = result {
                debug!(%error, "gpubudget controller event");
            }
        });
    tokio::select! {
        () = controller => {},
        () = pruner => {},
    }
}

/// The operator's watch scope.
struct Scope {
    namespace: Option<String>,
}

async fn reconcile(
    guard: Arc<DeserializeGuard<GpuBudget>>,
    ctx: Arc<BudgetContext>,
    scope: Arc<Scope>,
) -> Result<Action, Error> {
    common::guarded_reconcile(
        CONTROLLER,
        &ctx.base.metrics,
        &guard,
        async |budget| reconcile_budget(budget, &ctx, &scope).await,
        async |_, _| {},
    )
    .await
}

fn error_policy(guard: Arc<DeserializeGuard<GpuBudget>>, error: &Error, _ctx: Arc<BudgetContext>) -> Action {
    let name = guard.0.as_ref().map(ResourceExt::name_any).unwrap_or_default();
    warn!(%name, error = %common::chain(error), "reconcile failed; retrying");
    Action::requeue(ERROR_RETRY)
}

/// Writes a budget's status from the ledger: restores the ledger from the status when this
/// process has none, applies a changed total, expires members that stopped reporting, then
/// writes status and Events when they changed.
async fn reconcile_budget(budget: &GpuBudget, ctx: &BudgetContext, scope: &Scope) -> Result<Action, Error> {
    let name = budget.name_any();
    let total = u64::try_from(budget.spec.total_gpus).unwrap_or(0);
    let now = Instant::now();
    let broker = &ctx.budgets.broker;
    // 1. Restore (a new leader) and the total.
    ctx.budgets.restore(budget, now);
    ctx.budgets.wake(broker.set_total(&name, total, now));
    // 2. The ledger, after expiries.
    let view = match broker.view(&name, now) {
        Some((view, wakes)) => {
            ctx.budgets.wake(wakes);
            Some(view)
        }
        None => None,
    };
    if view.is_none() && scope.namespace.is_some() {
        // Scoped to one namespace, and none of its policies joined: not ours to write.
        return Ok(Action::requeue(RESYNC));
    }
    // 3. Status, when it changed.
    let next = status::next(
        budget.status.as_ref(),
        budget.metadata.generation,
        total,
        view.as_ref(),
        Timestamp::now(),
    );
    ctx.base
        .metrics
        .budgets
        .record(&name, &status::budget_gpus(total, &next));
    if !status::differs(budget.status.as_ref(), &next) {
        return Ok(Action::requeue(RESYNC));
    }
    let api: Api<GpuBudget> = Api::all(ctx.base.client.clone());
    common::apply_status(&api, &name, &next).await?;
    // 4. An Event for each grant cut since the last status.
    if scope.namespace.is_none() {
        for member in status::cuts(budget.status.as_ref(), &next) {
            let note = format!("{}/{}: {}", member.namespace, member.name, member.message);
            common::publish(
                &ctx.base.recorder,
                budget,
                EventType::Warning,
                "GrantCut",
                "Arbitrate",
                &note,
            )
            .await;
        }
    }
    Ok(Action::requeue(RESYNC))
}

//! One policy's planning loop between reconciles, and the clock it runs on: built (warmed up
//! and restored from Prometheus history) on the policy's first reconcile or when settings that
//! shape its state change, and given the spec's other settings at every reconcile.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use kube::{ResourceExt, runtime::controller::Action};
use tracing::info;

use planner_api::{PlannerMode, PlannerPolicy};
use planner_core::{
    interpolation::PerformanceModel,
    policy::{Planner, PolicyLoop},
    state::SlaPlanner,
};

use super::{PlannerContext, actuate::EtcdConnector, config, dereference, member::Joined, unix_now};
use crate::{sources::prometheus::SeriesFilter, validation::ValidatedPolicy};

/// One policy's planning loop and what it keeps between reconciles.
pub struct PolicyRuntime {
    /// The settings the loop was built for; a change builds a new one.
    fingerprint: String,
    /// The loop.
    pub policy: PolicyLoop,
    /// The performance model of the profile (SLA planner).
    pub model: Option<Arc<PerformanceModel>>,
    /// The virtual connector's etcd session (kept for its protocol state).
    pub etcd: Option<EtcdConnector>,
    /// The loop's clock origin: the loop reads no clock; its times are durations from here.
    origin: Instant,
}

impl PolicyRuntime {
    /// Now, on the loop's clock.
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// `at` on the loop's clock.
    pub fn at(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.origin)
    }

    /// Requeue at the loop's next wake.
    pub fn next_wake(&self, interval: Duration) -> Action {
        let wait = self
            .policy
            .next_wake()
            .map_or(interval, |next| next.saturating_sub(self.now()));
        Action::requeue(wait.max(Duration::from_millis(100)))
    }
}

/// What a change of which builds a new loop: the planner's kind and model, its predictor, its
/// cadence, its target and its connector.
fn fingerprint(policy: &PlannerPolicy) -> String {
    let spec = &policy.spec;
    serde_json::to_string(&(
        spec.mode,
        spec.sla.model,
        &spec.adjustment_interval,
        &spec.predictor,
        &spec.target_ref,
        &spec.connector,
    ))
    .unwrap_or_default()
}

/// The policy's loop, built on first use or when its fingerprint changed, else given the spec's
/// current settings (targets, bounds, a budget, a new profile version).
pub async fn runtime_for(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    validated: &ValidatedPolicy,
    joined: Option<&Joined>,
    model: Option<Arc<PerformanceModel>>,
) -> Arc<tokio::sync::Mutex<PolicyRuntime>> {
    let key = (policy.namespace().unwrap_or_default(), policy.name_any());
    let spec = &policy.spec;
    let fingerprint = fingerprint(policy);
    let settings = config::loop_settings(spec, validated, joined.map(|j| j.membership.clone()));
    let existing = ctx.runtimes.lock().ok().and_then(|r| r.get(&key).cloned());
    if let Some(existing) = existing {
        let mut runtime = existing.lock().await;
        let kept = runtime.fingerprint == fingerprint
            && match spec.mode {
                PlannerMode::Load => runtime
                    .policy
                    .set_load_config(config::load_config(spec, validated), validated.target.aggregated),
                PlannerMode::Sla | PlannerMode::Observe => {
                    runtime.policy.set_sla_config(config::sla_config(spec, validated))
                }
            };
        if kept {
            runtime.policy.set_settings(settings);
            if model.is_some() {
                runtime.model = model;
            }
            drop(runtime);
            return existing;
        }
        info!("planner settings changed; starting a new planning loop");
    }
    let planner = match (spec.mode, &model) {
        (PlannerMode::Load, _) | (_, None) => {
            Planner::load(config::load_config(spec, validated), validated.target.aggregated)
        }
        (PlannerMode::Sla | PlannerMode::Observe, Some(_)) => {
            let config = config::sla_config(spec, validated);
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
            Planner::Sla {
                planner: Box::new(planner),
                config: Box::new(config),
            }
        }
    };
    let runtime = Arc::new(tokio::sync::Mutex::new(PolicyRuntime {
        fingerprint,
        policy: PolicyLoop::new(planner, settings),
        model,
        etcd: None,
        origin: Instant::now(),
    }));
    if let Ok(mut runtimes) = ctx.runtimes.lock() {
        runtimes.insert(key, Arc::clone(&runtime));
    }
    runtime
}

//! The report step: the PlannerPolicy's status (written only when it changed, with server-side
//! apply), its Events and its metrics, from what the reconcile decided and did; and the reports
//! of a reconcile that stopped before planning.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, ResourceExt,
    runtime::{controller::Action, events::EventType},
};
use tracing::info;

use planner_api::{KvTransferStatus, LastDecision, PlannerPolicy, PoolReplicas};
use planner_core::{
    policy::{Check, Decision, MetricsState},
    sla::SlaTargets,
};

use super::{
    Error, PlannerContext, RETRY,
    conditions::{self, DesiredCondition},
    member,
    render::Rendered,
    status::{self, BudgetOutcome, METRICS_AVAILABLE, Outcome, READY, SCALING_LIMITED, TARGET_RESOLVED},
};
use crate::{
    controller::common::{self, KubeError},
    metrics::policy::{IntervalReport, ObservedFigures, SlaReport},
    validation::{self, PolicyError},
};

/// What the actuate step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Actuated {
    /// The replicas asked for before a change that went through.
    pub from: Option<(u32, u32)>,
    /// The virtual connector's decision id.
    pub decision_id: Option<i64>,
    /// Why a change did not go through (the connector's words).
    pub note: Option<String>,
}

/// Everything the report of a planned reconcile needs.
pub struct Planned<'a> {
    /// The loop's decision.
    pub decision: &'a Decision,
    /// Its rendering.
    pub rendered: Rendered,
    /// What the actuate step did.
    pub actuated: Actuated,
    /// Conditions the earlier steps set (`TargetResolved`, `ProfileLoaded`).
    pub conditions: Vec<DesiredCondition>,
    /// Replicas serving and asked for when the reconcile ran.
    pub serving: (u32, u32),
    /// One aggregated worker pool.
    pub aggregated: bool,
    /// The target's KV-transfer topology.
    pub kv_transfer: Option<KvTransferStatus>,
    /// The policy left a shared budget.
    pub left_budget: bool,
    /// The last hour's intervals with traffic, and those that met the SLA.
    pub attainment: (usize, usize),
    /// The SLA targets: TTFT and ITL (ms), the TTFT percentile targeted.
    pub targets: (f64, f64, Option<f64>),
    /// What the planner plans with, for the metrics.
    pub planner: PlannerFacts,
}

/// What the policy's planner plans with, for its metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlannerFacts {
    /// The adjustment interval.
    pub interval: Duration,
    /// GPUs of one prefill and one decode replica.
    pub gpus_per_engine: (u32, u32),
    /// The SLA it plans for (`None`: the load planner).
    pub sla: Option<(SlaTargets, Option<f64>)>,
    /// Whether it applies correction factors.
    pub uses_corrections: bool,
}

/// Reports a planned reconcile: Events on transitions, the metrics of an interval, status when it
/// changed. Between intervals a check that changes nothing writes nothing (the status describes
/// the last decision), unless its grant changed.
pub async fn planned(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    planned: Planned<'_>,
) -> Result<(), Error> {
    let Planned {
        decision,
        rendered,
        actuated,
        conditions,
        serving,
        aggregated,
        kv_transfer,
        left_budget,
        attainment,
        targets,
        planner,
    } = planned;
    let mut outcome = Outcome {
        aggregated,
        kv_transfer: Some(kv_transfer),
        conditions,
        budget: match (&decision.grant, left_budget) {
            (Some(grant), _) => BudgetOutcome::Set(member::grant_status(grant)),
            (None, true) => BudgetOutcome::Clear,
            (None, false) => BudgetOutcome::Keep,
        },
        ..Outcome::default()
    };
    if decision.check != Check::Interval && decision.target.is_none() {
        let previous = policy.status.as_ref();
        let grant_changed = match &outcome.budget {
            BudgetOutcome::Set(now) => previous.and_then(|s| s.budget.as_ref()) != Some(now),
            _ => false,
        };
        if grant_changed {
            outcome.message = previous.and_then(|s| s.message.clone()).unwrap_or_default();
            outcome.conditions.extend(rendered.conditions);
            publish_grant_event(policy, ctx, &outcome).await;
            write_status(policy, ctx, &outcome).await?;
        }
        return Ok(());
    }
    let ticked = decision.check == Check::Interval;
    outcome.ticked = ticked;
    outcome.drop_correction = ticked && !planner.uses_corrections;
    if ticked {
        outcome.current = Some(replicas(serving, aggregated));
    }
    outcome.conditions.extend(rendered.conditions);
    outcome.observed = rendered.observed;
    outcome.predicted = rendered.predicted;
    outcome.correction = rendered.correction;
    outcome.message = rendered.message;
    outcome.desired = decision.target.map(|target| replicas(target, aggregated));
    if let Some(note) = &actuated.note {
        outcome.message.push_str(&format!("; {note}"));
    }
    outcome.scaled = actuated.from.is_some();
    outcome.decision_id = actuated.decision_id;
    outcome.last_decision = Some(last_decision(decision, aggregated));
    outcome.attainment = Some(attainment);
    outcome.targets = Some(targets);
    let (namespace, name) = (policy.namespace().unwrap_or_default(), policy.name_any());
    if let (Some(from), Some(to)) = (actuated.from, decision.target) {
        let up = to.0 + to.1 > from.0 + from.1;
        ctx.base.metrics.policies.decision(&namespace, &name, up);
        let note = if aggregated {
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
    if ticked {
        let report = interval_report(&outcome, decision, serving, attainment, &planner);
        ctx.base.metrics.policies.record(&namespace, &name, &report);
    }
    write_status(policy, ctx, &outcome).await?;
    Ok(())
}

/// The decision as `status.lastDecision` shows it.
fn last_decision(decision: &Decision, aggregated: bool) -> LastDecision {
    let replicas = decision.target.map(|t| replicas(t, aggregated));
    let finite = |v: f64| v.is_finite().then_some(v);
    LastDecision {
        check: decision.check.as_str().into(),
        time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::now(),
        )),
        prefill: replicas.map_or(0, |r| r.prefill),
        decode: replicas.map_or(0, |r| r.decode),
        expected_ttft_ms: decision.plan.as_ref().and_then(|p| finite(p.expected_ttft_ms)),
        expected_itl_ms: decision.plan.as_ref().and_then(|p| finite(p.expected_itl_ms)),
        scale_up_delay_seconds: decision.scale_up_delay_s.map(|(s, _)| s),
        scale_up_delay_source: decision
            .scale_up_delay_s
            .map(|(_, source)| source.as_str().into()),
    }
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

/// What an interval's metrics show: the outcome's figures (ms as seconds), the GPUs of the
/// replicas decided and serving, and the SLA and how it was met.
pub fn interval_report(
    outcome: &Outcome,
    decision: &Decision,
    serving: (u32, u32),
    attainment: (usize, usize),
    planner: &PlannerFacts,
) -> IntervalReport {
    let (prefill_gpus, decode_gpus) = planner.gpus_per_engine;
    let gpus = |(p, d): (u32, u32)| {
        let decode = u64::from(d) * u64::from(decode_gpus);
        if outcome.aggregated {
            decode
        } else {
            u64::from(p) * u64::from(prefill_gpus) + decode
        }
    };
    let seconds = |ms: Option<f64>| ms.map(|ms| ms / 1000.0);
    IntervalReport {
        interval_s: planner.interval.as_secs_f64(),
        desired: decision.target,
        current: Some(serving),
        desired_gpus: decision.target.map(gpus),
        gpus_in_use: Some(gpus(serving)),
        observed: outcome.observed.as_ref().map(|o| ObservedFigures {
            requests: o.requests,
            isl: o.isl,
            osl: o.osl,
            ttft_s: seconds(o.ttft_ms),
            itl_s: seconds(o.itl_ms),
            ttft_percentile_s: seconds(o.ttft_percentile_ms),
            decode_kv_usage: o.decode_kv_usage,
            prefill_queue: o.prefill_queue,
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
        uses_correction: planner.uses_corrections,
        sla: planner.sla.map(|(targets, percentile)| SlaReport {
            ttft_s: targets.ttft_ms / 1000.0,
            itl_s: targets.itl_ms / 1000.0,
            ttft_percentile: percentile,
            attainment,
            met: decision.sla_met,
        }),
        metrics_available: decision.metrics.as_ref().map(MetricsState::available),
        limitation: decision
            .limitation
            .as_ref()
            .map(|l| (l.reason.as_str(), l.limited())),
    }
}

/// Reports a policy that the webhook's rules reject: `TargetResolved` (for errors about the
/// target) or `Ready` (for the policy's own fields) with the webhook's message.
pub async fn invalid(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    errors: &[PolicyError],
    kv_transfer: Option<Option<KvTransferStatus>>,
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
    blocked(policy, ctx, condition, kv_transfer).await
}

/// Reports that the target or its scaling adapters could not be read (the API server's error,
/// e.g. NVIDIA's conversion webhook down: never taken as "not found"): `TargetResolved` Unknown,
/// the replicas left as they are; the reconcile still fails, so it is retried with back-off.
pub async fn unavailable(
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

/// Reports what keeps the planner from running (with the target's KV-transfer topology when it
/// was read), with a Warning Event when the status changes.
pub async fn blocked(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    condition: DesiredCondition,
    kv_transfer: Option<Option<KvTransferStatus>>,
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
    use planner_core::policy::{Check, Decision, LimitReason, Limitation, MetricsState};

    use super::*;

    fn decision(target: (u32, u32)) -> Decision {
        let mut decision = Decision::keep(Check::Interval);
        decision.target = Some(target);
        decision.metrics = Some(MetricsState::Observed);
        decision.sla_met = Some(false);
        decision.limitation = Some(Limitation {
            reason: LimitReason::StepLimit,
            message: "cut".into(),
        });
        decision
    }

    fn facts(sla: bool) -> PlannerFacts {
        PlannerFacts {
            interval: Duration::from_secs(30),
            gpus_per_engine: (2, 4),
            sla: sla.then(|| (SlaTargets::new(500.0, 40.0), Some(95.0))),
            uses_corrections: false,
        }
    }

    #[test]
    fn gpus_count_both_pools_and_an_aggregated_pool_once() {
        let disaggregated = interval_report(
            &Outcome::default(),
            &decision((3, 2)),
            (1, 2),
            (0, 0),
            &facts(true),
        );
        assert_eq!(
            (disaggregated.desired_gpus, disaggregated.gpus_in_use),
            (Some(3 * 2 + 2 * 4), Some(2 + 2 * 4))
        );
        let aggregated = Outcome {
            aggregated: true,
            ..Outcome::default()
        };
        let report = interval_report(&aggregated, &decision((3, 3)), (2, 2), (0, 0), &facts(true));
        assert_eq!(
            (report.desired_gpus, report.gpus_in_use),
            (Some(3 * 4), Some(2 * 4))
        );
        // Held replicas: the GPUs in use still move.
        let held = interval_report(
            &Outcome::default(),
            &Decision::keep(Check::Interval),
            (4, 1),
            (0, 0),
            &facts(true),
        );
        assert_eq!((held.desired_gpus, held.gpus_in_use), (None, Some(4 * 2 + 4)));
        assert_eq!(report.interval_s, 30.0);
        assert_eq!(report.limitation, Some(("StepLimit", true)));
        assert_eq!(report.metrics_available, Some(true));
    }

    #[test]
    fn the_sla_is_reported_in_seconds_for_the_sla_planner_only() {
        let report = interval_report(
            &Outcome::default(),
            &decision((1, 1)),
            (1, 1),
            (6, 4),
            &facts(true),
        );
        assert_eq!(
            report.sla,
            Some(SlaReport {
                ttft_s: 0.5,
                itl_s: 0.04,
                ttft_percentile: Some(95.0),
                attainment: (6, 4),
                met: Some(false),
            })
        );
        let load = interval_report(
            &Outcome::default(),
            &decision((1, 1)),
            (1, 1),
            (0, 0),
            &facts(false),
        );
        assert_eq!(load.sla, None);
    }
}

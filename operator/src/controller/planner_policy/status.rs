//! PlannerPolicy status, conditions and events from one interval's outcome (pure).

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

use planner_api::{
    CorrectionFactors, KvTransferStatus, LastDecision, ObservedLoad, PlannerPolicyStatus, PolicySummary,
    PoolReplicas, PredictedLoad, SlaAttainment,
};

use planner_core::sla::Limit;

use crate::controller::conditions::{self, DesiredCondition};

/// Condition types of a PlannerPolicy.
pub const READY: &str = "Ready";
/// The target DGD and its pools resolve.
pub const TARGET_RESOLVED: &str = "TargetResolved";
/// The profile loaded.
pub const PROFILE_LOADED: &str = "ProfileLoaded";
/// The last interval's metrics were read.
pub const METRICS_AVAILABLE: &str = "MetricsAvailable";
/// A bound or the budget limited the last decision.
pub const SCALING_LIMITED: &str = "ScalingLimited";

/// How the last interval went, as the status shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Condition updates.
    pub conditions: Vec<DesiredCondition>,
    /// Observed metrics.
    pub observed: Option<ObservedLoad>,
    /// Predicted load.
    pub predicted: Option<PredictedLoad>,
    /// Correction factors.
    pub correction: Option<CorrectionFactors>,
    /// Desired replicas.
    pub desired: Option<PoolReplicas>,
    /// Current replicas.
    pub current: Option<PoolReplicas>,
    /// The last decision's id, when one was published.
    pub decision_id: Option<i64>,
    /// Whether replicas were changed this interval.
    pub scaled: bool,
    /// Whether an interval ran (sets `lastTickTime`).
    pub ticked: bool,
    /// One line on why.
    pub message: String,
    /// What the shared GPU budget granted.
    pub budget: BudgetOutcome,
    /// The target is one aggregated worker pool (its replicas are reported as `workers`).
    pub aggregated: bool,
    /// The target's KV-transfer topology, when the target was read (`Some(None)`: it has none).
    pub kv_transfer: Option<Option<KvTransferStatus>>,
    /// The last decision.
    pub last_decision: Option<LastDecision>,
    /// The last hour's intervals with traffic, and those that met the SLA.
    pub attainment: Option<(usize, usize)>,
    /// The planner applies no correction factors: status shows none.
    pub drop_correction: bool,
    /// The targets `kubectl get` shows the observed latencies against: TTFT and ITL (ms) and the
    /// TTFT percentile targeted; the summary is rewritten when they are given.
    pub targets: Option<(f64, f64, Option<f64>)>,
}

/// What the status says about a shared GPU budget.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum BudgetOutcome {
    /// As before.
    #[default]
    Keep,
    /// The grant of this decision.
    Set(planner_api::BudgetGrant),
    /// The policy joins no budget.
    Clear,
}

/// The `ScalingLimited` condition for a decision's limits (minimums are not limitations).
pub fn scaling_limited(limits: &[Limit]) -> DesiredCondition {
    limited_condition(&planner_core::policy::Limitation::of(limits))
}

/// The `ScalingLimited` condition of a limitation.
pub fn limited_condition(limitation: &planner_core::policy::Limitation) -> DesiredCondition {
    if limitation.limited() {
        DesiredCondition::met(SCALING_LIMITED, limitation.reason.as_str(), &limitation.message)
    } else {
        DesiredCondition::unmet(SCALING_LIMITED, limitation.reason.as_str(), &limitation.message)
    }
}

/// The status after an interval: previous fields kept unless the outcome replaces them.
pub fn next(
    previous: Option<&PlannerPolicyStatus>,
    generation: Option<i64>,
    outcome: &Outcome,
    now: Timestamp,
) -> PlannerPolicyStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.observed_generation = generation;
    // Ready follows the other conditions: the planner works when the target resolves, the
    // profile loads and metrics arrive.
    // An outcome may also set Ready itself (a spec the planner cannot use).
    let mut wanted = outcome.conditions.clone();
    if !wanted.iter().any(|c| c.type_ == READY) {
        let failing: Vec<&DesiredCondition> = wanted
            .iter()
            .filter(|c| {
                [TARGET_RESOLVED, PROFILE_LOADED, METRICS_AVAILABLE].contains(&c.type_) && c.status != "True"
            })
            .collect();
        let ready = match failing.first() {
            Some(first) => DesiredCondition::unmet(READY, first.reason.clone(), first.message.clone()),
            None => DesiredCondition::met(READY, "Planning", outcome.message.clone()),
        };
        wanted.push(ready);
    }
    status.conditions = conditions::merge(&status.conditions, &wanted, generation, now);
    if outcome.ticked {
        status.last_tick_time = Some(Time(now));
    }
    if outcome.observed.is_some() {
        status.observed = outcome.observed.clone();
    }
    if outcome.predicted.is_some() {
        status.predicted = outcome.predicted.clone();
    }
    if outcome.correction.is_some() {
        status.correction = outcome.correction.clone();
    }
    if outcome.drop_correction {
        status.correction = None;
    }
    if outcome.desired.is_some() {
        status.desired = outcome.desired;
    }
    if outcome.current.is_some() {
        status.current = outcome.current;
    }
    if outcome.decision_id.is_some() {
        status.decision_id = outcome.decision_id;
    }
    if outcome.scaled {
        status.last_scale_time = Some(Time(now));
    }
    match &outcome.budget {
        BudgetOutcome::Keep => {}
        BudgetOutcome::Set(grant) => status.budget = Some(grant.clone()),
        BudgetOutcome::Clear => status.budget = None,
    }
    status.message = Some(outcome.message.clone());
    if let Some(kv_transfer) = &outcome.kv_transfer {
        status.kv_transfer = kv_transfer.clone();
    }
    if outcome.last_decision.is_some() {
        status.last_decision = outcome.last_decision.clone();
    }
    if let Some((intervals, met)) = outcome.attainment {
        let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        status.sla_attainment = Some(SlaAttainment {
            intervals: count(intervals),
            met: count(met),
        });
    }
    if let Some(targets) = outcome.targets {
        status.summary = Some(summary(&status, targets));
    }
    status
}

/// What `kubectl get` shows of a status, against the targets (TTFT and ITL in ms, the TTFT
/// percentile targeted).
pub fn summary(
    status: &PlannerPolicyStatus,
    (ttft_ms, itl_ms, percentile): (f64, f64, Option<f64>),
) -> PolicySummary {
    let pool = |current: Option<i32>, desired: Option<i32>| {
        let shown = |n: Option<i32>| n.map_or_else(|| "-".to_string(), |n| n.to_string());
        format!("{}/{}", shown(current), shown(desired))
    };
    let (current, desired) = (status.current, status.desired);
    let observed = status.observed.as_ref();
    let ms = |value: Option<f64>, target: f64| match value {
        Some(v) if v >= 10.0 => format!("{v:.0}/{target:.0}ms"),
        Some(v) => format!("{v:.1}/{target:.0}ms"),
        None => format!("-/{target:.0}ms"),
    };
    let ttft = match percentile {
        Some(p) => format!(
            "p{p:.0} {}",
            ms(observed.and_then(|o| o.ttft_percentile_ms), ttft_ms)
        ),
        None => ms(observed.and_then(|o| o.ttft_ms), ttft_ms),
    };
    let limited = conditions::find(&status.conditions, SCALING_LIMITED)
        .filter(|c| c.status == "True")
        .map_or_else(|| "-".to_string(), |c| c.reason.clone());
    PolicySummary {
        prefill: pool(current.map(|c| c.prefill), desired.map(|d| d.prefill)),
        decode: pool(current.map(|c| c.decode), desired.map(|d| d.decode)),
        ttft,
        itl: ms(observed.and_then(|o| o.itl_ms), itl_ms),
        sla: status
            .sla_attainment
            .as_ref()
            .filter(|a| a.intervals > 0)
            .map_or_else(
                || "-".to_string(),
                |a| format!("{:.0}%", 100.0 * f64::from(a.met) / f64::from(a.intervals)),
            ),
        limited,
    }
}

/// Whether writing `new` changes what `old` says (condition transition times aside).
pub fn differs(old: Option<&PlannerPolicyStatus>, new: &PlannerPolicyStatus) -> bool {
    match old {
        None => true,
        Some(old) => {
            let strip = |s: &PlannerPolicyStatus| PlannerPolicyStatus {
                conditions: Vec::new(),
                ..s.clone()
            };
            strip(old) != strip(new) || !conditions::same(&old.conditions, &new.conditions)
        }
    }
}

/// Finite values only: status fields are JSON numbers and must not be NaN.
pub fn finite(value: f64) -> Option<f64> {
    value.is_finite().then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner_core::sla::Pool;

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    #[test]
    fn ready_reflects_the_first_failing_condition() {
        let outcome = Outcome {
            conditions: vec![
                DesiredCondition::met(TARGET_RESOLVED, "Resolved", "ok"),
                DesiredCondition::unmet(
                    METRICS_AVAILABLE,
                    "PrometheusUnreachable",
                    "cannot reach Prometheus",
                ),
            ],
            message: "keeping replicas".into(),
            ..Outcome::default()
        };
        let status = next(None, Some(2), &outcome, now());
        let ready = conditions::find(&status.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "PrometheusUnreachable")
        );
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(status.last_tick_time, None);
    }

    #[test]
    fn a_tick_records_its_numbers_and_keeps_the_last_ones_otherwise() {
        let tick = Outcome {
            conditions: vec![DesiredCondition::met(METRICS_AVAILABLE, "Observed", "ok")],
            desired: Some(PoolReplicas {
                prefill: 2,
                decode: 3,
                workers: None,
            }),
            current: Some(PoolReplicas {
                prefill: 1,
                decode: 3,
                workers: None,
            }),
            scaled: true,
            ticked: true,
            message: "prefill 1 -> 2".into(),
            ..Outcome::default()
        };
        let first = next(None, Some(1), &tick, now());
        assert_eq!(
            first.desired,
            Some(PoolReplicas {
                prefill: 2,
                decode: 3,
                workers: None,
            })
        );
        assert!(first.last_scale_time.is_some() && first.last_tick_time.is_some());
        let quiet = Outcome {
            message: "waiting".into(),
            ..Outcome::default()
        };
        let second = next(Some(&first), Some(1), &quiet, now());
        assert_eq!(second.desired, first.desired);
        assert!(differs(Some(&first), &second));
        assert!(!differs(
            Some(&second),
            &next(Some(&second), Some(1), &quiet, now())
        ));
    }

    #[test]
    fn the_summary_shows_serving_over_decided_observed_over_target_and_the_share_met() {
        let pools = |prefill, decode| PoolReplicas {
            prefill,
            decode,
            workers: None,
        };
        let interval = Outcome {
            conditions: vec![scaling_limited(&[Limit::MaxReplicas {
                pool: Pool::Prefill,
                needed: 9,
                max: 4,
            }])],
            desired: Some(pools(4, 2)),
            current: Some(pools(3, 2)),
            observed: Some(ObservedLoad {
                ttft_ms: Some(312.4),
                itl_ms: Some(7.25),
                ttft_percentile_ms: Some(845.0),
                ttft_percentile: Some(90.0),
                ..ObservedLoad::default()
            }),
            ticked: true,
            attainment: Some((12, 9)),
            targets: Some((500.0, 50.0, None)),
            ..Outcome::default()
        };
        let status = next(None, Some(1), &interval, now());
        let shown = status.summary.clone().unwrap();
        assert_eq!((shown.prefill.as_str(), shown.decode.as_str()), ("3/4", "2/2"));
        assert_eq!(
            (shown.ttft.as_str(), shown.itl.as_str()),
            ("312/500ms", "7.2/50ms")
        );
        assert_eq!(
            (shown.sla.as_str(), shown.limited.as_str()),
            ("75%", "MaxReplicas")
        );
        assert_eq!(
            status.sla_attainment,
            Some(SlaAttainment {
                intervals: 12,
                met: 9
            })
        );
        // A percentile target shows the observed percentile; before traffic, dashes.
        let percentile = summary(&status, (1000.0, 50.0, Some(90.0)));
        assert_eq!(percentile.ttft, "p90 845/1000ms");
        let empty = summary(&PlannerPolicyStatus::default(), (500.0, 50.0, None));
        assert_eq!(
            (empty.prefill, empty.ttft, empty.sla, empty.limited),
            ("-/-".into(), "-/500ms".into(), "-".into(), "-".into())
        );
    }

    #[test]
    fn scaling_limited_names_the_limit() {
        let none = scaling_limited(&[Limit::MinReplicas {
            pool: Pool::Decode,
            needed: 0,
            min: 1,
        }]);
        assert_eq!(none.status, "False");
        let budget = scaling_limited(&[Limit::GpuBudget {
            needed_gpus: 12,
            budget: 8,
        }]);
        assert_eq!((budget.status, budget.reason.as_str()), ("True", "GpuBudget"));
        assert!(budget.message.contains("12 GPUs"));
        let max = scaling_limited(&[Limit::MaxReplicas {
            pool: Pool::Prefill,
            needed: 9,
            max: 4,
        }]);
        assert_eq!(max.reason, "MaxReplicas");
        let rate = scaling_limited(&[Limit::ScaleUpRate {
            pool: Pool::Prefill,
            needed: 9,
            allowed: 3,
            serving: 2.0,
        }]);
        assert_eq!((rate.status, rate.reason.as_str()), ("True", "ScaleUpRate"));
        assert!(rate.message.contains("held at 3"), "{}", rate.message);
    }

    #[test]
    fn a_planner_without_correction_factors_drops_those_of_an_earlier_one() {
        let upstream = Outcome {
            correction: Some(CorrectionFactors {
                prefill: Some(1.2),
                decode: Some(0.9),
            }),
            ticked: true,
            ..Outcome::default()
        };
        let first = next(None, Some(1), &upstream, now());
        assert!(first.correction.is_some());
        // An interval of the same planner without metrics keeps them.
        let held = next(Some(&first), Some(1), &Outcome::default(), now());
        assert_eq!(held.correction, first.correction);
        // The policy moved to the queueing model (or mode load).
        let queueing = Outcome {
            ticked: true,
            drop_correction: true,
            ..Outcome::default()
        };
        assert_eq!(next(Some(&held), Some(2), &queueing, now()).correction, None);
    }
}

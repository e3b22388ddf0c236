//! What a wake of the loop came to, typed: the replicas to set and every reason behind them,
//! for a driver to render as status, conditions, Events, metrics or a log line.

use serde::Serialize;

use crate::{
    budget::GrantReason,
    load::{LoadDecision, LoadSamples},
    queueing::QueueingPlan,
    sla::{Corrections, Limit, Load, Observation},
    startup::DelaySource,
};

/// Which check a decision came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Check {
    /// An adjustment interval: the planner learned from the interval's metrics and sized both
    /// pools.
    Interval,
    /// A fast check between intervals: more replicas at once when the SLA is at risk.
    Fast,
    /// A shared budget's member between decisions: only its grant was looked at.
    Grant,
}

impl Check {
    /// `interval`, `fast` or `grant`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Interval => "interval",
            Self::Fast => "fast",
            Self::Grant => "grant",
        }
    }
}

/// What an interval's metrics were.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum MetricsState {
    /// Read, and planned on.
    Observed,
    /// Missing: nothing was learned or decided (missing metrics never scale anything down).
    Unavailable {
        /// Why.
        reason: String,
    },
    /// Read, but no request completed in the interval: upstream skips such intervals.
    NoTraffic,
    /// The frontend has counted no request yet: planning starts with the first one.
    AwaitingTraffic {
        /// What was seen.
        reason: String,
    },
    /// The load planner found no queue or KV-cache sample in the interval.
    NoSamples,
}

impl MetricsState {
    /// The reason the `MetricsAvailable` condition carries.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Observed => "Observed",
            Self::Unavailable { .. } => "MetricsUnavailable",
            Self::NoTraffic => "NoTraffic",
            Self::AwaitingTraffic { .. } => "AwaitingTraffic",
            Self::NoSamples => "NoSamples",
        }
    }

    /// Whether the metrics were available (only missing ones are a fault).
    pub fn available(&self) -> bool {
        !matches!(self, Self::Unavailable { .. } | Self::NoSamples)
    }
}

/// What limited a decision (the `ScalingLimited` condition's reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum LimitReason {
    /// Nothing: the decision was within bounds and budget.
    WithinBounds,
    /// A pool needed more than `maxReplicas`.
    MaxReplicas,
    /// Both pools needed more GPUs than `maxGpuBudget`.
    GpuBudget,
    /// At a long scale-up delay, a pool grows at most to a multiple of its engines serving.
    ScaleUpRate,
    /// `maxScaleUpStep` or `maxScaleDownStep` cut the change.
    StepLimit,
    /// The decision was zero replicas of a pool (a GPU budget below both pools' minimums) and
    /// scale to zero is not allowed: the replicas were kept.
    BudgetBelowMinimum,
    /// A shared GPU budget granted less than the decision asked for.
    SharedBudget,
    /// `bounds.prefillToDecodeRatio` moved a pool, or could not be met.
    RatioBound,
}

impl LimitReason {
    /// Every reason, for docs and tests.
    pub const ALL: [Self; 8] = [
        Self::WithinBounds,
        Self::MaxReplicas,
        Self::GpuBudget,
        Self::ScaleUpRate,
        Self::StepLimit,
        Self::BudgetBelowMinimum,
        Self::SharedBudget,
        Self::RatioBound,
    ];

    /// The condition reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WithinBounds => "WithinBounds",
            Self::MaxReplicas => "MaxReplicas",
            Self::GpuBudget => "GpuBudget",
            Self::ScaleUpRate => "ScaleUpRate",
            Self::StepLimit => "StepLimit",
            Self::BudgetBelowMinimum => "BudgetBelowMinimum",
            Self::SharedBudget => "SharedBudget",
            Self::RatioBound => "RatioBound",
        }
    }
}

/// Whether and how a decision was limited.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Limitation {
    /// The reason.
    pub reason: LimitReason,
    /// What limited it, in words.
    pub message: String,
}

impl Limitation {
    /// A decision within bounds.
    pub fn within_bounds() -> Self {
        Self {
            reason: LimitReason::WithinBounds,
            message: "the last decision was within bounds and budget".into(),
        }
    }

    /// The limitation a planner's limits describe (minimums are not limitations).
    pub fn of(limits: &[Limit]) -> Self {
        let limiting: Vec<String> = limits
            .iter()
            .filter(|l| !matches!(l, Limit::MinReplicas { .. }))
            .map(ToString::to_string)
            .collect();
        if limiting.is_empty() {
            return Self::within_bounds();
        }
        let reason = if limits
            .iter()
            .any(|l| matches!(l, Limit::GpuBudget { .. } | Limit::BudgetBelowMinimum { .. }))
        {
            LimitReason::GpuBudget
        } else if limits.iter().any(|l| matches!(l, Limit::MaxReplicas { .. })) {
            LimitReason::MaxReplicas
        } else if limits.iter().any(|l| matches!(l, Limit::Ratio { .. })) {
            LimitReason::RatioBound
        } else {
            LimitReason::ScaleUpRate
        };
        Self {
            reason,
            message: limiting.join("; "),
        }
    }

    /// Whether something limited the decision.
    pub fn limited(&self) -> bool {
        self.reason != LimitReason::WithinBounds
    }
}

/// A shared budget's grant to the policy, as its status shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GrantReport {
    /// The budget's name.
    pub name: String,
    /// GPUs of the policy's floor.
    pub floor_gpus: u64,
    /// GPUs it asked for.
    pub asked_gpus: u64,
    /// GPUs granted.
    pub granted_gpus: u64,
    /// Why the grant is what it is.
    pub reason: GrantReason,
    /// The grant in words.
    pub message: String,
}

/// One wake's decision and everything behind it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decision {
    /// The check it came from.
    pub check: Check,
    /// Replicas decided (prefill, decode), or `None` to keep those asked for.
    pub target: Option<(u32, u32)>,
    /// What the driver should set now: the target when it differs from the replicas asked for
    /// and nothing holds it back (the ready gate, observe mode).
    pub scale_to: Option<(u32, u32)>,
    /// An adjustment interval's metrics.
    pub metrics: Option<MetricsState>,
    /// What limited the decision (`None`: this wake did not decide anything that could be).
    pub limitation: Option<Limitation>,
    /// The interval's frontend metrics (SLA planner).
    pub observed: Option<Observation>,
    /// The load planner's samples, when it read some.
    pub samples: Option<LoadSamples>,
    /// The load planner's decision, with its reasons per pool.
    pub load: Option<LoadDecision>,
    /// The load predicted for the next interval.
    pub predicted: Option<Load>,
    /// Correction factors after the interval (upstream's formulas).
    pub corrections: Option<Corrections>,
    /// The queueing model's plan, when it made one.
    pub plan: Option<QueueingPlan>,
    /// A shared budget's grant.
    pub grant: Option<GrantReport>,
    /// Why a change was not carried out now (the target not Ready yet; observe mode).
    pub deferred: Option<String>,
    /// Whether the interval's arrivals met the SLA (`None` without traffic or metrics).
    pub sla_met: Option<bool>,
    /// The scale-up delay planned with (s), and where it comes from.
    pub scale_up_delay_s: Option<(f64, DelaySource)>,
    /// One line saying why.
    pub message: String,
}

impl Decision {
    /// A decision of `check` that keeps the replicas, saying nothing yet.
    pub fn keep(check: Check) -> Self {
        Self {
            check,
            target: None,
            scale_to: None,
            metrics: None,
            limitation: None,
            observed: None,
            samples: None,
            load: None,
            predicted: None,
            corrections: None,
            plan: None,
            grant: None,
            deferred: None,
            sla_met: None,
            scale_up_delay_s: None,
            message: String::new(),
        }
    }

    /// Appends `note` to the message (`; ` between).
    pub(crate) fn note(&mut self, note: &str) {
        if self.message.is_empty() {
            self.message = note.to_string();
        } else {
            self.message.push_str("; ");
            self.message.push_str(note);
        }
    }
}

//! What the SLA planner is given for an interval and what it decides: the metrics (or why
//! they are missing), and the decision, which either keeps the replicas or carries one model's
//! plan.

use serde::{Deserialize, Serialize};

use crate::{
    predictor::Fallback,
    queueing::QueueingPlan,
    sla::{Corrections, Limit, Load, Observation, ReplicaPlan},
};

/// What the metrics source delivered for an interval.
#[derive(Clone, Debug, PartialEq)]
pub enum IntervalMetrics {
    /// Prometheus could not be read, or returned no series: nothing is learned or decided.
    Unavailable {
        /// Why, for status and events.
        reason: String,
    },
    /// The frontend serves the model but has counted no request yet (a new graph before its
    /// first request has no request series): nothing is learned or decided until one arrives.
    AwaitingTraffic {
        /// What was seen, for status.
        reason: String,
    },
    /// The interval's frontend metrics (means may be NaN when no request completed).
    Observed(Observation),
}

/// Why the planner keeps the current replicas this interval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Hold {
    /// Metrics were missing: never scale (in particular never down) on missing data.
    MetricsUnavailable {
        /// Why.
        reason: String,
    },
    /// Means are NaN because no request completed: upstream skips such intervals.
    NoTraffic,
    /// No request has reached the frontend yet: planning starts with the first one.
    AwaitingTraffic {
        /// What was seen.
        reason: String,
    },
}

/// What a decision came to: the replicas kept, or one model's plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Outcome {
    /// The current replicas are kept.
    Hold(Hold),
    /// Upstream's formulas planned.
    Upstream(ReplicaPlan),
    /// The queueing model planned.
    Queueing(QueueingPlan),
}

/// One interval's decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SlaDecision {
    /// The metrics the decision was based on.
    pub observed: Option<Observation>,
    /// The predicted load of the next interval.
    pub predicted: Option<Load>,
    /// Predictor fallbacks used (requests, ISL, OSL), if any.
    pub fallbacks: Vec<(String, Fallback)>,
    /// Correction factors after this interval.
    pub corrections: Corrections,
    /// Replicas running when the decision was made.
    pub current: (u32, u32),
    /// What it came to.
    pub outcome: Outcome,
}

impl SlaDecision {
    /// The replicas to run, or `None` to keep the current ones.
    pub fn target(&self) -> Option<(u32, u32)> {
        match &self.outcome {
            Outcome::Hold(_) => None,
            Outcome::Upstream(plan) => Some((plan.prefill, plan.decode)),
            Outcome::Queueing(plan) => Some(plan.replicas),
        }
    }

    /// Whether the decision changes the running replicas.
    pub fn changes_replicas(&self) -> bool {
        self.target().is_some_and(|target| target != self.current)
    }

    /// Why the replicas are kept, when they are.
    pub fn hold(&self) -> Option<&Hold> {
        match &self.outcome {
            Outcome::Hold(hold) => Some(hold),
            _ => None,
        }
    }

    /// Upstream's plan, when it made one.
    pub fn upstream(&self) -> Option<&ReplicaPlan> {
        match &self.outcome {
            Outcome::Upstream(plan) => Some(plan),
            _ => None,
        }
    }

    /// The queueing model's plan, when it made one.
    pub fn queueing(&self) -> Option<&QueueingPlan> {
        match &self.outcome {
            Outcome::Queueing(plan) => Some(plan),
            _ => None,
        }
    }

    /// Bounds and budget that limited the decision.
    pub fn limits(&self) -> &[Limit] {
        match &self.outcome {
            Outcome::Hold(_) => &[],
            Outcome::Upstream(plan) => plan.limits.as_slice(),
            Outcome::Queueing(plan) => plan.limits.as_slice(),
        }
    }

    /// One line saying why the decision is what it is.
    pub fn explanation(&self) -> String {
        let plan = match &self.outcome {
            Outcome::Hold(Hold::MetricsUnavailable { reason }) => {
                return format!("keeping replicas: metrics unavailable ({reason})");
            }
            Outcome::Hold(Hold::NoTraffic) => {
                return "keeping replicas: no request completed in the interval".to_string();
            }
            Outcome::Hold(Hold::AwaitingTraffic { reason }) => return format!("keeping replicas: {reason}"),
            Outcome::Queueing(plan) => return plan.explanation(),
            Outcome::Upstream(plan) => plan,
        };
        let Some(load) = &self.predicted else {
            return "no decision".to_string();
        };
        let mut line = format!(
            "predicted {:.0} requests (ISL {:.0}, OSL {:.0}): {} prefill and {} decode replicas",
            load.num_req, load.isl, load.osl, plan.prefill, plan.decode
        );
        for limit in plan
            .limits
            .iter()
            .filter(|l| !matches!(l, Limit::MinReplicas { .. }))
        {
            line.push_str(&format!("; {limit}"));
        }
        // A constant series is the model's own answer, not a fallback worth reporting.
        for (series, fallback) in self
            .fallbacks
            .iter()
            .filter(|(_, f)| !matches!(f, Fallback::ConstantSeries))
        {
            line.push_str(&format!("; {series} forecast: {fallback}"));
        }
        line
    }
}

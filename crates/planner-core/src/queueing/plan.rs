//! What the queueing planner reports: the plan with every intermediate, and why it chose its
//! replicas.

use serde::Serialize;

use crate::{
    sizing::{self, DecodeSizing, LengthMoments, PrefillSizing},
    sla::Limit,
};

/// Why the queueing model chose its replicas (for status and events).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ScaleReason {
    /// Sized for the forecast (at its upper quantile), queueing included.
    Forecast,
    /// The backlog needed more prefill engines than the forecast alone: the requests waiting
    /// now and those that queue up, at the forecast rate, before a replica asked for now serves.
    Backlog {
        /// Requests waiting beyond those being prefilled.
        backlog: f64,
        /// Requests expected to queue up before new replicas serve.
        growth: f64,
    },
    /// Between intervals, the backlog would have outlasted the scale-up delay.
    FastPath {
        /// Requests waiting beyond those being prefilled.
        backlog: f64,
        /// Recent arrival rate (requests/s).
        arrival_rate: f64,
        /// Seconds the backlog would take to clear with the engines serving.
        drain_s: f64,
    },
    /// Between intervals, arrivals ran above the rate the last plan provided for.
    Surge {
        /// Recent arrival rate (requests/s).
        arrival_rate: f64,
        /// The rate the last plan provided for (requests/s).
        planned_rate: f64,
    },
    /// A scale-down is deferred: the stabilisation window's quantile is still higher.
    Stabilising,
    /// A scale-down is refused while a backlog remains.
    BacklogHold {
        /// Requests waiting beyond those being prefilled.
        backlog: f64,
    },
}

impl std::fmt::Display for ScaleReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Forecast => write!(f, "sized for the forecast"),
            Self::Backlog { backlog, growth } => write!(
                f,
                "sized to drain a backlog of {backlog:.0} requests and the {growth:.0} more expected to queue before new replicas serve"
            ),
            Self::FastPath {
                backlog,
                arrival_rate,
                drain_s,
            } => {
                let drain = if drain_s.is_finite() {
                    format!("would take {drain_s:.0} s to clear")
                } else {
                    "would never clear".to_string()
                };
                write!(
                    f,
                    "SLA at risk: {backlog:.0} requests waiting at {arrival_rate:.1} req/s {drain}"
                )
            }
            Self::Surge {
                arrival_rate,
                planned_rate,
            } => write!(
                f,
                "arrivals at {arrival_rate:.1} req/s exceed the {planned_rate:.1} req/s planned for"
            ),
            Self::Stabilising => write!(f, "scale-down deferred by the stabilisation window"),
            Self::BacklogHold { backlog } => {
                write!(f, "no scale-down while {backlog:.0} requests are waiting")
            }
        }
    }
}

/// The queueing model's plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueingPlan {
    /// Point forecast of the next interval's arrivals.
    pub forecast_requests: f64,
    /// Multiplier of the arrival forecast from its errors' upper quantile.
    pub forecast_multiplier: f64,
    /// Multiplier of the mean prefill time from its errors' upper quantile.
    pub service_multiplier: f64,
    /// Multiplier of the decode KV demand from its errors' upper quantile.
    pub decode_multiplier: f64,
    /// Arrival rate planned for (requests/s).
    pub planned_rate: f64,
    /// Arrival burstiness planned for.
    pub burstiness: f64,
    /// First-token overhead planned with (ms): from the end of a prefill to the first token.
    pub overhead_ms: f64,
    /// Requests waiting beyond those being prefilled.
    pub backlog: f64,
    /// Prompt-length moments planned for.
    pub isl: LengthMoments,
    /// Output-length moments planned for.
    pub osl: LengthMoments,
    /// Prefill sizing.
    pub prefill_sizing: PrefillSizing,
    /// Decode sizing.
    pub decode_sizing: DecodeSizing,
    /// Replicas the load asked for, before stabilisation, the backlog hold and the budget.
    pub desired: (u32, u32),
    /// Replicas to run.
    pub replicas: (u32, u32),
    /// The TTFT (ms) the model expects of the replicas to run, for the demand planned for.
    pub expected_ttft_ms: f64,
    /// The ITL (ms) the model expects of the replicas to run, for the demand planned for.
    pub expected_itl_ms: f64,
    /// Why.
    pub reason: ScaleReason,
    /// Bounds and budget that changed the result.
    pub limits: Vec<Limit>,
    /// One aggregated worker pool, reported as both pools (its two replica counts are equal).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub aggregated: bool,
}

impl QueueingPlan {
    /// One line saying why the plan is what it is.
    pub fn explanation(&self) -> String {
        let plan = self;
        let bound = |b: sizing::Bound| match b {
            sizing::Bound::Minimum => "the minimum",
            sizing::Bound::Ttft => "TTFT",
            sizing::Bound::Itl => "ITL",
            sizing::Bound::KvCache => "KV cache",
            sizing::Bound::Maximum => "the maximum",
        };
        let head = format!(
            "{}: {:.2} req/s planned ({:.0} forecast x {:.2}, ISL {:.0}, OSL {:.0})",
            plan.reason,
            plan.planned_rate,
            plan.forecast_requests,
            plan.forecast_multiplier,
            plan.isl.mean,
            plan.osl.mean,
        );
        // A pool held above what the load needed (the stabilisation window, a backlog) says
        // what it keeps and what would do; one cut below it, the limits below say why.
        let pool = |kept: u32, needed: u32, noun: &str, why: String| {
            if kept > needed {
                format!("{kept} {noun} kept ({needed} would do: {why})")
            } else {
                format!("{kept} {noun} ({why})")
            }
        };
        let mut line = if plan.aggregated {
            // One pool serves both phases: both sizings report its replicas.
            let why = format!(
                "prefill {}, TTFT {:.0} ms; decode {}",
                bound(plan.prefill_sizing.bound),
                plan.prefill_sizing.ttft_ms,
                bound(plan.decode_sizing.bound)
            );
            let needed = plan.prefill_sizing.replicas.max(plan.decode_sizing.replicas);
            format!(
                "{head}: {}",
                pool(plan.replicas.0, needed, "workers serving prefill and decode", why)
            )
        } else {
            let prefill = format!(
                "{}, TTFT {:.0} ms",
                bound(plan.prefill_sizing.bound),
                plan.prefill_sizing.ttft_ms
            );
            let decode = bound(plan.decode_sizing.bound).to_string();
            format!(
                "{head}: {} and {} replicas",
                pool(plan.replicas.0, plan.prefill_sizing.replicas, "prefill", prefill),
                pool(plan.replicas.1, plan.decode_sizing.replicas, "decode", decode),
            )
        };
        for limit in plan
            .limits
            .iter()
            .filter(|l| !matches!(l, Limit::MinReplicas { .. }))
        {
            line.push_str(&format!("; {limit}"));
        }
        line
    }
}

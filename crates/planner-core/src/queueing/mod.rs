//! The queueing planner: demand counted at arrival, pools sized with queueing theory for the
//! load expected once new replicas are ready, scale-downs stabilised, and a fast path between
//! intervals. Its files are its stages, in the order an interval's tick runs them:
//!
//! 1. [`learn`]: what the interval that just ended teaches (arrivals, length mixes, forecast
//!    errors, burstiness, the decode KV correction);
//! 2. [`forecast`]: the next interval's arrivals and lengths from the predictor;
//! 3. [`demand`]: the forecast raised by its margins to the rates planned for, and the backlog;
//! 4. [`size`]: the fewest engines per pool that meet the targets for that demand;
//! 5. [`hold`]: the stabilisation window and the backlog hold (the one writer of the window),
//!    the growth limit at long delays, then the bounds and the GPU budget
//!    ([`crate::sla::Limits::apply`]).
//!
//! Between intervals the [`fast`] path decides whether to act and at what rate, then reuses
//! stages 3 to 5. [`config`] holds the settings, [`plan`] what a decision reports and [`stats`]
//! the statistics the stages share.

mod config;
mod demand;
mod fast;
mod forecast;
mod hold;
mod learn;
mod plan;
mod size;
mod stats;

use serde::{Deserialize, Serialize};

pub(crate) use self::config::Context;
use self::{
    config::MIN_FORECAST_ERRORS,
    demand::Multipliers,
    fast::{FastBasis, FastState},
    hold::Window,
    learn::{KvLearning, Learned},
    size::Sizer,
};
pub use self::{
    config::{Burstiness, DecodeKv, FastPath, Margins, QueueingConfig, ScaleUp, Stabilisation},
    fast::FastSignals,
    plan::{QueueingPlan, ScaleReason},
};
use crate::{
    interpolation::PerformanceCurves,
    predictor::{Fallback, LoadPredictors},
    sla::{Load, Observation},
};

/// A queueing decision: the plan, the load it was made for and the predictor fallbacks used.
#[derive(Clone, Debug)]
pub(crate) struct Decided {
    pub plan: QueueingPlan,
    pub predicted: Load,
    pub fallbacks: Vec<(String, Fallback)>,
}

/// The queueing planner's state between intervals, one owner per part.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct QueueingState {
    /// Planner clock (s): advanced by the interval at each tick.
    clock_s: f64,
    /// What past intervals taught.
    learned: Learned,
    /// The stabilisation window.
    window: Window,
    /// The fast path's recent rates and the plan it checks against.
    fast: FastState,
}

impl QueueingState {
    /// Advances the clock by one interval (whether or not its metrics arrived).
    pub fn advance(&mut self, interval_s: f64) {
        self.clock_s += interval_s;
    }

    /// One interval: learn, forecast, demand, size, hold. `current` is the replicas asked for;
    /// `intervals` counts the planner's ticks, this one included.
    pub fn tick(
        &mut self,
        ctx: Context<'_>,
        predictors: &mut LoadPredictors,
        curves: &impl PerformanceCurves,
        observation: &Observation,
        current: (u32, u32),
        intervals: u64,
    ) -> Decided {
        let interval_s = ctx.interval_s.max(1e-3);
        // 1. Learn.
        let seen = self.learned.read(curves, observation, current);
        let kv = KvLearning {
            intervals,
            settled: self.window.decode_settled_by(self.clock_s - interval_s),
            decode: current.1,
        };
        self.learned.learn(curves, observation, &seen, ctx, kv);
        // 2. Forecast.
        let forecast = forecast::forecast(
            predictors,
            curves,
            observation,
            seen.arrivals,
            self.learned.lengths(),
        );
        self.learned.remember_forecast(forecast.work());
        // 3. Demand.
        let (demand, multipliers) = demand::plan(&forecast, &self.learned, &seen, ctx.settings, interval_s);
        self.fast.replan(FastBasis::of(&demand));
        // 4. Size.
        let sizer = Sizer::new(curves, ctx, interval_s);
        let sizing = sizer.size(&demand);
        let sustained = sizer.sustained(&demand, &sizing);
        // 5. Hold, and bound.
        let held = hold::hold(
            &mut self.window,
            ctx,
            self.clock_s,
            &demand,
            &sizing,
            sustained,
            current,
        );
        let expected = sizer.expected(&demand, held.replicas);
        Decided {
            predicted: Load {
                num_req: forecast.requests,
                isl: demand.isl.mean,
                osl: demand.osl.mean,
            },
            plan: report(
                &demand,
                (&sizing, expected),
                forecast.requests,
                multipliers,
                held,
                ctx.aggregated.is_some(),
            ),
            fallbacks: forecast.fallbacks,
        }
    }

    /// The fast path, between intervals: `Some` when the SLA is at risk or arrivals surged
    /// and more replicas are needed at once (never fewer). Stages 3 to 5 as for an interval,
    /// at the rate that triggered it.
    pub fn fast_check(
        &mut self,
        ctx: Context<'_>,
        curves: &impl PerformanceCurves,
        signals: &FastSignals,
        current: (u32, u32),
    ) -> Option<Decided> {
        let settings = ctx.settings;
        let interval_s = ctx.interval_s.max(1e-3);
        // Until forecast errors are known, the measured rate gets the cold-start margin too.
        let cold = if self.learned.errors().0.len() < MIN_FORECAST_ERRORS {
            settings.margins.cold.max(1.0)
        } else {
            1.0
        };
        let trigger = self.fast.check(curves, signals, settings, ctx.sla, cold)?;
        // 3. Demand.
        let demand = trigger.demand(&self.learned, settings);
        // 4. Size.
        let sizer = Sizer::new(curves, ctx, interval_s);
        let sizing = sizer.size(&demand);
        // 5. Hold: up only.
        let now = self.clock_s + signals.elapsed_s.max(0.0);
        let held = hold::hold_scale_up(&mut self.window, ctx, now, &sizing, current, &trigger)?;
        let expected = sizer.expected(&demand, held.replicas);
        let no_margin = Multipliers {
            forecast: 1.0,
            service: 1.0,
            decode: 1.0,
        };
        Some(Decided {
            predicted: Load {
                num_req: demand.rate * interval_s,
                isl: demand.isl.mean,
                osl: demand.osl.mean,
            },
            plan: report(
                &demand,
                (&sizing, expected),
                trigger.recent * interval_s,
                no_margin,
                held,
                ctx.aggregated.is_some(),
            ),
            fallbacks: Vec::new(),
        })
    }
}

/// The plan a decision reports, with every intermediate.
fn report(
    demand: &demand::Demand,
    (sizing, expected): (&size::Sizing, (f64, f64)),
    forecast_requests: f64,
    multipliers: Multipliers,
    held: hold::Held,
    aggregated: bool,
) -> QueueingPlan {
    QueueingPlan {
        forecast_requests,
        forecast_multiplier: multipliers.forecast,
        service_multiplier: multipliers.service,
        decode_multiplier: multipliers.decode,
        planned_rate: demand.rate,
        burstiness: demand.burstiness,
        overhead_ms: demand.overhead_s * 1000.0,
        backlog: demand.backlog,
        isl: demand.isl,
        osl: demand.osl,
        prefill_sizing: sizing.prefill,
        decode_sizing: sizing.decode,
        desired: held.desired,
        replicas: held.replicas,
        expected_ttft_ms: expected.0,
        expected_itl_ms: expected.1,
        reason: held.reason,
        limits: held.limits,
        aggregated,
    }
}

#[cfg(test)]
mod tests;

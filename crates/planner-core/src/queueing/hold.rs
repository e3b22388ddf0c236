//! Stage 5, **hold**: what the recommendations of the last stabilisation window allow. A pool
//! scales up at once (at a long scale-up delay, to at most a multiple of its engines serving);
//! it scales down only to a quantile of the window's recommendations, and not at all while a
//! backlog remains; a scale-up between intervals is held for a while. The window and the time
//! the decode pool last settled are written here only.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{
    config::{Context, QueueingConfig},
    demand::{Demand, backlogged},
    fast::Trigger,
    plan::ScaleReason,
    size::Sizing,
    stats::quantile,
};
use crate::sla::{Limit, Pool};

/// The replicas a decision asks for, and why.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Held {
    /// What the load asked for, before stabilisation, the backlog hold and the bounds.
    pub desired: (u32, u32),
    /// Replicas to run.
    pub replicas: (u32, u32),
    /// Why.
    pub reason: ScaleReason,
    /// Bounds and budget that changed the result.
    pub limits: Vec<Limit>,
}

/// Holds an interval's sizing in the window, then bounds it ([`crate::sla::Limits::apply`]);
/// records a change of the decode replicas. `sustained` is what the arrivals alone need (no
/// backlog to drain); `now` is the planner clock.
pub(super) fn hold(
    window: &mut Window,
    ctx: Context<'_>,
    now: f64,
    demand: &Demand,
    sizing: &Sizing,
    sustained: (u32, u32),
    current: (u32, u32),
) -> Held {
    let settings = ctx.settings;
    let desired = (sizing.prefill.replicas, sizing.decode.replicas);
    // A backlog is what the prefill engines serving would take longer than the TTFT target
    // to clear: no pool scales down while one remains.
    let backlogged = backlogged(
        demand.backlog,
        demand.service.mean_s,
        demand.serving,
        ctx.sla.ttft_ms,
    );
    // What the window remembers: what the arrivals alone need, the backlog's drain being
    // held only while it lasts; but when a replica asked for now serves well after the next
    // interval's decision, replicas released after a backlog are not back in time for the
    // next one, so the drain is remembered too.
    let remembered = if settings.is_long_delay(ctx.interval_s) {
        desired
    } else {
        (
            desired.0.min(sustained.0.max(ctx.limits.prefill.min)),
            desired.1.min(sustained.1),
        )
    };
    let (replicas, held) = window.stabilise(settings, now, desired, remembered, current, backlogged);
    let (replicas, ramped) = ramp(ctx, replicas, (demand.serving, demand.decode_serving), current);
    let reason = if held && backlogged {
        ScaleReason::BacklogHold {
            backlog: demand.backlog,
        }
    } else if held {
        ScaleReason::Stabilising
    } else if sizing.prefill.replicas > sustained.0 {
        ScaleReason::Backlog {
            backlog: demand.backlog,
            growth: demand.growth,
        }
    } else {
        ScaleReason::Forecast
    };
    let bounded = ctx.bound(replicas);
    window.decode_changed(now, current.1, bounded.replicas.1, settings.scale_up_delay_s);
    Held {
        desired,
        replicas: bounded.replicas,
        reason,
        limits: ramped.into_iter().chain(bounded.limits).collect(),
    }
}

/// Holds a scale-up the fast path's `trigger` made between intervals for its hold time (at most
/// the window) and bounds it; `None` when the bounded replicas add nothing to `current` (never
/// fewer). `now` is the planner clock.
pub(super) fn hold_scale_up(
    window: &mut Window,
    ctx: Context<'_>,
    now: f64,
    sizing: &Sizing,
    current: (u32, u32),
    trigger: &Trigger,
) -> Option<Held> {
    let desired = (sizing.prefill.replicas, sizing.decode.replicas);
    let (wanted, ramped) = ramp(
        ctx,
        (desired.0.max(current.0), desired.1.max(current.1)),
        trigger.serving(),
        current,
    );
    let hold_s = trigger.hold_s(ctx.settings);
    let bounded = ctx.bound(wanted);
    let replicas = never_fewer(bounded.replicas, current, ctx.limits, ctx.aggregated.is_some())?;
    let span = ctx.settings.stabilisation.window_s.max(0.0);
    // It enters the window as if recommended `span − hold_s` earlier.
    let held_from = now - span + hold_s.clamp(0.0, span);
    window.desired.push_back((held_from, replicas.0, replicas.1));
    window.decode_changed(now, current.1, replicas.1, ctx.settings.scale_up_delay_s);
    Some(Held {
        desired,
        replicas,
        reason: trigger.reason(),
        limits: ramped.into_iter().chain(bounded.limits).collect(),
    })
}

/// `wanted` within what each pool may grow to at a long delay ([`super::config::ScaleUp`])
/// from its engines `serving`, and the limits that cut it. `current` is the replicas asked for:
/// never fewer.
fn ramp(
    ctx: Context<'_>,
    wanted: (u32, u32),
    serving: (f64, f64),
    current: (u32, u32),
) -> ((u32, u32), Vec<Limit>) {
    let settings = ctx.settings;
    if !settings.is_long_delay(ctx.interval_s) || settings.scale_up_delay_assumed {
        return (wanted, Vec::new());
    }
    let mut limits = Vec::new();
    let mut limit =
        |pool: Pool, needed: u32, serving: f64, current: u32| match settings.scale_up.limit(serving, current)
        {
            Some(allowed) if needed > allowed => {
                limits.push(Limit::ScaleUpRate {
                    pool,
                    needed,
                    allowed,
                    serving,
                });
                allowed
            }
            _ => needed,
        };
    let replicas = (
        limit(Pool::Prefill, wanted.0, serving.0, current.0),
        limit(Pool::Decode, wanted.1, serving.1, current.1),
    );
    (replicas, limits)
}

/// `bounded` raised to `current` in a pool where it is lower (a scale-up between intervals
/// never removes a replica); `None` when that adds nothing, or when it would break the GPU
/// budget: the budget's split of a larger total can move a replica from one pool to the other,
/// and keeping both would exceed it (the interval's decision rebalances the pools instead).
/// An aggregated pool is one pool reported twice: its GPUs are counted once.
fn never_fewer(
    bounded: (u32, u32),
    current: (u32, u32),
    limits: &crate::sla::Limits,
    aggregated: bool,
) -> Option<(u32, u32)> {
    if bounded.0 <= current.0 && bounded.1 <= current.1 {
        return None;
    }
    let replicas = (bounded.0.max(current.0), bounded.1.max(current.1));
    let decode_gpus = u64::from(replicas.1) * u64::from(limits.decode_gpus_per_engine.max(1));
    let gpus = if aggregated {
        decode_gpus
    } else {
        u64::from(replicas.0) * u64::from(limits.prefill_gpus_per_engine.max(1)) + decode_gpus
    };
    if limits
        .max_gpu_budget
        .is_some_and(|budget| gpus > u64::from(budget))
    {
        return None;
    }
    Some(replicas)
}

/// The stabilisation window's recommendations and when the decode pool last settled.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub(super) struct Window {
    /// Recommendations `(time, prefill, decode)` within the stabilisation window.
    desired: VecDeque<(f64, u32, u32)>,
    /// Planner clock when the last change of the decode replicas had taken effect (a
    /// scale-up once its replicas are ready).
    decode_settled_s: f64,
}

impl Window {
    /// Applies the window and the backlog hold to an interval's recommendation; returns the
    /// replicas and whether a scale-down was held back. `sustained` is what the window
    /// remembers ([`hold`] says what: usually what the arrivals alone need, so what draining a
    /// backlog needs on top is held only while the backlog lasts, `backlogged`).
    pub fn stabilise(
        &mut self,
        settings: &QueueingConfig,
        now: f64,
        desired: (u32, u32),
        sustained: (u32, u32),
        current: (u32, u32),
        backlogged: bool,
    ) -> ((u32, u32), bool) {
        // A planner that has just started has seen no load yet to justify a scale-down: the
        // replicas it found count as recommended.
        if self.desired.is_empty() {
            self.desired.push_back((now, current.0, current.1));
        }
        self.desired
            .push_back((now, sustained.0.min(desired.0), sustained.1.min(desired.1)));
        let window = settings.stabilisation.window_s.max(0.0);
        // The window is (now − window, now], as Kubernetes keeps recommendations newer than the
        // cutoff: a recommendation made a full window ago no longer holds.
        self.desired.retain(|(t, _, _)| *t > now - window + 1e-9);
        let of_window = |pool: fn(&(f64, u32, u32)) -> u32| {
            quantile(
                self.desired.iter().map(|r| f64::from(pool(r))),
                settings.stabilisation.quantile,
            )
            .map_or(0, |v| v.ceil() as u32)
        };
        // Where a scale-down stops: the window's quantile, rounded up.
        let floor = (of_window(|r| r.1), of_window(|r| r.2));
        let hold = |want: u32, current: u32, floor: u32| {
            if want >= current {
                want
            } else if backlogged {
                current
            } else {
                floor.max(want).min(current)
            }
        };
        let replicas = (
            hold(desired.0, current.0, floor.0),
            hold(desired.1, current.1, floor.1),
        );
        (replicas, replicas.0 > desired.0 || replicas.1 > desired.1)
    }

    /// Records a change of the decode replicas from `before` to `after` at `now`: it settles
    /// once a scale-up's replicas are ready (`scale_up_delay_s`), at once for a scale-down.
    pub fn decode_changed(&mut self, now: f64, before: u32, after: u32, scale_up_delay_s: f64) {
        if after != before {
            let delay = if after > before {
                scale_up_delay_s.max(0.0)
            } else {
                0.0
            };
            self.decode_settled_s = now + delay;
        }
    }

    /// Whether the decode replicas had settled by `time`.
    pub fn decode_settled_by(&self, time: f64) -> bool {
        self.decode_settled_s <= time + 1e-6
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sla::PoolLimits;

    #[test]
    fn the_stabilisation_quantile_lets_one_outlier_recommendation_go() {
        let window = || Window {
            desired: [(0.0, 5, 4), (60.0, 9, 6), (120.0, 5, 4), (180.0, 5, 4)]
                .into_iter()
                .collect(),
            ..Window::default()
        };
        let mut highest = QueueingConfig::default();
        highest.stabilisation.quantile = 1.0;
        let (replicas, held) = window().stabilise(&highest, 240.0, (5, 4), (5, 4), (9, 6), false);
        assert_eq!((replicas, held), ((9, 6), true));
        // The upper quartile of [5, 5, 5, 5, 9] is 5.
        let mut quartile = highest.clone();
        quartile.stabilisation.quantile = 0.75;
        let (replicas, held) = window().stabilise(&quartile, 240.0, (5, 4), (5, 4), (9, 6), false);
        assert_eq!((replicas, held), ((5, 4), false));
        // Two high recommendations of five are not an outlier.
        let mut twice = window();
        twice.desired[2] = (120.0, 8, 6);
        let (replicas, _) = twice.stabilise(&quartile, 240.0, (5, 4), (5, 4), (9, 6), false);
        assert_eq!(replicas, (8, 6));
        // A backlog holds whatever the window says.
        let (replicas, _) = window().stabilise(&quartile, 240.0, (5, 4), (5, 4), (9, 6), true);
        assert_eq!(replicas, (9, 6));
    }

    #[test]
    fn a_scale_up_between_intervals_keeps_every_replica_and_the_gpu_budget() {
        let limits = crate::sla::Limits {
            prefill: PoolLimits::new(1, Some(64)),
            decode: PoolLimits::new(1, Some(64)),
            max_gpu_budget: Some(24),
            prefill_gpus_per_engine: 4,
            decode_gpus_per_engine: 4,
            ratio: None,
        };
        // Room in the budget: the pool that needs more grows, the other keeps what it has.
        assert_eq!(never_fewer((3, 2), (2, 2), &limits, false), Some((3, 2)));
        assert_eq!(never_fewer((2, 2), (3, 2), &limits, false), None);
        // At the budget (5 + 1 engines, 24 GPUs), its split of a larger need moves a replica
        // to decode: keeping the fifth prefill engine as well would take 28 GPUs.
        assert_eq!(limits.apply((5, 2)).replicas, (4, 2));
        assert_eq!(never_fewer((4, 2), (5, 1), &limits, false), None);
        // Without a budget both are kept.
        let unbudgeted = crate::sla::Limits {
            max_gpu_budget: None,
            ..limits
        };
        assert_eq!(never_fewer((4, 2), (5, 1), &unbudgeted, false), Some((5, 2)));
    }

    #[test]
    fn decode_settles_once_a_scale_up_is_ready_and_at_once_after_a_scale_down() {
        let mut window = Window::default();
        window.decode_changed(100.0, 2, 4, 60.0);
        assert!(!window.decode_settled_by(159.0));
        assert!(window.decode_settled_by(160.0));
        window.decode_changed(200.0, 4, 3, 60.0);
        assert!(window.decode_settled_by(200.0));
        // No change, no new settle time.
        window.decode_changed(300.0, 3, 3, 60.0);
        assert!(window.decode_settled_by(200.0));
    }
}

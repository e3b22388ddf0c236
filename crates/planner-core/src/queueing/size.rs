//! Stage 4, **size**: the fewest engines of each pool that meet the latency targets for a
//! demand ([`crate::sizing`] has the models), with the backlog drained within one interval.

use super::{
    config::{Context, QueueingConfig},
    demand::Demand,
};
use crate::{
    aggregated::{self, AggregatedDemand, AggregatedEngine},
    interpolation::PerformanceCurves,
    sizing::{self, DecodeModel, DecodeSizing, LatencyTargets, PrefillSizing, SEARCH_LIMIT},
};

/// Both pools' sizes for a demand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Sizing {
    /// Prefill: the arrivals and the backlog to drain.
    pub prefill: PrefillSizing,
    /// Decode: the arrivals and the drained backlog.
    pub decode: DecodeSizing,
}

/// What every search of one decision shares: the curves, the targets and the replica range.
pub(super) struct Sizer<'a, C> {
    curves: &'a C,
    settings: &'a QueueingConfig,
    targets: LatencyTargets,
    /// Where the searches start (prefill, decode): each pool's minimum.
    min: (u32, u32),
    /// Where they stop (prefill, decode).
    max: (u32, u32),
    interval_s: f64,
    aggregated: Option<&'a AggregatedEngine>,
}

impl<'a, C: PerformanceCurves> Sizer<'a, C> {
    /// Searches from the limits' minimum to [`SEARCH_LIMIT`]: a search answers what the load
    /// needs, and the maximum and the budget bound that afterwards ([`Context::bound`]), which
    /// records what they cut.
    pub fn new(curves: &'a C, ctx: Context<'a>, interval_s: f64) -> Self {
        let min = ctx.limits.min_replicas();
        Self {
            curves,
            settings: ctx.settings,
            targets: ctx.settings.targets(ctx.sla),
            min,
            max: (SEARCH_LIMIT.max(min.0), SEARCH_LIMIT.max(min.1)),
            interval_s,
            aggregated: ctx.aggregated,
        }
    }

    /// Both pools, sized for the demand with its backlog (and its growth) drained within one
    /// interval: draining it feeds decode faster than arrivals do.
    pub fn size(&self, demand: &Demand) -> Sizing {
        let drain = demand.backlog + demand.growth;
        if let Some(engine) = self.aggregated {
            return self.aggregated(engine, demand, drain);
        }
        Sizing {
            prefill: self.prefill(demand, drain),
            decode: self.decode(demand, demand.decode_rate + drain / self.interval_s),
        }
    }

    /// What the arrivals alone need (prefill, decode): no backlog to drain.
    pub fn sustained(&self, demand: &Demand, with_backlog: &Sizing) -> (u32, u32) {
        let drain = demand.backlog + demand.growth;
        if let Some(engine) = self.aggregated {
            if drain > 0.0 {
                let alone = self.aggregated(engine, demand, 0.0);
                return (alone.prefill.replicas, alone.decode.replicas);
            }
            return (with_backlog.prefill.replicas, with_backlog.decode.replicas);
        }
        let prefill = if drain > 0.0 {
            self.prefill(demand, 0.0).replicas
        } else {
            with_backlog.prefill.replicas
        };
        let decode = if drain / self.interval_s > 0.0 {
            self.decode(demand, demand.decode_rate).replicas
        } else {
            with_backlog.decode.replicas
        };
        (prefill, decode)
    }

    /// The TTFT and ITL (ms) the models expect of `replicas` for the demand's arrivals (with
    /// its backlog drained): what the decision's replicas deliver, whatever held them.
    pub fn expected(&self, demand: &Demand, replicas: (u32, u32)) -> (f64, f64) {
        let pinned = |n: u32| Sizer {
            curves: self.curves,
            settings: self.settings,
            targets: self.targets,
            min: (n, n),
            max: (n, n),
            interval_s: self.interval_s,
            aggregated: self.aggregated,
        };
        let sizing = if self.aggregated.is_some() {
            pinned(replicas.0.max(replicas.1)).size(demand)
        } else {
            Sizing {
                prefill: pinned(replicas.0).size(demand).prefill,
                decode: pinned(replicas.1).size(demand).decode,
            }
        };
        (sizing.prefill.ttft_ms, sizing.decode.itl_ms)
    }

    /// One aggregated pool for the demand's arrivals and `drain` requests drained within one
    /// interval, reported as both pools.
    fn aggregated(&self, engine: &AggregatedEngine, demand: &Demand, drain: f64) -> Sizing {
        let drain_rate = if drain.is_finite() && drain > 0.0 {
            drain / self.interval_s
        } else {
            0.0
        };
        let sized = aggregated::size_aggregated(
            self.curves,
            engine,
            &AggregatedDemand {
                prefill_rate: demand.rate + drain_rate,
                decode_rate: demand.decode_rate + drain_rate,
                service: demand.service,
                burstiness: demand.burstiness,
                isl: demand.isl,
                osl: demand.osl,
            },
            &self.decode_model(demand),
            &self.targets,
            self.min.1,
            self.max.1,
        );
        Sizing {
            prefill: sized.prefill,
            decode: sized.decode,
        }
    }

    fn decode_model(&self, demand: &Demand) -> DecodeModel {
        let kv = &self.settings.decode_kv;
        DecodeModel {
            kv_sigmas: if self.settings.is_long_delay(self.interval_s) {
                kv.long_delay_sigmas
            } else {
                kv.sigmas
            },
            kv_fill: self.settings.decode_kv.fill,
            kv_scale: demand.kv_scale,
        }
    }

    /// Prefill for the demand's arrivals and `backlog` requests drained within one interval.
    fn prefill(&self, demand: &Demand, backlog: f64) -> PrefillSizing {
        sizing::size_prefill(
            &demand.service,
            demand.rate,
            backlog,
            self.interval_s,
            demand.burstiness,
            demand.overhead_s,
            &self.targets,
            self.min.0,
            self.max.0,
        )
    }

    fn decode(&self, demand: &Demand, rate: f64) -> DecodeSizing {
        sizing::size_decode(
            self.curves,
            rate,
            &demand.isl,
            &demand.osl,
            &self.decode_model(demand),
            &self.targets,
            self.min.1,
            self.max.1,
        )
    }
}

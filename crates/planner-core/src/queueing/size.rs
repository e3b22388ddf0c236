//! Stage 4, **size**: the fewest engines of each pool that meet the latency targets for a
//! demand ([`crate::sizing`] has the models), with the backlog drained within one interval.

use super::{config::QueueingConfig, demand::Demand};
use crate::{
    interpolation::PerformanceCurves,
    sizing::{self, DecodeModel, DecodeSizing, LatencyTargets, PrefillSizing, SEARCH_LIMIT},
    sla::{Limits, SlaTargets},
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
    min: u32,
    max: u32,
    interval_s: f64,
}

impl<'a, C: PerformanceCurves> Sizer<'a, C> {
    /// Searches from `limits`' minimum to [`SEARCH_LIMIT`]: a search answers what the load
    /// needs, and the maximum and the budget bound that afterwards ([`Limits::apply`]), which
    /// records what they cut.
    pub fn new(
        curves: &'a C,
        settings: &'a QueueingConfig,
        sla: &SlaTargets,
        limits: &Limits,
        interval_s: f64,
    ) -> Self {
        let min = limits.min_replicas;
        Self {
            curves,
            settings,
            targets: settings.targets(sla),
            min,
            max: SEARCH_LIMIT.max(min),
            interval_s,
        }
    }

    /// Both pools, sized for the demand with its backlog (and its growth) drained within one
    /// interval: draining it feeds decode faster than arrivals do.
    pub fn size(&self, demand: &Demand) -> Sizing {
        let drain = demand.backlog + demand.growth;
        Sizing {
            prefill: self.prefill(demand, drain),
            decode: self.decode(demand, demand.decode_rate + drain / self.interval_s),
        }
    }

    /// What the arrivals alone need (prefill, decode): no backlog to drain.
    pub fn sustained(&self, demand: &Demand, with_backlog: &Sizing) -> (u32, u32) {
        let drain = demand.backlog + demand.growth;
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

    /// Prefill for the demand's arrivals and `backlog` requests drained within one interval.
    fn prefill(&self, demand: &Demand, backlog: f64) -> PrefillSizing {
        sizing::size_prefill(
            &demand.service,
            demand.rate,
            backlog,
            self.interval_s,
            demand.burstiness,
            &self.targets,
            self.min,
            self.max,
        )
    }

    fn decode(&self, demand: &Demand, rate: f64) -> DecodeSizing {
        sizing::size_decode(
            self.curves,
            rate,
            &demand.isl,
            &demand.osl,
            &DecodeModel {
                kv_sigmas: self.settings.decode_kv.sigmas,
                kv_fill: self.settings.decode_kv.fill,
                kv_scale: demand.kv_scale,
            },
            &self.targets,
            self.min,
            self.max,
        )
    }
}

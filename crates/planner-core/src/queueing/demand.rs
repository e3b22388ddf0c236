//! Stage 3, **demand**: what the pools must serve once a replica asked for now is ready: the
//! forecast raised by its margins to the planned arrival rates ([`planned_rates`], the one
//! place the margins meet), the burstiness at that rate, and the backlog with what it grows to
//! during the scale-up delay.

use std::collections::VecDeque;

use super::{
    config::{MAX_FORECAST_MULTIPLIER, MAX_SERVICE_BIAS, MIN_FORECAST_ERRORS, Margins, QueueingConfig},
    forecast::Forecast,
    learn::{Interval, Learned},
    stats::quantile,
};
use crate::sizing::{LengthMoments, MIN_BURSTINESS, ServiceMoments};

/// What the pools are sized for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Demand {
    /// Prefill arrival rate (requests/s).
    pub rate: f64,
    /// Arrival rate the decode pool is sized for (requests/s).
    pub decode_rate: f64,
    /// Prefill service time.
    pub service: ServiceMoments,
    /// Arrival burstiness.
    pub burstiness: f64,
    /// First-token overhead (s): from the end of a prefill to the first token.
    pub overhead_s: f64,
    /// Prefill engines serving.
    pub serving: f64,
    /// Decode engines serving.
    pub decode_serving: f64,
    /// Requests waiting beyond those being prefilled.
    pub backlog: f64,
    /// Requests expected to queue up before a replica asked for now serves.
    pub growth: f64,
    /// Prompt-length mix.
    pub isl: LengthMoments,
    /// Output-length mix.
    pub osl: LengthMoments,
    /// Measured over modelled KV tokens per running request.
    pub kv_scale: f64,
}

/// The margins an interval's plan applied to its forecast.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Multipliers {
    /// Of the arrival forecast (the work's multiplier over the service time's).
    pub forecast: f64,
    /// Of the mean prefill time.
    pub service: f64,
    /// Of the decode KV demand.
    pub decode: f64,
}

/// The planned rates and prefill time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Planned {
    /// Prefill arrival rate (requests/s).
    pub rate: f64,
    /// Decode arrival rate (requests/s).
    pub decode_rate: f64,
    /// Prefill service time, its mean corrected for the forecast's bias.
    pub service: ServiceMoments,
    /// The multipliers.
    pub multipliers: Multipliers,
}

/// The margin stack: what the next interval is planned for. With the point forecast `F` of the
/// arrivals, its prompt mix's prefill time `S̄`, the interval `T`, the arrivals `A` of the
/// interval just observed and the recent relative forecast errors (`ln(actual / forecast)`, at
/// horizons one and two) `e_w` of the prefill work (arrivals × mean prefill time), `e_s` of the
/// mean prefill time and `e_d` of the decode KV demand:
///
/// ```text
/// m_w = clamp(exp(Q_forecast_quantile(e_w)), 1/√10, max_multiplier)   or cold        until 6 errors
/// m_s = clamp(exp(Q_service_quantile(e_s)),  1/2,   2)                or 1
/// m_d = clamp(exp(Q_decode_quantile(e_d)),   1/√10, max_multiplier)   or decode_cold
/// λ_prefill = max(F · (m_w / m_s) / T, A / T)      E[S] = S̄ · m_s
/// λ_decode  = max(F · m_d / T,          A / T)
/// ```
///
/// (the cold margins are clamped the same way, at least 1). Prefill then sizes for
/// `λ_prefill` with the burstiness at that rate ([`Learned::burstiness_at`]) and decode for
/// `λ_decode` with `decode_kv.sigmas` standard deviations of KV demand within
/// `decode_kv.fill` of the cache ([`crate::sizing`]).
pub(super) fn planned_rates(
    forecast: &Forecast,
    learned: &Learned,
    arrivals: f64,
    margins: &Margins,
    interval_s: f64,
) -> Planned {
    let (errors, service_errors, decode_errors) = learned.errors();
    let multiplier_of = |errors: &VecDeque<f64>, q: f64, cold: f64| {
        let from_errors = quantile(errors.iter().copied(), q).map(f64::exp);
        match from_errors {
            Some(m) if errors.len() >= MIN_FORECAST_ERRORS => m,
            _ => cold.max(1.0),
        }
        .clamp(
            1.0 / MAX_FORECAST_MULTIPLIER.sqrt(),
            margins.max_multiplier.clamp(1.0, MAX_FORECAST_MULTIPLIER),
        )
    };
    let work = multiplier_of(errors, margins.forecast_quantile, margins.cold);
    // The mean prefill time corrected for the forecast's bias; the rate carries the rest of the
    // work's margin.
    let service = if service_errors.len() >= MIN_FORECAST_ERRORS {
        quantile(service_errors.iter().copied(), margins.service_quantile)
            .map_or(1.0, f64::exp)
            .clamp(1.0 / MAX_SERVICE_BIAS, MAX_SERVICE_BIAS)
    } else {
        1.0
    };
    let multipliers = Multipliers {
        forecast: work / service,
        service,
        decode: multiplier_of(decode_errors, margins.decode_quantile, margins.decode_cold),
    };
    // Never below the rate that just arrived, whatever the forecast says.
    let observed = arrivals / interval_s;
    Planned {
        rate: (forecast.requests * multipliers.forecast / interval_s).max(observed),
        decode_rate: (forecast.requests * multipliers.decode / interval_s).max(observed),
        service: ServiceMoments {
            mean_s: forecast.service.mean_s * service,
            ..forecast.service
        },
        multipliers,
    }
}

/// The demand of the next interval: the planned rates, the burstiness at the prefill rate, the
/// interval's backlog and what it grows to.
pub(super) fn plan(
    forecast: &Forecast,
    learned: &Learned,
    seen: &Interval,
    settings: &QueueingConfig,
    interval_s: f64,
) -> (Demand, Multipliers) {
    let planned = planned_rates(forecast, learned, seen.arrivals, &settings.margins, interval_s);
    let rate = planned.rate;
    let demand = Demand {
        rate,
        decode_rate: planned.decode_rate,
        service: planned.service,
        burstiness: settings
            .bounded_burstiness(learned.burstiness_at(settings, rate).unwrap_or(MIN_BURSTINESS)),
        overhead_s: learned.overhead_s(),
        serving: seen.serving,
        decode_serving: seen.decode_serving,
        backlog: seen.backlog,
        growth: growth(
            rate,
            planned.service.mean_s,
            seen.serving,
            settings.scale_up_delay_s,
        ),
        isl: forecast.isl,
        osl: forecast.osl,
        kv_scale: learned.kv_scale(),
    };
    (demand, planned.multipliers)
}

/// Requests that queue up before a replica asked for now serves: the arrivals at `rate` beyond
/// what the `serving` engines prefill, over the scale-up delay.
pub(super) fn growth(rate: f64, service_s: f64, serving: f64, scale_up_delay_s: f64) -> f64 {
    if service_s > 0.0 {
        (rate * service_s - serving).max(0.0) / service_s * scale_up_delay_s
    } else {
        0.0
    }
}

/// Whether `backlog` requests waiting beyond the `serving` prefill engines take those engines
/// longer than the TTFT target to clear (any backlog does when none serve): no pool scales down
/// while one does, and the fast path ignores a smaller one.
pub(super) fn backlogged(backlog: f64, service_s: f64, serving: f64, ttft_ms: f64) -> bool {
    if serving > 0.0 {
        backlog * service_s / serving > ttft_ms / 1000.0
    } else {
        backlog > 0.0
    }
}

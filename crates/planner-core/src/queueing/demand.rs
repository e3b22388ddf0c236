//! Stage 3, **demand**: what the pools must serve once a replica asked for now is ready. The
//! forecast is raised by its margins to the planned arrival rates, and the backlog is
//! carried with what it grows to during the scale-up delay.

use std::collections::VecDeque;

use super::{
    config::{MAX_FORECAST_MULTIPLIER, MAX_SERVICE_BIAS, MIN_FORECAST_ERRORS, QueueingConfig},
    forecast::Forecast,
    learn::{Interval, Learned},
    stats::quantile,
};
use crate::sizing::{LengthMoments, ServiceMoments};

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
    /// Prefill engines serving.
    pub serving: f64,
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

/// The demand of the next interval: the forecast raised by its margins, the interval's backlog
/// and what it grows to.
pub(super) fn plan(
    forecast: &Forecast,
    learned: &Learned,
    seen: &Interval,
    settings: &QueueingConfig,
    interval_s: f64,
) -> (Demand, Multipliers) {
    let (errors, service_errors, decode_errors) = learned.errors();
    // Upper quantiles of the recent relative errors, as multipliers of the forecast work.
    let margin = settings.forecast_margin.max(0.0);
    let multiplier_of = |errors: &VecDeque<f64>, q: f64, cold: f64| {
        let from_errors = quantile(errors.iter().copied(), q).map(f64::exp);
        match from_errors {
            Some(m) if errors.len() >= MIN_FORECAST_ERRORS => m.max(margin),
            _ => margin.max(cold).max(1.0),
        }
        .clamp(
            1.0 / MAX_FORECAST_MULTIPLIER.sqrt(),
            settings
                .max_forecast_multiplier
                .clamp(1.0, MAX_FORECAST_MULTIPLIER),
        )
    };
    // The prefill work (arrivals × mean prefill time) at its upper quantile; the mean
    // prefill time itself corrected for the forecast's bias (its median error), the rate
    // carrying the rest.
    let work_multiplier = multiplier_of(errors, settings.forecast_quantile, settings.cold_margin);
    let service_multiplier = if service_errors.len() >= MIN_FORECAST_ERRORS {
        quantile(service_errors.iter().copied(), settings.service_quantile)
            .map_or(1.0, f64::exp)
            .clamp(1.0 / MAX_SERVICE_BIAS, MAX_SERVICE_BIAS)
    } else {
        1.0
    };
    let multiplier = work_multiplier / service_multiplier;
    let decode_multiplier = multiplier_of(
        decode_errors,
        settings.decode_forecast_quantile,
        settings.decode_cold_margin.unwrap_or(settings.cold_margin),
    );
    let service = ServiceMoments {
        mean_s: forecast.service.mean_s * service_multiplier,
        ..forecast.service
    };
    let floor = seen.arrivals / interval_s * settings.observed_floor.max(0.0);
    let rate = (forecast.requests * multiplier / interval_s).max(floor);
    let decode_rate = (forecast.requests * decode_multiplier / interval_s).max(floor);
    let burstiness = settings.bounded_burst(
        learned
            .burstiness_at(settings, rate)
            .unwrap_or(settings.arrival_scv),
    );
    let demand = Demand {
        rate,
        decode_rate,
        service,
        burstiness,
        serving: seen.serving,
        backlog: seen.backlog,
        growth: growth(rate, service.mean_s, seen.serving, settings.scale_up_delay_s),
        isl: forecast.isl,
        osl: forecast.osl,
        kv_scale: learned.kv_scale(),
    };
    let multipliers = Multipliers {
        forecast: multiplier,
        service: service_multiplier,
        decode: decode_multiplier,
    };
    (demand, multipliers)
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
/// longer than the TTFT target to clear (any backlog does when none serve).
pub(super) fn backlogged(backlog: f64, service_s: f64, serving: f64, ttft_ms: f64) -> bool {
    if serving > 0.0 {
        backlog * service_s / serving > ttft_ms / 1000.0
    } else {
        backlog > 0.0
    }
}

//! Every limit of a PlannerPolicy field, in one place. The CRD schema's CEL rules are written
//! from these values, and the admission webhook checks the same values (with messages that say
//! more), so `kubectl apply` with or without the webhook refuses the same policies.
//!
//! Why each limit:
//! - `adjustmentInterval`, 10s to 24h (`sla`, `observe`), to 1h (`load`): below 10s the
//!   Prometheus rates over the interval are mostly noise; above a day the predictor sees too few
//!   points to be useful. The load planner moves one replica per interval, so a longer interval
//!   makes it too slow to follow load.
//! - `load.metricPullingInterval`, 100ms to 60s and at most half the interval: the load planner
//!   averages several samples per interval.
//! - `connector.decisionTimeout`, 1s to 24h: an external actor that has not acknowledged a
//!   decision within a day is gone.
//! - `behavior` windows, at most 1h: a longer scale-up delay or stabilisation window plans for
//!   load the predictor cannot see.
//! - `behavior.fastCheckPeriod`, 5s to 5m or `0s` (off): faster than two scrapes of a typical
//!   15 s scrape interval reads no new data; slower than 5 min is no longer fast.
//! - replicas, at most 512 per pool: garbage metrics must never ask for thousands of GPUs.

use std::time::Duration;

use kube::core::{Message, Rule};

use crate::duration::format_duration;

/// A duration field's range, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationRange {
    /// Shortest.
    pub min: Duration,
    /// Longest.
    pub max: Duration,
}

impl DurationRange {
    /// Whether `value` is within the range.
    pub fn contains(&self, value: Duration) -> bool {
        (self.min..=self.max).contains(&value)
    }

    /// `10s to 24h`, for messages.
    pub fn describe(&self) -> String {
        format!("{} to {}", format_duration(self.min), format_duration(self.max))
    }
}

/// `spec.adjustmentInterval` in modes `sla` and `observe`.
pub const ADJUSTMENT_INTERVAL: DurationRange = DurationRange {
    min: Duration::from_secs(10),
    max: Duration::from_secs(24 * 3600),
};

/// `spec.adjustmentInterval` in mode `load`.
pub const ADJUSTMENT_INTERVAL_LOAD: DurationRange = DurationRange {
    min: Duration::from_secs(10),
    max: Duration::from_secs(3600),
};

/// `spec.load.metricPullingInterval` (and at most half the adjustment interval in `load` mode).
pub const METRIC_PULLING_INTERVAL: DurationRange = DurationRange {
    min: Duration::from_millis(100),
    max: Duration::from_secs(60),
};

/// `spec.connector.decisionTimeout`.
pub const DECISION_TIMEOUT: DurationRange = DurationRange {
    min: Duration::from_secs(1),
    max: Duration::from_secs(24 * 3600),
};

/// `spec.behavior.scaleUpDelay`, `expectedScaleUpDelay` and `scaleDownStabilization`.
pub const BEHAVIOR_WINDOW: DurationRange = DurationRange {
    min: Duration::ZERO,
    max: Duration::from_secs(3600),
};

/// `spec.behavior.fastCheckPeriod` when it is not `0s` (off).
pub const FAST_CHECK_PERIOD: DurationRange = DurationRange {
    min: Duration::from_secs(5),
    max: Duration::from_secs(300),
};

/// Most replicas of a pool (`spec.bounds.maxReplicas` and the per-pool ones), and the most a pool
/// is ever asked for when no maximum is set.
pub const MAX_REPLICAS: i32 = 512;

/// The grammar of a Go duration, as the schema's `pattern` checks it.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$";

/// `expression` on a duration field, written so that a value the pattern refuses gets the
/// pattern's error and not a CEL evaluation error.
fn on_duration(field: &str, expression: &str) -> String {
    let pattern = DURATION_PATTERN.replace('\\', "\\\\");
    format!("!{field}.matches('{pattern}') || ({expression})")
}

fn cel(duration: Duration) -> String {
    format!("duration('{}')", format_duration(duration))
}

/// The rule of a duration field (`self`) within `range`; `field` names it in the message.
pub fn duration_rule(field: &str, range: DurationRange) -> Rule {
    let bounds = if range.min.is_zero() {
        format!("duration(self) <= {}", cel(range.max))
    } else {
        format!(
            "duration(self) >= {} && duration(self) <= {}",
            cel(range.min),
            cel(range.max)
        )
    };
    Rule::new(on_duration("self", &bounds))
        .message(Message::Message(format!("{field} must be {}", range.describe())))
}

/// The rule of `behavior.fastCheckPeriod`: `0s` or within [`FAST_CHECK_PERIOD`].
pub fn fast_check_rule() -> Rule {
    let range = FAST_CHECK_PERIOD;
    Rule::new(on_duration(
        "self",
        &format!(
            "duration(self) == duration('0s') || (duration(self) >= {} && duration(self) <= {})",
            cel(range.min),
            cel(range.max)
        ),
    ))
    .message(Message::Message(format!(
        "spec.behavior.fastCheckPeriod must be 0s (off) or {}",
        range.describe()
    )))
}

/// The spec's rule that a `load` policy's interval is at most [`ADJUSTMENT_INTERVAL_LOAD`]'s
/// maximum.
pub fn load_interval_rule() -> Rule {
    let max = ADJUSTMENT_INTERVAL_LOAD.max;
    Rule::new(format!(
        "!has(self.mode) || self.mode != 'load' || {}",
        on_duration(
            "self.adjustmentInterval",
            &format!("duration(self.adjustmentInterval) <= {}", cel(max))
        )
    ))
    .message(Message::Message(format!(
        "spec.adjustmentInterval must be at most {} in mode load",
        format_duration(max)
    )))
    .field_path(".adjustmentInterval")
}

/// The spec's rule that a `load` policy samples at least twice per interval.
pub fn pulling_interval_rule() -> Rule {
    let both = "self.load.metricPullingInterval.matches('{p}') && self.adjustmentInterval.matches('{p}')"
        .replace("{p}", &DURATION_PATTERN.replace('\\', "\\\\"));
    Rule::new(format!(
        "!has(self.mode) || self.mode != 'load' || !has(self.load) || !({both}) || \
         duration(self.load.metricPullingInterval) + duration(self.load.metricPullingInterval) <= duration(self.adjustmentInterval)"
    ))
    .message("spec.load.metricPullingInterval must be at most half of spec.adjustmentInterval in mode load")
    .field_path(".load.metricPullingInterval")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_read_as_the_ranges() {
        let rule = duration_rule("spec.connector.decisionTimeout", DECISION_TIMEOUT);
        assert!(
            rule.rule
                .ends_with("(duration(self) >= duration('1s') && duration(self) <= duration('24h'))"),
            "{}",
            rule.rule
        );
        assert!(rule.rule.starts_with(r"!self.matches('^([0-9]+(\\.[0-9]+)?"));
        let window = duration_rule("spec.behavior.scaleUpDelay", BEHAVIOR_WINDOW);
        assert!(window.rule.ends_with("(duration(self) <= duration('1h'))"));
        assert_eq!(METRIC_PULLING_INTERVAL.describe(), "100ms to 1m");
        assert!(ADJUSTMENT_INTERVAL.contains(Duration::from_secs(24 * 3600)));
        assert!(!ADJUSTMENT_INTERVAL.contains(Duration::from_secs(48 * 3600)));
    }
}

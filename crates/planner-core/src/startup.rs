//! The scale-up delay as a planner measures it: from asking for more replicas to the target
//! serving them. The operator measures it on the cluster (a DGD's available replicas against
//! those asked for), the simulator and the replay bridge on their own replicas, with this one
//! tracker, and the queueing model plans with the result.
//!
//! Times are [`Duration`]s since any fixed origin the caller keeps (the operator's process
//! clock, the simulator's trace time), so the tracker reads no clock itself.

use std::{collections::VecDeque, time::Duration};

/// Scale-up delay assumed until one is measured: a pod on a warm node with its image cached
/// starts in about a minute; the first measurement replaces it.
pub const DEFAULT_SCALE_UP_DELAY: Duration = Duration::from_secs(60);

/// The scale-up delay a planner plans with, and whether it is only assumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedDelay {
    /// The delay to plan with.
    pub delay: Duration,
    /// `true` when it is only [`DEFAULT_SCALE_UP_DELAY`]: nothing set, measured or expected.
    pub assumed: bool,
    /// Where it comes from.
    pub source: DelaySource,
}

/// Where a planned scale-up delay comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum DelaySource {
    /// The policy sets it (`spec.behavior.scaleUpDelay`).
    Set,
    /// Measured on the target.
    Measured,
    /// The policy says to expect it until one is measured (`spec.behavior.expectedScaleUpDelay`).
    Expected,
    /// Nothing else known: [`DEFAULT_SCALE_UP_DELAY`].
    Assumed,
}

impl DelaySource {
    /// `set`, `measured`, `expected` or `assumed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Set => "set",
            Self::Measured => "measured",
            Self::Expected => "expected",
            Self::Assumed => "assumed",
        }
    }
}

/// The scale-up delay a planner plans with: the one the policy sets, else the one measured,
/// else the one the policy says to expect until there is a measurement (a user who knows how
/// long the model takes to load), else [`DEFAULT_SCALE_UP_DELAY`], assumed.
pub fn planned_delay(
    set: Option<Duration>,
    measured: Option<Duration>,
    expected: Option<Duration>,
) -> PlannedDelay {
    let (delay, source) = match (set, measured, expected) {
        (Some(set), _, _) => (set, DelaySource::Set),
        (None, Some(measured), _) => (measured, DelaySource::Measured),
        (None, None, Some(expected)) => (expected, DelaySource::Expected),
        (None, None, None) => (DEFAULT_SCALE_UP_DELAY, DelaySource::Assumed),
    };
    PlannedDelay {
        delay,
        assumed: source == DelaySource::Assumed,
        source,
    }
}

/// Measures the scale-up delay: from asking for more replicas of a pool to that pool serving
/// them. Each scale-up is timed on its own, so scale-ups that follow each other while earlier
/// ones start each measure their own delay (not the time until the last of them serves).
/// Consecutive measurements are averaged (each new one weighs half), so one slow node moves the
/// estimate without owning it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StartupTracker {
    /// Per pool (prefill, decode): scale-ups not serving yet, oldest first, as the time asked
    /// and the replicas then asked for.
    pending: [VecDeque<(Duration, u32)>; 2],
    /// Smoothed measured delay.
    measured: Option<Duration>,
}

/// Scale-ups remembered per pool: a pool that keeps asking while nothing comes up is stuck
/// long before this many.
const MAX_PENDING: usize = 64;

impl StartupTracker {
    /// Records a change of the replicas asked for, from `from` to `to` (prefill, decode), at
    /// `now`.
    pub fn scaled(&mut self, from: (u32, u32), to: (u32, u32), now: Duration) {
        for (pending, (before, after)) in self.pending.iter_mut().zip([(from.0, to.0), (from.1, to.1)]) {
            if after > before {
                if pending.len() == MAX_PENDING {
                    pending.pop_front();
                }
                pending.push_back((now, after));
            } else if after < before {
                // Replicas no longer asked for will not come up: their scale-ups are abandoned.
                pending.retain(|(_, wanted)| *wanted <= after);
            }
        }
    }

    /// Completes the measurement of every scale-up whose replicas now serve.
    pub fn observe(&mut self, serving: (u32, u32), now: Duration) {
        for (pending, serving) in self.pending.iter_mut().zip([serving.0, serving.1]) {
            while let Some(&(since, wanted)) = pending.front() {
                if wanted > serving {
                    break;
                }
                pending.pop_front();
                let took = now.saturating_sub(since);
                self.measured = Some(match self.measured {
                    Some(previous) => (previous + took) / 2,
                    None => took,
                });
            }
        }
    }

    /// The measured delay, once there is one.
    pub fn delay(&self) -> Option<Duration> {
        self.measured
    }

    /// The delay to plan with: the measured one, else [`DEFAULT_SCALE_UP_DELAY`].
    pub fn delay_or_default(&self) -> Duration {
        self.measured.unwrap_or(DEFAULT_SCALE_UP_DELAY)
    }

    /// Whether replicas asked for more than `limit` ago are still not serving.
    pub fn stuck(&self, now: Duration, limit: Duration) -> bool {
        self.pending
            .iter()
            .filter_map(VecDeque::front)
            .any(|(since, _)| now.saturating_sub(*since) > limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    #[test]
    fn the_planned_delay_is_the_set_one_then_the_measured_then_the_expected() {
        let planned = |set, measured, expected| {
            let p = planned_delay(set, measured, expected);
            (p.delay, p.assumed)
        };
        assert_eq!(planned(None, None, None), (DEFAULT_SCALE_UP_DELAY, true));
        assert_eq!(planned(None, None, Some(s(300))), (s(300), false));
        assert_eq!(planned(None, Some(s(200)), Some(s(300))), (s(200), false));
        assert_eq!(planned(Some(s(90)), Some(s(200)), Some(s(300))), (s(90), false));
        // A delay set to the default's value is known, not assumed.
        assert_eq!(
            planned(Some(DEFAULT_SCALE_UP_DELAY), None, None),
            (DEFAULT_SCALE_UP_DELAY, false)
        );
    }

    #[test]
    fn the_scale_up_delay_is_measured_until_the_replicas_serve() {
        let mut tracker = StartupTracker::default();
        assert_eq!(tracker.delay_or_default(), DEFAULT_SCALE_UP_DELAY);
        tracker.scaled((1, 1), (3, 1), s(0));
        tracker.observe((2, 1), s(50));
        assert_eq!(tracker.delay(), None);
        assert!(!tracker.stuck(s(50), s(120)));
        assert!(tracker.stuck(s(130), s(120)));
        tracker.observe((3, 1), s(80));
        assert_eq!(tracker.delay(), Some(s(80)));
        assert_eq!(tracker.delay_or_default(), s(80));
        assert!(!tracker.stuck(s(500), s(120)));
        // Later measurements are averaged in.
        tracker.scaled((3, 1), (4, 1), s(100));
        tracker.observe((4, 1), s(140));
        assert_eq!(tracker.delay(), Some(s(60)));
        // A scale-down below a pending scale-up abandons it.
        tracker.scaled((4, 1), (8, 1), s(200));
        tracker.scaled((8, 1), (4, 1), s(210));
        assert!(!tracker.stuck(s(900), s(120)));
        tracker.observe((8, 1), s(900));
        assert_eq!(tracker.delay(), Some(s(60)));
    }

    #[test]
    fn scale_ups_in_a_row_each_measure_their_own_delay() {
        // Three scale-ups 20 s apart, each serving 180 s after it was asked for: 180 s, not
        // the 220 s from the first request to the last replica.
        let mut tracker = StartupTracker::default();
        tracker.scaled((1, 1), (2, 1), s(0));
        tracker.scaled((2, 1), (3, 2), s(20));
        tracker.scaled((3, 2), (4, 2), s(40));
        tracker.observe((2, 1), s(180));
        tracker.observe((3, 2), s(200));
        tracker.observe((4, 2), s(220));
        assert_eq!(tracker.delay(), Some(s(180)));
        // Both pools' scale-ups were timed: nothing is left pending.
        assert!(!tracker.stuck(s(10_000), s(1)));
    }
}

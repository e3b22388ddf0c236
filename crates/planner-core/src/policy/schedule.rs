//! Stage 1, **due**: when an adjustment interval or a fast check is due, and the window each
//! reads. Intervals keep their cadence (a late one does not shift the next), and start over
//! from now after a pause longer than an interval (a leader that just took over, a policy whose
//! settings changed). The first wake runs an interval at once: the metrics of the interval
//! before it are there to read.

use std::time::Duration;

/// Shortest window a fast check reads rates over: Prometheus needs two scrapes of a series in a
/// window, and NVIDIA's PodMonitors scrape every 5 s, which leaves two in 10 s. A driver whose
/// window holds fewer reads a wider one (the operator doubles it until the series shows).
pub const MIN_FAST_WINDOW: Duration = Duration::from_secs(10);

/// What is due at a wake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// An adjustment interval: read the metrics of the last `window`.
    Interval {
        /// The window to read.
        window: Duration,
        /// How late the interval is (`None` for the first).
        late: Option<Duration>,
    },
    /// A fast check: read the rates of the last `window`.
    Fast {
        /// The window to read (at least [`MIN_FAST_WINDOW`]).
        window: Duration,
    },
    /// Nothing until the next wake.
    Idle,
}

/// The loop's clock: when the next interval and fast check are due.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Schedule {
    next_interval: Option<Duration>,
    next_fast: Option<Duration>,
    last_interval: Option<Duration>,
}

impl Schedule {
    /// What is due at `now`, advancing the schedule. `fast_period` is `None` when the planner
    /// has no fast path.
    pub(crate) fn due(&mut self, now: Duration, interval: Duration, fast_period: Option<Duration>) -> Due {
        let interval = interval.max(Duration::from_millis(1));
        let late = match self.next_interval {
            Some(next) if next > now => None,
            Some(next) => Some(Some(now - next)),
            None => Some(None),
        };
        if let Some(late) = late {
            self.next_interval = Some(match (late, self.next_interval) {
                (Some(late), Some(next)) if late < interval => next + interval,
                _ => now + interval,
            });
            self.last_interval = Some(now);
            self.next_fast = fast_period.map(|period| now + period);
            return Due::Interval {
                window: interval,
                late,
            };
        }
        match (fast_period, self.next_fast) {
            (Some(period), Some(next)) if next <= now => {
                self.next_fast = Some(now + period);
                Due::Fast {
                    window: period.max(MIN_FAST_WINDOW),
                }
            }
            (Some(period), None) => {
                // The fast path was turned on since the last interval.
                self.next_fast = Some(now + period);
                Due::Idle
            }
            (None, _) => {
                self.next_fast = None;
                Due::Idle
            }
            _ => Due::Idle,
        }
    }

    /// When the next interval or fast check is due (`None` before the first wake: at once).
    pub(crate) fn next_wake(&self) -> Option<Duration> {
        match (self.next_interval, self.next_fast) {
            (Some(tick), Some(fast)) => Some(tick.min(fast)),
            (tick, fast) => tick.or(fast),
        }
    }

    /// Time since the last interval ran (zero before the first).
    pub(crate) fn since_interval(&self, now: Duration) -> Duration {
        self.last_interval
            .map_or(Duration::ZERO, |last| now.saturating_sub(last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    #[test]
    fn intervals_keep_their_cadence_and_restart_after_a_pause() {
        let mut schedule = Schedule::default();
        let interval = s(60);
        assert_eq!(
            schedule.due(s(100), interval, None),
            Due::Interval {
                window: interval,
                late: None
            }
        );
        assert_eq!(schedule.next_wake(), Some(s(160)));
        assert_eq!(schedule.due(s(130), interval, None), Due::Idle);
        // Two seconds late: the next one is still on the minute.
        assert_eq!(
            schedule.due(s(162), interval, None),
            Due::Interval {
                window: interval,
                late: Some(s(2))
            }
        );
        assert_eq!(schedule.next_wake(), Some(s(220)));
        // A pause longer than an interval starts over from now.
        assert!(matches!(
            schedule.due(s(600), interval, None),
            Due::Interval { .. }
        ));
        assert_eq!(schedule.next_wake(), Some(s(660)));
    }

    #[test]
    fn fast_checks_run_between_intervals_over_at_least_two_scrapes() {
        let mut schedule = Schedule::default();
        let (interval, period) = (s(60), Some(s(10)));
        assert!(matches!(
            schedule.due(s(0), interval, period),
            Due::Interval { .. }
        ));
        assert_eq!(schedule.next_wake(), Some(s(10)));
        assert_eq!(schedule.due(s(5), interval, period), Due::Idle);
        for t in [10, 20, 30, 40, 50] {
            assert_eq!(
                schedule.due(s(t), interval, period),
                Due::Fast {
                    window: MIN_FAST_WINDOW
                },
                "{t}"
            );
            assert_eq!(schedule.since_interval(s(t)), s(t));
        }
        // At the interval, the interval runs, not a fast check; the next check is a period on.
        assert!(matches!(
            schedule.due(s(60), interval, period),
            Due::Interval { .. }
        ));
        assert_eq!(schedule.next_wake(), Some(s(70)));
        // A long period reads its own window, a short one at least two scrapes.
        let mut slow = Schedule::default();
        slow.due(s(0), interval, Some(s(30)));
        assert_eq!(
            slow.due(s(30), interval, Some(s(30))),
            Due::Fast { window: s(30) }
        );
        let mut quick = Schedule::default();
        quick.due(s(0), interval, Some(s(5)));
        assert_eq!(
            quick.due(s(5), interval, Some(s(5))),
            Due::Fast {
                window: MIN_FAST_WINDOW
            }
        );
    }
}

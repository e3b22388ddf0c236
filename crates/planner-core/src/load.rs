//! The load-based planner of Dynamo's first planner: every
//! interval, compare the prefill queue per worker and the decode KV-cache usage with thresholds
//! and move each pool by at most one replica, with a grace period after a decode scale-up and
//! a trend check before a prefill scale-up.

use serde::{Deserialize, Serialize};

use crate::sla::{Limit, Limits, PoolLimits, RatioLimits};

/// Thresholds and limits of the load-based planner.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadConfig {
    /// Mean decode KV usage (0..1) above which decode grows.
    pub kv_scale_up: f64,
    /// Mean decode KV usage below which decode shrinks.
    pub kv_scale_down: f64,
    /// Queued prefill requests per prefill worker above which prefill grows.
    pub queue_scale_up: f64,
    /// Queued prefill requests per prefill worker below which prefill shrinks.
    pub queue_scale_down: f64,
    /// Intervals without decode scale-down after a decode scale-up.
    pub decode_grace_intervals: u32,
    /// Intervals ahead the prefill queue trend is extrapolated over.
    pub prefill_buffer_intervals: u32,
    /// The prefill pool's bounds (an aggregated graph's one pool takes the decode pool's).
    pub prefill: PoolLimits,
    /// The decode pool's bounds.
    pub decode: PoolLimits,
    /// Most GPUs of both pools together.
    pub max_gpu_budget: Option<u32>,
    /// GPUs per prefill replica.
    pub prefill_gpus_per_engine: u32,
    /// GPUs per decode replica.
    pub decode_gpus_per_engine: u32,
    /// Bounds of the prefill to decode ratio.
    #[serde(default)]
    pub ratio: Option<RatioLimits>,
}

impl Default for LoadConfig {
    /// The defaults of Dynamo's load-based planner.
    fn default() -> Self {
        Self {
            kv_scale_up: 0.9,
            kv_scale_down: 0.5,
            queue_scale_up: 0.5,
            queue_scale_down: 0.2,
            decode_grace_intervals: 3,
            prefill_buffer_intervals: 3,
            prefill: PoolLimits::new(1, None),
            decode: PoolLimits::new(1, None),
            max_gpu_budget: Some(8),
            prefill_gpus_per_engine: 1,
            decode_gpus_per_engine: 1,
            ratio: None,
        }
    }
}

/// Metrics sampled through one interval, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadSamples {
    /// Prefill requests waiting in the queue (all prefill workers together).
    pub prefill_queue: Vec<f64>,
    /// Mean KV-cache usage of the decode workers (0..1).
    pub decode_kv_usage: Vec<f64>,
    /// The KV usage is a lower bound of the engines' (an estimate that leaves blocks out, such
    /// as the KV router's count of prompt blocks): it can show a full cache, never an idle one,
    /// so decode is not scaled down on it.
    #[serde(default)]
    pub decode_kv_lower_bound: bool,
    /// The share of prefill engines busy (0..1): requests in prefill, at most one per engine,
    /// over the engines. Empty when the frontend does not say (then a prefill scale-down is
    /// judged on the queue alone, as Dynamo's first planner judges it).
    #[serde(default)]
    pub prefill_busy: Vec<f64>,
}

/// Why a pool moved or stayed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum LoadReason {
    /// The pool is within its thresholds.
    Steady,
    /// Above the scale-up threshold.
    ScaleUp {
        /// The load measure.
        load: f64,
        /// The threshold.
        threshold: f64,
    },
    /// Below the scale-down threshold.
    ScaleDown {
        /// The load measure.
        load: f64,
        /// The threshold.
        threshold: f64,
    },
    /// Above the threshold, but the queue trend says it drains on its own.
    QueueDraining {
        /// Extrapolated queue per worker.
        projected: f64,
    },
    /// Low decode load, but measured by a lower bound of the engines' KV usage.
    LowerBound {
        /// The load measure.
        load: f64,
    },
    /// Low decode load inside the grace period after a scale-up.
    GracePeriod {
        /// Intervals left.
        remaining: u32,
    },
    /// Low load, at the minimum replicas.
    AtMinimum {
        /// The bound.
        bound: u32,
    },
    /// High load, at the maximum replicas.
    AtMaximum {
        /// The bound.
        bound: u32,
    },
    /// Low load, but the engines left after one fewer would be above the scale-up threshold
    /// (KV usage, decode and aggregated pools).
    WouldRefill {
        /// The usage of the engines left.
        projected: f64,
    },
    /// A short prefill queue, but the engines left after one fewer would be busier than they
    /// can stay without queueing past the scale-up threshold.
    WouldQueue {
        /// The share of the engines left that would be busy.
        busy: f64,
        /// Their projected queue per engine (infinite at or above full).
        projected: f64,
    },
    /// One more replica would exceed the GPU budget.
    Budget {
        /// The budget.
        budget: u32,
    },
    /// Moved to bring the prefill to decode ratio within its bound.
    Ratio {
        /// The ratio bound (prefill per decode replica).
        bound: f64,
        /// Whether the replicas meet it now (else the bounds and the budget allow none that do).
        met: bool,
    },
}

/// Why the whole interval was skipped (no change to either pool).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum LoadSkip {
    /// Replica counts changed since the last interval: a scaling action is still settling.
    ReplicasChanged,
    /// No samples: missing metrics never scale anything down.
    NoSamples,
    /// A pool has no running workers to divide the queue by.
    NoWorkers,
}

/// One interval's decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadDecision {
    /// Prefill replicas.
    pub prefill: u32,
    /// Decode replicas.
    pub decode: u32,
    /// Why prefill is what it is.
    pub prefill_reason: LoadReason,
    /// Why decode is what it is.
    pub decode_reason: LoadReason,
    /// Set when the interval was skipped.
    pub skipped: Option<LoadSkip>,
    /// What prefill was sized on: the queue per prefill engine (`None` when skipped, and for
    /// an aggregated pool).
    #[serde(default)]
    pub prefill_load: Option<f64>,
    /// What decode was sized on: the mean KV usage (an aggregated pool's with the prompts
    /// waiting counted in); `None` when skipped.
    #[serde(default)]
    pub decode_load: Option<f64>,
}

/// State carried between intervals. Serializable so it survives restarts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadPlanner {
    last_replicas: Option<(u32, u32)>,
    decode_grace_remaining: u32,
}

impl LoadConfig {
    /// The replica bounds and the GPU budget.
    pub fn limits(&self) -> Limits {
        Limits {
            prefill: self.prefill,
            decode: self.decode,
            max_gpu_budget: self.max_gpu_budget,
            prefill_gpus_per_engine: self.prefill_gpus_per_engine,
            decode_gpus_per_engine: self.decode_gpus_per_engine,
            ratio: self.ratio,
        }
    }
}

/// The measure a pool is sized on, in words.
#[derive(Clone, Copy)]
enum Measure {
    /// Prefill requests waiting per prefill engine.
    Queue,
    /// KV-cache usage, a share.
    Kv,
}

impl Measure {
    fn value(self, v: f64) -> String {
        match self {
            Self::Queue => format!("{v:.2}"),
            Self::Kv => format!("{:.0}%", v * 100.0),
        }
    }

    fn of(self, load: Option<f64>) -> String {
        let shown = load.map_or_else(|| "-".to_string(), |v| self.value(v));
        match self {
            Self::Queue => format!("queue {shown} per engine"),
            Self::Kv => format!("KV usage {shown}"),
        }
    }
}

impl LoadDecision {
    /// What the interval did to each pool and why, with the figures it read: `prefill 2 -> 3
    /// (queue 1.40 per engine above 0.50)`, `decode 3 kept (KV usage 95% above 90%: at
    /// maxReplicas 3)`; `from` is the replicas it started from (prefill, decode).
    pub fn explain(&self, config: &LoadConfig, from: (u32, u32), aggregated: bool) -> String {
        if let Some(skipped) = &self.skipped {
            return format!(
                "keeping replicas: {}",
                match skipped {
                    LoadSkip::ReplicasChanged =>
                        "the replicas serving changed since the last interval (a scaling action is settling)",
                    LoadSkip::NoSamples => "no queue or KV-cache samples in the interval",
                    LoadSkip::NoWorkers => "a pool has no engine serving to divide its load by",
                }
            );
        }
        let kv = (config.kv_scale_down, config.kv_scale_up);
        if aggregated {
            return pool_words(
                "workers",
                from.1,
                self.decode,
                &self.decode_reason,
                self.decode_load,
                Measure::Kv,
                kv,
            );
        }
        let queue = (config.queue_scale_down, config.queue_scale_up);
        format!(
            "{}; {}",
            pool_words(
                "prefill",
                from.0,
                self.prefill,
                &self.prefill_reason,
                self.prefill_load,
                Measure::Queue,
                queue
            ),
            pool_words(
                "decode",
                from.1,
                self.decode,
                &self.decode_reason,
                self.decode_load,
                Measure::Kv,
                kv
            )
        )
    }
}

/// One pool's line: moved or kept, and why.
fn pool_words(
    noun: &str,
    from: u32,
    to: u32,
    reason: &LoadReason,
    load: Option<f64>,
    measure: Measure,
    (down, up): (f64, f64),
) -> String {
    let shown = measure.of(load);
    let (up, down) = (measure.value(up), measure.value(down));
    let why = match reason {
        LoadReason::ScaleUp { .. } => format!("{shown} above {up}"),
        LoadReason::ScaleDown { .. } => format!("{shown} below {down}"),
        LoadReason::Steady if from != to => format!("{shown}; back within the replica bounds"),
        LoadReason::Steady => format!("{shown}, within {down} to {up}"),
        LoadReason::QueueDraining { projected } => format!(
            "{shown} above {up}, but draining: {} per engine projected",
            measure.value(*projected)
        ),
        LoadReason::LowerBound { .. } => {
            format!("{shown} below {down}, but the KV router's estimate is a lower bound: not scaled down on")
        }
        LoadReason::GracePeriod { remaining } => {
            format!("{shown} below {down}, but {remaining} more interval(s) of grace after the last scale-up")
        }
        LoadReason::AtMinimum { bound } => format!("{shown} below {down}: at minReplicas {bound}"),
        LoadReason::AtMaximum { bound } => format!("{shown} above {up}: at maxReplicas {bound}"),
        LoadReason::Budget { budget } => {
            format!("{shown} above {up}: one more replica would exceed maxGpuBudget {budget}")
        }
        LoadReason::WouldRefill { projected } => format!(
            "{shown} below {down}, but one fewer would leave the others at {}, above {up}",
            measure.value(*projected)
        ),
        LoadReason::WouldQueue { busy, projected } => {
            let queue = if projected.is_finite() {
                format!("a queue of {} per engine", measure.value(*projected))
            } else {
                "a queue that never drains".to_string()
            };
            format!(
                "{shown} below {down}, but one fewer would leave the others {:.0}% busy, {queue}, above {up}",
                busy * 100.0
            )
        }
        LoadReason::Ratio { bound, met: true } => {
            format!("{shown}; moved for the prefill to decode ratio bound of {bound}")
        }
        LoadReason::Ratio { bound, met: false } => format!(
            "{shown}; the prefill to decode ratio bound of {bound} cannot be met within the bounds and the GPU budget"
        ),
    };
    if from == to {
        format!("{noun} {to} kept ({why})")
    } else {
        format!("{noun} {from} -> {to} ({why})")
    }
}

fn mean(values: &[f64]) -> Option<f64> {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    (!finite.is_empty()).then(|| finite.iter().sum::<f64>() / finite.len() as f64)
}

impl LoadPlanner {
    /// Decides one interval from the replicas now running and the interval's samples.
    pub fn tick(
        &mut self,
        config: &LoadConfig,
        prefill: u32,
        decode: u32,
        samples: &LoadSamples,
    ) -> LoadDecision {
        let skip = |reason| LoadDecision {
            prefill,
            decode,
            prefill_reason: LoadReason::Steady,
            decode_reason: LoadReason::Steady,
            skipped: Some(reason),
            prefill_load: None,
            decode_load: None,
        };
        let changed = self.last_replicas.is_some_and(|last| last != (prefill, decode));
        self.last_replicas = Some((prefill, decode));
        let grace = self.decode_grace_remaining;
        self.decode_grace_remaining = grace.saturating_sub(1);
        if changed {
            return skip(LoadSkip::ReplicasChanged);
        }
        let (Some(queue), Some(kv)) = (mean(&samples.prefill_queue), mean(&samples.decode_kv_usage)) else {
            return skip(LoadSkip::NoSamples);
        };
        if prefill == 0 || decode == 0 {
            return skip(LoadSkip::NoWorkers);
        }
        let per_worker = queue / f64::from(prefill);
        let busy = mean(&samples.prefill_busy).map(|b| b.clamp(0.0, 1.0));
        let (new_prefill, prefill_reason) =
            prefill_step(config, prefill, decode, per_worker, queue, busy, samples);
        let (new_decode, decode_reason) = decode_step(
            config,
            new_prefill,
            decode,
            kv,
            grace,
            samples.decode_kv_lower_bound,
        );
        // A decode scale-up starts the grace period before the next scale-down.
        if matches!(decode_reason, LoadReason::ScaleUp { .. }) {
            self.decode_grace_remaining = config.decode_grace_intervals;
        }
        // Bounded as every planner's decision is: a pool outside its bounds (after a manual
        // edit, say) comes back within them first. The budget is the steps' own (a step that
        // does not fit is not taken), not a scaling of what runs.
        let (prefill, decode) = Limits {
            max_gpu_budget: None,
            ratio: None,
            ..config.limits()
        }
        .apply((new_prefill, new_decode))
        .replicas;
        // The ratio last, within the budget: a pool it moves says so.
        let ((ratio_prefill, ratio_decode), ratio) = config.limits().fit_ratio((prefill, decode));
        let ratio_reason = |moved: bool, reason: LoadReason| match ratio {
            Some(Limit::Ratio { bound, met, .. }) if moved || !met => LoadReason::Ratio { bound, met },
            _ => reason,
        };
        let prefill_reason = ratio_reason(ratio_prefill != prefill, prefill_reason);
        let decode_reason = ratio_reason(ratio_decode != decode, decode_reason);
        let (prefill, decode) = (ratio_prefill, ratio_decode);
        LoadDecision {
            prefill,
            decode,
            prefill_reason,
            decode_reason,
            skipped: None,
            prefill_load: Some(per_worker),
            decode_load: Some(kv),
        }
    }
}

impl LoadPlanner {
    /// One interval of one aggregated pool of `workers` engines, by Dynamo's load rule for
    /// aggregated workers: the engines' KV usage, with the prompts waiting counted as the KV
    /// they are about to take (`queued_kv_per_request`: one prompt's tokens over one engine's
    /// KV capacity; 0 when unknown). One more engine when it reaches
    /// [`LoadConfig::kv_scale_up`]; one fewer when it is at or below
    /// [`LoadConfig::kv_scale_down`] and the engines left would stay below the scale-up
    /// threshold (`usage · n / (n − 1)`), so a scale-down never triggers the next scale-up.
    /// A usage that is only a lower bound ([`LoadSamples::decode_kv_lower_bound`]) scales up,
    /// never down.
    /// Upstream reads each engine's latest forward pass; the operator reads the pool's mean
    /// over the interval. The decision carries the pool as both pools.
    pub fn tick_aggregated(
        &mut self,
        config: &LoadConfig,
        workers: u32,
        samples: &LoadSamples,
        queued_kv_per_request: f64,
    ) -> LoadDecision {
        let decided =
            |replicas: u32, reason: LoadReason, skipped: Option<LoadSkip>, load: Option<f64>| LoadDecision {
                prefill: replicas,
                decode: replicas,
                prefill_reason: reason.clone(),
                decode_reason: reason,
                skipped,
                prefill_load: None,
                decode_load: load,
            };
        let changed = self.last_replicas.is_some_and(|last| last != (workers, workers));
        self.last_replicas = Some((workers, workers));
        if changed {
            return decided(workers, LoadReason::Steady, Some(LoadSkip::ReplicasChanged), None);
        }
        let Some(kv) = mean(&samples.decode_kv_usage) else {
            return decided(workers, LoadReason::Steady, Some(LoadSkip::NoSamples), None);
        };
        if workers == 0 {
            return decided(workers, LoadReason::Steady, Some(LoadSkip::NoWorkers), None);
        }
        let per_request = if queued_kv_per_request.is_finite() {
            queued_kv_per_request.max(0.0)
        } else {
            0.0
        };
        let queued = mean(&samples.prefill_queue).unwrap_or(0.0).max(0.0);
        let usage = kv + queued * per_request / f64::from(workers);
        let (replicas, reason) = if usage >= config.kv_scale_up {
            if !below_max(config.decode, workers) {
                (
                    workers,
                    LoadReason::AtMaximum {
                        bound: config.decode.max.unwrap_or(workers),
                    },
                )
            } else if !fits(config, 0, workers + 1) {
                (
                    workers,
                    LoadReason::Budget {
                        budget: config.max_gpu_budget.unwrap_or(0),
                    },
                )
            } else {
                (
                    workers + 1,
                    LoadReason::ScaleUp {
                        load: usage,
                        threshold: config.kv_scale_up,
                    },
                )
            }
        } else if usage <= config.kv_scale_down {
            let survivors = f64::from(workers.saturating_sub(1).max(1));
            if samples.decode_kv_lower_bound {
                (workers, LoadReason::LowerBound { load: usage })
            } else if workers <= config.decode.min {
                (
                    workers,
                    LoadReason::AtMinimum {
                        bound: config.decode.min,
                    },
                )
            } else if usage * f64::from(workers) / survivors >= config.kv_scale_up {
                (
                    workers,
                    LoadReason::WouldRefill {
                        projected: usage * f64::from(workers) / survivors,
                    },
                )
            } else {
                (
                    workers - 1,
                    LoadReason::ScaleDown {
                        load: usage,
                        threshold: config.kv_scale_down,
                    },
                )
            }
        } else {
            (workers, LoadReason::Steady)
        };
        let bounded = Limits {
            max_gpu_budget: None,
            ..config.limits()
        }
        .apply_aggregated(replicas)
        .replicas
        .1;
        decided(bounded, reason, None, Some(usage))
    }
}

/// Whether `p` prefill and `d` decode replicas fit the GPU budget.
fn fits(config: &LoadConfig, p: u32, d: u32) -> bool {
    config.max_gpu_budget.is_none_or(|budget| {
        u64::from(p) * u64::from(config.prefill_gpus_per_engine)
            + u64::from(d) * u64::from(config.decode_gpus_per_engine)
            <= u64::from(budget)
    })
}

/// Whether a pool of `n` replicas may grow.
fn below_max(pool: PoolLimits, n: u32) -> bool {
    pool.max.is_none_or(|max| n < max)
}

/// Prefill: one more when the queue per worker stays above its threshold (unless its trend
/// drains it), one fewer below the other.
fn prefill_step(
    config: &LoadConfig,
    prefill: u32,
    decode: u32,
    per_worker: f64,
    queue: f64,
    busy: Option<f64>,
    samples: &LoadSamples,
) -> (u32, LoadReason) {
    if per_worker > config.queue_scale_up {
        let first = samples
            .prefill_queue
            .iter()
            .copied()
            .find(|v| v.is_finite())
            .unwrap_or(queue);
        let last = samples
            .prefill_queue
            .iter()
            .copied()
            .rev()
            .find(|v| v.is_finite())
            .unwrap_or(queue);
        let projected =
            (last + (last - first) * f64::from(config.prefill_buffer_intervals)) / f64::from(prefill);
        if projected <= config.queue_scale_up {
            (prefill, LoadReason::QueueDraining { projected })
        } else if !below_max(config.prefill, prefill) {
            (
                prefill,
                LoadReason::AtMaximum {
                    bound: config.prefill.max.unwrap_or(prefill),
                },
            )
        } else if !fits(config, prefill + 1, decode) {
            (
                prefill,
                LoadReason::Budget {
                    budget: config.max_gpu_budget.unwrap_or(0),
                },
            )
        } else {
            (
                prefill + 1,
                LoadReason::ScaleUp {
                    load: per_worker,
                    threshold: config.queue_scale_up,
                },
            )
        }
    } else if per_worker < config.queue_scale_down {
        let consolidated = busy.and_then(|busy| consolidated_queue(busy, prefill));
        if prefill <= config.prefill.min {
            (
                prefill,
                LoadReason::AtMinimum {
                    bound: config.prefill.min,
                },
            )
        } else if let Some((busy, projected)) =
            consolidated.filter(|(_, projected)| *projected >= config.queue_scale_up)
        {
            (prefill, LoadReason::WouldQueue { busy, projected })
        } else {
            (
                prefill - 1,
                LoadReason::ScaleDown {
                    load: per_worker,
                    threshold: config.queue_scale_down,
                },
            )
        }
    } else {
        (prefill, LoadReason::Steady)
    }
}

/// The busy share of the engines left when `engines` engines `busy` busy become one fewer, and
/// the queue per engine they would hold: the M/D/1 mean queue `ρ² / (2 (1 − ρ))` (requests
/// arriving at random, each prompt's prefill about as long as the next), infinite at or above
/// full. `None` with a single engine (nothing to consolidate into).
fn consolidated_queue(busy: f64, engines: u32) -> Option<(f64, f64)> {
    (engines > 1).then(|| {
        let left = busy * f64::from(engines) / f64::from(engines - 1);
        let queue = if left < 1.0 {
            left * left / (2.0 * (1.0 - left))
        } else {
            f64::INFINITY
        };
        (left, queue)
    })
}

/// Decode: one more when the KV-cache usage is above its threshold, one fewer below the
/// other once the grace period after a scale-up is over (never when the usage is only a lower
/// bound).
fn decode_step(
    config: &LoadConfig,
    new_prefill: u32,
    decode: u32,
    kv: f64,
    grace: u32,
    lower_bound: bool,
) -> (u32, LoadReason) {
    if kv > config.kv_scale_up {
        if !below_max(config.decode, decode) {
            (
                decode,
                LoadReason::AtMaximum {
                    bound: config.decode.max.unwrap_or(decode),
                },
            )
        } else if !fits(config, new_prefill, decode + 1) {
            (
                decode,
                LoadReason::Budget {
                    budget: config.max_gpu_budget.unwrap_or(0),
                },
            )
        } else {
            (
                decode + 1,
                LoadReason::ScaleUp {
                    load: kv,
                    threshold: config.kv_scale_up,
                },
            )
        }
    } else if kv < config.kv_scale_down {
        if lower_bound {
            (decode, LoadReason::LowerBound { load: kv })
        } else if grace > 0 {
            (decode, LoadReason::GracePeriod { remaining: grace })
        } else if decode > config.decode.min
            && kv * f64::from(decode) / f64::from(decode - 1) >= config.kv_scale_up
        {
            // The engines left would hold the pool's KV cache above the scale-up threshold.
            (
                decode,
                LoadReason::WouldRefill {
                    projected: kv * f64::from(decode) / f64::from(decode - 1),
                },
            )
        } else if decode > config.decode.min {
            (
                decode - 1,
                LoadReason::ScaleDown {
                    load: kv,
                    threshold: config.kv_scale_down,
                },
            )
        } else {
            (
                decode,
                LoadReason::AtMinimum {
                    bound: config.decode.min,
                },
            )
        }
    } else {
        (decode, LoadReason::Steady)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(queue: &[f64], kv: &[f64]) -> LoadSamples {
        LoadSamples {
            prefill_queue: queue.to_vec(),
            decode_kv_usage: kv.to_vec(),
            decode_kv_lower_bound: false,
            prefill_busy: Vec::new(),
        }
    }

    #[test]
    fn a_prefill_scale_down_waits_until_the_engines_left_carry_the_load() {
        let config = LoadConfig::default();
        let with_busy = |queue: f64, busy: f64| LoadSamples {
            prefill_busy: vec![busy, busy],
            ..samples(&[queue, queue], &[0.6])
        };
        // Two engines 70 % busy with a short queue: one would be 140 % busy, its queue never
        // drains. Dynamo's first planner (the queue alone) cut one here, then added it back.
        let held = LoadPlanner::default().tick(&config, 2, 1, &with_busy(0.1, 0.7));
        assert_eq!(held.prefill, 2, "{held:?}");
        assert!(
            matches!(held.prefill_reason, LoadReason::WouldQueue { busy, projected }
                if (busy - 1.4).abs() < 1e-9 && projected.is_infinite()),
            "{held:?}"
        );
        assert!(
            held.explain(&config, (2, 1), false)
                .contains("one fewer would leave the others 140% busy")
        );
        let queue_alone = LoadPlanner::default().tick(&config, 2, 1, &samples(&[0.1, 0.1], &[0.6]));
        assert_eq!(queue_alone.prefill, 1);
        // 35 % busy: the one left, 70 % busy, would queue 0.82 per engine, above 0.5.
        let near = LoadPlanner::default().tick(&config, 2, 1, &with_busy(0.0, 0.35));
        assert_eq!(near.prefill, 2, "{near:?}");
        // 25 %: it would be 50 % busy and queue 0.25: one fewer.
        let idle = LoadPlanner::default().tick(&config, 2, 1, &with_busy(0.0, 0.25));
        assert_eq!(idle.prefill, 1, "{idle:?}");
        assert!(matches!(idle.prefill_reason, LoadReason::ScaleDown { .. }));
        // Of many engines the last one's share is small: 8 engines 60 % busy leave 7 at 69 %.
        let many = LoadPlanner::default().tick(
            &config,
            8,
            1,
            &LoadSamples {
                prefill_busy: vec![0.6],
                ..samples(&[0.0], &[0.6])
            },
        );
        assert_eq!(many.prefill, 8, "{many:?}");
    }

    #[test]
    fn a_decode_scale_down_never_fills_the_engines_left_past_the_scale_up_threshold() {
        let config = LoadConfig::default();
        // 2 engines at 48 % KV: 1 left would hold 96 %, above 90 %.
        let held = LoadPlanner::default().tick(&config, 1, 2, &samples(&[0.3], &[0.48]));
        assert_eq!(held.decode, 2, "{held:?}");
        assert!(
            matches!(held.decode_reason, LoadReason::WouldRefill { .. }),
            "{held:?}"
        );
        // 3 engines at 48 %: 2 left hold 72 %.
        let down = LoadPlanner::default().tick(&config, 1, 3, &samples(&[0.3], &[0.48]));
        assert_eq!(down.decode, 2, "{down:?}");
    }

    #[test]
    fn an_aggregated_pool_counts_waiting_prompts_as_kv_and_moves_one_engine() {
        let config = LoadConfig::default();
        // 60 % KV used, 2 prompts waiting per engine of 20 % of an engine's cache each: 100 %.
        let mut planner = LoadPlanner::default();
        let up = planner.tick_aggregated(&config, 3, &samples(&[6.0, 6.0], &[0.6, 0.6]), 0.2);
        assert_eq!((up.prefill, up.decode, up.skipped.clone()), (4, 4, None));
        assert!(matches!(up.decode_reason, LoadReason::ScaleUp { .. }));
        // The same usage without the queue is steady.
        let mut planner = LoadPlanner::default();
        let steady = planner.tick_aggregated(&config, 3, &samples(&[6.0], &[0.6]), 0.0);
        assert_eq!((steady.decode, steady.decode_reason), (3, LoadReason::Steady));
        // Low usage: one fewer, unless the survivors would cross the scale-up threshold.
        let mut planner = LoadPlanner::default();
        let down = planner.tick_aggregated(&config, 3, &samples(&[0.0], &[0.4]), 0.0);
        assert_eq!(down.decode, 2);
        let mut planner = LoadPlanner::default();
        let tight = LoadConfig {
            kv_scale_up: 0.55,
            ..config
        };
        let held = planner.tick_aggregated(&tight, 2, &samples(&[0.0], &[0.4]), 0.0);
        assert_eq!(held.decode, 2);
        assert!(
            matches!(held.decode_reason, LoadReason::WouldRefill { projected } if (projected - 0.8).abs() < 1e-9),
            "{:?}",
            held.decode_reason
        );
        // The replicas changed since the last interval: observe only.
        let next = planner.tick_aggregated(&config, 3, &samples(&[0.0], &[0.1]), 0.0);
        assert_eq!(next.skipped, Some(LoadSkip::ReplicasChanged));
        // No samples never scale down.
        let mut planner = LoadPlanner::default();
        let none = planner.tick_aggregated(&config, 3, &samples(&[], &[]), 0.0);
        assert_eq!((none.decode, none.skipped), (3, Some(LoadSkip::NoSamples)));
        // The budget counts the pool's GPUs once.
        let mut planner = LoadPlanner::default();
        let budget = LoadConfig {
            max_gpu_budget: Some(3),
            ..config
        };
        let capped = planner.tick_aggregated(&budget, 3, &samples(&[0.0], &[0.95]), 0.0);
        assert_eq!(capped.decode, 3);
        assert!(matches!(capped.decode_reason, LoadReason::Budget { budget: 3 }));
    }

    #[test]
    fn a_lower_bound_of_kv_usage_scales_decode_up_never_down() {
        let config = LoadConfig::default();
        let estimate = |kv: f64| LoadSamples {
            decode_kv_lower_bound: true,
            ..samples(&[0.3], &[kv])
        };
        let mut planner = LoadPlanner::default();
        let low = planner.tick(&config, 1, 3, &estimate(0.1));
        // The same for an aggregated pool.
        let mut aggregated = LoadPlanner::default();
        let held = aggregated.tick_aggregated(&config, 3, &estimate(0.1), 0.0);
        assert_eq!(
            (held.decode, held.decode_reason),
            (3, LoadReason::LowerBound { load: 0.1 })
        );
        let mut aggregated = LoadPlanner::default();
        assert_eq!(
            aggregated
                .tick_aggregated(&config, 3, &estimate(0.95), 0.0)
                .decode,
            4
        );
        assert_eq!(low.decode, 3);
        assert_eq!(low.decode_reason, LoadReason::LowerBound { load: 0.1 });
        let mut planner = LoadPlanner::default();
        assert_eq!(planner.tick(&config, 1, 3, &estimate(0.95)).decode, 4);
    }

    #[test]
    fn scales_up_one_replica_per_interval() {
        let mut planner = LoadPlanner::default();
        let config = LoadConfig::default();
        let decision = planner.tick(&config, 1, 1, &samples(&[2.0, 3.0, 4.0], &[0.95, 0.97]));
        assert_eq!((decision.prefill, decision.decode), (2, 2));
        assert!(matches!(decision.prefill_reason, LoadReason::ScaleUp { .. }));
        assert!(matches!(decision.decode_reason, LoadReason::ScaleUp { .. }));
    }

    #[test]
    fn scales_down_when_idle_but_not_below_the_minimum() {
        let mut planner = LoadPlanner::default();
        let config = LoadConfig::default();
        let decision = planner.tick(&config, 3, 2, &samples(&[0.0, 0.0], &[0.1, 0.2]));
        assert_eq!((decision.prefill, decision.decode), (2, 1));
        let decision = planner.tick(&config, 1, 1, &samples(&[0.0], &[0.1]));
        // Replicas changed since the last interval: wait for them to settle.
        assert_eq!(decision.skipped, Some(LoadSkip::ReplicasChanged));
        let decision = planner.tick(&config, 1, 1, &samples(&[0.0], &[0.1]));
        assert_eq!((decision.prefill, decision.decode), (1, 1));
        assert_eq!(decision.decode_reason, LoadReason::AtMinimum { bound: 1 });
    }

    #[test]
    fn no_decode_scale_down_during_the_grace_period() {
        let mut planner = LoadPlanner::default();
        let config = LoadConfig::default();
        assert_eq!(planner.tick(&config, 1, 2, &samples(&[0.3], &[0.95])).decode, 3);
        planner.tick(&config, 1, 3, &samples(&[0.3], &[0.1])); // settles
        for remaining in [2, 1] {
            let decision = planner.tick(&config, 1, 3, &samples(&[0.3], &[0.1]));
            assert_eq!(decision.decode, 3);
            assert_eq!(decision.decode_reason, LoadReason::GracePeriod { remaining });
        }
        assert_eq!(planner.tick(&config, 1, 3, &samples(&[0.3], &[0.1])).decode, 2);
    }

    #[test]
    fn draining_queue_does_not_scale_prefill_up() {
        let mut planner = LoadPlanner::default();
        let config = LoadConfig::default();
        // Mean 2.0 per worker is above 0.5, but the queue falls from 4 to 0.5: 0.5 + (0.5-4)*3 < 0.5.
        let decision = planner.tick(&config, 1, 1, &samples(&[4.0, 2.0, 1.5, 0.5], &[0.7]));
        assert_eq!(decision.prefill, 1);
        assert!(matches!(
            decision.prefill_reason,
            LoadReason::QueueDraining { .. }
        ));
    }

    #[test]
    fn budget_and_maximum_stop_scale_up() {
        let mut planner = LoadPlanner::default();
        let config = LoadConfig {
            max_gpu_budget: Some(3),
            ..LoadConfig::default()
        };
        let decision = planner.tick(&config, 2, 1, &samples(&[5.0, 5.0], &[0.99]));
        assert_eq!((decision.prefill, decision.decode), (2, 1));
        assert_eq!(decision.decode_reason, LoadReason::Budget { budget: 3 });
        assert_eq!(decision.prefill_reason, LoadReason::Budget { budget: 3 });
        let config = LoadConfig {
            prefill: PoolLimits::new(1, Some(2)),
            decode: PoolLimits::new(1, Some(2)),
            max_gpu_budget: None,
            ..LoadConfig::default()
        };
        let decision = planner.tick(&config, 2, 1, &samples(&[5.0, 5.0], &[0.99]));
        assert_eq!(decision.prefill_reason, LoadReason::AtMaximum { bound: 2 });
        assert_eq!(decision.decode, 2);
    }

    #[test]
    fn a_ratio_bound_moves_the_pool_it_wants_more_of_and_says_so() {
        // Prefill queues: one more prefill engine, then at most 2 prefill per decode raises decode.
        let config = LoadConfig {
            ratio: Some(RatioLimits {
                min: None,
                max: Some(2.0),
            }),
            max_gpu_budget: None,
            ..LoadConfig::default()
        };
        let decision = LoadPlanner::default().tick(&config, 2, 1, &samples(&[5.0, 5.0], &[0.7]));
        assert_eq!((decision.prefill, decision.decode), (3, 2));
        assert_eq!(
            decision.decode_reason,
            LoadReason::Ratio {
                bound: 2.0,
                met: true
            }
        );
        assert!(
            decision
                .explain(&config, (2, 1), false)
                .contains("decode 1 -> 2 (KV usage 70%; moved for the prefill to decode ratio bound of 2)"),
            "{}",
            decision.explain(&config, (2, 1), false)
        );
    }

    #[test]
    fn pools_outside_their_bounds_come_back_within_them() {
        let config = LoadConfig {
            prefill: PoolLimits::new(2, Some(8)),
            decode: PoolLimits::new(2, Some(8)),
            ..LoadConfig::default()
        };
        // Steady load on pools edited to 10 prefill and 1 decode replicas.
        let steady = samples(&[3.0], &[0.7]);
        let decision = LoadPlanner::default().tick(&config, 10, 1, &steady);
        assert_eq!((decision.prefill, decision.decode), (8, 2));
        assert_eq!(decision.prefill_reason, LoadReason::Steady);
    }

    #[test]
    fn missing_samples_never_scale_down() {
        let mut planner = LoadPlanner::default();
        let decision = planner.tick(&LoadConfig::default(), 4, 4, &samples(&[], &[f64::NAN]));
        assert_eq!((decision.prefill, decision.decode), (4, 4));
        assert_eq!(decision.skipped, Some(LoadSkip::NoSamples));
    }

    #[test]
    fn state_round_trips() {
        let mut planner = LoadPlanner::default();
        planner.tick(&LoadConfig::default(), 1, 1, &samples(&[0.3], &[0.95]));
        let restored: LoadPlanner = serde_json::from_str(&serde_json::to_string(&planner).unwrap()).unwrap();
        assert_eq!(restored, planner);
    }
}

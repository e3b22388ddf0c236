//! Stage 2, **decide**: the policy's planner on what the driver read. The SLA planner (modes
//! `sla` and `observe`) ticks on the interval's frontend metrics and checks its fast path in
//! between; the load-based planner (mode `load`) ticks on queue and KV-cache samples.

use crate::{
    interpolation::PerformanceCurves,
    load::{LoadConfig, LoadDecision, LoadPlanner, LoadReason, LoadSamples, LoadSkip},
    state::{FastSignals, Hold, IntervalMetrics, SlaDecision, SlaModel, SlaPlanner, SlaPlannerConfig},
};

use super::report::{Check, Decision, LimitReason, Limitation, MetricsState};

/// A policy's planner, with what it plans with.
#[derive(Clone, Debug)]
pub enum Planner {
    /// The SLA planner: predictor histories, what the queueing model learned, its settings.
    Sla {
        /// Its state.
        planner: Box<SlaPlanner>,
        /// Targets, limits and predictor settings.
        config: Box<SlaPlannerConfig>,
    },
    /// The load-based planner.
    Load {
        /// Its state (grace periods).
        planner: LoadPlanner,
        /// Thresholds and limits.
        config: LoadConfig,
        /// One aggregated worker pool (Dynamo's rule for aggregated workers).
        aggregated: bool,
    },
}

/// What the driver read for an adjustment interval.
#[derive(Clone, Debug, PartialEq)]
pub enum Observed {
    /// The frontend's interval metrics, or why they are missing (the SLA planner).
    Frontend(IntervalMetrics),
    /// Queue and KV-cache samples, or why they are missing (the load planner).
    Samples(Result<LoadSamples, String>),
    /// The graph's frontend has counted no request yet (either planner): what was seen.
    AwaitingTraffic(String),
}

/// Replicas of the target when the loop wakes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replicas {
    /// Replicas serving (available), prefill and decode.
    pub serving: (u32, u32),
    /// Replicas asked for (the spec), prefill and decode.
    pub asked: (u32, u32),
}

impl Planner {
    /// A new SLA planner for `config`.
    pub fn sla(config: SlaPlannerConfig) -> Self {
        Self::Sla {
            planner: Box::new(SlaPlanner::new(&config)),
            config: Box::new(config),
        }
    }

    /// A new load planner.
    pub fn load(config: LoadConfig, aggregated: bool) -> Self {
        Self::Load {
            planner: LoadPlanner::default(),
            config,
            aggregated,
        }
    }

    /// Whether an interval reads load samples (else the frontend's metrics).
    pub fn reads_samples(&self) -> bool {
        matches!(self, Self::Load { .. })
    }

    /// Whether the planner applies correction factors (upstream's formulas only): the others
    /// report none.
    pub fn uses_corrections(&self) -> bool {
        matches!(self, Self::Sla { config, .. } if config.model == SlaModel::Upstream)
    }

    /// Whether the planner has a fast path between intervals (the queueing model's).
    pub fn has_fast_path(&self) -> bool {
        matches!(self, Self::Sla { config, .. } if config.model == SlaModel::Queueing)
    }

    /// One adjustment interval on what was read.
    pub(crate) fn interval<C: PerformanceCurves>(
        &mut self,
        observed: Observed,
        replicas: Replicas,
        model: Option<&C>,
    ) -> Decision {
        match (self, observed) {
            (Self::Sla { planner, config }, observed) => {
                let metrics = match observed {
                    Observed::Frontend(metrics) => metrics,
                    Observed::AwaitingTraffic(reason) => IntervalMetrics::AwaitingTraffic { reason },
                    Observed::Samples(_) => IntervalMetrics::Unavailable {
                        reason: "load samples were read for the SLA planner".into(),
                    },
                };
                let Some(model) = model else {
                    return hold(MetricsState::Unavailable {
                        reason: "no performance model".into(),
                    });
                };
                // Upstream's formulas are given the replicas serving, as Dynamo's planner reads
                // them; the queueing model those asked for, so that replicas still starting are
                // not asked for twice.
                let current = match config.model {
                    SlaModel::Upstream => replicas.serving,
                    SlaModel::Queueing => replicas.asked,
                };
                let tick = planner.tick(config, model, metrics, current);
                let mut decision = sla_decision(Check::Interval, &tick);
                // Only upstream's formulas apply correction factors.
                if config.model != SlaModel::Upstream {
                    decision.corrections = None;
                }
                decision
            }
            (
                Self::Load {
                    planner,
                    config,
                    aggregated,
                },
                observed,
            ) => load_interval(planner, config, *aggregated, observed, replicas.serving),
        }
    }

    /// One fast check: `Some` when the SLA is at risk and more replicas are needed at once.
    pub(crate) fn fast<C: PerformanceCurves>(
        &mut self,
        signals: &FastSignals,
        replicas: Replicas,
        model: Option<&C>,
    ) -> Option<Decision> {
        let (Self::Sla { planner, config }, Some(model)) = (self, model) else {
            return None;
        };
        let tick = planner.fast_check(config, model, signals, replicas.asked)?;
        let mut decision = sla_decision(Check::Fast, &tick);
        decision.metrics = None;
        decision.corrections = None;
        Some(decision)
    }
}

fn hold(metrics: MetricsState) -> Decision {
    let mut decision = Decision::keep(Check::Interval);
    decision.message = match &metrics {
        MetricsState::Unavailable { reason } => format!("keeping replicas: metrics unavailable ({reason})"),
        MetricsState::AwaitingTraffic { reason } => format!("keeping replicas: {reason}"),
        _ => "keeping replicas".into(),
    };
    decision.metrics = Some(metrics);
    decision
}

/// An SLA planner tick as a decision.
fn sla_decision(check: Check, tick: &SlaDecision) -> Decision {
    let mut decision = Decision::keep(check);
    decision.target = tick.target();
    decision.metrics = Some(match tick.hold() {
        Some(Hold::MetricsUnavailable { reason }) => MetricsState::Unavailable {
            reason: reason.clone(),
        },
        Some(Hold::NoTraffic) => MetricsState::NoTraffic,
        Some(Hold::AwaitingTraffic { reason }) => MetricsState::AwaitingTraffic {
            reason: reason.clone(),
        },
        None => MetricsState::Observed,
    });
    decision.limitation = tick.target().is_some().then(|| Limitation::of(tick.limits()));
    decision.observed = tick.observed;
    decision.predicted = tick.predicted;
    decision.corrections = Some(tick.corrections);
    decision.plan = tick.queueing().cloned();
    decision.message = tick.explanation();
    decision
}

/// A load planner interval.
fn load_interval(
    planner: &mut LoadPlanner,
    config: &LoadConfig,
    aggregated: bool,
    observed: Observed,
    serving: (u32, u32),
) -> Decision {
    let samples = match observed {
        Observed::Samples(Ok(samples)) => samples,
        Observed::Samples(Err(reason)) => return hold(MetricsState::Unavailable { reason }),
        Observed::AwaitingTraffic(reason) => return hold(MetricsState::AwaitingTraffic { reason }),
        Observed::Frontend(_) => {
            return hold(MetricsState::Unavailable {
                reason: "frontend metrics were read for the load planner".into(),
            });
        }
    };
    // Dynamo's aggregated rule also counts the waiting prompts as the KV they will take; load
    // mode reads no prompt lengths, so the rule reads the engines' KV usage alone.
    let tick = if aggregated {
        planner.tick_aggregated(config, serving.1, &samples, 0.0)
    } else {
        planner.tick(config, serving.0, serving.1, &samples)
    };
    let mut decision = Decision::keep(Check::Interval);
    decision.metrics = Some(if tick.skipped == Some(LoadSkip::NoSamples) {
        MetricsState::NoSamples
    } else {
        MetricsState::Observed
    });
    decision.target = tick.skipped.is_none().then_some((tick.prefill, tick.decode));
    if decision.target.is_some() {
        decision.limitation = Some(load_limitation(&tick, aggregated));
    }
    decision.message = format!("load mode: {}", tick.explain(config, serving, aggregated));
    decision.samples = Some(samples);
    decision.load = Some(tick);
    decision
}

/// What limited a load planner's decision: a pool that needed one more replica than
/// `maxReplicas` or the GPU budget allow (a minimum is not a limitation).
fn load_limitation(tick: &LoadDecision, aggregated: bool) -> Limitation {
    let pools = if aggregated {
        vec![("workers", &tick.decode_reason)]
    } else {
        vec![("prefill", &tick.prefill_reason), ("decode", &tick.decode_reason)]
    };
    let mut reason = None;
    let mut messages = Vec::new();
    for (pool, why) in pools {
        match why {
            LoadReason::Budget { budget } => {
                reason = Some(LimitReason::GpuBudget);
                messages.push(format!(
                    "one more {pool} replica would exceed maxGpuBudget {budget}"
                ));
            }
            LoadReason::AtMaximum { bound } => {
                reason = reason.or(Some(LimitReason::MaxReplicas));
                messages.push(format!("{pool} needs more than maxReplicas {bound}"));
            }
            LoadReason::Ratio { bound, met } => {
                reason = reason.or(Some(LimitReason::RatioBound));
                messages.push(if *met {
                    format!("{pool} moved for the prefill to decode ratio bound of {bound}")
                } else {
                    format!("the prefill to decode ratio bound of {bound} cannot be met")
                });
            }
            _ => {}
        }
    }
    match reason {
        Some(reason) => Limitation {
            reason,
            message: messages.join("; "),
        },
        None => Limitation::within_bounds(),
    }
}

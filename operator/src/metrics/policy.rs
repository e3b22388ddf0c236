//! Per-PlannerPolicy metrics, labelled by namespace and policy name (and pool), so
//! their number is bounded by the number of policies; a deleted policy's series are removed.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

/// Labels of a policy.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    /// Namespace of the policy.
    pub namespace: String,
    /// Name of the policy.
    pub policy: String,
}

/// Labels of one pool of a policy.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// Namespace of the policy.
    pub namespace: String,
    /// Name of the policy.
    pub policy: String,
    /// `prefill` or `decode`.
    pub pool: String,
}

/// Labels of a scaling decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    /// Namespace of the policy.
    pub namespace: String,
    /// Name of the policy.
    pub policy: String,
    /// `up` or `down`.
    pub direction: String,
}

/// Labels of `metrics_unavailable_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Namespace of the policy.
    pub namespace: String,
    /// Name of the policy.
    pub policy: String,
    /// One of [`UNAVAILABLE_REASONS`].
    pub reason: &'static str,
}

/// Labels of `scaling_limited`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// Namespace of the policy.
    pub namespace: String,
    /// Name of the policy.
    pub policy: String,
    /// The `ScalingLimited` condition's reason.
    pub reason: &'static str,
}

/// Why metrics could not be read: `http` (no answer or an HTTP error), `query` (Prometheus
/// rejected the query or answered with something else than a result), `no_series` (no series of
/// the graph and model), `client` (no HTTP client for the URL).
pub const UNAVAILABLE_REASONS: [&str; 4] = ["http", "query", "no_series", "client"];

type FloatGauge = Gauge<f64, AtomicU64>;

/// What an interval observed, each figure `None` when the policy's planner does not read it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservedFigures {
    /// Requests in the interval.
    pub requests: Option<f64>,
    /// Mean input sequence length (tokens).
    pub isl: Option<f64>,
    /// Mean output sequence length (tokens).
    pub osl: Option<f64>,
    /// Mean time to first token (s).
    pub ttft_s: Option<f64>,
    /// Mean inter-token latency (s).
    pub itl_s: Option<f64>,
    /// Time to first token at the percentile status shows (s).
    pub ttft_percentile_s: Option<f64>,
    /// Mean decode KV-cache usage (0 to 1).
    pub decode_kv_usage: Option<f64>,
    /// Mean prefill requests waiting (load mode).
    pub prefill_queue: Option<f64>,
}

impl ObservedFigures {
    fn values(&self) -> [Option<f64>; 8] {
        [
            self.requests,
            self.isl,
            self.osl,
            self.ttft_s,
            self.itl_s,
            self.ttft_percentile_s,
            self.decode_kv_usage,
            self.prefill_queue,
        ]
    }
}

/// The SLA an SLA planner plans for, and how the last hour met it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlaReport {
    /// TTFT target (s).
    pub ttft_s: f64,
    /// ITL target (s).
    pub itl_s: f64,
    /// The TTFT percentile targeted (`None`: the mean).
    pub ttft_percentile: Option<f64>,
    /// The last hour's intervals with traffic, and those that met the SLA.
    pub attainment: (usize, usize),
    /// Whether this interval met it (`None`: no traffic or no metrics).
    pub met: Option<bool>,
}

/// What one interval reported, for the gauges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IntervalReport {
    /// The adjustment interval (s).
    pub interval_s: f64,
    /// Desired (prefill, decode).
    pub desired: Option<(u32, u32)>,
    /// Current (prefill, decode).
    pub current: Option<(u32, u32)>,
    /// GPUs of the desired replicas (`None`: nothing was decided; the last figure stays).
    pub desired_gpus: Option<u64>,
    /// GPUs of the replicas serving.
    pub gpus_in_use: Option<u64>,
    /// What was observed (`None`: nothing was; the last figures stay).
    pub observed: Option<ObservedFigures>,
    /// Predicted requests, ISL, OSL.
    pub predicted: Option<[f64; 3]>,
    /// Correction factors (prefill, decode).
    pub correction: Option<(f64, f64)>,
    /// Whether the planner applies correction factors (else their series are removed).
    pub uses_correction: bool,
    /// The SLA (`None`: the load planner, which plans for none).
    pub sla: Option<SlaReport>,
    /// Whether the interval's metrics could be read (`None`: not an interval).
    pub metrics_available: Option<bool>,
    /// The `ScalingLimited` reason and whether it limited the decision (`None`: nothing was
    /// decided; the last one stays).
    pub limitation: Option<(&'static str, bool)>,
}

/// The per-policy families.
#[derive(Debug)]
pub struct PolicyMetrics {
    desired: Family<PoolLabels, Gauge>,
    current: Family<PoolLabels, Gauge>,
    correction: Family<PoolLabels, FloatGauge>,
    observed: [Family<PolicyLabels, FloatGauge>; 8],
    predicted: [Family<PolicyLabels, FloatGauge>; 3],
    /// TTFT target, ITL target, TTFT percentile targeted, SLA attainment.
    sla: [Family<PolicyLabels, FloatGauge>; 4],
    /// Intervals with traffic in the last hour, those that met the SLA, consecutive misses.
    sla_counts: [Family<PolicyLabels, Gauge>; 3],
    interval: Family<PolicyLabels, FloatGauge>,
    /// GPUs desired, GPUs in use.
    gpus: [Family<PolicyLabels, Gauge>; 2],
    unavailable_streak: Family<PolicyLabels, Gauge>,
    limited: Family<LimitLabels, Gauge>,
    decisions: Family<DirectionLabels, Counter>,
    lateness: Histogram,
    metrics_unavailable: Family<ReasonLabels, Counter>,
}

const POOLS: [&str; 2] = ["prefill", "decode"];

const OBSERVED: [(&str, &str); 8] = [
    ("observed_requests", "Requests in the last interval"),
    (
        "observed_isl",
        "Mean input sequence length of the last interval (tokens)",
    ),
    (
        "observed_osl",
        "Mean output sequence length of the last interval (tokens)",
    ),
    (
        "observed_ttft_seconds",
        "Mean time to first token of the last interval",
    ),
    (
        "observed_itl_seconds",
        "Mean inter-token latency of the last interval",
    ),
    (
        "observed_ttft_percentile_seconds",
        "Time to first token of the last interval at the percentile targeted (the 90th when the mean is)",
    ),
    (
        "observed_decode_kv_usage_ratio",
        "Mean KV-cache usage of the decode engines over the last interval (0 to 1)",
    ),
    (
        "observed_prefill_queue_requests",
        "Mean prefill requests waiting over the last interval (load mode)",
    ),
];

const PREDICTED: [(&str, &str); 3] = [
    ("predicted_requests", "Requests predicted for the next interval"),
    (
        "predicted_isl",
        "Mean input sequence length predicted for the next interval",
    ),
    (
        "predicted_osl",
        "Mean output sequence length predicted for the next interval",
    ),
];

const SLA: [(&str, &str); 4] = [
    ("ttft_target_seconds", "Time to first token the policy targets"),
    ("itl_target_seconds", "Inter-token latency the policy targets"),
    (
        "ttft_target_percentile",
        "Percentile of the TTFT target (absent when the mean is targeted)",
    ),
    (
        "sla_attainment_ratio",
        "Share of the last hour's intervals with traffic that met both targets",
    ),
];

const SLA_COUNTS: [(&str, &str); 3] = [
    ("sla_intervals", "Intervals with traffic in the last hour"),
    (
        "sla_intervals_met",
        "Intervals with traffic in the last hour that met both targets",
    ),
    (
        "consecutive_intervals_sla_missed",
        "Intervals with traffic in a row that missed the SLA (0 after one met it)",
    ),
];

const GPUS: [(&str, &str); 2] = [
    ("desired_gpus", "GPUs of the replicas of the last decision"),
    (
        "gpus_in_use",
        "GPUs of the replicas serving when the last decision was made",
    ),
];

/// Every `ScalingLimited` reason a decision reports.
fn limit_reasons() -> impl Iterator<Item = &'static str> {
    planner_core::policy::LimitReason::ALL
        .into_iter()
        .map(|r| r.as_str())
}

fn register_all<M, const N: usize>(
    registry: &mut Registry,
    families: &[Family<PolicyLabels, M>; N],
    names: &[(&str, &str); N],
) where
    M: prometheus_client::metrics::TypedMetric
        + prometheus_client::encoding::EncodeMetric
        + Default
        + Clone
        + Send
        + Sync
        + std::fmt::Debug
        + 'static,
{
    for (family, (name, help)) in families.iter().zip(names) {
        registry.register(*name, *help, family.clone());
    }
}

impl PolicyMetrics {
    /// Registers the families (the registry carries the `planner_operator` prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let desired = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "desired_replicas",
            "Replicas of the last decision",
            desired.clone(),
        );
        let current = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "current_replicas",
            "Replicas available when the last decision was made",
            current.clone(),
        );
        let correction = Family::<PoolLabels, FloatGauge>::default();
        registry.register(
            "correction_factor",
            "Observed over profiled latency (sla.model upstream only)",
            correction.clone(),
        );
        let observed: [Family<PolicyLabels, FloatGauge>; 8] = Default::default();
        register_all(registry, &observed, &OBSERVED);
        let predicted: [Family<PolicyLabels, FloatGauge>; 3] = Default::default();
        register_all(registry, &predicted, &PREDICTED);
        let sla: [Family<PolicyLabels, FloatGauge>; 4] = Default::default();
        register_all(registry, &sla, &SLA);
        let sla_counts: [Family<PolicyLabels, Gauge>; 3] = Default::default();
        register_all(registry, &sla_counts, &SLA_COUNTS);
        let interval = Family::<PolicyLabels, FloatGauge>::default();
        registry.register_with_unit(
            "interval",
            "The policy's adjustment interval",
            Unit::Seconds,
            interval.clone(),
        );
        let gpus: [Family<PolicyLabels, Gauge>; 2] = Default::default();
        register_all(registry, &gpus, &GPUS);
        let unavailable_streak = Family::<PolicyLabels, Gauge>::default();
        registry.register(
            "consecutive_intervals_metrics_unavailable",
            "Intervals in a row whose metrics could not be read (0 after one was)",
            unavailable_streak.clone(),
        );
        let limited = Family::<LimitLabels, Gauge>::default();
        registry.register(
            "scaling_limited",
            "1 when a bound or budget limited the last decision, 0 when not; reason as the ScalingLimited condition's",
            limited.clone(),
        );
        let decisions = Family::<DirectionLabels, Counter>::default();
        registry.register(
            "scaling_decisions",
            "Decisions that changed replicas, by direction",
            decisions.clone(),
        );
        let lateness = Histogram::new([0.0, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]);
        registry.register_with_unit(
            "interval_lateness",
            "How late planner intervals ran relative to their schedule",
            Unit::Seconds,
            lateness.clone(),
        );
        let metrics_unavailable = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "metrics_unavailable",
            "Planner reads (intervals and fast checks) whose metrics could not be read from Prometheus, by reason",
            metrics_unavailable.clone(),
        );
        Self {
            desired,
            current,
            correction,
            observed,
            predicted,
            sla,
            sla_counts,
            interval,
            gpus,
            unavailable_streak,
            limited,
            decisions,
            lateness,
            metrics_unavailable,
        }
    }

    fn pool(namespace: &str, policy: &str, pool: &str) -> PoolLabels {
        PoolLabels {
            namespace: namespace.into(),
            policy: policy.into(),
            pool: pool.into(),
        }
    }

    fn set_pools(family: &Family<PoolLabels, Gauge>, namespace: &str, policy: &str, (p, d): (u32, u32)) {
        for (pool, value) in POOLS.into_iter().zip([p, d]) {
            family
                .get_or_create(&Self::pool(namespace, policy, pool))
                .set(i64::from(value));
        }
    }

    /// Records one interval.
    pub fn record(&self, namespace: &str, policy: &str, report: &IntervalReport) {
        let labels = PolicyLabels {
            namespace: namespace.into(),
            policy: policy.into(),
        };
        self.interval.get_or_create(&labels).set(report.interval_s);
        if let Some(desired) = report.desired {
            Self::set_pools(&self.desired, namespace, policy, desired);
        }
        if let Some(current) = report.current {
            Self::set_pools(&self.current, namespace, policy, current);
        }
        for (family, value) in self.gpus.iter().zip([report.desired_gpus, report.gpus_in_use]) {
            if let Some(value) = value {
                family
                    .get_or_create(&labels)
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            }
        }
        match (report.uses_correction, report.correction) {
            (false, _) => {
                for pool in POOLS {
                    self.correction.remove(&Self::pool(namespace, policy, pool));
                }
            }
            (true, Some((p, d))) => {
                for (pool, value) in POOLS.into_iter().zip([p, d]) {
                    self.correction
                        .get_or_create(&Self::pool(namespace, policy, pool))
                        .set(value);
                }
            }
            (true, None) => {}
        }
        if let Some(observed) = &report.observed {
            set_or_remove(&self.observed, &labels, observed.values());
        }
        // An observation without a prediction (the load planner's) has no predicted series.
        match report.predicted {
            Some(values) => set_or_remove(&self.predicted, &labels, values.map(Some)),
            None if report.observed.is_some() => set_or_remove(&self.predicted, &labels, [None; 3]),
            None => {}
        }
        self.record_sla(&labels, report.sla.as_ref());
        if let Some(available) = report.metrics_available {
            let streak = self.unavailable_streak.get_or_create(&labels);
            if available {
                streak.set(0);
            } else {
                streak.inc();
            }
        }
        if let Some((reason, limited)) = report.limitation {
            for other in limit_reasons().filter(|r| *r != reason) {
                self.limited.remove(&limit_labels(namespace, policy, other));
            }
            self.limited
                .get_or_create(&limit_labels(namespace, policy, reason))
                .set(i64::from(limited));
        }
    }

    fn record_sla(&self, labels: &PolicyLabels, sla: Option<&SlaReport>) {
        let Some(sla) = sla else {
            for family in &self.sla {
                family.remove(labels);
            }
            for family in &self.sla_counts {
                family.remove(labels);
            }
            return;
        };
        let (intervals, met) = sla.attainment;
        let ratio = (intervals > 0).then(|| met as f64 / intervals as f64);
        set_or_remove(
            &self.sla,
            labels,
            [Some(sla.ttft_s), Some(sla.itl_s), sla.ttft_percentile, ratio],
        );
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let [intervals_gauge, met_gauge, missed] = &self.sla_counts;
        intervals_gauge.get_or_create(labels).set(count(intervals));
        met_gauge.get_or_create(labels).set(count(met));
        let missed = missed.get_or_create(labels);
        match sla.met {
            Some(true) => {
                missed.set(0);
            }
            Some(false) => {
                missed.inc();
            }
            None => {}
        }
    }

    /// Counts a decision that moved replicas.
    pub fn decision(&self, namespace: &str, policy: &str, up: bool) {
        let direction = if up { "up" } else { "down" };
        self.decisions
            .get_or_create(&DirectionLabels {
                namespace: namespace.into(),
                policy: policy.into(),
                direction: direction.into(),
            })
            .inc();
    }

    /// Records how late an interval ran.
    pub fn lateness(&self, seconds: f64) {
        self.lateness.observe(seconds.max(0.0));
    }

    /// The counters of one policy, for the steps that read its metrics.
    pub fn of<'a>(&'a self, namespace: &'a str, policy: &'a str) -> PolicyCounters<'a> {
        PolicyCounters {
            metrics: self,
            namespace,
            policy,
        }
    }

    /// Removes every policy's series: a replica that stopped leading plans nothing, and its
    /// last figures must not stand beside the new leader's.
    pub fn clear(&self) {
        for family in [&self.desired, &self.current] {
            family.clear();
        }
        self.correction.clear();
        for family in self
            .observed
            .iter()
            .chain(&self.predicted)
            .chain(&self.sla)
            .chain(std::iter::once(&self.interval))
        {
            family.clear();
        }
        for family in self
            .sla_counts
            .iter()
            .chain(&self.gpus)
            .chain(std::iter::once(&self.unavailable_streak))
        {
            family.clear();
        }
        self.limited.clear();
        self.decisions.clear();
        self.metrics_unavailable.clear();
    }

    /// Removes every series of a deleted policy.
    pub fn remove(&self, namespace: &str, policy: &str) {
        let labels = PolicyLabels {
            namespace: namespace.into(),
            policy: policy.into(),
        };
        for pool in POOLS {
            let pool = Self::pool(namespace, policy, pool);
            self.desired.remove(&pool);
            self.current.remove(&pool);
            self.correction.remove(&pool);
        }
        for family in self.observed.iter().chain(&self.predicted).chain(&self.sla) {
            family.remove(&labels);
        }
        self.interval.remove(&labels);
        for family in self.sla_counts.iter().chain(&self.gpus) {
            family.remove(&labels);
        }
        self.unavailable_streak.remove(&labels);
        for reason in limit_reasons() {
            self.limited.remove(&limit_labels(namespace, policy, reason));
        }
        for direction in ["up", "down"] {
            self.decisions.remove(&DirectionLabels {
                namespace: namespace.into(),
                policy: policy.into(),
                direction: direction.into(),
            });
        }
        for reason in UNAVAILABLE_REASONS {
            self.metrics_unavailable.remove(&ReasonLabels {
                namespace: namespace.into(),
                policy: policy.into(),
                reason,
            });
        }
    }
}

fn limit_labels(namespace: &str, policy: &str, reason: &'static str) -> LimitLabels {
    LimitLabels {
        namespace: namespace.into(),
        policy: policy.into(),
        reason,
    }
}

/// Sets each family's series to its value; removes it where there is none (a figure the
/// planner does not read has no series, rather than a stale or zero one).
fn set_or_remove<const N: usize>(
    families: &[Family<PolicyLabels, FloatGauge>; N],
    labels: &PolicyLabels,
    values: [Option<f64>; N],
) {
    for (family, value) in families.iter().zip(values) {
        match value.filter(|v| v.is_finite()) {
            Some(value) => {
                family.get_or_create(labels).set(value);
            }
            None => {
                family.remove(labels);
            }
        }
    }
}

/// One policy's counters of failed reads.
#[derive(Clone, Copy, Debug)]
pub struct PolicyCounters<'a> {
    metrics: &'a PolicyMetrics,
    namespace: &'a str,
    policy: &'a str,
}

impl PolicyCounters<'_> {
    /// Counts a read whose metrics could not be had (`reason`: one of
    /// [`UNAVAILABLE_REASONS`]).
    pub fn metrics_unavailable(&self, reason: &'static str) {
        self.metrics
            .metrics_unavailable
            .get_or_create(&ReasonLabels {
                namespace: self.namespace.into(),
                policy: self.policy.into(),
                reason,
            })
            .inc();
    }

    /// Records how late an interval ran.
    pub fn lateness(&self, seconds: f64) {
        self.metrics.lateness(seconds);
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    fn text(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    fn sla_interval(met: Option<bool>, attainment: (usize, usize)) -> IntervalReport {
        IntervalReport {
            interval_s: 60.0,
            desired: Some((2, 3)),
            current: Some((1, 3)),
            desired_gpus: Some(10),
            gpus_in_use: Some(8),
            observed: Some(ObservedFigures {
                requests: Some(120.0),
                isl: Some(3000.0),
                osl: Some(150.0),
                ttft_s: Some(0.42),
                itl_s: Some(0.031),
                ttft_percentile_s: Some(0.8),
                decode_kv_usage: Some(0.5),
                prefill_queue: None,
            }),
            predicted: Some([130.0, 3000.0, 150.0]),
            correction: Some((0.9, 1.1)),
            uses_correction: true,
            sla: Some(SlaReport {
                ttft_s: 0.5,
                itl_s: 0.05,
                ttft_percentile: Some(90.0),
                attainment,
                met,
            }),
            metrics_available: Some(true),
            limitation: Some(("MaxReplicas", true)),
        }
    }

    #[test]
    fn series_are_labelled_and_removed_with_the_policy() {
        let mut registry = Registry::with_prefix("planner_operator");
        let metrics = PolicyMetrics::register(&mut registry);
        metrics.record("llm", "llama-sla", &sla_interval(Some(false), (4, 3)));
        metrics.decision("llm", "llama-sla", true);
        metrics.lateness(0.2);
        metrics.of("llm", "llama-sla").metrics_unavailable("no_series");
        let text = text(&registry);
        for expected in [
            "planner_operator_desired_replicas{namespace=\"llm\",policy=\"llama-sla\",pool=\"prefill\"} 2",
            "planner_operator_current_replicas{namespace=\"llm\",policy=\"llama-sla\",pool=\"decode\"} 3",
            "planner_operator_observed_ttft_seconds{namespace=\"llm\",policy=\"llama-sla\"} 0.42",
            "planner_operator_observed_ttft_percentile_seconds{namespace=\"llm\",policy=\"llama-sla\"} 0.8",
            "planner_operator_observed_decode_kv_usage_ratio{namespace=\"llm\",policy=\"llama-sla\"} 0.5",
            "planner_operator_predicted_requests{namespace=\"llm\",policy=\"llama-sla\"} 130.0",
            "planner_operator_correction_factor{namespace=\"llm\",policy=\"llama-sla\",pool=\"decode\"} 1.1",
            "planner_operator_scaling_decisions_total{namespace=\"llm\",policy=\"llama-sla\",direction=\"up\"} 1",
            "planner_operator_interval_lateness_seconds_count 1",
            "planner_operator_metrics_unavailable_total{namespace=\"llm\",policy=\"llama-sla\",reason=\"no_series\"} 1",
            "planner_operator_ttft_target_seconds{namespace=\"llm\",policy=\"llama-sla\"} 0.5",
            "planner_operator_itl_target_seconds{namespace=\"llm\",policy=\"llama-sla\"} 0.05",
            "planner_operator_ttft_target_percentile{namespace=\"llm\",policy=\"llama-sla\"} 90.0",
            "planner_operator_sla_attainment_ratio{namespace=\"llm\",policy=\"llama-sla\"} 0.75",
            "planner_operator_sla_intervals{namespace=\"llm\",policy=\"llama-sla\"} 4",
            "planner_operator_sla_intervals_met{namespace=\"llm\",policy=\"llama-sla\"} 3",
            "planner_operator_consecutive_intervals_sla_missed{namespace=\"llm\",policy=\"llama-sla\"} 1",
            "planner_operator_consecutive_intervals_metrics_unavailable{namespace=\"llm\",policy=\"llama-sla\"} 0",
            "planner_operator_interval_seconds{namespace=\"llm\",policy=\"llama-sla\"} 60.0",
            "planner_operator_desired_gpus{namespace=\"llm\",policy=\"llama-sla\"} 10",
            "planner_operator_gpus_in_use{namespace=\"llm\",policy=\"llama-sla\"} 8",
            "planner_operator_scaling_limited{namespace=\"llm\",policy=\"llama-sla\",reason=\"MaxReplicas\"} 1",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        // A figure not read (the prefill queue in SLA mode) has no series.
        assert!(!text.contains("observed_prefill_queue_requests{"), "{text}");
        metrics.remove("llm", "llama-sla");
        let text = self::text(&registry);
        assert!(!text.contains("llama-sla"), "{text}");
        // A replica that stops leading drops them all.
        metrics.record("llm", "other", &sla_interval(Some(true), (1, 1)));
        metrics.decision("llm", "other", false);
        metrics.of("llm", "other").metrics_unavailable("http");
        metrics.clear();
        let text = self::text(&registry);
        assert!(!text.contains("namespace=\"llm\""), "{text}");
    }

    #[test]
    fn streaks_count_intervals_in_a_row_and_reset() {
        let mut registry = Registry::with_prefix("planner_operator");
        let metrics = PolicyMetrics::register(&mut registry);
        let missed = "planner_operator_consecutive_intervals_sla_missed{namespace=\"a\",policy=\"p\"}";
        let unavailable =
            "planner_operator_consecutive_intervals_metrics_unavailable{namespace=\"a\",policy=\"p\"}";
        let no_metrics = IntervalReport {
            metrics_available: Some(false),
            sla: Some(SlaReport {
                met: None,
                ..SlaReport::default()
            }),
            ..IntervalReport::default()
        };
        metrics.record("a", "p", &sla_interval(Some(false), (1, 0)));
        metrics.record("a", "p", &no_metrics);
        metrics.record("a", "p", &no_metrics);
        metrics.record("a", "p", &sla_interval(Some(false), (2, 0)));
        let text = text(&registry);
        // Intervals without metrics neither break nor extend the run of misses.
        assert!(text.contains(&format!("{missed} 2")), "{text}");
        assert!(text.contains(&format!("{unavailable} 0")), "{text}");
        metrics.record("a", "p", &no_metrics);
        metrics.record("a", "p", &no_metrics);
        assert!(self::text(&registry).contains(&format!("{unavailable} 2")));
        metrics.record("a", "p", &sla_interval(Some(true), (3, 1)));
        let text = self::text(&registry);
        assert!(text.contains(&format!("{missed} 0")), "{text}");
        assert!(text.contains(&format!("{unavailable} 0")), "{text}");
    }

    #[test]
    fn a_planner_without_an_sla_or_correction_has_no_such_series() {
        let mut registry = Registry::with_prefix("planner_operator");
        let metrics = PolicyMetrics::register(&mut registry);
        metrics.record("a", "p", &sla_interval(Some(true), (1, 1)));
        // The policy switches to mode load: queue and KV usage, no SLA, no correction.
        metrics.record(
            "a",
            "p",
            &IntervalReport {
                interval_s: 30.0,
                observed: Some(ObservedFigures {
                    decode_kv_usage: Some(0.7),
                    prefill_queue: Some(1.5),
                    ..ObservedFigures::default()
                }),
                metrics_available: Some(true),
                limitation: Some(("WithinBounds", false)),
                ..IntervalReport::default()
            },
        );
        let text = text(&registry);
        for gone in [
            "ttft_target_seconds{",
            "sla_attainment_ratio{",
            "sla_intervals{",
            "correction_factor{",
            "observed_requests{",
            "observed_ttft_seconds{",
            "predicted_requests{",
            "reason=\"MaxReplicas\"",
        ] {
            assert!(!text.contains(gone), "{gone} still there:\n{text}");
        }
        for kept in [
            "planner_operator_observed_prefill_queue_requests{namespace=\"a\",policy=\"p\"} 1.5",
            "planner_operator_observed_decode_kv_usage_ratio{namespace=\"a\",policy=\"p\"} 0.7",
            "planner_operator_scaling_limited{namespace=\"a\",policy=\"p\",reason=\"WithinBounds\"} 0",
            "planner_operator_interval_seconds{namespace=\"a\",policy=\"p\"} 30.0",
        ] {
            assert!(text.contains(kept), "missing {kept}:\n{text}");
        }
    }
}

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
    /// `http` (no answer or an HTTP error), `query` (Prometheus rejected the query or answered
    /// with something else than a result), `no_series` (no series of the graph and model), or
    /// `client` (no HTTP client for the URL).
    pub reason: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// What one interval reported, for the gauges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IntervalReport {
    /// Desired (prefill, decode).
    pub desired: Option<(u32, u32)>,
    /// Current (prefill, decode).
    pub current: Option<(u32, u32)>,
    /// Observed requests, ISL, OSL, TTFT (s), ITL (s).
    pub observed: Option<[f64; 5]>,
    /// Predicted requests, ISL, OSL.
    pub predicted: Option<[f64; 3]>,
    /// Correction factors (prefill, decode).
    pub correction: Option<(f64, f64)>,
}

/// The per-policy families.
#[derive(Debug)]
pub struct PolicyMetrics {
    desired: Family<PoolLabels, Gauge>,
    current: Family<PoolLabels, Gauge>,
    correction: Family<PoolLabels, FloatGauge>,
    observed: [Family<PolicyLabels, FloatGauge>; 5],
    predicted: [Family<PolicyLabels, FloatGauge>; 3],
    decisions: Family<DirectionLabels, Counter>,
    lateness: Histogram,
    metrics_unavailable: Family<ReasonLabels, Counter>,
}

const POOLS: [&str; 2] = ["prefill", "decode"];

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
            "Observed over profiled latency",
            correction.clone(),
        );
        let observed: [Family<PolicyLabels, FloatGauge>; 5] = Default::default();
        for (family, (name, help)) in observed.iter().zip([
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
        ]) {
            registry.register(name, help, family.clone());
        }
        let predicted: [Family<PolicyLabels, FloatGauge>; 3] = Default::default();
        for (family, (name, help)) in predicted.iter().zip([
            ("predicted_requests", "Requests predicted for the next interval"),
            (
                "predicted_isl",
                "Mean input sequence length predicted for the next interval",
            ),
            (
                "predicted_osl",
                "Mean output sequence length predicted for the next interval",
            ),
        ]) {
            registry.register(name, help, family.clone());
        }
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
            "Planner intervals whose frontend metrics could not be read from Prometheus, by reason",
            metrics_unavailable.clone(),
        );
        Self {
            desired,
            current,
            correction,
            observed,
            predicted,
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

    /// Records one interval.
    pub fn record(&self, namespace: &str, policy: &str, report: &IntervalReport) {
        let labels = PolicyLabels {
            namespace: namespace.into(),
            policy: policy.into(),
        };
        if let Some((p, d)) = report.desired {
            self.desired
                .get_or_create(&Self::pool(namespace, policy, "prefill"))
                .set(i64::from(p));
            self.desired
                .get_or_create(&Self::pool(namespace, policy, "decode"))
                .set(i64::from(d));
        }
        if let Some((p, d)) = report.current {
            self.current
                .get_or_create(&Self::pool(namespace, policy, "prefill"))
                .set(i64::from(p));
            self.current
                .get_or_create(&Self::pool(namespace, policy, "decode"))
                .set(i64::from(d));
        }
        if let Some((p, d)) = report.correction {
            self.correction
                .get_or_create(&Self::pool(namespace, policy, "prefill"))
                .set(p);
            self.correction
                .get_or_create(&Self::pool(namespace, policy, "decode"))
                .set(d);
        }
        if let Some(values) = report.observed {
            for (family, value) in self.observed.iter().zip(values) {
                family.get_or_create(&labels).set(value);
            }
        }
        if let Some(values) = report.predicted {
            for (family, value) in self.predicted.iter().zip(values) {
                family.get_or_create(&labels).set(value);
            }
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

    /// Counts an interval whose metrics could not be read (`reason`: see [`ReasonLabels`]).
    pub fn metrics_unavailable(&self, reason: &'static str) {
        self.metrics_unavailable
            .get_or_create(&ReasonLabels { reason })
            .inc();
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
        for family in self.observed.iter().chain(&self.predicted) {
            family.remove(&labels);
        }
        for direction in ["up", "down"] {
            self.decisions.remove(&DirectionLabels {
                namespace: namespace.into(),
                policy: policy.into(),
                direction: direction.into(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[test]
    fn series_are_labelled_and_removed_with_the_policy() {
        let mut registry = Registry::with_prefix("planner_operator");
        let metrics = PolicyMetrics::register(&mut registry);
        metrics.record(
            "llm",
            "llama-sla",
            &IntervalReport {
                desired: Some((2, 3)),
                current: Some((1, 3)),
                observed: Some([120.0, 3000.0, 150.0, 0.42, 0.031]),
                predicted: Some([130.0, 3000.0, 150.0]),
                correction: Some((0.9, 1.1)),
            },
        );
        metrics.decision("llm", "llama-sla", true);
        metrics.lateness(0.2);
        metrics.metrics_unavailable("no_series");
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for expected in [
            "planner_operator_desired_replicas{namespace=\"llm\",policy=\"llama-sla\",pool=\"prefill\"} 2",
            "planner_operator_current_replicas{namespace=\"llm\",policy=\"llama-sla\",pool=\"decode\"} 3",
            "planner_operator_observed_ttft_seconds{namespace=\"llm\",policy=\"llama-sla\"} 0.42",
            "planner_operator_predicted_requests{namespace=\"llm\",policy=\"llama-sla\"} 130.0",
            "planner_operator_correction_factor{namespace=\"llm\",policy=\"llama-sla\",pool=\"decode\"} 1.1",
            "planner_operator_scaling_decisions_total{namespace=\"llm\",policy=\"llama-sla\",direction=\"up\"} 1",
            "planner_operator_interval_lateness_seconds_count 1",
            "planner_operator_metrics_unavailable_total{reason=\"no_series\"} 1",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        metrics.remove("llm", "llama-sla");
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(!text.contains("llama-sla"), "{text}");
    }
}

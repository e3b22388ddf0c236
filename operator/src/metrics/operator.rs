//! The operator's own metrics, prefix `planner_operator_`. Labels are bounded: the
//! controller name, a result, an error kind; never an object's name on a counter that grows.

use std::{sync::Arc, time::Instant};

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram, info::Info},
    registry::{Registry, Unit},
};

/// Labels of `reconcile_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// `dgd` or `plannerpolicy`.
    pub controller: &'static str,
    /// `success` or `error`.
    pub result: &'static str,
}

/// Labels of `reconcile_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The controller.
    pub controller: &'static str,
    /// A bounded error category (see the controllers' `Error::kind`).
    pub kind: &'static str,
}

/// Labels naming only the controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// The controller.
    pub controller: &'static str,
}

/// Labels of `admission_reviews_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// `DynamoGraphDeployment` or `PlannerPolicy`.
    pub kind: &'static str,
    /// `allowed`, `denied` or `invalid` (not an AdmissionReview).
    pub result: &'static str,
}

/// Labels naming only the kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// The kind.
    pub kind: &'static str,
}

/// Labels of `build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The operator's version.
    pub version: &'static str,
    /// The CPU architecture it was built for.
    pub arch: &'static str,
    /// The operating system it was built for.
    pub os: &'static str,
}

/// Reconcile counters and timings, plus leadership.
#[derive(Debug)]
pub struct OperatorMetrics {
    registry: Registry,
    reconciles: Family<ReconcileLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    durations: Family<ControllerLabels, Histogram>,
    invalid_objects: Family<ControllerLabels, Counter>,
    leader: Gauge,
    admission_reviews: Family<AdmissionLabels, Counter>,
    admission_durations: Family<KindLabels, Histogram>,
    webhook_certificate_expiry: Gauge,
    /// Per-PlannerPolicy metrics.
    pub policies: super::policy::PolicyMetrics,
    /// Per-GpuBudget metrics.
    pub budgets: super::budget::BudgetMetrics,
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl OperatorMetrics {
    /// Registers every metric under the `planner_operator` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("planner_operator");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "reconcile",
            "Reconciles by controller and result",
            reconciles.clone(),
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Reconcile errors by controller and kind",
            errors.clone(),
        );
        let durations = Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
        });
        registry.register_with_unit(
            "reconcile_duration",
            "Reconcile duration",
            Unit::Seconds,
            durations.clone(),
        );
        let invalid_objects = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "invalid_objects",
            "Watched objects that could not be parsed and were skipped",
            invalid_objects.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this process holds the leader lease",
            leader.clone(),
        );
        let admission_reviews = Family::<AdmissionLabels, Counter>::default();
        registry.register(
            "admission_reviews",
            "Admission reviews answered, by kind and result",
            admission_reviews.clone(),
        );
        let admission_durations = Family::<KindLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0])
        });
        registry.register_with_unit(
            "admission_duration",
            "Time to answer an admission review, lookups included",
            Unit::Seconds,
            admission_durations.clone(),
        );
        let webhook_certificate_expiry = Gauge::default();
        registry.register(
            "webhook_certificate_expiry_timestamp_seconds",
            "Unix time at which the webhook's serving certificate expires (0 before one is loaded)",
            webhook_certificate_expiry.clone(),
        );
        registry.register(
            "build",
            "The operator's build: version, architecture, operating system",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                arch: std::env::consts::ARCH,
                os: std::env::consts::OS,
            }),
        );
        let policies = super::policy::PolicyMetrics::register(&mut registry);
        let budgets = super::budget::BudgetMetrics::register(&mut registry);
        Self {
            registry,
            reconciles,
            errors,
            durations,
            invalid_objects,
            leader,
            admission_reviews,
            admission_durations,
            webhook_certificate_expiry,
            policies,
            budgets,
        }
    }

    /// Registry for other components' metrics (e.g. per-policy planner metrics).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Starts timing a reconcile; the guard records the duration when dropped.
    pub fn reconcile_started(self: &Arc<Self>, controller: &'static str) -> ReconcileTimer {
        ReconcileTimer {
            metrics: Arc::clone(self),
            controller,
            started: Instant::now(),
        }
    }

    /// Counts a finished reconcile; `error` is its bounded kind when it failed.
    pub fn reconcile_finished(&self, controller: &'static str, error: Option<&'static str>) {
        let result = if error.is_some() { "error" } else { "success" };
        self.reconciles
            .get_or_create(&ReconcileLabels { controller, result })
            .inc();
        if let Some(kind) = error {
            self.errors.get_or_create(&ErrorLabels { controller, kind }).inc();
        }
    }

    /// Counts an object that failed to deserialize.
    pub fn invalid_object(&self, controller: &'static str) {
        self.invalid_objects
            .get_or_create(&ControllerLabels { controller })
            .inc();
    }

    /// Records whether this process leads. A replica that stops leading drops its policies'
    /// and budgets' series: the new leader reports them.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
        if !leader {
            self.policies.clear();
            self.budgets.clear();
        }
    }

    /// Counts an answered admission review and its duration.
    pub fn admission_review(&self, kind: &'static str, result: &'static str, seconds: f64) {
        self.admission_reviews
            .get_or_create(&AdmissionLabels { kind, result })
            .inc();
        self.admission_durations
            .get_or_create(&KindLabels { kind })
            .observe(seconds);
    }

    /// Records when the webhook's serving certificate expires (Unix seconds).
    pub fn set_webhook_certificate_expiry(&self, unix_seconds: i64) {
        self.webhook_certificate_expiry.set(unix_seconds);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Records a reconcile's duration when dropped.
#[derive(Debug)]
pub struct ReconcileTimer {
    metrics: Arc<OperatorMetrics>,
    controller: &'static str,
    started: Instant,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.metrics
            .durations
            .get_or_create(&ControllerLabels {
                controller: self.controller,
            })
            .observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_the_design_names_and_bounded_labels() {
        let metrics = Arc::new(OperatorMetrics::new());
        {
            let _timer = metrics.reconcile_started("dgd");
            metrics.reconcile_finished("dgd", None);
        }
        metrics.reconcile_finished("dgd", Some("kube_api"));
        metrics.invalid_object("dgd");
        metrics.set_leader(true);
        metrics.admission_review("PlannerPolicy", "denied", 0.002);
        metrics.set_webhook_certificate_expiry(1_900_000_000);
        let text = metrics.encode().unwrap();
        for expected in [
            "planner_operator_reconcile_total{controller=\"dgd\",result=\"success\"} 1",
            "planner_operator_reconcile_total{controller=\"dgd\",result=\"error\"} 1",
            "planner_operator_reconcile_errors_total{controller=\"dgd\",kind=\"kube_api\"} 1",
            "planner_operator_reconcile_duration_seconds_count{controller=\"dgd\"} 1",
            "planner_operator_invalid_objects_total{controller=\"dgd\"} 1",
            "planner_operator_leader 1",
            "planner_operator_admission_reviews_total{kind=\"PlannerPolicy\",result=\"denied\"} 1",
            "planner_operator_admission_duration_seconds_count{kind=\"PlannerPolicy\"} 1",
            "planner_operator_webhook_certificate_expiry_timestamp_seconds 1900000000",
            concat!(
                "planner_operator_build_info{version=\"",
                env!("CARGO_PKG_VERSION"),
                "\",arch=\""
            ),
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }
}

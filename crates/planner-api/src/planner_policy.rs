//! `PlannerPolicy` (`planner.dynamo.io/v1alpha1`): how one DynamoGraphDeployment is autoscaled.
//!
//! Defaults are those of the upstream Dynamo SLA planner (`planner/defaults.py`) and, for
//! `mode: load`, of Dynamo's original load-based planner.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{
    CustomResource, KubeSchema,
    core::{Message, Rule},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    dgd::Enforcement,
    gpu_budget::{BudgetGrant, BudgetRef},
    limits, schema,
};

/// Names of the profiles compiled into the operator (`config/profiles/<name>/`).
pub const BUILTIN_PROFILES: [&str; 4] = [
    "h200-llama3.1-8b-tp1",
    "h100-llama3.3-70b-tp8",
    "h100-llama3.3-70b-tp4",
    "h100-llama3.3-70b-tp2",
];

/// Autoscaling policy for the prefill and decode pools of one DynamoGraphDeployment.
// clippy reads the repeated `type_ = ...` of separate printer columns as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "planner.dynamo.io",
    version = "v1alpha1",
    kind = "PlannerPolicy",
    plural = "plannerpolicies",
    singular = "plannerpolicy",
    shortname = "ppol",
    category = "dynamo",
    namespaced,
    status = "PlannerPolicyStatus",
    derive = "PartialEq",
    doc = "Autoscaling policy for the prefill and decode pools of one DynamoGraphDeployment.",
    printcolumn(
        name = "Target",
        type_ = "string",
        json_path = ".spec.targetRef.name",
        description = "Target DynamoGraphDeployment"
    ),
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".spec.mode",
        description = "sla, load or observe"
    ),
    printcolumn(
        name = "Prefill",
        type_ = "string",
        json_path = ".status.summary.prefill",
        description = "Prefill replicas serving / of the last decision (an aggregated graph's workers)"
    ),
    printcolumn(
        name = "Decode",
        type_ = "string",
        json_path = ".status.summary.decode",
        description = "Decode replicas serving / of the last decision (an aggregated graph's workers)"
    ),
    printcolumn(
        name = "TTFT",
        type_ = "string",
        json_path = ".status.summary.ttft",
        description = "Observed time to first token / target (ms), at the percentile targeted"
    ),
    printcolumn(
        name = "ITL",
        type_ = "string",
        json_path = ".status.summary.itl",
        description = "Observed mean inter-token latency / target (ms)"
    ),
    printcolumn(
        name = "SLA",
        type_ = "string",
        json_path = ".status.summary.sla",
        description = "Share of the last hour's intervals whose load met the SLA"
    ),
    printcolumn(
        name = "Limited",
        type_ = "string",
        json_path = ".status.summary.limited",
        description = "What limited the last decision (ScalingLimited's reason), '-' when nothing"
    ),
    printcolumn(
        name = "LastScale",
        type_ = "date",
        json_path = ".status.lastScaleTime",
        description = "When replicas were last changed"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Ready condition"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("(has(self.mode) && self.mode == 'load') || has(self.profile)")
    .message("spec.profile is required when spec.mode is sla or observe: set profile.builtin or profile.configMapRef")
    .field_path(".profile"))]
#[x_kube(validation = limits::load_interval_rule())]
#[x_kube(validation = limits::pulling_interval_rule())]
#[serde(rename_all = "camelCase")]
pub struct PlannerPolicySpec {
    /// The DynamoGraphDeployment this policy scales. It must be in the policy's namespace.
    pub target_ref: TargetRef,

    /// `sla` scales to meet the latency targets from profiling data and predicted load; `load`
    /// follows KV-cache usage and prefill queue thresholds; `observe` computes and reports
    /// decisions without ever scaling.
    #[serde(default)]
    pub mode: PlannerMode,

    /// How often the planner observes, predicts and decides (a Go duration such as `180s` or
    /// `3m`). It is also the window over which Prometheus metrics are averaged. `10s` to `24h`
    /// (to `1h` in mode `load`).
    #[serde(default = "default_adjustment_interval")]
    #[schemars(regex(pattern = limits::DURATION_PATTERN))]
    #[x_kube(validation = limits::duration_rule("spec.adjustmentInterval", limits::ADJUSTMENT_INTERVAL))]
    pub adjustment_interval: String,

    /// Latency targets the `sla` mode plans for.
    #[serde(default)]
    pub sla: Sla,

    /// How fast replicas change (queueing model).
    #[serde(default)]
    pub behavior: Behavior,

    /// Names of the DGD components that are the prefill and decode pools. When a name is not
    /// given, the component is found by `type: prefill` or `type: decode` (exactly one each).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub components: Option<PoolComponents>,

    /// Replica bounds and GPU budget applied to every decision.
    #[serde(default)]
    pub bounds: Bounds,

    /// Load predictor for the next interval's request count, input and output lengths.
    #[serde(default)]
    pub predictor: Predictor,

    /// Correction of the profiled latencies with observed ones (`sla.model: upstream` only).
    #[serde(default, skip_serializing_if = "is_default")]
    pub correction: Correction,

    /// Profiling data of the deployed model and engine configuration. Required by the `sla` and
    /// `observe` modes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,

    /// Where the frontend metrics are read from and how they are filtered.
    #[serde(default, skip_serializing_if = "is_default")]
    pub metrics: MetricsSource,

    /// How decisions are carried out. Default: the `kubernetes` connector.
    #[serde(default, skip_serializing_if = "is_default")]
    pub connector: Connector,

    /// Thresholds of the load-based planner (`mode: load` only).
    #[serde(default, skip_serializing_if = "is_default")]
    pub load: LoadThresholds,

    /// The GpuBudget (cluster-scoped) this policy shares GPUs through with other policies: each
    /// decision is granted by the budget, within its total, besides `spec.bounds`. The budget
    /// must admit the policy (its `spec.members`); modes `sla` and `load` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_ref: Option<BudgetRef>,
}

fn default_adjustment_interval() -> String {
    "180s".into()
}

/// A block left out when it holds only defaults: the schema then gives it no default either, so
/// the API server does not write blocks a policy's mode never uses into every object.
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// Reference to a DynamoGraphDeployment in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// Name of the DynamoGraphDeployment.
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"))]
    pub name: String,
}

/// What the planner does with its decisions.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum PlannerMode {
    /// Meet the TTFT and ITL targets using profiling data and predicted load.
    #[default]
    Sla,
    /// Scale by KV-cache usage and prefill queue thresholds, one replica per interval.
    Load,
    /// Compute and report decisions, never scale.
    Observe,
}

impl PlannerMode {
    /// The name used in the spec.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sla => "sla",
            Self::Load => "load",
            Self::Observe => "observe",
        }
    }
}

impl fmt::Display for PlannerMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Latency targets, in milliseconds.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Sla {
    /// Target mean time to first token, in milliseconds. Must be greater than 0.
    #[serde(default = "default_ttft_ms")]
    #[schemars(range(min = 0.0), extend("exclusiveMinimum" = true))]
    pub ttft_ms: f64,
    /// Target mean inter-token latency, in milliseconds. Must be greater than 0.
    #[serde(default = "default_itl_ms")]
    #[schemars(range(min = 0.0), extend("exclusiveMinimum" = true))]
    pub itl_ms: f64,
    /// Share of a prefill replica's profiled throughput the planner may plan to use, greater
    /// than 0 and at most 1, with `model: upstream`: 1 (the default) sizes prefill as upstream
    /// does, for saturation at the predicted mean load; 0.7 leaves 30 % headroom. The queueing
    /// model does not use it: it sizes prefill on the predicted TTFT, queue wait included.
    #[serde(
        default = "default_prefill_utilization",
        skip_serializing_if = "is_full_utilization"
    )]
    #[schemars(range(min = 0.0, max = 1.0), extend("exclusiveMinimum" = true))]
    pub prefill_utilization: f64,
    /// How replicas are sized. `queueing` (the default): demand counted when requests arrive,
    /// prefill sized so that the predicted TTFT including the queue wait meets the target,
    /// decode sized on ITL and KV-cache capacity, for the load expected once new replicas are
    /// ready, with a fast scale-up check between intervals. `upstream`: Dynamo's SLA planner
    /// formulas, bit for bit (throughput per replica at the predicted mean load).
    #[serde(default)]
    pub model: SlaModel,
    /// Aim the TTFT target at this percentile of requests (e.g. 90 or 95) instead of the mean.
    /// Queueing model only: prefill is sized so that this percentile of the modelled TTFT (the
    /// queue wait's tail) meets the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 50.0, max = 99.9))]
    pub ttft_percentile: Option<f64>,
    /// Aim the ITL target at this percentile of tokens instead of the mean. Queueing model only:
    /// decode is sized so that the ITL at this percentile of the running requests (a normal
    /// approximation of their number) meets the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 50.0, max = 99.9))]
    pub itl_percentile: Option<f64>,
}

/// How `spec.sla` targets are turned into replicas.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SlaModel {
    /// Queueing model on arrivals, planning for when new replicas are ready.
    #[default]
    Queueing,
    /// Dynamo's SLA planner formulas.
    Upstream,
}

impl fmt::Display for SlaModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Queueing => "queueing",
            Self::Upstream => "upstream",
        })
    }
}

/// How fast replicas change (the queueing model), in the spirit of the HorizontalPodAutoscaler's
/// `behavior`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Behavior {
    /// Time from asking for a replica to it serving (a Go duration, at most `1h`): how far
    /// ahead the planner sizes. When not set, it is measured from each scale-up to the target's
    /// replicas serving (averaged with the previous measurement; `expectedScaleUpDelay` until
    /// the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = limits::DURATION_PATTERN))]
    #[x_kube(validation = limits::duration_rule("spec.behavior.scaleUpDelay", limits::BEHAVIOR_WINDOW))]
    pub scale_up_delay: Option<String>,
    /// The scale-up delay to assume until one is measured, when `scaleUpDelay` is not set (a
    /// Go duration, at most `1h`; unset, 60 s is assumed): how long the model roughly takes
    /// to schedule, pull and load. Past about one and a half adjustment intervals it also turns
    /// on the long-delay rules from the first interval (a pool grows at most to 1.3 times its
    /// engines serving while its replicas start, which the assumed 60 s never does), before any
    /// scale-up has been measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = limits::DURATION_PATTERN))]
    #[x_kube(validation = limits::duration_rule("spec.behavior.expectedScaleUpDelay", limits::BEHAVIOR_WINDOW))]
    pub expected_scale_up_delay: Option<String>,
    /// Scale-down stabilisation window (a Go duration, at most `1h`; default `300s`, as the
    /// HorizontalPodAutoscaler). A pool scales down only to what `scaleDownStabilizationKeeps`
    /// keeps of the replicas recommended within the window (by default their 0.8 quantile,
    /// rounded up: recommendations of 5, 5, 5, 5 and 9 hold 6, and with a sixth 5 the pool goes
    /// to 5; the HorizontalPodAutoscaler keeps the highest, 9), and not at all while the
    /// requests waiting would take the serving prefill engines longer than the TTFT target to
    /// clear.
    #[serde(default = "default_stabilization")]
    #[schemars(regex(pattern = limits::DURATION_PATTERN))]
    #[x_kube(validation = limits::duration_rule("spec.behavior.scaleDownStabilization", limits::BEHAVIOR_WINDOW))]
    pub scale_down_stabilization: String,
    /// What the scale-down stabilisation window keeps: `quantile` (the default) the 0.8
    /// quantile, rounded up, of the replicas recommended within the window, so one outlier does
    /// not hold a pool up for the whole window; `highest` the highest recommendation, as the
    /// HorizontalPodAutoscaler's `stabilizationWindowSeconds` does.
    #[serde(default)]
    pub scale_down_stabilization_keeps: StabilizationKeeps,
    /// How often, between intervals, the planner checks the backlog and the arrival rate, and
    /// scales both pools up at once (never down) when the backlog would outlast the scale-up
    /// delay or arrivals run well above the rate the last interval planned for. A Go duration
    /// from `5s` to `5m`, or `0s` to turn the check off. Default `10s`.
    #[serde(default = "default_fast_check_period")]
    #[schemars(regex(pattern = limits::DURATION_PATTERN))]
    #[x_kube(validation = limits::fast_check_rule())]
    pub fast_check_period: String,
}

impl Default for Behavior {
    fn default() -> Self {
        Self {
            scale_up_delay: None,
            expected_scale_up_delay: None,
            scale_down_stabilization: default_stabilization(),
            scale_down_stabilization_keeps: StabilizationKeeps::default(),
            fast_check_period: default_fast_check_period(),
        }
    }
}

/// What a scale-down stabilisation window keeps of the replicas recommended within it.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum StabilizationKeeps {
    /// The 0.8 quantile, rounded up.
    #[default]
    Quantile,
    /// The highest, as the HorizontalPodAutoscaler.
    Highest,
}

fn default_stabilization() -> String {
    "300s".into()
}

fn default_fast_check_period() -> String {
    "10s".into()
}

fn default_prefill_utilization() -> f64 {
    1.0
}

fn is_full_utilization(value: &f64) -> bool {
    *value == default_prefill_utilization()
}

fn default_ttft_ms() -> f64 {
    500.0
}

fn default_itl_ms() -> f64 {
    50.0
}

impl Default for Sla {
    fn default() -> Self {
        Self {
            ttft_ms: default_ttft_ms(),
            itl_ms: default_itl_ms(),
            prefill_utilization: default_prefill_utilization(),
            model: SlaModel::default(),
            ttft_percentile: None,
            itl_percentile: None,
        }
    }
}

/// DGD component names of the two pools.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new("!has(self.prefill) || !has(self.decode) || self.prefill != self.decode")
    .message("spec.components.prefill and spec.components.decode must name different components"))]
#[serde(rename_all = "camelCase")]
pub struct PoolComponents {
    /// Name of the prefill component. Default: the one component with `type: prefill`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$")
    )]
    pub prefill: Option<String>,
    /// Name of the decode component. Default: the one component with `type: decode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$")
    )]
    pub decode: Option<String>,
}

/// Limits every decision respects.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.maxReplicas) || !has(self.minReplicas) || self.maxReplicas >= self.minReplicas")
    .message("spec.bounds.maxReplicas must be greater than or equal to spec.bounds.minReplicas")
    .field_path(".maxReplicas"))]
#[x_kube(validation = pool_bounds_rule("prefill"))]
#[x_kube(validation = pool_bounds_rule("decode"))]
#[serde(rename_all = "camelCase")]
pub struct Bounds {
    /// Fewest replicas of each pool (prefill and decode), unless the pool's own bounds say
    /// otherwise. At least 1, at most 512.
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 1, max = limits::MAX_REPLICAS))]
    pub min_replicas: i32,
    /// Most replicas of each pool (prefill and decode), unless the pool's own bounds say
    /// otherwise; at most 512. Unset: the GPU budget, and never more than 512 however the
    /// metrics read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = limits::MAX_REPLICAS))]
    pub max_replicas: Option<i32>,
    /// The prefill pool's own bounds, in place of `minReplicas` and `maxReplicas` (a
    /// disaggregated graph only: an aggregated graph's one pool takes `minReplicas` and
    /// `maxReplicas`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<PoolBounds>,
    /// The decode pool's own bounds, in place of `minReplicas` and `maxReplicas` (a
    /// disaggregated graph only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<PoolBounds>,
    /// Bounds of the ratio of prefill to decode replicas (prefill replicas per decode replica),
    /// e.g. `{max: 3}` for at least one decode replica per three prefill replicas. Applied after
    /// the pools are sized and budgeted: the pool the ratio wants more of is raised, within
    /// its maximum and the GPU budget, else the other is cut to the bound that fits (never below
    /// its minimum); `ScalingLimited` (reason `RatioBound`) says when it moved a pool or could
    /// not be met. A disaggregated graph only. Step limits and a shared GpuBudget's grant apply
    /// after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_to_decode_ratio: Option<RatioBounds>,
    /// Most replicas one decision may add to a pool (the fast check's included). Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_scale_up_step: Option<i32>,
    /// Most replicas one decision may remove from a pool. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_scale_down_step: Option<i32>,
    /// Allow scaling both pools to zero when the GPU budget cannot fit their minimum replicas
    /// (Dynamo's planner does). Default: the replicas are kept, and the policy says why.
    #[serde(default)]
    pub allow_scale_to_zero: bool,
    /// Most GPUs the prefill and decode pools may use together; `-1` disables the budget.
    /// GPUs per replica come from the component's `nvidia.com/gpu` limit (then request), or 1.
    #[serde(default = "default_max_gpu_budget")]
    #[x_kube(validation = Rule::new("self == -1 || self >= 1")
        .message("spec.bounds.maxGpuBudget must be -1 (no budget) or at least 1"))]
    pub max_gpu_budget: i32,
}

/// Bounds of the ratio of prefill to decode replicas.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new("!has(self.min) || !has(self.max) || self.min <= self.max")
    .message("spec.bounds.prefillToDecodeRatio.min must be at most spec.bounds.prefillToDecodeRatio.max"))]
#[serde(rename_all = "camelCase")]
pub struct RatioBounds {
    /// Fewest prefill replicas per decode replica, greater than 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0), extend("exclusiveMinimum" = true))]
    pub min: Option<f64>,
    /// Most prefill replicas per decode replica, greater than 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0), extend("exclusiveMinimum" = true))]
    pub max: Option<f64>,
}

/// One pool's own replica bounds; what is unset is `spec.bounds.minReplicas` or `maxReplicas`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PoolBounds {
    /// Fewest replicas of the pool, 1 to 512. Unset: `spec.bounds.minReplicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = limits::MAX_REPLICAS))]
    pub min_replicas: Option<i32>,
    /// Most replicas of the pool, 1 to 512. Unset: `spec.bounds.maxReplicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = limits::MAX_REPLICAS))]
    pub max_replicas: Option<i32>,
}

/// A pool's bounds must leave room for its minimum: its maximum (else the shared one, else 512)
/// at least its minimum (else the shared one).
fn pool_bounds_rule(pool: &str) -> Rule {
    Rule::new(format!(
        "!has(self.{pool}) || \
         (has(self.{pool}.maxReplicas) ? self.{pool}.maxReplicas : (has(self.maxReplicas) ? self.maxReplicas : {max})) >= \
         (has(self.{pool}.minReplicas) ? self.{pool}.minReplicas : self.minReplicas)",
        max = limits::MAX_REPLICAS
    ))
    .message(Message::Message(format!(
        "spec.bounds.{pool}: its maxReplicas (else spec.bounds.maxReplicas) must be at least its minReplicas (else spec.bounds.minReplicas)"
    )))
    .field_path(format!(".{pool}"))
}

impl Bounds {
    /// The prefill pool's fewest and most replicas (`None`: no maximum set).
    pub fn prefill_range(&self) -> (i32, Option<i32>) {
        self.range(self.prefill)
    }

    /// The decode pool's fewest and most replicas (`None`: no maximum set).
    pub fn decode_range(&self) -> (i32, Option<i32>) {
        self.range(self.decode)
    }

    fn range(&self, pool: Option<PoolBounds>) -> (i32, Option<i32>) {
        let pool = pool.unwrap_or_default();
        (
            pool.min_replicas.unwrap_or(self.min_replicas),
            pool.max_replicas.or(self.max_replicas),
        )
    }
}

fn default_min_replicas() -> i32 {
    1
}

fn default_max_gpu_budget() -> i32 {
    8
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            min_replicas: default_min_replicas(),
            max_replicas: None,
            prefill: None,
            decode: None,
            prefill_to_decode_ratio: None,
            max_scale_up_step: None,
            max_scale_down_step: None,
            allow_scale_to_zero: false,
            max_gpu_budget: default_max_gpu_budget(),
        }
    }
}

/// Load predictor settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Predictor {
    /// `constant` repeats the last interval; `arima` fits an ARIMA model with automatic order
    /// selection; `kalman` runs a local-linear-trend Kalman filter; `prophet` fits Prophet on a
    /// sliding window.
    #[serde(default, rename = "type")]
    pub kind: PredictorKind,
    /// Model `log1p(load)` instead of the load (ARIMA, Kalman and Prophet), which suits bursty
    /// traffic with occasional spikes.
    #[serde(default)]
    pub log1p: bool,
    /// Kalman filter noise settings (`type: kalman` only).
    #[serde(default, skip_serializing_if = "is_default")]
    pub kalman: KalmanSettings,
    /// Prophet settings (`type: prophet` only).
    #[serde(default, skip_serializing_if = "is_default")]
    pub prophet: ProphetSettings,
    /// A Mooncake JSONL trace used to warm the predictor up before live data arrives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_trace: Option<WarmupTrace>,
}

/// Which load predictor to use.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum PredictorKind {
    /// The next interval equals the last one.
    Constant,
    /// ARIMA with automatic order selection, falling back to log1p on degenerate fits.
    #[default]
    Arima,
    /// Local-linear-trend Kalman filter.
    Kalman,
    /// Prophet on a sliding window.
    Prophet,
}

/// Noise parameters of the local-linear-trend Kalman filter.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KalmanSettings {
    /// Process noise of the level. At least 0.
    #[serde(default = "default_q_level")]
    #[schemars(range(min = 0.0))]
    pub q_level: f64,
    /// Process noise of the trend. At least 0.
    #[serde(default = "default_q_trend")]
    #[schemars(range(min = 0.0))]
    pub q_trend: f64,
    /// Measurement noise. Must be greater than 0.
    #[serde(default = "default_r")]
    #[schemars(range(min = 0.0), extend("exclusiveMinimum" = true))]
    pub r: f64,
    /// Observations needed before the filter's prediction is used; until then the last value is.
    #[serde(default = "default_min_points")]
    #[schemars(range(min = 1))]
    pub min_points: i32,
}

fn default_q_level() -> f64 {
    1.0
}

fn default_q_trend() -> f64 {
    0.1
}

fn default_r() -> f64 {
    10.0
}

fn default_min_points() -> i32 {
    5
}

impl Default for KalmanSettings {
    fn default() -> Self {
        Self {
            q_level: default_q_level(),
            q_trend: default_q_trend(),
            r: default_r(),
            min_points: default_min_points(),
        }
    }
}

/// Prophet settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProphetSettings {
    /// Number of most recent intervals Prophet is fitted on. At least 2.
    #[serde(default = "default_window_size")]
    #[schemars(range(min = 2, max = 10000))]
    pub window_size: i32,
}

fn default_window_size() -> i32 {
    50
}

impl Default for ProphetSettings {
    fn default() -> Self {
        Self {
            window_size: default_window_size(),
        }
    }
}

/// A warm-up trace for the load predictor.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WarmupTrace {
    /// ConfigMap in the policy's namespace holding a Mooncake JSONL trace (`timestamp` in ms,
    /// `input_length`, `output_length` per line).
    pub config_map_ref: ConfigMapKeyRef,
}

/// A key of a ConfigMap in the policy's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyRef {
    /// Name of the ConfigMap.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key of the trace in the ConfigMap's `data`.
    #[serde(default = "default_trace_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_trace_key() -> String {
    "trace.jsonl".into()
}

/// Correction factors: ratios of observed to profiled latency applied to the performance model.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Correction {
    /// Apply the correction factors (`model: upstream` only: the queueing model learns its
    /// margins from forecast errors and observed latencies instead). Disable when the profile is
    /// known to match production.
    #[serde(default = "default_true")]
    pub enabled: bool,
}

fn default_true() -> bool {
    true
}

impl Default for Correction {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// Profiling data of the deployed model: exactly one of `builtin` or `configMapRef`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("has(self.builtin) != has(self.configMapRef)")
    .message("spec.profile must set exactly one of builtin or configMapRef"))]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    /// A profile shipped with the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builtin: Option<BuiltinProfile>,
    /// A ConfigMap in the policy's namespace with `prefill_raw_data.json` and
    /// `decode_raw_data.json` (upstream JSON layout), or the two upstream NPZ files as
    /// `binaryData` (`prefill_raw_data.npz`, `decode_raw_data.npz`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<LocalObjectRef>,
}

/// Profiles compiled into the operator, measured by upstream Dynamo on real hardware.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuiltinProfile {
    /// Llama-3.1-8B-Instruct FP8 on H200 SXM, vLLM, TP1 prefill and decode.
    #[serde(rename = "h200-llama3.1-8b-tp1")]
    H200Llama31_8bTp1,
    /// Llama-3.3-70B-Instruct FP8 on H100 SXM, vLLM, TP8.
    #[serde(rename = "h100-llama3.3-70b-tp8")]
    H100Llama33_70bTp8,
    /// Llama-3.3-70B-Instruct FP8 on H100 SXM, vLLM, TP4.
    #[serde(rename = "h100-llama3.3-70b-tp4")]
    H100Llama33_70bTp4,
    /// Llama-3.3-70B-Instruct FP8 on H100 SXM, vLLM, TP2.
    #[serde(rename = "h100-llama3.3-70b-tp2")]
    H100Llama33_70bTp2,
}

impl BuiltinProfile {
    /// The name used in the spec and as the folder under `config/profiles/`.
    pub fn name(self) -> &'static str {
        match self {
            Self::H200Llama31_8bTp1 => BUILTIN_PROFILES[0],
            Self::H100Llama33_70bTp8 => BUILTIN_PROFILES[1],
            Self::H100Llama33_70bTp4 => BUILTIN_PROFILES[2],
            Self::H100Llama33_70bTp2 => BUILTIN_PROFILES[3],
        }
    }
}

/// Reference to an object in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectRef {
    /// Name of the object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Where the planner reads the frontend metrics.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MetricsSource {
    /// Prometheus server.
    #[serde(default)]
    pub prometheus: PrometheusSource,
    /// Model name in the frontend metrics' `model` label (compared lower-cased). Default: the
    /// `--served-model-name` (else `--model`) argument of the DGD's workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub model_name: Option<String>,
    /// Dynamo namespace in the metrics' `dynamo_namespace` label. Default
    /// `<namespace>-<dgd name>`, as the Dynamo operator sets it; another needs the cluster
    /// admin's allowance (the operator's `--allowed-dynamo-namespaces`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub dynamo_namespace: Option<String>,
}

/// A Prometheus server.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusSource {
    /// Base URL of the Prometheus HTTP API, e.g. `http://prometheus.monitoring:9090`. Default:
    /// the operator's `--prometheus-url` (set by the Helm chart). The cluster admin may limit
    /// the URLs policies can name (`--prometheus-url-policy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://[^\s]+$"))]
    pub url: Option<String>,
    /// A Secret in the policy's namespace whose key holds a bearer token sent to Prometheus
    /// (`Authorization: Bearer`), read every interval so a rotated token is picked up. Needs the
    /// cluster admin to let the operator read Secrets (`--prometheus-token-secrets`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_secret: Option<SecretKeyRef>,
}

/// A key of a Secret in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key in the Secret's data.
    #[serde(default = "default_token_key")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

fn default_token_key() -> String {
    "token".into()
}

/// How decisions reach the deployment.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("self.type != 'virtual' || (has(self.etcd) && self.etcd.endpoints.size() > 0)")
    .message("spec.connector.etcd.endpoints is required when spec.connector.type is virtual")
    .field_path(".etcd"))]
#[x_kube(validation = Rule::new("self.type == 'virtual' || (!has(self.etcd) && !has(self.dynamoNamespace))")
    .message("spec.connector.etcd and spec.connector.dynamoNamespace are only allowed when spec.connector.type is virtual"))]
#[serde(rename_all = "camelCase")]
pub struct Connector {
    /// `kubernetes` sets the replicas of the DGD's components; `virtual` publishes each decision
    /// in etcd for an external actor (the Dynamo virtual-connector protocol).
    #[serde(default, rename = "type")]
    pub kind: ConnectorKind,
    /// etcd the `virtual` connector writes decisions to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdSource>,
    /// Dynamo namespace the decision keys live under (`v1/<dynamoNamespace>/planner/...`).
    /// Default: `spec.metrics.dynamoNamespace`, else `<namespace>-<dgd name>`; another needs the
    /// cluster admin's allowance (the operator's `--allowed-dynamo-namespaces`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub dynamo_namespace: Option<String>,
    /// How long the `virtual` connector waits for the external actor to acknowledge a decision
    /// (`scaled_decision_id`) before publishing a new one anyway.
    #[serde(default = "default_decision_timeout")]
    #[schemars(regex(pattern = limits::DURATION_PATTERN))]
    #[x_kube(validation = limits::duration_rule("spec.connector.decisionTimeout", limits::DECISION_TIMEOUT))]
    pub decision_timeout: String,
}

fn default_decision_timeout() -> String {
    "1800s".into()
}

impl Default for Connector {
    fn default() -> Self {
        Self {
            kind: ConnectorKind::default(),
            etcd: None,
            dynamo_namespace: None,
            decision_timeout: default_decision_timeout(),
        }
    }
}

/// Which connector carries decisions out.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum ConnectorKind {
    /// Set `spec.components[].replicas` of the target DGD.
    #[default]
    Kubernetes,
    /// Publish decisions in etcd.
    Virtual,
}

/// etcd endpoints.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSource {
    /// etcd client URLs, e.g. `http://etcd.dynamo:2379`.
    #[schemars(
        length(min = 1, max = 16),
        inner(regex(pattern = r"^(https?://)?[^\s/]+(:[0-9]+)?/?$"))
    )]
    pub endpoints: Vec<String>,
}

/// Thresholds of the load-based planner. A pool grows by one replica when its load is above the
/// scale-up threshold and shrinks by one when below the scale-down threshold.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("self.decodeKvScaleDownThreshold < self.decodeKvScaleUpThreshold")
    .message("spec.load.decodeKvScaleDownThreshold must be less than spec.load.decodeKvScaleUpThreshold"))]
#[x_kube(validation = Rule::new("self.prefillQueueScaleDownThreshold < self.prefillQueueScaleUpThreshold")
    .message("spec.load.prefillQueueScaleDownThreshold must be less than spec.load.prefillQueueScaleUpThreshold"))]
#[serde(rename_all = "camelCase")]
pub struct LoadThresholds {
    /// How often the load metrics are sampled within an interval.
    #[serde(default = "default_metric_pulling_interval")]
    #[schemars(regex(pattern = limits::DURATION_PATTERN))]
    #[x_kube(validation = limits::duration_rule("spec.load.metricPullingInterval", limits::METRIC_PULLING_INTERVAL))]
    pub metric_pulling_interval: String,
    /// Mean KV-cache usage of decode workers (0 to 1) above which decode scales up.
    #[serde(default = "default_kv_up")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub decode_kv_scale_up_threshold: f64,
    /// Mean KV-cache usage of decode workers (0 to 1) below which decode scales down.
    #[serde(default = "default_kv_down")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub decode_kv_scale_down_threshold: f64,
    /// Queued prefill requests per prefill worker above which prefill scales up.
    #[serde(default = "default_queue_up")]
    #[schemars(range(min = 0.0))]
    pub prefill_queue_scale_up_threshold: f64,
    /// Queued prefill requests per prefill worker below which prefill scales down.
    #[serde(default = "default_queue_down")]
    #[schemars(range(min = 0.0))]
    pub prefill_queue_scale_down_threshold: f64,
    /// Intervals after a decode scale-up during which decode is not scaled down, while the new
    /// worker fills its KV cache.
    #[serde(default = "default_grace")]
    #[schemars(range(min = 0, max = 100))]
    pub decode_grace_period_intervals: i32,
    /// Intervals ahead over which the prefill queue trend is extrapolated: prefill does not scale
    /// up when the queue is on course to fall below the scale-up threshold within them.
    #[serde(default = "default_grace")]
    #[schemars(range(min = 0, max = 100))]
    pub prefill_queue_buffer_intervals: i32,
}

fn default_metric_pulling_interval() -> String {
    "1s".into()
}

fn default_kv_up() -> f64 {
    0.9
}

fn default_kv_down() -> f64 {
    0.5
}

fn default_queue_up() -> f64 {
    0.5
}

fn default_queue_down() -> f64 {
    0.2
}

fn default_grace() -> i32 {
    3
}

impl Default for LoadThresholds {
    fn default() -> Self {
        Self {
            metric_pulling_interval: default_metric_pulling_interval(),
            decode_kv_scale_up_threshold: default_kv_up(),
            decode_kv_scale_down_threshold: default_kv_down(),
            prefill_queue_scale_up_threshold: default_queue_up(),
            prefill_queue_scale_down_threshold: default_queue_down(),
            decode_grace_period_intervals: default_grace(),
            prefill_queue_buffer_intervals: default_grace(),
        }
    }
}

/// What the planner last saw and decided.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PlannerPolicyStatus {
    /// `metadata.generation` of the spec this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `TargetResolved`, `ProfileLoaded`, `MetricsAvailable` and `ScalingLimited`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
    /// When the last planner interval ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_tick_time: Option<Time>,
    /// Load and latency observed over the last interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<ObservedLoad>,
    /// Load predicted for the next interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted: Option<PredictedLoad>,
    /// Correction factors applied to the profiled latencies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correction: Option<CorrectionFactors>,
    /// Replicas of the last decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<PoolReplicas>,
    /// Replicas the pools had when the last decision was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<PoolReplicas>,
    /// Increasing id of the last decision (the `virtual` connector publishes it to etcd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_id: Option<i64>,
    /// When replicas were last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// One line on why the last decision is what it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// With `spec.budgetRef`: what the shared GPU budget granted at the last decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetGrant>,
    /// The last decision: which check made it, what the model expects of its replicas, the
    /// scale-up delay it planned with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision: Option<LastDecision>,
    /// The intervals of the last hour whose load met the SLA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sla_attainment: Option<SlaAttainment>,
    /// What `kubectl get plannerpolicies` shows, preformatted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<PolicySummary>,
    /// The target graph's KV-transfer topology as last read: its
    /// `spec.experimental.kvTransferPolicy`, or a frontend's `kvCacheTransferTopology` in that
    /// shape. Reported only; the planner renders nothing from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_transfer: Option<KvTransferStatus>,
}

/// A PlannerPolicy's last decision.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LastDecision {
    /// `interval` (an adjustment interval), `fast` (a check between intervals) or `grant` (a
    /// shared budget's grant changed).
    pub check: String,
    /// When it was made.
    pub time: Option<Time>,
    /// Prefill replicas it decided (an aggregated graph's workers).
    pub prefill: i32,
    /// Decode replicas it decided (an aggregated graph's workers).
    pub decode: i32,
    /// The time to first token (ms) the queueing model expects of those replicas, for the load
    /// it planned for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_ttft_ms: Option<f64>,
    /// The inter-token latency (ms) the queueing model expects of those replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_itl_ms: Option<f64>,
    /// The scale-up delay it planned with, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up_delay_seconds: Option<f64>,
    /// Where that delay comes from: `set` (`behavior.scaleUpDelay`), `measured` (on the target),
    /// `expected` (`behavior.expectedScaleUpDelay`, until one is measured) or `assumed` (60 s,
    /// nothing else known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up_delay_source: Option<String>,
}

/// How many of the last hour's intervals met the SLA: their load's TTFT (at the percentile the
/// policy targets, else the mean) and mean ITL within the targets. Intervals without traffic
/// do not count.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SlaAttainment {
    /// Intervals with traffic in the last hour.
    pub intervals: i32,
    /// Of those, the ones that met the SLA.
    pub met: i32,
}

/// What `kubectl get plannerpolicies` shows, preformatted (a printer column cannot compute).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PolicySummary {
    /// Prefill replicas serving / of the last decision, e.g. `3/4`.
    pub prefill: String,
    /// Decode replicas serving / of the last decision.
    pub decode: String,
    /// Observed TTFT / target in ms, e.g. `312/500ms`, or `p90 845/1000ms` with a percentile
    /// target; `-` before an interval with traffic.
    pub ttft: String,
    /// Observed mean ITL / target in ms.
    pub itl: String,
    /// Share of the last hour's intervals that met the SLA, e.g. `92%`; `-` before one.
    pub sla: String,
    /// What limited the last decision (`ScalingLimited`'s reason), `-` when nothing.
    pub limited: String,
}

/// Where a graph keeps its KV-cache transfers, in the shape of NVIDIA's `kvTransferPolicy`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KvTransferStatus {
    /// The topology domain transfers stay in, e.g. `zone`.
    pub domain: String,
    /// `required` or `preferred`.
    pub enforcement: Enforcement,
    /// The node label that holds a worker's domain, when the graph names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_key: Option<String>,
    /// The Grove ClusterTopologyBinding (or ClusterTopology) whose levels hold the domain, when
    /// the graph names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_topology_name: Option<String>,
    /// The weight of the same-domain preference, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_weight: Option<f64>,
    /// The field of the graph it was read from.
    pub field: String,
}

/// Frontend metrics averaged over one interval.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObservedLoad {
    /// Requests in the interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<f64>,
    /// Mean input sequence length, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isl: Option<f64>,
    /// Mean output sequence length, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub osl: Option<f64>,
    /// Mean time to first token, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// Mean inter-token latency, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_ms: Option<f64>,
    /// Time to first token at the percentile `spec.sla.ttftPercentile` names (the 90th when it
    /// names none), in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_percentile_ms: Option<f64>,
    /// The percentile of `ttftPercentileMs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_percentile: Option<f64>,
    /// Mean KV-cache usage of the decode workers (0 to 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_kv_usage: Option<f64>,
    /// Where `decodeKvUsage` comes from: `engines` (the decode engines' own gauge) or `router`
    /// (the KV router's estimate, read only when no engine exports one: it counts prompt blocks
    /// only, so the planner does not learn from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_kv_usage_source: Option<KvUsageSource>,
    /// Mean prefill requests waiting for a prefill engine over the interval, all engines
    /// together (`mode: load`, which scales prefill on it per engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_queue: Option<f64>,
}

/// Where a decode KV-cache usage comes from.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum KvUsageSource {
    /// The decode engines' gauge (`dynamo_component_gpu_cache_usage_percent`,
    /// `vllm:kv_cache_usage_perc`).
    Engines,
    /// The KV router's estimate (`dynamo_frontend_worker_active_decode_blocks` over
    /// `dynamo_frontend_model_total_kv_blocks`): prompt blocks only, a lower bound.
    Router,
}

impl KvUsageSource {
    /// The name used in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Engines => "engines",
            Self::Router => "router",
        }
    }
}

/// Load predicted for the next interval.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PredictedLoad {
    /// Requests in the next interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<f64>,
    /// Mean input sequence length, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isl: Option<f64>,
    /// Mean output sequence length, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub osl: Option<f64>,
}

/// Observed-to-profiled latency ratios.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CorrectionFactors {
    /// Observed TTFT divided by the profiled TTFT at the observed input length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<f64>,
    /// Observed ITL divided by the profiled ITL at the observed concurrency and context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<f64>,
}

/// Replica counts of the two pools.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PoolReplicas {
    /// Prefill replicas.
    pub prefill: i32,
    /// Decode replicas.
    pub decode: i32,
    /// Replicas of an aggregated graph's one worker pool, which is both pools (prefill and
    /// decode then say the same); absent for disaggregated graphs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<i32>,
}

//! Why a PlannerPolicy is not valid ([`PolicyError`]), and why it cannot join the GpuBudget it
//! names ([`BudgetError`]). Each message names the field, the value and what is allowed.

use planner_api::PlannerMode;

use super::pools::Pool;
use crate::target::GPU_RESOURCE;

/// Why a PlannerPolicy is not valid. Each message names the field, the value and what is
/// allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The target DGD does not exist in the policy's namespace.
    #[error(
        "spec.targetRef.name: DynamoGraphDeployment {name:?} not found in namespace {namespace:?}; allowed: the name of a DynamoGraphDeployment in the policy's namespace (create it first)"
    )]
    TargetNotFound {
        /// The DGD name.
        name: String,
        /// The policy's namespace.
        namespace: String,
    },
    /// The target exists but cannot be read as a DGD of either served version.
    #[error(
        "spec.targetRef.name: DynamoGraphDeployment {name:?} cannot be read as nvidia.com/v1beta1 or v1alpha1: {error}"
    )]
    TargetUnreadable {
        /// The DGD name.
        name: String,
        /// What is wrong with it.
        error: String,
    },
    /// A named pool component is not in the DGD.
    #[error(
        "spec.components.{pool}: {name:?} is not a component of DynamoGraphDeployment {dgd:?}; allowed: {available}"
    )]
    ComponentNotFound {
        /// Which pool.
        pool: Pool,
        /// The value.
        name: String,
        /// The DGD name.
        dgd: String,
        /// The DGD's component names.
        available: String,
    },
    /// A named pool component has a type that cannot be that pool.
    #[error(
        "spec.components.{pool}: component {name:?} of DynamoGraphDeployment {dgd:?} has type {kind}; allowed: a component with type {pool}, worker or no type"
    )]
    ComponentWrongType {
        /// Which pool.
        pool: Pool,
        /// The value.
        name: String,
        /// The DGD name.
        dgd: String,
        /// The component's type.
        kind: String,
    },
    /// No component name given and no component has the pool's type.
    #[error(
        "spec.components.{pool}: not set, and DynamoGraphDeployment {dgd:?} has no component with type: {pool} (components: {available}); set spec.components.{pool} to the {pool} component's name"
    )]
    NoComponentOfType {
        /// Which pool.
        pool: Pool,
        /// The DGD name.
        dgd: String,
        /// The DGD's components as `name (type)`.
        available: String,
    },
    /// No component name given and several components have the pool's type.
    #[error(
        "spec.components.{pool}: not set, and DynamoGraphDeployment {dgd:?} has {count} components with type: {pool} ({names}); set spec.components.{pool} to one of them"
    )]
    SeveralComponentsOfType {
        /// Which pool.
        pool: Pool,
        /// The DGD name.
        dgd: String,
        /// How many.
        count: usize,
        /// Their names.
        names: String,
    },
    /// An aggregated graph with a setting that works on two pools.
    #[error(
        "{field}: {value} {why}, and component {name:?} of DynamoGraphDeployment {dgd:?} is one aggregated worker pool; allowed: {allowed}"
    )]
    AggregatedUnsupported {
        /// The field.
        field: &'static str,
        /// Its value.
        value: &'static str,
        /// What it does with two pools.
        why: &'static str,
        /// What an aggregated graph allows.
        allowed: &'static str,
        /// The aggregated component.
        name: String,
        /// The DGD name.
        dgd: String,
    },
    /// `profile.builtin` names no compiled-in profile.
    #[error("spec.profile.builtin: {name:?} is not a built-in profile; allowed: {allowed}")]
    UnknownBuiltinProfile {
        /// The value.
        name: String,
        /// The built-in names.
        allowed: String,
    },
    /// A duration field cannot be parsed.
    #[error(
        "{field}: {value:?} is not a duration; allowed: one or more <number><unit> terms with units ns, us, ms, s, m or h, e.g. 180s or 1m30s"
    )]
    DurationFormat {
        /// The field.
        field: &'static str,
        /// The value.
        value: String,
    },
    /// `adjustmentInterval` is outside the mode's bounds.
    #[error("spec.adjustmentInterval: {value:?} is out of range for mode {mode}; allowed: {min} to {max}")]
    IntervalOutOfRange {
        /// The mode.
        mode: PlannerMode,
        /// The value.
        value: String,
        /// The minimum, formatted.
        min: String,
        /// The maximum, formatted.
        max: String,
    },
    /// `load.metricPullingInterval` is outside its bounds or too long for the interval.
    #[error(
        "spec.load.metricPullingInterval: {value:?} is out of range for spec.adjustmentInterval {interval}; allowed: {min} to {max} (at most half the interval, so that each interval averages at least two samples)"
    )]
    PullingIntervalOutOfRange {
        /// The value.
        value: String,
        /// The adjustment interval, formatted.
        interval: String,
        /// The minimum, formatted.
        min: String,
        /// The maximum, formatted.
        max: String,
    },
    /// The virtual connector has no etcd endpoints.
    #[error(
        "spec.connector.etcd.endpoints: none given; the virtual connector needs at least one etcd client URL, e.g. http://etcd.dynamo:2379"
    )]
    EtcdEndpointsMissing,
    /// An etcd endpoint is not a client URL.
    #[error(
        "spec.connector.etcd.endpoints[{index}]: {value:?} is not an etcd client URL; allowed: [http://|https://]host[:port] with a port from 1 to 65535"
    )]
    EtcdEndpointInvalid {
        /// Position in the list.
        index: usize,
        /// The value.
        value: String,
    },
    /// `connector.decisionTimeout` is outside its bounds.
    #[error("spec.connector.decisionTimeout: {value:?} is out of range; allowed: {min} to {max}")]
    DecisionTimeoutOutOfRange {
        /// The value.
        value: String,
        /// The minimum, formatted.
        min: String,
        /// The maximum, formatted.
        max: String,
    },
    /// A `spec.behavior` duration is outside its bounds.
    #[error("{field}: {value:?} is out of range; allowed: {allowed}")]
    BehaviorOutOfRange {
        /// The field.
        field: &'static str,
        /// The value.
        value: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// A pool component's GPU count is not a positive whole number.
    #[error(
        "spec.components.{pool}: component {component:?} asks for {value:?} {GPU_RESOURCE} in its main container; allowed: a whole number of GPUs, 1 or more"
    )]
    BadGpuCount {
        /// Which pool.
        pool: Pool,
        /// The component.
        component: String,
        /// The value.
        value: String,
    },
    /// A Dynamo namespace other than the target graph's, which the cluster admin has not allowed
    /// for this namespace.
    #[error(
        "{field}: {value:?} is not the Dynamo namespace of DynamoGraphDeployment {dgd:?}; allowed: {own:?} (its own, the default), or a Dynamo namespace the cluster admin allows for namespace {namespace:?} (operator flag --allowed-dynamo-namespaces, chart value tenancy.allowedDynamoNamespaces)"
    )]
    DynamoNamespaceNotAllowed {
        /// The field.
        field: &'static str,
        /// The value.
        value: String,
        /// The target DGD.
        dgd: String,
        /// The graph's own Dynamo namespace.
        own: String,
        /// The policy's namespace.
        namespace: String,
    },
    /// A Prometheus URL the cluster admin has not allowed.
    #[error("spec.metrics.prometheus.url: {value:?} is not allowed by the cluster admin; allowed: {allowed}")]
    PrometheusUrlNotAllowed {
        /// The value, with credentials redacted.
        value: String,
        /// What is allowed.
        allowed: String,
    },
    /// A bearer token Secret, while the operator may not read Secrets.
    #[error(
        "spec.metrics.prometheus.bearerTokenSecret: this operator does not read Secrets; allowed: no bearerTokenSecret, or ask the cluster admin to enable it (operator flag --prometheus-token-secrets, chart value tenancy.prometheusTokenSecrets)"
    )]
    TokenSecretsOff,
    /// An etcd endpoint the cluster admin has not allowed.
    #[error(
        "spec.connector.etcd.endpoints[{index}]: {value:?} is not allowed by the cluster admin; allowed: {allowed}"
    )]
    EtcdEndpointNotAllowed {
        /// Position in the list.
        index: usize,
        /// The value.
        value: String,
        /// The allowed endpoints.
        allowed: String,
    },
    /// The GPU budget cannot hold the minimum replicas of both pools, and scaling to zero is
    /// not allowed: the planner could never act.
    #[error(
        "spec.bounds.maxGpuBudget: {budget} GPUs cannot hold the minimum replicas of both pools ({min_prefill} x {prefill_gpus} GPUs of {prefill:?} + {min_decode} x {decode_gpus} GPUs of {decode:?} = {needed}); allowed: at least {needed}, -1 (no budget), or spec.bounds.allowScaleToZero: true to let the planner scale both pools to zero"
    )]
    BudgetBelowMinimum {
        /// The budget.
        budget: i32,
        /// The prefill pool's minimum replicas.
        min_prefill: u32,
        /// The decode pool's minimum replicas.
        min_decode: u32,
        /// The prefill component.
        prefill: String,
        /// GPUs per prefill replica.
        prefill_gpus: u32,
        /// The decode component.
        decode: String,
        /// GPUs per decode replica.
        decode_gpus: u32,
        /// GPUs the minimums need.
        needed: u64,
    },
    /// A pool's own bounds leave no room: its maximum is below its minimum.
    #[error(
        "spec.bounds.{pool}: maxReplicas {max} (spec.bounds.{pool}.maxReplicas, else spec.bounds.maxReplicas, else 512) is below minReplicas {min} (spec.bounds.{pool}.minReplicas, else spec.bounds.minReplicas); allowed: a maximum at least the minimum"
    )]
    PoolBoundsInverted {
        /// The pool.
        pool: Pool,
        /// Its minimum.
        min: i32,
        /// Its maximum.
        max: i32,
    },
    /// A ratio bound whose minimum is above its maximum.
    #[error(
        "spec.bounds.prefillToDecodeRatio: min {min} is above max {max}; allowed: spec.bounds.prefillToDecodeRatio.min at most spec.bounds.prefillToDecodeRatio.max, both greater than 0"
    )]
    RatioInverted {
        /// The minimum, as written.
        min: String,
        /// The maximum, as written.
        max: String,
    },
    /// A ratio bound on an aggregated graph, whose one pool is both.
    #[error(
        "spec.bounds.prefillToDecodeRatio: DynamoGraphDeployment {dgd:?} is aggregated (component {component:?} serves prefill and decode), so it has no ratio to bound; allowed: no spec.bounds.prefillToDecodeRatio"
    )]
    RatioOnAggregated {
        /// The aggregated component.
        component: String,
        /// The DGD.
        dgd: String,
    },
    /// Per-pool bounds on an aggregated graph, whose one pool is both.
    #[error(
        "spec.bounds.{pool}: DynamoGraphDeployment {dgd:?} is aggregated (component {component:?} serves prefill and decode); allowed: no spec.bounds.prefill or spec.bounds.decode, set spec.bounds.minReplicas and spec.bounds.maxReplicas for its one pool"
    )]
    PoolBoundsOnAggregated {
        /// The pool whose bounds are set.
        pool: Pool,
        /// The aggregated component.
        component: String,
        /// The DGD.
        dgd: String,
    },
    /// `spec.budgetRef` names a budget the policy cannot join.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// The target runs upstream Dynamo's own planner, which scales the same pools.
    #[error(
        "spec.targetRef.name: DynamoGraphDeployment {dgd:?} runs upstream Dynamo's planner ({components}), which sets the same pools' replicas, so two planners would overwrite each other; hand the graph over by removing that component from the DynamoGraphDeployment or scaling it to zero replicas ({fields}: 0), or set spec.mode: observe"
    )]
    UpstreamPlannerRunning {
        /// The DGD name.
        dgd: String,
        /// The planner components, as `component "name" (type planner, N replicas)`.
        components: String,
        /// The fields that scale them to zero.
        fields: String,
    },
    /// The metrics cannot be filtered by model: no model name anywhere.
    #[error(
        "spec.metrics.modelName: not set, and the main container of component {component:?} has no --served-model-name or --model argument; set spec.metrics.modelName to the model name the frontend reports"
    )]
    NoModelName {
        /// The component searched.
        component: String,
    },
}

impl PolicyError {
    /// The CamelCase reason of the condition that reports this error.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TargetNotFound { .. } => "TargetNotFound",
            Self::TargetUnreadable { .. } => "TargetUnreadable",
            Self::UpstreamPlannerRunning { .. } => "UpstreamPlannerRunning",
            Self::ComponentNotFound { .. }
            | Self::ComponentWrongType { .. }
            | Self::NoComponentOfType { .. }
            | Self::SeveralComponentsOfType { .. }
            | Self::AggregatedUnsupported { .. }
            | Self::BadGpuCount { .. }
            | Self::NoModelName { .. } => "ComponentsUnresolved",
            Self::UnknownBuiltinProfile { .. }
            | Self::DurationFormat { .. }
            | Self::IntervalOutOfRange { .. }
            | Self::PullingIntervalOutOfRange { .. }
            | Self::EtcdEndpointsMissing
            | Self::EtcdEndpointInvalid { .. }
            | Self::DecisionTimeoutOutOfRange { .. }
            | Self::BehaviorOutOfRange { .. }
            | Self::PoolBoundsInverted { .. }
            | Self::PoolBoundsOnAggregated { .. }
            | Self::RatioInverted { .. }
            | Self::RatioOnAggregated { .. }
            | Self::BudgetBelowMinimum { .. } => "InvalidSpec",
            Self::DynamoNamespaceNotAllowed { .. }
            | Self::PrometheusUrlNotAllowed { .. }
            | Self::TokenSecretsOff
            | Self::EtcdEndpointNotAllowed { .. } => "NotPermitted",
            Self::Budget(error) => error.reason(),
        }
    }

    /// Whether the error is about the target DGD (and so belongs in `TargetResolved`) rather
    /// than about the policy's own fields.
    pub fn is_about_target(&self) -> bool {
        matches!(
            self.reason(),
            "TargetNotFound" | "TargetUnreadable" | "ComponentsUnresolved" | "UpstreamPlannerRunning"
        )
    }
}

/// Every error of a list on one line, as the webhook denies and the status reports them.
pub fn describe(errors: &[PolicyError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why a policy cannot join the budget it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// No GpuBudget of that name.
    #[error(
        "spec.budgetRef.name: GpuBudget {name:?} not found; allowed: the name of a GpuBudget (cluster-scoped, created by the cluster admin), or no spec.budgetRef"
    )]
    NotFound {
        /// The name.
        name: String,
    },
    /// The budget could not be read.
    #[error("spec.budgetRef.name: cannot read GpuBudget {name:?}: {error}")]
    Unreadable {
        /// The name.
        name: String,
        /// Why.
        error: String,
    },
    /// No entry of the budget's `spec.members` names the policy.
    #[error(
        "spec.budgetRef.name: GpuBudget {name:?} does not admit PlannerPolicy {namespace}/{policy} (its spec.members name {entries}); allowed: a GpuBudget whose spec.members names namespace {namespace:?}, this policy, or \"*\" (ask the cluster admin)"
    )]
    NotAdmitted {
        /// The budget.
        name: String,
        /// The policy's namespace.
        namespace: String,
        /// The policy's name.
        policy: String,
        /// The entries, shortened.
        entries: String,
    },
    /// `mode: observe` never scales, so it has nothing to share.
    #[error(
        "spec.budgetRef: mode observe never scales, so it cannot share a GPU budget; allowed: mode sla or load with spec.budgetRef, or no spec.budgetRef"
    )]
    ObserveMode,
    /// The policy's floor alone is more than the budget's total.
    #[error(
        "spec.budgetRef.name: the floor of this policy, the minimum replicas of {pools} = {floor} GPUs), is more than GpuBudget {name:?}'s total of {total} GPUs; allowed: a budget of at least {floor} GPUs, or lower minimums (spec.bounds.minReplicas, spec.bounds.prefill.minReplicas, spec.bounds.decode.minReplicas)"
    )]
    FloorAboveTotal {
        /// The budget.
        name: String,
        /// Its total.
        total: i64,
        /// The pools and their GPUs, e.g. `both pools (2 x 4 GPUs of "prefill" + 2 x 4 GPUs of
        /// "decode"`.
        pools: String,
        /// GPUs of the floor.
        floor: u64,
    },
}

impl BudgetError {
    /// The CamelCase reason of the condition that reports this error.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "BudgetNotFound",
            Self::Unreadable { .. } => "BudgetUnreadable",
            Self::NotAdmitted { .. } => "NotPermitted",
            Self::ObserveMode | Self::FloorAboveTotal { .. } => "InvalidSpec",
        }
    }
}

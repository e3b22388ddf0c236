//! PlannerPolicy rules, the ones the CRD schema also checks (with the same limits, from
//! [`planner_api::limits`], where their reasons are written) and the ones it cannot express:
//! the target graph's pools, GPUs and model name, the GPU budget against the pools' minimums,
//! built-in profile names, what the cluster admin allows.

use std::time::Duration;

use planner_api::{
    BUILTIN_PROFILES, ComponentType, ConnectorKind, PlannerMode, PlannerPolicySpec, SlaModel,
    duration::{format_duration, parse_duration},
    labels::dynamo_namespace,
    limits::{self, DurationRange},
};

use planner_core::profile::builtin_names;

use super::{
    error::PolicyError,
    pools::{Pool, PoolTarget, TargetPools},
    tenancy::{self, Tenancy},
};
pub use crate::target::GPU_RESOURCE;
use crate::target::{ShapeError, TargetGraph};

/// The `adjustmentInterval` bounds of a mode.
pub fn interval_bounds(mode: PlannerMode) -> DurationRange {
    match mode {
        PlannerMode::Sla | PlannerMode::Observe => limits::ADJUSTMENT_INTERVAL,
        PlannerMode::Load => limits::ADJUSTMENT_INTERVAL_LOAD,
    }
}

/// The DGD components of the two pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedPools {
    /// Name of the prefill component.
    pub prefill: String,
    /// Name of the decode component.
    pub decode: String,
    /// One aggregated worker component is both pools (`prefill == decode`).
    pub aggregated: bool,
}

/// Every rule that needs no lookup: profile, durations, connector. Returns all violations.
pub fn validate_spec(spec: &PlannerPolicySpec) -> Vec<PolicyError> {
    let mut errors = Vec::new();
    if let Some(builtin) = spec.profile.as_ref().and_then(|p| p.builtin) {
        check_builtin(builtin.name(), &mut errors);
    }
    let interval = match parse_duration(&spec.adjustment_interval) {
        Ok(interval) => {
            let bounds = interval_bounds(spec.mode);
            if !bounds.contains(interval) {
                errors.push(PolicyError::IntervalOutOfRange {
                    mode: spec.mode,
                    value: spec.adjustment_interval.clone(),
                    min: format_duration(bounds.min),
                    max: format_duration(bounds.max),
                });
            }
            Some(interval)
        }
        Err(_) => {
            errors.push(PolicyError::DurationFormat {
                field: "spec.adjustmentInterval",
                value: spec.adjustment_interval.clone(),
            });
            None
        }
    };
    check_pulling_interval(spec, interval, &mut errors);
    check_connector(spec, &mut errors);
    check_bounds(spec, &mut errors);
    check_behavior(spec, &mut errors);
    errors
}

/// `load.metricPullingInterval`: its own range in every mode (the schema checks it wherever it
/// is written), and at most half the interval in `load` mode, the one that samples.
fn check_pulling_interval(
    spec: &PlannerPolicySpec,
    interval: Option<Duration>,
    errors: &mut Vec<PolicyError>,
) {
    let range = limits::METRIC_PULLING_INTERVAL;
    match parse_duration(&spec.load.metric_pulling_interval) {
        Ok(pulling) => {
            let max = match interval {
                Some(interval) if spec.mode == PlannerMode::Load => (interval / 2).min(range.max),
                _ => range.max,
            };
            if pulling < range.min || pulling > max {
                errors.push(PolicyError::PullingIntervalOutOfRange {
                    value: spec.load.metric_pulling_interval.clone(),
                    interval: interval.map_or_else(|| spec.adjustment_interval.clone(), format_duration),
                    min: format_duration(range.min),
                    max: format_duration(max),
                });
            }
        }
        Err(_) => errors.push(PolicyError::DurationFormat {
            field: "spec.load.metricPullingInterval",
            value: spec.load.metric_pulling_interval.clone(),
        }),
    }
}

/// The connector: a virtual one's etcd endpoints, and the decision timeout wherever it is
/// written.
fn check_connector(spec: &PlannerPolicySpec, errors: &mut Vec<PolicyError>) {
    if spec.connector.kind == ConnectorKind::Virtual {
        let endpoints = spec
            .connector
            .etcd
            .as_ref()
            .map(|e| e.endpoints.as_slice())
            .unwrap_or_default();
        if endpoints.is_empty() {
            errors.push(PolicyError::EtcdEndpointsMissing);
        }
        for (index, endpoint) in endpoints.iter().enumerate() {
            if !is_etcd_endpoint(endpoint) {
                errors.push(PolicyError::EtcdEndpointInvalid {
                    index,
                    value: endpoint.clone(),
                });
            }
        }
    }
    let range = limits::DECISION_TIMEOUT;
    match parse_duration(&spec.connector.decision_timeout) {
        Ok(timeout) if range.contains(timeout) => {}
        Ok(_) => errors.push(PolicyError::DecisionTimeoutOutOfRange {
            value: spec.connector.decision_timeout.clone(),
            min: format_duration(range.min),
            max: format_duration(range.max),
        }),
        Err(_) => errors.push(PolicyError::DurationFormat {
            field: "spec.connector.decisionTimeout",
            value: spec.connector.decision_timeout.clone(),
        }),
    }
}

/// Each pool's maximum (its own, else the shared one, else [`limits::MAX_REPLICAS`]) at least
/// its minimum (its own, else the shared one).
fn check_bounds(spec: &PlannerPolicySpec, errors: &mut Vec<PolicyError>) {
    let bounds = &spec.bounds;
    for (pool, own, (min, max)) in [
        (Pool::Prefill, bounds.prefill, bounds.prefill_range()),
        (Pool::Decode, bounds.decode, bounds.decode_range()),
    ] {
        let max = max.unwrap_or(limits::MAX_REPLICAS);
        if own.is_some() && max < min {
            errors.push(PolicyError::PoolBoundsInverted { pool, min, max });
        }
    }
    if let Some(planner_api::RatioBounds {
        min: Some(min),
        max: Some(max),
    }) = bounds.prefill_to_decode_ratio
        && min > max
    {
        errors.push(PolicyError::RatioInverted {
            min: min.to_string(),
            max: max.to_string(),
        });
    }
}

fn check_behavior(spec: &PlannerPolicySpec, errors: &mut Vec<PolicyError>) {
    let behavior = &spec.behavior;
    let mut check = |field: &'static str, value: &str, ok: fn(Duration) -> bool, allowed: &'static str| {
        match parse_duration(value) {
            Ok(duration) if ok(duration) => {}
            Ok(_) => errors.push(PolicyError::BehaviorOutOfRange {
                field,
                value: value.to_string(),
                allowed,
            }),
            Err(_) => errors.push(PolicyError::DurationFormat {
                field,
                value: value.to_string(),
            }),
        }
    };
    if let Some(delay) = &behavior.scale_up_delay {
        check(
            "spec.behavior.scaleUpDelay",
            delay,
            |d| limits::BEHAVIOR_WINDOW.contains(d),
            "0s to 1h",
        );
    }
    if let Some(delay) = &behavior.expected_scale_up_delay {
        check(
            "spec.behavior.expectedScaleUpDelay",
            delay,
            |d| limits::BEHAVIOR_WINDOW.contains(d),
            "0s to 1h",
        );
    }
    check(
        "spec.behavior.scaleDownStabilization",
        &behavior.scale_down_stabilization,
        |d| limits::BEHAVIOR_WINDOW.contains(d),
        "0s to 1h",
    );
    check(
        "spec.behavior.fastCheckPeriod",
        &behavior.fast_check_period,
        |d| d.is_zero() || limits::FAST_CHECK_PERIOD.contains(d),
        "0s (off), or 5s to 5m",
    );
}

/// Checks a built-in profile name against the profiles compiled into the operator. Also used
/// on the raw object by the webhook, before the typed parse would reject an unknown name with a
/// less helpful message.
pub fn check_builtin(name: &str, errors: &mut Vec<PolicyError>) {
    if !builtin_names().any(|n| n == name) {
        errors.push(PolicyError::UnknownBuiltinProfile {
            name: name.into(),
            allowed: BUILTIN_PROFILES.join(", "),
        });
    }
}

/// `[http://|https://]host[:port][/]` with a non-empty host and a port from 1 to 65535.
fn is_etcd_endpoint(value: &str) -> bool {
    let rest = value
        .strip_prefix("http://")
        .or_else(|| value.strip_prefix("https://"))
        .unwrap_or(value);
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() || rest.contains(['/', ' ', '\t', '@', '?', '#']) {
        return false;
    }
    // A bracketed IPv6 address may contain colons.
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        match v6.split_once(']') {
            Some((host, tail)) => (host, tail.strip_prefix(':')),
            None => return false,
        }
    } else {
        match rest.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    !host.is_empty() && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
}

/// Resolves the prefill and decode components in the target DGD (either served version): by
/// name when given (the component must exist and have the pool's type, `worker` or none), else
/// the one component of the pool's type. A graph is aggregated when both pools resolve to the
/// same component, or when neither is named and the graph has no `type: prefill` or
/// `type: decode` component but exactly one `type: worker` (Dynamo's aggregated graphs): that
/// worker is both pools, planned as one. Returns all violations.
pub fn resolve_pools(
    spec: &PlannerPolicySpec,
    graph: &TargetGraph,
) -> Result<ResolvedPools, Vec<PolicyError>> {
    let dgd_name = graph.name.clone();
    let named = spec.components.as_ref();
    let unnamed = named.is_none_or(|c| c.prefill.is_none() && c.decode.is_none());
    let of_type = |kind: ComponentType| graph.components.iter().filter(move |c| c.kind == Some(kind));
    if unnamed
        && of_type(ComponentType::Prefill).next().is_none()
        && of_type(ComponentType::Decode).next().is_none()
        && let [worker] = of_type(ComponentType::Worker).collect::<Vec<_>>().as_slice()
    {
        return aggregated(spec, &dgd_name, &worker.name);
    }
    let mut errors = Vec::new();
    let mut resolve = |pool: Pool, name: Option<&String>| -> Option<String> {
        let components = &graph.components;
        match name {
            Some(name) => {
                let Some(component) = components.iter().find(|c| &c.name == name) else {
                    errors.push(PolicyError::ComponentNotFound {
                        pool,
                        name: name.clone(),
                        dgd: dgd_name.clone(),
                        available: components
                            .iter()
                            .map(|c| c.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    });
                    return None;
                };
                match component.kind {
                    None | Some(ComponentType::Worker) => Some(name.clone()),
                    Some(kind) if kind == pool.component_type() => Some(name.clone()),
                    Some(kind) => {
                        errors.push(PolicyError::ComponentWrongType {
                            pool,
                            name: name.clone(),
                            dgd: dgd_name.clone(),
                            kind: kind.to_string(),
                        });
                        None
                    }
                }
            }
            None => {
                let of_type: Vec<&str> = components
                    .iter()
                    .filter(|c| c.kind == Some(pool.component_type()))
                    .map(|c| c.name.as_str())
                    .collect();
                match of_type.as_slice() {
                    [one] => Some((*one).to_string()),
                    [] => {
                        errors.push(PolicyError::NoComponentOfType {
                            pool,
                            dgd: dgd_name.clone(),
                            available: components
                                .iter()
                                .map(|c| {
                                    format!(
                                        "{} ({})",
                                        c.name,
                                        c.kind.map_or("no type", ComponentType::as_str)
                                    )
                                })
                                .collect::<Vec<_>>()
                                .join(", "),
                        });
                        None
                    }
                    several => {
                        errors.push(PolicyError::SeveralComponentsOfType {
                            pool,
                            dgd: dgd_name.clone(),
                            count: several.len(),
                            names: several.join(", "),
                        });
                        None
                    }
                }
            }
        }
    };
    let prefill = resolve(Pool::Prefill, named.and_then(|c| c.prefill.as_ref()));
    let decode = resolve(Pool::Decode, named.and_then(|c| c.decode.as_ref()));
    match (prefill, decode) {
        (Some(prefill), Some(decode)) if prefill == decode => aggregated(spec, &dgd_name, &prefill),
        (Some(prefill), Some(decode)) => Ok(ResolvedPools {
            prefill,
            decode,
            aggregated: false,
        }),
        _ => Err(errors),
    }
}

/// One aggregated worker component as both pools. The virtual connector's protocol and
/// upstream's throughput formulas have two.
fn aggregated(spec: &PlannerPolicySpec, dgd: &str, name: &str) -> Result<ResolvedPools, Vec<PolicyError>> {
    let unsupported = |field, value, why, allowed| PolicyError::AggregatedUnsupported {
        field,
        value,
        why,
        allowed,
        name: name.to_string(),
        dgd: dgd.to_string(),
    };
    let mut errors = Vec::new();
    if spec.connector.kind == ConnectorKind::Virtual {
        errors.push(unsupported(
            "spec.connector.type",
            "virtual",
            "publishes prefill and decode replicas",
            "kubernetes",
        ));
    }
    if spec.mode == PlannerMode::Sla && spec.sla.model == SlaModel::Upstream {
        errors.push(unsupported(
            "spec.sla.model",
            "upstream",
            "sizes prefill and decode pools",
            "queueing",
        ));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(ResolvedPools {
        prefill: name.to_string(),
        decode: name.to_string(),
        aggregated: true,
    })
}

/// A policy checked against its target: everything the reconciler plans with, parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedPolicy {
    /// The pools and the model.
    pub target: TargetPools,
    /// The Dynamo namespace the frontend metrics carry.
    pub dynamo_namespace: String,
    /// `spec.adjustmentInterval`.
    pub interval: Duration,
    /// `spec.load.metricPullingInterval` (load mode).
    pub pulling_interval: Duration,
    /// `spec.connector.decisionTimeout` (virtual connector).
    pub decision_timeout: Duration,
    /// `spec.behavior.scaleUpDelay`, when set (else it is measured).
    pub scale_up_delay: Option<Duration>,
    /// `spec.behavior.expectedScaleUpDelay`, when set: the delay assumed until one is measured.
    pub expected_scale_up_delay: Option<Duration>,
    /// `spec.behavior.scaleDownStabilization`.
    pub stabilization: Duration,
    /// `spec.behavior.fastCheckPeriod` (zero: off).
    pub fast_check_period: Duration,
}

/// Resolves the pools of `graph` and checks what planning needs from them: GPUs per replica and,
/// outside load mode, the model name. Returns all violations.
pub fn validate_target(
    spec: &PlannerPolicySpec,
    graph: &TargetGraph,
) -> Result<TargetPools, Vec<PolicyError>> {
    let pools = resolve_pools(spec, graph)?;
    let mut errors = Vec::new();
    let mut pool = |pool: Pool, name: &str| -> PoolTarget {
        let component = graph.component(name);
        let gpus = match graph.gpus_per_replica(name).map(|(gpus, _)| gpus) {
            Some(Err(bad)) => {
                errors.push(PolicyError::BadGpuCount {
                    pool,
                    component: name.to_string(),
                    value: bad.quantity,
                });
                1
            }
            Some(Ok(gpus)) => gpus,
            None => 1,
        };
        PoolTarget {
            component: name.to_string(),
            gpus,
            replicas: component
                .and_then(|c| c.replicas)
                .map_or(1, |r| u32::try_from(r).unwrap_or(0)),
        }
    };
    let prefill = pool(Pool::Prefill, &pools.prefill);
    let decode = pool(Pool::Decode, &pools.decode);
    let shortfall = if pools.aggregated {
        budget_shortfall_aggregated(spec, &decode)
    } else {
        budget_shortfall(spec, &prefill, &decode)
    };
    if pools.aggregated {
        for (pool, own) in [
            (Pool::Prefill, spec.bounds.prefill),
            (Pool::Decode, spec.bounds.decode),
        ] {
            if own.is_some() {
                errors.push(PolicyError::PoolBoundsOnAggregated {
                    pool,
                    component: pools.decode.clone(),
                    dgd: graph.name.clone(),
                });
            }
        }
    }
    if let Some(needed) = shortfall
        && !spec.bounds.allow_scale_to_zero
    {
        let (min_prefill, min_decode) = min_replicas(spec);
        errors.push(PolicyError::BudgetBelowMinimum {
            budget: spec.bounds.max_gpu_budget,
            min_prefill,
            min_decode,
            prefill: prefill.component.clone(),
            prefill_gpus: prefill.gpus,
            decode: decode.component.clone(),
            decode_gpus: decode.gpus,
            needed,
        });
    }
    let model_name = if spec.mode == PlannerMode::Load {
        None
    } else {
        match model_name(spec, graph, &pools.decode) {
            Some(name) => Some(name),
            None => {
                errors.push(PolicyError::NoModelName {
                    component: pools.decode.clone(),
                });
                None
            }
        }
    };
    let chunk_tokens = pools
        .aggregated
        .then(|| worker_flag(graph, &pools.decode, "--max-num-batched-tokens"))
        .flatten()
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|v| *v > 0);
    if errors.is_empty() {
        Ok(TargetPools {
            prefill,
            decode,
            model_name,
            aggregated: pools.aggregated,
            chunk_tokens,
        })
    } else {
        Err(errors)
    }
}

/// The GPUs both pools' minimum replicas need, when the GPU budget is below that (`None`: the
/// budget fits, there is none, or the mode never scales).
fn budget_shortfall(spec: &PlannerPolicySpec, prefill: &PoolTarget, decode: &PoolTarget) -> Option<u64> {
    let budget = u64::try_from(spec.bounds.max_gpu_budget).ok()?;
    let (min_prefill, min_decode) = min_replicas(spec);
    let needed =
        u64::from(min_prefill) * u64::from(prefill.gpus) + u64::from(min_decode) * u64::from(decode.gpus);
    (spec.mode != PlannerMode::Observe && needed > budget).then_some(needed)
}

/// The minimum replicas of (prefill, decode): each pool's own, else `spec.bounds.minReplicas`,
/// at least 1.
pub fn min_replicas(spec: &PlannerPolicySpec) -> (u32, u32) {
    let min = |(min, _): (i32, Option<i32>)| u32::try_from(min.max(1)).unwrap_or(1);
    (min(spec.bounds.prefill_range()), min(spec.bounds.decode_range()))
}

/// [`budget_shortfall`] of one aggregated pool: its minimum replicas' GPUs, counted once.
fn budget_shortfall_aggregated(spec: &PlannerPolicySpec, pool: &PoolTarget) -> Option<u64> {
    let budget = u64::try_from(spec.bounds.max_gpu_budget).ok()?;
    let min = u64::try_from(spec.bounds.min_replicas.max(1)).unwrap_or(1);
    let needed = min * u64::from(pool.gpus);
    (spec.mode != PlannerMode::Observe && needed > budget).then_some(needed)
}

/// What a policy may do that its author may not expect, as admission warnings: a GPU budget
/// below both pools' minimums with `allowScaleToZero` (the planner will scale the graph to zero
/// on its first busy interval).
pub fn target_warnings(spec: &PlannerPolicySpec, target: &TargetPools) -> Vec<String> {
    match budget_shortfall(spec, &target.prefill, &target.decode) {
        Some(needed) if spec.bounds.allow_scale_to_zero => vec![format!(
            "spec.bounds.maxGpuBudget: {} GPUs cannot hold the minimum replicas of both pools ({needed} GPUs); with spec.bounds.allowScaleToZero the planner scales both pools to zero",
            spec.bounds.max_gpu_budget
        )],
        _ => Vec::new(),
    }
}

/// Whether `graph` runs upstream Dynamo's planner (a `planner` component with replicas above
/// zero) while the policy would write replicas (any mode but `observe`): the reconciler refuses
/// such a policy, the webhook warns (the graph may still be handed over).
pub fn upstream_planner(spec: &PlannerPolicySpec, graph: &TargetGraph) -> Option<PolicyError> {
    let planners = graph.running_planners();
    if planners.is_empty() || spec.mode == PlannerMode::Observe {
        return None;
    }
    let components = planners
        .iter()
        .map(|c| {
            let replicas = c.replicas.unwrap_or(1);
            format!(
                "component {:?}, type planner, {replicas} replica{}",
                c.name,
                if replicas == 1 { "" } else { "s" }
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let fields = planners
        .iter()
        .map(|c| match graph.shape {
            crate::target::Shape::Components => format!("spec.components[{}].replicas", c.index),
            crate::target::Shape::Services => format!("spec.services.{}.replicas", c.name),
        })
        .collect::<Vec<_>>()
        .join(", ");
    Some(PolicyError::UpstreamPlannerRunning {
        dgd: graph.name.clone(),
        components,
        fields,
    })
}

/// The violations of a policy whose target exists but cannot be read (see
/// [`TargetGraph::from_object`]): the spec's own ([`validate_spec`]) and the unreadable target.
pub fn validate_unreadable(
    spec: &PlannerPolicySpec,
    namespace: &str,
    error: &ShapeError,
    tenancy: &Tenancy,
) -> Vec<PolicyError> {
    let mut errors = validate_spec(spec);
    errors.extend(tenancy::check(spec, namespace, tenancy));
    errors.push(unreadable_target(spec, error));
    errors
}

/// The violation of a target that exists but cannot be read.
pub fn unreadable_target(spec: &PlannerPolicySpec, error: &ShapeError) -> PolicyError {
    PolicyError::TargetUnreadable {
        name: spec.target_ref.name.clone(),
        error: error.to_string(),
    }
}

/// Every rule, for a policy in `namespace` whose target is `dgd` (`None`: it does not exist), of
/// either served version:
/// the checks of [`validate_spec`], the admin's [`tenancy`] rules and [`validate_target`], which
/// the webhook runs too, in the same order, [`upstream_planner`] (a warning at admission, a
/// refusal here), and the parsed durations. Returns all violations.
pub fn validate(
    spec: &PlannerPolicySpec,
    namespace: &str,
    dgd: Option<&TargetGraph>,
    tenancy: &Tenancy,
) -> Result<ValidatedPolicy, Vec<PolicyError>> {
    let mut errors = validate_spec(spec);
    errors.extend(tenancy::check(spec, namespace, tenancy));
    let Some(dgd) = dgd else {
        errors.push(PolicyError::TargetNotFound {
            name: spec.target_ref.name.clone(),
            namespace: namespace.to_string(),
        });
        return Err(errors);
    };
    let target = match validate_target(spec, dgd) {
        Ok(target) => Some(target),
        Err(target_errors) => {
            errors.extend(target_errors);
            None
        }
    };
    errors.extend(upstream_planner(spec, dgd));
    let (Some(target), true) = (target, errors.is_empty()) else {
        return Err(errors);
    };
    // validate_spec accepted these, so they parse; the fallbacks are never used.
    let duration = |text: &str, fallback: Duration| parse_duration(text).unwrap_or(fallback);
    Ok(ValidatedPolicy {
        target,
        dynamo_namespace: spec
            .metrics
            .dynamo_namespace
            .clone()
            .unwrap_or_else(|| dynamo_namespace(namespace, &dgd.name)),
        interval: duration(&spec.adjustment_interval, Duration::from_secs(180)),
        pulling_interval: duration(&spec.load.metric_pulling_interval, Duration::from_secs(1)),
        decision_timeout: duration(&spec.connector.decision_timeout, Duration::from_secs(1800)),
        scale_up_delay: spec
            .behavior
            .scale_up_delay
            .as_deref()
            .map(|d| duration(d, Duration::from_secs(60))),
        expected_scale_up_delay: spec
            .behavior
            .expected_scale_up_delay
            .as_deref()
            .map(|d| duration(d, Duration::from_secs(60))),
        stabilization: duration(&spec.behavior.scale_down_stabilization, Duration::from_secs(300)),
        fast_check_period: duration(&spec.behavior.fast_check_period, Duration::from_secs(10)),
    })
}

/// The value following `--flag` or joined as `--flag=value` in an argument list (each element
/// may itself hold several shell words, as upstream splits them).
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let words: Vec<&str> = args.iter().flat_map(|a| a.split_whitespace()).collect();
    words.iter().enumerate().find_map(|(i, word)| {
        if *word == flag {
            words
                .get(i + 1)
                .map(|v| v.trim_matches(|c| c == '"' || c == '\'').to_string())
        } else {
            word.strip_prefix(&format!("{flag}="))
                .map(|v| v.trim_matches(|c| c == '"' || c == '\'').to_string())
        }
    })
}

/// The model name in the frontend metrics: the policy's, else the decode worker's
/// `--served-model-name`, else `--model`, lower-cased as the frontend reports it.
pub fn model_name(spec: &PlannerPolicySpec, graph: &TargetGraph, decode_component: &str) -> Option<String> {
    if let Some(name) = &spec.metrics.model_name {
        return Some(name.to_lowercase());
    }
    let args: &[String] = graph
        .component(decode_component)
        .map(|c| c.main_args.as_slice())
        .unwrap_or_default();
    ["--served-model-name", "--model-name", "--model"]
        .iter()
        .find_map(|flag| flag_value(args, flag))
        .map(|name| name.to_lowercase())
}

/// The value of `flag` in the main container's arguments of `component`.
fn worker_flag(graph: &TargetGraph, component: &str, flag: &str) -> Option<String> {
    let args: &[String] = graph
        .component(component)
        .map(|c| c.main_args.as_slice())
        .unwrap_or_default();
    flag_value(args, flag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::describe;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use planner_api::{DynamoGraphDeployment, EtcdSource, PlannerPolicy, PoolComponents};
    use serde_json::json;

    fn policy(file: &str) -> PlannerPolicySpec {
        let text =
            std::fs::read_to_string(format!("{}/../config/samples/{file}", env!("CARGO_MANIFEST_DIR")))
                .unwrap();
        serde_yaml::from_str::<PlannerPolicy>(&text).unwrap().spec
    }

    fn sample() -> DynamoGraphDeployment {
        serde_yaml::from_str(include_str!("../../../config/samples/dgd-disagg.yaml")).unwrap()
    }

    fn view(dgd: &DynamoGraphDeployment) -> TargetGraph {
        TargetGraph::try_from(dgd).unwrap()
    }

    fn dgd() -> TargetGraph {
        view(&sample())
    }

    #[test]
    fn every_sample_is_valid() {
        for file in [
            "plannerpolicy-sla.yaml",
            "plannerpolicy-load.yaml",
            "plannerpolicy-observe.yaml",
            "plannerpolicy-virtual.yaml",
        ] {
            let spec = policy(file);
            assert_eq!(validate_spec(&spec), [], "{file}");
            assert_eq!(
                resolve_pools(&spec, &dgd()),
                Ok(ResolvedPools {
                    prefill: "prefill".into(),
                    decode: "decode".into(),
                    aggregated: false,
                }),
                "{file}"
            );
        }
    }

    #[test]
    fn built_in_names_match_the_compiled_profiles() {
        let compiled: Vec<&str> = builtin_names().collect();
        for name in BUILTIN_PROFILES {
            assert!(compiled.contains(&name), "{name} is not compiled in");
        }
        let mut errors = Vec::new();
        check_builtin("a100-llama-7b", &mut errors);
        assert_eq!(
            errors[0].to_string(),
            format!(
                "spec.profile.builtin: \"a100-llama-7b\" is not a built-in profile; allowed: {}",
                BUILTIN_PROFILES.join(", ")
            )
        );
    }

    #[test]
    fn interval_fits_the_mode() {
        let mut spec = policy("plannerpolicy-sla.yaml");
        spec.adjustment_interval = "25h".into();
        assert_eq!(
            validate_spec(&spec)[0].to_string(),
            "spec.adjustmentInterval: \"25h\" is out of range for mode sla; allowed: 10s to 24h"
        );
        spec.adjustment_interval = "5s".into();
        assert!(matches!(
            validate_spec(&spec)[0],
            PolicyError::IntervalOutOfRange { .. }
        ));
        let mut load = policy("plannerpolicy-load.yaml");
        load.adjustment_interval = "2h".into();
        assert!(matches!(
            validate_spec(&load)[0],
            PolicyError::IntervalOutOfRange { .. }
        ));
        load.adjustment_interval = "30s".into();
        load.load.metric_pulling_interval = "20s".into();
        assert_eq!(
            validate_spec(&load)[0].to_string(),
            "spec.load.metricPullingInterval: \"20s\" is out of range for spec.adjustmentInterval 30s; allowed: 100ms to 15s (at most half the interval, so that each interval averages at least two samples)"
        );
        load.load.metric_pulling_interval = "10ms".into();
        assert!(matches!(
            validate_spec(&load)[0],
            PolicyError::PullingIntervalOutOfRange { .. }
        ));
        load.load.metric_pulling_interval = "15s".into();
        assert_eq!(validate_spec(&load), []);
        // Only load mode samples: elsewhere a pulling interval over half the interval is fine,
        // but not one outside its own range, which the schema refuses wherever it is written.
        let mut sla = policy("plannerpolicy-sla.yaml");
        sla.adjustment_interval = "10s".into();
        sla.load.metric_pulling_interval = "30s".into();
        assert_eq!(validate_spec(&sla), []);
        sla.load.metric_pulling_interval = "10m".into();
        assert!(matches!(
            validate_spec(&sla)[..],
            [PolicyError::PullingIntervalOutOfRange { .. }]
        ));
    }

    #[test]
    fn malformed_durations_are_named() {
        let mut spec = policy("plannerpolicy-virtual.yaml");
        spec.adjustment_interval = "3 minutes".into();
        spec.connector.decision_timeout = "forever".into();
        let fields: Vec<String> = validate_spec(&spec).iter().map(ToString::to_string).collect();
        assert!(fields[0].starts_with("spec.adjustmentInterval: \"3 minutes\" is not a duration"));
        assert!(fields[1].starts_with("spec.connector.decisionTimeout: \"forever\" is not a duration"));
    }

    #[test]
    fn the_expected_scale_up_delay_is_a_duration_of_at_most_an_hour() {
        let mut spec = policy("plannerpolicy-sla.yaml");
        spec.behavior.expected_scale_up_delay = Some("4m".into());
        assert_eq!(validate_spec(&spec), []);
        spec.behavior.expected_scale_up_delay = Some("2h".into());
        let errors: Vec<String> = validate_spec(&spec).iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("spec.behavior.expectedScaleUpDelay"),
            "{errors:?}"
        );
        assert!(errors[0].contains("0s to 1h"), "{errors:?}");
        spec.behavior.expected_scale_up_delay = Some("slow".into());
        let errors: Vec<String> = validate_spec(&spec).iter().map(ToString::to_string).collect();
        assert!(
            errors[0].starts_with("spec.behavior.expectedScaleUpDelay: \"slow\" is not a duration"),
            "{errors:?}"
        );
    }

    #[test]
    fn virtual_connector_settings_are_complete() {
        let mut spec = policy("plannerpolicy-virtual.yaml");
        spec.connector.etcd = None;
        assert_eq!(validate_spec(&spec), [PolicyError::EtcdEndpointsMissing]);
        spec.connector.etcd = Some(EtcdSource {
            endpoints: vec![
                "http://etcd:2379".into(),
                "etcd:99999".into(),
                "https://[::1]:2379".into(),
                "10.0.0.1".into(),
                "http://".into(),
            ],
        });
        let invalid: Vec<usize> = validate_spec(&spec)
            .iter()
            .map(|e| match e {
                PolicyError::EtcdEndpointInvalid { index, .. } => *index,
                other => panic!("unexpected {other}"),
            })
            .collect();
        assert_eq!(invalid, [1, 4]);
        spec.connector.etcd = Some(EtcdSource {
            endpoints: vec!["http://etcd:2379".into()],
        });
        spec.connector.decision_timeout = "0s".into();
        assert_eq!(
            validate_spec(&spec)[0].to_string(),
            "spec.connector.decisionTimeout: \"0s\" is out of range; allowed: 1s to 24h"
        );
    }

    #[test]
    fn pools_resolve_by_name_or_type() {
        let mut spec = policy("plannerpolicy-sla.yaml");
        let mut graph = sample();
        spec.components = Some(PoolComponents {
            prefill: Some("nope".into()),
            decode: Some("frontend".into()),
        });
        let errors = resolve_pools(&spec, &view(&graph)).unwrap_err();
        assert_eq!(
            errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "spec.components.prefill: \"nope\" is not a component of DynamoGraphDeployment \"llama-disagg\"; allowed: frontend, prefill, decode",
                "spec.components.decode: component \"frontend\" of DynamoGraphDeployment \"llama-disagg\" has type frontend; allowed: a component with type decode, worker or no type",
            ]
        );
        spec.components = None;
        let mut second = graph.spec.components[1].clone();
        second.name = "prefill-b".into();
        graph.spec.components.push(second);
        graph.spec.components.retain(|c| c.name != "decode");
        let errors = resolve_pools(&spec, &view(&graph)).unwrap_err();
        assert_eq!(
            errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "spec.components.prefill: not set, and DynamoGraphDeployment \"llama-disagg\" has 2 components with type: prefill (prefill, prefill-b); set spec.components.prefill to one of them",
                "spec.components.decode: not set, and DynamoGraphDeployment \"llama-disagg\" has no component with type: decode (components: frontend (frontend), prefill (prefill), prefill-b (prefill)); set spec.components.decode to the decode component's name",
            ]
        );
    }

    #[test]
    fn one_aggregated_worker_is_both_pools() {
        let mut graph = sample();
        graph.spec.components[1].kind = Some(ComponentType::Worker);
        let disaggregated = view(&graph);
        let mut spec = policy("plannerpolicy-sla.yaml");
        spec.components = Some(PoolComponents {
            prefill: Some("prefill".into()),
            decode: None,
        });
        assert_eq!(
            resolve_pools(&spec, &disaggregated),
            Ok(ResolvedPools {
                prefill: "prefill".into(),
                decode: "decode".into(),
                aggregated: false,
            })
        );
        // Named twice: that worker is both pools.
        spec.components = Some(PoolComponents {
            prefill: Some("prefill".into()),
            decode: Some("prefill".into()),
        });
        let aggregated = ResolvedPools {
            prefill: "prefill".into(),
            decode: "prefill".into(),
            aggregated: true,
        };
        assert_eq!(resolve_pools(&spec, &disaggregated), Ok(aggregated.clone()));
        // Unnamed: a graph whose one worker component is `type: worker` is aggregated.
        graph.spec.components.retain(|c| c.name != "decode");
        let main = &mut graph.spec.components[1]
            .pod_template
            .as_mut()
            .unwrap()
            .spec
            .as_mut()
            .unwrap()
            .containers[0];
        main.args
            .get_or_insert_with(Vec::new)
            .extend(["--max-num-batched-tokens".to_string(), "4096".to_string()]);
        let agg = view(&graph);
        spec.components = None;
        assert_eq!(resolve_pools(&spec, &agg), Ok(aggregated));
        // One pool: per-pool bounds are refused, naming what to set instead.
        let errors = validate_target(&spec, &agg).unwrap_err();
        assert_eq!(
            errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "spec.bounds.decode: DynamoGraphDeployment \"llama-disagg\" is aggregated (component \"prefill\" serves prefill and decode); allowed: no spec.bounds.prefill or spec.bounds.decode, set spec.bounds.minReplicas and spec.bounds.maxReplicas for its one pool"
            ]
        );
        spec.bounds.decode = None;
        let target = validate_target(&spec, &agg).unwrap();
        assert!(target.aggregated);
        assert_eq!(target.prefill, target.decode);
        assert_eq!(target.chunk_tokens, Some(4096));
        // The GPU budget counts the pool once.
        spec.bounds.max_gpu_budget = i32::try_from(target.decode.gpus).unwrap();
        assert!(validate_target(&spec, &agg).is_ok());
        // The virtual connector's protocol and upstream's formulas have two pools.
        spec.connector.kind = ConnectorKind::Virtual;
        spec.sla.model = SlaModel::Upstream;
        let errors: Vec<String> = resolve_pools(&spec, &agg)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errors,
            [
                "spec.connector.type: virtual publishes prefill and decode replicas, and component \"prefill\" of DynamoGraphDeployment \"llama-disagg\" is one aggregated worker pool; allowed: kubernetes",
                "spec.sla.model: upstream sizes prefill and decode pools, and component \"prefill\" of DynamoGraphDeployment \"llama-disagg\" is one aggregated worker pool; allowed: queueing",
            ]
        );
    }

    #[test]
    fn gpus_from_limits_then_requests() {
        let mut dgd = sample();
        let set_requests = |dgd: &mut DynamoGraphDeployment, value: &str| {
            let main = &mut dgd.spec.components[2]
                .pod_template
                .as_mut()
                .unwrap()
                .spec
                .as_mut()
                .unwrap()
                .containers[0];
            let resources = main.resources.as_mut().unwrap();
            resources.limits = None;
            resources.requests = Some([(GPU_RESOURCE.to_string(), Quantity(value.into()))].into());
        };
        set_requests(&mut dgd, "4");
        assert_eq!(view(&dgd).component("decode").unwrap().gpus, Ok(4));
        set_requests(&mut dgd, "half");
        assert_eq!(
            view(&dgd).component("decode").unwrap().gpus,
            Err(crate::target::BadGpuQuantity {
                quantity: "half".into()
            })
        );
        assert_eq!(view(&dgd).component("frontend").unwrap().gpus, Ok(1));
        let errors = validate_target(&policy("plannerpolicy-sla.yaml"), &view(&dgd)).unwrap_err();
        assert_eq!(
            errors[0].to_string(),
            "spec.components.decode: component \"decode\" asks for \"half\" nvidia.com/gpu in its main container; allowed: a whole number of GPUs, 1 or more"
        );
        // A current status's count wins over the pod resources (a replica's sidecar GPU).
        set_requests(&mut dgd, "4");
        let mut graph = view(&dgd);
        graph.observed_generation = graph.generation.or(Some(1));
        graph.status_components.insert(
            "decode".into(),
            crate::target::ComponentCounts {
                gpus_per_replica: Some(5),
                ..Default::default()
            },
        );
        let target = validate_target(&policy("plannerpolicy-sla.yaml"), &graph).unwrap();
        assert_eq!(target.decode.gpus, 5);
    }

    #[test]
    fn model_name_from_policy_then_worker_args() {
        let typed = sample();
        let dgd = view(&typed);
        let mut spec = policy("plannerpolicy-load.yaml");
        assert_eq!(model_name(&spec, &dgd, "decode").unwrap(), "llama-3.1-8b");
        spec.metrics.model_name = Some("Custom".into());
        assert_eq!(model_name(&spec, &dgd, "decode").unwrap(), "custom");
        assert_eq!(
            flag_value(&["--model=meta/Llama".into()], "--model").as_deref(),
            Some("meta/Llama")
        );
        assert_eq!(
            flag_value(&["python3 -m dynamo.vllm --model m1".into()], "--model").as_deref(),
            Some("m1")
        );
        // Without a model name anywhere, the SLA planner cannot filter the metrics.
        let mut bare = typed.clone();
        for component in &mut bare.spec.components {
            if let Some(main) = component
                .pod_template
                .as_mut()
                .and_then(|t| t.spec.as_mut())
                .and_then(|s| s.containers.first_mut())
            {
                main.args = None;
                main.command = None;
            }
        }
        let mut sla = policy("plannerpolicy-sla.yaml");
        sla.metrics.model_name = None;
        let bare = view(&bare);
        let errors = validate_target(&sla, &bare).unwrap_err();
        assert_eq!(
            errors,
            [PolicyError::NoModelName {
                component: "decode".into()
            }]
        );
        // The load-based planner reads no per-model metrics.
        assert!(validate_target(&policy("plannerpolicy-load.yaml"), &bare).is_ok());
    }

    #[test]
    fn validated_policies_carry_parsed_settings() {
        let validated = validate(
            &policy("plannerpolicy-virtual.yaml"),
            "llm",
            Some(&dgd()),
            &Tenancy::default(),
        )
        .unwrap();
        assert_eq!(validated.target.prefill.component, "prefill");
        assert_eq!(validated.target.model_name.as_deref(), Some("llama-3.1-8b"));
        assert_eq!(validated.dynamo_namespace, "llm-llama-disagg");
        let mut spec = policy("plannerpolicy-sla.yaml");
        spec.adjustment_interval = "5s".into();
        spec.components = Some(PoolComponents {
            prefill: Some("nope".into()),
            decode: None,
        });
        let errors = validate(&spec, "llm", Some(&dgd()), &Tenancy::default()).unwrap_err();
        assert!(matches!(
            validate(&spec, "llm", None, &Tenancy::default())
                .unwrap_err()
                .last(),
            Some(PolicyError::TargetNotFound { .. })
        ));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(errors[0].reason(), "InvalidSpec");
        assert_eq!(errors[1].reason(), "ComponentsUnresolved");
        assert!(describe(&errors).contains("; spec.components.prefill: \"nope\""));
    }

    #[test]
    fn a_v1alpha1_services_map_resolves_by_the_same_rules() {
        let graph = TargetGraph::from_value(&json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "metadata": {"name": "llama-alpha", "namespace": "llm"},
            "spec": {"services": {
                "Frontend": {"componentType": "frontend"},
                "VllmPrefillWorker": {"componentType": "worker", "subComponentType": "prefill", "replicas": 2,
                    "resources": {"limits": {"gpu": "2"}}},
                "VllmDecodeWorker": {"componentType": "worker", "subComponentType": "decode", "replicas": 3,
                    "resources": {"limits": {"gpu": "2"}},
                    "extraPodSpec": {"mainContainer": {"args": ["--model", "Qwen/Qwen3-0.6B"]}}}
            }}
        }))
        .unwrap();
        let mut spec = policy("plannerpolicy-sla.yaml");
        spec.metrics.model_name = None;
        let validated = validate(&spec, "llm", Some(&graph), &Tenancy::default()).unwrap();
        assert_eq!(validated.target.prefill.component, "VllmPrefillWorker");
        assert_eq!(validated.target.prefill.replicas, 2);
        assert_eq!(validated.target.decode.gpus, 2);
        assert_eq!(validated.target.model_name.as_deref(), Some("qwen/qwen3-0.6b"));
        assert_eq!(validated.dynamo_namespace, "llm-llama-alpha");
        let mut spec = policy("plannerpolicy-sla.yaml");
        spec.components = Some(PoolComponents {
            prefill: Some("Frontend".into()),
            decode: Some("Nope".into()),
        });
        assert_eq!(
            describe(&resolve_pools(&spec, &graph).unwrap_err()),
            "spec.components.prefill: component \"Frontend\" of DynamoGraphDeployment \"llama-alpha\" has type frontend; allowed: a component with type prefill, worker or no type; spec.components.decode: \"Nope\" is not a component of DynamoGraphDeployment \"llama-alpha\"; allowed: Frontend, VllmDecodeWorker, VllmPrefillWorker"
        );
    }

    #[test]
    fn an_unreadable_target_is_named() {
        let error = TargetGraph::from_value(&json!({"spec": {"services": "x"}})).unwrap_err();
        let errors = validate_unreadable(
            &policy("plannerpolicy-sla.yaml"),
            "llm",
            &error,
            &Tenancy::default(),
        );
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].reason(), "TargetUnreadable");
        assert!(errors[0].is_about_target());
        assert_eq!(
            errors[0].to_string(),
            "spec.targetRef.name: DynamoGraphDeployment \"llama-disagg\" cannot be read as nvidia.com/v1beta1 or v1alpha1: spec.services: a string is not a map; allowed: a map of service name to spec (nvidia.com/v1alpha1)"
        );
    }

    /// A graph that runs upstream's planner is refused (naming the component and how to hand
    /// the graph over) unless the policy only observes; scaled to zero, it is accepted.
    #[test]
    fn a_graph_running_upstreams_planner_is_refused() {
        let mut value = serde_json::to_value(sample()).unwrap();
        value["spec"]["components"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "Planner", "type": "planner", "replicas": 1}));
        let graph = TargetGraph::from_value(&value).unwrap();
        let spec = policy("plannerpolicy-sla.yaml");
        let errors = validate(&spec, "llm", Some(&graph), &Tenancy::default()).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].reason(), "UpstreamPlannerRunning");
        assert!(errors[0].is_about_target());
        assert_eq!(
            errors[0].to_string(),
            "spec.targetRef.name: DynamoGraphDeployment \"llama-disagg\" runs upstream Dynamo's planner (component \"Planner\", type planner, 1 replica), which sets the same pools' replicas, so two planners would overwrite each other; hand the graph over by removing that component from the DynamoGraphDeployment or scaling it to zero replicas (spec.components[3].replicas: 0), or set spec.mode: observe"
        );
        // The webhook's rules alone (validate_target) do not refuse it: admission only warns.
        assert!(validate_target(&spec, &graph).is_ok());
        let mut observe = spec.clone();
        observe.mode = PlannerMode::Observe;
        assert!(validate(&observe, "llm", Some(&graph), &Tenancy::default()).is_ok());
        value["spec"]["components"][3]["replicas"] = json!(0);
        let handed_over = TargetGraph::from_value(&value).unwrap();
        assert!(validate(&spec, "llm", Some(&handed_over), &Tenancy::default()).is_ok());
        let alpha = TargetGraph::from_value(&json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "metadata": {"name": "g", "namespace": "llm"},
            "spec": {"services": {"Planner": {"componentType": "planner", "replicas": 2}}}
        }))
        .unwrap();
        assert!(
            upstream_planner(&spec, &alpha)
                .unwrap()
                .to_string()
                .contains("(component \"Planner\", type planner, 2 replicas)")
                && upstream_planner(&spec, &alpha)
                    .unwrap()
                    .to_string()
                    .contains("(spec.services.Planner.replicas: 0)")
        );
    }
}

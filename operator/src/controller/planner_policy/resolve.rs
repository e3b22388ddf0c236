//! Pure translation of a PlannerPolicy and its target DGD into the planner core's types:
//! which components are the pools, GPUs per engine, the model and Dynamo namespace the metrics
//! are filtered by, and the planner configuration.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::{
    api::{Component, ComponentType, DynamoGraphDeployment, PlannerPolicy, PlannerPolicySpec, PredictorKind},
    controller::dgd::render::{MAIN_CONTAINER, dynamo_namespace},
    planner::{
        load::LoadConfig,
        predictor::{self, KalmanConfig, PredictorConfig},
        sla::{Limits, SlaTargets},
        state::SlaPlannerConfig,
    },
};

/// GPU resource name read from pod templates.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Why a policy's target cannot be used. Messages name the field and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The DGD has no component with that name.
    #[error(
        "spec.components.{pool}: the DynamoGraphDeployment {dgd} has no component named {name:?} (components: {known})"
    )]
    NoSuchComponent {
        /// `prefill` or `decode`.
        pool: &'static str,
        /// The DGD.
        dgd: String,
        /// The name asked for.
        name: String,
        /// The names it has.
        known: String,
    },
    /// No or several components of the pool's type.
    #[error(
        "the DynamoGraphDeployment {dgd} has {count} components with type: {pool}; name the {pool} component in spec.components.{pool}"
    )]
    AmbiguousType {
        /// `prefill` or `decode`.
        pool: &'static str,
        /// The DGD.
        dgd: String,
        /// How many there are.
        count: usize,
    },
    /// The GPU request of a component is not a whole number.
    #[error("spec.components[{component}]: {GPU_RESOURCE} must be a whole number of GPUs, got {value:?}")]
    BadGpuCount {
        /// The component.
        component: String,
        /// The value.
        value: String,
    },
    /// No model name in the policy or the worker arguments.
    #[error(
        "spec.metrics.modelName is not set and the {component} component's main container has no --served-model-name or --model argument"
    )]
    NoModelName {
        /// The component searched.
        component: String,
    },
    /// A duration field does not parse.
    #[error("{field}: {value:?} is not a duration such as 180s or 3m")]
    BadDuration {
        /// The field.
        field: &'static str,
        /// The value.
        value: String,
    },
}

/// The two pools of a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pools {
    /// The prefill component's name.
    pub prefill: String,
    /// The decode component's name.
    pub decode: String,
    /// GPUs per prefill replica.
    pub prefill_gpus: u32,
    /// GPUs per decode replica.
    pub decode_gpus: u32,
    /// Replicas the DGD asks for now (spec).
    pub prefill_replicas: u32,
    /// Replicas the DGD asks for now (spec).
    pub decode_replicas: u32,
}

fn find_component<'a>(
    dgd: &'a DynamoGraphDeployment,
    pool: &'static str,
    kind: ComponentType,
    name: Option<&str>,
) -> Result<&'a Component, ResolveError> {
    let dgd_name = dgd.metadata.name.clone().unwrap_or_default();
    match name {
        Some(name) => dgd
            .spec
            .components
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| ResolveError::NoSuchComponent {
                pool,
                dgd: dgd_name,
                name: name.to_string(),
                known: dgd
                    .spec
                    .components
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        None => {
            let matches: Vec<&Component> = dgd
                .spec
                .components
                .iter()
                .filter(|c| c.kind == Some(kind))
                .collect();
            match matches.as_slice() {
                [one] => Ok(one),
                _ => Err(ResolveError::AmbiguousType {
                    pool,
                    dgd: dgd_name,
                    count: matches.len(),
                }),
            }
        }
    }
}

fn main_container(component: &Component) -> Option<&k8s_openapi::api::core::v1::Container> {
    component
        .pod_template
        .as_ref()?
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == MAIN_CONTAINER)
}

/// GPUs of one replica: the main container's `nvidia.com/gpu` limit, then request, else 1.
pub fn gpus_per_engine(component: &Component) -> Result<u32, ResolveError> {
    let resources = main_container(component).and_then(|c| c.resources.as_ref());
    let quantity: Option<&Quantity> = resources
        .and_then(|r| r.limits.as_ref().and_then(|l| l.get(GPU_RESOURCE)))
        .or_else(|| resources.and_then(|r| r.requests.as_ref().and_then(|l| l.get(GPU_RESOURCE))));
    match quantity {
        None => Ok(1),
        Some(Quantity(value)) => value
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&gpus| gpus > 0)
            .ok_or_else(|| ResolveError::BadGpuCount {
                component: component.name.clone(),
                value: value.clone(),
            }),
    }
}

/// Resolves the pools of a policy's target.
pub fn pools(spec: &PlannerPolicySpec, dgd: &DynamoGraphDeployment) -> Result<Pools, ResolveError> {
    let names = spec.components.clone().unwrap_or_default();
    let prefill = find_component(dgd, "prefill", ComponentType::Prefill, names.prefill.as_deref())?;
    let decode = find_component(dgd, "decode", ComponentType::Decode, names.decode.as_deref())?;
    let replicas = |c: &Component| u32::try_from(c.replicas.unwrap_or(1)).unwrap_or(0);
    Ok(Pools {
        prefill: prefill.name.clone(),
        decode: decode.name.clone(),
        prefill_gpus: gpus_per_engine(prefill)?,
        decode_gpus: gpus_per_engine(decode)?,
        prefill_replicas: replicas(prefill),
        decode_replicas: replicas(decode),
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

/// The model name in the frontend metrics: the policy's, else the worker's
/// `--served-model-name`, else `--model`, lower-cased as the frontend reports it.
pub fn model_name(
    spec: &PlannerPolicySpec,
    dgd: &DynamoGraphDeployment,
    pools: &Pools,
) -> Result<String, ResolveError> {
    if let Some(name) = &spec.metrics.model_name {
        return Ok(name.to_lowercase());
    }
    let component = dgd.spec.components.iter().find(|c| c.name == pools.decode);
    let args: Vec<String> = component
        .and_then(main_container)
        .map(|c| {
            c.command
                .iter()
                .flatten()
                .chain(c.args.iter().flatten())
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    ["--served-model-name", "--model-name", "--model"]
        .iter()
        .find_map(|flag| flag_value(&args, flag))
        .map(|name| name.to_lowercase())
        .ok_or_else(|| ResolveError::NoModelName {
            component: pools.decode.clone(),
        })
}

/// The Dynamo namespace the metrics carry: the policy's, else `<namespace>-<dgd>`.
pub fn metrics_namespace(policy: &PlannerPolicy, dgd_name: &str) -> String {
    policy.spec.metrics.dynamo_namespace.clone().unwrap_or_else(|| {
        dynamo_namespace(policy.metadata.namespace.as_deref().unwrap_or_default(), dgd_name)
    })
}

/// Parses a Go-style duration (`180s`, `3m`, `1h30m`, `1.5s`).
pub fn parse_duration(field: &'static str, value: &str) -> Result<Duration, ResolveError> {
    let bad = || ResolveError::BadDuration {
        field,
        value: value.to_string(),
    };
    let parsed: kube::core::Duration = value.parse().map_err(|_| bad())?;
    if parsed.is_negative() {
        return Err(bad());
    }
    Ok(parsed.into())
}

/// The SLA planner's configuration for a policy and its pools.
pub fn sla_config(spec: &PlannerPolicySpec, pools: &Pools) -> Result<SlaPlannerConfig, ResolveError> {
    let interval = parse_duration("spec.adjustmentInterval", &spec.adjustment_interval)?;
    let predictor = &spec.predictor;
    Ok(SlaPlannerConfig {
        interval_s: interval.as_secs_f64(),
        sla: SlaTargets {
            ttft_ms: spec.sla.ttft_ms,
            itl_ms: spec.sla.itl_ms,
            prefill_utilization: spec.sla.prefill_utilization,
        },
        limits: limits(spec, pools),
        correction: spec.correction.enabled,
        predictor: PredictorConfig {
            kind: match predictor.kind {
                PredictorKind::Constant => predictor::PredictorKind::Constant,
                PredictorKind::Arima => predictor::PredictorKind::Arima,
                PredictorKind::Kalman => predictor::PredictorKind::Kalman,
                PredictorKind::Prophet => predictor::PredictorKind::Prophet,
            },
            log1p: predictor.log1p,
            kalman: KalmanConfig {
                q_level: predictor.kalman.q_level,
                q_trend: predictor.kalman.q_trend,
                r: predictor.kalman.r,
                min_points: usize::try_from(predictor.kalman.min_points).unwrap_or(1),
            },
            prophet_window_size: usize::try_from(predictor.prophet.window_size).unwrap_or(50),
            interval_seconds: interval.as_secs_f64(),
        },
    })
}

fn limits(spec: &PlannerPolicySpec, pools: &Pools) -> Limits {
    Limits {
        min_replicas: u32::try_from(spec.bounds.min_replicas).unwrap_or(1),
        max_replicas: spec.bounds.max_replicas.and_then(|m| u32::try_from(m).ok()),
        max_gpu_budget: u32::try_from(spec.bounds.max_gpu_budget).ok(),
        prefill_gpus_per_engine: pools.prefill_gpus,
        decode_gpus_per_engine: pools.decode_gpus,
    }
}

/// The load-based planner's configuration.
pub fn load_config(spec: &PlannerPolicySpec, pools: &Pools) -> LoadConfig {
    let limits = limits(spec, pools);
    let load = &spec.load;
    LoadConfig {
        kv_scale_up: load.decode_kv_scale_up_threshold,
        kv_scale_down: load.decode_kv_scale_down_threshold,
        queue_scale_up: load.prefill_queue_scale_up_threshold,
        queue_scale_down: load.prefill_queue_scale_down_threshold,
        decode_grace_intervals: u32::try_from(load.decode_grace_period_intervals).unwrap_or(0),
        prefill_buffer_intervals: u32::try_from(load.prefill_queue_buffer_intervals).unwrap_or(0),
        min_replicas: limits.min_replicas,
        max_replicas: limits.max_replicas,
        max_gpu_budget: limits.max_gpu_budget,
        prefill_gpus_per_engine: limits.prefill_gpus_per_engine,
        decode_gpus_per_engine: limits.decode_gpus_per_engine,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dgd() -> DynamoGraphDeployment {
        let mut dgd: DynamoGraphDeployment =
            serde_yaml::from_str(include_str!("../../../../config/samples/dgd-disagg.yaml")).unwrap();
        dgd.metadata.namespace = Some("llm".into());
        dgd
    }

    fn policy(file: &str) -> PlannerPolicy {
        let text = match file {
            "sla" => include_str!("../../../../config/samples/plannerpolicy-sla.yaml"),
            _ => include_str!("../../../../config/samples/plannerpolicy-load.yaml"),
        };
        let mut policy: PlannerPolicy = serde_yaml::from_str(text).unwrap();
        policy.metadata.namespace = Some("llm".into());
        policy
    }

    #[test]
    fn pools_by_type_and_by_name() {
        let dgd = dgd();
        let by_type = pools(&policy("sla").spec, &dgd).unwrap();
        assert_eq!(
            (by_type.prefill.as_str(), by_type.decode.as_str()),
            ("prefill", "decode")
        );
        assert_eq!((by_type.prefill_gpus, by_type.decode_gpus), (1, 1));
        let by_name = pools(&policy("load").spec, &dgd).unwrap();
        assert_eq!(by_name, by_type);
    }

    #[test]
    fn unresolvable_pools_say_why() {
        let mut dgd = dgd();
        let mut spec = policy("sla").spec;
        spec.components = Some(crate::api::PoolComponents {
            prefill: Some("workers".into()),
            decode: None,
        });
        let error = pools(&spec, &dgd).unwrap_err().to_string();
        assert!(
            error.contains("no component named \"workers\" (components: frontend, prefill, decode)"),
            "{error}"
        );
        dgd.spec.components[2].kind = Some(ComponentType::Prefill);
        let error = pools(&policy("sla").spec, &dgd).unwrap_err().to_string();
        assert!(error.contains("has 2 components with type: prefill"), "{error}");
    }

    #[test]
    fn gpus_from_limits_then_requests() {
        let mut dgd = dgd();
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
        assert_eq!(gpus_per_engine(&dgd.spec.components[2]).unwrap(), 4);
        set_requests(&mut dgd, "half");
        assert!(matches!(
            gpus_per_engine(&dgd.spec.components[2]),
            Err(ResolveError::BadGpuCount { .. })
        ));
        assert_eq!(gpus_per_engine(&dgd.spec.components[0]).unwrap(), 1);
    }

    #[test]
    fn model_name_from_policy_then_worker_args() {
        let dgd = dgd();
        let mut spec = policy("load").spec;
        let pools = pools(&spec, &dgd).unwrap();
        assert_eq!(model_name(&spec, &dgd, &pools).unwrap(), "llama-3.1-8b");
        spec.metrics.model_name = Some("Custom".into());
        assert_eq!(model_name(&spec, &dgd, &pools).unwrap(), "custom");
        assert_eq!(
            flag_value(&["--model=meta/Llama".into()], "--model").as_deref(),
            Some("meta/Llama")
        );
        assert_eq!(
            flag_value(&["python3 -m dynamo.vllm --model m1".into()], "--model").as_deref(),
            Some("m1")
        );
    }

    #[test]
    fn configs_carry_the_spec() {
        let dgd = dgd();
        let spec = policy("sla").spec;
        let pools = pools(&spec, &dgd).unwrap();
        let config = sla_config(&spec, &pools).unwrap();
        assert_eq!(config.interval_s, 180.0);
        assert_eq!(config.limits.max_gpu_budget, Some(16));
        assert_eq!(config.limits.max_replicas, Some(8));
        assert_eq!(config.predictor.kind, predictor::PredictorKind::Arima);
        let load = load_config(&policy("load").spec, &pools);
        assert_eq!((load.kv_scale_up, load.queue_scale_down), (0.9, 0.2));
        assert_eq!(
            metrics_namespace(&policy("sla"), "llama-disagg"),
            "llm-llama-disagg"
        );
        assert_eq!(parse_duration("f", "1m30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("f", "soon").is_err());
    }
}

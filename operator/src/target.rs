//! The target of a PlannerPolicy: a `DynamoGraphDeployment` of either version NVIDIA's Dynamo
//! operator serves, read as JSON into the few fields the planner needs.
//!
//! NVIDIA's operator serves `nvidia.com/v1beta1` (`spec.components`, a list keyed by `name`, each
//! with `type` and `replicas`; `status.components`) and `nvidia.com/v1alpha1` (`spec.services`, a
//! map from the service name to its spec, with `componentType`, `subComponentType` and
//! `replicas`; `status.services`): Dynamo up to 1.1 serves v1alpha1 only; from 1.2 it serves both
//! and converts between them with its webhook. This operator's own CRD serves v1beta1 only.
//! [`TargetGraph`] reads either layout, and remembers the version it was read at, which is where
//! the connector writes ([`TargetGraph::resource`]).
//!
//! A component that declares `scalingAdapter` (v1beta1: the field is present, even as `{}`;
//! v1alpha1: `scalingAdapter.enabled: true`) has its replicas owned by a
//! `DynamoGraphDeploymentScalingAdapter` named [`adapter_name`], served at the same versions as
//! the graph (v1alpha1 `dgdRef.serviceName`, v1beta1 `dgdRef.componentName`); see
//! [`crate::connector::kubernetes`].

use std::{collections::BTreeMap, fmt};

use kube::core::{ApiResource, DynamicObject};
use serde_json::Value;

use planner_api::{ComponentType, DynamoGraphDeployment, Enforcement, KvTransferStatus};

/// API group of NVIDIA Dynamo's resources.
pub const GROUP: &str = "nvidia.com";
/// Kind of the graph.
pub const KIND: &str = "DynamoGraphDeployment";
/// Resource (plural) of the graph.
pub const PLURAL: &str = "dynamographdeployments";
/// Kind of the scaling adapter.
pub const ADAPTER_KIND: &str = "DynamoGraphDeploymentScalingAdapter";
/// Resource (plural) of the scaling adapter, which has a Scale subresource on `.spec.replicas`.
pub const ADAPTER_PLURAL: &str = "dynamographdeploymentscalingadapters";
/// The versions NVIDIA's operator serves its resources at, newest first.
pub const VERSIONS: [&str; 2] = ["v1beta1", "v1alpha1"];
/// Resource name of GPUs in pod templates.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Name of the container that runs a component (v1beta1 `podTemplate`).
const MAIN_CONTAINER: &str = planner_api::labels::MAIN_CONTAINER;

/// How a graph lays out its components.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `spec.components[]`, a list keyed by `name` (`nvidia.com/v1beta1`).
    Components,
    /// `spec.services`, a map from name to spec (`nvidia.com/v1alpha1`).
    Services,
}

impl Shape {
    /// The API version whose schema has this layout.
    pub fn version(self) -> &'static str {
        match self {
            Self::Components => "v1beta1",
            Self::Services => "v1alpha1",
        }
    }

    /// The graph resource at [`Shape::version`].
    pub fn api_resource(self) -> ApiResource {
        graph_resource(self.version())
    }

    /// The field that holds the components, for messages.
    pub fn field(self) -> &'static str {
        match self {
            Self::Components => "spec.components",
            Self::Services => "spec.services",
        }
    }
}

/// The graph resource (`dynamographdeployments.nvidia.com`) at `version`.
pub fn graph_resource(version: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: version.into(),
        api_version: format!("{GROUP}/{version}"),
        kind: KIND.into(),
        plural: PLURAL.into(),
    }
}

/// The scaling adapter resource (`dynamographdeploymentscalingadapters.nvidia.com`) at `version`.
pub fn adapter_resource(version: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: version.into(),
        api_version: format!("{GROUP}/{version}"),
        kind: ADAPTER_KIND.into(),
        plural: ADAPTER_PLURAL.into(),
    }
}

/// Name of the scaling adapter NVIDIA's operator creates for a component:
/// `<dgd>-<component in lower case>`.
pub fn adapter_name(graph: &str, component: &str) -> String {
    format!("{graph}-{}", component.to_lowercase())
}

/// One component (v1beta1) or service (v1alpha1) of the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphComponent {
    /// Its name: `spec.components[].name`, or the key in `spec.services`.
    pub name: String,
    /// Position in `spec.components` (in name order for `spec.services`).
    pub index: usize,
    /// Its role: `type` (v1beta1), or `subComponentType` when it is `prefill` or `decode`, else
    /// `componentType` (v1alpha1). `None` when unset or not a role this operator knows.
    pub kind: Option<ComponentType>,
    /// Desired replicas, when set.
    pub replicas: Option<i32>,
    /// Whether a scaling adapter owns its replicas.
    pub scaling_adapter: bool,
    /// GPUs of one replica (1 when none is asked for), or the value that is not a positive whole
    /// number.
    pub gpus: Result<u32, BadGpuQuantity>,
    /// The main container's command and arguments (where the model name is read from).
    pub main_args: Vec<String>,
}

/// Where a pool's GPUs per replica were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuSource {
    /// The DGD's current status (`status.components[*].gpusPerReplica`).
    Status,
    /// The main container's `nvidia.com/gpu` limit or request.
    PodResources,
}

/// Replica counts NVIDIA's operator (or this one) reports for a component in
/// `status.components` (v1beta1) or `status.services` (v1alpha1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ComponentCounts {
    /// Replicas that exist.
    pub replicas: Option<i32>,
    /// Replicas that are ready (`readyReplicas`; upstream leaves it out for some workloads).
    pub ready: Option<i32>,
    /// Replicas that are available (`availableReplicas`; likewise optional upstream).
    pub available: Option<i32>,
    /// Replicas that run the current spec (`updatedReplicas`).
    pub updated: Option<i32>,
    /// GPUs one replica holds, sidecars and DRA claims included (`gpusPerReplica`, which
    /// NVIDIA's operator publishes since Dynamo 1.6); `None` when not reported or not a whole
    /// number above 0.
    pub gpus_per_replica: Option<u32>,
    /// GPUs one engine of a replica uses (`gpusPerEngine`); likewise.
    pub gpus_per_engine: Option<u32>,
}

impl ComponentCounts {
    /// Replicas serving: available when reported and non-zero, else ready.
    pub fn serving(&self) -> Option<i32> {
        match (self.available, self.ready) {
            (Some(available), _) if available > 0 => Some(available),
            (_, Some(ready)) => Some(ready),
            (available, None) => available,
        }
    }
}

/// A DynamoGraphDeployment as the planner sees it, whichever version it was read at.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetGraph {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// The version it was read at (`v1beta1` or `v1alpha1`), where it is written.
    pub version: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Layout of the spec.
    pub shape: Shape,
    /// The components, in `spec.components` order (by name for `spec.services`).
    pub components: Vec<GraphComponent>,
    /// `status.conditions[type=Ready].status == "True"`, when the condition is there.
    pub ready: Option<bool>,
    /// `status.observedGeneration`: the generation the status describes.
    pub observed_generation: Option<i64>,
    /// `status.rollingUpdate.phase` (NVIDIA's: `Pending`, `InProgress`, `Completed`, `Failed`).
    pub rollout_phase: Option<String>,
    /// `status.components` (or, read at v1alpha1, `status.services`), by component name.
    pub status_components: BTreeMap<String, ComponentCounts>,
    /// The graph's KV-transfer topology: `spec.experimental.kvTransferPolicy`, or a frontend's
    /// `kvCacheTransferTopology` (this operator's DGD).
    pub kv_transfer: Option<KvTransferStatus>,
}

/// Why an object cannot be read as a DynamoGraphDeployment: the field and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ShapeError {
    /// The field, as the API server names fields.
    pub field: String,
    /// What is wrong, and what is allowed.
    pub problem: String,
}

fn shape_error(field: impl Into<String>, problem: impl Into<String>) -> ShapeError {
    ShapeError {
        field: field.into(),
        problem: problem.into(),
    }
}

impl TargetGraph {
    /// Reads an object of either version.
    pub fn from_object(object: &DynamicObject) -> Result<Self, ShapeError> {
        let meta = Meta {
            name: object.metadata.name.clone().unwrap_or_default(),
            namespace: object.metadata.namespace.clone().unwrap_or_default(),
            api_version: object
                .types
                .as_ref()
                .map(|t| t.api_version.clone())
                .unwrap_or_default(),
            generation: object.metadata.generation,
        };
        Self::from_parts(meta, &object.data)
    }

    /// Reads a whole object (`metadata`, `spec`, `status`) given as JSON.
    pub fn from_value(value: &Value) -> Result<Self, ShapeError> {
        let text = |pointer: &str| {
            value
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let meta = Meta {
            name: text("/metadata/name"),
            namespace: text("/metadata/namespace"),
            api_version: text("/apiVersion"),
            generation: value.pointer("/metadata/generation").and_then(Value::as_i64),
        };
        Self::from_parts(meta, value)
    }

    fn from_parts(meta: Meta, data: &Value) -> Result<Self, ShapeError> {
        let Meta {
            name,
            namespace,
            api_version,
            generation,
        } = meta;
        let spec = data.get("spec").unwrap_or(&Value::Null);
        let (shape, components) = match (spec.get("components"), spec.get("services")) {
            (Some(Value::Array(list)), _) => (Shape::Components, components_of_list(list)?),
            (_, Some(Value::Object(map))) => (Shape::Services, components_of_map(map)?),
            (Some(other), _) => {
                return Err(shape_error(
                    "spec.components",
                    format!(
                        "{} is not a list; allowed: a list of components (nvidia.com/v1beta1)",
                        kind_of(other)
                    ),
                ));
            }
            (None, Some(other)) => {
                return Err(shape_error(
                    "spec.services",
                    format!(
                        "{} is not a map; allowed: a map of service name to spec (nvidia.com/v1alpha1)",
                        kind_of(other)
                    ),
                ));
            }
            (None, None) => {
                return Err(shape_error(
                    "spec",
                    "has neither components (a list, nvidia.com/v1beta1) nor services (a map, nvidia.com/v1alpha1)",
                ));
            }
        };
        let status = data.get("status").unwrap_or(&Value::Null);
        let ready = status
            .get("conditions")
            .and_then(Value::as_array)
            .and_then(|conditions| {
                conditions
                    .iter()
                    .find(|c| c.get("type") == Some(&Value::from("Ready")))
            })
            .map(|c| c.get("status") == Some(&Value::from("True")));
        let status_components = status
            .get("components")
            .or_else(|| status.get("services"))
            .and_then(Value::as_object)
            .map(|map| {
                map.iter()
                    .map(|(name, counts)| {
                        let count = |field: &str| {
                            counts
                                .get(field)
                                .and_then(Value::as_i64)
                                .and_then(|n| i32::try_from(n).ok())
                        };
                        let positive = |field: &str| {
                            counts
                                .get(field)
                                .and_then(Value::as_u64)
                                .and_then(|n| u32::try_from(n).ok())
                                .filter(|n| *n > 0)
                        };
                        (
                            name.clone(),
                            ComponentCounts {
                                replicas: count("replicas"),
                                ready: count("readyReplicas"),
                                available: count("availableReplicas"),
                                updated: count("updatedReplicas"),
                                gpus_per_replica: positive("gpusPerReplica"),
                                gpus_per_engine: positive("gpusPerEngine"),
                            },
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        // Read at a served version, the layout says which; an object given as JSON without an
        // apiVersion (tests) is written where its layout belongs.
        let version = api_version
            .strip_prefix(&format!("{GROUP}/"))
            .filter(|v| VERSIONS.contains(v))
            .unwrap_or(shape.version())
            .to_string();
        Ok(Self {
            name,
            namespace,
            version,
            generation,
            shape,
            kv_transfer: kv_transfer(spec, &components),
            components,
            ready,
            observed_generation: status.get("observedGeneration").and_then(Value::as_i64),
            rollout_phase: status
                .pointer("/rollingUpdate/phase")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty())
                .map(String::from),
            status_components,
        })
    }

    /// The graph resource at the version it was read at, where it is written.
    pub fn resource(&self) -> ApiResource {
        graph_resource(&self.version)
    }

    /// Whether the status describes the current spec: `status.observedGeneration` is at least
    /// `metadata.generation` (when both are reported).
    pub fn generation_observed(&self) -> bool {
        match (self.generation, self.observed_generation) {
            (Some(generation), Some(observed)) => observed >= generation,
            _ => true,
        }
    }

    /// Whether NVIDIA's operator reports a rolling update under way (`Pending` or `InProgress`).
    pub fn rolling_out(&self) -> bool {
        matches!(self.rollout_phase.as_deref(), Some("Pending" | "InProgress"))
    }

    /// The components that run upstream Dynamo's own planner (`type: planner`, v1alpha1
    /// `componentType: planner`) with replicas above zero.
    pub fn running_planners(&self) -> Vec<&GraphComponent> {
        self.components
            .iter()
            .filter(|c| c.kind == Some(ComponentType::Planner) && c.replicas.is_none_or(|r| r > 0))
            .collect()
    }

    /// The component named `name`.
    pub fn component(&self, name: &str) -> Option<&GraphComponent> {
        self.components.iter().find(|c| c.name == name)
    }

    /// GPUs one replica of `component` holds, and where the count comes from: the status's
    /// `gpusPerReplica` when reported and current (the status describes this generation), which
    /// counts what pod resources cannot (a sidecar's GPU, a DRA claim); else the main
    /// container's resources (1 when it asks for none). `None` for a component not in the spec.
    pub fn gpus_per_replica(&self, component: &str) -> Option<(Result<u32, BadGpuQuantity>, GpuSource)> {
        let from_status = self
            .status_components
            .get(component)
            .and_then(|counts| counts.gpus_per_replica)
            .filter(|_| self.generation_observed() && self.observed_generation.is_some());
        let spec = self.component(component)?;
        Some(match from_status {
            Some(gpus) => (Ok(gpus), GpuSource::Status),
            None => (spec.gpus.clone(), GpuSource::PodResources),
        })
    }

    /// Replicas of `component` serving, from `status.components`; `None` when not reported.
    pub fn serving(&self, component: &str) -> Option<u32> {
        self.status_components
            .get(component)
            .and_then(ComponentCounts::serving)
            .map(|n| u32::try_from(n).unwrap_or(0))
    }
}

impl TryFrom<&DynamoGraphDeployment> for TargetGraph {
    type Error = ShapeError;

    /// Reads this operator's typed DGD (v1beta1) through the same path as a served object.
    fn try_from(dgd: &DynamoGraphDeployment) -> Result<Self, ShapeError> {
        let value = serde_json::to_value(dgd).map_err(|e| shape_error("metadata", e.to_string()))?;
        Self::from_value(&value)
    }
}

/// What identifies the object, beside its spec and status.
struct Meta {
    name: String,
    namespace: String,
    api_version: String,
    generation: Option<i64>,
}

/// The graph's KV-transfer topology: NVIDIA's `spec.experimental.kvTransferPolicy` (the same at
/// both versions), else a frontend's `kvCacheTransferTopology` (this operator's DGD) in that shape.
fn kv_transfer(spec: &Value, components: &[GraphComponent]) -> Option<KvTransferStatus> {
    let text = |value: &Value, key: &str| value.get(key).and_then(Value::as_str).map(String::from);
    let enforcement = |value: Option<String>, fallback: Enforcement| match value.as_deref() {
        Some("preferred" | "fallback") => Enforcement::Preferred,
        Some("required" | "fail") => Enforcement::Required,
        _ => fallback,
    };
    if let Some(policy) = spec.pointer("/experimental/kvTransferPolicy") {
        return Some(KvTransferStatus {
            domain: text(policy, "domain")?,
            enforcement: enforcement(text(policy, "enforcement"), Enforcement::Required),
            label_key: text(policy, "labelKey"),
            cluster_topology_name: text(policy, "clusterTopologyName"),
            preferred_weight: policy.get("preferredWeight").and_then(Value::as_f64),
            field: "spec.experimental.kvTransferPolicy".into(),
        });
    }
    let list = spec.get("components").and_then(Value::as_array)?;
    let (index, settings) = list.iter().enumerate().find_map(|(index, component)| {
        component
            .get("kvCacheTransferTopology")
            .filter(|s| s.is_object())
            .map(|s| (index, s))
    })?;
    let label = text(settings, "label");
    Some(KvTransferStatus {
        domain: text(settings, "level")?,
        enforcement: enforcement(text(settings, "mismatchPolicy"), Enforcement::Required),
        cluster_topology_name: if label.is_none() {
            spec.pointer("/topologyConstraint/clusterTopologyName")
                .and_then(Value::as_str)
                .map(String::from)
        } else {
            None
        },
        label_key: label,
        preferred_weight: settings.get("kvTransferWeight").and_then(Value::as_f64),
        field: format!(
            "spec.components[{index}].kvCacheTransferTopology ({})",
            components.get(index).map(|c| c.name.as_str()).unwrap_or_default()
        ),
    })
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

fn component_type(text: &str) -> Option<ComponentType> {
    Some(match text {
        "frontend" => ComponentType::Frontend,
        "worker" => ComponentType::Worker,
        "prefill" => ComponentType::Prefill,
        "decode" => ComponentType::Decode,
        "planner" => ComponentType::Planner,
        "epp" => ComponentType::Epp,
        _ => return None,
    })
}

/// `replicas` of a component: absent, or an integer from 0 to 2^31 - 1.
fn replicas(field: &str, value: Option<&Value>) -> Result<Option<i32>, ShapeError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(number) => number
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .filter(|n| *n >= 0)
            .map(Some)
            .ok_or_else(|| {
                shape_error(
                    field,
                    format!("{number} is not allowed; allowed: an integer >= 0"),
                )
            }),
    }
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

/// The command and arguments of a container given as JSON.
fn container_args(container: &Value) -> Vec<String> {
    let mut args = strings(container.get("command"));
    args.extend(strings(container.get("args")));
    args
}

/// A resource quantity as text (the API server may hand back a number for an integer quantity).
fn quantity(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

/// A GPU quantity that is not a whole number, 1 or more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{quantity:?} is not a whole number of GPUs, 1 or more")]
pub struct BadGpuQuantity {
    /// The quantity as written.
    pub quantity: String,
}

/// GPUs of one replica from a quantity: a whole number, 1 or more.
pub fn parse_gpus(quantity: &str) -> Result<u32, BadGpuQuantity> {
    quantity
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|gpus| *gpus > 0)
        .ok_or_else(|| BadGpuQuantity {
            quantity: quantity.to_string(),
        })
}

/// GPUs from a Kubernetes container's `resources`: the `nvidia.com/gpu` limit, then request.
fn container_gpus(container: &Value) -> Option<String> {
    let resources = container.get("resources")?;
    ["limits", "requests"]
        .iter()
        .find_map(|kind| resources.get(kind)?.get(GPU_RESOURCE).and_then(quantity))
}

fn components_of_list(list: &[Value]) -> Result<Vec<GraphComponent>, ShapeError> {
    list.iter()
        .enumerate()
        .map(|(index, component)| {
            let field = |name: &str| format!("spec.components[{index}].{name}");
            let name = component
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| shape_error(field("name"), "missing; allowed: the component's name"))?
                .to_string();
            let main = component
                .pointer("/podTemplate/spec/containers")
                .and_then(Value::as_array)
                .and_then(|containers| {
                    containers
                        .iter()
                        .find(|c| c.get("name") == Some(&Value::from(MAIN_CONTAINER)))
                });
            Ok(GraphComponent {
                kind: component
                    .get("type")
                    .and_then(Value::as_str)
                    .and_then(component_type),
                replicas: replicas(&field("replicas"), component.get("replicas"))?,
                // v1beta1: the field's presence opts in, even as `{}`.
                scaling_adapter: component.get("scalingAdapter").is_some_and(|a| !a.is_null()),
                gpus: main.and_then(container_gpus).map_or(Ok(1), |q| parse_gpus(&q)),
                main_args: main.map(container_args).unwrap_or_default(),
                name,
                index,
            })
        })
        .collect()
}

fn components_of_map(map: &serde_json::Map<String, Value>) -> Result<Vec<GraphComponent>, ShapeError> {
    map.iter()
        .enumerate()
        .map(|(index, (name, service))| {
            let field = |path: &str| format!("spec.services.{name}.{path}");
            let text = |key: &str| service.get(key).and_then(Value::as_str);
            let kind = text("subComponentType")
                .and_then(component_type)
                .filter(|k| matches!(k, ComponentType::Prefill | ComponentType::Decode))
                .or_else(|| text("componentType").and_then(component_type));
            // v1alpha1: `resources.limits.gpu` (then requests), or the main container's
            // `nvidia.com/gpu` in `extraPodSpec.mainContainer`.
            let main = service.pointer("/extraPodSpec/mainContainer");
            let gpus = ["/resources/limits/gpu", "/resources/requests/gpu"]
                .iter()
                .find_map(|pointer| service.pointer(pointer).and_then(quantity))
                .or_else(|| main.and_then(container_gpus));
            Ok(GraphComponent {
                name: name.clone(),
                index,
                kind,
                replicas: replicas(&field("replicas"), service.get("replicas"))?,
                scaling_adapter: service.pointer("/scalingAdapter/enabled") == Some(&Value::Bool(true)),
                gpus: gpus.map_or(Ok(1), |q| parse_gpus(&q)),
                main_args: main.map(container_args).unwrap_or_default(),
            })
        })
        .collect()
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{GROUP}/{}", self.version())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> DynamoGraphDeployment {
        serde_yaml::from_str(include_str!("../../config/samples/dgd-disagg.yaml")).unwrap()
    }

    #[test]
    fn v1beta1_components_are_read_in_order() {
        let graph = TargetGraph::try_from(&sample()).unwrap();
        assert_eq!(graph.shape, Shape::Components);
        assert_eq!(graph.name, "llama-disagg");
        let names: Vec<(&str, Option<ComponentType>, usize)> = graph
            .components
            .iter()
            .map(|c| (c.name.as_str(), c.kind, c.index))
            .collect();
        assert_eq!(
            names,
            [
                ("frontend", Some(ComponentType::Frontend), 0),
                ("prefill", Some(ComponentType::Prefill), 1),
                ("decode", Some(ComponentType::Decode), 2),
            ]
        );
        let decode = graph.component("decode").unwrap();
        assert_eq!(decode.replicas, Some(1));
        assert_eq!(decode.gpus, Ok(1));
        assert!(!decode.scaling_adapter);
        assert!(decode.main_args.contains(&"--served-model-name".to_string()));
        assert_eq!(graph.ready, None);
    }

    #[test]
    fn v1alpha1_services_map_and_nvidia_status() {
        let graph = TargetGraph::from_value(&json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": "g", "namespace": "ns"},
            "spec": {"services": {
                "Frontend": {"componentType": "frontend", "replicas": 1},
                "VllmPrefillWorker": {
                    "componentType": "worker", "subComponentType": "prefill", "replicas": 2,
                    "resources": {"limits": {"gpu": "2"}},
                    "scalingAdapter": {"enabled": true},
                    "extraPodSpec": {"mainContainer": {"args": ["--model", "m"]}}
                },
                "VllmDecodeWorker": {
                    "componentType": "worker", "subComponentType": "decode",
                    "scalingAdapter": {},
                    "extraPodSpec": {"mainContainer": {"resources": {"limits": {"nvidia.com/gpu": 4}}}}
                }
            }},
            "status": {
                "state": "successful",
                "conditions": [{"type": "Ready", "status": "True"}],
                "components": {"VllmPrefillWorker": {"componentKind": "PodClique", "replicas": 2, "updatedReplicas": 2, "readyReplicas": 1}}
            }
        }))
        .unwrap();
        assert_eq!(graph.shape, Shape::Services);
        assert_eq!(graph.shape.version(), "v1alpha1");
        let prefill = graph.component("VllmPrefillWorker").unwrap();
        assert_eq!(prefill.kind, Some(ComponentType::Prefill));
        assert_eq!(prefill.replicas, Some(2));
        assert_eq!(prefill.gpus, Ok(2));
        assert!(prefill.scaling_adapter);
        assert_eq!(prefill.main_args, ["--model", "m"]);
        let decode = graph.component("VllmDecodeWorker").unwrap();
        assert_eq!(decode.kind, Some(ComponentType::Decode));
        assert_eq!(decode.replicas, None);
        assert_eq!(decode.gpus, Ok(4));
        // v1alpha1's adapter is off unless enabled: true.
        assert!(!decode.scaling_adapter);
        assert_eq!(graph.ready, Some(true));
        assert_eq!(graph.serving("VllmPrefillWorker"), Some(1));
        assert_eq!(graph.serving("VllmDecodeWorker"), None);
        assert_eq!(adapter_name(&graph.name, &prefill.name), "g-vllmprefillworker");
    }

    #[test]
    fn v1beta1_scaling_adapter_is_a_marker() {
        let mut value = serde_json::to_value(sample()).unwrap();
        value["spec"]["components"][1]["scalingAdapter"] = json!({});
        let graph = TargetGraph::from_value(&value).unwrap();
        assert!(graph.component("prefill").unwrap().scaling_adapter);
        assert!(!graph.component("decode").unwrap().scaling_adapter);
    }

    #[test]
    fn errors_name_the_field() {
        let error = TargetGraph::from_value(&json!({"spec": {}})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "spec: has neither components (a list, nvidia.com/v1beta1) nor services (a map, nvidia.com/v1alpha1)"
        );
        let error =
            TargetGraph::from_value(&json!({"spec": {"components": [{"name": "a", "replicas": -1}]}}))
                .unwrap_err();
        assert_eq!(
            error.to_string(),
            "spec.components[0].replicas: -1 is not allowed; allowed: an integer >= 0"
        );
        let error = TargetGraph::from_value(&json!({"spec": {"services": []}})).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("spec.services: a list is not a map")
        );
        let error =
            TargetGraph::from_value(&json!({"spec": {"components": [{"type": "decode"}]}})).unwrap_err();
        assert_eq!(error.field, "spec.components[0].name");
    }

    /// Upstream's planner examples run it as a `type: planner` (v1alpha1 `componentType:
    /// planner`) component; scaled to zero it no longer runs.
    #[test]
    fn upstream_planner_components_are_found_at_both_versions() {
        let beta = TargetGraph::from_value(&json!({
            "apiVersion": "nvidia.com/v1beta1",
            "metadata": {"name": "g", "namespace": "ns"},
            "spec": {"components": [
                {"name": "Frontend", "type": "frontend"},
                {"name": "Planner", "type": "planner", "replicas": 1},
                {"name": "decode", "type": "decode"}
            ]}
        }))
        .unwrap();
        let names: Vec<&str> = beta.running_planners().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["Planner"]);
        let alpha = TargetGraph::from_value(&json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "metadata": {"name": "g", "namespace": "ns"},
            "spec": {"services": {
                "Planner": {"componentType": "planner"},
                "Idle": {"componentType": "planner", "replicas": 0}
            }}
        }))
        .unwrap();
        let names: Vec<&str> = alpha.running_planners().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["Planner"],
            "no replicas means one; zero replicas does not run"
        );
        assert_eq!(alpha.version, "v1alpha1");
        assert_eq!(beta.resource().version, "v1beta1");
    }

    /// NVIDIA's `kvTransferPolicy` (the same at both versions) and this operator's frontend field
    /// are both reported in NVIDIA's shape.
    #[test]
    fn the_kv_transfer_topology_is_read_in_nvidia_shape() {
        let policy = TargetGraph::from_value(&json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "metadata": {"name": "g", "namespace": "ns"},
            "spec": {
                "experimental": {"kvTransferPolicy": {"clusterTopologyName": "gpu", "domain": "rack", "enforcement": "preferred", "preferredWeight": 0.5}},
                "services": {"decode": {"componentType": "worker", "subComponentType": "decode"}}
            }
        }))
        .unwrap();
        assert_eq!(
            policy.kv_transfer,
            Some(KvTransferStatus {
                domain: "rack".into(),
                enforcement: Enforcement::Preferred,
                label_key: None,
                cluster_topology_name: Some("gpu".into()),
                preferred_weight: Some(0.5),
                field: "spec.experimental.kvTransferPolicy".into(),
            })
        );
        let frontend = TargetGraph::try_from(&sample()).unwrap();
        let kv = frontend.kv_transfer.unwrap();
        assert_eq!(
            (
                kv.domain.as_str(),
                kv.enforcement,
                kv.cluster_topology_name.as_deref()
            ),
            ("zone", Enforcement::Required, Some("gpu-cluster"))
        );
        assert_eq!(kv.field, "spec.components[0].kvCacheTransferTopology (frontend)");
        let mut none = serde_json::to_value(sample()).unwrap();
        none["spec"]["components"][0]
            .as_object_mut()
            .unwrap()
            .remove("kvCacheTransferTopology");
        assert_eq!(TargetGraph::from_value(&none).unwrap().kv_transfer, None);
    }

    #[test]
    fn gpus_per_replica_come_from_a_current_status_else_the_pod_resources() {
        let graph = |observed: i64, status: serde_json::Value| {
            TargetGraph::from_value(&json!({
                "apiVersion": "nvidia.com/v1beta1",
                "kind": "DynamoGraphDeployment",
                "metadata": {"name": "g", "namespace": "ns", "generation": 3},
                "spec": {"components": [{
                    "name": "decode", "type": "decode",
                    "podTemplate": {"spec": {"containers": [{"name": "main",
                        "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
                }]},
                "status": {"observedGeneration": observed, "components": {"decode": status}}
            }))
            .unwrap()
        };
        // A sidecar's GPU (or a DRA claim) the main container's resources do not show.
        let current = graph(3, json!({"replicas": 2, "gpusPerReplica": 5, "gpusPerEngine": 4}));
        assert_eq!(
            current.gpus_per_replica("decode"),
            Some((Ok(5), GpuSource::Status))
        );
        assert_eq!(current.status_components["decode"].gpus_per_engine, Some(4));
        // A status of an earlier generation may describe another pod template.
        let stale = graph(2, json!({"gpusPerReplica": 5}));
        assert_eq!(
            stale.gpus_per_replica("decode"),
            Some((Ok(4), GpuSource::PodResources))
        );
        // Without the fields (NVIDIA's operator before Dynamo 1.6), or with nonsense in them.
        for status in [
            json!({"replicas": 2}),
            json!({"gpusPerReplica": 0}),
            json!({"gpusPerReplica": "x"}),
        ] {
            assert_eq!(
                graph(3, status).gpus_per_replica("decode"),
                Some((Ok(4), GpuSource::PodResources))
            );
        }
        assert_eq!(current.gpus_per_replica("prefill"), None);
    }

    #[test]
    fn counts_prefer_available_then_ready() {
        let counts = |ready, available| ComponentCounts {
            replicas: Some(3),
            ready,
            available,
            updated: Some(3),
            ..ComponentCounts::default()
        };
        assert_eq!(counts(Some(2), Some(3)).serving(), Some(3));
        assert_eq!(counts(Some(2), Some(0)).serving(), Some(2));
        assert_eq!(counts(None, Some(0)).serving(), Some(0));
        assert_eq!(counts(None, None).serving(), None);
        assert_eq!(parse_gpus("2"), Ok(2));
        let bad = |quantity: &str| {
            Err(BadGpuQuantity {
                quantity: quantity.into(),
            })
        };
        assert_eq!(parse_gpus("0"), bad("0"));
        assert_eq!(parse_gpus("half"), bad("half"));
    }
}

//! `DynamoGraphDeployment` (`nvidia.com/v1beta1`): the fields of upstream Dynamo's v1beta1 API
//! that this operator reads or renders (among them NVIDIA's `spec.experimental.kvTransferPolicy`),
//! plus this operator's own frontend field `kvCacheTransferTopology`.
//!
//! Every other upstream field is kept as it is (`x-kubernetes-preserve-unknown-fields`), so a DGD
//! written for Dynamo's own operator round-trips through this one unchanged.

use std::{collections::BTreeMap, fmt};

use k8s_openapi::{
    api::core::v1::{EnvVar, PodTemplateSpec},
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::schema;

/// Pattern of a topology domain name (`zone`, `rack`, `host`, ...), as Grove defines it.
pub const DOMAIN_PATTERN: &str = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$";

/// Pattern of a Kubernetes label key: an optional DNS-subdomain prefix and `/`, then a name of at
/// most 63 characters.
pub const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";

/// A disaggregated (or aggregated) Dynamo inference graph: frontend, workers and their replicas.
// clippy reads the repeated `type_ = ...` of separate printer columns as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "nvidia.com",
    version = "v1beta1",
    kind = "DynamoGraphDeployment",
    plural = "dynamographdeployments",
    singular = "dynamographdeployment",
    shortname = "dgd",
    category = "dynamo",
    namespaced,
    status = "DynamoGraphDeploymentStatus",
    derive = "PartialEq",
    doc = "A Dynamo inference graph: its components, their pod templates and replicas.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Ready condition"
    ),
    printcolumn(
        name = "Backend",
        type_ = "string",
        json_path = ".spec.backendFramework",
        description = "Inference backend"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("self.components.filter(c, has(c.kvCacheTransferTopology)).size() <= 1")
    .message("at most one frontend in spec.components may set kvCacheTransferTopology")
    .field_path(".components"))]
#[x_kube(validation = Rule::new("!has(self.experimental) || !has(self.experimental.kvTransferPolicy) || self.components.all(c, !has(c.kvCacheTransferTopology))")
    .message("set either spec.experimental.kvTransferPolicy or a frontend's kvCacheTransferTopology, not both")
    .field_path(".experimental.kvTransferPolicy"))]
#[x_kube(validation = Rule::new("self.components.all(c, !has(c.kvCacheTransferTopology) || has(c.kvCacheTransferTopology.label)) || (has(self.topologyConstraint) && has(self.topologyConstraint.clusterTopologyName))")
    .message("spec.topologyConstraint.clusterTopologyName is required when kvCacheTransferTopology has no label: name the Grove ClusterTopology whose levels it uses, or set kvCacheTransferTopology.label")
    .field_path(".topologyConstraint"))]
#[schemars(transform = schema::preserve_unknown_fields)]
#[serde(rename_all = "camelCase")]
pub struct DynamoGraphDeploymentSpec {
    /// The graph's components, keyed by name (at most 25, names unique ignoring case).
    #[schemars(length(min = 1, max = 25))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[x_kube(validation = Rule::new("self.all(c, self.exists_one(d, d.name.lowerAscii() == c.name.lowerAscii()))")
        .message("spec.components[].name must be unique, ignoring case"))]
    #[x_kube(validation = Rule::new("self.filter(c, has(c.type) && c.type == 'epp').size() <= 1")
        .message("at most one entry of spec.components may have type epp"))]
    pub components: Vec<Component>,

    /// Topology the graph is placed and routed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_constraint: Option<TopologyConstraint>,

    /// Environment variables set in every component's main container, before its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::strip_descriptions)]
    pub env: Option<Vec<EnvVar>>,

    /// Inference backend the workers run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_framework: Option<BackendFramework>,

    /// Graph-level preview features (NVIDIA's `spec.experimental`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experimental: Option<Experimental>,

    /// Upstream fields this operator does not interpret, kept unchanged.
    #[serde(flatten)]
    #[schemars(skip)]
    pub other: BTreeMap<String, Value>,
}

/// Graph-level preview features, as NVIDIA's DGD names them.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[schemars(transform = schema::preserve_unknown_fields)]
#[serde(rename_all = "camelCase")]
pub struct Experimental {
    /// Keep KV-cache transfers between prefill and decode workers inside one topology domain
    /// (NVIDIA's shape; the same field in both API versions NVIDIA's operator serves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_transfer_policy: Option<KvTransferPolicy>,

    /// Upstream fields this operator does not interpret, kept unchanged.
    #[serde(flatten)]
    #[schemars(skip)]
    pub other: BTreeMap<String, Value>,
}

/// NVIDIA's topology-aware KV-transfer policy of a graph: the domain transfers stay in, where a
/// worker's domain comes from (a node label, or the levels of a Grove ClusterTopologyBinding) and
/// how strictly the router keeps to it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("has(self.labelKey) != has(self.clusterTopologyName)")
    .message("exactly one of labelKey or clusterTopologyName is required"))]
#[x_kube(validation = Rule::new("self.enforcement != 'preferred' || has(self.preferredWeight)")
    .message("preferredWeight is required when enforcement is preferred")
    .field_path(".preferredWeight"))]
#[x_kube(validation = Rule::new("!has(self.preferredWeight) || self.enforcement == 'preferred'")
    .message("preferredWeight may only be set when enforcement is preferred")
    .field_path(".preferredWeight"))]
#[serde(rename_all = "camelCase")]
pub struct KvTransferPolicy {
    /// Node label whose value is a worker's domain, e.g. `topology.kubernetes.io/zone`; the
    /// operator copies it onto worker pods after scheduling. Exclusive with
    /// `clusterTopologyName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 317), regex(pattern = LABEL_KEY_PATTERN))]
    pub label_key: Option<String>,

    /// Name of the Grove ClusterTopologyBinding (or, before Grove v0.1.0-alpha.9,
    /// ClusterTopology) whose levels hold `domain`. Exclusive with `labelKey`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub cluster_topology_name: Option<String>,

    /// The topology domain transfers stay in, e.g. `zone` or `rack`.
    #[schemars(length(min = 1, max = 63), regex(pattern = DOMAIN_PATTERN))]
    pub domain: String,

    /// `required`: only decode workers in the prefill worker's domain; `preferred`: any decode
    /// worker, biased towards the domain by `preferredWeight`.
    #[serde(default)]
    pub enforcement: Enforcement,

    /// Strength of the same-domain preference, 0 to 1; set exactly when `enforcement` is
    /// `preferred`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub preferred_weight: Option<f64>,
}

/// How strictly KV-cache transfers keep to the domain (NVIDIA's values).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    /// Only decode workers in the prefill worker's domain.
    #[default]
    Required,
    /// Any decode worker, preferring the prefill worker's domain.
    Preferred,
}

impl Enforcement {
    /// The name used in the spec and in `DYN_KV_TRANSFER_ENFORCEMENT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Required => "required",
            Self::Preferred => "preferred",
        }
    }
}

impl From<MismatchPolicy> for Enforcement {
    /// `fail` keeps transfers in the domain (`required`); `fallback` allows others
    /// (`preferred`).
    fn from(policy: MismatchPolicy) -> Self {
        match policy {
            MismatchPolicy::Fail => Self::Required,
            MismatchPolicy::Fallback => Self::Preferred,
        }
    }
}

impl From<Enforcement> for MismatchPolicy {
    fn from(enforcement: Enforcement) -> Self {
        match enforcement {
            Enforcement::Required => Self::Fail,
            Enforcement::Preferred => Self::Fallback,
        }
    }
}

/// One component of the graph, rendered as one workload.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.kvCacheTransferTopology) || (has(self.type) && self.type == 'frontend')")
    .message("kvCacheTransferTopology is allowed only on a component with type: frontend")
    .field_path(".kvCacheTransferTopology"))]
#[schemars(transform = schema::preserve_unknown_fields)]
#[serde(rename_all = "camelCase")]
pub struct Component {
    /// Component name, unique in the graph; used in workload names and the
    /// `nvidia.com/dynamo-component` label.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$")
    )]
    pub name: String,

    /// Role of the component: `frontend`, `worker` (aggregated), `prefill`, `decode`, `planner`
    /// or `epp`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<ComponentType>,

    /// Desired replicas. Defaults to 1; the planner sets it for the prefill and decode pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,

    /// Pod template of the component. The container named `main` runs the component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::strip_descriptions)]
    pub pod_template: Option<PodTemplateSpec>,

    /// Keep KV-cache transfers from prefill to decode workers inside one topology domain
    /// (frontend components only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_transfer_topology: Option<KvCacheTransferTopology>,

    /// Upstream fields this operator does not interpret, kept unchanged.
    #[serde(flatten)]
    #[schemars(skip)]
    pub other: BTreeMap<String, Value>,
}

/// Role of a component.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum ComponentType {
    /// HTTP frontend and router.
    Frontend,
    /// Aggregated worker (prefill and decode in one engine).
    Worker,
    /// Prefill worker of a disaggregated graph.
    Prefill,
    /// Decode worker of a disaggregated graph.
    Decode,
    /// Dynamo's own planner.
    Planner,
    /// Endpoint picker of the Gateway API inference extension.
    Epp,
}

impl ComponentType {
    /// The name used in the spec and in the `nvidia.com/dynamo-component-type` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Frontend => "frontend",
            Self::Worker => "worker",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
            Self::Planner => "planner",
            Self::Epp => "epp",
        }
    }

    /// Workers run an inference engine and hold KV cache: they get the topology volume.
    pub fn is_worker(self) -> bool {
        matches!(self, Self::Worker | Self::Prefill | Self::Decode)
    }
}

impl fmt::Display for ComponentType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Inference backend.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendFramework {
    /// SGLang.
    Sglang,
    /// vLLM.
    Vllm,
    /// TensorRT-LLM.
    Trtllm,
}

/// Placement constraints of the graph.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[schemars(transform = schema::preserve_unknown_fields)]
#[serde(rename_all = "camelCase")]
pub struct TopologyConstraint {
    /// Name of the Grove ClusterTopologyBinding (or, before Grove v0.1.0-alpha.9,
    /// ClusterTopology) whose levels a frontend's `kvCacheTransferTopology` refers to. (In
    /// NVIDIA's DGD this object means Grove topology-aware pod placement.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub cluster_topology_name: Option<String>,

    /// Topology domain all pods are packed into (Grove scheduling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    )]
    pub pack_domain: Option<String>,

    /// Upstream fields this operator does not interpret, kept unchanged.
    #[serde(flatten)]
    #[schemars(skip)]
    pub other: BTreeMap<String, Value>,
}

/// Constraint on KV-cache transfers between prefill and decode workers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KvCacheTransferTopology {
    /// Topology domain transfers stay in, e.g. `zone` or `rack`: one of the
    /// ClusterTopologyBinding's `spec.levels[].domain` (or any name when `label` is set).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    )]
    pub level: String,

    /// What the router does when no decode worker is in the prefill worker's domain: `fail`
    /// the request (default) or `fallback` to any decode worker.
    #[serde(default)]
    pub mismatch_policy: MismatchPolicy,

    /// Node label key whose value is the worker's domain, e.g. `topology.kubernetes.io/zone`.
    /// When set, no Grove ClusterTopologyBinding is needed: the operator copies the node's label
    /// onto worker pods after scheduling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 317),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
        )
    )]
    pub label: Option<String>,

    /// Weight of the soft transfer-cost term in the router's decode cost (future soft routing).
    /// At least 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub kv_transfer_weight: Option<f64>,
}

/// Router behaviour when no decode worker shares the prefill worker's domain.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum MismatchPolicy {
    /// Return an error to the client.
    #[default]
    Fail,
    /// Route to a decode worker in another domain.
    Fallback,
}

impl MismatchPolicy {
    /// The name used in the spec and in `DYN_ROUTER_KV_TRANSFER_MISMATCH_POLICY`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "fail",
            Self::Fallback => "fallback",
        }
    }
}

/// Observed state of the graph.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[schemars(transform = schema::preserve_unknown_fields)]
#[serde(rename_all = "camelCase")]
pub struct DynamoGraphDeploymentStatus {
    /// `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (every component has its desired replicas available) and `TopologyResolved`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
    /// Replica counts per component name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub components: BTreeMap<String, ComponentReplicaStatus>,
    /// Upstream status fields this operator does not write, kept unchanged.
    #[serde(flatten)]
    #[schemars(skip)]
    pub other: BTreeMap<String, Value>,
}

/// Replica counts of one component's workload.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[schemars(transform = schema::preserve_unknown_fields)]
#[serde(rename_all = "camelCase")]
pub struct ComponentReplicaStatus {
    /// Pods that exist.
    #[serde(default)]
    pub replicas: i32,
    /// Pods that are ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Pods that have been ready for the workload's minReadySeconds.
    #[serde(default)]
    pub available_replicas: i32,
    /// Pods that run the current pod template.
    #[serde(default)]
    pub updated_replicas: i32,
    /// Upstream fields this operator does not write, kept unchanged.
    #[serde(flatten)]
    #[schemars(skip)]
    pub other: BTreeMap<String, Value>,
}

//! Reconcilers. Each reconcile runs in the same order: fetch what it needs, validate, build the
//! desired objects (pure), apply them with server-side apply, write status when it changed.

use std::sync::Arc;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use kube::{
    Client,
    runtime::{events::Recorder, reflector::Store},
};

use crate::metrics::operator::OperatorMetrics;

pub mod conditions;
pub mod dgd;
pub mod lookup;
pub mod planner_policy;
pub mod topology_labels;

/// Field manager of every object and status this operator writes.
pub const FIELD_MANAGER: &str = "planner-operator";

/// What every reconcile needs.
#[derive(Clone)]
pub struct Context {
    /// API client.
    pub client: Client,
    /// Event publisher.
    pub recorder: Recorder,
    /// Operator metrics.
    pub metrics: Arc<OperatorMetrics>,
    /// Cache of the Deployments this operator renders (trimmed to metadata and status).
    pub deployments: Store<Deployment>,
    /// Cache of the pods of DGD components (trimmed to labels, the topology annotation and
    /// `spec.nodeName`).
    pub pods: Store<Pod>,
    /// Where Grove's ClusterTopologies are served.
    pub cluster_topology_api: lookup::ClusterTopologyApi,
}

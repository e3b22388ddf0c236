//! Reconcilers. Each reconcile runs as named steps in the order they run: fetch what it needs,
//! validate (with the functions the admission webhook uses), compute what should be (pure),
//! carry it out, and write status only when it changed. [`common`] holds what they share.

use std::sync::Arc;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use kube::{Client, runtime::reflector::Store};

use crate::{lookup, metrics::operator::OperatorMetrics};

pub mod common;
pub mod conditions;
pub mod dgd;
pub mod gpu_budget;
pub mod planner_policy;
pub mod selection;
pub mod topology_labels;

/// What every reconcile needs.
#[derive(Clone)]
pub struct Context {
    /// API client.
    pub client: Client,
    /// Event publisher.
    pub recorder: common::Events,
    /// Operator metrics.
    pub metrics: Arc<OperatorMetrics>,
    /// Cache of the Deployments this operator renders (trimmed to metadata and status).
    pub deployments: Store<Deployment>,
    /// Cache of the pods of DGD components (trimmed to labels, the topology annotation and
    /// `spec.nodeName`).
    pub pods: Store<Pod>,
    /// Where Grove's ClusterTopologyBindings and ClusterTopologies are served.
    pub cluster_topology_api: lookup::ClusterTopologyApi,
    /// Which DGDs the DGD reconciler renders.
    pub dgd_selection: selection::DgdSelection,
    /// The topology env contract of DGDs that do not pick one by annotation.
    pub topology_env: crate::topology::EnvContract,
}

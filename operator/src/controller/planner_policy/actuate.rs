//! The actuate step: carry a decision out through the policy's connector. Both connectors
//! implement [`Connector`]; a failure is reported in status and retried at the next interval,
//! never an error of the reconcile.

use std::{future::Future, time::Duration};

use kube::Api;
use tracing::warn;

use planner_api::DynamoGraphDeployment;

use crate::{
    connector::{
        kubernetes,
        virtual_etcd::{Published, VirtualConnector, VirtualError},
    },
    controller::{common::chain, conditions},
};

/// Bound on one etcd exchange of the virtual connector (connect, or one publish).
pub const ETCD_TIMEOUT: Duration = Duration::from_secs(10);

/// Condition type of the DGD's readiness, as its operator writes it.
const DGD_READY: &str = "Ready";

/// A decision to carry out.
pub struct ScaleRequest<'a> {
    /// Replicas wanted (prefill, decode).
    pub target: (u32, u32),
    /// The components of the two pools.
    pub components: (&'a str, &'a str),
    /// The target as last read.
    pub dgd: &'a DynamoGraphDeployment,
}

/// What happened to a decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Actuation {
    /// The replicas were changed (with the decision id, for the virtual connector).
    Scaled {
        /// The published decision's id.
        decision_id: Option<i64>,
    },
    /// Nothing needed changing.
    Unchanged,
    /// Not carried out now, for the reason given; retried at the next interval.
    Deferred(String),
    /// The connector failed, for the reason given; retried at the next interval.
    Failed(String),
}

/// Carries decisions out.
pub trait Connector {
    /// Sets the pools to `request.target`.
    fn scale(&mut self, request: &ScaleRequest<'_>) -> impl Future<Output = Actuation> + Send;
}

/// Whether a change may go through now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Yes.
    Open,
    /// Not while the target is not Ready.
    Closed,
}

/// Scales the DGD's components (see [`kubernetes`]); `gate` says whether the change may go
/// through while the DGD is not Ready.
pub struct KubernetesConnector {
    /// The DGDs of the policy's namespace.
    pub api: Api<DynamoGraphDeployment>,
    /// Whether to scale now.
    pub gate: Gate,
}

impl Connector for KubernetesConnector {
    async fn scale(&mut self, request: &ScaleRequest<'_>) -> Actuation {
        if self.gate == Gate::Closed {
            return Actuation::Deferred("target not Ready, scaling deferred".into());
        }
        let targets = [
            (request.components.0, request.target.0),
            (request.components.1, request.target.1),
        ];
        match kubernetes::set_replicas(&self.api, request.dgd, &targets).await {
            Ok(true) => Actuation::Scaled { decision_id: None },
            Ok(false) => Actuation::Unchanged,
            Err(error) => {
                let reason = chain(&error);
                warn!(error = %reason, "cannot scale the target");
                Actuation::Failed(format!("scaling failed: {reason}"))
            }
        }
    }
}

/// Publishes decisions through etcd (see [`crate::connector::virtual_etcd`]); connects on first
/// use and keeps the connection and the protocol state between intervals.
pub struct EtcdConnector {
    endpoints: Vec<String>,
    dynamo_namespace: String,
    decision_timeout: Duration,
    connection: Option<VirtualConnector>,
}

impl EtcdConnector {
    /// A connector that will publish under `v1/<dynamo_namespace>/planner/`.
    pub fn new(endpoints: Vec<String>, dynamo_namespace: String, decision_timeout: Duration) -> Self {
        Self {
            endpoints,
            dynamo_namespace,
            decision_timeout,
            connection: None,
        }
    }

    async fn publish(&mut self, prefill: u32, decode: u32) -> Result<Published, VirtualError> {
        let mut connection = match self.connection.take() {
            Some(connection) => connection,
            // Bounded, so an unreachable etcd holds neither the reconcile nor shutdown.
            None => tokio::time::timeout(
                ETCD_TIMEOUT,
                VirtualConnector::connect(
                    &self.endpoints,
                    &self.dynamo_namespace,
                    self.decision_timeout,
                    ETCD_TIMEOUT,
                ),
            )
            .await
            .unwrap_or(Err(VirtualError::Timeout(ETCD_TIMEOUT)))?,
        };
        let published = tokio::time::timeout(ETCD_TIMEOUT, connection.publish(prefill, decode))
            .await
            .unwrap_or(Err(VirtualError::Timeout(ETCD_TIMEOUT)));
        // Keep the protocol state unless etcd could not be reached (then reconnect and reload).
        if !matches!(published, Err(VirtualError::Etcd(_) | VirtualError::Timeout(_))) {
            self.connection = Some(connection);
        }
        published
    }
}

impl Connector for EtcdConnector {
    async fn scale(&mut self, request: &ScaleRequest<'_>) -> Actuation {
        match self.publish(request.target.0, request.target.1).await {
            Ok(Published::Decision(id)) => Actuation::Scaled {
                decision_id: Some(id),
            },
            Ok(Published::Waiting { decision_id }) => Actuation::Deferred(format!(
                "waiting for the orchestrator to acknowledge decision {decision_id}"
            )),
            Ok(Published::Unchanged) => Actuation::Unchanged,
            Err(error) => Actuation::Failed(format!("etcd: {}", chain(&error))),
        }
    }
}

/// Whether the DGD's `Ready` condition is true.
pub fn is_ready(dgd: &DynamoGraphDeployment) -> bool {
    dgd.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, DGD_READY))
        .is_some_and(|c| c.status == "True")
}

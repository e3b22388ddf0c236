//! The actuate step: carry a decision out through the policy's connector. Both connectors
//! implement [`Connector`]; a failure is reported in status and retried at the next interval,
//! never an error of the reconcile.

use std::{future::Future, time::Duration};

use kube::Client;
use tracing::warn;

use crate::{
    connector::{
        kubernetes::{self, Adapters},
        virtual_etcd::{Published, VirtualConnector, VirtualError},
    },
    controller::common::chain,
    target::TargetGraph,
};

/// Bound on one etcd exchange of the virtual connector (connect, or one publish).
pub const ETCD_TIMEOUT: Duration = Duration::from_secs(10);

/// A decision to carry out.
pub struct ScaleRequest<'a> {
    /// Replicas wanted (prefill, decode).
    pub target: (u32, u32),
    /// The components of the two pools.
    pub components: (&'a str, &'a str),
    /// The target as last read.
    pub graph: &'a TargetGraph,
}

impl ScaleRequest<'_> {
    /// Each component once with its replicas: an aggregated graph's one worker component is
    /// both pools, set to the decode pool's replicas.
    pub fn targets(&self) -> Vec<(&str, u32)> {
        if self.components.0 == self.components.1 {
            vec![(self.components.1, self.target.1)]
        } else {
            vec![
                (self.components.0, self.target.0),
                (self.components.1, self.target.1),
            ]
        }
    }
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

/// Scales the DGD's components, through their scaling adapters where they have one (see
/// [`kubernetes`]). Whether a change may go through while the target is not Ready is the
/// planning loop's ready gate, decided before.
pub struct KubernetesConnector {
    /// API client.
    pub client: Client,
    /// The pools' scaling adapters, as last read.
    pub adapters: Adapters,
}

impl Connector for KubernetesConnector {
    async fn scale(&mut self, request: &ScaleRequest<'_>) -> Actuation {
        match kubernetes::set_replicas(&self.client, request.graph, &self.adapters, &request.targets()).await
        {
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

/// Whether the target is Ready, as upstream Dynamo's planner judges it, from what the operator
/// that renders it reports (NVIDIA's or this one's): its `Ready` condition when written (else,
/// per pool component, the replicas serving in `status.components` or `status.services` against
/// those asked for; no status at all: not Ready), and only when that status describes the
/// current spec (`status.observedGeneration` caught up with `metadata.generation`) and no
/// rolling update is `Pending` or `InProgress`. A pool scaled through a scaling adapter is also
/// not Ready until the adapter has carried its `spec.replicas` to the DGD (`status.replicas`
/// equal to it).
pub fn is_ready(graph: &TargetGraph, pools: (&str, &str), adapters: &Adapters) -> bool {
    if !graph.generation_observed() || graph.rolling_out() {
        return false;
    }
    let synced = [pools.0, pools.1]
        .iter()
        .all(|c| adapters.get(*c).is_none_or(kubernetes::AdapterScale::synced));
    let graph_ready = match graph.ready {
        Some(ready) => ready,
        None => [pools.0, pools.1].iter().all(|name| {
            let asked = adapters.get(*name).map_or_else(
                || {
                    graph
                        .component(name)
                        .and_then(|c| c.replicas)
                        .map_or(1, |r| u32::try_from(r).unwrap_or(0))
                },
                |a| a.spec_replicas,
            );
            graph.serving(name).is_some_and(|serving| serving >= asked)
        }),
    };
    synced && graph_ready
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connector::kubernetes::AdapterScale;
    use serde_json::json;

    fn graph(status: serde_json::Value) -> TargetGraph {
        TargetGraph::from_value(&json!({
            "metadata": {"name": "g", "namespace": "ns"},
            "spec": {"components": [
                {"name": "prefill", "type": "prefill", "replicas": 2},
                {"name": "decode", "type": "decode", "replicas": 1}
            ]},
            "status": status
        }))
        .unwrap()
    }

    #[test]
    fn an_aggregated_worker_is_set_once_to_the_decode_replicas() {
        let graph = graph(json!({}));
        let request = |components| ScaleRequest {
            target: (3, 4),
            components,
            graph: &graph,
        };
        assert_eq!(
            request(("prefill", "decode")).targets(),
            [("prefill", 3), ("decode", 4)]
        );
        assert_eq!(request(("worker", "worker")).targets(), [("worker", 4)]);
    }

    #[test]
    fn readiness_from_nvidia_status_or_component_counts() {
        let pools = ("prefill", "decode");
        let none = Adapters::new();
        assert!(
            !is_ready(&graph(json!(null)), pools, &none),
            "no status: not Ready"
        );
        let ready =
            graph(json!({"state": "successful", "conditions": [{"type": "Ready", "status": "True"}]}));
        assert!(is_ready(&ready, pools, &none));
        let not_ready = graph(
            json!({"conditions": [{"type": "Ready", "status": "False", "reason": "insufficient_capacity"}]}),
        );
        assert!(!is_ready(&not_ready, pools, &none));
        // Without a Ready condition, the counts decide (upstream may omit readyReplicas).
        let counts = |prefill: serde_json::Value| {
            graph(json!({"components": {
                "prefill": prefill,
                "decode": {"componentKind": "Deployment", "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}
            }}))
        };
        assert!(is_ready(
            &counts(
                json!({"componentKind": "PodClique", "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2})
            ),
            pools,
            &none
        ));
        assert!(!is_ready(
            &counts(
                json!({"componentKind": "PodClique", "replicas": 2, "updatedReplicas": 2, "readyReplicas": 1})
            ),
            pools,
            &none
        ));
        assert!(!is_ready(
            &counts(json!({"componentKind": "PodClique", "replicas": 2, "updatedReplicas": 2})),
            pools,
            &none
        ));
    }

    /// A `Ready` condition that describes an older generation, or a rolling update in
    /// progress, is not Ready (what upstream's planner checks before scaling).
    #[test]
    fn readiness_needs_the_current_generation_and_no_rollout() {
        let pools = ("prefill", "decode");
        let none = Adapters::new();
        let at = |generation: i64, observed: i64, phase: &str| {
            let mut graph = graph(json!({
                "observedGeneration": observed,
                "conditions": [{"type": "Ready", "status": "True"}],
                "rollingUpdate": {"phase": phase}
            }));
            graph.generation = Some(generation);
            graph
        };
        assert!(is_ready(&at(3, 3, "Completed"), pools, &none));
        assert!(is_ready(&at(3, 3, ""), pools, &none));
        assert!(is_ready(&at(3, 4, "Failed"), pools, &none));
        assert!(!is_ready(&at(4, 3, "Completed"), pools, &none), "stale status");
        assert!(!is_ready(&at(3, 3, "InProgress"), pools, &none), "rolling update");
        assert!(!is_ready(&at(3, 3, "Pending"), pools, &none), "rolling update");
        // v1alpha1 graphs report their counts in status.services.
        let alpha = TargetGraph::from_value(&json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "metadata": {"name": "g", "namespace": "ns", "generation": 2},
            "spec": {"services": {
                "prefill": {"componentType": "worker", "subComponentType": "prefill", "replicas": 2},
                "decode": {"componentType": "worker", "subComponentType": "decode", "replicas": 1}
            }},
            "status": {"state": "pending", "observedGeneration": 2, "services": {
                "prefill": {"componentKind": "Deployment", "componentName": "g-prefill", "replicas": 2, "updatedReplicas": 2, "readyReplicas": 1},
                "decode": {"componentKind": "Deployment", "componentName": "g-decode", "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1}
            }}
        }))
        .unwrap();
        assert_eq!(alpha.serving("prefill"), Some(1));
        assert!(
            !is_ready(&alpha, pools, &none),
            "one prefill replica of two serving"
        );
    }

    #[test]
    fn an_adapter_not_yet_synced_is_not_ready() {
        let pools = ("prefill", "decode");
        let ready = graph(json!({"conditions": [{"type": "Ready", "status": "True"}]}));
        let mut adapters = Adapters::new();
        adapters.insert(
            "decode".into(),
            AdapterScale {
                name: "g-decode".into(),
                spec_replicas: 3,
                status_replicas: Some(1),
                version: "v1beta1",
            },
        );
        assert!(!is_ready(&ready, pools, &adapters));
        if let Some(adapter) = adapters.get_mut("decode") {
            adapter.status_replicas = Some(3);
        }
        assert!(is_ready(&ready, pools, &adapters));
        // Without a Ready condition, the adapter's replicas are the ones asked for.
        let counts = graph(json!({"components": {
            "prefill": {"replicas": 2, "readyReplicas": 2},
            "decode": {"replicas": 1, "readyReplicas": 1}
        }}));
        assert!(!is_ready(&counts, pools, &adapters));
    }
}

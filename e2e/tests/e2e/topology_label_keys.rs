//! The topology label controller copies only the node labels the pod's DGD resolves: a pod that
//! carries a DGD's graph label and a hand-written topology annotation naming other node labels
//! (hostname, instance type, a ClusterTopology level the DGD does not use) gets none of them.

use std::{collections::BTreeMap, time::Duration};

use e2e::{Result, in_namespace, install_crds, poll_until};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use serde_json::json;

use crate::operator::start;

const GRAPH_LABEL: &str = "nvidia.com/dynamo-graph-deployment-name";
const ZONE: &str = "topology.kubernetes.io/zone";
/// The node label the test's DGD resolves (not the zone: the API server itself copies a bound
/// node's zone onto pods).
const RACK: &str = "nvidia.com/rack";
const WAIT: Duration = Duration::from_secs(120);

fn labels(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.labels.clone().unwrap_or_default()
}

/// A worker pod of graph `graph`, bound to `node`, whose annotation asks for `pairs`.
fn pod(name: &str, graph: &str, node: &str, pairs: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {GRAPH_LABEL: graph, "nvidia.com/dynamo-component-type": "decode"},
            "annotations": {"planner.dynamo.io/topology-labels": pairs}
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "registry.invalid/worker:e2e"}]
        }
    }))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_node_labels_the_dgd_resolves_are_copied() -> Result<()> {
    in_namespace("topology-keys", |ns| async move {
        install_crds(&ns.client).await?;
        // A node with a rack (the fake GPU nodes have one) to bind the pods to.
        let nodes: Api<Node> = Api::all(ns.client.clone());
        let node = nodes
            .list(&ListParams::default().labels(RACK))
            .await?
            .items
            .into_iter()
            .next()
            .ok_or("no node with a zone label")?;
        let node_name = node.metadata.name.clone().ok_or("node name")?;
        let node_labels = node.metadata.labels.clone().unwrap_or_default();
        let rack = node_labels.get(RACK).cloned().ok_or("rack")?;

        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            // The DGD resolves one pair: its frontend names the rack label.
            ns.accepts(&json!({
                "apiVersion": "nvidia.com/v1beta1",
                "kind": "DynamoGraphDeployment",
                "metadata": {"name": "llama"},
                "spec": {"components": [
                    {"name": "frontend", "type": "frontend", "replicas": 1,
                     "kvCacheTransferTopology": {"level": "rack", "label": RACK},
                     "podTemplate": {"spec": {"containers": [{"name": "main", "image": "registry.invalid/frontend:e2e"}]}}},
                    {"name": "decode", "type": "decode", "replicas": 0,
                     "podTemplate": {"spec": {"containers": [{"name": "main", "image": "registry.invalid/worker:e2e"}]}}}
                ]}
            }))
            .await?;
            let pods: Api<Pod> = ns.api();
            // Asks for the rack, and for the node's hostname, zone and instance type under pod
            // labels of its choosing.
            let pairs = format!(
                "{RACK}={RACK},stolen-hostname=kubernetes.io/hostname,stolen-zone={ZONE},nvidia.com/dynamo-topology.rack=node.kubernetes.io/instance-type"
            );
            pods.create(&PostParams::default(), &pod("handmade", "llama", &node_name, &pairs)?)
                .await?;
            // A pod of no DGD gets nothing at all.
            pods.create(
                &PostParams::default(),
                &pod("orphan", "no-such-graph", &node_name, &format!("{RACK}={RACK}"))?,
            )
            .await?;

            poll_until("the resolved rack label on the pod", WAIT, || async {
                Ok(labels(&pods.get("handmade").await?).get(RACK) == Some(&rack))
            })
            .await?;
            // Give the controller time to copy anything else it would.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let handmade = labels(&pods.get("handmade").await?);
            assert!(
                ["stolen-hostname", "stolen-zone", "nvidia.com/dynamo-topology.rack"]
                    .iter()
                    .all(|key| !handmade.contains_key(*key)),
                "labels the DGD does not resolve were copied: {handmade:?}"
            );
            let orphan = labels(&pods.get("orphan").await?);
            assert!(
                !orphan.contains_key(RACK),
                "a pod of no DGD got a topology label: {orphan:?}"
            );
            operator.check_running()
        }
        .await;
        outcome.and(operator.stop().await)
    })
    .await
}

//! The cluster itself: fake GPU nodes with topology labels, Deployments whose pods run on them,
//! and the operator's service-account kubeconfig.

use std::{path::PathBuf, time::Duration};

use e2e::{Result, client, in_namespace, poll_until, wait_for};
use k8s_openapi::api::{
    apps::v1::Deployment,
    authentication::v1::SelfSubjectReview,
    core::v1::{Node, Pod},
};
use kube::{
    Api, Client, Config,
    api::{ListParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;

const FAKE_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

fn is_fake(node: &Node) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(FAKE_NODE_ANNOTATION))
        .is_some_and(|v| v == "fake")
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn fake_gpu_nodes_are_ready_with_topology_labels() -> Result<()> {
    let nodes: Api<Node> = Api::all(client().await?);
    let fake: Vec<Node> = nodes
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(is_fake)
        .collect();
    assert!(fake.len() >= 2, "expected kwok GPU nodes, found {}", fake.len());
    let mut zones = std::collections::BTreeSet::new();
    for node in &fake {
        let name = node.metadata.name.clone().unwrap_or_default();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        for key in [
            "topology.kubernetes.io/zone",
            "nvidia.com/rack",
            "kubernetes.io/hostname",
        ] {
            assert!(labels.contains_key(key), "{name} has no label {key}: {labels:?}");
        }
        assert_eq!(labels["kubernetes.io/hostname"], name);
        zones.insert(labels["topology.kubernetes.io/zone"].clone());
        let gpus = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("nvidia.com/gpu"));
        assert!(
            gpus.is_some_and(|q| q.0 != "0"),
            "{name} has no allocatable nvidia.com/gpu"
        );
        assert!(
            node.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_none_or(Vec::is_empty),
            "{name} is tainted"
        );
        assert!(is_ready(node), "{name} is not Ready");
    }
    assert!(
        zones.len() >= 2,
        "expected nodes in at least two zones, found {zones:?}"
    );
    Ok(())
}

#[tokio::test]
async fn deployment_pods_run_on_kwok_nodes() -> Result<()> {
    in_namespace("deployment", |ns| async move {
        let deployments: Api<Deployment> = ns.api();
        let deployment: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "pause"},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "pause"}},
                "template": {
                    "metadata": {"labels": {"app": "pause"}},
                    // No tolerations and no node selector: the fake nodes are plain nodes.
                    "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]}
                }
            }
        }))?;
        deployments.create(&PostParams::default(), &deployment).await?;
        wait_for(
            &deployments,
            "pause",
            |d: Option<&Deployment>| {
                d.and_then(|d| d.status.as_ref())
                    .and_then(|s| s.available_replicas)
                    == Some(3)
            },
            Duration::from_secs(120),
        )
        .await?;

        let pods: Api<Pod> = ns.api();
        let nodes: Api<Node> = Api::all(ns.client.clone());
        let list = pods.list(&ListParams::default().labels("app=pause")).await?.items;
        assert_eq!(
            list.len(),
            3,
            "pods: {:?}",
            list.iter().map(|p| &p.metadata.name).collect::<Vec<_>>()
        );
        for pod in list {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            assert_eq!(phase.as_deref(), Some("Running"), "pod {name}");
            let node_name = pod
                .spec
                .and_then(|s| s.node_name)
                .expect("a Running pod is bound to a node");
            let node = nodes.get(&node_name).await?;
            assert!(
                is_fake(&node),
                "pod {name} runs on {node_name}, which is not a kwok node"
            );
        }

        // Scaling down removes pods too (kwok's pod-delete stage finishes their deletion).
        deployments
            .patch_scale(
                "pause",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"replicas": 1}})),
            )
            .await?;
        poll_until(
            "the deployment to scale down to one pod",
            Duration::from_secs(60),
            || async {
                Ok(pods
                    .list(&ListParams::default().labels("app=pause"))
                    .await?
                    .items
                    .len()
                    == 1)
            },
        )
        .await
    })
    .await
}

/// The operator's kubeconfig: `E2E_OPERATOR_KUBECONFIG`, or `operator.kubeconfig` next to the
/// file `KUBECONFIG` names (where `make cluster-up` and `make e2e-kind` write it).
fn operator_kubeconfig() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("E2E_OPERATOR_KUBECONFIG") {
        return Some(PathBuf::from(path));
    }
    let admin = PathBuf::from(std::env::var_os("KUBECONFIG")?);
    let path = admin.parent()?.join("operator.kubeconfig");
    path.exists().then_some(path)
}

#[tokio::test]
async fn operator_service_account_kubeconfig_authenticates() -> Result<()> {
    let Some(path) = operator_kubeconfig() else {
        eprintln!("skipped: no operator kubeconfig (set E2E_OPERATOR_KUBECONFIG)");
        return Ok(());
    };
    let kubeconfig = Kubeconfig::read_from(&path)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let operator = Client::try_from(config)?;

    // Who the API server says we are.
    let reviews: Api<SelfSubjectReview> = Api::all(operator.clone());
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let user = review
        .status
        .and_then(|s| s.user_info)
        .expect("the review names the user");
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:planner-operator-system:planner-operator")
    );
    assert!(
        user.groups
            .unwrap_or_default()
            .iter()
            .any(|g| g == "system:serviceaccounts")
    );

    // RBAC is enforced: the service account has no grants yet (the chart adds them).
    let pods: Api<Pod> = Api::namespaced(operator, "kube-system");
    match pods.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{}", status.message),
        other => panic!("listing pods in kube-system as the operator should be forbidden, got {other:?}"),
    }
    Ok(())
}

//! Topology-aware KV-cache transfer on kwok nodes in two zones: the operator, run in
//! this process, renders the topology env and Downward API volume into worker and frontend
//! pods, copies each worker pod's node zone and rack onto it once scheduled, reports per-zone
//! counts in the DGD's `TopologyResolved` condition, warns about nodes without a label, and
//! notices a ClusterTopology deleted after admission.

use std::{collections::BTreeMap, collections::BTreeSet, time::Duration};

use e2e::{Result, TestNamespace, in_namespace, install_crds, poll_until};
use k8s_openapi::api::{
    core::v1::{Container, Node, Pod},
    events::v1::Event,
};
use kube::{Api, api::ListParams};
use planner_api::DynamoGraphDeployment;
use serde_json::{Value, json};

use crate::operator::{ClusterScoped, start};

const GRAPH: &str = "llama";
const GRAPH_LABEL: &str = "nvidia.com/dynamo-graph-deployment-name";
const COMPONENT_LABEL: &str = "nvidia.com/dynamo-component";
const TYPE_LABEL: &str = "nvidia.com/dynamo-component-type";
const ZONE: &str = "topology.kubernetes.io/zone";
const RACK: &str = "nvidia.com/rack";
const WAIT: Duration = Duration::from_secs(120);

/// One component; workers ask for a GPU and spread over zones, so that each pool spans both.
fn component(name: &str, kind: &str, replicas: i32, kv: Option<Value>) -> Value {
    let worker = kind != "frontend";
    let mut container = json!({"name": "main", "image": "registry.invalid/dynamo/vllm-runtime:e2e"});
    if worker {
        container["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
        container["env"] = json!([{"name": "DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL", "value": "a user copy"}]);
    }
    let mut spec = json!({"containers": [container]});
    if worker {
        spec["topologySpreadConstraints"] = json!([{
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {GRAPH_LABEL: GRAPH, COMPONENT_LABEL: name}}
        }]);
    }
    let mut component =
        json!({"name": name, "type": kind, "replicas": replicas, "podTemplate": {"spec": spec}});
    if let Some(kv) = kv {
        component["kvCacheTransferTopology"] = kv;
    }
    component
}

fn graph(cluster_topology: Option<&str>, kv: Value, workers: i32) -> Value {
    let mut dgd = json!({
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": GRAPH},
        "spec": {
            "components": [
                component("frontend", "frontend", 1, Some(kv)),
                component("prefill", "prefill", workers, None),
                component("decode", "decode", workers, None),
            ]
        }
    });
    if let Some(name) = cluster_topology {
        dgd["spec"]["topologyConstraint"] = json!({"clusterTopologyName": name});
    }
    dgd
}

fn topology(name: &str, levels: &[(&str, &str)]) -> Value {
    json!({
        "apiVersion": "grove.io/v1alpha1",
        "kind": "ClusterTopology",
        "metadata": {"name": name},
        "spec": {"levels": levels.iter().map(|(d, k)| json!({"domain": d, "labelKey": k})).collect::<Vec<_>>()}
    })
}

async fn pods(ns: &TestNamespace, kind: &str) -> Result<Vec<Pod>> {
    let api: Api<Pod> = ns.api();
    let selector = format!("{GRAPH_LABEL}={GRAPH},{TYPE_LABEL}={kind}");
    Ok(api
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

fn labels(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.labels.clone().unwrap_or_default()
}

fn node_name(pod: &Pod) -> Option<String> {
    pod.spec.as_ref().and_then(|s| s.node_name.clone())
}

fn main_container(pod: &Pod) -> Container {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == "main").cloned())
        .expect("a main container")
}

fn env(pod: &Pod) -> BTreeMap<String, String> {
    main_container(pod)
        .env
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect()
}

/// Waits until `count` pods of each worker pool are scheduled and carry every label in `keys`.
async fn wait_for_labelled_workers(ns: &TestNamespace, count: usize, keys: &[&str]) -> Result<()> {
    poll_until("worker pods scheduled and labelled", WAIT, move || async move {
        for kind in ["prefill", "decode"] {
            let pods = pods(ns, kind).await?;
            let done = pods.len() == count
                && pods
                    .iter()
                    .all(|p| node_name(p).is_some() && keys.iter().all(|k| labels(p).contains_key(*k)));
            if !done {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await
}

/// Every worker pod's `pod_key` label equals its node's `node_key` label; returns the zones per
/// pool.
async fn check_labels_match_nodes(
    ns: &TestNamespace,
    pairs: &[(&str, &str)],
) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let nodes: Api<Node> = Api::all(ns.client.clone());
    let mut zones = BTreeMap::new();
    for kind in ["prefill", "decode"] {
        for pod in pods(ns, kind).await? {
            let node = nodes.get(&node_name(&pod).ok_or("unscheduled")?).await?;
            let node_labels = node.metadata.labels.unwrap_or_default();
            for (pod_key, node_key) in pairs {
                assert_eq!(
                    labels(&pod).get(*pod_key),
                    node_labels.get(*node_key),
                    "pod {:?} label {pod_key} vs node {:?} label {node_key}",
                    pod.metadata.name,
                    node.metadata.name
                );
            }
            zones
                .entry(kind.to_string())
                .or_insert_with(BTreeSet::new)
                .insert(node_labels.get(ZONE).cloned().unwrap_or_default());
        }
    }
    Ok(zones)
}

/// Worker pods have the topology env (user copies replaced), the Downward API volume with one
/// item per level and its read-only mount; the frontend has the router env.
async fn check_pod_specs(
    ns: &TestNamespace,
    items: &[(&str, &str)],
    frontend_env: &[(&str, &str)],
) -> Result<()> {
    for kind in ["prefill", "decode"] {
        for pod in pods(ns, kind).await? {
            let env = env(&pod);
            assert_eq!(env.get("DYN_TOPOLOGY_ENABLED").map(String::as_str), Some("true"));
            assert_eq!(
                env.get("DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL")
                    .map(String::as_str),
                Some("zone")
            );
            let spec = pod.spec.as_ref().ok_or("pod without spec")?;
            let volume = spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == "topology-labels")
                .ok_or("no topology-labels volume")?;
            let found: Vec<(String, String)> = volume
                .downward_api
                .as_ref()
                .and_then(|d| d.items.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|i| (i.path, i.field_ref.map(|f| f.field_path).unwrap_or_default()))
                .collect();
            let expected: Vec<(String, String)> = items
                .iter()
                .map(|(path, label)| (path.to_string(), format!("metadata.labels['{label}']")))
                .collect();
            assert_eq!(found, expected);
            let mount = main_container(&pod)
                .volume_mounts
                .unwrap_or_default()
                .into_iter()
                .find(|m| m.name == "topology-labels")
                .ok_or("no topology-labels mount")?;
            assert_eq!(mount.mount_path, "/etc/podinfo/topology");
            assert_eq!(mount.read_only, Some(true));
        }
    }
    let frontends = pods(ns, "frontend").await?;
    assert_eq!(frontends.len(), 1);
    let env = env(&frontends[0]);
    for (name, value) in frontend_env {
        assert_eq!(
            env.get(*name).map(String::as_str),
            Some(*value),
            "frontend env {name}"
        );
    }
    assert!(!env.contains_key("DYN_TOPOLOGY_ENABLED"));
    Ok(())
}

/// Waits for the DGD's `TopologyResolved` condition to have `status` and `reason` and a message
/// containing `text`; returns the message.
async fn wait_for_condition(ns: &TestNamespace, status: &str, reason: &str, text: &str) -> Result<String> {
    let api: Api<DynamoGraphDeployment> = ns.api();
    let last = std::sync::Mutex::new(String::new());
    let what = format!("TopologyResolved={status} ({reason}) containing {text:?}");
    let (api, last_ref) = (&api, &last);
    poll_until(&what, WAIT, move || async move {
        let dgd = api.get(GRAPH).await?;
        let condition = dgd
            .status
            .unwrap_or_default()
            .conditions
            .into_iter()
            .find(|c| c.type_ == "TopologyResolved");
        Ok(match condition {
            Some(c) => {
                let matched = c.status == status && c.reason == reason && c.message.contains(text);
                *last_ref.lock().unwrap() = format!("{} {}: {}", c.status, c.reason, c.message);
                matched
            }
            None => false,
        })
    })
    .await
    .map_err(|e| format!("{e}; last condition: {:?}", last.lock().unwrap()))?;
    let message = last.lock().unwrap().clone();
    Ok(message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_get_zone_and_rack_of_their_node_from_the_cluster_topology() -> Result<()> {
    in_namespace("topology-zone", |ns| async move {
        install_crds(&ns.client).await?;
        let topology_name = format!("{}-topology", ns.name);
        let topology = ClusterScoped::create_cluster_topology(
            &ns.client,
            &topology(&topology_name, &[("zone", ZONE), ("rack", RACK)]),
        )
        .await?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            let kv = json!({"level": "zone", "mismatchPolicy": "fallback", "kvTransferWeight": 2.5});
            ns.accepts(&graph(Some(&topology_name), kv, 2)).await?;
            wait_for_labelled_workers(
                &ns,
                2,
                &[
                    "nvidia.com/dynamo-topology.zone",
                    "nvidia.com/dynamo-topology.rack",
                ],
            )
            .await?;
            let zones = check_labels_match_nodes(
                &ns,
                &[
                    ("nvidia.com/dynamo-topology.zone", ZONE),
                    ("nvidia.com/dynamo-topology.rack", RACK),
                ],
            )
            .await?;
            for (pool, zones) in &zones {
                assert_eq!(zones.len(), 2, "{pool} pods should span both zones: {zones:?}");
            }
            check_pod_specs(
                &ns,
                &[
                    ("zone", "nvidia.com/dynamo-topology.zone"),
                    ("rack", "nvidia.com/dynamo-topology.rack"),
                ],
                &[
                    ("DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL", "zone"),
                    ("DYN_ROUTER_KV_TRANSFER_MISMATCH_POLICY", "fallback"),
                    ("DYN_ROUTER_KV_TRANSFER_WEIGHT", "2.5"),
                ],
            )
            .await?;
            let message = wait_for_condition(
                &ns,
                "True",
                "Resolved",
                "worker pods per zone: zone-a 2 (prefill 1, decode 1), zone-b 2 (prefill 1, decode 1)",
            )
            .await?;
            eprintln!("TopologyResolved: {message}");

            // The ClusterTopology deleted after admission: reported, workloads kept.
            topology.delete().await;
            wait_for_condition(&ns, "False", "ClusterTopologyNotFound", &topology_name).await?;
            assert_eq!(
                pods(&ns, "decode").await?.len(),
                2,
                "workloads are left as they were"
            );
            // And back.
            let again = ClusterScoped::create_cluster_topology(
                &ns.client,
                &self::topology(&topology_name, &[("zone", ZONE), ("rack", RACK)]),
            )
            .await?;
            let back = wait_for_condition(&ns, "True", "Resolved", "worker pods per zone").await;
            again.delete().await;
            back?;
            operator.check_running()
        }
        .await;
        outcome.and(operator.stop().await)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_label_no_cluster_topology_is_needed() -> Result<()> {
    in_namespace("topology-label", |ns| async move {
        install_crds(&ns.client).await?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            let kv = json!({"level": "zone", "label": ZONE});
            ns.accepts(&graph(None, kv, 2)).await?;
            wait_for_labelled_workers(&ns, 2, &[ZONE]).await?;
            let zones = check_labels_match_nodes(&ns, &[(ZONE, ZONE)]).await?;
            for (pool, zones) in &zones {
                assert_eq!(zones.len(), 2, "{pool} pods should span both zones: {zones:?}");
            }
            check_pod_specs(
                &ns,
                &[("zone", ZONE)],
                &[
                    ("DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL", "zone"),
                    ("DYN_ROUTER_KV_TRANSFER_MISMATCH_POLICY", "fail"),
                ],
            )
            .await?;
            let frontend = &pods(&ns, "frontend").await?[0];
            assert!(!env(frontend).contains_key("DYN_ROUTER_KV_TRANSFER_WEIGHT"));
            wait_for_condition(
                &ns,
                "True",
                "Resolved",
                "level zone from node label topology.kubernetes.io/zone",
            )
            .await?;
            operator.check_running()
        }
        .await;
        outcome.and(operator.stop().await)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_label_gets_a_warning_and_the_pod_no_label() -> Result<()> {
    in_namespace("topology-missing", |ns| async move {
        install_crds(&ns.client).await?;
        let topology_name = format!("{}-topology", ns.name);
        // No node has example.com/block.
        let topology = ClusterScoped::create_cluster_topology(
            &ns.client,
            &topology(&topology_name, &[("zone", ZONE), ("block", "example.com/block")]),
        )
        .await?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            ns.accepts(&graph(Some(&topology_name), json!({"level": "zone"}), 1))
                .await?;
            wait_for_labelled_workers(&ns, 1, &["nvidia.com/dynamo-topology.zone"]).await?;
            let events: Api<Event> = ns.api();
            poll_until(
                "TopologyLabelMissing events on the pods and the DGD",
                WAIT,
                || {
                    let events = events.clone();
                    async move {
                        let list = events.list(&ListParams::default()).await?.items;
                        let regarding: BTreeSet<String> = list
                            .iter()
                            .filter(|e| {
                                e.reason.as_deref() == Some("TopologyLabelMissing")
                                    && e.type_.as_deref() == Some("Warning")
                            })
                            .filter_map(|e| e.regarding.as_ref().and_then(|r| r.kind.clone()))
                            .collect();
                        Ok(regarding.contains("Pod") && regarding.contains("DynamoGraphDeployment"))
                    }
                },
            )
            .await?;
            for kind in ["prefill", "decode"] {
                for pod in pods(&ns, kind).await? {
                    assert!(
                        !labels(&pod).contains_key("nvidia.com/dynamo-topology.block"),
                        "{:?}",
                        pod.metadata.name
                    );
                }
            }
            wait_for_condition(&ns, "False", "LabelsPending", "example.com/block").await?;
            operator.check_running()
        }
        .await;
        let stopped = operator.stop().await;
        topology.delete().await;
        outcome.and(stopped)
    })
    .await
}

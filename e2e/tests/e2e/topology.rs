//! Topology-aware KV-cache transfer on kwok nodes in two zones, with Grove's own topology CRDs
//! (`ClusterTopologyBinding`, and the `ClusterTopology` of Grove v0.1.0-alpha.8): the operator,
//! run in this process, renders the topology env and Downward API volume into worker (and, under
//! its first contract, frontend) pods, copies each worker pod's node zone and rack onto it once
//! scheduled, reports per-zone counts in the DGD's `TopologyResolved` condition, warns about nodes
//! without a label, and notices a binding deleted after admission. NVIDIA's `kvTransferPolicy` is
//! rendered like the frontend field. The released Dynamo runtime's own topology reader accepts
//! what a worker pod gets under the default contract (and refuses it without
//! `DYN_KV_TRANSFER_DOMAIN`, or under the first contract): see [`e2e::dynamo_runtime`].

use std::{collections::BTreeMap, collections::BTreeSet, time::Duration};

use e2e::{
    Result, TestNamespace, apply_crds,
    dynamo_runtime::ContainerView,
    in_namespace, in_namespace_exclusive, install_crds, poll_until,
    upstream::{self, BINDING_CRD, LEGACY_TOPOLOGY_CRD},
};
use k8s_openapi::api::{
    core::v1::{Container, Node, Pod},
    events::v1::Event,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::DeleteParams;
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
const POD_ZONE: &str = "nvidia.com/dynamo-topology.zone";
const POD_RACK: &str = "nvidia.com/dynamo-topology.rack";
const WAIT: Duration = Duration::from_secs(120);

/// One component; workers ask for a GPU and spread over zones, so that each pool spans both, and
/// carry a user copy of a variable the operator owns (replaced).
fn component(name: &str, kind: &str, replicas: i32, kv: Option<Value>) -> Value {
    let worker = kind != "frontend";
    let mut container = json!({"name": "main", "image": "registry.invalid/dynamo/vllm-runtime:e2e"});
    if worker {
        container["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
        container["env"] = json!([
            {"name": "DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL", "value": "a user copy"},
            {"name": "DYN_KV_TRANSFER_DOMAIN", "value": "a user copy"}
        ]);
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

/// A graph whose frontend sets `kvCacheTransferTopology`.
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

/// A graph with NVIDIA's graph-level `kvTransferPolicy`.
fn policy_graph(policy: Value, workers: i32) -> Value {
    json!({
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": GRAPH},
        "spec": {
            "experimental": {"kvTransferPolicy": policy},
            "components": [
                component("frontend", "frontend", 1, None),
                component("prefill", "prefill", workers, None),
                component("decode", "decode", workers, None),
            ]
        }
    })
}

/// A Grove topology object of `kind` (`ClusterTopologyBinding`, or `ClusterTopology` of Grove
/// up to v0.1.0-alpha.8), levels as Grove writes them: `{domain, key}`.
fn topology(kind: &str, name: &str, levels: &[(&str, &str)]) -> Value {
    json!({
        "apiVersion": "grove.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {"levels": levels.iter().map(|(d, k)| json!({"domain": d, "key": k})).collect::<Vec<_>>()}
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

/// What the pods of a graph must have under one env contract.
struct Expected<'a> {
    /// Env of worker main containers (user copies replaced).
    worker_env: &'a [(&'a str, &'a str)],
    /// Where the Downward API volume is mounted in workers.
    mount: &'a str,
    /// Its items: file name and pod label.
    items: &'a [(&'a str, &'a str)],
    /// Env of the frontend (none of the workers' variables there).
    frontend_env: &'a [(&'a str, &'a str)],
}

/// The released runtime's contract (the default): workers only, files at /etc/dynamo/topology.
fn dynamo_env<'a>(worker_env: &'a [(&'a str, &'a str)], items: &'a [(&'a str, &'a str)]) -> Expected<'a> {
    Expected {
        worker_env,
        mount: "/etc/dynamo/topology",
        items,
        frontend_env: &[],
    }
}

/// Worker pods have the contract's env (user copies replaced), the Downward API volume with one
/// item per level and its read-only mount; the frontend has the contract's router env only.
async fn check_pod_specs(ns: &TestNamespace, expected: &Expected<'_>) -> Result<()> {
    for kind in ["prefill", "decode"] {
        for pod in pods(ns, kind).await? {
            let env = env(&pod);
            for (name, value) in expected.worker_env {
                assert_eq!(
                    env.get(*name).map(String::as_str),
                    Some(*value),
                    "worker env {name}"
                );
            }
            assert!(
                env.values().all(|v| v != "a user copy"),
                "user copies are replaced: {env:?}"
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
            let items: Vec<(String, String)> = expected
                .items
                .iter()
                .map(|(path, label)| (path.to_string(), format!("metadata.labels['{label}']")))
                .collect();
            assert_eq!(found, items);
            let mount = main_container(&pod)
                .volume_mounts
                .unwrap_or_default()
                .into_iter()
                .find(|m| m.name == "topology-labels")
                .ok_or("no topology-labels mount")?;
            assert_eq!(mount.mount_path, expected.mount);
            assert_eq!(mount.read_only, Some(true));
        }
    }
    let frontends = pods(ns, "frontend").await?;
    assert_eq!(frontends.len(), 1);
    let env = env(&frontends[0]);
    let topology_env: BTreeMap<&String, &String> = env
        .iter()
        .filter(|(n, _)| n.contains("TOPOLOGY") || n.contains("KV_TRANSFER"))
        .collect();
    let wanted: BTreeMap<String, String> = expected
        .frontend_env
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    assert_eq!(
        topology_env,
        wanted.iter().collect::<BTreeMap<_, _>>(),
        "frontend topology env"
    );
    Ok(())
}

/// The released Dynamo runtime's topology reader, on what each worker pod's main container gets:
/// it starts and reads `domain` with the pod's own value of every level, as `enforcement` (and
/// `weight`); without `DYN_KV_TRANSFER_DOMAIN` the same pod's worker would exit.
async fn check_the_released_runtime_starts(
    ns: &TestNamespace,
    levels: &[(&str, &str)],
    domain: &str,
    enforcement: &str,
    weight: Option<f64>,
) -> Result<()> {
    for kind in ["prefill", "decode"] {
        for pod in pods(ns, kind).await? {
            let view = ContainerView::of(&pod, "main")?;
            let outcome = view.read_topology_config().await?;
            assert!(
                outcome.started(),
                "Dynamo's reader refused pod {:?}: exit {:?}\n{}",
                pod.metadata.name,
                outcome.code,
                outcome.stderr
            );
            let config = outcome.config.unwrap_or_default();
            let domains: BTreeMap<String, String> = levels
                .iter()
                .map(|(domain, label)| {
                    (
                        domain.to_string(),
                        labels(&pod).get(*label).cloned().unwrap_or_default(),
                    )
                })
                .collect();
            assert_eq!(config["topology_domains"], json!(domains), "{config}");
            assert_eq!(config["kv_transfer_domain"], domain, "{config}");
            assert_eq!(config["kv_transfer_enforcement"], enforcement, "{config}");
            assert_eq!(config["kv_transfer_preferred_weight"], json!(weight), "{config}");
            // The negative control: the same pod without the domain variable.
            let without = view
                .without("DYN_KV_TRANSFER_DOMAIN")
                .read_topology_config()
                .await?;
            assert_eq!(without.code, Some(1), "{}", without.stderr);
            assert!(
                without.stderr.contains("DYN_KV_TRANSFER_DOMAIN is not set"),
                "{}",
                without.stderr
            );
        }
    }
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
async fn workers_get_zone_and_rack_of_their_node_from_the_cluster_topology_binding() -> Result<()> {
    in_namespace("topology-zone", |ns| async move {
        install_crds(&ns.client).await?;
        let topology_name = format!("{}-topology", ns.name);
        let binding =
            |name: &str| topology("ClusterTopologyBinding", name, &[("zone", ZONE), ("rack", RACK)]);
        let topology = ClusterScoped::create_cluster_topology(&ns.client, &binding(&topology_name)).await?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            let kv = json!({"level": "zone", "mismatchPolicy": "fallback", "kvTransferWeight": 0.5});
            ns.accepts(&graph(Some(&topology_name), kv, 2)).await?;
            wait_for_labelled_workers(&ns, 2, &[POD_ZONE, POD_RACK]).await?;
            let zones = check_labels_match_nodes(&ns, &[(POD_ZONE, ZONE), (POD_RACK, RACK)]).await?;
            for (pool, zones) in &zones {
                assert_eq!(zones.len(), 2, "{pool} pods should span both zones: {zones:?}");
            }
            // The default contract: a stock Dynamo runtime starts on what each worker gets...
            check_the_released_runtime_starts(
                &ns,
                &[("zone", POD_ZONE), ("rack", POD_RACK)],
                "zone",
                "preferred",
                Some(0.5),
            )
            .await?;
            // ...under the released runtime's names.
            check_pod_specs(
                &ns,
                &dynamo_env(
                    &[
                        ("DYN_TOPOLOGY_ENABLED", "true"),
                        ("DYN_TOPOLOGY_MOUNT_PATH", "/etc/dynamo/topology"),
                        ("DYN_KV_TRANSFER_DOMAIN", "zone"),
                        ("DYN_KV_TRANSFER_ENFORCEMENT", "preferred"),
                        ("DYN_KV_TRANSFER_PREFERRED_WEIGHT", "0.5"),
                    ],
                    &[("zone", POD_ZONE), ("rack", POD_RACK)],
                ),
            )
            .await?;
            let message = wait_for_condition(
                &ns,
                "True",
                "Resolved",
                "worker pods per zone: zone-a 2 (prefill 1, decode 1), zone-b 2 (prefill 1, decode 1)",
            )
            .await?;
            assert!(message.contains("ClusterTopologyBinding"), "{message}");
            eprintln!("TopologyResolved: {message}");

            // The binding deleted after admission: reported, workloads kept.
            topology.delete().await;
            wait_for_condition(&ns, "False", "ClusterTopologyNotFound", &topology_name).await?;
            assert_eq!(
                pods(&ns, "decode").await?.len(),
                2,
                "workloads are left as they were"
            );
            // And back.
            let again = ClusterScoped::create_cluster_topology(&ns.client, &binding(&topology_name)).await?;
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

/// With a label no Grove object is needed; the DGD asks for this operator's first env contract,
/// under which the released runtime's reader would stop the worker (why it is not the default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_label_no_cluster_topology_is_needed() -> Result<()> {
    in_namespace("topology-label", |ns| async move {
        install_crds(&ns.client).await?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            let kv = json!({"level": "zone", "label": ZONE});
            let mut dgd = graph(None, kv, 2);
            dgd["metadata"]["annotations"] = json!({"planner.dynamo.io/topology-env": "planner"});
            // Only the contract's own variables are the operator's: keep the user copy of one of
            // them (replaced) and none of the other contract's (which would be left alone).
            for worker in dgd["spec"]["components"]
                .as_array_mut()
                .into_iter()
                .flatten()
                .skip(1)
            {
                worker["podTemplate"]["spec"]["containers"][0]["env"] =
                    json!([{"name": "DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL", "value": "a user copy"}]);
            }
            ns.accepts(&dgd).await?;
            wait_for_labelled_workers(&ns, 2, &[ZONE]).await?;
            let zones = check_labels_match_nodes(&ns, &[(ZONE, ZONE)]).await?;
            for (pool, zones) in &zones {
                assert_eq!(zones.len(), 2, "{pool} pods should span both zones: {zones:?}");
            }
            check_pod_specs(
                &ns,
                &Expected {
                    worker_env: &[
                        ("DYN_TOPOLOGY_ENABLED", "true"),
                        ("DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL", "zone"),
                    ],
                    mount: "/etc/podinfo/topology",
                    items: &[("zone", ZONE)],
                    frontend_env: &[
                        ("DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL", "zone"),
                        ("DYN_ROUTER_KV_TRANSFER_MISMATCH_POLICY", "fail"),
                    ],
                },
            )
            .await?;
            for pod in pods(&ns, "prefill").await? {
                let outcome = ContainerView::of(&pod, "main")?.read_topology_config().await?;
                assert_eq!(outcome.code, Some(1), "{}", outcome.stderr);
                assert!(
                    outcome.stderr.contains("DYN_KV_TRANSFER_DOMAIN is not set"),
                    "{}",
                    outcome.stderr
                );
            }
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

/// Deletes the CRD `name` and waits until it is gone.
async fn remove_crd(ns: &TestNamespace, name: &str) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
    let _ = crds.delete(name, &DeleteParams::default()).await;
    poll_until(&format!("CRD {name} to be gone"), WAIT, || async {
        Ok(crds.get_opt(name).await?.is_none())
    })
    .await
}

/// NVIDIA's graph-level `kvTransferPolicy` naming a `ClusterTopology` of Grove before the rename:
/// the cluster serves alpha.8's CRD (levels `{domain, key}`) instead of the binding's, as such a
/// Grove did; resolved and rendered like the frontend field, and the released runtime starts on
/// it. It swaps a cluster-wide CRD, so `make e2e` runs it alone, first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "replaces Grove's topology CRD: make e2e runs it alone, first"]
async fn nvidias_kv_transfer_policy_with_groves_earlier_cluster_topology() -> Result<()> {
    in_namespace_exclusive("topology-policy", |ns| async move {
        install_crds(&ns.client).await?;
        remove_crd(&ns, BINDING_CRD).await?;
        apply_crds(&ns.client, &[upstream::grove_legacy_crd()?]).await?;
        let outcome = legacy_cluster_topology(&ns).await;
        let removed = remove_crd(&ns, LEGACY_TOPOLOGY_CRD).await;
        let restored = install_crds(&ns.client).await;
        outcome.and(removed).and(restored.map(|_| ()))
    })
    .await
}

async fn legacy_cluster_topology(ns: &TestNamespace) -> Result<()> {
    let topology_name = format!("{}-legacy", ns.name);
    let topology = ClusterScoped::create_cluster_topology(
        &ns.client,
        &topology(
            "ClusterTopology",
            &topology_name,
            &[("zone", ZONE), ("rack", RACK)],
        ),
    )
    .await?;
    let operator = start(ns, &["--webhook-disabled"]).await?;
    let outcome = async {
        let policy = json!({"clusterTopologyName": topology_name, "domain": "rack"});
        ns.accepts(&policy_graph(policy, 2)).await?;
        wait_for_labelled_workers(ns, 2, &[POD_ZONE, POD_RACK]).await?;
        check_labels_match_nodes(ns, &[(POD_ZONE, ZONE), (POD_RACK, RACK)]).await?;
        check_pod_specs(
            ns,
            &dynamo_env(
                &[
                    ("DYN_TOPOLOGY_ENABLED", "true"),
                    ("DYN_KV_TRANSFER_DOMAIN", "rack"),
                    ("DYN_KV_TRANSFER_ENFORCEMENT", "required"),
                ],
                &[("zone", POD_ZONE), ("rack", POD_RACK)],
            ),
        )
        .await?;
        check_the_released_runtime_starts(
            ns,
            &[("zone", POD_ZONE), ("rack", POD_RACK)],
            "rack",
            "required",
            None,
        )
        .await?;
        let message = wait_for_condition(ns, "True", "Resolved", "worker pods per rack").await?;
        assert!(
            message.contains(&format!("level rack of ClusterTopology {topology_name}")),
            "{message}"
        );
        operator.check_running()
    }
    .await;
    let stopped = operator.stop().await;
    topology.delete().await;
    outcome.and(stopped)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_label_gets_a_warning_and_the_pod_no_label() -> Result<()> {
    in_namespace("topology-missing", |ns| async move {
        install_crds(&ns.client).await?;
        let topology_name = format!("{}-topology", ns.name);
        // No node has example.com/block.
        let topology = ClusterScoped::create_cluster_topology(
            &ns.client,
            &topology(
                "ClusterTopologyBinding",
                &topology_name,
                &[("zone", ZONE), ("block", "example.com/block")],
            ),
        )
        .await?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            ns.accepts(&graph(Some(&topology_name), json!({"level": "zone"}), 1))
                .await?;
            wait_for_labelled_workers(&ns, 1, &[POD_ZONE]).await?;
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

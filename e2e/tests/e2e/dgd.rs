//! The DynamoGraphDeployment reconciler against the real API server: workloads and
//! status follow the spec, invalid specs are reported, deletion cleans up; and two operator
//! processes elect one leader that hands over when killed.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use e2e::{Result, TestNamespace, in_namespace, install_crds, operator_binary, poll_until, repo_root};
use k8s_openapi::api::{
    apps::v1::Deployment,
    coordination::v1::Lease,
    core::v1::{Pod, Service},
    events::v1::Event,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use planner_api::DynamoGraphDeployment;
use serde_json::{Value, json};

use crate::operator::start;

const WAIT: Duration = Duration::from_secs(90);
const GRAPH_LABEL: &str = "nvidia.com/dynamo-graph-deployment-name";

/// The disaggregated sample without its topology settings (those are the topology tests').
pub(crate) fn graph(name: &str) -> Result<DynamoGraphDeployment> {
    Ok(serde_json::from_value(graph_value(name)?)?)
}

/// [`graph`] as JSON, for creating it as the test wrote it.
pub(crate) fn graph_value(name: &str) -> Result<Value> {
    let mut value: Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join("config/samples/dgd-disagg.yaml"),
    )?)?;
    value["metadata"]["name"] = json!(name);
    value["spec"]
        .as_object_mut()
        .ok_or("spec")?
        .remove("topologyConstraint");
    for component in value["spec"]["components"].as_array_mut().ok_or("components")? {
        component
            .as_object_mut()
            .ok_or("component")?
            .remove("kvCacheTransferTopology");
    }
    Ok(value)
}

/// The replicas of the sample's prefill and decode components (1 when unset).
pub(crate) fn replicas(dgd: &DynamoGraphDeployment) -> (i32, i32) {
    let of = |name: &str| {
        dgd.spec
            .components
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.replicas)
            .unwrap_or(1)
    };
    (of("prefill"), of("decode"))
}

fn ready(dgd: &DynamoGraphDeployment) -> Option<&str> {
    dgd.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.as_str())
}

async fn deployments(ns: &TestNamespace, graph: &str) -> Result<Vec<Deployment>> {
    let api: Api<Deployment> = ns.api();
    Ok(api
        .list(&ListParams::default().labels(&format!("{GRAPH_LABEL}={graph}")))
        .await?
        .items)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgd_renders_workloads_tracks_status_and_cleans_up() -> Result<()> {
    in_namespace("dgd-lifecycle", |ns| async move {
        install_crds(&ns.client).await?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome =
            async {
                let dgds: Api<DynamoGraphDeployment> = ns.api();
                dgds.create(&PostParams::default(), &graph("llama")?).await?;

                // Deployments, the frontend Service, running pods, and a Ready DGD with counts.
                poll_until("three Deployments and a Service", WAIT, || async {
                    let services: Api<Service> = ns.api();
                    Ok(deployments(&ns, "llama").await?.len() == 3
                        && services.get_opt("llama-frontend").await?.is_some())
                })
                .await?;
                poll_until(
                    "the DGD to become Ready with one available replica per component",
                    WAIT,
                    || async {
                        let dgd = dgds.get("llama").await?;
                        let counts_ok = dgd.status.as_ref().is_some_and(|s| {
                            s.components.len() == 3
                                && s.components
                                    .values()
                                    .all(|c| c.available_replicas == 1 && c.ready_replicas == 1)
                        });
                        Ok(ready(&dgd) == Some("True") && counts_ok)
                    },
                )
                .await?;
                let pods: Api<Pod> = ns.api();
                let running = pods
                    .list(&ListParams::default().labels(&format!("{GRAPH_LABEL}=llama")))
                    .await?;
                assert!(
                    running
                        .items
                        .iter()
                        .all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                );
                let decode = deployments(&ns, "llama")
                    .await?
                    .into_iter()
                    .find(|d| d.metadata.name.as_deref() == Some("llama-decode"));
                let env = decode
                    .and_then(|d| d.spec)
                    .and_then(|s| s.template.spec)
                    .map(|s| s.containers[0].env.clone().unwrap_or_default())
                    .unwrap_or_default();
                assert!(env.iter().any(|e| e.name == "DYN_NAMESPACE"
                    && e.value.as_deref() == Some(&format!("{}-llama", ns.name))));

                // Scaling a component scales its Deployment, and the status follows.
                let patch = json!([{"op": "replace", "path": "/spec/components/2/replicas", "value": 2}]);
                dgds.patch(
                    "llama",
                    &PatchParams::default(),
                    &Patch::Json::<()>(serde_json::from_value(patch)?),
                )
                .await?;
                poll_until(
                    "decode to have 2 available replicas in the DGD status",
                    WAIT,
                    || async {
                        let dgd = dgds.get("llama").await?;
                        let decode = dgd
                            .status
                            .as_ref()
                            .and_then(|s| s.components.get("decode").cloned());
                        Ok(decode.is_some_and(|d| d.available_replicas == 2) && ready(&dgd) == Some("True"))
                    },
                )
                .await?;

                // Removing a component removes its workload and Service.
                let patch = json!([{"op": "test", "path": "/spec/components/0/name", "value": "frontend"},
                               {"op": "remove", "path": "/spec/components/0"}]);
                dgds.patch(
                    "llama",
                    &PatchParams::default(),
                    &Patch::Json::<()>(serde_json::from_value(patch)?),
                )
                .await?;
                poll_until(
                    "the frontend's Deployment and Service to be removed",
                    WAIT,
                    || async {
                        let services: Api<Service> = ns.api();
                        let names: Vec<String> = deployments(&ns, "llama")
                            .await?
                            .iter()
                            .filter_map(|d| d.metadata.name.clone())
                            .collect();
                        Ok(names.len() == 2
                            && !names.contains(&"llama-frontend".to_string())
                            && services.get_opt("llama-frontend").await?.is_none())
                    },
                )
                .await?;

                // A spec that cannot be rendered: Ready=False with the reason, and a Warning Event.
                let mut broken = graph("broken")?;
                broken.spec.components[1]
                    .pod_template
                    .as_mut()
                    .ok_or("template")?
                    .spec
                    .as_mut()
                    .ok_or("spec")?
                    .containers[0]
                    .name = "vllm".into();
                dgds.create(&PostParams::default(), &broken).await?;
                poll_until(
                    "the broken DGD to be Ready=False with reason InvalidSpec",
                    WAIT,
                    || async {
                        let dgd = dgds.get("broken").await?;
                        let condition = dgd
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned());
                        Ok(condition.is_some_and(|c| {
                            c.status == "False"
                                && c.reason == "InvalidSpec"
                                && c.message.contains("no container named \"main\"")
                        }))
                    },
                )
                .await?;
                poll_until("a Warning InvalidSpec Event on the broken DGD", WAIT, || async {
                    let events: Api<Event> = ns.api();
                    Ok(events.list(&ListParams::default()).await?.items.iter().any(|e| {
                        e.reason.as_deref() == Some("InvalidSpec")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("broken")
                    }))
                })
                .await?;

                // Deleting the DGD removes what it created (owner references, garbage collector).
                dgds.delete("llama", &DeleteParams::foreground()).await?;
                poll_until("the workloads of the deleted DGD to be gone", WAIT, || async {
                    Ok(deployments(&ns, "llama").await?.is_empty())
                })
                .await?;
                operator.check_running()
            }
            .await;
        let stopped = operator.stop().await;
        outcome.and(stopped)
    })
    .await
}

/// An operator process with leader election on, scoped to the test's namespace.
struct Process {
    child: Child,
    identity: String,
}

impl Process {
    fn start(ns: &TestNamespace, identity: &str) -> Result<Self> {
        let binary = operator_binary();
        let child = Command::new(&binary)
            .args([
                "run",
                "--namespace",
                &ns.name,
                "--webhook-disabled",
                "--metrics-addr",
                "127.0.0.1:0",
                "--lease-namespace",
                &ns.name,
                "--lease-duration-seconds",
                "10",
                "--identity",
                identity,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e} (make e2e builds it)", binary.display()))?;
        Ok(Self {
            child,
            identity: identity.into(),
        })
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn holder(ns: &TestNamespace) -> Result<Option<String>> {
    let leases: Api<Lease> = ns.api();
    Ok(leases
        .get_opt("planner-operator-leader")
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

async fn decode_replicas(ns: &TestNamespace, graph: &str) -> Result<Option<i32>> {
    let api: Api<Deployment> = ns.api();
    Ok(api
        .get_opt(&format!("{graph}-decode"))
        .await?
        .and_then(|d| d.spec)
        .and_then(|s| s.replicas))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operators_elect_one_leader_that_hands_over_when_killed() -> Result<()> {
    in_namespace("dgd-leader", |ns| async move {
        install_crds(&ns.client).await?;
        let mut replicas = vec![
            Process::start(&ns, "replica-a")?,
            Process::start(&ns, "replica-b")?,
        ];
        poll_until("one replica to hold the Lease", WAIT, || async {
            Ok(holder(&ns).await?.is_some())
        })
        .await?;
        let leader = holder(&ns).await?.ok_or("no holder")?;
        let leader_index = replicas
            .iter()
            .position(|r| r.identity == leader)
            .ok_or(format!("unexpected holder {leader}"))?;

        // Only the leader writes: the Warning Event of an invalid spec comes from it alone.
        let dgds: Api<DynamoGraphDeployment> = ns.api();
        dgds.create(&PostParams::default(), &graph("llama")?).await?;
        let mut broken = graph("broken")?;
        broken.spec.components[0]
            .pod_template
            .as_mut()
            .ok_or("template")?
            .spec
            .as_mut()
            .ok_or("spec")?
            .containers[0]
            .name = "x".into();
        dgds.create(&PostParams::default(), &broken).await?;
        poll_until("the Deployments of the graph", WAIT, || async {
            Ok(decode_replicas(&ns, "llama").await? == Some(1))
        })
        .await?;
        poll_until("the InvalidSpec event", WAIT, || async {
            let events: Api<Event> = ns.api();
            Ok(events
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .any(|e| e.reason.as_deref() == Some("InvalidSpec")))
        })
        .await?;
        let events: Api<Event> = ns.api();
        let reporters: Vec<String> = events
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("InvalidSpec"))
            .filter_map(|e| e.reporting_instance.clone())
            .collect();
        assert!(
            reporters.iter().all(|r| *r == leader),
            "events from a non-leader: {reporters:?}"
        );

        // Kill the leader (SIGKILL: no lease release); the other takes over within 30 s and
        // keeps reconciling.
        let mut killed = replicas.remove(leader_index);
        killed.child.kill()?;
        killed.child.wait()?;
        let survivor = replicas[0].identity.clone();
        handover(&ns, &dgds, &survivor).await
    })
    .await
}

async fn handover(ns: &TestNamespace, dgds: &Api<DynamoGraphDeployment>, survivor: &str) -> Result<()> {
    let started = std::time::Instant::now();
    poll_until(
        "the surviving replica to take the Lease",
        Duration::from_secs(30),
        || async { Ok(holder(ns).await?.as_deref() == Some(survivor)) },
    )
    .await?;
    eprintln!("leadership handed over in {:?}", started.elapsed());
    let patch = json!([{"op": "replace", "path": "/spec/components/2/replicas", "value": 3}]);
    dgds.patch(
        "llama",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(patch)?),
    )
    .await?;
    poll_until("the new leader to scale decode to 3", WAIT, || async {
        Ok(decode_replicas(ns, "llama").await? == Some(3))
    })
    .await
}

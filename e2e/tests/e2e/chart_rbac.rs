//! The chart installed with `helm install` into the test cluster, and the operator run in this
//! process with a token of the chart's ServiceAccount (TokenRequest API) and the flags of the
//! chart's Deployment: every reconcile and the webhook work with exactly the chart's RBAC, so a
//! permission missing from the chart fails these tests. (The chart's own pods cannot run without
//! an image; kwok plays them, and the webhook configuration points at this process through the
//! chart's `webhook.url`, limited to the test's namespace.)
//!
//! What runs as the ServiceAccount: leader election (the Lease, taken over by a standby when the
//! leader stops), the webhook's generated certificate (Secret) and caBundle patch, admission
//! lookups (ClusterTopology, target DGD), the DGD reconcile (Deployments, Services, status, stale
//! workloads deleted), the topology label controller (nodes, pod labels), the PlannerPolicy
//! reconcile (profile ConfigMap, status, scaling the DGD from a fake Prometheus) and Events
//! (created, and patched when repeated). Cluster-wide mode also goes through `helm upgrade` with
//! changed values: the CRs stay, the upgraded flags take effect, the operator keeps working.

use std::{collections::BTreeMap, path::PathBuf, sync::Mutex, time::Duration};

use e2e::{
    Result, TestNamespace,
    chart::{chart_dir, helm, of_kind, one_of_kind, parse_manifests, service_account_client},
    in_namespace, in_namespace_exclusive, install_crds, load_yaml, poll_until, repo_root,
};
use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::ValidatingWebhookConfiguration,
        apps::v1::Deployment,
        coordination::v1::Lease,
        core::v1::{ConfigMap, Pod, Secret, Service},
        events::v1::Event,
    },
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use planner_api::{DynamoGraphDeployment, PlannerPolicy};
use planner_operator::runtime::{RunError, run_until};
use serde_json::{Value, json};
use tokio::{sync::oneshot, task::JoinHandle};

use crate::{
    fake_prometheus::FakePrometheus,
    operator::{ClusterScoped, parse_run_args},
};

const GRAPH: &str = "llama";
const MODEL: &str = "llama-3.1-8b";
const WAIT: Duration = Duration::from_secs(90);
const GRAPH_LABEL: &str = "nvidia.com/dynamo-graph-deployment-name";
const TYPE_LABEL: &str = "nvidia.com/dynamo-component-type";

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok { Ok(()) } else { Err(what().into()) }
}

/// A Helm release of the chart in the test namespace.
struct Release {
    name: String,
    namespace: String,
    values_file: PathBuf,
}

impl Release {
    fn new(ns: &TestNamespace) -> Self {
        // The namespace's random suffix keeps cluster-scoped names (ClusterRole, webhook
        // configuration) apart from other runs.
        let suffix = ns.name.rsplit('-').next().unwrap_or("x");
        let name = format!("po-{suffix}");
        let values_file = std::env::temp_dir().join(format!("{}-{name}-values.json", ns.name));
        Self {
            name,
            namespace: ns.name.clone(),
            values_file,
        }
    }

    async fn helm_with_values(&self, command: &str, values: &Value) -> Result<String> {
        std::fs::write(&self.values_file, serde_json::to_vec_pretty(values)?)?;
        let chart = chart_dir().to_string_lossy().to_string();
        let file = self.values_file.to_string_lossy().to_string();
        helm(&[
            command,
            &self.name,
            &chart,
            "--namespace",
            &self.namespace,
            "--values",
            &file,
        ])
        .await
    }

    async fn install(&self, values: &Value) -> Result<String> {
        self.helm_with_values("install", values).await
    }

    async fn upgrade(&self, values: &Value) -> Result<String> {
        self.helm_with_values("upgrade", values).await
    }

    /// The objects of the installed release.
    async fn manifest(&self) -> Result<Vec<Value>> {
        parse_manifests(&helm(&["get", "manifest", &self.name, "--namespace", &self.namespace]).await?)
    }

    async fn uninstall(&self) {
        if let Err(e) = helm(&[
            "uninstall",
            &self.name,
            "--namespace",
            &self.namespace,
            "--ignore-not-found",
        ])
        .await
        {
            eprintln!("{e}");
        }
        let _ = std::fs::remove_file(&self.values_file);
    }
}

/// Values for the test: the full operator (the DGD controller on; planner only is the chart's
/// default), the webhook called at this process's port and limited to `objects` (the namespace
/// the test creates DGDs and PlannerPolicies in).
fn values(objects: &str, webhook_port: u16, watch: Option<&str>, prometheus: &str) -> Value {
    json!({
        "dgdController": {"enabled": true},
        "watchNamespace": watch.unwrap_or_default(),
        "prometheus": {"url": prometheus},
        "webhook": {
            "url": format!("https://127.0.0.1:{webhook_port}"),
            "extraHosts": ["127.0.0.1"],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": objects}},
        },
    })
}

/// The operator run in this process as the chart's Deployment would run it.
struct HostOperator {
    identity: String,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::result::Result<(), RunError>>,
}

/// The flags of the chart's operator container for a process on this host: the container's args;
/// the Downward API env vars as the flags that read the same variables (`POD_NAME` is
/// `--identity`); the listen addresses on loopback.
fn host_argv(deployment: &Value, identity: &str, webhook_port: u16) -> Result<Vec<String>> {
    let namespace = deployment["metadata"]["namespace"]
        .as_str()
        .ok_or("the Deployment has no namespace")?;
    let container = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "operator"))
        .ok_or("no operator container")?;
    let args: Vec<String> = container["args"]
        .as_array()
        .ok_or("no args")?
        .iter()
        .filter_map(|a| a.as_str().map(String::from))
        .collect();
    check(args.first().map(String::as_str) == Some("run"), || {
        "args do not start with run".into()
    })?;
    let mut argv = vec!["planner-operator".to_string()];
    for arg in args.into_iter().skip(1) {
        argv.push(if arg.starts_with("--metrics-addr=") {
            "--metrics-addr=127.0.0.1:0".into()
        } else if arg.starts_with("--webhook-addr=") {
            format!("--webhook-addr=127.0.0.1:{webhook_port}")
        } else if arg.starts_with("--webhook-cert-dir=") {
            return Err("certificate files from a mounted Secret cannot be used on the host".into());
        } else {
            arg
        });
    }
    let command = crate::operator::cli_command();
    for env in container["env"].as_array().cloned().unwrap_or_default() {
        let name = env["name"].as_str().unwrap_or_default();
        let Some(field) = env["valueFrom"]["fieldRef"]["fieldPath"].as_str() else {
            if env["valueFrom"].is_object() {
                return Err(format!("env {name}: only fieldRef is understood here").into());
            }
            continue; // plain values (RUST_LOG) only change logging
        };
        let value = match field {
            "metadata.name" => identity,
            "metadata.namespace" => namespace,
            other => return Err(format!("env {name}: fieldRef {other} is not understood here").into()),
        };
        let flag = command
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == name))
            .and_then(|a| a.get_long())
            .ok_or_else(|| format!("env {name} is read by no flag of `planner-operator run`"))?;
        argv.push(format!("--{flag}={value}"));
    }
    Ok(argv)
}

impl HostOperator {
    async fn start(client: Client, manifest: &[Value], identity: &str, webhook_port: u16) -> Result<Self> {
        crate::operator::init_logs();
        let argv = host_argv(one_of_kind(manifest, "Deployment")?, identity, webhook_port)?;
        eprintln!(
            "starting the operator as the chart's ServiceAccount: {}",
            argv.join(" ")
        );
        let args = parse_run_args(argv)?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(run_until(args, client, async move {
            let _ = stopped.await;
        }));
        Ok(Self {
            identity: identity.to_string(),
            stop: Some(stop),
            task,
        })
    }

    fn check_running(&self) -> Result<()> {
        check(!self.task.is_finished(), || {
            format!("operator {} stopped early; see its log above", self.identity)
        })
    }

    async fn stop(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(Duration::from_secs(30), &mut self.task).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(error))) => Err(format!("operator {} failed: {error}", self.identity).into()),
            Ok(Err(join)) => Err(format!("operator {} task failed: {join}", self.identity).into()),
            Err(_) => {
                self.task.abort();
                Err(format!("operator {} did not stop within 30s", self.identity).into())
            }
        }
    }
}

/// Where a test's objects live: the release namespace (Lease, Secret) and the namespace of the
/// DGDs and PlannerPolicies (the same one, or the watched one in namespace-scoped mode).
struct Place<'a> {
    admin: &'a Client,
    release: &'a str,
    objects: &'a str,
}

impl Place<'_> {
    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.admin.clone(), self.objects)
    }
}

async fn wait_for_leader(place: &Place<'_>, lease: &str, identity: &str) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(place.admin.clone(), place.release);
    poll_until(&format!("{identity} to hold Lease {lease}"), WAIT, || {
        let leases = leases.clone();
        async move {
            let holder = leases
                .get_opt(lease)
                .await?
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity);
            Ok(holder.as_deref() == Some(identity))
        }
    })
    .await
}

/// The operator generated its certificate into the Secret (labelled as its own) and patched
/// the CA into every webhook of the chart's configuration.
async fn wait_for_ca_bundle(place: &Place<'_>, config: &str, secret: &str) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(place.admin.clone(), place.release);
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(place.admin.clone());
    poll_until(
        "the operator to generate its certificate and patch the caBundle",
        WAIT,
        || {
            let (secrets, configs) = (secrets.clone(), configs.clone());
            async move {
                let Some(secret) = secrets.get_opt(secret).await? else {
                    return Ok(false);
                };
                let ca: Option<ByteString> = secret.data.unwrap_or_default().get("ca.crt").cloned();
                let bundles: Vec<Option<ByteString>> = configs
                    .get(config)
                    .await?
                    .webhooks
                    .unwrap_or_default()
                    .into_iter()
                    .map(|w| w.client_config.ca_bundle)
                    .collect();
                Ok(ca.is_some() && !bundles.is_empty() && bundles.iter().all(|b| *b == ca))
            }
        },
    )
    .await
}

fn webhook_fixture(file: &str) -> Result<(Value, String)> {
    let path = repo_root().join("operator/tests/fixtures/webhook").join(file);
    let text = std::fs::read_to_string(&path)?;
    let reason = text
        .lines()
        .find_map(|l| l.strip_prefix("# reason:"))
        .map(|r| r.trim().to_string())
        .ok_or_else(|| format!("{file} has no reason"))?;
    Ok((serde_yaml::from_str(&text)?, reason))
}

/// The API server calls the operator's webhook, whose lookups (a ClusterTopology, a DGD) run as
/// the ServiceAccount: an object only the webhook can reject is rejected with its message.
async fn check_webhook(objects_ns: &TestNamespace) -> Result<()> {
    for file in [
        "dgd-cluster-topology-not-found.yaml",
        "ppol-target-not-found.yaml",
    ] {
        let (object, reason) = webhook_fixture(file)?;
        poll_until(&format!("the webhook to reject {file}"), WAIT, || {
            let (object, reason) = (object.clone(), reason.clone());
            async move {
                match objects_ns.rejects(&object, &reason).await {
                    Ok(_) => Ok(true),
                    Err(e) => {
                        eprintln!("not yet: {e}");
                        Ok(false)
                    }
                }
            }
        })
        .await?;
    }
    Ok(())
}

fn component(name: &str, kind: &str, kv: Option<Value>) -> Value {
    let mut container = json!({"name": "main", "image": "registry.invalid/dynamo/vllm-runtime:e2e"});
    if !matches!(kind, "frontend") {
        container["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
        container["args"] = json!(["--served-model-name", MODEL]);
    }
    let mut component = json!({
        "name": name, "type": kind, "replicas": 1,
        "podTemplate": {"spec": {"containers": [container]}}
    });
    if let Some(kv) = kv {
        component["kvCacheTransferTopology"] = kv;
    }
    component
}

/// A DGD with a topology-aware frontend, a second frontend and an extra worker (both removed
/// later, last so that the pools' indices do not move), a prefill and a decode pool.
fn graph(cluster_topology: &str) -> Value {
    json!({
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": GRAPH},
        "spec": {
            "backendFramework": "vllm",
            "topologyConstraint": {"clusterTopologyName": cluster_topology},
            "components": [
                component("frontend", "frontend", Some(json!({"level": "zone"}))),
                component("prefill", "prefill", None),
                component("decode", "decode", None),
                component("frontend-b", "frontend", None),
                component("aux", "worker", None),
            ]
        }
    })
}

fn policy(name: &str, prometheus: Option<&str>) -> Value {
    let mut policy = json!({
        "apiVersion": "planner.dynamo.io/v1alpha1",
        "kind": "PlannerPolicy",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"name": GRAPH},
            "adjustmentInterval": "10s",
            "sla": {"ttftMs": 500, "itlMs": 50},
            "bounds": {"minReplicas": 1, "maxReplicas": 6, "maxGpuBudget": 12},
            "predictor": {"type": "constant"},
            "profile": {"configMapRef": {"name": "h200-profile"}},
            "metrics": {"modelName": MODEL}
        }
    });
    if let Some(url) = prometheus {
        policy["spec"]["metrics"]["prometheus"] = json!({"url": url});
    }
    policy
}

/// The built-in H200 profile's NPZ files, as a ConfigMap a PlannerPolicy names.
fn profile_config_map() -> Result<ConfigMap> {
    let dir = repo_root().join("config/profiles/h200-llama3.1-8b-tp1");
    let read = |pool: &str| std::fs::read(dir.join(format!("selected_{pool}_interpolation/raw_data.npz")));
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "h200-profile"},
        "binaryData": {
            "prefill_raw_data.npz": ByteString(read("prefill")?),
            "decode_raw_data.npz": ByteString(read("decode")?),
        }
    }))?)
}

fn condition(status: &Value, type_: &str) -> Option<(String, String, String)> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
}

async fn status_of<K>(api: &Api<K>, name: &str) -> Result<Value>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    Ok(serde_json::to_value(api.get(name).await?)?["status"].clone())
}

async fn wait_condition<K>(api: &Api<K>, name: &str, type_: &str, status: &str) -> Result<String>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let message = Mutex::new(String::new());
    let last = || message.lock().map(|m| m.clone()).unwrap_or_default();
    poll_until(&format!("{name} {type_}={status}"), WAIT, || async {
        let current = condition(&status_of(api, name).await?, type_);
        if let Some((s, reason, text)) = &current {
            if let Ok(mut message) = message.lock() {
                *message = format!("{reason}: {text}");
            }
            return Ok(s == status);
        }
        Ok(false)
    })
    .await
    .map_err(|e| format!("{e} (last: {})", last()))?;
    Ok(last())
}

/// Events the operator (reporting controller `planner-operator`) wrote about `name`.
async fn events_about(place: &Place<'_>, name: &str, reason: &str) -> Result<Vec<Event>> {
    let events: Api<Event> = place.api();
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.reporting_controller.as_deref() == Some("planner-operator")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect())
}

fn replicas_of(dgd: &DynamoGraphDeployment, component: &str) -> Option<i32> {
    dgd.spec
        .components
        .iter()
        .find(|c| c.name == component)
        .and_then(|c| c.replicas)
}

/// Everything the operator reconciles, with the chart's RBAC; returns the UIDs of the CRs.
async fn exercise(
    place: &Place<'_>,
    objects_ns: &TestNamespace,
    prometheus: &FakePrometheus,
    cluster_topology: &str,
) -> Result<BTreeMap<String, String>> {
    let dgds: Api<DynamoGraphDeployment> = place.api();
    let policies: Api<PlannerPolicy> = place.api();
    let deployments: Api<Deployment> = place.api();
    let services: Api<Service> = place.api();
    let pods: Api<Pod> = place.api();

    // DGD reconcile: workloads applied, topology resolved, worker pods labelled from their nodes.
    objects_ns.accepts(&graph(cluster_topology)).await?;
    for component in ["frontend", "prefill", "decode", "frontend-b", "aux"] {
        let name = format!("{GRAPH}-{component}");
        poll_until(&format!("Deployment {name}"), WAIT, || {
            let (deployments, name) = (deployments.clone(), name.clone());
            async move { Ok(deployments.get_opt(&name).await?.is_some()) }
        })
        .await?;
    }
    // The reconcile applies the Services after the Deployments: wait for them too.
    for service in ["frontend", "frontend-b"] {
        let name = format!("{GRAPH}-{service}");
        poll_until(&format!("Service {name}"), WAIT, || {
            let (services, name) = (services.clone(), name.clone());
            async move { Ok(services.get_opt(&name).await?.is_some()) }
        })
        .await?;
    }
    wait_condition(&dgds, GRAPH, "Ready", "True").await?;
    let topology = wait_condition(&dgds, GRAPH, "TopologyResolved", "True").await?;
    eprintln!("TopologyResolved: {topology}");
    let workers = pods
        .list(&ListParams::default().labels(&format!(
            "{GRAPH_LABEL}={GRAPH},{TYPE_LABEL} in (prefill,decode,worker)"
        )))
        .await?;
    check(!workers.items.is_empty(), || "no worker pods".into())?;
    for pod in &workers.items {
        check(
            pod.labels().contains_key("nvidia.com/dynamo-topology.zone"),
            || format!("pod {} has no zone label", pod.name_any()),
        )?;
    }

    // PlannerPolicy reconcile: profile from a ConfigMap, metrics from the fake Prometheus, the
    // DGD scaled through the kubernetes connector, status and a Scaled Event.
    let config_maps: Api<ConfigMap> = place.api();
    config_maps
        .create(&PostParams::default(), &profile_config_map()?)
        .await?;
    objects_ns.accepts(&policy("sla", Some(&prometheus.url))).await?;
    objects_ns
        .accepts(&policy("dark", Some("http://127.0.0.1:1")))
        .await?;
    wait_condition(&policies, "sla", "ProfileLoaded", "True").await?;
    wait_condition(&policies, "sla", "MetricsAvailable", "True").await?;
    let decision = Mutex::new((0, 0));
    poll_until("the planner to scale the DGD to its decision", WAIT, || async {
        let status = status_of(&policies, "sla").await?;
        let (Some(prefill), Some(decode)) = (
            status["desired"]["prefill"].as_i64(),
            status["desired"]["decode"].as_i64(),
        ) else {
            return Ok(false);
        };
        if let Ok(mut decision) = decision.lock() {
            *decision = (prefill, decode);
        }
        let dgd = dgds.get(GRAPH).await?;
        Ok(replicas_of(&dgd, "prefill").map(i64::from) == Some(prefill)
            && replicas_of(&dgd, "decode").map(i64::from) == Some(decode))
    })
    .await?;
    let desired = decision.lock().map(|d| *d).unwrap_or_default();
    eprintln!(
        "planner decision {desired:?} applied; {} Prometheus queries",
        prometheus.queries()
    );
    check(desired != (1, 1), || {
        "the fake load should need more than one replica per pool".into()
    })?;
    poll_until("a Scaled Event", WAIT, || async {
        Ok(!events_about(place, "sla", "Scaled").await?.is_empty())
    })
    .await?;
    // A repeated Event is patched (its series counts it).
    wait_condition(&policies, "dark", "MetricsAvailable", "False").await?;
    poll_until("a MetricsUnavailable Event seen twice", WAIT, || async {
        Ok(events_about(place, "dark", "MetricsUnavailable")
            .await?
            .iter()
            .any(|e| e.series.as_ref().is_some_and(|s| s.count >= 2)))
    })
    .await?;

    // Stale workloads: the removed components' Deployments and Service are deleted.
    // The planner (replicas) and the DGD controller (status) write the DGD meanwhile: a replace
    // that lost the race (409) is read and tried again.
    poll_until("the DGD without frontend-b and aux", WAIT, || async {
        let mut dgd = dgds.get(GRAPH).await?;
        dgd.spec
            .components
            .retain(|c| c.name != "frontend-b" && c.name != "aux");
        dgd.metadata.managed_fields = None;
        match dgds.replace(GRAPH, &PostParams::default(), &dgd).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error.into()),
        }
    })
    .await?;
    poll_until(
        "the removed components' workloads to be deleted",
        WAIT,
        || async {
            Ok(deployments
                .get_opt(&format!("{GRAPH}-frontend-b"))
                .await?
                .is_none()
                && deployments.get_opt(&format!("{GRAPH}-aux")).await?.is_none()
                && services.get_opt(&format!("{GRAPH}-frontend-b")).await?.is_none())
        },
    )
    .await?;

    let mut uids = BTreeMap::new();
    uids.insert(
        format!("DynamoGraphDeployment/{GRAPH}"),
        dgds.get(GRAPH).await?.uid().unwrap_or_default(),
    );
    for name in ["sla", "dark"] {
        uids.insert(
            format!("PlannerPolicy/{name}"),
            policies.get(name).await?.uid().unwrap_or_default(),
        );
    }
    Ok(uids)
}

/// The names the chart gave the Lease, the webhook configuration and the certificate Secret.
struct Names {
    account: String,
    lease: String,
    config: String,
    secret: String,
}

fn names(manifest: &[Value]) -> Result<Names> {
    let deployment = one_of_kind(manifest, "Deployment")?;
    let argv = host_argv(deployment, "x", 1)?;
    let args = parse_run_args(argv)?;
    Ok(Names {
        account: deployment["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .ok_or("no serviceAccountName")?
            .to_string(),
        lease: args.lease_name,
        config: args.webhook_config_name,
        secret: args.webhook_secret,
    })
}

fn cluster_topology(name: &str) -> Result<Value> {
    let [mut topology] = load_yaml(&repo_root().join("config/samples/cluster-topology.yaml"))?
        .try_into()
        .map_err(|_| "one ClusterTopologyBinding in the sample")?;
    topology["metadata"]["name"] = json!(name);
    Ok(topology)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_rbac_is_enough_cluster_wide_and_survives_an_upgrade() -> Result<()> {
    // Exclusive: a cluster-wide operator reconciles every namespace's DGDs.
    in_namespace_exclusive("chart-rbac", |ns| async move {
        install_crds(&ns.client).await?;
        let topology_name = format!("chart-{}", ns.name);
        let topology =
            ClusterScoped::create_cluster_topology(&ns.client, &cluster_topology(&topology_name)?).await?;
        let prometheus = FakePrometheus::start(MODEL).await?;
        let release = Release::new(&ns);
        let port_a = free_port()?;
        release
            .install(&values(&ns.name, port_a, None, "http://prometheus.invalid:9090"))
            .await?;
        let outcome = cluster_wide(&ns, &release, &prometheus, &topology_name, port_a).await;
        release.uninstall().await;
        topology.delete().await;
        outcome
    })
    .await
}

async fn cluster_wide(
    ns: &TestNamespace,
    release: &Release,
    prometheus: &FakePrometheus,
    topology: &str,
    port_a: u16,
) -> Result<()> {
    let place = Place {
        admin: &ns.client,
        release: &ns.name,
        objects: &ns.name,
    };
    let manifest = release.manifest().await?;
    let names = names(&manifest)?;
    let a = format!("{}-a", release.name);
    let operator_a = HostOperator::start(
        service_account_client(&ns.client, &ns.name, &names.account).await?,
        &manifest,
        &a,
        port_a,
    )
    .await?;
    wait_for_leader(&place, &names.lease, &a).await?;
    wait_for_ca_bundle(&place, &names.config, &names.secret).await?;
    check_webhook(ns).await?;
    let uids = exercise(&place, ns, prometheus, topology).await?;
    operator_a.check_running()?;

    // helm upgrade, same chart, changed values: the webhook at another port (a new replica set),
    // three replicas, a 5s webhook timeout, the fake Prometheus as the default URL.
    let port_b = free_port()?;
    let mut upgraded = values(&ns.name, port_b, None, &prometheus.url);
    upgraded["replicaCount"] = json!(3);
    upgraded["webhook"]["timeoutSeconds"] = json!(5);
    upgraded["leaderElection"] = json!({"leaseDurationSeconds": 20});
    upgraded["resources"] =
        json!({"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}});
    let started = std::time::Instant::now();
    release.upgrade(&upgraded).await?;
    eprintln!("helm upgrade took {:?}", started.elapsed());
    let manifest = release.manifest().await?;
    let deployment = one_of_kind(&manifest, "Deployment")?;
    check(deployment["spec"]["replicas"] == 3, || {
        "the upgrade did not change the replicas".into()
    })?;
    // The CRs are untouched.
    let dgds: Api<DynamoGraphDeployment> = place.api();
    let policies: Api<PlannerPolicy> = place.api();
    for (what, uid) in &uids {
        let current = match what.split_once('/') {
            Some(("DynamoGraphDeployment", name)) => dgds.get(name).await?.uid(),
            Some((_, name)) => policies.get(name).await?.uid(),
            None => None,
        };
        check(current.as_ref() == Some(uid), || {
            format!("{what} was replaced by the upgrade")
        })?;
    }

    // The rollout: a replica with the upgraded flags starts as a standby, the old one stops and
    // releases the Lease, the new one leads; the caBundle survives the upgrade (or is patched
    // back) and the webhook answers at its new address with the new timeout.
    let b = format!("{}-b", release.name);
    let operator_b = HostOperator::start(
        service_account_client(&ns.client, &ns.name, &names.account).await?,
        &manifest,
        &b,
        port_b,
    )
    .await?;
    wait_for_ca_bundle(&place, &names.config, &names.secret).await?;
    operator_a.stop().await?;
    wait_for_leader(&place, &names.lease, &b).await?;
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(ns.client.clone());
    let config = configs.get(&names.config).await?;
    check(
        config
            .webhooks
            .unwrap_or_default()
            .iter()
            .all(|w| w.timeout_seconds == Some(5)),
        || "the upgrade did not change timeoutSeconds".into(),
    )?;
    check_webhook(ns).await?;
    // A configuration whose caBundle is reset (a re-applied manifest) gets it back.
    configs
        .patch(
            &names.config,
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(json!([
                {"op": "remove", "path": "/webhooks/0/clientConfig/caBundle"}
            ]))?),
        )
        .await?;
    wait_for_ca_bundle(&place, &names.config, &names.secret).await?;

    // The new leader reconciles: a replica change of the frontend reaches its Deployment, and a
    // policy without a Prometheus URL reads the upgraded default.
    dgds.patch(
        GRAPH,
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(json!([
            {"op": "test", "path": "/spec/components/0/name", "value": "frontend"},
            {"op": "replace", "path": "/spec/components/0/replicas", "value": 2}
        ]))?),
    )
    .await?;
    let deployments: Api<Deployment> = place.api();
    poll_until("the frontend Deployment to get 2 replicas", WAIT, || async {
        Ok(deployments
            .get(&format!("{GRAPH}-frontend"))
            .await?
            .spec
            .and_then(|s| s.replicas)
            == Some(2))
    })
    .await?;
    ns.accepts(&policy("default-url", None)).await?;
    let observed = wait_condition(&policies, "default-url", "MetricsAvailable", "True").await?;
    check(observed.contains(&prometheus.url), || {
        format!("the policy did not read the upgraded default Prometheus URL: {observed}")
    })?;
    operator_b.check_running()?;
    operator_b.stop().await?;

    // helm uninstall keeps the CRDs, so the CRs stay.
    release.uninstall().await;
    check(dgds.get_opt(GRAPH).await?.is_some(), || {
        "the DGD is gone after helm uninstall".into()
    })?;
    check(policies.get_opt("sla").await?.is_some(), || {
        "the policy is gone after helm uninstall".into()
    })?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_rbac_is_enough_namespace_scoped() -> Result<()> {
    in_namespace("chart-rbac-ns", |ns| async move {
        install_crds(&ns.client).await?;
        // The operator lives in the test namespace and watches another one.
        let watched = TestNamespace::create(ns.client.clone(), "chart-rbac-watched").await?;
        let topology_name = format!("chart-{}", ns.name);
        let topology =
            ClusterScoped::create_cluster_topology(&ns.client, &cluster_topology(&topology_name)?).await?;
        let prometheus = FakePrometheus::start(MODEL).await?;
        let release = Release::new(&ns);
        let port = free_port()?;
        let outcome = async {
            release
                .install(&values(
                    &watched.name,
                    port,
                    Some(&watched.name),
                    "http://prometheus.invalid:9090",
                ))
                .await?;
            let manifest = release.manifest().await?;
            check(
                manifest
                    .iter()
                    .any(|o| o["kind"] == "Role" && o["metadata"]["namespace"] == watched.name.as_str()),
                || "no Role in the watched namespace".into(),
            )?;
            let names = names(&manifest)?;
            let place = Place {
                admin: &ns.client,
                release: &ns.name,
                objects: &watched.name,
            };
            let identity = format!("{}-a", release.name);
            let operator = HostOperator::start(
                service_account_client(&ns.client, &ns.name, &names.account).await?,
                &manifest,
                &identity,
                port,
            )
            .await?;
            wait_for_leader(&place, &names.lease, &identity).await?;
            wait_for_ca_bundle(&place, &names.config, &names.secret).await?;
            check_webhook(&watched).await?;
            exercise(&place, &watched, &prometheus, &topology_name).await?;
            // Nothing outside the watched namespace: a DGD in the release namespace is neither
            // validated (the webhook's namespaceSelector) nor reconciled. A DGD created after it
            // in the watched namespace is reconciled: the operator did have its chance.
            ns.accepts(&graph("no-such-topology")).await?;
            let mut marker = graph(&topology_name);
            marker["metadata"]["name"] = json!("marker");
            watched.accepts(&marker).await?;
            let watched_deployments: Api<Deployment> = watched.api();
            poll_until(
                "the DGD created later in the watched namespace to be reconciled",
                WAIT,
                || async { Ok(watched_deployments.get_opt("marker-frontend").await?.is_some()) },
            )
            .await?;
            let deployments: Api<Deployment> = ns.api();
            check(
                deployments.get_opt(&format!("{GRAPH}-frontend")).await?.is_none(),
                || "a DGD outside the watched namespace was reconciled".into(),
            )?;
            operator.check_running()?;
            operator.stop().await
        }
        .await;
        if outcome.is_err() {
            watched.dump().await;
        }
        release.uninstall().await;
        topology.delete().await;
        let _ = watched.delete().await;
        outcome
    })
    .await
}

/// The chart in planner-only mode (its default, `dgdController.enabled=false`), installed and run as its
/// ServiceAccount: PlannerPolicies are validated and scale a DGD, and nothing else is written (no
/// workloads, no DGD status), and DGDs are not sent to the webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_planner_only_and_scales_without_rendering() -> Result<()> {
    in_namespace("chart-planner-only", |ns| async move {
        install_crds(&ns.client).await?;
        let prometheus = FakePrometheus::start(MODEL).await?;
        let release = Release::new(&ns);
        let port = free_port()?;
        let mut planner_only = values(&ns.name, port, Some(&ns.name), &prometheus.url);
        // The chart's default.
        if let Some(values) = planner_only.as_object_mut() {
            values.remove("dgdController");
        }
        let outcome = async {
            release.install(&planner_only).await?;
            let manifest = release.manifest().await?;
            let webhooks: Vec<&Value> = of_kind(&manifest, "ValidatingWebhookConfiguration")
                .into_iter()
                .flat_map(|c| c["webhooks"].as_array().into_iter().flatten())
                .collect();
            check(
                webhooks.len() == 1 && webhooks[0]["rules"][0]["resources"] == json!(["plannerpolicies"]),
                || format!("planner-only registers more than the PlannerPolicy webhook: {webhooks:?}"),
            )?;
            let names = names(&manifest)?;
            let place = Place {
                admin: &ns.client,
                release: &ns.name,
                objects: &ns.name,
            };
            let identity = format!("{}-a", release.name);
            let operator = HostOperator::start(
                service_account_client(&ns.client, &ns.name, &names.account).await?,
                &manifest,
                &identity,
                port,
            )
            .await?;
            wait_for_leader(&place, &names.lease, &identity).await?;
            wait_for_ca_bundle(&place, &names.config, &names.secret).await?;
            let (bad, reason) = webhook_fixture("ppol-target-not-found.yaml")?;
            poll_until("the webhook to reject a bad PlannerPolicy", WAIT, || {
                let (bad, reason) = (bad.clone(), reason.clone());
                let ns = &ns;
                async move { Ok(ns.rejects(&bad, &reason).await.is_ok()) }
            })
            .await?;
            // A DGD naming a ClusterTopology that does not exist: not this operator's to check.
            ns.accepts(&graph("no-such-topology")).await?;
            let config_maps: Api<ConfigMap> = ns.api();
            config_maps
                .create(&PostParams::default(), &profile_config_map()?)
                .await?;
            ns.accepts(&policy("sla", Some(&prometheus.url))).await?;
            let dgds: Api<DynamoGraphDeployment> = ns.api();
            let policies: Api<PlannerPolicy> = ns.api();
            poll_until("the planner to scale the DGD to its decision", WAIT, || async {
                let status = status_of(&policies, "sla").await?;
                let (Some(prefill), Some(decode)) = (
                    status["desired"]["prefill"].as_i64(),
                    status["desired"]["decode"].as_i64(),
                ) else {
                    return Ok(false);
                };
                let dgd = dgds.get(GRAPH).await?;
                Ok((prefill, decode) != (1, 1)
                    && replicas_of(&dgd, "prefill").map(i64::from) == Some(prefill)
                    && replicas_of(&dgd, "decode").map(i64::from) == Some(decode))
            })
            .await?;
            // Scaled, and still nothing rendered and no status written by this operator.
            let deployments: Api<Deployment> = ns.api();
            let services: Api<Service> = ns.api();
            // The release's own Deployment and Services live here too: count the graph's.
            let of_graph = ListParams::default().labels(&format!("{GRAPH_LABEL}={GRAPH}"));
            let rendered =
                deployments.list(&of_graph).await?.items.len() + services.list(&of_graph).await?.items.len();
            check(rendered == 0, || {
                format!("{rendered} workloads rendered in planner-only mode")
            })?;
            check(dgds.get(GRAPH).await?.status.is_none(), || {
                "the DGD's status was written in planner-only mode".into()
            })?;
            operator.check_running()?;
            operator.stop().await
        }
        .await;
        release.uninstall().await;
        outcome
    })
    .await
}

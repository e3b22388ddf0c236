//! The planner in a cluster where NVIDIA's Dynamo operator owns the DynamoGraphDeployment, against
//! NVIDIA's real CRDs and example graphs from `../shared/upstream/` (see [`e2e::upstream`]):
//!
//! - Dynamo's current CRDs (v1beta1 stored, v1alpha1 served): upstream's disaggregated vLLM
//!   example scaled by a JSON Patch at v1beta1, the same graph with `scalingAdapter: {}` scaled
//!   through its DynamoGraphDeploymentScalingAdapters at v1beta1, NVIDIA's `kvTransferPolicy`
//!   example reported in the policy's status, upstream's planner example refused until its
//!   planner is scaled to zero; this operator's `kvCacheTransferTopology` is refused by NVIDIA's
//!   schema. Planner only (`--dgd-controller=false`), with exactly the RBAC `operator/src/rbac.rs`
//!   lists for that mode, and nothing else is written (no workloads, no DGD status, no Events on
//!   the DGDs, the planner's managed fields only on replicas). A concurrent change between the
//!   read and the write is a conflict, not an overwrite.
//! - Dynamo 1.1's CRDs (v1alpha1 only): the v1alpha1 examples scaled by a JSON Patch of
//!   `spec.services` and through v1alpha1 adapters (`dgdRef.serviceName`), serving replicas read
//!   from `status.services`, upstream's planner refused.
//! - Conversion (the CRDs as Dynamo 1.2 to 1.4 served them, v1alpha1 stored, through a stand-in
//!   for NVIDIA's conversion webhook, see [`crate::conversion`]): a graph and adapter written at
//!   v1alpha1 are read and scaled at v1beta1; with the webhook down the API server answers 500,
//!   which is an error, never "no graph" or "no adapter", and the policy reports it
//!   (`TargetResolved` Unknown, `TargetUnavailable`) until the webhook is back.
//! - The full operator leaves a DGD marked as another controller's alone (and, with
//!   `--dgd-selection=marked`, every DGD not marked as its own).
//!
//! NVIDIA's own operator does not run: the tests write what it would (the graphs' status, the
//! adapters it creates for `scalingAdapter` components). Its admission webhooks do not run either.
//! The first three replace the cluster-wide DGD CRD, so they are `#[ignore]`d and `make e2e`
//! runs them alone, first, like `crd_race`; each puts this operator's CRDs back at the end.

use std::{collections::BTreeSet, time::Duration};

use e2e::{
    Result, TestNamespace, apply_crd_objects,
    chart::service_account_client,
    in_namespace, in_namespace_exclusive, install_crds, poll_until,
    upstream::{self, ADAPTER_CRD, DGD_CRD, NvidiaCrds},
};
use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        core::v1::{Namespace, Pod, Service, ServiceAccount},
        events::v1::Event,
        rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use planner_api::PlannerPolicy;
use planner_operator::{
    connector::kubernetes::{self, ScaleError},
    lookup::{TargetLookup, target_graph},
    rbac::{self, Features, Scope},
    runtime::run_until,
    target::{Shape, adapter_resource, graph_resource},
};
use serde_json::{Value, json};
use tokio::{sync::oneshot, task::JoinHandle};

use crate::{
    conversion::ConversionWebhook,
    fake_prometheus::FakePrometheus,
    operator::{parse_run_args, start},
};

const WAIT: Duration = Duration::from_secs(120);
/// The model of upstream's examples (`--model Qwen/Qwen3-0.6B`), as the frontend reports it.
const MODEL: &str = "qwen/qwen3-0.6b";
/// Field manager the tests write "NVIDIA's operator's" status and adapters with.
const NVIDIA_MANAGER: &str = "dynamo-operator-e2e";
const PLANNER_MANAGER: &str = kubernetes::PLANNER_FIELD_MANAGER;
const PREFILL: &str = "VllmPrefillWorker";
const DECODE: &str = "VllmDecodeWorker";

fn dynamic(ns: &TestNamespace, resource: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(ns.client.clone(), &ns.name, resource)
}

/// Deletes NVIDIA's (or this operator's) DGD and DGDSA CRDs, and with them every object of
/// theirs, and waits until they are gone.
async fn remove_dgd_crds(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in [DGD_CRD, ADAPTER_CRD] {
        let _ = crds.delete(name, &DeleteParams::default()).await;
    }
    poll_until("the DGD and DGDSA CRDs to be gone", WAIT, || async {
        for name in [DGD_CRD, ADAPTER_CRD] {
            if crds.get_opt(name).await?.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await
}

/// This operator's CRDs and Grove's, then NVIDIA's DGD and DGDSA CRDs of `generation` in place of
/// this operator's DGD CRD.
async fn install_nvidia(client: &Client, generation: &NvidiaCrds) -> Result<()> {
    install_crds(client).await?;
    remove_dgd_crds(client).await?;
    apply_crd_objects(client, &generation.objects()?).await?;
    Ok(())
}

/// Puts this operator's CRDs back (NVIDIA's DGD CRD may have stored objects at a version this
/// operator's does not serve, so it is deleted rather than replaced).
async fn restore_crds(client: &Client) -> Result<()> {
    remove_dgd_crds(client).await?;
    install_crds(client).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dgd = crds.get(DGD_CRD).await?;
    if dgd.spec.versions.len() != 1 || crds.get_opt(ADAPTER_CRD).await?.is_some() {
        return Err(format!("{DGD_CRD} was not restored").into());
    }
    Ok(())
}

/// Creates `object` in the namespace with `fieldValidation=Strict` (upstream's examples are valid
/// on upstream's schema, field for field), under `name`.
async fn create_as(ns: &TestNamespace, mut object: Value, name: &str) -> Result<DynamicObject> {
    object["metadata"]["name"] = json!(name);
    ns.accepts(&object).await
}

/// Writes `status` through the status subresource, as NVIDIA's operator would.
async fn write_status(ns: &TestNamespace, resource: &ApiResource, name: &str, status: Value) -> Result<()> {
    let params = PatchParams {
        field_manager: Some(NVIDIA_MANAGER.into()),
        ..PatchParams::default()
    };
    dynamic(ns, resource)
        .patch_status(name, &params, &Patch::Merge(json!({ "status": status })))
        .await?;
    Ok(())
}

/// What NVIDIA's operator reports for a graph whose `components` have `(replicas, ready)` each:
/// Ready, for `generation`, in `status.components` (v1beta1) or `status.services` (v1alpha1).
fn nvidia_status(version: &str, graph: &str, generation: i64, components: &[(&str, i64, i64)]) -> Value {
    let counts: serde_json::Map<String, Value> = components
        .iter()
        .map(|(name, replicas, ready)| {
            let mut count = json!({"componentKind": "Deployment", "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": ready, "availableReplicas": ready});
            if version == "v1alpha1" {
                count["componentName"] = json!(format!("{graph}-{}", name.to_lowercase()));
            }
            ((*name).to_string(), count)
        })
        .collect();
    let field = if version == "v1alpha1" {
        "services"
    } else {
        "components"
    };
    json!({
        "state": "successful",
        "observedGeneration": generation,
        "conditions": [{"type": "Ready", "status": "True", "reason": "all_resources_are_ready", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        field: counts,
    })
}

/// Writes NVIDIA's status for graph `name` at its current generation.
async fn ready(ns: &TestNamespace, version: &str, name: &str, components: &[(&str, i64, i64)]) -> Result<()> {
    let resource = graph_resource(version);
    let generation = dynamic(ns, &resource)
        .get(name)
        .await?
        .metadata
        .generation
        .unwrap_or(1);
    write_status(
        ns,
        &resource,
        name,
        nvidia_status(version, name, generation, components),
    )
    .await
}

/// The adapter NVIDIA's operator creates for component `component` of graph `graph` (its name,
/// labels, owner and `spec.replicas` seeded from the component), at `version` (`dgdRef.serviceName`
/// at v1alpha1, `dgdRef.componentName` at v1beta1), with its status.
async fn create_adapter(
    ns: &TestNamespace,
    version: &str,
    graph: &DynamicObject,
    component: &str,
) -> Result<String> {
    let graph_name = graph.metadata.name.clone().unwrap_or_default();
    let name = planner_operator::target::adapter_name(&graph_name, component);
    let reference = if version == "v1alpha1" {
        "serviceName"
    } else {
        "componentName"
    };
    let adapter = json!({
        "apiVersion": format!("nvidia.com/{version}"),
        "kind": "DynamoGraphDeploymentScalingAdapter",
        "metadata": {
            "name": name,
            "labels": {
                "nvidia.com/dynamo-graph-deployment-name": graph_name,
                "nvidia.com/dynamo-component": component
            },
            "ownerReferences": [{
                "apiVersion": graph.types.as_ref().map(|t| t.api_version.clone()).unwrap_or_default(),
                "kind": "DynamoGraphDeployment",
                "name": graph_name,
                "uid": graph.metadata.uid.clone().unwrap_or_default(),
                "controller": true
            }]
        },
        "spec": {"replicas": 1, "dgdRef": {"name": graph_name, reference: component}}
    });
    ns.accepts(&adapter).await?;
    write_status(
        ns,
        &adapter_resource(version),
        &name,
        json!({"replicas": 1, "selector": format!("nvidia.com/dynamo-component={component},nvidia.com/dynamo-graph-deployment-name={graph_name}")}),
    )
    .await?;
    Ok(name)
}

fn policy(name: &str, target: &str, prometheus: &str, components: Option<(&str, &str)>) -> Value {
    let mut policy = json!({
        "apiVersion": "planner.dynamo.io/v1alpha1",
        "kind": "PlannerPolicy",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"name": target},
            "adjustmentInterval": "10s",
            "sla": {"ttftMs": 500, "itlMs": 50},
            "bounds": {"minReplicas": 1, "maxReplicas": 6, "maxGpuBudget": -1},
            "predictor": {"type": "constant"},
            "profile": {"builtin": "h200-llama3.1-8b-tp1"},
            "metrics": {"prometheus": {"url": prometheus}, "modelName": MODEL}
        }
    });
    if let Some((prefill, decode)) = components {
        policy["spec"]["components"] = json!({"prefill": prefill, "decode": decode});
    }
    policy
}

/// A ServiceAccount bound to exactly the permissions `rbac.rs` lists for planner-only operation
/// (no leader election, no webhook), and a client that acts as it: the watched-namespace ones in a
/// Role, the cluster-scoped ones (reading GpuBudgets and writing their status) in a ClusterRole
/// owned by the test's namespace, so the garbage collector removes it with the namespace.
async fn planner_only_client(ns: &TestNamespace) -> Result<Client> {
    let features = Features {
        dgd_controller: false,
        leader_election: false,
        webhook: false,
        ca_bundle: false,
        generated_certificates: false,
        token_secrets: false,
    };
    let mut rules = Vec::new();
    let mut cluster_rules = Vec::new();
    for permission in rbac::required(features) {
        let rule = PolicyRule {
            api_groups: Some(vec![permission.group.to_string()]),
            resources: Some(vec![permission.resource.to_string()]),
            verbs: permission.verbs.iter().map(|v| (*v).to_string()).collect(),
            ..PolicyRule::default()
        };
        match permission.scope {
            Scope::Watched => rules.push(rule),
            Scope::Cluster => cluster_rules.push(rule),
            scope => {
                return Err(format!("planner-only needs a {scope:?} permission: {permission:?}").into());
            }
        }
    }
    let name = "planner-only";
    let accounts: Api<ServiceAccount> = ns.api();
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}}))?,
        )
        .await?;
    let roles: Api<Role> = ns.api();
    roles
        .create(
            &PostParams::default(),
            &Role {
                metadata: serde_json::from_value(json!({"name": name}))?,
                rules: Some(rules),
            },
        )
        .await?;
    let bindings: Api<RoleBinding> = ns.api();
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns.name}]
            }))?,
        )
        .await?;
    if !cluster_rules.is_empty() {
        let namespace = Api::<Namespace>::all(ns.client.clone()).get(&ns.name).await?;
        let owner = json!([{
            "apiVersion": "v1", "kind": "Namespace", "name": ns.name,
            "uid": namespace.metadata.uid.unwrap_or_default(),
        }]);
        let cluster_name = format!("{name}-{}", ns.name);
        Api::<ClusterRole>::all(ns.client.clone())
            .create(
                &PostParams::default(),
                &ClusterRole {
                    metadata: serde_json::from_value(
                        json!({"name": cluster_name, "ownerReferences": owner}),
                    )?,
                    rules: Some(cluster_rules),
                    ..ClusterRole::default()
                },
            )
            .await?;
        Api::<ClusterRoleBinding>::all(ns.client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": cluster_name, "ownerReferences": owner},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": cluster_name,
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns.name}]
                }))?,
            )
            .await?;
    }
    service_account_client(&ns.client, &ns.name, name).await
}

/// The operator, planner only, in this process, with the planner-only RBAC.
struct PlannerOnly {
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::result::Result<(), planner_operator::runtime::RunError>>,
}

impl PlannerOnly {
    async fn start(ns: &TestNamespace) -> Result<Self> {
        crate::operator::init_logs();
        let client = planner_only_client(ns).await?;
        let args = parse_run_args([
            "planner-operator",
            "--namespace",
            &ns.name,
            "--metrics-addr",
            "127.0.0.1:0",
            "--leader-election=false",
            "--webhook-disabled",
            "--dgd-controller=false",
            "--identity",
            "e2e-planner-only",
        ])?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run_until(args, client, async move {
            let _ = stopped.await;
        }));
        Ok(Self { stop, task })
    }

    fn check_running(&self) -> Result<()> {
        if self.task.is_finished() {
            return Err("the operator stopped early; see its log".into());
        }
        Ok(())
    }

    async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        match tokio::time::timeout(Duration::from_secs(30), self.task).await {
            Ok(Ok(Ok(()))) => Ok(()),
            other => Err(format!("the operator did not stop cleanly: {other:?}").into()),
        }
    }
}

/// `spec.components[i].replicas` of component `name` (v1beta1), or
/// `spec.services.<name>.replicas` (v1alpha1); a component without replicas has 1.
fn replicas_of(object: &DynamicObject, name: &str) -> Option<i64> {
    let spec = &object.data["spec"];
    let component = match spec.get("components").and_then(Value::as_array) {
        Some(list) => list.iter().find(|c| c["name"] == name)?,
        None => spec.get("services")?.get(name)?,
    };
    Some(component.get("replicas").and_then(Value::as_i64).unwrap_or(1))
}

async fn adapter_replicas(ns: &TestNamespace, version: &str, name: &str) -> Result<Option<i32>> {
    Ok(dynamic(ns, &adapter_resource(version))
        .get_scale(name)
        .await?
        .spec
        .and_then(|s| s.replicas))
}

/// The leaves of a `fieldsV1` tree, as `/`-joined paths.
fn leaves(prefix: &str, fields: &Value, out: &mut Vec<String>) {
    match fields.as_object() {
        Some(map) if !map.is_empty() => {
            for (key, value) in map {
                if key == "." {
                    continue;
                }
                leaves(&format!("{prefix}/{key}"), value, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

/// The managers of an object's managed fields, and the fields `manager` owns.
fn managed(object: &DynamicObject, manager: &str) -> (BTreeSet<String>, Vec<String>) {
    let mut managers = BTreeSet::new();
    let mut fields = Vec::new();
    for entry in object.metadata.managed_fields.iter().flatten() {
        let name = entry.manager.clone().unwrap_or_default();
        if name == manager
            && let Some(owned) = &entry.fields_v1
        {
            leaves("", &owned.0, &mut fields);
        }
        managers.insert(name);
    }
    (managers, fields)
}

/// A condition of a PlannerPolicy: `(status, reason, message)`.
async fn policy_condition(
    ns: &TestNamespace,
    policy: &str,
    kind: &str,
) -> Result<Option<(String, String, String)>> {
    let api: Api<PlannerPolicy> = ns.api();
    Ok(api
        .get(policy)
        .await?
        .status
        .unwrap_or_default()
        .conditions
        .into_iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status, c.reason, c.message)))
}

/// Nothing but replicas was written to the graphs: no workloads, their status as the test left
/// it, the planner's managed fields only on replicas (none on `untouched` graphs), and no Events
/// about anything but PlannerPolicies.
async fn check_nothing_else_written(
    ns: &TestNamespace,
    resource: &ApiResource,
    statuses: &[(&str, Value)],
    untouched: &[&str],
) -> Result<()> {
    let deployments: Api<Deployment> = ns.api();
    let services: Api<Service> = ns.api();
    let pods: Api<Pod> = ns.api();
    let params = ListParams::default();
    if !deployments.list(&params).await?.items.is_empty()
        || !services.list(&params).await?.items.is_empty()
        || !pods.list(&params).await?.items.is_empty()
    {
        return Err("planner-only mode created workloads".into());
    }
    for (name, before) in statuses {
        let object = dynamic(ns, resource).get(name).await?;
        if object.data["status"] != *before {
            return Err(format!("the status of DGD {name} changed: {}", object.data["status"]).into());
        }
        let (managers, fields) = managed(&object, PLANNER_MANAGER);
        let allowed: BTreeSet<String> = [e2e::FIELD_MANAGER, NVIDIA_MANAGER, PLANNER_MANAGER]
            .into_iter()
            .map(String::from)
            .collect();
        if !managers.is_subset(&allowed) {
            return Err(format!("DGD {name} has unexpected field managers: {managers:?}").into());
        }
        if untouched.contains(name) {
            if managers.contains(PLANNER_MANAGER) {
                return Err(
                    format!("the planner patched DGD {name}, whose pools its scaling adapters own").into(),
                );
            }
        } else if fields.is_empty() || !fields.iter().all(|f| f.ends_with("/f:replicas")) {
            return Err(format!("the planner owns more than replicas of DGD {name}: {fields:?}").into());
        }
        eprintln!("DGD {name}: managers {managers:?}, planner owns {fields:?}");
    }
    let events: Api<Event> = ns.api();
    for event in events.list(&params).await?.items {
        let kind = event
            .regarding
            .as_ref()
            .and_then(|r| r.kind.clone())
            .unwrap_or_default();
        if kind != "PlannerPolicy" {
            return Err(format!("an Event about a {kind}: {:?}", event.note).into());
        }
    }
    Ok(())
}

/// Deletes every DGD and DGDSA of the namespace at `version` and waits until they are gone
/// (before the CRDs go, and while a conversion webhook they may need still runs).
async fn delete_graphs(ns: &TestNamespace, version: &str) -> Result<()> {
    for resource in [graph_resource(version), adapter_resource(version)] {
        let _ = dynamic(ns, &resource)
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
    }
    poll_until("the graphs and adapters to be gone", WAIT, || async {
        for resource in [graph_resource(version), adapter_resource(version)] {
            if !dynamic(ns, &resource)
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
            {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await
}

/// Upstream's disaggregated example with `scalingAdapter` on both workers (v1beta1 `{}`, v1alpha1
/// `{enabled: true}`), as NVIDIA's autoscaling docs show it.
fn with_adapters(mut graph: Value) -> Value {
    if let Some(components) = graph
        .pointer_mut("/spec/components")
        .and_then(Value::as_array_mut)
    {
        for component in components {
            if component["name"] == PREFILL || component["name"] == DECODE {
                component["scalingAdapter"] = json!({});
            }
        }
    }
    if let Some(services) = graph.pointer_mut("/spec/services").and_then(Value::as_object_mut) {
        for (name, service) in services {
            if name == PREFILL || name == DECODE {
                service["scalingAdapter"] = json!({"enabled": true});
            }
        }
    }
    graph
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "replaces the shared DGD CRD: make e2e runs it alone, first"]
async fn planner_only_on_nvidias_current_crds_scales_upstreams_examples() -> Result<()> {
    in_namespace_exclusive("nvidia-current", |ns| async move {
        install_nvidia(&ns.client, &NvidiaCrds::Current).await?;
        let outcome = current(&ns).await;
        let _ = delete_graphs(&ns, "v1beta1").await;
        let restored = restore_crds(&ns.client).await;
        outcome.and(restored)
    })
    .await
}

async fn current(ns: &TestNamespace) -> Result<()> {
    let v1beta1 = graph_resource("v1beta1");
    let workers = [(PREFILL, 1, 1), (DECODE, 1, 1)];
    // This operator's field is not NVIDIA's: its schema refuses it (and would prune it).
    let mut foreign = upstream::example("vllm-disagg.v1beta1.yaml")?;
    foreign["spec"]["components"][0]["kvCacheTransferTopology"] =
        json!({"level": "zone", "label": "topology.kubernetes.io/zone"});
    ns.rejects(
        &foreign,
        "unknown field \"spec.components[0].kvCacheTransferTopology\"",
    )
    .await?;

    // What users apply and NVIDIA's operator makes of it: the graphs, their status, the adapters.
    create_as(ns, upstream::example("vllm-disagg.v1beta1.yaml")?, "direct").await?;
    let adapted = create_as(
        ns,
        with_adapters(upstream::example("vllm-disagg.v1beta1.yaml")?),
        "adapted",
    )
    .await?;
    let mut adapters = Vec::new();
    for component in [PREFILL, DECODE] {
        adapters.push(create_adapter(ns, "v1beta1", &adapted, component).await?);
    }
    create_as(
        ns,
        upstream::example("vllm-disagg_planner.v1beta1.yaml")?,
        "planned",
    )
    .await?;
    create_as(
        ns,
        upstream::example("doc-kvtransferpolicy-labelkey.v1beta1.yaml")?,
        "zone",
    )
    .await?;
    for name in ["direct", "adapted", "zone"] {
        ready(ns, "v1beta1", name, &workers).await?;
    }
    ready(
        ns,
        "v1beta1",
        "planned",
        &[(PREFILL, 1, 1), (DECODE, 1, 1), ("Planner", 1, 1)],
    )
    .await?;
    let mut statuses: Vec<(&str, Value)> = Vec::new();
    for name in ["direct", "adapted", "zone"] {
        statuses.push((
            name,
            dynamic(ns, &v1beta1).get(name).await?.data["status"].clone(),
        ));
    }

    let prometheus = FakePrometheus::start(MODEL).await?;
    let operator = PlannerOnly::start(ns).await?;
    ns.accepts(&policy("direct", "direct", &prometheus.url, None))
        .await?;
    ns.accepts(&policy("adapted", "adapted", &prometheus.url, None))
        .await?;
    ns.accepts(&policy("planned", "planned", &prometheus.url, None))
        .await?;
    // NVIDIA's kvTransferPolicy example types both workers `worker`: the policy names them.
    ns.accepts(&policy("zone", "zone", &prometheus.url, Some((PREFILL, DECODE))))
        .await?;

    let outcome = async {
        let moved = |name: &'static str| async move {
            let graph = dynamic(ns, &graph_resource("v1beta1")).get(name).await?;
            Ok::<_, e2e::Error>(replicas_of(&graph, PREFILL) != Some(1) || replicas_of(&graph, DECODE) != Some(1))
        };
        poll_until("the planner to patch the v1beta1 graph's components", WAIT, || moved("direct")).await?;
        poll_until("the planner to scale through the v1beta1 adapters", WAIT, || async {
            let mut moved = false;
            for adapter in &adapters {
                moved |= adapter_replicas(ns, "v1beta1", adapter).await? != Some(1);
            }
            Ok(moved)
        })
        .await?;
        poll_until("the kvTransferPolicy graph scaled", WAIT, || moved("zone")).await?;
        // Planner only: the graph's KV-transfer domain is reported, nothing is rendered.
        let api: Api<PlannerPolicy> = ns.api();
        let reported = api.get("zone").await?.status.unwrap_or_default().kv_transfer;
        let reported = serde_json::to_value(reported)?;
        assert_eq!(
            reported,
            json!({"domain": "zone", "enforcement": "required", "labelKey": "topology.kubernetes.io/zone", "field": "spec.experimental.kvTransferPolicy"})
        );

        // Upstream's planner runs in "planned": refused, its replicas untouched.
        poll_until("the policy on a graph running upstream's planner to be refused", WAIT, || async {
            Ok(policy_condition(ns, "planned", "TargetResolved")
                .await?
                .is_some_and(|(status, reason, message)| {
                    status == "False"
                        && reason == "UpstreamPlannerRunning"
                        && message.contains("component \"Planner\", type planner, 1 replica")
                        && message.contains("spec.components[1].replicas: 0")
                }))
        })
        .await?;
        let planned = dynamic(ns, &v1beta1).get("planned").await?;
        assert_eq!(
            (replicas_of(&planned, PREFILL), replicas_of(&planned, DECODE)),
            (Some(1), Some(1)),
            "a graph whose planner runs is not scaled"
        );
        // Handed over: upstream's planner scaled to zero (NVIDIA's operator reports the new
        // generation), and the policy takes over.
        dynamic(ns, &v1beta1)
            .patch(
                "planned",
                &PatchParams {
                    field_manager: Some(e2e::FIELD_MANAGER.into()),
                    ..PatchParams::default()
                },
                &Patch::Json::<()>(serde_json::from_value(json!([
                    {"op": "test", "path": "/spec/components/1/name", "value": "Planner"},
                    {"op": "replace", "path": "/spec/components/1/replicas", "value": 0}
                ]))?),
            )
            .await?;
        ready(ns, "v1beta1", "planned", &[(PREFILL, 1, 1), (DECODE, 1, 1), ("Planner", 0, 0)]).await?;
        let handed_over = dynamic(ns, &v1beta1).get("planned").await?.data["status"].clone();
        poll_until("the handed-over graph scaled", WAIT, || moved("planned")).await?;
        operator.check_running()?;
        Ok::<_, e2e::Error>(handed_over)
    }
    .await;
    let stopped = operator.stop().await;
    statuses.push(("planned", outcome?));
    stopped?;

    check_nothing_else_written(ns, &v1beta1, &statuses, &["adapted"]).await?;
    let adapted = dynamic(ns, &v1beta1).get("adapted").await?;
    assert_eq!(
        (replicas_of(&adapted, PREFILL), replicas_of(&adapted, DECODE)),
        (Some(1), Some(1)),
        "the adapted graph's own replicas are the adapters' to carry"
    );

    // A change between the read and the write is a conflict, not an overwrite.
    let admin = &ns.client;
    let TargetLookup::Found(stale) = target_graph(admin, &ns.name, "direct").await? else {
        return Err("DGD direct not found".into());
    };
    assert_eq!(
        (stale.shape, stale.version.as_str()),
        (Shape::Components, "v1beta1")
    );
    let decode = stale.component(DECODE).map(|c| c.index).ok_or("no decode")?;
    let replicas = stale.component(DECODE).and_then(|c| c.replicas).unwrap_or(1);
    dynamic(ns, &v1beta1)
        .patch(
            "direct",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(json!([
                {"op": "replace", "path": format!("/spec/components/{decode}/replicas"), "value": replicas + 1}
            ]))?),
        )
        .await?;
    let conflict = kubernetes::set_replicas(admin, &stale, &Default::default(), &[(DECODE, 6)]).await;
    if !matches!(conflict, Err(ScaleError::Conflict { .. })) {
        return Err(format!("a stale DGD write was not a conflict: {conflict:?}").into());
    }
    let TargetLookup::Found(adapted) = target_graph(admin, &ns.name, "adapted").await? else {
        return Err("DGD adapted not found".into());
    };
    let stale_adapters = kubernetes::adapters(admin, &adapted, &[DECODE]).await?;
    let decode_adapter = stale_adapters.get(DECODE).ok_or("no decode adapter")?;
    assert_eq!(decode_adapter.version, "v1beta1");
    dynamic(ns, &adapter_resource("v1beta1"))
        .patch_scale(
            &decode_adapter.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": decode_adapter.spec_replicas + 1}})),
        )
        .await?;
    let conflict = kubernetes::set_replicas(admin, &adapted, &stale_adapters, &[(DECODE, 6)]).await;
    if !matches!(conflict, Err(ScaleError::Conflict { .. })) {
        return Err(format!("a stale scale write was not a conflict: {conflict:?}").into());
    }
    // Without its adapter, a component that declares one is not patched in the DGD.
    let missing = kubernetes::set_replicas(admin, &adapted, &Default::default(), &[(PREFILL, 5)]).await;
    if !matches!(missing, Err(ScaleError::AdapterMissing { .. })) {
        return Err(format!("a component without its adapter was scaled: {missing:?}").into());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "replaces the shared DGD CRD: make e2e runs it alone, first"]
async fn planner_only_on_dynamo_1_1_crds_scales_at_v1alpha1() -> Result<()> {
    in_namespace_exclusive("nvidia-v1alpha1", |ns| async move {
        install_nvidia(&ns.client, &NvidiaCrds::V1alpha1Only).await?;
        let outcome = v1alpha1_only(&ns).await;
        let _ = delete_graphs(&ns, "v1alpha1").await;
        let restored = restore_crds(&ns.client).await;
        outcome.and(restored)
    })
    .await
}

async fn v1alpha1_only(ns: &TestNamespace) -> Result<()> {
    let v1alpha1 = graph_resource("v1alpha1");
    // Two prefill replicas asked for, one serving: the planner must see one (status.services).
    let mut direct = upstream::example("vllm-disagg.v1alpha1.yaml")?;
    direct["spec"]["services"][PREFILL]["replicas"] = json!(2);
    create_as(ns, direct, "direct").await?;
    let adapted = create_as(
        ns,
        with_adapters(upstream::example("vllm-disagg.v1alpha1.yaml")?),
        "adapted",
    )
    .await?;
    let mut adapters = Vec::new();
    for component in [PREFILL, DECODE] {
        adapters.push(create_adapter(ns, "v1alpha1", &adapted, component).await?);
    }
    create_as(
        ns,
        upstream::example("vllm-disagg_planner.v1alpha1.yaml")?,
        "planned",
    )
    .await?;
    ready(ns, "v1alpha1", "direct", &[(PREFILL, 2, 1), (DECODE, 1, 1)]).await?;
    ready(ns, "v1alpha1", "adapted", &[(PREFILL, 1, 1), (DECODE, 1, 1)]).await?;
    ready(
        ns,
        "v1alpha1",
        "planned",
        &[(PREFILL, 1, 1), (DECODE, 1, 1), ("Planner", 1, 1)],
    )
    .await?;
    let statuses_before: Vec<(&str, Value)> = {
        let mut statuses = Vec::new();
        for name in ["direct", "adapted", "planned"] {
            statuses.push((
                name,
                dynamic(ns, &v1alpha1).get(name).await?.data["status"].clone(),
            ));
        }
        statuses
    };

    let prometheus = FakePrometheus::start(MODEL).await?;
    let operator = PlannerOnly::start(ns).await?;
    for name in ["direct", "adapted", "planned"] {
        ns.accepts(&policy(name, name, &prometheus.url, None)).await?;
    }
    let outcome = async {
        poll_until(
            "the planner to patch the v1alpha1 graph's services",
            WAIT,
            || async {
                let graph = dynamic(ns, &v1alpha1).get("direct").await?;
                Ok(replicas_of(&graph, PREFILL) != Some(2) || replicas_of(&graph, DECODE) != Some(1))
            },
        )
        .await?;
        // The serving replicas were read from status.services.
        let api: Api<PlannerPolicy> = ns.api();
        let current = api.get("direct").await?.status.unwrap_or_default().current;
        assert_eq!(
            current.map(|c| (c.prefill, c.decode)),
            Some((1, 1)),
            "from status.services"
        );
        poll_until(
            "the planner to scale through the v1alpha1 adapters",
            WAIT,
            || async {
                let mut moved = false;
                for adapter in &adapters {
                    moved |= adapter_replicas(ns, "v1alpha1", adapter).await? != Some(1);
                }
                Ok(moved)
            },
        )
        .await?;
        poll_until(
            "the policy on a graph running upstream's planner to be refused",
            WAIT,
            || async {
                Ok(policy_condition(ns, "planned", "TargetResolved")
                    .await?
                    .is_some_and(|(status, reason, message)| {
                        status == "False"
                            && reason == "UpstreamPlannerRunning"
                            && message.contains("spec.services.Planner.replicas: 0")
                    }))
            },
        )
        .await?;
        operator.check_running()
    }
    .await;
    let stopped = operator.stop().await;
    outcome?;
    stopped?;
    check_nothing_else_written(ns, &v1alpha1, &statuses_before[..1], &[]).await?;
    check_nothing_else_written(ns, &v1alpha1, &statuses_before[1..], &["adapted", "planned"]).await?;
    let TargetLookup::Found(graph) = target_graph(&ns.client, &ns.name, "direct").await? else {
        return Err("DGD direct not found".into());
    };
    assert_eq!(
        (graph.shape, graph.version.as_str()),
        (Shape::Services, "v1alpha1")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "replaces the shared DGD CRD: make e2e runs it alone, first"]
async fn conversion_through_nvidias_webhook_and_its_outage() -> Result<()> {
    in_namespace_exclusive("nvidia-conversion", |ns| async move {
        let webhook = ConversionWebhook::start().await?;
        let crds = NvidiaCrds::StoredAtV1alpha1 {
            url: webhook.url.clone(),
            ca_bundle: webhook.ca_bundle.clone(),
        };
        install_nvidia(&ns.client, &crds).await?;
        let outcome = conversion(&ns, &webhook).await;
        // The objects are stored at v1alpha1: delete them while the webhook can convert them.
        let _ = webhook.start_again().await;
        let _ = delete_graphs(&ns, "v1alpha1").await;
        let restored = restore_crds(&ns.client).await;
        webhook.stop().await;
        outcome.and(restored)
    })
    .await
}

async fn conversion(ns: &TestNamespace, webhook: &ConversionWebhook) -> Result<()> {
    let v1alpha1 = graph_resource("v1alpha1");
    // Written at v1alpha1 (stored so), the decode pool owned by its adapter.
    let mut graph = upstream::example("vllm-disagg.v1alpha1.yaml")?;
    graph["spec"]["services"][DECODE]["scalingAdapter"] = json!({"enabled": true});
    let created = create_as(ns, graph, "converted").await?;
    let adapter = create_adapter(ns, "v1alpha1", &created, DECODE).await?;
    ready(ns, "v1alpha1", "converted", &[(PREFILL, 1, 1), (DECODE, 1, 1)]).await?;

    // Read at v1beta1 through the conversion webhook.
    let admin = &ns.client;
    let TargetLookup::Found(read) = target_graph(admin, &ns.name, "converted").await? else {
        return Err("DGD converted not found at v1beta1".into());
    };
    assert_eq!(
        (read.shape, read.version.as_str()),
        (Shape::Components, "v1beta1")
    );
    assert_eq!(
        read.serving(PREFILL),
        Some(1),
        "status.services converted to status.components"
    );
    assert!(read.component(DECODE).is_some_and(|c| c.scaling_adapter));

    let prometheus = FakePrometheus::start(MODEL).await?;
    let operator = PlannerOnly::start(ns).await?;
    ns.accepts(&policy("converted", "converted", &prometheus.url, None))
        .await?;
    let outcome = async {
        poll_until(
            "the planner's v1beta1 patch, read back at v1alpha1",
            WAIT,
            || async {
                let graph = dynamic(ns, &v1alpha1).get("converted").await?;
                Ok(replicas_of(&graph, PREFILL) != Some(1))
            },
        )
        .await?;
        poll_until(
            "the planner's v1beta1 scale of the v1alpha1 adapter",
            WAIT,
            || async { Ok(adapter_replicas(ns, "v1alpha1", &adapter).await? != Some(1)) },
        )
        .await?;

        // NVIDIA's webhook down: the API server answers 500, which is an error, never "no graph"
        // or "no adapter" (a pool whose adapter reads as missing would be left unscaled, or
        // patched), and the policy says so.
        webhook.stop().await;
        match target_graph(admin, &ns.name, "converted").await {
            Err(error) => eprintln!("with the conversion webhook down, the graph: {error}"),
            Ok(found) => {
                return Err(format!("with the conversion webhook down the graph read as {found:?}").into());
            }
        }
        match kubernetes::adapters(admin, &read, &[DECODE]).await {
            Err(ScaleError::Api {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 500 => {
                eprintln!(
                    "with the conversion webhook down, the adapter: {}",
                    status.message
                )
            }
            other => {
                return Err(format!("with the conversion webhook down the adapter read as {other:?}").into());
            }
        }
        poll_until("the policy to report the unreadable target", WAIT, || async {
            Ok(policy_condition(ns, "converted", "TargetResolved")
                .await?
                .is_some_and(|(status, reason, message)| {
                    status == "Unknown"
                        && reason == "TargetUnavailable"
                        && message.contains("conversion webhook")
                        && message.contains("the replicas are left as they are")
                }))
        })
        .await?;
        // Back: planning resumes.
        webhook.start_again().await?;
        poll_until("the policy to read its target again", WAIT, || async {
            Ok(policy_condition(ns, "converted", "TargetResolved")
                .await?
                .is_some_and(|(status, _, _)| status == "True"))
        })
        .await?;
        operator.check_running()
    }
    .await;
    let stopped = operator.stop().await;
    outcome.and(stopped)
}

/// The full operator never renders a DGD marked as another controller's: labelled so, or
/// rendered by NVIDIA's operator (`status.state`); with `--dgd-selection=marked`, only DGDs
/// labelled as its own. Unmarked DGDs render as before (so the test is not vacuous).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dgd_controller_leaves_other_controllers_dgds_alone() -> Result<()> {
    in_namespace("dgd-selection", |ns| async move {
        install_crds(&ns.client).await?;
        let v1beta1 = graph_resource("v1beta1");
        let labelled = |controller: Option<&str>| -> Result<Value> {
            let mut graph = upstream::example("vllm-disagg.v1beta1.yaml")?;
            if let Some(controller) = controller {
                graph["metadata"]["labels"] = json!({"planner.dynamo.io/dgd-controller": controller});
            }
            Ok(graph)
        };
        create_as(&ns, labelled(Some("nvidia"))?, "theirs").await?;
        create_as(&ns, labelled(None)?, "rendered-by-nvidia").await?;
        write_status(
            &ns,
            &v1beta1,
            "rendered-by-nvidia",
            json!({"state": "successful"}),
        )
        .await?;
        create_as(&ns, labelled(None)?, "ours").await?;

        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let deployments: Api<Deployment> = ns.api();
        let of = |graph: &str| {
            ListParams::default().labels(&format!("nvidia.com/dynamo-graph-deployment-name={graph}"))
        };
        let outcome = async {
            poll_until("the unmarked DGD's Deployments and status", WAIT, || async {
                let ours = dynamic(&ns, &v1beta1).get("ours").await?;
                Ok(deployments.list(&of("ours")).await?.items.len() == 3
                    && ours.data["status"]["conditions"].is_array())
            })
            .await?;
            // Let a few reconciles pass.
            tokio::time::sleep(Duration::from_secs(3)).await;
            operator.check_running()?;
            for name in ["theirs", "rendered-by-nvidia"] {
                if !deployments.list(&of(name)).await?.items.is_empty() {
                    return Err(format!("DGD {name} was rendered").into());
                }
                let object = dynamic(&ns, &v1beta1).get(name).await?;
                if object.data["status"].get("conditions").is_some() {
                    return Err(format!("DGD {name}'s status was written: {}", object.data["status"]).into());
                }
            }
            Ok::<_, e2e::Error>(())
        }
        .await;
        operator.stop().await?;
        outcome?;

        // Marked selection: only DGDs labelled as this operator's.
        create_as(&ns, labelled(None)?, "unlabelled").await?;
        create_as(&ns, labelled(Some("planner-operator"))?, "selected").await?;
        let operator = start(&ns, &["--webhook-disabled", "--dgd-selection", "marked"]).await?;
        let outcome = async {
            poll_until("the selected DGD's Deployments", WAIT, || async {
                Ok(deployments.list(&of("selected")).await?.items.len() == 3)
            })
            .await?;
            tokio::time::sleep(Duration::from_secs(3)).await;
            operator.check_running()?;
            if !deployments.list(&of("unlabelled")).await?.items.is_empty() {
                return Err("an unlabelled DGD was rendered with --dgd-selection=marked".into());
            }
            Ok::<_, e2e::Error>(())
        }
        .await;
        operator.stop().await?;
        outcome
    })
    .await
}

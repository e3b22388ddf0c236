//! The controllers this process runs while it leads, the caches they read, and the wait for
//! the CRDs they watch.

use std::{sync::Arc, time::Duration};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Pod, PodSpec},
};
use kube::{
    Api, Client, ResourceExt,
    api::ListParams,
    core::ApiResource,
    runtime::{
        WatchStreamExt,
        events::Reporter,
        reflector::{self, ReflectHandle, Store},
        watcher,
    },
};
use tokio::sync::watch;
use tracing::{error, info, warn};

use planner_api::{DynamoGraphDeployment, PlannerPolicy, labels::LABEL_GRAPH};

use super::args::RunArgs;
use crate::{
    controller::{self, Context, common::Events},
    lookup::{self, ClusterTopologyApi},
    metrics::operator::OperatorMetrics,
};

/// Runs every controller until `stop` resolves: the PlannerPolicy reconciler, and with
/// `--dgd-controller` the DGD reconciler and the topology label controller (and the Deployment
/// and pod caches they read).
pub(super) async fn run_controllers(
    client: &Client,
    args: &RunArgs,
    identity: &str,
    metrics: Arc<OperatorMetrics>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let recorder = events(client, identity);
    let stop = stop.shared();
    if !args.dgd_controller {
        info!("DGD controller off (--dgd-controller=false): reconciling PlannerPolicies only");
        // Empty caches: nothing reads them without the DGD controller.
        let caches = (reflector::store().0, reflector::store().0);
        let ctx = context(client, args, recorder, metrics, caches);
        run_planner(ctx, args, stop).await;
        return;
    }
    let (deployment_store, deployments) = watch_deployments(client, args.namespace.as_deref());
    let Some(pods) = watch_pods(client, args.namespace.as_deref()) else {
        error!("cannot subscribe to the shared pod cache; controllers not started");
        return;
    };
    let ctx = context(
        client,
        args,
        recorder,
        metrics,
        (deployment_store, pods.store.clone()),
    );
    let cluster_topologies = topology_kinds(client, &args.cluster_topology_api_version).await;
    let controllers = futures::future::join3(
        controller::dgd::run(
            Arc::clone(&ctx),
            deployments,
            controller::topology_labels::label_changes(pods.count_changes),
            cluster_topologies,
            args.namespace.clone(),
            stop.clone(),
        ),
        controller::topology_labels::run(Arc::clone(&ctx), pods.label_changes, pods.store, stop.clone()),
        run_planner(ctx, args, stop),
    );
    tokio::select! {
        _ = controllers => {},
        () = pods.watch => warn!("pod watch ended"),
    }
}

/// The planner's controllers, side by side: the PlannerPolicy reconciler and the GpuBudget
/// reconciler, which share the budgets' ledger.
async fn run_planner(
    ctx: Arc<Context>,
    args: &RunArgs,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let planner_ctx = Arc::new(
        controller::planner_policy::PlannerContext::new(ctx, args.prometheus_url.clone())
            .with_tenancy(args.tenancy()),
    );
    let budget_ctx = planner_ctx.budget_context();
    // The policies' watch scope, for the ledger a new leader restores, before either starts.
    planner_ctx.budgets.set_scope(args.namespace.clone());
    let stop = futures::FutureExt::shared(stop);
    futures::future::join(
        controller::planner_policy::run(planner_ctx, args.namespace.clone(), stop.clone()),
        controller::gpu_budget::run(budget_ctx, args.namespace.clone(), stop),
    )
    .await;
}

/// Events from this process, as `planner-operator` with its identity as the instance.
fn events(client: &Client, identity: &str) -> Events {
    Events::new(
        client.clone(),
        Reporter {
            controller: "planner-operator".into(),
            instance: Some(identity.to_string()),
        },
    )
}

/// What every controller shares: the client, Events, metrics, the Deployment and pod caches
/// and the settings the reconcilers read.
fn context(
    client: &Client,
    args: &RunArgs,
    recorder: Events,
    metrics: Arc<OperatorMetrics>,
    (deployments, pods): (Store<Deployment>, Store<Pod>),
) -> Arc<Context> {
    Arc::new(Context {
        client: client.clone(),
        recorder,
        metrics,
        deployments,
        pods,
        cluster_topology_api: args.cluster_topology_api_version.clone(),
        dgd_selection: args.dgd_selection,
        topology_env: args.topology_env,
    })
}

/// The cache of the Deployments of DGD components, and the stream of their changes that drives
/// the DGD reconciler.
fn watch_deployments(
    client: &Client,
    namespace: Option<&str>,
) -> (
    Store<Deployment>,
    impl futures::Stream<Item = Result<Deployment, watcher::Error>> + Send + 'static,
) {
    let deployments_api: Api<Deployment> = controller::common::scoped_api(client.clone(), namespace);
    // Keep only what status needs, so 500 graphs fit in a few megabytes.
    let (store, writer) = reflector::store();
    let deployments = watcher(
        deployments_api,
        watcher::Config::default().labels(LABEL_GRAPH).any_semantic(),
    )
    .default_backoff()
    .modify(|d: &mut Deployment| {
        d.managed_fields_mut().clear();
        d.annotations_mut().clear();
        d.spec = None;
    })
    .reflect(writer)
    .touched_objects();
    (store, deployments)
}

/// One pod watch for the topology label controller and the DGD reconciler's counts.
struct PodCache<W> {
    store: Store<Pod>,
    /// Pod changes for the topology label controller.
    label_changes: ReflectHandle<Pod>,
    /// Pod changes for the DGD reconciler's counts.
    count_changes: ReflectHandle<Pod>,
    /// The watch that fills the cache; runs until the process stops.
    watch: W,
}

/// Watches the pods of DGD components, trimmed to what the controllers read; `None` when the
/// shared cache cannot be subscribed to.
fn watch_pods(client: &Client, namespace: Option<&str>) -> Option<PodCache<impl Future<Output = ()>>> {
    let pods_api: Api<Pod> = controller::common::scoped_api(client.clone(), namespace);
    let (store, writer) = reflector::store_shared(1024);
    let (Some(label_changes), Some(count_changes)) = (writer.subscribe(), writer.subscribe()) else {
        return None;
    };
    let watch = watcher(
        pods_api,
        watcher::Config::default().labels(LABEL_GRAPH).any_semantic(),
    )
    .default_backoff()
    .modify(trim_pod)
    .reflect_shared(writer)
    .for_each(|event| async move {
        if let Err(error) = event {
            warn!(%error, "pod watch failed; retrying");
        }
    });
    Some(PodCache {
        store,
        label_changes,
        count_changes,
        watch,
    })
}

/// Where Grove's ClusterTopologyBindings and ClusterTopologies are served, to watch them only
/// there; without Grove the periodic resync re-checks DGDs that name one.
async fn topology_kinds(client: &Client, topology_api: &ClusterTopologyApi) -> Vec<ApiResource> {
    match lookup::topology_kinds_served(client, topology_api).await {
        Ok(served) => {
            let resources = served.resources(topology_api);
            if resources.is_empty() {
                info!(api = %topology_api, "ClusterTopologyBindings and ClusterTopologies are not served (Grove not installed); not watching them");
            }
            resources
        }
        Err(error) => {
            warn!(%error, "cannot tell whether Grove's topology kinds are served; not watching them");
            Vec::new()
        }
    }
}

/// Keeps only what the topology label controller and the DGD status read of a pod.
fn trim_pod(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
    pod.annotations_mut()
        .retain(|key, _| key == crate::topology::LABELS_ANNOTATION);
    let node_name = pod.spec.as_mut().and_then(|s| s.node_name.take());
    pod.spec = Some(PodSpec {
        node_name,
        ..PodSpec::default()
    });
    pod.status = None;
}

/// First and longest wait between checks for the CRDs.
const CRD_RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));

/// Waits, with backoff, until the API server serves the CRDs this operator watches (the DGD's
/// only with `dgd_controller`); `false` when shutdown was requested first.
pub(super) async fn wait_for_crds(
    client: &Client,
    namespace: Option<&str>,
    dgd_controller: bool,
    mut shutdown: watch::Receiver<bool>,
) -> bool {
    let mut delay = CRD_RETRY.0;
    loop {
        let missing = match crds_served(client, namespace, dgd_controller).await {
            Ok(()) => return true,
            Err(missing) => missing,
        };
        warn!(
            crd = missing.0,
            error = %crate::controller::common::chain(&missing.1),
            retry_in = ?delay,
            "waiting for the CRD to be served (install the CRDs: `planner-operator crd | kubectl apply --server-side -f -`); not ready until then"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {},
            _ = shutdown.wait_for(|stop| *stop) => return false,
        }
        delay = (delay * 2).min(CRD_RETRY.1);
    }
}

/// Lists one object of each CRD the controllers watch (DGDs only with the DGD controller: the
/// planner alone reads its targets by name, and NVIDIA's operator may install their CRD later;
/// PlannerPolicies and GpuBudgets always); the error names the CRD that failed.
async fn crds_served(
    client: &Client,
    namespace: Option<&str>,
    dgd_controller: bool,
) -> Result<(), (&'static str, kube::Error)> {
    let params = ListParams::default().limit(1);
    if dgd_controller {
        let dgds: Api<DynamoGraphDeployment> =
            crate::controller::common::scoped_api(client.clone(), namespace);
        dgds.list_metadata(&params)
            .await
            .map_err(|e| ("dynamographdeployments.nvidia.com", e))?;
    }
    let policies: Api<PlannerPolicy> = crate::controller::common::scoped_api(client.clone(), namespace);
    policies
        .list_metadata(&params)
        .await
        .map_err(|e| ("plannerpolicies.planner.dynamo.io", e))?;
    let budgets: Api<planner_api::GpuBudget> = Api::all(client.clone());
    budgets
        .list_metadata(&params)
        .await
        .map_err(|e| ("gpubudgets.planner.dynamo.io", e))?;
    Ok(())
}

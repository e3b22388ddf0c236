//! The DynamoGraphDeployment reconciler: renders each component as a Deployment (and each
//! frontend as a Service), applies them, removes what the spec no longer has, writes status.
//!
//! It only ever writes objects the DGD controls: a Deployment or Service that already exists
//! under a rendered name without this DGD's owner reference (someone else's, or a copy) is left
//! unchanged and reported (`WorkloadsOwned=False`, reason `WorkloadConflict`, and a Warning
//! Event naming it), as a Deployment controller reports a ReplicaSet it does not own.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        core::v1::{Pod, Service},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
    core::{ApiResource, DeserializeGuard, DynamicObject},
    runtime::{Controller, controller::Action, events::EventType, reflector::ObjectRef, watcher},
};
use tracing::{info, warn};

use super::{
    Context,
    common::{self, KubeError, ReconcileError},
    conditions::DesiredCondition,
};
use crate::{
    FIELD_MANAGER,
    lookup::{self, LookupError},
    topology::{self, ResolvedTopology, TopologyError, WorkerPod},
    validation,
};
use planner_api::{ComponentType, DynamoGraphDeployment, DynamoGraphDeploymentStatus};

pub mod render;
pub mod status;

use planner_api::labels::{LABEL_COMPONENT, LABEL_COMPONENT_TYPE, LABEL_GRAPH};
use render::RenderError;
use status::TOPOLOGY_RESOLVED;

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "dgd";

/// How often a healthy DGD is reconciled even without changes (drift repair).
const RESYNC: Duration = Duration::from_secs(300);
/// Retry delay after an API error.
const RETRY: Duration = Duration::from_secs(15);
/// Retry delay for a spec that cannot be rendered: it needs a user's change, not a retry.
const INVALID_RETRY: Duration = Duration::from_secs(600);
/// Retry delay while the topology cannot be resolved: the ClusterTopology (or Grove) may be
/// created at any time, and nothing watches for it.
const TOPOLOGY_RETRY: Duration = Duration::from_secs(30);
/// Re-check delay while a rendered name is taken by an object this DGD does not own (objects
/// without the graph label are not watched).
const CONFLICT_RETRY: Duration = Duration::from_secs(30);
/// The condition type present while a workload's name is taken by someone else's object.
pub const WORKLOADS_OWNED: &str = "WorkloadsOwned";
/// Reason of that condition, and of the Warning Event.
pub const WORKLOAD_CONFLICT: &str = "WorkloadConflict";

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec cannot be rendered; the user must change it.
    #[error("invalid spec")]
    InvalidSpec(#[from] RenderError),
    /// The KV-transfer topology cannot be resolved (reported in `TopologyResolved`).
    #[error("topology unresolved")]
    Topology(#[from] TopologyError),
    /// Looking up the ClusterTopology failed.
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// A Kubernetes API call failed.
    #[error(transparent)]
    Kube(#[from] KubeError),
}

impl ReconcileError for Error {
    fn category(&self) -> &'static str {
        match self {
            Self::InvalidSpec(_) => "invalid_spec",
            Self::Topology(_) => "topology_unresolved",
            Self::Lookup(_) | Self::Kube(_) => "kube_api",
        }
    }
}

fn kube_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let wrap = KubeError::on(action);
    move |source| Error::Kube(wrap(source))
}

/// Runs the controller until `shutdown` resolves. `pod_changes` are worker pods whose
/// scheduling or topology labels changed (see [`super::topology_labels::label_changes`]); each
/// re-reconciles its DGD so that `TopologyResolved` counts stay current. `cluster_topologies`
/// (Grove's ClusterTopologyBindings and ClusterTopologies, those served) are watched so that a
/// DGD is re-checked as soon as the one it names changes or is deleted. Only the DGDs
/// `ctx.dgd_selection` selects are rendered (see [`super::selection`]).
pub async fn run(
    ctx: Arc<Context>,
    deployments: impl futures::Stream<Item = Result<Deployment, watcher::Error>> + Send + 'static,
    pod_changes: impl futures::Stream<Item = Arc<Pod>> + Send + 'static,
    cluster_topologies: Vec<ApiResource>,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let dgds: Api<DeserializeGuard<DynamoGraphDeployment>> =
        common::scoped_api(client.clone(), namespace.as_deref());
    let services: Api<Service> = common::scoped_api(client.clone(), namespace.as_deref());
    let mut watched = watcher::Config::default().any_semantic();
    if let Some(selector) = ctx.dgd_selection.label_selector() {
        watched = watched.labels(&selector);
    }
    let mut controller = Controller::new(dgds, watched)
        .owns_stream(deployments)
        .owns(services, watcher::Config::default().labels(LABEL_GRAPH))
        .watches_shared_stream(pod_changes, |pod: Arc<Pod>| {
            let graph = pod.labels().get(LABEL_GRAPH).cloned();
            let namespace = pod.namespace();
            graph.zip(namespace).map(|(graph, namespace)| {
                ObjectRef::<DeserializeGuard<DynamoGraphDeployment>>::new(&graph).within(&namespace)
            })
        });
    for resource in cluster_topologies {
        let store = controller.store();
        let topologies: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        controller = controller.watches_with(
            topologies,
            resource,
            watcher::Config::default(),
            move |topology: DynamicObject| {
                let name = topology.name_any();
                store
                    .state()
                    .iter()
                    .filter(|guard| {
                        guard.0.as_ref().is_ok_and(|dgd| {
                            topology::cluster_topology_name(&dgd.spec) == Some(name.as_str())
                        })
                    })
                    .map(|guard| ObjectRef::from_obj(guard.as_ref()))
                    .collect::<Vec<_>>()
            },
        );
    }
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "dgd controller event");
            }
        })
        .await;
}

async fn reconcile(
    guard: Arc<DeserializeGuard<DynamoGraphDeployment>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    common::guarded_reconcile(
        CONTROLLER,
        &ctx.metrics,
        &guard,
        async |dgd| reconcile_dgd(dgd, &ctx).await,
        async |metadata, error| {
            if ctx.dgd_selection.select_meta(metadata, None).is_err() {
                // Another controller's: not ours to report on.
                return;
            }
            let reference = common::reference_of::<DynamoGraphDeployment>(metadata);
            let note = format!("cannot parse the object: {error}");
            common::publish_to(
                &ctx.recorder,
                &reference,
                EventType::Warning,
                "InvalidSpec",
                "Parse",
                &note,
            )
            .await;
        },
    )
    .await
}

async fn reconcile_dgd(dgd: &DynamoGraphDeployment, ctx: &Context) -> Result<Action, Error> {
    // Never take over a DGD another controller renders: no children, status or Events.
    if let Err(reason) = ctx.dgd_selection.select(dgd) {
        tracing::debug!(%reason, "not rendering this DynamoGraphDeployment");
        return Ok(Action::await_change());
    }
    let namespace = dgd.namespace().unwrap_or_default();
    let name = dgd.name_any();
    let dgds: Api<DynamoGraphDeployment> = Api::namespaced(ctx.client.clone(), &namespace);

    // The ClusterTopology may have been deleted or changed since admission: check it every time,
    // and keep the workloads as they are (never silently drop the constraint) while it is not
    // usable.
    let topology = match resolve_topology(dgd, ctx).await {
        Ok(topology) => topology,
        Err(Error::Topology(error)) => {
            let message = error.to_string();
            warn!(%message, "cannot resolve the KV-transfer topology; workloads left unchanged");
            let unresolved = DesiredCondition::unmet(TOPOLOGY_RESOLVED, error.reason(), message.clone());
            let status = current_status(dgd, ctx, &[unresolved]);
            if status::differs(dgd.status.as_ref(), &status) {
                write_status(&dgds, &name, &status).await?;
                publish(ctx, dgd, EventType::Warning, "InvalidSpec", &message).await;
            }
            return Err(Error::Topology(error));
        }
        Err(error) => return Err(error),
    };

    let rendered = match render::render(dgd, topology.as_ref()) {
        Ok(rendered) => rendered,
        Err(error) => {
            let message = error.to_string();
            warn!(%message, "cannot render the DynamoGraphDeployment");
            let status = status::invalid(
                dgd.metadata.generation,
                dgd.status.as_ref(),
                "InvalidSpec",
                &message,
                now(),
            );
            if status::differs(dgd.status.as_ref(), &status) {
                write_status(&dgds, &name, &status).await?;
                publish(ctx, dgd, EventType::Warning, "InvalidSpec", &message).await;
            }
            return Err(Error::InvalidSpec(error));
        }
    };

    // Server-side apply with force takes over any object of that name: apply only to objects
    // this DGD controls (or that do not exist yet).
    let uid = dgd.uid().unwrap_or_default();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut conflicts = Vec::new();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    for deployment in &rendered.deployments {
        let workload = deployment.name_any();
        let cached = ctx
            .deployments
            .get(&ObjectRef::new(&workload).within(&namespace))
            .is_some_and(|d| foreign_owner(&d.metadata, &uid).is_none());
        if !cached && let Some(owner) = existing_owner(&deployments, &workload, &uid, "Deployment").await? {
            conflicts.push(Conflict {
                kind: "Deployment",
                name: workload,
                owner,
            });
            continue;
        }
        deployments
            .patch(&workload, &params, &Patch::Apply(deployment))
            .await
            .map_err(kube_error(format!("apply Deployment {workload}")))?;
    }
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    for service in &rendered.services {
        let workload = service.name_any();
        if let Some(owner) = existing_owner(&services, &workload, &uid, "Service").await? {
            conflicts.push(Conflict {
                kind: "Service",
                name: workload,
                owner,
            });
            continue;
        }
        services
            .patch(&workload, &params, &Patch::Apply(service))
            .await
            .map_err(kube_error(format!("apply Service {workload}")))?;
    }
    remove_stale(dgd, ctx, &rendered).await?;

    let mut extra: Vec<DesiredCondition> = topology
        .as_ref()
        .map(|topology| {
            let pods = ctx.pods.state();
            let report = topology::report(topology, &worker_pods(&pods, &namespace, &name));
            if report.resolved {
                DesiredCondition::met(TOPOLOGY_RESOLVED, report.reason, report.message)
            } else {
                DesiredCondition::unmet(TOPOLOGY_RESOLVED, report.reason, report.message)
            }
        })
        .into_iter()
        .collect();
    let conflict_message = (!conflicts.is_empty()).then(|| describe_conflicts(&conflicts));
    if let Some(message) = &conflict_message {
        warn!(%message, "workload names taken by objects this DGD does not own; left unchanged");
        extra.push(DesiredCondition::unmet(
            WORKLOADS_OWNED,
            WORKLOAD_CONFLICT,
            message.clone(),
        ));
    }
    let mut status = current_status(dgd, ctx, &extra);
    if topology.is_none() {
        // The field was removed: so is the condition about it.
        status.conditions.retain(|c| c.type_ != TOPOLOGY_RESOLVED);
    }
    if conflicts.is_empty() {
        status.conditions.retain(|c| c.type_ != WORKLOADS_OWNED);
    }
    if status::differs(dgd.status.as_ref(), &status) {
        write_status(&dgds, &name, &status).await?;
        info!(ready = ?status::is_ready(&status), "status updated");
        if let Some(message) = &conflict_message {
            publish(ctx, dgd, EventType::Warning, WORKLOAD_CONFLICT, message).await;
        }
    }
    if conflicts.is_empty() {
        Ok(Action::requeue(RESYNC))
    } else {
        Ok(Action::requeue(CONFLICT_RETRY))
    }
}

/// A rendered workload whose name an object this DGD does not control already has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// `Deployment` or `Service`.
    pub kind: &'static str,
    /// The name.
    pub name: String,
    /// Whose it is, as [`foreign_owner`] says.
    pub owner: String,
}

/// Why `metadata` is not controlled by the DGD whose uid is `uid`; `None` when it is.
pub fn foreign_owner(metadata: &ObjectMeta, uid: &str) -> Option<String> {
    let owners = metadata.owner_references.as_deref().unwrap_or_default();
    if !uid.is_empty() && owners.iter().any(|o| o.uid == uid) {
        return None;
    }
    Some(
        match owners
            .iter()
            .find(|o| o.controller == Some(true))
            .or(owners.first())
        {
            None => "owned by no object".into(),
            Some(o) if o.kind == "DynamoGraphDeployment" => format!(
                "owned by another DynamoGraphDeployment {} (uid {}; an earlier one of this name is being deleted)",
                o.name, o.uid
            ),
            Some(o) => format!("owned by {} {}", o.kind, o.name),
        },
    )
}

/// The condition message (and Event note) for `conflicts`.
pub fn describe_conflicts(conflicts: &[Conflict]) -> String {
    let objects: Vec<String> = conflicts
        .iter()
        .map(|c| format!("{} {} exists and is {}", c.kind, c.name, c.owner))
        .collect();
    format!(
        "left unchanged, as this DynamoGraphDeployment does not own them: {}; delete or rename them, or rename the components",
        objects.join("; ")
    )
}

/// Whose the existing object `name` is, when it exists and this DGD does not control it. A
/// list by name (the operator may list these kinds, not get them).
async fn existing_owner<K>(api: &Api<K>, name: &str, uid: &str, kind: &str) -> Result<Option<String>, Error>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let existing = api
        .list_metadata(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .map_err(kube_error(format!("list {kind} {name}")))?;
    Ok(existing
        .items
        .iter()
        .find(|object| object.metadata.name.as_deref() == Some(name))
        .and_then(|object| foreign_owner(&object.metadata, uid)))
}

/// Checks the KV-transfer topology, looking the ClusterTopologyBinding up when it needs one.
/// `Ok(None)`: the DGD does not use the feature.
pub(crate) async fn resolve_topology(
    dgd: &DynamoGraphDeployment,
    ctx: &Context,
) -> Result<Option<ResolvedTopology>, Error> {
    // The same checks as the admission webhook's (crate::validation).
    let Some(request) = validation::dgd::precheck(&dgd.spec)? else {
        return Ok(None);
    };
    let lookup = match &request.cluster_topology {
        Some(name) => Some(lookup::cluster_topology(&ctx.client, &ctx.cluster_topology_api, name).await?),
        None => None,
    };
    let mut resolved = request.resolve(lookup.as_ref())?;
    resolved.contract =
        topology::EnvContract::for_annotations(dgd.metadata.annotations.as_ref(), ctx.topology_env);
    Ok(Some(resolved))
}

/// The status from the cached Deployments, with `extra` conditions.
fn current_status(
    dgd: &DynamoGraphDeployment,
    ctx: &Context,
    extra: &[DesiredCondition],
) -> DynamoGraphDeploymentStatus {
    let namespace = dgd.namespace().unwrap_or_default();
    let name = dgd.name_any();
    let components: Vec<(String, i32)> = dgd
        .spec
        .components
        .iter()
        .map(|c| (c.name.clone(), c.replicas.unwrap_or(1)))
        .collect();
    let uid = dgd.uid().unwrap_or_default();
    let cached = ctx.deployments.state();
    let owned: Vec<&Deployment> = cached
        .iter()
        .filter(|d| {
            d.namespace().as_deref() == Some(namespace.as_str())
                && d.labels().get(LABEL_GRAPH) == Some(&name)
                && foreign_owner(&d.metadata, &uid).is_none()
        })
        .map(AsRef::as_ref)
        .collect();
    status::compute(
        &name,
        dgd.metadata.generation,
        &components,
        &owned,
        dgd.status.as_ref(),
        extra,
        now(),
    )
}

/// The worker-class pods of a DGD that are not terminating.
fn worker_pods<'a>(pods: &'a [Arc<Pod>], namespace: &str, dgd: &str) -> Vec<WorkerPod<'a>> {
    static EMPTY: std::sync::OnceLock<std::collections::BTreeMap<String, String>> =
        std::sync::OnceLock::new();
    pods.iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.deletion_timestamp.is_none()
                && p.labels().get(LABEL_GRAPH).map(String::as_str) == Some(dgd)
        })
        .filter_map(|p| {
            let kind = match p.labels().get(LABEL_COMPONENT_TYPE).map(String::as_str) {
                Some("prefill") => ComponentType::Prefill,
                Some("decode") => ComponentType::Decode,
                Some("worker") => ComponentType::Worker,
                _ => return None,
            };
            Some(WorkerPod {
                kind,
                scheduled: p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .is_some_and(|n| !n.is_empty()),
                labels: p
                    .metadata
                    .labels
                    .as_ref()
                    .unwrap_or_else(|| EMPTY.get_or_init(Default::default)),
            })
        })
        .collect()
}

/// Deletes Deployments and Services this DGD owns for components it no longer has.
async fn remove_stale(
    dgd: &DynamoGraphDeployment,
    ctx: &Context,
    rendered: &render::RenderedGraph,
) -> Result<(), Error> {
    let namespace = dgd.namespace().unwrap_or_default();
    let uid = dgd.uid().unwrap_or_default();
    let selector = format!("{LABEL_GRAPH}={}", dgd.name_any());
    let keep: Vec<String> = rendered.deployments.iter().map(ResourceExt::name_any).collect();
    let keep_services: Vec<String> = rendered.services.iter().map(ResourceExt::name_any).collect();
    let owned_by_us = |meta: &ObjectMeta| meta.owner_references.iter().flatten().any(|o| o.uid == uid);

    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let list = deployments
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map_err(kube_error("list Deployments"))?;
    for stale in list
        .items
        .iter()
        .filter(|d| owned_by_us(&d.metadata) && !keep.contains(&d.name_any()))
    {
        let component = stale.labels().get(LABEL_COMPONENT).cloned().unwrap_or_default();
        info!(deployment = %stale.name_any(), %component, "removing the workload of a component no longer in the spec");
        deployments
            .delete(&stale.name_any(), &DeleteParams::background())
            .await
            .map_err(kube_error(format!("delete Deployment {}", stale.name_any())))?;
    }
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    let list = services
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map_err(kube_error("list Services"))?;
    for stale in list
        .items
        .iter()
        .filter(|s| owned_by_us(&s.metadata) && !keep_services.contains(&s.name_any()))
    {
        services
            .delete(&stale.name_any(), &DeleteParams::background())
            .await
            .map_err(kube_error(format!("delete Service {}", stale.name_any())))?;
    }
    Ok(())
}

async fn write_status(
    api: &Api<DynamoGraphDeployment>,
    name: &str,
    status: &DynamoGraphDeploymentStatus,
) -> Result<(), Error> {
    Ok(common::apply_status(api, name, status).await?)
}

async fn publish(ctx: &Context, dgd: &DynamoGraphDeployment, type_: EventType, reason: &str, note: &str) {
    common::publish(&ctx.recorder, dgd, type_, reason, "Reconcile", note).await;
}

fn error_policy(
    guard: Arc<DeserializeGuard<DynamoGraphDeployment>>,
    error: &Error,
    _ctx: Arc<Context>,
) -> Action {
    let name = guard.0.as_ref().map(ResourceExt::name_any).unwrap_or_default();
    match error {
        // Retrying cannot fix a spec; a spec change triggers a reconcile anyway.
        Error::InvalidSpec(_) => Action::requeue(INVALID_RETRY),
        Error::Topology(_) => Action::requeue(TOPOLOGY_RETRY),
        Error::Lookup(_) | Error::Kube(_) => {
            warn!(%name, error = %common::chain(error), "reconcile failed; retrying");
            Action::requeue(RETRY)
        }
    }
}

fn now() -> Timestamp {
    Timestamp::now()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn owned_by(owners: &[(&str, &str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some("llama-decode".into()),
            owner_references: Some(
                owners
                    .iter()
                    .map(|(kind, name, uid)| OwnerReference {
                        api_version: "v1".into(),
                        kind: (*kind).into(),
                        name: (*name).into(),
                        uid: (*uid).into(),
                        controller: Some(true),
                        block_owner_deletion: None,
                    })
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn only_objects_with_this_dgds_owner_reference_are_its_own() {
        assert_eq!(
            foreign_owner(&owned_by(&[("DynamoGraphDeployment", "llama", "u1")]), "u1"),
            None
        );
        assert_eq!(
            foreign_owner(&ObjectMeta::default(), "u1").as_deref(),
            Some("owned by no object")
        );
        assert_eq!(
            foreign_owner(&owned_by(&[("ReplicaSet", "other", "u9")]), "u1").as_deref(),
            Some("owned by ReplicaSet other")
        );
        let earlier = foreign_owner(&owned_by(&[("DynamoGraphDeployment", "llama", "u0")]), "u1").unwrap();
        assert!(
            earlier.contains("another DynamoGraphDeployment llama (uid u0"),
            "{earlier}"
        );
        // A DGD without a uid (never stored) owns nothing.
        assert!(foreign_owner(&owned_by(&[("DynamoGraphDeployment", "llama", "")]), "").is_some());
    }

    #[test]
    fn conflicts_are_named_with_what_to_do() {
        let message = describe_conflicts(&[
            Conflict {
                kind: "Deployment",
                name: "llama-decode".into(),
                owner: "owned by no object".into(),
            },
            Conflict {
                kind: "Service",
                name: "llama-frontend".into(),
                owner: "owned by Deployment web".into(),
            },
        ]);
        assert_eq!(
            message,
            "left unchanged, as this DynamoGraphDeployment does not own them: Deployment llama-decode exists and is owned by no object; Service llama-frontend exists and is owned by Deployment web; delete or rename them, or rename the components"
        );
    }
}

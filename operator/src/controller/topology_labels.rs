//! The topology label controller: once a worker pod of a DGD with a KV-transfer topology is
//! scheduled, copy its node's topology labels onto the pod (Grove never labels pods with
//! topology), so that the Downward API files of the worker (under the env contract's mount path)
//! get their values.
//!
//! Which labels to copy: the DGD reconciler renders the annotation [`topology::LABELS_ANNOTATION`]
//! (`<pod label>=<node label>,...`) into worker pod templates, and this controller copies the
//! pairs of the annotation that the pod's DGD resolves to (the levels of its
//! ClusterTopologyBinding, or its node label key), checked against the DGD each time: anyone who can create a pod with the
//! graph label and the annotation could otherwise have any node label copied onto it (node
//! names, instance types, anything an admin put on nodes). Pairs it does not resolve are ignored
//! with a log line. A label the pod already has (set earlier by this controller, or by whoever
//! created the pod) is left alone. A node without a label gets a Warning Event `TopologyLabelMissing` on the pod and
//! the DGD, and the pod gets no label.
//!
//! Runs on the leader only, like the DGD reconciler, which reads the same pod cache to report the
//! per-domain counts in the DGD's `TopologyResolved` condition.

use std::{
    collections::{BTreeMap, HashMap},
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
    time::Duration,
};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{Controller, controller::Action, events::EventType, reflector::Store},
};
use serde_json::json;
use tracing::{Instrument, debug, info, info_span, warn};

use super::{
    Context,
    common::{self, KubeError, ReconcileError},
};
use crate::topology;
use crate::{FIELD_MANAGER, lookup};
use planner_api::DynamoGraphDeployment;
use planner_api::labels::LABEL_GRAPH;

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "topology-labels";
/// Reason of the Warning Event for a node without a topology label.
pub const LABEL_MISSING_REASON: &str = "TopologyLabelMissing";

/// Retry delay after an API error.
const RETRY: Duration = Duration::from_secs(15);
/// Re-check delay for a pod whose node lacks a label (someone may label the node).
const LABEL_MISSING_RETRY: Duration = Duration::from_secs(120);
/// Entries kept by [`label_changes`] before it forgets them all (deleted pods are never
/// reported to it; forgetting only causes one extra trigger per pod).
const MAX_TRACKED_PODS: usize = 8192;

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// Reading the pod's DynamoGraphDeployment failed.
    #[error("cannot {0}")]
    Lookup(String),
}

impl ReconcileError for Error {
    fn category(&self) -> &'static str {
        match self {
            Self::Kube(_) | Self::Lookup(_) => "kube_api",
        }
    }
}

/// The pod labels to copy and the node labels they come from, read from the pod's annotation;
/// empty for pods of DGDs without `kvCacheTransferTopology`.
pub fn wanted_labels(pod: &Pod) -> Vec<(String, String)> {
    pod.annotations()
        .get(topology::LABELS_ANNOTATION)
        .map(|value| topology::parse_labels_annotation(value))
        .unwrap_or_default()
}

/// `(pod label, node label)` pairs.
pub type LabelPairs = Vec<(String, String)>;

/// The pairs of `wanted` that `resolved` (the pod's DGD's topology) produces, and the others.
pub fn permitted_labels(
    wanted: LabelPairs,
    resolved: &topology::ResolvedTopology,
) -> (LabelPairs, LabelPairs) {
    wanted
        .into_iter()
        .partition(|(pod_label, node_label)| resolved.resolves(pod_label, node_label))
}

/// The `(pod label, node label)` pairs a scheduled pod still lacks.
pub fn missing_labels(pod: &Pod) -> Vec<(String, String)> {
    wanted_labels(pod)
        .into_iter()
        .filter(|(pod_label, _)| pod.labels().get(pod_label).is_none_or(String::is_empty))
        .collect()
}

/// What to patch onto a pod from its node's labels, and which labels the node lacks.
pub fn labels_from_node(
    missing: &[(String, String)],
    node_labels: &BTreeMap<String, String>,
) -> (BTreeMap<String, String>, Vec<(String, String)>) {
    let mut patch = BTreeMap::new();
    let mut absent = Vec::new();
    for (pod_label, node_label) in missing {
        match node_labels.get(node_label) {
            Some(value) if !value.is_empty() => {
                patch.insert(pod_label.clone(), value.clone());
            }
            _ => absent.push((pod_label.clone(), node_label.clone())),
        }
    }
    (patch, absent)
}

/// Passes on pods with the topology annotation whose node, topology labels or deletion changed
/// since they last passed: the DGD reconciler recounts its worker pods on each.
pub fn label_changes(pods: impl Stream<Item = Arc<Pod>>) -> impl Stream<Item = Arc<Pod>> {
    let mut seen: HashMap<String, u64> = HashMap::new();
    pods.filter_map(move |pod| {
        let wanted = wanted_labels(&pod);
        let changed = if wanted.is_empty() {
            false
        } else {
            let mut hasher = DefaultHasher::new();
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .hash(&mut hasher);
            pod.metadata.deletion_timestamp.is_some().hash(&mut hasher);
            for (pod_label, _) in &wanted {
                pod.labels().get(pod_label).hash(&mut hasher);
            }
            let fingerprint = hasher.finish();
            if seen.len() >= MAX_TRACKED_PODS {
                seen.clear();
            }
            let key = pod.uid().unwrap_or_else(|| pod.name_any());
            seen.insert(key, fingerprint) != Some(fingerprint)
        };
        futures::future::ready(changed.then_some(pod))
    })
}

/// Runs the controller until `shutdown` resolves, over the shared pod cache.
pub async fn run(
    ctx: Arc<Context>,
    pods: impl Stream<Item = Arc<Pod>> + Send + 'static,
    store: Store<Pod>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    Controller::for_shared_stream(pods, store)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                debug!(%error, "topology label controller event");
            }
        })
        .await;
}

async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, Error> {
    let missing = missing_labels(&pod);
    let node_name = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    let Some(node_name) =
        node_name.filter(|_| !missing.is_empty() && pod.metadata.deletion_timestamp.is_none())
    else {
        // Nothing to copy yet (not scheduled) or any more (labelled, or no topology).
        return Ok(Action::await_change());
    };
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let span = info_span!("reconcile", controller = CONTROLLER, namespace = %namespace, name = %name, node = %node_name);
    async move {
        let _timer = ctx.metrics.reconcile_started(CONTROLLER);
        let result = label_pod(&pod, &node_name, &missing, &ctx).await;
        ctx.metrics
            .reconcile_finished(CONTROLLER, result.as_ref().err().map(ReconcileError::category));
        result
    }
    .instrument(span)
    .await
}

/// Which of `missing` the pod's DGD resolves; `None` when the DGD cannot tell (absent, or its
/// topology unresolvable), and then nothing is copied.
async fn resolved_pairs(
    pod: &Pod,
    missing: &[(String, String)],
    ctx: &Context,
) -> Result<Option<Vec<(String, String)>>, Error> {
    let namespace = pod.namespace().unwrap_or_default();
    let Some(graph) = pod.labels().get(LABEL_GRAPH) else {
        return Ok(None);
    };
    let dgd = match lookup::dynamo_graph_deployment(&ctx.client, &namespace, graph).await {
        Ok(Some(dgd)) => dgd,
        Ok(None) => {
            warn!(%graph, "the pod's DynamoGraphDeployment does not exist; no topology labels copied");
            return Ok(None);
        }
        Err(error) => {
            return Err(Error::Lookup(format!(
                "get DynamoGraphDeployment {graph}: {error}"
            )));
        }
    };
    let resolved = match super::dgd::resolve_topology(&dgd, ctx).await {
        Ok(Some(resolved)) => resolved,
        Ok(None) => {
            warn!(%graph, "the pod's DynamoGraphDeployment sets no kvCacheTransferTopology; no topology labels copied");
            return Ok(None);
        }
        Err(error) => {
            warn!(%graph, error = %common::chain(&error), "the pod's topology cannot be resolved; no topology labels copied");
            return Ok(None);
        }
    };
    let (permitted, ignored) = permitted_labels(missing.to_vec(), &resolved);
    if !ignored.is_empty() {
        warn!(
            ?ignored,
            topology = %resolved.describe(),
            "the pod's topology annotation names labels its DynamoGraphDeployment does not resolve; ignored"
        );
    }
    Ok(Some(permitted))
}

async fn label_pod(
    pod: &Pod,
    node_name: &str,
    missing: &[(String, String)],
    ctx: &Context,
) -> Result<Action, Error> {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let Some(missing) = resolved_pairs(pod, missing, ctx).await? else {
        return Ok(Action::requeue(LABEL_MISSING_RETRY));
    };
    if missing.is_empty() {
        return Ok(Action::await_change());
    }
    let missing = missing.as_slice();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let Some(node) = nodes
        .get_opt(node_name)
        .await
        .map_err(KubeError::on(format!("get Node {node_name}")))?
    else {
        warn!("the pod's node does not exist; retrying later");
        return Ok(Action::requeue(LABEL_MISSING_RETRY));
    };
    let (labels, absent) = labels_from_node(missing, node.labels());
    if !labels.is_empty() {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        pods.patch(
            &name,
            &params,
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .map_err(KubeError::on(format!("label Pod {name}")))?;
        info!(?labels, "copied topology labels from the node");
    }
    if absent.is_empty() {
        return Ok(Action::await_change());
    }
    let keys: Vec<&str> = absent.iter().map(|(_, node_label)| node_label.as_str()).collect();
    let pod_keys: Vec<&str> = absent.iter().map(|(pod_label, _)| pod_label.as_str()).collect();
    let fix = format!(
        "label the node (kubectl label node {node_name} {}=<value>) or remove the level from the ClusterTopology",
        keys.first().copied().unwrap_or_default()
    );
    warn!(missing = ?keys, "the node lacks topology labels");
    let pod_note = format!(
        "node {node_name} has no label {}, so this pod gets no {} and its worker cannot read that topology level; {fix}",
        keys.join(", "),
        pod_keys.join(", "),
    );
    publish(ctx, &pod.object_ref(&()), &pod_note).await;
    if let Some(graph) = pod.labels().get(LABEL_GRAPH) {
        // Without the pod's name, so that the events of pods on the same node aggregate.
        let dgd_note = format!(
            "node {node_name} has no label {}, so worker pods scheduled there get no {}; {fix}",
            keys.join(", "),
            pod_keys.join(", "),
        );
        let reference = dgd_reference(ctx, &namespace, graph).await;
        publish(ctx, &reference, &dgd_note).await;
    }
    Ok(Action::requeue(LABEL_MISSING_RETRY))
}

/// The DGD's object reference, with its uid when it can be read.
async fn dgd_reference(ctx: &Context, namespace: &str, name: &str) -> ObjectReference {
    match lookup::dynamo_graph_deployment(&ctx.client, namespace, name).await {
        Ok(Some(dgd)) => dgd.object_ref(&()),
        _ => ObjectReference {
            api_version: Some(DynamoGraphDeployment::api_version(&()).into()),
            kind: Some(DynamoGraphDeployment::kind(&()).into()),
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..ObjectReference::default()
        },
    }
}

async fn publish(ctx: &Context, reference: &ObjectReference, note: &str) {
    common::publish_to(
        &ctx.recorder,
        reference,
        EventType::Warning,
        LABEL_MISSING_REASON,
        "LabelPod",
        note,
    )
    .await;
}

fn error_policy(pod: Arc<Pod>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(pod = %pod.name_any(), error = %common::chain(error), "labelling failed; retrying");
    Action::requeue(RETRY)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{api::core::v1::PodSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta};

    use super::*;

    fn pod(node: Option<&str>, labels: &[(&str, &str)], annotation: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                uid: Some("u1".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                annotations: annotation
                    .map(|a| BTreeMap::from([(topology::LABELS_ANNOTATION.to_string(), a.to_string())])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(Into::into),
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    const ANNOTATION: &str = "nvidia.com/dynamo-topology.zone=topology.kubernetes.io/zone,nvidia.com/dynamo-topology.rack=nvidia.com/rack";

    #[test]
    fn labels_grove_already_set_are_kept() {
        let pod = pod(
            Some("n1"),
            &[("nvidia.com/dynamo-topology.zone", "zone-a")],
            Some(ANNOTATION),
        );
        assert_eq!(
            missing_labels(&pod),
            [(
                "nvidia.com/dynamo-topology.rack".to_string(),
                "nvidia.com/rack".to_string()
            )]
        );
        let without = self::pod(Some("n1"), &[], None);
        assert!(missing_labels(&without).is_empty());
    }

    #[test]
    fn node_labels_are_copied_and_absent_ones_reported() {
        let missing = vec![
            (
                "nvidia.com/dynamo-topology.zone".to_string(),
                "topology.kubernetes.io/zone".to_string(),
            ),
            ("nvidia.com/dynamo-topology.rack".into(), "nvidia.com/rack".into()),
        ];
        let node = BTreeMap::from([
            ("topology.kubernetes.io/zone".to_string(), "zone-b".to_string()),
            ("nvidia.com/rack".into(), String::new()),
        ]);
        let (patch, absent) = labels_from_node(&missing, &node);
        assert_eq!(
            patch,
            BTreeMap::from([(
                "nvidia.com/dynamo-topology.zone".to_string(),
                "zone-b".to_string()
            )])
        );
        assert_eq!(
            absent,
            [(
                "nvidia.com/dynamo-topology.rack".to_string(),
                "nvidia.com/rack".to_string()
            )]
        );
    }

    #[test]
    fn only_the_pairs_the_dgd_resolves_are_copied() {
        // A DGD whose frontend names the node label to use: it resolves one pair.
        let spec: planner_api::DynamoGraphDeploymentSpec = serde_json::from_value(json!({
            "components": [
                {"name": "frontend", "type": "frontend",
                 "kvCacheTransferTopology": {"level": "zone", "label": "topology.kubernetes.io/zone"}},
                {"name": "decode", "type": "decode"},
            ]
        }))
        .unwrap();
        let resolved = topology::configured(&spec)
            .unwrap()
            .unwrap()
            .resolve(None)
            .unwrap();
        // A pod annotated by hand: the resolved pair, the resolved pod label from another node
        // label, and an arbitrary node label.
        let pod = pod(
            Some("n1"),
            &[],
            Some(
                "topology.kubernetes.io/zone=topology.kubernetes.io/zone,topology.kubernetes.io/zone=kubernetes.io/hostname,leak=node.kubernetes.io/instance-type",
            ),
        );
        let (permitted, ignored) = permitted_labels(missing_labels(&pod), &resolved);
        assert_eq!(
            permitted,
            [(
                "topology.kubernetes.io/zone".to_string(),
                "topology.kubernetes.io/zone".to_string()
            )]
        );
        assert_eq!(
            ignored,
            [
                (
                    "topology.kubernetes.io/zone".to_string(),
                    "kubernetes.io/hostname".to_string()
                ),
                ("leak".into(), "node.kubernetes.io/instance-type".into()),
            ]
        );
    }

    #[tokio::test]
    async fn only_topology_relevant_changes_pass() {
        let unscheduled = Arc::new(pod(None, &[], Some(ANNOTATION)));
        let status_only = Arc::clone(&unscheduled);
        let scheduled = Arc::new(pod(Some("n1"), &[], Some(ANNOTATION)));
        let labelled = Arc::new(pod(
            Some("n1"),
            &[
                ("nvidia.com/dynamo-topology.zone", "zone-a"),
                ("nvidia.com/dynamo-topology.rack", "a1"),
                ("unrelated", "x"),
            ],
            Some(ANNOTATION),
        ));
        let other_label = Arc::new(pod(
            Some("n1"),
            &[
                ("nvidia.com/dynamo-topology.zone", "zone-a"),
                ("nvidia.com/dynamo-topology.rack", "a1"),
                ("unrelated", "y"),
            ],
            Some(ANNOTATION),
        ));
        let no_topology = Arc::new(pod(Some("n1"), &[], None));
        let input = futures::stream::iter([
            unscheduled,
            status_only,
            scheduled,
            labelled,
            other_label,
            no_topology,
        ]);
        let passed: Vec<Arc<Pod>> = label_changes(input).collect().await;
        assert_eq!(passed.len(), 3, "new, scheduled, labelled");
    }
}

//! The `kubernetes` connector: sets the replicas of the target DGD's prefill and decode
//! components, whichever version NVIDIA's operator (or this one) serves it at.
//!
//! Per component, the way upstream Dynamo's planner scales:
//! 1. Through the component's `DynamoGraphDeploymentScalingAdapter` (DGDSA, named
//!    `<dgd>-<component in lower case>`) when it exists: a JSON Patch of its Scale subresource
//!    (`.spec.replicas`), so the adapter, which owns the component's replicas, carries the change
//!    to the DGD. The adapter is read at the version the DGD was read at, else the other one:
//!    Dynamo up to 1.1 serves it at `v1alpha1` only, later releases at both (the Scale
//!    subresource is the same at either).
//! 2. A component that declares `scalingAdapter` but whose adapter does not exist (yet) is not
//!    scaled: its replicas belong to the adapter NVIDIA's operator is about to create, and a DGD
//!    patch would be undone by it.
//! 3. Otherwise a JSON Patch of the DGD, at the version it was read at: v1beta1
//!    `spec.components[i].replicas`, guarded by a `test` of the component's name at index `i` (a
//!    reordered list makes the patch fail instead of scaling the wrong component), or v1alpha1
//!    `spec.services.<name>.replicas`.
//!
//! An API error other than "not found" (NVIDIA's conversion webhook down answers 500) is an error,
//! never read as "no adapter": a pool whose adapter cannot be read is not scaled.
//!
//! Every write is also guarded by a `test` of the replicas value that was read, so that a
//! concurrent change (`kubectl scale`, another autoscaler) makes it fail, reported as a conflict
//! and retried at the next interval, instead of being silently overwritten. (A JSON Patch rather
//! than a merge patch for v1alpha1 too: a merge patch cannot carry that test.) JSON Patches also
//! work whatever else the installed CRD requires, which a partial server-side apply of
//! `spec.components` would have to satisfy. The planner's writes are recorded under their own
//! field manager.

use std::collections::BTreeMap;

use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    core::DynamicObject,
};
use serde_json::{Value, json};

use crate::target::{ADAPTER_KIND, Shape, TargetGraph, VERSIONS, adapter_name, adapter_resource};

/// Field manager of the planner's replica writes.
pub const PLANNER_FIELD_MANAGER: &str = "planner-operator-planner";

/// Why replicas could not be set.
#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    /// The DGD no longer has a component the policy scales.
    #[error("the DynamoGraphDeployment has no component named {0:?}")]
    NoSuchComponent(String),
    /// The component's replicas belong to a scaling adapter that does not exist.
    #[error(
        "component {component:?} declares scalingAdapter, so its replicas belong to {ADAPTER_KIND} {adapter:?}, which does not exist (yet; NVIDIA's Dynamo operator creates it); the DynamoGraphDeployment is not patched"
    )]
    AdapterMissing {
        /// The component.
        component: String,
        /// The adapter's name.
        adapter: String,
    },
    /// The replicas changed between the read and the write.
    #[error(
        "{object}: the replicas changed since they were read (another writer, e.g. kubectl scale or another autoscaler); not overwritten, retried at the next interval"
    )]
    Conflict {
        /// What was being patched.
        object: String,
    },
    /// An API call failed.
    #[error("cannot {action}")]
    Api {
        /// What was attempted.
        action: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// A component's scaling adapter, as its Scale subresource shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterScale {
    /// The adapter's name.
    pub name: String,
    /// `spec.replicas`: the replicas asked for.
    pub spec_replicas: u32,
    /// `status.replicas`: the replicas the adapter last carried to the DGD.
    pub status_replicas: Option<u32>,
    /// The version it was read at (`v1beta1` or `v1alpha1`), where it is written.
    pub version: &'static str,
}

impl AdapterScale {
    /// Whether the adapter has carried its `spec.replicas` to the DGD.
    pub fn synced(&self) -> bool {
        self.status_replicas == Some(self.spec_replicas)
    }
}

/// The scaling adapters of some components, by component name (components without one are
/// absent).
pub type Adapters = BTreeMap<String, AdapterScale>;

fn to_u32(n: Option<i32>) -> u32 {
    n.map_or(0, |n| u32::try_from(n).unwrap_or(0))
}

/// The versions to read the adapters at: the graph's first, then the other one.
fn adapter_versions(graph: &TargetGraph) -> Vec<&'static str> {
    let mut versions: Vec<&'static str> = VERSIONS.to_vec();
    versions.sort_by_key(|v| *v != graph.version);
    versions
}

/// Reads the scaling adapter of each of `components` (their Scale subresources), at the graph's
/// version or else the other one NVIDIA's operator serves. An adapter that does not exist (or
/// whose CRD is not installed at either version) leaves the component out; any other error is
/// returned.
pub async fn adapters(
    client: &Client,
    graph: &TargetGraph,
    components: &[&str],
) -> Result<Adapters, ScaleError> {
    let versions = adapter_versions(graph);
    // Versions found not served are skipped for the later components.
    let mut first = 0;
    let mut found = Adapters::new();
    for component in components {
        let name = adapter_name(&graph.name, component);
        for (index, version) in versions.iter().enumerate().skip(first) {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &graph.namespace, &adapter_resource(version));
            match api.get_scale(&name).await {
                Ok(scale) => {
                    found.insert(
                        (*component).to_string(),
                        AdapterScale {
                            name: name.clone(),
                            spec_replicas: to_u32(scale.spec.and_then(|s| s.replicas)),
                            status_replicas: scale.status.map(|s| to_u32(Some(s.replicas))),
                            version,
                        },
                    );
                    break;
                }
                // The adapter is not there (a Status with reason NotFound)...
                Err(kube::Error::Api(status)) if status.reason == "NotFound" => break,
                // ...or this version is not served (a plain-text 404): try the next one.
                Err(kube::Error::Api(status)) if status.code == 404 => first = index + 1,
                Err(source) => {
                    return Err(ScaleError::Api {
                        action: format!(
                            "get the scale of {ADAPTER_KIND} {}/{name} (nvidia.com/{version})",
                            graph.namespace
                        ),
                        source,
                    });
                }
            }
        }
    }
    Ok(found)
}

/// Escapes a map key for a JSON Pointer (RFC 6901).
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The JSON Patch of the DGD setting each named component's replicas (components already at
/// their target are left out); `None` when nothing changes.
pub fn graph_patch(graph: &TargetGraph, targets: &[(&str, u32)]) -> Result<Option<Value>, ScaleError> {
    let mut operations = Vec::new();
    for (name, replicas) in targets {
        let component = graph
            .component(name)
            .ok_or_else(|| ScaleError::NoSuchComponent((*name).to_string()))?;
        let current = component.replicas;
        if current == Some(i32::try_from(*replicas).unwrap_or(i32::MAX)) {
            continue;
        }
        let base = match graph.shape {
            Shape::Components => {
                let base = format!("/spec/components/{}", component.index);
                operations.push(json!({"op": "test", "path": format!("{base}/name"), "value": name}));
                base
            }
            Shape::Services => format!("/spec/services/{}", pointer_token(name)),
        };
        let path = format!("{base}/replicas");
        let op = match current {
            Some(current) => {
                operations.push(json!({"op": "test", "path": path, "value": current}));
                "replace"
            }
            None => "add",
        };
        operations.push(json!({"op": op, "path": path, "value": replicas}));
    }
    Ok((!operations.is_empty()).then_some(Value::Array(operations)))
}

/// The JSON Patch of an adapter's Scale subresource: test the replicas read, set the new ones.
pub fn adapter_patch(adapter: &AdapterScale, replicas: u32) -> Value {
    json!([
        {"op": "test", "path": "/spec/replicas", "value": adapter.spec_replicas},
        {"op": "replace", "path": "/spec/replicas", "value": replicas},
    ])
}

/// The message of the API server's 422 for a JSON Patch it could not apply (a `test` that
/// failed, or a path that is gone); it says nothing more (no causes), unlike a schema violation.
const PATCH_NOT_APPLICABLE: &str = "the server rejected our request due to an error in our request";

/// Whether an API error says the object changed since it was read: a JSON Patch that could not
/// be applied (422 without causes; the patch was built from what was read, so a failed `test` or a
/// vanished path means a concurrent change), or a write conflict (409).
fn is_conflict(error: &kube::Error) -> bool {
    let kube::Error::Api(status) = error else {
        return false;
    };
    let no_causes = status.details.as_ref().is_none_or(|d| d.causes.is_empty());
    status.code == 409 || (status.code == 422 && status.message == PATCH_NOT_APPLICABLE && no_causes)
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(PLANNER_FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

fn json_patch(operations: Value) -> Result<json_patch::Patch, ScaleError> {
    serde_json::from_value(operations).map_err(|e| ScaleError::Api {
        action: "build the JSON patch".into(),
        source: kube::Error::SerdeError(e),
    })
}

fn api_error(object: String) -> impl FnOnce(kube::Error) -> ScaleError {
    move |source| {
        if is_conflict(&source) {
            ScaleError::Conflict { object }
        } else {
            ScaleError::Api {
                action: format!("patch {object}"),
                source,
            }
        }
    }
}

/// Sets `targets` (component, replicas): through `adapters` where a component has one, else
/// with a JSON Patch of the DGD (see the module documentation). Returns whether anything
/// changed.
pub async fn set_replicas(
    client: &Client,
    graph: &TargetGraph,
    adapters: &Adapters,
    targets: &[(&str, u32)],
) -> Result<bool, ScaleError> {
    let mut direct = Vec::new();
    let mut changed = false;
    for (component, replicas) in targets {
        if let Some(adapter) = adapters.get(*component) {
            if adapter.spec_replicas == *replicas {
                continue;
            }
            let api: Api<DynamicObject> = Api::namespaced_with(
                client.clone(),
                &graph.namespace,
                &adapter_resource(adapter.version),
            );
            let object = format!(
                "the scale of {ADAPTER_KIND} {} (nvidia.com/{})",
                adapter.name, adapter.version
            );
            api.patch_scale(
                &adapter.name,
                &patch_params(),
                &Patch::Json::<()>(json_patch(adapter_patch(adapter, *replicas))?),
            )
            .await
            .map_err(api_error(object))?;
            changed = true;
        } else if graph.component(component).is_some_and(|c| c.scaling_adapter) {
            return Err(ScaleError::AdapterMissing {
                component: (*component).to_string(),
                adapter: adapter_name(&graph.name, component),
            });
        } else {
            direct.push((*component, *replicas));
        }
    }
    let Some(operations) = graph_patch(graph, &direct)? else {
        return Ok(changed);
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &graph.namespace, &graph.resource());
    let object = format!(
        "DynamoGraphDeployment {} (nvidia.com/{})",
        graph.name, graph.version
    );
    api.patch(
        &graph.name,
        &patch_params(),
        &Patch::Json::<()>(json_patch(operations)?),
    )
    .await
    .map_err(api_error(object))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner_api::DynamoGraphDeployment;

    fn dgd() -> TargetGraph {
        let dgd: DynamoGraphDeployment =
            serde_yaml::from_str(include_str!("../../../config/samples/dgd-disagg.yaml")).unwrap();
        TargetGraph::try_from(&dgd).unwrap()
    }

    #[test]
    fn patch_tests_the_name_and_the_replicas_then_replaces_them() {
        let patch = graph_patch(&dgd(), &[("prefill", 3), ("decode", 1)])
            .unwrap()
            .unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/spec/components/1/name", "value": "prefill"},
                {"op": "test", "path": "/spec/components/1/replicas", "value": 1},
                {"op": "replace", "path": "/spec/components/1/replicas", "value": 3}
            ])
        );
    }

    #[test]
    fn no_change_no_patch_and_missing_replicas_are_added() {
        assert_eq!(
            graph_patch(&dgd(), &[("prefill", 1), ("decode", 1)]).unwrap(),
            None
        );
        let mut graph = dgd();
        graph.components[2].replicas = None;
        let patch = graph_patch(&graph, &[("decode", 2)]).unwrap().unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/spec/components/2/name", "value": "decode"},
                {"op": "add", "path": "/spec/components/2/replicas", "value": 2}
            ])
        );
        assert!(matches!(
            graph_patch(&graph, &[("workers", 2)]),
            Err(ScaleError::NoSuchComponent(_))
        ));
    }

    #[test]
    fn v1alpha1_services_are_patched_by_key() {
        let graph = TargetGraph::from_value(&json!({
            "metadata": {"name": "g", "namespace": "ns"},
            "spec": {"services": {
                "VllmDecodeWorker": {"subComponentType": "decode", "replicas": 2},
                "odd/name~": {"subComponentType": "prefill"}
            }}
        }))
        .unwrap();
        let patch = graph_patch(&graph, &[("VllmDecodeWorker", 4), ("odd/name~", 1)])
            .unwrap()
            .unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/spec/services/VllmDecodeWorker/replicas", "value": 2},
                {"op": "replace", "path": "/spec/services/VllmDecodeWorker/replicas", "value": 4},
                {"op": "add", "path": "/spec/services/odd~1name~0/replicas", "value": 1}
            ])
        );
    }

    /// The adapter is looked for at the version the graph was read at first (Dynamo up to 1.1
    /// serves both at v1alpha1 only).
    #[test]
    fn adapters_are_read_at_the_graphs_version_first() {
        assert_eq!(adapter_versions(&dgd()), ["v1beta1", "v1alpha1"]);
        let alpha = TargetGraph::from_value(&json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "metadata": {"name": "g", "namespace": "ns"},
            "spec": {"services": {"decode": {"subComponentType": "decode"}}}
        }))
        .unwrap();
        assert_eq!(adapter_versions(&alpha), ["v1alpha1", "v1beta1"]);
    }

    #[test]
    fn adapter_patch_tests_what_was_read() {
        let adapter = AdapterScale {
            name: "g-decode".into(),
            spec_replicas: 2,
            status_replicas: Some(1),
            version: "v1beta1",
        };
        assert!(!adapter.synced());
        assert_eq!(
            adapter_patch(&adapter, 5),
            json!([
                {"op": "test", "path": "/spec/replicas", "value": 2},
                {"op": "replace", "path": "/spec/replicas", "value": 5}
            ])
        );
    }

    #[test]
    fn failed_tests_and_409s_are_conflicts() {
        let status = |code: u16, message: &str, cause: Option<&str>| {
            let mut status = kube::core::Status::failure(message, "Invalid").with_code(code);
            if let Some(cause) = cause {
                status.details = Some(
                    serde_json::from_value(json!({
                        "causes": [{"reason": "UnexpectedServerResponse", "message": cause}]
                    }))
                    .unwrap(),
                );
            }
            kube::Error::Api(Box::new(status))
        };
        // What the API server answers when a `test` fails (no details at all).
        assert!(is_conflict(&status(422, PATCH_NOT_APPLICABLE, None)));
        assert!(is_conflict(&status(409, "conflict", None)));
        // Schema violations are not conflicts.
        assert!(!is_conflict(&status(
            422,
            "spec.replicas: Invalid value: -1",
            None
        )));
        assert!(!is_conflict(&status(
            422,
            PATCH_NOT_APPLICABLE,
            Some("spec.replicas: Invalid value: -1")
        )));
        assert!(!is_conflict(&status(403, "forbidden", None)));
    }
}

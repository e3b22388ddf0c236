//! API lookups shared by the reconcilers and the admission webhook: the ClusterTopologyBinding or
//! ClusterTopology a DGD names (telling a missing Grove CRD from a missing object), a DGD by name,
//! and a PlannerPolicy's target DGD at whichever version is served ([`target_graph`]).

use std::fmt;

use kube::{
    Api, Client,
    core::{ApiResource, DynamicObject},
};

use planner_api::{ClusterTopologySpec, DynamoGraphDeployment};

use crate::{
    target::{ShapeError, TargetGraph, graph_resource},
    topology::ClusterTopologyLookup,
};

/// Group and version Grove serves ClusterTopologyBindings (and, in earlier releases,
/// ClusterTopologies) under (`grove.io/v1alpha1` by default; `--cluster-topology-api-version`
/// follows Grove if it moves the kinds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTopologyApi {
    /// API group, e.g. `grove.io`.
    pub group: String,
    /// Version, e.g. `v1alpha1`.
    pub version: String,
}

impl Default for ClusterTopologyApi {
    fn default() -> Self {
        Self {
            group: "grove.io".into(),
            version: "v1alpha1".into(),
        }
    }
}

impl fmt::Display for ClusterTopologyApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.group, self.version)
    }
}

/// A `--cluster-topology-api-version` that is not `<group>/<version>`.
#[derive(Debug, thiserror::Error)]
#[error("{text:?} is not <group>/<version>, e.g. grove.io/v1alpha1")]
pub struct ApiVersionError {
    /// The value given.
    pub text: String,
}

impl std::str::FromStr for ClusterTopologyApi {
    type Err = ApiVersionError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once('/') {
            Some((group, version)) if !group.is_empty() && !version.is_empty() && !version.contains('/') => {
                Ok(Self {
                    group: group.into(),
                    version: version.into(),
                })
            }
            _ => Err(ApiVersionError { text: text.into() }),
        }
    }
}

impl ClusterTopologyApi {
    /// The API resource of ClusterTopologies (Grove releases before the rename).
    pub fn resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version: self.to_string(),
            kind: "ClusterTopology".into(),
            plural: "clustertopologies".into(),
        }
    }

    /// The API resource of ClusterTopologyBindings (today's Grove).
    pub fn binding_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version: self.to_string(),
            kind: "ClusterTopologyBinding".into(),
            plural: "clustertopologybindings".into(),
        }
    }
}

/// Which of Grove's topology kinds the API server serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TopologyKindsServed {
    /// `clustertopologybindings`.
    pub binding: bool,
    /// `clustertopologies`.
    pub legacy: bool,
}

impl TopologyKindsServed {
    /// The served resources, the binding first.
    pub fn resources(self, api: &ClusterTopologyApi) -> Vec<ApiResource> {
        let mut resources = Vec::new();
        if self.binding {
            resources.push(api.binding_resource());
        }
        if self.legacy {
            resources.push(api.resource());
        }
        resources
    }
}

/// Why a lookup failed (as opposed to finding that something is absent).
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was attempted.
        action: String,
        /// The API error.
        source: kube::Error,
    },
}

/// Looks up the topology a DGD names: a ClusterTopologyBinding (Grove v0.1.0-alpha.9 and later)
/// when that CRD is served, else (or when no binding has the name) a ClusterTopology (alpha.4 to
/// alpha.8) when that CRD is served; both are read as `spec.levels[]` of `{domain, key}`. API discovery first
/// tells which are served, so that a missing CRD (Grove not installed) is told apart from a
/// missing object.
pub async fn cluster_topology(
    client: &Client,
    api: &ClusterTopologyApi,
    name: &str,
) -> Result<ClusterTopologyLookup, LookupError> {
    let served = topology_kinds_served(client, api).await?;
    if served.binding {
        match get_spec::<ClusterTopologySpec>(client, &api.binding_resource(), name).await? {
            Some(Ok(spec)) => return Ok(ClusterTopologyLookup::FoundBinding(spec)),
            Some(Err(error)) => return Ok(ClusterTopologyLookup::BindingUnreadable(error.to_string())),
            None if !served.legacy => {
                return Ok(ClusterTopologyLookup::BindingNotFound { legacy_served: false });
            }
            None => {}
        }
    }
    if !served.legacy {
        return Ok(ClusterTopologyLookup::GroveNotInstalled);
    }
    Ok(
        match get_spec::<ClusterTopologySpec>(client, &api.resource(), name).await? {
            Some(Ok(spec)) => ClusterTopologyLookup::Found(spec),
            Some(Err(error)) => ClusterTopologyLookup::Unreadable(error.to_string()),
            None if served.binding => ClusterTopologyLookup::BindingNotFound { legacy_served: true },
            None => ClusterTopologyLookup::NotFound,
        },
    )
}

/// The spec of the cluster-scoped object `name` of `resource`: `None` when absent, `Some(Err)`
/// with the parse error when it is not a `T`.
async fn get_spec<T: serde::de::DeserializeOwned>(
    client: &Client,
    resource: &ApiResource,
    name: &str,
) -> Result<Option<Result<T, serde_json::Error>>, LookupError> {
    let objects: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    // Not `get_opt`: for a group/version nobody serves the API server answers 404 with a
    // plain-text body, which kube reports with reason "Failed to parse error data", and
    // `Status::is_not_found` only looks at the reason.
    match objects.get(name).await {
        Ok(object) => {
            let spec = object.data.get("spec").cloned().unwrap_or_default();
            Ok(Some(serde_json::from_value::<T>(spec)))
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(source) => Err(LookupError::Kube {
            action: format!("get {} {name}", resource.kind),
            source,
        }),
    }
}

/// Which of Grove's topology kinds the API server serves (one discovery request).
pub async fn topology_kinds_served(
    client: &Client,
    api: &ClusterTopologyApi,
) -> Result<TopologyKindsServed, LookupError> {
    match client.list_api_group_resources(&api.to_string()).await {
        Ok(list) => {
            let has = |plural: String| list.resources.iter().any(|r| r.name == plural);
            Ok(TopologyKindsServed {
                binding: has(api.binding_resource().plural),
                legacy: has(api.resource().plural),
            })
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(TopologyKindsServed::default()),
        Err(source) => Err(LookupError::Kube {
            action: format!("discover {api}"),
            source,
        }),
    }
}

/// What looking a PlannerPolicy's target up found.
#[derive(Debug, Clone, PartialEq)]
pub enum TargetLookup {
    /// The DGD, read at either served version (boxed: it is much larger than the others).
    Found(Box<TargetGraph>),
    /// No DGD has the name (or no version of the DGD CRD is served).
    NotFound,
    /// The object exists but is not a DGD of either layout.
    Unreadable(ShapeError),
}

/// A policy's target DGD, read at `nvidia.com/v1beta1` and, where that version is not served (an
/// older Dynamo operator), at `v1alpha1`. Either way the graph is read by its layout (see
/// [`TargetGraph`]).
pub async fn target_graph(client: &Client, namespace: &str, name: &str) -> Result<TargetLookup, LookupError> {
    for version in ["v1beta1", "v1alpha1"] {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &graph_resource(version));
        match api.get(name).await {
            Ok(object) => {
                return Ok(match TargetGraph::from_object(&object) {
                    Ok(graph) => TargetLookup::Found(Box::new(graph)),
                    Err(error) => TargetLookup::Unreadable(error),
                });
            }
            // The object is not there (a Status with reason NotFound)...
            Err(kube::Error::Api(status)) if status.reason == "NotFound" => {
                return Ok(TargetLookup::NotFound);
            }
            // ...or the version is not served (a plain-text 404): try the next one.
            Err(kube::Error::Api(status)) if status.code == 404 => continue,
            Err(source) => {
                return Err(LookupError::Kube {
                    action: format!("get DynamoGraphDeployment {namespace}/{name} (nvidia.com/{version})"),
                    source,
                });
            }
        }
    }
    Ok(TargetLookup::NotFound)
}

/// A DGD by namespace and name; `None` when it does not exist.
pub async fn dynamo_graph_deployment(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<DynamoGraphDeployment>, LookupError> {
    let api: Api<DynamoGraphDeployment> = Api::namespaced(client.clone(), namespace);
    match api.get(name).await {
        Ok(dgd) => Ok(Some(dgd)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(source) => Err(LookupError::Kube {
            action: format!("get DynamoGraphDeployment {namespace}/{name}"),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_version_flag() {
        let api: ClusterTopologyApi = "grove.io/v1alpha1".parse().unwrap();
        assert_eq!(api, ClusterTopologyApi::default());
        assert_eq!(api.resource().plural, "clustertopologies");
        assert_eq!(api.binding_resource().kind, "ClusterTopologyBinding");
        let both = TopologyKindsServed {
            binding: true,
            legacy: true,
        };
        let kinds: Vec<String> = both.resources(&api).into_iter().map(|r| r.kind).collect();
        assert_eq!(kinds, ["ClusterTopologyBinding", "ClusterTopology"]);
        assert!("grove.io".parse::<ClusterTopologyApi>().is_err());
        assert!("/v1".parse::<ClusterTopologyApi>().is_err());
        assert!("a/b/c".parse::<ClusterTopologyApi>().is_err());
    }
}

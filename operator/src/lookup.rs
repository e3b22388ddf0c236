//! API lookups shared by the reconcilers and the admission webhook: the ClusterTopology a DGD
//! names (telling a missing Grove CRD from a missing object) and a DGD by name.

use std::fmt;

use kube::{
    Api, Client,
    core::{ApiResource, DynamicObject},
};

use planner_api::{ClusterTopologySpec, DynamoGraphDeployment};

use crate::topology::ClusterTopologyLookup;

/// Group and version Grove serves ClusterTopologies under (`grove.io/v1alpha1` by default;
/// `--cluster-topology-api-version` follows Grove if it moves the kind).
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

impl std::str::FromStr for ClusterTopologyApi {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once('/') {
            Some((group, version)) if !group.is_empty() && !version.is_empty() && !version.contains('/') => {
                Ok(Self {
                    group: group.into(),
                    version: version.into(),
                })
            }
            _ => Err(format!(
                "{text:?} is not <group>/<version>, e.g. grove.io/v1alpha1"
            )),
        }
    }
}

impl ClusterTopologyApi {
    /// The API resource of ClusterTopologies.
    pub fn resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version: self.to_string(),
            kind: "ClusterTopology".into(),
            plural: "clustertopologies".into(),
        }
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

/// Looks up a ClusterTopology by name. A 404 is followed by API discovery, so that a missing
/// CRD (Grove not installed) is told apart from a missing object.
pub async fn cluster_topology(
    client: &Client,
    api: &ClusterTopologyApi,
    name: &str,
) -> Result<ClusterTopologyLookup, LookupError> {
    let resource = api.resource();
    let topologies: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let kube_error = |action: String| move |source| LookupError::Kube { action, source };
    // Not `get_opt`: for a group/version nobody serves (Grove not installed) the API server
    // answers 404 with a plain-text body, which kube reports with reason "Failed to parse error
    // data", and `Status::is_not_found` only looks at the reason.
    let found = match topologies.get(name).await {
        Ok(object) => Some(object),
        Err(kube::Error::Api(status)) if status.code == 404 => None,
        Err(source) => return Err(kube_error(format!("get ClusterTopology {name}"))(source)),
    };
    match found {
        Some(object) => {
            let spec = object.data.get("spec").cloned().unwrap_or_default();
            Ok(match serde_json::from_value::<ClusterTopologySpec>(spec) {
                Ok(spec) => ClusterTopologyLookup::Found(spec),
                Err(error) => ClusterTopologyLookup::Unreadable(error.to_string()),
            })
        }
        None => Ok(if cluster_topologies_served(client, api).await? {
            ClusterTopologyLookup::NotFound
        } else {
            ClusterTopologyLookup::GroveNotInstalled
        }),
    }
}

/// Whether the API server serves ClusterTopologies (Grove, or the copy of its CRD, installed).
pub async fn cluster_topologies_served(
    client: &Client,
    api: &ClusterTopologyApi,
) -> Result<bool, LookupError> {
    match client.list_api_group_resources(&api.to_string()).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == api.resource().plural)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(source) => Err(LookupError::Kube {
            action: format!("discover {api}"),
            source,
        }),
    }
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
        assert!("grove.io".parse::<ClusterTopologyApi>().is_err());
        assert!("/v1".parse::<ClusterTopologyApi>().is_err());
        assert!("a/b/c".parse::<ClusterTopologyApi>().is_err());
    }
}

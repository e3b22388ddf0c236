//! DynamoGraphDeployment rules beyond the schema, for its KV-transfer topology (NVIDIA's
//! `spec.experimental.kvTransferPolicy` or a frontend's `kvCacheTransferTopology`): Grove absent,
//! ClusterTopologyBinding absent, domain not one of its levels, the frontend field on another
//! component, both declared. The schema's CEL rules check the field-only rules too; they are
//! repeated here so that objects admitted before those rules existed are still caught by the
//! reconciler.

use planner_api::DynamoGraphDeploymentSpec;

use crate::topology::{self, ClusterTopologyLookup, ResolvedTopology, TopologyError, TopologyRequest};

/// The checks that need no lookup. `Ok(Some(request))`: the DGD uses the feature; look up
/// `request.cluster_topology` (when set) and call [`validate`].
pub fn precheck(spec: &DynamoGraphDeploymentSpec) -> Result<Option<TopologyRequest>, TopologyError> {
    topology::configured(spec)
}

/// Every topology rule, given the lookup of the ClusterTopology the spec names (`None` when
/// none is needed or it was not looked up). `Ok(None)`: the DGD does not use the feature.
pub fn validate(
    spec: &DynamoGraphDeploymentSpec,
    lookup: Option<&ClusterTopologyLookup>,
) -> Result<Option<ResolvedTopology>, TopologyError> {
    match precheck(spec)? {
        Some(request) => request.resolve(lookup).map(Some),
        None => Ok(None),
    }
}

/// Whether an update changed what [`validate`] looks up: the ClusterTopologyBinding name, the
/// `kvCacheTransferTopology` field or NVIDIA's `kvTransferPolicy`. When it did not, the webhook does not reject the update for
/// the ClusterTopology having changed since (the reconciler reports that in `TopologyResolved`),
/// so that replica changes by the planner keep working.
pub fn topology_changed(old: &DynamoGraphDeploymentSpec, new: &DynamoGraphDeploymentSpec) -> bool {
    let name = |spec: &DynamoGraphDeploymentSpec| {
        spec.topology_constraint
            .as_ref()
            .and_then(|t| t.cluster_topology_name.clone())
    };
    let fields = |spec: &DynamoGraphDeploymentSpec| {
        spec.components
            .iter()
            .map(|c| (c.name.clone(), c.kind, c.kv_cache_transfer_topology.clone()))
            .filter(|(_, _, t)| t.is_some())
            .collect::<Vec<_>>()
    };
    let policy = |spec: &DynamoGraphDeploymentSpec| {
        spec.experimental
            .as_ref()
            .and_then(|e| e.kv_transfer_policy.clone())
    };
    name(old) != name(new) || fields(old) != fields(new) || policy(old) != policy(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner_api::DynamoGraphDeployment;

    fn sample() -> DynamoGraphDeploymentSpec {
        let dgd: DynamoGraphDeployment =
            serde_yaml::from_str(include_str!("../../../config/samples/dgd-disagg.yaml")).unwrap();
        dgd.spec
    }

    #[test]
    fn replica_changes_do_not_touch_the_topology() {
        let old = sample();
        let mut new = old.clone();
        new.components[1].replicas = Some(4);
        assert!(!topology_changed(&old, &new));
        new.components[0]
            .kv_cache_transfer_topology
            .as_mut()
            .unwrap()
            .level = "rack".into();
        assert!(topology_changed(&old, &new));
        let mut renamed = old.clone();
        renamed
            .topology_constraint
            .as_mut()
            .unwrap()
            .cluster_topology_name = Some("other".into());
        assert!(topology_changed(&old, &renamed));
    }

    #[test]
    fn validate_is_the_topology_resolution() {
        let spec = sample();
        assert_eq!(
            validate(&spec, Some(&ClusterTopologyLookup::NotFound))
                .unwrap_err()
                .reason(),
            "ClusterTopologyNotFound"
        );
        let mut without = spec.clone();
        without.components[0].kv_cache_transfer_topology = None;
        assert_eq!(validate(&without, None), Ok(None));
    }
}

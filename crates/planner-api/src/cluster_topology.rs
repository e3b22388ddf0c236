//! The topology levels of Grove's `ClusterTopologyBinding` (Grove v0.1.0-alpha.9 and later) and
//! of its predecessor `ClusterTopology` (alpha.4 to alpha.8), both `grove.io/v1alpha1` and
//! cluster-scoped. Both kinds keep their levels in `spec.levels[]` as `{domain, key}`, `key` being
//! the node label that holds the node's domain. This operator only reads them: Grove owns both
//! CRDs, and this project ships neither.

use serde::{Deserialize, Serialize};

/// The part of a ClusterTopologyBinding's (or ClusterTopology's) spec this operator reads.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ClusterTopologySpec {
    /// Topology levels ordered from the broadest (e.g. `zone`) to the narrowest (e.g. `host`).
    pub levels: Vec<TopologyLevel>,
}

/// One topology level.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct TopologyLevel {
    /// Name of the level, e.g. `zone`, `rack` or `host`.
    pub domain: String,
    /// Node label whose value names the node's domain at this level, e.g.
    /// `topology.kubernetes.io/zone`.
    pub key: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grove's own objects (a binding of today's Grove, a ClusterTopology of alpha.8) parse; the
    /// invented `labelKey` of earlier versions of this project does not.
    #[test]
    fn both_grove_kinds_read_key() {
        let binding: ClusterTopologySpec = serde_json::from_value(serde_json::json!({
            "levels": [{"domain": "zone", "key": "topology.kubernetes.io/zone"}],
            "schedulerTopologyBindings": [{"schedulerName": "kai-scheduler", "topologyReference": "x"}]
        }))
        .unwrap();
        assert_eq!(binding.levels[0].key, "topology.kubernetes.io/zone");
        let invented = serde_json::from_value::<ClusterTopologySpec>(serde_json::json!({
            "levels": [{"domain": "zone", "labelKey": "topology.kubernetes.io/zone"}]
        }));
        assert!(invented.unwrap_err().to_string().contains("missing field `key`"));
    }
}

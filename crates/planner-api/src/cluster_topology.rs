//! `ClusterTopology` (`grove.io/v1alpha1`, cluster-scoped): Grove's mapping of topology domains to
//! node labels. This operator only reads it; the CRD here reproduces its relevant fields so that
//! clusters without Grove (and the tests) can install it.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::dgd::{DOMAIN_PATTERN, LABEL_KEY_PATTERN};

/// Topology levels of the cluster, broadest first (e.g. zone, rack, host).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "grove.io",
    version = "v1alpha1",
    kind = "ClusterTopology",
    plural = "clustertopologies",
    singular = "clustertopology",
    derive = "PartialEq",
    doc = "Topology levels of the cluster, broadest first, each mapped to a node label.",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterTopologySpec {
    /// Topology levels ordered from the broadest (e.g. `zone`) to the narrowest (e.g. `host`).
    #[schemars(length(min = 1, max = 16))]
    #[x_kube(validation = Rule::new("self.all(l, self.exists_one(m, m.domain == l.domain))")
        .message("each spec.levels[].domain may appear only once"))]
    #[x_kube(validation = Rule::new("self.all(l, self.exists_one(m, m.labelKey == l.labelKey))")
        .message("each spec.levels[].labelKey may appear only once"))]
    pub levels: Vec<TopologyLevel>,
}

/// One topology level.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TopologyLevel {
    /// Name of the level, e.g. `zone`, `rack` or `host`.
    #[schemars(length(min = 1, max = 63), regex(pattern = DOMAIN_PATTERN))]
    pub domain: String,
    /// Node label whose value names the node's domain at this level, e.g.
    /// `topology.kubernetes.io/zone`.
    #[schemars(length(min = 1, max = 317), regex(pattern = LABEL_KEY_PATTERN))]
    pub label_key: String,
}

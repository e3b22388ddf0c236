//! Topology-aware KV-cache transfer, the pure part: validating a DGD's KV-transfer topology
//! (NVIDIA's `spec.experimental.kvTransferPolicy`, or this operator's frontend field
//! `kvCacheTransferTopology`) against Grove's `ClusterTopologyBinding`, rendering what worker and
//! frontend pods need, and summarising where the worker pods landed. No I/O here: the callers
//! (the DGD reconciler, the topology label controller and the admission webhook) fetch the
//! binding and the pods and pass them in.
//!
//! The flow, for a DGD with `kvTransferPolicy: {domain: zone, clusterTopologyName: gpu}`:
//! 1. [`configured`] checks the fields themselves (one declaration, a valid domain, label and
//!    weight) and says whether a ClusterTopologyBinding is needed.
//! 2. [`TopologyRequest::resolve`] checks the binding lookup (Grove absent, object absent,
//!    domain not one of its levels) and yields a [`ResolvedTopology`]: which pod label holds which
//!    domain, and which node label it is copied from.
//! 3. [`inject`] gives every worker the runtime's topology env and a Downward API volume (one
//!    file per level) at the contract's mount path (see [`EnvContract`]).
//! 4. After scheduling, the topology label controller copies node labels onto worker pods (Grove
//!    never labels pods with topology), and [`report`] turns the pods into the
//!    `TopologyResolved` condition with per-domain counts.

mod inject;
mod report;
mod resolve;

pub use inject::{
    frontend_env, inject, labels_annotation, parse_labels_annotation, volume, volume_mount, volume_mount_at,
    worker_env,
};
pub use report::{TopologyReport, WorkerPod, report};
pub use resolve::{
    ClusterTopologyLookup, Declared, LabelSource, ResolvedTopology, TopologyError, TopologyKind,
    TopologyLabel, TopologyRequest, cluster_topology_name, configured, is_domain_name, is_label_key, resolve,
};

/// Prefix of the pod labels this operator's topology label controller sets after scheduling, one
/// per level of a ClusterTopologyBinding: `nvidia.com/dynamo-topology.<domain>`, the labels
/// NVIDIA's Dynamo operator sets for the same purpose (Grove sets none).
pub const POD_LABEL_PREFIX: &str = "nvidia.com/dynamo-topology.";
/// Where worker containers find one file per topology level (file name = domain) under the
/// `planner` contract.
pub const MOUNT_PATH: &str = "/etc/podinfo/topology";
/// Name of the Downward API volume (and its mount) in worker pods.
pub const VOLUME_NAME: &str = "topology-labels";
/// Pod annotation on worker pods listing `<pod label>=<node label>` pairs, comma-separated: what
/// the topology label controller copies from the node onto the pod after scheduling.
pub const LABELS_ANNOTATION: &str = "planner.dynamo.io/topology-labels";
/// Worker env: read the topology files at startup and publish them.
pub const ENV_TOPOLOGY_ENABLED: &str = "DYN_TOPOLOGY_ENABLED";
/// Worker and frontend env: the domain KV-cache transfers stay in.
pub const ENV_LEVEL: &str = "DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL";
/// Frontend env: `fail` or `fallback` when no decode worker shares the prefill worker's domain.
pub const ENV_MISMATCH_POLICY: &str = "DYN_ROUTER_KV_TRANSFER_MISMATCH_POLICY";
/// Frontend env: weight of the soft transfer-cost term, when set.
pub const ENV_WEIGHT: &str = "DYN_ROUTER_KV_TRANSFER_WEIGHT";
/// Every env var of the `planner` contract; user copies of them in the pods it injects into are
/// replaced.
pub const OWNED_ENV: [&str; 4] = [ENV_TOPOLOGY_ENABLED, ENV_LEVEL, ENV_MISMATCH_POLICY, ENV_WEIGHT];
/// Name of the CRD of Grove's ClusterTopology (Grove v0.1.0-alpha.4 to alpha.8), for messages.
pub const CLUSTER_TOPOLOGY_CRD: &str = "clustertopologies.grove.io";
/// Name of the CRD of Grove's ClusterTopologyBinding (alpha.9 and later), for messages.
pub const CLUSTER_TOPOLOGY_BINDING_CRD: &str = "clustertopologybindings.grove.io";

/// Where the released Dynamo runtime reads the topology files (`DYN_TOPOLOGY_MOUNT_PATH`'s
/// default in ai-dynamo/dynamo's `components/src/dynamo/common/utils/topology.py`).
pub const DYNAMO_MOUNT_PATH: &str = "/etc/dynamo/topology";
/// Worker env of the released runtime: the directory of the topology files.
pub const ENV_DYN_MOUNT_PATH: &str = "DYN_TOPOLOGY_MOUNT_PATH";
/// Worker env of the released runtime: the domain KV-cache transfers are constrained to.
pub const ENV_DYN_KV_TRANSFER_DOMAIN: &str = "DYN_KV_TRANSFER_DOMAIN";
/// Worker env of the released runtime: `required` (stay in the domain) or `preferred`.
pub const ENV_DYN_KV_TRANSFER_ENFORCEMENT: &str = "DYN_KV_TRANSFER_ENFORCEMENT";
/// Worker env of the released runtime: weight of the preference when `preferred`.
pub const ENV_DYN_KV_TRANSFER_PREFERRED_WEIGHT: &str = "DYN_KV_TRANSFER_PREFERRED_WEIGHT";
/// Every env var the released runtime's contract sets; user copies are replaced.
pub const DYNAMO_OWNED_ENV: [&str; 5] = [
    ENV_TOPOLOGY_ENABLED,
    ENV_DYN_MOUNT_PATH,
    ENV_DYN_KV_TRANSFER_DOMAIN,
    ENV_DYN_KV_TRANSFER_ENFORCEMENT,
    ENV_DYN_KV_TRANSFER_PREFERRED_WEIGHT,
];
/// DGD annotation that picks the environment contract of its pods, overriding the operator's
/// `--topology-env`: `planner` or `dynamo`.
pub const ENV_CONTRACT_ANNOTATION: &str = "planner.dynamo.io/topology-env";

/// Which names and paths the topology is handed to the runtime under.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum EnvContract {
    /// The released Dynamo runtime's (`dynamo.common.utils.topology.read_topology_config`, Dynamo
    /// 1.2 and later): workers get `DYN_TOPOLOGY_ENABLED`, `DYN_TOPOLOGY_MOUNT_PATH`,
    /// `DYN_KV_TRANSFER_DOMAIN`, `DYN_KV_TRANSFER_ENFORCEMENT` (`required` or `preferred`) and,
    /// when preferred with a weight, `DYN_KV_TRANSFER_PREFERRED_WEIGHT`; files at
    /// [`DYNAMO_MOUNT_PATH`]. The frontend gets nothing: that router reads the policy the workers
    /// publish. The default, because that reader exits the worker when topology is enabled
    /// without `DYN_KV_TRANSFER_DOMAIN`.
    #[default]
    Dynamo,
    /// This operator's first names: `DYN_TOPOLOGY_ENABLED`, `DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL`
    /// on workers and the router settings on the frontend, files at [`MOUNT_PATH`]. For runtimes
    /// built to read them; a stock Dynamo 1.2+ worker exits at start-up under it.
    Planner,
}

impl EnvContract {
    /// `planner` or `dynamo`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Planner => "planner",
            Self::Dynamo => "dynamo",
        }
    }

    /// The contract of a DGD: its [`ENV_CONTRACT_ANNOTATION`] when that is `planner` or
    /// `dynamo`, else `default` (the operator's flag).
    pub fn for_annotations(
        annotations: Option<&std::collections::BTreeMap<String, String>>,
        default: Self,
    ) -> Self {
        match annotations
            .and_then(|a| a.get(ENV_CONTRACT_ANNOTATION))
            .map(|v| v.trim())
        {
            Some("planner") => Self::Planner,
            Some("dynamo") => Self::Dynamo,
            _ => default,
        }
    }

    /// Where workers find the topology files.
    pub fn mount_path(self) -> &'static str {
        match self {
            Self::Planner => MOUNT_PATH,
            Self::Dynamo => DYNAMO_MOUNT_PATH,
        }
    }
}

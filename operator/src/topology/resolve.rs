//! Validating `kvCacheTransferTopology` and resolving it against a ClusterTopology lookup.

use planner_api::{
    ClusterTopologySpec, ComponentType, DynamoGraphDeploymentSpec, KvCacheTransferTopology, MismatchPolicy,
};

use super::{CLUSTER_TOPOLOGY_BINDING_CRD, CLUSTER_TOPOLOGY_CRD, EnvContract, POD_LABEL_PREFIX};

/// What looking up the DGD's topology (`spec.topologyConstraint.clusterTopologyName`) found.
/// Today's Grove serves `ClusterTopologyBinding` (`spec.levels[]` of `{domain, key}`); earlier
/// releases served `ClusterTopology` (`spec.levels[]` of `{domain, labelKey}`). The caller looks
/// up the binding first when its CRD is served, then the ClusterTopology (an API GET each, and API
/// discovery to tell a missing CRD from a missing object); the variants say which kind answered,
/// so that messages name it.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterTopologyLookup {
    /// Neither of Grove's CRDs (ClusterTopologyBinding, ClusterTopology) is installed.
    GroveNotInstalled,
    /// Only the ClusterTopology CRD is installed, and no ClusterTopology has the name.
    NotFound,
    /// The ClusterTopology's spec.
    Found(ClusterTopologySpec),
    /// The ClusterTopology exists but its spec is not `{levels: [{domain, labelKey}]}` (the
    /// parse error).
    Unreadable(String),
    /// The ClusterTopologyBinding CRD is installed and no binding has the name; nor has a
    /// ClusterTopology when that CRD is installed too (`legacy_served`).
    BindingNotFound {
        /// Whether the ClusterTopology CRD is installed (and was looked up as well).
        legacy_served: bool,
    },
    /// The ClusterTopologyBinding's levels (`key` read into `label_key`).
    FoundBinding(ClusterTopologySpec),
    /// The ClusterTopologyBinding exists but its spec is not `{levels: [{domain, key}]}`.
    BindingUnreadable(String),
}

/// The kind of Grove object that holds a DGD's topology levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyKind {
    /// `ClusterTopologyBinding` (today's Grove; levels `{domain, key}`).
    Binding,
    /// `ClusterTopology` (earlier Grove releases; levels `{domain, labelKey}`).
    Legacy,
}

impl TopologyKind {
    /// The kind's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Binding => "ClusterTopologyBinding",
            Self::Legacy => "ClusterTopology",
        }
    }

    /// The field of a level that names the node label.
    pub fn key_field(self) -> &'static str {
        match self {
            Self::Binding => "key",
            Self::Legacy => "labelKey",
        }
    }
}

/// Why a DGD's `kvCacheTransferTopology` is not usable. Each message names the field, the value
/// and what is allowed; [`TopologyError::reason`] is the CamelCase reason for conditions.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TopologyError {
    /// The field is set on a component that is not a frontend.
    #[error(
        "spec.components[{index}].kvCacheTransferTopology: set on component \"{name}\" of type {kind}; kvCacheTransferTopology is allowed only on a component with type: frontend"
    )]
    NotOnFrontend {
        /// Position in `spec.components`.
        index: usize,
        /// Component name.
        name: String,
        /// The component's type (`none` when unset).
        kind: String,
    },
    /// More than one component sets the field.
    #[error(
        "spec.components: {count} components set kvCacheTransferTopology ({names}); at most one frontend may set it"
    )]
    MultipleFrontends {
        /// How many.
        count: usize,
        /// Their names, comma-separated.
        names: String,
    },
    /// `level` is not a topology domain name.
    #[error(
        "spec.components[{index}].kvCacheTransferTopology.level: {level:?} is not a topology domain name; allowed: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit (e.g. zone, rack)"
    )]
    InvalidLevel {
        /// Position in `spec.components`.
        index: usize,
        /// The value.
        level: String,
    },
    /// `label` is not a Kubernetes label key.
    #[error(
        "spec.components[{index}].kvCacheTransferTopology.label: {label:?} is not a label key; allowed: an optional DNS subdomain prefix and '/', then a name of at most 63 letters, digits, '-', '_' or '.' (e.g. topology.kubernetes.io/zone)"
    )]
    InvalidLabel {
        /// Position in `spec.components`.
        index: usize,
        /// The value.
        label: String,
    },
    /// `kvTransferWeight` is negative or not a number.
    #[error(
        "spec.components[{index}].kvCacheTransferTopology.kvTransferWeight: {weight} is not allowed; allowed: a finite number >= 0"
    )]
    InvalidWeight {
        /// Position in `spec.components`.
        index: usize,
        /// The value.
        weight: f64,
    },
    /// No label and no ClusterTopology name.
    #[error(
        "spec.topologyConstraint.clusterTopologyName: not set, but spec.components[{index}].kvCacheTransferTopology has no label; set clusterTopologyName to the Grove ClusterTopology whose levels to use, or set kvCacheTransferTopology.label to a node label key such as topology.kubernetes.io/zone"
    )]
    ClusterTopologyNameMissing {
        /// Position of the frontend in `spec.components`.
        index: usize,
    },
    /// Grove's CRDs are absent, so the topology cannot be read.
    #[error(
        "spec.topologyConstraint.clusterTopologyName: ClusterTopology {name:?} cannot be read because Grove's ClusterTopology CRD ({crd}) is not installed, nor its ClusterTopologyBinding CRD ({binding_crd}); install Grove, or set spec.components[{index}].kvCacheTransferTopology.label to a node label key such as topology.kubernetes.io/zone"
    )]
    GroveNotInstalled {
        /// The ClusterTopology name.
        name: String,
        /// Position of the frontend in `spec.components`.
        index: usize,
        /// The ClusterTopology CRD name.
        crd: &'static str,
        /// The ClusterTopologyBinding CRD name.
        binding_crd: &'static str,
    },
    /// No object of the kinds looked up has the name.
    #[error(
        "spec.topologyConstraint.clusterTopologyName: {kinds} {name:?} not found; create it, name an existing one (kubectl get {plurals}), or set spec.components[{index}].kvCacheTransferTopology.label to a node label key"
    )]
    ClusterTopologyNotFound {
        /// The name.
        name: String,
        /// Position of the frontend in `spec.components`.
        index: usize,
        /// The kinds looked up, e.g. `ClusterTopologyBinding or ClusterTopology`.
        kinds: String,
        /// Their resources, for the kubectl hint, e.g. `clustertopologybindings,clustertopologies`.
        plurals: String,
    },
    /// `level` is not one of the topology's domains.
    #[error(
        "spec.components[{index}].kvCacheTransferTopology.level: {level:?} is not a level of {kind} {name:?}; allowed: {allowed}"
    )]
    UnknownLevel {
        /// Position of the frontend in `spec.components`.
        index: usize,
        /// The value.
        level: String,
        /// The kind that holds the levels.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// Its domains, broadest first, comma-separated.
        allowed: String,
    },
    /// The topology object exists but cannot be read.
    #[error(
        "spec.topologyConstraint.clusterTopologyName: {kind} {name:?} has a spec this operator cannot read ({error}); it needs spec.levels[] with domain and {key_field}"
    )]
    ClusterTopologyUnreadable {
        /// The kind.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// The parse error.
        error: String,
        /// The field of a level that names the node label.
        key_field: &'static str,
    },
    /// A topology domain is too long to form the pod label `grove.io/topology.<domain>`.
    #[error(
        "{kind} {name:?} has level domain {domain:?}, which is too long for the pod label {POD_LABEL_PREFIX}<domain> (label names hold at most 63 characters, so domains at most 54); shorten the domain in the {kind}"
    )]
    DomainTooLong {
        /// The kind that holds the levels.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// The domain.
        domain: String,
    },
}

impl TopologyError {
    /// CamelCase reason for the `TopologyResolved` condition.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotOnFrontend { .. } => "NotOnFrontend",
            Self::MultipleFrontends { .. } => "MultipleFrontends",
            Self::InvalidLevel { .. } => "InvalidLevel",
            Self::InvalidLabel { .. } => "InvalidLabel",
            Self::InvalidWeight { .. } => "InvalidWeight",
            Self::ClusterTopologyNameMissing { .. } => "ClusterTopologyNameMissing",
            Self::GroveNotInstalled { .. } => "GroveNotInstalled",
            Self::ClusterTopologyNotFound { .. } => "ClusterTopologyNotFound",
            Self::UnknownLevel { .. } => "LevelNotInClusterTopology",
            Self::DomainTooLong { .. } => "DomainTooLong",
            Self::ClusterTopologyUnreadable { .. } => "ClusterTopologyUnreadable",
        }
    }

    /// The field the error is about, as the API server names fields.
    pub fn field(&self) -> String {
        match self {
            Self::NotOnFrontend { index, .. } => format!("spec.components[{index}].kvCacheTransferTopology"),
            Self::MultipleFrontends { .. } => "spec.components".into(),
            Self::InvalidLevel { index, .. } | Self::UnknownLevel { index, .. } => {
                format!("spec.components[{index}].kvCacheTransferTopology.level")
            }
            Self::InvalidLabel { index, .. } => {
                format!("spec.components[{index}].kvCacheTransferTopology.label")
            }
            Self::InvalidWeight { index, .. } => {
                format!("spec.components[{index}].kvCacheTransferTopology.kvTransferWeight")
            }
            Self::ClusterTopologyNameMissing { .. }
            | Self::GroveNotInstalled { .. }
            | Self::ClusterTopologyNotFound { .. }
            | Self::DomainTooLong { .. }
            | Self::ClusterTopologyUnreadable { .. } => "spec.topologyConstraint.clusterTopologyName".into(),
        }
    }
}

/// A DGD's `kvCacheTransferTopology` that passed the checks needing no lookup.
#[derive(Debug, Clone, PartialEq)]
pub struct TopologyRequest {
    /// Position of the frontend that carries the field.
    pub index: usize,
    /// Name of that frontend.
    pub frontend: String,
    /// The field.
    pub settings: KvCacheTransferTopology,
    /// `spec.topologyConstraint.clusterTopologyName`, when the field has no `label`.
    pub cluster_topology: Option<String>,
}

/// Where the topology labels of worker pods come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelSource {
    /// Every level of this ClusterTopology, as `grove.io/topology.<domain>` pod labels.
    ClusterTopology(String),
    /// Every level of this ClusterTopologyBinding, likewise.
    ClusterTopologyBinding(String),
    /// The one node label `kvCacheTransferTopology.label`, copied under the same key.
    Label,
}

/// One topology label of worker pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyLabel {
    /// Domain name; also the file name under [`super::MOUNT_PATH`].
    pub domain: String,
    /// Pod label holding the pod's domain at this level.
    pub pod_label: String,
    /// Node label it is copied from when Grove has not set it.
    pub node_label: String,
}

/// A usable `kvCacheTransferTopology`: what to inject and which labels to copy.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedTopology {
    /// Name of the frontend that carries the field.
    pub frontend: String,
    /// Domain KV-cache transfers stay in.
    pub level: String,
    /// Router behaviour when no decode worker shares the domain.
    pub mismatch_policy: MismatchPolicy,
    /// Weight of the soft transfer-cost term, when set.
    pub kv_transfer_weight: Option<f64>,
    /// Where the labels come from.
    pub source: LabelSource,
    /// The labels, broadest level first; one of them has `domain == level`.
    pub labels: Vec<TopologyLabel>,
    /// Which runtime's environment names and mount path workers get (set by the reconciler
    /// from the operator's flag and the DGD's annotation; [`EnvContract::Planner`] by default).
    pub contract: EnvContract,
}

impl ResolvedTopology {
    /// Whether this topology copies node label `node_label` onto pod label `pod_label`.
    pub fn resolves(&self, pod_label: &str, node_label: &str) -> bool {
        self.labels
            .iter()
            .any(|l| l.pod_label == pod_label && l.node_label == node_label)
    }

    /// The label of the configured level.
    pub fn level_label(&self) -> Option<&TopologyLabel> {
        self.labels.iter().find(|l| l.domain == self.level)
    }

    /// One line on where the topology comes from, for messages.
    pub fn describe(&self) -> String {
        let domains: Vec<&str> = self.labels.iter().map(|l| l.domain.as_str()).collect();
        match &self.source {
            LabelSource::ClusterTopology(name) => format!(
                "level {} of ClusterTopology {name} (levels {})",
                self.level,
                domains.join(", ")
            ),
            LabelSource::ClusterTopologyBinding(name) => format!(
                "level {} of ClusterTopologyBinding {name} (levels {})",
                self.level,
                domains.join(", ")
            ),
            LabelSource::Label => format!(
                "level {} from node label {}",
                self.level,
                self.labels
                    .first()
                    .map(|l| l.node_label.as_str())
                    .unwrap_or_default()
            ),
        }
    }
}

/// Whether `value` is a topology domain name (Grove's pattern, at most 63 characters).
pub fn is_domain_name(value: &str) -> bool {
    is_dns_label(value)
}

fn is_dns_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Whether `value` is a Kubernetes label key: an optional DNS-subdomain prefix (at most 253
/// characters) and `/`, then a name of at most 63 characters.
pub fn is_label_key(value: &str) -> bool {
    let (prefix, name) = match value.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    let prefix_ok = prefix.is_none_or(|p| p.len() <= 253 && p.split('.').all(is_dns_label));
    let bytes = name.as_bytes();
    prefix_ok
        && !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Checks a DGD's `kvCacheTransferTopology` as far as possible without a lookup. `Ok(None)`:
/// no component sets it, and the DGD renders exactly as without this feature.
pub fn configured(spec: &DynamoGraphDeploymentSpec) -> Result<Option<TopologyRequest>, TopologyError> {
    let carriers: Vec<(usize, &planner_api::Component)> = spec
        .components
        .iter()
        .enumerate()
        .filter(|(_, c)| c.kv_cache_transfer_topology.is_some())
        .collect();
    for (index, component) in &carriers {
        if component.kind != Some(ComponentType::Frontend) {
            return Err(TopologyError::NotOnFrontend {
                index: *index,
                name: component.name.clone(),
                kind: component.kind.map_or_else(|| "none".into(), |k| k.to_string()),
            });
        }
    }
    if carriers.len() > 1 {
        return Err(TopologyError::MultipleFrontends {
            count: carriers.len(),
            names: carriers
                .iter()
                .map(|(_, c)| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let Some((index, component)) = carriers.first() else {
        return Ok(None);
    };
    let index = *index;
    let Some(settings) = component.kv_cache_transfer_topology.clone() else {
        return Ok(None);
    };
    if !is_domain_name(&settings.level) {
        return Err(TopologyError::InvalidLevel {
            index,
            level: settings.level.clone(),
        });
    }
    if let Some(label) = &settings.label
        && !is_label_key(label)
    {
        return Err(TopologyError::InvalidLabel {
            index,
            label: label.clone(),
        });
    }
    if let Some(weight) = settings.kv_transfer_weight
        && !(weight.is_finite() && weight >= 0.0)
    {
        return Err(TopologyError::InvalidWeight { index, weight });
    }
    let cluster_topology = if settings.label.is_some() {
        None
    } else {
        let name = spec
            .topology_constraint
            .as_ref()
            .and_then(|t| t.cluster_topology_name.clone())
            .filter(|n| !n.is_empty())
            .ok_or(TopologyError::ClusterTopologyNameMissing { index })?;
        Some(name)
    };
    Ok(Some(TopologyRequest {
        index,
        frontend: component.name.clone(),
        settings,
        cluster_topology,
    }))
}

impl TopologyRequest {
    /// Resolves the request. `lookup` is the result of looking up
    /// [`TopologyRequest::cluster_topology`]; it is ignored (and may be `None`) when the field
    /// has a `label`.
    pub fn resolve(self, lookup: Option<&ClusterTopologyLookup>) -> Result<ResolvedTopology, TopologyError> {
        let Self {
            index,
            frontend,
            settings,
            cluster_topology,
        } = self;
        let KvCacheTransferTopology {
            level,
            mismatch_policy,
            label,
            kv_transfer_weight,
        } = settings;
        let (source, labels) = match (label, cluster_topology) {
            (Some(label), _) => (
                LabelSource::Label,
                vec![TopologyLabel {
                    domain: level.clone(),
                    pod_label: label.clone(),
                    node_label: label,
                }],
            ),
            (None, name) => {
                let name = name.ok_or(TopologyError::ClusterTopologyNameMissing { index })?;
                let (kind, spec) = match lookup {
                    Some(ClusterTopologyLookup::Found(spec)) => (TopologyKind::Legacy, spec),
                    Some(ClusterTopologyLookup::FoundBinding(spec)) => (TopologyKind::Binding, spec),
                    Some(ClusterTopologyLookup::NotFound) | None => {
                        return Err(not_found(name, index, &[TopologyKind::Legacy]));
                    }
                    Some(ClusterTopologyLookup::BindingNotFound { legacy_served }) => {
                        let kinds: &[TopologyKind] = if *legacy_served {
                            &[TopologyKind::Binding, TopologyKind::Legacy]
                        } else {
                            &[TopologyKind::Binding]
                        };
                        return Err(not_found(name, index, kinds));
                    }
                    Some(ClusterTopologyLookup::Unreadable(error)) => {
                        return Err(unreadable(TopologyKind::Legacy, name, error));
                    }
                    Some(ClusterTopologyLookup::BindingUnreadable(error)) => {
                        return Err(unreadable(TopologyKind::Binding, name, error));
                    }
                    Some(ClusterTopologyLookup::GroveNotInstalled) => {
                        return Err(TopologyError::GroveNotInstalled {
                            name,
                            index,
                            crd: CLUSTER_TOPOLOGY_CRD,
                            binding_crd: CLUSTER_TOPOLOGY_BINDING_CRD,
                        });
                    }
                };
                if !spec.levels.iter().any(|l| l.domain == level) {
                    return Err(TopologyError::UnknownLevel {
                        index,
                        level,
                        kind: kind.name(),
                        allowed: spec
                            .levels
                            .iter()
                            .map(|l| l.domain.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        name,
                    });
                }
                let mut labels = Vec::with_capacity(spec.levels.len());
                for l in &spec.levels {
                    let pod_label = format!("{POD_LABEL_PREFIX}{}", l.domain);
                    if !is_label_key(&pod_label) || !is_domain_name(&l.domain) {
                        return Err(TopologyError::DomainTooLong {
                            kind: kind.name(),
                            name,
                            domain: l.domain.clone(),
                        });
                    }
                    labels.push(TopologyLabel {
                        domain: l.domain.clone(),
                        pod_label,
                        node_label: l.label_key.clone(),
                    });
                }
                let source = match kind {
                    TopologyKind::Binding => LabelSource::ClusterTopologyBinding(name),
                    TopologyKind::Legacy => LabelSource::ClusterTopology(name),
                };
                (source, labels)
            }
        };
        Ok(ResolvedTopology {
            frontend,
            level,
            mismatch_policy,
            kv_transfer_weight,
            source,
            labels,
            contract: EnvContract::default(),
        })
    }
}

fn not_found(name: String, index: usize, kinds: &[TopologyKind]) -> TopologyError {
    let plural = |kind: &TopologyKind| match kind {
        TopologyKind::Binding => "clustertopologybindings",
        TopologyKind::Legacy => "clustertopologies",
    };
    TopologyError::ClusterTopologyNotFound {
        name,
        index,
        kinds: kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(" or "),
        plurals: kinds.iter().map(plural).collect::<Vec<_>>().join(","),
    }
}

fn unreadable(kind: TopologyKind, name: String, error: &str) -> TopologyError {
    TopologyError::ClusterTopologyUnreadable {
        kind: kind.name(),
        name,
        error: error.to_string(),
        key_field: kind.key_field(),
    }
}

/// [`configured`] then [`TopologyRequest::resolve`] with `lookup`, which is called only when a
/// ClusterTopology is needed.
pub fn resolve(
    spec: &DynamoGraphDeploymentSpec,
    lookup: impl FnOnce(&str) -> ClusterTopologyLookup,
) -> Result<Option<ResolvedTopology>, TopologyError> {
    let Some(request) = configured(spec)? else {
        return Ok(None);
    };
    let found = request.cluster_topology.as_deref().map(lookup);
    request.resolve(found.as_ref()).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner_api::{DynamoGraphDeployment, TopologyLevel};

    fn sample() -> DynamoGraphDeploymentSpec {
        let text = include_str!("../../../config/samples/dgd-disagg.yaml");
        let dgd: DynamoGraphDeployment = serde_yaml::from_str(text).unwrap();
        dgd.spec
    }

    fn gpu_cluster() -> ClusterTopologyLookup {
        ClusterTopologyLookup::Found(ClusterTopologySpec {
            levels: [
                ("zone", "topology.kubernetes.io/zone"),
                ("rack", "nvidia.com/rack"),
                ("host", "kubernetes.io/hostname"),
            ]
            .into_iter()
            .map(|(domain, key)| TopologyLevel {
                domain: domain.into(),
                label_key: key.into(),
            })
            .collect(),
        })
    }

    fn settings(spec: &mut DynamoGraphDeploymentSpec) -> &mut KvCacheTransferTopology {
        spec.components[0].kv_cache_transfer_topology.as_mut().unwrap()
    }

    #[test]
    fn resolves_every_cluster_topology_level() {
        let resolved = resolve(&sample(), |name| {
            assert_eq!(name, "gpu-cluster");
            gpu_cluster()
        })
        .unwrap()
        .unwrap();
        assert_eq!(resolved.frontend, "frontend");
        assert_eq!(resolved.level, "zone");
        assert_eq!(resolved.mismatch_policy, MismatchPolicy::Fail);
        assert_eq!(
            resolved.source,
            LabelSource::ClusterTopology("gpu-cluster".into())
        );
        let labels: Vec<(&str, &str, &str)> = resolved
            .labels
            .iter()
            .map(|l| (l.domain.as_str(), l.pod_label.as_str(), l.node_label.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("zone", "grove.io/topology.zone", "topology.kubernetes.io/zone"),
                ("rack", "grove.io/topology.rack", "nvidia.com/rack"),
                ("host", "grove.io/topology.host", "kubernetes.io/hostname"),
            ]
        );
        assert_eq!(resolved.level_label().unwrap().domain, "zone");
        assert_eq!(
            resolved.describe(),
            "level zone of ClusterTopology gpu-cluster (levels zone, rack, host)"
        );
    }

    #[test]
    fn without_the_field_nothing_is_looked_up() {
        let mut spec = sample();
        spec.components[0].kv_cache_transfer_topology = None;
        assert_eq!(resolve(&spec, |_| unreachable!("no lookup")), Ok(None));
    }

    #[test]
    fn label_needs_no_cluster_topology() {
        let mut spec = sample();
        spec.topology_constraint = None;
        settings(&mut spec).label = Some("topology.kubernetes.io/zone".into());
        settings(&mut spec).mismatch_policy = MismatchPolicy::Fallback;
        settings(&mut spec).kv_transfer_weight = Some(0.5);
        let resolved = resolve(&spec, |_| unreachable!("no lookup")).unwrap().unwrap();
        assert_eq!(resolved.source, LabelSource::Label);
        assert_eq!(
            resolved.labels,
            [TopologyLabel {
                domain: "zone".into(),
                pod_label: "topology.kubernetes.io/zone".into(),
                node_label: "topology.kubernetes.io/zone".into(),
            }]
        );
        assert_eq!(resolved.kv_transfer_weight, Some(0.5));
        assert_eq!(
            resolved.describe(),
            "level zone from node label topology.kubernetes.io/zone"
        );
    }

    #[test]
    fn topology_admission_table() {
        let spec = sample();
        let grove_absent = resolve(&spec, |_| ClusterTopologyLookup::GroveNotInstalled).unwrap_err();
        assert_eq!(grove_absent.reason(), "GroveNotInstalled");
        assert_eq!(
            grove_absent.to_string(),
            "spec.topologyConstraint.clusterTopologyName: ClusterTopology \"gpu-cluster\" cannot be read because Grove's ClusterTopology CRD (clustertopologies.grove.io) is not installed, nor its ClusterTopologyBinding CRD (clustertopologybindings.grove.io); install Grove, or set spec.components[0].kvCacheTransferTopology.label to a node label key such as topology.kubernetes.io/zone"
        );
        let absent = resolve(&spec, |_| ClusterTopologyLookup::NotFound).unwrap_err();
        assert_eq!(absent.reason(), "ClusterTopologyNotFound");
        assert!(absent.to_string().starts_with(
            "spec.topologyConstraint.clusterTopologyName: ClusterTopology \"gpu-cluster\" not found;"
        ));
        let mut spec = sample();
        settings(&mut spec).level = "block".into();
        let unknown = resolve(&spec, |_| gpu_cluster()).unwrap_err();
        assert_eq!(unknown.reason(), "LevelNotInClusterTopology");
        assert_eq!(
            unknown.field(),
            "spec.components[0].kvCacheTransferTopology.level"
        );
        assert_eq!(
            unknown.to_string(),
            "spec.components[0].kvCacheTransferTopology.level: \"block\" is not a level of ClusterTopology \"gpu-cluster\"; allowed: zone, rack, host"
        );
    }

    #[test]
    fn a_cluster_topology_binding_is_read_and_named() {
        let ClusterTopologyLookup::Found(levels) = gpu_cluster() else {
            unreachable!("gpu_cluster is found")
        };
        let resolved = resolve(&sample(), |_| ClusterTopologyLookup::FoundBinding(levels.clone()))
            .unwrap()
            .unwrap();
        assert_eq!(
            resolved.source,
            LabelSource::ClusterTopologyBinding("gpu-cluster".into())
        );
        assert_eq!(resolved.labels[0].node_label, "topology.kubernetes.io/zone");
        assert_eq!(
            resolved.describe(),
            "level zone of ClusterTopologyBinding gpu-cluster (levels zone, rack, host)"
        );
        let mut spec = sample();
        settings(&mut spec).level = "block".into();
        let unknown = resolve(&spec, |_| ClusterTopologyLookup::FoundBinding(levels.clone())).unwrap_err();
        assert_eq!(
            unknown.to_string(),
            "spec.components[0].kvCacheTransferTopology.level: \"block\" is not a level of ClusterTopologyBinding \"gpu-cluster\"; allowed: zone, rack, host"
        );
        let both = resolve(&sample(), |_| ClusterTopologyLookup::BindingNotFound {
            legacy_served: true,
        })
        .unwrap_err();
        assert_eq!(both.reason(), "ClusterTopologyNotFound");
        assert!(
            both.to_string().starts_with(
                "spec.topologyConstraint.clusterTopologyName: ClusterTopologyBinding or ClusterTopology \"gpu-cluster\" not found; create it, name an existing one (kubectl get clustertopologybindings,clustertopologies)"
            ),
            "{both}"
        );
        let binding_only = resolve(&sample(), |_| ClusterTopologyLookup::BindingNotFound {
            legacy_served: false,
        })
        .unwrap_err();
        assert!(
            binding_only
                .to_string()
                .contains("ClusterTopologyBinding \"gpu-cluster\" not found")
        );
        let unreadable = resolve(&sample(), |_| {
            ClusterTopologyLookup::BindingUnreadable("bad".into())
        })
        .unwrap_err()
        .to_string();
        assert!(
            unreadable.ends_with("ClusterTopologyBinding \"gpu-cluster\" has a spec this operator cannot read (bad); it needs spec.levels[] with domain and key"),
            "{unreadable}"
        );
    }

    #[test]
    fn field_checks_that_need_no_lookup() {
        let mut spec = sample();
        let moved = spec.components[0].kv_cache_transfer_topology.take();
        spec.components[2].kv_cache_transfer_topology = moved;
        let error = configured(&spec).unwrap_err();
        assert_eq!(
            error.to_string(),
            "spec.components[2].kvCacheTransferTopology: set on component \"decode\" of type decode; kvCacheTransferTopology is allowed only on a component with type: frontend"
        );

        let mut spec = sample();
        let mut second = spec.components[0].clone();
        second.name = "frontend-b".into();
        spec.components.push(second);
        assert_eq!(
            configured(&spec).unwrap_err().to_string(),
            "spec.components: 2 components set kvCacheTransferTopology (frontend, frontend-b); at most one frontend may set it"
        );

        let mut spec = sample();
        spec.topology_constraint = None;
        assert_eq!(
            configured(&spec).unwrap_err().reason(),
            "ClusterTopologyNameMissing"
        );

        let mut spec = sample();
        settings(&mut spec).kv_transfer_weight = Some(-1.0);
        assert_eq!(configured(&spec).unwrap_err().reason(), "InvalidWeight");
        settings(&mut spec).kv_transfer_weight = Some(f64::NAN);
        assert_eq!(configured(&spec).unwrap_err().reason(), "InvalidWeight");

        let mut spec = sample();
        settings(&mut spec).label = Some("not a key".into());
        assert_eq!(configured(&spec).unwrap_err().reason(), "InvalidLabel");

        let mut spec = sample();
        settings(&mut spec).level = "Zone".into();
        assert_eq!(configured(&spec).unwrap_err().reason(), "InvalidLevel");
    }

    #[test]
    fn long_domains_cannot_form_pod_labels() {
        let long = "d".repeat(55);
        let mut spec = sample();
        settings(&mut spec).level = long.clone();
        let lookup = ClusterTopologyLookup::Found(ClusterTopologySpec {
            levels: vec![TopologyLevel {
                domain: long,
                label_key: "example.com/x".into(),
            }],
        });
        assert_eq!(resolve(&spec, |_| lookup).unwrap_err().reason(), "DomainTooLong");
    }

    #[test]
    fn label_keys_and_domain_names() {
        for key in [
            "zone",
            "topology.kubernetes.io/zone",
            "nvidia.com/rack",
            "a/B_c.d-9",
            "grove.io/topology.zone",
        ] {
            assert!(is_label_key(key), "{key}");
        }
        for key in [
            "",
            "/zone",
            "a/",
            "-a",
            "a b",
            "UPPER.com/x",
            "a/b/c",
            &format!("x/{}", "n".repeat(64)),
        ] {
            assert!(!is_label_key(key), "{key}");
        }
        assert!(is_domain_name("zone"));
        assert!(is_domain_name("rack-1"));
        assert!(!is_domain_name("Zone"));
        assert!(!is_domain_name("zone-"));
        assert!(!is_domain_name(""));
    }
}

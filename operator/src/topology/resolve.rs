//! Validating `kvCacheTransferTopology` and resolving it against a ClusterTopology lookup.

use planner_api::{
    ClusterTopologySpec, ComponentType, DynamoGraphDeploymentSpec, KvCacheTransferTopology, MismatchPolicy,
};

use super::{CLUSTER_TOPOLOGY_CRD, POD_LABEL_PREFIX};

/// What looking up the DGD's ClusterTopology found. The caller does the lookup (an API GET,
/// and API discovery to tell a missing CRD from a missing object).
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterTopologyLookup {
    /// Grove's ClusterTopology CRD is not installed.
    GroveNotInstalled,
    /// The CRD is installed but no ClusterTopology has the name.
    NotFound,
    /// The ClusterTopology's spec.
    Found(ClusterTopologySpec),
    /// The object exists but its spec is not `{levels: [{domain, labelKey}]}` (the parse error).
    Unreadable(String),
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
    /// Grove's CRD is absent, so the ClusterTopology cannot be read.
    #[error(
        "spec.topologyConstraint.clusterTopologyName: ClusterTopology {name:?} cannot be read because Grove's ClusterTopology CRD ({crd}) is not installed; install Grove, or set spec.components[{index}].kvCacheTransferTopology.label to a node label key such as topology.kubernetes.io/zone"
    )]
    GroveNotInstalled {
        /// The ClusterTopology name.
        name: String,
        /// Position of the frontend in `spec.components`.
        index: usize,
        /// The CRD name.
        crd: &'static str,
    },
    /// The named ClusterTopology does not exist.
    #[error(
        "spec.topologyConstraint.clusterTopologyName: ClusterTopology {name:?} not found; create it, name an existing one (kubectl get clustertopologies), or set spec.components[{index}].kvCacheTransferTopology.label to a node label key"
    )]
    ClusterTopologyNotFound {
        /// The ClusterTopology name.
        name: String,
        /// Position of the frontend in `spec.components`.
        index: usize,
    },
    /// `level` is not one of the ClusterTopology's domains.
    #[error(
        "spec.components[{index}].kvCacheTransferTopology.level: {level:?} is not a level of ClusterTopology {name:?}; allowed: {allowed}"
    )]
    UnknownLevel {
        /// Position of the frontend in `spec.components`.
        index: usize,
        /// The value.
        level: String,
        /// The ClusterTopology name.
        name: String,
        /// Its domains, broadest first, comma-separated.
        allowed: String,
    },
    /// The ClusterTopology exists but cannot be read.
    #[error(
        "spec.topologyConstraint.clusterTopologyName: ClusterTopology {name:?} has a spec this operator cannot read ({error}); it needs spec.levels[] with domain and labelKey"
    )]
    ClusterTopologyUnreadable {
        /// The ClusterTopology name.
        name: String,
        /// The parse error.
        error: String,
    },
    /// A ClusterTopology domain is too long to form the pod label `grove.io/topology.<domain>`.
    #[error(
        "ClusterTopology {name:?} has level domain {domain:?}, which is too long for the pod label {POD_LABEL_PREFIX}<domain> (label names hold at most 63 characters, so domains at most 54); shorten the domain in the ClusterTopology"
    )]
    DomainTooLong {
        /// The ClusterTopology name.
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
                let spec = match lookup {
                    Some(ClusterTopologyLookup::Found(spec)) => spec,
                    Some(ClusterTopologyLookup::NotFound) | None => {
                        return Err(TopologyError::ClusterTopologyNotFound { name, index });
                    }
                    Some(ClusterTopologyLookup::Unreadable(error)) => {
                        return Err(TopologyError::ClusterTopologyUnreadable {
                            name,
                            error: error.clone(),
                        });
                    }
                    Some(ClusterTopologyLookup::GroveNotInstalled) => {
                        return Err(TopologyError::GroveNotInstalled {
                            name,
                            index,
                            crd: CLUSTER_TOPOLOGY_CRD,
                        });
                    }
                };
                if !spec.levels.iter().any(|l| l.domain == level) {
                    return Err(TopologyError::UnknownLevel {
                        index,
                        level,
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
                (LabelSource::ClusterTopology(name), labels)
            }
        };
        Ok(ResolvedTopology {
            frontend,
            level,
            mismatch_policy,
            kv_transfer_weight,
            source,
            labels,
        })
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
    fn seed_004_admission_table() {
        let spec = sample();
        let grove_absent = resolve(&spec, |_| ClusterTopologyLookup::GroveNotInstalled).unwrap_err();
        assert_eq!(grove_absent.reason(), "GroveNotInstalled");
        assert_eq!(
            grove_absent.to_string(),
            "spec.topologyConstraint.clusterTopologyName: ClusterTopology \"gpu-cluster\" cannot be read because Grove's ClusterTopology CRD (clustertopologies.grove.io) is not installed; install Grove, or set spec.components[0].kvCacheTransferTopology.label to a node label key such as topology.kubernetes.io/zone"
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

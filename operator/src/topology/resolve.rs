//! Validating a DGD's KV-transfer topology (NVIDIA's `spec.experimental.kvTransferPolicy`, or a
//! frontend's `kvCacheTransferTopology`) and resolving it against a ClusterTopologyBinding lookup.

use planner_api::{
    ClusterTopologySpec, ComponentType, DynamoGraphDeploymentSpec, Enforcement, KvCacheTransferTopology,
    KvTransferPolicy,
};

use super::{CLUSTER_TOPOLOGY_BINDING_CRD, CLUSTER_TOPOLOGY_CRD, EnvContract, POD_LABEL_PREFIX};

/// The field of a policy in NVIDIA's shape.
const POLICY_FIELD: &str = "spec.experimental.kvTransferPolicy";

/// What looking up the topology a DGD names found. Today's Grove (v0.1.0-alpha.9 and later)
/// serves `ClusterTopologyBinding`; earlier releases (alpha.4 to alpha.8) served `ClusterTopology`;
/// both keep `spec.levels[]` of `{domain, key}`. The caller looks up the binding first when its
/// CRD is served, then the ClusterTopology (an API GET each, and API discovery to tell a missing
/// CRD from a missing object); the variants say which kind answered, so that messages name it.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterTopologyLookup {
    /// Neither of Grove's CRDs (ClusterTopologyBinding, ClusterTopology) is installed.
    GroveNotInstalled,
    /// Only the ClusterTopology CRD is installed, and no ClusterTopology has the name.
    NotFound,
    /// The ClusterTopology's spec.
    Found(ClusterTopologySpec),
    /// The ClusterTopology exists but its spec is not `{levels: [{domain, key}]}` (the parse
    /// error).
    Unreadable(String),
    /// The ClusterTopologyBinding CRD is installed and no binding has the name; nor has a
    /// ClusterTopology when that CRD is installed too (`legacy_served`).
    BindingNotFound {
        /// Whether the ClusterTopology CRD is installed (and was looked up as well).
        legacy_served: bool,
    },
    /// The ClusterTopologyBinding's levels.
    FoundBinding(ClusterTopologySpec),
    /// The ClusterTopologyBinding exists but its spec is not `{levels: [{domain, key}]}`.
    BindingUnreadable(String),
}

/// The kind of Grove object that holds a DGD's topology levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyKind {
    /// `ClusterTopologyBinding` (Grove v0.1.0-alpha.9 and later).
    Binding,
    /// `ClusterTopology` (Grove v0.1.0-alpha.4 to alpha.8).
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
}

/// Where a DGD declares its KV-transfer topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Declared {
    /// NVIDIA's graph-level `spec.experimental.kvTransferPolicy`: every frontend routes by it.
    Policy,
    /// This operator's `kvCacheTransferTopology` on one frontend.
    Frontend {
        /// Position in `spec.components`.
        index: usize,
        /// The frontend's name.
        name: String,
    },
}

impl Declared {
    fn base(&self) -> String {
        match self {
            Self::Policy => POLICY_FIELD.into(),
            Self::Frontend { index, .. } => format!("spec.components[{index}].kvCacheTransferTopology"),
        }
    }

    /// The field naming the domain (`domain`, or the frontend's `level`).
    pub fn domain_field(&self) -> String {
        match self {
            Self::Policy => format!("{POLICY_FIELD}.domain"),
            Self::Frontend { .. } => format!("{}.level", self.base()),
        }
    }

    /// The field naming the node label (`labelKey`, or the frontend's `label`).
    pub fn label_field(&self) -> String {
        match self {
            Self::Policy => format!("{POLICY_FIELD}.labelKey"),
            Self::Frontend { .. } => format!("{}.label", self.base()),
        }
    }

    /// The field of the weight (`preferredWeight`, or the frontend's `kvTransferWeight`).
    pub fn weight_field(&self) -> String {
        match self {
            Self::Policy => format!("{POLICY_FIELD}.preferredWeight"),
            Self::Frontend { .. } => format!("{}.kvTransferWeight", self.base()),
        }
    }

    /// The field naming the ClusterTopologyBinding.
    pub fn name_field(&self) -> String {
        match self {
            Self::Policy => format!("{POLICY_FIELD}.clusterTopologyName"),
            Self::Frontend { .. } => "spec.topologyConstraint.clusterTopologyName".into(),
        }
    }
}

/// Why a DGD's KV-transfer topology is not usable. Each message names the field, the value and
/// what is allowed; [`TopologyError::reason`] is the CamelCase reason for conditions.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TopologyError {
    /// `kvCacheTransferTopology` is set on a component that is not a frontend.
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
    /// More than one component sets `kvCacheTransferTopology`.
    #[error(
        "spec.components: {count} components set kvCacheTransferTopology ({names}); at most one frontend may set it"
    )]
    MultipleFrontends {
        /// How many.
        count: usize,
        /// Their names, comma-separated.
        names: String,
    },
    /// Both NVIDIA's policy and a frontend's field are set.
    #[error(
        "{POLICY_FIELD}: set together with spec.components[{index}].kvCacheTransferTopology; allowed: one of the two (kvTransferPolicy is NVIDIA's shape, understood by both operators)"
    )]
    BothDeclared {
        /// Position of the frontend in `spec.components`.
        index: usize,
    },
    /// The domain is not a topology domain name.
    #[error(
        "{field}: {level:?} is not a topology domain name; allowed: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit (e.g. zone, rack)"
    )]
    InvalidLevel {
        /// The field.
        field: String,
        /// The value.
        level: String,
    },
    /// The node label is not a Kubernetes label key.
    #[error(
        "{field}: {label:?} is not a label key; allowed: an optional DNS subdomain prefix and '/', then a name of at most 63 letters, digits, '-', '_' or '.' (e.g. topology.kubernetes.io/zone)"
    )]
    InvalidLabel {
        /// The field.
        field: String,
        /// The value.
        label: String,
    },
    /// The weight is out of range, or set (or missing) where the enforcement does not allow it.
    #[error("{field}: {problem}")]
    InvalidWeight {
        /// The field.
        field: String,
        /// What is wrong and what is allowed.
        problem: String,
    },
    /// NVIDIA's policy names both or neither of `labelKey` and `clusterTopologyName`.
    #[error("{POLICY_FIELD}: {problem}; allowed: exactly one of labelKey or clusterTopologyName")]
    InvalidSource {
        /// What is wrong.
        problem: &'static str,
    },
    /// A frontend's field has no label, and the graph names no ClusterTopologyBinding.
    #[error(
        "spec.topologyConstraint.clusterTopologyName: not set, but spec.components[{index}].kvCacheTransferTopology has no label; set clusterTopologyName to the Grove ClusterTopologyBinding whose levels to use, or set kvCacheTransferTopology.label to a node label key such as topology.kubernetes.io/zone"
    )]
    ClusterTopologyNameMissing {
        /// Position of the frontend in `spec.components`.
        index: usize,
    },
    /// Grove's CRDs are absent, so the topology cannot be read.
    #[error(
        "{name_field}: ClusterTopologyBinding {name:?} cannot be read because Grove's ClusterTopologyBinding CRD ({binding_crd}) is not installed, nor its predecessor's ClusterTopology CRD ({crd}); install Grove, or set {label_field} to a node label key such as topology.kubernetes.io/zone"
    )]
    GroveNotInstalled {
        /// The name.
        name: String,
        /// The field naming it.
        name_field: String,
        /// The field that would make the lookup unnecessary.
        label_field: String,
        /// The ClusterTopology CRD name.
        crd: &'static str,
        /// The ClusterTopologyBinding CRD name.
        binding_crd: &'static str,
    },
    /// No object of the kinds looked up has the name.
    #[error(
        "{name_field}: {kinds} {name:?} not found; create it, name an existing one (kubectl get {plurals}), or set {label_field} to a node label key"
    )]
    ClusterTopologyNotFound {
        /// The name.
        name: String,
        /// The field naming it.
        name_field: String,
        /// The field that would make the lookup unnecessary.
        label_field: String,
        /// The kinds looked up, e.g. `ClusterTopologyBinding or ClusterTopology`.
        kinds: String,
        /// Their resources, for the kubectl hint, e.g. `clustertopologybindings,clustertopologies`.
        plurals: String,
    },
    /// The domain is not one of the topology's levels.
    #[error("{field}: {level:?} is not a level of {kind} {name:?}; allowed: {allowed}")]
    UnknownLevel {
        /// The field naming the domain.
        field: String,
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
        "{name_field}: {kind} {name:?} has a spec this operator cannot read ({error}); it needs spec.levels[] with domain and key"
    )]
    ClusterTopologyUnreadable {
        /// The field naming it.
        name_field: String,
        /// The kind.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// The parse error.
        error: String,
    },
    /// A topology domain is too long to form the pod label `<prefix><domain>`.
    #[error(
        "{kind} {name:?} has level domain {domain:?}, which is too long for the pod label {POD_LABEL_PREFIX}<domain> (label names hold at most 63 characters, so domains at most {max}); shorten the domain in the {kind}",
        max = max_domain_len()
    )]
    DomainTooLong {
        /// The field naming the object.
        name_field: String,
        /// The kind that holds the levels.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// The domain.
        domain: String,
    },
}

/// The longest domain that fits the pod label `<POD_LABEL_PREFIX><domain>`.
fn max_domain_len() -> usize {
    let name_prefix = POD_LABEL_PREFIX
        .split_once('/')
        .map_or(POD_LABEL_PREFIX, |(_, name)| name);
    63 - name_prefix.len()
}

impl TopologyError {
    /// CamelCase reason for the `TopologyResolved` condition.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotOnFrontend { .. } => "NotOnFrontend",
            Self::MultipleFrontends { .. } => "MultipleFrontends",
            Self::BothDeclared { .. } => "BothDeclared",
            Self::InvalidLevel { .. } => "InvalidLevel",
            Self::InvalidLabel { .. } => "InvalidLabel",
            Self::InvalidWeight { .. } => "InvalidWeight",
            Self::InvalidSource { .. } => "InvalidSource",
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
            Self::BothDeclared { .. } | Self::InvalidSource { .. } => POLICY_FIELD.into(),
            Self::InvalidLevel { field, .. }
            | Self::InvalidLabel { field, .. }
            | Self::InvalidWeight { field, .. }
            | Self::UnknownLevel { field, .. } => field.clone(),
            Self::ClusterTopologyNameMissing { .. } => "spec.topologyConstraint.clusterTopologyName".into(),
            Self::DomainTooLong { name_field, .. }
            | Self::GroveNotInstalled { name_field, .. }
            | Self::ClusterTopologyNotFound { name_field, .. }
            | Self::ClusterTopologyUnreadable { name_field, .. } => name_field.clone(),
        }
    }
}

/// A DGD's KV-transfer topology that passed the checks needing no lookup.
#[derive(Debug, Clone, PartialEq)]
pub struct TopologyRequest {
    /// Where it is declared.
    pub declared: Declared,
    /// The domain transfers stay in.
    pub domain: String,
    /// How strictly.
    pub enforcement: Enforcement,
    /// The weight of the preference, when set.
    pub weight: Option<f64>,
    /// The node label that holds a worker's domain, when named (then nothing is looked up).
    pub label: Option<String>,
    /// The ClusterTopologyBinding (or ClusterTopology) to look up, when no label is named.
    pub cluster_topology: Option<String>,
}

/// Where the topology labels of worker pods come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelSource {
    /// Every level of this ClusterTopology, as `<POD_LABEL_PREFIX><domain>` pod labels.
    ClusterTopology(String),
    /// Every level of this ClusterTopologyBinding, likewise.
    ClusterTopologyBinding(String),
    /// The one node label named, copied under the same key.
    Label,
}

/// One topology label of worker pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyLabel {
    /// Domain name; also the file name under the contract's mount path.
    pub domain: String,
    /// Pod label holding the pod's domain at this level.
    pub pod_label: String,
    /// Node label it is copied from.
    pub node_label: String,
}

/// A usable KV-transfer topology: what to inject and which labels to copy.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedTopology {
    /// The frontend that declared it (`kvCacheTransferTopology`); `None` for NVIDIA's
    /// graph-level policy, which every frontend follows.
    pub frontend: Option<String>,
    /// Domain KV-cache transfers stay in.
    pub level: String,
    /// How strictly.
    pub enforcement: Enforcement,
    /// Weight of the same-domain preference, when set.
    pub weight: Option<f64>,
    /// Where the labels come from.
    pub source: LabelSource,
    /// The labels, broadest level first; one of them has `domain == level`.
    pub labels: Vec<TopologyLabel>,
    /// Which runtime's environment names and mount path workers get (set by the reconciler
    /// from the operator's flag and the DGD's annotation; [`EnvContract::Dynamo`] by default).
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

    /// Whether `component` (a frontend) routes by this topology.
    pub fn routes(&self, component: &str) -> bool {
        self.frontend.as_deref().is_none_or(|f| f == component)
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

/// The name of the ClusterTopologyBinding a DGD's topology looks up, if any: the policy's
/// `clusterTopologyName`, else `spec.topologyConstraint.clusterTopologyName` when a frontend sets
/// `kvCacheTransferTopology` (for watches: which DGDs to re-check when a binding changes).
pub fn cluster_topology_name(spec: &DynamoGraphDeploymentSpec) -> Option<&str> {
    match spec
        .experimental
        .as_ref()
        .and_then(|e| e.kv_transfer_policy.as_ref())
    {
        Some(policy) => policy.cluster_topology_name.as_deref(),
        None => spec
            .topology_constraint
            .as_ref()
            .and_then(|t| t.cluster_topology_name.as_deref()),
    }
}

/// Checks a DGD's KV-transfer topology as far as possible without a lookup. `Ok(None)`: the DGD
/// declares none, and renders exactly as without this feature.
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
    let policy = spec
        .experimental
        .as_ref()
        .and_then(|e| e.kv_transfer_policy.as_ref());
    let frontend = carriers
        .first()
        .and_then(|(index, c)| c.kv_cache_transfer_topology.as_ref().map(|s| (*index, c, s)));
    match (frontend, policy) {
        (Some((index, _, _)), Some(_)) => Err(TopologyError::BothDeclared { index }),
        (None, None) => Ok(None),
        (Some((index, component, settings)), None) => {
            frontend_request(spec, index, &component.name, settings).map(Some)
        }
        (None, Some(policy)) => policy_request(policy).map(Some),
    }
}

fn frontend_request(
    spec: &DynamoGraphDeploymentSpec,
    index: usize,
    name: &str,
    settings: &KvCacheTransferTopology,
) -> Result<TopologyRequest, TopologyError> {
    let declared = Declared::Frontend {
        index,
        name: name.to_string(),
    };
    if !is_domain_name(&settings.level) {
        return Err(TopologyError::InvalidLevel {
            field: declared.domain_field(),
            level: settings.level.clone(),
        });
    }
    if let Some(label) = &settings.label
        && !is_label_key(label)
    {
        return Err(TopologyError::InvalidLabel {
            field: declared.label_field(),
            label: label.clone(),
        });
    }
    if let Some(weight) = settings.kv_transfer_weight
        && !(weight.is_finite() && weight >= 0.0)
    {
        return Err(TopologyError::InvalidWeight {
            field: declared.weight_field(),
            problem: format!("{weight} is not allowed; allowed: a finite number >= 0"),
        });
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
    Ok(TopologyRequest {
        declared,
        domain: settings.level.clone(),
        enforcement: settings.mismatch_policy.into(),
        weight: settings.kv_transfer_weight,
        label: settings.label.clone(),
        cluster_topology,
    })
}

/// NVIDIA's policy, with the rules of its schema (repeated here for objects its CEL rules did not
/// check, e.g. this operator's CRD before it had them).
fn policy_request(policy: &KvTransferPolicy) -> Result<TopologyRequest, TopologyError> {
    let declared = Declared::Policy;
    if !is_domain_name(&policy.domain) {
        return Err(TopologyError::InvalidLevel {
            field: declared.domain_field(),
            level: policy.domain.clone(),
        });
    }
    let name = policy.cluster_topology_name.clone().filter(|n| !n.is_empty());
    match (&policy.label_key, &name) {
        (Some(_), Some(_)) => {
            return Err(TopologyError::InvalidSource {
                problem: "both labelKey and clusterTopologyName are set",
            });
        }
        (None, None) => {
            return Err(TopologyError::InvalidSource {
                problem: "neither labelKey nor clusterTopologyName is set",
            });
        }
        _ => {}
    }
    if let Some(label) = &policy.label_key
        && !is_label_key(label)
    {
        return Err(TopologyError::InvalidLabel {
            field: declared.label_field(),
            label: label.clone(),
        });
    }
    let weight_error = |problem: String| TopologyError::InvalidWeight {
        field: declared.weight_field(),
        problem,
    };
    match (policy.enforcement, policy.preferred_weight) {
        (Enforcement::Preferred, None) => {
            return Err(weight_error(
                "required when enforcement is preferred; allowed: a number from 0 to 1".into(),
            ));
        }
        (Enforcement::Required, Some(_)) => {
            return Err(weight_error(
                "may only be set when enforcement is preferred".into(),
            ));
        }
        (_, Some(weight)) if !(0.0..=1.0).contains(&weight) => {
            return Err(weight_error(format!(
                "{weight} is not allowed; allowed: a number from 0 to 1"
            )));
        }
        _ => {}
    }
    Ok(TopologyRequest {
        declared,
        domain: policy.domain.clone(),
        enforcement: policy.enforcement,
        weight: policy.preferred_weight,
        label: policy.label_key.clone(),
        cluster_topology: name,
    })
}

impl TopologyRequest {
    /// Resolves the request. `lookup` is the result of looking up
    /// [`TopologyRequest::cluster_topology`]; it is ignored (and may be `None`) when a label is
    /// named.
    pub fn resolve(self, lookup: Option<&ClusterTopologyLookup>) -> Result<ResolvedTopology, TopologyError> {
        let Self {
            declared,
            domain: level,
            enforcement,
            weight,
            label,
            cluster_topology,
        } = self;
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
                let name = match (name, &declared) {
                    (Some(name), _) => name,
                    (None, Declared::Frontend { index, .. }) => {
                        return Err(TopologyError::ClusterTopologyNameMissing { index: *index });
                    }
                    (None, Declared::Policy) => {
                        return Err(TopologyError::InvalidSource {
                            problem: "neither labelKey nor clusterTopologyName is set",
                        });
                    }
                };
                let (kind, spec) = match lookup {
                    Some(ClusterTopologyLookup::Found(spec)) => (TopologyKind::Legacy, spec),
                    Some(ClusterTopologyLookup::FoundBinding(spec)) => (TopologyKind::Binding, spec),
                    Some(ClusterTopologyLookup::NotFound) | None => {
                        return Err(not_found(name, &declared, &[TopologyKind::Legacy]));
                    }
                    Some(ClusterTopologyLookup::BindingNotFound { legacy_served }) => {
                        let kinds: &[TopologyKind] = if *legacy_served {
                            &[TopologyKind::Binding, TopologyKind::Legacy]
                        } else {
                            &[TopologyKind::Binding]
                        };
                        return Err(not_found(name, &declared, kinds));
                    }
                    Some(ClusterTopologyLookup::Unreadable(error)) => {
                        return Err(unreadable(TopologyKind::Legacy, name, &declared, error));
                    }
                    Some(ClusterTopologyLookup::BindingUnreadable(error)) => {
                        return Err(unreadable(TopologyKind::Binding, name, &declared, error));
                    }
                    Some(ClusterTopologyLookup::GroveNotInstalled) => {
                        return Err(TopologyError::GroveNotInstalled {
                            name,
                            name_field: declared.name_field(),
                            label_field: declared.label_field(),
                            crd: CLUSTER_TOPOLOGY_CRD,
                            binding_crd: CLUSTER_TOPOLOGY_BINDING_CRD,
                        });
                    }
                };
                if !spec.levels.iter().any(|l| l.domain == level) {
                    return Err(TopologyError::UnknownLevel {
                        field: declared.domain_field(),
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
                            name_field: declared.name_field(),
                            kind: kind.name(),
                            name,
                            domain: l.domain.clone(),
                        });
                    }
                    labels.push(TopologyLabel {
                        domain: l.domain.clone(),
                        pod_label,
                        node_label: l.key.clone(),
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
            frontend: match declared {
                Declared::Frontend { name, .. } => Some(name),
                Declared::Policy => None,
            },
            level,
            enforcement,
            weight,
            source,
            labels,
            contract: EnvContract::default(),
        })
    }
}

fn not_found(name: String, declared: &Declared, kinds: &[TopologyKind]) -> TopologyError {
    let plural = |kind: &TopologyKind| match kind {
        TopologyKind::Binding => "clustertopologybindings",
        TopologyKind::Legacy => "clustertopologies",
    };
    TopologyError::ClusterTopologyNotFound {
        name,
        name_field: declared.name_field(),
        label_field: declared.label_field(),
        kinds: kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(" or "),
        plurals: kinds.iter().map(plural).collect::<Vec<_>>().join(","),
    }
}

fn unreadable(kind: TopologyKind, name: String, declared: &Declared, error: &str) -> TopologyError {
    TopologyError::ClusterTopologyUnreadable {
        name_field: declared.name_field(),
        kind: kind.name(),
        name,
        error: error.to_string(),
    }
}

/// [`configured`] then [`TopologyRequest::resolve`] with `lookup`, which is called only when a
/// ClusterTopologyBinding is needed.
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
    use planner_api::{DynamoGraphDeployment, Experimental, MismatchPolicy, TopologyLevel};

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
                key: key.into(),
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
        assert_eq!(resolved.frontend.as_deref(), Some("frontend"));
        assert_eq!(resolved.level, "zone");
        assert_eq!(resolved.enforcement, Enforcement::Required);
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
                (
                    "zone",
                    "nvidia.com/dynamo-topology.zone",
                    "topology.kubernetes.io/zone"
                ),
                ("rack", "nvidia.com/dynamo-topology.rack", "nvidia.com/rack"),
                (
                    "host",
                    "nvidia.com/dynamo-topology.host",
                    "kubernetes.io/hostname"
                ),
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
        assert_eq!(resolved.weight, Some(0.5));
        assert_eq!(resolved.enforcement, Enforcement::Preferred);
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
            "spec.topologyConstraint.clusterTopologyName: ClusterTopologyBinding \"gpu-cluster\" cannot be read because Grove's ClusterTopologyBinding CRD (clustertopologybindings.grove.io) is not installed, nor its predecessor's ClusterTopology CRD (clustertopologies.grove.io); install Grove, or set spec.components[0].kvCacheTransferTopology.label to a node label key such as topology.kubernetes.io/zone"
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
        // `nvidia.com/dynamo-topology.` leaves 47 characters of the label name for the domain.
        let fits = "d".repeat(47);
        let mut spec = sample();
        settings(&mut spec).level = fits.clone();
        let lookup = ClusterTopologyLookup::Found(ClusterTopologySpec {
            levels: vec![TopologyLevel {
                domain: fits,
                key: "example.com/x".into(),
            }],
        });
        assert!(resolve(&spec, |_| lookup).is_ok());
        let long = "d".repeat(48);
        let mut spec = sample();
        settings(&mut spec).level = long.clone();
        let lookup = ClusterTopologyLookup::Found(ClusterTopologySpec {
            levels: vec![TopologyLevel {
                domain: long,
                key: "example.com/x".into(),
            }],
        });
        let error = resolve(&spec, |_| lookup).unwrap_err();
        assert_eq!(error.reason(), "DomainTooLong");
        assert!(error.to_string().contains("domains at most 47"), "{error}");
    }

    /// NVIDIA's graph-level policy: a label key needs no lookup; a ClusterTopologyBinding's
    /// levels are checked by the same rules as the frontend field, with messages naming the
    /// policy's fields; every frontend routes by it.
    #[test]
    fn nvidia_kv_transfer_policy_resolves_by_the_same_rules() {
        let text = include_str!("../../../config/samples/dgd-kv-transfer-policy.yaml");
        let dgd: DynamoGraphDeployment = serde_yaml::from_str(text).unwrap();
        let resolved = resolve(&dgd.spec, |_| unreachable!("a label key needs no lookup"))
            .unwrap()
            .unwrap();
        assert_eq!(resolved.frontend, None);
        assert!(resolved.routes("Frontend") && resolved.routes("any-frontend"));
        assert_eq!(resolved.level, "zone");
        assert_eq!(resolved.enforcement, Enforcement::Required);
        assert_eq!(resolved.source, LabelSource::Label);
        assert_eq!(resolved.labels[0].node_label, "topology.kubernetes.io/zone");

        let with = |policy: KvTransferPolicy| {
            let mut spec = sample();
            spec.components[0].kv_cache_transfer_topology = None;
            spec.topology_constraint = None;
            spec.experimental = Some(Experimental {
                kv_transfer_policy: Some(policy),
                ..Experimental::default()
            });
            spec
        };
        let named = |domain: &str| KvTransferPolicy {
            label_key: None,
            cluster_topology_name: Some("gpu-cluster".into()),
            domain: domain.into(),
            enforcement: Enforcement::Preferred,
            preferred_weight: Some(0.5),
        };
        let resolved = resolve(&with(named("rack")), |name| {
            assert_eq!(name, "gpu-cluster");
            gpu_cluster()
        })
        .unwrap()
        .unwrap();
        assert_eq!(resolved.level, "rack");
        assert_eq!(resolved.weight, Some(0.5));
        assert_eq!(resolved.labels.len(), 3);
        let unknown = resolve(&with(named("block")), |_| gpu_cluster()).unwrap_err();
        assert_eq!(
            unknown.to_string(),
            "spec.experimental.kvTransferPolicy.domain: \"block\" is not a level of ClusterTopology \"gpu-cluster\"; allowed: zone, rack, host"
        );
        let absent = resolve(&with(named("zone")), |_| ClusterTopologyLookup::BindingNotFound {
            legacy_served: false,
        })
        .unwrap_err();
        assert!(
            absent.to_string().starts_with(
                "spec.experimental.kvTransferPolicy.clusterTopologyName: ClusterTopologyBinding \"gpu-cluster\" not found;"
            ),
            "{absent}"
        );
        assert!(
            absent
                .to_string()
                .ends_with("or set spec.experimental.kvTransferPolicy.labelKey to a node label key")
        );

        // The schema's rules, repeated for objects they did not check.
        let mut both = named("zone");
        both.label_key = Some("topology.kubernetes.io/zone".into());
        assert_eq!(configured(&with(both)).unwrap_err().reason(), "InvalidSource");
        let mut neither = named("zone");
        neither.cluster_topology_name = None;
        assert_eq!(configured(&with(neither)).unwrap_err().reason(), "InvalidSource");
        let mut no_weight = named("zone");
        no_weight.preferred_weight = None;
        assert_eq!(
            configured(&with(no_weight)).unwrap_err().to_string(),
            "spec.experimental.kvTransferPolicy.preferredWeight: required when enforcement is preferred; allowed: a number from 0 to 1"
        );
        let mut stray_weight = named("zone");
        stray_weight.enforcement = Enforcement::Required;
        assert_eq!(
            configured(&with(stray_weight)).unwrap_err().reason(),
            "InvalidWeight"
        );
        let mut heavy = named("zone");
        heavy.preferred_weight = Some(1.5);
        assert_eq!(configured(&with(heavy)).unwrap_err().reason(), "InvalidWeight");
        let mut bad_domain = named("zone");
        bad_domain.domain = "Zone".into();
        assert_eq!(
            configured(&with(bad_domain)).unwrap_err().field(),
            "spec.experimental.kvTransferPolicy.domain"
        );

        // Not together with a frontend's field.
        let mut spec = sample();
        spec.experimental = Some(Experimental {
            kv_transfer_policy: Some(named("zone")),
            ..Experimental::default()
        });
        assert_eq!(configured(&spec).unwrap_err().reason(), "BothDeclared");
        assert_eq!(cluster_topology_name(&spec), Some("gpu-cluster"));
    }

    #[test]
    fn label_keys_and_domain_names() {
        for key in [
            "zone",
            "topology.kubernetes.io/zone",
            "nvidia.com/rack",
            "a/B_c.d-9",
            "nvidia.com/dynamo-topology.zone",
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

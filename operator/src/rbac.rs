//! Every Kubernetes API call the operator makes, as RBAC permissions: one table, read off the
//! controllers, the webhook and the runtime, that the Helm chart's ClusterRole and Roles must
//! match exactly. The e2e tests render the chart with `helm template` and compare its rules with
//! [`PERMISSIONS`] in every mode (nothing more, nothing less), and run the operator with a token
//! of the chart's ServiceAccount to show that these permissions are enough.
//!
//! Not listed because every authenticated user has them (the `system:discovery` ClusterRole):
//! API discovery (`GET /apis/<group>/<version>`), which [`crate::lookup`] uses to tell
//! a missing Grove CRD from a missing ClusterTopology. The Prometheus queries and the virtual
//! connector's etcd calls are not Kubernetes API calls.
//!
//! When a change adds an API call, add it here and to `charts/planner-operator/templates/`
//! (`_rbac.tpl`, `leader-election-rbac.yaml`, `webhook-rbac.yaml`); the chart test fails until
//! both agree, and the RBAC e2e test fails when the call is missing from both.

/// Where a permission has to be granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// In every namespace the operator watches: a ClusterRole bound cluster-wide, or in
    /// namespace-scoped mode (`--namespace`) a Role in that namespace.
    Watched,
    /// Cluster-scoped resources: a ClusterRole in every mode.
    Cluster,
    /// The operator's own namespace (the Lease, the webhook certificate Secret): a Role there.
    OwnNamespace,
}

/// When the operator needs a permission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needed {
    /// Always.
    Always,
    /// With the DGD reconciler and the topology label controller (`--dgd-controller`, on by
    /// default); planner-only operation next to NVIDIA's Dynamo operator needs none of these.
    DgdController,
    /// With leader election (`--leader-election`, on by default).
    LeaderElection,
    /// When the webhook is served and keeps the caBundle of a ValidatingWebhookConfiguration
    /// current (`--webhook-config-name` not empty).
    CaBundle,
    /// When the webhook is served with generated certificates (no `--webhook-cert-dir`).
    GeneratedCertificates,
    /// When policies may name a bearer token Secret (`--prometheus-token-secrets`).
    TokenSecrets,
}

/// One RBAC rule the operator needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permission {
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// The flag that moves the group, if one does (the group above is its default).
    pub group_set_by: Option<&'static str>,
    /// Resource, with `/subresource` where it is one.
    pub resource: &'static str,
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// Only the object this flag names (RBAC `resourceNames`); `None`: any object.
    pub named_by: Option<&'static str>,
    /// Where it is granted.
    pub scope: Scope,
    /// When it is needed.
    pub needed: Needed,
    /// The code that makes these calls, and why.
    pub used_by: &'static str,
}

/// The operator's configuration, as far as it changes which permissions it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// `--dgd-controller`.
    pub dgd_controller: bool,
    /// `--leader-election`.
    pub leader_election: bool,
    /// The webhook is served (no `--webhook-disabled`).
    pub webhook: bool,
    /// `--webhook-config-name` is not empty.
    pub ca_bundle: bool,
    /// No `--webhook-cert-dir`.
    pub generated_certificates: bool,
    /// `--prometheus-token-secrets`.
    pub token_secrets: bool,
}

impl Default for Features {
    /// The defaults of `planner-operator run` (and of the chart).
    fn default() -> Self {
        Self {
            dgd_controller: true,
            leader_election: true,
            webhook: true,
            ca_bundle: true,
            generated_certificates: true,
            token_secrets: false,
        }
    }
}

impl Needed {
    /// Whether an operator with `features` needs it.
    pub fn applies(self, features: Features) -> bool {
        match self {
            Self::Always => true,
            Self::DgdController => features.dgd_controller,
            Self::LeaderElection => features.leader_election,
            Self::CaBundle => features.webhook && features.ca_bundle,
            Self::GeneratedCertificates => features.webhook && features.generated_certificates,
            Self::TokenSecrets => features.token_secrets,
        }
    }
}

/// Every permission; see the module documentation.
pub const PERMISSIONS: &[Permission] = &[
    Permission {
        group: "nvidia.com",
        group_set_by: None,
        resource: "dynamographdeployments",
        verbs: &["get"],
        named_by: None,
        scope: Scope::Watched,
        needed: Needed::Always,
        used_by: "the PlannerPolicy reconciler reads its target and the webhook checks a PlannerPolicy's \
                  targetRef, at nvidia.com/v1beta1 or v1alpha1 (lookup::target_graph); the topology label \
                  controller refers its events to the DGD",
    },
    Permission {
        group: "nvidia.com",
        group_set_by: None,
        resource: "dynamographdeployments",
        verbs: &["list", "watch"],
        named_by: None,
        scope: Scope::Watched,
        needed: Needed::DgdController,
        used_by: "the DGD controller (controller/dgd) and the startup wait for its CRD (runtime::controllers::wait_for_crds)",
    },
    Permission {
        group: "nvidia.com",
        group_set_by: None,
        resource: "dynamographdeployments",
        verbs: &["patch"],
        named_by: None,
        scope: Scope::Watched,
        needed: Needed::Always,
        used_by: "the kubernetes connector scales a DGD's prefill and decode replicas with a JSON patch \
                  (connector/kubernetes), at the version whose layout the DGD has",
    },
    Permission {
        group: "nvidia.com",
        group_set_by: None,
        resource: "dynamographdeploymentscalingadapters/scale",
        verbs: &["get", "patch"],
        named_by: None,
        scope: Scope::Watched,
        needed: Needed::Always,
        used_by: "the kubernetes connector reads the Scale of a pool's DynamoGraphDeploymentScalingAdapter \
                  (whether it exists, its spec and status replicas) and scales through it with a JSON patch \
                  (connector/kubernetes)",
    },
    Permission {
        group: "nvidia.com",
        group_set_by: None,
        resource: "dynamographdeployments/status",
        verbs: &["patch"],
        named_by: None,
        scope: Scope::Watched,
        needed: Needed::DgdController,
        used_by: "the DGD controller writes status (Ready, TopologyResolved, component counts) with server-side apply",
    },
    Permission {
        group: "planner.dynamo.io",
        group_set_by: None,
        resource: "plannerpolicies",
        verbs: &["list", "watch"],
        named_by: None,
        scope: Scope::Watched,
        needed: Needed::Always,
        used_by: "the PlannerPolicy controller (controller/planner_policy) and the startup check",
    },
    Permission {
        group: "planner.dynamo.io",
        group_set_by: None,
        resource: "plannerpolicies/status",
        verbs: &["patch"],
        named_by: None,
        scope: Scope::Watched,
        needed: Needed::Always,
        used_by: "the PlannerPolicy controller writes each interval's observation, prediction and decision \
                  with server-side apply",
    },
    Permission {
        group: "apps",
        group_set_by: None,
        resource: "deployments",
        verbs: &["list", "watch", "create", "patch", "delete"],
        named_by: None,
        scope: Scope::Watched,
        needed: Needed::DgdController,
        used_by: "the DGD controller: watches the Deployments it renders (labelled with the graph), applies \
                  them with server-side apply (a patch, which needs create as well when the object is new), \
                  lists and deletes those of removed components",
    },
    Permission {
        group: "",
        group_set_by: None,
        resource: "services",
        verbs: &["list", "watch", "create", "patch", "delete"],
        named_by: None,
        scope: Scope::Watched,
        needed: Needed::DgdController,
        used_by: "the DGD controller: watches, applies (server-side apply: patch, and create when new), lists and \
                  deletes frontend Services",
    },
    Permission {
        group: "",
        group_set_by: None,
        resource: "pods",
        verbs: &["list", "watch", "patch"],
        named_by: None,
        scope: Scope::Watched,
        needed: Needed::DgdController,
        used_by: "list+watch: the shared cache of DGD pods (TopologyResolved counts, topology label controller); \
                  patch: the topology label controller copies the node's topology labels onto worker pods",
    },
    Permission {
        group: "",
        group_set_by: None,
        resource: "configmaps",
        verbs: &["get"],
        named_by: None,
        scope: Scope::Watched,
        needed: Needed::Always,
        used_by: "the PlannerPolicy reconciler reads spec.profile.configMapRef and \
                  spec.predictor.warmupTrace.configMapRef",
    },
    Permission {
        group: "events.k8s.io",
        group_set_by: None,
        resource: "events",
        verbs: &["create", "patch"],
        named_by: None,
        scope: Scope::Watched,
        needed: Needed::Always,
        used_by: "Events on DGDs, PlannerPolicies and pods (Scaled, ScalingLimited, MetricsUnavailable, \
                  InvalidSpec, TopologyLabelMissing, GrantCut, GrantRestored), and, watching every namespace, \
                  on GpuBudgets (GrantCut, in namespace default); kube's Recorder patches a repeated \
                  Event's series",
    },
    Permission {
        group: "",
        group_set_by: None,
        resource: "nodes",
        verbs: &["get"],
        named_by: None,
        scope: Scope::Cluster,
        needed: Needed::DgdController,
        used_by: "the topology label controller reads the labels of a worker pod's node",
    },
    Permission {
        group: "planner.dynamo.io",
        group_set_by: None,
        resource: "gpubudgets",
        verbs: &["get", "list", "watch"],
        named_by: None,
        scope: Scope::Cluster,
        needed: Needed::Always,
        used_by: "list+watch: the GpuBudget controller (controller/gpu_budget) and the budgets' cache the \
                  PlannerPolicy reconciler reads a policy's spec.budgetRef from; get: the webhook checks a \
                  PlannerPolicy's spec.budgetRef",
    },
    Permission {
        group: "planner.dynamo.io",
        group_set_by: None,
        resource: "gpubudgets/status",
        verbs: &["patch"],
        named_by: None,
        scope: Scope::Cluster,
        needed: Needed::Always,
        used_by: "the GpuBudget controller writes what each member asked for, was granted and holds, with \
                  server-side apply",
    },
    Permission {
        group: "grove.io",
        group_set_by: Some("--cluster-topology-api-version"),
        resource: "clustertopologybindings",
        verbs: &["get", "list", "watch"],
        named_by: None,
        scope: Scope::Cluster,
        needed: Needed::DgdController,
        used_by: "get: the DGD controller and the webhook resolve spec.topologyConstraint.clusterTopologyName \
                  against today's Grove (lookup::cluster_topology); list+watch: the DGD controller re-checks \
                  DGDs when one changes",
    },
    Permission {
        group: "grove.io",
        group_set_by: Some("--cluster-topology-api-version"),
        resource: "clustertopologies",
        verbs: &["get", "list", "watch"],
        named_by: None,
        scope: Scope::Cluster,
        needed: Needed::DgdController,
        used_by: "get: the same, against Grove releases before ClusterTopologyBinding (lookup::cluster_topology); \
                  list+watch: the DGD controller re-checks DGDs when one changes",
    },
    Permission {
        group: "admissionregistration.k8s.io",
        group_set_by: None,
        resource: "validatingwebhookconfigurations",
        verbs: &["get", "list", "watch", "patch"],
        named_by: Some("--webhook-config-name"),
        scope: Scope::Cluster,
        needed: Needed::CaBundle,
        used_by: "webhook certificate maintenance (webhook/certs): watches its own configuration (by \
                  metadata.name) and patches the caBundle",
    },
    Permission {
        group: "",
        group_set_by: None,
        resource: "secrets",
        verbs: &["get"],
        named_by: None,
        scope: Scope::Watched,
        needed: Needed::TokenSecrets,
        used_by: "the PlannerPolicy reconciler reads the Prometheus bearer token a policy names \
                  (spec.metrics.prometheus.bearerTokenSecret) in the policy's namespace",
    },
    Permission {
        group: "",
        group_set_by: None,
        resource: "secrets",
        verbs: &["create"],
        named_by: None,
        scope: Scope::OwnNamespace,
        needed: Needed::GeneratedCertificates,
        used_by: "the first replica stores the generated webhook CA and serving certificate (webhook/certs; \
                  RBAC cannot limit create to a name)",
    },
    Permission {
        group: "",
        group_set_by: None,
        resource: "secrets",
        verbs: &["get", "update"],
        named_by: Some("--webhook-secret"),
        scope: Scope::OwnNamespace,
        needed: Needed::GeneratedCertificates,
        used_by: "every replica reads the generated certificates; renewal replaces them (webhook/certs)",
    },
    Permission {
        group: "coordination.k8s.io",
        group_set_by: None,
        resource: "leases",
        verbs: &["create"],
        named_by: None,
        scope: Scope::OwnNamespace,
        needed: Needed::LeaderElection,
        used_by: "leader election (kube-lease-manager, runtime.rs) creates the Lease when it does not exist",
    },
    Permission {
        group: "coordination.k8s.io",
        group_set_by: None,
        resource: "leases",
        verbs: &["get", "patch"],
        named_by: Some("--lease-name"),
        scope: Scope::OwnNamespace,
        needed: Needed::LeaderElection,
        used_by: "leader election reads, takes, renews and releases the Lease",
    },
];

/// The permissions an operator with `features` needs.
pub fn required(features: Features) -> impl Iterator<Item = &'static Permission> {
    PERMISSIONS.iter().filter(move |p| p.needed.applies(features))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::collections::BTreeSet;

    use super::*;

    const VERBS: [&str; 8] = [
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ];

    #[test]
    fn each_verb_of_a_resource_is_listed_once_per_scope() {
        let mut seen = BTreeSet::new();
        for permission in PERMISSIONS {
            assert!(!permission.verbs.is_empty(), "{permission:?} has no verbs");
            assert!(!permission.used_by.is_empty(), "{permission:?} says not why");
            for verb in permission.verbs {
                assert!(VERBS.contains(verb), "unknown verb {verb}");
                let key = (
                    permission.group,
                    permission.resource,
                    *verb,
                    permission.scope as u8,
                );
                assert!(seen.insert(key), "{key:?} is listed twice");
            }
        }
    }

    #[test]
    fn named_permissions_use_verbs_rbac_can_limit_by_name() {
        // `create` has no name in its request, so `resourceNames` cannot limit it; list and watch
        // are limited through a `metadata.name` field selector, which the operator sends.
        for permission in PERMISSIONS.iter().filter(|p| p.named_by.is_some()) {
            assert!(!permission.verbs.contains(&"create"), "{permission:?}");
        }
    }

    #[test]
    fn without_leader_election_and_webhook_only_the_watched_and_cluster_rules_remain() {
        let features = Features {
            dgd_controller: true,
            leader_election: false,
            webhook: false,
            ca_bundle: true,
            generated_certificates: true,
            token_secrets: false,
        };
        assert!(required(features).all(|p| matches!(p.needed, Needed::Always | Needed::DgdController)));
        assert!(required(features).all(|p| p.scope != Scope::OwnNamespace));
        let everything = Features {
            token_secrets: true,
            ..Features::default()
        };
        assert_eq!(required(everything).count(), PERMISSIONS.len());
    }

    #[test]
    fn planner_only_needs_no_workload_pod_node_topology_or_status_rules() {
        let planner_only = Features {
            dgd_controller: false,
            ..Features::default()
        };
        let mut watched: Vec<(&str, &str)> = Vec::new();
        for permission in required(planner_only) {
            for verb in permission.verbs {
                watched.push((permission.resource, verb));
            }
        }
        for resource in [
            "deployments",
            "services",
            "pods",
            "nodes",
            "clustertopologies",
            "clustertopologybindings",
            "dynamographdeployments/status",
        ] {
            assert!(
                watched.iter().all(|(r, _)| *r != resource),
                "planner-only needs {resource}"
            );
        }
        assert!(!watched.contains(&("dynamographdeployments", "list")));
        assert!(!watched.contains(&("dynamographdeployments", "watch")));
        for needed in [
            ("dynamographdeployments", "get"),
            ("dynamographdeployments", "patch"),
            ("dynamographdeploymentscalingadapters/scale", "get"),
            ("dynamographdeploymentscalingadapters/scale", "patch"),
            ("plannerpolicies", "list"),
            ("plannerpolicies/status", "patch"),
            ("configmaps", "get"),
            ("events", "create"),
        ] {
            assert!(watched.contains(&needed), "planner-only lacks {needed:?}");
        }
    }
}

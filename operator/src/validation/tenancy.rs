//! What one team's PlannerPolicy may point at, as the cluster admin configures it.
//!
//! A policy reads metrics labelled with a Dynamo namespace and, with the virtual connector,
//! writes decision keys under one: left free-form, a policy in namespace A could read B's
//! traffic into its status or overwrite B's decisions. By default a policy may name only its
//! target graph's own Dynamo namespace (`<namespace>-<dgd>`, as Dynamo's operator computes it);
//! the admin can allow more, per Kubernetes namespace. Prometheus URLs and etcd endpoints are
//! outbound connections the operator makes on a tenant's behalf: the admin can limit them to a
//! list (or Prometheus to the operator's default).

use planner_api::{ConnectorKind, PlannerPolicySpec, labels::dynamo_namespace};

use super::error::PolicyError;
use crate::sources::prometheus::redact;

/// Which Prometheus URLs policies may name in `spec.metrics.prometheus.url`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PrometheusUrlPolicy {
    /// Any `http(s)://` URL.
    #[default]
    Any,
    /// Only the operator's `--prometheus-url` (policies leave the field unset or repeat it).
    DefaultOnly,
    /// The operator's `--prometheus-url` and the URLs of `--allowed-prometheus-url`.
    AllowList,
}

/// The admin's rules (flags of `planner-operator run`). The default allows every Prometheus URL
/// and etcd endpoint and only each graph's own Dynamo namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenancy {
    /// Dynamo namespaces beyond a graph's own: `*` (any, for single-tenant clusters),
    /// `<namespace>/<dynamo namespace>` (policies in that Kubernetes namespace may name it) or
    /// `*/<dynamo namespace>` (every policy may).
    pub dynamo_namespaces: Vec<String>,
    /// Which Prometheus URLs policies may name.
    pub prometheus: PrometheusUrlPolicy,
    /// The operator's default Prometheus URL.
    pub default_prometheus_url: String,
    /// More Prometheus URLs, with [`PrometheusUrlPolicy::AllowList`].
    pub prometheus_urls: Vec<String>,
    /// etcd endpoints the virtual connector may write to; empty: any.
    pub etcd_endpoints: Vec<String>,
    /// Policies may name a bearer token Secret for Prometheus (the operator reads Secrets in
    /// the namespaces it watches).
    pub token_secrets: bool,
}

impl Tenancy {
    /// Whether a policy in `namespace` may name the Dynamo namespace `value`.
    fn allows_dynamo_namespace(&self, namespace: &str, value: &str) -> bool {
        self.dynamo_namespaces
            .iter()
            .any(|entry| match entry.split_once('/') {
                Some((ns, name)) => (ns == "*" || ns == namespace) && name == value,
                None => entry == "*",
            })
    }

    fn allows_prometheus_url(&self, url: &str) -> bool {
        let same = |allowed: &str| trim_url(allowed) == trim_url(url);
        match self.prometheus {
            PrometheusUrlPolicy::Any => true,
            PrometheusUrlPolicy::DefaultOnly => same(&self.default_prometheus_url),
            PrometheusUrlPolicy::AllowList => {
                same(&self.default_prometheus_url) || self.prometheus_urls.iter().any(|u| same(u))
            }
        }
    }

    fn allowed_prometheus_urls(&self) -> String {
        let mut urls = vec![redact(&self.default_prometheus_url)];
        if self.prometheus == PrometheusUrlPolicy::AllowList {
            urls.extend(self.prometheus_urls.iter().map(|u| redact(u)));
        }
        format!(
            "leave it unset (the operator's default) or name one of {}",
            urls.join(", ")
        )
    }
}

/// A URL without its trailing slashes, so `http://p:9090/` and `http://p:9090` are one.
fn trim_url(url: &str) -> &str {
    url.trim_end_matches('/')
}

/// The violations of the admin's rules by a policy in `namespace`. Returns all of them.
pub fn check(spec: &PlannerPolicySpec, namespace: &str, tenancy: &Tenancy) -> Vec<PolicyError> {
    let mut errors = Vec::new();
    let dgd = &spec.target_ref.name;
    let own = dynamo_namespace(namespace, dgd);
    let virtual_connector = spec.connector.kind == ConnectorKind::Virtual;
    let fields = [
        (
            "spec.metrics.dynamoNamespace",
            spec.metrics.dynamo_namespace.as_deref(),
            true,
        ),
        (
            "spec.connector.dynamoNamespace",
            spec.connector.dynamo_namespace.as_deref(),
            virtual_connector,
        ),
    ];
    for (field, value, used) in fields {
        let Some(value) = value.filter(|_| used) else {
            continue;
        };
        if value != own && !tenancy.allows_dynamo_namespace(namespace, value) {
            errors.push(PolicyError::DynamoNamespaceNotAllowed {
                field,
                value: value.to_string(),
                dgd: dgd.clone(),
                own: own.clone(),
                namespace: namespace.to_string(),
            });
        }
    }
    if let Some(url) = &spec.metrics.prometheus.url
        && !tenancy.allows_prometheus_url(url)
    {
        errors.push(PolicyError::PrometheusUrlNotAllowed {
            value: redact(url),
            allowed: tenancy.allowed_prometheus_urls(),
        });
    }
    if spec.metrics.prometheus.bearer_token_secret.is_some() && !tenancy.token_secrets {
        errors.push(PolicyError::TokenSecretsOff);
    }
    if virtual_connector && !tenancy.etcd_endpoints.is_empty() {
        let endpoints = spec.connector.etcd.as_ref().map(|e| e.endpoints.as_slice());
        for (index, endpoint) in endpoints.unwrap_or_default().iter().enumerate() {
            let allowed = tenancy
                .etcd_endpoints
                .iter()
                .any(|a| trim_url(a) == trim_url(endpoint));
            if !allowed {
                errors.push(PolicyError::EtcdEndpointNotAllowed {
                    index,
                    value: redact(endpoint),
                    allowed: tenancy.etcd_endpoints.join(", "),
                });
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use planner_api::{EtcdSource, PlannerPolicySpec};

    use super::*;

    fn spec() -> PlannerPolicySpec {
        serde_json::from_value(serde_json::json!({"targetRef": {"name": "llama"}})).unwrap()
    }

    fn reasons(errors: &[PolicyError]) -> Vec<String> {
        errors.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_policy_names_only_its_own_graphs_dynamo_namespace_by_default() {
        let tenancy = Tenancy::default();
        let mut spec = spec();
        assert_eq!(check(&spec, "team-a", &tenancy), []);
        spec.metrics.dynamo_namespace = Some("team-a-llama".into());
        assert_eq!(check(&spec, "team-a", &tenancy), []);
        spec.metrics.dynamo_namespace = Some("team-b-llama".into());
        assert_eq!(
            reasons(&check(&spec, "team-a", &tenancy)),
            [
                "spec.metrics.dynamoNamespace: \"team-b-llama\" is not the Dynamo namespace of DynamoGraphDeployment \"llama\"; allowed: \"team-a-llama\" (its own, the default), or a Dynamo namespace the cluster admin allows for namespace \"team-a\" (operator flag --allowed-dynamo-namespaces, chart value tenancy.allowedDynamoNamespaces)"
            ]
        );
        // The connector's field counts only with the virtual connector, which writes there.
        spec.metrics.dynamo_namespace = None;
        spec.connector.dynamo_namespace = Some("team-b-llama".into());
        assert_eq!(check(&spec, "team-a", &tenancy), []);
        spec.connector.kind = ConnectorKind::Virtual;
        assert_eq!(check(&spec, "team-a", &tenancy)[0].reason(), "NotPermitted");
        assert!(
            reasons(&check(&spec, "team-a", &tenancy))[0].starts_with("spec.connector.dynamoNamespace: ")
        );
    }

    #[test]
    fn the_admin_allows_dynamo_namespaces_per_namespace_or_everywhere() {
        let mut spec = spec();
        spec.metrics.dynamo_namespace = Some("dynamo".into());
        let per_namespace = Tenancy {
            dynamo_namespaces: vec!["serving/dynamo".into()],
            ..Tenancy::default()
        };
        assert_eq!(check(&spec, "serving", &per_namespace), []);
        assert_eq!(check(&spec, "team-a", &per_namespace).len(), 1);
        let every_namespace = Tenancy {
            dynamo_namespaces: vec!["*/dynamo".into()],
            ..Tenancy::default()
        };
        assert_eq!(check(&spec, "team-a", &every_namespace), []);
        spec.metrics.dynamo_namespace = Some("other".into());
        assert_eq!(check(&spec, "team-a", &every_namespace).len(), 1);
        let any = Tenancy {
            dynamo_namespaces: vec!["*".into()],
            ..Tenancy::default()
        };
        assert_eq!(check(&spec, "team-a", &any), []);
    }

    #[test]
    fn prometheus_urls_any_default_only_or_a_list() {
        let mut spec = spec();
        let mut tenancy = Tenancy {
            default_prometheus_url: "http://prometheus.monitoring:9090".into(),
            prometheus_urls: vec!["https://thanos.monitoring:10902/".into()],
            ..Tenancy::default()
        };
        spec.metrics.prometheus.url = Some("http://user:secret@elsewhere:9090".into());
        assert_eq!(check(&spec, "a", &tenancy), []);
        tenancy.prometheus = PrometheusUrlPolicy::DefaultOnly;
        let errors = reasons(&check(&spec, "a", &tenancy));
        assert_eq!(
            errors,
            [
                "spec.metrics.prometheus.url: \"http://***@elsewhere:9090\" is not allowed by the cluster admin; allowed: leave it unset (the operator's default) or name one of http://prometheus.monitoring:9090"
            ]
        );
        spec.metrics.prometheus.url = Some("http://prometheus.monitoring:9090/".into());
        assert_eq!(check(&spec, "a", &tenancy), []);
        spec.metrics.prometheus.url = Some("https://thanos.monitoring:10902".into());
        assert_eq!(check(&spec, "a", &tenancy).len(), 1);
        tenancy.prometheus = PrometheusUrlPolicy::AllowList;
        assert_eq!(check(&spec, "a", &tenancy), []);
        // A prefix of an allowed URL is not allowed.
        spec.metrics.prometheus.url = Some("https://thanos.monitoring:10902.evil.example".into());
        assert_eq!(check(&spec, "a", &tenancy).len(), 1);
        spec.metrics.prometheus.url = None;
        assert_eq!(check(&spec, "a", &tenancy), []);
    }

    #[test]
    fn a_token_secret_only_when_the_operator_may_read_secrets() {
        let mut spec = spec();
        spec.metrics.prometheus.bearer_token_secret = Some(planner_api::SecretKeyRef {
            name: "prometheus-token".into(),
            key: "token".into(),
        });
        assert_eq!(
            check(&spec, "a", &Tenancy::default()),
            [PolicyError::TokenSecretsOff]
        );
        let tenancy = Tenancy {
            token_secrets: true,
            ..Tenancy::default()
        };
        assert_eq!(check(&spec, "a", &tenancy), []);
    }

    #[test]
    fn etcd_endpoints_from_the_admins_list_when_there_is_one() {
        let mut spec = spec();
        spec.connector.kind = ConnectorKind::Virtual;
        spec.connector.etcd = Some(EtcdSource {
            endpoints: vec!["http://etcd.dynamo:2379".into(), "http://etcd.other:2379".into()],
        });
        assert_eq!(check(&spec, "a", &Tenancy::default()), []);
        let tenancy = Tenancy {
            etcd_endpoints: vec!["http://etcd.dynamo:2379/".into()],
            ..Tenancy::default()
        };
        assert_eq!(
            reasons(&check(&spec, "a", &tenancy)),
            [
                "spec.connector.etcd.endpoints[1]: \"http://etcd.other:2379\" is not allowed by the cluster admin; allowed: http://etcd.dynamo:2379/"
            ]
        );
    }
}

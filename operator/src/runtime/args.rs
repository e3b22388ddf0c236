//! The flags and environment variables of `planner-operator run`.

use std::{net::SocketAddr, path::PathBuf};

use crate::{
    controller::selection::DgdSelection,
    lookup::ClusterTopologyApi,
    telemetry::LogFormat,
    topology::EnvContract,
    validation::{PrometheusUrlPolicy, Tenancy},
};

/// Configuration of `planner-operator run`, from flags or the environment.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Address of the health (`/healthz`, `/readyz`) and metrics (`/metrics`) server.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Elect a leader through a Lease so that only one replica writes.
    #[arg(long, env = "LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Name of the leader-election Lease.
    #[arg(long, env = "LEASE_NAME", default_value = "planner-operator-leader")]
    pub lease_name: String,
    /// Namespace of the Lease (default: the pod's namespace, else the kubeconfig's).
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Seconds a leader's lease stays valid without renewal.
    #[arg(long, env = "LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// This process's identity in the Lease and in Events (default: the pod name, else host and pid).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Prometheus base URL used by PlannerPolicies that do not name one.
    #[arg(
        long,
        env = "PROMETHEUS_URL",
        default_value = "http://prometheus-operated.monitoring.svc:9090"
    )]
    pub prometheus_url: String,
    /// Group and version Grove serves ClusterTopologyBindings (and, in earlier releases,
    /// ClusterTopologies) under.
    #[arg(
        long,
        env = "CLUSTER_TOPOLOGY_API_VERSION",
        default_value = "grove.io/v1alpha1"
    )]
    pub cluster_topology_api_version: ClusterTopologyApi,
    /// Run the DGD reconciler and the topology label controller (render DGDs into Deployments
    /// and Services, write their status, copy topology labels onto pods). Off: planner-only
    /// operation next to NVIDIA's Dynamo operator, which renders the DGDs; only PlannerPolicies
    /// are reconciled and a DGD is only ever written to scale its replicas.
    #[arg(long, env = "DGD_CONTROLLER", default_value_t = true, action = clap::ArgAction::Set)]
    pub dgd_controller: bool,
    /// Which DGDs the DGD reconciler renders: `unmarked` (every DGD not marked as another
    /// controller's) or `marked` (only those labelled planner.dynamo.io/dgd-controller=planner-operator).
    #[arg(long, env = "DGD_SELECTION", value_enum, default_value = "unmarked")]
    pub dgd_selection: DgdSelection,
    /// Environment contract of the topology injected into worker pods: `dynamo` (the released
    /// Dynamo runtime's DYN_KV_TRANSFER_DOMAIN, DYN_TOPOLOGY_MOUNT_PATH, files at
    /// /etc/dynamo/topology; what a stock Dynamo >= 1.2 worker reads) or `planner` (this
    /// operator's first names, DYN_ROUTER_KV_TRANSFER_*, files at /etc/podinfo/topology, for
    /// runtimes built to read them: a stock worker exits at start-up under it). A DGD's
    /// planner.dynamo.io/topology-env annotation overrides it.
    #[arg(long, env = "TOPOLOGY_ENV", value_enum, default_value_t = EnvContract::default())]
    pub topology_env: EnvContract,
    /// Do not serve the admission webhook (e.g. when another replica set serves it).
    #[arg(long, env = "WEBHOOK_DISABLED")]
    pub webhook_disabled: bool,
    /// Address of the admission webhook's HTTPS server (served on every replica).
    #[arg(long, env = "WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,
    /// Serve `tls.crt` and `tls.key` from this directory (a mounted Secret, e.g. from
    /// cert-manager), reloaded when they change; its `ca.crt`, if any, is patched into the
    /// caBundle. Without it, the operator generates a CA and serving certificate and keeps them
    /// in the Secret `--webhook-secret`.
    #[arg(long, env = "WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<PathBuf>,
    /// ValidatingWebhookConfiguration whose caBundle the operator keeps current; empty: leave
    /// the caBundle alone (cert-manager's CA injector, or a caBundle set at install).
    #[arg(long, env = "WEBHOOK_CONFIG_NAME", default_value = "planner-operator")]
    pub webhook_config_name: String,
    /// Service in front of the webhook; generated certificates are valid for
    /// `<service>.<namespace>.svc` and its other in-cluster names.
    #[arg(long, env = "WEBHOOK_SERVICE", default_value = "planner-operator-webhook")]
    pub webhook_service: String,
    /// Namespace of that Service and of the certificate Secret (default: the Lease namespace).
    #[arg(long, env = "WEBHOOK_NAMESPACE")]
    pub webhook_namespace: Option<String>,
    /// Secret that holds generated certificates, shared by every replica.
    #[arg(long, env = "WEBHOOK_SECRET", default_value = "planner-operator-webhook-cert")]
    pub webhook_secret: String,
    /// More DNS names or IP addresses for generated certificates (comma-separated or repeated),
    /// e.g. 127.0.0.1 when the API server calls the webhook by URL.
    #[arg(long = "webhook-host", env = "WEBHOOK_HOSTS", value_delimiter = ',')]
    pub webhook_hosts: Vec<String>,
    /// Dynamo namespaces PlannerPolicies may name besides their target graph's own
    /// (`<namespace>-<dgd>`), in spec.metrics.dynamoNamespace and the virtual connector's
    /// spec.connector.dynamoNamespace (comma-separated or repeated): `<namespace>/<dynamo
    /// namespace>` allows it to policies in that namespace, `*/<dynamo namespace>` to all, `*`
    /// allows any (single-tenant clusters).
    #[arg(long, env = "ALLOWED_DYNAMO_NAMESPACES", value_delimiter = ',', value_parser = dynamo_namespace_allowance)]
    pub allowed_dynamo_namespaces: Vec<String>,
    /// Which Prometheus URLs PlannerPolicies may name in spec.metrics.prometheus.url: `any`,
    /// `default-only` (only --prometheus-url) or `allow-list` (--prometheus-url and
    /// --allowed-prometheus-url).
    #[arg(long, env = "PROMETHEUS_URL_POLICY", value_enum, default_value = "any")]
    pub prometheus_url_policy: PrometheusUrlPolicy,
    /// Prometheus URLs allowed with --prometheus-url-policy=allow-list (comma-separated or
    /// repeated; compared whole, trailing slashes aside).
    #[arg(
        long = "allowed-prometheus-url",
        env = "ALLOWED_PROMETHEUS_URLS",
        value_delimiter = ','
    )]
    pub allowed_prometheus_urls: Vec<String>,
    /// etcd endpoints the virtual connector may write to (comma-separated or repeated; default:
    /// any).
    #[arg(
        long = "allowed-etcd-endpoint",
        env = "ALLOWED_ETCD_ENDPOINTS",
        value_delimiter = ','
    )]
    pub allowed_etcd_endpoints: Vec<String>,
    /// Let PlannerPolicies name a Secret in their namespace holding a bearer token for
    /// Prometheus (spec.metrics.prometheus.bearerTokenSecret); needs `get` on Secrets in the
    /// watched namespaces.
    #[arg(long, env = "PROMETHEUS_TOKEN_SECRETS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub prometheus_token_secrets: bool,
}

/// An entry of --allowed-dynamo-namespaces that is none of the allowed forms.
#[derive(Debug, thiserror::Error)]
#[error("{entry:?}: allowed: * (any), */<dynamo namespace> (every policy) or <namespace>/<dynamo namespace>")]
pub struct DynamoNamespaceEntryError {
    /// The entry.
    pub entry: String,
}

/// An entry of --allowed-dynamo-namespaces: `*`, `*/<name>` or `<namespace>/<name>`.
fn dynamo_namespace_allowance(entry: &str) -> Result<String, DynamoNamespaceEntryError> {
    let valid = entry == "*"
        || entry
            .split_once('/')
            .is_some_and(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'));
    if valid {
        Ok(entry.to_string())
    } else {
        Err(DynamoNamespaceEntryError {
            entry: entry.to_string(),
        })
    }
}

impl RunArgs {
    /// What PlannerPolicies may name, from the tenancy flags.
    pub fn tenancy(&self) -> Tenancy {
        Tenancy {
            dynamo_namespaces: self.allowed_dynamo_namespaces.clone(),
            prometheus: self.prometheus_url_policy,
            default_prometheus_url: self.prometheus_url.clone(),
            prometheus_urls: self.allowed_prometheus_urls.clone(),
            etcd_endpoints: self.allowed_etcd_endpoints.clone(),
            token_secrets: self.prometheus_token_secrets,
        }
    }
}

/// This process's name in the Lease and in Events when --identity is not given: the host name
/// (the pod name in a pod) and the process id.
pub(super) fn default_identity() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "planner-operator".to_string()
    } else {
        host
    };
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Command {
        #[command(flatten)]
        run: RunArgs,
    }

    fn allowances(entries: &str) -> Result<Vec<String>, clap::Error> {
        Command::try_parse_from(["run", "--allowed-dynamo-namespaces", entries])
            .map(|c| c.run.allowed_dynamo_namespaces)
    }

    #[test]
    fn dynamo_namespace_entries_take_the_three_forms_and_name_them_otherwise() {
        assert_eq!(
            allowances("*,*/shared,team-a/dynamo").unwrap(),
            ["*", "*/shared", "team-a/dynamo"]
        );
        for bad in ["shared", "/shared", "team-a/", "team-a/x/y"] {
            let error = allowances(bad).unwrap_err().to_string();
            assert!(
                error.contains(&format!(
                    "{bad:?}: allowed: * (any), */<dynamo namespace> (every policy) or <namespace>/<dynamo namespace>"
                )),
                "{bad}: {error}"
            );
        }
    }
}

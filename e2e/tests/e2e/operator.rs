//! The operator, run in this test process against the test cluster and scoped to one test's
//! namespace (`--namespace`, no leader election), with its admission webhook on a loopback port
//! registered through a ValidatingWebhookConfiguration whose `clientConfig.url` points at it. The
//! operator generates the webhook's CA and serving certificate (for 127.0.0.1) and patches the
//! CA into that configuration itself; the tests check it did.

use std::{net::SocketAddr, sync::Once, time::Duration};

use clap::Parser;
use e2e::{Result, TestNamespace, poll_until};
use k8s_openapi::{
    ByteString,
    api::{admissionregistration::v1::ValidatingWebhookConfiguration, core::v1::Secret},
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use planner_operator::{
    runtime::{RunArgs, RunError, run_until},
    webhook::configuration::{Target, validating_webhook_configuration},
};
use serde_json::Value;
use tokio::{sync::oneshot, task::JoinHandle};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    run: RunArgs,
}

/// The `planner-operator run` command line, for looking its flags up (e.g. which reads an env var).
pub fn cli_command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Parses `planner-operator run` flags (`argv[0]` is the program name) as the binary does.
pub fn parse_run_args<I, T>(argv: I) -> Result<RunArgs>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Ok(Cli::try_parse_from(argv)?.run)
}

/// A running in-process operator; [`Operator::stop`] it at the end of the test.
pub struct Operator {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::result::Result<(), RunError>>,
    /// Where its webhook listens.
    pub webhook_addr: SocketAddr,
    /// Name of the ValidatingWebhookConfiguration it keeps the caBundle of.
    pub webhook_config: String,
    /// Where its `/metrics` listens.
    pub metrics_addr: SocketAddr,
    client: Client,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Set to a kubeconfig (e.g. the operator service account's) to run the in-process operator
/// with it instead of the tests' admin credentials: checks that its RBAC is enough.
pub const OPERATOR_KUBECONFIG_ENV: &str = "E2E_OPERATOR_RBAC_KUBECONFIG";

async fn operator_client(ns: &TestNamespace) -> Result<Client> {
    let Some(path) = std::env::var_os(OPERATOR_KUBECONFIG_ENV) else {
        return Ok(ns.client.clone());
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Sends the in-process operator's logs to the test output (once per test binary).
pub fn init_logs() {
    static LOGS: Once = Once::new();
    LOGS.call_once(|| planner_operator::telemetry::init(planner_operator::telemetry::LogFormat::Text));
}

/// Starts the operator for `ns`; `extra` flags are appended (e.g. `--webhook-disabled`).
pub async fn start(ns: &TestNamespace, extra: &[&str]) -> Result<Operator> {
    init_logs();
    let webhook_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let webhook_config = format!("planner-operator-{}", ns.name);
    let addr = webhook_addr.to_string();
    let metrics_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let metrics = metrics_addr.to_string();
    let identity = format!("e2e-{}", ns.name);
    let mut argv = vec![
        "planner-operator",
        "--namespace",
        &ns.name,
        "--metrics-addr",
        &metrics,
        "--leader-election",
        "false",
        "--identity",
        &identity,
        "--webhook-addr",
        &addr,
        "--webhook-config-name",
        &webhook_config,
        "--webhook-namespace",
        &ns.name,
        "--webhook-host",
        "127.0.0.1",
    ];
    argv.extend_from_slice(extra);
    let args = Cli::try_parse_from(argv)?.run;
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(run_until(args, operator_client(ns).await?, async move {
        let _ = stopped.await;
    }));
    Ok(Operator {
        stop: Some(stop),
        task,
        webhook_addr,
        webhook_config,
        metrics_addr,
        client: ns.client.clone(),
    })
}

impl Operator {
    /// Registers the webhook for this test's namespace only, by URL, without a caBundle, then
    /// waits until the operator has patched in the CA of the certificate it generated (read from
    /// its Secret) and the API server gets answers from it.
    pub async fn register_webhook(
        &self,
        ns: &TestNamespace,
        probe: &Value,
        probe_reason: &str,
    ) -> Result<()> {
        let selector = LabelSelector {
            match_labels: Some([("kubernetes.io/metadata.name".to_string(), ns.name.clone())].into()),
            match_expressions: None,
        };
        let config = validating_webhook_configuration(
            &self.webhook_config,
            &Target::Url(format!("https://{}", self.webhook_addr)),
            Some(selector),
            None,
        );
        let configs: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        configs.create(&PostParams::default(), &config).await?;

        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &ns.name);
        poll_until(
            "the operator to patch its CA into the caBundle",
            Duration::from_secs(60),
            || {
                let (configs, secrets, name) =
                    (configs.clone(), secrets.clone(), self.webhook_config.clone());
                async move {
                    let Some(secret) = secrets.get_opt("planner-operator-webhook-cert").await? else {
                        return Ok(false);
                    };
                    let ca = secret.data.unwrap_or_default().get("ca.crt").cloned();
                    let config = configs.get(&name).await?;
                    let bundles: Vec<Option<ByteString>> = config
                        .webhooks
                        .unwrap_or_default()
                        .into_iter()
                        .map(|w| w.client_config.ca_bundle)
                        .collect();
                    Ok(ca.is_some() && bundles.iter().all(|b| *b == ca))
                }
            },
        )
        .await?;
        poll_until(
            "the API server to reach the webhook",
            Duration::from_secs(60),
            move || async move {
                match ns.rejects(probe, probe_reason).await {
                    Ok(_) => Ok(true),
                    Err(e) => {
                        eprintln!("webhook not answering yet: {e}");
                        Ok(false)
                    }
                }
            },
        )
        .await
    }

    /// Stops the operator and removes its webhook registration.
    pub async fn stop(mut self) -> Result<()> {
        let configs: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let _ = configs
            .delete(&self.webhook_config, &DeleteParams::default())
            .await;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(Duration::from_secs(60), &mut self.task).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(error))) => Err(format!("the operator failed: {error}").into()),
            Ok(Err(join)) => Err(format!("the operator task failed: {join}").into()),
            Err(_) => {
                self.task.abort();
                Err("the operator did not stop within 60s".into())
            }
        }
    }

    /// Fails when the operator has already stopped (e.g. it could not start).
    pub fn check_running(&self) -> Result<()> {
        if self.task.is_finished() {
            return Err("the operator stopped early; see its log above".into());
        }
        Ok(())
    }
}

/// A cluster-scoped object this test created, deleted when the test ends (even on failure, as
/// far as async drop allows: the deletion is spawned).
pub struct ClusterScoped {
    api: Api<kube::api::DynamicObject>,
    name: String,
}

impl ClusterScoped {
    /// Creates `object` (a Grove ClusterTopologyBinding, or the ClusterTopology of Grove before
    /// v0.1.0-alpha.9, by its `kind`) and returns a guard that deletes it.
    pub async fn create_cluster_topology(client: &Client, object: &Value) -> Result<Self> {
        let (kind, plural) = match object["kind"].as_str() {
            Some("ClusterTopologyBinding") => ("ClusterTopologyBinding", "clustertopologybindings"),
            Some("ClusterTopology") => ("ClusterTopology", "clustertopologies"),
            other => return Err(format!("not one of Grove's topology kinds: {other:?}").into()),
        };
        let resource = kube::api::ApiResource {
            group: "grove.io".into(),
            version: "v1alpha1".into(),
            api_version: "grove.io/v1alpha1".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
        let object: kube::api::DynamicObject = serde_json::from_value(object.clone())?;
        let name = object
            .metadata
            .name
            .clone()
            .ok_or("topology object without a name")?;
        api.create(&PostParams::default(), &object).await?;
        Ok(Self { api, name })
    }

    /// Deletes the object now.
    pub async fn delete(self) {
        let _ = self.api.delete(&self.name, &DeleteParams::default()).await;
    }
}

impl Drop for ClusterScoped {
    fn drop(&mut self) {
        let (api, name) = (self.api.clone(), self.name.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            });
        }
    }
}

//! The Helm chart from the tests' side: running `helm` (built by `make tools`; `make e2e` and
//! `eval "$(make -s cluster-up)"` put it on PATH, `HELM` overrides), reading what it renders,
//! and a client that acts as the chart's ServiceAccount (a token from the TokenRequest API).

use std::path::PathBuf;

use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::ServiceAccount,
};
use kube::{
    Api, Client,
    api::PostParams,
    config::{AuthInfo, KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};

use crate::{Result, repo_root};

/// Set to the helm binary to use instead of `helm` from PATH.
pub const HELM_ENV: &str = "HELM";

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/planner-operator")
}

fn helm_binary() -> String {
    std::env::var(HELM_ENV).unwrap_or_else(|_| "helm".into())
}

/// Runs helm with `args` and returns its standard output; a failure (or a missing helm) is an
/// error with helm's standard error.
pub async fn helm(args: &[&str]) -> Result<String> {
    let binary = helm_binary();
    let output = tokio::process::Command::new(&binary)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| {
            format!(
                "cannot run {binary} ({e}): build it with `make tools` and put it on PATH \
                 (`eval \"$(make -s cluster-up)\"` does), or set {HELM_ENV}"
            )
        })?;
    if !output.status.success() {
        return Err(HelmError {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        }
        .into());
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// A helm command that failed.
#[derive(Debug)]
pub struct HelmError {
    /// Its arguments.
    pub args: String,
    /// What helm printed on standard error.
    pub stderr: String,
}

impl std::fmt::Display for HelmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "helm {} failed: {}", self.args, self.stderr)
    }
}

impl std::error::Error for HelmError {}

/// The objects of a multi-document manifest (helm template / helm get manifest), as JSON.
pub fn parse_manifests(text: &str) -> Result<Vec<Value>> {
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(document)?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

/// `helm template <release> charts/planner-operator --namespace <namespace> <extra>`, parsed.
pub async fn template(release: &str, namespace: &str, extra: &[&str]) -> Result<Vec<Value>> {
    let chart = chart_dir();
    let chart = chart.to_string_lossy();
    let mut args = vec!["template", release, chart.as_ref(), "--namespace", namespace];
    args.extend_from_slice(extra);
    parse_manifests(&helm(&args).await?)
}

/// The objects of `kind` among `objects`.
pub fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

/// The one object of `kind`, or an error naming the kind.
pub fn one_of_kind<'a>(objects: &'a [Value], kind: &str) -> Result<&'a Value> {
    match of_kind(objects, kind).as_slice() {
        [one] => Ok(one),
        other => Err(format!("expected one {kind}, found {}", other.len()).into()),
    }
}

/// A client that authenticates with a fresh token of ServiceAccount `namespace/name` (TokenRequest
/// API, one hour), against the server and CA of the current kubeconfig: it has exactly the
/// permissions RBAC grants that ServiceAccount.
pub async fn service_account_client(admin: &Client, namespace: &str, name: &str) -> Result<Client> {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let issued = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("TokenRequest for ServiceAccount {namespace}/{name}: {e}"))?;
    let token = issued
        .status
        .map(|s| s.token)
        .ok_or("the TokenRequest has no status")?;
    let mut kubeconfig = Kubeconfig::read()?;
    let context_name = kubeconfig
        .current_context
        .clone()
        .ok_or("the kubeconfig has no current context")?;
    let user = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.user.clone())
        .ok_or("the kubeconfig's current context is missing")?;
    let auth_info: AuthInfo = serde_json::from_value(json!({ "token": token }))?;
    for named in &mut kubeconfig.auth_infos {
        if Some(&named.name) == user.as_ref() {
            named.auth_info = Some(auth_info.clone());
        }
    }
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

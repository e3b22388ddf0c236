//! With the webhook registered fail-closed and no replica answering, the API server still admits
//! every write the webhook does not validate, thanks to the configuration's `matchConditions`:
//! metadata-only updates (labels, finalizers), finalizer removal from an object being deleted,
//! and the operator's own replica patches. Spec changes by anyone else are refused, as before.

use std::time::Duration;

use e2e::{Result, TestNamespace, chart::service_account_client, in_namespace, install_crds, poll_until};
use k8s_openapi::{
    api::{
        admissionregistration::v1::ValidatingWebhookConfiguration,
        core::v1::ServiceAccount,
        rbac::v1::{Role, RoleBinding},
    },
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use planner_api::DynamoGraphDeployment;
use planner_operator::webhook::configuration::{Target, validating_webhook_configuration_for};
use serde_json::json;

use crate::dgd::graph;

const OPERATOR_ACCOUNT: &str = "planner-operator";

fn replicas_patch(value: i32) -> Result<Patch<()>> {
    let patch = json!([{"op": "replace", "path": "/spec/components/2/replicas", "value": value}]);
    Ok(Patch::Json::<()>(serde_json::from_value(patch)?))
}

/// The operator's ServiceAccount, allowed to patch DGDs in the namespace.
async fn operator_account(ns: &TestNamespace) -> Result<()> {
    let accounts: Api<ServiceAccount> = ns.api();
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": OPERATOR_ACCOUNT}}))?,
        )
        .await?;
    let roles: Api<Role> = ns.api();
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "scale-dgds"},
                "rules": [{"apiGroups": ["nvidia.com"], "resources": ["dynamographdeployments"],
                           "verbs": ["get", "patch"]}]
            }))?,
        )
        .await?;
    let bindings: Api<RoleBinding> = ns.api();
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "scale-dgds"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "scale-dgds"},
                "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_ACCOUNT, "namespace": ns.name}]
            }))?,
        )
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_outage_blocks_only_the_writes_the_webhook_validates() -> Result<()> {
    in_namespace("webhook-outage", |ns| async move {
        install_crds(&ns.client).await?;
        let dgds: Api<DynamoGraphDeployment> = ns.api();
        dgds.create(&PostParams::default(), &graph("llama")?).await?;
        operator_account(&ns).await?;

        // Registered for this namespace, fail closed, at an address where nothing listens.
        let name = format!("outage-{}", ns.name);
        let selector = LabelSelector {
            match_labels: Some([("kubernetes.io/metadata.name".to_string(), ns.name.clone())].into()),
            match_expressions: None,
        };
        let config = validating_webhook_configuration_for(
            &name,
            &Target::Url("https://127.0.0.1:1".into()),
            Some(selector),
            None,
            Some(&format!("system:serviceaccount:{}:{OPERATOR_ACCOUNT}", ns.name)),
        );
        let configs: Api<ValidatingWebhookConfiguration> = Api::all(ns.client.clone());
        configs.create(&PostParams::default(), &config).await?;

        let outcome = async {
            // A spec change by someone else is refused once the API server uses the configuration.
            // Each try changes the replicas: a patch that changes nothing might never reach
            // admission, so one that went through before the configuration was in use would
            // leave every later try passing.
            let tries = std::sync::atomic::AtomicI32::new(0);
            poll_until("the API server to call the (absent) webhook", Duration::from_secs(60), || async {
                let replicas = 2 + tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2;
                match dgds.patch("llama", &PatchParams::default(), &replicas_patch(replicas)?).await {
                    Err(kube::Error::Api(status)) => Ok(status.message.contains("failed calling webhook")),
                    Ok(_) => Ok(false),
                    Err(other) => Err(other.into()),
                }
            })
            .await?;

            // Metadata-only updates: labels and finalizers.
            dgds.patch(
                "llama",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"team": "inference"}, "finalizers": ["example.com/cleanup"]}})),
            )
            .await
            .map_err(|e| format!("a metadata-only update was blocked by the outage: {e}"))?;

            // The operator's own replica patch.
            let operator = service_account_client(&ns.client, &ns.name, OPERATOR_ACCOUNT).await?;
            let as_operator: Api<DynamoGraphDeployment> = Api::namespaced(operator, &ns.name);
            as_operator
                .patch("llama", &PatchParams::default(), &replicas_patch(4)?)
                .await
                .map_err(|e| format!("the operator's replica patch was blocked by the outage: {e}"))?;
            let decode = dgds.get("llama").await?.spec.components[2].replicas;
            assert_eq!(decode, Some(4));

            // Deleting, and removing the finalizer of the object being deleted.
            dgds.delete("llama", &DeleteParams::default()).await?;
            dgds.patch(
                "llama",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .map_err(|e| format!("removing a finalizer was blocked by the outage: {e}"))?;
            poll_until("the DGD to be gone", Duration::from_secs(30), || async {
                Ok(dgds.get_opt("llama").await?.is_none())
            })
            .await?;

            // Creating one is still checked (and so refused while nothing answers).
            match dgds.create(&PostParams::default(), &graph("other")?).await {
                Err(kube::Error::Api(status)) if status.message.contains("failed calling webhook") => Ok(()),
                other => Err(format!("a create during the outage was not refused: {other:?}").into()),
            }
        }
        .await;
        let _ = configs.delete(&name, &DeleteParams::default()).await;
        outcome
    })
    .await
}

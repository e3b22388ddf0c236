//! The ValidatingWebhookConfiguration that registers the webhook: one webhook per kind, CREATE
//! and UPDATE, `failurePolicy: Fail`, `sideEffects: None`, a 10s timeout. The Helm chart writes
//! the same thing; tests build it here.

use k8s_openapi::{
    ByteString,
    api::admissionregistration::v1::{
        RuleWithOperations, ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration,
        WebhookClientConfig,
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
};

use super::admission::{DGD_PATH, PLANNER_POLICY_PATH};

/// Name of the DynamoGraphDeployment webhook.
pub const DGD_WEBHOOK: &str = "dynamographdeployments.validate.planner.dynamo.io";
/// Name of the PlannerPolicy webhook.
pub const PLANNER_POLICY_WEBHOOK: &str = "plannerpolicies.validate.planner.dynamo.io";
/// Seconds the API server waits for an answer.
pub const TIMEOUT_SECONDS: i32 = 10;

/// How the API server reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Through a Service (in-cluster).
    Service {
        /// Service name.
        name: String,
        /// Service namespace.
        namespace: String,
        /// Service port.
        port: i32,
    },
    /// At a base URL, e.g. `https://127.0.0.1:9443` (a process outside the cluster).
    Url(String),
}

impl Target {
    fn client_config(&self, path: &str, ca_bundle: Option<&[u8]>) -> WebhookClientConfig {
        let ca_bundle = ca_bundle.map(|ca| ByteString(ca.to_vec()));
        match self {
            Self::Service {
                name,
                namespace,
                port,
            } => WebhookClientConfig {
                ca_bundle,
                service: Some(ServiceReference {
                    name: name.clone(),
                    namespace: namespace.clone(),
                    path: Some(path.into()),
                    port: Some(*port),
                }),
                url: None,
            },
            Self::Url(base) => WebhookClientConfig {
                ca_bundle,
                service: None,
                url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            },
        }
    }
}

/// The configuration named `name`; `namespace_selector` limits it to some namespaces, and
/// `ca_bundle` may be left for the operator to patch in.
pub fn validating_webhook_configuration(
    name: &str,
    target: &Target,
    namespace_selector: Option<LabelSelector>,
    ca_bundle: Option<&[u8]>,
) -> ValidatingWebhookConfiguration {
    let webhook = |webhook: &str, group: &str, version: &str, resource: &str, path: &str| ValidatingWebhook {
        name: webhook.into(),
        admission_review_versions: vec!["v1".into()],
        client_config: target.client_config(path, ca_bundle),
        failure_policy: Some("Fail".into()),
        match_policy: Some("Equivalent".into()),
        namespace_selector: namespace_selector.clone(),
        rules: Some(vec![RuleWithOperations {
            api_groups: Some(vec![group.into()]),
            api_versions: Some(vec![version.into()]),
            operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
            resources: Some(vec![resource.into()]),
            scope: Some("Namespaced".into()),
        }]),
        side_effects: "None".into(),
        timeout_seconds: Some(TIMEOUT_SECONDS),
        ..ValidatingWebhook::default()
    };
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/name".to_string(),
                    "planner-operator".to_string(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![
            webhook(
                DGD_WEBHOOK,
                "nvidia.com",
                "v1beta1",
                "dynamographdeployments",
                DGD_PATH,
            ),
            webhook(
                PLANNER_POLICY_WEBHOOK,
                "planner.dynamo.io",
                "v1alpha1",
                "plannerpolicies",
                PLANNER_POLICY_PATH,
            ),
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fails_closed_on_create_and_update_only() {
        let config = validating_webhook_configuration(
            "planner-operator",
            &Target::Url("https://127.0.0.1:9443/".into()),
            None,
            Some(b"ca"),
        );
        let webhooks = config.webhooks.unwrap();
        assert_eq!(webhooks.len(), 2);
        for webhook in &webhooks {
            assert_eq!(webhook.failure_policy.as_deref(), Some("Fail"));
            assert_eq!(webhook.side_effects, "None");
            assert_eq!(webhook.timeout_seconds, Some(10));
            let operations = webhook.rules.as_ref().unwrap()[0].operations.clone().unwrap();
            assert_eq!(operations, ["CREATE", "UPDATE"]);
        }
        assert_eq!(
            webhooks[0].client_config.url.as_deref(),
            Some("https://127.0.0.1:9443/validate-nvidia-com-v1beta1-dynamographdeployment")
        );
        let service = validating_webhook_configuration(
            "x",
            &Target::Service {
                name: "svc".into(),
                namespace: "ns".into(),
                port: 443,
            },
            None,
            None,
        );
        let reference = service.webhooks.unwrap()[1]
            .client_config
            .service
            .clone()
            .unwrap();
        assert_eq!(reference.path.as_deref(), Some(PLANNER_POLICY_PATH));
    }
}

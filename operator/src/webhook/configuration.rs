//! The ValidatingWebhookConfiguration that registers the webhook: one webhook per kind, CREATE
//! and UPDATE, `failurePolicy: Fail`, `sideEffects: None`, a 10s timeout. The Helm chart writes
//! the same thing; tests build it here.
//!
//! Fail closed, but only for the writes the webhook validates: `matchConditions` (Kubernetes
//! 1.30+) keep the API server from calling it at all for updates that leave the spec unchanged
//! (metadata, finalizers; status goes to its own subresource, which no rule names), for objects
//! being deleted, and, for DGDs, for the operator's own writes (its replica patches). So an
//! operator outage never blocks finalizer removal, Dynamo's own metadata writes or the planner.

use k8s_openapi::{
    ByteString,
    api::admissionregistration::v1::{
        MatchCondition, RuleWithOperations, ServiceReference, ValidatingWebhook,
        ValidatingWebhookConfiguration, WebhookClientConfig,
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
/// `matchConditions` name: only updates that change the spec are sent.
pub const SPEC_CHANGED: &str = "spec-changed";
/// `matchConditions` name: objects being deleted are not sent.
pub const NOT_BEING_DELETED: &str = "not-being-deleted";
/// `matchConditions` name: the operator's own writes are not sent.
pub const NOT_THE_OPERATOR: &str = "not-the-operator";

/// The conditions under which the API server calls a webhook; `operator_user` (the operator's
/// ServiceAccount user name, `system:serviceaccount:<namespace>:<name>`), when given, is let
/// through unchecked.
pub fn match_conditions(operator_user: Option<&str>) -> Vec<MatchCondition> {
    let mut conditions = vec![
        MatchCondition {
            name: SPEC_CHANGED.into(),
            expression: "request.operation != 'UPDATE' || !has(object.spec) || !has(oldObject.spec) || object.spec != oldObject.spec".into(),
        },
        MatchCondition {
            name: NOT_BEING_DELETED.into(),
            expression: "!has(object.metadata.deletionTimestamp)".into(),
        },
    ];
    if let Some(user) = operator_user {
        conditions.push(MatchCondition {
            name: NOT_THE_OPERATOR.into(),
            expression: format!("request.userInfo.username != '{}'", user.replace('\'', "")),
        });
    }
    conditions
}

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
/// `ca_bundle` may be left for the operator to patch in. The operator's own writes are
/// validated too (see [`validating_webhook_configuration_for`]).
pub fn validating_webhook_configuration(
    name: &str,
    target: &Target,
    namespace_selector: Option<LabelSelector>,
    ca_bundle: Option<&[u8]>,
) -> ValidatingWebhookConfiguration {
    validating_webhook_configuration_for(name, target, namespace_selector, ca_bundle, None)
}

/// [`validating_webhook_configuration`] for an operator that runs as `operator_user`, whose
/// writes to DGDs (replica patches) are not sent to the webhook.
pub fn validating_webhook_configuration_for(
    name: &str,
    target: &Target,
    namespace_selector: Option<LabelSelector>,
    ca_bundle: Option<&[u8]>,
    operator_user: Option<&str>,
) -> ValidatingWebhookConfiguration {
    let webhook = |webhook: &str, group: &str, version: &str, resource: &str, path: &str| ValidatingWebhook {
        name: webhook.into(),
        admission_review_versions: vec!["v1".into()],
        client_config: target.client_config(path, ca_bundle),
        failure_policy: Some("Fail".into()),
        match_conditions: Some(match_conditions(operator_user.filter(|_| webhook == DGD_WEBHOOK))),
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

    #[test]
    fn match_conditions_skip_what_the_webhook_does_not_validate() {
        let config = validating_webhook_configuration_for(
            "planner-operator",
            &Target::Url("https://127.0.0.1:9443".into()),
            None,
            None,
            Some("system:serviceaccount:ops:planner-operator"),
        );
        let webhooks = config.webhooks.unwrap();
        let names = |w: &ValidatingWebhook| -> Vec<String> {
            w.match_conditions
                .iter()
                .flatten()
                .map(|c| c.name.clone())
                .collect()
        };
        assert_eq!(
            names(&webhooks[0]),
            [SPEC_CHANGED, NOT_BEING_DELETED, NOT_THE_OPERATOR]
        );
        assert_eq!(
            names(&webhooks[1]),
            [SPEC_CHANGED, NOT_BEING_DELETED],
            "policies: the operator never writes their spec"
        );
        let operator = &webhooks[0].match_conditions.as_ref().unwrap()[2];
        assert_eq!(
            operator.expression,
            "request.userInfo.username != 'system:serviceaccount:ops:planner-operator'"
        );
        let without = validating_webhook_configuration("x", &Target::Url("https://h".into()), None, None);
        assert_eq!(
            names(&without.webhooks.unwrap()[0]),
            [SPEC_CHANGED, NOT_BEING_DELETED]
        );
    }
}

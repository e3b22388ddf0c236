//! The CRD schema and the admission webhook hold a PlannerPolicy to the same limits: every
//! limit of `planner_api::limits`, at and around its ends, is accepted or refused by both (the
//! schema as the API server applies it, defaults and CEL rules included; the webhook's
//! `validate_spec`), so `kubectl apply` gives the same answer with or without the webhook. And
//! whatever else the webhook refuses without looking at the target graph, the schema refuses
//! too.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use planner_api::PlannerPolicy;
use planner_operator::validation::validate_spec;
use serde_json::{Value, json};

fn policy(mode: &str, interval: &str) -> Value {
    let mut spec = json!({
        "targetRef": {"name": "llama-disagg"},
        "mode": mode,
        "adjustmentInterval": interval,
    });
    if mode != "load" {
        spec["profile"] = json!({"builtin": "h200-llama3.1-8b-tp1"});
    }
    json!({
        "apiVersion": "planner.dynamo.io/v1alpha1",
        "kind": "PlannerPolicy",
        "metadata": {"name": "limits", "namespace": "default"},
        "spec": spec,
    })
}

/// Sets `path` (dot-separated, under `spec`) to `value`.
fn with(mut manifest: Value, path: &str, value: Value) -> Value {
    let mut node = &mut manifest["spec"];
    let keys: Vec<&str> = path.split('.').collect();
    for key in &keys[..keys.len() - 1] {
        if node.get(*key).is_none() {
            node[*key] = json!({});
        }
        node = &mut node[*key];
    }
    node[keys[keys.len() - 1]] = value;
    manifest
}

/// (schema accepts, webhook accepts, what each said).
fn verdicts(manifest: &Value) -> (bool, bool, String) {
    let schema = support::validate(manifest);
    let policy: PlannerPolicy = serde_json::from_value(manifest.clone()).unwrap();
    let webhook = validate_spec(&policy.spec);
    let said = format!(
        "schema: {:?}; webhook: {:?}",
        schema.iter().map(ToString::to_string).collect::<Vec<_>>(),
        webhook.iter().map(ToString::to_string).collect::<Vec<_>>()
    );
    (schema.is_empty(), webhook.is_empty(), said)
}

#[test]
fn schema_and_webhook_accept_and_refuse_the_same_limits() {
    // (mode, interval, field, value, accepted).
    let cases: Vec<(&str, &str, &str, Value, bool)> = vec![
        ("sla", "9s", "adjustmentInterval", json!("9s"), false),
        ("sla", "10s", "adjustmentInterval", json!("10s"), true),
        ("sla", "24h", "adjustmentInterval", json!("24h"), true),
        ("sla", "24h", "adjustmentInterval", json!("24h1s"), false),
        ("sla", "48h", "adjustmentInterval", json!("48h"), false),
        ("observe", "48h", "adjustmentInterval", json!("48h"), false),
        ("load", "1h", "adjustmentInterval", json!("1h"), true),
        ("load", "61m", "adjustmentInterval", json!("61m"), false),
        ("load", "30s", "load.metricPullingInterval", json!("99ms"), false),
        ("load", "30s", "load.metricPullingInterval", json!("100ms"), true),
        ("load", "30s", "load.metricPullingInterval", json!("15s"), true),
        ("load", "30s", "load.metricPullingInterval", json!("16s"), false),
        ("load", "180s", "load.metricPullingInterval", json!("60s"), true),
        ("load", "180s", "load.metricPullingInterval", json!("61s"), false),
        // Only load mode samples; elsewhere the field keeps its own range.
        ("sla", "10s", "load.metricPullingInterval", json!("30s"), true),
        ("sla", "10s", "load.metricPullingInterval", json!("61s"), false),
        ("sla", "180s", "connector.decisionTimeout", json!("999ms"), false),
        ("sla", "180s", "connector.decisionTimeout", json!("1s"), true),
        ("sla", "180s", "connector.decisionTimeout", json!("24h"), true),
        ("sla", "180s", "connector.decisionTimeout", json!("25h"), false),
        ("sla", "180s", "behavior.scaleUpDelay", json!("0s"), true),
        ("sla", "180s", "behavior.scaleUpDelay", json!("1h"), true),
        ("sla", "180s", "behavior.scaleUpDelay", json!("61m"), false),
        ("sla", "180s", "behavior.expectedScaleUpDelay", json!("1h"), true),
        (
            "sla",
            "180s",
            "behavior.expectedScaleUpDelay",
            json!("90m"),
            false,
        ),
        (
            "sla",
            "180s",
            "behavior.scaleDownStabilization",
            json!("0s"),
            true,
        ),
        (
            "sla",
            "180s",
            "behavior.scaleDownStabilization",
            json!("2h"),
            false,
        ),
        ("sla", "180s", "behavior.fastCheckPeriod", json!("0s"), true),
        ("sla", "180s", "behavior.fastCheckPeriod", json!("4s"), false),
        ("sla", "180s", "behavior.fastCheckPeriod", json!("5s"), true),
        ("sla", "180s", "behavior.fastCheckPeriod", json!("5m"), true),
        ("sla", "180s", "behavior.fastCheckPeriod", json!("6m"), false),
        (
            "sla",
            "180s",
            "bounds.prefill",
            json!({"minReplicas": 2, "maxReplicas": 3}),
            true,
        ),
        ("sla", "180s", "bounds.prefill", json!({"minReplicas": 6}), true),
        (
            "sla",
            "180s",
            "bounds.decode",
            json!({"minReplicas": 3, "maxReplicas": 2}),
            false,
        ),
    ];
    let mut disagreements = Vec::new();
    for (mode, interval, field, value, accepted) in cases {
        let manifest = with(policy(mode, interval), field, value.clone());
        let (schema, webhook, said) = verdicts(&manifest);
        if schema != accepted || webhook != accepted {
            disagreements.push(format!(
                "mode {mode}, interval {interval}, {field}: {value}: expected {}, {said}",
                if accepted { "accepted" } else { "refused" }
            ));
        }
    }
    // A pool's minimum above the shared maximum is refused by both.
    let inverted = with(
        with(policy("sla", "180s"), "bounds.maxReplicas", json!(4)),
        "bounds.prefill",
        json!({"minReplicas": 6}),
    );
    let (schema, webhook, said) = verdicts(&inverted);
    if schema || webhook {
        disagreements.push(format!("prefill minimum above the shared maximum: {said}"));
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}

#[test]
fn what_the_webhook_refuses_from_the_spec_alone_the_schema_refuses_too() {
    // Every policy fixture the webhook refuses without a target graph (its headers name the
    // webhook's reason) that the schema also sees: the schema must refuse it.
    let dir = support::repo_root().join("operator/tests/fixtures/webhook");
    let mut missed = Vec::new();
    for path in support::yaml_files(&dir) {
        let manifest = support::load_yaml(&path);
        if manifest["kind"] != "PlannerPolicy" {
            continue;
        }
        let Ok(policy) = serde_json::from_value::<PlannerPolicy>(manifest.clone()) else {
            continue;
        };
        let refused_by_webhook = validate_spec(&policy.spec)
            .iter()
            .any(|e| planner_operator::validation::PolicyError::reason(e) == "InvalidSpec");
        let is_limit = validate_spec(&policy.spec).iter().any(|e| {
            matches!(
                e,
                planner_operator::validation::PolicyError::IntervalOutOfRange { .. }
                    | planner_operator::validation::PolicyError::PullingIntervalOutOfRange { .. }
                    | planner_operator::validation::PolicyError::DecisionTimeoutOutOfRange { .. }
                    | planner_operator::validation::PolicyError::BehaviorOutOfRange { .. }
                    | planner_operator::validation::PolicyError::PoolBoundsInverted { .. }
            )
        });
        if refused_by_webhook && is_limit && support::validate(&manifest).is_empty() {
            missed.push(path.display().to_string());
        }
    }
    assert!(
        missed.is_empty(),
        "the webhook refuses these for a limit the schema lets through: {missed:?}"
    );
}

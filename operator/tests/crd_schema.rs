//! The generated CRD schemas accept every sample and reject every bad fixture for the reason the
//! fixture names, and carry every validation rule the design asks of them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use serde_json::Value;
use support::{expectation, load_yaml, open_api_schema, repo_root, served_here, validate, yaml_files};

#[test]
fn every_sample_is_accepted_by_the_schema() {
    let samples = yaml_files(&repo_root().join("config/samples"));
    assert!(
        samples.len() >= 6,
        "expected the samples of every kind and mode, found {samples:?}"
    );
    for path in samples {
        let sample = load_yaml(&path);
        if !served_here(&sample) {
            // Grove's ClusterTopologyBinding: checked against Grove's CRD by the e2e tests.
            continue;
        }
        let errors = validate(&sample);
        assert!(errors.is_empty(), "{} is rejected: {errors:#?}", path.display());
    }
}

#[test]
fn every_bad_fixture_is_rejected_for_its_reason() {
    let fixtures = yaml_files(&repo_root().join("operator/tests/fixtures/invalid"));
    assert!(
        fixtures.len() >= 10,
        "expected at least ten bad fixtures, found {}",
        fixtures.len()
    );
    let mut failures = Vec::new();
    for path in &fixtures {
        let expected = expectation(path);
        let errors = validate(&load_yaml(path));
        let matches = errors
            .iter()
            .any(|e| e.field == expected.field && e.message.contains(&expected.reason));
        // Exactly one error, so that each fixture proves one rule and not a side effect.
        if !matches || errors.len() != 1 {
            failures.push(format!(
                "{}: expected `{}: ...{}...`, got {:?}",
                path.file_name().unwrap_or_default().to_string_lossy(),
                expected.field,
                expected.reason,
                errors.iter().map(ToString::to_string).collect::<Vec<_>>()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Collects `(schema path, rule, message)` of every CEL rule in a schema.
fn cel_rules(schema: &Value, path: &str, out: &mut Vec<(String, String, String)>) {
    let Value::Object(map) = schema else { return };
    if let Some(Value::Array(rules)) = map.get("x-kubernetes-validations") {
        for rule in rules {
            out.push((
                path.to_string(),
                rule["rule"].as_str().unwrap_or_default().to_string(),
                rule["message"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    if let Some(Value::Object(props)) = map.get("properties") {
        for (name, child) in props {
            let child_path = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            cel_rules(child, &child_path, out);
        }
    }
    if let Some(items) = map.get("items") {
        cel_rules(items, &format!("{path}[]"), out);
    }
}

fn rules_of(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Vec<(String, String, String)> {
    let mut rules = Vec::new();
    cel_rules(&open_api_schema(crd), "", &mut rules);
    rules
}

#[test]
fn every_cel_rule_is_present_where_it_belongs() {
    use kube::CustomResourceExt;
    use planner_api::{DynamoGraphDeployment, PlannerPolicy};

    let expected: [(&str, Vec<(&str, &str)>); 2] = [
        (
            "PlannerPolicy",
            vec![
                (
                    "spec",
                    "spec.profile is required when spec.mode is sla or observe",
                ),
                (
                    "spec.adjustmentInterval",
                    "spec.adjustmentInterval must be 10s to 24h",
                ),
                ("spec", "spec.adjustmentInterval must be at most 1h in mode load"),
                (
                    "spec",
                    "spec.load.metricPullingInterval must be at most half of spec.adjustmentInterval",
                ),
                (
                    "spec.connector.decisionTimeout",
                    "spec.connector.decisionTimeout must be 1s to 24h",
                ),
                (
                    "spec.load.metricPullingInterval",
                    "spec.load.metricPullingInterval must be 100ms to 1m",
                ),
                (
                    "spec.bounds",
                    "spec.bounds.maxReplicas must be greater than or equal to spec.bounds.minReplicas",
                ),
                ("spec.bounds", "spec.bounds.prefill: its maxReplicas"),
                ("spec.bounds", "spec.bounds.decode: its maxReplicas"),
                (
                    "spec.bounds.maxGpuBudget",
                    "spec.bounds.maxGpuBudget must be -1 (no budget) or at least 1",
                ),
                (
                    "spec.profile",
                    "spec.profile must set exactly one of builtin or configMapRef",
                ),
                (
                    "spec.components",
                    "spec.components.prefill and spec.components.decode must name different components",
                ),
                (
                    "spec.connector",
                    "spec.connector.etcd.endpoints is required when spec.connector.type is virtual",
                ),
                (
                    "spec.connector",
                    "only allowed when spec.connector.type is virtual",
                ),
                (
                    "spec.load",
                    "spec.load.decodeKvScaleDownThreshold must be less than",
                ),
                (
                    "spec.load",
                    "spec.load.prefillQueueScaleDownThreshold must be less than",
                ),
            ],
        ),
        (
            "DynamoGraphDeployment",
            vec![
                (
                    "spec",
                    "at most one frontend in spec.components may set kvCacheTransferTopology",
                ),
                (
                    "spec",
                    "spec.topologyConstraint.clusterTopologyName is required when kvCacheTransferTopology has no label",
                ),
                (
                    "spec.components",
                    "spec.components[].name must be unique, ignoring case",
                ),
                (
                    "spec.components",
                    "at most one entry of spec.components may have type epp",
                ),
                (
                    "spec.components[]",
                    "kvCacheTransferTopology is allowed only on a component with type: frontend",
                ),
                (
                    "spec",
                    "set either spec.experimental.kvTransferPolicy or a frontend's kvCacheTransferTopology, not both",
                ),
                (
                    "spec.experimental.kvTransferPolicy",
                    "exactly one of labelKey or clusterTopologyName is required",
                ),
                (
                    "spec.experimental.kvTransferPolicy",
                    "preferredWeight is required when enforcement is preferred",
                ),
                (
                    "spec.experimental.kvTransferPolicy",
                    "preferredWeight may only be set when enforcement is preferred",
                ),
            ],
        ),
    ];
    for (kind, wanted) in expected {
        let crd = match kind {
            "PlannerPolicy" => PlannerPolicy::crd(),
            _ => DynamoGraphDeployment::crd(),
        };
        let rules = rules_of(&crd);
        for (path, message) in wanted {
            assert!(
                rules.iter().any(|(p, _, m)| p == path && m.contains(message)),
                "{kind}: no CEL rule at {path} with message containing {message:?}; rules: {rules:#?}"
            );
        }
        // Every rule explains itself: the message names a field.
        for (path, rule, message) in &rules {
            assert!(
                !message.is_empty(),
                "{kind}: rule {rule:?} at {path} has no message"
            );
        }
    }
}

#[test]
fn schema_enums_and_ranges_are_in_the_schema() {
    use kube::CustomResourceExt;
    use planner_api::{DynamoGraphDeployment, PlannerPolicy};

    let ppol = open_api_schema(&PlannerPolicy::crd());
    let spec = &ppol["properties"]["spec"]["properties"];
    assert_eq!(
        spec["mode"]["enum"],
        serde_json::json!(["sla", "load", "observe"])
    );
    assert_eq!(spec["mode"]["default"], "sla");
    assert_eq!(
        spec["predictor"]["properties"]["type"]["enum"],
        serde_json::json!(["constant", "arima", "kalman", "prophet"])
    );
    assert_eq!(
        spec["connector"]["properties"]["type"]["enum"],
        serde_json::json!(["kubernetes", "virtual"])
    );
    assert_eq!(spec["sla"]["properties"]["ttftMs"]["exclusiveMinimum"], true);
    assert_eq!(spec["bounds"]["properties"]["minReplicas"]["minimum"], 1.0);
    assert_eq!(spec["adjustmentInterval"]["default"], "180s");
    assert_eq!(
        spec["profile"]["properties"]["builtin"]["enum"],
        serde_json::json!(planner_api::BUILTIN_PROFILES)
    );

    let dgd = open_api_schema(&DynamoGraphDeployment::crd());
    let components = &dgd["properties"]["spec"]["properties"]["components"];
    assert_eq!(components["x-kubernetes-list-type"], "map");
    assert_eq!(
        components["x-kubernetes-list-map-keys"],
        serde_json::json!(["name"])
    );
    assert_eq!(components["maxItems"], 25);
    let topology = &components["items"]["properties"]["kvCacheTransferTopology"]["properties"];
    assert_eq!(
        topology["mismatchPolicy"]["enum"],
        serde_json::json!(["fail", "fallback"])
    );
    assert_eq!(topology["mismatchPolicy"]["default"], "fail");
    assert_eq!(topology["level"]["pattern"], planner_api::DOMAIN_PATTERN);
    assert_eq!(topology["kvTransferWeight"]["minimum"], 0.0);
    // NVIDIA's kvTransferPolicy, with its enforcement values and weight range.
    let policy = &dgd["properties"]["spec"]["properties"]["experimental"]["properties"]["kvTransferPolicy"];
    assert_eq!(
        policy["properties"]["enforcement"]["enum"],
        serde_json::json!(["required", "preferred"])
    );
    assert_eq!(policy["properties"]["enforcement"]["default"], "required");
    assert_eq!(
        (
            &policy["properties"]["preferredWeight"]["minimum"],
            &policy["properties"]["preferredWeight"]["maximum"]
        ),
        (&serde_json::json!(0.0), &serde_json::json!(1.0))
    );
    assert_eq!(policy["required"], serde_json::json!(["domain"]));
    assert_eq!(
        dgd["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"],
        true
    );
}

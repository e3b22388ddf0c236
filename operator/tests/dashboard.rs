//! The Grafana dashboard the Helm chart ships (`charts/planner-operator/dashboards/`) is valid
//! JSON and queries only metrics the operator exposes, under the names it exposes them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeSet;

use planner_operator::metrics::{operator::OperatorMetrics, policy::IntervalReport};
use serde_json::Value;

const DASHBOARD: &str = include_str!("../../charts/planner-operator/dashboards/planner-operator.json");

/// Every `planner_operator_*` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("planner_operator_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// The sample names the operator's /metrics serves, with one policy reported so that every
/// labelled family has a series.
fn exposed() -> BTreeSet<String> {
    let metrics = std::sync::Arc::new(OperatorMetrics::new());
    drop(metrics.reconcile_started("dgd"));
    metrics.reconcile_finished("dgd", Some("kube_api"));
    metrics.invalid_object("dgd");
    metrics.admission_review("PlannerPolicy", "allowed", 0.01);
    metrics.set_leader(true);
    metrics.set_webhook_certificate_expiry(1_900_000_000);
    metrics.policies.record(
        "llm",
        "llama-sla",
        &IntervalReport {
            desired: Some((2, 3)),
            current: Some((1, 1)),
            observed: Some([10.0, 3000.0, 300.0, 0.4, 0.03]),
            predicted: Some([11.0, 3000.0, 300.0]),
            correction: Some((1.1, 0.9)),
        },
    );
    metrics.policies.decision("llm", "llama-sla", true);
    metrics.policies.lateness(0.2);
    let text = metrics.encode().unwrap();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(String::from)
        .collect()
}

#[test]
fn the_dashboard_queries_only_metrics_the_operator_exposes() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is valid JSON");
    assert_eq!(dashboard["uid"], "planner-operator");
    let exposed = exposed();
    let used = metric_names(DASHBOARD);
    assert!(used.len() >= 15, "the dashboard uses only {used:?}");
    let unknown: Vec<&String> = used.iter().filter(|name| !exposed.contains(*name)).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries {unknown:?}, which /metrics does not serve; it serves {exposed:?}"
    );
}

#[test]
fn every_panel_has_a_query_and_a_description() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        assert!(
            panel["description"].as_str().is_some_and(|d| !d.is_empty()),
            "panel {} has no description",
            panel["title"]
        );
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", panel["title"]);
        for target in targets {
            assert!(target["expr"].as_str().is_some_and(|e| !e.is_empty()));
        }
    }
}

//! The Grafana dashboard the Helm chart ships (`charts/planner-operator/dashboards/`) is valid
//! JSON and queries only metrics the operator exposes, under the names it exposes them; and
//! `docs/observability.md`'s metrics table names every family the operator serves.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeSet;

use planner_operator::metrics::{
    budget::{BudgetGpus, MemberGpus},
    operator::OperatorMetrics,
    policy::{IntervalReport, ObservedFigures, SlaReport},
};
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

/// The operator's /metrics, with one policy and one budget reported so that every labelled
/// family has a series.
fn populated() -> String {
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
            interval_s: 60.0,
            desired: Some((2, 3)),
            current: Some((1, 1)),
            desired_gpus: Some(5),
            gpus_in_use: Some(2),
            observed: Some(ObservedFigures {
                requests: Some(10.0),
                isl: Some(3000.0),
                osl: Some(300.0),
                ttft_s: Some(0.4),
                itl_s: Some(0.03),
                ttft_percentile_s: Some(0.7),
                decode_kv_usage: Some(0.4),
                prefill_queue: Some(2.0),
            }),
            predicted: Some([11.0, 3000.0, 300.0]),
            correction: Some((1.1, 0.9)),
            uses_correction: true,
            sla: Some(SlaReport {
                ttft_s: 0.5,
                itl_s: 0.05,
                ttft_percentile: Some(90.0),
                attainment: (4, 3),
                met: Some(true),
            }),
            metrics_available: Some(true),
            limitation: Some(("MaxReplicas", true)),
        },
    );
    metrics
        .policies
        .of("llm", "llama-sla")
        .metrics_unavailable("http");
    metrics.budgets.record(
        "shared",
        &BudgetGpus {
            total: 8,
            members: vec![MemberGpus {
                namespace: "llm".into(),
                policy: "llama-sla".into(),
                asked: 6,
                granted: 5,
                held: 5,
            }],
            ..BudgetGpus::default()
        },
    );
    metrics.policies.decision("llm", "llama-sla", true);
    metrics.policies.lateness(0.2);
    metrics.encode().unwrap()
}

/// The sample names the operator's /metrics serves.
fn exposed() -> BTreeSet<String> {
    populated()
        .lines()
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
    assert!(used.len() >= 40, "the dashboard uses only {used:?}");
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

/// Every query of the dashboard: the panels' and the annotations'.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push((
                panel["title"].as_str().unwrap_or_default().to_string(),
                target["expr"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    for annotation in dashboard["annotations"]["list"].as_array().unwrap() {
        if let Some(expr) = annotation["expr"].as_str() {
            queries.push((format!("annotation {}", annotation["name"]), expr.to_string()));
        }
    }
    queries
}

/// The function whose argument `expr[at..]` is, if any (`rate` in `rate(x[5m])`).
fn enclosing_function(expr: &str, at: usize) -> Option<&str> {
    let mut depth = 0i32;
    for (i, c) in expr[..at].char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' if depth == 0 => {
                let head = &expr[..i];
                let start = head
                    .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .map_or(0, |p| p + 1);
                return Some(&head[start..]);
            }
            '(' => depth -= 1,
            _ => {}
        }
    }
    None
}

#[test]
fn counters_are_plotted_as_rates_and_requests_per_second() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).unwrap();
    for (title, expr) in queries(&dashboard) {
        let mut rest = 0;
        while let Some(found) = expr[rest..].find("planner_operator_") {
            let at = rest + found;
            let name: String = expr[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = at + name.len();
            if name.ends_with("_total") || name.ends_with("_bucket") {
                let function = enclosing_function(&expr, at);
                assert!(
                    matches!(function, Some("rate" | "increase" | "changes")),
                    "{title}: {name} is plotted as a count ({function:?}), not a rate: {expr}"
                );
            }
            // A request count per interval compares across policies only over the interval.
            if name.ends_with("_requests") && name != "planner_operator_observed_prefill_queue_requests" {
                assert!(
                    expr.contains("planner_operator_interval_seconds"),
                    "{title}: {name} is not divided by the interval: {expr}"
                );
            }
        }
    }
}

#[test]
fn ttft_and_itl_have_panels_of_their_own_with_their_targets() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).unwrap();
    let exprs = |panel: &Value| -> String {
        panel["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["expr"].as_str())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let panels = dashboard["panels"].as_array().unwrap();
    for (observed, target, other) in [
        ("observed_ttft_seconds", "ttft_target_seconds", "itl"),
        ("observed_itl_seconds", "itl_target_seconds", "ttft"),
    ] {
        let panel = panels
            .iter()
            .find(|p| exprs(p).contains(observed))
            .unwrap_or_else(|| panic!("no panel plots {observed}"));
        let all = exprs(panel);
        assert!(all.contains(target), "{} has no {target} line", panel["title"]);
        assert!(!all.contains(other), "{} mixes in {other}: {all}", panel["title"]);
        assert_eq!(panel["fieldConfig"]["defaults"]["unit"], "s");
    }
    let attainment = panels
        .iter()
        .find(|p| exprs(p).contains("planner_operator_sla_attainment_ratio"))
        .expect("an SLA attainment panel");
    assert_eq!(attainment["fieldConfig"]["defaults"]["unit"], "percentunit");
}

#[test]
fn scale_decisions_are_annotations() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).unwrap();
    let scaled: Vec<&Value> = dashboard["annotations"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| {
            a["expr"]
                .as_str()
                .is_some_and(|e| e.contains("planner_operator_scaling_decisions_total"))
        })
        .collect();
    assert_eq!(scaled.len(), 1, "one annotation of the decision counter");
    let annotation = scaled[0];
    assert_eq!(annotation["enable"], true);
    assert_eq!(annotation["datasource"]["uid"], "${datasource}");
    let expr = annotation["expr"].as_str().unwrap();
    assert!(expr.contains("changes(") && expr.ends_with("> 0"), "{expr}");
    for label in ["direction", "policy"] {
        assert!(
            annotation["titleFormat"]
                .as_str()
                .unwrap_or_default()
                .contains(label)
                || annotation["textFormat"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(label),
            "the annotation does not say its {label}"
        );
    }
}

/// The families /metrics serves, by their sample names (counters end in `_total`, info
/// metrics in `_info`).
fn families() -> BTreeSet<String> {
    populated()
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .map(|rest| {
            let (name, kind) = rest.split_once(' ').unwrap();
            match kind {
                "counter" => format!("{name}_total"),
                "info" => format!("{name}_info"),
                _ => name.to_string(),
            }
        })
        .collect()
}

#[test]
fn the_docs_metrics_table_names_every_family_served_and_nothing_else() {
    let served = families();
    assert!(served.len() >= 45, "only {served:?}");
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/observability.md")).unwrap();
    let section = docs.split("\n## Metrics\n").nth(1).expect("a Metrics section");
    let section = section.split("\n## ").next().unwrap_or_default();
    let documented: BTreeSet<String> = section
        .lines()
        .filter_map(|line| line.strip_prefix("| `planner_operator_"))
        .filter_map(|rest| rest.split('`').next())
        .map(|name| format!("planner_operator_{name}"))
        .collect();
    let undocumented: Vec<&String> = served.difference(&documented).collect();
    let stale: Vec<&String> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "served but not in docs/observability.md: {undocumented:?}; documented but not served: {stale:?}"
    );
}

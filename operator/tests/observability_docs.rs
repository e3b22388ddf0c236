//! `docs/observability.md` lists every reason a condition can carry: this test reads them from
//! the code and fails when the docs and the code disagree, either way (its metrics table is
//! checked by `dashboard.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use planner_core::policy::{LimitReason, MetricsState};
use regex::Regex;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn docs() -> String {
    std::fs::read_to_string(repo().join("docs/observability.md")).unwrap()
}

/// The rows of the table under the heading `## {heading}`, as cells (backticks removed).
fn table(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let start = doc
        .find(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading}"));
    let section = &doc[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |end| end + 3)];
    section
        .lines()
        .filter(|line| line.starts_with('|') && !line.starts_with("|---"))
        .skip(1)
        .map(|line| {
            line.trim_matches('|')
                .split(" | ")
                .map(|cell| cell.trim().replace('`', ""))
                .collect()
        })
        .collect()
}

/// Rust sources under `dir`, test modules and files left out.
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && path.file_name().is_some_and(|n| n != "tests.rs")
            {
                let text = std::fs::read_to_string(&path).unwrap();
                // Test modules sit at the end of their file.
                let code = text
                    .split("\n#[cfg(test)]\nmod tests")
                    .next()
                    .unwrap_or_default()
                    .to_string();
                files.push((path, code));
            }
        }
    }
    files
}

/// What the code sets conditions with: (condition types, reasons), each reason with where it
/// was found.
fn code_conditions() -> (BTreeSet<String>, BTreeMap<String, String>) {
    let files: Vec<(PathBuf, String)> = [
        repo().join("operator/src"),
        repo().join("crates/planner-core/src"),
    ]
    .iter()
    .flat_map(|dir| sources(dir))
    .collect();
    let consts: BTreeMap<String, String> = {
        let re = Regex::new(r#"const ([A-Z_]+): &str = "([A-Za-z]+)";"#).unwrap();
        files
            .iter()
            .flat_map(|(_, code)| {
                re.captures_iter(code)
                    .map(|c| (c[1].to_string(), c[2].to_string()))
            })
            .collect()
    };
    let camel = |s: &str| {
        s.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            && s.chars().all(|c| c.is_ascii_alphanumeric())
    };
    let mut types = BTreeSet::new();
    let mut reasons = BTreeMap::new();
    let condition = Regex::new(
        r#"DesiredCondition::(?:met|unmet|unknown)\(\s*([A-Z_]+|"[A-Za-z]+"),\s*([A-Z_]+|"[A-Za-z]+")?"#,
    )
    .unwrap();
    let reason_fn = Regex::new(r"fn reason\(&self\) -> &'static str \{").unwrap();
    let literal = Regex::new(r#""([A-Za-z]+)""#).unwrap();
    let field = Regex::new(r#"reason: "([A-Za-z]+)","#).unwrap();
    let invalid = Regex::new(r#"status::invalid\([^;]*?"([A-Za-z]+)""#).unwrap();
    for (path, code) in &files {
        let at = path.strip_prefix(repo()).unwrap_or(path).display().to_string();
        let resolve = |token: &str| {
            token
                .strip_prefix('"')
                .map(|t| t.trim_end_matches('"').to_string())
                .or_else(|| consts.get(token).cloned())
        };
        for found in condition.captures_iter(code) {
            types.insert(resolve(&found[1]).unwrap_or_else(|| panic!("{at}: condition type {}", &found[1])));
            if let Some(reason) = found.get(2).and_then(|r| resolve(r.as_str())) {
                reasons.insert(reason, at.clone());
            }
        }
        for start in reason_fn.find_iter(code) {
            // The function's body: up to its closing brace at the indentation it opened with.
            let body = &code[start.end()..];
            let end = body.find("\n    }\n").unwrap_or(body.len());
            for found in literal.captures_iter(&body[..end]) {
                if camel(&found[1]) {
                    reasons.insert(found[1].to_string(), at.clone());
                }
            }
        }
        for found in field.captures_iter(code).chain(invalid.captures_iter(code)) {
            reasons.insert(found[1].to_string(), at.clone());
        }
    }
    // The planning loop's own enumerations, read from the code rather than its text.
    for reason in LimitReason::ALL {
        reasons.insert(reason.as_str().into(), "LimitReason::ALL".into());
    }
    for state in [
        MetricsState::Observed,
        MetricsState::Unavailable {
            reason: String::new(),
        },
        MetricsState::NoTraffic,
        MetricsState::AwaitingTraffic {
            reason: String::new(),
        },
        MetricsState::NoSamples,
    ] {
        reasons.insert(state.reason().into(), "MetricsState::reason".into());
    }
    (types, reasons)
}

#[test]
fn the_conditions_table_has_every_reason_the_code_sets_and_no_other() {
    let rows = table(&docs(), "Conditions");
    assert!(rows.iter().all(|row| row.len() == 5), "rows of 5 cells: {rows:?}");
    let documented_types: BTreeSet<String> = rows.iter().map(|row| row[1].clone()).collect();
    let documented: BTreeSet<String> = rows
        .iter()
        .map(|row| row[3].clone())
        .filter(|reason| !reason.contains(' '))
        .collect();
    let (types, reasons) = code_conditions();
    assert!(reasons.len() >= 40, "found only {reasons:?}");
    let missing_types: Vec<&String> = types.difference(&documented_types).collect();
    assert!(
        missing_types.is_empty(),
        "condition types not in the table: {missing_types:?}"
    );
    let missing: Vec<String> = reasons
        .iter()
        .filter(|(reason, _)| !documented.contains(*reason))
        .map(|(reason, at)| format!("{reason} ({at})"))
        .collect();
    assert!(
        missing.is_empty(),
        "reasons the code sets that docs/observability.md lacks: {missing:?}"
    );
    // And the other way: a reason the table lists must still be set somewhere.
    let stale: Vec<&String> = documented.iter().filter(|r| !reasons.contains_key(*r)).collect();
    assert!(
        stale.is_empty(),
        "reasons in the table the code no longer sets: {stale:?}"
    );
}

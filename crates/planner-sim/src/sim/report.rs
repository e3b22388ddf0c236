//! Comparison tables (plain text for the terminal, Markdown for the benchmark report).

use std::fmt::Write as _;

use planner_core::sla::SlaTargets;

use super::run::RunResult;

/// First line of the per-interval CSV.
pub const INTERVALS_CSV_HEADER: &str = "trace,k,policy,start_s,arrivals,mean_isl,mean_osl,prefill,decode,prefill_serving,decode_serving,gpus,ttft_ms,itl_ms,meets,delay_s\n";

/// Appends one CSV row per policy and interval of one (trace, rate scale, scale-up delay)
/// comparison: `meets` is 1 or 0, empty for an interval without arrivals.
pub fn intervals_csv(
    out: &mut String,
    trace: &str,
    k: &str,
    delay_s: f64,
    sla: &SlaTargets,
    results: &[RunResult],
) {
    for r in results {
        for i in &r.intervals {
            let meets = match i.meets(sla) {
                Some(true) => "1",
                Some(false) => "0",
                None => "",
            };
            let _ = writeln!(
                out,
                "{trace},{k},{},{},{},{:.1},{:.1},{:.3},{:.3},{:.3},{:.3},{:.3},{:.1},{:.2},{meets},{delay_s}",
                r.policy,
                i.start_s,
                i.arrivals,
                i.mean_isl,
                i.mean_osl,
                i.prefill,
                i.decode,
                i.prefill_serving,
                i.decode_serving,
                i.gpus,
                i.ttft_ms,
                i.itl_ms,
            );
        }
    }
}

/// Column headers.
const HEADERS: [&str; 14] = [
    "policy",
    "GPU-h",
    "vs oracle",
    "intervals OK",
    "requests OK",
    "TTFT OK",
    "ITL OK",
    "p90 intervals OK",
    "mean TTFT ms",
    "p90 TTFT ms",
    "p95 TTFT ms",
    "mean ITL ms",
    "actions",
    "max P/D",
];

fn percent(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn number(x: f64, decimals: usize) -> String {
    if x.is_finite() {
        format!("{x:.decimals$}")
    } else if x.is_nan() {
        "-".into()
    } else {
        "inf".into()
    }
}

/// A share in whole percent, with one decimal where rounding would hide which side of a bar
/// it is on: within a point of the scorecard's 95 %, and just under 100 % or over 0 %
/// (`94.9%`, `99.6%`, `0.4%`, not `95%`, `100%`, `0%`).
pub fn share(x: f64) -> String {
    let p = x * 100.0;
    if !p.is_finite() {
        "-".into()
    } else if (p - 95.0).abs() < 1.0 || (99.5..100.0).contains(&p) || (p > 0.0 && p < 0.5) {
        format!("{p:.1}%")
    } else {
        format!("{p:.0}%")
    }
}

/// A cost ratio with two decimals, three within half a hundredth of the scorecard's 1.3x
/// (`1.303x`, not `1.30x`, which would read as meeting it).
pub fn ratio(x: f64) -> String {
    if !x.is_finite() {
        "-".into()
    } else if (x - 1.3).abs() < 0.005 && (x - 1.3).abs() > 1e-9 {
        format!("{x:.3}x")
    } else {
        format!("{x:.2}x")
    }
}

/// A table's rows: each policy's name and cells.
pub type Rows<C> = Vec<(String, C)>;

/// The rows left out of a table, each with the earlier row it repeats.
pub type Same = Vec<(String, String)>;

/// The rows of a table with every row whose cells all equal an earlier row's left out (shown
/// once), and the rows left out, each with the earlier row it repeats.
pub fn collapse<C: PartialEq>(rows: Rows<C>) -> (Rows<C>, Same) {
    let mut kept: Vec<(String, C)> = Vec::new();
    let mut same = Vec::new();
    for (name, cells) in rows {
        match kept.iter().find(|(_, k)| *k == cells) {
            Some((first, _)) => same.push((name, first.clone())),
            None => kept.push((name, cells)),
        }
    }
    (kept, same)
}

/// The line under a table that says which rows were left out as the same as another.
pub fn same_note(same: &[(String, String)]) -> String {
    if same.is_empty() {
        return String::new();
    }
    let list: Vec<String> = same
        .iter()
        .map(|(name, first)| format!("`{name}` (same as `{first}`)"))
        .collect();
    format!(
        "\nRows shown once, the same in every column: {}.\n",
        list.join(", ")
    )
}

/// One row of cells per result; GPU-hours relative to the run named `oracle`.
pub fn rows(results: &[RunResult]) -> Vec<[String; 14]> {
    rows_against(results, "oracle")
}

/// One row of cells per result; GPU-hours relative to the run named `reference`.
fn rows_against(results: &[RunResult], reference: &str) -> Vec<[String; 14]> {
    let oracle = results
        .iter()
        .find(|r| r.policy == reference)
        .map(|r| r.summary.gpu_hours);
    results
        .iter()
        .map(|r| {
            let s = &r.summary;
            let relative = match oracle {
                Some(o) if o > 0.0 => ratio(s.gpu_hours / o),
                _ => "-".into(),
            };
            [
                r.policy.clone(),
                number(s.gpu_hours, 2),
                relative,
                percent(s.interval_attainment()),
                percent(s.request_attainment()),
                percent(s.ttft_attainment()),
                percent(s.itl_attainment()),
                percent(s.interval_p90_attainment()),
                number(s.mean_ttft_ms, 0),
                number(s.p90_ttft_ms, 0),
                number(s.p95_ttft_ms, 0),
                number(s.mean_itl_ms, 1),
                s.scaling_actions.to_string(),
                format!("{}/{}", s.max_prefill, s.max_decode),
            ]
        })
        .collect()
}

/// An aligned plain-text table.
pub fn text_table(results: &[RunResult]) -> String {
    text_table_against(results, "oracle")
}

/// An aligned plain-text table with GPU-hours relative to the run named `reference`.
pub fn text_table_against(results: &[RunResult], reference: &str) -> String {
    let rows = rows_against(results, reference);
    let versus = format!("vs {reference}");
    let mut headers: [&str; 14] = HEADERS;
    headers[2] = &versus;
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, w))| {
                if i == 0 {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    out.push_str(&line(
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect(),
    ));
    for row in &rows {
        out.push('\n');
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out.push('\n');
    out
}

/// A Markdown table.
pub fn markdown_table(results: &[RunResult]) -> String {
    markdown_table_against(results, "oracle")
}

/// A Markdown table with GPU-hours relative to the run named `reference`; a row the same as
/// an earlier one in every column is shown once (said under the table).
pub fn markdown_table_against(results: &[RunResult], reference: &str) -> String {
    let mut headers: [&str; 14] = HEADERS;
    let versus = format!("vs {reference}");
    headers[2] = &versus;
    let mut out = format!("| {} |\n", headers.join(" | "));
    out.push('|');
    for (i, _) in HEADERS.iter().enumerate() {
        out.push_str(if i == 0 { "---|" } else { "---:|" });
    }
    out.push('\n');
    let rows = rows_against(results, reference)
        .into_iter()
        .map(|[policy, rest @ ..]| (policy, rest))
        .collect();
    let (kept, same) = collapse(rows);
    for (policy, cells) in kept {
        out.push_str(&format!("| {policy} | {} |\n", cells.join(" | ")));
    }
    out.push_str(&same_note(&same));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::sim::run::Summary;

    fn result(policy: &str, gpu_hours: f64) -> RunResult {
        RunResult {
            policy: policy.into(),
            intervals: Vec::new(),
            summary: Summary {
                gpu_hours,
                intervals: 4,
                intervals_meeting: 3,
                requests: 10,
                requests_meeting_ttft: 9,
                requests_meeting_itl: 10,
                requests_meeting_both: 9,
                requests_unfinished: 0,
                scaling_actions: 2,
                max_prefill: 3,
                max_decode: 5,
                mean_ttft_ms: 120.4,
                p90_ttft_ms: 300.0,
                p95_ttft_ms: f64::INFINITY,
                intervals_meeting_p90: 2,
                mean_itl_ms: f64::NAN,
            },
            initial: (1, 1),
            decisions: Vec::new(),
        }
    }

    #[test]
    fn rows_the_same_in_every_column_are_shown_once() {
        let mut twin = result("upstream-arima-nocorr", 3.0);
        twin.summary.scaling_actions = 2;
        let mut near = result("upstream-kalman", 3.0);
        near.summary.scaling_actions = 3;
        let results = [result("oracle", 2.0), result("upstream-arima", 3.0), twin, near];
        let md = markdown_table(&results);
        assert!(md.contains("| upstream-arima |"), "{md}");
        assert!(!md.contains("| upstream-arima-nocorr |"), "{md}");
        // One column apart: its own row.
        assert!(md.contains("| upstream-kalman |"), "{md}");
        assert!(
            md.ends_with(
                "\nRows shown once, the same in every column: `upstream-arima-nocorr` (same as `upstream-arima`).\n"
            ),
            "{md}"
        );
        let (kept, same) = collapse(vec![
            ("a".to_string(), [1, 2]),
            ("b".to_string(), [1, 3]),
            ("c".to_string(), [1, 2]),
            ("d".to_string(), [1, 3]),
        ]);
        assert_eq!(
            kept.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(same, [("c".into(), "a".into()), ("d".into(), "b".into())]);
        assert!(same_note(&[]).is_empty());
    }

    #[test]
    fn shares_and_ratios_near_a_bar_keep_a_decimal() {
        assert_eq!(share(0.9492), "94.9%");
        assert_eq!(share(0.9508), "95.1%");
        assert_eq!(share(0.95), "95.0%");
        assert_eq!(share(0.83), "83%");
        assert_eq!(share(0.9966), "99.7%");
        assert_eq!(share(1.0), "100%");
        assert_eq!(share(0.004), "0.4%");
        assert_eq!(share(0.0), "0%");
        assert_eq!(ratio(1.303), "1.303x");
        assert_eq!(ratio(1.297), "1.297x");
        assert_eq!(ratio(1.3), "1.30x");
        assert_eq!(ratio(1.27), "1.27x");
        assert_eq!(ratio(f64::NAN), "-");
    }

    #[test]
    fn tables_show_ratios_and_attainment() {
        let results = [result("oracle", 2.0), result("hpa", 3.0)];
        let text = text_table(&results);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[3].starts_with("hpa"), "{text}");
        assert!(lines[3].contains("1.50x") && lines[3].contains("75.0%") && lines[3].contains("3/5"));
        assert!(lines[3].contains("inf") && lines[3].contains(" -"), "{text}");
        let md = markdown_table(&results);
        assert!(md.starts_with("| policy | GPU-h |"));
        assert!(
            md.contains(
                "| oracle | 2.00 | 1.00x | 75.0% | 90.0% | 90.0% | 100.0% | 50.0% | 120 | 300 | inf | - | 2 | 3/5 |"
            ),
            "{md}"
        );
    }
}

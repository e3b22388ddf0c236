//! `docs/planner.md`'s table of `planner-operator run`'s flags is the one the flags themselves
//! give: run with `UPDATE_DOCS=1` to rewrite it after changing a flag.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

const START: &str = "<!-- flags: generated from `planner-operator run`'s flags; UPDATE_DOCS=1 cargo test -p planner-operator --test docs_flags -->\n";
const END: &str = "<!-- flags: end -->";

#[test]
fn the_flags_table_is_the_flags() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/planner.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text
        .find(START)
        .expect("docs/planner.md has the flags start marker")
        + START.len();
    let end = text[start..]
        .find(END)
        .expect("docs/planner.md has the flags end marker")
        + start;
    let table = planner_operator::cli::run_flags_markdown();
    assert!(
        table.contains("| `--topology-env` (`TOPOLOGY_ENV`) | `dynamo` |"),
        "{table}"
    );
    if text[start..end] == table {
        return;
    }
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, format!("{}{table}{}", &text[..start], &text[end..])).unwrap();
        return;
    }
    panic!(
        "docs/planner.md's flags table is stale; run `UPDATE_DOCS=1 cargo test -p planner-operator --test docs_flags`.\nexpected:\n{table}"
    );
}

//! Writes every CRD of planner-operator as YAML, generated from the Rust types.
//!
//! `crd-gen` writes to `config/crd/` and the chart, `charts/planner-operator/crds/` (the DGD CRD to
//! `charts/planner-operator/files/crds/`, installed only on request; see
//! `planner_api::chart_crd_dir`), and the API reference pages of this project's own CRDs to
//! `docs/reference/` (run from the repository root, or pass the root as the only argument);
//! `crd-gen --check` writes nothing and exits 1 when a committed file differs from what would be
//! written.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use planner_api::{
    chart_crd_dir, crd_manifests,
    reference::{REFERENCE_DIR, reference_pages},
};

/// The chart's folder, relative to the repository root.
const CHART: &str = "charts/planner-operator";

fn main() -> ExitCode {
    let mut check = false;
    let mut root = PathBuf::from(".");
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--check" => check = true,
            "-h" | "--help" => {
                println!("usage: crd-gen [--check] [REPO_ROOT]");
                return ExitCode::SUCCESS;
            }
            other => root = PathBuf::from(other),
        }
    }
    match run(&root, check) {
        Ok(stale) if stale.is_empty() => ExitCode::SUCCESS,
        Ok(stale) => {
            for path in stale {
                eprintln!(
                    "stale: {} differs from the Rust types; run `make manifests`",
                    path.display()
                );
            }
            ExitCode::FAILURE
        }
        Err(message) => {
            eprintln!("crd-gen: {message}");
            ExitCode::from(2)
        }
    }
}

/// Writes (or, with `check`, compares) every manifest and reference page; returns the files that
/// were stale.
fn run(root: &Path, check: bool) -> Result<Vec<PathBuf>, String> {
    let manifests = crd_manifests().map_err(|e| format!("cannot render the CRDs: {e}"))?;
    let mut files = Vec::new();
    for chart in [false, true] {
        for (file_name, yaml) in &manifests {
            let dir = if chart {
                root.join(CHART).join(chart_crd_dir(file_name))
            } else {
                root.join("config/crd")
            };
            files.push((dir.join(file_name), yaml.clone()));
        }
    }
    for (file_name, markdown) in reference_pages() {
        files.push((root.join(REFERENCE_DIR).join(file_name), markdown));
    }
    let mut stale = Vec::new();
    for (path, text) in files {
        let current = std::fs::read_to_string(&path).ok();
        if current.as_deref() == Some(text.as_str()) {
            continue;
        }
        if check {
            stale.push(path);
            continue;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_reference_field_fails_the_check() {
        let root = std::env::temp_dir().join(format!("crd-gen-check-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(run(&root, false).unwrap().len(), 0);
        assert_eq!(run(&root, true).unwrap(), Vec::<PathBuf>::new());
        // A field's description edited by hand (or left behind by a change to the Rust type).
        let page = root.join(REFERENCE_DIR).join("plannerpolicy.md");
        let text = std::fs::read_to_string(&page).unwrap();
        let edited = text.replacen("| `180s` |", "| `60s` |", 1);
        assert_ne!(edited, text);
        std::fs::write(&page, edited).unwrap();
        assert_eq!(run(&root, true).unwrap(), vec![page]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}

//! Writes every CRD of planner-operator as YAML, generated from the Rust types.
//!
//! `crd-gen` writes to `config/crd/` and the chart, `charts/planner-operator/crds/` (the DGD CRD to
//! `charts/planner-operator/files/crds/`, installed only on request; see
//! `planner_api::chart_crd_dir`) (run from the repository root, or pass the root as the only
//! argument); `crd-gen --check` writes nothing and exits 1 when
//! a committed file differs from what would be written.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use planner_api::{chart_crd_dir, crd_manifests};

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

/// Writes (or, with `check`, compares) every manifest; returns the files that were stale.
fn run(root: &Path, check: bool) -> Result<Vec<PathBuf>, String> {
    let manifests = crd_manifests().map_err(|e| format!("cannot render the CRDs: {e}"))?;
    let mut stale = Vec::new();
    for chart in [false, true] {
        for (file_name, yaml) in &manifests {
            let dir = if chart {
                root.join(CHART).join(chart_crd_dir(file_name))
            } else {
                root.join("config/crd")
            };
            if !check {
                std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            let path = dir.join(file_name);
            let current = std::fs::read_to_string(&path).ok();
            if current.as_deref() == Some(yaml.as_str()) {
                continue;
            }
            if check {
                stale.push(path);
            } else {
                std::fs::write(&path, yaml).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                println!("wrote {}", path.display());
            }
        }
    }
    Ok(stale)
}

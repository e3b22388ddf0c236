//! The committed CRD manifests are exactly what the Rust types generate.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::Path;

use planner_api::{chart_crd_dir, crd_manifests};

#[test]
fn committed_crds_match_the_rust_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifests = crd_manifests().expect("CRDs render");
    let mut stale = Vec::new();
    let in_chart = |name: &str, dir: &str| format!("charts/planner-operator/{}", chart_crd_dir(name)) == dir;
    for dir in [
        "config/crd",
        "charts/planner-operator/crds",
        "charts/planner-operator/files/crds",
    ] {
        let generated: Vec<&str> = manifests
            .iter()
            .map(|(name, _)| name.as_str())
            .filter(|name| dir == "config/crd" || in_chart(name, dir))
            .collect();
        for (file_name, yaml) in manifests
            .iter()
            .filter(|(name, _)| generated.contains(&name.as_str()))
        {
            let path = root.join(dir).join(file_name);
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            if committed != *yaml {
                stale.push(path.display().to_string());
            }
        }
        // No CRD file that the types no longer generate (or that belongs in the other folder).
        for entry in std::fs::read_dir(root.join(dir)).expect("manifest folder exists") {
            let name = entry.expect("entry").file_name().to_string_lossy().into_owned();
            if name.ends_with(".yaml") && !generated.contains(&name.as_str()) {
                stale.push(format!("{dir}/{name} (no longer generated)"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated manifests, run `make manifests`: {stale:#?}"
    );
}

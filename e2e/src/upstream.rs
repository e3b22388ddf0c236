//! NVIDIA's and Grove's real CRDs and example graphs, read from `../shared/upstream/` beside the
//! repository (copied verbatim from ai-dynamo/dynamo and ai-dynamo/grove; its README names each
//! file's commit). Nothing here is a copy: the tests apply those files, changing only what a test
//! harness must (see [`NvidiaCrds`]).

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::{Result, load_yaml, repo_root};

/// `../shared/upstream/`, resolved from the repository root.
pub fn dir() -> PathBuf {
    repo_root().join("../shared/upstream")
}

/// A file under [`dir`]; an error that says where the files are expected when it is missing.
pub fn path(relative: &str) -> Result<PathBuf> {
    let path = dir().join(relative);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found: the e2e tests apply NVIDIA's and Grove's real CRDs and examples from ../shared/upstream/ beside the repository",
            path.display()
        )
        .into())
    }
}

/// The one document of a YAML file under [`dir`].
pub fn one(relative: &str) -> Result<Value> {
    let [object] = load_yaml(&path(relative)?)?
        .try_into()
        .map_err(|_| format!("{relative}: expected one YAML document"))?;
    Ok(object)
}

/// An example graph of `examples/` (e.g. `vllm-disagg.v1beta1.yaml`).
pub fn example(file: &str) -> Result<Value> {
    one(&format!("examples/{file}"))
}

/// Today's Grove topology CRD: `ClusterTopologyBinding` (Grove v0.1.0-alpha.9 and later, commit
/// fcc3b3bb).
pub fn grove_crds() -> Result<Vec<PathBuf>> {
    Ok(vec![path("grove/grove.io_clustertopologybindings.yaml")?])
}

/// The `ClusterTopology` CRD of Grove v0.1.0-alpha.8, the last release that served it (in place
/// of the binding: both claim the short name `ct`, and no Grove release served both).
pub fn grove_legacy_crd() -> Result<PathBuf> {
    path("grove/grove.io_clustertopologies.v0.1.0-alpha.8.yaml")
}

/// Name of Grove's ClusterTopologyBinding CRD.
pub const BINDING_CRD: &str = "clustertopologybindings.grove.io";
/// Name of the ClusterTopology CRD of Grove up to v0.1.0-alpha.8.
pub const LEGACY_TOPOLOGY_CRD: &str = "clustertopologies.grove.io";

/// Name of NVIDIA's DGD CRD.
pub const DGD_CRD: &str = "dynamographdeployments.nvidia.com";
/// Name of NVIDIA's scaling adapter CRD.
pub const ADAPTER_CRD: &str = "dynamographdeploymentscalingadapters.nvidia.com";

/// Which generation of NVIDIA's DGD and DGDSA CRDs to install.
#[derive(Debug, Clone)]
pub enum NvidiaCrds {
    /// Dynamo's current CRDs (commit 2a6da14c): v1alpha1 and v1beta1 served, v1beta1 stored,
    /// `conversion: Webhook` to NVIDIA's operator. Installed exactly as they are: a test that
    /// writes and reads at v1beta1 only never calls the conversion webhook, so none is needed.
    Current,
    /// Dynamo up to 1.1 (commit 8c0b50d8): v1alpha1 only, no conversion. Installed as they are.
    V1alpha1Only,
    /// Dynamo 1.2 to 1.4 served both versions with v1alpha1 stored. The current files with two
    /// changes by the test harness: the conversion webhook's `clientConfig` points at the
    /// stand-in conversion webhook of the test process (`url`, `ca_bundle` base64 PEM), and the
    /// storage flag is on v1alpha1. So a graph written at v1alpha1 and read at v1beta1 goes
    /// through a conversion webhook, as it does on such a cluster.
    StoredAtV1alpha1 {
        /// The stand-in's `/convert` URL.
        url: String,
        /// Its CA, base64-encoded PEM.
        ca_bundle: String,
    },
}

impl NvidiaCrds {
    /// The DGD and DGDSA CRDs, as `(where from, object)`.
    pub fn objects(&self) -> Result<Vec<(String, Value)>> {
        let files = match self {
            Self::Current | Self::StoredAtV1alpha1 { .. } => [
                "crds/nvidia.com_dynamographdeployments.yaml",
                "crds/nvidia.com_dynamographdeploymentscalingadapters.yaml",
            ],
            Self::V1alpha1Only => [
                "crds/legacy-v1alpha1-only/nvidia.com_dynamographdeployments.yaml",
                "crds/legacy-v1alpha1-only/nvidia.com_dynamographdeploymentscalingadapters.yaml",
            ],
        };
        let mut crds = Vec::new();
        for file in files {
            let mut crd = one(file)?;
            if let Self::StoredAtV1alpha1 { url, ca_bundle } = self {
                crd["spec"]["conversion"]["webhook"]["clientConfig"] =
                    json!({"url": url, "caBundle": ca_bundle});
                for version in crd["spec"]["versions"].as_array_mut().into_iter().flatten() {
                    version["storage"] = json!(version["name"] == "v1alpha1");
                }
            }
            crds.push((file.to_string(), crd));
        }
        Ok(crds)
    }
}

//! The released Dynamo runtime's own topology reader
//! (`dynamo.common.utils.topology.read_topology_config` of PyPI `ai-dynamo`, the version
//! `make dynamo` installs), run on what a worker container of a real pod gets: its environment
//! and the files of its Downward API volumes, written as the kubelet writes them.
//!
//! What stands in for the kubelet, and why: the test cluster's pods run on kwok, which starts no
//! containers and mounts no volumes. [`ContainerView::of`] resolves the main container's env
//! (plain values, and `fieldRef`s to the pod's metadata) and each Downward API volume mounted in
//! it (`metadata.labels['...']` and `metadata.annotations['...']` items; a label the pod lacks is
//! an empty file, as the kubelet writes it), from the pod as the API server holds it.
//! [`ContainerView::write`] lays the files out as the kubelet's atomic writer does (a
//! `..<timestamp>` directory, `..data` pointing to it, one symlink per item). The reader runs in a
//! process of its own with exactly that environment; its paths are the container's, so the
//! mount path it reads (`DYN_TOPOLOGY_MOUNT_PATH`, or the reader's own default) is looked up
//! under the directory the files were written to, the one translation this harness makes.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::Value;

use crate::Result;

/// Environment variable naming the python of `make dynamo`'s environment (`tools/e2e.sh` sets it
/// from `tools/env.sh`'s `dynamo_python`).
pub const PYTHON_ENV: &str = "DYNAMO_PYTHON";

/// Longest wait of the reader for the transfer-domain file (its own default is 30 s; the files
/// are written before it starts, so it never waits).
const POLL_TIMEOUT_S: f64 = 5.0;

/// Runs the reader with the container's env (translated as the module documentation says) and
/// prints its result as JSON.
const READER: &str = r#"
import dataclasses, json, os, sys
from dynamo.common.utils import topology
root = sys.argv[1]
variable = "DYN_TOPOLOGY_MOUNT_PATH"
if variable in os.environ:
    os.environ[variable] = root + os.environ[variable]
else:
    topology._DEFAULT_MOUNT_PATH = root + topology._DEFAULT_MOUNT_PATH
config = topology.read_topology_config(poll_interval=0.2, poll_timeout=float(sys.argv[2]))
print(json.dumps(dataclasses.asdict(config)))
"#;

/// What the main container of a pod sees: its environment and the files of its Downward API
/// volumes, by mount path.
#[derive(Debug, Clone, Default)]
pub struct ContainerView {
    /// Name and value of each env var, in order.
    pub env: Vec<(String, String)>,
    /// Mount path → file name → content.
    pub files: BTreeMap<String, BTreeMap<String, String>>,
}

/// What the reader made of it.
#[derive(Debug, Clone)]
pub struct ReaderOutcome {
    /// The process's exit code (`None`: killed).
    pub code: Option<i32>,
    /// The `TopologyConfig` it returned, as JSON (on success).
    pub config: Option<Value>,
    /// Its log.
    pub stderr: String,
}

impl ReaderOutcome {
    /// Whether the runtime would start: the reader returned.
    pub fn started(&self) -> bool {
        self.code == Some(0) && self.config.is_some()
    }
}

/// A `fieldRef` path's value from the pod's metadata: `metadata.labels['k']`,
/// `metadata.annotations['k']`, `metadata.name`, `metadata.namespace` (an absent key is empty).
fn field(pod: &Pod, path: &str) -> Result<String> {
    let meta = &pod.metadata;
    let key = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix("']"))
            .map(String::from)
    };
    if let Some(label) = key("metadata.labels['") {
        return Ok(meta
            .labels
            .as_ref()
            .and_then(|l| l.get(&label))
            .cloned()
            .unwrap_or_default());
    }
    if let Some(annotation) = key("metadata.annotations['") {
        return Ok(meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(&annotation))
            .cloned()
            .unwrap_or_default());
    }
    match path {
        "metadata.name" => Ok(meta.name.clone().unwrap_or_default()),
        "metadata.namespace" => Ok(meta.namespace.clone().unwrap_or_default()),
        other => Err(format!("fieldRef {other:?} is not resolved by this harness").into()),
    }
}

impl ContainerView {
    /// The view of container `name` of `pod`.
    pub fn of(pod: &Pod, name: &str) -> Result<Self> {
        let spec = pod.spec.as_ref().ok_or("pod without spec")?;
        let container: &Container = spec
            .containers
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| format!("pod has no container {name:?}"))?;
        let mut view = Self::default();
        for var in container.env.iter().flatten() {
            let value = match (&var.value, &var.value_from) {
                (Some(value), _) => value.clone(),
                (None, Some(from)) => match &from.field_ref {
                    Some(field_ref) => field(pod, &field_ref.field_path)?,
                    None => {
                        return Err(format!(
                            "env {} comes from a source this harness does not resolve",
                            var.name
                        )
                        .into());
                    }
                },
                (None, None) => String::new(),
            };
            view.env.push((var.name.clone(), value));
        }
        for mount in container.volume_mounts.iter().flatten() {
            let Some(volume) = spec.volumes.iter().flatten().find(|v| v.name == mount.name) else {
                return Err(format!("mount {} names no volume", mount.name).into());
            };
            let Some(downward) = &volume.downward_api else {
                continue;
            };
            let mut files = BTreeMap::new();
            for item in downward.items.iter().flatten() {
                let Some(field_ref) = &item.field_ref else {
                    return Err(format!("Downward API item {} is not a fieldRef", item.path).into());
                };
                files.insert(item.path.clone(), field(pod, &field_ref.field_path)?);
            }
            view.files.insert(mount.mount_path.clone(), files);
        }
        Ok(view)
    }

    /// The view without env var `name`.
    pub fn without(&self, name: &str) -> Self {
        let mut view = self.clone();
        view.env.retain(|(n, _)| n != name);
        view
    }

    /// Writes the files under `root` as the kubelet's atomic writer lays out a Downward API
    /// volume: `<mount>/..<timestamp>/<item>`, `<mount>/..data -> ..<timestamp>`,
    /// `<mount>/<item> -> ..data/<item>`.
    pub fn write(&self, root: &Path) -> Result<()> {
        for (mount, files) in &self.files {
            let dir = root.join(mount.trim_start_matches('/'));
            let stamp = "..2026_11_25_00_00_00.000000001";
            std::fs::create_dir_all(dir.join(stamp))?;
            for (name, content) in files {
                std::fs::write(dir.join(stamp).join(name), content)?;
            }
            std::os::unix::fs::symlink(stamp, dir.join("..data"))?;
            for name in files.keys() {
                std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name))?;
            }
        }
        Ok(())
    }

    /// Writes the files into a fresh directory and runs the released reader on them with exactly
    /// this environment (plus `PATH`).
    pub async fn read_topology_config(&self) -> Result<ReaderOutcome> {
        let python = python()?;
        let root = scratch_dir()?;
        self.write(&root)?;
        let mut command = tokio::process::Command::new(&python);
        command
            .arg("-c")
            .arg(READER)
            .arg(&root)
            .arg(POLL_TIMEOUT_S.to_string())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.env.iter().map(|(n, v)| (n, v)))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = tokio::time::timeout(Duration::from_secs_f64(POLL_TIMEOUT_S + 30.0), command.output())
            .await
            .map_err(|_| "Dynamo's topology reader did not return")??;
        let _ = std::fs::remove_dir_all(&root);
        let stdout = String::from_utf8_lossy(&output.stdout);
        Ok(ReaderOutcome {
            code: output.status.code(),
            config: stdout.lines().last().and_then(|l| serde_json::from_str(l).ok()),
            stderr: String::from_utf8_lossy(&output.stderr).to_string(),
        })
    }
}

/// The python of `make dynamo`'s environment.
pub fn python() -> Result<PathBuf> {
    let python = std::env::var_os(PYTHON_ENV)
        .map(PathBuf::from)
        .ok_or_else(|| {
            format!("{PYTHON_ENV} is not set: run `make dynamo` (tools/dynamo-venv.sh), then the tests through `make e2e`, which sets it")
        })?;
    if python.exists() {
        Ok(python)
    } else {
        Err(format!(
            "{PYTHON_ENV}={} does not exist: run `make dynamo`",
            python.display()
        )
        .into())
    }
}

fn scratch_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "planner-operator-e2e-runtime-{}-{}",
        std::process::id(),
        crate::random_suffix()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

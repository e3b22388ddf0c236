//! The validating webhook through the real API server: the operator runs in this process with a
//! generated certificate, registered by `clientConfig.url` for the test's namespace; every
//! fixture of `operator/tests/fixtures/webhook/` (the topology admission rules and the
//! PlannerPolicy rules) is rejected with its message, and the samples are accepted.

use std::path::Path;

use e2e::{Result, TestNamespace, describe, in_namespace, install_crds, load_yaml, repo_root, yaml_files};
use serde_json::{Value, json};

use crate::operator::{ClusterScoped, start};

/// A webhook fixture as the API server sees it.
struct Fixture {
    file: String,
    object: Value,
    /// What the API server's message must contain.
    reason: String,
    grove_absent: bool,
}

fn header(text: &str, name: &str) -> Option<String> {
    let prefix = format!("# {name}:");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix).map(|v| v.trim().to_string()))
}

/// The fixtures, with the samples' ClusterTopologyBinding name replaced by this test's.
fn fixtures(cluster_topology: &str) -> Result<Vec<Fixture>> {
    let mut fixtures = Vec::new();
    for path in yaml_files(&repo_root().join("operator/tests/fixtures/webhook"))? {
        let text = std::fs::read_to_string(&path)?.replace("gpu-cluster", cluster_topology);
        let reason = header(&text, "api-server-reason")
            .or_else(|| header(&text, "reason"))
            .ok_or_else(|| format!("{} has no reason", path.display()))?
            .replace("gpu-cluster", cluster_topology);
        fixtures.push(Fixture {
            file: file_name(&path),
            object: serde_yaml::from_str(&text)?,
            reason,
            grove_absent: header(&text, "grove").as_deref() == Some("absent"),
        });
    }
    Ok(fixtures)
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap_or_default().to_string_lossy().to_string()
}

fn cluster_topology(name: &str) -> Result<Value> {
    let [mut topology] = load_yaml(&repo_root().join("config/samples/cluster-topology.yaml"))?
        .try_into()
        .map_err(|_| "one ClusterTopologyBinding in the sample")?;
    topology["metadata"]["name"] = json!(name);
    Ok(topology)
}

/// The samples (but the ClusterTopologyBinding and the cluster-scoped GpuBudget) and the valid
/// fixtures, with this test's ClusterTopologyBinding name; the DGD sample first, since the
/// policies target it.
fn valid_objects(cluster_topology: &str) -> Result<Vec<Value>> {
    let mut paths = yaml_files(&repo_root().join("config/samples"))?;
    paths.extend(yaml_files(
        &repo_root().join("operator/tests/fixtures/webhook/valid"),
    )?);
    let mut objects = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path)?.replace("gpu-cluster", cluster_topology);
        let object: Value = serde_yaml::from_str(&text)?;
        if object["kind"] != "ClusterTopologyBinding" && object["kind"] != "GpuBudget" {
            objects.push(object);
        }
    }
    objects.sort_by_key(|o| o["kind"] != "DynamoGraphDeployment");
    Ok(objects)
}

async fn check_rejections(ns: &TestNamespace, fixtures: &[Fixture]) -> Vec<String> {
    let mut failures = Vec::new();
    for fixture in fixtures {
        match ns.rejects(&fixture.object, &fixture.reason).await {
            Ok(status) => eprintln!("{}: {}", fixture.file, status.message),
            Err(e) => failures.push(format!("{}: {e}", fixture.file)),
        }
    }
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_rejects_topology_and_planner_policy_violations() -> Result<()> {
    in_namespace("webhook", |ns| async move {
        install_crds(&ns.client).await?;
        let topology_name = format!("{}-topology", ns.name);
        let topology =
            ClusterScoped::create_cluster_topology(&ns.client, &cluster_topology(&topology_name)?).await?;
        let operator = start(&ns, &[]).await?;
        let outcome = async {
            let fixtures: Vec<Fixture> = fixtures(&topology_name)?
                .into_iter()
                .filter(|f| !f.grove_absent)
                .collect();
            let probe = fixtures
                .iter()
                .find(|f| f.file == "dgd-cluster-topology-not-found.yaml")
                .ok_or("probe fixture missing")?;
            operator
                .register_webhook(&ns, &probe.object, &probe.reason)
                .await?;
            let mut failures = Vec::new();
            // The samples pass (the DGD first: the PlannerPolicy rules need their target).
            for object in valid_objects(&topology_name)? {
                if let Err(e) = ns.accepts(&object).await {
                    failures.push(format!("{}: {e}", describe(&object)));
                }
            }
            failures.extend(check_rejections(&ns, &fixtures).await);
            let policies = fixtures
                .iter()
                .filter(|f| f.object["kind"] == "PlannerPolicy")
                .count();
            let dgds = fixtures.len() - policies;
            eprintln!("{dgds} DynamoGraphDeployment and {policies} PlannerPolicy fixtures checked");
            assert!(
                fixtures.len() >= 15,
                "expected at least 15 bad manifests, found {}",
                fixtures.len()
            );
            assert!(failures.is_empty(), "{}", failures.join("\n"));
            operator.check_running()
        }
        .await;
        let stopped = operator.stop().await;
        topology.delete().await;
        outcome.and(stopped)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_grove_a_dgd_that_needs_a_cluster_topology_is_rejected() -> Result<()> {
    in_namespace("webhook-no-grove", |ns| async move {
        install_crds(&ns.client).await?;
        // This cluster has Grove's topology CRDs; an API version nobody serves stands in for a
        // cluster without Grove.
        let operator = start(&ns, &["--cluster-topology-api-version", "grove.io/v1alpha9"]).await?;
        let outcome = async {
            let fixtures: Vec<Fixture> = fixtures("gpu-cluster")?
                .into_iter()
                .filter(|f| f.grove_absent)
                .collect();
            let probe = fixtures.first().ok_or("no fixture with `# grove: absent`")?;
            operator
                .register_webhook(&ns, &probe.object, &probe.reason)
                .await?;
            let failures = check_rejections(&ns, &fixtures).await;
            assert!(failures.is_empty(), "{}", failures.join("\n"));
            // With a label no Grove object is needed, Grove or not.
            let [label] = load_yaml(
                &repo_root()
                    .join("operator/tests/fixtures/webhook/valid/dgd-label-without-cluster-topology.yaml"),
            )?
            .try_into()
            .map_err(|_| "one object")?;
            ns.accepts(&label).await?;
            operator.check_running()
        }
        .await;
        let stopped = operator.stop().await;
        outcome.and(stopped)
    })
    .await
}

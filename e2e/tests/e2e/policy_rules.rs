//! One rule set: with the admission webhook off, the PlannerPolicy reconciler reports every
//! policy the webhook would deny (the PlannerPolicy fixtures of
//! `operator/tests/fixtures/webhook/`) with the webhook's message, in the policy's status, and
//! never plans with it; the ones whose limit the schema checks too (`# schema: rejects`) the API
//! server refuses by itself, with the schema's message.

use std::time::Duration;

use e2e::{Result, in_namespace, install_crds, load_yaml, poll_until, repo_root, yaml_files};
use kube::{Api, api::PostParams};
use planner_api::{DynamoGraphDeployment, PlannerPolicy};
use serde_json::{Value, json};

use crate::operator::start;

const WAIT: Duration = Duration::from_secs(90);

fn reason(text: &str) -> Option<String> {
    header(text, "reason")
}

fn header(text: &str, name: &str) -> Option<String> {
    let prefix = format!("# {name}:");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix).map(|v| v.trim().to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_reports_what_the_webhook_would_deny() -> Result<()> {
    in_namespace("policy-rules", |ns| async move {
        install_crds(&ns.client).await?;
        // The world the fixtures are written for: the sample DGD `llama-disagg`.
        let [dgd] = load_yaml(&repo_root().join("config/samples/dgd-disagg.yaml"))?
            .try_into()
            .map_err(|_| "one DGD in the sample")?;
        let dgds: Api<DynamoGraphDeployment> = ns.api();
        dgds.create(&PostParams::default(), &serde_json::from_value(dgd)?)
            .await?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            let policies: Api<PlannerPolicy> = ns.api();
            let mut expected = Vec::new();
            let mut refused_by_schema = 0;
            for path in yaml_files(&repo_root().join("operator/tests/fixtures/webhook"))? {
                let file = path.file_name().unwrap_or_default().to_string_lossy().to_string();
                if !file.starts_with("ppol-") {
                    continue;
                }
                let text = std::fs::read_to_string(&path)?;
                let reason = reason(&text).ok_or_else(|| format!("{file} has no reason"))?;
                let mut object: Value = serde_yaml::from_str(&text)?;
                let name = file.trim_end_matches(".yaml").to_string();
                object["metadata"]["name"] = json!(name);
                let created = policies
                    .create(&PostParams::default(), &serde_json::from_value(object)?)
                    .await;
                if header(&text, "schema").as_deref() == Some("rejects") {
                    let schema_reason = header(&text, "api-server-reason")
                        .ok_or_else(|| format!("{file} has no api-server-reason"))?;
                    match created {
                        Err(kube::Error::Api(e)) if e.code == 422 && e.message.contains(&schema_reason) => {
                            refused_by_schema += 1;
                        }
                        other => {
                            return Err(format!(
                                "{file}: expected the API server alone to refuse it with {schema_reason:?}, got {other:?}"
                            )
                            .into());
                        }
                    }
                    continue;
                }
                created.map_err(|e| format!("{file}: the API server refused it without the webhook: {e}"))?;
                expected.push((file, name, reason));
            }
            if refused_by_schema < 5 {
                return Err(format!(
                    "expected at least five fixtures the schema refuses by itself, found {refused_by_schema}"
                )
                .into());
            }
            if expected.len() < 10 {
                return Err(format!(
                    "expected at least ten PlannerPolicy fixtures, found {}",
                    expected.len()
                )
                .into());
            }
            for (file, name, reason) in &expected {
                poll_until(
                    &format!("{file} reported with the webhook's message"),
                    WAIT,
                    || async {
                        let policy = policies.get(name).await?;
                        let Some(status) = policy.status else {
                            return Ok(false);
                        };
                        let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
                        Ok(
                            ready.is_some_and(|c| c.status == "False" && c.message.contains(reason.as_str()))
                                && status
                                    .message
                                    .as_deref()
                                    .is_some_and(|m| m.contains(reason.as_str()))
                                && status.last_tick_time.is_none()
                                && status.desired.is_none(),
                        )
                    },
                )
                .await?;
            }
            // None of them changed the DGD's replicas.
            let dgd = dgds.get("llama-disagg").await?;
            let replicas: Vec<Option<i32>> = dgd.spec.components.iter().map(|c| c.replicas).collect();
            if replicas != [Some(1), Some(1), Some(1)] {
                return Err(format!("the DGD's replicas changed: {replicas:?}").into());
            }
            operator.check_running()
        }
        .await;
        let stopped = operator.stop().await;
        outcome.and(stopped)
    })
    .await
}

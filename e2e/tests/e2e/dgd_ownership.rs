//! The DGD reconciler writes only objects its DGD owns: a Deployment or Service that already has
//! a rendered workload's name but not the DGD's owner reference is left exactly as it was, the
//! DGD says so (`WorkloadsOwned=False`, reason `WorkloadConflict`, and a Warning Event naming the
//! objects), and once the name is free the workload is created.

use std::time::Duration;

use e2e::{Result, in_namespace, install_crds, poll_until};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service, events::v1::Event};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use planner_api::DynamoGraphDeployment;
use serde_json::json;

use crate::{dgd::graph, operator::start};

const WAIT: Duration = Duration::from_secs(90);

/// Someone else's Deployment, named as the DGD's decode workload would be.
fn foreign_deployment(name: &str) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": "someone-else"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "someone-else"}},
            "template": {
                "metadata": {"labels": {"app": "someone-else"}},
                "spec": {"containers": [{"name": "web", "image": "registry.example/web:1"}]}
            }
        }
    }))?)
}

/// Someone else's Service, named as the DGD's frontend Service would be.
fn foreign_service(name: &str) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": "someone-else"}, "ports": [{"port": 80}]}
    }))?)
}

fn condition(dgd: &DynamoGraphDeployment, type_: &str) -> Option<(String, String, String)> {
    dgd.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workloads_named_like_someone_elses_objects_are_not_taken_over() -> Result<()> {
    in_namespace("dgd-ownership", |ns| async move {
        install_crds(&ns.client).await?;
        let deployments: Api<Deployment> = ns.api();
        let services: Api<Service> = ns.api();
        deployments
            .create(&PostParams::default(), &foreign_deployment("llama-decode")?)
            .await?;
        services
            .create(&PostParams::default(), &foreign_service("llama-frontend")?)
            .await?;
        let before_deployment = deployments.get("llama-decode").await?;
        let before_service = services.get("llama-frontend").await?;

        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            let dgds: Api<DynamoGraphDeployment> = ns.api();
            dgds.create(&PostParams::default(), &graph("llama")?).await?;

            poll_until("the DGD to report the conflict", WAIT, || async {
                let dgd = dgds.get("llama").await?;
                Ok(
                    condition(&dgd, "WorkloadsOwned").is_some_and(|(status, reason, message)| {
                        status == "False"
                            && reason == "WorkloadConflict"
                            && message.contains("Deployment llama-decode exists and is owned by no object")
                            && message.contains("Service llama-frontend exists and is owned by no object")
                    }),
                )
            })
            .await?;
            poll_until("a WorkloadConflict Warning naming the objects", WAIT, || async {
                let events: Api<Event> = ns.api();
                Ok(events.list(&ListParams::default()).await?.items.iter().any(|e| {
                    e.reason.as_deref() == Some("WorkloadConflict")
                        && e.type_.as_deref() == Some("Warning")
                        && e.note
                            .as_deref()
                            .is_some_and(|n| n.contains("Deployment llama-decode"))
                }))
            })
            .await?;
            // The components whose names are free are created as usual.
            poll_until("the prefill Deployment", WAIT, || async {
                Ok(deployments.get_opt("llama-prefill").await?.is_some())
            })
            .await?;

            // The foreign objects are as they were: never written by the operator's field
            // manager, no owner, the same labels, template and selector.
            let after_deployment = deployments.get("llama-decode").await?;
            let after_service = services.get("llama-frontend").await?;
            for (what, managed) in [
                ("Deployment", &after_deployment.metadata.managed_fields),
                ("Service", &after_service.metadata.managed_fields),
            ] {
                let managers: Vec<_> = managed
                    .iter()
                    .flatten()
                    .filter_map(|f| f.manager.clone())
                    .collect();
                assert!(
                    !managers.iter().any(|m| m == "planner-operator"),
                    "the foreign {what} was written by the operator: managers {managers:?}"
                );
            }
            assert!(after_deployment.metadata.owner_references.is_none());
            assert_eq!(
                after_deployment.metadata.labels,
                before_deployment.metadata.labels
            );
            assert_eq!(after_deployment.spec, before_deployment.spec);
            assert!(after_service.metadata.owner_references.is_none());
            assert_eq!(
                after_service.spec.as_ref().and_then(|s| s.selector.clone()),
                before_service.spec.as_ref().and_then(|s| s.selector.clone())
            );
            let dgd = dgds.get("llama").await?;
            assert_eq!(
                condition(&dgd, "Ready").map(|c| c.0).as_deref(),
                Some("False"),
                "a DGD missing a workload is not Ready"
            );

            // Freed names are taken, and the condition goes.
            deployments
                .delete("llama-decode", &DeleteParams::background())
                .await?;
            services
                .delete("llama-frontend", &DeleteParams::background())
                .await?;
            poll_until(
                "the DGD's own decode Deployment and frontend Service",
                WAIT,
                || async {
                    let decode = deployments.get_opt("llama-decode").await?;
                    let frontend = services.get_opt("llama-frontend").await?;
                    let owned = |refs: Option<
                        &Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
                    >| {
                        refs.is_some_and(|r| {
                            r.iter()
                                .any(|o| o.kind == "DynamoGraphDeployment" && o.name == "llama")
                        })
                    };
                    Ok(
                        decode.is_some_and(|d| owned(d.metadata.owner_references.as_ref()))
                            && frontend.is_some_and(|s| owned(s.metadata.owner_references.as_ref())),
                    )
                },
            )
            .await?;
            poll_until("the conflict condition to go", WAIT, || async {
                Ok(condition(&dgds.get("llama").await?, "WorkloadsOwned").is_none())
            })
            .await?;
            operator.check_running()
        }
        .await;
        let stopped = operator.stop().await;
        outcome.and(stopped)
    })
    .await
}

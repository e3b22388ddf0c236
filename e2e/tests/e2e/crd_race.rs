//! Start-up before the CRDs: the operator, started while its CRDs are not served, stays up and
//! not ready, and starts reconciling once they are installed, without a restart. It deletes the
//! shared CRDs, so `make e2e` runs it alone, before the other tests (it is `#[ignore]`d for a
//! plain `cargo test`).

use std::{net::SocketAddr, time::Duration};

use e2e::{Result, http_get, in_namespace_exclusive, install_crds, poll_until};
use k8s_openapi::{
    api::apps::v1::Deployment,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use planner_api::DynamoGraphDeployment;
use planner_operator::runtime::run_until;
use tokio::sync::oneshot;

use crate::{dgd::graph, operator::parse_run_args};

const WAIT: Duration = Duration::from_secs(90);
/// The CRDs the operator waits for.
const CRDS: [&str; 2] = [
    "dynamographdeployments.nvidia.com",
    "plannerpolicies.planner.dynamo.io",
];

fn free_addr() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "deletes the shared CRDs: make e2e runs it alone, first"]
async fn operator_started_before_its_crds_reconciles_once_they_are_served() -> Result<()> {
    in_namespace_exclusive("crd-race", |ns| async move {
        let crds: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
        for name in CRDS {
            let _ = crds.delete(name, &DeleteParams::default()).await;
        }
        poll_until("the CRDs to be gone", WAIT, || async {
            for name in CRDS {
                if crds.get_opt(name).await?.is_some() {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .await?;

        crate::operator::init_logs();
        let health = free_addr()?;
        let args = parse_run_args([
            "planner-operator",
            "--namespace",
            &ns.name,
            "--metrics-addr",
            &health.to_string(),
            "--leader-election",
            "false",
            "--webhook-disabled",
        ])?;
        let (stop, stopped) = oneshot::channel::<()>();
        let operator = tokio::spawn(run_until(args, ns.client.clone(), async move {
            let _ = stopped.await;
        }));
        let outcome = async {
            // Up (healthy) but not ready while the CRDs are missing.
            poll_until("/healthz ok while /readyz is not", WAIT, || async {
                let Ok((healthz, _)) = http_get(health, "/healthz").await else {
                    return Ok(false);
                };
                let (readyz, body) = http_get(health, "/readyz").await?;
                Ok(healthz == 200 && readyz == 503 && body.contains("not ready"))
            })
            .await?;
            if operator.is_finished() {
                return Err("the operator exited while its CRDs were missing".into());
            }

            install_crds(&ns.client).await?;
            poll_until("/readyz ok once the CRDs are served", WAIT, || async {
                Ok(http_get(health, "/readyz").await?.0 == 200)
            })
            .await?;
            let dgds: Api<DynamoGraphDeployment> = ns.api();
            dgds.create(&PostParams::default(), &graph("llama")?).await?;
            poll_until("the DGD's Deployments", WAIT, || async {
                let deployments: Api<Deployment> = ns.api();
                let list = deployments
                    .list(&ListParams::default().labels("nvidia.com/dynamo-graph-deployment-name=llama"))
                    .await?;
                Ok(list.items.len() == 3)
            })
            .await
        }
        .await;
        let _ = stop.send(());
        let stopped = tokio::time::timeout(Duration::from_secs(30), operator).await;
        outcome?;
        match stopped {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(error))) => Err(format!("the operator failed: {error}").into()),
            Ok(Err(join)) => Err(format!("the operator task failed: {join}").into()),
            Err(_) => Err("the operator did not stop within 30 s".into()),
        }
    })
    .await
}

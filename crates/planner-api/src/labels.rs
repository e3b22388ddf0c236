//! The label and naming contract of the objects a DynamoGraphDeployment renders, as Dynamo's own
//! operator names them: the DGD reconciler writes these, and the planner, the topology label
//! controller and the synthetic frontend select by them.

/// Label naming the DGD a workload or pod belongs to.
pub const LABEL_GRAPH: &str = "nvidia.com/dynamo-graph-deployment-name";
/// Label naming the component (as written in the DGD).
pub const LABEL_COMPONENT: &str = "nvidia.com/dynamo-component";
/// Label with the component's type.
pub const LABEL_COMPONENT_TYPE: &str = "nvidia.com/dynamo-component-type";
/// Label with the graph's Dynamo namespace, which a PodMonitor copies into the
/// `dynamo_namespace` label of the pod's series (NVIDIA's `dynamo-frontend` PodMonitor does).
pub const LABEL_DYNAMO_NAMESPACE: &str = "nvidia.com/dynamo-namespace";
/// Label that NVIDIA's PodMonitors (and this chart's) select pods to scrape by, set to `"true"`.
pub const LABEL_METRICS_ENABLED: &str = "nvidia.com/metrics-enabled";
/// Label marking objects this operator manages.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "planner-operator";
/// Name of the container that runs a component.
pub const MAIN_CONTAINER: &str = "main";
/// HTTP port of Dynamo frontends (OpenAI API and `/metrics`), named [`FRONTEND_PORT_NAME`].
pub const FRONTEND_PORT: i32 = 8000;
/// Name of the frontend's HTTP port, which NVIDIA's `dynamo-frontend` PodMonitor scrapes.
pub const FRONTEND_PORT_NAME: &str = "http";
/// Port of a worker's system server (`/metrics`, `/health`, `/live`), as NVIDIA's operator
/// sets it (`DYN_SYSTEM_PORT`), named [`SYSTEM_PORT_NAME`].
pub const SYSTEM_PORT: i32 = 9090;
/// Name of the workers' system port, which NVIDIA's `dynamo-worker` PodMonitor scrapes.
pub const SYSTEM_PORT_NAME: &str = "system";

/// The Dynamo namespace of a graph, as Dynamo's operator computes it: `<namespace>-<name>`
/// with dots replaced by dashes.
pub fn dynamo_namespace(namespace: &str, name: &str) -> String {
    format!("{namespace}-{}", name.replace('.', "-"))
}

/// Name of a component's workload (and Service): `<dgd>-<component>`, lower-cased, dots
/// replaced by dashes so it is also a valid Service name.
pub fn workload_name(dgd: &str, component: &str) -> String {
    format!("{}-{}", dgd.replace('.', "-"), component).to_lowercase()
}

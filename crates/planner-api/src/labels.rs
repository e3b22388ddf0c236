//! The label and naming contract of the objects a DynamoGraphDeployment renders, as Dynamo's own
//! operator names them: the DGD reconciler writes these, and the planner, the topology label
//! controller and the synthetic frontend select by them.

/// Label naming the DGD a workload or pod belongs to.
pub const LABEL_GRAPH: &str = "nvidia.com/dynamo-graph-deployment-name";
/// Label naming the component (as written in the DGD).
pub const LABEL_COMPONENT: &str = "nvidia.com/dynamo-component";
/// Label with the component's type.
pub const LABEL_COMPONENT_TYPE: &str = "nvidia.com/dynamo-component-type";
/// Label marking objects this operator manages.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "planner-operator";
/// Name of the container that runs a component.
pub const MAIN_CONTAINER: &str = "main";
/// HTTP port of Dynamo frontends.
pub const FRONTEND_PORT: i32 = 8000;

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

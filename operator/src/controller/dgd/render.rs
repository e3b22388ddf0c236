//! Rendering a DynamoGraphDeployment into workloads: one Deployment per component and a Service
//! for each frontend. Pure: the reconciler applies what this returns.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec},
        core::v1::{Container, ContainerPort, EnvVar, PodTemplateSpec, Service, ServicePort, ServiceSpec},
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};

use planner_api::{
    Component, ComponentType, DynamoGraphDeployment,
    labels::{
        FRONTEND_PORT, FRONTEND_PORT_NAME, LABEL_COMPONENT, LABEL_COMPONENT_TYPE, LABEL_DYNAMO_NAMESPACE,
        LABEL_GRAPH, LABEL_MANAGED_BY, LABEL_METRICS_ENABLED, MAIN_CONTAINER, MANAGED_BY, SYSTEM_PORT,
        SYSTEM_PORT_NAME, dynamo_namespace, workload_name,
    },
};

use crate::topology::{self, ResolvedTopology};

/// Why a DGD cannot be rendered. Each message names the field and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The DGD has no namespace or name (never the case for objects from the API server).
    #[error("the DynamoGraphDeployment has no {0}")]
    MissingMetadata(&'static str),
    /// A component has no pod template.
    #[error(
        "spec.components[{index}] ({name}): podTemplate is required and must contain a container named \"main\""
    )]
    MissingPodTemplate {
        /// Position in `spec.components`.
        index: usize,
        /// Component name.
        name: String,
    },
    /// A component's pod template has no `main` container.
    #[error(
        "spec.components[{index}] ({name}): podTemplate.spec.containers has no container named \"main\" (found: {found}); the main container runs the component"
    )]
    MissingMainContainer {
        /// Position in `spec.components`.
        index: usize,
        /// Component name.
        name: String,
        /// Container names present.
        found: String,
    },
    /// The main container has no image.
    #[error("spec.components[{index}] ({name}): the \"main\" container needs an image")]
    MissingImage {
        /// Position in `spec.components`.
        index: usize,
        /// Component name.
        name: String,
    },
    /// A generated object name is not a valid Kubernetes name.
    #[error(
        "spec.components[{index}] ({name}): the workload name {workload:?} is longer than 63 characters or not a DNS label; shorten the DynamoGraphDeployment or component name"
    )]
    NameTooLong {
        /// Position in `spec.components`.
        index: usize,
        /// Component name.
        name: String,
        /// The generated name.
        workload: String,
    },
}

/// Everything the DGD owns, as it should be.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedGraph {
    /// One Deployment per component, in spec order.
    pub deployments: Vec<Deployment>,
    /// One Service per frontend component.
    pub services: Vec<Service>,
}

fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && name.as_bytes().last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Labels every object and pod of a component carries; the first two also select its pods.
pub fn component_labels(dgd: &str, component: &Component) -> BTreeMap<String, String> {
    let mut labels = selector_labels(dgd, &component.name);
    if let Some(kind) = component.kind {
        labels.insert(LABEL_COMPONENT_TYPE.into(), kind.as_str().into());
    }
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
    labels
}

/// The labels that select a component's pods (stable for the component's lifetime).
pub fn selector_labels(dgd: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_GRAPH.into(), dgd.into()),
        (LABEL_COMPONENT.into(), component.into()),
    ])
}

/// The frontend's request-migration limit when the graph sets none (`DYN_MIGRATION_LIMIT`).
pub const ENV_MIGRATION_LIMIT: &str = "DYN_MIGRATION_LIMIT";

/// Dynamo's frontend retries a request on another worker when the worker serving it goes (a
/// crash, or a scale-down's SIGTERM whose grace period ran out) only with a migration limit above
/// 0, and the limit is 0 unless set: without one every scale-down can fail requests in flight.
/// 3 is the value Dynamo's fault-tolerance guide starts with.
const DEFAULT_MIGRATION_LIMIT: &str = "3";

/// Env a main container gets unless the graph's `spec.env` or the container sets it: the first
/// layer, so both replace it.
fn default_env(component: &Component) -> Vec<EnvVar> {
    match component.kind {
        Some(ComponentType::Frontend) => vec![EnvVar {
            name: ENV_MIGRATION_LIMIT.into(),
            value: Some(DEFAULT_MIGRATION_LIMIT.into()),
            value_from: None,
        }],
        _ => Vec::new(),
    }
}

/// Env every main container gets from the operator, after the graph's `spec.env` and before the
/// container's own (which win on duplicates, being later).
fn operator_env(dgd: &str, namespace: &str, component: &Component) -> Vec<EnvVar> {
    let var = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    };
    let mut env = vec![
        var("DYN_PARENT_DGD_K8S_NAME", dgd.into()),
        var("DYN_PARENT_DGD_K8S_NAMESPACE", namespace.into()),
        var("DYN_NAMESPACE", dynamo_namespace(namespace, dgd)),
    ];
    if let Some(kind) = component.kind {
        env.push(var("DYN_COMPONENT", kind.as_str().into()));
        // Workers serve their metrics (and health) on the system port, as NVIDIA's operator
        // starts them.
        if kind.is_worker() {
            env.push(var("DYN_SYSTEM_ENABLED", "true".into()));
            env.push(var("DYN_SYSTEM_PORT", SYSTEM_PORT.to_string()));
        }
    }
    env
}

/// The labels NVIDIA's PodMonitors select a pod by and copy into its series: metrics enabled
/// (unless the pod template says otherwise) and the graph's Dynamo namespace.
fn metrics_labels(labels: &mut BTreeMap<String, String>, dgd: &str, namespace: &str) {
    labels
        .entry(LABEL_METRICS_ENABLED.into())
        .or_insert_with(|| "true".into());
    labels.insert(LABEL_DYNAMO_NAMESPACE.into(), dynamo_namespace(namespace, dgd));
}

/// Adds the named port a PodMonitor scrapes, unless the container already has one by that name
/// or number.
fn ensure_port(container: &mut Container, name: &str, port: i32) {
    let ports = container.ports.get_or_insert_with(Vec::new);
    if !ports
        .iter()
        .any(|p| p.container_port == port || p.name.as_deref() == Some(name))
    {
        ports.push(ContainerPort {
            name: Some(name.into()),
            container_port: port,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        });
    }
}

/// Merges env lists: a later variable with the same name replaces an earlier one in place.
fn merge_env(layers: impl IntoIterator<Item = Vec<EnvVar>>) -> Vec<EnvVar> {
    let mut merged: Vec<EnvVar> = Vec::new();
    for var in layers.into_iter().flatten() {
        match merged.iter_mut().find(|existing| existing.name == var.name) {
            Some(existing) => *existing = var,
            None => merged.push(var),
        }
    }
    merged
}

/// The owner reference that makes the DGD own (and garbage-collect) its workloads.
pub fn owner_reference(dgd: &DynamoGraphDeployment) -> Option<OwnerReference> {
    use kube::Resource;
    dgd.controller_owner_ref(&())
}

/// Renders every workload of a DGD. `topology` is the DGD's resolved `kvCacheTransferTopology`
/// (see [`crate::topology`]); `None` renders the DGD without any topology injection, exactly
/// as a DGD without the field.
pub fn render(
    dgd: &DynamoGraphDeployment,
    topology: Option<&ResolvedTopology>,
) -> Result<RenderedGraph, RenderError> {
    let name = dgd
        .metadata
        .name
        .as_deref()
        .ok_or(RenderError::MissingMetadata("metadata.name"))?;
    let namespace = dgd
        .metadata
        .namespace
        .as_deref()
        .ok_or(RenderError::MissingMetadata("metadata.namespace"))?;
    let owner = owner_reference(dgd).ok_or(RenderError::MissingMetadata("metadata.uid"))?;
    let graph_env = dgd.spec.env.clone().unwrap_or_default();
    let mut rendered = RenderedGraph {
        deployments: Vec::new(),
        services: Vec::new(),
    };
    for (index, component) in dgd.spec.components.iter().enumerate() {
        let workload = workload_name(name, &component.name);
        if !is_dns_label(&workload) {
            return Err(RenderError::NameTooLong {
                index,
                name: component.name.clone(),
                workload,
            });
        }
        let mut template = render_pod_template(index, name, namespace, component, &graph_env)?;
        if let Some(topology) = topology {
            topology::inject(
                component.kind,
                &component.name,
                &mut template,
                MAIN_CONTAINER,
                topology,
            );
        }
        let labels = component_labels(name, component);
        let metadata = ObjectMeta {
            name: Some(workload.clone()),
            namespace: Some(namespace.into()),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner.clone()]),
            ..ObjectMeta::default()
        };
        rendered.deployments.push(Deployment {
            metadata: metadata.clone(),
            spec: Some(DeploymentSpec {
                replicas: Some(component.replicas.unwrap_or(1)),
                selector: LabelSelector {
                    match_labels: Some(selector_labels(name, &component.name)),
                    match_expressions: None,
                },
                template,
                ..DeploymentSpec::default()
            }),
            status: None,
        });
        if component.kind == Some(ComponentType::Frontend) {
            rendered.services.push(Service {
                metadata,
                spec: Some(ServiceSpec {
                    selector: Some(selector_labels(name, &component.name)),
                    ports: Some(vec![ServicePort {
                        name: Some(FRONTEND_PORT_NAME.into()),
                        port: FRONTEND_PORT,
                        target_port: Some(IntOrString::String(FRONTEND_PORT_NAME.into())),
                        protocol: Some("TCP".into()),
                        ..ServicePort::default()
                    }]),
                    ..ServiceSpec::default()
                }),
                status: None,
            });
        }
    }
    Ok(rendered)
}

fn render_pod_template(
    index: usize,
    dgd: &str,
    namespace: &str,
    component: &Component,
    graph_env: &[EnvVar],
) -> Result<PodTemplateSpec, RenderError> {
    let mut template = component
        .pod_template
        .clone()
        .ok_or_else(|| RenderError::MissingPodTemplate {
            index,
            name: component.name.clone(),
        })?;
    let metadata = template.metadata.get_or_insert_with(ObjectMeta::default);
    let labels = metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.extend(component_labels(dgd, component));
    metrics_labels(labels, dgd, namespace);
    let spec = template
        .spec
        .as_mut()
        .ok_or_else(|| RenderError::MissingPodTemplate {
            index,
            name: component.name.clone(),
        })?;
    let found = spec
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let main: &mut Container = spec
        .containers
        .iter_mut()
        .find(|c| c.name == MAIN_CONTAINER)
        .ok_or_else(|| RenderError::MissingMainContainer {
            index,
            name: component.name.clone(),
            found: found.clone(),
        })?;
    if main.image.as_deref().is_none_or(str::is_empty) {
        return Err(RenderError::MissingImage {
            index,
            name: component.name.clone(),
        });
    }
    main.env = Some(merge_env([
        default_env(component),
        graph_env.to_vec(),
        operator_env(dgd, namespace, component),
        main.env.take().unwrap_or_default(),
    ]));
    match component.kind {
        Some(ComponentType::Frontend) => ensure_port(main, FRONTEND_PORT_NAME, FRONTEND_PORT),
        Some(kind) if kind.is_worker() => {
            // The port the worker's system server listens on, as its env says.
            let port = main
                .env
                .iter()
                .flatten()
                .find(|e| e.name == "DYN_SYSTEM_PORT")
                .and_then(|e| e.value.as_deref()?.parse().ok())
                .unwrap_or(SYSTEM_PORT);
            ensure_port(main, SYSTEM_PORT_NAME, port);
        }
        _ => {}
    }
    Ok(template)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DynamoGraphDeployment {
        let text = include_str!("../../../../config/samples/dgd-disagg.yaml");
        let mut dgd: DynamoGraphDeployment = serde_yaml::from_str(text).unwrap();
        dgd.metadata.namespace = Some("llm".into());
        dgd.metadata.uid = Some("0f3c2a".into());
        dgd
    }

    fn env_of(deployment: &Deployment) -> Vec<(String, String)> {
        let spec = deployment.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let main = spec.containers.iter().find(|c| c.name == MAIN_CONTAINER).unwrap();
        main.env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn renders_one_deployment_per_component_and_a_service_for_the_frontend() {
        let rendered = render(&sample(), None).unwrap();
        let names: Vec<_> = rendered
            .deployments
            .iter()
            .map(|d| d.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "llama-disagg-frontend",
                "llama-disagg-prefill",
                "llama-disagg-decode"
            ]
        );
        assert_eq!(rendered.services.len(), 1);
        let service = &rendered.services[0];
        assert_eq!(service.metadata.name.as_deref(), Some("llama-disagg-frontend"));
        assert_eq!(
            service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port,
            FRONTEND_PORT
        );
    }

    #[test]
    fn labels_selectors_replicas_and_owner() {
        let rendered = render(&sample(), None).unwrap();
        let decode = &rendered.deployments[2];
        let labels = decode.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_GRAPH], "llama-disagg");
        assert_eq!(labels[LABEL_COMPONENT], "decode");
        assert_eq!(labels[LABEL_COMPONENT_TYPE], "decode");
        let spec = decode.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(1));
        let pod_labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        for (key, value) in spec.selector.match_labels.as_ref().unwrap() {
            assert_eq!(
                pod_labels.get(key),
                Some(value),
                "selector label {key} missing on pods"
            );
        }
        let owner = &decode.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("DynamoGraphDeployment", "llama-disagg", Some(true))
        );
    }

    #[test]
    fn env_layers_graph_then_operator_then_container() {
        let mut dgd = sample();
        let spec = dgd.spec.components[1]
            .pod_template
            .as_mut()
            .unwrap()
            .spec
            .as_mut()
            .unwrap();
        spec.containers[0].env = Some(vec![EnvVar {
            name: "DYN_LOG".into(),
            value: Some("debug".into()),
            value_from: None,
        }]);
        let rendered = render(&dgd, None).unwrap();
        let env = env_of(&rendered.deployments[1]);
        let get = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(get("DYN_PARENT_DGD_K8S_NAME"), Some("llama-disagg"));
        assert_eq!(get("DYN_PARENT_DGD_K8S_NAMESPACE"), Some("llm"));
        assert_eq!(get("DYN_NAMESPACE"), Some("llm-llama-disagg"));
        assert_eq!(get("DYN_COMPONENT"), Some("prefill"));
        // The container's own value wins over the graph-wide one, and appears once.
        assert_eq!(get("DYN_LOG"), Some("debug"));
        assert_eq!(env.iter().filter(|(n, _)| n == "DYN_LOG").count(), 1);
        // The frontend exposes its HTTP port.
        let frontend = rendered.deployments[0]
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap();
        assert_eq!(
            frontend.containers[0].ports.as_ref().unwrap()[0].container_port,
            FRONTEND_PORT
        );
    }

    #[test]
    fn the_frontend_migrates_requests_unless_the_graph_or_container_says_otherwise() {
        let limit = |dgd: &DynamoGraphDeployment| {
            let env = env_of(&render(dgd, None).unwrap().deployments[0]);
            let values: Vec<String> = env
                .into_iter()
                .filter(|(n, _)| n == ENV_MIGRATION_LIMIT)
                .map(|(_, v)| v)
                .collect();
            values
        };
        let mut dgd = sample();
        assert_eq!(limit(&dgd), ["3"]);
        // Workers do not read it.
        let prefill = env_of(&render(&dgd, None).unwrap().deployments[1]);
        assert!(prefill.iter().all(|(n, _)| n != ENV_MIGRATION_LIMIT));
        let set = |value: &str| {
            Some(vec![EnvVar {
                name: ENV_MIGRATION_LIMIT.into(),
                value: Some(value.into()),
                value_from: None,
            }])
        };
        dgd.spec.env = set("0");
        assert_eq!(limit(&dgd), ["0"]);
        dgd.spec.components[0]
            .pod_template
            .as_mut()
            .unwrap()
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .env = set("5");
        assert_eq!(limit(&dgd), ["5"]);
    }

    #[test]
    fn pods_carry_what_the_dynamo_pod_monitors_select_and_scrape() {
        let mut dgd = sample();
        // A container that names its own system port keeps it; a pod template may turn metrics off.
        let decode = dgd.spec.components[2].pod_template.as_mut().unwrap();
        decode.spec.as_mut().unwrap().containers[0].env = Some(vec![EnvVar {
            name: "DYN_SYSTEM_PORT".into(),
            value: Some("9345".into()),
            value_from: None,
        }]);
        let rendered = render(&dgd, None).unwrap();
        let pod = |i: usize| rendered.deployments[i].spec.as_ref().unwrap().template.clone();
        let ports = |i: usize| -> Vec<(String, i32)> {
            pod(i).spec.unwrap().containers[0]
                .ports
                .iter()
                .flatten()
                .map(|p| (p.name.clone().unwrap_or_default(), p.container_port))
                .collect()
        };
        for i in 0..3 {
            let labels = pod(i).metadata.unwrap().labels.unwrap();
            assert_eq!(labels[LABEL_METRICS_ENABLED], "true");
            assert_eq!(labels[LABEL_DYNAMO_NAMESPACE], "llm-llama-disagg");
        }
        assert_eq!(ports(0), [("http".to_string(), 8000)]);
        assert_eq!(ports(1), [("system".to_string(), 9090)]);
        assert_eq!(ports(2), [("system".to_string(), 9345)]);
        let env = env_of(&rendered.deployments[1]);
        assert!(
            env.contains(&("DYN_SYSTEM_PORT".into(), "9090".into())),
            "{env:?}"
        );
        assert!(
            env.contains(&("DYN_SYSTEM_ENABLED".into(), "true".into())),
            "{env:?}"
        );
        assert!(
            !env_of(&rendered.deployments[0])
                .iter()
                .any(|(n, _)| n == "DYN_SYSTEM_PORT")
        );
        let mut off = sample();
        off.spec.components[1]
            .pod_template
            .as_mut()
            .unwrap()
            .metadata
            .get_or_insert_with(ObjectMeta::default)
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(LABEL_METRICS_ENABLED.into(), "false".into());
        let rendered = render(&off, None).unwrap();
        let labels = rendered.deployments[1]
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .clone()
            .unwrap();
        assert_eq!(labels[LABEL_METRICS_ENABLED], "false");
    }

    #[test]
    fn missing_main_container_is_named() {
        let mut dgd = sample();
        dgd.spec.components[2]
            .pod_template
            .as_mut()
            .unwrap()
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .name = "vllm".into();
        let error = render(&dgd, None).unwrap_err();
        assert_eq!(
            error.to_string(),
            "spec.components[2] (decode): podTemplate.spec.containers has no container named \"main\" (found: vllm); the main container runs the component"
        );
        dgd.spec.components[2].pod_template = None;
        assert!(matches!(
            render(&dgd, None),
            Err(RenderError::MissingPodTemplate { index: 2, .. })
        ));
    }

    #[test]
    fn missing_image_and_long_names_are_errors() {
        let mut dgd = sample();
        dgd.spec.components[0]
            .pod_template
            .as_mut()
            .unwrap()
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .image = None;
        assert!(matches!(
            render(&dgd, None),
            Err(RenderError::MissingImage { index: 0, .. })
        ));
        let mut dgd = sample();
        dgd.metadata.name = Some("a".repeat(60));
        assert!(matches!(render(&dgd, None), Err(RenderError::NameTooLong { .. })));
    }

    #[test]
    fn without_topology_renders_exactly_as_before() {
        // Rendered by the code before topology support (commit 650665c) from the same input.
        let input = include_str!("../../../tests/fixtures/render/dgd-without-topology.yaml");
        let golden = include_str!("../../../tests/fixtures/render/dgd-without-topology.rendered.json");
        let dgd: DynamoGraphDeployment = serde_yaml::from_str(input).unwrap();
        let topology = topology::resolve(&dgd.spec, |_| unreachable!("no lookup without the field")).unwrap();
        assert!(topology.is_none());
        let rendered = render(&dgd, topology.as_ref()).unwrap();
        let actual = serde_json::json!({"deployments": rendered.deployments, "services": rendered.services});
        let mut expected: serde_json::Value = serde_json::from_str(golden).unwrap();
        // Added since, to every pod: what the Dynamo PodMonitors select and scrape.
        for deployment in expected["deployments"].as_array_mut().unwrap() {
            let template = &mut deployment["spec"]["template"];
            let labels = template["metadata"]["labels"].as_object_mut().unwrap();
            let worker =
                ["prefill", "decode", "worker"].contains(&labels[LABEL_COMPONENT_TYPE].as_str().unwrap());
            labels.insert(LABEL_METRICS_ENABLED.into(), "true".into());
            labels.insert(LABEL_DYNAMO_NAMESPACE.into(), "llm-llama-disagg".into());
            if labels[LABEL_COMPONENT_TYPE] == "frontend" {
                // And the frontend's request migration, first.
                let env = template["spec"]["containers"][0]["env"].as_array_mut().unwrap();
                env.insert(
                    0,
                    serde_json::json!({"name": "DYN_MIGRATION_LIMIT", "value": "3"}),
                );
            }
            if worker {
                let main = &mut template["spec"]["containers"][0];
                let env = main["env"].as_array_mut().unwrap();
                let at = env.iter().position(|e| e["name"] == "DYN_COMPONENT").unwrap() + 1;
                env.insert(
                    at,
                    serde_json::json!({"name": "DYN_SYSTEM_ENABLED", "value": "true"}),
                );
                env.insert(
                    at + 1,
                    serde_json::json!({"name": "DYN_SYSTEM_PORT", "value": "9090"}),
                );
                main["ports"] =
                    serde_json::json!([{"containerPort": 9090, "name": "system", "protocol": "TCP"}]);
            }
        }
        assert_eq!(actual, expected);
    }

    #[test]
    fn topology_goes_to_workers_and_the_frontend_only() {
        use crate::topology::{
            ClusterTopologyLookup, ENV_DYN_KV_TRANSFER_DOMAIN, ENV_LEVEL, ENV_MISMATCH_POLICY,
            ENV_TOPOLOGY_ENABLED, EnvContract,
        };
        use planner_api::{ClusterTopologySpec, TopologyLevel};
        let mut dgd = sample();
        // A planner component, which gets nothing.
        let mut planner = dgd.spec.components[2].clone();
        planner.name = "planner".into();
        planner.kind = Some(ComponentType::Planner);
        dgd.spec.components.push(planner);
        let lookup = ClusterTopologyLookup::Found(ClusterTopologySpec {
            levels: vec![
                TopologyLevel {
                    domain: "zone".into(),
                    key: "topology.kubernetes.io/zone".into(),
                },
                TopologyLevel {
                    domain: "rack".into(),
                    key: "nvidia.com/rack".into(),
                },
            ],
        });
        let mut resolved = topology::resolve(&dgd.spec, |_| lookup).unwrap().unwrap();
        let without = render(&dgd, None).unwrap();
        let names = |d: &Deployment| -> Vec<String> { env_of(d).into_iter().map(|(n, _)| n).collect() };
        // The default contract is the released runtime's: workers only, files at its path.
        assert_eq!(resolved.contract, EnvContract::Dynamo);
        let with = render(&dgd, Some(&resolved)).unwrap();
        assert_eq!(with.services, without.services);
        assert_eq!(
            with.deployments[0], without.deployments[0],
            "the frontend is untouched"
        );
        for worker in &with.deployments[1..3] {
            let env = env_of(worker);
            assert!(env.contains(&(ENV_TOPOLOGY_ENABLED.into(), "true".into())));
            assert!(env.contains(&(ENV_DYN_KV_TRANSFER_DOMAIN.into(), "zone".into())));
            assert!(!names(worker).contains(&ENV_LEVEL.to_string()));
            let pod = worker.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
            let mount = pod.containers[0].volume_mounts.as_ref().unwrap().last().unwrap();
            assert_eq!(mount.mount_path, topology::DYNAMO_MOUNT_PATH);
        }
        // This operator's first contract, on request.
        resolved.contract = EnvContract::Planner;
        let with = render(&dgd, Some(&resolved)).unwrap();
        assert_eq!(with.services, without.services);
        let frontend = env_of(&with.deployments[0]);
        assert!(frontend.contains(&(ENV_LEVEL.into(), "zone".into())));
        assert!(frontend.contains(&(ENV_MISMATCH_POLICY.into(), "fail".into())));
        assert!(!names(&with.deployments[0]).contains(&ENV_TOPOLOGY_ENABLED.to_string()));
        for worker in &with.deployments[1..3] {
            let env = env_of(worker);
            assert!(env.contains(&(ENV_TOPOLOGY_ENABLED.into(), "true".into())));
            assert!(env.contains(&(ENV_LEVEL.into(), "zone".into())));
            let pod = worker.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
            let volume = pod.volumes.as_ref().unwrap().last().unwrap();
            assert_eq!(volume.name, topology::VOLUME_NAME);
            assert_eq!(
                volume
                    .downward_api
                    .as_ref()
                    .unwrap()
                    .items
                    .as_ref()
                    .unwrap()
                    .len(),
                2
            );
            let mount = pod.containers[0].volume_mounts.as_ref().unwrap().last().unwrap();
            assert_eq!(
                (mount.mount_path.as_str(), mount.read_only),
                (topology::MOUNT_PATH, Some(true))
            );
        }
        assert_eq!(
            with.deployments[3], without.deployments[3],
            "the planner is untouched"
        );
    }

    #[test]
    fn names_are_lowercase_dns_labels() {
        assert_eq!(workload_name("my.graph", "Decode"), "my-graph-decode");
        assert_eq!(dynamo_namespace("ns", "my.graph"), "ns-my-graph");
        assert!(is_dns_label("a-b1"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label("A"));
    }
}

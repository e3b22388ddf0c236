//! How Prometheus finds the bed's processes: as it would find the pods on a cluster where
//! NVIDIA's Dynamo platform chart installed its `dynamo-frontend` and `dynamo-worker`
//! PodMonitors and the Prometheus Operator turned them into scrape configurations.
//!
//! Kubernetes service discovery (role `pod`) gives one target per container port of a pod, with
//! the pod's metadata as `__meta_kubernetes_*` labels; the Prometheus Operator's scrape
//! configuration keeps the targets whose pod labels match the PodMonitor's selector and whose
//! port has the endpoint's name, then applies the endpoint's relabelings. Here the pods run on
//! fake nodes and their processes on this host, so the bed plays the service discovery: it
//! writes a `file_sd` file with the same labels, taken from the real pod objects, and the
//! target address of the process that plays the container port. The scrape configurations are
//! the Prometheus Operator's for NVIDIA's two PodMonitors, with `file_sd_configs` in place of
//! `kubernetes_sd_configs`. So a pod that lacks the labels or the named port NVIDIA's
//! PodMonitors select is not scraped here either, and the frontend's series get their
//! `dynamo_namespace` only from the pod label `nvidia.com/dynamo-namespace`, as on a cluster.

use std::{collections::BTreeMap, path::Path};

use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod};
use serde_json::{Value, json};

/// Namespace of the PodMonitors in the job names (`<namespace>/<name>`); NVIDIA's platform
/// chart is usually installed there.
pub const PODMONITOR_NAMESPACE: &str = "dynamo-system";

/// A selector term of a PodMonitor: a pod label and the values it may have.
struct Selects {
    label: &'static str,
    values: &'static [&'static str],
}

/// One `podMetricsEndpoints` entry of a PodMonitor and the PodMonitor's selector.
struct PodMonitor {
    name: &'static str,
    selector: &'static [Selects],
    port: &'static str,
    honor_labels: bool,
    /// Relabelings of the endpoint: (source pod label, target label).
    relabel: &'static [(&'static str, &'static str)],
}

/// NVIDIA's PodMonitors (Dynamo platform chart, `templates/prometheus.yaml`), as far as the
/// bed's pods can match them: the worker PodMonitor's extra endpoints for GPU-memory-service
/// failover ports and frontend sidecars select ports the bed's pods do not have.
const PODMONITORS: [PodMonitor; 2] = [
    PodMonitor {
        name: "dynamo-frontend",
        selector: &[
            Selects {
                label: "nvidia.com/dynamo-component-type",
                values: &["frontend"],
            },
            Selects {
                label: "nvidia.com/metrics-enabled",
                values: &["true"],
            },
        ],
        port: "http",
        honor_labels: true,
        relabel: &[("nvidia.com/dynamo-namespace", "dynamo_namespace")],
    },
    PodMonitor {
        name: "dynamo-worker",
        selector: &[
            Selects {
                label: "nvidia.com/dynamo-component-type",
                values: &["worker", "decode", "prefill"],
            },
            Selects {
                label: "nvidia.com/metrics-enabled",
                values: &["true"],
            },
        ],
        port: "system",
        honor_labels: false,
        relabel: &[("nvidia.com/dynamo-component-type", "dynamo_component_type")],
    },
];

/// A label name as Prometheus's service discovery writes it: every character outside
/// `[a-zA-Z0-9_]` becomes `_`.
pub fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The `__meta_kubernetes_*` labels Kubernetes service discovery gives the target of `port` of
/// `container` in `pod` (role `pod`), with `address` (the process on this host) as the target.
pub fn target_group(pod: &Pod, container: &Container, port: &ContainerPort, address: &str) -> Value {
    let meta = &pod.metadata;
    let status = pod.status.as_ref();
    let mut labels = BTreeMap::<String, String>::new();
    let mut set = |key: String, value: &str| {
        labels.insert(key, value.to_string());
    };
    set(
        "__meta_kubernetes_namespace".into(),
        meta.namespace.as_deref().unwrap_or_default(),
    );
    set(
        "__meta_kubernetes_pod_name".into(),
        meta.name.as_deref().unwrap_or_default(),
    );
    set(
        "__meta_kubernetes_pod_uid".into(),
        meta.uid.as_deref().unwrap_or_default(),
    );
    for (key, value) in meta.labels.iter().flatten() {
        set(format!("__meta_kubernetes_pod_label_{}", sanitize(key)), value);
        set(
            format!("__meta_kubernetes_pod_labelpresent_{}", sanitize(key)),
            "true",
        );
    }
    for (key, value) in meta.annotations.iter().flatten() {
        set(
            format!("__meta_kubernetes_pod_annotation_{}", sanitize(key)),
            value,
        );
        set(
            format!("__meta_kubernetes_pod_annotationpresent_{}", sanitize(key)),
            "true",
        );
    }
    if let Some(owner) = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
    {
        set("__meta_kubernetes_pod_controller_kind".into(), &owner.kind);
        set("__meta_kubernetes_pod_controller_name".into(), &owner.name);
    }
    set(
        "__meta_kubernetes_pod_node_name".into(),
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default(),
    );
    set(
        "__meta_kubernetes_pod_ip".into(),
        status.and_then(|s| s.pod_ip.as_deref()).unwrap_or_default(),
    );
    set(
        "__meta_kubernetes_pod_host_ip".into(),
        status.and_then(|s| s.host_ip.as_deref()).unwrap_or_default(),
    );
    set(
        "__meta_kubernetes_pod_phase".into(),
        status.and_then(|s| s.phase.as_deref()).unwrap_or_default(),
    );
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map_or("unknown", |c| if c.status == "True" { "true" } else { "false" });
    set("__meta_kubernetes_pod_ready".into(), ready);
    set("__meta_kubernetes_pod_container_init".into(), "false");
    set("__meta_kubernetes_pod_container_name".into(), &container.name);
    set(
        "__meta_kubernetes_pod_container_image".into(),
        container.image.as_deref().unwrap_or_default(),
    );
    set(
        "__meta_kubernetes_pod_container_port_name".into(),
        port.name.as_deref().unwrap_or_default(),
    );
    set(
        "__meta_kubernetes_pod_container_port_number".into(),
        &port.container_port.to_string(),
    );
    set(
        "__meta_kubernetes_pod_container_port_protocol".into(),
        port.protocol.as_deref().unwrap_or("TCP"),
    );
    json!({"targets": [address], "labels": labels})
}

/// A relabel rule that keeps targets whose pod has `label` with one of `values`, as the
/// Prometheus Operator writes a PodMonitor's selector.
fn keep_selected(selects: &Selects) -> Value {
    let label = sanitize(selects.label);
    json!({
        "action": "keep",
        "source_labels": [
            format!("__meta_kubernetes_pod_label_{label}"),
            format!("__meta_kubernetes_pod_labelpresent_{label}"),
        ],
        "regex": format!("({});true", selects.values.join("|")),
    })
}

/// The scrape configuration the Prometheus Operator generates for `monitor`, discovering
/// targets from `targets_file` instead of the Kubernetes API.
fn scrape_config(monitor: &PodMonitor, targets_file: &Path, interval_s: u32) -> Value {
    let job = format!("{PODMONITOR_NAMESPACE}/{}", monitor.name);
    let mut relabel = vec![json!({"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"})];
    relabel.extend(monitor.selector.iter().map(keep_selected));
    relabel.extend([
        json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": monitor.port}),
        json!({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}),
        json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
        json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}),
        json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
        json!({"target_label": "job", "replacement": job}),
        json!({"target_label": "endpoint", "replacement": monitor.port}),
    ]);
    relabel.extend(monitor.relabel.iter().map(|(label, target)| {
        json!({
            "action": "replace",
            "source_labels": [format!("__meta_kubernetes_pod_label_{}", sanitize(label))],
            "target_label": target,
        })
    }));
    json!({
        "job_name": format!("podMonitor/{job}/0"),
        "honor_labels": monitor.honor_labels,
        "scrape_interval": format!("{interval_s}s"),
        "metrics_path": "/metrics",
        "file_sd_configs": [{"files": [targets_file.display().to_string()], "refresh_interval": "5s"}],
        "relabel_configs": relabel,
    })
}

/// A Prometheus configuration that scrapes the bed's processes every `interval_s` seconds as
/// NVIDIA's PodMonitors would scrape the pods (targets from `targets_file`), and the `extra`
/// static targets (job name, host:port), e.g. the operator's metrics.
pub fn prometheus_config(targets_file: &Path, interval_s: u32, extra: &[(String, String)]) -> String {
    let mut jobs: Vec<Value> = PODMONITORS
        .iter()
        .map(|m| scrape_config(m, targets_file, interval_s))
        .collect();
    jobs.extend(extra.iter().map(|(job, target)| {
        json!({"job_name": job, "honor_labels": true, "static_configs": [{"targets": [target]}]})
    }));
    let config = json!({
        "global": {
            "scrape_interval": format!("{interval_s}s"),
            "evaluation_interval": format!("{interval_s}s"),
        },
        "scrape_configs": jobs,
    });
    let yaml = serde_yaml::to_string(&config).unwrap_or_default();
    format!(
        "# Written by `planner-sim dynamo-bed`: the scrape configurations the Prometheus Operator\n\
         # generates for NVIDIA's dynamo-frontend and dynamo-worker PodMonitors, with file_sd in\n\
         # place of Kubernetes service discovery (the bed writes the pods' labels to the file).\n{yaml}"
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "llama-frontend-abc", "namespace": "ns", "uid": "u1",
                "labels": {"nvidia.com/dynamo-component-type": "frontend", "nvidia.com/metrics-enabled": "true",
                           "nvidia.com/dynamo-namespace": "ns-llama"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "llama-frontend-1",
                                     "uid": "r", "controller": true}]
            },
            "spec": {"nodeName": "gpu-a1-1", "containers": [{"name": "main", "image": "img",
                     "ports": [{"name": "http", "containerPort": 8000}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap()
    }

    #[test]
    fn targets_carry_the_labels_kubernetes_service_discovery_gives_a_pod_port() {
        let pod = pod();
        let container = &pod.spec.as_ref().unwrap().containers[0];
        let port = &container.ports.as_ref().unwrap()[0];
        let group = target_group(&pod, container, port, "127.0.0.1:4000");
        assert_eq!(group["targets"], json!(["127.0.0.1:4000"]));
        let labels = &group["labels"];
        for (key, value) in [
            ("__meta_kubernetes_namespace", "ns"),
            ("__meta_kubernetes_pod_name", "llama-frontend-abc"),
            (
                "__meta_kubernetes_pod_label_nvidia_com_dynamo_component_type",
                "frontend",
            ),
            (
                "__meta_kubernetes_pod_labelpresent_nvidia_com_metrics_enabled",
                "true",
            ),
            (
                "__meta_kubernetes_pod_label_nvidia_com_dynamo_namespace",
                "ns-llama",
            ),
            ("__meta_kubernetes_pod_container_name", "main"),
            ("__meta_kubernetes_pod_container_port_name", "http"),
            ("__meta_kubernetes_pod_container_port_number", "8000"),
            ("__meta_kubernetes_pod_phase", "Running"),
            ("__meta_kubernetes_pod_ready", "true"),
            ("__meta_kubernetes_pod_controller_kind", "ReplicaSet"),
            ("__meta_kubernetes_pod_node_name", "gpu-a1-1"),
        ] {
            assert_eq!(labels[key], value, "{key}");
        }
    }

    #[test]
    fn the_scrape_keeps_what_nvidias_podmonitors_select_and_adds_their_labels() {
        let config: Value = serde_yaml::from_str(&prometheus_config(
            Path::new("/b/targets.json"),
            2,
            &[("op".into(), "h:1".into())],
        ))
        .unwrap();
        let jobs = config["scrape_configs"].as_array().unwrap();
        assert_eq!(jobs.len(), 3);
        let frontend = &jobs[0];
        assert_eq!(frontend["job_name"], "podMonitor/dynamo-system/dynamo-frontend/0");
        assert_eq!(frontend["honor_labels"], true);
        assert_eq!(frontend["scrape_interval"], "2s");
        assert_eq!(frontend["file_sd_configs"][0]["files"][0], "/b/targets.json");
        let rules = frontend["relabel_configs"].as_array().unwrap();
        let keeps: Vec<(&Value, &Value)> = rules
            .iter()
            .filter(|r| r["action"] == "keep")
            .map(|r| (&r["source_labels"][0], &r["regex"]))
            .collect();
        assert_eq!(
            keeps,
            [
                (
                    &json!("__meta_kubernetes_pod_label_nvidia_com_dynamo_component_type"),
                    &json!("(frontend);true")
                ),
                (
                    &json!("__meta_kubernetes_pod_label_nvidia_com_metrics_enabled"),
                    &json!("(true);true")
                ),
                (
                    &json!("__meta_kubernetes_pod_container_port_name"),
                    &json!("http")
                ),
            ]
        );
        // The frontend's dynamo_namespace comes from the pod label, last.
        assert_eq!(
            rules.last().unwrap(),
            &json!({"action": "replace", "source_labels": ["__meta_kubernetes_pod_label_nvidia_com_dynamo_namespace"],
                    "target_label": "dynamo_namespace"})
        );
        let worker = &jobs[1];
        assert_eq!(worker["honor_labels"], false);
        let rules = worker["relabel_configs"].as_array().unwrap();
        assert!(rules.contains(&json!({"action": "keep", "source_labels": [
            "__meta_kubernetes_pod_label_nvidia_com_dynamo_component_type",
            "__meta_kubernetes_pod_labelpresent_nvidia_com_dynamo_component_type"],
            "regex": "(worker|decode|prefill);true"})));
        assert!(rules.contains(
            &json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                                        "regex": "system"})
        ));
        assert_eq!(jobs[2]["static_configs"][0]["targets"][0], "h:1");
    }

    #[test]
    fn label_names_are_sanitized_as_prometheus_does() {
        assert_eq!(
            sanitize("nvidia.com/dynamo-namespace"),
            "nvidia_com_dynamo_namespace"
        );
        assert_eq!(sanitize("app_kubernetes_io"), "app_kubernetes_io");
    }
}

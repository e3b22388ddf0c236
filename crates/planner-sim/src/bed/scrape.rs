//! How Prometheus finds the bed's processes: as it would find the pods on a cluster where
//! PodMonitors select them and the Prometheus Operator turns those into scrape configurations:
//! NVIDIA's `dynamo-frontend` and `dynamo-worker` PodMonitors (its Dynamo platform chart), or
//! the PodMonitors of a file (this chart's `dynamoPodMonitors`, rendered by `helm template`).
//!
//! Kubernetes service discovery (role `pod`) gives one target per container port of a pod, with
//! the pod's metadata as `__meta_kubernetes_*` labels; the Prometheus Operator's scrape
//! configuration keeps the targets whose pod labels match the PodMonitor's selector and whose
//! port has the endpoint's name, then applies the endpoint's relabelings. Here the pods run on
//! fake nodes and their processes on this host, so the bed plays the service discovery: it
//! writes a `file_sd` file with the same labels, taken from the real pod objects, and the
//! target address of the process that plays the container port. The scrape configurations are
//! the Prometheus Operator's for the PodMonitors, with `file_sd_configs` in place of
//! `kubernetes_sd_configs`. So a pod that lacks the labels or the named port the PodMonitors
//! select is not scraped here either, and series get `dynamo_namespace` only where a relabeling
//! copies it from the pod label `nvidia.com/dynamo-namespace` (or the process sets it), as on a
//! cluster.

use std::{collections::BTreeMap, path::Path};

use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod};
use serde::Deserialize;
use serde_json::{Value, json};

/// Namespace of NVIDIA's PodMonitors in the job names (`<namespace>/<name>`); NVIDIA's platform
/// chart is usually installed there.
pub const PODMONITOR_NAMESPACE: &str = "dynamo-system";

/// A selector term of a PodMonitor: a pod label and the values it may have (any value when
/// empty: the label must exist).
#[derive(Clone, Debug, PartialEq)]
struct Selects {
    label: String,
    values: Vec<String>,
}

/// One `podMetricsEndpoints` entry of a PodMonitor, with the PodMonitor's selectors.
#[derive(Clone, Debug, PartialEq)]
pub struct PodMonitor {
    /// `<namespace>/<name>` of the PodMonitor: the `job` label of its series.
    job: String,
    /// The entry's index in `podMetricsEndpoints` (the job name's last part).
    index: usize,
    selector: Vec<Selects>,
    /// The namespaces whose pods it selects (`namespaceSelector.matchNames`); none: any.
    namespaces: Option<Vec<String>>,
    port: String,
    path: String,
    honor_labels: bool,
    /// The endpoint's `relabelings`, as Prometheus relabel configurations.
    relabel: Vec<Value>,
}

impl PodMonitor {
    fn nvidia(name: &str, types: &[&str], port: &str, honor_labels: bool, relabel: (&str, &str)) -> Self {
        let text = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Self {
            job: format!("{PODMONITOR_NAMESPACE}/{name}"),
            index: 0,
            selector: vec![
                Selects {
                    label: "nvidia.com/dynamo-component-type".into(),
                    values: text(types),
                },
                Selects {
                    label: "nvidia.com/metrics-enabled".into(),
                    values: text(&["true"]),
                },
            ],
            namespaces: None,
            port: port.into(),
            path: "/metrics".into(),
            honor_labels,
            relabel: vec![json!({
                "action": "replace",
                "source_labels": [format!("__meta_kubernetes_pod_label_{}", sanitize(relabel.0))],
                "target_label": relabel.1,
            })],
        }
    }
}

/// NVIDIA's PodMonitors (Dynamo platform chart, `templates/prometheus.yaml`), as far as the
/// bed's pods can match them: the worker PodMonitor's extra endpoints for GPU-memory-service
/// failover ports and frontend sidecars select ports the bed's pods do not have. The frontend's
/// `dynamo_namespace` comes from its pod label; the workers' series keep only the labels their
/// processes set, plus the component type.
pub fn nvidia_pod_monitors() -> Vec<PodMonitor> {
    vec![
        PodMonitor::nvidia(
            "dynamo-frontend",
            &["frontend"],
            "http",
            true,
            ("nvidia.com/dynamo-namespace", "dynamo_namespace"),
        ),
        PodMonitor::nvidia(
            "dynamo-worker",
            &["worker", "decode", "prefill"],
            "system",
            false,
            ("nvidia.com/dynamo-component-type", "dynamo_component_type"),
        ),
    ]
}

/// A `monitoring.coreos.com/v1` field name as Prometheus's relabel configuration spells it.
fn relabel_key(key: &str) -> Option<&'static str> {
    Some(match key {
        "sourceLabels" => "source_labels",
        "separator" => "separator",
        "targetLabel" => "target_label",
        "regex" => "regex",
        "modulus" => "modulus",
        "replacement" => "replacement",
        "action" => "action",
        _ => return None,
    })
}

/// The PodMonitors of a YAML stream (e.g. `helm template` of this chart with
/// `dynamoPodMonitors.enabled`), one entry per metrics endpoint. Only what the Prometheus
/// Operator would turn into a scrape of a named port is accepted; anything else is an error
/// naming the field.
pub fn pod_monitors_from_yaml(text: &str) -> Result<Vec<PodMonitor>, String> {
    let mut monitors = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = Value::deserialize(document).map_err(|e| format!("not YAML: {e}"))?;
        if value.is_null() {
            continue;
        }
        let name = value["metadata"]["name"].as_str().unwrap_or_default();
        if value["kind"] != "PodMonitor" || name.is_empty() {
            return Err(format!(
                "expected PodMonitor objects with a metadata.name, got kind {} name `{name}`",
                value["kind"]
            ));
        }
        let error = |field: &str, what: &str| format!("PodMonitor {name}: {field}: {what}");
        let namespace = value["metadata"]["namespace"].as_str().unwrap_or("default");
        let spec = &value["spec"];
        let mut selector = Vec::new();
        for (label, v) in spec["selector"]["matchLabels"].as_object().into_iter().flatten() {
            let v = v
                .as_str()
                .ok_or_else(|| error("spec.selector.matchLabels", "values must be strings"))?;
            selector.push(Selects {
                label: label.clone(),
                values: vec![v.to_string()],
            });
        }
        for expression in spec["selector"]["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let label = expression["key"]
                .as_str()
                .ok_or_else(|| error("spec.selector.matchExpressions[].key", "missing"))?;
            let values: Vec<String> = expression["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            match expression["operator"].as_str() {
                Some("In") if !values.is_empty() => {}
                Some("Exists") if values.is_empty() => {}
                other => {
                    return Err(error(
                        "spec.selector.matchExpressions[].operator",
                        &format!("{other:?}: the bed plays `In` (with values) and `Exists` only"),
                    ));
                }
            }
            selector.push(Selects {
                label: label.to_string(),
                values,
            });
        }
        let namespaces = if spec["namespaceSelector"]["any"] == true {
            None
        } else if let Some(names) = spec["namespaceSelector"]["matchNames"].as_array() {
            Some(
                names
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_string))
                    .collect(),
            )
        } else {
            // The Prometheus Operator's default: the PodMonitor's own namespace.
            Some(vec![namespace.to_string()])
        };
        let endpoints = spec["podMetricsEndpoints"]
            .as_array()
            .ok_or_else(|| error("spec.podMetricsEndpoints", "missing"))?;
        for (index, endpoint) in endpoints.iter().enumerate() {
            let port = endpoint["port"].as_str().ok_or_else(|| {
                error(
                    "spec.podMetricsEndpoints[].port",
                    "the bed scrapes named ports only",
                )
            })?;
            let mut relabel = Vec::new();
            for rule in endpoint["relabelings"].as_array().into_iter().flatten() {
                let mut out = serde_json::Map::new();
                for (key, v) in rule.as_object().into_iter().flatten() {
                    let key = relabel_key(key).ok_or_else(|| {
                        error(
                            "spec.podMetricsEndpoints[].relabelings[]",
                            &format!("unknown field {key}"),
                        )
                    })?;
                    let v = if key == "action" {
                        json!(v.as_str().unwrap_or_default().to_lowercase())
                    } else {
                        v.clone()
                    };
                    out.insert(key.into(), v);
                }
                relabel.push(Value::Object(out));
            }
            monitors.push(PodMonitor {
                job: format!("{namespace}/{name}"),
                index,
                selector: selector.clone(),
                namespaces: namespaces.clone(),
                port: port.to_string(),
                path: endpoint["path"].as_str().unwrap_or("/metrics").to_string(),
                honor_labels: endpoint["honorLabels"] == true,
                relabel,
            });
        }
    }
    if monitors.is_empty() {
        return Err("no PodMonitor in the file".into());
    }
    Ok(monitors)
}

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

/// A relabel rule that keeps targets whose pod has `label` with one of `values` (or at all), as
/// the Prometheus Operator writes a PodMonitor's selector.
fn keep_selected(selects: &Selects) -> Value {
    let label = sanitize(&selects.label);
    if selects.values.is_empty() {
        return json!({
            "action": "keep",
            "source_labels": [format!("__meta_kubernetes_pod_labelpresent_{label}")],
            "regex": "true",
        });
    }
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
    let job = &monitor.job;
    let mut relabel = vec![json!({"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"})];
    if let Some(namespaces) = &monitor.namespaces {
        // Kubernetes service discovery asks only for these namespaces' pods.
        relabel.push(
            json!({"action": "keep", "source_labels": ["__meta_kubernetes_namespace"],
                            "regex": format!("({})", namespaces.join("|"))}),
        );
    }
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
    relabel.extend(monitor.relabel.iter().cloned());
    json!({
        "job_name": format!("podMonitor/{job}/{}", monitor.index),
        "honor_labels": monitor.honor_labels,
        "scrape_interval": format!("{interval_s}s"),
        "metrics_path": monitor.path,
        "file_sd_configs": [{"files": [targets_file.display().to_string()], "refresh_interval": "5s"}],
        "relabel_configs": relabel,
    })
}

/// A Prometheus configuration that scrapes the bed's processes every `interval_s` seconds as
/// `monitors` would scrape the pods (targets from `targets_file`; the interval replaces the
/// PodMonitors' own), and the `extra` static targets (job name, host:port), e.g. the operator's
/// metrics.
pub fn prometheus_config(
    monitors: &[PodMonitor],
    targets_file: &Path,
    interval_s: u32,
    extra: &[(String, String)],
) -> String {
    let mut jobs: Vec<Value> = monitors
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
         # generates for the PodMonitors that scrape Dynamo's pods, with file_sd in place of\n\
         # Kubernetes service discovery (the bed writes the pods' labels to the file).\n{yaml}"
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
            &nvidia_pod_monitors(),
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

    /// This chart's `dynamoPodMonitors` as `helm template` renders them (trimmed).
    const CHART: &str = r#"
---
# Source: planner-operator/templates/dynamo-podmonitors.yaml
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata:
  name: demo-planner-operator-dynamo-frontend
  namespace: planner-demo
spec:
  namespaceSelector:
    any: true
  selector:
    matchLabels:
      nvidia.com/dynamo-component-type: frontend
      nvidia.com/metrics-enabled: "true"
  podMetricsEndpoints:
    - port: http
      path: /metrics
      interval: 5s
      honorLabels: true
      relabelings:
        - action: replace
          sourceLabels: [__meta_kubernetes_pod_label_nvidia_com_dynamo_namespace]
          targetLabel: dynamo_namespace
---
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata:
  name: demo-planner-operator-dynamo-worker
  namespace: planner-demo
spec:
  namespaceSelector:
    matchNames: [planner-demo]
  selector:
    matchLabels:
      nvidia.com/metrics-enabled: "true"
    matchExpressions:
      - key: nvidia.com/dynamo-component-type
        operator: In
        values: [worker, prefill, decode]
  podMetricsEndpoints:
    - port: system
      path: /metrics
      honorLabels: true
      relabelings:
        - action: Replace
          sourceLabels: [__meta_kubernetes_pod_label_nvidia_com_dynamo_namespace]
          targetLabel: dynamo_namespace
"#;

    #[test]
    fn podmonitors_from_a_file_scrape_as_the_prometheus_operator_would() {
        let monitors = pod_monitors_from_yaml(CHART).unwrap();
        assert_eq!(monitors.len(), 2);
        let config: Value = serde_yaml::from_str(&prometheus_config(
            &monitors,
            Path::new("/b/targets.json"),
            1,
            &[],
        ))
        .unwrap();
        let jobs = config["scrape_configs"].as_array().unwrap();
        assert_eq!(
            jobs[0]["job_name"],
            "podMonitor/planner-demo/demo-planner-operator-dynamo-frontend/0"
        );
        assert_eq!(jobs[1]["honor_labels"], true);
        let rules = jobs[1]["relabel_configs"].as_array().unwrap();
        // Only the named namespaces' pods, the selector's label and values, the named port, and
        // the endpoint's relabeling last (its action as Prometheus spells it).
        assert!(rules.contains(
            &json!({"action": "keep", "source_labels": ["__meta_kubernetes_namespace"],
                                       "regex": "(planner-demo)"})
        ));
        assert!(rules.contains(&json!({"action": "keep", "source_labels": [
            "__meta_kubernetes_pod_label_nvidia_com_dynamo_component_type",
            "__meta_kubernetes_pod_labelpresent_nvidia_com_dynamo_component_type"],
            "regex": "(worker|prefill|decode);true"})));
        assert!(rules.contains(&json!({"action": "keep", "source_labels": [
            "__meta_kubernetes_pod_label_nvidia_com_metrics_enabled",
            "__meta_kubernetes_pod_labelpresent_nvidia_com_metrics_enabled"],
            "regex": "(true);true"})));
        assert!(rules.contains(&json!({"target_label": "job",
                                       "replacement": "planner-demo/demo-planner-operator-dynamo-worker"})));
        assert_eq!(
            rules.last().unwrap(),
            &json!({"action": "replace", "source_labels": ["__meta_kubernetes_pod_label_nvidia_com_dynamo_namespace"],
                    "target_label": "dynamo_namespace"})
        );
        // The frontend's selects any namespace.
        let frontend = jobs[0]["relabel_configs"].as_array().unwrap();
        assert!(
            !frontend
                .iter()
                .any(|r| r["source_labels"][0] == "__meta_kubernetes_namespace" && r["action"] == "keep")
        );
    }

    #[test]
    fn podmonitors_the_bed_cannot_play_are_named() {
        let not_in = CHART.replace("operator: In", "operator: NotIn");
        let error = pod_monitors_from_yaml(&not_in).unwrap_err();
        assert!(
            error.contains("demo-planner-operator-dynamo-worker") && error.contains("operator"),
            "{error}"
        );
        let numbered = CHART.replace("- port: system", "- portNumber: 9090");
        let error = pod_monitors_from_yaml(&numbered).unwrap_err();
        assert!(error.contains("podMetricsEndpoints[].port"), "{error}");
        let unknown = format!("{CHART}          foo: bar\n");
        assert!(
            pod_monitors_from_yaml(&unknown)
                .unwrap_err()
                .contains("unknown field foo")
        );
        assert!(pod_monitors_from_yaml("kind: Service\nmetadata: {name: x}\n").is_err());
        assert!(pod_monitors_from_yaml("").unwrap_err().contains("no PodMonitor"));
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

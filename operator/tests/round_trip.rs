//! Serde round trips of every type: samples parse into the Rust types, Rust defaults equal the
//! schema defaults the API server applies, and DGD fields this operator does not model survive.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use planner_api::{
    ClusterTopologySpec, ComponentType, DynamoGraphDeployment, GpuBudget, MismatchPolicy, PlannerMode,
    PlannerPolicy, PredictorKind,
};
use serde_json::{Value, json};
use support::{crd_for, load_yaml, open_api_schema, repo_root, served_here, yaml_files};

/// What the API server stores for an object: the object with schema defaults applied.
fn defaulted(object: &Value) -> Value {
    let schema = open_api_schema(&crd_for(object));
    kube::core::cel::apply_defaults(&schema, object)
}

/// Parses into `T` and serializes back.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(object: &Value) -> Value {
    let typed: T = serde_json::from_value(object.clone()).expect("parses into the Rust type");
    serde_json::to_value(typed).expect("serializes")
}

fn round_trip_any(object: &Value) -> Value {
    match object["kind"].as_str() {
        Some("PlannerPolicy") => round_trip::<PlannerPolicy>(object),
        Some("DynamoGraphDeployment") => round_trip::<DynamoGraphDeployment>(object),
        Some("GpuBudget") => round_trip::<GpuBudget>(object),
        other => panic!("unexpected kind {other:?}"),
    }
}

/// Quantities may be written as numbers (`nvidia.com/gpu: 1`); the typed view keeps them as the
/// equivalent strings.
fn quantities_as_strings(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if (key == "limits" || key == "requests")
                    && let Value::Object(quantities) = child
                {
                    for quantity in quantities.values_mut() {
                        if let Value::Number(n) = quantity {
                            *quantity = Value::String(n.to_string());
                        }
                    }
                }
                quantities_as_strings(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(quantities_as_strings),
        _ => {}
    }
}

/// `300` and `300.0` are the same number to the API server.
fn numbers_as_floats(value: &Value) -> Value {
    match value {
        Value::Number(n) => json!(n.as_f64()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), numbers_as_floats(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(numbers_as_floats).collect()),
        other => other.clone(),
    }
}

#[test]
fn every_sample_parses_and_round_trips_to_what_the_api_server_stores() {
    for path in yaml_files(&repo_root().join("config/samples")) {
        let sample = load_yaml(&path);
        if !served_here(&sample) {
            // Grove's ClusterTopologyBinding: read below, validated by Grove's CRD in the e2e tests.
            continue;
        }
        let mut stored = defaulted(&sample);
        quantities_as_strings(&mut stored);
        // Rust fills the same defaults as the schema, so the typed view of the sample equals the
        // typed view of what the server stores.
        assert_eq!(
            numbers_as_floats(&round_trip_any(&sample)),
            numbers_as_floats(&round_trip_any(&stored)),
            "{}: Rust defaults differ from schema defaults",
            path.display()
        );
        // And the typed view writes back only what is stored: a block that holds nothing but
        // its defaults (one the schema does not write when it is left out) may be left out.
        let typed = numbers_as_floats(&round_trip_any(&stored));
        let stored = numbers_as_floats(&stored);
        if let Some(difference) = not_within(&typed, &stored, "") {
            panic!(
                "{}: stored object does not round trip: {difference}",
                path.display()
            );
        }
    }
}

/// Where `part` says something `whole` does not (`None`: every field of `part` is in `whole`
/// with the same value).
fn not_within(part: &Value, whole: &Value, at: &str) -> Option<String> {
    match (part, whole) {
        (Value::Object(part), Value::Object(whole)) => part.iter().find_map(|(key, value)| {
            let at = format!("{at}.{key}");
            match whole.get(key) {
                Some(stored) => not_within(value, stored, &at),
                None => Some(format!("{at} is written but not stored")),
            }
        }),
        _ if part == whole => None,
        _ => Some(format!("{at}: {part} written, {whole} stored")),
    }
}

#[test]
fn planner_policy_defaults_are_the_upstream_planner_defaults() {
    let minimal = json!({
        "apiVersion": "planner.dynamo.io/v1alpha1",
        "kind": "PlannerPolicy",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"targetRef": {"name": "dgd"}, "profile": {"builtin": "h200-llama3.1-8b-tp1"}}
    });
    let policy: PlannerPolicy = serde_json::from_value(minimal.clone()).unwrap();
    let spec = &policy.spec;
    assert_eq!(spec.mode, PlannerMode::Sla);
    assert_eq!(spec.adjustment_interval, "180s");
    assert_eq!((spec.sla.ttft_ms, spec.sla.itl_ms), (500.0, 50.0));
    assert_eq!(spec.bounds.min_replicas, 1);
    assert_eq!(spec.bounds.max_replicas, None);
    assert_eq!(spec.bounds.max_gpu_budget, 8);
    assert_eq!(spec.predictor.kind, PredictorKind::Arima);
    assert!(!spec.predictor.log1p);
    let kalman = &spec.predictor.kalman;
    assert_eq!(
        (kalman.q_level, kalman.q_trend, kalman.r, kalman.min_points),
        (1.0, 0.1, 10.0, 5)
    );
    assert_eq!(spec.predictor.prophet.window_size, 50);
    assert!(spec.correction.enabled);
    assert_eq!(spec.connector.decision_timeout, "1800s");
    let load = &spec.load;
    assert_eq!(
        (
            load.decode_kv_scale_up_threshold,
            load.decode_kv_scale_down_threshold,
            load.prefill_queue_scale_up_threshold,
            load.prefill_queue_scale_down_threshold,
            load.decode_grace_period_intervals,
            load.prefill_queue_buffer_intervals,
        ),
        (0.9, 0.5, 0.5, 0.2, 3, 3)
    );
    // And the API server would store exactly these.
    assert_eq!(serde_json::to_value(&policy).unwrap(), defaulted(&minimal));
}

#[test]
fn dgd_keeps_fields_it_does_not_model() {
    let upstream = json!({
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "g", "namespace": "ns"},
        "spec": {
            "annotations": {"team": "inference"},
            "restart": {"id": "r1", "strategy": {"type": "Sequential"}},
            // As stored: the API server has applied the schema's enforcement default.
            "experimental": {"kvTransferPolicy": {"labelKey": "topology.kubernetes.io/zone", "domain": "zone", "enforcement": "required"}, "future": {"a": 1}},
            "topologyConstraint": {"clusterTopologyName": "ct", "packDomain": "rack", "future": 1},
            "components": [
                {
                    "name": "decode",
                    "type": "decode",
                    "replicas": 2,
                    "multinode": {"nodeCount": 2},
                    "sharedMemorySize": "16Gi",
                    "scalingAdapter": {},
                    "podTemplate": {"spec": {"containers": [{"name": "main", "image": "img"}]}}
                }
            ]
        },
        "status": {
            "state": "successful",
            "placement": {"score": 1.0, "state": "Reported"},
            "components": {"decode": {"replicas": 2, "readyReplicas": 2, "availableReplicas": 2,
                                      "updatedReplicas": 2, "runtimeNamespace": "ns-g"}}
        }
    });
    let dgd: DynamoGraphDeployment = serde_json::from_value(upstream.clone()).unwrap();
    assert_eq!(dgd.spec.components[0].kind, Some(ComponentType::Decode));
    assert_eq!(dgd.spec.components[0].replicas, Some(2));
    assert_eq!(dgd.spec.other["restart"]["id"], "r1");
    assert_eq!(dgd.spec.components[0].other["multinode"]["nodeCount"], 2);
    let status = dgd.status.as_ref().unwrap();
    assert_eq!(status.components["decode"].available_replicas, 2);
    assert_eq!(status.other["state"], "successful");
    assert_eq!(serde_json::to_value(&dgd).unwrap(), upstream);
}

#[test]
fn kv_cache_transfer_topology_defaults_to_fail() {
    let dgd: DynamoGraphDeployment = serde_json::from_value(json!({
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "g"},
        "spec": {"components": [{"name": "fe", "type": "frontend", "kvCacheTransferTopology": {"level": "zone"}}]}
    }))
    .unwrap();
    let topology = dgd.spec.components[0]
        .kv_cache_transfer_topology
        .as_ref()
        .unwrap();
    assert_eq!(topology.mismatch_policy, MismatchPolicy::Fail);
    assert_eq!(topology.label, None);
}

#[test]
fn planner_policy_status_round_trips() {
    let status = json!({
        "observedGeneration": 3,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Planning", "message": "ok",
                        "lastTransitionTime": "2026-11-22T10:00:00Z", "observedGeneration": 3}],
        "lastTickTime": "2026-11-22T10:03:00Z",
        "observed": {"requests": 120.0, "isl": 3000.0, "osl": 150.0, "ttftMs": 420.5, "itlMs": 31.2},
        "predicted": {"requests": 130.0, "isl": 3000.0, "osl": 150.0},
        "correction": {"prefill": 0.9, "decode": 1.1},
        "desired": {"prefill": 2, "decode": 3},
        "current": {"prefill": 1, "decode": 3},
        "decisionId": 7,
        "lastScaleTime": "2026-11-22T10:03:00Z",
        "message": "prefill 1 -> 2: predicted 130 requests need 1.4 prefill replicas"
    });
    let parsed: planner_api::PlannerPolicyStatus = serde_json::from_value(status.clone()).unwrap();
    assert_eq!(parsed.desired.map(|d| (d.prefill, d.decode)), Some((2, 3)));
    assert_eq!(serde_json::to_value(parsed).unwrap(), status);
}

/// The sample binding is Grove's shape (`{domain, key}`), read as the operator reads it.
#[test]
fn the_sample_cluster_topology_binding_is_read_with_grove_field_names() {
    let sample = load_yaml(&repo_root().join("config/samples/cluster-topology.yaml"));
    assert_eq!(sample["apiVersion"], "grove.io/v1alpha1");
    assert_eq!(sample["kind"], "ClusterTopologyBinding");
    assert!(sample["metadata"].get("namespace").is_none(), "cluster-scoped");
    let spec: ClusterTopologySpec = serde_json::from_value(sample["spec"].clone()).unwrap();
    let levels: Vec<(&str, &str)> = spec
        .levels
        .iter()
        .map(|l| (l.domain.as_str(), l.key.as_str()))
        .collect();
    assert_eq!(
        levels,
        [
            ("zone", "topology.kubernetes.io/zone"),
            ("rack", "nvidia.com/rack"),
            ("host", "kubernetes.io/hostname"),
        ]
    );
}

//! A stand-in for NVIDIA's conversion webhook (`/convert` of `dynamo-operator-webhook-service`),
//! served over HTTPS by the test process, for the tests that are about conversion: a graph and
//! its scaling adapters written at `nvidia.com/v1alpha1` and read and written by the planner at
//! `v1beta1`, and the webhook being down.
//!
//! Why a stand-in: NVIDIA's converter is part of NVIDIA's operator (Go, with its own webhooks and
//! controllers), which does not run here. It is kept as narrow as the tests need: the fields the
//! planner reads or writes and the fields the test writes, converted as NVIDIA's converter does
//! for them (`deploy/operator/api/v1alpha1/*_conversion.go` at Dynamo's commit 2a6da14c):
//! - DGD spec: `services` (a map) ↔ `components` (a list, by name): `componentType` +
//!   `subComponentType` ↔ `type` (`worker` + `prefill`/`decode` → `prefill`/`decode`),
//!   `replicas`, `scalingAdapter.enabled: true` ↔ `scalingAdapter: {}`, the main container
//!   (`extraPodSpec.mainContainer` ↔ `podTemplate` container `main`) and its GPUs
//!   (`resources.limits.gpu` ↔ `nvidia.com/gpu`); other spec fields are copied. A v1alpha1
//!   service's other fields survive a round trip in an annotation, as NVIDIA's converter keeps
//!   what v1beta1 cannot hold.
//! - DGD status: `services` ↔ `components` (`componentName` added at v1alpha1, where it is
//!   required); other status fields are copied.
//! - DGDSA: `dgdRef.serviceName` ↔ `dgdRef.componentName`.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use axum::{Json, Router, routing::post};
use e2e::Result;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use planner_operator::webhook::{
    certs::{self, CertSettings, Plan},
    tls::{self, CertResolver},
};
use serde_json::{Map, Value, json};
use tokio::{sync::oneshot, task::JoinHandle};

/// Annotation holding a graph's v1alpha1 services across a round trip through v1beta1.
const SERVICES_ANNOTATION: &str = "e2e.planner.dynamo.io/v1alpha1-services";

/// The running stand-in; [`ConversionWebhook::stop`] takes it down (the API server then answers
/// conversions with an error), [`ConversionWebhook::start_again`] brings it back on the same port.
pub struct ConversionWebhook {
    /// Its `/convert` URL.
    pub url: String,
    /// Its CA, base64-encoded PEM, for the CRDs' `caBundle`.
    pub ca_bundle: String,
    addr: SocketAddr,
    resolver: Arc<CertResolver>,
    server: Mutex<Option<(oneshot::Sender<()>, JoinHandle<()>)>>,
}

impl ConversionWebhook {
    /// Starts it on a loopback port with a certificate for `127.0.0.1`.
    pub async fn start() -> Result<Self> {
        let settings = CertSettings {
            service: "conversion".into(),
            namespace: "e2e".into(),
            extra_hosts: vec!["127.0.0.1".into()],
        };
        let bundle = certs::issue(Plan::All, None, &settings, certs::unix_now())?;
        let resolver = Arc::new(CertResolver::default());
        resolver.set(tls::certified_key(bundle.cert.as_bytes(), bundle.key.as_bytes())?);
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let webhook = Self {
            url: format!("https://{addr}/convert"),
            ca_bundle: base64(bundle.ca_cert.as_bytes()),
            addr,
            resolver,
            server: Mutex::new(None),
        };
        webhook.serve(listener)?;
        Ok(webhook)
    }

    fn serve(&self, listener: tokio::net::TcpListener) -> Result<()> {
        let config = tls::server_config(Arc::clone(&self.resolver))?;
        let router = Router::new().route("/convert", post(convert));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(tls::serve(listener, config, router, async move {
            let _ = stopped.await;
        }));
        if let Ok(mut server) = self.server.lock() {
            *server = Some((stop, task));
        }
        Ok(())
    }

    /// Takes it down: the port is closed until [`ConversionWebhook::start_again`].
    pub async fn stop(&self) {
        let server = self.server.lock().ok().and_then(|mut s| s.take());
        if let Some((stop, task)) = server {
            let _ = stop.send(());
            let _ = task.await;
        }
    }

    /// Serves again on the same port.
    pub async fn start_again(&self) -> Result<()> {
        let listener = tokio::net::TcpListener::bind(self.addr).await?;
        self.serve(listener)
    }
}

fn base64(bytes: &[u8]) -> String {
    use k8s_openapi::ByteString;
    // ByteString serializes as base64, as the API server expects `caBundle`.
    serde_json::to_value(ByteString(bytes.to_vec()))
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

async fn convert(Json(review): Json<ConversionReview>) -> Json<ConversionReview> {
    let request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(_) => {
            return Json(
                ConversionResponse::invalid(kube::core::Status::failure("no request", "BadRequest"))
                    .into_review(),
            );
        }
    };
    let desired = request.desired_api_version.clone();
    let converted: std::result::Result<Vec<Value>, String> = request
        .objects
        .iter()
        .map(|object| convert_object(object, &desired))
        .collect();
    let response = ConversionResponse::for_request(request);
    Json(
        match converted {
            Ok(objects) => response.success(objects),
            Err(message) => response.failure(kube::core::Status::failure(&message, "ConversionFailed")),
        }
        .into_review(),
    )
}

/// Converts one object to `desired` (`nvidia.com/v1alpha1` or `nvidia.com/v1beta1`).
pub fn convert_object(object: &Value, desired: &str) -> std::result::Result<Value, String> {
    let mut object = object.clone();
    if object["apiVersion"] == desired {
        return Ok(object);
    }
    let to_beta = match desired {
        "nvidia.com/v1beta1" => true,
        "nvidia.com/v1alpha1" => false,
        other => return Err(format!("cannot convert to {other}")),
    };
    match object["kind"].as_str() {
        Some("DynamoGraphDeployment") => {
            if to_beta {
                graph_to_beta(&mut object);
            } else {
                graph_to_alpha(&mut object);
            }
        }
        Some("DynamoGraphDeploymentScalingAdapter") => {
            let (from, to) = if to_beta {
                ("serviceName", "componentName")
            } else {
                ("componentName", "serviceName")
            };
            if let Some(reference) = object.pointer_mut("/spec/dgdRef").and_then(Value::as_object_mut)
                && let Some(name) = reference.remove(from)
            {
                reference.insert(to.into(), name);
            }
        }
        other => return Err(format!("cannot convert kind {other:?}")),
    }
    object["apiVersion"] = json!(desired);
    Ok(object)
}

const ROLES: [&str; 6] = ["frontend", "worker", "prefill", "decode", "planner", "epp"];

fn graph_to_beta(object: &mut Value) {
    let services = object["spec"]
        .as_object_mut()
        .and_then(|spec| spec.remove("services"))
        .and_then(|s| s.as_object().cloned())
        .unwrap_or_default();
    let mut components = Vec::new();
    for (name, service) in &services {
        let text = |key: &str| service.get(key).and_then(Value::as_str);
        let role = text("subComponentType")
            .filter(|s| matches!(*s, "prefill" | "decode"))
            .or(text("componentType"))
            .filter(|r| ROLES.contains(r));
        let mut component = json!({"name": name});
        if let Some(role) = role {
            component["type"] = json!(role);
        }
        if let Some(replicas) = service.get("replicas") {
            component["replicas"] = replicas.clone();
        }
        if service.pointer("/scalingAdapter/enabled") == Some(&json!(true)) {
            component["scalingAdapter"] = json!({});
        }
        let mut main = service
            .pointer("/extraPodSpec/mainContainer")
            .cloned()
            .unwrap_or_else(|| json!({}));
        main["name"] = json!("main");
        if let Some(gpu) = service.pointer("/resources/limits/gpu") {
            main["resources"]["limits"]["nvidia.com/gpu"] = gpu.clone();
        }
        component["podTemplate"] = json!({"spec": {"containers": [main]}});
        components.push(component);
    }
    object["spec"]["components"] = Value::Array(components);
    object["metadata"]["annotations"][SERVICES_ANNOTATION] = json!(Value::Object(services).to_string());
    if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut)
        && let Some(Value::Object(mut counts)) = status.remove("services")
    {
        for count in counts.values_mut() {
            if let Some(count) = count.as_object_mut() {
                count.remove("componentName");
            }
        }
        status.insert("components".into(), Value::Object(counts));
    }
}

fn graph_to_alpha(object: &mut Value) {
    let graph = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let kept: Map<String, Value> = object["metadata"]["annotations"][SERVICES_ANNOTATION]
        .as_str()
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    let components = object["spec"]
        .as_object_mut()
        .and_then(|spec| spec.remove("components"))
        .and_then(|c| c.as_array().cloned())
        .unwrap_or_default();
    let mut services = Map::new();
    for component in components {
        let Some(name) = component["name"].as_str() else {
            continue;
        };
        let mut service = kept.get(name).cloned().unwrap_or_else(|| {
            let mut service = json!({});
            match component["type"].as_str() {
                Some(role @ ("prefill" | "decode")) => {
                    service["componentType"] = json!("worker");
                    service["subComponentType"] = json!(role);
                }
                Some(role) => service["componentType"] = json!(role),
                None => {}
            }
            if let Some(main) = component
                .pointer("/podTemplate/spec/containers")
                .and_then(Value::as_array)
                .and_then(|c| c.iter().find(|c| c["name"] == "main"))
            {
                let mut main = main.clone();
                if let Some(gpu) = main.pointer("/resources/limits/nvidia.com~1gpu").cloned() {
                    service["resources"] = json!({"limits": {"gpu": gpu}});
                }
                if let Some(main) = main.as_object_mut() {
                    main.remove("name");
                    main.remove("resources");
                }
                service["extraPodSpec"] = json!({"mainContainer": main});
            }
            service
        });
        match component.get("replicas") {
            Some(replicas) => service["replicas"] = replicas.clone(),
            None => {
                if let Some(service) = service.as_object_mut() {
                    service.remove("replicas");
                }
            }
        }
        if component.get("scalingAdapter").is_some() {
            service["scalingAdapter"] = json!({"enabled": true});
        }
        services.insert(name.to_string(), service);
    }
    object["spec"]["services"] = Value::Object(services);
    if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut)
        && let Some(Value::Object(mut counts)) = status.remove("components")
    {
        for (name, count) in counts.iter_mut() {
            count["componentName"] = json!(format!("{graph}-{}", name.to_lowercase()));
        }
        status.insert("services".into(), Value::Object(counts));
    }
}

#[test]
fn a_v1alpha1_graph_round_trips_through_v1beta1() {
    let alpha = json!({
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "g"},
        "spec": {"backendFramework": "vllm", "services": {
            "VllmDecodeWorker": {"componentType": "worker", "subComponentType": "decode", "replicas": 1,
                "envFromSecret": "hf", "resources": {"limits": {"gpu": "1"}},
                "scalingAdapter": {"enabled": true},
                "extraPodSpec": {"mainContainer": {"image": "i", "args": ["--model", "m"]}}}
        }},
        "status": {"state": "successful", "services": {"VllmDecodeWorker": {"componentKind": "Deployment", "componentName": "g-vllmdecodeworker", "replicas": 1, "updatedReplicas": 1}}}
    });
    let beta = convert_object(&alpha, "nvidia.com/v1beta1").unwrap();
    let decode = &beta["spec"]["components"][0];
    assert_eq!(decode["type"], "decode");
    assert_eq!(decode["scalingAdapter"], json!({}));
    assert_eq!(
        decode["podTemplate"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "1"
    );
    assert_eq!(
        beta["status"]["components"]["VllmDecodeWorker"].get("componentName"),
        None
    );
    let mut scaled = beta.clone();
    scaled["spec"]["components"][0]["replicas"] = json!(3);
    let back = convert_object(&scaled, "nvidia.com/v1alpha1").unwrap();
    let service = &back["spec"]["services"]["VllmDecodeWorker"];
    assert_eq!(service["replicas"], 3);
    assert_eq!(service["envFromSecret"], "hf");
    assert_eq!(back["spec"]["backendFramework"], "vllm");
    assert_eq!(
        back["status"]["services"]["VllmDecodeWorker"]["componentName"],
        "g-vllmdecodeworker"
    );
}

//! The admission webhook in process: AdmissionReview JSON in, AdmissionReview out, through the
//! same axum router the server runs, with lookups answered from a fixed world (the samples'
//! ClusterTopologyBinding `gpu-cluster` and DGD `llama-disagg`). Also fuzzes the handler with arbitrary
//! bodies, checks the server's limits (body size and time, concurrent reviews, header time) and
//! load-tests it over TLS.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Body,
    http::{Request, StatusCode},
};
use planner_api::{ClusterTopologySpec, DynamoGraphDeployment, GpuBudget};
use planner_operator::{
    lookup::TargetLookup,
    target::TargetGraph,
    topology::ClusterTopologyLookup,
    validation::{PrometheusUrlPolicy, Tenancy},
    webhook::{
        Admission, Lookups,
        admission::{DGD_PATH, PLANNER_POLICY_PATH},
        router,
    },
};
use proptest::prelude::*;
use serde_json::{Value, json};
use support::{load_yaml, repo_root, validate, yaml_files};
use tower::ServiceExt;

/// What the fake API server holds.
#[derive(Clone)]
struct World {
    grove_installed: bool,
    topologies: BTreeMap<String, ClusterTopologySpec>,
    dgds: BTreeMap<(String, String), DynamoGraphDeployment>,
    budgets: BTreeMap<String, GpuBudget>,
    /// Every lookup fails with this message.
    failing: Option<String>,
    /// Every lookup takes this long.
    delay: Duration,
    /// Lookups in progress, and the most seen at once.
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl World {
    /// Waits out the delay, counting the lookups that wait at once.
    async fn wait(&self) {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Lookups for World {
    type Error = std::io::Error;

    async fn cluster_topology(&self, name: &str) -> Result<ClusterTopologyLookup, std::io::Error> {
        self.wait().await;
        if let Some(message) = &self.failing {
            return Err(std::io::Error::other(message.clone()));
        }
        // Today's Grove: the ClusterTopologyBinding CRD served, as in the e2e cluster.
        Ok(if !self.grove_installed {
            ClusterTopologyLookup::GroveNotInstalled
        } else {
            self.topologies.get(name).cloned().map_or(
                ClusterTopologyLookup::BindingNotFound { legacy_served: false },
                ClusterTopologyLookup::FoundBinding,
            )
        })
    }

    async fn target_graph(&self, namespace: &str, name: &str) -> Result<TargetLookup, std::io::Error> {
        self.wait().await;
        if let Some(message) = &self.failing {
            return Err(std::io::Error::other(message.clone()));
        }
        Ok(match self.dgds.get(&(namespace.into(), name.into())) {
            Some(dgd) => match TargetGraph::try_from(dgd) {
                Ok(graph) => TargetLookup::Found(Box::new(graph)),
                Err(error) => TargetLookup::Unreadable(error),
            },
            None => TargetLookup::NotFound,
        })
    }

    async fn gpu_budget(&self, name: &str) -> Result<Option<GpuBudget>, std::io::Error> {
        self.wait().await;
        if let Some(message) = &self.failing {
            return Err(std::io::Error::other(message.clone()));
        }
        Ok(self.budgets.get(name).cloned())
    }
}

const NAMESPACE: &str = "llm";

fn sample<T: serde::de::DeserializeOwned>(file: &str) -> T {
    serde_json::from_value(load_yaml(&repo_root().join("config/samples").join(file))).unwrap()
}

fn world() -> World {
    let binding = load_yaml(&repo_root().join("config/samples/cluster-topology.yaml"));
    let topology: ClusterTopologySpec = serde_json::from_value(binding["spec"].clone()).unwrap();
    let dgd: DynamoGraphDeployment = sample("dgd-disagg.yaml");
    World {
        grove_installed: true,
        topologies: BTreeMap::from([("gpu-cluster".to_string(), topology)]),
        dgds: BTreeMap::from([((NAMESPACE.to_string(), "llama-disagg".to_string()), dgd)]),
        budgets: BTreeMap::new(),
        failing: None,
        delay: Duration::ZERO,
        in_flight: Arc::default(),
        peak: Arc::default(),
    }
}

fn app(world: World) -> Router {
    router(Arc::new(
        Admission::new(world, None).with_timeout(Duration::from_millis(200)),
    ))
}

/// An AdmissionReview for `object` (CREATE, or UPDATE from `old`).
fn review(object: &Value, old: Option<&Value>) -> Value {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = object["kind"].as_str().unwrap_or_default();
    let resource = match kind {
        "DynamoGraphDeployment" => "dynamographdeployments",
        "PlannerPolicy" => "plannerpolicies",
        _ => "unknown",
    };
    let mut object = object.clone();
    set_namespace(&mut object);
    let mut old = old.cloned();
    if let Some(old) = &mut old {
        set_namespace(old);
    }
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "name": object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default(),
            "namespace": NAMESPACE,
            "operation": if old.is_some() { "UPDATE" } else { "CREATE" },
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false
        }
    })
}

/// Sets `metadata.namespace` where the object has room for it (fuzzed objects may not).
fn set_namespace(object: &mut Value) {
    if let Some(map) = object.as_object_mut() {
        let metadata = map.entry("metadata").or_insert_with(|| json!({}));
        if let Some(metadata) = metadata.as_object_mut() {
            metadata.insert("namespace".into(), json!(NAMESPACE));
        }
    }
}

fn path_for(object: &Value) -> &'static str {
    match object["kind"].as_str() {
        Some("PlannerPolicy") => PLANNER_POLICY_PATH,
        _ => DGD_PATH,
    }
}

async fn post(app: Router, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let response = app
        .oneshot(
            Request::post(path)
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, value)
}

/// The `response` of the review for `object`.
async fn admit(world: World, object: &Value, old: Option<&Value>) -> Value {
    let body = serde_json::to_vec(&review(object, old)).unwrap();
    let (status, review) = post(app(world), path_for(object), body).await;
    assert_eq!(status, StatusCode::OK, "{review}");
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["kind"], "AdmissionReview");
    let response = review["response"].clone();
    assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    response
}

fn message(response: &Value) -> &str {
    response["status"]["message"].as_str().unwrap_or_default()
}

fn header(path: &Path, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let prefix = format!("# {name}:");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix).map(|v| v.trim().to_string()))
}

fn webhook_fixtures() -> Vec<std::path::PathBuf> {
    yaml_files(&repo_root().join("operator/tests/fixtures/webhook"))
}

#[tokio::test]
async fn every_webhook_fixture_is_denied_for_its_reason() {
    let fixtures = webhook_fixtures();
    assert!(fixtures.len() >= 15, "found {}", fixtures.len());
    let mut failures = Vec::new();
    for path in &fixtures {
        let reason = header(path, "reason").unwrap_or_else(|| panic!("{} has no reason", path.display()));
        let mut world = world();
        world.grove_installed = header(path, "grove").as_deref() != Some("absent");
        let response = admit(world, &load_yaml(path), None).await;
        if response["allowed"] != false || !message(&response).contains(&reason) {
            failures.push(format!(
                "{}: expected a denial containing {reason:?}, got allowed={} {:?}",
                path.file_name().unwrap().to_string_lossy(),
                response["allowed"],
                message(&response)
            ));
        }
        if response["allowed"] == false {
            assert_eq!(response["status"]["code"], 422, "{}", path.display());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn webhook_fixtures_pass_the_schema_so_the_webhook_is_what_rejects_them() {
    for path in webhook_fixtures() {
        let errors = validate(&load_yaml(&path));
        if header(&path, "schema").as_deref() == Some("rejects") {
            assert!(!errors.is_empty(), "{} is accepted by the schema", path.display());
        } else {
            assert!(
                errors.is_empty(),
                "{} is rejected by the schema: {errors:?}",
                path.display()
            );
        }
    }
}

#[tokio::test]
async fn samples_and_valid_fixtures_are_allowed() {
    let mut files = yaml_files(&repo_root().join("config/samples"));
    files.extend(yaml_files(
        &repo_root().join("operator/tests/fixtures/webhook/valid"),
    ));
    for path in files {
        let object = load_yaml(&path);
        // Kinds the webhook does not review (their schema does).
        if object["kind"] == "ClusterTopologyBinding" || object["kind"] == "GpuBudget" {
            continue;
        }
        let response = admit(world(), &object, None).await;
        assert_eq!(
            response["allowed"],
            true,
            "{}: {}",
            path.display(),
            message(&response)
        );
    }
}

#[tokio::test]
async fn the_admins_allowances_admit_what_the_default_denies() {
    let admit_with = async |tenancy: Tenancy, fixture: &str| {
        let object = load_yaml(&repo_root().join("operator/tests/fixtures/webhook").join(fixture));
        let app = router(Arc::new(Admission::new(world(), None).with_tenancy(tenancy)));
        let body = serde_json::to_vec(&review(&object, None)).unwrap();
        let (status, review) = post(app, PLANNER_POLICY_PATH, body).await;
        assert_eq!(status, StatusCode::OK, "{review}");
        review["response"].clone()
    };
    let fixtures = [
        "ppol-foreign-dynamo-namespace.yaml",
        "ppol-foreign-decision-keys.yaml",
    ];
    for fixture in fixtures {
        let denied = admit_with(Tenancy::default(), fixture).await;
        assert_eq!(denied["allowed"], false, "{fixture}");
    }
    // Allowed to this namespace only: another namespace is still denied.
    let elsewhere = Tenancy {
        dynamo_namespaces: vec!["other/team-b-llama".into(), "other/dynamo".into()],
        ..Tenancy::default()
    };
    let here = Tenancy {
        dynamo_namespaces: vec![format!("{NAMESPACE}/team-b-llama"), "*/dynamo".into()],
        ..Tenancy::default()
    };
    for fixture in fixtures {
        assert_eq!(
            admit_with(elsewhere.clone(), fixture).await["allowed"],
            false,
            "{fixture}"
        );
        let allowed = admit_with(here.clone(), fixture).await;
        assert_eq!(allowed["allowed"], true, "{fixture}: {}", message(&allowed));
    }
    // Prometheus limited to the operator's default.
    let mut policy: Value = sample("plannerpolicy-sla.yaml");
    policy["spec"]["metrics"]["prometheus"] = json!({"url": "http://user:pw@elsewhere:9090/"});
    let default_only = Tenancy {
        prometheus: PrometheusUrlPolicy::DefaultOnly,
        default_prometheus_url: "http://prometheus.monitoring:9090".into(),
        ..Tenancy::default()
    };
    let app = router(Arc::new(Admission::new(world(), None).with_tenancy(default_only)));
    let (_, review) = post(
        app,
        PLANNER_POLICY_PATH,
        serde_json::to_vec(&review(&policy, None)).unwrap(),
    )
    .await;
    let text = message(&review["response"]).to_string();
    assert_eq!(review["response"]["allowed"], false);
    assert!(
        text.contains("spec.metrics.prometheus.url: \"http://***@elsewhere:9090/\" is not allowed"),
        "{text}"
    );
    assert!(!text.contains("pw"), "{text}");
}

/// A target that runs upstream Dynamo's planner is admitted with a warning that names the
/// component and how to hand the graph over (the reconciler refuses it until then).
#[tokio::test]
async fn a_target_running_upstreams_planner_is_admitted_with_a_warning() {
    let mut planned = world();
    let dgd = planned
        .dgds
        .get_mut(&(NAMESPACE.to_string(), "llama-disagg".to_string()))
        .unwrap();
    let mut planner = dgd.spec.components[2].clone();
    planner.name = "Planner".into();
    planner.kind = Some(planner_api::ComponentType::Planner);
    dgd.spec.components.push(planner);
    let policy: Value = sample("plannerpolicy-sla.yaml");
    let response = admit(planned.clone(), &policy, None).await;
    assert_eq!(response["allowed"], true, "{}", message(&response));
    let warnings = response["warnings"].as_array().cloned().unwrap_or_default();
    assert_eq!(warnings.len(), 1, "{response}");
    let warning = warnings[0].as_str().unwrap_or_default();
    assert!(
        warning.contains("runs upstream Dynamo's planner (component \"Planner\", type planner, 1 replica)")
            && warning.contains("scaling it to zero replicas (spec.components[3].replicas: 0)")
            && warning.contains("reason UpstreamPlannerRunning"),
        "{warning}"
    );
    // Without the planner component, no warning.
    let response = admit(world(), &policy, None).await;
    assert!(response.get("warnings").is_none_or(Value::is_null), "{response}");
}

#[tokio::test]
async fn a_budget_below_the_minimums_is_allowed_to_scale_to_zero_only_with_a_warning() {
    let fixture = repo_root().join("operator/tests/fixtures/webhook/ppol-gpu-budget-below-minimums.yaml");
    let mut policy = load_yaml(&fixture);
    policy["spec"]["bounds"]["allowScaleToZero"] = json!(true);
    let response = admit(world(), &policy, None).await;
    assert_eq!(response["allowed"], true, "{}", message(&response));
    let warnings = response["warnings"].as_array().cloned().unwrap_or_default();
    assert_eq!(warnings.len(), 1, "{response}");
    assert!(
        warnings[0]
            .as_str()
            .unwrap_or_default()
            .contains("scales both pools to zero"),
        "{warnings:?}"
    );
    // Raising the minimum on an update is checked again, though the target did not change.
    let valid: Value = sample("plannerpolicy-sla.yaml");
    let mut raised = valid.clone();
    raised["spec"]["bounds"] = json!({"minReplicas": 5, "maxGpuBudget": 8});
    let response = admit(world(), &raised, Some(&valid)).await;
    assert_eq!(response["allowed"], false);
    assert!(
        message(&response).contains("allowed: at least 10"),
        "{}",
        message(&response)
    );
    // Observe mode never scales: no budget rule.
    raised["spec"]["mode"] = json!("observe");
    assert_eq!(admit(world(), &raised, None).await["allowed"], true);
}

#[tokio::test]
async fn a_policy_joins_only_a_budget_that_admits_it_and_holds_its_floor() {
    let budget: GpuBudget = sample("gpubudget.yaml");
    let mut with_budget = world();
    with_budget.budgets.insert("shared-gpus".into(), budget.clone());
    let policy = load_yaml(&repo_root().join("config/samples/plannerpolicy-sla.yaml"));
    let mut member = policy.clone();
    member["spec"]["budgetRef"] = json!({"name": "shared-gpus"});
    // The sample admits the samples' namespace.
    let response = admit(with_budget.clone(), &member, None).await;
    assert_eq!(response["allowed"], true, "{}", message(&response));
    // Another namespace's budget: denied, naming who it admits.
    let mut elsewhere = with_budget.clone();
    let mut other = budget.clone();
    other
        .spec
        .members
        .retain(|m| m.namespace != NAMESPACE && m.namespace != "*");
    elsewhere.budgets.insert("shared-gpus".into(), other);
    let response = admit(elsewhere, &member, None).await;
    assert_eq!(response["allowed"], false);
    assert!(
        message(&response).contains(
            "spec.budgetRef.name: GpuBudget \"shared-gpus\" does not admit PlannerPolicy llm/llama-sla"
        ),
        "{}",
        message(&response)
    );
    // A floor the budget cannot hold.
    let mut small = with_budget.clone();
    let mut tiny = budget.clone();
    tiny.spec.total_gpus = 1;
    small.budgets.insert("shared-gpus".into(), tiny);
    let response = admit(small, &member, None).await;
    assert!(message(&response).contains("is more than GpuBudget \"shared-gpus\"'s total of 1 GPUs"));
    // Joining later is checked; so is a failed lookup, with a reason to retry.
    let response = admit(world(), &member, Some(&policy)).await;
    assert!(message(&response).contains("GpuBudget \"shared-gpus\" not found"));
    let mut failing = with_budget;
    failing.failing = Some("connection refused".into());
    let response = admit(failing, &member, None).await;
    assert_eq!(response["status"]["code"], 503);
}

#[tokio::test]
async fn updates_check_lookups_only_when_their_fields_change() {
    let dgd = load_yaml(&repo_root().join("config/samples/dgd-disagg.yaml"));
    let mut gone = world();
    gone.topologies.clear();
    // The ClusterTopologyBinding was deleted after admission: the planner can still scale.
    let mut scaled = dgd.clone();
    scaled["spec"]["components"][1]["replicas"] = json!(4);
    let response = admit(gone.clone(), &scaled, Some(&dgd)).await;
    assert_eq!(response["allowed"], true, "{}", message(&response));
    // Labels and finalizers change without any check.
    let mut labelled = dgd.clone();
    labelled["metadata"]["labels"] = json!({"team": "a"});
    assert_eq!(admit(gone.clone(), &labelled, Some(&dgd)).await["allowed"], true);
    // Changing the topology is checked again.
    let mut moved = dgd.clone();
    moved["spec"]["components"][0]["kvCacheTransferTopology"]["level"] = json!("rack");
    let response = admit(gone, &moved, Some(&dgd)).await;
    assert_eq!(response["allowed"], false);
    assert!(message(&response).contains("ClusterTopologyBinding \"gpu-cluster\" not found"));
    // A policy whose target was deleted can still be edited, unless it retargets.
    let policy = load_yaml(&repo_root().join("config/samples/plannerpolicy-sla.yaml"));
    let mut no_dgds = world();
    no_dgds.dgds.clear();
    let mut tuned = policy.clone();
    tuned["spec"]["sla"]["ttftMs"] = json!(400);
    assert_eq!(
        admit(no_dgds.clone(), &tuned, Some(&policy)).await["allowed"],
        true
    );
    let mut retargeted = policy.clone();
    retargeted["spec"]["targetRef"]["name"] = json!("other");
    assert_eq!(admit(no_dgds, &retargeted, Some(&policy)).await["allowed"], false);
}

#[tokio::test]
async fn deletes_and_objects_being_deleted_are_allowed() {
    let dgd = load_yaml(&repo_root().join("config/samples/dgd-disagg.yaml"));
    let mut gone = world();
    gone.grove_installed = false;
    let mut review = review(&dgd, None);
    review["request"]["operation"] = json!("DELETE");
    review["request"]["oldObject"] = review["request"]["object"].take();
    let (status, answer) = post(app(gone.clone()), DGD_PATH, serde_json::to_vec(&review).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["response"]["allowed"], true);
    let mut deleting = dgd.clone();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    assert_eq!(admit(gone, &deleting, Some(&dgd)).await["allowed"], true);
}

#[tokio::test]
async fn failed_and_slow_lookups_deny_with_a_reason_to_retry() {
    let dgd = load_yaml(&repo_root().join("config/samples/dgd-disagg.yaml"));
    let mut failing = world();
    failing.failing = Some("clustertopologybindings.grove.io is forbidden".into());
    let response = admit(failing, &dgd, None).await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 503);
    assert!(
        message(&response).contains("spec.topologyConstraint.clusterTopologyName: cannot read ClusterTopologyBinding \"gpu-cluster\" to check the KV-transfer topology (clustertopologybindings.grove.io is forbidden); retry"),
        "{}",
        message(&response)
    );
    let mut slow = world();
    slow.delay = Duration::from_secs(5);
    let policy = load_yaml(&repo_root().join("config/samples/plannerpolicy-load.yaml"));
    let response = admit(slow, &policy, None).await;
    assert_eq!(response["allowed"], false);
    assert!(
        message(&response).contains("took longer than"),
        "{}",
        message(&response)
    );
}

#[tokio::test]
async fn dgds_this_operator_cannot_read_are_admitted_with_a_warning() {
    let mut dgd = load_yaml(&repo_root().join("config/samples/dgd-disagg.yaml"));
    dgd["spec"]["components"][0]["replicas"] = json!("many");
    let response = admit(world(), &dgd, None).await;
    assert_eq!(response["allowed"], true);
    let warning = response["warnings"][0].as_str().unwrap();
    assert!(warning.contains("components[0].replicas"), "{warning}");
}

#[tokio::test]
async fn policies_name_unknown_profiles_and_unreadable_fields() {
    let mut policy = load_yaml(&repo_root().join("config/samples/plannerpolicy-sla.yaml"));
    policy["spec"]["profile"]["builtin"] = json!("a100-llama-7b");
    let response = admit(world(), &policy, None).await;
    assert!(
        message(&response).starts_with("spec.profile.builtin: \"a100-llama-7b\" is not a built-in profile; allowed: h200-llama3.1-8b-tp1,"),
        "{}",
        message(&response)
    );
    let mut policy = load_yaml(&repo_root().join("config/samples/plannerpolicy-sla.yaml"));
    policy["spec"]["mode"] = json!("fast");
    let response = admit(world(), &policy, None).await;
    assert_eq!(response["allowed"], false);
    assert!(message(&response).contains("spec.mode"), "{}", message(&response));
}

#[tokio::test]
async fn a_review_of_the_wrong_kind_is_denied() {
    let policy = load_yaml(&repo_root().join("config/samples/plannerpolicy-sla.yaml"));
    let body = serde_json::to_vec(&review(&policy, None)).unwrap();
    let (status, answer) = post(app(world()), DGD_PATH, body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["response"]["allowed"], false);
    assert!(
        message(&answer["response"]).contains("this endpoint validates DynamoGraphDeployment.nvidia.com")
    );
}

#[tokio::test]
async fn malformed_bodies_get_an_invalid_review() {
    for body in [
        &b"not json"[..],
        b"{}",
        b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}",
        b"[]",
    ] {
        let (status, answer) = post(app(world()), DGD_PATH, body.to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(answer["response"]["allowed"], false);
        assert_eq!(answer["response"]["status"]["reason"], "InvalidRequest");
    }
}

/// One HTTPS request over a fresh connection that trusts only `ca_pem`; returns the server's
/// leaf certificate and the response body.
async fn https_post(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    path: &str,
    body: &[u8],
) -> Result<(Vec<u8>, Value), String> {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(planner_operator::webhook::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::IpAddress(addr.ip().into());
    let mut tls = connector.connect(name, tcp).await.map_err(|e| e.to_string())?;
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(body).await.unwrap();
    let mut response = Vec::new();
    tls.read_to_end(&mut response).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let json = text.split_once("\r\n\r\n").unwrap().1;
    Ok((leaf, serde_json::from_str(json).unwrap()))
}

fn leaf_der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().to_vec()
}

#[tokio::test]
async fn serves_over_tls_and_rotates_the_certificate_without_restart() {
    use planner_operator::webhook::{
        certs::{CertSettings, Plan, issue, unix_now},
        tls::{CertResolver, certified_key, serve, server_config},
    };
    let settings = CertSettings {
        service: "planner-operator-webhook".into(),
        namespace: "ops".into(),
        extra_hosts: vec!["127.0.0.1".into()],
    };
    let resolver = Arc::new(CertResolver::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        server_config(Arc::clone(&resolver)).unwrap(),
        app(world()),
        async move {
            let _ = stopped.await;
        },
    ));
    let dgd = load_yaml(&repo_root().join("config/samples/dgd-disagg.yaml"));
    let body = serde_json::to_vec(&review(&dgd, None)).unwrap();

    let first = issue(Plan::All, None, &settings, unix_now()).unwrap();
    // No certificate yet: handshakes fail rather than serve something unverifiable.
    assert!(https_post(addr, &first.ca_cert, DGD_PATH, &body).await.is_err());

    resolver.set(certified_key(first.cert.as_bytes(), first.key.as_bytes()).unwrap());
    let (leaf, answer) = https_post(addr, &first.ca_cert, DGD_PATH, &body).await.unwrap();
    assert_eq!(leaf, leaf_der(&first.cert));
    assert_eq!(answer["response"]["allowed"], true);

    let renewed = issue(Plan::Serving, Some(&first), &settings, unix_now()).unwrap();
    resolver.set(certified_key(renewed.cert.as_bytes(), renewed.key.as_bytes()).unwrap());
    let (leaf, answer) = https_post(addr, &first.ca_cert, DGD_PATH, &body).await.unwrap();
    assert_eq!(
        leaf,
        leaf_der(&renewed.cert),
        "new connections get the new certificate"
    );
    assert_eq!(answer["response"]["allowed"], true);

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn certificate_files_are_reloaded_when_they_change() {
    use planner_operator::{
        metrics::operator::OperatorMetrics,
        webhook::{
            certs::{CertSettings, CertSource, FileCerts, Plan, issue, maintain, unix_now},
            tls::CertResolver,
        },
    };
    let dir = std::env::temp_dir().join(format!("planner-operator-certs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let settings = CertSettings {
        service: "svc".into(),
        namespace: "ns".into(),
        extra_hosts: vec![],
    };
    let write = |bundle: &planner_operator::webhook::certs::CertBundle| {
        // As a Secret volume does: new files, then an atomic switch.
        std::fs::write(dir.join("tls.crt.tmp"), &bundle.cert).unwrap();
        std::fs::write(dir.join("tls.key.tmp"), &bundle.key).unwrap();
        std::fs::rename(dir.join("tls.crt.tmp"), dir.join("tls.crt")).unwrap();
        std::fs::rename(dir.join("tls.key.tmp"), dir.join("tls.key")).unwrap();
    };
    let first = issue(Plan::All, None, &settings, unix_now()).unwrap();
    write(&first);
    let resolver = Arc::new(CertResolver::default());
    let metrics = Arc::new(OperatorMetrics::new());
    // No API calls without a webhook configuration name; the client is never used.
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(maintain(
        CertSource::Files(FileCerts::with_check_interval(
            dir.clone(),
            Duration::from_millis(100),
        )),
        client,
        None,
        Arc::clone(&resolver),
        Arc::clone(&metrics),
        async move {
            let _ = stopped.await;
        },
    ));
    let expiry = || {
        metrics
            .encode()
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix("planner_operator_webhook_certificate_expiry_timestamp_seconds ")
                    .map(str::to_string)
            })
            .unwrap_or_default()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !resolver.is_ready() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first certificate was not loaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first_expiry = expiry();
    // A later certificate (renewed a day later, so it expires later) replaces it on the next check.
    let second = issue(Plan::Serving, Some(&first), &settings, unix_now() + 86_400).unwrap();
    write(&second);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while expiry() == first_expiry {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate was not loaded"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.send(()).unwrap();
    task.await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A body that sends `first` and then nothing, never ending.
fn stalled_body(first: &'static [u8]) -> Body {
    use futures::StreamExt;
    let chunks = futures::stream::iter([Ok::<_, std::io::Error>(axum::body::Bytes::from_static(first))])
        .chain(futures::stream::pending());
    Body::from_stream(chunks)
}

#[tokio::test]
async fn deeply_nested_bodies_are_refused_without_exhausting_the_stack() {
    for depth in [1_000, 100_000] {
        let mut body = "[".repeat(depth).into_bytes();
        body.extend(std::iter::repeat_n(b']', depth));
        let (status, answer) = post(app(world()), DGD_PATH, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        // Nested inside an otherwise valid review: the object itself.
        let dgd = load_yaml(&repo_root().join("config/samples/dgd-disagg.yaml"));
        let text = serde_json::to_string(&review(&dgd, None)).unwrap();
        let nested = text.replacen(
            "\"spec\":",
            &format!("\"deep\":{}0{},\"spec\":", "[".repeat(depth), "]".repeat(depth)),
            1,
        );
        let (status, answer) = post(app(world()), DGD_PATH, nested.into_bytes()).await;
        check_answer(status, &answer);
    }
}

#[tokio::test]
async fn an_oversized_body_is_refused() {
    use planner_operator::webhook::admission::MAX_BODY_BYTES;
    // A review as large as the API server could send for an object it stores is taken...
    let mut dgd = load_yaml(&repo_root().join("config/samples/dgd-disagg.yaml"));
    dgd["metadata"]["annotations"] = json!({"padding": "x".repeat(1_400_000)});
    let body = serde_json::to_vec(&review(&dgd, Some(&dgd))).unwrap();
    assert!(body.len() > 2_800_000 && body.len() < MAX_BODY_BYTES);
    let (status, answer) = post(app(world()), DGD_PATH, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // ... one past the cap is not, whether it declares its length or streams it.
    let oversized = vec![b' '; MAX_BODY_BYTES + 1];
    let (status, answer) = post(app(world()), DGD_PATH, oversized.clone()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    assert!(message(&answer["response"]).contains(&format!("limit of {MAX_BODY_BYTES} bytes")));
    let chunks: Vec<Result<axum::body::Bytes, std::io::Error>> = oversized
        .chunks(64 * 1024)
        .map(|c| Ok(axum::body::Bytes::copy_from_slice(c)))
        .collect();
    let response = app(world())
        .oneshot(
            Request::post(DGD_PATH)
                .body(Body::from_stream(futures::stream::iter(chunks)))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(response.headers()["connection"], "close");
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_cut_off() {
    let app = router(Arc::new(Admission::new(world(), None).with_limits(
        Duration::from_millis(300),
        4,
        1024 * 1024,
    )));
    let started = Instant::now();
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        app.oneshot(
            Request::post(DGD_PATH)
                .header("content-length", "1000")
                .body(stalled_body(b"{\"apiVersion\": "))
                .unwrap(),
        ),
    )
    .await
    .expect("a stalled body holds the handler")
    .unwrap();
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(started.elapsed() < Duration::from_secs(5));
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let answer: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(
        message(&answer["response"]).contains("did not arrive within"),
        "{answer}"
    );
}

#[tokio::test]
async fn reviews_are_answered_a_bounded_number_at_a_time() {
    let world = World {
        delay: Duration::from_millis(150),
        ..world()
    };
    let peak = Arc::clone(&world.peak);
    let app = router(Arc::new(
        Admission::new(world, None)
            .with_timeout(Duration::from_secs(5))
            .with_limits(Duration::from_secs(10), 2, 1024 * 1024),
    ));
    // Policies look their target up: each review waits in a lookup.
    let policy = load_yaml(&repo_root().join("config/samples/plannerpolicy-sla.yaml"));
    let body = serde_json::to_vec(&review(&policy, None)).unwrap();
    let answers =
        futures::future::join_all((0..8).map(|_| post(app.clone(), PLANNER_POLICY_PATH, body.clone()))).await;
    for (status, answer) in answers {
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    assert_eq!(peak.load(Ordering::SeqCst), 2, "reviews in progress at once");
}

/// A TLS server over `app` on a local port with a generated certificate: its address, the CA
/// (PEM) and a sender that stops it.
async fn tls_server(
    app: Router,
    limits: planner_operator::webhook::tls::ServeLimits,
) -> (
    std::net::SocketAddr,
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    use planner_operator::webhook::{
        certs::{CertSettings, Plan, issue, unix_now},
        tls::{CertResolver, certified_key, serve_with, server_config},
    };
    let settings = CertSettings {
        service: "planner-operator-webhook".into(),
        namespace: "ops".into(),
        extra_hosts: vec!["127.0.0.1".into()],
    };
    let certs = issue(Plan::All, None, &settings, unix_now()).unwrap();
    let resolver = Arc::new(CertResolver::default());
    resolver.set(certified_key(certs.cert.as_bytes(), certs.key.as_bytes()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_with(
        listener,
        server_config(resolver).unwrap(),
        app,
        limits,
        async move {
            let _ = stopped.await;
        },
    ));
    (addr, certs.ca_cert, stop, server)
}

/// A TLS connection to `addr` trusting `ca_pem`.
async fn tls_connect(
    addr: std::net::SocketAddr,
    ca_pem: &str,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(planner_operator::webhook::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    connector
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .unwrap()
}

/// Reads one HTTP/1.1 response (with Content-Length) from a kept-alive connection: status and
/// body.
async fn read_response(
    tls: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    buffer: &mut Vec<u8>,
) -> Option<(u16, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_string();
            let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())
                        .flatten()
                })
                .unwrap_or(0);
            while buffer.len() < end + 4 + length {
                let mut chunk = [0_u8; 16 * 1024];
                let n = tls.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buffer.extend_from_slice(&chunk[..n]);
            }
            let body = buffer[end + 4..end + 4 + length].to_vec();
            buffer.drain(..end + 4 + length);
            return Some((status, body));
        }
        let mut chunk = [0_u8; 16 * 1024];
        let n = tls.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// Whether the server closes the connection within `within` (reading whatever it sends).
async fn closed_within(
    tls: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    within: Duration,
) -> (bool, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut received = Vec::new();
    let outcome = tokio::time::timeout(within, async {
        let mut chunk = [0_u8; 4096];
        loop {
            match tls.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    (outcome.is_ok(), received)
}

#[tokio::test]
async fn slow_clients_are_cut_off_by_the_server() {
    use planner_operator::webhook::tls::ServeLimits;
    use tokio::io::AsyncWriteExt;
    let app = router(Arc::new(Admission::new(world(), None).with_limits(
        Duration::from_millis(500),
        4,
        1024 * 1024,
    )));
    let limits = ServeLimits {
        header_read_timeout: Duration::from_millis(500),
        ..ServeLimits::default()
    };
    let (addr, ca, stop, server) = tls_server(app, limits).await;

    // Headers that never end.
    let mut slow_headers = tls_connect(addr, &ca).await;
    slow_headers
        .write_all(format!("POST {DGD_PATH} HTTP/1.1\r\nHost: x\r\n").as_bytes())
        .await
        .unwrap();
    let (closed, _) = closed_within(&mut slow_headers, Duration::from_secs(5)).await;
    assert!(
        closed,
        "a client that never finishes its headers keeps its connection"
    );

    // A body that never ends: 408, then the connection closes.
    let mut slow_body = tls_connect(addr, &ca).await;
    slow_body
        .write_all(
            format!("POST {DGD_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{{\"apiVersion\"")
                .as_bytes(),
        )
        .await
        .unwrap();
    let (closed, received) = closed_within(&mut slow_body, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&received);
    assert!(
        closed,
        "a client that never finishes its body keeps its connection"
    );
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");

    // An idle kept-alive connection is closed too.
    let mut idle = tls_connect(addr, &ca).await;
    let dgd = load_yaml(&repo_root().join("config/samples/dgd-disagg.yaml"));
    let body = serde_json::to_vec(&review(&dgd, None)).unwrap();
    idle.write_all(
        format!("POST {DGD_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len())
            .as_bytes(),
    )
    .await
    .unwrap();
    idle.write_all(&body).await.unwrap();
    let (status, _) = read_response(&mut idle, &mut Vec::new()).await.unwrap();
    assert_eq!(status, 200);
    let (closed, _) = closed_within(&mut idle, Duration::from_secs(5)).await;
    assert!(closed, "an idle connection is kept open");

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_many_concurrent_reviews_over_tls() {
    use planner_operator::webhook::tls::ServeLimits;
    use tokio::io::AsyncWriteExt;
    const CONNECTIONS: usize = 64;
    const REVIEWS_PER_CONNECTION: usize = 40;
    // Lookups answered after 2 ms, like a nearby API server.
    let world = World {
        delay: Duration::from_millis(2),
        ..world()
    };
    let (addr, ca, stop, server) = tls_server(
        router(Arc::new(Admission::new(world, None))),
        ServeLimits::default(),
    )
    .await;
    let dgd = load_yaml(&repo_root().join("config/samples/dgd-disagg.yaml"));
    let policy = load_yaml(&repo_root().join("config/samples/plannerpolicy-sla.yaml"));
    let bodies = Arc::new([
        (DGD_PATH, serde_json::to_vec(&review(&dgd, None)).unwrap()),
        (
            PLANNER_POLICY_PATH,
            serde_json::to_vec(&review(&policy, None)).unwrap(),
        ),
    ]);
    let started = Instant::now();
    let clients = (0..CONNECTIONS).map(|client| {
        let (bodies, ca) = (Arc::clone(&bodies), ca.clone());
        tokio::spawn(async move {
            let mut tls = tls_connect(addr, &ca).await;
            let mut buffer = Vec::new();
            let mut latencies = Vec::new();
            for i in 0..REVIEWS_PER_CONNECTION {
                let (path, body) = &bodies[(client + i) % 2];
                let sent = Instant::now();
                let head = format!(
                    "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                tls.write_all(head.as_bytes()).await.unwrap();
                tls.write_all(body).await.unwrap();
                let (status, answer) = read_response(&mut tls, &mut buffer).await.unwrap();
                latencies.push(sent.elapsed());
                assert_eq!(status, 200);
                let answer: Value = serde_json::from_slice(&answer).unwrap();
                assert_eq!(answer["response"]["allowed"], true, "{answer}");
            }
            latencies
        })
    });
    let mut latencies: Vec<Duration> = Vec::new();
    for client in futures::future::join_all(clients).await {
        latencies.extend(client.unwrap());
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "webhook load: {} reviews over {CONNECTIONS} TLS connections in {:.2} s: {:.0} reviews/s; latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.len(),
        elapsed.as_secs_f64(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        at(1.0).as_secs_f64() * 1e3,
    );
    assert_eq!(latencies.len(), CONNECTIONS * REVIEWS_PER_CONNECTION);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .unwrap()
        .unwrap();
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[a-zA-Z0-9 ._/-]{0,12}".prop_map(Value::from),
        prop_oneof![
            Just("DynamoGraphDeployment"),
            Just("PlannerPolicy"),
            Just("CREATE"),
            Just("UPDATE"),
            Just("frontend"),
            Just("decode"),
            Just("zone"),
            Just("gpu-cluster"),
            Just("llama-disagg"),
            Just("180s"),
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    "[a-z]{1,8}",
                    Just("spec".to_string()),
                    Just("components".to_string()),
                    Just("kvCacheTransferTopology".to_string()),
                    Just("topologyConstraint".to_string()),
                    Just("targetRef".to_string()),
                    Just("level".to_string()),
                    Just("type".to_string()),
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn check_answer(status: StatusCode, answer: &Value) {
    assert!(
        status == StatusCode::OK
            || status == StatusCode::BAD_REQUEST
            || status == StatusCode::PAYLOAD_TOO_LARGE,
        "{status}"
    );
    assert!(answer["response"]["allowed"].is_boolean(), "{answer}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..512), policy in any::<bool>()) {
        let path = if policy { PLANNER_POLICY_PATH } else { DGD_PATH };
        let (status, answer) = runtime().block_on(post(app(world()), path, body));
        check_answer(status, &answer);
    }

    #[test]
    fn arbitrary_json_objects_in_a_review_never_panic(
        object in any_json(),
        old in proptest::option::of(any_json()),
        kind in prop_oneof![Just("DynamoGraphDeployment"), Just("PlannerPolicy")],
    ) {
        let mut object = object;
        if let Value::Object(map) = &mut object {
            map.insert("kind".into(), json!(kind));
            map.insert(
                "apiVersion".into(),
                json!(if kind == "PlannerPolicy" { "planner.dynamo.io/v1alpha1" } else { "nvidia.com/v1beta1" }),
            );
            map.entry("metadata").or_insert_with(|| json!({"name": "fuzz"}));
        }
        let review = review(&object, old.as_ref());
        let body = serde_json::to_vec(&review).unwrap();
        let path = if kind == "PlannerPolicy" { PLANNER_POLICY_PATH } else { DGD_PATH };
        let (status, answer) = runtime().block_on(post(app(world()), path, body));
        check_answer(status, &answer);
    }

    #[test]
    fn byte_level_mutations_of_reviews_never_panic(
        file in prop_oneof![Just("dgd-disagg.yaml"), Just("plannerpolicy-sla.yaml")],
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0_u8..3), 1..12),
    ) {
        let object = load_yaml(&repo_root().join("config/samples").join(file));
        let mut body = serde_json::to_vec(&review(&object, Some(&object))).unwrap();
        for (at, byte, kind) in edits {
            if body.is_empty() {
                break;
            }
            let i = at.index(body.len());
            match kind {
                0 => body[i] = byte,
                1 => body.insert(i, byte),
                _ => body.truncate(i),
            }
        }
        let (status, answer) = runtime().block_on(post(app(world()), path_for(&object), body));
        check_answer(status, &answer);
    }

    #[test]
    fn mutated_samples_never_panic(
        file in prop_oneof![Just("dgd-disagg.yaml"), Just("plannerpolicy-sla.yaml"), Just("plannerpolicy-virtual.yaml"), Just("plannerpolicy-load.yaml")],
        pointer in prop_oneof![
            Just("/spec"),
            Just("/spec/components"),
            Just("/spec/components/0"),
            Just("/spec/components/0/kvCacheTransferTopology"),
            Just("/spec/topologyConstraint"),
            Just("/spec/targetRef"),
            Just("/spec/adjustmentInterval"),
            Just("/spec/connector"),
            Just("/spec/load"),
            Just("/metadata"),
        ],
        value in any_json(),
    ) {
        let mut object = load_yaml(&repo_root().join("config/samples").join(file));
        if let Some(slot) = object.pointer_mut(pointer) {
            *slot = value;
        }
        let body = serde_json::to_vec(&review(&object, None)).unwrap();
        let (status, answer) = runtime().block_on(post(app(world()), path_for(&object), body));
        check_answer(status, &answer);
    }
}

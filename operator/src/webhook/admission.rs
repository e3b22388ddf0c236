//! The validating admission handlers: `AdmissionReview` v1 in, `AdmissionReview` out. The rules
//! are those of [`crate::validation`]; this file only parses the review, does the lookups the
//! rules need (with a deadline) and phrases the answer.
//!
//! Leniency: DynamoGraphDeployments are shared with Dynamo's own operator, so a DGD this
//! operator cannot parse is admitted with a warning (the schema is the authority on its shape).
//! On updates, lookups run only when the fields they check changed, so that the planner can
//! still change replicas after a ClusterTopology or target was deleted (the reconcilers report
//! that in conditions). Metadata-only updates and objects being deleted are always admitted, so
//! that finalizers can be removed.

use std::{future::Future, sync::Arc, time::Duration};

use axum::{
    Router,
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use kube::{
    Client,
    core::{
        DynamicObject,
        admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
    },
};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::{debug, warn};

use planner_api::{DynamoGraphDeployment, PlannerPolicy};

use crate::{
    lookup::{self, ClusterTopologyApi},
    metrics::operator::OperatorMetrics,
    topology::ClusterTopologyLookup,
    validation::{self, PolicyError},
};

/// Path of the DynamoGraphDeployment endpoint (kubebuilder's naming).
pub const DGD_PATH: &str = "/validate-nvidia-com-v1beta1-dynamographdeployment";
/// Path of the PlannerPolicy endpoint.
pub const PLANNER_POLICY_PATH: &str = "/validate-planner-dynamo-io-v1alpha1-plannerpolicy";
/// Largest request body: an AdmissionReview carries the object and the old object, each up to
/// etcd's 1.5 MiB.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// How long the lookups of one review may take; under the 10s `timeoutSeconds` of the
/// ValidatingWebhookConfiguration, so that a slow API server gives a clear denial, not a
/// webhook timeout.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The lookups the rules need, as an interface so that tests can run the handler without a
/// cluster. Errors are messages for the user.
pub trait Lookups: Send + Sync + 'static {
    /// The ClusterTopology a DGD names.
    fn cluster_topology(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<ClusterTopologyLookup, String>> + Send;
    /// A DGD by namespace and name.
    fn dynamo_graph_deployment(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<DynamoGraphDeployment>, String>> + Send;
}

/// [`Lookups`] against the API server.
#[derive(Clone)]
pub struct KubeLookups {
    /// API client.
    pub client: Client,
    /// Where ClusterTopologies are served.
    pub cluster_topology_api: ClusterTopologyApi,
}

impl Lookups for KubeLookups {
    async fn cluster_topology(&self, name: &str) -> Result<ClusterTopologyLookup, String> {
        lookup::cluster_topology(&self.client, &self.cluster_topology_api, name)
            .await
            .map_err(|e| e.to_string())
    }

    async fn dynamo_graph_deployment(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<DynamoGraphDeployment>, String> {
        lookup::dynamo_graph_deployment(&self.client, namespace, name)
            .await
            .map_err(|e| e.to_string())
    }
}

/// What the handlers share.
pub struct Admission<L> {
    lookups: L,
    metrics: Option<Arc<OperatorMetrics>>,
    timeout: Duration,
}

impl<L: Lookups> Admission<L> {
    /// Handlers over `lookups`; `metrics` counts reviews when given.
    pub fn new(lookups: L, metrics: Option<Arc<OperatorMetrics>>) -> Self {
        Self {
            lookups,
            metrics,
            timeout: LOOKUP_TIMEOUT,
        }
    }

    /// Overrides [`LOOKUP_TIMEOUT`].
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// The webhook's routes: [`DGD_PATH`] and [`PLANNER_POLICY_PATH`] (POST).
pub fn router<L: Lookups>(admission: Arc<Admission<L>>) -> Router {
    Router::new()
        .route(DGD_PATH, post(review_dgd::<L>))
        .route(PLANNER_POLICY_PATH, post(review_planner_policy::<L>))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(admission)
}

/// The kinds the webhook validates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Dgd,
    PlannerPolicy,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Dgd => "DynamoGraphDeployment",
            Self::PlannerPolicy => "PlannerPolicy",
        }
    }

    fn group(self) -> &'static str {
        match self {
            Self::Dgd => "nvidia.com",
            Self::PlannerPolicy => "planner.dynamo.io",
        }
    }
}

async fn review_dgd<L: Lookups>(State(admission): State<Arc<Admission<L>>>, body: Bytes) -> Response {
    review(&admission, Kind::Dgd, &body).await
}

async fn review_planner_policy<L: Lookups>(
    State(admission): State<Arc<Admission<L>>>,
    body: Bytes,
) -> Response {
    review(&admission, Kind::PlannerPolicy, &body).await
}

async fn review<L: Lookups>(admission: &Admission<L>, kind: Kind, body: &[u8]) -> Response {
    let started = std::time::Instant::now();
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(error) => {
            return invalid(
                admission,
                kind,
                format!("the body is not an AdmissionReview: {error}"),
            );
        }
    };
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(_) => return invalid(admission, kind, "the AdmissionReview has no request".into()),
    };
    let response = if request.kind.group != kind.group() || request.kind.kind != kind.name() {
        AdmissionResponse::from(&request).deny(format!(
            "this endpoint validates {}.{}, not {}.{}; fix the ValidatingWebhookConfiguration's rules",
            kind.name(),
            kind.group(),
            request.kind.kind,
            request.kind.group
        ))
    } else {
        match kind {
            Kind::Dgd => admission.dgd(&request).await,
            Kind::PlannerPolicy => admission.planner_policy(&request).await,
        }
    };
    let result = if response.allowed { "allowed" } else { "denied" };
    debug!(
        kind = kind.name(),
        uid = %request.uid,
        namespace = request.namespace.as_deref().unwrap_or_default(),
        name = %request.name,
        operation = ?request.operation,
        result,
        message = %response.result.message,
        "admission review"
    );
    if let Some(metrics) = &admission.metrics {
        metrics.admission_review(kind.name(), result, started.elapsed().as_secs_f64());
    }
    json_response(StatusCode::OK, &response.into_review())
}

fn json_response(status: StatusCode, review: &AdmissionReview<DynamicObject>) -> Response {
    match serde_json::to_vec(review) {
        Ok(body) => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

fn invalid<L>(admission: &Admission<L>, kind: Kind, message: String) -> Response {
    warn!(kind = kind.name(), %message, "malformed admission request");
    if let Some(metrics) = &admission.metrics {
        metrics.admission_review(kind.name(), "invalid", 0.0);
    }
    json_response(
        StatusCode::BAD_REQUEST,
        &AdmissionResponse::invalid(message).into_review(),
    )
}

/// Parses an object into its typed form; the error names the field.
fn parse<K: DeserializeOwned>(object: &DynamicObject) -> Result<K, String> {
    let value = serde_json::to_value(object).map_err(|e| e.to_string())?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            e.inner().to_string()
        } else {
            format!("{path}: {}", e.inner())
        }
    })
}

/// A denial for a rule violation (HTTP 422 in the status, as schema violations are).
fn deny(response: AdmissionResponse, message: impl Into<String>) -> AdmissionResponse {
    let mut response = response.deny(message.into());
    response.result.code = 422;
    response.result.reason = "Invalid".into();
    response
}

/// A denial because a lookup failed: the object may be valid, but the webhook cannot tell.
fn unavailable(response: AdmissionResponse, message: impl Into<String>) -> AdmissionResponse {
    let mut response = response.deny(message.into());
    response.result.code = 503;
    response.result.reason = "ServiceUnavailable".into();
    response
}

fn with_warning(mut response: AdmissionResponse, warning: String) -> AdmissionResponse {
    response.warnings.get_or_insert_with(Vec::new).push(warning);
    response
}

/// What a create or update asks for, as far as every kind is concerned.
enum Subject<'a> {
    /// Admit without checks (delete, connect, subresource, object being deleted, unchanged
    /// spec).
    Skip,
    /// Check `object`; `old` is the previous object on updates.
    Check {
        object: &'a DynamicObject,
        old: Option<&'a DynamicObject>,
    },
}

fn subject(request: &AdmissionRequest<DynamicObject>) -> Result<Subject<'_>, String> {
    if !matches!(request.operation, Operation::Create | Operation::Update) || request.sub_resource.is_some() {
        return Ok(Subject::Skip);
    }
    let object = request
        .object
        .as_ref()
        .ok_or_else(|| format!("the {:?} request carries no object", request.operation))?;
    if object.metadata.deletion_timestamp.is_some() {
        return Ok(Subject::Skip);
    }
    let old = request.old_object.as_ref();
    if let Some(old) = old
        && request.operation == Operation::Update
        && old.data.get("spec") == object.data.get("spec")
    {
        // Metadata or status only: nothing the rules look at changed.
        return Ok(Subject::Skip);
    }
    Ok(Subject::Check { object, old })
}

impl<L: Lookups> Admission<L> {
    async fn dgd(&self, request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
        let response = AdmissionResponse::from(request);
        let (object, old) = match subject(request) {
            Ok(Subject::Skip) => return response,
            Ok(Subject::Check { object, old }) => (object, old),
            Err(message) => return deny(response, message),
        };
        let dgd: DynamoGraphDeployment = match parse(object) {
            Ok(dgd) => dgd,
            Err(error) => {
                // Shared with Dynamo's operator: the schema decides the shape, not this webhook.
                return with_warning(
                    response,
                    format!(
                        "planner-operator cannot read this DynamoGraphDeployment ({error}); its topology settings were not checked"
                    ),
                );
            }
        };
        let request_topology = match validation::dgd::precheck(&dgd.spec) {
            Ok(Some(request)) => request,
            Ok(None) => return response,
            Err(error) => return deny(response, error.to_string()),
        };
        let old = old.and_then(|old| parse::<DynamoGraphDeployment>(old).ok());
        if let Some(old) = &old
            && !validation::dgd::topology_changed(&old.spec, &dgd.spec)
        {
            // Already admitted with these settings; drift is the reconciler's to report.
            return response;
        }
        let lookup = match &request_topology.cluster_topology {
            Some(name) => match tokio::time::timeout(self.timeout, self.lookups.cluster_topology(name)).await
            {
                Ok(Ok(lookup)) => Some(lookup),
                Ok(Err(error)) => {
                    return unavailable(
                        response,
                        format!(
                            "spec.topologyConstraint.clusterTopologyName: cannot read ClusterTopology {name:?} to check kvCacheTransferTopology ({error}); retry, or check the operator's permissions"
                        ),
                    );
                }
                Err(_) => {
                    return unavailable(
                        response,
                        format!(
                            "spec.topologyConstraint.clusterTopologyName: reading ClusterTopology {name:?} took longer than {:?}; retry",
                            self.timeout
                        ),
                    );
                }
            },
            None => None,
        };
        match request_topology.resolve(lookup.as_ref()) {
            Ok(_) => response,
            Err(error) => deny(response, error.to_string()),
        }
    }

    async fn planner_policy(&self, request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
        let response = AdmissionResponse::from(request);
        let (object, old) = match subject(request) {
            Ok(Subject::Skip) => return response,
            Ok(Subject::Check { object, old }) => (object, old),
            Err(message) => return deny(response, message),
        };
        // Name an unknown built-in profile before the typed parse rejects it less helpfully.
        if let Some(Value::String(builtin)) = object.data.pointer("/spec/profile/builtin") {
            let mut errors = Vec::new();
            validation::planner_policy::check_builtin(builtin, &mut errors);
            if let Some(error) = errors.first() {
                return deny(response, error.to_string());
            }
        }
        let policy: PlannerPolicy = match parse(object) {
            Ok(policy) => policy,
            Err(error) => return deny(response, format!("the PlannerPolicy cannot be read: {error}")),
        };
        let mut errors: Vec<PolicyError> = validation::validate_spec(&policy.spec);
        let old = old.and_then(|old| parse::<PlannerPolicy>(old).ok());
        let target_changed = old.as_ref().is_none_or(|old| {
            old.spec.target_ref != policy.spec.target_ref || old.spec.components != policy.spec.components
        });
        if target_changed {
            let namespace = request.namespace.clone().unwrap_or_default();
            let name = &policy.spec.target_ref.name;
            match tokio::time::timeout(
                self.timeout,
                self.lookups.dynamo_graph_deployment(&namespace, name),
            )
            .await
            {
                Ok(Ok(Some(dgd))) => {
                    if let Err(target_errors) = validation::validate_target(&policy.spec, &dgd) {
                        errors.extend(target_errors);
                    }
                }
                Ok(Ok(None)) => errors.push(PolicyError::TargetNotFound {
                    name: name.clone(),
                    namespace,
                }),
                Ok(Err(error)) => {
                    return unavailable(
                        response,
                        format!(
                            "spec.targetRef.name: cannot read DynamoGraphDeployment {name:?} to check the pools ({error}); retry, or check the operator's permissions"
                        ),
                    );
                }
                Err(_) => {
                    return unavailable(
                        response,
                        format!(
                            "spec.targetRef.name: reading DynamoGraphDeployment {name:?} took longer than {:?}; retry",
                            self.timeout
                        ),
                    );
                }
            }
        }
        if errors.is_empty() {
            response
        } else {
            deny(response, validation::describe(&errors))
        }
    }
}

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
//!
//! Bounded: at most [`MAX_CONCURRENT_REVIEWS`] reviews are read and answered at once (others
//! wait for a slot), a body must arrive within [`BODY_READ_TIMEOUT`] and be at most
//! [`MAX_BODY_BYTES`]; see [`super::tls`] for the connection limits.

use std::{future::Future, sync::Arc, time::Duration};

use axum::{
    Router,
    body::Body,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use futures::StreamExt;
use kube::{
    Client,
    core::{
        DynamicObject,
        admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
    },
};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use planner_api::{DynamoGraphDeployment, GpuBudget, PlannerPolicy};

use crate::{
    lookup::{self, ClusterTopologyApi, LookupError, TargetLookup},
    metrics::operator::OperatorMetrics,
    topology::ClusterTopologyLookup,
    validation::{self, PolicyError},
};

/// Path of the DynamoGraphDeployment endpoint (kubebuilder's naming).
pub const DGD_PATH: &str = "/validate-nvidia-com-v1beta1-dynamographdeployment";
/// Path of the PlannerPolicy endpoint.
pub const PLANNER_POLICY_PATH: &str = "/validate-planner-dynamo-io-v1alpha1-plannerpolicy";
/// Largest request body. An object the API server stores is at most etcd's 1.5 MiB (the API
/// server itself takes request bodies of at most 3 MiB), and the review of an update carries the
/// object and the old object: two stored objects and the review's envelope fit in 4 MiB.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// How long a client may take to send the body once its headers are in (the API server sends
/// a review at once and waits at most 30 s for the answer).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Reviews read and answered at once; others wait (for at most [`BODY_READ_TIMEOUT`]) for a
/// slot, so memory stays under `MAX_CONCURRENT_REVIEWS * MAX_BODY_BYTES` whatever the load.
pub const MAX_CONCURRENT_REVIEWS: usize = 32;
/// How long the lookups of one review may take; under the 10s `timeoutSeconds` of the
/// ValidatingWebhookConfiguration, so that a slow API server gives a clear denial, not a
/// webhook timeout.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The lookups the rules need, as an interface so that tests can run the handler without a
/// cluster.
pub trait Lookups: Send + Sync + 'static {
    /// Why a lookup failed; its message is shown to the user in the denial.
    type Error: std::error::Error + Send;
    /// The ClusterTopology a DGD names.
    fn cluster_topology(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<ClusterTopologyLookup, Self::Error>> + Send;
    /// A PlannerPolicy's target DGD by namespace and name, of either served version.
    fn target_graph(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<TargetLookup, Self::Error>> + Send;
    /// The GpuBudget a PlannerPolicy names (`None`: there is none).
    fn gpu_budget(&self, name: &str) -> impl Future<Output = Result<Option<GpuBudget>, Self::Error>> + Send;
}

/// [`Lookups`] against the API server.
#[derive(Clone)]
pub struct KubeLookups {
    /// API client.
    pub client: Client,
    /// Where ClusterTopologies are served.
    pub cluster_topology_api: ClusterTopologyApi,
}

/// Why a lookup against the API server failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeLookupError {
    /// A lookup of [`crate::lookup`] failed.
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// The API call failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

impl Lookups for KubeLookups {
    type Error = KubeLookupError;

    async fn cluster_topology(&self, name: &str) -> Result<ClusterTopologyLookup, KubeLookupError> {
        Ok(lookup::cluster_topology(&self.client, &self.cluster_topology_api, name).await?)
    }

    async fn target_graph(&self, namespace: &str, name: &str) -> Result<TargetLookup, KubeLookupError> {
        Ok(lookup::target_graph(&self.client, namespace, name).await?)
    }

    async fn gpu_budget(&self, name: &str) -> Result<Option<GpuBudget>, KubeLookupError> {
        Ok(kube::Api::<GpuBudget>::all(self.client.clone())
            .get_opt(name)
            .await?)
    }
}

/// What the handlers share.
pub struct Admission<L> {
    lookups: L,
    metrics: Option<Arc<OperatorMetrics>>,
    timeout: Duration,
    body_timeout: Duration,
    max_body: usize,
    reviews: Semaphore,
    tenancy: crate::validation::Tenancy,
}

impl<L: Lookups> Admission<L> {
    /// Handlers over `lookups`; `metrics` counts reviews when given.
    pub fn new(lookups: L, metrics: Option<Arc<OperatorMetrics>>) -> Self {
        Self {
            lookups,
            metrics,
            timeout: LOOKUP_TIMEOUT,
            body_timeout: BODY_READ_TIMEOUT,
            max_body: MAX_BODY_BYTES,
            reviews: Semaphore::new(MAX_CONCURRENT_REVIEWS),
            tenancy: crate::validation::Tenancy::default(),
        }
    }

    /// What the cluster admin lets policies name (default: each graph's own Dynamo namespace,
    /// any Prometheus URL and etcd endpoint).
    #[must_use]
    pub fn with_tenancy(mut self, tenancy: crate::validation::Tenancy) -> Self {
        self.tenancy = tenancy;
        self
    }

    /// Overrides [`LOOKUP_TIMEOUT`].
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Overrides [`BODY_READ_TIMEOUT`], [`MAX_CONCURRENT_REVIEWS`] and [`MAX_BODY_BYTES`].
    #[must_use]
    pub fn with_limits(mut self, body_timeout: Duration, concurrent_reviews: usize, max_body: usize) -> Self {
        self.body_timeout = body_timeout;
        self.reviews = Semaphore::new(concurrent_reviews.max(1));
        self.max_body = max_body;
        self
    }
}

/// The webhook's routes: [`DGD_PATH`] and [`PLANNER_POLICY_PATH`] (POST).
pub fn router<L: Lookups>(admission: Arc<Admission<L>>) -> Router {
    Router::new()
        .route(DGD_PATH, post(review_dgd::<L>))
        .route(PLANNER_POLICY_PATH, post(review_planner_policy::<L>))
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

async fn review_dgd<L: Lookups>(
    State(admission): State<Arc<Admission<L>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    bounded_review(&admission, Kind::Dgd, &headers, body).await
}

async fn review_planner_policy<L: Lookups>(
    State(admission): State<Arc<Admission<L>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    bounded_review(&admission, Kind::PlannerPolicy, &headers, body).await
}

/// Why a body could not be read.
enum BodyError {
    TooLarge,
    Unreadable(axum::Error),
}

/// Reads a body of at most `max` bytes.
async fn read_body(body: Body, max: usize) -> Result<Vec<u8>, BodyError> {
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(BodyError::Unreadable)?;
        if bytes.len() + chunk.len() > max {
            return Err(BodyError::TooLarge);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// Waits for a review slot, reads the body within the time and size limits, then reviews it.
async fn bounded_review<L: Lookups>(
    admission: &Admission<L>,
    kind: Kind,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let too_large = || {
        rejected(
            admission,
            kind,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is larger than the webhook's limit of {} bytes",
                admission.max_body
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > admission.max_body as u64) {
        return too_large();
    }
    let Ok(Ok(_slot)) = tokio::time::timeout(admission.body_timeout, admission.reviews.acquire()).await
    else {
        return rejected(
            admission,
            kind,
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the webhook is answering as many reviews as it takes at once and none finished within {:?}; retry",
                admission.body_timeout
            ),
        );
    };
    let body = match tokio::time::timeout(admission.body_timeout, read_body(body, admission.max_body)).await {
        Ok(Ok(body)) => body,
        Ok(Err(BodyError::TooLarge)) => return too_large(),
        Ok(Err(BodyError::Unreadable(error))) => {
            return rejected(
                admission,
                kind,
                StatusCode::BAD_REQUEST,
                format!("the request body cannot be read: {error}"),
            );
        }
        Err(_) => {
            return rejected(
                admission,
                kind,
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within the webhook's limit of {:?}",
                    admission.body_timeout
                ),
            );
        }
    };
    review(admission, kind, &body).await
}

/// An answer to a request that was not read (too large, too slow, no slot): the connection is
/// closed after it, so whatever the client still sends is not read.
fn rejected<L>(admission: &Admission<L>, kind: Kind, status: StatusCode, message: String) -> Response {
    warn!(kind = kind.name(), %status, %message, "admission request refused");
    if let Some(metrics) = &admission.metrics {
        metrics.admission_review(kind.name(), "refused", 0.0);
    }
    let mut response = json_response(status, &AdmissionResponse::invalid(message).into_review());
    response
        .headers_mut()
        .insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    response
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

/// Why an object cannot be read as its typed form.
#[derive(Debug, thiserror::Error)]
enum ParseError {
    /// Not in any one field (or the object would not serialize).
    #[error("{0}")]
    Object(serde_json::Error),
    /// In the field at `path`.
    #[error("{path}: {error}")]
    Field {
        /// The field, e.g. `spec.bounds.minReplicas`.
        path: String,
        /// What is wrong with it.
        error: serde_json::Error,
    },
}

/// Parses an object into its typed form; the error names the field.
fn parse<K: DeserializeOwned>(object: &DynamicObject) -> Result<K, ParseError> {
    let value = serde_json::to_value(object).map_err(ParseError::Object)?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            ParseError::Object(e.into_inner())
        } else {
            ParseError::Field {
                path,
                error: e.into_inner(),
            }
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

/// A create or update review without the object.
#[derive(Debug, thiserror::Error)]
#[error("the {operation:?} request carries no object")]
struct NoObject {
    operation: Operation,
}

fn subject(request: &AdmissionRequest<DynamicObject>) -> Result<Subject<'_>, NoObject> {
    if !matches!(request.operation, Operation::Create | Operation::Update) || request.sub_resource.is_some() {
        return Ok(Subject::Skip);
    }
    let object = request.object.as_ref().ok_or_else(|| NoObject {
        operation: request.operation.clone(),
    })?;
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

/// Why the webhook cannot tell whether a policy may join the GpuBudget it names: a denial to
/// retry.
#[derive(Debug, thiserror::Error)]
enum BudgetUnknown<E: std::error::Error> {
    /// The lookup failed.
    #[error(
        "spec.budgetRef.name: cannot read GpuBudget {name:?} to check the policy joins it ({error}); retry, or check the operator's permissions"
    )]
    Failed {
        /// The budget.
        name: String,
        /// Why.
        error: E,
    },
    /// The lookup took too long.
    #[error("spec.budgetRef.name: reading GpuBudget {name:?} took longer than {timeout:?}; retry")]
    TimedOut {
        /// The budget.
        name: String,
        /// The deadline.
        timeout: Duration,
    },
}

impl<L: Lookups> Admission<L> {
    /// The rules of a policy's `spec.budgetRef`, after looking the budget up; `Err` when the
    /// lookup failed (a denial to retry).
    async fn budget_errors(
        &self,
        policy: &PlannerPolicy,
        namespace: &str,
        name: &str,
        target: &validation::TargetPools,
    ) -> Result<Vec<PolicyError>, BudgetUnknown<L::Error>> {
        let Some(reference) = &policy.spec.budget_ref else {
            return Ok(Vec::new());
        };
        let budget_name = &reference.name;
        let found = match tokio::time::timeout(self.timeout, self.lookups.gpu_budget(budget_name)).await {
            Ok(Ok(found)) => found,
            Ok(Err(error)) => {
                return Err(BudgetUnknown::Failed {
                    name: budget_name.clone(),
                    error,
                });
            }
            Err(_) => {
                return Err(BudgetUnknown::TimedOut {
                    name: budget_name.clone(),
                    timeout: self.timeout,
                });
            }
        };
        let lookup = match &found {
            Some(budget) => validation::gpu_budget::BudgetLookup::Found(budget),
            None => validation::gpu_budget::BudgetLookup::NotFound,
        };
        Ok(
            validation::gpu_budget::check(&policy.spec, namespace, name, target, lookup)
                .into_iter()
                .map(PolicyError::from)
                .collect(),
        )
    }

    async fn dgd(&self, request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
        let response = AdmissionResponse::from(request);
        let (object, old) = match subject(request) {
            Ok(Subject::Skip) => return response,
            Ok(Subject::Check { object, old }) => (object, old),
            Err(error) => return deny(response, error.to_string()),
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
        let field = request_topology.declared.name_field();
        let lookup = match &request_topology.cluster_topology {
            Some(name) => match tokio::time::timeout(self.timeout, self.lookups.cluster_topology(name)).await
            {
                Ok(Ok(lookup)) => Some(lookup),
                Ok(Err(error)) => {
                    return unavailable(
                        response,
                        format!(
                            "{field}: cannot read ClusterTopologyBinding {name:?} to check the KV-transfer topology ({error}); retry, or check the operator's permissions"
                        ),
                    );
                }
                Err(_) => {
                    return unavailable(
                        response,
                        format!(
                            "{field}: reading ClusterTopologyBinding {name:?} took longer than {:?}; retry",
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
            Err(error) => return deny(response, error.to_string()),
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
        let namespace = request.namespace.clone().unwrap_or_default();
        errors.extend(validation::tenancy::check(
            &policy.spec,
            &namespace,
            &self.tenancy,
        ));
        let old = old.and_then(|old| parse::<PlannerPolicy>(old).ok());
        // The budget rules read the target's GPUs per replica, so bounds, mode and the shared
        // budget count too.
        let target_changed = old.as_ref().is_none_or(|old| {
            old.spec.target_ref != policy.spec.target_ref
                || old.spec.components != policy.spec.components
                || old.spec.bounds != policy.spec.bounds
                || old.spec.mode != policy.spec.mode
                || old.spec.budget_ref != policy.spec.budget_ref
        });
        let mut warnings = Vec::new();
        if target_changed {
            let name = &policy.spec.target_ref.name;
            match tokio::time::timeout(self.timeout, self.lookups.target_graph(&namespace, name)).await {
                Ok(Ok(TargetLookup::Found(graph))) => {
                    match validation::validate_target(&policy.spec, &graph) {
                        Ok(target) => {
                            warnings = validation::planner_policy::target_warnings(&policy.spec, &target);
                            match self
                                .budget_errors(&policy, &namespace, &request.name, &target)
                                .await
                            {
                                Ok(budget_errors) => errors.extend(budget_errors),
                                Err(error) => return unavailable(response, error.to_string()),
                            }
                        }
                        Err(target_errors) => errors.extend(target_errors),
                    }
                    // The graph may still be handed over: a warning here, a refusal in status.
                    if let Some(running) = validation::planner_policy::upstream_planner(&policy.spec, &graph)
                    {
                        warnings.push(format!(
                            "{running}; until then the policy is refused (TargetResolved False, reason UpstreamPlannerRunning)"
                        ));
                    }
                }
                Ok(Ok(TargetLookup::Unreadable(error))) => {
                    errors.push(validation::planner_policy::unreadable_target(
                        &policy.spec,
                        &error,
                    ));
                }
                Ok(Ok(TargetLookup::NotFound)) => errors.push(PolicyError::TargetNotFound {
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
            warnings.into_iter().fold(response, with_warning)
        } else {
            deny(response, validation::describe(&errors))
        }
    }
}

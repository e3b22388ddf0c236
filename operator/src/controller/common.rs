//! What every reconciler here shares: the API error type, the reconcile wrapper (parse guard,
//! span, metrics), status writes with server-side apply, Events, and "one namespace or all"
//! API handles.

use std::{error::Error as StdError, fmt::Debug, sync::Arc};

use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    core::{DeserializeGuard, NamespaceResourceScope, ObjectMeta},
    runtime::{
        controller::Action,
        events::{Event, EventType, Recorder},
    },
};
use serde::de::DeserializeOwned;
use tracing::{Instrument, info_span, warn};

use crate::{FIELD_MANAGER, metrics::operator::OperatorMetrics};

/// Longest Event note written (the API server accepts 1 KiB).
const MAX_NOTE: usize = 1000;

/// A Kubernetes API call failed. The message says what was attempted; the API's error is the
/// source (print the whole chain with [`chain`]).
#[derive(Debug, thiserror::Error)]
#[error("cannot {action}")]
pub struct KubeError {
    /// What was attempted, e.g. `get DynamoGraphDeployment llama`.
    pub action: String,
    /// The API error.
    #[source]
    pub source: kube::Error,
}

impl KubeError {
    /// A closure for `map_err` that wraps an API error with what was attempted.
    pub fn on(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| Self { action, source }
    }

    /// Whether the object was not found (HTTP 404).
    pub fn is_not_found(&self) -> bool {
        matches!(&self.source, kube::Error::Api(status) if status.code == 404)
    }
}

/// An error and its sources on one line (`outer: inner: innermost`), for logs, status and
/// Events.
pub fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // Some errors repeat their source's text in their own; say it once.
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Errors a reconciler returns: a bounded category for metrics.
pub trait ReconcileError: StdError + 'static {
    /// A short, bounded label (`kube_api`, `invalid_spec`, ...).
    fn category(&self) -> &'static str;
}

/// Runs `reconcile` for one watched object inside a span, with the reconcile metrics. An object
/// that cannot be parsed is reported (log, metric and `on_invalid`) and left until it changes,
/// so one malformed object never stops the controller.
pub async fn guarded_reconcile<K, E>(
    controller: &'static str,
    metrics: &Arc<OperatorMetrics>,
    guard: &DeserializeGuard<K>,
    reconcile: impl AsyncFnOnce(&K) -> Result<Action, E>,
    on_invalid: impl AsyncFnOnce(&ObjectMeta, String),
) -> Result<Action, E>
where
    K: Resource + DeserializeOwned + Clone + Debug,
    E: ReconcileError,
{
    let (namespace, name) = match &guard.0 {
        Ok(object) => (object.namespace().unwrap_or_default(), object.name_any()),
        Err(invalid) => (
            invalid.metadata.namespace.clone().unwrap_or_default(),
            invalid.metadata.name.clone().unwrap_or_default(),
        ),
    };
    let span = info_span!("reconcile", controller, namespace = %namespace, name = %name);
    async move {
        let _timer = metrics.reconcile_started(controller);
        let object = match &guard.0 {
            Ok(object) => object,
            Err(invalid) => {
                warn!(error = %invalid.error, "object cannot be parsed; skipping it until it changes");
                metrics.invalid_object(controller);
                on_invalid(&invalid.metadata, invalid.error.to_string()).await;
                return Ok(Action::await_change());
            }
        };
        let result = reconcile(object).await;
        metrics.reconcile_finished(controller, result.as_ref().err().map(ReconcileError::category));
        result
    }
    .instrument(span)
    .await
}

/// An `Api` over one namespace, or over all when `namespace` is `None`.
pub fn scoped_api<K>(client: Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    }
}

/// Writes an object's status with server-side apply (this operator's field manager).
pub async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    status: &impl serde::Serialize,
) -> Result<(), KubeError>
where
    K: Resource + Clone + Debug + DeserializeOwned,
    <K as Resource>::DynamicType: Default,
{
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&Default::default()),
        "kind": K::kind(&Default::default()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(KubeError::on(format!(
        "write the status of {} {name}",
        K::kind(&Default::default())
    )))?;
    Ok(())
}

/// Publishes an Event about `object`; a failure is logged, never fatal.
pub async fn publish<K>(
    recorder: &Recorder,
    object: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) where
    K: Resource<DynamicType = ()>,
{
    publish_to(recorder, &object.object_ref(&()), type_, reason, action, note).await;
}

/// Publishes an Event about the object `reference` names.
pub async fn publish_to(
    recorder: &Recorder,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(truncate(note, MAX_NOTE)),
        action: action.into(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, reference).await {
        warn!(error = %chain(&error), reason, "cannot publish an Event");
    }
}

/// A reference to an object that could not be parsed (for its Events).
pub fn reference_of<K>(metadata: &ObjectMeta) -> k8s_openapi::api::core::v1::ObjectReference
where
    K: Resource<DynamicType = ()>,
{
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(K::api_version(&()).into()),
        kind: Some(K::kind(&()).into()),
        name: metadata.name.clone(),
        namespace: metadata.namespace.clone(),
        uid: metadata.uid.clone(),
        resource_version: metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// At most `max` bytes of `text`, cut at a character boundary, with `…` when cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner;

    #[test]
    fn chains_read_outer_to_inner_once() {
        assert_eq!(chain(&Outer(Inner)), "outer: inner");
    }

    #[test]
    fn truncation_keeps_characters_whole() {
        assert_eq!(truncate("short", 10), "short");
        let cut = truncate(&"é".repeat(100), 11);
        assert!(cut.len() <= 11, "{cut}");
        assert!(cut.ends_with('…'));
    }
}

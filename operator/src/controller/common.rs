//! What every reconciler here shares: the API error type, the reconcile wrapper (parse guard,
//! span, metrics), status writes with server-side apply, Events, and "one namespace or all"
//! API handles.

use std::{
    collections::HashMap,
    error::Error as StdError,
    fmt::Debug,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    core::{DeserializeGuard, NamespaceResourceScope, ObjectMeta},
    runtime::{
        controller::Action,
        events::{Event, EventType, Recorder, Reporter},
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

/// Why a reconcile failed, for controllers that fail on API errors only (problems with what
/// they read are reported in status and conditions, and retried on a schedule).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A Kubernetes API call failed.
    #[error(transparent)]
    Kube(#[from] KubeError),
}

impl ReconcileError for ApiError {
    fn category(&self) -> &'static str {
        match self {
            Self::Kube(_) => "kube_api",
        }
    }
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

/// Publishes Events the way client-go's events library does: a repeat of the same note about the
/// same object is counted in that Event's series, and a different note is a new Event.
/// kube-runtime's `Recorder` keys its series without the note, so on its own a changed note
/// (`prefill 1 -> 6`, then `prefill 6 -> 3`) would be counted into the first Event and never
/// shown; here each (object, reason, action, type) keeps a `Recorder` for its current note, and a
/// new note gets a fresh one.
#[derive(Clone)]
pub struct Events {
    client: Client,
    reporter: Reporter,
    recorders: Arc<Mutex<HashMap<EventSlot, Slot>>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EventSlot {
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    reason: String,
    action: String,
    warning: bool,
}

struct Slot {
    note: u64,
    /// Recorders this slot has had (one per note change).
    generation: u64,
    used: Instant,
    recorder: Recorder,
}

/// A slot unused this long is forgotten (kube-runtime forgets a series after six minutes).
const EVENT_SLOT_IDLE: Duration = Duration::from_secs(600);

impl Events {
    /// Events reported by `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            recorders: Arc::default(),
        }
    }

    /// The recorder for this note in its slot: the slot's own when the note is the one it last
    /// published, else a fresh one (a new Event).
    fn recorder(&self, slot: EventSlot, note: &str) -> Recorder {
        let mut hasher = DefaultHasher::new();
        note.hash(&mut hasher);
        let note = hasher.finish();
        let now = Instant::now();
        let fresh = || Recorder::new(self.client.clone(), self.reporter.clone());
        let Ok(mut recorders) = self.recorders.lock() else {
            return fresh();
        };
        recorders.retain(|_, slot| now.duration_since(slot.used) < EVENT_SLOT_IDLE);
        let entry = recorders.entry(slot).or_insert_with(|| Slot {
            note,
            generation: 0,
            used: now,
            recorder: fresh(),
        });
        if entry.note != note {
            entry.note = note;
            entry.generation += 1;
            entry.recorder = fresh();
        }
        entry.used = now;
        entry.recorder.clone()
    }

    /// The generation of every slot (for tests).
    #[cfg(test)]
    fn generations(&self) -> Vec<u64> {
        let recorders = self
            .recorders
            .lock()
            .map(|r| r.values().map(|s| s.generation).collect());
        recorders.unwrap_or_default()
    }
}

/// Publishes an Event about `object`; a failure is logged, never fatal.
pub async fn publish<K>(events: &Events, object: &K, type_: EventType, reason: &str, action: &str, note: &str)
where
    K: Resource<DynamicType = ()>,
{
    publish_to(events, &object.object_ref(&()), type_, reason, action, note).await;
}

/// Publishes an Event about the object `reference` names.
pub async fn publish_to(
    events: &Events,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    let note = truncate(note, MAX_NOTE);
    // The object, not one version of it: a series spans the object's updates.
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        resource_version: None,
        field_path: None,
        ..reference.clone()
    };
    let slot = EventSlot {
        kind: reference.kind.clone(),
        namespace: reference.namespace.clone(),
        name: reference.name.clone(),
        uid: reference.uid.clone(),
        reason: reason.into(),
        action: action.into(),
        warning: type_ == EventType::Warning,
    };
    let recorder = events.recorder(slot, &note);
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &reference).await {
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

    /// A repeated note keeps its slot's recorder (one Event, its series counting); a new note
    /// gets a fresh one (a new Event); other objects and reasons have slots of their own.
    #[tokio::test]
    async fn a_new_note_is_a_new_event_and_a_repeat_is_counted() {
        #[allow(clippy::unwrap_used)]
        let client = Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
        let events = Events::new(
            client,
            Reporter {
                controller: "test".into(),
                instance: None,
            },
        );
        let slot = |name: &str, reason: &str| EventSlot {
            kind: Some("PlannerPolicy".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            reason: reason.into(),
            action: "Scale".into(),
            warning: false,
        };
        events.recorder(slot("a", "Scaled"), "prefill 1 -> 6");
        events.recorder(slot("a", "Scaled"), "prefill 1 -> 6");
        assert_eq!(events.generations(), vec![0]);
        events.recorder(slot("a", "Scaled"), "prefill 6 -> 3");
        assert_eq!(events.generations(), vec![1]);
        events.recorder(slot("a", "ScalingLimited"), "prefill 6 -> 3");
        events.recorder(slot("b", "Scaled"), "prefill 6 -> 3");
        let mut generations = events.generations();
        generations.sort_unstable();
        assert_eq!(generations, vec![0, 0, 1]);
    }

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

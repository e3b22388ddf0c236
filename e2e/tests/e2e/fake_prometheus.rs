//! A Prometheus HTTP API on a loopback port that answers the SLA planner's queries with a fixed,
//! busy interval for one model (about 20 requests/s of 3000 input and 300 output tokens), so that
//! a PlannerPolicy observes traffic and scales its DGD without a real frontend or Prometheus.
//! Range queries (the predictor history restored at start) get an empty matrix. It can require
//! a bearer token, as a Prometheus behind an authenticating proxy does.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use axum::{
    Json, Router,
    extract::{RawQuery, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use e2e::Result;
use serde_json::json;
use tokio::task::JoinHandle;

/// The running server; stopped when dropped.
pub struct FakePrometheus {
    /// Its base URL, `http://127.0.0.1:<port>`.
    pub url: String,
    queries: Arc<AtomicUsize>,
    token: Arc<Mutex<Option<String>>>,
    by_token: Arc<Mutex<HashMap<String, usize>>>,
    task: JoinHandle<()>,
}

impl Drop for FakePrometheus {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Answers {
    model: String,
    queries: Arc<AtomicUsize>,
    /// When set, only requests with `Authorization: Bearer <token>` are answered (else 401).
    token: Arc<Mutex<Option<String>>>,
    /// Instant queries answered, by the token they carried.
    by_token: Arc<Mutex<HashMap<String, usize>>>,
}

/// The bearer token of a request, if any.
fn bearer(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(String::from)
}

/// Whether the request may be answered; counts it under its token.
fn authorized(answers: &Answers, headers: &HeaderMap) -> bool {
    let sent = bearer(headers);
    let required = answers.token.lock().ok().and_then(|t| t.clone());
    if required.is_some() && sent != required {
        return false;
    }
    if let (Some(sent), Ok(mut by_token)) = (sent, answers.by_token.lock()) {
        *by_token.entry(sent).or_default() += 1;
    }
    true
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"status": "error", "errorType": "unauthorized", "error": "bad token"})),
    )
        .into_response()
}

/// The value of an instant query, by the frontend metric it reads (the names of
/// `planner_operator::metrics::prometheus`); the query string is URL-encoded, but metric names
/// survive encoding.
fn value_for(query: &str) -> Option<f64> {
    [
        ("requests_total", 200.0),
        ("time_to_first_token_seconds", 0.35),
        ("inter_token_latency_seconds", 0.03),
        ("request_duration_seconds", 9.5),
        ("input_sequence_tokens", 3000.0),
        ("output_sequence_tokens", 300.0),
    ]
    .into_iter()
    .find(|(metric, _)| query.contains(metric))
    .map(|(_, value)| value)
}

async fn instant(State(answers): State<Answers>, headers: HeaderMap, RawQuery(query): RawQuery) -> Response {
    if !authorized(&answers, &headers) {
        return unauthorized();
    }
    answers.queries.fetch_add(1, Ordering::Relaxed);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    let result = match value_for(query.as_deref().unwrap_or_default()) {
        Some(value) => json!([{"metric": {"model": answers.model}, "value": [now, value.to_string()]}]),
        None => json!([]),
    };
    Json(json!({"status": "success", "data": {"resultType": "vector", "result": result}})).into_response()
}

async fn range(State(answers): State<Answers>, headers: HeaderMap) -> Response {
    if !authorized(&answers, &headers) {
        return unauthorized();
    }
    Json(json!({"status": "success", "data": {"resultType": "matrix", "result": []}})).into_response()
}

impl FakePrometheus {
    /// Starts it for `model` (the `model` label of every series).
    pub async fn start(model: &str) -> Result<Self> {
        Self::start_with_token(model, None).await
    }

    /// Starts it for `model`, answering only requests that carry `token` as a bearer token.
    pub async fn start_with_token(model: &str, token: Option<&str>) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let queries = Arc::new(AtomicUsize::new(0));
        let token = Arc::new(Mutex::new(token.map(String::from)));
        let by_token = Arc::default();
        let answers = Answers {
            model: model.to_string(),
            queries: Arc::clone(&queries),
            token: Arc::clone(&token),
            by_token: Arc::clone(&by_token),
        };
        let router = Router::new()
            .route("/api/v1/query", get(instant))
            .route("/api/v1/query_range", get(range))
            .with_state(answers);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self {
            url,
            queries,
            token,
            by_token,
            task,
        })
    }

    /// From now on, answer only requests that carry `token`.
    pub fn require_token(&self, token: &str) {
        if let Ok(mut required) = self.token.lock() {
            *required = Some(token.to_string());
        }
    }

    /// Instant queries answered with `token`.
    pub fn queries_with(&self, token: &str) -> usize {
        self.by_token
            .lock()
            .map(|by_token| by_token.get(token).copied().unwrap_or_default())
            .unwrap_or_default()
    }

    /// Instant queries answered so far.
    pub fn queries(&self) -> usize {
        self.queries.load(Ordering::Relaxed)
    }
}

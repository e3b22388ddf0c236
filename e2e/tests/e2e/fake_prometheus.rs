//! A Prometheus HTTP API on a loopback port that answers the SLA planner's queries with a fixed,
//! busy interval for one model (about 20 requests/s of 3000 input and 300 output tokens), so that
//! a PlannerPolicy observes traffic and scales its DGD without a real frontend or Prometheus.
//! Range queries (the predictor history restored at start) get an empty matrix.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use axum::{Json, Router, extract::RawQuery, extract::State, routing::get};
use e2e::Result;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// The running server; stopped when dropped.
pub struct FakePrometheus {
    /// Its base URL, `http://127.0.0.1:<port>`.
    pub url: String,
    queries: Arc<AtomicUsize>,
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

async fn instant(State(answers): State<Answers>, RawQuery(query): RawQuery) -> Json<Value> {
    answers.queries.fetch_add(1, Ordering::Relaxed);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    let result = match value_for(query.as_deref().unwrap_or_default()) {
        Some(value) => json!([{"metric": {"model": answers.model}, "value": [now, value.to_string()]}]),
        None => json!([]),
    };
    Json(json!({"status": "success", "data": {"resultType": "vector", "result": result}}))
}

async fn range() -> Json<Value> {
    Json(json!({"status": "success", "data": {"resultType": "matrix", "result": []}}))
}

impl FakePrometheus {
    /// Starts it for `model` (the `model` label of every series).
    pub async fn start(model: &str) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let queries = Arc::new(AtomicUsize::new(0));
        let answers = Answers {
            model: model.to_string(),
            queries: Arc::clone(&queries),
        };
        let router = Router::new()
            .route("/api/v1/query", get(instant))
            .route("/api/v1/query_range", get(range))
            .with_state(answers);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self { url, queries, task })
    }

    /// Instant queries answered so far.
    pub fn queries(&self) -> usize {
        self.queries.load(Ordering::Relaxed)
    }
}

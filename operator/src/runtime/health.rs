//! The health and metrics server: `/metrics`, `/healthz` (see [`Health`]) and `/readyz` (the
//! CRDs are served and, when this replica serves the webhook, its certificate is loaded).

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use tokio::{task::JoinHandle, time::Instant};
use tracing::{error, info};

use super::error::RunError;
use crate::{metrics::operator::OperatorMetrics, webhook::tls::CertResolver};

/// What the server reports on.
#[derive(Clone)]
pub(super) struct ServerState {
    pub(super) metrics: Arc<OperatorMetrics>,
    pub(super) ready: Arc<AtomicBool>,
    /// The webhook's certificate, when it serves: not ready until one is loaded.
    pub(super) webhook: Option<Arc<CertResolver>>,
    pub(super) health: Arc<Health>,
}

/// What `/healthz` reports on.
#[derive(Debug, Default)]
pub struct Health {
    /// The controllers stopped on their own while this process led.
    controllers_stopped: AtomicBool,
    /// When the last step-down happened, until it recovers; and how long it may take.
    stepped_down: Mutex<Option<(Instant, Duration)>>,
}

impl Health {
    /// Why the process is not healthy, if it is not.
    pub fn problem(&self) -> Option<String> {
        if self.controllers_stopped.load(Ordering::Relaxed) {
            return Some("the controllers stopped while this process was the leader".into());
        }
        let stepped_down = *self.stepped_down.lock().unwrap_or_else(PoisonError::into_inner);
        match stepped_down {
            Some((at, recovery)) if at.elapsed() > recovery => Some(format!(
                "stepped down {}s ago (the leader lease was not renewed in time) and neither leads nor stands by since",
                at.elapsed().as_secs()
            )),
            _ => None,
        }
    }

    /// Records that the controllers stopped on their own while this process led.
    pub(super) fn controllers_stopped(&self) {
        self.controllers_stopped.store(true, Ordering::Relaxed);
    }

    pub(super) fn stepped_down(&self, recovery: Duration) {
        *self.stepped_down.lock().unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), recovery));
    }

    pub(super) fn recovered(&self) {
        *self.stepped_down.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// Binds `addr` and serves `state` there until `shutdown` resolves.
pub(super) async fn start(
    addr: SocketAddr,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<JoinHandle<()>, RunError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Listen { addr, source })?;
    let server = tokio::spawn(async move {
        let router = Router::new()
            .route("/metrics", get(serve_metrics))
            .route("/healthz", get(serve_health))
            .route("/readyz", get(serve_ready))
            .with_state(state);
        if let Err(error) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            error!(%error, "health and metrics server failed");
        }
    });
    info!(%addr, "serving /metrics, /healthz and /readyz");
    Ok(server)
}

async fn serve_metrics(State(state): State<ServerState>) -> impl IntoResponse {
    match state.metrics.encode() {
        Ok(text) => (
            StatusCode::OK,
            [(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        ),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain")],
            error.to_string(),
        ),
    }
}

async fn serve_health(State(state): State<ServerState>) -> impl IntoResponse {
    match state.health.problem() {
        None => (StatusCode::OK, "ok".to_string()),
        Some(problem) => (StatusCode::SERVICE_UNAVAILABLE, problem),
    }
}

async fn serve_ready(State(state): State<ServerState>) -> impl IntoResponse {
    if !state.ready.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    } else if state.webhook.as_ref().is_some_and(|w| !w.is_ready()) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no webhook certificate yet",
        )
    } else {
        (StatusCode::OK, "ready")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_fails_after_an_unrecovered_step_down_or_stopped_controllers() {
        let health = Health::default();
        assert_eq!(health.problem(), None);
        health.stepped_down(Duration::from_secs(3600));
        assert_eq!(health.problem(), None, "still within the recovery time");
        health.stepped_down(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        assert!(health.problem().unwrap().contains("stepped down"));
        health.recovered();
        assert_eq!(health.problem(), None);
        health.controllers_stopped();
        assert!(health.problem().unwrap().contains("controllers stopped"));
    }
}

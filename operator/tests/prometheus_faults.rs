//! The Prometheus client against a misbehaving server on loopback: redirects are not followed,
//! a huge body is refused without being buffered whole, a slow one times out, garbage is an
//! error naming the query, and none of it panics.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::{Duration, Instant};

use axum::{
    Router,
    body::Body,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use planner_operator::sources::prometheus::{MAX_RESPONSE_BYTES, MetricsError, PrometheusClient};

async fn serve() -> String {
    let app = Router::new()
        .route(
            "/redirect/api/v1/query",
            get(|| async { (StatusCode::FOUND, [(header::LOCATION, "http://169.254.169.254/")]).into_response() }),
        )
        .route(
            "/huge/api/v1/query",
            get(|| async {
                // Streamed without a Content-Length, well past the cap.
                let chunk = vec![b' '; 1 << 20];
                let chunks = (0..(MAX_RESPONSE_BYTES >> 20) + 4).map(move |_| Ok::<_, std::io::Error>(chunk.clone()));
                Response::new(Body::from_stream(futures::stream::iter(chunks)))
            }),
        )
        .route(
            "/slow/api/v1/query",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "{}"
            }),
        )
        .route("/garbage/api/v1/query", get(|| async { "<html>not Prometheus</html>" }))
        .route(
            "/ok/api/v1/query",
            get(|| async {
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"model":"m"},"value":[1,"2"]}]}}"#
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn client(base: &str, path: &str) -> PrometheusClient {
    let _ = rustls::crypto::ring::default_provider().install_default();
    PrometheusClient::new(&format!("{base}/{path}"), Duration::from_secs(2)).unwrap()
}

#[tokio::test]
async fn a_misbehaving_prometheus_is_an_error_never_a_crash() {
    let base = serve().await;
    let ok = client(&base, "ok").query("up").await.unwrap();
    assert_eq!(ok[0].value, 2.0);

    let redirect = client(&base, "redirect").query("up").await.unwrap_err();
    assert!(matches!(redirect, MetricsError::Http { .. }), "{redirect}");
    assert!(
        redirect.to_string().contains("redirects are not followed"),
        "{redirect}"
    );

    let huge = client(&base, "huge").query("up").await.unwrap_err();
    assert!(huge.to_string().contains("larger than"), "{huge}");

    let started = Instant::now();
    let slow = client(&base, "slow").query("up").await.unwrap_err();
    assert!(matches!(slow, MetricsError::Http { .. }), "{slow}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    let garbage = client(&base, "garbage").query("up").await.unwrap_err();
    assert!(matches!(garbage, MetricsError::Query { .. }), "{garbage}");
    assert!(garbage.to_string().contains("`up`"), "{garbage}");
}

//! Operations endpoints: `GET /metrics` (Prometheus, OpenMetrics text) and `GET /api/v1/ready`
//! (readiness: the database answers a trivial query), and [`track_requests`], the middleware
//! that counts every HTTP request by method, route template and status.
//!
//! The handlers are thin over [`metrics_response`] and [`readiness`], which take only what they
//! need, so they are tested without a running host.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::ApiError;
use crate::app::App;
use crate::metrics::{self, Metrics};
use crate::store::StoreError;
use orc_manifest::error_chain;

/// How long readiness waits for the database before answering 503: well under a probe's usual
/// timeout, and far under the pool's acquire timeout.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /metrics`.
pub async fn metrics(State(app): State<Arc<App>>) -> Response {
    app.read_replica_metrics();
    metrics_response(app.metrics())
}

/// `GET /api/v1/ready`: 200 `{"status":"ready"}` when the database answers and every started
/// environment's scheduler runs, else 503 `{code:"not_ready", message}`.
pub async fn ready(State(app): State<Arc<App>>) -> Response {
    let failed = app.failed_schedulers().await;
    if !failed.is_empty() {
        let names: Vec<String> = failed.iter().map(|(name, _)| format!("`{name}`")).collect();
        return not_ready(&format!(
            "the scheduler of environment {} stopped; see the host's log",
            names.join(", ")
        ));
    }
    readiness(app.ping_store()).await
}

/// Counts and times every request, labelled by the route template it matched (never the raw
/// path, which would make a series per resource id). Mount with `Router::layer`, so that the
/// matched route is known.
pub async fn track_requests(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    track(app.metrics(), request, next).await
}

/// The OpenMetrics exposition of `metrics`.
pub fn metrics_response(metrics: &Metrics) -> Response {
    ([(CONTENT_TYPE, HeaderValue::from_static(metrics::CONTENT_TYPE))], metrics.render()).into_response()
}

/// Whether the database answers (`ping`) within [`READY_TIMEOUT`].
pub async fn readiness(ping: impl std::future::Future<Output = Result<(), StoreError>>) -> Response {
    match tokio::time::timeout(READY_TIMEOUT, ping).await {
        Ok(Ok(())) => axum::Json(json!({ "status": "ready" })).into_response(),
        Ok(Err(e)) => {
            tracing::warn!(error = %error_chain(&e), "not ready: the database does not answer");
            not_ready("the database does not answer; see the host's log")
        }
        Err(_) => {
            tracing::warn!(
                timeout_s = READY_TIMEOUT.as_secs(),
                "not ready: the database did not answer in time"
            );
            not_ready(&format!("the database did not answer within {} s", READY_TIMEOUT.as_secs()))
        }
    }
}

fn not_ready(message: &str) -> Response {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", message).into_response()
}

async fn track(metrics: &Metrics, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| route_label(p.as_str()))
        .unwrap_or_else(|| "unmatched".to_string());
    let started = Instant::now();
    let response = next.run(request).await;
    metrics.request(method.as_str(), &route, response.status().as_u16(), started.elapsed());
    response
}

/// A nested service's route ends in axum's private catch-all parameter; show it as `{*rest}`.
fn route_label(matched: &str) -> String {
    match matched.find("{*__private__") {
        Some(at) => format!("{}{{*rest}}", &matched[..at]),
        None => matched.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[tokio::test]
    async fn metrics_are_served_as_openmetrics_text() {
        let metrics = Metrics::new();
        metrics.released("dev", 3);
        let response = metrics_response(&metrics);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[CONTENT_TYPE],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.contains(r#"orc_released_intent_version{environment="dev"} 3"#), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    async fn body_of(response: Response) -> serde_json::Value {
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    #[tokio::test]
    async fn ready_while_the_database_answers_and_503_once_it_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite(dir.path().join("orc.db")).await.unwrap();
        let response = readiness(store.ping()).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body_of(response).await, json!({ "status": "ready" }));

        store.close().await;
        let response = readiness(store.ping()).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = body_of(response).await;
        assert_eq!(body["code"], "not_ready", "{body}");
        assert!(body["message"].as_str().unwrap().contains("database"), "{body}");
    }

    #[test]
    fn nested_services_are_labelled_by_their_prefix() {
        assert_eq!(route_label("/registry/{*__private__axum_nest_tail_param}"), "/registry/{*rest}");
        assert_eq!(route_label("/api/v1/environments/{env}"), "/api/v1/environments/{env}");
    }

    #[tokio::test]
    async fn requests_are_counted_by_route_template() {
        use axum::routing::get;
        use tower::ServiceExt as _;

        let metrics = Arc::new(Metrics::new());
        let app = axum::Router::new()
            .route("/things/{id}", get(|| async { "thing" }))
            .layer(axum::middleware::from_fn_with_state(
                metrics.clone(),
                |State(m): State<Arc<Metrics>>, request: Request, next: Next| async move { track(&m, request, next).await },
            ));
        for uri in ["/things/a", "/things/b", "/nothing"] {
            let request = axum::http::Request::get(uri).body(axum::body::Body::empty()).unwrap();
            app.clone().oneshot(request).await.unwrap();
        }
        let text = metrics.render();
        assert!(
            text.contains(r#"orc_http_requests_total{method="GET",route="/things/{id}",status="200"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"orc_http_requests_total{method="GET",route="unmatched",status="404"} 1"#),
            "{text}"
        );
    }
}

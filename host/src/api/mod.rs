//! The REST API under `/api/v1`: environments, intent versions, resources, actions (deploy,
//! repair, dryrun), the action log, events, SSH nodes, cluster templates and clusters, health, readiness and the OpenAPI
//! document generated from these handlers (`/api/v1/openapi.json`). Handlers are thin: they
//! decode the request, call the application ([`crate::app`]) and encode the
//! answer. Every refusal is an [`ApiError`]: JSON `{code, message}` with a stable code.
//!
//! Architecture invariant: handlers never issue SQL; they reach the database only through
//! `store`.

mod actions;
pub(crate) mod auth;
mod clusters;
pub(crate) mod commands;
mod doc;
mod environments;
mod error;
mod etag;
pub(crate) mod events;
pub(crate) mod extract;
pub(crate) mod headers;
mod intents;
mod nodes;
mod ops;
mod processes;
mod replicas;
mod resources;
mod serve;
mod services;
mod tokens;
mod users;
mod views;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use error::{ApiError, ErrorBody};
pub use serve::serve;

use crate::app::App;

type AppState = Arc<App>;

/// The largest body a sign-in takes (`POST /api/v1/login`, the console's form): a name, a
/// password of at most 1,024 bytes and a scope fit many times over; a sign-in's body is read
/// before it is throttled, so it must stay small whatever `max_body_bytes` allows.
pub const SIGN_IN_BODY_BYTES: usize = 16 * 1024;
type Result<T, E = ApiError> = std::result::Result<T, E>;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "orc-host API",
        description = "Intent-based orchestration: environments, versioned intents, resources, actions and events. \
                       Every call but health, readiness and this document needs `Authorization: Bearer <token>`. \
                       Errors are `{code, message}` with a stable `code`. Any request may also be answered \
                       414 `uri_too_long` or 431 `headers_too_large` (see docs/api.md for the limits). \
                       A token belongs to a user and carries its roles (or a narrower set): each operation's \
                       description says which role it needs; a token without it is answered 403 `forbidden` \
                       naming the role, and a missing, unknown or revoked token, or a disabled user's, 401 `unauthorized`."
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "environments", description = "Environments and their settings"),
        (name = "intents", description = "Intent versions: submit, release, diff, roll back"),
        (name = "resources", description = "Resource states and the action log"),
        (name = "actions", description = "Deploy, repair and dryrun, answered 202 with an id to fetch"),
        (name = "events", description = "Server-sent events of state changes and action outcomes"),
        (name = "clusters", description = "Cluster templates and clusters: create, amend, reconfigure, stop/start/restart services, delete"),
        (name = "services", description = "The service catalog (service versions, their interfaces and configuration schemas) and processes"),
        (name = "nodes", description = "SSH nodes: register, verify, label, share or keep private, accept a changed host key"),
        (name = "host", description = "Health, readiness and the replica set"),
        (name = "access", description = "Users, roles, tokens, signing in and the audit trail"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The routes of `/api/v1` that need a token, with their OpenAPI description.
fn protected() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(environments::routes())
        .merge(intents::routes())
        .merge(resources::routes())
        .merge(actions::routes())
        .merge(events::routes())
        .merge(tokens::routes())
        .merge(users::routes())
        .merge(nodes::routes())
        .merge(clusters::routes())
        .merge(services::routes())
        .merge(processes::routes())
        .merge(replicas::routes())
}

/// The OpenAPI document of `/api/v1` (paths relative to it; `servers` says where it lives).
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, mut doc) = OpenApiRouter::<AppState>::with_openapi(ApiDoc::openapi())
        .merge(protected())
        .routes(routes!(health))
        .split_for_parts();
    doc.servers = Some(vec![utoipa::openapi::Server::new("/api/v1")]);
    doc::add_common_answers(&mut doc);
    doc::add_rules(&mut doc);
    doc
}

/// The API's routes over `app`: `/api/v1`, `/metrics` and the registry's `/registry`.
/// The server merges the console's pages beside them and wraps the whole in [`layered`].
pub fn routes(app: Arc<App>) -> Router<AppState> {
    let document: Arc<str> = openapi().to_json().expect("the OpenAPI document serialises").into();
    let (protected, _) = protected()
        .route_layer(middleware::from_fn_with_state(app.clone(), auth::authorize_api))
        .split_for_parts();
    let api = Router::new()
        .route("/health", get(health))
        .route("/ready", get(ops::ready))
        .route(
            "/openapi.json",
            get(move || std::future::ready(([(axum::http::header::CONTENT_TYPE, "application/json")], document.to_string()))),
        )
        .merge(protected)
        .method_not_allowed_fallback(method_not_allowed);
    // The registry's own API (index and fetch by digest open to read; publishing needs the
    // `publisher` role), served by the same process.
    let registry =
        orc_registry::server::router(app.registry().clone()).layer(middleware::from_fn_with_state(app.clone(), auth::authorize_registry));
    Router::new()
        .nest("/api/v1", api)
        // Open like health and readiness: scrapers carry no token, and it shows counts only.
        .route("/metrics", get(ops::metrics))
        .nest_service("/registry", registry)
}

/// What every answer of the host goes through, the console's pages too: the JSON fallback, the
/// head limits, the security headers, request metrics, the body limit (`max_body_bytes`: 413
/// past it) and tracing.
pub fn layered(routes: Router<AppState>, app: Arc<App>, max_body_bytes: usize) -> Router {
    routes
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(serve::refuse_oversized_heads))
        .layer(middleware::from_fn(headers::security_headers))
        .layer(middleware::from_fn_with_state(app.clone(), ops::track_requests))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(TraceLayer::new_for_http())
        .with_state(app)
}

/// A method the path does not take: a JSON error like every other answer.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not take {method}", uri.path()),
    )
}

/// The process is up (liveness). Needs no token.
#[utoipa::path(get, path = "/health", tag = "host", security(()),
    responses((status = 200, description = "The host answers", body = Object, example = json!({"status": "ok"}))))]
async fn health() -> impl IntoResponse {
    Json(json!({ "status": "ok" }))
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use crate::access::rules::{RULES, rule};

    /// Each operation of the document, as (method, path).
    fn operations() -> Vec<(Method, String)> {
        let doc = super::openapi();
        let mut found = Vec::new();
        for (path, item) in &doc.paths.paths {
            for (method, operation) in [
                (Method::GET, &item.get),
                (Method::PUT, &item.put),
                (Method::POST, &item.post),
                (Method::DELETE, &item.delete),
                (Method::PATCH, &item.patch),
                (Method::HEAD, &item.head),
                (Method::OPTIONS, &item.options),
            ] {
                if operation.is_some() {
                    found.push((method, path.clone()));
                }
            }
        }
        found
    }

    #[test]
    fn every_route_of_the_document_has_an_authorization_rule_and_every_rule_a_route() {
        let operations = operations();
        let missing: Vec<String> = operations
            .iter()
            .filter(|(method, path)| rule(method, path).is_none())
            .map(|(method, path)| format!("{method} {path}"))
            .collect();
        assert!(missing.is_empty(), "routes without a rule in access::rules: {missing:?}");
        let stale: Vec<String> = RULES
            .iter()
            .filter(|(method, path, _)| !operations.iter().any(|(m, p)| m.as_str() == *method && p == path))
            .map(|(method, path, _)| format!("{method} {path}"))
            .collect();
        assert!(stale.is_empty(), "rules for routes the document does not have: {stale:?}");
    }
}

//! The REST API under `/api/v1`: environments, intent versions, resources and the user triggers.
//! Handlers are thin: they decode the request, call [`Environments`] (writes) or the store
//! (reads) and encode the answer. Every refusal is an [`ApiError`].
//!
//! Architecture invariant: handlers never issue SQL; they reach the database only through
//! `store`.

mod error;
mod extract;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Router, response::IntoResponse};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tower_http::trace::TraceLayer;

pub use error::ApiError;
use extract::{Body, Json, Path, Query};

use crate::server::Environments;
use crate::store::{EnvironmentSettings, IntentVersion, LoggedAction, ResourceState, StateFilter, StatePage};

type AppState = Arc<Environments>;
type Result<T, E = ApiError> = std::result::Result<T, E>;

/// Recent actions shown with a resource.
const RECENT_ACTIONS: u32 = 20;

/// The API over `environments`; bodies over `max_body_bytes` are answered 413.
pub fn router(environments: Arc<Environments>, max_body_bytes: usize) -> Router {
    let protected = Router::new()
        .route("/environments", post(create_environment).get(list_environments))
        .route("/environments/{env}", get(get_environment).delete(delete_environment))
        .route("/environments/{env}/intents", post(submit_intent).get(list_intents))
        .route("/environments/{env}/intents/{version}", get(get_intent))
        .route("/environments/{env}/intents/{version}/release", post(release_intent))
        .route("/environments/{env}/resources", get(list_resources))
        .route("/environments/{env}/resources/{id}", get(get_resource))
        .route("/environments/{env}/deploy", post(deploy))
        .route("/environments/{env}/repair", post(repair))
        .route_layer(middleware::from_fn_with_state(environments.clone(), require_token));
    let api = Router::new().route("/health", get(health)).merge(protected);
    // The registry's own API (index and fetch by digest open to read; publishing needs the token),
    // served by the same process.
    let registry = orc_registry::server::router(environments.registry().clone())
        .layer(middleware::from_fn_with_state(environments.clone(), require_token_to_write));
    Router::new()
        .nest("/api/v1", api)
        .nest_service("/registry", registry)
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(TraceLayer::new_for_http())
        .with_state(environments)
}

/// Every API call but `/health` carries `Authorization: Bearer <token>` of a stored token.
async fn require_token(State(environments): State<Arc<Environments>>, request: Request, next: Next) -> Result<Response, ApiError> {
    let token = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(ApiError::unauthorized)?;
    match environments
        .store()
        .find_admin_token(&crate::store::hash_token(token.trim()))
        .await?
    {
        Some(_) => Ok(next.run(request).await),
        None => Err(ApiError::unauthorized()),
    }
}

/// Reading the registry is open (plugins are public, content-addressed bytes); writing needs a token.
async fn require_token_to_write(state: State<Arc<Environments>>, request: Request, next: Next) -> Result<Response, ApiError> {
    if matches!(*request.method(), axum::http::Method::GET | axum::http::Method::HEAD) {
        return Ok(next.run(request).await);
    }
    require_token(state, request, next).await
}

async fn health() -> impl IntoResponse {
    axum::Json(json!({ "status": "ok" }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewEnvironment {
    name: String,
    settings: Option<EnvironmentSettings>,
}

async fn create_environment(State(envs): State<AppState>, Json(new): Json<NewEnvironment>) -> Result<impl IntoResponse> {
    let env = envs.create(&new.name, new.settings).await?;
    Ok((StatusCode::CREATED, axum::Json(env)))
}

async fn list_environments(State(envs): State<AppState>) -> Result<impl IntoResponse> {
    Ok(axum::Json(json!({ "items": envs.list().await? })))
}

/// An environment with how many of its resources are in each status.
#[derive(Serialize)]
struct EnvironmentView {
    #[serde(flatten)]
    environment: crate::store::Environment,
    resources: std::collections::BTreeMap<&'static str, i64>,
}

async fn get_environment(State(envs): State<AppState>, Path(env): Path<String>) -> Result<impl IntoResponse> {
    let environment = envs.get(&env).await?;
    let counts = envs.store().status_counts(&environment.id).await?;
    let resources = counts.into_iter().map(|(s, n)| (s.as_str(), n)).collect();
    Ok(axum::Json(EnvironmentView { environment, resources }))
}

async fn delete_environment(State(envs): State<AppState>, Path(env): Path<String>) -> Result<impl IntoResponse> {
    envs.delete(&env).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Serialize)]
struct Submitted {
    version: i64,
    released: bool,
}

async fn submit_intent(State(envs): State<AppState>, Path(env): Path<String>, Body(body): Body) -> Result<impl IntoResponse> {
    let (info, released) = envs.submit(&env, &body).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(Submitted {
            version: info.version,
            released,
        }),
    ))
}

async fn list_intents(State(envs): State<AppState>, Path(env): Path<String>) -> Result<impl IntoResponse> {
    let env = envs.get(&env).await?;
    Ok(axum::Json(json!({ "items": envs.store().list_versions(&env.id).await? })))
}

/// A version with its (pinned) intent as JSON rather than text.
#[derive(Serialize)]
struct VersionView {
    #[serde(flatten)]
    info: crate::store::VersionInfo,
    intent: Value,
}

impl From<IntentVersion> for VersionView {
    fn from(v: IntentVersion) -> VersionView {
        VersionView {
            intent: serde_json::from_str(&v.document).unwrap_or(Value::String(v.document)),
            info: v.info,
        }
    }
}

async fn get_intent(State(envs): State<AppState>, Path((env, version)): Path<(String, i64)>) -> Result<impl IntoResponse> {
    let env = envs.get(&env).await?;
    let version = envs.store().get_version(&env.id, version).await?;
    Ok(axum::Json(VersionView::from(version)))
}

async fn release_intent(State(envs): State<AppState>, Path((env, version)): Path<(String, i64)>) -> Result<impl IntoResponse> {
    Ok(axum::Json(envs.release(&env, version).await?))
}

/// Filters of the resource listing; `after` and `limit` page through it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourceQuery {
    status: Option<String>,
    #[serde(rename = "type")]
    resource_type: Option<String>,
    node: Option<String>,
    text: Option<String>,
    after: Option<String>,
    limit: Option<u32>,
}

async fn list_resources(
    State(envs): State<AppState>,
    Path(env): Path<String>,
    Query(q): Query<ResourceQuery>,
) -> Result<axum::Json<StatePage>> {
    let env = envs.get(&env).await?;
    let status = q
        .status
        .map(|s| s.parse())
        .transpose()
        .map_err(|e: crate::store::UnknownName| ApiError::bad_request("invalid_query", e.to_string()))?;
    let filter = StateFilter {
        status,
        resource_type: q.resource_type,
        node: q.node,
        text: q.text,
        after: q.after,
        limit: q.limit.unwrap_or(0),
    };
    Ok(axum::Json(envs.store().list_states(&env.id, &filter).await?))
}

/// One resource: its state and its latest actions, newest first.
#[derive(Serialize)]
struct ResourceView {
    state: ResourceState,
    actions: Vec<ActionView>,
}

/// An action-log entry with its changes and messages as JSON.
#[derive(Serialize)]
struct ActionView {
    #[serde(flatten)]
    action: LoggedAction,
    #[serde(rename = "changes")]
    changes_json: Value,
    #[serde(rename = "messages")]
    messages_json: Value,
}

async fn get_resource(State(envs): State<AppState>, Path((env, id)): Path<(String, String)>) -> Result<impl IntoResponse> {
    let env = envs.get(&env).await?;
    let state = envs.store().get_state(&env.id, &id).await?;
    let actions = envs
        .store()
        .resource_actions(&env.id, &id, RECENT_ACTIONS)
        .await?
        .into_iter()
        .map(|a| ActionView {
            changes_json: serde_json::from_str(&a.action.changes).unwrap_or(Value::Null),
            messages_json: serde_json::from_str(&a.action.messages).unwrap_or(Value::Null),
            action: a,
        })
        .collect();
    Ok(axum::Json(ResourceView { state, actions }))
}

async fn deploy(State(envs): State<AppState>, Path(env): Path<String>) -> Result<impl IntoResponse> {
    envs.deploy(&env).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(json!({ "accepted": "deploy" }))))
}

async fn repair(State(envs): State<AppState>, Path(env): Path<String>) -> Result<impl IntoResponse> {
    envs.repair(&env).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(json!({ "accepted": "repair" }))))
}

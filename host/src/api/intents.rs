//! Intent versions: submit (validated, adaptors pinned to digests, released at once with
//! `auto_deploy`), list, get, diff two, release one, roll back to one.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::Caller;
use super::extract::{JsonBytes, Path};
use super::views::VersionInfo;
use super::{AppState, ErrorBody, Result};
use crate::intent::IntentDocument;
use crate::intent::diff::IntentDiff;
use crate::store::IntentVersion;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(submit_intent, list_intents))
        .routes(routes!(get_intent))
        .routes(routes!(diff_intents))
        .routes(routes!(release_intent))
        .routes(routes!(rollback_intent))
        .routes(routes!(put_resource_set))
}

/// Replaces one resource set (Inmanta's partial compile): a new version with the latest
/// version's other sets, main intent, clusters and processes unchanged and this body's resources
/// as set `{name}` (`[]` removes it). A resource another set has is refused naming both.
#[utoipa::path(put, path = "/environments/{env}/resource-sets/{name}", tag = "intents", request_body = IntentDocument,
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Resource set name")),
    responses(
        (status = 201, body = Submitted),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 404, description = "Unknown environment", body = ErrorBody),
        (status = 409, description = "A resource of the body belongs to another set (`resource_set_conflict`)", body = ErrorBody),
        (status = 413, description = "Larger than `max_body_bytes`", body = ErrorBody),
        (status = 422, description = "Invalid set name or intent", body = ErrorBody),
    ))]
async fn put_resource_set(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, name)): Path<(String, String)>,
    JsonBytes(body): JsonBytes,
) -> Result<impl IntoResponse> {
    let (info, released) = app.put_resource_set(&env, &name, &body, Some(&caller.user)).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(Submitted {
            version: info.version,
            released,
        }),
    ))
}

#[derive(Serialize, ToSchema)]
pub(super) struct Submitted {
    version: i64,
    /// Released at once (the environment's `auto_deploy`).
    released: bool,
}

#[derive(Serialize, ToSchema)]
pub(super) struct VersionList {
    items: Vec<VersionInfo>,
}

/// A version with its pinned intent (every adaptor named by digest).
#[derive(Serialize, ToSchema)]
pub(super) struct VersionView {
    #[serde(flatten)]
    info: VersionInfo,
    #[schema(value_type = IntentDocument)]
    intent: Value,
}

impl From<IntentVersion> for VersionView {
    fn from(v: IntentVersion) -> VersionView {
        VersionView {
            intent: match serde_json::from_str(&v.document) {
                Ok(mut intent) => {
                    crate::intent::redact_document(&mut intent);
                    intent
                }
                // Stored documents are valid JSON; should one not be, none of it is shown.
                Err(_) => Value::String(format!("<{} bytes that are not JSON>", v.document.len())),
            },
            info: v.info.into(),
        }
    }
}

/// Submits a new version. Refused with a 4xx naming the culprit: malformed JSON, duplicate ids, a
/// `requires` naming nothing, a dependency cycle, an unknown plugin, a body over the limit.
#[utoipa::path(post, path = "/environments/{env}/intents", tag = "intents", request_body = IntentDocument,
    params(("env" = String, Path, description = "Environment name or id")),
    responses(
        (status = 201, body = Submitted),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 404, description = "Unknown environment", body = ErrorBody),
        (status = 413, description = "Larger than `max_body_bytes`", body = ErrorBody),
        (status = 422, description = "Invalid intent: `duplicate_resource`, `unknown_requirement`, `dependency_cycle`, `unknown_plugin`, …", body = ErrorBody),
    ))]
async fn submit_intent(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path(env): Path<String>,
    JsonBytes(body): JsonBytes,
) -> Result<impl IntoResponse> {
    let (info, released) = app.submit(&env, &body, Some(&caller.user)).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(Submitted {
            version: info.version,
            released,
        }),
    ))
}

#[utoipa::path(get, path = "/environments/{env}/intents", tag = "intents",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 200, body = VersionList), (status = 404, body = ErrorBody)))]
async fn list_intents(State(app): State<AppState>, Path(env): Path<String>) -> Result<axum::Json<VersionList>> {
    let env = app.get(&env).await?;
    Ok(axum::Json(VersionList {
        items: app.versions(&env).await?.into_iter().map(VersionInfo::from).collect(),
    }))
}

#[utoipa::path(get, path = "/environments/{env}/intents/{version}", tag = "intents",
    params(("env" = String, Path, description = "Environment name or id"), ("version" = i64, Path)),
    responses((status = 200, body = VersionView), (status = 404, body = ErrorBody)))]
async fn get_intent(State(app): State<AppState>, Path((env, version)): Path<(String, i64)>) -> Result<axum::Json<VersionView>> {
    let env = app.get(&env).await?;
    let version = app.version(&env, version).await?;
    Ok(axum::Json(VersionView::from(version)))
}

/// What changed from `version` to `other`: resources added, removed, and each changed field.
#[utoipa::path(get, path = "/environments/{env}/intents/{version}/diff/{other}", tag = "intents",
    params(("env" = String, Path, description = "Environment name or id"), ("version" = i64, Path, description = "From"), ("other" = i64, Path, description = "To")),
    responses((status = 200, body = IntentDiff), (status = 404, body = ErrorBody)))]
async fn diff_intents(
    State(app): State<AppState>,
    Path((env, version, other)): Path<(String, i64, i64)>,
) -> Result<axum::Json<IntentDiff>> {
    Ok(axum::Json(app.diff(&env, version, other).await?))
}

/// Makes this version the one the scheduler drives towards.
#[utoipa::path(post, path = "/environments/{env}/intents/{version}/release", tag = "intents",
    params(("env" = String, Path, description = "Environment name or id"), ("version" = i64, Path)),
    responses((status = 200, body = VersionInfo), (status = 404, body = ErrorBody)))]
async fn release_intent(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, version)): Path<(String, i64)>,
) -> Result<axum::Json<VersionInfo>> {
    Ok(axum::Json(app.release(&env, version, Some(&caller.user)).await?.into()))
}

/// Rolls back to `version`: its document becomes a new version, released at once.
#[utoipa::path(post, path = "/environments/{env}/intents/{version}/rollback", tag = "intents",
    params(("env" = String, Path, description = "Environment name or id"), ("version" = i64, Path, description = "The version to go back to")),
    responses((status = 201, description = "The new version", body = VersionInfo), (status = 404, body = ErrorBody)))]
async fn rollback_intent(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, version)): Path<(String, i64)>,
) -> Result<impl IntoResponse> {
    Ok((
        StatusCode::CREATED,
        axum::Json(VersionInfo::from(app.rollback(&env, version, Some(&caller.user)).await?)),
    ))
}

//! The user's actions: deploy (retry failures now), repair (heal everything now) and dryrun of a
//! version. Each answers 202 with an id (and a `Location`) whose outcome is fetched later.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::Caller;
use super::extract::{OptionalJson, Path};
use super::{ApiError, AppState, ErrorBody, Result};
use crate::scheduler::dryrun::report::DryrunResult;
use crate::store::{DryrunId, DryrunReport, DryrunStatus, Millis, Operation, OperationId, OperationKind, OperationStatus};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(deploy))
        .routes(routes!(repair))
        .routes(routes!(get_operation))
        .routes(routes!(start_dryrun))
        .routes(routes!(list_dryruns))
        .routes(routes!(get_dryrun))
}

/// A deploy or repair and, once the scheduler has settled, its outcome.
#[derive(Serialize, ToSchema)]
pub(super) struct OperationView {
    #[schema(value_type = String, format = Uuid)]
    id: OperationId,
    kind: OperationKind,
    status: OperationStatus,
    created_at: Millis,
    finished_at: Option<Millis>,
    /// The user who started it.
    author: Option<String>,
    /// Once `done`: the released version, resources per status, and actions per outcome that
    /// started while it ran.
    #[schema(value_type = Option<Object>, example = json!({"version": 3, "resources": {"deployed": 12}, "actions": {"unchanged": 11, "changed": 1}}))]
    result: Option<Value>,
}

impl From<Operation> for OperationView {
    fn from(op: Operation) -> OperationView {
        OperationView {
            id: op.id,
            kind: op.kind,
            status: op.status,
            created_at: op.created_at,
            finished_at: op.finished_at,
            author: op.author,
            result: op.result.and_then(|r| serde_json::from_str(&r).ok()),
        }
    }
}

/// A dryrun and, once done, its report.
#[derive(Serialize, ToSchema)]
pub(super) struct DryrunView {
    #[schema(value_type = String, format = Uuid)]
    id: DryrunId,
    version: i64,
    status: DryrunStatus,
    created_at: Millis,
    finished_at: Option<Millis>,
    /// The user who started it.
    author: Option<String>,
    /// Once `done`: per resource the changes or "no change", and what could not be checked and
    /// why. A `failed` dryrun carries `{error: {code, message}}` instead.
    /// The stored report as it is (no tree of values: 100,000 findings are tens of MiB).
    #[schema(value_type = Option<DryrunResult>)]
    report: Option<Box<RawValue>>,
}

impl From<DryrunReport> for DryrunView {
    fn from(d: DryrunReport) -> DryrunView {
        DryrunView {
            id: d.id,
            version: d.version,
            status: d.status,
            created_at: d.created_at,
            finished_at: d.finished_at,
            author: d.author,
            // Stored by this host, so valid JSON; checked anyway (no tree is built).
            report: d.report.and_then(|r| RawValue::from_string(r).ok()),
        }
    }
}

#[derive(Serialize, ToSchema)]
pub(super) struct DryrunList {
    items: Vec<DryrunView>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DryrunRequest {
    /// Default: the latest version.
    version: Option<i64>,
}

fn accepted<T: Serialize>(location: String, body: T) -> impl IntoResponse {
    (StatusCode::ACCEPTED, [(header::LOCATION, location)], axum::Json(body))
}

async fn operation(app: AppState, caller: Caller, env: String, kind: OperationKind) -> Result<impl IntoResponse> {
    let op = app.start_operation(&env, kind, Some(&caller.0.user)).await?;
    let location = format!("/api/v1/environments/{env}/operations/{}", op.id);
    Ok(accepted(location, OperationView::from(op)))
}

/// Retries every failed, skipped or unavailable resource now.
#[utoipa::path(post, path = "/environments/{env}/deploy", tag = "actions",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 202, body = OperationView, headers(("Location" = String, description = "Where to fetch the outcome"))), (status = 404, body = ErrorBody)))]
async fn deploy(State(app): State<AppState>, caller: Caller, Path(env): Path<String>) -> Result<impl IntoResponse> {
    operation(app, caller, env, OperationKind::Deploy).await
}

/// Re-reads every resource now and restores what drifted.
#[utoipa::path(post, path = "/environments/{env}/repair", tag = "actions",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 202, body = OperationView, headers(("Location" = String, description = "Where to fetch the outcome"))), (status = 404, body = ErrorBody)))]
async fn repair(State(app): State<AppState>, caller: Caller, Path(env): Path<String>) -> Result<impl IntoResponse> {
    operation(app, caller, env, OperationKind::Repair).await
}

#[utoipa::path(get, path = "/environments/{env}/operations/{id}", tag = "actions",
    params(("env" = String, Path, description = "Environment name or id"), ("id" = String, Path, format = Uuid)),
    responses((status = 200, body = OperationView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn get_operation(State(app): State<AppState>, Path((env, id)): Path<(String, String)>) -> Result<axum::Json<OperationView>> {
    let id: OperationId = id.parse().map_err(|_| {
        ApiError::bad_request(
            "invalid_path",
            format!("`{}` is not an operation id", id.chars().take(100).collect::<String>()),
        )
    })?;
    let env = app.get(&env).await?;
    Ok(axum::Json(app.operation(&env, &id).await?.into()))
}

/// Reads and compares every resource of a version through its adaptor, changing nothing.
#[utoipa::path(post, path = "/environments/{env}/dryrun", tag = "actions", request_body(content = Option<DryrunRequest>, description = "Optional; default: the latest version"),
    params(("env" = String, Path, description = "Environment name or id")),
    responses(
        (status = 202, body = DryrunView, headers(("Location" = String, description = "Where to fetch the report"))),
        (status = 400, body = ErrorBody),
        (status = 404, description = "Unknown environment or version", body = ErrorBody),
        (status = 409, description = "No version submitted yet", body = ErrorBody),
    ))]
async fn start_dryrun(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path(env): Path<String>,
    OptionalJson(request): OptionalJson<DryrunRequest>,
) -> Result<impl IntoResponse> {
    let version = request.and_then(|r| r.version);
    let report = app.start_dryrun(&env, version, Some(&caller.user)).await?;
    let location = format!("/api/v1/environments/{env}/dryruns/{}", report.id);
    Ok(accepted(location, DryrunView::from(report)))
}

/// The environment's dryruns, newest first, without their reports.
#[utoipa::path(get, path = "/environments/{env}/dryruns", tag = "actions",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 200, body = DryrunList), (status = 404, body = ErrorBody)))]
async fn list_dryruns(State(app): State<AppState>, Path(env): Path<String>) -> Result<axum::Json<DryrunList>> {
    let env = app.get(&env).await?;
    let items = app.dryruns(&env).await?;
    Ok(axum::Json(DryrunList {
        items: items.into_iter().map(DryrunView::from).collect(),
    }))
}

#[utoipa::path(get, path = "/environments/{env}/dryruns/{id}", tag = "actions",
    params(("env" = String, Path, description = "Environment name or id"), ("id" = String, Path, format = Uuid)),
    responses((status = 200, body = DryrunView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn get_dryrun(State(app): State<AppState>, Path((env, id)): Path<(String, String)>) -> Result<axum::Json<DryrunView>> {
    let id: DryrunId = id.parse().map_err(|_| {
        ApiError::bad_request(
            "invalid_path",
            format!("`{}` is not a dryrun id", id.chars().take(100).collect::<String>()),
        )
    })?;
    let env = app.get(&env).await?;
    Ok(axum::Json(app.dryrun(&env, &id).await?.into()))
}

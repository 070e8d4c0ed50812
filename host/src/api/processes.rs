//! Processes: instances of catalog service versions on nodes — create (202; the node named or
//! chosen by the solver), list, show, update (a new version and/or configuration), terminate.
//! Every answer about one process carries its revision as an `ETag`; `PATCH` and `DELETE` with
//! an `If-Match` naming another revision are refused (409 `version_conflict`). Connections
//! between processes' interfaces (made only here, refused with the reason named), and the changes
//! each process has not taken yet (`pending`).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::Caller;
use super::etag::{etag, if_match};
use super::extract::{Json, Path, Query};
use super::{AppState, ErrorBody, Result};
use crate::processes::connections::{CONNECTION_REVISION, ConnectRequest, ConnectionView};
use crate::processes::requests::{CreateProcess, UpdateProcess, parse_states};
use crate::processes::view::{PendingList, ProcessView};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_process, list_processes))
        .routes(routes!(get_process, update_process, terminate_process))
        .routes(routes!(connect, list_connections))
        .routes(routes!(get_connection, disconnect))
        .routes(routes!(pending))
        .routes(routes!(move_process))
}

/// `POST …/processes/{name}/move`.
#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct MoveRequest {
    /// The node to move to; the solver picks another node than its own when absent.
    #[serde(default)]
    node: Option<String>,
}

/// Moves the process to another node (202): started there, then stopped and removed on the old
/// one; its peers are told its new address once it runs there. A failure rolls it back.
#[utoipa::path(post, path = "/environments/{env}/processes/{name}/move", tag = "services", request_body = MoveRequest,
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Process name"),
        ("If-Match" = Option<String>, Header, description = "The revision (ETag) the change is based on")),
    responses(
        (status = 202, body = ProcessView),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Stale If-Match, or the process is not running", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn move_process(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, name)): Path<(String, String)>,
    headers: HeaderMap,
    Json(req): Json<MoveRequest>,
) -> Result<Response> {
    let view = app
        .move_process(&env, &name, req.node, if_match(&headers), Some(&caller.user))
        .await?;
    Ok(answer(StatusCode::ACCEPTED, view))
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ConnectionList {
    items: Vec<ConnectionView>,
}

/// Connects one process's interface to another's (201). Refused (422) naming the reason:
/// `unknown_process`, `unknown_interface`, `incompatible_interfaces` (what each side offers),
/// `cardinality_exceeded` (the limit and the connections it has).
#[utoipa::path(post, path = "/environments/{env}/connections", tag = "services", request_body = ConnectRequest,
    params(("env" = String, Path, description = "Environment name or id")),
    responses(
        (status = 201, description = "Made; its `ETag` is its revision, `\"1\"` (a connection is never changed)", body = ConnectionView),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Connected already, or a process is terminating", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn connect(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path(env): Path<String>,
    Json(req): Json<ConnectRequest>,
) -> Result<impl IntoResponse> {
    let view = app.connect(&env, req, Some(&caller.user)).await?;
    Ok((StatusCode::CREATED, etag(CONNECTION_REVISION), axum::Json(view)))
}

#[utoipa::path(get, path = "/environments/{env}/connections", tag = "services",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 200, body = ConnectionList), (status = 404, body = ErrorBody)))]
async fn list_connections(State(app): State<AppState>, Path(env): Path<String>) -> Result<axum::Json<ConnectionList>> {
    Ok(axum::Json(ConnectionList {
        items: app.connections(&env).await?,
    }))
}

/// One connection; its `ETag` is its revision, `"1"` (a connection is made or deleted, never
/// changed).
#[utoipa::path(get, path = "/environments/{env}/connections/{id}", tag = "services",
    params(("env" = String, Path, description = "Environment name or id"), ("id" = String, Path, description = "Connection id")),
    responses((status = 200, body = ConnectionView), (status = 404, body = ErrorBody)))]
async fn get_connection(State(app): State<AppState>, Path((env, id)): Path<(String, String)>) -> Result<impl IntoResponse> {
    let view = app.connection(&env, &id).await?;
    Ok((etag(CONNECTION_REVISION), axum::Json(view)))
}

/// Deletes a connection; both processes are told.
#[utoipa::path(delete, path = "/environments/{env}/connections/{id}", tag = "services",
    params(("env" = String, Path, description = "Environment name or id"), ("id" = String, Path, description = "Connection id"),
        ("If-Match" = Option<String>, Header, description = "The connection's revision (ETag), `\"1\"`")),
    responses((status = 200, body = ConnectionView), (status = 404, body = ErrorBody),
        (status = 409, description = "`version_conflict`: `If-Match` names another revision", body = ErrorBody)))]
async fn disconnect(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<axum::Json<ConnectionView>> {
    Ok(axum::Json(app.disconnect(&env, &id, if_match(&headers), Some(&caller.user)).await?))
}

/// What each process has not taken yet (its tasks whose desired state is not deployed): the
/// step, since when, attempts, the last error. The scheduler re-applies them until they hold.
#[utoipa::path(get, path = "/environments/{env}/pending", tag = "services",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 200, body = PendingList), (status = 404, body = ErrorBody)))]
async fn pending(State(app): State<AppState>, Path(env): Path<String>) -> Result<axum::Json<PendingList>> {
    Ok(axum::Json(app.pending(&env).await?))
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ProcessList {
    items: Vec<ProcessView>,
}

/// The answer for one process: `status`, its view, its revision as the `ETag`.
fn answer(status: StatusCode, view: ProcessView) -> Response {
    (status, etag(view.revision), axum::Json(view)).into_response()
}

/// Creates a process of a catalog service version (202: `creating` until its tasks are done).
#[utoipa::path(post, path = "/environments/{env}/processes", tag = "services", request_body = CreateProcess,
    params(("env" = String, Path, description = "Environment name or id")),
    responses(
        (status = 202, body = ProcessView),
        (status = 404, description = "Unknown environment or service", body = ErrorBody),
        (status = 409, description = "A process of that name exists, or the port is taken on the node", body = ErrorBody),
        (status = 422, description = "Invalid name, configuration or node", body = ErrorBody)))]
async fn create_process(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path(env): Path<String>,
    Json(req): Json<CreateProcess>,
) -> Result<Response> {
    Ok(answer(
        StatusCode::ACCEPTED,
        app.create_process(&env, req, Some(&caller.user)).await?,
    ))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ProcessQuery {
    /// Only processes in these states, comma-separated (`creating,moving`); every process when
    /// absent.
    state: Option<String>,
}

#[utoipa::path(get, path = "/environments/{env}/processes", tag = "services",
    params(("env" = String, Path, description = "Environment name or id"), ProcessQuery),
    responses((status = 200, body = ProcessList), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn list_processes(
    State(app): State<AppState>,
    Path(env): Path<String>,
    Query(q): Query<ProcessQuery>,
) -> Result<axum::Json<ProcessList>> {
    let states = q.state.as_deref().map(parse_states).transpose()?;
    Ok(axum::Json(ProcessList {
        items: app.processes(&env, states.as_deref()).await?,
    }))
}

/// The process: state, service version, node, configuration (secrets redacted), what last ran,
/// its tasks and their states.
#[utoipa::path(get, path = "/environments/{env}/processes/{name}", tag = "services",
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Process name")),
    responses((status = 200, body = ProcessView), (status = 404, body = ErrorBody)))]
async fn get_process(State(app): State<AppState>, Path((env, name)): Path<(String, String)>) -> Result<Response> {
    Ok(answer(StatusCode::OK, app.process(&env, &name).await?))
}

/// Moves the process to another version of its service and/or another configuration (202); a
/// failure rolls it back to what last ran.
#[utoipa::path(patch, path = "/environments/{env}/processes/{name}", tag = "services", request_body = UpdateProcess,
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Process name"),
        ("If-Match" = Option<String>, Header, description = "The revision (ETag) the change is based on")),
    responses(
        (status = 202, body = ProcessView),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Stale If-Match, or the process's state does not allow it", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn update_process(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, name)): Path<(String, String)>,
    headers: HeaderMap,
    Json(req): Json<UpdateProcess>,
) -> Result<Response> {
    let view = app.update_process(&env, &name, req, if_match(&headers), Some(&caller.user)).await?;
    Ok(answer(StatusCode::ACCEPTED, view))
}

/// Terminates the process: stopped, then removed (202); it disappears when that is done.
#[utoipa::path(delete, path = "/environments/{env}/processes/{name}", tag = "services",
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Process name"),
        ("If-Match" = Option<String>, Header, description = "The revision (ETag) the change is based on")),
    responses(
        (status = 202, body = ProcessView),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Stale If-Match, or already terminating", body = ErrorBody)))]
async fn terminate_process(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response> {
    let view = app.terminate_process(&env, &name, if_match(&headers), Some(&caller.user)).await?;
    Ok(answer(StatusCode::ACCEPTED, view))
}

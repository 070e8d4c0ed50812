//! Environments: create, list, get (with resource counts), change settings, halt and resume,
//! delete.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::Caller;
use super::etag::{etag, if_match};
use super::extract::{Json, Path};
use super::views::Environment;
use super::{AppState, ErrorBody, Result};
use crate::policy::settings::EnvironmentSettings;
use axum::extract::State;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_environment, list_environments))
        .routes(routes!(get_environment, update_environment, delete_environment))
        .routes(routes!(halt))
        .routes(routes!(resume))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewEnvironment {
    /// 1–63 of `a-z 0-9 - _`, starting with a letter or digit.
    #[schema(example = "prod", pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    name: String,
    /// Defaults: the host's `environment_defaults`.
    settings: Option<EnvironmentSettings>,
}

/// Some settings to change.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct EnvironmentPatch {
    /// Only the fields given change; unknown fields are refused.
    #[schema(value_type = Object, example = json!({"repair_interval_s": 300, "per_node_concurrency": 8}))]
    settings: serde_json::Value,
}

#[derive(Serialize, ToSchema)]
pub(super) struct EnvironmentList {
    items: Vec<Environment>,
}

/// An environment with how many of its resources are in each status.
#[derive(Serialize, ToSchema)]
pub(super) struct EnvironmentView {
    #[serde(flatten)]
    environment: Environment,
    /// Status → count; statuses with none are left out.
    #[schema(example = json!({"deployed": 10, "failed": 1}))]
    resources: BTreeMap<String, i64>,
    /// Process state → count; states with none are left out (no processes: empty).
    #[schema(example = json!({"running": 2, "moving": 1}))]
    processes: BTreeMap<&'static str, i64>,
    /// Whether changes to its processes (operations, connections, finished operations' clean-up)
    /// wait for the process releaser, which gathers them into one version: until released, the
    /// scheduler deploys what came before.
    processes_release_pending: bool,
    /// Whether the environment's scheduler runs.
    scheduler: SchedulerView,
}

/// The state of an environment's scheduler.
#[derive(Serialize, ToSchema)]
pub(super) struct SchedulerView {
    /// `running`, or `failed`: it stopped on its own, and requests that need it answer 503
    /// `scheduler_unavailable` until the host restarts.
    #[schema(example = "running")]
    status: &'static str,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

#[utoipa::path(post, path = "/environments", tag = "environments", request_body = NewEnvironment,
    responses(
        (status = 201, body = Environment),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody),
        (status = 422, description = "Invalid name or settings", body = ErrorBody),
    ))]
async fn create_environment(State(app): State<AppState>, Json(new): Json<NewEnvironment>) -> Result<impl IntoResponse> {
    let env = app.create(&new.name, new.settings).await?;
    Ok((StatusCode::CREATED, axum::Json(Environment::from(env))))
}

#[utoipa::path(get, path = "/environments", tag = "environments", responses((status = 200, body = EnvironmentList)))]
async fn list_environments(State(app): State<AppState>, Caller(caller): Caller) -> Result<axum::Json<EnvironmentList>> {
    Ok(axum::Json(EnvironmentList {
        items: app.list_for(&caller).await?.into_iter().map(Environment::from).collect(),
    }))
}

#[utoipa::path(get, path = "/environments/{env}", tag = "environments",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 200, body = EnvironmentView), (status = 404, body = ErrorBody)))]
async fn get_environment(State(app): State<AppState>, Path(env): Path<String>) -> Result<impl IntoResponse> {
    let environment = app.get(&env).await?;
    let tag = crate::app::settings_tag(&environment.settings);
    let counts = app.status_counts(&environment).await?;
    let resources = counts.into_iter().map(|(s, n)| (s.as_str().to_string(), n)).collect();
    let processes = app.process_counts(&environment).await?;
    let processes_release_pending = app.process_release_pending(&environment).await;
    let reason = app.scheduler_failure(&environment).await;
    let scheduler = SchedulerView {
        status: if reason.is_some() { "failed" } else { "running" },
        reason,
    };
    Ok((
        etag(tag),
        axum::Json(EnvironmentView {
            environment: environment.into(),
            resources,
            processes,
            processes_release_pending,
            scheduler,
        }),
    ))
}

/// Changes settings; the scheduler applies them to what it starts or schedules next.
#[utoipa::path(patch, path = "/environments/{env}", tag = "environments", request_body = EnvironmentPatch,
    params(("env" = String, Path, description = "Environment name or id"),
        ("If-Match" = Option<String>, Header, description = "The settings' ETag the change is based on")),
    responses(
        (status = 200, body = Environment),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "`If-Match` names settings that are no longer current (`version_conflict`)", body = ErrorBody),
        (status = 422, description = "An unknown or invalid setting, named", body = ErrorBody),
    ))]
async fn update_environment(
    State(app): State<AppState>,
    Path(env): Path<String>,
    headers: axum::http::HeaderMap,
    Json(patch): Json<EnvironmentPatch>,
) -> Result<impl IntoResponse> {
    let env = app.update_settings(&env, patch.settings, if_match(&headers)).await?;
    Ok((etag(crate::app::settings_tag(&env.settings)), axum::Json(Environment::from(env))))
}

/// Stops the scheduler (actions in flight finish) and deletes everything of the environment. A
/// request on the environment that races the delete answers 404, as one after it does.
#[utoipa::path(delete, path = "/environments/{env}", tag = "environments",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 204, description = "Deleted"), (status = 404, body = ErrorBody)))]
async fn delete_environment(State(app): State<AppState>, Path(env): Path<String>) -> Result<StatusCode> {
    app.delete(&env).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Halts the environment: nothing new starts (no deploy, retry or repair); actions in flight
/// finish. Kept across restarts.
#[utoipa::path(post, path = "/environments/{env}/halt", tag = "environments",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 200, body = Environment), (status = 404, body = ErrorBody)))]
async fn halt(State(app): State<AppState>, Path(env): Path<String>) -> Result<axum::Json<Environment>> {
    Ok(axum::Json(app.set_halted(&env, true).await?.into()))
}

/// Resumes a halted environment: what became due meanwhile runs now.
#[utoipa::path(post, path = "/environments/{env}/resume", tag = "environments",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 200, body = Environment), (status = 404, body = ErrorBody)))]
async fn resume(State(app): State<AppState>, Path(env): Path<String>) -> Result<axum::Json<Environment>> {
    Ok(axum::Json(app.set_halted(&env, false).await?.into()))
}

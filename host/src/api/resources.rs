//! Resources: the states of an environment's resources (filtered, paged), one resource with its
//! recent actions, and the action log (of the environment or of one resource).

use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{Path, Query, bounded};
use super::views::{ResourceState, StatePage};
use super::{ApiError, AppState, ErrorBody, Result};
use crate::scheduler::{ErrorInfo, ResourceStatus};
use crate::store::{ActionFilter, ActionKind, DEFAULT_PAGE, LoggedAction, MAX_PAGE, Millis, StateFilter};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_resources))
        .routes(routes!(get_resource))
        .routes(routes!(resource_actions))
        .routes(routes!(environment_actions))
}

/// Recent actions shown with a resource.
const RECENT_ACTIONS: u32 = 20;

/// Filters of the resource listing; `after` and `limit` page through it (resource-id order).
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ResourceQuery {
    status: Option<ResourceStatus>,
    /// The resource type (`file`, `directory`, …).
    #[serde(rename = "type")]
    #[param(rename = "type")]
    resource_type: Option<String>,
    node: Option<String>,
    /// Case-insensitive substring of the resource id.
    text: Option<String>,
    /// The `next_after` of the previous page.
    after: Option<String>,
    /// 1–10,000; default 100.
    #[param(minimum = 1, maximum = 10_000)]
    limit: Option<u32>,
}

/// Filters of the action log, newest first; `before` and `limit` page through it.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ActionQuery {
    /// Only this resource's actions (environment log only).
    resource: Option<String>,
    kind: Option<ActionKind>,
    /// `unchanged`, `changed`, `failed`, `unavailable`, …
    outcome: Option<String>,
    version: Option<i64>,
    /// Started at or after (milliseconds since the epoch).
    since: Option<Millis>,
    /// Started before (milliseconds since the epoch).
    until: Option<Millis>,
    /// The `next_before` of the previous page.
    before: Option<i64>,
    /// 1–10,000; default 100.
    #[param(minimum = 1, maximum = 10_000)]
    limit: Option<u32>,
}

/// A page's `limit`: 1–[`MAX_PAGE`], refused outside (never clamped); absent, the default.
fn page_limit(limit: Option<u32>) -> Result<u32> {
    Ok(bounded("limit", limit, 1, MAX_PAGE)?.unwrap_or(DEFAULT_PAGE))
}

impl ActionQuery {
    fn filter(self) -> Result<ActionFilter> {
        Ok(ActionFilter {
            limit: page_limit(self.limit)?,
            resource_id: self.resource,
            kind: self.kind,
            outcome: self.outcome,
            version: self.version,
            since: self.since,
            until: self.until,
            before: self.before,
        })
    }
}

/// An action-log entry, its changes and messages as JSON.
#[derive(Serialize, ToSchema)]
pub(super) struct ActionView {
    seq: i64,
    id: String,
    resource_id: String,
    kind: ActionKind,
    version: Option<i64>,
    started_at: Millis,
    finished_at: Millis,
    outcome: String,
    /// `{field, current, desired}` per changed field.
    #[schema(value_type = Vec<Object>)]
    changes: Value,
    messages: Vec<String>,
    error: Option<ErrorInfo>,
}

impl From<LoggedAction> for ActionView {
    fn from(a: LoggedAction) -> ActionView {
        let r = a.action;
        ActionView {
            seq: a.seq,
            id: r.id.to_string(),
            resource_id: r.resource_id,
            kind: r.kind,
            version: r.version,
            started_at: r.started_at,
            finished_at: r.finished_at,
            outcome: r.outcome,
            changes: serde_json::from_str(&r.changes).unwrap_or(Value::Array(Vec::new())),
            messages: serde_json::from_str(&r.messages).unwrap_or_default(),
            error: r.error,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub(super) struct ActionPageView {
    items: Vec<ActionView>,
    /// Pass as `before` for the next (older) page; absent on the last page.
    next_before: Option<i64>,
}

/// One resource: its state and its latest actions, newest first.
#[derive(Serialize, ToSchema)]
pub(super) struct ResourceView {
    state: ResourceState,
    actions: Vec<ActionView>,
}

#[utoipa::path(get, path = "/environments/{env}/resources", tag = "resources",
    params(("env" = String, Path, description = "Environment name or id"), ResourceQuery),
    responses((status = 200, body = StatePage), (status = 400, description = "An unknown filter or value", body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn list_resources(
    State(app): State<AppState>,
    Path(env): Path<String>,
    Query(q): Query<ResourceQuery>,
) -> Result<axum::Json<StatePage>> {
    let env = app.get(&env).await?;
    let filter = StateFilter {
        status: q.status,
        resource_type: q.resource_type,
        node: q.node,
        text: q.text,
        limit: page_limit(q.limit)?,
        after: q.after,
    };
    Ok(axum::Json(app.resource_states(&env, &filter).await?.into()))
}

#[utoipa::path(get, path = "/environments/{env}/resources/{id}", tag = "resources",
    params(("env" = String, Path, description = "Environment name or id"), ("id" = String, Path, description = "Resource id, percent-encoded")),
    responses((status = 200, body = ResourceView), (status = 404, body = ErrorBody)))]
async fn get_resource(State(app): State<AppState>, Path((env, id)): Path<(String, String)>) -> Result<axum::Json<ResourceView>> {
    let env = app.get(&env).await?;
    let state = app.resource_state(&env, &id).await?;
    let actions = app.recent_actions(&env, &id, RECENT_ACTIONS).await?;
    Ok(axum::Json(ResourceView {
        state: state.into(),
        actions: actions.into_iter().map(ActionView::from).collect(),
    }))
}

/// The action log of one resource.
#[utoipa::path(get, path = "/environments/{env}/resources/{id}/actions", tag = "resources",
    params(("env" = String, Path, description = "Environment name or id"), ("id" = String, Path, description = "Resource id, percent-encoded"), ActionQuery),
    responses((status = 200, body = ActionPageView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn resource_actions(
    State(app): State<AppState>,
    Path((env, id)): Path<(String, String)>,
    Query(q): Query<ActionQuery>,
) -> Result<axum::Json<ActionPageView>> {
    if q.resource.as_deref().is_some_and(|r| r != id) {
        return Err(ApiError::bad_request("invalid_query", "`resource` is already given by the path"));
    }
    let env = app.get(&env).await?;
    app.resource_state(&env, &id).await?;
    let filter = ActionFilter {
        resource_id: Some(id),
        ..q.filter()?
    };
    action_page(&app, &env, &filter).await
}

/// The action log of the environment: every action (kind, start, end, outcome, changes,
/// messages), newest first.
#[utoipa::path(get, path = "/environments/{env}/actions", tag = "resources",
    params(("env" = String, Path, description = "Environment name or id"), ActionQuery),
    responses((status = 200, body = ActionPageView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn environment_actions(
    State(app): State<AppState>,
    Path(env): Path<String>,
    Query(q): Query<ActionQuery>,
) -> Result<axum::Json<ActionPageView>> {
    let env = app.get(&env).await?;
    action_page(&app, &env, &q.filter()?).await
}

async fn action_page(app: &AppState, env: &crate::store::Environment, filter: &ActionFilter) -> Result<axum::Json<ActionPageView>> {
    let page = app.actions(env, filter).await?;
    Ok(axum::Json(ActionPageView {
        items: page.items.into_iter().map(ActionView::from).collect(),
        next_before: page.next_before,
    }))
}

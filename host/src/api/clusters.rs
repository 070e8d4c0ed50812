//! Cluster templates (submitted, validated and versioned per environment) and clusters: create
//! (202; or a preview of layout and plan), list, show (layout, tasks and their states,
//! progress), amend, reconfigure, stop/start/restart a service, retry, extend the lease, delete.

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
use super::{ApiError, AppState, ErrorBody, Result};
use crate::clusters::ClusterError;
use crate::clusters::requests::{AmendRequest, CreateRequest, ReconfigureRequest, ServiceAction};
use crate::clusters::view::{ClusterView, Outcome, PlanPreview};
use crate::store::{Millis, TemplateRecord};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_templates))
        .routes(routes!(submit_template, get_template, delete_template))
        .routes(routes!(template_versions))
        .routes(routes!(create_cluster, list_clusters))
        .routes(routes!(get_cluster, delete_cluster))
        .routes(routes!(amend_cluster))
        .routes(routes!(reconfigure_cluster))
        .routes(routes!(service_action))
        .routes(routes!(retry_cluster))
        .routes(routes!(extend_lease))
}

impl From<ClusterError> for ApiError {
    fn from(e: ClusterError) -> ApiError {
        let (status, code) = match &e {
            ClusterError::Env(_) => match e {
                ClusterError::Env(env) => return env.into(),
                _ => unreachable!(),
            },
            ClusterError::Template(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_template"),
            ClusterError::UnknownTemplate(_) => (StatusCode::NOT_FOUND, "unknown_template"),
            ClusterError::UnknownCluster(_) => (StatusCode::NOT_FOUND, "unknown_cluster"),
            ClusterError::Exists(_) => (StatusCode::CONFLICT, "cluster_exists"),
            ClusterError::Busy { .. } => (StatusCode::CONFLICT, "cluster_busy"),
            ClusterError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_cluster_request"),
            ClusterError::UnknownPlugin { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "unknown_plugin"),
            ClusterError::PluginRejected { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "plugin_rejected"),
            ClusterError::CapabilityNotGranted { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "capability_not_granted"),
            ClusterError::TemplateInUse(_) => (StatusCode::CONFLICT, "template_in_use"),
            ClusterError::NoValidLayout { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "no_valid_layout"),
            ClusterError::SolverFailed { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "solver_failed"),
            ClusterError::InvalidLayout { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_layout"),
            ClusterError::UnknownService(_) => (StatusCode::NOT_FOUND, "unknown_service"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// A stored template version, its solver and automators pinned to digests.
#[derive(Serialize, ToSchema)]
pub(super) struct TemplateView {
    name: String,
    version: i64,
    created_at: Millis,
    #[schema(value_type = Object)]
    template: serde_json::Value,
}

impl From<TemplateRecord> for TemplateView {
    fn from(r: TemplateRecord) -> TemplateView {
        TemplateView {
            template: serde_json::from_str(&r.document).unwrap_or(serde_json::Value::Null),
            name: r.name,
            version: r.version,
            created_at: r.created_at,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub(super) struct TemplateList {
    items: Vec<TemplateView>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct ClusterList {
    items: Vec<ClusterView>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct VersionQuery {
    /// A version; the latest when absent.
    version: Option<i64>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LeaseBody {
    /// Seconds from now (1 to 315360000, ten years).
    #[schema(minimum = 1, maximum = 315_360_000)]
    lease_s: u64,
}

fn started(outcome: Outcome) -> Response {
    match outcome {
        Outcome::Started(view) => (StatusCode::ACCEPTED, etag(view.revision), axum::Json(view)).into_response(),
        Outcome::Preview(preview) => (StatusCode::OK, axum::Json(preview)).into_response(),
    }
}

/// The latest version of every template.
#[utoipa::path(get, path = "/environments/{env}/templates", tag = "clusters",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 200, body = TemplateList), (status = 404, body = ErrorBody)))]
async fn list_templates(State(app): State<AppState>, Path(env): Path<String>) -> Result<axum::Json<TemplateList>> {
    let items = app.templates(&env).await?.into_iter().map(TemplateView::from).collect();
    Ok(axum::Json(TemplateList { items }))
}

/// Submits a template: validated (unknown services, dependency cycles and contradictory
/// constraints refused, naming the culprit by its path), its solver and automators pinned to
/// digests, stored as the next version of `name`.
#[utoipa::path(post, path = "/environments/{env}/templates/{name}", tag = "clusters",
    request_body(content = Object, description = "The template: `services`, `constraints`, `defaults`, `solver`"),
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Template name"),
        ("If-Match" = Option<String>, Header, description = "The latest version (ETag) the new one is based on; `\"0\"`: none yet")),
    responses(
        (status = 201, body = TemplateView),
        (status = 409, description = "`If-Match` names a version that is not the latest (`version_conflict`)", body = ErrorBody),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 422, description = "`invalid_template` (the message starts with the culprit's path), `unknown_plugin`, `plugin_rejected`", body = ErrorBody),
    ))]
async fn submit_template(
    State(app): State<AppState>,
    Path((env, name)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<impl IntoResponse> {
    let record = app.submit_template(&env, &name, body, if_match(&headers)).await?;
    Ok((StatusCode::CREATED, etag(record.version), axum::Json(TemplateView::from(record))))
}

#[utoipa::path(get, path = "/environments/{env}/templates/{name}", tag = "clusters",
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Template name"), VersionQuery),
    responses((status = 200, body = TemplateView), (status = 404, body = ErrorBody)))]
async fn get_template(
    State(app): State<AppState>,
    Path((env, name)): Path<(String, String)>,
    Query(q): Query<VersionQuery>,
) -> Result<impl IntoResponse> {
    let record = app.template(&env, &name, q.version).await?;
    Ok((etag(record.version), axum::Json(TemplateView::from(record))))
}

/// Deletes every version of a template; refused while a cluster uses it.
#[utoipa::path(delete, path = "/environments/{env}/templates/{name}", tag = "clusters",
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Template name"),
        ("If-Match" = Option<String>, Header, description = "The latest version (ETag) the delete is based on")),
    responses((status = 204), (status = 404, body = ErrorBody),
        (status = 409, description = "`template_in_use`, or `If-Match` names a version that is not the latest (`version_conflict`)", body = ErrorBody)))]
async fn delete_template(
    State(app): State<AppState>,
    Path((env, name)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
) -> Result<StatusCode> {
    app.delete_template(&env, &name, if_match(&headers)).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/environments/{env}/templates/{name}/versions", tag = "clusters",
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Template name")),
    responses((status = 200, body = TemplateList), (status = 404, body = ErrorBody)))]
async fn template_versions(State(app): State<AppState>, Path((env, name)): Path<(String, String)>) -> Result<axum::Json<TemplateList>> {
    let items = app
        .template_versions(&env, &name)
        .await?
        .into_iter()
        .map(TemplateView::from)
        .collect();
    Ok(axum::Json(TemplateList { items }))
}

/// Creates a cluster: the template's solver lays it out over the nodes the environment may use,
/// the planner turns the layout into tasks, and the scheduler runs them (202; follow it with
/// GET). With `"preview": true`, answers 200 with the layout and the plan and creates nothing.
/// A task that fails `max_attempts` times rolls the create back.
#[utoipa::path(post, path = "/environments/{env}/clusters", tag = "clusters", request_body = CreateRequest,
    params(("env" = String, Path, description = "Environment name or id")),
    responses(
        (status = 202, body = ClusterView),
        (status = 200, description = "A preview", body = PlanPreview),
        (status = 400, body = ErrorBody),
        (status = 404, description = "`unknown_environment`, `unknown_template`", body = ErrorBody),
        (status = 409, description = "`cluster_exists`", body = ErrorBody),
        (status = 422, description = "`no_valid_layout` (names the constraint), `invalid_template`, `invalid_cluster_request`, `solver_failed`, `invalid_layout`", body = ErrorBody),
    ))]
async fn create_cluster(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path(env): Path<String>,
    Json(req): Json<CreateRequest>,
) -> Result<Response> {
    Ok(started(app.create_cluster(&env, req, Some(&caller.user)).await?))
}

#[utoipa::path(get, path = "/environments/{env}/clusters", tag = "clusters",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 200, body = ClusterList), (status = 404, body = ErrorBody)))]
async fn list_clusters(State(app): State<AppState>, Path(env): Path<String>) -> Result<axum::Json<ClusterList>> {
    Ok(axum::Json(ClusterList {
        items: app.clusters(&env).await?,
    }))
}

/// The cluster: status, layout (node → services), each task with its state, progress.
#[utoipa::path(get, path = "/environments/{env}/clusters/{name}", tag = "clusters",
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Cluster name")),
    responses((status = 200, body = ClusterView), (status = 404, body = ErrorBody)))]
async fn get_cluster(State(app): State<AppState>, Path((env, name)): Path<(String, String)>) -> Result<impl IntoResponse> {
    let view = app.cluster(&env, &name).await?;
    Ok((etag(view.revision), axum::Json(view)))
}

/// Deletes the cluster: services stopped and removed in reverse dependency order (202); the
/// cluster disappears when that is done.
#[utoipa::path(delete, path = "/environments/{env}/clusters/{name}", tag = "clusters",
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Cluster name"), ("If-Match" = Option<String>, Header, description = "The revision (ETag) the operation is based on")),
    responses((status = 202, body = ClusterView), (status = 404, body = ErrorBody),
        (status = 409, description = "`version_conflict`: the cluster is at another revision", body = ErrorBody)))]
async fn delete_cluster(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<impl IntoResponse> {
    let view = app.delete_cluster(&env, &name, if_match(&headers), Some(&caller.user)).await?;
    Ok((StatusCode::ACCEPTED, etag(view.revision), axum::Json(view)))
}

/// Changes the size, adds services or changes the nodes it may use; the solver keeps what it
/// can of the current layout.
#[utoipa::path(post, path = "/environments/{env}/clusters/{name}/amend", tag = "clusters", request_body = AmendRequest,
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Cluster name"), ("If-Match" = Option<String>, Header, description = "The revision (ETag) the operation is based on")),
    responses(
        (status = 202, body = ClusterView),
        (status = 200, description = "A preview", body = PlanPreview),
        (status = 404, body = ErrorBody),
        (status = 409, description = "`cluster_busy`, `version_conflict`", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
async fn amend_cluster(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, name)): Path<(String, String)>,
    headers: HeaderMap,
    Json(req): Json<AmendRequest>,
) -> Result<Response> {
    Ok(started(
        app.amend_cluster(&env, &name, req, if_match(&headers), Some(&caller.user)).await?,
    ))
}

/// Changes services' configuration: per service, a JSON merge patch of the cluster's overrides.
/// The services reconfigure and restart.
#[utoipa::path(post, path = "/environments/{env}/clusters/{name}/reconfigure", tag = "clusters", request_body = ReconfigureRequest,
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Cluster name"), ("If-Match" = Option<String>, Header, description = "The revision (ETag) the operation is based on")),
    responses(
        (status = 202, body = ClusterView),
        (status = 200, description = "A preview", body = PlanPreview),
        (status = 404, body = ErrorBody),
        (status = 409, description = "`cluster_busy`, `version_conflict`", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
async fn reconfigure_cluster(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, name)): Path<(String, String)>,
    headers: HeaderMap,
    Json(req): Json<ReconfigureRequest>,
) -> Result<Response> {
    Ok(started(
        app.reconfigure_cluster(&env, &name, req, if_match(&headers), Some(&caller.user))
            .await?,
    ))
}

/// Stops, starts or restarts a service on every node that runs it.
#[utoipa::path(post, path = "/environments/{env}/clusters/{name}/services/{service}/{action}", tag = "clusters",
    params(
        ("env" = String, Path, description = "Environment name or id"),
        ("name" = String, Path, description = "Cluster name"),
        ("service" = String, Path, description = "Service name"),
        ("action" = String, Path, description = "`stop`, `start` or `restart`"),
        ("If-Match" = Option<String>, Header, description = "The revision (ETag) the operation is based on"),
    ),
    responses((status = 202, body = ClusterView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "`cluster_busy`, `version_conflict`", body = ErrorBody)))]
async fn service_action(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, name, service, action)): Path<(String, String, String, ServiceAction)>,
    headers: HeaderMap,
) -> Result<impl IntoResponse> {
    let view = app
        .service_action(&env, &name, &service, action, if_match(&headers), Some(&caller.user))
        .await?;
    Ok((StatusCode::ACCEPTED, etag(view.revision), axum::Json(view)))
}

/// Runs a failed cluster's operation again: a rolled-back create on the same layout (never more
/// nodes than asked), other failures retry their failed tasks now.
#[utoipa::path(post, path = "/environments/{env}/clusters/{name}/retry", tag = "clusters",
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Cluster name"), ("If-Match" = Option<String>, Header, description = "The revision (ETag) the operation is based on")),
    responses((status = 202, body = ClusterView), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 409, description = "`version_conflict`", body = ErrorBody)))]
async fn retry_cluster(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<impl IntoResponse> {
    let view = app.retry_cluster(&env, &name, if_match(&headers), Some(&caller.user)).await?;
    Ok((StatusCode::ACCEPTED, etag(view.revision), axum::Json(view)))
}

/// Sets the cluster's lease: it is deleted `lease_s` seconds from now unless extended again.
#[utoipa::path(post, path = "/environments/{env}/clusters/{name}/lease", tag = "clusters", request_body = LeaseBody,
    params(("env" = String, Path, description = "Environment name or id"), ("name" = String, Path, description = "Cluster name"), ("If-Match" = Option<String>, Header, description = "The revision (ETag) the operation is based on")),
    responses(
        (status = 200, body = ClusterView),
        (status = 404, body = ErrorBody),
        (status = 409, description = "`version_conflict`", body = ErrorBody),
        (status = 422, description = "`lease_s` out of range", body = ErrorBody),
    ))]
async fn extend_lease(
    State(app): State<AppState>,
    Path((env, name)): Path<(String, String)>,
    headers: HeaderMap,
    Json(body): Json<LeaseBody>,
) -> Result<impl IntoResponse> {
    let view = app.extend_lease(&env, &name, body.lease_s, if_match(&headers)).await?;
    Ok((etag(view.revision), axum::Json(view)))
}

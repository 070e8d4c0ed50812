//! The console's clusters and templates: the list (each cluster's status and task progress, the
//! templates), a cluster's page (its layout as a grid of nodes × services with each cell's tasks,
//! progress, tasks, failure), and its operations — the same `App` calls and rules as
//! `POST …/clusters`, `…/amend`, `…/reconfigure`, `…/services/{service}/{action}`, `…/retry`,
//! `…/lease` and `DELETE …/clusters/{name}`.
//!
//! An operation that changes what runs (create, amend, reconfigure, stop, restart, delete) is
//! confirmed first: the first post shows what it would do (the solver's layout and the planned
//! task changes, from the API's own `preview`; or the services and tasks a stop, restart or delete
//! touches) with the cluster's revision, and only the confirmation runs it, naming that revision
//! as its `If-Match` — a cluster that changed in between is refused (`version_conflict`), never
//! changed in a way the operator did not see.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::Extension;
use axum::extract::State;

use super::extract::{Form, Path};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use orc_cluster::Layout;
use serde::Deserialize;

use super::pages::{error_box, layout, path_segment, time};
use super::session::{Sessions, SignedIn};
use super::{AppState, PageError, allow, audit, authorize, authorize_change, refused};
use crate::api::ApiError;
use crate::app::App;
use crate::clusters::requests::{AmendRequest, CreateRequest, ReconfigureRequest, ServiceAction};
use crate::clusters::view::{ClusterView, Outcome, PlanPreview, TaskView};
use crate::store::TemplateRecord;

pub async fn clusters(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Response, PageError> {
    let signed_in = authorize(&app, &sessions, &headers, Method::GET, "/environments/{env}/clusters", Some(&key)).await?;
    list(&app, &signed_in, &key, None).await
}

/// The list page; with `error`, a refused create shown beside its form (with the refusal's status).
async fn list(app: &App, signed_in: &SignedIn, key: &str, error: Option<(&CreateFields, &ApiError)>) -> Result<Response, PageError> {
    allow(&signed_in.principal, Method::GET, "/environments/{env}/templates", Some(key))?;
    let env = app.get(key).await.map_err(refused)?;
    let clusters = app.clusters(key).await.map_err(refused)?;
    let templates = app.templates(key).await.map_err(refused)?;
    let page = list_page(signed_in, &env.name, &clusters, &templates, error);
    Ok((error.map_or(StatusCode::OK, |(_, e)| e.status), page).into_response())
}

pub async fn cluster(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path((key, name)): Path<(String, String)>,
) -> Result<Response, PageError> {
    let signed_in = authorize(
        &app,
        &sessions,
        &headers,
        Method::GET,
        "/environments/{env}/clusters/{name}",
        Some(&key),
    )
    .await?;
    show(&app, &signed_in, &key, &name, None).await
}

/// A cluster's page; with `error`, a refused operation shown above its forms.
async fn show(app: &App, signed_in: &SignedIn, key: &str, name: &str, error: Option<&ApiError>) -> Result<Response, PageError> {
    let env = app.get(key).await.map_err(refused)?;
    let view = app.cluster(key, name).await.map_err(refused)?;
    let page = cluster_page(signed_in, &env.name, &view, error);
    Ok((error.map_or(StatusCode::OK, |e| e.status), page).into_response())
}

/// Every field an operation's form may carry; each operation reads its own. Numbers come as text,
/// so that a bad one is refused in words naming the field, like the API's.
#[derive(Deserialize, Default, Clone)]
pub struct OperationForm {
    #[serde(rename = "_csrf")]
    csrf: Option<String>,
    /// `yes` once the operator has seen what the operation would do.
    #[serde(default)]
    confirm: String,
    /// The cluster's revision the confirmation showed: the operation's `If-Match`.
    #[serde(default)]
    revision: String,
    #[serde(default)]
    size: String,
    /// Services to add, separated by commas or spaces.
    #[serde(default)]
    add_services: String,
    /// Per service, a JSON merge patch.
    #[serde(default)]
    config: String,
    #[serde(default)]
    lease_s: String,
}

/// A create's fields.
#[derive(Deserialize, Default, Clone)]
pub struct CreateFields {
    #[serde(rename = "_csrf")]
    csrf: Option<String>,
    #[serde(default)]
    confirm: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    template: String,
    #[serde(default)]
    size: String,
}

/// An operation on one cluster, as its path names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Amend,
    Reconfigure,
    Retry,
    Lease,
    Delete,
}

fn invalid(field: &str, message: String) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_cluster_request",
        format!("{field}: {message}"),
    )
}

/// An optional whole number field: empty is `None`.
fn number<T: std::str::FromStr>(field: &str, text: &str) -> Result<Option<T>, ApiError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| {
        invalid(
            field,
            format!("`{}` is not a whole number in range", text.chars().take(40).collect::<String>()),
        )
    })
}

/// The preview an operation asked for `preview` answered.
fn preview_of(outcome: Result<Outcome, crate::clusters::ClusterError>) -> Result<PlanPreview, ApiError> {
    match outcome.map_err(ApiError::from)? {
        Outcome::Preview(preview) => Ok(preview),
        Outcome::Started(view) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("a preview of cluster `{}` started an operation", view.name),
        )),
    }
}

fn confirmed(confirm: &str) -> bool {
    confirm == "yes"
}

/// The revision a confirmation names, as an `If-Match`.
fn if_match(form: &OperationForm) -> Option<&str> {
    Some(form.revision.trim()).filter(|r| !r.is_empty())
}

pub async fn create(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Form(form): Form<CreateFields>,
) -> Result<Response, PageError> {
    let route = (Method::POST, "/environments/{env}/clusters");
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), Some(&key)).await?;
    let request = |preview| -> Result<CreateRequest, ApiError> {
        Ok(CreateRequest {
            name: form.name.trim().to_string(),
            template: form.template.trim().to_string(),
            template_version: None,
            size: number("size", &form.size)?,
            services: None,
            config: BTreeMap::new(),
            nodes: Vec::new(),
            lease_s: None,
            max_attempts: None,
            preview,
        })
    };
    let author = Some(signed_in.principal.user.as_str());
    let path = format!("/environments/{key}/clusters");
    if !confirmed(&form.confirm) {
        let preview = match request(true) {
            Ok(req) => preview_of(app.create_cluster(&key, req, author).await),
            Err(e) => Err(e),
        };
        return match preview {
            Ok(preview) => {
                let hidden = [
                    ("name", form.name.as_str()),
                    ("template", form.template.as_str()),
                    ("size", form.size.as_str()),
                ];
                let what = format!("Create cluster {} from template {}", form.name.trim(), form.template.trim());
                Ok(confirm_page(&signed_in, &key, &what, &path, &hidden, None, Some(&preview), None).into_response())
            }
            Err(e) => list(&app, &signed_in, &key, Some((&form, &e))).await,
        };
    }
    let outcome = match request(false) {
        Ok(req) => app.create_cluster(&key, req, author).await.map_err(ApiError::from),
        Err(e) => Err(e),
    };
    audit(&app, &signed_in, route, &path, Some(&key), outcome.as_ref().map(drop)).await;
    match outcome {
        Ok(_) => Ok(Redirect::to(&cluster_path(&key, form.name.trim())).into_response()),
        Err(e) => list(&app, &signed_in, &key, Some((&form, &e))).await,
    }
}

fn cluster_path(env: &str, name: &str) -> String {
    format!("/environments/{}/clusters/{}", path_segment(env), path_segment(name))
}

pub async fn operate(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path((key, name, op)): Path<(String, String, Operation)>,
    Form(form): Form<OperationForm>,
) -> Result<Response, PageError> {
    let (method, api_route, segment) = match op {
        Operation::Amend => (Method::POST, "/environments/{env}/clusters/{name}/amend", "/amend"),
        Operation::Reconfigure => (Method::POST, "/environments/{env}/clusters/{name}/reconfigure", "/reconfigure"),
        Operation::Retry => (Method::POST, "/environments/{env}/clusters/{name}/retry", "/retry"),
        Operation::Lease => (Method::POST, "/environments/{env}/clusters/{name}/lease", "/lease"),
        Operation::Delete => (Method::DELETE, "/environments/{env}/clusters/{name}", ""),
    };
    let route = (method, api_route);
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), Some(&key)).await?;
    let author = Some(signed_in.principal.user.as_str());
    let path = format!("/environments/{key}/clusters/{name}{segment}");
    let action = format!(
        "{}{}",
        cluster_path(&key, &name),
        if segment.is_empty() { "/delete" } else { segment }
    );
    let amend = |preview| -> Result<AmendRequest, ApiError> {
        let add_services = form
            .add_services
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        Ok(AmendRequest {
            size: number("size", &form.size)?,
            add_services,
            nodes: None,
            preview,
        })
    };
    let reconfigure = |preview| -> Result<ReconfigureRequest, ApiError> {
        let config = serde_json::from_str(&form.config)
            .map_err(|e| ApiError::bad_request("invalid_json", format!("config: not a JSON object of service → changes: {e}")))?;
        Ok(ReconfigureRequest { config, preview })
    };

    // First the confirmation, for what changes what runs.
    if !confirmed(&form.confirm) && matches!(op, Operation::Amend | Operation::Reconfigure | Operation::Delete) {
        let view = app.cluster(&key, &name).await.map_err(refused)?;
        let preview = match op {
            Operation::Amend => match amend(true) {
                Ok(req) => preview_of(app.amend_cluster(&key, &name, req, None, author).await).map(Some),
                Err(e) => Err(e),
            },
            Operation::Reconfigure => match reconfigure(true) {
                Ok(req) => preview_of(app.reconfigure_cluster(&key, &name, req, None, author).await).map(Some),
                Err(e) => Err(e),
            },
            _ => Ok(None),
        };
        let what = match op {
            Operation::Amend => format!("Amend cluster {name}"),
            Operation::Reconfigure => format!("Reconfigure cluster {name}"),
            _ => format!("Delete cluster {name}: every service is stopped and removed, in reverse dependency order"),
        };
        let hidden = [
            ("size", form.size.as_str()),
            ("add_services", form.add_services.as_str()),
            ("config", form.config.as_str()),
        ];
        return match preview {
            Ok(preview) => {
                // A delete has no preview: it acts on every task.
                let every: Vec<&TaskView> = view.tasks.iter().collect();
                let touched = preview.is_none().then_some(every.as_slice());
                Ok(confirm_page(&signed_in, &key, &what, &action, &hidden, Some(&view), preview.as_ref(), touched).into_response())
            }
            Err(e) => show(&app, &signed_in, &key, &name, Some(&e)).await,
        };
    }

    let tag = if_match(&form);
    let outcome: Result<(), ApiError> = match op {
        Operation::Amend => match amend(false) {
            Ok(req) => app
                .amend_cluster(&key, &name, req, tag, author)
                .await
                .map(drop)
                .map_err(ApiError::from),
            Err(e) => Err(e),
        },
        Operation::Reconfigure => match reconfigure(false) {
            Ok(req) => app
                .reconfigure_cluster(&key, &name, req, tag, author)
                .await
                .map(drop)
                .map_err(ApiError::from),
            Err(e) => Err(e),
        },
        Operation::Retry => app.retry_cluster(&key, &name, tag, author).await.map(drop).map_err(ApiError::from),
        Operation::Lease => match number::<u64>("lease_s", &form.lease_s) {
            Ok(Some(lease_s)) => app.extend_lease(&key, &name, lease_s, tag).await.map(drop).map_err(ApiError::from),
            Ok(None) => Err(invalid("lease_s", "give the lease in seconds".into())),
            Err(e) => Err(e),
        },
        Operation::Delete => app.delete_cluster(&key, &name, tag, author).await.map(drop).map_err(ApiError::from),
    };
    audit(&app, &signed_in, route, &path, Some(&key), outcome.as_ref().map(|_| ())).await;
    match outcome {
        Ok(()) => Ok(Redirect::to(&cluster_path(&key, &name)).into_response()),
        Err(e) => show(&app, &signed_in, &key, &name, Some(&e)).await,
    }
}

pub async fn service(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path((key, name, service, action)): Path<(String, String, String, ServiceAction)>,
    Form(form): Form<OperationForm>,
) -> Result<Response, PageError> {
    let route = (Method::POST, "/environments/{env}/clusters/{name}/services/{service}/{action}");
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), Some(&key)).await?;
    let verb = match action {
        ServiceAction::Stop => "stop",
        ServiceAction::Start => "start",
        ServiceAction::Restart => "restart",
    };
    let path = format!("/environments/{key}/clusters/{name}/services/{service}/{verb}");
    if !confirmed(&form.confirm) && action != ServiceAction::Start {
        let view = app.cluster(&key, &name).await.map_err(refused)?;
        let touched: Vec<&TaskView> = view.tasks.iter().filter(|t| t.service == service).collect();
        let nodes: BTreeSet<&str> = touched.iter().map(|t| t.node.as_str()).collect();
        let what = format!(
            "{} service {service} of cluster {name} on {}",
            if action == ServiceAction::Stop { "Stop" } else { "Restart" },
            nodes.into_iter().collect::<Vec<_>>().join(", ")
        );
        let action_path = format!("{}/services/{}/{verb}", cluster_path(&key, &name), path_segment(&service));
        return Ok(confirm_page(&signed_in, &key, &what, &action_path, &[], Some(&view), None, Some(&touched)).into_response());
    }
    let outcome = app
        .service_action(&key, &name, &service, action, if_match(&form), Some(&signed_in.principal.user))
        .await
        .map(drop)
        .map_err(ApiError::from);
    audit(&app, &signed_in, route, &path, Some(&key), outcome.as_ref().map(|_| ())).await;
    match outcome {
        Ok(()) => Ok(Redirect::to(&cluster_path(&key, &name)).into_response()),
        Err(e) => show(&app, &signed_in, &key, &name, Some(&e)).await,
    }
}

// Pages.

/// Counts in words beside a bar of their shares (`done`, `pending` and the resource statuses).
fn progress_bar(progress: &BTreeMap<String, usize>) -> Markup {
    let total: usize = progress.values().sum();
    let words = progress.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ");
    html! {
        @if total == 0 {
            span.counts { "no tasks" }
        } @else {
            div.bar role="img" aria-label=(words) {
                @for (key, n) in progress {
                    span class=(format!("s-{key}")) style=(format!("width:{:.2}%", *n as f64 * 100.0 / total as f64)) title=(format!("{key}: {n}")) {}
                }
            }
            span.counts.progress { (words) }
        }
    }
}

fn list_page(
    signed_in: &SignedIn,
    env: &str,
    clusters: &[ClusterView],
    templates: &[TemplateRecord],
    error: Option<(&CreateFields, &ApiError)>,
) -> Markup {
    let base = format!("/environments/{}", path_segment(env));
    let form = error.map(|(f, _)| f.clone()).unwrap_or_default();
    layout(
        &format!("Clusters of {env}"),
        Some(signed_in),
        html! {
            div data-live=(format!("{base}/live")) {}
            p { a href=(base) { "← " (env) } }
            h1 { "Clusters of " (env) }
            div data-part="clusters" {
                @if clusters.is_empty() {
                    p { "No cluster yet." }
                } @else {
                    table id="clusters" {
                        thead { tr { th { "Cluster" } th { "Status" } th { "Operation" } th { "Template" } th { "Nodes" } th { "Tasks" } } }
                        tbody {
                            @for c in clusters {
                                tr data-cluster=(c.name) {
                                    td { a href=(cluster_path(env, &c.name)) { (c.name) } }
                                    td.status { (c.status.as_str()) }
                                    td { (operation_name(c)) }
                                    td { (c.template) " v" (c.template_version) }
                                    td { (c.layout.0.len()) }
                                    td { (progress_bar(&c.progress)) }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Templates" }
            // A refused create, also when no template exists to show the form again with.
            @if let (Some((_, e)), true) = (error, templates.is_empty()) { (error_box(e)) }
            @if templates.is_empty() {
                p { "No template yet: submit one with " code { "POST /api/v1/environments/" (env) "/templates/{name}" } "." }
            } @else {
                table id="templates" {
                    thead { tr { th { "Template" } th { "Version" } th { "Services" } th { "Submitted" } } }
                    tbody {
                        @for t in templates {
                            tr {
                                td { (t.name) }
                                td { (t.version) }
                                td { (template_services(t)) }
                                td { (time(t.created_at)) }
                            }
                        }
                    }
                }
                h2 { "Create a cluster" }
                @if let Some((_, e)) = error { (error_box(e)) }
                form method="post" action=(format!("{base}/clusters")) {
                    input type="hidden" name="_csrf" value=(signed_in.csrf);
                    label { "Name " input type="text" name="name" id="cluster-name" required value=(form.name); }
                    label {
                        "Template "
                        select name="template" id="cluster-template" {
                            @for t in templates {
                                option value=(t.name) selected[form.template == t.name] { (t.name) }
                            }
                        }
                    }
                    label { "Nodes (the template's default when empty) " input type="number" min="1" name="size" id="cluster-size" value=(form.size); }
                    button type="submit" id="create-cluster" { "Show the layout…" }
                }
            }
        },
    )
}

/// A template's services, from its stored document.
fn template_services(t: &TemplateRecord) -> String {
    serde_json::from_str::<serde_json::Value>(&t.document)
        .ok()
        .and_then(|d| {
            d.get("services")
                .and_then(|s| s.as_object())
                .map(|s| s.keys().cloned().collect::<Vec<_>>())
        })
        .map(|names| names.join(", "))
        .unwrap_or_default()
}

fn operation_name(c: &ClusterView) -> String {
    serde_json::to_value(c.operation)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The services in a layout's columns: the cluster's own order first, then any other.
fn columns(layout: &Layout, services: &[String]) -> Vec<String> {
    let mut columns: Vec<String> = services.to_vec();
    for names in layout.0.values() {
        for s in names {
            if !columns.contains(s) {
                columns.push(s.clone());
            }
        }
    }
    columns
}

/// The layout as a grid: a row per node, a column per service; a cell says whether the node runs
/// the service and, when `tasks` are given, each of its tasks with its status (in words, the
/// colour only repeats them).
fn grid(id: &str, layout: &Layout, services: &[String], tasks: Option<&[TaskView]>, stopped: &BTreeSet<String>) -> Markup {
    let columns = columns(layout, services);
    html! {
        table.grid id=(id) {
            caption { "Nodes × services" }
            thead {
                tr {
                    th scope="col" { "Node" }
                    @for s in &columns {
                        th scope="col" { (s) @if stopped.contains(s) { " (stopped)" } }
                    }
                }
            }
            tbody {
                @for (node, runs) in &layout.0 {
                    tr data-node=(node) {
                        th scope="row" { (node) }
                        @for s in &columns {
                            @if runs.contains(s) {
                                td.runs data-service=(s) {
                                    span.cell-state { @if stopped.contains(s) { "stopped" } @else { "runs" } }
                                    @if let Some(tasks) = tasks {
                                        ul.tasks {
                                            @for t in tasks.iter().filter(|t| &t.node == node && &t.service == s) {
                                                li class=(format!("s-{}", t.status)) {
                                                    (t.step) ": " span.task-status { (t.status) }
                                                    @if t.purged { " (undo)" }
                                                }
                                            }
                                        }
                                    }
                                }
                            } @else {
                                td.absent data-service=(s) { span aria-label="not on this node" { "—" } }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn cluster_page(signed_in: &SignedIn, env: &str, c: &ClusterView, error: Option<&ApiError>) -> Markup {
    let base = format!("/environments/{}", path_segment(env));
    let here = cluster_path(env, &c.name);
    let busy = c.status.busy();
    layout(
        &format!("Cluster {}", c.name),
        Some(signed_in),
        html! {
            // Followed every second while an operation runs (the cluster's row changes without a
            // scheduler event), and on the environment's events otherwise (a task repaired).
            @if busy { div data-live="" data-poll="1000" {} } @else { div data-live=(format!("{base}/live")) {} }
            p { a href=(format!("{base}/clusters")) { "← clusters of " (env) } }
            h1 { "Cluster " (c.name) }
            div data-part="cluster" {
                p.summary {
                    "Status " strong #cluster-status { (c.status.as_str()) }
                    " · " (operation_name(c)) @if let Some(a) = &c.operation_author { " by " (a) } @else { " by the host" }
                    " · template " (c.template) " version " (c.template_version)
                    " · revision " span #cluster-revision { (c.revision) }
                    " · lease " @if let Some(t) = c.lease_expires_at { "ends " (time(t)) } @else { "none" }
                }
                div.summary { "Tasks " (progress_bar(&c.progress)) }
                @if let Some(f) = &c.failure {
                    div.error role="alert" id="cluster-failure" {
                        code { (f.code) } ": " (f.message)
                        @if let Some(task) = &f.task { " (" code { (task) } ")" }
                    }
                }
                h2 { "Layout" }
                (grid("layout", &c.layout, &c.services, Some(&c.tasks), &c.stopped))
                @if busy { p.notice { "An operation is under way: another one waits for it (a delete does not)." } }
            }
            h2 { "Operations" }
            @if let Some(e) = error { (error_box(e)) }
            div.cluster-operations {
                form method="post" action=(format!("{here}/amend")) {
                    fieldset {
                        legend { "Amend" }
                        input type="hidden" name="_csrf" value=(signed_in.csrf);
                        label { "Nodes " input type="number" min="1" name="size" id="amend-size" value=(c.size); }
                        label { "Services to add (separated by commas) " input type="text" name="add_services" id="amend-services"; }
                        button type="submit" id="amend" { "Show the new layout…" }
                    }
                }
                form method="post" action=(format!("{here}/reconfigure")) {
                    fieldset {
                        legend { "Reconfigure" }
                        input type="hidden" name="_csrf" value=(signed_in.csrf);
                        label for="reconfigure-config" { "Per service, the fields to change (a JSON merge patch)" }
                        textarea id="reconfigure-config" name="config" rows="4" cols="70" {
                            (serde_json::to_string_pretty(&c.config).unwrap_or_default())
                        }
                        button type="submit" id="reconfigure" { "Show the changes…" }
                    }
                }
                fieldset {
                    legend { "Services" }
                    table id="services" {
                        tbody {
                            @for s in &c.services {
                                tr data-service=(s) {
                                    th scope="row" { (s) }
                                    td { @if c.stopped.contains(s) { "stopped" } @else { "running" } }
                                    td {
                                        @for (verb, label) in [("stop", "Stop…"), ("start", "Start"), ("restart", "Restart…")] {
                                            form.inline method="post" action=(format!("{here}/services/{}/{verb}", path_segment(s))) {
                                                input type="hidden" name="_csrf" value=(signed_in.csrf);
                                                button type="submit" class=(verb) aria-label=(format!("{label} {s}")) { (label) }
                                            }
                                            " "
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                fieldset {
                    legend { "Lease and the rest" }
                    form.inline method="post" action=(format!("{here}/lease")) {
                        input type="hidden" name="_csrf" value=(signed_in.csrf);
                        label.inline { "Delete it after (seconds) " input type="number" min="1" name="lease_s" id="lease-s"; }
                        button type="submit" id="lease" { "Set the lease" }
                    }
                    " "
                    @if c.failure.is_some() {
                        form.inline method="post" action=(format!("{here}/retry")) {
                            input type="hidden" name="_csrf" value=(signed_in.csrf);
                            button type="submit" id="retry" { "Retry" }
                        }
                        " "
                    }
                    form.inline method="post" action=(format!("{here}/delete")) {
                        input type="hidden" name="_csrf" value=(signed_in.csrf);
                        button type="submit" id="delete" { "Delete…" }
                    }
                }
            }
            h2 { "Tasks" }
            div data-part="tasks" {
                table id="tasks" {
                    thead { tr { th { "Task" } th { "Status" } th { "Attempts" } th { "Last error" } } }
                    tbody {
                        @for t in &c.tasks {
                            tr {
                                td { a href=(format!("{base}/resource?id={}", path_segment(&t.id))) { code { (t.id) } } }
                                td { (t.status) }
                                td { (t.attempts) }
                                td { @if let Some(e) = &t.last_error { (e) } }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// What an operation would do, and the button that does it. `hidden`: the form's fields, sent
/// again with the confirmation; `view`: the cluster now (its revision becomes the `If-Match`);
/// `preview`: the API's preview (the new layout and the task changes); `touched`: the tasks a
/// stop, restart or delete acts on.
#[allow(clippy::too_many_arguments)]
fn confirm_page(
    signed_in: &SignedIn,
    env: &str,
    what: &str,
    action: &str,
    hidden: &[(&str, &str)],
    view: Option<&ClusterView>,
    preview: Option<&PlanPreview>,
    touched: Option<&[&TaskView]>,
) -> Markup {
    let back = match view {
        Some(c) => cluster_path(env, &c.name),
        None => format!("/environments/{}/clusters", path_segment(env)),
    };
    layout(
        "Confirm",
        Some(signed_in),
        html! {
            h1 { "Confirm" }
            p #confirm-what { (what) }
            @if let (Some(c), Some(p)) = (view, preview) {
                h2 { "Layout now" }
                (grid("layout-now", &c.layout, &c.services, None, &c.stopped))
                h2 { "Layout after" }
                (grid("layout-after", &p.layout, &c.services, None, &c.stopped))
            } @else if let Some(p) = preview {
                h2 { "Layout" }
                (grid("layout-after", &p.layout, &[], None, &BTreeSet::new()))
            }
            @if let Some(p) = preview {
                h2 { "Tasks" }
                p #confirm-summary { (p.tasks.len()) " to change, " (p.unchanged) " unchanged" }
                @if !p.tasks.is_empty() {
                    table id="planned" {
                        thead { tr { th { "Task" } th { "Change" } } }
                        tbody { @for t in &p.tasks { tr { td { code { (t.id) } } td { (t.change) } } } }
                    }
                }
            }
            @if let Some(tasks) = touched {
                h2 { "Tasks it acts on" }
                ul #touched { @for t in tasks { li { code { (t.id) } " (" (t.status) ")" } } }
            }
            form method="post" action=(action) {
                input type="hidden" name="_csrf" value=(signed_in.csrf);
                input type="hidden" name="confirm" value="yes";
                @if let Some(c) = view { input type="hidden" name="revision" value=(c.revision); }
                @for (name, value) in hidden { input type="hidden" name=(name) value=(value); }
                button type="submit" id="confirm" { "Confirm" }
                " "
                a href=(back) { "Cancel" }
            }
            @if let Some(c) = view {
                p.counts { "Confirming acts on the cluster as shown, revision " (c.revision) ": if it changes first, the operation is refused." }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_field_is_refused_by_name() {
        assert_eq!(number::<u32>("size", " 3 ").unwrap(), Some(3));
        assert_eq!(number::<u32>("size", "").unwrap(), None);
        let e = number::<u32>("size", "three").unwrap_err();
        assert_eq!(e.code, "invalid_cluster_request");
        assert!(e.message.starts_with("size: `three`"), "{}", e.message);
        assert!(number::<u32>("size", "-1").is_err());
    }

    #[test]
    fn the_grid_has_a_column_per_service_and_says_what_runs_in_words() {
        let layout = Layout(BTreeMap::from([
            ("n1".to_string(), BTreeSet::from(["base".to_string(), "db".to_string()])),
            ("n2".to_string(), BTreeSet::from(["base".to_string(), "<web>".to_string()])),
        ]));
        let tasks = vec![TaskView {
            id: "task[n1,c/db/start]".into(),
            node: "n1".into(),
            service: "db".into(),
            step: "start".into(),
            purged: false,
            status: "done".into(),
            attempts: 1,
            last_error: None,
            next_retry_at: None,
        }];
        let html = grid(
            "g",
            &layout,
            &["base".into(), "db".into()],
            Some(&tasks),
            &BTreeSet::from(["db".to_string()]),
        )
        .into_string();
        // Columns: the cluster's order, then the rest (escaped).
        let heads: Vec<_> = html.match_indices("scope=\"col\"").collect();
        assert_eq!(heads.len(), 4, "{html}");
        assert!(html.contains("&lt;web&gt;") && !html.contains("<web>"), "{html}");
        assert!(html.contains("start: <span class=\"task-status\">done</span>"), "{html}");
        assert!(html.contains("stopped"), "{html}");
        assert!(html.contains("not on this node"), "{html}");
    }
}

//! The console's deploy, repair and dryrun: buttons that start them (the same `App` calls and
//! rules as `POST /environments/{env}/deploy|repair|dryrun`), and pages that follow them live
//! until their outcome: an operation's result, a dryrun's report with each `would_change` as
//! before/after and each `unchecked` with why.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;

use super::extract::Path;
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::pages::{self, layout, path_segment, time};
use super::session::{Sessions, SignedIn};
use super::{AppState, PageError, audit, authorize, authorize_change, refused};
use crate::api::ApiError;
use crate::scheduler::dryrun::report::{DryrunResult, Finding};
use crate::store::{DryrunId, DryrunReport, DryrunStatus, Environment, Operation, OperationId, OperationKind, OperationStatus};

/// What an environment's button starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    Deploy,
    Repair,
    Dryrun,
}

pub(super) async fn start(
    app: &crate::app::App,
    sessions: &Sessions,
    headers: &HeaderMap,
    key: &str,
    csrf: Option<&str>,
    kind: Start,
) -> Result<Response, PageError> {
    let (api_route, segment) = match kind {
        Start::Deploy => ("/environments/{env}/deploy", "deploy"),
        Start::Repair => ("/environments/{env}/repair", "repair"),
        Start::Dryrun => ("/environments/{env}/dryrun", "dryrun"),
    };
    let route = (Method::POST, api_route);
    let signed_in = authorize_change(app, sessions, headers, csrf, route.clone(), Some(key)).await?;
    let author = Some(signed_in.principal.user.as_str());
    let base = format!("/environments/{}", path_segment(key));
    let started = match kind {
        Start::Deploy | Start::Repair => {
            let op = if kind == Start::Deploy {
                OperationKind::Deploy
            } else {
                OperationKind::Repair
            };
            app.start_operation(key, op, author)
                .await
                .map(|o| format!("{base}/operations/{}", o.id))
        }
        Start::Dryrun => app
            .start_dryrun(key, None, author)
            .await
            .map(|d| format!("{base}/dryruns/{}", d.id)),
    };
    let path = format!("/environments/{key}/{segment}");
    match started {
        Ok(location) => {
            audit(app, &signed_in, route, &path, Some(key), Ok(())).await;
            Ok(Redirect::to(&location).into_response())
        }
        Err(e) => {
            let e = ApiError::from(e);
            audit(app, &signed_in, route, &path, Some(key), Err(&e)).await;
            Ok((e.status, pages::error(&e)).into_response())
        }
    }
}

fn bad_id(what: &str, id: &str) -> PageError {
    refused(ApiError::bad_request(
        "invalid_path",
        format!("`{}` is not {what} id", id.chars().take(100).collect::<String>()),
    ))
}

pub async fn operation(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path((key, id)): Path<(String, String)>,
) -> Result<Markup, PageError> {
    let signed_in = authorize(
        &app,
        &sessions,
        &headers,
        Method::GET,
        "/environments/{env}/operations/{id}",
        Some(&key),
    )
    .await?;
    let id: OperationId = id.parse().map_err(|_| bad_id("an operation", &id))?;
    let env = app.get(&key).await.map_err(refused)?;
    let op = app.operation(&env, &id).await.map_err(refused)?;
    Ok(operation_page(&signed_in, &env, &op))
}

pub async fn dryrun_report(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path((key, id)): Path<(String, String)>,
) -> Result<Markup, PageError> {
    let signed_in = authorize(
        &app,
        &sessions,
        &headers,
        Method::GET,
        "/environments/{env}/dryruns/{id}",
        Some(&key),
    )
    .await?;
    let id: DryrunId = id.parse().map_err(|_| bad_id("a dryrun", &id))?;
    let env = app.get(&key).await.map_err(refused)?;
    let report = app.dryrun(&env, &id).await.map_err(refused)?;
    Ok(dryrun_page(&signed_in, &env, &report))
}

/// While it runs, the page looks again every second (its outcome is recorded once the
/// scheduler has settled, after the last event).
fn live(running: bool) -> Markup {
    html! {
        @if running { div data-live="" data-poll="1000" {} }
    }
}

fn operation_page(signed_in: &SignedIn, env: &Environment, op: &Operation) -> Markup {
    let base = format!("/environments/{}", path_segment(&env.name));
    let running = op.status == OperationStatus::Running;
    layout(
        &format!("{} of {}", op.kind.as_str(), env.name),
        Some(signed_in),
        html! {
            (live(running))
            p { a href=(base) { "← " (env.name) } }
            h1 { (op.kind.as_str()) " of " (env.name) }
            div data-part="operation" {
                p { "Started " (time(op.created_at)) @if let Some(a) = &op.author { " by " (a) } }
                p { "Status: " strong id="operation-status" { (op.status.as_str()) }
                    @if let Some(t) = op.finished_at { " at " (time(t)) } }
                @if let Some(result) = &op.result {
                    h2 { "Outcome" }
                    pre id="operation-result" { (pages::pretty(result)) }
                }
            }
        },
    )
}

fn dryrun_page(signed_in: &SignedIn, env: &Environment, report: &DryrunReport) -> Markup {
    let base = format!("/environments/{}", path_segment(&env.name));
    let running = report.status == DryrunStatus::Running;
    let result: Option<DryrunResult> = report.report.as_deref().and_then(|r| serde_json::from_str(r).ok());
    layout(
        &format!("dryrun of {}", env.name),
        Some(signed_in),
        html! {
            (live(running))
            p { a href=(base) { "← " (env.name) } }
            h1 { "Dryrun of " (env.name) ", version " (report.version) }
            div data-part="dryrun" {
                p { "Status: " strong id="dryrun-status" { (report.status.as_str()) } }
                @if let Some(result) = &result {
                    p id="dryrun-summary" {
                        (result.summary.would_change) " would change, " (result.summary.unchecked) " unchecked, "
                        (result.summary.no_change) " no change"
                    }
                    table id="findings" {
                        thead { tr { th { "Resource" } th { "Finding" } th { "Details" } } }
                        tbody {
                            @for f in result.resources.iter().filter(|f| f.finding != Finding::NoChange) {
                                tr {
                                    td { code { (f.resource) } }
                                    td { (finding(f.finding)) }
                                    td {
                                        @if let Some(reason) = &f.reason {
                                            code { (reason.code) } ": " (reason.message)
                                        }
                                        @if !f.changes.is_empty() {
                                            (pages::changes_of(&f.changes))
                                        }
                                    }
                                }
                            }
                        }
                    }
                } @else if let Some(text) = &report.report {
                    pre { (text) }
                }
            }
        },
    )
}

fn finding(f: Finding) -> &'static str {
    match f {
        Finding::NoChange => "no change",
        Finding::WouldChange => "would change",
        Finding::Unchecked => "unchecked",
    }
}

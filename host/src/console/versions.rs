//! The console's versions: the list, the diff of any two, release, rollback, and a new intent
//! pasted or uploaded — each through the same `App` call, and under the same rule, as its API
//! route under `/environments/{env}/intents`.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Multipart, State};

use super::extract::{Form, Path, Query};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::pages::{self, error_box, layout, path_segment, time};
use super::session::{Sessions, SignedIn};
use super::{AppState, CsrfForm, PageError, audit, authorize, authorize_change, refused};
use crate::api::ApiError;
use crate::intent::diff::IntentDiff;
use crate::store::{Environment, VersionInfo};

/// The most bytes an intent pasted or uploaded may have (the host's body limit applies too).
const MAX_INTENT_BYTES: usize = 64 << 20;

pub async fn versions(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Markup, PageError> {
    let signed_in = authorize(&app, &sessions, &headers, Method::GET, "/environments/{env}/intents", Some(&key)).await?;
    page(&app, &signed_in, &key, None).await
}

async fn page(app: &crate::app::App, signed_in: &SignedIn, key: &str, error: Option<(&str, &ApiError)>) -> Result<Markup, PageError> {
    let env = app.get(key).await.map_err(refused)?;
    let list = app.versions(&env).await.map_err(refused)?;
    Ok(versions_page(signed_in, &env, &list, error))
}

/// An intent from the form: the file uploaded, else the text pasted.
pub async fn submit(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    mut form: Multipart,
) -> Result<Response, PageError> {
    let (mut csrf, mut text, mut file) = (None, String::new(), Vec::new());
    while let Some(field) = form
        .next_field()
        .await
        .map_err(|e| refused(ApiError::bad_request("invalid_form", e.body_text())))?
    {
        let name = field.name().unwrap_or_default().to_string();
        let bytes = field
            .bytes()
            .await
            .map_err(|e| refused(ApiError::bad_request("invalid_form", e.body_text())))?;
        if bytes.len() > MAX_INTENT_BYTES {
            return Err(refused(ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("`{name}` is over {MAX_INTENT_BYTES} bytes"),
            )));
        }
        match name.as_str() {
            "_csrf" => csrf = Some(String::from_utf8_lossy(&bytes).into_owned()),
            "intent" => text = String::from_utf8_lossy(&bytes).into_owned(),
            "file" => file = bytes.to_vec(),
            _ => {}
        }
    }
    let route = (Method::POST, "/environments/{env}/intents");
    let signed_in = authorize_change(&app, &sessions, &headers, csrf.as_deref(), route.clone(), Some(&key)).await?;
    let body = if file.is_empty() { text.clone().into_bytes() } else { file };
    // The environment's own body limit, as the API's layer applies it.
    if let Some(limit) = app.body_limit(&key).await
        && body.len() as u64 > limit
    {
        return Err(refused(crate::api::auth::too_large_for(&key, limit)));
    }
    let path = format!("/environments/{key}/versions");
    match app.submit(&key, &body, Some(&signed_in.principal.user)).await {
        Ok(_) => {
            audit(&app, &signed_in, route, &path, Some(&key), Ok(())).await;
            Ok(Redirect::to(&format!("/environments/{}/versions", path_segment(&key))).into_response())
        }
        Err(e) => {
            let e = ApiError::from(e);
            audit(&app, &signed_in, route, &path, Some(&key), Err(&e)).await;
            let page = page(&app, &signed_in, &key, Some((&text, &e))).await?;
            Ok((e.status, page).into_response())
        }
    }
}

/// What a version's button does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Switch {
    Release,
    Rollback,
}

/// Releases a version, or rolls back to it.
pub async fn switch(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path((key, version, switch)): Path<(String, i64, Switch)>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, PageError> {
    let route = match switch {
        Switch::Release => (Method::POST, "/environments/{env}/intents/{version}/release"),
        Switch::Rollback => (Method::POST, "/environments/{env}/intents/{version}/rollback"),
    };
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), Some(&key)).await?;
    let author = Some(signed_in.principal.user.as_str());
    let outcome = match switch {
        Switch::Release => app.release(&key, version, author).await.map(drop),
        Switch::Rollback => app.rollback(&key, version, author).await.map(drop),
    };
    finish(&app, &signed_in, route, &key, outcome.map_err(ApiError::from)).await
}

/// After a release or rollback: back to the versions, or the refusal in words.
async fn finish(
    app: &crate::app::App,
    signed_in: &SignedIn,
    route: (Method, &str),
    key: &str,
    outcome: Result<(), ApiError>,
) -> Result<Response, PageError> {
    let path = format!("/environments/{key}/versions");
    audit(app, signed_in, route, &path, Some(key), outcome.as_ref().map(|_| ())).await;
    match outcome {
        Ok(()) => Ok(Redirect::to(&format!("/environments/{}/versions", path_segment(key))).into_response()),
        Err(e) => Ok((e.status, pages::error(&e)).into_response()),
    }
}

#[derive(Deserialize)]
pub struct DiffQuery {
    from: i64,
    to: i64,
}

pub async fn diff(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Query(q): Query<DiffQuery>,
) -> Result<Markup, PageError> {
    let signed_in = authorize(
        &app,
        &sessions,
        &headers,
        Method::GET,
        "/environments/{env}/intents/{version}/diff/{other}",
        Some(&key),
    )
    .await?;
    let env = app.get(&key).await.map_err(refused)?;
    let diff = app.diff(&key, q.from, q.to).await.map_err(refused)?;
    Ok(diff_page(&signed_in, &env, &diff))
}

fn versions_page(signed_in: &SignedIn, env: &Environment, list: &[VersionInfo], error: Option<(&str, &ApiError)>) -> Markup {
    let base = format!("/environments/{}", path_segment(&env.name));
    let newest = list.first().map_or(0, |v| v.version);
    layout(
        &format!("{} versions", env.name),
        Some(signed_in),
        html! {
            p { a href=(base) { "← " (env.name) } }
            h1 { "Versions of " (env.name) }
            @if list.is_empty() {
                p { "No version yet." }
            } @else {
                form.filters method="get" action=(format!("{base}/versions/diff")) {
                    label { "Compare version " input type="number" name="from" min="1" required value=(newest.saturating_sub(1).max(1)); }
                    label { "with " input type="number" name="to" min="1" required value=(newest); }
                    button type="submit" id="diff" { "Show the differences" }
                }
                table id="versions" {
                    thead { tr { th { "Version" } th { "Created" } th { "Last released" } th { "By" } th { "Released now" } th { "Actions" } } }
                    tbody {
                        @for v in list {
                            tr data-version=(v.version) {
                                td { (v.version) }
                                td { (time(v.created_at)) }
                                td { @if let Some(t) = v.released_at { (time(t)) } @else { "never" } }
                                td { @if let Some(a) = &v.author { (a) } @else { "the host" } }
                                td { @if v.active { strong { "released" } } @else { "no" } }
                                td {
                                    @if !v.active {
                                        @if v.released_at.is_none() {
                                            form.inline method="post" action=(format!("{base}/versions/{}/release", v.version)) {
                                                input type="hidden" name="_csrf" value=(signed_in.csrf);
                                                button type="submit" class="release" { "Release" }
                                            }
                                        } @else {
                                            form.inline method="post" action=(format!("{base}/versions/{}/rollback", v.version))
                                                data-confirm=(format!("Roll back to version {}? It becomes a new version, released at once.", v.version)) {
                                                input type="hidden" name="_csrf" value=(signed_in.csrf);
                                                button type="submit" class="rollback" { "Roll back to this" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Submit a new intent" }
            @if let Some((_, e)) = error { (error_box(e)) }
            form method="post" action=(format!("{base}/versions")) enctype="multipart/form-data" {
                input type="hidden" name="_csrf" value=(signed_in.csrf);
                label for="intent" { "Intent JSON (" code { "{\"resources\": [...]}" } "), pasted" }
                textarea id="intent" name="intent" rows="12" cols="100" aria-invalid=[error.map(|_| "true")]
                    aria-describedby=[error.map(|_| "intent-error")] {
                    (error.map(|(text, _)| text).unwrap_or_default())
                }
                @if let Some((_, e)) = error {
                    p id="intent-error" { "Refused: " code { (e.code) } " — " (e.message) }
                }
                label { "or a file " input type="file" name="file" id="intent-file" accept="application/json,.json"; }
                button type="submit" id="submit-intent" { "Submit" }
            }
        },
    )
}

fn diff_page(signed_in: &SignedIn, env: &Environment, diff: &IntentDiff) -> Markup {
    let base = format!("/environments/{}", path_segment(&env.name));
    layout(
        &format!("{} v{} → v{}", env.name, diff.from, diff.to),
        Some(signed_in),
        html! {
            p { a href=(format!("{base}/versions")) { "← versions of " (env.name) } }
            h1 { "Version " (diff.from) " → " (diff.to) }
            p id="diff-summary" {
                (diff.added.len()) " added, " (diff.removed.len()) " removed, " (diff.changed.len()) " changed, "
                (diff.unchanged) " unchanged"
            }
            @if !diff.added.is_empty() {
                h2 { "Added" }
                ul id="added" { @for r in &diff.added { li { code { "+ " (r) } } } }
            }
            @if !diff.removed.is_empty() {
                h2 { "Removed" }
                ul id="removed" { @for r in &diff.removed { li { code { "− " (r) } } } }
            }
            @if !diff.changed.is_empty() {
                h2 { "Changed" }
                table id="changed" {
                    thead { tr { th { "Resource" } th { "Field" } th { "In " (diff.from) } th { "In " (diff.to) } } }
                    tbody {
                        @for r in &diff.changed {
                            @for (i, f) in r.fields.iter().enumerate() {
                                tr {
                                    td { @if i == 0 { code { (r.resource) } } }
                                    td { code { (f.field) } }
                                    td.diff-before { (pages::shown(f.from.as_ref())) }
                                    td.diff-after { (pages::shown(f.to.as_ref())) }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

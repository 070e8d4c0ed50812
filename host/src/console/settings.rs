//! The console's environment settings: the settings as JSON, changed by a JSON merge patch with
//! the settings' ETag (a change made meanwhile is refused, not overwritten), and halt or resume —
//! the same `App` calls and rules as `PATCH /environments/{env}` and `POST …/halt|resume`.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;

use super::extract::{Form, Path};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::pages::{self, error_box, layout, path_segment};
use super::session::{Sessions, SignedIn};
use super::{AppState, PageError, audit, authorize, authorize_change, refused};
use crate::api::ApiError;
use crate::app::settings_tag;
use crate::store::Environment;

pub async fn settings(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Markup, PageError> {
    let signed_in = authorize(&app, &sessions, &headers, Method::GET, "/environments/{env}", Some(&key)).await?;
    let env = app.get(&key).await.map_err(refused)?;
    Ok(page(&signed_in, &env, None))
}

#[derive(Deserialize)]
pub struct PatchForm {
    #[serde(rename = "_csrf")]
    csrf: Option<String>,
    /// The settings' ETag when the form was shown.
    #[serde(default)]
    tag: String,
    #[serde(default)]
    patch: String,
}

pub async fn change(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Form(form): Form<PatchForm>,
) -> Result<Response, PageError> {
    let route = (Method::PATCH, "/environments/{env}");
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), Some(&key)).await?;
    let path = format!("/environments/{key}/settings");
    let outcome = match serde_json::from_str::<serde_json::Value>(&form.patch) {
        Err(e) => Err(ApiError::bad_request("invalid_json", format!("the change is not JSON: {e}"))),
        Ok(patch) => {
            let tag = Some(form.tag.as_str()).filter(|t| !t.is_empty());
            app.update_settings(&key, patch, tag).await.map(drop).map_err(ApiError::from)
        }
    };
    audit(&app, &signed_in, route, &path, Some(&key), outcome.as_ref().map(|_| ())).await;
    match outcome {
        Ok(()) => Ok(Redirect::to(&format!("/environments/{}/settings", path_segment(&key))).into_response()),
        Err(e) => {
            let env = app.get(&key).await.map_err(refused)?;
            Ok((e.status, page(&signed_in, &env, Some((&form.patch, &e)))).into_response())
        }
    }
}

pub(super) async fn halt_or_resume(
    app: &crate::app::App,
    sessions: &Sessions,
    headers: &HeaderMap,
    key: &str,
    csrf: Option<&str>,
    halt: bool,
) -> Result<Response, PageError> {
    let route = (
        Method::POST,
        if halt {
            "/environments/{env}/halt"
        } else {
            "/environments/{env}/resume"
        },
    );
    let signed_in = authorize_change(app, sessions, headers, csrf, route.clone(), Some(key)).await?;
    let outcome = app.set_halted(key, halt).await.map(drop).map_err(ApiError::from);
    let path = format!("/environments/{key}/{}", if halt { "halt" } else { "resume" });
    audit(app, &signed_in, route, &path, Some(key), outcome.as_ref().map(|_| ())).await;
    match outcome {
        Ok(()) => Ok(Redirect::to(&format!("/environments/{}/settings", path_segment(key))).into_response()),
        Err(e) => Ok((e.status, pages::error(&e)).into_response()),
    }
}

fn page(signed_in: &SignedIn, env: &Environment, error: Option<(&str, &ApiError)>) -> Markup {
    let base = format!("/environments/{}", path_segment(&env.name));
    let current = serde_json::to_string_pretty(&env.settings).unwrap_or_default();
    layout(
        &format!("{} settings", env.name),
        Some(signed_in),
        html! {
            p { a href=(base) { "← " (env.name) } }
            h1 { "Settings of " (env.name) }
            p {
                "The scheduler is " strong id="halted" { @if env.halted { "halted" } @else { "running" } } ". "
                @if env.halted {
                    form.inline method="post" action=(format!("{base}/resume")) {
                        input type="hidden" name="_csrf" value=(signed_in.csrf);
                        button type="submit" id="resume" { "Resume" }
                    }
                } @else {
                    form.inline method="post" action=(format!("{base}/halt")) {
                        input type="hidden" name="_csrf" value=(signed_in.csrf);
                        button type="submit" id="halt" title="Nothing new starts; actions in flight finish" { "Halt" }
                    }
                }
            }
            h2 { "Current settings" }
            pre id="settings" { (current) }
            h2 { "Change" }
            @if let Some((_, e)) = error { (error_box(e)) }
            form method="post" action=(format!("{base}/settings")) {
                input type="hidden" name="_csrf" value=(signed_in.csrf);
                input type="hidden" name="tag" value=(settings_tag(&env.settings));
                label for="patch" { "Only the fields to change, as JSON (a merge patch: " code { "null" } " restores a default)" }
                textarea id="patch" name="patch" rows="6" cols="80" aria-invalid=[error.map(|_| "true")] {
                    (error.map(|(text, _)| text).unwrap_or("{\"repair_interval_s\": 600}"))
                }
                button type="submit" id="change-settings" { "Change" }
            }
        },
    )
}

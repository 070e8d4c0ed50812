//! The console's tokens (list, create — the secret shown once —, revoke) and plugins (what the
//! registry holds: names, versions, digests, kinds, the capabilities each asks for), through the
//! same `App` calls and rules as `/tokens` and the registry's index.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;

use super::extract::{Form, Path};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::pages::{self, layout, time};
use super::session::{Sessions, SignedIn};
use super::{AppState, CsrfForm, PageError, audit, authorize, authorize_change, refused};
use crate::api::ApiError;
use crate::app::TokenView;
use crate::store::TokenId;

pub async fn tokens(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
) -> Result<Markup, PageError> {
    let signed_in = authorize(&app, &sessions, &headers, Method::GET, "/tokens", None).await?;
    let list = app.tokens(&signed_in.principal).await.map_err(refused)?;
    Ok(tokens_page(&signed_in, &list, None))
}

#[derive(Deserialize)]
pub struct NewTokenForm {
    #[serde(rename = "_csrf")]
    csrf: Option<String>,
    #[serde(default)]
    description: String,
}

pub async fn create_token(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Form(form): Form<NewTokenForm>,
) -> Result<Response, PageError> {
    let route = (Method::POST, "/tokens");
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), None).await?;
    let created = app
        .create_own_token(&signed_in.principal, None, form.description.trim())
        .await
        .map_err(ApiError::from);
    audit(&app, &signed_in, route, "/tokens", None, created.as_ref().map(|_| ())).await;
    let list = app.tokens(&signed_in.principal).await.map_err(refused)?;
    match created {
        // The secret is in this answer only; the store keeps its hash.
        Ok((view, secret)) => Ok((StatusCode::CREATED, tokens_page(&signed_in, &list, Some(Ok((&view, &secret))))).into_response()),
        Err(e) => Ok((e.status, tokens_page(&signed_in, &list, Some(Err(&e)))).into_response()),
    }
}

pub async fn revoke_token(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, PageError> {
    let route = (Method::DELETE, "/tokens/{id}");
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), None).await?;
    let outcome = match id.parse::<TokenId>() {
        Ok(id) => app.delete_token(&signed_in.principal, &id).await.map_err(ApiError::from),
        Err(_) => Err(ApiError::bad_request(
            "invalid_path",
            format!("`{}` is not a token id", id.chars().take(100).collect::<String>()),
        )),
    };
    audit(
        &app,
        &signed_in,
        route,
        &format!("/tokens/{id}"),
        None,
        outcome.as_ref().map(|_| ()),
    )
    .await;
    match outcome {
        Ok(()) => Ok(Redirect::to("/tokens").into_response()),
        Err(e) => Ok((e.status, pages::error(&e)).into_response()),
    }
}

fn tokens_page(signed_in: &SignedIn, list: &[TokenView], created: Option<Result<(&TokenView, &str), &ApiError>>) -> Markup {
    layout(
        "Tokens",
        Some(signed_in),
        html! {
            h1 { "Tokens" }
            @match created {
                Some(Ok((view, secret))) => {
                    div.notice role="status" {
                        "Token " code { (view.record.id) } " created. Copy it now: it is not shown again."
                        pre id="new-token" { (secret) }
                    }
                }
                Some(Err(e)) => { (pages::error_box(e)) }
                None => {}
            }
            table id="tokens" {
                thead { tr { th { "Id" } th { "User" } th { "Description" } th { "Scope" } th { "Created" } th { "" } } }
                tbody {
                    @for t in list {
                        tr data-token=(t.record.id) {
                            td { code { (t.record.id) } @if t.record.id == signed_in.principal.token_id { " (this session's)" } }
                            td { (t.record.user) }
                            td { (t.record.description) }
                            td { @if let Some(envs) = &t.environments {
                                @for (i, (env, role)) in envs.iter().enumerate() { @if i > 0 { ", " } (env) ": " (role.to_string()) }
                                @if envs.is_empty() { "narrowed" }
                            } @else { "the user's roles" } }
                            td { (time(t.record.created_at)) }
                            td {
                                form.inline method="post" action=(format!("/tokens/{}/revoke", t.record.id))
                                    data-confirm="Revoke this token? Whatever uses it stops working at once." {
                                    input type="hidden" name="_csrf" value=(signed_in.csrf);
                                    button type="submit" class="revoke" { "Revoke" }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Create a token" }
            form method="post" action="/tokens" {
                input type="hidden" name="_csrf" value=(signed_in.csrf);
                label { "Description " input type="text" name="description" id="token-description" maxlength="200"; }
                button type="submit" id="create-token" { "Create" }
            }
        },
    )
}

pub async fn plugins(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
) -> Result<Markup, PageError> {
    // The registry's index is open to read; the console's pages need a session all the same.
    let signed_in = authorize(&app, &sessions, &headers, Method::GET, "/me", None).await?;
    let list = app.plugins().await.map_err(refused)?;
    Ok(layout(
        "Plugins",
        Some(&signed_in),
        html! {
            h1 { "Plugins" }
            p { "What the registry holds. Intents and templates name a plugin as " code { "name@version" } " and are pinned to its digest." }
            table id="plugins" {
                thead { tr { th { "Plugin" } th { "Kind" } th { "Capabilities it asks for" } th { "Resource types" } th { "Digest" } th { "Published" } } }
                tbody {
                    @for p in &list {
                        tr {
                            td { strong { (p.name) } "@" (p.version) @if !p.description.is_empty() { br; span.counts { (p.description) } } }
                            td { (p.kind.to_string()) }
                            td { @if p.capabilities.is_empty() { "none" } @else {
                                @for (i, c) in p.capabilities.iter().enumerate() { @if i > 0 { ", " } code { (c.to_string()) } }
                            } }
                            td { (p.resource_types.join(", ")) }
                            td { code.digest { (p.digest.to_string()) } }
                            td { (p.published_at.date().to_string()) }
                        }
                    }
                }
            }
        },
    ))
}

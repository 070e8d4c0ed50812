//! The console's nodes: the list (status, facts, pinned host key), register one (its credential
//! is never shown again, not even when the registration is refused), verify now, and accept a
//! changed host key after seeing both fingerprints — the same `App` calls and rules as the API's
//! `/nodes` routes.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::extract::State;

use super::extract::{Form, Path};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::pages::{self, error_box, layout, path_segment, time};
use super::session::{Sessions, SignedIn};
use super::{AppState, CsrfForm, PageError, audit, authorize, authorize_change, refused};
use crate::api::ApiError;
use crate::nodes::Registration;
use crate::store::{NodeRecord, NodeStatus};

pub async fn nodes(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
) -> Result<Markup, PageError> {
    let signed_in = authorize(&app, &sessions, &headers, Method::GET, "/nodes", None).await?;
    page(&app, &signed_in, None).await
}

async fn page(app: &crate::app::App, signed_in: &SignedIn, error: Option<(&NodeForm, &ApiError)>) -> Result<Markup, PageError> {
    let list = app.list_nodes().await.map_err(refused)?;
    Ok(nodes_page(signed_in, &list, error))
}

/// A registration as the form sends it. `Debug` is not derived: it holds a secret.
#[derive(Deserialize, Default)]
pub struct NodeForm {
    #[serde(rename = "_csrf")]
    csrf: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    address: String,
    #[serde(default)]
    port: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    private_key: String,
    #[serde(default)]
    passphrase: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    host_key: String,
    /// `key=value` pairs, separated by commas.
    #[serde(default)]
    labels: String,
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(axum::http::StatusCode::UNPROCESSABLE_ENTITY, "invalid_node", message)
}

impl NodeForm {
    fn registration(&self, author: &str) -> Result<Registration, ApiError> {
        let port = match self.port.trim() {
            "" => 22,
            p => p.parse::<u32>().map_err(|_| invalid(format!("port: `{p}` is not a number")))?,
        };
        let credential = match (self.private_key.trim(), self.password.as_str()) {
            (key, "") if !key.is_empty() => orc_ssh::Credential::PrivateKey {
                pem: key.to_string(),
                passphrase: Some(self.passphrase.clone()).filter(|p| !p.is_empty()),
            },
            ("", password) if !password.is_empty() => orc_ssh::Credential::Password(password.to_string()),
            _ => {
                return Err(ApiError::new(
                    axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_credential",
                    "give a private key or a password (not both)",
                ));
            }
        };
        let mut labels = BTreeMap::new();
        for pair in self.labels.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| invalid(format!("labels: `{pair}` is not `key=value`")))?;
            labels.insert(k.trim().to_string(), v.trim().to_string());
        }
        Ok(Registration {
            name: self.name.trim().to_string(),
            address: self.address.trim().to_string(),
            port,
            user: self.user.trim().to_string(),
            credential,
            host_key: Some(self.host_key.trim().to_string()).filter(|k| !k.is_empty()),
            labels,
            environment: None,
            author: Some(author.to_string()),
        })
    }
}

pub async fn register(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Form(form): Form<NodeForm>,
) -> Result<Response, PageError> {
    let route = (Method::POST, "/nodes");
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), None).await?;
    let outcome = match form.registration(&signed_in.principal.user) {
        Ok(registration) => app.register_node(registration).await.map(drop).map_err(ApiError::from),
        Err(e) => Err(e),
    };
    audit(&app, &signed_in, route, "/nodes", None, outcome.as_ref().map(|_| ())).await;
    match outcome {
        Ok(()) => Ok(Redirect::to("/nodes").into_response()),
        Err(e) => {
            let page = page(&app, &signed_in, Some((&form, &e))).await?;
            Ok((e.status, page).into_response())
        }
    }
}

pub async fn verify(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(node): Path<String>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, PageError> {
    let route = (Method::POST, "/nodes/{node}/verify");
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), None).await?;
    let outcome = app.verify_node(&node).await.map(drop).map_err(ApiError::from);
    finish(&app, &signed_in, route, &format!("/nodes/{node}/verify"), outcome).await
}

#[derive(Deserialize)]
pub struct AcceptForm {
    #[serde(rename = "_csrf")]
    csrf: Option<String>,
    #[serde(default)]
    fingerprint: String,
}

pub async fn accept_host_key(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(node): Path<String>,
    Form(form): Form<AcceptForm>,
) -> Result<Response, PageError> {
    let route = (Method::POST, "/nodes/{node}/accept-host-key");
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), None).await?;
    let outcome = app
        .accept_host_key(&node, &form.fingerprint)
        .await
        .map(drop)
        .map_err(ApiError::from);
    finish(&app, &signed_in, route, &format!("/nodes/{node}/accept-host-key"), outcome).await
}

async fn finish(
    app: &crate::app::App,
    signed_in: &SignedIn,
    route: (Method, &str),
    path: &str,
    outcome: Result<(), ApiError>,
) -> Result<Response, PageError> {
    audit(app, signed_in, route, path, None, outcome.as_ref().map(|_| ())).await;
    match outcome {
        Ok(()) => Ok(Redirect::to("/nodes").into_response()),
        Err(e) => Ok((e.status, pages::error(&e)).into_response()),
    }
}

fn status_text(status: NodeStatus) -> &'static str {
    match status {
        NodeStatus::HostKeyChanged => "host key changed",
        NodeStatus::AuthFailed => "authentication failed",
        other => other.as_str(),
    }
}

fn nodes_page(signed_in: &SignedIn, list: &[NodeRecord], error: Option<(&NodeForm, &ApiError)>) -> Markup {
    let kept = error.map(|(form, _)| form);
    let value = |f: fn(&NodeForm) -> &str| kept.map(f).unwrap_or_default().to_string();
    layout(
        "Nodes",
        Some(signed_in),
        html! {
            h1 { "Nodes" }
            // Followed while a verification may be under way.
            @if list.iter().any(|n| n.status == NodeStatus::Unidentified) { div data-live="" data-poll="1000" {} }
            div data-part="nodes" {
            @if list.is_empty() {
                p { "No node registered." }
            } @else {
                table id="nodes" {
                    thead { tr { th { "Name" } th { "Address" } th { "Status" } th { "Host key" } th { "Facts" } th { "Actions" } } }
                    tbody {
                        @for n in list {
                            tr data-node=(n.name) {
                                td { (n.name)
                                    @if !n.labels.is_empty() { br; span.counts { @for (i, (k, v)) in n.labels.iter().enumerate() { @if i > 0 { ", " } (k) "=" (v) } } }
                                    br; span.counts { @if let Some(e) = &n.environment_name { "private to " (e) } @else { "public" } }
                                }
                                td { (n.user) "@" (n.address) ":" (n.port) br; span.counts { "credential: " (n.credential.as_str()) } }
                                td.status {
                                    (status_text(n.status))
                                    @if let Some(t) = n.verified_at { br; span.counts { "verified " (time(t)) } }
                                    @if let Some(e) = &n.last_error { br; span.counts { (e) } }
                                }
                                td {
                                    "pinned: " code.pinned { @if let Some(k) = &n.host_key { (k) } @else { "none yet" } }
                                    @if let Some(presented) = &n.presented_host_key {
                                        div.error role="alert" {
                                            "The node now presents " code.presented { (presented) } ". Accept it only if you know why it changed."
                                            form method="post" action=(format!("/nodes/{}/accept-host-key", path_segment(&n.name))) {
                                                input type="hidden" name="_csrf" value=(signed_in.csrf);
                                                input type="hidden" name="fingerprint" value=(presented);
                                                button type="submit" class="accept-key" { "Accept the new key" }
                                            }
                                        }
                                    }
                                }
                                td { @if let Some(facts) = &n.facts { details { summary { "facts" } pre { (pages::pretty(&facts.to_string())) } } } }
                                td {
                                    form.inline method="post" action=(format!("/nodes/{}/verify", path_segment(&n.name))) {
                                        input type="hidden" name="_csrf" value=(signed_in.csrf);
                                        button type="submit" class="verify" { "Verify now" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            }
            h2 { "Register a node" }
            @if let Some((_, e)) = error { (error_box(e)) }
            form method="post" action="/nodes" id="register" {
                input type="hidden" name="_csrf" value=(signed_in.csrf);
                label { "Name " input type="text" name="name" required value=(value(|f| &f.name)); }
                label { "Address " input type="text" name="address" required value=(value(|f| &f.address)); }
                label { "SSH port " input type="number" name="port" min="1" max="65535" placeholder="22" value=(value(|f| &f.port)); }
                label { "User " input type="text" name="user" required value=(value(|f| &f.user)); }
                fieldset {
                    legend { "Credential (never shown again)" }
                    label for="private_key" { "Private key (OpenSSH or PEM)" }
                    textarea id="private_key" name="private_key" rows="4" cols="70" autocomplete="off" {}
                    label { "Key passphrase " input type="password" name="passphrase" autocomplete="off"; }
                    label { "or a password " input type="password" name="password" autocomplete="off"; }
                }
                label { "Host key to pin (" code { "SHA256:…" } "; empty: the first one seen) " input type="text" name="host_key" size="60" value=(value(|f| &f.host_key)); }
                label { "Labels (" code { "role=web, zone=a" } ") " input type="text" name="labels" value=(value(|f| &f.labels)); }
                button type="submit" id="register-node" { "Register" }
            }
        },
    )
}

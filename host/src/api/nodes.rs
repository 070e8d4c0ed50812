//! Nodes: register (verification starts at once), list (by label and status), get, change labels,
//! visibility or credential, delete (refused while resources are on the node), re-verify, accept
//! a changed host key. No answer ever carries a credential: only its kind is shown.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::Caller;
use super::extract::{Json, Path, Query};
use super::views::Node;
use super::{ApiError, AppState, ErrorBody, Result};
use crate::nodes::{Change, NodesError, Registration};
use crate::store::{EnvironmentId, NodeStatus};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(register_node, list_nodes))
        .routes(routes!(get_node, change_node, delete_node))
        .routes(routes!(verify_node))
        .routes(routes!(accept_host_key))
        .routes(routes!(environment_nodes))
        .routes(routes!(claim_node, release_node))
}

/// The nodes the environment may use: the public ones and its own private ones.
#[utoipa::path(get, path = "/environments/{env}/nodes", tag = "nodes",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 200, body = NodeList), (status = 404, body = ErrorBody)))]
async fn environment_nodes(State(app): State<AppState>, Path(env): Path<String>) -> Result<axum::Json<NodeList>> {
    let items = app.environment_nodes(&env).await?.into_iter().map(Node::from).collect();
    Ok(axum::Json(NodeList { items }))
}

/// Makes a public node private to the environment (refused while another environment uses it,
/// or when it is private to another).
#[utoipa::path(put, path = "/environments/{env}/nodes/{node}", tag = "nodes",
    params(("env" = String, Path, description = "Environment name or id"), ("node" = String, Path, description = "Node name")),
    responses((status = 200, body = Node), (status = 404, body = ErrorBody),
        (status = 409, description = "In use by another environment, or private to another", body = ErrorBody)))]
async fn claim_node(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, node)): Path<(String, String)>,
) -> Result<axum::Json<Node>> {
    Ok(axum::Json(app.claim_node(&env, &node, &caller.user).await?.into()))
}

/// Makes a node private to the environment public again.
#[utoipa::path(delete, path = "/environments/{env}/nodes/{node}", tag = "nodes",
    params(("env" = String, Path, description = "Environment name or id"), ("node" = String, Path, description = "Node name")),
    responses((status = 200, body = Node), (status = 404, body = ErrorBody),
        (status = 409, description = "Not private to this environment", body = ErrorBody)))]
async fn release_node(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path((env, node)): Path<(String, String)>,
) -> Result<axum::Json<Node>> {
    Ok(axum::Json(app.release_node(&env, &node, &caller.user).await?.into()))
}

/// How the host logs in: `{"private_key": "<OpenSSH or PEM text>", "passphrase": "…"}` (the
/// passphrase only for an encrypted key) or `{"password": "…"}`. Stored encrypted, never shown.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CredentialBody {
    private_key: Option<String>,
    passphrase: Option<String>,
    password: Option<String>,
}

impl CredentialBody {
    /// Decoded by hand from the JSON value, so that no parse error quotes a secret.
    fn parse(value: serde_json::Value) -> Result<orc_ssh::Credential, NodesError> {
        let shape = || {
            NodesError::InvalidCredential("expected an object with `private_key` (and an optional `passphrase`) or with `password`".into())
        };
        let body: CredentialBody = serde_json::from_value(value).map_err(|_| shape())?;
        match body {
            CredentialBody {
                private_key: Some(pem),
                passphrase,
                password: None,
            } => Ok(orc_ssh::Credential::PrivateKey { pem, passphrase }),
            CredentialBody {
                private_key: None,
                passphrase: None,
                password: Some(p),
            } => Ok(orc_ssh::Credential::Password(p)),
            _ => Err(shape()),
        }
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewNode {
    /// 1–63 of `a-z 0-9 . - _`, starting with a letter or digit; what resource ids name
    /// (`file[web1,/etc/motd]`). `local` is reserved.
    #[schema(example = "web1", pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")]
    name: String,
    /// Host name or IP address.
    #[schema(example = "10.0.0.5")]
    address: String,
    /// SSH port (default 22).
    #[schema(minimum = 1, maximum = 65535)]
    port: Option<u32>,
    /// The SSH user.
    #[schema(example = "deploy")]
    user: String,
    #[schema(value_type = CredentialBody)]
    credential: serde_json::Value,
    /// The host key to pin (`SHA256:…`, as `ssh-keygen -lf` prints it); without it, the key the
    /// node presents at its first verification is pinned.
    host_key_fingerprint: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// Private to this environment (name or id); without it, the node is public.
    environment: Option<String>,
}

/// What to change; fields left out stay as they are.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NodeChange {
    /// Replaces every label.
    labels: Option<BTreeMap<String, String>>,
    /// An environment (name or id) makes the node private to it; `null` makes it public.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    environment: Option<Option<String>>,
    /// Replaces the credential; the node is verified again.
    #[schema(value_type = Option<CredentialBody>)]
    credential: Option<serde_json::Value>,
}

/// `Some(value)` when the field is present, even as `null`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AcceptHostKey {
    /// The fingerprint the node presented (`presented_host_key`), as checked by the operator.
    fingerprint: String,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct NodeQuery {
    /// `key=value`: only nodes with this label.
    label: Option<String>,
    /// Only nodes in this status.
    status: Option<NodeStatus>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct NodeList {
    items: Vec<Node>,
}

async fn environment_id(app: &AppState, key: Option<&str>) -> Result<Option<EnvironmentId>> {
    match key {
        Some(key) => Ok(Some(app.get(key).await?.id)),
        None => Ok(None),
    }
}

/// Registers a node and starts verifying it: the answer shows it `unidentified`; poll it to see
/// the outcome (`public`/`private`, or why not).
#[utoipa::path(post, path = "/nodes", tag = "nodes", request_body = NewNode,
    responses(
        (status = 201, body = Node),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 404, description = "Unknown environment", body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody),
        (status = 422, description = "An invalid field, named; `invalid_credential`", body = ErrorBody),
    ))]
async fn register_node(State(app): State<AppState>, Caller(caller): Caller, Json(new): Json<NewNode>) -> Result<impl IntoResponse> {
    let environment = environment_id(&app, new.environment.as_deref()).await?;
    let credential = CredentialBody::parse(new.credential)?;
    let node = app
        .register_node(Registration {
            name: new.name,
            address: new.address,
            port: new.port.unwrap_or(22),
            user: new.user,
            credential,
            host_key: new.host_key_fingerprint,
            labels: new.labels,
            environment,
            author: Some(caller.user.clone()),
        })
        .await?;
    Ok((StatusCode::CREATED, axum::Json(Node::from(node))))
}

#[utoipa::path(get, path = "/nodes", tag = "nodes", params(NodeQuery),
    responses((status = 200, body = NodeList), (status = 400, body = ErrorBody)))]
async fn list_nodes(State(app): State<AppState>, Query(q): Query<NodeQuery>) -> Result<axum::Json<NodeList>> {
    let label = match q.label.as_deref() {
        Some(l) => Some(
            l.split_once('=')
                .ok_or_else(|| ApiError::bad_request("invalid_query", "`label` must be `key=value`"))?,
        ),
        None => None,
    };
    let items = app
        .list_nodes()
        .await?
        .into_iter()
        .filter(|n| q.status.is_none_or(|s| n.status == s))
        .filter(|n| label.is_none_or(|(k, v)| n.labels.get(k).is_some_and(|have| have == v)))
        .map(Node::from)
        .collect();
    Ok(axum::Json(NodeList { items }))
}

#[utoipa::path(get, path = "/nodes/{node}", tag = "nodes",
    params(("node" = String, Path, description = "Node name")),
    responses((status = 200, body = Node), (status = 404, body = ErrorBody)))]
async fn get_node(State(app): State<AppState>, Path(node): Path<String>) -> Result<axum::Json<Node>> {
    Ok(axum::Json(app.node(&node).await?.into()))
}

/// Changes labels, visibility or the credential (a new credential is verified at once). Making
/// the node private to one environment is refused (409 `node_in_use`) while another uses it.
#[utoipa::path(patch, path = "/nodes/{node}", tag = "nodes", request_body = NodeChange,
    params(("node" = String, Path, description = "Node name")),
    responses(
        (status = 200, body = Node),
        (status = 400, body = ErrorBody),
        (status = 404, description = "Unknown node or environment", body = ErrorBody),
        (status = 409, description = "Made private while another environment uses it", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
async fn change_node(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path(node): Path<String>,
    Json(change): Json<NodeChange>,
) -> Result<axum::Json<Node>> {
    let environment = match change.environment {
        Some(key) => Some(environment_id(&app, key.as_deref()).await?),
        None => None,
    };
    let credential = change.credential.map(CredentialBody::parse).transpose()?;
    let change = Change {
        labels: change.labels,
        environment,
        credential,
        author: Some(caller.user.clone()),
    };
    Ok(axum::Json(app.change_node(&node, change).await?.into()))
}

/// Deletes the node and its credential; refused (409 `node_in_use`) while some environment has
/// resources on it.
#[utoipa::path(delete, path = "/nodes/{node}", tag = "nodes",
    params(("node" = String, Path, description = "Node name")),
    responses((status = 204, description = "Deleted"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn delete_node(State(app): State<AppState>, Path(node): Path<String>) -> Result<StatusCode> {
    app.delete_node(&node).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Verifies the node now (connect with the pinned key, gather facts) and answers with the
/// outcome once known (within the SSH connect and handshake timeouts).
#[utoipa::path(post, path = "/nodes/{node}/verify", tag = "nodes",
    params(("node" = String, Path, description = "Node name")),
    responses((status = 200, body = Node), (status = 404, body = ErrorBody)))]
async fn verify_node(State(app): State<AppState>, Path(node): Path<String>) -> Result<axum::Json<Node>> {
    Ok(axum::Json(app.verify_node(&node).await?.into()))
}

/// Pins the host key a node presented after its key changed (`presented_host_key`; the
/// fingerprint must be exactly that one), then verifies the node with it.
#[utoipa::path(post, path = "/nodes/{node}/accept-host-key", tag = "nodes", request_body = AcceptHostKey,
    params(("node" = String, Path, description = "Node name")),
    responses(
        (status = 200, body = Node),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The node's key did not change", body = ErrorBody),
        (status = 422, description = "Not the presented key", body = ErrorBody),
    ))]
async fn accept_host_key(
    State(app): State<AppState>,
    Path(node): Path<String>,
    Json(body): Json<AcceptHostKey>,
) -> Result<axum::Json<Node>> {
    Ok(axum::Json(app.accept_host_key(&node, &body.fingerprint).await?.into()))
}

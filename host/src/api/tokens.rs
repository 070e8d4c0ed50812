//! Tokens: a user creates its own (`POST /tokens`, carrying all of its roles or a narrower
//! `scope`), an admin creates one for any user (`POST /users/{user}/tokens`); the secret is
//! answered once, only its hash is kept. Listing shows the caller's tokens (an admin's: all),
//! each with the roles it carries. Revoking one fails it at once.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::Caller;
use super::extract::{OptionalJson, Path};
use super::views::Token;
use super::{ApiError, AppState, ErrorBody, Result};
use crate::access::Role;
use crate::app::{ScopeRequest, TokenView};
use crate::store::TokenId;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_token, list_tokens))
        .routes(routes!(delete_token))
        .routes(routes!(create_user_token))
}

/// What a new token carries: all of its user's roles (no `scope`), or a narrower set. A token
/// made with a scoped token carries no more than that one: its roles without `scope`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TokenRequest {
    /// What it is for, shown in listings (at most 200 characters).
    #[serde(default)]
    pub description: String,
    #[serde(default, deserialize_with = "crate::json::object_or_null")]
    pub scope: Option<ScopeBody>,
}

/// A narrower set of roles: each must be one the user holds.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ScopeBody {
    #[serde(default)]
    pub admin: bool,
    #[serde(default)]
    pub publisher: bool,
    /// The role per environment, by name or id.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub environments: BTreeMap<String, Role>,
}

impl From<ScopeBody> for ScopeRequest {
    fn from(s: ScopeBody) -> ScopeRequest {
        ScopeRequest {
            admin: s.admin,
            publisher: s.publisher,
            environments: s.environments,
        }
    }
}

/// A new token; `token` is shown this once.
#[derive(Serialize, ToSchema)]
pub(super) struct NewToken {
    #[serde(flatten)]
    pub token: Token,
    /// The secret: send it as `Authorization: Bearer <token>`.
    #[serde(rename = "token")]
    pub secret: String,
}

impl NewToken {
    pub fn created((view, secret): (TokenView, String)) -> impl IntoResponse {
        (
            StatusCode::CREATED,
            axum::Json(NewToken {
                token: view.into(),
                secret,
            }),
        )
    }
}

#[derive(Serialize, ToSchema)]
pub(super) struct TokenList {
    items: Vec<Token>,
}

/// A new token of the caller's own user. A caller whose token is scoped hands on no more than it
/// carries: without `scope`, the new token carries the caller's roles.
#[utoipa::path(post, path = "/tokens", tag = "access", request_body(content = Option<TokenRequest>),
    responses((status = 201, body = NewToken), (status = 422, description = "`invalid_scope`: a scope wider than the user's roles, or than the calling token's", body = ErrorBody)))]
async fn create_token(
    State(app): State<AppState>,
    Caller(caller): Caller,
    OptionalJson(body): OptionalJson<TokenRequest>,
) -> Result<impl IntoResponse> {
    let body = body.unwrap_or_default();
    let created = app.create_own_token(&caller, body.scope.map(Into::into), &body.description).await?;
    Ok(NewToken::created(created))
}

/// A new token of any user (admin).
#[utoipa::path(post, path = "/users/{user}/tokens", tag = "access", request_body(content = Option<TokenRequest>),
    params(("user" = String, Path)),
    responses((status = 201, body = NewToken), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn create_user_token(
    State(app): State<AppState>,
    Path(user): Path<String>,
    OptionalJson(body): OptionalJson<TokenRequest>,
) -> Result<impl IntoResponse> {
    let body = body.unwrap_or_default();
    let created = app.create_token(&user, body.scope.map(Into::into), &body.description).await?;
    Ok(NewToken::created(created))
}

/// The caller's tokens (an admin's: every user's).
#[utoipa::path(get, path = "/tokens", tag = "access", responses((status = 200, body = TokenList)))]
async fn list_tokens(State(app): State<AppState>, Caller(caller): Caller) -> Result<axum::Json<TokenList>> {
    Ok(axum::Json(TokenList {
        items: app.tokens(&caller).await?.into_iter().map(Token::from).collect(),
    }))
}

/// Revokes a token at once (also the one making this call). Another user's token is unknown
/// to a caller who is not an admin.
#[utoipa::path(delete, path = "/tokens/{id}", tag = "access",
    params(("id" = String, Path, format = Uuid)),
    responses(
        (status = 204, description = "Revoked"),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The last way in of the last enabled admin", body = ErrorBody),
    ))]
async fn delete_token(State(app): State<AppState>, Caller(caller): Caller, Path(id): Path<String>) -> Result<StatusCode> {
    let id: TokenId = id.parse().map_err(|_| {
        ApiError::bad_request(
            "invalid_path",
            format!("`{}` is not a token id", id.chars().take(100).collect::<String>()),
        )
    })?;
    app.delete_token(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

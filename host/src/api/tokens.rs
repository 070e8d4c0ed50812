//! Admin tokens: create (the secret is answered once, only its hash is kept), list, revoke. The
//! last token cannot be revoked, so the host never locks everyone out.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::Path;
use super::views::AdminToken;
use super::{ApiError, AppState, ErrorBody, Result};
use crate::store::{Millis, TokenId};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_token, list_tokens))
        .routes(routes!(delete_token))
}

/// A new token; `token` is shown this once.
#[derive(Serialize, ToSchema)]
pub(super) struct NewToken {
    #[schema(value_type = String, format = Uuid)]
    id: TokenId,
    created_at: Millis,
    /// The secret: send it as `Authorization: Bearer <token>`.
    token: String,
}

#[derive(Serialize, ToSchema)]
pub(super) struct TokenList {
    items: Vec<AdminToken>,
}

#[utoipa::path(post, path = "/tokens", tag = "host", responses((status = 201, body = NewToken)))]
async fn create_token(State(envs): State<AppState>) -> Result<impl IntoResponse> {
    let (record, token) = envs.create_admin_token().await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(NewToken {
            id: record.id,
            created_at: record.created_at,
            token,
        }),
    ))
}

#[utoipa::path(get, path = "/tokens", tag = "host", responses((status = 200, body = TokenList)))]
async fn list_tokens(State(envs): State<AppState>) -> Result<axum::Json<TokenList>> {
    Ok(axum::Json(TokenList {
        items: envs.admin_tokens().await?.into_iter().map(AdminToken::from).collect(),
    }))
}

/// Revokes a token at once (also the one making this call).
#[utoipa::path(delete, path = "/tokens/{id}", tag = "host",
    params(("id" = String, Path, format = Uuid)),
    responses(
        (status = 204, description = "Revoked"),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The last token", body = ErrorBody),
    ))]
async fn delete_token(State(envs): State<AppState>, Path(id): Path<String>) -> Result<StatusCode> {
    let id: TokenId = id.parse().map_err(|_| {
        ApiError::bad_request(
            "invalid_path",
            format!("`{}` is not a token id", id.chars().take(100).collect::<String>()),
        )
    })?;
    envs.delete_admin_token(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

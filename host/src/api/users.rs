//! Users, roles and the audit trail: signing in with a password (`POST /login`, answered with a
//! new token), who the caller is (`GET /me`), the admin's users (create, list, change, disable,
//! delete), an environment's members (`…/members/{user}`: an owner's), and the audit trail
//! (`GET /audit`, the admin's). Passwords are never answered or logged.

use std::collections::BTreeMap;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::{AuditSubject, Caller, ClientAddress};
use super::extract::{Json, Path, Query, bounded};
use super::tokens::{NewToken, ScopeBody};
use super::views::{AuditEntry, Member, User};
use super::{ApiError, AppState, ErrorBody, Result};
use crate::access::Role;
use crate::app::{NewUser, UserPatch};
use crate::store::{AuditFilter, AuditId, MAX_PAGE, Millis};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(
            OpenApiRouter::new()
                .routes(routes!(login))
                .layer(DefaultBodyLimit::max(super::SIGN_IN_BODY_BYTES)),
        )
        .routes(routes!(me))
        .routes(routes!(create_user, list_users))
        .routes(routes!(get_user, change_user, delete_user))
        .routes(routes!(list_members))
        .routes(routes!(set_member, remove_member))
        .routes(routes!(audit))
}

/// A password is never shown; `Debug` says only whether there is one.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Login {
    name: String,
    #[schema(format = Password)]
    password: String,
    /// What the new token is for, shown in listings.
    #[serde(default)]
    description: String,
    /// A narrower set of roles for the new token.
    scope: Option<ScopeBody>,
}

/// Signs in with a user's name and password: a new token of that user. A wrong name, a wrong
/// password and a disabled user get the same answer, after the same work. Attempts are
/// throttled per source address and per user name (429), and password checks wait for a turn
/// at a bounded pool (503 when it is full); every attempt is in the audit trail, a failed one
/// under the name it gave.
#[utoipa::path(post, path = "/login", tag = "access", security(()), request_body = Login,
    responses((status = 201, body = NewToken), (status = 401, description = "Wrong name or password (`invalid_credentials`)", body = ErrorBody),
        (status = 429, description = "Too many attempts from this address or for this name (`rate_limited`, with `Retry-After`)", body = ErrorBody),
        (status = 503, description = "Too many password checks waiting (`busy`, with `Retry-After`)", body = ErrorBody)))]
async fn login(State(app): State<AppState>, ClientAddress(source): ClientAddress, Json(body): Json<Login>) -> axum::response::Response {
    let description = if body.description.is_empty() {
        "signed in".to_string()
    } else {
        body.description
    };
    let signed_in = app
        .login(&body.name, &body.password, body.scope.map(Into::into), &description, source)
        .await;
    let (mut response, subject) = match signed_in {
        Ok((view, secret)) => {
            let subject = AuditSubject {
                user_id: Some(view.record.user_id),
                user: view.record.user.clone(),
                token_id: Some(view.record.id),
            };
            (NewToken::created((view, secret)).into_response(), subject)
        }
        Err(e) => (ApiError::from(e).into_response(), AuditSubject::attempted(&body.name)),
    };
    response.extensions_mut().insert(subject);
    response
}

/// Who the caller is: its user and token, and the roles the token carries now.
#[derive(Serialize, ToSchema)]
pub(super) struct Me {
    user: String,
    #[schema(value_type = String, format = Uuid)]
    token_id: crate::store::TokenId,
    admin: bool,
    publisher: bool,
    /// The role per environment the token carries, by name (an admin's: every environment,
    /// as `owner`).
    #[schema(value_type = Object)]
    environments: BTreeMap<String, Role>,
}

#[utoipa::path(get, path = "/me", tag = "access", responses((status = 200, body = Me)))]
async fn me(State(app): State<AppState>, Caller(caller): Caller) -> Result<axum::Json<Me>> {
    let environments = app
        .list_for(&caller)
        .await?
        .into_iter()
        .filter_map(|env| caller.role_in_id(&env.id).map(|role| (env.name, role)))
        .collect();
    Ok(axum::Json(Me {
        user: caller.user.clone(),
        token_id: caller.token_id,
        admin: caller.is_admin(),
        publisher: caller
            .allows(crate::access::Rule::Server(crate::access::ServerRole::Publisher), None)
            .is_ok(),
        environments,
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateUser {
    /// 1–64 of ASCII letters, digits, `-`, `_`, `.`, `@`.
    name: String,
    /// At least 12 characters; none: the user signs in with tokens only.
    #[schema(format = Password)]
    password: Option<String>,
    #[serde(default)]
    admin: bool,
    #[serde(default)]
    publisher: bool,
}

#[utoipa::path(post, path = "/users", tag = "access", request_body = CreateUser,
    responses((status = 201, body = User), (status = 409, description = "The name is taken", body = ErrorBody),
        (status = 422, description = "An invalid name or password", body = ErrorBody)))]
async fn create_user(State(app): State<AppState>, Json(body): Json<CreateUser>) -> Result<impl IntoResponse> {
    let user = app
        .create_user(NewUser {
            name: body.name,
            password: body.password,
            admin: body.admin,
            publisher: body.publisher,
        })
        .await?;
    Ok((StatusCode::CREATED, axum::Json(User::new(user, &[]))))
}

#[derive(Serialize, ToSchema)]
pub(super) struct UserList {
    items: Vec<User>,
}

#[utoipa::path(get, path = "/users", tag = "access", responses((status = 200, body = UserList)))]
async fn list_users(State(app): State<AppState>) -> Result<axum::Json<UserList>> {
    let mut items = Vec::new();
    for user in app.users().await? {
        let memberships = app.user_memberships(&user).await?;
        items.push(User::new(user, &memberships));
    }
    Ok(axum::Json(UserList { items }))
}

#[utoipa::path(get, path = "/users/{user}", tag = "access", params(("user" = String, Path)),
    responses((status = 200, body = User), (status = 404, body = ErrorBody)))]
async fn get_user(State(app): State<AppState>, Path(name): Path<String>) -> Result<axum::Json<User>> {
    let user = app.user(&name).await?;
    let memberships = app.user_memberships(&user).await?;
    Ok(axum::Json(User::new(user, &memberships)))
}

/// A change of a user: only the fields given change; `"password": null` removes the password.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ChangeUser {
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, format = Password)]
    password: Option<Option<String>>,
    admin: Option<bool>,
    publisher: Option<bool>,
    /// A disabled user's tokens fail at once, open event streams included.
    disabled: Option<bool>,
}

/// A field that is present (`Some`), possibly `null` (`Some(None)`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

#[utoipa::path(patch, path = "/users/{user}", tag = "access", params(("user" = String, Path)), request_body = ChangeUser,
    responses((status = 200, body = User), (status = 404, body = ErrorBody),
        (status = 409, description = "No enabled admin would keep a way in", body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn change_user(State(app): State<AppState>, Path(name): Path<String>, Json(body): Json<ChangeUser>) -> Result<axum::Json<User>> {
    let user = app
        .change_user(
            &name,
            UserPatch {
                password: body.password,
                admin: body.admin,
                publisher: body.publisher,
                disabled: body.disabled,
            },
        )
        .await?;
    let memberships = app.user_memberships(&user).await?;
    Ok(axum::Json(User::new(user, &memberships)))
}

/// Deletes a user, its tokens (which fail at once) and its roles.
#[utoipa::path(delete, path = "/users/{user}", tag = "access", params(("user" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 404, body = ErrorBody),
        (status = 409, description = "No enabled admin would keep a way in", body = ErrorBody)))]
async fn delete_user(State(app): State<AppState>, Path(name): Path<String>) -> Result<StatusCode> {
    app.delete_user(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Serialize, ToSchema)]
pub(super) struct MemberList {
    items: Vec<Member>,
}

#[utoipa::path(get, path = "/environments/{env}/members", tag = "access",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 200, body = MemberList), (status = 404, body = ErrorBody)))]
async fn list_members(State(app): State<AppState>, Path(env): Path<String>) -> Result<axum::Json<MemberList>> {
    Ok(axum::Json(MemberList {
        items: app.members(&env).await?.into_iter().map(Member::from).collect(),
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SetMember {
    role: Role,
}

/// Gives a user a role in the environment (replacing the one it had there).
#[utoipa::path(put, path = "/environments/{env}/members/{user}", tag = "access", request_body = SetMember,
    params(("env" = String, Path, description = "Environment name or id"), ("user" = String, Path)),
    responses((status = 200, body = Member), (status = 404, body = ErrorBody)))]
async fn set_member(
    State(app): State<AppState>,
    Path((env, user)): Path<(String, String)>,
    Json(body): Json<SetMember>,
) -> Result<axum::Json<Member>> {
    Ok(axum::Json(app.set_member(&env, &user, body.role).await?.into()))
}

/// Takes the user's role in the environment away; its tokens lose it at once.
#[utoipa::path(delete, path = "/environments/{env}/members/{user}", tag = "access",
    params(("env" = String, Path, description = "Environment name or id"), ("user" = String, Path)),
    responses((status = 204, description = "Removed"), (status = 404, body = ErrorBody)))]
async fn remove_member(State(app): State<AppState>, Path((env, user)): Path<(String, String)>) -> Result<StatusCode> {
    app.remove_member(&env, &user).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct AuditQuery {
    /// Only this user's requests.
    user: Option<String>,
    /// Only requests naming this environment (as the path named it).
    environment: Option<String>,
    /// Only requests at or after this time (ms since the epoch).
    since: Option<Millis>,
    /// Only requests at or before this time (ms since the epoch).
    until: Option<Millis>,
    /// `true`: only refused or failed requests (status 400 and above); `false`: only the others.
    failed: Option<bool>,
    /// The `next_before` of the previous page.
    before: Option<String>,
    /// Page size, 1–10000 (default 100).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<u32>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct AuditPage {
    items: Vec<AuditEntry>,
    /// Pass as `before` for the next (older) page; `null` on the last.
    next_before: Option<String>,
}

/// The audit trail, newest first: every state-changing request with who asked (user and
/// token), what, when and the outcome.
#[utoipa::path(get, path = "/audit", tag = "access", params(AuditQuery),
    responses((status = 200, body = AuditPage), (status = 400, body = ErrorBody)))]
async fn audit(State(app): State<AppState>, Query(q): Query<AuditQuery>) -> Result<axum::Json<AuditPage>> {
    let before = match q.before {
        Some(b) => Some(
            b.parse::<AuditId>()
                .map_err(|_| ApiError::bad_request("invalid_query", "`before` is not a `next_before` of this trail"))?,
        ),
        None => None,
    };
    let filter = AuditFilter {
        user: q.user,
        environment: q.environment,
        since: q.since,
        until: q.until,
        failed: q.failed,
        before,
        limit: bounded("limit", q.limit, 1, MAX_PAGE)?.unwrap_or(0),
    };
    let (items, next) = app.audit(&filter).await?;
    Ok(axum::Json(AuditPage {
        items: items.into_iter().map(AuditEntry::from).collect(),
        next_before: next.map(|n| n.to_string()),
    }))
}

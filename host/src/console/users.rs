//! The console's users (an admin's: list, create, disable or enable, delete) and an environment's
//! members (their roles: list; grant or change, remove — its owner's), through the same `App`
//! calls and rules as `/users`, `PATCH|DELETE /users/{user}` and
//! `/environments/{env}/members/{user}`.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::extract::{Form, Path};
use super::pages::{error_box, layout, path_segment, time};
use super::session::{Sessions, SignedIn};
use super::{AppState, CsrfForm, PageError, audit, authorize, authorize_change, refused};
use crate::access::Role;
use crate::api::ApiError;
use crate::app::{App, NewUser, UserPatch};
use crate::store::{Membership, UserRecord};

pub async fn users(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let signed_in = authorize(&app, &sessions, &headers, Method::GET, "/users", None).await?;
    users_page(&app, &signed_in, None, None).await
}

/// The users page; `error`: a refusal, shown beside the create form when it refused `form`, else
/// above the table.
async fn users_page(app: &App, signed_in: &SignedIn, form: Option<&NewUserForm>, error: Option<&ApiError>) -> Result<Response, PageError> {
    let list = app.users().await.map_err(refused)?;
    let mut rows = Vec::with_capacity(list.len());
    for user in list {
        let memberships = app.user_memberships(&user).await.map_err(refused)?;
        rows.push((user, memberships));
    }
    let status = error.map_or(StatusCode::OK, |e| e.status);
    Ok((status, users_markup(signed_in, &rows, form, error)).into_response())
}

#[derive(Deserialize, Default)]
pub struct NewUserForm {
    #[serde(rename = "_csrf")]
    csrf: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    password: String,
    /// A checkbox: present when ticked.
    admin: Option<String>,
    publisher: Option<String>,
}

pub async fn create_user(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Form(form): Form<NewUserForm>,
) -> Result<Response, PageError> {
    let route = (Method::POST, "/users");
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), None).await?;
    let created = app
        .create_user(NewUser {
            name: form.name.trim().to_string(),
            password: Some(form.password.clone()).filter(|p| !p.is_empty()),
            admin: form.admin.is_some(),
            publisher: form.publisher.is_some(),
        })
        .await
        .map_err(ApiError::from);
    audit(&app, &signed_in, route, "/users", None, created.as_ref().map(drop)).await;
    match created {
        Ok(_) => Ok(Redirect::to("/users").into_response()),
        Err(e) => users_page(&app, &signed_in, Some(&form), Some(&e)).await,
    }
}

/// What a user's buttons do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserAction {
    Disable,
    Enable,
    Delete,
}

pub async fn change_user(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path((name, action)): Path<(String, UserAction)>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, PageError> {
    let route = match action {
        UserAction::Delete => (Method::DELETE, "/users/{user}"),
        UserAction::Disable | UserAction::Enable => (Method::PATCH, "/users/{user}"),
    };
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), None).await?;
    let outcome = match action {
        UserAction::Delete => app.delete_user(&name).await,
        UserAction::Disable | UserAction::Enable => app
            .change_user(
                &name,
                UserPatch {
                    disabled: Some(action == UserAction::Disable),
                    ..UserPatch::default()
                },
            )
            .await
            .map(drop),
    }
    .map_err(ApiError::from);
    audit(
        &app,
        &signed_in,
        route,
        &format!("/users/{name}"),
        None,
        outcome.as_ref().map(|_| ()),
    )
    .await;
    match outcome {
        Ok(()) => Ok(Redirect::to("/users").into_response()),
        Err(e) => users_page(&app, &signed_in, None, Some(&e)).await,
    }
}

fn users_markup(
    signed_in: &SignedIn,
    rows: &[(UserRecord, Vec<Membership>)],
    form: Option<&NewUserForm>,
    error: Option<&ApiError>,
) -> Markup {
    layout(
        "Users",
        Some(signed_in),
        html! {
            h1 { "Users" }
            @if let (None, Some(e)) = (form, error) { (error_box(e)) }
            table id="users" {
                thead { tr { th { "User" } th { "Server roles" } th { "Environments" } th { "Password" } th { "Status" } th { "Created" } th { "" } } }
                tbody {
                    @for (u, memberships) in rows {
                        tr data-user=(u.name) {
                            td { (u.name) }
                            td { (server_roles(u)) }
                            td.memberships {
                                @if memberships.is_empty() { "none" }
                                @for (i, m) in memberships.iter().enumerate() {
                                    @if i > 0 { ", " }
                                    a href=(format!("/environments/{}/members", path_segment(&m.environment))) { (m.environment) } ": " (m.role.as_str())
                                }
                            }
                            td { @if u.has_password { "set" } @else { "none" } }
                            td.status { @if u.disabled { "disabled" } @else { "enabled" } }
                            td { (time(u.created_at)) }
                            td {
                                @let base = format!("/users/{}", path_segment(&u.name));
                                @if u.disabled {
                                    form.inline method="post" action=(format!("{base}/enable")) {
                                        input type="hidden" name="_csrf" value=(signed_in.csrf);
                                        button type="submit" class="enable" { "Enable" }
                                    }
                                } @else {
                                    form.inline method="post" action=(format!("{base}/disable"))
                                        data-confirm="Disable this user? Its tokens stop working at once." {
                                        input type="hidden" name="_csrf" value=(signed_in.csrf);
                                        button type="submit" class="disable" { "Disable" }
                                    }
                                }
                                " "
                                form.inline method="post" action=(format!("{base}/delete"))
                                    data-confirm="Delete this user, its tokens and its roles?" {
                                    input type="hidden" name="_csrf" value=(signed_in.csrf);
                                    button type="submit" class="delete" { "Delete" }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Create a user" }
            @if let (Some(_), Some(e)) = (form, error) { (error_box(e)) }
            form method="post" action="/users" {
                input type="hidden" name="_csrf" value=(signed_in.csrf);
                label { "Name " input type="text" name="name" id="user-name" required value=(form.map(|f| f.name.as_str()).unwrap_or_default()); }
                label { "Password (none: the user signs in with tokens only) " input type="password" name="password" id="user-password" autocomplete="new-password"; }
                label { input type="checkbox" name="admin" id="user-admin" checked[form.is_some_and(|f| f.admin.is_some())]; " Admin (everything, everywhere)" }
                label { input type="checkbox" name="publisher" id="user-publisher" checked[form.is_some_and(|f| f.publisher.is_some())]; " Publisher (uploads plugins)" }
                button type="submit" id="create-user" { "Create" }
            }
        },
    )
}

fn server_roles(u: &UserRecord) -> String {
    match (u.admin, u.publisher) {
        (true, _) => "admin".into(),
        (false, true) => "publisher".into(),
        (false, false) => "none".into(),
    }
}

// An environment's members.

pub async fn members(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Response, PageError> {
    let signed_in = authorize(&app, &sessions, &headers, Method::GET, "/environments/{env}/members", Some(&key)).await?;
    members_page(&app, &signed_in, &key, None).await
}

async fn members_page(app: &App, signed_in: &SignedIn, key: &str, error: Option<(&MemberForm, &ApiError)>) -> Result<Response, PageError> {
    let env = app.get(key).await.map_err(refused)?;
    let list = app.members(key).await.map_err(refused)?;
    let status = error.map_or(StatusCode::OK, |(_, e)| e.status);
    Ok((status, members_markup(signed_in, &env.name, &list, error)).into_response())
}

#[derive(Deserialize, Default)]
pub struct MemberForm {
    #[serde(rename = "_csrf")]
    csrf: Option<String>,
    #[serde(default)]
    user: String,
    #[serde(default)]
    role: String,
}

pub async fn set_member(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Form(form): Form<MemberForm>,
) -> Result<Response, PageError> {
    let route = (Method::PUT, "/environments/{env}/members/{user}");
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), Some(&key)).await?;
    let user = form.user.trim();
    let outcome = match form.role.parse::<Role>() {
        Ok(role) => app.set_member(&key, user, role).await.map(drop).map_err(ApiError::from),
        Err(e) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_role",
            format!("role: {e}"),
        )),
    };
    let path = format!("/environments/{key}/members/{user}");
    audit(&app, &signed_in, route, &path, Some(&key), outcome.as_ref().map(|_| ())).await;
    match outcome {
        Ok(()) => Ok(Redirect::to(&format!("/environments/{}/members", path_segment(&key))).into_response()),
        Err(e) => members_page(&app, &signed_in, &key, Some((&form, &e))).await,
    }
}

pub async fn remove_member(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path((key, user)): Path<(String, String)>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, PageError> {
    let route = (Method::DELETE, "/environments/{env}/members/{user}");
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), Some(&key)).await?;
    let outcome = app.remove_member(&key, &user).await.map_err(ApiError::from);
    let path = format!("/environments/{key}/members/{user}");
    audit(&app, &signed_in, route, &path, Some(&key), outcome.as_ref().map(|_| ())).await;
    match outcome {
        Ok(()) => Ok(Redirect::to(&format!("/environments/{}/members", path_segment(&key))).into_response()),
        Err(e) => {
            let form = MemberForm {
                user,
                ..MemberForm::default()
            };
            members_page(&app, &signed_in, &key, Some((&form, &e))).await
        }
    }
}

fn members_markup(signed_in: &SignedIn, env: &str, list: &[Membership], error: Option<(&MemberForm, &ApiError)>) -> Markup {
    let base = format!("/environments/{}", path_segment(env));
    let form = error.map(|(f, _)| f);
    layout(
        &format!("Members of {env}"),
        Some(signed_in),
        html! {
            p { a href=(base) { "← " (env) } }
            h1 { "Members of " (env) }
            p { "A viewer reads everything of the environment; an operator also deploys, repairs and runs cluster operations; an owner also changes settings, intents, templates and members. Admins hold every role everywhere." }
            @if list.is_empty() {
                p { "No member: only admins may use it." }
            } @else {
                table id="members" {
                    thead { tr { th { "User" } th { "Role" } th { "" } } }
                    tbody {
                        @for m in list {
                            tr data-member=(m.user) {
                                td { (m.user) }
                                td.role { (m.role.as_str()) }
                                td {
                                    form.inline method="post" action=(format!("{base}/members/{}/remove", path_segment(&m.user)))
                                        data-confirm="Take this user's role away?" {
                                        input type="hidden" name="_csrf" value=(signed_in.csrf);
                                        button type="submit" class="remove" { "Remove" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Grant or change a role" }
            @if let Some((_, e)) = error { (error_box(e)) }
            form method="post" action=(format!("{base}/members")) {
                input type="hidden" name="_csrf" value=(signed_in.csrf);
                label { "User " input type="text" name="user" id="member-user" required value=(form.map(|f| f.user.as_str()).unwrap_or_default()); }
                label {
                    "Role "
                    select name="role" id="member-role" {
                        @for r in Role::ALL {
                            option value=(r.as_str()) selected[form.is_some_and(|f| f.role == r.as_str())] { (r.as_str()) }
                        }
                    }
                }
                button type="submit" id="set-member" { "Grant" }
            }
        },
    )
}

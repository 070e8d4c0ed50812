//! The web console: server-rendered HTML pages under `/`, beside the REST API under `/api/v1`,
//! served by the same `orc-host serve` on the same port.
//!
//! Invariants:
//! - No page reads the store: every page and every form calls the same application function
//!   ([`crate::app`]) as the API route it mirrors, so the console can never show what the API
//!   would refuse, nor change anything the API would not.
//! - Every page and form is authorized by the rule of the API route it mirrors
//!   ([`rules::rule`]), for the principal of the browser's session ([`session`]): a viewer sees
//!   what `GET /api/v1/...` shows it, and a form needs the role its API call needs.
//! - Every state-changing request passes the origin check and carries the session's CSRF field,
//!   and is written to the audit trail like an API call (its route prefixed `console:`).
//! - Every refusal is shown in words: the API's stable code and its message, on a page.

mod access;
mod clusters;
mod extract;
mod nodes;
mod operations;
mod pages;
mod processes;
mod session;
mod settings;
mod timeline;
mod users;
mod versions;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use extract::{Form, Path, Query};
use serde::Deserialize;

use crate::access::{Principal, rules};
use crate::api::ApiError;
use crate::app::App;
use crate::scheduler::ResourceStatus;
use crate::store::{AuditId, AuditRecord, StateFilter, hash_token, now_ms};
use session::{Refused, Sessions, SignedIn};

type AppState = Arc<App>;

/// Resources per page of an environment's table.
const PAGE: u32 = 50;
/// Actions shown on a resource's page.
const RECENT_ACTIONS: u32 = 20;

/// The console's routes, to be merged at the root of the host's router.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/environments") }))
        .route(
            "/sign-in",
            get(sign_in_page)
                .post(sign_in)
                .layer(axum::extract::DefaultBodyLimit::max(crate::api::SIGN_IN_BODY_BYTES)),
        )
        .route("/sign-out", post(sign_out))
        .route("/environments", get(environments).post(create_environment))
        .route("/environments/{env}", get(environment))
        .route("/environments/{env}/resource", get(resource))
        .route("/environments/{env}/live", get(live))
        .route("/environments/{env}/versions", get(versions::versions).post(versions::submit))
        .route("/environments/{env}/versions/diff", get(versions::diff))
        .route("/environments/{env}/versions/{version}/{switch}", post(versions::switch))
        // deploy, repair, dryrun, halt, resume
        .route("/environments/{env}/{action}", post(environment_action))
        .route("/environments/{env}/settings", get(settings::settings).post(settings::change))
        .route("/tokens", get(access::tokens).post(access::create_token))
        .route("/tokens/{id}/revoke", post(access::revoke_token))
        .route("/plugins", get(access::plugins))
        .route("/users", get(users::users).post(users::create_user))
        .route("/users/{user}/{action}", post(users::change_user))
        .route("/environments/{env}/members", get(users::members).post(users::set_member))
        .route("/environments/{env}/processes", get(processes::processes))
        .route("/environments/{env}/members/{user}/remove", post(users::remove_member))
        .route("/nodes", get(nodes::nodes).post(nodes::register))
        .route("/nodes/{node}/verify", post(nodes::verify))
        .route("/nodes/{node}/accept-host-key", post(nodes::accept_host_key))
        .route("/environments/{env}/timeline", get(timeline::timeline))
        .route("/environments/{env}/clusters", get(clusters::clusters).post(clusters::create))
        .route("/environments/{env}/clusters/{name}", get(clusters::cluster))
        .route("/environments/{env}/clusters/{name}/{operation}", post(clusters::operate))
        .route(
            "/environments/{env}/clusters/{name}/services/{service}/{action}",
            post(clusters::service),
        )
        .route("/environments/{env}/operations/{id}", get(operations::operation))
        .route("/environments/{env}/dryruns/{id}", get(operations::dryrun_report))
        .route("/console.css", get(|| async { ([(header::CONTENT_TYPE, "text/css")], pages::CSS) }))
        .route(
            "/console.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript")], pages::SCRIPT) }),
        )
        .layer(Extension(Arc::new(Sessions::default())))
}

/// A page that could not be shown: the API's refusal, in words; a signed-out browser is sent to
/// sign in.
pub(super) enum PageError {
    SignedOut,
    Refused(ApiError),
}

impl From<Refused> for PageError {
    fn from(r: Refused) -> Self {
        match r {
            Refused::SignedOut => PageError::SignedOut,
            Refused::Forgery(why) => PageError::Refused(ApiError::new(StatusCode::FORBIDDEN, "csrf_refused", why)),
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        match self {
            PageError::SignedOut => Redirect::to("/sign-in").into_response(),
            PageError::Refused(e) => {
                let wait = e.retry_after_s;
                let mut response = (e.status, pages::error(&e)).into_response();
                if let Some(wait) = wait {
                    response.headers_mut().insert(header::RETRY_AFTER, wait.into());
                }
                response
            }
        }
    }
}

/// Shorthand: an application error as a page error.
pub(super) fn refused(e: impl Into<ApiError>) -> PageError {
    PageError::Refused(e.into())
}

/// The session of the request, allowed what the API route `method path` allows for environment
/// `env`.
pub(super) async fn authorize(
    app: &App,
    sessions: &Sessions,
    headers: &HeaderMap,
    method: Method,
    path: &str,
    env: Option<&str>,
) -> Result<SignedIn, PageError> {
    let signed_in = sessions.find(app, headers).await?;
    allow(&signed_in.principal, method, path, env)?;
    count(app, &signed_in.principal)?;
    Ok(signed_in)
}

/// Counts the request against the session's token's rate, as the API's layer does.
fn count(app: &App, principal: &Principal) -> Result<(), PageError> {
    app.count_request(principal)
        .map_err(|wait| refused(crate::api::auth::rate_limited(principal, wait)))
}

/// Refuses what the API route `method path` would refuse `principal`.
pub(super) fn allow(principal: &Principal, method: Method, path: &str, env: Option<&str>) -> Result<(), PageError> {
    let Some(rule) = rules::rule(&method, path) else {
        return Err(refused(ApiError::forbidden(format!("{method} {path} has no authorization rule"))));
    };
    principal.allows(rule, env).map_err(|f| refused(ApiError::forbidden(f.message)))
}

/// A state-changing form: same origin, the session's CSRF field, the API route's rule.
pub(super) async fn authorize_change(
    app: &App,
    sessions: &Sessions,
    headers: &HeaderMap,
    csrf: Option<&str>,
    (method, path): (Method, &str),
    env: Option<&str>,
) -> Result<SignedIn, PageError> {
    session::check_origin(headers)?;
    let signed_in = sessions.find(app, headers).await?;
    signed_in.check_csrf(csrf)?;
    allow(&signed_in.principal, method, path, env)?;
    count(app, &signed_in.principal)?;
    Ok(signed_in)
}

/// Writes a console change to the audit trail, as the API's layer does for its own.
async fn audit(
    app: &App,
    signed_in: &SignedIn,
    (method, route): (Method, &str),
    path: &str,
    env: Option<&str>,
    outcome: Result<(), &ApiError>,
) {
    app.record_audit(AuditRecord {
        id: AuditId::new(),
        at: now_ms(),
        user_id: Some(signed_in.principal.user_id),
        user: Some(signed_in.principal.user.clone()),
        token_id: Some(signed_in.principal.token_id),
        method: method.to_string(),
        route: format!("console:{route}"),
        path: path.chars().take(2048).collect(),
        environment: env.map(|e| e.chars().take(256).collect()),
        status: outcome.map_or_else(|e| e.status.as_u16(), |()| StatusCode::SEE_OTHER.as_u16()),
        code: outcome.err().map(|e| e.code.to_string()),
        source: None,
    });
}

// Signing in and out.

async fn sign_in_page() -> maud::Markup {
    pages::sign_in(None)
}

#[derive(Deserialize)]
struct SignInForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    password: String,
}

/// Signs in with a token, or a user's name and password (a new token for the session, revoked
/// when it ends). A password sign-in is throttled and audited as `POST /api/v1/login` is.
async fn sign_in(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    crate::api::auth::ClientAddress(source): crate::api::auth::ClientAddress,
    headers: HeaderMap,
    Form(form): Form<SignInForm>,
) -> Response {
    if let Err(Refused::Forgery(why)) = session::check_origin(&headers) {
        return (StatusCode::FORBIDDEN, pages::sign_in(Some(why))).into_response();
    }
    let token = form.token.trim();
    let started = if !token.is_empty() {
        match app.authenticate(token).await {
            Ok(Some(_)) => sessions.start(&app, hash_token(token), None).await.map_err(ApiError::from),
            Ok(None) => Err(ApiError::unauthorized_with(
                "that token is not valid: unknown, revoked, or its user is disabled",
            )),
            Err(e) => Err(ApiError::from(e)),
        }
    } else if !form.name.is_empty() {
        let outcome = app
            .login(&form.name, &form.password, None, "console session", source)
            .await
            .map_err(ApiError::from);
        let subject = match &outcome {
            Ok((view, _)) => crate::api::auth::AuditSubject {
                user_id: Some(view.record.user_id),
                user: view.record.user.clone(),
                token_id: Some(view.record.id),
            },
            Err(_) => crate::api::auth::AuditSubject::attempted(&form.name),
        };
        app.record_audit(AuditRecord {
            id: AuditId::new(),
            at: now_ms(),
            user_id: subject.user_id,
            user: Some(subject.user),
            token_id: subject.token_id,
            method: Method::POST.to_string(),
            route: "console:/sign-in".to_string(),
            path: "/sign-in".to_string(),
            environment: None,
            status: outcome
                .as_ref()
                .map_or_else(|e| e.status.as_u16(), |_| StatusCode::SEE_OTHER.as_u16()),
            code: outcome.as_ref().err().map(|e| e.code.to_string()),
            source: source.map(|ip| ip.to_string()),
        });
        match outcome {
            Ok((view, secret)) => sessions
                .start(&app, hash_token(&secret), Some(view.record.id))
                .await
                .map_err(ApiError::from),
            Err(refusal) => Err(refusal),
        }
    } else {
        Err(ApiError::unauthorized_with("give a token, or a user name and password"))
    };
    match started {
        Ok(secret) => (
            [(header::SET_COOKIE, session::set_cookie(&secret, &headers))],
            Redirect::to("/environments"),
        )
            .into_response(),
        Err(refusal) => {
            let mut response = (refusal.status, pages::sign_in(Some(&refusal.message))).into_response();
            if let Some(wait) = refusal.retry_after_s {
                response.headers_mut().insert(header::RETRY_AFTER, wait.into());
            }
            response
        }
    }
}

/// A form that carries only the session's CSRF field (a button).
#[derive(Deserialize)]
pub(super) struct CsrfForm {
    #[serde(rename = "_csrf")]
    pub csrf: Option<String>,
}

async fn sign_out(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response, PageError> {
    session::check_origin(&headers)?;
    let signed_in = sessions.find(&app, &headers).await?;
    signed_in.check_csrf(form.csrf.as_deref())?;
    sessions.end(&app, &signed_in).await;
    Ok(([(header::SET_COOKIE, session::clear_cookie(&headers))], Redirect::to("/sign-in")).into_response())
}

// Environments.

async fn environments(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
) -> Result<maud::Markup, PageError> {
    let signed_in = authorize(&app, &sessions, &headers, Method::GET, "/environments", None).await?;
    environments_page(&app, &signed_in, None).await
}

async fn environments_page(app: &App, signed_in: &SignedIn, error: Option<(&str, &ApiError)>) -> Result<maud::Markup, PageError> {
    let mut rows = Vec::new();
    for env in app.list_for(&signed_in.principal).await.map_err(refused)? {
        let counts = app.status_counts(&env).await.map_err(refused)?;
        rows.push((env, counts));
    }
    Ok(pages::environments(signed_in, &rows, error))
}

#[derive(Deserialize)]
struct NewEnvironmentForm {
    #[serde(rename = "_csrf")]
    csrf: Option<String>,
    #[serde(default)]
    name: String,
}

async fn create_environment(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Form(form): Form<NewEnvironmentForm>,
) -> Result<Response, PageError> {
    let route = (Method::POST, "/environments");
    let signed_in = authorize_change(&app, &sessions, &headers, form.csrf.as_deref(), route.clone(), None).await?;
    let name = form.name.trim();
    match app.create(name, None).await {
        Ok(env) => {
            audit(&app, &signed_in, route, "/environments", Some(&env.name), Ok(())).await;
            Ok(Redirect::to(&format!("/environments/{}", pages::path_segment(&env.name))).into_response())
        }
        Err(e) => {
            let e = ApiError::from(e);
            audit(&app, &signed_in, route, "/environments", Some(name), Err(&e)).await;
            let page = environments_page(&app, &signed_in, Some((name, &e))).await?;
            Ok((e.status, page).into_response())
        }
    }
}

#[derive(Deserialize, Default)]
struct ResourceQuery {
    status: Option<String>,
    #[serde(rename = "type")]
    resource_type: Option<String>,
    node: Option<String>,
    q: Option<String>,
    after: Option<String>,
}

/// The non-empty value of a filter field.
fn given(field: &Option<String>) -> Option<String> {
    field.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_string)
}

async fn environment(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Query(query): Query<ResourceQuery>,
) -> Result<maud::Markup, PageError> {
    let signed_in = authorize(&app, &sessions, &headers, Method::GET, "/environments/{env}", Some(&key)).await?;
    allow(&signed_in.principal, Method::GET, "/environments/{env}/resources", Some(&key))?;
    let env = app.get(&key).await.map_err(refused)?;
    let counts = app.status_counts(&env).await.map_err(refused)?;
    let status = match given(&query.status) {
        Some(s) => Some(
            s.parse::<ResourceStatus>()
                .map_err(|e| refused(ApiError::bad_request("invalid_query", format!("status: {e}"))))?,
        ),
        None => None,
    };
    let filter = StateFilter {
        status,
        resource_type: given(&query.resource_type),
        node: given(&query.node),
        text: given(&query.q),
        after: given(&query.after),
        limit: PAGE,
    };
    let page = app.resource_states(&env, &filter).await.map_err(refused)?;
    // The link to the next page keeps the filters.
    let mut next = BTreeMap::new();
    if let Some(after) = &page.next_after {
        for (k, v) in [
            ("status", &query.status),
            ("type", &query.resource_type),
            ("node", &query.node),
            ("q", &query.q),
        ] {
            if let Some(v) = given(v) {
                next.insert(k, v);
            }
        }
        next.insert("after", after.clone());
    }
    Ok(pages::environment(
        &signed_in,
        &env,
        &counts,
        &filter,
        &page.items,
        page.next_after.as_ref().map(|_| next),
    ))
}

#[derive(Deserialize)]
struct ResourceParams {
    id: String,
}

async fn resource(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Query(params): Query<ResourceParams>,
) -> Result<maud::Markup, PageError> {
    let signed_in = authorize(
        &app,
        &sessions,
        &headers,
        Method::GET,
        "/environments/{env}/resources/{id}",
        Some(&key),
    )
    .await?;
    allow(
        &signed_in.principal,
        Method::GET,
        "/environments/{env}/resources/{id}/actions",
        Some(&key),
    )?;
    let env = app.get(&key).await.map_err(refused)?;
    let state = app.resource_state(&env, &params.id).await.map_err(refused)?;
    let desired = app.desired_resource(&env, &params.id).await.map_err(refused)?;
    let actions = app.recent_actions(&env, &params.id, RECENT_ACTIONS).await.map_err(refused)?;
    Ok(pages::resource(&signed_in, &env, &state, desired.as_ref(), &actions))
}

/// What an environment's buttons do.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum EnvironmentAction {
    Deploy,
    Repair,
    Dryrun,
    Halt,
    Resume,
}

async fn environment_action(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path((key, action)): Path<(String, EnvironmentAction)>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, PageError> {
    use operations::Start;
    let csrf = form.csrf.as_deref();
    match action {
        EnvironmentAction::Deploy => operations::start(&app, &sessions, &headers, &key, csrf, Start::Deploy).await,
        EnvironmentAction::Repair => operations::start(&app, &sessions, &headers, &key, csrf, Start::Repair).await,
        EnvironmentAction::Dryrun => operations::start(&app, &sessions, &headers, &key, csrf, Start::Dryrun).await,
        EnvironmentAction::Halt => settings::halt_or_resume(&app, &sessions, &headers, &key, csrf, true).await,
        EnvironmentAction::Resume => settings::halt_or_resume(&app, &sessions, &headers, &key, csrf, false).await,
    }
}

/// Server-sent events for an environment's page: `changed` whenever the scheduler recorded a
/// batch of its events; the page then fetches itself again and swaps in what changed. Only the
/// fact is sent: what the page shows is read through the page's own route and rule.
async fn live(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Response, PageError> {
    use futures::StreamExt;
    let signed_in = authorize(&app, &sessions, &headers, Method::GET, "/environments/{env}/events", Some(&key)).await?;
    // Only that something changed: the page reads itself again, so nothing is queued for it.
    // On the owner, the count of batches its scheduler recorded; on another replica, the events
    // it reads as they are recorded, counted as they come.
    let changes = match app.subscribe(&key, crate::scheduler::subscribers::Want::Counts).await {
        Ok(subscription) => subscription
            .into_stream()
            .map(|delivery| match delivery {
                crate::scheduler::subscribers::Delivery::Changed(n) => n,
                _ => 1,
            })
            .boxed(),
        Err(crate::app::EnvError::Elsewhere { .. }) => {
            let followed = app.follow(&key, None).await.map_err(refused)?;
            tokio_stream::wrappers::ReceiverStream::new(followed)
                .ready_chunks(1024)
                .map(|c| c.len())
                .boxed()
        }
        Err(e) => return Err(refused(e)),
    };
    // It ends as the API's stream does when access is taken away, and when the session ends.
    let revoked = crate::api::events::revoked(app.clone(), signed_in.principal.clone(), key);
    let for_ended = app.clone();
    let ended = async move { sessions.ended(&for_ended, &signed_in).await };
    // A comment first: some browsers (Firefox) say the stream is open only once a byte of it
    // arrives, and a proxy may hold the headers until then too.
    let opened =
        futures::stream::once(async { Ok::<_, std::convert::Infallible>(axum::response::sse::Event::default().comment("following")) });
    let stream = opened
        .chain(
            changes.map(|n| Ok::<_, std::convert::Infallible>(axum::response::sse::Event::default().event("changed").data(n.to_string()))),
        )
        .take_until(async move {
            tokio::select! {
                () = revoked => {}
                () = ended => {}
            }
        });
    Ok(axum::response::sse::Sse::new(stream)
        .keep_alive(axum::response::sse::KeepAlive::new().interval(std::time::Duration::from_secs(15)))
        .into_response())
}

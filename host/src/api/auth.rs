//! Authentication, authorization and the audit trail, as one layer before every handler of
//! `/api/v1` and the registry's API. For each request it finds the route's rule
//! ([`access::rules`]), turns the bearer token into a [`Principal`] ([`App::authenticate`]),
//! decides ([`Principal::allows`]) — 401 `unauthorized` without a valid token, 403 `forbidden`
//! naming the missing role, 429 `rate_limited` past the token's request rate, 413 past the
//! environment's body limit — hands the principal to the handler ([`Caller`]) and, for a
//! state-changing request, writes who asked, what, when and the outcome to the audit trail.

use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState};
use crate::access::{Principal, Rule, rules};
use crate::app::App;
use crate::store::{AuditId, AuditRecord, UserId, now_ms};

/// The error code of an answer, for the audit trail (set by [`ApiError`]'s response).
#[derive(Debug, Clone)]
pub struct ErrorCode(pub std::borrow::Cow<'static, str>);

/// Who the audit trail names for a request that carried no token (signing in): set by its
/// handler on the answer.
#[derive(Debug, Clone)]
pub struct AuditSubject {
    /// `None`: the name was given, but no user was signed in (a failed attempt).
    pub user_id: Option<UserId>,
    pub user: String,
    pub token_id: Option<crate::store::TokenId>,
}

impl AuditSubject {
    /// A failed sign-in under `name` as given (bounded, and storable whatever it holds).
    pub fn attempted(name: &str) -> AuditSubject {
        let mut user = name.to_string();
        orc_runtime::bounded::storable(&mut user, 256);
        AuditSubject {
            user_id: None,
            user,
            token_id: None,
        }
    }
}

/// The address the request came from, when the transport told it (the accept loop does).
pub(crate) fn source_of(extensions: &axum::http::Extensions) -> Option<std::net::IpAddr> {
    extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| info.0.ip())
}

/// Extractor: the address the request came from, if known.
pub struct ClientAddress(pub Option<std::net::IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for ClientAddress {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<ClientAddress, std::convert::Infallible> {
        Ok(ClientAddress(source_of(&parts.extensions)))
    }
}

/// The caller of a request, as the authorization layer found it.
pub struct Caller(pub Arc<Principal>);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Caller, ApiError> {
        parts
            .extensions
            .get::<Arc<Principal>>()
            .cloned()
            .map(Caller)
            .ok_or_else(ApiError::unauthorized)
    }
}

/// The prefix the API is served under; rules name paths relative to it.
const API_PREFIX: &str = "/api/v1";

/// The layer of `/api/v1`: the rule is the matched route's.
pub(super) async fn authorize_api(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().strip_prefix(API_PREFIX).unwrap_or(m.as_str()).to_string())
        .unwrap_or_default();
    let rule = rules::rule(request.method(), &route);
    decide(&app, rule, route, request, next).await
}

/// The layer of the registry's API (`/registry`): reading is open, writing needs `publisher`.
pub(super) async fn authorize_registry(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let rule = rules::registry_rule(request.method());
    let route = format!("/registry{}", request.uri().path());
    decide(&app, Some(rule), route, request, next).await
}

async fn decide(app: &App, rule: Option<Rule>, route: String, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let changes = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
    if rule == Some(Rule::Open) && !changes {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let env = RawPathParams::from_request_parts(&mut parts, &())
        .await
        .ok()
        .and_then(|params| params.iter().find(|(name, _)| *name == "env").map(|(_, value)| value.to_string()));
    // What the audit trail stores of it: a decoded path segment may hold NUL, which
    // PostgreSQL's text refuses (the entry would be lost), and any length.
    let audited_env = env.clone().map(|mut e| {
        orc_runtime::bounded::storable(&mut e, 256);
        e
    });
    let path: String = parts.uri.path().chars().take(2048).collect();
    let source = source_of(&parts.extensions).map(|ip| ip.to_string());
    let token = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    // A request another replica relayed here: its caller, checked again by the token's hash
    // (revoked meanwhile: refused); counted and audited where it came in.
    let delegated = parts.extensions.remove::<super::commands::Delegated>();
    let found = match (&delegated, token) {
        (Some(d), _) => app.authenticate_hash(&d.credential).await,
        (None, Some(token)) => app.authenticate(token).await,
        (None, None) => Ok(None),
    };
    let principal = match found {
        Ok(p) => p,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let mut verdict = match (rule, &principal) {
        (None, _) => {
            tracing::error!(%method, route, "a route without an authorization rule was refused");
            Err(ApiError::forbidden(format!(
                "{method} {route} has no authorization rule; it is refused to everyone"
            )))
        }
        (Some(Rule::Open), _) => Ok(()),
        (Some(_), None) => Err(ApiError::unauthorized()),
        (Some(rule), Some(p)) => p.allows(rule, env.as_deref()).map_err(|f| ApiError::forbidden(f.message)),
    };
    if verdict.is_ok()
        && delegated.is_none()
        && let Some(p) = &principal
        && let Err(wait) = app.count_request(p)
    {
        verdict = Err(rate_limited(p, wait));
    }
    // An environment may narrow the host's body limit: a declared length over it is refused
    // now, an undeclared one while it is read.
    let has_body = has_body(&parts.headers);
    let mut body_limit = None;
    if verdict.is_ok()
        && has_body
        && let Some(env) = env.as_deref()
        && let Some(limit) = app.body_limit(env).await
    {
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|length| length > limit) {
            verdict = Err(too_large_for(env, limit));
        }
        body_limit = Some(limit);
    }
    let response = match verdict {
        Ok(()) => {
            if let Some(p) = &principal {
                parts.extensions.insert(p.clone());
            }
            let body = match body_limit {
                Some(limit) => axum::body::Body::new(http_body_util::Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX))),
                None => body,
            };
            // Another replica runs the environment: the request is relayed there.
            let relay_to = match (&env, &principal) {
                (Some(env), Some(_)) if delegated.is_none() && super::commands::relayed(&method, &route) => app.relay_target(env).await,
                _ => None,
            };
            match (relay_to, &env, &principal) {
                (Some(id), Some(env), Some(p)) => super::commands::relay(app, id, env, p, Request::from_parts(parts, body)).await,
                _ => next.run(Request::from_parts(parts, body)).await,
            }
        }
        Err(refusal) => {
            // The body stays unread, so hyper closes the connection after answering; saying so
            // keeps a client from picking the closing connection for its next request.
            let mut response = refusal.into_response();
            if has_body {
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            response
        }
    };
    if changes && delegated.is_none() {
        let subject = response.extensions().get::<AuditSubject>().cloned();
        let (user_id, user, token_id) = match (&principal, subject) {
            (Some(p), _) => (Some(p.user_id), Some(p.user.clone()), Some(p.token_id)),
            (None, Some(s)) => (s.user_id, Some(s.user), s.token_id),
            (None, None) => (None, None, None),
        };
        app.record_audit(AuditRecord {
            id: AuditId::new(),
            at: now_ms(),
            user_id,
            user,
            token_id,
            method: method.to_string(),
            route,
            path,
            environment: audited_env,
            status: response.status().as_u16(),
            code: response.extensions().get::<ErrorCode>().map(|c| c.0.to_string()),
            source,
        });
    }
    response
}

/// 429 `rate_limited`: `caller`'s token is past its request rate; `wait` seconds.
pub(crate) fn rate_limited(caller: &Principal, wait: u64) -> ApiError {
    ApiError::rate_limited(
        wait,
        format!(
            "token {} of user `{}` is past its request rate (`token_requests_per_s`)",
            caller.token_id, caller.user
        ),
    )
}

/// 413 `too_large`: a body over environment `env`'s `limits.max_body_bytes`.
pub(crate) fn too_large_for(env: &str, limit: u64) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("the request body is larger than environment `{env}` accepts (`limits.max_body_bytes`: {limit})"),
    )
}

/// Whether the request says it carries a body.
fn has_body(headers: &axum::http::HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING) || headers.get(header::CONTENT_LENGTH).is_some_and(|length| length.as_bytes() != b"0")
}

/// The token of an `Authorization: Bearer <token>` value; the scheme's name is case-insensitive
/// (RFC 7235).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

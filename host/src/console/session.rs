//! Console sessions: a browser signs in once (an API token, or a user's name and password) and
//! is given a session cookie; the server keeps what the cookie stands for.
//!
//! - The cookie holds a random secret (`orc_session`, `HttpOnly`, `SameSite=Strict`, `Secure`
//!   when the request came over TLS); the server keeps only its sha256, with the hash of the
//!   token the session acts with. Each request turns that token into a principal again
//!   ([`App::authenticate_hash`]), so a revoked token or a disabled user ends the session at once.
//! - Every state-changing request carries the session's CSRF secret in a form field, compared in
//!   constant time; a request whose `Origin` is not the console's own is refused first.
//! - Signing out removes the session on the server (the cookie is worthless from then on), and
//!   revokes the token a password sign-in made for it.
//! - Sessions are kept in the database: every replica knows each, and neither a restart nor a
//!   replica's loss signs anyone out.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use subtle::ConstantTimeEq as _;

use crate::access::Principal;
use crate::app::App;
use crate::app::new_secret;
use crate::store::{ConsoleSession, Millis, StoreError, hash_token, now_ms};

/// The cookie's name.
pub const COOKIE: &str = "orc_session";
/// How long a session lasts without being used.
const IDLE: Duration = Duration::from_secs(8 * 3600);
/// The most sessions kept; past it, the least recently used goes.
const MAX_SESSIONS: i64 = 10_000;
/// A session's use is written down at most this often (what idleness is judged by).
const TOUCH_EVERY: Millis = 60_000;
/// How often a page's event stream looks whether its session ended on another replica.
const ENDED_POLL: Duration = Duration::from_secs(5);

fn idle_ms() -> Millis {
    i64::try_from(IDLE.as_millis()).unwrap_or(i64::MAX)
}

/// A session as a request sees it.
#[derive(Clone)]
pub struct SignedIn {
    pub principal: Arc<Principal>,
    /// The CSRF secret every form of the page carries.
    pub csrf: String,
    key: String,
}

/// The sessions, kept in the database (every replica knows each); `ended` counts the sessions
/// ended here, so that what follows a session (a page's event stream) stops with it at once
/// (one ended on another replica is seen within [`ENDED_POLL`]).
#[derive(Default)]
pub struct Sessions(tokio::sync::watch::Sender<u64>);

/// Why a request is not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No session, or one that ended.
    SignedOut,
    /// The form's CSRF field is missing or wrong, or the request came from another origin.
    Forgery(&'static str),
}

impl Sessions {
    /// Starts a session acting with the token whose hash is `token_hash`; the cookie's value.
    pub async fn start(&self, app: &App, token_hash: String, own_token: Option<crate::store::TokenId>) -> Result<String, StoreError> {
        let secret = new_secret();
        let now = now_ms();
        let session = ConsoleSession {
            key: hash_token(&secret),
            token_hash,
            own_token,
            csrf: new_secret(),
            last_used: now,
        };
        app.start_console_session(&session, now - idle_ms(), MAX_SESSIONS).await?;
        Ok(secret)
    }

    /// The session of a request's cookie, its principal found again.
    pub async fn find(&self, app: &App, headers: &HeaderMap) -> Result<SignedIn, Refused> {
        let secret = cookie(headers, COOKIE).ok_or(Refused::SignedOut)?;
        let key = hash_token(&secret);
        let unreadable = |e: StoreError| {
            tracing::warn!(error = %orc_manifest::error_chain(&e), "cannot read a console session");
            Refused::SignedOut
        };
        let session = app.console_session(&key).await.map_err(unreadable)?.ok_or(Refused::SignedOut)?;
        let now = now_ms();
        if now - session.last_used > idle_ms() {
            let _ = app.end_console_session(&key).await;
            return Err(Refused::SignedOut);
        }
        if now - session.last_used > TOUCH_EVERY
            && let Err(e) = app.touch_console_session(&key, now).await
        {
            tracing::debug!(error = %orc_manifest::error_chain(&e), "cannot note a console session's use");
        }
        match app.authenticate_hash(&session.token_hash).await {
            Ok(Some(principal)) => Ok(SignedIn {
                principal,
                csrf: session.csrf,
                key,
            }),
            // The token was revoked or its user disabled: the session is over.
            Ok(None) => {
                let _ = app.end_console_session(&key).await;
                Err(Refused::SignedOut)
            }
            Err(e) => {
                tracing::warn!(error = %orc_manifest::error_chain(&e), "cannot check a console session's token");
                Err(Refused::SignedOut)
            }
        }
    }

    /// Completes once `signed_in`'s session has ended (signed out, here or on another replica).
    pub async fn ended(&self, app: &App, signed_in: &SignedIn) {
        let mut ends = self.0.subscribe();
        loop {
            if matches!(app.console_session(&signed_in.key).await, Ok(None)) {
                return;
            }
            let _ = tokio::time::timeout(ENDED_POLL, ends.changed()).await;
        }
    }

    /// Ends `signed_in`'s session; the token a password sign-in made for it is revoked.
    pub async fn end(&self, app: &App, signed_in: &SignedIn) {
        let removed = match app.end_console_session(&signed_in.key).await {
            Ok(removed) => removed,
            Err(e) => {
                tracing::warn!(error = %orc_manifest::error_chain(&e), "cannot end a console session");
                None
            }
        };
        self.0.send_modify(|n| *n += 1);
        if let Some(id) = removed.and_then(|s| s.own_token)
            && let Err(e) = app.delete_token(&signed_in.principal, &id).await
        {
            tracing::warn!(error = %orc_manifest::error_chain(&e), token = %id, "cannot revoke a console session's token");
        }
    }
}

impl SignedIn {
    /// Refuses a state-changing request whose form does not carry this session's CSRF secret.
    pub fn check_csrf(&self, field: Option<&str>) -> Result<(), Refused> {
        check_csrf(&self.csrf, field)
    }
}

fn check_csrf(expected: &str, field: Option<&str>) -> Result<(), Refused> {
    match field {
        Some(given) if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) => Ok(()),
        Some(_) => Err(Refused::Forgery("the form's CSRF field does not match this session")),
        None => Err(Refused::Forgery("the form carries no CSRF field")),
    }
}

/// Refuses a state-changing request sent from a page of another origin: browsers send `Origin`
/// with every cross-site POST. A request without it (some same-origin forms) passes on to the
/// CSRF field's check.
pub fn check_origin(headers: &HeaderMap) -> Result<(), Refused> {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return Ok(());
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let authority = origin.split_once("://").map(|(_, rest)| rest).unwrap_or(origin);
    if !host.is_empty() && authority.eq_ignore_ascii_case(host) {
        Ok(())
    } else {
        Err(Refused::Forgery("the request came from a page of another site"))
    }
}

/// The `Set-Cookie` value that hands a browser its session.
pub fn set_cookie(secret: &str, headers: &HeaderMap) -> HeaderValue {
    let secure = if crate::api::headers::over_tls(headers) { "; Secure" } else { "" };
    HeaderValue::from_str(&format!("{COOKIE}={secret}; Path=/; HttpOnly; SameSite=Strict{secure}")).expect("a cookie is ASCII")
}

/// The `Set-Cookie` value that takes it away.
pub fn clear_cookie(headers: &HeaderMap) -> HeaderValue {
    let secure = if crate::api::headers::over_tls(headers) { "; Secure" } else { "" };
    HeaderValue::from_str(&format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}")).expect("a cookie is ASCII")
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let h = headers(&[("cookie", "a=1; orc_session=s3cret; b=2")]);
        assert_eq!(cookie(&h, COOKIE).as_deref(), Some("s3cret"));
        assert_eq!(cookie(&headers(&[("cookie", "orc_session=")]), COOKIE), None);
        assert_eq!(cookie(&headers(&[("cookie", "xorc_session=1")]), COOKIE), None);
    }

    #[test]
    fn another_origin_is_refused_and_the_own_one_passes() {
        assert!(check_origin(&headers(&[("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:8080")])).is_ok());
        assert!(check_origin(&headers(&[("host", "127.0.0.1:8080")])).is_ok());
        assert!(check_origin(&headers(&[("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:9999")])).is_err());
        assert!(check_origin(&headers(&[("host", "127.0.0.1:8080"), ("origin", "null")])).is_err());
    }

    #[test]
    fn the_cookie_is_http_only_and_strict_and_secure_behind_tls() {
        let plain = set_cookie("x", &HeaderMap::new());
        assert_eq!(plain, "orc_session=x; Path=/; HttpOnly; SameSite=Strict");
        let tls = set_cookie("x", &headers(&[("x-forwarded-proto", "https")]));
        assert!(tls.to_str().unwrap().ends_with("; Secure"));
    }

    #[test]
    fn csrf_fields_are_compared_whole() {
        assert!(check_csrf("abc", Some("abc")).is_ok());
        assert!(check_csrf("abc", Some("ab")).is_err());
        assert!(check_csrf("abc", Some("abd")).is_err());
        assert!(check_csrf("abc", Some("")).is_err());
        assert!(check_csrf("abc", None).is_err());
    }
}

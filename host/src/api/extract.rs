//! Extractors whose rejections are [`ApiError`]s, so every refusal has the same `{code, message}`
//! shape: a request body (413 `too_large` past the limit), a JSON body (415
//! `unsupported_media_type` unless `Content-Type` says JSON, then 400 `invalid_json` naming the
//! problem), path and query parameters (400 `invalid_path`, `invalid_query`). The one place
//! where a body is checked to be JSON: every endpoint taking one uses [`Json`], [`JsonBytes`] or
//! [`OptionalJson`].

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// The raw request body, within the size limit.
pub(crate) struct Body(pub(crate) Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Body, ApiError> {
        Bytes::from_request(req, state).await.map(Body).map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                too_large()
            } else {
                ApiError::bad_request("invalid_body", e.body_text())
            }
        })
    }
}

/// 413 `too_large`: a body past the limit (the host's, or the environment's).
pub(crate) fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        "the request body is larger than this host accepts (`max_body_bytes`)",
    )
}

/// Whether `Content-Type` says JSON: `application/json` or `application/<anything>+json`, with
/// any parameters (`; charset=utf-8`), in any case.
fn says_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence
        .strip_prefix("application/")
        .is_some_and(|subtype| subtype == "json" || subtype.ends_with("+json"))
}

/// 415 unless the request says its body is JSON.
fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    if says_json(headers) {
        return Ok(());
    }
    let got = match headers.get(header::CONTENT_TYPE) {
        Some(value) => format!(
            "`Content-Type: {}`",
            String::from_utf8_lossy(value.as_bytes()).chars().take(100).collect::<String>()
        ),
        None => "no `Content-Type`".to_string(),
    };
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        format!("the body must be JSON (`Content-Type: application/json`); the request has {got}"),
    ))
}

/// Every body this API decodes as a whole is an object (or `null` where optional), never an
/// array: serde would take a struct from an array of its fields, which the document does not
/// allow.
fn refuse_array(bytes: &[u8]) -> Result<(), ApiError> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ApiError::bad_request(
            "invalid_json",
            "the body must be a JSON object, not an array",
        ));
    }
    Ok(())
}

fn invalid_json(e: &serde_json::Error) -> ApiError {
    ApiError::bad_request("invalid_json", format!("the body is not valid JSON for this request: {e}"))
}

/// A JSON request body.
pub struct Json<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Json<T>, ApiError> {
        let JsonBytes(bytes) = JsonBytes::from_request(req, state).await?;
        refuse_array(&bytes)?;
        serde_json::from_slice(&bytes).map(Json).map_err(|e| invalid_json(&e))
    }
}

/// The bytes of a body that says it is JSON, for a handler that decodes it further on (an intent:
/// its own errors name the resource).
pub struct JsonBytes(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<JsonBytes, ApiError> {
        require_json(req.headers())?;
        let Body(bytes) = Body::from_request(req, state).await?;
        Ok(JsonBytes(bytes))
    }
}

/// An optional JSON body: none (no bytes, whatever the `Content-Type`) and JSON `null` are
/// `None`; anything else — whitespace alone too, which is not a JSON text — must say it is JSON
/// and decode as `T`.
pub struct OptionalJson<T>(pub Option<T>);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<OptionalJson<T>, ApiError> {
        let headers = req.headers().clone();
        let Body(bytes) = Body::from_request(req, state).await?;
        if bytes.is_empty() {
            return Ok(OptionalJson(None));
        }
        require_json(&headers)?;
        refuse_array(&bytes)?;
        serde_json::from_slice::<Option<T>>(&bytes)
            .map(OptionalJson)
            .map_err(|e| invalid_json(&e))
    }
}

/// Path parameters.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Path<T>, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Path(p.0))
            .map_err(|e| ApiError::bad_request("invalid_path", e.body_text()))
    }
}

/// Query parameters.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Query<T>, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))
    }
}

/// A bounded query parameter: `None` when absent, else within `min..=max` or refused with 400
/// `invalid_query` naming it — never clamped, so the server does what its document says.
pub fn bounded(name: &str, value: Option<u32>, min: u32, max: u32) -> Result<Option<u32>, ApiError> {
    match value {
        Some(v) if !(min..=max).contains(&v) => Err(ApiError::bad_request(
            "invalid_query",
            format!("`{name}` must be {min}–{max}; got {v}"),
        )),
        _ => Ok(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(content_type: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, content_type.parse().unwrap());
        headers
    }

    #[test]
    fn json_is_recognised_by_its_media_type_alone() {
        for yes in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/merge-patch+json",
        ] {
            assert!(says_json(&with(yes)), "{yes}");
        }
        for no in ["text/plain", "application/x-www-form-urlencoded", "application/jsonx", "json", ""] {
            assert!(!says_json(&with(no)), "{no}");
        }
        assert!(!says_json(&HeaderMap::new()));
    }

    #[test]
    fn a_bound_is_checked_not_clamped() {
        assert_eq!(bounded("limit", None, 1, 10).unwrap(), None);
        assert_eq!(bounded("limit", Some(10), 1, 10).unwrap(), Some(10));
        for outside in [0, 11] {
            let e = bounded("limit", Some(outside), 1, 10).unwrap_err();
            assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "invalid_query"));
            assert!(e.message.contains("`limit`"), "{}", e.message);
        }
    }
}

//! `ETag` and `If-Match`: every editable object's answer carries its version as an `ETag`
//! (a process's revision, a template's latest version, a digest of an environment's settings),
//! and a change sent with an `If-Match` naming another is refused by the application with 409
//! `version_conflict`. Without `If-Match` a change applies as it always did.

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};

/// The request's `If-Match`, as text (a value that is not text matches nothing).
pub(super) fn if_match(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::IF_MATCH).map(|v| v.to_str().unwrap_or("\u{fffd}"))
}

/// The `ETag` header for `tag`.
pub(super) fn etag(tag: impl std::fmt::Display) -> [(HeaderName, HeaderValue); 1] {
    let value = HeaderValue::from_str(&format!("\"{tag}\"")).expect("a tag is a header value");
    [(header::ETAG, value)]
}

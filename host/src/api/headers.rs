//! Security headers on every answer, the console's pages and the API's alike: a content security
//! policy that runs only the console's own script and stylesheet (no inline script; inline
//! `style` attributes only, which the pages' bars and graphs are drawn with), lets no page frame
//! any of them (`frame-ancestors 'none'`, and `X-Frame-Options: DENY` for browsers older than
//! CSP 2), `nosniff`, a referrer kept to the console's own origin (`same-origin`: the origin
//! check of its forms needs their `Origin`), and HSTS when a proxy in front says the browser
//! came over TLS (a browser ignores HSTS over plain HTTP anyway).

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

/// The content security policy of every answer.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     style-src-attr 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'";

/// HSTS for a year (sent only over TLS).
pub const STRICT_TRANSPORT_SECURITY: &str = "max-age=31536000";

/// Middleware: sets the headers on every answer.
pub async fn security_headers(request: Request, next: Next) -> Response {
    let tls = over_tls(request.headers());
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    if tls {
        headers.insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static(STRICT_TRANSPORT_SECURITY),
        );
    }
    response
}

/// Whether the client reached the host over TLS: orc-host serves plain HTTP, so only a proxy in
/// front can say so (`X-Forwarded-Proto: https`).
pub fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

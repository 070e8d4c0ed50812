//! Outgoing HTTP, only to the hosts the environment's policy allows (capability `http`).
//!
//! Credentials stay with the host: name a secret with [`Request::secret`] and the host injects
//! it as the `Authorization` header.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::http as wit;
use crate::{Error, Result};

/// An HTTP request, built step by step.
///
/// ```
/// use orc_sdk::http::Request;
/// let req = Request::post("https://api.example.net/v1/objects")
///     .json(&serde_json::json!({"name": "web1"}))
///     .unwrap()
///     .secret("example-api-token")
///     .timeout(std::time::Duration::from_secs(10));
/// assert_eq!(req.header_value("content-type"), Some("application/json"));
/// ```
#[derive(Debug, Clone)]
pub struct Request {
    inner: wit::Request,
}

impl Request {
    pub fn new(method: impl Into<String>, url: impl Into<String>) -> Self {
        Request {
            inner: wit::Request {
                method: method.into(),
                url: url.into(),
                headers: Vec::new(),
                body: None,
                secret: None,
                timeout_ms: None,
            },
        }
    }

    pub fn get(url: impl Into<String>) -> Self {
        Request::new("GET", url)
    }

    pub fn post(url: impl Into<String>) -> Self {
        Request::new("POST", url)
    }

    pub fn put(url: impl Into<String>) -> Self {
        Request::new("PUT", url)
    }

    pub fn patch(url: impl Into<String>) -> Self {
        Request::new("PATCH", url)
    }

    pub fn delete(url: impl Into<String>) -> Self {
        Request::new("DELETE", url)
    }

    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.inner.headers.push((name.into(), value.into()));
        self
    }

    #[must_use]
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.inner.body = Some(body.into());
        self
    }

    /// Sets a JSON body and `content-type: application/json`.
    pub fn json<T: Serialize + ?Sized>(self, value: &T) -> Result<Self> {
        let body = serde_json::to_vec(value).map_err(|e| Error::invalid(format!("cannot encode the request body as JSON: {e}")))?;
        Ok(self.header("content-type", "application/json").body(body))
    }

    /// The name of a host-held secret to send as the `Authorization` header.
    #[must_use]
    pub fn secret(mut self, name: impl Into<String>) -> Self {
        self.inner.secret = Some(name.into());
        self
    }

    /// Gives up after this long (millisecond precision); the host's default otherwise.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.inner.timeout_ms = Some(u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX));
        self
    }

    pub fn method(&self) -> &str {
        &self.inner.method
    }

    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The first header named `name` (case-insensitive).
    pub fn header_value(&self, name: &str) -> Option<&str> {
        find_header(&self.inner.headers, name)
    }
}

/// A response, whatever its status; see [`Response::check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Decodes the JSON body; a body that does not decode is a `permanent` error.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.body).map_err(|e| Error::permanent(format!("response body is not the expected JSON: {e}")))
    }

    /// `Ok(self)` for a 2xx status. Otherwise an error naming the status and the start of the
    /// body: `retryable` for 408, 429 and 5xx, `unavailable` for 502-504, `permanent` otherwise.
    pub fn check(self) -> Result<Response> {
        if self.is_success() {
            return Ok(self);
        }
        let text = self.text();
        let mut start: String = text.trim().chars().take(512).collect();
        if start.len() < text.trim().len() {
            start.push_str("...");
        }
        let message = if start.is_empty() {
            format!("HTTP {}", self.status)
        } else {
            format!("HTTP {}: {start}", self.status)
        };
        Err(match self.status {
            502..=504 => Error::unavailable(message),
            408 | 429 | 500..=599 => Error::retryable(message),
            _ => Error::permanent(message),
        })
    }
}

fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// Sends the request and waits for the response. Errors are the host's: `denied` for an address
/// the policy does not allow, `unavailable` when the server cannot be reached.
pub fn send(request: &Request) -> Result<Response> {
    let r = wit::send(&request.inner)?;
    Ok(Response {
        status: r.status,
        headers: r.headers,
        body: r.body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn response(status: u16, body: &str) -> Response {
        Response {
            status,
            headers: vec![("Content-Type".into(), "text/plain".into())],
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn check_maps_statuses_to_kinds() {
        assert!(response(204, "").check().is_ok());
        let e = response(404, "no such object\n").check().unwrap_err();
        assert_eq!((e.kind(), e.message()), (ErrorKind::Permanent, "HTTP 404: no such object"));
        assert_eq!(response(503, "").check().unwrap_err().kind(), ErrorKind::Unavailable);
        assert_eq!(response(429, "").check().unwrap_err().message(), "HTTP 429");
        assert_eq!(response(500, "").check().unwrap_err().kind(), ErrorKind::Retryable);
        let long = "x".repeat(600);
        assert!(response(400, &long).check().unwrap_err().message().ends_with("x..."));
    }

    #[test]
    fn headers_are_case_insensitive() {
        assert_eq!(response(200, "").header("content-type"), Some("text/plain"));
        assert_eq!(Request::get("http://x/").header("Accept", "a").header_value("accept"), Some("a"));
    }
}

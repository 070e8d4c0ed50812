//! `orc:plugin/http`: outgoing HTTP, only to origins the environment's policy allows. The origin
//! (scheme, host, port) of every request is checked before any connection is made, redirects are
//! not followed (a redirect could leave the allowed origins), responses are capped in size, and a
//! plugin names a secret that the host injects as the `Authorization` header, so the plugin never
//! holds its value.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;

use crate::bindings::host::orc::plugin::http::{Host, Request, Response};
use crate::bindings::host::orc::plugin::types::{Error, ErrorKind};
use crate::capability::wit_error;
use crate::state::CallState;

/// An allowed origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

impl Origin {
    /// Parses `http://host:port` (the port defaults by scheme).
    pub fn parse(text: &str) -> Result<Origin, String> {
        let url = reqwest::Url::parse(text).map_err(|e| format!("`{text}` is not a URL: {e}"))?;
        origin_of(&url).ok_or_else(|| format!("`{text}` has no host or an unsupported scheme"))
    }
}

fn origin_of(url: &reqwest::Url) -> Option<Origin> {
    let scheme = url.scheme();
    if scheme != "http" && scheme != "https" {
        return None;
    }
    Some(Origin {
        scheme: scheme.to_string(),
        host: url.host_str()?.to_ascii_lowercase(),
        port: url.port_or_known_default()?,
    })
}

/// What an environment allows.
#[derive(Debug, Clone)]
pub struct HttpPolicy {
    pub allowed: Vec<Origin>,
    /// Secret name → `Authorization` header value.
    pub secrets: HashMap<String, String>,
    pub timeout: Duration,
    pub max_response_bytes: usize,
}

impl Default for HttpPolicy {
    fn default() -> Self {
        HttpPolicy {
            allowed: Vec::new(),
            secrets: HashMap::new(),
            timeout: Duration::from_secs(30),
            max_response_bytes: 16 << 20,
        }
    }
}

/// A policy and the client that enforces it.
#[derive(Debug)]
pub struct HttpAccess {
    policy: HttpPolicy,
    client: Option<reqwest::Client>,
}

impl HttpAccess {
    /// Refuses every request.
    pub fn deny_all() -> HttpAccess {
        HttpAccess {
            policy: HttpPolicy::default(),
            client: None,
        }
    }

    pub fn new(policy: HttpPolicy) -> Result<HttpAccess, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(policy.timeout)
            .no_proxy()
            .build()
            .map_err(|e| format!("cannot build HTTP client: {e}"))?;
        Ok(HttpAccess {
            policy,
            client: Some(client),
        })
    }

    /// Checks the request against the policy; the error names the refused origin or secret.
    fn check(&self, url: &reqwest::Url, secret: Option<&str>) -> Result<Option<String>, Error> {
        let origin =
            origin_of(url).ok_or_else(|| wit_error(ErrorKind::InvalidInput, format!("`{url}` is not an http(s) URL with a host")))?;
        if !self.policy.allowed.contains(&origin) {
            return Err(wit_error(
                ErrorKind::Denied,
                format!(
                    "outgoing HTTP to {}://{}:{} is not allowed by this environment's policy",
                    origin.scheme, origin.host, origin.port
                ),
            ));
        }
        match secret {
            None => Ok(None),
            Some(name) => self
                .policy
                .secrets
                .get(name)
                .cloned()
                .map(Some)
                .ok_or_else(|| wit_error(ErrorKind::Denied, format!("secret `{name}` is not defined for this environment"))),
        }
    }
}

impl Host for CallState {
    async fn send(&mut self, request: Request) -> Result<Response, Error> {
        let access = self.ctx.http.clone();
        let url = reqwest::Url::parse(&request.url)
            .map_err(|e| wit_error(ErrorKind::InvalidInput, format!("`{}` is not a URL: {e}", request.url)))?;
        let secret = access.check(&url, request.secret.as_deref())?;
        let client = access
            .client
            .as_ref()
            .ok_or_else(|| wit_error(ErrorKind::Denied, "outgoing HTTP is not allowed"))?;
        let method = reqwest::Method::from_bytes(request.method.as_bytes())
            .map_err(|_| wit_error(ErrorKind::InvalidInput, format!("`{}` is not an HTTP method", request.method)))?;
        let mut builder = client.request(method, url.clone());
        for (k, v) in &request.headers {
            if k.eq_ignore_ascii_case("authorization") && secret.is_some() {
                continue;
            }
            builder = builder.header(k, v);
        }
        if let Some(value) = secret {
            builder = builder.header(reqwest::header::AUTHORIZATION, value);
        }
        if let Some(body) = request.body {
            builder = builder.body(body);
        }
        if let Some(ms) = request.timeout_ms {
            builder = builder.timeout(Duration::from_millis(ms.into()));
        }
        let response = builder.send().await.map_err(|e| {
            let kind = if e.is_connect() || e.is_timeout() {
                ErrorKind::Unavailable
            } else {
                ErrorKind::Retryable
            };
            wit_error(kind, format!("{} {}: {e}", request.method, url))
        })?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_string(), v.to_string())))
            .collect();
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| wit_error(ErrorKind::Retryable, format!("reading the response of {url}: {e}")))?;
            if body.len() + chunk.len() > access.policy.max_response_bytes {
                return Err(wit_error(
                    ErrorKind::Permanent,
                    format!("the response of {url} exceeds {} bytes", access.policy.max_response_bytes),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Response { status, headers, body })
    }
}

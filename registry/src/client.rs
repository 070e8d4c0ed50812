//! The HTTP client of a remote registry: publish, upload and fetch blobs (verifying every byte
//! fetched), resolve and list plugins. Error bodies become the matching [`RegistryError`].

use std::time::Duration;

use bytes::Bytes;
use orc_manifest::Digest;
use reqwest::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::{ErrorBody, RegistryError, Result};
use crate::services::{PublishedService, ServiceEntry, check_service_name};
use crate::source::{BlobSource, BoxFuture};
use crate::store::{Entry, Published, check_name, check_version};

/// How long a single request may take end to end (a 64 MiB upload on a slow link fits).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A remote registry at a base URL (`http://host:port` or `…/registry` when served by the host).
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    /// Sent as `Authorization: Bearer …` (a registry served by `orc-host` wants it to publish).
    token: Option<String>,
}

/// The answer to a blob upload, as the service sends it.
#[derive(serde::Deserialize)]
struct Receipt {
    digest: Digest,
    created: bool,
}

impl Client {
    pub fn new(base_url: &str) -> Result<Client> {
        // One provider per process; a second install (by the host, another client) is a no-op.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("orc-registry/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|source| RegistryError::Http {
                url: base_url.to_string(),
                source,
            })?;
        Client::with_http(base_url, http)
    }

    /// A client over an existing `reqwest::Client` (shared connection pool, custom TLS roots).
    pub fn with_http(base_url: &str, http: reqwest::Client) -> Result<Client> {
        let url = reqwest::Url::parse(base_url).map_err(|e| RegistryError::Unsupported(format!("`{base_url}` is not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(RegistryError::Unsupported(format!(
                "registry URL `{base_url}` must be http:// or https://"
            )));
        }
        Ok(Client {
            http,
            base: base_url.trim_end_matches('/').to_string(),
            token: None,
        })
    }

    /// Sends `token` as a bearer token with every request.
    pub fn with_token(mut self, token: impl Into<String>) -> Client {
        self.token = Some(token.into());
        self
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Publishes a plugin component. `created` is false when the same bytes were already there.
    pub async fn publish(&self, bytes: impl Into<Bytes>) -> Result<Published> {
        let url = self.url("/v1/plugins");
        let response = self
            .send(
                &url,
                self.http.post(&url).header("content-type", "application/wasm").body(bytes.into()),
            )
            .await?;
        let created = response.status() == StatusCode::CREATED;
        let entry: Entry = json(&url, response).await?;
        Ok(Published { entry, created })
    }

    /// Uploads a blob under its own digest.
    pub async fn put_blob(&self, bytes: impl Into<Bytes>) -> Result<(Digest, bool)> {
        let bytes = bytes.into();
        let digest = Digest::of(&bytes);
        self.put_blob_expecting(bytes, &digest).await
    }

    /// Uploads bytes that the server must find to hash to `digest`.
    pub async fn put_blob_expecting(&self, bytes: impl Into<Bytes>, digest: &Digest) -> Result<(Digest, bool)> {
        let url = self.url(&format!("/v1/blobs/{digest}"));
        let response = self
            .send(
                &url,
                self.http.put(&url).header("content-type", "application/wasm").body(bytes.into()),
            )
            .await?;
        let receipt: Receipt = json(&url, response).await?;
        if receipt.digest != *digest {
            return Err(RegistryError::DigestMismatch {
                expected: *digest,
                actual: receipt.digest,
            });
        }
        Ok((receipt.digest, receipt.created))
    }

    /// The bytes of `digest`, refused unless they hash to it.
    pub async fn fetch(&self, digest: &Digest) -> Result<Vec<u8>> {
        let url = self.url(&format!("/v1/blobs/{digest}"));
        let response = self.send(&url, self.http.get(&url)).await?;
        let body = response
            .bytes()
            .await
            .map_err(|source| RegistryError::Http { url: url.clone(), source })?;
        let actual = Digest::of(&body);
        if actual != *digest {
            tracing::error!(%url, expected = %digest, %actual, "registry sent bytes that do not match their digest");
            return Err(RegistryError::DigestMismatch { expected: *digest, actual });
        }
        Ok(body.to_vec())
    }

    /// Whether the registry holds a good copy of `digest` (it verifies the blob to answer).
    pub async fn has_blob(&self, digest: &Digest) -> Result<bool> {
        let url = self.url(&format!("/v1/blobs/{digest}"));
        match self.send(&url, self.http.head(&url)).await {
            Ok(_) => Ok(true),
            Err(RegistryError::UnknownDigest(_)) => Ok(false),
            Err(RegistryError::Remote { status: 404, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub async fn resolve(&self, name: &str, version: &str) -> Result<Entry> {
        // Validated here too: a name is a URL path segment.
        check_name(name)?;
        check_version(version)?;
        let url = self.url(&format!("/v1/plugins/{name}/{version}"));
        json(&url, self.send(&url, self.http.get(&url)).await?).await
    }

    pub async fn versions(&self, name: &str) -> Result<Vec<Entry>> {
        check_name(name)?;
        let url = self.url(&format!("/v1/plugins/{name}"));
        json(&url, self.send(&url, self.http.get(&url)).await?).await
    }

    pub async fn list(&self) -> Result<Vec<Entry>> {
        let url = self.url("/v1/plugins");
        json(&url, self.send(&url, self.http.get(&url)).await?).await
    }

    /// Publishes a service version from its JSON document.
    pub async fn publish_service(&self, bytes: impl Into<Bytes>) -> Result<PublishedService> {
        let url = self.url("/v1/services");
        let response = self
            .send(
                &url,
                self.http.post(&url).header("content-type", "application/json").body(bytes.into()),
            )
            .await?;
        let created = response.status() == StatusCode::CREATED;
        let entry: ServiceEntry = json(&url, response).await?;
        Ok(PublishedService { entry, created })
    }

    pub async fn resolve_service(&self, name: &str, version: &str) -> Result<ServiceEntry> {
        check_service_name(name)?;
        check_version(version)?;
        let url = self.url(&format!("/v1/services/{name}/{version}"));
        json(&url, self.send(&url, self.http.get(&url)).await?).await
    }

    pub async fn service_versions(&self, name: &str) -> Result<Vec<ServiceEntry>> {
        check_service_name(name)?;
        let url = self.url(&format!("/v1/services/{name}"));
        json(&url, self.send(&url, self.http.get(&url)).await?).await
    }

    pub async fn list_services(&self) -> Result<Vec<ServiceEntry>> {
        let url = self.url("/v1/services");
        json(&url, self.send(&url, self.http.get(&url)).await?).await
    }

    /// Sends a request; a non-2xx answer becomes the error its body describes.
    async fn send(&self, url: &str, request: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request.send().await.map_err(|source| RegistryError::Http {
            url: url.to_string(),
            source,
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let text = response.text().await.unwrap_or_default();
        let err = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => body.into_error(status.as_u16()),
            Err(_) => RegistryError::Remote {
                status: status.as_u16(),
                code: format!("http_{}", status.as_u16()),
                message: if text.is_empty() {
                    status.canonical_reason().unwrap_or("error").to_string()
                } else {
                    text.chars().take(500).collect()
                },
            },
        };
        tracing::debug!(%url, %status, error = %err, "registry refused a request");
        Err(err)
    }
}

async fn json<T: DeserializeOwned>(url: &str, response: reqwest::Response) -> Result<T> {
    let status = response.status().as_u16();
    let body = response.bytes().await.map_err(|source| RegistryError::Http {
        url: url.to_string(),
        source,
    })?;
    serde_json::from_slice(&body).map_err(|e| RegistryError::Remote {
        status,
        code: "bad_response".into(),
        message: format!("{url} answered with JSON this client cannot read: {e}"),
    })
}

impl BlobSource for Client {
    fn fetch<'a>(&'a self, digest: &'a Digest) -> BoxFuture<'a, Result<Vec<u8>, RegistryError>> {
        Box::pin(Client::fetch(self, digest))
    }
}

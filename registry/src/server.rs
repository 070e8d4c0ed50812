//! The registry's HTTP service over a [`Store`]: an axum router the host nests under `/registry`
//! and the standalone `orc-registry` binary serves at `/`.
//!
//! Routes (all JSON except blob bodies, which are `application/wasm`):
//! - `GET  /v1/plugins` — every entry; `POST /v1/plugins` — publish a component (201 new, 200 same bytes again);
//! - `GET  /v1/plugins/{name}` — its versions; `GET /v1/plugins/{name}/{version}` — one entry;
//! - `GET  /v1/services` — every service version; `POST /v1/services` — publish a service document
//!   (JSON; 201 new, 200 same bytes again);
//! - `GET  /v1/services/{name}` — its versions; `GET /v1/services/{name}/{version}` — one entry (the
//!   document itself is the blob its `digest` names);
//! - `PUT  /v1/blobs/{digest}` — store bytes that must hash to `digest` (201 new, 200 present);
//! - `GET|HEAD /v1/blobs/{digest}` — the bytes, verified on every read.
//!
//! Errors are `{code, message}` (see [`ErrorBody`]); internal detail goes to the log only.

use std::pin::Pin;

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use orc_manifest::Digest;
use serde::{Deserialize, Serialize};

use crate::error::{ErrorBody, RegistryError, parse_digest};
use crate::services::{ServiceEntry, check_service_name};
use crate::source::blocking;
use crate::store::{Entry, Store, check_name, check_version};

/// The answer to `PUT /v1/blobs/{digest}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobReceipt {
    pub digest: Digest,
    pub size: u64,
    pub created: bool,
}

/// The registry's routes with `store` as their state.
pub fn router(store: Store) -> Router {
    Router::new()
        .route("/v1/plugins", get(list).post(publish))
        .route("/v1/plugins/{name}", get(versions))
        .route("/v1/plugins/{name}/{version}", get(resolve))
        .route("/v1/services", get(list_services).post(publish_service))
        .route("/v1/services/{name}", get(service_versions))
        .route("/v1/services/{name}/{version}", get(resolve_service))
        .route("/v1/blobs/{digest}", get(get_blob).put(put_blob))
        .fallback(not_found)
        // Bodies are read by `read_body` against the store's own limit, so an oversized upload
        // gets a JSON `too_large` rather than axum's plain-text rejection.
        .layer(DefaultBodyLimit::disable())
        .with_state(store)
}

/// An error response: the status and the body a client sees. Built from a [`RegistryError`],
/// logging what the client is not told.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            body: ErrorBody::new(code, message),
        }
    }
}

/// The HTTP status for a registry error.
pub fn status_of(err: &RegistryError) -> StatusCode {
    match err {
        RegistryError::NotFound { .. } | RegistryError::UnknownDigest(_) => StatusCode::NOT_FOUND,
        RegistryError::DigestMismatch { .. }
        | RegistryError::InvalidPlugin(_)
        | RegistryError::InvalidService { .. }
        | RegistryError::InvalidName(_)
        | RegistryError::InvalidDigest(_) => StatusCode::BAD_REQUEST,
        RegistryError::VersionTaken { .. } => StatusCode::CONFLICT,
        RegistryError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        RegistryError::Remote { .. } => StatusCode::BAD_GATEWAY,
        #[cfg(feature = "client")]
        RegistryError::Http { .. } => StatusCode::BAD_GATEWAY,
        RegistryError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        RegistryError::Corrupt { .. } | RegistryError::IndexCorrupt { .. } | RegistryError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<RegistryError> for ApiError {
    fn from(err: RegistryError) -> ApiError {
        let status = status_of(&err);
        if status.is_server_error() {
            tracing::error!(code = err.code(), error = %orc_manifest::error_chain(&err), "registry request failed");
        } else {
            tracing::debug!(code = err.code(), error = %err, "registry request refused");
        }
        ApiError {
            status,
            body: ErrorBody::from_error(&err),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such registry route")
}

async fn list(State(store): State<Store>) -> ApiResult<Json<Vec<Entry>>> {
    Ok(Json(blocking(&store, |s| s.list()).await?))
}

async fn versions(State(store): State<Store>, Path(name): Path<String>) -> ApiResult<Json<Vec<Entry>>> {
    check_name(&name)?;
    Ok(Json(blocking(&store, move |s| s.versions(&name)).await?))
}

async fn resolve(State(store): State<Store>, Path((name, version)): Path<(String, String)>) -> ApiResult<Json<Entry>> {
    check_name(&name)?;
    check_version(&version)?;
    Ok(Json(blocking(&store, move |s| s.resolve(&name, &version)).await?))
}

async fn publish(State(store): State<Store>, headers: HeaderMap, body: Body) -> ApiResult<(StatusCode, Json<Entry>)> {
    let bytes = read_body(&headers, body, store.max_blob_size()).await?;
    let published = blocking(&store, move |s| s.publish(&bytes)).await?;
    let status = if published.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(published.entry)))
}

async fn list_services(State(store): State<Store>) -> ApiResult<Json<Vec<ServiceEntry>>> {
    Ok(Json(blocking(&store, |s| s.list_services()).await?))
}

async fn service_versions(State(store): State<Store>, Path(name): Path<String>) -> ApiResult<Json<Vec<ServiceEntry>>> {
    check_service_name(&name)?;
    Ok(Json(blocking(&store, move |s| s.service_versions(&name)).await?))
}

async fn resolve_service(State(store): State<Store>, Path((name, version)): Path<(String, String)>) -> ApiResult<Json<ServiceEntry>> {
    check_service_name(&name)?;
    check_version(&version)?;
    Ok(Json(blocking(&store, move |s| s.resolve_service(&name, &version)).await?))
}

async fn publish_service(State(store): State<Store>, headers: HeaderMap, body: Body) -> ApiResult<(StatusCode, Json<ServiceEntry>)> {
    let bytes = read_body(&headers, body, store.max_blob_size()).await?;
    let published = blocking(&store, move |s| s.publish_service(&bytes)).await?;
    let status = if published.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(published.entry)))
}

async fn put_blob(
    State(store): State<Store>,
    Path(digest): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, Json<BlobReceipt>)> {
    let digest = parse_digest(&digest)?;
    let bytes = read_body(&headers, body, store.max_blob_size()).await?;
    let size = bytes.len() as u64;
    let (digest, created) = blocking(&store, move |s| s.put_blob_expecting(&bytes, &digest)).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(BlobReceipt { digest, size, created })))
}

/// Serves GET and, through axum's automatic HEAD handling, HEAD (same status and headers, no body).
async fn get_blob(State(store): State<Store>, Path(digest): Path<String>) -> ApiResult<Response> {
    let digest = parse_digest(&digest)?;
    let bytes = blocking(&store, move |s| s.get_blob(&digest)).await?;
    let mut response = Bytes::from(bytes).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/wasm"));
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{digest}\"")) {
        headers.insert(header::ETAG, etag);
    }
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    Ok(response)
}

/// Reads a request body of at most `limit` bytes. A declared `Content-Length` over the limit is
/// refused before reading anything.
async fn read_body(headers: &HeaderMap, mut body: Body, limit: u64) -> ApiResult<Vec<u8>> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(size) = declared
        && size > limit
    {
        return Err(RegistryError::TooLarge { size, limit }.into());
    }
    let mut out = Vec::with_capacity(declared.unwrap_or(0) as usize);
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => return Ok(out),
            Some(Err(e)) => {
                tracing::debug!(error = %e, "request body could not be read");
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_body",
                    format!("the request body could not be read: {e}"),
                ));
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    let size = (out.len() + data.len()) as u64;
                    if size > limit {
                        return Err(RegistryError::TooLarge { size, limit }.into());
                    }
                    out.extend_from_slice(&data);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_a_status_matching_its_class() {
        let d = Digest::of(b"x");
        assert_eq!(status_of(&RegistryError::UnknownDigest(d)), StatusCode::NOT_FOUND);
        assert_eq!(
            status_of(&RegistryError::Corrupt { digest: d, actual: d }),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            status_of(&RegistryError::TooLarge { size: 2, limit: 1 }),
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }
}

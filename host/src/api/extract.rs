//! Extractors whose rejections are [`ApiError`]s, so every refusal has the same `{code, message}`
//! shape: a request body (413 `too_large` past the limit) decoded as JSON (400 `invalid_json`
//! naming the problem), path and query parameters (400).

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// The raw request body, within the size limit.
pub struct Body(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Body, ApiError> {
        Bytes::from_request(req, state).await.map(Body).map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    "the request body is larger than this host accepts (`max_body_bytes`)",
                )
            } else {
                ApiError::bad_request("invalid_body", e.body_text())
            }
        })
    }
}

/// A JSON request body.
pub struct Json<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Json<T>, ApiError> {
        let Body(bytes) = Body::from_request(req, state).await?;
        serde_json::from_slice(&bytes)
            .map(Json)
            .map_err(|e| ApiError::bad_request("invalid_json", format!("the body is not valid JSON for this request: {e}")))
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

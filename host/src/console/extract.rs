//! The console's extractors: the API's path and query extractors, and a form, whose refusals are
//! pages ([`PageError`]) with the API's codes — `invalid_path`, `invalid_query`, `invalid_form`,
//! `too_large` — instead of axum's plain text.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::PageError;
use crate::api::ApiError;

/// Path parameters.
pub(super) struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = PageError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Path<T>, PageError> {
        crate::api::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Path(p.0))
            .map_err(PageError::Refused)
    }
}

/// Query parameters.
pub(super) struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = PageError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Query<T>, PageError> {
        crate::api::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(PageError::Refused)
    }
}

/// A form (`application/x-www-form-urlencoded`), within the body limit.
pub(super) struct Form<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Form<T> {
    type Rejection = PageError;

    async fn from_request(req: Request, state: &S) -> Result<Form<T>, PageError> {
        axum::extract::Form::<T>::from_request(req, state)
            .await
            .map(|f| Form(f.0))
            .map_err(|e| {
                PageError::Refused(if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    crate::api::extract::too_large()
                } else {
                    ApiError::bad_request("invalid_form", e.body_text())
                })
            })
    }
}

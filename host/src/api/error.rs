//! `ApiError`: the one error of the REST API, answered as JSON `{code, message}` with a stable
//! code. Messages name the culprit and are safe for clients; internal detail (database, I/O,
//! compiler errors) goes to the log only.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::app::sign_in::Refusal;
use crate::app::{AccessError, EnvError};
use crate::intent::IntentError;
use crate::intent::pinning::PinError;
use crate::nodes::NodesError;
use crate::store::StoreError;
use orc_manifest::error_chain;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds for a `Retry-After` header (a 429).
    pub retry_after_s: Option<u64>,
}

/// The body of every error answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Stable and machine-readable: `unknown_environment`, `invalid_json`, `dependency_cycle`, …
    #[schema(example = "unknown_environment")]
    pub code: String,
    /// For humans; names the culprit.
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// 429 `rate_limited` with `Retry-After` (at least a second).
    pub fn rate_limited(retry_after_s: u64, message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after_s: Some(retry_after_s.max(1)),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", message)
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// 401 `unauthorized` saying why.
    pub fn unauthorized_with(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or invalid bearer token (Authorization: Bearer <token>), or its user is disabled",
        )
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// A failure the client cannot act on: logged in full, answered without detail.
    pub fn internal(error: &dyn std::error::Error) -> ApiError {
        tracing::error!(error = %error_chain(error), "request failed");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error; see the host's log")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = self.code;
        let body = Json(ErrorBody {
            code: code.to_string(),
            message: self.message,
        });
        let mut response = (self.status, body).into_response();
        response
            .extensions_mut()
            .insert(super::auth::ErrorCode(std::borrow::Cow::Borrowed(code)));
        if let Some(seconds) = self.retry_after_s {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(seconds));
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match &e {
            StoreError::NotFound { .. } => ApiError::not_found(e.to_string()),
            StoreError::Conflict { .. } => ApiError::new(StatusCode::CONFLICT, "conflict", e.to_string()),
            _ => ApiError::internal(&e),
        }
    }
}

impl From<IntentError> for ApiError {
    fn from(e: IntentError) -> ApiError {
        let code = match &e {
            IntentError::Json(_) => return ApiError::bad_request("invalid_json", e.to_string()),
            IntentError::DuplicateId(_) => "duplicate_resource",
            IntentError::UnknownRequirement { .. } | IntentError::SelfRequirement(_) => "unknown_requirement",
            IntentError::Cycle(_) | IntentError::PurgeOrderCycle(_) => "dependency_cycle",
            IntentError::InvalidId { .. }
            | IntentError::InvalidPluginRef(_)
            | IntentError::AttributesNotObject { .. }
            | IntentError::InvalidSensitive { .. }
            | IntentError::InvalidSet { .. } => "invalid_intent",
        };
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, e.to_string())
    }
}

impl From<PinError> for ApiError {
    fn from(e: PinError) -> ApiError {
        let code = match &e {
            PinError::UnknownPlugin { .. } => "unknown_plugin",
            PinError::WrongResourceType { .. } => "wrong_resource_type",
            PinError::NotGranted { .. } => "capability_not_granted",
            PinError::Load { source, .. } => {
                // The load error's own line names the plugin and what is wrong with it (world,
                // capability, digest); what lies beneath (compiler, I/O) stays in the log.
                tracing::warn!(error = %error_chain(&e), "adaptor refused");
                return ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "plugin_rejected", format!("{e}: {source}"));
            }
            PinError::Registry(_) => return ApiError::internal(&e),
        };
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, e.to_string())
    }
}

impl From<EnvError> for ApiError {
    fn from(e: EnvError) -> ApiError {
        match e {
            EnvError::UnknownEnvironment(_) => ApiError::new(StatusCode::NOT_FOUND, "unknown_environment", e.to_string()),
            EnvError::InvalidName { .. } => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_name", e.to_string()),
            EnvError::UnknownNode { .. } => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "unknown_node", e.to_string()),
            EnvError::NodeNotAllowed { .. } => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "node_not_allowed", e.to_string()),
            EnvError::InvalidSettings(_) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_settings", e.to_string()),
            EnvError::CapabilityInUse { .. } => ApiError::new(StatusCode::CONFLICT, "capability_in_use", e.to_string()),
            EnvError::ReservedType(_) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "reserved_resource_type", e.to_string()),
            EnvError::NoVersion(_) => ApiError::new(StatusCode::CONFLICT, "no_version", e.to_string()),
            EnvError::VersionConflict(_) => ApiError::new(StatusCode::CONFLICT, "version_conflict", e.to_string()),
            EnvError::InvalidResourceSet(_) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_resource_set", e.to_string()),
            EnvError::SetConflict { .. } => ApiError::new(StatusCode::CONFLICT, "resource_set_conflict", e.to_string()),
            EnvError::TooManyResources { .. } => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_many_resources", e.to_string()),
            EnvError::RateLimited { retry_after_s, .. } => ApiError::rate_limited(retry_after_s, e.to_string()),
            EnvError::SchedulerUnavailable { .. } => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "scheduler_unavailable", e.to_string()),
            EnvError::Elsewhere { .. } => ApiError {
                retry_after_s: Some(1),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "run_elsewhere", e.to_string())
            },
            EnvError::Intent(e) => e.into(),
            EnvError::Pin(e) => (*e).into(),
            EnvError::Store(e) => e.into(),
            EnvError::NodeRoot { .. } => ApiError::internal(&e),
        }
    }
}

impl From<AccessError> for ApiError {
    fn from(e: AccessError) -> ApiError {
        let (status, code) = match e {
            AccessError::Environment(e) => return e.into(),
            AccessError::Store(StoreError::Conflict { what }) => return ApiError::new(StatusCode::CONFLICT, "conflict", what),
            AccessError::Store(e) => return e.into(),
            AccessError::Password(crate::access::password::PasswordError::Hash(_)) => return ApiError::internal(&e),
            AccessError::UnknownUser(_) => (StatusCode::NOT_FOUND, "unknown_user"),
            AccessError::UnknownToken(_) => (StatusCode::NOT_FOUND, "unknown_token"),
            AccessError::InvalidUser { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_user"),
            AccessError::Password(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_password"),
            AccessError::InvalidScope(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_scope"),
            AccessError::WrongCredentials => (StatusCode::UNAUTHORIZED, "invalid_credentials"),
            AccessError::SignIn(Refusal::Throttled { retry_after_s, .. }) => return ApiError::rate_limited(retry_after_s, e.to_string()),
            AccessError::SignIn(Refusal::Busy { retry_after_s }) => {
                return ApiError {
                    retry_after_s: Some(retry_after_s),
                    ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", e.to_string())
                };
            }
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl From<NodesError> for ApiError {
    fn from(e: NodesError) -> ApiError {
        let e = match e {
            NodesError::Environment(e) => return (*e).into(),
            e => e,
        };
        let (status, code) = match &e {
            NodesError::Unknown(_) => (StatusCode::NOT_FOUND, "unknown_node"),
            NodesError::Invalid { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_field"),
            NodesError::InvalidCredential(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_credential"),
            NodesError::InUse { .. } => (StatusCode::CONFLICT, "node_in_use"),
            NodesError::NotClaimable { .. } => (StatusCode::CONFLICT, "node_not_claimable"),
            NodesError::NoKeyToAccept { .. } => (StatusCode::CONFLICT, "host_key_unchanged"),
            NodesError::WrongFingerprint { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "wrong_fingerprint"),
            // Answered before this match.
            NodesError::Environment(_) => return ApiError::internal(&e),
            NodesError::Secret(_) => return ApiError::internal(&e),
            NodesError::Store(StoreError::Conflict { .. }) => (StatusCode::CONFLICT, "node_exists"),
            NodesError::Store(StoreError::NotFound { .. }) => (StatusCode::NOT_FOUND, "not_found"),
            NodesError::Store(_) => return ApiError::internal(&e),
        };
        ApiError::new(status, code, e.to_string())
    }
}

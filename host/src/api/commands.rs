//! A request for an environment another replica runs, as HTTP meets the database
//! ([`crate::app::App::relay`]): [`relay`] turns the request into a command row and the answer
//! back into a response on the replica the client reached; [`runner`] runs a claimed command
//! through this replica's own router on the owner. The owner checks the caller again by its
//! token's hash ([`Delegated`]); the audit trail and the rate limit count the request once,
//! where it came in.

use std::borrow::Cow;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequest as _, Request};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tower::ServiceExt as _;

use super::ApiError;
use super::auth::ErrorCode;
use crate::access::Principal;
use crate::app::{App, CommandRunner, RelayError};
use crate::store::{CommandAnswer, CommandId, CommandRecord, EnvironmentId};

/// The largest answer relayed back (a page of resources, a dryrun's report).
const MAX_ANSWER_BYTES: usize = 256 * 1024 * 1024;

/// On a request the owner runs for another replica: the caller, by its token's hash. Only this
/// process can put it on a request; nothing a client sends becomes one.
#[derive(Debug, Clone)]
pub(crate) struct Delegated {
    pub(crate) credential: String,
}

/// Whether a request on `route` is relayed when another replica runs its environment: all but
/// the event stream, which is the owner's own (a client reconnects there).
pub(super) fn relayed(method: &Method, route: &str) -> bool {
    !(method == Method::GET && route.ends_with("/events"))
}

/// The headers that belong to one hop, or that the replica answering sets itself.
fn hop_by_hop(name: &HeaderName) -> bool {
    [
        header::AUTHORIZATION,
        header::COOKIE,
        header::CONNECTION,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::HOST,
        header::TE,
        header::UPGRADE,
    ]
    .contains(name)
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

fn headers_of(headers: &axum::http::HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| !hop_by_hop(name))
        .filter_map(|(name, value)| Some((name.as_str().to_string(), value.to_str().ok()?.to_string())))
        .collect()
}

/// Relays `request` of `caller` for environment `env` (`name`, as the path gave it) to its
/// owner, and answers what the owner answered.
pub(super) async fn relay(app: &App, env: EnvironmentId, name: &str, caller: &Principal, request: Request) -> Response {
    // The URI as it came in: the router this is nested in saw only the rest of the path.
    let uri = request
        .extensions()
        .get::<axum::extract::OriginalUri>()
        .map_or_else(|| request.uri().clone(), |original| original.0.clone());
    let (method, headers) = (request.method().clone(), request.headers().clone());
    // Read as a handler reads it: within the host's body limit and the environment's.
    let body = match super::extract::Body::from_request(request, &()).await {
        Ok(body) => body.0,
        Err(refusal) => return refusal.into_response(),
    };
    let command = CommandRecord {
        id: CommandId::random(),
        env,
        method: method.to_string(),
        target: uri
            .path_and_query()
            .map_or_else(|| uri.path().to_string(), |p| p.as_str().to_string()),
        headers: headers_of(&headers),
        body: body.to_vec(),
        credential: caller.credential.clone(),
        submitted_by: app.replica_id(),
    };
    match app.relay(command, name).await {
        Ok(answer) => response_of(answer),
        Err(e) => ApiError::from(e).into_response(),
    }
}

impl From<RelayError> for ApiError {
    fn from(e: RelayError) -> ApiError {
        match e {
            RelayError::NotTaken { .. } => ApiError {
                retry_after_s: Some(1),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "run_elsewhere", e.to_string())
            },
            RelayError::InDoubt { .. } => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "relay_in_doubt", e.to_string()),
            RelayError::TimedOut { .. } => ApiError::new(StatusCode::GATEWAY_TIMEOUT, "relay_timeout", e.to_string()),
            RelayError::Store(e) => e.into(),
        }
    }
}

/// The response the owner's answer stands for.
fn response_of(answer: CommandAnswer) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = Response::new(Body::from(answer.body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in &answer.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::try_from(value.as_str()))
            && !hop_by_hop(&name)
        {
            headers.append(name, value);
        }
    }
    if let Some(code) = answer.code {
        response.extensions_mut().insert(ErrorCode(Cow::Owned(code)));
    }
    response
}

/// Runs claimed commands through `router` (this replica's whole router, layers and all).
pub(crate) fn runner(router: Router) -> CommandRunner {
    std::sync::Arc::new(move |command| Box::pin(run(router.clone(), command)))
}

async fn run(router: Router, command: CommandRecord) -> CommandAnswer {
    let internal = |message: String| {
        tracing::error!(command = %command.id, message, "a relayed request could not be run");
        let body = serde_json::json!({ "code": "internal", "message": "the replica running the environment could not run the request; see its log" });
        CommandAnswer {
            status: 500,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_string().into_bytes(),
            code: Some("internal".into()),
        }
    };
    let mut request = axum::http::Request::builder()
        .method(command.method.as_str())
        .uri(command.target.as_str());
    for (name, value) in &command.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let request = match request
        .extension(Delegated {
            credential: command.credential.clone(),
        })
        .body(Body::from(command.body.clone()))
    {
        Ok(request) => request,
        Err(e) => return internal(format!("the stored request is not a request: {e}")),
    };
    let Ok(response) = router.oneshot(request).await;
    let (parts, body) = response.into_parts();
    let body = match axum::body::to_bytes(body, MAX_ANSWER_BYTES).await {
        Ok(body) => body,
        Err(e) => {
            return internal(format!(
                "the answer could not be read (at most {MAX_ANSWER_BYTES} bytes are relayed): {e}"
            ));
        }
    };
    CommandAnswer {
        status: parts.status.as_u16(),
        headers: headers_of(&parts.headers),
        body: body.to_vec(),
        code: parts.extensions.get::<ErrorCode>().map(|c| c.0.to_string()),
    }
}

//! `GET /environments/{env}/events`: server-sent events of the environment, on any replica,
//! from the moment of the request or after the event `Last-Event-ID` names — `state` (a
//! resource's new state), `action` (an action's outcome) and `released` (a version was
//! released; the resources it dropped are no longer managed), each with its JSON as `data`, in
//! the order the scheduler recorded them. A release sends the states it changes: a resource it
//! keeps deployed as it was has no `state` event, and now belongs to the version `released`
//! names.
//!
//! Every event has an `id:`, its number in the environment's stream (numbers increase, also
//! across a change of owner, but are not consecutive): a client whose stream broke opens it
//! again, on any replica, with `Last-Event-ID`, and misses nothing and gets nothing twice while
//! the events are kept (`event_log_s`). A watcher that falls behind by more than the host's
//! `event_buffer_bytes`, or that asks for events no longer kept, is not waited for: it gets a
//! `lagged` event saying what it missed, and its stream ends; it should read the resource
//! listing again and open a new stream.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, Method};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::Caller;
use super::extract::Path;
use super::{ApiError, AppState, ErrorBody, Result};
use crate::access::{Principal, rules};
use crate::app::Followed;
use crate::scheduler::subscribers::Missed;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(events))
}

/// Server-sent events: `event: state` (data: `{"event":"state", resource, version, status, …}`),
/// `event: action` (data: `{"event":"action", version, trigger, report}`), `event: released`
/// (data: `{"event":"released", version, dropped}`), each with `id:` its number in the
/// environment's stream; and last, for a reader that cannot go on, `event: lagged` (data:
/// `{"missed_batches", "missed_events", "buffer_bytes", "catch_up"}` for one that fell behind,
/// `{"missed_after", "catch_up"}` for one that asked for events no longer kept).
#[utoipa::path(get, path = "/environments/{env}/events", tag = "events",
    params(("env" = String, Path, description = "Environment name or id"),
        ("Last-Event-ID" = Option<i64>, Header, description = "Start after this event (the `id` of the last one received); without it, from now on")),
    responses((status = 200, description = "An endless event stream", content_type = "text/event-stream", body = String),
        (status = 400, description = "`Last-Event-ID` is not an event number", body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn events(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path(env): Path<String>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let after = last_event_id(&headers)?;
    let followed = app.follow(&env, after).await?;
    let catch_up = format!("GET /api/v1/environments/{env}/resources, then open this stream again");
    let revoked = revoked(app.clone(), caller, env);
    let stream = tokio_stream::wrappers::ReceiverStream::new(followed).flat_map(move |item| {
        let events: Vec<Result<Event, Infallible>> = match item {
            Followed::Events { events, from } => events[from..]
                .iter()
                .map(|p| Ok(Event::default().id(p.seq.to_string()).event(p.name).data(&p.data)))
                .collect(),
            Followed::Lagged(missed) => vec![Ok(lagged(&missed, &catch_up))],
            Followed::Forgotten { after } => {
                let data = serde_json::json!({ "missed_after": after, "catch_up": catch_up });
                vec![Ok(Event::default().event("lagged").data(data.to_string()))]
            }
        };
        futures::stream::iter(events)
    });
    let stream = stream.take_until(revoked);
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The number `Last-Event-ID` names, if it is there.
fn last_event_id(headers: &HeaderMap) -> Result<Option<i64>> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default().trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<i64>().ok().filter(|n| *n >= 0).map(Some).ok_or_else(|| {
        ApiError::bad_request(
            "invalid_last_event_id",
            format!(
                "Last-Event-ID `{}` is not an event number (the `id` of an event this stream sent)",
                text.chars().take(40).collect::<String>()
            ),
        )
    })
}

/// The last event of a stream that fell behind: what it missed, and how to catch up.
fn lagged(missed: &Missed, catch_up: &str) -> Event {
    let data = serde_json::json!({
        "missed_batches": missed.batches,
        "missed_events": missed.events,
        "buffer_bytes": missed.buffer_bytes,
        "catch_up": catch_up,
    });
    Event::default().event("lagged").data(data.to_string())
}

/// Completes when the caller's token no longer lets it read the environment's events (revoked,
/// its user disabled or deleted, its role taken away): the stream then ends. Checked each time
/// users, roles or tokens change, with the rule of this route.
pub(crate) async fn revoked(app: AppState, caller: Arc<Principal>, env: String) {
    let rule = rules::rule(&Method::GET, "/environments/{env}/events");
    let mut changed = app.access_changed();
    while changed.changed().await.is_ok() {
        let allowed = match app.authenticate_hash(&caller.credential).await {
            Ok(Some(now)) => rule.is_some_and(|rule| now.allows(rule, Some(&env)).is_ok()),
            Ok(None) => false,
            // The store failing is no proof of revocation; the next change checks again.
            Err(_) => true,
        };
        if !allowed {
            tracing::info!(user = %caller.user, token = %caller.token_id, environment = %env, "event stream ended: access revoked");
            return;
        }
    }
    std::future::pending::<()>().await;
}

//! `GET /environments/{env}/events`: server-sent events of the environment, from the moment of
//! the request — `state` (a resource's new state), `action` (an action's outcome) and `released`
//! (a version was released; the resources it dropped are no longer managed), each with its JSON
//! as `data`, in the order the scheduler recorded them. A watcher too slow to keep up
//! gets a `lagged` event saying how many batches it missed, and should re-read what it shows.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::Path;
use super::{AppState, ErrorBody, Result};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(events))
}

/// Server-sent events: `event: state` (data: `{"event":"state", resource, version, status, …}`),
/// `event: action` (data: `{"event":"action", version, trigger, report}`), `event: released`
/// (data: `{"event":"released", version, dropped}`), `event: lagged`
/// (data: `{"missed_batches": n}`).
#[utoipa::path(get, path = "/environments/{env}/events", tag = "events",
    params(("env" = String, Path, description = "Environment name or id")),
    responses((status = 200, description = "An endless event stream", content_type = "text/event-stream", body = String), (status = 404, body = ErrorBody)))]
async fn events(State(envs): State<AppState>, Path(env): Path<String>) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let receiver = envs.subscribe(&env).await?;
    let stream = BroadcastStream::new(receiver).flat_map(|batch| {
        let events: Vec<Result<Event, Infallible>> = match batch {
            Ok(batch) => batch.iter().map(|p| Ok(Event::default().event(p.name).data(&p.data))).collect(),
            Err(BroadcastStreamRecvError::Lagged(n)) => {
                vec![Ok(Event::default().event("lagged").data(format!("{{\"missed_batches\":{n}}}")))]
            }
        };
        futures::stream::iter(events)
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

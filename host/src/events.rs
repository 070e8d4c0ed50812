//! What the scheduler of an environment reports, after persistence, to everyone who watches it:
//! the event stream (`GET /api/v1/environments/{env}/events`, server-sent events) and observers
//! such as the metrics. [`EnvironmentSink`] is the one [`Sink`] of a server-side scheduler: it
//! writes each batch to the store before it publishes it, so a watcher who reacts to an event by
//! reading the API sees at least that state.

use std::sync::Arc;

use tokio::sync::broadcast;

use crate::persistence::StoreSink;
use crate::scheduler::{BoxFuture, Event, Sink};

/// Batches kept for slow watchers before they miss some (they are told, and can re-read).
const STREAM_CAPACITY: usize = 1024;

/// One event as watchers receive it: its name (`state` or `action`) and its JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub name: &'static str,
    pub data: String,
}

/// Everything recorded in one write, in order.
pub type Batch = Arc<[Published]>;

/// Something that looks at every batch of an environment's events, after persistence.
pub trait Observer: Send + Sync + 'static {
    fn observe(&self, events: &[Event]);
}

/// The event stream of one environment.
#[derive(Clone)]
pub struct EventStream {
    sender: broadcast::Sender<Batch>,
}

impl Default for EventStream {
    fn default() -> Self {
        EventStream {
            sender: broadcast::channel(STREAM_CAPACITY).0,
        }
    }
}

impl EventStream {
    pub fn subscribe(&self) -> broadcast::Receiver<Batch> {
        self.sender.subscribe()
    }

    /// `events` serialised, when someone watches.
    fn prepare(&self, events: &[Event]) -> Option<Batch> {
        (self.sender.receiver_count() > 0).then(|| events.iter().map(published).collect())
    }
}

fn published(event: &Event) -> Published {
    let name = match event {
        Event::State(_) => "state",
        Event::Action { .. } => "action",
        Event::Released { .. } => "released",
    };
    Published {
        name,
        data: serde_json::to_string(event).expect("events serialise"),
    }
}

/// The sink of a server-side scheduler: store, then stream and observers.
pub struct EnvironmentSink {
    store: StoreSink,
    stream: EventStream,
    observers: Vec<Arc<dyn Observer>>,
}

impl EnvironmentSink {
    pub fn new(store: StoreSink, stream: EventStream, observers: Vec<Arc<dyn Observer>>) -> EnvironmentSink {
        EnvironmentSink { store, stream, observers }
    }
}

impl Sink for EnvironmentSink {
    fn record(&self, events: Vec<Event>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            for observer in &self.observers {
                observer.observe(&events);
            }
            // Serialised before the write (which consumes the events), sent after it.
            let batch = self.stream.prepare(&events);
            self.store.record(events).await;
            if let Some(batch) = batch {
                let _ = self.stream.sender.send(batch);
            }
        })
    }
}

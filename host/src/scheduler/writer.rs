//! The scheduler's writer: one task that hands the loop's events to the [`Sink`] in order,
//! batching whatever accumulated while the previous write ran, and that sets the loop's pace —
//! while too many events wait to be recorded, the loop starts no new action.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::{Notify, mpsc, oneshot};

use super::{Event, Sink, Snapshot};

/// What the loop sends its writer: events, and answers that must follow them.
pub(super) enum Outgoing {
    Event(Event),
    /// Events recorded in one batch (an action and its resource's next state).
    Events(Vec<Event>),
    /// A settle (or stop) answer, sent once every event before it is recorded.
    Settled(oneshot::Sender<Snapshot>, Snapshot),
    /// Signalled once every event before it is recorded (a release's receipt).
    Recorded(oneshot::Sender<()>),
}

impl Outgoing {
    /// What the message counts against [`MAX_UNRECORDED`]: its events, or one for a request.
    fn weight(&self) -> usize {
        match self {
            Outgoing::Events(es) => es.len(),
            _ => 1,
        }
    }
}

/// Events sent to the writer and not recorded yet: at most this many before the loop stops
/// starting actions. Without a bound a scheduler whose actions finish faster than its sink
/// stores them runs ever further ahead of the store (memory: a 100,000-resource deploy on
/// PostgreSQL held ~200 MiB more; a crash: more progress to redo).
pub(super) const MAX_UNRECORDED: usize = 16_384;

/// How far the writer is behind the loop.
#[derive(Default)]
pub(super) struct Backlog {
    unrecorded: AtomicUsize,
    /// Signalled whenever the writer has recorded something.
    pub(super) recorded: Notify,
    /// Set once the sink is in doubt ([`Sink::in_doubt`]); never cleared.
    in_doubt: AtomicBool,
}

impl Backlog {
    pub(super) fn full(&self) -> bool {
        self.unrecorded.load(Ordering::Acquire) >= MAX_UNRECORDED
    }

    /// Whether the sink may not hold what it was handed.
    pub(super) fn in_doubt(&self) -> bool {
        self.in_doubt.load(Ordering::Acquire)
    }
}

/// The loop's side of the writer's queue.
pub(super) struct Outbox {
    pub(super) tx: mpsc::UnboundedSender<Outgoing>,
    pub(super) backlog: Arc<Backlog>,
}

impl Outbox {
    /// Queues `out` for the writer. If the writer is gone (it can only have panicked: the
    /// supervisor has reported it), the event is dropped and the backlog keeps growing, so the
    /// loop starts nothing more.
    pub(super) fn send(&self, out: Outgoing) {
        self.backlog.unrecorded.fetch_add(out.weight(), Ordering::AcqRel);
        let _ = self.tx.send(out);
    }

    pub(super) fn event(&self, event: Event) {
        self.send(Outgoing::Event(event));
    }

    /// Queues `events` to be recorded in one batch.
    pub(super) fn events(&self, events: Vec<Event>) {
        self.send(Outgoing::Events(events));
    }
}

/// Drains events into the sink, batching whatever accumulated while the previous call ran (paced:
/// [`crate::store::pace`]). An answer is sent only once every event before it has been recorded.
pub(super) async fn writer(sink: Arc<dyn Sink>, rx: mpsc::UnboundedReceiver<Outgoing>, backlog: Arc<Backlog>) {
    let mut incoming = Vec::new();
    let mut rx = crate::store::pace::Paced::new(rx);
    while rx.receive(&mut incoming, 10_000).await > 0 {
        let received = incoming.iter().map(Outgoing::weight).sum();
        let mut batch = Vec::with_capacity(incoming.len());
        for out in incoming.drain(..) {
            match out {
                Outgoing::Event(e) => batch.push(e),
                Outgoing::Events(es) => batch.extend(es),
                Outgoing::Settled(reply, snapshot) => {
                    if !batch.is_empty() {
                        record(&*sink, &backlog, std::mem::take(&mut batch)).await;
                    }
                    let _ = reply.send(snapshot);
                }
                Outgoing::Recorded(reply) => {
                    if !batch.is_empty() {
                        record(&*sink, &backlog, std::mem::take(&mut batch)).await;
                    }
                    let _ = reply.send(());
                }
            }
        }
        if !batch.is_empty() {
            record(&*sink, &backlog, batch).await;
        }
        backlog.unrecorded.fetch_sub(received, Ordering::AcqRel);
        backlog.recorded.notify_one();
    }
}

/// Hands `batch` to the sink; notes whether the sink is in doubt after it.
async fn record(sink: &dyn Sink, backlog: &Backlog, batch: Vec<Event>) {
    sink.record(batch).await;
    if sink.in_doubt() {
        backlog.in_doubt.store(true, Ordering::Release);
    }
}

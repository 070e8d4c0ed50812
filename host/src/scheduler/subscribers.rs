//! The event stream's fan-out: every subscriber (an open `GET …/events`, a console page) has a
//! queue of its own, bounded in bytes. A subscriber that falls behind its bound is not waited
//! for and not buffered for: its queue is emptied at once, it is told what it missed
//! ([`Delivery::Lagged`]) and its subscription ends. So a reader that never reads holds at most
//! its bound, whatever the environment deploys.
//!
//! Batches are shared (`Arc`), not copied: subscribers that fall behind together hold the same
//! batches. Every live subscriber's queue ends at the newest batch and spans at most its bound,
//! so what all of them hold together is at most one bound plus one batch (a batch larger than
//! the bound still enters an empty queue, or a large release could never be watched).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;

use super::events::Batch;

/// The bound of each subscriber's queue when the host's configuration names none, in bytes of
/// event data.
pub const DEFAULT_BUFFER_BYTES: usize = 8 * 1024 * 1024;

/// What a subscriber receives.
#[derive(Debug, Clone)]
pub enum Delivery {
    /// A batch of events, in the order they were recorded.
    Batch(Batch),
    /// Only how many batches were recorded since the last delivery ([`Want::Counts`]).
    Changed(usize),
    /// The subscriber fell behind its bound: these were dropped, and nothing follows.
    Lagged(Missed),
}

/// What a lagging subscriber missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Missed {
    pub batches: u64,
    pub events: u64,
    /// The bound it fell behind, in bytes.
    pub buffer_bytes: usize,
}

/// What a subscriber wants of each batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// The batches themselves (the API's event stream).
    Batches,
    /// Only that batches arrived (the console's pages, which read again what they show): costs
    /// no buffer, never lags.
    Counts,
}

/// How the host's streams are doing, for `GET /metrics`.
#[derive(Clone, Default)]
pub struct StreamStats {
    /// Bytes of event data queued for subscribers, all environments (a batch queued for two
    /// subscribers counts twice).
    pub buffered_bytes: Gauge,
    /// Subscribers ended because they fell behind their bound.
    pub lagged: Counter,
}

/// The subscribers of one environment's stream.
pub struct Fanout {
    buffer_bytes: usize,
    stats: StreamStats,
    next_id: AtomicU64,
    subscribers: Mutex<HashMap<u64, Arc<Subscriber>>>,
}

struct Subscriber {
    want: Want,
    queue: Mutex<Queue>,
    ready: Notify,
}

#[derive(Default)]
struct Queue {
    batches: VecDeque<(Batch, usize)>,
    bytes: usize,
    /// Batches arrived since the last delivery ([`Want::Counts`]).
    changed: usize,
    lagged: Option<Missed>,
    /// The lagged notice was delivered: nothing more will be.
    done: bool,
}

/// Bytes of event data in a batch: what the queue's bound counts.
fn size_of(batch: &Batch) -> usize {
    batch.iter().map(|p| p.data.len() + p.name.len()).sum()
}

impl Fanout {
    pub fn new(buffer_bytes: usize, stats: StreamStats) -> Fanout {
        Fanout {
            buffer_bytes: buffer_bytes.max(1),
            stats,
            next_id: AtomicU64::new(0),
            subscribers: Mutex::new(HashMap::new()),
        }
    }

    /// Whether anyone listens (a batch need not be serialised otherwise).
    pub fn is_watched(&self) -> bool {
        !self.subscribers.lock().expect("subscribers").is_empty()
    }

    /// A new subscriber, receiving every batch sent from now on.
    pub fn subscribe(self: &Arc<Fanout>, want: Want) -> Subscription {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let subscriber = Arc::new(Subscriber {
            want,
            queue: Mutex::new(Queue::default()),
            ready: Notify::new(),
        });
        self.subscribers.lock().expect("subscribers").insert(id, subscriber.clone());
        Subscription {
            fanout: self.clone(),
            id,
            subscriber,
        }
    }

    /// Queues `batch` for every subscriber; one past its bound lags instead.
    pub fn send(&self, batch: Batch) {
        let subscribers: Vec<Arc<Subscriber>> = self.subscribers.lock().expect("subscribers").values().cloned().collect();
        if subscribers.is_empty() {
            return;
        }
        let bytes = size_of(&batch);
        for subscriber in subscribers {
            {
                let mut queue = subscriber.queue.lock().expect("subscriber queue");
                if queue.lagged.is_some() {
                    continue;
                }
                match subscriber.want {
                    Want::Counts => queue.changed += 1,
                    Want::Batches if !queue.batches.is_empty() && queue.bytes + bytes > self.buffer_bytes => {
                        let missed = Missed {
                            batches: queue.batches.len() as u64 + 1,
                            events: queue.batches.iter().map(|(b, _)| b.len() as u64).sum::<u64>() + batch.len() as u64,
                            buffer_bytes: self.buffer_bytes,
                        };
                        queue.batches = VecDeque::new();
                        self.stats.buffered_bytes.dec_by(queue.bytes as i64);
                        queue.bytes = 0;
                        queue.lagged = Some(missed);
                        self.stats.lagged.inc();
                    }
                    Want::Batches => {
                        queue.batches.push_back((batch.clone(), bytes));
                        queue.bytes += bytes;
                        self.stats.buffered_bytes.inc_by(bytes as i64);
                    }
                }
            }
            subscriber.ready.notify_one();
        }
    }
}

/// One subscriber's end: [`Subscription::recv`] what was sent to it; dropping it unsubscribes
/// and frees its queue.
pub struct Subscription {
    fanout: Arc<Fanout>,
    id: u64,
    subscriber: Arc<Subscriber>,
}

impl Subscription {
    /// The next delivery; `None` once a [`Delivery::Lagged`] was delivered.
    pub async fn recv(&mut self) -> Option<Delivery> {
        loop {
            if let Some(delivery) = self.try_recv() {
                return delivery;
            }
            self.subscriber.ready.notified().await;
        }
    }

    /// `Some(delivery)` when one is ready (`Some(None)`: the subscription ended).
    fn try_recv(&mut self) -> Option<Option<Delivery>> {
        let mut queue = self.subscriber.queue.lock().expect("subscriber queue");
        if queue.done {
            return Some(None);
        }
        if let Some((batch, bytes)) = queue.batches.pop_front() {
            queue.bytes -= bytes;
            self.fanout.stats.buffered_bytes.dec_by(bytes as i64);
            return Some(Some(Delivery::Batch(batch)));
        }
        if let Some(missed) = queue.lagged {
            queue.done = true;
            return Some(Some(Delivery::Lagged(missed)));
        }
        if queue.changed > 0 {
            let n = std::mem::take(&mut queue.changed);
            return Some(Some(Delivery::Changed(n)));
        }
        None
    }

    /// The deliveries as a stream, ending after a [`Delivery::Lagged`].
    pub fn into_stream(self) -> impl futures::Stream<Item = Delivery> + Send + 'static {
        futures::stream::unfold(self, |mut s| async move { s.recv().await.map(|d| (d, s)) })
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.fanout.subscribers.lock().expect("subscribers").remove(&self.id);
        let queue = self.subscriber.queue.lock().expect("subscriber queue");
        self.fanout.stats.buffered_bytes.dec_by(queue.bytes as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::events::Published;

    fn batch(events: usize, bytes_each: usize) -> Batch {
        (0..events)
            .map(|_| Published {
                seq: 0,
                name: "state",
                data: "x".repeat(bytes_each - "state".len()),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_reader_that_keeps_up_gets_every_batch_in_order() {
        let fanout = Arc::new(Fanout::new(1000, StreamStats::default()));
        let mut sub = fanout.subscribe(Want::Batches);
        for n in 1..=50 {
            fanout.send(batch(n % 3 + 1, 100));
            match sub.recv().await {
                Some(Delivery::Batch(b)) => assert_eq!(b.len(), n % 3 + 1),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(fanout.stats.buffered_bytes.get(), 0);
        assert_eq!(fanout.stats.lagged.get(), 0);
    }

    #[tokio::test]
    async fn a_stalled_reader_holds_at_most_its_bound_then_lags_and_ends() {
        let stats = StreamStats::default();
        let fanout = Arc::new(Fanout::new(1000, stats.clone()));
        let mut stalled = fanout.subscribe(Want::Batches);
        let mut live = fanout.subscribe(Want::Batches);
        let mut counting = fanout.subscribe(Want::Counts);
        for i in 0..100 {
            fanout.send(batch(2, 100));
            assert!(matches!(live.recv().await, Some(Delivery::Batch(_))), "batch {i}");
            // The stalled reader's queue never passes its bound.
            assert!(stats.buffered_bytes.get() <= 1000, "{}", stats.buffered_bytes.get());
        }
        // It held five batches of 200 bytes; the sixth made it lag, and every later one is
        // missed without being queued.
        assert_eq!(stats.lagged.get(), 1);
        assert_eq!(stats.buffered_bytes.get(), 0);
        match stalled.recv().await {
            Some(Delivery::Lagged(missed)) => assert_eq!(
                missed,
                Missed {
                    batches: 6,
                    events: 12,
                    buffer_bytes: 1000
                }
            ),
            other => panic!("{other:?}"),
        }
        assert!(stalled.recv().await.is_none());
        // A counting subscriber is told how many batches came, in one delivery.
        assert!(matches!(counting.recv().await, Some(Delivery::Changed(100))));
        drop((stalled, live, counting));
        assert!(!fanout.is_watched());
    }

    #[tokio::test]
    async fn a_batch_larger_than_the_bound_still_reaches_an_empty_queue() {
        let stats = StreamStats::default();
        let fanout = Arc::new(Fanout::new(1000, stats.clone()));
        let mut sub = fanout.subscribe(Want::Batches);
        fanout.send(batch(30, 100));
        assert_eq!(stats.buffered_bytes.get(), 3000);
        assert!(matches!(sub.recv().await, Some(Delivery::Batch(b)) if b.len() == 30));
        // Behind it, though, nothing more fits.
        fanout.send(batch(30, 100));
        fanout.send(batch(1, 100));
        assert!(matches!(sub.recv().await, Some(Delivery::Lagged(m)) if m.batches == 2 && m.events == 31));
        drop(sub);
        assert_eq!(stats.buffered_bytes.get(), 0);
    }
}

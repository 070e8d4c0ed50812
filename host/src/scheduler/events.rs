//! What the scheduler of an environment reports, after persistence, to everyone who watches it:
//! the event stream (`GET /api/v1/environments/{env}/events`, server-sent events) and observers
//! such as the metrics. [`EnvironmentSink`] is the one [`Sink`] of a server-side scheduler: it
//! writes each batch to the store before it publishes it, so a watcher who reacts to an event by
//! reading the API sees at least that state.

use std::collections::HashMap;
use std::hash::{BuildHasher as _, RandomState};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::scheduler::ResourceStatus;
use crate::scheduler::persistence::StoreSink;
use crate::scheduler::subscribers::{Fanout, StreamStats, Subscription, Want};
use crate::scheduler::{BoxFuture, Event, Sink};
use crate::store::{Epoch, EventLog, Millis, first_seq_of, now_ms};

/// One event as watchers receive it: its number in the environment's stream, its name
/// (`state`, `action` or `released`) and its JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub seq: i64,
    pub name: &'static str,
    pub data: String,
}

/// Everything recorded in one write, in order.
pub type Batch = Arc<[Published]>;

/// Something that looks at every batch of an environment's events, after persistence.
pub trait Observer: Send + Sync + 'static {
    fn observe(&self, events: &[Event]);
}

/// Something told of a batch once it is persisted, without serialising it: it picks what it
/// wants from the batch before the store takes it, and the delivery it returns runs after the
/// write (whether the write succeeded or was given up, as the stream is sent either way).
pub trait Follower: Send + Sync + 'static {
    fn pick(&self, events: &[Event]) -> Option<Delivery>;
}

/// What a [`Follower`] does once the batch it picked from is written: called with whether the
/// store took it (`false`: given up, what the store holds is not known).
pub type Delivery = Box<dyn FnOnce(bool) + Send>;

/// The event stream of one environment: each subscriber's queue is bounded in bytes (see
/// [`crate::scheduler::subscribers`]).
#[derive(Clone)]
pub struct EventStream {
    fanout: Arc<Fanout>,
}

impl EventStream {
    /// A stream whose subscribers each queue at most `buffer_bytes` of event data.
    pub fn new(buffer_bytes: usize, stats: StreamStats) -> EventStream {
        EventStream {
            fanout: Arc::new(Fanout::new(buffer_bytes, stats)),
        }
    }

    pub fn subscribe(&self, want: Want) -> Subscription {
        self.fanout.subscribe(want)
    }
}

fn published(seq: i64, event: &Event) -> Published {
    let name = match event {
        Event::State(_) => "state",
        Event::Action { .. } => "action",
        Event::Released { .. } => "released",
    };
    Published {
        seq,
        name,
        data: serde_json::to_string(event).expect("events serialise"),
    }
}

/// How an owner numbers the events it records (see `store::events`), and how long the store
/// keeps them.
pub struct Numbering {
    /// The next number to hand out.
    next: i64,
    /// The last number handed out (`None`: none ever was).
    prev: Option<i64>,
    keep: Duration,
    /// When recorded events were last forgotten.
    forgot: Option<Instant>,
}

/// How often an owner forgets the events older than it keeps.
const FORGET_EVERY: Duration = Duration::from_secs(60);

impl Numbering {
    /// Numbering on from `last` (the last number recorded), never below what `epoch` may hand
    /// out; events are kept for `keep`.
    pub fn after(last: Option<i64>, epoch: Epoch, keep: Duration) -> Numbering {
        Numbering {
            next: last.map_or(0, |l| l + 1).max(first_seq_of(epoch)),
            prev: last,
            keep,
            forgot: None,
        }
    }

    /// Numbers for `n` events: the first, and the last handed out before them.
    fn take(&mut self, n: usize) -> (i64, Option<i64>) {
        let first = self.next;
        let prev = self.prev;
        self.next += n as i64;
        self.prev = Some(self.next - 1);
        (first, prev)
    }

    /// Before when recorded events are forgotten with this batch, once a minute.
    fn forget_before(&mut self) -> Option<Millis> {
        if self.forgot.is_some_and(|at| at.elapsed() < FORGET_EVERY) {
            return None;
        }
        self.forgot = Some(Instant::now());
        Some(now_ms() - self.keep.as_millis() as i64)
    }
}

const STATUSES: usize = ResourceStatus::ALL.len();

/// How many of an environment's resources are in each status *as persisted*, so that
/// `GET /environments/{env}` answers without counting the environment's rows in the store. They
/// move only once a batch is written (never ahead of the store), and mirror what the batch did to
/// the rows: a state upserts its resource's row (status, version); a release removes the rows it
/// dropped and makes the others its own, a complete one the rows of every other version
/// (`store::Renewal`). Seeded from the states read when the
/// environment resumes; the scheduler's sink is the only writer of an environment's states
/// after that. A batch the store could not take leaves the counts unknown: readers count in
/// the store from then on.
pub struct StatusCounts {
    hasher: RandomState,
    /// `None`: unknown.
    counted: Mutex<Option<Counted>>,
}

struct Counted {
    /// Per stored row, by a hash of its resource id (as the metrics keep them): status, version.
    rows: HashMap<u64, (ResourceStatus, u64)>,
    counts: [i64; STATUSES],
}

/// What one batch does to the rows, taken before the store consumes it.
pub struct Staged {
    states: Vec<(u64, ResourceStatus, u64)>,
    released: Option<Renewal>,
}

/// What a release does to the rows (see [`Event::Released`]).
struct Renewal {
    version: u64,
    complete: bool,
    /// The dropped resources, by the hash of their id.
    dropped: Vec<u64>,
}

impl StatusCounts {
    /// Counts of the rows `(resource id, status, version)`.
    pub fn seed<'a>(rows: impl IntoIterator<Item = (&'a str, ResourceStatus, i64)>) -> StatusCounts {
        let hasher = RandomState::new();
        let mut counted = Counted {
            rows: HashMap::new(),
            counts: [0; STATUSES],
        };
        for (id, status, version) in rows {
            counted.upsert(hasher.hash_one(id), status, version as u64);
        }
        StatusCounts {
            hasher,
            counted: Mutex::new(Some(counted)),
        }
    }

    /// Resources per status, statuses with none left out, in status order; `None` if unknown.
    pub fn get(&self) -> Option<Vec<(ResourceStatus, i64)>> {
        let counted = self.counted.lock().expect("status counts");
        let counts = counted.as_ref()?.counts;
        Some(
            ResourceStatus::ALL
                .iter()
                .map(|&s| (s, counts[s as usize]))
                .filter(|&(_, n)| n != 0)
                .collect(),
        )
    }

    /// What `events` will do to the rows.
    pub fn stage(&self, events: &[Event]) -> Staged {
        let mut staged = Staged {
            states: Vec::new(),
            released: None,
        };
        for event in events {
            match event {
                Event::State(s) => staged.states.push((self.hasher.hash_one(s.resource.as_str()), s.status, s.version)),
                Event::Released {
                    version,
                    dropped,
                    complete,
                } => {
                    staged.released = Some(Renewal {
                        version: *version,
                        complete: *complete,
                        dropped: dropped.iter().map(|id| self.hasher.hash_one(id.as_str())).collect(),
                    })
                }
                Event::Action { .. } => {}
            }
        }
        staged
    }

    /// A staged batch was persisted.
    pub fn persisted(&self, staged: Staged) {
        let mut counted = self.counted.lock().expect("status counts");
        let Some(counted) = counted.as_mut() else { return };
        for (key, status, version) in staged.states {
            counted.upsert(key, status, version);
        }
        if let Some(renewal) = staged.released {
            let counts = &mut counted.counts;
            if renewal.complete {
                counted.rows.retain(|_, (status, v)| {
                    let keep = *v == renewal.version;
                    if !keep {
                        counts[*status as usize] -= 1;
                    }
                    keep
                });
            } else {
                for key in renewal.dropped {
                    if let Some((status, _)) = counted.rows.remove(&key) {
                        counts[status as usize] -= 1;
                    }
                }
                for (_, v) in counted.rows.values_mut() {
                    *v = renewal.version;
                }
            }
        }
    }

    /// A batch could not be persisted: what the store holds is not known here any more.
    pub fn lost(&self) {
        *self.counted.lock().expect("status counts") = None;
    }
}

impl Counted {
    fn upsert(&mut self, key: u64, status: ResourceStatus, version: u64) {
        if let Some((previous, _)) = self.rows.insert(key, (status, version)) {
            self.counts[previous as usize] -= 1;
        }
        self.counts[status as usize] += 1;
    }
}

/// The sink of a server-side scheduler: store (the states, actions and numbered events of each
/// batch in one transaction), then stream and followers.
pub struct EnvironmentSink {
    store: StoreSink,
    stream: EventStream,
    observers: Vec<Arc<dyn Observer>>,
    followers: Vec<Arc<dyn Follower>>,
    counts: Arc<StatusCounts>,
    numbering: Mutex<Numbering>,
}

impl EnvironmentSink {
    pub fn new(
        store: StoreSink,
        stream: EventStream,
        observers: Vec<Arc<dyn Observer>>,
        counts: Arc<StatusCounts>,
        numbering: Numbering,
    ) -> EnvironmentSink {
        EnvironmentSink {
            store,
            stream,
            observers,
            followers: Vec::new(),
            counts,
            numbering: Mutex::new(numbering),
        }
    }

    /// Tells `follower` of every batch once it is persisted.
    pub fn followed_by(mut self, follower: Arc<dyn Follower>) -> EnvironmentSink {
        self.followers.push(follower);
        self
    }
}

impl Sink for EnvironmentSink {
    fn record(&self, events: Vec<Event>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            for observer in &self.observers {
                observer.observe(&events);
            }
            // Numbered and serialised before the write (which consumes the events), recorded
            // with it, and sent after it.
            let ((first, prev), forget) = {
                let mut numbering = self.numbering.lock().expect("numbering");
                (numbering.take(events.len()), numbering.forget_before())
            };
            let batch: Vec<Published> = events.iter().enumerate().map(|(i, e)| published(first + i as i64, e)).collect();
            let mut lines = String::with_capacity(batch.iter().map(|p| p.name.len() + p.data.len() + 2).sum());
            for p in &batch {
                lines.push_str(p.name);
                lines.push(' ');
                lines.push_str(&p.data);
                lines.push('\n');
            }
            let log = (!batch.is_empty()).then(|| EventLog {
                first_seq: first,
                last_seq: first + batch.len() as i64 - 1,
                prev_seq: prev,
                events: &lines,
                recorded_at: now_ms(),
            });
            let deliveries: Vec<Delivery> = self.followers.iter().filter_map(|f| f.pick(&events)).collect();
            let staged = self.counts.stage(&events);
            let persisted = self.store.persist_logged(events, log, forget).await;
            if persisted {
                self.counts.persisted(staged);
            } else {
                self.counts.lost();
            }
            for delivery in deliveries {
                delivery(persisted);
            }
            if self.stream.fanout.is_watched() {
                self.stream.fanout.send(batch.into());
            }
        })
    }

    fn in_doubt(&self) -> bool {
        self.store.in_doubt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::ResourceState;
    use ResourceStatus::{Available, Deployed, Deploying, Failed};

    fn state(resource: &str, version: u64, status: ResourceStatus) -> Event {
        ResourceState::event(resource, version, status)
    }

    fn record(counts: &StatusCounts, events: &[Event]) {
        let staged = counts.stage(events);
        counts.persisted(staged);
    }

    #[test]
    fn numbers_go_on_from_the_last_recorded_and_never_below_the_epoch() {
        let keep = Duration::from_secs(3600);
        let mut first = Numbering::after(None, 1, keep);
        assert_eq!(first.take(3), (1 << 32, None));
        assert_eq!(first.take(2), ((1 << 32) + 3, Some((1 << 32) + 2)));
        // A takeover: the next epoch's numbers, naming the old owner's last as the one before.
        let mut second = Numbering::after(Some((1 << 32) + 4), 2, keep);
        assert_eq!(second.take(1), (2 << 32, Some((1 << 32) + 4)));
        // The same owner's scheduler started again: on from the last recorded.
        let mut again = Numbering::after(Some((2 << 32) + 7), 2, keep);
        assert_eq!(again.take(1), ((2 << 32) + 8, Some((2 << 32) + 7)));
        // Numbers handed out beyond an epoch's room are never handed out again.
        let mut crowded = Numbering::after(Some((3 << 32) + 5), 2, keep);
        assert_eq!(crowded.take(1).0, (3 << 32) + 6);
        // Forgetting rides on one batch a minute, older than what is kept.
        let before = again.forget_before().expect("the first batch forgets");
        assert!((now_ms() - 3_600_000 - before).abs() < 1_000, "{before}");
        assert_eq!(again.forget_before(), None, "not again within the minute");
    }

    #[test]
    fn counts_follow_persisted_batches_and_releases() {
        // Rows left by a previous run: `old` of version 1, `a` of version 2.
        let counts = StatusCounts::seed([("old", Deployed, 1), ("a", Deployed, 2)]);
        assert_eq!(counts.get(), Some(vec![(Deployed, 2)]));

        // Version 3 keeps `a`, adds `b`; staged but not persisted yet: nothing moves.
        let batch = [
            state("a", 3, Deployed),
            state("b", 3, Available),
            Event::Released {
                version: 3,
                dropped: Vec::new(),
                complete: true,
            },
        ];
        let staged = counts.stage(&batch);
        assert_eq!(counts.get(), Some(vec![(Deployed, 2)]));
        // Persisted: every row outside version 3 is gone (`old`, which no `dropped` named).
        counts.persisted(staged);
        assert_eq!(counts.get(), Some(vec![(Available, 1), (Deployed, 1)]));

        // A release that hands over only what changed: `a` is renewed, `c` is new, nothing
        // dropped; then one that drops `c`, and keeps `a` (now version 4) and `b`.
        record(
            &counts,
            &[
                state("c", 4, Available),
                Event::Released {
                    version: 4,
                    dropped: Vec::new(),
                    complete: false,
                },
            ],
        );
        assert_eq!(counts.get(), Some(vec![(Available, 2), (Deployed, 1)]));
        record(
            &counts,
            &[Event::Released {
                version: 5,
                dropped: vec!["c".into()],
                complete: false,
            }],
        );
        assert_eq!(counts.get(), Some(vec![(Available, 1), (Deployed, 1)]));
        // A complete release after them removes nothing renewed.
        record(
            &counts,
            &[Event::Released {
                version: 5,
                dropped: Vec::new(),
                complete: true,
            }],
        );
        assert_eq!(counts.get(), Some(vec![(Available, 1), (Deployed, 1)]));

        // One resource twice in a batch: the last state counts.
        record(&counts, &[state("b", 3, Deploying), state("b", 3, Failed)]);
        assert_eq!(counts.get(), Some(vec![(Deployed, 1), (Failed, 1)]));
        record(&counts, &[state("b", 3, Deploying)]);
        assert_eq!(counts.get(), Some(vec![(Deploying, 1), (Deployed, 1)]));

        // A batch the store did not take: unknown from then on.
        let staged = counts.stage(&[state("b", 3, Deployed)]);
        drop(staged);
        counts.lost();
        assert_eq!(counts.get(), None);
        record(&counts, &[state("b", 3, Deployed)]);
        assert_eq!(counts.get(), None);
    }
}

//! An environment's event stream as a client reads it, on any replica ([`App::follow`]).
//!
//! Every event is numbered and recorded with the batch that reports it (`store::events`), so a
//! stream can start after a number (`Last-Event-ID`) and on any replica. The owner sends what
//! its scheduler records as it records it (the live fan-out, bounded per reader: a reader that
//! falls behind lags); any other replica, and the owner once it lets the environment go, reads
//! the recorded batches as they are announced (`NOTIFY`, and a poll every second). A reader
//! gets each number once, in order: what is read from the store is skipped when it comes live
//! too.

use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc};

use super::{App, EnvError};
use crate::scheduler::events::{Batch, Published};
use crate::scheduler::subscribers::{Delivery, Missed, Subscription, Want};
use crate::store::{Environment, EventNews, RecordedEvents, StoreError};

/// What a follower is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followed {
    /// Events in order: those of `events` from index `from` on (the ones before were sent
    /// already).
    Events { events: Batch, from: usize },
    /// It fell behind the live fan-out's bound: these were dropped, and nothing follows.
    Lagged(Missed),
    /// The events after `after` that it asked for are no longer (or were never) recorded: it
    /// should read the state again; nothing follows.
    Forgotten { after: i64 },
}

/// Batches read from the store at a time.
const READ_BATCHES: i64 = 4;
/// How often a reader of the store looks whatever was announced.
const POLL: Duration = Duration::from_secs(1);

impl App {
    /// The events of environment `key` after number `after` (`None`: from now on), on whichever
    /// replica this is. The stream ends when the receiver is dropped, the environment is
    /// deleted, or the host stops.
    pub async fn follow(&self, key: &str, after: Option<i64>) -> Result<mpsc::Receiver<Followed>, EnvError> {
        let env = self.get(key).await?;
        // The owner (this one, when none is) feeds it live; another replica from the store.
        let live = match self.running(&env).await {
            Ok(running) => Some((running.stream.subscribe(Want::Batches), running.ended.subscribe())),
            Err(EnvError::Elsewhere { .. }) => None,
            Err(e) => return Err(e),
        };
        // From now on: after what is recorded (the live fan-out sends only what comes later).
        let after = match after {
            Some(after) => Some(after),
            None if live.is_none() => Some(self.store.last_event_seq(&env.id).await?.unwrap_or(-1)),
            None => None,
        };
        let (tx, rx) = mpsc::channel(1);
        let app = self.this.upgrade().expect("the app outlives its requests");
        // Listening before reading: nothing recorded in between is missed.
        let news = self.store.event_news();
        tokio::spawn(async move {
            let mut feed = Feed { app, env, tx, last: after };
            if feed.run(live, news).await.is_err() {
                tracing::debug!(environment = %feed.env.name, "event stream ended");
            }
        });
        Ok(rx)
    }
}

/// One follower's feed.
struct Feed {
    app: std::sync::Arc<App>,
    env: Environment,
    tx: mpsc::Sender<Followed>,
    /// The last number sent (or asked to start after).
    last: Option<i64>,
}

/// The feed ends: the follower left, or was told why it cannot go on.
struct Ended;

impl Feed {
    async fn run(
        &mut self,
        live: Option<(Subscription, tokio::sync::watch::Receiver<bool>)>,
        news: Option<broadcast::Receiver<EventNews>>,
    ) -> Result<(), Ended> {
        if self.last.is_some() {
            self.catch_up().await?;
        }
        if let Some((subscription, ended)) = live {
            self.live(subscription, ended).await?;
            // This replica let the environment go: its next owner's events are read from the
            // store, on from the last one sent.
            self.catch_up().await?;
        }
        self.tail(news).await
    }

    /// Sends what the owner's scheduler records, until it stops here.
    async fn live(&mut self, mut subscription: Subscription, mut ended: tokio::sync::watch::Receiver<bool>) -> Result<(), Ended> {
        loop {
            let delivery = tokio::select! {
                d = subscription.recv() => d,
                _ = ended.wait_for(|e| *e) => return Ok(()),
                () = self.tx.closed() => return Err(Ended),
            };
            match delivery {
                Some(Delivery::Batch(batch)) => {
                    // Not the next one: what lies between is read from the store first (it is
                    // recorded before it is sent), or found forgotten.
                    if let (Some(first), Some(last)) = (batch.first(), self.last)
                        && first.seq > last + 1
                    {
                        self.catch_up().await?;
                    }
                    self.send(batch).await?;
                }
                Some(Delivery::Lagged(missed)) => {
                    let _ = self.tx.send(Followed::Lagged(missed)).await;
                    return Err(Ended);
                }
                Some(Delivery::Changed(_)) => {}
                None => return Err(Ended),
            }
        }
    }

    /// Sends what the store holds after the last number sent, as it is recorded.
    async fn tail(&mut self, mut news: Option<broadcast::Receiver<EventNews>>) -> Result<(), Ended> {
        let mut stopping = self.app.stopping.subscribe();
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.catch_up().await?;
            let mut ticked = false;
            loop {
                tokio::select! {
                    heard = recv(&mut news) => match heard {
                        Ok(EventNews::Recorded(env)) if env != self.env.id => continue,
                        Err(RecvError::Closed) => { news = None; break }
                        _ => break,
                    },
                    _ = poll.tick() => { ticked = true; break }
                    _ = stopping.wait_for(|s| *s) => return Err(Ended),
                    () = self.tx.closed() => return Err(Ended),
                }
            }
            if ticked
                && self
                    .app
                    .store
                    .get_environment(&self.env.id)
                    .await
                    .is_err_and(|e| matches!(e, StoreError::NotFound { .. }))
            {
                return Err(Ended);
            }
        }
    }

    /// Sends every recorded event after the last one sent.
    async fn catch_up(&mut self) -> Result<(), Ended> {
        loop {
            let after = self.last.unwrap_or(-1);
            let batches = match self.app.store.events_after(&self.env.id, after, READ_BATCHES).await {
                Ok(batches) => batches,
                Err(e) => {
                    // Tried again on the next poll or announcement.
                    tracing::warn!(environment = %self.env.name, error = %e, "cannot read recorded events");
                    return Ok(());
                }
            };
            let full = batches.len() as i64 == READ_BATCHES;
            for batch in &batches {
                self.send_recorded(batch).await?;
            }
            if !full {
                return Ok(());
            }
        }
    }

    async fn send_recorded(&mut self, batch: &RecordedEvents) -> Result<(), Ended> {
        // What came before this batch is not all here: forgotten, or never recorded.
        if let Some(last) = self.last
            && !batch.follows(last)
        {
            let _ = self.tx.send(Followed::Forgotten { after: last }).await;
            return Err(Ended);
        }
        let events = match batch.events() {
            Ok(events) => events,
            Err(e) => {
                tracing::error!(environment = %self.env.name, error = %e, "recorded events cannot be read back");
                let _ = self
                    .tx
                    .send(Followed::Forgotten {
                        after: self.last.unwrap_or(-1),
                    })
                    .await;
                return Err(Ended);
            }
        };
        let events: Batch = events
            .iter()
            .map(|e| Published {
                seq: e.seq,
                name: published_name(e.name),
                data: e.data.to_string(),
            })
            .collect();
        self.send(events).await
    }

    /// Sends the events of `events` not sent already.
    async fn send(&mut self, events: Batch) -> Result<(), Ended> {
        let from = events.partition_point(|p| self.last.is_some_and(|last| p.seq <= last));
        let Some(newest) = events.last().map(|p| p.seq).filter(|_| from < events.len()) else {
            return Ok(());
        };
        self.last = Some(newest);
        self.tx.send(Followed::Events { events, from }).await.map_err(|_| Ended)
    }
}

/// The name of a recorded event as the stream names it.
fn published_name(name: &str) -> &'static str {
    match name {
        "state" => "state",
        "action" => "action",
        "released" => "released",
        _ => "event",
    }
}

/// The next announcement; never, on SQLite (one process: the owner's live fan-out serves).
async fn recv(news: &mut Option<broadcast::Receiver<EventNews>>) -> Result<EventNews, RecvError> {
    match news {
        Some(news) => news.recv().await,
        None => std::future::pending().await,
    }
}

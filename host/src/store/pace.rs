//! Group commits, spaced: the store's writers (the scheduler's, the plugin kv's, the audit
//! trail's) each commit whatever accumulated while their previous commit ran. When commits are
//! quick, that is a row or two, and every commit rewrites the pages it touches in the write-ahead
//! log (a move of 200 processes in `service-bench`: ~800 commits of ~6 states each, and as many of
//! the plugin kv).
//! [`Paced::receive`] spaces the starts of two batches by at least [`PACE`] while messages keep
//! coming, so what arrives meanwhile shares one commit (~190 commits there). A writer that was idle
//! that long takes the next message at once: only sustained streams wait, and what they write is
//! at most [`PACE`] later.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

/// Least time between the starts of two batches while messages keep coming.
pub const PACE: Duration = Duration::from_millis(20);

/// A writer's receiving end, paced.
pub struct Paced<T> {
    rx: mpsc::UnboundedReceiver<T>,
    last: Option<Instant>,
}

impl<T> Paced<T> {
    pub fn new(rx: mpsc::UnboundedReceiver<T>) -> Paced<T> {
        Paced { rx, last: None }
    }

    /// Waits for at least one message, then (no sooner than [`PACE`] after the previous batch
    /// was taken) takes what has arrived into `batch`, at most `limit` messages. 0: every sender
    /// is gone and nothing is left.
    pub async fn receive(&mut self, batch: &mut Vec<T>, limit: usize) -> usize {
        let first = self.rx.recv_many(batch, limit).await;
        if first == 0 {
            return 0;
        }
        if let Some(due) = self.last.map(|at| at + PACE)
            && Instant::now() < due
        {
            tokio::time::sleep_until(due).await;
            while batch.len() < limit
                && let Ok(message) = self.rx.try_recv()
            {
                batch.push(message);
            }
        }
        self.last = Some(Instant::now());
        batch.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream is taken in batches spaced by the pace, in order, nothing lost; after a pause as
    /// long, the next message is taken at once.
    #[tokio::test(start_paused = true)]
    async fn a_stream_is_batched_by_the_pace_and_an_idle_writer_takes_at_once() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut paced = Paced::new(rx);
        let sender = tokio::spawn(async move {
            for i in 0..100u32 {
                tx.send(i).unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            tokio::time::sleep(PACE * 3).await;
            tx.send(100).unwrap();
        });
        let mut got = Vec::new();
        let mut starts = Vec::new();
        let mut batch = Vec::new();
        let began = Instant::now();
        loop {
            let n = paced.receive(&mut batch, 1000).await;
            if n == 0 {
                break;
            }
            starts.push((Instant::now() - began, batch.len()));
            got.append(&mut batch);
        }
        sender.await.unwrap();
        assert_eq!(got, (0..=100).collect::<Vec<_>>());
        // ~100 ms of messages one per millisecond: batches every PACE, not one per message.
        assert!(starts.len() <= 100 / 20 + 3, "{starts:?}");
        for pair in starts.windows(2) {
            assert!(pair[1].0 - pair[0].0 >= PACE, "{starts:?}");
        }
        // The last message came after a pause: taken as soon as it was sent.
        let (at, n) = *starts.last().unwrap();
        assert_eq!(n, 1, "{starts:?}");
        assert!(at <= Duration::from_millis(100) + PACE * 3 + Duration::from_millis(2), "{starts:?}");
    }
}

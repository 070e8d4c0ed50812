//! The audit trail's writer: state-changing requests are recorded by one task that commits
//! whatever came in while its previous commit ran, spaced by [`crate::store::pace`], instead of
//! one transaction per request (the move phase of `service-bench`: 200 commits, each its own
//! write to the log, for 200 requests in a fifth of a second).
//!
//! A request does not wait for its entry to be written (it never did for its outcome: a failed
//! write is logged, the answer stands). A batch that cannot be written is tried again, four times
//! over ~0.7 s, before its entries are logged as lost. Whoever reads the trail here first waits for every entry
//! recorded before, so a client sees its own requests at once; a shutdown waits for them too. A
//! host that dies loses what it had not committed yet: at most [`crate::store::pace::PACE`] and
//! one commit's worth, as Kubernetes' batching audit backends do.

use tokio::sync::{mpsc, oneshot};

use crate::store::pace::Paced;
use crate::store::{AuditRecord, Store};

/// Entries per commit at most.
const MAX_BATCH: usize = 1000;
/// Tries of one batch before its entries are given up (logged), and the wait before the first
/// retry, doubled for each next one: a database briefly away (a restart, a fail-over) loses no
/// entry, while one that stays away does not hold the trail up for ever.
const TRIES: u32 = 4;
const FIRST_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

// Nearly every message is an entry: boxing it would add an allocation to each.
#[allow(clippy::large_enum_variant)]
enum Message {
    Entry(AuditRecord),
    /// Answered once every entry sent before it is written (or its write failed and was logged).
    Flush(oneshot::Sender<()>),
}

/// The sending end; the writer stops once it is dropped and everything sent is written.
pub(crate) struct AuditTrail {
    tx: mpsc::UnboundedSender<Message>,
}

impl AuditTrail {
    /// Starts the writer (on the current Tokio runtime).
    pub(crate) fn start(store: Store) -> AuditTrail {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(writer(store, rx));
        AuditTrail { tx }
    }

    /// Queues `entry`; written within [`crate::store::pace::PACE`] and one commit.
    pub(crate) fn record(&self, entry: AuditRecord) {
        if let Err(mpsc::error::SendError(Message::Entry(entry))) = self.tx.send(Message::Entry(entry)) {
            tracing::error!(method = %entry.method, path = %entry.path, "cannot write the audit trail: its writer has stopped");
        }
    }

    /// Waits until every entry recorded before is written (or its failure logged).
    pub(crate) async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.tx.send(Message::Flush(done)).is_ok() {
            let _ = written.await;
        }
    }
}

async fn writer(store: Store, rx: mpsc::UnboundedReceiver<Message>) {
    let mut rx = Paced::new(rx);
    let mut batch = Vec::new();
    while rx.receive(&mut batch, MAX_BATCH).await > 0 {
        let mut entries = Vec::with_capacity(batch.len());
        let mut flushes = Vec::new();
        for message in batch.drain(..) {
            match message {
                Message::Entry(e) => entries.push(e),
                Message::Flush(done) => flushes.push(done),
            }
        }
        let mut delay = FIRST_RETRY;
        for attempt in 1..=TRIES {
            match store.insert_audit(&entries).await {
                Ok(()) => break,
                Err(e) if attempt < TRIES => {
                    tracing::warn!(error = %orc_manifest::error_chain(&e), entries = entries.len(), attempt, retry_in_ms = delay.as_millis() as u64, "cannot write the audit trail; trying again");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(e) => {
                    let first = entries.first().map(|e| format!("{} {}", e.method, e.path)).unwrap_or_default();
                    tracing::error!(error = %orc_manifest::error_chain(&e), entries = entries.len(), %first, "cannot write the audit trail; these entries are lost");
                }
            }
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}

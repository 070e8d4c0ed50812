//! The durability fence's bookkeeping: what a backend changed since its last fence
//! ([`Unsynced`]), and the fences of many nodes passed at once ([`all_durable`]).

use std::future::Future;
use std::sync::Arc;

use crate::{NodeBackend, NodeError};

/// What a backend changed since its last durability fence, and the turn of its fences.
///
/// A change is marked *after* it is made; a fence swaps the mark off, then syncs. So a change
/// made before a fence is called is either still marked (this fence syncs it) or was unmarked
/// by an earlier fence whose sync started after the change — and fences take turns, so that
/// earlier sync has finished before this one looks at the mark.
#[derive(Debug, Default)]
pub struct Unsynced {
    /// Bits of [`Unsynced::mark`]; 0 when nothing is pending.
    pub(crate) pending: std::sync::atomic::AtomicU8,
    turn: tokio::sync::Mutex<()>,
}

impl Unsynced {
    /// Records a change made; `scope` is a backend's own bit (say, which file system).
    pub fn mark(&self, scope: u8) {
        self.pending.fetch_or(scope, std::sync::atomic::Ordering::AcqRel);
    }

    /// Whether anything is pending.
    pub fn is_marked(&self) -> bool {
        self.pending.load(std::sync::atomic::Ordering::Acquire) != 0
    }

    /// Makes what was marked before the call durable with `sync` (given the marked bits); does
    /// nothing when nothing was. A failed sync leaves its bits marked for the next fence.
    pub async fn fence<F, Fut>(&self, sync: F) -> Result<(), NodeError>
    where
        F: FnOnce(u8) -> Fut,
        Fut: Future<Output = Result<(), NodeError>>,
    {
        let _turn = self.turn.lock().await;
        let pending = self.pending.swap(0, std::sync::atomic::Ordering::AcqRel);
        if pending == 0 {
            return Ok(());
        }
        let synced = sync(pending).await;
        if synced.is_err() {
            self.mark(pending);
        }
        synced
    }
}

/// Passes the fences of `nodes` at once; the first error, if any, after all have ended.
pub async fn all_durable(nodes: impl IntoIterator<Item = Arc<dyn NodeBackend>>) -> Result<(), NodeError> {
    let fences = nodes.into_iter().map(|node| async move { node.durable().await });
    futures::future::join_all(fences).await.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeErrorKind;

    #[tokio::test]
    async fn a_fence_syncs_only_what_was_marked_before_it_and_keeps_a_failed_sync_marked() {
        let unsynced = Unsynced::default();
        let synced = std::sync::Mutex::new(Vec::new());
        let sync = |bits: u8| {
            synced.lock().unwrap().push(bits);
            std::future::ready(Ok(()))
        };
        unsynced.fence(sync).await.unwrap();
        assert!(synced.lock().unwrap().is_empty(), "nothing marked, nothing synced");
        unsynced.mark(1);
        unsynced.mark(2);
        unsynced.fence(sync).await.unwrap();
        assert_eq!(*synced.lock().unwrap(), [3]);
        assert!(!unsynced.is_marked());
        unsynced.mark(1);
        let err = unsynced
            .fence(|_| std::future::ready(Err(NodeError::new(NodeErrorKind::Failed, "EIO"))))
            .await
            .unwrap_err();
        assert_eq!(err.message, "EIO");
        assert!(unsynced.is_marked(), "a failed sync leaves its changes for the next fence");
        unsynced.fence(sync).await.unwrap();
        assert_eq!(*synced.lock().unwrap(), [3, 1]);
    }
}

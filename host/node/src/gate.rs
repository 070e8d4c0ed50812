//! A gate around the changes a task makes to nodes: whoever starts a change can say, for the
//! task that runs it, what must still hold when the change is committed (an owner that must
//! still own its environment). A backend whose change has a commit step (the SSH node's rename
//! of a file written aside) asks [`open`] right before it, so a task paused between writing and
//! committing, and woken after its right to change the node is gone, leaves the node as it was.

use std::future::Future;
use std::sync::Arc;

/// What must hold for a change to be committed.
pub type Gate = Arc<dyn Fn() -> bool + Send + Sync>;

tokio::task_local! {
    static GATE: Gate;
}

/// Runs `change` behind `gate`.
pub fn behind<F: Future>(gate: Gate, change: F) -> impl Future<Output = F::Output> {
    GATE.scope(gate, change)
}

/// Whether the current task's gate lets a change be committed (no gate: it does).
pub fn open() -> bool {
    GATE.try_with(|gate| gate()).unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_behind_a_closed_gate_is_told_so() {
        assert!(open(), "no gate");
        let closed: Gate = Arc::new(|| false);
        assert!(!behind(closed, async { open() }).await);
        let opened: Gate = Arc::new(|| true);
        assert!(behind(opened, async { open() }).await);
    }
}

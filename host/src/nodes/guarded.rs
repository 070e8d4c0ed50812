//! A node as an environment's actions reach it while this replica runs the environment: every
//! change (a command, a write, a new directory, a mode, an owner, a removal, a link) first asks
//! the environment's [`Tenure`], and is refused `unavailable` once the tenure is over, so that an
//! owner paused past its lease, or cut off, changes no device after another replica took the
//! environment over; the SSH node asks again right before it renames a file written aside into
//! place, so an action paused in the middle of a write commits nothing when it wakes. (What
//! stays open: the instant between that last look and the rename, and the local node, whose
//! writes do not ask again.) Reads go through: they change nothing.

use std::sync::Arc;

use orc_node::{BoxFuture, CommandOutput, FileStat, NodeBackend, NodeCommand, NodeError, NodeErrorKind, Ownership};

use crate::replicas::Tenure;

pub(super) struct Guarded {
    pub(super) node: Arc<dyn NodeBackend>,
    pub(super) tenure: Arc<Tenure>,
}

impl Guarded {
    fn check(&self) -> Result<(), NodeError> {
        if self.tenure.holds() {
            Ok(())
        } else {
            Err(NodeError::new(
                NodeErrorKind::Unavailable,
                "this replica no longer runs the environment (another one has taken it over, or its lease could not be renewed)",
            ))
        }
    }

    /// `change` once the tenure is checked, and behind it as a gate: a backend asks again right
    /// before it commits (`orc_node::gate`).
    fn guarded<'a, T: Send + 'a>(&'a self, change: BoxFuture<'a, Result<T, NodeError>>) -> BoxFuture<'a, Result<T, NodeError>> {
        let tenure = self.tenure.clone();
        Box::pin(orc_node::gate::behind(Arc::new(move || tenure.holds()), async move {
            self.check()?;
            change.await
        }))
    }
}

impl NodeBackend for Guarded {
    fn run(&self, command: NodeCommand) -> BoxFuture<'_, Result<CommandOutput, NodeError>> {
        self.guarded(self.node.run(command))
    }

    fn read_file<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, NodeError>> {
        self.node.read_file(path)
    }

    fn write_file<'a>(&'a self, path: &'a str, content: Vec<u8>, mode: Option<u32>) -> BoxFuture<'a, Result<(), NodeError>> {
        self.guarded(self.node.write_file(path, content, mode))
    }

    fn stat<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<FileStat>, NodeError>> {
        self.node.stat(path)
    }

    fn create_dir<'a>(&'a self, path: &'a str, mode: Option<u32>, parents: bool) -> BoxFuture<'a, Result<(), NodeError>> {
        self.guarded(self.node.create_dir(path, mode, parents))
    }

    fn set_mode<'a>(&'a self, path: &'a str, mode: u32) -> BoxFuture<'a, Result<(), NodeError>> {
        self.guarded(self.node.set_mode(path, mode))
    }

    fn remove<'a>(&'a self, path: &'a str, recursive: bool) -> BoxFuture<'a, Result<bool, NodeError>> {
        self.guarded(self.node.remove(path, recursive))
    }

    fn read_link<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<String>, NodeError>> {
        self.node.read_link(path)
    }

    fn create_symlink<'a>(&'a self, target: &'a str, path: &'a str) -> BoxFuture<'a, Result<(), NodeError>> {
        self.guarded(self.node.create_symlink(target, path))
    }

    fn owner<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<Ownership>, NodeError>> {
        self.node.owner(path)
    }

    fn set_owner<'a>(&'a self, path: &'a str, user: Option<&'a str>, group: Option<&'a str>) -> BoxFuture<'a, Result<(), NodeError>> {
        self.guarded(self.node.set_owner(path, user, group))
    }

    fn durable(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        self.node.durable()
    }
}

//! `orc:plugin/node`: a plugin's calls bound to the nodes of its [`CallContext`](crate::CallContext).
//! The nodes themselves — the [`NodeBackend`] seam, the local node — are `orc-node`'s; this
//! module finds the node a call names (refusing a part of the interface the plugin was not
//! granted), hands the call the environment's command limits, and maps node errors to the WIT
//! error kinds.

use std::sync::Arc;
use std::time::Duration;

use orc_node::{FileKind, NodeBackend, NodeCommand, NodeError, NodeErrorKind};

use crate::bindings::host::orc::plugin::node as wit;
use crate::bindings::host::orc::plugin::types::{Error, ErrorKind};
use crate::capability::wit_error;
use crate::state::CallState;

/// A node error as the plugin sees it: a file too large to read is permanent, as a failure is.
fn to_wit(e: NodeError) -> Error {
    let kind = match e.kind {
        NodeErrorKind::Unavailable => ErrorKind::Unavailable,
        NodeErrorKind::InvalidInput => ErrorKind::InvalidInput,
        NodeErrorKind::Denied => ErrorKind::Denied,
        NodeErrorKind::Failed | NodeErrorKind::TooLarge => ErrorKind::Permanent,
    };
    wit_error(kind, e.message)
}

impl CallState {
    /// The node for a file function (`node-files`).
    fn node(&self, name: &str) -> Result<Arc<dyn NodeBackend>, Error> {
        self.node_part(name, orc_manifest::Capability::NodeFiles)
    }

    /// The node for a function of `part`, refused (`denied`) if the plugin lacks that part.
    fn node_part(&self, name: &str, part: orc_manifest::Capability) -> Result<Arc<dyn NodeBackend>, Error> {
        super::check_node_part(self.caps, part)?;
        self.ctx.nodes.node(name).map_err(to_wit)
    }
}

impl wit::Host for CallState {
    async fn run(&mut self, node: String, command: wit::Command) -> Result<wit::CommandOutput, Error> {
        let backend = self.node_part(&node, orc_manifest::Capability::NodeCommands)?;
        let out = backend
            .run(NodeCommand {
                argv: command.argv,
                stdin: command.stdin,
                env: command.env,
                cwd: command.cwd,
                timeout: command.timeout_ms.map(|ms| Duration::from_millis(ms.into())),
                limits: self.ctx.command_limits,
            })
            .await
            .map_err(to_wit)?;
        Ok(wit::CommandOutput {
            exit_code: out.exit_code,
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    async fn read_file(&mut self, node: String, path: String) -> Result<Option<Vec<u8>>, Error> {
        self.node(&node)?.read_file(&path).await.map_err(to_wit)
    }

    async fn write_file(&mut self, node: String, path: String, content: Vec<u8>, mode: Option<u32>) -> Result<(), Error> {
        self.node(&node)?.write_file(&path, content, mode).await.map_err(to_wit)
    }

    async fn stat(&mut self, node: String, path: String) -> Result<Option<wit::FileStat>, Error> {
        let stat = self.node(&node)?.stat(&path).await.map_err(to_wit)?;
        Ok(stat.map(|s| wit::FileStat {
            kind: match s.kind {
                FileKind::File => wit::FileKind::File,
                FileKind::Directory => wit::FileKind::Directory,
                FileKind::Symlink => wit::FileKind::Symlink,
                FileKind::Other => wit::FileKind::Other,
            },
            size: s.size,
            mode: s.mode,
            uid: s.uid,
            gid: s.gid,
            mtime_ms: s.mtime_ms,
        }))
    }

    async fn create_dir(&mut self, node: String, path: String, mode: Option<u32>, parents: bool) -> Result<(), Error> {
        self.node(&node)?.create_dir(&path, mode, parents).await.map_err(to_wit)
    }

    async fn set_mode(&mut self, node: String, path: String, mode: u32) -> Result<(), Error> {
        self.node(&node)?.set_mode(&path, mode).await.map_err(to_wit)
    }

    async fn remove(&mut self, node: String, path: String, recursive: bool) -> Result<bool, Error> {
        self.node(&node)?.remove(&path, recursive).await.map_err(to_wit)
    }

    async fn read_link(&mut self, node: String, path: String) -> Result<Option<String>, Error> {
        self.node(&node)?.read_link(&path).await.map_err(to_wit)
    }

    async fn create_symlink(&mut self, node: String, target: String, path: String) -> Result<(), Error> {
        self.node(&node)?.create_symlink(&target, &path).await.map_err(to_wit)
    }

    async fn owner(&mut self, node: String, path: String) -> Result<Option<wit::Ownership>, Error> {
        let owner = self.node(&node)?.owner(&path).await.map_err(to_wit)?;
        Ok(owner.map(|o| wit::Ownership {
            uid: o.uid,
            gid: o.gid,
            user: o.user,
            group: o.group,
        }))
    }

    async fn set_owner(&mut self, node: String, path: String, user: Option<String>, group: Option<String>) -> Result<(), Error> {
        self.node(&node)?
            .set_owner(&path, user.as_deref(), group.as_deref())
            .await
            .map_err(to_wit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each node error reaches the plugin as its WIT kind; a read past the cap is permanent
    /// (retrying cannot help), and its message keeps the `too_large:` code.
    #[test]
    fn node_errors_reach_the_plugin_as_their_wit_kinds() {
        for (kind, expected) in [
            (NodeErrorKind::Unavailable, ErrorKind::Unavailable),
            (NodeErrorKind::InvalidInput, ErrorKind::InvalidInput),
            (NodeErrorKind::Denied, ErrorKind::Denied),
            (NodeErrorKind::Failed, ErrorKind::Permanent),
            (NodeErrorKind::TooLarge, ErrorKind::Permanent),
        ] {
            let err = to_wit(NodeError::new(kind, "message"));
            assert_eq!(std::mem::discriminant(&err.kind), std::mem::discriminant(&expected), "{kind:?}");
            assert_eq!(err.message, "message");
        }
        let err = to_wit(orc_node::too_large("/huge", Some(68_719_476_736)));
        assert!(matches!(err.kind, ErrorKind::Permanent));
        assert!(err.message.starts_with("too_large: /huge is 68719476736 bytes"), "{}", err.message);
    }
}

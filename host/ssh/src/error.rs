//! `SshError`: everything that can go wrong reaching a node over SSH, and how each maps to the
//! node interface's error kinds. No variant carries a credential: messages name the user and the
//! node address only.

use std::time::Duration;

use orc_node::{NodeError, NodeErrorKind};

#[derive(Debug, Clone, thiserror::Error)]
pub enum SshError {
    /// TCP connect failed or timed out: the node is unreachable.
    #[error("cannot connect to node {node}: {message}")]
    Connect { node: String, message: String },
    /// The node presented a host key other than the pinned one. Never trusted.
    #[error(
        "HOST KEY CHANGED for node {node}: expected {expected}, the server presented {presented}; refusing to connect \
         (if the node was reinstalled, pin the new key explicitly)"
    )]
    HostKeyChanged { node: String, expected: String, presented: String },
    /// The server refused the credential.
    #[error("authentication as `{user}` on node {node} failed ({method} refused)")]
    Auth { user: String, node: String, method: &'static str },
    /// The private key could not be decoded (wrong passphrase, unknown format).
    #[error("cannot use the private key for `{user}` on node {node}: {message}")]
    Key { user: String, node: String, message: String },
    /// The SSH session failed (key exchange, protocol error, connection lost).
    #[error("ssh session with node {node} failed: {message}")]
    Session { node: String, message: String },
    /// The connection to the node is gone (closed, keepalive timed out).
    #[error("connection to node {node} lost: {message}")]
    Disconnected { node: String, message: String },
    /// A channel could not be opened or a request on it was refused.
    #[error("channel to node {node}: {message}")]
    Channel { node: String, message: String },
    /// The SFTP subsystem failed.
    #[error("sftp on node {node}: {message}")]
    Sftp { node: String, message: String },
    /// Something did not answer in time.
    #[error("{what} on node {node} timed out after {after:?}")]
    TimedOut { node: String, what: String, after: Duration },
}

impl SshError {
    /// Whether the node is (now) unreachable rather than refusing or failing a request.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            SshError::Connect { .. } | SshError::Session { .. } | SshError::Disconnected { .. } | SshError::TimedOut { .. }
        )
    }
}

impl From<SshError> for NodeError {
    fn from(e: SshError) -> NodeError {
        let kind = match &e {
            SshError::Connect { .. } | SshError::Session { .. } | SshError::Disconnected { .. } | SshError::TimedOut { .. } => {
                NodeErrorKind::Unavailable
            }
            // Loud and not retried as if the node were merely down: someone must look.
            SshError::HostKeyChanged { .. } | SshError::Auth { .. } | SshError::Key { .. } => NodeErrorKind::Denied,
            SshError::Channel { .. } | SshError::Sftp { .. } => NodeErrorKind::Failed,
        };
        NodeError::new(kind, e.to_string())
    }
}

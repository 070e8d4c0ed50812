//! The node seam of orc: what a managed node is to the host, whatever the transport. A
//! [`NodeBackend`] runs commands and works on files at absolute paths on one node; a
//! [`NodeDirectory`] finds a node by name for a call. This crate holds the trait, its types and
//! errors, the checks every backend makes the same way, the durability fence's bookkeeping
//! ([`Unsynced`]), and the local node ([`LocalNode`]: the host's machine confined to a root
//! directory, its commands confined by bubblewrap, [`sandbox`]). Other transports implement the
//! trait elsewhere (`orc-ssh`); the Wasm runtime binds a plugin's `node` calls to it.
//!
//! Architecture invariant: this crate knows nothing of Wasm, HTTP servers or SQL.

mod checks;
mod directory;
mod durable;
pub mod gate;
mod local;
pub mod sandbox;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use checks::{check_account_name, check_link_target, check_readable, too_large};
pub use directory::{NodeDirectory, Nodes};
pub use durable::{Unsynced, all_durable};
pub use local::LocalNode;
pub use sandbox::{Sandbox, SandboxError};

/// What the node traits' methods answer with (a trait with `async fn` could not be `dyn`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Output beyond this many bytes per stream is dropped (and says so).
pub const MAX_OUTPUT: usize = 16 << 20;
/// Largest file a node read returns, in bytes: what one command's output stream may be
/// ([`MAX_OUTPUT`]), a quarter of a plugin's default memory (64 MiB), which must hold what it
/// reads and usually a copy. A larger file is refused (`TooLarge`) before it is read.
pub const MAX_READ: u64 = MAX_OUTPUT as u64;
/// Default command timeout when the plugin gives none.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeErrorKind {
    /// The node cannot be reached now: its resources become `unavailable`.
    Unavailable,
    /// The request is wrong (relative path, path is a directory, missing parent).
    InvalidInput,
    /// The node refused (permissions, a path outside the node's root).
    Denied,
    /// A file too large to read ([`MAX_READ`]): retrying cannot help.
    TooLarge,
    /// Anything else on the node.
    Failed,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct NodeError {
    pub kind: NodeErrorKind,
    pub message: String,
}

impl NodeError {
    pub fn new(kind: NodeErrorKind, message: impl Into<String>) -> NodeError {
        NodeError {
            kind,
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct NodeCommand {
    pub argv: Vec<String>,
    pub stdin: Option<Vec<u8>>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub timeout: Option<Duration>,
    /// How the command is confined on the local node (other nodes' commands run as their
    /// transport's user, as the node confines them).
    pub limits: CommandLimits,
}

/// How one command on the local node is limited: the environment's `local_commands` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandLimits {
    /// The host's network (else only a loopback of its own).
    pub network: bool,
    /// CPU time of each process, in seconds (`SIGXCPU`, then `SIGKILL`).
    pub cpu_seconds: u64,
    /// Memory of all its processes together, in bytes (past it, the kernel's OOM killer).
    pub memory_bytes: u64,
    /// Processes and threads at once, all together (past it, `fork` fails).
    pub processes: u64,
    /// Largest file a process may write, in bytes (past it, `EFBIG`).
    pub file_size_bytes: u64,
}

impl Default for CommandLimits {
    fn default() -> Self {
        CommandLimits {
            network: false,
            cpu_seconds: 600,
            memory_bytes: 1 << 30,
            processes: 512,
            file_size_bytes: 1 << 30,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    Other,
}

impl FileKind {
    /// `file`, `directory`, `symlink` or `special file`, for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::File => "file",
            FileKind::Directory => "directory",
            FileKind::Symlink => "symlink",
            FileKind::Other => "special file",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStat {
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ms: i64,
}

/// Who owns a path: ids, and names when the node has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub uid: u32,
    pub gid: u32,
    pub user: Option<String>,
    pub group: Option<String>,
}

/// One node, reached by some transport. Paths are absolute paths on the node.
pub trait NodeBackend: Send + Sync + 'static {
    fn run(&self, command: NodeCommand) -> BoxFuture<'_, Result<CommandOutput, NodeError>>;
    /// The content of the regular file at `path` (a final symlink followed); `None` when
    /// nothing is there. Anything else is refused before it is read ([`check_readable`]): a
    /// FIFO, socket or device (`InvalidInput`, before it can block) and a file larger than
    /// [`MAX_READ`] (`TooLarge`, before anything is reserved).
    fn read_file<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, NodeError>>;
    fn write_file<'a>(&'a self, path: &'a str, content: Vec<u8>, mode: Option<u32>) -> BoxFuture<'a, Result<(), NodeError>>;
    fn stat<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<FileStat>, NodeError>>;
    fn create_dir<'a>(&'a self, path: &'a str, mode: Option<u32>, parents: bool) -> BoxFuture<'a, Result<(), NodeError>>;
    fn set_mode<'a>(&'a self, path: &'a str, mode: u32) -> BoxFuture<'a, Result<(), NodeError>>;
    fn remove<'a>(&'a self, path: &'a str, recursive: bool) -> BoxFuture<'a, Result<bool, NodeError>>;
    /// The stored target of the symlink at `path`; `None` when nothing exists there, an
    /// `InvalidInput` error when it is not a symlink.
    fn read_link<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<String>, NodeError>>;
    /// Makes `path` a symlink to `target`, replacing an existing symlink atomically; anything
    /// else at `path` is `InvalidInput`.
    fn create_symlink<'a>(&'a self, target: &'a str, path: &'a str) -> BoxFuture<'a, Result<(), NodeError>>;
    /// The owner of `path` (not following a final symlink); `None` when nothing exists there.
    fn owner<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<Ownership>, NodeError>>;
    /// Changes owner and/or group (names resolved on the node, digits are ids) of a file or
    /// directory; a symlink or a missing path is `InvalidInput`.
    fn set_owner<'a>(&'a self, path: &'a str, user: Option<&'a str>, group: Option<&'a str>) -> BoxFuture<'a, Result<(), NodeError>>;
    /// The durability fence: resolves once every change the file functions above made before
    /// the call is durable on the node (would survive the node losing power). Writes are
    /// answered before they are durable, so that a batch of them is made durable at once (one
    /// `syncfs` instead of an `fsync` per file); whoever records a change as done must pass
    /// this fence first. Commands (`run`) are not covered: what a command writes is its own.
    fn durable(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

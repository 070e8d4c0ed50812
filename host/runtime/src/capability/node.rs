//! `orc:plugin/node`: access to managed nodes by name. The host chooses the transport behind a
//! [`NodeBackend`]; this module provides the local node ([`LocalNode`]), whose files live under a
//! root directory opened through `cap-std`, so no path a plugin gives can reach outside it.

use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, MetadataExt, OpenOptions, Permissions, PermissionsExt};
use tokio::io::AsyncReadExt;

use crate::bindings::host::orc::plugin::node as wit;
use crate::bindings::host::orc::plugin::types::{Error, ErrorKind};
use crate::capability::reaper::Reaper;
use crate::capability::sandbox::{self, CommandLimits, Sandbox};
use crate::capability::spares::Spares;
use crate::capability::wit_error;
use crate::state::CallState;

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

/// What a backend changed since its last durability fence, and the turn of its fences.
///
/// A change is marked *after* it is made; a fence swaps the mark off, then syncs. So a change
/// made before a fence is called is either still marked (this fence syncs it) or was unmarked
/// by an earlier fence whose sync started after the change — and fences take turns, so that
/// earlier sync has finished before this one looks at the mark.
#[derive(Debug, Default)]
pub struct Unsynced {
    /// Bits of [`Unsynced::mark`]; 0 when nothing is pending.
    pending: std::sync::atomic::AtomicU8,
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

/// Checks a symlink target a plugin gives: not empty, no NUL byte.
pub fn check_link_target(target: &str) -> Result<(), NodeError> {
    if target.is_empty() {
        return Err(NodeError::new(NodeErrorKind::InvalidInput, "symlink target is empty"));
    }
    if target.contains('\0') {
        return Err(NodeError::new(
            NodeErrorKind::InvalidInput,
            format!("symlink target `{}` contains a NUL byte", target.escape_debug()),
        ));
    }
    Ok(())
}

/// Checks a user or group name a plugin gives for `set_owner`: a name or a numeric id, never
/// something a command line or a `user:group` pair could misread.
pub fn check_account_name(what: &str, name: &str) -> Result<(), NodeError> {
    let ok = !name.is_empty()
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'$'));
    if ok {
        Ok(())
    } else {
        Err(NodeError::new(
            NodeErrorKind::InvalidInput,
            format!("{what} `{}` is not a valid name or id", name.escape_debug()),
        ))
    }
}

/// What a node read refuses, for every backend: anything but a regular file (a FIFO would block
/// the read, a device or a socket has no end), and a file larger than [`MAX_READ`]. `mode` is
/// the file's `st_mode`, type bits included (`None` when the node did not say); `path` is shown.
pub fn check_readable(path: &str, mode: Option<u32>, size: u64) -> Result<(), NodeError> {
    if let Some(mode) = mode {
        match mode & S_IFMT {
            S_IFREG => {}
            S_IFDIR => return Err(NodeError::new(NodeErrorKind::InvalidInput, format!("{path} is a directory"))),
            other => {
                return Err(NodeError::new(
                    NodeErrorKind::InvalidInput,
                    format!("cannot read {path}: it is a {}, not a regular file", file_type_name(other)),
                ));
            }
        }
    }
    if size > MAX_READ {
        return Err(too_large(path, Some(size)));
    }
    Ok(())
}

/// The `TooLarge` refusal of a read of `path` (its message starts with `too_large:`, a
/// plugin's error has no code of its own): `size` as the node reports it, or `None` when the
/// file grew past [`MAX_READ`] while it was read.
pub fn too_large(path: &str, size: Option<u64>) -> NodeError {
    let size = match size {
        Some(size) => format!("is {size} bytes"),
        None => format!("grew past {MAX_READ} bytes while it was read"),
    };
    NodeError::new(
        NodeErrorKind::TooLarge,
        format!("too_large: {path} {size}; a node read returns at most {MAX_READ} bytes (16 MiB)"),
    )
}

/// The file type bits of `st_mode`.
const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;

/// What the type bits of an `st_mode` name, for messages.
fn file_type_name(kind: u32) -> &'static str {
    match kind {
        0o010000 => "FIFO",
        0o020000 => "character device",
        0o060000 => "block device",
        0o140000 => "socket",
        0o120000 => "symlink",
        S_IFDIR => "directory",
        S_IFREG => "file",
        _ => "special file",
    }
}

/// Finds a node by name for a call.
pub trait NodeDirectory: Send + Sync + 'static {
    fn node(&self, name: &str) -> Result<Arc<dyn NodeBackend>, NodeError>;

    /// The durability fence of every node reached through this directory
    /// ([`NodeBackend::durable`]): resolves once every change made through it before the call
    /// is durable. A scheduler's sink passes it before it records actions as done.
    fn durable(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Passes the fences of `nodes` at once; the first error, if any, after all have ended.
pub async fn all_durable(nodes: impl IntoIterator<Item = Arc<dyn NodeBackend>>) -> Result<(), NodeError> {
    let fences = nodes.into_iter().map(|node| async move { node.durable().await });
    futures::future::join_all(fences).await.into_iter().collect()
}

/// A fixed map of node names to backends.
#[derive(Default)]
pub struct Nodes {
    nodes: RwLock<HashMap<String, Arc<dyn NodeBackend>>>,
}

impl Nodes {
    pub fn insert(&self, name: impl Into<String>, node: Arc<dyn NodeBackend>) {
        self.nodes.write().expect("nodes").insert(name.into(), node);
    }
}

impl NodeDirectory for Nodes {
    fn node(&self, name: &str) -> Result<Arc<dyn NodeBackend>, NodeError> {
        self.nodes
            .read()
            .expect("nodes")
            .get(name)
            .cloned()
            .ok_or_else(|| NodeError::new(NodeErrorKind::InvalidInput, format!("unknown node `{name}`")))
    }

    fn durable(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        let nodes: Vec<_> = self.nodes.read().expect("nodes").values().cloned().collect();
        Box::pin(all_durable(nodes))
    }
}

/// The machine the host runs on, confined to a root directory: the node's `/etc/motd` is
/// `<root>/etc/motd`. Commands run confined (`capability::sandbox`): the root (at its host
/// path, their working directory in it) and the system's programs are all they see, as an
/// unprivileged user, under the environment's limits, with a cleared environment (only `PATH`
/// and what the plugin passes) and a timeout; at the timeout, when the call is dropped, or when
/// the command's first process ends, every process of it ends. Where the sandbox cannot be set
/// up, commands are refused. Reads return only regular files of at most [`MAX_READ`], checked
/// on the handle opened without blocking.
///
/// File changes are not synced one by one: each is marked ([`Unsynced`]) and the durability
/// fence ([`NodeBackend::durable`]) makes them all durable with one `syncfs(2)` of the root's
/// file system — or one `sync(2)` when a change landed on another file system mounted inside
/// the root.
#[derive(Debug, Clone)]
pub struct LocalNode {
    root: Arc<Dir>,
    root_path: PathBuf,
    /// The device of the root's file system: changes there are synced by `syncfs` on the root.
    root_dev: u64,
    /// The root opened for reading, for `syncfs` (`root` is an `O_PATH` handle, which the
    /// kernel refuses there).
    sync_handle: Arc<std::fs::File>,
    unsynced: Arc<Unsynced>,
    /// Where replaced files wait to be reused ([`LocalNode::with_spares`]).
    spares: Option<Arc<Spares>>,
}

/// [`Unsynced`] bits of the local node: a change on the root's file system, or elsewhere.
const ON_ROOT_FS: u8 = 1;
const ON_OTHER_FS: u8 = 2;

impl LocalNode {
    /// Opens (and creates if missing) the root directory.
    pub fn open(root: impl Into<PathBuf>) -> std::io::Result<LocalNode> {
        let root_path: PathBuf = root.into();
        std::fs::create_dir_all(&root_path)?;
        // Absolute and without symlinks: what commands get bound, and checked against what they
        // see of the system (`Sandbox::confine`), whatever the working directory.
        let root_path = std::fs::canonicalize(&root_path)?;
        let root = Dir::open_ambient_dir(&root_path, ambient_authority())?;
        let root_dev = root.dir_metadata()?.dev();
        let sync_handle = Arc::new(std::fs::File::open(&root_path)?);
        Ok(LocalNode {
            root: Arc::new(root),
            root_path,
            root_dev,
            sync_handle,
            unsynced: Arc::default(),
            spares: None,
        })
    }

    /// Replaces files without allocating or freeing inodes (see `capability::spares`), keeping
    /// replaced files in `dir`: a directory of its own outside the root, on the root's file
    /// system (elsewhere, or inside the root, the node goes without). Emptied here.
    pub fn with_spares(self, dir: &Path) -> std::io::Result<LocalNode> {
        if dir.starts_with(&self.root_path) {
            // Plugins would read replaced files there.
            tracing::warn!(spares = %dir.display(), root = %self.root_path.display(), "spare directory inside the node's root: not used");
            return Ok(self);
        }
        let spares = Spares::open(dir, self.root_dev)?.map(Arc::new);
        Ok(LocalNode { spares, ..self })
    }

    /// Runs blocking file work that changes what is at `path` off the async threads, then marks
    /// the change for the next fence: `changed(root, rel)` names the directory entry or inode it
    /// touched (for its file system), or `None` when nothing changed.
    fn changing<'a, T: Send + 'static>(
        &'a self,
        path: &'a str,
        inline: bool,
        f: impl FnOnce(&Dir, &Path) -> Result<(T, Option<PathBuf>), NodeError> + Send + 'static,
    ) -> BoxFuture<'a, Result<T, NodeError>> {
        let unsynced = self.unsynced.clone();
        let root_dev = self.root_dev;
        self.file_work(path, inline, move |root, rel| {
            let (value, touched) = f(root, rel)?;
            if let Some(touched) = touched {
                // Unknown (vanished meanwhile): count it as elsewhere, which syncs everything.
                let dev = root.symlink_metadata(&touched).map(|m| m.dev()).ok();
                unsynced.mark(if dev == Some(root_dev) { ON_ROOT_FS } else { ON_OTHER_FS });
            }
            Ok(value)
        })
    }

    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Runs a few file system calls on the local disk where the call is (`inline`), or off the
    /// async threads. A handful of syscalls on small files takes microseconds, less than the
    /// hand-over to a blocking thread and back (two wake-ups and context switches per call,
    /// the largest cost of a 10,000-file deploy once files were no longer synced one by one).
    fn file_work<'a, T: Send + 'static>(
        &'a self,
        path: &'a str,
        inline: bool,
        f: impl FnOnce(&Dir, &Path) -> Result<T, NodeError> + Send + 'static,
    ) -> BoxFuture<'a, Result<T, NodeError>> {
        let root = self.root.clone();
        let rel = relative(path);
        Box::pin(async move {
            let rel = rel?;
            if inline {
                return f(&root, &rel);
            }
            tokio::task::spawn_blocking(move || f(&root, &rel))
                .await
                .map_err(|e| NodeError::new(NodeErrorKind::Failed, format!("file task failed: {e}")))?
        })
    }

    /// Quick file work (see [`LocalNode::file_work`]): metadata, links, small files.
    fn quick<'a, T: Send + 'static>(
        &'a self,
        path: &'a str,
        f: impl FnOnce(&Dir, &Path) -> Result<T, NodeError> + Send + 'static,
    ) -> BoxFuture<'a, Result<T, NodeError>> {
        self.file_work(path, true, f)
    }
}

/// Creates a new temporary file beside `rel` (in `parent`), to be renamed over it: only ever a
/// new file (`O_EXCL`: whatever a command left at the name — a FIFO that would block the open, a
/// symlink out — is never opened), under another name while one is taken.
fn create_temp(root: &Dir, parent: &Path, rel: &Path) -> Result<(cap_std::fs::File, PathBuf), NodeError> {
    use cap_std::fs::OpenOptionsExt as _;
    let name = rel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut options = OpenOptions::new();
    options
        .write(true)
        .create_new(true)
        .custom_flags((rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY).bits() as i32);
    let mut last = None;
    for _ in 0..16 {
        let tmp = parent.join(format!(
            ".{name}.orc-tmp-{}-{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        match root.open_with(&tmp, &options) {
            Ok(file) => return Ok((file, tmp)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some((tmp, e)),
            Err(e) => return Err(io_error(&tmp, "create", e)),
        }
    }
    let (tmp, e) = last.expect("tried");
    Err(io_error(&tmp, "create", e))
}

/// Files up to this size are read and written inline (see [`LocalNode::file_work`]).
const INLINE_BYTES: u64 = 256 << 10;

/// `/etc/motd` → `etc/motd`; `/` → `.`. Refuses relative paths and NUL bytes; `..` that would leave
/// the root is refused by `cap-std` itself.
fn relative(path: &str) -> Result<PathBuf, NodeError> {
    if path.contains('\0') {
        return Err(NodeError::new(
            NodeErrorKind::InvalidInput,
            format!("path `{}` contains a NUL byte", path.escape_debug()),
        ));
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(NodeError::new(
            NodeErrorKind::InvalidInput,
            format!("path `{path}` is not absolute"),
        ));
    };
    let rest = rest.trim_start_matches('/');
    Ok(if rest.is_empty() { PathBuf::from(".") } else { PathBuf::from(rest) })
}

/// Maps an I/O error on `path` to a node error that names the path.
fn io_error(path: &Path, what: &str, e: std::io::Error) -> NodeError {
    let shown = Path::new("/").join(path);
    let kind = match e.kind() {
        std::io::ErrorKind::PermissionDenied => NodeErrorKind::Denied,
        std::io::ErrorKind::NotFound | std::io::ErrorKind::IsADirectory | std::io::ErrorKind::NotADirectory => NodeErrorKind::InvalidInput,
        _ => NodeErrorKind::Failed,
    };
    // cap-std reports an escape from the root as a generic error mentioning the sandbox.
    let text = e.to_string();
    if text.contains("outside of the filesystem") || text.contains("sandbox") {
        return NodeError::new(
            NodeErrorKind::Denied,
            format!("cannot {what} {}: the path leads outside the node's root", shown.display()),
        );
    }
    NodeError::new(kind, format!("cannot {what} {}: {e}", shown.display()))
}

fn stat_of(meta: &cap_std::fs::Metadata) -> FileStat {
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Directory
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    };
    FileStat {
        kind,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime_ms: meta.mtime() * 1000 + meta.mtime_nsec() / 1_000_000,
    }
}

/// How the local node opens a path to act on the handle: not following a final symlink (a link
/// swapped in meanwhile fails), without blocking (opening a FIFO waits for a writer) and never
/// as a controlling terminal; for reading, and for writing too when `write`.
pub(crate) fn handle_options(write: bool) -> OpenOptions {
    let mut options = OpenOptions::new();
    options.read(true).write(write);
    cap_fs_ext::OpenOptionsFollowExt::follow(&mut options, cap_fs_ext::FollowSymlinks::No);
    cap_std::fs::OpenOptionsExt::custom_flags(
        &mut options,
        (rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY).bits() as i32,
    );
    options
}

/// Opens `rel` to read it, without blocking (opening a FIFO waits for a writer; a device's open
/// may act), and checks what the handle is ([`check_readable`]: a regular file within
/// [`MAX_READ`]), so nothing swapped in after a check is read. `None` when nothing is there.
fn open_to_read(root: &Dir, rel: &Path) -> Result<Option<(cap_std::fs::File, u64)>, NodeError> {
    use cap_std::fs::OpenOptionsExt as _;
    let mut options = OpenOptions::new();
    options
        .read(true)
        .custom_flags((rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY).bits() as i32);
    let file = match root.open_with(rel, &options) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            // A socket cannot be opened at all (ENXIO): say what it is rather than why.
            if let Ok(meta) = root.metadata(rel) {
                check_readable(&shown(rel), Some(meta.mode()), 0)?;
            }
            return Err(io_error(rel, "read", e));
        }
    };
    let meta = file.metadata().map_err(|e| io_error(rel, "read", e))?;
    check_readable(&shown(rel), Some(meta.mode()), meta.len())?;
    Ok(Some((file, meta.len())))
}

/// Reads an opened regular file of `size` bytes (as `fstat` said), never more than
/// [`MAX_READ`]: a file that grew past it meanwhile is refused too.
fn read_to_cap(file: cap_std::fs::File, rel: &Path, size: u64) -> Result<Vec<u8>, NodeError> {
    use std::io::Read as _;
    let mut content = Vec::with_capacity(size.min(MAX_READ) as usize);
    file.take(MAX_READ + 1)
        .read_to_end(&mut content)
        .map_err(|e| io_error(rel, "read", e))?;
    if content.len() as u64 > MAX_READ {
        return Err(too_large(&shown(rel), None));
    }
    Ok(content)
}

fn lstat(root: &Dir, rel: &Path) -> Result<Option<FileStat>, NodeError> {
    match root.symlink_metadata(rel) {
        Ok(m) => Ok(Some(stat_of(&m))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error(rel, "stat", e)),
    }
}

impl NodeBackend for LocalNode {
    fn run(&self, command: NodeCommand) -> BoxFuture<'_, Result<CommandOutput, NodeError>> {
        Box::pin(async move {
            let Some(program) = command.argv.first().cloned() else {
                return Err(NodeError::new(NodeErrorKind::InvalidInput, "command has an empty argv"));
            };
            if let Some((name, _)) = command.env.iter().find(|(k, _)| k.is_empty() || k.contains(['=', '\0'])) {
                return Err(NodeError::new(
                    NodeErrorKind::InvalidInput,
                    format!("`{}` is not an environment variable's name", name.escape_debug()),
                ));
            }
            let sandbox = Sandbox::host()
                .await
                .map_err(|e| NodeError::new(NodeErrorKind::Denied, e.to_string()))?;
            let cwd = match &command.cwd {
                Some(c) => {
                    let rel = relative(c)?;
                    // Checked through the root: a symlink out of it is refused here too.
                    let meta = self.root.metadata(&rel).map_err(|e| io_error(&rel, "run in", e))?;
                    if !meta.is_dir() {
                        return Err(NodeError::new(
                            NodeErrorKind::InvalidInput,
                            format!("cannot run in {c}: not a directory"),
                        ));
                    }
                    self.root_path.join(rel)
                }
                None => self.root_path.clone(),
            };
            let mut confined = sandbox
                .confine(&self.root_path, &cwd, &command.argv, &command.env, command.limits)
                .map_err(|e| NodeError::new(NodeErrorKind::Failed, format!("cannot confine `{program}`: {e}")))?;
            confined
                .command
                .env_clear()
                .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
                .stdin(if command.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                // A process group of its own on the host (`sh`, then `bwrap`), killed whole at
                // the timeout or when the call is dropped; the sandbox's PID namespace ends
                // with it, and every process in it.
                .process_group(0);
            let mut child = confined
                .command
                .spawn()
                .map_err(|e| NodeError::new(NodeErrorKind::InvalidInput, format!("cannot start `{program}`: {e}")))?;
            let group = ProcessGroup::of(&child);
            if let Some(input) = command.stdin {
                let mut stdin = child.stdin.take().expect("piped");
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    let _ = stdin.write_all(&input).await;
                });
            }
            let mut stdout = tokio::spawn(read_capped(child.stdout.take().expect("piped")));
            let mut stderr = tokio::spawn(read_capped(child.stderr.take().expect("piped")));
            let timeout = command.timeout.unwrap_or(DEFAULT_COMMAND_TIMEOUT);
            // The output is waited for within the timeout too: a process left behind holding it
            // open must not hold the call.
            let finished = tokio::time::timeout(timeout, async {
                let status = child.wait().await;
                (
                    status,
                    (&mut stdout).await.unwrap_or_default(),
                    (&mut stderr).await.unwrap_or_default(),
                )
            })
            .await;
            let Ok((status, stdout, mut stderr)) = finished else {
                drop(group);
                let _ = child.kill().await;
                stdout.abort();
                stderr.abort();
                return Err(NodeError::new(
                    NodeErrorKind::Failed,
                    format!("command `{program}` timed out after {timeout:?} and was killed"),
                ));
            };
            // Ended: `bwrap` is gone, and with it every process of the sandbox.
            group.release();
            let status = status.map_err(|e| NodeError::new(NodeErrorKind::Failed, format!("waiting for `{program}`: {e}")))?;
            if let Some(failure) = sandbox::setup_failure(status.code(), &stderr) {
                let kind = if failure.contains("execvp") {
                    NodeErrorKind::InvalidInput
                } else {
                    NodeErrorKind::Failed
                };
                return Err(NodeError::new(kind, format!("cannot start `{program}`: {failure}")));
            }
            if let Some(report) = confined.report() {
                stderr.extend_from_slice(report.as_bytes());
            }
            Ok(CommandOutput {
                exit_code: status.code().unwrap_or(-1),
                stdout,
                stderr,
            })
        })
    }

    fn read_file<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, NodeError>> {
        Box::pin(async move {
            // Opened and checked where the call is; read there too unless it is large.
            let Some((file, size)) = self.quick(path, open_to_read).await? else {
                return Ok(None);
            };
            let rel = relative(path)?;
            if size <= INLINE_BYTES {
                return read_to_cap(file, &rel, size).map(Some);
            }
            tokio::task::spawn_blocking(move || read_to_cap(file, &rel, size))
                .await
                .map_err(|e| NodeError::new(NodeErrorKind::Failed, format!("file task failed: {e}")))?
                .map(Some)
        })
    }

    fn write_file<'a>(&'a self, path: &'a str, content: Vec<u8>, mode: Option<u32>) -> BoxFuture<'a, Result<(), NodeError>> {
        // Small writes run inline. Replacing a file would free the old one's blocks inside the
        // rename, which can wait for the disk: the old file is held open across the rename and
        // freed by the reaper instead.
        let inline = content.len() as u64 <= INLINE_BYTES;
        let spares = self.spares.clone();
        self.changing(path, inline, move |root, rel| {
            let existing = lstat(root, rel)?;
            if let Some(s) = &existing
                && s.kind == FileKind::Directory
            {
                return Err(NodeError::new(
                    NodeErrorKind::InvalidInput,
                    format!("{} is a directory", Path::new("/").join(rel).display()),
                ));
            }
            let parent = rel.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            match lstat(root, parent)? {
                Some(s) if s.kind == FileKind::Directory => {}
                Some(_) => {
                    return Err(NodeError::new(
                        NodeErrorKind::InvalidInput,
                        format!("{} is not a directory", Path::new("/").join(parent).display()),
                    ));
                }
                None => {
                    return Err(NodeError::new(
                        NodeErrorKind::InvalidInput,
                        format!("parent directory {} does not exist", Path::new("/").join(parent).display()),
                    ));
                }
            }
            let mode = mode.or(existing.as_ref().map(|s| s.mode)).unwrap_or(0o644);
            let replacing = existing.filter(|s| s.kind == FileKind::File);
            // The file replaced is kept as a spare (see `spares`), or else held open across the
            // rename and freed by the reaper (see above): either way the rename frees nothing.
            let kept = match (&spares, &replacing) {
                (Some(spares), Some(old)) => spares.keep(root, rel, old.size),
                _ => None,
            };
            let held = match (&kept, &replacing) {
                (None, Some(_)) => {
                    // Unreadable, the rename frees it here.
                    root.open_with(rel, &handle_options(false)).ok()
                }
                _ => None,
            };
            // A spare with the new content: only where a file was kept, which proves the target
            // is on the spares' file system (a rename cannot cross file systems).
            let filled = match (&spares, &kept) {
                (Some(spares), Some(_)) => spares.fill(&content, mode),
                _ => None,
            };
            let result = match (&spares, filled) {
                (Some(spares), Some(filled)) => match spares.dir().rename(&filled.name, root, rel) {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        spares.put_back(filled);
                        Err(io_error(rel, "replace", e))
                    }
                },
                _ => {
                    let (mut file, tmp) = create_temp(root, parent, rel)?;
                    let result = (|| {
                        file.write_all(&content).map_err(|e| io_error(&tmp, "write", e))?;
                        file.set_permissions(Permissions::from_mode(mode))
                            .map_err(|e| io_error(&tmp, "chmod", e))?;
                        // No `fsync` here: the rename is atomic for readers, and the node's
                        // durability fence makes a whole batch of writes durable at once
                        // before any is recorded.
                        root.rename(&tmp, root, rel).map_err(|e| io_error(rel, "replace", e))
                    })();
                    if result.is_err() {
                        let _ = root.remove_file(&tmp);
                    }
                    result
                }
            };
            if let (Some(spares), Some(kept)) = (&spares, kept) {
                match result {
                    Ok(()) => spares.put(kept),
                    Err(_) => spares.unkeep(&kept),
                }
            }
            if let Some(held) = held {
                Reaper::get().keep(held);
            }
            result.map(|()| ((), Some(parent.to_path_buf())))
        })
    }

    fn stat<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<FileStat>, NodeError>> {
        self.quick(path, lstat)
    }

    fn create_dir<'a>(&'a self, path: &'a str, mode: Option<u32>, parents: bool) -> BoxFuture<'a, Result<(), NodeError>> {
        self.changing(path, true, move |root, rel| {
            let mut changed = mode.is_some();
            match lstat(root, rel)? {
                Some(s) if s.kind == FileKind::Directory => {}
                Some(_) => {
                    return Err(NodeError::new(
                        NodeErrorKind::InvalidInput,
                        format!("{} exists and is not a directory", Path::new("/").join(rel).display()),
                    ));
                }
                None => {
                    let made = if parents { root.create_dir_all(rel) } else { root.create_dir(rel) };
                    made.map_err(|e| io_error(rel, "create directory", e))?;
                    changed = true;
                }
            }
            if let Some(mode) = mode {
                root.set_permissions(rel, Permissions::from_mode(mode))
                    .map_err(|e| io_error(rel, "chmod", e))?;
            }
            // Every directory it made is on the file system of the new one.
            Ok(((), changed.then(|| rel.to_path_buf())))
        })
    }

    fn set_mode<'a>(&'a self, path: &'a str, mode: u32) -> BoxFuture<'a, Result<(), NodeError>> {
        self.changing(path, true, move |root, rel| {
            root.set_permissions(rel, Permissions::from_mode(mode))
                .map_err(|e| io_error(rel, "chmod", e))?;
            Ok(((), Some(rel.to_path_buf())))
        })
    }

    fn remove<'a>(&'a self, path: &'a str, recursive: bool) -> BoxFuture<'a, Result<bool, NodeError>> {
        self.changing(path, !recursive, move |root, rel| {
            if rel == Path::new(".") {
                return Err(NodeError::new(
                    NodeErrorKind::Denied,
                    "refusing to remove the node's root directory",
                ));
            }
            let Some(stat) = lstat(root, rel)? else { return Ok((false, None)) };
            let done = match (stat.kind, recursive) {
                (FileKind::Directory, true) => root.remove_dir_all(rel),
                (FileKind::Directory, false) => root.remove_dir(rel),
                _ => root.remove_file(rel),
            };
            done.map_err(|e| io_error(rel, "remove", e))?;
            // The entry is gone from its parent's file system (a recursive remove also emptied
            // whatever was mounted below, which `sync` covers: the parent then names no mount).
            let parent = rel.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            Ok((true, Some(parent.to_path_buf())))
        })
    }

    fn read_link<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<String>, NodeError>> {
        self.quick(path, |root, rel| {
            match lstat(root, rel)? {
                None => return Ok(None),
                Some(s) if s.kind != FileKind::Symlink => {
                    return Err(NodeError::new(
                        NodeErrorKind::InvalidInput,
                        format!("{} is a {}, not a symlink", shown(rel), s.kind.as_str()),
                    ));
                }
                Some(_) => {}
            }
            let target = root.read_link_contents(rel).map_err(|e| io_error(rel, "read link", e))?;
            target.into_os_string().into_string().map(Some).map_err(|t| {
                NodeError::new(
                    NodeErrorKind::Failed,
                    format!("the target of {} is not UTF-8: {}", shown(rel), t.to_string_lossy()),
                )
            })
        })
    }

    fn create_symlink<'a>(&'a self, target: &'a str, path: &'a str) -> BoxFuture<'a, Result<(), NodeError>> {
        let target = target.to_string();
        self.changing(path, true, move |root, rel| {
            check_link_target(&target)?;
            if let Some(s) = lstat(root, rel)?
                && s.kind != FileKind::Symlink
            {
                return Err(NodeError::new(
                    NodeErrorKind::InvalidInput,
                    format!("{} exists and is a {}, not a symlink", shown(rel), s.kind.as_str()),
                ));
            }
            let parent = existing_parent(root, rel)?;
            let name = rel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let tmp = parent.join(format!(
                ".{name}.orc-tmp-{}-{}",
                std::process::id(),
                TMP_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ));
            // `symlink_contents` stores the target as given (absolute too); following it later
            // goes through cap-std again, which refuses to leave the root.
            root.symlink_contents(&target, &tmp)
                .map_err(|e| io_error(&tmp, "create symlink", e))?;
            root.rename(&tmp, root, rel).map_err(|e| {
                let _ = root.remove_file(&tmp);
                io_error(rel, "replace", e)
            })?;
            Ok(((), Some(parent)))
        })
    }

    fn owner<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<Ownership>, NodeError>> {
        self.quick(path, |root, rel| {
            Ok(lstat(root, rel)?.map(|s| Ownership {
                uid: s.uid,
                gid: s.gid,
                user: account_name(PASSWD, s.uid),
                group: account_name(GROUP, s.gid),
            }))
        })
    }

    fn set_owner<'a>(&'a self, path: &'a str, user: Option<&'a str>, group: Option<&'a str>) -> BoxFuture<'a, Result<(), NodeError>> {
        let user = user.map(str::to_string);
        let group = group.map(str::to_string);
        self.changing(path, true, move |root, rel| {
            let uid = user.as_deref().map(|u| account_id(PASSWD, "user", u)).transpose()?;
            let gid = group.as_deref().map(|g| account_id(GROUP, "group", g)).transpose()?;
            match lstat(root, rel)? {
                None => {
                    return Err(NodeError::new(
                        NodeErrorKind::InvalidInput,
                        format!("cannot change the owner of {}: it does not exist", shown(rel)),
                    ));
                }
                Some(s) if !matches!(s.kind, FileKind::File | FileKind::Directory) => {
                    return Err(NodeError::new(
                        NodeErrorKind::InvalidInput,
                        format!("cannot change the owner of {}: it is a {}", shown(rel), s.kind.as_str()),
                    ));
                }
                Some(_) => {}
            }
            // Changed through a handle that did not follow a final symlink: nothing outside the
            // root can be reached (and a FIFO swapped in does not block the open).
            let file = root.open_with(rel, &handle_options(false)).map_err(|e| io_error(rel, "open", e))?;
            std::os::unix::fs::fchown(&file, uid, gid).map_err(|e| io_error(rel, "chown", e))?;
            Ok(((), Some(rel.to_path_buf())))
        })
    }

    fn durable(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        Box::pin(self.unsynced.fence(|pending| {
            let root = self.sync_handle.clone();
            async move {
                tokio::task::spawn_blocking(move || {
                    if pending & ON_OTHER_FS != 0 {
                        // A file system mounted inside the root: which one is not tracked.
                        rustix::fs::sync();
                        return Ok(());
                    }
                    rustix::fs::syncfs(&*root)
                        .map_err(|e| NodeError::new(NodeErrorKind::Failed, format!("cannot sync the local node's file system: {e}")))
                })
                .await
                .map_err(|e| NodeError::new(NodeErrorKind::Failed, format!("sync task failed: {e}")))?
            }
        }))
    }
}

pub(crate) static TMP_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How the node shows a path relative to its root: `/etc/motd`.
fn shown(rel: &Path) -> String {
    Path::new("/").join(rel).display().to_string()
}

/// The parent of `rel`, which must be an existing directory.
fn existing_parent(root: &Dir, rel: &Path) -> Result<PathBuf, NodeError> {
    let parent = rel.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    match lstat(root, parent)? {
        Some(s) if s.kind == FileKind::Directory => Ok(parent.to_path_buf()),
        Some(_) => Err(NodeError::new(
            NodeErrorKind::InvalidInput,
            format!("{} is not a directory", shown(parent)),
        )),
        None => Err(NodeError::new(
            NodeErrorKind::InvalidInput,
            format!("parent directory {} does not exist", shown(parent)),
        )),
    }
}

/// The local node's users and groups are the host's: its owners are real uids and gids.
const PASSWD: &str = "/etc/passwd";
const GROUP: &str = "/etc/group";

/// `(name, id)` of every entry of a passwd- or group-format file (`name:x:id:…`).
fn accounts(file: &str) -> Vec<(String, u32)> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let id = fields.nth(1)?.parse().ok()?;
            Some((name.to_string(), id))
        })
        .collect()
}

fn account_name(file: &str, id: u32) -> Option<String> {
    accounts(file).into_iter().find(|(_, i)| *i == id).map(|(n, _)| n)
}

/// A name looked up in `file`, or a numeric id as is.
fn account_id(file: &str, what: &str, name: &str) -> Result<u32, NodeError> {
    check_account_name(what, name)?;
    if let Ok(id) = name.parse() {
        return Ok(id);
    }
    accounts(file)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, id)| id)
        .ok_or_else(|| NodeError::new(NodeErrorKind::InvalidInput, format!("unknown {what} `{name}` on the local node")))
}

/// A command's process group (`process_group(0)`: its id is the command's pid), killed with
/// `SIGKILL` to every member when dropped, unless released once the command ended in time.
///
/// The group's id stays taken while any member lives, so a kill reaches only the command's
/// processes; only once every member is gone could the number name another process's group.
struct ProcessGroup(Option<rustix::process::Pid>);

impl ProcessGroup {
    fn of(child: &tokio::process::Child) -> ProcessGroup {
        ProcessGroup(child.id().and_then(|id| rustix::process::Pid::from_raw(id as i32)))
    }

    fn release(mut self) {
        self.0 = None;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(group) = self.0.take() {
            // Gone already (ESRCH) is fine.
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

async fn read_capped(mut stream: impl tokio::io::AsyncRead + Unpin) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 << 10];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => {
                let room = MAX_OUTPUT.saturating_sub(out.len());
                out.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

// ---- the WIT interface over the backends ----

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
    use std::os::unix::fs::MetadataExt as _;

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

    #[tokio::test]
    async fn local_changes_are_marked_until_the_fence_syncs_them() {
        let dir = tempfile::tempdir().unwrap();
        let node = LocalNode::open(dir.path()).unwrap();
        node.durable().await.unwrap();
        // Reading changes nothing.
        assert_eq!(node.read_file("/f").await.unwrap(), None);
        assert!(!node.unsynced.is_marked());
        node.write_file("/f", b"x".to_vec(), None).await.unwrap();
        assert!(node.unsynced.is_marked());
        node.durable().await.unwrap();
        assert!(!node.unsynced.is_marked());
        // Every kind of change is marked; a directory that already exists is no change.
        node.create_dir("/d", None, false).await.unwrap();
        node.durable().await.unwrap();
        node.create_dir("/d", None, false).await.unwrap();
        assert!(!node.unsynced.is_marked());
        for change in [
            Box::pin(node.set_mode("/f", 0o600)) as BoxFuture<'_, Result<(), NodeError>>,
            Box::pin(node.create_symlink("f", "/l")),
            Box::pin(async { node.remove("/l", false).await.map(drop) }),
        ] {
            change.await.unwrap();
            assert!(node.unsynced.is_marked());
            node.durable().await.unwrap();
        }
        // The root's own file system: one `syncfs`, nothing elsewhere.
        node.write_file("/f", b"y".to_vec(), None).await.unwrap();
        assert_eq!(node.unsynced.pending.load(std::sync::atomic::Ordering::SeqCst), ON_ROOT_FS);
        node.durable().await.unwrap();
    }

    #[tokio::test]
    async fn replacing_files_through_spares_keeps_every_name_right() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let node = LocalNode::open(&root).unwrap().with_spares(&dir.path().join("spares")).unwrap();
        assert!(node.spares.is_some(), "same file system: spares in use");
        for i in 0..20 {
            node.write_file(&format!("/f{i}"), format!("first {i}").into_bytes(), None)
                .await
                .unwrap();
        }
        // A file with a second name: its replaced inode must never be written as a spare.
        std::fs::hard_link(root.join("f0"), root.join("other-name")).unwrap();
        for round in 0..3 {
            for i in 0..20 {
                let mode = if i % 2 == 0 { 0o600 } else { 0o640 };
                let content = format!("round {round} of {i}: {}", "x".repeat(i * round));
                node.write_file(&format!("/f{i}"), content.clone().into_bytes(), Some(mode))
                    .await
                    .unwrap();
                let meta = std::fs::metadata(root.join(format!("f{i}"))).unwrap();
                assert_eq!(std::fs::read_to_string(root.join(format!("f{i}"))).unwrap(), content);
                assert_eq!((meta.mode() & 0o7777, meta.nlink()), (mode, 1), "f{i} round {round}");
            }
        }
        assert_eq!(std::fs::read_to_string(root.join("other-name")).unwrap(), "first 0");
        // Nothing left beside the files in the root; the spares stay bounded.
        let mut names: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 21, "{names:?}");
        let spares = std::fs::read_dir(dir.path().join("spares")).unwrap().count();
        assert!(spares <= 2, "{spares} spares after one-at-a-time replaces");
        // A spare directory inside the root is never used: plugins would read old contents.
        let inside = LocalNode::open(&root).unwrap().with_spares(&root.join("spares")).unwrap();
        assert!(inside.spares.is_none());
    }

    #[tokio::test]
    async fn local_node_stays_inside_its_root() {
        let dir = tempfile::tempdir().unwrap();
        let node = LocalNode::open(dir.path().join("root")).unwrap();
        std::fs::write(dir.path().join("secret"), b"outside").unwrap();

        node.create_dir("/etc", Some(0o755), false).await.unwrap();
        node.write_file("/etc/motd", b"hi".to_vec(), Some(0o600)).await.unwrap();
        assert_eq!(node.read_file("/etc/motd").await.unwrap().unwrap(), b"hi");
        let st = node.stat("/etc/motd").await.unwrap().unwrap();
        assert_eq!((st.kind, st.mode, st.size), (FileKind::File, 0o600, 2));
        // Rewriting keeps the mode when none is given.
        node.write_file("/etc/motd", b"hello".to_vec(), None).await.unwrap();
        assert_eq!(node.stat("/etc/motd").await.unwrap().unwrap().mode, 0o600);

        for escape in ["/../secret", "/etc/../../secret"] {
            let err = node.read_file(escape).await.unwrap_err();
            assert_eq!(err.kind, NodeErrorKind::Denied, "{escape}: {err}");
            let err = node.write_file(escape, b"x".to_vec(), None).await.unwrap_err();
            assert!(
                matches!(err.kind, NodeErrorKind::Denied | NodeErrorKind::InvalidInput),
                "{escape}: {err}"
            );
        }
        assert_eq!(std::fs::read(dir.path().join("secret")).unwrap(), b"outside");
        // A symlink pointing outside cannot be followed.
        std::os::unix::fs::symlink(dir.path().join("secret"), dir.path().join("root/etc/link")).unwrap();
        assert!(node.read_file("/etc/link").await.is_err());

        let err = node.read_file("etc/motd").await.unwrap_err();
        assert!(err.message.contains("not absolute"), "{err}");
        let err = node.write_file("/nope/file", b"x".to_vec(), None).await.unwrap_err();
        assert!(err.message.contains("parent directory /nope does not exist"), "{err}");
        assert!(node.remove("/", true).await.is_err());
        assert!(node.remove("/etc/motd", false).await.unwrap());
        assert!(!node.remove("/etc/motd", false).await.unwrap());
    }

    #[tokio::test]
    async fn local_symlinks_are_stored_as_given_and_never_followed_out_of_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let node = LocalNode::open(&root).unwrap();
        std::fs::write(dir.path().join("secret"), b"outside").unwrap();
        node.create_dir("/etc", None, false).await.unwrap();
        node.write_file("/etc/motd", b"hi".to_vec(), None).await.unwrap();

        assert_eq!(node.read_link("/etc/link").await.unwrap(), None);
        node.create_symlink("motd", "/etc/link").await.unwrap();
        assert_eq!(node.read_link("/etc/link").await.unwrap().as_deref(), Some("motd"));
        assert_eq!(std::fs::read_link(root.join("etc/link")).unwrap(), Path::new("motd"));
        assert_eq!(node.stat("/etc/link").await.unwrap().unwrap().kind, FileKind::Symlink);
        assert_eq!(node.read_file("/etc/link").await.unwrap().unwrap(), b"hi");
        // Replaced atomically; absolute targets are stored as given.
        node.create_symlink("/etc/motd", "/etc/link").await.unwrap();
        assert_eq!(node.read_link("/etc/link").await.unwrap().as_deref(), Some("/etc/motd"));
        // A link that leads out of the root is created but cannot be followed.
        let outside = dir.path().join("secret");
        node.create_symlink(outside.to_str().unwrap(), "/etc/out").await.unwrap();
        node.create_symlink("../../secret", "/etc/up").await.unwrap();
        for link in ["/etc/out", "/etc/up"] {
            let err = node.read_file(link).await.unwrap_err();
            assert_eq!(err.kind, NodeErrorKind::Denied, "{link}: {err}");
            let err = node.set_owner(link, Some("0"), None).await.unwrap_err();
            assert_eq!(err.kind, NodeErrorKind::InvalidInput, "{link}: {err}");
        }
        // No leftovers; a file or directory in the way is refused; a missing parent is named.
        let names: Vec<_> = std::fs::read_dir(root.join("etc"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
        let err = node.create_symlink("x", "/etc/motd").await.unwrap_err();
        assert_eq!(err.kind, NodeErrorKind::InvalidInput);
        assert!(err.message.contains("/etc/motd exists and is a file"), "{err}");
        let err = node.create_symlink("x", "/etc").await.unwrap_err();
        assert!(err.message.contains("is a directory"), "{err}");
        let err = node.create_symlink("x", "/nope/link").await.unwrap_err();
        assert!(err.message.contains("parent directory /nope does not exist"), "{err}");
        let err = node.read_link("/etc/motd").await.unwrap_err();
        assert!(err.message.contains("/etc/motd is a file, not a symlink"), "{err}");
        assert!(node.create_symlink("", "/etc/l2").await.is_err());
        assert!(node.create_symlink("x", "/../escape").await.is_err());
        assert!(!dir.path().join("escape").exists());
    }

    #[tokio::test]
    async fn local_owners_are_read_and_changed_by_name_or_id() {
        let dir = tempfile::tempdir().unwrap();
        let node = LocalNode::open(dir.path()).unwrap();
        node.write_file("/f", b"x".to_vec(), None).await.unwrap();
        node.create_dir("/d", None, false).await.unwrap();
        let me = std::fs::metadata(dir.path().join("f")).unwrap();
        let o = node.owner("/f").await.unwrap().unwrap();
        assert_eq!((o.uid, o.gid), (me.uid(), me.gid()));
        assert_eq!(o.user, account_name(PASSWD, me.uid()));
        assert_eq!(node.owner("/missing").await.unwrap(), None);

        // Changing to what it already is works without privileges; by id and by name.
        node.set_owner("/f", Some(&me.uid().to_string()), Some(&me.gid().to_string()))
            .await
            .unwrap();
        if let (Some(user), Some(group)) = (o.user.clone(), o.group.clone()) {
            node.set_owner("/d", Some(&user), Some(&group)).await.unwrap();
        }
        let is_root = me.uid() == 0;
        if is_root {
            // `nobody`/`nogroup` (65534) exist on Debian; ids work whatever the names are.
            node.set_owner("/f", Some("65534"), None).await.unwrap();
            let m = std::fs::metadata(dir.path().join("f")).unwrap();
            assert_eq!((m.uid(), m.gid()), (65534, me.gid()));
            node.set_owner("/d", None, Some("65534")).await.unwrap();
            let m = std::fs::metadata(dir.path().join("d")).unwrap();
            assert_eq!((m.uid(), m.gid()), (me.uid(), 65534));
            assert_eq!(node.owner("/d").await.unwrap().unwrap().gid, 65534);
        }
        let err = node.set_owner("/f", Some("no-such-user-orc"), None).await.unwrap_err();
        assert_eq!(err.kind, NodeErrorKind::InvalidInput);
        assert!(err.message.contains("unknown user `no-such-user-orc`"), "{err}");
        let err = node.set_owner("/f", Some("a:b"), None).await.unwrap_err();
        assert!(err.message.contains("not a valid name"), "{err}");
        let err = node.set_owner("/missing", Some("0"), None).await.unwrap_err();
        assert!(err.message.contains("/missing: it does not exist"), "{err}");
    }

    /// A file past [`MAX_READ`] is refused from its size, before anything is read or reserved:
    /// a 64 GiB sparse file in the root aborted the host (cap-std reserved its whole length).
    #[tokio::test]
    async fn a_file_past_the_read_cap_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let node = LocalNode::open(dir.path()).unwrap();
        let huge = std::fs::File::create(dir.path().join("huge")).unwrap();
        huge.set_len(64 << 30).unwrap();
        let err = node.read_file("/huge").await.unwrap_err();
        assert_eq!(err.kind, NodeErrorKind::TooLarge, "{err}");
        assert!(err.message.starts_with("too_large: /huge is 68719476736 bytes"), "{err}");
        assert!(err.message.contains(&MAX_READ.to_string()), "{err}");
        // Permanent for the plugin: retrying cannot help.
        assert!(matches!(to_wit(err).kind, ErrorKind::Permanent));
        // Through a symlink too; at the cap a file is read whole, one byte more and it is not.
        std::os::unix::fs::symlink("huge", dir.path().join("link")).unwrap();
        assert_eq!(node.read_file("/link").await.unwrap_err().kind, NodeErrorKind::TooLarge);
        let at_cap = std::fs::File::create(dir.path().join("at-cap")).unwrap();
        at_cap.set_len(MAX_READ).unwrap();
        assert_eq!(node.read_file("/at-cap").await.unwrap().unwrap().len() as u64, MAX_READ);
        at_cap.set_len(MAX_READ + 1).unwrap();
        let Err(err) = node.read_file("/at-cap").await else {
            panic!("a file past the read cap was read");
        };
        assert_eq!(err.kind, NodeErrorKind::TooLarge, "{err}");
    }

    /// A FIFO, a socket or a device in the root is refused by its type once opened without
    /// blocking: reading a FIFO wedged a thread until a writer came. Read on a thread of its own,
    /// so that a regression fails here instead of hanging the test.
    #[test]
    fn special_files_are_refused_before_they_block() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let fifo = root.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        std::os::unix::fs::symlink("fifo", root.join("to-fifo")).unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(root.join("socket")).unwrap();
        let mut special = vec![("/fifo", "FIFO"), ("/to-fifo", "FIFO"), ("/socket", "socket")];
        // A device node needs CAP_MKNOD (the tests run as root where sshd is tested).
        let null = std::process::Command::new("mknod")
            .arg(root.join("null"))
            .args(["c", "1", "3"])
            .output();
        if null.is_ok_and(|o| o.status.success()) {
            special.push(("/null", "character device"));
        }
        let count = special.len();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader_root = root.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let node = LocalNode::open(&reader_root).unwrap();
            for (path, kind) in special {
                let _ = tx.send((path, kind, rt.block_on(node.read_file(path))));
            }
            // Nor is a FIFO's owner changed: refused by its type (the handle is opened without
            // blocking as well, for one swapped in after that check).
            let owned = rt.block_on(node.set_owner("/fifo", Some("0"), None)).map(|()| None);
            let _ = tx.send(("/fifo", "owner change", owned));
        });
        for _ in 0..count {
            let Ok((path, kind, result)) = rx.recv_timeout(Duration::from_secs(10)) else {
                // Let the blocked reader go (a writer opens the FIFO), then fail.
                let mut writer = std::fs::OpenOptions::new();
                writer.write(true);
                std::os::unix::fs::OpenOptionsExt::custom_flags(&mut writer, rustix::fs::OFlags::NONBLOCK.bits() as i32);
                let _ = writer.open(&fifo);
                panic!("reading a special file blocked");
            };
            let err = result.unwrap_err();
            assert_eq!(err.kind, NodeErrorKind::InvalidInput, "{path}: {err}");
            assert!(err.message.contains(&format!("{path}: it is a {kind}")), "{path}: {err}");
        }
        let (_, _, owned) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("changing the owner of a FIFO blocked");
        let err = owned.unwrap_err();
        assert_eq!(err.kind, NodeErrorKind::InvalidInput, "{err}");
        assert!(err.message.contains("/fifo: it is a"), "{err}");
    }

    /// A background loop a script starts: it rewrites `beat` in the root every 50 ms while it
    /// runs. The sandbox has its own PID namespace, so the test watches the file, not a pid.
    const HEARTBEAT: &str = "(while :; do date +%s%N > beat; sleep 0.05; done) &";

    /// Waits (at most 10 s) for the heartbeat in `dir` to start.
    async fn beating(dir: &Path) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !dir.join("beat").exists() {
            assert!(std::time::Instant::now() < deadline, "the heartbeat never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Whether the heartbeat in `dir` stopped within 5 s (no change over 400 ms).
    async fn stopped(dir: &Path) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let read = || std::fs::read_to_string(dir.join("beat")).unwrap_or_default();
        while std::time::Instant::now() < deadline {
            let before = read();
            tokio::time::sleep(Duration::from_millis(400)).await;
            if read() == before {
                return true;
            }
        }
        false
    }

    fn sh(script: &str, timeout: Duration) -> NodeCommand {
        NodeCommand {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            timeout: Some(timeout),
            ..Default::default()
        }
    }

    /// Every process of a command ends at its timeout: a grandchild the shell waits for, and one
    /// that holds the output open after the shell is gone (which held the call open until the
    /// plugin's deadline and outlived it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_timeout_kills_every_process_of_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let node = LocalNode::open(dir.path()).unwrap();
        for (what, script) in [
            ("waited for", format!("{HEARTBEAT} wait")),
            ("holding stdout", format!("{HEARTBEAT} echo started; sleep 100")),
        ] {
            let _ = std::fs::remove_file(dir.path().join("beat"));
            let timeout = Duration::from_millis(700);
            let started = std::time::Instant::now();
            let result = tokio::time::timeout(Duration::from_secs(10), node.run(sh(&script, timeout)))
                .await
                .unwrap_or_else(|_| panic!("{what}: the call outlived its timeout by far"));
            let err = result.unwrap_err();
            assert!(err.message.contains("timed out"), "{what}: {err}");
            assert!(
                started.elapsed() < timeout + Duration::from_secs(2),
                "{what}: took {:?}",
                started.elapsed()
            );
            beating(dir.path()).await;
            assert!(stopped(dir.path()).await, "{what}: a grandchild outlived the timeout");
        }
    }

    /// What a command leaves running in the background ends when the command ends: the sandbox's
    /// PID namespace ends with its first process.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_a_command_leaves_running_ends_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let node = LocalNode::open(dir.path()).unwrap();
        let script = format!("{HEARTBEAT} exec >/dev/null 2>&1; while [ ! -e beat ]; do sleep 0.01; done");
        let out = node.run(sh(&script, Duration::from_secs(10))).await.unwrap();
        assert_eq!(out.exit_code, 0);
        assert!(stopped(dir.path()).await, "a process the command left behind runs on");
    }

    /// A call dropped before its command ends (the plugin's own deadline passed) kills every
    /// process of the command, not only its first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_call_kills_every_process_of_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let node = LocalNode::open(dir.path()).unwrap();
        let script = format!("{HEARTBEAT} wait");
        let run = node.run(sh(&script, Duration::from_secs(60)));
        tokio::select! {
            done = run => panic!("the command ended: {done:?}"),
            () = beating(dir.path()) => {}
        };
        assert!(stopped(dir.path()).await, "a grandchild outlived the dropped call");
    }

    #[tokio::test]
    async fn local_commands_run_in_the_root_with_a_clean_environment() {
        let dir = tempfile::tempdir().unwrap();
        let node = LocalNode::open(dir.path()).unwrap();
        let out = node
            .run(NodeCommand {
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    "pwd; echo \"$GREETING\"; echo \"${HOME:-nohome}\"; cat".into(),
                ],
                stdin: Some(b"from stdin".to_vec()),
                env: vec![("GREETING".into(), "hello".into())],
                ..Default::default()
            })
            .await
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(out.exit_code, 0);
        assert!(
            text.starts_with(&format!(
                "{}\nhello\nnohome\nfrom stdin",
                dir.path().canonicalize().unwrap().display()
            )),
            "{text}"
        );
        let err = node
            .run(NodeCommand {
                argv: vec!["sleep".into(), "5".into()],
                timeout: Some(Duration::from_millis(100)),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(err.message.contains("timed out"), "{err}");
    }
}

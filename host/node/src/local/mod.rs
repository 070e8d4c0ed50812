//! The local node: the machine the host runs on, confined to a root directory opened through
//! `cap-std`, so no path a plugin gives can reach outside it. The file functions are here; its
//! commands are `command` (confined by the crate's `sandbox`), its owners' names `accounts`, and
//! how a replace neither allocates nor frees an inode `spares` and `reaper`.

mod accounts;
mod command;
mod reaper;
mod spares;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, MetadataExt, OpenOptions, Permissions, PermissionsExt};

use self::accounts::{GROUP, PASSWD, account_id, account_name};
use self::reaper::Reaper;
use self::spares::Spares;
use crate::{
    BoxFuture, CommandOutput, FileKind, FileStat, MAX_READ, NodeBackend, NodeCommand, NodeError, NodeErrorKind, Ownership, Unsynced,
    check_link_target, check_readable, too_large,
};

/// The machine the host runs on, confined to a root directory: the node's `/etc/motd` is
/// `<root>/etc/motd`. Commands run confined (`sandbox`): the root (at its host
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

    /// Replaces files without allocating or freeing inodes (see `spares`), keeping
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
        Box::pin(self.run_confined(command))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;
    use std::time::Duration;

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
}

//! File operations over one SFTP session per connection (russh-sftp's raw session: it is the only
//! way to reach `posix-rename@openssh.com`, and it lets us pipeline reads and writes ourselves).
//! Semantics follow `LocalNode`: `stat` is an lstat, a missing file reads as `None`, writes are
//! atomic (temporary file beside the target, then rename over it).

use std::sync::atomic::{AtomicU64, Ordering};

use futures::{StreamExt, TryStreamExt};
use orc_node::{FileKind, FileStat, MAX_READ, NodeError, NodeErrorKind, check_readable, too_large};
use russh_sftp::client::RawSftpSession;
use russh_sftp::client::error::Error as SftpError;
use russh_sftp::protocol::{FileAttributes, OpenFlags, Packet, StatusCode};
use tokio::sync::Semaphore;

use crate::SshError;
use crate::connection::Connection;

/// Bytes per read or write request; OpenSSH takes up to 255 KiB, the protocol promises 32 KiB.
const CHUNK: usize = 64 << 10;
/// Read or write requests in flight per file.
const IN_FLIGHT: usize = 16;

const S_IFMT: u32 = 0o170000;
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

pub(crate) struct Sftp {
    node: String,
    raw: RawSftpSession,
    /// Open handles at once (see `SshOptions::max_open_files`).
    files: Semaphore,
    posix_rename: bool,
}

impl Sftp {
    pub async fn start(channel: russh::Channel<russh::client::Msg>, conn: &Connection) -> Result<Sftp, SshError> {
        let config = russh_sftp::client::Config {
            request_timeout_secs: conn.sftp_timeout.as_secs().max(1),
            ..Default::default()
        };
        let raw = RawSftpSession::new_with_config(channel.into_stream(), config);
        let version = raw.init().await.map_err(|e| SshError::Sftp {
            node: conn.node.clone(),
            message: format!("cannot start the sftp session: {e}"),
        })?;
        let has = |name: &str| version.extensions.contains_key(name);
        Ok(Sftp {
            node: conn.node.clone(),
            posix_rename: has("posix-rename@openssh.com"),
            raw,
            files: Semaphore::new(conn.max_open_files),
        })
    }

    /// Maps an SFTP failure on `path` to a node error. Transport failures are `Unavailable`, which
    /// makes the caller drop the connection and try once more on a new one.
    fn error(&self, what: &str, path: &str, e: SftpError) -> NodeError {
        match e {
            SftpError::Status(s) => {
                let kind = match s.status_code {
                    StatusCode::NoSuchFile => NodeErrorKind::InvalidInput,
                    StatusCode::PermissionDenied => NodeErrorKind::Denied,
                    StatusCode::NoConnection | StatusCode::ConnectionLost => NodeErrorKind::Unavailable,
                    _ => NodeErrorKind::Failed,
                };
                let detail = if s.error_message.is_empty() {
                    s.status_code.to_string()
                } else {
                    s.error_message.to_lowercase()
                };
                NodeError::new(kind, format!("cannot {what} {path} on node {}: {detail}", self.node))
            }
            SftpError::Timeout => NodeError::new(
                NodeErrorKind::Unavailable,
                format!("cannot {what} {path}: node {} did not answer in time", self.node),
            ),
            SftpError::IO(m) | SftpError::UnexpectedBehavior(m) => NodeError::new(
                NodeErrorKind::Unavailable,
                format!("cannot {what} {path}: sftp session with node {} failed: {m}", self.node),
            ),
            e => NodeError::new(NodeErrorKind::Failed, format!("cannot {what} {path} on node {}: {e}", self.node)),
        }
    }

    pub async fn lstat(&self, path: &str) -> Result<Option<FileStat>, NodeError> {
        match self.raw.lstat(path).await {
            Ok(attrs) => Ok(Some(stat_of(&attrs.attrs))),
            Err(SftpError::Status(s)) if s.status_code == StatusCode::NoSuchFile => Ok(None),
            Err(e) => Err(self.error("stat", path, e)),
        }
    }

    /// The file's content, if it is a regular file within [`MAX_READ`] ([`check_readable`]).
    /// What `path` is (through a final symlink) is checked before it is opened: OpenSSH's
    /// sftp-server opens a FIFO with a blocking `open(2)`, which would hold its whole session
    /// until a writer came. What the opened handle is is checked again before it is read. Left
    /// open: a FIFO put at `path` between the check and the open still blocks the session, until
    /// its requests time out and the connection is replaced (the old sftp-server stays blocked
    /// on the node until the FIFO gets a writer).
    pub async fn read_file(&self, path: &str) -> Result<Option<Vec<u8>>, NodeError> {
        let attrs = match self.raw.lstat(path).await {
            Ok(attrs) => attrs.attrs,
            Err(SftpError::Status(s)) if s.status_code == StatusCode::NoSuchFile => return Ok(None),
            Err(e) => return Err(self.error("stat", path, e)),
        };
        let attrs = if attrs.permissions.is_some_and(|p| p & S_IFMT == S_IFLNK) {
            match self.raw.stat(path).await {
                Ok(attrs) => attrs.attrs,
                // A dangling link: nothing to read.
                Err(SftpError::Status(s)) if s.status_code == StatusCode::NoSuchFile => return Ok(None),
                Err(e) => return Err(self.error("stat", path, e)),
            }
        } else {
            attrs
        };
        check_readable(path, attrs.permissions, attrs.size.unwrap_or(0))?;
        let _permit = self.files.acquire().await.expect("never closed");
        let handle = match self.raw.open(path, OpenFlags::READ, FileAttributes::empty()).await {
            Ok(h) => h.handle,
            Err(SftpError::Status(s)) if s.status_code == StatusCode::NoSuchFile => return Ok(None),
            Err(e) => return Err(self.error("read", path, e)),
        };
        let result = self.read_handle(&handle, path).await;
        let _ = self.raw.close(handle).await;
        result.map(Some)
    }

    /// Reads the size `fstat` reports with pipelined requests, then on until end of file (the
    /// file may have grown; a short reply means the server gave less than asked), never more
    /// than [`MAX_READ`]: the buffer is reserved for at most that, and a file that grows past
    /// it is refused.
    async fn read_handle(&self, handle: &str, path: &str) -> Result<Vec<u8>, NodeError> {
        let attrs = self.raw.fstat(handle).await.map_err(|e| self.error("read", path, e))?.attrs;
        let size = attrs.size.unwrap_or(0);
        check_readable(path, attrs.permissions, size)?;
        let mut out = Vec::with_capacity(size as usize);
        let chunks = size.div_ceil(CHUNK as u64);
        let mut replies = futures::stream::iter(0..chunks)
            .map(|i| self.raw.read(handle, i * CHUNK as u64, CHUNK as u32))
            .buffered(IN_FLIGHT);
        while let Some(reply) = replies.next().await {
            match reply {
                Ok(data) => {
                    let full = data.data.len() == CHUNK;
                    out.extend_from_slice(&data.data);
                    if !full {
                        break;
                    }
                }
                Err(SftpError::Status(s)) if s.status_code == StatusCode::Eof => break,
                Err(e) => return Err(self.error("read", path, e)),
            }
        }
        drop(replies);
        loop {
            match self.raw.read(handle, out.len() as u64, CHUNK as u32).await {
                Ok(data) if data.data.is_empty() => return Ok(out),
                Ok(data) => out.extend_from_slice(&data.data),
                Err(SftpError::Status(s)) if s.status_code == StatusCode::Eof => return Ok(out),
                Err(e) => return Err(self.error("read", path, e)),
            }
            if out.len() as u64 > MAX_READ {
                return Err(too_large(path, None));
            }
        }
    }

    /// `path`'s parent directory and last component; the parent must exist and be a directory
    /// (where a temporary file is made before it is renamed over `path`).
    async fn existing_parent<'p>(&self, path: &'p str) -> Result<(&'p str, &'p str), NodeError> {
        let (parent, name) = split(path);
        match self.lstat(parent).await? {
            Some(s) if s.kind == FileKind::Directory => Ok((parent, name)),
            Some(_) => Err(NodeError::new(NodeErrorKind::InvalidInput, format!("{parent} is not a directory"))),
            None => Err(NodeError::new(
                NodeErrorKind::InvalidInput,
                format!("parent directory {parent} does not exist"),
            )),
        }
    }

    /// Atomic replace: a temporary file in the same directory, created exclusively, written in
    /// pipelined chunks, chmod, closed, then `posix-rename` over the target. Not synced: the
    /// node's durability fence (`SshNode::durable`) syncs a whole batch of writes at once.
    pub async fn write_file(&self, path: &str, content: &[u8], mode: Option<u32>) -> Result<(), NodeError> {
        let existing = self.lstat(path).await?;
        if existing.as_ref().is_some_and(|s| s.kind == FileKind::Directory) {
            return Err(NodeError::new(NodeErrorKind::InvalidInput, format!("{path} is a directory")));
        }
        let (parent, name) = self.existing_parent(path).await?;
        if !self.posix_rename {
            return Err(NodeError::new(
                NodeErrorKind::Failed,
                format!(
                    "node {} has no posix-rename@openssh.com: cannot replace files atomically",
                    self.node
                ),
            ));
        }
        let mode = mode.or(existing.map(|s| s.mode)).unwrap_or(0o644);
        let tmp = format!(
            "{}/.{name}.orc-tmp-{}-{}",
            parent.trim_end_matches('/'),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let result = self.write_tmp(&tmp, content, mode).await;
        let result = match result {
            // The caller's gate, right before the change is committed (`orc_node::gate`).
            Ok(()) if !orc_node::gate::open() => Err(NodeError::new(
                NodeErrorKind::Unavailable,
                format!("{path} on node {} is not replaced: the change may no longer be made", self.node),
            )),
            Ok(()) => self.rename(&tmp, path).await,
            Err(e) => Err(e),
        };
        if result.is_err() {
            let _ = self.raw.remove(tmp.as_str()).await;
        }
        result
    }

    async fn write_tmp(&self, tmp: &str, content: &[u8], mode: u32) -> Result<(), NodeError> {
        let _permit = self.files.acquire().await.expect("never closed");
        let mut attrs = FileAttributes::empty();
        attrs.permissions = Some(0o600);
        let flags = OpenFlags::CREATE | OpenFlags::EXCLUDE | OpenFlags::TRUNCATE | OpenFlags::WRITE;
        let handle = self
            .raw
            .open(tmp, flags, attrs)
            .await
            .map_err(|e| self.error("create", tmp, e))?
            .handle;
        let written = async {
            futures::stream::iter((0..content.len()).step_by(CHUNK))
                .map(|offset| {
                    let chunk = content[offset..content.len().min(offset + CHUNK)].to_vec();
                    self.raw.write(handle.as_str(), offset as u64, chunk)
                })
                .buffer_unordered(IN_FLIGHT)
                .try_for_each(|_| async { Ok(()) })
                .await
                .map_err(|e| self.error("write", tmp, e))?;
            // Explicit, so the node's umask does not matter.
            let mut attrs = FileAttributes::empty();
            attrs.permissions = Some(mode & 0o7777);
            self.raw
                .fsetstat(handle.as_str(), attrs)
                .await
                .map_err(|e| self.error("chmod", tmp, e))?;
            Ok(())
        }
        .await;
        let closed = self.raw.close(handle).await.map_err(|e| self.error("close", tmp, e));
        written.and(closed.map(drop))
    }

    async fn rename(&self, from: &str, to: &str) -> Result<(), NodeError> {
        let mut request = Vec::with_capacity(8 + from.len() + to.len());
        for p in [from, to] {
            request.extend_from_slice(&(p.len() as u32).to_be_bytes());
            request.extend_from_slice(p.as_bytes());
        }
        match self.raw.extended("posix-rename@openssh.com", request).await {
            Ok(Packet::Status(s)) if s.status_code == StatusCode::Ok => Ok(()),
            Ok(Packet::Status(s)) => Err(self.error("replace", to, SftpError::Status(s))),
            Ok(other) => Err(NodeError::new(
                NodeErrorKind::Failed,
                format!("cannot replace {to} on node {}: unexpected answer {other:?}", self.node),
            )),
            Err(e) => Err(self.error("replace", to, e)),
        }
    }

    pub async fn create_dir(&self, path: &str, mode: Option<u32>, parents: bool) -> Result<(), NodeError> {
        match self.lstat(path).await? {
            Some(s) if s.kind == FileKind::Directory => {}
            Some(_) => {
                return Err(NodeError::new(
                    NodeErrorKind::InvalidInput,
                    format!("{path} exists and is not a directory"),
                ));
            }
            None if parents => {
                // Every missing ancestor, top down; one made meanwhile by someone else is fine.
                let mut prefix = String::new();
                for part in path.split('/').filter(|p| !p.is_empty()) {
                    prefix.push('/');
                    prefix.push_str(part);
                    match self.lstat(&prefix).await? {
                        Some(s) if s.kind == FileKind::Directory => continue,
                        Some(_) => {
                            return Err(NodeError::new(
                                NodeErrorKind::InvalidInput,
                                format!("{prefix} exists and is not a directory"),
                            ));
                        }
                        None => self.mkdir(&prefix).await?,
                    }
                }
            }
            None => {
                let (parent, _) = split(path);
                if self.lstat(parent).await?.is_none() {
                    return Err(NodeError::new(
                        NodeErrorKind::InvalidInput,
                        format!("parent directory {parent} does not exist"),
                    ));
                }
                self.mkdir(path).await?;
            }
        }
        if let Some(mode) = mode {
            self.set_mode(path, mode).await?;
        }
        Ok(())
    }

    async fn mkdir(&self, path: &str) -> Result<(), NodeError> {
        match self.raw.mkdir(path, FileAttributes::empty()).await {
            Ok(_) => Ok(()),
            Err(e) => match self.lstat(path).await {
                Ok(Some(s)) if s.kind == FileKind::Directory => Ok(()),
                _ => Err(self.error("create directory", path, e)),
            },
        }
    }

    pub async fn set_mode(&self, path: &str, mode: u32) -> Result<(), NodeError> {
        let mut attrs = FileAttributes::empty();
        attrs.permissions = Some(mode & 0o7777);
        self.raw
            .setstat(path, attrs)
            .await
            .map(drop)
            .map_err(|e| self.error("chmod", path, e))
    }

    /// The stored target of the symlink at `path`; `None` when nothing is there.
    pub async fn read_link(&self, path: &str) -> Result<Option<String>, NodeError> {
        match self.lstat(path).await? {
            None => return Ok(None),
            Some(s) if s.kind != FileKind::Symlink => {
                return Err(NodeError::new(
                    NodeErrorKind::InvalidInput,
                    format!("{path} is a {}, not a symlink", s.kind.as_str()),
                ));
            }
            Some(_) => {}
        }
        let name = self.raw.readlink(path).await.map_err(|e| self.error("read link", path, e))?;
        name.files.into_iter().next().map(|f| Some(f.filename)).ok_or_else(|| {
            NodeError::new(
                NodeErrorKind::Failed,
                format!("cannot read link {path} on node {}: empty answer", self.node),
            )
        })
    }

    /// Makes `path` a symlink to `target`: a new link beside it, renamed over an existing link.
    pub async fn symlink(&self, target: &str, path: &str) -> Result<(), NodeError> {
        if let Some(s) = self.lstat(path).await?
            && s.kind != FileKind::Symlink
        {
            return Err(NodeError::new(
                NodeErrorKind::InvalidInput,
                format!("{path} exists and is a {}, not a symlink", s.kind.as_str()),
            ));
        }
        let (parent, name) = self.existing_parent(path).await?;
        let tmp = format!(
            "{}/.{name}.orc-tmp-{}-{}",
            parent.trim_end_matches('/'),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        // OpenSSH's sftp-server takes SSH_FXP_SYMLINK's two paths in the opposite order to the
        // draft (target first, then the link), and russh-sftp sends them in the draft's order
        // (`linkpath`, `targetpath`): so the target goes in its first argument.
        self.raw
            .symlink(target, tmp.as_str())
            .await
            .map_err(|e| self.error("create symlink", path, e))?;
        let renamed = self.rename(&tmp, path).await;
        if renamed.is_err() {
            let _ = self.raw.remove(tmp.as_str()).await;
        }
        renamed
    }

    /// Removes a file, symlink or empty directory (the kind `stat` found).
    pub async fn remove_one(&self, path: &str, kind: FileKind) -> Result<(), NodeError> {
        let done = if kind == FileKind::Directory {
            self.raw.rmdir(path).await
        } else {
            self.raw.remove(path).await
        };
        done.map(drop).map_err(|e| self.error("remove", path, e))
    }
}

/// `/a/b` → (`/a`, `b`); `/a` → (`/`, `a`).
pub(crate) fn split(path: &str) -> (&str, &str) {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rfind('/') {
        Some(0) => ("/", &trimmed[1..]),
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
        None => ("/", trimmed),
    }
}

fn stat_of(attrs: &FileAttributes) -> FileStat {
    let perm = attrs.permissions.unwrap_or(0);
    let kind = match perm & S_IFMT {
        S_IFDIR => FileKind::Directory,
        S_IFREG => FileKind::File,
        S_IFLNK => FileKind::Symlink,
        _ => FileKind::Other,
    };
    FileStat {
        kind,
        size: attrs.size.unwrap_or(0),
        mode: perm & 0o7777,
        uid: attrs.uid.unwrap_or(0),
        gid: attrs.gid.unwrap_or(0),
        // SFTP v3 carries whole seconds only.
        mtime_ms: i64::from(attrs.mtime.unwrap_or(0)) * 1000,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn split_names_parent_and_file() {
        assert_eq!(super::split("/a/b/c"), ("/a/b", "c"));
        assert_eq!(super::split("/a"), ("/", "a"));
        assert_eq!(super::split("/a/b/"), ("/a", "b"));
    }
}

//! `SshNode`: a `NodeBackend` over one SSH connection, re-established on the next call after it is
//! lost (always against the host key verified first), with calls failing as `Unavailable` while
//! the node cannot be reached.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orc_node::{
    BoxFuture, CommandOutput, DEFAULT_COMMAND_TIMEOUT, FileKind, FileStat, NodeBackend, NodeCommand, NodeError, NodeErrorKind, Ownership,
    check_account_name, check_link_target,
};
use tracing::Instrument;

use crate::connection::{self, Connection};
use crate::exec::{ExecError, exec};
use crate::quote::{KILL_AFTER_S, command_line, quote};
use crate::sftp::Sftp;
use crate::{HostKeyPolicy, NodeFacts, SshError, SshOptions, SshTarget, Verified};

/// How long a durability fence waits for the node's `sync`; past it the node counts as
/// unreachable for the fence (which then does not wait for it) and its changes stay marked.
const SYNC_DEADLINE: Duration = Duration::from_secs(30);
/// Directories named to one `sync -f`; more than that many changed since the last fence and the
/// node syncs every file system instead.
const MAX_SYNC_DIRS: usize = 64;

/// Where the node's file changes since its last durability fence are (the directories they
/// touched, which name the file systems to sync), and the turn of the fences.
#[derive(Default)]
struct Unsynced {
    dirs: Mutex<BTreeSet<String>>,
    turn: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
pub struct SshNode {
    inner: Arc<Inner>,
}

struct Inner {
    target: SshTarget,
    options: SshOptions,
    node: String,
    /// The host key every connection must present: pinned, or learned by the first one.
    host_key: String,
    /// The live connection; the async lock also serialises reconnecting.
    conn: tokio::sync::Mutex<Option<Arc<Connection>>>,
    /// Counts reconnects, for tests and logs.
    connects: Mutex<u64>,
    /// Counts the calls the node answered (see [`SshNode::answers`]).
    answers: AtomicU64,
    /// The last failed attempt to connect: callers that were already waiting for it share its
    /// answer instead of each trying (and waiting out the connect timeout) in turn.
    last_failure: Mutex<Option<(Instant, SshError)>>,
    /// File changes not synced yet: marked after each change, synced by [`SshNode::durable`].
    unsynced: Unsynced,
}

impl std::fmt::Debug for SshNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshNode")
            .field("node", &self.inner.node)
            .field("user", &self.inner.target.user)
            .field("host_key", &self.inner.host_key)
            .finish()
    }
}

impl SshNode {
    /// Connects, verifies the host key and authenticates. The returned fingerprint is the key the
    /// node presented; with [`HostKeyPolicy::TrustOnFirstUse`] it is what the caller should pin.
    pub async fn connect(target: SshTarget, options: SshOptions) -> Result<(SshNode, Verified), SshError> {
        let expected = match &target.host_key {
            HostKeyPolicy::Pinned(fp) => Some(fp.clone()),
            HostKeyPolicy::TrustOnFirstUse => None,
        };
        let conn = connection::connect(&target, &options, expected).await?;
        let verified = Verified {
            fingerprint: conn.fingerprint.clone(),
        };
        let node = SshNode {
            inner: Arc::new(Inner {
                node: target.node_name(),
                host_key: conn.fingerprint.clone(),
                target,
                options,
                conn: tokio::sync::Mutex::new(Some(Arc::new(conn))),
                connects: Mutex::new(1),
                answers: AtomicU64::new(0),
                last_failure: Mutex::new(None),
                unsynced: Unsynced::default(),
            }),
        };
        Ok((node, verified))
    }

    /// `address:port` of the node.
    pub fn name(&self) -> &str {
        &self.inner.node
    }

    /// The host key fingerprint every connection is checked against.
    pub fn host_key(&self) -> &str {
        &self.inner.host_key
    }

    /// How many connections were made so far (1 until a reconnect).
    pub fn connections_made(&self) -> u64 {
        *self.inner.connects.lock().expect("connects")
    }

    /// How many calls the node has answered so far: a command that ran, an SFTP request that got
    /// a reply (even a refusal). A call answered without asking the node (a durability fence with
    /// nothing to sync, say) does not count, so a caller can tell "the node answered" from "the
    /// call succeeded" by comparing this before and after.
    pub fn answers(&self) -> u64 {
        self.inner.answers.load(Ordering::Relaxed)
    }

    fn answered(&self) {
        self.inner.answers.fetch_add(1, Ordering::Relaxed);
    }

    /// Closes the connection; the next call opens a new one.
    pub async fn disconnect(&self) {
        if let Some(conn) = self.inner.conn.lock().await.take() {
            conn.close().await;
        }
    }

    /// The live connection, or a new one if it was lost.
    async fn connection(&self) -> Result<Arc<Connection>, SshError> {
        let asked = Instant::now();
        let mut slot = self.inner.conn.lock().await;
        if let Some(conn) = slot.as_ref()
            && !conn.is_closed()
        {
            return Ok(conn.clone());
        }
        *slot = None;
        let inner = &self.inner;
        if let Some((at, e)) = &*inner.last_failure.lock().expect("last_failure")
            && *at >= asked
        {
            return Err(e.clone());
        }
        let conn = match connection::connect(&inner.target, &inner.options, Some(inner.host_key.clone())).await {
            Ok(conn) => Arc::new(conn),
            Err(e) => {
                tracing::warn!(node = %inner.node, error = %e, "cannot reconnect");
                *inner.last_failure.lock().expect("last_failure") = Some((Instant::now(), e.clone()));
                return Err(e);
            }
        };
        *inner.connects.lock().expect("connects") += 1;
        tracing::info!(node = %inner.node, "ssh reconnected");
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Drops `conn` if it is still the current connection.
    async fn forget(&self, conn: &Arc<Connection>) {
        let mut slot = self.inner.conn.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *slot = None;
        }
    }

    /// Runs a file operation on the SFTP session; when the session or connection fails under it,
    /// once more on a new connection.
    async fn with_sftp<'a, T, F>(&'a self, op: F) -> Result<T, NodeError>
    where
        F: Fn(Arc<Sftp>) -> BoxFuture<'a, Result<T, NodeError>>,
    {
        let mut retried = false;
        loop {
            let conn = self.connection().await?;
            let result = match conn.sftp().await {
                Ok(sftp) => op(sftp).await,
                Err(e) => Err(e.into()),
            };
            match result {
                Err(e) if e.kind == NodeErrorKind::Unavailable && !retried => {
                    tracing::debug!(node = %self.inner.node, error = %e, "sftp failed, reconnecting");
                    self.forget(&conn).await;
                    retried = true;
                }
                Err(e) if e.kind == NodeErrorKind::Unavailable => return Err(e),
                other => {
                    self.answered();
                    return other;
                }
            }
        }
    }

    /// Runs a shell command line, retrying once on a new connection if it could not start because
    /// the connection was gone.
    async fn exec_line(&self, line: String, stdin: Option<Vec<u8>>, deadline: Duration) -> Result<crate::exec::Finished, SshError> {
        let mut retried = false;
        loop {
            let conn = self.connection().await?;
            match exec(&conn, line.clone(), stdin.clone(), deadline).await {
                Ok(done) => {
                    self.answered();
                    return Ok(done);
                }
                Err(ExecError::NotStarted(e)) if e.is_unavailable() && !retried => {
                    self.forget(&conn).await;
                    retried = true;
                }
                Err(ExecError::NotStarted(e) | ExecError::Started(e)) => {
                    if conn.is_closed() {
                        self.forget(&conn).await;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// What the node is: OS, kernel, architecture, CPUs, memory, hostname.
    pub async fn gather_facts(&self) -> Result<NodeFacts, NodeError> {
        let out = self
            .run(NodeCommand {
                argv: vec!["/bin/sh".into(), "-c".into(), crate::facts::SCRIPT.into()],
                timeout: Some(Duration::from_secs(30)),
                ..Default::default()
            })
            .await?;
        let text = String::from_utf8_lossy(&out.stdout);
        NodeFacts::parse(&text).ok_or_else(|| {
            NodeError::new(
                NodeErrorKind::Failed,
                format!(
                    "cannot gather facts of node {}: unexpected output (exit {}): {}",
                    self.inner.node,
                    out.exit_code,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            )
        })
    }

    async fn run_command(&self, command: NodeCommand) -> Result<CommandOutput, NodeError> {
        let timeout = command.timeout.unwrap_or(DEFAULT_COMMAND_TIMEOUT);
        let line = command_line(&command, timeout)?;
        let program = command.argv[0].clone();
        // The remote `timeout` has killed what it can by then; the rest of the group goes next.
        let deadline = timeout + Duration::from_secs(KILL_AFTER_S.into());
        let started = Instant::now();
        let timed_out = || {
            NodeError::new(
                NodeErrorKind::Failed,
                format!("command `{program}` timed out after {timeout:?} and was killed"),
            )
        };
        let done = match self.exec_line(line, command.stdin, deadline).await {
            Ok(done) => done,
            Err(SshError::TimedOut { .. }) => return Err(timed_out()),
            Err(e) => return Err(e.into()),
        };
        let exit_code = match (done.exit_status, &done.exit_signal) {
            (Some(code), _) => code as i32,
            (None, signal) => {
                tracing::debug!(program = %program, signal = ?signal, "command killed by a signal");
                -1
            }
        };
        // `timeout` exits 124 after TERM; after its KILL it is killed too (it signals its whole
        // process group), so the shell reports 137 or the channel an exit signal.
        if (matches!(exit_code, 124 | 137) || done.exit_signal.is_some()) && started.elapsed() >= timeout {
            return Err(timed_out());
        }
        tracing::debug!(exit_code, elapsed_ms = started.elapsed().as_millis() as u64, "command finished");
        Ok(CommandOutput {
            exit_code,
            stdout: done.stdout,
            stderr: done.stderr,
        })
    }

    async fn remove_path(&self, path: &str, recursive: bool) -> Result<bool, NodeError> {
        if path.trim_end_matches('/').is_empty() {
            return Err(NodeError::new(
                NodeErrorKind::Denied,
                "refusing to remove the node's root directory",
            ));
        }
        let Some(stat) = self.with_sftp(|s| Box::pin(async move { s.lstat(path).await })).await? else {
            return Ok(false);
        };
        if stat.kind == FileKind::Directory && recursive {
            // SFTP has no recursive remove, and walking it would meet russh-sftp's lossy names.
            let line = format!("exec rm -rf -- {}", quote(path));
            let deadline = DEFAULT_COMMAND_TIMEOUT;
            let done = self.exec_line(line, None, deadline).await.map_err(NodeError::from)?;
            if done.exit_status != Some(0) {
                return Err(NodeError::new(
                    NodeErrorKind::Failed,
                    format!(
                        "cannot remove {path} on node {}: {}",
                        self.inner.node,
                        String::from_utf8_lossy(&done.stderr).trim()
                    ),
                ));
            }
            return Ok(true);
        }
        self.with_sftp(|s| Box::pin(async move { s.remove_one(path, stat.kind).await }))
            .await?;
        Ok(true)
    }
}

impl SshNode {
    /// Records that `dir` (or what is in it) changed, after the change: the next fence syncs
    /// its file system. A change marked after a fence took the set is left for the next one;
    /// fences take turns, so one that finds nothing marked never passes a sync still running.
    fn changed(&self, dir: &str) {
        self.inner.unsynced.dirs.lock().expect("unsynced").insert(dir.to_string());
    }

    /// The durability fence: one `sync -f` of the file systems holding the directories changed
    /// since the last fence (`sync` of all of them when there are many, or when the node's
    /// `sync` has no `-f`), instead of an fsync round trip per file. On failure the directories
    /// stay marked for the next fence.
    async fn sync_changes(&self) -> Result<(), NodeError> {
        let unsynced = &self.inner.unsynced;
        let _turn = unsynced.turn.lock().await;
        let dirs = std::mem::take(&mut *unsynced.dirs.lock().expect("unsynced"));
        if dirs.is_empty() {
            return Ok(());
        }
        let line = if dirs.len() <= MAX_SYNC_DIRS {
            let quoted: Vec<String> = dirs.iter().map(|d| quote(d)).collect();
            format!("sync -f -- {} 2>/dev/null || exec sync", quoted.join(" "))
        } else {
            "exec sync".to_string()
        };
        let synced = match self.exec_line(line, None, SYNC_DEADLINE).await {
            Ok(done) if done.exit_status == Some(0) => Ok(()),
            Ok(done) => Err(NodeError::new(
                NodeErrorKind::Failed,
                format!(
                    "cannot sync the file systems of node {}: {}",
                    self.inner.node,
                    String::from_utf8_lossy(&done.stderr).trim()
                ),
            )),
            Err(e) => Err(NodeError::from(e)),
        };
        if synced.is_err() {
            unsynced.dirs.lock().expect("unsynced").extend(dirs);
        }
        synced
    }

    /// Runs a shell line of ours (quoted by `quote`), failing on a non-zero exit with its stderr.
    async fn shell(&self, what: &str, path: &str, line: String) -> Result<Vec<u8>, NodeError> {
        let done = self.exec_line(line, None, DEFAULT_COMMAND_TIMEOUT).await.map_err(NodeError::from)?;
        if done.exit_status == Some(0) {
            return Ok(done.stdout);
        }
        let stderr = String::from_utf8_lossy(&done.stderr).trim().to_string();
        let kind = if stderr.contains("invalid user") || stderr.contains("invalid group") {
            NodeErrorKind::InvalidInput
        } else if stderr.contains("not permitted") || stderr.contains("Permission denied") {
            NodeErrorKind::Denied
        } else {
            NodeErrorKind::Failed
        };
        Err(NodeError::new(
            kind,
            format!("cannot {what} {path} on node {}: {stderr}", self.inner.node),
        ))
    }

    async fn owner_of(&self, path: &str) -> Result<Option<Ownership>, NodeError> {
        let Some(stat) = self.with_sftp(|s| Box::pin(async move { s.lstat(path).await })).await? else {
            return Ok(None);
        };
        // SFTP v3 carries ids only; the names come from the node's own databases.
        let line = format!(
            "(getent passwd {} | cut -d: -f1); echo /; (getent group {} | cut -d: -f1)",
            stat.uid, stat.gid
        );
        let out = self.shell("look up the owner of", path, line).await?;
        let text = String::from_utf8_lossy(&out);
        let (user, group) = text.split_once("/\n").unwrap_or((&text, ""));
        let name = |s: &str| Some(s.trim().to_string()).filter(|s| !s.is_empty());
        Ok(Some(Ownership {
            uid: stat.uid,
            gid: stat.gid,
            user: name(user),
            group: name(group),
        }))
    }

    async fn chown(&self, path: &str, user: Option<&str>, group: Option<&str>) -> Result<(), NodeError> {
        if let Some(u) = user {
            check_account_name("user", u)?;
        }
        if let Some(g) = group {
            check_account_name("group", g)?;
        }
        let spec = match (user, group) {
            (None, None) => return Ok(()),
            (Some(u), None) => u.to_string(),
            (None, Some(g)) => format!(":{g}"),
            (Some(u), Some(g)) => format!("{u}:{g}"),
        };
        match self.with_sftp(|s| Box::pin(async move { s.lstat(path).await })).await? {
            None => {
                return Err(NodeError::new(
                    NodeErrorKind::InvalidInput,
                    format!("cannot change the owner of {path}: it does not exist"),
                ));
            }
            Some(s) if !matches!(s.kind, FileKind::File | FileKind::Directory) => {
                return Err(NodeError::new(
                    NodeErrorKind::InvalidInput,
                    format!("cannot change the owner of {path}: it is a {}", s.kind.as_str()),
                ));
            }
            Some(_) => {}
        }
        // `chown` resolves names on the node (NSS included); `-h` never follows a symlink
        // swapped in meanwhile.
        let line = format!("LC_ALL=C exec chown -h -- {} {}", quote(&spec), quote(path));
        self.shell("change the owner of", path, line).await.map(drop)
    }
}

/// Paths are absolute on the node and carry no NUL byte, as for `LocalNode`.
fn check_path(path: &str) -> Result<(), NodeError> {
    if path.contains('\0') {
        return Err(NodeError::new(
            NodeErrorKind::InvalidInput,
            format!("path `{}` contains a NUL byte", path.escape_debug()),
        ));
    }
    if !path.starts_with('/') {
        return Err(NodeError::new(
            NodeErrorKind::InvalidInput,
            format!("path `{path}` is not absolute"),
        ));
    }
    Ok(())
}

impl NodeBackend for SshNode {
    fn run(&self, command: NodeCommand) -> BoxFuture<'_, Result<CommandOutput, NodeError>> {
        let program = command.argv.first().cloned().unwrap_or_default();
        let span = tracing::info_span!("ssh.run", node = %self.inner.node, program = %program);
        Box::pin(self.run_command(command).instrument(span))
    }

    fn read_file<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, NodeError>> {
        let span = tracing::debug_span!("ssh.read_file", node = %self.inner.node, path);
        Box::pin(
            async move {
                check_path(path)?;
                self.with_sftp(|s| Box::pin(async move { s.read_file(path).await })).await
            }
            .instrument(span),
        )
    }

    fn write_file<'a>(&'a self, path: &'a str, content: Vec<u8>, mode: Option<u32>) -> BoxFuture<'a, Result<(), NodeError>> {
        let span = tracing::debug_span!("ssh.write_file", node = %self.inner.node, path, size = content.len());
        Box::pin(
            async move {
                check_path(path)?;
                let content = &content;
                self.with_sftp(|s| Box::pin(async move { s.write_file(path, content, mode).await }))
                    .await?;
                self.changed(crate::sftp::split(path).0);
                Ok(())
            }
            .instrument(span),
        )
    }

    fn stat<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<FileStat>, NodeError>> {
        Box::pin(async move {
            check_path(path)?;
            self.with_sftp(|s| Box::pin(async move { s.lstat(path).await })).await
        })
    }

    fn create_dir<'a>(&'a self, path: &'a str, mode: Option<u32>, parents: bool) -> BoxFuture<'a, Result<(), NodeError>> {
        let span = tracing::debug_span!("ssh.create_dir", node = %self.inner.node, path);
        Box::pin(
            async move {
                check_path(path)?;
                self.with_sftp(|s| Box::pin(async move { s.create_dir(path, mode, parents).await }))
                    .await?;
                self.changed(path);
                Ok(())
            }
            .instrument(span),
        )
    }

    fn set_mode<'a>(&'a self, path: &'a str, mode: u32) -> BoxFuture<'a, Result<(), NodeError>> {
        Box::pin(async move {
            check_path(path)?;
            self.with_sftp(|s| Box::pin(async move { s.set_mode(path, mode).await })).await?;
            self.changed(path);
            Ok(())
        })
    }

    fn read_link<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<String>, NodeError>> {
        Box::pin(async move {
            check_path(path)?;
            self.with_sftp(|s| Box::pin(async move { s.read_link(path).await })).await
        })
    }

    fn create_symlink<'a>(&'a self, target: &'a str, path: &'a str) -> BoxFuture<'a, Result<(), NodeError>> {
        let span = tracing::debug_span!("ssh.create_symlink", node = %self.inner.node, path, target);
        Box::pin(
            async move {
                check_path(path)?;
                check_link_target(target)?;
                self.with_sftp(|s| Box::pin(async move { s.symlink(target, path).await })).await?;
                self.changed(crate::sftp::split(path).0);
                Ok(())
            }
            .instrument(span),
        )
    }

    fn owner<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<Ownership>, NodeError>> {
        Box::pin(async move {
            check_path(path)?;
            self.owner_of(path).await
        })
    }

    fn set_owner<'a>(&'a self, path: &'a str, user: Option<&'a str>, group: Option<&'a str>) -> BoxFuture<'a, Result<(), NodeError>> {
        let span = tracing::debug_span!("ssh.set_owner", node = %self.inner.node, path, user, group);
        Box::pin(
            async move {
                check_path(path)?;
                self.chown(path, user, group).await?;
                self.changed(path);
                Ok(())
            }
            .instrument(span),
        )
    }

    fn remove<'a>(&'a self, path: &'a str, recursive: bool) -> BoxFuture<'a, Result<bool, NodeError>> {
        let span = tracing::debug_span!("ssh.remove", node = %self.inner.node, path, recursive);
        Box::pin(
            async move {
                check_path(path)?;
                let removed = self.remove_path(path, recursive).await?;
                if removed {
                    self.changed(crate::sftp::split(path).0);
                }
                Ok(removed)
            }
            .instrument(span),
        )
    }

    fn durable(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        let span = tracing::debug_span!("ssh.durable", node = %self.inner.node);
        Box::pin(self.sync_changes().instrument(span))
    }
}

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
use crate::capability::wit_error;
use crate::state::CallState;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Output beyond this many bytes per stream is dropped (and says so).
pub const MAX_OUTPUT: usize = 16 << 20;
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStat {
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ms: i64,
}

/// One node, reached by some transport. Paths are absolute paths on the node.
pub trait NodeBackend: Send + Sync + 'static {
    fn run(&self, command: NodeCommand) -> BoxFuture<'_, Result<CommandOutput, NodeError>>;
    fn read_file<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, NodeError>>;
    fn write_file<'a>(&'a self, path: &'a str, content: Vec<u8>, mode: Option<u32>) -> BoxFuture<'a, Result<(), NodeError>>;
    fn stat<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<FileStat>, NodeError>>;
    fn create_dir<'a>(&'a self, path: &'a str, mode: Option<u32>, parents: bool) -> BoxFuture<'a, Result<(), NodeError>>;
    fn set_mode<'a>(&'a self, path: &'a str, mode: u32) -> BoxFuture<'a, Result<(), NodeError>>;
    fn remove<'a>(&'a self, path: &'a str, recursive: bool) -> BoxFuture<'a, Result<bool, NodeError>>;
}

/// Finds a node by name for a call.
pub trait NodeDirectory: Send + Sync + 'static {
    fn node(&self, name: &str) -> Result<Arc<dyn NodeBackend>, NodeError>;
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
}

/// The machine the host runs on, confined to a root directory: the node's `/etc/motd` is
/// `<root>/etc/motd`. Commands run on the host with the root as working directory, a cleared
/// environment (only `PATH` and what the plugin passes) and a timeout.
#[derive(Debug, Clone)]
pub struct LocalNode {
    root: Arc<Dir>,
    root_path: PathBuf,
}

impl LocalNode {
    /// Opens (and creates if missing) the root directory.
    pub fn open(root: impl Into<PathBuf>) -> std::io::Result<LocalNode> {
        let root_path: PathBuf = root.into();
        std::fs::create_dir_all(&root_path)?;
        let root = Dir::open_ambient_dir(&root_path, ambient_authority())?;
        Ok(LocalNode {
            root: Arc::new(root),
            root_path,
        })
    }

    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Runs blocking file work off the async threads.
    fn blocking<'a, T: Send + 'static>(
        &'a self,
        path: &'a str,
        f: impl FnOnce(&Dir, &Path) -> Result<T, NodeError> + Send + 'static,
    ) -> BoxFuture<'a, Result<T, NodeError>> {
        let root = self.root.clone();
        let rel = relative(path);
        Box::pin(async move {
            let rel = rel?;
            tokio::task::spawn_blocking(move || f(&root, &rel))
                .await
                .map_err(|e| NodeError::new(NodeErrorKind::Failed, format!("file task failed: {e}")))?
        })
    }
}

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
            let Some((program, args)) = command.argv.split_first() else {
                return Err(NodeError::new(NodeErrorKind::InvalidInput, "command has an empty argv"));
            };
            let cwd = match &command.cwd {
                Some(c) => self.root_path.join(relative(c)?),
                None => self.root_path.clone(),
            };
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args)
                .current_dir(&cwd)
                .env_clear()
                .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
                .envs(command.env.iter().map(|(k, v)| (k, v)))
                .stdin(if command.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            let mut child = cmd
                .spawn()
                .map_err(|e| NodeError::new(NodeErrorKind::InvalidInput, format!("cannot start `{program}`: {e}")))?;
            if let Some(input) = command.stdin {
                let mut stdin = child.stdin.take().expect("piped");
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    let _ = stdin.write_all(&input).await;
                });
            }
            let stdout = tokio::spawn(read_capped(child.stdout.take().expect("piped")));
            let stderr = tokio::spawn(read_capped(child.stderr.take().expect("piped")));
            let timeout = command.timeout.unwrap_or(DEFAULT_COMMAND_TIMEOUT);
            let status = match tokio::time::timeout(timeout, child.wait()).await {
                Ok(status) => status.map_err(|e| NodeError::new(NodeErrorKind::Failed, format!("waiting for `{program}`: {e}")))?,
                Err(_) => {
                    let _ = child.kill().await;
                    return Err(NodeError::new(
                        NodeErrorKind::Failed,
                        format!("command `{program}` timed out after {timeout:?} and was killed"),
                    ));
                }
            };
            let stdout = stdout.await.unwrap_or_default();
            let stderr = stderr.await.unwrap_or_default();
            Ok(CommandOutput {
                exit_code: status.code().unwrap_or(-1),
                stdout,
                stderr,
            })
        })
    }

    fn read_file<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, NodeError>> {
        self.blocking(path, |root, rel| {
            match root.symlink_metadata(rel) {
                Ok(m) if m.is_dir() => {
                    return Err(NodeError::new(
                        NodeErrorKind::InvalidInput,
                        format!("{} is a directory", Path::new("/").join(rel).display()),
                    ));
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io_error(rel, "read", e)),
            }
            match root.read(rel) {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(io_error(rel, "read", e)),
            }
        })
    }

    fn write_file<'a>(&'a self, path: &'a str, content: Vec<u8>, mode: Option<u32>) -> BoxFuture<'a, Result<(), NodeError>> {
        self.blocking(path, move |root, rel| {
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
            let mode = mode.or(existing.map(|s| s.mode)).unwrap_or(0o644);
            let name = rel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let tmp = parent.join(format!(".{name}.orc-tmp-{}", std::process::id()));
            let result = (|| {
                let mut file = root
                    .open_with(&tmp, OpenOptions::new().write(true).create(true).truncate(true))
                    .map_err(|e| io_error(&tmp, "create", e))?;
                file.write_all(&content).map_err(|e| io_error(&tmp, "write", e))?;
                file.set_permissions(Permissions::from_mode(mode))
                    .map_err(|e| io_error(&tmp, "chmod", e))?;
                file.sync_all().map_err(|e| io_error(&tmp, "sync", e))?;
                root.rename(&tmp, root, rel).map_err(|e| io_error(rel, "replace", e))
            })();
            if result.is_err() {
                let _ = root.remove_file(&tmp);
            }
            result
        })
    }

    fn stat<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<FileStat>, NodeError>> {
        self.blocking(path, lstat)
    }

    fn create_dir<'a>(&'a self, path: &'a str, mode: Option<u32>, parents: bool) -> BoxFuture<'a, Result<(), NodeError>> {
        self.blocking(path, move |root, rel| {
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
                }
            }
            if let Some(mode) = mode {
                root.set_permissions(rel, Permissions::from_mode(mode))
                    .map_err(|e| io_error(rel, "chmod", e))?;
            }
            Ok(())
        })
    }

    fn set_mode<'a>(&'a self, path: &'a str, mode: u32) -> BoxFuture<'a, Result<(), NodeError>> {
        self.blocking(path, move |root, rel| {
            root.set_permissions(rel, Permissions::from_mode(mode))
                .map_err(|e| io_error(rel, "chmod", e))
        })
    }

    fn remove<'a>(&'a self, path: &'a str, recursive: bool) -> BoxFuture<'a, Result<bool, NodeError>> {
        self.blocking(path, move |root, rel| {
            if rel == Path::new(".") {
                return Err(NodeError::new(
                    NodeErrorKind::Denied,
                    "refusing to remove the node's root directory",
                ));
            }
            let Some(stat) = lstat(root, rel)? else { return Ok(false) };
            let done = match (stat.kind, recursive) {
                (FileKind::Directory, true) => root.remove_dir_all(rel),
                (FileKind::Directory, false) => root.remove_dir(rel),
                _ => root.remove_file(rel),
            };
            done.map(|()| true).map_err(|e| io_error(rel, "remove", e))
        })
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
        NodeErrorKind::Failed => ErrorKind::Permanent,
    };
    wit_error(kind, e.message)
}

impl CallState {
    fn node(&self, name: &str) -> Result<Arc<dyn NodeBackend>, Error> {
        self.ctx.nodes.node(name).map_err(to_wit)
    }
}

impl wit::Host for CallState {
    async fn run(&mut self, node: String, command: wit::Command) -> Result<wit::CommandOutput, Error> {
        let backend = self.node(&node)?;
        let out = backend
            .run(NodeCommand {
                argv: command.argv,
                stdin: command.stdin,
                env: command.env,
                cwd: command.cwd,
                timeout: command.timeout_ms.map(|ms| Duration::from_millis(ms.into())),
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
}

#[cfg(test)]
mod tests {
    use super::*;

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

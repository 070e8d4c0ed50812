//! The local node's commands: confined by the crate's `sandbox`, in a process group of their
//! own on the host ([`ProcessGroup`]) killed whole at the timeout or when the call is dropped,
//! their output read up to [`MAX_OUTPUT`] per stream and waited for within the timeout.

use std::process::Stdio;

use tokio::io::AsyncReadExt;

use super::{LocalNode, io_error, relative};
use crate::sandbox::{self, Sandbox};
use crate::{CommandOutput, DEFAULT_COMMAND_TIMEOUT, MAX_OUTPUT, NodeCommand, NodeError, NodeErrorKind};

impl LocalNode {
    /// [`NodeBackend::run`](crate::NodeBackend::run) on the local node (see [`LocalNode`]).
    pub(super) async fn run_confined(&self, command: NodeCommand) -> Result<CommandOutput, NodeError> {
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
    }
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use crate::{LocalNode, NodeBackend, NodeCommand};

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

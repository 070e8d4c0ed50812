//! One command on its own session channel: exec, stdin from a separate task, stdout/stderr and the
//! exit status collected, the timeout enforced here as a backstop to the remote `timeout`.
//!
//! sshd runs a command's shell as the leader of a session and process group of its own (it calls
//! `setsid`), so everything the command starts is in that group unless it leaves it (a daemon's
//! `setsid`). The shell reports its pid, the group's id, as the first line of stderr (taken out
//! of what the caller sees); past the limit, or when the call is dropped before the command ends,
//! the group is killed with `kill -s KILL -- -PGID` on a second channel. The remote `timeout`
//! signals the group only while the command's first process runs: a process it left behind
//! holding the output open would otherwise keep the channel, and itself, alive.

use std::sync::Arc;
use std::time::Duration;

use orc_node::MAX_OUTPUT;
use russh::{ChannelMsg, Sig};

use crate::SshError;
use crate::connection::Connection;

/// The first line of a command's stderr: `orc-pgid:` and the shell's pid.
const PGID_MARKER: &str = "orc-pgid:";
/// How much of stderr is searched for the marker (startup files may print before it).
const PGID_SEARCH: usize = 64 << 10;
/// How long the channel may stay open once the group is killed.
const AFTER_KILL: Duration = Duration::from_secs(3);
/// How long killing a group may take.
const KILL_DEADLINE: Duration = Duration::from_secs(10);

pub(crate) struct Finished {
    pub exit_status: Option<u32>,
    pub exit_signal: Option<String>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Where running a command failed: before the command could start (safe to retry on a new
/// connection) or after.
pub(crate) enum ExecError {
    NotStarted(SshError),
    Started(SshError),
}

/// Runs `line` through the login shell. Past `limit` (the command line may carry its own,
/// shorter, remote one) its process group is killed and the call fails `TimedOut` within
/// [`AFTER_KILL`].
pub(crate) async fn exec(conn: &Arc<Connection>, line: String, stdin: Option<Vec<u8>>, limit: Duration) -> Result<Finished, ExecError> {
    let _slot = conn.commands.acquire().await.expect("never closed");
    let channel = conn.open_channel().await.map_err(ExecError::NotStarted)?;
    let (mut reader, writer) = channel.split();
    let writer = Arc::new(writer);
    let channel_error = |what: &str, e: russh::Error| {
        if conn.is_closed() {
            conn.lost()
        } else {
            SshError::Channel {
                node: conn.node.clone(),
                message: format!("{what}: {e}"),
            }
        }
    };
    writer
        .exec(true, format!("printf '{PGID_MARKER}%d\\n' $$ >&2; {line}"))
        .await
        .map_err(|e| ExecError::NotStarted(channel_error("cannot start the command", e)))?;
    let mut group = Group {
        conn: conn.clone(),
        pgid: None,
        ended: false,
    };
    // Stdin goes in its own task: a command that exits without reading it never reopens the
    // window, and `data` would wait forever. The task is aborted once the channel ends.
    let stdin_task = {
        let writer = writer.clone();
        tokio::spawn(async move {
            if let Some(input) = stdin {
                writer.data(&input[..]).await?;
            }
            writer.eof().await
        })
    };
    let mut done = Finished {
        exit_status: None,
        exit_signal: None,
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    let mut refused = false;
    let mut accepted = false;
    let collected = tokio::time::timeout(limit, async {
        while let Some(msg) = reader.wait().await {
            match msg {
                ChannelMsg::Data { data } => append(&mut done.stdout, &data),
                ChannelMsg::ExtendedData { data, ext: 1 } => {
                    append(&mut done.stderr, &data);
                    if group.pgid.is_none() && done.stderr.len() <= PGID_SEARCH {
                        group.pgid = take_pgid(&mut done.stderr);
                    }
                }
                ChannelMsg::ExitStatus { exit_status } => done.exit_status = Some(exit_status),
                ChannelMsg::ExitSignal { signal_name, .. } => done.exit_signal = Some(signal_name_text(&signal_name)),
                ChannelMsg::Success => accepted = true,
                ChannelMsg::Failure => refused = true,
                _ => {}
            }
        }
    })
    .await;
    stdin_task.abort();
    if collected.is_err() {
        // The whole group, then a moment for the channel to end with it.
        if let Some(pgid) = group.pgid {
            kill_group(conn, pgid).await;
        }
        group.ended = true;
        let _ = tokio::time::timeout(AFTER_KILL, async { while reader.wait().await.is_some() {} }).await;
        let _ = writer.signal(Sig::KILL).await;
        let _ = writer.close().await;
        return Err(ExecError::Started(SshError::TimedOut {
            node: conn.node.clone(),
            what: "command".into(),
            after: limit,
        }));
    }
    // Ended (or the connection did): what the command left running on its own, its output
    // elsewhere (a service it started), is its business.
    group.ended = true;
    if refused && done.exit_status.is_none() {
        return Err(ExecError::NotStarted(SshError::Channel {
            node: conn.node.clone(),
            message: "the server refused to run the command".into(),
        }));
    }
    if done.exit_status.is_none() && done.exit_signal.is_none() {
        if !accepted && conn.is_closed() {
            // The connection ended before the server confirmed the command: it never ran.
            return Err(ExecError::NotStarted(conn.lost()));
        }
        let e = if conn.is_closed() {
            conn.lost()
        } else {
            SshError::Channel {
                node: conn.node.clone(),
                message: "the channel closed without an exit status".into(),
            }
        };
        return Err(ExecError::Started(e));
    }
    Ok(done)
}

/// A running command's process group on the node: killed when dropped before the command
/// ended (the call was dropped: the plugin's own deadline passed).
struct Group {
    conn: Arc<Connection>,
    pgid: Option<u32>,
    ended: bool,
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let (Some(pgid), Ok(runtime)) = (self.pgid, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let conn = self.conn.clone();
        runtime.spawn(async move { kill_group(&conn, pgid).await });
    }
}

/// Kills process group `pgid` on the node (every process left of a command), on a channel of
/// its own; failures are logged (the remote `timeout` still ends the command's first process).
///
/// The group's id stays taken while any member lives, so the kill reaches only the command's
/// processes; only once every member is gone could the number name another group.
async fn kill_group(conn: &Connection, pgid: u32) {
    let killed = tokio::time::timeout(KILL_DEADLINE, async {
        let _turn = conn.kills.acquire().await.expect("never closed");
        let channel = conn.open_channel().await?;
        channel
            .exec(true, format!("kill -s KILL -- -{pgid}"))
            .await
            .map_err(|e| SshError::Channel {
                node: conn.node.clone(),
                message: format!("cannot run kill: {e}"),
            })?;
        let (mut reader, _writer) = channel.split();
        while reader.wait().await.is_some() {}
        Ok::<(), SshError>(())
    })
    .await;
    match killed {
        Ok(Ok(())) => tracing::debug!(node = %conn.node, pgid, "killed a command's process group"),
        Ok(Err(e)) => tracing::warn!(node = %conn.node, pgid, error = %e, "cannot kill a command's process group"),
        Err(_) => tracing::warn!(node = %conn.node, pgid, "killing a command's process group timed out"),
    }
}

/// Takes the group id line ([`PGID_MARKER`]) out of `stderr` once it is there whole; lines
/// before it (a startup file's) are kept.
fn take_pgid(stderr: &mut Vec<u8>) -> Option<u32> {
    let mut start = 0;
    while let Some(end) = stderr[start..].iter().position(|b| *b == b'\n').map(|i| start + i) {
        if let Some(rest) = stderr[start..end].strip_prefix(PGID_MARKER.as_bytes()) {
            let pgid = std::str::from_utf8(rest).ok()?.parse().ok()?;
            stderr.drain(start..=end);
            return Some(pgid);
        }
        start = end + 1;
    }
    None
}

/// Output beyond `MAX_OUTPUT` is dropped, as `LocalNode` does; the channel is still drained.
fn append(out: &mut Vec<u8>, data: &[u8]) {
    let room = MAX_OUTPUT.saturating_sub(out.len());
    out.extend_from_slice(&data[..data.len().min(room)]);
}

fn signal_name_text(sig: &Sig) -> String {
    match sig {
        Sig::Custom(name) => name.clone(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::take_pgid;

    #[test]
    fn the_group_id_line_is_taken_out_of_stderr_once_whole() {
        let mut stderr = b"orc-pgid:12".to_vec();
        assert_eq!(take_pgid(&mut stderr), None);
        stderr.extend_from_slice(b"34\nfrom the command\n");
        assert_eq!(take_pgid(&mut stderr), Some(1234));
        assert_eq!(stderr, b"from the command\n");
        let mut noisy = b"a startup file\norc-pgid:7\nrest".to_vec();
        assert_eq!(take_pgid(&mut noisy), Some(7));
        assert_eq!(noisy, b"a startup file\nrest");
    }
}

//! One command on its own session channel: exec, stdin from a separate task, stdout/stderr and the
//! exit status collected, the timeout enforced here as a backstop to the remote `timeout`.

use std::sync::Arc;
use std::time::Duration;

use orc_runtime::capability::node::MAX_OUTPUT;
use russh::{ChannelMsg, Sig};

use crate::SshError;
use crate::connection::Connection;

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

/// Runs `line` through the login shell. `deadline` is the local limit; the command line carries
/// its own, shorter, remote one.
pub(crate) async fn exec(conn: &Connection, line: String, stdin: Option<Vec<u8>>, deadline: Duration) -> Result<Finished, ExecError> {
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
        .exec(true, line)
        .await
        .map_err(|e| ExecError::NotStarted(channel_error("cannot start the command", e)))?;
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
    let collected = tokio::time::timeout(deadline, async {
        while let Some(msg) = reader.wait().await {
            match msg {
                ChannelMsg::Data { data } => append(&mut done.stdout, &data),
                ChannelMsg::ExtendedData { data, ext: 1 } => append(&mut done.stderr, &data),
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
        let _ = writer.signal(Sig::KILL).await;
        let _ = writer.close().await;
        return Err(ExecError::Started(SshError::TimedOut {
            node: conn.node.clone(),
            what: "command".into(),
            after: deadline,
        }));
    }
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

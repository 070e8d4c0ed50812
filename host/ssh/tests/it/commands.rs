//! `run`: stdin/stdout/stderr/exit code, the environment, timeouts, many commands at once.

use std::time::{Duration, Instant};

use orc_node::{NodeBackend, NodeCommand, NodeErrorKind};
use orc_ssh::HostKeyPolicy;

use crate::{connect, options, target};
use orc_tests::sshd::Sshd;

fn sh(script: &str) -> NodeCommand {
    NodeCommand {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        ..Default::default()
    }
}

#[tokio::test]
async fn run_collects_stdin_stdout_stderr_and_exit_code() {
    let sshd = Sshd::start();
    let node = connect(&sshd).await;
    let out = node
        .run(NodeCommand {
            stdin: Some(b"from stdin\n".to_vec()),
            ..sh("cat; echo to stderr >&2; exit 3")
        })
        .await
        .unwrap();
    assert_eq!(out.exit_code, 3);
    assert_eq!(out.stdout, b"from stdin\n");
    assert_eq!(out.stderr, b"to stderr\n");

    // A command that never reads its (large) stdin must not hang the call.
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        node.run(NodeCommand {
            argv: vec!["true".into()],
            stdin: Some(vec![b'x'; 8 << 20]),
            ..Default::default()
        }),
    )
    .await
    .expect("hung on unread stdin")
    .unwrap();
    assert_eq!(out.exit_code, 0);
    let out = node
        .run(NodeCommand {
            argv: vec!["wc".into(), "-c".into()],
            stdin: Some(vec![b'x'; 3 << 20]),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), (3 << 20).to_string());

    // Killed by a signal: no exit status, reported as -1 like LocalNode.
    let out = node.run(sh("kill -KILL $$")).await.unwrap();
    assert_eq!(out.exit_code, -1);
    let err = node.run(NodeCommand::default()).await.unwrap_err();
    assert_eq!(err.kind, NodeErrorKind::InvalidInput);
    let out = node
        .run(NodeCommand {
            argv: vec!["no-such-program-orc".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(out.exit_code, 127, "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn the_environment_is_cleared_and_values_arrive_intact() {
    let sshd = Sshd::start();
    let node = connect(&sshd).await;
    let nasty = [
        ("QUOTES", "it's \"quoted\""),
        ("SPACES", "  two  spaces  "),
        ("DOLLAR", "$HOME ${PATH} $(id) `id`"),
        ("NEWLINE", "line one\nline two"),
        ("EMPTY", ""),
        ("GLOB", "* ? [a-z] ~"),
        ("EQUALS", "a=b=c"),
    ];
    let mut command = sh(
        "for k in QUOTES SPACES DOLLAR NEWLINE EMPTY GLOB EQUALS; do printenv \"$k\"; printf '\\0'; done; \
                          echo \"home=${HOME:-unset} user=${USER:-unset} ssh=${SSH_CONNECTION:-unset}\"; pwd",
    );
    command.env = nasty.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    command.cwd = Some("/tmp".into());
    let out = node.run(command).await.unwrap();
    assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let parts: Vec<&[u8]> = out.stdout.split(|b| *b == 0).collect();
    for ((key, value), got) in nasty.iter().zip(&parts) {
        assert_eq!(String::from_utf8_lossy(got), format!("{value}\n"), "{key}");
    }
    assert_eq!(
        String::from_utf8_lossy(parts[nasty.len()]),
        "home=unset user=unset ssh=unset\n/tmp\n"
    );

    // Arguments with the same characters come through as single words.
    let words = ["it's", "$HOME", "a b", "`id`", "--", ""];
    let mut argv = vec!["printf".to_string(), "[%s]".into()];
    argv.extend(words.iter().map(|w| w.to_string()));
    let out = node
        .run(NodeCommand {
            argv,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[it's][$HOME][a b][`id`][--][]");
}

/// The remote process is gone after a timeout, also for root, whose sessions ignore signal
/// requests: `timeout` on the node kills it.
#[tokio::test]
async fn a_timeout_kills_the_remote_command() {
    let sshd = Sshd::start();
    let scratch = sshd.scratch_dir("timeout");
    let user = connect(&sshd).await;
    let (root, _) = orc_ssh::SshNode::connect(
        target(&sshd, "root", HostKeyPolicy::Pinned(sshd.host_fingerprint.clone())),
        options(),
    )
    .await
    .unwrap();
    for (who, node) in [("orctest", &user), ("root", &root)] {
        let pidfile = scratch.join(format!("{who}.pid"));
        let started = Instant::now();
        let err = node
            .run(NodeCommand {
                timeout: Some(Duration::from_millis(700)),
                ..sh(&format!("echo $$ > {}; exec sleep 30", pidfile.display()))
            })
            .await
            .unwrap_err();
        assert!(err.message.contains("timed out"), "{who}: {err}");
        assert!(started.elapsed() < Duration::from_secs(6), "{who}: took {:?}", started.elapsed());
        let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_string();
        let gone = async {
            while std::path::Path::new(&format!("/proc/{pid}")).exists() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), gone)
            .await
            .unwrap_or_else(|_| panic!("{who}: remote process {pid} survived the timeout"));
    }
    // A command that ignores TERM is killed after the grace period.
    let started = Instant::now();
    let err = user
        .run(NodeCommand {
            timeout: Some(Duration::from_millis(300)),
            ..sh("trap '' TERM; sleep 20 & wait; sleep 20")
        })
        .await
        .unwrap_err();
    assert!(err.message.contains("timed out"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(6), "took {:?}", started.elapsed());
}

/// Whether process `pid` runs (a zombie nobody reaped yet does not).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
}

/// Waits (at most 5 s) for `pid` to end; whether it did.
async fn ended(pid: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// The pid a script wrote to `file`, once it is there (at most 10 s).
async fn pid_in(file: &std::path::Path) -> String {
    orc_tests::wait_for(&format!("{} to be written", file.display()), Duration::from_secs(10), async || {
        std::fs::read_to_string(file)
            .ok()
            .filter(|pid| pid.ends_with('\n'))
            .map(|pid| pid.trim().to_string())
    })
    .await
}

/// The command's process group on the node is killed at its timeout: a grandchild the shell
/// waits for (the remote `timeout` signals its group), and one that holds the output open after
/// the shell and `timeout` are gone, which held the channel open until the local deadline and
/// outlived the call. The call returns soon after the timeout. As the test user and as root.
#[tokio::test]
async fn a_timeout_kills_the_commands_whole_process_group_on_the_node() {
    let sshd = Sshd::start();
    let scratch = sshd.scratch_dir("group");
    let user = connect(&sshd).await;
    let (root, _) = orc_ssh::SshNode::connect(
        target(&sshd, "root", HostKeyPolicy::Pinned(sshd.host_fingerprint.clone())),
        options(),
    )
    .await
    .unwrap();
    for (who, node) in [("orctest", &user), ("root", &root)] {
        for (what, script) in [("waited for", "wait"), ("holding stdout", "echo started")] {
            let pidfile = scratch.join(format!("{who}-{}.pid", what.replace(' ', "-")));
            let timeout = Duration::from_millis(700);
            let started = Instant::now();
            let run = node.run(NodeCommand {
                timeout: Some(timeout),
                ..sh(&format!("sleep 100 & echo $! > {}; {script}", pidfile.display()))
            });
            let err = tokio::time::timeout(Duration::from_secs(20), run)
                .await
                .unwrap_or_else(|_| panic!("{who}, {what}: the call outlived its timeout by far"))
                .unwrap_err();
            assert!(err.message.contains("timed out"), "{who}, {what}: {err}");
            let took = started.elapsed();
            assert!(took < timeout + Duration::from_secs(4), "{who}, {what}: took {took:?}");
            let pid = pid_in(&pidfile).await;
            assert!(ended(&pid).await, "{who}, {what}: grandchild {pid} outlived the timeout");
        }
    }
    // What a command leaves behind with its output elsewhere (a service it starts) runs on.
    let pidfile = scratch.join("service.pid");
    let out = user
        .run(sh(&format!("sleep 100 > /dev/null 2>&1 & echo $! > {}", pidfile.display())))
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0);
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let pid = pid_in(&pidfile).await;
    assert!(alive(&pid), "a service the command started was killed");
    let _ = std::process::Command::new("kill").arg(&pid).status();
}

/// A call dropped before its command ends (the plugin's own deadline passed) kills the
/// command's process group on the node.
#[tokio::test]
async fn a_dropped_call_kills_its_commands_process_group_on_the_node() {
    let sshd = Sshd::start();
    let scratch = sshd.scratch_dir("dropped");
    let node = connect(&sshd).await;
    let pidfile = scratch.join("pid");
    let run = node.run(NodeCommand {
        timeout: Some(Duration::from_secs(60)),
        ..sh(&format!("sleep 100 & echo $! > {}; wait", pidfile.display()))
    });
    let pid = tokio::select! {
        done = run => panic!("the command ended: {done:?}"),
        pid = pid_in(&pidfile) => pid,
    };
    assert!(ended(&pid).await, "grandchild {pid} outlived the dropped call");
    // The connection still serves.
    assert_eq!(node.run(sh("echo ok")).await.unwrap().stdout, b"ok\n");
}

/// More commands and file operations at once than sshd's MaxSessions: they queue on the
/// connection's semaphore instead of failing, and share the one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_operations_share_one_connection() {
    let sshd = Sshd::start();
    let scratch = sshd.scratch_dir("many");
    let node = connect(&sshd).await;
    let commands = futures::future::join_all((0..40).map(|i| {
        let node = node.clone();
        async move { node.run(sh(&format!("sleep 0.05; echo {i}"))).await }
    }));
    let files = futures::future::join_all((0..300).map(|i| {
        let node = node.clone();
        let path = crate::path(&scratch, &format!("f{i}"));
        async move {
            node.write_file(&path, format!("content {i}").into_bytes(), Some(0o640)).await?;
            let st = node.stat(&path).await?.expect("written");
            let back = node.read_file(&path).await?.expect("written");
            Ok::<_, orc_node::NodeError>((st.size, back))
        }
    }));
    let (commands, files) = tokio::join!(commands, files);
    for (i, out) in commands.into_iter().enumerate() {
        let out = out.unwrap_or_else(|e| panic!("command {i}: {e}"));
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{i}\n"));
    }
    for (i, r) in files.into_iter().enumerate() {
        let (size, back) = r.unwrap_or_else(|e| panic!("file {i}: {e}"));
        assert_eq!(back, format!("content {i}").into_bytes());
        assert_eq!(size, back.len() as u64);
    }
    assert_eq!(node.connections_made(), 1);
}

#[tokio::test]
async fn gather_facts_describes_the_node() {
    let sshd = Sshd::start();
    let node = connect(&sshd).await;
    let facts = node.gather_facts().await.unwrap();
    assert_eq!(facts.kernel, "Linux");
    assert_eq!(facts.architecture, std::env::consts::ARCH);
    assert!(facts.cpus >= 1, "{facts:?}");
    assert!(facts.memory_bytes > 64 << 20, "{facts:?}");
    assert!(!facts.hostname.is_empty() && !facts.kernel_release.is_empty(), "{facts:?}");
    assert!(facts.os_id.is_some() && facts.os_name.is_some(), "{facts:?}");
    // It is a serde struct the server can show.
    let json = serde_json::to_value(&facts).unwrap();
    assert_eq!(json["kernel"], "Linux");
}

//! The sandbox tried as a hostile plugin would try it, through the local node's `run`: each
//! test is an escape or an exhaustion attempt that must fail while the host goes on.

use std::path::Path;
use std::time::Duration;

use crate::{CommandLimits, CommandOutput, LocalNode, NodeBackend, NodeCommand};

/// A node whose root is `<dir>/root`, beside a data directory's secrets in `<dir>`.
fn node_in(dir: &Path) -> LocalNode {
    std::fs::write(dir.join("secret.key"), "the host's secret key").unwrap();
    std::fs::write(dir.join("orc.db"), "every environment's state").unwrap();
    LocalNode::open(dir.join("root")).unwrap()
}

async fn sh_with(node: &LocalNode, script: &str, limits: CommandLimits, timeout: Duration) -> CommandOutput {
    node.run(NodeCommand {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        timeout: Some(timeout),
        limits,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("`{script}`: {e}"))
}

async fn sh(node: &LocalNode, script: &str) -> CommandOutput {
    sh_with(node, script, CommandLimits::default(), Duration::from_secs(30)).await
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The data directory beside the root (secret key, database), `/etc/shadow`, the host's
/// processes and their environment: none of it is there to read.
#[tokio::test]
async fn the_host_s_files_processes_and_environment_are_out_of_reach() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_in(dir.path());
    let data = dir.path().display();
    let host_pid = std::process::id();
    for (what, script) in [
        ("the secret key", format!("cat {data}/secret.key")),
        ("the secret key by a relative path", "cat ../secret.key".to_string()),
        ("the database", format!("cat {data}/orc.db")),
        ("/etc/shadow", "cat /etc/shadow".to_string()),
        ("the host's environment", format!("cat /proc/{host_pid}/environ")),
        ("the host's root directory", "ls /root".to_string()),
    ] {
        let out = sh(&node, &script).await;
        assert_ne!(out.exit_code, 0, "{what}: {}", text(&out.stdout));
        assert!(out.stdout.is_empty(), "{what} was read: {}", text(&out.stdout));
    }
    // PID 1 is the sandbox's own: its environment is the command's, not the host's.
    let out = sh(&node, "tr '\\0' '\\n' < /proc/1/environ; echo; ls /proc | grep -c '^[0-9]'").await;
    let seen = text(&out.stdout);
    assert!(!seen.contains("CARGO"), "the host's environment: {seen}");
    let processes: u32 = seen.lines().last().unwrap().trim().parse().unwrap();
    assert!(processes <= 5, "the sandbox sees {processes} processes");
    // What of its own `/proc` still shows the host's kernel is masked (`/proc/timer_list` lists
    // the host's processes and is readable by its owner, root, which the sandbox's user is to
    // the kernel's mode checks); `/proc/fs` is read-only.
    let out = sh(&node, "for f in /proc/timer_list /proc/kpageflags /proc/keys; do cat $f; done | wc -c; ls -A /proc/acpi | wc -l; touch /proc/fs/x && echo wrote").await;
    assert_eq!(text(&out.stdout), "0\n0\n", "{}", text(&out.stderr));
    // Nor can it signal the host.
    let out = sh(&node, &format!("kill -KILL {host_pid}")).await;
    assert_ne!(out.exit_code, 0, "a signal reached pid {host_pid}");
}

/// Whatever it writes lands in the root; the system directories and `/etc` are read-only.
#[tokio::test]
async fn only_the_root_is_writable_and_as_the_host_s_user() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_in(dir.path());
    for target in ["/usr/orc-was-here", "/etc/passwd", "/bin/orc-was-here"] {
        let out = sh(&node, &format!("echo x > {target}")).await;
        assert_ne!(out.exit_code, 0, "{target} was written");
    }
    assert!(!Path::new("/usr/orc-was-here").exists());
    let out = sh(&node, "id -u; id -g; echo made > made").await;
    assert_eq!(text(&out.stdout), "65534\n65534\n", "{}", text(&out.stderr));
    let made = dir.path().join("root/made");
    assert_eq!(std::fs::read_to_string(&made).unwrap(), "made\n");
    // On the host, the file is the host's user's, as the node's file functions write them.
    let meta = std::fs::metadata(&made).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), rustix::process::geteuid().as_raw());
}

/// No capabilities, `no_new_privs`, the seccomp filter on: new namespaces (the way to regain
/// capabilities) and mounts are refused.
#[tokio::test]
async fn privileges_cannot_be_regained() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_in(dir.path());
    let out = sh(
        &node,
        "grep -E '^(CapEff|CapPrm|NoNewPrivs|Seccomp|Seccomp_filters):' /proc/self/status",
    )
    .await;
    let status = text(&out.stdout);
    // The refusals, `clone3`, and on x86-64 the x32 calls.
    let filters = if cfg!(target_arch = "x86_64") { 3 } else { 2 };
    assert!(status.contains(&format!("Seccomp_filters:\t{filters}")), "{status}");
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
    assert!(status.contains("CapPrm:\t0000000000000000"), "{status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");
    for (what, script) in [
        ("a user namespace", "unshare --user --map-root-user id -u"),
        ("a mount namespace", "unshare --mount true"),
        ("a mount", "mount -t tmpfs none /tmp"),
    ] {
        let out = sh(&node, script).await;
        assert_ne!(out.exit_code, 0, "{what} was made: {}", text(&out.stdout));
    }
    // Threads still start (`clone3` falls back to `clone`).
    let out = sh(&node, "sort --parallel=4 -S 1M /etc/passwd > /dev/null && echo sorted").await;
    assert_eq!(text(&out.stdout), "sorted\n", "{}", text(&out.stderr));
}

/// No network unless the environment grants it: a listener on the host's loopback is out of
/// reach, then reached once `network` is on.
#[tokio::test]
async fn the_network_is_reached_only_when_granted() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_in(dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!("bash -c 'echo hello > /dev/tcp/127.0.0.1/{port}' && echo connected");
    let accepted = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut got = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut got).await.unwrap();
        got
    });
    let out = sh(&node, &script).await;
    assert!(out.stdout.is_empty(), "connected without the network granted");
    assert!(!accepted.is_finished());
    let granted = CommandLimits {
        network: true,
        ..CommandLimits::default()
    };
    let out = sh_with(&node, &script, granted, Duration::from_secs(30)).await;
    assert_eq!(text(&out.stdout), "connected\n", "{}", text(&out.stderr));
    assert_eq!(accepted.await.unwrap(), "hello\n");
}

/// A fork bomb stops at the process limit, and the command ends at its timeout with all of its
/// processes, while the host still starts processes of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_stops_at_the_process_limit() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_in(dir.path());
    let limits = CommandLimits {
        processes: 64,
        ..CommandLimits::default()
    };
    let bomb = "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived";
    let out = sh_with(&node, bomb, limits, Duration::from_secs(20)).await;
    let stderr = text(&out.stderr);
    assert!(stderr.contains("a fork was refused at the limit of 64 processes"), "{stderr}");
    let host = std::process::Command::new("true").status().unwrap();
    assert!(host.success(), "the host cannot start processes");
    // A second command runs as usual: nothing of the first is left to count against anything.
    let out = sh(&node, "echo fine").await;
    assert_eq!(text(&out.stdout), "fine\n");
}

/// A memory hog is killed at the memory limit and the sandbox says so.
#[tokio::test]
async fn a_memory_hog_is_killed_at_the_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_in(dir.path());
    let limits = CommandLimits {
        memory_bytes: 64 << 20,
        ..CommandLimits::default()
    };
    // `tail` keeps the whole input when it has no newline.
    let out = sh_with(
        &node,
        "head -c 400000000 /dev/zero | tail -c 300000000 | wc -c",
        limits,
        Duration::from_secs(60),
    )
    .await;
    let stderr = text(&out.stderr);
    assert!(stderr.contains("killed at the memory limit of 67108864 bytes"), "{stderr}");
    assert_ne!(text(&out.stdout).trim(), "300000000");
}

/// CPU time and file size are limited per process.
#[tokio::test]
async fn cpu_time_and_file_size_are_limited() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_in(dir.path());
    let limits = CommandLimits {
        cpu_seconds: 1,
        file_size_bytes: 1 << 20,
        ..CommandLimits::default()
    };
    let started = std::time::Instant::now();
    let out = sh_with(&node, "while :; do :; done", limits, Duration::from_secs(30)).await;
    assert_ne!(out.exit_code, 0);
    assert!(started.elapsed() < Duration::from_secs(10), "ran {:?}", started.elapsed());
    let out = sh_with(&node, "head -c 3000000 /dev/zero > big", limits, Duration::from_secs(30)).await;
    assert_ne!(out.exit_code, 0);
    let size = std::fs::metadata(dir.path().join("root/big")).unwrap().len();
    assert!(size <= 1 << 20, "wrote {size} bytes");
}

/// A working directory must be a directory inside the root; a missing program is the plugin's
/// error, named.
#[tokio::test]
async fn bad_working_directories_and_programs_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_in(dir.path());
    std::os::unix::fs::symlink(dir.path(), dir.path().join("root/out")).unwrap();
    for (cwd, expected) in [("/missing", "/missing"), ("/out", "outside the node's root")] {
        let err = node
            .run(NodeCommand {
                argv: vec!["true".into()],
                cwd: Some(cwd.into()),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(err.message.contains(expected), "{cwd}: {err}");
    }
    let err = node
        .run(NodeCommand {
            argv: vec!["no-such-program".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind, crate::NodeErrorKind::InvalidInput, "{err}");
    assert!(err.message.contains("cannot start `no-such-program`"), "{err}");
}

/// What a command leaves where the file functions work does not hold them: FIFOs and a symlink
/// planted at the next temporary names of a write (`.<name>.orc-tmp-<pid>-<n>`, a FIFO would
/// block an open for good) are passed over, and the write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traps_planted_by_a_command_do_not_hold_a_write() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let node = node_in(dir.path());
    let (pid, next) = (std::process::id(), crate::local::TMP_COUNTER.load(Ordering::SeqCst));
    let script = format!(
        "mkfifo .target.orc-tmp-{pid}; for i in $(seq {next} {}); do mkfifo .target.orc-tmp-{pid}-$i; done; ln -s {}/secret.key .target.orc-tmp-{pid}-{}",
        next + 5,
        dir.path().display(),
        next + 6
    );
    let out = sh(&node, &script).await;
    assert_eq!(out.exit_code, 0, "{}", text(&out.stderr));
    let written = tokio::time::timeout(Duration::from_secs(10), node.write_file("/target", b"landed".to_vec(), None))
        .await
        .expect("a write blocked on a planted FIFO");
    written.unwrap();
    assert_eq!(std::fs::read(dir.path().join("root/target")).unwrap(), b"landed");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("secret.key")).unwrap(),
        "the host's secret key"
    );
}

/// A root under a directory commands see whole would show them the data directory beside it; a
/// relative root would be bound relative to `/`: both refused.
#[tokio::test]
async fn a_root_under_the_system_or_relative_is_refused() {
    let sandbox = super::Sandbox::host().await.unwrap();
    let argv = ["true".to_string()];
    for (root, expected) in [
        ("/usr/share", "is under /usr, which commands see read-only"),
        ("/etc/ssl/certs/orc", "is under /etc/ssl/certs"),
        ("relative/root", "is not an absolute path"),
    ] {
        let root = Path::new(root);
        let err = sandbox.confine(root, root, &argv, &[], CommandLimits::default()).err().unwrap();
        assert!(err.contains(expected), "{}: {err}", root.display());
    }
}

/// A command holds no descriptor of the host's beyond its stdio (one leaked to the data
/// directory would be a way out), and runs under the `rlimit`s: CPU, file size, open files, and a
/// core size of 1 byte (0 would still pipe a crash to a `core_pattern` helper on the host).
#[tokio::test]
async fn no_descriptor_of_the_host_s_and_the_rlimits_hold() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_in(dir.path());
    // Some open descriptors of the host's own, as a server has (without `O_CLOEXEC` only by mistake).
    let _held = std::fs::File::open(dir.path().join("secret.key")).unwrap();
    // `ls` itself, not a shell (which keeps descriptors of its own): its directory handle is
    // the one more.
    let out = node
        .run(NodeCommand {
            argv: vec!["ls".into(), "-l".into(), "/proc/self/fd".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let fds = text(&out.stdout);
    for line in fds.lines().skip(1) {
        let (before, target) = line.split_once(" -> ").unwrap_or_else(|| panic!("{line}"));
        let fd = before.split_whitespace().last().unwrap().to_string();
        let target = target.to_string();
        let (fd, target) = (fd.as_str(), target.as_str());
        let expected = match fd {
            "0" => target == "/dev/null",
            "1" | "2" => target.starts_with("pipe:"),
            // The loop's own directory handle.
            _ => target.starts_with("/proc/"),
        };
        assert!(expected, "descriptor {fd} → {target} in the sandbox:\n{fds}");
    }
    let out = sh(
        &node,
        "grep -E '^Max (cpu time|file size|open files|core file size)' /proc/self/limits",
    )
    .await;
    let limits: Vec<Vec<String>> = text(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    let soft_hard = |name: &str| {
        limits
            .iter()
            .find(|l| l.join(" ").starts_with(name))
            .map(|l| (l[l.len() - 3].clone(), l[l.len() - 2].clone()))
            .unwrap_or_else(|| panic!("{name}: {limits:?}"))
    };
    let d = CommandLimits::default();
    assert_eq!(soft_hard("Max cpu time"), (d.cpu_seconds.to_string(), d.cpu_seconds.to_string()));
    assert_eq!(
        soft_hard("Max file size"),
        (d.file_size_bytes.to_string(), d.file_size_bytes.to_string())
    );
    assert_eq!(soft_hard("Max open files"), ("4096".to_string(), "4096".to_string()));
    assert_eq!(soft_hard("Max core file size"), ("1".to_string(), "1".to_string()));
    // Names a process environment cannot hold are the plugin's error.
    let err = node
        .run(NodeCommand {
            argv: vec!["true".into()],
            env: vec![("A=B".into(), "c".into())],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind, crate::NodeErrorKind::InvalidInput, "{err}");
}

//! A real OpenSSH `sshd` for tests, on a free loopback port, with a host key and a client key
//! generated per run (`ssh-keygen`), in its own temporary directory; killed (with its
//! per-connection children) on drop. Standard library only; the integration tests of `orc-ssh`
//! and `orc-host` and their benchmark examples use it as `orc_tests::sshd`.
//!
//! Needs root (sshd must switch users), `/usr/sbin/sshd` and `unshare`. Logins are as
//! [`TEST_USER`], created if missing with `/bin/sh` as its shell (a heavy login shell makes every
//! command slower), or as root with the client key, in an empty home directory of the run's own.

// Test support (for tests and benchmark examples): a failed unwrap stops the run where it failed.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::Duration;

pub const SSHD: &str = "/usr/sbin/sshd";
pub const TEST_USER: &str = "orctest";
pub const TEST_PASSWORD: &str = "orc-test-pw-7Qz";

pub struct Sshd {
    dir: PathBuf,
    /// The address sshd listens on: `127.0.0.1`, or its own in a network namespace.
    pub address: String,
    /// The network namespace sshd runs in ([`Sshd::start_in_netns`]), if any.
    netns: Option<String>,
    pub port: u16,
    child: Option<Child>,
    /// `SHA256:…` of the current host key.
    pub host_fingerprint: String,
    /// The client's private key (OpenSSH text), authorised for every user.
    pub client_key: String,
    pub max_sessions: u32,
}

/// Creates [`TEST_USER`] (shell `/bin/sh`, home directory) if missing and sets its password.
pub fn ensure_test_user() {
    static DONE: Mutex<bool> = Mutex::new(false);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return;
    }
    let exists = || {
        Command::new("id")
            .arg("-u")
            .arg(TEST_USER)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !exists() {
        let status = Command::new("useradd")
            .args(["-m", "-s", "/bin/sh", TEST_USER])
            .status()
            .expect("useradd");
        // Another test process may have created it meanwhile.
        assert!(status.success() || exists(), "useradd {TEST_USER} failed");
    }
    let mut chpasswd = Command::new("chpasswd").stdin(Stdio::piped()).spawn().expect("chpasswd");
    writeln!(chpasswd.stdin.take().unwrap(), "{TEST_USER}:{TEST_PASSWORD}").unwrap();
    assert!(chpasswd.wait().unwrap().success(), "chpasswd failed");
    *done = true;
}

fn keygen(path: &Path) -> String {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(path.with_extension("pub"));
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "orc-test", "-f"])
        .arg(path)
        .output()
        .expect("ssh-keygen");
    assert!(out.status.success(), "ssh-keygen: {}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(path.with_extension("pub"))
        .output()
        .unwrap();
    // "256 SHA256:… orc-test (ED25519)"
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .expect("fingerprint")
        .to_string()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Sshd {
    /// Starts sshd with OpenSSH's default `MaxSessions` (10).
    pub fn start() -> Sshd {
        Sshd::start_with(10)
    }

    pub fn start_with(max_sessions: u32) -> Sshd {
        Sshd::start_at(max_sessions, "127.0.0.1")
    }

    /// Starts sshd in this namespace listening on `address` (one of this machine's own; a
    /// network namespace reaches a bridge's address, not the host's loopback).
    pub fn start_at(max_sessions: u32, address: &str) -> Sshd {
        let mut sshd = Sshd::prepare(max_sessions, address, None);
        // A port found free may be taken before sshd binds it: try a few.
        for attempt in 0.. {
            sshd.port = free_port();
            match sshd.launch() {
                Ok(()) => break,
                Err(e) if attempt < 5 => eprintln!("sshd on port {}: {e}; trying another port", sshd.port),
                Err(e) => panic!("sshd did not start: {e}"),
            }
        }
        sshd
    }

    /// Starts sshd inside the existing network namespace `netns` (`ip netns exec`), listening on
    /// `address` (one of the namespace's own) port 22, which nothing else there can hold.
    pub fn start_in_netns(netns: &str, address: &str) -> Sshd {
        let mut sshd = Sshd::prepare(10, address, Some(netns.to_string()));
        sshd.port = 22;
        if let Err(e) = sshd.launch() {
            panic!("sshd in network namespace {netns} on {address}:22 did not start: {e}");
        }
        sshd
    }

    /// Checks the prerequisites, creates the directory, the keys and the test user.
    fn prepare(max_sessions: u32, address: &str, netns: Option<String>) -> Sshd {
        assert_eq!(
            Command::new("id")
                .arg("-u")
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .ok()
                .as_deref(),
            Some("0"),
            "the sshd tests run as root (sshd switches to the test user)"
        );
        assert!(Path::new(SSHD).exists(), "{SSHD} is missing: apt-get install openssh-server");
        std::fs::create_dir_all("/run/sshd").unwrap(); // privilege separation directory
        ensure_test_user();
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "orc-sshd-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // The test user must reach its scratch directories below this one.
        set_mode(&dir, 0o755);
        let host_fingerprint = keygen(&dir.join("host_ed25519"));
        keygen(&dir.join("client_ed25519"));
        std::fs::copy(dir.join("client_ed25519.pub"), dir.join("authorized_keys")).unwrap();
        let client_key = std::fs::read_to_string(dir.join("client_ed25519")).unwrap();
        Sshd {
            dir,
            address: address.to_string(),
            netns,
            port: 0,
            child: None,
            host_fingerprint,
            client_key,
            max_sessions,
        }
    }

    fn launch(&mut self) -> Result<(), String> {
        let config = self.dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress {address}\nHostKey {dir}/host_ed25519\nPidFile none\n\
                 AuthorizedKeysFile {dir}/authorized_keys\nPubkeyAuthentication yes\nPasswordAuthentication yes\n\
                 KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n\
                 MaxSessions {max}\nSubsystem sftp internal-sftp\nLogLevel INFO\n",
                port = self.port,
                address = self.address,
                dir = self.dir.display(),
                max = self.max_sessions,
            ),
        )
        .unwrap();
        // sshd runs in its own mount namespace with an empty directory over `/root`: root's
        // logins start bash, which reads `~/.bashrc`, and this machine's own dotfiles (a
        // version manager's init, say, which can wait a minute on a lock that a killed login
        // left behind) must not decide how long a test's command takes. `unshare` and the
        // shell execute in place, as `ip netns exec` does: the child is sshd itself.
        let home = self.dir.join("root-home");
        std::fs::create_dir_all(&home).unwrap();
        set_mode(&home, 0o700);
        let mut command = Command::new("unshare");
        command
            .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
            .arg(r#"mount --bind "$0" /root && exec "$@""#)
            .arg(&home);
        if let Some(netns) = &self.netns {
            command.args(["ip", "netns", "exec", netns]);
        }
        let mut child = command
            .arg(SSHD) // by absolute path: sshd re-executes itself
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let stderr = child.stderr.take().unwrap();
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("sshd.log"))
            .unwrap();
        std::thread::spawn(move || {
            let mut ready = Some(ready_tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
                if line.contains("Server listening") {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(Ok(()));
                    }
                } else if let Some(tx) = &ready
                    && (line.contains("Bind to port") || line.contains("fatal") || line.contains("Cannot bind"))
                {
                    let _ = tx.send(Err(line.clone()));
                }
            }
            if let Some(tx) = ready {
                let _ = tx.send(Err("sshd exited".into()));
            }
        });
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {
                self.child = Some(child);
                Ok(())
            }
            other => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("{other:?}"))
            }
        }
    }

    /// Kills sshd and every per-connection sshd under it, as if the node went away.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id();
            // Per-connection monitors and their privilege-separated children (which hold the
            // connection after authentication): the whole tree, frozen before it is listed and
            // listed again until no new process shows up, so that nothing forks unseen. Listed
            // while running, a connection accepted between the listing and the kill outlived the
            // server, and the host kept using it (a test saw its node stay reachable).
            let mut frozen = vec![pid];
            signal(&frozen, "STOP");
            loop {
                let new: Vec<u32> = descendants_of(pid).into_iter().filter(|p| !frozen.contains(p)).collect();
                if new.is_empty() {
                    break;
                }
                signal(&new, "STOP");
                frozen.extend(new);
            }
            let _ = child.kill();
            let _ = child.wait();
            signal(&frozen[1..], "KILL");
        }
    }

    /// Stops (SIGSTOP) every per-connection sshd, leaving the listener running: established
    /// connections go silent, as on a lost network, while new connections still work. Returns
    /// the stopped processes, for [`Sshd::kill_frozen`].
    pub fn freeze_connections(&self) -> Vec<u32> {
        let pids = self.child.as_ref().map(|c| descendants_of(c.id())).unwrap_or_default();
        signal(&pids, "STOP");
        pids
    }

    pub fn kill_frozen(&self, pids: &[u32]) {
        signal(pids, "KILL");
        signal(pids, "CONT");
    }

    /// Starts sshd again on the same port with the same host key (after [`Sshd::stop`]).
    pub fn start_again(&mut self) {
        self.stop();
        let mut last = String::new();
        for _ in 0..50 {
            match self.launch() {
                Ok(()) => return,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("sshd did not start again on port {}: {last}", self.port);
    }

    /// Gives the server a new host key and restarts it, as a reinstalled (or impostor) node would.
    pub fn replace_host_key(&mut self) {
        self.stop();
        self.host_fingerprint = keygen(&self.dir.join("host_ed25519"));
        self.start_again();
    }

    /// A fresh directory owned by [`TEST_USER`], for a test's files.
    pub fn scratch_dir(&self, name: &str) -> PathBuf {
        let dir = self.dir.join("scratch").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        set_mode(&self.dir.join("scratch"), 0o755);
        let status = Command::new("chown").arg(format!("{TEST_USER}:")).arg(&dir).status().unwrap();
        assert!(status.success());
        dir
    }

    /// The server's log so far, for assertion messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn signal(pids: &[u32], name: &str) {
    for pid in pids {
        let _ = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .stderr(Stdio::null())
            .status();
    }
}

/// Every process below `pid`.
fn descendants_of(pid: u32) -> Vec<u32> {
    let mut all = children_of(pid);
    let mut i = 0;
    while i < all.len() {
        let next = children_of(all[i]);
        all.extend(next);
        i += 1;
    }
    all
}

/// Processes whose parent is `pid` (from `/proc/<pid>/stat`).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                // "pid (comm) state ppid …": comm may contain spaces, so split after the last ')'.
                .and_then(|s| {
                    s.rsplit_once(')')
                        .map(|(_, rest)| rest.split_whitespace().nth(1) == Some(pid.to_string().as_str()))
                })
                .unwrap_or(false)
        })
        .collect()
}

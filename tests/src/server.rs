//! A real `orc-host serve` process on a free loopback port, in a data directory of its own:
//! its address and the admin token its first start prints. Killed when dropped.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::bin;

/// The line `orc-host serve` prints its address on, then the one it prints the first admin
/// token on (`host/src/main.rs`).
const LISTENING: &str = "listening on http://";
const ADMIN_TOKEN: &str = "admin token (shown once; only its hash is stored): ";

/// A running `orc-host serve`.
pub struct Served {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The admin token the first start printed.
    pub token: String,
    dir: tempfile::TempDir,
}

impl Served {
    /// Starts `orc-host serve --listen 127.0.0.1:0 --config FILE --data-dir DIR`, with `config`
    /// (TOML) as FILE and `env` added to its environment, and waits for its address and token.
    pub fn start(config: &str, env: &[(&str, &str)]) -> Served {
        Served::spawn(config, env, true)
    }

    /// [`Served::start`] for a replica on a database that may have users already: waits for its
    /// address, then a moment for the token a first start prints (`token` stays empty if none
    /// came: the two lines are written one right after the other).
    pub fn start_replica(config: &str) -> Served {
        Served::spawn(config, &[], false)
    }

    fn spawn(config: &str, env: &[(&str, &str)], wants_token: bool) -> Served {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config_file = dir.path().join("orc-host.toml");
        std::fs::write(&config_file, config).expect("write the configuration");
        let mut command = Command::new(bin("orc-host"));
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config_file)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        // To see what a server logged: `ORC_TEST_SERVER_LOGS=DIR` keeps each one's stderr there.
        if let Ok(logs) = std::env::var("ORC_TEST_SERVER_LOGS") {
            let file = tempfile::Builder::new()
                .prefix("orc-host-")
                .suffix(".log")
                .tempfile_in(logs)
                .and_then(|f| f.keep().map_err(|e| e.error));
            if let Ok((file, _)) = file {
                command
                    .stderr(file)
                    .env("ORC_LOG", std::env::var("ORC_LOG").unwrap_or_else(|_| "info".into()));
            }
        }
        let mut child = command.spawn().expect("start orc-host serve");
        let lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        // Read on a thread of its own, which keeps draining stdout afterwards.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let (mut addr, mut token) = (None, None);
        while addr.is_none() || (wants_token && token.is_none()) {
            let line = rx
                .recv_timeout(std::time::Duration::from_secs(120))
                .expect("orc-host serve printed its address (and token) before it ended");
            if let Some(a) = line.strip_prefix(LISTENING) {
                addr = Some(a.trim().to_string());
            } else if let Some((_, t)) = line.split_once(ADMIN_TOKEN) {
                token = Some(t.trim().to_string());
            }
        }
        if token.is_none()
            && let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(1))
            && let Some((_, t)) = line.split_once(ADMIN_TOKEN)
        {
            token = Some(t.trim().to_string());
        }
        Served {
            child,
            addr: addr.unwrap_or_default(),
            token: token.unwrap_or_default(),
            dir,
        }
    }

    /// The process id, to look at it in `/proc`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The server's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Kills the server with SIGKILL (nothing of it runs after this returns) and hands back the
    /// directory its configuration and data are in.
    pub fn kill(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::mem::replace(&mut self.dir, dir)
    }

    /// The directory the server's configuration and data are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Sends `signal` (`-STOP`, `-CONT`, …) to the server with `kill`.
    pub fn signal(&self, signal: &str) {
        let sent = Command::new("kill").arg(signal).arg(self.pid().to_string()).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill {signal} {}", self.pid());
    }
}

/// One HTTP/1.1 request to `addr` (`127.0.0.1:PORT`), with a JSON `body` and the bearer `token`
/// if given: the status and the whole answer, headers and body (a connection of its own,
/// closed after; [`body_of`] takes the body).
pub fn request(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(auth) = &auth {
        headers.push(("authorization", auth));
    }
    request_with(addr, method, path, &headers, body)
}

/// Like [`request`], with the header fields `headers` (a form, a cookie).
pub fn request_with(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .expect("a read timeout");
    let fields: String = headers.iter().map(|(name, value)| format!("{name}: {value}\r\n")).collect();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\n{fields}connection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, answer)
}

/// The body of an answer [`request`] returned.
pub fn body_of(answer: &str) -> &str {
    answer.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

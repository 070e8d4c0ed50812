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
        let mut child = command.spawn().expect("start orc-host serve");
        let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let (mut addr, mut token) = (None, None);
        while addr.is_none() || token.is_none() {
            let line = lines
                .next()
                .expect("orc-host serve printed its address and token before it ended")
                .expect("read orc-host's stdout");
            if let Some(a) = line.strip_prefix(LISTENING) {
                addr = Some(a.trim().to_string());
            } else if let Some((_, t)) = line.split_once(ADMIN_TOKEN) {
                token = Some(t.trim().to_string());
            }
        }
        std::thread::spawn(move || for _ in lines {});
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
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

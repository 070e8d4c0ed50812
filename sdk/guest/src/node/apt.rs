//! `apt-get` on a node, one run at a time per node.
//!
//! Every plugin that runs `apt-get` builds the command here, so they all take the same node lock
//! with the same waits: two plugins that each took a lock of their own would still run apt at
//! the same time on one node and meet the package lists' lock.
//!
//! The command is `flock` on [`NODE_LOCK`] around `apt-get`, non-interactive (`DEBIAN_FRONTEND=
//! noninteractive`, `LC_ALL=C`, `-q -y`, existing configuration files kept), waiting up to
//! [`DPKG_LOCK_TIMEOUT`] for the dpkg lock. `flock` comes from util-linux, essential on Debian.
//! The plugin runs it with [`super::run`] and reads the outcome: [`lock_busy`] when another
//! apt run held the node lock for all of [`NODE_LOCK_WAIT_S`], worth a `retryable` error.
//!
//! ```
//! use orc_sdk::node::apt;
//! let cmd = apt::get(&[], &["install", "redis-server"]);
//! assert_eq!(cmd.argv()[..5], ["flock", "-E", "75", "-w", "300"]);
//! assert_eq!(cmd.argv()[cmd.argv().len() - 2..], ["install", "redis-server"]);
//! ```

use std::time::Duration;

use super::{Command, Output};

/// How long one `apt-get` run may take, waits for the locks included.
pub const TIMEOUT: Duration = Duration::from_secs(600);

/// The `apt-get` option that makes it wait this long for the dpkg lock (held by unattended
/// upgrades or an operator) before giving up.
pub const DPKG_LOCK_TIMEOUT: &str = "DPkg::Lock::Timeout=300";

/// Plugins run `apt-get` on a node one at a time, under this lock: `DPkg::Lock::Timeout` covers
/// the dpkg lock but not the package lists' lock, which `apt-get update` and a concurrent install
/// both take.
pub const NODE_LOCK: &str = "/run/lock/orc-apt.lock";

/// How long to wait for [`NODE_LOCK`], in seconds.
pub const NODE_LOCK_WAIT_S: &str = "300";

/// `flock`'s exit code when [`NODE_LOCK`] stayed taken for [`NODE_LOCK_WAIT_S`].
pub const NODE_LOCK_BUSY: i32 = 75;

/// `apt-get` with the non-interactive settings, then `-o <option>` for each of `options`
/// (`Key=Value`), then `args`, under the node's [`NODE_LOCK`] and with [`TIMEOUT`].
pub fn get(options: &[String], args: &[&str]) -> Command {
    let busy = NODE_LOCK_BUSY.to_string();
    let mut command = Command::new("flock")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("LC_ALL", "C")
        .timeout(TIMEOUT)
        .args(["-E", busy.as_str(), "-w", NODE_LOCK_WAIT_S, NODE_LOCK, "apt-get"])
        .args([
            "-q",
            "-y",
            "-o",
            "Dpkg::Options::=--force-confdef",
            "-o",
            "Dpkg::Options::=--force-confold",
            "-o",
            DPKG_LOCK_TIMEOUT,
        ]);
    for option in options {
        command = command.args(["-o", option.as_str()]);
    }
    command.args(args.iter().copied())
}

/// Whether the run never started because another apt run held [`NODE_LOCK`] for all of
/// [`NODE_LOCK_WAIT_S`]: worth trying again later.
pub fn lock_busy(output: &Output) -> bool {
    output.exit_code == NODE_LOCK_BUSY
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apt_runs_under_the_node_lock_non_interactively() {
        let proxy = "Acquire::http::Proxy=http://proxy:3128".to_string();
        let cmd = get(&[proxy], &["install", "--no-install-recommends", "hello"]);
        assert_eq!(
            cmd.argv(),
            [
                "flock",
                "-E",
                "75",
                "-w",
                "300",
                "/run/lock/orc-apt.lock",
                "apt-get",
                "-q",
                "-y",
                "-o",
                "Dpkg::Options::=--force-confdef",
                "-o",
                "Dpkg::Options::=--force-confold",
                "-o",
                "DPkg::Lock::Timeout=300",
                "-o",
                "Acquire::http::Proxy=http://proxy:3128",
                "install",
                "--no-install-recommends",
                "hello",
            ]
        );
        let env: Vec<(&str, &str)> = cmd.inner.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(env, [("DEBIAN_FRONTEND", "noninteractive"), ("LC_ALL", "C")]);
        assert_eq!(cmd.inner.timeout_ms, Some(600_000));
        assert_eq!(get(&[], &["update"]).argv().last().map(String::as_str), Some("update"));
    }

    #[test]
    fn flocks_exit_code_means_the_node_lock_was_busy() {
        let out = |exit_code| Output {
            exit_code,
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        assert!(lock_busy(&out(75)));
        assert!(!lock_busy(&out(100)) && !lock_busy(&out(0)));
    }
}

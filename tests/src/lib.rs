//! Test support for the whole workspace: the end-to-end tests' helpers (find the workspace's
//! binaries and run them), and what the other crates' integration tests share — a real OpenSSH
//! `sshd` ([`sshd`]), a real PostgreSQL ([`pg`]), a real `orc-host serve` ([`server`]) and its
//! event streams ([`sse`]), the guides' command blocks ([`guide`]), and polling for a
//! condition ([`wait_for`]).
//! Depends on no crate of this workspace, so any crate can take it as a dev-dependency.

pub mod guide;
pub mod pg;
pub mod server;
pub mod sse;
pub mod sshd;
mod wait;

pub use wait::{Look, wait_for};

use std::path::PathBuf;
use std::process::{Command, Output};

/// The path of a workspace binary in the target directory these tests were built into. The
/// binaries must be built (`cargo build --workspace --bins`; `.ci/run` does it) before the tests run.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/e2e-<hash> → target/<profile>/<name>
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace --bins` first (`.ci/run` does)",
        path.display()
    );
    path
}

/// Where the end-to-end tests compile the plugin crates they make (`orc-plugin build` honours
/// `CARGO_TARGET_DIR`): one directory beside the binaries, so that the guest's dependencies are
/// compiled once for all of them, and once for all runs.
pub fn guest_target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(|d| d.parent())
        .and_then(|d| d.parent())
        .expect("target/<profile>/deps")
        .join("e2e-guests")
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the root")
        .to_path_buf()
}

/// Runs a command and returns its output, with stdout and stderr in the panic message on failure
/// when `expect_success`.
pub fn run(cmd: &mut Command, expect_success: bool) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if expect_success && !out.status.success() {
        panic!(
            "{cmd:?} failed with {}\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

//! The confined local node's commands: each runs under bubblewrap (`bwrap`), in namespaces of
//! its own (mount, PID, IPC, UTS, cgroup, user; network unless the environment grants it), as
//! an unprivileged user with no capabilities and `no_new_privs`, under a seccomp filter
//! ([`seccomp`]), with resource limits (CPU time and file size by `rlimit`, processes and
//! memory by a control group of its own, [`cgroup`]).
//!
//! What it sees: the node's root (read-write, at its host path, the working directory inside
//! it), the system's programs and libraries read-only (`/usr` and the `/bin`, `/lib*`, `/sbin`
//! beside it), a short list of `/etc` files programs need and that hold no secret
//! ([`ETC`]), a fresh `/proc` of its own PID namespace, a minimal `/dev`, and an empty `/tmp`.
//! Nothing else of the host: not the data directory (database, secret key, registry, other
//! environments' roots, the local node's spares), not `/etc/shadow`, not the host's processes
//! or environment. When the command's first process ends, the PID namespace ends and every
//! process it left ends with it.
//!
//! The sandbox is probed once per process ([`Sandbox::host`]). Where it cannot be set up (no
//! `bwrap`, user namespaces disabled, no writable cgroup controllers) commands on the local node
//! are refused with the reason; they never run unconfined.

mod cgroup;
mod seccomp;

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};

use command_fds::{CommandFdExt, FdMapping};

use crate::CommandLimits;

pub use cgroup::CgroupError;
pub use seccomp::FilterError;

/// The environment variable naming the `bwrap` to use, for one installed elsewhere.
pub const BWRAP_VAR: &str = "ORC_BWRAP";

/// Why the sandbox cannot be set up on this host; commands on the local node are refused with it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "commands on the local node run under bubblewrap, which is not installed (no `bwrap` in /usr/bin, /bin or /usr/local/bin, or where ORC_BWRAP says; install the `bubblewrap` package)"
    )]
    NoBwrap,
    #[error("commands on the local node cannot be confined: {0}")]
    Unavailable(String),
}

/// `/etc` files a confined command sees (read-only, those that exist): accounts without
/// passwords, name resolution, the dynamic linker's cache, time zone, the alternatives
/// programs link through, and public CA certificates. Never `shadow`, `gshadow`, `sudoers`,
/// `ssh/`, `ssl/private` nor orc's own configuration.
pub const ETC: &[&str] = &[
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/nsswitch.conf",
    "/etc/resolv.conf",
    "/etc/gai.conf",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/alternatives",
    "/etc/ssl/certs",
    "/etc/ca-certificates",
    "/etc/protocols",
    "/etc/services",
    "/etc/mime.types",
    "/etc/locale.alias",
    "/etc/os-release",
    "/etc/debian_version",
    "/etc/shells",
    "/etc/magic",
];

/// Files of the sandbox's own `/proc` that still show (or change) the host's kernel, and which
/// its user — the host's user outside, by the kernel's checks on file modes — could otherwise
/// read or write: covered by an empty file or directory, as Docker masks them. `/proc/sys`,
/// `/proc/sysrq-trigger`, `/proc/irq` and `/proc/bus` bwrap makes read-only itself.
const PROC_MASKED_FILES: &[&str] = &[
    "/proc/kcore",
    "/proc/keys",
    "/proc/key-users",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/latency_stats",
    "/proc/kpageflags",
    "/proc/kpagecount",
    "/proc/kpagecgroup",
    "/proc/kallsyms",
    "/proc/kmsg",
];
const PROC_MASKED_DIRS: &[&str] = &["/proc/acpi", "/proc/scsi", "/proc/asound", "/proc/driver"];
/// Read-only, as Docker keeps them: file systems' tunables (`/proc/fs/cifs/SecurityFlags`).
const PROC_READ_ONLY: &[&str] = &["/proc/fs"];

/// System directories bound read-only (or recreated as the symlinks they are, as on merged-`/usr`
/// systems).
const SYSTEM: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/// The user and group a command runs as inside (`nobody`); outside, its files are the host's
/// user's, as the node's file functions write them.
const INSIDE_ID: &str = "65534";

/// Exit status of the set-up step when it fails (it says why on stderr, after [`MARK`]).
const SETUP_FAILED: i32 = 125;
/// How the sandbox's own messages start on a command's stderr.
pub const MARK: &str = "orc-sandbox: ";

/// Run by `sh` on the host before the rest: joins the command's control group(s), then becomes
/// `prlimit`, which sets the limits no namespace gives and becomes `bwrap`. `$1` how many
/// `cgroup.procs` files follow.
const PRELUDE: &str = r#"fail() { echo "orc-sandbox: $1" >&2; exit 125; }
n=$1; shift
while [ "$n" -gt 0 ]; do echo 0 > "$1" || fail "cannot join the control group $1"; shift; n=$((n - 1)); done
exec "$@""#;

/// Open files per process: what commands need, short of what would strain the host's tables.
const MAX_OPEN_FILES: u64 = 4096;

static HOST: OnceLock<Result<Arc<Sandbox>, SandboxError>> = OnceLock::new();

/// The host's means to confine commands: found and tried once.
#[derive(Debug)]
pub struct Sandbox {
    bwrap: PathBuf,
    /// util-linux's `prlimit`, which sets the `rlimit`s exactly (in bytes, unlike `ulimit`).
    prlimit: PathBuf,
    filters: Vec<Arc<[u8]>>,
    cgroups: cgroup::Hierarchy,
    /// `bwrap` arguments for the system directories and `/etc` files.
    system: Vec<OsString>,
    /// `bwrap` arguments masking what of `/proc` shows the host ([`PROC_MASKED_FILES`]).
    proc_masks: Vec<OsString>,
}

/// One command, ready to spawn, and the group that limits it (dropping it kills what is left).
pub(crate) struct Confined {
    pub command: tokio::process::Command,
    group: cgroup::Group,
    limits: CommandLimits,
}

impl Confined {
    /// What the sandbox's limits stopped, as lines for the command's stderr.
    pub fn report(&self) -> Option<String> {
        let stopped = self.group.stopped();
        let mut lines = String::new();
        if stopped.memory {
            lines += &format!(
                "\n{MARK}a process was killed at the memory limit of {} bytes (setting `local_commands.memory_bytes`)\n",
                self.limits.memory_bytes
            );
        }
        if stopped.processes {
            lines += &format!(
                "\n{MARK}a fork was refused at the limit of {} processes (setting `local_commands.processes`)\n",
                self.limits.processes
            );
        }
        (!lines.is_empty()).then_some(lines)
    }
}

impl Sandbox {
    /// The host's sandbox, probed on first use (a trial command, off the async threads); the
    /// same answer for the process's life.
    pub async fn host() -> Result<Arc<Sandbox>, SandboxError> {
        if let Some(probed) = HOST.get() {
            return probed.clone();
        }
        tokio::task::spawn_blocking(Sandbox::host_blocking)
            .await
            .unwrap_or_else(|e| Err(SandboxError::Unavailable(format!("the probe failed: {e}"))))
    }

    /// [`Sandbox::host`], probing on the caller's thread.
    pub fn host_blocking() -> Result<Arc<Sandbox>, SandboxError> {
        HOST.get_or_init(|| {
            let probed = Sandbox::probe().map(Arc::new);
            match &probed {
                Ok(s) => tracing::info!(bwrap = %s.bwrap.display(), cgroups = ?s.cgroups, "commands on the local node are confined"),
                Err(e) => tracing::error!(error = %e, "commands on the local node are refused"),
            }
            probed
        })
        .clone()
    }

    fn probe() -> Result<Sandbox, SandboxError> {
        let bwrap = match std::env::var_os(BWRAP_VAR) {
            Some(path) => Some(PathBuf::from(path)).filter(|p| p.is_file()),
            None => ["/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap"]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file()),
        }
        .ok_or(SandboxError::NoBwrap)?;
        if !bwrap.is_absolute() {
            return Err(SandboxError::Unavailable(format!(
                "{BWRAP_VAR} must be an absolute path, not {}",
                bwrap.display()
            )));
        }
        let prlimit = ["/usr/bin/prlimit", "/bin/prlimit"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or_else(|| SandboxError::Unavailable("`prlimit` (util-linux) is not installed".into()))?;
        let unavailable = |e: &dyn std::fmt::Display| SandboxError::Unavailable(e.to_string());
        let filters = seccomp::programs().map_err(|e| unavailable(&e))?;
        let cgroups = cgroup::Hierarchy::open().map_err(|e| unavailable(&e))?;
        let sandbox = Sandbox {
            bwrap,
            filters: filters.into_iter().map(Arc::from).collect(),
            prlimit,
            cgroups,
            system: system_binds(),
            proc_masks: proc_masks(),
        };
        sandbox.try_once()?;
        Ok(sandbox)
    }

    /// Runs `true` confined, so a host that cannot (no user namespaces) says so at once.
    fn try_once(&self) -> Result<(), SandboxError> {
        let dir = std::env::temp_dir();
        let mut confined = self
            .confine(&dir, &dir, &["true".to_string()], &[], CommandLimits::default())
            .map_err(SandboxError::Unavailable)?;
        let std = confined.command.as_std_mut();
        let out = std
            .stdin(Stdio::null())
            .output()
            .map_err(|e| SandboxError::Unavailable(format!("cannot start `{}`: {e}", self.bwrap.display())))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(SandboxError::Unavailable(format!(
                "a trial command failed ({}): {} (are user namespaces enabled? `sysctl user.max_user_namespaces`)",
                out.status,
                stderr.trim()
            )));
        }
        Ok(())
    }

    /// `argv` confined, in `cwd` (inside `root`), with `env` and `limits`. The command's own
    /// process on the host is `sh`, then `bwrap`: its stdio, environment and process group are
    /// the caller's to set (only `PATH` should be given; `env` goes inside).
    pub(crate) fn confine(
        &self,
        root: &Path,
        cwd: &Path,
        argv: &[String],
        env: &[(String, String)],
        limits: CommandLimits,
    ) -> Result<Confined, String> {
        if !root.is_absolute() {
            return Err(format!("the node's root {} is not an absolute path", root.display()));
        }
        // Under a directory commands see whole (`/usr`, …), the data directory beside the root
        // would be visible to them: its database, its secret key.
        if let Some(system) = SYSTEM.iter().chain(ETC).find(|p| root.starts_with(p)) {
            return Err(format!(
                "the node's root {} is under {system}, which commands see read-only: keep the data directory elsewhere",
                root.display()
            ));
        }
        let group = self
            .cgroups
            .group(limits.processes, limits.memory_bytes)
            .map_err(|e| e.to_string())?;
        let procs = group.procs_files();
        let mut fds = Vec::with_capacity(self.filters.len());
        for (i, program) in self.filters.iter().enumerate() {
            fds.push(FdMapping {
                parent_fd: memfd(program).map_err(|e| format!("cannot hand the seccomp filter over: {e}"))?,
                child_fd: 3 + i as i32,
            });
        }
        let mut command = tokio::process::Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(PRELUDE)
            .arg("orc-sandbox")
            .arg(procs.len().to_string())
            .args(&procs)
            // `rlimit`s (soft and hard, so the command cannot raise them): CPU seconds per
            // process, largest file, open files, and a core size of 1 byte, which also keeps the
            // kernel from piping a crash's core to a host helper (`core_pattern` `|…`), as 0
            // would not.
            .arg(&self.prlimit)
            .arg(format!("--cpu={0}:{0}", limits.cpu_seconds))
            .arg(format!("--fsize={0}:{0}", limits.file_size_bytes))
            .arg(format!("--nofile={MAX_OPEN_FILES}:{MAX_OPEN_FILES}"))
            .args(["--core=1:1", "--"])
            .arg(&self.bwrap)
            .args([
                "--unshare-all",
                "--unshare-user",
                "--disable-userns",
                "--die-with-parent",
                "--new-session",
                "--cap-drop",
                "ALL",
                "--uid",
                INSIDE_ID,
                "--gid",
                INSIDE_ID,
                "--hostname",
                "orc-local",
            ]);
        if limits.network {
            command.arg("--share-net");
        }
        command
            .args(&self.system)
            .args(["--proc", "/proc", "--dev", "/dev"])
            .args(&self.proc_masks)
            .arg("--size")
            .arg(limits.memory_bytes.to_string())
            .args(["--tmpfs", "/tmp"])
            .arg("--bind")
            .arg(root)
            .arg(root)
            .arg("--chdir")
            .arg(cwd);
        for fd in &fds {
            command.arg("--add-seccomp-fd").arg(fd.child_fd.to_string());
        }
        for (k, v) in env {
            command.arg("--setenv").arg(k).arg(v);
        }
        command.arg("--").args(argv).current_dir("/");
        let first_unmapped = 3 + fds.len() as u32;
        command
            .fd_mappings(fds)
            .map_err(|e| format!("cannot hand the seccomp filter over: {e}"))?;
        close_the_rest_on_exec(&mut command, first_unmapped);
        Ok(Confined { command, group, limits })
    }
}

/// Marks every descriptor of the child from `first` on close-on-exec (after the seccomp
/// programs are in place below it), so that nothing the host holds open without `O_CLOEXEC` — a
/// library's slip, or what the host itself inherited (`cargo`'s jobserver pipe, a service
/// manager's sockets) — reaches the sandbox, where one descriptor of the data directory would
/// be a way out. Needs Linux 5.11 (`CLOSE_RANGE_CLOEXEC`); before that, the command fails to
/// start.
#[allow(unsafe_code)]
fn close_the_rest_on_exec(command: &mut tokio::process::Command, first: u32) {
    // SAFETY: the closure runs in the child between `fork` and `exec`: it makes one system call,
    // which is async-signal-safe, and neither allocates nor takes a lock.
    unsafe {
        command.pre_exec(move || {
            if libc::close_range(first, u32::MAX, libc::CLOSE_RANGE_CLOEXEC as i32) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// A copy of `bytes` to hand a child as a file descriptor (read from its start).
fn memfd(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SeekFrom};
    let fd = rustix::fs::memfd_create("orc-seccomp", MemfdFlags::CLOEXEC)?;
    let mut written = 0;
    while written < bytes.len() {
        written += rustix::io::write(&fd, &bytes[written..])?;
    }
    rustix::fs::seek(&fd, SeekFrom::Start(0))?;
    Ok(fd)
}

/// `--ro-bind` (or `--symlink`, as on the host) for [`SYSTEM`], then `--ro-bind` for [`ETC`].
fn system_binds() -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    for dir in SYSTEM {
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(dir) {
                    args.extend(["--symlink".into(), target.into_os_string(), (*dir).into()]);
                }
            }
            Ok(m) if m.is_dir() => args.extend(["--ro-bind".into(), (*dir).into(), (*dir).into()]),
            _ => {}
        }
    }
    for path in ETC {
        if Path::new(path).exists() {
            args.extend(["--ro-bind".into(), (*path).into(), (*path).into()]);
        }
    }
    args
}

/// `bwrap` arguments that mask [`PROC_MASKED_FILES`] and [`PROC_MASKED_DIRS`] and make
/// [`PROC_READ_ONLY`] read-only, for those this kernel has.
fn proc_masks() -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    for path in PROC_MASKED_FILES.iter().filter(|p| Path::new(p).exists()) {
        args.extend(["--ro-bind".into(), "/dev/null".into(), (*path).into()]);
    }
    for path in PROC_MASKED_DIRS.iter().filter(|p| Path::new(p).is_dir()) {
        args.extend(["--tmpfs".into(), (*path).into(), "--remount-ro".into(), (*path).into()]);
    }
    for path in PROC_READ_ONLY.iter().filter(|p| Path::new(p).is_dir()) {
        args.extend(["--ro-bind".into(), (*path).into(), (*path).into()]);
    }
    args
}

/// Whether a command's stderr and exit status say the sandbox itself failed (rather than the
/// command): its message then, for the error.
pub(crate) fn setup_failure(exit_code: Option<i32>, stderr: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stderr);
    let first = text.lines().next().unwrap_or_default();
    let failed = match exit_code {
        Some(SETUP_FAILED) => first.starts_with(MARK),
        Some(1) => first.starts_with("bwrap: ") || first.starts_with("prlimit: "),
        _ => false,
    };
    failed.then(|| first.to_string())
}

#[cfg(test)]
mod tests;

//! A control group per confined command: the limits on its processes and memory, which
//! `RLIMIT_NPROC` cannot give (the sandbox's user is the host's user outside, and the kernel
//! does not count processes against root), and a count of what was stopped by them.
//!
//! Either cgroup v2 (`/sys/fs/cgroup` with the `pids` and `memory` controllers) or the v1
//! `pids` and `memory` hierarchies. The host's groups live under `orc-sandbox/` in each; a
//! command's group is `orc-sandbox/<pid>-<n>`, made before it starts, joined by its first
//! process before it runs anything (so no process of it is ever outside), removed once all of
//! its processes are gone.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const ROOT: &str = "/sys/fs/cgroup";
const PARENT: &str = "orc-sandbox";

/// Where the host makes its commands' groups.
#[derive(Debug)]
pub(super) enum Hierarchy {
    /// One tree for both controllers.
    V2(PathBuf),
    /// The `pids` and the `memory` trees.
    V1 { pids: PathBuf, memory: PathBuf },
}

/// Why no group can be made: the commands cannot be limited.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup hierarchy with the `pids` and `memory` controllers under {ROOT}")]
    NoControllers,
    #[error("cannot set up {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(io(path))
}

fn make_dir(path: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(io(path)(e)),
        _ => Ok(()),
    }
}

impl Hierarchy {
    /// Finds the controllers and makes the host's parent group in each; removes the empty
    /// groups a previous host left behind.
    pub(super) fn open() -> Result<Hierarchy, CgroupError> {
        let root = Path::new(ROOT);
        let hierarchy = match std::fs::read_to_string(root.join("cgroup.controllers")) {
            Ok(controllers) => {
                let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
                if !has("pids") || !has("memory") {
                    return Err(CgroupError::NoControllers);
                }
                let parent = root.join(PARENT);
                make_dir(&parent)?;
                // Children of the parent get both controllers; the parent itself holds no
                // process (cgroup v2's rule for a group that hands controllers down).
                write(&root.join("cgroup.subtree_control"), "+pids +memory")?;
                write(&parent.join("cgroup.subtree_control"), "+pids +memory")?;
                Hierarchy::V2(parent)
            }
            Err(_) => {
                let (pids, memory) = (root.join("pids"), root.join("memory"));
                if !pids.join("cgroup.procs").exists() || !memory.join("cgroup.procs").exists() {
                    return Err(CgroupError::NoControllers);
                }
                let (pids, memory) = (pids.join(PARENT), memory.join(PARENT));
                make_dir(&pids)?;
                make_dir(&memory)?;
                Hierarchy::V1 { pids, memory }
            }
        };
        for dir in hierarchy.parents() {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                // `<pid>-<n>`: only those of hosts no longer running (another host on this
                // machine may have just made one it is about to join).
                let name = entry.file_name().to_string_lossy().into_owned();
                let owner = name.split_once('-').and_then(|(pid, _)| pid.parse::<u32>().ok());
                let running = owner.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
                if entry.file_type().is_ok_and(|t| t.is_dir()) && !running {
                    // Fails (EBUSY) where processes still run; those are left alone.
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
        Ok(hierarchy)
    }

    fn parents(&self) -> Vec<&Path> {
        match self {
            Hierarchy::V2(parent) => vec![parent],
            Hierarchy::V1 { pids, memory } => vec![pids, memory],
        }
    }

    /// A new group for one command with these limits.
    pub(super) fn group(&self, processes: u64, memory_bytes: u64) -> Result<Group, CgroupError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let dirs: Vec<PathBuf> = self.parents().iter().map(|p| p.join(&name)).collect();
        let group = Group {
            dirs,
            v2: matches!(self, Hierarchy::V2(_)),
        };
        for dir in &group.dirs {
            make_dir(dir)?;
        }
        let (pids_dir, memory_dir) = (&group.dirs[0], group.dirs.last().expect("one or two"));
        write(&pids_dir.join("pids.max"), &processes.to_string())?;
        if group.v2 {
            write(&memory_dir.join("memory.max"), &memory_bytes.to_string())?;
            // No swap: the limit is on memory, not on what can be pushed out of it.
            let swap = memory_dir.join("memory.swap.max");
            if swap.exists() {
                write(&swap, "0")?;
            }
        } else {
            write(&memory_dir.join("memory.limit_in_bytes"), &memory_bytes.to_string())?;
            let swap = memory_dir.join("memory.memsw.limit_in_bytes");
            if swap.exists() {
                write(&swap, &memory_bytes.to_string())?;
            }
        }
        Ok(group)
    }
}

/// One command's group: its `cgroup.procs` files are what its first process writes itself
/// into. Dropping it kills what is left in it and removes it.
#[derive(Debug)]
pub(super) struct Group {
    /// v2: one directory; v1: the `pids` group, then the `memory` group.
    dirs: Vec<PathBuf>,
    v2: bool,
}

/// What a group's limits stopped, read after its command ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Stopped {
    /// Forks refused at the process limit.
    pub processes: bool,
    /// Processes killed at the memory limit.
    pub memory: bool,
}

impl Group {
    /// The files the first process writes `0` (itself) into, in order.
    pub(super) fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// What the limits stopped so far.
    pub(super) fn stopped(&self) -> Stopped {
        let read = |path: PathBuf| std::fs::read_to_string(path).unwrap_or_default();
        let field = |text: &str, key: &str| {
            text.lines()
                .filter_map(|l| l.split_once(' '))
                .find(|(k, _)| *k == key)
                .and_then(|(_, v)| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let (pids_dir, memory_dir) = (&self.dirs[0], self.dirs.last().expect("one or two"));
        let processes = field(&read(pids_dir.join("pids.events")), "max") > 0;
        let memory = if self.v2 {
            field(&read(memory_dir.join("memory.events")), "oom_kill") > 0
        } else {
            field(&read(memory_dir.join("memory.oom_control")), "oom_kill") > 0
        };
        Stopped { processes, memory }
    }

    /// Kills every process still in the group.
    fn kill_all(&self) {
        if self.v2
            && let Some(dir) = self.dirs.first()
            && std::fs::write(dir.join("cgroup.kill"), "1").is_ok()
        {
            return;
        }
        for dir in &self.dirs {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
    }

    /// Removes the directories; `false` while a process is still in one (it is exiting).
    fn remove(&self) -> bool {
        self.dirs.iter().all(|d| match std::fs::remove_dir(d) {
            Ok(()) => true,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        })
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill_all();
        if self.remove() {
            return;
        }
        // Killed processes take a moment to leave; the group is removed once they have, off
        // the caller's thread. Whatever is left at the end goes at the next start.
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let dirs = std::mem::take(&mut self.dirs);
        let v2 = self.v2;
        handle.spawn(async move {
            let mut group = Group { dirs, v2 };
            for attempt in 0..40u32 {
                tokio::time::sleep(Duration::from_millis(5 << attempt.min(6))).await;
                group.kill_all();
                if group.remove() {
                    return;
                }
            }
            tracing::warn!(group = ?group.dirs, "a sandboxed command's cgroup is still busy; left for the next start");
            group.dirs.clear();
        });
    }
}

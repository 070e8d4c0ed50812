//! One process per data directory. A data directory holds what one `orc-host` keeps on its
//! machine — the SQLite database, the registry, compiled plugins, the `local` node's roots —
//! and two processes over one would each run every environment's scheduler on it, or deploy to
//! the same local node at once. So `orc-host serve`, and `orc-host deploy` while it runs, hold
//! an exclusive lock (`flock(2)`) on `DATA_DIR/orc-host.pid`, with the process id written
//! inside; another process on the same directory is refused, naming the one that holds it. The kernel drops the lock when the process dies, however
//! it dies: a stale file never blocks a start. Replicas (on PostgreSQL) each have a directory
//! of their own.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read as _, Seek as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// The lock file's name in the data directory.
pub const LOCK_FILE: &str = "orc-host.pid";

/// Why the data directory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error(
        "the data directory {path} is in use by another orc-host{}: a data directory serves one process (replicas on PostgreSQL each need their own)",
        pid.map(|p| format!(" (process {p})")).unwrap_or_default()
    )]
    InUse { path: PathBuf, pid: Option<u32> },
    #[error("cannot lock the data directory's {LOCK_FILE} in {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The held lock; dropping it (or ending the process) lets another process take the directory.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Takes `dir` for this process, or says who has it.
    pub fn acquire(dir: &Path) -> Result<DataDirLock, DataDirError> {
        let io = |source| DataDirError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            // A link planted in its place is not followed (the file is truncated once locked).
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.join(LOCK_FILE))
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(DataDirError::InUse {
                    path: dir.to_path_buf(),
                    pid: text.trim().parse().ok(),
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(DataDirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_naming_the_first_and_the_directory_is_free_once_it_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        let err = DataDirLock::acquire(dir.path()).unwrap_err();
        let DataDirError::InUse { pid, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(*pid, Some(std::process::id()));
        assert!(err.to_string().contains(&format!("(process {})", std::process::id())), "{err}");
        drop(first);
        let _again = DataDirLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn a_link_in_place_of_the_lock_file_is_refused_and_its_target_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        std::fs::write(&target, "keep me").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(LOCK_FILE)).unwrap();
        let err = DataDirLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, DataDirError::Io { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    }
}

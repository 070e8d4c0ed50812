//! Freeing replaced files off the caller's thread.
//!
//! Replacing a file (a new one renamed over it) frees the old file's blocks when its last
//! reference goes, and a file system mounted with `discard` (or without a journal) may wait for
//! the disk right there. Whoever holds the old file open holds that wait: [`Reaper::keep`] takes
//! the open file, so the rename only unlinks, and one background thread closes the files,
//! waiting for the disk in their place. Writes stay atomic and their durability fence unchanged:
//! what is freed is the content that was replaced.

use std::sync::OnceLock;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};

/// Replaced files waiting to be freed, at most: past this the caller frees its own (the open
/// files count against the process's descriptor limit).
const WAITING: usize = 256;

/// The process's one reaper thread.
pub(crate) struct Reaper {
    tx: Option<SyncSender<cap_std::fs::File>>,
}

impl Reaper {
    pub(crate) fn get() -> &'static Reaper {
        static REAPER: OnceLock<Reaper> = OnceLock::new();
        REAPER.get_or_init(|| {
            let (tx, rx) = sync_channel::<cap_std::fs::File>(WAITING);
            let spawned = std::thread::Builder::new().name("orc-reaper".into()).spawn(move || {
                // Each drop closes the last reference to a replaced file: the wait is here.
                while let Ok(file) = rx.recv() {
                    drop(file);
                }
            });
            match spawned {
                Ok(_) => Reaper { tx: Some(tx) },
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the reaper thread; replaced files are freed inline");
                    Reaper { tx: None }
                }
            }
        })
    }

    /// Frees `file` (the last reference to a replaced file) in the background, or here when
    /// the reaper is behind.
    pub(crate) fn keep(&self, file: cap_std::fs::File) {
        match &self.tx {
            Some(tx) => match tx.try_send(file) {
                Ok(()) => {}
                Err(TrySendError::Full(file) | TrySendError::Disconnected(file)) => drop(file),
            },
            None => drop(file),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cap_std::ambient_authority;
    use cap_std::fs::Dir;
    use std::time::{Duration, Instant};

    /// Whether this process still holds a descriptor of `path` (`… (deleted)` once unlinked).
    fn held(path: &std::path::Path) -> bool {
        let shown = format!("{} (deleted)", path.display());
        std::fs::read_dir("/proc/self/fd")
            .expect("/proc/self/fd")
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .any(|target| target.as_os_str() == shown.as_str())
    }

    #[test]
    fn a_kept_file_is_closed_in_the_background() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = Dir::open_ambient_dir(tmp.path(), ambient_authority()).expect("open");
        dir.write("old", b"replaced content").expect("write");
        let file = dir.open("old").expect("open old");
        dir.remove_file("old").expect("unlink");
        let path = tmp.path().join("old");
        assert!(held(&path), "the test holds the unlinked file");
        Reaper::get().keep(file);
        let deadline = Instant::now() + Duration::from_secs(10);
        while held(&path) {
            assert!(Instant::now() < deadline, "the reaper never closed the replaced file");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

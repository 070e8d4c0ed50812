//! Spare files: the local node replaces a file without allocating or freeing an inode.
//!
//! An atomic replace writes a new file and renames it over the old one: one inode allocated,
//! one freed, per file. On ext4 without a journal, allocating skips every inode freed in the
//! last minutes — each one a buffer lookup — so an update of 10,000 files, whose frees land
//! just before its allocations, grows quadratic (measured: three times the CPU of creating the
//! same files on a quiet file system), and a freed file's blocks may wait for the disk
//! (`discard`). So the node keeps the replaced files: before the rename, the old file is
//! hard-linked into a spare directory beside the root (same file system, outside the root, so
//! no plugin or command reaches it); the next replace writes its content into a spare and
//! renames that over its target. In steady state an update allocates and frees nothing.
//!
//! A spare is reused only if it is exactly what a new file would be: a regular file with one
//! link (a file that had another hard link elsewhere is not reused: writing it would change
//! that other name), owned by this process's user and group, with no extended attributes (no
//! ACL or label carried from the file it was). Otherwise it is dropped and a new file is made.
//! Only small files are kept (their old content is at most [`SPARE_BYTES`]), and at most
//! [`CAPACITY`] of them. The directory is emptied when the node opens.

use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use cap_std::fs::{Dir, MetadataExt as _, Permissions, PermissionsExt as _};

use super::handle_options;
use super::reaper::Reaper;

/// Files whose old content is larger are not kept.
pub(crate) const SPARE_BYTES: u64 = 64 << 10;
/// At most this many spares wait (an update keeps about as many as it has writes in flight).
const CAPACITY: usize = 256;

#[derive(Debug)]
pub(crate) struct Spares {
    dir: Dir,
    free: Mutex<Vec<String>>,
    next: AtomicU64,
    uid: u32,
    gid: u32,
}

/// A spare holding new content, ready to be renamed over its target.
pub(crate) struct Filled {
    pub(crate) name: String,
}

impl Spares {
    /// Opens (creating it, mode 0700) and empties the spare directory at `path`; `None` if it
    /// is not on the file system of `root_dev` (a hard link cannot cross file systems).
    pub(crate) fn open(path: &Path, root_dev: u64) -> std::io::Result<Option<Spares>> {
        std::fs::create_dir_all(path)?;
        std::fs::set_permissions(path, <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700))?;
        let dir = Dir::open_ambient_dir(path, cap_std::ambient_authority())?;
        if dir.dir_metadata()?.dev() != root_dev {
            return Ok(None);
        }
        for entry in dir.entries()? {
            let name = entry?.file_name();
            let _ = dir.remove_file(&name);
        }
        Ok(Some(Spares {
            dir,
            free: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        }))
    }

    pub(crate) fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Keeps the file at `rel` under `root` (a regular file of `size` bytes about to be
    /// replaced) as a spare: its name here, or `None` when it is not kept (too large, the pool
    /// full, another file system).
    pub(crate) fn keep(&self, root: &Dir, rel: &Path, size: u64) -> Option<String> {
        if size > SPARE_BYTES || self.free.lock().expect("spares").len() >= CAPACITY {
            return None;
        }
        let name = format!("s{}", self.next.fetch_add(1, Ordering::Relaxed));
        root.hard_link(rel, &self.dir, &name).ok().map(|()| name)
    }

    /// A kept file that is now a spare (the rename replaced its other name).
    pub(crate) fn put(&self, name: String) {
        self.free.lock().expect("spares").push(name);
    }

    /// Forgets a kept name whose rename failed (the file is still at its target).
    pub(crate) fn unkeep(&self, name: &str) {
        let _ = self.dir.remove_file(name);
    }

    /// A spare holding `content` with permission bits `mode`, or `None` when no fit spare is
    /// left (unfit ones are dropped on the way).
    pub(crate) fn fill(&self, content: &[u8], mode: u32) -> Option<Filled> {
        loop {
            let name = self.free.lock().expect("spares").pop()?;
            match self.write(&name, content, mode) {
                Ok(true) => return Some(Filled { name }),
                Ok(false) | Err(_) => self.drop_spare(&name),
            }
        }
    }

    /// Writes into the spare `name` if it is fit (see the module); `Ok(false)` if it is not.
    fn write(&self, name: &str, content: &[u8], mode: u32) -> std::io::Result<bool> {
        let file = self.dir.open_with(name, &handle_options(true))?;
        let meta = file.metadata()?;
        let mut attributes = [0u8; 1];
        let fit = meta.is_file()
            && meta.nlink() == 1
            && meta.uid() == self.uid
            && meta.gid() == self.gid
            && matches!(rustix::fs::flistxattr(&file, &mut attributes[..0]), Ok(0));
        if !fit {
            return Ok(false);
        }
        let mut std_file = file.into_std();
        std_file.write_all_at(content, 0)?;
        std_file.set_len(content.len() as u64)?;
        std_file.flush()?;
        let file = cap_std::fs::File::from_std(std_file);
        file.set_permissions(Permissions::from_mode(mode))?;
        Ok(true)
    }

    /// Takes a spare back after a failed rename: its content does not matter.
    pub(crate) fn put_back(&self, filled: Filled) {
        self.put(filled.name);
    }

    /// Removes a spare that will not be used, its blocks freed by the reaper.
    fn drop_spare(&self, name: &str) {
        let held = self.dir.open(name).ok();
        let _ = self.dir.remove_file(name);
        if let Some(held) = held {
            Reaper::get().keep(held);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    fn node_dirs() -> (tempfile::TempDir, Dir, Spares) {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(tmp.path().join("root")).expect("root");
        let root = Dir::open_ambient_dir(tmp.path().join("root"), cap_std::ambient_authority()).expect("root");
        let dev = root.dir_metadata().expect("stat").dev();
        let spares = Spares::open(&tmp.path().join("spares"), dev).expect("open").expect("same fs");
        (tmp, root, spares)
    }

    #[test]
    fn a_kept_file_becomes_a_spare_written_with_new_content_and_mode() {
        let (tmp, root, spares) = node_dirs();
        root.write("a", b"old content of a").expect("write");
        let inode = std::fs::metadata(tmp.path().join("root/a")).expect("stat").ino();
        let kept = spares.keep(&root, Path::new("a"), 16).expect("kept");
        // What the rename does: `a` is replaced, its old inode lives on as the spare.
        root.remove_file("a").expect("unlink");
        spares.put(kept);
        let filled = spares.fill(b"new", 0o600).expect("a fit spare");
        let path = tmp.path().join("spares").join(&filled.name);
        let meta = std::fs::metadata(&path).expect("stat");
        assert_eq!(meta.ino(), inode, "the old inode is reused");
        assert_eq!(std::fs::read(&path).expect("read"), b"new", "truncated to the new content");
        assert_eq!(meta.mode() & 0o7777, 0o600);
    }

    #[test]
    fn a_file_with_another_hard_link_is_never_written_as_a_spare() {
        let (tmp, root, spares) = node_dirs();
        root.write("a", b"shared content").expect("write");
        root.hard_link("a", &root, "other-name").expect("link");
        let kept = spares.keep(&root, Path::new("a"), 14).expect("kept");
        root.remove_file("a").expect("unlink");
        spares.put(kept);
        assert!(spares.fill(b"new", 0o644).is_none(), "a spare with two links is unfit");
        assert_eq!(
            std::fs::read(tmp.path().join("root/other-name")).expect("read"),
            b"shared content",
            "the other name keeps its content"
        );
        assert_eq!(
            std::fs::read_dir(tmp.path().join("spares")).expect("list").count(),
            0,
            "the unfit spare is dropped"
        );
    }

    #[test]
    fn large_files_are_not_kept_and_the_directory_is_emptied_at_open() {
        let (tmp, root, spares) = node_dirs();
        root.write("big", vec![0u8; SPARE_BYTES as usize + 1]).expect("write");
        assert!(spares.keep(&root, Path::new("big"), SPARE_BYTES + 1).is_none());
        root.write("small", b"x").expect("write");
        assert!(spares.keep(&root, Path::new("small"), 1).is_some());
        let dev = root.dir_metadata().expect("stat").dev();
        drop(spares);
        Spares::open(&tmp.path().join("spares"), dev).expect("reopen").expect("same fs");
        assert_eq!(std::fs::read_dir(tmp.path().join("spares")).expect("list").count(), 0);
    }
}

//! Files over SFTP, with `LocalNode`'s semantics.

use std::os::unix::fs::MetadataExt;

use orc_node::{FileKind, MAX_READ, NodeBackend, NodeErrorKind};

use crate::{connect, path};
use orc_tests::sshd::Sshd;

#[tokio::test]
async fn write_read_stat_mode_mkdir_and_remove() {
    let sshd = Sshd::start();
    let scratch = sshd.scratch_dir("files");
    let node = connect(&sshd).await;
    let file = path(&scratch, "motd");

    assert_eq!(node.read_file(&file).await.unwrap(), None);
    assert_eq!(node.stat(&file).await.unwrap(), None);
    node.write_file(&file, b"hello".to_vec(), Some(0o600)).await.unwrap();
    assert_eq!(node.read_file(&file).await.unwrap().unwrap(), b"hello");
    let st = node.stat(&file).await.unwrap().unwrap();
    let local = std::fs::metadata(&file).unwrap();
    assert_eq!((st.kind, st.size, st.mode), (FileKind::File, 5, 0o600));
    assert_eq!((st.uid, st.gid), (local.uid(), local.gid()));
    assert_eq!(st.mtime_ms, local.mtime() * 1000);
    // Rewriting keeps the mode when none is given; an empty file is a file.
    node.write_file(&file, Vec::new(), None).await.unwrap();
    assert_eq!(node.stat(&file).await.unwrap().unwrap().mode, 0o600);
    assert_eq!(node.read_file(&file).await.unwrap().unwrap(), b"");
    node.set_mode(&file, 0o644).await.unwrap();
    assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o7777, 0o644);
    // New files default to 0644 whatever the umask.
    let fresh = path(&scratch, "fresh");
    node.write_file(&fresh, b"x".to_vec(), None).await.unwrap();
    assert_eq!(node.stat(&fresh).await.unwrap().unwrap().mode, 0o644);

    // Directories: -p creates ancestors, mode applied, existing is fine, a file in the way is not.
    let deep = path(&scratch, "a/b/c");
    let err = node.create_dir(&deep, None, false).await.unwrap_err();
    assert_eq!(err.kind, NodeErrorKind::InvalidInput, "{err}");
    assert!(err.message.contains("does not exist"), "{err}");
    node.create_dir(&deep, Some(0o750), true).await.unwrap();
    node.create_dir(&deep, Some(0o750), true).await.unwrap();
    let st = node.stat(&deep).await.unwrap().unwrap();
    assert_eq!((st.kind, st.mode), (FileKind::Directory, 0o750));
    let err = node.create_dir(&file, None, false).await.unwrap_err();
    assert!(err.message.contains("not a directory"), "{err}");
    let err = node.create_dir(&format!("{file}/sub"), None, true).await.unwrap_err();
    assert_eq!(err.kind, NodeErrorKind::InvalidInput, "{err}");
    node.create_dir(&path(&scratch, "single"), None, false).await.unwrap();

    // Reading or writing a directory, a missing parent, relative paths.
    let err = node.read_file(&deep).await.unwrap_err();
    assert!(err.message.contains("is a directory"), "{err}");
    let err = node.write_file(&deep, b"x".to_vec(), None).await.unwrap_err();
    assert!(err.message.contains("is a directory"), "{err}");
    let missing_parent = path(&scratch, "nope/file");
    let err = node.write_file(&missing_parent, b"x".to_vec(), None).await.unwrap_err();
    assert!(err.message.contains("does not exist"), "{err}");
    let err = node.read_file("etc/motd").await.unwrap_err();
    assert!(err.message.contains("not absolute"), "{err}");
    let err = node.set_mode(&path(&scratch, "missing"), 0o600).await.unwrap_err();
    assert_eq!(err.kind, NodeErrorKind::InvalidInput, "{err}");

    // Symlinks are reported as such by stat (lstat), read through.
    std::os::unix::fs::symlink(&file, scratch.join("link")).unwrap();
    assert_eq!(node.stat(&path(&scratch, "link")).await.unwrap().unwrap().kind, FileKind::Symlink);
    assert_eq!(node.read_file(&path(&scratch, "link")).await.unwrap().unwrap(), b"");

    // Permission denied is Denied.
    let err = node.write_file("/root/orc-denied", b"x".to_vec(), None).await.unwrap_err();
    assert_eq!(err.kind, NodeErrorKind::Denied, "{err}");

    // Remove: whether something was removed; a non-empty directory needs `recursive`.
    node.write_file(&path(&scratch, "a/b/c/f"), b"x".to_vec(), None).await.unwrap();
    assert!(node.remove(&file, false).await.unwrap());
    assert!(!node.remove(&file, false).await.unwrap());
    assert!(node.remove(&path(&scratch, "single"), false).await.unwrap());
    assert!(node.remove(&path(&scratch, "a"), false).await.is_err());
    assert!(node.remove(&path(&scratch, "a"), true).await.unwrap());
    assert!(!scratch.join("a").exists());
    assert!(node.remove("/", true).await.is_err());
    // No temporary files are left behind.
    let left: Vec<_> = std::fs::read_dir(&scratch).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().contains("orc-tmp")), "{left:?}");
}

/// A reader never sees a half-written file while another task keeps replacing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwriting_is_atomic() {
    let sshd = Sshd::start();
    let scratch = sshd.scratch_dir("atomic");
    let node = connect(&sshd).await;
    let file = path(&scratch, "config");
    let a = vec![b'a'; 300 << 10];
    let b = vec![b'b'; 700 << 10];
    node.write_file(&file, a.clone(), None).await.unwrap();
    let writer = {
        let (node, file, a, b) = (node.clone(), file.clone(), a.clone(), b.clone());
        tokio::spawn(async move {
            for i in 0..30 {
                let content = if i % 2 == 0 { b.clone() } else { a.clone() };
                node.write_file(&file, content, Some(0o640)).await.unwrap();
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() {
        // Read on the node's own filesystem too: the rename is what makes it atomic.
        let local = std::fs::read(&file).unwrap();
        let remote = node.read_file(&file).await.unwrap().unwrap();
        for got in [local, remote] {
            assert!(got == a || got == b, "torn read of {} bytes", got.len());
        }
        reads += 1;
    }
    writer.await.unwrap();
    assert!(reads > 2, "only {reads} reads");
    let left = std::fs::read_dir(&scratch).unwrap().count();
    assert_eq!(left, 1, "temporary files left behind");
}

/// A file at the read cap round trips; a larger one is written, and refused when read.
#[tokio::test]
async fn a_file_at_the_read_cap_round_trips_and_a_larger_one_is_written_but_not_read() {
    let sshd = Sshd::start();
    let scratch = sshd.scratch_dir("large");
    let node = connect(&sshd).await;
    let file = path(&scratch, "large.bin");
    let pattern = |len: u64| -> Vec<u8> { (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect() };
    let content = pattern(MAX_READ);
    node.write_file(&file, content.clone(), Some(0o600)).await.unwrap();
    assert!(std::fs::read(&file).unwrap() == content, "bytes on disk differ");
    assert_eq!(node.stat(&file).await.unwrap().unwrap().size, content.len() as u64);
    let back = node.read_file(&file).await.unwrap().unwrap();
    assert_eq!(back.len(), content.len());
    assert!(back == content, "bytes read back differ");
    let larger = pattern(20 << 20);
    node.write_file(&file, larger.clone(), None).await.unwrap();
    assert!(std::fs::read(&file).unwrap() == larger, "bytes on disk differ");
    let Err(err) = node.read_file(&file).await else {
        panic!("a file past the read cap was read");
    };
    assert_eq!(err.kind, NodeErrorKind::TooLarge, "{err}");
}

/// A file past the read cap is refused from the size the node reports, before anything is read
/// or reserved: a 64 GiB sparse file aborted the host (the reply buffer reserved its size).
#[tokio::test]
async fn a_file_past_the_read_cap_is_refused_before_it_is_read() {
    let sshd = Sshd::start();
    let scratch = sshd.scratch_dir("huge");
    let node = connect(&sshd).await;
    std::fs::File::create(scratch.join("huge")).unwrap().set_len(64 << 30).unwrap();
    std::os::unix::fs::symlink("huge", scratch.join("link")).unwrap();
    for name in ["huge", "link"] {
        let file = path(&scratch, name);
        let err = tokio::time::timeout(std::time::Duration::from_secs(20), node.read_file(&file))
            .await
            .expect("the read of a huge file was not refused at once")
            .unwrap_err();
        assert_eq!(err.kind, NodeErrorKind::TooLarge, "{err}");
        assert!(err.message.contains(&format!("{file} is 68719476736 bytes")), "{err}");
        assert!(err.message.contains(&MAX_READ.to_string()), "{err}");
    }
}

/// A FIFO, a socket or a device is refused by its type before it is opened: OpenSSH's
/// sftp-server blocks opening a FIFO (and with it the whole session) until a writer comes.
#[tokio::test]
async fn special_files_are_refused_before_they_block() {
    let sshd = Sshd::start();
    let scratch = sshd.scratch_dir("special");
    let node = connect(&sshd).await;
    let fifo = scratch.join("fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    std::os::unix::fs::symlink("fifo", scratch.join("to-fifo")).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(scratch.join("socket")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", scratch.join("to-zero")).unwrap();
    for (file, kind) in [
        (path(&scratch, "fifo"), "FIFO"),
        (path(&scratch, "to-fifo"), "FIFO"),
        (path(&scratch, "socket"), "socket"),
        ("/dev/null".to_string(), "character device"),
        (path(&scratch, "to-zero"), "character device"),
    ] {
        let err = tokio::time::timeout(std::time::Duration::from_secs(5), node.read_file(&file))
            .await
            .unwrap_or_else(|_| panic!("reading {file} blocked"))
            .unwrap_err();
        assert_eq!(err.kind, NodeErrorKind::InvalidInput, "{file}: {err}");
        assert!(err.message.contains(&format!("{file}: it is a {kind}")), "{file}: {err}");
    }
    // The session still serves.
    node.write_file(&path(&scratch, "after"), b"x".to_vec(), None).await.unwrap();
    assert_eq!(node.read_file(&path(&scratch, "after")).await.unwrap().unwrap(), b"x");
    assert_eq!(node.connections_made(), 1);
}

#[tokio::test]
async fn symlinks_and_owners() {
    let sshd = Sshd::start();
    let scratch = sshd.scratch_dir("links");
    let node = connect(&sshd).await;
    let file = path(&scratch, "motd");
    let link = path(&scratch, "link");
    node.write_file(&file, b"hi".to_vec(), None).await.unwrap();

    assert_eq!(node.read_link(&link).await.unwrap(), None);
    // The target is stored as given: OpenSSH's reversed SYMLINK arguments are handled.
    node.create_symlink("motd", &link).await.unwrap();
    assert_eq!(std::fs::read_link(&link).unwrap(), std::path::Path::new("motd"));
    assert_eq!(node.read_link(&link).await.unwrap().as_deref(), Some("motd"));
    assert_eq!(node.stat(&link).await.unwrap().unwrap().kind, FileKind::Symlink);
    assert_eq!(node.read_file(&link).await.unwrap().unwrap(), b"hi");
    node.create_symlink(&file, &link).await.unwrap();
    assert_eq!(std::fs::read_link(&link).unwrap(), std::path::Path::new(&file));
    let entries = std::fs::read_dir(&scratch).unwrap().count();
    assert_eq!(entries, 2, "no temporary link left behind");
    let err = node.create_symlink("x", &file).await.unwrap_err();
    assert_eq!(err.kind, NodeErrorKind::InvalidInput);
    assert!(err.message.contains("exists and is a file"), "{err}");
    let err = node.read_link(&file).await.unwrap_err();
    assert!(err.message.contains("is a file, not a symlink"), "{err}");
    let err = node.create_symlink("x", &path(&scratch, "nope/l")).await.unwrap_err();
    assert!(err.message.contains("does not exist"), "{err}");
    assert!(node.remove(&link, false).await.unwrap());
    assert!(std::fs::metadata(&file).is_ok(), "removing the link left its target");

    // Owners: names from the node; the test user may set its own user and group.
    let me = std::fs::metadata(&file).unwrap();
    let owner = node.owner(&file).await.unwrap().unwrap();
    assert_eq!((owner.uid, owner.gid), (me.uid(), me.gid()));
    assert_eq!(owner.user.as_deref(), Some(orc_tests::sshd::TEST_USER));
    assert_eq!(node.owner(&path(&scratch, "missing")).await.unwrap(), None);
    node.set_owner(&file, Some(orc_tests::sshd::TEST_USER), owner.group.as_deref())
        .await
        .unwrap();
    let err = node.set_owner(&file, Some("root"), None).await.unwrap_err();
    assert_eq!(err.kind, NodeErrorKind::Denied, "{err}");
    let err = node.set_owner(&file, Some("no-such-user-orc"), None).await.unwrap_err();
    assert_eq!(err.kind, NodeErrorKind::InvalidInput, "{err}");
    assert!(err.message.contains("no-such-user-orc"), "{err}");
    let err = node.set_owner(&file, Some("x y"), None).await.unwrap_err();
    assert!(err.message.contains("not a valid name"), "{err}");

    // As root, ownership really changes, by name and by id.
    let (root, _) = orc_ssh::SshNode::connect(
        crate::target(&sshd, "root", orc_ssh::HostKeyPolicy::Pinned(sshd.host_fingerprint.clone())),
        crate::options(),
    )
    .await
    .unwrap();
    root.set_owner(&file, Some("root"), Some("65534")).await.unwrap();
    let m = std::fs::metadata(&file).unwrap();
    assert_eq!((m.uid(), m.gid()), (0, 65534));
    let owner = root.owner(&file).await.unwrap().unwrap();
    assert_eq!(owner.user.as_deref(), Some("root"));
    assert!(owner.group.is_some(), "{owner:?}");
}

/// The durability fence: writes are not synced one by one; `durable` syncs the file systems of
/// the directories changed since the last fence with one `sync -f` (falling back to `sync` when
/// one of them is gone), and with nothing changed it has nothing to do: it does not ask the
/// node, and does not count as the node answering ([`orc_ssh::SshNode::answers`]).
#[tokio::test]
async fn the_durability_fence_syncs_what_changed_since_the_last_one() {
    let sshd = Sshd::start();
    let scratch = sshd.scratch_dir("fence");
    let node = connect(&sshd).await;
    node.durable().await.unwrap();
    assert_eq!(node.answers(), 0);
    for dir in ["a", "b"] {
        node.create_dir(&path(&scratch, dir), None, false).await.unwrap();
        node.write_file(&path(&scratch, &format!("{dir}/f")), b"x".to_vec(), None)
            .await
            .unwrap();
    }
    let before = node.answers();
    assert!(before >= 4, "{before}");
    node.durable().await.unwrap();
    assert_eq!(node.answers(), before + 1, "the sync ran on the node");
    node.durable().await.unwrap();
    assert_eq!(node.answers(), before + 1, "nothing to sync: the node was not asked");
    // A refusal is an answer too; a call refused before it is sent is not.
    let err = node.read_file(&path(&scratch, "a")).await.unwrap_err();
    assert_eq!(err.kind, NodeErrorKind::InvalidInput, "{err}");
    assert_eq!(node.answers(), before + 2);
    node.set_owner(&path(&scratch, "a"), None, None).await.unwrap();
    assert_eq!(node.answers(), before + 2);
    // A directory changed and then removed: `sync -f` cannot open it, `sync` covers it.
    node.write_file(&path(&scratch, "b/g"), b"y".to_vec(), None).await.unwrap();
    node.remove(&path(&scratch, "b"), true).await.unwrap();
    node.durable().await.unwrap();
    assert_eq!(std::fs::read(path(&scratch, "a/f")).unwrap(), b"x");
}

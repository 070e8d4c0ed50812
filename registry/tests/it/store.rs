//! The store on a real directory: publishing, immutability, tampering, hostile names and sizes.

use std::path::Path;

use orc_registry::{BlobSource, Digest, Registry, RegistryError, Store, StoreOptions, parse_digest};

use crate::{EMPTY_COMPONENT, file_names, plugin, raw_plugin};

fn open(root: &Path) -> Store {
    Store::open(root, StoreOptions::default()).unwrap()
}

fn blob_files(root: &Path) -> Vec<String> {
    file_names(&root.join("blobs/sha256"))
}

#[test]
fn publish_then_resolve_versions_and_list() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(&tmp.path().join("reg"));
    let file1 = plugin("file", "0.1.0", "files");
    let file2 = plugin("file", "0.10.0", "files, later");
    let file_pre = plugin("file", "0.10.0-rc.1", "files, candidate");
    let dir = plugin("directory", "1.0.0", "dirs");
    for bytes in [&file2, &file1, &dir, &file_pre] {
        assert!(store.publish(bytes).unwrap().created);
    }

    let entry = store.resolve("file", "0.1.0").unwrap();
    assert_eq!(entry.digest, Digest::of(&file1));
    assert_eq!(entry.size, file1.len() as u64);
    assert_eq!(entry.description, "files");
    assert_eq!(entry.resource_types, ["file"]);
    assert_eq!(store.get_blob(&entry.digest).unwrap(), file1);

    let versions: Vec<String> = store.versions("file").unwrap().into_iter().map(|e| e.version).collect();
    assert_eq!(versions, ["0.1.0", "0.10.0-rc.1", "0.10.0"]);
    let all: Vec<String> = store.list().unwrap().iter().map(|e| e.reference()).collect();
    assert_eq!(all, ["directory@1.0.0", "file@0.1.0", "file@0.10.0-rc.1", "file@0.10.0"]);

    // The entry survives a reopen, published_at and all.
    let again = open(&tmp.path().join("reg"));
    assert_eq!(again.resolve("file", "0.1.0").unwrap(), entry);

    assert!(matches!(store.resolve("file", "9.9.9"), Err(RegistryError::NotFound { .. })));
    let err = store.versions("nothing").unwrap_err();
    assert_eq!(err.code(), "not_found");
    assert!(err.to_string().contains("nothing"), "{err}");
}

#[test]
fn identical_publish_is_a_noop() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("reg");
    let store = open(&root);
    let bytes = plugin("file", "0.1.0", "files");
    let first = store.publish(&bytes).unwrap();
    let second = store.publish(&bytes).unwrap();
    assert!(first.created);
    assert!(!second.created);
    assert_eq!(first.entry, second.entry, "the original entry, published_at included, is kept");
    assert_eq!(blob_files(&root), [Digest::of(&bytes).hex()]);
    assert_eq!(store.put_blob(&bytes).unwrap(), (Digest::of(&bytes), false));
    assert!(file_names(&root.join("tmp")).is_empty(), "no temporary file is left behind");
}

#[test]
fn a_version_cannot_be_repointed_to_other_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("reg");
    let store = open(&root);
    let original = plugin("file", "0.1.0", "files");
    let impostor = plugin("file", "0.1.0", "files, but different");
    store.publish(&original).unwrap();

    let err = store.publish(&impostor).unwrap_err();
    let message = err.to_string();
    match &err {
        RegistryError::VersionTaken {
            name,
            version,
            existing,
            attempted,
        } => {
            assert_eq!((name.as_str(), version.as_str()), ("file", "0.1.0"));
            assert_eq!(*existing, Digest::of(&original));
            assert_eq!(*attempted, Digest::of(&impostor));
        }
        other => panic!("expected VersionTaken, got {other:?}"),
    }
    assert_eq!(err.code(), "version_taken");
    for part in ["file@0.1.0", &Digest::of(&original).to_string(), &Digest::of(&impostor).to_string()] {
        assert!(message.contains(part), "{message} should name {part}");
    }
    assert_eq!(store.resolve("file", "0.1.0").unwrap().digest, Digest::of(&original));
    assert_eq!(blob_files(&root), [Digest::of(&original).hex()], "the refused bytes are not stored");
}

#[test]
fn racing_publishes_of_one_version_have_exactly_one_winner() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(&tmp.path().join("reg"));
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let store = store.clone();
                s.spawn(move || store.publish(&plugin("race", "1.0.0", &format!("contender {i}"))))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    assert!(winners[0].created);
    for r in &results {
        if let Err(e) = r {
            assert_eq!(e.code(), "version_taken", "{e}");
        }
    }
    assert_eq!(store.resolve("race", "1.0.0").unwrap().digest, winners[0].entry.digest);
}

#[tokio::test]
async fn a_tampered_blob_is_refused_on_read_and_repaired_by_a_good_upload() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("reg");
    let store = open(&root);
    let bytes = plugin("file", "0.1.0", "files");
    let digest = store.publish(&bytes).unwrap().entry.digest;

    let path = root.join("blobs/sha256").join(digest.hex());
    let mut tampered = std::fs::read(&path).unwrap();
    *tampered.last_mut().unwrap() ^= 0xff;
    std::fs::write(&path, &tampered).unwrap();

    let err = store.get_blob(&digest).unwrap_err();
    assert!(
        matches!(err, RegistryError::Corrupt { digest: d, actual } if d == digest && actual == Digest::of(&tampered)),
        "{err:?}"
    );
    assert_eq!(err.code(), "blob_corrupt");
    assert!(err.to_string().contains(&digest.to_string()), "{err}");
    // The runtime's path refuses it too.
    let err = BlobSource::fetch(&store, &digest).await.unwrap_err();
    assert_eq!(err.code(), "blob_corrupt");
    // Re-publishing is still a no-op for the index, and a verified upload replaces the bad copy.
    assert_eq!(store.put_blob(&bytes).unwrap(), (digest, true));
    assert_eq!(store.get_blob(&digest).unwrap(), bytes);
}

#[test]
fn path_escaping_names_are_refused_and_nothing_lands_outside_the_root() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("reg");
    let store = open(&root);
    store.publish(&plugin("file", "0.1.0", "files")).unwrap();

    for name in ["../evil", "a/b", "/abs", "..", ".", "", "nul\0byte", "file/../../evil", "UPPER"] {
        let err = store.resolve(name, "0.1.0").unwrap_err();
        assert!(matches!(err, RegistryError::InvalidName(_)), "{name:?}: {err:?}");
        assert_eq!(err.code(), "invalid_name");
        let err = store.versions(name).unwrap_err();
        assert!(matches!(err, RegistryError::InvalidName(_)), "{name:?}: {err:?}");
    }
    for version in ["../../0.1.0", "0.1.0/../x", "/etc/passwd", "0.1.0\0", "..", "1.0"] {
        let err = store.resolve("file", version).unwrap_err();
        assert!(matches!(err, RegistryError::InvalidName(_)), "{version:?}: {err:?}");
    }
    // A hostile manifest is refused before its name becomes a path.
    for (name, version) in [("../evil", "1.0.0"), ("a/b", "1.0.0"), ("/abs", "1.0.0"), ("ok", "1.0.0/../../x")] {
        let json = serde_json::json!({
            "name": name, "version": version, "kind": "adaptor", "world": "orc:plugin/adaptor@0.1.0",
        });
        let err = store.publish(&raw_plugin(&json.to_string())).unwrap_err();
        assert_eq!(err.code(), "invalid_plugin", "{err}");
        assert!(err.to_string().contains(name) || err.to_string().contains(version), "{err}");
    }
    assert_eq!(file_names(tmp.path()), ["reg"], "nothing written beside the root");
    assert_eq!(file_names(&root.join("index")), ["file"]);
    assert_eq!(blob_files(&root).len(), 1);
}

#[test]
fn malformed_digests_are_refused() {
    for bad in [
        "",
        "sha256:",
        "sha256:../../etc/passwd",
        "md5:abcd",
        &format!("sha256:{}", "A".repeat(64)),
        &"0".repeat(64),
    ] {
        let err = parse_digest(bad).unwrap_err();
        assert_eq!(err.code(), "invalid_digest", "{bad}");
        assert!(err.to_string().contains("is not a digest"), "{err}");
    }
    let d = Digest::of(b"x");
    assert_eq!(parse_digest(&d.to_string()).unwrap(), d);
}

#[test]
fn an_oversized_blob_is_refused_and_the_store_is_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("reg");
    let store = Store::open(&root, StoreOptions { max_blob_size: 1024 }).unwrap();
    let small = plugin("file", "0.1.0", "small");
    store.publish(&small).unwrap();
    let big = plugin("file", "0.2.0", &"x".repeat(2000));

    let err = store.publish(&big).unwrap_err();
    assert!(
        matches!(err, RegistryError::TooLarge { size, limit: 1024 } if size == big.len() as u64),
        "{err:?}"
    );
    assert_eq!(err.code(), "too_large");
    assert_eq!(store.put_blob(&big).unwrap_err().code(), "too_large");
    assert_eq!(store.put_blob_expecting(&big, &Digest::of(&big)).unwrap_err().code(), "too_large");

    assert_eq!(blob_files(&root), [Digest::of(&small).hex()]);
    assert!(file_names(&root.join("tmp")).is_empty());
    assert_eq!(store.list().unwrap().len(), 1);
}

#[test]
fn things_that_are_not_plugins_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("reg");
    let store = open(&root);
    let cases: [(&[u8], &str); 5] = [
        (b"hello, world", "not a WebAssembly component"),
        (b"\0asm\x01\x00\x00\x00", "core module"),
        (EMPTY_COMPONENT, "no `orc:manifest` manifest section"),
        (&raw_plugin("{not json"), "not valid JSON"),
        (
            &raw_plugin(r#"{"name":"x","version":"1.0.0","kind":"solver","world":"orc:plugin/solver@0.1.0","capabilities":["node"]}"#),
            "may not request",
        ),
    ];
    for (bytes, expected) in cases {
        let err = store.publish(bytes).unwrap_err();
        assert!(matches!(err, RegistryError::InvalidPlugin(_)), "{err:?}");
        assert!(err.to_string().contains(expected), "`{err}` should contain `{expected}`");
    }
    assert!(blob_files(&root).is_empty());
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn leftover_temporary_files_do_not_confuse_the_index() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("reg");
    let store = open(&root);
    let bytes = plugin("file", "0.1.0", "files");
    store.publish(&bytes).unwrap();
    // What a crash or a careless operator leaves behind.
    std::fs::write(root.join("tmp/1234-0-99"), b"{\"half\":").unwrap();
    std::fs::write(root.join("index/file/0.2.0.json.tmp"), b"{\"half\":").unwrap();
    std::fs::write(root.join("index/file/notes.txt"), b"hello").unwrap();
    std::fs::write(root.join("index/file/garbage.json"), b"{").unwrap();
    std::fs::create_dir_all(root.join("index/.hidden")).unwrap();
    std::fs::write(root.join("index/README"), b"hi").unwrap();

    let reopened = open(&root);
    let all: Vec<String> = reopened.list().unwrap().iter().map(|e| e.reference()).collect();
    assert_eq!(all, ["file@0.1.0"]);
    assert!(matches!(reopened.resolve("file", "0.2.0"), Err(RegistryError::NotFound { .. })));
    // A recent temporary file may be another writer's: it is left alone, and publishing still works.
    assert!(root.join("tmp/1234-0-99").exists());
    assert!(reopened.publish(&plugin("file", "0.2.0", "files")).unwrap().created);
}

#[test]
fn a_corrupt_index_entry_is_reported_not_panicked_on() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("reg");
    let store = open(&root);
    store.publish(&plugin("file", "0.1.0", "files")).unwrap();
    std::fs::write(root.join("index/file/0.1.0.json"), b"{\"name\": \"file\", \"vers").unwrap();

    let err = store.resolve("file", "0.1.0").unwrap_err();
    assert_eq!(err.code(), "index_corrupt");
    assert!(err.to_string().contains("index/file/0.1.0.json"), "{err}");
    assert_eq!(store.list().unwrap_err().code(), "index_corrupt");
    // Nor may a corrupt entry be papered over by a new publish.
    assert_eq!(
        store.publish(&plugin("file", "0.1.0", "files")).unwrap_err().code(),
        "index_corrupt"
    );

    // An entry filed under the wrong name is corrupt too.
    let mut entry: serde_json::Value = serde_json::to_value(store.publish(&plugin("other", "1.0.0", "o")).unwrap().entry).unwrap();
    entry["version"] = "2.0.0".into();
    std::fs::write(root.join("index/other/1.0.0.json"), entry.to_string()).unwrap();
    let err = store.resolve("other", "1.0.0").unwrap_err();
    assert!(err.to_string().contains("other@2.0.0"), "{err}");
}

#[tokio::test]
async fn registry_open_on_a_directory_is_a_local_store() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("new/registry");
    let registry = Registry::open(root.to_str().unwrap()).unwrap();
    assert!(matches!(registry, Registry::Local(_)));
    assert!(root.join("blobs/sha256").is_dir());

    let bytes = plugin("file", "0.1.0", "files");
    let published = registry.publish(bytes.clone()).await.unwrap();
    assert!(published.created);
    assert_eq!(registry.fetch(&published.entry.digest).await.unwrap(), bytes);
    assert_eq!(registry.resolve("file", "0.1.0").await.unwrap(), published.entry);
    assert_eq!(registry.versions("file").await.unwrap().len(), 1);
    assert_eq!(registry.list().await.unwrap().len(), 1);
    let unknown = Digest::of(b"nope");
    let err = registry.fetch(&unknown).await.unwrap_err();
    assert!(matches!(err, RegistryError::UnknownDigest(d) if d == unknown));
    assert!(err.to_string().contains(&unknown.to_string()));
    assert_eq!(Registry::open("").unwrap_err().code(), "unsupported");
    let same = Registry::open(&format!("file://{}", root.display())).unwrap();
    assert_eq!(same.list().await.unwrap().len(), 1);
}

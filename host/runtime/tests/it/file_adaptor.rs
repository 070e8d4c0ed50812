//! The `file` and `directory` adaptors on a real local node: read, diff, apply, idempotence,
//! drift repaired, purge.

use std::os::unix::fs::PermissionsExt;

use orc_manifest::Capability;
use orc_plugin_artifacts::{DIRECTORY, FILE};
use orc_runtime::Grants;
use serde_json::json;

use crate::{load, local_context, runtime, target};

#[tokio::test]
async fn file_converges_is_idempotent_and_repairs_drift() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = local_context(dir.path());
    let rt = runtime();
    let file = load(&rt, &FILE, &Grants::none().with(Capability::NodeFiles));
    let directory = load(&rt, &DIRECTORY, &Grants::none().with(Capability::NodeFiles));

    // The parent directory first, through the directory adaptor.
    let etc = target("directory", "/etc", json!({"mode": "0750"}));
    let mut a = directory.adaptor(&ctx).await.unwrap();
    let current = a.read(&etc).await.unwrap();
    assert_eq!(current, None);
    let changes = a.diff(&etc, None).await.unwrap();
    assert!(!changes.is_empty());
    a.apply(&etc, None, &changes).await.unwrap();
    assert_eq!(
        std::fs::metadata(dir.path().join("etc")).unwrap().permissions().mode() & 0o7777,
        0o750
    );

    let motd = target("file", "/etc/motd", json!({"content": "hello\n", "mode": "0640"}));
    let mut a = file.adaptor(&ctx).await.unwrap();
    assert_eq!(a.read(&motd).await.unwrap(), None);
    let changes = a.diff(&motd, None).await.unwrap();
    let fields: Vec<&str> = changes.iter().map(|c| c.field.as_str()).collect();
    assert!(fields.contains(&"content") && fields.contains(&"mode"), "{fields:?}");
    a.apply(&motd, None, &changes).await.unwrap();
    let path = dir.path().join("etc/motd");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "hello\n");
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777, 0o640);

    // Second run: nothing to do.
    let mut a = file.adaptor(&ctx).await.unwrap();
    let current = a.read(&motd).await.unwrap();
    assert!(current.is_some());
    assert_eq!(a.diff(&motd, current.as_deref()).await.unwrap(), vec![], "idempotent");

    // Drift made by hand is detected precisely and repaired.
    std::fs::write(&path, "tampered\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut a = file.adaptor(&ctx).await.unwrap();
    let current = a.read(&motd).await.unwrap();
    let changes = a.diff(&motd, current.as_deref()).await.unwrap();
    let content = changes.iter().find(|c| c.field == "content").expect("content drift");
    assert_eq!(content.current, Some(json!("tampered\n")));
    assert_eq!(content.desired, Some(json!("hello\n")));
    let mode = changes.iter().find(|c| c.field == "mode").expect("mode drift");
    assert_eq!(
        (mode.current.clone(), mode.desired.clone()),
        (Some(json!("0666")), Some(json!("0640")))
    );
    a.apply(&motd, current.as_deref(), &changes).await.unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "hello\n");
    let mut a = file.adaptor(&ctx).await.unwrap();
    let current = a.read(&motd).await.unwrap();
    assert_eq!(a.diff(&motd, current.as_deref()).await.unwrap(), vec![]);

    // Purge removes the file.
    let mut a = file.adaptor(&ctx).await.unwrap();
    a.delete(&motd, current.as_deref().unwrap()).await.unwrap();
    assert!(!path.exists());
}

#[tokio::test]
async fn bad_attributes_and_bad_paths_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = local_context(dir.path());
    let rt = runtime();
    let file = load(&rt, &FILE, &Grants::none().with(Capability::NodeFiles));

    let bad = target("file", "/motd", json!({"content": "x", "mood": "0644"}));
    let err = file.adaptor(&ctx).await.unwrap().read(&bad).await.unwrap_err();
    assert!(
        err.to_string().contains("file[local,/motd]") && err.to_string().contains("mood"),
        "{err}"
    );

    let escape = target("file", "/../outside", json!({"content": "x"}));
    let mut a = file.adaptor(&ctx).await.unwrap();
    let changes = a.diff(&escape, None).await.unwrap();
    let err = a.apply(&escape, None, &changes).await.unwrap_err();
    assert!(err.to_string().contains("outside the node's root"), "{err}");
    assert!(!dir.path().parent().unwrap().join("outside").exists());

    let missing_parent = target("file", "/no/such/dir/file", json!({"content": "x"}));
    let mut a = file.adaptor(&ctx).await.unwrap();
    let changes = a.diff(&missing_parent, None).await.unwrap();
    let err = a.apply(&missing_parent, None, &changes).await.unwrap_err();
    assert!(err.to_string().contains("parent directory /no/such/dir does not exist"), "{err}");
}

//! The `symlink`, `command` and `process` adaptors on the local node: links stay inside the
//! node's root; commands (and so processes, which work through commands only, as on every
//! backend) run confined, seeing the root at its host path and nothing else of the host's.

use orc_manifest::Capability;
use orc_plugin_artifacts::{COMMAND, PROCESS, SYMLINK};
use orc_runtime::Grants;
use serde_json::json;

use crate::{load, local_context, runtime, target};

#[tokio::test]
async fn symlinks_on_the_local_node_live_under_its_root() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = local_context(dir.path());
    let rt = runtime();
    let symlink = load(&rt, &SYMLINK, &Grants::none().with(Capability::NodeFiles));
    std::fs::write(dir.path().join("motd"), "hi").unwrap();
    let link = target("symlink", "/link", json!({"target": "/motd"}));
    let mut a = symlink.adaptor(&ctx).await.unwrap();
    assert_eq!(a.read(&link).await.unwrap(), None);
    let changes = a.diff(&link, None).await.unwrap();
    a.apply(&link, None, &changes).await.unwrap();
    assert_eq!(std::fs::read_link(dir.path().join("link")).unwrap(), std::path::Path::new("/motd"));
    let mut a = symlink.adaptor(&ctx).await.unwrap();
    let current = a.read(&link).await.unwrap();
    assert_eq!(a.diff(&link, current.as_deref()).await.unwrap(), vec![]);
    a.delete(&link, current.as_deref().unwrap()).await.unwrap();
    assert!(std::fs::symlink_metadata(dir.path().join("link")).is_err());
    assert!(dir.path().join("motd").exists());
}

#[tokio::test]
async fn commands_see_the_root_at_its_host_path_and_nothing_else_of_the_host() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let ctx = local_context(root.path());
    let rt = runtime();
    let command = load(&rt, &COMMAND, &Grants::none().with(Capability::NodeCommands));
    let process = load(&rt, &PROCESS, &Grants::none().with(Capability::NodeCommands));

    // Inside the root, at its host path: the command works there, as it would on the host.
    let marker = root.path().join("marker");
    let cmd = target(
        "command",
        "mark",
        json!({"argv": ["touch", marker.to_str().unwrap()], "creates": marker.to_str().unwrap()}),
    );
    let mut a = command.adaptor(&ctx).await.unwrap();
    let current = a.read(&cmd).await.unwrap();
    let changes = a.diff(&cmd, current.as_deref()).await.unwrap();
    assert_eq!(changes.len(), 1);
    a.apply(&cmd, current.as_deref(), &changes).await.unwrap();
    assert!(marker.exists(), "the root's host path");
    let mut a = command.adaptor(&ctx).await.unwrap();
    let current = a.read(&cmd).await.unwrap();
    assert_eq!(a.diff(&cmd, current.as_deref()).await.unwrap(), vec![]);

    // Outside the root: not there for the command, and nothing is made.
    let escaped = outside.path().join("marker");
    let cmd = target(
        "command",
        "escape",
        json!({"argv": ["touch", escaped.to_str().unwrap()], "creates": escaped.to_str().unwrap()}),
    );
    let mut a = command.adaptor(&ctx).await.unwrap();
    let current = a.read(&cmd).await.unwrap();
    let changes = a.diff(&cmd, current.as_deref()).await.unwrap();
    let err = a.apply(&cmd, current.as_deref(), &changes).await.unwrap_err();
    assert!(err.to_string().contains("No such file or directory"), "{err}");
    assert!(!escaped.exists());

    // A process started on the local node ends with the command that started it: the adaptor's
    // start succeeds (the process runs while its script does), and the next read finds it
    // stopped, so the resource never converges there (long-running processes belong on SSH
    // nodes).
    let state = root.path().join("state");
    let proc_ = target(
        "process",
        "sleeper",
        json!({"argv": ["sleep", "60"], "state_dir": state.to_str().unwrap(), "stop_timeout_ms": 1000}),
    );
    let mut a = process.adaptor(&ctx).await.unwrap();
    let current = a.read(&proc_).await.unwrap();
    let changes = a.diff(&proc_, current.as_deref()).await.unwrap();
    let applied = a.apply(&proc_, current.as_deref(), &changes).await;
    let mut a = process.adaptor(&ctx).await.unwrap();
    let current = a.read(&proc_).await.unwrap();
    let after = a.diff(&proc_, current.as_deref()).await.unwrap();
    assert!(applied.is_ok(), "{applied:?}");
    assert!(!after.is_empty(), "the process kept running after its command: {current:?}");
}

//! The `symlink`, `command` and `process` adaptors on the local node: links stay inside the
//! node's root, while commands and processes see the host's real paths (they work through
//! commands only, as on every backend).

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
async fn commands_and_processes_see_the_hosts_real_paths() {
    let root = tempfile::tempdir().unwrap();
    let real = tempfile::tempdir().unwrap();
    let ctx = local_context(root.path());
    let rt = runtime();
    let command = load(&rt, &COMMAND, &Grants::none().with(Capability::NodeCommands));
    let process = load(&rt, &PROCESS, &Grants::none().with(Capability::NodeCommands));

    let marker = real.path().join("marker");
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
    assert!(marker.exists(), "the real path, not one under the node's root");
    let mut a = command.adaptor(&ctx).await.unwrap();
    let current = a.read(&cmd).await.unwrap();
    assert_eq!(a.diff(&cmd, current.as_deref()).await.unwrap(), vec![]);

    let state = real.path().join("state");
    let proc_ = target(
        "process",
        "sleeper",
        json!({"argv": ["sleep", "60"], "state_dir": state.to_str().unwrap(), "stop_timeout_ms": 1000}),
    );
    let mut a = process.adaptor(&ctx).await.unwrap();
    let current = a.read(&proc_).await.unwrap();
    let changes = a.diff(&proc_, current.as_deref()).await.unwrap();
    a.apply(&proc_, current.as_deref(), &changes).await.unwrap();
    let pid: u32 = std::fs::read_to_string(state.join("sleeper.pid"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    let mut a = process.adaptor(&ctx).await.unwrap();
    let current = a.read(&proc_).await.unwrap();
    assert_eq!(a.diff(&proc_, current.as_deref()).await.unwrap(), vec![]);
    a.delete(&proc_, current.as_deref().unwrap()).await.unwrap();
    assert!(!state.join("sleeper.pid").exists());
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.rsplit_once(')').unwrap().1.trim_start().starts_with('Z'),
        "{stat}"
    );
}

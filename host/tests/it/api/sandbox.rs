//! The confined local node through a real server: `command` resources (the first-party adaptor,
//! granted `node-commands`) that try to read the host's secret key, database, registry, `/etc/shadow` and
//! environment, to signal the server, to fork without end and to take all memory. Each fails on
//! its own, named in the resource's error, while the server goes on answering; the limits are
//! environment settings, bounded.

use std::time::{Duration, Instant};

use orc_host::store::Backend;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{Host, assert_error};

/// A `command` resource on `local` running `shell`; its guard (`creates: done`) never holds, so
/// what it does is what the command's exit says.
fn command(name: &str, shell: &str) -> Value {
    json!({
        "id": format!("command[local,{name}]"), "adaptor": "command@0.1.0",
        "attributes": { "shell": shell, "creates": format!("done-{name}"), "timeout_ms": 30000 },
    })
}

pub async fn local_commands_reach_nothing_of_the_host_and_their_limits_hold(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("dev").await;

    // The limits are bounded settings, refused by name.
    let (status, body) = host
        .patch(
            "/environments/dev",
            &json!({ "settings": { "local_commands": { "processes": 1 } } }),
        )
        .await;
    assert_error(
        (status, body),
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_settings",
        "`local_commands.processes` must be at least 8",
    );
    let (status, env) = host
        .patch(
            "/environments/dev",
            &json!({ "settings": {
                "capabilities": { "node_commands": true },
                "local_commands": { "processes": 64, "memory_bytes": 64 << 20 },
            } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{env}");
    assert_eq!(
        env["settings"]["local_commands"],
        json!({ "network": false, "cpu_seconds": 600, "memory_bytes": 64 << 20, "processes": 64, "file_size_bytes": 1 << 30 }),
        "{env}"
    );

    let data = host.data.path().display().to_string();
    let server_pid = std::process::id();
    let thefts = [
        ("key", format!("cat {data}/secret.key")),
        ("database", format!("cat {data}/{}", orc_host::store::SQLITE_FILE)),
        ("registry", format!("ls {data}/registry")),
        ("shadow", "cat /etc/shadow".to_string()),
        ("environ", format!("cat /proc/{server_pid}/environ")),
        ("signal", format!("kill -TERM {server_pid}")),
    ];
    let mut resources: Vec<Value> = thefts.iter().map(|(name, shell)| command(name, shell)).collect();
    // What of the data directory the sandbox shows: only the path down to the root.
    resources.push(command("listing", &format!("ls -A {data} {data}/nodes; exit 3")));
    resources.push(command("bomb", "bomb() { bomb | bomb & }; bomb; sleep 3; exit 3"));
    resources.push(command("hog", "head -c 400000000 /dev/zero | tail -c 300000000 | wc -c; exit 3"));
    let (status, body) = host.post("/environments/dev/intents", &json!({ "resources": resources })).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // The server answers all along.
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    let failed = loop {
        let asked = Instant::now();
        let (status, page) = host.get("/environments/dev/resources?status=failed").await;
        slowest = slowest.max(asked.elapsed());
        assert_eq!(status, StatusCode::OK, "{page}");
        let items = page["items"].as_array().cloned().unwrap_or_default();
        if items.len() == 9 {
            break items;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "not every command failed: {page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(slowest < Duration::from_secs(2), "the server took {slowest:?} to answer");
    let error = |name: &str| {
        let id = format!("command[local,{name}]");
        let r = failed.iter().find(|r| r["resource_id"] == id.as_str()).unwrap();
        r["last_error"]["message"].as_str().unwrap_or_default().to_string()
    };
    for (name, _) in &thefts[..5] {
        let message = error(name);
        assert!(message.contains("No such file or directory"), "{name}: {message}");
    }
    assert!(error("signal").contains("No such process"), "{}", error("signal"));
    let listing = error("listing");
    assert!(listing.contains("exited with 3"), "{listing}");
    let key = std::fs::read(host.data.path().join("secret.key")).unwrap();
    let key_text = String::from_utf8_lossy(&key);
    assert!(!listing.contains("secret.key") && !listing.contains(key_text.trim()), "{listing}");
    let bomb = error("bomb");
    assert!(bomb.contains("a fork was refused at the limit of 64 processes"), "{bomb}");
    let hog = error("hog");
    assert!(hog.contains("killed at the memory limit of 67108864 bytes"), "{hog}");

    // Nothing of them is left running: a command after them starts and ends as usual.
    let (status, body) = host
        .post(
            "/environments/dev/intents",
            &json!({ "resources": [command("after", "touch done-after")] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    host.wait_for_resources("dev", "status=deployed", |items| items.len() == 1).await;
    assert!(host.node_root("dev").join("done-after").exists());
}

//! The services walkthrough of `docs/clusters-and-services.md`, run as it is written: the `sh`
//! blocks after `<!-- walkthrough:services -->` and `<!-- walkthrough:services-end -->` in
//! "Services, processes and connections", each with `bash -euo pipefail` from the repository's
//! root, against a real server and two real sshd nodes registered as `web1` and `web2`, with `ORC`,
//! `TOKEN`, `AUTH` and `PATH` (the `orc-plugin` CLI) set as the guide's setup lines set them. Every
//! `# → ` line of a block is what the block must print, in that order (`…`: anything). Then the
//! data is checked where it went (redis itself, the consumer's file on its node) and through the
//! API (states, the connection and its interface id, the refused connection not made), and after
//! the second block that everything is gone. A drift in the guide (a path, a header, a field, an
//! answer) fails it.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use orc_host::store::Backend;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::host::Host;
use orc_tests::sshd::Sshd;

/// The ports the walkthrough gives its two redis processes.
const PORTS: [u16; 2] = [6380, 6381];
/// Where the consumer `frontend` leaves what it read (its default `out`).
const CONSUMER_FILE: &str = "/var/lib/orc/kv-client/frontend";
/// A whole block's bound: its own waits give up after two minutes each.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(420);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The `sh` block marked `<!-- marker -->` in the guide (there must be one).
fn block(guide: &str, marker: &str) -> String {
    let mut found = orc_tests::guide::sh_blocks(guide)
        .into_iter()
        .filter(|b| b.marker.as_deref() == Some(marker));
    let block = found
        .next()
        .unwrap_or_else(|| panic!("docs/clusters-and-services.md: no ```sh block follows `<!-- {marker} -->`"));
    assert!(
        found.next().is_none(),
        "docs/clusters-and-services.md: `<!-- {marker} -->` marks two blocks"
    );
    block.body
}

/// Every `# → ` line of `block` matches a line of `stdout`, in order.
fn assert_prints(block: &str, stdout: &str) {
    if let Some(expected) = orc_tests::guide::missing_output(block, stdout) {
        panic!("the block never printed `{expected}` (in order); it printed:\n{stdout}");
    }
}

/// The newest modification time of the files under `dir`.
fn newest(dir: &Path) -> SystemTime {
    let mut latest = SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let time = if path.is_dir() {
            newest(&path)
        } else {
            path.metadata().unwrap().modified().unwrap()
        };
        latest = latest.max(time);
    }
    latest
}

/// The directory of the `orc-plugin` CLI, in the target directory this test was built into
/// (as `tests/e2e` finds it): built with cargo when it is missing or older than the sources
/// `publish-service` runs.
fn orc_plugin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/clusters-<hash> → target/<profile>
    let dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let bin = dir.join("orc-plugin");
    let root = repo_root();
    let sources = ["sdk/cli", "sdk/manifest", "sdk/cluster", "registry"]
        .iter()
        .map(|d| newest(&root.join(d)))
        .chain([root.join("Cargo.lock").metadata().unwrap().modified().unwrap()])
        .max()
        .unwrap();
    let built = bin.metadata().and_then(|m| m.modified()).ok();
    if built.is_none_or(|b| b < sources) {
        eprintln!("building orc-plugin into {}", dir.display());
        let mut cargo = std::process::Command::new(env!("CARGO"));
        cargo
            .args(["build", "-p", "orc-plugin", "--bin", "orc-plugin"])
            .current_dir(&root)
            .env("CARGO_TARGET_DIR", dir.parent().unwrap());
        if dir.ends_with("release") {
            cargo.arg("--release");
        }
        assert!(cargo.status().unwrap().success(), "cargo build -p orc-plugin failed");
    }
    dir
}

/// Runs `script` with `bash -euo pipefail` from the repository's root with the walkthrough's
/// environment; its stdout, or a failure with what it printed.
async fn run(script: &str, env: &[(&str, String)]) -> String {
    let mut command = tokio::process::Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(repo_root())
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(BLOCK_TIMEOUT, command.output())
        .await
        .expect("the block finishes")
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!(
        "--- the block ran for {:.1?}; it printed:\n{stdout}--- stderr:\n{stderr}",
        started.elapsed()
    );
    assert!(
        out.status.success(),
        "the block failed ({}):\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    stdout.into_owned()
}

/// `GET key` over RESP; `None` when nothing answers.
async fn redis_get(port: u16, key: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(format!("GET {key}\r\n").as_bytes()).await.ok()?;
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.ok()?.ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).to_string())
}

/// Stops what a failed run leaves on this machine (the walkthrough's redis servers), so that the
/// next run finds its ports free.
struct Leftovers;

impl Drop for Leftovers {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for port in PORTS {
                let _ = std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "shutdown", "nosave"])
                    .output();
            }
            let _ = std::fs::remove_file(CONSUMER_FILE);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_services_walkthrough_runs_as_written() {
    let readme = std::fs::read_to_string(repo_root().join("docs/clusters-and-services.md")).unwrap();
    let (walk, end) = (block(&readme, "walkthrough:services"), block(&readme, "walkthrough:services-end"));
    // The setup lines before the block define `AUTH` as this test does.
    let section =
        &readme[readme.find("## Services, processes and connections").unwrap()..readme.find("<!-- walkthrough:services -->").unwrap()];
    assert!(
        section.contains(r#"AUTH="Authorization: Bearer $TOKEN""#),
        "the walkthrough's setup defines AUTH from TOKEN"
    );
    for port in PORTS {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "port {port}, which the walkthrough's redis listens on, is taken on this machine"
        );
    }
    let _ = std::fs::remove_file(CONSUMER_FILE);
    let cli = orc_plugin_dir();

    let host = Host::start(Backend::Sqlite).await;
    let sshd = [Sshd::start(), Sshd::start()];
    for (name, sshd) in ["web1", "web2"].into_iter().zip(&sshd) {
        let body = json!({"name": name, "address": sshd.address, "port": sshd.port, "user": "root",
            "credential": {"private_key": sshd.client_key}});
        let (status, node) = host.post("/nodes", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{node}");
        host.wait_node_status(name, "public").await;
    }
    let _leftovers = Leftovers;
    let env = [
        ("ORC", host.base.strip_suffix("/api/v1").unwrap().to_string()),
        ("TOKEN", host.token.clone()),
        ("AUTH", format!("Authorization: Bearer {}", host.token)),
        ("PATH", format!("{}:{}", cli.display(), std::env::var("PATH").unwrap_or_default())),
    ];

    let stdout = run(&walk, &env).await;
    assert_prints(&walk, &stdout);

    // The data is where the consumer said: in the redis it is connected to, and in its file.
    assert_eq!(
        redis_get(PORTS[0], "greeting").await.as_deref(),
        Some("$19\r\nhello from frontend\r\n")
    );
    assert_eq!(std::fs::read_to_string(CONSUMER_FILE).unwrap(), "hello from frontend\n");
    // Through the API: both running, one connection (the refused one not made), at the version
    // and interface id redis' `kv` 1.0.0 has, the same as the consumer's.
    let prod = "/environments/prod";
    for name in ["sessions", "frontend"] {
        let (_, p) = host.get(&format!("{prod}/processes/{name}")).await;
        assert_eq!(p["state"], "running", "{p:#}");
        assert!(p["pending"].as_array().unwrap().is_empty(), "{p:#}");
    }
    let (_, connections) = host.get(&format!("{prod}/connections")).await;
    let items = connections["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{connections:#}");
    let c = &items[0];
    assert_eq!(
        (&c["from"], &c["to"], &c["version"]),
        (
            &json!({"process": "frontend", "interface": "kv"}),
            &json!({"process": "sessions", "interface": "kv"}),
            &json!("1.0.0")
        ),
        "{c:#}"
    );
    let kv_id = |service: Value| service["interfaces"][0]["versions"][0]["id"].clone();
    let (_, redis) = host.get("/services/redis/1.0.0").await;
    let (_, client) = host.get("/services/kv-client/1.0.0").await;
    assert_eq!(c["interface_id"], kv_id(redis), "{c:#}");
    assert_eq!(c["interface_id"], kv_id(client));
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with(r#"{"code":"cardinality_exceeded""#) && l.ends_with(" 422")),
        "the refusal: {stdout}"
    );

    let stdout = run(&end, &env).await;
    assert_prints(&end, &stdout);
    for name in ["backup", "frontend", "sessions"] {
        host.wait_for(&format!("{prod}/processes/{name}"), "gone", super::OP_TIMEOUT, |status, _| {
            status == StatusCode::NOT_FOUND
        })
        .await;
    }
    for port in PORTS {
        assert_eq!(redis_get(port, "greeting").await, None, "redis still answers on {port}");
    }
    assert!(!Path::new(CONSUMER_FILE).exists(), "the consumer's `remove` deletes its file");
    host.stop().await;
}

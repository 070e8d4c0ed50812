//! Clusters end to end through the REST API of a real server, on nodes that are real OpenSSH
//! `sshd` servers the harness starts (one per node, on loopback, logged in as root): templates
//! refused with the culprit named, a 3-node cluster of the `shell` automator created in
//! dependency order across nodes, amended to 5 nodes without moving what ran, reconfigured,
//! a service stopped, started and restarted, the cluster deleted (services stopped and removed
//! in reverse order); a create that fails in the middle rolled back; a cluster of the `redis`
//! automator answering PING on its port. Tests poll, never sleep for a fixed time.

mod processes;
mod races;
mod walkthrough;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use orc_host::store::Backend;
use orc_tests::sshd::Sshd;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::host::Host;
use crate::support::paths;

const ENV: &str = "prod";
/// Long enough for a loaded 2-core machine; the tests poll.
const OP_TIMEOUT: Duration = Duration::from_secs(120);

/// Nodes `n1`…`nN`, each its own sshd, registered and verified.
async fn nodes(host: &Host, count: usize) -> Vec<Sshd> {
    let servers: Vec<Sshd> = (0..count).map(|_| Sshd::start()).collect();
    register_nodes(host, &servers).await;
    servers
}

/// Registers `servers` as nodes `n1`…`nN` (by their addresses, logged in as root) and waits
/// until each is verified.
async fn register_nodes(host: &Host, servers: &[Sshd]) {
    for (i, sshd) in (1..).zip(servers) {
        let body = json!({
            "name": format!("n{i}"),
            "address": sshd.address,
            "port": sshd.port,
            "user": "root",
            "credential": { "private_key": sshd.client_key },
            "labels": { "rack": if i % 2 == 0 { "even" } else { "odd" } },
        });
        let (status, node) = host.post("/nodes", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{node}");
    }
    for i in 1..=servers.len() {
        host.wait_node_status(&format!("n{i}"), "public").await;
    }
}

/// The randomized tests' generator: seeded from `ORC_TEST_SEED` when set (to replay a run), else
/// from the clock; the seed is printed first, so a failing run can be replayed.
fn seeded_runner() -> (u64, proptest::test_runner::TestRunner) {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let seed: u64 = std::env::var("ORC_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    eprintln!("ORC_TEST_SEED={seed}");
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    (
        seed,
        TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)),
    )
}

async fn submit_template(host: &Host, name: &str, template: &Value) -> Value {
    let (status, t) = host.post(&format!("/environments/{ENV}/templates/{name}"), template).await;
    assert_eq!(status, StatusCode::CREATED, "{t}");
    t
}

/// Polls the cluster until its status is `status`; fails at once if it failed instead.
async fn wait_cluster(host: &Host, name: &str, status: &str) -> Value {
    host.wait_for(&format!("/environments/{ENV}/clusters/{name}"), status, OP_TIMEOUT, |code, c| {
        assert!(
            code == StatusCode::OK && (c["status"] == status || c["status"] != "failed"),
            "cluster {name}: {code} {c:#}"
        );
        c["status"] == status
    })
    .await
}

async fn wait_gone(host: &Host, name: &str) {
    host.wait_for(&format!("/environments/{ENV}/clusters/{name}"), "deleted", OP_TIMEOUT, |code, _| {
        code == StatusCode::NOT_FOUND
    })
    .await;
}

/// The ids of the released version's resources that hold `needle`, sorted.
async fn released_ids(host: &Host, needle: &str) -> Vec<String> {
    let (_, env) = host.get(&format!("/environments/{ENV}")).await;
    let (_, version) = host.get(&format!("/environments/{ENV}/intents/{}", env["released_version"])).await;
    let mut ids: Vec<String> = version["intent"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .filter(|id| id.contains(needle))
        .collect();
    ids.sort();
    ids
}

/// The layout as node → services.
fn layout(cluster: &Value) -> BTreeMap<String, BTreeSet<String>> {
    serde_json::from_value(cluster["layout"].clone()).unwrap()
}

/// The `events` file the scripts append to: one `node service action` per line.
fn events(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("events"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn position(events: &[String], line: &str) -> usize {
    events
        .iter()
        .position(|e| e == line)
        .unwrap_or_else(|| panic!("no `{line}` in {events:#?}"))
}

/// A three-service stack for the `shell` automator: `base` everywhere, one `db`, `web` on the
/// nodes without `db`. `db` installs after `base` (install-time), `web` initializes after `db`
/// runs (run-time). Scripts record what they do in `$ROOT/events` and leave files per node.
fn stack(root: &Path) -> Value {
    let log = |what: &str| format!("echo \"$ORC_NODE {what}\" >> \"$ROOT/events\"");
    json!({
        "description": "base everywhere, one db, web elsewhere",
        "services": {
            "base": {"automator": "shell@0.1.0", "config": {"root": root, "scripts": {
                "install": format!("mkdir -p \"$ROOT/$ORC_NODE\" && {}", log("base install")),
                "remove": format!("rm -rf \"$ROOT/$ORC_NODE\"; {}", log("base remove")),
            }}},
            "db": {"automator": "shell@0.1.0", "requires": {"install": ["base"]}, "count": {"max": 1},
                "config": {"root": root, "scripts": {
                    "install": log("db install"),
                    "start": format!("touch \"$ROOT/$ORC_NODE/db.running\" && {}", log("db start")),
                    "stop": format!("rm -f \"$ROOT/$ORC_NODE/db.running\"; {}", log("db stop")),
                }, "checks": {
                    "start": "test -f \"$ROOT/$ORC_NODE/db.running\"",
                    "stop": "test ! -f \"$ROOT/$ORC_NODE/db.running\"",
                }}},
            "web": {"automator": "shell@0.1.0", "requires": {"install": ["base"], "runtime": ["db"]},
                "config": {"root": root, "greeting": "hello", "scripts": {
                    "configure": "printf '%s %s\\n' \"$GREETING\" \"$ORC_NODES_DB\" > \"$ROOT/$ORC_NODE/web.conf\"",
                    "initialize": log("web initialize"),
                    "start": format!("cp \"$ROOT/$ORC_NODE/web.conf\" \"$ROOT/$ORC_NODE/web.running\" && {}", log("web start")),
                    "stop": format!("rm -f \"$ROOT/$ORC_NODE/web.running\"; {}", log("web stop")),
                }, "checks": {
                    "stop": "test ! -f \"$ROOT/$ORC_NODE/web.running\"",
                }}},
        },
        "constraints": {"apart": [["db", "web"]]},
        "defaults": {"size": 3},
    })
}

async fn start_host(retry_interval_s: u64) -> Host {
    let host = Host::start(Backend::Sqlite).await;
    host.create_environment_retrying(ENV, retry_interval_s).await;
    // The `shell` and `redis` automators run commands: not granted by default.
    let patch = json!({ "settings": { "capabilities": { "node_commands": true } } });
    let (status, env, _) = host.send_text(Method::PATCH, &format!("/environments/{ENV}"), Some(&patch)).await;
    assert_eq!(status, StatusCode::OK, "{env}");
    host
}

/// Create 3 → amend to 5 → reconfigure → stop/start/restart a service → an operator's intent
/// beside it → delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_cluster_is_created_amended_reconfigured_and_deleted() {
    let host = start_host(1).await;
    let _sshd = nodes(&host, 5).await;
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let t = submit_template(&host, "stack", &stack(root)).await;
    assert_eq!(t["version"], 1);
    assert!(
        t["template"]["services"]["web"]["automator"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"),
        "{t}"
    );
    assert!(t["template"]["solver"].as_str().unwrap().starts_with("sha256:"), "{t}");

    // A preview creates nothing.
    let (status, preview) = host
        .post(
            &format!("/environments/{ENV}/clusters"),
            &json!({"name": "shop", "template": "stack", "preview": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{preview}");
    assert_eq!(preview["tasks"].as_array().unwrap().len(), 6 * 5, "{preview:#}");
    let (_, list) = host.get(&format!("/environments/{ENV}/clusters")).await;
    assert_eq!(list["items"], json!([]));

    // Create: 3 nodes (the template's default size).
    let (status, c) = host
        .post(
            &format!("/environments/{ENV}/clusters"),
            &json!({"name": "shop", "template": "stack", "nodes": ["n1", "n2", "n3"]}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    assert_eq!(c["status"], "creating");
    // The operation names its author, the user of the token (the first start's `admin`).
    assert_eq!(c["operation_author"], "admin", "{c}");
    // One operation at a time.
    let (status, busy) = host
        .post(&format!("/environments/{ENV}/clusters/shop/amend"), &json!({"size": 4}))
        .await;
    assert!(status == StatusCode::CONFLICT && busy["code"] == "cluster_busy", "{status} {busy}");
    let c = wait_cluster(&host, "shop", "active").await;
    let l = layout(&c);
    assert_eq!(l.len(), 3, "{c:#}");
    let db_nodes: Vec<&String> = l.iter().filter(|(_, s)| s.contains("db")).map(|(n, _)| n).collect();
    assert_eq!(db_nodes.len(), 1, "{l:?}");
    let db = db_nodes[0].clone();
    for (node, services) in &l {
        let expected: BTreeSet<String> = if *node == db {
            ["base", "db"].map(String::from).into()
        } else {
            ["base", "web"].map(String::from).into()
        };
        assert_eq!(services, &expected, "{l:?}");
    }
    assert_eq!(c["progress"], json!({"done": 30}), "{c:#}");
    // Order across nodes.
    let ev = events(root);
    let db_install = position(&ev, &format!("{db} db install"));
    let db_start = position(&ev, &format!("{db} db start"));
    for node in l.keys() {
        assert!(position(&ev, &format!("{node} base install")) < db_install, "{ev:#?}");
        if *node != db {
            assert!(db_start < position(&ev, &format!("{node} web initialize")), "{ev:#?}");
            let running = std::fs::read_to_string(root.join(node).join("web.running")).unwrap();
            assert_eq!(running.trim(), format!("hello {db}"));
        }
    }
    // A dryrun checks every task and changes nothing; drift made by hand is seen by a dryrun
    // and healed by a repair, like any resource.
    let dryrun = host.run_to_completion(&format!("/environments/{ENV}/dryrun"), None).await;
    assert_eq!(
        dryrun["report"]["summary"],
        json!({"no_change": 30, "would_change": 0, "unchecked": 0}),
        "{dryrun:#}"
    );
    std::fs::remove_file(root.join(&db).join("db.running")).unwrap();
    let dryrun = host.run_to_completion(&format!("/environments/{ENV}/dryrun"), None).await;
    assert_eq!(dryrun["report"]["summary"]["would_change"], 1, "{dryrun:#}");
    assert!(!root.join(&db).join("db.running").exists(), "a dryrun changed something");
    host.run_to_completion(&format!("/environments/{ENV}/repair"), None).await;
    assert!(root.join(&db).join("db.running").exists(), "repair did not restart db");

    // The tasks are resources of the environment, with their action log.
    let (_, resources) = host.get(&format!("/environments/{ENV}/resources?type=task&limit=1000")).await;
    assert_eq!(resources["items"].as_array().unwrap().len(), 30, "{resources}");

    // An operator's intent beside the cluster keeps the cluster's tasks.
    let (status, v) = host
        .post(
            &format!("/environments/{ENV}/intents"),
            &json!({"resources": [{"id": "file[local,/motd]", "adaptor": "file@0.1.0", "attributes": {"content": "hi"}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    host.wait_for(
        &format!("/environments/{ENV}/resources/{}", paths::encode("file[local,/motd]")),
        "deployed",
        OP_TIMEOUT,
        |_, r| r["state"]["status"] == "deployed",
    )
    .await;
    let (_, resources) = host.get(&format!("/environments/{ENV}/resources?type=task&limit=1000")).await;
    assert_eq!(resources["items"].as_array().unwrap().len(), 30, "{resources}");
    assert_eq!(wait_cluster(&host, "shop", "active").await["progress"], json!({"done": 30}));

    // Amend to 5 nodes: what ran stays where it was; the new nodes get base and web.
    let (status, c) = host
        .post(
            &format!("/environments/{ENV}/clusters/shop/amend"),
            &json!({"size": 5, "nodes": []}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    let c = wait_cluster(&host, "shop", "active").await;
    let amended = layout(&c);
    assert_eq!(amended.len(), 5, "{c:#}");
    for (node, services) in &l {
        assert_eq!(amended.get(node), Some(services), "moved: {amended:?}");
    }
    for node in ["n4", "n5"] {
        assert_eq!(amended[node], ["base", "web"].map(String::from).into(), "{amended:?}");
        let running = std::fs::read_to_string(root.join(node).join("web.running")).unwrap();
        assert_eq!(running.trim(), format!("hello {db}"));
    }
    assert_eq!(
        events(root).iter().filter(|e| e.ends_with("db install")).count(),
        1,
        "db installed twice"
    );

    // Reconfigure web: every web node runs the new configuration.
    let (status, c) = host
        .post(
            &format!("/environments/{ENV}/clusters/shop/reconfigure"),
            &json!({"config": {"web": {"greeting": "bonjour"}}}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    // The host restarts in the middle: the operation carries on.
    let (data, token) = host.restart_later().await;
    let host = Host::start_again(data, token).await;
    let c = wait_cluster(&host, "shop", "active").await;
    assert_eq!(c["config"]["web"]["greeting"], "bonjour", "{c:#}");
    for node in amended.keys().filter(|n| **n != db) {
        let running = std::fs::read_to_string(root.join(node).join("web.running")).unwrap();
        assert_eq!(running.trim(), format!("bonjour {db}"), "{node}");
    }

    // Stop web, then start it again.
    let (status, c) = host
        .post(&format!("/environments/{ENV}/clusters/shop/services/web/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    let c = wait_cluster(&host, "shop", "active").await;
    assert_eq!(c["stopped"], json!(["web"]));
    for node in amended.keys().filter(|n| **n != db) {
        assert!(!root.join(node).join("web.running").exists(), "{node}");
    }
    let (status, _) = host
        .post(&format!("/environments/{ENV}/clusters/shop/services/web/start"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let c = wait_cluster(&host, "shop", "active").await;
    assert_eq!(c["stopped"], json!([]));
    for node in amended.keys().filter(|n| **n != db) {
        assert!(root.join(node).join("web.running").exists(), "{node}");
    }
    // Restart db: stopped, then started.
    let before = events(root).len();
    let (status, _) = host
        .post(&format!("/environments/{ENV}/clusters/shop/services/db/restart"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    wait_cluster(&host, "shop", "active").await;
    let after: Vec<String> = events(root)[before..].to_vec();
    assert_eq!(after, [format!("{db} db stop"), format!("{db} db start")], "{after:#?}");
    let (status, unknown) = host
        .post(&format!("/environments/{ENV}/clusters/shop/services/mail/stop"), &json!({}))
        .await;
    assert_eq!((status, unknown["code"].as_str()), (StatusCode::NOT_FOUND, Some("unknown_service")));

    // A stale `If-Match` changes nothing: 409 naming the current revision.
    let shop = format!("/environments/{ENV}/clusters/shop");
    let (_, current, tag) = processes::call(&host, Method::GET, &shop, None, None).await;
    let tag = tag.unwrap();
    assert_eq!(tag, format!("\"{}\"", current["revision"]), "{current}");
    assert_ne!(tag, "\"1\"");
    for (method, path, body) in [
        (Method::POST, format!("{shop}/amend"), Some(json!({"size": 4}))),
        (Method::DELETE, shop.clone(), None),
    ] {
        let (status, answer, _) = processes::call(&host, method, &path, body.as_ref(), Some("\"1\"")).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (StatusCode::CONFLICT, Some("version_conflict")),
            "{answer}"
        );
        assert!(
            answer["message"].as_str().unwrap().contains(&current["revision"].to_string()),
            "{answer}"
        );
    }
    let (_, unchanged, again) = processes::call(&host, Method::GET, &shop, None, None).await;
    assert_eq!((again.as_deref(), &unchanged["status"]), (Some(tag.as_str()), &current["status"]));

    // Delete (with the current revision): web stopped before db, services removed, the tasks
    // gone from the environment.
    let (status, c, _) = processes::call(&host, Method::DELETE, &shop, None, Some(&tag)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    let before = events(root).len();
    wait_gone(&host, "shop").await;
    let after: Vec<String> = events(root)[before.min(events(root).len())..].to_vec();
    let ev = events(root);
    let db_stop = ev.iter().rposition(|e| *e == format!("{db} db stop")).unwrap();
    for node in amended.keys() {
        assert!(!root.join(node).exists(), "{node} not removed: {after:#?}");
        if *node != db {
            let web_stop = ev.iter().rposition(|e| *e == format!("{node} web stop")).unwrap();
            assert!(web_stop < db_stop, "{ev:#?}");
        }
    }
    let (_, resources) = host.get(&format!("/environments/{ENV}/resources?type=task")).await;
    assert_eq!(resources["items"], json!([]), "{resources}");
    let (status, _) = host.get(&format!("/environments/{ENV}/clusters/shop")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    host.stop().await;
}

/// A node taken out of a cluster and given back gets every service anew, even one with no
/// `remove` script: `web` has none, `base`'s removes the node's directory with `web.conf` in it,
/// so `web` must forget that it was configured there, or its `start` finds no `web.conf`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_removed_and_given_back_gets_its_services_anew() {
    let host = start_host(1).await;
    let _sshd = nodes(&host, 3).await;
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    submit_template(&host, "stack", &stack(root)).await;
    let all = ["n1", "n2", "n3"];
    let (status, c) = host
        .post(
            &format!("/environments/{ENV}/clusters"),
            &json!({"name": "back", "template": "stack", "nodes": all}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    let c = wait_cluster(&host, "back", "active").await;
    let web = layout(&c)
        .into_iter()
        .find(|(_, services)| services.contains("web"))
        .map(|(node, _)| node)
        .unwrap_or_else(|| panic!("no web node: {c:#}"));
    assert!(root.join(&web).join("web.running").is_file());

    let rest: Vec<&str> = all.into_iter().filter(|n| *n != web).collect();
    let amend = format!("/environments/{ENV}/clusters/back/amend");
    let (status, c) = host.post(&amend, &json!({"size": 2, "nodes": rest})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    let c = wait_cluster(&host, "back", "active").await;
    assert!(!layout(&c).contains_key(&web), "{c:#}");
    assert!(!root.join(&web).exists(), "base's remove wipes {web}'s directory");

    let (status, c) = host.post(&amend, &json!({"size": 3, "nodes": all})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    let c = wait_cluster(&host, "back", "active").await;
    assert!(layout(&c)[&web].contains("web"), "{c:#}");
    let conf = std::fs::read_to_string(root.join(&web).join("web.conf")).unwrap();
    assert!(conf.starts_with("hello "), "{conf}");
    assert!(root.join(&web).join("web.running").is_file());
    let ev = events(root);
    assert_eq!(ev.iter().filter(|e| **e == format!("{web} web start")).count(), 2, "{ev:#?}");
    host.stop().await;
}

/// A create whose task keeps failing is rolled back: what it made is undone, the cluster is
/// `failed` with the task and its error. Fixing the configuration brings it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_create_rolls_back() {
    let host = start_host(1).await;
    let _sshd = nodes(&host, 3).await;
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let log = |what: &str| format!("echo \"$ORC_NODE {what}\" >> \"$ROOT/events\"");
    let template = json!({
        "services": {
            "base": {"automator": "shell@0.1.0", "config": {"root": root, "scripts": {
                "install": format!("mkdir -p \"$ROOT/$ORC_NODE\" && {}", log("base install")),
                "remove": format!("rm -rf \"$ROOT/$ORC_NODE\"; {}", log("base remove")),
            }}},
            "app": {"automator": "shell@0.1.0", "requires": {"install": ["base"]}, "config": {"root": root, "fail_on": "n2", "scripts": {
                "install": format!("if [ \"$ORC_NODE\" = \"$FAIL_ON\" ]; then echo 'disk full' >&2; exit 3; fi; {}", log("app install")),
                "remove": log("app remove"),
            }}},
        },
    });
    submit_template(&host, "flaky", &template).await;
    let (status, c) = host
        .post(
            &format!("/environments/{ENV}/clusters"),
            &json!({"name": "f1", "template": "flaky", "size": 3, "max_attempts": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    let c = host
        .wait_for(&format!("/environments/{ENV}/clusters/f1"), "failed", OP_TIMEOUT, |_, c| {
            c["status"] == "failed"
        })
        .await;
    assert_eq!(c["failure"]["task"], "task[n2,f1/app/install]", "{c:#}");
    assert!(c["failure"]["message"].as_str().unwrap().contains("disk full"), "{c:#}");
    assert_eq!(c["operation"], "rollback");
    // The rollback after a failure is the host's own.
    assert!(c["operation_author"].is_null(), "{c:#}");
    // Everything it made is undone: base removed everywhere, the app removed where installed.
    let ev = events(root);
    for node in ["n1", "n2", "n3"] {
        assert!(ev.contains(&format!("{node} base install")), "{ev:#?}");
        assert!(ev.contains(&format!("{node} base remove")), "{ev:#?}");
        assert!(!root.join(node).exists());
    }
    assert!(!ev.contains(&"n2 app install".to_string()));
    let (_, resources) = host.get(&format!("/environments/{ENV}/resources?type=task")).await;
    assert_eq!(resources["items"], json!([]), "{resources}");
    let first_layout = layout(&c);
    // A retry creates the same layout again (never more nodes than asked): it fails the same way
    // and is rolled back again.
    let (status, c) = host.post(&format!("/environments/{ENV}/clusters/f1/retry"), &json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    assert_eq!(c["status"], "creating", "{c}");
    assert_eq!(layout(&c), first_layout);
    let c = host
        .wait_for(&format!("/environments/{ENV}/clusters/f1"), "failed again", OP_TIMEOUT, |_, c| {
            c["status"] == "failed" && c["operation"] == "rollback"
        })
        .await;
    assert_eq!(layout(&c), first_layout, "{c:#}");
    assert_eq!(c["failure"]["task"], "task[n2,f1/app/install]", "{c:#}");
    // The same layout comes back with a fixed configuration: never more nodes than asked.
    let (status, c) = host
        .post(
            &format!("/environments/{ENV}/clusters/f1/reconfigure"),
            &json!({"config": {"app": {"fail_on": "none"}}}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    let c = wait_cluster(&host, "f1", "active").await;
    assert_eq!(layout(&c).len(), 3);
    for node in ["n1", "n2", "n3"] {
        assert!(root.join(node).exists(), "{node}");
    }

    // A service added by amend (its preview first) runs where the layout puts it.
    let installs = |ev: &[String]| ev.iter().filter(|e| e.ends_with("app install")).count();
    let before = installs(&events(root));
    let (status, c) = host
        .post(
            &format!("/environments/{ENV}/clusters"),
            &json!({"name": "f2", "template": "flaky", "services": ["base"], "size": 2, "nodes": ["n1", "n3"]}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    wait_cluster(&host, "f2", "active").await;
    let (status, preview) = host
        .post(
            &format!("/environments/{ENV}/clusters/f2/amend"),
            &json!({"add_services": ["app"], "preview": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{preview}");
    let of = |change: &str| -> Vec<String> {
        preview["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["change"] == change)
            .map(|t| t["id"].as_str().unwrap().to_string())
            .collect()
    };
    let added = of("add");
    assert_eq!(added.len(), 10, "{preview:#}");
    assert!(added.iter().all(|t| t.contains("/app/")), "{preview:#}");
    // The layout changed: base reconfigures and restarts (its steps that see the layout).
    let mut changed = of("change");
    changed.sort();
    assert_eq!(
        changed,
        [
            "task[n1,f2/base/configure]",
            "task[n1,f2/base/start]",
            "task[n3,f2/base/configure]",
            "task[n3,f2/base/start]"
        ]
    );
    let (status, c) = host
        .post(&format!("/environments/{ENV}/clusters/f2/amend"), &json!({"add_services": ["app"]}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    let c = wait_cluster(&host, "f2", "active").await;
    assert_eq!(c["services"], json!(["base", "app"]), "{c}");
    assert_eq!(
        layout(&c),
        [("n1", ["app", "base"]), ("n3", ["app", "base"])]
            .map(|(n, s)| (n.to_string(), s.map(String::from).into()))
            .into(),
        "{c:#}"
    );
    let ev = events(root);
    assert_eq!(installs(&ev), before + 2, "{ev:#?}");
    assert!(
        ev.ends_with(&["n1 app install".to_string(), "n3 app install".to_string()])
            || ev.ends_with(&["n3 app install".to_string(), "n1 app install".to_string()]),
        "{ev:#?}"
    );
    host.stop().await;
}

/// The `redis` automator on a node: the cluster's redis answers PING on its port; delete stops
/// it and removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_answers_on_its_port() {
    let host = start_host(2).await;
    let _sshd = nodes(&host, 1).await;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    submit_template(
        &host,
        "cache",
        &json!({"services": {"redis": {"automator": "redis@0.1.0", "config": {"port": port}}}, "defaults": {"size": 1}}),
    )
    .await;
    let (status, c) = host
        .post(
            &format!("/environments/{ENV}/clusters"),
            &json!({"name": "c1", "template": "cache"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    wait_cluster(&host, "c1", "active").await;
    assert_eq!(ping(port).await.as_deref(), Some("+PONG"));
    let (status, _) = host.delete(&format!("/environments/{ENV}/clusters/c1")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    wait_gone(&host, "c1").await;
    assert_eq!(ping(port).await, None, "redis still answers after delete");
    host.stop().await;
}

/// `PING` over RESP; `None` when nothing answers.
async fn ping(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(b"PING\r\n").await.ok()?;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.ok()?.ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}

/// Bad templates and requests: each refused with its code and the culprit named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_templates_and_requests_are_refused_by_name() {
    let host = start_host(1).await;
    let _sshd = nodes(&host, 2).await;
    let root = tempfile::tempdir().unwrap();
    let shell = json!({"automator": "shell@0.1.0"});
    let cases = [
        (
            json!({"services": {"a": {"automator": "shell@0.1.0", "requires": {"runtime": ["b"]}}, "b": {"automator": "shell@0.1.0", "requires": {"runtime": ["a"]}}}}),
            "invalid_template",
            "runtime-time dependency cycle: a -> b -> a",
        ),
        (
            json!({"services": {"a": shell, "b": shell}, "constraints": {"together": [["a", "b"]], "apart": [["b", "a"]]}}),
            "invalid_template",
            "constraints.apart[0]",
        ),
        (
            json!({"services": {"a": {"automator": "shell@0.1.0", "requires": {"install": ["zz"]}}}}),
            "invalid_template",
            "services.a.requires.install[0]",
        ),
        (
            json!({"services": {"a": {"automator": "nope@1.0.0"}}}),
            "unknown_plugin",
            "nope@1.0.0",
        ),
        (
            json!({"services": {"a": {"automator": "file@0.1.0"}}}),
            "plugin_rejected",
            "file@0.1.0",
        ),
        (
            json!({"services": {"a": shell}, "solver": "shell@0.1.0"}),
            "plugin_rejected",
            "shell@0.1.0",
        ),
    ];
    for (template, code, culprit) in cases {
        let (status, e) = host.post(&format!("/environments/{ENV}/templates/bad"), &template).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{template}: {e}");
        assert_eq!(e["code"], code, "{template}: {e}");
        assert!(e["message"].as_str().unwrap().contains(culprit), "{template}: {e}");
    }
    let (status, e) = host.get(&format!("/environments/{ENV}/templates/bad")).await;
    assert_eq!((status, e["code"].as_str()), (StatusCode::NOT_FOUND, Some("unknown_template")));

    submit_template(&host, "stack", &stack(root.path())).await;
    let create = |body: Value| {
        let host = &host;
        async move { host.post(&format!("/environments/{ENV}/clusters"), &body).await }
    };
    for (body, status, code, culprit) in [
        (
            json!({"name": "c", "template": "nope"}),
            StatusCode::NOT_FOUND,
            "unknown_template",
            "nope",
        ),
        (
            json!({"name": "c", "template": "stack", "size": 3}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "no_valid_layout",
            "size",
        ),
        (
            json!({"name": "c", "template": "stack", "services": ["base", "web"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_template",
            "`web` requires `db`",
        ),
        (
            json!({"name": "c", "template": "stack", "config": {"mail": {}}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_cluster_request",
            "mail",
        ),
        (
            json!({"name": "c", "template": "stack", "nodes": ["n9"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_cluster_request",
            "n9",
        ),
        (
            json!({"name": "Bad Name", "template": "stack"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_cluster_request",
            "Bad Name",
        ),
        (
            json!({"name": "c", "template": "stack", "lease_s": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_cluster_request",
            "lease_s: 0",
        ),
        (
            json!({"name": "c", "template": "stack", "lease_s": 315_360_001u64}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_cluster_request",
            "lease_s: 315360001",
        ),
        (
            json!({"name": "c", "template": "stack", "colour": 1}),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "colour",
        ),
    ] {
        let (s, e) = create(body.clone()).await;
        assert_eq!((s, e["code"].as_str()), (status, Some(code)), "{body}: {e}");
        assert!(e["message"].as_str().unwrap().contains(culprit), "{body}: {e}");
    }
    // A layout need no node meets names the constraint.
    let mut picky = stack(root.path());
    picky["services"]["db"]["needs"] = json!({"labels": {"disk": "ssd"}});
    submit_template(&host, "picky", &picky).await;
    let (s, e) = create(json!({"name": "c", "template": "picky", "size": 2})).await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("no_valid_layout")),
        "{e}"
    );
    assert!(e["message"].as_str().unwrap().contains("services.db.needs"), "{e}");
    // An operator's own solver is used when a template names it, and its layouts are checked:
    // this one ignores every constraint.
    host.publish(orc_plugin_artifacts::GREEDY_SOLVER.bytes).await;
    let mut greedy = stack(root.path());
    greedy["solver"] = json!("greedy-solver@0.1.0");
    submit_template(&host, "greedy", &greedy).await;
    let (s, e) = create(json!({"name": "g", "template": "greedy", "size": 2})).await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_layout")),
        "{e}"
    );
    assert!(e["message"].as_str().unwrap().contains("services.db.count"), "{e}");
    let only_base = json!({"solver": "greedy-solver@0.1.0", "services": {"base": stack(root.path())["services"]["base"]}});
    submit_template(&host, "greedy-base", &only_base).await;
    let (s, c) = create(json!({"name": "g", "template": "greedy-base", "size": 2, "preview": true})).await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!(c["layout"], json!({"n1": ["base"], "n2": ["base"]}), "{c}");
    // Operators cannot write cluster tasks.
    let (s, e) = host
        .post(
            &format!("/environments/{ENV}/intents"),
            &json!({"resources": [{"id": "task[n1,x/y/start]", "adaptor": "shell@0.1.0"}]}),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("reserved_resource_type")),
        "{e}"
    );
    for path in ["/clusters/nope", "/clusters/nope/amend"] {
        let (s, e) = if path.ends_with("amend") {
            host.post(&format!("/environments/{ENV}{path}"), &json!({})).await
        } else {
            host.get(&format!("/environments/{ENV}{path}")).await
        };
        assert_eq!(
            (s, e["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("unknown_cluster")),
            "{path}: {e}"
        );
    }
    // A lease ends: the cluster is deleted. An extension beyond ten years is refused by name and
    // the lease stands; a short one ends it.
    let (s, c) = create(json!({"name": "short", "template": "stack", "size": 2, "lease_s": 3600})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{c}");
    let lease = format!("/environments/{ENV}/clusters/short/lease");
    let (s, e) = host.post(&lease, &json!({"lease_s": u64::MAX})).await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_cluster_request")),
        "{e}"
    );
    assert!(e["message"].as_str().unwrap().contains("lease_s"), "{e}");
    let (_, still) = host.get(&format!("/environments/{ENV}/clusters/short")).await;
    assert_eq!(still["lease_expires_at"], c["lease_expires_at"], "{still}");
    let (s, c) = host.post(&lease, &json!({"lease_s": 1})).await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert!(c["lease_expires_at"].is_i64(), "{c}");
    wait_gone(&host, "short").await;
    // A second version of a template; the first stays readable.
    submit_template(&host, "stack", &stack(root.path())).await;
    let (_, versions) = host.get(&format!("/environments/{ENV}/templates/stack/versions")).await;
    assert_eq!(versions["items"].as_array().unwrap().len(), 2, "{versions}");
    let (s, v1) = host.get(&format!("/environments/{ENV}/templates/stack?version=1")).await;
    assert_eq!((s, &v1["version"]), (StatusCode::OK, &json!(1)));
    host.stop().await;
}

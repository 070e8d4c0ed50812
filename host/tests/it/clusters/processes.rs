//! Processes of catalog services on real sshd nodes, through the REST API: the redis service
//! published to the host's catalog, a process on a named node and one placed by the solver, each
//! answering PING on its own port; refusals with their codes; an update with a stale `If-Match`
//! refused and one with the current revision applied; a failing update rolled back to the
//! configuration that ran, the failure kept and the process serving again; terminate; a consumer
//! connected to a redis on another node, whose node is cut off (a network namespace's link taken
//! down) while its connection is dropped; racing operations (randomized); a host stopped in the
//! middle of a terminate.

use std::time::Duration;

use orc_tests::wait_for;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{ENV, OP_TIMEOUT, nodes, ping, register_nodes, start_host};
use crate::support::host::{Data, Host};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The redis servers of the named processes, and their files: the nodes of these tests are this
/// machine, and a server daemonizes, so what a test leaves running (or a failed test) is stopped
/// when the guard drops. Declared before the host, it drops after it.
struct RedisProcesses(&'static [&'static str]);

impl Drop for RedisProcesses {
    fn drop(&mut self) {
        for process in self.0 {
            let instance = format!("process.{process}-redis");
            let pidfile = format!("/run/orc/redis/{instance}.pid");
            if let Some(pid) = std::fs::read_to_string(&pidfile).ok().and_then(|p| p.trim().parse::<u32>().ok()) {
                let _ = std::process::Command::new("kill").arg("-KILL").arg(pid.to_string()).status();
            }
            for file in [
                pidfile,
                format!("/run/orc/redis/{instance}.started"),
                format!("/etc/orc/redis/{instance}.conf"),
                format!("/var/log/orc/redis/{instance}.log"),
            ] {
                let _ = std::fs::remove_file(file);
            }
            let _ = std::fs::remove_dir_all(format!("/var/lib/orc/redis/{instance}"));
        }
    }
}

/// The redis service, as `plugins/redis/service.toml` describes it, with its automator pinned.
fn redis_service() -> Value {
    json!({
        "name": "redis", "version": "1.0.0",
        "automator": orc_plugin_artifacts::REDIS.digest,
        "config_schema": {"type": "object", "additionalProperties": false, "properties": {
            "bind": {"type": "string"},
            "maxmemory": {"type": ["integer", "string"]},
            "protected_mode": {"type": "boolean"}
        }},
        "ports": [{"name": "kv", "port": 6379, "config_key": "port"}],
        "interfaces": [{"name": "kv", "role": "provides", "port": "kv", "allow_multiple": true,
            "versions": [{"version": "1.0.0", "schema": {"type": "object", "required": ["command"]}}]}]
    })
}

async fn publish_service(host: &Host, doc: &Value) {
    let resp = host
        .client
        .post(host.base.replace("/api/v1", "/registry/v1/services"))
        .bearer_auth(&host.token)
        .json(doc)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED, "{}", resp.text().await.unwrap());
}

/// A request with an optional `If-Match`; the status, body and `ETag`.
pub(super) async fn call(
    host: &Host,
    method: Method,
    path: &str,
    body: Option<&Value>,
    if_match: Option<&str>,
) -> (StatusCode, Value, Option<String>) {
    let mut req = host.client.request(method, format!("{}{path}", host.base)).bearer_auth(&host.token);
    if let Some(tag) = if_match {
        req = req.header("if-match", tag);
    }
    if let Some(body) = body {
        req = req.json(body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let etag = resp.headers().get("etag").map(|v| v.to_str().unwrap().to_string());
    (status, resp.json().await.unwrap_or(Value::Null), etag)
}

async fn wait_state(host: &Host, name: &str, state: &str) -> Value {
    host.wait_for(&format!("/environments/{ENV}/processes/{name}"), state, OP_TIMEOUT, |code, p| {
        assert!(code == StatusCode::OK, "process {name}: {code} {p:#}");
        assert!(p["state"] != "failed" || state == "failed", "process {name} failed: {p:#}");
        p["state"] == state
    })
    .await
}

async fn config_get(port: u16, key: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(format!("CONFIG GET {key}\r\n").as_bytes()).await.unwrap();
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_process_is_created_updated_rolled_back_and_terminated() {
    let _servers = RedisProcesses(&["cache", "placed"]);
    let host = start_host(1).await;
    let _sshd = nodes(&host, 2).await;
    publish_service(&host, &redis_service()).await;
    let processes = format!("/environments/{ENV}/processes");
    let (p1, p2) = (free_port(), free_port());

    // Refusals, each with its code and the culprit named; nothing refused is kept.
    let refusals = [
        (
            json!({"name": "c", "service": "redis@9.9.9", "node": "n1"}),
            StatusCode::NOT_FOUND,
            "unknown_service",
            "redis@9.9.9",
        ),
        (
            json!({"name": "c", "service": "redis@1.0.0", "node": "n1", "config": {"maxmemory": true}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_config",
            "config/maxmemory",
        ),
        (
            json!({"name": "c", "service": "redis@1.0.0", "node": "n1", "config": {"colour": "red"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_config",
            "colour",
        ),
        (
            json!({"name": "c", "service": "redis@1.0.0", "node": "nope"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "node_unsuitable",
            "node `nope`",
        ),
        (
            json!({"name": "c", "service": "redis@1.0.0", "node": "n1", "ports": {"web": 80}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_process_request",
            "ports.web",
        ),
        (
            json!({"name": "C!", "service": "redis@1.0.0", "node": "n1"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_cluster_request",
            "process name",
        ),
    ];
    for (body, status, code, words) in refusals {
        let (got, answer) = host.post(&processes, &body).await;
        assert_eq!((got, answer["code"].as_str()), (status, Some(code)), "{body}: {answer}");
        assert!(answer["message"].as_str().unwrap().contains(words), "{body}: {answer}");
    }
    let (_, listed) = host.get(&processes).await;
    assert_eq!(listed["items"], json!([]));

    // On a named node.
    let body = json!({"name": "cache", "service": "redis@1.0.0", "node": "n1", "ports": {"kv": p1}, "max_attempts": 1});
    let (status, created, etag) = call(&host, Method::POST, &processes, Some(&body), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    assert_eq!((created["state"].as_str(), etag.as_deref()), (Some("creating"), Some("\"1\"")));
    let running = wait_state(&host, "cache", "running").await;
    assert_eq!(running["active"]["service"], "redis@1.0.0");
    let recent = running["recent_actions"].as_array().unwrap();
    assert!(
        recent
            .iter()
            .any(|a| a["resource"] == "task[n1,process.cache/redis/start]" && a["outcome"] == "changed"),
        "{running:#}"
    );
    assert_eq!(ping(p1).await.as_deref(), Some("+PONG"));
    // The same name, and the same port on the same node, are refused.
    let (status, answer) = host.post(&processes, &body).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("process_exists")),
        "{answer}"
    );
    let taken = json!({"name": "other", "service": "redis@1.0.0", "node": "n1", "ports": {"kv": p1}});
    let (status, answer) = host.post(&processes, &taken).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("port_in_use")),
        "{answer}"
    );

    // Placed by the solver: n2, which runs fewer processes than n1.
    let (status, placed) = host
        .post(
            &processes,
            &json!({"name": "placed", "service": "redis@1.0.0", "ports": {"kv": p2}}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{placed}");
    assert_eq!(placed["node"], "n2", "{placed}");
    wait_state(&host, "placed", "running").await;
    assert_eq!(ping(p2).await.as_deref(), Some("+PONG"));
    // The list by state; an unknown state is refused, naming it.
    let names = |list: &Value| {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].clone())
            .collect::<Vec<_>>()
    };
    let (_, all) = host.get(&format!("{processes}?state=running,failed")).await;
    assert_eq!(names(&all), [json!("cache"), json!("placed")], "{all}");
    let (_, busy) = host.get(&format!("{processes}?state=creating,moving")).await;
    assert_eq!(names(&busy), Vec::<Value>::new(), "{busy}");
    let (status, answer) = host.get(&format!("{processes}?state=running,asleep")).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_process_request"))
    );
    assert!(answer["message"].as_str().unwrap().contains("`asleep`"), "{answer}");

    // An update naming a stale revision is refused; with the current one it applies.
    let path = format!("{processes}/cache");
    let (_, now, etag) = call(&host, Method::GET, &path, None, None).await;
    let etag = etag.unwrap();
    assert_eq!(etag, format!("\"{}\"", now["revision"]));
    let patch = json!({"config": {"maxmemory": "10mb"}});
    let (status, answer, _) = call(&host, Method::PATCH, &path, Some(&patch), Some("\"1\"")).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("version_conflict")),
        "{answer}"
    );
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains(&format!("at revision {}", now["revision"])),
        "{answer}"
    );
    let (status, updating, _) = call(&host, Method::PATCH, &path, Some(&patch), Some(&etag)).await;
    assert_eq!(
        (status, updating["state"].as_str()),
        (StatusCode::ACCEPTED, Some("updating")),
        "{updating}"
    );
    let (status, answer, _) = call(&host, Method::PATCH, &path, Some(&patch), None).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("invalid_transition")),
        "{answer}"
    );
    wait_state(&host, "cache", "running").await;
    assert!(config_get(p1, "maxmemory").await.contains("10485760"), "maxmemory not applied");

    // A failing update (an address this machine does not have) is rolled back to what ran.
    let bad = json!({"config": {"maxmemory": "10mb", "bind": "203.0.113.7"}});
    let (status, answer, _) = call(&host, Method::PATCH, &path, Some(&bad), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let back = host
        .wait_for(&path, "rolled back", OP_TIMEOUT, |_, p| {
            p["state"] == "running" && !p["failure"].is_null()
        })
        .await;
    assert!(back["config"].get("bind").is_none(), "the configuration that ran is back: {back}");
    assert!(
        back["failure"]["task"].as_str().unwrap().contains("process.cache/redis/start"),
        "{back}"
    );
    wait_for("the rolled-back process to serve", OP_TIMEOUT, async || {
        ping(p1).await.as_deref() == Some("+PONG")
    })
    .await;

    // The action log has the process's tasks like any resource's.
    let (_, log) = host.get(&format!("/environments/{ENV}/actions?limit=500")).await;
    assert!(log.to_string().contains("process.cache/redis/start"), "{log}");

    // Terminate: stopped and removed, then gone.
    let (_, _, etag) = call(&host, Method::GET, &path, None, None).await;
    let (status, answer, _) = call(&host, Method::DELETE, &path, None, Some("\"999\"")).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("version_conflict")),
        "{answer}"
    );
    let (status, gone, _) = call(&host, Method::DELETE, &path, None, etag.as_deref()).await;
    assert_eq!(
        (status, gone["state"].as_str()),
        (StatusCode::ACCEPTED, Some("terminating")),
        "{gone}"
    );
    host.wait_for(&path, "terminated", OP_TIMEOUT, |code, _| code == StatusCode::NOT_FOUND)
        .await;
    assert_eq!(ping(p1).await, None, "redis still answers after terminate");
    let (status, _) = host.delete(&format!("{processes}/placed")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    host.wait_for(&format!("{processes}/placed"), "terminated", OP_TIMEOUT, |code, _| {
        code == StatusCode::NOT_FOUND
    })
    .await;
    assert_eq!(ping(p2).await, None);
    host.stop().await;
}

/// The message schema of the `kv` interface, version 1.0.0.
/// A service whose scripts only log (`$LOG`), declaring port `spot` (7000 unless a process says
/// otherwise), and needing `needs` of its node.
fn spot_service(name: &str, needs: Value) -> Value {
    let log = |what: &str| format!("echo \"$ORC_NODE {what}\" >> \"$LOG\"");
    json!({
        "name": name, "version": "1.0.0",
        "automator": orc_plugin_artifacts::SHELL.digest,
        "config": {"scripts": {"start": log("start"), "stop": log("stop"), "remove": log("remove")}},
        "config_schema": {"type": "object"},
        "ports": [{"name": "spot", "port": 7000}],
        "needs": needs,
        "interfaces": []
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_solver_places_a_process_where_its_ports_are_free_and_fewest_processes_run() {
    let host = start_host(1).await;
    // n1's rack is odd, n2's even.
    let _sshd = nodes(&host, 2).await;
    publish_service(&host, &spot_service("spot", json!({}))).await;
    publish_service(&host, &spot_service("even", json!({"labels": {"rack": "even"}}))).await;
    let work = tempfile::tempdir().unwrap();
    let processes = format!("/environments/{ENV}/processes");
    let config = json!({"log": work.path().join("log")});
    let create = |name: &str, service: &str, node: Option<&str>, port: u16| {
        let mut body = json!({"name": name, "service": service, "ports": {"spot": port}, "config": config});
        if let Some(node) = node {
            body["node"] = json!(node);
        }
        let (host, processes) = (&host, &processes);
        async move { host.post(processes, &body).await }
    };
    let placed = |answer: &Value| answer["node"].as_str().unwrap_or_default().to_string();

    let (status, a) = create("a", "spot@1.0.0", Some("n1"), 7000).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{a}");
    // n2 runs fewer processes (none).
    let (status, b) = create("b", "spot@1.0.0", None, 7001).await;
    assert_eq!((status, placed(&b)), (StatusCode::ACCEPTED, "n2".into()), "{b}");
    // Port 7000 is taken on n1 by `a`, though both run one process.
    let (status, c) = create("c", "spot@1.0.0", None, 7000).await;
    assert_eq!((status, placed(&c)), (StatusCode::ACCEPTED, "n2".into()), "{c}");
    // n1 runs fewer (1 against 2) but is not in the even rack the service needs.
    let (status, e) = create("e", "even@1.0.0", None, 7003).await;
    assert_eq!((status, placed(&e)), (StatusCode::ACCEPTED, "n2".into()), "{e}");
    // Named, a node that does not meet the needs is refused, naming it and the needs.
    let (status, answer) = create("e2", "even@1.0.0", Some("n1"), 7004).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("node_unsuitable")),
        "{answer}"
    );
    let message = answer["message"].as_str().unwrap();
    assert!(message.contains("`n1`") && message.contains("even"), "{answer}");
    // n1 runs fewer again (1 against 3).
    let (status, d) = create("d", "spot@1.0.0", None, 7002).await;
    assert_eq!((status, placed(&d)), (StatusCode::ACCEPTED, "n1".into()), "{d}");
    // Port 7000 is taken on every node: refused, naming each holder; nothing is kept.
    let (status, answer) = create("f", "spot@1.0.0", None, 7000).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_process_request")),
        "{answer}"
    );
    let message = answer["message"].as_str().unwrap();
    assert!(
        message.contains("port 7000 on `n1` by process `a`") && message.contains("port 7000 on `n2` by process `c`"),
        "{answer}"
    );
    let (status, _) = host.get(&format!("{processes}/f")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Moved where the solver puts it: the only other node holds its port.
    for name in ["a", "b", "c", "d", "e"] {
        wait_state(&host, name, "running").await;
    }
    let (status, answer) = host.post(&format!("{processes}/a/move"), &json!({})).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_process_request")),
        "{answer}"
    );
    assert!(
        answer["message"].as_str().unwrap().contains("port 7000 on `n2` by process `c`"),
        "{answer}"
    );
    // `b` moved: to n1, the one other node.
    let (status, moved) = host.post(&format!("{processes}/b/move"), &json!({})).await;
    assert_eq!((status, placed(&moved)), (StatusCode::ACCEPTED, "n1".into()), "{moved}");
    wait_state(&host, "b", "running").await;

    // Interfaces offering several versions connect at the highest version both offer.
    let version = |v: &str, title: &str| json!({"version": v, "schema": {"type": "object", "title": title}});
    let with = |name: &str, role: &str, versions: Value| {
        let mut doc = spot_service(name, json!({}));
        doc["interfaces"] = json!([{"name": "feed", "role": role, "allow_multiple": true, "versions": versions}]);
        if role == "provides" {
            doc["interfaces"][0]["port"] = json!("spot");
        }
        doc
    };
    publish_service(
        &host,
        &with(
            "feeder",
            "provides",
            json!([version("1.0.0", "v1"), version("2.0.0", "v2"), version("3.0.0", "v3")]),
        ),
    )
    .await;
    publish_service(
        &host,
        &with("reader", "requires", json!([version("1.0.0", "v1"), version("2.0.0", "v2")])),
    )
    .await;
    publish_service(&host, &with("legacy-reader", "requires", json!([version("1.0.0", "v1")]))).await;
    for (name, service, port) in [
        ("feed", "feeder@1.0.0", 7101),
        ("r2", "reader@1.0.0", 7102),
        ("r1", "legacy-reader@1.0.0", 7103),
    ] {
        let (status, p) = create(name, service, Some("n2"), port).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    }
    for (reader, agreed) in [("r2", "2.0.0"), ("r1", "1.0.0")] {
        let body = json!({"from": {"process": reader, "interface": "feed"}, "to": {"process": "feed", "interface": "feed"}});
        let (status, c) = host.post(&format!("/environments/{ENV}/connections"), &body).await;
        assert_eq!((status, c["version"].as_str()), (StatusCode::CREATED, Some(agreed)), "{c}");
    }
}

/// (The sshd nodes of all tests are this machine: a redis process's name is unique across the
/// suite, since the redis automator names its files after the process.)
/// A process's tasks are resources like any other: a dryrun checks them and changes nothing, a
/// redis killed by hand is seen by the next dryrun and started again by a repair, each action in
/// the action log; a create that fails is undone and the process left `failed`, its failure kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_process_is_seen_by_a_dryrun_and_restored_by_a_repair() {
    use tokio::io::AsyncWriteExt;
    let _servers = RedisProcesses(&["healer", "unbound"]);
    let host = start_host(1).await;
    let _sshd = nodes(&host, 1).await;
    publish_service(&host, &redis_service()).await;
    let processes = format!("/environments/{ENV}/processes");
    let port = free_port();
    let (status, p) = host
        .post(
            &processes,
            &json!({"name": "healer", "service": "redis@1.0.0", "node": "n1", "ports": {"kv": port}}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    wait_state(&host, "healer", "running").await;
    settled_version(&host).await;

    let dryrun = host.run_to_completion(&format!("/environments/{ENV}/dryrun"), None).await;
    let summary = &dryrun["report"]["summary"];
    assert_eq!(
        (summary["would_change"].as_i64(), summary["unchecked"].as_i64()),
        (Some(0), Some(0)),
        "{dryrun:#}"
    );
    assert!(summary["no_change"].as_i64().unwrap() >= 4, "{dryrun:#}");

    // Killed behind the orchestrator's back.
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(b"SHUTDOWN NOSAVE\r\n").await.unwrap();
    drop(s);
    for _ in 0..100 {
        if ping(port).await.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ping(port).await, None, "redis still answers");
    let dryrun = host.run_to_completion(&format!("/environments/{ENV}/dryrun"), None).await;
    assert_eq!(dryrun["report"]["summary"]["would_change"], 1, "{dryrun:#}");
    assert_eq!(ping(port).await, None, "a dryrun changed something");
    let changed: Vec<&Value> = dryrun["report"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["finding"] == "would_change")
        .collect();
    assert_eq!(changed.len(), 1, "{dryrun:#}");
    assert_eq!(changed[0]["resource"], "task[n1,process.healer/redis/start]", "{dryrun:#}");

    host.run_to_completion(&format!("/environments/{ENV}/repair"), None).await;
    assert_eq!(ping(port).await.as_deref(), Some("+PONG"));
    let (_, actions) = host
        .get(&format!(
            "/environments/{ENV}/actions?resource={}&kind=repair",
            crate::support::paths::encode("task[n1,process.healer/redis/start]")
        ))
        .await;
    assert!(
        actions["items"].as_array().unwrap().iter().any(|a| a["outcome"] == "changed"),
        "{actions:#}"
    );

    // A create that cannot succeed (an address no interface has): undone, `failed`, the failure kept.
    let (status, p) = host
        .post(
            &processes,
            &json!({"name": "unbound", "service": "redis@1.0.0", "node": "n1", "ports": {"kv": free_port()},
                "config": {"bind": "203.0.113.7"}, "max_attempts": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    let failed = wait_state(&host, "unbound", "failed").await;
    assert!(
        failed["failure"]["task"]
            .as_str()
            .unwrap()
            .starts_with("task[n1,process.unbound/redis/"),
        "{failed:#}"
    );
    assert!(failed["active"].is_null(), "{failed:#}");
    let (_, list) = host.get(&format!("{processes}?state=failed")).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(ping(port).await.as_deref(), Some("+PONG"), "the other process is untouched");
}

/// The released version once nothing waits for the releaser.
async fn settled_version(host: &Host) -> Value {
    let env = host
        .wait_for(&format!("/environments/{ENV}"), "nothing to release", OP_TIMEOUT, |_, e| {
            e["processes_release_pending"] == false
        })
        .await;
    env["released_version"].clone()
}

/// A secret of a process's configuration reaches its automator, and no view of the host shows
/// it: not the process, not the intent version its tasks are in, not a diff between versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_in_a_process_configuration_reaches_the_node_and_is_never_shown() {
    let host = start_host(1).await;
    let _sshd = nodes(&host, 1).await;
    let mut service = spot_service("vault", json!({}));
    service["config"]["scripts"]["start"] = json!("printf '%s' \"$CREDENTIALS\" > \"$OUT\"");
    service["config_schema"] = json!({"type": "object", "properties": {
        "out": {"type": "string"},
        "credentials": {"type": "object", "properties": {
            "user": {"type": "string"},
            "token": {"type": "string", "writeOnly": true}
        }}
    }});
    publish_service(&host, &service).await;
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("seen");
    let path = format!("/environments/{ENV}/processes/vault");
    let config = |token: &str| json!({"out": out, "credentials": {"user": "app", "token": token}});
    let (status, p) = host
        .post(
            &format!("/environments/{ENV}/processes"),
            &json!({"name": "vault", "service": "vault@1.0.0", "node": "n1", "config": config("s3cr3t-one")}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    wait_state(&host, "vault", "running").await;
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(seen, json!({"user": "app", "token": "s3cr3t-one"}));
    let first = settled_version(&host).await;

    let (status, p, _) = call(&host, Method::PATCH, &path, Some(&json!({"config": config("s3cr3t-two")})), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    let running = wait_state(&host, "vault", "running").await;
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(seen["token"], "s3cr3t-two");
    let second = settled_version(&host).await;
    assert_ne!(first, second);

    assert_eq!(
        running["config"]["credentials"],
        json!({"user": "app", "token": "<redacted>"}),
        "{running}"
    );
    let (status, v) = host.get(&format!("/environments/{ENV}/intents/{second}")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let tasks: Vec<&Value> = v["intent"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["id"].as_str().unwrap().contains(",process.vault/"))
        .collect();
    assert!(!tasks.is_empty(), "{v}");
    for t in &tasks {
        assert_eq!(t["sensitive"], json!(["/config/credentials/token"]), "{t}");
        assert_eq!(t["attributes"]["config"]["credentials"]["token"], "<redacted>", "{t}");
        assert_eq!(t["attributes"]["config"]["credentials"]["user"], "app", "{t}");
    }
    let (status, diff) = host.get(&format!("/environments/{ENV}/intents/{first}/diff/{second}")).await;
    assert_eq!(status, StatusCode::OK, "{diff}");
    assert!(
        diff["changed"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["fields"].as_array().unwrap())
            .any(|f| f["field"] == "attributes/config/credentials/token" && f["to"] == "<redacted>"),
        "{diff}"
    );
    for (what, body) in [
        ("process", running.to_string()),
        ("version", v.to_string()),
        ("diff", diff.to_string()),
    ] {
        assert!(!body.contains("s3cr3t"), "the {what} shows the secret: {body}");
    }
}

fn kv_schema() -> Value {
    json!({"type": "object", "required": ["command"], "properties": {"command": {"enum": ["GET", "SET"]}}})
}

/// A consumer of a `kv` peer, run by the `shell` automator: on start it writes `$KEY=$VALUE` to
/// the peer it is connected to (its address and port from its connections, under `peers`) with
/// `redis-cli`, reads it back and leaves what it read in `$OUT` — or `no kv peer`.
fn kv_client(version: &str, schema: Value) -> Value {
    let start = r#"addr=$(printf '%s' "$PEERS" | sed -n 's/.*"address":"\([^"]*\)".*/\1/p')
port=$(printf '%s' "$PEERS" | sed -n 's/.*"port":\([0-9][0-9]*\).*/\1/p')
if [ -z "$port" ]; then echo "no kv peer" > "$OUT"; exit 0; fi
redis-cli -h "$addr" -p "$port" SET "$KEY" "$VALUE" > /dev/null
redis-cli -h "$addr" -p "$port" GET "$KEY" > "$OUT""#;
    json!({
        "name": "kv-client", "version": version,
        "automator": orc_plugin_artifacts::SHELL.digest,
        "config": {"scripts": {"start": start, "stop": "rm -f \"$OUT\""}},
        "config_schema": {"type": "object", "required": ["key", "value", "out"], "properties": {
            "key": {"type": "string"}, "value": {"type": "string"}, "out": {"type": "string"}}},
        "connections_key": "peers",
        "interfaces": [{"name": "store", "role": "requires", "versions": [{"version": "1.0.0", "schema": schema}]}]
    })
}

async fn wait_file(path: &std::path::Path, content: &str) {
    wait_for(&format!("{} to hold {content:?}", path.display()), OP_TIMEOUT, async || {
        let now = std::fs::read_to_string(path).unwrap_or_default();
        if now.trim() == content { Ok(()) } else { Err(format!("{now:?}")) }
    })
    .await
}

// Named apart from the other tests' processes: every sshd node here is this machine, and a
// redis process's files are named after it.
//
// `n2`, the consumer's node, is an sshd in its own network namespace, cut off by taking its link
// down; `n1`, the provider's, listens on the bridge's address in the host's namespace, where the
// consumer reaches its redis. Needs root (namespaces), as the netns test does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connected_processes_exchange_data_and_a_change_to_a_cut_node_stays_pending() {
    let _servers = RedisProcesses(&["kvstore", "offsite"]);
    let network = crate::support::network::Network::create(1);
    let ns = &network.namespaces[0];
    // Declared after the network: stopped before its namespace is removed.
    let sshd = [
        orc_tests::sshd::Sshd::start_at(10, &network.host_address),
        orc_tests::sshd::Sshd::start_in_netns(&ns.name, &ns.address),
    ];
    let host = start_host(1).await;
    register_nodes(&host, &sshd).await;
    let mut redis = redis_service();
    redis["interfaces"][0]["allow_multiple"] = json!(false);
    redis["interfaces"][0]["versions"][0]["schema"] = kv_schema();
    publish_service(&host, &redis).await;
    publish_service(&host, &kv_client("1.0.0", kv_schema())).await;
    publish_service(&host, &kv_client("0.9.0", json!({"type": "object", "required": ["op"]}))).await;
    let processes = format!("/environments/{ENV}/processes");
    let connections = format!("/environments/{ENV}/connections");
    let work = tempfile::tempdir().unwrap();
    let port = free_port();
    let (status, p) = host
        .post(
            &processes,
            &json!({"name": "kvstore", "service": "redis@1.0.0", "node": "n1", "ports": {"kv": port},
                "config": {"bind": network.host_address, "protected_mode": false}}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    let client = |name: &str, version: &str| {
        json!({"name": name, "service": format!("kv-client@{version}"), "node": "n2",
            "config": {"key": "greeting", "value": format!("hello from {name}"), "out": work.path().join(name)}})
    };
    for (name, version) in [("app", "1.0.0"), ("app2", "1.0.0"), ("legacy", "0.9.0")] {
        let (status, p) = host.post(&processes, &client(name, version)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    }
    for name in ["kvstore", "app", "app2", "legacy"] {
        wait_state(&host, name, "running").await;
    }
    wait_file(&work.path().join("app"), "no kv peer").await;

    // Connected: the consumer finds its peer in its configuration and data flows.
    let body = json!({"from": {"process": "app", "interface": "store"}, "to": {"process": "kvstore", "interface": "kv"}});
    let (status, connection, tag) = call(&host, Method::POST, &connections, Some(&body), None).await;
    assert_eq!(status, StatusCode::CREATED, "{connection}");
    assert_eq!(tag.as_deref(), Some("\"1\""), "a connection is never changed: revision 1");
    assert_eq!(connection["version"], "1.0.0");
    assert_eq!(
        connection["interface_id"],
        orc_manifest::canonical::digest(&kv_schema()).to_string()
    );
    wait_file(&work.path().join("app"), "hello from app").await;
    let (_, app) = host.get(&format!("{processes}/app")).await;
    assert_eq!(app["connections"][0]["id"], connection["id"], "{app}");
    let one = format!("{connections}/{}", connection["id"].as_str().unwrap());
    let (status, got, tag) = call(&host, Method::GET, &one, None, None).await;
    assert_eq!((status, &got, tag.as_deref()), (StatusCode::OK, &connection, Some("\"1\"")));
    let (status, answer, _) = call(&host, Method::GET, &format!("{connections}/nope"), None, None).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_connection")),
        "{answer}"
    );

    // A redis of another environment, on the same node, is no peer of this one's processes.
    let staging = json!({"name": "staging", "settings": {"capabilities": {"node_commands": true}}});
    let (status, env) = host.post("/environments", &staging).await;
    assert_eq!(status, StatusCode::CREATED, "{env}");
    let (status, p) = host
        .post(
            "/environments/staging/processes",
            &json!({"name": "offsite", "service": "redis@1.0.0", "node": "n1", "ports": {"kv": free_port()}}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{p}");

    // Refusals, each with its reason and its culprit.
    let refusals = [
        (
            json!({"from": {"process": "app2", "interface": "store"}, "to": {"process": "offsite", "interface": "kv"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_process",
            "to.process: `offsite` is no process of environment `prod`",
        ),
        (
            json!({"from": {"process": "app", "interface": "store"}, "to": {"process": "kvstore", "interface": "kv"}}),
            StatusCode::CONFLICT,
            "connection_exists",
            "already",
        ),
        // The same two ends named the other way round.
        (
            json!({"from": {"process": "kvstore", "interface": "kv"}, "to": {"process": "app", "interface": "store"}}),
            StatusCode::CONFLICT,
            "connection_exists",
            "already",
        ),
        (
            json!({"from": {"process": "app2", "interface": "store"}, "to": {"process": "kvstore", "interface": "kv"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cardinality_exceeded",
            "`kvstore.kv` takes at most 1 connection; it has 1",
        ),
        (
            json!({"from": {"process": "legacy", "interface": "store"}, "to": {"process": "kvstore", "interface": "kv"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "incompatible_interfaces",
            "no version's message schema is shared",
        ),
        (
            json!({"from": {"process": "app2", "interface": "store"}, "to": {"process": "legacy", "interface": "store"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "incompatible_interfaces",
            "both require",
        ),
        (
            json!({"from": {"process": "ghost", "interface": "store"}, "to": {"process": "kvstore", "interface": "kv"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_process",
            "from.process: `ghost`",
        ),
        (
            json!({"from": {"process": "app2", "interface": "db"}, "to": {"process": "kvstore", "interface": "kv"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_interface",
            "from.interface: `db`",
        ),
    ];
    for (body, status, code, words) in refusals {
        let (got, answer) = host.post(&connections, &body).await;
        assert_eq!((got, answer["code"].as_str()), (status, Some(code)), "{body}: {answer}");
        assert!(answer["message"].as_str().unwrap().contains(words), "{body}: {answer}");
    }
    assert!(
        host.post(
            &connections,
            &json!({"from": {"process": "legacy", "interface": "store"}, "to": {"process": "kvstore", "interface": "kv"}})
        )
        .await
        .1["message"]
            .as_str()
            .unwrap()
            .contains("`legacy.store` (requires 1.0.0) and `kvstore.kv` (provides 1.0.0)"),
        "the refusal says what each side offers: the same label, another schema"
    );
    let (_, listed) = host.get(&connections).await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed}");
    // A delete naming another revision is refused, and deletes nothing; an unknown id is still
    // unknown whatever it names.
    let one = format!("{connections}/{}", connection["id"].as_str().unwrap());
    let (status, e, _) = call(&host, Method::DELETE, &one, None, Some("\"7\"")).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("version_conflict")),
        "{e}"
    );
    assert!(e["message"].as_str().unwrap().contains("is at revision 1, not"), "{e}");
    let (status, e, _) = call(&host, Method::DELETE, &format!("{connections}/nope"), None, Some("\"7\"")).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_connection")),
        "{e}"
    );
    let (_, listed) = host.get(&connections).await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed}");

    // The consumer's node is cut off the network: the change (the connection dropped) stays
    // pending, attempted again and again, until the node is back and the consumer has taken it.
    // Retries 5 s apart, doubling: the first is at 5 s, the next 10 s after it.
    let (status, answer, _) = call(
        &host,
        Method::PATCH,
        &format!("/environments/{ENV}"),
        Some(&json!({"settings": {"retry_interval_s": 5}})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    network.set_link(0, false);
    let (status, _) = host.delete(&format!("{connections}/{}", connection["id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::OK);
    let retried = |p: &Value| {
        p["items"].as_array().unwrap().iter().find(|i| i["process"] == "app").and_then(|i| {
            i["changes"]
                .as_array()
                .unwrap()
                .iter()
                // Attempted, and attempted again by the scheduler's own retry.
                .find(|c| c["attempts"].as_i64().unwrap_or(0) >= 2 && c["next_retry_at"].is_i64())
                .cloned()
        })
    };
    let pending = host
        .wait_for(&format!("/environments/{ENV}/pending"), "a change retried", OP_TIMEOUT, |_, p| {
            retried(p).is_some()
        })
        .await;
    let change = retried(&pending).unwrap();
    assert!(
        change["last_error"].is_string() && change["since"].as_i64().unwrap() > 0,
        "{pending}"
    );
    assert_eq!(std::fs::read_to_string(work.path().join("app")).unwrap().trim(), "hello from app");
    // Back: the node answers its re-verification, and the scheduler applies the change then,
    // not when its back-off says (nobody asks it to).
    network.set_link(0, true);
    wait_file(&work.path().join("app"), "no kv peer").await;
    let applied_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let due = change["next_retry_at"].as_i64().unwrap();
    assert!(
        applied_at < due,
        "applied at {applied_at}, not before the retry due at {due}: {change}"
    );
    host.wait_for(&format!("/environments/{ENV}/pending"), "nothing pending", OP_TIMEOUT, |_, p| {
        p["items"].as_array().unwrap().is_empty()
    })
    .await;

    // Terminating a connected process drops its connections first.
    let (status, c2) = host
        .post(
            &connections,
            &json!({"from": {"process": "app2", "interface": "store"}, "to": {"process": "kvstore", "interface": "kv"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{c2}");
    wait_file(&work.path().join("app2"), "hello from app2").await;
    let (status, _) = host.delete(&format!("{processes}/kvstore")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (_, listed) = host.get(&connections).await;
    assert_eq!(listed["items"], json!([]));
    wait_file(&work.path().join("app2"), "no kv peer").await;
    host.wait_for(&format!("{processes}/kvstore"), "terminated", OP_TIMEOUT, |code, _| {
        code == StatusCode::NOT_FOUND
    })
    .await;
    host.stop().await;
}

/// A `shell` service that logs what it does on which node to `$LOG`; `role` makes it provide or
/// require the `echo` interface. A requirer writes the node of its peer (from its connections,
/// under `peers`) to `$OUT` on start.
fn echo_service(name: &str, role: &str) -> Value {
    let log = |what: &str| format!("echo \"$ORC_NODE {what}\" >> \"$LOG\"");
    let start = if role == "provides" {
        log("start")
    } else {
        format!(
            "printf '%s' \"$PEERS\" | sed -n 's/.*\"node\":\"\\([^\"]*\\)\".*/\\1/p' > \"$OUT\"; {}",
            log("start")
        )
    };
    let mut interface = json!({"name": "echo", "role": role, "allow_multiple": true,
        "versions": [{"version": "1.0.0", "schema": {"type": "object", "title": "echo"}}]});
    if role == "provides" {
        interface["port"] = json!("echo");
    }
    json!({
        "name": name, "version": "1.0.0",
        "automator": orc_plugin_artifacts::SHELL.digest,
        "config": {"scripts": {"start": start, "stop": log("stop"), "remove": log("remove")}},
        "config_schema": {"type": "object"},
        "ports": [{"name": "echo", "port": 7}],
        "connections_key": "peers",
        "interfaces": [interface]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_provider_starts_before_it_stops_and_its_peer_follows() {
    let host = start_host(1).await;
    let _sshd = nodes(&host, 3).await;
    publish_service(&host, &echo_service("echo-server", "provides")).await;
    publish_service(&host, &echo_service("echo-client", "requires")).await;
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("log");
    let out = work.path().join("peer-node");
    let processes = format!("/environments/{ENV}/processes");
    let config = json!({"log": log, "out": out});
    for (name, service, node) in [("server", "echo-server@1.0.0", "n1"), ("client", "echo-client@1.0.0", "n3")] {
        let (status, p) = host
            .post(
                &processes,
                &json!({"name": name, "service": service, "node": node, "config": config}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{p}");
        wait_state(&host, name, "running").await;
    }
    let body = json!({"from": {"process": "client", "interface": "echo"}, "to": {"process": "server", "interface": "echo"}});
    let (status, c) = host.post(&format!("/environments/{ENV}/connections"), &body).await;
    assert_eq!(status, StatusCode::CREATED, "{c}");
    wait_file(&out, "n1").await;

    // Moving to its own node, or from a state that runs nothing, is refused.
    let path = format!("{processes}/server");
    let (status, answer) = host.post(&format!("{path}/move"), &json!({"node": "n1"})).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_process_request")),
        "{answer}"
    );
    let (_, _, etag) = call(&host, Method::GET, &path, None, None).await;
    let (status, answer, _) = call(
        &host,
        Method::POST,
        &format!("{path}/move"),
        Some(&json!({"node": "n2"})),
        Some("\"0\""),
    )
    .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("version_conflict")),
        "{answer}"
    );
    let (status, moving, _) = call(
        &host,
        Method::POST,
        &format!("{path}/move"),
        Some(&json!({"node": "n2"})),
        etag.as_deref(),
    )
    .await;
    assert_eq!(
        (status, moving["state"].as_str()),
        (StatusCode::ACCEPTED, Some("moving")),
        "{moving}"
    );
    let (status, answer) = host.post(&format!("{path}/move"), &json!({})).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("invalid_transition")),
        "{answer}"
    );
    let moved = wait_state(&host, "server", "running").await;
    assert_eq!(moved["node"], "n2");
    // The peer follows, told once the move is done (by the releaser's next round, which waits a
    // while for other follow-ups): from the move's end until it has taken the change, the
    // client shows it pending, first as queued. Once nothing is pending, it knows.
    let pending_path = format!("/environments/{ENV}/pending");
    let (_, pending) = host.get(&pending_path).await;
    let items = pending["items"].as_array().unwrap();
    let told = items.iter().find(|i| i["process"] == "client").map(|i| i["changes"][0].clone());
    let told = told.unwrap_or_else(|| panic!("the server moved and its client has nothing pending: {pending}"));
    if told["step"] == "connections" {
        assert_eq!(
            (told["status"].as_str(), told["task"].as_str()),
            (Some("queued"), Some("process.client/connections")),
            "{pending}"
        );
        let (_, client) = host.get(&format!("{processes}/client")).await;
        assert_eq!(client["pending"][0], told, "{client}");
    }
    host.wait_for(&pending_path, "nothing pending", OP_TIMEOUT, |_, p| {
        p["items"].as_array().unwrap().is_empty()
    })
    .await;
    assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), "n2");
    let events: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(str::to_string).collect();
    let at = |line: &str| {
        events
            .iter()
            .position(|e| e == line)
            .unwrap_or_else(|| panic!("no `{line}` in {events:#?}"))
    };
    assert!(
        at("n2 start") < at("n1 stop"),
        "started on the new node before stopped on the old: {events:#?}"
    );
    assert!(at("n1 stop") < at("n1 remove"), "{events:#?}");

    // Without a node the solver picks one other than its own.
    let (status, moving) = host.post(&format!("{path}/move"), &json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{moving}");
    assert_ne!(moving["node"], "n2", "{moving}");
    let moved = wait_state(&host, "server", "running").await;
    wait_file(&out, moved["node"].as_str().unwrap()).await;

    // An update to a new version of its service runs the new version's steps where it runs;
    // another service, or a version the catalog lacks, is refused.
    let mut newer = echo_service("echo-server", "provides");
    newer["version"] = json!("1.1.0");
    newer["config"]["scripts"]["start"] = json!("echo \"$ORC_NODE start 1.1\" >> \"$LOG\"");
    publish_service(&host, &newer).await;
    for (service, code) in [
        ("echo-client@1.0.0", "invalid_process_request"),
        ("echo-server@9.9.9", "unknown_service"),
    ] {
        let (status, answer, _) = call(&host, Method::PATCH, &path, Some(&json!({"service": service})), None).await;
        assert_eq!(answer["code"], code, "{service}: {status} {answer}");
    }
    let (status, updating, _) = call(&host, Method::PATCH, &path, Some(&json!({"service": "echo-server@1.1.0"})), None).await;
    assert_eq!(
        (status, updating["state"].as_str()),
        (StatusCode::ACCEPTED, Some("updating")),
        "{updating}"
    );
    let updated = wait_state(&host, "server", "running").await;
    assert_eq!(
        (updated["service"].as_str(), updated["active"]["service"].as_str()),
        (Some("echo-server@1.1.0"), Some("echo-server@1.1.0")),
        "{updated}"
    );
    let node = updated["node"].as_str().unwrap();
    let events = std::fs::read_to_string(&log).unwrap();
    assert!(events.lines().any(|l| l == format!("{node} start 1.1")), "{events}");

    // Processes are resource sets of their own: an operator's intent and resource set keep them.
    let intent = json!({"resources": [{"id": "file[local,/motd]", "adaptor": "file@0.1.0", "attributes": {"content": "hi"}}]});
    let (status, v) = host.post(&format!("/environments/{ENV}/intents"), &intent).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let (status, v, _) = host
        .send_text(
            Method::PUT,
            &format!("/environments/{ENV}/resource-sets/extra"),
            Some(&json!({"resources": []})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let (_, latest) = host.get(&format!("/environments/{ENV}/intents/{}", v["version"])).await;
    let ids: Vec<&str> = latest["intent"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    for process in ["server", "client"] {
        assert_eq!(
            ids.iter().filter(|id| id.contains(&format!(",process.{process}/"))).count(),
            5,
            "{ids:?}"
        );
    }
    let (_, server) = host.get(&path).await;
    assert_eq!(server["state"], "running");
    assert!(server["pending"].as_array().unwrap().is_empty(), "{server}");
    host.stop().await;
}

/// A `shell` service whose start logs `$ORC_NODE start` to `$LOG` and writes its connections as
/// delivered (`$PEERS`, JSON) to `$OUT`; a provider of `echo` that asks where its consumers run
/// when `consumer_addresses`.
fn telling_service(name: &str, role: &str, consumer_addresses: bool) -> Value {
    let mut interface = json!({"name": "echo", "role": role, "allow_multiple": true,
        "versions": [{"version": "1.0.0", "schema": {"type": "object", "title": "echo"}}]});
    if role == "provides" {
        interface["port"] = json!("echo");
        interface["consumer_addresses"] = json!(consumer_addresses);
    }
    json!({
        "name": name, "version": "1.0.0",
        "automator": orc_plugin_artifacts::SHELL.digest,
        // `$FAIL_ON`: a node where start fails.
        "config": {"scripts": {"start": "[ \"$ORC_NODE\" != \"$FAIL_ON\" ] && echo \"$ORC_CLUSTER $ORC_NODE start\" >> \"$LOG\" && printf '%s' \"$PEERS\" > \"$OUT\"",
            "stop": "true", "remove": "true"}, "fail_on": ""},
        "config_schema": {"type": "object"},
        "ports": [{"name": "echo", "port": 7, "config_key": "port"}],
        "connections_key": "peers",
        "interfaces": [interface]
    })
}

/// A consumer that moves is no reason to restart its providers: one that does not ask where its
/// consumers run is told who is connected and at which version, and is left alone by the move; one
/// that asks (`consumer_addresses`) is told the consumer's node and address, and follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_consumer_reconfigures_only_the_providers_that_ask_where_it_runs() {
    let host = start_host(1).await;
    let _sshd = nodes(&host, 3).await;
    publish_service(&host, &telling_service("plain-server", "provides", false)).await;
    publish_service(&host, &telling_service("asking-server", "provides", true)).await;
    publish_service(&host, &telling_service("told-client", "requires", false)).await;
    for (service, told) in [("asking-server", true), ("plain-server", false), ("told-client", true)] {
        let (status, doc) = host.get(&format!("/services/{service}/1.0.0")).await;
        assert_eq!(doc["interfaces"][0]["told_peer_location"], told, "{status} {doc}");
    }
    let work = tempfile::tempdir().unwrap();
    let file = |process: &str, what: &str| work.path().join(format!("{process}.{what}"));
    let processes = format!("/environments/{ENV}/processes");
    for (name, service, node, port) in [
        ("plain", "plain-server@1.0.0", "n1", 7001),
        ("asking", "asking-server@1.0.0", "n1", 7002),
        ("consumer", "told-client@1.0.0", "n2", 7003),
    ] {
        let config = json!({"log": file(name, "log"), "out": file(name, "out")});
        let (status, p) = host
            .post(
                &processes,
                &json!({"name": name, "service": service, "node": node, "config": config, "ports": {"echo": port}}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    }
    for name in ["plain", "asking", "consumer"] {
        wait_state(&host, name, "running").await;
    }
    for server in ["plain", "asking"] {
        let body = json!({"from": {"process": "consumer", "interface": "echo"}, "to": {"process": server, "interface": "echo"}});
        let (status, c) = host.post(&format!("/environments/{ENV}/connections"), &body).await;
        assert_eq!(status, StatusCode::CREATED, "{c}");
    }
    let pending_path = format!("/environments/{ENV}/pending");
    let settled = || async {
        host.wait_for(&pending_path, "nothing pending", OP_TIMEOUT, |_, p| {
            p["items"].as_array().unwrap().is_empty()
        })
        .await;
    };
    settled().await;
    let told = |process: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(file(process, "out")).unwrap();
        let peers: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{process} was told {text:?}: {e}"));
        peers["echo"].as_array().cloned().unwrap_or_else(|| panic!("{process}: {peers}"))
    };
    let starts = |process: &str| std::fs::read_to_string(file(process, "log")).unwrap().lines().count();
    // The consumer knows where both run; only the asking provider knows where the consumer runs.
    let consumer = told("consumer");
    assert_eq!(consumer.len(), 2, "{consumer:?}");
    for peer in &consumer {
        assert!(
            peer["node"] == "n1" && peer["address"].is_string() && peer["port"].is_u64(),
            "{peer}"
        );
    }
    for server in ["plain", "asking"] {
        let peers = told(server);
        assert_eq!(peers.len(), 1, "{server}: {peers:?}");
        assert!(
            peers[0]["peer"] == "consumer" && peers[0]["version"] == "1.0.0" && peers[0]["id"].is_string(),
            "{peers:?}"
        );
    }
    let plain = &told("plain")[0];
    assert!(plain.get("node").is_none() && plain.get("address").is_none(), "{plain}");
    assert!(
        told("asking")[0]["node"] == "n2" && told("asking")[0]["address"].is_string(),
        "{:?}",
        told("asking")
    );
    let plain_starts = starts("plain");

    let (status, moving) = host.post(&format!("{processes}/consumer/move"), &json!({"node": "n3"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{moving}");
    let moved = wait_state(&host, "consumer", "running").await;
    assert_eq!(moved["node"], "n3");
    settled().await;
    assert_eq!(told("asking")[0]["node"], "n3", "the asking provider follows its consumer");
    assert_eq!(
        starts("plain"),
        plain_starts,
        "the provider that did not ask was restarted by its consumer's move"
    );
    let (_, plain) = host.get(&format!("{processes}/plain")).await;
    assert!(plain["pending"].as_array().unwrap().is_empty(), "{plain}");
    host.stop().await;
}

/// Creates `server` on `n1` and `client` on `n2` (both logging their starts to one `log`),
/// connects them and waits until nothing is pending; the processes path.
async fn server_and_client(host: &Host, work: &std::path::Path, server_attempts: u32) -> String {
    publish_service(host, &telling_service("dest-server", "provides", false)).await;
    publish_service(host, &telling_service("dest-client", "requires", false)).await;
    let processes = format!("/environments/{ENV}/processes");
    for (name, service, node, port, attempts) in [
        ("server", "dest-server@1.0.0", "n1", 7101, server_attempts),
        ("client", "dest-client@1.0.0", "n2", 7102, 3),
    ] {
        let config = json!({"log": work.join("log"), "out": work.join(name), "fail_on": "n3"});
        let body = json!({"name": name, "service": service, "node": node, "config": config,
            "ports": {"echo": port}, "max_attempts": attempts});
        let (status, p) = host.post(&processes, &body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{p}");
        wait_state(host, name, "running").await;
    }
    let body = json!({"from": {"process": "client", "interface": "echo"}, "to": {"process": "server", "interface": "echo"}});
    let (status, c) = host.post(&format!("/environments/{ENV}/connections"), &body).await;
    assert_eq!(status, StatusCode::CREATED, "{c}");
    nothing_pending(host).await;
    processes
}

async fn nothing_pending(host: &Host) {
    host.wait_for(&format!("/environments/{ENV}/pending"), "nothing pending", OP_TIMEOUT, |_, p| {
        p["items"].as_array().unwrap().is_empty()
    })
    .await;
}

/// The node `process` was last told its one `echo` peer runs on (its `$OUT`).
fn told_node(work: &std::path::Path, process: &str) -> String {
    let peer = told_peer(work, process);
    peer["node"].as_str().unwrap_or_else(|| panic!("{process}: {peer}")).to_string()
}

/// The first `echo` peer `process` was told at its last start (the file its script writes).
fn told_peer(work: &std::path::Path, process: &str) -> Value {
    let peers: Value = serde_json::from_str(&std::fs::read_to_string(work.join(process)).unwrap()).unwrap();
    peers["echo"][0].clone()
}

/// A consumer moved together with its provider (the consumer first, as an operator emptying a
/// node might) is told at once where the provider goes, and its `configure` waits for the
/// provider's `start` there: it starts once on its new node, for the provider's new node, after
/// the provider started there; not first for the old node and again when told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_moved_with_its_provider_starts_once_for_where_the_provider_goes() {
    let host = start_host(1).await;
    let _sshd = nodes(&host, 3).await;
    let work = tempfile::tempdir().unwrap();
    let processes = server_and_client(&host, work.path(), 3).await;
    assert_eq!(told_node(work.path(), "client"), "n1");
    let before = std::fs::read_to_string(work.path().join("log")).unwrap().lines().count();
    for (name, node) in [("client", "n1"), ("server", "n2")] {
        let (status, moving) = host.post(&format!("{processes}/{name}/move"), &json!({"node": node})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{moving}");
    }
    for name in ["client", "server"] {
        wait_state(&host, name, "running").await;
    }
    nothing_pending(&host).await;
    assert_eq!(told_node(work.path(), "client"), "n2");
    let log = std::fs::read_to_string(work.path().join("log")).unwrap();
    let since: Vec<&str> = log.lines().skip(before).collect();
    assert_eq!(
        since,
        ["process.server n2 start", "process.client n1 start"],
        "each started once on its new node, the client after its server"
    );
    // Once nothing waits for the releaser, the released version is the rows' tasks: the old
    // nodes' removals, done, are gone from it (dropped unhurried, in one version for a burst).
    let env = host
        .wait_for(&format!("/environments/{ENV}"), "nothing to release", OP_TIMEOUT, |_, e| {
            e["processes_release_pending"] == false
        })
        .await;
    let mut tasks = process_tasks_of(&host, &env["released_version"]).await;
    tasks.sort();
    let nodes: Vec<&str> = tasks.iter().map(|t| t.split(',').next().unwrap()).collect();
    assert!(
        tasks.len() == 10 && nodes.iter().filter(|n| **n == "task[n2").count() == 5,
        "the server's five on n2 and the client's five on n1, nothing else: {tasks:#?}"
    );
    host.stop().await;
}

/// A provider whose move fails goes back, and its consumer, told the destination and waiting for
/// the provider's start there, is told where it still runs: the same as it runs with, so it is
/// never restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_waiting_for_a_provider_whose_move_fails_stays_as_it_was() {
    let host = start_host(1).await;
    let _sshd = nodes(&host, 3).await;
    let work = tempfile::tempdir().unwrap();
    let processes = server_and_client(&host, work.path(), 1).await;
    let before = std::fs::read_to_string(work.path().join("log")).unwrap();
    // `fail_on` n3: the server's start fails there, once, and it is rolled back.
    let (status, moving) = host.post(&format!("{processes}/server/move"), &json!({"node": "n3"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{moving}");
    let back = host
        .wait_for(&format!("{processes}/server"), "rolled back", OP_TIMEOUT, |_, p| {
            p["state"] == "running" && !p["failure"].is_null()
        })
        .await;
    assert_eq!(back["node"], "n1", "{back}");
    nothing_pending(&host).await;
    assert_eq!(told_node(work.path(), "client"), "n1");
    assert_eq!(
        std::fs::read_to_string(work.path().join("log")).unwrap(),
        before,
        "nothing started again"
    );
    let (_, client) = host.get(&format!("{processes}/client")).await;
    assert!(
        client["state"] == "running" && client["pending"].as_array().unwrap().is_empty(),
        "{client}"
    );
    host.stop().await;
}

/// A provider updated to another port is a provider moving too: its consumers are told the new
/// port when the update begins, their `configure` and `start` waiting for its `start` with it, so
/// a consumer is reconfigured once, after the provider listens there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_updated_to_another_port_is_followed_by_its_consumer() {
    let host = start_host(1).await;
    let _sshd = nodes(&host, 3).await;
    let work = tempfile::tempdir().unwrap();
    let processes = server_and_client(&host, work.path(), 3).await;
    let port = |process: &str| {
        let peer = told_peer(work.path(), process);
        peer["port"].as_u64().unwrap_or_else(|| panic!("{process}: {peer}"))
    };
    assert_eq!(port("client"), 7101);
    let before = std::fs::read_to_string(work.path().join("log")).unwrap().lines().count();
    let (status, updating, _) = call(
        &host,
        Method::PATCH,
        &format!("{processes}/server"),
        Some(&json!({"ports": {"echo": 7111}})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{updating}");
    wait_state(&host, "server", "running").await;
    nothing_pending(&host).await;
    assert_eq!(port("client"), 7111, "the client follows its server to its new port");
    let log = std::fs::read_to_string(work.path().join("log")).unwrap();
    let since: Vec<&str> = log.lines().skip(before).collect();
    assert_eq!(
        since,
        ["process.server n1 start", "process.client n2 start"],
        "the client after its server, once"
    );
    host.stop().await;
}

/// Two processes each consuming the other, moved at once: each would wait for the other's start
/// at its destination; the second wait is left out (that one is told where its peer ran, and
/// then where it went), so the waits never form a cycle and both arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_consumers_moved_at_once_both_arrive() {
    let host = start_host(1).await;
    let _sshd = nodes(&host, 3).await;
    let work = tempfile::tempdir().unwrap();
    let versions = json!([{"version": "1.0.0", "schema": {"type": "object", "title": "mutual"}}]);
    let doc = json!({
        "name": "mutual", "version": "1.0.0",
        "automator": orc_plugin_artifacts::SHELL.digest,
        "config": {"scripts": {"start": "printf '%s' \"$PEERS\" > \"$OUT\"", "stop": "true", "remove": "true"}},
        "config_schema": {"type": "object"},
        "ports": [{"name": "serve", "port": 7}],
        "connections_key": "peers",
        "interfaces": [
            {"name": "serve", "role": "provides", "port": "serve", "allow_multiple": true, "versions": versions},
            {"name": "use", "role": "requires", "versions": versions}
        ]
    });
    publish_service(&host, &doc).await;
    let processes = format!("/environments/{ENV}/processes");
    for (name, node, port) in [("x", "n1", 7201), ("y", "n2", 7202)] {
        let body = json!({"name": name, "service": "mutual@1.0.0", "node": node, "ports": {"serve": port},
            "config": {"out": work.path().join(name)}});
        let (status, p) = host.post(&processes, &body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    }
    for (from, to) in [("x", "y"), ("y", "x")] {
        let body = json!({"from": {"process": from, "interface": "use"}, "to": {"process": to, "interface": "serve"}});
        let (status, c) = host.post(&format!("/environments/{ENV}/connections"), &body).await;
        assert_eq!(status, StatusCode::CREATED, "{c}");
    }
    for name in ["x", "y"] {
        wait_state(&host, name, "running").await;
    }
    nothing_pending(&host).await;
    for (name, node) in [("x", "n3"), ("y", "n1")] {
        let (status, moving) = host.post(&format!("{processes}/{name}/move"), &json!({"node": node})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{moving}");
    }
    for name in ["x", "y"] {
        wait_state(&host, name, "running").await;
    }
    nothing_pending(&host).await;
    let use_node = |process: &str| {
        let peers: Value = serde_json::from_str(&std::fs::read_to_string(work.path().join(process)).unwrap()).unwrap();
        peers["use"][0]["node"].as_str().unwrap().to_string()
    };
    assert_eq!((use_node("x"), use_node("y")), ("n1".to_string(), "n3".to_string()));
    host.stop().await;
}

/// A `shell` service for the randomized test: a client's start writes its connections as
/// delivered (`$PEERS`, JSON) to `$OUT`.
fn peers_service(name: &str, role: &str) -> Value {
    let mut interface = json!({"name": "echo", "role": role, "allow_multiple": true,
        "versions": [{"version": "1.0.0", "schema": {"type": "object", "title": "echo"}}]});
    let start = if role == "provides" {
        interface["port"] = json!("echo");
        "true"
    } else {
        "printf '%s' \"$PEERS\" > \"$OUT\""
    };
    json!({
        "name": name, "version": "1.0.0",
        "automator": orc_plugin_artifacts::SHELL.digest,
        "config": {"scripts": {"start": start, "stop": "true", "remove": "true"}},
        "config_schema": {"type": "object"},
        "ports": [{"name": "echo", "port": 7}],
        "connections_key": "peers",
        "interfaces": [interface]
    })
}

/// One operation of the randomized test.
#[derive(Debug, Clone)]
enum Op {
    Connect {
        client: usize,
        server: usize,
    },
    /// The n-th connection listed when it runs (modulo their number).
    Disconnect(usize),
    Update {
        process: usize,
        generation: u32,
    },
    Move(usize),
    Terminate(usize),
}

fn ops_strategy(processes: usize, servers: usize) -> impl proptest::strategy::Strategy<Value = Vec<Op>> {
    use proptest::prelude::*;
    let op = prop_oneof![
        4 => (0..processes - servers, 0..servers).prop_map(|(client, server)| Op::Connect { client, server }),
        2 => (0..16usize).prop_map(Op::Disconnect),
        3 => (0..processes, 2..100u32).prop_map(|(process, generation)| Op::Update { process, generation }),
        2 => (0..processes).prop_map(Op::Move),
        1 => (0..processes).prop_map(Op::Terminate),
    ];
    proptest::collection::vec(op, 24)
}

/// Operators racing each other and the watchers, in random order: connections made and dropped,
/// processes updated, moved and terminated from three clients at once. Whatever interleaving,
/// every request is answered with success or a refusal the state explains (never a 5xx), every
/// process ends `running` (or gone, if terminated) with nothing pending, the released version
/// holds exactly the processes' tasks, and every client has been told exactly its connections,
/// each with its server's current node. `ORC_TEST_SEED=<n>` replays a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_operations_converge_to_what_the_rows_say() {
    use proptest::strategy::{Strategy, ValueTree};
    let (seed, mut runner) = super::seeded_runner();
    const SERVERS: usize = 3;
    const PROCESSES: usize = 6;
    let ops = ops_strategy(PROCESSES, SERVERS).new_tree(&mut runner).unwrap().current();
    eprintln!("operations: {ops:?}");

    let host = start_host(1).await;
    let _sshd = nodes(&host, 2).await;
    publish_service(&host, &peers_service("rand-server", "provides")).await;
    publish_service(&host, &peers_service("rand-client", "requires")).await;
    let work = tempfile::tempdir().unwrap();
    let name = |i: usize| {
        if i < SERVERS {
            format!("rs{i}")
        } else {
            format!("rc{}", i - SERVERS)
        }
    };
    let config = |i: usize, generation: u32| json!({"out": work.path().join(name(i)), "generation": generation});
    let processes = format!("/environments/{ENV}/processes");
    let connections = format!("/environments/{ENV}/connections");
    // Created without waiting: the operations race the creates too.
    for i in 0..PROCESSES {
        let service = if i < SERVERS { "rand-server@1.0.0" } else { "rand-client@1.0.0" };
        let body = json!({"name": name(i), "service": service, "node": format!("n{}", i % 2 + 1),
            "ports": {"echo": 20_000 + i}, "config": config(i, 1)});
        let (status, p) = host.post(&processes, &body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    }
    let queue = std::sync::Mutex::new(ops.into_iter());
    let run = async || {
        loop {
            let Some(op) = queue.lock().unwrap().next() else { return };
            let (status, answer) = match &op {
                Op::Connect { client, server } => {
                    let body = json!({"from": {"process": name(SERVERS + client), "interface": "echo"},
                        "to": {"process": name(*server), "interface": "echo"}});
                    host.post(&connections, &body).await
                }
                Op::Disconnect(n) => {
                    let (_, list) = host.get(&connections).await;
                    let items = list["items"].as_array().cloned().unwrap_or_default();
                    if items.is_empty() {
                        continue;
                    }
                    let id = items[n % items.len()]["id"].as_str().unwrap().to_string();
                    host.delete(&format!("{connections}/{id}")).await
                }
                Op::Update { process, generation } => {
                    let body = json!({"config": config(*process, *generation)});
                    let (status, answer, _) = host
                        .send_text(Method::PATCH, &format!("{processes}/{}", name(*process)), Some(&body))
                        .await;
                    (status, answer)
                }
                Op::Move(process) => host.post(&format!("{processes}/{}/move", name(*process)), &json!({})).await,
                Op::Terminate(process) => host.delete(&format!("{processes}/{}", name(*process))).await,
            };
            let refused_for_the_state = matches!(
                (status, answer["code"].as_str()),
                (
                    StatusCode::CONFLICT,
                    Some("invalid_transition" | "connection_exists" | "version_conflict")
                ) | (StatusCode::NOT_FOUND, Some("unknown_connection" | "unknown_process"))
                    | (StatusCode::UNPROCESSABLE_ENTITY, Some("unknown_process"))
            );
            assert!(
                status.is_success() || refused_for_the_state,
                "{op:?}: {status} {answer} (ORC_TEST_SEED={seed})"
            );
        }
    };
    tokio::join!(run(), run(), run());

    let settled = converged(&host, work.path(), seed).await;

    // One more change once all is quiet: the releaser is asked for it, not carried by others.
    let client = settled.iter().find(|p| p["name"].as_str().unwrap().starts_with("rc"));
    let server = settled.iter().find(|p| p["name"].as_str().unwrap().starts_with("rs"));
    if let (Some(client), Some(server)) = (client, server) {
        let body =
            json!({"from": {"process": client["name"], "interface": "echo"}, "to": {"process": server["name"], "interface": "echo"}});
        let (status, answer) = host.post(&connections, &body).await;
        if status == StatusCode::CONFLICT {
            let (_, list) = host.get(&connections).await;
            let id = list["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["from"]["process"] == client["name"] && c["to"]["process"] == server["name"])
                .unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string();
            let (status, answer) = host.delete(&format!("{connections}/{id}")).await;
            assert_eq!(status, StatusCode::OK, "{answer}");
        } else {
            assert_eq!(status, StatusCode::CREATED, "{answer}");
        }
        converged(&host, work.path(), seed).await;
    }
    host.stop().await;
}

/// Waits until every process is `running` with nothing pending and every resource deployed;
/// then checks that the released version holds exactly the processes' tasks and that every
/// client was told exactly its connections, with its servers' current nodes. The processes.
async fn converged(host: &Host, work: &std::path::Path, seed: u64) -> Vec<Value> {
    let processes = format!("/environments/{ENV}/processes");
    let connections = format!("/environments/{ENV}/connections");
    let settled = wait_for(
        &format!("the processes to settle (ORC_TEST_SEED={seed})"),
        OP_TIMEOUT * 2,
        async || {
            let (_, list) = host.get(&processes).await;
            let items = list["items"].as_array().cloned().unwrap();
            let (_, env) = host.get(&format!("/environments/{ENV}")).await;
            let busy = items
                .iter()
                .any(|p| p["state"] != "running" || !p["pending"].as_array().unwrap().is_empty());
            assert!(
                items.iter().all(|p| p["state"] != "failed"),
                "a process failed (ORC_TEST_SEED={seed}): {list:#}"
            );
            let counts = env["resources"].as_object().cloned().unwrap_or_default();
            let undeployed = counts.iter().any(|(k, v)| k != "deployed" && v.as_u64() != Some(0));
            if !busy && !undeployed {
                Ok(items)
            } else {
                Err(format!("{list:#} {env:#}"))
            }
        },
    )
    .await;
    // The environment counts the processes by state as the list shows them.
    let (_, env) = host.get(&format!("/environments/{ENV}")).await;
    let mut tally = serde_json::Map::new();
    for p in &settled {
        let state = p["state"].as_str().unwrap().to_string();
        let n = tally.get(&state).and_then(Value::as_u64).unwrap_or(0);
        tally.insert(state, Value::from(n + 1));
    }
    assert_eq!(env["processes"], Value::Object(tally), "ORC_TEST_SEED={seed}: {env:#}");

    // The released version comes to hold exactly the processes' tasks: a settling process's
    // last change (its removals that are done dropped from its row) is released by the
    // releaser's next round, a moment after the row says so.
    let mut rows: Vec<String> = settled
        .iter()
        .flat_map(|p| p["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_string()))
        .collect();
    rows.sort();
    wait_for(
        &format!("the released version to hold the rows' tasks (ORC_TEST_SEED={seed})"),
        Duration::from_secs(10),
        async || {
            let released = super::released_ids(host, ",process.").await;
            if released == rows {
                Ok(())
            } else {
                Err(format!("released {released:?}, rows {rows:?}"))
            }
        },
    )
    .await;

    // Every client was told exactly its connections, with its servers' current nodes.
    let node_of = |process: &str| {
        settled
            .iter()
            .find(|p| p["name"] == process)
            .map(|p| p["node"].as_str().unwrap().to_string())
    };
    let (_, list) = host.get(&connections).await;
    for client in settled.iter().filter(|p| p["name"].as_str().unwrap().starts_with("rc")) {
        let client = client["name"].as_str().unwrap();
        let mut want: Vec<(String, String)> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["from"]["process"] == client)
            .map(|c| {
                let server = c["to"]["process"].as_str().unwrap().to_string();
                let node = node_of(&server).unwrap_or_else(|| panic!("{server} is connected but gone"));
                (server, node)
            })
            .collect();
        let told: Value = serde_json::from_str(&std::fs::read_to_string(work.join(client)).unwrap()).unwrap();
        let mut got: Vec<(String, String)> = told["echo"]
            .as_array()
            .map(|peers| {
                peers
                    .iter()
                    .map(|p| (p["peer"].as_str().unwrap().to_string(), p["node"].as_str().unwrap().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        want.sort();
        got.sort();
        assert_eq!(got, want, "client {client} (ORC_TEST_SEED={seed})");
    }
    settled
}

/// The `process.` tasks of version `version` (by id).
async fn process_tasks_of(host: &Host, version: &Value) -> Vec<String> {
    let (status, v) = host.get(&format!("/environments/{ENV}/intents/{version}")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["intent"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .filter(|id| id.contains(",process."))
        .collect()
}

/// A host that stops after a terminated process's row is deleted and before the version without
/// its tasks is released: with no process row left, the host releases that version when it
/// starts again. The stop is made by hand: the terminate runs to its end, then, with the host
/// stopped, the version released while the process was terminating is made the released one
/// again, which is what the database holds after such a stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminate_cut_short_by_a_stop_is_released_when_the_host_starts() {
    let host = start_host(1).await;
    let _sshd = nodes(&host, 1).await;
    publish_service(&host, &peers_service("stop-server", "provides")).await;
    let processes = format!("/environments/{ENV}/processes");
    let body = json!({"name": "s0", "service": "stop-server@1.0.0", "node": "n1", "config": {}});
    let (status, p) = host.post(&processes, &body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    wait_state(&host, "s0", "running").await;
    let (status, p) = host.delete(&format!("{processes}/s0")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    host.wait_for(&format!("{processes}/s0"), "gone", OP_TIMEOUT, |code, _| {
        code == StatusCode::NOT_FOUND
    })
    .await;
    // Once the row is gone, a version without its tasks follows.
    let (env_id, terminating) = wait_for("the terminate to be released", OP_TIMEOUT, async || {
        let (_, env) = host.get(&format!("/environments/{ENV}")).await;
        if !process_tasks_of(&host, &env["released_version"]).await.is_empty() {
            return Err(format!("{env:#}"));
        }
        // The newest version before it that holds the process's (purged) tasks.
        let mut v = env["released_version"].as_i64().unwrap() - 1;
        while process_tasks_of(&host, &json!(v)).await.is_empty() {
            v -= 1;
            assert!(v > 0, "no version held the process's tasks");
        }
        Ok((env["id"].as_str().unwrap().to_string(), v))
    })
    .await;

    let (data, token) = host.restart_later().await;
    let store = orc_host::store::Store::connect(&data.location()).await.unwrap();
    store.release_version(&env_id.parse().unwrap(), terminating).await.unwrap();
    store.close().await;

    let host = Host::start_again(data, token).await;
    wait_for(
        "the restarted host to release a version without the terminated process's tasks",
        OP_TIMEOUT,
        async || {
            let (_, env) = host.get(&format!("/environments/{ENV}")).await;
            let released = env["released_version"].as_i64().unwrap();
            if released > terminating && process_tasks_of(&host, &env["released_version"]).await.is_empty() {
                Ok(())
            } else {
                Err(format!("{env:#}"))
            }
        },
    )
    .await;
    host.stop().await;
}

/// The stored row of process `name`, read with the host stopped.
async fn stored_row(data: &Data, env_id: &str, name: &str) -> orc_host::store::ProcessRecord {
    let store = orc_host::store::Store::connect(&data.location()).await.unwrap();
    let row = store.find_process(&env_id.parse().unwrap(), name).await.unwrap().unwrap();
    store.close().await;
    row
}

/// A host that stops after a moved server's row says it runs on its new node and before its
/// client was told (the releaser tells a moved process's peers from memory, in its next round):
/// the host tells the client when it starts. The stop is made by hand: with the host stopped,
/// the client's row is put back as it was before the move, which is what the database holds
/// after such a stop; without being told, the client would be released as that row says and
/// deployed again pointing at the old node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_of_a_move_cut_short_by_a_stop_are_told_when_the_host_starts() {
    let host = start_host(1).await;
    let _sshd = nodes(&host, 2).await;
    publish_service(&host, &peers_service("told-server", "provides")).await;
    publish_service(&host, &peers_service("told-client", "requires")).await;
    let work = tempfile::tempdir().unwrap();
    let processes = format!("/environments/{ENV}/processes");
    for (name, service, node, port) in [
        ("rs0", "told-server@1.0.0", "n1", 20_100),
        ("rc0", "told-client@1.0.0", "n2", 20_101),
    ] {
        let body = json!({"name": name, "service": service, "node": node, "ports": {"echo": port},
            "config": {"out": work.path().join(name)}});
        let (status, p) = host.post(&processes, &body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    }
    let body = json!({"from": {"process": "rc0", "interface": "echo"}, "to": {"process": "rs0", "interface": "echo"}});
    let (status, c) = host.post(&format!("/environments/{ENV}/connections"), &body).await;
    assert_eq!(status, StatusCode::CREATED, "{c}");
    converged(&host, work.path(), 0).await;
    let (_, env) = host.get(&format!("/environments/{ENV}")).await;
    let env_id = env["id"].as_str().unwrap().to_string();

    // The client's row as it is before its server moves.
    let (data, token) = host.restart_later().await;
    let before = stored_row(&data, &env_id, "rc0").await;
    let host = Host::start_again(data, token).await;
    let (status, p) = host.post(&format!("{processes}/rs0/move"), &json!({"node": "n2"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    let settled = converged(&host, work.path(), 0).await;
    assert!(settled.iter().any(|p| p["name"] == "rs0" && p["node"] == "n2"), "{settled:?}");

    // Stopped before the client was told: its row as before the move.
    let (data, token) = host.restart_later().await;
    let now = stored_row(&data, &env_id, "rc0").await;
    assert_ne!(now.document, before.document, "the client was told of the move");
    let store = orc_host::store::Store::connect(&data.location()).await.unwrap();
    store
        .update_process(&env_id.parse().unwrap(), "rc0", now.revision, &before.state, &before.document)
        .await
        .unwrap();
    store.close().await;

    // Started again: told, and deployed pointing at the server's new node.
    let host = Host::start_again(data, token).await;
    let settled = converged(&host, work.path(), 0).await;
    assert!(settled.iter().any(|p| p["name"] == "rs0" && p["node"] == "n2"), "{settled:?}");
    let told: Value = serde_json::from_str(&std::fs::read_to_string(work.path().join("rc0")).unwrap()).unwrap();
    assert_eq!(told["echo"][0]["node"], "n2", "{told}");
    host.stop().await;
}

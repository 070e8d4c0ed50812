//! SSH nodes through the REST API of a real server (`Server` on `127.0.0.1:0`, fresh data
//! directory and database) against real OpenSSH `sshd` servers the harness starts per test:
//! registration and verification, facts, visibility, credentials never shown or stored in clear,
//! `file` resources deployed over SSH, wrong credentials, a pinned key that does not match, a host
//! key changed under a node in use, a node that goes away and comes back, deletion while in use.
//! Tests poll, never sleep for a fixed time. They need root (sshd switches users).

use std::time::Duration;

use orc_host::store::Backend;
use orc_tests::sshd::{Sshd, TEST_PASSWORD, TEST_USER};
use orc_tests::wait_for;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::host::Host;
use crate::support::paths::encode;

/// What these tests add to the shared harness.
trait NodeHost {
    async fn register(&self, body: Value) -> Value;
    async fn wait_node(&self, name: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value;
    async fn wait_status(&self, name: &str, status: &str) -> Value;
    async fn wait_resource(&self, env: &str, id: &str, status: &str) -> Value;
    async fn submit(&self, env: &str, resources: Value) -> (StatusCode, Value);
}

impl NodeHost for Host {
    async fn register(&self, body: Value) -> Value {
        let (status, node) = self.post("/nodes", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{node}");
        assert_eq!(node["status"], "unidentified", "{node}");
        node
    }

    /// Polls the node until `done` holds for it.
    async fn wait_node(&self, name: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        wait_for(&format!("node {name} to become {what}"), Duration::from_secs(60), async || {
            let (status, node) = self.get(&format!("/nodes/{name}")).await;
            assert_eq!(status, StatusCode::OK, "{node}");
            if done(&node) { Ok(node) } else { Err(node) }
        })
        .await
    }

    async fn wait_status(&self, name: &str, status: &str) -> Value {
        self.wait_node(name, status, |n| n["status"] == status).await
    }

    /// Polls a resource until its status is `status`.
    async fn wait_resource(&self, env: &str, id: &str, status: &str) -> Value {
        wait_for(&format!("{id} to become {status}"), Duration::from_secs(90), async || {
            let (code, r) = self.get(&format!("/environments/{env}/resources/{}", encode(id))).await;
            if code == StatusCode::OK && r["state"]["status"] == status {
                Ok(r["state"].clone())
            } else {
                Err(r)
            }
        })
        .await
    }

    async fn submit(&self, env: &str, resources: Value) -> (StatusCode, Value) {
        self.post(&format!("/environments/{env}/intents"), &json!({ "resources": resources }))
            .await
    }
}

/// A `file` resource on `node` at `path` with `content`.
fn file(node: &str, path: &std::path::Path, content: &str) -> Value {
    json!({
        "id": format!("file[{node},{}]", path.display()),
        "adaptor": "file@0.1.0",
        "attributes": { "content": content, "mode": "0640" },
    })
}

fn key_registration(name: &str, sshd: &Sshd) -> Value {
    json!({
        "name": name,
        "address": "127.0.0.1",
        "port": sshd.port,
        "user": TEST_USER,
        "credential": { "private_key": sshd.client_key },
        "labels": { "role": "web", "dc": "one" },
    })
}

/// A line from the middle of the private key: what must never show up anywhere.
fn key_fragment(sshd: &Sshd) -> String {
    sshd.client_key.lines().nth(2).expect("a multi-line key").to_string()
}

use crate::support::on_both_backends;

on_both_backends!(a_node_is_verified_and_files_are_deployed_to_it);

/// Register with a key → verified → public, facts shown, the credential never in an answer nor
/// in clear in the database; invalid registrations named; `file` resources deployed over SSH and
/// found on disk; the node cannot be deleted while they are on it.
async fn a_node_is_verified_and_files_are_deployed_to_it(backend: Backend) {
    let sshd = Sshd::start();
    let host = Host::start(backend).await;
    let fragment = key_fragment(&sshd);
    let mut answers = Vec::new();

    let (status, node, text) = host.send_text(Method::POST, "/nodes", Some(&key_registration("web1", &sshd))).await;
    assert_eq!(status, StatusCode::CREATED, "{node}");
    answers.push(text);
    let node = host.wait_status("web1", "public").await;
    assert_eq!(node["host_key"], sshd.host_fingerprint.as_str(), "{node}");
    assert_eq!(node["credential"], "private_key");
    assert_eq!(node["environment"], Value::Null);
    assert_eq!(node["facts"]["kernel"], "Linux", "{node}");
    assert!(node["facts"]["cpus"].as_u64().unwrap() >= 1, "{node}");
    assert!(!node["facts"]["hostname"].as_str().unwrap().is_empty(), "{node}");
    assert!(node["verified_at"].is_i64() && node["last_error"].is_null(), "{node}");

    // Listing, filtered by label and status.
    for (query, expected) in [
        ("", 1),
        ("?label=role=web", 1),
        ("?label=role=db", 0),
        ("?status=public", 1),
        ("?status=unreachable", 0),
    ] {
        let (status, list, text) = host.send_text(Method::GET, &format!("/nodes{query}"), None).await;
        assert_eq!(status, StatusCode::OK, "{list}");
        assert_eq!(list["items"].as_array().unwrap().len(), expected, "{query}: {list}");
        answers.push(text);
    }

    // Invalid registrations, each naming the field; a bad key is not echoed.
    let mut bad_key = key_registration("web2", &sshd);
    bad_key["credential"] = json!({ "private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-key-ZZZ\n" });
    let mut port_zero = key_registration("web2", &sshd);
    port_zero["port"] = json!(0);
    let mut bad_name = key_registration("Web 2", &sshd);
    bad_name["name"] = json!("Web 2");
    let mut unknown_env = key_registration("web2", &sshd);
    unknown_env["environment"] = json!("nope");
    let mut both = key_registration("web2", &sshd);
    both["credential"]["password"] = json!("x");
    for (body, status, code, names) in [
        (bad_key, StatusCode::UNPROCESSABLE_ENTITY, "invalid_credential", "credential"),
        (port_zero, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", "port"),
        (bad_name, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", "name"),
        (unknown_env, StatusCode::NOT_FOUND, "unknown_environment", "nope"),
        (both, StatusCode::UNPROCESSABLE_ENTITY, "invalid_credential", "credential"),
        (key_registration("web1", &sshd), StatusCode::CONFLICT, "node_exists", "web1"),
    ] {
        let (got, err, text) = host.send_text(Method::POST, "/nodes", Some(&body)).await;
        assert_eq!((got, err["code"].as_str().unwrap()), (status, code), "{err}");
        assert!(err["message"].as_str().unwrap().contains(names), "{err}");
        assert!(!text.contains("not-a-key-ZZZ"), "the key text is echoed: {text}");
        answers.push(text);
    }

    // Files on the node, through an intent.
    host.create_environment_retrying("dev", 1).await;
    let scratch = sshd.scratch_dir("dev");
    let (a, b) = (scratch.join("a.conf"), scratch.join("b.conf"));
    let resources = json!([file("web1", &a, "alpha\n"), file("web1", &b, "beta\n")]);
    let (status, version) = host.submit("dev", resources).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    let on_web1 = version["version"].as_i64().unwrap();
    for path in [&a, &b] {
        host.wait_resource("dev", &format!("file[web1,{}]", path.display()), "deployed")
            .await;
    }
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "alpha\n");
    assert_eq!(std::fs::read_to_string(&b).unwrap(), "beta\n");
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&a).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o640);
    let orctest_uid = std::process::Command::new("id").args(["-u", TEST_USER]).output().unwrap();
    assert_eq!(
        meta.uid().to_string(),
        String::from_utf8_lossy(&orctest_uid.stdout).trim(),
        "written over SSH as {TEST_USER}"
    );

    // In use: not deleted.
    let (status, err, text) = host.send_text(Method::DELETE, "/nodes/web1", None).await;
    assert_eq!((status, err["code"].as_str()), (StatusCode::CONFLICT, Some("node_in_use")), "{err}");
    assert!(err["message"].as_str().unwrap().contains("dev"), "{err}");
    answers.push(text);
    // The resources are purged (removed from the node), then dropped from the intent.
    let purged = json!([
        { "id": format!("file[web1,{}]", a.display()), "adaptor": "file@0.1.0", "attributes": { "content": "" }, "purged": true },
        { "id": format!("file[web1,{}]", b.display()), "adaptor": "file@0.1.0", "attributes": { "content": "" }, "purged": true },
    ]);
    let (status, version) = host.submit("dev", purged).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    wait_for("the purged files to go", Duration::from_secs(60), async || {
        !a.exists() && !b.exists()
    })
    .await;
    let (status, version) = host.submit("dev", json!([])).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    wait_for("the node to be out of use and deleted", Duration::from_secs(60), async || {
        let (status, body, _) = host.send_text(Method::DELETE, "/nodes/web1", None).await;
        if status == StatusCode::NO_CONTENT {
            return Ok(());
        }
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        Err(body)
    })
    .await;
    let (status, _) = host.get("/nodes/web1").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The version that used it is not brought back: neither released again nor rolled back to.
    for action in ["release", "rollback"] {
        let (status, err) = host
            .post(&format!("/environments/dev/intents/{on_web1}/{action}"), &json!({}))
            .await;
        assert_eq!(
            (status, err["code"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("unknown_node")),
            "{action}: {err}"
        );
        assert!(err["message"].as_str().unwrap().contains("web1"), "{err}");
    }

    // A restarted host opens the credentials it sealed and verifies its nodes again.
    host.register(key_registration("web3", &sshd)).await;
    let before = host.wait_status("web3", "public").await;
    let (data, token) = host.restart_later().await;
    let host = Host::start_again(data, token).await;
    let after = host
        .wait_node("web3", "verified again", |n| {
            n["status"] == "public" && n["verified_at"] != before["verified_at"]
        })
        .await;
    assert_eq!(after["host_key"], before["host_key"]);

    for text in &answers {
        assert!(!text.contains(&fragment), "an answer holds the private key: {text}");
        assert!(!text.contains("BEGIN OPENSSH PRIVATE KEY"), "an answer holds a key: {text}");
    }
    // At rest: encrypted with the host's key, which only its owner may read.
    let secret = host.data.path().join("secret.key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777, 0o600);
    if backend == Backend::Sqlite {
        for entry in std::fs::read_dir(host.data.path()).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().unwrap().to_string_lossy().starts_with("orc.db") {
                let bytes = std::fs::read(&path).unwrap();
                assert!(
                    !bytes.windows(fragment.len()).any(|w| w == fragment.as_bytes()),
                    "{} holds the key in clear",
                    path.display()
                );
            }
        }
    }
    host.stop().await;
}

/// A private node is refused to another environment's intents (`node_not_allowed`, naming the
/// node and the environment); an unregistered one is `unknown_node`; a node that cannot be
/// reached is `unreachable` with the reason, and its own environment's resources wait as
/// `unavailable`. A node is in use, and not deleted, from the moment a version naming it is
/// released. A node in use by two environments cannot be made private to one of them
/// (`node_in_use`, naming the other).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_nodes_are_refused_to_other_environments() {
    let host = Host::start(Backend::Sqlite).await;
    host.create_environment_retrying("team-a", 1).await;
    host.create_environment_retrying("team-b", 1).await;
    // Nothing listens on this port.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let node = host
        .register(json!({
            "name": "db1", "address": "127.0.0.1", "port": port, "user": "orc",
            "credential": { "password": "pw-never-shown" }, "environment": "team-a",
        }))
        .await;
    assert_eq!(node["environment_name"], "team-a", "{node}");
    let node = host.wait_status("db1", "unreachable").await;
    assert!(node["last_error"].as_str().unwrap().contains("cannot connect"), "{node}");
    assert!(!node.to_string().contains("pw-never-shown"));

    let resources = json!([file("db1", std::path::Path::new("/tmp/x"), "x")]);
    let (status, err) = host.submit("team-b", resources.clone()).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("node_not_allowed")),
        "{err}"
    );
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("db1") && message.contains("team-b"), "{message}");
    let (status, err) = host
        .submit("team-b", json!([file("nowhere", std::path::Path::new("/tmp/x"), "x")]))
        .await;
    assert_eq!(
        (status, err["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("unknown_node")),
        "{err}"
    );

    // With 2,000 more resources, whose states take a moment to be stored.
    let mut many = resources.as_array().unwrap().clone();
    many.extend((0..2000).map(|i| file("db1", std::path::Path::new(&format!("/tmp/many/{i}")), "x")));
    let (status, version) = host.submit("team-a", Value::Array(many)).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    // In use from the moment the version is released, before its states are stored.
    let (status, err, _) = host.send_text(Method::DELETE, "/nodes/db1", None).await;
    assert_eq!((status, err["code"].as_str()), (StatusCode::CONFLICT, Some("node_in_use")), "{err}");
    assert!(err["message"].as_str().unwrap().contains("team-a"), "{err}");
    let state = host.wait_resource("team-a", "file[db1,/tmp/x]", "unavailable").await;
    assert!(state["last_error"].to_string().contains("db1"), "{state}");

    // Made public, the other environment may use it.
    let (_, node, _) = host
        .send_text(
            Method::PATCH,
            "/nodes/db1",
            Some(&json!({ "environment": null, "labels": { "tier": "db" } })),
        )
        .await;
    assert_eq!(
        (node["environment"].clone(), node["labels"]["tier"].clone()),
        (Value::Null, json!("db")),
        "{node}"
    );
    let (status, version) = host
        .submit("team-b", json!([file("db1", std::path::Path::new("/tmp/y"), "y")]))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    host.wait_resource("team-b", "file[db1,/tmp/y]", "unavailable").await;
    // Used by both now: making it private to either is refused, naming the other; nothing changes.
    for (to, other) in [("team-a", "team-b"), ("team-b", "team-a")] {
        let (status, err, _) = host
            .send_text(Method::PATCH, "/nodes/db1", Some(&json!({ "environment": to, "labels": {} })))
            .await;
        assert_eq!((status, err["code"].as_str()), (StatusCode::CONFLICT, Some("node_in_use")), "{err}");
        let message = err["message"].as_str().unwrap();
        assert!(message.contains("db1") && message.contains(other), "{message}");
    }
    let (_, unchanged) = host.get("/nodes/db1").await;
    assert_eq!(
        (&unchanged["environment"], &unchanged["labels"]["tier"]),
        (&Value::Null, &json!("db")),
        "{unchanged}"
    );

    // The answers match the schemas the OpenAPI document gives them.
    let doc: Value = host
        .client
        .get(format!("{}/openapi.json", host.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (_, list) = host.get("/nodes").await;
    let (_, missing) = host.get("/nodes/nope").await;
    for (path, method, status, body) in [
        ("/nodes/{node}", "get", 200, &node),
        ("/nodes", "get", 200, &list),
        ("/nodes/{node}", "get", 404, &missing),
    ] {
        let schema = &doc["paths"][path][method]["responses"][status.to_string()]["content"]["application/json"]["schema"];
        assert!(schema.is_object(), "{method} {path} {status}: no schema");
        let root = json!({ "$schema": "https://json-schema.org/draft/2020-12/schema", "components": doc["components"], "allOf": [schema] });
        let validator = jsonschema::validator_for(&root).unwrap();
        if let Err(e) = validator.validate(body) {
            panic!("{method} {path} {status} does not match its schema: {e}\n{body}");
        }
    }
    host.stop().await;
}

/// A wrong password is `auth_failed` with a clear message; replacing the credential verifies the
/// node again. A pinned fingerprint the node does not present is `host_key_changed`; only the
/// presented key can be accepted, and then the node is verified with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_and_a_wrong_pinned_key_are_reported() {
    let sshd = Sshd::start();
    let host = Host::start(Backend::Sqlite).await;
    host.register(json!({
        "name": "pw", "address": "127.0.0.1", "port": sshd.port, "user": TEST_USER,
        "credential": { "password": "wrong-password" },
    }))
    .await;
    let node = host.wait_status("pw", "auth_failed").await;
    let message = node["last_error"].as_str().unwrap();
    assert!(
        message.contains("authentication") && message.contains(TEST_USER) && message.contains("password"),
        "{message}"
    );
    assert!(!node.to_string().contains("wrong-password"));
    let (status, node, _) = host
        .send_text(
            Method::PATCH,
            "/nodes/pw",
            Some(&json!({ "credential": { "password": TEST_PASSWORD } })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{node}");
    let node = host.wait_status("pw", "public").await;
    assert_eq!(
        (node["credential"].as_str(), node["host_key"].as_str()),
        (Some("password"), Some(sshd.host_fingerprint.as_str()))
    );

    let mut body = key_registration("pinned", &sshd);
    let wrong = "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    body["host_key_fingerprint"] = json!(wrong);
    host.register(body).await;
    let node = host.wait_status("pinned", "host_key_changed").await;
    assert_eq!(node["presented_host_key"], sshd.host_fingerprint.as_str(), "{node}");
    assert_eq!(node["host_key"], wrong, "the pinned key stays until an operator decides");
    assert!(node["last_error"].as_str().unwrap().contains("HOST KEY CHANGED"), "{node}");
    // The pinned key is not re-tried behind the operator's back.
    let (status, err) = host.post("/nodes/pinned/accept-host-key", &json!({ "fingerprint": wrong })).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("wrong_fingerprint")),
        "{err}"
    );
    let (status, node) = host
        .post("/nodes/pinned/accept-host-key", &json!({ "fingerprint": sshd.host_fingerprint }))
        .await;
    assert_eq!((status, node["status"].as_str()), (StatusCode::OK, Some("public")), "{node}");
    assert_eq!(node["host_key"], sshd.host_fingerprint.as_str());
    let (status, err) = host
        .post("/nodes/pinned/accept-host-key", &json!({ "fingerprint": sshd.host_fingerprint }))
        .await;
    assert_eq!(
        (status, err["code"].as_str()),
        (StatusCode::CONFLICT, Some("host_key_unchanged")),
        "{err}"
    );
    // Re-verification answers with the outcome.
    let (status, node) = host.post("/nodes/pinned/verify", &json!({})).await;
    assert_eq!((status, node["status"].as_str()), (StatusCode::OK, Some("public")), "{node}");
    host.stop().await;
}

/// A node whose host key changes while in use is blocked (`host_key_changed`): its resources are
/// not deployed (they fail as denied) until an operator accepts the new key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_key_changed_under_a_node_in_use_blocks_it_until_accepted() {
    let mut sshd = Sshd::start();
    let host = Host::start(Backend::Sqlite).await;
    host.register(key_registration("web1", &sshd)).await;
    host.wait_status("web1", "public").await;
    host.create_environment_retrying("dev", 1).await;
    let scratch = sshd.scratch_dir("dev");
    let (a, b) = (scratch.join("a"), scratch.join("b"));
    let (status, v) = host.submit("dev", json!([file("web1", &a, "a\n")])).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    host.wait_resource("dev", &format!("file[web1,{}]", a.display()), "deployed").await;

    let old = sshd.host_fingerprint.clone();
    sshd.replace_host_key();
    let (status, v) = host.submit("dev", json!([file("web1", &a, "a\n"), file("web1", &b, "b\n")])).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let b_id = format!("file[web1,{}]", b.display());
    let state = host.wait_resource("dev", &b_id, "failed").await;
    let node = host.wait_status("web1", "host_key_changed").await;
    assert_eq!(
        (node["host_key"].as_str(), node["presented_host_key"].as_str()),
        (Some(old.as_str()), Some(sshd.host_fingerprint.as_str()))
    );
    assert!(!b.exists(), "deployed to a node whose key changed: {state}");
    // Still blocked on the retries that follow.
    let (_, state) = host.get(&format!("/environments/dev/resources/{}", encode(&b_id))).await;
    assert_ne!(state["state"]["status"], "deployed", "{state}");
    assert!(!b.exists());

    let (status, node) = host
        .post("/nodes/web1/accept-host-key", &json!({ "fingerprint": sshd.host_fingerprint }))
        .await;
    assert_eq!((status, node["status"].as_str()), (StatusCode::OK, Some("public")), "{node}");
    host.wait_resource("dev", &b_id, "deployed").await;
    assert_eq!(std::fs::read_to_string(&b).unwrap(), "b\n");
    host.stop().await;
}

/// A node whose sshd goes away turns its resources `unavailable` and itself `unreachable`; when
/// it comes back, both recover without anyone's help.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_makes_resources_unavailable_until_it_returns() {
    let mut sshd = Sshd::start();
    let host = Host::start(Backend::Sqlite).await;
    host.register(key_registration("web1", &sshd)).await;
    host.wait_status("web1", "public").await;
    host.create_environment_retrying("dev", 1).await;
    let scratch = sshd.scratch_dir("dev");
    let (a, b) = (scratch.join("a"), scratch.join("b"));
    let (status, v) = host.submit("dev", json!([file("web1", &a, "a\n")])).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    host.wait_resource("dev", &format!("file[web1,{}]", a.display()), "deployed").await;

    sshd.stop();
    let (status, v) = host.submit("dev", json!([file("web1", &a, "a\n"), file("web1", &b, "b\n")])).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let b_id = format!("file[web1,{}]", b.display());
    host.wait_resource("dev", &b_id, "unavailable").await;
    let node = host.wait_status("web1", "unreachable").await;
    assert!(node["last_error"].is_string(), "{node}");

    // A change on the local node is fenced together with every node the environment reached:
    // web1's part of that fence has nothing to sync and succeeds without asking web1, which
    // says nothing about web1 (it once counted as web1 answering again).
    let c = file("local", std::path::Path::new("/c"), "c\n");
    let (status, v) = host
        .submit("dev", json!([file("web1", &a, "a\n"), file("web1", &b, "b\n"), c]))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    host.wait_resource("dev", "file[local,/c]", "deployed").await;
    for _ in 0..20 {
        let (_, node) = host.get("/nodes/web1").await;
        assert_eq!(
            node["status"], "unreachable",
            "web1 counted as back while its sshd is stopped: {node}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    sshd.start_again();
    host.wait_resource("dev", &b_id, "deployed").await;
    assert_eq!(std::fs::read_to_string(&b).unwrap(), "b\n");
    let node = host.wait_status("web1", "public").await;
    assert!(node["last_error"].is_null(), "{node}");
    host.stop().await;
}

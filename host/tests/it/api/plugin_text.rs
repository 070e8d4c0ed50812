//! What a plugin hands back as text reaches the store whatever it holds: a NUL character, which
//! PostgreSQL's text cannot hold, in an error message is stored as U+FFFD, and a kv key holding
//! one is refused by name (invalid input) instead of failing the commit it would have joined, so
//! the other resources' states and plugin state are stored as ever. On both backends.

use orc_host::store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use super::kv_quota::{everything, message};
use super::{Host, encode};

pub async fn nul_characters_from_a_plugin_neither_reach_nor_break_the_store(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let adaptor = host.publish_misbehave().await;
    host.create_environment("dev").await;
    let (status, body) = host
        .patch("/environments/dev", &json!({ "settings": { "capabilities": everything() } }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let intent = json!({ "resources": [
        { "id": "misbehave[local,error]", "adaptor": adaptor,
          "attributes": { "behave": "flood", "bytes": 2, "text": "bad\u{0}byte " } },
        { "id": "misbehave[local,key]", "adaptor": adaptor,
          "attributes": { "behave": "kv_fill", "during": "apply", "prefix": "a\u{0}b", "keys": 1, "bytes": 1 } },
        { "id": "misbehave[local,fine]", "adaptor": adaptor,
          "attributes": { "behave": "kv_fill", "during": "apply", "prefix": "fine", "keys": 3, "bytes": 1 } },
    ]});
    let (status, body) = host.post("/environments/dev/intents", &intent).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let settled = |r: &serde_json::Value| r["status"] == "deployed" || r["status"] == "failed";
    let error = host.resource_when("dev", "misbehave[local,error]", settled).await;
    assert_eq!(error["status"], "failed", "{error}");
    assert!(
        message(&error).contains("bad\u{FFFD}byte bad\u{FFFD}byte "),
        "the NUL stored as U+FFFD: {error}"
    );
    let key = host.resource_when("dev", "misbehave[local,key]", settled).await;
    assert_eq!(key["status"], "failed", "{key}");
    assert!(message(&key).contains("kv key must not contain NUL"), "{key}");
    let fine = host.resource_when("dev", "misbehave[local,fine]", settled).await;
    assert_eq!(fine["status"], "deployed", "{fine}");

    // Stored, not only shown: the action log has the failure's text, and a restarted server
    // reads the states back.
    let (status, log) = host
        .get(&format!("/environments/dev/actions?resource={}", encode("misbehave[local,error]")))
        .await;
    assert_eq!(status, StatusCode::OK, "{log}");
    assert!(log.to_string().contains("bad\u{FFFD}byte"), "{log}");
    let token = host.token.clone();
    let data = host.stop().await;
    let host = Host::start_with(data, 1 << 20, Some(token)).await;
    let fine = host.resource_when("dev", "misbehave[local,fine]", settled).await;
    assert_eq!(fine["status"], "deployed", "{fine}");
    let error = host.resource_when("dev", "misbehave[local,error]", settled).await;
    assert!(message(&error).contains("bad\u{FFFD}byte"), "{error}");
    host.stop().await;
}

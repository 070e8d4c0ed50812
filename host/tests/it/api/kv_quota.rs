//! Per-environment quotas of plugin key/value state (`kv_quota`): a plugin writing past its
//! environment's quota gets a permanent `quota_exceeded` error naming the environment, the limit
//! and what it holds; deleting keys frees room; keys of the documented 1,024-byte limit are
//! stored; a restarted host counts what is there from the database; the setting is bounded.
//! The `misbehave` fixture writes (`kv_fill`) and deletes (`kv_clear`) the keys.

use std::time::Duration;

use orc_host::store::Backend;
use orc_tests::wait_for;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{Host, assert_error};

impl Host {
    /// The resource `id` of `env` once `done` holds for it (bounded, so a hang fails).
    pub(crate) async fn resource_when(&self, env: &str, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        wait_for(&format!("{id} to reach the condition"), Duration::from_secs(120), async || {
            let (status, page) = self.get(&format!("/environments/{env}/resources")).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            let found = page["items"]
                .as_array()
                .and_then(|items| items.iter().find(|r| r["resource_id"] == id).cloned());
            found.filter(&done).ok_or(page)
        })
        .await
    }

    pub(crate) async fn publish_misbehave(&self) -> String {
        let fixture = &orc_plugin_artifacts::MISBEHAVE;
        let registry = format!("{}/registry", self.base.trim_end_matches("/api/v1"));
        orc_registry::Registry::open(&registry)
            .unwrap()
            .with_token(Some(&self.token))
            .publish(fixture.bytes)
            .await
            .unwrap();
        format!("misbehave@{}", fixture.version)
    }
}

/// A `misbehave` resource that sets `keys` kv keys of 1,024 bytes under `prefix` to values of
/// `bytes` bytes when applied.
fn fill(adaptor: &str, name: &str, prefix: &str, keys: u64, bytes: u64, requires: &[&str]) -> Value {
    json!({
        "id": format!("misbehave[local,{name}]"), "adaptor": adaptor, "requires": requires,
        "attributes": { "behave": "kv_fill", "during": "apply", "prefix": prefix, "keys": keys, "bytes": bytes, "key_len": 1024 },
    })
}

/// A `misbehave` resource that deletes the kv keys under `prefix` when applied.
fn clear(adaptor: &str, prefix: &str) -> Value {
    json!({
        "id": "misbehave[local,clear]", "adaptor": adaptor,
        "attributes": { "behave": "kv_clear", "during": "apply", "prefix": prefix },
    })
}

/// The fixture requests every capability.
pub(crate) fn everything() -> Value {
    json!({ "node_files": true, "node_commands": true, "http": true, "kv": true })
}

pub(crate) fn message(resource: &Value) -> &str {
    resource["last_error"]["message"].as_str().unwrap_or_default()
}

fn assert_mentions(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "`{text}` should mention `{part}`");
    }
}

pub async fn a_plugin_writing_past_its_environments_kv_quota_is_refused_and_deleting_frees_room(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let adaptor = host.publish_misbehave().await;
    let env = host.create_environment("dev").await;
    let id = env["id"].as_str().unwrap().to_string();
    assert_eq!(
        env["settings"]["kv_quota"],
        json!({ "max_keys": 20_000, "max_bytes": 33_554_432 }),
        "{env}"
    );

    // With the defaults, a plugin writing 20,001 keys in one call is stopped at the 20,001st
    // (one call wrote 100,000 keys, 396 MiB, before quotas).
    let flood_env = host.create_environment("flood").await;
    let flood_id = flood_env["id"].as_str().unwrap().to_string();
    let (status, body) = host
        .patch("/environments/flood", &json!({ "settings": { "capabilities": everything() } }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let flood = json!({ "resources": [{
        "id": "misbehave[local,flood]", "adaptor": adaptor,
        "attributes": { "behave": "kv_fill", "during": "apply", "prefix": "k", "keys": 20_001, "bytes": 1 },
    }]});
    let (status, body) = host.post("/environments/flood/intents", &flood).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let flooded = host
        .resource_when("flood", "misbehave[local,flood]", |r| {
            r["status"] == "deployed" || r["status"] == "failed"
        })
        .await;
    assert_eq!(flooded["status"], "failed", "{flooded}");
    assert_mentions(
        message(&flooded),
        &[
            "quota_exceeded: ",
            &format!("environment `{flood_id}`"),
            "to 20001 keys, past its quota of 20000 keys",
        ],
    );

    // Bounded: each refusal names the field and its bound.
    for (quota, says) in [
        (json!({ "max_keys": 0 }), "`kv_quota.max_keys` must be at least 1"),
        (json!({ "max_keys": 10_000_001 }), "`kv_quota.max_keys` must be at most 10000000"),
        (
            json!({ "max_bytes": 1u64 << 40 }),
            "`kv_quota.max_bytes` must be at most 17179869184",
        ),
        (json!({ "max_values": 1 }), "max_values"),
    ] {
        assert_error(
            host.patch("/environments/dev", &json!({ "settings": { "kv_quota": quota } })).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_settings",
            says,
        );
    }
    // Merged field by field: `max_bytes` stays.
    let (status, env) = host
        .patch(
            "/environments/dev",
            &json!({ "settings": { "capabilities": everything(), "kv_quota": { "max_keys": 10 } } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{env}");
    assert_eq!(env["settings"]["kv_quota"], json!({ "max_keys": 10, "max_bytes": 33_554_432 }));

    // Twelve keys of the longest length a key may have: the eleventh is refused, for good.
    let intent = json!({ "resources": [fill(&adaptor, "fill", "a/", 12, 8, &[])] });
    let (status, body) = host.post("/environments/dev/intents", &intent).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let failed = host
        .resource_when("dev", "misbehave[local,fill]", |r| r["status"] == "failed")
        .await;
    assert_mentions(
        message(&failed),
        &[
            "quota_exceeded: ",
            &format!("environment `{id}`"),
            "to 11 keys, past its quota of 10 keys",
            "it holds 10 keys, 10320 bytes",
        ],
    );

    // Deleting keys frees room: the ten written are deleted, ten others fit.
    let refill = fill(&adaptor, "refill", "b/", 10, 8, &["misbehave[local,clear]"]);
    let intent = json!({ "resources": [clear(&adaptor, "a/"), refill] });
    let (status, body) = host.post("/environments/dev/intents", &intent).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    for name in ["clear", "refill"] {
        host.resource_when("dev", &format!("misbehave[local,{name}]"), |r| r["status"] == "deployed")
            .await;
    }

    // A restarted host counts what the environment holds from the database: bytes now.
    let token = host.token.clone();
    let data = host.stop().await;
    let host = Host::start_with(data, 1 << 20, Some(token)).await;
    let (status, body) = host
        .patch(
            "/environments/dev",
            &json!({ "settings": { "kv_quota": { "max_keys": 100, "max_bytes": 12_000 } } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let big = fill(&adaptor, "big", "c/", 1, 2_000, &["misbehave[local,refill]"]);
    let refill = fill(&adaptor, "refill", "b/", 10, 8, &["misbehave[local,clear]"]);
    let intent = json!({ "resources": [clear(&adaptor, "a/"), refill, big] });
    let (status, body) = host.post("/environments/dev/intents", &intent).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let failed = host.resource_when("dev", "misbehave[local,big]", |r| r["status"] == "failed").await;
    assert_mentions(
        message(&failed),
        &[
            "quota_exceeded: ",
            &format!("environment `{id}`"),
            "to 13344 bytes, past its quota of 12000 bytes",
            "it holds 10 keys, 10320 bytes",
        ],
    );
    let data = host.stop().await;

    // What is stored: the ten keys of 1,024 bytes, nothing of the refused writes.
    let location = data
        .database
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", data.path().join(orc_host::store::SQLITE_FILE).display()));
    let store = orc_host::store::Store::connect(&location).await.unwrap();
    let kv = orc_host::store::DbKv::open(&store).await.unwrap();
    let scope = format!("{id}/misbehave");
    let keys = orc_runtime::capability::KvStore::list(&kv, &scope, "").await.unwrap();
    assert_eq!(keys.len(), 10, "{keys:?}");
    assert!(keys.iter().all(|k| k.starts_with("b/") && k.len() == 1024), "{keys:?}");
    let usage = orc_runtime::capability::KvStore::usage(&kv, &id).await.unwrap();
    assert_eq!((usage.keys, usage.bytes), (10, 10_320));
}

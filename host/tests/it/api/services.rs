//! The service catalog through a real server: service versions published to its registry
//! (`/registry/v1/services`, which needs the publisher role), listed and shown under
//! `/api/v1/services` with their interfaces and each interface version's schema digest; bad
//! documents refused naming their field; unknown services answered 404.

use orc_host::store::Backend;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::Host;

/// The redis automator's digest as the host's registry holds it (it is seeded with the
/// first-party plugins).
fn redis_automator() -> &'static str {
    orc_plugin_artifacts::REDIS.digest
}

fn kv_service(version: &str) -> Value {
    json!({
        "name": "kv-store", "version": version, "description": "redis behind a kv interface",
        "automator": redis_automator(),
        "config_schema": {"type": "object", "additionalProperties": false,
            "properties": {"maxmemory": {"type": "string"}}},
        "ports": [{"name": "kv", "port": 6379}],
        "interfaces": [{
            "name": "kv", "role": "provides", "port": "kv", "allow_multiple": true, "max_connections": 4,
            "versions": [
                {"version": "1.0.0", "schema": {"type": "object", "required": ["op"]}},
                {"version": "2.0.0", "schema": {"required": ["op", "key"], "type": "object"}}
            ]
        }]
    })
}

/// `POST /registry/v1/services` with `token` (none: no `Authorization`).
async fn publish(host: &Host, token: Option<&str>, doc: &[u8]) -> (StatusCode, Value) {
    let url = host.base.replace("/api/v1", "/registry/v1/services");
    let mut req = host.client.post(url).header("content-type", "application/json").body(doc.to_vec());
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

pub async fn the_catalog_lists_published_service_versions(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let (_, empty) = host.get("/services").await;
    assert_eq!(empty["items"], json!([]));

    let v1 = serde_json::to_vec(&kv_service("1.0.0")).unwrap();
    let (status, body) = publish(&host, None, &v1).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, entry) = publish(&host, Some(&host.token), &v1).await;
    assert_eq!(status, StatusCode::CREATED, "{entry}");
    assert_eq!(entry["automator"], redis_automator());
    let (status, _) = publish(&host, Some(&host.token), &v1).await;
    assert_eq!(status, StatusCode::OK, "the same bytes again are no change");
    let (status, _) = publish(&host, Some(&host.token), &serde_json::to_vec(&kv_service("1.1.0")).unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);

    // Each refusal names its field, and nothing refused is listed.
    let mut zero = kv_service("2.0.0");
    zero["interfaces"][0]["max_connections"] = json!(0);
    let mut adaptor = kv_service("2.0.0");
    adaptor["automator"] = json!(orc_plugin_artifacts::FILE.digest);
    let mut schema = kv_service("2.0.0");
    schema["config_schema"] = json!({"type": "no-such-type"});
    let mut unpublished = kv_service("2.0.0");
    unpublished["automator"] = json!(format!("sha256:{}", "ab".repeat(32)));
    let mut twice = kv_service("2.0.0");
    let kv = twice["interfaces"][0].clone();
    twice["interfaces"].as_array_mut().unwrap().push(kv);
    for (doc, path) in [
        (zero, "interfaces[0].max_connections"),
        (adaptor, "automator"),
        (unpublished, "automator"),
        (schema, "config_schema"),
        (twice, "interfaces[1].name"),
    ] {
        let (status, body) = publish(&host, Some(&host.token), &serde_json::to_vec(&doc).unwrap()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["code"], "invalid_service", "{body}");
        assert_eq!(body["path"], path, "{body}");
        assert!(body["message"].as_str().unwrap().contains(path), "{body}");
    }
    let (status, body) = publish(
        &host,
        Some(&host.token),
        &serde_json::to_vec(&json!({"name": "kv-store", "version": "1.0.0", "automator": redis_automator(), "description": "other"}))
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("version_taken")),
        "{body}"
    );

    let (status, list) = host.get("/services").await;
    assert_eq!(status, StatusCode::OK);
    let versions: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["version"].as_str().unwrap())
        .collect();
    assert_eq!(versions, ["1.0.0", "1.1.0"]);
    let (_, one) = host.get("/services/kv-store/1.0.0").await;
    assert_eq!(one["digest"], entry["digest"]);
    assert_eq!(one["ports"], json!([{"name": "kv", "port": 6379, "protocol": "tcp"}]));
    let kv = &one["interfaces"][0];
    assert_eq!((kv["role"].as_str(), kv["limit"].as_u64()), (Some("provides"), Some(4)));
    // Version 2's schema was written in another key order: its id is its canonical digest.
    let canonical = orc_manifest::canonical::digest(&json!({"type": "object", "required": ["op", "key"]}));
    assert_eq!(kv["versions"][1]["id"], canonical.to_string());
    let (_, of_name) = host.get("/services/kv-store").await;
    assert_eq!(of_name["items"].as_array().unwrap().len(), 2);

    for path in [
        "/services/kv-store/9.9.9",
        "/services/nothing",
        "/services/nothing/1.0.0",
        "/services/a%00b/1.0.0",
        "/services/kv-store/x",
    ] {
        let (status, body) = host.get(path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert_eq!(body["code"], "unknown_service", "{path}: {body}");
    }
    // Every signed-in user reads the catalog; nobody else does.
    let (status, _) = host
        .send(Method::POST, "/users", Some(json!({"name": "reader"}).to_string().into_bytes()))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, token) = host.post("/users/reader/tokens", &json!({})).await;
    let as_reader = host
        .client
        .get(format!("{}/services", host.base))
        .bearer_auth(token["token"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(as_reader.status(), StatusCode::OK);
    let anonymous = host.client.get(format!("{}/services", host.base)).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let (status, body) = publish(&host, Some(token["token"].as_str().unwrap()), &v1).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "publishing needs the publisher role: {body}");
    host.stop().await;
}

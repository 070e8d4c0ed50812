//! Resource sets (Inmanta's partial compile): `PUT …/resource-sets/{name}` replaces one set in a
//! new version and keeps the main intent and every other set; a resource another set has is
//! refused naming both; a set is removed by an empty list. And `If-Match` on settings and
//! templates: a stale one is refused and changes nothing.

use std::collections::BTreeMap;

use orc_host::store::Backend;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::Host;

fn file(path: &str, content: &str) -> Value {
    json!({"id": format!("file[local,{path}]"), "adaptor": "file@0.1.0", "attributes": {"content": content}})
}

/// The latest version's resources: id → (set, content).
async fn latest(host: &Host, version: u64) -> BTreeMap<String, (Option<String>, String)> {
    let (status, v) = host.get(&format!("/environments/sets/intents/{version}")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["intent"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_string(),
                (
                    r["set"].as_str().map(str::to_string),
                    r["attributes"]["content"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

async fn put_set(host: &Host, name: &str, resources: Value) -> (StatusCode, Value) {
    host.send(
        Method::PUT,
        &format!("/environments/sets/resource-sets/{name}"),
        Some(json!({ "resources": resources }).to_string().into_bytes()),
    )
    .await
}

pub async fn a_resource_set_is_replaced_without_touching_another(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("sets").await;
    let (status, v) = host
        .post("/environments/sets/intents", &json!({"resources": [file("/main", "main")]}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let (status, v) = put_set(&host, "web", json!([file("/web/a", "a1"), file("/web/b", "b1")])).await;
    assert_eq!((status, v["version"].as_u64()), (StatusCode::CREATED, Some(2)), "{v}");
    let (_, v) = put_set(&host, "db", json!([file("/db", "d1")])).await;
    assert_eq!(v["version"], 3);
    let web = Some("web".to_string());
    let db = Some("db".to_string());
    let expected: BTreeMap<String, (Option<String>, String)> = [
        ("file[local,/main]", (None, "main")),
        ("file[local,/web/a]", (web.clone(), "a1")),
        ("file[local,/web/b]", (web.clone(), "b1")),
        ("file[local,/db]", (db.clone(), "d1")),
    ]
    .into_iter()
    .map(|(id, (set, c))| (id.to_string(), (set, c.to_string())))
    .collect();
    assert_eq!(latest(&host, 3).await, expected);

    // Replacing `web` changes `web` only.
    let (_, v) = put_set(&host, "web", json!([file("/web/a", "a2")])).await;
    assert_eq!(v["version"], 4);
    let now = latest(&host, 4).await;
    assert_eq!(now.len(), 3, "{now:?}");
    assert_eq!(now["file[local,/web/a]"], (web.clone(), "a2".to_string()));
    assert_eq!(now["file[local,/db]"], (db.clone(), "d1".to_string()));
    assert_eq!(now["file[local,/main]"], (None, "main".to_string()));

    // A resource another set (or the main intent) has is refused naming both; nothing is kept.
    for (set, resource, other) in [
        ("db", file("/web/a", "x"), "set `web`"),
        ("db", file("/main", "x"), "the main intent"),
    ] {
        let (status, answer) = put_set(&host, set, json!([resource])).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (StatusCode::CONFLICT, Some("resource_set_conflict")),
            "{answer}"
        );
        let message = answer["message"].as_str().unwrap();
        assert!(message.contains("set `db`") && message.contains(other), "{message}");
    }
    let (status, answer) = put_set(&host, "Bad!", json!([])).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_resource_set")),
        "{answer}"
    );
    let mut foreign = file("/db2", "x");
    foreign["set"] = json!("web");
    let (status, answer) = put_set(&host, "db", json!([foreign])).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_resource_set")),
        "{answer}"
    );
    let (_, env) = host.get("/environments/sets").await;
    assert_eq!(env["latest_version"], 4, "refusals made no version");

    // An empty list removes the set; the files of what stays are deployed.
    let (_, v) = put_set(&host, "web", json!([])).await;
    assert_eq!(v["version"], 5);
    let now = latest(&host, 5).await;
    assert_eq!(now.keys().cloned().collect::<Vec<_>>(), ["file[local,/db]", "file[local,/main]"]);
    host.wait_for_resources("sets", "status=deployed", |items| items.len() == 2).await;
    assert_eq!(std::fs::read_to_string(host.node_root("sets").join("db")).unwrap(), "d1");
    host.stop().await;
}

/// A request with an `If-Match`: its status, body and `ETag`.
async fn with_if_match(host: &Host, method: Method, path: &str, body: Option<Value>, tag: &str) -> (StatusCode, Value, Option<String>) {
    let mut req = host
        .client
        .request(method, format!("{}{path}", host.base))
        .bearer_auth(&host.token)
        .header("if-match", tag);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let etag = resp.headers().get("etag").map(|v| v.to_str().unwrap().to_string());
    (status, resp.json().await.unwrap_or(Value::Null), etag)
}

/// Settings and templates carry an `ETag`; a change naming a stale one is refused (409
/// `version_conflict`, naming what is current) and changes nothing.
pub async fn a_stale_if_match_is_refused_for_settings_and_templates(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("sets").await;
    let resp = host
        .client
        .get(format!("{}/environments/sets", host.base))
        .bearer_auth(&host.token)
        .send()
        .await
        .unwrap();
    let tag = resp.headers()["etag"].to_str().unwrap().to_string();
    let grant = json!({"settings": {"capabilities": {"node_commands": true}}});
    let (status, answer, _) = with_if_match(
        &host,
        Method::PATCH,
        "/environments/sets",
        Some(grant.clone()),
        "\"s-0000000000000000\"",
    )
    .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("version_conflict")),
        "{answer}"
    );
    assert!(answer["message"].as_str().unwrap().contains(tag.trim_matches('"')), "{answer}");
    let (_, env) = host.get("/environments/sets").await;
    assert_eq!(env["settings"]["capabilities"]["node_commands"], false, "nothing changed");
    let (status, env, new_tag) = with_if_match(&host, Method::PATCH, "/environments/sets", Some(grant.clone()), &tag).await;
    assert_eq!(status, StatusCode::OK, "{env}");
    assert_ne!(new_tag.as_deref(), Some(tag.as_str()));
    // The old tag is stale now.
    let (status, _, _) = with_if_match(&host, Method::PATCH, "/environments/sets", Some(grant), &tag).await;
    assert_eq!(status, StatusCode::CONFLICT);

    let template = json!({"services": {"s": {"automator": "shell@0.1.0"}}, "defaults": {"size": 1}});
    let path = "/environments/sets/templates/t";
    let (status, v1, tag) = with_if_match(&host, Method::POST, path, Some(template.clone()), "\"0\"").await;
    assert_eq!(
        (status, v1["version"].as_i64(), tag.as_deref()),
        (StatusCode::CREATED, Some(1), Some("\"1\"")),
        "{v1}"
    );
    let (status, answer, _) = with_if_match(&host, Method::POST, path, Some(template.clone()), "\"0\"").await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("version_conflict")),
        "{answer}"
    );
    assert!(answer["message"].as_str().unwrap().contains("at version 1, not 0"), "{answer}");
    let (status, v2, _) = with_if_match(&host, Method::POST, path, Some(template), "\"1\"").await;
    assert_eq!((status, v2["version"].as_i64()), (StatusCode::CREATED, Some(2)), "{v2}");
    let (status, answer, _) = with_if_match(&host, Method::DELETE, path, None, "\"1\"").await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("version_conflict")),
        "{answer}"
    );
    let (status, _, _) = with_if_match(&host, Method::DELETE, path, None, "W/\"2\"").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    host.stop().await;
}

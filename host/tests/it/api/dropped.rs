//! Resources dropped from an intent: when a version that no longer has them is released, they
//! are no longer managed — their states leave the listing, the counts and the metrics — but what
//! they made on the device stays (purging is the way to remove it).

use std::time::Duration;

use orc_host::store::Backend;
use orc_tests::wait_for;
use reqwest::StatusCode;
use serde_json::Value;

use super::{Host, QUICKSTART, read};

const DROPPED: [&str; 2] = ["file[local,/etc/orc-secret.conf]", "file[local,/srv/www/index.html]"];

fn quickstart_without(ids: &[&str]) -> Vec<u8> {
    let mut doc: Value = serde_json::from_str(QUICKSTART).unwrap();
    doc["resources"]
        .as_array_mut()
        .unwrap()
        .retain(|r| !ids.iter().any(|id| r["id"] == *id));
    doc.to_string().into_bytes()
}

fn ids(items: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = items.iter().map(|r| r["resource_id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    ids
}

impl Host {
    /// The text of `/metrics` once it contains `line` (bounded, so a miss fails).
    async fn metrics_with(&self, line: &str) -> String {
        let url = format!("{}/metrics", self.base.trim_end_matches("/api/v1"));
        wait_for(&format!("the metrics to show `{line}`"), Duration::from_secs(30), async || {
            let text = self.client.get(&url).send().await.unwrap().text().await.unwrap();
            if text.contains(line) { Ok(text) } else { Err(format!("\n{text}")) }
        })
        .await
    }
}

pub async fn resources_dropped_from_the_intent_are_no_longer_listed(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("dev").await;
    let (status, body) = host.post_raw("/environments/dev/intents", QUICKSTART.as_bytes()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    host.wait_for_resources("dev", "status=deployed", |items| items.len() == 6).await;

    let (status, body) = host.post_raw("/environments/dev/intents", &quickstart_without(&DROPPED)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let listed = host
        .wait_for_resources("dev", "", |items| {
            items.len() == 4 && items.iter().all(|r| r["version"] == 2 && r["status"] == "deployed")
        })
        .await;
    assert!(ids(&listed).iter().all(|id| !DROPPED.contains(&id.as_str())), "{listed:?}");
    for id in DROPPED {
        let (status, body) = host.get(&format!("/environments/dev/resources/{}", super::encode(id))).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{id}: {body}");
    }
    let (_, env) = host.get("/environments/dev").await;
    assert_eq!(env["resources"], serde_json::json!({ "deployed": 4 }), "{env}");
    let metrics = host.metrics_with(r#"orc_resources{environment="dev",status="deployed"} 4"#).await;
    assert!(!metrics.contains(r#"orc_resources{environment="dev",status="deployed"} 6"#));
    // Not managed is not removed: the files are still on the node.
    let root = host.node_root("dev");
    assert_eq!(read(&root, "etc/orc-secret.conf"), "token = not-a-real-secret\n");
    assert_eq!(read(&root, "srv/www/index.html"), "<h1>Deployed by orc</h1>\n");

    // A restart resumes the released version without bringing the dropped states back.
    let token = host.token.clone();
    let data = host.stop().await;
    let host = Host::start_with(data, 1 << 20, Some(token)).await;
    let (_, page) = host.get("/environments/dev/resources").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 4, "{page}");

    // Brought back by a later version, a resource is managed (and listed) again.
    let (status, body) = host.post_raw("/environments/dev/intents", &quickstart_without(&DROPPED[..1])).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let listed = host
        .wait_for_resources("dev", "", |items| {
            items.len() == 5 && items.iter().all(|r| r["version"] == 3 && r["status"] == "deployed")
        })
        .await;
    assert!(ids(&listed).contains(&DROPPED[1].to_string()), "{listed:?}");
}

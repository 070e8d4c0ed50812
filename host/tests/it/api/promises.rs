//! Promises the scheduler keeps as a client sees them through the API, each a regression test
//! of a way it once broke: a repair requested while actions run reaches every resource (files
//! checked on disk), the counts describe the released version from the moment its 201 is
//! answered, and settings no duration can hold are refused by name instead of stopping the
//! scheduler.

use std::time::{Duration, Instant};

use orc_host::store::Backend;
use orc_tests::wait_for;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{Host, assert_error};

impl Host {
    /// Polls the environment's counts until `n` resources are deployed (bounded, so a hang fails).
    async fn wait_deployed_count(&self, env: &str, n: usize) {
        wait_for(&format!("all {n} deployed"), Duration::from_secs(120), async || {
            let counts = self.counts(env).await;
            if counts["deployed"].as_u64() == Some(n as u64) && counts.as_object().is_some_and(|c| c.len() == 1) {
                Ok(())
            } else {
                Err(counts)
            }
        })
        .await
    }
}

/// `n` files in one directory of the local node, each with `content` and its index.
fn files(n: usize, content: &str) -> Vec<u8> {
    let mut resources = vec![json!({ "id": "directory[local,/srv/many]", "adaptor": "directory@0.1.0", "attributes": {} })];
    resources.extend((0..n).map(|i| {
        json!({ "id": format!("file[local,/srv/many/f{i}]"), "adaptor": "file@0.1.0",
                "attributes": { "content": format!("{content} {i}\n") }, "requires": ["directory[local,/srv/many]"] })
    }));
    json!({ "resources": resources }).to_string().into_bytes()
}

pub async fn a_repair_requested_while_actions_run_reaches_every_file(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 22).await;
    host.create_environment("dev").await;
    let n = 300;
    let (status, body) = host.post_raw("/environments/dev/intents", &files(n, "first")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // The first wave of actions runs now: the repair arrives while they are in flight.
    let first = host.run_to_completion("/environments/dev/repair", None).await;
    assert_eq!(first["status"], "done", "{first}");
    host.wait_deployed_count("dev", n + 1).await;

    // Every file deleted behind orc's back: one repair restores them all.
    let root = host.node_root("dev");
    for i in 0..n {
        std::fs::remove_file(root.join(format!("srv/many/f{i}"))).unwrap();
    }
    let second = host.run_to_completion("/environments/dev/repair", None).await;
    assert_eq!(second["status"], "done", "{second}");
    assert_eq!(second["result"]["resources"]["deployed"], n + 1, "{second}");
    let missing: Vec<usize> = (0..n)
        .filter(|i| std::fs::read_to_string(root.join(format!("srv/many/f{i}"))).ok() != Some(format!("first {i}\n")))
        .collect();
    assert!(missing.is_empty(), "the repair never reached {} files: {missing:?}", missing.len());
    let dryrun = host.run_to_completion("/environments/dev/dryrun", None).await;
    assert_eq!(dryrun["status"], "done", "{dryrun}");
    let summary = &dryrun["report"]["summary"];
    assert_eq!(
        summary,
        &json!({ "no_change": n + 1, "would_change": 0, "unchecked": 0 }),
        "{summary}"
    );
}

pub async fn the_counts_describe_the_released_version_from_its_201(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 22).await;
    host.create_environment("dev").await;
    let n = 50;
    let (status, body) = host.post_raw("/environments/dev/intents", &files(n, "one")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Answered once the version's states are recorded: never the previous version's counts.
    let counts = host.counts("dev").await;
    assert_eq!(
        counts.as_object().unwrap().values().filter_map(Value::as_u64).sum::<u64>(),
        n as u64 + 1,
        "{counts}"
    );
    host.wait_deployed_count("dev", n + 1).await;

    // Halted, a new version that changes every file cannot deploy: from its 201 on, the counts
    // say so (they used to show the previous version's `deployed` until the first batch).
    let (status, _) = host.post("/environments/dev/halt", &json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = host.post_raw("/environments/dev/intents", &files(n, "two")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let counts = host.counts("dev").await;
    assert_eq!(counts, json!({ "available": n, "deployed": 1 }), "right after the 201");
    let (_, page) = host.get("/environments/dev/resources?status=deployed").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1, "{page}");

    // Resumed, it deploys; a version submitted while actions run is counted whole at once (how
    // far it got by then depends on the machine: these actions take milliseconds).
    let (status, _) = host.post("/environments/dev/resume", &json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = host.post_raw("/environments/dev/intents", &files(n, "three")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let counts = host.counts("dev").await;
    let total: u64 = counts.as_object().unwrap().values().filter_map(Value::as_u64).sum();
    assert_eq!(total, n as u64 + 1, "{counts}");
    host.wait_deployed_count("dev", n + 1).await;
    let root = host.node_root("dev");
    for i in 0..n {
        assert_eq!(
            std::fs::read_to_string(root.join(format!("srv/many/f{i}"))).unwrap(),
            format!("three {i}\n")
        );
    }
}

pub async fn settings_no_scheduler_can_hold_are_refused_by_name(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("dev").await;
    let (status, body) = host.post_raw("/environments/dev/intents", &files(3, "x")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    host.wait_deployed_count("dev", 4).await;
    for (settings, field, bound) in [
        (
            json!({ "repair_interval_s": 9_223_372_036_854_775_808u64 }),
            "repair_interval_s",
            "31536000",
        ),
        (json!({ "retry_interval_s": u64::MAX }), "retry_interval_s", "86400"),
        (json!({ "per_node_concurrency": 1_000_000 }), "per_node_concurrency", "256"),
        (json!({ "env_concurrency": 4_000_000_000u64 }), "env_concurrency", "1000"),
        (json!({ "call_timeout_s": u64::MAX }), "call_timeout_s", "86400"),
    ] {
        let (status, body) = host.patch("/environments/dev", &json!({ "settings": settings })).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{settings}: {body}");
        assert_eq!(body["code"], "invalid_settings", "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains(field) && message.contains(bound),
            "{settings}: `{message}` names the field and its bound"
        );
    }
    assert_error(
        host.post(
            "/environments",
            &json!({ "name": "careless", "settings": { "repair_interval_s": u64::MAX } }),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_settings",
        "repair_interval_s",
    );
    // The largest accepted values run: the scheduler is still there and answers.
    let (status, body) = host
        .patch(
            "/environments/dev",
            &json!({ "settings": { "repair_interval_s": 31_536_000, "retry_interval_s": 86_400 } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let repair = host.run_to_completion("/environments/dev/repair", None).await;
    assert_eq!(repair["status"], "done", "{repair}");
    assert_eq!(repair["result"]["resources"]["deployed"], 4, "{repair}");
    let (_, env) = host.get("/environments/dev").await;
    assert_eq!(env["scheduler"], json!({ "status": "running" }), "{env}");
    let (status, ready) = host.get("/ready").await;
    assert_eq!(status, StatusCode::OK, "{ready}");
    let started = Instant::now();
    let (status, body) = host.post_raw("/environments/dev/intents", &files(3, "y")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    host.wait_deployed_count("dev", 4).await;
    assert!(started.elapsed() < Duration::from_secs(60));
}

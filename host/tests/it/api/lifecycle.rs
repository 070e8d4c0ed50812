//! The operator's lifecycle beyond submitting: settings, halt and resume, version diff, dryrun,
//! rollback, deploy and repair as operations with an outcome, the action log, the event stream,
//! and the OpenAPI document checked against what the server really answers.

use std::time::Duration;

use orc_host::store::Backend;
use orc_tests::wait_for;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Host, QUICKSTART, assert_error, encode, read};

const MOTD: &str = "Welcome. This machine is managed by orc.\n";

/// The quickstart intent with `edit` applied to its resources.
fn quickstart_with(edit: impl FnOnce(&mut Vec<Value>)) -> Vec<u8> {
    let mut doc: Value = serde_json::from_str(QUICKSTART).unwrap();
    edit(doc["resources"].as_array_mut().unwrap());
    doc.to_string().into_bytes()
}

fn resource<'a>(resources: &'a mut [Value], id: &str) -> &'a mut Value {
    resources.iter_mut().find(|r| r["id"] == id).unwrap()
}

impl Host {
    pub(crate) async fn patch(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.send(Method::PATCH, path, Some(body.to_string().into_bytes())).await
    }

    pub(crate) async fn counts(&self, env: &str) -> Value {
        let (status, body) = self.get(&format!("/environments/{env}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["resources"].clone()
    }

    pub(crate) async fn wait_all_deployed(&self, env: &str, n: usize) {
        self.wait_for_resources(env, "status=deployed", |items| items.len() == n).await;
    }
}

pub async fn settings_change_and_halt_holds_everything_until_resume(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("dev").await;

    // Only the fields given change.
    let (status, env) = host
        .patch(
            "/environments/dev",
            &json!({ "settings": { "repair_interval_s": 5, "per_node_concurrency": 3 } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{env}");
    assert_eq!(env["settings"]["repair_interval_s"], 5);
    assert_eq!(env["settings"]["per_node_concurrency"], 3);
    assert_eq!(env["settings"]["retry_interval_s"], 60, "untouched fields keep their value: {env}");
    let (_, again) = host.get("/environments/dev").await;
    assert_eq!(again["settings"], env["settings"]);
    assert_error(
        host.patch("/environments/dev", &json!({ "settings": { "repair_intervall_s": 5 } }))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_settings",
        "repair_intervall_s",
    );
    assert_error(
        host.patch("/environments/dev", &json!({ "settings": { "env_concurrency": 0 } }))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_settings",
        "env_concurrency",
    );
    assert_error(
        host.patch("/environments/dev", &json!({ "settings": { "auto_deploy": "yes" } }))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_settings",
        "boolean",
    );
    assert_error(
        host.post(
            "/environments",
            &json!({ "name": "zero", "settings": { "per_node_concurrency": 0 } }),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_settings",
        "per_node_concurrency",
    );

    // Halted: a released version is recorded as wanted, and nothing runs.
    let (status, halted) = host.post("/environments/dev/halt", &json!({})).await;
    assert_eq!((status, &halted["halted"]), (StatusCode::OK, &json!(true)), "{halted}");
    let (status, _) = host.post_raw("/environments/dev/intents", QUICKSTART.as_bytes()).await;
    assert_eq!(status, StatusCode::CREATED);
    host.wait_for_resources("dev", "status=available", |items| items.len() == 6).await;
    // A repair settles at once while halted (nothing is in flight) and ran nothing.
    let repair = host.run_to_completion("/environments/dev/repair", None).await;
    assert_eq!(repair["result"]["actions"], json!({}), "{repair}");
    assert_eq!(repair["result"]["resources"], json!({ "available": 6 }), "{repair}");
    assert_eq!(host.counts("dev").await, json!({ "available": 6 }));
    assert!(!host.node_root("dev").join("etc/motd").exists());

    // Halted is kept across a restart.
    let token = host.token.clone();
    let data = host.stop().await;
    let host = Host::start_with(data, 1 << 20, Some(token)).await;
    let (_, env) = host.get("/environments/dev").await;
    assert_eq!(env["halted"], true, "{env}");
    assert_eq!(host.counts("dev").await, json!({ "available": 6 }));

    let (status, resumed) = host.post("/environments/dev/resume", &json!({})).await;
    assert_eq!((status, &resumed["halted"]), (StatusCode::OK, &json!(false)), "{resumed}");
    host.wait_all_deployed("dev", 6).await;
    assert_eq!(read(&host.node_root("dev"), "etc/motd"), MOTD);
    assert_error(
        host.post("/environments/nope/halt", &json!({})).await,
        StatusCode::NOT_FOUND,
        "unknown_environment",
        "nope",
    );
}

pub async fn diff_dryrun_and_rollback_of_versions(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("dev").await;
    assert_error(
        host.post("/environments/dev/dryrun", &json!({})).await,
        StatusCode::CONFLICT,
        "no_version",
        "dev",
    );
    host.post_raw("/environments/dev/intents", QUICKSTART.as_bytes()).await;
    host.wait_all_deployed("dev", 6).await;
    let root = host.node_root("dev");

    // Version 2, not released: one file changed, one resource gone, one added, and one that
    // cannot be checked (a file where a directory is).
    let (_, env) = host
        .patch("/environments/dev", &json!({ "settings": { "auto_deploy": false } }))
        .await;
    assert_eq!(env["settings"]["auto_deploy"], false);
    let v2 = quickstart_with(|resources| {
        resource(resources, "file[local,/etc/motd]")["attributes"]["content"] = json!("Changed.\n");
        resources.retain(|r| r["id"] != "file[local,/etc/orc-secret.conf]");
        resources.push(json!({ "id": "file[local,/etc/issue]", "adaptor": "file@0.1.0", "attributes": { "content": "orc\n" } }));
        resources.push(json!({ "id": "file[local,/srv/www]", "adaptor": "file@0.1.0", "attributes": { "content": "x" } }));
    });
    let (status, submitted) = host.post_raw("/environments/dev/intents", &v2).await;
    assert_eq!(
        (status, &submitted),
        (StatusCode::CREATED, &json!({ "version": 2, "released": false }))
    );

    let (status, diff) = host.get("/environments/dev/intents/1/diff/2").await;
    assert_eq!(status, StatusCode::OK, "{diff}");
    assert_eq!(diff["added"], json!(["file[local,/etc/issue]", "file[local,/srv/www]"]), "{diff}");
    assert_eq!(diff["removed"], json!(["file[local,/etc/orc-secret.conf]"]), "{diff}");
    assert_eq!(diff["unchanged"], 4, "{diff}");
    assert_eq!(
        diff["changed"],
        json!([{ "resource": "file[local,/etc/motd]", "fields": [{ "field": "attributes/content", "from": MOTD, "to": "Changed.\n" }] }])
    );
    assert_error(
        host.get("/environments/dev/intents/1/diff/9").await,
        StatusCode::NOT_FOUND,
        "not_found",
        "version 9",
    );

    // Dryrun of version 2 (the latest, by default): changes nothing, reports per resource.
    let dryrun = host.run_to_completion("/environments/dev/dryrun", None).await;
    assert_eq!(dryrun["status"], "done", "{dryrun}");
    assert_eq!(dryrun["version"], 2);
    let report = &dryrun["report"];
    assert_eq!(
        report["summary"],
        json!({ "no_change": 4, "would_change": 2, "unchecked": 1 }),
        "{report}"
    );
    let finding = |id: &str| {
        report["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == id)
            .unwrap()
            .clone()
    };
    let motd = finding("file[local,/etc/motd]");
    assert_eq!(motd["finding"], "would_change");
    assert_eq!(motd["changes"][0]["field"], "content", "{motd}");
    assert_eq!(motd["changes"][0]["desired"], "Changed.\n", "{motd}");
    assert_eq!(finding("file[local,/etc/issue]")["finding"], "would_change");
    assert_eq!(finding("directory[local,/srv]")["finding"], "no_change");
    let unchecked = finding("file[local,/srv/www]");
    assert_eq!(unchecked["finding"], "unchecked", "{unchecked}");
    assert!(!unchecked["reason"]["message"].as_str().unwrap().is_empty(), "{unchecked}");
    assert_eq!(read(&root, "etc/motd"), MOTD, "a dryrun changes nothing");
    assert!(!root.join("etc/issue").exists());
    // Of an explicit version; listed; unknown version and ids refused.
    let of_one = host
        .run_to_completion("/environments/dev/dryrun", Some(json!({ "version": 1 })))
        .await;
    assert_eq!(
        of_one["report"]["summary"],
        json!({ "no_change": 6, "would_change": 0, "unchecked": 0 }),
        "{of_one}"
    );
    let (_, list) = host.get("/environments/dev/dryruns").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 2, "{list}");
    assert!(list["items"][0]["report"].is_null());
    assert_error(
        host.post("/environments/dev/dryrun", &json!({ "version": 7 })).await,
        StatusCode::NOT_FOUND,
        "not_found",
        "version 7",
    );
    assert_error(
        host.post("/environments/dev/dryrun", &json!({ "versoin": 1 })).await,
        StatusCode::BAD_REQUEST,
        "invalid_json",
        "versoin",
    );
    assert_error(
        host.get("/environments/dev/dryruns/nope").await,
        StatusCode::BAD_REQUEST,
        "invalid_path",
        "nope",
    );

    // Release 2 (without the unplaceable file), then roll back to 1: a new version 4 with 1's
    // document, released at once, and the files are 1's again.
    let v3 = quickstart_with(|resources| {
        resource(resources, "file[local,/etc/motd]")["attributes"]["content"] = json!("Changed.\n");
    });
    let (status, _) = host.post_raw("/environments/dev/intents", &v3).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = host.post("/environments/dev/intents/3/release", &json!({})).await;
    assert_eq!(status, StatusCode::OK);
    wait_for("version 3 to deploy", Duration::from_secs(60), async || {
        read(&root, "etc/motd") == "Changed.\n"
    })
    .await;
    let (status, rolled) = host.post("/environments/dev/intents/1/rollback", &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{rolled}");
    assert_eq!((&rolled["version"], &rolled["active"]), (&json!(4), &json!(true)), "{rolled}");
    let (_, v4) = host.get("/environments/dev/intents/4").await;
    let (_, v1) = host.get("/environments/dev/intents/1").await;
    assert_eq!(v4["intent"], v1["intent"]);
    wait_for("the rollback to deploy", Duration::from_secs(60), async || {
        read(&root, "etc/motd") == MOTD
    })
    .await;
    let (_, diff) = host.get("/environments/dev/intents/1/diff/4").await;
    assert_eq!((diff["unchanged"].clone(), diff["changed"].clone()), (json!(6), json!([])));
    assert_error(
        host.post("/environments/dev/intents/99/rollback", &json!({})).await,
        StatusCode::NOT_FOUND,
        "not_found",
        "version 99",
    );
}

/// A file whose content is named `sensitive` is written whole, and no view shows it: the
/// version, the diff between versions (which still says the content changed), a dryrun's
/// findings, the action log.
pub async fn a_sensitive_value_is_deployed_whole_and_never_shown(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("dev").await;
    let intent = |token: &str| {
        serde_json::to_vec(&json!({"resources": [{
            "id": "file[local,/app.env]", "adaptor": "file@0.1.0", "sensitive": ["/content"],
            "attributes": {"content": format!("TOKEN={token}\n"), "mode": "0600"}
        }]}))
        .unwrap()
    };
    let (status, answer) = host.post_raw("/environments/dev/intents", &intent("hunter2")).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    host.wait_all_deployed("dev", 1).await;
    let root = host.node_root("dev");
    assert_eq!(read(&root, "app.env"), "TOKEN=hunter2\n");

    let (_, env) = host
        .patch("/environments/dev", &json!({ "settings": { "auto_deploy": false } }))
        .await;
    assert_eq!(env["settings"]["auto_deploy"], false);
    let (status, answer) = host.post_raw("/environments/dev/intents", &intent("swordfish")).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (_, v2) = host.get("/environments/dev/intents/2").await;
    let r = &v2["intent"]["resources"][0];
    assert_eq!(
        (&r["attributes"]["content"], &r["attributes"]["mode"]),
        (&json!("<redacted>"), &json!("0600")),
        "{v2}"
    );
    let (_, diff) = host.get("/environments/dev/intents/1/diff/2").await;
    assert_eq!(
        diff["changed"],
        json!([{"resource": "file[local,/app.env]", "fields": [{"field": "attributes/content", "from": "<redacted>", "to": "<redacted>"}]}]),
        "{diff}"
    );
    let dryrun = host.run_to_completion("/environments/dev/dryrun", None).await;
    let finding = &dryrun["report"]["resources"][0];
    assert_eq!(finding["finding"], "would_change", "{dryrun}");
    assert_eq!(finding["changes"][0]["field"], "content", "{dryrun}");
    assert_eq!(finding["changes"][0]["desired"], "<redacted>", "{dryrun}");

    let (status, answer) = host.post("/environments/dev/intents/2/release", &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    for _ in 0..200 {
        if read(&root, "app.env") == "TOKEN=swordfish\n" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(read(&root, "app.env"), "TOKEN=swordfish\n");
    let (_, v1) = host.get("/environments/dev/intents/1").await;
    // The second write's action is recorded a moment after the file is written.
    let mut actions = Value::Null;
    for _ in 0..200 {
        actions = host.get("/environments/dev/actions?resource=file%5Blocal%2C%2Fapp.env%5D").await.1;
        if actions["items"].as_array().unwrap().len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(actions["items"].as_array().unwrap().len() >= 2, "{actions}");
    assert_eq!(actions["items"][0]["changes"][0]["desired"], "<redacted>", "{actions}");
    for (what, body) in [
        ("version 1", &v1),
        ("version 2", &v2),
        ("diff", &diff),
        ("dryrun", &dryrun),
        ("action log", &actions),
    ] {
        let text = body.to_string();
        assert!(
            !text.contains("hunter2") && !text.contains("swordfish"),
            "the {what} shows a secret: {text}"
        );
    }
}

pub async fn deploy_and_repair_report_their_outcome_and_the_log_is_queried(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("dev").await;
    host.post_raw("/environments/dev/intents", QUICKSTART.as_bytes()).await;
    host.wait_all_deployed("dev", 6).await;
    let root = host.node_root("dev");

    std::fs::write(root.join("etc/motd"), "drift\n").unwrap();
    let repair = host.run_to_completion("/environments/dev/repair", None).await;
    assert_eq!((&repair["kind"], &repair["status"]), (&json!("repair"), &json!("done")), "{repair}");
    assert_eq!(repair["result"]["version"], 1);
    assert_eq!(repair["result"]["resources"], json!({ "deployed": 6 }), "{repair}");
    assert_eq!(repair["result"]["actions"], json!({ "changed": 1, "unchanged": 5 }), "{repair}");
    assert_eq!(read(&root, "etc/motd"), MOTD);
    let deploy = host.run_to_completion("/environments/dev/deploy", None).await;
    assert_eq!(deploy["result"]["actions"], json!({}), "nothing failed, nothing to retry: {deploy}");
    assert_error(
        host.get("/environments/dev/operations/0193b3a4-0000-7000-8000-000000000000").await,
        StatusCode::NOT_FOUND,
        "not_found",
        "operation",
    );

    // The environment's log, newest first, filtered and paged.
    let (status, page) = host.get("/environments/dev/actions?kind=repair&limit=4").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 4);
    assert!(items.iter().all(|a| a["kind"] == "repair"));
    assert!(items.windows(2).all(|w| w[0]["seq"].as_i64() > w[1]["seq"].as_i64()));
    let before = page["next_before"].as_i64().unwrap();
    let (_, rest) = host.get(&format!("/environments/dev/actions?kind=repair&before={before}")).await;
    assert_eq!(rest["items"].as_array().unwrap().len(), 2, "{rest}");
    assert!(rest["next_before"].is_null());
    let (_, changed) = host.get("/environments/dev/actions?outcome=changed&kind=repair").await;
    assert_eq!(changed["items"][0]["resource_id"], "file[local,/etc/motd]", "{changed}");
    assert_eq!(changed["items"][0]["changes"][0]["current"], "drift\n", "{changed}");
    assert!(changed["items"][0]["finished_at"].as_i64() >= changed["items"][0]["started_at"].as_i64());
    // One resource's log.
    let motd = encode("file[local,/etc/motd]");
    let (status, log) = host.get(&format!("/environments/dev/resources/{motd}/actions")).await;
    assert_eq!(status, StatusCode::OK, "{log}");
    let kinds: Vec<&str> = log["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["repair", "deploy"], "{log}");
    assert_error(
        host.get("/environments/dev/actions?kind=sing").await,
        StatusCode::BAD_REQUEST,
        "invalid_query",
        "sing",
    );
    assert_error(
        host.get(&format!("/environments/dev/resources/{}/actions", encode("file[local,/nope]")))
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
        "file[local,/nope]",
    );
}

/// One event stream as a test reads it: its messages, each `(id, event, data)`.
struct Messages {
    body: futures::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>,
    text: String,
}

impl Messages {
    /// `GET /environments/{env}/events`, with `Last-Event-ID` if given.
    async fn open(host: &Host, env: &str, last_event_id: Option<&str>) -> Messages {
        use futures::StreamExt;
        let mut request = host
            .client
            .get(format!("{}/environments/{env}/events", host.base))
            .bearer_auth(&host.token);
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let resp = request.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        Messages {
            body: resp.bytes_stream().map(|chunk| chunk.map(|b| b.to_vec())).boxed(),
            text: String::new(),
        }
    }

    /// The next message (keep-alive comments skipped); `None` once the stream ended.
    async fn next(&mut self) -> Option<(Option<String>, String, String)> {
        use futures::StreamExt;
        loop {
            while let Some(end) = self.text.find("\n\n") {
                let message: String = self.text.drain(..end + 2).collect();
                let field = |name: &str| message.lines().find_map(|l| l.strip_prefix(name)).map(str::to_string);
                if let Some(data) = field("data: ") {
                    return Some((field("id: "), field("event: ").unwrap_or_default(), data));
                }
            }
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.body.next())
                .await
                .expect("events in time")?
                .unwrap();
            self.text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

pub async fn the_event_stream_shows_states_and_actions(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("dev").await;
    let mut stream = Messages::open(&host, "dev", None).await;
    host.post_raw("/environments/dev/intents", QUICKSTART.as_bytes()).await;

    // Read events until every resource has an action and a `deployed` state.
    let (mut messages, mut actions, mut deployed) = (Vec::new(), Vec::new(), std::collections::BTreeSet::new());
    while actions.len() < 6 || deployed.len() < 6 {
        let message = stream.next().await.expect("the stream stays open");
        let (_, name, data) = &message;
        let data: Value = serde_json::from_str(data).unwrap();
        assert_eq!(data["event"], name.as_str(), "{message:?}");
        match name.as_str() {
            "state" if data["status"] == "deployed" => {
                deployed.insert(data["resource"].as_str().unwrap().to_string());
            }
            "action" => {
                assert_eq!(data["report"]["outcome"], "changed", "{data}");
                assert_eq!(data["trigger"], "deploy");
                actions.push(data["report"]["resource"].as_str().unwrap().to_string());
            }
            "state" => {}
            "released" => assert_eq!((&data["version"], &data["dropped"]), (&json!(1), &json!([])), "{data}"),
            other => panic!("unexpected event `{other}`: {message:?}"),
        }
        messages.push(message);
    }
    // Persisted before published: what the stream reported is what the API shows.
    assert_eq!(host.counts("dev").await, json!({ "deployed": 6 }));
    assert_error(
        host.get("/environments/nope/events").await,
        StatusCode::NOT_FOUND,
        "unknown_environment",
        "nope",
    );

    // Every event is numbered, in increasing order; a stream opened after one of them sends the
    // ones after it, as they were sent, and nothing twice.
    let ids: Vec<i64> = messages
        .iter()
        .map(|(id, ..)| id.as_deref().expect("an id").parse().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    let mut resumed = Messages::open(&host, "dev", messages[2].0.as_deref()).await;
    for expected in &messages[3..] {
        assert_eq!(&resumed.next().await.expect("the stream stays open"), expected);
    }
    let resp = host
        .client
        .get(format!("{}/environments/dev/events", host.base))
        .bearer_auth(&host.token)
        .header("last-event-id", "the third")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let error: Value = resp.json().await.unwrap();
    assert_eq!(error["code"], "invalid_last_event_id", "{error}");
    assert!(error["message"].as_str().unwrap().contains("the third"), "{error}");

    // Events no longer kept: a stream asked for them says so (`lagged`) once it sees that what
    // it has does not join on, and ends.
    let env_id = host.get("/environments/dev").await.1["id"].as_str().unwrap().parse().unwrap();
    let store = orc_host::store::Store::connect(&host.data.location()).await.unwrap();
    let forget = orc_host::store::Progress {
        forget_events_before: Some(orc_host::store::now_ms() + 1_000),
        ..Default::default()
    };
    store.record_progress(&env_id, None, &forget).await.unwrap();
    let mut late = Messages::open(&host, "dev", messages[0].0.as_deref()).await;
    let (status, answer) = host.post_raw("/environments/dev/intents", QUICKSTART.as_bytes()).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (id, name, data) = late.next().await.expect("told it lagged");
    assert_eq!((id, name.as_str()), (None, "lagged"), "{data}");
    let data: Value = serde_json::from_str(&data).unwrap();
    assert_eq!(data["missed_after"], ids[0], "{data}");
    assert!(data["catch_up"].as_str().unwrap().contains("/environments/dev/resources"), "{data}");
    assert!(late.next().await.is_none(), "and nothing follows");
}

/// The served OpenAPI document: a well-formed OpenAPI 3.1 document whose every schema is a valid
/// JSON Schema (2020-12) and every `$ref` resolves, which describes exactly the routes the server
/// answers, and whose response schemas accept what the server really answers.
pub async fn the_openapi_document_validates_and_matches_the_answers(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let resp = host.client.get(format!("{}/openapi.json", host.base)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "served without a token");
    let doc: Value = resp.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");

    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for (name, schema) in schemas {
        jsonschema::meta::validate(schema).unwrap_or_else(|e| panic!("components/schemas/{name} is not a valid JSON Schema: {e}"));
    }
    let text = doc.to_string();
    for reference in text.split("\"$ref\":\"").skip(1).map(|s| &s[..s.find('"').unwrap()]) {
        let name = reference
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("unexpected $ref {reference}"));
        assert!(schemas.contains_key(name), "dangling $ref {reference}");
    }
    let mut operation_ids = std::collections::BTreeSet::new();
    let paths = doc["paths"].as_object().unwrap();
    for (path, item) in paths {
        let placeholders: std::collections::BTreeSet<&str> = path.split('{').skip(1).map(|s| &s[..s.find('}').unwrap()]).collect();
        for (method, op) in item.as_object().unwrap() {
            assert!(
                ["get", "post", "put", "patch", "delete"].contains(&method.as_str()),
                "{path}: {method}"
            );
            assert!(
                operation_ids.insert(op["operationId"].as_str().unwrap().to_string()),
                "{path}: duplicate operationId"
            );
            let declared: std::collections::BTreeSet<&str> = op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .filter(|p| p["in"] == "path")
                        .map(|p| p["name"].as_str().unwrap())
                        .collect()
                })
                .unwrap_or_default();
            assert_eq!(declared, placeholders, "{method} {path}: path parameters");
            let responses = op["responses"].as_object().unwrap();
            assert!(!responses.is_empty(), "{method} {path}: no responses");
            for code in responses.keys() {
                assert!(code.len() == 3 && code.parse::<u16>().is_ok(), "{method} {path}: response `{code}`");
            }
        }
    }
    // Exactly the routes served: each documented path answers something other than the
    // fallback's 404 `no such endpoint`, and an undocumented one gets the fallback.
    for (path, item) in paths {
        let concrete = path
            .replace("{env}", "nope")
            .replace("{version}", "1")
            .replace("{other}", "2")
            .replace("{id}", "x");
        for method in item.as_object().unwrap().keys() {
            let (_, body) = host.send(method.to_uppercase().parse().unwrap(), &concrete, None).await;
            assert_ne!(body["message"], "no such endpoint", "{method} {path} is documented but not served");
        }
    }
    let (status, body) = host.get("/environments/nope/undocumented").await;
    assert_eq!((status, &body["message"]), (StatusCode::NOT_FOUND, &json!("no such endpoint")));

    // Real answers validate against their documented schemas.
    let validator = |path: &str, method: &str, status: u16| {
        let schema = &doc["paths"][path][method]["responses"][status.to_string()]["content"]["application/json"]["schema"];
        assert!(schema.is_object(), "{method} {path} documents no JSON body for {status}");
        let root = json!({ "$schema": "https://json-schema.org/draft/2020-12/schema", "components": doc["components"], "allOf": [schema] });
        jsonschema::validator_for(&root).unwrap_or_else(|e| panic!("{method} {path} {status}: {e}"))
    };
    let check = |path: &str, method: &str, got: &(StatusCode, Value)| {
        let v = validator(path, method, got.0.as_u16());
        if let Err(e) = v.validate(&got.1) {
            panic!("{method} {path} answered {} that does not match its schema: {e}\n{}", got.0, got.1);
        }
    };
    check(
        "/environments",
        "post",
        &host.post("/environments", &json!({ "name": "dev" })).await,
    );
    check(
        "/environments",
        "post",
        &host.post("/environments", &json!({ "name": "dev" })).await,
    );
    check(
        "/environments/{env}/intents",
        "post",
        &host.post_raw("/environments/dev/intents", QUICKSTART.as_bytes()).await,
    );
    check(
        "/environments/{env}/intents",
        "post",
        &host.post_raw("/environments/dev/intents", b"{").await,
    );
    host.wait_all_deployed("dev", 6).await;
    check("/environments", "get", &host.get("/environments").await);
    check("/environments/{env}", "get", &host.get("/environments/dev").await);
    check("/environments/{env}", "get", &host.get("/environments/nope").await);
    check(
        "/environments/{env}",
        "patch",
        &host
            .patch("/environments/dev", &json!({ "settings": { "auto_deploy": false } }))
            .await,
    );
    check("/environments/{env}/intents", "get", &host.get("/environments/dev/intents").await);
    check(
        "/environments/{env}/intents/{version}",
        "get",
        &host.get("/environments/dev/intents/1").await,
    );
    check(
        "/environments/{env}/intents/{version}/diff/{other}",
        "get",
        &host.get("/environments/dev/intents/1/diff/1").await,
    );
    check(
        "/environments/{env}/resources",
        "get",
        &host.get("/environments/dev/resources").await,
    );
    check(
        "/environments/{env}/resources/{id}",
        "get",
        &host
            .get(&format!("/environments/dev/resources/{}", encode("file[local,/etc/motd]")))
            .await,
    );
    check("/environments/{env}/actions", "get", &host.get("/environments/dev/actions").await);
    check(
        "/environments/{env}/deploy",
        "post",
        &host.post("/environments/dev/deploy", &json!({})).await,
    );
    let dryrun = host.run_to_completion("/environments/dev/dryrun", None).await;
    check("/environments/{env}/dryruns/{id}", "get", &(StatusCode::OK, dryrun));
    check("/environments/{env}/dryruns", "get", &host.get("/environments/dev/dryruns").await);
    let repair = host.run_to_completion("/environments/dev/repair", None).await;
    check("/environments/{env}/operations/{id}", "get", &(StatusCode::OK, repair));
    check(
        "/environments/{env}/halt",
        "post",
        &host.post("/environments/dev/halt", &json!({})).await,
    );
    check("/health", "get", &host.get("/health").await);
}

/// Admin tokens are created (the secret shown once), listed, and revoked, the last one never; a
/// registry client publishes to `/registry` with one and is refused without.
pub async fn tokens_are_managed_and_guard_publishing(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let (status, created) = host.post("/tokens", &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let second = created["token"].as_str().unwrap().to_string();
    assert!(second.starts_with("orc_") && second != host.token);
    let (_, list) = host.get("/tokens").await;
    let ids: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{list}");
    assert!(!list.to_string().contains(&second), "secrets are never listed: {list}");
    let first_id = ids.iter().find(|id| **id != created["id"]).unwrap().to_string();

    // The second token works; revoking the first shuts it out at once.
    let with = |token: &str| {
        host.client
            .get(format!("{}/environments", host.base))
            .bearer_auth(token.to_string())
            .send()
    };
    assert_eq!(with(&second).await.unwrap().status(), StatusCode::OK);
    let (status, _) = host.send(Method::DELETE, &format!("/tokens/{first_id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(with(&host.token).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let revoke_last = host
        .client
        .delete(format!("{}/tokens/{}", host.base, created["id"].as_str().unwrap()))
        .bearer_auth(&second)
        .send()
        .await
        .unwrap();
    assert_eq!(revoke_last.status(), StatusCode::CONFLICT);
    let body: Value = revoke_last.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("last"), "{body}");
    assert_eq!(with(&second).await.unwrap().status(), StatusCode::OK);

    // Publishing through the registry client: refused without a token, accepted with one.
    let registry = format!("{}/registry", host.base.trim_end_matches("/api/v1"));
    // A fixture: not among the first-party plugins the host seeds its registry with.
    let plugin = orc_plugin_artifacts::MISBEHAVE.bytes;
    let anonymous = orc_registry::Registry::open(&registry).unwrap();
    let err = anonymous.publish(plugin).await.unwrap_err();
    assert!(err.to_string().contains("token"), "{err}");
    // The refusal leaves the upload unread: the server closes that connection and says so, so a
    // client's next request does not go out on it (CI once saw an incomplete message there).
    let refused = host
        .client
        .post(format!("{registry}/v1/plugins"))
        .body(plugin.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(refused.headers()["connection"], "close");
    let published = anonymous.with_token(Some(&second)).publish(plugin).await.unwrap();
    assert!(published.created);
    assert_eq!(published.entry.name, "misbehave");
}

/// Readiness and the Prometheus metrics, without a token: resource counts per status follow the
/// deploy, actions and requests are counted, and a restart seeds the counts from the store.
pub async fn readiness_and_metrics_follow_the_deploy(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let root = host.base.trim_end_matches("/api/v1").to_string();
    let ready = host.client.get(format!("{}/ready", host.base)).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    assert_eq!(ready.json::<Value>().await.unwrap(), json!({ "status": "ready" }));
    host.create_environment("dev").await;
    host.post_raw("/environments/dev/intents", QUICKSTART.as_bytes()).await;
    host.wait_all_deployed("dev", 6).await;
    let scrape = || async {
        let resp = host.client.get(format!("{root}/metrics")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/openmetrics-text")
        );
        resp.text().await.unwrap()
    };
    // The sink observes a batch just before it is persisted; wait for the gauge to catch up.
    let text = wait_for("the gauge to count 6 deployed", Duration::from_secs(30), async || {
        let text = scrape().await;
        if text.contains(r#"orc_resources{environment="dev",status="deployed"} 6"#) {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await;
    assert!(text.contains("orc_actions_total{"), "{text}");
    assert!(text.contains(r#"outcome="changed""#), "{text}");
    assert!(text.contains("orc_action_duration_seconds_bucket"), "{text}");
    assert!(
        text.contains("/environments/{env}/intents"),
        "requests are counted by route template: {text}"
    );
    assert!(text.ends_with("# EOF\n"));

    let token = host.token.clone();
    let data = host.stop().await;
    let host = Host::start_with(data, 1 << 20, Some(token)).await;
    let text = host
        .client
        .get(format!("{}/metrics", host.base.trim_end_matches("/api/v1")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#"orc_resources{environment="dev",status="deployed"} 6"#),
        "seeded at start: {text}"
    );
}

/// Deleting an environment deletes its plugins' key/value state (scopes `environment-id/…`) in
/// the database, and nothing of another environment's.
pub async fn deleting_an_environment_forgets_its_plugin_state(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let registry = format!("{}/registry", host.base.trim_end_matches("/api/v1"));
    let plugin = orc_plugin_artifacts::BENCH_MEMORY;
    orc_registry::Registry::open(&registry)
        .unwrap()
        .with_token(Some(&host.token))
        .publish(plugin.bytes)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for env in ["dev", "keep"] {
        ids.push(host.create_environment(env).await["id"].as_str().unwrap().to_string());
        let intent = json!({ "resources": (0..3).map(|i| json!({
            "id": format!("bench-memory[local,k{i}]"),
            "adaptor": plugin.digest,
            "attributes": { "value": i },
        })).collect::<Vec<_>>() });
        let (status, body) = host.post(&format!("/environments/{env}/intents"), &intent).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        host.wait_all_deployed(env, 3).await;
    }
    let (status, _) = host.send(Method::DELETE, "/environments/dev", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let data = host.stop().await;

    // What is left in the database, read through a store of its own.
    let location = data
        .database
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", data.path().join(orc_host::store::SQLITE_FILE).display()));
    let store = orc_host::store::Store::connect(&location).await.unwrap();
    let kv = orc_host::store::DbKv::open(&store).await.unwrap();
    let keys = |id: &str| {
        let scope = format!("{id}/bench-memory");
        let kv = &kv;
        async move { orc_runtime::capability::kv::KvStore::list(kv, &scope, "").await.unwrap() }
    };
    assert_eq!(keys(&ids[0]).await, Vec::<String>::new(), "the deleted environment's state is gone");
    assert_eq!(keys(&ids[1]).await.len(), 3, "the other environment's state is kept");
}

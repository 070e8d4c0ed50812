//! Capability grants per environment: a plugin whose manifest requests a capability the
//! environment's `capabilities` setting does not grant is refused at submission (422
//! `capability_not_granted`, naming the resource, the plugin and the setting), and again when a
//! version is released or rolled back; turning off a capability the released version uses is
//! refused (409 `capability_in_use`).

use orc_host::store::Backend;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{Host, QUICKSTART, assert_error};

/// A `command` resource on `local` whose guard says it is done once it ran.
fn command_intent(marker: &std::path::Path) -> Value {
    json!({ "resources": [{
        "id": "command[local,mark]", "adaptor": "command@0.1.0",
        "attributes": { "argv": ["touch", marker], "creates": marker },
    }]})
}

impl Host {
    async fn set_capabilities(&self, env: &str, capabilities: Value) -> (StatusCode, Value) {
        self.patch(
            &format!("/environments/{env}"),
            &json!({ "settings": { "capabilities": capabilities } }),
        )
        .await
    }
}

pub async fn capabilities_are_granted_per_environment_and_checked_at_submission(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    // In the node's root: all a confined command can write.
    let marker = host.node_root("dev").join("ran");

    // The defaults: node files and kv, not node commands nor HTTP.
    let env = host.create_environment("dev").await;
    assert_eq!(
        env["settings"]["capabilities"],
        json!({ "node_files": true, "node_commands": false, "http": false, "kv": true }),
        "{env}"
    );

    // The quickstart (files and directories) deploys with them.
    let (status, body) = host.post_raw("/environments/dev/intents", QUICKSTART.as_bytes()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    host.wait_for_resources("dev", "status=deployed", |items| items.len() == 6).await;

    // A command is refused when submitted, naming the resource, the plugin (name, version and
    // digest), the capability and the setting; nothing is stored.
    let (status, body) = host.post("/environments/dev/intents", &command_intent(&marker)).await;
    assert_error(
        (status, body.clone()),
        StatusCode::UNPROCESSABLE_ENTITY,
        "capability_not_granted",
        "command[local,mark]",
    );
    let message = body["message"].as_str().unwrap();
    for part in [
        "command@0.1.0",
        "sha256:",
        "`node-commands`",
        "`capabilities.node_commands` to true",
    ] {
        assert!(message.contains(part), "`{message}` should mention `{part}`");
    }
    let (_, versions) = host.get("/environments/dev/intents").await;
    assert_eq!(versions["items"].as_array().unwrap().len(), 1, "{versions}");

    // An `http-object` where HTTP is not granted: the same, naming `capabilities.http`.
    let http = json!({ "resources": [{
        "id": "http-object[billing,a]", "adaptor": "http-object@0.1.0",
        "attributes": { "url": "https://api.example.com/objects/a", "body": { "name": "a" } },
    }]});
    let (status, body) = host.post("/environments/dev/intents", &http).await;
    assert_error(
        (status, body.clone()),
        StatusCode::UNPROCESSABLE_ENTITY,
        "capability_not_granted",
        "http-object@0.1.0",
    );
    assert!(body["message"].as_str().unwrap().contains("`capabilities.http` to true"), "{body}");

    // Granted by a settings patch (merged field by field; shown in GET), the same command is
    // accepted and deploys.
    let (status, env) = host.set_capabilities("dev", json!({ "node_commands": true })).await;
    assert_eq!(status, StatusCode::OK, "{env}");
    let (_, shown) = host.get("/environments/dev").await;
    assert_eq!(
        shown["settings"]["capabilities"],
        json!({ "node_files": true, "node_commands": true, "http": false, "kv": true }),
        "{shown}"
    );
    let (status, body) = host.post("/environments/dev/intents", &command_intent(&marker)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let version_with_command = body["version"].as_i64().unwrap();
    host.wait_for_resources("dev", "status=deployed", |items| {
        items.len() == 1 && items[0]["resource_id"] == "command[local,mark]"
    })
    .await;

    // Revoking what the released version uses is refused, naming the resource and the setting;
    // the settings stay as they were.
    let (status, body) = host.set_capabilities("dev", json!({ "node_commands": false })).await;
    assert_error(
        (status, body.clone()),
        StatusCode::CONFLICT,
        "capability_in_use",
        "command[local,mark]",
    );
    assert!(body["message"].as_str().unwrap().contains("`capabilities.node_commands`"), "{body}");
    let (_, shown) = host.get("/environments/dev").await;
    assert_eq!(shown["settings"]["capabilities"]["node_commands"], true, "{shown}");

    // Once a version without it is released, the revocation goes through; a rollback to the
    // version with the command is then refused as a submission would be.
    let (status, body) = host.post_raw("/environments/dev/intents", QUICKSTART.as_bytes()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = host.set_capabilities("dev", json!({ "node_commands": false })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_error(
        host.post(&format!("/environments/dev/intents/{version_with_command}/rollback"), &json!({}))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "capability_not_granted",
        "`capabilities.node_commands`",
    );
    // A settings value that is not a boolean is refused by name.
    assert_error(
        host.set_capabilities("dev", json!({ "node_command": true })).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_settings",
        "node_command",
    );
    host.stop().await;
}

pub async fn a_cluster_template_needs_the_capabilities_its_automators_request(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("dev").await;
    let template = json!({ "services": { "web": { "automator": "shell@0.1.0" } } });
    let (status, body) = host.post("/environments/dev/templates/site", &template).await;
    assert_error(
        (status, body.clone()),
        StatusCode::UNPROCESSABLE_ENTITY,
        "capability_not_granted",
        "shell@0.1.0",
    );
    assert!(body["message"].as_str().unwrap().contains("template `site`"), "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("`capabilities.node_commands` to true"),
        "{body}"
    );

    let (status, env) = host.set_capabilities("dev", json!({ "node_commands": true })).await;
    assert_eq!(status, StatusCode::OK, "{env}");
    let (status, body) = host.post("/environments/dev/templates/site", &template).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    host.stop().await;
}

//! The REST API against a real server: `orc-host serve`'s `Server` on `127.0.0.1:0` over a fresh
//! data directory and a fresh database, driven over HTTP. Every test runs twice: on SQLite (the
//! file in the data directory) and on PostgreSQL (a new database on the cluster this test binary
//! starts; see `orc_tests::pg`). Tests poll for conditions, never sleep.

use std::path::Path;
use std::time::Duration;

use orc_host::store::Backend;
use orc_tests::wait_for;
use reqwest::StatusCode;
use serde_json::{Value, json};

mod access;
mod contract;
mod dropped;
mod grants;
mod hardening;
mod http_policy;
mod kv_quota;
mod lifecycle;
mod plugin_text;
mod promises;
mod resource_sets;
mod sandbox;
mod services;

use crate::support::host::{Data, Host};
use crate::support::paths::encode;

use access::*;
use contract::*;
use dropped::*;
use grants::*;
use hardening::*;
use http_policy::*;
use kv_quota::*;
use lifecycle::*;
use plugin_text::*;
use promises::*;
use resource_sets::*;
use sandbox::*;
use services::*;

use crate::support::on_both_backends;

on_both_backends!(
    the_quickstart_intent_is_deployed_through_the_api,
    bad_inputs_are_answered_with_their_status_and_code,
    a_restarted_server_resumes_its_environments,
    the_serve_command_prints_its_address_and_stops_on_sigterm,
    the_registry_is_served_under_registry,
    the_api_requires_the_admin_token,
    settings_change_and_halt_holds_everything_until_resume,
    diff_dryrun_and_rollback_of_versions,
    a_sensitive_value_is_deployed_whole_and_never_shown,
    deploy_and_repair_report_their_outcome_and_the_log_is_queried,
    the_event_stream_shows_states_and_actions,
    the_openapi_document_validates_and_matches_the_answers,
    tokens_are_managed_and_guard_publishing,
    readiness_and_metrics_follow_the_deploy,
    resources_dropped_from_the_intent_are_no_longer_listed,
    outgoing_http_follows_the_environment_policy_with_a_host_held_secret,
    a_host_secret_without_origins_stops_the_start_naming_it,
    the_call_timeout_is_an_environment_setting,
    deleting_an_environment_forgets_its_plugin_state,
    a_repair_requested_while_actions_run_reaches_every_file,
    the_counts_describe_the_released_version_from_its_201,
    settings_no_scheduler_can_hold_are_refused_by_name,
    capabilities_are_granted_per_environment_and_checked_at_submission,
    a_cluster_template_needs_the_capabilities_its_automators_request,
    a_plugin_writing_past_its_environments_kv_quota_is_refused_and_deleting_frees_room,
    nul_characters_from_a_plugin_neither_reach_nor_break_the_store,
    local_commands_reach_nothing_of_the_host_and_their_limits_hold,
    request_heads_over_the_limits_are_refused_in_json,
    bodies_must_be_json_and_an_optional_one_may_be_null,
    bounded_query_parameters_are_refused_outside_their_range,
    the_document_lists_the_errors_each_operation_can_answer,
    each_path_takes_only_its_documented_methods,
    every_route_answers_each_role_as_its_rule_says,
    a_member_sees_nothing_of_another_environment,
    a_publisher_uploads_but_cannot_deploy,
    revoked_tokens_and_disabled_users_fail_at_once_even_on_an_open_stream,
    passwords_sign_in_and_are_never_answered_or_stored,
    a_token_carries_its_users_roles_or_a_narrower_set,
    the_audit_trail_records_each_change_with_its_author,
    limits_answer_413_and_429_and_lose_nothing_accepted,
    nul_in_names_is_unknown_and_still_audited,
    a_burst_of_changes_is_audited_whole_and_kept_across_a_restart,
    the_catalog_lists_published_service_versions,
    a_resource_set_is_replaced_without_touching_another,
    a_stale_if_match_is_refused_for_settings_and_templates,
    sign_in_is_throttled_per_name_and_per_address_and_a_real_user_gets_back_in,
    the_last_way_in_that_can_act_as_admin_is_never_removed,
    stalled_event_streams_cost_at_most_their_buffers_and_are_told_they_lagged,
);

const QUICKSTART: &str = include_str!("../../../intents/quickstart.json");

fn assert_error(got: (StatusCode, Value), status: StatusCode, code: &str, mentions: &str) {
    let (s, body) = got;
    assert_eq!(s, status, "{body}");
    assert_eq!(body["code"], code, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains(mentions), "`{message}` should mention `{mentions}`");
}

fn read(root: &Path, path: &str) -> String {
    std::fs::read_to_string(root.join(path)).unwrap()
}

async fn the_quickstart_intent_is_deployed_through_the_api(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let (status, health) = host.get("/health").await;
    assert_eq!((status, &health["status"]), (StatusCode::OK, &json!("ok")));

    let env = host.create_environment("dev").await;
    assert_eq!(env["name"], "dev");
    let (_, list) = host.get("/environments").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let (status, by_id) = host.get(&format!("/environments/{}", env["id"].as_str().unwrap())).await;
    assert_eq!((status, &by_id["name"]), (StatusCode::OK, &json!("dev")));

    let (status, submitted) = host.post_raw("/environments/dev/intents", QUICKSTART.as_bytes()).await;
    assert_eq!(status, StatusCode::CREATED, "{submitted}");
    assert_eq!(submitted, json!({ "version": 1, "released": true }));

    let deployed = host.wait_for_resources("dev", "status=deployed", |items| items.len() == 6).await;
    assert!(deployed.iter().all(|r| r["status"] == "deployed"));
    let root = host.node_root("dev");
    assert_eq!(read(&root, "etc/motd"), "Welcome. This machine is managed by orc.\n");
    assert_eq!(read(&root, "srv/www/index.html"), "<h1>Deployed by orc</h1>\n");
    assert!(root.join("srv/www").is_dir());

    // The stored version has every adaptor pinned to a digest.
    let (_, versions) = host.get("/environments/dev/intents").await;
    assert_eq!(versions["items"][0]["version"], 1);
    assert_eq!(versions["items"][0]["active"], true);
    let (status, version) = host.get("/environments/dev/intents/1").await;
    assert_eq!(status, StatusCode::OK, "{version}");
    for r in version["intent"]["resources"].as_array().unwrap() {
        assert!(r["adaptor"].as_str().unwrap().starts_with("sha256:"), "{r}");
    }

    // Filters and pagination.
    let (_, files) = host.get("/environments/dev/resources?type=file").await;
    assert_eq!(files["items"].as_array().unwrap().len(), 3, "{files}");
    let (_, motd) = host.get("/environments/dev/resources?text=MOTD&node=local").await;
    assert_eq!(motd["items"].as_array().unwrap().len(), 1, "{motd}");
    let (_, first) = host.get("/environments/dev/resources?limit=4").await;
    assert_eq!(first["items"].as_array().unwrap().len(), 4);
    let after = first["next_after"].as_str().unwrap();
    let (_, rest) = host
        .get(&format!("/environments/dev/resources?limit=4&after={}", encode(after)))
        .await;
    assert_eq!(rest["items"].as_array().unwrap().len(), 2, "{rest}");
    assert!(rest["next_after"].is_null());

    // One resource with its action log.
    let (status, one) = host
        .get(&format!("/environments/dev/resources/{}", encode("file[local,/etc/motd]")))
        .await;
    assert_eq!(status, StatusCode::OK, "{one}");
    assert_eq!(one["state"]["status"], "deployed");
    assert_eq!(one["actions"][0]["outcome"], "changed", "{one}");
    assert_eq!(one["actions"][0]["changes"][0]["field"], "content", "{one}");

    // Drift, then the user triggers: both accepted, and a repair restores the file.
    std::fs::write(root.join("etc/motd"), "drift\n").unwrap();
    let (status, _) = host.post("/environments/dev/deploy", &json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _) = host.post("/environments/dev/repair", &json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    wait_for("the repair to restore /etc/motd", Duration::from_secs(120), async || {
        read(&root, "etc/motd") == "Welcome. This machine is managed by orc.\n"
    })
    .await;

    // Releasing a stored version again (a rollback to the same one) is accepted.
    let (status, released) = host.post("/environments/dev/intents/1/release", &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{released}");
    assert_eq!(released["active"], true);

    let (status, _) = host.send(reqwest::Method::DELETE, "/environments/dev", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_error(
        host.get("/environments/dev").await,
        StatusCode::NOT_FOUND,
        "unknown_environment",
        "dev",
    );
}

async fn bad_inputs_are_answered_with_their_status_and_code(backend: Backend) {
    let host = Host::start_limited(backend, 64 * 1024).await;
    host.create_environment("prod").await;
    let intent = |resources: Value| json!({ "resources": resources });
    let file =
        |id: &str, requires: &[&str]| json!({ "id": id, "adaptor": "file@0.1.0", "attributes": { "content": "x" }, "requires": requires });

    // Unknown environment, on every kind of endpoint.
    assert_error(
        host.get("/environments/nope").await,
        StatusCode::NOT_FOUND,
        "unknown_environment",
        "nope",
    );
    let ok_intent = intent(json!([file("file[local,/a]", &[])]));
    assert_error(
        host.post("/environments/nope/intents", &ok_intent).await,
        StatusCode::NOT_FOUND,
        "unknown_environment",
        "nope",
    );
    assert_error(
        host.get("/environments/nope/resources").await,
        StatusCode::NOT_FOUND,
        "unknown_environment",
        "nope",
    );
    assert_error(
        host.post("/environments/nope/deploy", &json!({})).await,
        StatusCode::NOT_FOUND,
        "unknown_environment",
        "nope",
    );

    // Malformed JSON, for an intent and for an environment.
    assert_error(
        host.post_raw("/environments/prod/intents", b"{\"resources\": [").await,
        StatusCode::BAD_REQUEST,
        "invalid_json",
        "EOF",
    );
    assert_error(
        host.post("/environments", &json!({ "nmae": "x" })).await,
        StatusCode::BAD_REQUEST,
        "invalid_json",
        "nmae",
    );

    // Intents that do not validate.
    assert_error(
        host.post(
            "/environments/prod/intents",
            &intent(json!([file("file[local,/a]", &[]), file("file[local,/a]", &[])])),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "duplicate_resource",
        "file[local,/a]",
    );
    assert_error(
        host.post(
            "/environments/prod/intents",
            &intent(json!([file("file[local,/a]", &["file[local,/b]"])])),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_requirement",
        "file[local,/b]",
    );
    assert_error(
        host.post(
            "/environments/prod/intents",
            &intent(json!([
                file("file[local,/a]", &["file[local,/b]"]),
                file("file[local,/b]", &["file[local,/a]"])
            ])),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "dependency_cycle",
        "dependency cycle: file[local,/a] -> file[local,/b] -> file[local,/a]",
    );
    assert_error(
        host.post(
            "/environments/prod/intents",
            &intent(json!([{ "id": "file[local,/a]", "adaptor": "nosuch@1.0.0" }])),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_plugin",
        "nosuch@1.0.0",
    );
    let digest = format!("sha256:{}", "0".repeat(64));
    assert_error(
        host.post(
            "/environments/prod/intents",
            &intent(json!([{ "id": "file[local,/a]", "adaptor": digest }])),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_plugin",
        &digest,
    );

    assert_error(
        host.post(
            "/environments/prod/intents",
            &intent(json!([{ "id": "file[local,/a]", "adaptor": "directory" }])),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "wrong_resource_type",
        "directory@0.1.0",
    );
    assert_error(
        host.post("/environments/prod/intents", &intent(json!([file("file[web1,/a]", &[])])))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_node",
        "web1",
    );
    assert_error(
        host.post(
            "/environments/prod/intents",
            &intent(json!([{ "id": "file[local,/a]", "adaptor": "file", "atributes": {} }])),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "invalid_json",
        "atributes",
    );

    // Too large.
    let big = intent(json!([{ "id": "file[local,/a]", "adaptor": "file", "attributes": { "content": "x".repeat(100_000) } }]));
    assert_error(
        host.post("/environments/prod/intents", &big).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        "max_body_bytes",
    );

    // Nothing was stored by any of the above.
    let (_, versions) = host.get("/environments/prod/intents").await;
    assert_eq!(versions["items"], json!([]));

    // Environments: a taken name, a bad name, unknown versions and resources, bad filters.
    assert_error(
        host.post("/environments", &json!({ "name": "prod" })).await,
        StatusCode::CONFLICT,
        "conflict",
        "prod",
    );
    assert_error(
        host.post("/environments", &json!({ "name": "../etc" })).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_name",
        "../etc",
    );
    assert_error(
        host.get("/environments/prod/intents/7").await,
        StatusCode::NOT_FOUND,
        "not_found",
        "version 7",
    );
    assert_error(
        host.post("/environments/prod/intents/7/release", &json!({})).await,
        StatusCode::NOT_FOUND,
        "not_found",
        "version 7",
    );
    assert_error(
        host.get("/environments/prod/intents/seven").await,
        StatusCode::BAD_REQUEST,
        "invalid_path",
        "",
    );
    assert_error(
        host.get("/environments/prod/resources?status=happy").await,
        StatusCode::BAD_REQUEST,
        "invalid_query",
        "happy",
    );
    assert_error(
        host.get(&format!("/environments/prod/resources/{}", encode("file[local,/none]")))
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
        "file[local,/none]",
    );
    assert_error(host.get("/nowhere").await, StatusCode::NOT_FOUND, "not_found", "endpoint");

    // The triggers on a known environment are accepted.
    let (status, _) = host.post("/environments/prod/deploy", &json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _) = host.post("/environments/prod/repair", &json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
}

/// Stopped and started again on the same data directory and database.
async fn a_restarted_server_resumes_its_environments(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("dev").await;
    let (status, _) = host.post_raw("/environments/dev/intents", QUICKSTART.as_bytes()).await;
    assert_eq!(status, StatusCode::CREATED);
    host.wait_for_resources("dev", "status=deployed", |items| items.len() == 6).await;
    let token = host.token.clone();
    let data = host.stop().await;

    let host = Host::start_with(data, 1 << 20, Some(token)).await;
    let (status, env) = host.get("/environments/dev").await;
    assert_eq!(status, StatusCode::OK, "{env}");
    assert_eq!(env["released_version"], 1);
    let mut changed: Value = serde_json::from_str(QUICKSTART).unwrap();
    changed["resources"][4]["attributes"]["content"] = json!("Version two.\n");
    let (status, submitted) = host.post("/environments/dev/intents", &changed).await;
    assert_eq!(status, StatusCode::CREATED, "{submitted}");
    assert_eq!(submitted["version"], 2);
    host.wait_for_resources("dev", "status=deployed", |items| {
        items.len() == 6 && items.iter().all(|r| r["version"] == 2)
    })
    .await;
    assert_eq!(read(&host.node_root("dev"), "etc/motd"), "Version two.\n");
    // Only the changed resource ran again: the others' last action is still version 1's.
    let (_, index) = host
        .get(&format!(
            "/environments/dev/resources/{}",
            encode("file[local,/srv/www/index.html]")
        ))
        .await;
    assert_eq!(index["actions"].as_array().unwrap().len(), 1, "{index}");
}

/// The binary: `orc-host serve` prints where it listens first, serves, and exits cleanly on
/// SIGTERM.
async fn the_serve_command_prints_its_address_and_stops_on_sigterm(backend: Backend) {
    use tokio::io::AsyncBufReadExt;

    let _ = rustls::crypto::ring::default_provider().install_default();
    let data = Data::fresh(backend).await;
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_orc-host"));
    command.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(data.path());
    if let Some(database) = &data.database {
        command.args(["--database", database]);
    }
    for var in ["ORC_CONFIG", "ORC_LISTEN", "ORC_DATA_DIR", "ORC_DATABASE", "ORC_MAX_BODY_BYTES"] {
        command.env_remove(var);
    }
    let mut child = command.stdout(std::process::Stdio::piped()).kill_on_drop(true).spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next_line().await.unwrap().expect("a first line");
    let url = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line `{first}`"));
    let health: Value = reqwest::get(format!("{url}/api/v1/health")).await.unwrap().json().await.unwrap();
    assert_eq!(health["status"], "ok");

    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
    data.assert_backend();
}

/// The registry is served by the same process under `/registry`, holding the first-party plugins.
async fn the_registry_is_served_under_registry(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let root = host.base.trim_end_matches("/api/v1").to_string();
    let plugins: Value = reqwest::get(format!("{root}/registry/v1/plugins"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = plugins.as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(names.contains(&"file") && names.contains(&"directory"), "{plugins}");
    let file = plugins.as_array().unwrap().iter().find(|p| p["name"] == "file").unwrap();
    let blob = reqwest::get(format!("{root}/registry/v1/blobs/{}", file["digest"].as_str().unwrap()))
        .await
        .unwrap();
    assert_eq!(blob.status(), StatusCode::OK);
    let bytes = blob.bytes().await.unwrap();
    assert_eq!(orc_manifest::Digest::of(&bytes).to_string(), file["digest"].as_str().unwrap());
}

/// Every call but `/health` needs the admin token created on the first start; the registry is
/// open to read and needs the token to publish.
async fn the_api_requires_the_admin_token(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    assert!(host.token.starts_with("orc_") && host.token.len() > 60, "{}", host.token);
    let client = reqwest::Client::new();
    let url = format!("{}/environments", host.base);
    for auth in [None, Some("Bearer wrong"), Some("Basic abc")] {
        let mut req = client.get(&url);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["code"], "unauthorized");
    }
    assert_eq!(
        client.get(format!("{}/health", host.base)).send().await.unwrap().status(),
        StatusCode::OK
    );
    let (status, _) = host.get("/environments").await;
    assert_eq!(status, StatusCode::OK);
    // The scheme's name is case-insensitive (RFC 7235).
    for scheme in ["bearer", "BEARER", "BeArEr"] {
        let resp = client
            .get(&url)
            .header("authorization", format!("{scheme} {}", host.token))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{scheme}");
    }
    // A method a path does not take is answered in JSON too.
    for (method, path) in [(reqwest::Method::DELETE, "/health"), (reqwest::Method::PUT, "/environments")] {
        let resp = client
            .request(method.clone(), format!("{}{path}", host.base))
            .bearer_auth(&host.token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["code"], "method_not_allowed", "{method} {path}: {body}");
    }

    let root = host.base.trim_end_matches("/api/v1").to_string();
    let publish = client
        .post(format!("{root}/registry/v1/plugins"))
        .body(b"\0asm".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(publish.status(), StatusCode::UNAUTHORIZED);
}

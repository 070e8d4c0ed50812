//! What an environment's plugin calls may reach, set through its settings: outgoing HTTP (the
//! `http-object` adaptor against a real HTTP server the test starts on 127.0.0.1) under the
//! environment's policy with a secret the host holds, bound to that server's origin, and the call
//! timeout (the `misbehave` fixture's slow mode, published to the host's registry).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use axum::response::{IntoResponse, Response};
use orc_host::policy::outbound::{SecretConfig, SecretSource};
use orc_host::store::Backend;
use orc_tests::wait_for;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Data, Host, assert_error};

const SECRET: &str = "Bearer s3cret-of-the-host-5d1e";

/// A JSON object store that requires the secret and logs the `Authorization` header it got.
#[derive(Default)]
struct Api {
    objects: Mutex<HashMap<String, Value>>,
    auth: Mutex<Vec<Option<String>>>,
}

impl Api {
    fn admit(&self, headers: &HeaderMap) -> bool {
        let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
        let ok = auth.as_deref() == Some(SECRET);
        self.auth.lock().unwrap().push(auth);
        ok
    }

    fn requests(&self) -> Vec<Option<String>> {
        self.auth.lock().unwrap().clone()
    }
}

async fn get_object(State(api): State<Arc<Api>>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    if !api.admit(&headers) {
        return AxumStatus::UNAUTHORIZED.into_response();
    }
    match api.objects.lock().unwrap().get(&name) {
        Some(object) => Json(object.clone()).into_response(),
        None => AxumStatus::NOT_FOUND.into_response(),
    }
}

async fn put_object(State(api): State<Arc<Api>>, Path(name): Path<String>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    if !api.admit(&headers) {
        return AxumStatus::UNAUTHORIZED.into_response();
    }
    api.objects.lock().unwrap().insert(name, body.clone());
    Json(body).into_response()
}

async fn serve_api() -> (Arc<Api>, String) {
    let api = Arc::new(Api::default());
    let app = axum::Router::new()
        .route("/objects/{name}", axum::routing::get(get_object).put(put_object))
        .with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (api, base)
}

impl Host {
    async fn patch_settings(&self, env: &str, settings: Value) -> (StatusCode, Value) {
        let body = json!({ "settings": settings }).to_string().into_bytes();
        self.send(Method::PATCH, &format!("/environments/{env}"), Some(body)).await
    }

    /// Retries the environment's failed resources now (a user deploy).
    async fn deploy_failed(&self, env: &str) {
        let (status, body) = self.post(&format!("/environments/{env}/deploy"), &json!({})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }

    /// The one resource of `env` once `done` holds for it.
    async fn the_resource(&self, env: &str, done: impl Fn(&Value) -> bool) -> Value {
        self.wait_for_resources(env, "", |items| items.len() == 1 && done(&items[0]))
            .await
            .remove(0)
    }
}

fn message(resource: &Value) -> &str {
    resource["last_error"]["message"].as_str().unwrap_or_default()
}

fn failed_with(text: &'static str) -> impl Fn(&Value) -> bool {
    move |r| r["status"] == "failed" && message(r).contains(text)
}

/// The host holds `api-token`, read from `file`, bound to `origins`.
fn secrets_config(file: &std::path::Path, origins: &[&str]) -> impl FnOnce(&mut orc_host::server::config::HostConfig) {
    let secret = SecretConfig {
        source: SecretSource::File(file.to_path_buf()),
        origins: origins.iter().map(|o| o.to_string()).collect(),
    };
    move |config| config.secrets = BTreeMap::from([("api-token".to_string(), secret)])
}

/// `http-object` is refused while the environment allows no HTTP, and by each part of the
/// policy in turn (origin, address, secret, plain HTTP for secrets) until all of it is granted;
/// then it deploys, the host's secret reaching the server as `Authorization` and appearing in no
/// API answer. Bad policies are refused naming the entry, among them a secret bound to none of
/// the allowed origins. A restarted host rebuilds the policy from the store (every field of it
/// round-trips through the database).
pub async fn outgoing_http_follows_the_environment_policy_with_a_host_held_secret(backend: Backend) {
    let (api, base) = serve_api().await;
    let secret_dir = tempfile::tempdir().unwrap();
    let secret_file = secret_dir.path().join("api-token");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let host = Host::start_configured(Data::fresh(backend).await, None, secrets_config(&secret_file, &[&base])).await;
    let mut answers = Vec::new();

    let env = host.create_environment("web").await;
    assert_eq!(
        env["settings"]["http"],
        json!({ "allowed_origins": [], "addresses": "public", "secrets": [], "secrets_over_plain_http": false })
    );
    assert_error(
        host.post(
            "/environments",
            &json!({ "name": "other", "settings": { "http": { "secrets": ["nope"] } } }),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_settings",
        "`nope`",
    );

    // `http-object` requests capability `http`, which environments do not grant by default.
    let (status, env) = host.patch_settings("web", json!({ "capabilities": { "http": true } })).await;
    assert_eq!(status, StatusCode::OK, "{env}");

    // The node part of an `http-object` id names the API: no node is registered for it.
    let intent = json!({ "resources": [{
        "id": "http-object[billing,a]", "adaptor": "http-object@0.1.0",
        "attributes": { "url": format!("{base}/objects/a"), "body": { "name": "a", "size": 1 }, "secret": "api-token" },
    }]});
    let (status, body) = host.post("/environments/web/intents", &intent).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let origin = base.trim_start_matches("http://");
    host.the_resource("web", failed_with("is not allowed by this environment's policy"))
        .await;
    assert!(api.requests().is_empty(), "nothing was sent");

    // `api-token` is bound to `base` only: settings that name it without allowing `base` are
    // refused, naming the secret and both lists.
    let unbound = format!(
        "`http.secrets`: `api-token` is bound to {base}, none of which `http.allowed_origins` allows (it allows: https://elsewhere.example.com:443)"
    );
    let unbound_empty = format!("`api-token` is bound to {base}, none of which `http.allowed_origins` allows (it allows: none)");
    for (settings, names) in [
        (json!({ "http": { "secrets": ["api-token"] } }), unbound_empty.as_str()),
        (
            json!({ "http": { "allowed_origins": ["https://elsewhere.example.com"], "secrets": ["api-token"] } }),
            unbound.as_str(),
        ),
        (json!({ "http": { "secrets_over_plain_http": "yes" } }), "expected a boolean"),
        (
            json!({ "http": { "allowed_origins": ["ftp://files.example.com"] } }),
            "ftp://files.example.com",
        ),
        (
            json!({ "http": { "allowed_origins": ["https://api.example.com/v1"] } }),
            "https://api.example.com/v1",
        ),
        (json!({ "http": { "allowed_origins": ["api.example.com"] } }), "api.example.com"),
        (json!({ "http": { "addresses": ["127.0.0.0/33"] } }), "127.0.0.0/33"),
        (json!({ "http": { "addresses": "private" } }), "private"),
        (json!({ "http": { "addresses": [] } }), "empty list"),
        (json!({ "http": { "secrets": ["other-token"] } }), "`other-token`"),
        (json!({ "http": { "secrets": ["bad name"] } }), "`bad name`"),
        (json!({ "http": { "allowed": [] } }), "allowed"),
    ] {
        assert_error(
            host.patch_settings("web", settings).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_settings",
            names,
        );
    }

    // The origin alone: 127.0.0.1 is loopback, which `public` (the default) refuses.
    let (status, env) = host.patch_settings("web", json!({ "http": { "allowed_origins": [base] } })).await;
    assert_eq!(status, StatusCode::OK, "{env}");
    answers.push(env.to_string());
    host.deploy_failed("web").await;
    host.the_resource("web", failed_with("127.0.0.1 (loopback)")).await;
    assert!(api.requests().is_empty(), "nothing was sent");

    // Loopback by its network (merged into the policy: the origin stays), still no secret.
    let (status, env) = host
        .patch_settings("web", json!({ "http": { "addresses": ["127.0.0.0/8"] } }))
        .await;
    assert_eq!(status, StatusCode::OK, "{env}");
    assert_eq!(env["settings"]["http"]["allowed_origins"], json!([base]), "{env}");
    host.deploy_failed("web").await;
    host.the_resource("web", failed_with("secret `api-token` is not defined for this environment"))
        .await;
    assert!(api.requests().is_empty(), "nothing was sent");

    let (status, env) = host.patch_settings("web", json!({ "http": { "secrets": ["api-token"] } })).await;
    assert_eq!(status, StatusCode::OK, "{env}");
    answers.push(env.to_string());
    // The secret's origin is plain HTTP: refused before sending until the environment allows it.
    host.deploy_failed("web").await;
    host.the_resource(
        "web",
        failed_with("over plain HTTP: secrets go over https only unless the environment's setting `http.secrets_over_plain_http` is true"),
    )
    .await;
    assert!(api.requests().is_empty(), "nothing was sent");
    // Narrowing the origins away from the secret's is refused like naming it was, and changes nothing.
    let (status, body) = host
        .patch_settings(
            "web",
            json!({ "http": { "allowed_origins": ["https://elsewhere.example.com"], "secrets_over_plain_http": true } }),
        )
        .await;
    assert_error((status, body), StatusCode::UNPROCESSABLE_ENTITY, "invalid_settings", &unbound);
    let (status, env) = host
        .patch_settings("web", json!({ "http": { "secrets_over_plain_http": true } }))
        .await;
    assert_eq!(status, StatusCode::OK, "{env}");
    assert_eq!(
        env["settings"]["http"],
        json!({ "allowed_origins": [base], "addresses": ["127.0.0.0/8"], "secrets": ["api-token"], "secrets_over_plain_http": true })
    );
    answers.push(env.to_string());
    host.deploy_failed("web").await;
    let deployed = host.the_resource("web", |r| r["status"] == "deployed").await;
    answers.push(deployed.to_string());
    assert_eq!(api.objects.lock().unwrap().get("a"), Some(&json!({ "name": "a", "size": 1 })));
    let requests = api.requests();
    assert!(
        !requests.is_empty() && requests.iter().all(|auth| auth.as_deref() == Some(SECRET)),
        "every request carried the host's secret: {requests:?}"
    );

    for path in [
        "/environments".to_string(),
        "/environments/web".into(),
        "/environments/web/resources".into(),
        "/environments/web/actions".into(),
        format!("/environments/web/resources/{}/actions", super::encode("http-object[billing,a]")),
        "/environments/web/intents/1".into(),
    ] {
        let (status, body) = host.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        answers.push(body.to_string());
    }
    let secret_value = SECRET.trim_start_matches("Bearer ");
    for answer in &answers {
        assert!(!answer.contains(secret_value), "the secret leaked: {answer}");
    }
    assert!(answers.iter().any(|a| a.contains(origin)), "the answers were looked at");

    // A restart rebuilds the environment's access from its stored settings.
    let token = host.token.clone();
    let data = host.stop().await;
    let host = Host::start_configured(data, Some(token), secrets_config(&secret_file, &[&base])).await;
    let (status, env) = host.get("/environments/web").await;
    assert_eq!(status, StatusCode::OK, "{env}");
    assert_eq!(env["settings"]["http"]["secrets_over_plain_http"], true, "{env}");
    let before = api.requests().len();
    let (status, body) = host.post("/environments/web/repair", &json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    wait_for(
        "the repair after the restart to reach the API",
        Duration::from_secs(60),
        async || api.requests().len() != before,
    )
    .await;
    assert_eq!(api.requests().last().unwrap().as_deref(), Some(SECRET));

    // `null` resets the field to its default, stored as such.
    let (status, env) = host
        .patch_settings("web", json!({ "http": { "secrets_over_plain_http": null } }))
        .await;
    assert_eq!(status, StatusCode::OK, "{env}");
    let (_, env) = host.get("/environments/web").await;
    assert_eq!(env["settings"]["http"]["secrets_over_plain_http"], false, "{env}");
}

/// A host whose configuration binds a secret to no origin does not start, and says which secret.
pub async fn a_host_secret_without_origins_stops_the_start_naming_it(backend: Backend) {
    let data = Data::fresh(backend).await;
    let secret_dir = tempfile::tempdir().unwrap();
    let secret_file = secret_dir.path().join("api-token");
    std::fs::write(&secret_file, SECRET).unwrap();
    let mut config = orc_host::server::config::HostConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data.path().to_path_buf(),
        database: data.database.clone(),
        ..orc_host::server::config::HostConfig::default()
    };
    secrets_config(&secret_file, &[])(&mut config);
    let Err(err) = orc_host::server::Server::start(&config).await else {
        panic!("the host started with a secret bound to no origin");
    };
    let mut chain = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(e) = source {
        chain = format!("{chain}: {e}");
        source = e.source();
    }
    assert!(
        chain.starts_with("cannot load the host-held secrets: secret `api-token`: no `origins`"),
        "{chain}"
    );
}

/// `call_timeout_s` bounds every plugin call of the environment: a call longer than it times
/// out; raised above the call's length, the same call succeeds. Changed live.
pub async fn the_call_timeout_is_an_environment_setting(backend: Backend) {
    let host = Host::start_limited(backend, 4 << 20).await;
    let adaptor = host.publish_misbehave().await;

    let env = host.create_environment("slow").await;
    assert_eq!(env["settings"]["call_timeout_s"], 30);
    for (value, says) in [(json!(0), "at least 1"), (json!(86_401), "at most")] {
        assert_error(
            host.patch_settings("slow", json!({ "call_timeout_s": value })).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_settings",
            says,
        );
    }
    // The fixture requests every capability.
    let everything = json!({ "node_files": true, "node_commands": true, "http": true, "kv": true });
    let (status, env) = host
        .patch_settings("slow", json!({ "call_timeout_s": 1, "capabilities": everything }))
        .await;
    assert_eq!((status, &env["settings"]["call_timeout_s"]), (StatusCode::OK, &json!(1)), "{env}");

    // Reading takes 2.5 s: longer than 1 s, shorter than 10.
    let intent = json!({ "resources": [{
        "id": "misbehave[local,slow]", "adaptor": adaptor.clone(),
        "attributes": { "behave": "slow", "ms": 2500 },
    }]});
    let (status, body) = host.post("/environments/slow/intents", &intent).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let timed_out = host
        .the_resource("slow", |r| r["status"] == "failed" && r["last_error"]["code"] == "timed_out")
        .await;
    assert!(message(&timed_out).contains("timed out after 1s"), "{timed_out}");

    let (status, env) = host.patch_settings("slow", json!({ "call_timeout_s": 10 })).await;
    assert_eq!(status, StatusCode::OK, "{env}");
    host.deploy_failed("slow").await;
    host.the_resource("slow", |r| r["status"] == "deployed").await;
}

/// The embedded deploy takes the same policy (`orc-host deploy --allow-http … --http-addresses …
/// --secret NAME=VAR@ORIGIN --secrets-over-plain-http`): denied without it, deployed with it, the
/// secret sent by the host — only to the origin it is bound to, and over plain HTTP only when
/// allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_deploy_takes_the_same_policy() {
    let (api, base) = serve_api().await;
    let (other_api, other_base) = serve_api().await;
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("token");
    std::fs::write(&secret_file, SECRET).unwrap();
    let intent = |base: &str| {
        json!({ "resources": [{
            "id": "http-object[billing,e]", "adaptor": "http-object@0.1.0",
            "attributes": { "url": format!("{base}/objects/e"), "body": { "name": "e" }, "secret": "api-token" },
        }]})
        .to_string()
    };
    let denied = orc_host::embedded::EmbeddedConfig::new(dir.path().join("data"), orc_host::executor::Mode::Deploy, 4);
    let report = orc_host::embedded::deploy(&denied, intent(&base).as_bytes(), |_, _, _| {})
        .await
        .unwrap();
    let error = report.actions[0].error.clone().expect("denied");
    assert!(error.message.contains("is not allowed by this environment's policy"), "{error:?}");
    assert!(api.requests().is_empty());

    let bad = orc_host::embedded::EmbeddedConfig {
        http: orc_host::policy::settings::HttpSettings {
            allowed_origins: vec![base.clone(), other_base.clone()],
            addresses: orc_host::policy::settings::AddressRule::Networks(vec!["127.0.0.0/8".into()]),
            secrets: vec!["unknown".into()],
            secrets_over_plain_http: false,
        },
        ..denied.clone()
    };
    let err = orc_host::embedded::deploy(&bad, intent(&base).as_bytes(), |_, _, _| {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("`unknown`"), "{err}");

    // `--secret api-token=VAR@<base>`, the file standing in for the variable.
    let bound_to = |origins: &[&str]| {
        BTreeMap::from([(
            "api-token".to_string(),
            SecretConfig {
                source: SecretSource::File(secret_file.clone()),
                origins: origins.iter().map(|o| o.to_string()).collect(),
            },
        )])
    };
    let allowed = orc_host::embedded::EmbeddedConfig {
        http: orc_host::policy::settings::HttpSettings {
            secrets: Vec::new(),
            ..bad.http.clone()
        },
        secrets: bound_to(&[&base]),
        ..denied.clone()
    };
    // A secret bound to an origin `--allow-http` does not give is refused before anything runs.
    let elsewhere = orc_host::embedded::EmbeddedConfig {
        secrets: bound_to(&["https://elsewhere.example.com"]),
        ..allowed.clone()
    };
    let err = orc_host::embedded::deploy(&elsewhere, intent(&base).as_bytes(), |_, _, _| {})
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`api-token` is bound to https://elsewhere.example.com:443, none of which `http.allowed_origins` allows"),
        "{err}"
    );
    // Both servers are allowed, the secret is bound to one: a request naming it towards the
    // other is refused before it is sent.
    let report = orc_host::embedded::deploy(&allowed, intent(&other_base).as_bytes(), |_, _, _| {})
        .await
        .unwrap();
    let error = report.actions[0].error.clone().expect("denied");
    assert!(
        error.message.contains(&format!(
            "secret `api-token` may not be sent to {other_base}: it is bound to {base}"
        )),
        "{error:?}"
    );
    assert!(other_api.requests().is_empty(), "{:?}", other_api.requests());
    // Its own origin is plain HTTP: refused until `--secrets-over-plain-http`.
    let report = orc_host::embedded::deploy(&allowed, intent(&base).as_bytes(), |_, _, _| {})
        .await
        .unwrap();
    let error = report.actions[0].error.clone().expect("denied");
    assert!(error.message.contains("`http.secrets_over_plain_http`"), "{error:?}");
    assert!(api.requests().is_empty(), "{:?}", api.requests());

    let plain = orc_host::embedded::EmbeddedConfig {
        http: orc_host::policy::settings::HttpSettings {
            secrets_over_plain_http: true,
            ..allowed.http.clone()
        },
        ..allowed.clone()
    };
    let report = orc_host::embedded::deploy(&plain, intent(&base).as_bytes(), |_, _, _| {})
        .await
        .unwrap();
    assert!(report.succeeded(), "{:?}", report.actions);
    assert_eq!(api.objects.lock().unwrap().get("e"), Some(&json!({ "name": "e" })));
    let requests = api.requests();
    assert!(
        !requests.is_empty() && requests.iter().all(|a| a.as_deref() == Some(SECRET)),
        "{requests:?}"
    );
    assert!(other_api.requests().is_empty(), "{:?}", other_api.requests());
    let text = serde_json::to_string(&report).unwrap();
    assert!(!text.contains(SECRET.trim_start_matches("Bearer ")), "{text}");
}

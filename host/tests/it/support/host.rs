//! A real `orc-host` server for integration tests: `Server` on `127.0.0.1:0` with a fresh data
//! directory (SQLite, or a PostgreSQL database from `orc_tests::pg`), its admin token, and a JSON
//! client for `/api/v1`. Handing its [`Data`] from one start to the next restarts it on the same
//! state.

use std::path::{Path, PathBuf};
use std::time::Duration;

use orc_host::server::Server;
use orc_host::server::config::HostConfig;
use orc_host::store::{Backend, SQLITE_FILE};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// Where a host keeps its state: a data directory and, on PostgreSQL, a database of its own.
pub struct Data {
    pub backend: Backend,
    pub dir: tempfile::TempDir,
    /// `postgres://…`; `None`: the SQLite file in `dir`.
    pub database: Option<String>,
}

impl Data {
    pub async fn fresh(backend: Backend) -> Data {
        let database = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => Some(orc_tests::pg::fresh_database().await.unwrap()),
        };
        Data {
            backend,
            dir: tempfile::tempdir().unwrap(),
            database,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The store's location, as `Store::connect` takes it.
    pub fn location(&self) -> String {
        self.database
            .clone()
            .unwrap_or_else(|| format!("sqlite:{}", self.path().join(SQLITE_FILE).display()))
    }

    /// The server kept its state where it was told: the SQLite file exists only on SQLite.
    pub fn assert_backend(&self) {
        let sqlite_file = self.path().join(SQLITE_FILE).exists();
        assert_eq!(
            sqlite_file,
            self.backend == Backend::Sqlite,
            "{} with database {:?}",
            self.backend,
            self.database
        );
    }
}

/// A running server, an HTTP client for it, and where it keeps its data. Dropping it shuts the
/// server down.
pub struct Host {
    pub base: String,
    pub token: String,
    pub client: reqwest::Client,
    pub data: Data,
    stop: oneshot::Sender<()>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Host {
    pub async fn start(backend: Backend) -> Host {
        Host::start_configured(Data::fresh(backend).await, None, |_| {}).await
    }

    /// Starts with requests' bodies bounded by `max_body_bytes`.
    pub async fn start_limited(backend: Backend, max_body_bytes: usize) -> Host {
        Host::start_with(Data::fresh(backend).await, max_body_bytes, None).await
    }

    /// Starts on `data`; `token` is the admin token of an earlier start on the same data (a new
    /// one is created and shown only on the first start).
    pub async fn start_with(data: Data, max_body_bytes: usize, token: Option<String>) -> Host {
        Host::start_configured(data, token, |config| config.max_body_bytes = max_body_bytes).await
    }

    /// Starts again on what [`Host::restart_later`] handed back.
    pub async fn start_again(data: Data, token: String) -> Host {
        Host::start_configured(data, Some(token), |_| {}).await
    }

    /// Starts on `data`, the configuration changed by `configure` first (nodes not verified yet
    /// are tried every second).
    pub async fn start_configured(data: Data, token: Option<String>, configure: impl FnOnce(&mut HostConfig)) -> Host {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut config = HostConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: data.path().to_path_buf(),
            database: data.database.clone(),
            node_reverify_interval_s: 1,
            ..HostConfig::default()
        };
        configure(&mut config);
        let server = Server::start(&config).await.unwrap();
        data.assert_backend();
        let token = server
            .initial_token()
            .map(str::to_string)
            .or(token)
            .expect("a token: new on a first start, or given");
        let addr = server.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Host {
            base: format!("http://{addr}/api/v1"),
            token,
            client: reqwest::Client::new(),
            data,
            stop,
            served,
        }
    }

    /// Shuts the server down gracefully and hands back its data.
    pub async fn stop(self) -> Data {
        let _ = self.stop.send(());
        self.served.await.unwrap().unwrap();
        self.data
    }

    /// Stops, keeping what a restart on the same data needs ([`Host::start_again`]).
    pub async fn restart_later(self) -> (Data, String) {
        let token = self.token.clone();
        (self.stop().await, token)
    }

    /// The `local` node's root of environment `env`.
    pub fn node_root(&self, env: &str) -> PathBuf {
        orc_host::app::node_root(self.data.path(), env)
    }

    /// A request with a raw body (sent as JSON): the status and the answer.
    pub async fn send(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> (StatusCode, Value) {
        let mut req = self.client.request(method, format!("{}{path}", self.base)).bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.header("content-type", "application/json").body(body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let bytes = resp.bytes().await.unwrap();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
        };
        (status, value)
    }

    pub async fn post_raw(&self, path: &str, body: &[u8]) -> (StatusCode, Value) {
        self.send(Method::POST, path, Some(body.to_vec())).await
    }

    /// Polls the resource listing until `done` holds for it (bounded, so a hang fails).
    pub async fn wait_for_resources(&self, env: &str, query: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        orc_tests::wait_for("the resources to reach the condition", Duration::from_secs(120), async || {
            let (status, page) = self.get(&format!("/environments/{env}/resources?{query}")).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            let items = page["items"].as_array().cloned().unwrap_or_default();
            if done(&items) { Ok(items) } else { Err(page) }
        })
        .await
    }

    /// Creates environment `name` with its default settings.
    pub async fn create_environment(&self, name: &str) -> Value {
        let (status, env) = self.post("/environments", &json!({ "name": name })).await;
        assert_eq!(status, StatusCode::CREATED, "{env}");
        env
    }

    /// Creates environment `name` retrying failures every `retry_interval_s`, its repair timer off.
    pub async fn create_environment_retrying(&self, name: &str, retry_interval_s: u64) {
        let body = json!({ "name": name, "settings": { "retry_interval_s": retry_interval_s, "repair_interval_s": 0 } });
        let (status, env) = self.post("/environments", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{env}");
    }

    /// A request with a JSON body: the status, the answer and its raw text.
    pub async fn send_text(&self, method: Method, path: &str, body: Option<&Value>) -> (StatusCode, Value, String) {
        let mut req = self.client.request(method, format!("{}{path}", self.base)).bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"))
        };
        (status, value, text)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (s, v, _) = self.send_text(Method::GET, path, None).await;
        (s, v)
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let (s, v, _) = self.send_text(Method::POST, path, Some(body)).await;
        (s, v)
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        let (s, v, _) = self.send_text(Method::DELETE, path, None).await;
        (s, v)
    }

    /// Polls `path` until `done` holds for its answer (within `timeout`).
    pub async fn wait_for(&self, path: &str, what: &str, timeout: Duration, done: impl Fn(StatusCode, &Value) -> bool) -> Value {
        orc_tests::wait_for(&format!("{path} to become {what}"), timeout, async || {
            let (status, v) = self.get(path).await;
            if done(status, &v) { Ok(v) } else { Err(format!("{status} {v}")) }
        })
        .await
    }

    /// POSTs an action answered 202 with a `Location` (dryrun, deploy, repair) and polls it
    /// until it is no longer `running`.
    pub async fn run_to_completion(&self, path: &str, body: Option<Value>) -> Value {
        let request = self.client.post(format!("{}{path}", self.base)).bearer_auth(&self.token);
        // A JSON body says so (or is refused 415); no body needs no `Content-Type`.
        let resp = match body {
            Some(body) => request.json(&body),
            None => request,
        }
        .send()
        .await
        .unwrap();
        assert_eq!(resp.status(), StatusCode::ACCEPTED, "{path}");
        let location = resp.headers()["location"].to_str().unwrap().to_string();
        let accepted: Value = resp.json().await.unwrap();
        assert_eq!(accepted["status"], "running", "{accepted}");
        let location = location.strip_prefix("/api/v1").expect("a location under /api/v1").to_string();
        assert!(location.ends_with(accepted["id"].as_str().unwrap()), "{location}");
        self.wait_for(&location, "finished", Duration::from_secs(120), |status, body| {
            assert_eq!(status, StatusCode::OK, "{body}");
            body["status"] != "running"
        })
        .await
    }

    /// Publishes a plugin to the server's registry (`/registry`; writing needs the token).
    pub async fn publish(&self, bytes: &'static [u8]) -> Value {
        let registry = self.base.replace("/api/v1", "/registry/v1/plugins");
        let resp = self
            .client
            .post(registry)
            .bearer_auth(&self.token)
            .header("content-type", "application/wasm")
            .body(bytes)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        assert!(status.is_success(), "publishing: {status} {body}");
        body
    }

    /// Polls the node until its status is `status`.
    pub async fn wait_node_status(&self, name: &str, status: &str) -> Value {
        self.wait_for(&format!("/nodes/{name}"), status, Duration::from_secs(60), |_, n| {
            n["status"] == status
        })
        .await
    }
}

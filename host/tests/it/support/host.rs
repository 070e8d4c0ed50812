//! A real `orc-host` server for integration tests: `Server` on `127.0.0.1:0` with a fresh data
//! directory (SQLite, or a PostgreSQL database from `orc_tests::pg`), its admin token, and a JSON
//! client for `/api/v1`.

use std::time::Duration;

use orc_host::server::Server;
use orc_host::server::config::HostConfig;
use orc_host::store::Backend;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// A running server, an HTTP client for it, and where it keeps its data.
pub struct Host {
    pub base: String,
    pub token: String,
    pub client: reqwest::Client,
    pub dir: tempfile::TempDir,
    pub database: Option<String>,
    stop: oneshot::Sender<()>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Host {
    pub async fn start(backend: Backend) -> Host {
        let database = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => Some(orc_tests::pg::fresh_database().await.unwrap()),
        };
        Host::start_on(tempfile::tempdir().unwrap(), database, None).await
    }

    /// Starts on a data directory and database; `token`: the admin token of an earlier start on
    /// them (only a first start creates one).
    pub async fn start_on(dir: tempfile::TempDir, database: Option<String>, token: Option<String>) -> Host {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = HostConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().to_path_buf(),
            database: database.clone(),
            node_reverify_interval_s: 1,
            ..HostConfig::default()
        };
        let server = Server::start(&config).await.unwrap();
        let token = server.initial_token().map(str::to_string).or(token).expect("a token");
        let addr = server.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Host {
            base: format!("http://{addr}/api/v1"),
            token,
            client: reqwest::Client::new(),
            dir,
            database,
            stop,
            served,
        }
    }

    pub async fn stop(self) {
        self.restart_later().await;
    }

    /// Stops, keeping what a restart on the same data needs.
    pub async fn restart_later(self) -> (tempfile::TempDir, Option<String>, String) {
        let _ = self.stop.send(());
        self.served.await.unwrap().unwrap();
        (self.dir, self.database, self.token)
    }

    /// Every answer's raw text goes through here.
    pub async fn send(&self, method: Method, path: &str, body: Option<&Value>) -> (StatusCode, Value, String) {
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
        let (s, v, _) = self.send(Method::GET, path, None).await;
        (s, v)
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let (s, v, _) = self.send(Method::POST, path, Some(body)).await;
        (s, v)
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        let (s, v, _) = self.send(Method::DELETE, path, None).await;
        (s, v)
    }

    pub async fn create_environment(&self, name: &str, retry_interval_s: u64) {
        let body = json!({ "name": name, "settings": { "retry_interval_s": retry_interval_s, "repair_interval_s": 0 } });
        let (status, env) = self.post("/environments", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{env}");
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
        let location = location.strip_prefix("/api/v1").expect("a location under /api/v1").to_string();
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

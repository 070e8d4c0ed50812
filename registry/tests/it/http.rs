//! The HTTP service on a real socket, driven by the real client, plus a few pure-handler checks
//! through `oneshot` and the standalone binary.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use orc_registry::server::router;
use orc_registry::{Client, Digest, Registry, RegistryError, Store, StoreOptions};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

use crate::{file_names, plugin};

struct TestServer {
    url: String,
    addr: std::net::SocketAddr,
    store: Store,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestServer {
    async fn start(max_blob_size: u64) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("reg");
        let store = Store::open(&root, StoreOptions { max_blob_size }).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(store.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        TestServer {
            url: format!("http://{addr}"),
            addr,
            store,
            root,
            _dir: dir,
        }
    }

    fn client(&self) -> Client {
        Client::new(&self.url).unwrap()
    }

    /// A request outside the client, to see the status and the JSON error body it would hide.
    async fn raw(&self, method: reqwest::Method, path: &str, body: Vec<u8>) -> (u16, Value) {
        let response = reqwest::Client::new()
            .request(method, format!("{}{path}", self.url))
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let json = if status >= 400 {
            error_body(&text)
        } else {
            serde_json::from_str(&text).unwrap_or(Value::Null)
        };
        (status, json)
    }

    fn blob_files(&self) -> Vec<String> {
        file_names(&self.root.join("blobs/sha256"))
    }
}

/// Every error body is `{code, message}` with string values.
fn error_body(text: &str) -> Value {
    let json: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("error body is not JSON ({e}): {text}"));
    assert!(
        json["code"].is_string() && json["message"].is_string(),
        "error body lacks code/message: {text}"
    );
    json
}

const MIB: u64 = 1024 * 1024;

#[tokio::test]
async fn publish_resolve_and_fetch_through_the_client() {
    let server = TestServer::start(MIB).await;
    let client = server.client();
    let bytes = plugin("file", "0.1.0", "files");
    let digest = Digest::of(&bytes);

    let published = client.publish(bytes.clone()).await.unwrap();
    assert!(published.created);
    assert_eq!(published.entry.digest, digest);
    let again = client.publish(bytes.clone()).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.entry, published.entry);

    assert_eq!(client.resolve("file", "0.1.0").await.unwrap(), published.entry);
    assert_eq!(client.versions("file").await.unwrap(), std::slice::from_ref(&published.entry));
    assert_eq!(client.list().await.unwrap(), std::slice::from_ref(&published.entry));
    assert_eq!(client.fetch(&digest).await.unwrap(), bytes);
    assert!(client.has_blob(&digest).await.unwrap());
    assert!(!client.has_blob(&Digest::of(b"nope")).await.unwrap());

    let other = b"just a blob".to_vec();
    assert_eq!(client.put_blob(other.clone()).await.unwrap(), (Digest::of(&other), true));
    assert_eq!(client.put_blob(other.clone()).await.unwrap(), (Digest::of(&other), false));

    // The same through `Registry`, as the CLI would open it.
    let registry = Registry::open(&server.url).unwrap();
    assert!(matches!(registry, Registry::Remote(_)));
    assert_eq!(registry.fetch(&digest).await.unwrap(), bytes);
    assert!(registry.publish(plugin("file", "0.2.0", "files")).await.unwrap().created);
    assert_eq!(registry.list().await.unwrap().len(), 2);

    let (status, json) = server.raw(reqwest::Method::POST, "/v1/plugins", plugin("file", "0.3.0", "x")).await;
    assert_eq!(status, 201);
    assert_eq!(json["version"], "0.3.0");
}

#[tokio::test]
async fn an_upload_under_the_wrong_digest_is_refused() {
    let server = TestServer::start(MIB).await;
    let bytes = b"the real bytes".to_vec();
    let wrong = Digest::of(b"something else");

    let (status, json) = server.raw(reqwest::Method::PUT, &format!("/v1/blobs/{wrong}"), bytes.clone()).await;
    assert_eq!(status, 400);
    assert_eq!(json["code"], "digest_mismatch");
    assert!(json["message"].as_str().unwrap().contains(&wrong.to_string()), "{json}");

    let err = server.client().put_blob_expecting(bytes, &wrong).await.unwrap_err();
    assert!(
        matches!(err, RegistryError::DigestMismatch { expected, .. } if expected == wrong),
        "{err:?}"
    );
    assert!(server.blob_files().is_empty());
}

#[tokio::test]
async fn a_truncated_upload_is_refused_and_the_store_stays_intact() {
    let server = TestServer::start(MIB).await;
    let client = server.client();
    let full = plugin("file", "0.1.0", &"payload ".repeat(100));
    let digest = Digest::of(&full);
    let half = full[..full.len() / 2].to_vec();

    let err = client.put_blob_expecting(half, &digest).await.unwrap_err();
    assert!(
        matches!(err, RegistryError::DigestMismatch { expected, .. } if expected == digest),
        "{err:?}"
    );
    assert!(!server.store.has_blob(&digest).unwrap());

    // A connection that promises the full length and hangs up halfway.
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "PUT /v1/blobs/{digest} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/wasm\r\ncontent-length: {}\r\n\r\n",
        server.addr,
        full.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&full[..full.len() / 2]).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(!answer.starts_with("HTTP/1.1 2"), "a truncated upload must not succeed: {answer}");

    assert!(!server.store.has_blob(&digest).unwrap());
    assert!(server.blob_files().is_empty());
    // The store still takes the whole upload afterwards.
    assert_eq!(client.put_blob(full.clone()).await.unwrap(), (digest, true));
    assert_eq!(client.fetch(&digest).await.unwrap(), full);
}

#[tokio::test]
async fn repointing_a_version_is_a_409() {
    let server = TestServer::start(MIB).await;
    let client = server.client();
    let original = plugin("file", "0.1.0", "files");
    let impostor = plugin("file", "0.1.0", "other files");
    client.publish(original.clone()).await.unwrap();

    let (status, json) = server.raw(reqwest::Method::POST, "/v1/plugins", impostor.clone()).await;
    assert_eq!(status, 409);
    assert_eq!(json["code"], "version_taken");
    let message = json["message"].as_str().unwrap();
    assert!(
        message.contains("file@0.1.0") && message.contains(&Digest::of(&original).to_string()),
        "{message}"
    );

    let err = client.publish(impostor.clone()).await.unwrap_err();
    match err {
        RegistryError::VersionTaken {
            name,
            version,
            existing,
            attempted,
        } => {
            assert_eq!((name.as_str(), version.as_str()), ("file", "0.1.0"));
            assert_eq!(existing, Digest::of(&original));
            assert_eq!(attempted, Digest::of(&impostor));
        }
        other => panic!("expected VersionTaken, got {other:?}"),
    }
    assert_eq!(client.resolve("file", "0.1.0").await.unwrap().digest, Digest::of(&original));
}

#[tokio::test]
async fn unknown_names_and_digests_are_404s() {
    let server = TestServer::start(MIB).await;
    let client = server.client();

    let (status, json) = server.raw(reqwest::Method::GET, "/v1/plugins/nothing", vec![]).await;
    assert_eq!((status, json["code"].as_str()), (404, Some("not_found")));
    let (status, json) = server.raw(reqwest::Method::GET, "/v1/plugins/nothing/1.0.0", vec![]).await;
    assert_eq!((status, json["code"].as_str()), (404, Some("not_found")));
    assert!(json["message"].as_str().unwrap().contains("nothing@1.0.0"), "{json}");
    assert!(matches!(
        client.resolve("nothing", "1.0.0").await,
        Err(RegistryError::NotFound { .. })
    ));
    assert!(matches!(client.versions("nothing").await, Err(RegistryError::NotFound { .. })));

    let unknown = Digest::of(b"never stored");
    let (status, json) = server.raw(reqwest::Method::GET, &format!("/v1/blobs/{unknown}"), vec![]).await;
    assert_eq!((status, json["code"].as_str()), (404, Some("unknown_digest")));
    assert!(json["message"].as_str().unwrap().contains(&unknown.to_string()));
    assert!(matches!(client.fetch(&unknown).await, Err(RegistryError::UnknownDigest(d)) if d == unknown));

    // Bad names never reach the server from the client, and are refused by the server anyway.
    assert_eq!(client.resolve("../etc", "1.0.0").await.unwrap_err().code(), "invalid_name");
    let (status, json) = server.raw(reqwest::Method::GET, "/v1/plugins/..%2Fetc/1.0.0", vec![]).await;
    assert_eq!((status, json["code"].as_str()), (400, Some("invalid_name")));
    let (status, json) = server.raw(reqwest::Method::GET, "/v1/blobs/sha256:..%2F..%2Fetc", vec![]).await;
    assert_eq!((status, json["code"].as_str()), (400, Some("invalid_digest")));
}

#[tokio::test]
async fn oversized_uploads_are_413() {
    let server = TestServer::start(4096).await;
    let client = server.client();
    let big = plugin("file", "0.1.0", &"x".repeat(8000));

    let (status, json) = server.raw(reqwest::Method::POST, "/v1/plugins", big.clone()).await;
    assert_eq!((status, json["code"].as_str()), (413, Some("too_large")));
    let err = client.publish(big.clone()).await.unwrap_err();
    assert!(matches!(err, RegistryError::TooLarge { limit: 4096, .. }), "{err:?}");
    assert_eq!(client.put_blob(big.clone()).await.unwrap_err().code(), "too_large");

    // Without a Content-Length, the limit is enforced while reading.
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "POST /v1/plugins HTTP/1.1\r\nhost: {}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        server.addr
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for chunk in big.chunks(1000) {
        let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
        framed.extend_from_slice(chunk);
        framed.extend_from_slice(b"\r\n");
        if stream.write_all(&framed).await.is_err() {
            break; // the server may answer and close before the rest arrives
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"too_large\""), "{answer}");

    assert!(server.blob_files().is_empty());
    assert!(client.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_tampered_blob_is_a_500_blob_corrupt() {
    let server = TestServer::start(MIB).await;
    let client = server.client();
    let bytes = plugin("file", "0.1.0", "files");
    let digest = client.publish(bytes).await.unwrap().entry.digest;
    let path = server.root.join("blobs/sha256").join(digest.hex());
    std::fs::write(&path, b"evil bytes").unwrap();

    let (status, json) = server.raw(reqwest::Method::GET, &format!("/v1/blobs/{digest}"), vec![]).await;
    assert_eq!((status, json["code"].as_str()), (500, Some("blob_corrupt")));
    assert!(json["message"].as_str().unwrap().contains(&digest.to_string()), "{json}");
    assert!(
        !json.to_string().contains(server.root.to_str().unwrap()),
        "no internal path leaks: {json}"
    );

    let err = client.fetch(&digest).await.unwrap_err();
    assert!(
        matches!(err, RegistryError::Corrupt { digest: d, actual } if d == digest && actual == Digest::of(b"evil bytes")),
        "{err:?}"
    );
    assert!(err.to_string().contains(&digest.to_string()));
}

#[tokio::test]
async fn pure_handler_cases_through_oneshot() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let bytes = plugin("file", "0.1.0", "files");
    let digest = store.publish(&bytes).unwrap().entry.digest;
    let app = router(store);

    let call = |method: Method, uri: String| {
        let app = app.clone();
        async move {
            app.oneshot(Request::builder().method(method).uri(uri).body(Body::empty()).unwrap())
                .await
                .unwrap()
        }
    };
    let body_of =
        |response: axum::response::Response| async move { axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap().to_vec() };

    let response = call(Method::GET, "/v1/blobs/not-a-digest".into()).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        error_body(&String::from_utf8(body_of(response).await).unwrap())["code"],
        "invalid_digest"
    );

    let response = call(Method::GET, "/v2/whatever".into()).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        error_body(&String::from_utf8(body_of(response).await).unwrap())["code"],
        "not_found"
    );

    let response = call(Method::GET, format!("/v1/blobs/{digest}")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/wasm");
    assert_eq!(body_of(response).await, bytes);

    let response = call(Method::HEAD, format!("/v1/blobs/{digest}")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/wasm");

    // Nested as the host does.
    let nested = axum::Router::new().nest("/registry", app.clone());
    let response = nested
        .oneshot(Request::get("/registry/v1/plugins/file/0.1.0").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let entry: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    assert_eq!(entry["digest"], digest.to_string());
    assert!(entry["published_at"].as_str().unwrap().contains('T'), "RFC 3339: {entry}");
}

/// Kills the child if a test fails before it exits on its own.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[tokio::test]
async fn the_standalone_binary_serves_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("reg");
    let child = Command::new(env!("CARGO_BIN_EXE_orc-registry"))
        .args(["serve", "--root", root.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .env("ORC_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);
    let stdout = child.0.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_string();

    let client = Client::new(&url).unwrap();
    let published = client.publish(plugin("file", "0.1.0", "files")).await.unwrap();
    assert!(published.created);
    assert!(root.join("blobs/sha256").join(published.entry.digest.hex()).is_file());

    let status = Command::new("kill").args(["-TERM", &child.0.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || {
        let status = child.0.wait().unwrap();
        drop(child);
        status
    })
    .await
    .unwrap();
    assert!(exit.success(), "graceful shutdown exits 0: {exit:?}");
}

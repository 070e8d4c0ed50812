//! The `http` capability's policy, through real plugins against a real HTTP server on loopback:
//! origins not granted and addresses the policy refuses are refused before any connection (the
//! server counts what reaches it), and an explicitly allowed network is reached.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use orc_manifest::Capability;
use orc_plugin_artifacts::{HTTP_OBJECT, MISBEHAVE};
use orc_runtime::capability::{AddressPolicy, HttpAccess, HttpPolicy, Origin};
use orc_runtime::{CallContext, Grants, PluginError, PluginErrorKind};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::{load, runtime, target};

/// A minimal HTTP server: answers every request with `200` and a JSON object, counting the
/// connections it accepts.
struct Server {
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl Server {
    async fn start(address: &str) -> Server {
        let listener = TcpListener::bind(address).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let body = br#"{"name":"served"}"#;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(head.as_bytes()).await;
                    let _ = stream.write_all(body).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Server { port, connections }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

fn context(allowed: &[String], addresses: AddressPolicy) -> CallContext {
    let policy = HttpPolicy {
        allowed: allowed.iter().map(|o| Origin::parse(o).unwrap()).collect(),
        addresses,
        ..HttpPolicy::default()
    };
    CallContext {
        http: Arc::new(HttpAccess::new(policy).unwrap()),
        ..CallContext::new("test")
    }
}

/// Reads an object through the `http-object` plugin.
async fn get(ctx: &CallContext, url: &str) -> Result<Option<serde_json::Value>, PluginError> {
    let rt = runtime();
    let plugin = load(&rt, &HTTP_OBJECT, &Grants::none().with(Capability::Http));
    let mut instance = plugin.adaptor(ctx).await.unwrap();
    let read = instance.read(&target("http-object", "o", json!({"url": url, "body": {}}))).await;
    match read {
        Ok(current) => Ok(current.map(|c| serde_json::from_str(&c).unwrap())),
        Err(e) => Err(e.plugin_error().unwrap_or_else(|| panic!("not a plugin error: {e}")).clone()),
    }
}

fn networks(list: &[&str]) -> AddressPolicy {
    AddressPolicy::Networks(list.iter().map(|n| n.parse().unwrap()).collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_granted_name_that_resolves_to_a_refused_address_never_connects() {
    let server = Server::start("127.0.0.1:0").await;
    let port = server.port;
    let by_name = format!("http://localhost:{port}");
    let by_ip = format!("http://127.0.0.1:{port}");
    let granted = [by_name.clone(), by_ip.clone()];

    for addresses in [AddressPolicy::Public, AddressPolicy::PublicAndPrivate, networks(&["10.0.0.0/8"])] {
        let ctx = context(&granted, addresses.clone());
        let e = get(&ctx, &format!("{by_name}/o")).await.unwrap_err();
        assert_eq!(e.kind, PluginErrorKind::Denied, "{addresses:?}: {e:?}");
        assert!(
            e.message
                .contains("outgoing HTTP to localhost refused: it resolves to 127.0.0.1 (loopback)"),
            "{}",
            e.message
        );
        // An IP literal is checked the same way (the client resolves no literal).
        let e = get(&ctx, &format!("{by_ip}/o")).await.unwrap_err();
        assert_eq!(e.kind, PluginErrorKind::Denied, "{addresses:?}: {e:?}");
        assert!(e.message.contains("127.0.0.1 (loopback)"), "{}", e.message);
    }
    let ctx = context(&granted, networks(&["10.0.0.0/8"]));
    let e = get(&ctx, &format!("{by_name}/o")).await.unwrap_err();
    assert!(e.message.ends_with("allows addresses in 10.0.0.0/8 only"), "{}", e.message);
    assert_eq!(server.connections(), 0, "nothing reached the server");

    // The same requests with loopback named by the policy reach it.
    let ctx = context(&granted, networks(&["127.0.0.0/8", "::1/128"]));
    assert_eq!(get(&ctx, &format!("{by_name}/o")).await.unwrap(), Some(json!({"name": "served"})));
    assert_eq!(get(&ctx, &format!("{by_ip}/o")).await.unwrap(), Some(json!({"name": "served"})));
    assert_eq!(server.connections(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_reaching_an_origin_it_was_not_granted_is_refused_before_connecting() {
    // The misbehave fixture GETs http://127.0.0.1:9/; listen there to see whether it gets through.
    let server = Server::start("127.0.0.1:9").await;
    let other = Server::start("127.0.0.1:0").await;
    let rt = runtime();
    // The fixture requests every capability: only full grants load it.
    let plugin = load(&rt, &MISBEHAVE, &Grants::all());
    let loopback = networks(&["127.0.0.0/8"]);

    let ctx = context(&[format!("http://127.0.0.1:{}", other.port)], loopback.clone());
    let mut instance = plugin.adaptor(&ctx).await.unwrap();
    let err = instance
        .read(&target("misbehave", "/x", json!({"behave": "http"})))
        .await
        .unwrap_err();
    let e = err.plugin_error().expect("a plugin error");
    assert_eq!(e.kind, PluginErrorKind::Denied, "{e:?}");
    assert_eq!(
        e.message,
        "outgoing HTTP to http://127.0.0.1:9 is not allowed by this environment's policy"
    );
    assert_eq!(server.connections(), 0);

    // Granted, the same call goes through: the refusal above was the policy's.
    let ctx = context(&["http://127.0.0.1:9".to_string()], loopback);
    let mut instance = plugin.adaptor(&ctx).await.unwrap();
    instance.read(&target("misbehave", "/x", json!({"behave": "http"}))).await.unwrap();
    assert_eq!(server.connections(), 1);
    assert_eq!(other.connections(), 0);
}

/// A server that echoes the request's headers in its answer (as many do on errors).
async fn echo_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&request).to_string();
                let auth = head
                    .lines()
                    .find_map(|l| l.strip_prefix("authorization: ").or_else(|| l.strip_prefix("Authorization: ")))
                    .unwrap_or("")
                    .to_string();
                let body = serde_json::to_vec(&json!({ "seen": auth })).unwrap();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-echo: {auth}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.write_all(&body).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    base
}

/// The host sends the secret; an endpoint that echoes it hands the plugin `[redacted]`, never the
/// value. And a plugin cannot point a request at another virtual host with its own `Host`.
#[tokio::test(flavor = "multi_thread")]
async fn a_secret_echoed_back_never_reaches_the_plugin_and_host_cannot_be_set() {
    const SECRET: &str = "Bearer echo-me-not-7f3a9c";
    let base = echo_server().await;
    let policy = HttpPolicy {
        allowed: vec![Origin::parse(&base).unwrap()],
        addresses: networks(&["127.0.0.0/8"]),
        secrets: std::collections::HashMap::from([("token".to_string(), SECRET.to_string())]),
        ..HttpPolicy::default()
    };
    let ctx = CallContext {
        http: Arc::new(HttpAccess::new(policy).unwrap()),
        ..CallContext::new("test")
    };
    let rt = runtime();
    let plugin = load(&rt, &HTTP_OBJECT, &Grants::all());
    let mut instance = plugin.adaptor(&ctx).await.unwrap();
    let current = instance
        .read(&target(
            "http-object",
            "o",
            json!({"url": format!("{base}/o"), "body": {}, "secret": "token"}),
        ))
        .await
        .unwrap()
        .unwrap();
    assert!(!current.contains("echo-me-not"), "the plugin saw the secret: {current}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&current).unwrap(),
        json!({ "seen": "[redacted]" })
    );

    let mut instance = plugin.adaptor(&ctx).await.unwrap();
    let err = instance
        .read(&target(
            "http-object",
            "o",
            json!({"url": format!("{base}/o"), "body": {}, "secret": "token", "headers": {"Host": "internal.example"}}),
        ))
        .await
        .unwrap_err();
    let e = err.plugin_error().expect("a plugin error");
    assert_eq!(e.kind, PluginErrorKind::Denied, "{e:?}");
    assert!(e.message.contains("may not set the `Host` header"), "{}", e.message);
}

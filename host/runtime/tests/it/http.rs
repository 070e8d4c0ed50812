//! The `http` capability's policy, through real plugins against a real HTTP server on loopback:
//! origins not granted and addresses the policy refuses are refused before any connection (the
//! server counts what reaches it), and an explicitly allowed network is reached. A host-held
//! secret reaches only the origins it is bound to, and plain HTTP only where the policy allows
//! secrets over it (the server records every request it gets).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use orc_manifest::Capability;
use orc_plugin_artifacts::{HTTP_OBJECT, MISBEHAVE};
use orc_runtime::capability::{AddressPolicy, BoundSecret, HttpAccess, HttpPolicy, Origin};
use orc_runtime::{CallContext, Grants, PluginError, PluginErrorKind};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::{load, runtime, target};

/// A minimal HTTP server: answers every request with `200` and a JSON object, counting the
/// connections it accepts and keeping every request's head (the request line and headers).
struct Server {
    port: u16,
    connections: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Server {
    async fn start(address: &str) -> Server {
        let listener = TcpListener::bind(address).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (counter, heads) = (connections.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let heads = heads.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    heads.lock().unwrap().push(String::from_utf8_lossy(&request).into_owned());
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
        Server {
            port,
            connections,
            requests,
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// The heads of the requests received so far.
    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
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
    read(ctx, json!({"url": url, "body": {}})).await
}

/// Reads an object through the `http-object` plugin, the request naming the host-held `secret`.
async fn get_with_secret(ctx: &CallContext, url: &str, secret: &str) -> Result<Option<serde_json::Value>, PluginError> {
    read(ctx, json!({"url": url, "body": {}, "secret": secret})).await
}

async fn read(ctx: &CallContext, attributes: serde_json::Value) -> Result<Option<serde_json::Value>, PluginError> {
    let rt = runtime();
    let plugin = load(&rt, &HTTP_OBJECT, &Grants::none().with(Capability::Http));
    let mut instance = plugin.adaptor(ctx).await.unwrap();
    let read = instance.read(&target("http-object", "o", attributes)).await;
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
        secrets: HashMap::from([("token".to_string(), bound(SECRET, &[&base]))]),
        secrets_over_plain_http: true,
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

fn bound(value: &str, origins: &[&str]) -> BoundSecret {
    BoundSecret {
        value: value.to_string(),
        origins: origins.iter().map(|o| Origin::parse(o).unwrap()).collect(),
    }
}

/// A loopback policy allowing `allowed`, with the secret `token` bound to `bound_to`.
fn with_secret(allowed: &[String], bound_to: &[&str], secrets_over_plain_http: bool) -> CallContext {
    let policy = HttpPolicy {
        allowed: allowed.iter().map(|o| Origin::parse(o).unwrap()).collect(),
        addresses: networks(&["127.0.0.0/8"]),
        secrets: HashMap::from([("token".to_string(), bound(BOUND_SECRET, bound_to))]),
        secrets_over_plain_http,
        ..HttpPolicy::default()
    };
    CallContext {
        http: Arc::new(HttpAccess::new(policy).unwrap()),
        ..CallContext::new("test")
    }
}

const BOUND_SECRET: &str = "Bearer bound-to-one-origin-41c7e2";

/// Two servers the environment allows, the secret bound to one: a request naming the secret
/// towards the other is refused before anything is sent — that server sees no request at all —
/// while the same request without the secret, and the secret towards its own origin, go through.
/// An origin differing only in scheme is another origin.
#[tokio::test(flavor = "multi_thread")]
async fn a_secret_is_never_sent_to_an_origin_it_is_not_bound_to() {
    let home = Server::start("127.0.0.1:0").await;
    let other = Server::start("127.0.0.1:0").await;
    let (home_origin, other_origin) = (home.origin(), other.origin());
    let allowed = [home_origin.clone(), other_origin.clone()];
    let ctx = with_secret(&allowed, &[&home_origin], true);

    let e = get_with_secret(&ctx, &format!("{other_origin}/o"), "token").await.unwrap_err();
    assert_eq!(e.kind, PluginErrorKind::Denied, "{e:?}");
    // The plugin puts the request before the host's refusal.
    assert_eq!(
        e.message,
        format!("GET {other_origin}/o: secret `token` may not be sent to {other_origin}: it is bound to {home_origin}")
    );
    // The same host and port over https is another origin, to which the secret is bound instead.
    let https_home = home_origin.replace("http://", "https://");
    let ctx_https = with_secret(&allowed, &[&https_home], true);
    let e = get_with_secret(&ctx_https, &format!("{home_origin}/o"), "token").await.unwrap_err();
    assert_eq!(e.kind, PluginErrorKind::Denied, "{e:?}");
    assert!(e.message.ends_with(&format!("it is bound to {https_home}")), "{}", e.message);
    assert_eq!((home.connections(), other.connections()), (0, 0), "nothing was sent");

    // Without the secret the other origin is reached: the refusal was the binding's.
    assert_eq!(
        get(&ctx, &format!("{other_origin}/o")).await.unwrap(),
        Some(json!({"name": "served"}))
    );
    assert_eq!(
        get_with_secret(&ctx, &format!("{home_origin}/o"), "token").await.unwrap(),
        Some(json!({"name": "served"}))
    );
    let carried = |head: &String| head.to_ascii_lowercase().contains(&BOUND_SECRET.to_ascii_lowercase());
    let (home_seen, other_seen) = (home.requests(), other.requests());
    assert_eq!(other_seen.len(), 1, "{other_seen:?}");
    assert!(!other_seen.iter().any(carried), "{other_seen:?}");
    assert_eq!(home_seen.len(), 1, "{home_seen:?}");
    assert!(home_seen.iter().all(carried), "the secret went to its origin: {home_seen:?}");
}

/// A secret bound to an `http://` origin: refused before sending (the server sees nothing) while
/// the policy does not allow secrets over plain HTTP, the message naming the setting; sent once
/// it does.
#[tokio::test(flavor = "multi_thread")]
async fn a_secret_over_plain_http_is_refused_unless_the_policy_allows_it() {
    let server = Server::start("127.0.0.1:0").await;
    let origin = server.origin();
    let allowed = [origin.clone()];

    let ctx = with_secret(&allowed, &[&origin], false);
    let e = get_with_secret(&ctx, &format!("{origin}/o"), "token").await.unwrap_err();
    assert_eq!(e.kind, PluginErrorKind::Denied, "{e:?}");
    assert_eq!(
        e.message,
        format!(
            "GET {origin}/o: secret `token` may not be sent to {origin} over plain HTTP: secrets go over https only unless the environment's setting `http.secrets_over_plain_http` is true"
        )
    );
    assert_eq!(server.connections(), 0, "nothing was sent");
    // Plain HTTP without a secret is the origin policy's business alone.
    assert_eq!(get(&ctx, &format!("{origin}/o")).await.unwrap(), Some(json!({"name": "served"})));

    let ctx = with_secret(&allowed, &[&origin], true);
    assert_eq!(
        get_with_secret(&ctx, &format!("{origin}/o"), "token").await.unwrap(),
        Some(json!({"name": "served"}))
    );
    let seen = server.requests();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(!seen[0].contains(BOUND_SECRET), "{}", seen[0]);
    assert!(
        seen[1]
            .lines()
            .any(|l| l.eq_ignore_ascii_case(&format!("authorization: {BOUND_SECRET}"))),
        "{}",
        seen[1]
    );
}

/// A plugin's own request timeout can shorten the policy's, never lengthen it: against a server
/// that answers after 3 s, a policy of 300 ms ends the request at about 300 ms though the plugin
/// asked for 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_request_timeout_never_exceeds_the_policys() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
                    .await;
            });
        }
    });
    let origin = format!("http://127.0.0.1:{port}");
    let policy = HttpPolicy {
        allowed: [Origin::parse(&origin).unwrap()].into_iter().collect(),
        addresses: networks(&["127.0.0.0/8"]),
        timeout: std::time::Duration::from_millis(300),
        ..HttpPolicy::default()
    };
    let ctx = CallContext {
        http: Arc::new(HttpAccess::new(policy).unwrap()),
        ..CallContext::new("test")
    };
    let rt = runtime();
    let plugin = load(&rt, &MISBEHAVE, &Grants::all());
    let mut instance = plugin.adaptor(&ctx).await.unwrap();
    let started = std::time::Instant::now();
    let err = instance
        .read(&target(
            "misbehave",
            "/x",
            json!({"behave": "http", "url": format!("{origin}/slow"), "ms": 10000}),
        ))
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    let e = err.plugin_error().expect("a plugin error");
    assert_eq!(e.kind, PluginErrorKind::Unavailable, "{e:?}");
    assert!(elapsed < std::time::Duration::from_millis(2000), "the request ran {elapsed:?}");
}

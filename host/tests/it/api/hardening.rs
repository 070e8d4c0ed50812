//! What neither an attacker without credentials nor a careless admin nor a stalled reader can do
//! to the host: sign-in throttled per name and per address (429 with `Retry-After`, a real user
//! back in after the window, every attempt audited with the name and address it came with); the
//! last way in that can act as admin never removed, however it is tried (409 naming why); and
//! two event streams nobody reads holding no more than their bounded buffers while twenty
//! 3,000-resource deploys run, each told it lagged.

use std::time::{Duration, Instant};

use futures::StreamExt;
use orc_host::store::Backend;
use orc_tests::wait_for;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Data, Host, assert_error};

async fn login(host: &Host, name: &str, password: &str) -> (StatusCode, Option<String>, Value) {
    let response = host
        .client
        .post(format!("{}/login", host.base))
        .json(&json!({ "name": name, "password": password }))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let retry = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    (status, retry, response.json().await.unwrap_or(Value::Null))
}

pub async fn sign_in_is_throttled_per_name_and_per_address_and_a_real_user_gets_back_in(backend: Backend) {
    let host = Host::start_configured(Data::fresh(backend).await, None, |config| {
        config.sign_in.per_name_per_minute = 60;
        config.sign_in.per_name_burst = 3;
        config.sign_in.per_address_per_minute = 6;
        config.sign_in.per_address_burst = 8;
    })
    .await;
    let password = "a long and secret passphrase 7";
    let (status, user) = host.post("/users", &json!({ "name": "ann", "password": password })).await;
    assert_eq!(status, StatusCode::CREATED, "{user}");

    // Three wrong guesses for ann, then the name's bucket is empty: 429 with `Retry-After`,
    // even for the right password (the check is not even made).
    for _ in 0..3 {
        let (status, _, body) = login(&host, "ann", "a wrong guess at it 0").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    }
    let (status, retry, body) = login(&host, "ann", password).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("rate_limited")),
        "{body}"
    );
    let wait: u64 = retry.expect("Retry-After").parse().unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    assert!(body["message"].as_str().unwrap().contains("for this user name"), "{body}");
    // A name no user has is throttled the same way: the answers tell nothing of which exist.
    let mut ghost = Vec::new();
    for _ in 0..4 {
        ghost.push(login(&host, "ghost", "a wrong guess at it 0").await.0);
    }
    assert_eq!(
        ghost,
        [
            StatusCode::UNAUTHORIZED,
            StatusCode::UNAUTHORIZED,
            StatusCode::UNAUTHORIZED,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // This address has made eight attempts: the ninth is refused whatever the name.
    let (status, _, body) = login(&host, "carol", "a wrong guess at it 0").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(body["message"].as_str().unwrap().contains("from this address"), "{body}");

    // The buckets refill: ann signs in once the window has passed, with no lock left behind.
    let deadline = Instant::now() + Duration::from_secs(30);
    let token = loop {
        let (status, retry, body) = login(&host, "ann", password).await;
        if status == StatusCode::CREATED {
            break body["token"].as_str().unwrap().to_string();
        }
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert!(Instant::now() < deadline, "ann never got back in");
        tokio::time::sleep(Duration::from_secs(retry.unwrap().parse().unwrap())).await;
    };
    let me = host
        .client
        .get(format!("{}/me", host.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(me.status(), StatusCode::OK);

    // Every attempt is in the audit trail, under the name it gave and the address it came from.
    let (status, audit) = host.get("/audit?failed=true&limit=100").await;
    assert_eq!(status, StatusCode::OK, "{audit}");
    let failed: Vec<&Value> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["route"] == "/login")
        .collect();
    let of = |name: &str, code: &str| failed.iter().filter(|e| e["user"] == name && e["code"] == code).count();
    assert_eq!(of("ann", "invalid_credentials"), 3, "{audit}");
    assert!(of("ann", "rate_limited") >= 1, "{audit}");
    assert_eq!(of("ghost", "invalid_credentials"), 3, "{audit}");
    assert!(failed.iter().all(|e| e["source"] == "127.0.0.1"), "{audit}");
    host.stop().await;
}

pub async fn the_last_way_in_that_can_act_as_admin_is_never_removed(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let (_, me) = host.get("/me").await;
    let full = me["token_id"].as_str().unwrap().to_string();

    // (a) The only admin, without a password, makes a token scoped to no role and deletes its
    // one full token: refused, naming why.
    let (status, narrow) = host.post("/tokens", &json!({ "scope": {} })).await;
    assert_eq!(status, StatusCode::CREATED, "{narrow}");
    assert_error(
        host.send(Method::DELETE, &format!("/tokens/{full}"), None).await,
        StatusCode::CONFLICT,
        "conflict",
        "last way in that can act as admin",
    );
    // A token scoped to `admin` is a way in: then the full one may go.
    let (status, admin_scoped) = host.post("/tokens", &json!({ "scope": { "admin": true } })).await;
    assert_eq!(status, StatusCode::CREATED, "{admin_scoped}");
    let admin_scoped_token = admin_scoped["token"].as_str().unwrap().to_string();

    // (b) The admin disables itself while the only other admin holds nothing but a token scoped
    // to `publisher`: refused.
    let (status, bob) = host.post("/users", &json!({ "name": "bob", "admin": true })).await;
    assert_eq!(status, StatusCode::CREATED, "{bob}");
    let (status, bobs) = host.post("/users/bob/tokens", &json!({ "scope": { "publisher": true } })).await;
    assert_eq!(status, StatusCode::CREATED, "{bobs}");
    assert_error(
        host.send(Method::PATCH, "/users/admin", Some(br#"{"disabled": true}"#.to_vec()))
            .await,
        StatusCode::CONFLICT,
        "conflict",
        "no way in that can act as admin",
    );
    // Nor demoted, nor deleted.
    assert_error(
        host.send(Method::PATCH, "/users/admin", Some(br#"{"admin": false}"#.to_vec()))
            .await,
        StatusCode::CONFLICT,
        "conflict",
        "can act as admin",
    );
    assert_error(
        host.send(Method::DELETE, "/users/admin", None).await,
        StatusCode::CONFLICT,
        "conflict",
        "can act as admin",
    );
    // With a password bob has a way in that can act as admin: admin may now step down.
    let (status, _) = host
        .send(
            Method::PATCH,
            "/users/bob",
            Some(br#"{"password": "bob's long passphrase"}"#.to_vec()),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = host.send(Method::DELETE, &format!("/tokens/{full}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    // The admin-scoped token still acts as admin.
    let users = host
        .client
        .get(format!("{}/users", host.base))
        .bearer_auth(&admin_scoped_token)
        .send()
        .await
        .unwrap();
    assert_eq!(users.status(), StatusCode::OK);
    let (status, body) = host
        .send(Method::PATCH, "/users/admin", Some(br#"{"disabled": true}"#.to_vec()))
        .await;
    // The host's own token was the full one, now gone: the admin-scoped one disables admin.
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let disabled = host
        .client
        .patch(format!("{}/users/admin", host.base))
        .bearer_auth(&admin_scoped_token)
        .json(&json!({ "disabled": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(disabled.status(), StatusCode::OK);
    // bob's password is the last way in: removing it is refused.
    let login = host
        .client
        .post(format!("{}/login", host.base))
        .json(&json!({ "name": "bob", "password": "bob's long passphrase" }))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), StatusCode::CREATED);
    let bob_token = login.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_string();
    let removed = host
        .client
        .patch(format!("{}/users/bob", host.base))
        .bearer_auth(&bob_token)
        .json(&json!({ "password": null }))
        .send()
        .await
        .unwrap();
    // bob's unscoped token from signing in is a way in too, so the password may go.
    assert_eq!(removed.status(), StatusCode::OK);
    let revoke = host
        .client
        .get(format!("{}/me", host.base))
        .bearer_auth(&bob_token)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let refused = host
        .client
        .delete(format!("{}/tokens/{}", host.base, revoke["token_id"].as_str().unwrap()))
        .bearer_auth(&bob_token)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT, "bob's one token is the last way in");
    host.stop().await;
}

/// An intent of `n` files in one directory, each holding `content`.
fn files(n: usize, content: &str) -> Vec<u8> {
    let mut resources = vec![json!({ "id": "directory[local,/many]", "adaptor": "directory@0.1.0", "attributes": {} })];
    for i in 0..n {
        resources.push(json!({
            "id": format!("file[local,/many/{i:05}]"),
            "adaptor": "file@0.1.0",
            "attributes": { "content": content },
            "requires": ["directory[local,/many]"],
        }));
    }
    json!({ "resources": resources }).to_string().into_bytes()
}

/// The value of metric `name` (no labels) in `GET /metrics`.
async fn metric(host: &Host, name: &str) -> f64 {
    let text = host
        .client
        .get(host.base.replace("/api/v1", "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

pub async fn stalled_event_streams_cost_at_most_their_buffers_and_are_told_they_lagged(backend: Backend) {
    const BUFFER: usize = 4 * 1024 * 1024;
    const DEPLOYS: usize = 20;
    const FILES: usize = 3_000;
    let host = Host::start_configured(Data::fresh(backend).await, None, |config| {
        config.max_body_bytes = 16 << 20;
        config.event_buffer_bytes = BUFFER;
    })
    .await;
    host.create_environment("big").await;
    // Two readers that never read, and one that does.
    let open = || async {
        let response = host
            .client
            .get(format!("{}/environments/big/events", host.base))
            .bearer_auth(&host.token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response
    };
    let stalled = [open().await, open().await];
    let mut live = open().await.bytes_stream();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = seen.clone();
    let reading = tokio::spawn(async move {
        while let Some(Ok(chunk)) = live.next().await {
            let n = chunk.windows(7).filter(|w| w == b"event: ").count();
            counted.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    });

    let mut most_buffered = 0f64;
    for deploy in 0..DEPLOYS {
        let (status, body) = host
            .post_raw("/environments/big/intents", &files(FILES, &format!("version {deploy}\n")))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let version = body["version"].as_u64().unwrap();
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            most_buffered = most_buffered.max(metric(&host, "orc_event_stream_buffered_bytes").await);
            let (_, env) = host.get("/environments/big").await;
            let deployed = env["resources"]["deployed"].as_u64().unwrap_or(0) as usize;
            if env["released_version"] == version && deployed == FILES + 1 {
                break;
            }
            assert!(Instant::now() < deadline, "deploy {deploy} did not finish: {env}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // What the host held for the three readers never passed their three buffers (no batch of
    // these deploys is larger than one buffer): the two that never read cost at most theirs.
    assert!(
        most_buffered <= (3 * BUFFER) as f64,
        "{most_buffered} bytes were queued for three readers of {BUFFER}-byte buffers"
    );
    assert_eq!(metric(&host, "orc_event_stream_lagged_total").await, 2.0);
    assert_eq!(metric(&host, "orc_event_stream_buffered_bytes").await, 0.0);
    // Each stalled reader, reading at last, finds the start of the stream, then `lagged` saying
    // what it missed and how to catch up, then the end.
    for response in stalled {
        let text = tokio::time::timeout(Duration::from_secs(30), response.text())
            .await
            .expect("a lagged stream ends")
            .unwrap();
        let last = text.trim_end().rsplit("\n\n").next().unwrap();
        assert!(last.starts_with("event: lagged\n"), "the last event: {last}");
        let data: Value = serde_json::from_str(last.split_once("data: ").unwrap().1).unwrap();
        assert!(data["missed_events"].as_u64().unwrap() > 0, "{data}");
        assert_eq!(data["buffer_bytes"], BUFFER, "{data}");
        assert!(data["catch_up"].as_str().unwrap().contains("/environments/big/resources"), "{data}");
    }
    // The reader that kept up was not cut off, and saw every deploy's events (a state and an
    // action of each file, at least).
    wait_for(
        "every deploy's events to reach the reader that kept up",
        Duration::from_secs(60),
        async || {
            assert!(!reading.is_finished(), "the reader that kept up was cut off");
            let events = seen.load(std::sync::atomic::Ordering::Relaxed);
            if events >= 2 * DEPLOYS * FILES {
                Ok(())
            } else {
                Err(format!("{events} events"))
            }
        },
    )
    .await;
    reading.abort();
    host.stop().await;
}

//! Users, roles, tokens and the audit trail against a real server: every route of the OpenAPI
//! document tried with every role (from the document, against this file's own table of who may
//! do what, so a new route without a rule fails here), environments kept apart, a publisher who
//! cannot deploy, revocation and disabling that take effect at once (open event streams too),
//! sign-in, passwords never answered or stored in clear, and the audit trail naming the author.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use orc_host::store::Backend;
use orc_tests::wait_for;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::Host;

/// Who may call each route, as this test expects it (independent of the server's table).
const EXPECTED: &[(&str, &str, &str)] = &[
    ("GET", "/health", "open"),
    ("POST", "/login", "open"),
    ("GET", "/me", "signed"),
    ("GET", "/environments", "signed"),
    ("POST", "/environments", "admin"),
    ("GET", "/environments/{env}", "viewer"),
    ("PATCH", "/environments/{env}", "owner"),
    ("DELETE", "/environments/{env}", "admin"),
    ("POST", "/environments/{env}/halt", "operator"),
    ("POST", "/environments/{env}/resume", "operator"),
    ("GET", "/environments/{env}/members", "viewer"),
    ("PUT", "/environments/{env}/members/{user}", "owner"),
    ("DELETE", "/environments/{env}/members/{user}", "owner"),
    ("GET", "/environments/{env}/intents", "viewer"),
    ("POST", "/environments/{env}/intents", "owner"),
    ("GET", "/environments/{env}/intents/{version}", "viewer"),
    ("GET", "/environments/{env}/intents/{version}/diff/{other}", "viewer"),
    ("POST", "/environments/{env}/intents/{version}/release", "owner"),
    ("POST", "/environments/{env}/intents/{version}/rollback", "owner"),
    ("PUT", "/environments/{env}/resource-sets/{name}", "owner"),
    ("GET", "/environments/{env}/resources", "viewer"),
    ("GET", "/environments/{env}/resources/{id}", "viewer"),
    ("GET", "/environments/{env}/resources/{id}/actions", "viewer"),
    ("GET", "/environments/{env}/actions", "viewer"),
    ("GET", "/environments/{env}/events", "viewer"),
    ("POST", "/environments/{env}/deploy", "operator"),
    ("POST", "/environments/{env}/repair", "operator"),
    ("POST", "/environments/{env}/dryrun", "operator"),
    ("GET", "/environments/{env}/dryruns", "viewer"),
    ("GET", "/environments/{env}/dryruns/{id}", "viewer"),
    ("GET", "/environments/{env}/operations/{id}", "viewer"),
    ("GET", "/environments/{env}/templates", "viewer"),
    ("GET", "/environments/{env}/templates/{name}", "viewer"),
    ("POST", "/environments/{env}/templates/{name}", "owner"),
    ("DELETE", "/environments/{env}/templates/{name}", "owner"),
    ("GET", "/environments/{env}/templates/{name}/versions", "viewer"),
    ("GET", "/environments/{env}/clusters", "viewer"),
    ("POST", "/environments/{env}/clusters", "operator"),
    ("GET", "/environments/{env}/clusters/{name}", "viewer"),
    ("DELETE", "/environments/{env}/clusters/{name}", "operator"),
    ("POST", "/environments/{env}/clusters/{name}/amend", "operator"),
    ("POST", "/environments/{env}/clusters/{name}/reconfigure", "operator"),
    ("POST", "/environments/{env}/clusters/{name}/lease", "operator"),
    ("POST", "/environments/{env}/clusters/{name}/retry", "operator"),
    (
        "POST",
        "/environments/{env}/clusters/{name}/services/{service}/{action}",
        "operator",
    ),
    ("GET", "/environments/{env}/nodes", "viewer"),
    ("PUT", "/environments/{env}/nodes/{node}", "owner"),
    ("DELETE", "/environments/{env}/nodes/{node}", "owner"),
    ("GET", "/nodes", "admin"),
    ("POST", "/nodes", "admin"),
    ("GET", "/nodes/{node}", "admin"),
    ("PATCH", "/nodes/{node}", "admin"),
    ("DELETE", "/nodes/{node}", "admin"),
    ("POST", "/nodes/{node}/verify", "admin"),
    ("POST", "/nodes/{node}/accept-host-key", "admin"),
    ("GET", "/users", "admin"),
    ("POST", "/users", "admin"),
    ("GET", "/users/{user}", "admin"),
    ("PATCH", "/users/{user}", "admin"),
    ("DELETE", "/users/{user}", "admin"),
    ("POST", "/users/{user}/tokens", "admin"),
    ("GET", "/tokens", "signed"),
    ("POST", "/tokens", "signed"),
    ("DELETE", "/tokens/{id}", "signed"),
    ("GET", "/audit", "admin"),
    ("GET", "/replicas", "admin"),
    ("POST", "/replicas/{id}/drain", "admin"),
    ("GET", "/services", "signed"),
    ("GET", "/services/{name}", "signed"),
    ("GET", "/services/{name}/{version}", "signed"),
    ("GET", "/environments/{env}/processes", "viewer"),
    ("POST", "/environments/{env}/processes", "operator"),
    ("GET", "/environments/{env}/processes/{name}", "viewer"),
    ("PATCH", "/environments/{env}/processes/{name}", "operator"),
    ("DELETE", "/environments/{env}/processes/{name}", "operator"),
    ("POST", "/environments/{env}/processes/{name}/move", "operator"),
    ("GET", "/environments/{env}/connections", "viewer"),
    ("POST", "/environments/{env}/connections", "operator"),
    ("GET", "/environments/{env}/connections/{id}", "viewer"),
    ("DELETE", "/environments/{env}/connections/{id}", "operator"),
    ("GET", "/environments/{env}/pending", "viewer"),
];

/// The callers tried on every route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Nobody,
    BadToken,
    Viewer,
    Operator,
    Owner,
    /// Owner of the other environment only.
    Stranger,
    Publisher,
    Admin,
}

impl Who {
    const ALL: [Who; 8] = [
        Who::Nobody,
        Who::BadToken,
        Who::Viewer,
        Who::Operator,
        Who::Owner,
        Who::Stranger,
        Who::Publisher,
        Who::Admin,
    ];

    /// Whether this caller passes `rule` (in environment `a`).
    fn passes(self, rule: &str) -> bool {
        let rank = match self {
            Who::Viewer => 1,
            Who::Operator => 2,
            Who::Owner | Who::Admin => 3,
            _ => 0,
        };
        match rule {
            "open" => true,
            "signed" => !matches!(self, Who::Nobody | Who::BadToken),
            "admin" => self == Who::Admin,
            "publisher" => matches!(self, Who::Publisher | Who::Admin),
            "viewer" => rank >= 1,
            "operator" => rank >= 2,
            "owner" => rank >= 3,
            other => panic!("unknown rule `{other}` in EXPECTED"),
        }
    }
}

/// A request with `token` (none: no `Authorization`), the body read only when asked.
async fn call(host: &Host, token: Option<&str>, method: Method, path: &str, body: Option<&Value>) -> reqwest::Response {
    let mut req = host.client.request(method, format!("{}{path}", host.base));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(body);
    }
    req.send().await.unwrap()
}

async fn json_of(resp: reqwest::Response) -> (StatusCode, Value) {
    let status = resp.status();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Creates user `name` (with `password`, flags) and answers a token of it.
async fn user_with_token(host: &Host, name: &str, extra: Value) -> String {
    let mut body = json!({ "name": name });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let (status, user) = host.post("/users", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{user}");
    let (status, token) = host.post(&format!("/users/{name}/tokens"), &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{token}");
    token["token"].as_str().unwrap().to_string()
}

async fn grant(host: &Host, env: &str, user: &str, role: &str) {
    let (status, body) = host
        .send(
            Method::PUT,
            &format!("/environments/{env}/members/{user}"),
            Some(json!({ "role": role }).to_string().into_bytes()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// The callers of [`Who`]: users with their roles in environments `a` and `b`.
async fn callers(host: &Host) -> BTreeMap<&'static str, String> {
    host.create_environment("a").await;
    host.create_environment("b").await;
    let mut tokens = BTreeMap::new();
    for (name, role) in [("viewer", "viewer"), ("operator", "operator"), ("owner", "owner")] {
        tokens.insert(name, user_with_token(host, name, json!({})).await);
        grant(host, "a", name, role).await;
    }
    tokens.insert("stranger", user_with_token(host, "stranger", json!({})).await);
    grant(host, "b", "stranger", "owner").await;
    tokens.insert("publisher", user_with_token(host, "publisher", json!({ "publisher": true })).await);
    tokens
}

/// Every route of the document, with every caller: a caller the rule lets through is not
/// answered 401 or 403; any other is answered 401 (no valid token) or 403 naming the role.
pub async fn every_route_answers_each_role_as_its_rule_says(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let tokens = callers(&host).await;
    let (_, doc) = host.get("/openapi.json").await;
    let expected: BTreeMap<(&str, &str), &str> = EXPECTED.iter().map(|(m, p, r)| ((*m, *p), *r)).collect();
    let mut unlisted = Vec::new();
    let mut tried = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "put", "post", "delete", "patch"] {
            if item.get(method).is_none() {
                continue;
            }
            let method_upper = method.to_uppercase();
            let Some(rule) = expected.get(&(method_upper.as_str(), path.as_str())) else {
                unlisted.push(format!("{method_upper} {path}"));
                continue;
            };
            for who in Who::ALL {
                let token = match who {
                    Who::Nobody => None,
                    Who::BadToken => Some("orc_not_a_token_of_this_host".to_string()),
                    Who::Admin => Some(host.token.clone()),
                    Who::Viewer => Some(tokens["viewer"].clone()),
                    Who::Operator => Some(tokens["operator"].clone()),
                    Who::Owner => Some(tokens["owner"].clone()),
                    Who::Stranger => Some(tokens["stranger"].clone()),
                    Who::Publisher => Some(tokens["publisher"].clone()),
                };
                // The admin passes everywhere: it works on an environment that does not exist,
                // so that what it may do (delete) leaves `a` for the others.
                let env = if who == Who::Admin { "absent" } else { "a" };
                let concrete = path
                    .replace("{env}", env)
                    .replace("{version}", "999")
                    .replace("{other}", "998")
                    .replace("{id}", "00000000-0000-4000-8000-00000000abcd")
                    .replace("{name}", "absent")
                    .replace("{service}", "absent")
                    .replace("{action}", "start")
                    .replace("{node}", "absent")
                    .replace("{user}", "absent");
                let resp = call(
                    &host,
                    token.as_deref(),
                    Method::from_bytes(method_upper.as_bytes()).unwrap(),
                    &concrete,
                    None,
                )
                .await;
                let status = resp.status();
                tried += 1;
                if who.passes(rule) {
                    assert!(
                        status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
                        "{who:?} may {method_upper} {path} ({rule}) but got {status}: {}",
                        resp.text().await.unwrap_or_default()
                    );
                    continue;
                }
                let (status, body) = json_of(resp).await;
                if matches!(who, Who::Nobody | Who::BadToken) {
                    assert_eq!(status, StatusCode::UNAUTHORIZED, "{who:?} {method_upper} {path}: {body}");
                    assert_eq!(body["code"], "unauthorized");
                } else {
                    assert_eq!(status, StatusCode::FORBIDDEN, "{who:?} {method_upper} {path} ({rule}): {body}");
                    assert_eq!(body["code"], "forbidden");
                    let named = if *rule == "signed" { "" } else { rule };
                    assert!(
                        body["message"].as_str().unwrap().contains(&format!("`{named}`")),
                        "{who:?} {method_upper} {path}: {body}"
                    );
                }
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "routes of the document this test has no expectation for: {unlisted:?}"
    );
    assert!(tried >= EXPECTED.len() * Who::ALL.len(), "tried {tried}");
    host.stop().await;
}

/// A member of one environment sees nothing of another: not its resources, not its events,
/// not its private nodes, not even in listings.
pub async fn a_member_sees_nothing_of_another_environment(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let tokens = callers(&host).await;
    let viewer = tokens["viewer"].as_str();
    let (status, list) = json_of(call(&host, Some(viewer), Method::GET, "/environments", None).await).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a"], "{list}");
    let (_, b) = host.get("/environments/b").await;
    let b_id = b["id"].as_str().unwrap();
    for path in [
        "/environments/b/resources".to_string(),
        format!("/environments/{b_id}/resources"),
        "/environments/b/events".to_string(),
        "/environments/b/nodes".to_string(),
        "/environments/b/actions".to_string(),
    ] {
        let (status, body) = json_of(call(&host, Some(viewer), Method::GET, &path, None).await).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert!(body["message"].as_str().unwrap().contains("`viewer`"), "{body}");
    }
    // A node private to `b` is in `b`'s list and not in `a`'s.
    let (status, node) = host
        .post(
            "/nodes",
            &json!({"name": "box", "address": "127.0.0.1", "port": 1, "user": "x", "credential": {"password": "pw"}, "environment": "b"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{node}");
    let (_, a_nodes) = json_of(call(&host, Some(viewer), Method::GET, "/environments/a/nodes", None).await).await;
    assert!(!a_nodes.to_string().contains("\"box\""), "{a_nodes}");
    let (_, b_nodes) = json_of(call(&host, Some(&tokens["stranger"]), Method::GET, "/environments/b/nodes", None).await).await;
    assert!(b_nodes.to_string().contains("\"box\""), "{b_nodes}");
    // `a`'s owner cannot claim `b`'s node; `b`'s owner releases it and then `a`'s owner claims it.
    let claim = call(&host, Some(&tokens["owner"]), Method::PUT, "/environments/a/nodes/box", None).await;
    let (status, body) = json_of(claim).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("node_not_claimable")),
        "{body}"
    );
    let release = call(&host, Some(&tokens["stranger"]), Method::DELETE, "/environments/b/nodes/box", None).await;
    assert_eq!(release.status(), StatusCode::OK);
    let claim = call(&host, Some(&tokens["owner"]), Method::PUT, "/environments/a/nodes/box", None).await;
    let (status, body) = json_of(claim).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["environment_name"], "a", "{body}");
    host.stop().await;
}

/// A publisher uploads plugins but cannot deploy; a viewer cannot upload.
pub async fn a_publisher_uploads_but_cannot_deploy(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let tokens = callers(&host).await;
    let registry = format!("{}/registry", host.base.trim_end_matches("/api/v1"));
    let plugin = orc_plugin_artifacts::MISBEHAVE.bytes;
    let client = || orc_registry::Registry::open(&registry).unwrap();
    let err = client().with_token(Some(&tokens["viewer"])).publish(plugin).await.unwrap_err();
    assert!(err.to_string().contains("publisher"), "{err}");
    let published = client().with_token(Some(&tokens["publisher"])).publish(plugin).await.unwrap();
    assert!(published.created);
    for path in ["/environments/a/deploy", "/environments"] {
        let (status, body) = json_of(call(&host, Some(&tokens["publisher"]), Method::POST, path, Some(&json!({"name": "c"}))).await).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
    }
    host.stop().await;
}

/// Revoking a token, disabling or deleting its user, or taking its role away fails it at once,
/// also on an event stream it holds open.
pub async fn revoked_tokens_and_disabled_users_fail_at_once_even_on_an_open_stream(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let tokens = callers(&host).await;
    let viewer = tokens["viewer"].clone();
    // Each way of losing access, with a stream open before it.
    let (_, listed) = json_of(call(&host, Some(&viewer), Method::GET, "/tokens", None).await).await;
    let viewer_token_id = listed["items"][0]["id"].as_str().unwrap().to_string();
    let cases: [(&str, Method, String, Option<Value>); 3] = [
        ("role taken away", Method::DELETE, "/environments/a/members/viewer".into(), None),
        ("token revoked", Method::DELETE, format!("/tokens/{viewer_token_id}"), None),
        (
            "user disabled",
            Method::PATCH,
            "/users/viewer".into(),
            Some(json!({"disabled": true})),
        ),
    ];
    for (what, method, path, body) in cases {
        // A fresh token (and role) for each case.
        grant(&host, "a", "viewer", "viewer").await;
        let (_, fresh) = host.post("/users/viewer/tokens", &json!({})).await;
        let token = if what == "token revoked" {
            viewer.clone()
        } else {
            fresh["token"].as_str().unwrap().to_string()
        };
        let stream = call(&host, Some(&token), Method::GET, "/environments/a/events", None).await;
        assert_eq!(stream.status(), StatusCode::OK, "{what}");
        let mut events = stream.bytes_stream();
        let (status, answer) = json_of(call(&host, Some(&host.token), method, &path, body.as_ref()).await).await;
        assert!(status.is_success(), "{what}: {status} {answer}");
        // The stream ends (its body completes) promptly; keep-alives are 15 s apart.
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(chunk) = events.next().await {
                if chunk.is_err() {
                    break;
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "{what}: the event stream stayed open");
        let (status, body) = json_of(call(&host, Some(&token), Method::GET, "/environments/a/resources", None).await).await;
        assert!(
            matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN),
            "{what}: {status} {body}"
        );
        if what == "user disabled" {
            let (status, _) = host
                .send(Method::PATCH, "/users/viewer", Some(br#"{"disabled": false}"#.to_vec()))
                .await;
            assert_eq!(status, StatusCode::OK);
        }
    }
    // Deleting a user deletes its tokens.
    let (status, _) = host.send(Method::DELETE, "/users/operator", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let resp = call(&host, Some(&tokens["operator"]), Method::GET, "/me", None).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    host.stop().await;
}

/// Signing in with a password answers a token; a wrong password, an unknown name and a
/// disabled user get the same answer; the password is never answered and not stored in clear.
pub async fn passwords_sign_in_and_are_never_answered_or_stored(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let password = "a long and secret passphrase 7";
    let (status, user) = host.post("/users", &json!({"name": "ann", "password": password})).await;
    assert_eq!(status, StatusCode::CREATED, "{user}");
    assert!(!user.to_string().contains(password) && user["has_password"] == true, "{user}");
    let (status, short) = host.post("/users", &json!({"name": "bob", "password": "short"})).await;
    assert_eq!(
        (status, short["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_password")),
        "{short}"
    );

    let login = async |name: &str, password: &str| {
        let body = json!({"name": name, "password": password});
        call(&host, None, Method::POST, "/login", Some(&body)).await
    };
    let (status, token) = json_of(login("ann", password).await).await;
    assert_eq!(status, StatusCode::CREATED, "{token}");
    let (status, me) = json_of(call(&host, token["token"].as_str(), Method::GET, "/me", None).await).await;
    assert_eq!((status, me["user"].as_str()), (StatusCode::OK, Some("ann")), "{me}");
    let mut refusals = Vec::new();
    for (name, pw) in [("ann", "a long and secret passphrase 8"), ("nobody", password), ("ann", "")] {
        refusals.push(json_of(login(name, pw).await).await);
    }
    let (status, _) = host
        .send(Method::PATCH, "/users/ann", Some(br#"{"disabled": true}"#.to_vec()))
        .await;
    assert_eq!(status, StatusCode::OK);
    refusals.push(json_of(login("ann", password).await).await);
    for (status, body) in &refusals {
        assert_eq!(*status, StatusCode::UNAUTHORIZED, "{body}");
        assert_eq!(body, &refusals[0].1, "every refusal says the same");
    }
    let (_, users) = host.get("/users").await;
    assert!(!users.to_string().contains(password), "{users}");
    assert!(!users.to_string().contains("argon2"), "{users}");
    // Not in clear in the store (SQLite's file and its write-ahead log).
    if backend == Backend::Sqlite {
        for file in ["orc.db", "orc.db-wal"] {
            let bytes = std::fs::read(host.data.path().join(file)).unwrap_or_default();
            assert!(
                !bytes.windows(password.len()).any(|w| w == password.as_bytes()),
                "{file} holds the password"
            );
        }
    }
    host.stop().await;
}

/// Tokens carry their user's roles or a narrower set; a wider one is refused by name; listing
/// shows which.
pub async fn a_token_carries_its_users_roles_or_a_narrower_set(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let tokens = callers(&host).await;
    let owner = tokens["owner"].as_str();
    let scoped = json!({"description": "read only", "scope": {"environments": {"a": "viewer"}}});
    let (status, narrow) = json_of(call(&host, Some(owner), Method::POST, "/tokens", Some(&scoped)).await).await;
    assert_eq!(status, StatusCode::CREATED, "{narrow}");
    assert_eq!(narrow["scope"]["environments"]["a"], "viewer", "{narrow}");
    let narrow = narrow["token"].as_str().unwrap();
    let (status, body) = json_of(call(&host, Some(narrow), Method::POST, "/environments/a/halt", None).await).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body["message"].as_str().unwrap().contains("carries `viewer`"), "{body}");
    assert_eq!(
        call(&host, Some(narrow), Method::GET, "/environments/a", None).await.status(),
        StatusCode::OK
    );
    // Wider than the user: refused, naming what.
    for scope in [
        json!({"environments": {"b": "viewer"}}),
        json!({"admin": true}),
        json!({"environments": {"nowhere": "viewer"}}),
    ] {
        let (status, body) = json_of(call(&host, Some(owner), Method::POST, "/tokens", Some(&json!({"scope": scope}))).await).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_scope")),
            "{scope}: {body}"
        );
    }
    // A scoped token hands on no more than it carries: without a scope, its own; wider, refused.
    let (status, again) = json_of(call(&host, Some(narrow), Method::POST, "/tokens", Some(&json!({}))).await).await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_eq!(again["scope"]["environments"], json!({"a": "viewer"}), "{again}");
    let again = again["token"].as_str().unwrap();
    let (status, body) = json_of(call(&host, Some(again), Method::POST, "/environments/a/halt", None).await).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let wider = json!({"scope": {"environments": {"a": "operator"}}});
    let (status, body) = json_of(call(&host, Some(narrow), Method::POST, "/tokens", Some(&wider)).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_scope")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("`operator` in environment `a`, more than the token"),
        "{body}"
    );
    let (_, listed) = json_of(call(&host, Some(owner), Method::GET, "/tokens", None).await).await;
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "its own only: {listed}");
    assert!(items.iter().any(|t| t["scope"].is_null()) && items.iter().any(|t| t["scope"]["environments"]["a"] == "viewer"));
    // Another user's token is unknown to it.
    let (_, all) = host.get("/tokens").await;
    let foreign = all["items"].as_array().unwrap().iter().find(|t| t["user"] == "viewer").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, _) = json_of(call(&host, Some(owner), Method::DELETE, &format!("/tokens/{foreign}"), None).await).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    host.stop().await;
}

/// Each state-changing request is in the audit trail with its author and outcome; reads are not.
/// Intent versions, operations, dryruns and node changes name their author too.
pub async fn the_audit_trail_records_each_change_with_its_author(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let tokens = callers(&host).await;
    let operator = tokens["operator"].as_str();
    assert_eq!(
        call(&host, Some(operator), Method::POST, "/environments/a/halt", None)
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        call(
            &host,
            Some(operator),
            Method::POST,
            "/environments/a/intents",
            Some(&json!({"resources": []}))
        )
        .await
        .status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&host, None, Method::POST, "/environments/a/resume", None).await.status(),
        StatusCode::UNAUTHORIZED
    );
    let _ = call(&host, Some(operator), Method::GET, "/environments/a", None).await;
    let (status, page) = host.get("/audit?environment=a&limit=3").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let items = page["items"].as_array().unwrap();
    type Line<'a> = (Option<&'a str>, &'a str, &'a str, u64, Option<&'a str>);
    let summary: Vec<Line> = items
        .iter()
        .map(|e| {
            (
                e["user"].as_str(),
                e["method"].as_str().unwrap(),
                e["route"].as_str().unwrap(),
                e["status"].as_u64().unwrap(),
                e["code"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (None, "POST", "/environments/{env}/resume", 401, Some("unauthorized")),
            (Some("operator"), "POST", "/environments/{env}/intents", 403, Some("forbidden")),
            (Some("operator"), "POST", "/environments/{env}/halt", 200, None),
        ],
        "{page}"
    );
    assert!(items[2]["token_id"].is_string(), "{page}");
    // Filters and pages.
    let (_, failed) = host.get("/audit?user=operator&failed=true").await;
    assert_eq!(failed["items"].as_array().unwrap().len(), 1, "{failed}");
    let (_, first) = host.get("/audit?limit=1").await;
    let before = first["next_before"].as_str().unwrap();
    let (_, second) = host.get(&format!("/audit?limit=1&before={before}")).await;
    assert_ne!(first["items"][0]["id"], second["items"][0]["id"]);
    let denied = call(&host, Some(operator), Method::GET, "/audit", None).await;
    assert_eq!(denied.status(), StatusCode::FORBIDDEN);

    // Versions, operations, dryruns and node changes show their author.
    let owner = tokens["owner"].as_str();
    let (status, body) = json_of(
        call(
            &host,
            Some(owner),
            Method::POST,
            "/environments/a/intents",
            Some(&json!({"resources": []})),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, version) = host.get(&format!("/environments/a/intents/{}", body["version"])).await;
    assert_eq!(version["author"], "owner", "{version}");
    let (_, listed) = host.get("/environments/a/intents").await;
    assert_eq!(listed["items"][0]["author"], "owner", "{listed}");
    let (status, op) = json_of(call(&host, Some(operator), Method::POST, "/environments/a/repair", None).await).await;
    assert_eq!((status, op["author"].as_str()), (StatusCode::ACCEPTED, Some("operator")), "{op}");
    let (_, op) = host
        .get(&format!("/environments/a/operations/{}", op["id"].as_str().unwrap()))
        .await;
    assert_eq!(op["author"], "operator", "{op}");
    let (status, dryrun) = json_of(call(&host, Some(operator), Method::POST, "/environments/a/dryrun", None).await).await;
    assert_eq!(
        (status, dryrun["author"].as_str()),
        (StatusCode::ACCEPTED, Some("operator")),
        "{dryrun}"
    );
    let (_, dryruns) = host.get("/environments/a/dryruns").await;
    assert_eq!(dryruns["items"][0]["author"], "operator", "{dryruns}");
    let node = json!({"name": "box", "address": "127.0.0.1", "port": 1, "user": "x", "credential": {"password": "pw"}});
    let (status, node) = host.post("/nodes", &node).await;
    assert_eq!(
        (status, node["changed_by"].as_str()),
        (StatusCode::CREATED, Some("admin")),
        "{node}"
    );
    let (status, node) = json_of(call(&host, Some(owner), Method::PUT, "/environments/a/nodes/box", None).await).await;
    assert_eq!((status, node["changed_by"].as_str()), (StatusCode::OK, Some("owner")), "{node}");
    host.stop().await;
}

/// Limits against a noisy tenant answer 413 or 429 with `Retry-After`, and lose nothing
/// already accepted: resources per intent, versions per hour, concurrent dryruns, an
/// environment's body size, and a token's request rate (another token is not slowed).
pub async fn limits_answer_413_and_429_and_lose_nothing_accepted(backend: Backend) {
    let data = super::Data::fresh(backend).await;
    let host = Host::start_configured(data, None, |config| {
        config.token_requests_per_s = 2;
        config.token_burst = 40;
    })
    .await;
    let adaptor = host.publish_misbehave().await;
    let limits = json!({"max_resources_per_intent": 2, "versions_per_hour": 2, "concurrent_dryruns": 1, "max_body_bytes": 2048});
    let everything = json!({ "node_files": true, "node_commands": true, "http": true, "kv": true });
    let (status, env) = host
        .post(
            "/environments",
            &json!({"name": "lim", "settings": {"limits": limits, "capabilities": everything}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{env}");
    let slow = |n: usize| {
        let resources: Vec<Value> = (0..n)
            .map(|i| json!({"id": format!("misbehave[local,r{i}]"), "adaptor": adaptor.clone(), "attributes": {"behave": "slow", "ms": 3000}}))
            .collect();
        json!({ "resources": resources })
    };

    let (status, body) = host.post("/environments/lim/intents", &slow(3)).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("too_many_resources")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("limits.max_resources_per_intent"),
        "{body}"
    );
    for _ in 0..2 {
        let (status, body) = host.post("/environments/lim/intents", &slow(1)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let third = call(&host, Some(&host.token), Method::POST, "/environments/lim/intents", Some(&slow(1))).await;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = third.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=3600).contains(&retry), "{retry}");
    let (_, body) = json_of(third).await;
    assert!(body["message"].as_str().unwrap().contains("limits.versions_per_hour"), "{body}");
    // A body over the environment's limit, declared or not.
    let big = json!({"resources": [], "padding": "x".repeat(4096)});
    let (status, body) = host.post("/environments/lim/intents", &big).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("too_large")),
        "{body}"
    );
    let chunked = reqwest::Body::wrap_stream(futures::stream::iter(vec![Ok::<_, std::io::Error>(big.to_string().into_bytes())]));
    let resp = host
        .client
        .post(format!("{}/environments/lim/intents", host.base))
        .bearer_auth(&host.token)
        .header("content-type", "application/json")
        .body(chunked)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Nothing accepted was lost.
    let (_, versions) = host.get("/environments/lim/intents").await;
    assert_eq!(versions["items"].as_array().unwrap().len(), 2, "{versions}");

    // One dryrun at a time: the first reads for 3 s.
    let first = call(&host, Some(&host.token), Method::POST, "/environments/lim/dryrun", None).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let second = call(&host, Some(&host.token), Method::POST, "/environments/lim/dryrun", None).await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(second.headers().contains_key("retry-after"));
    let (_, first) = json_of(first).await;
    let id = first["id"].as_str().unwrap();
    wait_for("the dryrun to finish", Duration::from_secs(60), async || {
        let (_, report) = host.get(&format!("/environments/lim/dryruns/{id}")).await;
        if report["status"] != "running" { Ok(()) } else { Err(report) }
    })
    .await;
    let third = call(&host, Some(&host.token), Method::POST, "/environments/lim/dryrun", None).await;
    assert_eq!(third.status(), StatusCode::ACCEPTED, "a finished dryrun frees its slot");

    // A token past its rate (2/s, 40 at once) is answered 429; another token is not.
    let other = user_with_token(&host, "calm", json!({})).await;
    let mut limited = None;
    for _ in 0..200 {
        let resp = call(&host, Some(&host.token), Method::GET, "/me", None).await;
        if resp.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(resp);
            break;
        }
    }
    let limited = limited.expect("the token was never limited");
    assert!(limited.headers().contains_key("retry-after"));
    let (_, body) = json_of(limited).await;
    assert_eq!(body["code"], "rate_limited", "{body}");
    assert_eq!(call(&host, Some(&other), Method::GET, "/me", None).await.status(), StatusCode::OK);
    host.stop().await;
}

/// The trail is written in batches behind the answers: every change of a concurrent burst is in
/// it at once for whoever reads it, and a host shut down right after the burst (nobody having
/// read it) has written every entry before it stopped.
pub async fn a_burst_of_changes_is_audited_whole_and_kept_across_a_restart(backend: Backend) {
    async fn burst(host: &Host) -> Vec<reqwest::Response> {
        let requests = (0..40).map(|i| {
            let path = if i % 2 == 0 {
                "/environments/a/halt"
            } else {
                "/environments/a/resume"
            };
            call(host, Some(&host.token), Method::POST, path, None)
        });
        futures::future::join_all(requests).await
    }
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("a").await;
    assert!(burst(&host).await.iter().all(|r| r.status() == StatusCode::OK));
    let audited = |page: &Value| -> Vec<String> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["route"] == "/environments/{env}/halt" || e["route"] == "/environments/{env}/resume")
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect()
    };
    let (status, page) = host.get("/audit?environment=a&limit=500").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(audited(&page).len(), 40, "{page}");

    assert!(burst(&host).await.iter().all(|r| r.status() == StatusCode::OK));
    let token = host.token.clone();
    let data = host.stop().await;
    let host = Host::start_with(data, 1 << 20, Some(token)).await;
    let (_, page) = host.get("/audit?environment=a&limit=500").await;
    let ids = audited(&page);
    assert_eq!(ids.len(), 80, "{page}");
    assert_eq!(
        ids.iter().collect::<std::collections::BTreeSet<_>>().len(),
        80,
        "ids are distinct: {page}"
    );
    host.stop().await;
}

/// A NUL character in a name from a path, a query or a sign-in (which PostgreSQL's text cannot
/// hold) is an unknown name — 401, 403 or 404 — never a 500, and the refused request still
/// reaches the audit trail.
pub async fn nul_in_names_is_unknown_and_still_audited(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let tokens = callers(&host).await;
    for (path, want) in [
        ("/users/a%00b", StatusCode::NOT_FOUND),
        ("/environments/a%00b", StatusCode::NOT_FOUND),
    ] {
        let (status, body) = host.get(path).await;
        assert_eq!(status, want, "{path}: {body}");
    }
    let (status, body) = json_of(call(&host, Some(&tokens["viewer"]), Method::GET, "/environments/a%00b/resources", None).await).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let login = json!({"name": "viewer\u{0}", "password": "a long and secret passphrase 7"});
    let (status, body) = json_of(call(&host, None, Method::POST, "/login", Some(&login)).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("invalid_credentials")),
        "{body}"
    );
    let refused = call(&host, None, Method::POST, "/environments/x%00y/halt", None).await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let (status, page) = host.get("/audit?environment=x%00y").await;
    assert_eq!(
        (status, page["items"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(0)),
        "{page}"
    );
    let (_, page) = host.get("/audit?limit=1").await;
    assert_eq!(page["items"][0]["environment"], "x\u{FFFD}y", "{page}");
    host.stop().await;
}

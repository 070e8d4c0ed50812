//! `http-object` against a real HTTP server (axum on 127.0.0.1:0) that keeps JSON objects,
//! adds fields of its own (`id`, `revision`), requires a bearer token and logs every request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use orc_host::executor::Outcome;
use orc_host::scheduler::{self, ResourceStatus as Status, Trigger};
use orc_runtime::CallContext;
use orc_runtime::capability::{AddressPolicy, BoundSecret, HttpAccess, HttpPolicy, Origin};
use serde_json::{Value, json};

use super::{Harness, self_healing, until};

const TOKEN: &str = "Bearer s3cret-7f1c";

#[derive(Default)]
struct Api {
    objects: Mutex<HashMap<String, Value>>,
    /// (method, path, Authorization header) of every request.
    log: Mutex<Vec<(String, String, Option<String>)>>,
    revision: Mutex<u64>,
}

type Shared = State<Arc<Api>>;

fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, "missing or wrong token").into_response()
}

impl Api {
    /// Logs the request; whether it carries the right token.
    fn admit(&self, method: Method, path: String, headers: &HeaderMap) -> bool {
        let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
        let ok = auth.as_deref() == Some(TOKEN);
        self.log.lock().unwrap().push((method.to_string(), path, auth));
        ok
    }

    fn store(&self, name: &str, mut body: Value) -> Value {
        let mut revision = self.revision.lock().unwrap();
        *revision += 1;
        body["id"] = json!(name);
        body["revision"] = json!(*revision);
        self.objects.lock().unwrap().insert(name.to_string(), body.clone());
        body
    }

    fn object(&self, name: &str) -> Option<Value> {
        self.objects.lock().unwrap().get(name).cloned()
    }
}

async fn read_object(State(api): Shared, Path(name): Path<String>, headers: HeaderMap) -> Response {
    if !api.admit(Method::GET, format!("/objects/{name}"), &headers) {
        return unauthorized();
    }
    match api.object(&name) {
        Some(object) => Json(object).into_response(),
        None => (StatusCode::NOT_FOUND, "no such object").into_response(),
    }
}

async fn put_object(State(api): Shared, Path(name): Path<String>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    if !api.admit(Method::PUT, format!("/objects/{name}"), &headers) {
        return unauthorized();
    }
    Json(api.store(&name, body)).into_response()
}

async fn delete_object(State(api): Shared, Path(name): Path<String>, headers: HeaderMap) -> Response {
    if !api.admit(Method::DELETE, format!("/objects/{name}"), &headers) {
        return unauthorized();
    }
    match api.objects.lock().unwrap().remove(&name) {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `PATCH /objects/<name>`: a JSON merge patch (RFC 7396).
async fn patch_object(State(api): Shared, Path(name): Path<String>, headers: HeaderMap, Json(patch): Json<Value>) -> Response {
    if !api.admit(Method::PATCH, format!("/objects/{name}"), &headers) {
        return unauthorized();
    }
    let Some(mut object) = api.object(&name) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    merge(&mut object, patch);
    Json(api.store(&name, object)).into_response()
}

fn merge(target: &mut Value, patch: Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            for (k, v) in fields {
                if v.is_null() {
                    target.as_object_mut().unwrap().remove(&k);
                } else {
                    merge(&mut target[k.as_str()], v);
                }
            }
        }
        other => *target = other,
    }
}

/// `POST /objects`: the server places the object at `/objects/<name>`.
async fn create_object(State(api): Shared, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    if !api.admit(Method::POST, "/objects".into(), &headers) {
        return unauthorized();
    }
    let Some(name) = body["name"].as_str().map(str::to_string) else {
        return (StatusCode::BAD_REQUEST, "name is required").into_response();
    };
    (StatusCode::CREATED, Json(api.store(&name, body))).into_response()
}

async fn serve() -> (Arc<Api>, u16) {
    let api = Arc::new(Api::default());
    let app = Router::new()
        .route("/objects", post(create_object))
        .route(
            "/objects/{name}",
            get(read_object).put(put_object).patch(patch_object).delete(delete_object),
        )
        .with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (api, port)
}

fn object(name: &str, attributes: Value) -> Value {
    json!({ "id": format!("http-object[api,{name}]"), "adaptor": "http-object@0.1.0", "attributes": attributes })
}

#[tokio::test(flavor = "multi_thread")]
async fn objects_converge_repair_drift_and_are_deleted_with_a_host_held_secret() {
    let (api, port) = serve().await;
    let base = format!("http://127.0.0.1:{port}");
    let policy = HttpPolicy {
        allowed: vec![Origin::parse(&base).unwrap()],
        addresses: AddressPolicy::Networks(vec!["127.0.0.1/32".parse().unwrap()]),
        secrets: HashMap::from([(
            "api-token".to_string(),
            BoundSecret {
                value: TOKEN.to_string(),
                origins: vec![Origin::parse(&base).unwrap()],
            },
        )]),
        // The test's API is plain HTTP on loopback.
        secrets_over_plain_http: true,
        ..HttpPolicy::default()
    };
    let h = Harness::new(CallContext {
        http: Arc::new(HttpAccess::new(policy).unwrap()),
        ..CallContext::new("test")
    });
    let s = h.scheduler(self_healing(Duration::from_millis(200)));
    let url = |name: &str| format!("{base}/objects/{name}");
    let a = object(
        "a",
        json!({"url": url("a"), "body": {"name": "a", "size": 1, "tags": ["x"]}, "secret": "api-token"}),
    );
    let b = object(
        "b",
        json!({"url": url("b"), "body": {"name": "b", "size": 2}, "secret": "api-token"}),
    );
    let c = object(
        "c",
        json!({"url": url("c"), "body": {"name": "c", "size": 3}, "secret": "api-token",
               "create": {"method": "POST", "url": format!("{base}/objects")}}),
    );
    // Refused by the host before any request: a secret the environment lacks, an origin it
    // does not grant.
    let no_secret = object("d", json!({"url": url("d"), "body": {"name": "d"}, "secret": "other-token"}));
    let elsewhere = object("e", json!({"url": "http://127.0.0.1:9/objects/e", "body": {"name": "e"}}));

    // Updated by merge patch, comparing one nested field only.
    let p = object(
        "p",
        json!({"url": url("p"), "body": {"name": "p", "spec": {"replicas": 2, "note": "ours"}}, "secret": "api-token",
               "compare": ["/spec/replicas"], "update": "PATCH"}),
    );
    let v1 = json!([a, b, c, p, no_secret, elsewhere]);
    s.release(h.version(1, v1.clone())).unwrap();
    let snap = s.settled().await.unwrap();
    assert_eq!((snap.count(Status::Deployed), snap.count(Status::Failed)), (4, 2), "{snap:?}");
    for (name, size) in [("a", 1), ("b", 2), ("c", 3)] {
        let stored = api.object(name).unwrap_or_else(|| panic!("{name} was created"));
        assert_eq!((stored["name"].clone(), stored["size"].clone()), (json!(name), json!(size)));
    }
    assert_eq!(api.object("a").unwrap()["tags"], json!(["x"]));
    let report = h.recorder.last_deploy("http-object[api,c]");
    assert!(
        report.messages.iter().any(|m| m.contains(&format!("(POST {base}/objects: 201)"))),
        "{:?}",
        report.messages
    );
    let d = h.recorder.last_deploy("http-object[api,d]").error.unwrap();
    assert!(
        d.message.contains("secret `other-token` is not defined for this environment"),
        "{d:?}"
    );
    let e = h.recorder.last_deploy("http-object[api,e]").error.unwrap();
    assert!(e.message.contains("outgoing HTTP to http://127.0.0.1:9 is not allowed"), "{e:?}");
    assert!(!api.log.lock().unwrap().iter().any(|(_, path, _)| path.ends_with("/d")));

    // A second pass (a user repair, then self-healing) changes nothing, though the server's own
    // fields (`revision`) moved on.
    let revision_a = api.object("a").unwrap()["revision"].clone();
    s.repair().unwrap();
    until(&s, "repair passes", || {
        ["a", "b", "c", "p"].iter().all(|n| {
            h.recorder
                .count(&format!("http-object[api,{n}]"), Trigger::Repair, Outcome::Unchanged)
                >= 2
        })
    })
    .await;
    for n in ["a", "b", "c", "p"] {
        assert_eq!(
            h.recorder
                .count(&format!("http-object[api,{n}]"), Trigger::Repair, Outcome::Changed),
            0,
            "{n}"
        );
    }
    assert_eq!(api.object("a").unwrap()["revision"], revision_a);

    // Drift on the server while the environment is halted: a dryrun shows the field, and
    // self-healing puts it back once the environment resumes.
    s.set_halted(true).unwrap();
    s.settled().await.unwrap();
    let version = h.version(2, v1.clone());
    api.store("a", json!({"name": "a", "size": 99, "tags": ["x"]}));
    api.store("p", json!({"name": "p", "spec": {"replicas": 5, "note": "theirs"}}));
    let dry = scheduler::dryrun(&version, &h.ctx, 2).await;
    let dry_a = dry.iter().find(|r| r.resource == "http-object[api,a]").unwrap();
    assert_eq!(dry_a.outcome, Outcome::WouldChange);
    let changes: Vec<_> = dry_a
        .changes
        .iter()
        .map(|c| (c.field.as_str(), c.current.clone(), c.desired.clone()))
        .collect();
    assert_eq!(changes, [("size", Some(json!(99)), Some(json!(1)))]);
    let dry_p = dry.iter().find(|r| r.resource == "http-object[api,p]").unwrap();
    let changes: Vec<_> = dry_p
        .changes
        .iter()
        .map(|c| (c.field.as_str(), c.current.clone(), c.desired.clone()))
        .collect();
    assert_eq!(changes, [("/spec/replicas", Some(json!(5)), Some(json!(2)))]);
    assert_eq!(api.object("a").unwrap()["size"], json!(99), "a dryrun changes nothing");
    s.set_halted(false).unwrap();
    until(&s, "self-healing", || {
        api.object("a").unwrap()["size"] == json!(1) && api.object("p").unwrap()["spec"]["replicas"] == json!(2)
    })
    .await;
    assert_eq!(h.recorder.count("http-object[api,a]", Trigger::Repair, Outcome::Changed), 1);
    // The patch carried the compared field only: the server's note stays.
    assert_eq!(api.object("p").unwrap()["spec"], json!({"replicas": 2, "note": "theirs"}));
    assert!(
        api.log
            .lock()
            .unwrap()
            .iter()
            .any(|(m, path, _)| m == "PATCH" && path == "/objects/p")
    );

    // Purge deletes; a purged object already gone is no change.
    let mut purged_c = c.clone();
    purged_c["purged"] = json!(true);
    s.release(h.version(3, json!([a, b, purged_c, p]))).unwrap();
    s.settled().await.unwrap();
    assert_eq!(api.object("c"), None);
    assert!(api.object("a").is_some() && api.object("b").is_some());
    let report = h.recorder.last_deploy("http-object[api,c]");
    assert_eq!(report.outcome, Outcome::Changed);
    assert!(
        report.messages.iter().any(|m| m == &format!("deleted {} (204)", url("c"))),
        "{:?}",
        report.messages
    );

    // Every request the server saw carried the secret, which the host injected: it appears in
    // no report, change or plugin log line.
    let log = api.log.lock().unwrap().clone();
    assert!(log.len() >= 10, "{log:?}");
    assert!(log.iter().all(|(_, _, auth)| auth.as_deref() == Some(TOKEN)), "{log:?}");
    assert!(!h.recorder.all_reports_text().contains("s3cret"));
}

//! The API keeps its word: every error answer is JSON `{code, message}` — also a request head
//! over the limits (414, 431; checked with a raw TCP client, below any HTTP library) and a body
//! that is not JSON (415) —, bounded parameters are refused outside their range rather than
//! clamped, an optional body may be `null`, and the OpenAPI document lists the errors every
//! operation can answer. Regression tests of what schemathesis (`.ci/schemathesis`) found sit
//! here too.

use orc_host::store::Backend;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Host, QUICKSTART, assert_error};

/// What a raw HTTP/1.1 exchange answered: the status, the headers (names lowercase) and the body.
struct RawAnswer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawAnswer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        assert_eq!(self.header("content-type"), Some("application/json"), "{:?}", self.headers);
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

impl Host {
    fn addr(&self) -> String {
        self.base.trim_start_matches("http://").trim_end_matches("/api/v1").to_string()
    }

    /// Sends `head` (the request line and header fields, without the blank line) and an empty
    /// body over a fresh TCP connection, and reads the answer until the server closes it.
    async fn raw(&self, head: &str) -> RawAnswer {
        let stream = tokio::net::TcpStream::connect(self.addr()).await.unwrap();
        let (mut reader, mut writer) = stream.into_split();
        let request = format!("{head}\r\nconnection: close\r\n\r\n");
        let mut answer = Vec::new();
        // Written while the answer is read: the server may answer and close before it has read
        // all of a head it refuses (then the write fails, and what was answered is kept).
        let _ = tokio::join!(writer.write_all(request.as_bytes()), reader.read_to_end(&mut answer));
        let end = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no complete answer: {}", String::from_utf8_lossy(&answer)));
        let text = String::from_utf8(answer[..end].to_vec()).unwrap();
        let mut lines = text.split("\r\n");
        let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
        let headers = lines
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.trim().to_ascii_lowercase(), v.trim().to_string())
            })
            .collect();
        RawAnswer {
            status,
            headers,
            body: answer[end + 4..].to_vec(),
        }
    }

    /// A request with a body and the `Content-Type` given (none if `None`).
    async fn with_content_type(&self, method: Method, path: &str, content_type: Option<&str>, body: &str) -> (StatusCode, Value) {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .body(body.to_string());
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let resp = request.send().await.unwrap();
        let status = resp.status();
        let bytes = resp.bytes().await.unwrap();
        let value =
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
        (status, value)
    }
}

/// 414 and 431 are JSON up to hyper's own limits; past them hyper answers alone, with a bare
/// status (docs/api.md says so). A head within the limits is served as usual.
pub async fn request_heads_over_the_limits_are_refused_in_json(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let auth = format!("authorization: Bearer {}", host.token);
    let ok = host.raw(&format!("GET /api/v1/environments HTTP/1.1\r\nhost: x\r\n{auth}")).await;
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));

    // A URI of 40,000 bytes: ours to refuse, before the token is even looked at.
    let long = format!("/api/v1/environments?text={}", "a".repeat(40_000));
    let answer = host.raw(&format!("GET {long} HTTP/1.1\r\nhost: x")).await;
    assert_eq!(answer.status, 414);
    assert_eq!(answer.header("connection"), Some("close"));
    let body = answer.json();
    assert_eq!(body["code"], "uri_too_long", "{body}");
    assert!(body["message"].as_str().unwrap().contains("32768"), "{body}");

    // A header block of 70,000 bytes in one field, and one of 150 small fields.
    let big = format!("x-big: {}", "b".repeat(70_000));
    let answer = host
        .raw(&format!("GET /api/v1/environments HTTP/1.1\r\nhost: x\r\n{auth}\r\n{big}"))
        .await;
    assert_eq!(answer.status, 431);
    assert_eq!(answer.json()["code"], "headers_too_large");
    let many: Vec<String> = (0..150).map(|i| format!("x-h{i}: {i}")).collect();
    let answer = host
        .raw(&format!("GET /api/v1/health HTTP/1.1\r\nhost: x\r\n{}", many.join("\r\n")))
        .await;
    assert_eq!(answer.status, 431);
    let body = answer.json();
    assert_eq!(body["code"], "headers_too_large", "{body}");
    assert!(body["message"].as_str().unwrap().contains("152 header fields"), "{body}");

    // Past hyper's own limits — a URI over 65,534 bytes, a head over 1 MiB, over 256 fields —
    // hyper answers before any of our code runs: the status, no body. Documented, not hidden.
    let past = format!("/api/v1/health?{}", "a".repeat(70_000));
    let answer = host.raw(&format!("GET {past} HTTP/1.1\r\nhost: x")).await;
    assert_eq!((answer.status, answer.body.len()), (414, 0));
    let huge = format!("x-big: {}", "b".repeat(1_100_000));
    let answer = host.raw(&format!("GET /api/v1/health HTTP/1.1\r\nhost: x\r\n{huge}")).await;
    assert_eq!((answer.status, answer.body.len()), (431, 0));
    let too_many: Vec<String> = (0..300).map(|i| format!("x-h{i}: {i}")).collect();
    let answer = host
        .raw(&format!("GET /api/v1/health HTTP/1.1\r\nhost: x\r\n{}", too_many.join("\r\n")))
        .await;
    assert_eq!((answer.status, answer.body.len()), (431, 0));

    // The server still serves.
    let (status, _) = host.get("/environments").await;
    assert_eq!(status, StatusCode::OK);
}

/// A body on an endpoint taking JSON must say it is JSON (415 otherwise); malformed JSON is
/// 400 `invalid_json` naming the problem; an optional body may be empty or `null`.
pub async fn bodies_must_be_json_and_an_optional_one_may_be_null(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let env = r#"{"name": "dev"}"#;
    for content_type in [None, Some("text/plain"), Some("application/x-www-form-urlencoded")] {
        let (status, body) = host.with_content_type(Method::POST, "/environments", content_type, env).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{content_type:?}: {body}");
        assert_eq!(body["code"], "unsupported_media_type", "{body}");
        assert!(body["message"].as_str().unwrap().contains("application/json"), "{body}");
    }
    let (status, body) = host
        .with_content_type(Method::POST, "/environments", Some("application/json; charset=utf-8"), env)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // Every kind of JSON body: decoded by the handler (an intent), a settings patch, a node.
    for (method, path) in [
        (Method::POST, "/environments/dev/intents"),
        (Method::PATCH, "/environments/dev"),
        (Method::POST, "/nodes"),
        (Method::POST, "/environments/dev/dryrun"),
    ] {
        let (status, body) = host.with_content_type(method.clone(), path, Some("text/plain"), "{}").await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{method} {path}: {body}");
    }
    assert_error(
        host.with_content_type(
            Method::POST,
            "/environments/dev/intents",
            Some("application/json"),
            "{\"resources\": [",
        )
        .await,
        StatusCode::BAD_REQUEST,
        "invalid_json",
        "EOF",
    );

    // A struct only from a JSON object: serde would also take an array of its fields (a
    // schemathesis seed found `{"scope": []}` accepted as an empty scope).
    for (method, path, body, words) in [
        (
            Method::POST,
            "/tokens",
            r#"{"scope": []}"#,
            "expected a JSON object or null, found an array",
        ),
        (Method::POST, "/tokens", "[]", "not an array"),
        (Method::POST, "/environments/dev/dryrun", "[]", "not an array"),
        (
            Method::POST,
            "/environments/dev/connections",
            r#"{"from": ["a", "b"], "to": ["c", "d"]}"#,
            "expected a JSON object",
        ),
    ] {
        assert_error(
            host.with_content_type(method, path, Some("application/json"), body).await,
            StatusCode::BAD_REQUEST,
            "invalid_json",
            words,
        );
    }

    // The dryrun's body is optional: none, empty JSON, `null` and `{}` all mean the latest
    // version (here: none submitted yet, 409), never a 400.
    for (content_type, body) in [
        (None, ""),
        (Some("application/json"), ""),
        (Some("application/json"), "null"),
        (Some("application/json"), "{}"),
    ] {
        let got = host
            .with_content_type(Method::POST, "/environments/dev/dryrun", content_type, body)
            .await;
        assert_error(got, StatusCode::CONFLICT, "no_version", "dev");
    }
    // Whitespace alone is a body, and not JSON (schemathesis sent a tab to `POST /tokens`).
    for path in ["/environments/dev/dryrun", "/tokens"] {
        let got = host.with_content_type(Method::POST, path, Some("application/json"), "\t ").await;
        assert_error(got, StatusCode::BAD_REQUEST, "invalid_json", "EOF");
    }
    let (status, _) = host.post_raw("/environments/dev/intents", QUICKSTART.as_bytes()).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = host
        .with_content_type(Method::POST, "/environments/dev/dryrun", Some("application/json"), "null")
        .await;
    assert_eq!((status, &body["version"]), (StatusCode::ACCEPTED, &json!(1)), "{body}");
    assert_error(
        host.with_content_type(
            Method::POST,
            "/environments/dev/dryrun",
            Some("application/json"),
            "{\"version\": \"one\"}",
        )
        .await,
        StatusCode::BAD_REQUEST,
        "invalid_json",
        "invalid type",
    );
}

/// `limit` is 1–10,000 as documented: outside, 400 naming it — never clamped to the range.
pub async fn bounded_query_parameters_are_refused_outside_their_range(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    host.create_environment("dev").await;
    for path in ["/environments/dev/resources", "/environments/dev/actions"] {
        for limit in ["0", "10001", "4294967295"] {
            assert_error(
                host.get(&format!("{path}?limit={limit}")).await,
                StatusCode::BAD_REQUEST,
                "invalid_query",
                "`limit`",
            );
        }
        assert_error(
            host.get(&format!("{path}?limit=-1")).await,
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "limit",
        );
        for limit in ["1", "10000"] {
            let (status, body) = host.get(&format!("{path}?limit={limit}")).await;
            assert_eq!(status, StatusCode::OK, "{path}?limit={limit}: {body}");
        }
    }
    // The document says the same.
    let (_, doc) = host.get("/openapi.json").await;
    let limit = doc["paths"]["/environments/{env}/resources"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap()
        .clone();
    assert_eq!(
        (&limit["schema"]["minimum"], &limit["schema"]["maximum"]),
        (&json!(1), &json!(10000)),
        "{limit}"
    );
}

/// Every operation that needs a token documents 401, every one that needs a role 403, every one with parameters or a body 400,
/// every one with a body 413 and 415 — each with the error schema — and the optional dryrun
/// body admits `null`, as the server does.
pub async fn the_document_lists_the_errors_each_operation_can_answer(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let (_, doc) = host.get("/openapi.json").await;
    let error = json!({ "$ref": "#/components/schemas/ErrorBody" });
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let open = op["security"].as_array().is_some_and(|s| s.iter().any(|r| r == &json!({})));
            let has_params = op["parameters"].as_array().is_some_and(|p| !p.is_empty());
            let has_body = op.get("requestBody").is_some();
            let mut expected = Vec::new();
            if !open {
                expected.push("401");
            }
            if has_params || has_body {
                expected.push("400");
            }
            if has_body {
                expected.extend(["413", "415"]);
            }
            for status in expected {
                let schema = &op["responses"][status]["content"]["application/json"]["schema"];
                assert_eq!(schema, &error, "{method} {path} does not document {status} with the error schema");
            }
            // The role it needs is said in its description; one that needs a role answers 403.
            let description = op["description"].as_str().unwrap_or_default();
            let needs_role = description.contains("role");
            assert!(
                open || description.contains("Needs any valid token") || needs_role,
                "{method} {path} does not say what it needs: {description}"
            );
            if needs_role {
                let schema = &op["responses"]["403"]["content"]["application/json"]["schema"];
                assert_eq!(schema, &error, "{method} {path} needs a role but does not document 403");
            } else {
                assert!(
                    op["responses"].get("403").is_none(),
                    "{method} {path}: needs no role, yet documents 403"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 40, "{checked} operations");
    let dryrun = &doc["paths"]["/environments/{env}/dryrun"]["post"]["requestBody"];
    assert_ne!(dryrun["required"], json!(true), "{dryrun}");
    let schema = &dryrun["content"]["application/json"]["schema"];
    let root = json!({ "$schema": "https://json-schema.org/draft/2020-12/schema", "components": doc["components"], "allOf": [schema] });
    let validator = jsonschema::validator_for(&root).unwrap();
    assert!(validator.is_valid(&Value::Null), "the dryrun body's schema refuses null: {schema}");
    assert!(validator.is_valid(&json!({ "version": 1 })), "{schema}");
}

/// Each path answers only the methods its document lists (schemathesis found `GET …/dryrun` and
/// `POST …/dryruns` served: two handlers of different paths registered as one route), and the
/// 405's `Allow` names exactly those.
pub async fn each_path_takes_only_its_documented_methods(backend: Backend) {
    let host = Host::start_limited(backend, 1 << 20).await;
    let (_, doc) = host.get("/openapi.json").await;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete = path
            .replace("{env}", "nope")
            .replace("{version}", "1")
            .replace("{other}", "2")
            .replace("{id}", "x")
            .replace("{name}", "n")
            .replace("{node}", "n")
            .replace("{service}", "s")
            .replace("{action}", "stop");
        let documented: Vec<String> = item.as_object().unwrap().keys().map(|m| m.to_uppercase()).collect();
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
            if documented.iter().any(|m| m == method) {
                continue;
            }
            let resp = host
                .client
                .request(method.parse().unwrap(), format!("{}{concrete}", host.base))
                .bearer_auth(&host.token)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            let mut allow: Vec<String> = resp.headers()["allow"]
                .to_str()
                .unwrap()
                .split(',')
                .map(|m| m.trim().to_string())
                .filter(|m| m != "HEAD")
                .collect();
            allow.sort();
            let mut expected = documented.clone();
            expected.sort();
            assert_eq!(allow, expected, "{method} {path}: Allow");
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body["code"], "method_not_allowed", "{method} {path}: {body}");
        }
    }
}

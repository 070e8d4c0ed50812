//! The `http-object` adaptor: a JSON object behind a REST URL.
//!
//! Resource type `http-object`. The node part of the id names the API (it is not contacted as a
//! node) and the key names the object, e.g. `http-object[billing,customers/acme]`. Attributes:
//! - `url` (string, required): where the object lives; `GET` reads it, `404`/`410` mean absent;
//! - `body` (JSON object, required): the desired object;
//! - `compare` (list of strings, optional): the fields compared, each a top-level key or a JSON
//!   pointer (`/spec/replicas`); default: the top-level keys of `body`. Fields the server adds
//!   (ids, timestamps) are thus ignored unless named;
//! - `secret` (string, optional): the name of a host-held secret sent as the `Authorization`
//!   header of every request; the plugin never sees its value;
//! - `create` (optional): `{"method": "PUT" | "POST", "url": "..."}`: how a missing object is
//!   made. Default `PUT` to `url` (create-or-replace); `POST` to a collection `url` when the
//!   server assigns the place (the object must then be found at `url`);
//! - `update` (optional): `"PUT"` (default, the whole `body`) or `"PATCH"` (only the differing
//!   compared fields, as a JSON merge patch);
//! - `headers` (object of strings, optional): extra request headers (not `Authorization`: use
//!   `secret`).
//!
//! Purge sends `DELETE` to `url`; a `404` there means already gone.
//!
//! Current state: the object as the server returns it. Changes: one per compared field that
//! differs, named as in `compare`.

use std::collections::BTreeMap;

use orc_sdk::http::{self, Request, Response};
use orc_sdk::{Adaptor, Change, Error, Result, ResultExt, Target};
use serde::Deserialize;
use serde_json::{Map, Value};

pub struct HttpObject;

orc_sdk::export!(adaptor: HttpObject);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum CreateMethod {
    #[default]
    Put,
    Post,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum UpdateMethod {
    #[default]
    Put,
    Patch,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Create {
    #[serde(default)]
    method: CreateMethod,
    #[serde(default)]
    url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Desired {
    url: String,
    body: Map<String, Value>,
    #[serde(default)]
    compare: Option<Vec<String>>,
    #[serde(default)]
    secret: Option<String>,
    #[serde(default)]
    create: Option<Create>,
    #[serde(default)]
    update: UpdateMethod,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// Where a request goes and how it is sent: URL, secret and extra headers, checked.
struct Endpoint<'a> {
    secret: Option<&'a str>,
    headers: &'a BTreeMap<String, String>,
}

impl Endpoint<'_> {
    fn request(&self, method: &str, url: &str) -> Request {
        let mut request = Request::new(method, url).header("accept", "application/json");
        for (k, v) in self.headers {
            request = request.header(k, v);
        }
        if let Some(secret) = self.secret {
            request = request.secret(secret);
        }
        request
    }
}

fn check_url(target: &Target, what: &str, url: &str) -> Result<()> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{}: `{what}` must be an http:// or https:// URL, got {url:?}",
            target.id
        )))
    }
}

impl Desired {
    fn validate(&self, target: &Target) -> Result<()> {
        check_url(target, "url", &self.url)?;
        if let Some(url) = self.create.as_ref().and_then(|c| c.url.as_deref()) {
            check_url(target, "create.url", url)?;
        }
        if let Some(compare) = &self.compare
            && let Some(bad) = compare.iter().find(|f| f.is_empty())
        {
            return Err(Error::invalid(format!("{}: `compare` has an empty field name {bad:?}", target.id)));
        }
        if self.headers.keys().any(|k| k.eq_ignore_ascii_case("authorization")) {
            return Err(Error::invalid(format!(
                "{}: `headers` may not set Authorization; name a host-held secret with `secret`",
                target.id
            )));
        }
        Ok(())
    }

    fn endpoint(&self) -> Endpoint<'_> {
        Endpoint {
            secret: self.secret.as_deref(),
            headers: &self.headers,
        }
    }

    /// The compared fields, in order.
    fn fields(&self) -> Vec<String> {
        match &self.compare {
            Some(fields) => fields.clone(),
            None => self.body.keys().cloned().collect(),
        }
    }
}

/// A field's value: a top-level key, or a JSON pointer when it starts with `/`.
fn field<'a>(object: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    let Some(pointer) = name.strip_prefix('/') else {
        return object.get(name);
    };
    let (first, rest) = match pointer.split_once('/') {
        Some((first, rest)) => (first, format!("/{rest}")),
        None => (pointer, String::new()),
    };
    object.get(&unescape(first))?.pointer(&rest)
}

/// One JSON pointer token, unescaped (`~1` is `/`, `~0` is `~`).
fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Reads the object: `None` for 404 and 410.
fn get(endpoint: &Endpoint<'_>, url: &str) -> Result<Option<Map<String, Value>>> {
    let response = http::send(&endpoint.request("GET", url)).context(format_args!("GET {url}"))?;
    if response.status == 404 || response.status == 410 {
        return Ok(None);
    }
    let response = response.check().context(format_args!("GET {url}"))?;
    match response.json::<Value>().context(format_args!("GET {url}"))? {
        Value::Object(object) => Ok(Some(object)),
        other => Err(Error::permanent(format!(
            "GET {url}: expected a JSON object, got {}",
            kind_of(&other)
        ))),
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn send_json(endpoint: &Endpoint<'_>, method: &str, url: &str, body: &Value) -> Result<Response> {
    let request = endpoint.request(method, url).json(body)?;
    http::send(&request)
        .and_then(Response::check)
        .context(format_args!("{method} {url}"))
}

/// The merge patch of the compared fields that differ: top-level keys as is, pointers as
/// nested objects.
fn merge_patch(desired: &Desired, changes: &[Change]) -> Value {
    let mut patch = Value::Object(Map::new());
    for change in changes {
        let name = change.field.as_str();
        let value = field(&desired.body, name).cloned().unwrap_or(Value::Null);
        let Some(pointer) = name.strip_prefix('/') else {
            patch[name] = value;
            continue;
        };
        let parts: Vec<String> = pointer.split('/').map(unescape).collect();
        let mut at = &mut patch;
        for part in &parts[..parts.len() - 1] {
            if !at.get(part).is_some_and(Value::is_object) {
                at[part.as_str()] = Value::Object(Map::new());
            }
            at = &mut at[part.as_str()];
        }
        at[parts[parts.len() - 1].as_str()] = value;
    }
    patch
}

impl Adaptor for HttpObject {
    type Desired = Desired;
    type Current = Map<String, Value>;

    fn read(target: &Target, desired: &Desired) -> Result<Option<Self::Current>> {
        desired.validate(target)?;
        get(&desired.endpoint(), &desired.url)
    }

    fn diff(target: &Target, desired: &Desired, current: Option<&Self::Current>) -> Result<Vec<Change>> {
        desired.validate(target)?;
        let mut changes = Vec::new();
        for name in desired.fields() {
            let want = field(&desired.body, &name);
            let have = current.and_then(|c| field(c, &name));
            if want != have {
                changes.push(Change::new(name, have.cloned(), want.cloned()));
            }
        }
        Ok(changes)
    }

    fn apply(target: &Target, desired: &Desired, current: Option<&Self::Current>, changes: &[Change]) -> Result<Vec<String>> {
        desired.validate(target)?;
        let endpoint = desired.endpoint();
        let body = Value::Object(desired.body.clone());
        let fields: Vec<&str> = changes.iter().map(|c| c.field.as_str()).collect();
        if current.is_none() {
            let (method, url) = match &desired.create {
                Some(Create {
                    method: CreateMethod::Post,
                    url,
                }) => ("POST", url.as_deref().unwrap_or(&desired.url)),
                Some(Create {
                    method: CreateMethod::Put,
                    url,
                }) => ("PUT", url.as_deref().unwrap_or(&desired.url)),
                None => ("PUT", desired.url.as_str()),
            };
            let response = send_json(&endpoint, method, url, &body)?;
            return Ok(vec![format!("created {} ({method} {url}: {})", desired.url, response.status)]);
        }
        let response = match desired.update {
            UpdateMethod::Put => send_json(&endpoint, "PUT", &desired.url, &body)?,
            UpdateMethod::Patch => {
                let patch = merge_patch(desired, changes);
                let request = endpoint
                    .request("PATCH", &desired.url)
                    .json(&patch)?
                    .header("content-type", "application/merge-patch+json");
                http::send(&request)
                    .and_then(Response::check)
                    .context(format_args!("PATCH {}", desired.url))?
            }
        };
        let method = match desired.update {
            UpdateMethod::Put => "PUT",
            UpdateMethod::Patch => "PATCH",
        };
        Ok(vec![format!(
            "updated {} ({method}: {}): {}",
            desired.url,
            response.status,
            fields.join(", ")
        )])
    }

    fn delete(target: &Target, _current: &Self::Current) -> Result<Vec<String>> {
        let url: String = target
            .attribute("url")?
            .ok_or_else(|| Error::invalid(format!("{}: `url` is required to delete the object", target.id)))?;
        check_url(target, "url", &url)?;
        let secret: Option<String> = target.attribute("secret")?;
        let headers: BTreeMap<String, String> = target.attribute("headers")?.unwrap_or_default();
        let endpoint = Endpoint {
            secret: secret.as_deref(),
            headers: &headers,
        };
        let response = http::send(&endpoint.request("DELETE", &url)).context(format_args!("DELETE {url}"))?;
        if response.status == 404 || response.status == 410 {
            return Ok(vec![format!("{url} was already absent")]);
        }
        let response = response.check().context(format_args!("DELETE {url}"))?;
        Ok(vec![format!("deleted {url} ({})", response.status)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orc_sdk::ErrorKind;
    use orc_sdk::adaptor::raw;
    use serde_json::json;

    fn target(attributes: Value) -> Target {
        Target {
            id: "http-object[api,widgets/a]".into(),
            resource_type: "http-object".into(),
            node: "api".into(),
            key: "widgets/a".into(),
            attributes_json: attributes.to_string(),
        }
    }

    fn diff(attributes: Value, current: Option<Value>) -> Result<Vec<Change>> {
        let current = current.map(|c| c.to_string());
        raw::diff::<HttpObject>(&target(attributes), current.as_deref())
    }

    #[test]
    fn a_missing_object_shows_every_compared_field() {
        let changes = diff(json!({"url": "http://api/w/a", "body": {"name": "a", "size": 3}}), None).unwrap();
        assert_eq!(
            changes,
            vec![
                Change::new("name", None, Some(json!("a"))),
                Change::new("size", None, Some(json!(3)))
            ]
        );
    }

    #[test]
    fn only_compared_fields_count_and_server_fields_are_ignored() {
        let attrs = json!({"url": "http://api/w/a", "body": {"name": "a", "size": 3}});
        assert!(
            diff(attrs.clone(), Some(json!({"id": 17, "name": "a", "size": 3})))
                .unwrap()
                .is_empty()
        );
        let changes = diff(attrs, Some(json!({"id": 17, "name": "a", "size": 4}))).unwrap();
        assert_eq!(changes, vec![Change::new("size", Some(json!(4)), Some(json!(3)))]);
        let attrs =
            json!({"url": "http://api/w/a", "body": {"name": "a", "spec": {"replicas": 2, "note": "x"}}, "compare": ["/spec/replicas"]});
        assert!(
            diff(attrs.clone(), Some(json!({"name": "b", "spec": {"replicas": 2, "note": "y"}})))
                .unwrap()
                .is_empty()
        );
        let changes = diff(attrs, Some(json!({"spec": {"replicas": 1}}))).unwrap();
        assert_eq!(changes, vec![Change::new("/spec/replicas", Some(json!(1)), Some(json!(2)))]);
    }

    #[test]
    fn merge_patch_nests_pointers() {
        let desired: Desired = serde_json::from_value(json!({"url": "http://x/", "body": {"a": 1, "spec": {"r": 2, "s~/t": 3}}})).unwrap();
        let changes = vec![
            Change::new("a", None, None),
            Change::new("/spec/r", None, None),
            Change::new("/spec/s~0~1t", None, None),
        ];
        assert_eq!(merge_patch(&desired, &changes), json!({"a": 1, "spec": {"r": 2, "s~/t": 3}}));
    }

    #[test]
    fn bad_attributes_are_invalid_input() {
        let e = diff(json!({"url": "ftp://x/", "body": {}}), None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert_eq!(
            e.message(),
            "http-object[api,widgets/a]: `url` must be an http:// or https:// URL, got \"ftp://x/\""
        );
        let e = diff(json!({"url": "http://x/", "body": [1]}), None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        let e = diff(
            json!({"url": "http://x/", "body": {}, "headers": {"authorization": "Bearer x"}}),
            None,
        )
        .unwrap_err();
        assert!(e.message().contains("may not set Authorization"), "{}", e.message());
        let e = diff(json!({"url": "http://x/", "body": {}, "update": "POST"}), None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }
}

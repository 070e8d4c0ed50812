//! Intents: the desired state an operator submits — resources with typed ids, the adaptor that
//! handles each (pinned by digest), desired attributes and `requires` edges — and their
//! validation: duplicate ids, requirements that name nothing and dependency cycles are refused
//! with an error that names the culprit.

pub mod diff;
mod edges;
pub mod pinning;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

pub use edges::Edges;
use orc_manifest::Digest;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `type[node,key]`, e.g. `file[web1,/etc/motd]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId {
    pub resource_type: String,
    pub node: String,
    pub key: String,
}

impl fmt::Display for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{},{}]", self.resource_type, self.node, self.key)
    }
}

impl FromStr for ResourceId {
    type Err = IntentError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| IntentError::InvalidId {
            id: s.chars().take(200).collect(),
            reason: why.to_string(),
        };
        let open = s.find('[').ok_or_else(|| bad("expected `type[node,key]`"))?;
        let inner = s[open + 1..]
            .strip_suffix(']')
            .ok_or_else(|| bad("expected `type[node,key]` ending in `]`"))?;
        let resource_type = &s[..open];
        orc_manifest::validate_name(resource_type).map_err(|_| bad("the type must be lowercase letters, digits, `-` or `_`"))?;
        let (node, key) = inner.split_once(',').ok_or_else(|| bad("expected a `,` between node and key"))?;
        if node.is_empty() || !node.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(bad("the node name must be letters, digits, `-`, `_` or `.`"));
        }
        if key.is_empty() || key.chars().any(char::is_control) {
            return Err(bad("the key must be non-empty and free of control characters"));
        }
        Ok(ResourceId {
            resource_type: resource_type.to_string(),
            node: node.to_string(),
            key: key.to_string(),
        })
    }
}

impl Serialize for ResourceId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ResourceId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// How a resource names its adaptor: by digest, or by `name@version` (resolved and pinned to a
/// digest when the intent is accepted), or by bare name (the highest published version).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PluginRef {
    Digest(Digest),
    Named { name: String, version: Option<String> },
}

impl fmt::Display for PluginRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginRef::Digest(d) => write!(f, "{d}"),
            PluginRef::Named { name, version: Some(v) } => write!(f, "{name}@{v}"),
            PluginRef::Named { name, version: None } => write!(f, "{name}"),
        }
    }
}

impl FromStr for PluginRef {
    type Err = IntentError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.starts_with("sha256:") {
            return s
                .parse()
                .map(PluginRef::Digest)
                .map_err(|e: orc_manifest::DigestError| IntentError::InvalidPluginRef(e.to_string()));
        }
        let (name, version) = match s.split_once('@') {
            Some((n, v)) => (n, Some(v)),
            None => (s, None),
        };
        orc_manifest::validate_name(name).map_err(|e| IntentError::InvalidPluginRef(e.to_string()))?;
        if let Some(v) = version {
            orc_manifest::validate_version(v).map_err(|e| IntentError::InvalidPluginRef(e.to_string()))?;
        }
        Ok(PluginRef::Named {
            name: name.to_string(),
            version: version.map(str::to_string),
        })
    }
}

impl Serialize for PluginRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PluginRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// One resource of an intent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceSpec {
    /// `type[node,key]`, unique in the intent.
    #[schema(value_type = String, example = "file[local,/etc/motd]")]
    pub id: ResourceId,
    /// `name@version`, `name` (the highest published version) or `sha256:…`; pinned to a digest
    /// when the intent is accepted.
    #[schema(value_type = String, example = "file@0.1.0")]
    pub adaptor: PluginRef,
    /// The desired state, as the adaptor defines it.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub attributes: Attributes,
    /// Ids of resources that must be deployed before this one.
    #[serde(default)]
    #[schema(value_type = Vec<String>)]
    pub requires: Vec<ResourceId>,
    /// Marked for removal: the adaptor deletes it.
    #[serde(default)]
    pub purged: bool,
    /// The resource set it belongs to (`PUT …/resource-sets/{name}` replaces one set and keeps the
    /// others); none: the environment's main intent. Not part of the desired state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub set: Option<Box<str>>,
    /// JSON pointers into `attributes` (`/password`, `/config/token`) whose values the host
    /// never shows: its views (intent versions, diffs, the console) say `"<redacted>"`. The
    /// adaptor receives them as they are. Not part of the desired state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<String>>, example = json!(["/content"]))]
    pub sensitive: Option<Box<Vec<String>>>,
}

/// What the host shows in place of a sensitive value.
pub const REDACTED: &str = "<redacted>";

/// Most sensitive pointers one resource may name.
pub const MAX_SENSITIVE: usize = 256;

impl ResourceSpec {
    /// The attributes as a client may see them: every `sensitive` value replaced by
    /// [`REDACTED`].
    pub fn shown_attributes(&self) -> serde_json::Value {
        let mut value = self.attributes.to_value();
        if let Some(pointers) = &self.sensitive {
            redact(&mut value, pointers);
        }
        value
    }

    /// A change an adaptor reports for `field` (an attribute's name, a `.`-separated path, or a
    /// JSON pointer) as a client may see it: its values redacted when the field is, or is inside,
    /// a sensitive value, and the sensitive values inside them when it holds some.
    pub fn redact_change(&self, field: &str, values: [&mut Option<serde_json::Value>; 2]) {
        let Some(pointers) = &self.sensitive else { return };
        let at = if field.starts_with('/') {
            field.to_string()
        } else {
            field
                .split('.')
                .map(|k| format!("/{}", k.replace('~', "~0").replace('/', "~1")))
                .collect()
        };
        if self.is_sensitive(&at) {
            for v in values.into_iter().filter(|v| v.is_some()) {
                *v = Some(serde_json::Value::String(REDACTED.into()));
            }
            return;
        }
        let inner: Vec<String> = pointers
            .iter()
            .filter_map(|p| p.strip_prefix(at.as_str()).filter(|rest| rest.starts_with('/')).map(str::to_string))
            .collect();
        for v in values.into_iter().flatten() {
            redact(v, &inner);
        }
    }

    /// Whether `pointer` (into the attributes) is, or is inside, a sensitive value.
    pub fn is_sensitive(&self, pointer: &str) -> bool {
        self.sensitive.as_ref().is_some_and(|pointers| {
            pointers
                .iter()
                .any(|p| pointer == p.as_str() || pointer.strip_prefix(p.as_str()).is_some_and(|rest| rest.starts_with('/')))
        })
    }
}

/// An intent document (as stored, a JSON tree) as a client may see it: each resource's
/// `sensitive` values redacted in its attributes.
pub fn redact_document(document: &mut serde_json::Value) {
    let Some(resources) = document.get_mut("resources").and_then(serde_json::Value::as_array_mut) else {
        return;
    };
    for r in resources {
        let pointers: Vec<String> = match r.get("sensitive").and_then(serde_json::Value::as_array) {
            Some(p) => p.iter().filter_map(|p| p.as_str().map(str::to_string)).collect(),
            None => continue,
        };
        if let Some(attributes) = r.get_mut("attributes") {
            redact(attributes, &pointers);
        }
    }
}

/// Replaces the value at each of `pointers` in `value` (those present) by [`REDACTED`].
pub fn redact(value: &mut serde_json::Value, pointers: &[String]) {
    for p in pointers {
        if let Some(v) = value.pointer_mut(p) {
            *v = serde_json::Value::String(REDACTED.into());
        }
    }
}

/// A resource's desired attributes, kept as canonical JSON text (object keys sorted, no
/// whitespace): what adaptors receive and what the desired hash covers, so neither serialises
/// anything per action, and an order of magnitude smaller in memory than a `serde_json::Value`
/// tree (a version of 100,000 resources stays loaded for as long as it is released). Parsed back
/// only where a tree is needed (intent diffs).
#[derive(Clone, PartialEq, Eq)]
pub struct Attributes(Box<str>);

impl Attributes {
    /// The canonical text of `value` (not necessarily an object: [`Intent::validate`] refuses
    /// anything else naming the resource).
    pub fn new(value: &serde_json::Value) -> Attributes {
        Attributes(value.to_string().into_boxed_str())
    }

    /// The canonical JSON text.
    pub fn as_json(&self) -> &str {
        &self.0
    }

    pub fn is_object(&self) -> bool {
        self.0.starts_with('{')
    }

    /// The attributes as a JSON tree.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).expect("canonical attributes are valid JSON")
    }
}

impl Default for Attributes {
    fn default() -> Attributes {
        Attributes("{}".into())
    }
}

impl fmt::Debug for Attributes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Attributes {
    /// The canonical text as it is: serde_json writes a raw value through (its value serializer
    /// parses it), so storing a version does not rebuild every resource's tree.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match serde_json::from_str::<&serde_json::value::RawValue>(&self.0) {
            Ok(raw) => raw.serialize(s),
            Err(_) => self.to_value().serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Attributes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde_json::Value::deserialize(d).map(|v| Attributes::new(&v))
    }
}

/// An intent document as submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IntentDocument {
    pub resources: Vec<ResourceSpec>,
}

#[derive(Debug, thiserror::Error)]
pub enum IntentError {
    #[error("the intent is not valid JSON: {0}")]
    Json(String),
    #[error("invalid resource id `{id}`: {reason}")]
    InvalidId { id: String, reason: String },
    #[error("invalid adaptor reference: {0}")]
    InvalidPluginRef(String),
    #[error("resource `{0}` appears more than once")]
    DuplicateId(String),
    #[error("resource `{resource}` requires `{requires}`, which is not in the intent")]
    UnknownRequirement { resource: String, requires: String },
    #[error("resource `{0}` requires itself")]
    SelfRequirement(String),
    #[error("dependency cycle: {}", .0.join(" -> "))]
    Cycle(Vec<String>),
    /// Purged resources are removed dependents first (the edge between two purged resources is
    /// reversed), and with that the order of actions goes round.
    #[error(
        "the order of actions is circular once purged resources are removed dependents first: {} (`a -> b`: a runs after b); a resource that stays cannot require a purged resource that is itself required by a purged one",
        .0.join(" -> ")
    )]
    PurgeOrderCycle(Vec<String>),
    #[error("resource `{resource}`: attributes must be a JSON object")]
    AttributesNotObject { resource: String },
    #[error("resource `{resource}`: set `{set}` is refused: {reason}")]
    InvalidSet { resource: String, set: String, reason: String },
    #[error("resource `{resource}`: sensitive: {reason}")]
    InvalidSensitive { resource: String, reason: String },
}

/// An intent that passed validation: resources plus the dependency graph by index.
#[derive(Debug, Clone)]
pub struct Intent {
    pub resources: Vec<ResourceSpec>,
    /// `requires.of(i)`: indices resource `i` requires.
    pub requires: Edges,
}

impl Intent {
    pub fn parse(json: &[u8]) -> Result<Intent, IntentError> {
        let doc: IntentDocument = serde_json::from_slice(json).map_err(|e| IntentError::Json(e.to_string()))?;
        Intent::validate(doc)
    }

    pub fn validate(doc: IntentDocument) -> Result<Intent, IntentError> {
        let mut index: HashMap<&ResourceId, usize> = HashMap::with_capacity(doc.resources.len());
        for (i, r) in doc.resources.iter().enumerate() {
            if !r.attributes.is_object() {
                return Err(IntentError::AttributesNotObject {
                    resource: r.id.to_string(),
                });
            }
            if let Some(pointers) = &r.sensitive {
                let refuse = |reason: String| IntentError::InvalidSensitive {
                    resource: r.id.to_string(),
                    reason,
                };
                if pointers.len() > MAX_SENSITIVE {
                    return Err(refuse(format!("{} pointers, at most {MAX_SENSITIVE}", pointers.len())));
                }
                if let Some(p) = pointers.iter().find(|p| !p.starts_with('/')) {
                    let shown: String = p.chars().take(100).collect();
                    return Err(refuse(format!(
                        "`{shown}` is not a JSON pointer into the attributes (it starts with `/`)"
                    )));
                }
            }
            if let Some(set) = &r.set {
                orc_manifest::names::SERVICE.check(set).map_err(|e| IntentError::InvalidSet {
                    resource: r.id.to_string(),
                    set: set.chars().take(100).collect(),
                    reason: format!("{e} ({})", orc_manifest::names::SERVICE.describe()),
                })?;
            }
            if index.insert(&r.id, i).is_some() {
                return Err(IntentError::DuplicateId(r.id.to_string()));
            }
        }
        let mut requires = Vec::new();
        for (i, r) in doc.resources.iter().enumerate() {
            for req in &r.requires {
                let j = *index.get(req).ok_or_else(|| IntentError::UnknownRequirement {
                    resource: r.id.to_string(),
                    requires: req.to_string(),
                })?;
                if i == j {
                    return Err(IntentError::SelfRequirement(r.id.to_string()));
                }
                requires.push((i, j));
            }
        }
        drop(index);
        let intent = Intent {
            requires: Edges::from_pairs(doc.resources.len(), &requires),
            resources: doc.resources,
        };
        let path = |cycle: Vec<usize>| cycle.into_iter().map(|i| intent.resources[i].id.to_string()).collect();
        if let Some(cycle) = find_cycle(&intent.requires) {
            return Err(IntentError::Cycle(path(cycle)));
        }
        if let Some(cycle) = find_cycle(&intent.waits_for()) {
            return Err(IntentError::PurgeOrderCycle(path(cycle)));
        }
        Ok(intent)
    }

    /// The order of actions: `waits_for.of(i)` must be deployed before `i` runs. The intent's
    /// `requires`, except that between two purged resources the edge is reversed, so that
    /// dependents are removed first.
    pub fn waits_for(&self) -> Edges {
        let pairs: Vec<(usize, usize)> = self
            .requires
            .pairs()
            .map(|(i, j)| {
                if self.resources[i].purged && self.resources[j].purged {
                    (j, i)
                } else {
                    (i, j)
                }
            })
            .collect();
        Edges::from_pairs(self.resources.len(), &pairs)
    }
}

/// A cycle of `edges` (`edges.of(i)`: what `i` points to) as a path `a -> b -> … -> a`, if there
/// is one (iterative DFS, so deep chains do not overflow the stack).
fn find_cycle(edges: &Edges) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Active,
        Done,
    }
    let n = edges.len();
    let mut mark = vec![Mark::New; n];
    for start in 0..n {
        if mark[start] != Mark::New {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        mark[start] = Mark::Active;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&dep) = edges.of(node).get(*next) {
                *next += 1;
                match mark[dep] {
                    Mark::New => {
                        mark[dep] = Mark::Active;
                        stack.push((dep, 0));
                    }
                    Mark::Active => {
                        let from = stack.iter().position(|(n, _)| *n == dep).expect("active nodes are on the stack");
                        let mut cycle: Vec<usize> = stack[from..].iter().map(|(n, _)| *n).collect();
                        cycle.push(dep);
                        return Some(cycle);
                    }
                    Mark::Done => {}
                }
            } else {
                mark[node] = Mark::Done;
                stack.pop();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(resources: serde_json::Value) -> Result<Intent, IntentError> {
        Intent::parse(serde_json::json!({ "resources": resources }).to_string().as_bytes())
    }

    /// Attributes are written as their canonical text, and read back to the same text, through
    /// serde_json's writer and its value serializer alike.
    #[test]
    fn attributes_serialise_as_their_canonical_text() {
        let value = serde_json::json!({"z": [1, {"b": "é\n", "a": null}], "a": 1.5, "m": {"y": true, "x": "\"q\""}});
        let attributes = Attributes::new(&value);
        let text = serde_json::to_string(&attributes).unwrap();
        assert_eq!(text, attributes.as_json());
        assert_eq!(serde_json::to_value(&attributes).unwrap(), value);
        let nested = serde_json::to_string(&serde_json::json!({"k": serde_json::to_value(&attributes).unwrap()})).unwrap();
        assert_eq!(nested, format!("{{\"k\":{}}}", attributes.as_json()));
        let back: Attributes = serde_json::from_str(&text).unwrap();
        assert_eq!(back, attributes);
    }

    #[test]
    fn sensitive_values_are_redacted_where_shown_and_bad_pointers_refused() {
        let intent = doc(serde_json::json!([{
            "id": "file[local,/etc/app.conf]", "adaptor": "file@0.1.0", "sensitive": ["/content", "/meta/a~1b", "/absent"],
            "attributes": {"content": "password=hunter2", "meta": {"a/b": {"deep": 1}, "mode": "0600"}}
        }]))
        .unwrap();
        let r = &intent.resources[0];
        let shown = serde_json::json!({"content": REDACTED, "meta": {"a/b": REDACTED, "mode": "0600"}});
        assert_eq!(r.shown_attributes(), shown);
        assert!(r.is_sensitive("/content") && r.is_sensitive("/meta/a~1b/deep"));
        assert!(!r.is_sensitive("/contents") && !r.is_sensitive("/meta/mode") && !r.is_sensitive("/meta"));
        // The stored document, as the API shows it.
        let mut stored = serde_json::to_value(IntentDocument {
            resources: intent.resources.clone(),
        })
        .unwrap();
        redact_document(&mut stored);
        assert_eq!(stored["resources"][0]["attributes"], shown);
        assert!(!stored.to_string().contains("hunter2"));
        // What the adaptor gets is untouched.
        assert!(r.attributes.as_json().contains("hunter2"));
        // What an adaptor reports would change: by field name, dotted path or pointer.
        let change = |field: &str, value: serde_json::Value| {
            let (mut current, mut desired) = (Some(value.clone()), Some(value));
            r.redact_change(field, [&mut current, &mut desired]);
            (current, desired)
        };
        let hidden = Some(serde_json::json!(REDACTED));
        assert_eq!(
            change("content", serde_json::json!("password=hunter2")),
            (hidden.clone(), hidden.clone())
        );
        assert_eq!(change("meta.a/b", serde_json::json!(1)).0, hidden);
        assert_eq!(change("/meta/a~1b/deep", serde_json::json!(1)).0, hidden);
        assert_eq!(change("mode", serde_json::json!("0600")).0, Some(serde_json::json!("0600")));
        let meta = change("meta", serde_json::json!({"a/b": {"deep": 1}, "mode": "0600"}));
        assert_eq!(meta.1, Some(serde_json::json!({"a/b": REDACTED, "mode": "0600"})));
        let (mut current, mut desired) = (None, Some(serde_json::json!("x")));
        r.redact_change("content", [&mut current, &mut desired]);
        assert_eq!((current, desired), (None, hidden));

        let e = doc(serde_json::json!([{"id": "file[local,/a]", "adaptor": "file@0.1.0", "sensitive": ["content"]}])).unwrap_err();
        assert!(matches!(e, IntentError::InvalidSensitive { .. }), "{e}");
        assert!(
            e.to_string().contains("file[local,/a]") && e.to_string().contains("`content`"),
            "{e}"
        );
        let many: Vec<String> = (0..=MAX_SENSITIVE).map(|i| format!("/k{i}")).collect();
        let e = doc(serde_json::json!([{"id": "file[local,/a]", "adaptor": "file@0.1.0", "sensitive": many}])).unwrap_err();
        assert!(e.to_string().contains("at most 256"), "{e}");
    }

    /// Found by the scheduler's model-based test: `b` stays and requires `a`; `a` and `c` are
    /// purged and `c` requires both. Removing dependents first makes `a` wait for `c`, `c` for
    /// `b` and `b` for `a`: nothing would ever run.
    #[test]
    fn an_order_made_circular_by_purging_is_refused_naming_the_path() {
        let r = |id: &str, purged: bool, requires: &[&str]| {
            serde_json::json!({ "id": format!("file[n,/{id}]"), "adaptor": "file", "attributes": {}, "purged": purged,
                "requires": requires.iter().map(|r| format!("file[n,/{r}]")).collect::<Vec<_>>() })
        };
        let err = doc(serde_json::json!([
            r("a", true, &[]),
            r("b", false, &["a"]),
            r("c", true, &["b", "a"])
        ]))
        .unwrap_err();
        assert!(matches!(err, IntentError::PurgeOrderCycle(_)), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("file[n,/a]") && message.contains("file[n,/b]") && message.contains("file[n,/c]"),
            "{message}"
        );
        // Without the resource that stays in between, the purge order is fine.
        doc(serde_json::json!([r("a", true, &[]), r("c", true, &["a"]), r("b", false, &[])])).unwrap();
    }

    #[test]
    fn attributes_are_canonical_and_hash_as_a_json_value_would() {
        let a = doc(serde_json::json!([{ "id": "file[n,/a]", "adaptor": "file@0.1.0",
            "attributes": { "z": 1, "a": { "y": [1, 2.5, "x\"y"], "b": null }, "m": "é\n" } }]))
        .unwrap();
        let b = Intent::parse(
            br#"{"resources": [{"id": "file[n,/a]", "adaptor": "file@0.1.0",
                "attributes": {"m": "\u00e9\n", "a": {"b": null, "y": [1, 2.5, "x\"y"]}, "z": 1}}]}"#,
        )
        .unwrap();
        let (a, b) = (&a.resources[0], &b.resources[0]);
        assert_eq!(a.attributes, b.attributes, "key order and escapes do not matter");
        assert_eq!(a.attributes.as_json(), r#"{"a":{"b":null,"y":[1,2.5,"x\"y"]},"m":"é\n","z":1}"#);
        // Hashes stored by earlier versions were of this JSON value's text: they must not change.
        let digest = Digest::of(b"plugin");
        for purged in [false, true] {
            let spec = ResourceSpec { purged, ..a.clone() };
            let value = serde_json::json!({ "adaptor": digest.to_string(), "attributes": spec.attributes.to_value(), "purged": purged });
            assert_eq!(
                crate::scheduler::desired_hash(&spec, &digest),
                Digest::of(value.to_string().as_bytes())
            );
        }
        let missing = doc(serde_json::json!([{ "id": "file[n,/a]", "adaptor": "file@0.1.0" }])).unwrap();
        assert_eq!(missing.resources[0].attributes.as_json(), "{}");
    }

    #[test]
    fn parses_ids_and_refs() {
        let id: ResourceId = "file[web1,/etc/motd]".parse().unwrap();
        assert_eq!(
            (id.resource_type.as_str(), id.node.as_str(), id.key.as_str()),
            ("file", "web1", "/etc/motd")
        );
        assert_eq!(id.to_string(), "file[web1,/etc/motd]");
        let id: ResourceId = "http-object[api,/v1/things/a,b]".parse().unwrap();
        assert_eq!(id.key, "/v1/things/a,b");
        for bad in ["file", "file[web1]", "File[a,b]", "file[a,b", "file[,/x]", "file[a b,/x]"] {
            assert!(bad.parse::<ResourceId>().is_err(), "{bad}");
        }
        assert!(matches!(
            "file@0.1.0".parse::<PluginRef>().unwrap(),
            PluginRef::Named { version: Some(_), .. }
        ));
        assert!("sha256:abc".parse::<PluginRef>().is_err());
    }

    #[test]
    fn refuses_duplicates_unknown_requirements_and_cycles() {
        let r = |id: &str, req: &[&str]| serde_json::json!({ "id": id, "adaptor": "file@0.1.0", "requires": req });
        let err = doc(serde_json::json!([r("file[n,/a]", &[]), r("file[n,/a]", &[])])).unwrap_err();
        assert_eq!(err.to_string(), "resource `file[n,/a]` appears more than once");
        let err = doc(serde_json::json!([r("file[n,/a]", &["file[n,/b]"])])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "resource `file[n,/a]` requires `file[n,/b]`, which is not in the intent"
        );
        let err = doc(serde_json::json!([
            r("file[n,/a]", &["file[n,/b]"]),
            r("file[n,/b]", &["file[n,/c]"]),
            r("file[n,/c]", &["file[n,/a]"])
        ]))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "dependency cycle: file[n,/a] -> file[n,/b] -> file[n,/c] -> file[n,/a]"
        );
        let err = doc(serde_json::json!([{ "id": "file[n,/a]", "adaptor": "file@0.1.0", "atributes": {} }])).unwrap_err();
        assert!(err.to_string().contains("unknown field `atributes`"), "{err}");
        let ok = doc(serde_json::json!([r("file[n,/a]", &[]), r("file[n,/b]", &["file[n,/a]"])])).unwrap();
        assert_eq!((ok.requires.of(0), ok.requires.of(1)), (&[][..], &[0][..]));
        assert_eq!(ok.requires.reversed().of(0), [1]);
    }

    #[test]
    fn a_long_chain_has_no_cycle_and_no_stack_overflow() {
        let n = 50_000;
        let resources: Vec<_> = (0..n)
            .map(|i| {
                let req: Vec<String> = if i > 0 { vec![format!("file[n,/{}]", i - 1)] } else { vec![] };
                serde_json::json!({ "id": format!("file[n,/{i}]"), "adaptor": "file@0.1.0", "requires": req })
            })
            .collect();
        doc(serde_json::Value::Array(resources)).unwrap();
    }
}

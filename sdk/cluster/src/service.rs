//! Service versions of the catalog (dEF-Pi's services): what a service is, which interfaces it
//! provides and requires, and when two interfaces may be connected.
//!
//! A [`ServiceDocument`] is published to the registry as a content-addressed document
//! (`name@version` immutable). It pins the automator plugin that runs its processes, describes
//! each process's configuration with a JSON Schema, lists the ports a process listens on and what
//! it needs from a node, and declares its [`Interface`]s. Each interface has one or more
//! versions, each identified by the digest of its message schema ([`InterfaceVersion::id`]):
//! two interfaces are compatible when one provides and the other requires, and they share a
//! version id; [`negotiate`] picks the highest shared version.
//!
//! [`ServiceDocument::validate`] checks what needs no JSON Schema engine (names, versions,
//! duplicates, cardinalities, ports); the registry also compiles the schemas.

use std::collections::BTreeSet;

use orc_manifest::{Digest, canonical};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Needs;

/// One version of a service in the catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceDocument {
    pub name: String,
    /// `MAJOR.MINOR.PATCH`, as plugins are versioned.
    pub version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The automator plugin that runs the service's processes, by digest.
    pub automator: Digest,
    /// A JSON Schema of one process's configuration; any object when absent.
    #[serde(default = "any_object")]
    pub config_schema: Value,
    /// The configuration every process starts from (a JSON object); a process's own is merged
    /// over it (JSON merge patch). The schema checks the process's own part.
    #[serde(default = "empty_object", skip_serializing_if = "is_empty_object")]
    pub config: Value,
    /// The configuration key the automator takes a process's connections under (interface →
    /// list of peers); a service without one is not told of its connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections_key: Option<String>,
    /// The ports a process listens on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    /// What a node must have to run a process of the service.
    #[serde(default, skip_serializing_if = "Needs::is_empty")]
    pub needs: Needs,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
}

/// A port a process listens on; a process may be given another number when it is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Port {
    pub name: String,
    pub port: u16,
    #[serde(default)]
    pub protocol: Protocol,
    /// The configuration key the automator takes this port's number under (`port` for the
    /// redis automator); the host sets it in each process's configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_key: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

/// What an interface does for its process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Peers connect to it (it names the port they reach).
    Provides,
    /// It connects to a peer that provides a compatible interface.
    Requires,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Provides => "provides",
            Role::Requires => "requires",
        }
    }
}

/// An interface of a service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interface {
    pub name: String,
    pub role: Role,
    /// For a provider, the port (one of the service's `ports`) its peers connect to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    /// The versions it speaks, each identified by its message schema's digest.
    pub versions: Vec<InterfaceVersion>,
    /// More than one connection; at most `max_connections` when given. One connection when false.
    #[serde(default)]
    pub allow_multiple: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// For a provider: whether it is told where each consumer runs (node and address, e.g. to let
    /// only them in). Without it a provider is told who is connected and at which version, and a
    /// consumer that moves does not reconfigure it. A consumer is always told where its provider
    /// runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub consumer_addresses: bool,
}

impl Interface {
    /// The most connections the interface takes; `None`: no limit.
    pub fn limit(&self) -> Option<u32> {
        if self.allow_multiple { self.max_connections } else { Some(1) }
    }

    /// Whether a process is told where its peers on this interface run: a consumer always, a
    /// provider when it asks for its consumers' addresses.
    pub fn told_peer_location(&self) -> bool {
        self.role == Role::Requires || self.consumer_addresses
    }
}

/// One version of an interface: a label and the schema of the messages it exchanges.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceVersion {
    /// `MAJOR.MINOR.PATCH`; orders the versions when several are shared.
    pub version: String,
    /// A JSON Schema of the messages; its canonical digest identifies the version.
    pub schema: Value,
}

impl InterfaceVersion {
    /// `sha256:` of the schema's canonical JSON: the same schema written with other key order or
    /// spacing is the same version.
    pub fn id(&self) -> Digest {
        canonical::digest(&self.schema)
    }
}

/// Why a service document is refused: `path` is the JSON path of the culprit
/// (`interfaces[1].max_connections`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ServiceError {
    pub path: String,
    pub message: String,
}

fn err(path: impl Into<String>, message: impl Into<String>) -> ServiceError {
    ServiceError {
        path: path.into(),
        message: message.into(),
    }
}

fn any_object() -> Value {
    serde_json::json!({"type": "object"})
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

fn is_empty_object(v: &Value) -> bool {
    v.as_object().is_some_and(|o| o.is_empty())
}

fn check_name(path: String, kind: &str, name: &str) -> Result<(), ServiceError> {
    orc_manifest::names::SERVICE.check(name).map_err(|e| {
        err(
            path,
            format!(
                "{kind} name `{}` is refused: {e} ({})",
                name.escape_debug(),
                orc_manifest::names::SERVICE.describe()
            ),
        )
    })
}

impl ServiceDocument {
    /// Parses and validates a document.
    pub fn from_json(value: Value) -> Result<ServiceDocument, ServiceError> {
        let doc: ServiceDocument = serde_json::from_value(value).map_err(|e| err("service", e.to_string()))?;
        doc.validate()?;
        Ok(doc)
    }

    /// `name@version`.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    /// Refuses what no process could run with, naming the culprit by its path.
    pub fn validate(&self) -> Result<(), ServiceError> {
        check_name("name".into(), "a service", &self.name)?;
        orc_manifest::validate_version(&self.version).map_err(|e| err("version", e.to_string()))?;
        if !self.config_schema.is_object() {
            return Err(err("config_schema", "must be a JSON Schema object"));
        }
        if !self.config.is_object() {
            return Err(err("config", "must be a JSON object"));
        }
        if let Some(key) = &self.connections_key
            && (key.is_empty() || key.len() > 64)
        {
            return Err(err("connections_key", "a configuration key has 1 to 64 characters"));
        }
        let mut ports = BTreeSet::new();
        for (i, p) in self.ports.iter().enumerate() {
            let at = format!("ports[{i}]");
            check_name(format!("{at}.name"), "a port", &p.name)?;
            if !ports.insert(p.name.as_str()) {
                return Err(err(format!("{at}.name"), format!("duplicate port `{}`", p.name)));
            }
            if p.port == 0 {
                return Err(err(format!("{at}.port"), "a port is 1 to 65535"));
            }
            if let Some(key) = &p.config_key
                && (key.is_empty() || key.len() > 64)
            {
                return Err(err(format!("{at}.config_key"), "a configuration key has 1 to 64 characters"));
            }
        }
        let mut interfaces = BTreeSet::new();
        for (i, iface) in self.interfaces.iter().enumerate() {
            let at = format!("interfaces[{i}]");
            check_name(format!("{at}.name"), "an interface", &iface.name)?;
            if !interfaces.insert(iface.name.as_str()) {
                return Err(err(format!("{at}.name"), format!("duplicate interface `{}`", iface.name)));
            }
            match (iface.role, &iface.port) {
                (Role::Provides, Some(port)) if !ports.contains(port.as_str()) => {
                    return Err(err(format!("{at}.port"), format!("`{port}` is not one of the service's ports")));
                }
                (Role::Requires, Some(_)) => {
                    return Err(err(format!("{at}.port"), "only a provided interface listens on a port"));
                }
                _ => {}
            }
            if iface.role == Role::Requires && iface.consumer_addresses {
                return Err(err(
                    format!("{at}.consumer_addresses"),
                    "only a provided interface has consumers (a consumer is always told where its provider runs)",
                ));
            }
            match iface.max_connections {
                Some(0) => {
                    return Err(err(
                        format!("{at}.max_connections"),
                        "cardinality must be at least 1 (leave it out for no limit)",
                    ));
                }
                Some(n) if n > 1 && !iface.allow_multiple => {
                    return Err(err(
                        format!("{at}.max_connections"),
                        format!("{n} connections need `allow_multiple = true`"),
                    ));
                }
                _ => {}
            }
            if iface.versions.is_empty() {
                return Err(err(format!("{at}.versions"), "an interface speaks at least one version"));
            }
            let (mut labels, mut ids) = (BTreeSet::new(), BTreeSet::new());
            for (j, v) in iface.versions.iter().enumerate() {
                let vat = format!("{at}.versions[{j}]");
                orc_manifest::validate_version(&v.version).map_err(|e| err(format!("{vat}.version"), e.to_string()))?;
                if !labels.insert(v.version.as_str()) {
                    return Err(err(format!("{vat}.version"), format!("duplicate version `{}`", v.version)));
                }
                if !v.schema.is_object() {
                    return Err(err(format!("{vat}.schema"), "must be a JSON Schema object"));
                }
                if !ids.insert(v.id()) {
                    return Err(err(
                        format!("{vat}.schema"),
                        "the same schema as an earlier version: a version is identified by its schema",
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn interface(&self, name: &str) -> Option<&Interface> {
        self.interfaces.iter().find(|i| i.name == name)
    }

    pub fn port(&self, name: &str) -> Option<&Port> {
        self.ports.iter().find(|p| p.name == name)
    }
}

/// The version two interfaces agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreement {
    /// The provider's label of the chosen version.
    pub version: String,
    pub id: Digest,
}

/// Why two interfaces cannot be connected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("both interfaces {0} (one must provide, the other require)")]
    SameRole(&'static str),
    #[error("they share no version: one offers {offers:?}, the other {other:?}")]
    NoSharedVersion { offers: Vec<String>, other: Vec<String> },
}

/// The highest version (by the provider's labels) whose schema both interfaces speak, when one
/// provides and the other requires.
pub fn negotiate(a: &Interface, b: &Interface) -> Result<Agreement, Mismatch> {
    if a.role == b.role {
        return Err(Mismatch::SameRole(match a.role {
            Role::Provides => "provide",
            Role::Requires => "require",
        }));
    }
    let (provider, other) = if a.role == Role::Provides { (a, b) } else { (b, a) };
    let theirs: BTreeSet<Digest> = other.versions.iter().map(InterfaceVersion::id).collect();
    provider
        .versions
        .iter()
        .filter(|v| theirs.contains(&v.id()))
        .max_by(|x, y| orc_manifest::version_order(&x.version).cmp(&orc_manifest::version_order(&y.version)))
        .map(|v| Agreement {
            version: v.version.clone(),
            id: v.id(),
        })
        .ok_or_else(|| Mismatch::NoSharedVersion {
            offers: a.versions.iter().map(|v| v.version.clone()).collect(),
            other: b.versions.iter().map(|v| v.version.clone()).collect(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

    fn kv_schema(v: u32) -> Value {
        json!({"type": "object", "properties": {"op": {"enum": ["get", "set"]}}, "v": v})
    }

    fn redis() -> Value {
        json!({
            "name": "redis", "version": "1.0.0", "automator": DIGEST,
            "config_schema": {"type": "object", "properties": {"maxmemory": {"type": "integer"}}},
            "ports": [{"name": "kv", "port": 6379}],
            "interfaces": [{
                "name": "kv", "role": "provides", "port": "kv", "allow_multiple": true, "max_connections": 4,
                "versions": [{"version": "1.0.0", "schema": kv_schema(1)}, {"version": "2.0.0", "schema": kv_schema(2)}]
            }]
        })
    }

    #[test]
    fn a_good_document_parses_and_round_trips() {
        let doc = ServiceDocument::from_json(redis()).unwrap();
        assert_eq!(doc.reference(), "redis@1.0.0");
        let mut bare = redis();
        bare.as_object_mut().unwrap().remove("config_schema");
        assert_eq!(ServiceDocument::from_json(bare).unwrap().config_schema, json!({"type": "object"}));
        assert_eq!(doc.interface("kv").unwrap().limit(), Some(4));
        let again = ServiceDocument::from_json(serde_json::to_value(&doc).unwrap()).unwrap();
        assert_eq!(again, doc);
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases: Vec<(&str, Value, &str)> = vec![
            ("/name", json!("Redis"), "name"),
            ("/version", json!("1.0"), "version"),
            ("/config_schema", json!(true), "config_schema"),
            ("/ports/0/port", json!(0), "ports[0].port"),
            ("/interfaces/0/max_connections", json!(0), "interfaces[0].max_connections"),
            ("/interfaces/0/port", json!("nope"), "interfaces[0].port"),
            ("/interfaces/0/versions", json!([]), "interfaces[0].versions"),
            (
                "/interfaces/0/versions/1/version",
                json!("1.0.0"),
                "interfaces[0].versions[1].version",
            ),
            (
                "/interfaces/0/versions/1/schema",
                json!({"v": 1, "properties": {"op": {"enum": ["get", "set"]}}, "type": "object"}),
                "interfaces[0].versions[1].schema",
            ),
        ];
        for (pointer, value, path) in cases {
            let mut doc = redis();
            *doc.pointer_mut(pointer).unwrap() = value;
            let e = ServiceDocument::from_json(doc).unwrap_err();
            assert_eq!(e.path, path, "{pointer}: {e}");
        }
        let mut doc = redis();
        let copy = doc["interfaces"][0].clone();
        doc["interfaces"].as_array_mut().unwrap().push(copy);
        let e = ServiceDocument::from_json(doc).unwrap_err();
        assert_eq!(e.path, "interfaces[1].name");
        assert!(e.message.contains("duplicate interface `kv`"), "{e}");
        let mut doc = redis();
        doc["interfaces"][0]["allow_multiple"] = json!(false);
        assert_eq!(ServiceDocument::from_json(doc).unwrap_err().path, "interfaces[0].max_connections");
        let mut doc = redis();
        doc["automator"] = json!("redis@1.0.0");
        assert_eq!(ServiceDocument::from_json(doc).unwrap_err().path, "service");
        let mut doc = redis();
        doc["interfaces"].as_array_mut().unwrap().push(json!({
            "name": "upstream", "role": "requires", "consumer_addresses": true,
            "versions": [{"version": "1.0.0", "schema": kv_schema(1)}]
        }));
        let e = ServiceDocument::from_json(doc).unwrap_err();
        assert_eq!(e.path, "interfaces[1].consumer_addresses", "{e}");
    }

    /// A consumer is told where its provider runs; a provider where its consumers run only when it
    /// asks, and a document that does not ask keeps its bytes (and digest) as before the field.
    #[test]
    fn providers_are_told_consumer_locations_only_when_they_ask() {
        let doc = ServiceDocument::from_json(redis()).unwrap();
        let kv = doc.interface("kv").unwrap();
        assert!(!kv.consumer_addresses && !kv.told_peer_location());
        assert!(
            serde_json::to_value(&doc).unwrap()["interfaces"][0]
                .get("consumer_addresses")
                .is_none()
        );
        let mut asks = redis();
        asks["interfaces"][0]["consumer_addresses"] = json!(true);
        let asks = ServiceDocument::from_json(asks).unwrap();
        assert!(asks.interface("kv").unwrap().told_peer_location());
        assert!(iface(Role::Requires, &[("1.0.0", 1)]).told_peer_location());
    }

    fn iface(role: Role, versions: &[(&str, u32)]) -> Interface {
        Interface {
            name: "x".into(),
            role,
            port: None,
            versions: versions
                .iter()
                .map(|(v, s)| InterfaceVersion {
                    version: v.to_string(),
                    schema: kv_schema(*s),
                })
                .collect(),
            allow_multiple: false,
            max_connections: None,
            consumer_addresses: false,
        }
    }

    #[test]
    fn the_highest_shared_version_is_chosen_and_mismatches_are_told_apart() {
        let provider = iface(Role::Provides, &[("1.0.0", 1), ("2.0.0", 2), ("3.0.0", 3)]);
        let consumer = iface(Role::Requires, &[("1.1.0", 1), ("2.5.0", 2)]);
        let agreed = negotiate(&consumer, &provider).unwrap();
        assert_eq!(agreed.version, "2.0.0");
        assert_eq!(agreed.id, canonical::digest(&kv_schema(2)));
        assert_eq!(negotiate(&provider, &consumer).unwrap(), agreed);
        assert_eq!(negotiate(&provider, &provider), Err(Mismatch::SameRole("provide")));
        let old = iface(Role::Requires, &[("0.1.0", 9)]);
        assert!(matches!(negotiate(&old, &provider), Err(Mismatch::NoSharedVersion { .. })));
    }
}

//! The service catalog: service versions ([`ServiceDocument`]) filed beside plugins.
//!
//! A service version is a JSON document stored as a blob like any other (addressed by the sha256
//! of the bytes published, verified on every read) and filed under `services/<name>/<version>.json`
//! as a [`ServiceEntry`], once: a `name@version` is never re-pointed. Before it is filed the
//! document must parse and validate ([`ServiceDocument::validate`]), its configuration schema and
//! every interface version's message schema must be JSON Schemas this registry can compile (no
//! reference leaves the document: the engine is built without file or network retrieval), and its
//! automator must be a published plugin of kind `automator`.

use orc_cluster::{ServiceDocument, ServiceError};
use orc_manifest::{Digest, PluginKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

use crate::error::{RegistryError, Result};
use crate::store::{Indexed, Store, check_version};

/// The index directory of service versions.
const SERVICES_DIR: &str = "services";

/// One published service version: what `services/<name>/<version>.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceEntry {
    pub name: String,
    pub version: String,
    /// The document's digest (the sha256 of the bytes published).
    pub digest: Digest,
    pub size: u64,
    #[serde(default)]
    pub description: String,
    /// The automator plugin that runs the service's processes.
    pub automator: Digest,
    #[serde(with = "time::serde::rfc3339")]
    pub published_at: OffsetDateTime,
}

impl ServiceEntry {
    /// `name@version`.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

impl Indexed for ServiceEntry {
    const DIR: &'static str = SERVICES_DIR;
    const WHAT: &'static str = "service";
    fn name(&self) -> &str {
        &self.name
    }
    fn version(&self) -> &str {
        &self.version
    }
    fn digest(&self) -> Digest {
        self.digest
    }
    fn check_name(name: &str) -> Result<()> {
        check_service_name(name)
    }
}

/// Validates a service name before it becomes a path component.
pub fn check_service_name(name: &str) -> Result<()> {
    orc_manifest::names::SERVICE.check(name).map_err(|e| {
        RegistryError::InvalidName(format!(
            "service name `{}`: {e} ({})",
            name.escape_debug(),
            orc_manifest::names::SERVICE.describe()
        ))
    })
}

/// The outcome of publishing a service version: its entry, and whether this call filed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedService {
    pub entry: ServiceEntry,
    pub created: bool,
}

/// Parses and validates a service document's bytes (structure only; see [`check_schemas`]).
pub fn parse_service(bytes: &[u8]) -> Result<ServiceDocument> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| RegistryError::InvalidService {
        path: "service".into(),
        message: format!("not a JSON document: {e}"),
    })?;
    ServiceDocument::from_json(value).map_err(invalid)
}

fn invalid(e: ServiceError) -> RegistryError {
    RegistryError::InvalidService {
        path: e.path,
        message: e.message,
    }
}

/// Compiles the document's schemas: the configuration schema and each interface version's.
pub fn check_schemas(doc: &ServiceDocument) -> Result<()> {
    let mut schemas = vec![("config_schema".to_string(), &doc.config_schema)];
    for (i, iface) in doc.interfaces.iter().enumerate() {
        for (j, v) in iface.versions.iter().enumerate() {
            schemas.push((format!("interfaces[{i}].versions[{j}].schema"), &v.schema));
        }
    }
    for (path, schema) in schemas {
        let refused = |message: String| RegistryError::InvalidService {
            path: path.clone(),
            message: format!("not a valid JSON Schema: {message}"),
        };
        jsonschema::meta::validate(schema).map_err(|e| refused(e.to_string()))?;
        jsonschema::validator_for(schema).map_err(|e| refused(e.to_string()))?;
    }
    Ok(())
}

impl Store {
    /// Publishes a service version from its JSON document. Publishing the same bytes again is a
    /// no-op; other bytes under a published `name@version` are refused with `VersionTaken`.
    pub fn publish_service(&self, bytes: &[u8]) -> Result<PublishedService> {
        self.check_size(bytes.len())?;
        let doc = parse_service(bytes)?;
        check_service_name(&doc.name)?;
        check_version(&doc.version)?;
        check_schemas(&doc)?;
        self.check_automator(&doc.automator)?;
        let entry = ServiceEntry {
            name: doc.name,
            version: doc.version,
            digest: Digest::of(bytes),
            size: bytes.len() as u64,
            description: doc.description,
            automator: doc.automator,
            published_at: OffsetDateTime::now_utc(),
        };
        let (entry, created) = self.file_entry(entry, bytes)?;
        Ok(PublishedService { entry, created })
    }

    /// The automator must be published, as an automator.
    fn check_automator(&self, digest: &Digest) -> Result<()> {
        let refused = |message: String| RegistryError::InvalidService {
            path: "automator".into(),
            message,
        };
        match self.list()?.into_iter().find(|e| e.digest == *digest) {
            Some(e) if e.kind == PluginKind::Automator => Ok(()),
            Some(e) => Err(refused(format!(
                "{digest} is {}@{}, a plugin of kind `{}`, not an automator",
                e.name,
                e.version,
                e.kind.as_str()
            ))),
            None => Err(refused(format!("{digest} is no plugin published in this registry"))),
        }
    }

    pub fn resolve_service(&self, name: &str, version: &str) -> Result<ServiceEntry> {
        self.resolve_in(name, version)
    }

    /// Every published version of service `name`, oldest first.
    pub fn service_versions(&self, name: &str) -> Result<Vec<ServiceEntry>> {
        self.versions_in(name)
    }

    /// Every service version, sorted by name then version.
    pub fn list_services(&self) -> Result<Vec<ServiceEntry>> {
        self.list_in()
    }

    /// The document `entry` files, read from its verified blob.
    pub fn service_document(&self, entry: &ServiceEntry) -> Result<ServiceDocument> {
        parse_service(&self.get_blob(&entry.digest)?)
    }
}

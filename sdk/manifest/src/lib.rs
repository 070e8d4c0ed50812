//! What a plugin artifact is: a WebAssembly component addressed by its sha256 [`Digest`], carrying
//! its [`Manifest`] in a custom section so that the digest covers the manifest too, and how a
//! plugin crate is turned into one ([`project`]).
//!
//! Shared by the registry (which indexes manifests), the host runtime (which links only the
//! capabilities a manifest requests) and the `orc-plugin` CLI and build scripts (which write it).

pub mod canonical;
mod digest;
pub mod names;
pub mod project;
mod section;

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use digest::{Digest, DigestError};
pub use section::{MANIFEST_SECTION, embed, extract};

/// An error with its sources, `: `-separated, for logs and for messages that must say why.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The WIT package every world of this version lives in.
pub const WIT_PACKAGE: &str = "orc:plugin@0.1.0";

/// The three kinds of plugin, one WIT world each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PluginKind {
    Adaptor,
    Solver,
    Automator,
}

impl PluginKind {
    pub const ALL: [PluginKind; 3] = [PluginKind::Adaptor, PluginKind::Solver, PluginKind::Automator];

    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Adaptor => "adaptor",
            PluginKind::Solver => "solver",
            PluginKind::Automator => "automator",
        }
    }

    /// The fully qualified world, e.g. `orc:plugin/adaptor@0.1.0`.
    pub fn world(self) -> String {
        format!("orc:plugin/{}@0.1.0", self.as_str())
    }

    /// The interface a component of this kind must export, e.g. `orc:plugin/resource-adaptor@0.1.0`.
    pub fn export_interface(self) -> String {
        let name = match self {
            PluginKind::Adaptor => "resource-adaptor",
            PluginKind::Solver => "cluster-solver",
            PluginKind::Automator => "service-automator",
        };
        format!("orc:plugin/{name}@0.1.0")
    }

    /// The capabilities a plugin of this kind may request at all.
    pub fn allowed_capabilities(self) -> &'static [Capability] {
        match self {
            PluginKind::Adaptor | PluginKind::Automator => &Capability::ALL,
            PluginKind::Solver => &[Capability::Log],
        }
    }
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PluginKind {
    type Err = ManifestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PluginKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| ManifestError::Invalid(format!("unknown plugin kind `{s}` (expected adaptor, solver or automator)")))
    }
}

/// What a plugin may be granted. Denied unless the manifest requests it and the environment
/// grants it; `log` is always granted. The `node` interface is one WIT interface serving two
/// capabilities: `node-files` (stat, read, write, directories, links, modes, owners) and
/// `node-commands` (`run`), because running a command reaches far more of a node than its
/// files do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Capability {
    Log,
    Kv,
    NodeFiles,
    NodeCommands,
    Http,
}

/// What a manifest written before `node` was split says: both parts.
const LEGACY_NODE: &str = "node";

impl Capability {
    pub const ALL: [Capability; 5] = [
        Capability::Log,
        Capability::Kv,
        Capability::NodeFiles,
        Capability::NodeCommands,
        Capability::Http,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Log => "log",
            Capability::Kv => "kv",
            Capability::NodeFiles => "node-files",
            Capability::NodeCommands => "node-commands",
            Capability::Http => "http",
        }
    }

    /// The WIT interface, e.g. `orc:plugin/node@0.1.0` (the same for both node capabilities).
    pub fn interface(self) -> String {
        let name = match self {
            Capability::NodeFiles | Capability::NodeCommands => LEGACY_NODE,
            other => other.as_str(),
        };
        format!("orc:plugin/{name}@0.1.0")
    }

    /// The capabilities an imported interface name serves (none if it is not one of ours).
    pub fn for_interface(name: &str) -> Vec<Capability> {
        Capability::ALL.into_iter().filter(|c| c.interface() == name).collect()
    }

    /// What a manifest's `capabilities` entry asks for: one capability, or both node ones for the
    /// `node` that manifests said before the split (so plugins built then keep loading).
    pub fn parse_requested(s: &str) -> Result<&'static [Capability], ManifestError> {
        if s == LEGACY_NODE {
            return Ok(&[Capability::NodeFiles, Capability::NodeCommands]);
        }
        Capability::ALL
            .iter()
            .position(|c| c.as_str() == s)
            .map(|i| std::slice::from_ref(&Capability::ALL[i]))
            .ok_or_else(|| {
                ManifestError::Invalid(format!(
                    "unknown capability `{s}` (expected log, kv, node-files, node-commands, http, or node for both node ones)"
                ))
            })
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Deserialises a list of requested capabilities, reading `node` as both node capabilities: for
/// manifests and registry entries written before the split.
pub fn deserialize_capabilities<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeSet<Capability>, D::Error> {
    let names = Vec::<String>::deserialize(d)?;
    let mut set = BTreeSet::new();
    for name in &names {
        set.extend(Capability::parse_requested(name).map_err(serde::de::Error::custom)?);
    }
    Ok(set)
}

/// What a plugin says about itself. Embedded in the component (see [`embed`]), so it is covered
/// by the component's digest and cannot be changed without changing the digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub name: String,
    pub version: String,
    pub kind: PluginKind,
    /// The world the component implements, e.g. `orc:plugin/adaptor@0.1.0`.
    pub world: String,
    /// Capabilities the plugin asks for.
    #[serde(default, deserialize_with = "deserialize_capabilities")]
    pub capabilities: BTreeSet<Capability>,
    /// For adaptors: the resource types it handles (`file`, `directory`).
    #[serde(default)]
    pub resource_types: Vec<String>,
    #[serde(default)]
    pub description: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("invalid manifest: {0}")]
    Invalid(String),
    #[error("manifest is not valid JSON")]
    Json(#[source] serde_json::Error),
    #[error("not a WebAssembly component")]
    NotWasm(#[source] wasmparser::BinaryReaderError),
    #[error("the component carries {0} `{MANIFEST_SECTION}` sections; exactly one is allowed")]
    Duplicate(usize),
}

impl Manifest {
    /// Checks names, versions, the world and the capabilities against the kind.
    pub fn validate(&self) -> Result<(), ManifestError> {
        validate_name(&self.name)?;
        validate_version(&self.version)?;
        if self.world != self.kind.world() {
            return Err(ManifestError::Invalid(format!(
                "world `{}` does not match kind `{}` (expected `{}`)",
                self.world,
                self.kind,
                self.kind.world()
            )));
        }
        let allowed = self.kind.allowed_capabilities();
        if let Some(c) = self.capabilities.iter().find(|c| !allowed.contains(c)) {
            return Err(ManifestError::Invalid(format!("a {} may not request capability `{c}`", self.kind)));
        }
        for t in &self.resource_types {
            validate_name(t)
                .map_err(|_| ManifestError::Invalid(format!("resource type `{t}` must be lowercase letters, digits and `-`")))?;
        }
        Ok(())
    }

    /// `name@version`.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a manifest always serialises")
    }

    pub fn from_json(text: &[u8]) -> Result<Manifest, ManifestError> {
        let m: Manifest = serde_json::from_slice(text).map_err(ManifestError::Json)?;
        m.validate()?;
        Ok(m)
    }
}

/// A plugin or resource-type name ([`names::PLUGIN`]).
pub fn validate_name(name: &str) -> Result<(), ManifestError> {
    names::PLUGIN
        .check(name)
        .map_err(|e| ManifestError::Invalid(format!("name `{}`: {e} ({})", name.escape_debug(), names::PLUGIN.describe())))
}

/// A version: `MAJOR.MINOR.PATCH` with an optional `-pre` or `+build` part of `[0-9A-Za-z.-]`.
pub fn validate_version(version: &str) -> Result<(), ManifestError> {
    let bad = || ManifestError::Invalid(format!("version `{}` is not MAJOR.MINOR.PATCH", version.escape_debug()));
    if version.len() > 64 {
        return Err(bad());
    }
    let (core, rest) = match version.find(['-', '+']) {
        Some(i) => (&version[..i], &version[i + 1..]),
        None => (version, ""),
    };
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() != 3 || parts.iter().any(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_digit())) {
        return Err(bad());
    }
    if !rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '+') {
        return Err(bad());
    }
    Ok(())
}

/// A key that orders versions like semver: numerically by `MAJOR.MINOR.PATCH`, a pre-release
/// before its release, then by the text (for validated versions; anything else sorts last).
pub fn version_order(version: &str) -> (u64, u64, u64, bool, &str) {
    let core_end = version.find(['-', '+']).unwrap_or(version.len());
    let mut parts = version[..core_end].split('.').map(|p| p.parse::<u64>().unwrap_or(u64::MAX));
    let mut next = || parts.next().unwrap_or(0);
    let (major, minor, patch) = (next(), next(), next());
    let release = !version[core_end..].starts_with('-');
    (major, minor, patch, release, &version[core_end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            name: "file".into(),
            version: "0.1.0".into(),
            kind: PluginKind::Adaptor,
            world: PluginKind::Adaptor.world(),
            capabilities: [Capability::NodeFiles].into(),
            resource_types: vec!["file".into()],
            description: "files".into(),
        }
    }

    #[test]
    fn versions_order_like_semver() {
        let mut v = vec!["1.10.0", "1.2.0", "1.2.0-alpha", "0.9.9", "1.2.0+build"];
        v.sort_by_key(|x| version_order(x));
        assert_eq!(v, ["0.9.9", "1.2.0-alpha", "1.2.0", "1.2.0+build", "1.10.0"]);
    }

    #[test]
    fn validates_names_versions_and_capabilities() {
        manifest().validate().unwrap();
        for bad in ["", "File", "../x", "a/b", "1abc", &"a".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        for good in ["1.2.3", "0.1.0-alpha.1", "1.0.0+build5"] {
            validate_version(good).unwrap();
        }
        for bad in ["1.2", "a.b.c", "1.2.3/..", ""] {
            assert!(validate_version(bad).is_err(), "{bad}");
        }
        let mut m = manifest();
        m.kind = PluginKind::Solver;
        m.world = PluginKind::Solver.world();
        let err = m.validate().unwrap_err().to_string();
        assert!(err.contains("may not request capability `node-files`"), "{err}");
        let mut m = manifest();
        m.world = "orc:plugin/solver@0.1.0".into();
        assert!(m.validate().unwrap_err().to_string().contains("does not match kind"));
    }

    #[test]
    fn a_manifest_saying_node_requests_both_node_capabilities() {
        let mut v: serde_json::Value = serde_json::from_str(&manifest().to_json()).unwrap();
        v["capabilities"] = serde_json::json!(["node", "kv"]);
        let m = Manifest::from_json(v.to_string().as_bytes()).unwrap();
        let both = [Capability::Kv, Capability::NodeFiles, Capability::NodeCommands].into();
        assert_eq!(m.capabilities, both);
        assert!(m.to_json().contains("\"node-commands\""), "written in the new form");
        v["capabilities"] = serde_json::json!(["nodes"]);
        let err = Manifest::from_json(v.to_string().as_bytes()).unwrap_err();
        assert!(format!("{err}: {err:?}").contains("unknown capability `nodes`"));
    }

    #[test]
    fn unknown_manifest_keys_are_refused() {
        let mut v: serde_json::Value = serde_json::from_str(&manifest().to_json()).unwrap();
        v["surprise"] = true.into();
        let err = Manifest::from_json(v.to_string().as_bytes()).unwrap_err();
        assert!(format!("{err}: {:?}", err).contains("surprise"));
    }
}

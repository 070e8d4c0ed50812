//! Pinning an intent's adaptors: every `PluginRef` (`name@version`, bare name, digest) is resolved
//! to a stored digest and loaded, and each resource's type is checked against what its adaptor
//! handles. Shared by the embedded deploy and the server, so both accept and refuse the same
//! intents with the same errors.

use std::collections::HashMap;
use std::sync::Arc;

use orc_manifest::{Digest, PluginKind};
use orc_registry::{RegistryError, Store};
use orc_runtime::{Grants, LoadError, Plugin, Runtime};

use crate::intent::{Intent, IntentDocument, PluginRef, ResourceId};

/// The node every environment has until remote nodes arrive: the host's own machine, confined
/// to a root directory.
pub const LOCAL_NODE: &str = "local";

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("resource `{resource}` names adaptor `{reference}`, which is not in the registry")]
    UnknownPlugin { resource: ResourceId, reference: PluginRef },
    #[error("the local registry")]
    Registry(#[source] RegistryError),
    #[error("resource `{resource}` has type `{resource_type}`, but adaptor `{plugin}` handles only {handles}")]
    WrongResourceType {
        resource: ResourceId,
        resource_type: String,
        plugin: String,
        handles: String,
    },
    #[error(
        "resource `{resource}`: plugin `{plugin}` ({digest}) requests capability `{capability}`, which this environment does not grant: set `{setting}` to true to allow it",
        setting = crate::policy::settings::CapabilitySettings::setting(*capability)
    )]
    NotGranted {
        resource: ResourceId,
        plugin: String,
        digest: Digest,
        capability: orc_manifest::Capability,
    },
    #[error("resource `{resource}`: cannot load its adaptor")]
    Load {
        resource: ResourceId,
        #[source]
        source: LoadError,
    },
}

/// The adaptors of an intent: one per resource (by index), and each reference's pin.
#[derive(Debug)]
pub struct Pinned {
    pub plugins: Vec<Arc<Plugin>>,
    pub by_reference: HashMap<PluginRef, Arc<Plugin>>,
}

impl Pinned {
    /// The intent with every adaptor reference replaced by its digest: what a server stores.
    pub fn pinned_document(&self, intent: &Intent) -> IntentDocument {
        IntentDocument {
            resources: intent
                .resources
                .iter()
                .zip(&self.plugins)
                .map(|(r, p)| {
                    let mut r = r.clone();
                    r.adaptor = PluginRef::Digest(p.digest);
                    r
                })
                .collect(),
        }
    }
}

/// Resolves and loads every adaptor `intent` names (each reference once) with `grants` (the
/// environment's `capabilities`): a plugin requesting one not granted is refused here, at
/// submission, release and resume alike ([`PinError::NotGranted`]).
pub async fn load_adaptors(intent: &Intent, registry: &Store, runtime: &Runtime, grants: &Grants) -> Result<Pinned, PinError> {
    let mut by_reference: HashMap<PluginRef, Arc<Plugin>> = HashMap::new();
    let mut plugins = Vec::with_capacity(intent.resources.len());
    for r in &intent.resources {
        if !by_reference.contains_key(&r.adaptor) {
            let digest = resolve(registry, &r.adaptor).map_err(|e| match e {
                RegistryError::NotFound { .. } | RegistryError::UnknownDigest(_) => PinError::UnknownPlugin {
                    resource: r.id.clone(),
                    reference: r.adaptor.clone(),
                },
                other => PinError::Registry(other),
            })?;
            // Cluster tasks run through automators; everything else through adaptors.
            let kind = if r.id.resource_type == crate::clusters::planner::TASK_TYPE {
                PluginKind::Automator
            } else {
                PluginKind::Adaptor
            };
            let plugin = runtime.load(&digest, kind, registry, grants).await.map_err(|source| match source {
                // The runtime refuses a plugin requesting what the grants lack; said here with
                // the resource and the setting that would allow it.
                LoadError::NotGranted { digest, name, capability } => PinError::NotGranted {
                    resource: r.id.clone(),
                    plugin: name,
                    digest,
                    capability,
                },
                source => PinError::Load {
                    resource: r.id.clone(),
                    source,
                },
            })?;
            by_reference.insert(r.adaptor.clone(), plugin);
        }
        let plugin = by_reference[&r.adaptor].clone();
        let handles = &plugin.manifest.resource_types;
        if !handles.is_empty() && !handles.contains(&r.id.resource_type) {
            return Err(PinError::WrongResourceType {
                resource: r.id.clone(),
                resource_type: r.id.resource_type.clone(),
                plugin: plugin.manifest.reference(),
                handles: handles.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", "),
            });
        }
        plugins.push(plugin);
    }
    Ok(Pinned { plugins, by_reference })
}

/// Whether a plugin works on nodes (its resources' node part names a node, not an API): it
/// requests either node capability.
pub fn uses_nodes(manifest: &orc_manifest::Manifest) -> bool {
    manifest
        .capabilities
        .iter()
        .any(|c| matches!(c, orc_manifest::Capability::NodeFiles | orc_manifest::Capability::NodeCommands))
}

/// `name@version`, a bare name (highest version) or a digest → the digest, which must be stored.
pub fn resolve(store: &Store, reference: &PluginRef) -> Result<Digest, RegistryError> {
    match reference {
        PluginRef::Digest(d) => {
            if store.has_blob(d)? {
                Ok(*d)
            } else {
                Err(RegistryError::UnknownDigest(*d))
            }
        }
        PluginRef::Named { name, version: Some(v) } => Ok(store.resolve(name, v)?.digest),
        PluginRef::Named { name, version: None } => store
            .versions(name)?
            .pop()
            .map(|e| e.digest)
            .ok_or_else(|| RegistryError::NotFound {
                what: format!("plugin `{name}`"),
            }),
    }
}

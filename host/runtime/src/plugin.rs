//! A loaded plugin: its digest, manifest, the capabilities it was linked with, and the
//! pre-instantiated component of its kind, ready to be instantiated per call.

use std::sync::Arc;

use orc_manifest::{Digest, Manifest, PluginKind};
use wasmtime::component::{Component, Linker};

use crate::bindings::{adaptor::AdaptorPre, automator::AutomatorPre, solver::SolverPre};
use crate::capability::CapabilitySet;
use crate::engine::Runtime;
use crate::error::LoadError;
use crate::state::CallState;

pub(crate) enum KindPre {
    Adaptor(AdaptorPre<CallState>),
    Solver(SolverPre<CallState>),
    Automator(AutomatorPre<CallState>),
}

/// A plugin ready to be called. Obtained from [`Runtime::load`]; shared behind an `Arc`.
pub struct Plugin {
    pub digest: Digest,
    pub manifest: Manifest,
    /// The runtime's engine and limits, not the runtime itself: the runtime keeps its loaded
    /// plugins, so a plugin holding the runtime would keep both alive for ever (a cycle).
    pub(crate) engine: wasmtime::Engine,
    pub(crate) config: crate::engine::RuntimeConfig,
    pub(crate) capabilities: CapabilitySet,
    pub(crate) pre: KindPre,
    pub(crate) name: Arc<str>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("digest", &self.digest)
            .field("manifest", &self.manifest)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    pub(crate) fn new(
        runtime: Runtime,
        digest: Digest,
        manifest: Manifest,
        capabilities: CapabilitySet,
        component: &Component,
        linker: &Linker<CallState>,
    ) -> Result<Plugin, LoadError> {
        let link_err = |e: wasmtime::Error| LoadError::Link {
            digest,
            name: manifest.reference(),
            message: format!("{e:#}"),
        };
        let instance_pre = linker.instantiate_pre(component).map_err(link_err)?;
        let pre = match manifest.kind {
            PluginKind::Adaptor => KindPre::Adaptor(AdaptorPre::new(instance_pre).map_err(link_err)?),
            PluginKind::Solver => KindPre::Solver(SolverPre::new(instance_pre).map_err(link_err)?),
            PluginKind::Automator => KindPre::Automator(AutomatorPre::new(instance_pre).map_err(link_err)?),
        };
        let name: Arc<str> = manifest.reference().into();
        Ok(Plugin {
            digest,
            manifest,
            engine: runtime.inner.engine.clone(),
            config: runtime.inner.config.clone(),
            capabilities,
            pre,
            name,
        })
    }

    /// The capabilities this plugin was linked with (requested ∩ granted, plus `log`).
    pub fn linked_capabilities(&self) -> Vec<orc_manifest::Capability> {
        self.capabilities.iter().collect()
    }
}

//! Host capabilities, one module each, in the manner of Spin's factors: each module adds its
//! interface to a linker and implements it over the per-call state. A capability is linked only
//! when the plugin's manifest requests it and the environment grants it ([`Grants`]); `log` is
//! always linked. WASI is linked with an empty context: no preopened directories, no environment,
//! no sockets, no name lookups.

pub mod http;
pub mod kv;
mod log;
mod node;

use std::sync::Arc;
use std::time::Duration;

use orc_manifest::{Capability, Manifest};
use orc_node::{CommandLimits, NodeDirectory, Nodes};
use wasmtime::Engine;
use wasmtime::component::{HasSelf, Linker};

use crate::bindings::host::orc::plugin as wit;
use crate::state::CallState;

pub use http::{AddressKind, AddressPolicy, BoundSecret, HttpAccess, HttpPolicy, IpNet, Origin, list_origins};
pub use kv::{DirKv, KvAccounts, KvError, KvQuota, KvStore, KvUsage, MemoryKv};

/// A set of capabilities, as a bitmask (cheap to copy and hash as a map key).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CapabilitySet(u8);

impl CapabilitySet {
    fn bit(c: Capability) -> u8 {
        1 << Capability::ALL.iter().position(|x| *x == c).expect("listed")
    }

    pub fn with(self, c: Capability) -> CapabilitySet {
        CapabilitySet(self.0 | Self::bit(c))
    }

    pub fn contains(self, c: Capability) -> bool {
        self.0 & Self::bit(c) != 0
    }

    pub fn iter(self) -> impl Iterator<Item = Capability> {
        Capability::ALL.into_iter().filter(move |c| self.contains(*c))
    }
}

/// What an environment's policy allows plugins to use. `log` is always allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    set: CapabilitySet,
}

impl Grants {
    /// Only `log`.
    pub fn none() -> Grants {
        Grants {
            set: CapabilitySet::default().with(Capability::Log),
        }
    }

    pub fn all() -> Grants {
        Capability::ALL.into_iter().fold(Grants::none(), |g, c| g.with(c))
    }

    pub fn with(mut self, c: Capability) -> Grants {
        self.set = self.set.with(c);
        self
    }

    pub fn allows(&self, c: Capability) -> bool {
        c == Capability::Log || self.set.contains(c)
    }

    /// What a plugin with `manifest` gets under these grants: requested ∩ granted, plus `log`.
    pub fn effective(&self, manifest: &Manifest) -> CapabilitySet {
        manifest
            .capabilities
            .iter()
            .filter(|c| self.allows(**c))
            .fold(CapabilitySet::default().with(Capability::Log), |s, c| s.with(*c))
    }
}

/// Everything a call may reach, handed in by the host per call (or shared by many calls).
#[derive(Clone)]
pub struct CallContext {
    /// The environment the call runs for; scopes the plugin's `kv`.
    pub environment: String,
    pub kv: Arc<dyn KvStore>,
    /// What the environment's plugins may keep in `kv`, all of them together.
    pub kv_quota: KvQuota,
    pub nodes: Arc<dyn NodeDirectory>,
    /// How commands on the local node are confined.
    pub command_limits: CommandLimits,
    pub http: Arc<HttpAccess>,
    /// Overrides the runtime's default deadline.
    pub deadline: Option<Duration>,
    /// Overrides the runtime's default memory limit (it cannot exceed the pool's slot size).
    pub memory_limit_bytes: Option<usize>,
}

impl std::fmt::Debug for CallContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallContext")
            .field("environment", &self.environment)
            .finish_non_exhaustive()
    }
}

impl CallContext {
    /// A context with an in-memory `kv`, no nodes and no outgoing HTTP.
    pub fn new(environment: impl Into<String>) -> CallContext {
        CallContext {
            environment: environment.into(),
            kv: Arc::new(MemoryKv::default()),
            kv_quota: KvQuota::default(),
            nodes: Arc::new(Nodes::default()),
            command_limits: CommandLimits::default(),
            http: Arc::new(HttpAccess::deny_all()),
            deadline: None,
            memory_limit_bytes: None,
        }
    }
}

/// Whether an import is a WASI interface (linked with an empty context).
pub(crate) fn is_wasi_import(name: &str) -> bool {
    name.starts_with("wasi:")
}

/// A linker with WASI (empty context) and exactly the capabilities in `caps`. The `node`
/// interface is linked whole when either node capability is in `caps`; the functions of the part
/// not granted refuse at call time (`CallState::node_part`), a second line behind the refusal
/// at submission and at load.
pub(crate) fn linker(engine: &Engine, caps: CapabilitySet) -> wasmtime::Result<Linker<CallState>> {
    let mut linker = Linker::<CallState>::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wit::types::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |s| s)?;
    if caps.contains(Capability::Log) {
        wit::log::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |s| s)?;
    }
    if caps.contains(Capability::Kv) {
        wit::kv::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |s| s)?;
    }
    if caps.contains(Capability::NodeFiles) || caps.contains(Capability::NodeCommands) {
        wit::node::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |s| s)?;
    }
    if caps.contains(Capability::Http) {
        wit::http::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |s| s)?;
    }
    Ok(linker)
}

/// Refuses a node function whose part (`node-files` or `node-commands`) the plugin was not
/// linked with: the `node` interface is one interface for both parts.
pub(crate) fn check_node_part(caps: CapabilitySet, part: Capability) -> Result<(), wit::types::Error> {
    if caps.contains(part) {
        Ok(())
    } else {
        Err(wit_error(
            wit::types::ErrorKind::Denied,
            format!("capability `{part}` is not granted to this plugin"),
        ))
    }
}

/// The WIT error type, built from its parts.
pub(crate) fn wit_error(kind: wit::types::ErrorKind, message: impl Into<String>) -> wit::types::Error {
    wit::types::Error {
        kind,
        message: message.into(),
    }
}

impl wit::types::Host for CallState {}

//! The runtime's errors: why a plugin could not be loaded, and how a call went wrong.

use std::time::Duration;

use orc_manifest::{Capability, Digest, PluginKind};

/// Why a plugin could not be loaded. Each names the plugin (by digest) and the culprit.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot fetch plugin {digest}")]
    Fetch {
        digest: Digest,
        #[source]
        source: Box<orc_registry::RegistryError>,
    },
    #[error("refusing plugin: bytes hash to {actual}, not to the requested {expected}")]
    DigestMismatch { expected: Digest, actual: Digest },
    #[error("plugin {digest} carries no manifest: build it with `orc-plugin build`")]
    NoManifest { digest: Digest },
    #[error("plugin {digest} has an invalid manifest")]
    Manifest {
        digest: Digest,
        #[source]
        source: orc_manifest::ManifestError,
    },
    #[error("plugin {digest} (`{name}`) is a {actual}, not a {expected}")]
    WrongKind {
        digest: Digest,
        name: String,
        expected: PluginKind,
        actual: PluginKind,
    },
    #[error("plugin {digest} (`{name}`) does not implement the {kind} world: it exports [{exports}] but must export `{required}`")]
    WrongWorld {
        digest: Digest,
        name: String,
        kind: PluginKind,
        exports: String,
        required: String,
    },
    #[error("plugin {digest} (`{name}`) imports `{interface}`, but its manifest does not request capability {capability}")]
    NotRequested {
        digest: Digest,
        name: String,
        interface: String,
        /// The capabilities the interface serves, quoted (`node-files` or `node-commands`).
        capability: String,
    },
    #[error("plugin {digest} (`{name}`) needs capability `{capability}`, which this environment does not grant")]
    NotGranted {
        digest: Digest,
        name: String,
        capability: Capability,
    },
    #[error("plugin {digest} (`{name}`) imports `{interface}`, which the host does not provide")]
    UnknownImport { digest: Digest, name: String, interface: String },
    #[error("plugin {digest} is not a valid component: {message}")]
    Compile { digest: Digest, message: String },
    #[error("plugin {digest} (`{name}`) cannot be linked: {message}")]
    Link { digest: Digest, name: String, message: String },
}

/// The kind of an error a plugin returned (mirrors the WIT `error-kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PluginErrorKind {
    InvalidInput,
    Unavailable,
    Retryable,
    Permanent,
    Denied,
}

/// An error a plugin returned on purpose.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("{kind:?}: {message}")]
pub struct PluginError {
    pub kind: PluginErrorKind,
    pub message: String,
}

/// How a call went wrong. The runtime keeps serving after every one of these.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The plugin returned an error.
    #[error("plugin `{plugin}` failed: {error}")]
    Failed { plugin: String, error: PluginError },
    /// The plugin trapped (a panic, `unreachable`, an out-of-bounds access).
    #[error("plugin `{plugin}` crashed: {message}")]
    Crashed { plugin: String, message: String },
    /// The call ran past its deadline and was interrupted.
    #[error("plugin `{plugin}` timed out after {after:?}")]
    TimedOut { plugin: String, after: Duration },
    /// The plugin tried to grow its memory past the limit.
    #[error("plugin `{plugin}` exceeded its memory limit of {limit_bytes} bytes")]
    MemoryLimit { plugin: String, limit_bytes: usize },
    /// The plugin returned something the host cannot use (e.g. invalid JSON).
    #[error("plugin `{plugin}` returned invalid output: {message}")]
    InvalidOutput { plugin: String, message: String },
    /// The host could not run the call (instance limit reached, instance poisoned by an earlier trap).
    #[error("cannot run plugin `{plugin}`: {message}")]
    Host { plugin: String, message: String },
}

impl CallError {
    /// A stable machine-readable code: `failed`, `crashed`, `timed_out`, `memory_limit`,
    /// `invalid_output`, `host`.
    pub fn code(&self) -> &'static str {
        match self {
            CallError::Failed { .. } => "failed",
            CallError::Crashed { .. } => "crashed",
            CallError::TimedOut { .. } => "timed_out",
            CallError::MemoryLimit { .. } => "memory_limit",
            CallError::InvalidOutput { .. } => "invalid_output",
            CallError::Host { .. } => "host",
        }
    }

    /// The plugin's own error, when it returned one.
    pub fn plugin_error(&self) -> Option<&PluginError> {
        match self {
            CallError::Failed { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// The Wasm engine could not be set up (e.g. the pooling allocator could not reserve memory).
#[derive(Debug, thiserror::Error)]
#[error("cannot start the Wasm engine: {0}")]
pub struct EngineError(pub String);

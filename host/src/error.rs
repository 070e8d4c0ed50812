//! Why a request about environments could not be served ([`EnvError`]): messages are safe for
//! clients, sources carry the detail. Below the application layer so that the domain modules
//! (clusters, processes, nodes) can wrap it without importing `crate::app`.

use std::path::PathBuf;

use crate::intent::pinning::PinError;
use crate::intent::{IntentError, ResourceId};
use crate::store::StoreError;

/// Why a request about environments could not be served. Messages are safe for clients; the
/// sources carry the internal detail.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("environment `{0}` does not exist")]
    UnknownEnvironment(String),
    #[error("invalid environment name `{name}`: {reason}")]
    InvalidName { name: String, reason: String },
    #[error(transparent)]
    Intent(#[from] IntentError),
    /// Boxed: a load error is large, and this error travels through every request.
    #[error(transparent)]
    Pin(Box<PinError>),
    #[error("resource `{resource}` is on node `{node}`, which is not registered (nodes: `local` and those of /api/v1/nodes)")]
    UnknownNode { resource: ResourceId, node: String },
    #[error(
        "resource `{resource}` is on node `{node}`, which is private to another environment and not allowed for environment `{environment}`"
    )]
    NodeNotAllowed {
        resource: ResourceId,
        node: String,
        environment: String,
    },
    #[error("invalid settings: {0}")]
    InvalidSettings(String),
    #[error(
        "`{setting}` cannot be turned off: the released version of environment `{environment}` uses capability `{capability}` (resources {resources}); release a version without them first"
    )]
    CapabilityInUse {
        environment: String,
        setting: &'static str,
        capability: orc_manifest::Capability,
        /// The first few resources, quoted.
        resources: String,
    },
    #[error("resource `{0}`: the type `task` is reserved for the tasks of clusters (see /api/v1/environments/{{env}}/clusters)")]
    ReservedType(ResourceId),
    #[error("environment `{0}` has no intent version yet")]
    NoVersion(String),
    #[error("{0}")]
    InvalidResourceSet(String),
    /// An `If-Match` names what is no longer current; the message says what is.
    #[error("{0} (If-Match): read it again")]
    VersionConflict(String),
    #[error("resource `{resource}` is claimed by set `{set}` and by {other}")]
    SetConflict { resource: String, set: String, other: String },
    #[error("the intent has {count} resources; environment `{environment}` takes at most {limit} (`limits.max_resources_per_intent`)")]
    TooManyResources { environment: String, count: usize, limit: u64 },
    /// Past one of the environment's rate limits: nothing was done; try again after `retry_after_s`.
    #[error("{what}; try again in {retry_after_s} s")]
    RateLimited { what: String, retry_after_s: u64 },
    /// The environment's scheduler stopped on its own (see its log): nothing that needs it can
    /// be done until the host is restarted.
    #[error("the scheduler of environment `{environment}` is not running ({reason}); restart the host")]
    SchedulerUnavailable { environment: String, reason: String },
    /// Another replica runs the environment (`owner`: where its API listens), or none does
    /// right now (`None`: one is taking it over).
    #[error("{}", elsewhere(environment, owner.as_deref()))]
    Elsewhere { environment: String, owner: Option<String> },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot prepare the node root {path}")]
    NodeRoot {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl From<PinError> for EnvError {
    fn from(e: PinError) -> EnvError {
        EnvError::Pin(Box::new(e))
    }
}

fn elsewhere(environment: &str, owner: Option<&str>) -> String {
    match owner {
        Some(owner) => format!("environment `{environment}` is run by the replica at {owner}: send the request there"),
        None => format!("environment `{environment}` is between replicas (one is taking it over): try again in a moment"),
    }
}

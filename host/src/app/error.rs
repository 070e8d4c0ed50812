//! Why the host could not open ([`StartError`]), and why a request about users, roles, tokens
//! or the audit trail could not be served ([`AccessError`]). Requests about environments fail
//! with [`crate::error::EnvError`], which every layer below the application may name too.

use std::net::SocketAddr;
use std::path::PathBuf;

use orc_registry::RegistryError;
use orc_runtime::EngineError;

use crate::error::EnvError;
use crate::nodes::SecretError;
use crate::policy::outbound;
use crate::store::StoreError;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot prepare the data directory {path}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    DataDirInUse(#[from] crate::data_dir::DataDirError),
    #[error("cannot open the database")]
    Store(#[from] StoreError),
    #[error("cannot open the plugin registry")]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("cannot load the host's secret key")]
    Secret(#[from] SecretError),
    #[error("cannot load the host-held secrets")]
    HostSecrets(#[from] outbound::SecretError),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Why a request about users, roles, tokens or the audit trail could not be served.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("user `{0}` does not exist")]
    UnknownUser(String),
    #[error("token {0} does not exist")]
    UnknownToken(String),
    #[error("invalid user: `{field}` {reason}")]
    InvalidUser { field: &'static str, reason: String },
    #[error("invalid `password`: {0}")]
    Password(#[from] crate::access::password::PasswordError),
    #[error("invalid `scope`: {0}")]
    InvalidScope(String),
    /// A name and password that do not match a user that may sign in (which of them is wrong is
    /// not said).
    #[error("wrong user name or password, or the user is disabled")]
    WrongCredentials,
    /// Signing in was throttled, or the password pool is full: nothing was checked.
    #[error(transparent)]
    SignIn(#[from] super::sign_in::Refusal),
    #[error("{0}")]
    Environment(#[from] EnvError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

//! `StoreError`: the one error type of the persistence layer. Each message names what it was about
//! (the environment, version, resource, report or token), never the SQL; the database's own error
//! stays in the source chain for the log.

use std::borrow::Cow;

use super::Backend;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The thing asked for does not exist (`environment 1b4e…`, `version 7 of environment …`).
    #[error("{what} not found")]
    NotFound { what: String },
    /// The write would break a uniqueness or state rule (`an environment named "prod" already exists`).
    #[error("{what}")]
    Conflict { what: String },
    /// The database failed or refused; `context` says what the store was doing.
    #[error("database error while {context}")]
    Backend {
        context: Cow<'static, str>,
        #[source]
        source: sqlx::Error,
    },
    /// The schema migrations could not be applied.
    #[error("cannot apply the {backend} schema migrations")]
    Migrate {
        backend: Backend,
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    /// A stored value that this version of orc cannot read (an unknown status, unparsable settings).
    #[error("corrupt data in the store: {what}")]
    Corrupt { what: String },
    /// A write for an environment under an epoch that is no longer its own: another replica
    /// took the environment over (`current`), or it was deleted (`None`). Nothing was written;
    /// the writer must stop acting for the environment.
    #[error(
        "environment {env} is owned under epoch {} now, not {epoch}: another replica took it over",
        current.map(|c| c.to_string()).unwrap_or_else(|| "none (deleted)".into())
    )]
    Fenced {
        env: super::EnvironmentId,
        epoch: i64,
        current: Option<i64>,
    },
    /// The database location given to `Store::connect` is not one the store understands.
    #[error("invalid database location {location}: {reason}")]
    Config { location: String, reason: String },
}

impl StoreError {
    pub(crate) fn not_found(what: impl Into<String>) -> StoreError {
        StoreError::NotFound { what: what.into() }
    }

    pub(crate) fn corrupt(what: impl Into<String>) -> StoreError {
        StoreError::Corrupt { what: what.into() }
    }

    /// True when the database rejected the write for naming a row that does not exist.
    pub(crate) fn is_foreign_key_violation(&self) -> bool {
        matches!(self, StoreError::Backend { source: sqlx::Error::Database(e), .. } if e.is_foreign_key_violation())
    }

    /// True when the database rejected the write for breaking a unique constraint.
    pub(crate) fn is_unique_violation(&self) -> bool {
        matches!(self, StoreError::Backend { source: sqlx::Error::Database(e), .. } if e.is_unique_violation())
    }
}

/// `map_err(backend("listing environments"))`: wraps a `sqlx::Error` with what the store was doing.
/// Takes a `&'static str` so the success path allocates nothing; see [`backend_with`].
pub(crate) fn backend(context: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Backend {
        context: Cow::Borrowed(context),
        source,
    }
}

/// Like [`backend`], with a context built only when the error happens.
pub(crate) fn backend_with(context: impl FnOnce() -> String) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Backend {
        context: Cow::Owned(context()),
        source,
    }
}

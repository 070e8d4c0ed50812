//! Processes and connections. A process is one row per process of an environment, holding the
//! process manager's JSON document (which the store never reads), its state name, and a revision
//! counting its changes — the process's ETag: an update or delete naming another revision is
//! refused (`Conflict`), so two writers cannot both change what one of them read. A connection
//! is immutable once made: one row per link between two processes' interfaces.

use super::environments::environment_not_found;
use super::error::backend_with;
use super::{EnvironmentId, Millis, Result, Store, StoreError, now_ms};

/// A connection between two processes' interfaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionRecord {
    /// A UUID.
    pub id: String,
    pub from_process: String,
    pub from_interface: String,
    pub to_process: String,
    pub to_interface: String,
    /// The interface version both sides agreed on (the provider's label).
    pub version: String,
    /// `sha256:` of that version's message schema.
    pub interface_id: String,
    pub created_by: Option<String>,
    pub created_at: Millis,
}

type ConnectionRow = (String, String, String, String, String, String, String, Option<String>, i64);

macro_rules! connection_columns {
    () => {
        "id, from_process, from_interface, to_process, to_interface, version, interface_id, created_by, created_at"
    };
}

fn connection(row: ConnectionRow) -> ConnectionRecord {
    let (id, from_process, from_interface, to_process, to_interface, version, interface_id, created_by, created_at) = row;
    ConnectionRecord {
        id,
        from_process,
        from_interface,
        to_process,
        to_interface,
        version,
        interface_id,
        created_by,
        created_at,
    }
}

/// A process as the process manager stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRecord {
    pub name: String,
    /// The manager's state name; the store does not interpret it.
    pub state: String,
    /// The manager's JSON text.
    pub document: String,
    /// 1 when inserted, one more on every update.
    pub revision: i64,
    pub created_at: Millis,
    pub updated_at: Millis,
}

type ProcessRow = (String, String, String, i64, i64, i64);

macro_rules! process_columns {
    () => {
        "name, state, document, revision, created_at, updated_at"
    };
}

fn process((name, state, document, revision, created_at, updated_at): ProcessRow) -> ProcessRecord {
    ProcessRecord {
        name,
        state,
        document,
        revision,
        created_at,
        updated_at,
    }
}

fn process_not_found(env: &EnvironmentId, name: &str) -> StoreError {
    StoreError::not_found(format!("process `{name}` in environment {env}"))
}

fn stale(name: &str, expected: i64, current: i64) -> StoreError {
    StoreError::Conflict {
        what: format!("process `{name}` is at revision {current}, not {expected}"),
    }
}

impl Store {
    /// Stores a new process at revision 1. Conflict when one of that name exists; NotFound when
    /// the environment does not.
    pub async fn insert_process(&self, env: &EnvironmentId, name: &str, state: &str, document: &str) -> Result<ProcessRecord> {
        let _turn = self.write_turn().await?;
        let now = now_ms();
        let inserted = on_pool!(self, pool => {
            sqlx::query(concat!("INSERT INTO processes (environment_id, ", process_columns!(), ") VALUES ($1, $2, $3, $4, 1, $5, $5)"))
                .bind(env.to_string())
                .bind(name)
                .bind(state)
                .bind(document)
                .bind(now)
                .execute(pool)
                .await
                .map(drop)
        });
        match inserted {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(StoreError::Conflict {
                what: format!("a process named `{name}` already exists in environment {env}"),
            }),
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => Err(environment_not_found(env)),
            Err(e) => Err(backend_with(|| format!("storing process `{name}` in environment {env}"))(e)),
            Ok(()) => Ok(ProcessRecord {
                name: name.to_string(),
                state: state.to_string(),
                document: document.to_string(),
                revision: 1,
                created_at: now,
                updated_at: now,
            }),
        }
    }

    /// Process `name`; `None` when there is none (a name holding NUL names none: no backend
    /// stores one).
    pub async fn find_process(&self, env: &EnvironmentId, name: &str) -> Result<Option<ProcessRecord>> {
        if name.contains('\0') {
            return Ok(None);
        }
        let row: Option<ProcessRow> = on_pool!(self, pool => {
            sqlx::query_as(concat!("SELECT ", process_columns!(), " FROM processes WHERE environment_id = $1 AND name = $2"))
                .bind(env.to_string())
                .bind(name)
                .fetch_optional(pool)
                .await
                .map_err(backend_with(|| format!("reading process `{name}` in environment {env}")))?
        });
        Ok(row.map(process))
    }

    /// Every process of the environment, by name.
    pub async fn list_processes(&self, env: &EnvironmentId) -> Result<Vec<ProcessRecord>> {
        let rows: Vec<ProcessRow> = on_pool!(self, pool => {
            sqlx::query_as(concat!("SELECT ", process_columns!(), " FROM processes WHERE environment_id = $1 ORDER BY name"))
                .bind(env.to_string())
                .fetch_all(pool)
                .await
                .map_err(backend_with(|| format!("listing the processes of environment {env}")))?
        });
        Ok(rows.into_iter().map(process).collect())
    }

    /// Replaces the state and document of process `name` if it is still at revision
    /// `expected`, and answers the stored record (one revision more). Conflict naming the
    /// current revision when it moved on; NotFound when the process is gone.
    pub async fn update_process(
        &self,
        env: &EnvironmentId,
        name: &str,
        expected: i64,
        state: &str,
        document: &str,
    ) -> Result<ProcessRecord> {
        let _turn = self.write_turn().await?;
        let updated: Option<ProcessRow> = on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "UPDATE processes SET state = $3, document = $4, revision = revision + 1, updated_at = $5 \
                 WHERE environment_id = $1 AND name = $2 AND revision = $6 RETURNING ",
                process_columns!()
            ))
            .bind(env.to_string())
            .bind(name)
            .bind(state)
            .bind(document)
            .bind(now_ms())
            .bind(expected)
            .fetch_optional(pool)
            .await
            .map_err(backend_with(|| format!("updating process `{name}` in environment {env}")))?
        });
        match updated {
            Some(row) => Ok(process(row)),
            None => match self.find_process(env, name).await? {
                Some(current) => Err(stale(name, expected, current.revision)),
                None => Err(process_not_found(env, name)),
            },
        }
    }

    /// Deletes process `name` if it is still at revision `expected`.
    pub async fn delete_process(&self, env: &EnvironmentId, name: &str, expected: i64) -> Result<()> {
        let _turn = self.write_turn().await?;
        let deleted = on_pool!(self, pool => {
            sqlx::query("DELETE FROM processes WHERE environment_id = $1 AND name = $2 AND revision = $3")
                .bind(env.to_string())
                .bind(name)
                .bind(expected)
                .execute(pool)
                .await
                .map_err(backend_with(|| format!("deleting process `{name}` in environment {env}")))?
                .rows_affected()
        });
        if deleted == 0 {
            return match self.find_process(env, name).await? {
                Some(current) => Err(stale(name, expected, current.revision)),
                None => Err(process_not_found(env, name)),
            };
        }
        Ok(())
    }
}

impl Store {
    /// Stores a connection. Conflict when the same interfaces of the same processes are
    /// connected already; NotFound when the environment does not exist.
    pub async fn insert_connection(&self, env: &EnvironmentId, c: &ConnectionRecord) -> Result<()> {
        let _turn = self.write_turn().await?;
        let inserted = on_pool!(self, pool => {
            sqlx::query(concat!(
                "INSERT INTO connections (environment_id, ", connection_columns!(), ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
            ))
            .bind(env.to_string())
            .bind(&c.id)
            .bind(&c.from_process)
            .bind(&c.from_interface)
            .bind(&c.to_process)
            .bind(&c.to_interface)
            .bind(&c.version)
            .bind(&c.interface_id)
            .bind(&c.created_by)
            .bind(c.created_at)
            .execute(pool)
            .await
            .map(drop)
        });
        match inserted {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(StoreError::Conflict {
                what: format!(
                    "`{}.{}` is connected to `{}.{}` already",
                    c.from_process, c.from_interface, c.to_process, c.to_interface
                ),
            }),
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => Err(environment_not_found(env)),
            Err(e) => Err(backend_with(|| format!("storing a connection in environment {env}"))(e)),
            Ok(()) => Ok(()),
        }
    }

    /// Every connection of the environment, oldest first.
    pub async fn list_connections(&self, env: &EnvironmentId) -> Result<Vec<ConnectionRecord>> {
        let rows: Vec<ConnectionRow> = on_pool!(self, pool => {
            sqlx::query_as(concat!("SELECT ", connection_columns!(), " FROM connections WHERE environment_id = $1 ORDER BY created_at, id"))
                .bind(env.to_string())
                .fetch_all(pool)
                .await
                .map_err(backend_with(|| format!("listing the connections of environment {env}")))?
        });
        Ok(rows.into_iter().map(connection).collect())
    }

    /// Deletes connection `id`; `None` when there is none.
    pub async fn delete_connection(&self, env: &EnvironmentId, id: &str) -> Result<Option<ConnectionRecord>> {
        let _turn = self.write_turn().await?;
        if id.contains('\0') {
            return Ok(None);
        }
        let row: Option<ConnectionRow> = on_pool!(self, pool => {
            sqlx::query_as(concat!("DELETE FROM connections WHERE environment_id = $1 AND id = $2 RETURNING ", connection_columns!()))
                .bind(env.to_string())
                .bind(id)
                .fetch_optional(pool)
                .await
                .map_err(backend_with(|| format!("deleting connection {id} in environment {env}")))?
        });
        Ok(row.map(connection))
    }
}

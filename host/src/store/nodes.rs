//! Nodes reached over SSH: their address, login, labels, visibility, status, pinned host key and
//! facts, and — in a table of its own, never read by the queries that list or show nodes — their
//! credential, sealed by the node registry before it reaches the store.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::error::backend_with;
use super::{
    BeginWrite, EnvironmentId, NewNode, NodeObservation, NodePatch, NodeRecord, NodeStatus, Result, SealedCredential, Store, StoreError,
    now_ms, parse_id, parse_name,
};

/// What [`Store::patch_node`] did.
#[derive(Debug)]
pub enum NodePatched {
    Changed(Box<NodeRecord>),
    /// The node was to become private to one environment while the released versions of these
    /// others have resources on it; nothing was changed.
    InUse {
        environments: Vec<String>,
    },
}

/// What `delete_node` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeDeletion {
    Deleted,
    /// Resources of these environments are on the node; nothing was deleted.
    InUse {
        environments: Vec<String>,
    },
}

/// A `nodes` row as [`select!`] reads it: the columns of [`NodeRecord`] as stored (more than
/// sqlx decodes into a tuple, so decoded by position for each backend).
type Columns = (
    String,
    String,
    i32,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    i64,
    i64,
    Option<i64>,
);

struct Row(Columns, Option<String>);

macro_rules! decode_row {
    ($row:ty) => {
        impl sqlx::FromRow<'_, $row> for Row {
            fn from_row(row: &$row) -> std::result::Result<Row, sqlx::Error> {
                use sqlx::Row as _;
                Ok(Row(
                    (
                        row.try_get(0)?,
                        row.try_get(1)?,
                        row.try_get(2)?,
                        row.try_get(3)?,
                        row.try_get(4)?,
                        row.try_get(5)?,
                        row.try_get(6)?,
                        row.try_get(7)?,
                        row.try_get(8)?,
                        row.try_get(9)?,
                        row.try_get(10)?,
                        row.try_get(11)?,
                        row.try_get(12)?,
                        row.try_get(13)?,
                        row.try_get(14)?,
                        row.try_get(15)?,
                    ),
                    row.try_get(16)?,
                ))
            }
        }
    };
}
decode_row!(sqlx::sqlite::SqliteRow);
decode_row!(sqlx::postgres::PgRow);

/// The columns of a [`Row`]: never the credential.
macro_rules! select {
    () => {
        "SELECT n.name, n.address, n.port, n.ssh_user, n.credential_kind, n.labels, n.environment_id, e.name, \
     n.status, n.host_key, n.presented_host_key, n.facts, n.last_error, n.created_at, n.updated_at, n.verified_at, n.changed_by \
     FROM nodes n LEFT JOIN environments e ON e.id = n.environment_id"
    };
}

fn record(Row(row, changed_by): Row) -> Result<NodeRecord> {
    let (
        name,
        address,
        port,
        user,
        kind,
        labels,
        env,
        env_name,
        status,
        host_key,
        presented,
        facts,
        last_error,
        created_at,
        updated_at,
        verified_at,
    ) = row;
    let labels: BTreeMap<String, String> =
        serde_json::from_str(&labels).map_err(|e| StoreError::corrupt(format!("labels of node `{name}`: {e}")))?;
    let facts = facts
        .map(|f| serde_json::from_str(&f))
        .transpose()
        .map_err(|e| StoreError::corrupt(format!("facts of node `{name}`: {e}")))?;
    Ok(NodeRecord {
        port: u16::try_from(port).map_err(|_| StoreError::corrupt(format!("port {port} of node `{name}`")))?,
        address,
        user,
        credential: parse_name(&kind)?,
        labels,
        environment: env.map(|e| parse_id(&e, "environment")).transpose()?,
        environment_name: env_name,
        status: parse_name(&status)?,
        host_key,
        presented_host_key: presented,
        facts,
        last_error,
        created_at,
        updated_at,
        verified_at,
        changed_by,
        name,
    })
}

/// Environments other than `$2` (`""`: none) whose released version has resources on node `$1`:
/// a state belongs to the version it was last emitted for, and the scheduler emits one for every
/// resource of a version it releases, so states of resources dropped from the intent no longer
/// count.
const USERS: &str = "SELECT DISTINCT e.name FROM resource_states s JOIN environments e ON e.id = s.environment_id \
     WHERE s.node = $1 AND s.version = e.released_version AND e.id <> $2 ORDER BY e.name";

fn node_not_found(name: &str) -> StoreError {
    StoreError::not_found(format!("node `{name}`"))
}

/// `verified` in an update means `public` or `private`, whichever the node's visibility says at
/// the time of the write.
macro_rules! status_case {
    () => {
        "CASE WHEN $1 = 'verified' THEN (CASE WHEN environment_id IS NULL THEN 'public' ELSE 'private' END) ELSE $1 END"
    };
}

fn status_param(status: NodeStatus) -> &'static str {
    if status.is_verified() { "verified" } else { status.as_str() }
}

impl Store {
    /// Stores a new `unidentified` node and its sealed credential.
    pub async fn insert_node(&self, node: &NewNode, credential: &SealedCredential) -> Result<NodeRecord> {
        let _writing = self.caches.nodes.writing(None);
        let now = now_ms();
        let context = || format!("registering node `{}`", node.name);
        let labels = serde_json::to_string(&node.labels).expect("labels serialise");
        let inserted: Result<(), sqlx::Error> = on_pool!(self, pool => {
            async {
                let mut tx = pool.begin_write().await?;
                sqlx::query(
                    "INSERT INTO nodes (name, address, port, ssh_user, credential_kind, labels, environment_id, status, host_key, \
                     created_at, updated_at, changed_by) VALUES ($1, $2, $3, $4, $5, $6, $7, 'unidentified', $8, $9, $9, $10)",
                )
                .bind(&node.name)
                .bind(&node.address)
                .bind(i32::from(node.port))
                .bind(&node.user)
                .bind(node.credential.as_str())
                .bind(&labels)
                .bind(node.environment.map(|e| e.to_string()))
                .bind(&node.host_key)
                .bind(now)
                .bind(&node.changed_by)
                .execute(&mut *tx)
                .await?;
                sqlx::query("INSERT INTO node_credentials (node, nonce, ciphertext) VALUES ($1, $2, $3)")
                    .bind(&node.name)
                    .bind(&credential.nonce)
                    .bind(&credential.ciphertext)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await
            }
            .await
        });
        match inserted {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(StoreError::Conflict {
                what: format!("a node named `{}` already exists", node.name),
            }),
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => Err(StoreError::not_found(format!(
                "environment {}",
                node.environment.map(|e| e.to_string()).unwrap_or_default()
            ))),
            Err(e) => Err(backend_with(context)(e)),
            Ok(()) => self.get_node(&node.name).await,
        }
    }

    pub async fn get_node(&self, name: &str) -> Result<NodeRecord> {
        self.find_node(name).await?.ok_or_else(|| node_not_found(name))
    }

    pub async fn find_node(&self, name: &str) -> Result<Option<NodeRecord>> {
        if let Ok(all) = self.caches.nodes.get(&()) {
            return Ok(all.iter().find(|n| n.name == name).cloned());
        }
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!(select!(), " WHERE n.name = $1"))
                .bind(name)
                .fetch_optional(pool)
                .await
                .map_err(backend_with(|| format!("reading node `{name}`")))?
        });
        row.map(record).transpose()
    }

    /// Every node, by name.
    pub async fn list_nodes(&self) -> Result<Vec<NodeRecord>> {
        let miss = match self.caches.nodes.get(&()) {
            Ok(all) => return Ok(all.to_vec()),
            Err(miss) => miss,
        };
        let rows: Vec<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!(select!(), " ORDER BY n.name"))
                .fetch_all(pool)
                .await
                .map_err(backend_with(|| "listing nodes".to_string()))?
        });
        let all: Vec<NodeRecord> = rows.into_iter().map(record).collect::<Result<_>>()?;
        self.caches.nodes.install(miss, (), Arc::new(all.clone()));
        Ok(all)
    }

    /// The node's sealed credential (for the registry to open and log in with).
    pub async fn node_credential(&self, name: &str) -> Result<SealedCredential> {
        let row: Option<(Vec<u8>, Vec<u8>)> = on_pool!(self, pool => {
            sqlx::query_as("SELECT nonce, ciphertext FROM node_credentials WHERE node = $1")
                .bind(name)
                .fetch_optional(pool)
                .await
                .map_err(backend_with(|| format!("reading the credential of node `{name}`")))?
        });
        let (nonce, ciphertext) = row.ok_or_else(|| StoreError::not_found(format!("credential of node `{name}`")))?;
        Ok(SealedCredential { nonce, ciphertext })
    }

    /// Records what reaching the node found.
    pub async fn observe_node(&self, name: &str, seen: &NodeObservation) -> Result<NodeRecord> {
        let _writing = self.caches.nodes.writing(None);
        let facts = seen.facts.as_ref().map(|f| f.to_string());
        let updated = on_pool!(self, pool => {
            sqlx::query(concat!(
                "UPDATE nodes SET status = ",
                status_case!(),
                ", host_key = COALESCE($2, host_key), presented_host_key = $3, facts = COALESCE($4, facts), \
                 last_error = $5, verified_at = COALESCE($6, verified_at), updated_at = $7 WHERE name = $8"
            ))
            .bind(status_param(seen.status))
            .bind(&seen.host_key)
            .bind(&seen.presented_host_key)
            .bind(facts)
            .bind(&seen.last_error)
            .bind(seen.verified_at)
            .bind(now_ms())
            .bind(name)
            .execute(pool)
            .await
            .map_err(backend_with(|| format!("recording the status of node `{name}`")))?
            .rows_affected()
        });
        if updated == 0 {
            return Err(node_not_found(name));
        }
        self.get_node(name).await
    }

    /// Pins `host_key` (an operator accepted it) and clears the refused one; the node is
    /// `unidentified` until verified with it.
    pub async fn accept_node_host_key(&self, name: &str, host_key: &str) -> Result<NodeRecord> {
        let _writing = self.caches.nodes.writing(None);
        let updated = on_pool!(self, pool => {
            sqlx::query(
                "UPDATE nodes SET host_key = $1, presented_host_key = NULL, status = 'unidentified', last_error = NULL, \
                 updated_at = $2 WHERE name = $3",
            )
            .bind(host_key)
            .bind(now_ms())
            .bind(name)
            .execute(pool)
            .await
            .map_err(backend_with(|| format!("accepting the host key of node `{name}`")))?
            .rows_affected()
        });
        if updated == 0 {
            return Err(node_not_found(name));
        }
        self.get_node(name).await
    }

    /// Changes labels, visibility or credential (one transaction). A verified node's status
    /// follows its visibility; a new credential makes it `unidentified` until verified again.
    /// Making the node private to an environment is refused while another environment's released
    /// version has resources on it.
    pub async fn patch_node(&self, name: &str, patch: &NodePatch) -> Result<NodePatched> {
        let _writing = self.caches.nodes.writing(None);
        let now = now_ms();
        let labels = patch.labels.as_ref().map(|l| serde_json::to_string(l).expect("labels serialise"));
        // `Err(environments)`: refused, those use the node.
        let result: Result<Result<u64, Vec<String>>, sqlx::Error> = on_pool!(self, pool => {
            async {
                let mut tx = pool.begin_write().await?;
                if let Some(Some(env)) = &patch.environment {
                    let others: Vec<String> = sqlx::query_scalar(USERS)
                        .bind(name)
                        .bind(env.to_string())
                        .fetch_all(&mut *tx)
                        .await?;
                    if !others.is_empty() {
                        return Ok(Err(others));
                    }
                }
                let mut found = sqlx::query("UPDATE nodes SET updated_at = $1, changed_by = $3 WHERE name = $2")
                    .bind(now)
                    .bind(name)
                    .bind(&patch.changed_by)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if let Some(labels) = &labels {
                    sqlx::query("UPDATE nodes SET labels = $1 WHERE name = $2")
                        .bind(labels)
                        .bind(name)
                        .execute(&mut *tx)
                        .await?;
                }
                if let Some(env) = &patch.environment {
                    sqlx::query(
                        "UPDATE nodes SET environment_id = $1, status = CASE WHEN status IN ('public', 'private') \
                         THEN (CASE WHEN $1 IS NULL THEN 'public' ELSE 'private' END) ELSE status END WHERE name = $2",
                    )
                    .bind(env.map(|e| e.to_string()))
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
                }
                if let Some((kind, sealed)) = &patch.credential {
                    sqlx::query("UPDATE nodes SET credential_kind = $1, status = 'unidentified', last_error = NULL WHERE name = $2")
                        .bind(kind.as_str())
                        .bind(name)
                        .execute(&mut *tx)
                        .await?;
                    found = found.min(
                        sqlx::query("UPDATE node_credentials SET nonce = $1, ciphertext = $2 WHERE node = $3")
                            .bind(&sealed.nonce)
                            .bind(&sealed.ciphertext)
                            .bind(name)
                            .execute(&mut *tx)
                            .await?
                            .rows_affected(),
                    );
                }
                tx.commit().await?;
                Ok(Ok(found))
            }
            .await
        });
        match result {
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => Err(StoreError::not_found("environment".to_string())),
            Err(e) => Err(backend_with(|| format!("changing node `{name}`"))(e)),
            Ok(Err(environments)) => Ok(NodePatched::InUse { environments }),
            Ok(Ok(0)) => Err(node_not_found(name)),
            Ok(Ok(_)) => Ok(NodePatched::Changed(Box::new(self.get_node(name).await?))),
        }
    }

    /// Deletes the node and its credential unless the released version of some environment has
    /// resources on it.
    pub async fn delete_node(&self, name: &str) -> Result<NodeDeletion> {
        let _writing = self.caches.nodes.writing(None);
        let context = || format!("deleting node `{name}`");
        let (users, deleted): (Vec<String>, u64) = on_pool!(self, pool => {
            async {
                let mut tx = pool.begin_write().await?;
                let users: Vec<String> = sqlx::query_scalar(USERS)
                .bind(name)
                .bind("")
                .fetch_all(&mut *tx)
                .await?;
                if !users.is_empty() {
                    return Ok((users, 0));
                }
                let deleted = sqlx::query("DELETE FROM nodes WHERE name = $1")
                    .bind(name)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                Ok::<_, sqlx::Error>((users, deleted))
            }
            .await
            .map_err(backend_with(context))?
        });
        if !users.is_empty() {
            return Ok(NodeDeletion::InUse { environments: users });
        }
        if deleted == 0 {
            return Err(node_not_found(name));
        }
        Ok(NodeDeletion::Deleted)
    }

    /// Private nodes of an environment (they go with it when it is deleted).
    pub async fn private_nodes(&self, env: &EnvironmentId) -> Result<Vec<String>> {
        on_pool!(self, pool => {
            sqlx::query_scalar("SELECT name FROM nodes WHERE environment_id = $1 ORDER BY name")
                .bind(env.to_string())
                .fetch_all(pool)
                .await
                .map_err(backend_with(|| format!("listing the private nodes of environment {env}")))
        })
    }
}

//! `DbKv`: the runtime's `KvStore` (plugin key/value state, by scope and key) kept in the
//! database, so it lives where everything else of an environment lives and survives a move to
//! another replica.
//!
//! `KvStore` is asynchronous, so a plugin's `kv` call awaits the store's own pool like any other
//! query and holds no worker thread meanwhile. Reads go straight to the pool. Writes (set,
//! delete) go to one writer task that commits whatever queued up meanwhile as one transaction
//! (group commit) before it answers each: a caller still returns only once its write is durable,
//! but 64 actions writing at once cost one commit instead of 64 (on SQLite, one turn at the write
//! lock, which the scheduler's batch transactions also take). If a group's transaction fails,
//! each write is retried on its own, so one bad write does not fail the others.

use orc_runtime::capability::kv::{KvError, KvStore};
use orc_runtime::capability::node::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use super::{Backend, BeginWrite as _, Store, StoreError, now_ms};

/// Most writes committed together.
const MAX_WRITE_BATCH: usize = 1024;

const UPSERT: &str = "INSERT INTO plugin_kv (scope, key, value, updated_at) VALUES ($1, $2, $3, $4) \
                      ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at";
const DELETE: &str = "DELETE FROM plugin_kv WHERE scope = $1 AND key = $2";

enum Write {
    Set { scope: String, key: String, value: Vec<u8> },
    Delete { scope: String, key: String },
}

/// What a write answers: `true` when a delete removed something.
type Written = Result<bool, sqlx::Error>;

struct Request {
    write: Write,
    reply: oneshot::Sender<Written>,
}

/// Plugin key/value state in the store's database. Dropping it ends its writer task.
#[derive(Debug)]
pub struct DbKv {
    store: Store,
    writes: mpsc::UnboundedSender<Request>,
}

impl DbKv {
    /// Starts the writer task (on the calling runtime) over `store`'s pool.
    pub async fn open(store: &Store) -> Result<DbKv, StoreError> {
        let (writes, queued) = mpsc::unbounded_channel();
        tokio::spawn(writer(store.clone(), queued));
        Ok(DbKv {
            store: store.clone(),
            writes,
        })
    }

    fn backend(&self) -> Backend {
        self.store.backend()
    }

    fn failed(&self, doing: String, source: impl std::fmt::Display) -> KvError {
        KvError::Io {
            context: format!("{} database: {doing}", self.backend()),
            source: std::io::Error::other(source.to_string()),
        }
    }

    async fn write(&self, write: Write, doing: impl FnOnce() -> String) -> Result<bool, KvError> {
        let (reply, answer) = oneshot::channel();
        if self.writes.send(Request { write, reply }).is_err() {
            return Err(self.failed(doing(), "the key/value writer has stopped"));
        }
        match answer.await {
            Ok(Ok(written)) => Ok(written),
            Ok(Err(e)) => Err(self.failed(doing(), e)),
            Err(_) => Err(self.failed(doing(), "the key/value writer has stopped")),
        }
    }
}

async fn writer(store: Store, mut queued: mpsc::UnboundedReceiver<Request>) {
    let mut batch = Vec::new();
    while queued.recv_many(&mut batch, MAX_WRITE_BATCH).await > 0 {
        write_batch(&store, std::mem::take(&mut batch)).await;
    }
}

/// Commits `batch` as one transaction and answers each write; if that fails, retries each on
/// its own.
async fn write_batch(store: &Store, batch: Vec<Request>) {
    if batch.len() > 1 {
        let now = now_ms();
        let committed: Result<Vec<bool>, sqlx::Error> = on_pool!(store, pool => async {
            let mut tx = pool.begin_write().await?;
            let mut written = Vec::with_capacity(batch.len());
            for request in &batch {
                written.push(match &request.write {
                    Write::Set { scope, key, value } => {
                        sqlx::query(UPSERT).bind(scope).bind(key).bind(value).bind(now).execute(&mut *tx).await?;
                        true
                    }
                    Write::Delete { scope, key } => sqlx::query(DELETE).bind(scope).bind(key).execute(&mut *tx).await?.rows_affected() > 0,
                });
            }
            tx.commit().await?;
            Ok(written)
        }
        .await);
        if let Ok(written) = committed {
            for (request, w) in batch.into_iter().zip(written) {
                let _ = request.reply.send(Ok(w));
            }
            return;
        }
    }
    for request in batch {
        let _ = request.reply.send(write_one(store, &request.write).await);
    }
}

async fn write_one(store: &Store, write: &Write) -> Written {
    let now = now_ms();
    Ok(match write {
        Write::Set { scope, key, value } => {
            on_pool!(store, pool => sqlx::query(UPSERT).bind(scope).bind(key).bind(value).bind(now).execute(pool).await?.rows_affected());
            true
        }
        Write::Delete { scope, key } => {
            on_pool!(store, pool => sqlx::query(DELETE).bind(scope).bind(key).execute(pool).await?.rows_affected()) > 0
        }
    })
}

impl KvStore for DbKv {
    fn get<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, KvError>> {
        Box::pin(async move {
            let value: Result<Option<Vec<u8>>, sqlx::Error> = on_pool!(self.store, pool => {
                sqlx::query_scalar("SELECT value FROM plugin_kv WHERE scope = $1 AND key = $2")
                    .bind(scope)
                    .bind(key)
                    .fetch_optional(pool)
                    .await
            });
            value.map_err(|e| self.failed(format!("cannot read `{key}` in `{scope}`"), e))
        })
    }

    fn set<'a>(&'a self, scope: &'a str, key: &'a str, value: &'a [u8]) -> BoxFuture<'a, Result<(), KvError>> {
        Box::pin(async move {
            let write = Write::Set {
                scope: scope.to_string(),
                key: key.to_string(),
                value: value.to_vec(),
            };
            self.write(write, || format!("cannot write `{key}` in `{scope}`")).await.map(drop)
        })
    }

    fn delete<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<bool, KvError>> {
        Box::pin(async move {
            let write = Write::Delete {
                scope: scope.to_string(),
                key: key.to_string(),
            };
            self.write(write, || format!("cannot delete `{key}` in `{scope}`")).await
        })
    }

    fn list<'a>(&'a self, scope: &'a str, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, KvError>> {
        Box::pin(async move {
            let keys: Result<Vec<String>, sqlx::Error> = on_pool!(self.store, pool => {
                sqlx::query_scalar(
                    "SELECT key FROM plugin_kv WHERE scope = $1 AND substr(key, 1, length(CAST($2 AS TEXT))) = $2 ORDER BY key",
                )
                .bind(scope)
                .bind(prefix)
                .fetch_all(pool)
                .await
            });
            keys.map_err(|e| self.failed(format!("cannot list `{prefix}…` in `{scope}`"), e))
        })
    }
}

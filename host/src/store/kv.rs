//! `DbKv`: the runtime's `KvStore` (plugin key/value state, by scope and key) kept in the
//! database, so it lives where everything else of an environment lives and survives a move to
//! another replica.
//!
//! `KvStore` is synchronous, and it is called from inside async host functions on a tokio worker
//! thread. Blocking on the host's own pool from there (`Handle::block_on`) panics on a
//! current-thread runtime and, with `block_in_place`, still depends on the caller's runtime to
//! drive the pool's I/O. So `DbKv` owns a small pool of its own, driven by its own thread and
//! current-thread runtime: a call sends its request over a channel and blocks the calling thread
//! for one database round trip (as `DirKv` blocks on file I/O), whatever runtime the caller is
//! on. One thing it waits for may need the caller's runtime: on SQLite, the database's one write
//! lock, which the store's batch transaction holds across awaits. With every worker blocked in a
//! kv write, that transaction never commits and each write fails after the busy timeout; so on a
//! multi-thread runtime the wait runs under `block_in_place`, which hands the worker's other tasks
//! to another thread. Reads run concurrently on the kv runtime, up to the pool's size. Writes
//! (set, delete) go to one writer task that commits whatever queued up meanwhile as one
//! transaction (group commit) before it answers each: a caller still returns only once its write
//! is durable, but 64 concurrent actions cost one commit instead of 64 (on SQLite, one turn at the
//! write lock instead of 64).

use std::sync::mpsc as std_mpsc;

use orc_runtime::capability::kv::{KvError, KvStore};
use sqlx::pool::PoolOptions;
use tokio::sync::{mpsc, oneshot};

use super::error::backend;
use super::{Backend, Db, Store, StoreError, now_ms};

/// Connections of the key/value pool.
const KV_CONNECTIONS: u32 = 4;

/// Most writes committed together.
const MAX_WRITE_BATCH: usize = 1024;

const UPSERT: &str = "INSERT INTO plugin_kv (scope, key, value, updated_at) VALUES ($1, $2, $3, $4) \
                      ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at";
const DELETE: &str = "DELETE FROM plugin_kv WHERE scope = $1 AND key = $2";

enum Op {
    Get { scope: String, key: String },
    Set { scope: String, key: String, value: Vec<u8> },
    Delete { scope: String, key: String },
    List { scope: String, prefix: String },
}

enum Reply {
    Value(Option<Vec<u8>>),
    Done,
    Deleted(bool),
    Keys(Vec<String>),
}

struct Request {
    op: Op,
    reply: std_mpsc::SyncSender<Result<Reply, sqlx::Error>>,
}

/// Plugin key/value state in the store's database. Dropping it stops its thread and closes its
/// connections.
#[derive(Debug)]
pub struct DbKv {
    requests: mpsc::UnboundedSender<Request>,
    backend: Backend,
}

impl DbKv {
    /// Starts the key/value thread with its own connections to `store`'s database.
    pub async fn open(store: &Store) -> Result<DbKv, StoreError> {
        let db = store.db.clone();
        let backend = store.backend();
        let (requests, mut incoming) = mpsc::unbounded_channel::<Request>();
        let (ready, started) = oneshot::channel::<Result<(), StoreError>>();
        std::thread::Builder::new()
            .name("orc-kv".to_string())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready.send(Err(StoreError::Config {
                            location: "key/value store".to_string(),
                            reason: format!("cannot start its runtime: {e}"),
                        }));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let kv = match own_pool(&db).await {
                        Ok(kv) => kv,
                        Err(e) => {
                            let _ = ready.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready.send(Ok(()));
                    let (writes, mut queued) = mpsc::unbounded_channel::<Request>();
                    let writer_kv = kv.clone();
                    let writer = tokio::spawn(async move {
                        let mut batch = Vec::new();
                        while queued.recv_many(&mut batch, MAX_WRITE_BATCH).await > 0 {
                            write_batch(&writer_kv, std::mem::take(&mut batch)).await;
                        }
                    });
                    while let Some(request) = incoming.recv().await {
                        if matches!(request.op, Op::Set { .. } | Op::Delete { .. }) {
                            let _ = writes.send(request);
                            continue;
                        }
                        let kv = kv.clone();
                        tokio::spawn(async move {
                            let _ = request.reply.send(run(&kv, request.op).await);
                        });
                    }
                    drop(writes);
                    let _ = writer.await;
                    kv.close().await;
                });
            })
            .map_err(|e| StoreError::Config {
                location: "key/value store".to_string(),
                reason: format!("cannot start its thread: {e}"),
            })?;
        started.await.map_err(|_| StoreError::Config {
            location: "key/value store".to_string(),
            reason: "its thread stopped while starting".to_string(),
        })??;
        Ok(DbKv { requests, backend })
    }

    fn call(&self, op: Op, doing: impl FnOnce() -> String) -> Result<Reply, KvError> {
        let (reply, answer) = std_mpsc::sync_channel(1);
        let failed = |source: std::io::Error| KvError::Io {
            context: format!("{} database: {}", self.backend, doing()),
            source,
        };
        if self.requests.send(Request { op, reply }).is_err() {
            return Err(failed(std::io::Error::other("the key/value thread has stopped")));
        }
        // See the module's documentation: the transaction holding the write lock must keep running.
        let on_worker =
            tokio::runtime::Handle::try_current().is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let received = if on_worker {
            tokio::task::block_in_place(|| answer.recv())
        } else {
            answer.recv()
        };
        match received {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(failed(std::io::Error::other(e))),
            Err(_) => Err(failed(std::io::Error::other("the key/value thread has stopped"))),
        }
    }
}

/// A pool like `db`'s (same database, same connection settings), owned by the calling runtime.
async fn own_pool(db: &Db) -> Result<Store, StoreError> {
    let db = match db {
        Db::Sqlite(pool) => Db::Sqlite(
            PoolOptions::new()
                .max_connections(KV_CONNECTIONS)
                .connect_with((*pool.connect_options()).clone())
                .await
                .map_err(backend("opening the key/value connections"))?,
        ),
        Db::Postgres(pool) => Db::Postgres(
            PoolOptions::new()
                .max_connections(KV_CONNECTIONS)
                .connect_with((*pool.connect_options()).clone())
                .await
                .map_err(backend("opening the key/value connections"))?,
        ),
    };
    Ok(Store { db })
}

/// Commits queued writes as one transaction and answers each. If the transaction fails, each
/// write is retried on its own, so one bad write does not fail the others.
async fn write_batch(kv: &Store, batch: Vec<Request>) {
    use super::BeginWrite as _;
    if batch.len() > 1 {
        let now = now_ms();
        let committed: Result<Vec<Reply>, sqlx::Error> = on_pool!(kv, pool => async {
            let mut tx = pool.begin_write().await?;
            let mut replies = Vec::with_capacity(batch.len());
            for request in &batch {
                replies.push(match &request.op {
                    Op::Set { scope, key, value } => {
                        sqlx::query(UPSERT).bind(scope).bind(key).bind(value).bind(now).execute(&mut *tx).await?;
                        Reply::Done
                    }
                    Op::Delete { scope, key } => {
                        Reply::Deleted(sqlx::query(DELETE).bind(scope).bind(key).execute(&mut *tx).await?.rows_affected() > 0)
                    }
                    Op::Get { .. } | Op::List { .. } => unreachable!("only writes are batched"),
                });
            }
            tx.commit().await?;
            Ok(replies)
        }
        .await);
        if let Ok(replies) = committed {
            for (request, reply) in batch.into_iter().zip(replies) {
                let _ = request.reply.send(Ok(reply));
            }
            return;
        }
    }
    for request in batch {
        let _ = request.reply.send(run(kv, request.op).await);
    }
}

async fn run(kv: &Store, op: Op) -> Result<Reply, sqlx::Error> {
    Ok(match op {
        Op::Get { scope, key } => Reply::Value(on_pool!(kv, pool => {
            sqlx::query_scalar("SELECT value FROM plugin_kv WHERE scope = $1 AND key = $2")
                .bind(scope)
                .bind(key)
                .fetch_optional(pool)
                .await?
        })),
        Op::Set { scope, key, value } => {
            on_pool!(kv, pool => {
                sqlx::query(UPSERT)
                .bind(scope)
                .bind(key)
                .bind(value)
                .bind(now_ms())
                .execute(pool)
                .await?
                .rows_affected()
            });
            Reply::Done
        }
        Op::Delete { scope, key } => Reply::Deleted(on_pool!(kv, pool => {
            sqlx::query(DELETE)
                .bind(scope)
                .bind(key)
                .execute(pool)
                .await?
                .rows_affected()
                > 0
        })),
        Op::List { scope, prefix } => Reply::Keys(on_pool!(kv, pool => {
            sqlx::query_scalar(
                "SELECT key FROM plugin_kv WHERE scope = $1 AND substr(key, 1, length(CAST($2 AS TEXT))) = $2 ORDER BY key",
            )
            .bind(scope)
            .bind(prefix)
            .fetch_all(pool)
            .await?
        })),
    })
}

fn unexpected() -> KvError {
    KvError::Io {
        context: "database key/value store".to_string(),
        source: std::io::Error::other("unexpected reply"),
    }
}

impl KvStore for DbKv {
    fn get(&self, scope: &str, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        let op = Op::Get {
            scope: scope.to_string(),
            key: key.to_string(),
        };
        match self.call(op, || format!("cannot read `{key}` in `{scope}`"))? {
            Reply::Value(v) => Ok(v),
            _ => Err(unexpected()),
        }
    }

    fn set(&self, scope: &str, key: &str, value: &[u8]) -> Result<(), KvError> {
        let op = Op::Set {
            scope: scope.to_string(),
            key: key.to_string(),
            value: value.to_vec(),
        };
        match self.call(op, || format!("cannot write `{key}` in `{scope}`"))? {
            Reply::Done => Ok(()),
            _ => Err(unexpected()),
        }
    }

    fn delete(&self, scope: &str, key: &str) -> Result<bool, KvError> {
        let op = Op::Delete {
            scope: scope.to_string(),
            key: key.to_string(),
        };
        match self.call(op, || format!("cannot delete `{key}` in `{scope}`"))? {
            Reply::Deleted(d) => Ok(d),
            _ => Err(unexpected()),
        }
    }

    fn list(&self, scope: &str, prefix: &str) -> Result<Vec<String>, KvError> {
        let op = Op::List {
            scope: scope.to_string(),
            prefix: prefix.to_string(),
        };
        match self.call(op, || format!("cannot list `{prefix}…` in `{scope}`"))? {
            Reply::Keys(k) => Ok(k),
            _ => Err(unexpected()),
        }
    }
}

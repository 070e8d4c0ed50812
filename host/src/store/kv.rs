//! `DbKv`: the runtime's `KvStore` (plugin key/value state, by scope and key) kept in the
//! database, so it lives where everything else of an environment lives and survives a move to
//! another replica.
//!
//! `KvStore` is asynchronous, so a plugin's `kv` call awaits the store like any other query and
//! holds no worker thread meanwhile. Calls are batched by two tasks, since many actions run at
//! once and each would otherwise pay a database round trip of its own:
//! - a reader answers the `get`s queued meanwhile with one query per scope (`key IN (…)` on
//!   SQLite, `key = ANY($2)` on PostgreSQL), with a few such queries in flight at once;
//! - a writer commits every `set`/`delete` queued meanwhile as one transaction of multi-row
//!   statements (group commit) before it answers each: a caller still returns only once its
//!   write is durable, but 64 actions writing at once cost one commit instead of 64 (on SQLite,
//!   one turn at the write lock, which the scheduler's batch transactions also take). A group
//!   is cut into runs in which no key repeats, applied in order, so the last write of a key
//!   wins and a delete knows whether the key existed. If a group's transaction fails, each
//!   write is retried on its own, so one bad write does not fail the others.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use orc_runtime::capability::kv::{KvError, KvStore};
use orc_runtime::capability::node::BoxFuture;
use sqlx::{PgConnection, QueryBuilder, Row as _, Sqlite, SqliteConnection};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::{Backend, BeginWrite as _, Store, StoreError, now_ms, sqlite_rows_per_statement};

/// Most writes committed together.
const MAX_WRITE_BATCH: usize = 1024;
/// Most reads answered by one query.
const MAX_READ_BATCH: usize = 1024;
/// Read queries running at once: one at a time would make every batch wait out the previous
/// one's round trip (PostgreSQL: repair and dryrun of 10,000 resources took twice as long).
const READS_IN_FLIGHT: usize = 4;

/// What an upsert does with a key that exists: the new value replaces the old.
macro_rules! on_conflict {
    () => {
        " ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at"
    };
}

const UPSERT: &str = concat!(
    "INSERT INTO plugin_kv (scope, key, value, updated_at) VALUES ($1, $2, $3, $4)",
    on_conflict!()
);
const DELETE: &str = "DELETE FROM plugin_kv WHERE scope = $1 AND key = $2";
/// One statement for a run's sets on PostgreSQL: `UNNEST` of one array per column.
const UPSERT_POSTGRES: &str = concat!(
    "INSERT INTO plugin_kv (scope, key, value, updated_at) SELECT u.scope, u.key, u.value, $4 \
     FROM UNNEST($1::text[], $2::text[], $3::bytea[]) AS u(scope, key, value)",
    on_conflict!()
);

enum Write {
    Set { scope: String, key: String, value: Vec<u8> },
    Delete { scope: String, key: String },
}

impl Write {
    fn slot(&self) -> (&str, &str) {
        match self {
            Write::Set { scope, key, .. } | Write::Delete { scope, key } => (scope, key),
        }
    }
}

/// What a write answers: `true` when a delete removed something.
type Written = Result<bool, sqlx::Error>;

struct WriteRequest {
    write: Write,
    reply: oneshot::Sender<Written>,
}

/// What a read answers; one failed query fails every read it carried.
type ReadOutcome = Result<Option<Vec<u8>>, Arc<sqlx::Error>>;

struct ReadRequest {
    scope: String,
    key: String,
    reply: oneshot::Sender<ReadOutcome>,
}

/// Plugin key/value state in the store's database. Dropping it ends its reader and writer tasks.
#[derive(Debug)]
pub struct DbKv {
    store: Store,
    reads: mpsc::UnboundedSender<ReadRequest>,
    writes: mpsc::UnboundedSender<WriteRequest>,
}

impl DbKv {
    /// Starts the reader and writer tasks (on the calling runtime) over `store`'s pool.
    pub async fn open(store: &Store) -> Result<DbKv, StoreError> {
        let (reads, read_queue) = mpsc::unbounded_channel();
        let (writes, write_queue) = mpsc::unbounded_channel();
        tokio::spawn(reader(store.clone(), read_queue));
        tokio::spawn(writer(store.clone(), write_queue));
        Ok(DbKv {
            store: store.clone(),
            reads,
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

    async fn read(&self, scope: &str, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        let doing = || format!("cannot read `{key}` in `{scope}`");
        let (reply, answer) = oneshot::channel();
        let request = ReadRequest {
            scope: scope.to_string(),
            key: key.to_string(),
            reply,
        };
        if self.reads.send(request).is_err() {
            return Err(self.failed(doing(), "the key/value reader has stopped"));
        }
        match answer.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.failed(doing(), e)),
            Err(_) => Err(self.failed(doing(), "the key/value reader has stopped")),
        }
    }

    async fn write(&self, write: Write, doing: impl FnOnce() -> String) -> Result<bool, KvError> {
        let (reply, answer) = oneshot::channel();
        if self.writes.send(WriteRequest { write, reply }).is_err() {
            return Err(self.failed(doing(), "the key/value writer has stopped"));
        }
        match answer.await {
            Ok(Ok(written)) => Ok(written),
            Ok(Err(e)) => Err(self.failed(doing(), e)),
            Err(_) => Err(self.failed(doing(), "the key/value writer has stopped")),
        }
    }
}

async fn reader(store: Store, mut queued: mpsc::UnboundedReceiver<ReadRequest>) {
    let in_flight = Arc::new(Semaphore::new(READS_IN_FLIGHT));
    let mut batch = Vec::new();
    loop {
        // While every query slot is busy, reads queue up and form the next batch.
        let Ok(slot) = in_flight.clone().acquire_owned().await else {
            return;
        };
        if queued.recv_many(&mut batch, MAX_READ_BATCH).await == 0 {
            return;
        }
        let (store, requests) = (store.clone(), std::mem::take(&mut batch));
        tokio::spawn(async move {
            answer_reads(&store, requests).await;
            drop(slot);
        });
    }
}

/// Answers `requests` with one query per scope.
async fn answer_reads(store: &Store, requests: Vec<ReadRequest>) {
    let mut by_scope: HashMap<String, Vec<ReadRequest>> = HashMap::new();
    for request in requests {
        by_scope.entry(request.scope.clone()).or_default().push(request);
    }
    for (scope, requests) in by_scope {
        let mut keys: Vec<&str> = requests.iter().map(|r| r.key.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        match fetch(store, &scope, &keys).await {
            Ok(mut found) => {
                // Hand each value out once; a key read twice in one batch is cloned.
                let mut wanted: HashMap<&str, usize> = HashMap::new();
                for r in &requests {
                    *wanted.entry(r.key.as_str()).or_default() += 1;
                }
                let mut answers = Vec::with_capacity(requests.len());
                for r in &requests {
                    let left = wanted.get_mut(r.key.as_str()).expect("counted above");
                    *left -= 1;
                    let value = if *left == 0 {
                        found.remove(&r.key)
                    } else {
                        found.get(&r.key).cloned()
                    };
                    answers.push(value);
                }
                for (r, value) in requests.into_iter().zip(answers) {
                    let _ = r.reply.send(Ok(value));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                for r in requests {
                    let _ = r.reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// The values of `keys` (sorted, distinct) in `scope` that exist.
async fn fetch(store: &Store, scope: &str, keys: &[&str]) -> Result<HashMap<String, Vec<u8>>, sqlx::Error> {
    if let [key] = keys {
        let value: Option<Vec<u8>> = on_pool!(store, pool => {
            sqlx::query_scalar("SELECT value FROM plugin_kv WHERE scope = $1 AND key = $2")
                .bind(scope)
                .bind(*key)
                .fetch_optional(pool)
                .await?
        });
        return Ok(value.map(|v| HashMap::from([(key.to_string(), v)])).unwrap_or_default());
    }
    let mut found = HashMap::with_capacity(keys.len());
    match &store.db {
        super::Db::Sqlite(pool) => {
            for chunk in keys.chunks(sqlite_rows_per_statement(1) - 1) {
                let mut q = QueryBuilder::<Sqlite>::new("SELECT key, value FROM plugin_kv WHERE scope = ");
                q.push_bind(scope).push(" AND key IN (");
                let mut list = q.separated(", ");
                for key in chunk {
                    list.push_bind(*key);
                }
                q.push(")");
                // Not cached: the text varies with the number of keys.
                for row in q.build().persistent(false).fetch_all(pool).await? {
                    found.insert(row.try_get("key")?, row.try_get("value")?);
                }
            }
        }
        super::Db::Postgres(pool) => {
            let rows = sqlx::query("SELECT key, value FROM plugin_kv WHERE scope = $1 AND key = ANY($2::text[])")
                .bind(scope)
                .bind(keys)
                .fetch_all(pool)
                .await?;
            for row in rows {
                found.insert(row.try_get("key")?, row.try_get("value")?);
            }
        }
    }
    Ok(found)
}

async fn writer(store: Store, mut queued: mpsc::UnboundedReceiver<WriteRequest>) {
    let mut batch = Vec::new();
    while queued.recv_many(&mut batch, MAX_WRITE_BATCH).await > 0 {
        write_batch(&store, std::mem::take(&mut batch)).await;
    }
}

/// Commits `batch` as one transaction and answers each write; if that fails, retries each on
/// its own.
async fn write_batch(store: &Store, batch: Vec<WriteRequest>) {
    if batch.len() > 1 {
        let writes: Vec<&Write> = batch.iter().map(|r| &r.write).collect();
        let now = now_ms();
        let committed: Result<Vec<bool>, sqlx::Error> = match &store.db {
            super::Db::Sqlite(pool) => {
                async {
                    let mut tx = pool.begin_write().await?;
                    let mut written = Vec::with_capacity(writes.len());
                    for run in runs(&writes) {
                        written.extend(apply_run_sqlite(&mut tx, &writes[run], now).await?);
                    }
                    tx.commit().await?;
                    Ok(written)
                }
                .await
            }
            super::Db::Postgres(pool) => {
                async {
                    let mut tx = pool.begin_write().await?;
                    let mut written = Vec::with_capacity(writes.len());
                    for run in runs(&writes) {
                        written.extend(apply_run_postgres(&mut tx, &writes[run], now).await?);
                    }
                    tx.commit().await?;
                    Ok(written)
                }
                .await
            }
        };
        match committed {
            Ok(written) => {
                for (request, w) in batch.into_iter().zip(written) {
                    let _ = request.reply.send(Ok(w));
                }
                return;
            }
            Err(e) => tracing::warn!(writes = batch.len(), error = %e, "a group of key/value writes failed; writing each on its own"),
        }
    }
    for request in batch {
        let _ = request.reply.send(write_one(store, &request.write).await);
    }
}

/// Cuts `writes` into consecutive runs in which no (scope, key) repeats: within a run the order
/// of the writes does not matter, so each run is one multi-row upsert and one multi-row delete.
fn runs(writes: &[&Write]) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let mut seen = HashSet::new();
    let mut start = 0;
    for (i, w) in writes.iter().enumerate() {
        if !seen.insert(w.slot()) {
            runs.push(start..i);
            seen.clear();
            seen.insert(w.slot());
            start = i;
        }
    }
    runs.push(start..writes.len());
    runs
}

/// What each write of a run answers, given the (scope, key) pairs its deletes removed.
fn answers(run: &[&Write], deleted: &HashSet<(String, String)>) -> Vec<bool> {
    run.iter()
        .map(|w| match w {
            Write::Set { .. } => true,
            Write::Delete { scope, key } => deleted.contains(&(scope.clone(), key.clone())),
        })
        .collect()
}

async fn apply_run_sqlite(conn: &mut SqliteConnection, run: &[&Write], now: i64) -> Result<Vec<bool>, sqlx::Error> {
    let sets: Vec<(&str, &str, &[u8])> = run
        .iter()
        .filter_map(|w| match w {
            Write::Set { scope, key, value } => Some((scope.as_str(), key.as_str(), value.as_slice())),
            Write::Delete { .. } => None,
        })
        .collect();
    for chunk in sets.chunks(sqlite_rows_per_statement(4)) {
        let mut q = QueryBuilder::<Sqlite>::new("INSERT INTO plugin_kv (scope, key, value, updated_at) ");
        q.push_values(chunk, |mut row, (scope, key, value)| {
            row.push_bind(*scope).push_bind(*key).push_bind(*value).push_bind(now);
        });
        q.push(on_conflict!());
        q.build().persistent(false).execute(&mut *conn).await?;
    }
    let deletes: Vec<(&str, &str)> = run.iter().filter(|w| matches!(w, Write::Delete { .. })).map(|w| w.slot()).collect();
    let mut deleted = HashSet::new();
    for chunk in deletes.chunks(sqlite_rows_per_statement(2)) {
        let mut q = QueryBuilder::<Sqlite>::new("DELETE FROM plugin_kv WHERE (scope, key) IN (VALUES ");
        let mut pairs = q.separated(", ");
        for (scope, key) in chunk {
            pairs
                .push("(")
                .push_bind_unseparated(*scope)
                .push_unseparated(", ")
                .push_bind_unseparated(*key)
                .push_unseparated(")");
        }
        q.push(") RETURNING scope, key");
        for row in q.build().persistent(false).fetch_all(&mut *conn).await? {
            deleted.insert((row.try_get("scope")?, row.try_get("key")?));
        }
    }
    Ok(answers(run, &deleted))
}

async fn apply_run_postgres(conn: &mut PgConnection, run: &[&Write], now: i64) -> Result<Vec<bool>, sqlx::Error> {
    let (mut scopes, mut keys, mut values) = (Vec::new(), Vec::new(), Vec::new());
    let (mut delete_scopes, mut delete_keys) = (Vec::new(), Vec::new());
    for w in run {
        match w {
            Write::Set { scope, key, value } => {
                scopes.push(scope.as_str());
                keys.push(key.as_str());
                values.push(value.as_slice());
            }
            Write::Delete { scope, key } => {
                delete_scopes.push(scope.as_str());
                delete_keys.push(key.as_str());
            }
        }
    }
    if !scopes.is_empty() {
        sqlx::query(UPSERT_POSTGRES)
            .bind(&scopes)
            .bind(&keys)
            .bind(&values)
            .bind(now)
            .execute(&mut *conn)
            .await?;
    }
    let mut deleted = HashSet::new();
    if !delete_scopes.is_empty() {
        let rows = sqlx::query(
            "DELETE FROM plugin_kv k USING UNNEST($1::text[], $2::text[]) AS d(scope, key) \
             WHERE k.scope = d.scope AND k.key = d.key RETURNING k.scope, k.key",
        )
        .bind(&delete_scopes)
        .bind(&delete_keys)
        .fetch_all(&mut *conn)
        .await?;
        for row in rows {
            deleted.insert((row.try_get("scope")?, row.try_get("key")?));
        }
    }
    Ok(answers(run, &deleted))
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
        Box::pin(self.read(scope, key))
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

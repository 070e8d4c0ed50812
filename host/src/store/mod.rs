//! The persistence layer of orc-host: environments, intent versions, resource states, the action
//! log, dryrun reports, users with their roles and tokens, the audit trail, SSH nodes (their credentials sealed, in a table of their
//! own), cluster templates (versioned) and the clusters made from them, and the plugin key/value
//! store, on SQLite (the embedded default: one file in the data directory) or PostgreSQL
//! (production, scale-out), with the same behaviour on both.
//!
//! # Two backends, one enum
//! [`Store`] holds `Db::Sqlite(SqlitePool)` or `Db::Postgres(PgPool)` rather than sqlx's
//! `AnyPool`, because the hot paths need what `Any` erases: PostgreSQL batches go through
//! `UNNEST` of typed arrays (one statement for 10,000 rows, no parameter limit), SQLite batches
//! through chunked multi-row `VALUES` under `BEGIN IMMEDIATE`; `Any` has no arrays, no
//! per-backend transaction start and would convert every value through its own enum. Most SQL
//! is nonetheless written once: sqlx's SQLite driver also accepts `$1` placeholders, and
//! `on_pool!` expands one block of code for each pool, so each arm is type-checked against its
//! own driver. Only what differs (batch writes, substring search, transaction start) is written
//! twice.
//!
//! # Schema and migrations
//! One migration set per backend (`host/migrations/sqlite`, `host/migrations/postgres`), the
//! same tables and columns, applied by `connect` (sqlx's migrator: idempotent, and on
//! PostgreSQL serialised between replicas by an advisory lock). They are embedded with
//! `include_str!` and handed to `Migrator::with_migrations` instead of `sqlx::migrate!`: the
//! macro would compile sqlx's proc-macro crate with both database drivers (and the bundled
//! SQLite C library) a second time for the build host. A unit test checks that every file in
//! the folders is embedded. Times are `i64` milliseconds since the epoch; ids are UUID text;
//! JSON is text. SQLite runs in WAL mode with `synchronous=NORMAL`, a busy timeout and foreign
//! keys on; an in-memory SQLite database is refused (a pool would see several databases).
//!
//! # Batches
//! Writes that come in thousands (`upsert_states`, `set_status`, `insert_actions`) are one
//! transaction per call and a handful of statements, never one statement per row. The schema
//! serves them: no index on a resource's `status` (it changes at every step of a deploy; status
//! filters scan the environment's key range instead), `fillfactor` headroom on PostgreSQL for
//! in-place updates, time-ordered action ids ([`ActionId::new`]). The integration tests print
//! the 10,000-row timings (`cargo test -p orc-host --test it -- --nocapture batch_timings`).
//!
//! # Conventions
//! `get_*` answers [`StoreError::NotFound`] for a missing row, `find_*` answers `None`. Every
//! query is scoped by environment: nothing crosses environments. [`DbKv`] is the runtime's
//! `KvStore` over the same database (see its module for how a sync trait meets an async pool).
//!
//! Architecture invariant: nothing outside `store` issues SQL; the rest of the host sees typed
//! records and [`StoreError`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, Postgres, SqlSafeStr, Sqlite, SqlitePool, Transaction};

/// Runs `$body` once per backend with `$pool` bound to that backend's pool (`&SqlitePool` or
/// `&PgPool`): one source, two monomorphic, separately type-checked copies.
macro_rules! on_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match &$store.db {
            $crate::store::Db::Sqlite($pool) => $body,
            $crate::store::Db::Postgres($pool) => $body,
        }
    };
}

mod actions;
mod audit;
mod cache;
mod clusters;
mod commands;
mod console_sessions;
mod environments;
mod error;
mod events;
mod ids;
mod intents;
mod jobs;
mod kv;
mod model;
mod news;
mod nodes;
mod ownership;
pub(crate) mod pace;
mod processes;
mod states;
mod tokens;
pub(crate) mod users;

pub use clusters::{ClusterRecord, TemplateRecord};
pub use commands::{CommandAnswer, CommandRecord, CommandState};
pub use console_sessions::ConsoleSession;
pub use error::StoreError;
pub use events::{EventLog, RecordedEvent, RecordedEvents, first_seq_of};
pub use ids::*;
pub use kv::DbKv;
pub use model::*;
pub use news::{CommandNews, EventNews};
pub use nodes::{NodeDeletion, NodePatched};
pub use ownership::{Epoch, Fence, LeaseRecord, Presence, ReplicaRecord};
pub use processes::{ConnectionRecord, ProcessRecord};
pub use states::{Progress, Renewal};
pub use tokens::hash_token;
pub use users::UserChange;

use crate::status::ErrorInfo;
use error::backend;

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Which database a [`Store`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres => "PostgreSQL",
        })
    }
}

/// Pool settings.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Most connections the pool opens (SQLite: readers run in parallel, writers queue).
    pub max_connections: u32,
    /// How long a caller waits for a free connection before failing.
    pub acquire_timeout: Duration,
    /// SQLite: how long a writer waits for another writer's lock before failing.
    pub busy_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: 8,
            acquire_timeout: Duration::from_secs(30),
            busy_timeout: Duration::from_secs(10),
        }
    }
}

/// The database handle of the host. Cheap to clone (pools are shared).
#[derive(Debug, Clone)]
pub struct Store {
    pub(crate) db: Db,
    /// Environments and nodes as last read (`cache.rs`).
    caches: Arc<cache::Caches>,
    /// What other replicas announce, once listened for (`news.rs`).
    news: Arc<std::sync::OnceLock<news::Heralds>>,
    /// Writes refused by their fence so far (`ownership.rs`, `kv.rs`).
    fenced: Arc<std::sync::atomic::AtomicU64>,
}

#[derive(Debug, Clone)]
pub(crate) enum Db {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// The file name of the SQLite database inside a data directory.
pub const SQLITE_FILE: &str = "orc.db";

impl Store {
    /// Opens (creating if needed) the SQLite database at `path` and applies the migrations.
    pub async fn open_sqlite(path: impl AsRef<Path>) -> Result<Store> {
        Store::open_sqlite_with(path, &StoreOptions::default()).await
    }

    pub async fn open_sqlite_with(path: impl AsRef<Path>, options: &StoreOptions) -> Result<Store> {
        Store::sqlite(SqliteConnectOptions::new().filename(path.as_ref()), options).await
    }

    /// Connects to `location` and applies the migrations: `postgres://…` / `postgresql://…`, or
    /// `sqlite://PATH` / `sqlite:PATH` (created if missing).
    pub async fn connect(location: &str) -> Result<Store> {
        Store::connect_with(location, &StoreOptions::default()).await
    }

    pub async fn connect_with(location: &str, options: &StoreOptions) -> Result<Store> {
        let invalid = |reason: &str| StoreError::Config {
            location: redact(location),
            reason: reason.to_string(),
        };
        if location.starts_with("postgres://") || location.starts_with("postgresql://") {
            let connect: PgConnectOptions = location.parse().map_err(|e: sqlx::Error| invalid(&e.to_string()))?;
            Store::postgres(connect, options).await
        } else if location.starts_with("sqlite:") {
            if location.contains(":memory:") || location.contains("mode=memory") {
                return Err(invalid(
                    "an in-memory SQLite database is not supported: every pooled connection would see its own; use a file",
                ));
            }
            let connect: SqliteConnectOptions = location.parse().map_err(|e: sqlx::Error| invalid(&e.to_string()))?;
            Store::sqlite(connect.create_if_missing(true), options).await
        } else {
            Err(invalid("expected postgres://…, postgresql://… or sqlite:PATH"))
        }
    }

    /// Connects to PostgreSQL with explicit options and applies the migrations.
    pub async fn postgres(connect: PgConnectOptions, options: &StoreOptions) -> Result<Store> {
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            // A connection keeps the capacity of the largest message it sent or received (a
            // version's document, a dryrun's report: tens of MiB with 100,000 resources), each
            // of the pool's connections its own: ~60 MiB held at rest. Back to 8 KiB on release;
            // a no-op for buffers that did not grow.
            .after_release(|conn, _| {
                use sqlx::Connection as _;
                conn.shrink_buffers();
                Box::pin(std::future::ready(Ok(true)))
            })
            // A replica stopped or cut off in the middle of a transaction holds its locks (the
            // fence's `FOR SHARE` among them, which a takeover waits for) until the server ends
            // the session: after 5 s idle in a transaction, not when TCP gives up minutes later.
            // A cut-off replica's sessions (its presence lock among them) end as fast: the
            // server probes an idle connection after 5 s, each second, three times, and drops
            // one whose data stays unacknowledged for 5 s (over TCP; a Unix socket has no use
            // for them).
            .connect_with(connect.application_name("orc-host").options([
                ("idle_in_transaction_session_timeout", "5s"),
                ("tcp_keepalives_idle", "5"),
                ("tcp_keepalives_interval", "1"),
                ("tcp_keepalives_count", "3"),
                ("tcp_user_timeout", "5000"),
            ]))
            .await
            .map_err(backend("connecting to PostgreSQL"))?;
        let store = Store {
            db: Db::Postgres(pool),
            caches: Default::default(),
            news: Default::default(),
            fenced: Default::default(),
        };
        store.migrate().await?;
        if let Db::Postgres(pool) = &store.db {
            store.caches.share(pool);
        }
        Ok(store)
    }

    async fn sqlite(connect: SqliteConnectOptions, options: &StoreOptions) -> Result<Store> {
        let path = connect.get_filename();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| StoreError::Config {
                location: path.display().to_string(),
                reason: format!("cannot create {}: {e}", parent.display()),
            })?;
        }
        let connect = connect
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(options.busy_timeout)
            .foreign_keys(true)
            .pragma("temp_store", "memory")
            .pragma("cache_size", "-32768");
        let pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            // A connection to a local file does not go stale; sqlx's test is one more round trip
            // to the connection's worker thread on every acquire (api-bench: ~15 % fewer
            // context switches in a 10,000-resource deploy without it).
            .test_before_acquire(false)
            .connect_with(connect)
            .await
            .map_err(backend("opening the SQLite database"))?;
        let store = Store {
            db: Db::Sqlite(pool),
            caches: Default::default(),
            news: Default::default(),
            fenced: Default::default(),
        };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> Result<()> {
        let backend = self.backend();
        let run = match &self.db {
            Db::Sqlite(pool) => SQLITE_MIGRATOR.run(pool).await,
            Db::Postgres(pool) => POSTGRES_MIGRATOR.run(pool).await,
        };
        run.map_err(|source| StoreError::Migrate { backend, source })
    }

    /// Users, roles or tokens changed here: the other replicas forget what they keep of
    /// principals ([`Store::access_changes`]).
    pub fn announce_access_change(&self) {
        self.caches.announce_access();
    }

    /// Moves on when another replica changed users, roles or tokens, or may have.
    pub fn access_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.caches.access.subscribe()
    }

    /// Whether copies of rows other replicas may change can be kept now (see `store::cache`).
    pub fn copies_trusted(&self) -> bool {
        self.caches.trusted()
    }

    pub fn backend(&self) -> Backend {
        match self.db {
            Db::Sqlite(_) => Backend::Sqlite,
            Db::Postgres(_) => Backend::Postgres,
        }
    }

    /// Counts a write refused by its fence.
    pub(crate) fn fenced_write(&self) {
        self.fenced.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Writes refused by their fence since this store was opened: batches of a scheduler's
    /// progress, plugin key/value writes.
    pub fn fenced_writes(&self) -> u64 {
        self.fenced.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// This process's turn at the write lock, for one write statement in autocommit (see
    /// [`BeginWrite::write_turn`]); hold it while the statement runs.
    pub(crate) async fn write_turn(&self) -> Result<Option<tokio::sync::OwnedMutexGuard<()>>> {
        on_pool!(self, pool => pool.write_turn().await.map_err(error::backend("waiting for the turn to write")))
    }

    /// Closes every connection, waiting for those in use to be returned.
    pub async fn close(&self) {
        on_pool!(self, pool => pool.close().await)
    }

    /// Whether the database answers a trivial query (readiness).
    pub async fn ping(&self) -> Result<()> {
        on_pool!(self, pool => sqlx::query("SELECT 1").execute(pool).await.map(drop).map_err(backend("pinging the database")))
    }
}

/// `scheme://user:secret@host/db` → `scheme://…@host/db`: locations go into error messages.
fn redact(location: &str) -> String {
    match (location.find("://"), location.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}…{}", &location[..s + 3], &location[at..]),
        _ => location.to_string(),
    }
}

/// Opens write transactions. SQLite: `BEGIN IMMEDIATE` takes the write lock up front, so a
/// transaction that reads before it writes waits for the busy timeout instead of failing when
/// another writer committed in between (a deferred transaction cannot upgrade a stale snapshot).
/// Writers of this process first take their turn at an in-process lock per database file:
/// SQLite's busy handler, which a writer finding the lock taken falls back to, sleeps 1, 2, 5,
/// 10 … ms between attempts, while a queued turn starts the moment the previous transaction
/// ends (api-bench: the kv writer and the scheduler's writer met a third of the time, waiting
/// about 1 s in all over a 10,000-resource deploy). The busy timeout still covers other
/// processes on the same file.
pub(crate) trait BeginWrite {
    type Db: sqlx::Database;
    async fn begin_write(&self) -> Result<WriteTx<Self::Db>, sqlx::Error>;

    /// The turn at the write lock (SQLite; `None` on PostgreSQL) for one write statement run on
    /// the pool in autocommit: held while it runs, it keeps that statement out of SQLite's busy
    /// handler too (a process row, an audit entry, a job written while the scheduler records).
    async fn write_turn(&self) -> Result<Option<tokio::sync::OwnedMutexGuard<()>>, sqlx::Error>;

    /// A write transaction that changes of one kind take in turns, even on PostgreSQL (where
    /// it first waits for the transaction-scoped advisory lock `key`): one that reads what
    /// another may be changing sees it committed.
    async fn begin_serialized(&self, key: i64) -> Result<WriteTx<Self::Db>, sqlx::Error>;
}

/// A write transaction: derefs to its connection like sqlx's `Transaction`, rolled back if
/// dropped uncommitted; on SQLite it holds this process's turn at the write lock until it ends.
pub(crate) struct WriteTx<DB: sqlx::Database> {
    tx: Transaction<'static, DB>,
    turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl<DB: sqlx::Database> WriteTx<DB> {
    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        let WriteTx { tx, turn } = self;
        tx.commit().await?;
        drop(turn);
        Ok(())
    }

    /// Rolls back now, before the turn is handed on (a dropped transaction rolls back only when
    /// its connection is next used).
    pub(crate) async fn rollback(self) -> Result<(), sqlx::Error> {
        let WriteTx { tx, turn } = self;
        tx.rollback().await?;
        drop(turn);
        Ok(())
    }
}

impl<DB: sqlx::Database> std::ops::Deref for WriteTx<DB> {
    type Target = DB::Connection;
    fn deref(&self) -> &DB::Connection {
        &self.tx
    }
}

impl<DB: sqlx::Database> std::ops::DerefMut for WriteTx<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.tx
    }
}

/// This process's write lock of the SQLite database `pool` opens, shared by every pool on the
/// same file name.
fn sqlite_write_lock(pool: &SqlitePool) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: LazyLock<std::sync::Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> = LazyLock::new(Default::default);
    let file = pool.connect_options().get_filename().to_path_buf();
    LOCKS.lock().expect("SQLite write locks").entry(file).or_default().clone()
}

impl BeginWrite for SqlitePool {
    type Db = Sqlite;
    async fn begin_write(&self) -> Result<WriteTx<Sqlite>, sqlx::Error> {
        // The turn first, then a connection: waiting for the turn holds no connection.
        let lock = sqlite_write_lock(self);
        let turn = tokio::time::timeout(self.options().get_acquire_timeout(), lock.lock_owned())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?;
        let tx = self.begin_with("BEGIN IMMEDIATE").await?;
        Ok(WriteTx { tx, turn: Some(turn) })
    }

    async fn write_turn(&self) -> Result<Option<tokio::sync::OwnedMutexGuard<()>>, sqlx::Error> {
        let lock = sqlite_write_lock(self);
        let turn = tokio::time::timeout(self.options().get_acquire_timeout(), lock.lock_owned())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?;
        Ok(Some(turn))
    }

    async fn begin_serialized(&self, _key: i64) -> Result<WriteTx<Sqlite>, sqlx::Error> {
        // `BEGIN IMMEDIATE`: SQLite's writers take turns already.
        self.begin_write().await
    }
}

impl BeginWrite for PgPool {
    type Db = Postgres;
    async fn begin_write(&self) -> Result<WriteTx<Postgres>, sqlx::Error> {
        Ok(WriteTx {
            tx: self.begin().await?,
            turn: None,
        })
    }

    async fn write_turn(&self) -> Result<Option<tokio::sync::OwnedMutexGuard<()>>, sqlx::Error> {
        Ok(None)
    }

    async fn begin_serialized(&self, key: i64) -> Result<WriteTx<Postgres>, sqlx::Error> {
        let mut tx = self.begin_write().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(key).execute(&mut *tx).await?;
        Ok(tx)
    }
}

/// SQLite's default limit on bound parameters per statement (`SQLITE_MAX_VARIABLE_NUMBER`).
pub(crate) const SQLITE_MAX_PARAMS: usize = 32_766;

/// Whether a SQLite read by a list of `rows` keys is kept prepared by its connection (sqlx's
/// statement cache). Its text varies with the key count, so a list of any size kept would keep
/// every size; but a process's tasks' states and a plugin's few keys are read again and again in a
/// few shapes, and preparing each anew was much of SQLite's work in `service-bench`. Multi-row
/// writes are not kept: measured with `api-bench`, keeping their small shapes made its deploy
/// ~10% slower.
pub(crate) const fn sqlite_keeps_prepared(rows: usize) -> bool {
    rows <= 16
}

/// Rows per multi-row SQLite statement with `columns` parameters per row.
pub(crate) const fn sqlite_rows_per_statement(columns: usize) -> usize {
    SQLITE_MAX_PARAMS / columns
}

/// (version, description, SQL) of each migration, in order.
type Embedded = &'static [(i64, &'static str, &'static str)];

const SQLITE_MIGRATIONS: Embedded = &[
    (1, "init", include_str!("../../migrations/sqlite/0001_init.sql")),
    (2, "operations", include_str!("../../migrations/sqlite/0002_operations.sql")),
    (3, "nodes", include_str!("../../migrations/sqlite/0003_nodes.sql")),
    (4, "clusters", include_str!("../../migrations/sqlite/0004_clusters.sql")),
    (5, "jobs", include_str!("../../migrations/sqlite/0005_jobs.sql")),
    (6, "users", include_str!("../../migrations/sqlite/0006_users.sql")),
    (7, "services", include_str!("../../migrations/sqlite/0007_services.sql")),
    (8, "revisions", include_str!("../../migrations/sqlite/0008_revisions.sql")),
    (9, "process_heads", include_str!("../../migrations/sqlite/0009_process_heads.sql")),
    (10, "audit_source", include_str!("../../migrations/sqlite/0010_audit_source.sql")),
    (11, "ownership", include_str!("../../migrations/sqlite/0011_ownership.sql")),
    (12, "commands", include_str!("../../migrations/sqlite/0012_commands.sql")),
    (
        13,
        "console_sessions",
        include_str!("../../migrations/sqlite/0013_console_sessions.sql"),
    ),
    (14, "events", include_str!("../../migrations/sqlite/0014_events.sql")),
];
const POSTGRES_MIGRATIONS: Embedded = &[
    (1, "init", include_str!("../../migrations/postgres/0001_init.sql")),
    (2, "operations", include_str!("../../migrations/postgres/0002_operations.sql")),
    (3, "nodes", include_str!("../../migrations/postgres/0003_nodes.sql")),
    (4, "clusters", include_str!("../../migrations/postgres/0004_clusters.sql")),
    (5, "jobs", include_str!("../../migrations/postgres/0005_jobs.sql")),
    (6, "users", include_str!("../../migrations/postgres/0006_users.sql")),
    (7, "services", include_str!("../../migrations/postgres/0007_services.sql")),
    (8, "revisions", include_str!("../../migrations/postgres/0008_revisions.sql")),
    (9, "process_heads", include_str!("../../migrations/postgres/0009_process_heads.sql")),
    (10, "audit_source", include_str!("../../migrations/postgres/0010_audit_source.sql")),
    (11, "ownership", include_str!("../../migrations/postgres/0011_ownership.sql")),
    (12, "commands", include_str!("../../migrations/postgres/0012_commands.sql")),
    (
        13,
        "console_sessions",
        include_str!("../../migrations/postgres/0013_console_sessions.sql"),
    ),
    (14, "events", include_str!("../../migrations/postgres/0014_events.sql")),
];

fn migrator(embedded: Embedded) -> Migrator {
    Migrator::with_migrations(
        embedded
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(version, description.into(), MigrationType::Simple, sql.into_sql_str(), false)
            })
            .collect(),
    )
}

static SQLITE_MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| migrator(SQLITE_MIGRATIONS));
static POSTGRES_MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| migrator(POSTGRES_MIGRATIONS));

/// Parses an id read from the database.
pub(crate) fn parse_id<T: std::str::FromStr>(text: &str, what: &str) -> Result<T> {
    text.parse()
        .map_err(|_| StoreError::corrupt(format!("{what} id `{text}` is not a UUID")))
}

/// Parses an enum name read from the database.
pub(crate) fn parse_name<T: std::str::FromStr<Err = crate::named::UnknownName>>(text: &str) -> Result<T> {
    text.parse()
        .map_err(|e: crate::named::UnknownName| StoreError::corrupt(e.to_string()))
}

pub(crate) fn error_info(code: Option<String>, message: Option<String>) -> Option<ErrorInfo> {
    match (code, message) {
        (None, None) => None,
        (code, message) => Some(ErrorInfo {
            code: code.unwrap_or_default(),
            message: message.unwrap_or_default(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_migration_file_is_embedded_in_order() {
        for (folder, embedded) in [("sqlite", SQLITE_MIGRATIONS), ("postgres", POSTGRES_MIGRATIONS)] {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations").join(folder);
            let mut files: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.ends_with(".sql"))
                .collect();
            files.sort();
            let listed: Vec<String> = embedded.iter().map(|(v, d, _)| format!("{v:04}_{d}.sql")).collect();
            assert_eq!(files, listed, "migrations/{folder} and the embedded list differ");
            for ((_, _, sql), file) in embedded.iter().zip(&files) {
                assert_eq!(*sql, std::fs::read_to_string(dir.join(file)).unwrap(), "{folder}/{file}");
            }
        }
        assert_eq!(
            SQLITE_MIGRATIONS.iter().map(|m| m.0).collect::<Vec<_>>(),
            POSTGRES_MIGRATIONS.iter().map(|m| m.0).collect::<Vec<_>>(),
            "both backends have the same migration versions"
        );
    }

    /// A store made before users (migration 5) keeps its admin tokens: they become tokens of a
    /// user `admin`, who holds the server-wide admin role.
    #[tokio::test]
    async fn the_admin_tokens_of_an_older_store_become_the_admin_users() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SQLITE_FILE);
        let connect = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .foreign_keys(true);
        let pool = SqlitePool::connect_with(connect).await.unwrap();
        migrator(&SQLITE_MIGRATIONS[..5]).run(&pool).await.unwrap();
        let hash = tokens::hash_token("orc_from_before");
        sqlx::query("INSERT INTO admin_tokens (id, token_hash, created_at) VALUES ($1, $2, 7)")
            .bind(TokenId::random().to_string())
            .bind(&hash)
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        let store = Store::open_sqlite(&path).await.unwrap();
        let (_, scope, account) = store.find_credential(&hash).await.unwrap().expect("the old token still works");
        assert_eq!(
            (account.name.as_str(), account.admin, account.disabled, scope),
            ("admin", true, false, None)
        );
        assert_eq!(store.count_users().await.unwrap(), 1);
    }

    #[test]
    fn locations_are_redacted() {
        assert_eq!(redact("postgres://orc:hunter2@db:5432/orc"), "postgres://…@db:5432/orc");
        assert_eq!(redact("sqlite:/var/lib/orc/orc.db"), "sqlite:/var/lib/orc/orc.db");
    }
}

//! `DbKv`: the runtime's `KvStore` (plugin key/value state, by scope and key) kept in the
//! database, so it lives where everything else of an environment lives and survives a move to
//! another replica.
//!
//! Plugins read and write their state on every action, so the store answers from memory and
//! writes behind:
//! - **Writes** are accepted into an in-memory overlay (the latest value or deletion per key, in
//!   the order they were made) and answered at once; one writer task commits what was accepted
//!   meanwhile as one transaction of multi-row statements (group commit, paced: see
//!   [`super::pace`]), then drops it from the overlay. A deletion of a key that is not there is
//!   answered and not written. A group that fails is retried, with backoff, until the database
//!   takes it: nothing accepted is dropped while the process lives.
//! - **Durability** is a fence, not a wait per write: [`DbKv::durable`] resolves once everything
//!   accepted before the call is committed. The scheduler's sink passes that fence before it
//!   stores a batch of states and actions, so a resource is never stored `deployed` ahead of the
//!   plugin state its action wrote. A crash loses both or neither; the resource is then deployed
//!   again.
//! - **Reads** answer from the overlay, then from a complete copy of the scope (loaded once, by
//!   the writer between two commits so that it matches what is committed, and kept current by
//!   every commit). A copy also answers for keys that do not exist, which a first deploy asks
//!   about for every resource. Copies are bounded ([`CACHE_BYTES`]); the least recently used
//!   scope is dropped first, and a scope too large to copy is read per key: the `get`s queued
//!   meanwhile are answered with one query per scope (`key IN (…)` on SQLite, `key = ANY($2)` on
//!   PostgreSQL), a few such queries in flight at once.
//! - **Forgetting** ([`DbKv::forget`]): a deleted environment's scopes are deleted by the writer
//!   after what was accepted before, and dropped from memory.
//! - **Usage** ([`KvStore::usage`], what an environment holds, for its quota): counted by the
//!   writer after what was accepted before is committed, with one aggregate over the
//!   environment's scopes (an index range: `scope >= 'env/' AND scope < 'env0'`). The runtime
//!   counts an environment once, then keeps the count current itself.
//!
//! - **Fencing** ([`DbKv::write_under`]): a write carries the epoch its environment was held
//!   under when it was accepted, and commits only while that is the environment's epoch — the
//!   group's transaction reads the fences first, with row locks on PostgreSQL, and a group with
//!   a stale epoch is rolled back and committed again without those writes. Once this replica
//!   lets an environment go ([`DbKv::stop_writing`]), its writes are refused at once.
//!
//! Architecture invariant: this process is the only writer of the scopes it serves (a scope is
//! `environment/plugin` and an environment is served by one replica at a time; the fence keeps a
//! replica that lost one from writing), so its copies stay right; a replica that takes an
//! environment drops what it kept of it first ([`DbKv::let_go`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use orc_node::BoxFuture;
use orc_runtime::capability::kv::{KvAccounts, KvError, KvStore, KvUsage};
use sqlx::{PgConnection, QueryBuilder, Row as _, Sqlite, SqliteConnection};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};

use super::error::backend_with;
use super::{BeginWrite as _, EnvironmentId, Epoch, Fence, Store, StoreError, now_ms, sqlite_keeps_prepared, sqlite_rows_per_statement};

/// Most writes committed together.
const MAX_WRITE_BATCH: usize = 4096;
/// Most reads answered by one query.
const MAX_READ_BATCH: usize = 1024;
/// Read queries running at once: one at a time would make every batch wait out the previous
/// one's round trip (PostgreSQL: repair and dryrun of 10,000 resources took twice as long).
const READS_IN_FLIGHT: usize = 4;
/// Bytes (keys and values) of the scope copies kept in memory, all scopes together, unless
/// [`DbKv::open_with_budget`] says otherwise. A scope larger than half of it is not copied but
/// read per key.
pub const CACHE_BYTES: usize = 64 << 20;
/// Bytes counted per entry besides its key and value (map slot, allocations).
const ENTRY_OVERHEAD: usize = 64;
/// The first retry of a failed commit, doubling up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(5);

/// What an upsert does with a key that exists: the new value replaces the old.
macro_rules! on_conflict {
    () => {
        " ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at"
    };
}

/// One statement for a run's sets on PostgreSQL: `UNNEST` of one array per column.
const UPSERT_POSTGRES: &str = concat!(
    "INSERT INTO plugin_kv (scope, key, value, updated_at) SELECT u.scope, u.key, u.value, $4 \
     FROM UNNEST($1::text[], $2::text[], $3::bytea[]) AS u(scope, key, value)",
    on_conflict!()
);

type Slot = (String, String);

/// An accepted write: a new value, or `None` for a deletion.
struct Write {
    seq: u64,
    scope: String,
    key: String,
    value: Option<Vec<u8>>,
    /// The epoch its environment was held under when it was accepted ([`DbKv::write_under`]):
    /// it commits only while that is the environment's epoch. `None`: unfenced.
    epoch: Option<Epoch>,
}

enum Command {
    Write(Write),
    /// Copy a scope into memory (between two commits), then answer.
    Load {
        scope: String,
        done: oneshot::Sender<()>,
    },
    /// Delete every scope that starts with the prefix, once the writes accepted before are
    /// committed; answers how many entries the database deleted.
    Forget {
        prefix: String,
        done: oneshot::Sender<Result<u64, sqlx::Error>>,
    },
    /// Drop the copies of every scope that starts with the prefix, once the writes accepted
    /// before are committed; the database keeps them.
    LetGo {
        prefix: String,
        done: oneshot::Sender<()>,
    },
    /// Count what the scopes of an environment hold, once the writes accepted before are
    /// committed.
    Usage {
        environment: String,
        done: oneshot::Sender<Result<KvUsage, sqlx::Error>>,
    },
}

/// What a read answers; one failed query fails every read it carried.
type ReadOutcome = Result<Option<Vec<u8>>, Arc<sqlx::Error>>;

struct ReadRequest {
    scope: String,
    key: String,
    reply: oneshot::Sender<ReadOutcome>,
}

/// A scope as this process knows it.
enum Copy {
    /// Every committed entry of the scope.
    Complete {
        /// Ordered, so that listing a prefix reads only the keys under it.
        entries: BTreeMap<String, Vec<u8>>,
        bytes: usize,
        used: u64,
    },
    /// Too large to copy: read per key.
    TooLarge { used: u64 },
}

impl Copy {
    fn bytes(&self) -> usize {
        match self {
            Copy::Complete { bytes, .. } => *bytes,
            Copy::TooLarge { .. } => 0,
        }
    }

    fn used(&self) -> u64 {
        match self {
            Copy::Complete { used, .. } | Copy::TooLarge { used } => *used,
        }
    }

    fn touch(&mut self, now: u64) {
        match self {
            Copy::Complete { used, .. } | Copy::TooLarge { used } => *used = now,
        }
    }
}

fn entry_bytes(key: &str, value: &[u8]) -> usize {
    key.len() + value.len() + ENTRY_OVERHEAD
}

struct Memory {
    /// Bytes the complete copies may take.
    budget: usize,
    /// The sequence number of the last accepted write.
    accepted: u64,
    /// Accepted writes not committed yet: the last one per key, with its sequence number.
    overlay: HashMap<Slot, (u64, Option<Vec<u8>>)>,
    copies: HashMap<String, Copy>,
    /// Bytes of all complete copies.
    copied: usize,
    /// A clock for least-recently-used eviction.
    clock: u64,
    /// Under which epoch each environment's scopes are written, by environment id: `Some` while
    /// held ([`DbKv::write_under`]), `None` once let go ([`DbKv::stop_writing`]: writes are
    /// refused at once). An environment not listed is written unfenced.
    holds: HashMap<String, Option<Epoch>>,
}

/// Where a read finds its answer.
enum Found {
    Value(Option<Vec<u8>>),
    /// The scope has no copy yet.
    NotCopied,
    /// The scope is too large to copy.
    InDatabase,
}

impl Memory {
    fn find(&mut self, scope: &str, key: &str) -> Found {
        if let Some((_, value)) = self.overlay.get(&(scope.to_string(), key.to_string())) {
            return Found::Value(value.clone());
        }
        self.clock += 1;
        let now = self.clock;
        match self.copies.get_mut(scope) {
            Some(copy) => {
                copy.touch(now);
                match copy {
                    Copy::Complete { entries, .. } => Found::Value(entries.get(key).cloned()),
                    Copy::TooLarge { .. } => Found::InDatabase,
                }
            }
            None => Found::NotCopied,
        }
    }

    /// Applies a committed write to the scope's copy, and drops it from the overlay unless a
    /// later write of the key is waiting.
    fn committed(&mut self, write: Write) {
        if let Some(Copy::Complete { entries, bytes, .. }) = self.copies.get_mut(&write.scope) {
            let before = *bytes;
            if let Some(old) = entries.remove(&write.key) {
                *bytes -= entry_bytes(&write.key, &old);
            }
            if let Some(value) = &write.value {
                *bytes += entry_bytes(&write.key, value);
                entries.insert(write.key.clone(), value.clone());
            }
            self.copied = self.copied + *bytes - before;
        }
        let slot = (write.scope, write.key);
        if self.overlay.get(&slot).is_some_and(|(seq, _)| *seq == write.seq) {
            self.overlay.remove(&slot);
        }
    }

    /// Drops a write the fence refused from the overlay (unless a later write of the key is
    /// waiting): it never reached the database, and the copies never saw it.
    fn refused(&mut self, write: Write) {
        let slot = (write.scope, write.key);
        if self.overlay.get(&slot).is_some_and(|(seq, _)| *seq == write.seq) {
            self.overlay.remove(&slot);
        }
    }

    /// Drops the copies of the scopes under `prefix`, and the overlay's writes to them that are
    /// committed (`seq` at most `through`).
    fn forget(&mut self, prefix: &str, through: u64) {
        let copied = &mut self.copied;
        self.copies.retain(|scope, copy| {
            let keep = !scope.starts_with(prefix);
            if !keep {
                *copied -= copy.bytes();
            }
            keep
        });
        self.overlay
            .retain(|(scope, _), (seq, _)| !scope.starts_with(prefix) || *seq > through);
    }

    /// Drops the least recently used copies until the copies fit.
    fn evict(&mut self) {
        while self.copied > self.budget {
            let Some(oldest) = self
                .copies
                .iter()
                .filter(|(_, c)| matches!(c, Copy::Complete { .. }))
                .min_by_key(|(_, c)| c.used())
                .map(|(s, _)| s.clone())
            else {
                return;
            };
            if let Some(copy) = self.copies.remove(&oldest) {
                self.copied -= copy.bytes();
            }
        }
    }
}

struct Shared {
    memory: Mutex<Memory>,
    /// The sequence number of the last committed write.
    durable: watch::Sender<u64>,
}

impl Shared {
    fn memory(&self) -> MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Plugin key/value state in the store's database. Dropping it lets its writer commit what was
/// accepted, then end.
pub struct DbKv {
    store: Store,
    shared: Arc<Shared>,
    reads: mpsc::UnboundedSender<ReadRequest>,
    commands: mpsc::UnboundedSender<Command>,
    accounts: KvAccounts,
}

impl std::fmt::Debug for DbKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbKv")
            .field("backend", &self.store.backend())
            .finish_non_exhaustive()
    }
}

impl DbKv {
    /// Starts the reader and writer tasks (on the calling runtime) over `store`'s pool.
    pub async fn open(store: &Store) -> Result<DbKv, StoreError> {
        DbKv::open_with_budget(store, CACHE_BYTES).await
    }

    /// [`DbKv::open`] with `budget` bytes for the copies of scopes.
    pub async fn open_with_budget(store: &Store, budget: usize) -> Result<DbKv, StoreError> {
        let (reads, read_queue) = mpsc::unbounded_channel();
        let (commands, command_queue) = mpsc::unbounded_channel();
        let memory = Memory {
            budget,
            accepted: 0,
            overlay: HashMap::new(),
            copies: HashMap::new(),
            copied: 0,
            clock: 0,
            holds: HashMap::new(),
        };
        let shared = Arc::new(Shared {
            memory: Mutex::new(memory),
            durable: watch::Sender::new(0),
        });
        tokio::spawn(reader(store.clone(), read_queue));
        tokio::spawn(writer(store.clone(), shared.clone(), command_queue));
        Ok(DbKv {
            store: store.clone(),
            shared,
            reads,
            commands,
            accounts: KvAccounts::default(),
        })
    }

    /// Resolves once every write accepted before this call is committed.
    pub fn durable(&self) -> impl Future<Output = ()> + Send + 'static {
        let target = self.shared.memory().accepted;
        let mut durable = self.shared.durable.subscribe();
        async move {
            // The writer only ends once the last sender is gone, after committing everything.
            let _ = durable.wait_for(|committed| *committed >= target).await;
        }
    }

    /// Deletes the state of every scope that starts with `prefix` (an environment's
    /// `environment-id/`), in the database and in memory, after the writes accepted before this
    /// call are committed, and what the runtime counted of that environment. Answers how many
    /// entries were deleted.
    pub async fn forget(&self, prefix: &str) -> Result<u64, StoreError> {
        if let Some(environment) = prefix.strip_suffix('/') {
            self.accounts.forget(environment);
        }
        let context = || format!("forgetting plugin state under `{prefix}`");
        let forget = |done| Command::Forget {
            prefix: prefix.to_string(),
            done,
        };
        // The writer ends only when this handle is gone, so it answers.
        match self.ask(forget).await {
            Some(answer) => answer.map_err(backend_with(context)),
            None => Err(backend_with(context)(sqlx::Error::WorkerCrashed)),
        }
    }

    /// Drops what this process keeps of the scopes that start with `prefix` (an environment's
    /// `environment-id/`) and what the runtime counted of them, after the writes accepted before
    /// are committed; the database keeps them. What a replica does with an environment it takes
    /// (another replica may have written its scopes meanwhile), so that the one-writer rule
    /// holds across replicas.
    pub async fn let_go(&self, prefix: &str) {
        if let Some(environment) = prefix.strip_suffix('/') {
            self.accounts.forget(environment);
        }
        let let_go = |done| Command::LetGo {
            prefix: prefix.to_string(),
            done,
        };
        let _ = self.ask(let_go).await;
    }

    /// Writes `fence.env`'s scopes under `fence` from now on: each write accepted commits only
    /// while its epoch is the environment's (checked, with a row lock, in the transaction that
    /// commits it), so a replica that lost the environment writes nothing after the takeover.
    pub fn write_under(&self, fence: &Fence) {
        self.shared.memory().holds.insert(fence.env.to_string(), Some(fence.epoch));
    }

    /// Refuses every write of `env`'s scopes from now on (this replica let it go); what was
    /// accepted before commits while its epoch is still the environment's.
    pub fn stop_writing(&self, env: &EnvironmentId) {
        self.shared.memory().holds.insert(env.to_string(), None);
    }

    fn failed(&self, doing: String, source: impl std::fmt::Display) -> KvError {
        KvError::Io {
            context: format!("{} database: {doing}", self.store.backend()),
            source: std::io::Error::other(source.to_string()),
        }
    }

    async fn read(&self, scope: &str, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        let doing = || format!("cannot read `{key}` in `{scope}`");
        let stopped = || self.failed(doing(), "the key/value store has stopped");
        // At most twice: a copy loaded for this read may be evicted before it is consulted.
        for _ in 0..2 {
            let found = self.shared.memory().find(scope, key);
            match found {
                Found::Value(value) => return Ok(value),
                Found::InDatabase => break,
                Found::NotCopied => {
                    if !self.copy_scope(scope).await {
                        return Err(stopped());
                    }
                }
            }
        }
        let (reply, answer) = oneshot::channel();
        let request = ReadRequest {
            scope: scope.to_string(),
            key: key.to_string(),
            reply,
        };
        if self.reads.send(request).is_err() {
            return Err(stopped());
        }
        // A write accepted after the query ran is in the overlay and wins.
        let read = match answer.await {
            Ok(Ok(value)) => value,
            Ok(Err(e)) => return Err(self.failed(doing(), e)),
            Err(_) => return Err(stopped()),
        };
        let overlay = self.shared.memory().overlay.get(&(scope.to_string(), key.to_string())).cloned();
        Ok(overlay.map_or(read, |(_, value)| value))
    }

    /// What the scopes of `environment` hold once the writes accepted before are committed.
    async fn count_usage(&self, environment: &str) -> Result<KvUsage, KvError> {
        let doing = || format!("cannot count what environment `{environment}` holds");
        let usage = |done| Command::Usage {
            environment: environment.to_string(),
            done,
        };
        match self.ask(usage).await {
            Some(answer) => answer.map_err(|e| self.failed(doing(), e)),
            None => Err(self.failed(doing(), "the key/value writer has stopped")),
        }
    }

    /// Accepts a write (`None`: a deletion); answered before it is committed.
    fn accept(&self, scope: &str, key: &str, value: Option<Vec<u8>>) -> Result<(), KvError> {
        let mut memory = self.shared.memory();
        let environment = environment_of(scope);
        let epoch = match memory.holds.get(environment) {
            None => None,
            Some(Some(epoch)) => Some(*epoch),
            Some(None) => {
                self.store.fenced_write();
                return Err(self.failed(
                    format!("cannot write `{key}` in `{scope}`"),
                    format!("environment {environment} is run by another replica now"),
                ));
            }
        };
        memory.accepted += 1;
        let seq = memory.accepted;
        memory.overlay.insert((scope.to_string(), key.to_string()), (seq, value.clone()));
        // Sent under the lock: the writer commits in the order the overlay saw.
        let write = Write {
            seq,
            scope: scope.to_string(),
            key: key.to_string(),
            value,
            epoch,
        };
        if self.commands.send(Command::Write(write)).is_err() {
            memory.overlay.remove(&(scope.to_string(), key.to_string()));
            return Err(self.failed(format!("cannot write `{key}` in `{scope}`"), "the key/value writer has stopped"));
        }
        Ok(())
    }

    /// Asks the writer to copy `scope` into memory; `false` if it has stopped.
    async fn copy_scope(&self, scope: &str) -> bool {
        let load = |done| Command::Load {
            scope: scope.to_string(),
            done,
        };
        self.ask(load).await.is_some()
    }

    /// Sends the writer the command `make` builds around a reply channel and waits for the
    /// reply; `None` if the writer has stopped.
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (done, reply) = oneshot::channel();
        self.commands.send(make(done)).ok()?;
        reply.await.ok()
    }

    async fn list_keys(&self, scope: &str, prefix: &str) -> Result<Vec<String>, KvError> {
        let doing = || format!("cannot list `{prefix}…` in `{scope}`");
        let mut attempts = 0;
        // The copy's keys (if the scope has a copy) and the writes not committed yet, seen at
        // once; without a copy each of those writes is either committed before the query below
        // runs (which then sees it) or in the snapshot.
        let (copied, overlaid) = loop {
            let (copied, overlaid, not_copied) = {
                let mut memory = self.shared.memory();
                memory.clock += 1;
                let now = memory.clock;
                let (copied, not_copied) = match memory.copies.get_mut(scope) {
                    Some(copy) => {
                        copy.touch(now);
                        match copy {
                            Copy::Complete { entries, .. } => (
                                Some(
                                    entries
                                        .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
                                        .map(|(k, _)| k)
                                        .take_while(|k| k.starts_with(prefix))
                                        .cloned()
                                        .collect::<Vec<_>>(),
                                ),
                                false,
                            ),
                            Copy::TooLarge { .. } => (None, false),
                        }
                    }
                    None => (None, true),
                };
                let overlaid: HashMap<String, bool> = memory
                    .overlay
                    .iter()
                    .filter(|((s, k), _)| s == scope && k.starts_with(prefix))
                    .map(|((_, k), (_, value))| (k.clone(), value.is_some()))
                    .collect();
                (copied, overlaid, not_copied)
            };
            attempts += 1;
            if !not_copied || attempts > 2 {
                break (copied, overlaid);
            }
            if !self.copy_scope(scope).await {
                return Err(self.failed(doing(), "the key/value store has stopped"));
            }
        };
        let mut keys: Vec<String> = match copied {
            Some(keys) => keys,
            None => {
                let listed: Result<Vec<String>, sqlx::Error> = on_pool!(self.store, pool => {
                    sqlx::query_scalar(
                        "SELECT key FROM plugin_kv WHERE scope = $1 AND substr(key, 1, length(CAST($2 AS TEXT))) = $2",
                    )
                    .bind(scope)
                    .bind(prefix)
                    .fetch_all(pool)
                    .await
                });
                listed.map_err(|e| self.failed(doing(), e))?
            }
        };
        keys.retain(|k| overlaid.get(k).copied().unwrap_or(true));
        keys.extend(overlaid.into_iter().filter(|(_, present)| *present).map(|(k, _)| k));
        keys.sort_unstable();
        keys.dedup();
        Ok(keys)
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
            Ok(found) => {
                for r in requests {
                    let value = found.get(&r.key).cloned();
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
                for row in q.build().persistent(sqlite_keeps_prepared(chunk.len())).fetch_all(pool).await? {
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

/// Commits accepted writes in groups, in the order they were accepted, and loads scope copies
/// between commits. Ends once every sender is gone and everything accepted is committed.
async fn writer(store: Store, shared: Arc<Shared>, queued: mpsc::UnboundedReceiver<Command>) {
    let mut commands = Vec::new();
    // Spaced commits (`super::pace`): a plugin's writes come one per action.
    let mut queued = super::pace::Paced::new(queued);
    while queued.receive(&mut commands, MAX_WRITE_BATCH).await > 0 {
        let mut writes = Vec::new();
        let mut loads = Vec::new();
        for command in commands.drain(..) {
            match command {
                Command::Write(w) => writes.push(w),
                Command::Load { scope, done } => loads.push((scope, done)),
                Command::Forget { prefix, done } => {
                    // What was accepted before goes first.
                    commit_and_apply(&store, &shared, std::mem::take(&mut writes)).await;
                    let deleted = delete_scopes(&store, &prefix).await;
                    let through = *shared.durable.borrow();
                    shared.memory().forget(&prefix, through);
                    let _ = done.send(deleted);
                }
                Command::LetGo { prefix, done } => {
                    commit_and_apply(&store, &shared, std::mem::take(&mut writes)).await;
                    let through = *shared.durable.borrow();
                    shared.memory().forget(&prefix, through);
                    let _ = done.send(());
                }
                Command::Usage { environment, done } => {
                    // What was accepted before is counted.
                    commit_and_apply(&store, &shared, std::mem::take(&mut writes)).await;
                    let _ = done.send(usage(&store, &environment).await);
                }
            }
        }
        commit_and_apply(&store, &shared, writes).await;
        // Nothing of this process is committed but not applied to the copies here, so a copy
        // loaded now matches the database.
        for (scope, done) in loads {
            load(&store, &shared, scope).await;
            let _ = done.send(());
        }
    }
}

/// Commits `writes` (if any), then applies them to the copies and moves the durable mark. The
/// writes of an environment held under an epoch that is no longer its own are refused (dropped,
/// counted), the others committed.
async fn commit_and_apply(store: &Store, shared: &Shared, mut writes: Vec<Write>) {
    let Some(last) = writes.last().map(|w| w.seq) else {
        return;
    };
    loop {
        let fenced = commit(store, &writes).await;
        if fenced.is_empty() {
            break;
        }
        let (refused, rest): (Vec<Write>, Vec<Write>) = writes.into_iter().partition(|w| fenced.contains(environment_of(&w.scope)));
        tracing::warn!(environments = ?fenced, writes = refused.len(),
            "plugin key/value writes refused: their environment is run by another replica now");
        for _ in &refused {
            store.fenced_write();
        }
        {
            let mut memory = shared.memory();
            for w in refused {
                memory.refused(w);
            }
        }
        writes = rest;
        if writes.is_empty() {
            break;
        }
    }
    {
        let mut memory = shared.memory();
        for w in writes {
            memory.committed(w);
        }
        memory.evict();
    }
    shared.durable.send_replace(last);
}

/// The environment a scope belongs to (`environment/plugin`).
fn environment_of(scope: &str) -> &str {
    scope.split_once('/').map_or(scope, |(environment, _)| environment)
}

/// Deletes the entries of every scope that starts with `prefix`.
async fn delete_scopes(store: &Store, prefix: &str) -> Result<u64, sqlx::Error> {
    on_pool!(store, pool => {
        let mut tx = pool.begin_write().await?;
        let deleted = sqlx::query("DELETE FROM plugin_kv WHERE substr(scope, 1, length(CAST($1 AS TEXT))) = $1")
            .bind(prefix)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(deleted)
    })
}

/// What the scopes of `environment` hold in the database: `environment/…` is the index range
/// from `environment/` up to `environment0` (`0` follows `/`; text compares byte by byte).
async fn usage(store: &Store, environment: &str) -> Result<KvUsage, sqlx::Error> {
    let (from, to) = (format!("{environment}/"), format!("{environment}0"));
    let (keys, bytes): (i64, i64) = match &store.db {
        super::Db::Sqlite(pool) => {
            sqlx::query_as(
                "SELECT COUNT(*), COALESCE(SUM(length(CAST(key AS BLOB)) + length(value)), 0) \
                 FROM plugin_kv WHERE scope >= $1 AND scope < $2",
            )
            .bind(&from)
            .bind(&to)
            .fetch_one(pool)
            .await?
        }
        super::Db::Postgres(pool) => {
            sqlx::query_as(
                "SELECT COUNT(*), CAST(COALESCE(SUM(octet_length(key) + octet_length(value)), 0) AS BIGINT) \
                 FROM plugin_kv WHERE scope >= $1 AND scope < $2",
            )
            .bind(&from)
            .bind(&to)
            .fetch_one(pool)
            .await?
        }
    };
    Ok(KvUsage {
        keys: keys.max(0) as u64,
        bytes: bytes.max(0) as u64,
    })
}

/// Commits `writes` in one transaction, retrying with backoff until the database takes them or
/// refuses them by their fence. Returns the environments whose writes the fence refused (the
/// transaction was rolled back: nothing of it is committed); empty once committed.
async fn commit(store: &Store, writes: &[Write]) -> HashSet<String> {
    let mut delay = FIRST_RETRY;
    let mut attempt = 1u32;
    // The epoch each environment's writes were accepted under (one per group: a replica holds
    // an environment under one epoch at a time, and let go writes none).
    let mut fences: BTreeMap<&str, Epoch> = BTreeMap::new();
    for w in writes {
        if let Some(epoch) = w.epoch {
            fences.insert(environment_of(&w.scope), epoch);
        }
    }
    loop {
        let now = now_ms();
        let committed: Result<HashSet<String>, sqlx::Error> = match &store.db {
            super::Db::Sqlite(pool) => {
                async {
                    let mut tx = pool.begin_write().await?;
                    let mut fenced = HashSet::new();
                    for (environment, epoch) in &fences {
                        let current: Option<Epoch> = sqlx::query_scalar("SELECT epoch FROM env_fences WHERE environment_id = $1")
                            .bind(*environment)
                            .fetch_optional(&mut *tx)
                            .await?;
                        if current != Some(*epoch) {
                            fenced.insert(environment.to_string());
                        }
                    }
                    if !fenced.is_empty() {
                        tx.rollback().await?;
                        return Ok(fenced);
                    }
                    for run in runs(writes) {
                        apply_run_sqlite(&mut tx, run, now).await?;
                    }
                    tx.commit().await?;
                    Ok(fenced)
                }
                .await
            }
            super::Db::Postgres(pool) => {
                async {
                    let mut tx = pool.begin_write().await?;
                    let mut fenced = HashSet::new();
                    if !fences.is_empty() {
                        // Row locks: a takeover waits for this transaction to end.
                        let environments: Vec<&str> = fences.keys().copied().collect();
                        let current: HashMap<String, Epoch> =
                            sqlx::query_as("SELECT environment_id, epoch FROM env_fences WHERE environment_id = ANY($1) FOR SHARE")
                                .bind(&environments)
                                .fetch_all(&mut *tx)
                                .await?
                                .into_iter()
                                .collect();
                        for (environment, epoch) in &fences {
                            if current.get(*environment) != Some(epoch) {
                                fenced.insert(environment.to_string());
                            }
                        }
                    }
                    if !fenced.is_empty() {
                        tx.rollback().await?;
                        return Ok(fenced);
                    }
                    for run in runs(writes) {
                        apply_run_postgres(&mut tx, run, now).await?;
                    }
                    tx.commit().await?;
                    Ok(fenced)
                }
                .await
            }
        };
        match committed {
            Ok(fenced) => return fenced,
            Err(e) => {
                tracing::error!(writes = writes.len(), attempt, error = %e, retry_in_ms = delay.as_millis() as u64,
                    "cannot commit plugin key/value writes; retrying (they are kept in memory meanwhile)");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_RETRY);
                attempt += 1;
            }
        }
    }
}

/// Copies `scope` into memory, unless it has a copy or is too large (then it is marked so).
async fn load(store: &Store, shared: &Shared, scope: String) {
    if shared.memory().copies.contains_key(&scope) {
        return;
    }
    let rows: Result<Vec<(String, Vec<u8>)>, sqlx::Error> = on_pool!(store, pool => {
        sqlx::query_as("SELECT key, value FROM plugin_kv WHERE scope = $1")
            .bind(&scope)
            .fetch_all(pool)
            .await
    });
    let rows = match rows {
        Ok(rows) => rows,
        // The reads fall back to the database, which answers them (or says why not).
        Err(e) => {
            tracing::warn!(%scope, error = %e, "cannot copy a key/value scope into memory; reading per key");
            return;
        }
    };
    let bytes: usize = rows.iter().map(|(k, v)| entry_bytes(k, v)).sum();
    let mut memory = shared.memory();
    memory.clock += 1;
    let used = memory.clock;
    let copy = if bytes > memory.budget / 2 {
        tracing::info!(%scope, entries = rows.len(), bytes, "key/value scope too large to keep in memory; read per key");
        Copy::TooLarge { used }
    } else {
        memory.copied += bytes;
        Copy::Complete {
            entries: rows.into_iter().collect(),
            bytes,
            used,
        }
    };
    memory.copies.insert(scope, copy);
    memory.evict();
}

/// Cuts `writes` into consecutive runs in which no (scope, key) repeats: within a run the order
/// of the writes does not matter, so each run is one multi-row upsert and one multi-row delete.
fn runs(writes: &[Write]) -> Vec<&[Write]> {
    let mut runs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut start = 0;
    for (i, w) in writes.iter().enumerate() {
        if !seen.insert((w.scope.as_str(), w.key.as_str())) {
            runs.push(&writes[start..i]);
            seen.clear();
            seen.insert((w.scope.as_str(), w.key.as_str()));
            start = i;
        }
    }
    runs.push(&writes[start..]);
    runs
}

async fn apply_run_sqlite(conn: &mut SqliteConnection, run: &[Write], now: i64) -> Result<(), sqlx::Error> {
    let sets: Vec<(&str, &str, &[u8])> = run
        .iter()
        .filter_map(|w| Some((w.scope.as_str(), w.key.as_str(), w.value.as_deref()?)))
        .collect();
    for chunk in sets.chunks(sqlite_rows_per_statement(4)) {
        let mut q = QueryBuilder::<Sqlite>::new("INSERT INTO plugin_kv (scope, key, value, updated_at) ");
        q.push_values(chunk, |mut row, (scope, key, value)| {
            row.push_bind(*scope).push_bind(*key).push_bind(*value).push_bind(now);
        });
        q.push(on_conflict!());
        q.build().persistent(false).execute(&mut *conn).await?;
    }
    let deletes: Vec<(&str, &str)> = run
        .iter()
        .filter(|w| w.value.is_none())
        .map(|w| (w.scope.as_str(), w.key.as_str()))
        .collect();
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
        q.push(")");
        q.build().persistent(false).execute(&mut *conn).await?;
    }
    Ok(())
}

async fn apply_run_postgres(conn: &mut PgConnection, run: &[Write], now: i64) -> Result<(), sqlx::Error> {
    let (mut scopes, mut keys, mut values) = (Vec::new(), Vec::new(), Vec::new());
    let (mut delete_scopes, mut delete_keys) = (Vec::new(), Vec::new());
    for w in run {
        match &w.value {
            Some(value) => {
                scopes.push(w.scope.as_str());
                keys.push(w.key.as_str());
                values.push(value.as_slice());
            }
            None => {
                delete_scopes.push(w.scope.as_str());
                delete_keys.push(w.key.as_str());
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
    if !delete_scopes.is_empty() {
        sqlx::query(
            "DELETE FROM plugin_kv k USING UNNEST($1::text[], $2::text[]) AS d(scope, key) \
             WHERE k.scope = d.scope AND k.key = d.key",
        )
        .bind(&delete_scopes)
        .bind(&delete_keys)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

impl KvStore for DbKv {
    fn get<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, KvError>> {
        Box::pin(self.read(scope, key))
    }

    fn set<'a>(&'a self, scope: &'a str, key: &'a str, value: &'a [u8]) -> BoxFuture<'a, Result<(), KvError>> {
        // Accepted when first polled, not when made: calls apply in the order they are awaited.
        Box::pin(async move { self.accept(scope, key, Some(value.to_vec())) })
    }

    fn delete<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<bool, KvError>> {
        Box::pin(async move {
            let existed = self.read(scope, key).await?.is_some();
            // Deleting what is not there changes nothing: nothing to commit (a plugin that
            // forgets its records "just in case" does it on every action). It takes effect
            // where it read: a write of the key racing it lands after it.
            if existed {
                self.accept(scope, key, None)?;
            }
            Ok(existed)
        })
    }

    fn list<'a>(&'a self, scope: &'a str, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, KvError>> {
        Box::pin(self.list_keys(scope, prefix))
    }

    fn usage<'a>(&'a self, environment: &'a str) -> BoxFuture<'a, Result<KvUsage, KvError>> {
        Box::pin(self.count_usage(environment))
    }

    fn accounts(&self) -> &KvAccounts {
        &self.accounts
    }
}

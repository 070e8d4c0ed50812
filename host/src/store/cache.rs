//! Rows read on every request and written seldom, kept beside the database: environments (read
//! by every API call, watcher and release) and the node list (read by every process placement
//! and connection delivery). Every write of them is a method of [`Store`](super::Store) that
//! says so ([`RowCache::writing`]).
//!
//! A writer forgets the rows it changes when it starts and again when it is over (committed,
//! failed, or of unknown outcome alike), so a copy read while it wrote never outlives it. A reader
//! that missed notes the cache's epoch, reads the database and keeps what it read only if no
//! write started or ended meanwhile.
//!
//! Other replicas on the database write these rows too (a node registered through one is used
//! by all): on PostgreSQL a write that is over is also announced (`NOTIFY orc_rows`, the cache
//! and the key), and every replica listens on a session of its own and forgets what it is told
//! of, moments after the commit. While that session is down (a notification may have been
//! lost) nothing is kept, and everything is forgotten when it is back.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::mpsc;

use super::{Environment, EnvironmentId, NodeRecord};

/// The channel writes are announced on (PostgreSQL).
const CHANNEL: &str = "orc_rows";

/// The caches of one [`Store`](super::Store) (shared by its clones).
#[derive(Debug)]
pub(crate) struct Caches {
    pub(crate) environments: RowCache<EnvironmentId, Environment>,
    /// Every node, by name (the one key is `()`).
    pub(crate) nodes: RowCache<(), Arc<Vec<NodeRecord>>>,
    /// Moves on when another replica changed users, roles or tokens (or may have: its
    /// announcements could not be heard): what the application keeps of principals goes.
    pub(crate) access: tokio::sync::watch::Sender<u64>,
    shared: OnceLock<Shared>,
    /// Dropped with the caches: the listener ends (it holds the pool, and so its session).
    alive: tokio::sync::watch::Sender<()>,
}

impl Default for Caches {
    fn default() -> Caches {
        Caches {
            environments: RowCache::named("environments"),
            nodes: RowCache::named("nodes"),
            access: tokio::sync::watch::channel(0).0,
            shared: OnceLock::new(),
            alive: tokio::sync::watch::channel(()).0,
        }
    }
}

/// A key as a notification names it.
pub(crate) trait Key: Hash + Eq + Clone {
    fn text(&self) -> String;
    fn parse(text: &str) -> Option<Self>;
}

impl Key for EnvironmentId {
    fn text(&self) -> String {
        self.to_string()
    }
    fn parse(text: &str) -> Option<Self> {
        text.parse().ok()
    }
}

impl Key for () {
    fn text(&self) -> String {
        String::new()
    }
    fn parse(_: &str) -> Option<Self> {
        Some(())
    }
}

/// Where a cache announces its writes, and whether it hears the others' (see the module).
#[derive(Debug)]
struct Shared {
    announce: mpsc::UnboundedSender<String>,
    listening: Arc<AtomicBool>,
}

#[derive(Debug)]
pub(crate) struct RowCache<K, V> {
    rows: Mutex<Rows<K, V>>,
    name: &'static str,
    shared: OnceLock<Shared>,
}

#[derive(Debug)]
struct Rows<K, V> {
    /// Moves on whenever a write starts or ends.
    epoch: u64,
    rows: HashMap<K, V>,
}

impl<K, V> RowCache<K, V> {
    fn named(name: &'static str) -> RowCache<K, V> {
        RowCache {
            rows: Mutex::new(Rows {
                epoch: 0,
                rows: HashMap::new(),
            }),
            name,
            shared: OnceLock::new(),
        }
    }
}

impl<K, V> Default for RowCache<K, V> {
    fn default() -> Self {
        RowCache::named("rows")
    }
}

/// A miss: the epoch to hand back to [`RowCache::install`] with what the database said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Miss(u64);

impl<K: Key, V: Clone> RowCache<K, V> {
    fn rows(&self) -> std::sync::MutexGuard<'_, Rows<K, V>> {
        self.rows.lock().expect("row cache")
    }

    pub(crate) fn get(&self, key: &K) -> Result<V, Miss> {
        let rows = self.rows();
        rows.rows.get(key).cloned().ok_or(Miss(rows.epoch))
    }

    /// The first row `matches`, if a kept one does.
    pub(crate) fn find(&self, matches: impl Fn(&V) -> bool) -> Result<V, Miss> {
        let rows = self.rows();
        rows.rows.values().find(|v| matches(v)).cloned().ok_or(Miss(rows.epoch))
    }

    /// Keeps `value`, read from the database after `miss`, unless a write started or ended since.
    pub(crate) fn install(&self, miss: Miss, key: K, value: V) {
        // Not hearing the other replicas' writes, nothing is kept.
        if self.shared.get().is_some_and(|s| !s.listening.load(Ordering::SeqCst)) {
            return;
        }
        let mut rows = self.rows();
        if rows.epoch == miss.0 {
            rows.rows.insert(key, value);
        }
    }

    /// Forgets `key` (`None`: every row) now and again when the returned guard is dropped: hold
    /// it across the write.
    pub(crate) fn writing(&self, key: Option<K>) -> Writing<'_, K, V> {
        let writing = Writing { cache: self, key };
        writing.forget();
        writing
    }
}

impl<K: Key, V: Clone> RowCache<K, V> {
    /// Forgets `key` (`None`: every row).
    fn forget(&self, key: Option<&K>) {
        let mut rows = self.rows();
        rows.epoch += 1;
        match key {
            Some(key) => {
                rows.rows.remove(key);
            }
            None => rows.rows.clear(),
        }
    }

    /// What another replica announced: `text` is the key, `*` every row.
    fn heard(&self, text: &str) {
        match text {
            "*" => self.forget(None),
            text => match K::parse(text) {
                Some(key) => self.forget(Some(&key)),
                None => self.forget(None),
            },
        }
    }
}

/// A write under way (see [`RowCache::writing`]).
pub(crate) struct Writing<'a, K: Key, V: Clone> {
    cache: &'a RowCache<K, V>,
    key: Option<K>,
}

impl<K: Key, V: Clone> Writing<'_, K, V> {
    fn forget(&self) {
        self.cache.forget(self.key.as_ref());
    }
}

impl<K: Key, V: Clone> Drop for Writing<'_, K, V> {
    fn drop(&mut self) {
        self.forget();
        if let Some(shared) = self.cache.shared.get() {
            let key = self.key.as_ref().map_or_else(|| "*".to_string(), Key::text);
            let _ = shared.announce.send(format!("{}\t{key}", self.cache.name));
        }
    }
}

impl Caches {
    fn forget_all(&self) {
        self.environments.forget(None);
        self.nodes.forget(None);
        self.access.send_modify(|n| *n += 1);
    }

    fn heard(&self, payload: &str) {
        let (name, key) = payload.split_once('\t').unwrap_or((payload, "*"));
        match name {
            "environments" => self.environments.heard(key),
            "nodes" => self.nodes.heard(key),
            "access" => self.access.send_modify(|n| *n += 1),
            _ => self.forget_all(),
        }
    }

    /// Tells the other replicas that users, roles or tokens changed (nothing to tell on SQLite).
    pub(crate) fn announce_access(&self) {
        if let Some(shared) = self.shared.get() {
            let _ = shared.announce.send("access\t*".to_string());
        }
    }

    /// Whether what is kept can be trusted: always on SQLite (one process), on PostgreSQL while
    /// the other replicas' announcements are heard.
    pub(crate) fn trusted(&self) -> bool {
        self.shared.get().is_none_or(|s| s.listening.load(Ordering::SeqCst))
    }

    /// Shares the caches with the other replicas on `pool` (see the module): announces this
    /// one's writes and listens for theirs, until the pool is closed.
    pub(crate) fn share(self: &Arc<Caches>, pool: &sqlx::PgPool) {
        let (announce, mut announced) = mpsc::unbounded_channel::<String>();
        let listening = Arc::new(AtomicBool::new(false));
        for cache_shared in [&self.environments.shared, &self.nodes.shared, &self.shared] {
            let _ = cache_shared.set(Shared {
                announce: announce.clone(),
                listening: listening.clone(),
            });
        }
        drop(announce);
        let sender = pool.clone();
        tokio::spawn(async move {
            while let Some(payload) = announced.recv().await {
                if sender.is_closed() {
                    return;
                }
                if let Err(e) = sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(CHANNEL)
                    .bind(&payload)
                    .execute(&sender)
                    .await
                {
                    tracing::warn!(error = %e, "cannot tell the other replicas of a change; their copies expire when their listener reconnects");
                }
            }
        });
        let caches = Arc::downgrade(self);
        let pool = pool.clone();
        let mut alive = self.alive.subscribe();
        tokio::spawn(async move {
            let ended = async move {
                let _ = alive.changed().await;
            };
            tokio::select! {
                () = listen(caches, pool, listening) => {}
                () = ended => {}
            }
        });
    }
}

/// Listens for the other replicas' announcements on `pool` until the pool is closed or the
/// caches are gone.
async fn listen(caches: std::sync::Weak<Caches>, pool: sqlx::PgPool, listening: Arc<AtomicBool>) {
    while !pool.is_closed() {
        let listener = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
            listener.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = match listener.await {
            Ok(listener) => listener,
            Err(e) => {
                tracing::debug!(error = %e, "cannot listen for the other replicas' changes");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        // What was missed while not listening is forgotten.
        let Some(c) = caches.upgrade() else { return };
        c.forget_all();
        listening.store(true, Ordering::SeqCst);
        drop(c);
        // Until the session is lost (a notification may be lost with it).
        while let Ok(Some(notification)) = listener.try_recv().await {
            match caches.upgrade() {
                Some(c) => c.heard(notification.payload()),
                None => return,
            }
        }
        listening.store(false, Ordering::SeqCst);
        if let Some(c) = caches.upgrade() {
            c.forget_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_overlapped_a_write_is_not_kept_and_a_write_forgets() {
        let cache: RowCache<EnvironmentId, &str> = RowCache::default();
        let [k1, k2, k3] = [EnvironmentId::random(), EnvironmentId::random(), EnvironmentId::random()];
        // A read before any write is kept.
        let miss = cache.get(&k1).unwrap_err();
        cache.install(miss, k1, "old");
        assert_eq!(cache.get(&k1), Ok("old"));
        assert_eq!(cache.find(|v| *v == "old"), Ok("old"));
        // A read that started before a write and ended during it is not kept.
        let before = cache.get(&k2).unwrap_err();
        let write = cache.writing(Some(k1));
        assert!(cache.get(&k1).is_err(), "forgotten when the write starts");
        cache.install(before, k2, "stale");
        assert!(cache.get(&k2).is_err());
        // One that started during the write is kept until the write is over.
        let during = cache.get(&k1).unwrap_err();
        cache.install(during, k1, "maybe stale");
        drop(write);
        assert!(cache.get(&k1).is_err(), "forgotten again when the write is over");
        // Writing every row.
        let miss = cache.get(&k3).unwrap_err();
        cache.install(miss, k3, "x");
        drop(cache.writing(None));
        assert!(cache.get(&k3).is_err());
    }
}

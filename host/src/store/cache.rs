//! Rows read on every request and written seldom, kept beside the database: environments (read
//! by every API call, watcher and release) and the node list (read by every process placement
//! and connection delivery). Right because this process is the only writer of these rows (an
//! environment is served by one host; ARCHITECTURE.md) and every write of them is a method of
//! [`Store`](super::Store) that says so ([`RowCache::writing`]).
//!
//! A writer forgets the rows it changes when it starts and again when it is over (committed,
//! failed, or of unknown outcome alike), so a copy read while it wrote never outlives it. A reader
//! that missed notes the cache's epoch, reads the database and keeps what it read only if no
//! write started or ended meanwhile.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use super::{Environment, EnvironmentId, NodeRecord};

/// The caches of one [`Store`](super::Store) (shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct Caches {
    pub(crate) environments: RowCache<EnvironmentId, Environment>,
    /// Every node, by name (the one key is `()`).
    pub(crate) nodes: RowCache<(), Arc<Vec<NodeRecord>>>,
}

#[derive(Debug)]
pub(crate) struct RowCache<K, V>(Mutex<Rows<K, V>>);

#[derive(Debug)]
struct Rows<K, V> {
    /// Moves on whenever a write starts or ends.
    epoch: u64,
    rows: HashMap<K, V>,
}

impl<K, V> Default for RowCache<K, V> {
    fn default() -> Self {
        RowCache(Mutex::new(Rows {
            epoch: 0,
            rows: HashMap::new(),
        }))
    }
}

/// A miss: the epoch to hand back to [`RowCache::install`] with what the database said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Miss(u64);

impl<K: Hash + Eq + Clone, V: Clone> RowCache<K, V> {
    fn rows(&self) -> std::sync::MutexGuard<'_, Rows<K, V>> {
        self.0.lock().expect("row cache")
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

/// A write under way (see [`RowCache::writing`]).
pub(crate) struct Writing<'a, K: Hash + Eq + Clone, V: Clone> {
    cache: &'a RowCache<K, V>,
    key: Option<K>,
}

impl<K: Hash + Eq + Clone, V: Clone> Writing<'_, K, V> {
    fn forget(&self) {
        let mut rows = self.cache.rows();
        rows.epoch += 1;
        match &self.key {
            Some(key) => {
                rows.rows.remove(key);
            }
            None => rows.rows.clear(),
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Drop for Writing<'_, K, V> {
    fn drop(&mut self) {
        self.forget();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_overlapped_a_write_is_not_kept_and_a_write_forgets() {
        let cache: RowCache<u32, &str> = RowCache::default();
        // A read before any write is kept.
        let miss = cache.get(&1).unwrap_err();
        cache.install(miss, 1, "old");
        assert_eq!(cache.get(&1), Ok("old"));
        assert_eq!(cache.find(|v| *v == "old"), Ok("old"));
        // A read that started before a write and ended during it is not kept.
        let before = cache.get(&2).unwrap_err();
        let write = cache.writing(Some(1));
        assert!(cache.get(&1).is_err(), "forgotten when the write starts");
        cache.install(before, 2, "stale");
        assert!(cache.get(&2).is_err());
        // One that started during the write is kept until the write is over.
        let during = cache.get(&1).unwrap_err();
        cache.install(during, 1, "maybe stale");
        drop(write);
        assert!(cache.get(&1).is_err(), "forgotten again when the write is over");
        // Writing every row.
        let miss = cache.get(&3).unwrap_err();
        cache.install(miss, 3, "x");
        drop(cache.writing(None));
        assert!(cache.get(&3).is_err());
    }
}

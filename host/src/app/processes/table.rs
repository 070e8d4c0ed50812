//! The process table: one environment's process rows, decoded, and its connections, kept in
//! memory beside the store so that reading them costs no statement and no parsing.
//!
//! The store stays the truth; the table is its copy, right because every write to these rows goes
//! through this host ([`App`]'s process and connection operations and the process watchers, under
//! the environment's services lock) and an environment is served by one host (ARCHITECTURE.md's
//! kv invariant says the same of plugin state). A writer writes the store first and then the
//! table ([`App::table_write`]); a write whose outcome is unknown (a store error) drops the table,
//! and the next reader loads it again. A load that raced a write is not kept: every write moves
//! the table's epoch on, and a load is installed only if the epoch it started at is still the
//! table's. Dropped with the environment's [`Running`], so a restart loads afresh.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use crate::app::App;
use crate::app::running::Running;
use crate::processes::plan::waited_for;
use crate::processes::stored::{decode, state_of};
use crate::processes::{ProcessDoc, ServicesError};
use crate::store::{ConnectionRecord, Environment, ProcessRecord};

/// A process row as stored and what its document decodes to.
pub(crate) type Decoded = (Arc<ProcessRecord>, Arc<ProcessDoc>);

/// One environment's table (in [`Running`]).
#[derive(Default)]
pub(crate) struct ProcessTable(Mutex<TableState>);

#[derive(Default)]
struct TableState {
    /// Moves on at every write, loaded or not.
    epoch: u64,
    /// `None`: not loaded (yet, or again after a write of unknown outcome).
    rows: Option<Rows>,
}

/// The rows, in the store's orders.
#[derive(Default)]
pub(crate) struct Rows {
    /// By name.
    processes: BTreeMap<String, Decoded>,
    /// By `(created_at, id)`, the order the store lists connections in.
    connections: BTreeMap<(i64, String), ConnectionRecord>,
    /// Process → the other processes its tasks wait for ([`waited_for`]), those with any: kept
    /// with the rows so that a question about the waits reads no task (it is asked for every
    /// peer on its way elsewhere; built from the rows each time, a burst of n moves cost n²).
    waits: BTreeMap<String, BTreeSet<String>>,
}

impl Rows {
    pub(crate) fn process(&self, name: &str) -> Option<Decoded> {
        self.processes.get(name).cloned()
    }

    pub(crate) fn processes(&self) -> impl Iterator<Item = &Decoded> {
        self.processes.values()
    }

    pub(crate) fn connections(&self) -> impl Iterator<Item = &ConnectionRecord> {
        self.connections.values()
    }

    /// The connections with `process` at either end, oldest first.
    pub(crate) fn connections_of(&self, process: &str) -> Vec<ConnectionRecord> {
        self.connections()
            .filter(|c| c.from_process == process || c.to_process == process)
            .cloned()
            .collect()
    }

    /// Whether `from`'s tasks wait, directly or through others', for `to`'s.
    pub(crate) fn waits_reach(&self, from: &str, to: &str) -> bool {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(at) = stack.pop() {
            if at == to {
                return true;
            }
            if seen.insert(at) {
                stack.extend(self.waits.get(at).into_iter().flatten().map(String::as_str));
            }
        }
        false
    }

    pub(crate) fn put_process(&mut self, record: ProcessRecord, doc: Arc<ProcessDoc>) {
        let waited = waited_for(&record.name, &doc);
        if waited.is_empty() {
            self.waits.remove(&record.name);
        } else {
            self.waits.insert(record.name.clone(), waited);
        }
        self.processes.insert(record.name.clone(), (Arc::new(record), doc));
    }

    pub(crate) fn remove_process(&mut self, name: &str) {
        self.processes.remove(name);
        self.waits.remove(name);
    }

    pub(crate) fn put_connection(&mut self, c: ConnectionRecord) {
        self.connections.insert((c.created_at, c.id.clone()), c);
    }

    pub(crate) fn remove_connection(&mut self, id: &str) {
        self.connections.retain(|_, c| c.id != id);
    }
}

impl ProcessTable {
    fn state(&self) -> std::sync::MutexGuard<'_, TableState> {
        self.0.lock().expect("process table")
    }

    /// Installs `rows`, loaded from the store since `epoch`, unless a write came in meanwhile
    /// (or another load was installed); whether it did.
    fn install(&self, epoch: u64, rows: Rows) -> bool {
        let mut state = self.state();
        let fresh = state.epoch == epoch && state.rows.is_none();
        if fresh {
            state.rows = Some(rows);
        }
        fresh
    }

    /// After a write to the store (`Ok`: done; `Err`: its outcome is unknown): `write` applied,
    /// or the table dropped for the next reader to load. The epoch moves on either way.
    pub(crate) fn after_write<T, E>(&self, result: &Result<T, E>, write: impl FnOnce(&mut Rows, &T)) {
        let mut state = self.state();
        state.epoch += 1;
        match (result, &mut state.rows) {
            (Ok(value), Some(rows)) => write(rows, value),
            (Ok(_), None) => {}
            (Err(_), rows) => *rows = None,
        }
    }
}

impl App {
    /// Reads `env`'s table with `read`, loading it from the store first if it is not loaded.
    pub(crate) async fn table_read<R>(&self, env: &Environment, read: impl Fn(&Rows) -> R) -> Result<R, ServicesError> {
        let running = self.running(env).await?;
        loop {
            let epoch = {
                let state = running.processes.state();
                if let Some(rows) = &state.rows {
                    return Ok(read(rows));
                }
                state.epoch
            };
            let mut rows = Rows::default();
            for record in self.store.list_processes(&env.id).await? {
                let doc = Arc::new(decode(&record)?);
                rows.put_process(record, doc);
            }
            for c in self.store.list_connections(&env.id).await? {
                rows.put_connection(c);
            }
            // Not installed if a write came in while loading: loaded again.
            running.processes.install(epoch, rows);
        }
    }

    /// After a write to the store of `running`'s rows, makes the table say what the store does
    /// (see [`ProcessTable::after_write`]). Passes `result` on.
    pub(crate) fn table_write<T, E>(running: &Running, result: Result<T, E>, write: impl FnOnce(&mut Rows, &T)) -> Result<T, E> {
        running.processes.after_write(&result, write);
        result
    }

    /// Process `name` of `env`, if there is one.
    pub(crate) async fn find_process(&self, env: &Environment, name: &str) -> Result<Option<Decoded>, ServicesError> {
        self.table_read(env, |rows| rows.process(name)).await
    }

    /// Every process of `env`, by name.
    pub(crate) async fn current_processes(&self, env: &Environment) -> Result<Vec<Decoded>, ServicesError> {
        self.table_read(env, |rows| rows.processes().cloned().collect()).await
    }

    /// How many of `env`'s processes are in each state (by name; the states with none left
    /// out): a cheap question for a client that waits for operations to end.
    /// An environment not running (yet) is counted from the store, and not started for it.
    pub(crate) async fn process_counts(&self, env: &Environment) -> Result<BTreeMap<&'static str, i64>, ServicesError> {
        fn count<'a>(records: impl Iterator<Item = &'a ProcessRecord>) -> BTreeMap<&'static str, i64> {
            let mut counts = BTreeMap::new();
            for record in records {
                *counts.entry(state_of(record).as_str()).or_default() += 1;
            }
            counts
        }
        if self.running.lock().await.contains_key(&env.id) {
            self.table_read(env, |rows| count(rows.processes().map(|(record, _)| record.as_ref())))
                .await
        } else {
            Ok(count(self.store.list_processes(&env.id).await?.iter()))
        }
    }

    /// Whether changes to `env`'s process rows wait for the releaser (gathering, or tried again
    /// after a failure): until they are released, the scheduler deploys what came before. An
    /// environment not running has none.
    pub(crate) async fn process_release_pending(&self, env: &Environment) -> bool {
        use std::sync::atomic::Ordering;
        match self.running.lock().await.get(&env.id) {
            Some(running) => *running.process_changes.borrow() != running.process_released.load(Ordering::SeqCst),
            None => false,
        }
    }

    /// The connections of `process` in `env`, oldest first.
    pub(crate) async fn connections_of(&self, env: &Environment, process: &str) -> Result<Vec<ConnectionRecord>, ServicesError> {
        self.table_read(env, |rows| rows.connections_of(process)).await
    }

    /// Every connection of `env`, oldest first.
    pub(crate) async fn all_connections(&self, env: &Environment) -> Result<Vec<ConnectionRecord>, ServicesError> {
        self.table_read(env, |rows| rows.connections().cloned().collect()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection(id: &str, at: i64, from: &str, to: &str) -> ConnectionRecord {
        ConnectionRecord {
            id: id.into(),
            from_process: from.into(),
            from_interface: "i".into(),
            to_process: to.into(),
            to_interface: "i".into(),
            version: "1".into(),
            interface_id: "sha256:x".into(),
            created_by: None,
            created_at: at,
        }
    }

    #[test]
    fn connections_are_listed_as_the_store_orders_them() {
        let mut rows = Rows::default();
        rows.put_connection(connection("b", 2, "p", "q"));
        rows.put_connection(connection("z", 1, "r", "p"));
        rows.put_connection(connection("a", 2, "q", "r"));
        let ids = |cs: Vec<ConnectionRecord>| cs.into_iter().map(|c| c.id).collect::<Vec<_>>();
        assert_eq!(ids(rows.connections().cloned().collect()), ["z", "a", "b"]);
        assert_eq!(ids(rows.connections_of("p")), ["z", "b"]);
        rows.remove_connection("z");
        assert_eq!(ids(rows.connections_of("p")), ["b"]);
    }

    #[test]
    fn a_write_of_unknown_outcome_drops_the_table_and_any_write_moves_the_epoch() {
        let table = ProcessTable::default();
        table.state().rows = Some(Rows::default());
        let put = |rows: &mut Rows, c: &ConnectionRecord| rows.put_connection(c.clone());
        let apply = |table: &ProcessTable, result: Result<ConnectionRecord, ()>| table.after_write(&result, put);
        apply(&table, Ok(connection("a", 1, "p", "q")));
        assert_eq!(table.state().epoch, 1);
        assert_eq!(table.state().rows.as_ref().map(|r| r.connections().count()), Some(1));
        apply(&table, Err(()));
        assert!(table.state().rows.is_none(), "dropped, to be loaded again");
        let epoch = table.state().epoch;
        apply(&table, Ok(connection("b", 2, "p", "q")));
        assert!(table.state().rows.is_none(), "a write to an unloaded table is the store's only");
        assert!(
            !table.install(epoch, Rows::default()),
            "a load begun before a write is not installed"
        );
        assert!(table.install(epoch + 1, Rows::default()));
        assert!(!table.install(epoch + 1, Rows::default()), "loaded already");
    }
}

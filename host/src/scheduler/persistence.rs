//! Connects a scheduler to the store: every transition and every action the scheduler reports is
//! written, in batches and in order, each batch in one transaction, and a scheduler starting on
//! an environment resumes from what was persisted — deployed hashes and times are kept, and
//! nothing is left `deploying`.

use std::collections::HashMap;
use std::sync::Arc;

use orc_manifest::Digest;
use orc_node::{NodeDirectory, NodeError};

use super::ErrorInfo;
use crate::scheduler::{BoxFuture, Event, Sink, Trigger};
use crate::store::{
    ActionId, ActionKind, ActionRecord, DbKv, EnvironmentId, EventLog, Fence, Millis, Progress, Renewal, ResourceState, Store, StoreError,
};

/// Attempts at writing one batch, the first retry after [`FIRST_RETRY`], doubling: about 6 s in
/// all. The scheduler's writer waits meanwhile (events queue up in order behind the batch).
const WRITE_ATTEMPTS: u32 = 7;
const FIRST_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Why a batch was not stored.
#[derive(Debug, thiserror::Error)]
enum BatchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The nodes' durability fence failed: the batch waits, since it may record changes that
    /// are not durable on their node.
    #[error(transparent)]
    Nodes(NodeError),
}

/// Writes scheduler events of one environment to the store.
pub struct StoreSink {
    store: Store,
    environment: EnvironmentId,
    plugin_state: Option<Arc<DbKv>>,
    nodes: Option<Arc<dyn NodeDirectory>>,
    /// The owner's epoch every batch is written under (see `store::ownership`); `None`: unfenced.
    fence: Option<Fence>,
    /// Set once a batch was given up: the store may not hold what the scheduler handed over.
    gave_up: std::sync::atomic::AtomicBool,
}

impl StoreSink {
    pub fn new(store: Store, environment: EnvironmentId) -> StoreSink {
        StoreSink {
            store,
            environment,
            plugin_state: None,
            nodes: None,
            fence: None,
            gave_up: Default::default(),
        }
    }

    /// Stores a batch only once the nodes' durability fence has passed
    /// ([`NodeDirectory::durable`]): nodes answer writes before they are durable, so that one
    /// sync covers a batch instead of one per file, and a resource must not be stored
    /// `deployed` ahead of the files its action wrote.
    pub fn after_nodes(self, nodes: Arc<dyn NodeDirectory>) -> StoreSink {
        StoreSink {
            nodes: Some(nodes),
            ..self
        }
    }

    /// Writes every batch under `fence`: once another replica owns the environment, nothing
    /// more is stored (the batch is given up at once, not retried).
    pub fn fenced(self, fence: Fence) -> StoreSink {
        StoreSink {
            fence: Some(fence),
            ..self
        }
    }

    /// Both fences at once: plugin state committed, node changes durable.
    async fn fences(&self) -> Result<(), NodeError> {
        let kv = async {
            if let Some(kv) = &self.plugin_state {
                kv.durable().await;
            }
        };
        let nodes = async {
            match &self.nodes {
                Some(nodes) => nodes.durable().await,
                None => Ok(()),
            }
        };
        tokio::join!(kv, nodes).1
    }

    /// Stores a batch only once the plugin state written before it is committed: plugins'
    /// writes are answered before they are durable ([`DbKv`]), and a resource must not be stored
    /// `deployed` ahead of the state its action wrote.
    pub fn after_plugin_state(self, kv: Arc<DbKv>) -> StoreSink {
        StoreSink {
            plugin_state: Some(kv),
            ..self
        }
    }

    async fn write(&self, events: Vec<Event>, log: Option<EventLog<'_>>, forget_events_before: Option<Millis>) -> Result<(), BatchError> {
        // The last state of a resource in a batch is the one that counts.
        let mut states: HashMap<String, ResourceState> = HashMap::with_capacity(events.len());
        let mut actions = Vec::new();
        let mut released = None;
        for event in events {
            match event {
                Event::State(s) => {
                    let state = stored_state(&s, states.get(&s.resource));
                    states.insert(s.resource, state);
                }
                Event::Action { version, trigger, report } => actions.push(ActionRecord {
                    id: ActionId::new(),
                    environment: self.environment,
                    resource_id: report.resource.clone(),
                    kind: match trigger {
                        Trigger::Repair => ActionKind::Repair,
                        Trigger::Deploy | Trigger::Retry => ActionKind::Deploy,
                    },
                    version: Some(version as i64),
                    started_at: report.started_at,
                    finished_at: report.started_at + report.duration.as_millis() as i64,
                    outcome: serde_json::to_value(report.outcome)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    changes: serde_json::to_string(&report.changes).unwrap_or_else(|_| "[]".into()),
                    messages: serde_json::to_string(&report.messages).unwrap_or_else(|_| "[]".into()),
                    error: report.error.map(|e| ErrorInfo {
                        code: e.code,
                        message: e.message,
                    }),
                }),
                Event::Released {
                    version,
                    dropped,
                    complete,
                } => released = Some((version as i64, dropped, complete)),
            }
        }
        let states: Vec<ResourceState> = states.into_values().collect();
        // One transaction: a crash keeps a batch whole or drops it whole, so no resource is
        // stored `deployed` without the action that deployed it, and the stream holds what the
        // states say. A release comes last in its batch: every state it handed over is stored
        // by then (a crash before it is made good by the complete release at the next start).
        // A time the scheduler leaves `None` (unchanged) keeps the stored one, also across a
        // restart's re-release. Being one transaction, a batch can be retried: a database that
        // is briefly away (a restart, a fail-over) loses nothing.
        let progress = Progress {
            states: &states,
            actions: &actions,
            renewal: released.as_ref().map(|(version, dropped, complete)| Renewal {
                version: *version,
                complete: *complete,
                dropped,
            }),
            events: log,
            forget_events_before,
        };
        let mut delay = FIRST_RETRY;
        let mut attempt = 1;
        let started = std::time::Instant::now();
        loop {
            // The fences first, on every attempt (a failed node fence is tried again): nothing
            // in this batch is stored before what its actions wrote is durable.
            let written = match self.fences().await {
                Err(e) => Err(BatchError::Nodes(e)),
                Ok(()) => self
                    .store
                    .record_progress(&self.environment, self.fence.as_ref(), &progress)
                    .await
                    .map_err(BatchError::from),
            };
            match written {
                Ok(()) => {
                    tracing::debug!(environment = %self.environment, states = states.len(), actions = actions.len(),
                        took_us = started.elapsed().as_micros() as u64, "batch recorded");
                    return Ok(());
                }
                Err(BatchError::Store(e @ StoreError::Fenced { .. })) => return Err(BatchError::Store(e)),
                Err(e) if attempt < WRITE_ATTEMPTS => {
                    tracing::warn!(environment = %self.environment, attempt, error = %e, "cannot persist scheduler events; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl StoreSink {
    /// Writes one batch (retrying a while); `false` if it was given up.
    pub async fn persist(&self, events: Vec<Event>) -> bool {
        self.persist_logged(events, None, None).await
    }

    /// [`StoreSink::persist`], with the batch's events for the stream (`log`) and the events
    /// recorded before `forget_events_before` forgotten, in the same transaction.
    pub async fn persist_logged(&self, events: Vec<Event>, log: Option<EventLog<'_>>, forget_events_before: Option<Millis>) -> bool {
        let n = events.len();
        match self.write(events, log, forget_events_before).await {
            Ok(()) => true,
            Err(e) => {
                // Given up after the retries. The scheduler's memory stays right: a resource's
                // next state rewrites it in full, and the next release hands over every state
                // (`in_doubt`); the actions are lost to the log, and a restart re-reads every
                // resource anyway.
                tracing::error!(environment = %self.environment, events = n, error = %e, "cannot persist scheduler events");
                self.gave_up.store(true, std::sync::atomic::Ordering::Release);
                false
            }
        }
    }
}

impl Sink for StoreSink {
    fn record(&self, events: Vec<Event>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.persist(events).await;
        })
    }

    fn in_doubt(&self) -> bool {
        self.gave_up.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// A scheduler's state as the store keeps it; `previous` is what the store holds for the
/// resource, whose times a state that leaves them unchanged (`None`) keeps.
pub(crate) fn stored_state(s: &crate::scheduler::ResourceState, previous: Option<&ResourceState>) -> ResourceState {
    let (resource_type, node) = split_id(&s.resource);
    ResourceState {
        resource_id: s.resource.clone(),
        resource_type,
        node,
        desired_hash: s.desired_hash.to_string(),
        deployed_hash: s.deployed_hash.map(|d| d.to_string()),
        status: s.status,
        version: s.version as i64,
        last_deploy_at: s.last_deploy_at.or(previous.and_then(|p| p.last_deploy_at)),
        last_verified_at: s.last_verified_at.or(previous.and_then(|p| p.last_verified_at)),
        attempts: i64::from(s.attempts),
        last_error: s.last_error.as_ref().map(|e| ErrorInfo {
            code: e.code.clone(),
            message: e.message.clone(),
        }),
        next_retry_at: s.next_retry_at,
    }
}

/// `type[node,key]` → (type, node).
fn split_id(id: &str) -> (String, String) {
    let (ty, rest) = id.split_once('[').unwrap_or((id, ""));
    let node = rest.split_once(',').map(|(n, _)| n).unwrap_or("");
    (ty.to_string(), node.to_string())
}

/// What a scheduler needs to resume an environment, read once.
#[derive(Debug)]
pub struct Resumed {
    /// The last deployed hash of every resource that has one: the new scheduler's `known`.
    pub known: HashMap<String, Digest>,
    /// Every resource's state after the recovery (for whoever else starts from them, say metrics).
    pub states: Vec<ResourceState>,
}

/// Resumes an environment: resources left `deploying` by a crash are set back to `available`,
/// then the states are read once.
pub async fn resume(store: &Store, environment: &EnvironmentId) -> Result<Resumed, StoreError> {
    let recovered = store.recover_deploying(environment).await?;
    if !recovered.is_empty() {
        tracing::warn!(%environment, count = recovered.len(), "resources left deploying by a previous run are available again");
    }
    let states = store.load_states(environment).await?;
    let known = states
        .iter()
        .filter_map(|s| Some((s.resource_id.clone(), s.deployed_hash.as_deref()?.parse().ok()?)))
        .collect();
    Ok(Resumed { known, states })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use orc_node::BoxFuture as NodeFuture;
    use orc_node::{NodeBackend, NodeErrorKind};

    use super::*;
    use crate::policy::settings::EnvironmentSettings;
    use crate::scheduler::{ResourceState as SchedulerState, ResourceStatus as Status};

    /// Nodes whose durability fence says when it is entered, then waits to be let through; the
    /// first `failures` fences fail.
    struct GatedNodes {
        entered: tokio::sync::mpsc::UnboundedSender<()>,
        through: tokio::sync::Semaphore,
        failures: AtomicUsize,
    }

    impl NodeDirectory for GatedNodes {
        fn node(&self, name: &str) -> Result<Arc<dyn NodeBackend>, NodeError> {
            Err(NodeError::new(NodeErrorKind::InvalidInput, format!("unknown node `{name}`")))
        }

        fn durable(&self) -> NodeFuture<'_, Result<(), NodeError>> {
            Box::pin(async move {
                let _ = self.entered.send(());
                self.through.acquire().await.expect("open").forget();
                if self.failures.load(Ordering::SeqCst) > 0 {
                    self.failures.fetch_sub(1, Ordering::SeqCst);
                    return Err(NodeError::new(NodeErrorKind::Failed, "disk on fire"));
                }
                Ok(())
            })
        }
    }

    fn deployed(resource: &str) -> Event {
        let hash = Digest::of(resource.as_bytes());
        Event::State(SchedulerState {
            resource: resource.to_string(),
            version: 1,
            status: Status::Deployed,
            desired_hash: hash,
            deployed_hash: Some(hash),
            attempts: 0,
            last_error: None,
            last_deploy_at: Some(1),
            last_verified_at: Some(1),
            next_retry_at: None,
        })
    }

    /// Architecture invariant: no state is stored before the nodes' durability fence has passed
    /// for it, and a fence that fails holds the batch back (here until it is retried).
    #[tokio::test]
    async fn a_batch_is_stored_only_after_the_nodes_durability_fence() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite(dir.path().join("orc.db")).await.unwrap();
        let env = store.create_environment("fenced", &EnvironmentSettings::default()).await.unwrap();
        let (entered, mut fences) = tokio::sync::mpsc::unbounded_channel();
        let nodes = Arc::new(GatedNodes {
            entered,
            through: tokio::sync::Semaphore::new(0),
            failures: AtomicUsize::new(1),
        });
        let sink = Arc::new(StoreSink::new(store.clone(), env.id).after_nodes(nodes.clone()));
        let writing = tokio::spawn({
            let sink = sink.clone();
            async move { sink.persist(vec![deployed("file[local,/a]")]).await }
        });

        // The fence is waiting: nothing is stored.
        fences.recv().await.unwrap();
        assert!(store.load_states(&env.id).await.unwrap().is_empty());
        // It fails: still nothing, and the batch tries again behind a new fence.
        nodes.through.add_permits(1);
        fences.recv().await.unwrap();
        assert!(store.load_states(&env.id).await.unwrap().is_empty());
        // It passes: the batch is stored.
        nodes.through.add_permits(1);
        assert!(writing.await.unwrap());
        let states = store.load_states(&env.id).await.unwrap();
        assert_eq!(states.len(), 1);
        assert_eq!(states[0].status, crate::scheduler::ResourceStatus::Deployed);
    }

    /// A sink fenced by an epoch another replica has since taken over stores nothing, and gives
    /// the batch up at once instead of retrying it; the new owner's sink stores.
    #[tokio::test]
    async fn a_fenced_sink_stores_nothing_after_a_takeover() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite(dir.path().join("orc.db")).await.unwrap();
        let env = store.create_environment("owned", &EnvironmentSettings::default()).await.unwrap();
        let ttl = std::time::Duration::from_secs(60);
        let (old, new) = (crate::store::ReplicaId::random(), crate::store::ReplicaId::random());
        let first = store.claim(&env.id, old, ttl, None).await.unwrap().unwrap();
        let stale = StoreSink::new(store.clone(), env.id).fenced(first);
        assert!(stale.persist(vec![deployed("file[local,/a]")]).await);
        store.release(&env.id, old).await.unwrap();
        let second = store.claim(&env.id, new, ttl, None).await.unwrap().unwrap();

        let started = std::time::Instant::now();
        assert!(!stale.persist(vec![deployed("file[local,/b]")]).await);
        assert!(started.elapsed() < FIRST_RETRY, "given up without a retry");
        assert!(stale.in_doubt());
        let current = StoreSink::new(store.clone(), env.id).fenced(second);
        assert!(current.persist(vec![deployed("file[local,/c]")]).await);
        let stored: Vec<String> = store
            .load_states(&env.id)
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.resource_id)
            .collect();
        assert_eq!(stored, ["file[local,/a]", "file[local,/c]"]);
    }
}

//! One environment's running parts ([`Running`]: its scheduler, call context, event stream,
//! status counts and release turn), started and resumed from the store on first use; where its
//! local node lives on the host; the scheduler's settings from the environment's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use orc_node::LocalNode;
use orc_runtime::{CallContext, Grants};
use tokio::sync::Mutex;

use super::{App, EnvError};
use crate::intent::Intent;
use crate::intent::pinning::{self, LOCAL_NODE};
use crate::policy::outbound;
use crate::policy::settings::{CapabilitySettings, EnvironmentSettings};
use crate::scheduler::events::{EnvironmentSink, EventStream, Numbering, StatusCounts};
use crate::scheduler::persistence::{self, StoreSink};
use crate::scheduler::{Scheduler, Settings, Start, Unavailable, Version};
use crate::store::{Environment, EnvironmentId};

/// One environment's running parts.
/// A released version whose states are recorded, with its tasks by resource set (a process's
/// watcher looks up its own at every step, not through the whole version).
pub(crate) struct Recorded {
    pub(crate) version: Arc<Version>,
    /// Set name (`process.NAME`, a cluster's name) → the indices of its tasks in the version.
    pub(crate) sets: HashMap<String, Vec<usize>>,
}

impl Recorded {
    fn new(version: Arc<Version>) -> Recorded {
        let mut sets: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, r) in version.intent.resources.iter().enumerate() {
            if r.id.resource_type == crate::clusters::planner::TASK_TYPE
                && let Some((set, _)) = r.id.key.split_once('/')
            {
                sets.entry(set.to_string()).or_default().push(i);
            }
        }
        Recorded { version, sets }
    }

    /// The tasks of set `set` in the version.
    pub(crate) fn tasks_of(&self, set: &str) -> impl Iterator<Item = &crate::intent::ResourceSpec> {
        let indices = self.sets.get(set).map(Vec::as_slice).unwrap_or_default();
        indices.iter().map(|&i| &self.version.intent.resources[i])
    }
}

pub(crate) struct Running {
    /// The environment's name.
    pub(super) name: String,
    pub(crate) scheduler: Scheduler,
    /// Serialises submissions and releases, so the scheduler sees versions in the store's order.
    pub(crate) releases: Mutex<()>,
    /// Serialises operations on processes and connections, whose checks span processes (a port
    /// on a node, an interface's cardinality). Taken before `releases`, never while holding it.
    pub(crate) services: Mutex<()>,
    /// What the environment's plugins are called with (nodes, kv, HTTP, deadline); dryruns use
    /// it too. Replaced when the settings change.
    pub(super) ctx: std::sync::RwLock<CallContext>,
    /// What the environment grants its plugins, as stored; changed only while holding
    /// `releases`, so a submission reads it under its turn and never pins against grants a
    /// concurrent settings change is revoking.
    pub(super) capabilities: std::sync::Mutex<CapabilitySettings>,
    pub(crate) stream: EventStream,
    /// Resources per status as persisted, kept by the scheduler's sink.
    pub(super) counts: Arc<StatusCounts>,
    /// The version last handed to the scheduler (which holds it too): a dryrun of it shares it
    /// instead of loading a second copy (100,000 resources are tens of MiB).
    pub(super) released: std::sync::Mutex<Option<Arc<Version>>>,
    /// The version last released whose states are recorded: what a process watcher may judge
    /// its tasks' progress by (before, a task's state may still be the previous version's).
    pub(super) recorded: std::sync::Mutex<Option<Arc<Recorded>>>,
    /// Counts the changes to process rows; the process releaser releases them in one version,
    /// whatever number came in while it released the last (see `app::processes::release`).
    pub(crate) process_changes: tokio::sync::watch::Sender<u64>,
    /// Whether a change counted since the releaser last took them was an operator's (released
    /// promptly) rather than only watchers' follow-ups (gathered longer; `app::processes::release`).
    pub(crate) process_prompt: std::sync::atomic::AtomicBool,
    /// The same for a watcher's follow-up that tells peers (gathered shorter than one that only
    /// drops what is done).
    pub(crate) process_follow_up: std::sync::atomic::AtomicBool,
    /// The count of [`Running::process_changes`] the releaser last released: fewer, and changes
    /// to process rows are waiting for a release (gathered, or being tried again).
    pub(crate) process_released: std::sync::atomic::AtomicU64,
    /// The environment's process rows and connections, as stored (`app::processes::table`).
    pub(crate) processes: crate::app::processes::ProcessTable,
    /// Its process tasks' states, for the watchers of their processes (`app::processes::news`).
    pub(crate) process_news: Arc<crate::app::processes::ProcessNews>,
    /// Processes to be told their peers' new nodes, each with when it was first named: a watcher
    /// whose process moved puts its peers here and the releaser's next round re-plans each once,
    /// however many of its peers moved meanwhile (`app::processes::release`). Each stays here
    /// until its row is re-planned, and shows as a pending change meanwhile
    /// (`app::processes::connections::pending_of`). Changed under the services lock.
    pub(crate) redeliveries: std::sync::Mutex<std::collections::BTreeMap<String, crate::store::Millis>>,
    /// Whether the process releaser runs.
    pub(crate) process_releaser: std::sync::atomic::AtomicBool,
    /// Why the process releaser's last attempt failed, while it has not succeeded since.
    pub(crate) process_release_error: std::sync::Mutex<Option<String>>,
    /// Set by [`App::delete`] before it stops the scheduler: a request that took this
    /// environment before the delete answers that it is gone (404), not that its scheduler
    /// stopped (503).
    pub(super) deleted: std::sync::atomic::AtomicBool,
    /// Dryruns running now, against `limits.concurrent_dryruns`.
    pub(super) dryruns: Arc<std::sync::atomic::AtomicU64>,
    /// Set when this replica stops running the environment (it was lost, handed over or
    /// deleted, or the host stops): the tasks that work for it end.
    pub(crate) ended: tokio::sync::watch::Sender<bool>,
}

/// One running dryrun, counted in [`Running::dryruns`] until dropped.
pub(super) struct DryrunSlot(Arc<std::sync::atomic::AtomicU64>);

impl Drop for DryrunSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Running {
    /// A slot for one more dryrun, unless `limit` run already.
    pub(super) fn dryrun_slot(&self, limit: u64) -> Option<DryrunSlot> {
        use std::sync::atomic::Ordering;
        self.dryruns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < limit).then_some(n + 1))
            .ok()
            .map(|_| DryrunSlot(self.dryruns.clone()))
    }

    /// Queues `names` to be told their peers' nodes by the releaser's next round (the caller
    /// holds the services lock, and then asks for a release); one already queued keeps its time.
    pub(crate) fn queue_tells(&self, names: impl IntoIterator<Item = String>) {
        let now = crate::store::now_ms();
        let mut queued = self.redeliveries.lock().expect("redeliveries");
        for name in names {
            queued.entry(name).or_insert(now);
        }
    }

    /// Since when `name` waits to be told its peers' nodes, if it does.
    pub(crate) fn tell_queued_since(&self, name: &str) -> Option<crate::store::Millis> {
        self.redeliveries.lock().expect("redeliveries").get(name).copied()
    }

    pub(crate) fn ctx(&self) -> CallContext {
        self.ctx.read().expect("call context").clone()
    }

    /// The grants of the environment's settings (read under the release turn when pinning).
    pub(crate) fn grants(&self) -> Grants {
        self.capabilities.lock().expect("capabilities").grants()
    }

    /// The version last released.
    pub(crate) fn released_version(&self) -> Option<Arc<Version>> {
        self.released.lock().expect("released version").clone()
    }

    /// The released version whose states are recorded.
    pub(crate) fn recorded(&self) -> Option<Arc<Recorded>> {
        self.recorded.lock().expect("recorded version").clone()
    }

    /// Hands `version` to the scheduler and waits until its states are recorded, so that the
    /// environment's counts and resources describe it once this returns.
    pub(crate) async fn release(&self, version: Version) -> Result<(), EnvError> {
        let version = Arc::new(version);
        *self.released.lock().expect("released version") = Some(version.clone());
        let receipt = self.scheduler.release(version.clone()).map_err(|e| self.unavailable(e))?;
        receipt.recorded().await.map_err(|e| self.unavailable(e))?;
        self.set_recorded(version);
        Ok(())
    }

    /// `version`'s states are recorded; kept unless a later release is still the released one.
    fn set_recorded(&self, version: Arc<Version>) {
        let released = self.released_version();
        if released.as_ref().is_some_and(|r| Arc::ptr_eq(r, &version)) {
            let recorded = Arc::new(Recorded::new(version));
            let mut slot = self.recorded.lock().expect("recorded version");
            // A later release may have been recorded while this one was indexed.
            if self.released_version().is_some_and(|r| Arc::ptr_eq(&r, &recorded.version)) {
                *slot = Some(recorded);
            }
        }
    }

    /// Refuses with [`EnvError::SchedulerUnavailable`] if the scheduler stopped on its own.
    pub(crate) fn check_scheduler(&self) -> Result<(), EnvError> {
        if self.deleted.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(EnvError::UnknownEnvironment(self.name.clone()));
        }
        match self.scheduler.failure() {
            Some(reason) => Err(self.unavailable(Unavailable { reason })),
            None => Ok(()),
        }
    }

    /// Why the scheduler refused: it stopped on its own (503), or the environment was deleted
    /// meanwhile (404).
    pub(crate) fn unavailable(&self, e: Unavailable) -> EnvError {
        if self.deleted.load(std::sync::atomic::Ordering::SeqCst) {
            return EnvError::UnknownEnvironment(self.name.clone());
        }
        EnvError::SchedulerUnavailable {
            environment: self.name.clone(),
            reason: e.reason,
        }
    }

    /// Whether the released version has a resource on `node` through an adaptor that uses
    /// nodes (a purged one too: purging it needs the node).
    pub(super) fn uses_node(&self, node: &str) -> bool {
        self.released_version().is_some_and(|v| {
            v.intent
                .resources
                .iter()
                .zip(&v.plugins)
                .any(|(r, p)| r.id.node == node && pinning::uses_nodes(&p.manifest))
        })
    }

    /// Refuses capabilities that the released version's plugins request and `granted` lacks
    /// (its resources would fail at their next load), naming the setting and the resources.
    pub(super) fn check_revocation(&self, granted: &CapabilitySettings) -> Result<(), EnvError> {
        let Some(version) = self.released_version() else {
            return Ok(());
        };
        let users = |capability| {
            version
                .intent
                .resources
                .iter()
                .zip(&version.plugins)
                .filter(move |(_, p)| p.manifest.capabilities.contains(&capability))
                .map(|(r, _)| r)
        };
        let revoked = orc_manifest::Capability::ALL
            .into_iter()
            .find(|c| !granted.allows(*c) && users(*c).next().is_some());
        let Some(capability) = revoked else {
            return Ok(());
        };
        const SHOWN: usize = 5;
        let mut resources: Vec<String> = users(capability).take(SHOWN).map(|r| format!("`{}`", r.id)).collect();
        let total = users(capability).count();
        if total > SHOWN {
            resources.push(format!("and {} more", total - SHOWN));
        }
        Err(EnvError::CapabilityInUse {
            environment: self.name.clone(),
            setting: CapabilitySettings::setting(capability),
            capability,
            resources: resources.join(", "),
        })
    }

    /// The released version if it is `number`.
    pub(super) fn released(&self, number: i64) -> Option<Arc<Version>> {
        let released = self.released.lock().expect("released version");
        released.as_ref().filter(|v| v.number as i64 == number).cloned()
    }
}

impl App {
    /// A stored version with its adaptors loaded from their pinned digests, under the
    /// environment's grants.
    pub(super) async fn load_version(&self, env: &EnvironmentId, version: i64, grants: &Grants) -> Result<Version, EnvError> {
        let stored = self.store.get_version(env, version).await?;
        let intent = Intent::parse(stored.document.as_bytes())?;
        let pinned = pinning::load_adaptors(&intent, &self.registry, &self.runtime, grants).await?;
        Ok(Version::new(version as u64, intent, pinned.plugins))
    }

    /// The environment's scheduler, started (and resumed from the store) on first use. An
    /// environment being deleted, or deleted since `env` was read, is unknown: a request racing
    /// a delete never starts a scheduler for it again.
    pub(crate) async fn running(&self, env: &Environment) -> Result<Arc<Running>, EnvError> {
        let mut running = self.running.lock().await;
        if let Some(r) = running.get(&env.id) {
            return Ok(r.clone());
        }
        let gone = || EnvError::UnknownEnvironment(env.name.clone());
        if self.deleting.lock().expect("deleting").contains(&env.id) {
            return Err(gone());
        }
        match self.store.get_environment(&env.id).await {
            Ok(_) => {}
            Err(crate::store::StoreError::NotFound { .. }) => return Err(gone()),
            Err(e) => return Err(e.into()),
        }
        // Only the environment's owner runs it; every write of its scheduler carries the fence.
        let fence = self.fence_for(env).await?;
        let root = node_root(&self.data_dir, &env.name);
        let spares = node_spares(&self.data_dir, &env.name);
        let node = LocalNode::open(&root)
            .and_then(|node| node.with_spares(&spares))
            .map_err(|source| EnvError::NodeRoot { path: root, source })?;
        let nodes = Arc::new(
            self.nodes
                .directory(env.id, &env.name, Arc::new(node), self.ownership.tenure(&env.id)),
        );
        let base = CallContext {
            kv: self.kv.clone(),
            nodes: nodes.clone(),
            ..CallContext::new(env.id.to_string())
        };
        // Stored settings were valid when stored; what can still fail (a client that cannot be
        // built) leaves the environment running without outgoing HTTP.
        let ctx = outbound::call_context(&base, &env.settings, &self.secrets).unwrap_or_else(|e| {
            tracing::error!(environment = %env.name, error = %e, "outgoing HTTP disabled");
            outbound::settled_context(&base, &env.settings)
        });
        let resumed = persistence::resume(&self.store, &env.id).await?;
        let interrupted = serde_json::json!({ "error": { "code": "interrupted", "message": "the host stopped before it finished" } });
        self.store.interrupt_unfinished(&env.id, &interrupted.to_string()).await?;
        let released = match env.released_version {
            Some(v) => Some(self.load_version(&env.id, v, &env.settings.capabilities.grants()).await?),
            None => None,
        };
        self.metrics
            .seed(&env.name, resumed.states.iter().map(|s| (s.resource_id.as_str(), s.status)));
        let known = resumed.known;
        let mut observers = self.observers.clone();
        observers.push(Arc::new(self.metrics.environment(&env.name)));
        let stream = EventStream::new(self.event_buffer_bytes, self.metrics.streams().clone());
        let counts = Arc::new(StatusCounts::seed(
            resumed.states.iter().map(|s| (s.resource_id.as_str(), s.status, s.version)),
        ));
        let process_news = Arc::new(crate::app::processes::ProcessNews::seeded(&resumed.states));
        let numbering = Numbering::after(self.store.last_event_seq(&env.id).await?, fence.epoch, self.event_log);
        let sink = Arc::new(
            EnvironmentSink::new(
                StoreSink::new(self.store.clone(), env.id)
                    .fenced(fence)
                    .after_plugin_state(self.kv.clone())
                    .after_nodes(nodes),
                stream.clone(),
                observers,
                counts.clone(),
                numbering,
            )
            .followed_by(process_news.clone()),
        );
        let metrics = self.metrics.clone();
        let name = env.name.clone();
        let scheduler = Scheduler::start(
            Start {
                halted: env.halted,
                known,
                on_failure: Some(Box::new(move |reason: &str| {
                    tracing::error!(environment = %name, %reason, "the environment's scheduler stopped; requests that need it answer 503");
                    metrics.scheduler_failed(&name);
                })),
                ..Start::new(ctx.clone(), scheduler_settings(&env.settings))
            },
            sink,
        );
        let r = Arc::new(Running {
            name: env.name.clone(),
            scheduler,
            releases: Mutex::new(()),
            services: Mutex::new(()),
            processes: Default::default(),
            process_news,
            ctx: std::sync::RwLock::new(ctx),
            capabilities: std::sync::Mutex::new(env.settings.capabilities),
            stream,
            counts,
            released: std::sync::Mutex::new(None),
            recorded: std::sync::Mutex::new(None),
            process_changes: tokio::sync::watch::Sender::new(0),
            process_prompt: std::sync::atomic::AtomicBool::new(false),
            process_follow_up: std::sync::atomic::AtomicBool::new(false),
            process_released: std::sync::atomic::AtomicU64::new(0),
            redeliveries: Default::default(),
            process_releaser: std::sync::atomic::AtomicBool::new(false),
            process_release_error: std::sync::Mutex::new(None),
            deleted: std::sync::atomic::AtomicBool::new(false),
            dryruns: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            ended: tokio::sync::watch::Sender::new(false),
        });
        if let Some(version) = released {
            // Not waited for: a request that needs the environment need not wait for its
            // states to be rewritten.
            *r.released.lock().expect("released version") = Some(Arc::new(version));
            let version = r.released_version().expect("just set");
            match r.scheduler.release(version.clone()) {
                Ok(receipt) => {
                    let resumed = r.clone();
                    tokio::spawn(async move {
                        if receipt.recorded().await.is_ok() {
                            resumed.set_recorded(version);
                        }
                    });
                }
                Err(e) => tracing::error!(environment = %env.name, error = %e, "cannot resume the released version"),
            }
        }
        follow_nodes_back(&r, self.nodes.back());
        running.insert(env.id, r.clone());
        // Its clusters' and processes' operations under way go on here.
        if let Some(app) = self.this.upgrade() {
            let env = env.clone();
            tokio::spawn(app.resume_environment(env));
        }
        Ok(r)
    }
}

/// Tells `r`'s scheduler of each node that is usable again, so what failed on it is retried at
/// once (Inmanta's agents do the same when they reconnect); ends with the environment.
fn follow_nodes_back(r: &Arc<Running>, mut back: tokio::sync::broadcast::Receiver<String>) {
    use tokio::sync::broadcast::error::RecvError;
    let running = Arc::downgrade(r);
    tokio::spawn(async move {
        loop {
            let node = match back.recv().await {
                Ok(node) => Some(node),
                Err(RecvError::Lagged(_)) => None,
                Err(RecvError::Closed) => return,
            };
            let Some(r) = running.upgrade() else { return };
            let told = match node {
                Some(node) => r.scheduler.node_back(node),
                // Which nodes came back is lost: every failure is retried.
                None => r.scheduler.deploy_failed(),
            };
            if told.is_err() {
                return;
            }
        }
    });
}

/// The root of an environment's local node.
pub fn node_root(data_dir: &Path, environment: &str) -> PathBuf {
    node_dir(data_dir, environment).join(LOCAL_NODE)
}

/// Where the local node of `environment` keeps replaced files for reuse
/// (`LocalNode::with_spares`): beside its root, outside it.
pub fn node_spares(data_dir: &Path, environment: &str) -> PathBuf {
    node_dir(data_dir, environment).join(format!(".{LOCAL_NODE}-spares"))
}

/// What an environment's local node keeps on the host (its root, its spares): removed with it.
pub(crate) fn node_dir(data_dir: &Path, environment: &str) -> PathBuf {
    data_dir.join("nodes").join(environment)
}

/// The scheduler's settings from an environment's.
pub fn scheduler_settings(s: &EnvironmentSettings) -> Settings {
    let retry = Duration::from_secs(s.retry_interval_s.max(1));
    Settings {
        env_concurrency: (s.env_concurrency as usize).max(1),
        node_concurrency: (s.per_node_concurrency as usize).max(1),
        retry_interval: retry,
        max_retry_interval: retry.max(Duration::from_secs(3600)),
        repair_interval: (s.repair_interval_s > 0).then(|| Duration::from_secs(s.repair_interval_s)),
    }
}

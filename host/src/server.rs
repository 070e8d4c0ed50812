//! `orc-host serve`: the host as a long-running service. [`Environments`] owns one running
//! [`Scheduler`] per environment (persisted through [`StoreSink`], resumed from the store), the
//! plugin registry, one Wasm [`Runtime`] and the store; [`Server`] binds the REST API
//! ([`crate::api`]) over it and runs until told to shut down.
//!
//! Data directory layout: `orc.db` (the default SQLite database), `registry/`, `cache/`
//! (compiled plugins), `nodes/<environment>/local/` (each environment's local node root),
//! `secret.key` (the key node credentials are sealed with, unless `secret_key_file` says where).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use orc_registry::{RegistryError, StoreOptions};
use orc_runtime::capability::LocalNode;
use orc_runtime::{CallContext, EngineError, Grants, Runtime, RuntimeConfig};
use tokio::sync::{Mutex, broadcast};

use crate::config::HostConfig;
use crate::diff::IntentDiff;
use crate::dryrun::{DryrunResult, ResourceFinding};
use crate::events::{Batch, EnvironmentSink, EventStream, Observer, StatusCounts};
use crate::intent::{Intent, IntentError, ResourceId};
use crate::metrics::Metrics;
use crate::nodes::{NodeRegistry, NodesError, Refusal, SECRET_KEY_FILE, SecretError, SecretKey};
use crate::outbound::{self, HostSecrets};
use crate::persistence::{self, StoreSink};
use crate::pinning::{self, PinError};
use crate::scheduler::{Scheduler, Settings, Start, Unavailable, Version};
use crate::store::{
    CapabilitySettings, DbKv, DryrunReport, DryrunStatus, Environment, EnvironmentId, EnvironmentSettings, Operation, OperationKind,
    ResourceStatus, Store, StoreError, VersionInfo, now_ms,
};

pub use crate::pinning::LOCAL_NODE;

/// Why a request about environments could not be served. Messages are safe for clients; the
/// sources carry the internal detail.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("environment `{0}` does not exist")]
    UnknownEnvironment(String),
    #[error("invalid environment name `{name}`: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error(transparent)]
    Intent(#[from] IntentError),
    /// Boxed: a load error is large, and this error travels through every request.
    #[error(transparent)]
    Pin(Box<PinError>),
    #[error("resource `{resource}` is on node `{node}`, which is not registered (nodes: `local` and those of /api/v1/nodes)")]
    UnknownNode { resource: ResourceId, node: String },
    #[error(
        "resource `{resource}` is on node `{node}`, which is private to another environment and not allowed for environment `{environment}`"
    )]
    NodeNotAllowed {
        resource: ResourceId,
        node: String,
        environment: String,
    },
    #[error("invalid settings: {0}")]
    InvalidSettings(String),
    #[error(
        "`{setting}` cannot be turned off: the released version of environment `{environment}` uses capability `{capability}` (resources {resources}); release a version without them first"
    )]
    CapabilityInUse {
        environment: String,
        setting: &'static str,
        capability: orc_manifest::Capability,
        /// The first few resources, quoted.
        resources: String,
    },
    #[error("resource `{0}`: the type `task` is reserved for the tasks of clusters (see /api/v1/environments/{{env}}/clusters)")]
    ReservedType(ResourceId),
    #[error("environment `{0}` has no intent version yet")]
    NoVersion(String),
    /// The environment's scheduler stopped on its own (see its log): nothing that needs it can
    /// be done until the host is restarted.
    #[error("the scheduler of environment `{environment}` is not running ({reason}); restart the host")]
    SchedulerUnavailable { environment: String, reason: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot prepare the node root {path}")]
    NodeRoot {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl From<PinError> for EnvError {
    fn from(e: PinError) -> EnvError {
        EnvError::Pin(Box::new(e))
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot prepare the data directory {path}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the database")]
    Store(#[from] StoreError),
    #[error("cannot open the plugin registry")]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("cannot load the host's secret key")]
    Secret(#[from] SecretError),
    #[error("cannot load the host-held secrets")]
    HostSecrets(#[from] outbound::SecretError),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// One environment's running parts.
pub(crate) struct Running {
    /// The environment's name.
    name: String,
    pub(crate) scheduler: Scheduler,
    /// Serialises submissions and releases, so the scheduler sees versions in the store's order.
    pub(crate) releases: Mutex<()>,
    /// What the environment's plugins are called with (nodes, kv, HTTP, deadline); dryruns use
    /// it too. Replaced when the settings change.
    ctx: std::sync::RwLock<CallContext>,
    /// What the environment grants its plugins, as stored; changed only while holding
    /// `releases`, so a submission reads it under its turn and never pins against grants a
    /// concurrent settings change is revoking.
    capabilities: std::sync::Mutex<CapabilitySettings>,
    pub(crate) stream: EventStream,
    /// Resources per status as persisted, kept by the scheduler's sink.
    counts: Arc<StatusCounts>,
    /// The version last handed to the scheduler (which holds it too): a dryrun of it shares it
    /// instead of loading a second copy (100,000 resources are tens of MiB).
    released: std::sync::Mutex<Option<Arc<Version>>>,
}

impl Running {
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

    /// Hands `version` to the scheduler and waits until its states are recorded, so that the
    /// environment's counts and resources describe it once this returns.
    pub(crate) async fn release(&self, version: Version) -> Result<(), EnvError> {
        let version = Arc::new(version);
        *self.released.lock().expect("released version") = Some(version.clone());
        let receipt = self.scheduler.release(version).map_err(|e| self.unavailable(e))?;
        receipt.recorded().await.map_err(|e| self.unavailable(e))
    }

    /// Refuses with [`EnvError::SchedulerUnavailable`] if the scheduler stopped on its own.
    pub(crate) fn check_scheduler(&self) -> Result<(), EnvError> {
        match self.scheduler.failure() {
            Some(reason) => Err(self.unavailable(Unavailable { reason })),
            None => Ok(()),
        }
    }

    pub(crate) fn unavailable(&self, e: Unavailable) -> EnvError {
        EnvError::SchedulerUnavailable {
            environment: self.name.clone(),
            reason: e.reason,
        }
    }

    /// Whether the released version has a resource on `node` through an adaptor that uses
    /// nodes (a purged one too: purging it needs the node).
    fn uses_node(&self, node: &str) -> bool {
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
    fn check_revocation(&self, granted: &CapabilitySettings) -> Result<(), EnvError> {
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
    fn released(&self, number: i64) -> Option<Arc<Version>> {
        let released = self.released.lock().expect("released version");
        released.as_ref().filter(|v| v.number as i64 == number).cloned()
    }
}

/// Every environment of the host, each with its scheduler.
pub struct Environments {
    pub(crate) store: Store,
    pub(crate) registry: orc_registry::Store,
    pub(crate) runtime: Runtime,
    kv: Arc<DbKv>,
    /// The SSH nodes, shared by the environments allowed to use them.
    pub(crate) nodes: NodeRegistry,
    /// Secrets for plugins' outgoing HTTP, used by the environments whose settings name them.
    secrets: HostSecrets,
    data_dir: PathBuf,
    defaults: EnvironmentSettings,
    running: Mutex<HashMap<EnvironmentId, Arc<Running>>>,
    /// Looks at every environment's events after persistence.
    observers: Vec<Arc<dyn Observer>>,
    pub(crate) metrics: Arc<Metrics>,
    /// Set when the host shuts down: cluster watchers and the lease sweeper stop.
    pub(crate) stopping: tokio::sync::watch::Sender<bool>,
}

impl Environments {
    /// The plugin registry this host serves at `/registry` and loads plugins from.
    pub fn registry(&self) -> &orc_registry::Store {
        &self.registry
    }

    /// Opens the store and the registry (seeded with the first-party plugins) and starts the
    /// scheduler of every environment, resuming what was persisted.
    pub async fn open(config: &HostConfig) -> Result<Environments, StartError> {
        // First: a secret that cannot be read or is bound to no origin stops the start before
        // anything is created.
        let secrets = HostSecrets::load(&config.secrets)?;
        let data_dir = config.data_dir.clone();
        std::fs::create_dir_all(&data_dir).map_err(|source| StartError::DataDir {
            path: data_dir.clone(),
            source,
        })?;
        let store = Store::connect(&config.database_url()).await?;
        let registry = orc_registry::Store::open(data_dir.join("registry"), StoreOptions::default())?;
        for artifact in orc_plugin_artifacts::FIRST_PARTY {
            registry.publish(artifact.bytes)?;
        }
        let runtime = Runtime::new(RuntimeConfig {
            cache_dir: Some(data_dir.join("cache")),
            ..RuntimeConfig::default()
        })?;
        let kv = Arc::new(DbKv::open(&store).await?);
        let key_file = config.secret_key_file.clone().unwrap_or_else(|| data_dir.join(SECRET_KEY_FILE));
        let key = SecretKey::load_or_create(&key_file)?;
        let nodes = NodeRegistry::open(
            store.clone(),
            key,
            orc_ssh::SshOptions::default(),
            Duration::from_secs(config.node_reverify_interval_s),
        )
        .await?;
        let environments = Environments {
            nodes,
            secrets,
            store,
            registry,
            runtime,
            kv,
            data_dir,
            defaults: config.environment_defaults.clone(),
            running: Mutex::new(HashMap::new()),
            observers: Vec::new(),
            metrics: Arc::new(Metrics::new()),
            stopping: tokio::sync::watch::channel(false).0,
        };
        for env in environments.store.list_environments().await? {
            // One environment that cannot resume (say, a plugin gone from the registry) must
            // not keep the others down; requests retry the start.
            if let Err(e) = environments.running(&env).await {
                tracing::error!(environment = %env.name, error = %error_chain(&e), "cannot resume environment");
            }
        }
        Ok(environments)
    }

    /// What `GET /metrics` shows.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The SSH nodes.
    pub fn nodes(&self) -> &NodeRegistry {
        &self.nodes
    }

    /// Deletes a node unless an environment uses it: a running environment's released version
    /// (from memory, so a version released a moment ago counts before its states are stored),
    /// or the stored states of the others (`NodeRegistry::delete`).
    pub async fn delete_node(&self, name: &str) -> Result<(), NodesError> {
        self.unless_used(name, None, self.nodes.delete(name)).await
    }

    /// Changes a node (`NodeRegistry::change`). Making it private to one environment is refused
    /// while another uses it, checked as [`Environments::delete_node`] checks.
    pub async fn change_node(&self, name: &str, change: crate::nodes::Change) -> Result<crate::store::NodeRecord, NodesError> {
        match change.environment {
            Some(Some(to)) => self.unless_used(name, Some(to), self.nodes.change(name, change)).await,
            _ => self.nodes.change(name, change).await,
        }
    }

    /// Runs `then` unless a running environment other than `except` has resources on node
    /// `name` in its released version. Every running environment's release turn is held until
    /// `then` is done, so no submission or release naming the node passes its check in between.
    async fn unless_used<T>(
        &self,
        name: &str,
        except: Option<EnvironmentId>,
        then: impl Future<Output = Result<T, NodesError>>,
    ) -> Result<T, NodesError> {
        let mut running: Vec<(EnvironmentId, Arc<Running>)> = self.running.lock().await.iter().map(|(id, r)| (*id, r.clone())).collect();
        // One order for taking several turns; a submission takes one.
        running.sort_by_key(|(id, _)| *id);
        let mut turns = Vec::with_capacity(running.len());
        for (_, r) in &running {
            turns.push(r.releases.lock().await);
        }
        let users: Vec<String> = running
            .iter()
            .filter(|(id, r)| Some(*id) != except && r.uses_node(name))
            .map(|(_, r)| r.name.clone())
            .collect();
        if !users.is_empty() {
            return Err(NodesError::InUse {
                node: name.to_string(),
                environments: users,
            });
        }
        then.await
    }

    /// The store, for reads (versions, states, actions).
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub async fn create(&self, name: &str, settings: Option<EnvironmentSettings>) -> Result<Environment, EnvError> {
        validate_name(name)?;
        let settings = settings.unwrap_or_else(|| self.defaults.clone());
        self.check_settings(&settings)?;
        let env = self.store.create_environment(name, &settings).await?;
        self.running(&env).await?;
        Ok(env)
    }

    pub async fn list(&self) -> Result<Vec<Environment>, EnvError> {
        Ok(self.store.list_environments().await?)
    }

    /// An environment by name or id.
    pub async fn get(&self, key: &str) -> Result<Environment, EnvError> {
        let unknown = || EnvError::UnknownEnvironment(key.chars().take(100).collect());
        if let Ok(id) = key.parse::<EnvironmentId>() {
            return match self.store.get_environment(&id).await {
                Err(StoreError::NotFound { .. }) => Err(unknown()),
                other => Ok(other?),
            };
        }
        self.store.find_environment_by_name(key).await?.ok_or_else(unknown)
    }

    /// Stops the environment's scheduler (actions in flight finish) and deletes everything stored
    /// for it, its plugins' key/value state and its local node's directory included.
    pub async fn delete(&self, key: &str) -> Result<(), EnvError> {
        let env = self.get(key).await?;
        let running = self.running.lock().await.remove(&env.id);
        if let Some(running) = running {
            running.scheduler.stop().await;
        }
        self.store.delete_environment(&env.id).await?;
        // Its plugins' state: scopes are `environment-id/plugin`.
        if let Err(e) = self.kv.forget(&format!("{}/", env.id)).await {
            tracing::warn!(environment = %env.name, error = %e, "cannot delete the plugins' key/value state");
        }
        self.nodes.forget_environment(&env.id);
        self.metrics.forget(&env.name);
        let root = node_dir(&self.data_dir, &env.name);
        if let Err(e) = std::fs::remove_dir_all(&root)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(environment = %env.name, path = %root.display(), error = %e, "cannot remove the node directory");
        }
        Ok(())
    }

    /// Changes some settings: `patch` is a JSON merge patch (RFC 7396) of the settings — only
    /// the fields given change, nested objects (`http`) merge field by field, `null` resets a
    /// field to its default, unknown fields are refused by name. The scheduler applies them to
    /// what it starts or schedules next (a new HTTP policy or call timeout to the actions that
    /// start after the change); turning `auto_deploy` on does not release anything already
    /// submitted.
    pub async fn update_settings(&self, key: &str, patch: serde_json::Value) -> Result<Environment, EnvError> {
        let env = self.get(key).await?;
        if !patch.is_object() {
            return Err(EnvError::InvalidSettings("the settings must be a JSON object".into()));
        }
        let mut merged = serde_json::to_value(&env.settings).expect("settings serialise");
        merge_patch(&mut merged, patch);
        let settings: EnvironmentSettings = serde_json::from_value(merged).map_err(|e| EnvError::InvalidSettings(e.to_string()))?;
        self.check_settings(&settings)?;
        let running = self.running(&env).await?;
        // Held until the settings are stored: no version using a capability being revoked is
        // released in between.
        let _turn = running.releases.lock().await;
        running.check_scheduler()?;
        running.check_revocation(&settings.capabilities)?;
        let ctx = outbound::call_context(&running.ctx(), &settings, &self.secrets).map_err(EnvError::InvalidSettings)?;
        let env = self.store.update_settings(&env.id, &settings).await?;
        *running.ctx.write().expect("call context") = ctx.clone();
        *running.capabilities.lock().expect("capabilities") = env.settings.capabilities;
        // Stored: a scheduler that stopped meanwhile takes them from the store at the next start.
        running
            .scheduler
            .update_settings(scheduler_settings(&env.settings))
            .and_then(|()| running.scheduler.update_context(ctx))
            .map_err(|e| running.unavailable(e))?;
        Ok(env)
    }

    /// Settings the scheduler can run with, naming only secrets this host holds, each bound to
    /// at least one of the allowed origins.
    fn check_settings(&self, settings: &EnvironmentSettings) -> Result<(), EnvError> {
        settings.validate().map_err(EnvError::InvalidSettings)?;
        self.secrets.check(&settings.http).map_err(EnvError::InvalidSettings)
    }

    /// Halts (nothing new starts; actions in flight finish) or resumes the environment. Persisted:
    /// a halted environment stays halted across restarts.
    pub async fn set_halted(&self, key: &str, halted: bool) -> Result<Environment, EnvError> {
        let env = self.get(key).await?;
        let running = self.running(&env).await?;
        running.check_scheduler()?;
        let env = self.store.set_halted(&env.id, halted).await?;
        running.scheduler.set_halted(halted).map_err(|e| running.unavailable(e))?;
        Ok(env)
    }

    /// Validates `intent_json`, pins its adaptors to digests, stores it as the next version (the
    /// pinned document, with every cluster's current tasks added) and, with `auto_deploy`,
    /// releases it. Resources of the reserved type `task` are refused.
    pub async fn submit(&self, key: &str, intent_json: &[u8]) -> Result<(VersionInfo, bool), EnvError> {
        let env = self.get(key).await?;
        let submitted = Intent::parse(intent_json)?;
        if let Some(task) = submitted
            .resources
            .iter()
            .find(|r| r.id.resource_type == crate::clusters::planner::TASK_TYPE)
        {
            return Err(EnvError::ReservedType(task.id.clone()));
        }
        let running = self.running(&env).await?;
        let _turn = running.releases.lock().await;
        running.check_scheduler()?;
        let intent = self.with_cluster_tasks(&env, submitted.resources).await?;
        let pinned = pinning::load_adaptors(&intent, &self.registry, &self.runtime, &running.grants()).await?;
        self.check_nodes(&intent, &pinned.plugins, &env)?;
        let document = serde_json::to_string(&pinned.pinned_document(&intent)).expect("an intent serialises");
        let info = self.store.submit_version(&env.id, &document).await?;
        if !env.settings.auto_deploy {
            return Ok((info, false));
        }
        let info = self.store.release_version(&env.id, info.version).await?;
        self.metrics.released(&env.name, info.version);
        running.release(Version::new(info.version as u64, intent, pinned.plugins)).await?;
        Ok((info, true))
    }

    /// `resources` without cluster tasks, plus every cluster's current tasks: clusters keep
    /// their resource sets across an operator's versions.
    async fn with_cluster_tasks(&self, env: &Environment, resources: Vec<crate::intent::ResourceSpec>) -> Result<Intent, EnvError> {
        let tasks = self.cluster_tasks(env).await?;
        let mut resources: Vec<_> = resources
            .into_iter()
            .filter(|r| r.id.resource_type != crate::clusters::planner::TASK_TYPE)
            .collect();
        resources.extend(tasks);
        Ok(Intent::validate(crate::intent::IntentDocument { resources })?)
    }

    /// Stores `intent` (already holding the clusters' current tasks) as a new version and
    /// releases it.
    async fn submit_and_release(&self, env: &Environment, running: &Running, intent: Intent) -> Result<VersionInfo, EnvError> {
        running.check_scheduler()?;
        let pinned = pinning::load_adaptors(&intent, &self.registry, &self.runtime, &running.grants()).await?;
        // An earlier version may name a node deleted since, or made private to another environment.
        self.check_nodes(&intent, &pinned.plugins, env)?;
        let document = serde_json::to_string(&pinned.pinned_document(&intent)).expect("an intent serialises");
        let info = self.store.submit_version(&env.id, &document).await?;
        let info = self.store.release_version(&env.id, info.version).await?;
        self.metrics.released(&env.name, info.version);
        running.release(Version::new(info.version as u64, intent, pinned.plugins)).await?;
        Ok(info)
    }

    /// Rolls back to an earlier version: its (pinned) document, with the clusters' current
    /// tasks, becomes a new version, which is released at once. History stays linear: the new
    /// version records what is deployed now.
    pub async fn rollback(&self, key: &str, to: i64) -> Result<VersionInfo, EnvError> {
        let env = self.get(key).await?;
        let running = self.running(&env).await?;
        let _turn = running.releases.lock().await;
        let stored = Intent::parse(self.store.get_version(&env.id, to).await?.document.as_bytes())?;
        let intent = self.with_cluster_tasks(&env, stored.resources).await?;
        self.submit_and_release(&env, &running, intent).await
    }

    /// What changed from version `from` to version `to`.
    pub async fn diff(&self, key: &str, from: i64, to: i64) -> Result<IntentDiff, EnvError> {
        let env = self.get(key).await?;
        let parse = |document: String| Intent::parse(document.as_bytes());
        let a = parse(self.store.get_version(&env.id, from).await?.document)?;
        let b = parse(self.store.get_version(&env.id, to).await?.document)?;
        Ok(crate::diff::diff(from, &a, to, &b))
    }

    /// Starts a user deploy or repair; the returned operation is completed (in the store) with its
    /// outcome once the scheduler has settled.
    pub async fn start_operation(&self, key: &str, kind: OperationKind) -> Result<Operation, EnvError> {
        let env = self.get(key).await?;
        let running = self.running(&env).await?;
        running.check_scheduler()?;
        let op = self.store.create_operation(&env.id, kind).await?;
        let started = match kind {
            OperationKind::Deploy => running.scheduler.deploy_failed(),
            OperationKind::Repair => running.scheduler.repair(),
        };
        if let Err(e) = started {
            let e = running.unavailable(e);
            let failed = serde_json::json!({ "error": { "code": "scheduler_unavailable", "message": e.to_string() } });
            self.store.interrupt_operation(&env.id, &op.id, &failed.to_string()).await?;
            return Err(e);
        }
        let (store, scheduler, op_id, since) = (self.store.clone(), running.scheduler.clone(), op.id, op.created_at);
        let name = running.name.clone();
        tokio::spawn(async move {
            let snapshot = match scheduler.settled().await {
                Ok(snapshot) => snapshot,
                Err(e) => {
                    // Never `done` for work that will not happen.
                    let message = format!(
                        "the scheduler of environment `{name}` stopped before the operation ended: {}",
                        e.reason
                    );
                    let failed = serde_json::json!({ "error": { "code": "scheduler_unavailable", "message": message } });
                    if let Err(e) = store.interrupt_operation(&env.id, &op_id, &failed.to_string()).await {
                        tracing::error!(environment = %env.name, operation = %op_id, error = %error_chain(&e), "cannot record the operation's end");
                    }
                    return;
                }
            };
            // Every action of the operation finished before the settle answer (the writer
            // records events before it replies), so the log counts them all.
            let actions = match store.count_actions(&env.id, since, now_ms() + 1).await {
                Ok(counts) => counts.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
                Err(e) => {
                    tracing::error!(environment = %env.name, error = %error_chain(&e), "cannot count the operation's actions");
                    Default::default()
                }
            };
            let statuses: std::collections::BTreeMap<_, _> = snapshot.counts.iter().map(|(s, n)| (s.as_str(), *n)).collect();
            let result = serde_json::json!({ "version": snapshot.version, "resources": statuses, "actions": actions });
            if let Err(e) = store.complete_operation(&env.id, &op_id, &result.to_string()).await {
                tracing::error!(environment = %env.name, operation = %op_id, error = %error_chain(&e), "cannot complete the operation");
            }
        });
        Ok(op)
    }

    /// Starts a dryrun of `version` (default: the latest); the returned report is completed (in
    /// the store) once every resource has been read and compared. Nothing is changed.
    pub async fn start_dryrun(&self, key: &str, version: Option<i64>) -> Result<DryrunReport, EnvError> {
        let env = self.get(key).await?;
        let version = match version {
            Some(v) => v,
            None if env.latest_version > 0 => env.latest_version,
            None => return Err(EnvError::NoVersion(env.name)),
        };
        let running = self.running(&env).await?;
        let loaded = match running.released(version) {
            Some(shared) => shared,
            None => Arc::new(self.load_version(&env.id, version, &running.grants()).await?),
        };
        let report = self.store.create_dryrun(&env.id, version).await?;
        let (store, ctx, id) = (self.store.clone(), running.ctx(), report.id);
        let (concurrency, per_node) = (env.settings.env_concurrency as usize, env.settings.per_node_concurrency as usize);
        tokio::spawn(async move {
            let findings = crate::scheduler::dryrun_each(&loaded, &ctx, concurrency, per_node, ResourceFinding::of).await;
            drop(loaded);
            let result = DryrunResult::from_findings(version, findings);
            let json = serde_json::to_string(&result).expect("a dryrun report serialises");
            if let Err(e) = store.complete_dryrun(&env.id, &id, DryrunStatus::Done, &json).await {
                tracing::error!(environment = %env.name, dryrun = %id, error = %error_chain(&e), "cannot store the dryrun report");
            }
        });
        Ok(report)
    }

    /// How many of the environment's resources are in each status (statuses with none left
    /// out), as persisted: kept in memory by a running environment's sink, else counted in the
    /// store.
    pub async fn status_counts(&self, env: &Environment) -> Result<Vec<(ResourceStatus, i64)>, EnvError> {
        let counts = self.running.lock().await.get(&env.id).and_then(|r| r.counts.get());
        match counts {
            Some(counts) => Ok(counts),
            None => Ok(self.store.status_counts(&env.id).await?),
        }
    }

    /// Why the environment's scheduler stopped on its own, if it did (`None` also when it has
    /// not been started yet).
    pub async fn scheduler_failure(&self, env: &Environment) -> Option<String> {
        self.running.lock().await.get(&env.id).and_then(|r| r.scheduler.failure())
    }

    /// Every environment whose scheduler stopped on its own, with the reason.
    pub async fn failed_schedulers(&self) -> Vec<(String, String)> {
        let running = self.running.lock().await;
        let mut failed: Vec<(String, String)> = running
            .values()
            .filter_map(|r| r.scheduler.failure().map(|reason| (r.name.clone(), reason)))
            .collect();
        failed.sort();
        failed
    }

    /// The environment's event stream, from now on.
    pub async fn subscribe(&self, key: &str) -> Result<broadcast::Receiver<Batch>, EnvError> {
        let env = self.get(key).await?;
        Ok(self.running(&env).await?.stream.subscribe())
    }

    /// Releases a stored version (also an older one: a rollback). A version whose cluster tasks
    /// are not the clusters' current ones is released as a new version that carries them.
    pub async fn release(&self, key: &str, version: i64) -> Result<VersionInfo, EnvError> {
        let env = self.get(key).await?;
        let running = self.running(&env).await?;
        let _turn = running.releases.lock().await;
        let stored = Intent::parse(self.store.get_version(&env.id, version).await?.document.as_bytes())?;
        let composed = self.with_cluster_tasks(&env, stored.resources.clone()).await?;
        if composed.resources != stored.resources {
            // Its cluster tasks are not the clusters' current ones: a new version carries them.
            return self.submit_and_release(&env, &running, composed).await;
        }
        running.check_scheduler()?;
        let loaded = self.load_version(&env.id, version, &running.grants()).await?;
        self.check_nodes(&loaded.intent, &loaded.plugins, &env)?;
        let info = self.store.release_version(&env.id, version).await?;
        self.metrics.released(&env.name, info.version);
        running.release(loaded).await?;
        Ok(info)
    }

    /// Stops every scheduler: nothing new starts, and actions in flight get `grace` to finish and
    /// be recorded. What is still running then is abandoned safely (a restart sets what was left
    /// `deploying` back to `available` and runs it again). Then the database is closed.
    pub async fn shutdown(&self, grace: Duration) {
        self.stopping.send_replace(true);
        let running: Vec<Arc<Running>> = self.running.lock().await.drain().map(|(_, r)| r).collect();
        let stops = futures::future::join_all(running.iter().map(|r| r.scheduler.stop()));
        if tokio::time::timeout(grace, stops).await.is_err() {
            tracing::warn!(
                grace_s = grace.as_secs_f64(),
                "actions still in flight after the grace period are abandoned"
            );
        }
        drop(running);
        // Plugin state accepted by actions that finished is committed before the pool closes
        // (the scheduler's sink already waited for what its batches depended on).
        if tokio::time::timeout(grace, self.kv.durable()).await.is_err() {
            tracing::warn!("plugin key/value writes not committed within the grace period are lost");
        }
        self.store.close().await;
    }

    /// A stored version with its adaptors loaded from their pinned digests, under the
    /// environment's grants.
    async fn load_version(&self, env: &EnvironmentId, version: i64, grants: &Grants) -> Result<Version, EnvError> {
        let stored = self.store.get_version(env, version).await?;
        let intent = Intent::parse(stored.document.as_bytes())?;
        let pinned = pinning::load_adaptors(&intent, &self.registry, &self.runtime, grants).await?;
        Ok(Version::new(version as u64, intent, pinned.plugins))
    }

    /// Every resource's node must be `local` or a registered node the environment may use. A
    /// node not verified yet (or unreachable, or blocked) is accepted: its resources stay
    /// `unavailable` (or fail as denied) until it is usable, as with a node that goes down later.
    /// A resource whose adaptor does not use nodes (`http-object`: the node part names an API)
    /// is not checked.
    pub(crate) fn check_nodes(&self, intent: &Intent, plugins: &[Arc<orc_runtime::Plugin>], env: &Environment) -> Result<(), EnvError> {
        let on_nodes = intent
            .resources
            .iter()
            .zip(plugins)
            .filter(|(_, p)| pinning::uses_nodes(&p.manifest))
            .map(|(r, _)| r);
        for r in on_nodes.filter(|r| r.id.node != LOCAL_NODE) {
            match self.nodes.check(&r.id.node, &env.id) {
                Ok(()) => {}
                Err(Refusal::Unknown) => {
                    return Err(EnvError::UnknownNode {
                        resource: r.id.clone(),
                        node: r.id.node.clone(),
                    });
                }
                Err(Refusal::NotAllowed) => {
                    return Err(EnvError::NodeNotAllowed {
                        resource: r.id.clone(),
                        node: r.id.node.clone(),
                        environment: env.name.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The environment's scheduler, started (and resumed from the store) on first use.
    pub(crate) async fn running(&self, env: &Environment) -> Result<Arc<Running>, EnvError> {
        let mut running = self.running.lock().await;
        if let Some(r) = running.get(&env.id) {
            return Ok(r.clone());
        }
        let root = node_root(&self.data_dir, &env.name);
        let spares = node_spares(&self.data_dir, &env.name);
        let node = LocalNode::open(&root)
            .and_then(|node| node.with_spares(&spares))
            .map_err(|source| EnvError::NodeRoot { path: root, source })?;
        let nodes = Arc::new(self.nodes.directory(env.id, &env.name, Arc::new(node)));
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
        let stream = EventStream::default();
        let counts = Arc::new(StatusCounts::seed(
            resumed.states.iter().map(|s| (s.resource_id.as_str(), s.status, s.version)),
        ));
        let sink = Arc::new(EnvironmentSink::new(
            StoreSink::new(self.store.clone(), env.id)
                .after_plugin_state(self.kv.clone())
                .after_nodes(nodes),
            stream.clone(),
            observers,
            counts.clone(),
        ));
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
            ctx: std::sync::RwLock::new(ctx),
            capabilities: std::sync::Mutex::new(env.settings.capabilities),
            stream,
            counts,
            released: std::sync::Mutex::new(None),
        });
        if let Some(version) = released {
            // Not waited for: a request that needs the environment need not wait for its
            // states to be rewritten.
            *r.released.lock().expect("released version") = Some(Arc::new(version));
            let version = r.released_version().expect("just set");
            if let Err(e) = r.scheduler.release(version) {
                tracing::error!(environment = %env.name, error = %e, "cannot resume the released version");
            }
        }
        running.insert(env.id, r.clone());
        Ok(r)
    }
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
fn node_dir(data_dir: &Path, environment: &str) -> PathBuf {
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

/// JSON merge patch (RFC 7396): objects merge field by field, `null` removes a field (so that it
/// takes its default), anything else replaces.
pub(crate) fn merge_patch(target: &mut serde_json::Value, patch: serde_json::Value) {
    let serde_json::Value::Object(fields) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = serde_json::Value::Object(Default::default());
    }
    let object = target.as_object_mut().expect("an object");
    for (key, value) in fields {
        if value.is_null() {
            object.remove(&key);
        } else {
            merge_patch(object.entry(key).or_insert(serde_json::Value::Null), value);
        }
    }
}

/// Names become directory names (node roots), so they are kept plain.
fn validate_name(name: &str) -> Result<(), EnvError> {
    let invalid = |reason| EnvError::InvalidName {
        name: name.chars().take(100).collect(),
        reason,
    };
    if name.is_empty() || name.len() > 63 {
        return Err(invalid("it must have 1 to 63 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err(invalid("use lowercase letters, digits, `-` and `_`"));
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(invalid("it must start with a letter or digit"));
    }
    Ok(())
}

/// An error with its sources, for the log.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The bound REST server.
pub struct Server {
    listener: tokio::net::TcpListener,
    environments: Arc<Environments>,
    max_body_bytes: usize,
    shutdown_grace: Duration,
    initial_token: Option<String>,
}

impl Server {
    /// Opens everything and binds `config.listen`; nothing is served until [`Server::run`].
    pub async fn start(config: &HostConfig) -> Result<Server, StartError> {
        let environments = Arc::new(Environments::open(config).await?);
        environments.resume_clusters().await;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| StartError::Bind {
                addr: config.listen,
                source,
            })?;
        let initial_token = ensure_admin_token(environments.store()).await?;
        Ok(Server {
            listener,
            environments,
            max_body_bytes: config.max_body_bytes,
            shutdown_grace: Duration::from_secs(config.shutdown_grace_s),
            initial_token,
        })
    }

    /// The admin token created on this first start of the host (none exists in the store yet).
    /// It is shown once: only its hash is stored.
    pub fn initial_token(&self) -> Option<&str> {
        self.initial_token.as_deref()
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, lets requests in flight finish, then stops the
    /// schedulers, giving actions in flight the configured grace period.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
        let app = crate::api::router(self.environments.clone(), self.max_body_bytes);
        let served = crate::api::serve(self.listener, app, shutdown).await;
        self.environments.shutdown(self.shutdown_grace).await;
        served
    }
}

/// Creates the first admin token when the store has none; returns it (the store keeps only its
/// sha256).
async fn ensure_admin_token(store: &Store) -> Result<Option<String>, StoreError> {
    if store.count_admin_tokens().await? > 0 {
        return Ok(None);
    }
    Ok(Some(create_admin_token(store).await?.1))
}

/// A new admin token: its record and the secret, which only its creator ever sees (the store
/// keeps its sha256).
pub async fn create_admin_token(store: &Store) -> Result<(crate::store::AdminToken, String), StoreError> {
    // Two v4 UUIDs: 244 bits from the operating system's random source.
    let token = format!("orc_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let record = store.insert_admin_token(&crate::store::hash_token(&token)).await?;
    Ok((record, token))
}

//! The application layer: what the host does, as the REST API (and the cluster watchers)
//! ask for it. [`App`] owns the store, the plugin registry, one Wasm runtime, the SSH node
//! registry and one running scheduler per environment ([`running`]); its operations are cut by
//! concern — [`environments`] (create, settings, halt, delete), [`versions`] (submit, release,
//! rollback, diff, node checks), [`operations`] (deploy, repair, dryrun), [`resources`] (what the
//! store says of resources and actions), [`nodes`] (node changes that need the environments'
//! release turns), [`access`] (users, roles, tokens, sign-in and the audit trail) and [`clusters`] (templates, clusters and their
//! watchers). API handlers call these and never the store.
//!
//! Data directory layout: `orc.db` (the default SQLite database), `registry/`, `cache/`
//! (compiled plugins), `nodes/<environment>/local/` (each environment's local node root),
//! `secret.key` (the key node credentials are sealed with, unless `secret_key_file` says where),
//! `orc-host.pid` (held while the server runs: one process per directory, [`crate::data_dir`]).

mod access;
mod audit;
pub mod clusters;
mod environments;
mod error;
mod events;
mod nodes;
mod operations;
mod ownership;
pub mod processes;
mod relay;
mod resources;
mod running;
mod services;
pub mod sign_in;
mod versions;
mod watcher;

pub use crate::error::EnvError;
pub(crate) use access::new_secret;
pub use access::{NewUser, ScopeRequest, TokenView, UserPatch};
pub use environments::settings_tag;
pub use error::{AccessError, StartError};
pub use events::Followed;
pub use ownership::{HeldView, ReplicaView};
pub use relay::{CommandRunner, RelayError};
pub use resources::DesiredResource;
use running::Running;
pub use running::{node_root, node_spares, scheduler_settings};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use orc_registry::StoreOptions;
use orc_runtime::{Runtime, RuntimeConfig};
use tokio::sync::Mutex;

use crate::metrics::Metrics;
use crate::nodes::{NodeRegistry, SECRET_KEY_FILE, SecretKey};
use crate::policy::outbound::HostSecrets;
use crate::policy::settings::EnvironmentSettings;
use crate::scheduler::ResourceStatus;
use crate::scheduler::events::Observer;
use crate::scheduler::subscribers::{Subscription, Want};
use crate::server::config::HostConfig;
use crate::store::{DbKv, Environment, EnvironmentId, Store};

/// Every environment of the host, each with its scheduler.
pub struct App {
    store: Store,
    registry: orc_registry::Store,
    runtime: Runtime,
    kv: Arc<DbKv>,
    /// The SSH nodes, shared by the environments allowed to use them.
    nodes: NodeRegistry,
    /// Secrets for plugins' outgoing HTTP, used by the environments whose settings name them.
    secrets: HostSecrets,
    data_dir: PathBuf,
    /// This process's hold on `data_dir`, let go at shutdown ([`crate::data_dir::DataDirLock`]).
    data_dir_lock: std::sync::Mutex<Option<crate::data_dir::DataDirLock>>,
    defaults: EnvironmentSettings,
    running: Mutex<HashMap<EnvironmentId, Arc<Running>>>,
    /// Environments being deleted: set under the `running` lock before their scheduler is
    /// taken out, so that no request that read the environment before the delete starts a new
    /// scheduler for it (see [`App::running`]).
    deleting: std::sync::Mutex<std::collections::HashSet<EnvironmentId>>,
    /// Looks at every environment's events after persistence.
    observers: Vec<Arc<dyn Observer>>,
    metrics: Arc<Metrics>,
    /// Set when the host shuts down: cluster watchers and the lease sweeper stop.
    stopping: tokio::sync::watch::Sender<bool>,
    /// Principals by token hash, and the generation of users, roles and tokens.
    access: access::AccessCache,
    /// Service versions read from the catalog (immutable once published).
    service_docs: services::ServiceDocs,
    /// The audit trail's writer.
    audit: audit::AuditTrail,
    /// The password pool and the sign-in throttle.
    sign_in: sign_in::SignInGate,
    /// The bound of each event stream subscriber's queue, in bytes.
    event_buffer_bytes: usize,
    /// How long recorded events are kept (`HostConfig::event_log_s`).
    event_log: Duration,
    /// Which environments this replica runs ([`ownership`]).
    ownership: ownership::Ownership,
    /// This `App`, for the tasks a request starts (an environment taken resumes its watchers).
    this: std::sync::Weak<App>,
}

impl App {
    /// The plugin registry this host serves at `/registry` and loads plugins from.
    pub fn registry(&self) -> &orc_registry::Store {
        &self.registry
    }

    /// Opens the store and the registry (seeded with the first-party plugins) and joins the
    /// replicas on the database as a new one, holding nothing yet: [`App::start_ownership`]
    /// takes this replica's environments and resumes them. `address` is where its API listens.
    pub async fn open(config: &HostConfig, address: &str) -> Result<Arc<App>, StartError> {
        // First: a secret that cannot be read or is bound to no origin stops the start before
        // anything is created.
        let secrets = HostSecrets::load(&config.secrets)?;
        let data_dir = config.data_dir.clone();
        std::fs::create_dir_all(&data_dir).map_err(|source| StartError::DataDir {
            path: data_dir.clone(),
            source,
        })?;
        let data_dir_lock = crate::data_dir::DataDirLock::acquire(&data_dir)?;
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
        let audit = audit::AuditTrail::start(store.clone());
        let me = crate::store::ReplicaId::random();
        store.register_replica(me, address, env!("CARGO_PKG_VERSION")).await?;
        let presence = store.presence(me).await?;
        let sole = store.backend() == crate::store::Backend::Sqlite;
        let ownership = ownership::Ownership::new(me, presence, config.replicas, sole);
        let app = Arc::new_cyclic(|this| App {
            this: this.clone(),
            ownership,
            audit,
            nodes,
            secrets,
            store,
            registry,
            runtime,
            kv,
            data_dir,
            data_dir_lock: std::sync::Mutex::new(Some(data_dir_lock)),
            defaults: config.environment_defaults.clone(),
            running: Mutex::new(HashMap::new()),
            deleting: std::sync::Mutex::new(std::collections::HashSet::new()),
            observers: Vec::new(),
            metrics: Arc::new(Metrics::new()),
            stopping: tokio::sync::watch::channel(false).0,
            access: access::AccessCache::new(config.token_requests_per_s, config.token_burst),
            service_docs: services::ServiceDocs::default(),
            sign_in: sign_in::SignInGate::new(&config.sign_in),
            event_buffer_bytes: config.event_buffer_bytes,
            event_log: Duration::from_secs(config.event_log_s),
        });
        app.follow_access_changes();
        Ok(app)
    }

    /// What `GET /metrics` shows.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
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

    /// The environment's event stream, from now on: the batches, or only their count.
    pub async fn subscribe(&self, key: &str, want: Want) -> Result<Subscription, EnvError> {
        let env = self.get(key).await?;
        Ok(self.running(&env).await?.stream.subscribe(want))
    }

    /// Stops every scheduler: nothing new starts, and actions in flight get `grace` to finish and
    /// be recorded. What is still running then is abandoned safely (a restart sets what was left
    /// `deploying` back to `available` and runs it again). Then the database is closed.
    pub async fn shutdown(&self, grace: Duration) {
        self.stopping.send_replace(true);
        let running: Vec<Arc<Running>> = self.running.lock().await.drain().map(|(_, r)| r).collect();
        for r in &running {
            r.ended.send_replace(true);
        }
        let stops = futures::future::join_all(running.iter().map(|r| r.scheduler.stop()));
        if tokio::time::timeout(grace, stops).await.is_err() {
            tracing::warn!(
                grace_s = grace.as_secs_f64(),
                "actions still in flight after the grace period are abandoned"
            );
        }
        drop(running);
        // Stopped: the others may take them over now rather than once the leases expire. (An
        // action abandoned above may still write to a device; its outcome is not recorded and
        // the next owner reads the resource again.)
        self.release_all().await;
        // Plugin state accepted by actions that finished is committed before the pool closes
        // (the scheduler's sink already waited for what its batches depended on).
        if tokio::time::timeout(grace, self.kv.durable()).await.is_err() {
            tracing::warn!("plugin key/value writes not committed within the grace period are lost");
        }
        if tokio::time::timeout(grace, self.audit.flush()).await.is_err() {
            tracing::warn!("audit entries not written within the grace period are lost");
        }
        self.store.close().await;
        // Last: another process may take the directory now.
        drop(self.data_dir_lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
    }
}

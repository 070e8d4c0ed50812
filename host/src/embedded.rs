//! The embedded deploy (`orc-host deploy`): registry, runtime and executors in one process over a
//! local data directory. The first-party plugins are published into the local registry on start,
//! every adaptor reference is pinned to a digest, and resources run in dependency order, in
//! parallel where the graph allows, each through the same executor a server would use.
//!
//! Outgoing HTTP is denied unless the config allows origins ([`HttpSettings`], as an
//! environment's settings in the server); the secrets given are the host-held secrets of this
//! run, all usable by the intent's plugins, each only towards the origins it is bound to.
//!
//! Data directory layout: `registry/` (content-addressed plugins), `cache/` (compiled artifacts),
//! `kv/` (plugin key/value state), `nodes/local/` (the local node's root, unless given).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use orc_manifest::Digest;
use orc_node::{LocalNode, NodeDirectory, Nodes};
use orc_registry::{RegistryError, Store, StoreOptions};
use orc_runtime::capability::DirKv;
use orc_runtime::{CallContext, EngineError, Runtime, RuntimeConfig};
use std::sync::Mutex;

use crate::executor::{self, ActionReport, Mode, Outcome};
use crate::intent::pinning::{self, PinError};
use crate::intent::{Intent, IntentError, ResourceId};
use crate::policy::outbound::{self, HostSecrets, SecretConfig, SecretError};
use crate::policy::settings::{CapabilitySettings, EnvironmentSettings, HttpSettings, LocalCommandSettings};
use crate::scheduler::{self, BoxFuture, Event, ResourceStatus as Status, Scheduler, Settings, Sink, Version};

pub use crate::intent::pinning::LOCAL_NODE;

#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    pub data_dir: PathBuf,
    /// Root directory of the `local` node (default `DATA_DIR/nodes/local`).
    pub local_root: Option<PathBuf>,
    pub mode: Mode,
    /// Resource actions in flight at once.
    pub concurrency: usize,
    /// Where plugins may send HTTP requests; `http.secrets` empty means every secret of
    /// `secrets` may be used.
    pub http: HttpSettings,
    /// The host-held secrets of this run, by name, each with the origins it is bound to (which
    /// `http.allowed_origins` must share).
    pub secrets: BTreeMap<String, SecretConfig>,
    /// Longest one plugin call may run, in seconds.
    pub call_timeout_s: u64,
    /// Commands on the local node reach the host's network (`local_commands.network`).
    pub local_network: bool,
}

impl EmbeddedConfig {
    /// Deploys (or dry-runs) on the local node under `data_dir`, without outgoing HTTP, with the
    /// server's default call timeout.
    pub fn new(data_dir: PathBuf, mode: Mode, concurrency: usize) -> EmbeddedConfig {
        EmbeddedConfig {
            data_dir,
            local_root: None,
            mode,
            concurrency,
            http: HttpSettings::default(),
            secrets: BTreeMap::new(),
            call_timeout_s: EnvironmentSettings::default().call_timeout_s,
            local_network: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(transparent)]
    DataDirInUse(#[from] crate::data_dir::DataDirError),
    #[error("cannot prepare the data directory {path}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Intent(#[from] IntentError),
    #[error("the local registry")]
    Registry(#[from] RegistryError),
    #[error("resource `{resource}` is on node `{node}`; an embedded deploy manages only the `local` node")]
    UnknownNode { resource: ResourceId, node: String },
    /// Boxed: a load error is large.
    #[error(transparent)]
    Pin(Box<PinError>),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("cannot open the key/value store")]
    Kv(#[source] orc_runtime::capability::KvError),
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error("invalid settings: {0}")]
    Settings(String),
    #[error("cannot make the changes on the local node durable")]
    NotDurable(#[source] orc_node::NodeError),
}

impl From<PinError> for EmbeddedError {
    fn from(e: PinError) -> EmbeddedError {
        EmbeddedError::Pin(Box::new(e))
    }
}

/// What a deploy did, per resource in intent order.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeployReport {
    pub actions: Vec<ActionReport>,
    /// Each adaptor reference and the digest it was pinned to.
    pub pinned: Vec<(String, Digest)>,
    pub local_root: PathBuf,
}

impl DeployReport {
    pub fn succeeded(&self) -> bool {
        self.actions.iter().all(|a| a.outcome.succeeded())
    }

    pub fn count(&self, outcome: Outcome) -> usize {
        self.actions.iter().filter(|a| a.outcome == outcome).count()
    }
}

/// Validates, pins and deploys `intent_json`. `progress` sees each resource that settles, with the
/// count settled so far and the total.
pub async fn deploy(
    config: &EmbeddedConfig,
    intent_json: &[u8],
    progress: impl Fn(&str, usize, usize) + Send + Sync + 'static,
) -> Result<DeployReport, EmbeddedError> {
    let intent = Intent::parse(intent_json)?;
    let secrets = HostSecrets::load(&config.secrets)?;
    let mut http = config.http.clone();
    if http.secrets.is_empty() {
        http.secrets = secrets.names().map(str::to_string).collect();
    }
    let settings = EnvironmentSettings {
        http,
        call_timeout_s: config.call_timeout_s,
        // Embedded mode deploys the operator's own intent on their own machine, as their own
        // user: there is no environment for them to be denied by. Outgoing HTTP is still bound
        // by `http`'s allowed origins.
        capabilities: CapabilitySettings::everything(),
        // Commands are confined all the same (the sandbox keeps a plugin from the operator's
        // files and credentials); the network only when asked for (`--local-network`): there
        // a command reaches the host's local services as the host's user.
        local_commands: LocalCommandSettings {
            network: config.local_network,
            ..LocalCommandSettings::default()
        },
        ..EnvironmentSettings::default()
    };
    settings
        .validate()
        .and_then(|()| secrets.check(&settings.http))
        .map_err(EmbeddedError::Settings)?;
    let data_dir = &config.data_dir;
    let dir_err = |path: PathBuf| move |source| EmbeddedError::DataDir { path, source };
    std::fs::create_dir_all(data_dir).map_err(dir_err(data_dir.clone()))?;
    let _held = crate::data_dir::DataDirLock::acquire(data_dir)?;

    let store = Store::open(data_dir.join("registry"), StoreOptions::default())?;
    for artifact in orc_plugin_artifacts::FIRST_PARTY {
        store.publish(artifact.bytes)?;
    }

    let runtime = Runtime::new(RuntimeConfig {
        cache_dir: Some(data_dir.join("cache")),
        max_instances: (config.concurrency * 2).max(16) as u32,
        ..RuntimeConfig::default()
    })?;
    let pinned = pinning::load_adaptors(&intent, &store, &runtime, &settings.capabilities.grants()).await?;
    let plugins = pinned.plugins;
    let pinned = pinned.by_reference;
    // Resources whose adaptor uses nodes are on `local`; the others (`http-object`) name
    // something else there.
    for (r, plugin) in intent.resources.iter().zip(&plugins) {
        if r.id.node != LOCAL_NODE && pinning::uses_nodes(&plugin.manifest) {
            return Err(EmbeddedError::UnknownNode {
                resource: r.id.clone(),
                node: r.id.node.clone(),
            });
        }
    }

    let local_root = config.local_root.clone().unwrap_or_else(|| data_dir.join("nodes").join(LOCAL_NODE));
    let spares = data_dir.join("nodes").join(format!(".{LOCAL_NODE}-spares"));
    let node = LocalNode::open(&local_root)
        .and_then(|node| node.with_spares(&spares))
        .map_err(dir_err(local_root.clone()))?;
    let nodes = Arc::new(Nodes::default());
    nodes.insert(LOCAL_NODE, Arc::new(node));
    let kv = DirKv::open(data_dir.join("kv")).map_err(EmbeddedError::Kv)?;
    let base = CallContext {
        kv: Arc::new(kv),
        nodes: nodes.clone(),
        ..CallContext::new("embedded")
    };
    let ctx = outbound::call_context(&base, &settings, &secrets).map_err(EmbeddedError::Settings)?;

    let version = Arc::new(Version::new(1, intent, plugins));
    let actions = match config.mode {
        Mode::Dryrun => {
            let reports = scheduler::dryrun(&version, &ctx, config.concurrency).await;
            let total = reports.len();
            for (i, r) in reports.iter().enumerate() {
                progress(&r.resource, i + 1, total);
            }
            reports
        }
        Mode::Deploy => {
            let reports = run_once(version, ctx, config.concurrency, Arc::new(progress)).await;
            // Nothing is reported done before it is durable: the sink passed the fence before
            // each batch; this one also covers a batch whose fence failed.
            nodes.durable().await.map_err(EmbeddedError::NotDurable)?;
            reports
        }
    };
    let mut pinned: Vec<(String, Digest)> = pinned.into_iter().map(|(r, p)| (r.to_string(), p.digest)).collect();
    pinned.sort();
    Ok(DeployReport {
        actions,
        pinned,
        local_root,
    })
}

/// Told each resource that settles, with the number settled so far and the total.
type Progress = Arc<dyn Fn(&str, usize, usize) + Send + Sync>;

/// Deploys a version once through the scheduler (the code path a server uses) and waits until it
/// settles; retries and self-healing are the server's business, so they are off.
async fn run_once(version: Arc<Version>, ctx: CallContext, concurrency: usize, progress: Progress) -> Vec<ActionReport> {
    let total = version.intent.resources.len();
    let sink = Arc::new(CollectingSink {
        nodes: ctx.nodes.clone(),
        progress,
        total,
        seen: Mutex::new(Collected::default()),
    });
    let settings = Settings {
        env_concurrency: concurrency.max(1),
        node_concurrency: concurrency.max(1),
        retry_interval: std::time::Duration::from_secs(3600 * 24 * 365),
        max_retry_interval: std::time::Duration::from_secs(3600 * 24 * 365),
        repair_interval: None,
    };
    let scheduler = Scheduler::spawn(ctx, settings, sink.clone(), HashMap::new());
    let ran = match scheduler.release(version.clone()) {
        Ok(_) => scheduler.settled().await.map(drop),
        Err(e) => Err(e),
    };
    // A scheduler that stopped on its own leaves resources without a report: they are reported
    // not attempted, with the reason, and the deploy fails.
    let stopped = ran.err().map(|e| e.to_string());
    let mut seen = sink.seen.lock().expect("sink");
    version
        .intent
        .resources
        .iter()
        .map(|spec| {
            let id = spec.id.to_string();
            let status = seen.status.get(&id).copied();
            match (status, seen.reports.remove(&id)) {
                (Some(Status::Skipped), _) | (_, None) => {
                    let because = seen
                        .skip_reason
                        .get(&id)
                        .cloned()
                        .or_else(|| stopped.clone())
                        .unwrap_or_else(|| "a requirement did not succeed".into());
                    executor::skipped(spec, Mode::Deploy, &because)
                }
                (_, Some(report)) => report,
            }
        })
        .collect()
}

#[derive(Default)]
struct Collected {
    status: HashMap<String, Status>,
    skip_reason: HashMap<String, String>,
    reports: HashMap<String, ActionReport>,
    done: usize,
}

/// Keeps the last action report and status of every resource, and reports progress once the
/// node's durability fence has passed for them.
struct CollectingSink {
    nodes: Arc<dyn NodeDirectory>,
    progress: Progress,
    total: usize,
    seen: Mutex<Collected>,
}

impl Sink for CollectingSink {
    fn record(&self, events: Vec<Event>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Err(e) = self.nodes.durable().await {
                // `deploy` passes the fence again at the end and fails if it still cannot.
                tracing::error!(error = %e, "cannot make the local node's changes durable");
            }
            self.collect(events);
        })
    }
}

impl CollectingSink {
    fn collect(&self, events: Vec<Event>) {
        let mut seen = self.seen.lock().expect("sink");
        for event in events {
            match event {
                Event::State(state) => {
                    let terminal =
                        |s: Option<&Status>| matches!(s, Some(Status::Deployed | Status::Failed | Status::Skipped | Status::Unavailable));
                    let was = terminal(seen.status.get(&state.resource));
                    let now = terminal(Some(&state.status));
                    if state.status == Status::Skipped
                        && let Some(e) = &state.last_error
                    {
                        seen.skip_reason
                            .insert(state.resource.clone(), e.message.trim_start_matches("not attempted: ").to_string());
                    }
                    seen.status.insert(state.resource.clone(), state.status);
                    if now && !was {
                        seen.done += 1;
                        (self.progress)(&state.resource, seen.done, self.total);
                    } else if was && !now {
                        seen.done -= 1;
                    }
                }
                Event::Action { report, .. } => {
                    seen.reports.insert(report.resource.clone(), report);
                }
                // One version per run: nothing is dropped.
                Event::Released { .. } => {}
            }
        }
    }
}

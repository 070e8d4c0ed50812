//! The node registry: nodes reached over SSH, registered through the API, verified by the host and
//! shared by the environments allowed to use them.
//!
//! [`NodeRegistry`] keeps one [`SshNode`] (one connection) per usable node, whatever the number of
//! environments using it, and mirrors each node's status and visibility in memory for the
//! per-environment [`EnvironmentNodes`] directory, which plugins' calls resolve node names through
//! synchronously. Verification connects with the pinned host key (or trusts the first one), gathers
//! the facts and records the result: `public`/`private`, or `unreachable` (retried every
//! `reverify_interval`), `auth_failed`, `host_key_changed` (never retried by itself: an operator
//! accepts the new key). Calls on a node in use are watched: a node that stops answering becomes
//! `unreachable` and comes back when a call succeeds; a refusal (`Denied`) re-verifies the node, so
//! a host key that changed under a live node is found and the node blocked.
//!
//! Architecture invariant: a credential is decrypted only here, right before it is handed to
//! `orc-ssh`; it never reaches the API, a log line, an error message or a plugin.

mod guarded;
mod secret;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use orc_node::{BoxFuture, CommandOutput, FileStat, NodeBackend, NodeCommand, NodeDirectory, NodeError, NodeErrorKind, Ownership};
use orc_ssh::{Credential, HostKeyPolicy, SshError, SshNode, SshOptions, SshTarget};

pub use secret::{SECRET_KEY_FILE, SecretError, SecretKey};

use crate::intent::pinning::LOCAL_NODE;
use crate::replicas::Tenure;
use crate::store::{
    EnvironmentId, NewNode, NodeDeletion, NodeObservation, NodePatch, NodePatched, NodeRecord, NodeStatus, Store, StoreError, now_ms,
};

/// Why a request about nodes was refused. Messages are safe for clients and never carry a
/// credential.
#[derive(Debug, thiserror::Error)]
pub enum NodesError {
    #[error("node `{0}` does not exist")]
    Unknown(String),
    #[error("invalid `{field}`: {reason}")]
    Invalid { field: &'static str, reason: String },
    /// The credential cannot be used; the reason never quotes it.
    #[error("invalid `credential`: {0}")]
    InvalidCredential(String),
    #[error("node `{node}` is in use by environment(s) {}: remove its resources from their intents first", .environments.join(", "))]
    InUse { node: String, environments: Vec<String> },
    /// An environment's owner may claim only a public node, and release only its own.
    #[error("node `{node}` is {state}")]
    NotClaimable { node: String, state: String },
    #[error("node `{node}` has no refused host key to accept (status `{status}`)")]
    NoKeyToAccept { node: String, status: NodeStatus },
    #[error("`{given}` is not the host key node `{node}` presented ({presented}); accept exactly the presented key")]
    WrongFingerprint { node: String, given: String, presented: String },
    /// The environment named with the node (claiming or releasing it) cannot be used.
    #[error(transparent)]
    Environment(Box<crate::error::EnvError>),
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A node to register.
#[derive(Debug)]
pub struct Registration {
    pub name: String,
    pub address: String,
    pub port: u32,
    pub user: String,
    pub credential: Credential,
    pub host_key: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// Private to this environment; `None`: public.
    pub environment: Option<EnvironmentId>,
    /// The user who registers it.
    pub author: Option<String>,
}

/// Changes to a node.
#[derive(Debug, Default)]
pub struct Change {
    pub labels: Option<BTreeMap<String, String>>,
    /// `Some(None)`: public; `Some(Some(env))`: private to `env`.
    pub environment: Option<Option<EnvironmentId>>,
    pub credential: Option<Credential>,
    /// The user who makes the change.
    pub author: Option<String>,
}

/// Why an intent may not name a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Unknown,
    NotAllowed,
}

/// The in-memory view of one node, for the synchronous directory.
struct Entry {
    status: NodeStatus,
    environment: Option<EnvironmentId>,
    /// The connection, once the node was reached with its pinned key.
    ssh: Option<Arc<WatchedNode>>,
    /// Why the node cannot be used now, for the errors its resources get.
    last_error: Option<String>,
}

impl Entry {
    /// A node as stored, not connected yet.
    fn of(node: &NodeRecord) -> Entry {
        Entry {
            status: node.status,
            environment: node.environment,
            ssh: None,
            last_error: node.last_error.clone(),
        }
    }
}

struct Inner {
    store: Store,
    key: SecretKey,
    options: SshOptions,
    entries: RwLock<HashMap<String, Entry>>,
    /// One verification of a node at a time.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// When a refusal last made a node be re-verified (at most one every few seconds).
    probes: Mutex<HashMap<String, Instant>>,
    /// Told the name of each node that becomes usable (verified) after it was not.
    back: tokio::sync::broadcast::Sender<String>,
}

/// Every node the host knows. Cheap to clone.
#[derive(Clone)]
pub struct NodeRegistry {
    inner: Arc<Inner>,
}

/// Nodes come back one at a time; a listener slower than this many is told it lagged.
const BACK_CAPACITY: usize = 256;

/// Least time between two re-verifications triggered by refused calls on one node.
const PROBE_EVERY: Duration = Duration::from_secs(2);

impl NodeRegistry {
    /// Loads the nodes, starts verifying them (all but those with a changed host key, which wait
    /// for an operator) and re-verifies unreachable or unidentified ones every `reverify_interval`.
    pub async fn open(store: Store, key: SecretKey, options: SshOptions, reverify_interval: Duration) -> Result<NodeRegistry, StoreError> {
        let mut entries = HashMap::new();
        for node in store.list_nodes().await? {
            entries.insert(node.name.clone(), Entry::of(&node));
        }
        let registry = NodeRegistry {
            inner: Arc::new(Inner {
                store,
                key,
                options,
                entries: RwLock::new(entries),
                locks: Mutex::new(HashMap::new()),
                probes: Mutex::new(HashMap::new()),
                back: tokio::sync::broadcast::channel(BACK_CAPACITY).0,
            }),
        };
        let names: Vec<String> = registry
            .entries()
            .iter()
            .filter(|(_, e)| e.status != NodeStatus::HostKeyChanged)
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            registry.spawn_verify(name);
        }
        let weak = Arc::downgrade(&registry.inner);
        tokio::spawn(reverify_loop(weak, reverify_interval.max(Duration::from_millis(100))));
        Ok(registry)
    }

    fn entries(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Entry>> {
        self.inner.entries.read().expect("node entries")
    }

    pub async fn list(&self) -> Result<Vec<NodeRecord>, NodesError> {
        Ok(self.inner.store.list_nodes().await?)
    }

    pub async fn get(&self, name: &str) -> Result<NodeRecord, NodesError> {
        self.inner
            .store
            .find_node(name)
            .await?
            .ok_or_else(|| NodesError::Unknown(clip(name)))
    }

    /// Stores a new node (`unidentified`) and starts verifying it.
    pub async fn register(&self, new: Registration) -> Result<NodeRecord, NodesError> {
        validate_name(&new.name)?;
        validate_text("address", &new.address, 253)?;
        validate_text("user", &new.user, 64)?;
        let port = u16::try_from(new.port).ok().filter(|p| *p > 0).ok_or_else(|| NodesError::Invalid {
            field: "port",
            reason: format!("{} is not a TCP port (1–65535)", new.port),
        })?;
        validate_labels(&new.labels)?;
        if let Some(fp) = &new.host_key {
            validate_fingerprint("host_key_fingerprint", fp)?;
        }
        new.credential.check().map_err(NodesError::InvalidCredential)?;
        let (kind, sealed) = self.inner.key.seal(&new.name, &new.credential)?;
        let record = self
            .inner
            .store
            .insert_node(
                &NewNode {
                    name: new.name.clone(),
                    address: new.address,
                    port,
                    user: new.user,
                    credential: kind,
                    labels: new.labels,
                    environment: new.environment,
                    host_key: new.host_key,
                    changed_by: new.author,
                },
                &sealed,
            )
            .await?;
        self.inner.entries.write().expect("node entries").insert(
            record.name.clone(),
            Entry {
                status: record.status,
                environment: record.environment,
                ssh: None,
                last_error: None,
            },
        );
        tracing::info!(node = %record.name, address = %record.address, port = record.port, "node registered");
        self.spawn_verify(record.name.clone());
        Ok(record)
    }

    /// Relabels, changes visibility or replaces the credential (then verifies again). Making the
    /// node private is refused (`InUse`) while another environment has resources on it.
    pub async fn change(&self, name: &str, change: Change) -> Result<NodeRecord, NodesError> {
        if let Some(labels) = &change.labels {
            validate_labels(labels)?;
        }
        let credential = match &change.credential {
            Some(c) => {
                c.check().map_err(NodesError::InvalidCredential)?;
                Some(self.inner.key.seal(name, c)?)
            }
            None => None,
        };
        let patch = NodePatch {
            labels: change.labels,
            environment: change.environment,
            credential,
            changed_by: change.author,
        };
        let record = match self.inner.store.patch_node(name, &patch).await {
            Ok(NodePatched::Changed(record)) => *record,
            Ok(NodePatched::InUse { environments }) => {
                return Err(NodesError::InUse {
                    node: name.to_string(),
                    environments,
                });
            }
            Err(StoreError::NotFound { what }) if what.starts_with("node") => return Err(NodesError::Unknown(clip(name))),
            Err(e) => return Err(e.into()),
        };
        {
            let mut entries = self.inner.entries.write().expect("node entries");
            if let Some(e) = entries.get_mut(name) {
                e.status = record.status;
                e.environment = record.environment;
                if patch.credential.is_some() {
                    e.ssh = None;
                }
            }
        }
        if patch.credential.is_some() {
            self.spawn_verify(name.to_string());
        }
        Ok(record)
    }

    /// Deletes the node unless some environment has resources on it.
    pub async fn delete(&self, name: &str) -> Result<(), NodesError> {
        match self.inner.store.delete_node(name).await {
            Ok(NodeDeletion::Deleted) => {}
            Ok(NodeDeletion::InUse { environments }) => {
                return Err(NodesError::InUse {
                    node: name.to_string(),
                    environments,
                });
            }
            Err(StoreError::NotFound { .. }) => return Err(NodesError::Unknown(clip(name))),
            Err(e) => return Err(e.into()),
        }
        let gone = self.inner.entries.write().expect("node entries").remove(name);
        self.inner.locks.lock().expect("node locks").remove(name);
        self.inner.probes.lock().expect("node probes").remove(name);
        if let Some(ssh) = gone.and_then(|e| e.ssh) {
            ssh.ssh.disconnect().await;
        }
        tracing::info!(node = %name, "node deleted");
        Ok(())
    }

    /// Verifies the node now and answers with what was found.
    pub async fn verify(&self, name: &str) -> Result<NodeRecord, NodesError> {
        verify_now(&self.inner, name).await
    }

    /// Pins the host key the node presented instead of the old one (an operator checked it),
    /// then verifies the node with it.
    pub async fn accept_host_key(&self, name: &str, fingerprint: &str) -> Result<NodeRecord, NodesError> {
        let record = self.get(name).await?;
        let presented = match (&record.status, &record.presented_host_key) {
            (NodeStatus::HostKeyChanged, Some(p)) => p.clone(),
            _ => {
                return Err(NodesError::NoKeyToAccept {
                    node: record.name,
                    status: record.status,
                });
            }
        };
        if fingerprint.trim() != presented {
            return Err(NodesError::WrongFingerprint {
                node: record.name,
                given: fingerprint.chars().take(100).collect(),
                presented,
            });
        }
        let previous = record.host_key.unwrap_or_default();
        let record = self.inner.store.accept_node_host_key(name, &presented).await?;
        tracing::warn!(node = %name, previous = %previous, accepted = %presented, "new host key accepted by an operator");
        if let Some(e) = self.inner.entries.write().expect("node entries").get_mut(name) {
            e.status = record.status;
            e.ssh = None;
        }
        self.verify(name).await
    }

    /// Reads the nodes again from the store: what another replica on the database registered,
    /// deleted or made private or public since is seen here too (a new node is verified from
    /// here). A node's own state (its connection, its status as this replica last verified it)
    /// stays.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let stored = self.inner.store.list_nodes().await?;
        let mut added = Vec::new();
        let removed: Vec<Entry> = {
            let mut entries = self.inner.entries.write().expect("node entries");
            let names: std::collections::HashSet<&str> = stored.iter().map(|n| n.name.as_str()).collect();
            let gone: Vec<String> = entries.keys().filter(|n| !names.contains(n.as_str())).cloned().collect();
            let removed = gone.iter().filter_map(|n| entries.remove(n)).collect();
            for node in &stored {
                match entries.get_mut(&node.name) {
                    Some(e) => e.environment = node.environment,
                    None => {
                        entries.insert(node.name.clone(), Entry::of(node));
                        if node.status != NodeStatus::HostKeyChanged {
                            added.push(node.name.clone());
                        }
                    }
                }
            }
            removed
        };
        for entry in removed {
            if let Some(ssh) = entry.ssh {
                ssh.ssh.disconnect().await;
            }
        }
        for name in added {
            self.spawn_verify(name);
        }
        Ok(())
    }

    /// Whether an intent of `env` may name node `name` (verified or not).
    pub fn check(&self, name: &str, env: &EnvironmentId) -> Result<(), Refusal> {
        match self.entries().get(name) {
            None => Err(Refusal::Unknown),
            Some(e) if e.environment.is_some_and(|owner| owner != *env) => Err(Refusal::NotAllowed),
            Some(_) => Ok(()),
        }
    }

    /// The names of nodes as they become usable after they were not (unreachable or not yet
    /// verified, then verified): an environment's scheduler retries what failed on them at
    /// once rather than when its back-off says. A receiver that falls behind is told
    /// `Lagged` and should treat every node as back.
    pub fn back(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.inner.back.subscribe()
    }

    /// The node directory of one environment: `local` is its own local node; any other name is
    /// a registered node, if the environment may use it and it is usable now.
    pub fn directory(&self, env: EnvironmentId, env_name: &str, local: Arc<dyn NodeBackend>, tenure: Arc<Tenure>) -> EnvironmentNodes {
        EnvironmentNodes {
            env,
            env_name: env_name.to_string(),
            local,
            registry: self.clone(),
            reached: Mutex::default(),
            tenure,
        }
    }

    /// Drops what is kept in memory of the private nodes of a deleted environment (the store
    /// deletes their rows with it).
    pub fn forget_environment(&self, env: &EnvironmentId) {
        self.inner
            .entries
            .write()
            .expect("node entries")
            .retain(|_, e| e.environment.as_ref() != Some(env));
    }

    fn spawn_verify(&self, name: String) {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            if let Err(e) = verify_now(&inner, &name).await {
                tracing::warn!(node = %name, error = %orc_manifest::error_chain(&e), "cannot verify node");
            }
        });
    }

    fn resolve(&self, name: &str, env: &EnvironmentId, env_name: &str) -> Result<Arc<dyn NodeBackend>, NodeError> {
        let entries = self.entries();
        let Some(e) = entries.get(name) else {
            return Err(NodeError::new(NodeErrorKind::InvalidInput, format!("unknown node `{name}`")));
        };
        if e.environment.is_some_and(|owner| owner != *env) {
            return Err(NodeError::new(
                NodeErrorKind::Denied,
                format!("node `{name}` is private to another environment and not allowed for environment `{env_name}`"),
            ));
        }
        let why = || e.last_error.clone().unwrap_or_default();
        match (e.status, &e.ssh) {
            (NodeStatus::HostKeyChanged, _) => Err(NodeError::new(
                NodeErrorKind::Denied,
                format!(
                    "node `{name}` is blocked: its host key changed; an operator must accept the new key ({})",
                    why()
                ),
            )),
            (NodeStatus::AuthFailed, _) => Err(NodeError::new(
                NodeErrorKind::Denied,
                format!("node `{name}` refused the host's credential: {}", why()),
            )),
            (_, Some(ssh)) => Ok(ssh.clone()),
            (status, None) => Err(NodeError::new(
                NodeErrorKind::Unavailable,
                format!("node `{name}` cannot be used yet (status `{status}`) {}", why())
                    .trim_end()
                    .to_string(),
            )),
        }
    }
}

/// Re-verifies the nodes that are unidentified or unreachable, until the registry is dropped.
async fn reverify_loop(inner: Weak<Inner>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        // What other replicas on the database changed meanwhile.
        if let Err(e) = (NodeRegistry { inner: inner.clone() }).refresh().await {
            tracing::debug!(error = %orc_manifest::error_chain(&e), "cannot read the nodes again");
        }
        let due: Vec<String> = inner
            .entries
            .read()
            .expect("node entries")
            .iter()
            .filter(|(_, e)| {
                matches!(e.status, NodeStatus::Unidentified | NodeStatus::Unreachable) || (e.status.is_verified() && e.ssh.is_none())
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in due {
            let inner = inner.clone();
            tokio::spawn(async move {
                let lock = inner.lock_for(&name);
                // A verification already running answers for this round.
                let Ok(_turn) = lock.try_lock() else { return };
                if let Err(e) = verify_locked(&inner, &name).await {
                    tracing::debug!(node = %name, error = %orc_manifest::error_chain(&e), "re-verification failed");
                }
            });
        }
    }
}

impl Inner {
    fn lock_for(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.lock().expect("node locks").entry(name.to_string()).or_default().clone()
    }

    /// Records an observation and mirrors it in memory; `ssh` replaces the connection when given
    /// (`Some(None)` drops it).
    async fn record(&self, name: &str, seen: NodeObservation, ssh: Option<Option<Arc<WatchedNode>>>) -> Result<NodeRecord, NodesError> {
        let record = match self.store.observe_node(name, &seen).await {
            Err(StoreError::NotFound { .. }) => return Err(NodesError::Unknown(clip(name))),
            other => other?,
        };
        let mut entries = self.entries.write().expect("node entries");
        if let Some(e) = entries.get_mut(name) {
            if !e.status.is_verified() && record.status.is_verified() {
                // Nobody listening is no error.
                let _ = self.back.send(name.to_string());
            }
            e.status = record.status;
            e.environment = record.environment;
            e.last_error = record.last_error.clone();
            if let Some(ssh) = ssh {
                e.ssh = ssh;
            }
        }
        Ok(record)
    }
}

async fn verify_now(inner: &Arc<Inner>, name: &str) -> Result<NodeRecord, NodesError> {
    let lock = inner.lock_for(name);
    let _turn = lock.lock().await;
    verify_locked(inner, name).await
}

/// Connects (pinned key, or trust on first use), gathers the facts and records the outcome.
/// The caller holds the node's verification lock.
async fn verify_locked(inner: &Arc<Inner>, name: &str) -> Result<NodeRecord, NodesError> {
    let record = match inner.store.find_node(name).await? {
        Some(r) => r,
        None => return Err(NodesError::Unknown(clip(name))),
    };
    let credential = match inner
        .store
        .node_credential(name)
        .await
        .map_err(NodesError::from)
        .and_then(|sealed| inner.key.open(name, &sealed).map_err(NodesError::from))
    {
        Ok(c) => c,
        Err(NodesError::Secret(e)) => {
            tracing::error!(node = %name, error = %e, "cannot open the node's credential");
            let seen = failure(NodeStatus::AuthFailed, None, e.to_string());
            return inner.record(name, seen, Some(None)).await;
        }
        Err(e) => return Err(e),
    };
    let target = SshTarget {
        address: record.address.clone(),
        port: record.port,
        user: record.user.clone(),
        credential,
        host_key: match &record.host_key {
            Some(fp) => HostKeyPolicy::Pinned(fp.clone()),
            None => HostKeyPolicy::TrustOnFirstUse,
        },
    };
    match SshNode::connect(target, inner.options.clone()).await {
        Ok((ssh, verified)) => {
            let (facts, last_error) = match ssh.gather_facts().await {
                Ok(f) => (Some(serde_json::to_value(&f).expect("facts serialise")), None),
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "cannot gather the node's facts");
                    (None, Some(format!("cannot gather facts: {e}")))
                }
            };
            if record.host_key.is_none() {
                tracing::info!(node = %name, fingerprint = %verified.fingerprint, "host key pinned on first verification");
            }
            let watched = Arc::new(WatchedNode {
                name: name.to_string(),
                ssh,
                registry: Arc::downgrade(inner),
            });
            let seen = NodeObservation {
                status: NodeStatus::Public,
                host_key: Some(verified.fingerprint),
                presented_host_key: None,
                facts,
                last_error,
                verified_at: Some(now_ms()),
            };
            let old = inner.entries.read().expect("node entries").get(name).and_then(|e| e.ssh.clone());
            let record = inner.record(name, seen, Some(Some(watched))).await?;
            if let Some(old) = old {
                old.ssh.disconnect().await;
            }
            tracing::info!(node = %name, status = %record.status, "node verified");
            Ok(record)
        }
        Err(e) => {
            let (status, presented) = match &e {
                SshError::HostKeyChanged { expected, presented, .. } => {
                    tracing::error!(
                        node = %name,
                        expected = %expected,
                        presented = %presented,
                        "HOST KEY CHANGED: node {name} presented {presented} instead of the pinned {expected}; the node is blocked \
                         until an operator accepts the new key (POST /api/v1/nodes/{name}/accept-host-key)"
                    );
                    (NodeStatus::HostKeyChanged, Some(presented.clone()))
                }
                SshError::Auth { .. } | SshError::Key { .. } => {
                    tracing::error!(node = %name, error = %e, "node refused the credential");
                    (NodeStatus::AuthFailed, None)
                }
                _ => {
                    tracing::warn!(node = %name, error = %e, "node unreachable");
                    (NodeStatus::Unreachable, None)
                }
            };
            // An unreachable node keeps its connection object: it reconnects on the next call.
            let ssh = (status != NodeStatus::Unreachable).then_some(None);
            inner.record(name, failure(status, presented, e.to_string()), ssh).await
        }
    }
}

fn failure(status: NodeStatus, presented: Option<String>, message: String) -> NodeObservation {
    NodeObservation {
        status,
        host_key: None,
        presented_host_key: presented,
        facts: None,
        last_error: Some(message),
        verified_at: None,
    }
}

/// What an environment's plugins reach nodes through.
pub struct EnvironmentNodes {
    env: EnvironmentId,
    env_name: String,
    local: Arc<dyn NodeBackend>,
    registry: NodeRegistry,
    /// Every SSH node handed out, by name, for the durability fence. Kept, not drained by a
    /// fence: a call may resolve its node before a fence and write after it.
    reached: Mutex<Reached>,
    /// This replica's hold on the environment: every change to a node asks it first
    /// ([`guarded`]).
    tenure: Arc<Tenure>,
}

#[derive(Default)]
struct Reached {
    current: HashMap<String, Arc<dyn NodeBackend>>,
    /// Connections replaced in the registry (a node verified again) since the last fence, whose
    /// changes may still be unsynced: fenced once more, then forgotten.
    retired: Vec<Arc<dyn NodeBackend>>,
}

impl NodeDirectory for EnvironmentNodes {
    fn node(&self, name: &str) -> Result<Arc<dyn NodeBackend>, NodeError> {
        let guarded = |node| -> Arc<dyn NodeBackend> {
            Arc::new(guarded::Guarded {
                node,
                tenure: self.tenure.clone(),
            })
        };
        if name == LOCAL_NODE {
            return Ok(guarded(self.local.clone()));
        }
        let node = self.registry.resolve(name, &self.env, &self.env_name)?;
        let mut reached = self.reached.lock().expect("reached nodes");
        match reached.current.get(name) {
            Some(known) if Arc::ptr_eq(known, &node) => {}
            _ => {
                if let Some(old) = reached.current.insert(name.to_string(), node.clone()) {
                    reached.retired.push(old);
                }
            }
        }
        Ok(guarded(node))
    }

    /// The local node's fence and that of every SSH node reached, at once (a node with nothing
    /// unsynced answers at once). An SSH node that cannot be reached now is not waited for: its
    /// writes were accepted by the node's kernel, its changes stay marked for the next fence,
    /// and one node away must not stop the environment's states from being stored. Any other
    /// failure is the fence's.
    fn durable(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        let nodes: Vec<(bool, Arc<dyn NodeBackend>)> = {
            let mut reached = self.reached.lock().expect("reached nodes");
            let retired = std::mem::take(&mut reached.retired);
            reached
                .current
                .values()
                .map(|n| (false, n.clone()))
                .chain(retired.into_iter().map(|n| (true, n)))
                .collect()
        };
        Box::pin(async move {
            let remote = futures::future::join_all(nodes.into_iter().map(|(retired, node)| async move {
                let fenced = node.durable().await;
                (retired, node, fenced)
            }));
            let (local, remote) = tokio::join!(self.local.durable(), remote);
            let mut failed = local.err();
            for (retired, node, fenced) in remote {
                let Err(e) = fenced else { continue };
                if retired {
                    self.reached.lock().expect("reached nodes").retired.push(node);
                }
                if e.kind == NodeErrorKind::Unavailable {
                    tracing::warn!(environment = %self.env_name, error = %e, "cannot sync a node's files now; tried again at the next fence");
                } else if failed.is_none() {
                    failed = Some(e);
                }
            }
            failed.map_or(Ok(()), Err)
        })
    }
}

/// A node's SSH connection, watched: what its calls meet changes the node's status.
struct WatchedNode {
    name: String,
    ssh: SshNode,
    registry: Weak<Inner>,
}

impl WatchedNode {
    /// Runs a call on the connection and lets its outcome change the node's status.
    async fn watch<T>(&self, call: impl Future<Output = Result<T, NodeError>>) -> Result<T, NodeError> {
        let before = self.ssh.answers();
        let result = call.await;
        self.observe(&result, self.ssh.answers() != before);
        result
    }

    /// An unreachable node is back only when it answered: a call that succeeds without asking
    /// it (a fence with nothing to sync) says nothing about it.
    fn observe<T>(&self, result: &Result<T, NodeError>, answered: bool) {
        let Some(inner) = self.registry.upgrade() else { return };
        let status = match inner.entries.read().expect("node entries").get(&self.name) {
            Some(e) => e.status,
            None => return,
        };
        match result {
            Ok(_) if answered && status == NodeStatus::Unreachable => {
                let name = self.name.clone();
                tokio::spawn(async move {
                    let lock = inner.lock_for(&name);
                    let _turn = lock.lock().await;
                    if inner.entries.read().expect("node entries").get(&name).map(|e| e.status) != Some(NodeStatus::Unreachable) {
                        return;
                    }
                    tracing::info!(node = %name, "node answers again");
                    let seen = NodeObservation {
                        status: NodeStatus::Public,
                        host_key: None,
                        presented_host_key: None,
                        facts: None,
                        last_error: None,
                        verified_at: Some(now_ms()),
                    };
                    if let Err(e) = inner.record(&name, seen, None).await {
                        tracing::warn!(node = %name, error = %e, "cannot record the node's status");
                    }
                });
            }
            Err(e) if e.kind == NodeErrorKind::Unavailable && status.is_verified() => {
                let (name, message) = (self.name.clone(), e.message.clone());
                tokio::spawn(async move {
                    let lock = inner.lock_for(&name);
                    let _turn = lock.lock().await;
                    if !inner
                        .entries
                        .read()
                        .expect("node entries")
                        .get(&name)
                        .is_some_and(|e| e.status.is_verified())
                    {
                        return;
                    }
                    tracing::warn!(node = %name, error = %message, "node unreachable");
                    if let Err(e) = inner.record(&name, failure(NodeStatus::Unreachable, None, message), None).await {
                        tracing::warn!(node = %name, error = %e, "cannot record the node's status");
                    }
                });
            }
            // A refusal may be a file's permissions, or the node's key or login: find out.
            Err(e) if e.kind == NodeErrorKind::Denied => {
                {
                    let mut probes = inner.probes.lock().expect("node probes");
                    let now = Instant::now();
                    if probes.get(&self.name).is_some_and(|at| now.duration_since(*at) < PROBE_EVERY) {
                        return;
                    }
                    probes.insert(self.name.clone(), now);
                }
                let name = self.name.clone();
                tokio::spawn(async move {
                    if let Err(e) = verify_now(&inner, &name).await {
                        tracing::warn!(node = %name, error = %orc_manifest::error_chain(&e), "cannot re-verify node");
                    }
                });
            }
            _ => {}
        }
    }
}

impl NodeBackend for WatchedNode {
    fn run(&self, command: NodeCommand) -> BoxFuture<'_, Result<CommandOutput, NodeError>> {
        Box::pin(self.watch(self.ssh.run(command)))
    }

    fn read_file<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, NodeError>> {
        Box::pin(self.watch(self.ssh.read_file(path)))
    }

    fn write_file<'a>(&'a self, path: &'a str, content: Vec<u8>, mode: Option<u32>) -> BoxFuture<'a, Result<(), NodeError>> {
        Box::pin(self.watch(self.ssh.write_file(path, content, mode)))
    }

    fn stat<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<FileStat>, NodeError>> {
        Box::pin(self.watch(self.ssh.stat(path)))
    }

    fn create_dir<'a>(&'a self, path: &'a str, mode: Option<u32>, parents: bool) -> BoxFuture<'a, Result<(), NodeError>> {
        Box::pin(self.watch(self.ssh.create_dir(path, mode, parents)))
    }

    fn set_mode<'a>(&'a self, path: &'a str, mode: u32) -> BoxFuture<'a, Result<(), NodeError>> {
        Box::pin(self.watch(self.ssh.set_mode(path, mode)))
    }

    fn remove<'a>(&'a self, path: &'a str, recursive: bool) -> BoxFuture<'a, Result<bool, NodeError>> {
        Box::pin(self.watch(self.ssh.remove(path, recursive)))
    }

    fn read_link<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<String>, NodeError>> {
        Box::pin(self.watch(self.ssh.read_link(path)))
    }

    fn create_symlink<'a>(&'a self, target: &'a str, path: &'a str) -> BoxFuture<'a, Result<(), NodeError>> {
        Box::pin(self.watch(self.ssh.create_symlink(target, path)))
    }

    fn owner<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<Ownership>, NodeError>> {
        Box::pin(self.watch(self.ssh.owner(path)))
    }

    fn set_owner<'a>(&'a self, path: &'a str, user: Option<&'a str>, group: Option<&'a str>) -> BoxFuture<'a, Result<(), NodeError>> {
        Box::pin(self.watch(self.ssh.set_owner(path, user, group)))
    }

    fn durable(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        Box::pin(self.watch(self.ssh.durable()))
    }
}

fn clip(s: &str) -> String {
    s.chars().take(100).collect()
}

/// Node names ([`orc_manifest::names::NODE`]); `local` is every environment's own local node.
fn validate_name(name: &str) -> Result<(), NodesError> {
    let invalid = |reason: String| NodesError::Invalid {
        field: "name",
        reason: format!("`{}`: {reason}", clip(name)),
    };
    orc_manifest::names::NODE.check(name).map_err(|e| invalid(e.0))?;
    if name == LOCAL_NODE {
        return Err(invalid("`local` is each environment's own local node".into()));
    }
    Ok(())
}

fn validate_text(field: &'static str, value: &str, max: usize) -> Result<(), NodesError> {
    if value.is_empty() || value.len() > max || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(NodesError::Invalid {
            field,
            reason: format!("expected 1 to {max} characters without spaces"),
        });
    }
    Ok(())
}

fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), NodesError> {
    for (k, v) in labels {
        if k.is_empty() || k.len() > 63 || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b)) {
            return Err(NodesError::Invalid {
                field: "labels",
                reason: format!("label name `{}`: 1 to 63 of letters, digits, `-`, `_`, `.` and `/`", clip(k)),
            });
        }
        if v.len() > 255 || v.chars().any(char::is_control) {
            return Err(NodesError::Invalid {
                field: "labels",
                reason: format!("the value of label `{k}`: at most 255 characters, no control characters"),
            });
        }
    }
    Ok(())
}

/// `SHA256:` and the unpadded base64 of 32 bytes, as `ssh-keygen -lf` prints it.
fn validate_fingerprint(field: &'static str, fp: &str) -> Result<(), NodesError> {
    let ok = fp
        .strip_prefix("SHA256:")
        .is_some_and(|b64| b64.len() == 43 && b64.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/'));
    if ok {
        Ok(())
    } else {
        Err(NodesError::Invalid {
            field,
            reason: format!(
                "`{}` is not a SHA256 host key fingerprint (`SHA256:` and 43 base64 characters)",
                clip(fp)
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_labels_and_fingerprints_are_checked() {
        assert!(validate_name("web-1.dc2").is_ok());
        for bad in ["", "local", "Web", "-x", "a b", &"x".repeat(64)] {
            assert!(
                matches!(validate_name(bad), Err(NodesError::Invalid { field: "name", .. })),
                "{bad:?}"
            );
        }
        assert!(validate_fingerprint("f", "SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s").is_ok());
        assert!(validate_fingerprint("f", "MD5:aa").is_err());
        let mut labels = BTreeMap::from([("role".to_string(), "web".to_string())]);
        assert!(validate_labels(&labels).is_ok());
        labels.insert("bad key".into(), "x".into());
        assert!(validate_labels(&labels).is_err());
    }
}

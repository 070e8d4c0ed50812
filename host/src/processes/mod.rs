//! Services (dEF-Pi's orchestrator): the catalog of service versions the registry holds, and the
//! processes that run them.
//!
//! The **catalog** is the registry's (`orc_registry::services`): a service version is a
//! content-addressed document, validated and filed once; the host only reads it
//! ([`crate::app::App::services`]), verified on every read.
//!
//! A **process** is one instance of a service version on one node, with a configuration of its
//! own (validated against the service's schema; its ports set under each port's `config_key`).
//! It compiles to the five steps of an automator task (`bootstrap → install → configure →
//! initialize → start`, the cluster planner's) in its own **resource set** `process.<name>`
//! (no cluster can be named so: cluster names have no `.`), released as a new intent version
//! like a cluster's tasks, so the scheduler runs it through the service's automator with
//! retries, self-healing, dryrun and the action log. The automator sees the set as the task's
//! `cluster`, so its instance names never meet a cluster's.
//!
//! The lifecycle, each state persisted ([`ProcessState`]) and each operation checked against it
//! ([`ProcessState::allows`]):
//!
//! ```text
//!   create ─▶ creating ──done──▶ running ◀──done── updating ◀── update (running, failed)
//!                │                 ▲  ▲                │
//!             failed   done (failure  └──done── moving ◀── move (running)
//!                │           kept)  │             │ failed
//!                ▼                  │             ▼
//!          rolling_back ────────────┘ (something ran; else ──▶ failed)
//!   terminate (any but terminating) ─▶ terminating ──done──▶ gone
//! ```
//!
//! Inmanta's candidate/active sets: `target` is what the process is driven to; `active` what last
//! ran. A failed update or move puts `target` back to `active` (and its tasks), keeping the
//! failure. A move plans the new node's tasks and purges the old node's, the old `stop` waiting
//! for the new `start`; peers are told the new address once the move is done (they are always
//! given a peer's `active` node).
//!
//! Here: the processes' vocabulary (states, operations, deployments, the stored document, the
//! errors); [`requests`] (what an operator sends), [`config`] (a configuration against its
//! service's schema, and its secrets), [`plan`] (a process's tasks), [`stored`] (its row read and
//! checked), [`view`] (what the API shows) and [`connections`] (connections as the API sees
//! them). The operations, which read the store and the catalog, place processes and release
//! their tasks, and the watchers are the application's (`app::processes`).

pub mod config;
pub mod connections;
pub mod plan;
pub mod requests;
pub mod stored;
pub mod view;

use std::collections::BTreeMap;

use orc_manifest::Digest;
use orc_registry::RegistryError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clusters::{ClusterError, ClusterFailure};
use crate::error::EnvError;
use crate::intent::ResourceSpec;
use crate::store::Millis;

/// The prefix of a process's resource set (and of its tasks' keys).
pub const SET_PREFIX: &str = "process.";

/// The resource set of process `name`.
pub fn set_of(name: &str) -> String {
    format!("{SET_PREFIX}{name}")
}

/// Whether `r` is a task of some process.
pub(crate) fn is_process_task(r: &ResourceSpec) -> bool {
    r.id.resource_type == crate::clusters::planner::TASK_TYPE && r.id.key.starts_with(SET_PREFIX)
}

/// A process's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    Creating,
    Running,
    Updating,
    /// Started on its new node; stopped and removed on the old one once it runs there.
    Moving,
    /// A failed create, update or move is being undone.
    RollingBack,
    Terminating,
    /// Its create failed and was undone; `failure` says why.
    Failed,
}

/// What an operator asks of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Update,
    Move,
    Terminate,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Update => "update",
            Operation::Move => "move",
            Operation::Terminate => "terminate",
        }
    }
}

impl ProcessState {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessState::Creating => "creating",
            ProcessState::Running => "running",
            ProcessState::Updating => "updating",
            ProcessState::Moving => "moving",
            ProcessState::RollingBack => "rolling_back",
            ProcessState::Terminating => "terminating",
            ProcessState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<ProcessState> {
        [
            ProcessState::Creating,
            ProcessState::Running,
            ProcessState::Updating,
            ProcessState::Moving,
            ProcessState::RollingBack,
            ProcessState::Terminating,
            ProcessState::Failed,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
    }

    /// Whether `operation` may start in this state.
    pub fn allows(self, operation: Operation) -> bool {
        match operation {
            Operation::Update => matches!(self, ProcessState::Running | ProcessState::Failed),
            Operation::Move => self == ProcessState::Running,
            Operation::Terminate => self != ProcessState::Terminating,
        }
    }
}

/// One configuration of a process: the service version, where, and with what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    pub service: String,
    pub version: String,
    /// The service document's digest.
    pub digest: Digest,
    pub automator: Digest,
    pub node: String,
    /// The operator's configuration (valid against the service's schema).
    pub config: Value,
    /// Port name → number.
    pub ports: BTreeMap<String, u16>,
    /// Port name → the configuration key the automator takes it under.
    #[serde(default)]
    pub port_keys: BTreeMap<String, String>,
    /// The service's base configuration, under the operator's.
    #[serde(default)]
    pub base_config: Value,
    /// Where the automator takes the process's connections, if it does.
    #[serde(default)]
    pub connections_key: Option<String>,
    /// JSON pointers into `config` of the values the service's schema marks secret: its tasks
    /// name them sensitive, so no view of the host shows them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

impl Deployment {
    /// Whether its peers reach it where they reach `other`: the same node and ports.
    pub fn reached_as(&self, other: &Deployment) -> bool {
        self.node == other.node && self.ports == other.ports
    }

    /// `service@version`.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.service, self.version)
    }

    /// What the automator is handed at every step: the service's base configuration with the
    /// operator's merged over it and each port under its key. Not the connections, which only
    /// the steps that see the layout get ([`Deployment::late_config`]), so that a connection made
    /// or dropped re-runs a peer's `configure` and `start`, not its `bootstrap` and `install`.
    pub fn effective_config(&self) -> Value {
        let mut config = match &self.base_config {
            Value::Object(_) => self.base_config.clone(),
            _ => Value::Object(Default::default()),
        };
        crate::json::merge_patch(&mut config, self.config.clone());
        if let Value::Object(map) = &mut config {
            for (port, key) in &self.port_keys {
                if let Some(number) = self.ports.get(port) {
                    map.insert(key.clone(), Value::from(*number));
                }
            }
            if let Some(key) = &self.connections_key {
                map.remove(key);
            }
        }
        config
    }

    /// What the steps that see the layout (`configure`, `start`) get besides: when the service
    /// takes them, the process's `connections` (interface → peers) under its `connections_key`.
    pub fn late_config(&self, connections: &Value) -> serde_json::Map<String, Value> {
        self.connections_key.iter().map(|key| (key.clone(), connections.clone())).collect()
    }
}

/// What the host keeps of a process (the store's `document`, which it does not interpret).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ProcessDoc {
    /// What the process is driven to.
    pub target: Deployment,
    /// What last ran; `None` before the process first ran.
    pub active: Option<Deployment>,
    /// The set's tasks in the plan released last.
    pub tasks: Vec<ResourceSpec>,
    /// Counts operations; a watcher acts only for its own.
    pub generation: u64,
    pub max_attempts: u32,
    pub failure: Option<ClusterFailure>,
    /// Who started the current operation; `None`: the host itself.
    pub author: Option<String>,
    pub started_at: Millis,
    /// When the tasks last changed (an operation, or a connection made or dropped).
    #[serde(default)]
    pub changed_at: Millis,
    /// Since when each task (by id) has been as it is, for the tasks older than `changed_at`
    /// (the others are as of `changed_at`): what is not deployed yet has been pending since.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub task_since: BTreeMap<String, Millis>,
}

impl ProcessDoc {
    /// Since when task `id` has been as it is.
    pub fn since(&self, id: &str) -> Millis {
        self.task_since.get(id).copied().unwrap_or(self.changed_at)
    }

    /// Dates its tasks against `previous`, the row it replaces: a task the same as there (id,
    /// adaptor, attributes, purged) keeps its time, any other is as of `now`, and `changed_at`
    /// becomes `now` when there is one.
    pub fn stamp_since(&mut self, previous: &ProcessDoc, now: Millis) {
        let mut since = BTreeMap::new();
        let mut changed = false;
        for t in &self.tasks {
            let id = t.id.to_string();
            let same = previous
                .tasks
                .iter()
                .find(|p| p.id == t.id)
                .is_some_and(|p| p.adaptor == t.adaptor && p.attributes == t.attributes && p.purged == t.purged);
            if same {
                let kept = previous.since(&id);
                since.insert(id, kept);
            } else {
                changed = true;
                since.insert(id, now);
            }
        }
        if changed {
            self.changed_at = now;
        }
        let changed_at = self.changed_at;
        self.task_since = since.into_iter().filter(|(_, at)| *at != changed_at).collect();
    }
}

/// Why a process request is refused.
#[derive(Debug, thiserror::Error)]
pub enum ServicesError {
    #[error("service `{0}` is not in the catalog (see /api/v1/services)")]
    UnknownService(String),
    #[error("the service catalog cannot be read: {0}")]
    Registry(#[source] RegistryError),
    #[error("process `{0}` does not exist")]
    UnknownProcess(String),
    #[error("a process named `{0}` already exists")]
    ProcessExists(String),
    #[error("process `{name}` is {state}: it cannot {operation} now")]
    InvalidTransition {
        name: String,
        state: &'static str,
        operation: &'static str,
    },
    /// `what`: "process `cache`", "connection `…`".
    #[error("{what} is at revision {current}, not {expected} (If-Match): read it again")]
    VersionConflict { what: String, expected: String, current: i64 },
    #[error("config{path}: {message}")]
    InvalidConfig { path: String, message: String },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("node `{node}`: {message}")]
    NodeUnsuitable { node: String, message: String },
    #[error("port {port} on node `{node}` is taken by process `{process}`")]
    PortInUse { node: String, port: u16, process: String },
    #[error("{0}")]
    UnknownPeer(String),
    #[error("{0}")]
    UnknownInterface(String),
    #[error("{0}")]
    IncompatibleInterfaces(String),
    #[error("{0}")]
    CardinalityExceeded(String),
    #[error("connection `{0}` does not exist")]
    UnknownConnection(String),
    #[error("{0}")]
    ConnectionExists(String),
    #[error(transparent)]
    Cluster(ClusterError),
}

impl From<RegistryError> for ServicesError {
    fn from(e: RegistryError) -> ServicesError {
        ServicesError::Registry(e)
    }
}

impl From<ClusterError> for ServicesError {
    fn from(e: ClusterError) -> ServicesError {
        ServicesError::Cluster(e)
    }
}

impl From<EnvError> for ServicesError {
    fn from(e: EnvError) -> ServicesError {
        ServicesError::Cluster(ClusterError::Env(e))
    }
}

impl From<crate::store::StoreError> for ServicesError {
    fn from(e: crate::store::StoreError) -> ServicesError {
        ServicesError::Cluster(e.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_allows_only_its_operations() {
        use ProcessState::*;
        for (state, update, moves, terminate) in [
            (Creating, false, false, true),
            (Running, true, true, true),
            (Updating, false, false, true),
            (Moving, false, false, true),
            (RollingBack, false, false, true),
            (Terminating, false, false, false),
            (Failed, true, false, true),
        ] {
            assert_eq!(state.allows(Operation::Update), update, "{state:?}");
            assert_eq!(state.allows(Operation::Move), moves, "{state:?}");
            assert_eq!(state.allows(Operation::Terminate), terminate, "{state:?}");
            assert_eq!(ProcessState::parse(state.as_str()), Some(state));
        }
    }

    #[test]
    fn each_task_is_pending_since_it_became_what_it_is() {
        let tasks = |configure: &str, start: &str| -> Vec<ResourceSpec> {
            let intent = crate::intent::Intent::parse(
                serde_json::json!({"resources": [
                    {"id": "task[n1,process.a/s/configure]", "adaptor": "file@0.1.0", "attributes": {"v": configure}},
                    {"id": "task[n1,process.a/s/start]", "adaptor": "file@0.1.0", "attributes": {"v": start}},
                ]})
                .to_string()
                .as_bytes(),
            )
            .unwrap();
            intent.resources
        };
        let deployment: Deployment = serde_json::from_value(serde_json::json!({
            "service": "s", "version": "1.0.0", "digest": Digest::of(b"d").to_string(),
            "automator": Digest::of(b"a").to_string(), "node": "n1", "config": {}, "ports": {}
        }))
        .unwrap();
        let first = ProcessDoc {
            target: deployment,
            active: None,
            tasks: tasks("c1", "s1"),
            generation: 1,
            max_attempts: 3,
            failure: None,
            author: None,
            started_at: 100,
            changed_at: 100,
            task_since: BTreeMap::new(),
        };
        // At 200 only `start` changes: `configure` keeps 100.
        let mut second = ProcessDoc {
            tasks: tasks("c1", "s2"),
            ..first.clone()
        };
        second.stamp_since(&first, 200);
        let (c, s) = ("task[n1,process.a/s/configure]", "task[n1,process.a/s/start]");
        assert_eq!((second.since(c), second.since(s), second.changed_at), (100, 200, 200));
        assert_eq!(second.task_since.len(), 1, "only the older time is kept");
        // At 300 nothing changes: both keep theirs, and so does `changed_at`.
        let mut third = second.clone();
        third.stamp_since(&second, 300);
        assert_eq!((third.since(c), third.since(s), third.changed_at), (100, 200, 200));
        // Encoded and decoded, the times stay.
        let back: ProcessDoc = serde_json::from_str(&serde_json::to_string(&third).unwrap()).unwrap();
        assert_eq!((back.since(c), back.since(s)), (100, 200));
        // At 400 `configure` changes too.
        let mut fourth = ProcessDoc {
            tasks: tasks("c2", "s2"),
            ..third.clone()
        };
        fourth.stamp_since(&third, 400);
        assert_eq!((fourth.since(c), fourth.since(s), fourth.changed_at), (400, 200, 400));
    }

    #[test]
    fn ports_reach_the_automator_under_their_keys() {
        let d = Deployment {
            service: "redis".into(),
            version: "1.0.0".into(),
            digest: Digest::of(b"doc"),
            automator: Digest::of(b"automator"),
            node: "n1".into(),
            config: serde_json::json!({"maxmemory": "10mb"}),
            ports: [("kv".to_string(), 6380)].into(),
            port_keys: [("kv".to_string(), "port".to_string())].into(),
            base_config: serde_json::json!({"maxmemory": "1mb", "bind": "127.0.0.1"}),
            connections_key: None,
            secrets: Vec::new(),
        };
        assert_eq!(
            d.effective_config(),
            serde_json::json!({"maxmemory": "10mb", "bind": "127.0.0.1", "port": 6380})
        );
        let peers = serde_json::json!({"kv": [{"peer": "cache"}]});
        let with = Deployment {
            connections_key: Some("connections".into()),
            config: serde_json::json!({"maxmemory": "10mb", "connections": "the operator's"}),
            ..d.clone()
        };
        assert_eq!(with.late_config(&peers)["connections"], peers);
        assert!(
            with.effective_config().get("connections").is_none(),
            "the key is the connections', seen where they are"
        );
        assert!(d.late_config(&peers).is_empty(), "a service without the key is not told");
        assert_eq!(d.reference(), "redis@1.0.0");
    }
}

//! Clusters (Coopr): templates, the solver call, the planner, and cluster operations driven
//! through the environment's scheduler.
//!
//! A **template** (`orc_cluster::Template`) is validated and stored with its solver and
//! automators pinned to digests; each submission under a name is a new version. **Creating** a
//! cluster restricts the template to the cluster's services, asks the template's solver plugin
//! for a layout over the nodes the environment may use (checked with
//! `orc_cluster::check_layout`: a solver is a plugin, possibly an operator's own), turns it into
//! tasks ([`planner`]) and releases a new intent version whose resources are the environment's
//! other resources plus this cluster's tasks. The scheduler deploys the tasks through the
//! services' automators (the executor calls `check`, then `perform`), so retry, self-healing,
//! dryrun and the action log work for clusters as for any resource.
//!
//! **Resource sets.** Each cluster's tasks (`task[node,cluster/service/step]`) are its own set:
//! an operator's intent (submit, rollback, release of an older version) keeps every cluster's
//! current tasks, and a cluster operation replaces only its own. The clusters' rows are the
//! source of their current tasks.
//!
//! A **watcher** per cluster follows the environment's events and moves the cluster on: all its
//! tasks deployed → the operation is done (removed tasks are then dropped from the plan); a
//! task failed `max_attempts` times during a create → the create is rolled back (every task
//! purged: stop and remove in reverse order, then dropped) and the cluster is `failed` with the
//! task and its error; during another operation → `failed`, still watched (a later retry that
//! succeeds makes it `active` again). Watchers are restarted with the environment.
//!
//! Here: the clusters' vocabulary (statuses, operations, the stored document, the errors);
//! [`requests`] (what an operator sends), [`view`] (what the API shows, and how far a plan is),
//! [`plan`] (a cluster's tasks from its document, through the [`planner`]) and [`stored`] (its
//! row decoded and checked). The operations, which read the store, call the solver and release
//! versions, and the watchers are the application's (`app::clusters`).

pub mod plan;
pub mod planner;
pub mod requests;
pub mod stored;
pub mod view;

use std::collections::{BTreeMap, BTreeSet};

use orc_cluster::{Layout, TemplateError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::EnvError;
use crate::intent::ResourceSpec;
use crate::store::Millis;

/// A cluster's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClusterStatus {
    Creating,
    Active,
    Amending,
    Reconfiguring,
    Stopping,
    Starting,
    Restarting,
    /// A failed create is being undone.
    RollingBack,
    Deleting,
    /// The last operation failed (a create: after its rollback). `error` says why.
    Failed,
}

impl ClusterStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterStatus::Creating => "creating",
            ClusterStatus::Active => "active",
            ClusterStatus::Amending => "amending",
            ClusterStatus::Reconfiguring => "reconfiguring",
            ClusterStatus::Stopping => "stopping",
            ClusterStatus::Starting => "starting",
            ClusterStatus::Restarting => "restarting",
            ClusterStatus::RollingBack => "rolling_back",
            ClusterStatus::Deleting => "deleting",
            ClusterStatus::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<ClusterStatus> {
        serde_json::from_value(Value::String(s.to_string())).ok()
    }

    /// An operation is under way: another one (but delete) must wait.
    pub fn busy(self) -> bool {
        !matches!(self, ClusterStatus::Active | ClusterStatus::Failed)
    }
}

/// Which operation a cluster is in (or last ran).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OperationKind {
    Create,
    Amend,
    Reconfigure,
    Stop,
    Start,
    Restart,
    Rollback,
    Delete,
}

/// The status a cluster has while `kind` runs.
pub(crate) fn busy_status(kind: OperationKind) -> ClusterStatus {
    match kind {
        OperationKind::Create => ClusterStatus::Creating,
        OperationKind::Amend => ClusterStatus::Amending,
        OperationKind::Reconfigure => ClusterStatus::Reconfiguring,
        OperationKind::Stop => ClusterStatus::Stopping,
        OperationKind::Start => ClusterStatus::Starting,
        OperationKind::Restart => ClusterStatus::Restarting,
        OperationKind::Rollback => ClusterStatus::RollingBack,
        OperationKind::Delete => ClusterStatus::Deleting,
    }
}

/// Why a cluster failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClusterFailure {
    /// The task that failed (`task[node,cluster/service/step]`).
    pub task: Option<String>,
    pub code: String,
    pub message: String,
}

/// What the host keeps of a cluster (the store's `document`, which it does not interpret).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ClusterDoc {
    pub services: Vec<String>,
    pub size: u32,
    /// Overrides of the template's service configuration, per service (merged in as a JSON
    /// merge patch).
    pub config: BTreeMap<String, Value>,
    /// The nodes the cluster may use; every node the environment may use when empty.
    pub nodes: Vec<String>,
    pub layout: Layout,
    pub stopped: BTreeSet<String>,
    /// The cluster's tasks in the plan released last.
    pub tasks: Vec<ResourceSpec>,
    pub operation: OperationKind,
    /// Counts operations; a watcher follows one operation and leaves when it is replaced.
    pub generation: u64,
    /// For `restart`: the service, and whether its stop is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<(String, bool)>,
    /// A task failing this many times fails the operation (a create is rolled back).
    pub max_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<ClusterFailure>,
    /// When the current operation started.
    pub started_at: Millis,
    /// The user who started it; `None`: the host itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
}

/// Why a cluster request was refused.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("template: {0}")]
    Template(#[from] TemplateError),
    #[error("template `{0}` does not exist")]
    UnknownTemplate(String),
    #[error("cluster `{0}` does not exist")]
    UnknownCluster(String),
    #[error("a cluster named `{0}` already exists")]
    Exists(String),
    #[error("cluster `{name}` is {status}: wait for it to finish (or delete it)")]
    Busy { name: String, status: &'static str },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("template `{template}`: {reference} names no plugin of the registry")]
    UnknownPlugin { template: String, reference: String },
    #[error("template `{template}`: plugin `{reference}` refused: {message}")]
    PluginRejected {
        template: String,
        reference: String,
        message: String,
    },
    #[error(
        "template `{template}`: plugin `{plugin}` ({digest}) requests capability `{capability}`, which this environment does not grant: set `{setting}` to true to allow it",
        setting = crate::policy::settings::CapabilitySettings::setting(*capability)
    )]
    CapabilityNotGranted {
        template: String,
        plugin: String,
        digest: orc_manifest::Digest,
        capability: orc_manifest::Capability,
    },
    /// The store's message names the template and the cluster that uses it.
    #[error("{0}")]
    TemplateInUse(String),
    #[error("no valid layout: {constraint}: {message}")]
    NoValidLayout { constraint: String, message: String },
    #[error("solver `{solver}` failed: {message}")]
    SolverFailed { solver: String, message: String },
    #[error("solver `{solver}` returned an invalid layout: {violation}")]
    InvalidLayout { solver: String, violation: orc_cluster::Violation },
    #[error("service `{0}` is not one of the cluster's services")]
    UnknownService(String),
}

impl From<crate::store::StoreError> for ClusterError {
    fn from(e: crate::store::StoreError) -> ClusterError {
        ClusterError::Env(EnvError::Store(e))
    }
}

impl From<crate::intent::pinning::PinError> for ClusterError {
    fn from(e: crate::intent::pinning::PinError) -> ClusterError {
        ClusterError::Env(e.into())
    }
}

impl From<crate::intent::IntentError> for ClusterError {
    fn from(e: crate::intent::IntentError) -> ClusterError {
        ClusterError::Env(e.into())
    }
}

/// The solver a template gets when it names none.
pub const DEFAULT_SOLVER: &str = "layout-solver";

/// Names of clusters and templates follow the rule of service names
/// ([`orc_manifest::names::SERVICE`]): they become parts of resource keys.
pub(crate) fn validate_name(kind: &str, name: &str) -> Result<(), ClusterError> {
    orc_manifest::names::SERVICE
        .check(name)
        .map_err(|e| ClusterError::Invalid(format!("{kind} name `{}`: {e}", name.chars().take(100).collect::<String>())))
}

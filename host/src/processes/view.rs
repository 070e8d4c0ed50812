//! A process as the API shows it ([`ProcessView`]: its tasks, connections, what it has not taken
//! yet and its latest actions), and the changes each process has not taken yet
//! ([`PendingList`], from `pending_changes`).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::config::redacted;
use super::connections::ConnectionView;
use super::stored::state_of;
use super::{ProcessDoc, ProcessState, set_of};
use crate::clusters::ClusterFailure;
use crate::clusters::view::TaskView;
use crate::store::{ActionRecord, Millis, ProcessRecord};

/// A process as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ProcessView {
    pub name: String,
    pub state: ProcessState,
    /// Counts the process's changes: its ETag.
    pub revision: i64,
    /// `name@version` of the service it is driven to.
    pub service: String,
    pub node: String,
    /// Its configuration; values the schema marks `writeOnly` or `format: password` are
    /// `"<redacted>"`.
    #[schema(value_type = Object)]
    pub config: Value,
    pub ports: BTreeMap<String, u16>,
    /// What last ran (service, node), when something has.
    pub active: Option<ActiveView>,
    pub failure: Option<ClusterFailure>,
    /// Tasks by state: `done`, `pending`, and the resource statuses.
    pub progress: BTreeMap<String, usize>,
    pub tasks: Vec<TaskView>,
    /// Its connections, from either side.
    pub connections: Vec<ConnectionView>,
    /// What it has not taken yet: its tasks whose desired state is not deployed.
    pub pending: Vec<PendingChange>,
    /// Why its latest change is not released yet, while the environment's last attempt to
    /// release processes failed (it is tried again); `null` otherwise.
    pub release_error: Option<String>,
    /// Its tasks' latest actions, newest first (on `GET …/processes/{name}` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recent_actions: Option<Vec<RecentAction>>,
    /// Who started the current operation; `null`: the host itself.
    pub operation_author: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// One action of a process's tasks, from the action log.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RecentAction {
    pub resource: String,
    /// What started it (`deploy`, `repair`, `dryrun`, …).
    pub kind: String,
    pub outcome: String,
    pub started_at: Millis,
    pub finished_at: Millis,
    /// `code: message` of its error.
    pub error: Option<String>,
}

impl From<ActionRecord> for RecentAction {
    fn from(a: ActionRecord) -> RecentAction {
        RecentAction {
            resource: a.resource_id,
            kind: a.kind.as_str().to_string(),
            outcome: a.outcome,
            started_at: a.started_at,
            finished_at: a.finished_at,
            error: a.error.map(|e| format!("{}: {}", e.code, e.message)),
        }
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ActiveView {
    pub service: String,
    pub node: String,
}

impl ProcessView {
    /// The view of the process stored as `record` and `doc`: its `tasks` as they stand (see
    /// [`progress_of`](crate::clusters::view::progress_of)), its `connections` and `pending`
    /// changes, its configuration with what `schema` marks secret redacted, and the releaser's
    /// `release_error` if its latest change waits for it. Without its recent actions.
    pub(crate) fn new(
        record: &ProcessRecord,
        doc: &ProcessDoc,
        tasks: Vec<TaskView>,
        connections: Vec<ConnectionView>,
        pending: Vec<PendingChange>,
        schema: &Value,
        release_error: Option<String>,
    ) -> ProcessView {
        let mut progress = BTreeMap::new();
        for t in &tasks {
            *progress.entry(t.status.clone()).or_insert(0) += 1;
        }
        ProcessView {
            name: record.name.clone(),
            state: state_of(record),
            revision: record.revision,
            service: doc.target.reference(),
            node: doc.target.node.clone(),
            config: redacted(schema, &doc.target.config),
            ports: doc.target.ports.clone(),
            active: doc.active.as_ref().map(|a| ActiveView {
                service: a.reference(),
                node: a.node.clone(),
            }),
            failure: doc.failure.clone(),
            progress,
            tasks,
            connections,
            pending,
            release_error,
            recent_actions: None,
            operation_author: doc.author.clone(),
            created_at: record.created_at,
            updated_at: record.updated_at,
        }
    }
}

/// A change a process has not taken yet: one of its tasks whose desired state is not deployed,
/// or its peers' new nodes, queued to be told.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PendingChange {
    pub task: String,
    pub step: String,
    /// `pending` (not started), `deploying`, `failed`, `unavailable` (its node cannot be
    /// reached), `skipped`, …; `queued` for a process to be told its peers' new nodes (task
    /// `process.<name>/connections`, step `connections`).
    pub status: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    /// Since when the step has been as it is (the change made; not the process's last change).
    pub since: Millis,
    /// When the scheduler tries it again (milliseconds since the epoch); sooner when its node,
    /// unreachable, answers again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_retry_at: Option<Millis>,
}

/// `GET …/pending`: each process with changes it has not taken.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PendingList {
    pub items: Vec<PendingProcess>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PendingProcess {
    pub process: String,
    pub state: ProcessState,
    pub changes: Vec<PendingChange>,
}

/// The tasks of `tasks` not done, as pending changes since each became what it is; first, if
/// process `name` waits to be told its peers' new nodes (`queued`: since when, and the releaser's
/// error if its last round failed), that change: task `<set>/connections`, step `connections`,
/// status `queued`.
pub(crate) fn pending_changes(
    name: &str,
    queued: Option<(Millis, Option<String>)>,
    tasks: &[TaskView],
    doc: &ProcessDoc,
) -> Vec<PendingChange> {
    let queued = queued.map(|(queued_at, last_error)| PendingChange {
        task: format!("{}/connections", set_of(name)),
        step: "connections".into(),
        status: "queued".into(),
        attempts: 0,
        last_error,
        since: queued_at,
        next_retry_at: None,
    });
    queued
        .into_iter()
        .chain(tasks.iter().filter(|t| t.status != "done").map(|t| PendingChange {
            task: t.id.clone(),
            step: t.step.clone(),
            status: t.status.clone(),
            attempts: t.attempts,
            last_error: t.last_error.clone(),
            since: doc.since(&t.id),
            next_retry_at: t.next_retry_at,
        }))
        .collect()
}

//! A cluster as the API shows it ([`ClusterView`], each task a [`TaskView`]), what an operation
//! would do ([`PlanPreview`], from `preview`) and an operation's answer ([`Outcome`]); how far a
//! plan is by its tasks' states (`progress_of`), which the views of processes use too.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use orc_cluster::Layout;
use serde::Serialize;
use serde_json::Value;

use super::planner;
use super::{ClusterDoc, ClusterError, ClusterFailure, ClusterStatus, OperationKind};
use crate::intent::{PluginRef, ResourceSpec};
use crate::status::ResourceStatus;
use crate::store::{ClusterRecord, Millis, ResourceState};

/// One task of a cluster, with its state.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TaskView {
    pub id: String,
    pub node: String,
    pub service: String,
    pub step: String,
    /// Being undone (`start` → stop, `install` → remove).
    pub purged: bool,
    /// The resource's status; `pending` before the scheduler has taken the plan in, `done` when
    /// the state deployed is this plan's.
    pub status: String,
    pub attempts: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the scheduler tries it again after a failure (milliseconds since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_retry_at: Option<Millis>,
}

/// A cluster as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ClusterView {
    pub name: String,
    pub template: String,
    pub template_version: i64,
    pub status: ClusterStatus,
    pub operation: OperationKind,
    /// The user who started the current operation; `null`: the host itself (a rollback after a
    /// failure, a lease that ended).
    pub operation_author: Option<String>,
    pub size: u32,
    pub services: Vec<String>,
    /// Node → the services it runs.
    #[schema(value_type = Object)]
    pub layout: Layout,
    pub stopped: BTreeSet<String>,
    /// Each service's effective configuration.
    #[schema(value_type = Object)]
    pub config: BTreeMap<String, Value>,
    /// Tasks by state: `done`, `pending`, and the resource statuses.
    pub progress: BTreeMap<String, usize>,
    pub tasks: Vec<TaskView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<ClusterFailure>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<Millis>,
    /// Counts the cluster's changes: its `ETag`. An operation sent with an `If-Match` naming
    /// another revision is refused (409 `version_conflict`).
    pub revision: i64,
    pub created_at: Millis,
    pub updated_at: Millis,
}

impl ClusterView {
    /// The view of the cluster stored as `record` and `doc`, its tasks as they stand (see
    /// [`progress_of`]) and each service's effective configuration `config`.
    pub(crate) fn new(record: &ClusterRecord, doc: &ClusterDoc, tasks: Vec<TaskView>, config: BTreeMap<String, Value>) -> ClusterView {
        let mut counts = BTreeMap::new();
        for t in &tasks {
            *counts.entry(t.status.clone()).or_insert(0) += 1;
        }
        ClusterView {
            name: record.name.clone(),
            template: record.template.clone(),
            template_version: record.template_version,
            status: ClusterStatus::parse(&record.status).unwrap_or(ClusterStatus::Failed),
            operation: doc.operation,
            operation_author: doc.author.clone(),
            size: doc.size,
            services: doc.services.clone(),
            layout: doc.layout.clone(),
            stopped: doc.stopped.clone(),
            config,
            progress: counts,
            tasks,
            failure: doc.failure.clone(),
            lease_expires_at: record.lease_expires_at,
            revision: record.revision,
            created_at: record.created_at,
            updated_at: record.updated_at,
        }
    }
}

/// What an operation would do, without doing it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PlanPreview {
    #[schema(value_type = Object)]
    pub layout: Layout,
    /// Tasks to run or undo (unchanged tasks are left out).
    pub tasks: Vec<PreviewTask>,
    pub unchanged: usize,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PreviewTask {
    pub id: String,
    /// `add`, `change` or `remove`.
    pub change: &'static str,
    pub requires: Vec<String>,
}

/// An operation's answer: the cluster, or only a preview.
#[derive(Debug)]
pub enum Outcome {
    Started(Box<ClusterView>),
    Preview(PlanPreview),
}

/// A cluster's tasks and their states, as the watcher and the view see them.
pub(crate) struct Progress {
    /// Every task's state is this plan's, deployed.
    pub done: bool,
    /// A task that failed `max_attempts` times in this plan.
    pub failed: Option<ClusterFailure>,
    pub tasks: Vec<TaskView>,
}

/// What `tasks` changes from `previous`.
pub(crate) fn preview(layout: &Layout, previous: &[ResourceSpec], tasks: &[ResourceSpec]) -> PlanPreview {
    let before: HashMap<String, &ResourceSpec> = previous.iter().map(|t| (t.id.to_string(), t)).collect();
    let mut out = Vec::new();
    let mut unchanged = 0;
    for t in tasks {
        let change = match before.get(&t.id.to_string()) {
            _ if t.purged && !before.get(&t.id.to_string()).is_some_and(|b| b.purged) => "remove",
            None => "add",
            Some(b) if b.attributes != t.attributes || b.purged != t.purged => "change",
            Some(_) => {
                unchanged += 1;
                continue;
            }
        };
        out.push(PreviewTask {
            id: t.id.to_string(),
            change,
            requires: t.requires.iter().map(ToString::to_string).collect(),
        });
    }
    PlanPreview {
        layout: layout.clone(),
        tasks: out,
        unchanged,
    }
}

/// How far the plan `planned` (one resource set's tasks) is by `states` (resource id → state);
/// a task failed `max_attempts` times fails it.
pub(crate) fn progress_of(
    planned: &[ResourceSpec],
    max_attempts: u32,
    states: &HashMap<String, ResourceState>,
) -> Result<Progress, ClusterError> {
    let mut done = true;

    let mut failed = None;
    let mut tasks = Vec::with_capacity(planned.len());
    for t in planned {
        let PluginRef::Digest(digest) = &t.adaptor else {
            return Err(ClusterError::Invalid(format!("task `{}` is not pinned", t.id)));
        };
        let expected = crate::scheduler::desired_hash(t, digest).to_string();
        let id = t.id.to_string();
        let state = states.get(&id);
        let (service, step) = planner::parse_task_key(&t.id.key)
            .map(|(_, s, step)| (s.to_string(), step.as_str()))
            .unwrap_or_default();
        let mut view = TaskView {
            id,
            node: t.id.node.clone(),
            service,
            step: step.to_string(),
            purged: t.purged,
            status: "pending".into(),
            attempts: 0,
            last_error: None,
            next_retry_at: None,
        };
        match state {
            Some(s) if s.desired_hash == expected => {
                let finished = s.status == ResourceStatus::Deployed && s.deployed_hash.as_deref() == Some(expected.as_str());
                view.status = if finished { "done".into() } else { s.status.as_str().to_string() };
                view.attempts = s.attempts;
                view.last_error = s.last_error.as_ref().map(|e| format!("{}: {}", e.code, e.message));
                view.next_retry_at = s.next_retry_at;
                done &= finished;
                if s.status == ResourceStatus::Failed && s.attempts >= i64::from(max_attempts) && failed.is_none() {
                    failed = Some(ClusterFailure {
                        task: Some(t.id.to_string()),
                        code: s.last_error.as_ref().map_or("failed".into(), |e| e.code.clone()),
                        message: s.last_error.as_ref().map_or_else(String::new, |e| e.message.clone()),
                    });
                }
            }
            _ => done = false,
        }
        tasks.push(view);
    }
    Ok(Progress { done, failed, tasks })
}

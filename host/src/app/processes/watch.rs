//! The process watcher: one task per process operation that follows the environment's events
//! and moves the process on when its tasks are done or have failed: `creating`/`updating` →
//! `running`; a failure → `rolling_back` (a create: every task undone; an update: back to what
//! last ran) → `failed` or `running` with the failure kept; `terminating` → gone. Watchers are
//! restarted with the host.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use orc_manifest::error_chain;
use tracing::Instrument;

use super::release::is_process_task;
use super::{decode, plan, state_of};
use crate::app::App;
use crate::intent::{IntentDocument, PluginRef};
use crate::scheduler::ResourceStatus;
use crate::services::ProcessDoc;
use crate::services::{ProcessState, ServicesError, set_of};
use crate::store::{Environment, EnvironmentId, StoreError};

/// How often a watcher looks again without an event (events wake it sooner).
const TICK: Duration = Duration::from_secs(2);

/// What a watcher does next.
enum Next {
    /// Look again when something may have changed: with `Some`, once each of these tasks (id →
    /// the desired hash that finishes it) reported itself deployed at that hash, or one of them
    /// failed; with `None`, at any news of its tasks.
    Wait(Option<Outstanding>),
    Done,
}

/// A watcher's tasks not done at its last look: id → the desired hash that finishes each.
type Outstanding = HashMap<String, String>;

impl App {
    /// Follows process `name`'s operation `generation` until it is over.
    pub(crate) fn spawn_process_watcher(self: &Arc<Self>, env: EnvironmentId, name: String, generation: u64) {
        let this = self.clone();
        let span = tracing::info_span!("process_watch", process = %name, generation);
        tokio::spawn(async move { this.watch_process(env, name, generation).await }.instrument(span));
    }

    async fn watch_process(self: Arc<Self>, env_id: EnvironmentId, name: String, generation: u64) {
        let mut stopping = self.stopping.subscribe();
        // Its tasks' ids hold `,process.<name>/`: a batch without one is not this process's news.
        let needle = format!(",{}/", set_of(&name));
        loop {
            if *stopping.borrow() {
                return;
            }
            let env = match self.store.get_environment(&env_id).await {
                Ok(env) => env,
                Err(StoreError::NotFound { .. }) => return,
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "cannot read the environment");
                    tokio::time::sleep(TICK).await;
                    continue;
                }
            };
            let mut events = match self.running(&env).await {
                Ok(r) => r.stream.subscribe(),
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "environment not running");
                    tokio::time::sleep(TICK).await;
                    continue;
                }
            };
            let mut outstanding = match self.process_step(&env, &name, generation).await {
                Ok(Next::Done) => return,
                Ok(Next::Wait(outstanding)) => outstanding,
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "process step failed; trying again");
                    None
                }
            };
            tokio::select! {
                _ = concerning(&mut events, &needle, &mut outstanding) => tokio::time::sleep(Duration::from_millis(50)).await,
                _ = tokio::time::sleep(TICK) => {}
                _ = stopping.changed() => return,
            }
        }
    }

    /// Looks at the process once and moves it on, under the environment's services lock: what it
    /// reads is what it writes over (an operator's change or a connection waits for it, and it
    /// for them).
    async fn process_step(self: &Arc<Self>, env: &Environment, name: &str, generation: u64) -> Result<Next, ServicesError> {
        let running = self.running(env).await?;
        let _services = running.services.lock().await;
        let Some((record, current)) = self.find_process(env, name).await? else {
            return Ok(Next::Done);
        };
        if current.generation != generation {
            return Ok(Next::Done);
        }
        let set = set_of(name);
        if !App::tasks_recorded(&running, &set, &current.tasks) {
            // Its tasks are not released yet (or their states not recorded): nothing to judge.
            return Ok(Next::Wait(None));
        }
        let progress = self.task_progress(env, &current.tasks, current.max_attempts).await?;
        let state = state_of(&record);
        let doc = || ProcessDoc::clone(&current);
        match state {
            ProcessState::Running | ProcessState::Failed => Ok(Next::Done),
            ProcessState::Terminating if progress.done => {
                // Revision-checked: a row that moved on meanwhile is looked at again.
                let deleted = self.store.delete_process(&env.id, name, record.revision).await;
                App::table_write(&running, deleted, |rows, _| rows.remove_process(name))?;
                self.request_process_release(&env.id, &running);
                tracing::info!(environment = %env.name, process = %name, "process terminated");
                Ok(Next::Done)
            }
            ProcessState::Creating | ProcessState::Updating if progress.done => {
                let mut doc = doc();
                doc.active = Some(doc.target.clone());
                self.settle_process(env, &record, doc, ProcessState::Running).await?;
                tracing::info!(environment = %env.name, process = %name, "process running");
                Ok(Next::Done)
            }
            ProcessState::Moving if progress.done => {
                // It runs on its new node and no more on the old one: its peers are told.
                let mut doc = doc();
                doc.active = Some(doc.target.clone());
                self.settle_process(env, &record, doc, ProcessState::Running).await?;
                let peers = self.peers_of(env, name).await?;
                self.redeliver(env, &peers).await?;
                tracing::info!(environment = %env.name, process = %name, "process moved");
                Ok(Next::Done)
            }
            ProcessState::RollingBack if progress.done => {
                let doc = doc();
                let state = if doc.active.is_some() {
                    ProcessState::Running
                } else {
                    ProcessState::Failed
                };
                self.settle_process(env, &record, doc, state).await?;
                tracing::warn!(environment = %env.name, process = %name, state = state.as_str(), "process rolled back");
                Ok(Next::Done)
            }
            ProcessState::Creating | ProcessState::Updating | ProcessState::Moving if progress.failed.is_some() => {
                tracing::warn!(environment = %env.name, process = %name, failure = ?progress.failed, "process operation failed; rolling back");
                let mut doc = doc();
                doc.failure = progress.failed;
                let previous = std::mem::take(&mut doc.tasks);
                if let Some(active) = doc.active.clone() {
                    doc.target = active;
                    let connections = self.delivered_connections(env, name).await?;
                    doc.tasks = plan(&set, Some(&doc.target), &previous, &connections)?;
                } else {
                    doc.tasks = plan(&set, None, &previous, &super::empty_object())?;
                }
                self.begin_process(env, &record, doc, ProcessState::RollingBack, None).await?;
                Ok(Next::Done)
            }
            ProcessState::RollingBack if progress.failed.is_some() && current.active.is_none() => {
                // Undoing a failed create failed too: keep the first failure, stop watching.
                self.settle_process(env, &record, doc(), ProcessState::Failed).await?;
                Ok(Next::Done)
            }
            _ => {
                // Still under way: what is left, for the events to tick off.
                let outstanding = current
                    .tasks
                    .iter()
                    .zip(&progress.tasks)
                    .filter(|(_, view)| view.status != "done")
                    .map(|(task, _)| match &task.adaptor {
                        PluginRef::Digest(digest) => Some((task.id.to_string(), crate::scheduler::desired_hash(task, digest).to_string())),
                        _ => None,
                    })
                    .collect::<Option<Outstanding>>();
                Ok(Next::Wait(outstanding))
            }
        }
    }

    /// Ends an operation in `state`: the removals that are done are dropped from the plan (a
    /// process that never ran keeps no task), released after the row is written.
    async fn settle_process(
        self: &Arc<Self>,
        env: &Environment,
        record: &crate::store::ProcessRecord,
        mut doc: crate::services::ProcessDoc,
        state: ProcessState,
    ) -> Result<(), ServicesError> {
        let set = set_of(&record.name);
        let before = doc.tasks.clone();
        doc.tasks = match (&doc.active, state) {
            (Some(active), ProcessState::Running) => {
                doc.target = active.clone();
                let connections = self.delivered_connections(env, &record.name).await?;
                plan(&set, Some(active), &[], &connections)?
            }
            _ => Vec::new(),
        };
        let changed = doc.tasks != before;
        // Revision-checked: a row that moved on meanwhile is looked at again.
        self.write_process(env, record, state, &Arc::new(doc)).await?;
        if changed {
            // Removals done are dropped from the released version too.
            let running = self.running(env).await?;
            self.request_process_release(&env.id, &running);
        }
        Ok(())
    }

    /// Restarts the watchers of processes with an operation under way. Called once the host is
    /// up.
    pub async fn resume_processes(self: &Arc<Self>) {
        let envs = match self.store.list_environments().await {
            Ok(envs) => envs,
            Err(e) => return tracing::error!(error = %error_chain(&e), "cannot list environments for their processes"),
        };
        for env in envs {
            match self.store.list_processes(&env.id).await {
                Ok(processes) => {
                    // Rows written before the host stopped may not be released yet; and with no
                    // row left, the released version may still hold a terminated process's
                    // tasks (the host stopped between deleting its row and the release).
                    if !processes.is_empty() || self.released_process_tasks(&env).await {
                        match self.running(&env).await {
                            Ok(running) => self.request_process_release(&env.id, &running),
                            Err(e) => {
                                tracing::error!(environment = %env.name, error = %error_chain(&e), "cannot start the environment for its processes")
                            }
                        }
                    }
                    for p in processes {
                        let busy = !matches!(state_of(&p), ProcessState::Running | ProcessState::Failed);
                        if let (true, Ok(doc)) = (busy, decode(&p)) {
                            self.spawn_process_watcher(env.id, p.name.clone(), doc.generation);
                        }
                    }
                }
                Err(e) => tracing::error!(environment = %env.name, error = %error_chain(&e), "cannot list processes"),
            }
        }
    }
}

impl App {
    /// Whether `env`'s released version holds tasks of some process. Read from the store, so
    /// that an environment without processes is not started to find out; a version that cannot
    /// be read or parsed counts as holding some (the releaser then looks for itself).
    async fn released_process_tasks(&self, env: &Environment) -> bool {
        let Some(released) = env.released_version else {
            return false;
        };
        match self.store.get_version(&env.id, released).await {
            Ok(version) => match serde_json::from_str::<IntentDocument>(&version.document) {
                Ok(doc) => doc.resources.iter().any(is_process_task),
                Err(_) => true,
            },
            Err(_) => true,
        }
    }
}

/// Waits for a batch of events that may move a process on. With hundreds of processes changing at
/// once, a watcher wakes for its own tasks, not for everyone's (`needle` is in its tasks' ids), and
/// not for a task becoming `available` or `deploying`, which neither finishes nor fails an
/// operation. Knowing what is `outstanding`, it wakes once every one of those tasks reported
/// itself deployed at the hash that finishes it, or one of them failed (or was skipped), not at
/// each task done; without, at any other news of its tasks. Missed events (a lagging receiver)
/// wake it too, and the tick looks again anyway: events only say when to look, the step reads the
/// states.
async fn concerning(
    events: &mut tokio::sync::broadcast::Receiver<crate::scheduler::events::Batch>,
    needle: &str,
    outstanding: &mut Option<Outstanding>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match events.recv().await {
            Ok(batch) => {
                for event in batch.iter().filter(|e| e.data.contains(needle)) {
                    if news(event, outstanding) {
                        return;
                    }
                }
            }
            Err(RecvError::Lagged(_)) => return,
            // The stream ended (the environment stopped): the tick looks again.
            Err(RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// Whether `event` (about one of the watcher's tasks) is worth a look; ticks off a task that
/// finished.
fn news(event: &crate::scheduler::events::Published, outstanding: &mut Option<Outstanding>) -> bool {
    #[derive(serde::Deserialize)]
    struct State {
        resource: String,
        status: ResourceStatus,
        deployed_hash: Option<String>,
    }
    if event.name != "state" {
        // An action's report or a release: its state event says what matters.
        return outstanding.is_none() && event.name != "released";
    }
    let Ok(state) = serde_json::from_str::<State>(&event.data) else {
        return true;
    };
    match (state.status, outstanding) {
        (ResourceStatus::Available | ResourceStatus::Deploying, _) => false,
        (_, None) => true,
        (ResourceStatus::Deployed, Some(left)) => {
            if left
                .get(&state.resource)
                .is_some_and(|hash| state.deployed_hash.as_ref() == Some(hash))
            {
                left.remove(&state.resource);
                return left.is_empty();
            }
            // Deployed at another plan's hash, or a task done already.
            false
        }
        (_, Some(_)) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::events::Published;

    fn state(resource: &str, status: &str, deployed: Option<&str>) -> Published {
        Published {
            name: "state",
            data: serde_json::json!({"resource": resource, "status": status, "deployed_hash": deployed, "version": 1}).to_string(),
        }
    }

    #[test]
    fn a_watcher_wakes_when_its_last_task_is_done_or_one_fails() {
        let mut left: Option<Outstanding> = Some([("a".to_string(), "h1".to_string()), ("b".to_string(), "h2".to_string())].into());
        assert!(!news(&state("a", "deploying", None), &mut left));
        assert!(!news(&state("a", "deployed", Some("old")), &mut left), "another plan's hash");
        assert!(!news(&state("a", "deployed", Some("h1")), &mut left));
        assert!(!news(&state("a", "deployed", Some("h1")), &mut left), "done already");
        assert!(news(&state("b", "failed", None), &mut left));
        assert!(news(&state("b", "deployed", Some("h2")), &mut left), "the last one");
        // Not knowing what is left: any news but `available` and `deploying`.
        let mut unknown = None;
        assert!(!news(&state("a", "available", None), &mut unknown));
        assert!(news(&state("a", "deployed", Some("x")), &mut unknown));
        let report = Published {
            name: "action",
            data: "{}".into(),
        };
        assert!(news(&report, &mut unknown));
        let mut known: Option<Outstanding> = Some([("a".to_string(), "h".to_string())].into());
        assert!(!news(&report, &mut known), "an action's report waits for its state");
        assert!(news(
            &Published {
                name: "state",
                data: "not json".into()
            },
            &mut known
        ));
    }
}

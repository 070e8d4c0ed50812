//! The process watcher: one task per process operation that follows the environment's events
//! and moves the process on when its tasks are done or have failed: `creating`/`updating` →
//! `running`; a failure → `rolling_back` (a create: every task undone; an update: back to what
//! last ran) → `failed` or `running` with the failure kept; `terminating` → gone. Watchers are
//! restarted with the host.

use std::collections::HashMap;
use std::sync::Arc;

use orc_manifest::{Digest, error_chain};
use tracing::Instrument;

use super::news::{Subscription, TaskNews};
use super::release::Release;
use crate::app::App;
use crate::app::running::Running;
use crate::app::watcher::{Look, Watch};
use crate::clusters::planner;
use crate::intent::{IntentDocument, PluginRef};
use crate::processes::plan::{Delivered, plan};
use crate::processes::stored::{decode, state_of};
use crate::processes::{ProcessDoc, ProcessState, ServicesError, is_process_task, set_of};
use crate::scheduler::ResourceStatus;
use crate::store::{Environment, EnvironmentId};

/// What a watcher does next.
enum Next {
    /// Look again when something may have changed: with `Some`, once each of these tasks (id →
    /// the desired hash that finishes it) reported itself deployed at that hash, or one of them
    /// failed; with `None`, at any news of its tasks.
    Wait(Option<Outstanding>),
    Done,
}

/// A watcher's tasks not done at its last look: id → the desired hash that finishes each.
type Outstanding = HashMap<String, Digest>;

/// A process watcher: woken by news of its tasks that is worth a look.
struct ProcessWatch {
    name: String,
    generation: u64,
}

impl Watch for ProcessWatch {
    type News = Subscription;
    type Carry = Option<Outstanding>;

    fn subscribe(&self, running: &Arc<Running>) -> Subscription {
        running.process_news.subscribe(&self.name)
    }

    async fn look(&self, app: &Arc<App>, env: &Environment) -> Look<Option<Outstanding>> {
        match app.process_step(env, &self.name, self.generation).await {
            Ok(Next::Done) => Look::Done,
            Ok(Next::Wait(outstanding)) => Look::Wait(outstanding),
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "process step failed; trying again");
                Look::Wait(None)
            }
        }
    }

    async fn woken(news: &mut Subscription, outstanding: &mut Option<Outstanding>) {
        concerning(news, outstanding).await
    }
}

impl App {
    /// Follows process `name`'s operation `generation` until it is over.
    pub(crate) fn spawn_process_watcher(self: &Arc<Self>, env: EnvironmentId, name: String, generation: u64) {
        let this = self.clone();
        let span = tracing::info_span!("process_watch", process = %name, generation);
        tokio::spawn(async move { this.drive(env, ProcessWatch { name, generation }).await }.instrument(span));
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
                self.request_process_release(&env.id, &running, Release::Tidy);
                tracing::info!(environment = %env.name, process = %name, "process terminated");
                Ok(Next::Done)
            }
            ProcessState::Creating | ProcessState::Updating | ProcessState::Moving if progress.done => {
                let mut doc = doc();
                let elsewhere = doc.active.as_ref().is_some_and(|a| !a.reached_as(&doc.target));
                doc.active = Some(doc.target.clone());
                let arrived = planner::task_id(&set, &doc.target.node, &doc.target.service, planner::Step::Start);
                self.settle_process(env, &record, doc, ProcessState::Running).await?;
                if elsewhere {
                    // It runs where it went (another node, other ports) and no more where it was:
                    // its peers are told, by the releaser's next round, once each however many
                    // of their peers arrived. Those told where it goes when it set off, waiting
                    // for its start there, know already (a re-plan only drops the met wait,
                    // which leaves the row as it is): unhurried, unless one was left without
                    // the wait (it would have closed a cycle) and is told only now.
                    let peers = self.told_where(env, name).await?;
                    let mut who = Release::Tidy;
                    for peer in &peers {
                        let waited = self
                            .find_process(env, peer)
                            .await?
                            .is_some_and(|(_, d)| d.tasks.iter().any(|t| t.requires.contains(&arrived)));
                        if !waited {
                            who = Release::FollowUp;
                        }
                    }
                    running.queue_tells(peers);
                    self.request_process_release(&env.id, &running, who);
                }
                let what = if state == ProcessState::Moving {
                    "process moved"
                } else {
                    "process running"
                };
                tracing::info!(environment = %env.name, process = %name, "{what}");
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
                    let connections = self.delivered_connections(env, name, &doc.target).await?;
                    doc.tasks = plan(&set, Some(&doc.target), &previous, &connections)?;
                } else {
                    doc.tasks = plan(&set, None, &previous, &Delivered::none())?;
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
                        PluginRef::Digest(digest) => Some((task.id.to_string(), crate::scheduler::desired_hash(task, digest))),
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
        mut doc: crate::processes::ProcessDoc,
        state: ProcessState,
    ) -> Result<(), ServicesError> {
        let set = set_of(&record.name);
        let before = doc.tasks.clone();
        doc.tasks = match (&doc.active, state) {
            (Some(active), ProcessState::Running) => {
                doc.target = active.clone();
                let connections = self.delivered_connections(env, &record.name, active).await?;
                plan(&set, Some(active), &[], &connections)?
            }
            _ => Vec::new(),
        };
        let changed = doc.tasks != before;
        // Revision-checked: a row that moved on meanwhile is looked at again.
        self.write_process(env, record, state, doc).await?;
        if changed {
            // Removals done are dropped from the released version too, unhurried.
            let running = self.running(env).await?;
            self.request_process_release(&env.id, &running, Release::Tidy);
        }
        Ok(())
    }

    /// Restarts the watchers of `env`'s processes with an operation under way. Called when this
    /// replica starts running `env`.
    pub(in crate::app) async fn resume_processes(self: &Arc<Self>, env: &Environment) {
        {
            let env = env.clone();
            match self.store.list_processes(&env.id).await {
                Ok(processes) => {
                    // Rows written before the host stopped may not be released yet; and with no
                    // row left, the released version may still hold a terminated process's
                    // tasks (the host stopped between deleting its row and the release). Peers
                    // of a process that moved may not have been told yet (the releaser tells
                    // them, from memory): every process is re-planned with its connections as
                    // they are, which changes only the rows of those not told.
                    if !processes.is_empty() || self.released_process_tasks(&env).await {
                        match self.running(&env).await {
                            Ok(running) => {
                                {
                                    let _services = running.services.lock().await;
                                    running.queue_tells(processes.iter().map(|p| p.name.clone()));
                                }
                                self.request_process_release(&env.id, &running, Release::Prompt)
                            }
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

/// Waits for news that may move a process on: not a task becoming `available` or `deploying`,
/// which neither finishes nor fails an operation. Knowing what is `outstanding`, it waits until
/// every one of those tasks reported itself deployed at the hash that finishes it, or one of them
/// failed (or was skipped), not for each task done; without, for any other news of its tasks.
/// The tick looks again anyway: news only says when to look, the step reads the states.
async fn concerning(news: &mut Subscription, outstanding: &mut Option<Outstanding>) {
    loop {
        if worth_a_look(&news.next().await, outstanding) {
            return;
        }
    }
}

/// Whether `news` (of one of the watcher's tasks) is worth a look; ticks off a task that
/// finished.
fn worth_a_look(news: &TaskNews, outstanding: &mut Option<Outstanding>) -> bool {
    match (news.status, outstanding) {
        (ResourceStatus::Available | ResourceStatus::Deploying, _) => false,
        (_, None) => true,
        (ResourceStatus::Deployed, Some(left)) => {
            if left
                .get(&news.resource)
                .is_some_and(|hash| news.deployed_hash.as_ref() == Some(hash))
            {
                left.remove(&news.resource);
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

    fn news(resource: &str, status: ResourceStatus, deployed: Option<&Digest>) -> TaskNews {
        TaskNews {
            resource: resource.into(),
            status,
            deployed_hash: deployed.copied(),
        }
    }

    #[test]
    fn a_watcher_wakes_when_its_last_task_is_done_or_one_fails() {
        use ResourceStatus::*;
        let (h1, h2, old) = (Digest::of(b"1"), Digest::of(b"2"), Digest::of(b"old"));
        let mut left: Option<Outstanding> = Some([("a".to_string(), h1), ("b".to_string(), h2)].into());
        assert!(!worth_a_look(&news("a", Deploying, None), &mut left));
        assert!(!worth_a_look(&news("a", Deployed, Some(&old)), &mut left), "another plan's hash");
        assert!(!worth_a_look(&news("a", Deployed, Some(&h1)), &mut left));
        assert!(!worth_a_look(&news("a", Deployed, Some(&h1)), &mut left), "done already");
        assert!(worth_a_look(&news("b", Failed, None), &mut left));
        assert!(worth_a_look(&news("b", Deployed, Some(&h2)), &mut left), "the last one");
        // Not knowing what is left: any news but `available` and `deploying`.
        let mut unknown = None;
        assert!(!worth_a_look(&news("a", Available, None), &mut unknown));
        assert!(worth_a_look(&news("a", Deployed, Some(&old)), &mut unknown));
        assert!(worth_a_look(&news("a", Skipped, None), &mut unknown));
    }
}

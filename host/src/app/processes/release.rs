//! The process releaser: one task per environment that releases what the process rows say.
//!
//! A process operation, a connection change and a watcher's step write process rows (under the
//! services lock, revision-checked) and then only *ask* for a release: they count a change in
//! [`Running::process_changes`] and answer. The releaser, woken by the count, takes the release
//! turn and releases one version: the released version's resources with every process's tasks
//! replaced by the rows' tasks. Whatever changes come in while it releases are released together
//! by its next round, so a burst of operations costs a few versions, not one version each (a
//! version is the whole intent: at 200 processes, a thousand tasks stored and handed to the
//! scheduler).
//!
//! An operation that starts a move (or a watcher whose process moved, or goes back) does not
//! re-plan the peers told where it runs itself: it names them in [`Running::redeliveries`] and
//! the releaser's next round re-plans each once before it releases (a client whose two servers
//! move at once is written and reconfigured once). Those names are only in memory: a host
//! starting re-plans every process ([`App::resume_processes`]).
//!
//! The rows are the truth: an operator's version carries them too ([`App::cluster_tasks`]), and a
//! host that stops before releasing releases them when it starts ([`App::resume_processes`]).
//! What a release would refuse for a process's tasks (an automator not loadable under the
//! environment's grants, a node the environment may not use) is refused before its row is
//! written ([`App::check_tasks`]), so a release fails only for reasons of the moment (the
//! scheduler stopped, the store away): the releaser tries again, backing off, and the error is
//! shown on the processes waiting for it. A watcher judges its tasks only once the version holding
//! them has its states recorded ([`App::tasks_recorded`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use orc_manifest::error_chain;
use tracing::Instrument;

use crate::app::running::Running;
use crate::app::{App, EnvError};
use crate::clusters::ClusterError;
use crate::intent::pinning;
use crate::intent::{Intent, IntentDocument, ResourceSpec};
use crate::processes::{ServicesError, is_process_task};
use crate::store::{Environment, EnvironmentId, StoreError};

/// The releaser's first wait after a failed release; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long the releaser lets changes gather once one has come in before it releases: until none
/// came for [`GATHER`], at most [`MAX_GATHER`]. A version is the whole intent, so releasing the
/// changes of a burst together is much cheaper than one version each, and an operation has
/// answered already (its watcher waits for the version).
const GATHER: Duration = Duration::from_millis(50);
const MAX_GATHER: Duration = Duration::from_millis(400);
/// The same for watchers' follow-ups alone ([`Release::FollowUp`]): a moved process's peers told
/// its new node. They come as operations finish, one after another: released each as it came, a
/// client whose two servers moved a moment apart would reconfigure and restart twice, and every
/// version costs a round of the releaser. An operator's change meanwhile shortens the wait to the
/// prompt one.
const FOLLOW_GATHER: Duration = Duration::from_millis(250);
const MAX_FOLLOW_GATHER: Duration = Duration::from_millis(1000);
/// The same for what only drops tasks that are done ([`Release::Tidy`]): nothing on any node
/// waits for it, and a burst of operations finishing over a few seconds (200 processes moved)
/// shares one version instead of one per second. A follow-up or an operator's change meanwhile
/// shortens the wait to theirs.
const TIDY_GATHER: Duration = Duration::from_millis(1000);
const MAX_TIDY_GATHER: Duration = Duration::from_secs(5);

/// Who asks for a release, which sets how long changes gather before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// An operator's operation or connection change.
    Prompt,
    /// A watcher's step that tells peers.
    FollowUp,
    /// A watcher's step that only drops what is done: the old node's removals once a move or an
    /// update has finished, a terminated process's tasks.
    Tidy,
}

impl App {
    /// Asks for the environment's process rows to be released; starts its releaser on first use.
    pub(crate) fn request_process_release(self: &Arc<Self>, env: &EnvironmentId, running: &Arc<Running>, who: Release) {
        match who {
            Release::Prompt => running.process_prompt.store(true, Ordering::SeqCst),
            Release::FollowUp => running.process_follow_up.store(true, Ordering::SeqCst),
            Release::Tidy => {}
        }
        running.process_changes.send_modify(|n| *n += 1);
        if !running.process_releaser.swap(true, Ordering::SeqCst) {
            let this = self.clone();
            let running = running.clone();
            let span = tracing::info_span!("process_releaser", environment = %running.name);
            let env = *env;
            tokio::spawn(async move { this.process_releaser(env, running).await }.instrument(span));
        }
    }

    async fn process_releaser(self: Arc<Self>, env_id: EnvironmentId, running: Arc<Running>) {
        let mut changes = running.process_changes.subscribe();
        // Ends with the environment here (and with the host: its shutdown ends every one).
        let mut stopping = running.ended.subscribe();
        let mut released = 0;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let wanted = *changes.borrow_and_update();
            if wanted == released {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    _ = stopping.changed() => return,
                }
                continue;
            }
            if *stopping.borrow() {
                return;
            }
            // Gather: while changes keep coming, within the bound (an operator's change among
            // them: the prompt one).
            let started = tokio::time::Instant::now();
            let mut seen = *changes.borrow();
            loop {
                let (quiet, bound) = if running.process_prompt.load(Ordering::SeqCst) {
                    (GATHER, MAX_GATHER)
                } else if running.process_follow_up.load(Ordering::SeqCst) {
                    (FOLLOW_GATHER, MAX_FOLLOW_GATHER)
                } else {
                    (TIDY_GATHER, MAX_TIDY_GATHER)
                };
                let left = bound.saturating_sub(started.elapsed());
                if left.is_zero() {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep(quiet.min(left)) => {}
                    _ = stopping.changed() => return,
                }
                let now = *changes.borrow();
                if now == seen {
                    break;
                }
                seen = now;
            }
            running.process_prompt.store(false, Ordering::SeqCst);
            running.process_follow_up.store(false, Ordering::SeqCst);
            let wanted = *changes.borrow_and_update();
            let result = match self.store.get_environment(&env_id).await {
                Ok(env) => match self.redeliver_deferred(&env, &running).await {
                    Ok(()) => self.release_processes(&env, &running).await.map_err(ServicesError::from),
                    Err(e) => Err(e),
                },
                Err(StoreError::NotFound { .. }) => return,
                Err(e) => Err(e.into()),
            };
            match result {
                Ok(()) => {
                    released = wanted;
                    running.process_released.store(released, Ordering::SeqCst);
                    backoff = FIRST_BACKOFF;
                    *running.process_release_error.lock().expect("release error") = None;
                }
                Err(ServicesError::Cluster(ClusterError::Env(EnvError::UnknownEnvironment(_)))) => return,
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), retry_in_ms = backoff.as_millis() as u64, "cannot release the processes' tasks; trying again");
                    *running.process_release_error.lock().expect("release error") = Some(error_chain(&e));
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stopping.changed() => return,
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Tells the processes whose peers moved ([`Running::redeliveries`]) their peers' nodes:
    /// each re-planned once, under the services lock, before the round releases them. Each
    /// leaves the queue only once its row is written (still under the lock, which whoever
    /// queues holds too): until then it shows as pending, and a failed round leaves it for the
    /// next.
    async fn redeliver_deferred(&self, env: &Environment, running: &Running) -> Result<(), ServicesError> {
        let _services = running.services.lock().await;
        let names: Vec<String> = running.redeliveries.lock().expect("redeliveries").keys().cloned().collect();
        if names.is_empty() {
            return Ok(());
        }
        self.redeliver_rows(env, &names).await?;
        let mut queued = running.redeliveries.lock().expect("redeliveries");
        for name in &names {
            queued.remove(name);
        }
        Ok(())
    }

    /// Under the release turn: a new version with every process's tasks as the rows have them,
    /// unless the released version has exactly those.
    async fn release_processes(&self, env: &Environment, running: &Running) -> Result<(), EnvError> {
        let _turn = running.releases.lock().await;
        running.check_scheduler()?;
        let tasks = self.process_tasks(env).await?;
        let released = running.released_version();
        let current = released.as_ref().map(|v| v.intent.resources.as_slice()).unwrap_or_default();
        if current.iter().filter(|r| is_process_task(r)).eq(tasks.iter()) {
            return Ok(());
        }
        let mut resources: Vec<ResourceSpec> = current.iter().filter(|r| !is_process_task(r)).cloned().collect();
        let count = tasks.len();
        resources.extend(tasks);
        let intent = Intent::validate(IntentDocument { resources })?;
        let info = self.submit_and_release(env, running, intent, None).await?;
        tracing::debug!(version = info.version, tasks = count, "process tasks released");
        Ok(())
    }

    /// Refuses `tasks` (one process's) if a release would: they must form a valid intent whose
    /// adaptors load under the environment's grants, on nodes the environment may use.
    pub(crate) async fn check_tasks(&self, env: &Environment, running: &Running, tasks: &[ResourceSpec]) -> Result<(), ServicesError> {
        // Alone, without the other processes' tasks: a wait for a moving provider's start (the
        // one requirement across sets, see `delivered_connections`) is checked by the release.
        let resources = tasks
            .iter()
            .map(|t| {
                let own = crate::clusters::planner::parse_task_key(&t.id.key).map(|(set, _, _)| set);
                let mut t = t.clone();
                t.requires
                    .retain(|r| crate::clusters::planner::parse_task_key(&r.key).map(|(set, _, _)| set) == own);
                t
            })
            .collect();
        let intent = Intent::validate(IntentDocument { resources }).map_err(EnvError::from)?;
        let pinned = pinning::load_adaptors(&intent, &self.registry, &self.runtime, &running.grants())
            .await
            .map_err(EnvError::from)?;
        self.check_nodes(&intent, &pinned.plugins, env).await?;
        Ok(())
    }

    /// Whether the version last released with its states recorded holds exactly `tasks` as set
    /// `set`'s: until then, the tasks' states are not theirs to judge.
    pub(crate) fn tasks_recorded(running: &Running, set: &str, tasks: &[ResourceSpec]) -> bool {
        let Some(recorded) = running.recorded() else {
            return tasks.is_empty();
        };
        let mut recorded: Vec<&ResourceSpec> = recorded.tasks_of(set).collect();
        let mut wanted: Vec<&ResourceSpec> = tasks.iter().collect();
        recorded.sort_by(|a, b| a.id.cmp(&b.id));
        wanted.sort_by(|a, b| a.id.cmp(&b.id));
        recorded == wanted
    }
}

//! Requests for an environment another replica runs: relayed through the database, never
//! forwarded over HTTP. The replica a client reached writes the request as a command row and
//! waits ([`App::relay`]); the owner claims it, runs it as if it had been asked itself
//! ([`App::serve_commands`]) and writes the answer. A command is claimed once, so a request runs
//! at most once: one whose owner ended while running it is answered "in doubt", never run again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::broadcast::error::RecvError;

use super::App;
use crate::store::{CommandAnswer, CommandId, CommandNews, CommandRecord, CommandState, EnvironmentId, StoreError, now_ms};
use orc_manifest::error_chain;

/// How long a command may wait for an owner to claim it (a takeover takes a few seconds; past
/// this no replica runs the environment).
const CLAIM_WAIT: Duration = Duration::from_secs(30);
/// How long a relayed request is waited for in all.
const ANSWER_WAIT: Duration = Duration::from_secs(600);
/// How often a waiter and the owner look at the table whatever was announced (an announcement
/// is lost while a listener reconnects).
const POLL: Duration = Duration::from_secs(1);
/// Commands older than this are forgotten, whatever became of them.
const KEPT: Duration = Duration::from_secs(900);
/// The most commands an owner claims for one environment at a time.
const CLAIM_BATCH: i64 = 64;

/// Why a relayed request has no answer.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// No replica claimed it in time (it was withdrawn and will never run).
    #[error("no replica took up the request for environment `{environment}` within {} s; it was not run", CLAIM_WAIT.as_secs())]
    NotTaken { environment: String },
    /// The replica running it ended, or lost the environment, before answering: it may or may
    /// not have taken effect.
    #[error(
        "replica {replica}, which ran environment `{environment}`, ended or lost it while running the request: it may or may not have taken effect; read the state before trying again"
    )]
    InDoubt { environment: String, replica: String },
    #[error("the replica running environment `{environment}` has not answered within {} s; the request may still take effect", ANSWER_WAIT.as_secs())]
    TimedOut { environment: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Runs a claimed command here and answers it: the API's router, as if the request had come in.
pub type CommandRunner = Arc<dyn Fn(CommandRecord) -> BoxFuture<'static, CommandAnswer> + Send + Sync>;

impl App {
    /// The environment named `key` if another replica holds its lease now: a request for it
    /// is relayed there. `None` also when no replica holds it (this one claims it on use), on
    /// SQLite (one process), and when it does not exist.
    pub async fn relay_target(&self, key: &str) -> Option<EnvironmentId> {
        if self.store.backend() == crate::store::Backend::Sqlite {
            return None;
        }
        let env = self.get(key).await.ok()?;
        if self.ownership.holds(&env.id) {
            return None;
        }
        let lease = self.store.lease(&env.id).await.ok()??;
        (lease.holder.is_some_and(|h| h != self.ownership.me) && lease.expires_in_ms > 0).then_some(env.id)
    }

    /// The replica this one is.
    pub fn replica_id(&self) -> crate::store::ReplicaId {
        self.ownership.me
    }

    /// Relays `command` to its environment's owner and waits for the answer.
    pub async fn relay(&self, command: CommandRecord, environment: &str) -> Result<CommandAnswer, RelayError> {
        // Listening before the row exists: its answer is not missed.
        let mut news = self.store.command_news();
        self.store.submit_command(&command).await?;
        let started = Instant::now();
        tracing::debug!(command = %command.id, environment, "request relayed");
        loop {
            match self.store.command_state(command.id).await? {
                CommandState::Answered(answer) => {
                    if let Err(e) = self.store.forget_command(command.id).await {
                        tracing::debug!(error = %error_chain(&e), "an answered request stays until it is old");
                    }
                    return Ok(answer);
                }
                CommandState::Gone => {
                    return Err(RelayError::NotTaken {
                        environment: environment.to_string(),
                    });
                }
                CommandState::Waiting if started.elapsed() >= CLAIM_WAIT && self.store.withdraw_command(command.id).await? => {
                    return Err(RelayError::NotTaken {
                        environment: environment.to_string(),
                    });
                }
                CommandState::Claimed(by) if by != self.ownership.me && self.stopped_running(by, command.env).await? => {
                    // It may still answer between the two looks.
                    if let CommandState::Answered(answer) = self.store.command_state(command.id).await? {
                        let _ = self.store.forget_command(command.id).await;
                        return Ok(answer);
                    }
                    return Err(RelayError::InDoubt {
                        environment: environment.to_string(),
                        replica: by.to_string(),
                    });
                }
                _ if started.elapsed() >= ANSWER_WAIT => {
                    return Err(RelayError::TimedOut {
                        environment: environment.to_string(),
                    });
                }
                _ => {}
            }
            wait_for_answer(&mut news, command.id).await;
        }
    }

    /// Whether replica `by` ended, or no longer holds `env`: a command it claimed then may or
    /// may not have taken effect (a paused owner wakes fenced).
    async fn stopped_running(&self, by: crate::store::ReplicaId, env: EnvironmentId) -> Result<bool, StoreError> {
        let lease = self.store.lease(&env).await?;
        Ok(lease.is_none_or(|l| l.holder != Some(by)) || self.store.is_gone(by).await?)
    }

    /// Runs, with `run`, the commands relayed to the environments this replica holds, until
    /// the host stops. Nothing to do on SQLite (one process).
    pub fn serve_commands(self: &Arc<Self>, run: CommandRunner) {
        let Some(mut news) = self.store.command_news() else { return };
        let app = self.clone();
        let mut stopping = self.stopping.subscribe();
        tokio::spawn(async move {
            let mut last_cleanup = Instant::now();
            loop {
                let envs: Vec<EnvironmentId> = tokio::select! {
                    heard = news.recv() => match heard {
                        Ok(CommandNews::Submitted(env)) => vec![env],
                        Ok(CommandNews::Answered(_)) => continue,
                        Ok(CommandNews::Listening) | Err(RecvError::Lagged(_)) => app.waiting_commands().await,
                        Err(RecvError::Closed) => return,
                    },
                    () = tokio::time::sleep(POLL) => app.waiting_commands().await,
                    _ = stopping.changed() => return,
                };
                for env in envs.into_iter().filter(|env| app.ownership.holds(env)) {
                    app.run_commands(env, &run).await;
                }
                if last_cleanup.elapsed() >= Duration::from_secs(60) {
                    last_cleanup = Instant::now();
                    let before = now_ms() - i64::try_from(KEPT.as_millis()).unwrap_or(i64::MAX);
                    if let Err(e) = app.store.forget_commands_before(before).await {
                        tracing::debug!(error = %error_chain(&e), "cannot forget old relayed requests");
                    }
                }
            }
        });
    }

    /// The environments with unclaimed commands.
    async fn waiting_commands(&self) -> Vec<EnvironmentId> {
        self.store.environments_with_commands().await.unwrap_or_else(|e| {
            tracing::warn!(error = %error_chain(&e), "cannot look for relayed requests");
            Vec::new()
        })
    }

    /// Claims what waits for `env` and runs each, at once and side by side as requests are.
    async fn run_commands(self: &Arc<Self>, env: EnvironmentId, run: &CommandRunner) {
        let claimed = match self.store.claim_commands(&env, self.ownership.me, CLAIM_BATCH).await {
            Ok(claimed) => claimed,
            Err(e) => return tracing::warn!(environment = %env, error = %error_chain(&e), "cannot claim relayed requests"),
        };
        for command in claimed {
            let (app, run) = (self.clone(), run.clone());
            tokio::spawn(async move {
                let id = command.id;
                tracing::debug!(command = %id, environment = %env, method = command.method, target = command.target, "running a relayed request");
                let answer = run(command).await;
                if let Err(e) = app.store.answer_command(id, &answer).await {
                    // The waiter answers "in doubt" once this replica is gone, or times out.
                    tracing::warn!(command = %id, error = %error_chain(&e), "cannot record the answer to a relayed request");
                }
            });
        }
    }
}

/// Until `id` may have been answered: its announcement, a lost announcement, or the poll.
async fn wait_for_answer(news: &mut Option<tokio::sync::broadcast::Receiver<CommandNews>>, id: CommandId) {
    let Some(news) = news else {
        return tokio::time::sleep(POLL).await;
    };
    let heard = async {
        loop {
            match news.recv().await {
                Ok(CommandNews::Answered(answered)) if answered == id => return,
                Ok(CommandNews::Listening) | Err(RecvError::Lagged(_)) => return,
                Ok(_) => {}
                Err(RecvError::Closed) => return std::future::pending().await,
            }
        }
    };
    let _ = tokio::time::timeout(POLL, heard).await;
}

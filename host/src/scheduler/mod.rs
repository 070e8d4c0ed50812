//! The scheduler of one environment: it owns the in-memory state of every resource of the released
//! intent version and decides what runs, in dependency order, within the environment's and each
//! node's concurrency limits. The five triggers are one code path — each only marks resources as
//! *wanted* and the same dispatcher runs the same executor:
//!
//! 1. deploy changes: releasing a version wants every resource whose desired hash differs from the
//!    hash last deployed;
//! 2. self-healing: a deployed resource not verified for `repair_interval` is wanted again;
//! 3. retry: a failed resource is wanted again after `retry_interval`, doubling per attempt up to
//!    `max_retry_interval`, with jitter;
//! 4. user deploy: every failed, skipped or unavailable resource is wanted now;
//! 5. user repair: every resource is wanted now.
//!
//! A resource runs only when everything it requires is deployed; when a requirement fails, its
//! dependents (transitively) are `skipped` and run as soon as it recovers. A trigger that arrives
//! while a resource's action is in flight is kept and applied when the action finishes (see
//! `state`). Every transition and every action is handed to a [`Sink`] (persistence, events).
//!
//! Parts: `state` (the loop and its per-resource state), `timers` (backoff, self-healing, the
//! heap, checked clock arithmetic), `writer` (the sink's task and the backpressure it applies),
//! `actions` (how one action runs), `dryrun` (a whole version read and diffed; its `report`),
//! `version`; and what connects it to the rest: `persistence` (the store as its sink, and the
//! resume), `events` (the event stream and observers after persistence) and `subscribers` (the
//! stream's fan-out, each subscriber's queue bounded in bytes).

mod actions;
pub mod dryrun;
pub mod events;
pub mod persistence;
mod state;
pub mod subscribers;
mod timers;
mod version;
mod writer;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use orc_manifest::Digest;
use orc_runtime::CallContext;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};

pub use actions::{Actions, AdaptorActions};
pub use dryrun::{dryrun, dryrun_each, dryrun_limited};
pub use version::{Version, desired_hash};

use crate::executor::{ActionError, ActionReport};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Limits and intervals of one environment.
#[derive(Debug, Clone)]
pub struct Settings {
    pub env_concurrency: usize,
    pub node_concurrency: usize,
    pub retry_interval: Duration,
    pub max_retry_interval: Duration,
    /// `None` disables self-healing.
    pub repair_interval: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            env_concurrency: 64,
            node_concurrency: 16,
            retry_interval: Duration::from_secs(60),
            max_retry_interval: Duration::from_secs(3600),
            repair_interval: Some(Duration::from_secs(3600)),
        }
    }
}

use crate::status::ResourceStatus as Status;
/// A resource's status: the store's, so that what the scheduler decides is what is persisted.
pub use crate::status::{ErrorInfo, ResourceStatus};

/// Why an action ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Deploy,
    Repair,
    Retry,
}

/// What the scheduler knows of one resource, as persisted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResourceState {
    pub resource: String,
    pub version: u64,
    pub status: Status,
    pub desired_hash: Digest,
    pub deployed_hash: Option<Digest>,
    pub attempts: u32,
    pub last_error: Option<ActionError>,
    /// When an action last finished for it (milliseconds since the epoch); `None`: unchanged.
    pub last_deploy_at: Option<i64>,
    /// When it was last found in its desired state; `None`: unchanged.
    pub last_verified_at: Option<i64>,
    /// When a retry is due.
    pub next_retry_at: Option<i64>,
}

impl ResourceState {
    /// A state event of `resource` at `version` in `status` (tests' shorthand).
    #[cfg(test)]
    pub(crate) fn event(resource: &str, version: u64, status: Status) -> Event {
        Event::State(ResourceState {
            resource: resource.to_string(),
            version,
            status,
            desired_hash: Digest::of(b"desired"),
            deployed_hash: None,
            attempts: 0,
            last_error: None,
            last_deploy_at: None,
            last_verified_at: None,
            next_retry_at: None,
        })
    }
}

/// What the scheduler hands to its sink, in order.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    State(ResourceState),
    Action {
        version: u64,
        trigger: Trigger,
        report: ActionReport,
    },
    /// `version` was released, its resources' states handed over before this event. `dropped`:
    /// the resources of the previous version that it no longer has — they are no longer managed
    /// (nor removed from the device: purging does that), and their states go away.
    Released {
        version: u64,
        dropped: Vec<String>,
        /// Whether every resource of the version had its state handed over (the first release
        /// of a scheduler, or one after a batch the sink could not take): every stored state of
        /// another version goes. Otherwise only the states that changed were: a resource deployed
        /// as it was, still wanted as it was, keeps its stored state, which now belongs to
        /// `version` (a release costs what it changed, not the size of the version). Not
        /// published: for watchers, a release is the states that changed.
        #[serde(skip)]
        complete: bool,
    },
}

/// Where events go (persistence, event streams). Called from the scheduler's writer task, in
/// order, with everything that accumulated since the last call.
pub trait Sink: Send + Sync + 'static {
    fn record(&self, events: Vec<Event>) -> BoxFuture<'_, ()>;

    /// Whether what the sink holds may differ from what it was handed (a batch it could not
    /// take): the scheduler then hands over every state at its next release.
    fn in_doubt(&self) -> bool {
        false
    }
}

/// A snapshot of counts, for progress and for waiting until a deploy settles.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    pub version: Option<u64>,
    pub counts: Vec<(Status, usize)>,
}

impl Snapshot {
    pub fn count(&self, status: Status) -> usize {
        self.counts.iter().find(|(s, _)| *s == status).map(|(_, n)| *n).unwrap_or(0)
    }
}

/// The scheduler's own view of every resource, as it decides (for diagnostics and for the
/// scheduler's model-based tests).
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    pub version: Option<u64>,
    pub halted: bool,
    /// Held back by its sink (too many events not recorded yet).
    pub throttled: bool,
    pub running: usize,
    /// Actions finished since the scheduler started.
    pub finished: u64,
    pub running_per_node: HashMap<String, usize>,
    /// Resource ids with an action in flight (possibly of an earlier version's resource).
    pub in_flight: Vec<String>,
    pub resources: Vec<Inspected>,
}

/// One resource in an [`Inspection`].
#[derive(Debug, Clone, Serialize)]
pub struct Inspected {
    pub resource: String,
    pub node: String,
    pub status: Status,
    /// What it is owed and has not started yet.
    pub wanted: Option<Trigger>,
    /// Requirements not deployed yet.
    pub waiting: usize,
    pub in_flight: bool,
    pub desired_hash: Digest,
    pub deployed_hash: Option<Digest>,
    /// When its retry or self-healing timer fires.
    pub timer_in: Option<Duration>,
}

/// The scheduler is not running: its loop or its writer ended without being stopped (a panic,
/// reported by its supervisor), or it was stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the environment's scheduler is not running: {reason}")]
pub struct Unavailable {
    pub reason: String,
}

enum Command {
    /// The receipt, if any, is answered once the release's states are recorded.
    Release(Arc<Version>, Option<oneshot::Sender<()>>),
    DeployFailed,
    /// A node usable again: what failed on it is wanted now.
    NodeBack(String),
    Repair,
    /// Replies once nothing runs and nothing is ready to run (timers aside).
    Settled(oneshot::Sender<Snapshot>),
    Settings(Settings),
    Context(CallContext),
    /// `true`: start nothing new (actions in flight finish; wants and timers are kept).
    Halt(bool),
    /// Start nothing new, let what runs finish, record every event, reply, end.
    Stop(oneshot::Sender<Snapshot>),
    Inspect(oneshot::Sender<Inspection>),
}

/// Told why, once, if a scheduler's loop or writer ends abnormally.
pub type OnFailure = Box<dyn FnOnce(&str) + Send>;

/// Everything a scheduler starts with.
pub struct Start {
    pub ctx: CallContext,
    pub settings: Settings,
    /// Start halted (see [`Scheduler::set_halted`]).
    pub halted: bool,
    /// What was deployed before (from the store): resource id → last deployed hash.
    pub known: HashMap<String, Digest>,
    pub actions: Arc<dyn Actions>,
    /// Called once if the scheduler's loop or writer ends abnormally, with the reason.
    pub on_failure: Option<OnFailure>,
}

impl Start {
    pub fn new(ctx: CallContext, settings: Settings) -> Start {
        Start {
            ctx,
            settings,
            halted: false,
            known: HashMap::new(),
            actions: Arc::new(AdaptorActions),
            on_failure: None,
        }
    }
}

/// Whether the scheduler's tasks still run: `None` while they do; set once by their supervisor
/// when they have ended — `Some(None)` stopped, `Some(Some(reason))` failed.
struct Health {
    ended: watch::Sender<Option<Option<String>>>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            ended: watch::Sender::new(None),
        }
    }
}

impl Health {
    fn failure(&self) -> Option<String> {
        self.ended.borrow().clone().flatten()
    }

    /// Why a request is refused, as far as known now.
    fn unavailable(&self) -> Unavailable {
        Unavailable {
            reason: self.failure().unwrap_or_else(|| "it has stopped".to_string()),
        }
    }

    /// Why a request was dropped: waits for the supervisor's verdict (the tasks have ended, so it
    /// comes at once).
    async fn ended(&self) -> Unavailable {
        let mut ended = self.ended.subscribe();
        let reason = match ended.wait_for(Option::is_some).await {
            Ok(verdict) => verdict.clone().flatten(),
            Err(_) => None,
        };
        Unavailable {
            reason: reason.unwrap_or_else(|| "it has stopped".to_string()),
        }
    }
}

/// The handle of a running scheduler. Dropping every handle stops it once in-flight actions end.
#[derive(Clone)]
pub struct Scheduler {
    commands: mpsc::UnboundedSender<Command>,
    health: Arc<Health>,
}

/// Resolves once everything a command made the scheduler emit has been recorded by its sink.
pub struct Receipt {
    reply: oneshot::Receiver<()>,
    health: Arc<Health>,
}

impl Receipt {
    pub async fn recorded(self) -> Result<(), Unavailable> {
        match self.reply.await {
            Ok(()) => Ok(()),
            Err(_) => Err(self.health.ended().await),
        }
    }
}

impl Scheduler {
    /// Starts the scheduler. `known` carries what was deployed before (from the store): resource
    /// id → last deployed hash.
    pub fn spawn(ctx: CallContext, settings: Settings, sink: Arc<dyn Sink>, known: HashMap<String, Digest>) -> Scheduler {
        Scheduler::spawn_halted(ctx, settings, false, sink, known)
    }

    /// [`Scheduler::spawn`], halted from the start when `halted` (see [`Scheduler::set_halted`]).
    pub fn spawn_halted(
        ctx: CallContext,
        settings: Settings,
        halted: bool,
        sink: Arc<dyn Sink>,
        known: HashMap<String, Digest>,
    ) -> Scheduler {
        Scheduler::start(
            Start {
                halted,
                known,
                ..Start::new(ctx, settings)
            },
            sink,
        )
    }

    /// Starts a scheduler and the supervisor of its two tasks (the loop and the writer): if
    /// either ends abnormally, the scheduler reports it ([`Scheduler::failure`]) and every later
    /// request is refused with [`Unavailable`] instead of being accepted for nothing.
    pub fn start(start: Start, sink: Arc<dyn Sink>) -> Scheduler {
        let (commands, rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let backlog = Arc::new(writer::Backlog::default());
        let health = Arc::new(Health::default());
        let writer = tokio::spawn(writer::writer(sink, events_rx, backlog.clone()));
        let outbox = writer::Outbox { tx: events_tx, backlog };
        let state = state::Loop::new(start.ctx, start.settings, start.halted, start.known, start.actions, outbox);
        let main = tokio::spawn(state.run(rx));
        tokio::spawn(supervise(health.clone(), main, writer, start.on_failure));
        Scheduler { commands, health }
    }

    /// Why the scheduler stopped running on its own, if it did.
    pub fn failure(&self) -> Option<String> {
        self.health.failure()
    }

    fn send(&self, command: Command) -> Result<(), Unavailable> {
        if self.health.failure().is_some() {
            return Err(self.health.unavailable());
        }
        self.commands.send(command).map_err(|_| self.health.unavailable())
    }

    /// Releases a version: its changes are deployed (trigger 1). The receipt resolves once the
    /// version's states (and the `released` event) are recorded by the sink.
    pub fn release(&self, version: Arc<Version>) -> Result<Receipt, Unavailable> {
        let (tx, reply) = oneshot::channel();
        self.send(Command::Release(version, Some(tx)))?;
        Ok(Receipt {
            reply,
            health: self.health.clone(),
        })
    }

    /// Retries every failed, skipped or unavailable resource now (trigger 4).
    pub fn deploy_failed(&self) -> Result<(), Unavailable> {
        self.send(Command::DeployFailed)
    }

    /// `node` is usable again (it was unreachable): its resources that failed, were skipped
    /// or found it unavailable are deployed now instead of at their next retry.
    pub fn node_back(&self, node: String) -> Result<(), Unavailable> {
        self.send(Command::NodeBack(node))
    }

    /// Re-reads and restores every resource now (trigger 5).
    pub fn repair(&self) -> Result<(), Unavailable> {
        self.send(Command::Repair)
    }

    /// New limits and intervals; they apply to what starts or is scheduled from now on.
    pub fn update_settings(&self, settings: Settings) -> Result<(), Unavailable> {
        self.send(Command::Settings(settings))
    }

    /// What plugin calls may reach (nodes, kv, HTTP, deadline) from now on: actions that start
    /// after this use `ctx`; those in flight finish with the one they started with.
    pub fn update_context(&self, ctx: CallContext) -> Result<(), Unavailable> {
        self.send(Command::Context(ctx))
    }

    /// Halts (`true`) or resumes (`false`) the environment: while halted nothing new starts —
    /// neither deploys nor retries nor repairs — and what is in flight finishes. What became due
    /// meanwhile runs on resume.
    pub fn set_halted(&self, halted: bool) -> Result<(), Unavailable> {
        self.send(Command::Halt(halted))
    }

    /// Graceful stop: nothing new starts, actions in flight finish and every event reaches the
    /// sink before this returns. Queued work is not lost: it is persisted as wanted state
    /// (`available`, `failed`, …) and runs again when the environment is resumed.
    pub async fn stop(&self) -> Snapshot {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Stop(tx)).is_err() {
            return Snapshot::default();
        }
        rx.await.unwrap_or_default()
    }

    /// Waits until nothing runs and nothing is ready to run; pending retries and repairs are timers
    /// and do not count. While halted, it waits only for the actions in flight.
    pub async fn settled(&self) -> Result<Snapshot, Unavailable> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Settled(tx))?;
        match rx.await {
            Ok(snapshot) => Ok(snapshot),
            Err(_) => Err(self.health.ended().await),
        }
    }

    /// The scheduler's view of every resource, after every command sent before this one.
    pub async fn inspect(&self) -> Result<Inspection, Unavailable> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Inspect(tx))?;
        match rx.await {
            Ok(inspection) => Ok(inspection),
            Err(_) => Err(self.health.ended().await),
        }
    }
}

/// Waits for the loop and the writer; a panic (or a cancellation) of either is the scheduler's
/// failure. The writer ends normally after the loop does (its queue closes).
async fn supervise(
    health: Arc<Health>,
    main: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
    on_failure: Option<OnFailure>,
) {
    let (mut main, mut writer) = (main, writer);
    let failure = tokio::select! {
        ended = &mut main => match ended {
            Err(e) => Some(("loop", e)),
            // Stopped: the writer drains what is left and ends.
            Ok(()) => writer.await.err().map(|e| ("writer", e)),
        },
        ended = &mut writer => match ended {
            Err(e) => {
                main.abort();
                Some(("writer", e))
            }
            Ok(()) => main.await.err().map(|e| ("loop", e)),
        },
    };
    let Some((part, error)) = failure else {
        health.ended.send_replace(Some(None));
        return;
    };
    let reason = match error.try_into_panic() {
        Ok(payload) => format!("its {part} panicked: {}", crate::executor::panic_text(payload.as_ref())),
        Err(_) => format!("its {part} was cancelled"),
    };
    tracing::error!(%reason, "an environment's scheduler stopped");
    health.ended.send_replace(Some(Some(reason.clone())));
    if let Some(report) = on_failure {
        report(&reason);
    }
}

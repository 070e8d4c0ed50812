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
//! dependents (transitively) are `skipped` and run as soon as it recovers. A new version supersedes
//! the queued work of the old one; actions in flight finish and their result is applied by
//! resource id. Every transition and every action is handed to a [`Sink`] (persistence, events).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use orc_manifest::Digest;
use orc_runtime::{CallContext, Plugin};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::executor::{self, ActionError, ActionReport, Mode, Outcome};
use crate::intent::{Intent, ResourceSpec};

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

/// A released intent version with its adaptors loaded (one per resource, by index).
#[derive(Debug)]
pub struct Version {
    pub number: u64,
    pub intent: Intent,
    pub plugins: Vec<Arc<Plugin>>,
    hashes: Vec<Digest>,
    /// `waits_for[i]`: what must be deployed before `i` runs. The intent's `requires`, except that
    /// between two purged resources the edge is reversed, so dependents are removed first.
    waits_for: Vec<Vec<usize>>,
    /// The reverse of `waits_for`.
    blocks: Vec<Vec<usize>>,
}

impl Version {
    pub fn new(number: u64, intent: Intent, plugins: Vec<Arc<Plugin>>) -> Version {
        assert_eq!(intent.resources.len(), plugins.len(), "one plugin per resource");
        let hashes = intent
            .resources
            .iter()
            .zip(&plugins)
            .map(|(r, p)| desired_hash(r, &p.digest))
            .collect();
        let n = intent.resources.len();
        let mut waits_for = vec![Vec::new(); n];
        let mut blocks = vec![Vec::new(); n];
        for (i, reqs) in intent.requires.iter().enumerate() {
            for &j in reqs {
                let (before, after) = if intent.resources[i].purged && intent.resources[j].purged {
                    (i, j)
                } else {
                    (j, i)
                };
                waits_for[after].push(before);
                blocks[before].push(after);
            }
        }
        Version {
            number,
            intent,
            plugins,
            hashes,
            waits_for,
            blocks,
        }
    }

    pub fn desired_hash(&self, index: usize) -> Digest {
        self.hashes[index]
    }
}

/// The hash of what a resource should be: its adaptor, attributes and purge mark. JSON objects
/// serialise with sorted keys, so equal desired states hash equally.
pub fn desired_hash(spec: &ResourceSpec, adaptor: &Digest) -> Digest {
    // Exactly the text of `{"adaptor": …, "attributes": …, "purged": …}` serialised as a JSON
    // value (keys in order, no whitespace), without building one.
    let canonical = format!(
        r#"{{"adaptor":"{adaptor}","attributes":{},"purged":{}}}"#,
        spec.attributes.as_json(),
        spec.purged
    );
    Digest::of(canonical.as_bytes())
}

/// A resource's status: the store's, so that what the scheduler decides is what is persisted.
pub use crate::store::ResourceStatus as Status;

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
    /// `version` was released and every one of its resources' states was handed over before
    /// this event. `dropped`: the resources of the previous version that it no longer has — they
    /// are no longer managed (nor removed from the device: purging does that), and their states
    /// go away.
    Released {
        version: u64,
        dropped: Vec<String>,
    },
}

/// Where events go (persistence, event streams). Called from the scheduler's writer task, in
/// order, with everything that accumulated since the last call.
pub trait Sink: Send + Sync + 'static {
    fn record(&self, events: Vec<Event>) -> BoxFuture<'_, ()>;
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

enum Command {
    Release(Arc<Version>),
    DeployFailed,
    Repair,
    /// Replies once nothing runs and nothing is ready to run (timers aside).
    Settled(oneshot::Sender<Snapshot>),
    Settings(Settings),
    Context(CallContext),
    /// `true`: start nothing new (actions in flight finish; wants and timers are kept).
    Halt(bool),
    /// Start nothing new, let what runs finish, record every event, reply, end.
    Stop(oneshot::Sender<Snapshot>),
}

/// The handle of a running scheduler. Dropping every handle stops it once in-flight actions end.
#[derive(Clone)]
pub struct Scheduler {
    commands: mpsc::UnboundedSender<Command>,
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
        let (commands, rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let backlog = Arc::new(Backlog::default());
        tokio::spawn(writer(sink, events_rx, backlog.clone()));
        let outbox = Outbox { tx: events_tx, backlog };
        let state = Loop::new(ctx, settings, halted, known, outbox);
        tokio::spawn(state.run(rx));
        Scheduler { commands }
    }

    /// Releases a version: its changes are deployed (trigger 1).
    pub fn release(&self, version: Arc<Version>) {
        let _ = self.commands.send(Command::Release(version));
    }

    /// Retries every failed, skipped or unavailable resource now (trigger 4).
    pub fn deploy_failed(&self) {
        let _ = self.commands.send(Command::DeployFailed);
    }

    /// Re-reads and restores every resource now (trigger 5).
    pub fn repair(&self) {
        let _ = self.commands.send(Command::Repair);
    }

    /// New limits and intervals; they apply to what starts or is scheduled from now on.
    pub fn update_settings(&self, settings: Settings) {
        let _ = self.commands.send(Command::Settings(settings));
    }

    /// What plugin calls may reach (nodes, kv, HTTP, deadline) from now on: actions that start
    /// after this use `ctx`; those in flight finish with the one they started with.
    pub fn update_context(&self, ctx: CallContext) {
        let _ = self.commands.send(Command::Context(ctx));
    }

    /// Halts (`true`) or resumes (`false`) the environment: while halted nothing new starts —
    /// neither deploys nor retries nor repairs — and what is in flight finishes. What became due
    /// meanwhile runs on resume.
    pub fn set_halted(&self, halted: bool) {
        let _ = self.commands.send(Command::Halt(halted));
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
    pub async fn settled(&self) -> Snapshot {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Settled(tx)).is_err() {
            return Snapshot::default();
        }
        rx.await.unwrap_or_default()
    }
}

/// What the loop sends its writer: events, and settle answers that must follow them.
enum Outgoing {
    Event(Event),
    Settled(oneshot::Sender<Snapshot>, Snapshot),
}

/// Events sent to the writer and not recorded yet: at most this many before the loop stops
/// starting actions. Without a bound a scheduler whose actions finish faster than its sink
/// stores them runs ever further ahead of the store (memory: a 100,000-resource deploy on
/// PostgreSQL held ~200 MiB more; a crash: more progress to redo).
const MAX_UNRECORDED: usize = 16_384;

/// How far the writer is behind the loop.
#[derive(Default)]
struct Backlog {
    unrecorded: std::sync::atomic::AtomicUsize,
    /// Signalled whenever the writer has recorded something.
    recorded: tokio::sync::Notify,
}

impl Backlog {
    fn full(&self) -> bool {
        self.unrecorded.load(std::sync::atomic::Ordering::Acquire) >= MAX_UNRECORDED
    }
}

/// The loop's side of the writer's queue.
struct Outbox {
    tx: mpsc::UnboundedSender<Outgoing>,
    backlog: Arc<Backlog>,
}

impl Outbox {
    /// Queues `out` for the writer (which lives as long as the loop).
    fn send(&self, out: Outgoing) {
        self.backlog.unrecorded.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let _ = self.tx.send(out);
    }
}

/// Drains events into the sink, batching whatever accumulated while the previous call ran. A
/// settle answer is sent only once every event before it has been recorded.
async fn writer(sink: Arc<dyn Sink>, mut rx: mpsc::UnboundedReceiver<Outgoing>, backlog: Arc<Backlog>) {
    let mut incoming = Vec::new();
    while rx.recv_many(&mut incoming, 10_000).await > 0 {
        let received = incoming.len();
        let mut batch = Vec::with_capacity(incoming.len());
        for out in incoming.drain(..) {
            match out {
                Outgoing::Event(e) => batch.push(e),
                Outgoing::Settled(reply, snapshot) => {
                    if !batch.is_empty() {
                        sink.record(std::mem::take(&mut batch)).await;
                    }
                    let _ = reply.send(snapshot);
                }
            }
        }
        if !batch.is_empty() {
            sink.record(batch).await;
        }
        backlog.unrecorded.fetch_sub(received, std::sync::atomic::Ordering::AcqRel);
        backlog.recorded.notify_one();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Nothing,
    Deploy(Trigger),
}

#[derive(Debug)]
struct Entry {
    status: Status,
    desired: Digest,
    deployed: Option<Digest>,
    want: Want,
    /// Requirements whose dependents do not yet count them as deployed.
    waiting: usize,
    /// Whether this resource's dependents count it as deployed (their `waiting` excludes it).
    counted: bool,
    attempts: u32,
    last_error: Option<ActionError>,
    /// Queued in `ready` or a node queue (not yet running).
    queued: bool,
    last_deploy_at: Option<i64>,
    last_verified_at: Option<i64>,
    next_retry_at: Option<i64>,
    /// When its one live timer (retry or repair) is due; a timer in the heap whose due differs
    /// was superseded (rescheduled, or a new interval) and is ignored when it fires.
    timer: Option<Instant>,
}

/// A finished action, applied by resource id so that it lands even after a new version.
struct Done {
    resource: String,
    version: u64,
    executed_hash: Digest,
    trigger: Trigger,
    report: ActionReport,
}

struct Loop {
    ctx: CallContext,
    settings: Settings,
    version: Option<Arc<Version>>,
    entries: Vec<Entry>,
    by_id: HashMap<String, usize>,
    /// Deployed hash per resource id, across versions.
    deployed: HashMap<String, Digest>,
    /// Resource ids with an action in flight, and their node.
    in_flight: HashMap<String, String>,
    ready: VecDeque<usize>,
    node_queues: HashMap<String, VecDeque<usize>>,
    running_per_node: HashMap<String, usize>,
    running: usize,
    /// (due, version, index, repair?) — retries and self-healing.
    timers: BinaryHeap<Reverse<(Instant, u64, usize, bool)>>,
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    events: Outbox,
    settled: Vec<oneshot::Sender<Snapshot>>,
    halted: bool,
    /// Set by [`Command::Stop`]: the loop ends, answering this, once nothing runs.
    stopping: Option<oneshot::Sender<Snapshot>>,
}

impl Loop {
    fn new(ctx: CallContext, settings: Settings, halted: bool, known: HashMap<String, Digest>, events: Outbox) -> Loop {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Loop {
            ctx,
            settings,
            version: None,
            entries: Vec::new(),
            by_id: HashMap::new(),
            deployed: known,
            in_flight: HashMap::new(),
            ready: VecDeque::new(),
            node_queues: HashMap::new(),
            running_per_node: HashMap::new(),
            running: 0,
            timers: BinaryHeap::new(),
            done_tx,
            done_rx,
            events,
            settled: Vec::new(),
            halted,
            stopping: None,
        }
    }

    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut open = true;
        loop {
            self.dispatch();
            self.answer_settled();
            if self.running == 0 {
                if let Some(reply) = self.stopping.take() {
                    self.events.send(Outgoing::Settled(reply, self.snapshot()));
                    return;
                }
                if !open {
                    return;
                }
            }
            let next_timer = self.timers.peek().map(|Reverse((due, ..))| *due);
            let backlog = self.events.backlog.clone();
            let throttled = backlog.full();
            tokio::select! {
                biased;
                Some(done) = self.done_rx.recv() => {
                    self.finish(done);
                    // Apply every result that is already there before dispatching again.
                    while let Ok(done) = self.done_rx.try_recv() {
                        self.finish(done);
                    }
                }
                command = commands.recv(), if open => match command {
                    Some(c) => self.command(c),
                    None => open = false,
                },
                _ = sleep_until(next_timer) => self.fire_timers(),
                // Held back by the backlog: dispatch again once the writer has caught up a bit.
                _ = backlog.recorded.notified(), if throttled => {}
            }
        }
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Release(v) => self.release(v),
            Command::DeployFailed => {
                for i in 0..self.entries.len() {
                    if matches!(self.entries[i].status, Status::Failed | Status::Skipped | Status::Unavailable) {
                        self.want(i, Trigger::Deploy);
                    }
                }
            }
            Command::Repair => {
                for i in 0..self.entries.len() {
                    self.want(i, Trigger::Repair);
                }
            }
            Command::Settled(reply) => self.settled.push(reply),
            Command::Settings(settings) => self.apply_settings(settings),
            Command::Context(ctx) => self.ctx = ctx,
            Command::Halt(halted) => self.halted = halted,
            Command::Stop(reply) => {
                self.halted = true;
                self.stopping = Some(reply);
            }
        }
    }

    /// New settings. A changed repair interval reschedules self-healing of every deployed
    /// resource at once, so switching it on (or shortening it) does not wait for each resource's
    /// next action; switching it off cancels the pending repairs.
    fn apply_settings(&mut self, settings: Settings) {
        let interval_changed = settings.repair_interval != self.settings.repair_interval;
        self.settings = settings;
        if !interval_changed {
            return;
        }
        for i in 0..self.entries.len() {
            if self.entries[i].status == Status::Deployed {
                self.entries[i].timer = None;
                self.schedule_repair(i);
            }
        }
        // Drop what the reschedule superseded, so old intervals leave nothing behind.
        let entries = &self.entries;
        self.timers
            .retain(|Reverse((due, _, i, _))| entries.get(*i).is_some_and(|e| e.timer == Some(*due)));
    }

    fn release(&mut self, v: Arc<Version>) {
        let n = v.intent.resources.len();
        self.ready.clear();
        self.node_queues.clear();
        self.timers.clear();
        let by_id: HashMap<String, usize> = v.intent.resources.iter().enumerate().map(|(i, r)| (r.id.to_string(), i)).collect();
        let mut dropped: Vec<String> = std::mem::replace(&mut self.by_id, by_id)
            .into_keys()
            .filter(|id| !self.by_id.contains_key(id))
            .collect();
        dropped.sort_unstable();
        // Not managed any more: if a later version brings one back, it is deployed afresh (its
        // stored state is gone too).
        for id in &dropped {
            self.deployed.remove(id);
        }
        let number = v.number;
        self.entries = (0..n)
            .map(|i| {
                let id = v.intent.resources[i].id.to_string();
                let deployed = self.deployed.get(&id).copied();
                let desired = v.desired_hash(i);
                let up_to_date = deployed == Some(desired);
                Entry {
                    status: if up_to_date { Status::Deployed } else { Status::Available },
                    desired,
                    deployed,
                    want: if up_to_date { Want::Nothing } else { Want::Deploy(Trigger::Deploy) },
                    waiting: 0,
                    counted: up_to_date,
                    attempts: 0,
                    last_error: None,
                    queued: false,
                    last_deploy_at: None,
                    last_verified_at: None,
                    next_retry_at: None,
                    timer: None,
                }
            })
            .collect();
        for i in 0..n {
            self.entries[i].waiting = v.waits_for[i].iter().filter(|&&j| !self.entries[j].counted).count();
        }
        self.version = Some(v);
        for i in 0..n {
            let e = &self.entries[i];
            if e.status == Status::Deployed {
                self.schedule_repair(i);
            }
            self.emit_state(i);
            self.enqueue_if_ready(i);
        }
        self.events.send(Outgoing::Event(Event::Released { version: number, dropped }));
    }

    /// Marks a resource wanted; a deploy want is not downgraded to a repair.
    fn want(&mut self, i: usize, trigger: Trigger) {
        let e = &mut self.entries[i];
        if trigger == Trigger::Repair && matches!(e.want, Want::Deploy(_)) {
            return;
        }
        e.want = Want::Deploy(trigger);
        self.enqueue_if_ready(i);
    }

    fn enqueue_if_ready(&mut self, i: usize) {
        let Some(v) = &self.version else { return };
        let e = &mut self.entries[i];
        let id = v.intent.resources[i].id.to_string();
        if e.want != Want::Nothing && e.waiting == 0 && !e.queued && !self.in_flight.contains_key(&id) {
            e.queued = true;
            self.ready.push_back(i);
        }
    }

    /// Starts ready work within the environment's and each node's limits.
    fn dispatch(&mut self) {
        if self.halted || self.events.backlog.full() {
            return;
        }
        let Some(v) = self.version.clone() else { return };
        // Node queues first: they hold work that was ready before.
        let mut starts = Vec::new();
        let nodes: Vec<String> = self.node_queues.keys().cloned().collect();
        for node in nodes {
            while self.running < self.settings.env_concurrency && self.node_free(&node) {
                let Some(i) = self.node_queues.get_mut(&node).and_then(VecDeque::pop_front) else {
                    break;
                };
                self.start(&v, i, &mut starts);
            }
        }
        self.node_queues.retain(|_, q| !q.is_empty());
        while self.running < self.settings.env_concurrency {
            let Some(i) = self.ready.pop_front() else { break };
            let node = v.intent.resources[i].id.node.clone();
            if self.node_free(&node) {
                self.start(&v, i, &mut starts);
            } else {
                self.node_queues.entry(node).or_default().push_back(i);
            }
        }
        for (i, trigger) in starts {
            let (plugin, ctx, spec, tx) = (
                v.plugins[i].clone(),
                self.ctx.clone(),
                v.intent.resources[i].clone(),
                self.done_tx.clone(),
            );
            let (version, executed_hash) = (v.number, v.desired_hash(i));
            tokio::spawn(async move {
                let report = executor::execute(&plugin, &ctx, &spec, Mode::Deploy).await;
                let _ = tx.send(Done {
                    resource: spec.id.to_string(),
                    version,
                    executed_hash,
                    trigger,
                    report,
                });
            });
        }
    }

    fn node_free(&self, node: &str) -> bool {
        self.running_per_node.get(node).copied().unwrap_or(0) < self.settings.node_concurrency
    }

    fn start(&mut self, v: &Version, i: usize, starts: &mut Vec<(usize, Trigger)>) {
        let e = &mut self.entries[i];
        e.queued = false;
        let Want::Deploy(trigger) = std::mem::replace(&mut e.want, Want::Nothing) else {
            return;
        };
        let trigger = if trigger == Trigger::Deploy && e.attempts > 0 {
            Trigger::Retry
        } else {
            trigger
        };
        e.status = Status::Deploying;
        let spec = &v.intent.resources[i];
        self.in_flight.insert(spec.id.to_string(), spec.id.node.clone());
        *self.running_per_node.entry(spec.id.node.clone()).or_default() += 1;
        self.running += 1;
        starts.push((i, trigger));
        self.emit_state(i);
    }

    fn finish(&mut self, done: Done) {
        self.running -= 1;
        if let Some(node) = self.in_flight.remove(&done.resource)
            && let Some(n) = self.running_per_node.get_mut(&node)
        {
            *n -= 1;
        }
        let Some(v) = self.version.clone() else { return };
        let succeeded = done.report.outcome.succeeded();
        let managed = self.by_id.contains_key(&done.resource);
        let outcome = done.report.outcome;
        let error = done.report.error.clone();
        self.events.send(Outgoing::Event(Event::Action {
            version: done.version,
            trigger: done.trigger,
            report: done.report,
        }));
        if succeeded && managed {
            self.deployed.insert(done.resource.clone(), done.executed_hash);
        }
        let Some(&i) = self.by_id.get(&done.resource) else { return };
        let e = &mut self.entries[i];
        if e.desired != done.executed_hash {
            // Superseded while running: the new desired state still has to be deployed.
            if succeeded {
                e.deployed = Some(done.executed_hash);
            }
            e.status = Status::Available;
            e.want = Want::Deploy(Trigger::Deploy);
            self.emit_state(i);
            self.enqueue_if_ready(i);
            return;
        }
        if succeeded {
            let newly = !e.counted;
            e.counted = true;
            e.status = Status::Deployed;
            e.deployed = Some(done.executed_hash);
            e.attempts = 0;
            e.last_error = None;
            let now = crate::store::now_ms();
            e.last_deploy_at = Some(now);
            e.last_verified_at = Some(now);
            e.next_retry_at = None;
            self.emit_state(i);
            self.schedule_repair(i);
            if newly {
                for &d in &v.blocks[i] {
                    self.entries[d].waiting -= 1;
                    if self.entries[d].waiting == 0 {
                        if self.entries[d].status == Status::Skipped {
                            self.entries[d].status = Status::Available;
                            self.emit_state(d);
                        }
                        self.enqueue_if_ready(d);
                    }
                }
            }
        } else {
            e.status = if outcome == Outcome::Unavailable {
                Status::Unavailable
            } else {
                Status::Failed
            };
            e.attempts += 1;
            e.last_error = error;
            e.last_deploy_at = Some(crate::store::now_ms());
            let attempts = e.attempts;
            if std::mem::replace(&mut e.counted, false) {
                // It had been deployed (a repair failed): dependents wait for it again.
                for &d in &v.blocks[i] {
                    self.entries[d].waiting += 1;
                }
            }
            self.schedule_retry(i, attempts);
            self.emit_state(i);
            self.skip_dependents(&v, i);
        }
    }

    /// Marks everything downstream of a failure `skipped`; each waits for one more requirement.
    fn skip_dependents(&mut self, v: &Version, failed: usize) {
        let mut stack: Vec<usize> = v.blocks[failed].clone();
        while let Some(d) = stack.pop() {
            let e = &mut self.entries[d];
            if e.status == Status::Skipped || e.status == Status::Deploying {
                continue;
            }
            if e.status != Status::Deployed || e.want != Want::Nothing {
                e.status = Status::Skipped;
                e.queued = false;
                self.ready.retain(|&x| x != d);
                let because = format!("`{}` did not succeed", v.intent.resources[failed].id);
                e.last_error = Some(ActionError {
                    code: "skipped".into(),
                    message: format!("not attempted: {because}"),
                });
                self.emit_state(d);
                stack.extend(v.blocks[d].iter().copied());
            }
        }
    }

    fn schedule_retry(&mut self, i: usize, attempts: u32) {
        let Some(v) = &self.version else { return };
        let base = self
            .settings
            .retry_interval
            .saturating_mul(1 << (attempts.saturating_sub(1)).min(16));
        let delay = jitter(base.min(self.settings.max_retry_interval), i);
        let due = Instant::now() + delay;
        self.entries[i].next_retry_at = Some(crate::store::now_ms() + delay.as_millis() as i64);
        self.entries[i].timer = Some(due);
        self.timers.push(Reverse((due, v.number, i, false)));
    }

    fn schedule_repair(&mut self, i: usize) {
        let (Some(v), Some(interval)) = (&self.version, self.settings.repair_interval) else {
            return;
        };
        let due = Instant::now() + jitter(interval, i);
        self.entries[i].timer = Some(due);
        self.timers.push(Reverse((due, v.number, i, true)));
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        let current = self.version.as_ref().map(|v| v.number);
        while let Some(Reverse((due, version, i, repair))) = self.timers.peek().copied() {
            if due > now {
                break;
            }
            self.timers.pop();
            if Some(version) != current || self.entries[i].timer != Some(due) {
                continue;
            }
            self.entries[i].timer = None;
            let status = self.entries[i].status;
            if repair && status == Status::Deployed {
                self.want(i, Trigger::Repair);
            } else if !repair && matches!(status, Status::Failed | Status::Unavailable) {
                self.want(i, Trigger::Deploy);
            }
        }
    }

    fn emit_state(&self, i: usize) {
        let Some(v) = &self.version else { return };
        let e = &self.entries[i];
        self.events.send(Outgoing::Event(Event::State(ResourceState {
            resource: v.intent.resources[i].id.to_string(),
            version: v.number,
            status: e.status,
            desired_hash: e.desired,
            deployed_hash: e.deployed,
            attempts: e.attempts,
            last_error: e.last_error.clone(),
            last_deploy_at: e.last_deploy_at,
            last_verified_at: e.last_verified_at,
            next_retry_at: e.next_retry_at,
        })));
    }

    fn answer_settled(&mut self) {
        let waiting = !self.halted && (!self.ready.is_empty() || !self.node_queues.is_empty());
        if self.settled.is_empty() || self.running > 0 || waiting {
            return;
        }
        let snapshot = self.snapshot();
        for reply in self.settled.drain(..) {
            self.events.send(Outgoing::Settled(reply, snapshot.clone()));
        }
    }

    fn snapshot(&self) -> Snapshot {
        let mut counts: HashMap<Status, usize> = HashMap::new();
        for e in &self.entries {
            *counts.entry(e.status).or_default() += 1;
        }
        let mut counts: Vec<(Status, usize)> = counts.into_iter().collect();
        counts.sort_by_key(|(s, _)| *s);
        Snapshot {
            version: self.version.as_ref().map(|v| v.number),
            counts,
        }
    }
}

/// ±10 % spread, deterministic per resource, so retries and repairs of many resources do not
/// all fire at once.
fn jitter(base: Duration, i: usize) -> Duration {
    let spread = (i.wrapping_mul(2_654_435_761) % 2001) as f64 / 10_000.0 - 0.1;
    base.mul_f64(1.0 + spread)
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due.into()).await,
        None => std::future::pending().await,
    }
}

/// Dryrun of a whole version: every resource read and diffed through its adaptor, nothing
/// enforced, `concurrency` at once; reports in intent order.
pub async fn dryrun(version: &Version, ctx: &CallContext, concurrency: usize) -> Vec<ActionReport> {
    dryrun_limited(version, ctx, concurrency, concurrency).await
}

/// [`dryrun`] with at most `per_node` actions at once on any one node, as a deploy has: reads
/// of a whole environment on one node's single SSH connection only queue up there otherwise.
pub async fn dryrun_limited(version: &Version, ctx: &CallContext, concurrency: usize, per_node: usize) -> Vec<ActionReport> {
    dryrun_each(version, ctx, concurrency, per_node, |report| report).await
}

/// [`dryrun_limited`] with each report turned into what the caller keeps as soon as it is made
/// (a server's dryrun of 100,000 resources held every report and then its findings: ~75 MiB).
pub async fn dryrun_each<T>(
    version: &Version,
    ctx: &CallContext,
    concurrency: usize,
    per_node: usize,
    keep: impl FnMut(ActionReport) -> T,
) -> Vec<T> {
    use futures::StreamExt;
    let mut nodes: HashMap<&str, Arc<tokio::sync::Semaphore>> = HashMap::new();
    let limits: Vec<Arc<tokio::sync::Semaphore>> = version
        .intent
        .resources
        .iter()
        .map(|r| {
            nodes
                .entry(r.id.node.as_str())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(per_node.max(1))))
                .clone()
        })
        .collect();
    futures::stream::iter(0..version.intent.resources.len())
        .map(|i| {
            let (plugin, ctx, spec) = (version.plugins[i].clone(), ctx.clone(), version.intent.resources[i].clone());
            let limit = limits[i].clone();
            tokio::spawn(async move {
                let _turn = limit.acquire_owned().await.expect("the node's limit is never closed");
                executor::execute(&plugin, &ctx, &spec, Mode::Dryrun).await
            })
        })
        .buffered(concurrency.max(1))
        .map(|joined| joined.expect("resource actions do not panic"))
        .map(keep)
        .collect()
        .await
}

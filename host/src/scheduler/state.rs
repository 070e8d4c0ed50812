//! The scheduler's loop: the in-memory state of every resource of the released version, and the
//! one dispatcher that starts wanted resources in dependency order within the limits.
//!
//! How a trigger that arrives while a resource's action is in flight is honoured: it is kept as
//! the resource's *want* (never dropped because the resource is busy) and applied when the action
//! finishes — a repair or user deploy runs the resource again right after (the action in flight
//! may have read the device before the trigger); a new version whose desired state differs runs
//! it again with that state; a new version with the same desired state is served by the action
//! in flight; halt holds the want, resume starts it. A queued want survives a new version that
//! keeps the resource.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use orc_manifest::Digest;
use orc_runtime::CallContext;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::actions::Actions;
use super::timers::{self, Kind, Timer, Timers};
use super::writer::{Outbox, Outgoing};
use super::{Command, Event, Inspected, Inspection, ResourceState, Settings, Snapshot, Status, Trigger, Version};
use crate::executor::{self, ActionError, ActionReport, Mode, Outcome};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Want {
    #[default]
    Nothing,
    Deploy(Trigger),
}

/// One resource of the released version, by index (its desired hash is the version's,
/// [`Version::desired_hash`]). Kept small: a version of 100,000 resources holds 100,000.
#[derive(Debug)]
struct Entry {
    status: Status,
    deployed: Option<Digest>,
    want: Want,
    /// Requirements whose dependents do not yet count them as deployed.
    waiting: usize,
    /// Whether this resource's dependents count it as deployed (their `waiting` excludes it).
    counted: bool,
    attempts: u32,
    /// Boxed: most resources have none, and inline it would take 48 bytes of every entry.
    last_error: Option<Box<ActionError>>,
    /// Queued in `ready` or a node queue (not yet running).
    queued: bool,
    last_deploy_at: Option<i64>,
    last_verified_at: Option<i64>,
    next_retry_at: Option<i64>,
    /// When it was last found in its desired state (on the scheduler's clock): self-healing is
    /// due `repair_interval` after it, also across versions.
    verified: Option<Instant>,
    /// When its one live timer (retry or repair) is due; a timer in the heap whose due differs
    /// was superseded (rescheduled, or a new interval) and is ignored when it fires.
    timer: Option<Instant>,
}

/// What a resource of the previous version carries into the next one.
#[derive(Default)]
struct Carried {
    want: Want,
    verified: Option<Instant>,
    /// The hash it is deployed at, if its stored state says no more than that (deployed, no
    /// attempts, no error, no retry due): a release that wants the same leaves the state as is.
    settled: Option<Digest>,
}

/// An action in flight, by resource id (it outlives the version that started it).
struct Flight {
    node: String,
    hash: Digest,
}

/// A finished action, applied by resource id so that it lands even after a new version.
struct Done {
    resource: String,
    version: u64,
    executed_hash: Digest,
    trigger: Trigger,
    report: ActionReport,
}

pub(super) struct Loop {
    ctx: CallContext,
    settings: Settings,
    actions: Arc<dyn Actions>,
    version: Option<Arc<Version>>,
    entries: Vec<Entry>,
    /// Index by resource id. An id's text is shared (one allocation) with `deployed`.
    by_id: HashMap<Arc<str>, usize>,
    /// Deployed hash per resource id, across versions.
    deployed: HashMap<Arc<str>, Digest>,
    in_flight: HashMap<String, Flight>,
    ready: VecDeque<usize>,
    node_queues: HashMap<String, VecDeque<usize>>,
    running_per_node: HashMap<String, usize>,
    running: usize,
    /// Actions finished (applied) since the loop started.
    finished: u64,
    timers: Timers,
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    events: Outbox,
    settled: Vec<oneshot::Sender<Snapshot>>,
    halted: bool,
    /// Set by [`Command::Stop`]: the loop ends, answering this, once nothing runs.
    stopping: Option<oneshot::Sender<Snapshot>>,
}

impl Loop {
    pub(super) fn new(
        ctx: CallContext,
        settings: Settings,
        halted: bool,
        known: HashMap<String, Digest>,
        actions: Arc<dyn Actions>,
        events: Outbox,
    ) -> Loop {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Loop {
            ctx,
            settings,
            actions,
            version: None,
            entries: Vec::new(),
            by_id: HashMap::new(),
            deployed: known.into_iter().map(|(id, hash)| (Arc::from(id), hash)).collect(),
            in_flight: HashMap::new(),
            ready: VecDeque::new(),
            node_queues: HashMap::new(),
            running_per_node: HashMap::new(),
            running: 0,
            finished: 0,
            timers: Timers::default(),
            done_tx,
            done_rx,
            events,
            settled: Vec::new(),
            halted,
            stopping: None,
        }
    }

    pub(super) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
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
            let next_timer = self.timers.next_due();
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
            Command::Release(v, receipt) => {
                self.release(v);
                if let Some(reply) = receipt {
                    self.events.send(Outgoing::Recorded(reply));
                }
            }
            Command::DeployFailed => {
                for i in 0..self.entries.len() {
                    if matches!(self.entries[i].status, Status::Failed | Status::Skipped | Status::Unavailable) {
                        self.want(i, Trigger::Deploy);
                    }
                }
            }
            Command::NodeBack(node) => {
                let Some(v) = self.version.clone() else { return };
                for (i, spec) in v.intent.resources.iter().enumerate() {
                    if spec.id.node == node && matches!(self.entries[i].status, Status::Failed | Status::Skipped | Status::Unavailable) {
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
            Command::Inspect(reply) => {
                let _ = reply.send(self.inspect());
            }
        }
    }

    /// New settings. A changed repair interval reschedules self-healing of every deployed
    /// resource at once (from when each was last verified), so switching it on or shortening it
    /// does not wait for each resource's next action; switching it off cancels the pending
    /// repairs.
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
        self.timers.retain(|t| entries.get(t.index).is_some_and(|e| e.timer == Some(t.due)));
    }

    fn release(&mut self, v: Arc<Version>) {
        let n = v.intent.resources.len();
        self.ready.clear();
        self.node_queues.clear();
        self.timers.clear();
        // Each id's text once: the one `deployed` holds already, else a new one it will share.
        let by_id: HashMap<Arc<str>, usize> = v
            .intent
            .resources
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let text = r.id.to_string();
                let id = match self.deployed.get_key_value(text.as_str()) {
                    Some((shared, _)) => shared.clone(),
                    None => Arc::from(text),
                };
                (id, i)
            })
            .collect();
        let previous_ids = std::mem::replace(&mut self.by_id, by_id);
        let previous_entries = std::mem::take(&mut self.entries);
        // Every state is handed over at the first release, and after the sink could not take a
        // batch; otherwise only those that change (see `Event::Released`).
        let complete = self.version.is_none() || self.events.backlog.in_doubt();
        // What the previous version's resources carry into this one: a want not yet served, when
        // each was last verified, and the hash it is deployed at if its stored state says no
        // more than that (deployed, no attempts, no error, no retry due).
        let mut carried: HashMap<Arc<str>, Carried> = HashMap::new();
        let mut dropped = Vec::new();
        for (id, i) in previous_ids {
            if self.by_id.contains_key(&id) {
                let e = &previous_entries[i];
                let settled = self.version.as_ref().and_then(|previous| {
                    let desired = previous.desired_hash(i);
                    let quiet = e.status == Status::Deployed
                        && e.deployed == Some(desired)
                        && e.attempts == 0
                        && e.last_error.is_none()
                        && e.next_retry_at.is_none();
                    quiet.then_some(desired)
                });
                carried.insert(
                    id,
                    Carried {
                        want: e.want,
                        verified: e.verified,
                        settled,
                    },
                );
            } else {
                dropped.push(id.to_string());
            }
        }
        dropped.sort_unstable();
        // Not managed any more: if a later version brings one back, it is deployed afresh (its
        // stored state is gone too).
        for id in &dropped {
            self.deployed.remove(id.as_str());
        }
        let number = v.number;
        let now = Instant::now();
        // Resources whose stored state this release leaves as it is (but for its version).
        let mut unchanged = vec![false; n];
        self.entries = (0..n)
            .map(|i| {
                let id = v.intent.resources[i].id.to_string();
                let deployed = self.deployed.get(id.as_str()).copied();
                let desired = v.desired_hash(i);
                let up_to_date = deployed == Some(desired);
                let Carried {
                    want: kept,
                    verified,
                    settled,
                } = carried.remove(id.as_str()).unwrap_or_default();
                let flight = self.in_flight.get(&id).map(|f| f.hash);
                let (status, want) = match flight {
                    // The action in flight deploys this very state: it serves the release.
                    Some(hash) if hash == desired => (Status::Deploying, kept),
                    Some(_) => (Status::Deploying, Want::Deploy(Trigger::Deploy)),
                    None if up_to_date => (Status::Deployed, kept),
                    None => (Status::Available, Want::Deploy(Trigger::Deploy)),
                };
                // In flight with another desired state, it is not deployed as this version wants
                // until it has run again: its dependents wait.
                let counted = up_to_date && flight.is_none_or(|hash| hash == desired);
                unchanged[i] = !complete && status == Status::Deployed && settled == Some(desired) && deployed == Some(desired);
                Entry {
                    status,
                    deployed,
                    want,
                    waiting: 0,
                    counted,
                    attempts: 0,
                    last_error: None,
                    queued: false,
                    last_deploy_at: None,
                    last_verified_at: None,
                    next_retry_at: None,
                    verified: if up_to_date { verified.or(Some(now)) } else { None },
                    timer: None,
                }
            })
            .collect();
        for i in 0..n {
            self.entries[i].waiting = v.waits_for.of(i).iter().filter(|&&j| !self.entries[j].counted).count();
        }
        self.version = Some(v);
        for (i, unchanged) in unchanged.into_iter().enumerate() {
            if self.entries[i].status == Status::Deployed {
                self.schedule_repair(i);
            }
            if !unchanged {
                self.emit_state(i);
            }
            self.enqueue_if_ready(i);
        }
        self.events.event(Event::Released {
            version: number,
            dropped,
            complete,
        });
    }

    /// Marks a resource wanted; a deploy want is not downgraded to a repair. A resource in flight
    /// keeps the want until its action finishes ([`Loop::finish`] queues it then).
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
        if e.want != Want::Nothing && e.waiting == 0 && !e.queued && e.status != Status::Deploying {
            let id = v.intent.resources[i].id.to_string();
            debug_assert!(
                !self.in_flight.contains_key(&id),
                "a resource not deploying has no action in flight"
            );
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
            let action = self.actions.deploy(plugin, ctx, spec);
            let resource = v.intent.resources[i].id.to_string();
            tokio::spawn(async move {
                let report = executor::caught(&resource, Mode::Deploy, action).await;
                let _ = tx.send(Done {
                    resource,
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
        // Skipped while queued (a requirement failed): it waits for the requirement again.
        if e.waiting > 0 {
            return;
        }
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
        self.in_flight.insert(
            spec.id.to_string(),
            Flight {
                node: spec.id.node.clone(),
                hash: v.desired_hash(i),
            },
        );
        *self.running_per_node.entry(spec.id.node.clone()).or_default() += 1;
        self.running += 1;
        starts.push((i, trigger));
        self.emit_state(i);
    }

    fn finish(&mut self, done: Done) {
        self.running -= 1;
        self.finished += 1;
        if let Some(flight) = self.in_flight.remove(&done.resource)
            && let Some(n) = self.running_per_node.get_mut(&flight.node)
        {
            *n -= 1;
        }
        let Some(v) = self.version.clone() else { return };
        let succeeded = done.report.outcome.succeeded();
        let outcome = done.report.outcome;
        let error = done.report.error.clone();
        // Recorded in one batch with the resource's next state, never apart: a crash between two
        // batches must not keep an action whose resource is still stored `deploying` (its next
        // owner would deploy it again and log it twice).
        let action = Event::Action {
            version: done.version,
            trigger: done.trigger,
            report: done.report,
        };
        // Only a resource of the released version is remembered as deployed (one dropped
        // while its action ran is not managed any more).
        if succeeded && let Some((id, _)) = self.by_id.get_key_value(done.resource.as_str()) {
            self.deployed.insert(id.clone(), done.executed_hash);
        }
        let Some(&i) = self.by_id.get(done.resource.as_str()) else {
            self.events.event(action);
            return;
        };
        let e = &mut self.entries[i];
        if v.desired_hash(i) != done.executed_hash {
            // Superseded while running: the new desired state still has to be deployed.
            if succeeded {
                e.deployed = Some(done.executed_hash);
            }
            e.status = Status::Available;
            e.want = Want::Deploy(Trigger::Deploy);
            self.emit_state_after(i, action);
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
            e.verified = Some(Instant::now());
            self.emit_state_after(i, action);
            self.schedule_repair(i);
            if newly {
                for &d in v.blocks.of(i) {
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
            // A failed action may have changed part of what it was deploying (a restart that
            // stopped the old server, then could not start the new one): the device is in no
            // state known to be deployed, so a version asking for the old state again (a
            // rollback) must run it again rather than trust the hash of what ran before.
            e.deployed = None;
            self.deployed.remove(done.resource.as_str());
            e.status = if outcome == Outcome::Unavailable {
                Status::Unavailable
            } else {
                Status::Failed
            };
            e.attempts = e.attempts.saturating_add(1);
            e.last_error = error.map(Box::new);
            e.last_deploy_at = Some(crate::store::now_ms());
            e.verified = None;
            let attempts = e.attempts;
            if std::mem::replace(&mut e.counted, false) {
                // It had been deployed (a repair failed): dependents wait for it again.
                for &d in v.blocks.of(i) {
                    self.entries[d].waiting += 1;
                }
            }
            self.schedule_retry(i, attempts);
            self.emit_state_after(i, action);
            self.skip_dependents(&v, i);
        }
        // A trigger that arrived while the action ran (a repair, a user deploy) is owed an action
        // that starts after it.
        self.enqueue_if_ready(i);
    }

    /// Marks everything downstream of a failure `skipped`; each waits for one more requirement.
    fn skip_dependents(&mut self, v: &Version, failed: usize) {
        let mut stack: Vec<usize> = v.blocks.of(failed).to_vec();
        while let Some(d) = stack.pop() {
            let e = &mut self.entries[d];
            if e.status == Status::Skipped || e.status == Status::Deploying {
                continue;
            }
            if e.status != Status::Deployed || e.want != Want::Nothing {
                e.status = Status::Skipped;
                // Not deployed: it is owed a deploy once its requirements recover (a failed
                // resource waiting for its retry timer would otherwise wait for nothing).
                if e.want == Want::Nothing {
                    e.want = Want::Deploy(Trigger::Deploy);
                }
                // Skipped is not deployed: its own dependents wait for it again.
                if std::mem::replace(&mut e.counted, false) {
                    for &dd in v.blocks.of(d) {
                        self.entries[dd].waiting += 1;
                    }
                }
                let e = &mut self.entries[d];
                // Left in its queue if it is there: `start` passes over it while it waits.
                let because = format!("`{}` did not succeed", v.intent.resources[failed].id);
                e.last_error = Some(Box::new(ActionError {
                    code: "skipped".into(),
                    message: format!("not attempted: {because}"),
                }));
                self.emit_state(d);
                stack.extend(v.blocks.of(d).iter().copied());
            }
        }
    }

    fn schedule_retry(&mut self, i: usize, attempts: u32) {
        let Some(v) = &self.version else { return };
        let s = &self.settings;
        let delay = timers::retry_delay(s.retry_interval, s.max_retry_interval, attempts, i);
        let due = timers::after(Instant::now(), delay);
        let e = &mut self.entries[i];
        e.next_retry_at = due.map(|_| timers::wall_ms_after(delay));
        e.timer = due;
        if let Some(due) = due {
            self.timers.push(Timer {
                due,
                version: v.number,
                index: i,
                kind: Kind::Retry,
            });
        }
    }

    /// Self-healing of a deployed resource, `repair_interval` (with jitter) after it was last
    /// verified.
    fn schedule_repair(&mut self, i: usize) {
        let (Some(v), Some(interval)) = (&self.version, self.settings.repair_interval) else {
            return;
        };
        let e = &mut self.entries[i];
        let since = e.verified.unwrap_or_else(Instant::now);
        let due = timers::after(since, timers::jitter(interval, i));
        e.timer = due;
        if let Some(due) = due {
            self.timers.push(Timer {
                due,
                version: v.number,
                index: i,
                kind: Kind::Repair,
            });
        }
    }

    fn fire_timers(&mut self) {
        let current = self.version.as_ref().map(|v| v.number);
        for t in self.timers.pop_due(Instant::now()) {
            if Some(t.version) != current || self.entries[t.index].timer != Some(t.due) {
                continue;
            }
            let i = t.index;
            self.entries[i].timer = None;
            let status = self.entries[i].status;
            match t.kind {
                Kind::Repair if status == Status::Deployed => self.want(i, Trigger::Repair),
                Kind::Retry if matches!(status, Status::Failed | Status::Unavailable) => self.want(i, Trigger::Deploy),
                // In flight (its end schedules the next timer) or no longer due.
                _ => {}
            }
        }
    }

    fn emit_state(&self, i: usize) {
        if let Some(state) = self.state_event(i) {
            self.events.event(state);
        }
    }

    /// `action`, then resource `i`'s state, to be recorded in one batch.
    fn emit_state_after(&self, i: usize, action: Event) {
        match self.state_event(i) {
            Some(state) => self.events.events(vec![action, state]),
            None => self.events.event(action),
        }
    }

    fn state_event(&self, i: usize) -> Option<Event> {
        let v = self.version.as_ref()?;
        let e = &self.entries[i];
        Some(Event::State(ResourceState {
            resource: v.intent.resources[i].id.to_string(),
            version: v.number,
            status: e.status,
            desired_hash: v.desired_hash(i),
            deployed_hash: e.deployed,
            attempts: e.attempts,
            last_error: e.last_error.as_deref().cloned(),
            last_deploy_at: e.last_deploy_at,
            last_verified_at: e.last_verified_at,
            next_retry_at: e.next_retry_at,
        }))
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

    fn inspect(&self) -> Inspection {
        let resources = match &self.version {
            None => Vec::new(),
            Some(v) => self
                .entries
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let id = v.intent.resources[i].id.to_string();
                    Inspected {
                        in_flight: self.in_flight.contains_key(&id),
                        resource: id,
                        node: v.intent.resources[i].id.node.clone(),
                        status: e.status,
                        wanted: match e.want {
                            Want::Nothing => None,
                            Want::Deploy(t) => Some(t),
                        },
                        waiting: e.waiting,
                        desired_hash: v.desired_hash(i),
                        deployed_hash: e.deployed,
                        timer_in: e.timer.map(|t| t.saturating_duration_since(Instant::now())),
                    }
                })
                .collect(),
        };
        Inspection {
            version: self.version.as_ref().map(|v| v.number),
            halted: self.halted,
            throttled: self.events.backlog.full(),
            running: self.running,
            finished: self.finished,
            running_per_node: self
                .running_per_node
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| (k.clone(), *n))
                .collect(),
            in_flight: self.in_flight.keys().cloned().collect(),
            resources,
        }
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

//! The scheduler against a reference model: random sequences of triggers (new versions, user
//! deploy and repair, a node answering again, halt and resume, retry and self-healing timers on a
//! paused clock) and of
//! action completions in random order with random outcomes (changed, unchanged, failed,
//! unavailable, a panic), checked after every step, then drained: every trigger must have been
//! honoured. The actions are the test's own (`Actions`): it decides when each finishes and how.
//!
//! What is checked after every step:
//! - limits: never more actions than the environment's and each node's limit, never two at once
//!   for one resource;
//! - order: an action starts only when everything its resource waits for is deployed;
//! - honesty: a resource is `deploying` exactly while its action runs;
//! - no lost want: while not halted, nothing wanted and ready waits with a free slot;
//! - timers: every deployed resource has its self-healing timer, every failed one its retry.
//!
//! And at the end, with every node back and every action succeeding: every resource is deployed
//! at its desired hash, every repair requested was followed by an action that started after
//! it, and what the sink recorded is what the scheduler says.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use orc_host::executor::{ActionReport, Mode, Outcome};
use orc_host::intent::{Intent, ResourceSpec};
use orc_host::scheduler::{
    Actions, BoxFuture, Event, Inspection, ResourceStatus as Status, Scheduler, Settings, Sink, Start, Version, desired_hash,
};
use orc_manifest::{Digest, PluginKind};
use orc_runtime::{CallContext, Grants, Plugin, Runtime, RuntimeConfig};
use proptest::prelude::*;
use serde_json::json;
use tokio::sync::oneshot;

use super::Recorder;

/// Resources the versions draw from: `R` ids on two nodes.
const R: usize = 6;
const ENV_LIMIT: usize = 3;
const NODE_LIMIT: usize = 2;
const RETRY: Duration = Duration::from_secs(5);
const MAX_RETRY: Duration = Duration::from_secs(20);
const REPAIR: Duration = Duration::from_secs(30);

fn id(r: usize) -> String {
    format!("bench-memory[n{},r{r}]", r % 2)
}

/// How the test ends an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Changed,
    Unchanged,
    Failed,
    Unavailable,
    Panic,
}

#[derive(Debug, Clone)]
enum Op {
    /// A new version: per resource of the universe, absent or (value, purged); edges `(a, b)`:
    /// `a` requires `b` (b < a, so no cycle).
    Release(Vec<Option<(u8, bool)>>, Vec<(usize, usize)>),
    Repair,
    DeployFailed,
    /// Node `n{0 % 2}` answers again: what failed there is wanted now.
    NodeBack(usize),
    Halt,
    Resume,
    /// Finish the `n`-th (mod the number) action in flight.
    Finish(usize, End),
    /// Move the clock (retry and self-healing timers).
    Advance(Duration),
}

fn end() -> impl Strategy<Value = End> {
    prop_oneof![
        4 => Just(End::Changed),
        2 => Just(End::Unchanged),
        2 => Just(End::Failed),
        1 => Just(End::Unavailable),
        1 => Just(End::Panic),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let resources = proptest::collection::vec(proptest::option::weighted(0.8, (0u8..3, proptest::bool::weighted(0.15))), R);
    let edges = proptest::collection::vec((1..R, 0..R), 0..5).prop_map(|e| e.into_iter().filter(|(a, b)| b < a).collect());
    prop_oneof![
        2 => (resources, edges).prop_map(|(r, e)| Op::Release(r, e)),
        2 => Just(Op::Repair),
        1 => Just(Op::DeployFailed),
        1 => (0usize..2).prop_map(Op::NodeBack),
        1 => Just(Op::Halt),
        1 => Just(Op::Resume),
        10 => (any::<usize>(), end()).prop_map(|(n, e)| Op::Finish(n, e)),
        2 => (1u64..40).prop_map(|s| Op::Advance(Duration::from_secs(s))),
    ]
}

/// The one adaptor every resource names; the test's actions never call it.
fn plugin() -> Arc<Plugin> {
    static PLUGIN: OnceLock<(Runtime, Arc<Plugin>)> = OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            let runtime = Runtime::new(RuntimeConfig {
                max_instances: 4,
                ..RuntimeConfig::default()
            })
            .unwrap();
            let artifact = &orc_plugin_artifacts::BENCH_MEMORY;
            let digest: Digest = artifact.digest.parse().unwrap();
            let plugin = runtime
                .load_bytes(&digest, artifact.bytes, PluginKind::Adaptor, &Grants::all())
                .unwrap();
            (runtime, plugin)
        })
        .1
        .clone()
}

/// An action the test has not finished yet.
struct Running {
    resource: String,
    hash: Digest,
    /// The step during which it started.
    step: u64,
    end: oneshot::Sender<End>,
}

/// The test's actions: each waits for the test to say how it ends.
#[derive(Default)]
struct Controlled {
    running: Mutex<Vec<Running>>,
    /// (resource, step) of every start.
    starts: Mutex<Vec<(String, u64)>>,
    step: AtomicU64,
    violations: Mutex<Vec<String>>,
}

/// The scheduler's handle on [`Controlled`].
struct TestActions(Arc<Controlled>);

impl Actions for TestActions {
    fn deploy(&self, plugin: Arc<Plugin>, _ctx: CallContext, spec: ResourceSpec) -> BoxFuture<'static, ActionReport> {
        self.0.deploy(&plugin, spec)
    }
}

impl Controlled {
    fn deploy(&self, plugin: &Plugin, spec: ResourceSpec) -> BoxFuture<'static, ActionReport> {
        let resource = spec.id.to_string();
        let (tx, rx) = oneshot::channel();
        {
            let mut running = self.running.lock().unwrap();
            if running.iter().any(|r| r.resource == resource) {
                self.violations.lock().unwrap().push(format!("two actions at once for {resource}"));
            }
            running.push(Running {
                resource: resource.clone(),
                hash: desired_hash(&spec, &plugin.digest),
                step: self.step.load(Ordering::SeqCst),
                end: tx,
            });
        }
        self.starts
            .lock()
            .unwrap()
            .push((resource.clone(), self.step.load(Ordering::SeqCst)));
        Box::pin(async move {
            let end = rx.await.unwrap_or(End::Failed);
            let outcome = match end {
                End::Changed => Outcome::Changed,
                End::Unchanged => Outcome::Unchanged,
                End::Failed => Outcome::Failed,
                End::Unavailable => Outcome::Unavailable,
                End::Panic => panic!("the test's action panics for {resource}"),
            };
            ActionReport {
                resource,
                mode: Mode::Deploy,
                outcome,
                changes: Vec::new(),
                messages: Vec::new(),
                error: None,
                started_at: 0,
                duration: Duration::ZERO,
            }
        })
    }
}

/// What the model knows.
#[derive(Default)]
struct Model {
    version: Option<Arc<Version>>,
    /// Resource id → the step after which an action must start (a repair was requested).
    owed_after: HashMap<String, u64>,
    halted: bool,
    finished: u64,
}

struct Run {
    scheduler: Scheduler,
    actions: Arc<Controlled>,
    recorder: Arc<Recorder>,
    model: Model,
    number: u64,
    log: Vec<String>,
}

/// The limits and intervals of the runs, with `env` and `node` as the concurrency limits.
fn settings(env: usize, node: usize) -> Settings {
    Settings {
        env_concurrency: env,
        node_concurrency: node,
        retry_interval: RETRY,
        max_retry_interval: MAX_RETRY,
        repair_interval: Some(REPAIR),
    }
}

impl Run {
    fn new() -> Run {
        Run::with(settings(ENV_LIMIT, NODE_LIMIT))
    }

    fn with(settings: Settings) -> Run {
        let actions = Arc::new(Controlled::default());
        let recorder = Arc::new(Recorder::default());
        let scheduler = Scheduler::start(
            Start {
                actions: Arc::new(TestActions(actions.clone())),
                ..Start::new(CallContext::new("model"), settings)
            },
            recorder.clone(),
        );
        Run {
            scheduler,
            actions,
            recorder,
            model: Model::default(),
            number: 0,
            log: Vec::new(),
        }
    }

    /// The version, or `None` if the intent is refused (an order made circular by purging).
    fn version(&mut self, resources: &[Option<(u8, bool)>], edges: &[(usize, usize)]) -> Option<Arc<Version>> {
        let present: HashSet<usize> = (0..R).filter(|&r| resources[r].is_some()).collect();
        let specs: Vec<_> = (0..R)
            .filter_map(|r| {
                let (value, purged) = resources[r]?;
                let requires: Vec<String> = edges
                    .iter()
                    .filter(|(a, b)| *a == r && present.contains(b))
                    .map(|(_, b)| id(*b))
                    .collect();
                Some(json!({ "id": id(r), "adaptor": "bench-memory@0.1.0", "attributes": { "v": value }, "purged": purged, "requires": requires }))
            })
            .collect();
        let intent = match Intent::parse(json!({ "resources": specs }).to_string().as_bytes()) {
            Ok(intent) => intent,
            Err(e) => {
                self.log.push(format!("   refused: {e}"));
                return None;
            }
        };
        self.number += 1;
        let plugins = vec![plugin(); intent.resources.len()];
        Some(Arc::new(Version::new(self.number, intent, plugins)))
    }

    /// Lets every task run until the scheduler has applied what the test did, then looks.
    async fn settle(&self) -> Inspection {
        loop {
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
            let inspection = self.scheduler.inspect().await.unwrap();
            if inspection.finished == self.model.finished {
                return inspection;
            }
        }
    }

    async fn apply(&mut self, step: u64, op: &Op) {
        self.actions.step.store(step, Ordering::SeqCst);
        self.log.push(format!("{step}: {op:?}"));
        match op {
            Op::Release(resources, edges) => {
                let Some(v) = self.version(resources, edges) else { return };
                let ids: HashSet<String> = v.intent.resources.iter().map(|r| r.id.to_string()).collect();
                self.model.owed_after.retain(|id, _| ids.contains(id));
                self.model.version = Some(v.clone());
                let receipt = self.scheduler.release(v).unwrap();
                receipt.recorded().await.unwrap();
            }
            Op::Repair => {
                self.scheduler.repair().unwrap();
                if let Some(v) = &self.model.version {
                    for r in &v.intent.resources {
                        self.model.owed_after.insert(r.id.to_string(), step);
                    }
                }
            }
            Op::DeployFailed => self.scheduler.deploy_failed().unwrap(),
            Op::NodeBack(n) => self.scheduler.node_back(format!("n{}", n % 2)).unwrap(),
            Op::Halt => {
                self.scheduler.set_halted(true).unwrap();
                self.model.halted = true;
            }
            Op::Resume => {
                self.scheduler.set_halted(false).unwrap();
                self.model.halted = false;
            }
            Op::Finish(n, end) => {
                let finished = {
                    let mut running = self.actions.running.lock().unwrap();
                    if running.is_empty() {
                        None
                    } else {
                        let k = n % running.len();
                        Some(running.remove(k))
                    }
                };
                if let Some(action) = finished {
                    self.log.push(format!("   finished {} ({end:?})", action.resource));
                    let _ = action.end.send(*end);
                    self.model.finished += 1;
                }
            }
            Op::Advance(d) => tokio::time::advance(*d).await,
        }
    }

    /// Discharges repairs by the actions that started at or after them.
    fn discharge(&mut self) {
        let starts = std::mem::take(&mut *self.actions.starts.lock().unwrap());
        for (resource, step) in starts {
            if self.model.owed_after.get(&resource).is_some_and(|&owed| step >= owed) {
                self.model.owed_after.remove(&resource);
            }
        }
    }

    fn check(&self, i: &Inspection) -> Result<(), String> {
        if let Some(v) = self.actions.violations.lock().unwrap().first() {
            return Err(v.clone());
        }
        if i.running > ENV_LIMIT {
            return Err(format!("{} actions at once (limit {ENV_LIMIT})", i.running));
        }
        if let Some((node, n)) = i.running_per_node.iter().find(|(_, n)| **n > NODE_LIMIT) {
            return Err(format!("{n} actions at once on {node} (limit {NODE_LIMIT})"));
        }
        let running: HashSet<String> = self.actions.running.lock().unwrap().iter().map(|r| r.resource.clone()).collect();
        let in_flight: HashSet<String> = i.in_flight.iter().cloned().collect();
        // Actions the test finished but whose end the scheduler has not applied are none:
        // `settle` waited for them.
        if running != in_flight {
            return Err(format!("in flight: the scheduler says {in_flight:?}, the actions {running:?}"));
        }
        let Some(v) = &self.model.version else { return Ok(()) };
        let by_id: HashMap<&str, usize> = i.resources.iter().enumerate().map(|(k, r)| (r.resource.as_str(), k)).collect();
        for r in &i.resources {
            if r.in_flight != (r.status == Status::Deploying) {
                return Err(format!("{} is {:?} with in_flight = {}", r.resource, r.status, r.in_flight));
            }
            // Order: what started in this step has what it waits for deployed (or being
            // repaired at the hash it is deployed at). Later a requirement may fail under it.
            let now = self.actions.step.load(Ordering::SeqCst);
            let started_now = self
                .actions
                .running
                .lock()
                .unwrap()
                .iter()
                .any(|a| a.resource == r.resource && a.step == now && a.hash == r.desired_hash);
            if started_now {
                let index = v.intent.resources.iter().position(|s| s.id.to_string() == r.resource).unwrap();
                for &j in v.waits_for(index) {
                    let dep = &i.resources[by_id[v.intent.resources[j].id.to_string().as_str()]];
                    let deployed =
                        dep.status == Status::Deployed || (dep.status == Status::Deploying && dep.deployed_hash == Some(dep.desired_hash));
                    if !deployed {
                        return Err(format!("{} started while {} is {:?}", r.resource, dep.resource, dep.status));
                    }
                }
            }
            // No lost want: wanted, ready and idle only while every slot it could take is busy.
            if !i.halted && !i.throttled && r.wanted.is_some() && r.waiting == 0 && !r.in_flight {
                let node_busy = i.running_per_node.get(&r.node).copied().unwrap_or(0) >= NODE_LIMIT;
                if i.running < ENV_LIMIT && !node_busy {
                    return Err(format!("{} is wanted ({:?}) and ready but does not run", r.resource, r.wanted));
                }
            }
            // Timers: nothing waits for a timer that does not exist.
            if !r.in_flight && r.wanted.is_none() && r.waiting == 0 {
                let bound = match r.status {
                    Status::Deployed => Some(REPAIR.mul_f64(1.1)),
                    Status::Failed | Status::Unavailable => Some(MAX_RETRY.mul_f64(1.1)),
                    _ => None,
                };
                if let Some(bound) = bound {
                    match r.timer_in {
                        Some(t) if t <= bound => {}
                        other => return Err(format!("{} is {:?} with timer {other:?} (at most {bound:?})", r.resource, r.status)),
                    }
                }
            }
            // Not deployed and owed nothing: it would never be deployed.
            if !r.in_flight && r.wanted.is_none() && matches!(r.status, Status::Available | Status::Skipped) {
                return Err(format!("{} is {:?} and owed nothing", r.resource, r.status));
            }
        }
        Ok(())
    }

    /// Everything back to normal: resumed, every action succeeds, time moves on until nothing
    /// is owed. Then every promise must have been kept.
    async fn drain(&mut self, mut step: u64) -> Result<(), String> {
        if self.model.halted {
            self.apply(step, &Op::Resume).await;
            step += 1;
        }
        for _ in 0..200 {
            let i = self.settle().await;
            self.discharge();
            self.check(&i)?;
            let running = self.actions.running.lock().unwrap().len();
            if running > 0 {
                for _ in 0..running {
                    self.apply(step, &Op::Finish(0, End::Changed)).await;
                }
            } else if i.resources.iter().any(|r| r.wanted.is_some() || r.status != Status::Deployed) {
                self.apply(step, &Op::Advance(MAX_RETRY.mul_f64(1.2))).await;
            } else {
                break;
            }
            step += 1;
        }
        let i = self.settle().await;
        self.discharge();
        self.check(&i)?;
        for r in &i.resources {
            if r.status != Status::Deployed || r.deployed_hash != Some(r.desired_hash) {
                return Err(format!(
                    "after the drain {} is {:?} (deployed {:?}, desired {:?})",
                    r.resource, r.status, r.deployed_hash, r.desired_hash
                ));
            }
        }
        if let Some((resource, step)) = self.model.owed_after.iter().next() {
            return Err(format!("the repair requested at step {step} never reached {resource}"));
        }
        // What the sink recorded agrees with the scheduler.
        let snapshot = self.scheduler.settled().await.unwrap();
        let n = i.resources.len();
        if snapshot.count(Status::Deployed) != n {
            return Err(format!("settled snapshot {snapshot:?} for {n} resources"));
        }
        // Replayed as a store keeps them: a state replaces its resource's row; a release removes
        // the rows it dropped and makes the others its own (a complete one: removes every row
        // of another version).
        let mut rows: HashMap<String, (Status, u64)> = HashMap::new();
        for e in self.recorder.0.lock().unwrap().iter() {
            match e {
                Event::State(s) => {
                    rows.insert(s.resource.clone(), (s.status, s.version));
                }
                Event::Released {
                    version,
                    dropped,
                    complete,
                } => {
                    if *complete {
                        rows.retain(|_, (_, v)| v == version);
                    } else {
                        for id in dropped {
                            rows.remove(id);
                        }
                        for (_, v) in rows.values_mut() {
                            *v = *version;
                        }
                    }
                }
                Event::Action { .. } => {}
            }
        }
        for r in &i.resources {
            let row = rows.get(&r.resource);
            if row != Some(&(Status::Deployed, i.version.unwrap_or_default())) {
                return Err(format!("the sink's rows have {} as {row:?}", r.resource));
            }
        }
        if rows.len() != i.resources.len() {
            return Err(format!(
                "the sink's rows hold {} resources, the version {}",
                rows.len(),
                i.resources.len()
            ));
        }
        Ok(())
    }
}

fn run_case(ops: Vec<Op>) -> Result<(), String> {
    quiet_panics();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut run = Run::new();
        let mut step = 1;
        let outcome = async {
            for op in &ops {
                run.apply(step, op).await;
                let i = run.settle().await;
                run.discharge();
                run.check(&i)?;
                step += 1;
            }
            run.drain(step).await
        }
        .await;
        outcome.map_err(|e| format!("{e}\n{}", run.log.join("\n")))
    })
}

/// The test's own panicking actions would print a panic message each (thousands per run).
fn quiet_panics() {
    static QUIET: OnceLock<()> = OnceLock::new();
    QUIET.get_or_init(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = orc_host::executor::panic_text(info.payload());
            if !message.starts_with("the test's action panics") {
                default(info);
            }
        }));
    });
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("ORC_MODEL_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(3000),
        max_shrink_iters: 20_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_trigger_is_honoured_whatever_arrives_while_actions_run(ops in proptest::collection::vec(op(), 1..40)) {
        if let Err(e) = run_case(ops) {
            return Err(TestCaseError::fail(e));
        }
    }
}

/// The case, by hand: a repair requested while the first wave of actions runs reaches
/// every resource once they finish, and a second repair after the deploy reaches them all.
#[test]
fn a_repair_requested_while_actions_run_is_not_lost() {
    let all = vec![Some((1, false)); R];
    let mut ops = vec![Op::Release(all, Vec::new()), Op::Repair];
    ops.extend((0..3 * R).map(|_| Op::Finish(0, End::Changed)));
    ops.push(Op::Repair);
    run_case(ops).unwrap();
}

/// A panic inside one action is that resource's failure (`crashed`, with the panic's text): its
/// slot is released, so the next resource runs, and the scheduler goes on.
#[test]
fn a_panicking_action_fails_its_resource_and_frees_its_slot() {
    quiet_panics();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let mut run = Run::with(settings(1, 1));
        let mut two = vec![None; R];
        two[0] = Some((1, false));
        two[2] = Some((1, false));
        run.apply(1, &Op::Release(two, Vec::new())).await;
        run.settle().await;
        run.apply(2, &Op::Finish(0, End::Panic)).await;
        let i = run.settle().await;
        let crashed = &i.resources[0];
        assert_eq!(crashed.status, Status::Failed, "{i:?}");
        assert_eq!(i.running, 1, "the other resource took the freed slot: {i:?}");
        // The sink gets it once the writer's next (paced) batch is written.
        let recorded = || {
            run.recorder.0.lock().unwrap().iter().find_map(|e| match e {
                Event::State(s) if s.resource == id(0) && s.status == Status::Failed => s.last_error.clone(),
                _ => None,
            })
        };
        let mut waited = Duration::ZERO;
        let error = loop {
            if let Some(error) = recorded() {
                break error;
            }
            assert!(waited < Duration::from_secs(1), "the failure is never recorded");
            tokio::time::sleep(Duration::from_millis(1)).await;
            waited += Duration::from_millis(1);
        };
        assert_eq!(error.code, "crashed");
        assert!(error.message.contains("the test's action panics for"), "{}", error.message);
        assert!(run.scheduler.failure().is_none());
        run.drain(3).await.unwrap();
    });
}

/// Settings at the edge of what a duration holds (a careless operator's) never overflow the
/// scheduler's clock: deploys, repairs and retries still work, nothing panics.
#[test]
fn extreme_intervals_do_not_stop_the_scheduler() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let mut run = Run::new();
        run.scheduler
            .update_settings(Settings {
                retry_interval: Duration::MAX,
                max_retry_interval: Duration::MAX,
                repair_interval: Some(Duration::MAX),
                ..settings(ENV_LIMIT, NODE_LIMIT)
            })
            .unwrap();
        let all = vec![Some((1, false)); R];
        let mut step = 1;
        for op in [
            Op::Release(all, Vec::new()),
            Op::Finish(0, End::Failed),
            Op::Finish(0, End::Changed),
            Op::Repair,
        ] {
            run.apply(step, &op).await;
            run.settle().await;
            step += 1;
        }
        tokio::time::advance(Duration::from_secs(86_400 * 365 * 100)).await;
        let i = run.settle().await;
        assert!(run.scheduler.failure().is_none(), "{:?}", run.scheduler.failure());
        assert_eq!(i.resources[0].status, Status::Failed, "{i:?}");
        assert_eq!(
            i.resources[0].timer_in, None,
            "a retry beyond the clock's range is never due: {i:?}"
        );
        // A user deploy still retries the failure; everything finishes.
        run.apply(step, &Op::DeployFailed).await;
        for _ in 0..4 * R {
            step += 1;
            run.apply(step, &Op::Finish(0, End::Changed)).await;
            run.settle().await;
        }
        let i = run.settle().await;
        assert!(i.resources.iter().all(|r| r.status == Status::Deployed), "{i:?}");
        assert!(run.scheduler.failure().is_none());
    });
}

/// A node answering again brings its failures' retries forward, and only its own: with retries
/// never due, the failure on `n0` runs again at once, the one on `n1` waits.
#[test]
fn a_node_back_retries_its_own_failures_at_once_and_no_others() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let mut run = Run::new();
        run.scheduler
            .update_settings(Settings {
                retry_interval: Duration::MAX,
                max_retry_interval: Duration::MAX,
                ..settings(ENV_LIMIT, NODE_LIMIT)
            })
            .unwrap();
        let mut two = vec![None; R];
        two[0] = Some((1, false));
        two[1] = Some((1, false));
        let mut step = 1;
        for op in [
            Op::Release(two, Vec::new()),
            Op::Finish(0, End::Unavailable),
            Op::Finish(0, End::Failed),
        ] {
            run.apply(step, &op).await;
            run.settle().await;
            step += 1;
        }
        let status = |i: &Inspection, r: usize| i.resources.iter().find(|x| x.resource == id(r)).unwrap().status;
        let i = run.settle().await;
        assert!(
            matches!(status(&i, 0), Status::Failed | Status::Unavailable) && matches!(status(&i, 1), Status::Failed | Status::Unavailable),
            "{i:?}"
        );
        run.apply(step, &Op::NodeBack(0)).await;
        let i = run.settle().await;
        assert_eq!(status(&i, 0), Status::Deploying, "{i:?}");
        assert!(
            matches!(status(&i, 1), Status::Failed | Status::Unavailable),
            "n1's failure waits: {i:?}"
        );
        run.apply(step + 1, &Op::NodeBack(1)).await;
        let i = run.settle().await;
        assert_eq!(status(&i, 1), Status::Deploying, "{i:?}");
    });
}

/// A sink that panics on its first batch: the writer dies.
struct PanickingSink;

impl Sink for PanickingSink {
    fn record(&self, _events: Vec<Event>) -> BoxFuture<'_, ()> {
        Box::pin(async { panic!("the test's sink cannot record") })
    }
}

/// A scheduler whose task dies says so, and refuses every later request instead of accepting
/// work that will not happen; the supervisor's callback hears of it once.
#[tokio::test]
async fn a_scheduler_that_dies_says_so_and_refuses_requests() {
    quiet_panics();
    let reported = Arc::new(Mutex::new(Vec::new()));
    let heard = reported.clone();
    let actions = Arc::new(Controlled::default());
    let scheduler = Scheduler::start(
        Start {
            actions: Arc::new(TestActions(actions.clone())),
            on_failure: Some(Box::new(move |reason: &str| heard.lock().unwrap().push(reason.to_string()))),
            ..Start::new(CallContext::new("dies"), Settings::default())
        },
        Arc::new(PanickingSink),
    );
    let mut run = Run::new();
    let v = run.version(&[Some((1, false)); R], &[]).unwrap();
    let receipt = scheduler.release(v).unwrap();
    let refused = receipt.recorded().await.unwrap_err();
    assert!(refused.reason.contains("the test's sink cannot record"), "{refused}");
    let started = std::time::Instant::now();
    while scheduler.failure().is_none() {
        assert!(started.elapsed() < Duration::from_secs(10), "the failure is never reported");
        tokio::task::yield_now().await;
    }
    assert!(
        scheduler.failure().unwrap().contains("writer panicked"),
        "{:?}",
        scheduler.failure()
    );
    assert!(scheduler.repair().is_err());
    assert!(scheduler.deploy_failed().is_err());
    assert!(scheduler.settled().await.is_err());
    assert_eq!(reported.lock().unwrap().len(), 1, "{:?}", reported.lock().unwrap());
}

//! The scheduler's triggers against real plugins (first-party and fixtures) on a real local node:
//! dependency order, skip and recover, retry, user deploy, user repair, self-healing,
//! supersession by a newer version, and purge order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orc_host::intent::Intent;
use orc_host::scheduler::{self, BoxFuture, Event, ResourceStatus as Status, Scheduler, Settings, Sink, Snapshot, Trigger, Version};
use orc_manifest::{Digest, PluginKind};
use orc_node::{CommandOutput, FileStat, LocalNode, NodeBackend, NodeCommand, NodeError, NodeErrorKind, Nodes, Ownership};
use orc_plugin_artifacts::Artifact;
use orc_runtime::capability::MemoryKv;
use orc_runtime::{CallContext, Grants, Runtime, RuntimeConfig};
use serde_json::json;

mod model;

#[derive(Default)]
struct Recorder(Mutex<Vec<Event>>);

impl Sink for Recorder {
    fn record(&self, events: Vec<Event>) -> BoxFuture<'_, ()> {
        self.0.lock().unwrap().extend(events);
        Box::pin(std::future::ready(()))
    }
}

impl Recorder {
    fn actions(&self, resource: &str) -> Vec<(Trigger, orc_host::executor::Outcome)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                Event::Action { trigger, report, .. } if report.resource == resource => Some((*trigger, report.outcome)),
                _ => None,
            })
            .collect()
    }

    fn order_of_changes(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                Event::Action { report, .. } if report.outcome == orc_host::executor::Outcome::Changed => Some(report.resource.clone()),
                _ => None,
            })
            .collect()
    }
}

struct Harness {
    runtime: Runtime,
    ctx: CallContext,
    kv: Arc<MemoryKv>,
    root: tempfile::TempDir,
    recorder: Arc<Recorder>,
}

impl Harness {
    fn new() -> Harness {
        let root = tempfile::tempdir().unwrap();
        let nodes = Nodes::default();
        nodes.insert("local", Arc::new(LocalNode::open(root.path()).unwrap()));
        let kv = Arc::new(MemoryKv::default());
        let ctx = CallContext {
            kv: kv.clone(),
            nodes: Arc::new(nodes),
            ..CallContext::new("test")
        };
        let runtime = Runtime::new(RuntimeConfig {
            max_instances: 64,
            ..RuntimeConfig::default()
        })
        .unwrap();
        Harness {
            runtime,
            ctx,
            kv,
            root,
            recorder: Arc::default(),
        }
    }

    fn version(&self, number: u64, resources: serde_json::Value) -> Arc<Version> {
        let intent = Intent::parse(json!({ "resources": resources }).to_string().as_bytes()).unwrap();
        let plugins = intent
            .resources
            .iter()
            .map(|r| {
                let name = r.adaptor.to_string();
                let name = name.split('@').next().unwrap();
                let artifact: &Artifact = orc_plugin_artifacts::by_name(name).unwrap();
                let digest: Digest = artifact.digest.parse().unwrap();
                self.runtime
                    .load_bytes(&digest, artifact.bytes, PluginKind::Adaptor, &Grants::all())
                    .unwrap()
            })
            .collect();
        Arc::new(Version::new(number, intent, plugins))
    }

    fn scheduler(&self, settings: Settings) -> Scheduler {
        Scheduler::spawn(self.ctx.clone(), settings, self.recorder.clone(), HashMap::new())
    }
}

fn quick() -> Settings {
    Settings {
        env_concurrency: 8,
        node_concurrency: 4,
        retry_interval: Duration::from_millis(50),
        max_retry_interval: Duration::from_millis(200),
        repair_interval: None,
    }
}

/// Polls until `check` holds for a settled snapshot, or fails after 20 s.
async fn until(scheduler: &Scheduler, what: &str, check: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let started = Instant::now();
    loop {
        let snapshot = scheduler.settled().await.unwrap();
        if check(&snapshot) {
            return snapshot;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}: {snapshot:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn memory(id: &str, value: i64, requires: &[&str]) -> serde_json::Value {
    json!({ "id": format!("bench-memory[local,{id}]"), "adaptor": "bench-memory@0.1.0", "attributes": { "v": value }, "requires": requires })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_requirement_skips_dependents_which_deploy_once_it_recovers() {
    let h = Harness::new();
    let s = h.scheduler(quick());
    h.kv.set("test/misbehave", "flaky", b"0").unwrap();
    s.release(h.version(
        1,
        json!([
            { "id": "misbehave[local,a]", "adaptor": "misbehave@0.1.0", "attributes": { "behave": "fail_times", "times": 2, "counter": "flaky" } },
            memory("b", 1, &["misbehave[local,a]"]),
            memory("c", 1, &["bench-memory[local,b]"]),
            memory("free", 1, &[]),
        ]),
    )).unwrap();
    let first = s.settled().await.unwrap();
    assert_eq!(first.count(Status::Failed), 1, "{first:?}");
    assert_eq!(first.count(Status::Skipped), 2, "{first:?}");
    assert_eq!(first.count(Status::Deployed), 1, "{first:?}");
    until(&s, "everything deployed after retries", |snap| snap.count(Status::Deployed) == 4).await;
    let a = h.recorder.actions("misbehave[local,a]");
    assert_eq!(a.len(), 3, "{a:?}");
    assert_eq!(a[1].0, Trigger::Retry);
    // b ran only after a succeeded, c only after b.
    let order = h.recorder.order_of_changes();
    let pos = |id: &str| order.iter().position(|r| r == id).unwrap();
    assert!(pos("bench-memory[local,b]") < pos("bench-memory[local,c]"), "{order:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn user_deploy_retries_failures_now_and_repair_restores_drift() {
    let h = Harness::new();
    let s = h.scheduler(Settings {
        retry_interval: Duration::from_secs(3600),
        max_retry_interval: Duration::from_secs(3600),
        ..quick()
    });
    s.release(h.version(
        1,
        json!([
            { "id": "misbehave[local,a]", "adaptor": "misbehave@0.1.0", "attributes": { "behave": "fail_times", "times": 1, "counter": "once" } },
            memory("b", 7, &["misbehave[local,a]"]),
        ]),
    )).unwrap();
    let snap = s.settled().await.unwrap();
    assert_eq!((snap.count(Status::Failed), snap.count(Status::Skipped)), (1, 1), "{snap:?}");
    s.deploy_failed().unwrap();
    until(&s, "user deploy", |snap| snap.count(Status::Deployed) == 2).await;

    // Drift behind the scheduler's back, then a user repair.
    h.kv.set("test/bench-memory", "bench-memory[local,b]", b"{\"v\":99}").unwrap();
    s.repair().unwrap();
    until(&s, "repair", |_| {
        h.recorder
            .actions("bench-memory[local,b]")
            .iter()
            .any(|(t, o)| *t == Trigger::Repair && *o == orc_host::executor::Outcome::Changed)
    })
    .await;
    assert_eq!(
        h.kv.get("test/bench-memory", "bench-memory[local,b]").unwrap().unwrap(),
        b"{\"v\":7}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn self_healing_repairs_drift_on_its_own() {
    let h = Harness::new();
    let s = h.scheduler(Settings {
        repair_interval: Some(Duration::from_millis(100)),
        ..quick()
    });
    s.release(h.version(1, json!([memory("x", 1, &[])]))).unwrap();
    until(&s, "deployed", |snap| snap.count(Status::Deployed) == 1).await;
    h.kv.set("test/bench-memory", "bench-memory[local,x]", b"{\"v\":2}").unwrap();
    let started = Instant::now();
    while h.kv.get("test/bench-memory", "bench-memory[local,x]").unwrap().unwrap() != b"{\"v\":1}" {
        assert!(started.elapsed() < Duration::from_secs(20), "drift never repaired");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A failed action may have changed part of what it deployed, so it leaves no state known to be
/// deployed: a version asking for the state that ran before (a rollback) runs it again.
#[tokio::test(flavor = "multi_thread")]
async fn a_rollback_after_a_failed_action_runs_the_old_state_again() {
    let h = Harness::new();
    let s = h.scheduler(Settings {
        retry_interval: Duration::from_secs(3600),
        max_retry_interval: Duration::from_secs(3600),
        ..quick()
    });
    let good = json!([{ "id": "misbehave[local,a]", "adaptor": "misbehave@0.1.0", "attributes": { "behave": "fail_times", "times": 0, "counter": "good" } }]);
    let bad = json!([{ "id": "misbehave[local,a]", "adaptor": "misbehave@0.1.0", "attributes": { "behave": "fail_times", "times": 1000, "counter": "bad" } }]);
    s.release(h.version(1, good.clone())).unwrap();
    until(&s, "v1 deployed", |snap| {
        snap.version == Some(1) && snap.count(Status::Deployed) == 1
    })
    .await;
    s.release(h.version(2, bad)).unwrap();
    until(&s, "v2 failed", |snap| snap.version == Some(2) && snap.count(Status::Failed) == 1).await;
    let before = h.recorder.actions("misbehave[local,a]").len();
    s.release(h.version(3, good)).unwrap();
    until(&s, "v3 deployed", |snap| {
        snap.version == Some(3) && snap.count(Status::Deployed) == 1
    })
    .await;
    let actions = h.recorder.actions("misbehave[local,a]");
    assert_eq!(actions.len(), before + 1, "the rolled-back state was trusted, not run: {actions:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_version_supersedes_the_old_one() {
    let h = Harness::new();
    let s = h.scheduler(quick());
    s.release(h.version(1, json!([memory("m", 1, &[]), memory("n", 1, &["bench-memory[local,m]"])])))
        .unwrap();
    s.release(h.version(2, json!([memory("m", 2, &[]), memory("n", 2, &["bench-memory[local,m]"])])))
        .unwrap();
    let snap = until(&s, "v2 deployed", |snap| {
        snap.version == Some(2) && snap.count(Status::Deployed) == 2
    })
    .await;
    assert_eq!(snap.version, Some(2));
    assert_eq!(
        h.kv.get("test/bench-memory", "bench-memory[local,m]").unwrap().unwrap(),
        b"{\"v\":2}"
    );
    assert_eq!(
        h.kv.get("test/bench-memory", "bench-memory[local,n]").unwrap().unwrap(),
        b"{\"v\":2}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn purged_resources_are_removed_dependents_first() {
    let h = Harness::new();
    let s = h.scheduler(quick());
    let dir = json!({ "id": "directory[local,/d]", "adaptor": "directory@0.1.0", "attributes": {} });
    let file =
        json!({ "id": "file[local,/d/f]", "adaptor": "file@0.1.0", "attributes": { "content": "x" }, "requires": ["directory[local,/d]"] });
    s.release(h.version(1, json!([dir, file]))).unwrap();
    until(&s, "created", |snap| snap.count(Status::Deployed) == 2).await;
    assert!(h.root.path().join("d/f").exists());
    let mut dir = dir.clone();
    dir["purged"] = true.into();
    let mut file = file.clone();
    file["purged"] = true.into();
    s.release(h.version(2, json!([dir, file]))).unwrap();
    until(&s, "purged", |snap| snap.version == Some(2) && snap.count(Status::Deployed) == 2).await;
    assert!(
        !h.root.path().join("d").exists(),
        "the directory (not recursive) could only go after its file"
    );
}

/// A release hands over the states of what it changes, not of the whole version: a resource
/// deployed as the new version still wants it keeps its state (renewed by the `released` event),
/// a changed or new one gets a state, and the first release of a scheduler hands over every one.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_hands_over_the_states_it_changes() {
    let h = Harness::new();
    let s = h.scheduler(quick());
    let file = |name: &str, content: &str| json!({ "id": format!("file[local,/{name}]"), "adaptor": "file@0.1.0", "attributes": { "content": content } });
    s.release(h.version(1, json!([file("a", "1"), file("b", "1"), file("c", "1")])))
        .unwrap();
    until(&s, "deployed", |snap| snap.count(Status::Deployed) == 3).await;
    // The states handed over from event `from` on, up to the release: (version, dropped, complete).
    type Release = Option<(u64, Vec<String>, bool)>;
    let states_then_release = |from: usize| -> (Vec<String>, Release) {
        let events = h.recorder.0.lock().unwrap();
        let mut states = Vec::new();
        for e in &events[from..] {
            match e {
                Event::State(st) => states.push(st.resource.clone()),
                Event::Released {
                    version,
                    dropped,
                    complete,
                } => return (states, Some((*version, dropped.clone(), *complete))),
                Event::Action { .. } => {}
            }
        }
        (states, None)
    };
    let (first, released) = states_then_release(0);
    assert_eq!(first.len(), 3, "the first release hands over every state: {first:?}");
    assert_eq!(released, Some((1, Vec::new(), true)));

    let seen = h.recorder.0.lock().unwrap().len();
    let receipt = s
        .release(h.version(2, json!([file("a", "1"), file("b", "2"), file("d", "1")])))
        .unwrap();
    receipt.recorded().await.unwrap();
    let (changed, released) = states_then_release(seen);
    let mut changed_ids = changed.clone();
    changed_ids.sort();
    assert_eq!(
        changed_ids,
        ["file[local,/b]", "file[local,/d]"],
        "not `a`, deployed as version 2 wants it"
    );
    assert_eq!(released, Some((2, vec!["file[local,/c]".to_string()], false)));
    until(&s, "deployed", |snap| snap.version == Some(2) && snap.count(Status::Deployed) == 3).await;
    assert_eq!(std::fs::read_to_string(h.root.path().join("b")).unwrap(), "2");
}

/// A sink in doubt (it could not take a batch) is handed every state at each release, so the
/// store is made whole again.
#[tokio::test(flavor = "multi_thread")]
async fn a_sink_in_doubt_gets_every_state_at_a_release() {
    struct Doubtful(Recorder);
    impl Sink for Doubtful {
        fn record(&self, events: Vec<Event>) -> BoxFuture<'_, ()> {
            self.0.record(events)
        }
        fn in_doubt(&self) -> bool {
            true
        }
    }
    let h = Harness::new();
    let sink = Arc::new(Doubtful(Recorder::default()));
    let s = Scheduler::spawn(h.ctx.clone(), quick(), sink.clone(), HashMap::new());
    let file = json!({ "id": "file[local,/a]", "adaptor": "file@0.1.0", "attributes": { "content": "1" } });
    s.release(h.version(1, json!([file.clone()]))).unwrap();
    until(&s, "deployed", |snap| snap.count(Status::Deployed) == 1).await;
    let seen = sink.0.0.lock().unwrap().len();
    s.release(h.version(2, json!([file]))).unwrap().recorded().await.unwrap();
    let events = sink.0.0.lock().unwrap();
    let states = events[seen..].iter().filter(|e| matches!(e, Event::State(_))).count();
    assert_eq!(states, 1, "the unchanged resource's state too");
    assert!(events[seen..].iter().any(|e| matches!(
        e,
        Event::Released {
            version: 2,
            complete: true,
            ..
        }
    )));
}

/// A host stopped in the middle of a deploy (its runtime torn down with actions in flight and
/// events unwritten) resumes from the store: nothing is left `deploying`, everything ends
/// deployed, and nothing whose deployment was confirmed in the store runs again.
#[test]
fn a_deploy_interrupted_mid_flight_resumes_from_the_store() {
    use orc_host::policy::settings::EnvironmentSettings;
    use orc_host::scheduler::persistence::{StoreSink, resume};
    use orc_host::store::Store;

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("orc.db");
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("error").try_init();
    let h = Harness::new();
    let resources: Vec<serde_json::Value> = (0..40)
        .map(|i| {
            if i % 4 == 0 {
                json!({ "id": format!("misbehave[local,s{i}]"), "adaptor": "misbehave@0.1.0", "attributes": { "behave": "slow", "ms": 300 } })
            } else {
                memory(&format!("m{i}"), i, &[])
            }
        })
        .collect();
    let version = h.version(1, serde_json::Value::Array(resources));
    let settings = Settings {
        env_concurrency: 4,
        node_concurrency: 4,
        ..quick()
    };

    // First life: stopped while the slow resources are still running.
    let first = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (env, confirmed) = first.block_on(async {
        let store = Store::open_sqlite(&db).await.unwrap();
        let env = store.create_environment("crash", &EnvironmentSettings::default()).await.unwrap().id;
        let s = Scheduler::spawn(
            h.ctx.clone(),
            settings.clone(),
            Arc::new(StoreSink::new(store.clone(), env)),
            HashMap::new(),
        );
        s.release(version.clone()).unwrap();
        // Wait until some resources are confirmed deployed in the store and some are in flight.
        let started = Instant::now();
        loop {
            let states = store.load_states(&env).await.unwrap();
            let deployed = states.iter().filter(|s| s.status == Status::Deployed).count();
            let deploying = states.iter().filter(|s| s.status == Status::Deploying).count();
            if deployed >= 5 && deploying >= 1 {
                let confirmed: Vec<String> = states
                    .iter()
                    .filter(|s| s.status == Status::Deployed)
                    .map(|s| s.resource_id.clone())
                    .collect();
                return (env, confirmed);
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "never saw a mid-deploy state: {deployed} deployed, {deploying} deploying of {}",
                states.len()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    first.shutdown_background();

    // Second life: resume from the store and converge.
    let second = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        let store = Store::open_sqlite(&db).await.unwrap();
        let known = resume(&store, &env).await.unwrap().known;
        let states = store.load_states(&env).await.unwrap();
        assert!(
            states.iter().all(|s| s.status != Status::Deploying),
            "recovery leaves nothing deploying"
        );
        let s = Scheduler::spawn(h.ctx.clone(), settings.clone(), Arc::new(StoreSink::new(store.clone(), env)), known);
        s.release(version.clone()).unwrap();
        let snap = s.settled().await.unwrap();
        assert_eq!(snap.count(Status::Deployed), 40, "{snap:?}");
        let states = store.load_states(&env).await.unwrap();
        assert!(states.iter().all(|s| s.status == Status::Deployed), "all deployed in the store");
        for id in &confirmed {
            let actions = store.resource_actions(&env, id, 10).await.unwrap();
            assert!(actions.len() <= 1, "{id} was confirmed before the stop but ran again: {actions:?}");
        }
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn a_halted_scheduler_starts_nothing_until_resumed() {
    let h = Harness::new();
    let s = Scheduler::spawn_halted(h.ctx.clone(), quick(), true, h.recorder.clone(), HashMap::new());
    s.release(h.version(1, json!([memory("a", 1, &[]), memory("b", 1, &["bench-memory[local,a]"])])))
        .unwrap();
    // Halted: settled answers at once (nothing in flight) and nothing ran.
    let snap = s.settled().await.unwrap();
    assert_eq!(snap.count(Status::Available), 2, "{snap:?}");
    assert!(h.recorder.actions("bench-memory[local,a]").is_empty());
    s.repair().unwrap();
    s.deploy_failed().unwrap();
    assert_eq!(s.settled().await.unwrap().count(Status::Deployed), 0);

    s.set_halted(false).unwrap();
    until(&s, "deployed after resume", |snap| snap.count(Status::Deployed) == 2).await;

    // Halted again before a new version is released: nothing of it starts.
    s.set_halted(true).unwrap();
    s.release(h.version(2, json!([memory("a", 2, &[]), memory("b", 2, &["bench-memory[local,a]"])])))
        .unwrap();
    let snap = s.settled().await.unwrap();
    assert_eq!(snap.count(Status::Deploying), 0, "{snap:?}");
    assert_eq!(snap.count(Status::Available), 2, "{snap:?}");
    s.set_halted(false).unwrap();
    until(&s, "v2 deployed", |snap| {
        snap.version == Some(2) && snap.count(Status::Deployed) == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_lets_actions_in_flight_finish_and_records_them() {
    let h = Harness::new();
    let s = h.scheduler(quick());
    let slow = |key: &str| json!({ "id": format!("misbehave[local,{key}]"), "adaptor": "misbehave@0.1.0", "attributes": { "behave": "slow", "ms": 3000 } });
    s.release(h.version(1, json!([slow("a"), slow("b"), memory("after", 1, &["misbehave[local,a]"])])))
        .unwrap();
    // Wait until both slow actions are in flight.
    let started = Instant::now();
    while h
        .recorder
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, Event::State(st) if st.status == Status::Deploying))
        .count()
        < 2
    {
        assert!(started.elapsed() < Duration::from_secs(20), "the slow actions never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // (The slow actions take 3 s, so that a loaded machine cannot let `a` finish, and its
    // dependent start, before the stop below arrives.)
    let snap = s.stop().await;
    // Both finished and were recorded before stop returned; the dependent never started.
    assert_eq!(snap.count(Status::Deployed), 2, "{snap:?}");
    assert_eq!(snap.count(Status::Available), 1, "{snap:?}");
    assert_eq!(h.recorder.actions("misbehave[local,a]").len(), 1);
    assert_eq!(h.recorder.actions("misbehave[local,b]").len(), 1);
    assert!(h.recorder.actions("bench-memory[local,after]").is_empty());
    // The scheduler has ended: later requests are refused (it stopped; it did not fail).
    assert!(s.repair().is_err());
    let refused = s.settled().await.unwrap_err();
    assert_eq!(refused.reason, "it has stopped");
    assert_eq!(s.failure(), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn new_settings_apply_to_what_is_scheduled_next() {
    let h = Harness::new();
    // A retry an hour away: the failure stays failed.
    let s = h.scheduler(Settings {
        retry_interval: Duration::from_secs(3600),
        max_retry_interval: Duration::from_secs(3600),
        ..quick()
    });
    h.kv.set("test/misbehave", "twice", b"0").unwrap();
    let flaky = json!({ "id": "misbehave[local,f]", "adaptor": "misbehave@0.1.0", "attributes": { "behave": "fail_times", "times": 2, "counter": "twice" } });
    s.release(h.version(1, json!([flaky]))).unwrap();
    assert_eq!(s.settled().await.unwrap().count(Status::Failed), 1);
    // A short interval from now on: the next failure is retried within it.
    s.update_settings(quick()).unwrap();
    s.deploy_failed().unwrap();
    until(&s, "retried under the new interval", |snap| snap.count(Status::Deployed) == 1).await;
    assert_eq!(h.recorder.actions("misbehave[local,f]").len(), 3);
}

/// Self-healing switched on after the deploy: resources already deployed get their repair timers
/// from the new setting, not only after their next action.
/// On a paused clock: the windows below are the scheduler's own time, so a loaded machine
/// cannot stretch them.
#[tokio::test(start_paused = true)]
async fn self_healing_switched_on_later_covers_what_is_already_deployed() {
    let h = Harness::new();
    let s = h.scheduler(quick());
    s.release(h.version(1, json!([memory("x", 1, &[]), memory("y", 1, &[])]))).unwrap();
    until(&s, "deployed", |snap| snap.count(Status::Deployed) == 2).await;
    h.kv.set("test/bench-memory", "bench-memory[local,x]", b"{\"v\":2}").unwrap();
    s.update_settings(Settings {
        repair_interval: Some(Duration::from_millis(100)),
        ..quick()
    })
    .unwrap();
    let started = tokio::time::Instant::now();
    while h.kv.get("test/bench-memory", "bench-memory[local,x]").unwrap().unwrap() != b"{\"v\":1}" {
        assert!(started.elapsed() < Duration::from_secs(20), "drift never repaired");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let repairs = |id: &str| h.recorder.actions(id).iter().filter(|(t, _)| *t == Trigger::Repair).count();
    until(&s, "the untouched resource verified too", |_| repairs("bench-memory[local,y]") >= 1).await;

    // User repairs and interval changes each reschedule the one timer a resource has: they do
    // not leave timers behind. Over a window of 1 s at 200 ms (±10 %) a resource is repaired
    // about 5 times; a timer left behind by each user repair below (spread over the interval, so
    // they do not coincide) would make that 15.
    s.update_settings(Settings {
        repair_interval: Some(Duration::from_millis(50)),
        ..quick()
    })
    .unwrap();
    s.update_settings(Settings {
        repair_interval: Some(Duration::from_millis(200)),
        ..quick()
    })
    .unwrap();
    let spread = tokio::time::Instant::now();
    for k in 0..3u32 {
        until(&s, "the next user repair", |_| spread.elapsed() >= Duration::from_millis(60) * k).await;
        s.repair().unwrap();
        s.settled().await.unwrap();
    }
    let before = repairs("bench-memory[local,y]");
    let window = tokio::time::Instant::now();
    // The window is measured, not assumed: the count is compared with what its length allows.
    until(&s, "a window of 1 s", |_| window.elapsed() >= Duration::from_secs(1)).await;
    let elapsed = window.elapsed();
    let during = repairs("bench-memory[local,y]") - before;
    let most = (elapsed.as_secs_f64() / 0.18).ceil() as usize + 1;
    assert!(during <= most, "{during} repairs in {elapsed:?}: at most {most} expected");
    assert!(during >= 2, "self-healing kept going: {during} repairs in {elapsed:?}");

    // Switched off: the pending repairs are cancelled.
    s.update_settings(quick()).unwrap();
    s.settled().await.unwrap();
    let off = repairs("bench-memory[local,y]");
    let window = tokio::time::Instant::now();
    until(&s, "another 0.5 s", |_| window.elapsed() >= Duration::from_millis(500)).await;
    assert_eq!(
        repairs("bench-memory[local,y]"),
        off,
        "no repair after self-healing was switched off"
    );
}

/// A node whose commands take 30 ms and which records how many ran at once; every other call
/// is refused.
#[derive(Default)]
struct CountingNode {
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl CountingNode {
    fn refuse<T>() -> Result<T, NodeError> {
        Err(NodeError::new(NodeErrorKind::Denied, "only commands run on this test node"))
    }
}

impl NodeBackend for CountingNode {
    fn run(&self, _command: NodeCommand) -> BoxFuture<'_, Result<CommandOutput, NodeError>> {
        use std::sync::atomic::Ordering::SeqCst;
        Box::pin(async move {
            let now = self.now.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            tokio::time::sleep(Duration::from_millis(30)).await;
            self.now.fetch_sub(1, SeqCst);
            Ok(CommandOutput {
                exit_code: 0,
                stdout: Vec::new(),
                stderr: Vec::new(),
            })
        })
    }
    fn read_file<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, NodeError>> {
        Box::pin(async { Self::refuse() })
    }
    fn write_file<'a>(&'a self, _: &'a str, _: Vec<u8>, _: Option<u32>) -> BoxFuture<'a, Result<(), NodeError>> {
        Box::pin(async { Self::refuse() })
    }
    fn stat<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<FileStat>, NodeError>> {
        Box::pin(async { Self::refuse() })
    }
    fn create_dir<'a>(&'a self, _: &'a str, _: Option<u32>, _: bool) -> BoxFuture<'a, Result<(), NodeError>> {
        Box::pin(async { Self::refuse() })
    }
    fn set_mode<'a>(&'a self, _: &'a str, _: u32) -> BoxFuture<'a, Result<(), NodeError>> {
        Box::pin(async { Self::refuse() })
    }
    fn remove<'a>(&'a self, _: &'a str, _: bool) -> BoxFuture<'a, Result<bool, NodeError>> {
        Box::pin(async { Self::refuse() })
    }
    fn read_link<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<String>, NodeError>> {
        Box::pin(async { Self::refuse() })
    }
    fn create_symlink<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<(), NodeError>> {
        Box::pin(async { Self::refuse() })
    }
    fn owner<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<Ownership>, NodeError>> {
        Box::pin(async { Self::refuse() })
    }
    fn set_owner<'a>(&'a self, _: &'a str, _: Option<&'a str>, _: Option<&'a str>) -> BoxFuture<'a, Result<(), NodeError>> {
        Box::pin(async { Self::refuse() })
    }
}

/// On a paused clock: every read that may start has started before the 30 ms of the first
/// end, whatever the machine's load.
#[tokio::test(start_paused = true)]
async fn a_dryrun_keeps_to_the_per_node_limit() {
    let h = Harness::new();
    // The misbehave fixture's `node` mode runs a command on node `local` while it reads.
    let reader = |key: &str| json!({ "id": format!("misbehave[local,{key}]"), "adaptor": "misbehave@0.1.0", "attributes": { "behave": "node", "during": "read" } });
    let version = h.version(1, json!((0..8).map(|i| reader(&format!("r{i}"))).collect::<Vec<_>>()));
    for (per_node, expected) in [(2, 2), (8, 8)] {
        let node = Arc::new(CountingNode::default());
        let nodes = Nodes::default();
        nodes.insert("local", node.clone());
        let ctx = CallContext {
            nodes: Arc::new(nodes),
            ..h.ctx.clone()
        };
        let reports = scheduler::dryrun_limited(&version, &ctx, 8, per_node).await;
        assert_eq!(reports.len(), 8);
        assert!(reports.iter().all(|r| r.error.is_none()), "{reports:?}");
        let most = node.most.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            most, expected,
            "at most {per_node} reads on the node at once, and as many as allowed"
        );
    }
}

/// A sink that takes its time, and says how far the actions ran ahead of it: at each batch, how
/// many resources the plugin had deployed (its key/value state) beyond those whose action it had
/// recorded.
struct SlowSink {
    kv: Arc<MemoryKv>,
    recorded: Mutex<usize>,
    furthest_ahead: Mutex<usize>,
}

impl Sink for SlowSink {
    fn record(&self, events: Vec<Event>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let deployed = self.kv.list("test/bench-memory", "").unwrap().len();
            let ahead = deployed.saturating_sub(*self.recorded.lock().unwrap());
            {
                let mut furthest = self.furthest_ahead.lock().unwrap();
                *furthest = (*furthest).max(ahead);
            }
            // 0.2 ms an event: ~1,700 resources a second, a few times slower than the actions.
            tokio::time::sleep(Duration::from_micros(200) * events.len() as u32).await;
            *self.recorded.lock().unwrap() += events.iter().filter(|e| matches!(e, Event::Action { .. })).count();
        })
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn actions_wait_for_a_sink_that_falls_behind() {
    let h = Harness::new();
    let sink = Arc::new(SlowSink {
        kv: h.kv.clone(),
        recorded: Mutex::new(0),
        furthest_ahead: Mutex::new(0),
    });
    let settings = Settings {
        env_concurrency: 64,
        node_concurrency: 64,
        ..quick()
    };
    let s = Scheduler::spawn(h.ctx.clone(), settings, sink.clone(), HashMap::new());
    let n = 15_000;
    let resources: Vec<_> = (0..n).map(|i| memory(&format!("r{i}"), 1, &[])).collect();
    s.release(h.version(1, json!(resources))).unwrap();
    until(&s, "all deployed", |snap| snap.count(Status::Deployed) == n).await;
    // Each resource is three events (deploying, its action, deployed): the scheduler stops
    // starting actions while 16,384 events wait, so it is never more than ~5,500 resources
    // (plus those in flight) ahead of the sink; unthrottled it is done with all 15,000 while
    // the sink has recorded a few thousand.
    let furthest = *sink.furthest_ahead.lock().unwrap();
    assert!(
        furthest <= 16_384 / 3 + 64 + 64,
        "the actions ran {furthest} resources ahead of the sink"
    );
    assert_eq!(*sink.recorded.lock().unwrap(), n);
}

/// A plugin that answers with a 20 MB error costs a bounded report: the message is cut, says
/// how long it was, and the resource fails as it should.
#[tokio::test(flavor = "multi_thread")]
async fn a_flooding_plugin_costs_a_bounded_report() {
    let h = Harness::new();
    let s = h.scheduler(quick());
    let flood =
        json!({ "id": "misbehave[local,flood]", "adaptor": "misbehave@0.1.0", "attributes": { "behave": "flood", "bytes": 20_000_000 } });
    s.release(h.version(1, json!([flood]))).unwrap();
    until(&s, "the flood failed", |snap| snap.count(Status::Failed) == 1).await;
    let events = h.recorder.0.lock().unwrap();
    let report = events
        .iter()
        .find_map(|e| match e {
            Event::Action { report, .. } => Some(report),
            _ => None,
        })
        .unwrap();
    let error = report.error.as_ref().unwrap();
    assert_eq!(error.code, "failed");
    assert!(
        error.message.len() <= orc_runtime::bounded::MAX_ERROR + 64,
        "{} bytes kept",
        error.message.len()
    );
    assert!(
        error.message.contains("bytes in all]"),
        "{}",
        &error.message[error.message.len() - 80..]
    );
}

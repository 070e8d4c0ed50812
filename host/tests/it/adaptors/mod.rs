//! The first-party adaptors `file` and `directory` (each with owner and group), `symlink`, `command` and
//! `process` deployed through the scheduler to a real node over SSH (an OpenSSH sshd the test
//! starts, as root): first deploy, an idempotent second pass, drift made by hand that a dryrun
//! reports without touching, drift repaired by self-healing, and purge.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orc_host::executor::{ActionReport, Outcome};
use orc_host::intent::Intent;
use orc_host::scheduler::{self, BoxFuture, Event, ResourceStatus as Status, Scheduler, Settings, Sink, Trigger, Version};
use orc_manifest::{Digest, PluginKind};
use orc_node::Nodes;
use orc_runtime::{CallContext, Grants, Runtime, RuntimeConfig};
use orc_tests::sshd::{self, Sshd};
use orc_tests::wait_for;
use serde_json::{Value, json};

use crate::support::ssh_node;

#[derive(Default)]
struct Recorder(Mutex<Vec<(Trigger, ActionReport)>>);

impl Sink for Recorder {
    fn record(&self, events: Vec<Event>) -> BoxFuture<'_, ()> {
        let mut actions = self.0.lock().unwrap();
        for e in events {
            if let Event::Action { trigger, report, .. } = e {
                actions.push((trigger, report));
            }
        }
        Box::pin(std::future::ready(()))
    }
}

struct Harness {
    sshd: Sshd,
    scratch: PathBuf,
    runtime: Runtime,
    ctx: CallContext,
    recorder: Arc<Recorder>,
    scheduler: Scheduler,
}

const NODE: &str = "web1";

impl Harness {
    async fn start(name: &str) -> Harness {
        let sshd = Sshd::start();
        let scratch = sshd.scratch_dir(name);
        let node = ssh_node::connect_as_root(&sshd).await;
        let nodes = Nodes::default();
        nodes.insert(NODE, Arc::new(node));
        let ctx = CallContext {
            nodes: Arc::new(nodes),
            ..CallContext::new("test")
        };
        let runtime = Runtime::new(RuntimeConfig {
            max_instances: 32,
            ..RuntimeConfig::default()
        })
        .unwrap();
        let recorder = Arc::new(Recorder::default());
        let scheduler = Scheduler::spawn(ctx.clone(), settings(), recorder.clone(), HashMap::new());
        Harness {
            sshd,
            scratch,
            runtime,
            ctx,
            recorder,
            scheduler,
        }
    }

    fn path(&self, name: &str) -> String {
        self.scratch.join(name).to_str().unwrap().to_string()
    }

    fn version(&self, number: u64, resources: Value) -> Arc<Version> {
        let intent = Intent::parse(json!({ "resources": resources }).to_string().as_bytes()).unwrap();
        let plugins = intent
            .resources
            .iter()
            .map(|r| {
                let name = r.adaptor.to_string();
                let artifact = orc_plugin_artifacts::by_name(name.split('@').next().unwrap()).unwrap();
                let digest: Digest = artifact.digest.parse().unwrap();
                // Every first-party adaptor under test, each needing its own capabilities; the
                // environment's grants are tested through the API (`api::grants`).
                self.runtime
                    .load_bytes(&digest, artifact.bytes, PluginKind::Adaptor, &Grants::all())
                    .unwrap()
            })
            .collect();
        Arc::new(Version::new(number, intent, plugins))
    }

    /// Releases `version` and waits until every resource has settled in `status`.
    async fn deploy(&self, version: Arc<Version>, status: Status) {
        let n = version.intent.resources.len();
        self.scheduler.release(version).unwrap();
        let snap = self.scheduler.settled().await.unwrap();
        assert_eq!(snap.count(status), n, "{snap:?}\n{:#?}", self.failures());
    }

    fn failures(&self) -> Vec<String> {
        self.recorder
            .0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(_, r)| r.error.as_ref().map(|e| format!("{}: {}", r.resource, e.message)))
            .collect()
    }

    fn actions(&self) -> usize {
        self.recorder.0.lock().unwrap().len()
    }

    /// A repair pass over everything: every resource must be found unchanged.
    async fn assert_idempotent(&self) {
        let before = self.actions();
        self.scheduler.repair().unwrap();
        let reports = self.wait_for_actions(before, "the repair pass").await;
        for (trigger, r) in &reports {
            assert_eq!(*trigger, Trigger::Repair);
            assert_eq!(r.outcome, Outcome::Unchanged, "{}: {:?} {:?}", r.resource, r.changes, r.error);
        }
    }

    /// Waits until one action per resource of the released version was recorded after `before`.
    async fn wait_for_actions(&self, before: usize, what: &str) -> Vec<(Trigger, ActionReport)> {
        wait_for(what, Duration::from_secs(20), async || {
            let snap = self.scheduler.settled().await.unwrap();
            let n: usize = snap.counts.iter().map(|(_, n)| n).sum();
            let recorded = self.recorder.0.lock().unwrap()[before..].to_vec();
            (recorded.len() >= n).then_some(recorded)
        })
        .await
    }

    /// Holds the scheduler (nothing new starts, nothing is in flight) while `drift` runs and a
    /// dryrun of `version` reports the changes to `resource` — which must leave them in place.
    async fn drift_and_dryrun(&self, version: &Version, resource: &str, drift: impl FnOnce()) -> Vec<String> {
        self.scheduler.set_halted(true).unwrap();
        self.scheduler.settled().await.unwrap();
        drift();
        let reports = scheduler::dryrun(version, &self.ctx, 4).await;
        let report = reports.iter().find(|r| r.resource == resource).unwrap();
        assert_eq!(report.outcome, Outcome::WouldChange, "{report:?}");
        report.changes.iter().map(|c| c.field.clone()).collect()
    }

    /// Resumes the scheduler and waits for self-healing to make `repaired` hold.
    async fn heal(&self, what: &str, repaired: impl Fn() -> bool) {
        let before = self.actions();
        self.scheduler.set_halted(false).unwrap();
        wait_for(&format!("self-healing to repair {what}"), Duration::from_secs(20), async || {
            if repaired() {
                Ok(())
            } else {
                Err(format!("{:#?}", self.failures()))
            }
        })
        .await;
        // The repair's report is recorded once the action is done.
        self.scheduler.settled().await.unwrap();
        let healed = self.recorder.0.lock().unwrap()[before..]
            .iter()
            .any(|(t, r)| *t == Trigger::Repair && r.outcome == Outcome::Changed);
        assert!(healed, "no self-healing action changed anything");
    }
}

/// Self-healing every 150 ms; no retries (failures here are meant to stay).
fn settings() -> Settings {
    Settings {
        env_concurrency: 8,
        node_concurrency: 4,
        retry_interval: Duration::from_secs(3600),
        max_retry_interval: Duration::from_secs(3600),
        repair_interval: Some(Duration::from_millis(150)),
    }
}

fn purged(mut resources: Value) -> Value {
    for r in resources.as_array_mut().unwrap() {
        r["purged"] = true.into();
    }
    resources
}

fn uid_of(name: &str) -> u32 {
    let out = std::process::Command::new("id").args(["-u", name]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn file_with_owner_and_group() {
    let h = Harness::start("file").await;
    let motd = h.path("motd");
    let id = format!("file[{NODE},{motd}]");
    let resources = json!([{ "id": id, "adaptor": "file@0.1.0", "attributes": {
        "content": "hello\n", "mode": "0640", "owner": sshd::TEST_USER, "group": "65534" } }]);
    let v1 = h.version(1, resources.clone());
    h.deploy(v1.clone(), Status::Deployed).await;
    let meta = std::fs::metadata(&motd).unwrap();
    assert_eq!(std::fs::read_to_string(&motd).unwrap(), "hello\n");
    assert_eq!(
        (meta.mode() & 0o7777, meta.uid(), meta.gid()),
        (0o640, uid_of(sshd::TEST_USER), 65534)
    );
    h.assert_idempotent().await;

    // Drift: content and owner changed by hand. A dryrun names both and changes nothing.
    let fields = h
        .drift_and_dryrun(&v1, &id, || {
            std::fs::write(&motd, "tampered\n").unwrap();
            std::os::unix::fs::chown(&motd, Some(0), Some(0)).unwrap();
        })
        .await;
    assert_eq!(fields, ["content", "owner", "group"]);
    assert_eq!(std::fs::read_to_string(&motd).unwrap(), "tampered\n");
    h.heal("the file", || {
        std::fs::read_to_string(&motd).unwrap() == "hello\n"
            && std::fs::metadata(&motd).is_ok_and(|m| (m.uid(), m.gid()) == (uid_of(sshd::TEST_USER), 65534))
    })
    .await;

    // An unmanaged owner survives a content rewrite.
    let plain = json!([{ "id": id, "adaptor": "file@0.1.0", "attributes": { "content": "v2\n" } }]);
    h.deploy(h.version(2, plain.clone()), Status::Deployed).await;
    let meta = std::fs::metadata(&motd).unwrap();
    assert_eq!(std::fs::read_to_string(&motd).unwrap(), "v2\n");
    assert_eq!((meta.uid(), meta.gid()), (uid_of(sshd::TEST_USER), 65534));

    h.deploy(h.version(3, purged(plain)), Status::Deployed).await;
    assert!(!Path::new(&motd).exists());
    drop(h.sshd);
}

#[tokio::test(flavor = "multi_thread")]
async fn symlink_points_repairs_and_respects_files_in_the_way() {
    let h = Harness::start("symlink").await;
    let (target, link, blocked) = (h.path("target"), h.path("link"), h.path("blocked"));
    std::fs::write(&target, "t").unwrap();
    std::fs::write(&blocked, "keep me").unwrap();
    let link_id = format!("symlink[{NODE},{link}]");
    let blocked_id = format!("symlink[{NODE},{blocked}]");
    let link_only = json!([{ "id": link_id, "adaptor": "symlink@0.1.0", "attributes": { "target": "target" } }]);
    let v1 = h.version(1, link_only.clone());
    h.deploy(v1.clone(), Status::Deployed).await;
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("target"));
    h.assert_idempotent().await;

    // Drift: repointed by hand.
    let fields = h
        .drift_and_dryrun(&v1, &link_id, || {
            std::fs::remove_file(&link).unwrap();
            std::os::unix::fs::symlink("/elsewhere", &link).unwrap();
        })
        .await;
    assert_eq!(fields, ["target"]);
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("/elsewhere"));
    h.heal("the link", || std::fs::read_link(&link).is_ok_and(|t| t == Path::new("target")))
        .await;

    // A file in the way is refused without `force`, replaced with it.
    let mut both = link_only.clone();
    both.as_array_mut()
        .unwrap()
        .push(json!({ "id": blocked_id, "adaptor": "symlink@0.1.0", "attributes": { "target": "target" } }));
    h.scheduler.release(h.version(2, both.clone())).unwrap();
    let snap = h.scheduler.settled().await.unwrap();
    assert_eq!(snap.count(Status::Failed), 1, "{snap:?}");
    let failures = h.failures();
    assert!(
        failures.iter().any(|f| f.contains("is a file, not a symlink; set `force: true`")),
        "{failures:?}"
    );
    assert_eq!(std::fs::read_to_string(&blocked).unwrap(), "keep me");
    both[1]["attributes"]["force"] = true.into();
    h.deploy(h.version(3, both.clone()), Status::Deployed).await;
    assert_eq!(std::fs::read_link(&blocked).unwrap(), Path::new("target"));

    // Purge removes the links, never what they point to.
    h.deploy(h.version(4, purged(both)), Status::Deployed).await;
    assert!(std::fs::symlink_metadata(&link).is_err() && std::fs::symlink_metadata(&blocked).is_err());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "t");
}

#[tokio::test(flavor = "multi_thread")]
async fn command_runs_once_per_guard_and_reports_failures() {
    let h = Harness::start("command").await;
    let (count, done, out) = (h.path("count"), h.path("done"), h.path("out"));
    let id = format!("command[{NODE},init]");
    let resources = json!([{ "id": id, "adaptor": "command@0.1.0", "attributes": {
        "shell": "echo ran >> count; touch done; pwd > out; echo \"$GREETING\" >> out",
        "cwd": h.scratch.to_str().unwrap(),
        "env": { "GREETING": "hello there" },
        "creates": done,
    } }]);
    let v1 = h.version(1, resources.clone());
    h.deploy(v1.clone(), Status::Deployed).await;
    let runs = || std::fs::read_to_string(&count).unwrap_or_default().lines().count();
    assert_eq!(runs(), 1);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        format!("{}\nhello there\n", h.scratch.display())
    );
    h.assert_idempotent().await;
    assert_eq!(runs(), 1, "the guard stopped a second run");

    // Drift: the marker removed. The dryrun says it would run, and runs nothing.
    let fields = h.drift_and_dryrun(&v1, &id, || std::fs::remove_file(&done).unwrap()).await;
    assert_eq!(fields, ["run"]);
    assert_eq!(runs(), 1);
    h.heal("the command's marker", || Path::new(&done).exists()).await;
    assert_eq!(runs(), 2);

    // `unless` and `onlyif` guards; a failure carries the exit code and stderr.
    let guarded = json!([
        { "id": format!("command[{NODE},skipped]"), "adaptor": "command@0.1.0", "attributes": {
            "argv": ["touch", h.path("never")], "unless": "true" } },
        { "id": format!("command[{NODE},not-only]"), "adaptor": "command@0.1.0", "attributes": {
            "argv": ["touch", h.path("never")], "onlyif": "false" } },
    ]);
    h.deploy(h.version(2, guarded), Status::Deployed).await;
    assert!(!Path::new(&h.path("never")).exists());
    let failing = json!([{ "id": format!("command[{NODE},boom]"), "adaptor": "command@0.1.0", "attributes": {
        "argv": ["sh", "-c", "echo starting; echo 'disk on fire' >&2; exit 3"], "unless": "false" } }]);
    h.scheduler.release(h.version(3, failing.clone())).unwrap();
    assert_eq!(h.scheduler.settled().await.unwrap().count(Status::Failed), 1);
    let failures = h.failures();
    assert!(
        failures
            .iter()
            .any(|f| f.ends_with("`sh -c echo starting; echo 'disk on fire' >&2; exit 3` exited with 3: disk on fire")),
        "{failures:?}"
    );

    // Purge has nothing to undo and succeeds.
    h.deploy(h.version(4, purged(resources)), Status::Deployed).await;
}

/// The pid recorded in `<state_dir>/<name>.pid`, when the file exists.
fn recorded_pid(state_dir: &Path, name: &str) -> Option<u32> {
    let text = std::fs::read_to_string(state_dir.join(format!("{name}.pid"))).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Alive and not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

#[tokio::test(flavor = "multi_thread")]
async fn process_starts_restarts_on_change_heals_and_stops() {
    let h = Harness::start("process").await;
    let state_dir = h.scratch.join("state");
    let greeting = h.path("greeting");
    let id = format!("process[{NODE},sleeper]");
    let spec = |version: &str, word: &str| {
        json!([{ "id": id, "adaptor": "process@0.1.0", "attributes": {
            "argv": ["/bin/sh", "-c", format!("echo \"$WORD\" > {greeting}; exec sleep 120")],
            "env": { "WORD": word },
            "version": version,
            "state_dir": state_dir.to_str().unwrap(),
            "stop_timeout_ms": 2000,
        } }])
    };
    let v1 = h.version(1, spec("1", "one"));
    h.deploy(v1.clone(), Status::Deployed).await;
    let first = recorded_pid(&state_dir, "sleeper").expect("pid recorded");
    assert!(alive(first));
    assert_eq!(std::fs::read_to_string(&greeting).unwrap(), "one\n");
    h.assert_idempotent().await;
    assert_eq!(recorded_pid(&state_dir, "sleeper"), Some(first), "not restarted");

    // Drift: killed by hand. The dryrun sees it stopped and starts nothing.
    let fields = h
        .drift_and_dryrun(&v1, &id, || {
            let killed = std::process::Command::new("kill").args(["-KILL", &first.to_string()]).status();
            assert!(killed.unwrap().success());
            let deadline = Instant::now() + Duration::from_secs(5);
            while alive(first) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        })
        .await;
    assert_eq!(fields, ["state"]);
    assert_eq!(recorded_pid(&state_dir, "sleeper"), Some(first));
    h.heal("the killed process", || {
        recorded_pid(&state_dir, "sleeper").is_some_and(|p| p != first && alive(p))
    })
    .await;
    let second = recorded_pid(&state_dir, "sleeper").unwrap();

    // A new version and environment restart it.
    h.deploy(h.version(2, spec("2", "two")), Status::Deployed).await;
    let third = recorded_pid(&state_dir, "sleeper").unwrap();
    assert_ne!(third, second);
    assert!(alive(third) && !alive(second));
    assert_eq!(std::fs::read_to_string(&greeting).unwrap(), "two\n");
    let restarted = h.recorder.0.lock().unwrap().last().unwrap().1.messages.join("; ");
    assert!(restarted.contains("restarted because env, version changed"), "{restarted}");

    // Stopped, then purged: dead, and its state is gone.
    let mut stopped = spec("2", "two");
    stopped[0]["attributes"]["state"] = "stopped".into();
    h.deploy(h.version(3, stopped.clone()), Status::Deployed).await;
    assert!(!alive(third));
    assert_eq!(recorded_pid(&state_dir, "sleeper"), None);
    h.assert_idempotent().await;
    h.deploy(h.version(4, spec("2", "two")), Status::Deployed).await;
    let fourth = recorded_pid(&state_dir, "sleeper").unwrap();
    h.deploy(h.version(5, purged(spec("2", "two"))), Status::Deployed).await;
    assert!(!alive(fourth));
    let left: Vec<_> = std::fs::read_dir(&state_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn directory_with_parents_mode_and_purge() {
    let h = Harness::start("directory").await;
    let (top, leaf) = (h.path("srv"), h.path("srv/app/data"));
    let (top_id, leaf_id) = (format!("directory[{NODE},{top}]"), format!("directory[{NODE},{leaf}]"));
    let resources = json!([
        { "id": top_id, "adaptor": "directory@0.1.0", "attributes": { "mode": "0755" } },
        { "id": leaf_id, "adaptor": "directory@0.1.0", "attributes": {
            "mode": "0750", "owner": sshd::TEST_USER, "group": "65534" }, "requires": [top_id] },
    ]);
    let v1 = h.version(1, resources.clone());
    h.deploy(v1.clone(), Status::Deployed).await;
    let mode = |p: &str| std::fs::metadata(p).map(|m| (m.is_dir(), m.mode() & 0o7777)).ok();
    let owner = |p: &str| std::fs::metadata(p).map(|m| (m.uid(), m.gid())).ok();
    assert_eq!(mode(&leaf), Some((true, 0o750)), "created with its missing parent");
    assert_eq!(owner(&leaf), Some((uid_of(sshd::TEST_USER), 65534)));
    assert_eq!(mode(&top), Some((true, 0o755)));
    h.assert_idempotent().await;

    // Drift: the owner changed by hand.
    let fields = h
        .drift_and_dryrun(&v1, &leaf_id, || std::os::unix::fs::chown(&leaf, Some(0), Some(0)).unwrap())
        .await;
    assert_eq!(fields, ["owner", "group"]);
    h.heal("the directory's owner", || owner(&leaf) == Some((uid_of(sshd::TEST_USER), 65534)))
        .await;

    // Drift: the mode changed by hand. A dryrun names it and changes nothing.
    let fields = h
        .drift_and_dryrun(&v1, &leaf_id, || {
            std::fs::set_permissions(&leaf, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap()
        })
        .await;
    assert_eq!(fields, ["mode"]);
    assert_eq!(mode(&leaf), Some((true, 0o700)));
    h.heal("the directory's mode", || mode(&leaf) == Some((true, 0o750))).await;

    // Drift: the directory removed by hand; self-healing makes it again.
    let fields = h.drift_and_dryrun(&v1, &leaf_id, || std::fs::remove_dir(&leaf).unwrap()).await;
    assert!(!fields.is_empty(), "a missing directory is a change");
    h.heal("the removed directory", || mode(&leaf) == Some((true, 0o750))).await;

    // Purge: the leaf goes first (dependents first), then the top with what is left in it.
    std::fs::write(format!("{leaf}/keep"), "x").unwrap();
    let purge = json!([
        { "id": top_id, "adaptor": "directory@0.1.0", "attributes": { "purge_recursive": true }, "purged": true },
        { "id": leaf_id, "adaptor": "directory@0.1.0", "attributes": { "purge_recursive": true }, "requires": [top_id], "purged": true },
    ]);
    h.deploy(h.version(2, purge), Status::Deployed).await;
    assert!(!Path::new(&top).exists(), "purged with its content");
    assert!(h.failures().is_empty(), "{:#?}", h.failures());
    drop(h.sshd);
}

//! The `package` and `http-object` adaptors through the scheduler, against real parts: Debian
//! packages built by the test, installed from a local apt repository on a real SSH node (this
//! machine, through the test harness's `sshd`), and JSON objects on a real HTTP server the test
//! starts. Each converges, stays unchanged on a second pass, repairs drift by self-healing, shows
//! its changes in a dryrun, and goes away when purged.

mod http_object;
mod package;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orc_host::executor::{ActionReport, Outcome};
use orc_host::intent::Intent;
use orc_host::scheduler::{BoxFuture, Event, Scheduler, Settings, Sink, Snapshot, Trigger, Version};
use orc_manifest::{Digest, PluginKind};
use orc_runtime::{CallContext, Grants, Runtime, RuntimeConfig};
use serde_json::json;

/// Every action the scheduler reports.
#[derive(Default)]
pub struct Recorder(Mutex<Vec<Event>>);

impl Sink for Recorder {
    fn record(&self, events: Vec<Event>) -> BoxFuture<'_, ()> {
        self.0.lock().unwrap().extend(events);
        Box::pin(std::future::ready(()))
    }
}

impl Recorder {
    /// The actions of `resource`, in order, with their triggers.
    pub fn actions(&self, resource: &str) -> Vec<(Trigger, ActionReport)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                Event::Action { trigger, report, .. } if report.resource == resource => Some((*trigger, report.clone())),
                _ => None,
            })
            .collect()
    }

    /// The last action of `resource` for a release (not a repair).
    pub fn last_deploy(&self, resource: &str) -> ActionReport {
        self.actions(resource)
            .into_iter()
            .rev()
            .find(|(t, _)| *t == Trigger::Deploy)
            .unwrap_or_else(|| panic!("no deploy action for {resource}"))
            .1
    }

    /// How many actions of `resource` with `trigger` ended with `outcome`.
    pub fn count(&self, resource: &str, trigger: Trigger, outcome: Outcome) -> usize {
        self.actions(resource)
            .iter()
            .filter(|(t, r)| *t == trigger && r.outcome == outcome)
            .count()
    }

    /// Every action report, as JSON text (to look for what must never appear).
    pub fn all_reports_text(&self) -> String {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|e| serde_json::to_string(e).unwrap())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

pub struct Harness {
    pub runtime: Runtime,
    pub ctx: CallContext,
    pub recorder: Arc<Recorder>,
}

impl Harness {
    pub fn new(ctx: CallContext) -> Harness {
        let runtime = Runtime::new(RuntimeConfig {
            max_instances: 16,
            ..RuntimeConfig::default()
        })
        .unwrap();
        Harness {
            runtime,
            ctx,
            recorder: Arc::default(),
        }
    }

    /// A version of `resources`, each adaptor loaded from the built-in artifacts.
    pub fn version(&self, number: u64, resources: serde_json::Value) -> Arc<Version> {
        let intent = Intent::parse(json!({ "resources": resources }).to_string().as_bytes()).unwrap();
        let plugins = intent
            .resources
            .iter()
            .map(|r| {
                let name = r.adaptor.to_string();
                let name = name.split('@').next().unwrap();
                let artifact = orc_plugin_artifacts::by_name(name).unwrap();
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

    pub fn scheduler(&self, settings: Settings) -> Scheduler {
        Scheduler::spawn(self.ctx.clone(), settings, self.recorder.clone(), HashMap::new())
    }
}

/// Self-healing every `interval`; no retries, so failures stay visible.
pub fn self_healing(interval: Duration) -> Settings {
    Settings {
        env_concurrency: 4,
        node_concurrency: 2,
        retry_interval: Duration::from_secs(3600),
        max_retry_interval: Duration::from_secs(3600),
        repair_interval: Some(interval),
    }
}

/// Polls until `check` holds after the scheduler settled, or fails after 60 s.
pub async fn until(scheduler: &Scheduler, what: &str, check: impl Fn() -> bool) -> Snapshot {
    orc_tests::wait_for(what, Duration::from_secs(60), async || {
        let snapshot = scheduler.settled().await.unwrap();
        if check() { Ok(snapshot) } else { Err(format!("{snapshot:?}")) }
    })
    .await
}

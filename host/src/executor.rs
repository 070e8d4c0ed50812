//! Executors: run one action (deploy or dryrun) for one resource through its adaptor — read,
//! diff, then apply or delete — in a fresh plugin instance, and report exactly what happened.
//! Deploy, repair, retry and dryrun all go through [`execute`]; dryrun stops before enforcing.
//!
//! A cluster task (resource type `task`, handled by an automator plugin) runs the same way
//! with the automator's `check` in place of read + diff and `perform` in place of apply; a
//! purged `start` task performs `stop`, a purged `install` task performs `remove`, and the other
//! purged steps have nothing to undo (the planner leaves them out; one in a version stored before
//! that succeeds without calling the automator).

use std::future::Future;
use std::time::{Duration, Instant};

use orc_manifest::PluginKind;
use orc_runtime::wit::{Action, Level, Target, Task};
use orc_runtime::{CallContext, CallError, Change, Plugin, PluginErrorKind, bounded};
use serde::Serialize;
use tracing::Instrument;

use crate::intent::ResourceSpec;

/// Whether to enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Deploy,
    Dryrun,
}

/// How an action ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Already in the desired state (onboarding and repair that found nothing to do).
    Unchanged,
    /// Changes were enforced (or, for a purged resource, it was removed).
    Changed,
    /// Dryrun: these changes would be made.
    WouldChange,
    /// The adaptor or the plugin failed.
    Failed,
    /// The target (node, device) cannot be reached now.
    Unavailable,
    /// Not attempted because a resource it requires did not succeed.
    Skipped,
}

impl Outcome {
    pub fn succeeded(self) -> bool {
        matches!(self, Outcome::Unchanged | Outcome::Changed | Outcome::WouldChange)
    }
}

/// What one action did: the action-log entry.
#[derive(Debug, Clone, Serialize)]
pub struct ActionReport {
    pub resource: String,
    pub mode: Mode,
    pub outcome: Outcome,
    pub changes: Vec<Change>,
    pub messages: Vec<String>,
    /// `{code, message}` when the action failed; `code` is the runtime's (`failed`, `crashed`,
    /// `timed_out`, `memory_limit`, …) or `skipped`.
    pub error: Option<ActionError>,
    /// When the action started, in milliseconds since the Unix epoch.
    pub started_at: i64,
    #[serde(with = "duration_ms")]
    pub duration: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActionError {
    pub code: String,
    pub message: String,
}

mod duration_ms {
    pub fn serialize<S: serde::Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1e3)
    }
}

/// The WIT view of a resource.
pub fn target_of(spec: &ResourceSpec) -> Target {
    Target {
        id: spec.id.to_string(),
        resource_type: spec.id.resource_type.clone(),
        node: spec.id.node.clone(),
        key: spec.id.key.clone(),
        attributes: spec.attributes.as_json().to_string(),
    }
}

/// A report for a resource that was not attempted.
pub fn skipped(spec: &ResourceSpec, mode: Mode, because: &str) -> ActionReport {
    ActionReport {
        resource: spec.id.to_string(),
        mode,
        outcome: Outcome::Skipped,
        changes: Vec::new(),
        messages: Vec::new(),
        error: Some(ActionError {
            code: "skipped".into(),
            message: format!("not attempted: {because}"),
        }),
        started_at: crate::store::now_ms(),
        duration: Duration::ZERO,
    }
}

/// `action`, or — if it panics — a `failed` report with the code `crashed` and the panic's text
/// for the resource `resource`: a panic in one action (a host function's bug, say) costs that
/// action, never the scheduler's bookkeeping or a concurrency slot.
pub async fn caught(resource: &str, mode: Mode, action: impl Future<Output = ActionReport>) -> ActionReport {
    use futures::FutureExt as _;
    let (started_at, started) = (crate::store::now_ms(), Instant::now());
    match std::panic::AssertUnwindSafe(action).catch_unwind().await {
        Ok(report) => report,
        Err(payload) => {
            let text = panic_text(payload.as_ref());
            tracing::error!(resource, panic = %text, "a resource action panicked");
            ActionReport {
                resource: resource.to_string(),
                mode,
                outcome: Outcome::Failed,
                changes: Vec::new(),
                messages: Vec::new(),
                error: Some(ActionError {
                    code: "crashed".into(),
                    message: format!("the host panicked while running the action: {text}"),
                }),
                started_at,
                duration: started.elapsed(),
            }
        }
    }
}

/// The message a panic carried.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Runs one action for `spec` through `plugin`.
pub async fn execute(plugin: &Plugin, ctx: &CallContext, spec: &ResourceSpec, mode: Mode) -> ActionReport {
    let span = tracing::info_span!("resource_action", resource = %spec.id, ?mode, plugin = %plugin.manifest.reference());
    execute_in_span(plugin, ctx, spec, mode).instrument(span).await
}

async fn execute_in_span(plugin: &Plugin, ctx: &CallContext, spec: &ResourceSpec, mode: Mode) -> ActionReport {
    let started = Instant::now();
    let target = target_of(spec);
    let mut report = ActionReport {
        resource: spec.id.to_string(),
        mode,
        outcome: Outcome::Failed,
        changes: Vec::new(),
        messages: Vec::new(),
        error: None,
        started_at: crate::store::now_ms(),
        duration: Duration::ZERO,
    };
    match run(plugin, ctx, spec, &target, mode, &mut report).await {
        Ok(outcome) => report.outcome = outcome,
        Err(e) => {
            report.outcome = match e.plugin_error() {
                Some(pe) if pe.kind == PluginErrorKind::Unavailable => Outcome::Unavailable,
                _ => Outcome::Failed,
            };
            let mut message = e.to_string();
            bounded::storable(&mut message, bounded::MAX_ERROR);
            tracing::warn!(code = e.code(), error = %message, "action failed");
            report.error = Some(ActionError {
                code: e.code().to_string(),
                message,
            });
        }
    }
    bound(&mut report);
    for change in &mut report.changes {
        spec.redact_change(&change.field, [&mut change.current, &mut change.desired]);
    }
    report.duration = started.elapsed();
    report
}

/// What a plugin handed back, bounded before it is printed, logged or stored (the changes were
/// used whole by `apply`).
fn bound(report: &mut ActionReport) {
    report.messages = bounded::messages(std::mem::take(&mut report.messages));
    let total = report.changes.len();
    if total > bounded::MAX_CHANGES {
        report.changes.truncate(bounded::MAX_CHANGES);
        report
            .messages
            .push(format!("… [{} more changes not kept]", total - bounded::MAX_CHANGES));
    }
    for change in &mut report.changes {
        bounded::storable(&mut change.field, bounded::MAX_MESSAGE);
        for value in [&mut change.current, &mut change.desired].into_iter().flatten() {
            let text = value.to_string();
            if text.len() > bounded::MAX_VALUE {
                *value = serde_json::Value::String(format!("[a value of {} bytes, not kept]", text.len()));
            }
        }
    }
}

async fn run(
    plugin: &Plugin,
    ctx: &CallContext,
    spec: &ResourceSpec,
    target: &Target,
    mode: Mode,
    report: &mut ActionReport,
) -> Result<Outcome, CallError> {
    if plugin.manifest.kind == PluginKind::Automator {
        return run_task(plugin, ctx, spec, mode, report).await;
    }
    let mut instance = plugin.adaptor(ctx).await?;
    let result = async {
        let current = instance.read(target).await?;
        if spec.purged {
            let Some(current) = current else { return Ok(Outcome::Unchanged) };
            report.changes = vec![Change {
                field: "purged".into(),
                current: Some(serde_json::Value::Bool(false)),
                desired: Some(serde_json::Value::Bool(true)),
            }];
            if mode == Mode::Dryrun {
                return Ok(Outcome::WouldChange);
            }
            report.messages = instance.delete(target, &current).await?;
            return Ok(Outcome::Changed);
        }
        let changes = instance.diff(target, current.as_deref()).await?;
        if changes.is_empty() {
            return Ok(Outcome::Unchanged);
        }
        report.changes = changes;
        if mode == Mode::Dryrun {
            return Ok(Outcome::WouldChange);
        }
        report.messages = instance.apply(target, current.as_deref(), &report.changes).await?;
        Ok(Outcome::Changed)
    }
    .await;
    report.messages.extend(log_messages(instance.take_logs()));
    result
}

/// A cluster task through its automator: `check`, then (deploying, with changes) `perform`.
async fn run_task(
    plugin: &Plugin,
    ctx: &CallContext,
    spec: &ResourceSpec,
    mode: Mode,
    report: &mut ActionReport,
) -> Result<Outcome, CallError> {
    let Some(task) = task_of(spec) else {
        return Err(CallError::Host {
            plugin: plugin.manifest.reference(),
            message: format!("`{}` is not a cluster task (attributes cluster, service, action, config)", spec.id),
        });
    };
    let Some(task) = task else { return Ok(Outcome::Unchanged) };
    let mut instance = plugin.automator(ctx).await?;
    let result = async {
        let changes = instance.check(&task).await?;
        if changes.is_empty() {
            return Ok(Outcome::Unchanged);
        }
        report.changes = changes;
        if mode == Mode::Dryrun {
            return Ok(Outcome::WouldChange);
        }
        let outcome = instance.perform(&task).await?;
        report.messages = outcome.messages;
        if outcome.output != "{}" && !outcome.output.is_empty() {
            report.messages.push(format!("output: {}", outcome.output));
        }
        Ok(Outcome::Changed)
    }
    .await;
    report.messages.extend(log_messages(instance.take_logs()));
    result
}

/// The automator's task for a task resource: `None` when the attributes are not a task's;
/// `Some(None)` when a purged step has nothing to undo.
fn task_of(spec: &ResourceSpec) -> Option<Option<Task>> {
    /// A task's attributes, read from their canonical text without building a tree: the
    /// configuration and layout are handed on as the text they are.
    #[derive(serde::Deserialize)]
    struct TaskAttributes<'a> {
        #[serde(borrow)]
        cluster: std::borrow::Cow<'a, str>,
        #[serde(borrow)]
        service: std::borrow::Cow<'a, str>,
        #[serde(borrow)]
        action: std::borrow::Cow<'a, str>,
        #[serde(borrow)]
        config: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow)]
        layout: Option<&'a serde_json::value::RawValue>,
    }
    let attributes: TaskAttributes = serde_json::from_str(spec.attributes.as_json()).ok()?;
    let action = match (attributes.action.as_ref(), spec.purged) {
        ("bootstrap", false) => Action::Bootstrap,
        ("install", false) => Action::Install,
        ("configure", false) => Action::Configure,
        ("initialize", false) => Action::Initialize,
        ("start", false) => Action::Start,
        ("start", true) => Action::Stop,
        ("install", true) => Action::Remove,
        ("bootstrap" | "configure" | "initialize", true) => return Some(None),
        _ => return None,
    };
    let json = |raw: Option<&serde_json::value::RawValue>| raw.map_or_else(|| "{}".to_string(), |v| v.get().to_string());
    Some(Some(Task {
        cluster: attributes.cluster.into_owned(),
        service: attributes.service.into_owned(),
        node: spec.id.node.clone(),
        action,
        config: json(attributes.config),
        layout: json(attributes.layout),
    }))
}

/// What a plugin logged during an action, as action-log messages.
fn log_messages(lines: Vec<orc_runtime::LogLine>) -> impl Iterator<Item = String> {
    lines.into_iter().map(|l| format!("[{}] {}", level_name(l.level), l.message))
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::Trace => "trace",
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warn",
        Level::Error => "error",
    }
}

//! Calling plugins: one instance per resource action (or task), every call under the epoch
//! deadline, the memory limit and a host-side timeout, and every failure classified.
//!
//! An instance is cheap (pooling allocator, WASI built lazily) and is dropped after its action,
//! so nothing a plugin leaves in its memory survives into the next action.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use std::time::Instant;

use wasmtime::{Store, Trap, UpdateDeadline};

use crate::bindings::adaptor::Adaptor;
use crate::bindings::adaptor::exports::orc::plugin::resource_adaptor::Target;
use crate::bindings::automator::Automator;
use crate::bindings::automator::exports::orc::plugin::service_automator::{Outcome, Task};
use crate::bindings::host::orc::plugin::log::Level;
use crate::bindings::host::orc::plugin::types::{self as wit_types};
use crate::bindings::solver::Solver;
use crate::bindings::solver::exports::orc::plugin::cluster_solver::{LayoutRequest, Placement, SolveError};
use crate::capability::CallContext;
use crate::error::{CallError, PluginError, PluginErrorKind};
use crate::plugin::{KindPre, Plugin};
use crate::state::CallState;

/// A line a plugin logged during a call.
#[derive(Debug, Clone)]
pub struct LogLine {
    pub level: Level,
    pub message: String,
}

/// One difference between current and desired state, with values as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub field: String,
    pub current: Option<serde_json::Value>,
    pub desired: Option<serde_json::Value>,
}

/// Host-side slack on top of the epoch deadline, for calls stuck in a host function.
const HOST_SLACK: Duration = Duration::from_secs(2);

/// A live instance of one plugin and its store.
struct Session {
    store: Store<CallState>,
    plugin: Arc<str>,
    deadline: Duration,
    poisoned: Option<String>,
}

impl Session {
    fn new(plugin: &Plugin, ctx: &CallContext) -> Session {
        let config = &plugin.config;
        let deadline = ctx.deadline.unwrap_or(config.call_deadline);
        let memory = ctx
            .memory_limit_bytes
            .unwrap_or(config.memory_limit_bytes)
            .min(config.memory_limit_bytes);
        let mut store = Store::new(
            &plugin.engine,
            CallState::new(&plugin.manifest.name, ctx.clone(), plugin.capabilities, memory),
        );
        store.limiter(|s| &mut s.limiter);
        // At every epoch tick the guest either yields to the async executor (so a long call never
        // starves other tasks on the same thread) or, past its deadline, is interrupted.
        store.epoch_deadline_callback(|ctx| {
            if Instant::now() >= ctx.data().deadline_at {
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        let mut session = Session {
            store,
            plugin: plugin.name.clone(),
            deadline,
            poisoned: None,
        };
        session.arm();
        session
    }

    /// Sets the deadline for the next call and clears the limiter's flag.
    fn arm(&mut self) {
        self.store.set_epoch_deadline(1);
        let data = self.store.data_mut();
        data.deadline_at = Instant::now() + self.deadline;
        data.limiter.hit = false;
    }

    fn begin(&mut self) -> Result<(), CallError> {
        if let Some(why) = &self.poisoned {
            return Err(CallError::Host {
                plugin: self.plugin.to_string(),
                message: format!("the instance is unusable after an earlier failure ({why})"),
            });
        }
        self.arm();
        Ok(())
    }

    fn limit(&self) -> Duration {
        self.deadline + HOST_SLACK
    }

    /// Turns a call's outcome into the plugin's value or a classified error.
    fn finish<T>(
        &mut self,
        outcome: Result<wasmtime::Result<Result<T, wit_types::Error>>, tokio::time::error::Elapsed>,
    ) -> Result<T, CallError> {
        let plugin = self.plugin.to_string();
        match outcome {
            Err(_) => {
                self.poisoned = Some("host-side timeout".into());
                Err(CallError::TimedOut {
                    plugin,
                    after: self.deadline,
                })
            }
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(e))) => Err(CallError::Failed {
                plugin,
                error: plugin_error(e),
            }),
            Ok(Err(trap)) => Err(self.classify(trap)),
        }
    }

    fn classify(&mut self, err: wasmtime::Error) -> CallError {
        let plugin = self.plugin.to_string();
        let state = self.store.data();
        let error = if err.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
            CallError::TimedOut {
                plugin,
                after: self.deadline,
            }
        } else if state.limiter.hit {
            CallError::MemoryLimit {
                plugin,
                limit_bytes: state.limiter.limit,
            }
        } else {
            let trap = match err.downcast_ref::<Trap>() {
                Some(t) => t.to_string(),
                None => format!("{err:#}"),
            };
            let stderr = state.stderr_text();
            let message = if stderr.is_empty() {
                trap
            } else {
                format!("{trap}; the plugin wrote: {stderr}")
            };
            CallError::Crashed { plugin, message }
        };
        tracing::warn!(plugin = %self.plugin, code = error.code(), detail = ?err, "plugin call failed");
        self.poisoned = Some(error.code().to_string());
        error
    }

    fn invalid_output(&self, message: String) -> CallError {
        CallError::InvalidOutput {
            plugin: self.plugin.to_string(),
            message,
        }
    }

    fn take_logs(&mut self) -> Vec<LogLine> {
        std::mem::take(&mut self.store.data_mut().logs)
    }
}

fn plugin_error(e: wit_types::Error) -> PluginError {
    let kind = match e.kind {
        wit_types::ErrorKind::InvalidInput => PluginErrorKind::InvalidInput,
        wit_types::ErrorKind::Unavailable => PluginErrorKind::Unavailable,
        wit_types::ErrorKind::Retryable => PluginErrorKind::Retryable,
        wit_types::ErrorKind::Permanent => PluginErrorKind::Permanent,
        wit_types::ErrorKind::Denied => PluginErrorKind::Denied,
    };
    PluginError { kind, message: e.message }
}

/// Instantiates under the deadline; a trap in a start function is classified like any other.
macro_rules! instantiate {
    ($plugin:expr, $ctx:expr, $variant:ident, $what:literal) => {{
        let plugin: &Plugin = $plugin;
        let KindPre::$variant(pre) = &plugin.pre else {
            return Err(CallError::Host {
                plugin: plugin.name.to_string(),
                message: format!("`{}` is a {}, not {}", plugin.name, plugin.manifest.kind, $what),
            });
        };
        let mut session = Session::new(plugin, $ctx);
        let limit = session.limit();
        match tokio::time::timeout(limit, pre.instantiate_async(&mut session.store)).await {
            Ok(Ok(bindings)) => (session, bindings),
            Ok(Err(e)) => {
                // Not a trap of the guest (e.g. the pool's instance limit): a host condition.
                if e.downcast_ref::<Trap>().is_none() && !session.store.data().limiter.hit {
                    return Err(CallError::Host {
                        plugin: plugin.name.to_string(),
                        message: format!("{e:#}"),
                    });
                }
                return Err(session.classify(e));
            }
            Err(_) => {
                return Err(CallError::TimedOut {
                    plugin: plugin.name.to_string(),
                    after: session.deadline,
                });
            }
        }
    }};
}

impl Plugin {
    /// A fresh adaptor instance for one resource action.
    pub async fn adaptor(&self, ctx: &CallContext) -> Result<AdaptorInstance, CallError> {
        let (session, bindings) = instantiate!(self, ctx, Adaptor, "an adaptor");
        Ok(AdaptorInstance { session, bindings })
    }

    /// A fresh solver instance.
    pub async fn solver(&self, ctx: &CallContext) -> Result<SolverInstance, CallError> {
        let (session, bindings) = instantiate!(self, ctx, Solver, "a solver");
        Ok(SolverInstance { session, bindings })
    }

    /// A fresh automator instance for one task.
    pub async fn automator(&self, ctx: &CallContext) -> Result<AutomatorInstance, CallError> {
        let (session, bindings) = instantiate!(self, ctx, Automator, "an automator");
        Ok(AutomatorInstance { session, bindings })
    }
}

/// An adaptor instance: `read`, `diff`, `apply`, `delete` for one resource.
pub struct AdaptorInstance {
    session: Session,
    bindings: Adaptor,
}

impl AdaptorInstance {
    /// The current state as JSON text; `None` when the resource does not exist.
    pub async fn read(&mut self, target: &Target) -> Result<Option<String>, CallError> {
        self.session.begin()?;
        let s = &mut self.session;
        let out = tokio::time::timeout(
            s.limit(),
            self.bindings.orc_plugin_resource_adaptor().call_read(&mut s.store, target),
        )
        .await;
        let current = s.finish(out)?;
        if let Some(text) = &current {
            serde_json::from_str::<serde_json::Value>(text).map_err(|e| s.invalid_output(format!("`read` returned invalid JSON: {e}")))?;
        }
        Ok(current)
    }

    /// The changes that would bring `current` to the desired state.
    pub async fn diff(&mut self, target: &Target, current: Option<&str>) -> Result<Vec<Change>, CallError> {
        self.session.begin()?;
        let current = current.map(str::to_string);
        let s = &mut self.session;
        let out = tokio::time::timeout(
            s.limit(),
            self.bindings
                .orc_plugin_resource_adaptor()
                .call_diff(&mut s.store, target, current.as_ref()),
        )
        .await;
        let changes = s.finish(out)?;
        changes.into_iter().map(|c| change_from_wit(s, "diff", c)).collect()
    }

    /// Enforces the desired state; returns the plugin's messages.
    pub async fn apply(&mut self, target: &Target, current: Option<&str>, changes: &[Change]) -> Result<Vec<String>, CallError> {
        self.session.begin()?;
        let wit_changes: Vec<wit_types::Change> = changes.iter().map(change_to_wit).collect();
        let current = current.map(str::to_string);
        let s = &mut self.session;
        let limit = s.limit();
        let call = self
            .bindings
            .orc_plugin_resource_adaptor()
            .call_apply(&mut s.store, target, current.as_ref(), &wit_changes);
        let out = tokio::time::timeout(limit, call).await;
        s.finish(out)
    }

    /// Removes a purged resource; returns the plugin's messages.
    pub async fn delete(&mut self, target: &Target, current: &str) -> Result<Vec<String>, CallError> {
        self.session.begin()?;
        let current = current.to_string();
        let s = &mut self.session;
        let out = tokio::time::timeout(
            s.limit(),
            self.bindings
                .orc_plugin_resource_adaptor()
                .call_delete(&mut s.store, target, &current),
        )
        .await;
        s.finish(out)
    }

    /// Lines the plugin logged so far (taken: a second call returns only newer lines).
    pub fn take_logs(&mut self) -> Vec<LogLine> {
        self.session.take_logs()
    }
}

/// A change a plugin returned from `function` (`diff`, `check`), its values parsed as JSON.
fn change_from_wit(s: &Session, function: &str, c: wit_types::Change) -> Result<Change, CallError> {
    let parse = |v: Option<String>, which: &str| -> Result<Option<serde_json::Value>, CallError> {
        v.map(|t| {
            serde_json::from_str(&t).map_err(|e| {
                s.invalid_output(format!(
                    "`{function}` returned invalid JSON for the {which} value of `{}`: {e}",
                    c.field
                ))
            })
        })
        .transpose()
    };
    Ok(Change {
        current: parse(c.current.clone(), "current")?,
        desired: parse(c.desired.clone(), "desired")?,
        field: c.field,
    })
}

fn change_to_wit(c: &Change) -> wit_types::Change {
    wit_types::Change {
        field: c.field.clone(),
        current: c.current.as_ref().map(|v| v.to_string()),
        desired: c.desired.as_ref().map(|v| v.to_string()),
    }
}

/// A solver instance.
pub struct SolverInstance {
    session: Session,
    bindings: Solver,
}

impl SolverInstance {
    /// The plugin's layout, or its structured refusal. `Ok(Err(..))` is the solver saying "no
    /// valid layout"; `Err` is the call failing.
    pub async fn solve(&mut self, request: &LayoutRequest) -> Result<Result<Vec<Placement>, SolveError>, CallError> {
        self.session.begin()?;
        let s = &mut self.session;
        let out = tokio::time::timeout(
            s.limit(),
            self.bindings.orc_plugin_cluster_solver().call_solve(&mut s.store, request),
        )
        .await;
        match out {
            Ok(Ok(Err(SolveError::Failed(e)))) => Err(CallError::Failed {
                plugin: s.plugin.to_string(),
                error: plugin_error(e),
            }),
            Ok(Ok(result)) => Ok(result),
            Ok(Err(trap)) => Err(s.classify(trap)),
            Err(_) => {
                s.poisoned = Some("host-side timeout".into());
                Err(CallError::TimedOut {
                    plugin: s.plugin.to_string(),
                    after: s.deadline,
                })
            }
        }
    }

    pub fn take_logs(&mut self) -> Vec<LogLine> {
        self.session.take_logs()
    }
}

/// An automator instance.
pub struct AutomatorInstance {
    session: Session,
    bindings: Automator,
}

impl AutomatorInstance {
    /// Whether the task's action holds on the node now: empty when it does, else what `perform`
    /// would change. Values that are not JSON are `invalid_output`.
    pub async fn check(&mut self, task: &Task) -> Result<Vec<Change>, CallError> {
        self.session.begin()?;
        let s = &mut self.session;
        let out = tokio::time::timeout(
            s.limit(),
            self.bindings.orc_plugin_service_automator().call_check(&mut s.store, task),
        )
        .await;
        let changes = s.finish(out)?;
        changes.into_iter().map(|c| change_from_wit(s, "check", c)).collect()
    }

    /// Carries the task's action out; returns the plugin's messages and output.
    pub async fn perform(&mut self, task: &Task) -> Result<Outcome, CallError> {
        self.session.begin()?;
        let s = &mut self.session;
        let out = tokio::time::timeout(
            s.limit(),
            self.bindings.orc_plugin_service_automator().call_perform(&mut s.store, task),
        )
        .await;
        s.finish(out)
    }

    pub fn take_logs(&mut self) -> Vec<LogLine> {
        self.session.take_logs()
    }
}

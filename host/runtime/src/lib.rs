//! The Wasm runtime of orc: loads plugins by digest, links only the capabilities a plugin's manifest
//! requests and the environment grants, and runs every call under a deadline and a memory limit.
//!
//! Architecture invariant: this crate knows nothing of HTTP servers, SQL or scheduling. It turns
//! verified bytes into [`Plugin`]s and runs calls; the host decides which plugin to call, when, and
//! with which [`CallContext`].
//!
//! The three ways a call can go wrong are kept apart ([`CallError`]): the plugin returned an error
//! (`failed`), it trapped (`crashed`), or it ran out of time or memory (`timed-out`,
//! `memory-limit`). The runtime keeps serving after each.

mod bindings;
pub mod bounded;
mod cache;
mod calls;
pub mod capability;
mod engine;
mod error;
mod plugin;
mod state;

pub use calls::{AdaptorInstance, AutomatorInstance, Change, LogLine, SolverInstance};
pub use capability::{CallContext, Grants};
pub use engine::{Runtime, RuntimeConfig};
pub use error::{CallError, EngineError, LoadError, PluginError, PluginErrorKind};
pub use plugin::Plugin;

/// The WIT types of the three worlds, for callers that build requests (targets, layout requests,
/// tasks).
pub mod wit {
    pub use crate::bindings::adaptor::exports::orc::plugin::resource_adaptor::Target;
    pub use crate::bindings::automator::exports::orc::plugin::service_automator::{Action, Outcome, Task};
    pub use crate::bindings::host::orc::plugin::log::Level;
    pub use crate::bindings::solver::exports::orc::plugin::cluster_solver::{LayoutRequest, NoLayout, NodeInfo, Placement, SolveError};
}

/// The interface names a component imports and exports, sorted.
pub fn interfaces(runtime: &Runtime, component: &wasmtime::component::Component) -> (Vec<String>, Vec<String>) {
    let engine = &runtime.inner.engine;
    let ty = component.component_type();
    let mut imports: Vec<String> = ty.imports(engine).map(|(n, _)| n.to_string()).collect();
    let mut exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    imports.sort();
    exports.sort();
    (imports, exports)
}

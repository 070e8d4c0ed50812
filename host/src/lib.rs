//! orc-host: the host side of orc. Its folders follow an intent from the REST call to the
//! device: [`api`] (the REST API) → [`app`] (the application: environments, versions,
//! operations, clusters, nodes, tokens) → [`scheduler`] (one per environment, persisted through
//! [`store`], reporting events) → [`executor`] (one resource action through its adaptor) → the
//! Wasm runtime (`orc-runtime`) → the nodes (`orc-node`, `orc-ssh`). Beside the flow: [`intent`]
//! (the desired state, its validation, diff and pinning), [`clusters`] (templates, layouts and
//! the planner), [`processes`] (the service catalog, processes, connections), [`nodes`] (the SSH node registry), [`replicas`] (how environments spread over replicas), [`policy`] (what an environment's plugins
//! may reach), [`metrics`]; at the edges [`server`] (`orc-host serve`) and [`embedded`]
//! (`orc-host deploy`), which both hold their [`data_dir`].
//!
//! Architecture invariants: plugins are addressed only by digest (names are resolved and pinned
//! when an intent is accepted); the Wasm runtime knows nothing of intents or storage; the API
//! reaches the store only through the application; no `println!` here — output is the binary's
//! business.

pub mod access;
pub mod api;
pub mod app;
pub mod clusters;
pub mod console;
pub mod data_dir;
pub mod embedded;
pub mod error;
pub mod executor;
pub mod if_match;
pub mod intent;
pub mod json;
pub mod metrics;
mod named;
pub mod nodes;
pub mod policy;
pub mod processes;
pub mod replicas;
pub mod scheduler;
pub mod server;
pub mod status;
pub mod store;

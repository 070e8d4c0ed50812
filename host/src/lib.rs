//! orc-host: the host side of orc. It validates intents ([`intent`]), pins their adaptors
//! ([`pinning`]), runs resource actions through adaptors ([`executor`]) under one scheduler per
//! environment ([`scheduler`], persisted through [`store`]), and runs either embedded
//! ([`embedded`]: one deploy over a local data directory) or as a server ([`server`], the REST
//! API in [`api`], configured by [`config`]). Clusters ([`clusters`]) are laid out by solver
//! plugins, planned into tasks and deployed by the same scheduler through automator plugins.
//!
//! Architecture invariants: plugins are addressed only by digest (names are resolved and pinned
//! when an intent is accepted); the Wasm runtime (`orc-runtime`) knows nothing of intents or
//! storage; no `println!` here — output is the binary's business.

pub mod api;
pub mod clusters;
pub mod config;
pub mod diff;
pub mod dryrun;
pub mod embedded;
pub mod events;
pub mod executor;
pub mod intent;
pub mod memory;
pub mod metrics;
pub mod nodes;
pub mod outbound;
pub mod persistence;
pub mod pinning;
pub mod scheduler;
pub mod server;
pub mod store;

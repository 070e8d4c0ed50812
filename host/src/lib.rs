//! orc-host: the host side of orc. At this stage it validates intents ([`intent`]), runs resource
//! actions through adaptors ([`executor`]) and offers the embedded deploy ([`embedded`]): registry,
//! runtime and executors in one process over a local data directory.
//!
//! Architecture invariants: plugins are addressed only by digest (names are resolved and pinned
//! when an intent is accepted); the Wasm runtime (`orc-runtime`) knows nothing of intents or
//! storage; no `println!` here — output is the binary's business.

pub mod embedded;
pub mod executor;
pub mod intent;
pub mod persistence;
pub mod scheduler;
pub mod store;

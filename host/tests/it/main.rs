//! orc-host's integration tests, one binary with a module per suite (every test binary links
//! wasmtime; one link instead of eleven): `store`, `scheduler`, `api`, `crash`, `nodes`,
//! `adaptors`, `packages_http`, `netns`, `automators`, `clusters`, `console`. Run one suite with
//! `cargo test -p orc-host --test it <suite>::`. What several suites share and that needs
//! orc-host's types is in `support`; what needs none (sshd, PostgreSQL, polling) is in
//! `orc_tests`.

// An integration test: an unwrap that fails is the test failing, where it failed.
#![allow(clippy::unwrap_used)]

mod support;

mod adaptors;
mod api;
mod automators;
mod clusters;
mod console;
mod crash;
mod netns;
mod nodes;
mod packages_http;
mod scheduler;
mod store;

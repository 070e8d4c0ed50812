//! The orc guest SDK: write adaptors, solvers and automators as plain Rust traits over your own
//! serde types, and export them as WebAssembly components with one macro.
//!
//! A plugin crate is a `cdylib` built for `wasm32-wasip2` (`orc-plugin build` does this). It
//! depends on this crate with the feature of its kind (`adaptor`, `solver` or `automator`),
//! implements the trait of that kind and calls [`export!`]. It never sees WIT paths or JSON
//! plumbing: attributes arrive decoded, changes and states leave encoded, and decoding errors
//! become `invalid-input` errors that name the resource and the field.
//!
//! The host interfaces are wrapped in [`log`] (and the [`info!`]-style macros), [`node`],
//! [`kv`] and [`http`]. A plugin may call only those its manifest requests and the environment
//! grants; anything else fails with a `denied` [`Error`].
//!
//! # Example: an adaptor for a one-line file
//!
//! ```
//! // Cargo.toml: orc-sdk = { workspace = true, features = ["adaptor"] }
//! use orc_sdk::node::{self, Mode};
//! use orc_sdk::{Adaptor, Change, Changes, Result, Target};
//! use serde::{Deserialize, Serialize};
//!
//! /// Resource type `motd`: the key is the path, the one attribute the greeting.
//! struct Motd;
//!
//! #[derive(Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Desired {
//!     greeting: String,
//! }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Current {
//!     greeting: String,
//! }
//!
//! impl Adaptor for Motd {
//!     type Desired = Desired;
//!     type Current = Current;
//!
//!     fn read(target: &Target, _desired: &Desired) -> Result<Option<Current>> {
//!         let content = node::read_file(&target.node, &target.key)?;
//!         Ok(content.map(|bytes| Current { greeting: String::from_utf8_lossy(&bytes).trim_end().to_string() }))
//!     }
//!
//!     fn diff(_target: &Target, desired: &Desired, current: Option<&Current>) -> Result<Vec<Change>> {
//!         Ok(Changes::new().compare("greeting", current.map(|c| &c.greeting), &desired.greeting).into_vec())
//!     }
//!
//!     fn apply(target: &Target, desired: &Desired, _current: Option<&Current>, _changes: &[Change]) -> Result<Vec<String>> {
//!         let text = format!("{}\n", desired.greeting);
//!         node::write_file(&target.node, &target.key, text.as_bytes(), Mode::new(0o644))?;
//!         orc_sdk::info!("wrote {} bytes to {}", text.len(), target.key);
//!         Ok(vec![format!("wrote {}", target.key)])
//!     }
//!
//!     fn delete(target: &Target, _current: &Current) -> Result<Vec<String>> {
//!         node::remove(&target.node, &target.key, false)?;
//!         Ok(vec![format!("removed {}", target.key)])
//!     }
//! }
//!
//! # #[cfg(feature = "adaptor")]
//! orc_sdk::export!(adaptor: Motd);
//!
//! // The pure parts run natively, e.g. in unit tests, through the JSON entry points:
//! let target = Target {
//!     id: "motd[web1,/etc/motd]".into(),
//!     resource_type: "motd".into(),
//!     node: "web1".into(),
//!     key: "/etc/motd".into(),
//!     attributes_json: r#"{"greeting":"hello"}"#.into(),
//! };
//! let changes = orc_sdk::adaptor::raw::diff::<Motd>(&target, Some(r#"{"greeting":"hi"}"#))?;
//! assert_eq!(changes[0].field, "greeting");
//! let bad = Target { attributes_json: r#"{"greting":"hello"}"#.into(), ..target };
//! assert_eq!(
//!     orc_sdk::adaptor::raw::diff::<Motd>(&bad, None).unwrap_err().message(),
//!     "motd[web1,/etc/motd]: invalid attributes: unknown field `greting`, expected `greeting`"
//! );
//! # Ok::<(), orc_sdk::Error>(())
//! ```
//!
//! Solvers implement [`Solver`] and call `export!(solver: MySolver)`; automators implement
//! [`Automator`] and call `export!(automator: MyAutomator)`.

// Lets the generated bindings name this crate by the same absolute path (`::orc_sdk::..`) here
// and in the plugin crates where the export macros expand.
extern crate self as orc_sdk;

pub mod adaptor;
pub mod automator;
// Generated FFI glue: wit-bindgen's lifting and lowering is necessarily `unsafe`.
#[allow(unsafe_code)]
#[doc(hidden)]
pub mod bindings;
mod error;
pub mod http;
mod json;
pub mod kv;
pub mod log;
pub mod node;
#[cfg(any(feature = "adaptor", feature = "solver", feature = "automator"))]
mod panic;
pub mod solver;

pub use adaptor::{Adaptor, Change, Changes, Target};
pub use automator::{Action, Automator, Outcome, Task};
pub use error::{Error, ErrorKind, Result, ResultExt};
pub use solver::{LayoutRequest, NodeInfo, Placement, SolveError, Solver};

/// Exports a type as the plugin's implementation of its kind's WIT world.
///
/// ```ignore
/// orc_sdk::export!(adaptor: FileAdaptor);     // impl orc_sdk::Adaptor, feature "adaptor"
/// orc_sdk::export!(solver: SpreadSolver);     // impl orc_sdk::Solver, feature "solver"
/// orc_sdk::export!(automator: SshAutomator);  // impl orc_sdk::Automator, feature "automator"
/// ```
///
/// Call it once, at the top level of the plugin crate, with a type name in scope.
///
/// The component exports are emitted only when the plugin is compiled for Wasm
/// (`target_family = "wasm"`). Built for the host — `cargo build --workspace`, `cargo clippy
/// --workspace`, the plugin's own unit tests — the crate still checks that the type implements
/// its kind's trait, but exports nothing: the names wit-bindgen gives the exports
/// (`cabi_post_orc:plugin/…#apply`) are not valid symbol names for a native linker.
#[macro_export]
macro_rules! export {
    (adaptor: $ty:ident) => {
        const _: () = {
            fn __orc_sdk_requires_adaptor<T: $crate::Adaptor>() {}
            let _ = __orc_sdk_requires_adaptor::<$ty>;
        };
        $crate::__export_adaptor!($ty);
    };
    (solver: $ty:ident) => {
        const _: () = {
            fn __orc_sdk_requires_solver<T: $crate::Solver>() {}
            let _ = __orc_sdk_requires_solver::<$ty>;
        };
        $crate::__export_solver!($ty);
    };
    (automator: $ty:ident) => {
        const _: () = {
            fn __orc_sdk_requires_automator<T: $crate::Automator>() {}
            let _ = __orc_sdk_requires_automator::<$ty>;
        };
        $crate::__export_automator!($ty);
    };
    ($($other:tt)*) => {
        ::core::compile_error!("usage: `orc_sdk::export!(adaptor: MyType)`, `export!(solver: MyType)` or `export!(automator: MyType)`");
    };
}

#[cfg(feature = "adaptor")]
#[doc(hidden)]
#[macro_export]
macro_rules! __export_adaptor {
    ($ty:ident) => {
        #[cfg(target_family = "wasm")]
        $crate::__private::bindings::adaptor::export_adaptor_world!($ty with_types_in $crate::__private::bindings::adaptor);
    };
}

#[cfg(not(feature = "adaptor"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __export_adaptor {
    ($ty:ident) => {
        ::core::compile_error!(
            "`orc_sdk::export!(adaptor: ..)` needs the `adaptor` feature: orc-sdk = { workspace = true, features = [\"adaptor\"] }"
        );
    };
}

#[cfg(feature = "solver")]
#[doc(hidden)]
#[macro_export]
macro_rules! __export_solver {
    ($ty:ident) => {
        #[cfg(target_family = "wasm")]
        $crate::__private::bindings::solver::export_solver_world!($ty with_types_in $crate::__private::bindings::solver);
    };
}

#[cfg(not(feature = "solver"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __export_solver {
    ($ty:ident) => {
        ::core::compile_error!(
            "`orc_sdk::export!(solver: ..)` needs the `solver` feature: orc-sdk = { workspace = true, features = [\"solver\"] }"
        );
    };
}

#[cfg(feature = "automator")]
#[doc(hidden)]
#[macro_export]
macro_rules! __export_automator {
    ($ty:ident) => {
        #[cfg(target_family = "wasm")]
        $crate::__private::bindings::automator::export_automator_world!($ty with_types_in $crate::__private::bindings::automator);
    };
}

#[cfg(not(feature = "automator"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __export_automator {
    ($ty:ident) => {
        ::core::compile_error!(
            "`orc_sdk::export!(automator: ..)` needs the `automator` feature: orc-sdk = { workspace = true, features = [\"automator\"] }"
        );
    };
}

/// Paths the export macros expand to in plugin crates. Not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::bindings;
    pub use wit_bindgen;
}

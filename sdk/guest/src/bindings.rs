//! The `generate!` invocations: the host interfaces once, and one export world per cargo feature.
//!
//! Every `generate!` embeds a `component-type` custom section and wit-component unions them, so
//! a crate that generated all three plugin worlds would have to export all three. Hence:
//! - the `imports` world (every host interface, no exports) is always generated; imports that a
//!   plugin never calls are dropped by wit-component, so they cost nothing;
//! - each plugin world is behind its feature and maps its imports onto those shared bindings
//!   with `with`, so every host type exists once and the SDK wraps it once;
//! - `pub_export_macro` makes wit-bindgen embed a plugin world's exports only where its export
//!   macro is expanded, i.e. in the plugin crate that calls `orc_sdk::export!`.
//!
//! The WIT path is relative to this crate's manifest: `orc-plugin new` vendors `sdk/guest` and
//! `wit/` side by side, keeping this layout.

/// The host interfaces (`log`, `kv`, `node`, `http`) and the shared `types`.
pub mod imports {
    wit_bindgen::generate!({
        world: "imports",
        path: "../../wit/orc-plugin-0.1",
        runtime_path: "::orc_sdk::__private::wit_bindgen::rt",
    });
}

pub use imports::orc::plugin::{http, kv, log, node, types};

#[cfg(feature = "adaptor")]
pub mod adaptor {
    wit_bindgen::generate!({
        world: "adaptor",
        path: "../../wit/orc-plugin-0.1",
        runtime_path: "::orc_sdk::__private::wit_bindgen::rt",
        with: {
            "orc:plugin/types@0.1.0": crate::bindings::types,
            "orc:plugin/log@0.1.0": crate::bindings::log,
            "orc:plugin/kv@0.1.0": crate::bindings::kv,
            "orc:plugin/node@0.1.0": crate::bindings::node,
            "orc:plugin/http@0.1.0": crate::bindings::http,
        },
        pub_export_macro: true,
        export_macro_name: "export_adaptor_world",
        default_bindings_module: "::orc_sdk::__private::bindings::adaptor",
    });
}

#[cfg(feature = "solver")]
pub mod solver {
    wit_bindgen::generate!({
        world: "solver",
        path: "../../wit/orc-plugin-0.1",
        runtime_path: "::orc_sdk::__private::wit_bindgen::rt",
        with: {
            "orc:plugin/types@0.1.0": crate::bindings::types,
            "orc:plugin/log@0.1.0": crate::bindings::log,
        },
        pub_export_macro: true,
        export_macro_name: "export_solver_world",
        default_bindings_module: "::orc_sdk::__private::bindings::solver",
    });
}

#[cfg(feature = "automator")]
pub mod automator {
    wit_bindgen::generate!({
        world: "automator",
        path: "../../wit/orc-plugin-0.1",
        runtime_path: "::orc_sdk::__private::wit_bindgen::rt",
        with: {
            "orc:plugin/types@0.1.0": crate::bindings::types,
            "orc:plugin/log@0.1.0": crate::bindings::log,
            "orc:plugin/kv@0.1.0": crate::bindings::kv,
            "orc:plugin/node@0.1.0": crate::bindings::node,
            "orc:plugin/http@0.1.0": crate::bindings::http,
        },
        pub_export_macro: true,
        export_macro_name: "export_automator_world",
        default_bindings_module: "::orc_sdk::__private::bindings::automator",
    });
}

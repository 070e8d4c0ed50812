//! The host side of the WIT worlds, generated from the same `wit/` files the guest SDK reads.
//!
//! The `imports` world is generated once; the three plugin worlds reuse its interfaces through
//! `with`, so every host interface has exactly one Rust trait to implement.

pub mod host {
    wasmtime::component::bindgen!({
        world: "imports",
        path: "../../wit/orc-plugin-0.1",
        imports: { default: async },
    });
}

pub mod adaptor {
    wasmtime::component::bindgen!({
        world: "adaptor",
        path: "../../wit/orc-plugin-0.1",
        imports: { default: async },
        exports: { default: async },
        with: {
            "orc:plugin/types": super::host::orc::plugin::types,
            "orc:plugin/log": super::host::orc::plugin::log,
            "orc:plugin/kv": super::host::orc::plugin::kv,
            "orc:plugin/node": super::host::orc::plugin::node,
            "orc:plugin/http": super::host::orc::plugin::http,
        },
    });
}

pub mod solver {
    wasmtime::component::bindgen!({
        world: "solver",
        path: "../../wit/orc-plugin-0.1",
        imports: { default: async },
        exports: { default: async },
        with: {
            "orc:plugin/types": super::host::orc::plugin::types,
            "orc:plugin/log": super::host::orc::plugin::log,
        },
    });
}

pub mod automator {
    wasmtime::component::bindgen!({
        world: "automator",
        path: "../../wit/orc-plugin-0.1",
        imports: { default: async },
        exports: { default: async },
        with: {
            "orc:plugin/types": super::host::orc::plugin::types,
            "orc:plugin/log": super::host::orc::plugin::log,
            "orc:plugin/kv": super::host::orc::plugin::kv,
            "orc:plugin/node": super::host::orc::plugin::node,
            "orc:plugin/http": super::host::orc::plugin::http,
        },
    });
}

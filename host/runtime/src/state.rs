//! The data of one instance's store: the call context, collected logs, the memory limiter and a
//! WASI context that is only built if the plugin touches WASI (most calls never do), which keeps
//! instantiation cheap.

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::calls::LogLine;
use crate::capability::{CallContext, CapabilitySet};

/// How much of a plugin's stderr (where a Rust panic message goes) is kept.
const STDERR_CAPACITY: usize = 64 << 10;

pub struct CallState {
    pub(crate) plugin_name: String,
    pub(crate) kv_scope: String,
    pub(crate) ctx: CallContext,
    /// What the plugin was linked with; the node functions check their part against it.
    pub(crate) caps: CapabilitySet,
    pub(crate) logs: Vec<LogLine>,
    pub(crate) dropped_logs: usize,
    pub(crate) limiter: MemoryLimiter,
    /// When the running call must be interrupted (checked at each epoch tick).
    pub(crate) deadline_at: std::time::Instant,
    table: ResourceTable,
    wasi: Option<WasiCtx>,
    stderr: Option<MemoryOutputPipe>,
}

impl CallState {
    pub(crate) fn new(plugin_name: &str, ctx: CallContext, caps: CapabilitySet, memory_limit: usize) -> CallState {
        CallState {
            caps,
            kv_scope: format!("{}/{}", ctx.environment, plugin_name),
            plugin_name: plugin_name.to_string(),
            ctx,
            logs: Vec::new(),
            dropped_logs: 0,
            limiter: MemoryLimiter {
                limit: memory_limit,
                hit: false,
            },
            deadline_at: std::time::Instant::now(),
            table: ResourceTable::new(),
            wasi: None,
            stderr: None,
        }
    }

    /// What the plugin wrote to stderr (a panic message, typically), lossily decoded.
    pub(crate) fn stderr_text(&self) -> String {
        self.stderr
            .as_ref()
            .map(|p| String::from_utf8_lossy(&p.contents()).trim().to_string())
            .unwrap_or_default()
    }
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        if self.wasi.is_none() {
            let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
            // Defaults deny sockets and name lookups; no preopens, no environment, no arguments.
            let ctx = WasiCtx::builder().stderr(stderr.clone()).build();
            self.stderr = Some(stderr);
            self.wasi = Some(ctx);
        }
        WasiCtxView {
            ctx: self.wasi.as_mut().expect("just built"),
            table: &mut self.table,
        }
    }
}

/// Refuses memory growth past the limit and remembers that it did, so a trap that follows is
/// reported as a memory limit rather than a crash.
pub(crate) struct MemoryLimiter {
    pub(crate) limit: usize,
    pub(crate) hit: bool,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}

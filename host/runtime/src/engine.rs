//! The [`Runtime`]: one wasmtime engine (pooling allocator, epoch interruption), its epoch ticker,
//! the compiled-artifact cache, one linker per capability set and the loaded plugins.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orc_manifest::{Capability, Digest, Manifest, PluginKind};
use orc_registry::BlobSource;
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::cache::CompileCache;
use crate::capability::{self, CapabilitySet, Grants};
use crate::error::{EngineError, LoadError};
use crate::plugin::Plugin;
use crate::state::CallState;

/// How the runtime is set up. The host fills this from its own configuration.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where precompiled artifacts are cached (keyed by digest and engine); `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
    /// Use the pooling instance allocator (fast instantiation). Off only where virtual memory is scarce.
    pub pooling: bool,
    /// Upper bound of instances alive at once (pooling only).
    pub max_instances: u32,
    /// Default memory limit of one plugin instance.
    pub memory_limit_bytes: usize,
    /// Default deadline of one call.
    pub call_deadline: Duration,
    /// How often the engine's epoch advances; the granularity of deadlines.
    pub epoch_tick: Duration,
    /// Bytes of each pooled memory kept resident between instances (pooling only). Covering a
    /// guest's initial memory (about 1-2 MiB for a Rust plugin) makes instantiation ~2.5× faster,
    /// at that much resident memory per slot that has been used.
    pub keep_resident_bytes: usize,
    /// Map a module's initial memory copy-on-write from an image instead of copying it in.
    /// Off by default: resetting a copy-on-write slot remaps or `madvise`s it, and in a process
    /// running actions on several threads every such call interrupts the other cores to flush
    /// their TLBs — a third of the server's CPU in a 10,000-resource deploy. Copied in, a slot
    /// within `keep_resident_bytes` is reset with `memset` and never changes its mapping
    /// (api-bench: deploy 0.5 s instead of 0.9 s, half the CPU; one instance at a time pays
    /// ~0.5 µs more, runtime-bench).
    pub memory_init_cow: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            cache_dir: None,
            pooling: true,
            max_instances: 1000,
            memory_limit_bytes: 64 << 20,
            call_deadline: Duration::from_secs(30),
            epoch_tick: Duration::from_millis(5),
            keep_resident_bytes: 2 << 20,
            memory_init_cow: false,
        }
    }
}

/// Loads plugins and runs them. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) engine: Engine,
    pub(crate) config: RuntimeConfig,
    cache: CompileCache,
    linkers: Mutex<HashMap<CapabilitySet, Arc<Linker<CallState>>>>,
    plugins: Mutex<HashMap<(Digest, CapabilitySet), Arc<Plugin>>>,
    ticker_stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.ticker_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    pub fn new(config: RuntimeConfig) -> Result<Runtime, EngineError> {
        let mut wasm = Config::new();
        wasm.epoch_interruption(true);
        wasm.wasm_component_model(true);
        wasm.memory_init_cow(config.memory_init_cow);
        if config.pooling {
            let mut pool = PoolingAllocationConfig::default();
            pool.total_component_instances(config.max_instances)
                .total_core_instances(config.max_instances * 4)
                .total_memories(config.max_instances)
                .total_tables(config.max_instances * 4)
                .total_stacks(config.max_instances)
                .max_memory_size(config.memory_limit_bytes)
                // Reset reused slots with memset instead of madvise: a small guest's whole
                // initial memory stays resident and is not faulted back in on every instance
                // (and the mapping never changes, see `memory_init_cow`).
                .linear_memory_keep_resident(config.keep_resident_bytes)
                // ... and only the pages the instance wrote (`PAGEMAP_SCAN`, Linux 6.7+): without
                // it every reset cleared the whole initial memory (~1 MiB for a Rust plugin), a
                // quarter of the server's CPU in a 10,000-file deploy (api-bench --file).
                .pagemap_scan(wasmtime::Enabled::Auto)
                .table_keep_resident(16 << 10);
            wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        }
        let engine = Engine::new(&wasm).map_err(|e| EngineError(format!("{e:#}")))?;
        let cache = CompileCache::new(config.cache_dir.clone(), &engine);
        let ticker_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        spawn_epoch_ticker(engine.weak(), config.epoch_tick, ticker_stop.clone());
        Ok(Runtime {
            inner: Arc::new(Inner {
                engine,
                config,
                cache,
                linkers: Mutex::new(HashMap::new()),
                plugins: Mutex::new(HashMap::new()),
                ticker_stop,
            }),
        })
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    /// Loads the plugin `digest` from `source` for a caller that expects a plugin of `kind`,
    /// linking only the capabilities its manifest requests and `grants` allows. Loaded plugins are
    /// kept, so the second load of the same digest with the same effective grants is a map lookup.
    pub async fn load(
        &self,
        digest: &Digest,
        kind: PluginKind,
        source: &dyn BlobSource,
        grants: &Grants,
    ) -> Result<Arc<Plugin>, LoadError> {
        if let Some(p) = self.cached_plugin(digest, grants) {
            return check_kind(p, kind);
        }
        let bytes = source.fetch(digest).await.map_err(|e| LoadError::Fetch {
            digest: *digest,
            source: Box::new(e),
        })?;
        self.load_bytes(digest, &bytes, kind, grants)
    }

    /// Like [`Runtime::load`], for bytes in hand. Refuses bytes that do not hash to `digest`.
    pub fn load_bytes(&self, digest: &Digest, bytes: &[u8], kind: PluginKind, grants: &Grants) -> Result<Arc<Plugin>, LoadError> {
        let actual = Digest::of(bytes);
        if actual != *digest {
            return Err(LoadError::DigestMismatch { expected: *digest, actual });
        }
        if let Some(p) = self.cached_plugin(digest, grants) {
            return check_kind(p, kind);
        }
        let manifest = orc_manifest::extract(bytes)
            .map_err(|source| LoadError::Manifest { digest: *digest, source })?
            .ok_or(LoadError::NoManifest { digest: *digest })?;
        if manifest.kind != kind {
            return Err(LoadError::WrongKind {
                digest: *digest,
                name: manifest.reference(),
                expected: kind,
                actual: manifest.kind,
            });
        }
        let started = Instant::now();
        let component = self.inner.cache.component(&self.inner.engine, digest, bytes)?;
        let caps = self.link_set(digest, &manifest, &component, grants)?;
        let linker = self.linker(caps).map_err(|e| LoadError::Link {
            digest: *digest,
            name: manifest.reference(),
            message: format!("{e:#}"),
        })?;
        let plugin = Arc::new(Plugin::new(self.clone(), *digest, manifest, caps, &component, &linker)?);
        tracing::debug!(plugin = %plugin.manifest.reference(), digest = %digest.short(), ms = started.elapsed().as_secs_f64() * 1e3, "plugin loaded");
        let key = (*digest, grants.effective(&plugin.manifest));
        self.inner.plugins.lock().expect("plugin map").insert(key, plugin.clone());
        Ok(plugin)
    }

    /// Compiles (or loads from the cache) without linking: what `orc-plugin inspect` and the
    /// benchmarks use.
    pub fn compile(&self, digest: &Digest, bytes: &[u8]) -> Result<Component, LoadError> {
        self.inner.cache.component(&self.inner.engine, digest, bytes)
    }

    /// Forgets loaded plugins (not the on-disk cache).
    pub fn clear_loaded(&self) {
        self.inner.plugins.lock().expect("plugin map").clear();
    }

    fn cached_plugin(&self, digest: &Digest, grants: &Grants) -> Option<Arc<Plugin>> {
        let plugins = self.inner.plugins.lock().expect("plugin map");
        // The effective set depends on the manifest, which we only know once loaded: look for any
        // entry of this digest whose manifest gives the same effective set under these grants.
        plugins
            .iter()
            .find(|((d, set), p)| d == digest && *set == grants.effective(&p.manifest))
            .map(|(_, p)| p.clone())
    }

    /// Checks every import of the component against the manifest and the grants; returns the set
    /// of capabilities to link. Says which capability is missing at load time, never at call time.
    fn link_set(&self, digest: &Digest, manifest: &Manifest, component: &Component, grants: &Grants) -> Result<CapabilitySet, LoadError> {
        let engine = &self.inner.engine;
        let ty = component.component_type();
        let required = manifest.kind.export_interface();
        if ty.get_export(engine, &required).is_none() {
            let exports: Vec<&str> = ty.exports(engine).map(|(n, _)| n).collect();
            return Err(LoadError::WrongWorld {
                digest: *digest,
                name: manifest.reference(),
                kind: manifest.kind,
                exports: exports.join(", "),
                required,
            });
        }
        // Every capability the manifest requests must be granted, imported or not: the rule the
        // host applies at submission, so load refuses exactly what submission refuses.
        if let Some(cap) = manifest.capabilities.iter().find(|c| !grants.allows(**c)) {
            return Err(LoadError::NotGranted {
                digest: *digest,
                name: manifest.reference(),
                capability: *cap,
            });
        }
        let mut set = CapabilitySet::default().with(Capability::Log);
        for (name, _) in ty.imports(engine) {
            let serves = Capability::for_interface(name);
            if !serves.is_empty() {
                if serves == [Capability::Log] {
                    continue;
                }
                // `node` serves two capabilities; the plugin needs at least one of them.
                let requested: Vec<Capability> = serves.iter().copied().filter(|c| manifest.capabilities.contains(c)).collect();
                if requested.is_empty() {
                    return Err(LoadError::NotRequested {
                        digest: *digest,
                        name: manifest.reference(),
                        interface: name.to_string(),
                        capability: serves.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(" or "),
                    });
                }
                set = requested.into_iter().fold(set, CapabilitySet::with);
            } else if !(capability::is_wasi_import(name) || name == "orc:plugin/types@0.1.0") {
                return Err(LoadError::UnknownImport {
                    digest: *digest,
                    name: manifest.reference(),
                    interface: name.to_string(),
                });
            }
        }
        Ok(set)
    }

    fn linker(&self, caps: CapabilitySet) -> Result<Arc<Linker<CallState>>, wasmtime::Error> {
        let mut linkers = self.inner.linkers.lock().expect("linker map");
        if let Some(l) = linkers.get(&caps) {
            return Ok(l.clone());
        }
        let linker = Arc::new(capability::linker(&self.inner.engine, caps)?);
        linkers.insert(caps, linker.clone());
        Ok(linker)
    }
}

fn check_kind(plugin: Arc<Plugin>, kind: PluginKind) -> Result<Arc<Plugin>, LoadError> {
    if plugin.manifest.kind != kind {
        return Err(LoadError::WrongKind {
            digest: plugin.digest,
            name: plugin.manifest.reference(),
            expected: kind,
            actual: plugin.manifest.kind,
        });
    }
    Ok(plugin)
}

/// Advances the engine's epoch every `tick` until the runtime is dropped. Deadlines are counted in
/// ticks, so a looping plugin is interrupted within one tick of its deadline.
fn spawn_epoch_ticker(engine: wasmtime::EngineWeak, tick: Duration, stop: Arc<std::sync::atomic::AtomicBool>) {
    std::thread::Builder::new()
        .name("orc-epoch".into())
        .spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(tick);
                match engine.upgrade() {
                    Some(e) => e.increment_epoch(),
                    None => return,
                }
            }
        })
        .expect("spawn epoch thread");
}

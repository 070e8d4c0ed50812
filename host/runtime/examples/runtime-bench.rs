//! Runtime benchmark: warm instantiate + one adaptor call, and compile-from-bytes versus first
//! load of a cached (precompiled) plugin. Prints medians; run in release:
//!
//! `cargo run --release -p orc-runtime --example runtime-bench`

// A benchmark command: a failed unwrap stops the run where it failed, which is all it should do.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use orc_manifest::{Digest, PluginKind};
use orc_plugin_artifacts::{BENCH_MEMORY, FILE};
use orc_runtime::wit::Target;
use orc_runtime::{CallContext, Grants, Runtime, RuntimeConfig};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn pct(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[((v.len() as f64 - 1.0) * p) as usize]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rt = Runtime::new(RuntimeConfig::default()).expect("runtime");
    let digest: Digest = BENCH_MEMORY.digest.parse().unwrap();
    let plugin = rt
        .load_bytes(&digest, BENCH_MEMORY.bytes, PluginKind::Adaptor, &Grants::all())
        .unwrap();
    let ctx = CallContext::new("bench");
    let target = Target {
        id: "bench-memory[local,k]".into(),
        resource_type: "bench-memory".into(),
        node: "local".into(),
        key: "k".into(),
        attributes: r#"{"value":1}"#.into(),
    };
    // Warm up the pool slots and caches.
    for _ in 0..2_000 {
        let mut a = plugin.adaptor(&ctx).await.unwrap();
        a.read(&target).await.unwrap();
    }
    let n = 20_000;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut a = plugin.adaptor(&ctx).await.unwrap();
        a.read(&target).await.unwrap();
        samples.push(t.elapsed());
    }
    println!(
        "warm instantiate + one adaptor call (bench-memory read, {n} runs): median {:.1} µs, p90 {:.1} µs, p99 {:.1} µs",
        median(samples.clone()).as_secs_f64() * 1e6,
        pct(&samples, 0.90).as_secs_f64() * 1e6,
        pct(&samples, 0.99).as_secs_f64() * 1e6
    );
    let mut samples = Vec::with_capacity(n);
    let mut a = plugin.adaptor(&ctx).await.unwrap();
    for _ in 0..n {
        let t = Instant::now();
        a.read(&target).await.unwrap();
        samples.push(t.elapsed());
    }
    println!("one call on a live instance: median {:.1} µs", median(samples).as_secs_f64() * 1e6);
    drop(a);
    drop(plugin);
    drop(rt);

    // Compile from bytes vs first load of the cached artifact (file adaptor, the larger one).
    let digest: Digest = FILE.digest.parse().unwrap();
    let cache = std::env::temp_dir().join(format!("orc-bench-cache-{}", std::process::id()));
    let mut compile = Vec::new();
    for _ in 0..5 {
        let rt = Runtime::new(RuntimeConfig {
            pooling: false,
            ..RuntimeConfig::default()
        })
        .unwrap();
        let t = Instant::now();
        rt.compile(&digest, FILE.bytes).unwrap();
        compile.push(t.elapsed());
    }
    Runtime::new(RuntimeConfig {
        cache_dir: Some(cache.clone()),
        pooling: false,
        ..RuntimeConfig::default()
    })
    .unwrap()
    .load_bytes(&digest, FILE.bytes, PluginKind::Adaptor, &Grants::all())
    .unwrap();
    let mut cached = Vec::new();
    let mut cached_total = Vec::new();
    for _ in 0..50 {
        let rt = Runtime::new(RuntimeConfig {
            cache_dir: Some(cache.clone()),
            pooling: false,
            ..RuntimeConfig::default()
        })
        .unwrap();
        let t = Instant::now();
        rt.compile(&digest, FILE.bytes).unwrap();
        cached.push(t.elapsed());
        rt.clear_loaded();
        let t = Instant::now();
        rt.load_bytes(&digest, FILE.bytes, PluginKind::Adaptor, &Grants::all()).unwrap();
        cached_total.push(t.elapsed());
    }
    println!(
        "file adaptor ({} KiB): compile from bytes median {:.1} ms; first load of the cached artifact median {:.3} ms (verify + deserialize), {:.3} ms including digest check, manifest and linking",
        FILE.bytes.len() / 1024,
        median(compile).as_secs_f64() * 1e3,
        median(cached).as_secs_f64() * 1e3,
        median(cached_total).as_secs_f64() * 1e3,
    );
    let _ = std::fs::remove_dir_all(cache);
}

//! Scheduler benchmark, without persistence (that comes with the server): release → all
//! `deployed` for 10,000 `bench-memory` resources, independent and as a dependency graph (chains
//! and fan-in), then a user repair and a dryrun of all of them. Run in release:
//!
//! `cargo run --release -p orc-host --example scheduler-bench [-- COUNT [STORE]]`
//!
//! STORE persists every transition and action through the store, as the server does:
//! `sqlite` (a temporary file) or a `postgres://…` URL. Without it events are only counted.

// A benchmark command: a failed unwrap stops the run where it failed, which is all it should do.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use orc_host::intent::Intent;
use orc_host::scheduler::{self, BoxFuture, Event, ResourceStatus as Status, Scheduler, Settings, Sink, Version};
use orc_manifest::{Digest, PluginKind};
use orc_plugin_artifacts::BENCH_MEMORY;
use orc_runtime::capability::MemoryKv;
use orc_runtime::{CallContext, Grants, Runtime, RuntimeConfig};
use serde_json::json;

/// Counts events, as a persistence layer would receive them.
#[derive(Default)]
struct Counting(AtomicUsize);

impl Sink for Counting {
    fn record(&self, events: Vec<Event>) -> BoxFuture<'_, ()> {
        self.0.fetch_add(events.len(), Ordering::Relaxed);
        Box::pin(std::future::ready(()))
    }
}

fn intent(n: usize, graph: bool) -> Intent {
    let resources: Vec<_> = (0..n)
        .map(|i| {
            // Graph: chains of 10 (i requires i-1 within a chain), and every 100th resource fans in
            // the ends of the ten chains before it.
            let mut requires = Vec::new();
            if graph && i % 10 != 0 {
                requires.push(format!("bench-memory[node{},r{}]", (i - 1) % 8, i - 1));
            }
            if graph && i % 100 == 99 {
                for c in 1..10 {
                    let end = i - 10 * c;
                    if end % 10 == 9 && end != i - 1 {
                        requires.push(format!("bench-memory[node{},r{end}]", end % 8));
                    }
                }
            }
            json!({ "id": format!("bench-memory[node{},r{i}]", i % 8), "adaptor": "bench-memory@0.1.0", "attributes": { "i": i }, "requires": requires })
        })
        .collect();
    Intent::parse(json!({ "resources": resources }).to_string().as_bytes()).expect("valid intent")
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let store_arg = std::env::args().nth(2);
    let tmp = std::env::temp_dir().join(format!("orc-scheduler-bench-{}", std::process::id()));
    let store = match store_arg.as_deref() {
        None => None,
        Some("sqlite") => Some(orc_host::store::Store::open_sqlite(tmp.join("orc.db")).await.expect("sqlite store")),
        Some(url) => Some(orc_host::store::Store::connect(url).await.expect("postgres store")),
    };
    let runtime = Runtime::new(RuntimeConfig::default()).expect("runtime");
    let digest: Digest = BENCH_MEMORY.digest.parse().unwrap();
    let plugin = runtime
        .load_bytes(&digest, BENCH_MEMORY.bytes, PluginKind::Adaptor, &Grants::all())
        .unwrap();
    let settings = Settings {
        env_concurrency: 64,
        node_concurrency: 16,
        repair_interval: None,
        ..Settings::default()
    };
    println!(
        "{n} bench-memory resources on 8 nodes, {} worker threads",
        tokio::runtime::Handle::current().metrics().num_workers()
    );

    for (label, graph) in [("independent", false), ("dependency graph (chains of 10, fan-in)", true)] {
        let ctx = CallContext {
            kv: Arc::new(MemoryKv::default()),
            // One key per resource: room for however many were asked for.
            kv_quota: orc_runtime::capability::KvQuota {
                max_keys: (n as u64).max(orc_runtime::capability::KvQuota::default().max_keys),
                ..Default::default()
            },
            ..CallContext::new("bench")
        };
        let sink = Arc::new(Counting::default());
        let scheduler = match &store {
            None => Scheduler::spawn(ctx.clone(), settings.clone(), sink.clone(), HashMap::new()),
            Some(store) => {
                let name = format!("bench-{}-{graph}", std::process::id());
                let env = store.create_environment(&name, &Default::default()).await.expect("environment").id;
                let persist = Arc::new(orc_host::scheduler::persistence::StoreSink::new(store.clone(), env));
                Scheduler::spawn(ctx.clone(), settings.clone(), persist, HashMap::new())
            }
        };
        let intent = intent(n, graph);
        let plugins = vec![plugin.clone(); n];
        let version = Arc::new(Version::new(1, intent, plugins));

        let t = Instant::now();
        scheduler.release(version.clone()).unwrap();
        let snap = scheduler.settled().await.unwrap();
        let deploy = t.elapsed();
        assert_eq!(snap.count(Status::Deployed), n, "{snap:?}");

        let t = Instant::now();
        scheduler.repair().unwrap();
        scheduler.settled().await.unwrap();
        let repair = t.elapsed();

        let t = Instant::now();
        let reports = scheduler::dryrun(&version, &ctx, 64).await;
        let dryrun = t.elapsed();
        assert!(reports.iter().all(|r| r.outcome == orc_host::executor::Outcome::Unchanged));

        println!(
            "{label}, {}: release → all deployed {:.3} s ({:.0}/s); user repair {:.3} s; dryrun {:.3} s{}",
            store
                .as_ref()
                .map(|s| format!("persisted to {:?}", s.backend()))
                .unwrap_or_else(|| "not persisted".into()),
            deploy.as_secs_f64(),
            n as f64 / deploy.as_secs_f64(),
            repair.as_secs_f64(),
            dryrun.as_secs_f64(),
            match store {
                None => format!("; {} events to the sink", sink.0.load(Ordering::Relaxed)),
                Some(_) => String::new(),
            }
        );
    }
    let _ = std::fs::remove_dir_all(tmp);
}

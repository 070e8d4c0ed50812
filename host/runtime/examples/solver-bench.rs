//! Solver benchmark: the first-party `layout-solver` plugin through the Wasm runtime, for 10,
//! 100 and 1,000 nodes and a 10-service template using every constraint kind (together, apart,
//! count min and max, needs on labels, fact ranges and fact equality). Each call is a fresh
//! instance, as the host makes them. Prints the first call, the median of several, and the
//! median of a re-solve from the previous layout grown by 10%. Run in release:
//!
//! `cargo run --release -p orc-runtime --example solver-bench`

use std::time::{Duration, Instant};

use orc_manifest::{Digest, PluginKind};
use orc_plugin_artifacts::LAYOUT_SOLVER;
use orc_runtime::wit::{LayoutRequest, NodeInfo, Placement};
use orc_runtime::{CallContext, Grants, Plugin, Runtime, RuntimeConfig};
use serde_json::json;

fn template() -> String {
    json!({
        "services": {
            "lb": {"automator": "x", "count": {"max": 2}, "needs": {"labels": {"role": "edge"}}},
            "web": {"automator": "x"},
            "agent": {"automator": "x"},
            "api": {"automator": "x", "count": {"min": 2}, "needs": {"facts": {"cpus": {"min": 4}}}},
            "db": {"automator": "x", "count": {"min": 1, "max": 3}, "needs": {"labels": {"disk": "ssd"}}},
            "cache": {"automator": "x", "count": {"max": 5}, "needs": {"facts": {"memory_bytes": {"min": 8_000_000_000u64}}}},
            "queue": {"automator": "x", "count": {"min": 1, "max": 2}, "needs": {"facts": {"architecture": "x86_64"}}},
            "worker": {"automator": "x"},
            "mon": {"automator": "x"},
            "search": {"automator": "x", "count": {"max": 3}, "needs": {"labels": {"disk": "ssd"}}}
        },
        "constraints": {
            "together": [["web", "agent"], ["worker", "mon"]],
            "apart": [["db", "web"], ["lb", "db", "queue"], ["db", "worker"]]
        }
    })
    .to_string()
}

fn nodes(n: usize) -> Vec<NodeInfo> {
    (0..n)
        .map(|i| {
            let mut labels = vec![("zone".to_string(), format!("z{}", i % 3))];
            if i % 10 == 0 {
                labels.push(("role".into(), "edge".into()));
            }
            if i % 3 == 0 {
                labels.push(("disk".into(), "ssd".into()));
            }
            let arch = if i % 7 == 0 { "aarch64" } else { "x86_64" };
            NodeInfo {
                name: format!("node-{i:04}"),
                labels,
                facts: json!({"cpus": 2 + i % 8, "memory_bytes": (4 + i % 16) as u64 * 1_000_000_000, "architecture": arch}).to_string(),
            }
        })
        .collect()
}

async fn solve(plugin: &Plugin, ctx: &CallContext, request: &LayoutRequest) -> (Duration, Vec<Placement>) {
    let t = Instant::now();
    let mut solver = plugin.solver(ctx).await.expect("instantiate");
    let layout = solver.solve(request).await.expect("call").expect("a layout");
    (t.elapsed(), layout)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rt = Runtime::new(RuntimeConfig::default()).expect("runtime");
    let digest: Digest = LAYOUT_SOLVER.digest.parse().expect("digest");
    let plugin = rt
        .load_bytes(&digest, LAYOUT_SOLVER.bytes, PluginKind::Solver, &Grants::none())
        .expect("load");
    let ctx = CallContext::new("bench");
    println!("layout-solver, 10 services (2 together groups, 3 apart groups, counts, label and fact needs), fresh instance per call");
    for n in [10, 100, 1000] {
        let size = (n * 8 / 10) as u32;
        let mut request = LayoutRequest {
            template: template(),
            size,
            nodes: nodes(n),
            existing: Vec::new(),
        };
        let (first, layout) = solve(&plugin, &ctx, &request).await;
        let runs = if n >= 1000 { 10 } else { 30 };
        let mut fresh = Vec::new();
        for _ in 0..runs {
            fresh.push(solve(&plugin, &ctx, &request).await.0);
        }
        let pairs: usize = layout.iter().map(|p| p.services.len()).sum();
        // Amend: the same cluster grown by 10% of the nodes, from the layout just found.
        request.existing = layout;
        request.size = (n * 9 / 10) as u32;
        let mut grow = Vec::new();
        for _ in 0..runs {
            grow.push(solve(&plugin, &ctx, &request).await.0);
        }
        println!(
            "{n:>5} nodes, size {size:>4} ({pairs} placements): first call {}, median {} ({runs} runs); grown to {} from it: median {}",
            ms(first),
            ms(median(fresh)),
            request.size,
            ms(median(grow)),
        );
    }
}

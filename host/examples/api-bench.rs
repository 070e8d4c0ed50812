//! REST benchmark: the figures of the server issue measured through the real API of a real
//! `orc-host serve` process (spawned from the release build beside this example), with the
//! `bench-memory` adaptor published to the server's registry and its state in the server's own
//! database (`DbKv`), every resource on the `local` node:
//!
//! - intent `POST` → every resource `deployed` (as `GET /api/v1/environments/{env}` counts it), for
//!   COUNT independent resources and for a COUNT-resource dependency graph (chains of 10, fan-in);
//! - user repair (`POST …/repair`) → its operation `done` (`GET …/operations/{id}`: the scheduler
//!   settled and every action was recorded); then, untimed, the resource listing is checked:
//!   every resource deployed, with a `last_verified_at` after the request;
//! - dryrun (`POST …/dryrun`) → its report `done` (`GET …/dryruns/{id}`);
//! - the server's resident memory (`VmRSS`, peak `VmHWM` from `/proc/<pid>/status`).
//!
//! ```text
//! cargo build --release -p orc-host --bins --examples
//! target/release/examples/api-bench [COUNT [STORE]] [--rss]
//! ```
//!
//! STORE: `sqlite` (default; a file in a temporary data directory) or a `postgres://…` URL of a
//! server on which this benchmark may create a database (`orc_api_bench_<pid>`, dropped at the
//! end). `--rss` runs one environment only (the independent resources), for the memory figure of
//! COUNT (say 100000) resources in one environment, read again after the deploy and at the end
//! once the server has been idle for 6 s (past its heap trimmer's period). `ORC_HOST_BIN` overrides the server binary;
//! `ORC_BENCH_POLL_MS` the pause between two polls (default 2 ms).

#[path = "support/serve.rs"]
mod serve;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use serve::Host;

fn resource_id(i: usize) -> String {
    format!("bench-memory[local,r{i}]")
}

/// The intent of scheduler-bench on the one node this server has: `n` resources, independent or
/// as a graph (chains of 10, i requires i-1 within a chain; every 100th fans in the ends of the
/// nine chains before it).
fn intent(n: usize, graph: bool) -> Vec<u8> {
    let resources: Vec<Value> = (0..n)
        .map(|i| {
            let mut requires = Vec::new();
            if graph && i % 10 != 0 {
                requires.push(resource_id(i - 1));
            }
            if graph && i % 100 == 99 {
                for c in 1..10 {
                    let end = i - 10 * c;
                    if end % 10 == 9 && end != i - 1 {
                        requires.push(resource_id(end));
                    }
                }
            }
            json!({ "id": resource_id(i), "adaptor": "bench-memory@0.1.0", "attributes": { "i": i }, "requires": requires })
        })
        .collect();
    serde_json::to_vec(&json!({ "resources": resources })).expect("JSON")
}

/// How long `--rss` lets the server rest before reading its memory again.
const REST: std::time::Duration = std::time::Duration::from_secs(6);

/// One environment: deploy, repair, dryrun, memory.
/// With `at_rest`, memory is also read once the server has been idle past its heap trimmer's
/// period (`orc_host::memory`: freed pages go back to the system every 5 s).
async fn run_case(host: &Host, env: &str, n: usize, graph: bool, at_rest: bool) -> Result<()> {
    let settings = json!({
        // Everything is on `local`: the node limit is the environment's.
        "per_node_concurrency": 64,
        "env_concurrency": 64,
        // No self-healing timers: only what the benchmark asks for runs.
        "repair_interval_s": 0,
        "retry_interval_s": 60,
        "auto_deploy": true,
    });
    host.create_environment(env, settings).await?;
    let body = intent(n, graph);
    let body_mib = body.len() as f64 / (1024.0 * 1024.0);

    let since = serve::now_ms();
    let deployed = serve::deploy(host, env, body, n).await?;
    let after_deploy = host.memory()?;
    println!(
        "  POST intent ({body_mib:.1} MiB) → all {n} deployed: {:.3} s ({:.0}/s); the POST answered 201 after {:.3} s; {} polls; \
         server CPU {:.2} s, {} context switches; server {after_deploy}",
        deployed.elapsed.as_secs_f64(),
        n as f64 / deployed.elapsed.as_secs_f64(),
        deployed.answered.as_secs_f64(),
        deployed.polls,
        deployed.server_cpu.as_secs_f64(),
        deployed.server_switches,
    );
    println!("    {}", serve::action_profile(host, env, since).await?);
    if at_rest {
        tokio::time::sleep(REST).await;
        println!("  server at rest {} s later: {}", REST.as_secs(), host.memory()?);
    }

    let (repair, actions) = serve::repair(host, env, n).await?;
    println!(
        "  POST repair → operation done: {:.3} s, all {n} re-verified (actions {actions})",
        repair.as_secs_f64(),
    );
    if at_rest {
        println!("  server after repair: {}", host.memory()?);
    }

    let (dryrun, summary) = serve::dryrun(host, env, n).await?;
    println!("  POST dryrun → report done: {:.3} s ({summary})", dryrun.as_secs_f64());
    println!("  server after repair and dryrun: {}", host.memory()?);
    if at_rest {
        tokio::time::sleep(REST).await;
        println!("  server at rest {} s later: {}", REST.as_secs(), host.memory()?);
    }
    Ok(())
}

/// A throwaway PostgreSQL database on the server `admin_url` points at.
struct PgDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl PgDatabase {
    async fn create(admin_url: &str) -> Result<PgDatabase> {
        use sqlx::{Connection as _, Executor as _};
        let name = format!("orc_api_bench_{}", std::process::id());
        let mut admin = sqlx::PgConnection::connect(admin_url)
            .await
            .with_context(|| format!("connecting to {admin_url}"))?;
        admin.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).await?;
        admin.close().await?;
        Ok(PgDatabase {
            url: with_database(admin_url, &name),
            admin_url: admin_url.to_string(),
            name,
        })
    }

    async fn drop(self) -> Result<()> {
        use sqlx::{Connection as _, Executor as _};
        let mut admin = sqlx::PgConnection::connect(&self.admin_url).await?;
        admin
            .execute(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)))
            .await?;
        Ok(())
    }
}

/// `postgres://u@h:p/db?x` → the same with database `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let authority_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_end..].find('/') {
        Some(slash) => &base[..authority_end + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    // reqwest is built without a default TLS provider (one provider per binary).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let rss_only = args.iter().any(|a| a == "--rss");
    args.retain(|a| a != "--rss");
    let n: usize = match args.first() {
        Some(a) => a.parse().with_context(|| format!("COUNT `{a}` is not a number"))?,
        None => 10_000,
    };
    let store = args.get(1).cloned().unwrap_or_else(|| "sqlite".into());
    let bin = serve::host_binary()?;
    let data = tempfile::Builder::new().prefix("orc-api-bench-").tempdir()?;
    let pg = match store.as_str() {
        "sqlite" => None,
        url if url.starts_with("postgres://") || url.starts_with("postgresql://") => Some(PgDatabase::create(url).await?),
        other => bail!("STORE must be `sqlite` or a postgres:// URL, not `{other}`"),
    };
    let host = Host::spawn(&bin, data.path(), pg.as_ref().map(|db| db.url.as_str())).await?;
    let started = host.memory()?;
    let published = host.publish(orc_plugin_artifacts::BENCH_MEMORY.bytes).await?;
    println!(
        "orc-host serve (pid {}, {}) at {}, {} published; {n} bench-memory resources on node `local`, \
         64 actions at once; server at start: {started}",
        host.pid,
        if pg.is_some() { "PostgreSQL" } else { "SQLite" },
        host.base,
        published.get("digest").and_then(Value::as_str).unwrap_or("bench-memory"),
    );
    let cases: &[(&str, bool)] = if rss_only {
        &[("independent", false)]
    } else {
        &[("independent", false), ("graph", true)]
    };
    let mut outcome = Ok(());
    for &(env, graph) in cases {
        println!(
            "{}:",
            if graph {
                "dependency graph (chains of 10, fan-in)"
            } else {
                "independent resources"
            }
        );
        outcome = run_case(&host, env, n, graph, rss_only).await;
        if outcome.is_err() {
            break;
        }
    }
    let stopped = host.stop().await;
    if let Some(db) = pg {
        db.drop().await?;
    }
    outcome.and(stopped)
}

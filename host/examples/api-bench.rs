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
//! With `--file`, the resources are real files instead: COUNT `file` resources (the first-party
//! `file` adaptor, content and mode 0644) in one directory (a `directory` resource they all
//! require) on the environment's `local` node, whose root is `DATA_DIR/nodes/<env>/local`
//! (`app::node_root`). Each phase is timed — deploy (intent `POST` → all deployed), update (a
//! new version changing every file's content → all deployed at that version), repair with
//! nothing to change (→ operation done), dryrun (→ report done) — and after each one, untimed,
//! every file is read back from disk (content, mode, nothing missing, nothing left beside them).
//! Then the `bench-memory` case runs on the same server for comparison: the host's own overhead.
//!
//! ```text
//! cargo build --release -p orc-host --bins --examples
//! target/release/examples/api-bench [COUNT [STORE]] [--rss]
//! target/release/examples/api-bench --file [COUNT [STORE]]
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

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
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
/// period (`orc_host::server::memory`: freed pages go back to the system every 5 s).
async fn run_case(host: &Host, env: &str, n: usize, graph: bool, at_rest: bool) -> Result<()> {
    let settings = json!({
        // Everything is on `local`: the node limit is the environment's.
        "per_node_concurrency": 64,
        "env_concurrency": 64,
        // No self-healing timers: only what the benchmark asks for runs.
        "repair_interval_s": 0,
        "retry_interval_s": 60,
        "auto_deploy": true,
        // bench-memory keeps one kv key per resource: room for however many were asked for.
        "kv_quota": { "max_keys": n.max(20_000) },
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

/// The web console's pages of an environment of `n` resources, as a signed-in browser asks for
/// them: wall time on loopback (the server's time is less), 100 requests each.
async fn console_pages(host: &Host, env: &str, n: usize) -> Result<()> {
    let cookie = host.console_session().await?;
    let last = resource_id(n.saturating_sub(1));
    let pages = [
        (format!("/environments/{env}"), "first page (50 resources, status counts)"),
        (
            format!("/environments/{env}?status=deployed&q=r{}", n / 2),
            "filtered by status and id text",
        ),
        (
            format!("/environments/{env}?after={}", resource_id(n / 2)),
            "a page from the middle (keyset)",
        ),
        (
            format!(
                "/environments/{env}/resource?id={}",
                last.replace('[', "%5B").replace(']', "%5D").replace(',', "%2C")
            ),
            "a resource with its action log",
        ),
    ];
    println!("console pages, {n} resources, 100 sequential requests each (wall time on loopback, mean / slowest):");
    for (path, what) in pages {
        let (mean, slowest) = host.console_page_times(&cookie, &path, "<table", 100).await?;
        println!(
            "  {what}: {:.2} ms / {:.2} ms",
            mean.as_secs_f64() * 1e3,
            slowest.as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// The directory on the local node that holds the benchmark's files.
const FILE_DIR: &str = "/srv/bench";

/// The content of file `i` in round `round` (1: the first deploy, 2: the update).
fn file_content(i: usize, round: u32) -> String {
    if round == 1 {
        format!("orc bench file {i}\n")
    } else {
        format!("orc bench file {i}, round {round}\n")
    }
}

fn file_name(i: usize) -> String {
    format!("f{i:05}.conf")
}

/// `n` files in [`FILE_DIR`], each requiring the directory, with round `round`'s content.
fn file_intent(n: usize, round: u32) -> Vec<u8> {
    let dir_id = format!("directory[local,{FILE_DIR}]");
    let mut resources = vec![json!({ "id": dir_id, "adaptor": "directory@0.1.0", "attributes": { "mode": "0755" } })];
    resources.extend((0..n).map(|i| {
        json!({
            "id": format!("file[local,{FILE_DIR}/{}]", file_name(i)),
            "adaptor": "file@0.1.0",
            "attributes": { "content": file_content(i, round), "mode": "0644" },
            "requires": [dir_id],
        })
    }));
    serde_json::to_vec(&json!({ "resources": resources })).expect("JSON")
}

/// Every one of the `n` files is in `dir` (the directory on the host's disk) with round
/// `round`'s content and mode 0644, and nothing else is there (no temporary file left behind).
fn check_files(dir: &Path, n: usize, round: u32) -> Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    for i in 0..n {
        let path = dir.join(file_name(i));
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        ensure!(text == file_content(i, round), "{} holds {text:?}", path.display());
        let mode = std::fs::metadata(&path)?.mode() & 0o7777;
        ensure!(mode == 0o644, "{} has mode {mode:o}", path.display());
    }
    let entries = std::fs::read_dir(dir)?.count();
    ensure!(entries == n, "{} holds {entries} entries, not {n}", dir.display());
    Ok(())
}

/// Server CPU and context switches over a phase.
struct Usage {
    cpu: Duration,
    switches: u64,
}

impl Usage {
    fn start(host: &Host) -> Result<(Duration, u64)> {
        Ok((host.cpu()?, host.switches()?))
    }

    fn since(host: &Host, (cpu, switches): (Duration, u64)) -> Result<Usage> {
        Ok(Usage {
            cpu: host.cpu()?.saturating_sub(cpu),
            switches: host.switches()?.saturating_sub(switches),
        })
    }
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "server CPU {:.2} s, {} context switches", self.cpu.as_secs_f64(), self.switches)
    }
}

/// A new version of `env` changing every resource: from just before its `POST` until every one
/// of `total` resources is deployed again. Counts alone cannot tell the old version's
/// `deployed` from the new one's, so it first waits until the release shows (fewer than all
/// deployed) — a 10,000-file update cannot finish between two polls — then until all are
/// deployed; afterwards, untimed, the listing must show every resource deployed at `version`.
async fn update(host: &Host, env: &str, body: Vec<u8>, total: usize) -> Result<(Duration, u64)> {
    let t = Instant::now();
    let (status, submitted) = host.post(&format!("/api/v1/environments/{env}/intents"), body).await?;
    ensure!(status == reqwest::StatusCode::CREATED, "submitting: {status} {submitted}");
    let version = submitted
        .get("version")
        .and_then(Value::as_i64)
        .ok_or_else(|| anyhow::anyhow!("the intent was stored without a version: {submitted}"))?;
    let deadline = Instant::now() + serve::PATIENCE;
    loop {
        let counts = host.counts(env).await?;
        if counts.get("deployed").copied().unwrap_or(0) < total as u64 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the release of version {version} never showed: {counts:?}"
        );
        tokio::time::sleep(serve::poll_interval()).await;
    }
    let polls = host.until_deployed(env, total as u64).await?;
    let elapsed = t.elapsed();
    let resources = host.all_resources(env).await?;
    let at_version = resources
        .iter()
        .filter(|r| r.get("status").and_then(Value::as_str) == Some("deployed"))
        .filter(|r| r.get("version").and_then(Value::as_i64) == Some(version))
        .count();
    ensure!(
        at_version == total,
        "after the update only {at_version} of {total} resources are deployed at version {version}"
    );
    Ok((elapsed, polls))
}

/// `n` real files on the local node: deploy, update, repair, dryrun, each checked on disk.
async fn run_files(host: &Host, data_dir: &Path, env: &str, n: usize) -> Result<()> {
    let settings = json!({
        "per_node_concurrency": 64,
        "env_concurrency": 64,
        "repair_interval_s": 0,
        "retry_interval_s": 60,
        "auto_deploy": true,
    });
    // Untimed: a server compiles a plugin once, at its first use, into its cache; the phases
    // below measure the server at work, not that one-time compilation, so it is done here
    // (one file in an environment of its own) and reported apart.
    let warm = format!("{env}-warm-up");
    host.create_environment(&warm, settings.clone()).await?;
    let warmed = serve::deploy(host, &warm, file_intent(1, 1), 2).await?;
    println!(
        "  warm-up (untimed): the file and directory adaptors compiled at their first use, 1 file deployed: {:.3} s",
        warmed.elapsed.as_secs_f64()
    );
    host.create_environment(env, settings).await?;
    let dir: PathBuf = orc_host::app::node_root(data_dir, env).join(FILE_DIR.trim_start_matches('/'));
    let total = n + 1;
    let rate = |d: Duration| n as f64 / d.as_secs_f64();

    let since = serve::now_ms();
    let body = file_intent(n, 1);
    let deployed = serve::deploy(host, env, body, total).await?;
    println!(
        "  deploy: POST intent → all {total} deployed: {:.3} s ({:.0} files/s); the POST answered 201 after {:.3} s; \
         server CPU {:.2} s, {} context switches; load {}",
        deployed.elapsed.as_secs_f64(),
        rate(deployed.elapsed),
        deployed.answered.as_secs_f64(),
        deployed.server_cpu.as_secs_f64(),
        deployed.server_switches,
        serve::load_average(),
    );
    println!("    {}", serve::action_profile(host, env, since).await?);
    check_files(&dir, n, 1)?;
    println!("    checked on disk: {n} files with their content and mode 0644, nothing else in {FILE_DIR}");

    let since = serve::now_ms();
    let usage = Usage::start(host)?;
    let (updated, _) = update(host, env, file_intent(n, 2), total).await?;
    let usage = Usage::since(host, usage)?;
    println!(
        "  update: POST intent changing every file → all {total} deployed: {:.3} s ({:.0} files/s); {usage}; load {}",
        updated.as_secs_f64(),
        rate(updated),
        serve::load_average(),
    );
    println!("    {}", serve::action_profile(host, env, since).await?);
    check_files(&dir, n, 2)?;
    println!("    checked on disk: {n} files with the new content");

    let usage = Usage::start(host)?;
    let (repair, actions) = serve::repair(host, env, total).await?;
    let usage = Usage::since(host, usage)?;
    println!(
        "  repair, nothing to change: POST repair → operation done: {:.3} s ({:.0} files/s; actions {actions}); {usage}; load {}",
        repair.as_secs_f64(),
        rate(repair),
        serve::load_average(),
    );
    check_files(&dir, n, 2)?;

    let usage = Usage::start(host)?;
    let (dryrun, summary) = serve::dryrun(host, env, total).await?;
    let usage = Usage::since(host, usage)?;
    println!(
        "  dryrun: POST dryrun → report done: {:.3} s ({:.0} files/s; {summary}); {usage}; load {}",
        dryrun.as_secs_f64(),
        rate(dryrun),
        serve::load_average(),
    );
    check_files(&dir, n, 2)?;
    println!("    checked on disk after repair and dryrun: {n} files unchanged");
    println!("  server after the file case: {}", host.memory()?);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    // reqwest is built without a default TLS provider (one provider per binary).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let rss_only = args.iter().any(|a| a == "--rss");
    let files = args.iter().any(|a| a == "--file");
    args.retain(|a| a != "--rss" && a != "--file");
    let n: usize = match args.first() {
        Some(a) => a.parse().with_context(|| format!("COUNT `{a}` is not a number"))?,
        None => 10_000,
    };
    let store = args.get(1).cloned().unwrap_or_else(|| "sqlite".into());
    let bin = serve::host_binary()?;
    let data = tempfile::Builder::new().prefix("orc-api-bench-").tempdir()?;
    let pg = match store.as_str() {
        "sqlite" => None,
        url if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            Some(serve::PgDatabase::create(url, "orc_api_bench").await?)
        }
        other => bail!("STORE must be `sqlite` or a postgres:// URL, not `{other}`"),
    };
    let mut host = Host::spawn(&bin, data.path(), pg.as_ref().map(|db| db.url.as_str())).await?;
    let started = host.memory()?;
    let published = host.publish(orc_plugin_artifacts::BENCH_MEMORY.bytes).await?;
    // Every timed request carries a member's token, not the admin's: authorization is paid for.
    host.act_as_member("bench").await?;
    println!(
        "orc-host serve (pid {}, {}) at {}, {} published; {n} bench-memory resources on node `local`, \
         64 actions at once; server at start: {started}",
        host.pid,
        if pg.is_some() { "PostgreSQL" } else { "SQLite" },
        host.base,
        published.get("digest").and_then(Value::as_str).unwrap_or("bench-memory"),
    );
    println!("requests carry the token of user `bench`, owner of each environment (not an admin)");
    println!("load average at start: {}", serve::load_average());
    let cases: &[(&str, bool)] = if rss_only || files {
        &[("independent", false)]
    } else {
        &[("independent", false), ("graph", true)]
    };
    let mut outcome = Ok(());
    if files {
        println!("{n} file resources (file@0.1.0) in {FILE_DIR} on node `local`, 64 actions at once:");
        outcome = run_files(&host, data.path(), "files", n).await;
    }
    for &(env, graph) in cases {
        if outcome.is_err() {
            break;
        }
        println!(
            "{}:",
            match (graph, files) {
                (true, _) => "dependency graph (chains of 10, fan-in)",
                (false, true) => "the host's own overhead: the same count of bench-memory resources (state in kv, no file system)",
                (false, false) => "independent resources",
            }
        );
        outcome = run_case(&host, env, n, graph, rss_only).await;
    }
    if outcome.is_ok() && !rss_only {
        let env = cases.last().map_or("files", |(env, _)| *env);
        let path = format!("/api/v1/environments/{env}");
        match host.request_means(&path, 2_000).await {
            Ok((member, admin)) => println!(
                "authorization per request: GET {path}, mean of 2000 sequential requests each: {} µs with the member's token, \
                 {} µs with the admin's (the member's role in the environment is checked; the admin's is not)",
                member.as_micros(),
                admin.as_micros()
            ),
            Err(e) => outcome = Err(e),
        }
    }
    if outcome.is_ok() && !rss_only {
        let env = cases.last().map_or("files", |(env, _)| *env);
        outcome = console_pages(&host, env, n).await;
    }
    let stopped = host.stop().await;
    if let Some(db) = pg {
        db.drop().await?;
    }
    outcome.and(stopped)
}

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
//! COUNT (say 100000) resources in one environment. `ORC_HOST_BIN` overrides the server binary;
//! `ORC_BENCH_POLL_MS` the pause between two polls (default 2 ms).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// Pause between two polls of a condition (`ORC_BENCH_POLL_MS`, default 2).
fn poll_interval() -> Duration {
    let ms = std::env::var("ORC_BENCH_POLL_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    Duration::from_millis(ms)
}
/// Longest wait for any one condition.
const PATIENCE: Duration = Duration::from_secs(600);
/// Resources per listing page (the API's maximum).
const PAGE: usize = 10_000;

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

/// Resident and peak resident memory of a process, in KiB.
#[derive(Debug, Clone, Copy)]
struct Memory {
    rss_kib: u64,
    hwm_kib: u64,
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {:.1} MiB (peak {:.1} MiB)",
            self.rss_kib as f64 / 1024.0,
            self.hwm_kib as f64 / 1024.0
        )
    }
}

fn memory_of(pid: u32) -> Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading /proc/PID/status")?;
    let field = |name: &str| -> Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| anyhow!("no {name} in /proc/{pid}/status"))?;
        Ok(line[name.len()..].trim().trim_end_matches("kB").trim().parse()?)
    };
    Ok(Memory {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:")?,
    })
}

/// A running `orc-host serve` child process and a client for its API.
struct Host {
    child: Child,
    pid: u32,
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Host {
    async fn spawn(bin: &Path, data_dir: &Path, database: Option<&str>) -> Result<Host> {
        let mut command = Command::new(bin);
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--max-body-bytes", "67108864", "--data-dir"])
            .arg(data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(url) = database {
            command.args(["--database", url]);
        }
        let mut child = command.spawn().with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().ok_or_else(|| anyhow!("the server exited at once"))?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let (mut addr, mut token) = (None, None);
        while addr.is_none() || token.is_none() {
            let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
                .await
                .context("the server printed nothing for 120 s")??
                .ok_or_else(|| anyhow!("the server exited before printing its address and admin token"))?;
            if let Some(a) = line.strip_prefix("listening on ") {
                addr = Some(a.trim().to_string());
            } else if let Some((_, t)) = line.split_once("admin token (shown once; only its hash is stored): ") {
                token = Some(t.trim().to_string());
            }
        }
        // Keep draining stdout, so the server never writes into a closed pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Host {
            child,
            pid,
            base: addr.expect("read"),
            token: token.expect("read"),
            http: reqwest::Client::builder().pool_max_idle_per_host(4).build()?,
        })
    }

    fn memory(&self) -> Result<Memory> {
        memory_of(self.pid)
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<(StatusCode, Value)> {
        let response = request.bearer_auth(&self.token).send().await?;
        let status = response.status();
        let bytes = response.bytes().await?;
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Ok((status, value))
    }

    async fn get(&self, path: &str) -> Result<(StatusCode, Value)> {
        self.send(self.http.get(format!("{}{path}", self.base))).await
    }

    async fn post(&self, path: &str, body: Vec<u8>) -> Result<(StatusCode, Value)> {
        self.send(
            self.http
                .post(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .body(body),
        )
        .await
    }

    /// Publishes a plugin to the server's registry (`/registry`, the token is needed to write).
    async fn publish(&self, bytes: &'static [u8]) -> Result<Value> {
        let (status, body) = self
            .send(
                self.http
                    .post(format!("{}/registry/v1/plugins", self.base))
                    .header("content-type", "application/wasm")
                    .body(bytes),
            )
            .await?;
        ensure!(status.is_success(), "publishing: {status} {body}");
        Ok(body)
    }

    async fn create_environment(&self, name: &str) -> Result<()> {
        let settings = json!({
            // Everything is on `local`: the node limit is the environment's.
            "per_node_concurrency": 64,
            "env_concurrency": 64,
            // No self-healing timers: only what the benchmark asks for runs.
            "repair_interval_s": 0,
            "retry_interval_s": 60,
            "auto_deploy": true,
        });
        let (status, body) = self
            .post(
                "/api/v1/environments",
                serde_json::to_vec(&json!({ "name": name, "settings": settings }))?,
            )
            .await?;
        ensure!(status == StatusCode::CREATED, "creating {name}: {status} {body}");
        Ok(())
    }

    /// Resources per status, from `GET /api/v1/environments/{env}`.
    async fn counts(&self, env: &str) -> Result<BTreeMap<String, u64>> {
        let (status, body) = self.get(&format!("/api/v1/environments/{env}")).await?;
        ensure!(status == StatusCode::OK, "GET environment {env}: {status} {body}");
        let counts = body
            .get("resources")
            .and_then(Value::as_object)
            .ok_or_else(|| anyhow!("GET environment {env}: no `resources` counts in {body}"))?;
        Ok(counts.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0))).collect())
    }

    /// Polls the counts until every one of `n` resources is deployed; fails on any failure.
    async fn until_deployed(&self, env: &str, n: u64) -> Result<u64> {
        let deadline = Instant::now() + PATIENCE;
        let mut polls = 0;
        loop {
            let counts = self.counts(env).await?;
            polls += 1;
            if counts.get("deployed").copied().unwrap_or(0) == n {
                return Ok(polls);
            }
            let bad: u64 = ["failed", "skipped", "unavailable"].iter().filter_map(|s| counts.get(*s)).sum();
            ensure!(bad == 0, "resources did not deploy: {counts:?}");
            ensure!(Instant::now() < deadline, "not deployed after {PATIENCE:?}: {counts:?}");
            tokio::time::sleep(poll_interval()).await;
        }
    }

    /// Polls `…/{env}/{collection}/{id}` (an operation or a dryrun, `id` from the 202 answer
    /// `accepted`) until its status is `done`.
    async fn until_done(&self, env: &str, collection: &str, accepted: &Value) -> Result<Value> {
        let id = accepted
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("answered without an id: {accepted}"))?;
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (status, body) = self.get(&format!("/api/v1/environments/{env}/{collection}/{id}")).await?;
            ensure!(status == StatusCode::OK, "{collection}/{id}: {status} {body}");
            match body.get("status").and_then(Value::as_str) {
                Some("running") => {}
                Some("done") => return Ok(body),
                other => bail!("{collection}/{id} ended {other:?}: {body}"),
            }
            ensure!(Instant::now() < deadline, "{collection}/{id} not done after {PATIENCE:?}");
            tokio::time::sleep(poll_interval()).await;
        }
    }

    /// Every resource state of `env`, page by page.
    async fn all_resources(&self, env: &str) -> Result<Vec<Value>> {
        let mut items = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut url = reqwest::Url::parse(&format!("{}/api/v1/environments/{env}/resources", self.base))?;
            url.query_pairs_mut().append_pair("limit", &PAGE.to_string());
            if let Some(a) = &after {
                url.query_pairs_mut().append_pair("after", a);
            }
            let (status, mut page) = self.send(self.http.get(url)).await?;
            ensure!(status == StatusCode::OK, "listing resources: {status} {page}");
            if let Some(Value::Array(batch)) = page.get_mut("items").map(Value::take) {
                items.extend(batch);
            }
            match page.get("next_after").and_then(Value::as_str) {
                Some(a) => after = Some(a.to_string()),
                None => return Ok(items),
            }
        }
    }

    /// Stops the server gracefully (SIGTERM) and waits for it.
    async fn stop(mut self) -> Result<()> {
        let _ = std::process::Command::new("kill").args(["-TERM", &self.pid.to_string()]).status();
        match tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                ensure!(status.success(), "the server exited with {status}");
            }
            Err(_) => {
                self.child.kill().await?;
                bail!("the server did not stop within 60 s of SIGTERM");
            }
        }
        Ok(())
    }
}

/// Milliseconds since the Unix epoch (the server's timestamps, on the same clock).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One environment: deploy, repair, dryrun, memory.
async fn run_case(host: &Host, env: &str, n: usize, graph: bool) -> Result<()> {
    host.create_environment(env).await?;
    let body = intent(n, graph);
    let body_mib = body.len() as f64 / (1024.0 * 1024.0);

    // Deploy: from just before the POST until the environment counts every resource deployed.
    let t = Instant::now();
    let (status, submitted) = host.post(&format!("/api/v1/environments/{env}/intents"), body).await?;
    let answered = t.elapsed();
    ensure!(status == StatusCode::CREATED, "submitting: {status} {submitted}");
    let polls = host.until_deployed(env, n as u64).await?;
    let deploy = t.elapsed();
    let after_deploy = host.memory()?;
    println!(
        "  POST intent ({body_mib:.1} MiB) → all {n} deployed: {:.3} s ({:.0}/s); the POST answered 201 after {:.3} s; {polls} polls; server {after_deploy}",
        deploy.as_secs_f64(),
        n as f64 / deploy.as_secs_f64(),
        answered.as_secs_f64(),
    );

    // Repair: from just before the POST until its operation is done, i.e. the scheduler settled
    // after re-reading every resource and every action was recorded.
    let since = now_ms();
    let t = Instant::now();
    let (status, operation) = host.post(&format!("/api/v1/environments/{env}/repair"), Vec::new()).await?;
    ensure!(status == StatusCode::ACCEPTED, "repair: {status} {operation}");
    let done = host.until_done(env, "operations", &operation).await?;
    let repair = t.elapsed();
    // Checked, not timed: every resource is deployed and was verified by this repair.
    let resources = host.all_resources(env).await?;
    let verified = resources
        .iter()
        .filter(|r| r.get("status").and_then(Value::as_str) == Some("deployed"))
        .filter(|r| r.get("last_verified_at").and_then(Value::as_i64).is_some_and(|at| at >= since))
        .count();
    ensure!(
        verified == n,
        "after the repair only {verified} of {n} resources are deployed and verified since it started"
    );
    println!(
        "  POST repair → operation done: {:.3} s, all {n} re-verified (actions {})",
        repair.as_secs_f64(),
        done.pointer("/result/actions").map(Value::to_string).unwrap_or_default(),
    );

    // Dryrun: from just before the POST until its report is done.
    let t = Instant::now();
    let (status, started) = host.post(&format!("/api/v1/environments/{env}/dryrun"), Vec::new()).await?;
    ensure!(status == StatusCode::ACCEPTED, "dryrun: {status} {started}");
    let report = host.until_done(env, "dryruns", &started).await?;
    let dryrun = t.elapsed();
    let unchanged = report.pointer("/report/summary/no_change").and_then(Value::as_u64);
    ensure!(
        unchanged == Some(n as u64),
        "the dryrun should find nothing to change: {}",
        dryrun_summary(&report)
    );
    println!(
        "  POST dryrun → report done: {:.3} s ({})",
        dryrun.as_secs_f64(),
        dryrun_summary(&report)
    );
    println!("  server after repair and dryrun: {}", host.memory()?);
    Ok(())
}

/// The report's summary (`no_change`, `would_change`, `unchecked`).
fn dryrun_summary(dryrun: &Value) -> String {
    match dryrun.pointer("/report/summary") {
        Some(summary) => summary.to_string(),
        None => "no summary".to_string(),
    }
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

/// The release `orc-host` beside this example (`target/release/examples/api-bench` →
/// `target/release/orc-host`), or `ORC_HOST_BIN`.
fn host_binary() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("ORC_HOST_BIN") {
        return Ok(bin.into());
    }
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("orc-host"))
        .ok_or_else(|| anyhow!("cannot locate orc-host from {}", exe.display()))?;
    ensure!(
        bin.is_file(),
        "{} not found: build it (`cargo build --release -p orc-host --bins --examples`) or set ORC_HOST_BIN",
        bin.display()
    );
    Ok(bin)
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
    let bin = host_binary()?;
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
        outcome = run_case(&host, env, n, graph).await;
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

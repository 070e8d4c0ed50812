//! What the REST benchmarks (`api-bench`, `node-bench`) share: a real `orc-host serve` child
//! process from the release build and a client for its API, and the three measured phases —
//! intent `POST` → every resource deployed, user repair → its operation done (then, untimed,
//! every resource checked deployed and verified since), dryrun → its report done with nothing to
//! change. Included by each example with `#[path = "support/serve.rs"] mod serve;`.

#![allow(dead_code)]

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
pub fn poll_interval() -> Duration {
    let ms = std::env::var("ORC_BENCH_POLL_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    Duration::from_millis(ms)
}
/// Longest wait for any one condition.
pub const PATIENCE: Duration = Duration::from_secs(600);
/// Resources per listing page (the API's maximum).
const PAGE: usize = 10_000;

/// Resident and peak resident memory of a process, in KiB.
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub rss_kib: u64,
    pub hwm_kib: u64,
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

/// CPU time (user + system) a process has used so far.
pub fn cpu_of(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).context("reading /proc/PID/stat")?;
    // After the command name in parentheses: state is field 3, utime 14, stime 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("no command name in /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> { Ok(fields.get(i - 3).ok_or_else(|| anyhow!("short /proc/{pid}/stat"))?.parse()?) };
    // USER_HZ is 100 on Linux.
    Ok(Duration::from_millis((ticks(14)? + ticks(15)?) * 10))
}

/// Context switches of a process so far, summed over its live threads (voluntary and not).
pub fn switches_of(pid: u32) -> Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).context("reading /proc/PID/task")? {
        let Ok(status) = std::fs::read_to_string(task?.path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        for line in status.lines() {
            if let Some(n) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                total += n.trim().parse::<u64>()?;
            }
        }
    }
    Ok(total)
}

pub fn memory_of(pid: u32) -> Result<Memory> {
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
pub struct Host {
    child: Child,
    pub pid: u32,
    pub base: String,
    /// The admin's token: creates environments and users, publishes plugins.
    admin: String,
    /// What every other request carries: the admin's token, or a member's ([`Host::act_as_member`]).
    token: String,
    /// The member every new environment makes its owner.
    member: Option<String>,
    http: reqwest::Client,
}

impl Host {
    pub async fn spawn(bin: &Path, data_dir: &Path, database: Option<&str>) -> Result<Host> {
        Host::start(bin, data_dir, database, None).await
    }

    /// Another replica on `database`, whose admin token (`token`) an earlier one printed.
    pub async fn spawn_replica(bin: &Path, data_dir: &Path, database: &str, token: &str) -> Result<Host> {
        Host::start(bin, data_dir, Some(database), Some(token.to_string())).await
    }

    async fn start(bin: &Path, data_dir: &Path, database: Option<&str>, mut token: Option<String>) -> Result<Host> {
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
        let mut addr = None;
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
            admin: token.clone().expect("read"),
            token: token.expect("read"),
            member: None,
            http: reqwest::Client::builder().pool_max_idle_per_host(4).build()?,
        })
    }

    pub fn memory(&self) -> Result<Memory> {
        memory_of(self.pid)
    }

    /// The server's CPU time so far.
    pub fn cpu(&self) -> Result<Duration> {
        cpu_of(self.pid)
    }

    /// The server's context switches so far (its live threads).
    pub fn switches(&self) -> Result<u64> {
        switches_of(self.pid)
    }

    /// From now on, requests carry the token of user `name` (created here, not an admin), who is
    /// made the owner of every environment created from now on: what authorization costs shows.
    pub async fn act_as_member(&mut self, name: &str) -> Result<()> {
        let (status, body) = self
            .send_as(
                &self.admin,
                self.http.post(format!("{}/api/v1/users", self.base)).json(&json!({ "name": name })),
            )
            .await?;
        ensure!(status == StatusCode::CREATED, "creating user {name}: {status} {body}");
        let (status, body) = self
            .send_as(
                &self.admin,
                self.http.post(format!("{}/api/v1/users/{name}/tokens", self.base)).json(&json!({})),
            )
            .await?;
        ensure!(status == StatusCode::CREATED, "a token for {name}: {status} {body}");
        self.token = body["token"].as_str().ok_or_else(|| anyhow!("no token in {body}"))?.to_string();
        self.member = Some(name.to_string());
        Ok(())
    }

    /// The mean time of `n` sequential `GET path` requests (kept-alive connection), with the
    /// member's token and with the admin's, alternating in rounds of 100 so that drift hits both.
    pub async fn request_means(&self, path: &str, n: usize) -> Result<(Duration, Duration)> {
        let (mut member, mut admin) = (Duration::ZERO, Duration::ZERO);
        for round in 0..(n / 100).max(1) {
            for (token, total) in [(&self.token, &mut member), (&self.admin, &mut admin)] {
                let started = std::time::Instant::now();
                for _ in 0..100 {
                    let (status, body) = self.send_as(token, self.http.get(format!("{}{path}", self.base))).await?;
                    ensure!(status == StatusCode::OK, "GET {path} (round {round}): {status} {body}");
                }
                *total += started.elapsed();
            }
        }
        let count = u32::try_from((n / 100).max(1) * 100).unwrap_or(u32::MAX);
        Ok((member / count, admin / count))
    }

    /// Signs in to the web console with this host's token (as a browser would, with a form);
    /// the session's `Cookie` header.
    pub async fn console_session(&self) -> Result<String> {
        let root = self.base.trim_end_matches('/');
        let response = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()?
            .post(format!("{root}/sign-in"))
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            // A token is `orc_` and hex digits: nothing to escape.
            .body(format!("token={}", self.token))
            .send()
            .await?;
        ensure!(response.status() == StatusCode::SEE_OTHER, "console sign-in: {}", response.status());
        let cookie = response
            .headers()
            .get(reqwest::header::SET_COOKIE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .ok_or_else(|| anyhow!("console sign-in set no cookie"))?;
        Ok(cookie.to_string())
    }

    /// `n` sequential GETs of console page `path` with `cookie`: (mean, slowest), each checked
    /// to be answered 200 with `needle` in its HTML.
    pub async fn console_page_times(&self, cookie: &str, path: &str, needle: &str, n: usize) -> Result<(Duration, Duration)> {
        let root = self.base.trim_end_matches('/');
        let (mut total, mut slowest) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..n.max(1) {
            let started = std::time::Instant::now();
            let response = self.http.get(format!("{root}{path}")).header("cookie", cookie).send().await?;
            let status = response.status();
            let html = response.text().await?;
            let took = started.elapsed();
            ensure!(
                status == StatusCode::OK && html.contains(needle),
                "GET {path}: {status}, without {needle:?}"
            );
            total += took;
            slowest = slowest.max(took);
        }
        Ok((total / u32::try_from(n.max(1)).unwrap_or(u32::MAX), slowest))
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<(StatusCode, Value)> {
        self.send_as(&self.token, request).await
    }

    async fn send_as(&self, token: &str, request: reqwest::RequestBuilder) -> Result<(StatusCode, Value)> {
        let response = request.bearer_auth(token).send().await?;
        let status = response.status();
        let bytes = response.bytes().await?;
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Ok((status, value))
    }

    pub async fn get(&self, path: &str) -> Result<(StatusCode, Value)> {
        self.send(self.http.get(format!("{}{path}", self.base))).await
    }

    pub async fn post(&self, path: &str, body: Vec<u8>) -> Result<(StatusCode, Value)> {
        self.send(
            self.http
                .post(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .body(body),
        )
        .await
    }

    pub async fn delete(&self, path: &str) -> Result<(StatusCode, Value)> {
        self.send(self.http.delete(format!("{}{path}", self.base))).await
    }

    /// Publishes a plugin to the server's registry (`/registry`, the token is needed to write).
    pub async fn publish(&self, bytes: &'static [u8]) -> Result<Value> {
        let (status, body) = self
            .send_as(
                &self.admin,
                self.http
                    .post(format!("{}/registry/v1/plugins", self.base))
                    .header("content-type", "application/wasm")
                    .body(bytes),
            )
            .await?;
        ensure!(status.is_success(), "publishing: {status} {body}");
        Ok(body)
    }

    /// Publishes a service document to the server's registry's catalog.
    pub async fn publish_service(&self, doc: &Value) -> Result<Value> {
        let request = self.http.post(format!("{}/registry/v1/services", self.base)).json(doc);
        let (status, body) = self.send_as(&self.admin, request).await?;
        ensure!(status.is_success(), "publishing a service: {status} {body}");
        Ok(body)
    }

    pub async fn patch(&self, path: &str, body: Vec<u8>) -> Result<(StatusCode, Value)> {
        self.send(
            self.http
                .patch(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .body(body),
        )
        .await
    }

    /// Creates an environment with `settings` (as `POST /api/v1/environments` takes them).
    pub async fn create_environment(&self, name: &str, settings: Value) -> Result<()> {
        let request = self
            .http
            .post(format!("{}/api/v1/environments", self.base))
            .json(&json!({ "name": name, "settings": settings }));
        let (status, body) = self.send_as(&self.admin, request).await?;
        ensure!(status == StatusCode::CREATED, "creating {name}: {status} {body}");
        if let Some(member) = &self.member {
            let request = self
                .http
                .put(format!("{}/api/v1/environments/{name}/members/{member}", self.base))
                .json(&json!({ "role": "owner" }));
            let (status, body) = self.send_as(&self.admin, request).await?;
            ensure!(status == StatusCode::OK, "making {member} the owner of {name}: {status} {body}");
        }
        Ok(())
    }

    /// Resources per status, from `GET /api/v1/environments/{env}`.
    pub async fn counts(&self, env: &str) -> Result<BTreeMap<String, u64>> {
        let (status, body) = self.get(&format!("/api/v1/environments/{env}")).await?;
        ensure!(status == StatusCode::OK, "GET environment {env}: {status} {body}");
        let counts = body
            .get("resources")
            .and_then(Value::as_object)
            .ok_or_else(|| anyhow!("GET environment {env}: no `resources` counts in {body}"))?;
        Ok(counts.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0))).collect())
    }

    /// Polls the counts until every one of `n` resources is deployed; fails on any failure.
    pub async fn until_deployed(&self, env: &str, n: u64) -> Result<u64> {
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
    pub async fn until_done(&self, env: &str, collection: &str, accepted: &Value) -> Result<Value> {
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
    pub async fn all_resources(&self, env: &str) -> Result<Vec<Value>> {
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

    /// The admin's token.
    pub fn admin_token(&self) -> &str {
        &self.admin
    }

    /// Kills the server outright (SIGKILL) and waits for it.
    pub async fn kill(mut self) -> Result<()> {
        self.child.kill().await?;
        Ok(())
    }

    /// Stops the server gracefully (SIGTERM) and waits for it.
    pub async fn stop(mut self) -> Result<()> {
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

/// Load average of the machine (`/proc/loadavg`'s first three fields), for the figures.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The machine's CPU model and count (`/proc/cpuinfo`), for the figures.
pub fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let count = info.lines().filter(|l| l.starts_with("processor")).count();
    format!("{model} × {count}")
}

/// Milliseconds since the Unix epoch (the server's timestamps, on the same clock).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Where an operation's time went, from the action log (untimed): how long single actions took
/// and how many were in flight on average between the first start and the last end.
pub async fn action_profile(host: &Host, env: &str, since: i64) -> Result<String> {
    let mut spans: Vec<(i64, i64)> = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let mut path = format!("/api/v1/environments/{env}/actions?limit=10000&since={since}");
        if let Some(b) = before {
            path.push_str(&format!("&before={b}"));
        }
        let (status, page) = host.get(&path).await?;
        ensure!(status == StatusCode::OK, "action log: {status} {page}");
        for a in page.get("items").and_then(Value::as_array).into_iter().flatten() {
            let at = |f: &str| a.get(f).and_then(Value::as_i64).ok_or_else(|| anyhow!("action without {f}: {a}"));
            spans.push((at("started_at")?, at("finished_at")?));
        }
        match page.get("next_before").and_then(Value::as_i64) {
            Some(b) => before = Some(b),
            None => break,
        }
    }
    ensure!(!spans.is_empty(), "no actions logged since {since}");
    let mut took: Vec<i64> = spans.iter().map(|(s, f)| f - s).collect();
    took.sort_unstable();
    let pct = |p: usize| took[(took.len() - 1) * p / 100];
    let first = spans.iter().map(|s| s.0).min().unwrap_or(since);
    let last = spans.iter().map(|s| s.1).max().unwrap_or(since);
    let busy: i64 = took.iter().sum();
    Ok(format!(
        "{} actions: each p50 {} ms, p90 {} ms, max {} ms; the first started {} ms after the request, \
         the last ended after {} ms; {:.1} in flight on average",
        spans.len(),
        pct(50),
        pct(90),
        pct(100),
        first - since,
        last - since,
        busy as f64 / (last - first).max(1) as f64,
    ))
}

/// A measured intent submission.
pub struct Deployed {
    /// From just before the `POST` until the environment counts every resource deployed.
    pub elapsed: Duration,
    /// Until the `POST` was answered `201`.
    pub answered: Duration,
    pub polls: u64,
    /// CPU time the server used meanwhile (user + system, all its threads).
    pub server_cpu: Duration,
    /// Context switches of the server's threads meanwhile.
    pub server_switches: u64,
}

/// Submits `body` to `env` and waits until all `n` resources are deployed.
pub async fn deploy(host: &Host, env: &str, body: Vec<u8>, n: usize) -> Result<Deployed> {
    let (cpu, switches) = (host.cpu()?, host.switches()?);
    let t = Instant::now();
    let (status, submitted) = host.post(&format!("/api/v1/environments/{env}/intents"), body).await?;
    let answered = t.elapsed();
    ensure!(status == StatusCode::CREATED, "submitting: {status} {submitted}");
    let polls = host.until_deployed(env, n as u64).await?;
    let elapsed = t.elapsed();
    Ok(Deployed {
        elapsed,
        answered,
        polls,
        server_cpu: host.cpu()?.saturating_sub(cpu),
        server_switches: host.switches()?.saturating_sub(switches),
    })
}

/// A user repair from just before the `POST` until its operation is done, i.e. the scheduler
/// settled after re-reading every resource and every action was recorded; then, untimed, every
/// one of the `n` resources is checked to be deployed and verified by this repair. Returns the
/// time and the operation's action counts.
pub async fn repair(host: &Host, env: &str, n: usize) -> Result<(Duration, String)> {
    let since = now_ms();
    let t = Instant::now();
    let (status, operation) = host.post(&format!("/api/v1/environments/{env}/repair"), Vec::new()).await?;
    ensure!(status == StatusCode::ACCEPTED, "repair: {status} {operation}");
    let done = host.until_done(env, "operations", &operation).await?;
    let elapsed = t.elapsed();
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
    let actions = done.pointer("/result/actions").map(Value::to_string).unwrap_or_default();
    Ok((elapsed, actions))
}

/// A dryrun from just before the `POST` until its report is done; it must find all `n`
/// resources unchanged. Returns the time and the report's summary.
pub async fn dryrun(host: &Host, env: &str, n: usize) -> Result<(Duration, String)> {
    let t = Instant::now();
    let (status, started) = host.post(&format!("/api/v1/environments/{env}/dryrun"), Vec::new()).await?;
    ensure!(status == StatusCode::ACCEPTED, "dryrun: {status} {started}");
    let report = host.until_done(env, "dryruns", &started).await?;
    let elapsed = t.elapsed();
    let summary = match report.pointer("/report/summary") {
        Some(summary) => summary.to_string(),
        None => "no summary".to_string(),
    };
    let unchanged = report.pointer("/report/summary/no_change").and_then(Value::as_u64);
    ensure!(unchanged == Some(n as u64), "the dryrun should find nothing to change: {summary}");
    Ok((elapsed, summary))
}

/// The release `orc-host` beside the running example (`target/release/examples/<name>` →
/// `target/release/orc-host`), or `ORC_HOST_BIN`.
pub fn host_binary() -> Result<PathBuf> {
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

/// A throwaway PostgreSQL database on the server `admin_url` points at.
pub struct PgDatabase {
    admin_url: String,
    name: String,
    pub url: String,
}

impl PgDatabase {
    /// A new database named `prefix` and this process's id.
    pub async fn create(admin_url: &str, prefix: &str) -> Result<PgDatabase> {
        use sqlx::{Connection as _, Executor as _};
        let name = format!("{prefix}_{}", std::process::id());
        let mut admin = sqlx::PgConnection::connect(admin_url)
            .await
            .with_context(|| format!("connecting to {admin_url}"))?;
        admin.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).await?;
        admin.close().await?;
        Ok(PgDatabase {
            url: orc_tests::pg::with_database(admin_url, &name),
            admin_url: admin_url.to_string(),
            name,
        })
    }

    pub async fn drop(self) -> Result<()> {
        use sqlx::{Connection as _, Executor as _};
        let mut admin = sqlx::PgConnection::connect(&self.admin_url).await?;
        admin
            .execute(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)))
            .await?;
        Ok(())
    }
}

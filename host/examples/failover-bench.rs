//! failover-bench: how long an environment has no owner after its owner is killed.
//!
//! ```sh
//! target/release/examples/failover-bench postgres://URL [RUNS]
//! ```
//!
//! Starts three `orc-host serve` replicas (the release build beside this example, or
//! `ORC_HOST_BIN`) on a fresh database of the PostgreSQL server at URL, creates an environment
//! and, RUNS times (default 10): finds its owner, kills it with SIGKILL, and times until another
//! replica holds it (its `GET /api/v1/replicas`, polled every 2 ms), then until a request for
//! it sent to a third replica is answered by the new owner (relayed through the database); a new
//! replica replaces the killed one before the next run. Prints each run, the median and the
//! worst, with the CPU model and load; then what relaying costs: the mean time of a read asked
//! of the owner (the floor) and of another replica, which relays it through the database. The floor is the looker's period: a replica looks at the
//! leases every 1 s (less a random quarter), so a takeover can take up to that long plus the
//! claim.

#[path = "support/serve.rs"]
mod serve;

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use serve::{Host, PgDatabase};

/// The replica holding `env` by what `host` answers, if a live one does.
async fn owner_of(host: &Host, env: &str) -> Result<Option<String>> {
    let (_, set) = host.get("/api/v1/replicas").await?;
    let items = set["items"].as_array().cloned().unwrap_or_default();
    Ok(items
        .iter()
        .find(|r| r["live"] == true && r["holds"].as_array().is_some_and(|h| h.iter().any(|e| e["environment"] == env)))
        .and_then(|r| r["address"].as_str().map(str::to_string)))
}

/// `host`'s address as the replica set names it (`http://` stripped).
fn address(host: &Host) -> &str {
    host.base.trim_start_matches("http://")
}

async fn until<T>(what: &str, mut probe: impl AsyncFnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(found) = probe().await? {
            return Ok(found);
        }
        if Instant::now() > deadline {
            bail!("waited 60 s for {what}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn summary(label: &str, mut times: Vec<Duration>) {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{label}: median {:.0} ms, worst {:.0} ms, best {:.0} ms over {} runs",
        ms(times[times.len() / 2]),
        ms(times[times.len() - 1]),
        ms(times[0]),
        times.len()
    );
}

#[tokio::main]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(url) = args
        .first()
        .filter(|u| u.starts_with("postgres://") || u.starts_with("postgresql://"))
    else {
        bail!("usage: failover-bench postgres://URL [RUNS]");
    };
    let runs: usize = match args.get(1) {
        Some(r) => r.parse().with_context(|| format!("RUNS `{r}` is not a number"))?,
        None => 10,
    };
    println!("{}; load average at start: {}", serve::cpu_model(), serve::load_average());
    let bin = serve::host_binary()?;
    let db = PgDatabase::create(url, "orc_failover_bench").await?;
    let dirs = tempfile::Builder::new().prefix("orc-failover-bench-").tempdir()?;
    let mut made = 0;
    let mut data_dir = || {
        made += 1;
        let dir = dirs.path().join(format!("replica{made}"));
        std::fs::create_dir_all(&dir).map(|()| dir)
    };
    let first = Host::spawn(&bin, &data_dir()?, Some(&db.url)).await?;
    let token = first.admin_token().to_string();
    let mut set = vec![first];
    for _ in 0..2 {
        set.push(Host::spawn_replica(&bin, &data_dir()?, &db.url, &token).await?);
    }
    set[0].create_environment("prod", json!({})).await?;

    let (mut takeovers, mut answers) = (Vec::new(), Vec::new());
    for run in 1..=runs {
        let owner = until("an owner of prod", async || owner_of(&set[0], "prod").await).await?;
        let at = set
            .iter()
            .position(|h| address(h) == owner)
            .with_context(|| format!("the owner {owner} is not one of the replicas started"))?;
        let killed = set.remove(at);
        let started = Instant::now();
        killed.kill().await?;
        let new_owner = until("another owner of prod", async || {
            Ok(owner_of(&set[0], "prod").await?.filter(|o| *o != owner))
        })
        .await?;
        let took = started.elapsed();
        // A request through the replica that is not the new owner, if there is one.
        let asker = set.iter().find(|h| address(h) != new_owner).unwrap_or(&set[0]);
        until("a request for prod answered", async || {
            let (status, _): (_, Value) = asker.get("/api/v1/environments/prod/intents").await?;
            Ok(status.is_success().then_some(()))
        })
        .await?;
        let answered = started.elapsed();
        println!(
            "run {run}: prod held by {new_owner} after {} ms; a relayed request answered after {} ms",
            took.as_millis(),
            answered.as_millis()
        );
        takeovers.push(took);
        answers.push(answered);
        set.push(Host::spawn_replica(&bin, &data_dir()?, &db.url, &token).await?);
    }
    summary("takeover after SIGKILL", takeovers);
    summary("first answer after SIGKILL", answers);

    // What relaying costs: the same read asked of the owner (the floor) and of another
    // replica, alternating in rounds so that drift hits both.
    let owner = until("an owner of prod", async || owner_of(&set[0], "prod").await).await?;
    let direct = set
        .iter()
        .find(|h| address(h) == owner)
        .context("the owner is one of the replicas")?;
    let relayed = set.iter().find(|h| address(h) != owner).context("another replica")?;
    let (mut floor, mut through) = (Duration::ZERO, Duration::ZERO);
    const ROUNDS: u32 = 10;
    const PER_ROUND: u32 = 50;
    for _ in 0..ROUNDS {
        for (host, total) in [(direct, &mut floor), (relayed, &mut through)] {
            let started = Instant::now();
            for _ in 0..PER_ROUND {
                let (status, body) = host.get("/api/v1/environments/prod/intents").await?;
                anyhow::ensure!(status.is_success(), "GET intents: {status} {body}");
            }
            *total += started.elapsed();
        }
    }
    let (floor, through) = (floor / (ROUNDS * PER_ROUND), through / (ROUNDS * PER_ROUND));
    println!(
        "a read asked of the owner: {:.2} ms mean; of another replica (relayed): {:.2} ms mean, {:.1}× the owner's",
        floor.as_secs_f64() * 1000.0,
        through.as_secs_f64() * 1000.0,
        through.as_secs_f64() / floor.as_secs_f64()
    );
    println!("load average at end: {}", serve::load_average());
    for host in set {
        host.stop().await?;
    }
    db.drop().await?;
    Ok(())
}

//! Cluster benchmark: a cluster of the `shell` automator created, amended and deleted through
//! the REST API of a real `orc-host serve` process (spawned from the release build beside this
//! example, SQLite in a temporary data directory) on NODES real OpenSSH `sshd` nodes on loopback
//! ports (default 10), started as root by the test harness and registered through
//! `POST /api/v1/nodes`; the host logs in as the unprivileged test user (shell `/bin/sh`), whose
//! scratch directory the scripts write to.
//!
//! The template has three services — `base` on every node, one `db` (installed after every
//! `base`), `web` on the other nodes (initialized after `db` runs) — each step a one-line script
//! that writes a file on its node. Figures: `POST clusters` → `active` (tasks/s through the
//! scheduler: every task is an automator `check` then `perform`, each one SSH command or two),
//! amend to NODES + 2 nodes → `active`, `DELETE` → gone (stop and remove in reverse order).
//!
//! ```text
//! cargo build --release -p orc-host --bins --examples
//! target/release/examples/cluster-bench [NODES]
//! ```

#[path = "support/serve.rs"]
mod serve;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use orc_tests::sshd::{Sshd, TEST_USER};
use reqwest::StatusCode;
use serde_json::{Value, json};
use serve::Host;

const ENV: &str = "bench";

fn template(root: &Path) -> Value {
    let step = "printf '%s\\n' \"$ORC_ACTION\" >> \"$ROOT/$ORC_NODE-$ORC_SERVICE\"";
    let scripts = json!({
        "bootstrap": step, "install": step, "configure": step, "initialize": step, "start": step,
        "stop": step, "remove": format!("rm -f \"$ROOT/$ORC_NODE-$ORC_SERVICE\""),
    });
    json!({
        "services": {
            "base": {"automator": "shell@0.1.0", "config": {"root": root, "scripts": scripts}},
            "db": {"automator": "shell@0.1.0", "count": {"max": 1}, "requires": {"install": ["base"]},
                   "config": {"root": root, "scripts": scripts}},
            "web": {"automator": "shell@0.1.0", "requires": {"install": ["base"], "runtime": ["db"]},
                    "config": {"root": root, "scripts": scripts}},
        },
        "constraints": {"apart": [["db", "web"]]},
    })
}

async fn register(host: &Host, name: &str, sshd: &Sshd) -> Result<()> {
    let body = json!({
        "name": name, "address": "127.0.0.1", "port": sshd.port, "user": TEST_USER,
        "credential": { "private_key": sshd.client_key }, "host_key_fingerprint": sshd.host_fingerprint,
    });
    let (status, node) = host.post("/api/v1/nodes", serde_json::to_vec(&body)?).await?;
    ensure!(status == StatusCode::CREATED, "registering {name}: {status} {node}");
    Ok(())
}

async fn wait_verified(host: &Host, name: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, node) = host.get(&format!("/api/v1/nodes/{name}")).await?;
        match node.get("status").and_then(Value::as_str) {
            Some("public") => return Ok(()),
            Some("unidentified") => {}
            other => bail!("node {name} is {other:?}: {node}"),
        }
        ensure!(Instant::now() < deadline, "node {name} not verified after 60 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls the cluster until `done` holds; returns it and the time since `started`.
async fn until(host: &Host, name: &str, started: Instant, done: impl Fn(StatusCode, &Value) -> bool) -> Result<(Value, Duration)> {
    let deadline = started + Duration::from_secs(600);
    loop {
        let (status, c) = host.get(&format!("/api/v1/environments/{ENV}/clusters/{name}")).await?;
        if done(status, &c) {
            return Ok((c, started.elapsed()));
        }
        ensure!(c.get("status").and_then(Value::as_str) != Some("failed"), "cluster failed: {c:#}");
        ensure!(Instant::now() < deadline, "cluster {name} not done after 600 s: {c:#}");
        tokio::time::sleep(serve::poll_interval()).await;
    }
}

fn tasks(c: &Value) -> usize {
    c.get("tasks").and_then(Value::as_array).map_or(0, Vec::len)
}

#[tokio::main]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let nodes: usize = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(10);
    ensure!(nodes >= 2, "at least 2 nodes (db and web never share one)");
    let data = tempfile::tempdir()?;
    let host = Host::spawn(&serve::host_binary()?, data.path(), None).await?;
    let total = nodes + 2;
    let sshds: Vec<Sshd> = (0..total).map(|_| Sshd::start()).collect();
    let root = sshds[0].scratch_dir("cluster-bench");
    for (i, sshd) in sshds.iter().enumerate() {
        register(&host, &format!("n{:02}", i + 1), sshd).await?;
    }
    for i in 0..total {
        wait_verified(&host, &format!("n{:02}", i + 1)).await?;
    }
    host.create_environment(
        ENV,
        json!({"repair_interval_s": 0, "retry_interval_s": 60, "per_node_concurrency": 8, "auto_deploy": true}),
    )
    .await?;
    let (status, t) = host
        .post(
            &format!("/api/v1/environments/{ENV}/templates/stack"),
            serde_json::to_vec(&template(&root))?,
        )
        .await?;
    ensure!(status == StatusCode::CREATED, "template: {status} {t}");
    println!("cluster-bench: shell automator, 3 services (base everywhere, one db, web elsewhere), {nodes} sshd nodes on loopback");

    let allowed: Vec<String> = (1..=nodes).map(|i| format!("n{i:02}")).collect();
    let started = Instant::now();
    let body = json!({"name": "c1", "template": "stack", "size": nodes, "nodes": allowed});
    let (status, c) = host
        .post(&format!("/api/v1/environments/{ENV}/clusters"), serde_json::to_vec(&body)?)
        .await?;
    ensure!(status == StatusCode::ACCEPTED, "create: {status} {c}");
    let answered = started.elapsed();
    let (c, took) = until(&host, "c1", started, |_, c| c["status"] == "active").await?;
    let n = tasks(&c);
    println!(
        "  create {nodes} nodes: POST → active {:.3} s, {n} tasks ({:.0} tasks/s); solved, planned and released in {:.0} ms (the POST's answer)",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        answered.as_secs_f64() * 1e3,
    );

    if std::env::var_os("ORC_BENCH_ACTIONS").is_some() {
        let (_, page) = host.get(&format!("/api/v1/environments/{ENV}/actions?limit=10000")).await?;
        let mut items: Vec<Value> = page["items"].as_array().cloned().unwrap_or_default();
        items.sort_by_key(|a| a["started_at"].as_i64());
        let t0 = items.first().and_then(|a| a["started_at"].as_i64()).unwrap_or(0);
        for a in items {
            println!(
                "    {:>6} {:>6} {} {}",
                a["started_at"].as_i64().unwrap_or(0) - t0,
                a["finished_at"].as_i64().unwrap_or(0) - a["started_at"].as_i64().unwrap_or(0),
                a["resource"].as_str().unwrap_or(""),
                a["outcome"]
            );
        }
    }
    let started = Instant::now();
    let body = json!({"size": total, "nodes": []});
    let (status, a) = host
        .post(&format!("/api/v1/environments/{ENV}/clusters/c1/amend"), serde_json::to_vec(&body)?)
        .await?;
    ensure!(status == StatusCode::ACCEPTED, "amend: {status} {a}");
    let (c, took) = until(&host, "c1", started, |_, c| c["status"] == "active").await?;
    println!(
        "  amend {nodes} → {total} nodes: POST → active {:.3} s ({} tasks in the plan; the new nodes' and every configure/start run)",
        took.as_secs_f64(),
        tasks(&c),
    );

    let started = Instant::now();
    let (status, d) = host.delete(&format!("/api/v1/environments/{ENV}/clusters/c1")).await?;
    ensure!(status == StatusCode::ACCEPTED, "delete: {status} {d}");
    let (_, took) = until(&host, "c1", started, |status, _| status == StatusCode::NOT_FOUND).await?;
    println!(
        "  delete {total} nodes: DELETE → gone {:.3} s (every service stopped and removed, in reverse order)",
        took.as_secs_f64()
    );
    let left = std::fs::read_dir(&root)?.count();
    ensure!(left == 0, "{left} files left behind after delete");
    host.stop().await?;
    drop(sshds);
    Ok(())
}

//! Services benchmark: PROCESSES processes of two trivial `shell` services (half servers
//! providing `echo`, half clients requiring it, each client connected to two servers: as many
//! connections as processes) across NODES real OpenSSH `sshd` nodes on loopback (default 200 and
//! 4), through the REST API of a real `orc-host serve` process (the release build beside this
//! example, SQLite in a temporary data directory).
//!
//! Phases, each from its first request until every process is `running`, nothing is pending and
//! nothing waits for the process releaser (`processes_release_pending`: the clean-up version of
//! the phase's finished operations is the phase's):
//! **create** (every process, then every connection), **update** (every process's configuration),
//! **move** (every process to the next node: started there, then stopped and removed on the old
//! one; clients told their servers' new nodes). Each step of a process is one shell line over
//! SSH. Figures per phase: wall time, and the host's CPU time per process (what the host spends
//! besides waiting on SSH: requests, planning, pinning, versions, scheduling, the SSH client). The
//! clients' files are checked after each phase: each names its servers' current nodes.
//!
//! ```text
//! cargo build --release -p orc-host --bins --examples
//! target/release/examples/service-bench [PROCESSES] [NODES]
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

/// A `shell` service: every step appends to `$ROOT/$ORC_NODE.$ORC_CLUSTER`; a client's start
/// writes its peers' nodes, sorted, to `$ROOT/$ORC_NODE.$ORC_CLUSTER.peers`. The nodes are sshd
/// servers of one machine: the node in the name keeps each node's files its own, as on machines
/// of their own (a move's `remove` on the old node deletes the old node's).
fn service(name: &str, role: &str, root: &Path) -> Value {
    let step = "printf '%s\\n' \"$ORC_ACTION\" >> \"$ROOT/$ORC_NODE.$ORC_CLUSTER\"";
    let start = if role == "requires" {
        format!(
            "{step} && printf '%s' \"$PEERS\" | grep -o '\"node\":\"[^\"]*\"' | sort | tr '\\n' ' ' > \"$ROOT/$ORC_NODE.$ORC_CLUSTER.peers\""
        )
    } else {
        step.to_string()
    };
    let mut interface = json!({"name": "echo", "role": role, "allow_multiple": true,
        "versions": [{"version": "1.0.0", "schema": {"type": "object", "title": "echo"}}]});
    if role == "provides" {
        interface["port"] = json!("echo");
    } else {
        interface["max_connections"] = json!(2);
    }
    json!({
        "name": name, "version": "1.0.0",
        "automator": orc_plugin_artifacts::SHELL.digest,
        "config": {"root": root, "scripts": {
            "bootstrap": step, "install": step, "configure": step, "initialize": step, "start": start,
            "stop": step, "remove": "rm -f \"$ROOT/$ORC_NODE.$ORC_CLUSTER\" \"$ROOT/$ORC_NODE.$ORC_CLUSTER.peers\""}},
        "config_schema": {"type": "object"},
        "ports": [{"name": "echo", "port": 7}],
        "connections_key": "peers",
        "interfaces": [interface]
    })
}

async fn register(host: &Host, name: &str, sshd: &Sshd) -> Result<()> {
    let body = json!({
        "name": name, "address": "127.0.0.1", "port": sshd.port, "user": TEST_USER,
        "credential": { "private_key": sshd.client_key }, "host_key_fingerprint": sshd.host_fingerprint,
    });
    let (status, node) = host.post("/api/v1/nodes", serde_json::to_vec(&body)?).await?;
    ensure!(status == StatusCode::CREATED, "registering {name}: {status} {node}");
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

/// Polls until every resource of `env` is deployed, every process is `running` with nothing
/// pending and no change to the processes waits for the releaser; the processes.
async fn settled(host: &Host, env: &str, started: Instant) -> Result<Vec<Value>> {
    let deadline = started + Duration::from_secs(1200);
    loop {
        // Cheap questions first (the environment's counts): no task busy, no process whose
        // operation is under way (or failed); then nothing pending; the whole list once it has
        // settled.
        let (status, summary) = host.get(&format!("/api/v1/environments/{env}")).await?;
        ensure!(status == StatusCode::OK, "GET environment {env}: {status} {summary}");
        let counts = |key: &str| -> Vec<(String, u64)> {
            summary[key]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                .collect()
        };
        let (tasks, processes) = (counts("resources"), counts("processes"));
        let busy: u64 = tasks.iter().filter(|(k, _)| k.as_str() != "deployed").map(|(_, v)| v).sum();
        ensure!(!tasks.iter().any(|(k, _)| k == "failed"), "tasks failed: {tasks:?}");
        ensure!(!processes.iter().any(|(k, _)| k == "failed"), "a process failed: {processes:?}");
        // Nothing waits for the releaser either: a phase ends with the versions it made, the
        // clean-up of its finished operations included.
        let releasing = summary["processes_release_pending"] != Value::Bool(false);
        if busy == 0 && !releasing && processes.iter().all(|(k, _)| k == "running") {
            let (status, pending) = host.get(&format!("/api/v1/environments/{env}/pending")).await?;
            ensure!(status == StatusCode::OK, "{status} {pending}");
            if pending["items"].as_array().is_some_and(Vec::is_empty) {
                let (status, list) = host.get(&format!("/api/v1/environments/{env}/processes")).await?;
                ensure!(status == StatusCode::OK, "{status} {list}");
                let items = list["items"].as_array().cloned().unwrap_or_default();
                if items
                    .iter()
                    .all(|p| p["state"] == "running" && p["pending"].as_array().is_some_and(Vec::is_empty))
                {
                    return Ok(items);
                }
            }
        }
        ensure!(Instant::now() < deadline, "not settled after 1200 s: {summary}");
        tokio::time::sleep(serve::poll_interval().max(Duration::from_millis(100))).await;
    }
}

/// Every client's file on its node names its two servers' current nodes, and no other node keeps
/// one.
fn check_clients(root: &Path, processes: &[Value], clients: usize) -> Result<()> {
    let node_of = |name: &str| -> Result<String> {
        processes
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["node"].as_str().map(str::to_string))
            .ok_or_else(|| anyhow::anyhow!("no process {name}"))
    };
    for c in 0..clients {
        let mut want = vec![
            format!("\"node\":\"{}\"", node_of(&format!("s{c:04}"))?),
            format!("\"node\":\"{}\"", node_of(&format!("s{:04}", (c + 1) % clients))?),
        ];
        want.sort();
        let client = format!("c{c:04}");
        let path = root.join(format!("{}.process.{client}.peers", node_of(&client)?));
        let got = std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let mut got: Vec<String> = got.split_whitespace().map(str::to_string).collect();
        got.sort();
        ensure!(got == want, "client c{c:04} knows {got:?}, its servers are on {want:?}");
        // The nodes it left removed what it had there.
        for p in processes {
            let node = p["node"].as_str().unwrap_or_default();
            let left = root.join(format!("{node}.process.{client}.peers"));
            ensure!(
                left == path || !left.exists(),
                "{} is left after client {client} moved",
                left.display()
            );
        }
    }
    Ok(())
}

/// Before the timed phases, one process of each service in an environment of its own, until
/// running, then the environment deleted: the `shell` automator's one-time compilation (a fresh
/// data directory has no compiled copy yet; ~0.2 s of CPU) is not counted as the processes'.
async fn warm_up(host: &Host, settings: Value) -> Result<()> {
    const WARM: &str = "warm-up";
    host.create_environment(WARM, settings).await?;
    for (name, service, port) in [("ws", "echo-server@1.0.0", 9_000), ("wc", "echo-client@1.0.0", 9_001)] {
        let body = json!({"name": name, "service": service, "node": "n1", "ports": {"echo": port}, "config": {"generation": 0}});
        let (status, p) = host
            .post(&format!("/api/v1/environments/{WARM}/processes"), serde_json::to_vec(&body)?)
            .await?;
        ensure!(status == StatusCode::ACCEPTED, "warm-up {name}: {status} {p}");
    }
    settled(host, WARM, Instant::now()).await?;
    let (status, body) = host.delete(&format!("/api/v1/environments/{WARM}")).await?;
    ensure!(status.is_success(), "deleting the warm-up environment: {status} {body}");
    Ok(())
}

/// The environment's latest version number.
async fn latest_version(host: &Host) -> Result<i64> {
    let (status, env) = host.get(&format!("/api/v1/environments/{ENV}")).await?;
    ensure!(status == StatusCode::OK, "{status} {env}");
    Ok(env["latest_version"].as_i64().unwrap_or(0))
}

/// With `ORC_BENCH_MARKS` set, the wall-clock time of a phase's start or end on stderr (to cut a
/// profile taken with `perf record -k CLOCK_REALTIME` by phase).
fn mark(phase: &str, what: &str) {
    if std::env::var_os("ORC_BENCH_MARKS").is_some() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        eprintln!("mark {phase} {what} {:.6}", now.as_secs_f64());
    }
}

/// With `ORC_BENCH_ACTIONS` set, the phase's actions on stderr, counted by kind, step and
/// outcome (the versions after `since`).
async fn tally_actions(host: &Host, phase: &str, since: i64) -> Result<()> {
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    let mut before: Option<i64> = None;
    loop {
        let page = before.map(|b| format!("&before={b}")).unwrap_or_default();
        let (status, list) = host.get(&format!("/api/v1/environments/{ENV}/actions?limit=10000{page}")).await?;
        ensure!(status == StatusCode::OK, "{status} {list}");
        for a in list["items"].as_array().into_iter().flatten() {
            if a["version"].as_i64().unwrap_or(0) <= since {
                continue;
            }
            let step = a["resource_id"]
                .as_str()
                .unwrap_or("?")
                .rsplit(['/', ':', '.'])
                .next()
                .unwrap_or("?")
                .to_string();
            *tally.entry(format!("{} {step} {}", a["kind"], a["outcome"])).or_default() += 1;
        }
        match list["next_before"].as_i64() {
            Some(next) => before = Some(next),
            None => break,
        }
    }
    eprintln!("actions {phase}: {tally:?}");
    Ok(())
}

/// Runs one phase: `requests` sent in turn, then waits until settled; prints and returns.
async fn phase(host: &Host, name: &str, count: usize, requests: impl AsyncFnOnce() -> Result<()>) -> Result<Vec<Value>> {
    let versions_before = latest_version(host).await?;
    let cpu = host.cpu()?;
    let started = Instant::now();
    mark(name, "start");
    requests().await?;
    let answered = started.elapsed();
    let processes = settled(host, ENV, started).await?;
    let took = started.elapsed();
    let host_cpu = host.cpu()? - cpu;
    mark(name, "end");
    let versions = latest_version(host).await? - versions_before;
    if std::env::var_os("ORC_BENCH_ACTIONS").is_some() {
        tally_actions(host, name, versions_before).await?;
    }
    println!(
        "  {name:<7} {:>7.3} s wall ({:.3} s answering the requests), host CPU {:>6.2} ms per process, {versions} intent versions",
        took.as_secs_f64(),
        answered.as_secs_f64(),
        host_cpu.as_secs_f64() * 1e3 / count as f64,
    );
    Ok(processes)
}

#[tokio::main]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let count: usize = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(200);
    let nodes: usize = std::env::args().nth(2).map(|a| a.parse()).transpose()?.unwrap_or(4);
    ensure!(count >= 4 && count.is_multiple_of(2), "an even number of processes, at least 4");
    ensure!(nodes >= 2, "at least 2 nodes (processes move to the next one)");
    let clients = count / 2;
    let data = tempfile::tempdir()?;
    let host = Host::spawn(&serve::host_binary()?, data.path(), None).await?;
    let sshds: Vec<Sshd> = (0..nodes).map(|_| Sshd::start()).collect();
    let root = sshds[0].scratch_dir("service-bench");
    for (i, sshd) in sshds.iter().enumerate() {
        register(&host, &format!("n{}", i + 1), sshd).await?;
    }
    let settings = json!({"repair_interval_s": 0, "retry_interval_s": 60, "per_node_concurrency": 8, "auto_deploy": true,
               "capabilities": {"node_commands": true}, "limits": {"versions_per_hour": 100000}});
    host.create_environment(ENV, settings.clone()).await?;
    host.publish_service(&service("echo-server", "provides", &root)).await?;
    host.publish_service(&service("echo-client", "requires", &root)).await?;
    warm_up(&host, settings).await?;
    println!(
        "service-bench: {count} processes ({clients} servers, {clients} clients) of two `shell` services, {count} connections, {nodes} sshd nodes on loopback"
    );
    let node_of = |i: usize, shift: usize| format!("n{}", (i + shift) % nodes + 1);
    let processes_path = format!("/api/v1/environments/{ENV}/processes");

    let processes = phase(&host, "create", count, async || {
        for i in 0..clients {
            for (name, service) in [(format!("s{i:04}"), "echo-server@1.0.0"), (format!("c{i:04}"), "echo-client@1.0.0")] {
                let shift = usize::from(name.starts_with('c'));
                // Each its own port: two processes never listen on one port of a node.
                let port = 10_000 + 2 * i + shift;
                let body = json!({"name": name, "service": service, "node": node_of(i, shift), "ports": {"echo": port},
                    "config": {"generation": 1}});
                let (status, p) = host.post(&processes_path, serde_json::to_vec(&body)?).await?;
                ensure!(status == StatusCode::ACCEPTED, "create {name}: {status} {p}");
            }
        }
        for c in 0..clients {
            for s in [c, (c + 1) % clients] {
                let body = json!({"from": {"process": format!("c{c:04}"), "interface": "echo"},
                    "to": {"process": format!("s{s:04}"), "interface": "echo"}});
                let (status, answer) = host
                    .post(&format!("/api/v1/environments/{ENV}/connections"), serde_json::to_vec(&body)?)
                    .await?;
                ensure!(status == StatusCode::CREATED, "connect c{c:04} → s{s:04}: {status} {answer}");
            }
        }
        Ok(())
    })
    .await?;
    check_clients(&root, &processes, clients)?;

    let processes = phase(&host, "update", count, async || {
        for p in &processes {
            let name = p["name"].as_str().unwrap_or_default();
            let body = json!({"config": {"generation": 2}});
            let (status, answer) = host.patch(&format!("{processes_path}/{name}"), serde_json::to_vec(&body)?).await?;
            ensure!(status == StatusCode::ACCEPTED, "update {name}: {status} {answer}");
        }
        Ok(())
    })
    .await?;
    check_clients(&root, &processes, clients)?;

    let processes = phase(&host, "move", count, async || {
        for (i, p) in processes.iter().enumerate() {
            let name = p["name"].as_str().unwrap_or_default();
            let from = p["node"].as_str().unwrap_or_default();
            let to = format!("n{}", from.trim_start_matches('n').parse::<usize>().unwrap_or(i) % nodes + 1);
            let body = json!({"node": to});
            let (status, answer) = host
                .post(&format!("{processes_path}/{name}/move"), serde_json::to_vec(&body)?)
                .await?;
            ensure!(status == StatusCode::ACCEPTED, "move {name}: {status} {answer}");
        }
        Ok(())
    })
    .await?;
    check_clients(&root, &processes, clients)?;
    host.stop().await?;
    drop(sshds);
    Ok(())
}

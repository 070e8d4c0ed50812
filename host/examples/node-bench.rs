//! Device benchmark: `file` resources on real SSH nodes, measured through the REST API of a real
//! `orc-host serve` process (spawned from the release build beside this example, SQLite in a
//! temporary data directory). The nodes are real OpenSSH `sshd` servers on loopback ports, started
//! by the test harness (as root; the host logs in as the unprivileged test user, whose shell is
//! `/bin/sh`, into a scratch directory it owns), registered through `POST /api/v1/nodes` with
//! their host keys pinned.
//!
//! - untimed first, one file on the first node: the server compiles the `file` adaptor at its
//!   first use (once per server), which the cases below do not measure;
//! - one node, FILES files (default 1,000): intent `POST` → all deployed (first deploy; then,
//!   untimed, every file checked on disk: content, mode, owner), user repair with nothing to
//!   change → its operation done, dryrun → its report done with nothing to change;
//! - NODES nodes × PER_NODE files (default 10 × 100), one intent over all of them: the same three
//!   figures, the nodes served in parallel.
//!
//! ```text
//! cargo build --release -p orc-host --bins --examples
//! target/release/examples/node-bench [FILES] [--nodes N] [--per-node M] [--node-concurrency C] [--keep-sshd]
//! ```
//!
//! `--node-concurrency`: the environments' `per_node_concurrency` (actions in flight per node,
//! default 64). `--keep-sshd`: afterwards, keep the first sshd running and print how to reach it
//! (for `tests/compare/run.sh`, which times Ansible and pyinfra on the same files) until Ctrl-C.
//! `ORC_HOST_BIN` overrides the server binary; `ORC_BENCH_POLL_MS` the pause between two polls.

#[path = "support/serve.rs"]
mod serve;

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use orc_tests::sshd::{Sshd, TEST_USER};
use reqwest::StatusCode;
use serde_json::{Value, json};
use serve::Host;

/// The content of file `i`: what Ansible and pyinfra write too (`tests/compare`).
fn content(i: usize) -> String {
    format!("orc bench file {i}\n")
}

/// Where file `i` goes in `dir`.
fn file_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("f{i:05}.conf"))
}

/// `files` `file` resources per node, each `(node name, scratch directory)`.
fn intent(nodes: &[(String, PathBuf)], files: usize) -> Vec<u8> {
    let resources: Vec<Value> = nodes
        .iter()
        .flat_map(|(node, dir)| {
            (0..files).map(move |i| {
                json!({
                    "id": format!("file[{node},{}]", file_path(dir, i).display()),
                    "adaptor": "file@0.1.0",
                    "attributes": { "content": content(i), "mode": "0644" },
                })
            })
        })
        .collect();
    serde_json::to_vec(&json!({ "resources": resources })).expect("JSON")
}

/// Registers `sshd` as node `name` (key login as the test user, host key pinned) and waits until
/// the host has verified it.
async fn register(host: &Host, name: &str, sshd: &Sshd) -> Result<()> {
    let body = json!({
        "name": name,
        "address": "127.0.0.1",
        "port": sshd.port,
        "user": TEST_USER,
        "credential": { "private_key": sshd.client_key },
        "host_key_fingerprint": sshd.host_fingerprint,
    });
    let (status, node) = host.post("/api/v1/nodes", serde_json::to_vec(&body)?).await?;
    ensure!(status == StatusCode::CREATED, "registering {name}: {status} {node}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, node) = host.get(&format!("/api/v1/nodes/{name}")).await?;
        ensure!(status == StatusCode::OK, "GET node {name}: {status} {node}");
        match node.get("status").and_then(Value::as_str) {
            Some("public") => return Ok(()),
            Some("unidentified") => {}
            other => bail!("node {name} is {other:?}: {node}"),
        }
        ensure!(Instant::now() < deadline, "node {name} not verified after 60 s: {node}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every file is on disk with its content, mode 0644, owned by the test user.
fn check_on_disk(nodes: &[(String, PathBuf)], files: usize) -> Result<()> {
    let uid = std::process::Command::new("id").args(["-u", TEST_USER]).output()?;
    let uid: u32 = String::from_utf8_lossy(&uid.stdout).trim().parse()?;
    for (node, dir) in nodes {
        for i in 0..files {
            let path = file_path(dir, i);
            let text = std::fs::read_to_string(&path).with_context(|| format!("{node}: {}", path.display()))?;
            ensure!(text == content(i), "{node}: {} holds {text:?}", path.display());
            let meta = std::fs::metadata(&path)?;
            ensure!(
                meta.mode() & 0o7777 == 0o644,
                "{node}: {} has mode {:o}",
                path.display(),
                meta.mode()
            );
            ensure!(meta.uid() == uid, "{node}: {} belongs to uid {}", path.display(), meta.uid());
        }
    }
    Ok(())
}

/// The settings of every environment the benchmark makes.
fn case_settings(node_concurrency: u32) -> Value {
    json!({
        "per_node_concurrency": node_concurrency,
        "env_concurrency": 256, // the default
        // No self-healing timers: only what the benchmark asks for runs.
        "repair_interval_s": 0,
        "retry_interval_s": 60,
        "auto_deploy": true,
    })
}

/// One environment over `nodes`: first deploy, on-disk check, repair, dryrun.
async fn run_case(host: &Host, env: &str, nodes: &[(String, PathBuf)], files: usize, node_concurrency: u32) -> Result<()> {
    host.create_environment(env, case_settings(node_concurrency)).await?;
    let n = nodes.len() * files;
    let rate = |d: Duration| n as f64 / d.as_secs_f64();

    let since = serve::now_ms();
    let deployed = serve::deploy(host, env, intent(nodes, files), n).await?;
    println!(
        "  POST intent → all {n} deployed (first deploy): {:.3} s ({:.0} resources/s); the POST answered 201 after {:.3} s",
        deployed.elapsed.as_secs_f64(),
        rate(deployed.elapsed),
        deployed.answered.as_secs_f64(),
    );
    println!("    {}", serve::action_profile(host, env, since).await?);
    check_on_disk(nodes, files)?;
    println!("  checked on disk: {n} files with their content, mode 0644, owned by {TEST_USER}");

    let since = serve::now_ms();
    let (repair, actions) = serve::repair(host, env, n).await?;
    println!(
        "  POST repair (nothing to change) → operation done: {:.3} s ({:.0} resources/s; actions {actions})",
        repair.as_secs_f64(),
        rate(repair),
    );
    println!("    {}", serve::action_profile(host, env, since).await?);

    let (dryrun, summary) = serve::dryrun(host, env, n).await?;
    println!(
        "  POST dryrun → report done: {:.3} s ({:.0} resources/s; {summary})",
        dryrun.as_secs_f64(),
        rate(dryrun),
    );
    Ok(())
}

struct Args {
    files: usize,
    nodes: usize,
    per_node: usize,
    node_concurrency: u32,
    keep_sshd: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        files: 1000,
        nodes: 10,
        per_node: 100,
        node_concurrency: 64,
        keep_sshd: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| -> Result<usize> {
            let v = it.next().ok_or_else(|| anyhow!("{flag} needs a number"))?;
            v.parse().with_context(|| format!("{flag} `{v}` is not a number"))
        };
        match arg.as_str() {
            "--nodes" => args.nodes = value("--nodes")?,
            "--per-node" => args.per_node = value("--per-node")?,
            "--node-concurrency" => args.node_concurrency = u32::try_from(value("--node-concurrency")?)?,
            "--keep-sshd" => args.keep_sshd = true,
            a if !a.starts_with('-') => args.files = a.parse().with_context(|| format!("FILES `{a}` is not a number"))?,
            other => bail!("unknown argument `{other}`"),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<()> {
    // reqwest is built without a default TLS provider (one provider per binary).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = parse_args()?;
    let bin = serve::host_binary()?;
    let data = tempfile::Builder::new().prefix("orc-node-bench-").tempdir()?;
    let sshds: Vec<Sshd> = (0..args.nodes.max(1)).map(|_| Sshd::start()).collect();
    let host = Host::spawn(&bin, data.path(), None).await?;
    println!(
        "orc-host serve (pid {}, SQLite) at {}; {} OpenSSH sshd on 127.0.0.1, login as {TEST_USER} with a key, host keys pinned; \
         {} actions in flight per node",
        host.pid,
        host.base,
        sshds.len(),
        args.node_concurrency,
    );

    let outcome = async {
        let names: Vec<String> = (0..sshds.len()).map(|i| format!("node{i}")).collect();
        let t = Instant::now();
        futures::future::try_join_all(names.iter().zip(&sshds).map(|(name, sshd)| register(&host, name, sshd))).await?;
        println!(
            "registered and verified {} nodes (host key checked, facts gathered): {:.3} s",
            names.len(),
            t.elapsed().as_secs_f64()
        );

        // Untimed: a server compiles a plugin once, at its first use, into its cache (as
        // api-bench does, one file in an environment of its own), so the cases measure the
        // server at work and not that one-time compilation.
        let warm = [(names[0].clone(), sshds[0].scratch_dir("warm-up"))];
        let t = Instant::now();
        host.create_environment("warm-up", case_settings(args.node_concurrency)).await?;
        serve::deploy(&host, "warm-up", intent(&warm, 1), 1).await?;
        println!(
            "warm-up (untimed): the file adaptor compiled at its first use, 1 file deployed: {:.3} s",
            t.elapsed().as_secs_f64()
        );

        println!("{} files on one node:", args.files);
        let one = [(names[0].clone(), sshds[0].scratch_dir("one"))];
        run_case(&host, "one", &one, args.files, args.node_concurrency).await?;

        if args.nodes > 0 {
            println!("{} nodes × {} files, one intent:", args.nodes, args.per_node);
            let fleet: Vec<(String, PathBuf)> = names
                .iter()
                .zip(&sshds)
                .map(|(name, sshd)| (name.clone(), sshd.scratch_dir("fleet")))
                .collect();
            run_case(&host, "fleet", &fleet, args.per_node, args.node_concurrency).await?;
        }
        anyhow::Ok(())
    }
    .await;
    let stopped = host.stop().await;
    outcome.and(stopped)?;

    if args.keep_sshd {
        let sshd = &sshds[0];
        let dir = sshd.scratch_dir("compare");
        println!(
            "\nsshd kept running until Ctrl-C; to time Ansible and pyinfra on the same {} files:\n  \
             tests/compare/run.sh --host 127.0.0.1 --port {} --user {TEST_USER} --key {} --dir {} --files {}",
            args.files,
            sshd.port,
            sshd.dir().join("client_ed25519").display(),
            dir.display(),
            args.files,
        );
        tokio::signal::ctrl_c().await?;
    }
    Ok(())
}

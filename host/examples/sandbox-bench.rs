//! What the local node's sandbox costs per command: COMMANDS runs of `/bin/true` through
//! `LocalNode::run` (confined by bubblewrap, a cgroup of its own, seccomp; stdout and stderr
//! piped and read), one at a time and CONCURRENCY at a time, against the same program started
//! unconfined the same way (`tokio::process`, piped, in a process group of its own). Prints the
//! mean and percentiles of one command's latency and the commands per second.
//!
//! ```text
//! cargo build --release -p orc-host --examples
//! target/release/examples/sandbox-bench [COMMANDS] [--concurrency C]
//! ```
//!
//! Defaults: 500 commands, concurrency 8. Runs as root (the sandbox's cgroups), on an idle machine.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use orc_node::{CommandLimits, LocalNode, NodeBackend, NodeCommand, Sandbox};
use tokio::io::AsyncReadExt as _;

struct Args {
    commands: usize,
    concurrency: usize,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        commands: 500,
        concurrency: 8,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--concurrency" => {
                let v = it.next().context("--concurrency needs a value")?;
                args.concurrency = v.parse().with_context(|| format!("--concurrency `{v}` is not a number"))?;
            }
            a if !a.starts_with('-') => args.commands = a.parse().with_context(|| format!("COMMANDS `{a}` is not a number"))?,
            a => bail!("unknown argument `{a}`"),
        }
    }
    ensure!(
        args.commands > 0 && args.concurrency > 0,
        "COMMANDS and --concurrency must be at least 1"
    );
    Ok(args)
}

/// `/bin/true` unconfined, as the local node ran commands before the sandbox.
async fn unconfined(root: &std::path::Path) -> Result<()> {
    let mut child = tokio::process::Command::new("/bin/true")
        .current_dir(root)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0)
        .spawn()?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    child.stdout.take().expect("piped").read_to_end(&mut out).await?;
    child.stderr.take().expect("piped").read_to_end(&mut err).await?;
    ensure!(child.wait().await?.success(), "/bin/true failed");
    Ok(())
}

async fn confined(node: &LocalNode) -> Result<()> {
    let out = node
        .run(NodeCommand {
            argv: vec!["/bin/true".into()],
            limits: CommandLimits::default(),
            ..NodeCommand::default()
        })
        .await?;
    ensure!(
        out.exit_code == 0,
        "confined /bin/true exited {}: {}",
        out.exit_code,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Runs `one` `commands` times, `concurrency` at a time: the latencies and the wall time.
async fn measure<F, Fut>(commands: usize, concurrency: usize, one: F) -> Result<(Vec<Duration>, Duration)>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let one = Arc::new(one);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (one, next) = (one.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < commands {
                let t = Instant::now();
                one().await?;
                latencies.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>(latencies)
        }));
    }
    let mut all = Vec::with_capacity(commands);
    for w in workers {
        all.extend(w.await??);
    }
    let wall = started.elapsed();
    all.sort_unstable();
    Ok((all, wall))
}

fn report(what: &str, latencies: &[Duration], wall: Duration) {
    let pick = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    let mean = latencies.iter().sum::<Duration>() / latencies.len() as u32;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "  {what:<12} mean {:6.2} ms  p50 {:6.2} ms  p99 {:6.2} ms  {:7.0} commands/s",
        ms(mean),
        ms(pick(0.5)),
        ms(pick(0.99)),
        latencies.len() as f64 / wall.as_secs_f64()
    );
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    Sandbox::host().await.context("the sandbox")?;
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("root");
    let node = Arc::new(LocalNode::open(&root)?);
    // Warm-up: page cache, the probe's first cgroup.
    for _ in 0..20 {
        confined(&node).await?;
        unconfined(&root).await?;
    }
    for concurrency in [1, args.concurrency] {
        println!("{} commands, {concurrency} at a time:", args.commands);
        let r = root.clone();
        let (lat, wall) = measure(args.commands, concurrency, move || {
            let r = r.clone();
            async move { unconfined(&r).await }
        })
        .await?;
        report("unconfined", &lat, wall);
        let n = node.clone();
        let (lat, wall) = measure(args.commands, concurrency, move || {
            let n = n.clone();
            async move { confined(&n).await }
        })
        .await?;
        report("confined", &lat, wall);
    }
    Ok(())
}

//! Throughput of one SSH connection to a local OpenSSH sshd (started here, as root, like the
//! tests): `write_file` + `stat` of 1,000 small files, sequentially and concurrently, and commands.
//! `cargo run --release -p orc-ssh --example ssh-bench` (`ORC_BENCH_USER=root` logs in as root
//! instead of the test user: then each command also pays for root's login shell, e.g. a
//! `.bashrc` that bash reads under sshd)

use std::time::{Duration, Instant};

use futures::StreamExt;
use orc_node::{NodeBackend, NodeCommand};
use orc_ssh::{Credential, HostKeyPolicy, SshNode, SshOptions, SshTarget};
use orc_tests::sshd;

const FILES: usize = 1000;

fn report(label: &str, ops: usize, elapsed: Duration) {
    println!(
        "{label:<48} {ops:>5} ops  {:>8.1} ms  {:>8.0} ops/s",
        elapsed.as_secs_f64() * 1e3,
        ops as f64 / elapsed.as_secs_f64()
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sshd = sshd::Sshd::start();
    let scratch = sshd.scratch_dir("bench");
    let target = SshTarget {
        address: "127.0.0.1".into(),
        port: sshd.port,
        user: std::env::var("ORC_BENCH_USER").unwrap_or_else(|_| sshd::TEST_USER.into()),
        credential: Credential::PrivateKey {
            pem: sshd.client_key.clone(),
            passphrase: None,
        },
        host_key: HostKeyPolicy::Pinned(sshd.host_fingerprint.clone()),
    };
    let started = Instant::now();
    let (node, _) = SshNode::connect(target, SshOptions::default()).await?;
    println!("connect + key exchange + auth: {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
    let path = |i: usize| format!("{}/f{i}", scratch.display());

    let started = Instant::now();
    for i in 0..FILES {
        node.write_file(&path(i), format!("content {i}\n").into_bytes(), Some(0o644))
            .await?;
        node.stat(&path(i)).await?.expect("written");
    }
    report("sequential write_file + stat", FILES, started.elapsed());

    for in_flight in [16, 64, 256] {
        let started = Instant::now();
        let results: Vec<_> = futures::stream::iter(0..FILES)
            .map(|i| {
                let (node, path) = (&node, path(i));
                async move {
                    node.write_file(&path, format!("again {i}\n").into_bytes(), Some(0o644)).await?;
                    node.stat(&path).await
                }
            })
            .buffer_unordered(in_flight)
            .collect()
            .await;
        for r in results {
            r?.expect("written");
        }
        report(
            &format!("concurrent write_file + stat ({in_flight} in flight)"),
            FILES,
            started.elapsed(),
        );
    }

    let true_cmd = || NodeCommand {
        argv: vec!["true".into()],
        ..Default::default()
    };
    let started = Instant::now();
    for _ in 0..100 {
        node.run(true_cmd()).await?;
    }
    report("sequential run `true`", 100, started.elapsed());
    let started = Instant::now();
    let results = futures::future::join_all((0..200).map(|_| node.run(true_cmd()))).await;
    for r in results {
        r?;
    }
    report("concurrent run `true` (200 queued, 8 channels)", 200, started.elapsed());
    Ok(())
}

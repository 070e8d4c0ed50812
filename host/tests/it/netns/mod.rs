//! Several SSH nodes, each a real OpenSSH `sshd` in its own network namespace with its own
//! address (`network`), registered by those addresses in a real server (`Server` on
//! `127.0.0.1:0`, SQLite in a fresh data directory): `file` resources deployed to every node and
//! found on disk; one node's link taken down → its resources `unavailable` and the node
//! `unreachable` while the other nodes' resources deploy; the link up again → they recover on
//! their own (retries). Needs root (namespaces; sshd switches users). Polls, never sleeps for a
//! fixed time.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use orc_tests::sshd::{Sshd, TEST_USER};
use orc_tests::wait_for;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::host::Host;
use crate::support::network::Network;

/// Nodes in the test, and files per node.
const NODES: usize = 3;
const FILES: usize = 5;

/// What this test adds to the shared harness.
trait NetnsHost {
    async fn statuses(&self, env: &str) -> Vec<(String, String, Value, i64)>;
    async fn wait_statuses(&self, env: &str, what: &str, want: impl Fn(&str) -> &'static str);
}

impl NetnsHost for Host {
    /// Id, status, last error and intent version of every resource of `env`.
    async fn statuses(&self, env: &str) -> Vec<(String, String, Value, i64)> {
        let (code, page) = self.get(&format!("/environments/{env}/resources?limit=1000")).await;
        assert_eq!(code, StatusCode::OK, "{page}");
        page["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|r| {
                (
                    r["resource_id"].as_str().expect("resource_id").to_string(),
                    r["status"].as_str().expect("status").to_string(),
                    r["last_error"].clone(),
                    r["version"].as_i64().expect("version"),
                )
            })
            .collect()
    }

    /// Polls until `want(resource id)` is the status of every resource of `env`.
    async fn wait_statuses(&self, env: &str, what: &str, want: impl Fn(&str) -> &'static str) {
        wait_for(what, Duration::from_secs(90), async || {
            let states = self.statuses(env).await;
            let wrong: Vec<_> = states.iter().filter(|(id, status, ..)| status != want(id)).collect();
            if !states.is_empty() && wrong.is_empty() {
                Ok(())
            } else {
                Err(format!("still {wrong:#?}"))
            }
        })
        .await
    }
}

fn node_name(i: usize) -> String {
    format!("ns{i}")
}

fn file_path(dir: &Path, j: usize) -> PathBuf {
    dir.join(format!("f{j}.conf"))
}

fn content(node: usize, j: usize, version: u32) -> String {
    format!("node {node} file {j} version {version}\n")
}

/// `FILES` files on every node, in version `version` of their content.
fn resources(dirs: &[PathBuf], version: u32) -> Value {
    let resources: Vec<Value> = dirs
        .iter()
        .enumerate()
        .flat_map(|(i, dir)| {
            (0..FILES).map(move |j| {
                json!({
                    "id": format!("file[{},{}]", node_name(i), file_path(dir, j).display()),
                    "adaptor": "file@0.1.0",
                    "attributes": { "content": content(i, j, version), "mode": "0640" },
                })
            })
        })
        .collect();
    json!({ "resources": resources })
}

/// The node a resource id `file[nsI,…]` is on.
fn node_of(id: &str) -> usize {
    id.strip_prefix("file[ns")
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected resource id {id}"))
}

/// Every file of node `i` holds version `version` of its content.
fn assert_on_disk(dirs: &[PathBuf], i: usize, version: u32) {
    for j in 0..FILES {
        let path = file_path(&dirs[i], j);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(text, content(i, j, version), "{} on node {i}", path.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_in_network_namespaces_deploy_and_one_cut_off_recovers() {
    let network = Network::create(NODES);
    // Declared after the network: dropped (killed) before their namespaces are removed.
    let sshds: Vec<Sshd> = network
        .namespaces
        .iter()
        .map(|ns| Sshd::start_in_netns(&ns.name, &ns.address))
        .collect();
    let host = Host::start(orc_host::store::Backend::Sqlite).await;

    for (i, sshd) in sshds.iter().enumerate() {
        let body = json!({
            "name": node_name(i),
            "address": sshd.address,
            "port": sshd.port,
            "user": TEST_USER,
            "credential": { "private_key": sshd.client_key },
            "host_key_fingerprint": sshd.host_fingerprint,
        });
        let (status, node) = host.post("/nodes", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{node}");
    }
    for (i, sshd) in sshds.iter().enumerate() {
        let node = host.wait_node_status(&node_name(i), "public").await;
        assert_eq!(node["host_key"], sshd.host_fingerprint.as_str(), "{node}");
        assert_eq!(node["address"], sshd.address.as_str(), "{node}");
    }

    let body = json!({ "name": "fleet", "settings": { "retry_interval_s": 1, "repair_interval_s": 0 } });
    let (status, env) = host.post("/environments", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{env}");
    let dirs: Vec<PathBuf> = sshds.iter().map(|s| s.scratch_dir("fleet")).collect();

    // Every node gets its files.
    let (status, version) = host.post("/environments/fleet/intents", &resources(&dirs, 1)).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    host.wait_statuses("fleet", "all deployed", |_| "deployed").await;
    for i in 0..NODES {
        assert_on_disk(&dirs, i, 1);
    }

    // Node 1 drops off the network; a new version reaches the others only.
    let cut = 1;
    network.set_link(cut, false);
    let down = Instant::now();
    let (status, version) = host.post("/environments/fleet/intents", &resources(&dirs, 2)).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    let v2 = version["version"].as_i64().expect("the version number");
    // Each of its resources is found `unavailable` (never `failed`: the node is away, nothing
    // is wrong with the resource) with an error naming the address the host could not reach;
    // retried meanwhile, a resource may be `deploying` again at any one moment, so each is
    // recorded when first seen unavailable. The other nodes' resources deploy the new version.
    let mut unavailable = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let states = host.statuses("fleet").await;
        let mut others_deployed = true;
        for (id, status, error, version) in &states {
            if node_of(id) == cut && *version == v2 {
                assert!(
                    !["deployed", "failed", "skipped"].contains(&status.as_str()),
                    "{id} is {status}: {error}"
                );
                if status == "unavailable" {
                    assert!(error.to_string().contains(&sshds[cut].address), "{id}: {error}");
                    unavailable.insert(id.clone());
                }
            } else if node_of(id) != cut {
                others_deployed &= status == "deployed" && *version == v2;
            }
        }
        if others_deployed && unavailable.len() == FILES {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {cut} cut off: {} of its resources seen unavailable; now {states:#?}",
            unavailable.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..NODES {
        assert_on_disk(&dirs, i, if i == cut { 1 } else { 2 });
    }
    host.wait_node_status(&node_name(cut), "unreachable").await;
    eprintln!("node {cut} cut off: its resources unavailable after {:?}", down.elapsed());

    // Back on the network: its resources are retried and deployed without anyone's help.
    network.set_link(cut, true);
    let up = Instant::now();
    host.wait_statuses("fleet", "all deployed again", |_| "deployed").await;
    eprintln!("node {cut} back: its resources deployed after {:?}", up.elapsed());
    for i in 0..NODES {
        assert_on_disk(&dirs, i, 2);
    }
    let node = host.wait_node_status(&node_name(cut), "public").await;
    assert!(node["last_error"].is_null(), "{node}");
    host.stop().await;
    drop(sshds);
}

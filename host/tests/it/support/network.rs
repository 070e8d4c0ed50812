//! A private network for the test: a bridge in the host's namespace with the address
//! `10.231.X.1/24`, and per node a network namespace joined to it by a veth pair, the node's end
//! holding `10.231.X.(10+i)/24`. Names carry the test's pid, so parallel runs never collide;
//! within the run, one network exists at a time (the suites of the test binary share its pid,
//! and an interface name has no room for more than the pid). `X` is a third octet no interface
//! uses yet. Everything is removed on drop — namespaces left behind by a killed earlier run
//! (whose pid is gone) are removed at the next creation.

use std::process::Command;
use std::sync::{Mutex, MutexGuard};

/// Prefix of every namespace this test creates: `orcnet-<pid>-<i>`.
const NS_PREFIX: &str = "orcnet-";

pub struct Namespace {
    /// `ip netns` name.
    pub name: String,
    /// The node's own address in the namespace.
    pub address: String,
    /// The host's end of the veth pair (on the bridge).
    host_end: String,
}

pub struct Network {
    bridge: String,
    /// The bridge's address: where the namespaces reach the host.
    pub host_address: String,
    pub namespaces: Vec<Namespace>,
    /// This process's turn to have a network, given back after `drop` removed it (fields drop
    /// after `Drop::drop`).
    _turn: MutexGuard<'static, ()>,
}

/// Whose turn it is to have a network in this process: the names of two would collide.
static TURN: Mutex<()> = Mutex::new(());

/// Runs `ip ARGS`, panicking with its error output (and `why`) if it fails.
fn ip(args: &[&str], why: &str) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `ip` ({e}): the netns test needs iproute2; {why}"));
    assert!(
        out.status.success(),
        "`ip {}` failed: {}; {why}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

fn output(args: &[&str]) -> String {
    Command::new("ip")
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Removes the namespaces of earlier runs whose process is gone (a SIGKILLed test cannot clean
/// up); their veth pairs go with them, their bridges are removed by name.
fn remove_stale() {
    for line in output(&["netns", "list"]).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name.strip_prefix(NS_PREFIX).and_then(|rest| rest.split('-').next()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
            let _ = Command::new("ip").args(["link", "del", &format!("orcb{pid}")]).output();
        }
    }
}

/// A third octet of `10.231.X.0/24` that no address on this machine is in.
fn free_subnet() -> u8 {
    let used = output(&["-4", "-o", "addr", "show"]);
    let start = (std::process::id() % 256) as u8;
    (0..=255u8)
        .map(|k| start.wrapping_add(k))
        .find(|x| !used.contains(&format!(" 10.231.{x}.")))
        .expect("every 10.231.X.0/24 is in use")
}

impl Network {
    /// A bridge and `count` namespaces on it, each reachable from the host at its own address.
    pub fn create(count: usize) -> Network {
        assert!(count < 200, "at most 200 namespaces");
        // A test that failed with its network still up gave its turn back all the same.
        let turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        remove_stale();
        let pid = std::process::id();
        let subnet = free_subnet();
        let mut network = Network {
            bridge: format!("orcb{pid}"),
            host_address: format!("10.231.{subnet}.1"),
            namespaces: Vec::new(),
            _turn: turn,
        };
        let why = "the netns test needs root, `ip netns` and veth/bridge links";
        ip(&["link", "add", &network.bridge, "type", "bridge"], why);
        ip(
            &["addr", "add", &format!("{}/24", network.host_address), "dev", &network.bridge],
            why,
        );
        ip(&["link", "set", &network.bridge, "up"], why);
        for i in 0..count {
            let ns = Namespace {
                name: format!("{NS_PREFIX}{pid}-{i}"),
                address: format!("10.231.{subnet}.{}", 10 + i),
                host_end: format!("orh{pid}x{i}"),
            };
            let node_end = format!("orn{pid}x{i}");
            ip(&["netns", "add", &ns.name], why);
            network.namespaces.push(ns);
            let ns = network.namespaces.last().expect("pushed");
            ip(&["link", "add", &ns.host_end, "type", "veth", "peer", "name", &node_end], why);
            ip(&["link", "set", &node_end, "netns", &ns.name], why);
            ip(&["link", "set", &ns.host_end, "master", &network.bridge], why);
            ip(&["link", "set", &ns.host_end, "up"], why);
            let inside = |args: &[&str]| {
                let mut all = vec!["netns", "exec", &ns.name, "ip"];
                all.extend_from_slice(args);
                ip(&all, why);
            };
            inside(&["addr", "add", &format!("{}/24", ns.address), "dev", &node_end]);
            inside(&["link", "set", &node_end, "up"]);
            inside(&["link", "set", "lo", "up"]);
        }
        network
    }

    /// Sets the link between the host and namespace `i` down (the node drops off the network,
    /// its connections go silent) or up again.
    pub fn set_link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["link", "set", &self.namespaces[i].host_end, state], "setting a link");
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            // Deleting one end of a veth pair deletes both.
            let _ = Command::new("ip").args(["link", "del", &ns.host_end]).output();
            let _ = Command::new("ip").args(["netns", "del", &ns.name]).output();
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
    }
}

//! What several suites share that needs orc-host's types: a real server with a JSON client
//! (`host`), API paths (`paths`), an `SshNode` on a test sshd (`ssh_node`), and a private network
//! of namespaces for sshd nodes (`network`).

pub mod host;
pub mod network;
pub mod paths;
pub mod ssh_node;

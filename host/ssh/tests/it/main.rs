//! orc-ssh against a real OpenSSH sshd started per test (`orc_tests::sshd`).

// An integration test: an unwrap that fails is the test failing, where it failed.
#![allow(clippy::unwrap_used)]

mod commands;
mod connection;
mod files;

use orc_ssh::{Credential, HostKeyPolicy, SshNode, SshOptions, SshTarget};
use orc_tests::sshd::{Sshd, TEST_USER};

/// The target of the test user on `sshd`, with the client key.
pub fn target(sshd: &Sshd, user: &str, host_key: HostKeyPolicy) -> SshTarget {
    SshTarget {
        address: "127.0.0.1".into(),
        port: sshd.port,
        user: user.into(),
        credential: Credential::PrivateKey {
            pem: sshd.client_key.clone(),
            passphrase: None,
        },
        host_key,
    }
}

/// Connects as the test user, pinning the server's host key.
pub async fn connect(sshd: &Sshd) -> SshNode {
    let (node, verified) = SshNode::connect(
        target(sshd, TEST_USER, HostKeyPolicy::Pinned(sshd.host_fingerprint.clone())),
        options(),
    )
    .await
    .unwrap_or_else(|e| panic!("connect: {e}\n{}", sshd.log()));
    assert_eq!(verified.fingerprint, sshd.host_fingerprint);
    node
}

pub fn options() -> SshOptions {
    SshOptions {
        keepalive_interval: Some(std::time::Duration::from_secs(2)),
        ..SshOptions::default()
    }
}

pub fn path(dir: &std::path::Path, name: &str) -> String {
    dir.join(name).to_str().unwrap().to_string()
}

//! An `SshNode` connected to a test `sshd` (`orc_tests::sshd`) as root with its client key, the
//! host key pinned.

use orc_ssh::{Credential, HostKeyPolicy, SshNode, SshOptions, SshTarget};

use orc_tests::sshd::Sshd;

/// Connects to `sshd` as root; panics with the server's log when it cannot.
pub async fn connect_as_root(sshd: &Sshd) -> SshNode {
    let (node, _) = SshNode::connect(
        SshTarget {
            address: "127.0.0.1".into(),
            port: sshd.port,
            user: "root".into(),
            credential: Credential::PrivateKey {
                pem: sshd.client_key.clone(),
                passphrase: None,
            },
            host_key: HostKeyPolicy::Pinned(sshd.host_fingerprint.clone()),
        },
        SshOptions::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("connect: {e}\n{}", sshd.log()));
    node
}

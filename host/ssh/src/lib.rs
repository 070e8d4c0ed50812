//! `orc-ssh`: the SSH transport of the `node` host interface. [`SshNode`] implements
//! `orc_node::NodeBackend` over one authenticated russh connection per node: commands
//! on their own channels (at most [`SshOptions::max_commands`] at once, under OpenSSH's
//! `MaxSessions`), files over one SFTP session on another channel. The connection is re-established
//! on the next call after it is lost, always against the same host key.
//!
//! Architecture invariant: a credential never leaves [`Credential`] except into russh's
//! authentication; its `Debug` is redacted and no error, span or log line carries it.

mod connection;
mod error;
mod exec;
mod facts;
mod node;
pub mod quote;
mod sftp;

use std::fmt;
use std::time::Duration;

use zeroize::Zeroize as _;

pub use error::SshError;
pub use facts::NodeFacts;
pub use node::SshNode;

/// How to authenticate. `Debug` shows the kind only; the secret text is wiped when the
/// credential is dropped (the copies russh makes while authenticating are its own). The serde
/// form (`{"private_key":{"pem":…,"passphrase":…}}` or `{"password":…}`) is what the host seals
/// at rest: a change to it must still read what is sealed.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Credential {
    /// A private key in OpenSSH, PKCS#8 or PEM text, with its passphrase if it is encrypted.
    PrivateKey {
        pem: String,
        passphrase: Option<String>,
    },
    Password(String),
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::PrivateKey { passphrase, .. } => f
                .debug_struct("PrivateKey")
                .field("pem", &"<redacted>")
                .field("passphrase", &passphrase.as_ref().map(|_| "<redacted>"))
                .finish(),
            Credential::Password(_) => f.debug_tuple("Password").field(&"<redacted>").finish(),
        }
    }
}

impl Drop for Credential {
    fn drop(&mut self) {
        match self {
            Credential::PrivateKey { pem, passphrase } => {
                pem.zeroize();
                passphrase.zeroize();
            }
            Credential::Password(p) => p.zeroize(),
        }
    }
}

impl Credential {
    /// Checks that a private key can be used (it decodes, with its passphrase if encrypted)
    /// before it is stored. The message says what is wrong and never contains the key.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Credential::PrivateKey { pem, passphrase } => russh::keys::decode_secret_key(pem, passphrase.as_deref())
                .map(drop)
                .map_err(|e| e.to_string()),
            Credential::Password(p) if p.is_empty() => Err("the password is empty".into()),
            Credential::Password(_) => Ok(()),
        }
    }

    pub(crate) fn method(&self) -> &'static str {
        match self {
            Credential::PrivateKey { .. } => "public key",
            Credential::Password(_) => "password",
        }
    }
}

/// Which host key to accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKeyPolicy {
    /// Only the key with this fingerprint (`SHA256:<base64>`, as `ssh-keygen -lf` prints it).
    Pinned(String),
    /// Whatever the first connection presents; every reconnect must present the same key.
    TrustOnFirstUse,
}

/// A node reached over SSH.
#[derive(Debug, Clone)]
pub struct SshTarget {
    pub address: String,
    pub port: u16,
    pub user: String,
    pub credential: Credential,
    pub host_key: HostKeyPolicy,
}

impl SshTarget {
    /// `address:port` (IPv6 addresses in brackets): how errors and spans name the node.
    pub fn node_name(&self) -> String {
        if self.address.contains(':') {
            format!("[{}]:{}", self.address, self.port)
        } else {
            format!("{}:{}", self.address, self.port)
        }
    }
}

/// Limits and timing of a node's connection.
#[derive(Debug, Clone)]
pub struct SshOptions {
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Key exchange plus authentication.
    pub handshake_timeout: Duration,
    /// A keepalive is sent when nothing was received for this long; `None` disables keepalives.
    pub keepalive_interval: Option<Duration>,
    /// Unanswered keepalives after which the connection counts as dead.
    pub keepalive_max: usize,
    /// Command channels open at once. OpenSSH allows 10 sessions per connection (`MaxSessions`);
    /// the SFTP channel takes one, one more may kill a command's process group past its
    /// timeout, and a closed channel's slot is freed a little late.
    pub max_commands: usize,
    /// SFTP file handles open at once. russh-sftp decodes handles as UTF-8 lossily, so OpenSSH
    /// handle numbers of 128 and above get corrupted: stay under that.
    pub max_open_files: usize,
    /// How long one SFTP request may take. Keep it, plus one reconnect (`connect_timeout`), under
    /// the runtime's deadline for a plugin call (30 s by default): a node that goes silent (its
    /// link down, connections neither answered nor reset) must fail the call as `Unavailable`
    /// (the resource waits as `unavailable`), not let the call time out (`failed`).
    pub sftp_timeout: Duration,
}

impl Default for SshOptions {
    fn default() -> SshOptions {
        SshOptions {
            connect_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(15),
            keepalive_interval: Some(Duration::from_secs(15)),
            keepalive_max: 3,
            max_commands: 8,
            max_open_files: 100,
            sftp_timeout: Duration::from_secs(10),
        }
    }
}

/// What the connection verified: the host key the node presented, to be pinned by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub fingerprint: String,
}

//! One authenticated SSH connection: TCP connect with its own timeout, host-key check against the
//! expected fingerprint, authentication, keepalives, and the lazily opened SFTP session.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client::{self, AuthResult, DisconnectReason, Handle};
use russh::keys::{HashAlg, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use tokio::sync::{OnceCell, Semaphore, watch};
use tracing::Instrument;

use crate::sftp::Sftp;
use crate::{Credential, SshError, SshOptions, SshTarget};

/// The russh event handler of one connection.
struct Client {
    /// The fingerprint to accept; `None` on a first trust-on-first-use connection.
    expected: Option<String>,
    /// What the server presented, for the error message and for trust-on-first-use.
    presented: Arc<Mutex<Option<String>>>,
    /// Set once the connection ends, with the reason.
    gone: watch::Sender<Option<String>>,
}

fn fingerprint(key: &PublicKeyOrCertificate) -> String {
    match key {
        PublicKeyOrCertificate::PublicKey { key, .. } => key.fingerprint(HashAlg::Sha256).to_string(),
        PublicKeyOrCertificate::Certificate(c) => c.public_key().fingerprint(HashAlg::Sha256).to_string(),
    }
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let presented = fingerprint(key);
        let ok = self.expected.as_ref().is_none_or(|want| *want == presented);
        *self.presented.lock().expect("presented") = Some(presented);
        Ok(ok)
    }

    async fn disconnected(&mut self, reason: DisconnectReason<Self::Error>) -> Result<(), Self::Error> {
        let text = match &reason {
            DisconnectReason::ReceivedDisconnect(info) => format!("the server disconnected: {:?}", info.reason_code),
            DisconnectReason::Error(russh::Error::KeepaliveTimeout) => "keepalives went unanswered".to_string(),
            DisconnectReason::Error(e) => e.to_string(),
        };
        tracing::debug!(reason = %text, "ssh connection ended");
        let _ = self.gone.send(Some(text));
        match reason {
            DisconnectReason::ReceivedDisconnect(_) => Ok(()),
            DisconnectReason::Error(e) => Err(e),
        }
    }
}

/// An authenticated connection and what is shared over it.
pub(crate) struct Connection {
    pub node: String,
    handle: Handle<Client>,
    gone: watch::Receiver<Option<String>>,
    /// Command channels open at once.
    pub commands: Semaphore,
    /// Channels killing a command's process group ([`crate::exec`]), one at a time: with the
    /// commands and the SFTP channel, at most `max_commands + 2` sessions.
    pub kills: Semaphore,
    pub max_open_files: usize,
    pub sftp_timeout: Duration,
    sftp: OnceCell<Arc<Sftp>>,
    pub fingerprint: String,
}

impl Connection {
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed() || self.gone.borrow().is_some()
    }

    /// Why the connection is gone, for messages.
    pub fn lost(&self) -> SshError {
        let message = self.gone.borrow().clone().unwrap_or_else(|| "the connection is closed".into());
        SshError::Disconnected {
            node: self.node.clone(),
            message,
        }
    }

    /// Opens a session channel; a refusal because too many are open (`MaxSessions`, a slot freed
    /// late) is retried a few times.
    pub async fn open_channel(&self) -> Result<russh::Channel<client::Msg>, SshError> {
        let mut attempt = 0u32;
        loop {
            match self.handle.channel_open_session().await {
                Ok(ch) => return Ok(ch),
                Err(russh::Error::ChannelOpenFailure(russh::ChannelOpenFailure::ConnectFailed)) if attempt < 5 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                }
                Err(_) if self.is_closed() => return Err(self.lost()),
                Err(e) => {
                    return Err(SshError::Channel {
                        node: self.node.clone(),
                        message: format!("cannot open a channel: {e}"),
                    });
                }
            }
        }
    }

    /// The connection's SFTP session, started on first use.
    pub async fn sftp(&self) -> Result<Arc<Sftp>, SshError> {
        self.sftp
            .get_or_try_init(|| async {
                let channel = self.open_channel().await?;
                channel.request_subsystem(true, "sftp").await.map_err(|e| SshError::Sftp {
                    node: self.node.clone(),
                    message: format!("cannot start the sftp subsystem: {e}"),
                })?;
                Sftp::start(channel, self).await.map(Arc::new)
            })
            .await
            .cloned()
    }

    pub async fn close(&self) {
        let _ = self.handle.disconnect(russh::Disconnect::ByApplication, "", "").await;
    }
}

/// Connects, checks the host key against `expected` (any key when `None`) and authenticates.
pub(crate) async fn connect(target: &SshTarget, options: &SshOptions, expected: Option<String>) -> Result<Connection, SshError> {
    let node = target.node_name();
    let span = tracing::info_span!("ssh.connect", node = %node, user = %target.user);
    async {
        let started = std::time::Instant::now();
        let connect_error = |message: String| SshError::Connect {
            node: node.clone(),
            message,
        };
        let tcp = tokio::time::timeout(
            options.connect_timeout,
            tokio::net::TcpStream::connect((target.address.as_str(), target.port)),
        )
        .await
        .map_err(|_| connect_error(format!("no answer within {:?}", options.connect_timeout)))?
        .map_err(|e| connect_error(e.to_string()))?;
        // connect_stream does not apply Config::nodelay; without it every exec is ~14x slower.
        tcp.set_nodelay(true).map_err(|e| connect_error(e.to_string()))?;

        let config = Arc::new(client::Config {
            nodelay: true,
            keepalive_interval: options.keepalive_interval,
            keepalive_max: options.keepalive_max,
            inactivity_timeout: None,
            ..Default::default()
        });
        let presented = Arc::new(Mutex::new(None));
        let (gone_tx, gone) = watch::channel(None);
        let handler = Client {
            expected: expected.clone(),
            presented: presented.clone(),
            gone: gone_tx,
        };
        let handshake = async {
            let mut handle = client::connect_stream(config, tcp, handler).await.map_err(|e| match e {
                russh::Error::UnknownKey => SshError::HostKeyChanged {
                    node: node.clone(),
                    expected: expected.clone().unwrap_or_default(),
                    presented: presented.lock().expect("presented").clone().unwrap_or_else(|| "nothing".into()),
                },
                e => SshError::Session {
                    node: node.clone(),
                    message: e.to_string(),
                },
            })?;
            authenticate(&mut handle, target, &node).await?;
            Ok::<_, SshError>(handle)
        };
        let handle = tokio::time::timeout(options.handshake_timeout, handshake)
            .await
            .map_err(|_| SshError::TimedOut {
                node: node.clone(),
                what: "key exchange and authentication".into(),
                after: options.handshake_timeout,
            })??;
        let fingerprint = presented.lock().expect("presented").clone().unwrap_or_default();
        tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, %fingerprint, "ssh connected");
        Ok(Connection {
            node: node.clone(),
            handle,
            gone,
            commands: Semaphore::new(options.max_commands.max(1)),
            kills: Semaphore::new(1),
            max_open_files: options.max_open_files.max(1),
            sftp_timeout: options.sftp_timeout,
            sftp: OnceCell::new(),
            fingerprint,
        })
    }
    .instrument(span)
    .await
}

async fn authenticate(handle: &mut Handle<Client>, target: &SshTarget, node: &str) -> Result<(), SshError> {
    let session_error = |e: russh::Error| SshError::Session {
        node: node.to_string(),
        message: format!("during authentication: {e}"),
    };
    let result = match &target.credential {
        Credential::PrivateKey { pem, passphrase } => {
            let key = russh::keys::decode_secret_key(pem, passphrase.as_deref()).map_err(|e| SshError::Key {
                user: target.user.clone(),
                node: node.to_string(),
                message: e.to_string(),
            })?;
            // Only matters for RSA keys: the server says which SHA-2 signatures it takes.
            let hash = handle.best_supported_rsa_hash().await.map_err(session_error)?.flatten();
            handle
                .authenticate_publickey(target.user.clone(), PrivateKeyWithHashAlg::new(Arc::new(key), hash))
                .await
                .map_err(session_error)?
        }
        Credential::Password(password) => handle
            .authenticate_password(target.user.clone(), password.clone())
            .await
            .map_err(session_error)?,
    };
    match result {
        AuthResult::Success => Ok(()),
        AuthResult::Failure { .. } => Err(SshError::Auth {
            user: target.user.clone(),
            node: node.to_string(),
            method: target.credential.method(),
        }),
    }
}

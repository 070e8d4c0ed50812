//! `SecretKey`: the host's key for sealing node credentials at rest (ChaCha20-Poly1305, a random
//! 96-bit nonce per sealing, the node's name as associated data so a sealed credential cannot be
//! moved to another node). The key is 32 random bytes kept as 64 hex characters in a file
//! created with mode 0600 on first start; PostgreSQL replicas are given the same file.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use chacha20poly1305::aead::{Aead, Generate, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use orc_ssh::Credential;
use zeroize::Zeroizing;

use crate::store::{CredentialKind, SealedCredential};

/// The file name of the key inside the data directory, when no other file is configured.
pub const SECRET_KEY_FILE: &str = "secret.key";

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read or create the secret key file {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the secret key file {path} does not hold 64 hexadecimal characters (32 bytes)")]
    Malformed { path: PathBuf },
    #[error("the system's random source failed")]
    Random,
    /// Wrong key (another host's file?) or a tampered row; never says more.
    #[error("the credential of node `{node}` cannot be decrypted with this host's secret key")]
    Open { node: String },
}

/// The host's secret key. `Debug` shows nothing of it.
#[derive(Clone)]
pub struct SecretKey {
    cipher: ChaCha20Poly1305,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(<redacted>)")
    }
}

impl SecretKey {
    /// Reads the key from `path`, or creates it there (mode 0600) when the file does not exist.
    pub fn load_or_create(path: &Path) -> Result<SecretKey, SecretError> {
        let io = |source| SecretError::Io {
            path: path.to_path_buf(),
            source,
        };
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let mode = std::fs::metadata(path).map_err(io)?.permissions().mode();
                if mode & 0o077 != 0 {
                    tracing::warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777), "the secret key file is readable by others than its owner; chmod 600 it");
                }
                let bytes = hex::decode(text.trim()).map_err(|_| SecretError::Malformed { path: path.to_path_buf() })?;
                let key = Key::try_from(bytes.as_slice()).map_err(|_| SecretError::Malformed { path: path.to_path_buf() })?;
                Ok(SecretKey::from_key(&key))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = Key::try_generate().map_err(|_| SecretError::Random)?;
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent).map_err(io)?;
                }
                // Written whole beside it, then linked into place: a replica starting at the same
                // moment reads the whole key or none, never a file half written.
                let partial = path.with_extension(format!("partial-{}", std::process::id()));
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&partial)
                    .map_err(io)?;
                file.write_all(format!("{}\n", hex::encode(key.as_slice())).as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(io)?;
                let created = std::fs::hard_link(&partial, path);
                let _ = std::fs::remove_file(&partial);
                match created {
                    Ok(()) => {
                        tracing::info!(path = %path.display(), "created the host's secret key");
                        Ok(SecretKey::from_key(&key))
                    }
                    // Another replica or process created it meanwhile: use theirs.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => SecretKey::load_or_create(path),
                    Err(e) => Err(io(e)),
                }
            }
            Err(e) => Err(io(e)),
        }
    }

    fn from_key(key: &Key) -> SecretKey {
        SecretKey {
            cipher: ChaCha20Poly1305::new(key),
        }
    }

    fn aad(node: &str) -> Vec<u8> {
        format!("orc node credential\0{node}").into_bytes()
    }

    /// Encrypts `credential` for node `node`.
    pub fn seal(&self, node: &str, credential: &Credential) -> Result<(CredentialKind, SealedCredential), SecretError> {
        let kind = match credential {
            Credential::PrivateKey { .. } => CredentialKind::PrivateKey,
            Credential::Password(_) => CredentialKind::Password,
        };
        // Sealed as its JSON form (so that the kinds can grow), wiped once encrypted.
        let text = Zeroizing::new(serde_json::to_vec(credential).expect("a credential serialises"));
        let nonce = Nonce::try_generate().map_err(|_| SecretError::Random)?;
        let aad = SecretKey::aad(node);
        let ciphertext = self
            .cipher
            .encrypt(&nonce, Payload { msg: &text, aad: &aad })
            .map_err(|_| SecretError::Random)?;
        Ok((
            kind,
            SealedCredential {
                nonce: nonce.to_vec(),
                ciphertext,
            },
        ))
    }

    /// Decrypts the credential sealed for `node`.
    pub fn open(&self, node: &str, sealed: &SealedCredential) -> Result<Credential, SecretError> {
        let fail = || SecretError::Open { node: node.to_string() };
        let nonce = Nonce::try_from(sealed.nonce.as_slice()).map_err(|_| fail())?;
        let aad = SecretKey::aad(node);
        let text = Zeroizing::new(
            self.cipher
                .decrypt(
                    &nonce,
                    Payload {
                        msg: &sealed.ciphertext,
                        aad: &aad,
                    },
                )
                .map_err(|_| fail())?,
        );
        serde_json::from_slice(&text).map_err(|_| fail())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON form sealed since the first release: credentials sealed then still open.
    #[test]
    fn the_sealed_form_is_stable() {
        let forms = [
            (Credential::Password("pw".into()), r#"{"password":"pw"}"#),
            (
                Credential::PrivateKey {
                    pem: "PEM".into(),
                    passphrase: Some("pp".into()),
                },
                r#"{"private_key":{"pem":"PEM","passphrase":"pp"}}"#,
            ),
            (
                Credential::PrivateKey {
                    pem: "PEM".into(),
                    passphrase: None,
                },
                r#"{"private_key":{"pem":"PEM","passphrase":null}}"#,
            ),
        ];
        for (credential, json) in forms {
            assert_eq!(serde_json::to_string(&credential).unwrap(), json);
            let back: Credential = serde_json::from_str(json).unwrap();
            assert_eq!(serde_json::to_string(&back).unwrap(), json);
        }
    }

    #[test]
    fn a_sealed_credential_opens_only_for_its_node_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret.key");
        let key = SecretKey::load_or_create(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let again = SecretKey::load_or_create(&path).unwrap();
        let (kind, sealed) = key.seal("web1", &Credential::Password("hunter2-secret".into())).unwrap();
        assert_eq!(kind, CredentialKind::Password);
        assert!(!sealed.ciphertext.windows(7).any(|w| w == b"hunter2"), "not encrypted");
        match &again.open("web1", &sealed).unwrap() {
            Credential::Password(p) => assert_eq!(p, "hunter2-secret"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(key.open("web2", &sealed), Err(SecretError::Open { .. })));
        let other = SecretKey::load_or_create(&dir.path().join("other.key")).unwrap();
        assert!(matches!(other.open("web1", &sealed), Err(SecretError::Open { .. })));
        let (_, second) = key.seal("web1", &Credential::Password("hunter2-secret".into())).unwrap();
        assert_ne!(second.nonce, sealed.nonce, "a fresh nonce per sealing");
        std::fs::write(&path, "not hex").unwrap();
        assert!(matches!(SecretKey::load_or_create(&path), Err(SecretError::Malformed { .. })));
    }
}

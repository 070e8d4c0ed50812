//! `orc:plugin/kv`: a key/value store private to one plugin in one environment. The host chooses
//! the backend ([`KvStore`]); the scope (`environment/plugin-name`) is set by the runtime, so a
//! plugin can never read another plugin's keys.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::bindings::host::orc::plugin::kv::Host;
use crate::bindings::host::orc::plugin::types::{Error, ErrorKind};
use crate::capability::node::BoxFuture;
use crate::capability::wit_error;
use crate::state::CallState;

/// Longest key a plugin may use, in bytes.
pub const MAX_KEY: usize = 1024;
/// Largest value a plugin may store, in bytes.
pub const MAX_VALUE: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("key/value store: {context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

/// A key/value backend; scopes never mix. Asynchronous, so a backend that waits on a database
/// or the network does not hold a worker thread while it waits.
pub trait KvStore: Send + Sync + 'static {
    fn get<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, KvError>>;
    fn set<'a>(&'a self, scope: &'a str, key: &'a str, value: &'a [u8]) -> BoxFuture<'a, Result<(), KvError>>;
    fn delete<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<bool, KvError>>;
    fn list<'a>(&'a self, scope: &'a str, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, KvError>>;
}

/// A [`KvStore`] over a backend whose calls are short and synchronous (memory, local files).
macro_rules! sync_kv_store {
    ($ty:ty) => {
        impl KvStore for $ty {
            fn get<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, KvError>> {
                Box::pin(std::future::ready(<$ty>::get(self, scope, key)))
            }
            fn set<'a>(&'a self, scope: &'a str, key: &'a str, value: &'a [u8]) -> BoxFuture<'a, Result<(), KvError>> {
                Box::pin(std::future::ready(<$ty>::set(self, scope, key, value)))
            }
            fn delete<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<bool, KvError>> {
                Box::pin(std::future::ready(<$ty>::delete(self, scope, key)))
            }
            fn list<'a>(&'a self, scope: &'a str, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, KvError>> {
                Box::pin(std::future::ready(<$ty>::list(self, scope, prefix)))
            }
        }
    };
}

sync_kv_store!(MemoryKv);
sync_kv_store!(DirKv);

/// Kept in memory: for benchmarks, tests and one-shot runs.
#[derive(Debug, Default)]
pub struct MemoryKv {
    map: Mutex<BTreeMap<(String, String), Vec<u8>>>,
}

impl MemoryKv {
    pub fn get(&self, scope: &str, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        Ok(self.map.lock().expect("kv").get(&(scope.to_string(), key.to_string())).cloned())
    }
    pub fn set(&self, scope: &str, key: &str, value: &[u8]) -> Result<(), KvError> {
        self.map
            .lock()
            .expect("kv")
            .insert((scope.to_string(), key.to_string()), value.to_vec());
        Ok(())
    }
    pub fn delete(&self, scope: &str, key: &str) -> Result<bool, KvError> {
        Ok(self.map.lock().expect("kv").remove(&(scope.to_string(), key.to_string())).is_some())
    }
    pub fn list(&self, scope: &str, prefix: &str) -> Result<Vec<String>, KvError> {
        let map = self.map.lock().expect("kv");
        Ok(map
            .range((scope.to_string(), prefix.to_string())..)
            .take_while(|((s, k), _)| s == scope && k.starts_with(prefix))
            .map(|((_, k), _)| k.clone())
            .collect())
    }
}

/// Persisted in a directory: one file per key, named by the hex of scope and key so no key can
/// name a path; written through a temporary file and a rename. A key whose hex would not fit a
/// file name (over [`LONG_KEY`] bytes) is kept in a file named `~` and the sha256 of the key,
/// whose content starts with the key itself (its length as 4 bytes, little-endian, then the key).
#[derive(Debug)]
pub struct DirKv {
    root: PathBuf,
}

impl DirKv {
    pub fn open(root: impl Into<PathBuf>) -> Result<DirKv, KvError> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(|source| KvError::Io {
            context: format!("cannot create {}", root.display()),
            source,
        })?;
        Ok(DirKv { root })
    }

    fn scope_dir(&self, scope: &str) -> PathBuf {
        self.root.join(hex_name(scope))
    }
}

/// Keys longer than this many bytes are stored under a hashed file name (the hex of a key is
/// twice its length, and a file name holds 255 bytes with room for the temporary prefix).
pub const LONG_KEY: usize = 100;

/// The file name of `key` in its scope's directory.
fn key_file(key: &str) -> String {
    if key.len() <= LONG_KEY {
        hex_name(key)
    } else {
        let digest = orc_manifest::Digest::of(key.as_bytes()).to_string();
        format!("~{}", digest.trim_start_matches("sha256:"))
    }
}

/// The content of a long key's file: the key, then the value.
fn long_key_content(key: &str, value: &[u8]) -> Vec<u8> {
    let mut content = Vec::with_capacity(4 + key.len() + value.len());
    content.extend_from_slice(&(key.len() as u32).to_le_bytes());
    content.extend_from_slice(key.as_bytes());
    content.extend_from_slice(value);
    content
}

/// The key and value of a long key's file, if it is well formed.
fn split_long_key(content: &[u8]) -> Option<(String, &[u8])> {
    let len = u32::from_le_bytes(content.get(..4)?.try_into().ok()?) as usize;
    let key = std::str::from_utf8(content.get(4..4 + len)?).ok()?;
    Some((key.to_string(), &content[4 + len..]))
}

fn hex_name(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    String::from_utf8(bytes?).ok()
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> KvError {
    let context = context.into();
    move |source| KvError::Io { context, source }
}

impl DirKv {
    pub fn get(&self, scope: &str, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        let path = self.scope_dir(scope).join(key_file(key));
        match std::fs::read(&path) {
            Ok(v) if key.len() > LONG_KEY => Ok(split_long_key(&v)
                .filter(|(stored, _)| stored == key)
                .map(|(_, value)| value.to_vec())),
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(format!("cannot read {}", path.display()))(e)),
        }
    }
    pub fn set(&self, scope: &str, key: &str, value: &[u8]) -> Result<(), KvError> {
        let dir = self.scope_dir(scope);
        std::fs::create_dir_all(&dir).map_err(io(format!("cannot create {}", dir.display())))?;
        let name = key_file(key);
        let path = dir.join(&name);
        let tmp = dir.join(format!(".tmp-{}-{name}", std::process::id()));
        let written = if key.len() > LONG_KEY {
            std::fs::write(&tmp, long_key_content(key, value))
        } else {
            std::fs::write(&tmp, value)
        };
        written.map_err(io(format!("cannot write {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(io(format!("cannot rename into {}", path.display())))
    }
    pub fn delete(&self, scope: &str, key: &str) -> Result<bool, KvError> {
        let path = self.scope_dir(scope).join(key_file(key));
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(format!("cannot remove {}", path.display()))(e)),
        }
    }
    pub fn list(&self, scope: &str, prefix: &str) -> Result<Vec<String>, KvError> {
        let dir = self.scope_dir(scope);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(format!("cannot list {}", dir.display()))(e)),
        };
        let mut keys: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name();
                let name = name.to_str()?;
                if name.starts_with('~') {
                    let content = std::fs::read(e.path()).ok()?;
                    split_long_key(&content).map(|(key, _)| key)
                } else {
                    unhex(name)
                }
            })
            .filter(|k| k.starts_with(prefix))
            .collect();
        keys.sort();
        Ok(keys)
    }
}

impl DirKv {
    pub fn root(&self) -> &Path {
        &self.root
    }
}

fn check_key(key: &str) -> Result<(), Error> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(wit_error(
            ErrorKind::InvalidInput,
            format!("kv key must be 1..={MAX_KEY} bytes, got {}", key.len()),
        ));
    }
    Ok(())
}

fn backend_error(e: KvError) -> Error {
    tracing::error!(error = %e, "kv backend failed");
    wit_error(ErrorKind::Retryable, "the host's key/value store failed; see the host log")
}

impl Host for CallState {
    async fn get(&mut self, key: String) -> Result<Option<Vec<u8>>, Error> {
        check_key(&key)?;
        self.ctx.kv.get(&self.kv_scope, &key).await.map_err(backend_error)
    }

    async fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), Error> {
        check_key(&key)?;
        if value.len() > MAX_VALUE {
            return Err(wit_error(
                ErrorKind::InvalidInput,
                format!("kv value for `{key}` is {} bytes; the limit is {MAX_VALUE}", value.len()),
            ));
        }
        self.ctx.kv.set(&self.kv_scope, &key, &value).await.map_err(backend_error)
    }

    async fn delete(&mut self, key: String) -> Result<bool, Error> {
        check_key(&key)?;
        self.ctx.kv.delete(&self.kv_scope, &key).await.map_err(backend_error)
    }

    async fn list_keys(&mut self, prefix: String) -> Result<Vec<String>, Error> {
        self.ctx.kv.list(&self.kv_scope, &prefix).await.map_err(backend_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn exercise(kv: &dyn KvStore) {
        kv.set("env/a", "k1", b"v1").await.unwrap();
        kv.set("env/a", "k2", b"v2").await.unwrap();
        kv.set("env/b", "k1", b"other").await.unwrap();
        assert_eq!(kv.get("env/a", "k1").await.unwrap().unwrap(), b"v1");
        assert_eq!(kv.list("env/a", "k").await.unwrap(), vec!["k1", "k2"]);
        assert_eq!(kv.list("env/b", "").await.unwrap(), vec!["k1"]);
        assert!(kv.delete("env/a", "k1").await.unwrap());
        assert!(!kv.delete("env/a", "k1").await.unwrap());
        assert_eq!(kv.get("env/a", "k1").await.unwrap(), None);
        assert_eq!(kv.get("env/b", "k1").await.unwrap().unwrap(), b"other");
        kv.set("env/a", "../../etc/passwd", b"x").await.unwrap();
        assert_eq!(kv.get("env/a", "../../etc/passwd").await.unwrap().unwrap(), b"x");
        // Every key up to the documented limit works (a file name holds 255 bytes: hex names
        // failed from 127 bytes on).
        for len in [LONG_KEY, LONG_KEY + 1, 127, 128, MAX_KEY] {
            let key = format!("long/{}", "k".repeat(len - 5));
            kv.set("env/a", &key, format!("value {len}").as_bytes()).await.unwrap();
            assert_eq!(kv.get("env/a", &key).await.unwrap().unwrap(), format!("value {len}").as_bytes());
        }
        let long = kv.list("env/a", "long/").await.unwrap();
        assert_eq!(long.len(), 5, "{long:?}");
        let key = format!("long/{}", "k".repeat(MAX_KEY - 5));
        assert!(kv.delete("env/a", &key).await.unwrap());
        assert_eq!(kv.get("env/a", &key).await.unwrap(), None);
    }

    #[tokio::test]
    async fn memory_and_dir_backends_keep_scopes_apart() {
        exercise(&MemoryKv::default()).await;
        let dir = tempfile::tempdir().unwrap();
        let kv = DirKv::open(dir.path().join("kv")).unwrap();
        exercise(&kv).await;
        // Nothing escaped the root.
        assert!(!dir.path().join("etc").exists());
        let reopened = DirKv::open(dir.path().join("kv")).unwrap();
        assert_eq!(reopened.get("env/a", "k2").unwrap().unwrap(), b"v2");
    }
}

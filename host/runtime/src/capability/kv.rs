//! `orc:plugin/kv`: a key/value store private to one plugin in one environment. The host chooses
//! the backend ([`KvStore`]); the scope (`environment/plugin-name`) is set by the runtime, so a
//! plugin can never read another plugin's keys.
//!
//! The plugins of an environment share its quota ([`KvQuota`]: keys, and bytes of keys and
//! values). The runtime keeps each environment's usage ([`KvAccounts`], counted by the backend
//! once, [`KvStore::usage`], then kept current by every write) and checks each write against it
//! ([`set_within`], [`delete_counted`]); an environment's writes take turns for that.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use orc_node::BoxFuture;

use crate::bindings::host::orc::plugin::kv::Host;
use crate::bindings::host::orc::plugin::types::{Error, ErrorKind};
use crate::capability::wit_error;
use crate::state::CallState;

/// Longest key a plugin may use, in bytes.
pub const MAX_KEY: usize = 1024;
/// Largest value a plugin may store, in bytes.
pub const MAX_VALUE: usize = 1 << 20;

/// Default [`KvQuota::max_keys`] of an environment.
pub const DEFAULT_MAX_KEYS: u64 = 20_000;
/// Default [`KvQuota::max_bytes`] of an environment: 32 MiB, what the server's store keeps of one
/// scope in memory (half its cache), so a default environment's state is always answered from
/// there.
pub const DEFAULT_MAX_BYTES: u64 = 32 << 20;

/// How much key/value state the plugins of one environment may keep together: keys, and bytes
/// of keys and values. A write that would take the environment past either is refused
/// ([`KvError::QuotaExceeded`]); one that does not grow what it holds (a smaller value, a delete)
/// always passes, also over a quota lowered below the usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvQuota {
    pub max_keys: u64,
    pub max_bytes: u64,
}

impl Default for KvQuota {
    fn default() -> Self {
        KvQuota {
            max_keys: DEFAULT_MAX_KEYS,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// What an environment's scopes hold: keys, and bytes of keys and values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvUsage {
    pub keys: u64,
    pub bytes: u64,
}

impl KvUsage {
    /// With the entry `key` holding `new` (`None`: absent) instead of `old`, value lengths.
    fn replaced(self, key: &str, old: Option<usize>, new: Option<usize>) -> KvUsage {
        let entry = |len: Option<usize>| len.map_or(0, |len| (key.len() + len) as u64);
        KvUsage {
            keys: self.keys + u64::from(new.is_some()) - u64::from(old.is_some()),
            bytes: self.bytes + entry(new) - entry(old),
        }
    }

    /// Adds an entry (what a backend counts).
    pub fn add(&mut self, key_bytes: u64, value_bytes: u64) {
        self.keys += 1;
        self.bytes += key_bytes + value_bytes;
    }
}

impl std::fmt::Display for KvUsage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} keys, {} bytes", self.keys, self.bytes)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("key/value store: {context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A write that would take the environment past its quota: its message starts with
    /// `quota_exceeded:` (a plugin's error has no code of its own).
    #[error(
        "quota_exceeded: setting `{key}` would take the key/value state of environment `{environment}` to {after} {unit}, past its quota of {limit} {unit}; it holds {usage} (quota: {quota_keys} keys, {quota_bytes} bytes); delete keys or raise the environment's `kv_quota`"
    )]
    QuotaExceeded {
        environment: String,
        /// The key written, cut to 100 characters.
        key: String,
        /// `keys` or `bytes`.
        unit: &'static str,
        limit: u64,
        after: u64,
        usage: KvUsage,
        quota_keys: u64,
        quota_bytes: u64,
    },
}

impl KvQuota {
    /// Refuses `after` if it grows past a limit what `usage` holds.
    fn check(&self, environment: &str, key: &str, usage: KvUsage, after: KvUsage) -> Result<(), KvError> {
        let over = if after.keys > self.max_keys && after.keys > usage.keys {
            Some(("keys", self.max_keys, after.keys))
        } else if after.bytes > self.max_bytes && after.bytes > usage.bytes {
            Some(("bytes", self.max_bytes, after.bytes))
        } else {
            None
        };
        match over {
            None => Ok(()),
            Some((unit, limit, after)) => Err(KvError::QuotaExceeded {
                environment: environment.to_string(),
                key: key.chars().take(100).collect(),
                unit,
                limit,
                after,
                usage,
                quota_keys: self.max_keys,
                quota_bytes: self.max_bytes,
            }),
        }
    }
}

/// Each environment's usage of one store, as the runtime counts it: counted by the backend on
/// an environment's first write ([`KvStore::usage`]), then kept current by every write checked
/// here. An environment's writes take turns (the lock is held from reading the entry's old
/// size to the write), so concurrent writes cannot both pass the last room.
#[derive(Debug, Default)]
pub struct KvAccounts {
    accounts: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<KvUsage>>>>>,
}

impl KvAccounts {
    fn account(&self, environment: &str) -> Arc<tokio::sync::Mutex<Option<KvUsage>>> {
        self.accounts
            .lock()
            .expect("kv accounts")
            .entry(environment.to_string())
            .or_default()
            .clone()
    }

    /// Forgets what was counted of `environment` (its state was deleted): counted again on its
    /// next write.
    pub fn forget(&self, environment: &str) {
        self.accounts.lock().expect("kv accounts").remove(environment);
    }
}

/// Sets `key` in `scope` (one of `environment`'s) to `value`, unless that would take the
/// environment past `quota` ([`KvError::QuotaExceeded`]).
pub async fn set_within(
    store: &dyn KvStore,
    environment: &str,
    quota: KvQuota,
    scope: &str,
    key: &str,
    value: &[u8],
) -> Result<(), KvError> {
    debug_assert!(
        scope.starts_with(&format!("{environment}/")),
        "{scope} is not a scope of {environment}"
    );
    let account = store.accounts().account(environment);
    let mut counted = account.lock().await;
    let usage = match *counted {
        Some(usage) => usage,
        None => *counted.insert(store.usage(environment).await?),
    };
    let old = store.get(scope, key).await?.map(|v| v.len());
    let after = usage.replaced(key, old, Some(value.len()));
    quota.check(environment, key, usage, after)?;
    store.set(scope, key, value).await?;
    *counted = Some(after);
    Ok(())
}

/// Deletes `key` from `scope` (one of `environment`'s), freeing its share of the quota; whether
/// it existed.
pub async fn delete_counted(store: &dyn KvStore, environment: &str, scope: &str, key: &str) -> Result<bool, KvError> {
    let account = store.accounts().account(environment);
    let mut counted = account.lock().await;
    let old = store.get(scope, key).await?.map(|v| v.len());
    let existed = store.delete(scope, key).await?;
    // Not counted yet: counted, with the delete, on the first write.
    if let Some(usage) = *counted {
        *counted = Some(usage.replaced(key, old, None));
    }
    Ok(existed)
}

/// A key/value backend; scopes never mix. Asynchronous, so a backend that waits on a database
/// or the network does not hold a worker thread while it waits. Its `set` and `delete` are not
/// checked against a quota: the runtime's plugin calls go through [`set_within`] and
/// [`delete_counted`].
pub trait KvStore: Send + Sync + 'static {
    fn get<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, KvError>>;
    fn set<'a>(&'a self, scope: &'a str, key: &'a str, value: &'a [u8]) -> BoxFuture<'a, Result<(), KvError>>;
    fn delete<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<bool, KvError>>;
    fn list<'a>(&'a self, scope: &'a str, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, KvError>>;
    /// What the scopes of `environment` (those starting with `environment/`) hold, every write
    /// made before the call included: keys, and bytes of keys and values.
    fn usage<'a>(&'a self, environment: &'a str) -> BoxFuture<'a, Result<KvUsage, KvError>>;
    /// The runtime's count of this store's environments ([`set_within`]).
    fn accounts(&self) -> &KvAccounts;
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
            fn usage<'a>(&'a self, environment: &'a str) -> BoxFuture<'a, Result<KvUsage, KvError>> {
                Box::pin(std::future::ready(<$ty>::usage(self, environment)))
            }
            fn accounts(&self) -> &KvAccounts {
                &self.accounts
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
    accounts: KvAccounts,
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
    pub fn usage(&self, environment: &str) -> Result<KvUsage, KvError> {
        let prefix = format!("{environment}/");
        let map = self.map.lock().expect("kv");
        let mut usage = KvUsage::default();
        for ((_, key), value) in map
            .range((prefix.clone(), String::new())..)
            .take_while(|((scope, _), _)| scope.starts_with(&prefix))
        {
            usage.add(key.len() as u64, value.len() as u64);
        }
        Ok(usage)
    }
}

/// Persisted in a directory: one file per key, named by the hex of scope and key so no key can
/// name a path; written through a temporary file and a rename. A key whose hex would not fit a
/// file name (over [`LONG_KEY`] bytes) is kept in a file named `~` and the sha256 of the key,
/// whose content starts with the key itself (its length as 4 bytes, little-endian, then the key).
#[derive(Debug)]
pub struct DirKv {
    root: PathBuf,
    accounts: KvAccounts,
}

impl DirKv {
    pub fn open(root: impl Into<PathBuf>) -> Result<DirKv, KvError> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(|source| KvError::Io {
            context: format!("cannot create {}", root.display()),
            source,
        })?;
        Ok(DirKv {
            root,
            accounts: KvAccounts::default(),
        })
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
    /// Counted from the files' names and sizes: a short key's file name is its hex and its
    /// content the value; a long key's content is its length (4 bytes), the key and the value.
    pub fn usage(&self, environment: &str) -> Result<KvUsage, KvError> {
        let prefix = hex_name(&format!("{environment}/"));
        let mut usage = KvUsage::default();
        let scopes = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(usage),
            Err(e) => return Err(io(format!("cannot list {}", self.root.display()))(e)),
        };
        for scope in scopes {
            let scope = scope.map_err(io(format!("cannot list {}", self.root.display())))?;
            if !scope.file_name().to_str().is_some_and(|name| name.starts_with(&prefix)) {
                continue;
            }
            let dir = scope.path();
            let entries = std::fs::read_dir(&dir).map_err(io(format!("cannot list {}", dir.display())))?;
            for entry in entries {
                let entry = entry.map_err(io(format!("cannot list {}", dir.display())))?;
                let name = entry.file_name();
                let Some(name) = name.to_str().filter(|n| !n.starts_with('.')) else {
                    continue;
                };
                let size = entry
                    .metadata()
                    .map_err(io(format!("cannot stat {}", entry.path().display())))?
                    .len();
                if name.starts_with('~') {
                    usage.add(0, size.saturating_sub(4));
                } else {
                    usage.add(name.len() as u64 / 2, size);
                }
            }
        }
        Ok(usage)
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
    // PostgreSQL's text cannot hold NUL, and one key it refuses would fail the whole group
    // commit it is in: refused here, on every backend alike.
    if let Some(at) = key.find('\0') {
        return Err(wit_error(
            ErrorKind::InvalidInput,
            format!("kv key must not contain NUL (U+0000), found at byte {at}"),
        ));
    }
    Ok(())
}

fn backend_error(e: KvError) -> Error {
    match e {
        KvError::QuotaExceeded { .. } => wit_error(ErrorKind::Permanent, e.to_string()),
        KvError::Io { .. } => {
            tracing::error!(error = %e, "kv backend failed");
            wit_error(ErrorKind::Retryable, "the host's key/value store failed; see the host log")
        }
    }
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
        let ctx = &self.ctx;
        set_within(&*ctx.kv, &ctx.environment, ctx.kv_quota, &self.kv_scope, &key, &value)
            .await
            .map_err(backend_error)
    }

    async fn delete(&mut self, key: String) -> Result<bool, Error> {
        check_key(&key)?;
        delete_counted(&*self.ctx.kv, &self.ctx.environment, &self.kv_scope, &key)
            .await
            .map_err(backend_error)
    }

    async fn list_keys(&mut self, prefix: String) -> Result<Vec<String>, Error> {
        // No key holds a NUL (`check_key`), so no key starts with such a prefix; the backend is
        // not asked (PostgreSQL would refuse the text).
        if prefix.contains('\0') {
            return Ok(Vec::new());
        }
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

    /// The quota counts keys and bytes of keys and values over all scopes of one environment:
    /// a write past either limit is refused naming the environment, the limit and the usage;
    /// replacing, shrinking and deleting pass (also over a lowered quota) and free room; another
    /// environment is counted apart.
    async fn check_quota(kv: &dyn KvStore) {
        let quota = KvQuota {
            max_keys: 3,
            max_bytes: 100,
        };
        static VALUE: [u8; 100] = [b'v'; 100];
        let set = |scope: &'static str, key: &'static str, len: usize| set_within(kv, "q", quota, scope, key, &VALUE[..len]);
        set("q/a", "k1", 10).await.unwrap();
        set("q/b", "k2", 10).await.unwrap();
        set("q/a", "k3", 10).await.unwrap();
        assert_eq!(kv.usage("q").await.unwrap(), KvUsage { keys: 3, bytes: 36 });
        let err = set("q/b", "k4", 1).await.unwrap_err();
        assert!(
            matches!(
                err,
                KvError::QuotaExceeded {
                    unit: "keys",
                    limit: 3,
                    after: 4,
                    ..
                }
            ),
            "{err}"
        );
        let text = err.to_string();
        for part in [
            "quota_exceeded: ",
            "`k4`",
            "environment `q`",
            "to 4 keys, past its quota of 3 keys",
            "it holds 3 keys, 36 bytes",
        ] {
            assert!(text.contains(part), "`{text}` should say `{part}`");
        }
        assert_eq!(kv.get("q/b", "k4").await.unwrap(), None, "a refused write is not made");
        // Replacing a key adds none; bytes count keys and values.
        set("q/a", "k1", 70).await.unwrap();
        assert_eq!(kv.usage("q").await.unwrap(), KvUsage { keys: 3, bytes: 96 });
        let err = set("q/a", "k3", 20).await.unwrap_err();
        assert!(
            matches!(
                err,
                KvError::QuotaExceeded {
                    unit: "bytes",
                    limit: 100,
                    after: 106,
                    ..
                }
            ),
            "{err}"
        );
        // Deleting frees room, for keys and bytes.
        assert!(delete_counted(kv, "q", "q/a", "k1").await.unwrap());
        assert!(!delete_counted(kv, "q", "q/a", "k1").await.unwrap());
        set("q/b", "k4", 10).await.unwrap();
        // Another environment has its own count; an unchecked write there is seen when counted.
        kv.set("other/a", "x", &[0; 500]).await.unwrap();
        set_within(kv, "other", quota, "other/a", "k", b"v").await.unwrap_err();
        // Over a quota lowered below the usage, what does not grow passes.
        let lower = KvQuota {
            max_keys: 1,
            max_bytes: 10,
        };
        set_within(kv, "q", lower, "q/a", "k3", b"small").await.unwrap();
        set_within(kv, "q", lower, "q/b", "k5", b"").await.unwrap_err();
        assert_eq!(kv.usage("q").await.unwrap(), KvUsage { keys: 3, bytes: 31 });
        // The count kept matches the store's own.
        let kept = *kv.accounts().account("q").lock().await;
        assert_eq!(kept, Some(kv.usage("q").await.unwrap()));
    }

    #[tokio::test]
    async fn quotas_count_an_environments_keys_and_bytes_in_every_backend() {
        check_quota(&MemoryKv::default()).await;
        let dir = tempfile::tempdir().unwrap();
        let kv = DirKv::open(dir.path().join("kv")).unwrap();
        check_quota(&kv).await;
        // Long keys (a hashed file name, the key inside) count as what they are.
        let long = "k".repeat(MAX_KEY);
        set_within(&kv, "long", KvQuota::default(), "long/p", &long, b"value")
            .await
            .unwrap();
        assert_eq!(
            kv.usage("long").unwrap(),
            KvUsage {
                keys: 1,
                bytes: MAX_KEY as u64 + 5
            }
        );
        // Counted again from the files by a store opened anew.
        let reopened = DirKv::open(dir.path().join("kv")).unwrap();
        assert_eq!(reopened.usage("q").unwrap(), KvUsage { keys: 3, bytes: 31 });
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

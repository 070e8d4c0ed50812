//! A key/value store private to the plugin, scoped by plugin name and environment, persisted by
//! the host (capability `kv`).

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::kv as wit;
use crate::{Error, Result};

/// The value stored at `key`; `None` when absent.
pub fn get(key: &str) -> Result<Option<Vec<u8>>> {
    Ok(wit::get(key)?)
}

/// Stores `value` at `key`, replacing any previous value. Keys are 1 to 1,024 bytes, values at
/// most 1 MiB; past the environment's quota (its plugins' keys and bytes together) this is a
/// `permanent` error whose message starts with `quota_exceeded:` — delete keys to make room.
pub fn set(key: &str, value: &[u8]) -> Result<()> {
    Ok(wit::set(key, value)?)
}

/// Removes `key`; returns whether it existed.
pub fn delete(key: &str) -> Result<bool> {
    Ok(wit::delete(key)?)
}

/// The keys starting with `prefix`, sorted.
pub fn list_keys(prefix: &str) -> Result<Vec<String>> {
    Ok(wit::list_keys(prefix)?)
}

/// The JSON value stored at `key`; a value that does not decode as `T` is a `permanent` error.
pub fn get_json<T: DeserializeOwned>(key: &str) -> Result<Option<T>> {
    match get(key)? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::permanent(format!("kv key `{key}` does not hold the expected JSON: {e}"))),
    }
}

/// Stores `value` as JSON at `key`.
pub fn set_json<T: Serialize + ?Sized>(key: &str, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec(value).map_err(|e| Error::permanent(format!("cannot encode the value for kv key `{key}`: {e}")))?;
    set(key, &bytes)
}

//! Where the runtime gets plugin bytes: anything that can fetch a blob by digest and guarantees
//! the bytes it returns hash to that digest.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use orc_manifest::Digest;

use crate::error::{RegistryError, Result};
use crate::store::Store;

/// A boxed, `Send` future, so [`BlobSource`] stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A source of verified blobs. Implementations must return exactly the bytes whose sha256 is
/// `digest`, or an error: `UnknownDigest`, `Corrupt` or `DigestMismatch` when they cannot.
pub trait BlobSource: Send + Sync {
    fn fetch<'a>(&'a self, digest: &'a Digest) -> BoxFuture<'a, Result<Vec<u8>, RegistryError>>;
}

impl BlobSource for Store {
    fn fetch<'a>(&'a self, digest: &'a Digest) -> BoxFuture<'a, Result<Vec<u8>, RegistryError>> {
        let digest = *digest;
        Box::pin(blocking(self, move |store| store.get_blob(&digest)))
    }
}

impl<T: BlobSource + ?Sized> BlobSource for Arc<T> {
    fn fetch<'a>(&'a self, digest: &'a Digest) -> BoxFuture<'a, Result<Vec<u8>, RegistryError>> {
        (**self).fetch(digest)
    }
}

/// Runs a blocking store operation on tokio's blocking pool.
pub(crate) async fn blocking<T, F>(store: &Store, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(&Store) -> Result<T> + Send + 'static,
{
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|e| RegistryError::Io {
            context: "a registry store task failed".into(),
            source: std::io::Error::other(e.to_string()),
        })?
}

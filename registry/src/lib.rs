//! `orc-registry`: the content-addressed plugin store and service catalog.
//!
//! A plugin artifact is one Wasm component with its manifest embedded, addressed by the sha256 of
//! its bytes; a service version ([`services`]) is a JSON document addressed the same way. The
//! [`Store`] keeps verified blobs and a `name@version → digest` index of each in a directory;
//! the `server` feature serves it over HTTP ([`server::router`]), the `client` feature talks to such
//! a service ([`Client`]), and [`Registry`] is either, chosen by a `--registry <URL|DIR>` string.
//!
//! Architecture invariants: bytes are hashed on every write and every read, by the store and by
//! the client alike; a `name@version` once published is never re-pointed to other bytes.

pub mod error;
pub mod services;
pub mod source;
pub mod store;

#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "server")]
pub mod server;

use std::fmt;

use bytes::Bytes;

#[cfg(feature = "client")]
pub use client::Client;
pub use error::{ErrorBody, RegistryError, Result, parse_digest};
pub use orc_manifest::Digest;
pub use services::{PublishedService, ServiceEntry, check_service_name, parse_service};
pub use source::{BlobSource, BoxFuture};
pub use store::{DEFAULT_MAX_BLOB_SIZE, Entry, Published, Store, StoreOptions, check_name, check_version};

use source::blocking;

/// A registry, local or remote, as the CLI's `--registry <URL|DIR>` names it.
#[derive(Debug, Clone)]
pub enum Registry {
    Local(Store),
    #[cfg(feature = "client")]
    Remote(Client),
}

impl Registry {
    /// `http://…` or `https://…` is a remote registry; anything else (optionally `file://…`) a
    /// directory, created if missing.
    pub fn open(spec: &str) -> Result<Registry> {
        Registry::open_with(spec, StoreOptions::default())
    }

    /// Like [`Registry::open`], with the options a local store is opened with.
    pub fn open_with(spec: &str, options: StoreOptions) -> Result<Registry> {
        if spec.trim().is_empty() {
            return Err(RegistryError::Unsupported(
                "the registry location is empty: give a URL or a directory".into(),
            ));
        }
        if spec.starts_with("http://") || spec.starts_with("https://") {
            #[cfg(feature = "client")]
            return Ok(Registry::Remote(Client::new(spec)?));
            #[cfg(not(feature = "client"))]
            return Err(RegistryError::Unsupported(format!(
                "registry `{spec}` is a URL, but this build has no registry client (feature `client`)"
            )));
        }
        let path = spec.strip_prefix("file://").unwrap_or(spec);
        Ok(Registry::Local(Store::open(path, options)?))
    }

    /// A remote registry sends `token` as a bearer token (a registry served by `orc-host` needs
    /// one to publish); a local one needs none and ignores it.
    pub fn with_token(self, token: Option<&str>) -> Registry {
        match (self, token) {
            #[cfg(feature = "client")]
            (Registry::Remote(client), Some(token)) => Registry::Remote(client.with_token(token)),
            (registry, _) => registry,
        }
    }

    pub async fn publish(&self, bytes: impl Into<Bytes>) -> Result<Published> {
        match self {
            Registry::Local(store) => {
                let bytes = bytes.into();
                blocking(store, move |s| s.publish(&bytes)).await
            }
            #[cfg(feature = "client")]
            Registry::Remote(client) => client.publish(bytes).await,
        }
    }

    pub async fn put_blob(&self, bytes: impl Into<Bytes>) -> Result<(Digest, bool)> {
        match self {
            Registry::Local(store) => {
                let bytes = bytes.into();
                blocking(store, move |s| s.put_blob(&bytes)).await
            }
            #[cfg(feature = "client")]
            Registry::Remote(client) => client.put_blob(bytes).await,
        }
    }

    /// The verified bytes of `digest`.
    pub async fn fetch(&self, digest: &Digest) -> Result<Vec<u8>> {
        match self {
            Registry::Local(store) => BlobSource::fetch(store, digest).await,
            #[cfg(feature = "client")]
            Registry::Remote(client) => client.fetch(digest).await,
        }
    }

    pub async fn resolve(&self, name: &str, version: &str) -> Result<Entry> {
        match self {
            Registry::Local(store) => {
                let (name, version) = (name.to_string(), version.to_string());
                blocking(store, move |s| s.resolve(&name, &version)).await
            }
            #[cfg(feature = "client")]
            Registry::Remote(client) => client.resolve(name, version).await,
        }
    }

    pub async fn versions(&self, name: &str) -> Result<Vec<Entry>> {
        match self {
            Registry::Local(store) => {
                let name = name.to_string();
                blocking(store, move |s| s.versions(&name)).await
            }
            #[cfg(feature = "client")]
            Registry::Remote(client) => client.versions(name).await,
        }
    }

    pub async fn list(&self) -> Result<Vec<Entry>> {
        match self {
            Registry::Local(store) => blocking(store, |s| s.list()).await,
            #[cfg(feature = "client")]
            Registry::Remote(client) => client.list().await,
        }
    }

    /// Publishes a service version from its JSON document.
    pub async fn publish_service(&self, bytes: impl Into<Bytes>) -> Result<PublishedService> {
        match self {
            Registry::Local(store) => {
                let bytes = bytes.into();
                blocking(store, move |s| s.publish_service(&bytes)).await
            }
            #[cfg(feature = "client")]
            Registry::Remote(client) => client.publish_service(bytes).await,
        }
    }

    pub async fn resolve_service(&self, name: &str, version: &str) -> Result<ServiceEntry> {
        match self {
            Registry::Local(store) => {
                let (name, version) = (name.to_string(), version.to_string());
                blocking(store, move |s| s.resolve_service(&name, &version)).await
            }
            #[cfg(feature = "client")]
            Registry::Remote(client) => client.resolve_service(name, version).await,
        }
    }

    pub async fn service_versions(&self, name: &str) -> Result<Vec<ServiceEntry>> {
        match self {
            Registry::Local(store) => {
                let name = name.to_string();
                blocking(store, move |s| s.service_versions(&name)).await
            }
            #[cfg(feature = "client")]
            Registry::Remote(client) => client.service_versions(name).await,
        }
    }

    pub async fn list_services(&self) -> Result<Vec<ServiceEntry>> {
        match self {
            Registry::Local(store) => blocking(store, |s| s.list_services()).await,
            #[cfg(feature = "client")]
            Registry::Remote(client) => client.list_services().await,
        }
    }

    /// The document `entry` files, from its verified blob.
    pub async fn service_document(&self, entry: &ServiceEntry) -> Result<orc_cluster::ServiceDocument> {
        parse_service(&self.fetch(&entry.digest).await?)
    }
}

impl BlobSource for Registry {
    fn fetch<'a>(&'a self, digest: &'a Digest) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(Registry::fetch(self, digest))
    }
}

impl fmt::Display for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Registry::Local(store) => write!(f, "{}", store.root().display()),
            #[cfg(feature = "client")]
            Registry::Remote(client) => f.write_str(client.base_url()),
        }
    }
}

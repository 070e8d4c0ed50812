//! The service catalog as the application reads it: service versions from the registry, each
//! with its verified document.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use orc_cluster::ServiceDocument;
use orc_registry::{RegistryError, ServiceEntry, Store};

use crate::app::App;
use crate::processes::ServicesError;

impl App {
    /// Every service version in the catalog, by name then version.
    pub async fn services(&self) -> Result<Vec<(ServiceEntry, ServiceDocument)>, ServicesError> {
        self.catalog(String::new(), |store| {
            store
                .list_services()?
                .into_iter()
                .map(|e| {
                    let doc = store.service_document(&e)?;
                    Ok((e, doc))
                })
                .collect()
        })
        .await
    }

    /// The versions of service `name`, oldest first.
    pub async fn service_versions(&self, name: &str) -> Result<Vec<(ServiceEntry, ServiceDocument)>, ServicesError> {
        let name = name.to_string();
        self.catalog(name.clone(), move |store| {
            store
                .service_versions(&name)?
                .into_iter()
                .map(|e| {
                    let doc = store.service_document(&e)?;
                    Ok((e, doc))
                })
                .collect()
        })
        .await
    }

    /// Every plugin the registry holds, by name then version.
    pub async fn plugins(&self) -> Result<Vec<orc_registry::Entry>, ServicesError> {
        self.catalog(String::new(), |store| store.list()).await
    }

    /// Service `name@version`. A version is immutable once published, so it is read from the
    /// registry and verified once, then kept (process operations and views ask for it often).
    pub async fn service(&self, name: &str, version: &str) -> Result<(ServiceEntry, ServiceDocument), ServicesError> {
        let key = (name.to_string(), version.to_string());
        if let Some(found) = self.service_docs.0.lock().expect("service docs").get(&key) {
            return Ok((found.0.clone(), found.1.clone()));
        }
        let (name, version) = key.clone();
        let found = self
            .catalog(format!("{name}@{version}"), move |store| {
                let entry = store.resolve_service(&name, &version)?;
                let doc = store.service_document(&entry)?;
                Ok((entry, doc))
            })
            .await?;
        self.service_docs
            .0
            .lock()
            .expect("service docs")
            .insert(key, Arc::new(found.clone()));
        Ok(found)
    }

    /// Runs a read of the catalog on the blocking pool; a name or version that is not one, or
    /// that is not there, is the unknown service `what`.
    async fn catalog<T: Send + 'static>(
        &self,
        what: String,
        read: impl FnOnce(&Store) -> Result<T, RegistryError> + Send + 'static,
    ) -> Result<T, ServicesError> {
        let store = self.registry.clone();
        let result = tokio::task::spawn_blocking(move || read(&store))
            .await
            .map_err(|e| ServicesError::Registry(RegistryError::Unsupported(format!("a catalog read failed: {e}"))))?;
        result.map_err(|e| match e {
            RegistryError::NotFound { .. } | RegistryError::InvalidName(_) => {
                ServicesError::UnknownService(what.chars().filter(|c| !c.is_control()).take(140).collect())
            }
            e => ServicesError::Registry(e),
        })
    }
}

/// A service version as the catalog holds it: its entry and its verified document.
type ServiceVersion = Arc<(ServiceEntry, ServiceDocument)>;

/// Service versions read from the registry, by name and version.
#[derive(Default)]
pub(crate) struct ServiceDocs(Mutex<HashMap<(String, String), ServiceVersion>>);

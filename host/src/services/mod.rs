//! Services (dEF-Pi's orchestrator): the catalog of service versions the registry holds, and —
//! as they are built — the processes that run them and the connections between their interfaces.
//!
//! The **catalog** is the registry's (`orc_registry::services`): a service version is a
//! content-addressed document, validated and filed once; the host only reads it
//! ([`crate::app::App::services`]), verified on every read.

use orc_registry::RegistryError;

/// Why a service request is refused.
#[derive(Debug, thiserror::Error)]
pub enum ServicesError {
    #[error("service `{0}` is not in the catalog (see /api/v1/services)")]
    UnknownService(String),
    #[error("the service catalog cannot be read: {0}")]
    Registry(#[source] RegistryError),
}

impl From<RegistryError> for ServicesError {
    fn from(e: RegistryError) -> ServicesError {
        ServicesError::Registry(e)
    }
}

//! The service catalog: every service version the registry holds, the versions of one service,
//! one version with its interfaces (each interface version with the digest of its message
//! schema, which is what makes two interfaces compatible). Publishing is the registry's
//! (`POST /registry/v1/services`, `orc-plugin publish-service`).

use axum::extract::State;
use axum::http::StatusCode;
use orc_cluster::ServiceDocument;
use orc_cluster::service::{Protocol, Role};
use orc_registry::ServiceEntry;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::Path;
use super::{ApiError, AppState, ErrorBody, Result};
use crate::processes::ServicesError;
use crate::store::Millis;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_services))
        .routes(routes!(service_versions))
        .routes(routes!(get_service))
}

impl From<ServicesError> for ApiError {
    fn from(e: ServicesError) -> ApiError {
        let (status, code) = match &e {
            ServicesError::Cluster(_) => match e {
                ServicesError::Cluster(inner) => return inner.into(),
                _ => unreachable!(),
            },
            ServicesError::UnknownService(_) => (StatusCode::NOT_FOUND, "unknown_service"),
            ServicesError::UnknownProcess(_) => (StatusCode::NOT_FOUND, "unknown_process"),
            ServicesError::ProcessExists(_) => (StatusCode::CONFLICT, "process_exists"),
            ServicesError::InvalidTransition { .. } => (StatusCode::CONFLICT, "invalid_transition"),
            ServicesError::VersionConflict { .. } => (StatusCode::CONFLICT, "version_conflict"),
            ServicesError::PortInUse { .. } => (StatusCode::CONFLICT, "port_in_use"),
            ServicesError::InvalidConfig { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_config"),
            ServicesError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_process_request"),
            ServicesError::NodeUnsuitable { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "node_unsuitable"),
            ServicesError::UnknownPeer(_) => (StatusCode::UNPROCESSABLE_ENTITY, "unknown_process"),
            ServicesError::UnknownInterface(_) => (StatusCode::UNPROCESSABLE_ENTITY, "unknown_interface"),
            ServicesError::IncompatibleInterfaces(_) => (StatusCode::UNPROCESSABLE_ENTITY, "incompatible_interfaces"),
            ServicesError::CardinalityExceeded(_) => (StatusCode::UNPROCESSABLE_ENTITY, "cardinality_exceeded"),
            ServicesError::UnknownConnection(_) => (StatusCode::NOT_FOUND, "unknown_connection"),
            ServicesError::ConnectionExists(_) => (StatusCode::CONFLICT, "connection_exists"),
            ServicesError::Registry(inner) => {
                tracing::error!(error = %orc_manifest::error_chain(inner), "the service catalog cannot be read");
                return ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "catalog_unreadable",
                    "the service catalog cannot be read (details are in the host's log)",
                );
            }
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// One version of a service in the catalog.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ServiceVersion {
    name: String,
    version: String,
    /// The document's digest in the registry.
    digest: String,
    description: String,
    /// The automator plugin that runs its processes.
    automator: String,
    published_at: Millis,
    /// The JSON Schema of one process's configuration.
    #[schema(value_type = Object)]
    config_schema: Value,
    ports: Vec<PortView>,
    /// What a node needs to run a process (labels, facts).
    #[schema(value_type = Object)]
    needs: Value,
    interfaces: Vec<InterfaceView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct PortView {
    name: String,
    port: u16,
    /// `tcp` or `udp`.
    protocol: &'static str,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct InterfaceView {
    name: String,
    /// `provides` or `requires`.
    role: &'static str,
    /// A provider's port (one of `ports`).
    port: Option<String>,
    allow_multiple: bool,
    /// The most connections it takes; `null`: no limit.
    limit: Option<u32>,
    /// Whether it is told where its peers run: a consumer always; a provider when it asks for
    /// its consumers' addresses (then a consumer's move reconfigures it).
    told_peer_location: bool,
    versions: Vec<InterfaceVersionView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct InterfaceVersionView {
    version: String,
    /// `sha256:` of the message schema's canonical JSON: two interfaces sharing one are compatible.
    id: String,
    #[schema(value_type = Object)]
    schema: Value,
}

impl ServiceVersion {
    fn new(entry: ServiceEntry, doc: ServiceDocument) -> ServiceVersion {
        let published_at = (entry.published_at.unix_timestamp_nanos() / 1_000_000) as Millis;
        ServiceVersion {
            name: entry.name,
            version: entry.version,
            digest: entry.digest.to_string(),
            description: doc.description,
            automator: doc.automator.to_string(),
            published_at,
            needs: serde_json::to_value(&doc.needs).expect("needs serialise"),
            config_schema: doc.config_schema,
            ports: doc
                .ports
                .into_iter()
                .map(|p| PortView {
                    name: p.name,
                    port: p.port,
                    protocol: match p.protocol {
                        Protocol::Tcp => "tcp",
                        Protocol::Udp => "udp",
                    },
                })
                .collect(),
            interfaces: doc
                .interfaces
                .into_iter()
                .map(|i| InterfaceView {
                    limit: i.limit(),
                    told_peer_location: i.told_peer_location(),
                    role: match i.role {
                        Role::Provides => "provides",
                        Role::Requires => "requires",
                    },
                    name: i.name,
                    port: i.port,
                    allow_multiple: i.allow_multiple,
                    versions: i
                        .versions
                        .into_iter()
                        .map(|v| InterfaceVersionView {
                            id: v.id().to_string(),
                            version: v.version,
                            schema: v.schema,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ServiceList {
    items: Vec<ServiceVersion>,
}

/// Every service version in the catalog, by name then version.
#[utoipa::path(get, path = "/services", tag = "services", responses((status = 200, body = ServiceList)))]
async fn list_services(State(app): State<AppState>) -> Result<axum::Json<ServiceList>> {
    let items = app.services().await?.into_iter().map(|(e, d)| ServiceVersion::new(e, d)).collect();
    Ok(axum::Json(ServiceList { items }))
}

/// The versions of one service, oldest first.
#[utoipa::path(get, path = "/services/{name}", tag = "services",
    params(("name" = String, Path, description = "Service name")),
    responses((status = 200, body = ServiceList), (status = 404, body = ErrorBody)))]
async fn service_versions(State(app): State<AppState>, Path(name): Path<String>) -> Result<axum::Json<ServiceList>> {
    let items = app
        .service_versions(&name)
        .await?
        .into_iter()
        .map(|(e, d)| ServiceVersion::new(e, d))
        .collect();
    Ok(axum::Json(ServiceList { items }))
}

/// One service version with its interfaces.
#[utoipa::path(get, path = "/services/{name}/{version}", tag = "services",
    params(("name" = String, Path, description = "Service name"), ("version" = String, Path, description = "Service version")),
    responses((status = 200, body = ServiceVersion), (status = 404, body = ErrorBody)))]
async fn get_service(State(app): State<AppState>, Path((name, version)): Path<(String, String)>) -> Result<axum::Json<ServiceVersion>> {
    let (entry, doc) = app.service(&name, &version).await?;
    Ok(axum::Json(ServiceVersion::new(entry, doc)))
}

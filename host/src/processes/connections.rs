//! Connections between processes' interfaces as the API sees them: the request that makes one
//! ([`ConnectRequest`], its two [`Endpoint`]s) and the connection shown ([`ConnectionView`]), at
//! a revision that never changes (`CONNECTION_REVISION`). Making one, and delivering it to both
//! processes, is the application's.

use serde::{Deserialize, Serialize};

use crate::store::{ConnectionRecord, Millis};

/// One side of a connection.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    pub process: String,
    pub interface: String,
}

/// `POST …/connections`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectRequest {
    #[serde(deserialize_with = "crate::json::object")]
    pub from: Endpoint,
    #[serde(deserialize_with = "crate::json::object")]
    pub to: Endpoint,
}

/// A connection as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ConnectionView {
    pub id: String,
    pub from: Endpoint,
    pub to: Endpoint,
    /// The interface version both sides agreed on.
    pub version: String,
    /// `sha256:` of that version's message schema.
    pub interface_id: String,
    pub created_by: Option<String>,
    pub created_at: Millis,
}

impl From<ConnectionRecord> for ConnectionView {
    fn from(c: ConnectionRecord) -> ConnectionView {
        ConnectionView {
            id: c.id,
            from: Endpoint {
                process: c.from_process,
                interface: c.from_interface,
            },
            to: Endpoint {
                process: c.to_process,
                interface: c.to_interface,
            },
            version: c.version,
            interface_id: c.interface_id,
            created_by: c.created_by,
            created_at: c.created_at,
        }
    }
}

/// A connection's revision, its `ETag`: a connection is never changed once made (it is made,
/// or deleted), so it stays at its first.
pub(crate) const CONNECTION_REVISION: i64 = 1;

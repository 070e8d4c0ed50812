//! The replica set (the admin's): `GET /replicas` — every `orc-host serve` on the database,
//! what each holds and how fresh its heartbeat is — and `POST /replicas/{id}/drain`, which
//! tells one replica (through the database, from any replica) to hand its environments over
//! and take no more.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::Path;
use super::{ApiError, AppState, ErrorBody, Result};
use crate::app::ReplicaView;
use crate::store::{Epoch, ReplicaId};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_replicas)).routes(routes!(drain_replica))
}

#[derive(Serialize, ToSchema)]
pub(super) struct Replicas {
    /// Oldest first.
    items: Vec<Replica>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct Replica {
    /// New at every start of a process.
    #[schema(value_type = String, format = Uuid)]
    id: ReplicaId,
    /// Where its API listens (`advertise`, or its listen address).
    address: String,
    version: String,
    /// Since its last heartbeat, by the database's clock (renewed every second).
    heartbeat_age_ms: i64,
    /// Its heartbeat is younger than a lease (5 s) and it has not ended: it is running.
    live: bool,
    /// Handing its environments over, taking no more.
    draining: bool,
    /// The replica that answered this request.
    this: bool,
    /// The environments it runs, by name.
    holds: Vec<Held>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct Held {
    environment: String,
    /// The environment's owner generation: changes at every takeover.
    epoch: Epoch,
    /// Until its lease expires unless renewed.
    expires_in_ms: i64,
}

impl From<ReplicaView> for Replica {
    fn from(v: ReplicaView) -> Replica {
        Replica {
            id: v.record.id,
            address: v.record.address,
            version: v.record.version,
            heartbeat_age_ms: v.record.heartbeat_age_ms,
            live: v.live,
            draining: v.record.draining,
            this: v.this,
            holds: v
                .holds
                .into_iter()
                .map(|h| Held {
                    environment: h.environment,
                    epoch: h.epoch,
                    expires_in_ms: h.expires_in_ms,
                })
                .collect(),
        }
    }
}

/// Every replica on the database and what each runs (ended ones too, with their last
/// heartbeat, until the database is tidied).
#[utoipa::path(get, path = "/replicas", tag = "host", responses((status = 200, body = Replicas)))]
async fn list_replicas(State(app): State<AppState>) -> Result<axum::Json<Replicas>> {
    let items = app.replica_set().await?.into_iter().map(Replica::from).collect();
    Ok(axum::Json(Replicas { items }))
}

/// Tells replica `id` to hand over every environment it runs and take no more (answered at
/// once; it acts at its next look, within a second or two). What a rolling upgrade does before
/// it stops a replica. A drained replica stays drained until it is restarted.
#[utoipa::path(post, path = "/replicas/{id}/drain", tag = "host", params(("id" = String, Path, description = "The replica's id")),
    responses((status = 202, description = "The replica is told"), (status = 404, description = "No such replica (`unknown_replica`)", body = ErrorBody)))]
async fn drain_replica(State(app): State<AppState>, Path(id): Path<String>) -> Result<StatusCode> {
    let unknown = || ApiError::new(StatusCode::NOT_FOUND, "unknown_replica", format!("no replica `{id}`"));
    let replica: ReplicaId = id.parse().map_err(|_| unknown())?;
    if app.drain(replica).await? {
        Ok(StatusCode::ACCEPTED)
    } else {
        Err(unknown())
    }
}

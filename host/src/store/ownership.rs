//! Who runs each environment: replicas, their leases and the fence (Temporal's `range_id`, per
//! environment).
//!
//! A **replica** is one incarnation of `orc-host serve` on the database ([`ReplicaId`], new at
//! every start). Its **lease** on an environment (`env_leases`) is a heartbeat row that expires
//! unless renewed, judged by the database's clock (`now()` on PostgreSQL), never by a replica's.
//! The **fence** (`env_fences`) is a row of its own holding the environment's **epoch**, which
//! changes only when a replica takes the environment over ([`Store::claim`]): renewals touch the
//! lease row only, so they never wait on the owner's own locks of the fence.
//!
//! Every write an owner makes for its environment runs in a transaction that first reads the
//! fence with a row lock (`SELECT epoch … FOR SHARE`) and refuses to go on under another epoch
//! ([`StoreError::Fenced`]). A takeover's `UPDATE` of the fence waits for those locks, so once
//! it commits no write of the old owner can: the database refuses a stale owner, not a clock.
//! A bare `WHERE epoch = $2` on each write would not do, under READ COMMITTED a write that read
//! the old epoch could commit after the takeover.
//!
//! On SQLite one process serves the data directory (it is locked), owns every environment and
//! claims each anew at every start: the same rows, the local clock, the same refusal of a write
//! under an epoch an earlier start held. `BEGIN IMMEDIATE` orders the writes.

use std::time::Duration;

use sqlx::Row as _;

use super::error::{backend, backend_with};
use sqlx::{Postgres, Sqlite};

use super::{BeginWrite as _, Db, EnvironmentId, Millis, ReplicaId, Result, Store, StoreError, WriteTx, now_ms};

/// An environment's owner generation: changes only at a takeover, and only upwards.
pub type Epoch = i64;

/// An owner's hold on an environment. Writes made under it commit only while `epoch` is the
/// environment's current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fence {
    pub env: EnvironmentId,
    pub epoch: Epoch,
}

/// A replica as the database knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRecord {
    pub id: ReplicaId,
    /// Where its API listens.
    pub address: String,
    pub version: String,
    /// Since its last heartbeat, by the database's clock.
    pub heartbeat_age_ms: i64,
    pub draining: bool,
}

/// An environment's lease and fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    pub env: EnvironmentId,
    /// The replica holding the lease, or that held it last.
    pub holder: Option<ReplicaId>,
    pub epoch: Epoch,
    /// Until the lease expires (negative: expired that long ago), by the database's clock.
    pub expires_in_ms: i64,
}

fn millis(d: Duration) -> Millis {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn replica(text: Option<String>) -> Option<ReplicaId> {
    text.and_then(|t| t.parse().ok())
}

impl Store {
    /// Records replica `id` (listening at `address`, running `version`) as alive.
    pub async fn register_replica(&self, id: ReplicaId, address: &str, version: &str) -> Result<()> {
        let context = || format!("registering replica {id}");
        match &self.db {
            Db::Sqlite(pool) => {
                let now = now_ms();
                sqlx::query("INSERT INTO replicas (id, address, version, started_at, heartbeat_at) VALUES ($1, $2, $3, $4, $4)")
                    .bind(id.to_string())
                    .bind(address)
                    .bind(version)
                    .bind(now)
                    .execute(pool)
                    .await
                    .map_err(backend_with(context))?;
            }
            Db::Postgres(pool) => {
                sqlx::query("INSERT INTO replicas (id, address, version) VALUES ($1, $2, $3)")
                    .bind(id.to_string())
                    .bind(address)
                    .bind(version)
                    .execute(pool)
                    .await
                    .map_err(backend_with(context))?;
            }
        }
        Ok(())
    }

    /// Takes environment `env` for replica `me` if its lease has expired (or was never taken,
    /// or is `me`'s own): the lease for `ttl` and the next epoch, in one transaction that waits
    /// (at most 2 s) for the old owner's write transactions to end. `None`: another replica
    /// holds a lease that has not expired. (The 2 s bound is the transaction's `lock_timeout`:
    /// an old owner whose write outlasts it keeps the environment until the next claim.) Claiming what `me` holds starts a new epoch too: what
    /// an owner does after a write whose outcome it does not know, so that later reads either
    /// see that write or know it failed.
    pub async fn claim(&self, env: &EnvironmentId, me: ReplicaId, ttl: Duration) -> Result<Option<Fence>> {
        let context = || format!("claiming environment {env}");
        let (id, holder, ttl_ms) = (env.to_string(), me.to_string(), millis(ttl));
        // What differs: the clock the lease is judged by (SQLite: this process's, bound as $4).
        let (now, take) = match &self.db {
            Db::Sqlite(_) => (
                Some(now_ms()),
                "UPDATE env_leases SET holder = $2, expires_at = $4 + $3 \
                 WHERE environment_id = $1 AND (expires_at <= $4 OR holder IS NULL OR holder = $2)",
            ),
            Db::Postgres(_) => (
                None,
                "UPDATE env_leases SET holder = $2, expires_at = now() + make_interval(secs => $3::float8 / 1000) \
                 WHERE environment_id = $1 AND (expires_at <= now() OR holder IS NULL OR holder = $2)",
            ),
        };
        let epoch: Option<Epoch> = on_pool!(self, pool => {
            let mut tx = pool.begin_write().await.map_err(backend_with(context))?;
            if now.is_none() {
                sqlx::query("SET LOCAL lock_timeout = '2s'")
                    .execute(&mut *tx)
                    .await
                    .map_err(backend_with(context))?;
            }
            for made in [
                "INSERT INTO env_leases (environment_id) VALUES ($1) ON CONFLICT DO NOTHING",
                "INSERT INTO env_fences (environment_id) VALUES ($1) ON CONFLICT DO NOTHING",
            ] {
                sqlx::query(made).bind(&id).execute(&mut *tx).await.map_err(backend_with(context))?;
            }
            let query = sqlx::query(take).bind(&id).bind(&holder).bind(ttl_ms);
            let query = match now {
                Some(now) => query.bind(now),
                None => query,
            };
            let taken = query.execute(&mut *tx).await.map_err(backend_with(context))?.rows_affected();
            let epoch = if taken == 1 {
                // On PostgreSQL this waits for every open transaction that read the fence
                // `FOR SHARE`.
                Some(
                    sqlx::query_scalar("UPDATE env_fences SET epoch = epoch + 1, holder = $2 WHERE environment_id = $1 RETURNING epoch")
                        .bind(&id)
                        .bind(&holder)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(backend_with(context))?,
                )
            } else {
                None
            };
            tx.commit().await.map_err(backend_with(context))?;
            epoch
        });
        if let Some(epoch) = epoch {
            tracing::info!(environment = %env, replica = %me, epoch, "environment claimed");
        }
        Ok(epoch.map(|epoch| Fence { env: *env, epoch }))
    }

    /// Renews, for `ttl`, the leases `me` still holds among `owned` (and its heartbeat), in one
    /// statement; answers those renewed. One missing from the answer is lost: its lease expired
    /// (another replica may have taken it), so `me` must stop acting for it at once.
    pub async fn renew(&self, me: ReplicaId, owned: &[EnvironmentId], ttl: Duration) -> Result<Vec<EnvironmentId>> {
        let holder = me.to_string();
        let ids: Vec<String> = owned.iter().map(ToString::to_string).collect();
        let ttl_ms = millis(ttl);
        let renewed: Vec<String> = match &self.db {
            Db::Sqlite(pool) => {
                let now = now_ms();
                let mut tx = pool.begin_write().await.map_err(backend("renewing leases"))?;
                sqlx::query("UPDATE replicas SET heartbeat_at = $2 WHERE id = $1")
                    .bind(&holder)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend("renewing leases"))?;
                let mut renewed = Vec::with_capacity(ids.len());
                for id in &ids {
                    let done = sqlx::query(
                        "UPDATE env_leases SET expires_at = $3 + $4 WHERE environment_id = $1 AND holder = $2 AND expires_at > $3",
                    )
                    .bind(id)
                    .bind(&holder)
                    .bind(now)
                    .bind(ttl_ms)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend("renewing leases"))?
                    .rows_affected();
                    if done == 1 {
                        renewed.push(id.clone());
                    }
                }
                tx.commit().await.map_err(backend("renewing leases"))?;
                renewed
            }
            Db::Postgres(pool) => {
                sqlx::query("UPDATE replicas SET heartbeat_at = now() WHERE id = $1")
                    .bind(&holder)
                    .execute(pool)
                    .await
                    .map_err(backend("renewing leases"))?;
                sqlx::query_scalar(
                    "UPDATE env_leases SET expires_at = now() + make_interval(secs => $3::float8 / 1000) \
                     WHERE holder = $1 AND environment_id = ANY($2) AND expires_at > now() RETURNING environment_id",
                )
                .bind(&holder)
                .bind(&ids)
                .bind(ttl_ms)
                .fetch_all(pool)
                .await
                .map_err(backend("renewing leases"))?
            }
        };
        Ok(renewed.iter().filter_map(|id| id.parse().ok()).collect())
    }

    /// Lets `env` go at once (a drain, a shutdown): its lease expires now, so another replica
    /// may claim it without waiting out the lease. `me` must have stopped writing for it.
    pub async fn release(&self, env: &EnvironmentId, me: ReplicaId) -> Result<()> {
        let context = || format!("releasing environment {env}");
        match &self.db {
            Db::Sqlite(pool) => sqlx::query("UPDATE env_leases SET expires_at = $3 WHERE environment_id = $1 AND holder = $2")
                .bind(env.to_string())
                .bind(me.to_string())
                .bind(now_ms())
                .execute(pool)
                .await
                .map_err(backend_with(context))?
                .rows_affected(),
            Db::Postgres(pool) => sqlx::query("UPDATE env_leases SET expires_at = now() WHERE environment_id = $1 AND holder = $2")
                .bind(env.to_string())
                .bind(me.to_string())
                .execute(pool)
                .await
                .map_err(backend_with(context))?
                .rows_affected(),
        };
        Ok(())
    }

    /// Every replica the database knows, oldest first.
    pub async fn replicas(&self) -> Result<Vec<ReplicaRecord>> {
        let rows = match &self.db {
            Db::Sqlite(pool) => {
                sqlx::query("SELECT id, address, version, $1 - heartbeat_at AS age, draining FROM replicas ORDER BY started_at, id")
                    .bind(now_ms())
                    .fetch_all(pool)
                    .await
                    .map_err(backend("listing replicas"))?
                    .into_iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2), r.get::<i64, _>(3), r.get(4)))
                    .collect::<Vec<(String, String, String, i64, bool)>>()
            }
            Db::Postgres(pool) => sqlx::query(
                "SELECT id, address, version, (EXTRACT(EPOCH FROM now() - heartbeat_at) * 1000)::bigint AS age, draining \
                 FROM replicas ORDER BY started_at, id",
            )
            .fetch_all(pool)
            .await
            .map_err(backend("listing replicas"))?
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get::<i64, _>(3), r.get(4)))
            .collect(),
        };
        rows.into_iter()
            .map(|(id, address, version, age, draining)| {
                Ok(ReplicaRecord {
                    id: id.parse().map_err(|_| StoreError::corrupt(format!("replica id {id:?}")))?,
                    address,
                    version,
                    heartbeat_age_ms: age,
                    draining,
                })
            })
            .collect()
    }

    /// Every environment's lease and fence (those ever claimed).
    pub async fn leases(&self) -> Result<Vec<LeaseRecord>> {
        let rows: Vec<(String, Option<String>, i64, i64)> = match &self.db {
            Db::Sqlite(pool) => sqlx::query(
                "SELECT l.environment_id, l.holder, f.epoch, l.expires_at - $1 \
                 FROM env_leases l JOIN env_fences f ON f.environment_id = l.environment_id ORDER BY l.environment_id",
            )
            .bind(now_ms())
            .fetch_all(pool)
            .await
            .map_err(backend("listing leases"))?
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect(),
            Db::Postgres(pool) => sqlx::query(
                "SELECT l.environment_id, l.holder, f.epoch, \
                 CASE WHEN l.expires_at = '-infinity' THEN -9223372036854775807 \
                      ELSE (EXTRACT(EPOCH FROM l.expires_at - now()) * 1000)::bigint END \
                 FROM env_leases l JOIN env_fences f ON f.environment_id = l.environment_id ORDER BY l.environment_id",
            )
            .fetch_all(pool)
            .await
            .map_err(backend("listing leases"))?
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect(),
        };
        rows.into_iter()
            .map(|(env, holder, epoch, expires_in_ms)| {
                Ok(LeaseRecord {
                    env: env.parse().map_err(|_| StoreError::corrupt(format!("environment id {env:?}")))?,
                    holder: replica(holder),
                    epoch,
                    expires_in_ms,
                })
            })
            .collect()
    }
}

/// The fence's epoch, read inside `tx` with the row lock `lock` asks for.
macro_rules! current_epoch {
    ($tx:expr, $fence:expr, $lock:literal) => {
        sqlx::query_scalar::<_, i64>(concat!("SELECT epoch FROM env_fences WHERE environment_id = $1", $lock))
            .bind($fence.env.to_string())
            .fetch_optional(&mut **$tx)
            .await
            .map_err(backend_with(|| format!("reading the fence of environment {}", $fence.env)))?
    };
}

/// Reads the fence of `fence.env` inside `tx` with a row lock (`FOR SHARE`: a takeover waits
/// for `tx` to end) and refuses to go on under another epoch: the first statement of every
/// owner's write transaction on PostgreSQL.
pub(crate) async fn check_postgres(tx: &mut WriteTx<Postgres>, fence: &Fence) -> Result<()> {
    judge(fence, current_epoch!(tx, fence, " FOR SHARE"))
}

/// [`check_postgres`] on SQLite, where the write transaction (`BEGIN IMMEDIATE`) already holds
/// the database's one write lock.
pub(crate) async fn check_sqlite(tx: &mut WriteTx<Sqlite>, fence: &Fence) -> Result<()> {
    judge(fence, current_epoch!(tx, fence, ""))
}

fn judge(fence: &Fence, current: Option<Epoch>) -> Result<()> {
    match current {
        Some(epoch) if epoch == fence.epoch => Ok(()),
        current => Err(StoreError::Fenced {
            env: fence.env,
            epoch: fence.epoch,
            current,
        }),
    }
}

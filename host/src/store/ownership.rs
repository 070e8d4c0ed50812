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
    /// Records replica `id` (listening at `address`, running `version`) as alive, and forgets
    /// replicas not heard of for a day.
    pub async fn register_replica(&self, id: ReplicaId, address: &str, version: &str) -> Result<()> {
        let context = || format!("registering replica {id}");
        let forget = match &self.db {
            Db::Sqlite(_) => "DELETE FROM replicas WHERE heartbeat_at < $1",
            Db::Postgres(_) => "DELETE FROM replicas WHERE heartbeat_at < now() - make_interval(secs => $1::float8 / 1000)",
        };
        let day: i64 = 24 * 3600 * 1000;
        let bound = match &self.db {
            Db::Sqlite(_) => now_ms() - day,
            Db::Postgres(_) => day,
        };
        on_pool!(self, pool => {
            sqlx::query(forget).bind(bound).execute(pool).await.map_err(backend_with(context))?;
        });
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
    /// or is `me`'s own, or is held by `gone`: a replica known to have ended, see
    /// [`Store::is_gone`]): the lease for `ttl` and the next epoch, in one transaction that
    /// waits (at most 2 s) for the old owner's write transactions to end. `None`: another
    /// replica holds a lease that has not expired. (The 2 s bound is the transaction's
    /// `lock_timeout`: an old owner whose write outlasts it keeps the environment until the
    /// next claim.) Claiming what `me` holds starts a new epoch too: what an owner does after a
    /// write whose outcome it does not know, so that later reads either see that write or know
    /// it failed.
    pub async fn claim(&self, env: &EnvironmentId, me: ReplicaId, ttl: Duration, gone: Option<ReplicaId>) -> Result<Option<Fence>> {
        let context = || format!("claiming environment {env}");
        let (id, holder, ttl_ms) = (env.to_string(), me.to_string(), millis(ttl));
        let gone = gone.map(|g| g.to_string());
        // What differs: the clock the lease is judged by (SQLite: this process's, bound as $5).
        let (now, take) = match &self.db {
            Db::Sqlite(_) => (
                Some(now_ms()),
                "UPDATE env_leases SET holder = $2, expires_at = $5 + $3 \
                 WHERE environment_id = $1 AND (expires_at <= $5 OR holder IS NULL OR holder = $2 OR holder = $4)",
            ),
            Db::Postgres(_) => (
                None,
                "UPDATE env_leases SET holder = $2, expires_at = now() + make_interval(secs => $3::float8 / 1000) \
                 WHERE environment_id = $1 AND (expires_at <= now() OR holder IS NULL OR holder = $2 OR holder = $4)",
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
            let query = sqlx::query(take).bind(&id).bind(&holder).bind(ttl_ms).bind(&gone);
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
                let mut conn = pool.acquire().await.map_err(backend("renewing leases"))?;
                return renew_postgres(&mut conn, me, owned, ttl).await;
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
        self.lease_rows(None).await
    }

    /// Environment `env`'s lease and fence, if it was ever claimed.
    pub async fn lease(&self, env: &EnvironmentId) -> Result<Option<LeaseRecord>> {
        Ok(self.lease_rows(Some(env)).await?.pop())
    }

    /// Marks replica `id` draining: it hands over what it holds and claims nothing more, and
    /// the others count it out of the spread. `false`: no such replica.
    pub async fn set_draining(&self, id: ReplicaId) -> Result<bool> {
        let marked = on_pool!(self, pool => {
            sqlx::query("UPDATE replicas SET draining = TRUE WHERE id = $1")
                .bind(id.to_string())
                .execute(pool)
                .await
                .map_err(backend_with(|| format!("marking replica {id} draining")))?
                .rows_affected()
        });
        Ok(marked == 1)
    }

    async fn lease_rows(&self, env: Option<&EnvironmentId>) -> Result<Vec<LeaseRecord>> {
        let env = env.map(ToString::to_string);
        let rows: Vec<(String, Option<String>, i64, i64)> = match &self.db {
            Db::Sqlite(pool) => sqlx::query(
                "SELECT l.environment_id, l.holder, f.epoch, l.expires_at - $1 \
                 FROM env_leases l JOIN env_fences f ON f.environment_id = l.environment_id \
                 WHERE $2 IS NULL OR l.environment_id = $2 ORDER BY l.environment_id",
            )
            .bind(now_ms())
            .bind(&env)
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
                 FROM env_leases l JOIN env_fences f ON f.environment_id = l.environment_id \
                 WHERE $1::text IS NULL OR l.environment_id = $1 ORDER BY l.environment_id",
            )
            .bind(&env)
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

/// The advisory-lock class of replicas' presence locks (PostgreSQL; `"orcp"`).
const PRESENCE_CLASS: i32 = 0x6f72_6370;

/// A replica's presence lock key: its id folded to 32 bits. Two replicas folding alike only
/// make [`Store::is_gone`] answer `false` for one that ended (its leases then expire).
fn presence_key(id: ReplicaId) -> i32 {
    let bytes = id.as_uuid().as_bytes();
    let folded = bytes
        .chunks_exact(4)
        .fold(0u32, |acc, c| acc ^ u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
    folded as i32
}

/// A replica's presence: on PostgreSQL a session of its own holding the advisory lock of its
/// id, which the database lets go the moment that session ends (the process killed, its
/// socket closed), so the others know at once that its leases are free rather than after they
/// expire: the fast path of a failover. On SQLite, nothing: one process serves the database.
/// (Behind a pooler in transaction mode the lock means nothing; leases still expire.)
pub struct Presence {
    me: ReplicaId,
    session: tokio::sync::Mutex<Option<sqlx::PgConnection>>,
    store: Store,
}

impl Presence {
    /// [`Store::renew`] for this replica, on PostgreSQL on the presence's own session: a pool
    /// busy with the schedulers' writes never holds a renewal back. A session that fails is
    /// dropped (its lock with it) and taken again at the next call.
    pub async fn renew(&self, owned: &[EnvironmentId], ttl: Duration) -> Result<Vec<EnvironmentId>> {
        let Db::Postgres(pool) = &self.store.db else {
            return self.store.renew(self.me, owned, ttl).await;
        };
        let mut session = self.session.lock().await;
        if session.is_none() {
            *session = Some(lock_presence(pool, self.me).await?);
        }
        let conn = session.as_mut().expect("just taken");
        let renewed = renew_postgres(conn, self.me, owned, ttl).await;
        if renewed.is_err() {
            *session = None;
        }
        renewed
    }
}

/// [`Store::renew`] on PostgreSQL, on `conn`.
async fn renew_postgres(
    conn: &mut sqlx::PgConnection,
    me: ReplicaId,
    owned: &[EnvironmentId],
    ttl: Duration,
) -> Result<Vec<EnvironmentId>> {
    let holder = me.to_string();
    let ids: Vec<String> = owned.iter().map(ToString::to_string).collect();
    sqlx::query("UPDATE replicas SET heartbeat_at = now() WHERE id = $1")
        .bind(&holder)
        .execute(&mut *conn)
        .await
        .map_err(backend("renewing leases"))?;
    let renewed: Vec<String> = sqlx::query_scalar(
        "UPDATE env_leases SET expires_at = now() + make_interval(secs => $3::float8 / 1000) \
         WHERE holder = $1 AND environment_id = ANY($2) AND expires_at > now() RETURNING environment_id",
    )
    .bind(&holder)
    .bind(&ids)
    .bind(millis(ttl))
    .fetch_all(&mut *conn)
    .await
    .map_err(backend("renewing leases"))?;
    Ok(renewed.iter().filter_map(|id| id.parse().ok()).collect())
}

async fn lock_presence(pool: &sqlx::PgPool, me: ReplicaId) -> Result<sqlx::PgConnection> {
    let context = || format!("taking the presence lock of replica {me}");
    let mut conn = pool.acquire().await.map_err(backend_with(context))?.detach();
    sqlx::query("SELECT pg_advisory_lock($1, $2)")
        .bind(PRESENCE_CLASS)
        .bind(presence_key(me))
        .execute(&mut conn)
        .await
        .map_err(backend_with(context))?;
    Ok(conn)
}

impl Store {
    /// Takes replica `me`'s presence ([`Presence`]), held until it is dropped.
    pub async fn presence(&self, me: ReplicaId) -> Result<Presence> {
        let session = match &self.db {
            Db::Postgres(pool) => Some(lock_presence(pool, me).await?),
            Db::Sqlite(_) => None,
        };
        Ok(Presence {
            me,
            session: tokio::sync::Mutex::new(session),
            store: self.clone(),
        })
    }

    /// Whether replica `other` has ended: on PostgreSQL, its presence lock is free (tried and
    /// let go at once); on SQLite, always, since one process serves the database (its data
    /// directory is locked) and any other holder is an earlier start.
    pub async fn is_gone(&self, other: ReplicaId) -> Result<bool> {
        let context = || format!("looking for replica {other}");
        match &self.db {
            Db::Sqlite(_) => Ok(true),
            Db::Postgres(pool) => {
                let mut conn = pool.acquire().await.map_err(backend_with(context))?;
                let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
                    .bind(PRESENCE_CLASS)
                    .bind(presence_key(other))
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(backend_with(context))?;
                if free {
                    sqlx::query("SELECT pg_advisory_unlock($1, $2)")
                        .bind(PRESENCE_CLASS)
                        .bind(presence_key(other))
                        .execute(&mut *conn)
                        .await
                        .map_err(backend_with(context))?;
                }
                Ok(free)
            }
        }
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

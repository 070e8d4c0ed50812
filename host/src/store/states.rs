//! Resource states: batch upsert, batch status transitions, reads with filters and keyset
//! pagination, counts per status, and crash recovery of `deploying`; and `record_progress`, a
//! scheduler's batch — states, actions, a release's renewal, events — in one transaction.
//!
//! Batches are one transaction. PostgreSQL gets one statement per batch (`UNNEST` of one array
//! per column); SQLite gets multi-row statements of as many rows as its parameter limit allows.
//! A resource id given twice in one batch counts once, the last occurrence winning, on both
//! backends (PostgreSQL would refuse to touch a row twice in one statement).

use std::collections::HashSet;

use sqlx::{PgConnection, Postgres, QueryBuilder, Sqlite, SqliteConnection};

use super::actions;
use super::environments::environment_not_found;
use super::error::backend_with;
use super::events::{self, EventLog};
use super::ownership;
use super::{
    ActionRecord, Attempts, BeginWrite, Db, EnvironmentId, Fence, Millis, ResourceState, Result, StateFilter, StatePage, StatusChange,
    Store, StoreError, error_info, now_ms, page_size, parse_name, sqlite_keeps_prepared, sqlite_rows_per_statement,
};
use crate::status::ResourceStatus;

/// One batch of a scheduler, written in one transaction (under its owner's fence): the states
/// (a resource given twice counts once, the last winning), the actions, what a release in it
/// does to the stored states, and its events for the stream.
#[derive(Debug, Default, Clone, Copy)]
pub struct Progress<'a> {
    pub states: &'a [ResourceState],
    pub actions: &'a [ActionRecord],
    pub renewal: Option<Renewal<'a>>,
    pub events: Option<EventLog<'a>>,
    /// Forgets the environment's recorded events older than this (milliseconds).
    pub forget_events_before: Option<Millis>,
}

impl<'a> Progress<'a> {
    /// States and actions alone.
    pub fn of(states: &'a [ResourceState], actions: &'a [ActionRecord]) -> Progress<'a> {
        Progress {
            states,
            actions,
            ..Progress::default()
        }
    }

    fn is_empty(&self) -> bool {
        self.states.is_empty()
            && self.actions.is_empty()
            && self.renewal.is_none()
            && self.events.is_none()
            && self.forget_events_before.is_none()
    }
}

/// What a release does to the stored states, once every state it handed over is stored: a
/// `complete` one leaves only its own version's; otherwise the `dropped` go and the rest,
/// unchanged, now belong to `version`.
#[derive(Debug, Clone, Copy)]
pub struct Renewal<'a> {
    pub version: i64,
    pub complete: bool,
    pub dropped: &'a [String],
}

type Row = (
    String,
    String,
    String,
    String,
    Option<String>,
    String,
    i64,
    Option<i64>,
    Option<i64>,
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
);

macro_rules! columns {
    () => {
        "resource_id, resource_type, node, desired_hash, deployed_hash, status, version, last_deploy_at, \
         last_verified_at, attempts, error_code, error_message, next_retry_at"
    };
}

fn state(row: Row) -> Result<ResourceState> {
    let (
        resource_id,
        resource_type,
        node,
        desired_hash,
        deployed_hash,
        status,
        version,
        last_deploy_at,
        last_verified_at,
        attempts,
        error_code,
        error_message,
        next_retry_at,
    ) = row;
    Ok(ResourceState {
        status: parse_name(&status)?,
        resource_id,
        resource_type,
        node,
        desired_hash,
        deployed_hash,
        version,
        last_deploy_at,
        last_verified_at,
        attempts,
        last_error: error_info(error_code, error_message),
        next_retry_at,
    })
}

/// The items of `batch` with distinct keys, the last occurrence of each key winning, in the
/// order of those last occurrences.
fn last_per_key<T>(batch: &[T], key: impl Fn(&T) -> &str) -> Vec<&T> {
    let mut seen = HashSet::with_capacity(batch.len());
    let mut kept: Vec<&T> = batch.iter().rev().filter(|item| seen.insert(key(item))).collect();
    kept.reverse();
    kept
}

fn attempts_op(a: Attempts) -> i64 {
    match a {
        Attempts::Keep => 0,
        Attempts::Increment => 1,
        Attempts::Reset => -1,
    }
}

/// The `ON CONFLICT` clause of the upsert: every column from the new row, or the two times
/// given as expressions.
macro_rules! upsert_conflict {
    () => {
        upsert_conflict!("excluded.last_deploy_at", "excluded.last_verified_at")
    };
    ($last_deploy_at:literal, $last_verified_at:literal) => {
        concat!(
            " ON CONFLICT (environment_id, resource_id) DO UPDATE SET \
             resource_type = excluded.resource_type, node = excluded.node, desired_hash = excluded.desired_hash, \
             deployed_hash = excluded.deployed_hash, status = excluded.status, version = excluded.version, \
             last_deploy_at = ",
            $last_deploy_at,
            ", last_verified_at = ",
            $last_verified_at,
            ", attempts = excluded.attempts, error_code = excluded.error_code, error_message = excluded.error_message, \
             next_retry_at = excluded.next_retry_at, updated_at = excluded.updated_at"
        )
    };
}

const SET_STATUS: &str = "status = v.status, \
    deployed_hash = COALESCE(v.deployed_hash, s.deployed_hash), \
    last_deploy_at = COALESCE(v.last_deploy_at, s.last_deploy_at), \
    last_verified_at = COALESCE(v.last_verified_at, s.last_verified_at), \
    attempts = CASE WHEN v.attempts_op < 0 THEN 0 ELSE s.attempts + v.attempts_op END, \
    error_code = v.error_code, error_message = v.error_message, next_retry_at = v.next_retry_at";

const SET_STATUS_MATCH: &str = "s.resource_id = v.resource_id AND (v.if_version IS NULL OR s.version = v.if_version)";

/// What an upsert does with a state's `last_deploy_at` / `last_verified_at` when it is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Times {
    /// Write it as given: `None` clears the stored time.
    AsGiven,
    /// `None` keeps the stored time (the scheduler's "unchanged").
    KeepStored,
}

impl Times {
    fn conflict_clause(self) -> &'static str {
        match self {
            Times::AsGiven => upsert_conflict!(),
            Times::KeepStored => upsert_conflict!(
                "COALESCE(excluded.last_deploy_at, resource_states.last_deploy_at)",
                "COALESCE(excluded.last_verified_at, resource_states.last_verified_at)"
            ),
        }
    }
}

/// The upsert of [`Store::upsert_states`] on one SQLite connection (inside the caller's
/// transaction): multi-row statements of as many rows as the parameter limit allows.
pub(super) async fn upsert_sqlite(conn: &mut SqliteConnection, env: &EnvironmentId, states: &[&ResourceState], times: Times) -> Result<()> {
    let env_id = env.to_string();
    let now = now_ms();
    let context = || format!("storing {} resource states of environment {env}", states.len());
    for chunk in states.chunks(sqlite_rows_per_statement(15)) {
        let mut q = QueryBuilder::<Sqlite>::new(concat!(
            "INSERT INTO resource_states (environment_id, ",
            columns!(),
            ", updated_at) "
        ));
        q.push_values(chunk, |mut row, s| {
            row.push_bind(&env_id)
                .push_bind(&s.resource_id)
                .push_bind(&s.resource_type)
                .push_bind(&s.node)
                .push_bind(&s.desired_hash)
                .push_bind(s.deployed_hash.as_deref())
                .push_bind(s.status.as_str())
                .push_bind(s.version)
                .push_bind(s.last_deploy_at)
                .push_bind(s.last_verified_at)
                .push_bind(s.attempts)
                .push_bind(s.last_error.as_ref().map(|e| e.code.as_str()))
                .push_bind(s.last_error.as_ref().map(|e| e.message.as_str()))
                .push_bind(s.next_retry_at)
                .push_bind(now);
        });
        q.push(times.conflict_clause());
        // Batch statements are not cached (`persistent(false)`): their text varies with the chunk
        // size, and sqlx would keep each variant prepared per connection (~250 MB at 100,000 rows).
        q.build()
            .persistent(false)
            .execute(&mut *conn)
            .await
            .map_err(backend_with(context))?;
    }
    Ok(())
}

/// The upsert of [`Store::upsert_states`] on one PostgreSQL connection: one statement, `UNNEST`
/// of one array per column.
pub(super) async fn upsert_postgres(conn: &mut PgConnection, env: &EnvironmentId, states: &[&ResourceState], times: Times) -> Result<()> {
    let context = || format!("storing {} resource states of environment {env}", states.len());
    let sql = format!(
        concat!(
            "INSERT INTO resource_states (environment_id, ",
            columns!(),
            ", updated_at) SELECT $1, u.*, $2 FROM UNNEST($3::text[], $4::text[], $5::text[], $6::text[], \
             $7::text[], $8::text[], $9::int8[], $10::int8[], $11::int8[], $12::int8[], $13::text[], $14::text[], \
             $15::int8[]) AS u{}"
        ),
        times.conflict_clause()
    );
    sqlx::query::<Postgres>(sqlx::AssertSqlSafe(sql))
        .bind(env.to_string())
        .bind(now_ms())
        .bind(states.iter().map(|s| s.resource_id.as_str()).collect::<Vec<_>>())
        .bind(states.iter().map(|s| s.resource_type.as_str()).collect::<Vec<_>>())
        .bind(states.iter().map(|s| s.node.as_str()).collect::<Vec<_>>())
        .bind(states.iter().map(|s| s.desired_hash.as_str()).collect::<Vec<_>>())
        .bind(states.iter().map(|s| s.deployed_hash.as_deref()).collect::<Vec<_>>())
        .bind(states.iter().map(|s| s.status.as_str()).collect::<Vec<_>>())
        .bind(states.iter().map(|s| s.version).collect::<Vec<_>>())
        .bind(states.iter().map(|s| s.last_deploy_at).collect::<Vec<_>>())
        .bind(states.iter().map(|s| s.last_verified_at).collect::<Vec<_>>())
        .bind(states.iter().map(|s| s.attempts).collect::<Vec<_>>())
        .bind(
            states
                .iter()
                .map(|s| s.last_error.as_ref().map(|e| e.code.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(
            states
                .iter()
                .map(|s| s.last_error.as_ref().map(|e| e.message.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(states.iter().map(|s| s.next_retry_at).collect::<Vec<_>>())
        .execute(conn)
        .await
        .map_err(backend_with(context))?;
    Ok(())
}

impl Store {
    /// Inserts or replaces the states of `env` in one transaction. Every field is written as
    /// given (read first if you mean to keep some).
    pub async fn upsert_states(&self, env: &EnvironmentId, states: &[ResourceState]) -> Result<()> {
        if states.is_empty() {
            return Ok(());
        }
        match self.write_states(env, states).await {
            Err(e) if e.is_foreign_key_violation() => Err(environment_not_found(env)),
            other => other,
        }
    }

    async fn write_states(&self, env: &EnvironmentId, states: &[ResourceState]) -> Result<()> {
        let states = last_per_key(states, |s| &s.resource_id);
        let context = || format!("storing {} resource states of environment {env}", states.len());
        match &self.db {
            Db::Sqlite(pool) => {
                let mut tx = pool.begin_write().await.map_err(backend_with(context))?;
                upsert_sqlite(&mut tx, env, &states, Times::AsGiven).await?;
                tx.commit().await.map_err(backend_with(context))?;
            }
            Db::Postgres(pool) => {
                // One statement: atomic on its own, no explicit transaction needed.
                let mut conn = pool.acquire().await.map_err(backend_with(context))?;
                upsert_postgres(&mut conn, env, &states, Times::AsGiven).await?;
            }
        }
        Ok(())
    }

    /// One batch of a scheduler's progress, in one transaction, so that a crash keeps all of it
    /// or none: the states of `env` (the last one per resource counts; a `None`
    /// `last_deploy_at` / `last_verified_at` keeps the stored time, since the scheduler means
    /// "unchanged" by it) and the actions that led to them, appended in order. A state that
    /// says `deployed` is thus never stored without the action that deployed it.
    ///
    /// With a `fence` (the writer owns `env` under its epoch) nothing is written unless the
    /// epoch is still the environment's ([`StoreError::Fenced`]; see `ownership`).
    pub async fn record_progress(&self, env: &EnvironmentId, fence: Option<&Fence>, progress: &Progress<'_>) -> Result<()> {
        if progress.is_empty() {
            return Ok(());
        }
        match self.write_progress(env, fence, progress).await {
            Err(e) if e.is_foreign_key_violation() => Err(environment_not_found(env)),
            Err(e @ StoreError::Fenced { .. }) => {
                self.fenced_write();
                Err(e)
            }
            other => other,
        }
    }

    async fn write_progress(&self, env: &EnvironmentId, fence: Option<&Fence>, progress: &Progress<'_>) -> Result<()> {
        let states = last_per_key(progress.states, |s| &s.resource_id);
        let actions = progress.actions;
        let context = || {
            format!(
                "recording {} states and {} actions of environment {env}",
                states.len(),
                actions.len()
            )
        };
        let env_id = env.to_string();
        match &self.db {
            Db::Sqlite(pool) => {
                let mut tx = pool.begin_write().await.map_err(backend_with(context))?;
                if let Some(fence) = fence {
                    ownership::check_sqlite(&mut tx, fence).await?;
                }
                upsert_sqlite(&mut tx, env, &states, Times::KeepStored).await?;
                actions::insert_sqlite(&mut tx, actions).await?;
                if let Some(renewal) = &progress.renewal {
                    if renewal.complete {
                        sqlx::query(DELETE_OUTSIDE)
                            .bind(&env_id)
                            .bind(renewal.version)
                            .execute(&mut *tx)
                            .await
                            .map_err(backend_with(context))?;
                    } else {
                        renew_sqlite(&mut tx, &env_id, renewal.dropped, Some(renewal.version))
                            .await
                            .map_err(backend_with(context))?;
                    }
                }
                if let Some(log) = &progress.events {
                    events::insert_sqlite(&mut tx, env, log).await?;
                }
                if let Some(before) = progress.forget_events_before {
                    sqlx::query(events::FORGET)
                        .bind(&env_id)
                        .bind(before)
                        .execute(&mut *tx)
                        .await
                        .map_err(backend_with(context))?;
                }
                tx.commit().await.map_err(backend_with(context))?;
            }
            Db::Postgres(pool) => {
                let mut tx = pool.begin_write().await.map_err(backend_with(context))?;
                if let Some(fence) = fence {
                    ownership::check_postgres(&mut tx, fence).await?;
                }
                if !states.is_empty() {
                    upsert_postgres(&mut tx, env, &states, Times::KeepStored).await?;
                }
                actions::insert_postgres(&mut tx, actions).await?;
                if let Some(renewal) = &progress.renewal {
                    if renewal.complete {
                        sqlx::query::<Postgres>(DELETE_OUTSIDE)
                            .bind(&env_id)
                            .bind(renewal.version)
                            .execute(&mut *tx)
                            .await
                            .map_err(backend_with(context))?;
                    } else {
                        renew_postgres(&mut tx, &env_id, renewal.dropped, Some(renewal.version))
                            .await
                            .map_err(backend_with(context))?;
                    }
                }
                if let Some(log) = &progress.events {
                    events::insert_postgres(&mut tx, env, log).await?;
                }
                if let Some(before) = progress.forget_events_before {
                    sqlx::query::<Postgres>(events::FORGET)
                        .bind(&env_id)
                        .bind(before)
                        .execute(&mut *tx)
                        .await
                        .map_err(backend_with(context))?;
                }
                tx.commit().await.map_err(backend_with(context))?;
            }
        }
        Ok(())
    }

    /// Applies status transitions in one transaction; returns how many states changed (a change
    /// whose resource is unknown, or whose `if_version` no longer matches, changes nothing).
    pub async fn set_status(&self, env: &EnvironmentId, changes: &[StatusChange]) -> Result<u64> {
        if changes.is_empty() {
            return Ok(0);
        }
        let changes = last_per_key(changes, |c| &c.resource_id);
        let env_id = env.to_string();
        let now = now_ms();
        let context = || format!("changing the status of {} resources of environment {env}", changes.len());
        let mut changed = 0;
        match &self.db {
            Db::Sqlite(pool) => {
                let mut tx = pool.begin_write().await.map_err(backend_with(context))?;
                for chunk in changes.chunks(sqlite_rows_per_statement(10)) {
                    let mut q = QueryBuilder::<Sqlite>::new(
                        "WITH v (resource_id, status, deployed_hash, last_deploy_at, last_verified_at, attempts_op, \
                         error_code, error_message, next_retry_at, if_version) AS (",
                    );
                    q.push_values(chunk, |mut row, c| {
                        row.push_bind(&c.resource_id)
                            .push_bind(c.status.as_str())
                            .push_bind(c.deployed_hash.as_deref())
                            .push_bind(c.last_deploy_at)
                            .push_bind(c.last_verified_at)
                            .push_bind(attempts_op(c.attempts))
                            .push_bind(c.last_error.as_ref().map(|e| e.code.as_str()))
                            .push_bind(c.last_error.as_ref().map(|e| e.message.as_str()))
                            .push_bind(c.next_retry_at)
                            .push_bind(c.if_version);
                    });
                    q.push(") UPDATE resource_states AS s SET ")
                        .push(SET_STATUS)
                        .push(", updated_at = ")
                        .push_bind(now)
                        .push(" FROM v WHERE s.environment_id = ")
                        .push_bind(&env_id)
                        .push(" AND ")
                        .push(SET_STATUS_MATCH);
                    changed += q
                        .build()
                        .persistent(false)
                        .execute(&mut *tx)
                        .await
                        .map_err(backend_with(context))?
                        .rows_affected();
                }
                tx.commit().await.map_err(backend_with(context))?;
            }
            Db::Postgres(pool) => {
                let sql = format!(
                    "UPDATE resource_states AS s SET {SET_STATUS}, updated_at = $2 \
                     FROM UNNEST($3::text[], $4::text[], $5::text[], $6::int8[], $7::int8[], $8::int8[], $9::text[], \
                     $10::text[], $11::int8[], $12::int8[]) \
                     AS v (resource_id, status, deployed_hash, last_deploy_at, last_verified_at, attempts_op, \
                     error_code, error_message, next_retry_at, if_version) \
                     WHERE s.environment_id = $1 AND {SET_STATUS_MATCH}"
                );
                changed = sqlx::query::<Postgres>(sqlx::AssertSqlSafe(sql))
                    .bind(&env_id)
                    .bind(now)
                    .bind(changes.iter().map(|c| c.resource_id.as_str()).collect::<Vec<_>>())
                    .bind(changes.iter().map(|c| c.status.as_str()).collect::<Vec<_>>())
                    .bind(changes.iter().map(|c| c.deployed_hash.as_deref()).collect::<Vec<_>>())
                    .bind(changes.iter().map(|c| c.last_deploy_at).collect::<Vec<_>>())
                    .bind(changes.iter().map(|c| c.last_verified_at).collect::<Vec<_>>())
                    .bind(changes.iter().map(|c| attempts_op(c.attempts)).collect::<Vec<_>>())
                    .bind(
                        changes
                            .iter()
                            .map(|c| c.last_error.as_ref().map(|e| e.code.as_str()))
                            .collect::<Vec<_>>(),
                    )
                    .bind(
                        changes
                            .iter()
                            .map(|c| c.last_error.as_ref().map(|e| e.message.as_str()))
                            .collect::<Vec<_>>(),
                    )
                    .bind(changes.iter().map(|c| c.next_retry_at).collect::<Vec<_>>())
                    .bind(changes.iter().map(|c| c.if_version).collect::<Vec<_>>())
                    .execute(pool)
                    .await
                    .map_err(backend_with(context))?
                    .rows_affected();
            }
        }
        Ok(changed)
    }

    /// The state of one resource.
    pub async fn get_state(&self, env: &EnvironmentId, resource_id: &str) -> Result<ResourceState> {
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "SELECT ", columns!(), " FROM resource_states WHERE environment_id = $1 AND resource_id = $2"
            ))
            .bind(env.to_string())
            .bind(resource_id)
            .fetch_optional(pool)
            .await
            .map_err(backend_with(|| format!("reading the state of `{resource_id}` in environment {env}")))?
        });
        state(row.ok_or_else(|| StoreError::not_found(format!("resource `{resource_id}` in environment {env}")))?)
    }

    /// The states of the resources `resource_ids` that have one, in no particular order: a
    /// lookup by key, where a set's tasks are known (a filter on the id text reads every state).
    pub async fn states_of(&self, env: &EnvironmentId, resource_ids: &[String]) -> Result<Vec<ResourceState>> {
        if resource_ids.is_empty() {
            return Ok(Vec::new());
        }
        let env_id = env.to_string();
        let context = || format!("reading {} resource states of environment {env}", resource_ids.len());
        let mut rows: Vec<Row> = Vec::with_capacity(resource_ids.len());
        match &self.db {
            Db::Sqlite(pool) => {
                for chunk in resource_ids.chunks(sqlite_rows_per_statement(1) - 1) {
                    let mut q =
                        QueryBuilder::<Sqlite>::new(concat!("SELECT ", columns!(), " FROM resource_states WHERE environment_id = "));
                    q.push_bind(&env_id).push(" AND resource_id IN (");
                    let mut list = q.separated(", ");
                    for id in chunk {
                        list.push_bind(id);
                    }
                    q.push(")");
                    rows.extend(
                        q.build_query_as::<Row>()
                            .persistent(sqlite_keeps_prepared(chunk.len()))
                            .fetch_all(pool)
                            .await
                            .map_err(backend_with(context))?,
                    );
                }
            }
            Db::Postgres(pool) => {
                rows = sqlx::query_as::<Postgres, Row>(concat!(
                    "SELECT ",
                    columns!(),
                    " FROM resource_states WHERE environment_id = $1 AND resource_id = ANY($2)"
                ))
                .bind(&env_id)
                .bind(resource_ids)
                .fetch_all(pool)
                .await
                .map_err(backend_with(context))?;
            }
        }
        rows.into_iter().map(state).collect()
    }

    /// Every state of the environment, by resource id (for a scheduler loading its environment).
    pub async fn load_states(&self, env: &EnvironmentId) -> Result<Vec<ResourceState>> {
        let rows: Vec<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "SELECT ", columns!(), " FROM resource_states WHERE environment_id = $1 ORDER BY resource_id"
            ))
            .bind(env.to_string())
            .fetch_all(pool)
            .await
            .map_err(backend_with(|| format!("loading the states of environment {env}")))?
        });
        rows.into_iter().map(state).collect()
    }

    /// One page of states matching `filter`, by resource id.
    pub async fn list_states(&self, env: &EnvironmentId, filter: &StateFilter) -> Result<StatePage> {
        let limit = page_size(filter.limit);
        let text = filter.text.as_ref().map(|t| t.to_ascii_lowercase());
        // (condition with `?` for its parameter, value); `$1` is the environment.
        let mut conditions: Vec<(&str, &str)> = Vec::new();
        if let Some(status) = filter.status {
            conditions.push(("status = ?", status.as_str()));
        }
        if let Some(t) = &filter.resource_type {
            conditions.push(("resource_type = ?", t));
        }
        if let Some(node) = &filter.node {
            conditions.push(("node = ?", node));
        }
        if let Some(text) = &text {
            let find = match self.db {
                Db::Sqlite(_) => "instr(lower(resource_id), ?) > 0",
                Db::Postgres(_) => "strpos(lower(resource_id), ?) > 0",
            };
            conditions.push((find, text));
        }
        if let Some(after) = &filter.after {
            conditions.push(("resource_id > ?", after));
        }
        let mut sql = String::from(concat!("SELECT ", columns!(), " FROM resource_states WHERE environment_id = $1"));
        for (i, (condition, _)) in conditions.iter().enumerate() {
            sql.push_str(" AND ");
            sql.push_str(&condition.replace('?', &format!("${}", i + 2)));
        }
        sql.push_str(&format!(" ORDER BY resource_id LIMIT {}", limit + 1));
        let rows: Vec<Row> = on_pool!(self, pool => {
            let mut q = sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(env.to_string());
            for (_, value) in &conditions {
                q = q.bind(*value);
            }
            q.fetch_all(pool)
                .await
                .map_err(backend_with(|| format!("listing the states of environment {env}")))?
        });
        let mut items = rows.into_iter().map(state).collect::<Result<Vec<_>>>()?;
        let next_after = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(|s| s.resource_id.clone())
        } else {
            None
        };
        Ok(StatePage { items, next_after })
    }

    /// How many states of the environment are in each status (statuses with none are left out).
    pub async fn status_counts(&self, env: &EnvironmentId) -> Result<Vec<(ResourceStatus, i64)>> {
        let rows: Vec<(String, i64)> = on_pool!(self, pool => {
            sqlx::query_as("SELECT status, COUNT(*) FROM resource_states WHERE environment_id = $1 GROUP BY status")
                .bind(env.to_string())
                .fetch_all(pool)
                .await
                .map_err(backend_with(|| format!("counting the states of environment {env}")))?
        });
        let mut counts = rows
            .into_iter()
            .map(|(status, n)| Ok((parse_name(&status)?, n)))
            .collect::<Result<Vec<_>>>()?;
        counts.sort();
        Ok(counts)
    }

    /// Crash recovery: every state of `env` left `deploying` goes back to `available` (its action
    /// never finished, so it runs again). Returns their ids, sorted.
    pub async fn recover_deploying(&self, env: &EnvironmentId) -> Result<Vec<String>> {
        let mut ids: Vec<String> = on_pool!(self, pool => {
            sqlx::query_scalar(
                "UPDATE resource_states SET status = 'available', updated_at = $2 \
                 WHERE environment_id = $1 AND status = 'deploying' RETURNING resource_id",
            )
            .bind(env.to_string())
            .bind(now_ms())
            .fetch_all(pool)
            .await
            .map_err(backend_with(|| format!("recovering the deploying resources of environment {env}")))?
        });
        ids.sort();
        Ok(ids)
    }

    /// Removes the states of resources that left the intent; returns how many existed.
    pub async fn delete_states(&self, env: &EnvironmentId, resource_ids: &[String]) -> Result<u64> {
        let context = || format!("deleting {} resource states of environment {env}", resource_ids.len());
        let env_id = env.to_string();
        let deleted = match &self.db {
            Db::Sqlite(pool) => {
                let mut tx = pool.begin_write().await.map_err(backend_with(context))?;
                let deleted = renew_sqlite(&mut tx, &env_id, resource_ids, None)
                    .await
                    .map_err(backend_with(context))?;
                tx.commit().await.map_err(backend_with(context))?;
                deleted
            }
            Db::Postgres(pool) => {
                let mut tx = pool.begin_write().await.map_err(backend_with(context))?;
                let deleted = renew_postgres(&mut tx, &env_id, resource_ids, None)
                    .await
                    .map_err(backend_with(context))?;
                tx.commit().await.map_err(backend_with(context))?;
                deleted
            }
        };
        Ok(deleted)
    }
}

/// What a complete release does to the states: only its own version's stay.
const DELETE_OUTSIDE: &str = "DELETE FROM resource_states WHERE environment_id = $1 AND version <> $2";
/// What a release that handed over only what changed does to the states it kept.
const RENEW: &str = "UPDATE resource_states SET version = $2 WHERE environment_id = $1 AND version <> $2";

/// Deletes the states of `ids`, then (with `renew`) makes every other state of `env_id` belong
/// to that version; inside the caller's transaction. Returns how many were deleted.
async fn renew_sqlite(conn: &mut SqliteConnection, env_id: &str, ids: &[String], renew: Option<i64>) -> sqlx::Result<u64> {
    let mut deleted = 0;
    for chunk in ids.chunks(sqlite_rows_per_statement(1) - 1) {
        let mut q = QueryBuilder::<Sqlite>::new("DELETE FROM resource_states WHERE environment_id = ");
        q.push_bind(env_id).push(" AND resource_id IN (");
        let mut list = q.separated(", ");
        for id in chunk {
            list.push_bind(id);
        }
        q.push(")");
        deleted += q.build().persistent(false).execute(&mut *conn).await?.rows_affected();
    }
    if let Some(version) = renew {
        sqlx::query(RENEW).bind(env_id).bind(version).execute(&mut *conn).await?;
    }
    Ok(deleted)
}

/// [`renew_sqlite`] on PostgreSQL.
async fn renew_postgres(conn: &mut PgConnection, env_id: &str, ids: &[String], renew: Option<i64>) -> sqlx::Result<u64> {
    let mut deleted = 0;
    if !ids.is_empty() {
        deleted = sqlx::query::<Postgres>("DELETE FROM resource_states WHERE environment_id = $1 AND resource_id = ANY($2)")
            .bind(env_id)
            .bind(ids)
            .execute(&mut *conn)
            .await?
            .rows_affected();
    }
    if let Some(version) = renew {
        sqlx::query::<Postgres>(RENEW)
            .bind(env_id)
            .bind(version)
            .execute(&mut *conn)
            .await?;
    }
    Ok(deleted)
}

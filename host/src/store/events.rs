//! The environments' event streams as recorded (`event_batches`): each batch an owner's
//! scheduler writes carries its events, numbered, in the same transaction as the states and
//! actions they report ([`super::Progress::events`]). Every replica serves a stream from here,
//! and a client that lost its stream (or its replica) resumes after the last number it got.
//!
//! Numbers increase across owners: an owner numbers on from the last one recorded, and never
//! below `epoch × 2³²`, so a number handed out by an owner that was fenced off (and whose batch
//! was refused) is never handed out again for something else. Each batch names the last number
//! handed out before it (`prev_seq`), so a reader knows whether the batches it reads join on to
//! what it already has: they do not when events in between were forgotten (older than the
//! retention) or were never stored (a batch given up).

use sqlx::{PgConnection, Postgres, SqliteConnection};

use super::error::{backend, backend_with};
use super::{EnvironmentId, Epoch, Millis, Result, Store, StoreError};

/// Announces a recorded batch; the payload is its environment's id.
pub(super) const RECORDED: &str = "orc_events";

/// The first number an owner of `epoch` may hand out.
pub fn first_seq_of(epoch: Epoch) -> i64 {
    epoch.saturating_mul(1 << 32)
}

/// A batch's events as written: numbered `first_seq ..= last_seq`, one per line of `events`
/// (name, a space, the JSON).
#[derive(Debug, Clone, Copy)]
pub struct EventLog<'a> {
    pub first_seq: i64,
    pub last_seq: i64,
    /// The last number handed out before this batch (`None`: the environment's first).
    pub prev_seq: Option<i64>,
    pub events: &'a str,
    pub recorded_at: Millis,
}

/// A recorded batch, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedEvents {
    pub first_seq: i64,
    pub last_seq: i64,
    pub prev_seq: Option<i64>,
    events: String,
}

/// One recorded event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedEvent<'a> {
    pub seq: i64,
    pub name: &'a str,
    pub data: &'a str,
}

impl RecordedEvents {
    /// Its events in order; an error names the batch if the text is not what was written.
    pub fn events(&self) -> Result<Vec<RecordedEvent<'_>>> {
        let mut out = Vec::with_capacity((self.last_seq - self.first_seq + 1).max(0) as usize);
        for (i, line) in self.events.lines().enumerate() {
            let (name, data) = line.split_once(' ').ok_or_else(|| self.corrupt("a line without a name"))?;
            out.push(RecordedEvent {
                seq: self.first_seq + i as i64,
                name,
                data,
            });
        }
        if out.last().map(|e| e.seq) != Some(self.last_seq) {
            return Err(self.corrupt("fewer or more events than numbered"));
        }
        Ok(out)
    }

    /// Whether a reader that has every event up to `last` can read on with this batch: it
    /// starts at most one past `last`, or nothing was handed out between `last` and it.
    pub fn follows(&self, last: i64) -> bool {
        self.first_seq <= last + 1 || self.prev_seq.is_none_or(|prev| prev <= last)
    }

    fn corrupt(&self, what: &str) -> StoreError {
        StoreError::corrupt(format!("the recorded events {}–{}: {what}", self.first_seq, self.last_seq))
    }
}

/// Appends `log` to `env`'s stream, and (with `forget_before`) forgets its batches recorded
/// earlier; inside the caller's transaction.
pub(super) async fn insert_sqlite(conn: &mut SqliteConnection, env: &EnvironmentId, log: &EventLog<'_>) -> Result<()> {
    sqlx::query(INSERT)
        .bind(env.to_string())
        .bind(log.first_seq)
        .bind(log.last_seq)
        .bind(log.prev_seq)
        .bind(log.events)
        .bind(log.recorded_at)
        .execute(conn)
        .await
        .map_err(backend_with(|| context(env, log)))?;
    Ok(())
}

/// [`insert_sqlite`] on PostgreSQL, which also announces the batch (at the commit).
pub(super) async fn insert_postgres(conn: &mut PgConnection, env: &EnvironmentId, log: &EventLog<'_>) -> Result<()> {
    let env_id = env.to_string();
    sqlx::query::<Postgres>(INSERT)
        .bind(&env_id)
        .bind(log.first_seq)
        .bind(log.last_seq)
        .bind(log.prev_seq)
        .bind(log.events)
        .bind(log.recorded_at)
        .execute(&mut *conn)
        .await
        .map_err(backend_with(|| context(env, log)))?;
    sqlx::query::<Postgres>("SELECT pg_notify($1, $2)")
        .bind(RECORDED)
        .bind(&env_id)
        .execute(conn)
        .await
        .map_err(backend_with(|| context(env, log)))?;
    Ok(())
}

const INSERT: &str =
    "INSERT INTO event_batches (environment_id, first_seq, last_seq, prev_seq, events, recorded_at) VALUES ($1, $2, $3, $4, $5, $6)";

/// Forgets `env`'s batches recorded before `before`; inside the caller's transaction.
pub(super) const FORGET: &str = "DELETE FROM event_batches WHERE environment_id = $1 AND recorded_at < $2";

fn context(env: &EnvironmentId, log: &EventLog<'_>) -> String {
    format!("recording the events {}–{} of environment {env}", log.first_seq, log.last_seq)
}

impl Store {
    /// The last number recorded in `env`'s stream.
    pub async fn last_event_seq(&self, env: &EnvironmentId) -> Result<Option<i64>> {
        let last: Option<i64> = on_pool!(self, pool => {
            sqlx::query_scalar("SELECT MAX(last_seq) FROM event_batches WHERE environment_id = $1")
                .bind(env.to_string())
                .fetch_one(pool)
                .await
                .map_err(backend("reading the last recorded event"))?
        });
        Ok(last)
    }

    /// At most `limit` of `env`'s batches that hold events numbered above `after`, in order.
    pub async fn events_after(&self, env: &EnvironmentId, after: i64, limit: i64) -> Result<Vec<RecordedEvents>> {
        // The batch holding `after` (the last to start at or before it), then the ones after
        // it: both by the primary key.
        const SELECT: &str = "SELECT first_seq, last_seq, prev_seq, events FROM event_batches \
             WHERE environment_id = $1 AND last_seq > $2 AND first_seq >= \
             (SELECT COALESCE(MAX(first_seq), $2) FROM event_batches WHERE environment_id = $1 AND first_seq <= $2) \
             ORDER BY first_seq LIMIT $3";
        let rows: Vec<(i64, i64, Option<i64>, String)> = on_pool!(self, pool => {
            sqlx::query_as(SELECT)
                .bind(env.to_string())
                .bind(after)
                .bind(limit)
                .fetch_all(pool)
                .await
                .map_err(backend("reading recorded events"))?
        });
        Ok(rows
            .into_iter()
            .map(|(first_seq, last_seq, prev_seq, events)| RecordedEvents {
                first_seq,
                last_seq,
                prev_seq,
                events,
            })
            .collect())
    }
}

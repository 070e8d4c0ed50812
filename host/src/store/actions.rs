//! The action log: appended in batches, read newest first per resource or per environment with
//! filters, paged by insertion order (`seq`).

use sqlx::{PgConnection, Postgres, QueryBuilder, Sqlite, SqliteConnection};

use super::error::{backend, backend_with};
use super::{
    ActionFilter, ActionPage, ActionRecord, BeginWrite, Db, EnvironmentId, LoggedAction, Result, Store, StoreError, error_info, page_size,
    parse_id, parse_name, sqlite_rows_per_statement,
};

type Row = (
    i64,
    String,
    String,
    String,
    String,
    Option<i64>,
    i64,
    i64,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
);

macro_rules! columns {
    () => {
        "id, environment_id, resource_id, kind, version, started_at, finished_at, outcome, changes, messages, error_code, error_message"
    };
}

fn logged(row: Row) -> Result<LoggedAction> {
    let (seq, id, environment, resource_id, kind, version, started_at, finished_at, outcome, changes, messages, error_code, error_message) =
        row;
    Ok(LoggedAction {
        seq,
        action: ActionRecord {
            id: parse_id(&id, "action")?,
            environment: parse_id(&environment, "environment")?,
            resource_id,
            kind: parse_name(&kind)?,
            version,
            started_at,
            finished_at,
            outcome,
            changes,
            messages,
            error: error_info(error_code, error_message),
        },
    })
}

/// The append of [`Store::insert_actions`] on one SQLite connection (inside the caller's
/// transaction).
pub(super) async fn insert_sqlite(conn: &mut SqliteConnection, actions: &[ActionRecord]) -> Result<()> {
    let context = || format!("appending {} entries to the action log", actions.len());
    let ids: Vec<String> = actions.iter().map(|a| a.id.to_string()).collect();
    let envs: Vec<String> = actions.iter().map(|a| a.environment.to_string()).collect();
    let rows: Vec<(usize, &ActionRecord)> = actions.iter().enumerate().collect();
    for chunk in rows.chunks(sqlite_rows_per_statement(12)) {
        let mut q = QueryBuilder::<Sqlite>::new(concat!("INSERT INTO actions (", columns!(), ") "));
        q.push_values(chunk, |mut row, &(i, a)| {
            row.push_bind(&ids[i])
                .push_bind(&envs[i])
                .push_bind(&a.resource_id)
                .push_bind(a.kind.as_str())
                .push_bind(a.version)
                .push_bind(a.started_at)
                .push_bind(a.finished_at)
                .push_bind(&a.outcome)
                .push_bind(&a.changes)
                .push_bind(&a.messages)
                .push_bind(a.error.as_ref().map(|e| e.code.as_str()))
                .push_bind(a.error.as_ref().map(|e| e.message.as_str()));
        });
        q.build()
            .persistent(false)
            .execute(&mut *conn)
            .await
            .map_err(backend_with(context))?;
    }
    Ok(())
}

/// The append of [`Store::insert_actions`] on one PostgreSQL connection: one statement.
pub(super) async fn insert_postgres(conn: &mut PgConnection, actions: &[ActionRecord]) -> Result<()> {
    if actions.is_empty() {
        return Ok(());
    }
    let context = || format!("appending {} entries to the action log", actions.len());
    let ids: Vec<String> = actions.iter().map(|a| a.id.to_string()).collect();
    let envs: Vec<String> = actions.iter().map(|a| a.environment.to_string()).collect();
    // `WITH ORDINALITY … ORDER BY` keeps `seq` in the order of the batch.
    sqlx::query::<Postgres>(concat!(
        "INSERT INTO actions (",
        columns!(),
        ") SELECT id, environment_id, resource_id, kind, version, started_at, finished_at, outcome, changes, \
         messages, error_code, error_message FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], \
         $5::int8[], $6::int8[], $7::int8[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[]) \
         WITH ORDINALITY AS u (id, environment_id, resource_id, kind, version, started_at, finished_at, \
         outcome, changes, messages, error_code, error_message, n) ORDER BY n"
    ))
    .bind(&ids)
    .bind(&envs)
    .bind(actions.iter().map(|a| a.resource_id.as_str()).collect::<Vec<_>>())
    .bind(actions.iter().map(|a| a.kind.as_str()).collect::<Vec<_>>())
    .bind(actions.iter().map(|a| a.version).collect::<Vec<_>>())
    .bind(actions.iter().map(|a| a.started_at).collect::<Vec<_>>())
    .bind(actions.iter().map(|a| a.finished_at).collect::<Vec<_>>())
    .bind(actions.iter().map(|a| a.outcome.as_str()).collect::<Vec<_>>())
    .bind(actions.iter().map(|a| a.changes.as_str()).collect::<Vec<_>>())
    .bind(actions.iter().map(|a| a.messages.as_str()).collect::<Vec<_>>())
    .bind(
        actions
            .iter()
            .map(|a| a.error.as_ref().map(|e| e.code.as_str()))
            .collect::<Vec<_>>(),
    )
    .bind(
        actions
            .iter()
            .map(|a| a.error.as_ref().map(|e| e.message.as_str()))
            .collect::<Vec<_>>(),
    )
    .execute(conn)
    .await
    .map_err(backend_with(context))?;
    Ok(())
}

impl Store {
    /// How many action-log entries of the environment started in `[since, until)`, per outcome.
    pub async fn count_actions(&self, env: &EnvironmentId, since: super::Millis, until: super::Millis) -> Result<Vec<(String, i64)>> {
        on_pool!(self, pool => {
            sqlx::query_as(
                "SELECT outcome, COUNT(*) FROM actions WHERE environment_id = $1 AND started_at >= $2 AND started_at < $3 \
                 GROUP BY outcome ORDER BY outcome",
            )
            .bind(env.to_string())
            .bind(since)
            .bind(until)
            .fetch_all(pool)
            .await
            .map_err(backend_with(|| format!("counting the actions of environment {env}")))
        })
    }

    /// Appends `actions` (of any environments) in one transaction, in the given order.
    pub async fn insert_actions(&self, actions: &[ActionRecord]) -> Result<()> {
        if actions.is_empty() {
            return Ok(());
        }
        match self.write_actions(actions).await {
            Err(e) if e.is_foreign_key_violation() => {
                let mut envs: Vec<String> = actions.iter().map(|a| a.environment.to_string()).collect();
                envs.sort();
                envs.dedup();
                Err(StoreError::not_found(format!("one of the environments {}", envs.join(", "))))
            }
            other => other,
        }
    }

    async fn write_actions(&self, actions: &[ActionRecord]) -> Result<()> {
        let context = || format!("appending {} entries to the action log", actions.len());
        match &self.db {
            Db::Sqlite(pool) => {
                let mut tx = pool.begin_write().await.map_err(backend_with(context))?;
                insert_sqlite(&mut tx, actions).await?;
                tx.commit().await.map_err(backend_with(context))?;
            }
            Db::Postgres(pool) => {
                // One statement: atomic on its own.
                let mut conn = pool.acquire().await.map_err(backend_with(context))?;
                insert_postgres(&mut conn, actions).await?;
            }
        }
        Ok(())
    }

    /// The latest `limit` entries of one resource, newest first.
    pub async fn resource_actions(&self, env: &EnvironmentId, resource_id: &str, limit: u32) -> Result<Vec<LoggedAction>> {
        let filter = ActionFilter {
            resource_id: Some(resource_id.to_string()),
            limit,
            ..ActionFilter::default()
        };
        Ok(self.list_actions(env, &filter).await?.items)
    }

    /// One page of the environment's log matching `filter`, newest first.
    pub async fn list_actions(&self, env: &EnvironmentId, filter: &ActionFilter) -> Result<ActionPage> {
        enum Arg<'a> {
            Text(&'a str),
            Int(i64),
        }
        let limit = page_size(filter.limit);
        let mut conditions: Vec<(&str, Arg)> = Vec::new();
        if let Some(r) = &filter.resource_id {
            conditions.push(("resource_id = ?", Arg::Text(r)));
        }
        if let Some(kind) = filter.kind {
            conditions.push(("kind = ?", Arg::Text(kind.as_str())));
        }
        if let Some(outcome) = &filter.outcome {
            conditions.push(("outcome = ?", Arg::Text(outcome)));
        }
        if let Some(version) = filter.version {
            conditions.push(("version = ?", Arg::Int(version)));
        }
        if let Some(since) = filter.since {
            conditions.push(("started_at >= ?", Arg::Int(since)));
        }
        if let Some(until) = filter.until {
            conditions.push(("started_at < ?", Arg::Int(until)));
        }
        if let Some(before) = filter.before {
            conditions.push(("seq < ?", Arg::Int(before)));
        }
        let mut sql = String::from(concat!("SELECT seq, ", columns!(), " FROM actions WHERE environment_id = $1"));
        for (i, (condition, _)) in conditions.iter().enumerate() {
            sql.push_str(" AND ");
            sql.push_str(&condition.replace('?', &format!("${}", i + 2)));
        }
        sql.push_str(&format!(" ORDER BY seq DESC LIMIT {}", limit + 1));
        let rows: Vec<Row> = on_pool!(self, pool => {
            let mut q = sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(env.to_string());
            for (_, arg) in &conditions {
                q = match *arg {
                    Arg::Text(t) => q.bind(t),
                    Arg::Int(n) => q.bind(n),
                };
            }
            q.fetch_all(pool).await.map_err(backend("reading the action log"))?
        });
        let mut items = rows.into_iter().map(logged).collect::<Result<Vec<_>>>()?;
        let next_before = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(|a| a.seq)
        } else {
            None
        };
        Ok(ActionPage { items, next_before })
    }
}

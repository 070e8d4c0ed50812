//! User-triggered deploys and repairs: created `running`, completed once with their result (JSON
//! text), or marked `interrupted` when the host stopped first. Also the action-log counts their
//! results are made of.

use super::error::backend_with;
use super::{
    DryrunStatus, EnvironmentId, Millis, Operation, OperationId, OperationKind, OperationStatus, Result, Store, StoreError, now_ms,
    parse_name,
};

type Row = (String, String, i64, Option<i64>, Option<String>);

macro_rules! columns {
    () => {
        "kind, status, created_at, finished_at, result"
    };
}

fn operation(env: &EnvironmentId, id: OperationId, row: Row) -> Result<Operation> {
    let (kind, status, created_at, finished_at, result) = row;
    Ok(Operation {
        id,
        environment: *env,
        kind: parse_name(&kind)?,
        status: parse_name(&status)?,
        created_at,
        finished_at,
        result,
    })
}

impl Store {
    /// Records a new `running` operation.
    pub async fn create_operation(&self, env: &EnvironmentId, kind: OperationKind) -> Result<Operation> {
        let op = Operation {
            id: OperationId::random(),
            environment: *env,
            kind,
            status: OperationStatus::Running,
            created_at: now_ms(),
            finished_at: None,
            result: None,
        };
        let inserted = on_pool!(self, pool => {
            sqlx::query("INSERT INTO operations (id, environment_id, kind, status, created_at) VALUES ($1, $2, $3, 'running', $4)")
                .bind(op.id.to_string())
                .bind(env.to_string())
                .bind(kind.as_str())
                .bind(op.created_at)
                .execute(pool)
                .await
                .map(|done| done.rows_affected())
        });
        match inserted {
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => Err(StoreError::not_found(format!("environment {env}"))),
            Err(e) => Err(backend_with(|| format!("recording a {kind} of environment {env}"))(e)),
            Ok(_) => Ok(op),
        }
    }

    /// Finishes a running operation as `done` with its result. An operation finishes once.
    pub async fn complete_operation(&self, env: &EnvironmentId, id: &OperationId, result_json: &str) -> Result<Operation> {
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "UPDATE operations SET status = 'done', finished_at = $3, result = $4 ",
                "WHERE id = $1 AND environment_id = $2 AND status = 'running' RETURNING ", columns!()
            ))
            .bind(id.to_string())
            .bind(env.to_string())
            .bind(now_ms())
            .bind(result_json)
            .fetch_optional(pool)
            .await
            .map_err(backend_with(|| format!("completing operation {id} of environment {env}")))?
        });
        match row {
            Some(row) => operation(env, *id, row),
            None => {
                let existing = self.get_operation(env, id).await?;
                Err(StoreError::Conflict {
                    what: format!("operation {id} of environment {env} is already {}", existing.status),
                })
            }
        }
    }

    /// Ends a running operation as `interrupted` with `result_json` (why): it will not
    /// complete (its scheduler stopped). An operation that already ended is left as it is.
    pub async fn interrupt_operation(&self, env: &EnvironmentId, id: &OperationId, result_json: &str) -> Result<()> {
        on_pool!(self, pool => {
            sqlx::query("UPDATE operations SET status = $3, finished_at = $4, result = $5 WHERE id = $1 AND environment_id = $2 AND status = 'running'")
                .bind(id.to_string())
                .bind(env.to_string())
                .bind(OperationStatus::Interrupted.as_str())
                .bind(now_ms())
                .bind(result_json)
                .execute(pool)
                .await
                .map_err(backend_with(|| format!("interrupting operation {id} of environment {env}")))?;
        });
        Ok(())
    }

    pub async fn get_operation(&self, env: &EnvironmentId, id: &OperationId) -> Result<Operation> {
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!("SELECT ", columns!(), " FROM operations WHERE id = $1 AND environment_id = $2"))
                .bind(id.to_string())
                .bind(env.to_string())
                .fetch_optional(pool)
                .await
                .map_err(backend_with(|| format!("reading operation {id} of environment {env}")))?
        });
        operation(
            env,
            *id,
            row.ok_or_else(|| StoreError::not_found(format!("operation {id} of environment {env}")))?,
        )
    }

    /// At start: what was running when the host stopped will never finish. Operations become
    /// `interrupted`, dryruns `failed` with `report_json`. Returns how many of each.
    pub async fn interrupt_unfinished(&self, env: &EnvironmentId, report_json: &str) -> Result<(u64, u64)> {
        let now = now_ms();
        on_pool!(self, pool => {
            let operations = sqlx::query("UPDATE operations SET status = $2, finished_at = $3 WHERE environment_id = $1 AND status = 'running'")
                .bind(env.to_string())
                .bind(OperationStatus::Interrupted.as_str())
                .bind(now)
                .execute(pool)
                .await
                .map_err(backend_with(|| format!("interrupting the operations of environment {env}")))?
                .rows_affected();
            let dryruns = sqlx::query(
                "UPDATE dryruns SET status = $2, finished_at = $3, report = $4 WHERE environment_id = $1 AND status = 'running'",
            )
            .bind(env.to_string())
            .bind(DryrunStatus::Failed.as_str())
            .bind(now)
            .bind(report_json)
            .execute(pool)
            .await
            .map_err(backend_with(|| format!("interrupting the dryruns of environment {env}")))?
            .rows_affected();
            Ok((operations, dryruns))
        })
    }

    /// How many action-log entries of the environment started in `[since, until)`, per outcome.
    pub async fn count_actions(&self, env: &EnvironmentId, since: Millis, until: Millis) -> Result<Vec<(String, i64)>> {
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
}

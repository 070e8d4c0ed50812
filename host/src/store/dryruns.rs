//! Dryrun reports: created `running` for a version, completed once (`done` or `failed`) with the
//! report (JSON text), read back by id or listed per environment.

use super::error::backend_with;
use super::{DryrunId, DryrunReport, DryrunStatus, EnvironmentId, Result, Store, StoreError, now_ms, parse_name};

type Row = (i64, String, i64, Option<i64>, Option<String>);

macro_rules! columns {
    () => {
        "version, status, created_at, finished_at, report"
    };
}

fn report(env: &EnvironmentId, id: DryrunId, row: Row) -> Result<DryrunReport> {
    let (version, status, created_at, finished_at, report) = row;
    Ok(DryrunReport {
        id,
        environment: *env,
        version,
        status: parse_name(&status)?,
        created_at,
        finished_at,
        report,
    })
}

fn dryrun_not_found(env: &EnvironmentId, id: &DryrunId) -> StoreError {
    StoreError::not_found(format!("dryrun {id} of environment {env}"))
}

impl Store {
    /// Records a new `running` dryrun of `version`, which must exist.
    pub async fn create_dryrun(&self, env: &EnvironmentId, version: i64) -> Result<DryrunReport> {
        let id = DryrunId::random();
        let now = now_ms();
        let inserted = on_pool!(self, pool => {
            sqlx::query("INSERT INTO dryruns (id, environment_id, version, status, created_at) VALUES ($1, $2, $3, 'running', $4)")
                .bind(id.to_string())
                .bind(env.to_string())
                .bind(version)
                .bind(now)
                .execute(pool)
                .await
                .map(|done| done.rows_affected())
        });
        match inserted {
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => {
                Err(StoreError::not_found(format!("version {version} of environment {env}")))
            }
            Err(e) => Err(backend_with(|| {
                format!("creating a dryrun of version {version} of environment {env}")
            })(e)),
            Ok(_) => Ok(DryrunReport {
                id,
                environment: *env,
                version,
                status: DryrunStatus::Running,
                created_at: now,
                finished_at: None,
                report: None,
            }),
        }
    }

    /// Finishes a running dryrun as `done` or `failed` with its report. A dryrun finishes once.
    pub async fn complete_dryrun(
        &self,
        env: &EnvironmentId,
        id: &DryrunId,
        status: DryrunStatus,
        report_json: &str,
    ) -> Result<DryrunReport> {
        if status == DryrunStatus::Running {
            return Err(StoreError::Conflict {
                what: format!("dryrun {id} cannot be completed as `running`"),
            });
        }
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "UPDATE dryruns SET status = $3, finished_at = $4, report = $5 ",
                "WHERE id = $1 AND environment_id = $2 AND status = 'running' RETURNING ", columns!()
            ))
            .bind(id.to_string())
            .bind(env.to_string())
            .bind(status.as_str())
            .bind(now_ms())
            .bind(report_json)
            .fetch_optional(pool)
            .await
            .map_err(backend_with(|| format!("completing dryrun {id} of environment {env}")))?
        });
        match row {
            Some(row) => report(env, *id, row),
            None => {
                let existing = self.get_dryrun(env, id).await?;
                Err(StoreError::Conflict {
                    what: format!("dryrun {id} of environment {env} is already {}", existing.status),
                })
            }
        }
    }

    pub async fn get_dryrun(&self, env: &EnvironmentId, id: &DryrunId) -> Result<DryrunReport> {
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!("SELECT ", columns!(), " FROM dryruns WHERE id = $1 AND environment_id = $2"))
                .bind(id.to_string())
                .bind(env.to_string())
                .fetch_optional(pool)
                .await
                .map_err(backend_with(|| format!("reading dryrun {id} of environment {env}")))?
        });
        report(env, *id, row.ok_or_else(|| dryrun_not_found(env, id))?)
    }

    /// The environment's dryruns, newest first, without their reports.
    pub async fn list_dryruns(&self, env: &EnvironmentId) -> Result<Vec<DryrunReport>> {
        let rows: Vec<(String, i64, String, i64, Option<i64>)> = on_pool!(self, pool => {
            sqlx::query_as(
                "SELECT id, version, status, created_at, finished_at FROM dryruns WHERE environment_id = $1 \
                 ORDER BY created_at DESC, id",
            )
            .bind(env.to_string())
            .fetch_all(pool)
            .await
            .map_err(backend_with(|| format!("listing the dryruns of environment {env}")))?
        });
        rows.into_iter()
            .map(|(id, version, status, created_at, finished_at)| {
                report(
                    env,
                    super::parse_id(&id, "dryrun")?,
                    (version, status, created_at, finished_at, None),
                )
            })
            .collect()
    }
}

//! The environment's background jobs, in one table (`jobs`): user deploys and repairs
//! ([`Operation`]) and dryruns ([`DryrunReport`]). Every job is created `running`, finished
//! once with its result (JSON text) — finishing one that already ended is a conflict — or ended
//! by [`Store::interrupt_unfinished`] when the host starts again. The SQL is written once here;
//! each kind reads back as its own record ([`JobRecord`]).

use super::error::backend_with;
use super::{
    DryrunId, DryrunReport, DryrunStatus, EnvironmentId, Operation, OperationId, OperationKind, OperationStatus, Result, Store, StoreError,
    now_ms, parse_name,
};

/// A `jobs` row: kind, version, status, created_at, finished_at, result, author.
type Row = (String, Option<i64>, String, i64, Option<i64>, Option<String>, Option<String>);
/// A `jobs` row as listed: id, version, status, created_at, finished_at, author.
type Listed = (String, Option<i64>, String, i64, Option<i64>, Option<String>);

macro_rules! columns {
    () => {
        "kind, version, status, created_at, finished_at, result, author"
    };
}

/// A kind of job as its own record, read from a `jobs` row.
pub(crate) trait JobRecord: Sized {
    /// What it is called in messages (`operation`, `dryrun`).
    const WHAT: &'static str;
    /// Whether a row of `kind` is one of these.
    fn is(kind: &str) -> bool;
    fn from_row(env: &EnvironmentId, id: uuid::Uuid, row: Row) -> Result<Self>;
    /// Its status, by name (for conflict messages).
    fn status_name(&self) -> &'static str;
}

impl JobRecord for Operation {
    fn status_name(&self) -> &'static str {
        self.status.as_str()
    }

    const WHAT: &'static str = "operation";

    fn is(kind: &str) -> bool {
        kind != "dryrun"
    }

    fn from_row(env: &EnvironmentId, id: uuid::Uuid, row: Row) -> Result<Operation> {
        let (kind, _, status, created_at, finished_at, result, author) = row;
        Ok(Operation {
            id: OperationId::from(id),
            environment: *env,
            kind: parse_name(&kind)?,
            status: parse_name(&status)?,
            created_at,
            finished_at,
            result,
            author,
        })
    }
}

impl JobRecord for DryrunReport {
    fn status_name(&self) -> &'static str {
        self.status.as_str()
    }

    const WHAT: &'static str = "dryrun";

    fn is(kind: &str) -> bool {
        kind == "dryrun"
    }

    fn from_row(env: &EnvironmentId, id: uuid::Uuid, row: Row) -> Result<DryrunReport> {
        let (_, version, status, created_at, finished_at, report, author) = row;
        Ok(DryrunReport {
            id: DryrunId::from(id),
            environment: *env,
            version: version.ok_or_else(|| StoreError::corrupt(format!("dryrun {id} names no version")))?,
            status: parse_name(&status)?,
            created_at,
            finished_at,
            report,
            author,
        })
    }
}

fn not_found<J: JobRecord>(env: &EnvironmentId, id: &uuid::Uuid) -> StoreError {
    StoreError::not_found(format!("{} {id} of environment {env}", J::WHAT))
}

impl Store {
    /// Records a new `running` job; a dryrun's version must exist.
    async fn insert_job<J: JobRecord>(&self, env: &EnvironmentId, kind: &str, version: Option<i64>, author: Option<&str>) -> Result<J> {
        let id = uuid::Uuid::new_v4();
        let now = now_ms();
        let inserted = on_pool!(self, pool => {
            sqlx::query("INSERT INTO jobs (id, environment_id, kind, version, status, created_at, author) VALUES ($1, $2, $3, $4, 'running', $5, $6)")
                .bind(id.hyphenated().to_string())
                .bind(env.to_string())
                .bind(kind)
                .bind(version)
                .bind(now)
                .bind(author)
                .execute(pool)
                .await
                .map(|done| done.rows_affected())
        });
        match inserted {
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => Err(StoreError::not_found(match version {
                Some(v) => format!("version {v} of environment {env}"),
                None => format!("environment {env}"),
            })),
            Err(e) => Err(backend_with(|| format!("recording a {kind} of environment {env}"))(e)),
            Ok(_) => J::from_row(
                env,
                id,
                (
                    kind.to_string(),
                    version,
                    "running".into(),
                    now,
                    None,
                    None,
                    author.map(str::to_string),
                ),
            ),
        }
    }

    /// Ends a running job as `status` with `result_json`. A job ends once: `None` when it had
    /// already ended (or is not there).
    async fn end_job(&self, env: &EnvironmentId, id: &uuid::Uuid, status: &str, result_json: &str) -> Result<Option<Row>> {
        on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "UPDATE jobs SET status = $3, finished_at = $4, result = $5 ",
                "WHERE id = $1 AND environment_id = $2 AND status = 'running' RETURNING ", columns!()
            ))
            .bind(id.hyphenated().to_string())
            .bind(env.to_string())
            .bind(status)
            .bind(now_ms())
            .bind(result_json)
            .fetch_optional(pool)
            .await
            .map_err(backend_with(|| format!("ending job {id} of environment {env}")))
        })
    }

    /// Ends a running job of kind `J` as `status`; a job that already ended is a conflict.
    async fn complete_job<J: JobRecord>(&self, env: &EnvironmentId, id: &uuid::Uuid, status: &str, result_json: &str) -> Result<J> {
        match self.end_job(env, id, status, result_json).await? {
            Some(row) if J::is(&row.0) => J::from_row(env, *id, row),
            Some(_) => Err(not_found::<J>(env, id)),
            None => {
                let existing: J = self.job(env, id).await?;
                Err(StoreError::Conflict {
                    what: format!("{} {id} of environment {env} is already {}", J::WHAT, existing.status_name()),
                })
            }
        }
    }

    async fn job<J: JobRecord>(&self, env: &EnvironmentId, id: &uuid::Uuid) -> Result<J> {
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!("SELECT ", columns!(), " FROM jobs WHERE id = $1 AND environment_id = $2"))
                .bind(id.hyphenated().to_string())
                .bind(env.to_string())
                .fetch_optional(pool)
                .await
                .map_err(backend_with(|| format!("reading {} {id} of environment {env}", J::WHAT)))?
        });
        match row {
            Some(row) if J::is(&row.0) => J::from_row(env, *id, row),
            _ => Err(not_found::<J>(env, id)),
        }
    }

    /// The environment's jobs of `kind`, newest first, without their results.
    async fn jobs<J: JobRecord>(&self, env: &EnvironmentId, kind: &str) -> Result<Vec<J>> {
        let rows: Vec<Listed> = on_pool!(self, pool => {
            sqlx::query_as(
                "SELECT id, version, status, created_at, finished_at, author FROM jobs WHERE environment_id = $1 AND kind = $2 \
                 ORDER BY created_at DESC, id",
            )
            .bind(env.to_string())
            .bind(kind)
            .fetch_all(pool)
            .await
            .map_err(backend_with(|| format!("listing the {kind} jobs of environment {env}")))?
        });
        rows.into_iter()
            .map(|(id, version, status, created_at, finished_at, author)| {
                let id = super::parse_id(&id, J::WHAT)?;
                J::from_row(env, id, (kind.to_string(), version, status, created_at, finished_at, None, author))
            })
            .collect()
    }

    /// Records a new `running` operation.
    pub async fn create_operation(&self, env: &EnvironmentId, kind: OperationKind, author: Option<&str>) -> Result<Operation> {
        self.insert_job(env, kind.as_str(), None, author).await
    }

    /// Finishes a running operation as `done` with its result. An operation finishes once.
    pub async fn complete_operation(&self, env: &EnvironmentId, id: &OperationId, result_json: &str) -> Result<Operation> {
        self.complete_job(env, id.as_uuid(), OperationStatus::Done.as_str(), result_json)
            .await
    }

    /// Ends a running operation as `interrupted` with `result_json` (why): it will not
    /// complete (its scheduler stopped). An operation that already ended is left as it is.
    pub async fn interrupt_operation(&self, env: &EnvironmentId, id: &OperationId, result_json: &str) -> Result<()> {
        self.end_job(env, id.as_uuid(), OperationStatus::Interrupted.as_str(), result_json)
            .await?;
        Ok(())
    }

    pub async fn get_operation(&self, env: &EnvironmentId, id: &OperationId) -> Result<Operation> {
        self.job(env, id.as_uuid()).await
    }

    /// Records a new `running` dryrun of `version`, which must exist.
    pub async fn create_dryrun(&self, env: &EnvironmentId, version: i64, author: Option<&str>) -> Result<DryrunReport> {
        self.insert_job(env, "dryrun", Some(version), author).await
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
        self.complete_job(env, id.as_uuid(), status.as_str(), report_json).await
    }

    pub async fn get_dryrun(&self, env: &EnvironmentId, id: &DryrunId) -> Result<DryrunReport> {
        self.job(env, id.as_uuid()).await
    }

    /// The environment's dryruns, newest first, without their reports.
    pub async fn list_dryruns(&self, env: &EnvironmentId) -> Result<Vec<DryrunReport>> {
        self.jobs(env, "dryrun").await
    }

    /// At start: what was running when the host stopped will never finish. Operations become
    /// `interrupted`, dryruns `failed`, both with `report_json` (why). Returns how many of each.
    pub async fn interrupt_unfinished(&self, env: &EnvironmentId, report_json: &str) -> Result<(u64, u64)> {
        let now = now_ms();
        let ended: Vec<(String,)> = on_pool!(self, pool => {
            sqlx::query_as(
                "UPDATE jobs SET status = CASE WHEN kind = 'dryrun' THEN $2 ELSE $3 END, finished_at = $4, result = $5 \
                 WHERE environment_id = $1 AND status = 'running' RETURNING kind",
            )
            .bind(env.to_string())
            .bind(DryrunStatus::Failed.as_str())
            .bind(OperationStatus::Interrupted.as_str())
            .bind(now)
            .bind(report_json)
            .fetch_all(pool)
            .await
            .map_err(backend_with(|| format!("interrupting the jobs of environment {env}")))?
        });
        let dryruns = ended.iter().filter(|(kind,)| kind == "dryrun").count() as u64;
        Ok((ended.len() as u64 - dryruns, dryruns))
    }
}

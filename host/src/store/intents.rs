//! Intent versions: submitted documents, numbered 1, 2, 3… per environment, immutable once
//! stored; one of them is the released (active) version.
//!
//! The next number comes from `environments.latest_version`, incremented by an `UPDATE … RETURNING`
//! in the transaction that inserts the version. The row lock (PostgreSQL) or the write lock
//! (SQLite, `BEGIN IMMEDIATE`) makes concurrent submits take turns, so each gets its own
//! number and the numbers have no gaps.

use super::environments::environment_not_found;
use super::error::backend_with;
use super::{BeginWrite, EnvironmentId, IntentVersion, Result, Store, StoreError, VersionInfo, now_ms};

fn version_not_found(env: &EnvironmentId, version: i64) -> StoreError {
    StoreError::not_found(format!("version {version} of environment {env}"))
}

impl Store {
    /// How many versions of the environment were made at or after `since`, and when the oldest
    /// of them was.
    pub async fn versions_since(&self, env: &EnvironmentId, since: super::Millis) -> Result<(i64, Option<super::Millis>)> {
        on_pool!(self, pool => {
            sqlx::query_as("SELECT COUNT(*), MIN(created_at) FROM intent_versions WHERE environment_id = $1 AND created_at >= $2")
                .bind(env.to_string())
                .bind(since)
                .fetch_one(pool)
                .await
                .map_err(backend_with(|| format!("counting the recent versions of environment {env}")))
        })
    }

    /// Stores `document` (JSON text) as the environment's next version, made by `author` (a
    /// user's name; `None`: the host itself).
    pub async fn submit_version(&self, env: &EnvironmentId, document: &str, author: Option<&str>) -> Result<VersionInfo> {
        let _writing = self.caches.environments.writing(Some(*env));
        let now = now_ms();
        let context = || format!("submitting a version to environment {env}");
        let version: i64 = on_pool!(self, pool => {
            let mut tx = pool.begin_write().await.map_err(backend_with(context))?;
            let version: Option<i64> = sqlx::query_scalar(
                "UPDATE environments SET latest_version = latest_version + 1, updated_at = $2 WHERE id = $1 RETURNING latest_version",
            )
            .bind(env.to_string())
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend_with(context))?;
            let version = version.ok_or_else(|| environment_not_found(env))?;
            sqlx::query("INSERT INTO intent_versions (environment_id, version, document, created_at, author) VALUES ($1, $2, $3, $4, $5)")
                .bind(env.to_string())
                .bind(version)
                .bind(document)
                .bind(now)
                .bind(author)
                .execute(&mut *tx)
                .await
                .map_err(backend_with(context))?;
            tx.commit().await.map_err(backend_with(context))?;
            version
        });
        Ok(VersionInfo {
            environment: *env,
            version,
            created_at: now,
            released_at: None,
            active: false,
            author: author.map(str::to_string),
        })
    }

    /// Every version of the environment, newest first, without documents.
    pub async fn list_versions(&self, env: &EnvironmentId) -> Result<Vec<VersionInfo>> {
        let released = self.get_environment(env).await?.released_version;
        let rows: Vec<(i64, i64, Option<i64>, Option<String>)> = on_pool!(self, pool => {
            sqlx::query_as(
                "SELECT version, created_at, released_at, author FROM intent_versions WHERE environment_id = $1 ORDER BY version DESC",
            )
            .bind(env.to_string())
            .fetch_all(pool)
            .await
            .map_err(backend_with(|| format!("listing the versions of environment {env}")))?
        });
        Ok(rows
            .into_iter()
            .map(|(version, created_at, released_at, author)| VersionInfo {
                environment: *env,
                version,
                created_at,
                released_at,
                active: released == Some(version),
                author,
            })
            .collect())
    }

    /// One version with its document.
    pub async fn get_version(&self, env: &EnvironmentId, version: i64) -> Result<IntentVersion> {
        type WithDocument = (i64, Option<i64>, String, Option<i64>, Option<String>);
        let row: Option<WithDocument> = on_pool!(self, pool => {
            sqlx::query_as(
                "SELECT v.created_at, v.released_at, v.document, e.released_version, v.author \
                 FROM intent_versions v JOIN environments e ON e.id = v.environment_id \
                 WHERE v.environment_id = $1 AND v.version = $2",
            )
            .bind(env.to_string())
            .bind(version)
            .fetch_optional(pool)
            .await
            .map_err(backend_with(|| format!("reading version {version} of environment {env}")))?
        });
        let (created_at, released_at, document, released, author) = row.ok_or_else(|| version_not_found(env, version))?;
        Ok(IntentVersion {
            info: VersionInfo {
                environment: *env,
                version,
                created_at,
                released_at,
                active: released == Some(version),
                author,
            },
            document,
        })
    }

    /// Makes `version` the environment's released version (also an older one: a rollback) and
    /// stamps its `released_at`.
    pub async fn release_version(&self, env: &EnvironmentId, version: i64) -> Result<VersionInfo> {
        let _writing = self.caches.environments.writing(Some(*env));
        let now = now_ms();
        let context = || format!("releasing version {version} of environment {env}");
        let row: Option<(i64, Option<i64>, Option<String>)> = on_pool!(self, pool => {
            let mut tx = pool.begin_write().await.map_err(backend_with(context))?;
            let row = sqlx::query_as(
                "UPDATE intent_versions SET released_at = $3 WHERE environment_id = $1 AND version = $2 \
                 RETURNING created_at, released_at, author",
            )
            .bind(env.to_string())
            .bind(version)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend_with(context))?;
            if row.is_some() {
                sqlx::query("UPDATE environments SET released_version = $2, updated_at = $3 WHERE id = $1")
                    .bind(env.to_string())
                    .bind(version)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend_with(context))?;
                tx.commit().await.map_err(backend_with(context))?;
            }
            row
        });
        let (created_at, released_at, author) = row.ok_or_else(|| version_not_found(env, version))?;
        Ok(VersionInfo {
            environment: *env,
            version,
            created_at,
            released_at,
            active: true,
            author,
        })
    }
}

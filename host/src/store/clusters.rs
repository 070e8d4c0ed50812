//! Cluster templates and clusters. A template is stored in versions 1, 2, 3… per name and
//! environment, each immutable; a cluster names the template version it was made from, and that
//! version cannot be deleted while the cluster exists (a foreign key, so no race can slip a
//! cluster in between the check and the delete). Both documents are JSON text the store never
//! reads: the pinned template, and the cluster manager's state (layout, tasks, config…).

use super::environments::environment_not_found;
use super::error::{backend, backend_with};
use super::{BeginWrite, EnvironmentId, Millis, Result, Store, StoreError, now_ms, parse_id};

/// One version of a cluster template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRecord {
    pub name: String,
    /// 1, 2, 3… per name and environment.
    pub version: i64,
    /// The pinned template, JSON text.
    pub document: String,
    pub created_at: Millis,
}

/// A cluster as the cluster manager stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRecord {
    pub name: String,
    /// The template it was made from, in this environment.
    pub template: String,
    pub template_version: i64,
    /// The manager's status name; the store does not interpret it.
    pub status: String,
    /// The manager's JSON text (layout, tasks, config…); the store does not interpret it.
    pub document: String,
    /// When the cluster's lease ends; `None`: no lease.
    pub lease_expires_at: Option<Millis>,
    /// Counts the row's changes (1 when inserted): the cluster's ETag. Every update and delete
    /// names the revision it read and is refused when the row moved on.
    pub revision: i64,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// How often `insert_template` takes a fresh number after a concurrent insert took its own. Each
/// retry means another insert of the same name committed, so this only bounds starvation.
const INSERT_TEMPLATE_ATTEMPTS: usize = 100;

type TemplateRow = (String, i64, String, i64);
type ClusterRow = (String, String, i64, String, String, Option<i64>, i64, i64, i64);
/// The environment's id, then a [`ClusterRow`].
type ExpiredRow = (String, String, String, i64, String, String, Option<i64>, i64, i64, i64);

macro_rules! template_columns {
    () => {
        "name, version, document, created_at"
    };
}

macro_rules! cluster_columns {
    () => {
        "name, template, template_version, status, document, lease_expires_at, revision, created_at, updated_at"
    };
}

fn template((name, version, document, created_at): TemplateRow) -> TemplateRecord {
    TemplateRecord {
        name,
        version,
        document,
        created_at,
    }
}

fn cluster(row: ClusterRow) -> ClusterRecord {
    let (name, template, template_version, status, document, lease_expires_at, revision, created_at, updated_at) = row;
    ClusterRecord {
        name,
        template,
        template_version,
        status,
        document,
        lease_expires_at,
        revision,
        created_at,
        updated_at,
    }
}

fn template_not_found(env: &EnvironmentId, name: &str) -> StoreError {
    StoreError::not_found(format!("template `{name}` in environment {env}"))
}

fn template_version_not_found(env: &EnvironmentId, name: &str, version: i64) -> StoreError {
    StoreError::not_found(format!("version {version} of template `{name}` in environment {env}"))
}

fn cluster_not_found(env: &EnvironmentId, name: &str) -> StoreError {
    StoreError::not_found(format!("cluster `{name}` in environment {env}"))
}

fn stale(name: &str, expected: i64, current: i64) -> StoreError {
    StoreError::Conflict {
        what: format!("cluster `{name}` is at revision {current}, not {expected}"),
    }
}

impl Store {
    /// Stores `document` (JSON text) as the next version (1, 2, …) of template `name`. Concurrent
    /// inserts of the same name each get their own version: one statement takes the highest
    /// stored version plus one, and the primary key turns a tie into a unique violation, retried
    /// with a fresh number. NotFound when the environment does not exist.
    pub async fn insert_template(&self, env: &EnvironmentId, name: &str, document: &str) -> Result<TemplateRecord> {
        let now = now_ms();
        for _ in 0..INSERT_TEMPLATE_ATTEMPTS {
            let inserted: Result<i64, sqlx::Error> = on_pool!(self, pool => {
                sqlx::query_scalar(
                    "INSERT INTO cluster_templates (environment_id, name, version, document, created_at) \
                     SELECT $1, $2, COALESCE(MAX(version), 0) + 1, $3, $4 FROM cluster_templates \
                     WHERE environment_id = $1 AND name = $2 RETURNING version",
                )
                .bind(env.to_string())
                .bind(name)
                .bind(document)
                .bind(now)
                .fetch_one(pool)
                .await
            });
            return match inserted {
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => continue,
                Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => Err(environment_not_found(env)),
                Err(e) => Err(backend_with(|| format!("storing template `{name}` in environment {env}"))(e)),
                Ok(version) => Ok(TemplateRecord {
                    name: name.to_string(),
                    version,
                    document: document.to_string(),
                    created_at: now,
                }),
            };
        }
        Err(StoreError::Conflict {
            what: format!("too many concurrent versions of template `{name}` in environment {env}; try again"),
        })
    }

    /// Stores `document` as version `expected + 1` of template `name` only if its latest version
    /// is `expected` (0: none yet) — an `If-Match` on the template. Conflict naming the latest
    /// version when another was stored meanwhile (a racing insert loses on the primary key).
    pub async fn insert_template_after(&self, env: &EnvironmentId, name: &str, document: &str, expected: i64) -> Result<TemplateRecord> {
        let now = now_ms();
        let result: Result<Option<i64>, sqlx::Error> = on_pool!(self, pool => {
            async {
                let mut tx = pool.begin_write().await?;
                let latest: Option<i64> =
                    sqlx::query_scalar("SELECT MAX(version) FROM cluster_templates WHERE environment_id = $1 AND name = $2")
                        .bind(env.to_string())
                        .bind(name)
                        .fetch_one(&mut *tx)
                        .await?;
                let latest = latest.unwrap_or(0);
                if latest != expected {
                    return Ok(Some(latest));
                }
                sqlx::query("INSERT INTO cluster_templates (environment_id, name, version, document, created_at) VALUES ($1, $2, $3, $4, $5)")
                    .bind(env.to_string())
                    .bind(name)
                    .bind(expected + 1)
                    .bind(document)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(None)
            }
            .await
        });
        let stale = |latest: String| StoreError::Conflict {
            what: format!("template `{name}` is at version {latest}, not {expected}"),
        };
        match result {
            Ok(Some(latest)) => Err(stale(latest.to_string())),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(stale("a newer one".into())),
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => Err(environment_not_found(env)),
            Err(e) => Err(backend_with(|| format!("storing template `{name}` in environment {env}"))(e)),
            Ok(None) => Ok(TemplateRecord {
                name: name.to_string(),
                version: expected + 1,
                document: document.to_string(),
                created_at: now,
            }),
        }
    }

    /// Version `version` of template `name`, or its latest version when `version` is `None`.
    pub async fn get_template(&self, env: &EnvironmentId, name: &str, version: Option<i64>) -> Result<TemplateRecord> {
        let context = || format!("reading template `{name}` in environment {env}");
        let row: Option<TemplateRow> = on_pool!(self, pool => {
            match version {
                Some(version) => sqlx::query_as(concat!(
                    "SELECT ", template_columns!(), " FROM cluster_templates WHERE environment_id = $1 AND name = $2 AND version = $3"
                ))
                .bind(env.to_string())
                .bind(name)
                .bind(version)
                .fetch_optional(pool)
                .await,
                None => sqlx::query_as(concat!(
                    "SELECT ", template_columns!(), " FROM cluster_templates WHERE environment_id = $1 AND name = $2 \
                     ORDER BY version DESC LIMIT 1"
                ))
                .bind(env.to_string())
                .bind(name)
                .fetch_optional(pool)
                .await,
            }
            .map_err(backend_with(context))?
        });
        match (row, version) {
            (Some(row), _) => Ok(template(row)),
            (None, Some(version)) => Err(template_version_not_found(env, name, version)),
            (None, None) => Err(template_not_found(env, name)),
        }
    }

    /// The latest version of every template of the environment, by name.
    pub async fn list_templates(&self, env: &EnvironmentId) -> Result<Vec<TemplateRecord>> {
        let rows: Vec<TemplateRow> = on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "SELECT ", template_columns!(), " FROM cluster_templates t WHERE environment_id = $1 AND version = \
                 (SELECT MAX(m.version) FROM cluster_templates m WHERE m.environment_id = t.environment_id AND m.name = t.name) \
                 ORDER BY name"
            ))
            .bind(env.to_string())
            .fetch_all(pool)
            .await
            .map_err(backend_with(|| format!("listing the templates of environment {env}")))?
        });
        Ok(rows.into_iter().map(template).collect())
    }

    /// Every version of template `name`, newest first (as intent versions are listed). NotFound
    /// when the template has no version.
    pub async fn list_template_versions(&self, env: &EnvironmentId, name: &str) -> Result<Vec<TemplateRecord>> {
        let rows: Vec<TemplateRow> = on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "SELECT ", template_columns!(), " FROM cluster_templates WHERE environment_id = $1 AND name = $2 ORDER BY version DESC"
            ))
            .bind(env.to_string())
            .bind(name)
            .fetch_all(pool)
            .await
            .map_err(backend_with(|| format!("listing the versions of template `{name}` in environment {env}")))?
        });
        if rows.is_empty() {
            return Err(template_not_found(env, name));
        }
        Ok(rows.into_iter().map(template).collect())
    }

    /// Deletes every version of template `name`. Conflict ("template `x` is used by cluster
    /// `y`") while a cluster uses any of them; NotFound when there is none.
    pub async fn delete_template(&self, env: &EnvironmentId, name: &str) -> Result<()> {
        let context = || format!("deleting template `{name}` in environment {env}");
        let result: Result<(Option<String>, u64), sqlx::Error> = on_pool!(self, pool => {
            async {
                let mut tx = pool.begin_write().await?;
                let user: Option<String> = sqlx::query_scalar(
                    "SELECT name FROM clusters WHERE environment_id = $1 AND template = $2 ORDER BY name LIMIT 1",
                )
                .bind(env.to_string())
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
                if user.is_some() {
                    return Ok((user, 0));
                }
                let deleted = sqlx::query("DELETE FROM cluster_templates WHERE environment_id = $1 AND name = $2")
                    .bind(env.to_string())
                    .bind(name)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                Ok((None, deleted))
            }
            .await
        });
        match result {
            Ok((Some(cluster), _)) => Err(StoreError::Conflict {
                what: format!("template `{name}` is used by cluster `{cluster}`"),
            }),
            // PostgreSQL: a cluster made from it committed between the check and the delete.
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => Err(StoreError::Conflict {
                what: format!("template `{name}` is used by a cluster"),
            }),
            Err(e) => Err(backend_with(context)(e)),
            Ok((None, 0)) => Err(template_not_found(env, name)),
            Ok((None, _)) => Ok(()),
        }
    }

    /// Stores a new cluster as given (its `created_at` and `updated_at` included) at revision 1,
    /// whatever `c.revision` says. Conflict when
    /// a cluster of that name exists in the environment; NotFound when the environment or the
    /// template version does not exist.
    pub async fn insert_cluster(&self, env: &EnvironmentId, c: &ClusterRecord) -> Result<()> {
        let _turn = self.write_turn().await?;
        let inserted = on_pool!(self, pool => {
            sqlx::query(concat!(
                "INSERT INTO clusters (environment_id, ", cluster_columns!(), ") VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8, $9)"
            ))
            .bind(env.to_string())
            .bind(&c.name)
            .bind(&c.template)
            .bind(c.template_version)
            .bind(&c.status)
            .bind(&c.document)
            .bind(c.lease_expires_at)
            .bind(c.created_at)
            .bind(c.updated_at)
            .execute(pool)
            .await
            .map(drop)
        });
        match inserted {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(StoreError::Conflict {
                what: format!("a cluster named `{}` already exists in environment {env}", c.name),
            }),
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => Err(self.missing_parent(env, c).await),
            Err(e) => Err(backend_with(|| format!("storing cluster `{}` in environment {env}", c.name))(e)),
            Ok(_) => Ok(()),
        }
    }

    pub async fn get_cluster(&self, env: &EnvironmentId, name: &str) -> Result<ClusterRecord> {
        self.find_cluster(env, name).await?.ok_or_else(|| cluster_not_found(env, name))
    }

    pub async fn find_cluster(&self, env: &EnvironmentId, name: &str) -> Result<Option<ClusterRecord>> {
        let row: Option<ClusterRow> = on_pool!(self, pool => {
            sqlx::query_as(concat!("SELECT ", cluster_columns!(), " FROM clusters WHERE environment_id = $1 AND name = $2"))
                .bind(env.to_string())
                .bind(name)
                .fetch_optional(pool)
                .await
                .map_err(backend_with(|| format!("reading cluster `{name}` in environment {env}")))?
        });
        Ok(row.map(cluster))
    }

    /// Every cluster of the environment, by name.
    pub async fn list_clusters(&self, env: &EnvironmentId) -> Result<Vec<ClusterRecord>> {
        let rows: Vec<ClusterRow> = on_pool!(self, pool => {
            sqlx::query_as(concat!("SELECT ", cluster_columns!(), " FROM clusters WHERE environment_id = $1 ORDER BY name"))
                .bind(env.to_string())
                .fetch_all(pool)
                .await
                .map_err(backend_with(|| format!("listing the clusters of environment {env}")))?
        });
        Ok(rows.into_iter().map(cluster).collect())
    }

    /// Replaces the status, template, template version, document and lease of cluster `c.name`
    /// if it is still at revision `c.revision`, and sets `updated_at` to now; `created_at` is
    /// kept. Returns the stored record (one revision more). Conflict naming the current revision
    /// when the row moved on; NotFound when the cluster, or the template version it would now
    /// use, does not exist.
    pub async fn update_cluster(&self, env: &EnvironmentId, c: &ClusterRecord) -> Result<ClusterRecord> {
        let _turn = self.write_turn().await?;
        let updated: Result<Option<ClusterRow>, sqlx::Error> = on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "UPDATE clusters SET status = $3, template = $4, template_version = $5, document = $6, lease_expires_at = $7, \
                 updated_at = $8, revision = revision + 1 WHERE environment_id = $1 AND name = $2 AND revision = $9 RETURNING ",
                cluster_columns!()
            ))
            .bind(env.to_string())
            .bind(&c.name)
            .bind(&c.status)
            .bind(&c.template)
            .bind(c.template_version)
            .bind(&c.document)
            .bind(c.lease_expires_at)
            .bind(now_ms())
            .bind(c.revision)
            .fetch_optional(pool)
            .await
        });
        match updated {
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => Err(self.missing_parent(env, c).await),
            Err(e) => Err(backend_with(|| format!("updating cluster `{}` in environment {env}", c.name))(e)),
            Ok(None) => match self.find_cluster(env, &c.name).await? {
                Some(current) => Err(stale(&c.name, c.revision, current.revision)),
                None => Err(cluster_not_found(env, &c.name)),
            },
            Ok(Some(row)) => Ok(cluster(row)),
        }
    }

    /// Deletes cluster `name` if it is still at revision `expected`. Conflict naming the current
    /// revision when the row moved on; NotFound when there is none.
    pub async fn delete_cluster(&self, env: &EnvironmentId, name: &str, expected: i64) -> Result<()> {
        let _turn = self.write_turn().await?;
        let deleted = on_pool!(self, pool => {
            sqlx::query("DELETE FROM clusters WHERE environment_id = $1 AND name = $2 AND revision = $3")
                .bind(env.to_string())
                .bind(name)
                .bind(expected)
                .execute(pool)
                .await
                .map_err(backend_with(|| format!("deleting cluster `{name}` in environment {env}")))?
                .rows_affected()
        });
        if deleted == 0 {
            return match self.find_cluster(env, name).await? {
                Some(current) => Err(stale(name, expected, current.revision)),
                None => Err(cluster_not_found(env, name)),
            };
        }
        Ok(())
    }

    /// The clusters, of every environment, whose lease ended before `now`, soonest ended first.
    /// The one query that crosses environments: the lease reaper serves them all.
    pub async fn expired_clusters(&self, now: Millis) -> Result<Vec<(EnvironmentId, ClusterRecord)>> {
        let rows: Vec<ExpiredRow> = on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "SELECT environment_id, ", cluster_columns!(), " FROM clusters \
                 WHERE lease_expires_at IS NOT NULL AND lease_expires_at < $1 ORDER BY lease_expires_at, environment_id, name"
            ))
            .bind(now)
            .fetch_all(pool)
            .await
            .map_err(backend("listing the clusters whose lease expired"))?
        });
        rows.into_iter()
            .map(
                |(env, name, template, template_version, status, document, lease, revision, created_at, updated_at)| {
                    let env = parse_id(&env, "environment")?;
                    Ok((
                        env,
                        cluster((
                            name,
                            template,
                            template_version,
                            status,
                            document,
                            lease,
                            revision,
                            created_at,
                            updated_at,
                        )),
                    ))
                },
            )
            .collect()
    }

    /// After a foreign-key violation writing cluster `c`: which parent is missing, the
    /// environment or the template version.
    async fn missing_parent(&self, env: &EnvironmentId, c: &ClusterRecord) -> StoreError {
        match self.get_environment(env).await {
            Ok(_) => template_version_not_found(env, &c.template, c.template_version),
            Err(e) => e,
        }
    }
}

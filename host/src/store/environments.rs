//! Environments: create, list, get, rename, settings, halt/resume, delete (with everything in
//! them, by cascade). Names are unique.

use super::error::{backend, backend_with};
use super::{Environment, EnvironmentId, Result, Store, StoreError, now_ms, parse_id};
use crate::policy::settings::{CapabilitySettings, EnvironmentSettings};

type Row = (String, String, String, bool, i64, Option<i64>, i64, i64);

macro_rules! columns {
    () => {
        "id, name, settings, halted, latest_version, released_version, created_at, updated_at"
    };
}

fn environment(row: Row) -> Result<Environment> {
    let (id, name, settings, halted, latest_version, released_version, created_at, updated_at) = row;
    let corrupt = |e: serde_json::Error| StoreError::corrupt(format!("the settings of environment `{name}` cannot be read: {e}"));
    let mut settings: serde_json::Value = serde_json::from_str(&settings).map_err(corrupt)?;
    // Stored before capability grants existed: it had every capability, and its released version
    // may use them all. Keeping them means an upgrade stops nothing (a version using a revoked
    // capability could not even be resumed); the operator narrows them with a settings PATCH.
    if let Some(fields) = settings.as_object_mut()
        && !fields.contains_key("capabilities")
    {
        let everything = serde_json::to_value(CapabilitySettings::everything()).expect("settings serialise");
        fields.insert("capabilities".into(), everything);
    }
    let settings = serde_json::from_value(settings).map_err(corrupt)?;
    Ok(Environment {
        id: parse_id(&id, "environment")?,
        name,
        settings,
        halted,
        latest_version,
        released_version,
        created_at,
        updated_at,
    })
}

fn settings_json(settings: &EnvironmentSettings) -> String {
    serde_json::to_string(settings).expect("settings serialise")
}

fn or_name_taken(result: Result<Option<Row>>, name: &str) -> Result<Option<Row>> {
    match result {
        Err(e) if e.is_unique_violation() => Err(StoreError::Conflict {
            what: format!("an environment named `{name}` already exists"),
        }),
        other => other,
    }
}

pub(crate) fn environment_not_found(id: &EnvironmentId) -> StoreError {
    StoreError::not_found(format!("environment {id}"))
}

impl Store {
    pub async fn create_environment(&self, name: &str, settings: &EnvironmentSettings) -> Result<Environment> {
        let id = EnvironmentId::random();
        let now = now_ms();
        let row = on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "INSERT INTO environments (id, name, settings, halted, latest_version, created_at, updated_at) ",
                "VALUES ($1, $2, $3, FALSE, 0, $4, $4) RETURNING ", columns!()
            ))
            .bind(id.to_string())
            .bind(name)
            .bind(settings_json(settings))
            .bind(now)
            .fetch_optional(pool)
            .await
            .map_err(backend_with(|| format!("creating environment `{name}`")))
        });
        environment(or_name_taken(row, name)?.expect("INSERT … RETURNING returns the row"))
    }

    /// All environments, by name.
    pub async fn list_environments(&self) -> Result<Vec<Environment>> {
        let rows: Vec<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!("SELECT ", columns!(), " FROM environments ORDER BY name"))
                .fetch_all(pool)
                .await
                .map_err(backend("listing environments"))?
        });
        rows.into_iter().map(environment).collect()
    }

    pub async fn get_environment(&self, id: &EnvironmentId) -> Result<Environment> {
        let miss = match self.caches.environments.get(id) {
            Ok(env) => return Ok(env),
            Err(miss) => miss,
        };
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!("SELECT ", columns!(), " FROM environments WHERE id = $1"))
                .bind(id.to_string())
                .fetch_optional(pool)
                .await
                .map_err(backend_with(|| format!("reading environment {id}")))?
        });
        let env = environment(row.ok_or_else(|| environment_not_found(id))?)?;
        self.caches.environments.install(miss, *id, env.clone());
        Ok(env)
    }

    pub async fn find_environment_by_name(&self, name: &str) -> Result<Option<Environment>> {
        // No stored name holds NUL, which PostgreSQL's text cannot even be asked about.
        if name.contains('\0') {
            return Ok(None);
        }
        let miss = match self.caches.environments.find(|e| e.name == name) {
            Ok(env) => return Ok(Some(env)),
            Err(miss) => miss,
        };
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!("SELECT ", columns!(), " FROM environments WHERE name = $1"))
                .bind(name)
                .fetch_optional(pool)
                .await
                .map_err(backend_with(|| format!("looking up environment `{name}`")))?
        });
        let env = row.map(environment).transpose()?;
        if let Some(env) = &env {
            self.caches.environments.install(miss, env.id, env.clone());
        }
        Ok(env)
    }

    pub async fn rename_environment(&self, id: &EnvironmentId, name: &str) -> Result<Environment> {
        let _writing = self.caches.environments.writing(Some(*id));
        // Its private nodes' rows name it.
        let _nodes = self.caches.nodes.writing(None);
        let row = on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "UPDATE environments SET name = $2, updated_at = $3 WHERE id = $1 RETURNING ", columns!()
            ))
            .bind(id.to_string())
            .bind(name)
            .bind(now_ms())
            .fetch_optional(pool)
            .await
            .map_err(backend_with(|| format!("renaming environment {id} to `{name}`")))
        });
        environment(or_name_taken(row, name)?.ok_or_else(|| environment_not_found(id))?)
    }

    pub async fn update_settings(&self, id: &EnvironmentId, settings: &EnvironmentSettings) -> Result<Environment> {
        let _writing = self.caches.environments.writing(Some(*id));
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "UPDATE environments SET settings = $2, updated_at = $3 WHERE id = $1 RETURNING ", columns!()
            ))
            .bind(id.to_string())
            .bind(settings_json(settings))
            .bind(now_ms())
            .fetch_optional(pool)
            .await
            .map_err(backend_with(|| format!("updating the settings of environment {id}")))?
        });
        environment(row.ok_or_else(|| environment_not_found(id))?)
    }

    /// Halts (`true`) or resumes (`false`) the environment's scheduler.
    pub async fn set_halted(&self, id: &EnvironmentId, halted: bool) -> Result<Environment> {
        let _writing = self.caches.environments.writing(Some(*id));
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as(concat!(
                "UPDATE environments SET halted = $2, updated_at = $3 WHERE id = $1 RETURNING ", columns!()
            ))
            .bind(id.to_string())
            .bind(halted)
            .bind(now_ms())
            .fetch_optional(pool)
            .await
            .map_err(backend_with(|| format!("halting or resuming environment {id}")))?
        });
        environment(row.ok_or_else(|| environment_not_found(id))?)
    }

    /// Deletes the environment and everything in it: versions, states, actions, reports.
    pub async fn delete_environment(&self, id: &EnvironmentId) -> Result<()> {
        let _writing = self.caches.environments.writing(Some(*id));
        // Its private nodes go with it.
        let _nodes = self.caches.nodes.writing(None);
        let deleted = on_pool!(self, pool => {
            sqlx::query("DELETE FROM environments WHERE id = $1")
                .bind(id.to_string())
                .execute(pool)
                .await
                .map_err(backend_with(|| format!("deleting environment {id}")))?
                .rows_affected()
        });
        if deleted == 0 {
            return Err(environment_not_found(id));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(settings: &str) -> Row {
        let id = uuid::Uuid::new_v4().to_string();
        (id, "dev".into(), settings.into(), false, 0, None, 0, 0)
    }

    #[test]
    fn settings_stored_before_capability_grants_keep_every_capability() {
        let old = environment(row(r#"{"call_timeout_s": 60}"#)).unwrap();
        assert_eq!(old.settings.capabilities, CapabilitySettings::everything());
        assert_eq!(old.settings.call_timeout_s, 60);
        let stored = settings_json(&EnvironmentSettings::default());
        let new = environment(row(&stored)).unwrap();
        assert_eq!(new.settings.capabilities, CapabilitySettings::default());
    }
}

//! Environments: create, read, change settings (a JSON merge patch), halt and delete.

use super::running::{node_dir, scheduler_settings};
use super::{App, EnvError};
use crate::access::Principal;
use crate::if_match::tag_matches;
use crate::policy::outbound;
use crate::policy::settings::EnvironmentSettings;
use crate::store::{Environment, EnvironmentId, StoreError};

impl App {
    pub async fn create(&self, name: &str, settings: Option<EnvironmentSettings>) -> Result<Environment, EnvError> {
        validate_name(name)?;
        let settings = settings.unwrap_or_else(|| self.defaults.clone());
        self.check_settings(&settings)?;
        let env = self.store.create_environment(name, &settings).await?;
        self.running(&env).await?;
        Ok(env)
    }

    pub async fn list(&self) -> Result<Vec<Environment>, EnvError> {
        Ok(self.store.list_environments().await?)
    }

    /// The environments `caller` holds a role in (every one, for an admin).
    pub async fn list_for(&self, caller: &Principal) -> Result<Vec<Environment>, EnvError> {
        let mut all = self.list().await?;
        all.retain(|env| caller.role_in_id(&env.id).is_some());
        Ok(all)
    }

    /// An environment by name or id.
    pub async fn get(&self, key: &str) -> Result<Environment, EnvError> {
        let unknown = || EnvError::UnknownEnvironment(key.chars().take(100).collect());
        if let Ok(id) = key.parse::<EnvironmentId>() {
            return match self.store.get_environment(&id).await {
                Err(StoreError::NotFound { .. }) => Err(unknown()),
                other => Ok(other?),
            };
        }
        self.store.find_environment_by_name(key).await?.ok_or_else(unknown)
    }

    /// Stops the environment's scheduler (actions in flight finish) and deletes everything stored
    /// for it, its plugins' key/value state and its local node's directory included.
    pub async fn delete(&self, key: &str) -> Result<(), EnvError> {
        let env = self.get(key).await?;
        let running = {
            let mut running = self.running.lock().await;
            self.deleting.lock().expect("deleting").insert(env.id);
            running.remove(&env.id)
        };
        if let Some(running) = running {
            running.deleted.store(true, std::sync::atomic::Ordering::SeqCst);
            running.ended.send_replace(true);
            running.scheduler.stop().await;
        }
        let deleted = self.store.delete_environment(&env.id).await;
        if deleted.is_ok() {
            // Its lease went with it.
            self.ownership.forget(&env.id);
        }
        // Gone from the store (or not, and then it may run again): from now on `running` asks
        // the store.
        self.deleting.lock().expect("deleting").remove(&env.id);
        deleted?;
        // Its plugins' state: scopes are `environment-id/plugin`.
        if let Err(e) = self.kv.forget(&format!("{}/", env.id)).await {
            tracing::warn!(environment = %env.name, error = %e, "cannot delete the plugins' key/value state");
        }
        self.nodes.forget_environment(&env.id);
        self.metrics.forget(&env.name);
        // Its members' roles went with it; a new environment of the same name is not theirs.
        self.access_invalidated();
        let root = node_dir(&self.data_dir, &env.name);
        if let Err(e) = std::fs::remove_dir_all(&root)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(environment = %env.name, path = %root.display(), error = %e, "cannot remove the node directory");
        }
        Ok(())
    }

    /// Changes some settings: `patch` is a JSON merge patch (RFC 7396) of the settings — only
    /// the fields given change, nested objects (`http`) merge field by field, `null` resets a
    /// field to its default, unknown fields are refused by name. The scheduler applies them to
    /// what it starts or schedules next (a new HTTP policy or call timeout to the actions that
    /// start after the change); turning `auto_deploy` on does not release anything already
    /// submitted.
    pub async fn update_settings(&self, key: &str, patch: serde_json::Value, if_match: Option<&str>) -> Result<Environment, EnvError> {
        let env = self.get(key).await?;
        if !patch.is_object() {
            return Err(EnvError::InvalidSettings("the settings must be a JSON object".into()));
        }
        let running = self.running(&env).await?;
        // Held until the settings are stored: no version using a capability being revoked is
        // released in between, and no other change of the settings is lost to this one (the
        // patch merges into the settings as stored now).
        let _turn = running.releases.lock().await;
        let env = self.get(key).await?;
        if let Some(tag) = if_match
            && !tag_matches(tag, &settings_tag(&env.settings))
        {
            return Err(EnvError::VersionConflict(format!(
                "the settings of environment `{}` are at {}",
                env.name,
                settings_tag(&env.settings)
            )));
        }
        let mut merged = serde_json::to_value(&env.settings).expect("settings serialise");
        crate::json::merge_patch(&mut merged, patch);
        let settings: EnvironmentSettings = serde_json::from_value(merged).map_err(|e| EnvError::InvalidSettings(e.to_string()))?;
        self.check_settings(&settings)?;
        running.check_scheduler()?;
        running.check_revocation(&settings.capabilities)?;
        let ctx = outbound::call_context(&running.ctx(), &settings, &self.secrets).map_err(EnvError::InvalidSettings)?;
        let env = self.store.update_settings(&env.id, &settings).await?;
        *running.ctx.write().expect("call context") = ctx.clone();
        *running.capabilities.lock().expect("capabilities") = env.settings.capabilities;
        // Stored: a scheduler that stopped meanwhile takes them from the store at the next start.
        running
            .scheduler
            .update_settings(scheduler_settings(&env.settings))
            .and_then(|()| running.scheduler.update_context(ctx))
            .map_err(|e| running.unavailable(e))?;
        Ok(env)
    }

    /// Settings the scheduler can run with, naming only secrets this host holds, each bound to
    /// at least one of the allowed origins.
    fn check_settings(&self, settings: &EnvironmentSettings) -> Result<(), EnvError> {
        settings.validate().map_err(EnvError::InvalidSettings)?;
        self.secrets.check(&settings.http).map_err(EnvError::InvalidSettings)
    }

    /// Halts (nothing new starts; actions in flight finish) or resumes the environment. Persisted:
    /// a halted environment stays halted across restarts.
    pub async fn set_halted(&self, key: &str, halted: bool) -> Result<Environment, EnvError> {
        let env = self.get(key).await?;
        let running = self.running(&env).await?;
        running.check_scheduler()?;
        let env = self.store.set_halted(&env.id, halted).await?;
        running.scheduler.set_halted(halted).map_err(|e| running.unavailable(e))?;
        Ok(env)
    }
}

/// The ETag of an environment's settings: a digest of their canonical JSON, so equal settings
/// have equal tags whatever changed them.
pub fn settings_tag(settings: &EnvironmentSettings) -> String {
    let value = serde_json::to_value(settings).expect("settings serialise");
    format!("s-{}", &orc_manifest::canonical::digest(&value).hex()[..16])
}

/// Environment names ([`orc_manifest::names::ENVIRONMENT`]) become directory names (node
/// roots), so they are kept plain.
fn validate_name(name: &str) -> Result<(), EnvError> {
    orc_manifest::names::ENVIRONMENT.check(name).map_err(|e| EnvError::InvalidName {
        name: name.chars().take(100).collect(),
        reason: e.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::config::HostConfig;

    async fn app(dir: &std::path::Path) -> std::sync::Arc<App> {
        let config = HostConfig {
            data_dir: dir.to_path_buf(),
            ..HostConfig::default()
        };
        let app = App::open(&config, "127.0.0.1:0").await.unwrap();
        app.start_ownership().await;
        app
    }

    /// A request that read the environment before a delete (either while the delete runs, or
    /// after it finished) gets `UnknownEnvironment`, and no scheduler or node directory comes
    /// back for the deleted environment.
    #[tokio::test]
    async fn a_request_racing_a_delete_never_starts_the_environment_again() {
        let dir = tempfile::tempdir().unwrap();
        let app = app(dir.path()).await;

        // While the delete runs: its tombstone is set and its scheduler taken out.
        let during = app.create("during", None).await.unwrap();
        app.running.lock().await.remove(&during.id);
        app.deleting.lock().unwrap().insert(during.id);
        assert!(matches!(app.running(&during).await, Err(EnvError::UnknownEnvironment(_))));
        assert!(!app.running.lock().await.contains_key(&during.id));

        // After it finished: the store no longer has it.
        let after = app.create("after", None).await.unwrap();
        app.delete("after").await.unwrap();
        assert!(
            !app.deleting.lock().unwrap().contains(&after.id),
            "the tombstone goes once the store has deleted it"
        );
        assert!(matches!(app.running(&after).await, Err(EnvError::UnknownEnvironment(_))));
        assert!(!app.running.lock().await.contains_key(&after.id));
        assert!(!node_dir(&app.data_dir, "after").exists(), "no node directory made again");
        // An environment of the same name later is a new one, and runs.
        let again = app.create("after", None).await.unwrap();
        assert_ne!(again.id, after.id);
        app.running(&again).await.unwrap();
        app.shutdown(std::time::Duration::from_secs(1)).await;
    }
}

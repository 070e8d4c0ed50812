//! What the store says of an environment's resources, versions, actions, operations and
//! dryruns, for the API's reads; and whether the database answers (readiness). Every read is
//! scoped to the environment it is asked of.

use super::{App, EnvError};
use crate::intent::{ResourceId, ResourceSpec};
use crate::store::{
    ActionFilter, ActionPage, DryrunId, DryrunReport, Environment, IntentVersion, LoggedAction, Operation, OperationId, ResourceState,
    StateFilter, StatePage, StoreError, VersionInfo,
};

/// A resource as the released version wants it, and what waits for it.
#[derive(Debug, Clone)]
pub struct DesiredResource {
    pub spec: ResourceSpec,
    /// The resources that wait for this one to be deployed before they run.
    pub dependents: Vec<ResourceId>,
}

impl App {
    /// Every intent version of `env`, newest first.
    pub async fn versions(&self, env: &Environment) -> Result<Vec<VersionInfo>, EnvError> {
        Ok(self.store.list_versions(&env.id).await?)
    }

    pub async fn version(&self, env: &Environment, version: i64) -> Result<IntentVersion, EnvError> {
        Ok(self.store.get_version(&env.id, version).await?)
    }

    /// A page of `env`'s resource states.
    pub async fn resource_states(&self, env: &Environment, filter: &StateFilter) -> Result<StatePage, EnvError> {
        Ok(self.store.list_states(&env.id, filter).await?)
    }

    pub async fn resource_state(&self, env: &Environment, resource: &str) -> Result<ResourceState, EnvError> {
        Ok(self.store.get_state(&env.id, resource).await?)
    }

    /// What the released version of `env` wants of `resource` (its adaptor pinned), if it has it.
    pub async fn desired_resource(&self, env: &Environment, resource: &str) -> Result<Option<DesiredResource>, EnvError> {
        let Ok(id) = resource.parse::<ResourceId>() else {
            return Ok(None);
        };
        let running = self.running(env).await?;
        let Some(version) = running.released_version() else {
            return Ok(None);
        };
        let resources = &version.intent.resources;
        Ok(resources.iter().position(|r| r.id == id).map(|index| DesiredResource {
            spec: resources[index].clone(),
            dependents: version.dependents(index).iter().map(|&d| resources[d].id.clone()).collect(),
        }))
    }

    /// The `limit` most recent actions of one resource.
    pub async fn recent_actions(&self, env: &Environment, resource: &str, limit: u32) -> Result<Vec<LoggedAction>, EnvError> {
        Ok(self.store.resource_actions(&env.id, resource, limit).await?)
    }

    /// A page of `env`'s action log.
    pub async fn actions(&self, env: &Environment, filter: &ActionFilter) -> Result<ActionPage, EnvError> {
        Ok(self.store.list_actions(&env.id, filter).await?)
    }

    pub async fn operation(&self, env: &Environment, id: &OperationId) -> Result<Operation, EnvError> {
        Ok(self.store.get_operation(&env.id, id).await?)
    }

    pub async fn dryruns(&self, env: &Environment) -> Result<Vec<DryrunReport>, EnvError> {
        Ok(self.store.list_dryruns(&env.id).await?)
    }

    pub async fn dryrun(&self, env: &Environment, id: &DryrunId) -> Result<DryrunReport, EnvError> {
        Ok(self.store.get_dryrun(&env.id, id).await?)
    }

    /// Whether the database answers a trivial query.
    pub async fn ping_store(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }
}

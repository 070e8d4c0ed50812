//! Intent versions: submit (validate, pin, store, release with `auto_deploy`), release,
//! rollback and diff; every version released carries the clusters' current tasks and names only
//! nodes the environment may use.

use std::collections::HashMap;
use std::sync::Arc;

use super::running::Running;
use super::{App, EnvError};
use crate::intent::diff::IntentDiff;
use crate::intent::pinning::{self, LOCAL_NODE};
use crate::intent::{Intent, ResourceId, ResourceSpec};
use crate::nodes::Refusal;
use crate::scheduler::Version;
use crate::store::{Environment, VersionInfo};

impl App {
    /// Validates `intent_json`, pins its adaptors to digests, stores it as the next version (the
    /// pinned document, with every cluster's current tasks added) and, with `auto_deploy`,
    /// releases it. Resources of the reserved type `task` are refused.
    pub async fn submit(&self, key: &str, intent_json: &[u8], author: Option<&str>) -> Result<(VersionInfo, bool), EnvError> {
        let env = self.get(key).await?;
        let submitted = Intent::parse(intent_json)?;
        check_submitted(&env, &submitted.resources)?;
        let running = self.running(&env).await?;
        let _turn = running.releases.lock().await;
        running.check_scheduler()?;
        self.check_version_rate(&env).await?;
        let intent = self.with_cluster_tasks(&env, submitted.resources).await?;
        self.store_version(&env, &running, intent, env.settings.auto_deploy, author).await
    }

    /// Replaces resource set `set` (Inmanta's partial compile): a new version holding the latest
    /// version's resources of every other set and of the main intent, and `intent_json`'s
    /// resources as set `set`. A resource another set (or the main intent) has is refused, naming
    /// both; an empty list removes the set.
    pub async fn put_resource_set(
        &self,
        key: &str,
        set: &str,
        intent_json: &[u8],
        author: Option<&str>,
    ) -> Result<(VersionInfo, bool), EnvError> {
        let env = self.get(key).await?;
        orc_manifest::names::SERVICE.check(set).map_err(|e| {
            EnvError::InvalidResourceSet(format!(
                "resource set `{}`: {e} ({})",
                set.chars().filter(|c| !c.is_control()).take(100).collect::<String>(),
                orc_manifest::names::SERVICE.describe()
            ))
        })?;
        let submitted = Intent::parse(intent_json)?;
        check_submitted(&env, &submitted.resources)?;
        if let Some(other) = submitted.resources.iter().find(|r| r.set.as_deref().is_some_and(|s| s != set)) {
            return Err(EnvError::InvalidResourceSet(format!(
                "resource `{}` names set `{}` in a body for set `{set}`",
                other.id,
                other.set.as_deref().unwrap_or_default()
            )));
        }
        let running = self.running(&env).await?;
        let _turn = running.releases.lock().await;
        running.check_scheduler()?;
        self.check_version_rate(&env).await?;
        let env = self.get(key).await?;
        let mut kept: Vec<ResourceSpec> = if env.latest_version > 0 {
            Intent::parse(self.store.get_version(&env.id, env.latest_version).await?.document.as_bytes())?
                .resources
                .into_iter()
                .filter(|r| r.set.as_deref() != Some(set))
                .collect()
        } else {
            Vec::new()
        };
        let others: HashMap<&ResourceId, Option<&str>> = kept
            .iter()
            .filter(|r| r.id.resource_type != crate::clusters::planner::TASK_TYPE)
            .map(|r| (&r.id, r.set.as_deref()))
            .collect();
        if let Some((r, other)) = submitted.resources.iter().find_map(|r| others.get(&r.id).map(|o| (r, *o))) {
            return Err(EnvError::SetConflict {
                resource: r.id.to_string(),
                set: set.to_string(),
                other: other.map_or_else(|| "the main intent".to_string(), |o| format!("set `{o}`")),
            });
        }
        let total = kept.len() + submitted.resources.len();
        if total as u64 > env.settings.limits.max_resources_per_intent {
            return Err(EnvError::TooManyResources {
                environment: env.name,
                count: total,
                limit: env.settings.limits.max_resources_per_intent,
            });
        }
        kept.extend(submitted.resources.into_iter().map(|mut r| {
            r.set = Some(set.into());
            r
        }));
        let intent = self.with_cluster_tasks(&env, kept).await?;
        self.store_version(&env, &running, intent, env.settings.auto_deploy, author).await
    }

    /// Refuses a new version past the environment's `limits.versions_per_hour` (counted over the
    /// last hour, under the release turn, so concurrent submissions cannot pass it together).
    async fn check_version_rate(&self, env: &Environment) -> Result<(), EnvError> {
        const HOUR_MS: i64 = 3_600_000;
        let limit = env.settings.limits.versions_per_hour;
        let now = crate::store::now_ms();
        let (count, oldest) = self.store.versions_since(&env.id, now - HOUR_MS).await?;
        if (count as u64) < limit {
            return Ok(());
        }
        let frees_at = oldest.unwrap_or(now) + HOUR_MS;
        Err(EnvError::RateLimited {
            what: format!(
                "environment `{}` made {count} intent versions in the last hour; it may make {limit} (`limits.versions_per_hour`)",
                env.name
            ),
            retry_after_s: u64::try_from((frees_at - now + 999) / 1000).unwrap_or(1),
        })
    }

    /// `resources` without cluster tasks, plus every cluster's current tasks: clusters keep
    /// their resource sets across an operator's versions.
    async fn with_cluster_tasks(&self, env: &Environment, resources: Vec<crate::intent::ResourceSpec>) -> Result<Intent, EnvError> {
        let tasks = self.cluster_tasks(env).await?;
        let mut resources: Vec<_> = resources
            .into_iter()
            .filter(|r| r.id.resource_type != crate::clusters::planner::TASK_TYPE)
            .collect();
        resources.extend(tasks);
        Ok(Intent::validate(crate::intent::IntentDocument { resources })?)
    }

    /// Stores `intent` (already holding the clusters' current tasks) as a new version and
    /// releases it. Every path that makes a version and releases it at once comes here: a
    /// rollback, a release of a version whose cluster tasks are stale, a cluster operation.
    /// The caller holds the environment's release turn.
    pub(super) async fn submit_and_release(
        &self,
        env: &Environment,
        running: &Running,
        intent: Intent,
        author: Option<&str>,
    ) -> Result<VersionInfo, EnvError> {
        Ok(self.store_version(env, running, intent, true, author).await?.0)
    }

    /// Pins `intent`'s adaptors under the environment's grants, checks its nodes, stores it as
    /// the next version and, when `release`, releases it and waits until its states are
    /// recorded. Returns the version and whether it was released. The caller holds the release
    /// turn.
    async fn store_version(
        &self,
        env: &Environment,
        running: &Running,
        intent: Intent,
        release: bool,
        author: Option<&str>,
    ) -> Result<(VersionInfo, bool), EnvError> {
        running.check_scheduler()?;
        let pinned = pinning::load_adaptors(&intent, &self.registry, &self.runtime, &running.grants()).await?;
        // An earlier version may name a node deleted since, or made private to another environment.
        self.check_nodes(&intent, &pinned.plugins, env).await?;
        let document = serde_json::to_string(&pinned.pinned_document(&intent)).expect("an intent serialises");
        let info = self.store.submit_version(&env.id, &document, author).await?;
        if !release {
            return Ok((info, false));
        }
        let info = self.store.release_version(&env.id, info.version).await?;
        self.metrics.released(&env.name, info.version);
        running.release(Version::new(info.version as u64, intent, pinned.plugins)).await?;
        Ok((info, true))
    }

    /// Rolls back to an earlier version: its (pinned) document, with the clusters' current
    /// tasks, becomes a new version, which is released at once. History stays linear: the new
    /// version records what is deployed now.
    pub async fn rollback(&self, key: &str, to: i64, author: Option<&str>) -> Result<VersionInfo, EnvError> {
        let env = self.get(key).await?;
        let running = self.running(&env).await?;
        let _turn = running.releases.lock().await;
        self.check_version_rate(&env).await?;
        let stored = Intent::parse(self.store.get_version(&env.id, to).await?.document.as_bytes())?;
        let intent = self.with_cluster_tasks(&env, stored.resources).await?;
        self.submit_and_release(&env, &running, intent, author).await
    }

    /// What changed from version `from` to version `to`.
    pub async fn diff(&self, key: &str, from: i64, to: i64) -> Result<IntentDiff, EnvError> {
        let env = self.get(key).await?;
        let parse = |document: String| Intent::parse(document.as_bytes());
        let a = parse(self.store.get_version(&env.id, from).await?.document)?;
        let b = parse(self.store.get_version(&env.id, to).await?.document)?;
        Ok(crate::intent::diff::diff(from, &a, to, &b))
    }

    /// Releases a stored version (also an older one: a rollback). A version whose cluster tasks
    /// are not the clusters' current ones is released as a new version that carries them.
    pub async fn release(&self, key: &str, version: i64, author: Option<&str>) -> Result<VersionInfo, EnvError> {
        let env = self.get(key).await?;
        let running = self.running(&env).await?;
        let _turn = running.releases.lock().await;
        let stored = Intent::parse(self.store.get_version(&env.id, version).await?.document.as_bytes())?;
        let composed = self.with_cluster_tasks(&env, stored.resources.clone()).await?;
        if composed.resources != stored.resources {
            // Its cluster tasks are not the clusters' current ones: a new version carries them.
            return self.submit_and_release(&env, &running, composed, author).await;
        }
        running.check_scheduler()?;
        let loaded = self.load_version(&env.id, version, &running.grants()).await?;
        self.check_nodes(&loaded.intent, &loaded.plugins, &env).await?;
        let info = self.store.release_version(&env.id, version).await?;
        self.metrics.released(&env.name, info.version);
        running.release(loaded).await?;
        Ok(info)
    }

    /// Every resource's node must be `local` or a registered node the environment may use. A
    /// node not verified yet (or unreachable, or blocked) is accepted: its resources stay
    /// `unavailable` (or fail as denied) until it is usable, as with a node that goes down later.
    /// A resource whose adaptor does not use nodes (`http-object`: the node part names an API)
    /// is not checked.
    pub(crate) async fn check_nodes(
        &self,
        intent: &Intent,
        plugins: &[Arc<orc_runtime::Plugin>],
        env: &Environment,
    ) -> Result<(), EnvError> {
        // A node registered, deleted or shared on another replica since this one last looked.
        let known = |r: &crate::intent::ResourceSpec| self.nodes.check(&r.id.node, &env.id).is_ok();
        let doubt = intent
            .resources
            .iter()
            .zip(plugins)
            .any(|(r, p)| pinning::uses_nodes(&p.manifest) && r.id.node != LOCAL_NODE && !known(r));
        if doubt && let Err(e) = self.nodes.refresh().await {
            tracing::warn!(error = %orc_manifest::error_chain(&e), "cannot read the nodes again");
        }
        let on_nodes = intent
            .resources
            .iter()
            .zip(plugins)
            .filter(|(_, p)| pinning::uses_nodes(&p.manifest))
            .map(|(r, _)| r);
        for r in on_nodes.filter(|r| r.id.node != LOCAL_NODE) {
            match self.nodes.check(&r.id.node, &env.id) {
                Ok(()) => {}
                Err(Refusal::Unknown) => {
                    return Err(EnvError::UnknownNode {
                        resource: r.id.clone(),
                        node: r.id.node.clone(),
                    });
                }
                Err(Refusal::NotAllowed) => {
                    return Err(EnvError::NodeNotAllowed {
                        resource: r.id.clone(),
                        node: r.id.node.clone(),
                        environment: env.name.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// What every operator's submission must keep to: at most `limits.max_resources_per_intent`
/// resources, none of the reserved type `task`.
fn check_submitted(env: &Environment, resources: &[ResourceSpec]) -> Result<(), EnvError> {
    let limit = env.settings.limits.max_resources_per_intent;
    if resources.len() as u64 > limit {
        return Err(EnvError::TooManyResources {
            environment: env.name.clone(),
            count: resources.len(),
            limit,
        });
    }
    if let Some(task) = resources.iter().find(|r| r.id.resource_type == crate::clusters::planner::TASK_TYPE) {
        return Err(EnvError::ReservedType(task.id.clone()));
    }
    Ok(())
}

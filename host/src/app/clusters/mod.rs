//! Template and cluster operations of the application: what the REST API calls; [`watch`]
//! follows each cluster operation to its end. What they take and answer, and the steps between
//! that need neither the store nor a plugin (checks, plans, views), are the domain's
//! ([`crate::clusters`]).

mod watch;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use orc_cluster::{Layout, NodeInfo, Template, check_layout};
use orc_manifest::{Digest, PluginKind};
use orc_runtime::Grants;
use orc_runtime::wit;
use serde_json::Value;

use crate::app::{App, EnvError};
use crate::clusters::plan::{effective_config, plan_for, replan};
use crate::clusters::planner;
use crate::clusters::requests::{
    AmendRequest, CreateRequest, DEFAULT_MAX_ATTEMPTS, ReconfigureRequest, ServiceAction, check_overrides, lease_ms,
};
use crate::clusters::stored::{check_if_match, ensure_idle, stored_doc, stored_template};
use crate::clusters::view::{ClusterView, Outcome, Progress, preview, progress_of};
use crate::clusters::{ClusterDoc, ClusterError, ClusterFailure, ClusterStatus, DEFAULT_SOLVER, OperationKind, busy_status, validate_name};
use crate::intent::pinning;
use crate::intent::{Intent, IntentDocument, PluginRef, ResourceSpec};
use crate::json::merge_patch;
use crate::store::{ClusterRecord, Environment, ResourceState, StoreError, TemplateRecord, now_ms};

/// What [`App::release_cluster_tasks`] does to the cluster's row once the tasks are
/// released. Each names the revision of the row the caller read: if the row moved on since,
/// nothing is released (409 `version_conflict`).
#[derive(Debug)]
pub(crate) enum RowChange<'a> {
    /// Leave the row as it is (at this revision).
    Keep(i64),
    Update(&'a ClusterRecord),
    /// Delete the row (at this revision).
    Delete(i64),
}

impl RowChange<'_> {
    fn revision(&self) -> i64 {
        match self {
            RowChange::Keep(r) | RowChange::Delete(r) => *r,
            RowChange::Update(record) => record.revision,
        }
    }
}

/// A write of a cluster's row refused by the store, as the operator sees it: a row that moved
/// on is a `version_conflict`.
fn row_error(e: StoreError) -> ClusterError {
    match e {
        StoreError::Conflict { what } => ClusterError::Env(EnvError::VersionConflict(what)),
        e => e.into(),
    }
}

/// How often an operation sent without `If-Match` is run again after losing the race for the
/// cluster's row; each loss means another write landed, so this only bounds starvation.
const RACE_ATTEMPTS: usize = 8;

/// Runs `op`, and runs it again (on the cluster as it then is) when it lost the race for the
/// cluster's row to another write and the caller named no revision: without `If-Match` a request
/// applies to the cluster as it is when it runs, so only a real refusal (`cluster_busy`: another
/// operation started first) reaches the caller. With `If-Match` the conflict is the answer.
async fn unless_raced<T, F, Fut>(if_match: Option<&str>, mut op: F) -> Result<T, ClusterError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClusterError>>,
{
    let mut attempts = 1;
    loop {
        match op().await {
            Err(ClusterError::Env(EnvError::VersionConflict(what))) if if_match.is_none() && attempts < RACE_ATTEMPTS => {
                tracing::debug!(%what, "the cluster changed meanwhile; running the operation again");
                attempts += 1;
            }
            other => return other,
        }
    }
}

/// What an operation reads before it changes a cluster ([`App::current`]).
struct Current {
    env: Environment,
    record: ClusterRecord,
    doc: ClusterDoc,
    template: Template,
}

impl App {
    // --- templates ---

    /// Validates `body` as a template, pins its solver and automators (each must be a plugin of
    /// that kind in the registry) and stores it as the next version of `name`.
    pub async fn submit_template(
        &self,
        key: &str,
        name: &str,
        body: Value,
        if_match: Option<&str>,
    ) -> Result<TemplateRecord, ClusterError> {
        let env = self.get(key).await?;
        validate_name("template", name)?;
        let mut template = Template::from_json(body)?;
        let solver = template.solver.clone().unwrap_or_else(|| DEFAULT_SOLVER.to_string());
        let grants = env.settings.capabilities.grants();
        template.solver = Some(self.pin_plugin(name, &solver, PluginKind::Solver, &grants).await?.to_string());
        for service in template.services.values_mut() {
            service.automator = self
                .pin_plugin(name, &service.automator, PluginKind::Automator, &grants)
                .await?
                .to_string();
        }
        let document = serde_json::to_string(&template).expect("a template serialises");
        match crate::if_match::expected_revision(if_match) {
            None => Ok(self.store.insert_template(&env.id, name, &document).await?),
            Some(expected) => match self.store.insert_template_after(&env.id, name, &document, expected).await {
                Err(StoreError::Conflict { what }) => Err(ClusterError::Env(EnvError::VersionConflict(what))),
                other => Ok(other?),
            },
        }
    }

    /// Resolves and loads a template's plugin under the environment's `grants`: one that requests
    /// a capability not granted is refused now, not when a cluster is made from the template.
    pub(crate) async fn pin_plugin(
        &self,
        template: &str,
        reference: &str,
        kind: PluginKind,
        grants: &Grants,
    ) -> Result<Digest, ClusterError> {
        let parsed: PluginRef = reference
            .parse()
            .map_err(|e: crate::intent::IntentError| ClusterError::PluginRejected {
                template: template.to_string(),
                reference: reference.to_string(),
                message: e.to_string(),
            })?;
        let digest = pinning::resolve(&self.registry, &parsed).map_err(|_| ClusterError::UnknownPlugin {
            template: template.to_string(),
            reference: reference.to_string(),
        })?;
        self.runtime
            .load(&digest, kind, &self.registry, grants)
            .await
            .map_err(|e| match e {
                orc_runtime::LoadError::NotGranted { digest, name, capability } => ClusterError::CapabilityNotGranted {
                    template: template.to_string(),
                    plugin: name,
                    digest,
                    capability,
                },
                e => ClusterError::PluginRejected {
                    template: template.to_string(),
                    reference: reference.to_string(),
                    message: e.to_string(),
                },
            })?;
        Ok(digest)
    }

    pub async fn templates(&self, key: &str) -> Result<Vec<TemplateRecord>, ClusterError> {
        let env = self.get(key).await?;
        Ok(self.store.list_templates(&env.id).await?)
    }

    pub async fn template(&self, key: &str, name: &str, version: Option<i64>) -> Result<TemplateRecord, ClusterError> {
        let env = self.get(key).await?;
        self.template_of(&env, name, version).await
    }

    async fn template_of(&self, env: &Environment, name: &str, version: Option<i64>) -> Result<TemplateRecord, ClusterError> {
        match self.store.get_template(&env.id, name, version).await {
            Err(StoreError::NotFound { .. }) => Err(ClusterError::UnknownTemplate(match version {
                Some(v) => format!("{name}` version `{v}"),
                None => name.to_string(),
            })),
            other => Ok(other?),
        }
    }

    pub async fn template_versions(&self, key: &str, name: &str) -> Result<Vec<TemplateRecord>, ClusterError> {
        let env = self.get(key).await?;
        match self.store.list_template_versions(&env.id, name).await {
            Ok(versions) if !versions.is_empty() => Ok(versions),
            Ok(_) | Err(StoreError::NotFound { .. }) => Err(ClusterError::UnknownTemplate(name.to_string())),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn delete_template(&self, key: &str, name: &str, if_match: Option<&str>) -> Result<(), ClusterError> {
        let env = self.get(key).await?;
        if let Some(expected) = crate::if_match::expected_revision(if_match) {
            let latest = self.template_of(&env, name, None).await?.version;
            if latest != expected {
                return Err(ClusterError::Env(EnvError::VersionConflict(format!(
                    "template `{name}` is at version {latest}, not {expected}"
                ))));
            }
        }
        match self.store.delete_template(&env.id, name).await {
            Err(StoreError::NotFound { .. }) => Err(ClusterError::UnknownTemplate(name.to_string())),
            Err(StoreError::Conflict { what }) => Err(ClusterError::TemplateInUse(what)),
            other => Ok(other?),
        }
    }

    // --- clusters ---

    /// Solves, plans and releases a new cluster (or only previews it). The cluster is
    /// `creating` until every task is done.
    pub async fn create_cluster(self: &Arc<Self>, key: &str, req: CreateRequest, author: Option<&str>) -> Result<Outcome, ClusterError> {
        let env = self.get(key).await?;
        validate_name("cluster", &req.name)?;
        let lease = req.lease_s.map(lease_ms).transpose()?;
        if self.store.find_cluster(&env.id, &req.name).await?.is_some() {
            return Err(ClusterError::Exists(req.name));
        }
        let record = self.template_of(&env, &req.template, req.template_version).await?;
        let template = stored_template(&record)?;
        let services = req.services.clone().unwrap_or_else(|| template.default_services());
        let selected = template.select(&services)?;
        let size = req
            .size
            .or(template.defaults.size)
            .ok_or_else(|| ClusterError::Invalid("size: neither the request nor the template's defaults give one".into()))?;
        if size == 0 {
            return Err(ClusterError::Invalid("size: a cluster has at least one node".into()));
        }
        check_overrides(&selected, &req.config)?;
        if req.max_attempts == Some(0) {
            return Err(ClusterError::Invalid("max_attempts: at least 1".into()));
        }
        let mut doc = ClusterDoc {
            services,
            size,
            config: req.config.clone(),
            nodes: req.nodes.clone(),
            layout: Layout::default(),
            stopped: BTreeSet::new(),
            tasks: Vec::new(),
            operation: OperationKind::Create,
            generation: 1,
            restart: None,
            max_attempts: req.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
            failure: None,
            started_at: now_ms(),
            author: author.map(str::to_string),
        };
        doc.layout = self.solve(&env, &selected, size, &doc.nodes, &Layout::default()).await?;
        let tasks = plan_for(&req.name, &selected, &doc, &[], true)?;
        if req.preview {
            return Ok(Outcome::Preview(preview(&doc.layout, &[], &tasks)));
        }
        doc.tasks = tasks;
        let now = now_ms();
        let record = ClusterRecord {
            name: req.name.clone(),
            template: record.name.clone(),
            template_version: record.version,
            status: ClusterStatus::Creating.as_str().to_string(),
            document: serde_json::to_string(&doc).expect("a cluster serialises"),
            lease_expires_at: lease.map(|ms| now.saturating_add(ms)),
            revision: 1,
            created_at: now,
            updated_at: now,
        };
        match self.store.insert_cluster(&env.id, &record).await {
            Err(StoreError::Conflict { .. }) => return Err(ClusterError::Exists(req.name)),
            other => other?,
        }
        if let Err(e) = self
            .release_cluster_tasks(&env, &req.name, &doc.tasks, RowChange::Keep(record.revision), author)
            .await
        {
            // Nothing was released: the cluster never existed.
            let _ = self.store.delete_cluster(&env.id, &req.name, record.revision).await;
            return Err(e);
        }
        tracing::info!(environment = %env.name, cluster = %req.name, tasks = doc.tasks.len(), "cluster creating");
        self.spawn_watcher(env.id, req.name.clone(), doc.generation);
        Ok(Outcome::Started(Box::new(self.view(&env, &record, &doc).await?)))
    }

    pub async fn clusters(&self, key: &str) -> Result<Vec<ClusterView>, ClusterError> {
        let env = self.get(key).await?;
        let mut views = Vec::new();
        for record in self.store.list_clusters(&env.id).await? {
            let doc = stored_doc(&record)?;
            views.push(self.view(&env, &record, &doc).await?);
        }
        Ok(views)
    }

    pub async fn cluster(&self, key: &str, name: &str) -> Result<ClusterView, ClusterError> {
        let env = self.get(key).await?;
        let record = self.cluster_record(&env, name).await?;
        let doc = stored_doc(&record)?;
        self.view(&env, &record, &doc).await
    }

    /// Changes the size, adds services or changes the nodes it may use: solved again from the
    /// current layout (changing it as little as the solver can), planned, released.
    pub async fn amend_cluster(
        self: &Arc<Self>,
        key: &str,
        name: &str,
        req: AmendRequest,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<Outcome, ClusterError> {
        unless_raced(if_match, || self.amend_once(key, name, req.clone(), if_match, author)).await
    }

    async fn amend_once(
        self: &Arc<Self>,
        key: &str,
        name: &str,
        req: AmendRequest,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<Outcome, ClusterError> {
        let Current {
            env,
            record,
            mut doc,
            template,
        } = self.current(key, name, if_match).await?;
        ensure_idle(name, &record)?;
        for s in &req.add_services {
            if doc.services.contains(s) {
                return Err(ClusterError::Invalid(format!("add_services: the cluster already runs `{s}`")));
            }
            doc.services.push(s.clone());
        }
        let selected = template.select(&doc.services)?;
        if let Some(size) = req.size {
            if size == 0 {
                return Err(ClusterError::Invalid("size: a cluster has at least one node".into()));
            }
            doc.size = size;
        }
        if let Some(nodes) = req.nodes {
            doc.nodes = nodes;
        }
        let layout = self.solve(&env, &selected, doc.size, &doc.nodes, &doc.layout).await?;
        let old_layout = std::mem::replace(&mut doc.layout, layout);
        let (previous, tasks) = replan(name, &selected, &mut doc)?;
        if req.preview {
            return Ok(Outcome::Preview(preview(&doc.layout, &previous, &tasks)));
        }
        tracing::info!(cluster = %name, from = ?old_layout, to = ?doc.layout, "cluster amended");
        doc.tasks = tasks;
        self.begin_operation(&env, record, doc, OperationKind::Amend, ClusterStatus::Amending, author)
            .await
    }

    /// Changes services' configuration (merge patches of the cluster's overrides).
    pub async fn reconfigure_cluster(
        self: &Arc<Self>,
        key: &str,
        name: &str,
        req: ReconfigureRequest,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<Outcome, ClusterError> {
        unless_raced(if_match, || self.reconfigure_once(key, name, req.clone(), if_match, author)).await
    }

    async fn reconfigure_once(
        self: &Arc<Self>,
        key: &str,
        name: &str,
        req: ReconfigureRequest,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<Outcome, ClusterError> {
        let Current {
            env,
            record,
            mut doc,
            template,
        } = self.current(key, name, if_match).await?;
        ensure_idle(name, &record)?;
        let selected = template.select(&doc.services)?;
        check_overrides(&selected, &req.config)?;
        for (service, patch) in req.config {
            let entry = doc.config.entry(service).or_insert_with(|| Value::Object(Default::default()));
            merge_patch(entry, patch);
        }
        let (previous, tasks) = replan(name, &selected, &mut doc)?;
        if req.preview {
            return Ok(Outcome::Preview(preview(&doc.layout, &previous, &tasks)));
        }
        doc.tasks = tasks;
        self.begin_operation(&env, record, doc, OperationKind::Reconfigure, ClusterStatus::Reconfiguring, author)
            .await
    }

    /// Stops, starts or restarts one service on every node that runs it (in dependency order:
    /// a stop goes through the automators' `stop`, dependents first).
    pub async fn service_action(
        self: &Arc<Self>,
        key: &str,
        name: &str,
        service: &str,
        action: ServiceAction,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<ClusterView, ClusterError> {
        unless_raced(if_match, || self.service_action_once(key, name, service, action, if_match, author)).await
    }

    async fn service_action_once(
        self: &Arc<Self>,
        key: &str,
        name: &str,
        service: &str,
        action: ServiceAction,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<ClusterView, ClusterError> {
        let Current {
            env,
            record,
            mut doc,
            template,
        } = self.current(key, name, if_match).await?;
        ensure_idle(name, &record)?;
        if !doc.services.iter().any(|s| s == service) {
            return Err(ClusterError::UnknownService(service.to_string()));
        }
        let (kind, status) = match action {
            ServiceAction::Stop => {
                doc.stopped.insert(service.to_string());
                (OperationKind::Stop, ClusterStatus::Stopping)
            }
            ServiceAction::Start => {
                doc.stopped.remove(service);
                (OperationKind::Start, ClusterStatus::Starting)
            }
            ServiceAction::Restart => {
                doc.stopped.insert(service.to_string());
                doc.restart = Some((service.to_string(), false));
                (OperationKind::Restart, ClusterStatus::Restarting)
            }
        };
        let selected = template.select(&doc.services)?;
        doc.tasks = replan(name, &selected, &mut doc)?.1;
        self.begin(&env, record, doc, kind, status, author).await
    }

    /// Runs a failed cluster's operation again: a rolled-back create is planned again on the
    /// same layout (never more nodes than asked); other failures retry their failed tasks now.
    pub async fn retry_cluster(
        self: &Arc<Self>,
        key: &str,
        name: &str,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<ClusterView, ClusterError> {
        unless_raced(if_match, || self.retry_once(key, name, if_match, author)).await
    }

    async fn retry_once(
        self: &Arc<Self>,
        key: &str,
        name: &str,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<ClusterView, ClusterError> {
        let Current {
            env,
            record,
            mut doc,
            template,
        } = self.current(key, name, if_match).await?;
        if ClusterStatus::parse(&record.status) != Some(ClusterStatus::Failed) {
            return Err(ClusterError::Invalid(format!("cluster `{name}` has not failed: nothing to retry")));
        }
        let selected = template.select(&doc.services)?;
        let (kind, status) = if doc.operation == OperationKind::Rollback {
            (OperationKind::Create, ClusterStatus::Creating)
        } else {
            (doc.operation, busy_status(doc.operation))
        };
        doc.tasks = replan(name, &selected, &mut doc)?.1;
        let running = self.running(&env).await?;
        running.scheduler.deploy_failed().map_err(|e| running.unavailable(e))?;
        self.begin(&env, record, doc, kind, status, author).await
    }

    /// Extends (or sets) the cluster's lease: it is deleted `lease_s` seconds from now.
    pub async fn extend_lease(&self, key: &str, name: &str, lease_s: u64, if_match: Option<&str>) -> Result<ClusterView, ClusterError> {
        unless_raced(if_match, || self.extend_lease_once(key, name, lease_s, if_match)).await
    }

    async fn extend_lease_once(&self, key: &str, name: &str, lease_s: u64, if_match: Option<&str>) -> Result<ClusterView, ClusterError> {
        let (env, mut record) = self.row(key, name, if_match).await?;
        record.lease_expires_at = Some(now_ms().saturating_add(lease_ms(lease_s)?));
        let record = self.write_cluster(&env, &record).await?;
        let doc = stored_doc(&record)?;
        self.view(&env, &record, &doc).await
    }

    /// Deletes the cluster: every task is undone (services stopped, then removed, in reverse
    /// dependency order); the cluster disappears when that is done. Allowed in any state.
    pub async fn delete_cluster(
        self: &Arc<Self>,
        key: &str,
        name: &str,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<ClusterView, ClusterError> {
        unless_raced(if_match, || self.delete_once(key, name, if_match, author)).await
    }

    async fn delete_once(
        self: &Arc<Self>,
        key: &str,
        name: &str,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<ClusterView, ClusterError> {
        let (env, record) = self.row(key, name, if_match).await?;
        self.undo_cluster(&env, record, OperationKind::Delete, None, author).await
    }

    /// Purges every task of the cluster (delete, or the rollback of a failed create).
    pub(crate) async fn undo_cluster(
        self: &Arc<Self>,
        env: &Environment,
        record: ClusterRecord,
        kind: OperationKind,
        failure: Option<ClusterFailure>,
        author: Option<&str>,
    ) -> Result<ClusterView, ClusterError> {
        let mut doc = stored_doc(&record)?;
        let template = stored_template(&self.template_of(env, &record.template, Some(record.template_version)).await?)?;
        let selected = template.select(&doc.services)?;
        let keep = std::mem::take(&mut doc.layout);
        doc.tasks = replan(&record.name, &selected, &mut doc)?.1;
        // A rollback keeps the layout it undid, so that a retry creates the same cluster.
        if kind == OperationKind::Rollback {
            doc.layout = keep;
        }
        doc.failure = failure.or(doc.failure);
        let status = if kind == OperationKind::Rollback {
            ClusterStatus::RollingBack
        } else {
            ClusterStatus::Deleting
        };
        self.begin(env, record, doc, kind, status, author).await
    }

    /// [`App::begin_operation`], for an operation that is never a preview: the view it started.
    async fn begin(
        self: &Arc<Self>,
        env: &Environment,
        record: ClusterRecord,
        doc: ClusterDoc,
        kind: OperationKind,
        status: ClusterStatus,
        author: Option<&str>,
    ) -> Result<ClusterView, ClusterError> {
        match self.begin_operation(env, record, doc, kind, status, author).await? {
            Outcome::Started(view) => Ok(*view),
            Outcome::Preview(_) => unreachable!("begin_operation starts; only the callers preview"),
        }
    }

    /// The cluster's row as an operation finds it: refused when `If-Match` names another
    /// revision.
    async fn row(&self, key: &str, name: &str, if_match: Option<&str>) -> Result<(Environment, ClusterRecord), ClusterError> {
        let env = self.get(key).await?;
        let record = self.cluster_record(&env, name).await?;
        check_if_match(&record, if_match)?;
        Ok((env, record))
    }

    /// [`App::row`] with the cluster's document and its template version.
    async fn current(&self, key: &str, name: &str, if_match: Option<&str>) -> Result<Current, ClusterError> {
        let (env, record) = self.row(key, name, if_match).await?;
        let doc = stored_doc(&record)?;
        let template = stored_template(&self.template_of(&env, &record.template, Some(record.template_version)).await?)?;
        Ok(Current {
            env,
            record,
            doc,
            template,
        })
    }

    /// Stores the cluster's new plan under a new generation, releases it and watches it;
    /// `author` started it (`None`: the host itself).
    async fn begin_operation(
        self: &Arc<Self>,
        env: &Environment,
        mut record: ClusterRecord,
        mut doc: ClusterDoc,
        kind: OperationKind,
        status: ClusterStatus,
        author: Option<&str>,
    ) -> Result<Outcome, ClusterError> {
        doc.operation = kind;
        doc.author = author.map(str::to_string);
        doc.generation += 1;
        doc.started_at = now_ms();
        if kind != OperationKind::Rollback {
            doc.failure = None;
        }
        record.status = status.as_str().to_string();
        record.document = serde_json::to_string(&doc).expect("a cluster serialises");
        let record = self
            .release_cluster_tasks(env, &record.name, &doc.tasks, RowChange::Update(&record), author)
            .await?
            .expect("an updated row");
        tracing::info!(environment = %env.name, cluster = %record.name, operation = ?kind, tasks = doc.tasks.len(), "cluster operation");
        self.spawn_watcher(env.id, record.name.clone(), doc.generation);
        Ok(Outcome::Started(Box::new(self.view(env, &record, &doc).await?)))
    }

    pub(crate) async fn cluster_record(&self, env: &Environment, name: &str) -> Result<ClusterRecord, ClusterError> {
        self.store
            .find_cluster(&env.id, name)
            .await?
            .ok_or_else(|| ClusterError::UnknownCluster(name.chars().take(100).collect()))
    }

    /// The nodes a cluster of `env` may be laid out on (verified, public or private to `env`),
    /// restricted to `allowed` when it names any.
    pub(crate) async fn cluster_nodes(&self, env: &Environment, allowed: &[String]) -> Result<Vec<NodeInfo>, ClusterError> {
        let all = self
            .nodes
            .list()
            .await
            .map_err(|e| ClusterError::Invalid(format!("cannot list nodes: {e}")))?;
        for a in allowed {
            match all.iter().find(|n| &n.name == a) {
                None => return Err(ClusterError::Invalid(format!("nodes: `{a}` is not a registered node"))),
                Some(n) if n.environment.is_some_and(|e| e != env.id) => {
                    return Err(ClusterError::Invalid(format!("nodes: `{a}` is private to another environment")));
                }
                Some(_) => {}
            }
        }
        Ok(all
            .into_iter()
            .filter(|n| n.status.is_verified() && n.environment.is_none_or(|e| e == env.id))
            .filter(|n| allowed.is_empty() || allowed.contains(&n.name))
            .map(|n| NodeInfo {
                name: n.name,
                labels: n.labels,
                facts: n.facts.unwrap_or_else(|| Value::Object(Default::default())),
            })
            .collect())
    }

    /// Asks the template's solver for a layout and checks it.
    pub(crate) async fn solve(
        &self,
        env: &Environment,
        template: &Template,
        size: u32,
        allowed: &[String],
        existing: &Layout,
    ) -> Result<Layout, ClusterError> {
        let nodes = self.cluster_nodes(env, allowed).await?;
        let reference = template.solver.clone().unwrap_or_default();
        let digest: Digest = reference
            .parse()
            .map_err(|_| ClusterError::Invalid(format!("the stored template's solver `{reference}` is not pinned")))?;
        let failed = |message: String| ClusterError::SolverFailed {
            solver: reference.clone(),
            message,
        };
        let plugin = self
            .runtime
            .load(&digest, PluginKind::Solver, &self.registry, &env.settings.capabilities.grants())
            .await
            .map_err(|e| failed(e.to_string()))?;
        let request = wit::LayoutRequest {
            template: serde_json::to_string(template).expect("a template serialises"),
            size,
            nodes: nodes
                .iter()
                .map(|n| wit::NodeInfo {
                    name: n.name.clone(),
                    labels: n.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    facts: n.facts.to_string(),
                })
                .collect(),
            existing: existing
                .0
                .iter()
                .map(|(node, services)| wit::Placement {
                    node: node.clone(),
                    services: services.iter().cloned().collect(),
                })
                .collect(),
        };
        let ctx = self.running(env).await?.ctx();
        let mut instance = plugin.solver(&ctx).await.map_err(|e| failed(e.to_string()))?;
        let answer = instance.solve(&request).await.map_err(|e| failed(e.to_string()))?;
        let placements = match answer {
            Ok(p) => p,
            Err(wit::SolveError::NoValidLayout(no)) => {
                return Err(ClusterError::NoValidLayout {
                    constraint: no.constraint,
                    message: no.message,
                });
            }
            Err(wit::SolveError::Failed(e)) => return Err(failed(e.message)),
        };
        let layout: Layout = placements.into_iter().map(|p| (p.node, p.services)).collect();
        check_layout(template, size, &nodes, &layout).map_err(|violation| ClusterError::InvalidLayout {
            solver: reference.clone(),
            violation,
        })?;
        Ok(layout)
    }

    /// Releases a new version: the released version's resources with `cluster`'s tasks replaced
    /// by `tasks`; then, still holding the environment's release turn, makes `row` (the row an
    /// operator's version reads the cluster's tasks from) agree. Returns the stored row.
    ///
    /// Every write of a cluster's row holds the release turn (here or in
    /// [`App::write_cluster`]), so the revision checked before releasing is still the row's when
    /// it is written after: an operation that read the row before another changed it releases
    /// nothing and is refused with `version_conflict`.
    pub(crate) async fn release_cluster_tasks(
        &self,
        env: &Environment,
        cluster: &str,
        tasks: &[ResourceSpec],
        row: RowChange<'_>,
        author: Option<&str>,
    ) -> Result<Option<ClusterRecord>, ClusterError> {
        let running = self.running(env).await?;
        let _turn = running.releases.lock().await;
        running.check_scheduler()?;
        let expected = row.revision();
        match self.store.find_cluster(&env.id, cluster).await? {
            None => return Err(ClusterError::UnknownCluster(cluster.to_string())),
            Some(current) if current.revision != expected => {
                return Err(ClusterError::Env(EnvError::VersionConflict(format!(
                    "cluster `{cluster}` is at revision {}, not {expected}: it changed since this operation read it",
                    current.revision
                ))));
            }
            Some(_) => {}
        }
        let mut resources: Vec<ResourceSpec> = match running.released_version() {
            Some(v) => v
                .intent
                .resources
                .iter()
                .filter(|r| !planner::is_task_of(&r.id, cluster))
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        resources.extend(tasks.iter().cloned());
        let intent = Intent::validate(IntentDocument { resources })?;
        let info = self.submit_and_release(env, &running, intent, author).await?;
        tracing::debug!(environment = %env.name, cluster, version = info.version, "tasks released");
        Ok(match row {
            RowChange::Keep(_) => None,
            RowChange::Update(record) => Some(self.store.update_cluster(&env.id, record).await.map_err(row_error)?),
            RowChange::Delete(revision) => {
                self.store.delete_cluster(&env.id, cluster, revision).await.map_err(row_error)?;
                None
            }
        })
    }

    /// Writes a cluster's row without releasing anything (its status, its lease), under the
    /// environment's release turn (see [`App::release_cluster_tasks`]) and only if it is still
    /// at `record.revision`.
    pub(crate) async fn write_cluster(&self, env: &Environment, record: &ClusterRecord) -> Result<ClusterRecord, ClusterError> {
        let running = self.running(env).await?;
        let _turn = running.releases.lock().await;
        self.store.update_cluster(&env.id, record).await.map_err(row_error)
    }

    /// Every cluster's and every process's current tasks in `env`: what an operator's new
    /// version keeps.
    pub(crate) async fn cluster_tasks(&self, env: &Environment) -> Result<Vec<ResourceSpec>, EnvError> {
        let mut tasks = self.process_tasks(env).await?;
        for record in self.store.list_clusters(&env.id).await? {
            match serde_json::from_str::<ClusterDoc>(&record.document) {
                Ok(doc) => tasks.extend(doc.tasks),
                Err(e) => {
                    return Err(EnvError::Store(StoreError::Corrupt {
                        what: format!("cluster `{}`: {e}", record.name),
                    }));
                }
            }
        }
        Ok(tasks)
    }

    /// The states of `tasks` that have one, by resource id: a process's tasks' as the
    /// environment keeps them in memory while it knows them (`app::processes::news`), others'
    /// from the store.
    pub(crate) async fn task_states(
        &self,
        env: &Environment,
        tasks: &[&ResourceSpec],
    ) -> Result<HashMap<String, ResourceState>, ClusterError> {
        let ids: Vec<String> = tasks.iter().map(|t| t.id.to_string()).collect();
        if tasks.iter().all(|t| crate::processes::is_process_task(t))
            && let Some(states) = self.running(env).await?.process_news.states_of(ids.iter().map(String::as_str))
        {
            return Ok(states);
        }
        let states = self.store.states_of(&env.id, &ids).await?;
        Ok(states.into_iter().map(|s| (s.resource_id.clone(), s)).collect())
    }

    /// How far the cluster's plan is.
    pub(crate) async fn progress(&self, env: &Environment, doc: &ClusterDoc) -> Result<Progress, ClusterError> {
        self.task_progress(env, &doc.tasks, doc.max_attempts).await
    }

    /// How far the plan `planned` (one resource set's tasks) is; a task failed `max_attempts`
    /// times fails it.
    pub(crate) async fn task_progress(
        &self,
        env: &Environment,
        planned: &[ResourceSpec],
        max_attempts: u32,
    ) -> Result<Progress, ClusterError> {
        let states = self.task_states(env, &planned.iter().collect::<Vec<_>>()).await?;
        progress_of(planned, max_attempts, &states)
    }

    async fn view(&self, env: &Environment, record: &ClusterRecord, doc: &ClusterDoc) -> Result<ClusterView, ClusterError> {
        let progress = self.progress(env, doc).await?;
        let config = match self.template_of(env, &record.template, Some(record.template_version)).await {
            Ok(t) => effective_config(&stored_template(&t)?, doc),
            Err(_) => BTreeMap::new(),
        };
        Ok(ClusterView::new(record, doc, progress.tasks, config))
    }
}

//! Processes of the application: create (on a named node, or where the solver puts it),
//! update (a new version and/or configuration), terminate, list and show; [`watch`] follows each
//! operation to its end. The model and its lifecycle: [`crate::processes`].
//!
//! Each operation checks what a release would refuse, writes the process's row
//! (revision-checked: `If-Match`, and any writer that read an older revision, gets
//! `version_conflict`) and asks the environment's [`release`]r for a version with the rows' tasks.
//! So two operations on one process never both pass, an operator's intent, which carries every
//! process's tasks from the rows, never loses one, and a burst of operations shares versions.

mod connections;
mod news;
mod release;
mod table;
mod watch;

pub(crate) use connections::CONNECTION_REVISION;
pub use connections::{ConnectRequest, ConnectionView, Endpoint, PendingChange, PendingList};
pub(crate) use news::ProcessNews;
pub(crate) use release::{Release, is_process_task};
use table::Decoded;
pub(crate) use table::ProcessTable;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use orc_cluster::{Layout, Needs, ServiceDocument, Template};
use orc_manifest::PluginKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::app::App;
use crate::clusters::planner::{self, PlanInput};
use crate::clusters::view::{Progress, TaskView, progress_of};
use crate::clusters::{ClusterError, ClusterFailure};
use crate::intent::{ResourceId, ResourceSpec};
use crate::processes::{Deployment, Operation, ProcessDoc, ProcessState, ServicesError, set_of};
use crate::store::{Environment, Millis, ProcessRecord, StoreError, now_ms};

/// How many times a task may fail before its operation fails (and is rolled back).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// `POST …/processes`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProcess {
    pub name: String,
    /// `name@version` of a service in the catalog.
    pub service: String,
    /// The node to run on; the solver picks one the service's needs allow when absent.
    #[serde(default)]
    pub node: Option<String>,
    /// The process's own configuration, valid against the service's `config_schema`.
    #[serde(default = "empty_object")]
    #[schema(value_type = Object)]
    pub config: Value,
    /// Port name → number, replacing the service's defaults.
    #[serde(default)]
    pub ports: BTreeMap<String, u16>,
    /// A task failing this many times fails the operation (default 3).
    #[serde(default)]
    pub max_attempts: Option<u32>,
}

/// `PATCH …/processes/{name}`: what is given replaces what the process has.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateProcess {
    /// Another version of the same service (`name@version`).
    #[serde(default)]
    pub service: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub config: Option<Value>,
    #[serde(default)]
    pub ports: Option<BTreeMap<String, u16>>,
}

pub(crate) fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// What a process is told of its connections ([`App::delivered_connections`]): what its
/// automator gets under the service's `connections_key`, and the starts its `configure` and
/// `start` wait for — a peer's where it goes (moving, or updating to other ports), where the
/// process is told it runs.
#[derive(Debug, Clone)]
pub(crate) struct Delivered {
    pub config: Value,
    pub waits: Vec<ResourceId>,
}

impl Delivered {
    /// No connections.
    pub(crate) fn none() -> Delivered {
        Delivered {
            config: empty_object(),
            waits: Vec::new(),
        }
    }
}

/// A process as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ProcessView {
    pub name: String,
    pub state: ProcessState,
    /// Counts the process's changes: its ETag.
    pub revision: i64,
    /// `name@version` of the service it is driven to.
    pub service: String,
    pub node: String,
    /// Its configuration; values the schema marks `writeOnly` or `format: password` are
    /// `"<redacted>"`.
    #[schema(value_type = Object)]
    pub config: Value,
    pub ports: BTreeMap<String, u16>,
    /// What last ran (service, node), when something has.
    pub active: Option<ActiveView>,
    pub failure: Option<ClusterFailure>,
    /// Tasks by state: `done`, `pending`, and the resource statuses.
    pub progress: BTreeMap<String, usize>,
    pub tasks: Vec<TaskView>,
    /// Its connections, from either side.
    pub connections: Vec<ConnectionView>,
    /// What it has not taken yet: its tasks whose desired state is not deployed.
    pub pending: Vec<PendingChange>,
    /// Why its latest change is not released yet, while the environment's last attempt to
    /// release processes failed (it is tried again); `null` otherwise.
    pub release_error: Option<String>,
    /// Its tasks' latest actions, newest first (on `GET …/processes/{name}` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recent_actions: Option<Vec<RecentAction>>,
    /// Who started the current operation; `null`: the host itself.
    pub operation_author: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// One action of a process's tasks, from the action log.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RecentAction {
    pub resource: String,
    /// What started it (`deploy`, `repair`, `dryrun`, …).
    pub kind: String,
    pub outcome: String,
    pub started_at: Millis,
    pub finished_at: Millis,
    /// `code: message` of its error.
    pub error: Option<String>,
}

/// What the views of one environment's processes share.
struct ViewContext {
    connections: Vec<crate::store::ConnectionRecord>,
    /// The states of the viewed processes' tasks, by resource id (read in one go).
    states: std::collections::HashMap<String, crate::store::ResourceState>,
    /// Each service version's configuration schema, by `name@version`.
    schemas: BTreeMap<String, Value>,
    running: Arc<crate::app::running::Running>,
    release_error: Option<String>,
}

/// How many actions a process's view shows.
const RECENT_ACTIONS: usize = 10;

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ActiveView {
    pub service: String,
    pub node: String,
}

/// Where a process goes: the node an operator named, or where the solver puts it (never on
/// `except`, the node a moving process leaves).
#[derive(Debug, Clone, Copy)]
enum NodeChoice<'a> {
    Named(&'a str),
    Solver { except: Option<&'a str> },
}

impl<'a> NodeChoice<'a> {
    fn named_or_solver(node: Option<&'a str>, except: Option<&'a str>) -> NodeChoice<'a> {
        node.map_or(NodeChoice::Solver { except }, NodeChoice::Named)
    }
}

impl App {
    /// Creates a process: the service version resolved, its configuration validated, its node
    /// checked (or chosen by the solver), its tasks released. The process is `creating` until they
    /// are done.
    pub async fn create_process(
        self: &Arc<Self>,
        key: &str,
        req: CreateProcess,
        author: Option<&str>,
    ) -> Result<ProcessView, ServicesError> {
        let env = self.get(key).await?;
        crate::clusters::validate_name("process", &req.name)?;
        let running = self.running(&env).await?;
        let _services = running.services.lock().await;
        if req.max_attempts == Some(0) {
            return Err(ServicesError::Invalid("max_attempts: at least 1".into()));
        }
        if self.find_process(&env, &req.name).await?.is_some() {
            return Err(ServicesError::ProcessExists(req.name));
        }
        let doc = self.catalog_document(&req.service).await?;
        let target = self
            .deployment(
                &env,
                &req.name,
                doc,
                NodeChoice::named_or_solver(req.node.as_deref(), None),
                req.config,
                &req.ports,
            )
            .await?;
        let set = set_of(&req.name);
        let tasks = plan(&set, Some(&target), &[], &Delivered::none())?;
        let now = now_ms();
        let process = ProcessDoc {
            target,
            active: None,
            tasks,
            generation: 1,
            max_attempts: req.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
            failure: None,
            author: author.map(str::to_string),
            started_at: now,
            changed_at: now,
            task_since: BTreeMap::new(),
        };
        self.check_tasks(&env, &running, &process.tasks).await?;
        let process = Arc::new(process);
        let inserted = self
            .store
            .insert_process(&env.id, &req.name, ProcessState::Creating.as_str(), &encode(&process))
            .await;
        let record = match App::table_write(&running, inserted, |rows, record| rows.put_process(record.clone(), process.clone())) {
            Err(StoreError::Conflict { .. }) => return Err(ServicesError::ProcessExists(req.name)),
            other => other?,
        };
        self.request_process_release(&env.id, &running, Release::Prompt);
        tracing::info!(environment = %env.name, process = %req.name, service = %process.target.reference(), node = %process.target.node, "process creating");
        self.spawn_process_watcher(env.id, req.name.clone(), process.generation);
        self.process_view(&env, &record, &process).await
    }

    /// The environment's processes, by name; with `states`, only those in one of them.
    pub async fn processes(&self, key: &str, states: Option<&[ProcessState]>) -> Result<Vec<ProcessView>, ServicesError> {
        let env = self.get(key).await?;
        let mut views = Vec::new();
        let mut processes = self.current_processes(&env).await?;
        if let Some(states) = states {
            processes.retain(|(record, _)| states.contains(&state_of(record)));
        }
        let mut shared = self.view_context(&env, None, processes.iter().map(|(_, doc)| doc.as_ref())).await?;
        for (record, doc) in processes {
            views.push(self.view_with(&record, &doc, &mut shared).await?);
        }
        Ok(views)
    }

    pub async fn process(&self, key: &str, name: &str) -> Result<ProcessView, ServicesError> {
        let env = self.get(key).await?;
        let (record, doc) = self.process_record(&env, name).await?;
        let mut view = self.process_view(&env, &record, &doc).await?;
        let mut recent = Vec::new();
        for t in &doc.tasks {
            let filter = crate::store::ActionFilter {
                resource_id: Some(t.id.to_string()),
                limit: RECENT_ACTIONS as u32,
                ..Default::default()
            };
            for a in self.store.list_actions(&env.id, &filter).await?.items {
                let a = a.action;
                recent.push(RecentAction {
                    resource: a.resource_id,
                    kind: a.kind.as_str().to_string(),
                    outcome: a.outcome,
                    started_at: a.started_at,
                    finished_at: a.finished_at,
                    error: a.error.map(|e| format!("{}: {}", e.code, e.message)),
                });
            }
        }
        recent.sort_by(|a, b| b.started_at.cmp(&a.started_at).then_with(|| b.resource.cmp(&a.resource)));
        recent.truncate(RECENT_ACTIONS);
        view.recent_actions = Some(recent);
        Ok(view)
    }

    /// Moves the process to another version of its service and/or another configuration; on
    /// failure it is rolled back to what last ran.
    pub async fn update_process(
        self: &Arc<Self>,
        key: &str,
        name: &str,
        req: UpdateProcess,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<ProcessView, ServicesError> {
        let env = self.get(key).await?;
        let running = self.running(&env).await?;
        let _services = running.services.lock().await;
        let (record, doc) = self.process_record(&env, name).await?;
        check_if_match(name, &record, if_match)?;
        let mut doc = ProcessDoc::clone(&doc);
        let state = state_of(&record);
        ensure_allows(name, state, Operation::Update)?;
        let service = match &req.service {
            Some(reference) => {
                let (service, _) = reference.split_once('@').unwrap_or((reference.as_str(), ""));
                if service != doc.target.service {
                    return Err(ServicesError::Invalid(format!(
                        "service: `{reference}` is another service; a process runs versions of `{}` only",
                        doc.target.service
                    )));
                }
                reference.clone()
            }
            None => doc.target.reference(),
        };
        let service_doc = self.catalog_document(&service).await?;
        let config = req.config.unwrap_or_else(|| doc.target.config.clone());
        let ports = req.ports.unwrap_or_else(|| doc.target.ports.clone());
        let node = doc.target.node.clone();
        doc.target = self
            .deployment(&env, name, service_doc, NodeChoice::Named(&node), config, &ports)
            .await?;
        let connections = self.delivered_connections(&env, name, &doc.target).await?;
        let previous = std::mem::take(&mut doc.tasks);
        doc.tasks = plan(&set_of(name), Some(&doc.target), &previous, &connections)?;
        self.begin_process(&env, &record, doc, ProcessState::Updating, author).await
    }

    /// Moves the process to `node` (or where the solver puts it, another node than its own):
    /// started there first, then stopped and removed on the old node; its peers are told the new
    /// address once it runs there. A failure rolls it back to the old node.
    pub async fn move_process(
        self: &Arc<Self>,
        key: &str,
        name: &str,
        node: Option<String>,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<ProcessView, ServicesError> {
        let env = self.get(key).await?;
        let running = self.running(&env).await?;
        let _services = running.services.lock().await;
        let (record, doc) = self.process_record(&env, name).await?;
        check_if_match(name, &record, if_match)?;
        ensure_allows(name, state_of(&record), Operation::Move)?;
        let mut doc = ProcessDoc::clone(&doc);
        let from = doc.target.node.clone();
        if node.as_deref() == Some(from.as_str()) {
            return Err(ServicesError::Invalid(format!("node: process `{name}` runs on `{from}` already")));
        }
        let catalog = self.catalog_document(&doc.target.reference()).await?;
        let (config, ports) = (doc.target.config.clone(), doc.target.ports.clone());
        doc.target = self
            .deployment(
                &env,
                name,
                catalog,
                NodeChoice::named_or_solver(node.as_deref(), Some(&from)),
                config,
                &ports,
            )
            .await?;
        let connections = self.delivered_connections(&env, name, &doc.target).await?;
        let previous = std::mem::take(&mut doc.tasks);
        doc.tasks = plan_move(&set_of(name), &doc.target, &from, &previous, &connections)?;
        self.begin_process(&env, &record, doc, ProcessState::Moving, author).await
    }

    /// Stops and removes the process (its tasks purged: stop, then remove); it disappears when
    /// that is done.
    pub async fn terminate_process(
        self: &Arc<Self>,
        key: &str,
        name: &str,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<ProcessView, ServicesError> {
        let env = self.get(key).await?;
        let running = self.running(&env).await?;
        let _services = running.services.lock().await;
        let (record, doc) = self.process_record(&env, name).await?;
        check_if_match(name, &record, if_match)?;
        ensure_allows(name, state_of(&record), Operation::Terminate)?;
        let mut doc = ProcessDoc::clone(&doc);
        let previous = std::mem::take(&mut doc.tasks);
        doc.tasks = plan(&set_of(name), None, &previous, &Delivered::none())?;
        self.check_tasks(&env, &running, &doc.tasks).await?;
        // Its connections go first: its peers' rows are written (their configuration changes)
        // before its own, so no version stops it before its peers are told. Under the services
        // lock, with its tasks checked, the row written next cannot be refused.
        self.drop_connections_of(&env, name).await?;
        let (record, _) = self.process_record(&env, name).await?;
        self.begin_process(&env, &record, doc, ProcessState::Terminating, author).await
    }

    /// Stores `doc` in `state` under a new generation (refused if the row moved on since
    /// `record`, or if a release would refuse its tasks), asks for its tasks to be released and
    /// watches it.
    pub(crate) async fn begin_process(
        self: &Arc<Self>,
        env: &Environment,
        record: &ProcessRecord,
        mut doc: ProcessDoc,
        state: ProcessState,
        author: Option<&str>,
    ) -> Result<ProcessView, ServicesError> {
        doc.generation += 1;
        doc.author = author.map(str::to_string);
        doc.started_at = now_ms();
        doc.changed_at = doc.started_at;
        if state != ProcessState::RollingBack {
            doc.failure = None;
        }
        let running = self.running(env).await?;
        self.check_tasks(env, &running, &doc.tasks).await?;
        let (stored, doc) = self.write_process(env, record, state, doc).await?;
        let elsewhere = doc.active.as_ref().is_some_and(|a| !a.reached_as(&doc.target));
        if matches!(state, ProcessState::Moving | ProcessState::RollingBack) || (state == ProcessState::Updating && elsewhere) {
            // Those told where it runs learn where it goes now (their `configure` and `start`
            // waiting for its `start` there), or, when it goes back, where it still runs: by the
            // releaser's next round, before it releases this.
            running.queue_tells(self.told_where(env, &record.name).await?);
        }
        self.request_process_release(&env.id, &running, Release::Prompt);
        tracing::info!(environment = %env.name, process = %record.name, state = state.as_str(), tasks = doc.tasks.len(), "process operation");
        self.spawn_process_watcher(env.id, record.name.clone(), doc.generation);
        self.process_view(env, &stored, &doc).await
    }

    /// Writes `doc` in `state` over `record`, refused when the row is no longer at its revision;
    /// its tasks dated against the row it replaces ([`ProcessDoc::stamp_since`]).
    pub(crate) async fn write_process(
        &self,
        env: &Environment,
        record: &ProcessRecord,
        state: ProcessState,
        mut doc: ProcessDoc,
    ) -> Result<(ProcessRecord, Arc<ProcessDoc>), ServicesError> {
        let running = self.running(env).await?;
        if let Some((_, previous)) = self.find_process(env, &record.name).await? {
            doc.stamp_since(&previous, now_ms());
        }
        let doc = Arc::new(doc);
        let written = self
            .store
            .update_process(&env.id, &record.name, record.revision, state.as_str(), &encode(&doc))
            .await;
        match App::table_write(&running, written, |rows, stored| rows.put_process(stored.clone(), doc.clone())) {
            Err(StoreError::Conflict { .. }) => {
                let current = self.find_process(env, &record.name).await?.map_or(0, |(r, _)| r.revision);
                Err(ServicesError::VersionConflict {
                    what: format!("process `{}`", record.name),
                    expected: record.revision.to_string(),
                    current,
                })
            }
            Err(StoreError::NotFound { .. }) => Err(ServicesError::UnknownProcess(record.name.clone())),
            other => Ok((other?, doc)),
        }
    }

    /// Every process's current tasks in `env`.
    pub(crate) async fn process_tasks(&self, env: &Environment) -> Result<Vec<ResourceSpec>, crate::app::EnvError> {
        let mut tasks = Vec::new();
        let processes = self.current_processes(env).await.map_err(|e| match e {
            ServicesError::Cluster(ClusterError::Env(e)) => e,
            e => crate::app::EnvError::Store(StoreError::Corrupt { what: e.to_string() }),
        })?;
        for (_, doc) in &processes {
            tasks.extend(doc.tasks.iter().cloned());
        }
        Ok(tasks)
    }

    pub(crate) async fn process_record(&self, env: &Environment, name: &str) -> Result<Decoded, ServicesError> {
        self.find_process(env, name)
            .await?
            .ok_or_else(|| ServicesError::UnknownProcess(name.chars().filter(|c| !c.is_control()).take(100).collect()))
    }

    /// The catalog's document for `name@version`, and its digest.
    async fn catalog_document(&self, reference: &str) -> Result<(orc_manifest::Digest, ServiceDocument), ServicesError> {
        let Some((name, version)) = reference.split_once('@') else {
            return Err(ServicesError::Invalid(format!(
                "service: `{}` is not `name@version`",
                reference.chars().take(100).collect::<String>()
            )));
        };
        let (entry, doc) = self.service(name, version).await?;
        Ok((entry.digest, doc))
    }

    /// A deployment of `doc` for process `name`: configuration valid against the schema, ports
    /// known and free on the node, the node usable by the environment and meeting the service's
    /// needs (or chosen by the solver).
    async fn deployment(
        &self,
        env: &Environment,
        name: &str,
        (digest, doc): (orc_manifest::Digest, ServiceDocument),
        node: NodeChoice<'_>,
        config: Value,
        ports: &BTreeMap<String, u16>,
    ) -> Result<Deployment, ServicesError> {
        let doc = &doc;
        check_config(&doc.config_schema, &config)?;
        let mut effective = BTreeMap::new();
        let mut keys = BTreeMap::new();
        for p in &doc.ports {
            effective.insert(p.name.clone(), p.port);
            if let Some(key) = &p.config_key {
                keys.insert(p.name.clone(), key.clone());
            }
        }
        for (port, number) in ports {
            if !effective.contains_key(port) {
                return Err(ServicesError::Invalid(format!(
                    "ports.{port}: `{}` has no port `{port}`",
                    doc.reference()
                )));
            }
            if *number == 0 {
                return Err(ServicesError::Invalid(format!("ports.{port}: a port is 1 to 65535")));
            }
            effective.insert(port.clone(), *number);
        }
        let node = match node {
            NodeChoice::Named(node) => {
                self.check_node(env, node, &doc.needs).await?;
                node.to_string()
            }
            NodeChoice::Solver { except } => self.place(env, doc, name, &effective, except).await?,
        };
        // No two processes of the environment listen on one port of a node (the rows read in
        // place, not copied: this runs for every create, update and move).
        let holder = self
            .table_read(env, |rows| {
                rows.processes()
                    .filter(|(record, other)| record.name != name && other.target.node == node)
                    .find_map(|(record, other)| {
                        let port = other.target.ports.values().find(|p| effective.values().any(|mine| mine == *p))?;
                        Some((*port, record.name.clone()))
                    })
            })
            .await?;
        if let Some((port, process)) = holder {
            return Err(ServicesError::PortInUse { node, port, process });
        }
        Ok(Deployment {
            secrets: secret_pointers(&doc.config_schema, &config),
            service: doc.name.clone(),
            version: doc.version.clone(),
            digest,
            automator: doc.automator,
            node,
            config,
            ports: effective,
            port_keys: keys,
            base_config: doc.config.clone(),
            connections_key: doc.connections_key.clone(),
        })
    }

    /// `node` is verified, usable by `env`, and meets `needs`.
    async fn check_node(&self, env: &Environment, node: &str, needs: &Needs) -> Result<(), ServicesError> {
        let unsuitable = |message: String| ServicesError::NodeUnsuitable {
            node: node.chars().take(100).collect(),
            message,
        };
        let usable = self
            .cluster_nodes(env, &[node.to_string()])
            .await
            .map_err(|e| unsuitable(e.to_string()))?;
        let Some(info) = usable.into_iter().find(|n| n.name == node) else {
            return Err(unsuitable("it is not verified (see /api/v1/nodes/{node})".into()));
        };
        if !needs.met_by(&info.labels, &info.facts) {
            return Err(unsuitable(format!(
                "it does not meet the service's needs {}",
                serde_json::to_string(needs).expect("needs serialise")
            )));
        }
        Ok(())
    }

    /// Where the first-party solver puts process `name` of `doc` (ports `ports`), knowing what
    /// already runs where: among the verified nodes `env` may use, but `except` (a moving
    /// process's own node) and those where another process of the environment holds one of
    /// `ports`, the solver is offered the nodes running the fewest processes first, and the next
    /// fewest only when none of those meets the service's needs.
    async fn place(
        &self,
        env: &Environment,
        doc: &ServiceDocument,
        name: &str,
        ports: &BTreeMap<String, u16>,
        except: Option<&str>,
    ) -> Result<String, ServicesError> {
        let nodes = self.cluster_nodes(env, &[]).await?;
        let load: BTreeMap<String, usize> = nodes
            .into_iter()
            .filter(|n| Some(n.name.as_str()) != except)
            .map(|n| (n.name, 0))
            .collect();
        if load.is_empty() {
            let besides = except.map(|from| format!(" besides `{from}`")).unwrap_or_default();
            return Err(ServicesError::Invalid(format!(
                "node: no verified node this environment may use{besides}"
            )));
        }
        // Read in place: the rows are not copied for it.
        let (load, taken) = self
            .table_read(env, |rows| {
                let (mut load, mut taken) = (load.clone(), Vec::new());
                for (record, other) in rows.processes() {
                    let node = &other.target.node;
                    if record.name == name || !load.contains_key(node) {
                        continue;
                    }
                    match other.target.ports.values().find(|p| ports.values().any(|mine| mine == *p)) {
                        Some(port) => {
                            load.remove(node);
                            taken.push(format!("port {port} on `{node}` by process `{}`", record.name));
                        }
                        None => *load.get_mut(node).expect("counted") += 1,
                    }
                }
                (load, taken)
            })
            .await?;
        if load.is_empty() {
            return Err(ServicesError::Invalid(format!(
                "node: every node this environment may use has a port of the process taken ({})",
                taken.join(", ")
            )));
        }
        let mut tiers: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for (node, count) in load {
            tiers.entry(count).or_default().push(node);
        }
        let grants = env.settings.capabilities.grants();
        let solver = self
            .pin_plugin(&doc.name, crate::clusters::DEFAULT_SOLVER, PluginKind::Solver, &grants)
            .await?;
        let mut template = single_service(&doc.name, doc.automator, &doc.needs);
        template.solver = Some(solver.to_string());
        let several = tiers.len() > 1;
        for tier in tiers.values() {
            match self.solve(env, &template, 1, tier, &Layout::default()).await {
                Ok(layout) => {
                    return layout
                        .nodes_of(&doc.name)
                        .next()
                        .map(str::to_string)
                        .ok_or_else(|| ServicesError::Invalid("the solver placed the process nowhere".into()));
                }
                Err(ClusterError::NoValidLayout { .. }) if several => continue,
                Err(e) => return Err(e.into()),
            }
        }
        // No tier alone had a node for it: the solver's own account, over all of them.
        let all: Vec<String> = tiers.into_values().flatten().collect();
        match self.solve(env, &template, 1, &all, &Layout::default()).await {
            Ok(_) => Err(ServicesError::Invalid("the solver placed the process nowhere".into())),
            Err(e) => Err(e.into()),
        }
    }

    async fn process_view(&self, env: &Environment, record: &ProcessRecord, doc: &ProcessDoc) -> Result<ProcessView, ServicesError> {
        let mut shared = self.view_context(env, Some(&record.name), [doc]).await?;
        self.view_with(record, doc, &mut shared).await
    }

    /// What the views of an environment's processes share, read once for a list: the states of
    /// the tasks of `docs`, and the connections (for one process, `only`, its own).
    async fn view_context(
        &self,
        env: &Environment,
        only: Option<&str>,
        docs: impl IntoIterator<Item = &ProcessDoc>,
    ) -> Result<ViewContext, ServicesError> {
        let tasks: Vec<&ResourceSpec> = docs.into_iter().flat_map(|d| d.tasks.iter()).collect();
        let states = self.task_states(env, &tasks).await?;
        let running = self.running(env).await?;
        let release_error = running.process_release_error.lock().expect("release error").clone();
        Ok(ViewContext {
            connections: match only {
                Some(process) => self.connections_of(env, process).await?,
                None => self.all_connections(env).await?,
            },
            states,
            schemas: BTreeMap::new(),
            running,
            release_error,
        })
    }

    async fn view_with(&self, record: &ProcessRecord, doc: &ProcessDoc, shared: &mut ViewContext) -> Result<ProcessView, ServicesError> {
        let set = set_of(&record.name);
        let Progress { tasks, .. } = progress_of(&doc.tasks, doc.max_attempts, &shared.states)?;
        let mut progress = BTreeMap::new();
        for t in &tasks {
            *progress.entry(t.status.clone()).or_insert(0) += 1;
        }
        let pending = connections::pending_of(&shared.running, &record.name, &tasks, doc);
        let connections = shared
            .connections
            .iter()
            .filter(|c| c.from_process == record.name || c.to_process == record.name)
            .cloned()
            .map(ConnectionView::from)
            .collect();
        let reference = doc.target.reference();
        if !shared.schemas.contains_key(&reference) {
            let schema = self
                .service(&doc.target.service, &doc.target.version)
                .await
                .map(|(_, d)| d.config_schema)
                .unwrap_or(Value::Null);
            shared.schemas.insert(reference.clone(), schema);
        }
        let schema = &shared.schemas[&reference];
        let release_error = match &shared.release_error {
            Some(e) if !App::tasks_recorded(&shared.running, &set, &doc.tasks) => Some(e.clone()),
            _ => None,
        };
        Ok(ProcessView {
            name: record.name.clone(),
            state: state_of(record),
            revision: record.revision,
            service: doc.target.reference(),
            node: doc.target.node.clone(),
            config: redacted(schema, &doc.target.config),
            ports: doc.target.ports.clone(),
            active: doc.active.as_ref().map(|a| ActiveView {
                service: a.reference(),
                node: a.node.clone(),
            }),
            failure: doc.failure.clone(),
            progress,
            tasks,
            connections,
            pending,
            release_error,
            recent_actions: None,
            operation_author: doc.author.clone(),
            created_at: record.created_at,
            updated_at: record.updated_at,
        })
    }
}

/// The template of one service, as the planner and the solver take it.
fn single_service(service: &str, automator: orc_manifest::Digest, needs: &Needs) -> Template {
    let value = serde_json::json!({"services": {service: {"automator": automator.to_string(), "needs": needs}}});
    Template::from_json(value).expect("a one-service template is valid")
}

/// The tasks of a process's resource set `set` for `target` with its `connections` as delivered
/// (`None`: every task undone), keeping `previous` tasks the new plan no longer has as removals.
pub(crate) fn plan(
    set: &str,
    target: Option<&Deployment>,
    previous: &[ResourceSpec],
    delivered: &Delivered,
) -> Result<Vec<ResourceSpec>, ServicesError> {
    let (template, layout, config, late_config) = match target {
        Some(t) => (
            single_service(&t.service, t.automator, &Needs::default()),
            [(t.node.clone(), [t.service.clone()])].into_iter().collect::<Layout>(),
            [(t.service.clone(), t.effective_config())].into_iter().collect(),
            [(t.service.clone(), t.late_config(&delivered.config))].into_iter().collect(),
        ),
        None => {
            let service = previous
                .iter()
                .find_map(|t| planner::parse_task_key(&t.id.key).map(|(_, s, _)| s.to_string()))
                .unwrap_or_else(|| "none".to_string());
            let automator = previous
                .iter()
                .find_map(|t| match &t.adaptor {
                    crate::intent::PluginRef::Digest(d) => Some(*d),
                    _ => None,
                })
                .unwrap_or_else(|| orc_manifest::Digest::of(b""));
            (
                single_service(&service, automator, &Needs::default()),
                Layout::default(),
                BTreeMap::new(),
                BTreeMap::new(),
            )
        }
    };
    let mut tasks = planner::plan(&PlanInput {
        cluster: set,
        template: &template,
        config: &config,
        layout: &layout,
        late_config: &late_config,
        stopped: &BTreeSet::new(),
        previous,
        keep_removals: true,
    })
    .map_err(|e| ServicesError::Invalid(e.to_string()))?;
    // The configuration's secrets are never shown (undoings keep what they had).
    if let Some(t) = target {
        let sensitive = (!t.secrets.is_empty()).then(|| Box::new(t.secrets.iter().map(|p| format!("/config{p}")).collect::<Vec<_>>()));
        for task in tasks.iter_mut().filter(|task| !task.purged) {
            task.sensitive = sensitive.clone();
        }
    }
    // The one requirement across sets: the steps told the connections (`configure`, `start`:
    // each may be the only one to run, the other unchanged) wait for the moving providers'
    // starts at their destinations, where they are told those run.
    if let Some(t) = target
        && !delivered.waits.is_empty()
    {
        for step in planner::Step::ALL.into_iter().filter(|s| s.sees_layout()) {
            let id = planner::task_id(set, &t.node, &t.service, step);
            if let Some(task) = tasks.iter_mut().find(|task| task.id == id && !task.purged) {
                task.requires.extend(delivered.waits.iter().cloned());
            }
        }
    }
    Ok(tasks)
}

/// A move's tasks: `target`'s on its new node, the old node's (`from`) purged, the old `stop`
/// (its purged `start`) waiting for the new `start`, so the process runs somewhere throughout.
fn plan_move(
    set: &str,
    target: &Deployment,
    from: &str,
    previous: &[ResourceSpec],
    delivered: &Delivered,
) -> Result<Vec<ResourceSpec>, ServicesError> {
    let mut tasks = plan(set, Some(target), previous, delivered)?;
    let started = planner::task_id(set, &target.node, &target.service, planner::Step::Start);
    for t in &mut tasks {
        if t.purged && t.id.node == from && planner::parse_task_key(&t.id.key).is_some_and(|(_, _, step)| step == planner::Step::Start) {
            t.requires.push(started.clone());
        }
    }
    Ok(tasks)
}

/// Refuses a configuration its service's schema does not accept, naming the first culprit by
/// its JSON pointer.
fn check_config(schema: &Value, config: &Value) -> Result<(), ServicesError> {
    let validator = jsonschema::validator_for(schema).map_err(|e| ServicesError::InvalidConfig {
        path: String::new(),
        message: format!("the service's configuration schema does not compile: {e}"),
    })?;
    if let Some(e) = validator.iter_errors(config).next() {
        return Err(ServicesError::InvalidConfig {
            path: e.instance_path().to_string(),
            message: e.to_string(),
        });
    }
    Ok(())
}

/// `config` with the values `schema` marks secret replaced (see [`secret_pointers`]).
fn redacted(schema: &Value, config: &Value) -> Value {
    let mut shown = config.clone();
    crate::intent::redact(&mut shown, &secret_pointers(schema, config));
    shown
}

/// JSON pointers to the values of `config` that `schema` marks secret (`writeOnly`, `format:
/// password`), in nested objects at any depth.
fn secret_pointers(schema: &Value, config: &Value) -> Vec<String> {
    fn walk(schema: &Value, config: &Value, at: &str, out: &mut Vec<String>) {
        let (Value::Object(map), Some(properties)) = (config, schema.get("properties").and_then(Value::as_object)) else {
            return;
        };
        for (key, value) in map {
            let Some(p) = properties.get(key) else { continue };
            let here = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
            if p.get("writeOnly") == Some(&Value::Bool(true)) || p.get("format").and_then(Value::as_str) == Some("password") {
                out.push(here);
            } else {
                walk(p, value, &here, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(schema, config, "", &mut out);
    out
}

fn check_if_match(name: &str, record: &ProcessRecord, if_match: Option<&str>) -> Result<(), ServicesError> {
    match if_match {
        Some(tag) if !crate::if_match::tag_matches(tag, &record.revision.to_string()) => Err(ServicesError::VersionConflict {
            what: format!("process `{name}`"),
            expected: tag.chars().filter(|c| !c.is_control()).take(40).collect(),
            current: record.revision,
        }),
        _ => Ok(()),
    }
}

fn ensure_allows(name: &str, state: ProcessState, operation: Operation) -> Result<(), ServicesError> {
    if state.allows(operation) {
        Ok(())
    } else {
        Err(ServicesError::InvalidTransition {
            name: name.to_string(),
            state: state.as_str(),
            operation: operation.as_str(),
        })
    }
}

/// `creating,moving` → those states; an unknown one is refused, naming it.
pub fn parse_states(list: &str) -> Result<Vec<ProcessState>, ServicesError> {
    list.split(',')
        .map(|s| {
            ProcessState::parse(s.trim()).ok_or_else(|| {
                ServicesError::Invalid(format!(
                    "state: `{}` is not a process state (creating, running, updating, moving, rolling_back, terminating, failed)",
                    s.chars().filter(|c| !c.is_control()).take(40).collect::<String>()
                ))
            })
        })
        .collect()
}

pub(crate) fn state_of(record: &ProcessRecord) -> ProcessState {
    ProcessState::parse(&record.state).unwrap_or(ProcessState::Failed)
}

pub(crate) fn encode(doc: &ProcessDoc) -> String {
    serde_json::to_string(doc).expect("a process serialises")
}

pub(crate) fn decode(record: &ProcessRecord) -> Result<ProcessDoc, ServicesError> {
    serde_json::from_str(&record.document).map_err(|e| {
        StoreError::Corrupt {
            what: format!("process `{}`: {e}", record.name),
        }
        .into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_the_schema_marks_are_redacted_at_any_depth() {
        let schema = json!({"type": "object", "properties": {
            "password": {"type": "string", "writeOnly": true},
            "db": {"type": "object", "properties": {"token": {"type": "string", "format": "password"}, "host": {"type": "string"}}},
            "port": {"type": "integer"}
        }});
        let config = json!({"password": "p", "db": {"token": "t", "host": "h"}, "port": 1, "extra": "x"});
        assert_eq!(
            redacted(&schema, &config),
            json!({"password": "<redacted>", "db": {"token": "<redacted>", "host": "h"}, "port": 1, "extra": "x"})
        );
    }

    #[test]
    fn a_configuration_is_refused_naming_its_first_culprit() {
        let schema = json!({"type": "object", "additionalProperties": false, "properties": {"size": {"type": "integer", "minimum": 1}}});
        check_config(&schema, &json!({"size": 2})).unwrap();
        match check_config(&schema, &json!({"size": 0})) {
            Err(ServicesError::InvalidConfig { path, .. }) => assert_eq!(path, "/size"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            check_config(&schema, &json!({"other": 1})),
            Err(ServicesError::InvalidConfig { .. })
        ));
    }

    #[test]
    fn an_if_match_must_name_the_current_revision() {
        let record = ProcessRecord {
            name: "p".into(),
            state: "running".into(),
            document: "{}".into(),
            revision: 4,
            created_at: 0,
            updated_at: 0,
        };
        for ok in [None, Some("*"), Some("\"4\""), Some("W/\"4\""), Some("4")] {
            check_if_match("p", &record, ok).unwrap();
        }
        assert!(matches!(
            check_if_match("p", &record, Some("\"3\"")),
            Err(ServicesError::VersionConflict { current: 4, .. })
        ));
    }
}

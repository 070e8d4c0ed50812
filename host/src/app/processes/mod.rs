//! Processes of the application: create (on a named node, or where the solver puts it),
//! update (a new version and/or configuration), move, terminate, list and show; [`watch`] follows each
//! operation to its end. The model and its lifecycle, what the operations take and answer, and
//! the steps between that need neither the store nor a plugin (checks, plans, views):
//! [`crate::processes`].
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

pub(crate) use news::ProcessNews;
pub(crate) use release::Release;
use table::Decoded;
pub(crate) use table::ProcessTable;

use std::collections::BTreeMap;
use std::sync::Arc;

use orc_cluster::{Layout, Needs, ServiceDocument};
use orc_manifest::PluginKind;
use serde_json::Value;

use crate::app::App;
use crate::clusters::ClusterError;
use crate::clusters::view::{Progress, progress_of};
use crate::intent::ResourceSpec;
use crate::processes::config::{check_config, secret_pointers};
use crate::processes::connections::ConnectionView;
use crate::processes::plan::{Delivered, plan, plan_move, single_service};
use crate::processes::requests::{CreateProcess, DEFAULT_MAX_ATTEMPTS, UpdateProcess};
use crate::processes::stored::{check_if_match, encode, ensure_allows, state_of};
use crate::processes::view::{ProcessView, RecentAction};
use crate::processes::{Deployment, Operation, ProcessDoc, ProcessState, ServicesError, set_of};
use crate::store::{Environment, ProcessRecord, StoreError, now_ms};

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
                recent.push(RecentAction::from(a.action));
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
        Ok(ProcessView::new(record, doc, tasks, connections, pending, schema, release_error))
    }
}

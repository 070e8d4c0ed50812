//! Connections between processes' interfaces, made only here (dEF-Pi: the orchestrator is the
//! only one that connects services): refused when a process or interface is unknown, when the
//! interfaces do not provide/require each other in a shared version (the highest shared one is
//! chosen), or when either side's cardinality would be exceeded. A connection is delivered to
//! both processes as configuration (under their service's `connections_key`): their tasks are
//! planned again and released, so a process whose node cannot be reached keeps the change
//! **pending** — the scheduler re-applies it until the process has taken it — and `pending` lists
//! what each process has not taken yet.

use std::collections::BTreeMap;
use std::sync::Arc;

use orc_cluster::service::{Mismatch, Role, negotiate};
use serde_json::{Value, json};

use super::Release;
use crate::app::App;
use crate::app::running::Running;
use crate::clusters::planner;
use crate::clusters::view::TaskView;
use crate::processes::connections::{CONNECTION_REVISION, ConnectRequest, ConnectionView, Endpoint};
use crate::processes::plan::{Delivered, only_waits_dropped, plan, plan_move};
use crate::processes::stored::state_of;
use crate::processes::view::{PendingChange, PendingList, PendingProcess, pending_changes};
use crate::processes::{Deployment, ProcessDoc, ProcessState, ServicesError, set_of};
use crate::store::{ConnectionRecord, Environment, StoreError, now_ms};

/// The changes process `name` has not taken yet ([`pending_changes`]): first, if it waits to be
/// told its peers' new nodes ([`Running::queue_tells`]), that change, since it was queued, with
/// the releaser's error if its last round failed.
pub(crate) fn pending_of(running: &Running, name: &str, tasks: &[TaskView], doc: &ProcessDoc) -> Vec<PendingChange> {
    let queued = running
        .tell_queued_since(name)
        .map(|queued_at| (queued_at, running.process_release_error.lock().expect("release error").clone()));
    pending_changes(name, queued, tasks, doc)
}

fn clip(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(100).collect()
}

impl App {
    /// Connects two processes' interfaces and delivers the connection to both.
    pub async fn connect(self: &Arc<Self>, key: &str, req: ConnectRequest, author: Option<&str>) -> Result<ConnectionView, ServicesError> {
        let env = self.get(key).await?;
        let running = self.running(&env).await?;
        let _services = running.services.lock().await;
        if req.from.process == req.to.process {
            return Err(ServicesError::Invalid(format!(
                "from, to: a process is not connected to itself (`{}`)",
                clip(&req.from.process)
            )));
        }
        let mut sides = Vec::new();
        for (field, end) in [("from", &req.from), ("to", &req.to)] {
            let (record, doc) = self.find_process(&env, &end.process).await?.ok_or_else(|| {
                ServicesError::UnknownPeer(format!(
                    "{field}.process: `{}` is no process of environment `{}` (a connection joins two processes of one environment)",
                    clip(&end.process),
                    env.name
                ))
            })?;
            let state = state_of(&record);
            // Nor one undoing a create that failed: it never ran, and ends `failed`.
            let undoing_create = state == ProcessState::RollingBack && doc.active.is_none();
            if matches!(state, ProcessState::Terminating | ProcessState::Failed) || undoing_create {
                return Err(ServicesError::InvalidTransition {
                    name: record.name.clone(),
                    state: state.as_str(),
                    operation: "be connected",
                });
            }
            let (_, service) = self.service(&doc.target.service, &doc.target.version).await?;
            let interface = service.interface(&end.interface).cloned().ok_or_else(|| {
                ServicesError::UnknownInterface(format!(
                    "{field}.interface: `{}` is no interface of `{}` (process `{}`); it has {:?}",
                    clip(&end.interface),
                    service.reference(),
                    record.name,
                    service.interfaces.iter().map(|i| i.name.as_str()).collect::<Vec<_>>()
                ))
            })?;
            sides.push((field, end, interface));
        }
        let (from, to) = (&sides[0], &sides[1]);
        let agreed = negotiate(&from.2, &to.2).map_err(|m| {
            let offers = |i: &orc_cluster::Interface| {
                format!(
                    "{} {}",
                    i.role.as_str(),
                    i.versions.iter().map(|v| v.version.as_str()).collect::<Vec<_>>().join(", ")
                )
            };
            ServicesError::IncompatibleInterfaces(format!(
                "`{}.{}` ({}) and `{}.{}` ({}) are incompatible: {}",
                from.1.process,
                from.1.interface,
                offers(&from.2),
                to.1.process,
                to.1.interface,
                offers(&to.2),
                match m {
                    Mismatch::SameRole(role) => format!("both {role}; one must provide and the other require"),
                    Mismatch::NoSharedVersion { .. } => "no version's message schema is shared".into(),
                }
            ))
        })?;
        // Every connection a check below looks at has `from` at one end, or `to`.
        let mut existing = self.connections_of(&env, &req.from.process).await?;
        for c in self.connections_of(&env, &req.to.process).await? {
            if !existing.iter().any(|e| e.id == c.id) {
                existing.push(c);
            }
        }
        // The same two ends, named in either order.
        let joins = |c: &ConnectionRecord, a: &Endpoint, b: &Endpoint| {
            c.from_process == a.process && c.from_interface == a.interface && c.to_process == b.process && c.to_interface == b.interface
        };
        if let Some(same) = existing
            .iter()
            .find(|c| joins(c, &req.from, &req.to) || joins(c, &req.to, &req.from))
        {
            return Err(ServicesError::ConnectionExists(format!(
                "`{}.{}` is connected to `{}.{}` already (connection {})",
                same.from_process, same.from_interface, same.to_process, same.to_interface, same.id
            )));
        }
        for (_, end, interface) in [from, to] {
            let Some(limit) = interface.limit() else { continue };
            let theirs: Vec<&ConnectionRecord> = existing
                .iter()
                .filter(|c| {
                    (c.from_process == end.process && c.from_interface == end.interface)
                        || (c.to_process == end.process && c.to_interface == end.interface)
                })
                .collect();
            if theirs.len() as u64 >= u64::from(limit) {
                return Err(ServicesError::CardinalityExceeded(format!(
                    "`{}.{}` takes at most {limit} connection{}; it has {}: {}",
                    end.process,
                    end.interface,
                    if limit == 1 { "" } else { "s" },
                    theirs.len(),
                    theirs.iter().map(|c| c.id.as_str()).collect::<Vec<_>>().join(", ")
                )));
            }
        }
        let record = ConnectionRecord {
            id: uuid::Uuid::new_v4().to_string(),
            from_process: req.from.process.clone(),
            from_interface: req.from.interface.clone(),
            to_process: req.to.process.clone(),
            to_interface: req.to.interface.clone(),
            version: agreed.version,
            interface_id: agreed.id.to_string(),
            created_by: author.map(str::to_string),
            created_at: now_ms(),
        };
        let inserted = self.store.insert_connection(&env.id, &record).await;
        match App::table_write(&running, inserted, |rows, _| rows.put_connection(record.clone())) {
            Err(StoreError::Conflict { what }) => return Err(ServicesError::ConnectionExists(what)),
            other => other?,
        }
        if let Err(e) = self
            .redeliver(&env, &[req.from.process.clone(), req.to.process.clone()], Release::Prompt)
            .await
        {
            let deleted = self.store.delete_connection(&env.id, &record.id).await;
            let _ = App::table_write(&running, deleted, |rows, _| rows.remove_connection(&record.id));
            return Err(e);
        }
        tracing::info!(environment = %env.name, connection = %record.id, from = %format!("{}.{}", record.from_process, record.from_interface),
            to = %format!("{}.{}", record.to_process, record.to_interface), version = %record.version, "connected");
        Ok(record.into())
    }

    pub async fn connections(&self, key: &str) -> Result<Vec<ConnectionView>, ServicesError> {
        let env = self.get(key).await?;
        Ok(self.all_connections(&env).await?.into_iter().map(Into::into).collect())
    }

    /// One connection, by id.
    pub async fn connection(&self, key: &str, id: &str) -> Result<ConnectionView, ServicesError> {
        let env = self.get(key).await?;
        self.all_connections(&env)
            .await?
            .into_iter()
            .find(|c| c.id == id)
            .map(Into::into)
            .ok_or_else(|| ServicesError::UnknownConnection(clip(id)))
    }

    /// Deletes a connection and tells both processes.
    pub async fn disconnect(
        self: &Arc<Self>,
        key: &str,
        id: &str,
        if_match: Option<&str>,
        author: Option<&str>,
    ) -> Result<ConnectionView, ServicesError> {
        let env = self.get(key).await?;
        let running = self.running(&env).await?;
        let _services = running.services.lock().await;
        if let Some(tag) = if_match
            && !crate::if_match::tag_matches(tag, &CONNECTION_REVISION.to_string())
        {
            // Refused before anything is deleted; a connection that does not exist is still
            // answered `unknown_connection`.
            if !self.table_read(&env, |rows| rows.connections().any(|c| c.id == id)).await? {
                return Err(ServicesError::UnknownConnection(clip(id)));
            }
            return Err(ServicesError::VersionConflict {
                what: format!("connection `{}`", clip(id)),
                expected: tag.chars().filter(|c| !c.is_control()).take(40).collect(),
                current: CONNECTION_REVISION,
            });
        }
        let deleted = self.store.delete_connection(&env.id, id).await;
        let record = App::table_write(&running, deleted, |rows, _| rows.remove_connection(id))?
            .ok_or_else(|| ServicesError::UnknownConnection(clip(id)))?;
        self.redeliver(&env, &[record.from_process.clone(), record.to_process.clone()], Release::Prompt)
            .await?;
        tracing::info!(environment = %env.name, connection = %record.id, author = author.unwrap_or("-"), "disconnected");
        Ok(record.into())
    }

    /// Drops every connection of `process` and tells its peers. The caller holds the services
    /// lock.
    pub(crate) async fn drop_connections_of(self: &Arc<Self>, env: &Environment, process: &str) -> Result<(), ServicesError> {
        let running = self.running(env).await?;
        let mut peers = Vec::new();
        for c in self.connections_of(env, process).await? {
            let deleted = self.store.delete_connection(&env.id, &c.id).await;
            App::table_write(&running, deleted, |rows, _| rows.remove_connection(&c.id))?;
            peers.push(if c.from_process == process { c.to_process } else { c.from_process });
        }
        peers.sort();
        peers.dedup();
        self.redeliver(env, &peers, Release::Prompt).await
    }

    /// The processes told where `process` runs (its consumers, and its providers that ask for
    /// their consumers' addresses): those to tell when it sets off elsewhere, goes back, or arrives.
    pub(crate) async fn told_where(&self, env: &Environment, process: &str) -> Result<Vec<String>, ServicesError> {
        let mut peers = Vec::new();
        for c in self.connections_of(env, process).await? {
            let (peer, peer_interface) = if c.from_process == process {
                (c.to_process, c.to_interface)
            } else {
                (c.from_process, c.from_interface)
            };
            let Some((_, peer_doc)) = self.find_process(env, &peer).await? else {
                continue;
            };
            let (_, service) = self.service(&peer_doc.target.service, &peer_doc.target.version).await?;
            if service.interface(&peer_interface).is_none_or(|i| i.told_peer_location()) {
                peers.push(peer);
            }
        }
        peers.sort();
        peers.dedup();
        Ok(peers)
    }

    /// What each process has not taken yet.
    pub async fn pending(&self, key: &str) -> Result<PendingList, ServicesError> {
        let env = self.get(key).await?;
        let mut items = Vec::new();
        let processes = self.current_processes(&env).await?;
        let tasks: Vec<_> = processes.iter().flat_map(|(_, doc)| doc.tasks.iter()).collect();
        let states = self.task_states(&env, &tasks).await?;
        let running = self.running(&env).await?;
        for (record, doc) in processes {
            let progress = crate::clusters::view::progress_of(&doc.tasks, doc.max_attempts, &states)?;
            let changes = pending_of(&running, &record.name, &progress.tasks, &doc);
            if !changes.is_empty() {
                items.push(PendingProcess {
                    process: record.name.clone(),
                    state: state_of(&record),
                    changes,
                });
            }
        }
        Ok(PendingList { items })
    }

    /// `process`'s connections as its automator gets them when it runs `own`: own interface →
    /// peers (connection id, peer process and interface, the agreed version, the port a provider
    /// listens on; where the peer runs — its node and the node's address — when `own`'s interface
    /// is told that ([`Interface::told_peer_location`](orc_cluster::service::Interface::told_peer_location):
    /// a consumer always, a provider that asks for its consumers' addresses).
    ///
    /// A peer runs where it last ran, except one on its way elsewhere (moving, or updating to
    /// other ports): a process is told where it goes at once, and its `configure` and `start`
    /// wait for the peer's `start` there (the [`Delivered::waits`]), so a consumer moved together
    /// with its provider, or told while the provider moves, is configured once, for where the
    /// provider goes, once it runs there. Such a wait is left out (the peer told where it last
    /// ran, as for any other) when the peer already waits, through others, for `process`, as the
    /// rows say now ([`Rows::waits_reach`](super::table::Rows::waits_reach)): the waits never
    /// form a cycle.
    pub(crate) async fn delivered_connections(
        &self,
        env: &Environment,
        process: &str,
        own: &Deployment,
    ) -> Result<Delivered, ServicesError> {
        let connections: Vec<ConnectionRecord> = self.connections_of(env, process).await?;
        if connections.is_empty() {
            return Ok(Delivered::none());
        }
        let (_, own_service) = self.service(&own.service, &own.version).await?;
        let addresses: BTreeMap<String, String> = self
            .nodes
            .list()
            .await
            .map_err(|e| ServicesError::Invalid(format!("cannot list nodes: {e}")))?
            .into_iter()
            .map(|n| (n.name, n.address))
            .collect();
        let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let mut waits = Vec::new();
        for c in connections {
            let (own_interface, peer, peer_interface) = if c.from_process == process {
                (c.from_interface.clone(), c.to_process.clone(), c.to_interface.clone())
            } else {
                (c.to_interface.clone(), c.from_process.clone(), c.from_interface.clone())
            };
            let Some((peer_record, peer_doc)) = self.find_process(env, &peer).await? else {
                continue;
            };
            // An interface the running version lacks (the connection outlived an update) is told
            // everything, as before the choice existed.
            let told = own_service.interface(&own_interface).is_none_or(|i| i.told_peer_location());
            let now = peer_doc.active.as_ref().unwrap_or(&peer_doc.target);
            let next = &peer_doc.target;
            let now_port = self.provider_port(now, &peer_interface).await?;
            // A peer on its way elsewhere (moved, or updated to other ports) is told where it goes
            // if that changes what this process is told.
            let going = matches!(state_of(&peer_record), ProcessState::Moving | ProcessState::Updating) && !now.reached_as(next);
            let next_port = if going {
                self.provider_port(next, &peer_interface).await?
            } else {
                now_port
            };
            let ahead = going
                && ((told && now.node != next.node) || next_port != now_port)
                && !self.table_read(env, |rows| rows.waits_reach(&peer, process)).await?;
            let (at, port) = if ahead { (next, next_port) } else { (now, now_port) };
            let mut delivered = json!({
                "id": c.id,
                "peer": peer,
                "peer_interface": peer_interface,
                "port": port,
                "version": c.version,
            });
            if told {
                delivered["node"] = json!(at.node);
                delivered["address"] = json!(addresses.get(&at.node));
            }
            if ahead {
                waits.push(planner::task_id(&set_of(&peer), &at.node, &at.service, planner::Step::Start));
            }
            out.entry(own_interface).or_default().push(delivered);
        }
        waits.sort();
        waits.dedup();
        Ok(Delivered {
            config: serde_json::to_value(out).expect("connections serialise"),
            waits,
        })
    }

    /// The port a process running `at` listens on for its provided `interface`, if it provides it.
    async fn provider_port(&self, at: &Deployment, interface: &str) -> Result<Option<u16>, ServicesError> {
        let (_, service) = self.service(&at.service, &at.version).await?;
        Ok(service
            .interface(interface)
            .filter(|i| i.role == Role::Provides)
            .and_then(|i| i.port.as_ref())
            .and_then(|p| at.ports.get(p))
            .copied())
    }

    /// Plans `processes`' tasks again with their connections as they are now, writes their rows
    /// (revision-checked) and asks for a release. A process terminating, failed, or undoing its
    /// create is left as it is. The caller holds the services lock.
    pub(crate) async fn redeliver(self: &Arc<Self>, env: &Environment, processes: &[String], who: Release) -> Result<(), ServicesError> {
        if self.redeliver_rows(env, processes).await? {
            let running = self.running(env).await?;
            self.request_process_release(&env.id, &running, who);
        }
        Ok(())
    }

    /// [`App::redeliver`] without the release: whether some row changed. A moving process keeps
    /// its move's order (the old node's stop after the new node's start).
    pub(crate) async fn redeliver_rows(&self, env: &Environment, processes: &[String]) -> Result<bool, ServicesError> {
        let mut changed = false;
        for name in processes {
            let Some((record, doc)) = self.find_process(env, name).await? else {
                continue;
            };
            let state = state_of(&record);
            // Nothing of these runs, or is to run: undoing a create leaves no task to tell.
            let undone = state == ProcessState::RollingBack && doc.active.is_none();
            if undone || matches!(state, ProcessState::Terminating | ProcessState::Failed) {
                continue;
            }
            let connections = self.delivered_connections(env, name, &doc.target).await?;
            let set = set_of(name);
            let tasks = match doc.active.as_ref().map(|a| a.node.as_str()) {
                Some(from) if state == ProcessState::Moving && from != doc.target.node => {
                    plan_move(&set, &doc.target, from, &doc.tasks, &connections)?
                }
                _ => plan(&set, Some(&doc.target), &doc.tasks, &connections)?,
            };
            if tasks == doc.tasks || only_waits_dropped(&set, &tasks, &doc.tasks) {
                continue;
            }
            let mut doc = crate::processes::ProcessDoc::clone(&doc);
            doc.tasks = tasks;
            doc.changed_at = now_ms();
            self.write_process(env, &record, state, doc).await?;
            changed = true;
        }
        Ok(changed)
    }
}

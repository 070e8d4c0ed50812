//! The SSH nodes as the API reaches them: registration, reads and verification go to the node
//! registry; changes that depend on the environments are checked here first — a node in use by
//! a running environment's released version is neither deleted nor made private to another.

use std::future::Future;
use std::sync::Arc;

use super::App;
use super::running::Running;
use crate::nodes::{NodesError, Registration};
use crate::store::{EnvironmentId, NodeRecord};

impl App {
    /// Registers a node and verifies it (`NodeRegistry::register`).
    pub async fn register_node(&self, new: Registration) -> Result<NodeRecord, NodesError> {
        self.nodes.register(new).await
    }

    /// Every node, by name.
    pub async fn list_nodes(&self) -> Result<Vec<NodeRecord>, NodesError> {
        self.nodes.list().await
    }

    pub async fn node(&self, name: &str) -> Result<NodeRecord, NodesError> {
        self.nodes.get(name).await
    }

    /// Connects to the node again: host key, facts (`NodeRegistry::verify`).
    pub async fn verify_node(&self, name: &str) -> Result<NodeRecord, NodesError> {
        self.nodes.verify(name).await
    }

    /// Pins the host key the node presented (`NodeRegistry::accept_host_key`).
    pub async fn accept_host_key(&self, name: &str, fingerprint: &str) -> Result<NodeRecord, NodesError> {
        self.nodes.accept_host_key(name, fingerprint).await
    }

    /// Deletes a node unless an environment uses it: a running environment's released version
    /// (from memory, so a version released a moment ago counts before its states are stored),
    /// or the stored states of the others (`NodeRegistry::delete`).
    pub async fn delete_node(&self, name: &str) -> Result<(), NodesError> {
        self.unless_used(name, None, self.nodes.delete(name)).await
    }

    /// Changes a node (`NodeRegistry::change`). Making it private to one environment is refused
    /// while another uses it, checked as [`App::delete_node`] checks.
    pub async fn change_node(&self, name: &str, change: crate::nodes::Change) -> Result<NodeRecord, NodesError> {
        match change.environment {
            Some(Some(to)) => self.unless_used(name, Some(to), self.nodes.change(name, change)).await,
            _ => self.nodes.change(name, change).await,
        }
    }

    /// Runs `then` unless a running environment other than `except` has resources on node
    /// `name` in its released version. Every running environment's release turn is held until
    /// `then` is done, so no submission or release naming the node passes its check in between.
    async fn unless_used<T>(
        &self,
        name: &str,
        except: Option<EnvironmentId>,
        then: impl Future<Output = Result<T, NodesError>>,
    ) -> Result<T, NodesError> {
        let mut running: Vec<(EnvironmentId, Arc<Running>)> = self.running.lock().await.iter().map(|(id, r)| (*id, r.clone())).collect();
        // One order for taking several turns; a submission takes one.
        running.sort_by_key(|(id, _)| *id);
        let mut turns = Vec::with_capacity(running.len());
        for (_, r) in &running {
            turns.push(r.releases.lock().await);
        }
        let users: Vec<String> = running
            .iter()
            .filter(|(id, r)| Some(*id) != except && r.uses_node(name))
            .map(|(_, r)| r.name.clone())
            .collect();
        if !users.is_empty() {
            return Err(NodesError::InUse {
                node: name.to_string(),
                environments: users,
            });
        }
        then.await
    }
}

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

    /// The nodes an environment may use: the public ones and its own private ones.
    pub async fn environment_nodes(&self, env: &str) -> Result<Vec<NodeRecord>, NodesError> {
        let env = self.get(env).await.map_err(|e| NodesError::Environment(Box::new(e)))?;
        let mut nodes = self.nodes.list().await?;
        nodes.retain(|n| n.environment.is_none_or(|e| e == env.id));
        Ok(nodes)
    }

    /// Makes a public node private to `env` (an owner's claim; refused while another
    /// environment uses it, or when it is private to another).
    pub async fn claim_node(&self, env: &str, node: &str, author: &str) -> Result<NodeRecord, NodesError> {
        let env = self.get(env).await.map_err(|e| NodesError::Environment(Box::new(e)))?;
        let record = self.nodes.get(node).await?;
        match record.environment {
            Some(owner) if owner == env.id => Ok(record),
            Some(_) => Err(NodesError::NotClaimable {
                node: record.name,
                state: "private to another environment".to_string(),
            }),
            None => {
                let change = crate::nodes::Change {
                    environment: Some(Some(env.id)),
                    author: Some(author.to_string()),
                    ..Default::default()
                };
                self.change_node(node, change).await
            }
        }
    }

    /// Makes a node private to `env` public again.
    pub async fn release_node(&self, env: &str, node: &str, author: &str) -> Result<NodeRecord, NodesError> {
        let env = self.get(env).await.map_err(|e| NodesError::Environment(Box::new(e)))?;
        let record = self.nodes.get(node).await?;
        if record.environment != Some(env.id) {
            return Err(NodesError::NotClaimable {
                node: record.name,
                state: format!("not private to environment `{}`", env.name),
            });
        }
        let change = crate::nodes::Change {
            environment: Some(None),
            author: Some(author.to_string()),
            ..Default::default()
        };
        self.change_node(node, change).await
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

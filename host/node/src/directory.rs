//! Finding a node by name for a call: the [`NodeDirectory`] a host hands its calls, and
//! [`Nodes`], a fixed map of names to backends.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::{BoxFuture, NodeBackend, NodeError, NodeErrorKind, all_durable};

/// Finds a node by name for a call.
pub trait NodeDirectory: Send + Sync + 'static {
    fn node(&self, name: &str) -> Result<Arc<dyn NodeBackend>, NodeError>;

    /// The durability fence of every node reached through this directory
    /// ([`NodeBackend::durable`]): resolves once every change made through it before the call
    /// is durable. A scheduler's sink passes it before it records actions as done.
    fn durable(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// A fixed map of node names to backends.
#[derive(Default)]
pub struct Nodes {
    nodes: RwLock<HashMap<String, Arc<dyn NodeBackend>>>,
}

impl Nodes {
    pub fn insert(&self, name: impl Into<String>, node: Arc<dyn NodeBackend>) {
        self.nodes.write().expect("nodes").insert(name.into(), node);
    }
}

impl NodeDirectory for Nodes {
    fn node(&self, name: &str) -> Result<Arc<dyn NodeBackend>, NodeError> {
        self.nodes
            .read()
            .expect("nodes")
            .get(name)
            .cloned()
            .ok_or_else(|| NodeError::new(NodeErrorKind::InvalidInput, format!("unknown node `{name}`")))
    }

    fn durable(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        let nodes: Vec<_> = self.nodes.read().expect("nodes").values().cloned().collect();
        Box::pin(all_durable(nodes))
    }
}

//! Runtime tests against real components built from source (first-party plugins and fixtures
//! that misbehave on purpose), on a real local node in a temporary directory; and the
//! first-party `layout-solver` called as the host calls it (`solver`).

// An integration test: an unwrap that fails is the test failing, where it failed.
#![allow(clippy::unwrap_used)]

mod cache;
mod file_adaptor;
mod fixtures;
mod http;
mod node_adaptors;
mod solver;

use std::sync::Arc;

use orc_manifest::{Digest, PluginKind};
use orc_node::{LocalNode, Nodes};
use orc_plugin_artifacts::Artifact;
use orc_runtime::wit::Target;
use orc_runtime::{CallContext, Grants, Plugin, Runtime, RuntimeConfig};

pub fn runtime() -> Runtime {
    Runtime::new(RuntimeConfig {
        memory_limit_bytes: 32 << 20,
        max_instances: 50,
        ..RuntimeConfig::default()
    })
    .expect("runtime")
}

pub fn load(rt: &Runtime, artifact: &Artifact, grants: &Grants) -> Arc<Plugin> {
    let digest: Digest = artifact.digest.parse().unwrap();
    rt.load_bytes(&digest, artifact.bytes, artifact.kind.parse::<PluginKind>().unwrap(), grants)
        .unwrap()
}

/// A context with one local node named `local` rooted in `root`.
pub fn local_context(root: &std::path::Path) -> CallContext {
    let nodes = Nodes::default();
    nodes.insert("local", Arc::new(LocalNode::open(root).unwrap()));
    CallContext {
        nodes: Arc::new(nodes),
        ..CallContext::new("test")
    }
}

pub fn target(resource_type: &str, key: &str, attributes: serde_json::Value) -> Target {
    Target {
        id: format!("{resource_type}[local,{key}]"),
        resource_type: resource_type.into(),
        node: "local".into(),
        key: key.into(),
        attributes: attributes.to_string(),
    }
}

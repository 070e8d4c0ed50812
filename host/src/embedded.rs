//! The embedded deploy (`orc-host deploy`): registry, runtime and executors in one process over a
//! local data directory. The first-party plugins are published into the local registry on start,
//! every adaptor reference is pinned to a digest, and resources run in dependency order, in
//! parallel where the graph allows, each through the same executor a server would use.
//!
//! Data directory layout: `registry/` (content-addressed plugins), `cache/` (compiled artifacts),
//! `kv/` (plugin key/value state), `nodes/local/` (the local node's root, unless given).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use orc_manifest::{Digest, PluginKind};
use orc_registry::{RegistryError, Store, StoreOptions};
use orc_runtime::capability::{DirKv, LocalNode, Nodes};
use orc_runtime::{CallContext, EngineError, Grants, LoadError, Plugin, Runtime, RuntimeConfig};
use tokio::task::JoinSet;

use crate::executor::{self, ActionReport, Mode, Outcome};
use crate::intent::{Intent, IntentError, PluginRef, ResourceId};

/// The only node an embedded deploy knows.
pub const LOCAL_NODE: &str = "local";

#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    pub data_dir: PathBuf,
    /// Root directory of the `local` node (default `DATA_DIR/nodes/local`).
    pub local_root: Option<PathBuf>,
    pub mode: Mode,
    /// Resource actions in flight at once.
    pub concurrency: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("cannot prepare the data directory {path}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Intent(#[from] IntentError),
    #[error("the local registry")]
    Registry(#[from] RegistryError),
    #[error("resource `{resource}` names adaptor `{reference}`, which is not in the registry")]
    UnknownPlugin { resource: ResourceId, reference: PluginRef },
    #[error("resource `{resource}` is on node `{node}`; an embedded deploy manages only the `local` node")]
    UnknownNode { resource: ResourceId, node: String },
    #[error("resource `{resource}` has type `{resource_type}`, but adaptor `{plugin}` handles only {handles}")]
    WrongResourceType {
        resource: ResourceId,
        resource_type: String,
        plugin: String,
        handles: String,
    },
    #[error("resource `{resource}`: cannot load its adaptor")]
    Load {
        resource: ResourceId,
        #[source]
        source: LoadError,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("cannot open the key/value store")]
    Kv(#[source] orc_runtime::capability::KvError),
}

/// What a deploy did, per resource in intent order.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeployReport {
    pub actions: Vec<ActionReport>,
    /// Each adaptor reference and the digest it was pinned to.
    pub pinned: Vec<(String, Digest)>,
    pub local_root: PathBuf,
}

impl DeployReport {
    pub fn succeeded(&self) -> bool {
        self.actions.iter().all(|a| a.outcome.succeeded())
    }

    pub fn count(&self, outcome: Outcome) -> usize {
        self.actions.iter().filter(|a| a.outcome == outcome).count()
    }
}

/// Validates, pins and deploys `intent_json`. `progress` sees each action as it finishes.
pub async fn deploy(
    config: &EmbeddedConfig,
    intent_json: &[u8],
    mut progress: impl FnMut(&ActionReport, usize, usize),
) -> Result<DeployReport, EmbeddedError> {
    let intent = Intent::parse(intent_json)?;
    let data_dir = &config.data_dir;
    let dir_err = |path: PathBuf| move |source| EmbeddedError::DataDir { path, source };
    std::fs::create_dir_all(data_dir).map_err(dir_err(data_dir.clone()))?;

    let store = Store::open(data_dir.join("registry"), StoreOptions::default())?;
    for artifact in orc_plugin_artifacts::FIRST_PARTY {
        store.publish(artifact.bytes)?;
    }

    for r in &intent.resources {
        if r.id.node != LOCAL_NODE {
            return Err(EmbeddedError::UnknownNode {
                resource: r.id.clone(),
                node: r.id.node.clone(),
            });
        }
    }

    let runtime = Runtime::new(RuntimeConfig {
        cache_dir: Some(data_dir.join("cache")),
        max_instances: (config.concurrency * 2).max(16) as u32,
        ..RuntimeConfig::default()
    })?;
    let mut pinned: HashMap<PluginRef, Arc<Plugin>> = HashMap::new();
    let mut plugins = Vec::with_capacity(intent.resources.len());
    for r in &intent.resources {
        if !pinned.contains_key(&r.adaptor) {
            let digest = resolve(&store, &r.adaptor).map_err(|e| match e {
                RegistryError::NotFound { .. } | RegistryError::UnknownDigest(_) => EmbeddedError::UnknownPlugin {
                    resource: r.id.clone(),
                    reference: r.adaptor.clone(),
                },
                other => EmbeddedError::Registry(other),
            })?;
            let plugin = runtime
                .load(&digest, PluginKind::Adaptor, &store, &Grants::all())
                .await
                .map_err(|source| EmbeddedError::Load {
                    resource: r.id.clone(),
                    source,
                })?;
            pinned.insert(r.adaptor.clone(), plugin);
        }
        let plugin = pinned[&r.adaptor].clone();
        let handles = &plugin.manifest.resource_types;
        if !handles.is_empty() && !handles.contains(&r.id.resource_type) {
            return Err(EmbeddedError::WrongResourceType {
                resource: r.id.clone(),
                resource_type: r.id.resource_type.clone(),
                plugin: plugin.manifest.reference(),
                handles: handles.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", "),
            });
        }
        plugins.push(plugin);
    }

    let local_root = config.local_root.clone().unwrap_or_else(|| data_dir.join("nodes").join(LOCAL_NODE));
    let node = LocalNode::open(&local_root).map_err(dir_err(local_root.clone()))?;
    let nodes = Nodes::default();
    nodes.insert(LOCAL_NODE, Arc::new(node));
    let kv = DirKv::open(data_dir.join("kv")).map_err(EmbeddedError::Kv)?;
    let ctx = CallContext {
        kv: Arc::new(kv),
        nodes: Arc::new(nodes),
        ..CallContext::new("embedded")
    };

    let actions = run_graph(&intent, &plugins, &ctx, config.mode, config.concurrency.max(1), &mut progress).await;
    let mut pinned: Vec<(String, Digest)> = pinned.into_iter().map(|(r, p)| (r.to_string(), p.digest)).collect();
    pinned.sort();
    Ok(DeployReport {
        actions,
        pinned,
        local_root,
    })
}

/// `name@version`, a bare name (highest version) or a digest → the digest, which must be stored.
fn resolve(store: &Store, reference: &PluginRef) -> Result<Digest, RegistryError> {
    match reference {
        PluginRef::Digest(d) => {
            if store.has_blob(d)? {
                Ok(*d)
            } else {
                Err(RegistryError::UnknownDigest(*d))
            }
        }
        PluginRef::Named { name, version: Some(v) } => Ok(store.resolve(name, v)?.digest),
        PluginRef::Named { name, version: None } => store
            .versions(name)?
            .pop()
            .map(|e| e.digest)
            .ok_or_else(|| RegistryError::NotFound {
                what: format!("plugin `{name}`"),
            }),
    }
}

/// Runs every resource once its requirements have succeeded; the dependents of a failure are
/// skipped. Between two purged resources the edge is reversed, so dependents are removed first.
async fn run_graph(
    intent: &Intent,
    plugins: &[Arc<Plugin>],
    ctx: &CallContext,
    mode: Mode,
    concurrency: usize,
    progress: &mut impl FnMut(&ActionReport, usize, usize),
) -> Vec<ActionReport> {
    let n = intent.resources.len();
    let mut waits_for: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, reqs) in intent.requires.iter().enumerate() {
        for &j in reqs {
            if intent.resources[i].purged && intent.resources[j].purged {
                waits_for[j].push(i);
            } else {
                waits_for[i].push(j);
            }
        }
    }
    let mut blocking: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut pending: Vec<usize> = vec![0; n];
    for (i, deps) in waits_for.iter().enumerate() {
        pending[i] = deps.len();
        for &j in deps {
            blocking[j].push(i);
        }
    }
    let mut reports: Vec<Option<ActionReport>> = vec![None; n];
    let mut ready: Vec<usize> = (0..n).filter(|&i| pending[i] == 0).rev().collect();
    let mut running = JoinSet::new();
    let mut done = 0;
    while done < n {
        while running.len() < concurrency
            && let Some(i) = ready.pop()
        {
            let (plugin, ctx, spec) = (plugins[i].clone(), ctx.clone(), intent.resources[i].clone());
            running.spawn(async move { (i, executor::execute(&plugin, &ctx, &spec, mode).await) });
        }
        let Some(joined) = running.join_next().await else { break };
        let (i, report) = joined.expect("resource actions do not panic");
        let ok = report.outcome.succeeded();
        done += 1;
        progress(&report, done, n);
        reports[i] = Some(report);
        if ok {
            for &d in &blocking[i] {
                pending[d] -= 1;
                if pending[d] == 0 {
                    ready.push(d);
                }
            }
        } else {
            // Skip everything downstream, transitively.
            let mut stack = blocking[i].clone();
            while let Some(d) = stack.pop() {
                if reports[d].is_some() {
                    continue;
                }
                let because = format!("`{}` did not succeed", intent.resources[i].id);
                let report = executor::skipped(&intent.resources[d], mode, &because);
                done += 1;
                progress(&report, done, n);
                reports[d] = Some(report);
                stack.extend(blocking[d].iter().copied());
            }
        }
    }
    reports.into_iter().map(|r| r.expect("every resource has a report")).collect()
}
